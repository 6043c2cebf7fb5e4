//! What a sub-agent tool asks of its session, and the child's status it is answered with: the
//! protocol between the tools that hand work to child agents and the session that owns them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::ToolError;

/// Where a child agent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Its current turn is running.
    Running,
    /// Its last turn ended with an answer.
    Completed,
    /// Its last turn failed or was stopped; its history is kept.
    Errored,
    /// Closed and freed; it cannot run again.
    Closed,
}

/// A child agent's status as the tools report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// The child's id; also its task id.
    pub agent_id: String,
    /// Where it stands.
    pub status: AgentState,
    /// The text its last completed turn ended with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Why its last turn failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `isolation: "worktree"`: its worktree and branch while it is open, and on
    /// `close_agent` what became of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<Value>,
}

impl AgentStatus {
    /// A child that has just started a turn.
    pub fn running(agent_id: &str) -> Self {
        Self {
            agent_id: agent_id.to_string(),
            status: AgentState::Running,
            answer: None,
            error: None,
            worktree: None,
        }
    }
}

/// The session's answer to a sub-agent request.
pub type AgentReply = oneshot::Sender<Result<AgentStatus, ToolError>>;

/// What a sub-agent tool asks of its session.
#[derive(Debug)]
pub enum SubAgentRequest {
    /// Start a child with `message` as its first user message.
    Spawn {
        /// The task.
        message: String,
        /// Another model than the session's, by id.
        model: Option<String>,
        /// The agent profile (`[[agents]]`) it works as.
        agent_type: Option<String>,
        /// Whether it works in a git worktree of its own.
        worktree: bool,
        /// The call that spawned it, recorded on its task.
        tool_call_id: String,
        /// The spawning call's cancellation: a call already stopped starts no child.
        cancel: tokio_util::sync::CancellationToken,
        /// The answer: the child's id and status.
        reply: AgentReply,
    },
    /// Deliver a message into a child's conversation.
    SendInput {
        /// The child.
        target: String,
        /// The message.
        message: String,
        /// Stop the child's current step and take the message at once.
        interrupt: bool,
        /// The answer: the child's status after delivery.
        reply: AgentReply,
    },
    /// Start a finished or failed child again from its history.
    Resume {
        /// The child.
        id: String,
        /// The answer: the child's status.
        reply: AgentReply,
    },
    /// Stop a child and free it.
    Close {
        /// The child.
        target: String,
        /// The answer: the child's final status.
        reply: AgentReply,
    },
    /// Watch children: all of the session's when `ids` is `None`.
    Watch {
        /// The children.
        ids: Option<Vec<String>>,
        /// One receiver per child, in the order asked.
        reply: oneshot::Sender<Result<Vec<watch::Receiver<AgentStatus>>, ToolError>>,
    },
}

impl SubAgentRequest {
    /// Answers the request with `err` without acting on it.
    pub fn refuse(self, err: ToolError) {
        match self {
            Self::Spawn { reply, .. }
            | Self::SendInput { reply, .. }
            | Self::Resume { reply, .. }
            | Self::Close { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Self::Watch { reply, .. } => {
                let _ = reply.send(Err(err));
            }
        }
    }
}
