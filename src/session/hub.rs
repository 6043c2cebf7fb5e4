//! The directory of live session actors: creates sessions, loads an actor on first use, hands
//! out handles, and forgets actors when they unload.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::SessionRequest;
use super::actor::{ActorSetup, SessionActor};
use super::forwarding::Relay;
use super::quota::SessionQuota;
use super::{Caller, Command, InflightCalls, SessionError, SessionHandle, open_work};
use crate::builtin;
use crate::cluster::Lease;
use crate::cluster::forward::Undelivered;
use crate::cluster::{Cluster, Owner};
use crate::fs_safe::{self, RootPath};
use crate::metrics::Metrics;
use crate::sandbox::{Sandbox, SandboxReport};
use crate::store::{NewSession, SessionRow, Store, Writer};
use crate::tools::{ToolCatalog, ToolRegistry, ToolState, Workspace};

/// The coding-tool contract this server implements.
pub const CODING_TOOL_CONTRACT: &str = "codex-compatible-coding-v1";

/// Settings the directory needs, taken from the configuration once.
#[derive(Debug, Clone)]
pub struct SessionsConfig {
    /// The workspace root.
    pub workspace: PathBuf,
    /// Whether sessions belong to users (each under `<workspace>/<user>/`).
    pub per_user_workspaces: bool,
    /// How long an actor with nothing to do stays loaded.
    pub idle_unload: Duration,
    /// Tools that exist but answer `unsupported` with this configuration.
    pub unsupported: Vec<String>,
    /// Whether a model is configured.
    pub llm_configured: bool,
    /// The model and limits turns run with; `None` without a usable model.
    pub agent: Option<Arc<crate::agent::AgentSettings>>,
    /// Where background task output is spooled.
    pub tasks_dir: PathBuf,
    /// The sandbox every session's commands run in; `None` with `[sandbox] mode = "off"`.
    pub sandbox: Option<Arc<Sandbox>>,
    /// The environment every session's commands, hooks, plugins and MCP servers start with.
    pub command_env: Arc<crate::sandbox::command_env::CommandEnv>,
    /// `tool/invoke` calls one session may have running or queued.
    pub max_inflight_per_session: usize,
    /// The configured `scope = "server"` MCP servers, whose tools are in the base registry.
    pub mcp: Vec<Arc<crate::mcp::McpServer>>,
    /// The `scope = "session"` MCP servers every session starts for itself.
    pub mcp_per_session: Vec<crate::mcp::McpServerConfig>,
    /// The `ask` lists and command rules of the hard and the model's soft policy.
    pub approval_rules: crate::tools::approval::ApprovalRules,
    /// How long a call waits for an approval.
    pub approval_timeout: Duration,
    /// Cluster mode: this node's part in it.
    pub cluster: Option<Arc<Cluster>>,
    /// Sessions one user may keep (0: no limit).
    pub max_sessions_per_user: u64,
    /// New sessions one user may make a minute (0: no limit).
    pub session_creates_per_minute: u32,
    /// The operator's instructions (`[instructions] text`, then `file`'s), and the
    /// `AGENTS.md` budget.
    pub instructions: super::instructions::OperatorInstructions,
    /// `[[hooks]]`.
    pub hooks: Arc<[crate::agent::hooks::HookConfig]>,
    /// `[[agents]]`.
    pub profiles: super::profiles::Profiles,
    /// Where checkpoints are kept (`<data_dir>/checkpoints`); `None`: no `turn/diff` nor
    /// `session/revert`.
    pub checkpoints: Option<Arc<crate::checkpoint::CheckpointStore>>,
    /// Each user's disk account and the free space kept for the server; `None` when
    /// neither is limited.
    pub disk: Option<Arc<crate::disk_quota::DiskQuotas>>,
}

struct Live {
    handle: SessionHandle,
    generation: u64,
}

struct Inner {
    store: Arc<dyn Store>,
    /// Where the sessions' work is written (group-committed), outside cluster mode.
    writer: Arc<dyn Writer>,
    base: Arc<ToolRegistry>,
    config: SessionsConfig,
    metrics: Arc<Metrics>,
    /// Actors running here.
    live: Mutex<HashMap<String, Live>>,
    /// Cluster mode: the sessions this node's clients watch, wherever their actors run.
    followers: Mutex<HashMap<String, Live>>,
    unsupported: Arc<[String]>,
    generations: AtomicU64,
    cancel: CancellationToken,
    tracker: TaskTracker,
    quota: SessionQuota,
    write_health: Arc<crate::store::WriteHealth>,
}

/// Finds, loads and unloads session actors; cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// The longest title `session/update` takes, in characters.
const TITLE_MAX_CHARS: usize = 200;

