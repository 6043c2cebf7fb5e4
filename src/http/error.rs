//! The one error shape every REST route answers with: `{"error":{"kind","code","message"}}`,
//! where `kind` is the vocabulary the WebSocket's `data.kind` uses (`unknown_session`,
//! `turn_in_progress`, …) and `code` the coarser class of the first version, kept for its
//! clients; both, and the status, come from [`ErrorKind`]'s table.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error_kind::ErrorKind;
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
    /// A session's refusal, with the kind the WebSocket gives it.
    #[error("{message}")]
    Session {
        /// The kind, as in the WebSocket's `data.kind`.
        kind: ErrorKind,
        /// What to tell the caller.
        message: String,
    },
}

impl ApiError {
    /// The error's kind, the WebSocket's vocabulary where both have the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unauthorized => ErrorKind::Unauthorized,
            Self::ForbiddenOrigin => ErrorKind::ForbiddenOrigin,
            Self::ForbiddenHost => ErrorKind::ForbiddenHost,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::BadRequest(_) => ErrorKind::InvalidParams,
            Self::MethodNotAllowed => ErrorKind::MethodNotAllowed,
            Self::Unavailable(_) => ErrorKind::Unavailable,
            Self::Overloaded(_) => ErrorKind::Overloaded,
            Self::QuotaExceeded(_) => ErrorKind::QuotaExceeded,
            Self::Timeout(_) => ErrorKind::Timeout,
            Self::Internal(_) => ErrorKind::Internal,
            Self::Session { kind, .. } => *kind,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let row = self.kind().row();
        let status = StatusCode::from_u16(row.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if let Self::Internal(detail) = &self {
            tracing::error!(%detail, "request failed");
        }
        let message = match &self {
            // A stored failure's detail is for the log, not the caller.
            Self::Session {
                kind: ErrorKind::Internal,
                message,
            } => {
                tracing::error!(detail = %message, "request failed");
                "internal error".to_string()
            }
            other => other.to_string(),
        };
        let body = json!({"error": {"kind": row.word, "code": row.code, "message": message}});
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
        let kind = err.kind();
        let message = match err {
            SessionError::UnknownSession(id) => format!("unknown session {id}"),
            SessionError::UnknownTask(id) => format!("unknown task {id}"),
            SessionError::InvalidParams(message) | SessionError::Remote { message, .. } => message,
            SessionError::ActorGone => "the session stopped; retry".into(),
            SessionError::Store(err) => return Self::Internal(err.to_string()),
            other => other.to_string(),
        };
        Self::Session { kind, message }
    }
}

/// A JSON request body read as `T`; only an object is taken (serde would also read a struct
/// from an array of its fields, which no client means), else 400 `invalid_params` saying why.
pub fn object_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|err| ApiError::BadRequest(format!("body: {err}")))?;
    if !value.is_object() {
        return Err(ApiError::BadRequest(
            "body: a JSON object is expected".into(),
        ));
    }
    serde_json::from_value(value).map_err(|err| ApiError::BadRequest(format!("body: {err}")))
}
