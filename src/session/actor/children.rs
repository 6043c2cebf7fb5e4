//! The session's sub-agents: the actor owns them, answers the sub-agent tools' requests, and
//! records each child as a task whose id is its agent id.
//!
//! Rules: a child runs in the background beside the session; messages sent to a running child
//! wait in its inbox for its next model call, and a run that ends with mail waiting starts the
//! next at once. Interrupting a turn (or its time limit) stops every running child, as it kills
//! `exec_command` processes; a stopped child is `errored` with its history kept, so
//! `send_input` or `resume_agent` can continue it. Closing or unloading the session closes
//! every child.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::SessionActor;
use super::link::ActorLink;
use crate::agent::AgentSettings;
use crate::agent::child::{ChildHost, HistoryJournal};
use crate::agent::event::TaskUpdate;
use crate::agent::ledger::CostLabels;
use crate::agent::turn::Turn;
use crate::builtin::agents::{AgentState, AgentStatus, SubAgentRequest};
use crate::session::SessionError;
use crate::session::worktree::Git;
use crate::store::{TaskRow, TaskState};
use crate::tasks::spool::OutputSpool;
use crate::tasks::supervisor::{ChildRunEnd, TaskReport};
use crate::tools::ToolError;
use crate::tools::workspace::Workspace;

/// The task reason of a child closed with `close_agent`; such a child never comes back.
const CLOSED_REASON: &str = "closed by close_agent";

/// Groups a child may never see or call.
const CHILD_EXCLUDED: &[&str] = &["group:delegated", "group:sessions"];

/// The session's sub-agents: the open ones by agent id, and the ids of closed ones, so a call
/// naming one can say it was closed.
#[derive(Default)]
pub(super) struct Children {
    pub(super) open: std::collections::HashMap<String, ChildAgent>,
    pub(super) closed: std::collections::HashSet<String>,
}

/// One open child of the session.
pub(super) struct ChildAgent {
    host: Arc<ChildHost<ActorLink>>,
    settings: Arc<AgentSettings>,
    status: watch::Sender<AgentStatus>,
    /// Counts runs, so the end of a run that was superseded is ignored.
    run: u64,
    /// Stops the current run.
    cancel: CancellationToken,
    tool_call_id: String,
    /// `task/cancel` callers waiting for the stopped run's final state.
    cancel_waiters: Vec<oneshot::Sender<Option<TaskState>>>,
    /// When it was spawned, for listing children in that order.
    spawned_at: std::time::Instant,
}

impl ChildAgent {
    fn is_running(&self) -> bool {
        self.status.borrow().status == AgentState::Running
    }
}

fn unknown_agent(id: &str) -> ToolError {
    ToolError::model(
        "unknown_agent",
        format!("there is no sub-agent {id} in this session"),
    )
}

fn closed_agent(id: &str) -> ToolError {
    ToolError::model(
        "agent_closed",
        format!("sub-agent {id} was closed; start a new one with spawn_agent"),
    )
}

impl SessionActor {
    /// Whether any child is working (the session then stays loaded).
    pub(super) fn children_running(&self) -> bool {
        self.children.open.values().any(ChildAgent::is_running)
    }

