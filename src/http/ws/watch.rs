//! The sessions a connection watches: `session/open` (replay from the store, answer, then go
//! live), attaching on first use by any other session method, and handing each session's live
//! queue to the writer.

use serde_json::{Value, json};

use super::dispatch::Dispatched;
use super::request::OpenParams;
use super::rpc::{RequestId, answer};
use super::{Connection, REPLAY_PAGE};
use crate::session::frames::{FrameQueue, FrameSender, frame_queue};
use crate::session::{OpenedSession, Outbound, SessionError, SessionHandle, SessionView, Watcher};

/// One session this connection watches.
pub(super) struct Attachment {
    pub handle: SessionHandle,
    /// Answers to this session's requests go through the same queue as its events.
    pub live: FrameSender,
}

impl Connection {
    /// The watched session, attaching (live only) when this connection has not opened it yet.
    pub(super) async fn attachment(
        &mut self,
        session_id: &str,
    ) -> Result<(SessionHandle, FrameSender), SessionError> {
        if let Some(existing) = self.attached.get(session_id)
            && !existing.handle.is_closed()
        {
            return Ok((existing.handle.clone(), existing.live.clone()));
        }
        let (live, live_rx) = frame_queue(self.app.config().server.ws_queue_frames);
        let watcher = Watcher {
            connection_id: self.id,
            tx: live.clone(),
            lagged: self.lagged.clone(),
        };
        let (handle, _) = self.attach(session_id, watcher, None, None).await?;
        self.forward(live_rx);
        self.attached.insert(
            session_id.to_string(),
            Attachment {
                handle: handle.clone(),
                live: live.clone(),
            },
        );
        Ok((handle, live))
    }

    /// Attaches a watcher, loading the actor again if it unloaded in between; `created` is the
    /// handle of a session made just now, tried first without reading its row back.
    async fn attach(
        &self,
        session_id: &str,
        watcher: Watcher,
        after_seq: Option<i64>,
        mut created: Option<SessionHandle>,
    ) -> Result<(SessionHandle, (i64, SessionView)), SessionError> {
        let mut attempts = 0;
        loop {
            let handle = match created.take() {
                Some(handle) => handle,
                None => self.app.sessions().handle(&self.caller, session_id).await?,
            };
            match handle.attach_replaying(watcher.clone(), after_seq).await {
                Ok(attached) => return Ok((handle, attached)),
                // An idle actor may unload between lookup and attach; a fresh one is loaded.
                Err(SessionError::ActorGone) if attempts < 3 => attempts += 1,
                Err(err) => return Err(err),
            }
        }
    }

    /// Lets the writer drain a session's live frames, after everything queued so far.
    fn forward(&self, live_rx: FrameQueue) {
        self.signals.follow(live_rx);
    }

