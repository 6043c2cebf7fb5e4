//! A running agentd reached over its WebSocket (`/api/ws`) and REST API: what `agentd acp
//! --url` bridges the editor to instead of hosting sessions in-process.
//!
//! One WebSocket carries every request and every watched session's notifications; a reader
//! task answers the waiting requests and routes each notification to its session's queue,
//! the same queue an in-process watcher fills, so the ACP side cannot tell the two apart.
//! Stored history (a `session/load`'s replay) is read through REST.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

use super::{NOT_FOUND, RpcError};
use crate::error_kind::ErrorKind;
use crate::error_kind::{RPC_INTERNAL_ERROR, RPC_SERVER_ERROR};
use crate::mutex::lock;
use crate::session::Outbound;
use crate::session::frames::FrameSender;

/// The largest REST answer read from the agentd bridged to (a page of events or messages).
const MAX_REST_ANSWER: usize = 64 * 1024 * 1024;

/// A session's notification queue on this side, and the token that ends its pump when the
/// queue overflows or the connection drops.
struct Route {
    tx: FrameSender,
    lagged: CancellationToken,
}

/// The connection to one running agentd.
pub(super) struct Remote {
    /// Frames for the WebSocket writer.
    out: mpsc::UnboundedSender<String>,
    next_id: AtomicU64,
    /// Our requests waiting for the server's answer, by id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>,
    routes: Mutex<HashMap<String, Route>>,
    http: reqwest::Client,
    /// `http://host:port` of the same server, for REST.
    base: String,
    token: Option<String>,
    /// Fired when the WebSocket closes: requests fail and pumps end.
    gone: CancellationToken,
}

/// Why the bridge cannot reach the server its `--url` names.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// A `wss://` URL: the bridge speaks plain WebSocket only.
    #[error(
        "--url {0}: wss:// is not supported; reach the server over ws:// (on loopback, or \
         through an SSH tunnel)"
    )]
    Tls(String),
    /// Not a WebSocket URL at all.
    #[error("--url {0} is not a WebSocket URL; give ws://HOST:PORT/api/ws")]
    NotWebSocket(String),
    /// A URL without its host.
    #[error("--url {0} names no host")]
    NoHost(String),
    /// A URL the WebSocket client cannot make a request of.
    #[error("--url {url}: {source}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: tokio_tungstenite::tungstenite::Error,
    },
    /// The token cannot be sent as a header.
    #[error("the token file holds characters a header cannot carry")]
    BadToken,
    /// The server refused the token.
    #[error("{0} refused the token (401): check --token-file")]
    Refused(String),
    /// The server could not be reached.
    #[error("cannot reach agentd at {url}: {source}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: tokio_tungstenite::tungstenite::Error,
    },
}