    pub(super) async fn on_sub_agent_request(&mut self, request: SubAgentRequest) {
        // A child of an earlier start of the session comes back when a request names it.
        let named: Vec<String> = match &request {
            SubAgentRequest::SendInput { target, .. } => vec![target.clone()],
            SubAgentRequest::Resume { id, .. } => vec![id.clone()],
            SubAgentRequest::Watch { ids: Some(ids), .. } => ids.clone(),
            _ => Vec::new(),
        };
        for id in named {
            if let Err(err) = self.revive_child(&id).await {
                request.refuse(err);
                return;
            }
        }
        match request {
            SubAgentRequest::Spawn {
                message,
                model,
                agent_type,
                worktree,
                tool_call_id,
                cancel,
                reply,
            } => {
                // Queued before an interruption: nobody would learn the child's id.
                let outcome = if cancel.is_cancelled() {
                    Err(ToolError::model("cancelled", "the turn was interrupted"))
                } else {
                    self.spawn_child(message, model, agent_type, worktree, tool_call_id)
                        .await
                };
                let _ = reply.send(outcome);
            }
            SubAgentRequest::SendInput {
                target,
                message,
                interrupt,
                reply,
            } => {
                let outcome = self.send_to_child(&target, message, interrupt).await;
                let _ = reply.send(outcome);
            }
            SubAgentRequest::Resume { id, reply } => {
                let outcome = match self.children.open.get(&id) {
                    Some(child) if child.is_running() => Err(ToolError::model(
                        "agent_running",
                        format!("sub-agent {id} is running; wait for it with wait_agent"),
                    )),
                    Some(_) => Ok(self.start_child_run(&id, None).await),
                    None if self.children.closed.contains(&id) => Err(closed_agent(&id)),
                    None => Err(unknown_agent(&id)),
                };
                let _ = reply.send(outcome);
            }
            SubAgentRequest::Close { target, reply } => {
                let outcome = match self.children.open.remove(&target) {
                    Some(child) => {
                        self.close_child(&target, child, CLOSED_REASON).await;
                        self.mark_closed(&target).await;
                        let mut status = closed_status(&target);
                        status.worktree = self.settle_child_worktree(&target).await;
                        Ok(status)
                    }
                    None if self.children.closed.contains(&target) => Err(closed_agent(&target)),
                    // One of an earlier start, not brought back: closing it needs no revival.
                    None if self.stored_child(&target).await.is_some() => {
                        self.children.closed.insert(target.clone());
                        self.mark_closed(&target).await;
                        let mut status = closed_status(&target);
                        status.worktree = self.settle_child_worktree(&target).await;
                        Ok(status)
                    }
                    None => Err(unknown_agent(&target)),
                };
                let _ = reply.send(outcome);
            }
            SubAgentRequest::Watch { ids, reply } => {
                let outcome = match ids {
                    None => {
                        let mut open: Vec<&ChildAgent> = self.children.open.values().collect();
                        open.sort_by_key(|child| child.spawned_at);
                        Ok(open.iter().map(|child| child.status.subscribe()).collect())
                    }
                    Some(ids) => ids
                        .iter()
                        .map(|id| match self.children.open.get(id) {
                            Some(child) => Ok(child.status.subscribe()),
                            // A closed child stays closed: a receiver with nobody sending.
                            None if self.children.closed.contains(id) => {
                                Ok(watch::channel(closed_status(id)).1)
                            }
                            None => Err(unknown_agent(id)),
                        })
                        .collect(),
                };
                let _ = reply.send(outcome);
            }
        }
    }

