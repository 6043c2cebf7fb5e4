//! The session actor: owns one session's registry, event counter, watchers and running work,
//! and is the only writer of its event stream and history.
//!
//! - [`events`](self::events): committing and streaming events, `tools/changed`, tool events.
//! - [`invoke`](self::invoke): a client's `tool/invoke`, through the one call path.
//! - [`link`](self::link): what a running turn or call asks of the actor, and the host that asks it.
//! - [`tasks`](self::tasks): background tasks, from start to `turn/spawn_complete`.
//! - [`turns`](self::turns): starting a turn and serving what it asks.
//! - [`children`](self::children): sub-agents.
//! - [`mcp`](self::mcp): the session's own MCP servers.

mod approvals;
pub(crate) mod children;
mod events;
mod invoke;
pub(crate) mod link;
mod mcp;
mod tasks;
mod turns;
mod undo;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use self::link::ActorRequest;
use super::{
    Command, InvokeOptions, ModelChoice, ReplyTx, RevertTo, SessionError, SessionMcp, SessionReply,
    SessionRequest, TurnStart,
};
use crate::agent::call::CallScope;
use crate::agent::ledger::{CostLabels, Ledger};
use crate::agent::{AgentSettings, SessionEvent};
use crate::llm::ChatMessage;
use crate::llm::pricing::Pricing;
use crate::mcp::{McpServer, McpServerConfig};
use crate::metrics::Metrics;
use crate::store::{Store, Writer};
use crate::tasks::supervisor::{TaskReport, TaskSupervisor};
use crate::tools::{ToolEvent, ToolRegistry, ToolState};

/// How long an event may wait for the next one to share its commit (see `SessionActor::linger`).
const LINGER: Duration = Duration::from_millis(1);
/// How soon events the store refused are tried again.
const UNSTORED_RETRY: Duration = Duration::from_millis(250);
/// Queue depth of an actor's own channels: task reports, tool events, requests of its turns.
const ACTOR_QUEUE: usize = 64;

/// Everything an actor needs from the server when it starts.
pub(crate) struct ActorSetup {
    /// Where checkpoints are kept; `None`: no `turn/diff` nor `session/revert`.
    pub checkpoints: Option<Arc<crate::checkpoint::CheckpointStore>>,
    /// `[[agents]]`, for `spawn_agent {agent_type}`.
    pub profiles: crate::session::profiles::Profiles,
    pub session_id: Arc<str>,
    pub store: Arc<dyn Store>,
    /// Whether the session was created just now: it has no history nor cost row yet.
    pub created: bool,
    /// Where the session's work is written: the group commit, or the lease's fence.
    pub writer: Arc<dyn Writer>,
    pub registry: ToolRegistry,
    pub last_seq: i64,
    pub idle_unload: Duration,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub metrics: Arc<Metrics>,
    pub llm_configured: bool,
    pub agent: Option<Arc<AgentSettings>>,
    pub tasks_dir: std::path::PathBuf,
    /// The `scope = "session"` MCP servers this session starts for itself.
    pub mcp_servers: Vec<McpServerConfig>,
    /// Where their states are told to the session's handles.
    pub mcp_states: Arc<SessionMcp>,
    /// The `scope = "server"` MCP servers, whose tools came with the base registry; the
    /// session follows their tool lists.
    pub shared_mcp: Vec<Arc<McpServer>>,
    /// The session's approval rules and grants.
    pub approvals: Arc<crate::agent::approval::Approvals>,
    /// Tools that exist but answer `unsupported` with this configuration.
    pub unsupported: Arc<[String]>,
    /// Whether the store takes writes, shared by every session of the server.
    pub write_health: Arc<crate::store::WriteHealth>,
    /// The model the session chose, as stored.
    pub choice: crate::session::ModelChoice,
    /// The operator's instructions and the `AGENTS.md` budget.
    pub instructions: crate::session::instructions::OperatorInstructions,
    /// `[[hooks]]`.
    pub hooks: Arc<[crate::agent::hooks::HookConfig]>,
    /// The user's workspace root, relative to the anchor of the session's root: where the
    /// walk for `AGENTS.md` and skills starts.
    pub user_root: std::path::PathBuf,
}

