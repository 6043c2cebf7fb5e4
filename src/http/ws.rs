//! `GET /api/ws`: one JSON-RPC 2.0 connection. A writer task ([`writer`]) owns the socket's
//! send half and drains one bounded queue; the reader loop here parses requests ([`rpc`],
//! [`request`]), carries them out ([`dispatch`], [`watch`], [`tasks`]) and answers through that
//! queue. Each watched session has its own bounded live queue, which the writer drains beside
//! it, so a session's events and the answers to that session's requests keep their order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::SplitStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod dispatch;
pub mod frame;
mod request;
mod rpc;
mod tasks;
mod watch;
mod writer;

use self::dispatch::Dispatched;
use self::rpc::{RpcError, answer, response};
use self::watch::Attachment;
use super::AppState;
use super::auth::{origin_allowed, origin_and_host};
use super::error::ApiError;
use crate::error_kind::ErrorKind;
use crate::session::frames::{FrameSender, frame_queue};
use crate::session::{Caller, Closing, Outbound};

/// Largest frame, and message, accepted. The socket layer refuses a bigger one as soon as its
/// header announces the size, before reading (or buffering) any of it, and the connection
/// closes with 1009; the accept loop's lingering close lets the client finish sending and read
/// that code rather than a reset.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// How long a frame in flight may wait for a client that was cut off or is being closed.
const STUCK_CLIENT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a close frame may wait for a client that does not read.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Frames are written to the socket when this much is buffered, or at a flush.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;
/// The read buffer every connection holds from its start, and the most one read takes. A
/// request is a few hundred bytes, and an idle connection keeps this buffer for as long as it
/// lives; a larger message (an inline image) reserves its whole length once its header is read,
/// then fills it in reads of this size.
const READ_BUFFER_BYTES: usize = 1024;
/// Events read from the store per replay page.
const REPLAY_PAGE: i64 = 500;

/// `GET /api/ws`: checks the token (401) and the `Origin` (403) before upgrading.
pub async fn upgrade(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return ApiError::BadRequest(rejection.body_text()).into_response(),
    };
    let (origin, host) = origin_and_host(&headers);
    if !origin_allowed(origin, host, &app.config().server.allowed_origins) {
        return ApiError::ForbiddenOrigin.into_response();
    }
    // Frames queue in the write buffer until the writer flushes the ones that are ready
    // together; it grows only to what one flush holds.
    ws.read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| Connection::start(app, caller, socket))
}

/// The state of one WebSocket connection.
struct Connection {
    app: AppState,
    /// Who the token named; every session lookup is checked against it.
    caller: Caller,
    /// Tells this connection's watchers apart within the server.
    id: u64,
    /// Answers and replayed events; the writer holds the other end and ends when it closes.
    out: FrameSender,
    /// Asks the writer for a ping, and hands it watched sessions' live queues.
    signals: Arc<writer::WriterSignals>,
    /// Fired by a session that cut this connection off for falling behind.
    lagged: CancellationToken,
    /// The watched sessions, by id.
    attached: HashMap<String, Attachment>,
}

impl Connection {
    /// Starts a connection of `caller`'s on `socket`: its writer task now, its reader as the
    /// future returned, which the caller runs.
    ///
    /// Not an `async fn`: one keeps its arguments in its future beside what they become, and
    /// every idle connection would hold a dead copy of the whole socket and of itself.
    fn start(
        app: AppState,
        caller: Caller,
        socket: WebSocket,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (out, out_rx) = frame_queue(app.config().server.ws_queue_frames);
        let signals = Arc::<writer::WriterSignals>::default();
        let lagged = CancellationToken::new();
        let (sink, stream) = socket.split();
        let writer = tokio::spawn(writer::write_frames(
            sink,
            writer::FrameSources {
                out: out_rx,
                signals: Arc::clone(&signals),
                lagged: lagged.clone(),
                shutdown: app.shutdown().clone(),
            },
        ));
        let mut connection = Self {
            id: app.next_connection_id(),
            app,
            caller,
            out,
            signals,
            lagged,
            attached: HashMap::new(),
        };
        async move {
            connection.serve(stream).await;
            connection.finish(writer).await;
        }
    }