impl Sessions {
    /// A directory over `store`, whose sessions write through `writer`, giving each session a
    /// snapshot of `base`.
    pub fn new(
        store: Arc<dyn Store>,
        writer: Arc<dyn Writer>,
        base: Arc<ToolRegistry>,
        config: SessionsConfig,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                writer,
                base,
                unsupported: config.unsupported.clone().into(),
                write_health: Arc::default(),
                quota: SessionQuota::new(
                    config.max_sessions_per_user,
                    config.session_creates_per_minute,
                ),
                config,
                metrics,
                live: Mutex::new(HashMap::new()),
                followers: Mutex::new(HashMap::new()),
                generations: AtomicU64::new(0),
                cancel,
                tracker,
            }),
        }
    }

    /// The model settings turns run with, when a model is configured.
    pub fn agent(&self) -> Option<&crate::agent::AgentSettings> {
        self.inner.config.agent.as_deref()
    }

    /// Stores the model `choice` of the caller's session and hands it to its actor, when
    /// loaded (or to its owner, in a cluster); checked already.
    pub async fn set_model(
        &self,
        caller: &Caller,
        session_id: &str,
        choice: super::ModelChoice,
    ) -> Result<(), SessionError> {
        self.row(caller, session_id).await?;
        self.inner
            .store
            .set_session_model(
                session_id,
                choice.model.as_deref(),
                choice.reasoning_effort.as_deref(),
            )
            .await?;
        if let Ok(handle) = self.handle(caller, session_id).await {
            handle.set_model(choice).await?;
        }
        Ok(())
    }

    /// The agent profiles of `[[agents]]`.
    pub fn profiles(&self) -> &super::profiles::Profiles {
        &self.inner.config.profiles
    }

    /// The store behind the sessions.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Whether the sessions' last commit went through.
    pub fn write_health(&self) -> &crate::store::WriteHealth {
        &self.inner.write_health
    }

    /// The server-wide registry every session snapshots.
    pub fn base_registry(&self) -> &Arc<ToolRegistry> {
        &self.inner.base
    }

    /// The directory a caller's sessions work under.
    pub fn user_root(&self, caller: &Caller) -> PathBuf {
        match (&caller.user, self.inner.config.per_user_workspaces) {
            (Some(user), true) => self.inner.config.workspace.join(user),
            _ => self.inner.config.workspace.clone(),
        }
    }

    /// Where a session's files are: its cwd beneath the server's workspace (the anchor), to be
    /// reached with no symlink on the way, so a user directory or cwd swapped for a link to
    /// someone else's files is refused rather than followed.
    pub fn session_root(&self, row: &SessionRow) -> RootPath {
        let caller = Caller {
            user: row.user_name.clone(),
        };
        let workspace = &self.inner.config.workspace;
        let user_root = self.user_root(&caller);
        let below_workspace = user_root.strip_prefix(workspace).unwrap_or(Path::new(""));
        RootPath::new(workspace, below_workspace.join(&row.cwd))
    }

    /// Readies a new session of the caller's in `cwd` (relative to their workspace root,
    /// made when missing; empty is the root): checks the path and the quota and records the
    /// user. Answers the cwd as stored.
    async fn admit_new(&self, caller: &Caller, cwd: &str) -> Result<PathBuf, SessionError> {
        let root = self.user_root(caller);
        let rel = fs_safe::resolve_path(&root, cwd)
            .map_err(|err| SessionError::InvalidParams(format!("cwd: {err}")))?;
        prepare_dir(&self.inner.config.workspace, &root, &rel)?;
        self.inner
            .quota
            .admit(caller, self.inner.store.as_ref())
            .await?;
        if let Some(user) = &caller.user {
            self.inner.store.upsert_user(user).await?;
        }
        Ok(rel)
    }

    /// Creates a session (a fresh id, `cwd` relative to the caller's workspace root) and loads
    /// its actor.
    pub async fn create(
        &self,
        caller: &Caller,
        cwd: Option<&str>,
    ) -> Result<(SessionHandle, SessionRow), SessionError> {
        self.create_with_mcp(caller, cwd, Vec::new()).await
    }

    /// [`Self::create`] with MCP servers of the session's own besides the configured ones (an
    /// ACP client's `mcpServers`): started with its actor like `scope = "session"` servers, and
    /// not stored, so they live as long as this actor.
    pub async fn create_with_mcp(
        &self,
        caller: &Caller,
        cwd: Option<&str>,
        mcp: Vec<crate::mcp::McpServerConfig>,
    ) -> Result<(SessionHandle, SessionRow), SessionError> {
        self.create_as(caller, cwd, None, mcp).await
    }

    /// [`Self::create_with_mcp`] as the agent profile `agent` (`[[agents]]`), which the session
    /// keeps: its instructions, model and tool policy.
    pub async fn create_as(
        &self,
        caller: &Caller,
        cwd: Option<&str>,
        agent: Option<&str>,
        mcp: Vec<crate::mcp::McpServerConfig>,
    ) -> Result<(SessionHandle, SessionRow), SessionError> {
        self.check_profile(agent)?;
        if !mcp.is_empty() && self.inner.config.cluster.is_some() {
            return Err(SessionError::NotYetAvailable(
                "a client's own MCP servers are not available in cluster mode",
            ));
        }
        let rel = self.admit_new(caller, cwd.unwrap_or_default()).await?;
        let row = self
            .inner
            .store
            .create_session(&fresh_session(caller, &rel, agent))
            .await?;
        self.inner.metrics.sessions_created.inc();
        let handle = match &self.inner.config.cluster {
            Some(_) => self.follow(&row).await?,
            None => self.load_with_mcp(&row, None, mcp, true).await?,
        };
        Ok((handle, row))
    }

    /// Refuses an agent profile `[[agents]]` does not have, naming those it has.
    fn check_profile(&self, agent: Option<&str>) -> Result<(), SessionError> {
        if let Some(agent) = agent {
            self.inner
                .config
                .profiles
                .get(agent)
                .map_err(|err| SessionError::InvalidParams(err.to_string()))?;
        }
        Ok(())
    }

    /// [`Self::create_as`] in a git worktree of the session's own (`isolation: "worktree"`):
    /// `cwd` must be inside a git repository; the worktree gets a new branch from `base`
    /// (`HEAD` when `None`) and the session works there until it is merged or discarded.
    pub async fn create_in_worktree(
        &self,
        caller: &Caller,
        cwd: Option<&str>,
        agent: Option<&str>,
        base: Option<&str>,
    ) -> Result<(SessionHandle, SessionRow), SessionError> {
        if self.inner.config.cluster.is_some() {
            return Err(SessionError::NotYetAvailable(
                "isolation \"worktree\" is not available in cluster mode",
            ));
        }
        if self.sandbox_report().mode == crate::sandbox::SandboxMode::ReadOnly.as_str() {
            return Err(SessionError::InvalidParams(
                "isolation \"worktree\" needs a writable workspace; [sandbox] mode is \"read-only\""
                    .into(),
            ));
        }
        self.check_profile(agent)?;
        let rel = self.admit_new(caller, cwd.unwrap_or_default()).await?;
        let mut row = self
            .inner
            .store
            .create_session(&fresh_session(caller, &rel, agent))
            .await?;
        let git = self.git(caller, &row.session_id);
        let stored = async {
            let (worktree, cwd) = git.create(&row.session_id, &rel, base).await?;
            let cwd = cwd.to_string_lossy().into_owned();
            let set = self
                .inner
                .store
                .set_session_worktree(&row.session_id, &cwd, Some(&worktree));
            if let Err(err) = set.await {
                git.discard(&worktree).await;
                return Err(err.into());
            }
            Ok((worktree, cwd))
        }
        .await;
        match stored {
            Ok((worktree, cwd)) => {
                row.cwd = cwd;
                row.worktree = Some(worktree);
            }
            Err(err) => {
                // Nothing of a session that never got its worktree is kept.
                if let Err(gone) = self.inner.store.delete_session(&row.session_id).await {
                    tracing::warn!(session_id = %row.session_id, %gone, "cannot delete a session whose worktree failed");
                }
                if let Some(sandbox) = &self.inner.config.sandbox {
                    sandbox.remove_session(&row.session_id);
                }
                return Err(err);
            }
        }
        self.inner.metrics.sessions_created.inc();
        let handle = self.load_with_mcp(&row, None, Vec::new(), true).await?;
        Ok((handle, row))
    }

    /// Ends the worktree of the caller's session: merges its branch (with what the session
    /// left uncommitted committed as `message`) into the repository's checkout, or discards
    /// it; either way the session goes back to the cwd it asked for. Refused while a turn
    /// runs; the session's running commands and checkpoints end with the worktree.
    pub async fn end_worktree(
        &self,
        caller: &Caller,
        session_id: &str,
        merge: Option<&str>,
    ) -> Result<Value, SessionError> {
        let row = self.row(caller, session_id).await?;
        let Some(worktree) = row.worktree.clone() else {
            return Err(SessionError::NoWorktree(session_id.to_string()));
        };
        let live = (self.inner.live.lock().await)
            .get(session_id)
            .map(|live| live.handle.clone());
        if let Some(handle) = &live
            && !handle.is_closed()
            && handle.describe().await?.running_turn.is_some()
        {
            return Err(SessionError::TurnInProgress);
        }
        let git = self.git(caller, session_id);
        let answer = match merge {
            Some(message) => git.merge(&worktree, message).await?,
            None => git.discard(&worktree).await,
        };
        self.inner
            .store
            .set_session_worktree(session_id, &worktree.origin_cwd, None)
            .await?;
        // The actor's tools are bound to the worktree: it stops here and loads again, at the
        // session's own cwd (stored first, so no load in between finds the worktree's), on
        // its next use.
        let live = self.inner.live.lock().await.remove(session_id);
        if let Some(live) = live {
            live.handle.close().await;
        }
        if let Some(checkpoints) = &self.inner.config.checkpoints {
            checkpoints.forget_session(session_id);
        }
        Ok(answer)
    }

    /// Git in the caller's root, confined in session `session_id`'s sandbox.
    fn git(&self, caller: &Caller, session_id: &str) -> super::worktree::Git {
        let user_root = self.user_root(caller);
        let workspace = &self.inner.config.workspace;
        let below = user_root.strip_prefix(workspace).unwrap_or(Path::new(""));
        let sandbox = self
            .inner
            .config
            .sandbox
            .as_ref()
            .map(|sandbox| sandbox.for_session(session_id, &user_root));
        super::worktree::Git::new(Workspace::anchored(
            workspace,
            below,
            sandbox,
            Arc::clone(&self.inner.config.command_env),
        ))
    }

    /// The caller's session `id` as one JSON Lines export (see [`super::transfer`]), with its
    /// checkpoints when `with_checkpoints` (and the server keeps any).
    pub async fn export(
        &self,
        caller: &Caller,
        id: &str,
        with_checkpoints: bool,
    ) -> Result<String, SessionError> {
        let row = self.row(caller, id).await?;
        let store = &self.inner.store;
        let messages = store.messages(id).await?;
        let mut events = Vec::new();
        loop {
            let after = events.last().map_or(0, |e: &crate::store::EventRow| e.seq);
            let page = store.events_after(id, after, 1000).await?;
            if page.is_empty() {
                break;
            }
            events.extend(page);
        }
        let costs = store.cost_rows(id).await?;
        let tasks = store.list_tasks(id).await?;
        let checkpoints = match (&self.inner.config.checkpoints, with_checkpoints) {
            (Some(checkpoints), true) => {
                let checkpoints = Arc::clone(checkpoints);
                let session_id = id.to_string();
                let read =
                    tokio::task::spawn_blocking(move || checkpoints.export_session(&session_id))
                        .await
                        .map_err(|_| SessionError::ActorGone)?;
                Some(read.map_err(|err| {
                    SessionError::Store(crate::store::StoreError::Database(sqlx::Error::Io(err)))
                })?)
            }
            _ => None,
        };
        Ok(super::transfer::export(
            &row,
            &messages,
            &events,
            &costs,
            &tasks,
            checkpoints.as_ref(),
        ))
    }

    /// Makes a new session of the caller's from an export: its history, events, cost rows,
    /// title and model choice; in the export's cwd (made when missing).
    pub async fn import(
        &self,
        caller: &Caller,
        mut imported: super::transfer::Imported,
    ) -> Result<SessionRow, SessionError> {
        let manifests = std::mem::take(&mut imported.checkpoints);
        let blobs = std::mem::take(&mut imported.blobs);
        let rel = self.admit_new(caller, &imported.cwd).await?;
        let store = &self.inner.store;
        let row = store
            .create_session(&NewSession {
                session_id: uuid::Uuid::new_v4().to_string(),
                user_name: caller.user.clone(),
                cwd: rel.to_string_lossy().into_owned(),
                title: imported.title.clone(),
                parent_session_id: None,
                agent: None,
            })
            .await?;
        let id = row.session_id.clone();
        let filled = async {
            let mut events = imported.new_events(&id).peekable();
            while events.peek().is_some() {
                let chunk: Vec<_> = events.by_ref().take(500).collect();
                store.append_events(&chunk).await?;
            }
            let last_seq = imported.events.len() as i64;
            for message in &imported.messages {
                // One message is a tree at a time; the import holds the rest as text.
                let message: serde_json::Value =
                    serde_json::from_str(message.get()).map_err(|err| {
                        crate::store::StoreError::Database(sqlx::Error::Decode(err.into()))
                    })?;
                store.append_message(&id, &message, last_seq).await?;
            }
            for cost in &imported.costs {
                let mut cost = cost.clone();
                cost.session_id = id.clone();
                store.insert_cost_row(&cost).await?;
            }
            let tasks_dir = &self.inner.config.tasks_dir;
            let tasks = imported.new_tasks(&id, |task_id| {
                crate::tasks::spool::log_path(tasks_dir, task_id)
                    .map(|path| path.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
            for task in &tasks {
                // An empty log, so reading the record's output answers nothing rather than
                // an error; the output itself stayed where the session was exported.
                crate::tasks::spool::OutputSpool::create(tasks_dir, &task.task_id)
                    .await
                    .map_err(|err| crate::store::StoreError::Database(sqlx::Error::Io(err)))?;
                store.upsert_task(task).await?;
            }
            if imported.model.is_some() || imported.reasoning_effort.is_some() {
                store
                    .set_session_model(
                        &id,
                        imported.model.as_deref(),
                        imported.reasoning_effort.as_deref(),
                    )
                    .await?;
            }
            Ok::<i64, crate::store::StoreError>(last_seq)
        };
        let filled = async {
            let last_seq = filled.await.map_err(SessionError::from)?;
            if let Some(checkpoints) = self.inner.config.checkpoints.clone()
                && !manifests.is_empty()
            {
                let id = id.clone();
                tokio::task::spawn_blocking(move || {
                    checkpoints.import_session(&id, &manifests, &blobs)
                })
                .await
                .map_err(|_| SessionError::ActorGone)?
                .map_err(|err| SessionError::InvalidParams(err.to_string()))?;
            }
            Ok::<i64, SessionError>(last_seq)
        };
        let last_seq = match filled.await {
            Ok(last_seq) => last_seq,
            Err(err) => {
                // An import is all or nothing: no half session is left behind.
                if let Err(cleanup) = store.delete_session(&id).await {
                    tracing::error!(session_id = %id, %cleanup, "a failed import's session could not be removed");
                }
                for task_id in imported.task_ids.values() {
                    if let Ok(log) =
                        crate::tasks::spool::log_path(&self.inner.config.tasks_dir, task_id)
                    {
                        let _ = std::fs::remove_file(log);
                    }
                }
                return Err(err);
            }
        };
        self.inner.metrics.sessions_created.inc();
        tracing::info!(session_id = %id, source = %imported.source_id, events = last_seq, "session imported");
        self.row(caller, &id).await
    }

    /// Forks the caller's session `source_id`: a new session whose events and history are the
    /// source's up to event `up_to_seq` (default: all), rounded down to a point where no turn
    /// was running, so no tool batch is cut in two. It works in the source's directory unless
    /// `cwd` names another. The source is untouched.
    pub async fn fork(
        &self,
        caller: &Caller,
        source_id: &str,
        up_to_seq: Option<i64>,
        cwd: Option<&str>,
    ) -> Result<SessionRow, SessionError> {
        let source = self.row(caller, source_id).await?;
        if up_to_seq.is_some_and(|seq| seq < 0) {
            return Err(SessionError::InvalidParams(
                "up_to_seq must be 0 or more".into(),
            ));
        }
        self.inner
            .quota
            .admit(caller, self.inner.store.as_ref())
            .await?;
        let wanted = up_to_seq.unwrap_or(source.last_seq).min(source.last_seq);
        let cut = self.turn_boundary(source_id, wanted).await?;
        let cwd = match cwd {
            Some(cwd) => {
                let root = self.user_root(caller);
                let rel = fs_safe::resolve_path(&root, cwd)
                    .map_err(|err| SessionError::InvalidParams(format!("cwd: {err}")))?;
                prepare_dir(&self.inner.config.workspace, &root, &rel)?;
                rel.to_string_lossy().into_owned()
            }
            None => source.cwd.clone(),
        };
        let row = self
            .inner
            .store
            .fork_session(
                &NewSession {
                    session_id: uuid::Uuid::new_v4().to_string(),
                    user_name: caller.user.clone(),
                    cwd,
                    title: source.title.clone(),
                    agent: source.agent.clone(),
                    parent_session_id: Some(source.session_id),
                },
                cut,
            )
            .await?;
        self.inner.metrics.sessions_created.inc();
        Ok(row)
    }

    /// Gives the caller's session a title (trimmed; 1 to 200 characters, one line); answers
    /// the title stored.
    pub async fn set_title(
        &self,
        caller: &Caller,
        session_id: &str,
        title: &str,
    ) -> Result<String, SessionError> {
        self.row(caller, session_id).await?;
        let title = title.trim();
        let chars = title.chars().count();
        if chars == 0 || chars > TITLE_MAX_CHARS || title.contains(['\n', '\r']) {
            return Err(SessionError::InvalidParams(format!(
                "title must be one line of 1 to {TITLE_MAX_CHARS} characters"
            )));
        }
        self.inner
            .store
            .set_session_title(session_id, title)
            .await?;
        Ok(title.to_string())
    }

    /// The last seq at or before `wanted` at which no turn of the session was running.
    async fn turn_boundary(&self, session_id: &str, wanted: i64) -> Result<i64, SessionError> {
        const PAGE: i64 = 500;
        let (mut cursor, mut boundary, mut turn_open) = (0, 0, false);
        while cursor < wanted {
            let page = self
                .inner
                .store
                .events_after(session_id, cursor, PAGE.min(wanted - cursor))
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            cursor = last.seq;
            for event in page.iter().filter(|event| event.seq <= wanted) {
                match event.method.as_str() {
                    "turn/started" => turn_open = true,
                    "turn/completed" | "turn/error" => turn_open = false,
                    _ => {}
                }
                if !turn_open {
                    boundary = event.seq;
                }
            }
        }
        Ok(boundary)
    }

    /// The caller's session row, or `UnknownSession` (also for another user's session).
    pub async fn row(&self, caller: &Caller, session_id: &str) -> Result<SessionRow, SessionError> {
        match self.inner.store.get_session(session_id).await? {
            Some(row) if row.user_name == caller.user => Ok(row),
            _ => Err(SessionError::UnknownSession(session_id.to_string())),
        }
    }

    /// A handle to the caller's session, loading its actor from the store if needed.
    pub async fn handle(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionHandle, SessionError> {
        let row = self.row(caller, session_id).await?;
        match &self.inner.config.cluster {
            Some(_) => self.follow(&row).await,
            None => self.load(&row, None).await,
        }
    }

    /// [`Self::handle`] starting `mcp` (see [`Self::create_with_mcp`]) with the actor when it
    /// is not loaded yet; a loaded actor keeps the servers it has.
    pub async fn handle_with_mcp(
        &self,
        caller: &Caller,
        session_id: &str,
        mcp: Vec<crate::mcp::McpServerConfig>,
    ) -> Result<SessionHandle, SessionError> {
        if mcp.is_empty() {
            return self.handle(caller, session_id).await;
        }
        if self.inner.config.cluster.is_some() {
            return Err(SessionError::NotYetAvailable(
                "a client's own MCP servers are not available in cluster mode",
            ));
        }
        let row = self.row(caller, session_id).await?;
        self.load_with_mcp(&row, None, mcp, false).await
    }

    /// Stops the session's actor, if loaded, and deletes the session with all its data.
    pub async fn delete(&self, caller: &Caller, session_id: &str) -> Result<(), SessionError> {
        let row = self.row(caller, session_id).await?;
        let live = self.inner.live.lock().await.remove(session_id);
        if let Some(live) = live {
            live.handle.close().await;
        }
        let follower = self.inner.followers.lock().await.remove(session_id);
        if let Some(follower) = follower {
            follower.handle.close().await;
        }
        if let Some(worktree) = &row.worktree {
            self.git(caller, session_id).discard(worktree).await;
        }
        // Sub-agents' worktrees that no close_agent ended.
        for task in self.inner.store.list_tasks(session_id).await? {
            let marker = super::actor::children::worktree_marker(
                &self.inner.config.tasks_dir,
                &task.task_id,
            );
            if let Some(tree) = super::actor::children::ChildWorktree::recorded(&marker) {
                self.git(caller, session_id).discard(&tree.worktree).await;
            }
            let _ = std::fs::remove_file(marker);
        }
        self.inner.store.delete_session(session_id).await?;
        if let Some(sandbox) = &self.inner.config.sandbox {
            sandbox.remove_session(session_id);
        }
        if let Some(checkpoints) = &self.inner.config.checkpoints {
            checkpoints.forget_session(session_id);
        }
        Ok(())
    }

    /// Applies `[retention]` now, sparing the sessions whose actors run here.
    pub async fn sweep(
        &self,
        policy: &super::retention::RetentionConfig,
    ) -> Result<super::retention::SweepReport, SessionError> {
        let loaded: std::collections::HashSet<String> =
            self.inner.live.lock().await.keys().cloned().collect();
        let sandbox = self.inner.config.sandbox.clone();
        let checkpoints = self.inner.config.checkpoints.clone();
        let remove = move |session_id: &str| {
            if let Some(sandbox) = &sandbox {
                sandbox.remove_session(session_id);
            }
            if let Some(checkpoints) = &checkpoints {
                checkpoints.forget_session(session_id);
            }
        };
        let mut report = super::retention::sweep(
            self.inner.store.as_ref(),
            policy,
            time::OffsetDateTime::now_utc(),
            &loaded,
            &remove,
        )
        .await?;
        if let Some(checkpoints) = self.inner.config.checkpoints.clone() {
            // Blobs of dropped checkpoints and deleted sessions.
            match tokio::task::spawn_blocking(move || checkpoints.collect_garbage()).await {
                Ok(Ok(collected)) => {
                    report.checkpoint_bytes_removed = collected.bytes_removed;
                    self.inner
                        .metrics
                        .checkpoint_store_bytes
                        .set(i64::try_from(collected.bytes_kept).unwrap_or(i64::MAX));
                }
                Ok(Err(err)) => tracing::warn!(%err, "checkpoint garbage collection failed"),
                Err(_) => {}
            }
        }
        Ok(report)
    }

    /// Number of loaded actors.
    pub async fn live_count(&self) -> usize {
        self.inner.live.lock().await.len()
    }

    /// How commands are confined, for `session/open` and `/readyz`.
    pub fn sandbox_report(&self) -> SandboxReport {
        self.inner
            .config
            .sandbox
            .as_ref()
            .map_or_else(SandboxReport::off, |sandbox| sandbox.report())
    }

    /// The session's actor on this node, started if need be; in cluster mode only with the
    /// session's lease in hand (`owned`).
    async fn load(
        &self,
        row: &SessionRow,
        owned: Option<Lease>,
    ) -> Result<SessionHandle, SessionError> {
        self.load_with_mcp(row, owned, Vec::new(), false).await
    }

    /// [`Self::load`] starting `extra_mcp` too when it starts the actor; `created` when the
    /// session was created just now, so its actor need not read back a history and cost rows
    /// that cannot exist yet.
    async fn load_with_mcp(
        &self,
        row: &SessionRow,
        owned: Option<Lease>,
        extra_mcp: Vec<crate::mcp::McpServerConfig>,
        created: bool,
    ) -> Result<SessionHandle, SessionError> {
        let mut live = self.inner.live.lock().await;
        if let Some(existing) = live.get(&row.session_id)
            && !existing.handle.is_closed()
        {
            return Ok(existing.handle.clone());
        }
        let root = self.session_root(row);
        let mut registry = self.inner.base.snapshot_excluding(&[]);
        let profile = row.agent.as_deref().and_then(|name| {
            let found = self.inner.config.profiles.get(name);
            if let Err(err) = &found {
                tracing::warn!(session_id = %row.session_id, %err, "the session's agent profile is gone; it runs without one");
            }
            found.ok()
        });
        if let Some(policy) = profile.and_then(|p| p.tool_policy.clone()) {
            registry.narrow(policy);
        }
        // Every session gets its own workspace: its own change journal and processes.
        let caller = Caller {
            user: row.user_name.clone(),
        };
        let user_root = self.user_root(&caller);
        let sandbox = self
            .inner
            .config
            .sandbox
            .as_ref()
            .map(|sandbox| sandbox.for_session(&row.session_id, &user_root));
        let disk = self
            .inner
            .config
            .disk
            .as_ref()
            .map(|disk| disk.user(caller.user.as_deref(), &user_root));
        registry.rebind_workspace(Workspace::charged(
            root.anchor(),
            root.below(),
            sandbox,
            Arc::clone(&self.inner.config.command_env),
            disk,
        ));
        let session_id: Arc<str> = row.session_id.as_str().into();
        let (tx, rx) = super::command_queue();
        let inflight = InflightCalls::new(self.inner.config.max_inflight_per_session);
        let mcp = Arc::new(super::SessionMcp::default());
        let handle = SessionHandle::new(Arc::clone(&session_id), tx, inflight, Arc::clone(&mcp));
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        let cancel = self.inner.cancel.child_token();
        let (writer, epoch) = match (owned, &self.inner.config.cluster) {
            (Some(lease), Some(cluster)) => {
                let writer = cluster.writer(&lease, cancel.clone());
                let epoch = lease.epoch;
                cluster.hold(lease, cancel.clone());
                (writer, Some(epoch))
            }
            _ => (Arc::clone(&self.inner.writer), None),
        };
        let actor = SessionActor::new(ActorSetup {
            checkpoints: self.inner.config.checkpoints.clone(),
            session_id,
            store: Arc::clone(&self.inner.store),
            writer,
            registry,
            last_seq: row.last_seq,
            created,
            idle_unload: self.inner.config.idle_unload,
            profiles: self.inner.config.profiles.clone(),
            cancel,
            tracker: self.inner.tracker.clone(),
            metrics: Arc::clone(&self.inner.metrics),
            llm_configured: self.inner.config.llm_configured,
            agent: self.inner.config.agent.clone(),
            tasks_dir: self.inner.config.tasks_dir.clone(),
            mcp_servers: self
                .inner
                .config
                .mcp_per_session
                .iter()
                .cloned()
                .chain(extra_mcp)
                .collect(),
            mcp_states: mcp,
            shared_mcp: self.inner.config.mcp.clone(),
            approvals: crate::agent::approval::Approvals::new(
                self.inner.config.approval_rules.clone(),
                self.inner.config.approval_timeout,
            ),
            unsupported: Arc::clone(&self.inner.unsupported),
            write_health: Arc::clone(&self.inner.write_health),
            choice: crate::session::ModelChoice {
                model: row
                    .model
                    .clone()
                    .or_else(|| profile.and_then(|p| p.model.clone())),
                reasoning_effort: row.reasoning_effort.clone(),
            },
            instructions: super::instructions::OperatorInstructions {
                text: super::profiles::with_profile(
                    self.inner.config.instructions.text.as_deref(),
                    profile,
                ),
                limits: self.inner.config.instructions.limits,
            },
            hooks: Arc::clone(&self.inner.config.hooks),
            user_root: user_root
                .strip_prefix(&self.inner.config.workspace)
                .unwrap_or(Path::new(""))
                .to_path_buf(),
        });
        live.insert(
            row.session_id.clone(),
            Live {
                handle: handle.clone(),
                generation,
            },
        );
        drop(live);
        self.inner.metrics.actors_live.inc();
        let sessions = self.clone();
        let id = row.session_id.clone();
        // Made here and boxed: an actor captured by the task's block and then moved into the
        // future it awaits would take its room twice for the session's whole life.
        let running = Box::pin(Box::new(actor).run(rx));
        self.inner.tracker.spawn(async move {
            running.await;
            sessions.inner.metrics.actors_live.dec();
            let mut live = sessions.inner.live.lock().await;
            if live.get(&id).is_some_and(|l| l.generation == generation) {
                live.remove(&id);
                // The table a burst of sessions grew is given back once most have gone.
                if live.capacity() > 1024 && live.len() < live.capacity() / 8 {
                    let keep = live.len() * 2;
                    live.shrink_to(keep);
                }
            }
            drop(live);
            if let (Some(cluster), Some(epoch)) = (&sessions.inner.config.cluster, epoch) {
                cluster.release(&id, epoch).await;
            }
            crate::heap::trim_soon();
        });
        Ok(handle)
    }
}

/// `session/open`'s `capabilities`: the contract id and the status in a session's catalog of
/// each tool whose meta says the contract names it: every built-in so marked, whether or not
/// this server registered it, and the server's own (the task tools).
pub(crate) fn capabilities(catalog: &ToolCatalog, unsupported: &[String]) -> Value {
    let builtin = builtin::metas()
        .iter()
        .filter(|meta| meta.contract)
        .map(|meta| meta.name.as_str());
    let registered = catalog
        .entries
        .iter()
        .filter(|entry| entry.tool.meta().contract)
        .map(|entry| entry.name());
    let tools: serde_json::Map<String, Value> = builtin
        .chain(registered)
        .map(|name| {
            let status = if unsupported.iter().any(|u| u == name) {
                "unsupported"
            } else {
                match catalog.get(name).map(|e| e.state) {
                    Some(ToolState::Active) => "available",
                    Some(ToolState::Deferred) => "deferred",
                    Some(ToolState::Hidden(_)) => "disabled_by_policy",
                    None => "unsupported",
                }
            };
            (name.to_string(), Value::String(status.to_string()))
        })
        .collect();
    json!({"coding_tool_contract": CODING_TOOL_CONTRACT, "tools": tools})
}

/// Where a request for a session goes in cluster mode.
enum Route {
    /// The actor runs here.
    Local(SessionHandle),
    /// The actor runs on the node at this URL.
    Remote(String),
}

/// Cluster mode: followers, owners, takeovers, forwarding and draining.
impl Sessions {
    fn cluster(&self) -> Result<&Arc<Cluster>, SessionError> {
        self.inner
            .config
            .cluster
            .as_ref()
            .ok_or(SessionError::NotYetAvailable("cluster mode is off"))
    }

    /// Whether this node is a cluster node handing its sessions over (it is stopping).
    pub fn is_draining(&self) -> bool {
        self.inner
            .config
            .cluster
            .as_ref()
            .is_some_and(|cluster| cluster.is_draining())
    }

    /// This node's follower of the session, started if need be.
    async fn follow(&self, row: &SessionRow) -> Result<SessionHandle, SessionError> {
        let cluster = Arc::clone(self.cluster()?);
        let mut followers = self.inner.followers.lock().await;
        if let Some(existing) = followers.get(&row.session_id)
            && !existing.handle.is_closed()
        {
            return Ok(existing.handle.clone());
        }
        // Subscribed before the cursor is read, so no event falls between the two.
        let notices = cluster.subscribe(&row.session_id);
        let cursor = match self.inner.store.get_session(&row.session_id).await? {
            Some(fresh) => fresh.last_seq,
            None => return Err(SessionError::UnknownSession(row.session_id.clone())),
        };
        let session_id: Arc<str> = row.session_id.as_str().into();
        let (tx, rx) = super::command_queue();
        let handle = SessionHandle::new(
            Arc::clone(&session_id),
            tx,
            InflightCalls::new(self.inner.config.max_inflight_per_session),
            Arc::new(super::SessionMcp::default()),
        );
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        followers.insert(
            row.session_id.clone(),
            Live {
                handle: handle.clone(),
                generation,
            },
        );
        drop(followers);
        let follower = super::follower::Follower {
            session_id,
            user: row.user_name.clone(),
            sessions: self.clone(),
            cluster: Arc::clone(&cluster),
            cursor,
            notices,
            idle_unload: self.inner.config.idle_unload,
            cancel: self.inner.cancel.child_token(),
        };
        let sessions = self.clone();
        let id = row.session_id.clone();
        self.inner.tracker.spawn(async move {
            follower.run(rx).await;
            let mut followers = sessions.inner.followers.lock().await;
            if followers
                .get(&id)
                .is_some_and(|l| l.generation == generation)
            {
                followers.remove(&id);
            }
            drop(followers);
            cluster.unsubscribe(&id);
        });
        Ok(handle)
    }

    /// The actor of `session_id` if it runs here.
    async fn live_actor(&self, session_id: &str) -> Option<SessionHandle> {
        let live = self.inner.live.lock().await;
        live.get(session_id)
            .filter(|live| !live.handle.is_closed())
            .map(|live| live.handle.clone())
    }

    /// Takes the session's lease if nobody holds it and starts its actor here, first ending
    /// what a lost owner left running (`lost`, as [`Owner::Nobody`] said). `None` when someone
    /// else holds it (or this node drains).
    async fn take(
        &self,
        session_id: &str,
        lost: bool,
    ) -> Result<Option<SessionHandle>, SessionError> {
        let cluster = self.cluster()?;
        let Some(lease) = cluster.acquire(session_id).await? else {
            return Ok(None);
        };
        // Read after the lease is ours: the lost owner's last commit is in it.
        let Some(row) = self.inner.store.get_session(session_id).await? else {
            cluster.let_go(&lease).await;
            return Err(SessionError::UnknownSession(session_id.to_string()));
        };
        let mut row = row;
        if lost {
            cluster.metrics().cluster_takeovers.inc();
            let failed = self
                .inner
                .store
                .fail_running_tasks_of(session_id, "the node running the task was lost")
                .await?;
            // The lease is ours and no actor runs: what the lost owner left open ends now.
            let after_seq = self
                .inner
                .store
                .sessions_with_open_work()
                .await?
                .into_iter()
                .find_map(|(id, after)| (id == session_id).then_some(after));
            let mut ended = open_work::Ended::default();
            if let Some(after_seq) = after_seq {
                ended = open_work::end_open_work(
                    self.inner.store.as_ref(),
                    session_id,
                    after_seq,
                    open_work::Ending::NodeLost,
                )
                .await?;
                if ended.turn {
                    cluster
                        .metrics()
                        .record_turn(open_work::Ending::NodeLost.as_str());
                }
                if ended.events > 0
                    && let Some(fresh) = self.inner.store.get_session(session_id).await?
                {
                    row = fresh;
                }
            }
            tracing::warn!(%session_id, epoch = lease.epoch, failed, ended = ended.events, "took over a session from a lost node");
        }
        self.load(&row, Some(lease)).await.map(Some)
    }

    /// Takes the session over from a lost node, if it still needs it.
    pub(crate) async fn take_over(&self, session_id: &str) {
        if let Err(err) = self.route(session_id).await {
            tracing::warn!(%err, %session_id, "takeover failed");
        }
    }

    /// Where the session's requests go now: its actor here (taking the lease when nobody holds
    /// it), or its owner's URL.
    async fn route(&self, session_id: &str) -> Result<Route, SessionError> {
        let cluster = Arc::clone(self.cluster()?);
        for _ in 0..8 {
            if let Some(handle) = self.live_actor(session_id).await {
                return Ok(Route::Local(handle));
            }
            match cluster.owner(session_id).await? {
                Owner::Node { url, .. } if !url.is_empty() => return Ok(Route::Remote(url)),
                Owner::Node { expires_at, .. } | Owner::Here { expires_at }
                    if !cluster.holds(session_id) =>
                {
                    // An owner that left no address, or an earlier process under this node's
                    // id: its lease lapses by itself.
                    sleep_until(expires_at, cluster.lease_ttl()).await;
                }
                Owner::Node { .. } | Owner::Here { .. } => {
                    // The actor here is stopping and about to let go.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Owner::Nobody { .. } if cluster.is_draining() => {
                    return match cluster.other_node().await? {
                        Some(url) => Ok(Route::Remote(url)),
                        None => Err(SessionError::ActorGone),
                    };
                }
                Owner::Nobody { lost } => {
                    if let Some(handle) = self.take(session_id, lost).await? {
                        return Ok(Route::Local(handle));
                    }
                }
            }
        }
        Err(SessionError::ActorGone)
    }

    /// Carries a follower's command to the session's owner and its answer back, once the
    /// follower has handed its watchers every event the owner had when it answered
    /// (`delivered` is the follower's cursor), so an answer never overtakes its events.
    pub(crate) async fn relay(
        &self,
        session_id: &str,
        user: Option<&str>,
        command: Command,
        delivered: tokio::sync::watch::Receiver<i64>,
    ) {
        let relay = match Relay::of(command) {
            Ok(relay) => relay,
            // The catalog (MCP's tool list) does not travel: it is served where the actor runs.
            Err(command) => {
                match self.route(session_id).await {
                    Ok(Route::Local(handle)) => {
                        let _ = handle.send_command(command);
                    }
                    Ok(Route::Remote(_)) => {
                        tracing::debug!(%session_id, "a local-only request for a remote session");
                    }
                    Err(err) => super::follower::refuse(command, err),
                }
                return;
            }
        };
        let Ok(cluster) = self.cluster().cloned() else {
            return;
        };
        let settle = |seq: i64| {
            let ttl = cluster.lease_ttl();
            let mut delivered = delivered.clone();
            async move {
                let _ =
                    tokio::time::timeout(ttl, delivered.wait_for(|cursor| *cursor >= seq)).await;
            }
        };
        for _ in 0..3 {
            let url = match self.route(session_id).await {
                Ok(Route::Local(handle)) => {
                    let outcome = handle.request(relay.call.clone()).await;
                    let seq = match self.inner.store.get_session(session_id).await {
                        Ok(Some(row)) => row.last_seq,
                        _ => 0,
                    };
                    settle(seq).await;
                    return relay.answer(outcome);
                }
                Ok(Route::Remote(url)) => url,
                Err(err) => return relay.answer(Err(err)),
            };
            // The owner's span continues this one: the forward carries its `traceparent`.
            let span = crate::telemetry::work_span("cluster_forward", relay.call.method());
            crate::telemetry::adopt_parent(&span, relay.call.traceparent());
            let forwarded = cluster
                .forward(&url, session_id, user, &relay.call)
                .instrument(span)
                .await;
            match forwarded {
                Ok((outcome, seq)) => {
                    settle(seq).await;
                    let outcome = outcome
                        .map_err(|refused| SessionError::remote(&refused.kind, refused.message));
                    return relay.answer_wire(outcome);
                }
                Err(Undelivered::NotOwner) => {}
                Err(Undelivered::Unreachable(err)) => {
                    tracing::warn!(%err, %url, %session_id, "owner unreachable; waiting for its lease");
                    if let Ok(Some(lease)) = cluster.lease(session_id).await {
                        sleep_until(lease.expires_at, cluster.lease_ttl()).await;
                    }
                }
                Err(Undelivered::Lost(err)) => {
                    // The request may have run: not sent again.
                    tracing::warn!(%err, %url, %session_id, "owner lost while answering");
                    return relay.answer(Err(SessionError::ActorGone));
                }
            }
        }
        relay.answer(Err(SessionError::ActorGone));
    }

    /// Runs a request another node forwarded: `Ok(None)` when this node does not own the
    /// session (and cannot take it).
    pub async fn serve_forwarded(
        &self,
        caller: &Caller,
        session_id: &str,
        call: SessionRequest,
    ) -> Result<Option<Value>, SessionError> {
        self.row(caller, session_id).await?;
        let handle = match self.live_actor(session_id).await {
            Some(handle) => handle,
            None => {
                let cluster = self.cluster()?;
                match cluster.owner(session_id).await? {
                    Owner::Nobody { lost } => match self.take(session_id, lost).await? {
                        Some(handle) => handle,
                        None => return Ok(None),
                    },
                    _ => return Ok(None),
                }
            }
        };
        super::forwarding::run(&handle, call).await.map(Some)
    }

    /// Hands this node's sessions over: takes no more, lets running turns end (up to `grace`),
    /// interrupts the rest, stops the actors and releases their leases.
    pub async fn drain(&self, grace: Duration) {
        let Ok(cluster) = self.cluster() else { return };
        cluster.start_draining().await;
        let handles: Vec<SessionHandle> = self
            .inner
            .live
            .lock()
            .await
            .values()
            .map(|live| live.handle.clone())
            .collect();
        tracing::info!(sessions = handles.len(), "draining");
        let deadline = tokio::time::Instant::now() + grace;
        let drains = handles.iter().map(|handle| async move {
            if tokio::time::timeout_at(deadline, handle.drain())
                .await
                .is_err()
            {
                let _ = handle.interrupt().await;
            }
            handle.close().await;
        });
        futures_util::future::join_all(drains).await;
        cluster.leave().await;
    }
}

/// Sleeps until `at`, or for `cap` at most.
async fn sleep_until(at: time::OffsetDateTime, cap: Duration) {
    let left = at - time::OffsetDateTime::now_utc();
    let left = Duration::try_from(left).unwrap_or_default().min(cap);
    tokio::time::sleep(left + Duration::from_millis(10)).await;
}

/// A new session of the caller's in `rel`, as `agent`, with a fresh id.
fn fresh_session(caller: &Caller, rel: &Path, agent: Option<&str>) -> NewSession {
    NewSession {
        session_id: uuid::Uuid::new_v4().to_string(),
        user_name: caller.user.clone(),
        cwd: rel.to_string_lossy().into_owned(),
        title: None,
        parent_session_id: None,
        agent: agent.map(str::to_string),
    }
}

/// Makes sure the caller's root and the session's cwd exist, without following symlinks below
/// the workspace root.
fn prepare_dir(workspace: &Path, root: &Path, rel: &Path) -> Result<(), SessionError> {
    let below_workspace = root.strip_prefix(workspace).unwrap_or(Path::new(""));
    let full = below_workspace.join(rel);
    if full.as_os_str().is_empty() {
        return Ok(());
    }
    fs_safe::create_dir_all_no_follow(workspace, &full)
        .map_err(|err| SessionError::InvalidParams(format!("cwd: {err}")))
}