/// The turn a session is running.
struct RunningTurn {
    turn_id: String,
    cancel: CancellationToken,
    /// The span it runs in, the parent of its sub-agents' spans.
    span: tracing::Span,
    /// `turn/interrupt` callers, answered once the turn has ended and said so.
    interrupters: Vec<ReplyTx>,
    /// `turn/steer` input not yet read by the model: it joins the history before the turn's
    /// next model request, after the tool batch in flight.
    steers: Vec<String>,
}

/// A session's turn: the one running, and what waits for its end.
#[derive(Default)]
struct TurnPart {
    /// Boxed: an idle session keeps a pointer, not room for a turn.
    running: Option<Box<RunningTurn>>,
    /// Results of background tasks that ended during a turn, added to the history after it.
    notes: Vec<ChatMessage>,
    /// The turn stopped because the store refused its events, and why; it ends
    /// `storage_unavailable`, not `interrupted`. (A turn whose history fails says so itself.)
    storage_cut: Option<(String, &'static str)>,
    /// The history as the model sees it (compactions applied, not yet repaired), read once
    /// when a turn or a compaction first asks for it and kept up to date by every append
    /// after that, so a turn's model requests do not read the store back. Dropped when the
    /// work ends: an idle session holds no copy.
    history: Option<Vec<ChatMessage>>,
}

/// One session's state, owned by one task.
pub(crate) struct SessionActor {
    profiles: crate::session::profiles::Profiles,
    session_id: Arc<str>,
    store: Arc<dyn Store>,
    writer: Arc<dyn Writer>,
    registry: ToolRegistry,
    /// The session's events on their way to the store and the watchers.
    log: events::EventLog,
    idle_unload: Duration,
    cancel: CancellationToken,
    tracker: TaskTracker,
    metrics: Arc<Metrics>,
    llm_configured: bool,
    agent: Option<Arc<AgentSettings>>,
    /// The running turn and what waits for its end.
    turn: TurnPart,
    /// The session's budget and cost rows, shared with its turns, calls and children.
    ledger: Ledger,
    tasks: TaskSupervisor,
    reports: LazyChannel<TaskReport>,
    /// What turns, client calls and MCP servers tell the actor, in the order they told it.
    inbound: LazyChannel<ActorRequest>,
    /// What the session's tool calls wait on: client calls' answers, the concurrency lock,
    /// questions for the user.
    calls: invoke::CallPart,
    events: LazyChannel<ToolEvent>,
    /// The session's sub-agents, open and closed.
    children: children::Children,
    /// The session's MCP servers.
    mcp: mcp::McpPart,
    /// Calls waiting for a person, and the rules that decide which wait.
    approvals: approvals::ApprovalDesk,
    unsupported: Arc<[String]>,
    /// Set by a drain: no turn starts any more, and these hear when none runs.
    draining: Option<Vec<oneshot::Sender<()>>>,
    /// Whether this actor has given its session a title from a first message (or found one).
    title_checked: bool,
    write_health: Arc<crate::store::WriteHealth>,
    /// The model and reasoning effort the session chose; a turn may choose its own.
    choice: crate::session::ModelChoice,
    instructions: crate::session::instructions::OperatorInstructions,
    user_root: std::path::PathBuf,
    /// The session's hooks, run in its sandbox; `None` without `[[hooks]]`.
    hooks: Option<Arc<crate::agent::hooks::SessionHooks>>,
    /// Whether the `SessionStart` hooks have run for this load of the session.
    session_started: bool,
    /// Checkpoints, turn diffs and reverts.
    undo: undo::Undo,
}

impl SessionActor {
    pub(crate) fn new(setup: ActorSetup) -> Self {
        let created = setup.created;
        let (pricing, cap_usd) = match &setup.agent {
            Some(settings) => (settings.pricing.clone(), settings.budget_usd),
            None => (Pricing::default(), None),
        };
        let ledger = Ledger::new(
            Arc::clone(&setup.store),
            Arc::clone(&setup.writer),
            Arc::clone(&setup.session_id),
            Arc::clone(&setup.metrics),
            pricing,
            cap_usd,
        );
        // The tools' groups are gathered only for a session that has hooks to match them.
        let with_hooks = setup
            .registry
            .workspace()
            .filter(|_| !setup.hooks.is_empty());
        let hooks = with_hooks.and_then(|workspace| {
            crate::agent::hooks::SessionHooks::new(
                &setup.hooks,
                setup.registry.tool_groups(),
                Arc::clone(workspace),
                &setup.session_id,
            )
        });
        let mut actor = Self {
            tasks: TaskSupervisor::new(
                setup.tasks_dir,
                setup.registry.workspace().and_then(|w| w.disk().cloned()),
            ),
            reports: LazyChannel::default(),
            session_id: setup.session_id,
            store: setup.store,
            writer: setup.writer,
            registry: setup.registry,
            log: events::EventLog::starting_at(setup.last_seq),
            idle_unload: setup.idle_unload,
            profiles: setup.profiles,
            cancel: setup.cancel,
            tracker: setup.tracker,
            metrics: setup.metrics,
            llm_configured: setup.llm_configured,
            agent: setup.agent,
            turn: TurnPart::default(),
            ledger,
            inbound: LazyChannel::default(),
            calls: invoke::CallPart::default(),
            events: LazyChannel::default(),
            children: children::Children::default(),
            mcp: mcp::McpPart {
                pending: setup.mcp_servers,
                running: Vec::new(),
                states: setup.mcp_states,
                shared: setup.shared_mcp,
            },
            approvals: approvals::ApprovalDesk {
                rules: setup.approvals,
                waiting: HashMap::new(),
            },
            unsupported: setup.unsupported,
            draining: None,
            title_checked: false,
            write_health: setup.write_health,
            choice: setup.choice,
            instructions: setup.instructions,
            user_root: setup.user_root,
            hooks,
            session_started: false,
            undo: undo::Undo::new(setup.checkpoints),
        };
        // A session created just now has no history and no cost row to read back before its
        // first model call.
        if created {
            actor.ledger.knows_no_rows();
            actor.turn.history = Some(Vec::new());
        }
        actor
    }

