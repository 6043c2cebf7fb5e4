//! The send half of one WebSocket: drains the connection's queue and the live queues of the
//! sessions it watches straight onto the socket, and writes every frame that is ready at once
//! with one flush, so an answer and the events before it leave in one TCP write.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::future::FutureExt;
use futures_util::stream::{SelectAll, SplitSink};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{CLOSE_TIMEOUT, STUCK_CLIENT};
use crate::session::Outbound;
use crate::session::frames::FrameQueue;

/// Frames written before one flush, at most; a long backlog still goes out in bounded writes.
const FRAMES_PER_FLUSH: usize = 64;

/// Where the writer takes its frames from, and what makes it stop.
pub(super) struct FrameSources {
    /// Answers and replayed events, in the order the reader queued them.
    pub out: FrameQueue,
    /// What the reader asks of the writer besides frames.
    pub signals: Arc<WriterSignals>,
    /// Fired when a session cut this connection off for falling behind.
    pub lagged: CancellationToken,
    /// Fired when the server stops.
    pub shutdown: CancellationToken,
}

/// The reader's requests to the writer that are not frames: a ping when the client has been
/// quiet, and the live queues of sessions it now watches. One wake-up carries both, where a
/// channel of queues would cost every connection a channel it uses once or twice.
#[derive(Default)]
pub(super) struct WriterSignals {
    wake: Notify,
    ping: AtomicBool,
    /// Live queues, each handed over once its session's replay and answer are in `out`.
    follow: Mutex<Vec<FrameQueue>>,
}

impl WriterSignals {
    /// Asks for a ping.
    pub(super) fn ping(&self) {
        self.ping.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Hands over a session's live queue, to be drained after everything queued in `out` so
    /// far.
    pub(super) fn follow(&self, queue: FrameQueue) {
        crate::mutex::lock(&self.follow).push(queue);
        self.wake.notify_one();
    }

    /// The live queues handed over since the last call.
    fn followed(&self) -> Vec<FrameQueue> {
        std::mem::take(&mut *crate::mutex::lock(&self.follow))
    }
}

/// One frame, or the end of the socket.
enum Next {
    Frame(Message),
    Close(u16, &'static str),
    Stop,
}

/// Writes frames until the queues close, a close frame is asked for, the client stops reading
/// for too long, or the server shuts down; then closes the socket.
pub(super) async fn write_frames(mut sink: SplitSink<WebSocket, Message>, sources: FrameSources) {
    let FrameSources {
        mut out,
        signals,
        lagged,
        shutdown,
    } = sources;
    let mut live: SelectAll<FrameQueue> = SelectAll::new();
    // Frames taken from `out` when a live queue arrived: they were queued before it, so they
    // are written before anything of it.
    let mut backlog: VecDeque<Outbound> = VecDeque::new();
    loop {
        let first = if let Some(frame) = backlog.pop_front() {
            next_of(frame)
        } else {
            tokio::select! {
                biased;
                () = lagged.cancelled() => Next::Close(1013, "too far behind; reconnect with after_seq"),
                () = shutdown.cancelled() => Next::Close(1001, "server shutting down"),
                () = signals.wake.notified() => {
                    let followed = signals.followed();
                    if !followed.is_empty() {
                        backlog.extend(std::iter::from_fn(|| out.try_recv()));
                        live.extend(followed);
                    }
                    if !signals.ping.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    Next::Frame(Message::Ping(Default::default()))
                }
                frame = out.recv() => frame.map_or(Next::Stop, next_of),
                Some(frame) = live.next(), if !live.is_empty() => next_of(frame),
            }
        };
        let mut batch = match first {
            Next::Frame(message) => vec![message],
            Next::Close(code, reason) => {
                send_close(&mut sink, code, reason).await;
                break;
            }
            Next::Stop => break,
        };
        // Whatever else is ready goes in the same write.
        let mut closing = None;
        while batch.len() < FRAMES_PER_FLUSH {
            let ready = backlog
                .pop_front()
                .or_else(|| out.try_recv())
                .or_else(|| live.next().now_or_never().flatten());
            match ready.map(next_of) {
                Some(Next::Frame(message)) => batch.push(message),
                Some(Next::Close(code, reason)) => {
                    closing = Some((code, reason));
                    break;
                }
                Some(Next::Stop) | None => break,
            }
        }
        // Boxed, as the closes are: an idle connection's writer keeps room only for waiting.
        if !Box::pin(send_all(&mut sink, batch, &lagged, &shutdown)).await {
            break;
        }
        if let Some((code, reason)) = closing {
            send_close(&mut sink, code, reason).await;
            break;
        }
    }
    let _ = Box::pin(tokio::time::timeout(CLOSE_TIMEOUT, sink.close())).await;
}

/// Sends a close frame, waiting at most [`CLOSE_TIMEOUT`] for a client that does not read.
async fn send_close(sink: &mut SplitSink<WebSocket, Message>, code: u16, reason: &'static str) {
    let _ = Box::pin(tokio::time::timeout(
        CLOSE_TIMEOUT,
        sink.send(close(code, reason)),
    ))
    .await;
}

/// Writes `batch` with one flush. A client that stops reading blocks the write; cut off (or
/// stopping), it still gets a while to take the frames in flight, so the close that follows is
/// well formed, and one that never reads again ends the writer.
async fn send_all(
    sink: &mut SplitSink<WebSocket, Message>,
    batch: Vec<Message>,
    lagged: &CancellationToken,
    shutdown: &CancellationToken,
) -> bool {
    let send = async {
        for message in batch {
            sink.feed(message).await?;
        }
        sink.flush().await
    };
    tokio::pin!(send);
    tokio::select! {
        sent = &mut send => sent.is_ok(),
        () = async { tokio::select! {
            () = lagged.cancelled() => {}
            () = shutdown.cancelled() => {}
        } } => {
            matches!(tokio::time::timeout(STUCK_CLIENT, &mut send).await, Ok(Ok(())))
        }
    }
}

fn next_of(frame: Outbound) -> Next {
    match frame {
        Outbound::Text(text) => Next::Frame(Message::Text(text.as_ref().into())),
        Outbound::Close(closing) => Next::Close(closing.code, closing.reason),
    }
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}
