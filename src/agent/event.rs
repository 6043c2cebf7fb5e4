//! The notifications of a session's event stream as one typed enum. [`SessionEvent::into_wire`]
//! gives the method and the params object exactly as clients see them (before the actor adds
//! `session_id` and `seq`), so the Rust side never builds an event from strings.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_kind::ErrorKind;
use crate::llm::pricing::CallCost;
use crate::store::TaskState;
use crate::tools::ToolResult;

use super::context::cap_text;

/// How much of a tool's output `tool/completed` carries.
const OUTPUT_PREVIEW_BYTES: usize = 2048;

/// Why a turn ended with `turn/completed`: its `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnCompletion {
    /// The model answered without calling a tool.
    Completed,
    /// The model made the same calls with the same answers too many times in a row.
    StuckInLoop,
    /// The session's spending rate cap stopped it between model calls.
    BudgetRateExceeded,
    /// The server stopped (or died) while it ran, and started again.
    ServerRestarted,
    /// The cluster node running it was lost and another took the session over.
    NodeLost,
}

impl TurnCompletion {
    /// The reason a `turn/completed`'s params carry, if it is one of these.
    pub fn of(params: &Value) -> Option<Self> {
        Self::deserialize(params.get("reason")?).ok()
    }

    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::StuckInLoop => "stuck_in_loop",
            Self::BudgetRateExceeded => "budget_rate_exceeded",
            Self::ServerRestarted => "server_restarted",
            Self::NodeLost => "node_lost",
        }
    }
}

/// One notification; the variant names the method, its fields are the params.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "method", content = "params")]
pub enum SessionEvent {
    /// A turn began.
    #[serde(rename = "turn/started")]
    TurnStarted {
        /// The turn.
        turn_id: String,
    },
    /// A piece of the model's text as it streams.
    #[serde(rename = "message/delta")]
    MessageDelta {
        /// The turn.
        turn_id: String,
        /// The new text.
        text: String,
    },
    /// What a turn changed in the workspace, whatever changed it.
    #[serde(rename = "turn/diff")]
    TurnDiff {
        /// The turn.
        turn_id: String,
        /// A unified diff of the changed text files (cut at 256 KiB).
        diff: String,
        /// Every changed file.
        files: Vec<crate::checkpoint::FileChange>,
        /// Files past `[checkpoints]` limits before or after the turn, whose changes are
        /// neither seen nor reverted (at most 100).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        skipped: Vec<String>,
    },
    /// The workspace was put back as it was before a turn; reverting `revert_id` undoes it.
    #[serde(rename = "session/reverted")]
    SessionReverted {
        /// The turn reverted to (the state before it).
        turn_id: String,
        /// The checkpoint taken just before the revert.
        revert_id: String,
        /// What the revert did to each path.
        files: Vec<serde_json::Value>,
    },
    /// An operator hook ran, and what it decided.
    #[serde(rename = "hook/ran")]
    HookRan {
        /// Its command or URL.
        hook: String,
        /// The event it ran for (`PreToolUse`, …).
        event: &'static str,
        /// The call it ran for, for tool events.
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// `none`, `allow`, `ask`, `block`, `error` or `timeout`.
        decision: super::hooks::Decision,
        /// Why, when the hook said or failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How long it took.
        duration_ms: u64,
    },
    /// A piece of what the model reasons (or its summary) as it streams.
    #[serde(rename = "reasoning/delta")]
    ReasoningDelta {
        /// The turn.
        turn_id: String,
        /// The new text.
        text: String,
    },
    /// The model's whole text of one call.
    #[serde(rename = "message/completed")]
    MessageCompleted {
        /// The turn.
        turn_id: String,
        /// The text.
        text: String,
    },
    /// A tool call began.
    #[serde(rename = "tool/started")]
    ToolStarted {
        /// The turn, for a model's call; absent for a client's `tool/invoke`.
        #[serde(skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// The arguments, capped for the event.
        arguments: Value,
    },
    /// A tool call ended (boxed: it is the largest event, and queues reserve room for it).
    #[serde(rename = "tool/completed")]
    ToolCompleted(Box<ToolCompleted>),
    /// A call waits for a person's decision.
    #[serde(rename = "approval/requested")]
    ApprovalRequested {
        /// Named by `approval/respond`.
        approval_id: String,
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// Its arguments, capped for the event.
        arguments: Value,
        /// Why it waits.
        reason: String,
        /// Where it would run.
        cwd: String,
        /// The sub-agent that made the call, when one did.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
    },
    /// A pending approval was decided, or withdrawn as declined.
    #[serde(rename = "approval/resolved")]
    ApprovalResolved {
        /// The request.
        approval_id: String,
        /// What was decided.
        decision: super::approval::Decision,
        /// Why it was declined without a person.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<super::approval::Unanswered>,
    },
    /// The older conversation was summarised in what the model is sent.
    #[serde(rename = "session/compacted")]
    SessionCompacted {
        /// The turn that compacted, when one did (not for `session/compact`).
        #[serde(skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
        /// What it did.
        #[serde(flatten)]
        stats: super::compaction::CompactionStats,
    },
    /// A running tool's progress note.
    #[serde(rename = "tool/progress")]
    ToolProgress {
        /// The call.
        tool_call_id: String,
        /// What is happening.
        message: String,
        /// How far along, when known (sent as `null` otherwise).
        fraction: Option<f32>,
    },
    /// Output a running tool produced.
    #[serde(rename = "tool/output/delta")]
    ToolOutputDelta {
        /// The call.
        tool_call_id: String,
        /// The text.
        text: String,
    },
    /// A background task changed state.
    #[serde(rename = "task/updated")]
    TaskUpdated(TaskUpdate),
    /// New output of a background task.
    #[serde(rename = "task/output/delta")]
    TaskOutputDelta {
        /// The task.
        task_id: String,
        /// Where the text starts in the task's output.
        offset: u64,
        /// The text.
        text: String,
    },
    /// A background task ended; what its call would have answered.
    #[serde(rename = "turn/spawn_complete")]
    SpawnComplete {
        /// The task.
        task_id: String,
        /// The call that started it.
        tool_call_id: String,
        /// Its tool.
        tool_name: String,
        /// Whether it completed.
        success: bool,
        /// The start of its result.
        content: String,
        /// The cost rows its model calls made.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        node_costs: Vec<CallCost>,
    },
    /// The active or deferred tool set changed.
    #[serde(rename = "tools/changed")]
    ToolsChanged {
        /// What the model sees now.
        active: Vec<String>,
        /// What it can load on demand.
        deferred: Vec<String>,
        /// Newly deferred.
        evicted: Vec<String>,
        /// Newly active.
        activated: Vec<String>,
    },
    /// The model's plan changed.
    #[serde(rename = "plan/updated")]
    PlanUpdated {
        /// Why, when said.
        #[serde(skip_serializing_if = "Option::is_none")]
        explanation: Option<String>,
        /// The steps, each `{step, status}`.
        plan: Value,
    },
    /// The model asks the user questions.
    #[serde(rename = "user_input/requested")]
    UserInputRequested {
        /// Answered by `user_input/respond`.
        request_id: String,
        /// The questions.
        questions: Value,
    },
    /// A turn ended as the model meant it to.
    #[serde(rename = "turn/completed")]
    TurnCompleted {
        /// The turn.
        turn_id: String,
        /// Prompt tokens of the turn's model calls.
        tokens_in: u64,
        /// Completion tokens of the turn's model calls.
        tokens_out: u64,
        /// Of the prompt tokens, those the provider served from its prompt cache.
        tokens_cached: u64,
        /// What the turn cost, tools' model calls included.
        cost_usd: f64,
        /// What the session has cost so far.
        session_cost_usd: f64,
        /// Why it ended.
        reason: TurnCompletion,
        /// Cost rows of tools that ran in the foreground of the turn.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        node_costs: Vec<CallCost>,
    },
    /// A turn ended early.
    #[serde(rename = "turn/error")]
    TurnError {
        /// The turn.
        turn_id: String,
        /// Why, as a kind of the one error table (`budget_exceeded`, `interrupted`, …).
        code: ErrorKind,
        /// Why, in words.
        message: String,
    },
}