    /// Runs the `SessionEnd` hooks as the actor stops, and tells what they did.
    async fn session_end_hooks(&mut self, reason: &str) {
        use crate::agent::hooks::HookEvent;
        let Some(hooks) = self.hooks.clone() else {
            return;
        };
        if !hooks.any(HookEvent::SessionEnd, None) {
            return;
        }
        // Nothing interrupts a session's end: its hooks have their own timeouts.
        let outcome = Box::pin(hooks.run(
            HookEvent::SessionEnd,
            None,
            json!({"reason": reason}),
            &tokio_util::sync::CancellationToken::new(),
        ))
        .await;
        for ran in outcome.ran {
            self.emit(SessionEvent::HookRan {
                hook: ran.hook,
                event: ran.event.as_str(),
                tool_call_id: None,
                decision: ran.decision,
                reason: ran.reason,
                duration_ms: ran.duration.as_millis() as u64,
            })
            .await;
        }
    }

    /// What the session's turns are told now: the operator's and the repository's
    /// instructions and the skills list, read again (the `skill` tool serves the list).
    pub(super) fn gather_instructions(&self) -> crate::session::instructions::Gathered {
        use crate::builtin::skill::SkillIndex;
        use crate::session::instructions::gather;
        let Some(workspace) = self.registry.workspace() else {
            return crate::session::instructions::Gathered {
                prompt: crate::agent::SYSTEM_PROMPT.into(),
                sources: Vec::new(),
                skills: Vec::new(),
            };
        };
        let root = workspace.root_path();
        let gathered = gather(
            crate::agent::SYSTEM_PROMPT,
            self.instructions.text.as_deref(),
            self.instructions.limits,
            root.anchor(),
            &self.user_root,
            root.below(),
        );
        workspace
            .shared::<SkillIndex>()
            .set(gathered.skills.clone());
        gathered
    }

