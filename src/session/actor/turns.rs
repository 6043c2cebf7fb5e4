//! Turns as the actor sees them: starting one in its own task, and serving what it asks —
//! the LRU tick, call preparation, spawned tasks, the history and its end.

use std::sync::Arc;

use tracing::Instrument;

use super::link::{ActorLink, ActorRequest};
use super::{RunningTurn, SessionActor};
use crate::agent::compaction::{Compacted, Compaction, extend_view, model_view};
use crate::agent::context::repair;
use crate::agent::event::SessionEvent;
use crate::agent::ledger::CostLabels;
use crate::agent::turn::Turn;
use crate::agent::{HistoryError, TurnHost};
use crate::error_kind::ErrorKind;
use crate::llm::ChatMessage;
use crate::session::{ReplyTx, SessionError, SessionReply};
use crate::store::CostRow;
use tokio::sync::oneshot;

impl SessionActor {
    /// Starts a turn in its own task; `turn/started` is emitted before the caller hears back.
    pub(super) async fn start_turn(
        &mut self,
        start: crate::session::TurnStart,
    ) -> Result<String, SessionError> {
        let crate::session::TurnStart {
            input,
            images,
            turn_id,
            choice,
            traceparent,
        } = start;
        if self.write_health.is_failing() {
            return Err(SessionError::StorageUnavailable(
                "a turn's events could not be stored".into(),
            ));
        }
        let turn_id = turn_id.unwrap_or_else(|| format!("turn_{}", uuid::Uuid::new_v4().simple()));
        let (settings, cancel) = self.claim_turn_slot(&turn_id)?;
        let model = choice.model.as_deref().or(self.choice.model.as_deref());
        let effort = choice
            .reasoning_effort
            .as_deref()
            .or(self.choice.reasoning_effort.as_deref());
        let settings = if model.is_none() && effort.is_none() {
            settings
        } else {
            match settings.with_choice(model, effort) {
                Ok(chosen) => Arc::new(chosen),
                Err(unknown) => {
                    self.turn.running = None;
                    return Err(SessionError::InvalidParams(unknown.to_string()));
                }
            }
        };
        let images = match self.load_images(images, &settings) {
            Ok(images) => images,
            Err(refusal) => {
                self.turn.running = None;
                return Err(refusal);
            }
        };
        self.checkpoint(&turn_id).await;
        // The title is its own write: queued beside turn/started's commit, not after it.
        let title =
            (!std::mem::replace(&mut self.title_checked, true)).then(|| self.title_from(&input));
        let started = self.emit(SessionEvent::TurnStarted {
            turn_id: turn_id.clone(),
        });
        match title {
            Some(title) => {
                tokio::join!(started, title);
            }
            None => started.await,
        }
        let mut scope = self.call_scope(CostLabels {
            node_id: "agent".into(),
            turn_id: Some(turn_id.clone()),
            task_id: None,
        });
        scope.turn_id = Some(turn_id.clone());
        let turn = Turn {
            turn_id: turn_id.clone(),
            input: Some(ChatMessage::User {
                content: input,
                images,
            }),
            settings,
            metrics: Arc::clone(&self.metrics),
            host: Arc::new(ActorLink {
                actor: self.inbound.sender(),
                system: self.gather_instructions().prompt,
            }),
            scope,
            cancel,
            session_start: !std::mem::replace(&mut self.session_started, true),
        };
        let span = crate::telemetry::agent_span(&self.session_id, &turn_id, "agentd", None);
        crate::telemetry::adopt_parent(&span, traceparent.as_deref());
        if let Some(running) = &mut self.turn.running {
            running.span = span.clone();
        }
        self.tracker.spawn(turn.run().instrument(span));
        Ok(turn_id)
    }

    /// The images a turn starts with, workspace files read; refused when the turn's model
    /// takes no images or a file is missing, unsafe to follow, too large or not an image.
    fn load_images(
        &self,
        images: Vec<crate::session::ImageInput>,
        settings: &crate::agent::AgentSettings,
    ) -> Result<Vec<crate::llm::ImageData>, SessionError> {
        use crate::llm::ImageData;
        use crate::session::ImageInput;
        if images.is_empty() {
            return Ok(Vec::new());
        }
        if !settings.pricing.takes_images(&settings.model) {
            return Err(SessionError::InvalidParams(format!(
                "model {:?} takes no image input (model/list says which models do); send text \
                 only or choose another model",
                settings.model
            )));
        }
        images
            .into_iter()
            .map(|image| match image {
                ImageInput::Inline(data) => Ok(data),
                ImageInput::Path { path } => {
                    let workspace = self.registry.workspace().ok_or_else(|| {
                        SessionError::InvalidParams("the session has no workspace".into())
                    })?;
                    let bad = |problem: String| {
                        SessionError::InvalidParams(format!("image {path:?}: {problem}"))
                    };
                    let rel = workspace.resolve(&path).map_err(|e| bad(e.to_string()))?;
                    let bytes = workspace
                        .read(&rel, ImageData::MAX_BYTES as u64)
                        .map_err(|e| bad(e.to_string()))?;
                    ImageData::from_bytes(&bytes).map_err(|e| bad(e.to_string()))
                }
            })
            .collect()
    }

