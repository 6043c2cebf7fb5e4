//! The public routes besides the AppUI: liveness, readiness, metrics and the API description.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::json;

use super::AppState;
use super::error::ApiError;

/// The API description, kept true by a test against [`super::ROUTES`].
pub const OPENAPI_YAML: &str = include_str!("../../openapi.yaml");

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: the process is up and the database answers; also says how commands are
/// confined.
pub async fn readyz(State(app): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    // A stopping node (a cluster node draining included) should get no new clients.
    if app.shutdown().is_cancelled() || app.sessions().is_draining() {
        return Err(ApiError::Unavailable("the server is stopping".into()));
    }
    // A store that answers but cannot write (a full disk) would acknowledge nothing.
    if app.sessions().write_health().is_failing() {
        return Err(ApiError::Unavailable(
            "the store cannot write; work resumes once it can".into(),
        ));
    }
    match app.sessions().store().ping().await {
        Ok(()) => Ok(Json(json!({
            "status": "ready",
            "database": "ok",
            "sandbox": app.sessions().sandbox_report(),
        }))),
        Err(err) => {
            tracing::warn!(%err, "readiness check failed");
            Err(ApiError::Unavailable("database not reachable".into()))
        }
    }
}

/// The content type of what the Prometheus client library writes: OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`: OpenMetrics text, which Prometheus reads (and says it accepts).
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, OPENMETRICS)],
        app.metrics().render(),
    )
}

/// `GET /openapi.yaml`.
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml; charset=utf-8")],
        OPENAPI_YAML,
    )
}
