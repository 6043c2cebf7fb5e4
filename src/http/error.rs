//! The one error shape every REST route answers with: `{"error":{"code","message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::session::SessionError;
use crate::store::StoreError;

/// An error a REST route answers with; 5xx messages stay generic, details go to the log.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Missing or wrong bearer token.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// The WebSocket `Origin` is not allowed.
    #[error("origin not allowed")]
    ForbiddenOrigin,
    /// A server without a token on loopback refuses requests addressed to another host name.
    #[error(
        "this server only answers requests addressed to localhost; set an auth token to serve other host names"
    )]
    ForbiddenHost,
    /// No such resource for this caller.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The route exists but not with this method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// A dependency (the database) is not ready.
    #[error("{0}")]
    Unavailable(String),
    /// Over a limit (connections, calls in flight); retry later.
    #[error("{0}")]
    Overloaded(String),
    /// Over a per-user quota (stored sessions, sessions made per minute).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The route took longer than its time limit to answer.
    #[error("the request took longer than {0:?}; retry later")]
    Timeout(std::time::Duration),
    /// Something broke on our side; the message is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::ForbiddenOrigin => (StatusCode::FORBIDDEN, "forbidden_origin"),
            Self::ForbiddenHost => (StatusCode::FORBIDDEN, "forbidden_host"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Self::QuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Self::Timeout(_) => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if let Self::Internal(detail) = &self {
            tracing::error!(%detail, "request failed");
        }
        let body = json!({"error": {"code": code, "message": self.to_string()}});
        (status, Json(body)).into_response()
    }
}

/// `Query<T>` whose rejection is our error shape rather than axum's plain text.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        Self::Internal(err.to_string())
    }
}

impl From<SessionError> for ApiError {
    fn from(err: SessionError) -> Self {
        match err {
            SessionError::UnknownSession(id) => Self::NotFound(format!("unknown session {id}")),
            SessionError::UnknownTask(id) => Self::NotFound(format!("unknown task {id}")),
            SessionError::InvalidParams(message) => Self::BadRequest(message),
            SessionError::ActorGone => Self::Unavailable("the session stopped; retry".into()),
            SessionError::Overloaded(_) => Self::Overloaded(err.to_string()),
            SessionError::QuotaExceeded(message) => Self::QuotaExceeded(message),
            SessionError::StorageUnavailable(_) => Self::Unavailable(err.to_string()),
            SessionError::Store(err) => Self::Internal(err.to_string()),
            SessionError::Remote { kind, message } => match kind {
                "unknown_session" | "unknown_task" => Self::NotFound(message),
                "session_unavailable" => Self::Unavailable(message),
                "overloaded" => Self::Overloaded(message),
                "quota_exceeded" => Self::QuotaExceeded(message),
                "storage_unavailable" => Self::Unavailable(message),
                "internal" => Self::Internal(message),
                _ => Self::BadRequest(message),
            },
            other => Self::BadRequest(other.to_string()),
        }
    }
}