    async fn spawn_child(
        &mut self,
        message: String,
        model: Option<String>,
        agent_type: Option<String>,
        worktree: bool,
        tool_call_id: String,
    ) -> Result<AgentStatus, ToolError> {
        let Some(settings) = self.agent.clone() else {
            return Err(ToolError::unsupported(
                "spawn_agent",
                "no model is configured for this server",
            ));
        };
        let profile = match &agent_type {
            Some(name) => Some(
                self.profiles
                    .get(name)
                    .map_err(|err| ToolError::model("unknown_agent_type", err.to_string()))?
                    .clone(),
            ),
            None => None,
        };
        let model = model.or_else(|| profile.as_ref().and_then(|p| p.model.clone()));
        if self.children.open.len() >= settings.max_sub_agents {
            return Err(ToolError::model(
                "agent_limit",
                format!(
                    "this session has {} open sub-agents, the most it may have; close one with \
                     close_agent (or wait for it and then close it) before starting another",
                    self.children.open.len()
                ),
            ));
        }
        let settings = match model {
            Some(model) if model != settings.model => {
                // An unpriced model costs 0 as far as the cap knows: with a cap, never.
                if settings.budget_usd.is_some() && settings.pricing.price(&model).is_none() {
                    return Err(ToolError::model(
                        "unpriced_model",
                        format!(
                            "model {model} has no price in [llm.pricing], and this session \
                             has a budget; use a priced model or leave model out"
                        ),
                    ));
                }
                match settings.with_choice(Some(&model), None) {
                    Ok(chosen) => Arc::new(chosen),
                    Err(unknown) => {
                        return Err(ToolError::model("unknown_model", unknown.to_string()));
                    }
                }
            }
            _ => settings,
        };
        let agent_id = uuid::Uuid::new_v4().to_string();
        let own_tree = match worktree {
            true => Some(self.make_child_worktree(&agent_id).await?),
            false => None,
        };
        let spool = OutputSpool::create(self.tasks.dir(), &agent_id)
            .await
            .map(|spool| spool.charged_to(self.tasks.disk().cloned()))
            .map_err(|err| {
                tracing::error!(%err, "sub-agent transcript not created");
                ToolError::Fatal(format!(
                    "the sub-agent's transcript could not be created: {err}"
                ))
            })?;
        let row = TaskRow::running(
            &agent_id,
            &self.session_id,
            &tool_call_id,
            "spawn_agent",
            spool.path(),
        );
        if let Err(err) = self.writer.upsert_task(&row).await {
            tracing::error!(%err, "sub-agent task not recorded");
            return Err(ToolError::Fatal(
                "the sub-agent could not be recorded".into(),
            ));
        }
        let journal = HistoryJournal::open(self.tasks.dir(), &agent_id).map_err(|err| {
            tracing::error!(%err, "sub-agent history not created");
            ToolError::Fatal(format!(
                "the sub-agent's history could not be created: {err}"
            ))
        })?;
        if let Some(name) = &agent_type {
            // A revived child (after a restart) works as the same profile.
            let marker = profile_marker(self.tasks.dir(), &agent_id);
            if let Err(err) = std::fs::write(&marker, name) {
                tracing::error!(%err, "sub-agent profile not recorded");
                return Err(ToolError::Fatal(format!(
                    "the sub-agent's profile could not be recorded: {err}"
                )));
            }
        }
        let mut registry = self.profiled_registry(profile.as_ref());
        if let Some(tree) = &own_tree {
            self.bind_to_worktree(&mut registry, tree);
        }
        let host = Arc::new(ChildHost::new(
            agent_id.clone(),
            registry,
            spool,
            journal,
            self.reports.sender(),
            ActorLink::new(self.inbound.sender()),
            profile.as_ref().and_then(|p| p.instructions.clone()),
        ));
        self.children.open.insert(
            agent_id.clone(),
            ChildAgent {
                host,
                settings,
                status: watch::Sender::new(AgentStatus::running(&agent_id)),
                run: 0,
                cancel: CancellationToken::new(),
                tool_call_id,
                cancel_waiters: Vec::new(),
                spawned_at: std::time::Instant::now(),
            },
        );
        let mut status = self.start_child_run(&agent_id, Some(message)).await;
        status.worktree = own_tree
            .map(|tree| json!({"path": tree.worktree.path, "branch": tree.worktree.branch}));
        Ok(status)
    }

    /// Git over the user's root, confined as this session's commands are, and the session's
    /// cwd relative to that root.
    fn user_git(&self) -> Option<(Git, std::path::PathBuf)> {
        let workspace = self.registry.workspace()?;
        let root = workspace.root_path();
        let cwd = root
            .below()
            .strip_prefix(&self.user_root)
            .ok()?
            .to_path_buf();
        let git = Git::new(Workspace::anchored(
            root.anchor(),
            &self.user_root,
            workspace.sandbox().cloned(),
            Arc::clone(workspace.command_env()),
        ));
        Some((git, cwd))
    }

