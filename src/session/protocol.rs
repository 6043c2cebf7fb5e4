//! The one typed protocol of a session: what any caller asks of it ([`SessionRequest`]) and
//! what it answers ([`SessionReply`]). The WebSocket, REST, ACP, `agentd exec` and a cluster
//! follower all send these to the actor through [`super::SessionHandle::request`]; between
//! nodes they travel as they are, serialised. A new session method is a variant here, its arm
//! in the actor's `handle_request`, and its docs.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ImageInput, InvokeOptions, InvokeResult, ModelChoice, SessionError, SessionView};
use crate::agent::approval::Decision;
use crate::agent::compaction::CompactionStats;
use crate::store::TaskState;

/// One request to a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum SessionRequest {
    /// What `session/open` reports.
    Describe,
    /// `tool/invoke`.
    InvokeTool {
        /// The tool.
        name: String,
        /// Its arguments.
        arguments: Value,
        /// The caller's call id.
        tool_call_id: Option<String>,
        /// Runs it without asking for approval.
        skip_approval: bool,
        /// Cancels it when run here (a token does not travel between nodes).
        #[serde(skip)]
        cancel: Option<tokio_util::sync::CancellationToken>,
    },
    /// `tool/list`.
    ToolList,
    /// `turn/start`.
    StartTurn {
        /// The input.
        input: String,
        /// Its images.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageInput>,
        /// The caller's turn id.
        turn_id: Option<String>,
        /// The model the turn chose.
        #[serde(default)]
        model: Option<String>,
        /// The W3C trace context the turn continues.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
        /// The reasoning effort the turn chose.
        #[serde(default)]
        reasoning_effort: Option<String>,
    },
    /// `session/open` with a model: the actor takes the stored choice.
    SetModel {
        /// The model.
        model: Option<String>,
        /// The reasoning effort.
        reasoning_effort: Option<String>,
    },
    /// `turn/interrupt`.
    Interrupt,
    /// `turn/steer`.
    Steer {
        /// The running turn.
        turn_id: String,
        /// The input.
        input: String,
    },
    /// `session/compact`: summarises the older conversation now (see
    /// [`crate::agent::compaction`]); refused while a turn runs, answered after
    /// `session/compacted` was sent.
    Compact,
    /// `session/revert`: puts the workspace back as it was before the turn `turn_id` (see
    /// [`crate::checkpoint`]), answering `{files: [{path, change}]}`, what was (or with
    /// `dry_run`, would be) undone. Files changed since the session's last turn ended are a
    /// conflict that refuses it unless `force`.
    Revert {
        /// The turn whose start the workspace goes back to.
        turn_id: String,
        /// Only say what would change.
        dry_run: bool,
        /// Revert over files changed since the last turn ended.
        #[serde(default)]
        force: bool,
    },
    /// `approval/respond`.
    RespondApproval {
        /// The approval.
        approval_id: String,
        /// The decision.
        decision: Decision,
        /// Words for the model with a decline.
        message: Option<String>,
    },
    /// `user_input/respond`: the user's answers to a pending `request_user_input`.
    RespondUserInput {
        /// The question.
        request_id: String,
        /// The answers.
        answers: Value,
    },
    /// `task/cancel`.
    CancelTask {
        /// The task.
        task_id: String,
    },
}

/// What a session answers a [`SessionRequest`], by request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", content = "value", rename_all = "snake_case")]
pub enum SessionReply {
    /// `Describe`: what `session/open` reports.
    View(Box<SessionView>),
    /// `InvokeTool`: the call's result.
    Invoked(Box<InvokeResult>),
    /// `ToolList`: the `tool/list` answer.
    ToolList(Value),
    /// `StartTurn`: the turn's id, once `turn/started` is out.
    TurnStarted(String),
    /// `Interrupt`: whether a turn was running.
    Interrupted(bool),
    /// `Compact`: what the compaction did, after `session/compacted`.
    Compacted(CompactionStats),
    /// `Revert`: `{files: [{path, change}]}`.
    Reverted(Value),
    /// `CancelTask`: the task's final state, or `None` when it was not running.
    TaskCancelled(Option<TaskState>),
    /// Done, with nothing to say (`SetModel`, `Steer`, `RespondApproval`, `RespondUserInput`).
    Done,
}

impl SessionRequest {
    /// An `InvokeTool` of `name` with `arguments` and the caller's `options`.
    pub fn invoke(name: String, arguments: Value, options: InvokeOptions) -> Self {
        Self::InvokeTool {
            name,
            arguments,
            tool_call_id: options.tool_call_id,
            skip_approval: options.skip_approval,
            cancel: options.cancel,
        }
    }