    /// Names an untitled session after the first line of its first message (a title a person
    /// set is kept: the store only fills an empty one). The write borrows nothing of the
    /// actor, so it can run beside the actor's own commits.
    fn title_from(&self, input: &str) -> impl Future<Output = ()> + use<> {
        let title = title_of(input);
        let store = Arc::clone(&self.store);
        let session_id = Arc::clone(&self.session_id);
        async move {
            let Some(title) = title else {
                return;
            };
            if let Err(err) = store.set_title_if_unset(&session_id, &title).await {
                tracing::warn!(%err, "could not title the session");
            }
        }
    }

    /// Takes the session's one turn slot for `turn_id` (a turn, or a compaction): refused
    /// without a model or while the slot is taken. Answers the model settings and the work's
    /// cancel token.
    fn claim_turn_slot(
        &mut self,
        turn_id: &str,
    ) -> Result<
        (
            Arc<crate::agent::AgentSettings>,
            tokio_util::sync::CancellationToken,
        ),
        SessionError,
    > {
        let Some(settings) = self.agent.clone() else {
            return Err(if self.llm_configured {
                SessionError::NotYetAvailable("the model could not be set up; see the server log")
            } else {
                SessionError::LlmNotConfigured
            });
        };
        if self.turn.running.is_some() {
            return Err(SessionError::TurnInProgress);
        }
        if self.draining.is_some() {
            // The node is handing its sessions over; the next owner takes the turn.
            return Err(SessionError::ActorGone);
        }
        let cancel = self.cancel.child_token();
        self.turn.running = Some(Box::new(RunningTurn {
            turn_id: turn_id.to_string(),
            cancel: cancel.clone(),
            span: tracing::Span::none(),
            interrupters: Vec::new(),
            steers: Vec::new(),
        }));
        Ok((settings, cancel))
    }

    /// Starts `session/compact`: the summary call runs in its own task and holds the turn
    /// slot, so no turn starts meanwhile and `turn/interrupt` stops it; `reply` hears the
    /// outcome after `session/compacted`.
    pub(super) async fn start_compaction(&mut self, reply: ReplyTx) {
        let turn_id = format!("compact_{}", uuid::Uuid::new_v4().simple());
        let (settings, cancel) = match self.claim_turn_slot(&turn_id) {
            Ok(claimed) => claimed,
            Err(err) => {
                let _ = reply.send(Err(err));
                return;
            }
        };
        let host = ActorLink {
            actor: self.inbound.sender(),
            system: self.gather_instructions().prompt,
        };
        let specs = self.registry.specs();
        let ledger = self.ledger.clone();
        let labels = CostLabels {
            node_id: "compaction".into(),
            turn_id: None,
            task_id: None,
        };
        let (outcome_tx, outcome_rx) = oneshot::channel();
        // The turn loop's side answers with the compaction's own outcome; the caller hears it
        // as the session's.
        self.tracker.spawn(async move {
            let outcome = match outcome_rx.await {
                Ok(outcome) => (outcome as crate::agent::compaction::CompactionOutcome)
                    .map(SessionReply::Compacted)
                    .map_err(SessionError::from),
                Err(_) => Err(SessionError::ActorGone),
            };
            let _ = reply.send(outcome);
        });
        let hooks = self.hooks.clone();
        let task = async move {
            if let Some(hooks) = hooks
                && hooks.any(crate::agent::hooks::HookEvent::PreCompact, None)
            {
                let outcome = hooks
                    .run(
                        crate::agent::hooks::HookEvent::PreCompact,
                        None,
                        serde_json::json!({"trigger": "manual"}),
                        &cancel,
                    )
                    .await;
                crate::agent::call::report_hooks(&host, outcome.ran, None).await;
            }
            let outcome = async {
                let view = host.history().await?;
                let compaction = Compaction {
                    settings: &settings,
                    ledger: &ledger,
                    labels: &labels,
                    hold: format!("{turn_id}#compaction"),
                    cancel,
                };
                let compacted = compaction.run(host.system_prompt(), &view, &specs).await?;
                let stats = compacted.stats;
                host.compacted(None, compacted).await?;
                Ok(stats)
            }
            .await;
            let _ = host
                .actor
                .send(ActorRequest::CompactionDone(Box::new((
                    turn_id, outcome, outcome_tx,
                ))))
                .await;
        };
        self.tracker
            .spawn(task.instrument(tracing::info_span!("compaction")));
    }