    /// Makes sub-agent `agent_id`'s worktree from the session's cwd and records it beside the
    /// agent's task, so a revived agent works there again and a deleted session removes it.
    async fn make_child_worktree(&self, agent_id: &str) -> Result<ChildWorktree, ToolError> {
        let refused = |err: SessionError| ToolError::model("worktree_failed", err.to_string());
        let (git, cwd) = self.user_git().ok_or_else(|| {
            ToolError::model("worktree_failed", "this session has no workspace to branch")
        })?;
        let (worktree, cwd) = git.create(agent_id, &cwd, None).await.map_err(refused)?;
        let start = match git.head(&worktree).await {
            Ok(start) => start,
            Err(err) => {
                git.discard(&worktree).await;
                return Err(refused(err));
            }
        };
        let tree = ChildWorktree {
            worktree,
            cwd: cwd.to_string_lossy().into_owned(),
            start,
        };
        let written = serde_json::to_vec(&tree)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(worktree_marker(self.tasks.dir(), agent_id), bytes));
        if let Err(err) = written {
            git.discard(&tree.worktree).await;
            return Err(ToolError::Fatal(format!(
                "the sub-agent's worktree could not be recorded: {err}"
            )));
        }
        Ok(tree)
    }

    /// Points a child's tools at its worktree.
    fn bind_to_worktree(&self, registry: &mut crate::tools::ToolRegistry, tree: &ChildWorktree) {
        let Some(workspace) = self.registry.workspace() else {
            return;
        };
        registry.rebind_workspace(Workspace::charged(
            workspace.root_path().anchor(),
            self.user_root.join(&tree.cwd),
            workspace.sandbox().cloned(),
            Arc::clone(workspace.command_env()),
            workspace.disk().cloned(),
        ));
    }

    /// On `close_agent`: commits what the child left in its worktree to its branch and
    /// removes the worktree; answers what became of them (`None` without a worktree).
    async fn settle_child_worktree(&self, agent_id: &str) -> Option<Value> {
        let marker = worktree_marker(self.tasks.dir(), agent_id);
        let tree = ChildWorktree::recorded(&marker)?;
        let (git, _) = self.user_git()?;
        let message = format!("Work of agent {agent_id}");
        let branch = &tree.worktree.branch;
        Some(
            match git.settle(&tree.worktree, &tree.start, &message).await {
                Ok(kept) => {
                    let _ = std::fs::remove_file(&marker);
                    match kept {
                        Some(commit) => json!({
                            "branch": branch,
                            "commit": commit,
                            "kept": true,
                            "note": format!("its changes are committed on {branch}; merge them with `git merge {branch}`"),
                        }),
                        None => json!({
                            "branch": branch,
                            "kept": false,
                            "note": "it changed nothing; its worktree and branch are removed",
                        }),
                    }
                }
                Err(err) => json!({
                    "path": tree.worktree.path,
                    "branch": branch,
                    "error": err.to_string(),
                }),
            },
        )
    }

    /// The task row of a child of this session that is neither open nor closed for good.
    async fn stored_child(&mut self, agent_id: &str) -> Option<TaskRow> {
        if self.children.open.contains_key(agent_id) || self.children.closed.contains(agent_id) {
            return None;
        }
        let row = self.store.get_task(agent_id).await.ok()??;
        if row.session_id != *self.session_id || row.tool_name != "spawn_agent" {
            return None;
        }
        if row.reason.as_deref() == Some(CLOSED_REASON) {
            // Closed before this start: say so, as the start that closed it would.
            self.children.closed.insert(agent_id.to_string());
            return None;
        }
        Some(row)
    }

    /// Brings back a child of an earlier start of the session (the server restarted, or the
    /// session was unloaded) from its history file, finished or failed as it was left; does
    /// nothing for an id that is open, closed or unknown.
    async fn revive_child(&mut self, agent_id: &str) -> Result<(), ToolError> {
        let Some(row) = self.stored_child(agent_id).await else {
            return Ok(());
        };
        let Some(settings) = self.agent.clone() else {
            return Ok(());
        };
        if self.children.open.len() >= settings.max_sub_agents {
            return Err(ToolError::model(
                "agent_limit",
                format!(
                    "sub-agent {agent_id} would have to be reopened, but this session has {} open \
                     sub-agents, the most it may have; close one with close_agent first",
                    self.children.open.len()
                ),
            ));
        }
        let dir = self.tasks.dir().to_path_buf();
        let journal = match HistoryJournal::open(&dir, agent_id) {
            Ok(journal) if !journal.is_empty() => journal,
            Ok(_) => return Ok(()),
            Err(err) => {
                tracing::error!(%err, agent_id, "sub-agent history unreadable");
                return Ok(());
            }
        };
        let spool = match OutputSpool::reopen(&dir, agent_id).await {
            Ok(spool) => spool.charged_to(self.tasks.disk().cloned()),
            Err(err) => {
                tracing::error!(%err, agent_id, "sub-agent transcript unreadable");
                return Ok(());
            }
        };
        let status = if row.state == TaskState::Completed {
            AgentStatus {
                agent_id: agent_id.to_string(),
                status: AgentState::Completed,
                answer: journal.last_answer(),
                error: None,
                worktree: None,
            }
        } else {
            AgentStatus {
                agent_id: agent_id.to_string(),
                status: AgentState::Errored,
                answer: None,
                error: Some(
                    row.reason
                        .clone()
                        .unwrap_or_else(|| "it stopped when the session did".into()),
                ),
                worktree: None,
            }
        };
        // The marker holds a profile's name, which the server wrote.
        let profile = crate::capped_read::read_file_to_string(
            &profile_marker(self.tasks.dir(), agent_id),
            4096,
        )
        .ok()
        .and_then(|name| match self.profiles.get(name.trim()) {
            Ok(profile) => Some(profile.clone()),
            Err(err) => {
                tracing::warn!(agent_id, %err, "the sub-agent's profile is gone");
                None
            }
        });
        let mut registry = self.profiled_registry(profile.as_ref());
        let recorded = ChildWorktree::recorded(&worktree_marker(self.tasks.dir(), agent_id));
        if let Some(tree) = &recorded {
            self.bind_to_worktree(&mut registry, tree);
        }
        let host = Arc::new(ChildHost::new(
            agent_id.to_string(),
            registry,
            spool,
            journal,
            self.reports.sender(),
            ActorLink::new(self.inbound.sender()),
            profile.as_ref().and_then(|p| p.instructions.clone()),
        ));
        tracing::info!(agent_id, "sub-agent reopened from its history");
        self.children.open.insert(
            agent_id.to_string(),
            ChildAgent {
                host,
                settings,
                status: watch::Sender::new(status),
                run: 0,
                cancel: CancellationToken::new(),
                tool_call_id: row.tool_call_id,
                cancel_waiters: Vec::new(),
                spawned_at: std::time::Instant::now(),
            },
        );
        Ok(())
    }

    /// Records in the child's task that it was closed for good.
    async fn mark_closed(&self, agent_id: &str) {
        match self.store.get_task(agent_id).await {
            Ok(Some(mut row)) if row.reason.as_deref() != Some(CLOSED_REASON) => {
                row.reason = Some(CLOSED_REASON.into());
                if let Err(err) = self.writer.upsert_task(&row).await {
                    tracing::error!(%err, "sub-agent close not recorded");
                }
            }
            Ok(_) => {}
            Err(err) => tracing::error!(%err, "sub-agent task unreadable"),
        }
    }

    /// The registry a child works with: the session's tools without the delegated and
    /// session-management ones (removed by policy, so calling one answers `policy_denied`),
    /// with its own LRU state and nothing in the background.
    fn child_registry(&self) -> crate::tools::ToolRegistry {
        let mut policy = self.registry.hard_policy().cloned().unwrap_or_default();
        policy
            .deny
            .extend(CHILD_EXCLUDED.iter().map(|g| g.to_string()));
        let mut denied = self.registry.snapshot_excluding(&[]);
        denied.apply_policy(policy);
        let mut registry = denied.snapshot_excluding(CHILD_EXCLUDED);
        registry.clear_spawn_only();
        registry
    }

    /// [`Self::child_registry`] narrowed by `profile`'s tool policy.
    fn profiled_registry(
        &self,
        profile: Option<&crate::session::profiles::AgentProfile>,
    ) -> crate::tools::ToolRegistry {
        let mut registry = self.child_registry();
        if let Some(policy) = profile.and_then(|p| p.tool_policy.clone()) {
            registry.narrow(policy);
        }
        registry
    }

    async fn send_to_child(
        &mut self,
        target: &str,
        message: String,
        interrupt: bool,
    ) -> Result<AgentStatus, ToolError> {
        let Some(child) = self.children.open.get(target) else {
            return Err(if self.children.closed.contains(target) {
                closed_agent(target)
            } else {
                unknown_agent(target)
            });
        };
        if child.is_running() {
            child.host.deliver(message);
            if interrupt {
                // The run ends answering its calls; the mail then starts the next one.
                child.cancel.cancel();
            }
            return Ok(child.status.borrow().clone());
        }
        Ok(self.start_child_run(target, Some(message)).await)
    }

    /// Starts the next run of a child; it is `running` (and said so) before this returns.
    async fn start_child_run(&mut self, agent_id: &str, input: Option<String>) -> AgentStatus {
        // A child bills its parent's ledger, under its own label.
        let mut scope = self.call_scope(CostLabels {
            node_id: format!("agent:{agent_id}"),
            turn_id: None,
            task_id: Some(agent_id.to_string()),
        });
        let Some(child) = self.children.open.get_mut(agent_id) else {
            return closed_status(agent_id);
        };
        child.run += 1;
        child.cancel = self.cancel.child_token();
        child.host.begin_run();
        let status = AgentStatus::running(agent_id);
        child.status.send_replace(status.clone());
        // Its calls follow its own registry and batch rule.
        scope.turn_id = Some(format!("{agent_id}-{}", child.run));
        scope.catalog = child.host.catalog();
        scope.exclusivity = Some(child.host.exclusivity());
        let turn = Turn {
            turn_id: format!("{agent_id}-{}", child.run),
            input: input.map(crate::llm::ChatMessage::user),
            settings: Arc::clone(&child.settings),
            metrics: Arc::clone(&self.metrics),
            host: Arc::clone(&child.host),
            scope,
            cancel: child.cancel.clone(),
            session_start: false,
        };
        let host = Arc::clone(&child.host);
        let run = child.run;
        let tool_call_id = child.tool_call_id.clone();
        let reports = self.reports.sender();
        let id = agent_id.to_string();
        // A child's turn is an `invoke_agent` inside its parent's turn, when one runs.
        let span = if crate::telemetry::on() {
            let parent = self.turn.running.as_ref().map(|turn| &turn.span);
            let span = crate::telemetry::agent_span(&self.session_id, &turn.turn_id, &id, parent);
            crate::telemetry::attribute(&span, "gen_ai.agent.id", id.clone());
            span
        } else {
            tracing::info_span!("sub_agent", agent_id = %id, run)
        };
        self.tracker.spawn(
            async move {
                turn.run().await;
                let ending = host.take_ending();
                let _ = reports
                    .send(TaskReport::ChildEnded(Box::new(ChildRunEnd {
                        agent_id: id,
                        run,
                        ending,
                    })))
                    .await;
            }
            .instrument(span),
        );
        self.record_child_state(agent_id, &tool_call_id, TaskState::Running, None)
            .await;
        status
    }

    /// A run of a child ended: start the next when mail waits, else record its answer.
    pub(super) async fn on_child_run_end(&mut self, end: ChildRunEnd) {
        let Some(child) = self.children.open.get(&end.agent_id) else {
            return;
        };
        if child.run != end.run {
            return;
        }
        let cancelled_on_request = !child.cancel_waiters.is_empty();
        // A cancel is answered first, even when mail sent after it starts the next run.
        if child.host.has_mail() && !self.cancel.is_cancelled() && !cancelled_on_request {
            self.start_child_run(&end.agent_id, None).await;
            return;
        }
        let tool_call_id = child.tool_call_id.clone();
        let (status, state, reason) = match end.ending {
            Ok(answer) => (
                AgentStatus {
                    agent_id: end.agent_id.clone(),
                    status: AgentState::Completed,
                    answer,
                    error: None,
                    worktree: None,
                },
                TaskState::Completed,
                None,
            ),
            Err(error) => (
                AgentStatus {
                    agent_id: end.agent_id.clone(),
                    status: AgentState::Errored,
                    answer: None,
                    error: Some(error.message.clone()),
                    worktree: None,
                },
                if cancelled_on_request {
                    TaskState::Cancelled
                } else {
                    TaskState::Failed
                },
                Some(if cancelled_on_request {
                    "cancelled on request".to_string()
                } else {
                    error.message
                }),
            ),
        };
        // The task says so before anyone waiting hears the answer.
        self.record_child_state(&end.agent_id, &tool_call_id, state, reason)
            .await;
        if let Some(child) = self.children.open.get_mut(&end.agent_id) {
            child.status.send_replace(status);
            for waiter in child.cancel_waiters.drain(..) {
                let _ = waiter.send(Some(state));
            }
            if child.host.has_mail() && !self.cancel.is_cancelled() {
                self.start_child_run(&end.agent_id, None).await;
            }
        }
    }

    /// `task/cancel` on a child: its running turn stops (the child stays open, and is
    /// `errored` until given more to do); `waiter` hears the task's final state, or `None` at
    /// once when no turn of it is running.
    pub(super) fn cancel_child_run(
        &mut self,
        agent_id: &str,
        waiter: oneshot::Sender<Option<TaskState>>,
    ) {
        match self.children.open.get_mut(agent_id) {
            Some(child) if child.is_running() => {
                child.host.clear_inbox();
                child.cancel.cancel();
                child.cancel_waiters.push(waiter);
            }
            _ => {
                let _ = waiter.send(None);
            }
        }
    }

    /// Stops every running child: the session's turn was interrupted or ran out of time.
    pub(super) fn stop_running_children(&mut self) {
        for child in self.children.open.values() {
            if child.is_running() {
                child.host.clear_inbox();
                child.cancel.cancel();
            }
        }
    }

    /// Closes every child: the session is stopping.
    pub(super) async fn close_children(&mut self, reason: &str) {
        let children: Vec<(String, ChildAgent)> = self.children.open.drain().collect();
        for (agent_id, child) in children {
            self.close_child(&agent_id, child, reason).await;
        }
    }

    async fn close_child(&mut self, agent_id: &str, mut child: ChildAgent, reason: &str) {
        child.cancel.cancel();
        child.host.clear_inbox();
        let was_running = child.is_running();
        child.status.send_replace(closed_status(agent_id));
        self.children.closed.insert(agent_id.to_string());
        if was_running {
            self.record_child_state(
                agent_id,
                &child.tool_call_id,
                TaskState::Cancelled,
                Some(reason.to_string()),
            )
            .await;
        }
        for waiter in child.cancel_waiters.drain(..) {
            let _ = waiter.send(Some(TaskState::Cancelled));
        }
    }

    /// Records a child's task state and emits `task/updated`.
    async fn record_child_state(
        &mut self,
        agent_id: &str,
        tool_call_id: &str,
        state: TaskState,
        reason: Option<String>,
    ) {
        self.store_task_state(agent_id, state, reason.as_deref(), None, None)
            .await;
        self.metrics.record_task_state(state.as_str());
        let update = TaskUpdate::new(agent_id, tool_call_id, "spawn_agent", state).because(reason);
        self.emit(update.event()).await;
    }
}

