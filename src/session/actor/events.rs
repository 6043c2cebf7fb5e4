//! How the actor commits and streams its events: lingering for a shared commit, the store
//! append, the hand-off to watchers, and the events that tools and the registry cause.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::{LINGER, SessionActor, UNSTORED_RETRY};
use crate::agent::SessionEvent;
use crate::session::frames::TrySendError;
use crate::session::{Outbound, ToolNames, Watcher, notification_text, stamp};
use crate::store::{CostRow, NewEvent, StoreResult, Write};
use crate::tools::{ToolCatalog, ToolEvent};

/// The session's events on their way out: the seq of the last one stored, those lingering
/// for a shared commit, those the store refused, and the connections that watch them.
pub(super) struct EventLog {
    pub(super) last_seq: i64,
    /// Events accepted but not yet committed (see `linger`), in order, and when they must be.
    pub(super) lingering: Vec<SessionEvent>,
    pub(super) linger_until: Option<Instant>,
    pub(super) watchers: Vec<Watcher>,
    /// Events the store refused, in order, as their method and params: tried again before
    /// any later event, and sent to nobody until stored.
    pub(super) unstored: Vec<(String, Value)>,
}

impl EventLog {
    /// A log whose last stored event is `last_seq`.
    pub(super) fn starting_at(last_seq: i64) -> Self {
        Self {
            last_seq,
            lingering: Vec::new(),
            linger_until: None,
            watchers: Vec::new(),
            unstored: Vec::new(),
        }
    }
}

impl SessionActor {
    /// Persists one event, after any that linger, then hands them to every watcher.
    pub(super) async fn emit(&mut self, event: SessionEvent) {
        self.log.lingering.push(event);
        self.commit_lingering().await;
    }

    /// Accepts an event that may wait up to [`LINGER`] for the next one, so the two are
    /// committed together: a fast tool's `tool/started` goes with its `tool/completed`, a
    /// turn's events in a few batches. No one sees it before it is committed; every later
    /// event commits it first, so the order holds.
    pub(super) fn linger(&mut self, event: SessionEvent) {
        self.log.lingering.push(event);
        if self.log.linger_until.is_none() {
            self.log.linger_until = Some(Instant::now() + LINGER);
        }
    }

    /// Persists the lingering events (after any an earlier commit could not store) with the
    /// next seqs in one append, then hands them to every watcher. A watcher whose queue is
    /// full is cut off (it resumes from the store); the actor never waits on a socket. Answers
    /// whether everything is stored: events the store refused are kept, in order, and tried
    /// again shortly (and before any later event), never sent before they are stored.
    pub(super) async fn commit_lingering(&mut self) -> bool {
        self.log.linger_until = None;
        if self.log.lingering.is_empty() && self.log.unstored.is_empty() {
            return true;
        }
        let was_waiting = !self.log.unstored.is_empty();
        let mut held = std::mem::take(&mut self.log.unstored);
        // Taken, not drained: an idle session should not keep room for a burst of events.
        let lingering = std::mem::take(&mut self.log.lingering);
        held.extend(lingering.into_iter().map(SessionEvent::into_wire));
        self.commit_held(held, was_waiting).await
    }

    /// Commits the lingering events and one history entry after them together, with the cost
    /// row of the model call that produced the entry if any, so a model's step (its deltas,
    /// its `message/completed`, its message, its cost) is one commit; answers how the entry
    /// went, the row going with it. With events the store refused waiting for their own retry,
    /// the entry (and its row) is written without the lingering events. If the commit fails,
    /// nothing of it is stored: the entry fails (the turn ends on it) and the events are
    /// committed alone, the way [`SessionActor::commit_lingering`] does, retries and all.
    pub(super) async fn commit_with_history(
        &mut self,
        entry: Value,
        cost: Option<CostRow>,
    ) -> StoreResult<()> {
        // Events the store refused wait for their own retry, ahead of anything later.
        let merged = self.log.unstored.is_empty();
        let held: Vec<(String, Value)> = if merged {
            self.log.linger_until = None;
            std::mem::take(&mut self.log.lingering)
                .into_iter()
                .map(SessionEvent::into_wire)
                .collect()
        } else {
            Vec::new()
        };
        let events = self.stamped(self.log.last_seq + 1, &held);
        // Events still lingering get the next seqs; the message comes after them.
        let event_seq = self.log.last_seq + (held.len() + self.log.lingering.len()) as i64;
        let mut writes = Vec::with_capacity(3);
        if !events.is_empty() {
            // A copy of shared texts: the writes themselves go to the store.
            writes.push(Write::Events(events.clone()));
        }
        writes.push(Write::Message {
            session_id: self.session_id.to_string(),
            message: entry,
            event_seq,
        });
        writes.extend(cost.map(Write::Cost));
        match self.writer.write_vec(writes).await {
            Ok(_) => {
                self.hand_out(&events);
                Ok(())
            }
            Err(err) => {
                if !held.is_empty() {
                    self.commit_held(held, false).await;
                }
                Err(err)
            }
        }
    }