    /// A turn's event, in order with what it asked; a turn cut because the store refused its
    /// events ends `storage_unavailable`, not `interrupted`.
    pub(super) fn on_turn_event(&mut self, event: SessionEvent) {
        let event = match event {
            SessionEvent::TurnError { turn_id, .. }
                if self
                    .turn
                    .storage_cut
                    .as_ref()
                    .is_some_and(|(cut, _)| *cut == turn_id) =>
            {
                let (_, message) = self.turn.storage_cut.take().unwrap_or_default();
                SessionEvent::TurnError {
                    turn_id,
                    code: ErrorKind::StorageUnavailable,
                    message: message.into(),
                }
            }
            other => other,
        };
        self.linger(event);
    }

    /// Ticks the LRU before a model request (evicting at a turn's first) and answers the specs.
    pub(super) async fn on_begin_iteration(
        &mut self,
        turn_start: bool,
        reply: oneshot::Sender<Arc<[crate::llm::ToolSpec]>>,
    ) {
        let before = self.registry.catalog();
        let (specs, evicted) = self.registry.next_request(turn_start);
        self.metrics.evictions.inc_by(evicted.len() as u64);
        self.announce_tool_changes(before).await;
        let _ = reply.send(specs);
    }

    /// Readies one call of a turn or a client (activating a deferred tool on the way).
    pub(super) async fn on_prepare(
        &mut self,
        name: String,
        arguments: serde_json::Value,
        reply: oneshot::Sender<Result<crate::tools::PreparedCall, crate::tools::DispatchError>>,
    ) {
        let before = self.registry.catalog();
        let prepared = self.registry.prepare(&name, &arguments);
        self.announce_tool_changes(before).await;
        let _ = reply.send(prepared);
    }

    /// The turn asks for the history before each model request: steering joins it here.
    pub(super) async fn on_history_asked(
        &mut self,
        reply: oneshot::Sender<Result<Vec<ChatMessage>, HistoryError>>,
    ) {
        let steers = self
            .turn
            .running
            .as_mut()
            .map(|turn| std::mem::take(&mut turn.steers))
            .unwrap_or_default();
        for content in steers {
            if let Err(err) = self.remember(&ChatMessage::user(content)).await {
                let _ = reply.send(Err(err));
                return;
            }
        }
        let _ = reply.send(self.history().await);
    }

    /// Adds one message of the turn's to the history.
    pub(super) async fn on_remember(
        &mut self,
        message: &ChatMessage,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    ) {
        let _ = reply.send(self.remember(message).await);
    }

    /// Adds the model's answer to the history with its call's cost row, in one commit.
    pub(super) async fn on_remember_answer(
        &mut self,
        message: &ChatMessage,
        cost: CostRow,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    ) {
        let _ = reply.send(self.append_history(message, Some(cost)).await);
    }

    /// Records a compaction and answers how it went.
    pub(super) async fn on_compacted(
        &mut self,
        turn_id: Option<String>,
        compacted: Compacted,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    ) {
        let outcome = self.record_compaction(turn_id, compacted).await;
        let _ = reply.send(outcome);
    }

    /// A `session/compact` ended: its turn slot is free, then its caller hears.
    pub(super) fn on_compaction_done(
        &mut self,
        turn_id: String,
        outcome: crate::agent::compaction::CompactionOutcome,
        reply: oneshot::Sender<crate::agent::compaction::CompactionOutcome>,
    ) {
        if self
            .turn
            .running
            .as_ref()
            .is_some_and(|t| t.turn_id == turn_id)
            && let Some(turn) = self.turn.running.take()
        {
            for interrupter in turn.interrupters {
                let _ = interrupter.send(Ok(SessionReply::Interrupted(true)));
            }
        }
        self.turn.history = None;
        self.answer_drain();
        let _ = reply.send(outcome);
    }

