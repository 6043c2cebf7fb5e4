//! The session actor: owns one session's registry, event counter, watchers and running work,
//! and is the only writer of its event stream.

mod children;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{RwLock, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::{
    Command, InvokeResult, Outbound, SessionError, ToolNames, Watcher, notification_text, stamp,
};
use crate::agent::{
    ActorLink, AgentSettings, BudgetHolds, CostLabels, SpawnRequest, Turn, TurnRequest,
    append_history, budget_spent, cap_text, record_node_costs,
};
use crate::llm::ChatMessage;
use crate::metrics::Metrics;
use crate::store::{NewEvent, Store, TaskRow, timestamp_now};
use crate::tasks::supervisor::{TaskEnd, TaskReport, TaskSupervisor};
use crate::tools::args::arguments_for_event;
use crate::tools::builtin::exec::ProcessTable;
use crate::tools::{
    DispatchError, PreparedCall, ToolCatalog, ToolContext, ToolEvent, ToolRegistry, ToolResult,
    ToolState,
};

/// How long an event may wait for the next one to share its commit (see `SessionActor::linger`).
const LINGER: Duration = Duration::from_millis(1);
/// How much of a tool's output `tool/completed` carries.
const OUTPUT_PREVIEW_BYTES: usize = 2048;
/// Queue depth for commands sent to one actor.
pub(crate) const COMMAND_QUEUE: usize = 64;

/// A tool call that finished in the background, reported back to the actor.
struct Finished {
    tool_call_id: String,
    tool_name: String,
    outcome: Result<ToolResult, DispatchError>,
    duration: Duration,
    reply: oneshot::Sender<Result<InvokeResult, SessionError>>,
}

/// Everything an actor needs from the server when it starts.
pub(crate) struct ActorSetup {
    pub session_id: Arc<str>,
    pub store: Arc<dyn Store>,
    pub registry: ToolRegistry,
    pub last_seq: i64,
    pub idle_unload: Duration,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub metrics: Arc<Metrics>,
    pub llm_configured: bool,
    pub agent: Option<Arc<AgentSettings>>,
    pub tasks_dir: std::path::PathBuf,
}

/// The turn a session is running.
struct RunningTurn {
    turn_id: String,
    cancel: CancellationToken,
    /// `turn/interrupt` callers, answered once the turn has ended and said so.
    interrupters: Vec<oneshot::Sender<bool>>,
}

/// One session's state, owned by one task.
pub(crate) struct SessionActor {
    session_id: Arc<str>,
    store: Arc<dyn Store>,
    registry: ToolRegistry,
    last_seq: i64,
    /// Events accepted but not yet committed (see `linger`), in order, and when they must be.
    lingering: Vec<(&'static str, Value)>,
    linger_until: Option<Instant>,
    watchers: Vec<Watcher>,
    idle_unload: Duration,
    cancel: CancellationToken,
    tracker: TaskTracker,
    metrics: Arc<Metrics>,
    llm_configured: bool,
    agent: Option<Arc<AgentSettings>>,
    turn: Option<RunningTurn>,
    holds: BudgetHolds,
    tasks: TaskSupervisor,
    reports: LazyChannel<TaskReport>,
    /// Results of background tasks that ended during a turn, added to the history after it.
    pending_notes: Vec<ChatMessage>,
    turns: LazyChannel<TurnRequest>,
    /// Tool calls started and not yet reported back.
    running: usize,
    /// Safe calls share it, Exclusive calls hold it alone, so client invocations obey the
    /// same concurrency rules as a model's batch.
    exclusivity: Arc<RwLock<()>>,
    /// Questions asked by `request_user_input`, by request id.
    pending_input: HashMap<String, oneshot::Sender<Value>>,
    /// Boxed: a channel allocates a block of slots up front, and an idle session should not
    /// pay for room for results it is not waiting for.
    finished: LazyChannel<Box<Finished>>,
    events: LazyChannel<ToolEvent>,
    /// Open sub-agents by agent id.
    children: HashMap<String, children::ChildAgent>,
    /// Ids of closed sub-agents, so a call naming one can say it was closed.
    closed_children: std::collections::HashSet<String>,
}

impl SessionActor {
    pub(crate) fn new(setup: ActorSetup) -> Self {
        Self {
            tasks: TaskSupervisor::new(setup.tasks_dir),
            reports: LazyChannel::default(),
            pending_notes: Vec::new(),
            session_id: setup.session_id,
            store: setup.store,
            registry: setup.registry,
            last_seq: setup.last_seq,
            lingering: Vec::new(),
            linger_until: None,
            watchers: Vec::new(),
            idle_unload: setup.idle_unload,
            cancel: setup.cancel,
            tracker: setup.tracker,
            metrics: setup.metrics,
            llm_configured: setup.llm_configured,
            agent: setup.agent,
            turn: None,
            holds: BudgetHolds::default(),
            turns: LazyChannel::default(),
            running: 0,
            exclusivity: Arc::new(RwLock::new(())),
            pending_input: HashMap::new(),
            finished: LazyChannel::default(),
            events: LazyChannel::default(),
            children: HashMap::new(),
            closed_children: std::collections::HashSet::new(),
        }
    }