    /// `session/open`: create or re-attach, replay `after_seq`, answer, then go live.
    pub(super) async fn open(&mut self, params: OpenParams, id: Option<RequestId>) -> Dispatched {
        let sessions = self.app.sessions().clone();
        let choice = params.choice();
        if let Err(err) = choice.check(self.app.agent()) {
            return Dispatched::Now(Err(err.into()), None);
        }
        let worktree = params.isolation == Some(crate::session::worktree::Isolation::Worktree);
        if params.base.is_some() && !worktree {
            let refused =
                SessionError::InvalidParams("base is for isolation \"worktree\" only".into());
            return Dispatched::Now(Err(refused.into()), None);
        }
        if params.isolation.is_some() && params.session_id.is_some() {
            let refused = SessionError::InvalidParams(
                "isolation is chosen when a session is created, not when it is opened again".into(),
            );
            return Dispatched::Now(Err(refused.into()), None);
        }
        let (row, resumed, created) = match &params.session_id {
            Some(session_id) => match sessions.row(&self.caller, session_id).await {
                Ok(row) if params.agent.is_some() && params.agent != row.agent => {
                    let refused = SessionError::InvalidParams(format!(
                        "session {session_id} was opened as agent {:?}; an agent is chosen when \
                         a session is created",
                        row.agent.as_deref().unwrap_or("(none)")
                    ));
                    return Dispatched::Now(Err(refused.into()), None);
                }
                Ok(row) => (row, true, None),
                Err(err) => return Dispatched::Now(Err(err.into()), None),
            },
            None => match if worktree {
                sessions
                    .create_in_worktree(
                        &self.caller,
                        params.cwd.as_deref(),
                        params.agent.as_deref(),
                        params.base.as_deref(),
                    )
                    .await
            } else {
                sessions
                    .create_as(
                        &self.caller,
                        params.cwd.as_deref(),
                        params.agent.as_deref(),
                        Vec::new(),
                    )
                    .await
            } {
                Ok((handle, row)) => (row, false, Some(handle)),
                Err(err) => return Dispatched::Now(Err(err.into()), None),
            },
        };
        let (session_id, worktree) = (row.session_id.clone(), row.worktree.clone());
        // The answer names the session's model from its row: read again only when this open
        // changed it.
        let known = choice.is_empty().then_some(row);
        if !choice.is_empty()
            && let Err(err) = sessions.set_model(&self.caller, &session_id, choice).await
        {
            return Dispatched::Now(Err(err.into()), None);
        }
        if let Some(previous) = self.attached.remove(&session_id) {
            previous.handle.detach(self.id).await;
        }
        let (live, live_rx) = frame_queue(self.app.config().server.ws_queue_frames);
        let watcher = Watcher {
            connection_id: self.id,
            tx: live.clone(),
            lagged: self.lagged.clone(),
        };
        let (handle, (last_seq, view)) = match self
            .attach(&session_id, watcher, params.after_seq, created)
            .await
        {
            Ok(attached) => attached,
            Err(err) => return Dispatched::Now(Err(err.into()), None),
        };
        // Events up to last_seq come from the store, later ones from the live queue, which
        // starts draining only after the replay and the answer: no gap, no duplicate.
        if let Some(after_seq) = params.after_seq
            && let Err(err) = self.replay(&session_id, after_seq, last_seq).await
        {
            handle.detach(self.id).await;
            return Dispatched::Now(Err(err.into()), None);
        }
        let opened = OpenedSession {
            session_id: session_id.clone(),
            resumed,
            last_seq,
            capabilities: view.capabilities,
            tools: view.tools,
        };
        let mut result = json!(opened);
        // Extension: a client can offer the tool console before a turn/start is refused.
        result["llm_configured"] = json!(self.app.config().llm.is_configured());
        result["sandbox"] = json!(sessions.sandbox_report());
        if let Some(worktree) = worktree {
            result["worktree"] = json!(worktree);
        }
        let row = match known {
            Some(row) => Some(row),
            None if self.app.agent().is_some() => {
                sessions.row(&self.caller, &session_id).await.ok()
            }
            None => None,
        };
        if let (Some(agent), Some(row)) = (self.app.agent(), row) {
            let profile_model = row
                .agent
                .as_deref()
                .and_then(|name| sessions.profiles().get(name).ok())
                .and_then(|profile| profile.model.as_deref());
            result["model"] = json!(
                row.model
                    .as_deref()
                    .or(profile_model)
                    .unwrap_or(&agent.model)
            );
            result["reasoning_effort"] = json!(row.reasoning_effort);
            result["agent"] = json!(row.agent);
        }
        result["mcp"] = view.mcp;
        result["instructions"] = json!(view.instructions);
        result["capabilities"]["mcp"] = result["mcp"].clone();
        if let Some(frame) = answer(&id, Ok(result)) {
            let _ = self.out.send(frame).await;
        }
        self.forward(live_rx);
        self.attached
            .insert(session_id, Attachment { handle, live });
        Dispatched::Answered
    }

    /// `model/list`: the default model and every configured one.
    pub(super) fn model_list(&self) -> Value {
        let Some(agent) = self.app.agent() else {
            return json!({"default": null, "models": []});
        };
        json!({
            "default": agent.models.default_model(),
            "models": agent.models.models(&agent.pricing, agent.context_window),
        })
    }

    /// Sends stored events with `after_seq < seq <= up_to`, in order.
    async fn replay(
        &mut self,
        session_id: &str,
        after_seq: i64,
        up_to: i64,
    ) -> Result<(), SessionError> {
        let store = self.app.sessions().store();
        let mut cursor = after_seq.max(0);
        while cursor < up_to {
            let page = store
                .events_after(
                    session_id,
                    cursor,
                    REPLAY_PAGE.min(up_to.saturating_sub(cursor)),
                )
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            cursor = last.seq;
            for event in page.into_iter().filter(|e| e.seq <= up_to) {
                let frame = crate::session::notification_frame(&event.method, &event.params);
                if self.out.send(Outbound::Text(frame)).await.is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