    /// Stores `held` (events in wire form, in order) with the next seqs and hands them out;
    /// `was_waiting` says they include events the store refused before. See
    /// [`SessionActor::commit_lingering`].
    async fn commit_held(&mut self, held: Vec<(String, Value)>, was_waiting: bool) -> bool {
        let mut first = self.log.last_seq + 1;
        let mut events = self.stamped(first, &held);
        if let Err(err) = self.writer.append_events(&events).await {
            // A write that committed but reported failure leaves the store ahead of us: catch
            // up once and retry, rather than refusing every later event.
            let retried = match (&err, self.store.get_session(&self.session_id).await) {
                (crate::store::StoreError::Conflict(_), Ok(Some(row))) => {
                    first = row.last_seq + 1;
                    events = self.stamped(first, &held);
                    self.writer.append_events(&events).await
                }
                _ => Err(err),
            };
            if let Err(err) = retried {
                let methods: Vec<&str> = held.iter().map(|(method, _)| method.as_str()).collect();
                tracing::error!(%err, ?methods, seq = first, "events not stored yet; retrying");
                if !was_waiting {
                    self.write_health.session_waiting(&err);
                }
                self.log.unstored = held;
                self.log.linger_until = Some(Instant::now() + UNSTORED_RETRY);
                self.cut_turn_for_storage();
                return false;
            }
        }
        if was_waiting {
            self.write_health.session_done();
        }
        self.hand_out(&events);
        true
    }

    /// Hands stored events to every watcher, in order.
    fn hand_out(&mut self, events: &[NewEvent]) {
        for event in events {
            self.log.last_seq = event.seq;
            self.metrics.events_written.inc();
            let frame = Outbound::Text(notification_text(&event.method, &event.params_json));
            self.log
                .watchers
                .retain_mut(|watcher| match watcher.tx.try_send(frame.clone()) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        tracing::info!(
                            connection = watcher.connection_id,
                            "watcher lagged; cut off"
                        );
                        watcher.lagged.cancel();
                        false
                    }
                    Err(TrySendError::Closed(_)) => false,
                });
        }
    }

    /// The store refused the session's events: a running turn stops (it would go on acting
    /// on what nobody can replay), and ends `storage_unavailable`.
    fn cut_turn_for_storage(&mut self) {
        if let Some(turn) = &self.turn.running
            && !turn.cancel.is_cancelled()
        {
            tracing::warn!(turn_id = %turn.turn_id, "stopping the turn: its events cannot be stored");
            self.turn.storage_cut = Some((
                turn.turn_id.clone(),
                "the turn was stopped: its events could not be stored",
            ));
            turn.cancel.cancel();
            self.kill_processes();
        }
    }

    /// `held` as events numbered from `first`, their params carrying session and seq.
    fn stamped(&self, first: i64, held: &[(String, Value)]) -> Vec<NewEvent> {
        held.iter()
            .zip(first..)
            .map(|((method, params), seq)| {
                let params = stamp(&self.session_id, seq, params.clone());
                NewEvent::now(Arc::clone(&self.session_id), seq, method, &params)
            })
            .collect()
    }

    /// Emits `tools/changed` when the visible or deferred set differs from `before`.
    pub(super) async fn announce_tool_changes(&mut self, before: Arc<ToolCatalog>) {
        let after = self.registry.catalog();
        // The registry makes a new catalog only when something changed: the common case costs
        // a pointer comparison, not two lists of names.
        if Arc::ptr_eq(&before, &after) {
            return;
        }
        let (before, after) = (ToolNames::of(&before), ToolNames::of(&after));
        if after.active == before.active && after.deferred == before.deferred {
            return;
        }
        let activated = after
            .active
            .iter()
            .filter(|n| before.deferred.contains(n))
            .cloned()
            .collect();
        let evicted = after
            .deferred
            .iter()
            .filter(|n| before.active.contains(n))
            .cloned()
            .collect();
        self.emit(SessionEvent::ToolsChanged {
            active: after.active,
            deferred: after.deferred,
            evicted,
            activated,
        })
        .await;
    }

    pub(super) async fn on_tool_event(&mut self, event: ToolEvent) {
        match event {
            ToolEvent::Progress {
                tool_call_id,
                message,
                fraction,
            } => {
                self.emit(SessionEvent::ToolProgress {
                    tool_call_id,
                    message,
                    fraction,
                })
                .await;
            }
            ToolEvent::Output { tool_call_id, text } => {
                self.emit(SessionEvent::ToolOutputDelta { tool_call_id, text })
                    .await;
            }
            ToolEvent::PlanUpdated { explanation, plan } => {
                self.emit(SessionEvent::PlanUpdated { explanation, plan })
                    .await;
            }
            ToolEvent::UserInputRequested {
                request_id,
                questions,
                reply,
            } => {
                self.calls.questions.insert(request_id.clone(), reply);
                self.emit(SessionEvent::UserInputRequested {
                    request_id,
                    questions,
                })
                .await;
            }
            ToolEvent::SubAgent(request) => self.on_sub_agent_request(request).await,
        }
    }
}