    /// Serves commands until closed, cancelled, or idle for `idle_unload` with nothing to do.
    pub(crate) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let span = tracing::info_span!("session", session_id = %self.session_id);
        async move {
            tracing::debug!("actor started");
            loop {
                // Questions whose tool gave up (timeout, interruption) no longer wait.
                self.pending_input.retain(|_, waiting| !waiting.is_closed());
                self.events.release_if_unused();
                self.finished.release_if_unused();
                self.reports.release_if_unused();
                self.turns.release_if_unused();
                let idle = self.watchers.is_empty()
                    && self.running == 0
                    && self.turn.is_none()
                    && self.tasks.is_empty()
                    && !self.children_running()
                    && self.pending_input.is_empty();
                let idle_timer = tokio::time::sleep(self.idle_unload);
                let linger_until = self.linger_until;
                tokio::select! {
                    () = self.cancel.cancelled() => break,
                    // Each arm's work is boxed: the loop's own future then holds one pointer
                    // while a message is handled, not room for the largest handler's state,
                    // and an idle session costs that much less.
                    () = sleep_until_some(linger_until), if linger_until.is_some() => {
                        Box::pin(self.commit_lingering()).await;
                    }
                    command = commands.recv() => match command {
                        Some(Command::Close) | None => break,
                        Some(command) => Box::pin(self.handle(command)).await,
                    },
                    Some(finished) = self.finished.recv() => Box::pin(self.finish_tool(finished)).await,
                    Some(event) = self.events.recv() => Box::pin(self.on_tool_event(event)).await,
                    Some(request) = self.turns.recv() => Box::pin(self.on_turn_request(request)).await,
                    Some(report) = self.reports.recv() => Box::pin(self.on_task_report(report)).await,
                    () = idle_timer, if idle => {
                        tracing::debug!("idle; unloading");
                        break;
                    }
                }
            }
            Box::pin(self.commit_lingering()).await;
            if let Some(turn) = &self.turn {
                turn.cancel.cancel();
            }
            // In-flight tool/invoke calls hold child tokens of this one.
            self.cancel.cancel();
            Box::pin(self.close_children("the session stopped")).await;
            Box::pin(self.cancel_tasks_on_stop()).await;
            self.kill_processes();
            tracing::debug!("actor stopped");
        }
        .instrument(span)
        .await
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Attach { watcher, reply } => {
                self.watchers.push(watcher);
                let _ = reply.send((self.last_seq, self.registry.catalog()));
            }
            Command::Detach { connection_id } => {
                self.watchers.retain(|w| w.connection_id != connection_id);
            }
            Command::InvokeTool {
                name,
                arguments,
                reply,
            } => self.invoke_tool(name, arguments, reply).await,
            Command::ToolList { reply } => {
                let _ = reply.send(tool_list(&self.registry));
            }
            Command::StartTurn {
                input,
                turn_id,
                reply,
            } => {
                let outcome = self.start_turn(input, turn_id).await;
                let _ = reply.send(outcome);
            }
            Command::Interrupt { reply } => match &mut self.turn {
                Some(turn) => {
                    turn.cancel.cancel();
                    turn.interrupters.push(reply);
                    self.kill_processes();
                    self.stop_running_children();
                }
                None => {
                    let _ = reply.send(false);
                }
            },
            Command::RespondUserInput {
                request_id,
                answers,
                reply,
            } => {
                let outcome = match self.pending_input.remove(&request_id) {
                    Some(waiting) => waiting
                        .send(answers)
                        .map_err(|_| SessionError::UnknownRequest(request_id)),
                    None => Err(SessionError::UnknownRequest(request_id)),
                };
                let _ = reply.send(outcome);
            }
            Command::CancelTask { task_id, reply } => {
                if self.children.contains_key(&task_id) {
                    self.cancel_child_run(&task_id, reply);
                } else {
                    self.tasks.cancel(&task_id, reply);
                }
            }
            Command::Close => {}
        }
    }

