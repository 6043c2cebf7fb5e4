//! The HTTP surface: the router, the state every route shares, and the routes themselves.
//!
//! - [`accept`]: the accept loop — connection caps, timeouts, the health allowance.
//! - [`app`]: `/` and `/app/{file}`, the AppUI embedded in the binary.
//! - [`ws`]: `GET /api/ws`, the JSON-RPC WebSocket.
//! - [`rest`]: the JSON routes under `/api/`.
//! - [`mcp`]: `/mcp`, the session's tools over the Model Context Protocol.
//! - [`health`]: `/healthz`, `/readyz`, `/metrics`, `/openapi.yaml`.
//! - [`cluster`]: `/cluster/call`, requests forwarded by the other nodes of a cluster.
//! - [`auth`]: bearer tokens and the `Origin` rule.
//! - [`error`]: the one JSON error shape.
//! - [`layers`]: what wraps every route: request ids, tracing, timing, security headers,
//!   panics, compression, the REST time limit.

pub mod accept;
pub mod app;
pub mod auth;
pub mod cluster;
pub mod error;
pub mod health;
pub mod layers;
pub mod mcp;
pub mod rest;
pub mod turns;
pub mod ws;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::session::Sessions;
use auth::Auth;
use error::ApiError;

/// Every route the server answers, as (method, path) in axum's syntax; `openapi.yaml` must
/// describe exactly these (a test checks).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/app/{file}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.yaml"),
    ("GET", "/api/ws"),
    ("GET", "/api/sessions"),
    ("POST", "/api/sessions"),
    ("GET", "/api/sessions/{id}"),
    ("DELETE", "/api/sessions/{id}"),
    ("POST", "/api/sessions/import"),
    ("POST", "/api/sessions/{id}/turns"),
    ("POST", "/api/sessions/{id}/merge"),
    ("POST", "/api/sessions/{id}/discard"),
    ("GET", "/api/sessions/{id}/export"),
    ("GET", "/api/sessions/{id}/events"),
    ("GET", "/api/sessions/{id}/messages"),
    ("GET", "/api/sessions/{id}/tools"),
    ("GET", "/api/sessions/{id}/files"),
    ("GET", "/api/sessions/{id}/tasks"),
    ("GET", "/api/sessions/{id}/cost"),
    ("GET", "/api/sessions/{id}/mcp"),
    ("GET", "/api/tasks/{task_id}"),
    ("POST", "/api/tasks/{task_id}/cancel"),
    ("GET", "/api/tasks/{task_id}/output"),
    ("GET", "/api/tools"),
    ("POST", "/mcp"),
    ("GET", "/mcp"),
    ("DELETE", "/mcp"),
    ("POST", "/cluster/call"),
];

struct AppInner {
    config: Arc<Config>,
    sessions: Sessions,
    metrics: Arc<Metrics>,
    auth: Auth,
    shutdown: CancellationToken,
    connection_ids: AtomicU64,
    mcp_owners: mcp::McpOwners,
    /// Imports being read; each holds up to its body in typed records.
    imports: tokio::sync::Semaphore,
}

/// What every route shares; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<AppInner>,
}

impl AppState {
    /// State over the given parts; `shutdown` fires when the server stops.
    pub fn new(
        config: Arc<Config>,
        sessions: Sessions,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Self {
        let auth = Auth::from_config(&config);
        Self {
            inner: Arc::new(AppInner {
                config,
                sessions,
                metrics,
                auth,
                shutdown,
                connection_ids: AtomicU64::new(1),
                mcp_owners: mcp::McpOwners::default(),
                imports: tokio::sync::Semaphore::new(IMPORTS_AT_ONCE),
            }),
        }
    }

    /// Who opened each `/mcp` session.
    pub(crate) fn mcp_owners(&self) -> &mcp::McpOwners {
        &self.inner.mcp_owners
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The session directory.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// The model settings turns run with, when a model is configured.
    pub fn agent(&self) -> Option<&crate::agent::AgentSettings> {
        self.inner.sessions.agent()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The metrics, to share with a layer.
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.inner.metrics)
    }

    /// The authentication rule.
    pub fn auth(&self) -> &Auth {
        &self.inner.auth
    }

    /// Fires when the server is shutting down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// Waits for room to read an import: at most [`IMPORTS_AT_ONCE`] are read at a time, so
    /// however many connections send one, the server holds at most that many bodies.
    pub async fn import_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.inner.imports.acquire().await.ok()
    }

    /// A fresh id for a WebSocket connection.
    pub fn next_connection_id(&self) -> u64 {
        self.inner.connection_ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// The largest export `POST /api/sessions/import` takes.
pub const MAX_IMPORT_BYTES: usize = 256 * 1024 * 1024;

/// Imports read at once; the others wait their turn before a byte of their body is read, so
/// at the connection limit the server still holds at most this many bodies (each as typed
/// records of about its own size).
pub const IMPORTS_AT_ONCE: usize = 2;

/// The whole application as a router, drivable without a socket.
pub fn router(state: AppState) -> Router {
    let rest = Router::new()
        .route(
            "/api/sessions",
            get(rest::list_sessions).post(rest::create_session),
        )
        .route(
            "/api/sessions/{id}",
            get(rest::get_session).delete(rest::delete_session),
        )
        .route("/api/sessions/import", post(rest::import_session))
        .route("/api/sessions/{id}/export", get(rest::export_session))
        .route("/api/sessions/{id}/events", get(rest::events))
        .route("/api/sessions/{id}/messages", get(rest::messages))
        .route("/api/sessions/{id}/tools", get(rest::session_tools))
        .route("/api/sessions/{id}/files", get(rest::download_file))
        .route("/api/sessions/{id}/tasks", get(rest::session_tasks))
        .route("/api/sessions/{id}/cost", get(rest::cost))
        .route("/api/sessions/{id}/mcp", get(rest::session_mcp))
        .route("/api/tasks/{task_id}", get(rest::task))
        .route("/api/tasks/{task_id}/cancel", post(rest::cancel_task))
        .route("/api/tasks/{task_id}/output", get(rest::task_output))
        .route("/api/tools", get(rest::tools_catalog));
    let routes = Router::new()
        .route("/", get(app::index))
        .route("/app/{file}", get(app::asset))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.yaml", get(health::openapi))
        .route("/api/ws", get(ws::upgrade))
        .route("/api/sessions/{id}/turns", post(turns::start_turn))
        .route("/api/sessions/{id}/merge", post(rest::merge_worktree))
        .route("/api/sessions/{id}/discard", post(rest::discard_worktree))
        .merge(layers::with_timeout(rest, layers::REST_TIMEOUT))
        .route(crate::cluster::forward::CALL_PATH, post(cluster::call))
        .route_service(
            "/mcp",
            tower::ServiceBuilder::new()
                .layer(middleware::from_fn_with_state(
                    state.clone(),
                    mcp::authenticate,
                ))
                .service(mcp::service(state.clone())),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    layers::around_every_route(routes, state.shared_metrics()).with_state(state)
}

/// What connections past `server.max_connections` are served: `/healthz` and `/readyz`, and
/// 503 `overloaded` for everything else (the WebSocket included).
pub fn overflow_router(state: AppState) -> Router {
    let routes = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(overloaded);
    layers::around_every_route(routes, state.shared_metrics()).with_state(state)
}

async fn overloaded() -> ApiError {
    ApiError::Overloaded("the server is at its connection limit; retry later".into())
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// An instant as RFC 3339 UTC, the form of every `*_at` field.
pub(crate) fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}