impl SessionEvent {
    /// The method and the params object as sent.
    pub fn into_wire(self) -> (String, Value) {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut map)) => {
                let method = match map.remove("method") {
                    Some(Value::String(method)) => method,
                    _ => String::new(),
                };
                (method, map.remove("params").unwrap_or(Value::Null))
            }
            // Every variant is a struct of plain data; this cannot happen.
            _ => (String::new(), Value::Null),
        }
    }
}

/// The params of `tool/completed`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCompleted {
    /// The turn, for a model's call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// Whether it did what was asked.
    pub success: bool,
    /// The first bytes of its output.
    pub output_preview: String,
    /// How long it ran.
    pub duration_ms: u64,
    /// The host-side metadata, with the typed cost rows as `node_costs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_metadata: Option<Value>,
    /// A file it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_modified: Option<String>,
    /// Files it hands to the user.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files_to_send: Vec<String>,
}

impl ToolCompleted {
    /// The event for one finished call.
    pub fn of(
        turn_id: Option<String>,
        tool_call_id: &str,
        tool_name: &str,
        result: &ToolResult,
        duration: Duration,
    ) -> SessionEvent {
        SessionEvent::ToolCompleted(Box::new(Self {
            turn_id,
            tool_call_id: tool_call_id.to_string(),
            tool_name: tool_name.to_string(),
            success: result.success,
            output_preview: cap_text(&result.output, OUTPUT_PREVIEW_BYTES),
            duration_ms: duration.as_millis() as u64,
            structured_metadata: result.wire_metadata(),
            file_modified: result
                .file_modified
                .as_ref()
                .map(|path| path.to_string_lossy().into_owned()),
            files_to_send: result
                .files_to_send
                .iter()
                .map(|path| path.to_string_lossy().into_owned())
                .collect(),
        }))
    }
}

