//! JSON-RPC 2.0 framing: the envelope a message is read into, error answers and their codes,
//! and the answer frames written back.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error_kind::ErrorKind;
use crate::session::{Outbound, SessionError};

/// A JSON-RPC error answer: its code comes from its kind's row in [`ErrorKind`]'s table.
#[derive(Debug)]
pub(crate) struct RpcError {
    kind: ErrorKind,
    message: String,
}

impl RpcError {
    /// An error answer of `kind` saying `message`.
    pub(super) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The JSON-RPC error code.
    pub(super) fn code(&self) -> i64 {
        self.kind.row().rpc
    }

    /// The `data.kind`.
    pub(super) fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// `invalid_params`, saying what was wrong with them.
    pub(super) fn params(err: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidParams, err.to_string())
    }
}

impl From<SessionError> for RpcError {
    fn from(err: SessionError) -> Self {
        if let SessionError::Store(detail) = &err {
            tracing::error!(%detail, "request failed on storage");
        }
        Self::new(err.kind(), err.to_string())
    }
}

/// A request's `id` exactly as the client wrote it, echoed byte for byte: a 30-digit integer
/// stays that integer, where a parsed [`Value`] would have made it a float.
pub(super) type RequestId = Box<RawValue>;

/// One incoming message, read without interpreting its `id`.
#[derive(Deserialize)]
pub(super) struct Envelope {
    /// Must be `"2.0"`: a request without it, or with another version, is -32600.
    #[serde(default)]
    pub jsonrpc: Value,
    /// `None` when absent (a notification); a `null` that is present is an id like any other.
    #[serde(default, deserialize_with = "present_id")]
    pub id: Option<RequestId>,
    /// Checked to be a string by the reader, which answers -32600 otherwise.
    #[serde(default)]
    pub method: Value,
    /// Read into the method's own params type by [`super::request::Request::read`].
    #[serde(default)]
    pub params: Value,
}

fn present_id<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<RequestId>, D::Error> {
    RequestId::deserialize(deserializer).map(Some)
}

/// The answer frame for a request; `None` for a notification (no `id`), which JSON-RPC never
/// answers.
pub(super) fn answer(id: &Option<RequestId>, outcome: Result<Value, RpcError>) -> Option<Outbound> {
    id.as_deref().map(|id| response(Some(id), outcome))
}

/// An answer frame; `id` `None` answers with `null` (the request's id could not be read).
pub(super) fn response(id: Option<&RawValue>, outcome: Result<Value, RpcError>) -> Outbound {
    #[derive(Serialize)]
    struct Answer<'a> {
        jsonrpc: &'static str,
        id: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<ErrorBody>,
    }
    #[derive(Serialize)]
    struct ErrorBody {
        code: i64,
        message: String,
        data: ErrorData,
    }
    #[derive(Serialize)]
    struct ErrorData {
        kind: ErrorKind,
    }
    let (result, error) = match outcome {
        Ok(result) => (Some(result), None),
        Err(err) => {
            let error = ErrorBody {
                code: err.code(),
                message: err.message,
                data: ErrorData { kind: err.kind },
            };
            (None, Some(error))
        }
    };
    let answer = Answer {
        jsonrpc: "2.0",
        id,
        result,
        error,
    };
    // Proven: JSON values and raw JSON always serialise (their map keys are strings).
    let text = serde_json::to_string(&answer).expect("an answer serialises");
    Outbound::Text(text.into())
}
