//! Reading one text frame up to the session: JSON, the JSON-RPC envelope, and the method's own
//! params, with the refusal the server answers when any of it is wrong. Nothing here needs a
//! connection, so it is what the frame fuzzer drives.

use serde_json::Value;

use super::request::Request;
use super::rpc::{Envelope, RequestId, RpcError, response};
use crate::error_kind::ErrorKind;
use crate::session::Outbound;

/// One text frame as read: its `id` (`None` when absent, or unreadable) and the request, or
/// why it is not one.
pub struct Frame {
    pub(super) id: Option<RequestId>,
    pub(super) read: Result<Request, Refusal>,
}

/// Why a frame is not a request the server carries out.
pub(super) struct Refusal {
    error: RpcError,
    /// A frame that is no request at all is answered even without an `id` (with `null`); one
    /// whose method or params are wrong is a notification like any other when it has none.
    even_without_id: bool,
}

impl Refusal {
    /// The answer frame, if this refusal gets one.
    pub(super) fn answer(self, id: Option<&RequestId>) -> Option<Outbound> {
        if id.is_none() && !self.even_without_id {
            return None;
        }
        Some(response(id.map(|id| &**id), Err(self.error)))
    }
}

impl Frame {
    /// Reads `text`. Only an object is a request (a derived struct would also take an array,
    /// by position); a batch is refused as a whole, with one answer (docs/protocol.md): each
    /// request's answer must stay in order with its session's events, which one frame of
    /// answers to several sessions could not keep.
    pub fn decode(text: &str) -> Self {
        let parse_error = |err: serde_json::Error| {
            RpcError::new(ErrorKind::ParseError, format!("invalid JSON: {err}"))
        };
        let invalid = || {
            RpcError::new(
                ErrorKind::InvalidRequest,
                "a request needs a string \"method\"",
            )
        };
        let refused = |id, error| Self {
            id,
            read: Err(Refusal {
                error,
                even_without_id: true,
            }),
        };
        if !text.trim_start().starts_with('{') {
            let error = match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) if text.trim_start().starts_with('[') => RpcError::new(
                    ErrorKind::BatchUnsupported,
                    "batches are not supported: send each request as a frame of its own",
                ),
                Ok(_) => invalid(),
                Err(err) => parse_error(err),
            };
            return refused(None, error);
        }
        let Envelope {
            jsonrpc,
            id,
            method,
            params,
        } = match serde_json::from_str(text) {
            Ok(envelope) => envelope,
            // Valid JSON that still does not read as a request: a duplicated member.
            Err(err) if err.is_data() => return refused(None, invalid()),
            Err(err) => return refused(None, parse_error(err)),
        };
        // The id is echoed as written, so it must decode: the grammar lets a string hold a lone
        // surrogate (`"\uD800"`) and a number exceed every float (`1e400`), and an answer
        // echoing either would not parse for a strict reader such as serde_json.
        if let Some(raw) = &id
            && let Err(err) = serde_json::from_str::<Value>(raw.get())
        {
            return refused(None, parse_error(err));
        }
        if jsonrpc != "2.0" {
            let error = RpcError::new(
                ErrorKind::InvalidRequest,
                "a request needs \"jsonrpc\": \"2.0\"",
            );
            return refused(id, error);
        }
        let Value::String(method) = method else {
            return refused(id, invalid());
        };
        let read = match Request::read(&method, params) {
            Ok(Request::Unknown) => Err(RpcError::new(
                ErrorKind::MethodNotFound,
                format!("unknown method {method:?}"),
            )),
            other => other,
        }
        .map_err(|error| Refusal {
            error,
            even_without_id: false,
        });
        Self { id, read }
    }

    /// Whether the frame carries an `id` (a notification does not, and gets no answer).
    pub fn has_id(&self) -> bool {
        self.id.is_some()
    }

    /// The method it asks for, when it reads as a request; `None` for a refusal or a method
    /// the server does not have.
    pub fn method(&self) -> Option<&'static str> {
        self.read.as_ref().ok().and_then(Request::method)
    }

    /// The answer frame a refusal gets, as sent (to the frame's `id`, or `null`). `None` when
    /// the frame reads as a request for a session to carry out, or is a notification whose
    /// refusal gets no answer.
    pub fn refusal(&self) -> Option<String> {
        let Err(refusal) = &self.read else {
            return None;
        };
        let error = &refusal.error;
        let copy = Refusal {
            error: RpcError::new(error.kind(), error.message()),
            even_without_id: refusal.even_without_id,
        };
        match copy.answer(self.id.as_ref())? {
            Outbound::Text(text) => Some(text.to_string()),
            Outbound::Close(..) => None,
        }
    }
}
