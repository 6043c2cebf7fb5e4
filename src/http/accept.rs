//! The accept loop. Every connection gets TCP_NODELAY, a slot under `server.max_connections`,
//! a header timeout, an idle timeout and a lingering close; past the cap, a small allowance
//! still answers `/healthz` and `/readyz` and refuses everything else with 503 `overloaded`.
//!
//! axum's `serve` exposes none of hyper's connection settings (no header timeout among them),
//! so connections are served here with hyper's HTTP/1 server directly, with upgrades for the
//! WebSocket.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;

/// Connections the health allowance holds beyond `max_connections`.
pub const HEALTH_ALLOWANCE: usize = 64;
/// How long a connection in the health allowance may take to send its request (or
/// `header_timeout_secs`, if shorter): a probe sends it at once, and a slow one only keeps
/// another probe out.
const ALLOWANCE_TIMEOUT: Duration = Duration::from_secs(2);
/// File descriptors a derived cap leaves at least for the database, task logs and commands.
const MIN_FD_RESERVE: u64 = 256;
/// How long a closing connection may keep sending what will never be read.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much of it is read and dropped before the connection is reset anyway.
const LINGER_BYTES: usize = 16 << 20;

/// The connection limits in force, settled once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served in full at once (WebSockets included, for as long as they are open).
    pub max_connections: usize,
    /// Connections past that which may still ask for `/healthz` and `/readyz`.
    pub health_allowance: usize,
    /// How long one request's headers may take to arrive (also the wait for the first request
    /// and between requests), and how long a connection may move no byte while no request of
    /// its own is being worked on.
    pub header_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits of `server`, deriving `max_connections = 0` from the soft fd limit.
    pub fn new(server: &ServerConfig, fd_limit: u64) -> Self {
        let max_connections = match server.max_connections {
            0 => derived_max_connections(fd_limit),
            configured => configured.min(MAX_CONNECTIONS),
        };
        Self {
            max_connections,
            health_allowance: HEALTH_ALLOWANCE,
            header_timeout: Duration::from_secs(server.header_timeout_secs.max(1)),
        }
    }
}

/// The most connections a semaphore's `acquire_many` can wait for at shutdown.
const MAX_CONNECTIONS: usize = u32::MAX as usize;

/// `max_connections = 0`: the fd limit less a reserve of 10 % (at least 256) for the database,
/// task logs and commands, less the health allowance; at least 1.
pub fn derived_max_connections(fd_limit: u64) -> usize {
    let reserve = (fd_limit / 10).max(MIN_FD_RESERVE);
    let derived = fd_limit
        .saturating_sub(reserve)
        .saturating_sub(HEALTH_ALLOWANCE as u64);
    usize::try_from(derived)
        .unwrap_or(MAX_CONNECTIONS)
        .clamp(1, MAX_CONNECTIONS)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit in force:
/// every connection holds a descriptor, and the usual soft default of 1024 would cap the
/// server long before its memory does.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let current = limit.current.unwrap_or(u64::MAX);
    if let Some(hard) = limit.maximum
        && hard > current
    {
        let raised = Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => return hard,
            Err(err) => tracing::warn!(%err, current, hard, "cannot raise the open-file limit"),
        }
    }
    current
}

