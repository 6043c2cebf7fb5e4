//! Carries out one request: a session's method becomes its [`SessionRequest`] (answered with
//! the [`SessionReply`]'s wire form), the others calls on the hub or the task store; the answer
//! goes to the queue that keeps it in order with the session's events.

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Connection;
use super::request::{InvokeParams, Request, SessionParams, TaskParams};
use super::rpc::{RequestId, RpcError, answer};
use super::tasks::cancel_task;
use crate::error_kind::ErrorKind;
use crate::session::{Outbound, SessionReply, SessionRequest};

/// How a request was handled.
pub(super) enum Dispatched {
    /// The answer was (or will be) sent by the handler itself.
    Answered,
    /// Send this answer, through the session's live queue when given.
    Now(Result<Value, RpcError>, Option<mpsc::Sender<Outbound>>),
}

impl Connection {
    /// Carries out `request`; `id` is `None` for a notification.
    pub(super) async fn dispatch(&mut self, request: Request, id: Option<RequestId>) -> Dispatched {
        match request {
            Request::SessionOpen(params) => self.open(params, id).await,
            Request::SessionFork(params) => {
                let forked = self
                    .app
                    .sessions()
                    .fork(
                        &self.caller,
                        &params.session_id,
                        params.up_to_seq,
                        params.cwd.as_deref(),
                    )
                    .await
                    .map(|row| {
                        json!({
                            "session_id": row.session_id,
                            "parent_session_id": row.parent_session_id,
                            "up_to_seq": row.last_seq,
                        })
                    })
                    .map_err(RpcError::from);
                Dispatched::Now(forked, None)
            }
            Request::SessionUpdate(params) => {
                let updated = self
                    .app
                    .sessions()
                    .set_title(&self.caller, &params.session_id, &params.title)
                    .await
                    .map(|title| json!({"session_id": params.session_id, "title": title}))
                    .map_err(RpcError::from);
                Dispatched::Now(updated, None)
            }
            Request::ToolInvoke(params) => self.invoke(params, id).await,
            Request::SessionRevert(params) => {
                let request = SessionRequest::Revert {
                    turn_id: params.turn_id,
                    dry_run: params.dry_run,
                    force: params.force,
                };
                self.session_request(&params.session_id, request).await
            }
            Request::SessionMerge(params) => {
                let message = params
                    .message
                    .unwrap_or_else(|| format!("Work of session {}", params.session_id));
                self.end_worktree(&params.session_id, Some(&message)).await
            }
            Request::SessionDiscard(params) => self.end_worktree(&params.session_id, None).await,
            Request::SessionCompact(params) => self.compact(params, id).await,
            Request::ToolList(params) => {
                self.session_request(&params.session_id, SessionRequest::ToolList)
                    .await
            }
            Request::ModelList(_) => Dispatched::Now(Ok(self.model_list()), None),
            Request::AgentList(_) => Dispatched::Now(
                Ok(json!({"agents": self.app.sessions().profiles().list()})),
                None,
            ),
            Request::TurnStart(params) => {
                let (input, images) = match params.input() {
                    Ok(input) => input,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let choice = params.choice();
                if let Err(err) = choice.check(self.app.agent()) {
                    return Dispatched::Now(Err(err.into()), None);
                }
                let request = SessionRequest::StartTurn {
                    input,
                    images,
                    turn_id: params.turn_id,
                    model: choice.model,
                    traceparent: params.meta.and_then(|meta| meta.traceparent),
                    reasoning_effort: choice.reasoning_effort,
                };
                self.session_request(&params.session_id, request).await
            }
            Request::TurnInterrupt(params) => {
                self.session_request(&params.session_id, SessionRequest::Interrupt)
                    .await
            }
            Request::TurnSteer(params) => {
                let input = match params.text() {
                    Ok(input) => input,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let request = SessionRequest::Steer {
                    turn_id: params.turn_id,
                    input,
                };
                self.session_request(&params.session_id, request).await
            }
            Request::ApprovalRespond(params) => {
                let request = SessionRequest::RespondApproval {
                    approval_id: params.approval_id,
                    decision: params.decision,
                    message: params.message,
                };
                self.session_request(&params.session_id, request).await
            }
            Request::UserInputRespond(params) => {
                let request = SessionRequest::RespondUserInput {
                    request_id: params.request_id,
                    answers: params.answers,
                };
                self.session_request(&params.session_id, request).await
            }
            Request::TaskList(params) => {
                Dispatched::Now(self.task_list(&params.session_id).await, None)
            }
            Request::TaskOutputRead(params) => {
                Dispatched::Now(self.read_output(&params).await, None)
            }
            Request::TaskCancel(params) => self.cancel(params, id),
            // Refused when the frame was read; kept for the match to be whole.
            Request::Unknown => Dispatched::Now(
                Err(RpcError::new(ErrorKind::MethodNotFound, "unknown method")),
                None,
            ),
        }
    }

    /// `tool/invoke`: counted against the session's in-flight limit now, in the order requests
    /// arrive; tools may run for long, so the answer comes from a task and the connection keeps
    /// reading.
    async fn invoke(&mut self, params: InvokeParams, id: Option<RequestId>) -> Dispatched {
        let (handle, live) = match self.attachment(&params.session_id).await {
            Ok(found) => found,
            Err(err) => return Dispatched::Now(Err(err.into()), None),
        };
        let options = crate::session::InvokeOptions {
            skip_approval: params.skip_approval,
            ..Default::default()
        };
        let call = handle.request(SessionRequest::invoke(
            params.name,
            params.arguments,
            options,
        ));
        tokio::spawn(async move {
            let outcome = call
                .await
                .map(SessionReply::into_wire)
                .map_err(RpcError::from);
            if let Some(frame) = answer(&id, outcome) {
                let _ = live.send(frame).await;
            }
        });
        Dispatched::Answered
    }

    /// `session/compact`: the summary call takes a while, so it runs in a task and the
    /// connection keeps reading; the answer follows `session/compacted` on the live queue.
    async fn compact(&mut self, params: SessionParams, id: Option<RequestId>) -> Dispatched {
        let (handle, live) = match self.attachment(&params.session_id).await {
            Ok(found) => found,
            Err(err) => return Dispatched::Now(Err(err.into()), None),
        };
        tokio::spawn(async move {
            let outcome = handle
                .request(SessionRequest::Compact)
                .await
                .map(SessionReply::into_wire)
                .map_err(RpcError::from);
            if let Some(frame) = answer(&id, outcome) {
                let _ = live.send(frame).await;
            }
        });
        Dispatched::Answered
    }

    /// `task/cancel`: cancelling waits for the task to end, so it runs in a task and the
    /// connection keeps reading meanwhile. The answer follows the session's own events when
    /// this connection watches it.
    fn cancel(&self, params: TaskParams, id: Option<RequestId>) -> Dispatched {
        let out = self
            .attached
            .get(&params.session_id)
            .map_or_else(|| self.out.clone(), |a| a.live.clone());
        let (app, caller) = (self.app.clone(), self.caller.clone());
        tokio::spawn(async move {
            let outcome = cancel_task(&app, &caller, &params).await;
            if let Some(frame) = answer(&id, outcome) {
                let _ = out.send(frame).await;
            }
        });
        Dispatched::Answered
    }

    /// `session/merge` (with the commit message for what is uncommitted) or `session/discard`:
    /// the session's actor restarts at its own cwd, and this connection watches the new one.
    async fn end_worktree(&mut self, session_id: &str, merge: Option<&str>) -> Dispatched {
        let ended = self
            .app
            .sessions()
            .end_worktree(&self.caller, session_id, merge)
            .await;
        match ended {
            Ok(answer) => match self.attachment(session_id).await {
                Ok((_, live)) => Dispatched::Now(Ok(answer), Some(live)),
                Err(_) => Dispatched::Now(Ok(answer), None),
            },
            Err(err) => Dispatched::Now(Err(err.into()), None),
        }
    }

    /// Sends `request` to the session; its reply is the method's result, answered through the
    /// session's live queue.
    async fn session_request(&mut self, session_id: &str, request: SessionRequest) -> Dispatched {
        match self.attachment(session_id).await {
            Ok((handle, live)) => {
                let outcome = handle
                    .request(request)
                    .await
                    .map(SessionReply::into_wire)
                    .map_err(RpcError::from);
                Dispatched::Now(outcome, Some(live))
            }
            Err(err) => Dispatched::Now(Err(err.into()), None),
        }
    }
}