    /// Serves commands until closed, cancelled, or idle for `idle_unload` with nothing to do.
    ///
    /// The actor comes boxed: an `async fn` keeps an argument taken by value twice in its
    /// future, as the argument and as the local it is moved into, and a loaded session holds
    /// this future for as long as it lives.
    pub(crate) async fn run(mut self: Box<Self>, mut commands: super::CommandRx) {
        // A span per piece of work, not one for the actor's life: a span's slot keeps its
        // fields' allocation after it closes, and 10,000 such slots made while sessions were
        // open are scattered through the heap, holding pages that would otherwise go back to
        // the system once the sessions unload.
        let session_id = Arc::clone(&self.session_id);
        let span = move || tracing::info_span!("session", session_id = %session_id);
        span().in_scope(|| {
            tracing::debug!("actor started");
            self.start_mcp_servers();
        });
        // Why the session ends, for its SessionEnd hooks.
        let mut ending = "shutdown";
        // Told when the stopping is done, by being dropped.
        let mut closed_by = None;
        loop {
            // Questions whose tool gave up (timeout, interruption) no longer wait.
            self.calls
                .questions
                .retain(|_, waiting| !waiting.is_closed());
            self.events.release_if_unused();
            self.reports.release_if_unused();
            self.inbound.release_if_unused();
            let idle = self.log.watchers.is_empty()
                && self.calls.answers.is_empty()
                && self.turn.running.is_none()
                && self.tasks.is_empty()
                && !self.children_running()
                && self.calls.questions.is_empty()
                && self.log.unstored.is_empty();
            let idle_timer = tokio::time::sleep(self.idle_unload);
            let linger_until = self.log.linger_until;
            tokio::select! {
                () = self.cancel.cancelled() => break,
                // Each arm's work is boxed: the loop's own future then holds one pointer
                // while a message is handled, not room for the largest handler's state,
                // and an idle session costs that much less.
                () = sleep_until_some(linger_until), if linger_until.is_some() => {
                    Box::pin(self.commit_lingering()).instrument(span()).await;
                }
                command = commands.next() => match command {
                    Some(Command::Close { stopped }) => {
                        ending = "closed";
                        closed_by = Some(stopped);
                        break;
                    }
                    None => {
                        ending = "closed";
                        break;
                    }
                    Some(command) => Box::pin(self.handle(command)).instrument(span()).await,
                },
                Some(event) = self.events.recv() => Box::pin(self.on_tool_event(event)).instrument(span()).await,
                Some(request) = self.inbound.recv() => Box::pin(self.on_request(request)).instrument(span()).await,
                Some(report) = self.reports.recv() => Box::pin(self.on_task_report(report)).instrument(span()).await,
                () = idle_timer, if idle => {
                    ending = "idle_unload";
                    // Thousands of sessions unload at once after a burst, each waiting on the
                    // store: a span each would be thousands of slots at once. The unload's own
                    // lines name the session.
                    let unloading = if self.log.lingering.is_empty() {
                        tracing::Span::none()
                    } else {
                        span()
                    };
                    Box::pin(self.unload()).instrument(unloading).await;
                    break;
                }
            }
        }
        // The same for stopping: a span only when there is more to do than let go.
        let stopping = if self.stops_with_work() {
            span()
        } else {
            tracing::Span::none()
        };
        // Boxed, as the handlers are: the loop's future would otherwise keep room for the
        // stopping's state through every idle hour of the session.
        Box::pin(
            async {
                self.session_end_hooks(ending).await;
                if !self.commit_lingering().await {
                    tracing::error!(
                        events = self.log.unstored.len(),
                        "the session stopped with events the store refused; they are lost"
                    );
                    self.log.unstored.clear();
                    self.write_health.session_done();
                }
                if let Some(turn) = &self.turn.running {
                    turn.cancel.cancel();
                }
                // In-flight tool/invoke calls hold child tokens of this one.
                self.cancel.cancel();
                self.close_children("the session stopped").await;
                self.cancel_tasks_on_stop().await;
                self.kill_processes();
                tracing::debug!(session_id = %self.session_id, "actor stopped");
            }
            .instrument(stopping),
        )
        .await;
        // Closes waiting on this actor (this one, and any still queued) return once it has
        // stopped, not before.
        drop((closed_by, commands));
    }

    /// Stores what lingers and marks the session clear before an idle unload.
    async fn unload(&mut self) {
        tracing::debug!(session_id = %self.session_id, "idle; unloading");
        self.commit_lingering().await;
        // Nothing runs: a start-up need not read this session's events.
        if let Err(err) = self
            .writer
            .mark_no_open_work(&self.session_id, self.log.last_seq)
            .await
        {
            tracing::warn!(session_id = %self.session_id, %err, "could not mark the session clear");
        }
    }