/// Serves `app` on `listener` until `shutdown` fires; then stops accepting, lets requests in
/// flight finish, and waits up to `grace` for every connection (WebSockets, which close
/// themselves on `shutdown`, included) to close. `overflow` serves the connections past the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    overflow: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let full = Arc::new(Semaphore::new(limits.max_connections));
    let allowance = Arc::new(Allowance::new(limits.health_allowance));
    let mut connections = JoinSet::new();
    loop {
        let (stream, _peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    accept_failed(err).await;
                    continue;
                }
            },
        };
        // A reply of several frames would otherwise wait ~40 ms for the peer's delayed ACK.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
        if let Ok(permit) = Arc::clone(&full).try_acquire_owned() {
            let slot = Slot {
                _permit: Some(permit),
                place: None,
            };
            let service = ConnectionService::new(app.clone(), None);
            let task = serve_connection(stream, slot, service, limits.header_timeout, None);
            connections.spawn(task.run(shutdown.clone()));
        } else if let Some((place, waiting, evict)) = allowance.admit() {
            let slot = Slot {
                _permit: None,
                place: Some(place),
            };
            let service = ConnectionService::new(overflow.clone(), Some(waiting));
            let timeout = ALLOWANCE_TIMEOUT.min(limits.header_timeout);
            let task = serve_connection(stream, slot, service, timeout, Some(evict));
            connections.spawn(task.run(shutdown.clone()));
        } else {
            // Every place in the allowance is answering a probe this instant: refuse.
            tracing::debug!("connection refused: over the limit and the allowance");
        }
    }
    drop(listener);
    let closed = async {
        while connections.join_next().await.is_some() {}
        // Upgraded connections (and lingering closes) hold their permit until the socket closes.
        let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
        let _ = full.acquire_many(all).await;
    };
    if tokio::time::timeout(grace, closed).await.is_err() {
        tracing::warn!("connections still open after the grace period; closing");
    }
    connections.abort_all();
}

/// An accept that failed: a connection that went away is not our problem; anything else (out of
/// descriptors, most likely) is logged and waited out, since accepting again at once would spin.
async fn accept_failed(err: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%err, "accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// One accepted connection, ready to be driven.
struct ConnectionTask {
    connection: http1::UpgradeableConnection<TokioIo<TrackedStream>, ConnectionService>,
    activity: Arc<Activity>,
    idle: Duration,
    evict: Option<CancellationToken>,
}

fn serve_connection(
    stream: TcpStream,
    slot: Slot,
    service: ConnectionService,
    timeout: Duration,
    evict: Option<CancellationToken>,
) -> ConnectionTask {
    let activity = Arc::clone(&service.activity);
    let io = TokioIo::new(TrackedStream {
        stream: Some(stream),
        activity: Arc::clone(&activity),
        slot: Some(slot),
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    if service.first_request.is_some() {
        // The allowance answers one request per connection.
        builder.keep_alive(false);
    }
    ConnectionTask {
        connection: builder.serve_connection(io, service).with_upgrades(),
        activity,
        idle: timeout,
        evict,
    }
}

impl ConnectionTask {
    /// Drives the connection until it ends, is upgraded (the WebSocket then owns the socket),
    /// sits idle too long, or is evicted from the allowance.
    async fn run(self, shutdown: CancellationToken) {
        let Self {
            connection,
            activity,
            idle,
            evict,
        } = self;
        let mut connection = std::pin::pin!(connection);
        let mut stopping = false;
        let evicted = async {
            match evict {
                Some(evict) => evict.cancelled_owned().await,
                None => std::future::pending().await,
            }
        };
        let mut evicted = std::pin::pin!(evicted);
        loop {
            tokio::select! {
                outcome = connection.as_mut() => {
                    if let Err(err) = outcome {
                        tracing::debug!(%err, "connection ended");
                    }
                    return;
                }
                () = shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = activity.idle(idle) => {
                    tracing::debug!("idle connection closed");
                    return;
                }
                () = &mut evicted => return,
            }
        }
    }
}

/// What one connection has been doing, shared by its socket, its requests and its task.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened` of the last read or write that moved bytes.
    last_io_ms: AtomicU64,
    /// Request handlers running.
    handlers: AtomicUsize,
    /// Of those, the ones waiting for their request body: they wait on the client, not on us.
    body_waits: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            handlers: AtomicUsize::new(0),
            body_waits: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_io_ms.store(ms, Ordering::Relaxed);
    }

    fn last_io(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed))
    }

    /// Whether the server is working on a request (so silence on the wire is ours, not idling).
    fn busy(&self) -> bool {
        self.handlers.load(Ordering::Relaxed) > self.body_waits.load(Ordering::Relaxed)
    }

    /// Resolves once no byte has moved for `limit` while the server was not busy.
    async fn idle(&self, limit: Duration) {
        loop {
            let deadline = self.last_io() + limit;
            let now = Instant::now();
            if now >= deadline {
                if !self.busy() {
                    return;
                }
                tokio::time::sleep(limit).await;
            } else {
                tokio::time::sleep_until(deadline).await;
            }
        }
    }
}