    /// The context a tool call of this session runs with.
    fn tool_context(&mut self, tool_call_id: &str, cancel: CancellationToken) -> ToolContext {
        ToolContext {
            session_id: self.session_id.to_string(),
            tool_call_id: tool_call_id.to_string(),
            cwd: self
                .registry
                .workspace()
                .map(|w| w.root().to_path_buf())
                .unwrap_or_default(),
            cancel,
            events: Some(self.events.sender()),
            catalog: Some(self.registry.catalog_cell()),
            budget_left_usd: None,
        }
    }

    /// Starts a spawn_only call as a background task and answers with its envelope: the JSON
    /// task_handle when the model can read it with `read_task_output`, else a plain sentence.
    async fn spawn_task(
        &mut self,
        call: PreparedCall,
        arguments: Value,
        tool_call_id: String,
        turn_id: Option<String>,
    ) -> ToolResult {
        let task_id = uuid::Uuid::new_v4().to_string();
        let tool_name = call.name().to_string();
        // A task outlives the turn that started it, but not the session.
        let cancel = self.cancel.child_token();
        let mut ctx = self.tool_context(&tool_call_id, cancel);
        if call.tool().uses_models() {
            ctx.budget_left_usd = self.hold_budget(&task_id).await;
        }
        let session_events = self.events.sender();
        let reports = self.reports.sender();
        let started = self
            .tasks
            .start(
                &task_id,
                call,
                arguments,
                ctx,
                turn_id,
                session_events,
                reports,
                &self.tracker,
            )
            .await;
        let path = match started {
            Ok(path) => path,
            Err(err) => {
                tracing::error!(%err, "background task could not start");
                return ToolResult::failure(format!(
                    "{tool_name} could not start in the background: {err}"
                ));
            }
        };
        let row = TaskRow::running(&task_id, &self.session_id, &tool_call_id, &tool_name, &path);
        if let Err(err) = self.store.upsert_task(&row).await {
            // A task nobody can look up must not run: stop it and say so.
            tracing::error!(%err, "task not recorded");
            self.tasks.cancel_unrecorded(&task_id);
            self.holds.release(&task_id);
            return ToolResult::failure(format!(
                "{tool_name} could not start in the background: the task could not be recorded"
            ));
        }
        self.metrics.record_task_state("running");
        self.emit(
            "task/updated",
            json!({"task_id": task_id, "tool_call_id": tool_call_id, "tool_name": tool_name, "state": "running"}),
        )
        .await;
        let readable = self
            .registry
            .catalog()
            .get("read_task_output")
            .is_some_and(|e| e.state == ToolState::Active);
        let output_url = format!("/api/tasks/{task_id}/output");
        let envelope = if readable {
            json!({
                "ok": true,
                "task_handle": task_id,
                "summary": format!("{tool_name} is running in the background"),
                "read_with": "read_task_output",
                "read_modes": ["head", "tail", "grep", "line_range", "bytes"],
                "output_url": output_url,
            })
            .to_string()
        } else {
            format!(
                "{tool_name} is running in the background as task {task_id}; its output is at {output_url}."
            )
        };
        ToolResult::ok(envelope).with_metadata(json!({"task_id": task_id}))
    }

    /// The session is stopping (shutdown, deletion): every running task is cancelled and
    /// recorded so, rather than left `running` for the next start to mark failed.
    async fn cancel_tasks_on_stop(&mut self) {
        self.tasks.cancel_all();
        for (task_id, task) in self.tasks.drain() {
            self.holds.release(&task_id);
            self.store_task_state(
                &task_id,
                "cancelled",
                Some("the session stopped"),
                None,
                None,
            )
            .await;
            self.metrics.record_task_state("cancelled");
            self.emit(
                "task/updated",
                json!({"task_id": task_id, "tool_call_id": task.tool_call_id,
                       "tool_name": task.tool_name, "state": "cancelled",
                       "reason": "the session stopped"}),
            )
            .await;
            for waiter in task.cancel_waiters {
                let _ = waiter.send(Some("cancelled".into()));
            }
        }
    }

