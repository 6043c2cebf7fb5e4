//! Carries out one request: a session's method, read as its [`SessionRequest`], goes to the
//! session (answered with the [`SessionReply`]'s wire form), the others are calls on the hub or
//! the task store; the answer goes to the queue that keeps it in order with the session's
//! events.

use serde_json::{Value, json};

use super::Connection;
use super::request::{ConnectionRequest, Request, TaskParams};
use super::rpc::{RequestId, RpcError, answer};
use super::tasks::cancel_task;
use crate::error_kind::ErrorKind;
use crate::session::frames::FrameSender;
use crate::session::{SessionReply, SessionRequest};

/// How a request was handled.
pub(super) enum Dispatched {
    /// The answer was (or will be) sent by the handler itself.
    Answered,
    /// Send this answer, through the session's live queue when given.
    Now(Result<Value, RpcError>, Option<FrameSender>),
}

impl Connection {
    /// Carries out `request`; `id` is `None` for a notification.
    pub(super) async fn dispatch(&mut self, request: Request, id: Option<RequestId>) -> Dispatched {
        match request {
            Request::Session {
                session_id,
                request,
            } => self.session_request(&session_id, request, id).await,
            Request::Connection(own) => self.dispatch_own(own, id).await,
            // Refused when the frame was read; kept for the match to be whole.
            Request::Unknown => Dispatched::Now(
                Err(RpcError::new(ErrorKind::MethodNotFound, "unknown method")),
                None,
            ),
        }
    }

    /// Carries out a method of the connection's own.
    async fn dispatch_own(
        &mut self,
        request: ConnectionRequest,
        id: Option<RequestId>,
    ) -> Dispatched {
        match request {
            ConnectionRequest::SessionOpen(params) => self.open(params, id).await,
            ConnectionRequest::SessionFork(params) => {
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
            ConnectionRequest::SessionUpdate(params) => {
                let updated = self
                    .app
                    .sessions()
                    .set_title(&self.caller, &params.session_id, &params.title)
                    .await
                    .map(|title| json!({"session_id": params.session_id, "title": title}))
                    .map_err(RpcError::from);
                Dispatched::Now(updated, None)
            }
            ConnectionRequest::SessionMerge(params) => {
                let message = params
                    .message
                    .unwrap_or_else(|| format!("Work of session {}", params.session_id));
                self.end_worktree(&params.session_id, Some(&message)).await
            }
            ConnectionRequest::SessionDiscard(params) => {
                self.end_worktree(&params.session_id, None).await
            }
            ConnectionRequest::ModelList(_) => Dispatched::Now(Ok(self.model_list()), None),
            ConnectionRequest::AgentList(_) => Dispatched::Now(
                Ok(json!({"agents": self.app.sessions().profiles().list()})),
                None,
            ),
            ConnectionRequest::TaskList(params) => {
                Dispatched::Now(self.task_list(&params.session_id).await, None)
            }
            ConnectionRequest::TaskOutputRead(params) => {
                Dispatched::Now(self.read_output(&params).await, None)
            }
            ConnectionRequest::TaskCancel(params) => self.cancel(params, id),
            // Read as a session's method, or refused, when the frame was read.
            ConnectionRequest::Other => Dispatched::Now(
                Err(RpcError::new(ErrorKind::MethodNotFound, "unknown method")),
                None,
            ),
        }
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
            let mut out = out;
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
    /// session's live queue. A request that may take long (a tool's run, a summary call) is
    /// waited for in a task, so the connection keeps reading; it is still sent now, so it is
    /// counted against the session's in-flight limit in the order requests arrive.
    async fn session_request(
        &mut self,
        session_id: &str,
        request: SessionRequest,
        id: Option<RequestId>,
    ) -> Dispatched {
        if let Some(choice) = request.model_choice()
            && let Err(err) = choice.check(self.app.agent())
        {
            return Dispatched::Now(Err(err.into()), None);
        }
        let (handle, live) = match self.attachment(session_id).await {
            Ok(found) => found,
            Err(err) => return Dispatched::Now(Err(err.into()), None),
        };
        if !request.runs_long() {
            let answered = handle
                .request(request)
                .await
                .map(SessionReply::into_wire)
                .map_err(RpcError::from);
            return Dispatched::Now(answered, Some(live));
        }
        // The actor queues the answer itself, behind the events it committed before it. The
        // sender is this request's own, so its first frame always finds room.
        handle.request_delivered(request, move |outcome| {
            let mut live = live;
            let outcome = outcome.map(SessionReply::into_wire).map_err(RpcError::from);
            if let Some(frame) = answer(&id, outcome) {
                let _ = live.try_send(frame);
            }
        });
        Dispatched::Answered
    }
}