/// Counts one running handler for as long as it lives.
struct HandlerRunning(Arc<Activity>);

impl HandlerRunning {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.handlers.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(activity))
    }
}

impl Drop for HandlerRunning {
    fn drop(&mut self) {
        self.0.handlers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The hyper service of one connection: the router, with the connection's activity counted.
#[derive(Clone)]
struct ConnectionService {
    router: Router,
    activity: Arc<Activity>,
    /// In the allowance: set until the connection's request has arrived, which protects it
    /// from eviction.
    first_request: Option<Arc<AtomicBool>>,
}

impl ConnectionService {
    fn new(router: Router, first_request: Option<Arc<AtomicBool>>) -> Self {
        Self {
            router,
            activity: Arc::new(Activity::new()),
            first_request,
        }
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        if let Some(waiting) = &self.first_request {
            waiting.store(false, Ordering::Relaxed);
        }
        let running = HandlerRunning::new(&self.activity);
        let activity = Arc::clone(&self.activity);
        let request = request.map(|body| WatchedBody {
            body,
            activity,
            waiting: false,
        });
        let mut router = self.router.clone();
        Box::pin(async move {
            let response = tower_service::Service::call(&mut router, request).await;
            drop(running);
            response
        })
    }
}

/// A request body that marks the time its handler spends waiting for the client, so a body
/// that stops arriving lets the idle timeout close the connection.
struct WatchedBody {
    body: Incoming,
    activity: Arc<Activity>,
    waiting: bool,
}

impl WatchedBody {
    fn set_waiting(&mut self, waiting: bool) {
        if self.waiting != waiting {
            self.waiting = waiting;
            if waiting {
                self.activity.body_waits.fetch_add(1, Ordering::Relaxed);
            } else {
                self.activity.body_waits.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        self.set_waiting(polled.is_pending());
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for WatchedBody {
    fn drop(&mut self) {
        self.set_waiting(false);
    }
}

/// What a connection holds while its socket is open: a permit of the full cap, or a place in
/// the allowance. Dropping it makes room for the next connection.
struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    place: Option<AllowancePlace>,
}

/// A connection's socket: it records activity, holds the connection's [`Slot`] until it is
/// closed (after an upgrade too), and closes with a linger.
struct TrackedStream {
    /// `None` only once dropped.
    stream: Option<TcpStream>,
    activity: Arc<Activity>,
    slot: Option<Slot>,
}

fn gone() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::NotConnected)
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(Err(gone()));
        };
        let polled = Pin::new(stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(Err(gone()));
        };
        let polled = Pin::new(stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(Err(gone()));
        };
        let polled = Pin::new(stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_flush(cx),
            None => Poll::Ready(Err(gone())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_shutdown(cx),
            None => Poll::Ready(Err(gone())),
        }
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        // Closing a socket with unread bytes makes the kernel answer with a reset, which can
        // destroy our last words (a 1009 close, a 503) before the client has read them: that
        // happens to a client still sending a frame we refused. Such a socket is half-closed
        // and drained for a moment instead; one with nothing unread simply closes.
        let unread = rustix::io::ioctl_fionread(&stream).unwrap_or(0);
        if unread == 0 {
            return;
        }
        let mut slot = self.slot.take();
        // A place in the allowance is for answering probes; a lingering close needs none.
        if let Some(slot) = &mut slot {
            slot.place.take();
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream, slot));
        }
    }
}

