//! The directory of live session actors: creates sessions, loads an actor on first use, hands
//! out handles, and forgets actors when they unload.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::actor::{ActorSetup, COMMAND_QUEUE, SessionActor};
use super::{Caller, InflightCalls, SessionError, SessionHandle};
use crate::fs_safe::{self, RootPath};
use crate::metrics::Metrics;
use crate::sandbox::{Sandbox, SandboxReport};
use crate::store::{NewSession, SessionRow, Store};
use crate::tools::{ToolCatalog, ToolRegistry, ToolState, Workspace};

/// The coding-tool contract this server implements.
pub const CODING_TOOL_CONTRACT: &str = "codex-compatible-coding-v1";

/// Tools named by the coding-tool contract, whose status `session/open` reports.
pub const CONTRACT_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "diff_edit",
    "apply_patch",
    "list_dir",
    "glob",
    "grep",
    "shell",
    "exec_command",
    "write_stdin",
    "web_fetch",
    "web_search",
    "update_plan",
    "request_user_input",
    "spawn_agent",
    "send_input",
    "resume_agent",
    "wait_agent",
    "close_agent",
    "tool_search",
    "tool_suggest",
    "activate_tools",
    "read_task_output",
    "check_background_tasks",
    "run_pipeline",
    "workspace_diff",
    "workspace_log",
    "image_generation",
];

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
    /// `tool/invoke` calls one session may have running or queued.
    pub max_inflight_per_session: usize,
    /// The configured `scope = "server"` MCP servers, whose tools are in the base registry.
    pub mcp: Vec<Arc<crate::tools::mcp::McpServer>>,
    /// The `scope = "session"` MCP servers every session starts for itself.
    pub mcp_per_session: Vec<crate::tools::mcp::McpServerConfig>,
    /// The `ask` lists and command rules of the hard and the model's soft policy.
    pub approval_rules: crate::tools::approval::ApprovalRules,
    /// How long a call waits for an approval.
    pub approval_timeout: Duration,
}

struct Live {
    handle: SessionHandle,
    generation: u64,
}

struct Inner {
    store: Arc<dyn Store>,
    base: Arc<ToolRegistry>,
    config: SessionsConfig,
    metrics: Arc<Metrics>,
    live: Mutex<HashMap<String, Live>>,
    generations: AtomicU64,
    cancel: CancellationToken,
    tracker: TaskTracker,
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

impl Sessions {
    /// A directory over `store`, giving each session a snapshot of `base`.
    pub fn new(
        store: Arc<dyn Store>,
        base: Arc<ToolRegistry>,
        config: SessionsConfig,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                base,
                config,
                metrics,
                live: Mutex::new(HashMap::new()),
                generations: AtomicU64::new(0),
                cancel,
                tracker,
            }),
        }
    }

    /// The store behind the sessions.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
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

    /// Creates a session (a fresh id, `cwd` relative to the caller's workspace root) and loads
    /// its actor.
    pub async fn create(
        &self,
        caller: &Caller,
        cwd: Option<&str>,
    ) -> Result<(SessionHandle, SessionRow), SessionError> {
        let root = self.user_root(caller);
        let rel = match cwd {
            Some(cwd) => fs_safe::resolve_path(&root, cwd)
                .map_err(|err| SessionError::InvalidParams(format!("cwd: {err}")))?,
            None => PathBuf::new(),
        };
        prepare_dir(&self.inner.config.workspace, &root, &rel)?;
        if let Some(user) = &caller.user {
            self.inner.store.upsert_user(user).await?;
        }
        let row = self
            .inner
            .store
            .create_session(&NewSession {
                session_id: uuid::Uuid::new_v4().to_string(),
                user_name: caller.user.clone(),
                cwd: rel.to_string_lossy().into_owned(),
                title: None,
                parent_session_id: None,
            })
            .await?;
        self.inner.metrics.sessions_created.inc();
        let handle = self.load(&row).await?;
        Ok((handle, row))
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
                    parent_session_id: Some(source.session_id),
                },
                cut,
            )
            .await?;
        self.inner.metrics.sessions_created.inc();
        Ok(row)
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
        self.load(&row).await
    }

    /// Stops the session's actor, if loaded, and deletes the session with all its data.
    pub async fn delete(&self, caller: &Caller, session_id: &str) -> Result<(), SessionError> {
        self.row(caller, session_id).await?;
        let live = self.inner.live.lock().await.remove(session_id);
        if let Some(live) = live {
            live.handle.close().await;
        }
        self.inner.store.delete_session(session_id).await?;
        if let Some(sandbox) = &self.inner.config.sandbox {
            sandbox.remove_session(session_id);
        }
        Ok(())
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

    /// Each configured MCP server's state in the session of `handle` (`ready`, `starting`,
    /// `failed: reason`), by name: the shared servers' and the session's own.
    pub fn mcp_states(&self, handle: &SessionHandle) -> Value {
        let mut states = serde_json::Map::new();
        for server in &self.inner.config.mcp {
            states.insert(
                server.name().to_string(),
                Value::String(server.state().to_string()),
            );
        }
        for (name, state) in handle.mcp().states() {
            states.insert(name, Value::String(state));
        }
        Value::Object(states)
    }

    /// `session/open`'s `capabilities`: the contract id and each contract tool's status in
    /// this session's registry.
    pub fn capabilities(&self, catalog: &ToolCatalog) -> Value {
        let tools: serde_json::Map<String, Value> = CONTRACT_TOOLS
            .iter()
            .map(|name| {
                let status = if self.inner.config.unsupported.iter().any(|u| u == name) {
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

    async fn load(&self, row: &SessionRow) -> Result<SessionHandle, SessionError> {
        let mut live = self.inner.live.lock().await;
        if let Some(existing) = live.get(&row.session_id)
            && !existing.handle.is_closed()
        {
            return Ok(existing.handle.clone());
        }
        let root = self.session_root(row);
        let mut registry = self.inner.base.snapshot_excluding(&[]);
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
        registry.rebind_workspace(Workspace::anchored(root.anchor(), root.below(), sandbox));
        let session_id: Arc<str> = row.session_id.as_str().into();
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let inflight = InflightCalls::new(self.inner.config.max_inflight_per_session);
        let mcp = Arc::new(super::SessionMcp::default());
        let handle = SessionHandle::new(Arc::clone(&session_id), tx, inflight, Arc::clone(&mcp));
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        let actor = SessionActor::new(ActorSetup {
            session_id,
            store: Arc::clone(&self.inner.store),
            registry,
            last_seq: row.last_seq,
            idle_unload: self.inner.config.idle_unload,
            cancel: self.inner.cancel.child_token(),
            tracker: self.inner.tracker.clone(),
            metrics: Arc::clone(&self.inner.metrics),
            llm_configured: self.inner.config.llm_configured,
            agent: self.inner.config.agent.clone(),
            tasks_dir: self.inner.config.tasks_dir.clone(),
            mcp_servers: self.inner.config.mcp_per_session.clone(),
            mcp_states: mcp,
            shared_mcp: self.inner.config.mcp.clone(),
            approvals: crate::agent::approval::Approvals::new(
                self.inner.config.approval_rules.clone(),
                self.inner.config.approval_timeout,
            ),
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
        self.inner.tracker.spawn(async move {
            actor.run(rx).await;
            sessions.inner.metrics.actors_live.dec();
            let mut live = sessions.inner.live.lock().await;
            if live.get(&id).is_some_and(|l| l.generation == generation) {
                live.remove(&id);
            }
            drop(live);
            crate::heap::trim_soon();
        });
        Ok(handle)
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
