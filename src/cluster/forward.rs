//! Node-to-node requests: a follower passes a client's request for a session owned elsewhere
//! to the owner, `POST <advertise_url>/cluster/call` with the cluster secret, and the owner
//! answers as its own actor did.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Cluster;
use crate::agent::approval::Decision;
use crate::session::{Command, InvokeOptions, SessionError};

/// The path of the owner's endpoint.
pub const CALL_PATH: &str = "/cluster/call";

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
        /// The caller's turn id.
        turn_id: Option<String>,
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

/// Why a forwarded request got no answer from the owner.
#[derive(Debug)]
pub enum Undelivered {
    /// The owner could not be reached (it may have died); the lease will tell. Nothing ran.
    Unreachable(String),
    /// The owner took the request and was lost before answering: it may have run.
    Lost(String),
    /// The node no longer owns the session.
    NotOwner,
}

/// What a command becomes on the wire, and how the answer goes back to its asker.
pub struct Relay {
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
            Command::StartTurn {
                input,
                turn_id,
                reply,
            } => relay(
                ForwardedCall::StartTurn { input, turn_id },
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

impl Cluster {
    /// Sends `call` to the owner at `url`; the owner's answer with the session's last event
    /// seq when it answered, or why there is none.
    pub(crate) async fn forward(
        &self,
        url: &str,
        session_id: &str,
        user: Option<&str>,
        call: &ForwardedCall,
    ) -> Result<(Result<Value, SessionError>, i64), Undelivered> {
        self.metrics().cluster_forwarded.inc();
        let body = json!({"session_id": session_id, "user": user, "call": call});
        let response = self
            .http()
            .post(format!("{url}{CALL_PATH}"))
            .bearer_auth(self.secret().expose())
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|err| {
                if err.is_connect() {
                    Undelivered::Unreachable(err.to_string())
                } else {
                    Undelivered::Lost(err.to_string())
                }
            })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|err| Undelivered::Lost(err.to_string()))?;
        if status == reqwest::StatusCode::CONFLICT {
            return Err(Undelivered::NotOwner);
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|_| Undelivered::Lost(format!("the owner answered {status} without JSON")))?;
        let seq = answer["seq"].as_i64().unwrap_or_default();
        if let Some(ok) = answer.get("ok") {
            return Ok((Ok(ok.clone()), seq));
        }
        let error = &answer["error"];
        let refused = SessionError::remote(
            error["kind"].as_str().unwrap_or("internal"),
            error["message"]
                .as_str()
                .unwrap_or("the owning node failed")
                .to_string(),
        );
        Ok((Err(refused), seq))
    }
}

/// Runs a forwarded call on the owner's actor.
pub(crate) async fn run(
    handle: &crate::session::SessionHandle,
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
        ForwardedCall::StartTurn { input, turn_id } => {
            json!(handle.start_turn(input, turn_id).await?)
        }
        ForwardedCall::Interrupt => json!(handle.interrupt().await?),
        ForwardedCall::Steer { turn_id, input } => {
            handle.steer(turn_id, input).await?;
            Value::Null
        }
        ForwardedCall::Compact => json!(handle.compact().await?),
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