    /// Whether stopping has more to do than let go: SessionEnd hooks, children, tasks or a
    /// turn to end, events to store.
    fn stops_with_work(&self) -> bool {
        self.hooks
            .as_ref()
            .is_some_and(|hooks| hooks.any(crate::agent::hooks::HookEvent::SessionEnd, None))
            || !self.children.open.is_empty()
            || !self.tasks.is_empty()
            || self.turn.running.is_some()
            || !self.log.unstored.is_empty()
            || !self.log.lingering.is_empty()
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Attach(attach) => {
                let super::Attach {
                    mut watcher,
                    after_seq,
                    reply,
                } = *attach;
                self.send_pending_approvals(&mut watcher, after_seq);
                self.log.watchers.push(watcher);
                let _ = reply.send((self.log.last_seq, self.view()));
            }
            Command::Drain { reply } => {
                let waiting = self.draining.get_or_insert_with(Vec::new);
                waiting.push(reply);
                self.answer_drain();
            }
            Command::Detach { connection_id } => {
                self.log
                    .watchers
                    .retain(|w| w.connection_id != connection_id);
            }
            Command::Catalog { reply } => {
                let _ = reply.send(self.registry.catalog());
            }
            Command::Request(asked) => {
                let (request, reply) = *asked;
                self.handle_request(request, reply).await
            }
            Command::Close { .. } => {}
        }
    }

    /// Carries out one request of the session protocol; `reply` hears the answer, now or when
    /// the work it started ends.
    async fn handle_request(&mut self, request: SessionRequest, reply: ReplyTx) {
        match request {
            SessionRequest::Describe {} => {
                let _ = reply.send(Ok(SessionReply::View(Box::new(self.view()))));
            }
            SessionRequest::InvokeTool {
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
                self.invoke_tool(name, arguments, options, reply).await;
            }
            SessionRequest::ToolList {} => {
                let _ = reply.send(Ok(SessionReply::ToolList(tool_list(&self.registry))));
            }
            SessionRequest::StartTurn {
                input,
                turn_id,
                model,
                reasoning_effort,
                meta,
            } => {
                let start = TurnStart {
                    input: input.text,
                    images: input.images,
                    turn_id,
                    choice: ModelChoice {
                        model,
                        reasoning_effort,
                    },
                    traceparent: meta.traceparent,
                };
                let outcome = self.start_turn(start).await;
                let _ = reply.send(outcome.map(SessionReply::TurnStarted));
            }
            SessionRequest::SetModel {
                model,
                reasoning_effort,
            } => {
                self.choice = ModelChoice {
                    model,
                    reasoning_effort,
                };
                let _ = reply.send(Ok(SessionReply::Done));
            }
            SessionRequest::Interrupt {} => match &mut self.turn.running {
                Some(turn) => {
                    turn.cancel.cancel();
                    turn.interrupters.push(reply);
                    self.kill_processes();
                    self.stop_running_children();
                }
                None => {
                    let _ = reply.send(Ok(SessionReply::Interrupted(false)));
                }
            },
            SessionRequest::RespondApproval {
                approval_id,
                decision,
                message,
            } => {
                let answer = crate::agent::approval::Answer { decision, message };
                let outcome = self.respond_approval(approval_id, answer).await;
                let _ = reply.send(outcome.map(|()| SessionReply::Done));
            }
            SessionRequest::Compact {} => self.start_compaction(reply).await,
            SessionRequest::Revert(RevertTo {
                turn_id,
                dry_run,
                force,
            }) => {
                let outcome = self.revert(&turn_id, dry_run, force).await;
                let _ = reply.send(outcome.map(SessionReply::Reverted));
            }
            SessionRequest::Steer { turn_id, input } => {
                let outcome = match &mut self.turn.running {
                    Some(turn) if turn.turn_id == turn_id && !turn.cancel.is_cancelled() => {
                        turn.steers.push(input);
                        Ok(SessionReply::Done)
                    }
                    _ => Err(SessionError::NoActiveTurn(turn_id)),
                };
                let _ = reply.send(outcome);
            }
            SessionRequest::RespondUserInput {
                request_id,
                answers,
            } => {
                let outcome = match self.calls.questions.remove(&request_id) {
                    Some(waiting) => waiting
                        .send(answers)
                        .map(|()| SessionReply::Done)
                        .map_err(|_| SessionError::UnknownRequest(request_id)),
                    None => Err(SessionError::UnknownRequest(request_id)),
                };
                let _ = reply.send(outcome);
            }
            SessionRequest::CancelTask { task_id } => {
                // The task table and the children keep typed waiters; the answer is mapped
                // when the task has ended, off the actor.
                let (waiter, ended) = oneshot::channel();
                if self.children.open.contains_key(&task_id) {
                    self.cancel_child_run(&task_id, waiter);
                } else {
                    self.tasks.cancel(&task_id, waiter);
                }
                self.tracker.spawn(async move {
                    let outcome = ended
                        .await
                        .map(SessionReply::TaskCancelled)
                        .map_err(|_| SessionError::ActorGone);
                    let _ = reply.send(outcome);
                });
            }
            SessionRequest::Unknown => {
                let _ = reply.send(Err(SessionError::remote(
                    "method_not_found",
                    "a method this node does not have".into(),
                )));
            }
        }
    }