    /// The turn is over: what it left (steers, notes of tasks, activations) is taken in.
    pub(super) async fn on_turn_finished(&mut self, turn_id: String) {
        // Whoever is told the turn ended must be able to see how.
        self.commit_lingering().await;
        if self
            .turn
            .running
            .as_ref()
            .is_some_and(|t| t.turn_id == turn_id)
            && let Some(turn) = self.turn.running.take()
        {
            // Interrupted or out of time: the children stop with it.
            if turn.cancel.is_cancelled() {
                self.stop_running_children();
            }
            for interrupter in turn.interrupters {
                let _ = interrupter.send(Ok(SessionReply::Interrupted(true)));
            }
            // A steer that came after the model's last request is not lost: the next turn
            // reads it.
            for content in turn.steers {
                if let Err(err) = self.remember(&ChatMessage::user(content)).await {
                    tracing::warn!(%err, "steering input not kept");
                }
            }
        }
        for note in std::mem::take(&mut self.turn.notes) {
            self.remember_note(&note).await;
        }
        // Activations a tool asked for during the turn show up now.
        let before = self.registry.catalog();
        self.registry.apply_activation_requests();
        self.announce_tool_changes(before).await;
        self.turn.history = None;
        self.answer_drain();
    }

    /// The conversation so far, repaired for a model; the error is said to the client.
    async fn history(&mut self) -> Result<Vec<ChatMessage>, HistoryError> {
        if let Some(view) = &self.turn.history {
            return Ok(repair(view.clone()));
        }
        match self.store.messages(&self.session_id).await {
            Ok(stored) => {
                let view = model_view(stored);
                let repaired = repair(view.clone());
                self.turn.history = Some(view);
                Ok(repaired)
            }
            Err(err) => {
                tracing::error!(%err, "history unreadable");
                Err(HistoryError::Unreadable(err))
            }
        }
    }

    /// Stores a compaction's marker after the history so far and announces it.
    async fn record_compaction(
        &mut self,
        turn_id: Option<String>,
        compacted: Compacted,
    ) -> Result<(), HistoryError> {
        self.append_history(&compacted.marker, None).await?;
        self.emit(SessionEvent::SessionCompacted {
            turn_id,
            stats: compacted.stats,
        })
        .await;
        Ok(())
    }

    /// Appends one message to the stored history; the error says what failed, for the
    /// client, and was logged.
    async fn remember(&mut self, message: &ChatMessage) -> Result<(), HistoryError> {
        self.append_history(message, None).await
    }

    /// Appends one history entry (a message, or a compaction's marker), with the cost row of
    /// the model call that produced it if any; the error says what failed, for the client,
    /// and was logged.
    async fn append_history(
        &mut self,
        entry: &impl serde::Serialize,
        cost: Option<CostRow>,
    ) -> Result<(), HistoryError> {
        let value = serde_json::to_value(entry).map_err(|err| {
            tracing::error!(%err, "history entry does not serialise");
            HistoryError::Unserialisable(err)
        })?;
        // Kept for the turn's view only once stored; the commit takes its own copy.
        let kept = self.turn.history.is_some().then(|| value.clone());
        match self.commit_with_history(value, cost).await {
            Ok(()) => {
                if let (Some(view), Some(value)) = (&mut self.turn.history, kept) {
                    extend_view(view, value);
                }
                Ok(())
            }
            Err(err) => {
                tracing::error!(%err, "history not persisted");
                // The store may hold it after all: the next read asks the store.
                self.turn.history = None;
                Err(HistoryError::Unstored(err))
            }
        }
    }

    /// Adds a note to the history; the store logged why when it fails, and a lost note costs
    /// the model one line of context.
    pub(super) async fn remember_note(&mut self, message: &ChatMessage) {
        let _ = self.remember(message).await;
    }
}

/// Longest automatic title, in characters.
const TITLE_CHARS: usize = 80;

/// A title from a message: its first non-blank line, white space folded, cut at a word.
fn title_of(input: &str) -> Option<String> {
    let line = input.lines().map(str::trim).find(|line| !line.is_empty())?;
    let folded = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.chars().count() <= TITLE_CHARS {
        return Some(folded);
    }
    let cut: String = folded.chars().take(TITLE_CHARS - 1).collect();
    let cut = match cut.rfind(' ') {
        Some(at) if at > TITLE_CHARS / 2 => &cut[..at],
        _ => cut.as_str(),
    };
    Some(format!("{cut}…"))
}

#[cfg(test)]
mod title_tests {
    use super::title_of;

    #[test]
    fn a_title_is_the_first_line_folded_and_cut_at_a_word() {
        assert_eq!(
            title_of("\n  Fix   the build \nand more").as_deref(),
            Some("Fix the build")
        );
        assert_eq!(title_of(" \n\t"), None);
        let long = "word ".repeat(40);
        let title = title_of(&long).unwrap();
        assert!(title.ends_with("word…"), "{title}");
        assert!(title.chars().count() <= 80, "{title}");
    }
}