fn closed_status(agent_id: &str) -> AgentStatus {
    AgentStatus {
        agent_id: agent_id.to_string(),
        status: AgentState::Closed,
        answer: None,
        error: None,
        worktree: None,
    }
}

/// A sub-agent's own worktree (`spawn_agent {isolation: "worktree"}`), as recorded beside its
/// task output.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ChildWorktree {
    /// The worktree and its branch.
    pub(crate) worktree: crate::store::SessionWorktree,
    /// The agent's cwd, relative to the user's root.
    cwd: String,
    /// The commit its branch started at: a branch still there changed nothing.
    start: String,
}

impl ChildWorktree {
    /// The worktree recorded in `marker`, when there is one.
    pub(crate) fn recorded(marker: &std::path::Path) -> Option<Self> {
        serde_json::from_slice(&crate::capped_read::read_file(marker, 64 * 1024).ok()?).ok()
    }
}

/// The file beside a sub-agent's task output recording its worktree.
pub(crate) fn worktree_marker(tasks_dir: &std::path::Path, agent_id: &str) -> std::path::PathBuf {
    tasks_dir.join(format!("{agent_id}.worktree"))
}

/// The file beside a sub-agent's task output naming the profile it works as.
fn profile_marker(tasks_dir: &std::path::Path, agent_id: &str) -> std::path::PathBuf {
    tasks_dir.join(format!("{agent_id}.agent"))
}
