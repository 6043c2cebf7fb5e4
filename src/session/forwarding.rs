//! Requests that travel between the nodes of a cluster: a follower's command as it goes to
//! the session's owner ([`ForwardedCall`]), and how the owner runs it on its actor.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Command, InvokeOptions, SessionError, SessionHandle};
use crate::agent::approval::Decision;

/// One request of a session's, as it travels between nodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum ForwardedCall {
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
        images: Vec<super::ImageInput>,
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
    /// `session/open` with a model: the owner's actor takes the stored choice.
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
    /// `session/compact`.
    Compact,
    /// `session/revert`.
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
    /// `user_input/respond`.
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

/// The body of a forwarded request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Forwarded {
    /// The session.
    pub session_id: String,
    /// Who asked (checked by the owner against the session, as its own clients are).
    pub user: Option<String>,
    /// What was asked.
    pub call: ForwardedCall,
}

/// What a command becomes on the wire, and how the answer goes back to its asker.
pub(crate) struct Relay {
    /// The request.
    pub call: ForwardedCall,
    answer: Box<dyn FnOnce(Result<Value, SessionError>) + Send>,
}

impl Relay {
    /// Splits a follower's command; the command back for those without a wire form.
    pub(crate) fn of(command: Command) -> Result<Self, Command> {
        fn typed<T: serde::de::DeserializeOwned>(
            value: Result<Value, SessionError>,
        ) -> Result<T, SessionError> {
            value.and_then(|value| {
                serde_json::from_value(value).map_err(|err| {
                    SessionError::remote("internal", format!("owner's answer: {err}"))
                })
            })
        }
        let relay = |call, answer: Box<dyn FnOnce(Result<Value, SessionError>) + Send>| {
            Ok(Self { call, answer })
        };
        match command {
            Command::Describe { reply } => relay(
                ForwardedCall::Describe,
                Box::new(move |value| {
                    if let Ok(view) = typed(value) {
                        let _ = reply.send(view);
                    }
                }),
            ),
            Command::InvokeTool {
                name,
                arguments,
                options,
                reply,
            } => relay(
                ForwardedCall::InvokeTool {
                    name,
                    arguments,
                    tool_call_id: options.tool_call_id,
                    skip_approval: options.skip_approval,
                    cancel: options.cancel,
                },
                Box::new(move |value| {
                    let _ = reply.send(typed(value));
                }),
            ),
            Command::ToolList { reply } => relay(
                ForwardedCall::ToolList,
                Box::new(move |value| {
                    if let Ok(list) = value {
                        let _ = reply.send(list);
                    }
                }),
            ),
            Command::SetModel { choice, reply } => relay(
                ForwardedCall::SetModel {
                    model: choice.model,
                    reasoning_effort: choice.reasoning_effort,
                },
                Box::new(move |_| {
                    let _ = reply.send(());
                }),
            ),
            Command::StartTurn { start, reply } => relay(
                ForwardedCall::StartTurn {
                    input: start.input,
                    images: start.images,
                    turn_id: start.turn_id,
                    model: start.choice.model,
                    traceparent: start.traceparent,
                    reasoning_effort: start.choice.reasoning_effort,
                },
                Box::new(move |value| {
                    let _ = reply.send(typed(value));
                }),
            ),
            Command::Interrupt { reply } => relay(
                ForwardedCall::Interrupt,
                Box::new(move |value| {
                    if let Ok(interrupted) = typed(value) {
                        let _ = reply.send(interrupted);
                    }
                }),
            ),
            Command::Steer {
                turn_id,
                input,
                reply,
            } => relay(
                ForwardedCall::Steer { turn_id, input },
                Box::new(move |value| {
                    let _ = reply.send(value.map(drop));
                }),
            ),
            Command::Revert {
                turn_id,
                dry_run,
                force,
                reply,
            } => relay(
                ForwardedCall::Revert {
                    turn_id,
                    dry_run,
                    force,
                },
                Box::new(move |value| {
                    let _ = reply.send(value);
                }),
            ),
            Command::Compact { reply } => relay(
                ForwardedCall::Compact,
                Box::new(move |value| {
                    let outcome = typed(value);
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let answered = match outcome {
                        Ok(stats) => {
                            let _ = tx.send(Ok(stats));
                            Ok(rx)
                        }
                        Err(err) => Err(err),
                    };
                    let _ = reply.send(answered);
                }),
            ),
            Command::RespondApproval {
                approval_id,
                answer,
                reply,
            } => relay(
                ForwardedCall::RespondApproval {
                    approval_id,
                    decision: answer.decision,
                    message: answer.message,
                },
                Box::new(move |value| {
                    let _ = reply.send(value.map(drop));
                }),
            ),
            Command::RespondUserInput {
                request_id,
                answers,
                reply,
            } => relay(
                ForwardedCall::RespondUserInput {
                    request_id,
                    answers,
                },
                Box::new(move |value| {
                    let _ = reply.send(value.map(drop));
                }),
            ),
            Command::CancelTask { task_id, reply } => relay(
                ForwardedCall::CancelTask { task_id },
                Box::new(move |value| {
                    if let Ok(state) = typed(value) {
                        let _ = reply.send(state);
                    }
                }),
            ),
            other => Err(other),
        }
    }

    /// Answers the asker.
    pub(crate) fn answer(self, outcome: Result<Value, SessionError>) {
        (self.answer)(outcome);
    }
}

impl ForwardedCall {
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

/// Runs a forwarded call on the owner's actor.
pub(crate) async fn run(
    handle: &SessionHandle,
    call: ForwardedCall,
) -> Result<Value, SessionError> {
    Ok(match call {
        ForwardedCall::Describe => json!(handle.describe().await?),
        ForwardedCall::InvokeTool {
            name,
            arguments,
            tool_call_id,
            skip_approval,
            cancel,
        } => {
            let options = InvokeOptions {
                tool_call_id,
                cancel,
                skip_approval,
            };
            json!(handle.invoke_tool_with(name, arguments, options).await?)
        }
        ForwardedCall::ToolList => handle.tool_list().await?,
        ForwardedCall::StartTurn {
            input,
            images,
            turn_id,
            model,
            traceparent,
            reasoning_effort,
        } => {
            let choice = super::ModelChoice {
                model,
                reasoning_effort,
            };
            json!(
                handle
                    .start_turn_traced(input, images, turn_id, choice, traceparent)
                    .await?
            )
        }
        ForwardedCall::SetModel {
            model,
            reasoning_effort,
        } => {
            let choice = super::ModelChoice {
                model,
                reasoning_effort,
            };
            handle.set_model(choice).await?;
            Value::Null
        }
        ForwardedCall::Interrupt => json!(handle.interrupt().await?),
        ForwardedCall::Steer { turn_id, input } => {
            handle.steer(turn_id, input).await?;
            Value::Null
        }
        ForwardedCall::Compact => json!(handle.compact().await?),
        ForwardedCall::Revert {
            turn_id,
            dry_run,
            force,
        } => handle.revert(turn_id, dry_run, force).await?,
        ForwardedCall::RespondApproval {
            approval_id,
            decision,
            message,
        } => {
            handle
                .respond_approval(approval_id, decision, message)
                .await?;
            Value::Null
        }
        ForwardedCall::RespondUserInput {
            request_id,
            answers,
        } => {
            handle.respond_user_input(request_id, answers).await?;
            Value::Null
        }
        ForwardedCall::CancelTask { task_id } => json!(handle.cancel_task(task_id).await?),
    })
}
