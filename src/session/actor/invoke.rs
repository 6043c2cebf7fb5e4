//! A client's `tool/invoke`: prepared by the actor, run through the one call path in a task of
//! its own, and answered once its `tool/completed` is committed.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{RwLock, oneshot};

use super::SessionActor;
use super::link::{ActorLink, ActorRequest};
use crate::agent::call::{self, Call};
use crate::agent::ledger::CostLabels;
use crate::session::{InvokeOptions, InvokeResult, ReplyTx, SessionError, SessionReply};
use crate::tools::ToolResult;

/// What the session's tool calls wait on.
#[derive(Default)]
pub(super) struct CallPart {
    /// Client calls (`tool/invoke`) started and not yet answered, by tool_call_id.
    pub(super) answers: HashMap<String, ReplyTx>,
    /// Safe calls share it, Exclusive calls hold it alone, so client invocations obey the
    /// same concurrency rules as a model's batch.
    pub(super) exclusivity: Arc<RwLock<()>>,
    /// Questions asked by `request_user_input`, by request id.
    pub(super) questions: HashMap<String, oneshot::Sender<Value>>,
}

impl SessionActor {
    pub(super) async fn invoke_tool(
        &mut self,
        name: String,
        arguments: Value,
        options: InvokeOptions,
        reply: ReplyTx,
    ) {
        if self.write_health.is_failing() {
            let _ = reply.send(Err(SessionError::StorageUnavailable(
                "its events could not be stored".into(),
            )));
            return;
        }
        let before = self.registry.catalog();
        let prepared = self.registry.prepare(&name, &arguments);
        self.announce_tool_changes(before).await;
        let prepared = match prepared {
            Ok(call) => call,
            Err(err) => {
                self.metrics.record_refusal(err.refusal(&name));
                let _ = reply.send(Err(err.into()));
                return;
            }
        };
        let tool_call_id = match options.tool_call_id {
            Some(id) if self.calls.answers.contains_key(&id) => {
                let _ = reply.send(Err(SessionError::InvalidParams(format!(
                    "a call with id {id:?} is already running"
                ))));
                return;
            }
            Some(id) => id,
            None => format!("call_{}", uuid::Uuid::new_v4().simple()),
        };
        self.calls.answers.insert(tool_call_id.clone(), reply);
        let scope = self.call_scope(CostLabels {
            node_id: "agent".into(),
            turn_id: None,
            task_id: None,
        });
        let cancel = self.cancel.child_token();
        let call = Call {
            hold_key: tool_call_id.clone(),
            tool_call_id: tool_call_id.clone(),
            prepared,
            arguments,
            cancel: cancel.clone(),
            approved: options.skip_approval,
        };
        // Its events come back on the same ordered channel as its end, so the caller hears
        // the result only after everything the call said.
        let link = ActorLink::new(self.inbound.sender());
        let asked_to_stop = options.cancel;
        self.tracker.spawn(async move {
            let run = call::run(&link, &scope, call);
            let result = match asked_to_stop {
                None => run.await,
                Some(asked) => {
                    tokio::pin!(run);
                    // The call hears of it through its own token and ends with its result.
                    tokio::select! {
                        result = &mut run => result,
                        () = asked.cancelled() => {
                            cancel.cancel();
                            run.await
                        }
                    }
                }
            };
            let _ = link
                .actor
                .send(ActorRequest::Invoked(Box::new((tool_call_id, result))))
                .await;
        });
    }

    /// A client's call ended: its events are committed, then its caller hears the result —
    /// or, when the store refused them, that they are not stored: a result nobody can replay
    /// is never acknowledged.
    pub(super) async fn on_invoked(&mut self, tool_call_id: String, result: ToolResult) {
        if !self.commit_lingering().await {
            if let Some(reply) = self.calls.answers.remove(&tool_call_id) {
                let _ = reply.send(Err(SessionError::StorageUnavailable(format!(
                    "the call ran (success: {}) but its events are not stored yet",
                    result.success
                ))));
            }
            return;
        }
        // Activations a tool asked for show up in the next listing.
        let before = self.registry.catalog();
        self.registry.apply_activation_requests();
        self.announce_tool_changes(before).await;
        if let Some(reply) = self.calls.answers.remove(&tool_call_id) {
            let _ = reply.send(Ok(SessionReply::Invoked(Box::new(InvokeResult {
                tool_call_id,
                success: result.success,
                structured_metadata: result.wire_metadata(),
                output: result.output,
            }))));
        }
    }
}
