//! Start-up and shutdown: everything between a parsed [`Config`] and a serving router.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::AgentSettings;
use crate::builtin::{self, BuiltinDeps, BuiltinModel};
use crate::config::Config;
use crate::data_dir::DataDirLock;
use crate::http::accept::{self, ConnectionLimits};
use crate::http::{self, AppState};
use crate::llm::LlmError;
use crate::llm::ProviderKind;
use crate::llm::anthropic::AnthropicProvider;
use crate::llm::metered::MeteredProvider;
use crate::llm::openai::OpenAiProvider;
use crate::llm::pricing::Pricing;
use crate::llm::responses::ResponsesProvider;
use crate::llm::router::{DEFAULT_PROVIDER, ModelRoute, ModelRouter};
use crate::metrics::Metrics;
use crate::plugin::PluginTool;
use crate::sandbox::Sandbox;
use crate::session::Sessions;
use crate::session::hub::SessionsConfig;
use crate::store::{self, Store};
use crate::tasks::tools::{CheckBackgroundTasks, ReadTaskOutput};
use crate::tools::policy::provider_policy_for;
use crate::tools::{RegistryError, Tool, ToolRegistry, Workspace};

/// Why the server could not start; `main` prints it on one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// `[instructions] file` cannot be read.
    #[error("{0}")]
    Instructions(#[from] crate::session::instructions::InstructionsError),
    /// An agent profile names a model no provider serves.
    #[error("agents {0:?}: {1}")]
    Profile(String, String),
    /// A directory could not be created.
    #[error("cannot create {what} {path}: {source}")]
    Directory {
        /// Which directory.
        what: &'static str,
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database could not be opened or migrated.
    #[error("database: {0}")]
    Database(#[from] store::StoreError),
    /// A tool could not be registered.
    #[error("tools: {0}")]
    Tools(#[from] RegistryError),
    /// The model client could not be built from the `[llm]` settings.
    #[error("llm: {0}")]
    Llm(#[from] LlmError),
    /// The sandbox cannot confine commands as configured.
    #[error("{0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// A `[[plugins]]` entry is unusable.
    #[error("plugin {0}: {1}")]
    Plugin(String, String),
    /// `[cluster] enabled = true` over a database the other nodes cannot share.
    #[error(
        "cluster.enabled needs PostgreSQL: server.database_url is {0}; set a postgres:// URL \
         shared by every node, or cluster.enabled = false"
    )]
    ClusterNeedsPostgres(&'static str),
    /// Another process holds the data directory, or it cannot be locked.
    #[error("{0}")]
    DataDir(#[from] crate::data_dir::DataDirError),
}

/// The model and limits turns run with, when a model is configured.
fn agent_settings(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<AgentSettings>>, StartupError> {
    let (Some(model), true) = (&config.llm.model, config.llm.is_configured()) else {
        return Ok(None);
    };
    let router = Arc::new(model_router(config)?);
    let pricing = Pricing::with_catalog(config.llm.pricing.clone());
    for info in router.models(&pricing, config.llm.context_window) {
        if !info.priced {
            tracing::warn!(model = %info.id, "model has no price: its calls count toward no budget ([llm.pricing])");
        }
    }
    Ok(Some(Arc::new(AgentSettings {
        provider: Arc::new(MeteredProvider::new(
            Arc::clone(&router) as Arc<dyn crate::llm::Provider>,
            Arc::clone(metrics),
        )),
        models: router,
        model: model.clone(),
        max_tokens: config.llm.max_tokens,
        context_window: pricing.context_window(model, config.llm.context_window),
        context_limit: config.llm.context_window,
        pricing,
        budget_usd: config.budget.session_usd,
        max_iterations: config.llm.max_iterations,
        turn_timeout: Duration::from_secs(config.llm.turn_timeout_secs),
        max_sub_agents: config.llm.max_sub_agents,
        max_repeated_calls: config.agent.max_repeated_calls,
        usd_per_minute: (config.budget.usd_per_minute > 0.0)
            .then_some(config.budget.usd_per_minute),
        compact_at: config.llm.compact_at,
        reasoning_effort: None,
    })))
}

/// Every configured provider, by name: the single `[llm] base_url` form as `default`, then
/// each `[[llm.providers]]` entry with the adapter of its kind.
fn model_router(config: &Config) -> Result<ModelRouter, StartupError> {
    let mut routes = Vec::new();
    if config.llm.base_url.is_some() {
        routes.push(ModelRoute {
            name: DEFAULT_PROVIDER.to_string(),
            kind: ProviderKind::OpenAiChat,
            provider: Arc::new(OpenAiProvider::new(&config.llm)?),
            models: Vec::new(),
            vendor: crate::llm::catalog::vendor_of(
                &config.llm.provider,
                config.llm.base_url.as_deref().unwrap_or_default(),
            ),
        });
    }
    for entry in &config.llm.providers {
        let provider: Arc<dyn crate::llm::Provider> = match entry.kind {
            ProviderKind::OpenAiChat => Arc::new(OpenAiProvider::new(entry)?),
            ProviderKind::OpenAiResponses => Arc::new(ResponsesProvider::new(entry)?),
            ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(entry)?),
        };
        routes.push(ModelRoute {
            name: entry.name.clone(),
            kind: entry.kind,
            provider,
            models: entry.models.clone(),
            vendor: crate::llm::catalog::vendor_of(&entry.name, &entry.base_url),
        });
    }
    let default = config.llm.model.clone().unwrap_or_default();
    Ok(ModelRouter::new(routes, default))
}

/// A server that has finished starting: database open, tools registered, router built.
pub struct Server {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    state: AppState,
    cancel: CancellationToken,
    tracker: TaskTracker,
    limits: ConnectionLimits,
    /// Held until the server is dropped: no other process starts on this data directory.
    _data_dir: DataDirLock,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

/// The server-wide registry every session snapshots: built-ins, then the config's limits,
/// marks and policies.
pub fn base_registry(
    config: &Config,
    store: &Arc<dyn Store>,
    agent: Option<&AgentSettings>,
    extra: Vec<Arc<dyn Tool>>,
    command_env: &Arc<crate::sandbox::command_env::CommandEnv>,
) -> Result<ToolRegistry, StartupError> {
    let tools = &config.tools;
    let deps = BuiltinDeps {
        model: agent.map(|agent| BuiltinModel {
            provider: Arc::clone(&agent.provider),
            model: agent.model.clone(),
            pricing: agent.pricing.clone(),
            max_tokens: agent.max_tokens,
        }),
        workspace: Workspace::with_env(&config.server.workspace, Arc::clone(command_env)),
        ..BuiltinDeps::at(&config.server.workspace, &tools.permissions())
    };
    let mut registry = builtin::registry(&deps)?;
    registry.register(Arc::new(ReadTaskOutput::new(Arc::clone(store))))?;
    registry.register(Arc::new(CheckBackgroundTasks::new(Arc::clone(store))))?;
    registry.pin_marked_base_tools();
    let workspace = registry
        .workspace()
        .cloned()
        .unwrap_or_else(|| Workspace::with_env(&config.server.workspace, Arc::clone(command_env)));
    for plugin in &config.plugins {
        if registry.contains(&plugin.name) {
            return Err(StartupError::Plugin(
                plugin.name.clone(),
                "a tool of that name exists already".into(),
            ));
        }
        let tool = PluginTool::new(plugin, Arc::clone(&workspace))
            .map_err(|err| StartupError::Plugin(plugin.name.clone(), err.to_string()))?;
        registry.register(Arc::new(tool))?;
        if plugin.spawn_only {
            registry.mark_spawn_only(&plugin.name);
        }
    }
    for tool in extra {
        registry.register(tool)?;
    }
    registry.configure_lifecycle(
        tools.max_active,
        tools.idle_threshold,
        tools.base_tools.clone(),
    );
    registry.set_max_args_bytes(tools.max_args_bytes);
    for name in &tools.spawn_only {
        registry.mark_spawn_only(name);
    }
    if !config.tool_policy.is_empty() {
        registry.apply_policy(config.tool_policy.clone());
    }
    let model = config.llm.model.as_deref().unwrap_or_default();
    registry.set_provider_policy(
        provider_policy_for(&config.tool_policy_by_provider, model, &config.llm.provider).cloned(),
    );
    registry.set_context_filter(tools.context_tags.clone());
    registry.defer_groups_if_crowded(&tools.defer_groups);
    Ok(registry)
}

fn create_dir(what: &'static str, path: &Path) -> Result<(), StartupError> {
    std::fs::create_dir_all(path).map_err(|source| StartupError::Directory {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// Ends, in the log, every turn, call, approval and task the last process left open, so no
/// client replays a turn that never ends. Only one node runs here: nothing else is live.
async fn end_open_work(store: &dyn store::Store, metrics: &Metrics) -> Result<(), StartupError> {
    use crate::session::open_work::{self, Ending};
    let (mut sessions, mut events) = (0usize, 0usize);
    for (session_id, after_seq) in store.sessions_with_open_work().await? {
        let ended =
            open_work::end_open_work(store, &session_id, after_seq, Ending::ServerRestarted)
                .await?;
        if ended.events > 0 {
            tracing::warn!(%session_id, events = ended.events, "ended work the last stop left open");
            sessions += 1;
            events += ended.events;
        }
        if ended.turn {
            metrics.record_turn(Ending::ServerRestarted.as_str());
        }
    }
    if sessions > 0 {
        tracing::warn!(
            sessions,
            events,
            "turns, calls and approvals left open by the last stop ended as server_restarted"
        );
    }
    Ok(())
}

/// Applies `[retention]` and collects unnamed checkpoint contents once a day (the first time a
/// minute after start), until `cancel`.
fn spawn_daily_sweep(
    sessions: &Sessions,
    policy: &crate::session::retention::RetentionConfig,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) {
    let (sessions, policy, cancel) = (sessions.clone(), policy.clone(), cancel.clone());
    tracker.spawn(async move {
        let mut next = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep_until(next) => {}
            }
            next += crate::session::retention::SWEEP_EVERY;
            match sessions.sweep(&policy).await {
                Ok(report) => tracing::info!(%report, "retention sweep"),
                Err(err) => tracing::warn!(%err, "retention sweep failed; trying again tomorrow"),
            }
        }
    });
}

pub mod acp;
pub mod exec;
pub mod transfer;

impl Server {
    /// Holds the data directory ([`DataDirLock`]) for the server's life, creates the data and
    /// workspace directories, opens and migrates the database, marks
    /// tasks that were running at the last stop as failed, and builds the router.
    pub async fn start(config: Config) -> Result<Self, StartupError> {
        Self::start_with_tools(config, Vec::new()).await
    }

    /// [`Server::start`] with tools of the embedder's registered beside the built-ins, under
    /// the same policies.
    pub async fn start_with_tools(
        config: Config,
        extra_tools: Vec<Arc<dyn Tool>>,
    ) -> Result<Self, StartupError> {
        // First of all: a second process must not recover (end the turns, fail the tasks of)
        // a live server's store, nor touch its files.
        let data_dir = DataDirLock::acquire(&config.server.data_dir)?;
        let command_env = Arc::new(config.command_env());
        if !config.server.bind.ip().is_loopback()
            && config.server.auth_token.is_none()
            && config.server.users.is_empty()
        {
            // Allowed (a proxy may guard it), but whoever reaches the port can run shell.
            tracing::warn!(
                bind = %config.server.bind,
                "listening beyond loopback without auth_token or [[server.users]]: anyone who \
                 can reach this address can use every tool, shell included"
            );
        }
        let fd_limit = accept::raise_fd_limit();
        let limits = ConnectionLimits::new(&config.server, fd_limit);
        tracing::info!(
            fd_limit,
            max_connections = limits.max_connections,
            health_allowance = limits.health_allowance,
            "connection limits"
        );
        if config.server.max_connections != 0
            && (limits.max_connections + limits.health_allowance) as u64 > fd_limit
        {
            tracing::warn!(
                fd_limit,
                max_connections = limits.max_connections,
                "server.max_connections exceeds the open-file limit; accepts will fail before it is reached"
            );
        }
        tracing::info!(
            workspace = %config.server.workspace.display(),
            data_dir = %config.server.data_dir.display(),
            "directories"
        );
        match (&config.llm.base_url, &config.llm.model) {
            (Some(base_url), Some(model)) => tracing::info!(
                %model,
                %base_url,
                api_key = if config.llm.api_key.is_some() { "set" } else { "not set" },
                "model configured"
            ),
            _ => tracing::info!(
                "no model is configured: turns answer llm_not_configured, tools still work \
                 through tool/invoke (set llm.base_url and llm.model, or AGENTD_LLM_BASE_URL \
                 and AGENTD_LLM_MODEL)"
            ),
        }
        create_dir("data directory", &config.server.data_dir)?;
        create_dir("data directory", &config.server.data_dir.join("tasks"))?;
        create_dir("workspace", &config.server.workspace)?;
        // Writes go through a temp file renamed over the target; a crash between the two leaves
        // one behind. On one node none is in flight now; cluster nodes share the workspace, so
        // there only old ones go.
        let older_than = if config.cluster.enabled {
            Duration::from_secs(600)
        } else {
            Duration::ZERO
        };
        let workspace = config.server.workspace.clone();
        let removed = tokio::task::spawn_blocking(move || {
            crate::fs_safe::remove_stale_temp_files(&workspace, older_than)
        })
        .await
        .unwrap_or_default();
        if removed > 0 {
            tracing::info!(removed, "removed temp files of writes a stop interrupted");
        }
        let sandbox = Sandbox::start(
            &config.sandbox,
            &config.server.data_dir,
            config.file.as_deref(),
        )
        .await?;
        if sandbox.is_none() {
            let level_note =
                "[sandbox] mode = \"off\": commands run unconfined, as the server's user";
            if config.server.users.is_empty() {
                tracing::info!("{level_note}");
            } else {
                tracing::warn!(
                    "{level_note}; every user's commands can read and change the others' files"
                );
            }
        }
        let metrics = Arc::new(Metrics::new());
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let url = config.server.database_url();
        if config.cluster.enabled
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            let scheme = if url.starts_with("sqlite") {
                "sqlite"
            } else {
                "not a postgres:// URL"
            };
            return Err(StartupError::ClusterNeedsPostgres(scheme));
        }
        let connected = store::connect(&url).await?;
        let (store, writer, cluster) = if config.cluster.enabled {
            // Each actor writes through its own fence; other nodes' tasks are theirs to end.
            let settings = crate::cluster::ClusterSettings {
                node_id: config.cluster.node_id(),
                advertise_url: config.cluster.advertise_url.clone(),
                lease_ttl: Duration::from_secs(config.cluster.lease_secs),
                secret: config.cluster.secret.clone(),
                database_url: url.clone(),
            };
            let cluster = crate::cluster::Cluster::join(
                settings,
                Arc::clone(&metrics),
                cancel.clone(),
                &tracker,
            )
            .await?;
            let writer: Arc<dyn store::Writer> = connected.clone();
            (connected, writer, Some(cluster))
        } else {
            let failed = connected
                .fail_running_tasks("agentd stopped while the task was running")
                .await?;
            if failed > 0 {
                tracing::warn!(failed, "tasks left running by the last stop marked failed");
            }
            end_open_work(connected.as_ref(), &metrics).await?;
            let writer = connected
                .clone()
                .group_commit(metrics.event_batches.clone());
            (connected, writer, None)
        };
        let agent = agent_settings(&config, &metrics)?;
        for profile in &config.agents {
            if let (Some(model), Some(agent)) = (&profile.model, agent.as_deref()) {
                agent.models.resolve(model).map_err(|unknown| {
                    StartupError::Profile(profile.name.clone(), unknown.to_string())
                })?;
            }
        }
        let mcp = crate::mcp::start_servers(
            &config.mcp_servers,
            &config.server.data_dir,
            sandbox.as_ref(),
            &command_env,
        )
        .await;
        let mut extra_tools = extra_tools;
        for server in &mcp {
            extra_tools.extend(server.tools());
        }
        let mut base = base_registry(&config, &store, agent.as_deref(), extra_tools, &command_env)?;
        for server in mcp.iter().filter(|server| server.defers()) {
            base.defer_group(&format!("group:mcp:{}", server.name()));
        }
        let tool_groups = base.tool_groups();
        let base = Arc::new(base);
        let mut unsupported = vec!["image_generation".to_string()];
        if config.tools.web_search_url.is_none() {
            unsupported.push("web_search".to_string());
        }
        let checkpoints_dir = config.server.data_dir.join("checkpoints");
        let checkpoints =
            crate::checkpoint::CheckpointStore::open(&checkpoints_dir, config.checkpoints.limits())
                .map_err(|source| StartupError::Directory {
                    what: "checkpoints",
                    path: checkpoints_dir.display().to_string(),
                    source,
                })?;
        let sessions = Sessions::new(
            Arc::clone(&store),
            writer,
            base,
            SessionsConfig {
                workspace: config.server.workspace.clone(),
                per_user_workspaces: !config.server.users.is_empty(),
                idle_unload: Duration::from_secs(config.server.idle_unload_secs),
                unsupported,
                llm_configured: config.llm.is_configured(),
                agent,
                tasks_dir: config.server.data_dir.join("tasks"),
                sandbox,
                command_env,
                max_inflight_per_session: config.server.max_inflight_per_session,
                mcp,
                approval_rules: crate::tools::approval::ApprovalRules::new(
                    std::iter::once(&config.tool_policy).chain(provider_policy_for(
                        &config.tool_policy_by_provider,
                        config.llm.model.as_deref().unwrap_or_default(),
                        &config.llm.provider,
                    )),
                    tool_groups,
                ),
                approval_timeout: Duration::from_secs(config.tools.approval_timeout_secs),
                mcp_per_session: config
                    .mcp_servers
                    .iter()
                    .filter(|server| server.scope == crate::mcp::Scope::Session)
                    .cloned()
                    .collect(),
                cluster,
                max_sessions_per_user: config.server.max_sessions_per_user,
                session_creates_per_minute: config.server.session_creates_per_minute,
                instructions: config
                    .instructions
                    .load()
                    .map_err(StartupError::Instructions)?,
                hooks: config.hooks.clone().into(),
                profiles: crate::session::profiles::Profiles::new(config.agents.clone()),
                checkpoints: Some(Arc::new(checkpoints)),
                disk: config.disk_quotas().map(Arc::new),
            },
            Arc::clone(&metrics),
            cancel.clone(),
            tracker.clone(),
        );
        // Also when nothing is retained for a limited time: the sweep drops the checkpoint
        // contents nothing names any more.
        spawn_daily_sweep(&sessions, &config.retention, &cancel, &tracker);
        let config = Arc::new(config);
        let state = AppState::new(Arc::clone(&config), sessions, metrics, cancel.clone());
        Ok(Self {
            config,
            store,
            state,
            cancel,
            tracker,
            limits,
            _data_dir: data_dir,
        })
    }

    /// The router, for tests that drive it without a socket.
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// Serves until `shutdown` resolves, then stops accepting, closes WebSockets with 1001,
    /// cancels running work, waits up to the grace period and closes the database.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let cancel = self.cancel.clone();
        let stop = cancel.clone();
        let grace = Duration::from_secs(self.config.server.shutdown_grace_secs);
        let sessions = self
            .config
            .cluster
            .enabled
            .then(|| self.state.sessions().clone());
        tokio::spawn(async move {
            shutdown.await;
            // A cluster node hands its sessions over before its connections close, so its
            // clients reconnect to a node that can serve them at once.
            if let Some(sessions) = sessions {
                sessions.drain(grace).await;
            }
            stop.cancel();
        });
        accept::serve(
            listener,
            self.router(),
            http::overflow_router(self.state.clone()),
            self.limits,
            cancel,
            grace,
        )
        .await;
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("work still running after the grace period; abandoning it");
        }
        self.store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Starts and serves in one call; `run(config, listener, shutdown)` for tests and embedders.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let server = Server::start(config).await?;
    server.serve(listener, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(registry: &ToolRegistry) -> Vec<String> {
        let mut names: Vec<String> = registry.lifecycle().base_tools.iter().cloned().collect();
        names.sort_unstable();
        names
    }

    async fn base(toml: &str) -> ToolRegistry {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::from_toml(toml).unwrap();
        config.server.workspace = dir.path().to_path_buf();
        let store = store::connect("sqlite::memory:").await.unwrap();
        base_registry(&config, &store, None, Vec::new(), &Arc::default()).unwrap()
    }

    #[tokio::test]
    async fn the_tools_marks_make_the_contracts_base_set_and_the_config_replaces_it() {
        let registry = base("").await;
        assert_eq!(
            pinned(&registry),
            [
                "activate_tools",
                "apply_patch",
                "edit_file",
                "glob",
                "grep",
                "list_dir",
                "read_file",
                "read_task_output",
                "shell",
                "tool_search",
                "write_file"
            ]
        );
        let registry = base("[tools]\nbase_tools = [\"grep\", \"web_fetch\"]\n").await;
        assert_eq!(pinned(&registry), ["grep", "web_fetch"]);
    }
}