    /// A `SetModel` of `choice`.
    pub fn set_model(choice: ModelChoice) -> Self {
        Self::SetModel {
            model: choice.model,
            reasoning_effort: choice.reasoning_effort,
        }
    }

    /// The trace context it continues, for the calls that carry one.
    pub fn traceparent(&self) -> Option<&str> {
        match self {
            Self::StartTurn { traceparent, .. } => traceparent.as_deref(),
            _ => None,
        }
    }

    /// Continues the trace `traceparent` names (the forwarding node's span, from the request's
    /// header) in place of the one the call carried.
    pub fn continue_trace(&mut self, from: String) {
        if let Self::StartTurn { traceparent, .. } = self {
            *traceparent = Some(from);
        }
    }

    /// The method it came from, for the forwarding span's name.
    pub(crate) fn method(&self) -> &'static str {
        match self {
            Self::Describe => "session/describe",
            Self::InvokeTool { .. } => "tool/invoke",
            Self::ToolList => "tool/list",
            Self::StartTurn { .. } => "turn/start",
            _ => "session",
        }
    }
}

impl SessionReply {
    /// The JSON-RPC `result` of the method the request came from.
    pub fn into_wire(self) -> Value {
        match self {
            Self::View(view) => json!(view),
            Self::Invoked(result) => json!(result),
            Self::ToolList(list) | Self::Reverted(list) => list,
            Self::TurnStarted(turn_id) => json!({ "turn_id": turn_id }),
            Self::Interrupted(interrupted) => json!({ "interrupted": interrupted }),
            Self::Compacted(stats) => json!(stats),
            Self::TaskCancelled(state) => json!(state),
            Self::Done => json!({}),
        }
    }

    /// An answer of a kind the request cannot have: a node of another version, say.
    pub(crate) fn unexpected(self) -> SessionError {
        SessionError::remote("internal", format!("an answer of the wrong kind: {self:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_travel_between_nodes_as_they_are_but_for_the_cancel_token() {
        let requests = [
            SessionRequest::Describe,
            SessionRequest::invoke(
                "shell".into(),
                json!({"command": "ls"}),
                InvokeOptions {
                    tool_call_id: Some("call_1".into()),
                    cancel: Some(tokio_util::sync::CancellationToken::new()),
                    skip_approval: true,
                },
            ),
            SessionRequest::StartTurn {
                input: "hi".into(),
                images: Vec::new(),
                turn_id: Some("t1".into()),
                model: Some("local/m".into()),
                traceparent: None,
                reasoning_effort: Some("low".into()),
            },
            SessionRequest::Revert {
                turn_id: "t1".into(),
                dry_run: true,
                force: false,
            },
            SessionRequest::RespondApproval {
                approval_id: "a1".into(),
                decision: Decision::Decline,
                message: Some("no".into()),
            },
            SessionRequest::CancelTask {
                task_id: "task_1".into(),
            },
        ];
        for request in requests {
            let wire = serde_json::to_value(&request).unwrap();
            let back: SessionRequest = serde_json::from_value(wire.clone()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), wire);
            if let SessionRequest::InvokeTool { cancel, .. } = back {
                assert!(cancel.is_none(), "a token does not travel");
                assert_eq!(wire["call"], "invoke_tool");
                assert_eq!(wire["skip_approval"], true);
            }
        }
    }

    #[test]
    fn each_reply_is_its_methods_result_on_the_wire_and_survives_the_trip() {
        let cases = [
            (
                SessionReply::TurnStarted("t1".into()),
                json!({"turn_id": "t1"}),
            ),
            (
                SessionReply::Interrupted(false),
                json!({"interrupted": false}),
            ),
            (SessionReply::Done, json!({})),
            (
                SessionReply::ToolList(json!({"active": []})),
                json!({"active": []}),
            ),
            (
                SessionReply::TaskCancelled(Some(TaskState::Cancelled)),
                json!("cancelled"),
            ),
            (SessionReply::TaskCancelled(None), Value::Null),
        ];
        for (reply, result) in cases {
            let between_nodes = serde_json::to_value(&reply).unwrap();
            let back: SessionReply = serde_json::from_value(between_nodes).unwrap();
            assert_eq!(back.into_wire(), result);
        }
    }

    #[test]
    fn an_answer_of_the_wrong_kind_is_an_internal_error() {
        let err = SessionReply::Done.unexpected();
        assert_eq!(err.kind(), crate::error_kind::ErrorKind::Internal);
    }
}