impl Remote {
    /// Connects to the WebSocket at `url` (`ws://host:port/api/ws`), with `token` as the
    /// bearer token when the server asks for one.
    pub(super) async fn connect(
        url: &str,
        token: Option<String>,
    ) -> Result<Arc<Self>, BridgeError> {
        let base = http_base(url)?;
        let mut request = url
            .into_client_request()
            .map_err(|source| BridgeError::BadUrl {
                url: url.to_string(),
                source,
            })?;
        if let Some(token) = &token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| BridgeError::BadToken)?;
            request.headers_mut().insert("authorization", value);
        }
        let (socket, _) =
            tokio_tungstenite::connect_async(request)
                .await
                .map_err(|err| match err {
                    tokio_tungstenite::tungstenite::Error::Http(response)
                        if response.status() == 401 =>
                    {
                        BridgeError::Refused(url.to_string())
                    }
                    source => BridgeError::Unreachable {
                        url: url.to_string(),
                        source,
                    },
                })?;
        let (mut sink, mut stream) = socket.split();
        let (out, mut frames) = mpsc::unbounded_channel::<String>();
        let remote = Arc::new(Self {
            out,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            http: reqwest::Client::new(),
            base,
            token,
            gone: CancellationToken::new(),
        });
        let gone = remote.gone.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    frame = frames.recv() => match frame {
                        Some(frame) => {
                            if sink.send(Message::text(frame)).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                    () = gone.cancelled() => break,
                }
            }
            let _ = sink.close().await;
        });
        let reader = Arc::clone(&remote);
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                match message {
                    Message::Text(text) => reader.receive(text.as_str()),
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            reader.hang_up();
        });
        Ok(remote)
    }

    /// Ends every waiting request and every session's pump: the server went away.
    fn hang_up(&self) {
        self.gone.cancel();
        lock(&self.pending).clear();
        for (_, route) in lock(&self.routes).drain() {
            route.lagged.cancel();
        }
    }

    /// Fires when the WebSocket closes.
    pub(super) fn gone(&self) -> CancellationToken {
        self.gone.clone()
    }

    /// Closes the WebSocket.
    pub(super) fn close(&self) {
        self.hang_up();
    }

    fn receive(&self, text: &str) {
        let Ok(frame) = serde_json::from_str::<Value>(text) else {
            return;
        };
        if frame.get("method").is_none() {
            if let Some(waiting) = frame["id"]
                .as_u64()
                .and_then(|id| lock(&self.pending).remove(&id))
            {
                let answer = match frame.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = waiting.send(answer);
            }
            return;
        }
        let Some(session_id) = frame["params"]["session_id"].as_str() else {
            return;
        };
        let mut routes = lock(&self.routes);
        if let Some(route) = routes.get_mut(session_id)
            && route.tx.try_send(Outbound::Text(text.into())).is_err()
        {
            // A pump that fell this far behind (or ended) gets no more: as a lagging
            // in-process watcher, it stops.
            route.lagged.cancel();
            routes.remove(session_id);
        }
    }

    /// Sends `session_id`'s notifications to `tx` from now on.
    pub(super) fn route(&self, session_id: &str, tx: FrameSender, lagged: CancellationToken) {
        if self.gone.is_cancelled() {
            lagged.cancel();
            return;
        }
        lock(&self.routes).insert(session_id.to_string(), Route { tx, lagged });
    }

    /// Stops routing `session_id`'s notifications.
    pub(super) fn unroute(&self, session_id: &str) {
        lock(&self.routes).remove(session_id);
    }

    /// One WebSocket request; the server's error keeps its code, message and kind.
    pub(super) async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.gone.is_cancelled() || self.out.send(frame.to_string()).is_err() {
            lock(&self.pending).remove(&id);
            return Err(server_gone());
        }
        let answer = tokio::select! {
            answer = rx => answer.map_err(|_| server_gone())?,
            () = self.gone.cancelled() => return Err(server_gone()),
        };
        answer.map_err(|error| RpcError {
            code: error["code"].as_i64().unwrap_or(RPC_INTERNAL_ERROR),
            message: error["message"]
                .as_str()
                .unwrap_or("agentd answered an error")
                .to_string(),
            kind: kind_word(error["data"]["kind"].as_str()),
        })
    }

    /// A REST `GET` of `path` (from `/api/…`), as JSON.
    pub(super) async fn get(&self, path: &str) -> Result<Value, RpcError> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|err| RpcError {
            code: RPC_INTERNAL_ERROR,
            message: format!("agentd's REST API: {err}"),
            kind: ErrorKind::Internal,
        })?;
        let status = response.status();
        let body: Value = crate::capped_read::response_body(response, MAX_REST_ANSWER)
            .await
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let error = &body["error"];
        Err(RpcError {
            code: if status == reqwest::StatusCode::NOT_FOUND {
                NOT_FOUND
            } else {
                RPC_SERVER_ERROR
            },
            message: error["message"]
                .as_str()
                .map_or_else(|| format!("agentd answered {status}"), str::to_string),
            kind: kind_word(error["kind"].as_str()),
        })
    }
}

fn server_gone() -> RpcError {
    RpcError {
        code: RPC_INTERNAL_ERROR,
        message: "the connection to agentd closed".into(),
        kind: ErrorKind::SessionUnavailable,
    }
}

/// The server's error kind by its word; one this build does not know (a newer server's)
/// becomes `internal`, with the server's message kept.
fn kind_word(kind: Option<&str>) -> ErrorKind {
    kind.and_then(ErrorKind::from_word)
        .unwrap_or(ErrorKind::Internal)
}

/// `http://host:port` for the WebSocket URL `ws://host:port/…`.
fn http_base(url: &str) -> Result<String, BridgeError> {
    let rest = if let Some(rest) = url.strip_prefix("ws://") {
        rest
    } else if url.starts_with("wss://") {
        return Err(BridgeError::Tls(url.to_string()));
    } else {
        return Err(BridgeError::NotWebSocket(url.to_string()));
    };
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(BridgeError::NoHost(url.to_string()));
    }
    Ok(format!("http://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_base_comes_from_the_websocket_url() {
        assert_eq!(
            http_base("ws://127.0.0.1:8080/api/ws").unwrap(),
            "http://127.0.0.1:8080"
        );
        let refused = |url: &str| http_base(url).unwrap_err();
        assert!(matches!(refused("wss://a/api/ws"), BridgeError::Tls(_)));
        assert!(
            refused("wss://a/api/ws")
                .to_string()
                .contains("not supported")
        );
        assert!(matches!(
            refused("http://a/api/ws"),
            BridgeError::NotWebSocket(_)
        ));
        assert!(refused("http://a/api/ws").to_string().contains("ws://"));
        assert!(matches!(refused("ws:///api/ws"), BridgeError::NoHost(_)));
    }

    #[test]
    fn unknown_kinds_become_internal() {
        assert_eq!(kind_word(Some("unknown_session")), "unknown_session");
        assert_eq!(kind_word(Some("from_the_future")), "internal");
        assert_eq!(kind_word(None), "internal");
    }
}