    /// What the session may still spend on model calls, when it has a budget.
    async fn budget_left(&self) -> Option<f64> {
        let cap = self.agent.as_ref()?.budget_usd?;
        let spent = budget_spent(&self.store, &self.session_id, &self.holds).await;
        // An unreadable ledger leaves nothing to spend.
        Some(spent.map_or(0.0, |spent| (cap - spent).max(0.0)))
    }

    /// The remaining budget for one piece of work, held for it until it ends.
    async fn hold_budget(&self, id: &str) -> Option<f64> {
        let _ledger = self.holds.ledger().await;
        let left = self.budget_left().await?;
        self.holds.hold(id, left);
        Some(left)
    }

    async fn on_task_report(&mut self, report: TaskReport) {
        match report {
            TaskReport::Output {
                task_id,
                offset,
                text,
            } => {
                self.emit(
                    "task/output/delta",
                    json!({"task_id": task_id, "offset": offset, "text": text}),
                )
                .await;
            }
            TaskReport::ChildEnded(end) => self.on_child_run_end(*end).await,
            TaskReport::Finished(end) => {
                let TaskEnd {
                    task_id,
                    outcome,
                    total_bytes,
                } = *end;
                self.finish_task(task_id, outcome, total_bytes).await;
            }
        }
    }

    async fn finish_task(
        &mut self,
        task_id: String,
        outcome: Result<ToolResult, DispatchError>,
        total_bytes: u64,
    ) {
        let Some(task) = self.tasks.finish(&task_id) else {
            return;
        };
        let cancelled = task.cancel.is_cancelled();
        let result = match outcome {
            Ok(result) => result,
            Err(err) => err.to_tool_result(),
        };
        let state = if cancelled {
            "cancelled"
        } else if result.success {
            "completed"
        } else {
            "failed"
        };
        let exit_code = result
            .structured_metadata
            .as_ref()
            .and_then(|m| m.get("exit_code"))
            .and_then(Value::as_i64)
            .map(|c| c as i32);
        let reason = match state {
            "cancelled" => Some("cancelled on request".to_string()),
            "failed" => Some(first_line(&result.output)),
            _ => None,
        };
        self.store_task_state(
            &task_id,
            state,
            reason.as_deref(),
            exit_code,
            Some(total_bytes),
        )
        .await;
        self.metrics.record_task_state(state);
        let mut updated = json!({
            "task_id": task_id,
            "tool_call_id": task.tool_call_id,
            "tool_name": task.tool_name,
            "state": state,
        });
        if let Some(code) = exit_code {
            updated["exit_code"] = json!(code);
        }
        if let Some(reason) = &reason {
            updated["reason"] = json!(reason);
        }
        self.emit("task/updated", updated).await;
        let ledger = self.holds.ledger().await;
        let node_costs = record_node_costs(
            &self.store,
            &self.metrics,
            &self.session_id,
            &result,
            task.turn_id.as_deref(),
            Some(&task_id),
        )
        .await;
        self.holds.release(&task_id);
        drop(ledger);
        let content = cap_text(&result.output, SPAWN_CONTENT_BYTES);
        let mut complete = json!({
            "task_id": task_id,
            "tool_call_id": task.tool_call_id,
            "tool_name": task.tool_name,
            "success": state == "completed",
            "content": content,
        });
        if let Some(node_costs) = node_costs {
            complete["node_costs"] = node_costs;
        }
        self.emit("turn/spawn_complete", complete).await;
        // Whoever cancelled hears back only after the notifications the cancel caused.
        for waiter in task.cancel_waiters {
            let _ = waiter.send(Some(state.to_string()));
        }
        let note = ChatMessage::User {
            content: format!(
                "[background task {task_id} ({}) {state}]\n{content}",
                task.tool_name
            ),
        };
        if self.turn.is_some() {
            self.pending_notes.push(note);
        } else {
            self.remember(&note).await;
        }
    }

