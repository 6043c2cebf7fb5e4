//! Approvals as one step of the call path: the session's rules and grants, and what a call that
//! must wait asks of its host.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::approval::{ApprovalRules, Gate, Grant};

/// What a person decided about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it.
    Accept,
    /// Run it, and the same tool with the same command prefix for the rest of the session.
    AcceptForSession,
    /// Do not run it.
    Decline,
}

impl Decision {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::AcceptForSession => "accept_for_session",
            Self::Decline => "decline",
        }
    }
}

/// Why a call stopped waiting for a decision no person gave; `approval/resolved` says it as
/// `reason` with a `decline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unanswered {
    /// No decision came within the approval timeout.
    Timeout,
    /// The turn was stopped while the call waited.
    Interrupted,
    /// The session's actor stopped.
    SessionStopped,
    /// The server stopped (or died) while the call waited, and started again.
    ServerRestarted,
    /// The cluster node running the session was lost.
    NodeLost,
}

impl Unanswered {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Interrupted => "interrupted",
            Self::SessionStopped => "session_stopped",
            Self::ServerRestarted => "server_restarted",
            Self::NodeLost => "node_lost",
        }
    }
}

/// A decision with the words that go to the model.
#[derive(Debug, Clone)]
pub struct Answer {
    /// What was decided.
    pub decision: Decision,
    /// Said to the model with a decline.
    pub message: Option<String>,
}

/// One call waiting for a decision, as `approval/requested` describes it.
#[derive(Debug, Clone)]
pub struct ApprovalAsk {
    /// Names the request in `approval/respond`.
    pub approval_id: String,
    /// The call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// Its arguments, capped for the event.
    pub arguments: Value,
    /// Why it waits.
    pub reason: String,
    /// Where it would run, relative to the user's root.
    pub cwd: String,
    /// The sub-agent that made the call, when one did.
    pub agent_id: Option<String>,
}

/// A session's approval state: the rules of its policies, what `accept_for_session` granted,
/// and how long a call waits. Shared by its turns, its clients' calls and its sub-agents.
#[derive(Debug)]
pub(crate) struct Approvals {
    rules: ApprovalRules,
    /// The rules with their asks answered yes, for a call a hook allowed.
    without_asks: ApprovalRules,
    grants: Mutex<Vec<Grant>>,
    timeout: Duration,
}

impl Approvals {
    pub(crate) fn new(rules: ApprovalRules, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            without_asks: rules.without_asks(),
            rules,
            grants: Mutex::new(Vec::new()),
            timeout,
        })
    }

    /// What happens to a call of `tool` with `arguments` now.
    pub(crate) fn gate(&self, tool: &str, arguments: &Value) -> Gate {
        // With no rules only the `.git` check applies, and grants change nothing: every
        // tool call skips the lock.
        if self.rules.is_empty() {
            return self.rules.gate(tool, arguments, &[]);
        }
        let grants = crate::mutex::lock(&self.grants);
        self.rules.gate(tool, arguments, &grants)
    }

    /// What happens now to a call of `tool` with `arguments` that a hook allowed: only the
    /// session's ask rules are taken as answered.
    pub(crate) fn gate_without_asks(&self, tool: &str, arguments: &Value) -> Gate {
        self.without_asks.gate(tool, arguments, &[])
    }

    /// Lets what `grant` names through for the rest of the session.
    pub(crate) fn grant(&self, grant: Grant) {
        let mut grants = crate::mutex::lock(&self.grants);
        if !grants.contains(&grant) {
            grants.push(grant);
        }
    }

    /// How long a call waits before it is declined.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}
