//! Start-up and shutdown: everything between a parsed [`Config`] and a serving router.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::session::Sessions;
use crate::session::hub::SessionsConfig;
use crate::store::{self, Store};
use crate::tools::builtin::with_builtins;
use crate::tools::policy::provider_policy_for;
use crate::tools::{RegistryError, ToolRegistry};

/// Why the server could not start; `main` prints it on one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
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
}

/// A server that has finished starting: database open, tools registered, router built.
pub struct Server {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    state: AppState,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

/// The server-wide registry every session snapshots: built-ins, then the config's limits,
/// marks and policies.
pub fn base_registry(config: &Config) -> Result<ToolRegistry, RegistryError> {
    let tools = &config.tools;
    let mut registry = with_builtins(&config.server.workspace, &tools.permissions())?;
    registry.configure_lifecycle(
        tools.max_active,
        tools.idle_threshold,
        tools.base_tools.iter().cloned(),
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

impl Server {
    /// Creates the data and workspace directories, opens and migrates the database, marks
    /// tasks that were running at the last stop as failed, and builds the router.
    pub async fn start(config: Config) -> Result<Self, StartupError> {
        create_dir("data directory", &config.server.data_dir)?;
        create_dir("data directory", &config.server.data_dir.join("tasks"))?;
        create_dir("workspace", &config.server.workspace)?;
        let store = store::connect(&config.server.database_url()).await?;
        let failed = store
            .fail_running_tasks("agentd stopped while the task was running")
            .await?;
        if failed > 0 {
            tracing::warn!(failed, "tasks left running by the last stop marked failed");
        }
        if !config.plugins.is_empty() {
            tracing::warn!(
                plugins = config.plugins.len(),
                "[[plugins]] are not registered yet: plugin tools arrive in a later version"
            );
        }
        if config.budget.session_usd.is_some() {
            tracing::warn!("[budget] is not enforced yet: it arrives with the agent loop");
        }
        let base = Arc::new(base_registry(&config)?);
        let metrics = Arc::new(Metrics::new());
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut unsupported = vec!["image_generation".to_string()];
        if config.tools.web_search_url.is_none() {
            unsupported.push("web_search".to_string());
        }
        let sessions = Sessions::new(
            Arc::clone(&store),
            base,
            SessionsConfig {
                workspace: config.server.workspace.clone(),
                per_user_workspaces: !config.server.users.is_empty(),
                idle_unload: Duration::from_secs(config.server.idle_unload_secs),
                unsupported,
                llm_configured: config.llm.is_configured(),
            },
            Arc::clone(&metrics),
            cancel.clone(),
            tracker.clone(),
        );
        let config = Arc::new(config);
        let state = AppState::new(Arc::clone(&config), sessions, metrics, cancel.clone());
        Ok(Self {
            config,
            store,
            state,
            cancel,
            tracker,
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
        tokio::spawn(async move {
            shutdown.await;
            stop.cancel();
        });
        let grace = Duration::from_secs(self.config.server.shutdown_grace_secs);
        let serving = axum::serve(listener, self.router())
            .with_graceful_shutdown(cancel.clone().cancelled_owned());
        let outcome = tokio::select! {
            outcome = serving => outcome,
            () = async { cancel.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!("connections still open after the grace period; closing");
                Ok(())
            }
        };
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("work still running after the grace period; abandoning it");
        }
        self.store.close().await;
        tracing::info!("stopped");
        outcome
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