    /// Reads the connection until the client leaves, is cut off, or the server stops.
    ///
    /// No span lives as long as the connection: a span's slot keeps its fields' allocation
    /// after it closes, and one made for each of 10,000 connections is scattered through the
    /// heap, holding pages after they are gone. Its own log lines name the connection instead.
    async fn serve(&mut self, mut stream: SplitStream<WebSocket>) {
        self.app.metrics().connections.inc();
        // Every whole frame (a pong included) shows the client is alive and not stuck inside
        // a frame. After `quiet` without one it is pinged; after as long again it is closed. A
        // client cannot answer a ping in the middle of a frame, so a frame that stalls, or
        // trickles in, holds its buffer for at most twice `quiet`.
        let quiet = Duration::from_secs(self.app.config().server.ws_ping_secs);
        let mut heard = Instant::now();
        let mut pinged = false;
        loop {
            let deadline = if pinged {
                heard + quiet * 2
            } else {
                heard + quiet
            };
            let message = tokio::select! {
                message = stream.next() => message,
                () = tokio::time::sleep_until(deadline) => {
                    if pinged {
                        tracing::debug!(connection = self.id, "no frame completed in time; closing");
                        // The queue may be full of frames for a client that does not read.
                        let _ = self.out.try_send(Outbound::Close(&Closing {
                            code: 1008,
                            reason: "no frame completed in time",
                        }));
                        break;
                    }
                    pinged = true;
                    self.signals.ping();
                    continue;
                }
                () = self.lagged.cancelled() => break,
                () = self.app.shutdown().cancelled() => break,
            };
            heard = Instant::now();
            pinged = false;
            match message {
                // Boxed, so an idle connection's future does not keep room for a request's.
                Some(Ok(Message::Text(text))) => Box::pin(self.on_text(text.as_str())).await,
                Some(Ok(Message::Binary(_))) => {
                    let error = RpcError::new(
                        ErrorKind::ParseError,
                        "binary frames are not JSON-RPC; send text",
                    );
                    let _ = self.out.send(response(None, Err(error))).await;
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(err)) => {
                    // axum hides tungstenite's error type; its capacity error reads
                    // "Space limit exceeded: Message too long: N > M".
                    let text = err.to_string();
                    if text.contains("Space limit exceeded") || text.contains("too long") {
                        let _ = self.out.try_send(Outbound::Close(&Closing {
                            code: 1009,
                            reason: "frame larger than 4 MiB",
                        }));
                    }
                    tracing::debug!(connection = self.id, %err, "websocket read failed");
                    break;
                }
            }
        }
    }

    /// Detaches from every watched session, then lets `writer` write what is queued and close
    /// the socket.
    async fn finish(self, mut writer: JoinHandle<()>) {
        for attachment in self.attached.values() {
            attachment.handle.detach(self.id).await;
        }
        // The live queues' senders go too, so nothing holds the writer but what it still has
        // to write.
        let Self {
            app,
            id,
            out,
            attached,
            ..
        } = self;
        drop((attached, out));
        // A client that reads nothing cannot hold the connection open past its last frame's
        // grace and the close's.
        if tokio::time::timeout(STUCK_CLIENT + CLOSE_TIMEOUT, &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        app.metrics().connections.dec();
        crate::heap::trim_soon();
        tracing::debug!(connection = id, "connection closed");
    }

    /// Answers one text frame: a refusal at once, a request by its method.
    async fn on_text(&mut self, text: &str) {
        let frame::Frame { id, read } = frame::Frame::decode(text);
        let request = match read {
            Ok(request) => request,
            Err(refusal) => {
                if let Some(answer) = refusal.answer(id.as_ref()) {
                    let _ = self.out.send(answer).await;
                }
                return;
            }
        };
        match self.dispatch(request, id.clone()).await {
            Dispatched::Answered => {}
            Dispatched::Now(outcome, route) => {
                let Some(frame) = answer(&id, outcome) else {
                    return;
                };
                let _ = match route {
                    Some(mut live) => live.send(frame).await,
                    None => self.out.send(frame).await,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns: an `async fn`'s future, without making one.
    fn returned<A, B, R>(_: impl FnOnce(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn returned3<A, B, C, R>(_: impl FnOnce(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn an_idle_connection_keeps_no_dead_copy_of_its_socket() {
        let connection = returned3(Connection::start);
        let reader = returned(Connection::serve);
        let socket = std::mem::size_of::<WebSocket>();
        assert!(
            connection < socket + reader,
            "the connection's future takes {connection} bytes: its reader's {reader} and the {socket} of a socket it no longer uses"
        );
    }
}