    /// What `session/open` reports of this session.
    fn view(&self) -> super::SessionView {
        let catalog = self.registry.catalog();
        let mut mcp = serde_json::Map::new();
        for server in &self.mcp.shared {
            mcp.insert(
                server.name().to_string(),
                Value::String(server.state().to_string()),
            );
        }
        for (name, state) in self.mcp.states.states() {
            mcp.insert(name, Value::String(state));
        }
        super::SessionView {
            capabilities: super::hub::capabilities(&catalog, &self.unsupported),
            tools: super::ToolNames::of(&catalog),
            mcp: Value::Object(mcp),
            instructions: self.gather_instructions().sources,
            running_turn: self
                .turn
                .running
                .as_ref()
                .filter(|turn| !turn.cancel.is_cancelled())
                .map(|turn| turn.turn_id.clone()),
        }
    }

    /// Tells a drain that no turn runs, once none does.
    fn answer_drain(&mut self) {
        if self.turn.running.is_none()
            && let Some(waiting) = &mut self.draining
        {
            for reply in waiting.drain(..) {
                let _ = reply.send(());
            }
        }
    }

    /// What calls of this session made outside a turn (clients', background tasks') share.
    fn call_scope(&self, labels: CostLabels) -> CallScope {
        CallScope {
            session_id: Arc::clone(&self.session_id),
            turn_id: None,
            cwd: self
                .registry
                .workspace()
                .map(|w| w.root().to_path_buf())
                .unwrap_or_default(),
            catalog: self.registry.catalog_cell(),
            exclusivity: Some(Arc::clone(&self.calls.exclusivity)),
            ledger: self.ledger.clone(),
            labels,
            metrics: Arc::clone(&self.metrics),
            approvals: Arc::clone(&self.approvals.rules),
            hooks: self.hooks.clone(),
        }
    }

    /// Ends what the session's tools keep running (its `exec_command` processes), so
    /// interrupting a turn or closing the session leaves no orphans (`shell` commands end with
    /// their call's cancellation).
    fn kill_processes(&self) {
        if let Some(workspace) = self.registry.workspace() {
            workspace.stop_work();
        }
    }
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
                let (tx, rx) = mpsc::channel(ACTOR_QUEUE);
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
                    "effects": e.effects(),
                    "spawn_only": e.spawn_only,
                });
                if let Some(group) = e.group() {
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

#[cfg(test)]
mod tests {
    use super::SessionActor;

    /// What a loaded session's run future takes, without an actor to run: the size of what
    /// `run` returns.
    fn returned<A, B, R>(_: impl FnOnce(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn the_run_future_holds_the_actor_once() {
        let run = returned(SessionActor::run);
        let actor = std::mem::size_of::<SessionActor>();
        assert!(
            run < actor,
            "the run future takes {run} bytes beside the {actor} of the boxed actor"
        );
    }
}