    /// Records a task's new state: its reason and exit code, the size of its output (`total`,
    /// else its output file's length) and `finished_at`, unless it runs (again).
    async fn store_task_state(
        &self,
        task_id: &str,
        state: &str,
        reason: Option<&str>,
        exit_code: Option<i32>,
        total: Option<u64>,
    ) {
        match self.store.get_task(task_id).await {
            Ok(Some(mut row)) => {
                row.state = state.into();
                row.reason = reason.map(str::to_string);
                row.exit_code = exit_code;
                // A running writer may hold its spool; the file's length is the truth.
                row.total_bytes = match total {
                    Some(total) => total as i64,
                    None => std::fs::metadata(&row.output_path)
                        .map_or(row.total_bytes, |meta| meta.len() as i64),
                };
                row.finished_at = (state != "running").then(timestamp_now);
                if let Err(err) = self.store.upsert_task(&row).await {
                    tracing::error!(%err, task_id, "task state not recorded");
                }
            }
            Ok(None) => {}
            Err(err) => tracing::error!(%err, task_id, "task unreadable"),
        }
    }

    async fn remember(&self, message: &ChatMessage) {
        // The store logged why; a note that is lost costs the model one line of context.
        let _ = append_history(&self.store, &self.session_id, message).await;
    }

    /// Starts a turn in its own task; `turn/started` is emitted before the caller hears back.
    async fn start_turn(
        &mut self,
        input: String,
        turn_id: Option<String>,
    ) -> Result<String, SessionError> {
        let Some(settings) = self.agent.clone() else {
            return Err(if self.llm_configured {
                SessionError::NotYetAvailable("the model could not be set up; see the server log")
            } else {
                SessionError::LlmNotConfigured
            });
        };
        if self.turn.is_some() {
            return Err(SessionError::TurnInProgress);
        }
        let turn_id = turn_id.unwrap_or_else(|| format!("turn_{}", uuid::Uuid::new_v4().simple()));
        let cancel = self.cancel.child_token();
        self.turn = Some(RunningTurn {
            turn_id: turn_id.clone(),
            cancel: cancel.clone(),
            interrupters: Vec::new(),
        });
        self.emit("turn/started", json!({ "turn_id": turn_id }))
            .await;
        let turn = Turn {
            turn_id: turn_id.clone(),
            session_id: Arc::clone(&self.session_id),
            input: Some(input),
            settings,
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            host: Arc::new(ActorLink {
                actor: self.turns.sender(),
                store: Arc::clone(&self.store),
                session_id: Arc::clone(&self.session_id),
            }),
            labels: CostLabels {
                node_id: "agent".into(),
                turn_id: Some(turn_id.clone()),
                task_id: None,
            },
            catalog: self.registry.catalog_cell(),
            cwd: self
                .registry
                .workspace()
                .map(|w| w.root().to_path_buf())
                .unwrap_or_default(),
            cancel,
            exclusivity: Arc::clone(&self.exclusivity),
            node_costs: tokio::sync::Mutex::new(Vec::new()),
            holds: self.holds.clone(),
        };
        let span = tracing::info_span!("turn", turn_id = %turn_id);
        self.tracker.spawn(turn.run().instrument(span));
        Ok(turn_id)
    }

    async fn on_turn_request(&mut self, request: TurnRequest) {
        match request {
            TurnRequest::Emit { method, params } => self.linger(method, params),
            TurnRequest::BeginIteration { reply } => {
                let before = self.registry.catalog();
                self.registry.tick();
                let evicted = self.registry.auto_evict();
                self.metrics.evictions.inc_by(evicted.len() as u64);
                self.announce_tool_changes(before).await;
                let _ = reply.send(self.registry.specs());
            }
            TurnRequest::Prepare {
                name,
                arguments,
                reply,
            } => {
                let before = self.registry.catalog();
                let prepared = self.registry.prepare(&name, &arguments);
                self.announce_tool_changes(before).await;
                let _ = reply.send(prepared);
            }
            TurnRequest::ToolEvent(event) => self.on_tool_event(event).await,
            TurnRequest::SpawnTask(spawn) => {
                let SpawnRequest {
                    call,
                    arguments,
                    tool_call_id,
                    turn_id,
                    reply,
                } = *spawn;
                let started = Instant::now();
                let tool_name = call.name().to_string();
                let result = self
                    .spawn_task(call, arguments, tool_call_id.clone(), Some(turn_id.clone()))
                    .await;
                // Emitted here, before any report of the task can be handled, so the call's
                // completion always precedes the task's own events.
                let mut params =
                    completed_params(&tool_call_id, &tool_name, &result, started.elapsed());
                params["turn_id"] = Value::String(turn_id);
                self.emit("tool/completed", params).await;
                let _ = reply.send(result);
            }
            TurnRequest::Finished { turn_id } => {
                // Whoever is told the turn ended must be able to see how.
                self.commit_lingering().await;
                if self.turn.as_ref().is_some_and(|t| t.turn_id == turn_id)
                    && let Some(turn) = self.turn.take()
                {
                    // Interrupted or out of time: the children stop with it.
                    if turn.cancel.is_cancelled() {
                        self.stop_running_children();
                    }
                    for interrupter in turn.interrupters {
                        let _ = interrupter.send(true);
                    }
                }
                for note in std::mem::take(&mut self.pending_notes) {
                    self.remember(&note).await;
                }
                // Activations a tool asked for during the turn show up now.
                let before = self.registry.catalog();
                self.registry.apply_activation_requests();
                self.announce_tool_changes(before).await;
            }
        }
    }