/// Sends our FIN, then reads and drops what the client still sends, for a bounded time and
/// amount; the connection keeps its slot meanwhile, since it keeps its descriptor.
async fn linger(mut stream: TcpStream, slot: Option<Slot>) {
    let _ = stream.shutdown().await;
    let mut buf = [0u8; 8192];
    let mut left = LINGER_BYTES;
    let drain = async {
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    drop(slot);
}

/// The connections past the cap, oldest first; they may only ask for `/healthz` and
/// `/readyz`.
struct Allowance {
    places: usize,
    entries: Mutex<VecDeque<AllowanceEntry>>,
    next_id: AtomicU64,
}

struct AllowanceEntry {
    id: u64,
    /// Set until the connection's request has arrived.
    waiting: Arc<AtomicBool>,
    evict: CancellationToken,
}

/// One connection's place in the allowance, given back when its socket closes.
struct AllowancePlace {
    allowance: Arc<Allowance>,
    id: u64,
}

impl Drop for AllowancePlace {
    fn drop(&mut self) {
        let mut entries = self.allowance.lock();
        entries.retain(|entry| entry.id != self.id);
    }
}

impl Allowance {
    fn new(places: usize) -> Self {
        Self {
            places,
            entries: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<AllowanceEntry>> {
        // The list stays consistent whatever panicked while holding it.
        crate::mutex::lock(&self.entries)
    }

    /// A place for a new connection: its place, its "still waiting for the request" flag and
    /// its eviction token. When every place is taken, the oldest connection that has not sent
    /// its request yet is evicted to make room, so idle connections can never lock the health
    /// checks out; `None` when every place is answering a request.
    fn admit(self: &Arc<Self>) -> Option<(AllowancePlace, Arc<AtomicBool>, CancellationToken)> {
        if self.places == 0 {
            return None;
        }
        let mut entries = self.lock();
        if entries.len() >= self.places {
            let oldest_idle = entries
                .iter()
                .position(|entry| entry.waiting.load(Ordering::Relaxed))?;
            if let Some(evicted) = entries.remove(oldest_idle) {
                evicted.evict.cancel();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let waiting = Arc::new(AtomicBool::new(true));
        let evict = CancellationToken::new();
        entries.push_back(AllowanceEntry {
            id,
            waiting: Arc::clone(&waiting),
            evict: evict.clone(),
        });
        drop(entries);
        let place = AllowancePlace {
            allowance: Arc::clone(self),
            id,
        };
        Some((place, waiting, evict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_cap_leaves_a_reserve_and_the_allowance() {
        // 10 % once that exceeds 256 descriptors.
        assert_eq!(derived_max_connections(20_000), 20_000 - 2_000 - 64);
        assert_eq!(derived_max_connections(1_048_576), 1_048_576 - 104_857 - 64);
        // At least 256 below that.
        assert_eq!(derived_max_connections(1024), 1024 - 256 - 64);
        assert_eq!(derived_max_connections(100), 1);
        let mut server = ServerConfig::default();
        assert_eq!(
            ConnectionLimits::new(&server, 1024).max_connections,
            704,
            "0 derives"
        );
        server.max_connections = 5;
        assert_eq!(ConnectionLimits::new(&server, 1024).max_connections, 5);
    }

    #[test]
    fn the_allowance_evicts_its_oldest_waiting_connection_only() {
        let allowance = Arc::new(Allowance::new(2));
        let (first, first_waiting, first_evict) = allowance.admit().unwrap();
        let (_second, second_waiting, second_evict) = allowance.admit().unwrap();
        // Full: the oldest waiting one makes room.
        let (_third, _, _) = allowance.admit().unwrap();
        assert!(first_evict.is_cancelled());
        assert!(!second_evict.is_cancelled());
        drop(first);
        drop(first_waiting);
        // Connections answering a request are never evicted; with none waiting, refuse.
        second_waiting.store(false, Ordering::Relaxed);
        let (fourth, fourth_waiting, _) = allowance.admit().unwrap();
        fourth_waiting.store(false, Ordering::Relaxed);
        assert!(allowance.admit().is_none(), "every place is busy");
        drop(fourth);
        assert!(allowance.admit().is_some(), "a closed place is free again");
    }

    #[tokio::test]
    async fn a_handler_waiting_for_its_body_is_not_busy() {
        let activity = Arc::new(Activity::new());
        assert!(!activity.busy());
        let running = HandlerRunning::new(&activity);
        assert!(activity.busy(), "a running handler is our work");
        activity.body_waits.fetch_add(1, Ordering::Relaxed);
        assert!(!activity.busy(), "waiting for the client's body is not");
        activity.body_waits.fetch_sub(1, Ordering::Relaxed);
        drop(running);
        tokio::time::timeout(
            Duration::from_secs(5),
            activity.idle(Duration::from_millis(1)),
        )
        .await
        .expect("a silent connection with nothing running is idle");
    }
}