/// The params of `task/updated`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskUpdate {
    /// The task.
    pub task_id: String,
    /// The call that started it.
    pub tool_call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Its new state.
    pub state: TaskState,
    /// The exit code of a command task that ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl TaskUpdate {
    /// A task of `tool_name`, started by `tool_call_id`, now in `state`.
    pub fn new(task_id: &str, tool_call_id: &str, tool_name: &str, state: TaskState) -> Self {
        Self {
            task_id: task_id.to_string(),
            tool_call_id: tool_call_id.to_string(),
            tool_name: tool_name.to_string(),
            state,
            exit_code: None,
            reason: None,
        }
    }

    /// With why it ended so.
    pub fn because(mut self, reason: Option<String>) -> Self {
        self.reason = reason;
        self
    }

    /// The event.
    pub fn event(self) -> SessionEvent {
        SessionEvent::TaskUpdated(self)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_keep_their_wire_form() {
        let (method, params) = SessionEvent::ToolProgress {
            tool_call_id: "c".into(),
            message: "m".into(),
            fraction: None,
        }
        .into_wire();
        assert_eq!(method, "tool/progress");
        assert_eq!(
            params,
            json!({"tool_call_id": "c", "message": "m", "fraction": null})
        );
        let (method, params) = SessionEvent::ToolStarted {
            turn_id: None,
            tool_call_id: "c".into(),
            tool_name: "t".into(),
            arguments: json!({"a": 1}),
        }
        .into_wire();
        assert_eq!(method, "tool/started");
        assert_eq!(
            params,
            json!({"tool_call_id": "c", "tool_name": "t", "arguments": {"a": 1}})
        );
        let update =
            TaskUpdate::new("t1", "c", "shell", TaskState::Failed).because(Some("exit 1".into()));
        let (method, params) = update.event().into_wire();
        assert_eq!(method, "task/updated");
        assert_eq!(
            params,
            json!({"task_id": "t1", "tool_call_id": "c", "tool_name": "shell",
                   "state": "failed", "reason": "exit 1"})
        );
        let (_, params) = SessionEvent::PlanUpdated {
            explanation: None,
            plan: json!([]),
        }
        .into_wire();
        assert_eq!(params, json!({"plan": []}));
    }

    #[test]
    fn endings_and_decisions_keep_their_wire_words() {
        use super::super::approval::{Decision, Unanswered};
        use super::super::hooks::Decision as HookDecision;
        for reason in [
            TurnCompletion::Completed,
            TurnCompletion::StuckInLoop,
            TurnCompletion::BudgetRateExceeded,
            TurnCompletion::ServerRestarted,
            TurnCompletion::NodeLost,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
            let params = json!({"reason": reason.as_str()});
            assert_eq!(TurnCompletion::of(&params), Some(reason));
        }
        assert_eq!(TurnCompletion::of(&json!({"reason": "no_such"})), None);
        assert_eq!(TurnCompletion::of(&json!({})), None);
        for why in [
            Unanswered::Timeout,
            Unanswered::Interrupted,
            Unanswered::SessionStopped,
            Unanswered::ServerRestarted,
            Unanswered::NodeLost,
        ] {
            assert_eq!(serde_json::to_value(why).unwrap(), why.as_str());
        }
        let (method, params) = SessionEvent::ApprovalResolved {
            approval_id: "a".into(),
            decision: Decision::Decline,
            reason: Some(Unanswered::Timeout),
        }
        .into_wire();
        assert_eq!(method, "approval/resolved");
        assert_eq!(
            params,
            json!({"approval_id": "a", "decision": "decline", "reason": "timeout"})
        );
        let (_, params) = SessionEvent::TurnError {
            turn_id: "t".into(),
            code: ErrorKind::TurnTimeout,
            message: "m".into(),
        }
        .into_wire();
        assert_eq!(params["code"], "turn_timeout");
        let (_, params) = SessionEvent::HookRan {
            hook: "h".into(),
            event: "PreToolUse",
            tool_call_id: None,
            decision: HookDecision::Block,
            reason: None,
            duration_ms: 1,
        }
        .into_wire();
        assert_eq!(params["decision"], "block");
    }

    #[test]
    fn tool_completed_carries_typed_costs_as_node_costs() {
        let mut result = ToolResult::ok("done").with_metadata(json!({"nodes": []}));
        result.costs.push(CallCost {
            node_id: "a".into(),
            model: "m".into(),
            reserved_usd: 1.0,
            actual_usd: 0.5,
            tokens_in: 3,
            tokens_out: 4,
            tokens_cached: 0,
            committed: true,
            created_at: "2025-01-01T00:00:00Z".into(),
            unpriced: false,
        });
        let (_, params) = ToolCompleted::of(
            Some("t".into()),
            "c",
            "run_pipeline",
            &result,
            Duration::ZERO,
        )
        .into_wire();
        assert_eq!(params["turn_id"], "t");
        assert_eq!(params["structured_metadata"]["nodes"], json!([]));
        assert_eq!(
            params["structured_metadata"]["node_costs"][0]["node_id"],
            "a"
        );
        assert!(
            params["structured_metadata"]["node_costs"][0]
                .get("unpriced")
                .is_none()
        );
        assert_eq!(params["duration_ms"], 0);
        assert!(params.get("file_modified").is_none());
    }
}