    /// Ends every `exec_command` process of the session, so interrupting a turn or closing
    /// the session leaves no orphans (`shell` commands end with their call's cancellation).
    fn kill_processes(&self) {
        if let Some(workspace) = self.registry.workspace() {
            workspace.shared::<ProcessTable>().kill_all();
        }
    }

    /// Persists one event, after any that linger, then hands them to every watcher.
    async fn emit(&mut self, method: &'static str, params: Value) {
        self.lingering.push((method, params));
        self.commit_lingering().await;
    }

    /// Accepts an event that may wait up to [`LINGER`] for the next one, so the two are
    /// committed together: a fast tool's `tool/started` goes with its `tool/completed`, a
    /// turn's events in a few batches. No one sees it before it is committed; every later
    /// event commits it first, so the order holds.
    fn linger(&mut self, method: &'static str, params: Value) {
        self.lingering.push((method, params));
        if self.linger_until.is_none() {
            self.linger_until = Some(Instant::now() + LINGER);
        }
    }

    /// Persists the lingering events with the next seqs in one append, then hands them to
    /// every watcher. A watcher whose queue is full is cut off (it resumes from the store); the
    /// actor never waits on a socket.
    async fn commit_lingering(&mut self) {
        self.linger_until = None;
        let held = std::mem::take(&mut self.lingering);
        if held.is_empty() {
            return;
        }
        let mut first = self.last_seq + 1;
        let mut events = self.stamped(first, &held);
        if let Err(err) = self.store.append_events(&events).await {
            // A write that committed but reported failure leaves the store ahead of us: catch
            // up once and retry, rather than refusing every later event.
            let retried = match (&err, self.store.get_session(&self.session_id).await) {
                (crate::store::StoreError::Conflict(_), Ok(Some(row))) => {
                    first = row.last_seq + 1;
                    events = self.stamped(first, &held);
                    self.store.append_events(&events).await
                }
                _ => Err(err),
            };
            if let Err(err) = retried {
                // Unpersisted events are not sent: a client must be able to replay what it saw.
                let methods: Vec<&str> = held.iter().map(|(method, _)| *method).collect();
                tracing::error!(%err, ?methods, seq = first, "events not persisted");
                return;
            }
        }
        for event in &events {
            self.last_seq = event.seq;
            self.metrics.events_written.inc();
            let frame = Outbound::Text(notification_text(&event.method, &event.params_json));
            self.watchers
                .retain(|watcher| match watcher.tx.try_send(frame.clone()) {
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

    /// `held` as events numbered from `first`, their params carrying session and seq.
    fn stamped(&self, first: i64, held: &[(&'static str, Value)]) -> Vec<NewEvent> {
        held.iter()
            .zip(first..)
            .map(|((method, params), seq)| {
                let params = stamp(&self.session_id, seq, params.clone());
                NewEvent::now(Arc::clone(&self.session_id), seq, method, &params)
            })
            .collect()
    }

    async fn invoke_tool(
        &mut self,
        name: String,
        arguments: Value,
        reply: oneshot::Sender<Result<InvokeResult, SessionError>>,
    ) {
        let before = self.registry.catalog();
        let prepared = self.registry.prepare(&name, &arguments);
        self.announce_tool_changes(before).await;
        let call = match prepared {
            Ok(call) => call,
            Err(err) => {
                self.metrics.record_refusal(&name, &err);
                let _ = reply.send(Err(err.into()));
                return;
            }
        };
        let tool_call_id = format!("call_{}", uuid::Uuid::new_v4().simple());
        // A fast tool's start is committed with its completion.
        self.linger(
            "tool/started",
            json!({"tool_call_id": tool_call_id, "tool_name": name,
                   "arguments": arguments_for_event(&arguments)}),
        );
        if call.spawn_only() {
            let started = Instant::now();
            let result = self
                .spawn_task(call, arguments, tool_call_id.clone(), None)
                .await;
            let params = completed_params(&tool_call_id, &name, &result, started.elapsed());
            self.emit("tool/completed", params).await;
            let _ = reply.send(Ok(InvokeResult {
                tool_call_id,
                success: result.success,
                output: result.output,
                structured_metadata: result.structured_metadata,
            }));
            return;
        }
        let mut ctx = self.tool_context(&tool_call_id, self.cancel.child_token());
        if call.tool().uses_models() {
            ctx.budget_left_usd = self.hold_budget(&tool_call_id).await;
        }
        let exclusivity = Arc::clone(&self.exclusivity);
        let finished = self.finished.sender();
        self.running += 1;
        self.tracker.spawn(async move {
            let started = Instant::now();
            let outcome = call.run_guarded(&ctx, &arguments, &exclusivity).await;
            let _ = finished
                .send(Box::new(Finished {
                    tool_call_id,
                    tool_name: name,
                    outcome,
                    duration: started.elapsed(),
                    reply,
                }))
                .await;
        });
    }

    async fn finish_tool(&mut self, finished: Box<Finished>) {
        // Whatever the tool reported while running is emitted before its completion.
        while let Some(event) = self.events.try_recv() {
            self.on_tool_event(event).await;
        }
        self.running = self.running.saturating_sub(1);
        let Finished {
            tool_call_id,
            tool_name,
            outcome,
            duration,
            reply,
        } = *finished;
        let result = match outcome {
            Ok(result) => result,
            Err(err) => {
                if let DispatchError::Fatal { message, .. } = &err {
                    tracing::error!(tool = %tool_name, %message, "tool failed fatally");
                }
                err.to_tool_result()
            }
        };
        self.metrics.record_tool_call(
            &tool_name,
            if result.success { "success" } else { "failure" },
        );
        let ledger = self.holds.ledger().await;
        record_node_costs(
            &self.store,
            &self.metrics,
            &self.session_id,
            &result,
            None,
            None,
        )
        .await;
        // Held until its rows are in the ledger, so the cap never sees a gap.
        self.holds.release(&tool_call_id);
        drop(ledger);
        let params = completed_params(&tool_call_id, &tool_name, &result, duration);
        self.emit("tool/completed", params).await;
        // Activations a tool asked for show up in the next listing.
        let before = self.registry.catalog();
        self.registry.apply_activation_requests();
        self.announce_tool_changes(before).await;
        let _ = reply.send(Ok(InvokeResult {
            tool_call_id,
            success: result.success,
            output: result.output,
            structured_metadata: result.structured_metadata,
        }));
    }

    /// Emits `tools/changed` when the visible or deferred set differs from `before`.
    async fn announce_tool_changes(&mut self, before: Arc<ToolCatalog>) {
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
        let activated: Vec<&String> = after
            .active
            .iter()
            .filter(|n| before.deferred.contains(n))
            .collect();
        let evicted: Vec<&String> = after
            .deferred
            .iter()
            .filter(|n| before.active.contains(n))
            .collect();
        let params = json!({
            "active": after.active,
            "deferred": after.deferred,
            "evicted": evicted,
            "activated": activated,
        });
        self.emit("tools/changed", params).await;
    }

    async fn on_tool_event(&mut self, event: ToolEvent) {
        match event {
            ToolEvent::Progress {
                tool_call_id,
                message,
                fraction,
            } => {
                self.emit(
                    "tool/progress",
                    json!({"tool_call_id": tool_call_id, "message": message, "fraction": fraction}),
                )
                .await;
            }
            ToolEvent::Output { tool_call_id, text } => {
                self.emit(
                    "tool/output/delta",
                    json!({"tool_call_id": tool_call_id, "text": text}),
                )
                .await;
            }
            ToolEvent::PlanUpdated { explanation, plan } => {
                let mut params = json!({ "plan": plan });
                if let Some(explanation) = explanation {
                    params["explanation"] = Value::String(explanation);
                }
                self.emit("plan/updated", params).await;
            }
            ToolEvent::UserInputRequested {
                request_id,
                questions,
                reply,
            } => {
                self.pending_input.insert(request_id.clone(), reply);
                self.emit(
                    "user_input/requested",
                    json!({"request_id": request_id, "questions": questions}),
                )
                .await;
            }
            ToolEvent::SubAgent(request) => self.on_sub_agent_request(request).await,
        }
    }
}

/// The params of `tool/completed` for one finished call.
pub fn completed_params(
    tool_call_id: &str,
    tool_name: &str,
    result: &ToolResult,
    duration: Duration,
) -> Value {
    let mut params = json!({
        "tool_call_id": tool_call_id,
        "tool_name": tool_name,
        "success": result.success,
        "output_preview": preview(&result.output),
        "duration_ms": duration.as_millis() as u64,
    });
    if let Some(metadata) = &result.structured_metadata {
        params["structured_metadata"] = metadata.clone();
    }
    if let Some(path) = &result.file_modified {
        params["file_modified"] = Value::String(path.to_string_lossy().into_owned());
    }
    if !result.files_to_send.is_empty() {
        params["files_to_send"] = result
            .files_to_send
            .iter()
            .map(|p| Value::String(p.to_string_lossy().into_owned()))
            .collect();
    }
    params
}

/// A channel created on first use: an idle session should not pay for the message blocks of
/// work it never does (a tokio channel allocates its first block up front).
struct LazyChannel<T> {
    tx: Option<mpsc::Sender<T>>,
    rx: Option<mpsc::Receiver<T>>,
}

impl<T> Default for LazyChannel<T> {
    fn default() -> Self {
        Self { tx: None, rx: None }
    }
}

impl<T> LazyChannel<T> {
    fn sender(&mut self) -> mpsc::Sender<T> {
        match &self.tx {
            Some(tx) => tx.clone(),
            None => {
                let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
                self.rx = Some(rx);
                self.tx.insert(tx).clone()
            }
        }
    }

    /// The next message; never resolves while the channel does not exist yet.
    async fn recv(&mut self) -> Option<T> {
        match &mut self.rx {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    fn try_recv(&mut self) -> Option<T> {
        self.rx.as_mut().and_then(|rx| rx.try_recv().ok())
    }

    /// Drops the channel once nobody else can send on it and nothing is queued, so a session
    /// that went quiet gives back its slots; the next `sender` makes a new one.
    fn release_if_unused(&mut self) {
        let unused = self.tx.as_ref().is_some_and(|tx| tx.strong_count() == 1)
            && self.rx.as_ref().is_some_and(mpsc::Receiver::is_empty);
        if unused {
            self.tx = None;
            self.rx = None;
        }
    }
}

/// How much of a background task's result `turn/spawn_complete` carries.
const SPAWN_CONTENT_BYTES: usize = 4096;

fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("failed");
    cap_text(line, 200)
}

/// The first bytes of a tool's output, cut at a character boundary.
fn preview(output: &str) -> String {
    cap_text(output, OUTPUT_PREVIEW_BYTES)
}

/// `tool/list`: active and deferred tools as `ToolInfo`, hidden ones with their reason.
pub(crate) fn tool_list(registry: &ToolRegistry) -> Value {
    let catalog = registry.catalog();
    let info = |state: ToolState| -> Vec<Value> {
        catalog
            .entries
            .iter()
            .filter(|e| e.state == state)
            .map(|e| {
                let mut info = json!({
                    "name": e.name(),
                    "description": e.description(),
                    "tags": e.tags(),
                    "concurrency": e.concurrency(),
                    "spawn_only": e.spawn_only,
                });
                if let Some(group) = e.group {
                    info["group"] = Value::String(group.to_string());
                }
                info
            })
            .collect()
    };
    let hidden: Vec<Value> = catalog
        .hidden()
        .map(|(e, reason)| json!({"name": e.name(), "reason": reason}))
        .collect();
    let lifecycle = registry.lifecycle();
    let last_used: serde_json::Map<String, Value> = lifecycle
        .last_used()
        .map(|(name, at)| (name.to_string(), Value::from(at)))
        .collect();
    json!({
        "active": info(ToolState::Active),
        "deferred": info(ToolState::Deferred),
        "hidden": hidden,
        "lru": {
            "iteration": lifecycle.iteration(),
            "max_active": lifecycle.max_active(),
            "idle_threshold": lifecycle.idle_threshold(),
            "last_used": last_used,
        },
    })
}

/// Sleeps until `deadline`; never ends without one (the caller guards the branch).
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
