//! `GET /api/ws`: one JSON-RPC 2.0 connection. A writer task ([`writer`]) owns the socket's
//! send half and drains one bounded queue; the reader loop parses requests and answers through
//! that queue. Each watched session has its own bounded live queue, which the writer drains
//! beside it, so a session's events and the answers to that session's requests keep their order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod writer;

use super::AppState;
use super::auth::{origin_allowed, origin_and_host};
use super::error::ApiError;
use crate::session::{
    Caller, OpenedSession, Outbound, SessionError, SessionHandle, ToolNames, Watcher,
};
use crate::store::TaskRow;
use crate::tasks::read::{TaskReadError, read_task_output, task_of_session, with_live_size};
use crate::tools::ToolCatalog;

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
/// Events read from the store per replay page.
const REPLAY_PAGE: i64 = 500;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const SERVER_ERROR: i64 = -32000;
const OVERLOADED: i64 = -32001;

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
    ws.read_buffer_size(4096)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| Connection::new(app, caller).serve(socket))
}

/// A JSON-RPC error answer.
struct RpcError {
    code: i64,
    message: String,
    kind: &'static str,
}

impl RpcError {
    fn new(code: i64, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            kind,
        }
    }

    fn params(err: impl std::fmt::Display) -> Self {
        Self::new(INVALID_PARAMS, "invalid_params", err.to_string())
    }
}

impl From<SessionError> for RpcError {
    fn from(err: SessionError) -> Self {
        let code = match err {
            SessionError::InvalidParams(_) => INVALID_PARAMS,
            SessionError::Overloaded(_) => OVERLOADED,
            _ => SERVER_ERROR,
        };
        if let SessionError::Store(detail) = &err {
            tracing::error!(%detail, "request failed on storage");
        }
        Self::new(code, err.kind(), err.to_string())
    }
}

/// A request's `id` exactly as the client wrote it, echoed byte for byte: a 30-digit integer
/// stays that integer, where a parsed [`Value`] would have made it a float.
type RequestId = Box<RawValue>;

/// One incoming message, read without interpreting its `id`.
#[derive(Deserialize)]
struct Envelope {
    /// `None` when absent (a notification); a `null` that is present is an id like any other.
    #[serde(default, deserialize_with = "present_id")]
    id: Option<RequestId>,
    #[serde(default)]
    method: Value,
    #[serde(default)]
    params: Value,
}

fn present_id<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<RequestId>, D::Error> {
    RequestId::deserialize(deserializer).map(Some)
}

/// The answer frame for a request; `None` for a notification (no `id`), which JSON-RPC never
/// answers.
fn answer(id: &Option<RequestId>, outcome: Result<Value, RpcError>) -> Option<Outbound> {
    id.as_deref().map(|id| response(Some(id), outcome))
}

/// An answer frame; `id` `None` answers with `null` (the request's id could not be read).
fn response(id: Option<&RawValue>, outcome: Result<Value, RpcError>) -> Outbound {
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
        kind: &'static str,
    }
    let (result, error) = match outcome {
        Ok(result) => (Some(result), None),
        Err(err) => {
            let error = ErrorBody {
                code: err.code,
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

/// One session this connection watches.
struct Attachment {
    handle: SessionHandle,
    /// Answers to this session's requests go through the same queue as its events.
    live: mpsc::Sender<Outbound>,
}

/// The state of one WebSocket connection.
struct Connection {
    app: AppState,
    caller: Caller,
    id: u64,
    out: mpsc::Sender<Outbound>,
    /// Hands the writer a watched session's live queue, once what precedes it is in `out`.
    follow: mpsc::UnboundedSender<mpsc::Receiver<Outbound>>,
    /// The writer's ends of `out` and `follow`, until it starts.
    queues: Option<(
        mpsc::Receiver<Outbound>,
        mpsc::UnboundedReceiver<mpsc::Receiver<Outbound>>,
    )>,
    lagged: CancellationToken,
    attached: HashMap<String, Attachment>,
}

#[derive(Deserialize)]
struct OpenParams {
    session_id: Option<String>,
    cwd: Option<String>,
    after_seq: Option<i64>,
}

#[derive(Deserialize)]
struct SessionParams {
    session_id: String,
}

#[derive(Deserialize)]
struct InvokeParams {
    session_id: String,
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[derive(Deserialize)]
struct TurnParams {
    session_id: String,
    input: Vec<InputItem>,
    turn_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum InputItem {
    Text { text: String },
}

#[derive(Deserialize)]
struct RespondParams {
    session_id: String,
    request_id: String,
    answers: Value,
}

#[derive(Deserialize)]
struct TaskParams {
    session_id: String,
    task_id: String,
    #[serde(flatten)]
    output: crate::tasks::output::OutputParams,
}

fn parse<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params).map_err(RpcError::params)
}

impl Connection {
    fn new(app: AppState, caller: Caller) -> Self {
        let (out, out_rx) = mpsc::channel(app.config().server.ws_queue_frames);
        let (follow, follow_rx) = mpsc::unbounded_channel();
        let id = app.next_connection_id();
        Self {
            app,
            caller,
            id,
            out,
            follow,
            queues: Some((out_rx, follow_rx)),
            lagged: CancellationToken::new(),
            attached: HashMap::new(),
        }
    }

    async fn serve(self, socket: WebSocket) {
        let span = tracing::info_span!("connection", connection = self.id);
        tracing::Instrument::instrument(self.serve_inner(socket), span).await;
    }

    async fn serve_inner(mut self, socket: WebSocket) {
        self.app.metrics().connections.inc();
        let (sink, mut stream) = socket.split();
        let Some((out, follow)) = self.queues.take() else {
            return;
        };
        // The reader asks the writer for a ping when the client has been quiet.
        let ping = Arc::new(Notify::new());
        let mut writer = tokio::spawn(writer::write_frames(
            sink,
            writer::FrameSources {
                out,
                follow,
                ping: Arc::clone(&ping),
                lagged: self.lagged.clone(),
                shutdown: self.app.shutdown().clone(),
            },
        ));
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
                        tracing::debug!("no frame completed in time; closing");
                        // The queue may be full of frames for a client that does not read.
                        let _ = self.out.try_send(Outbound::Close(1008, "no frame completed in time"));
                        break;
                    }
                    pinged = true;
                    ping.notify_one();
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
                        PARSE_ERROR,
                        "parse_error",
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
                        let _ = self
                            .out
                            .try_send(Outbound::Close(1009, "frame larger than 4 MiB"));
                    }
                    tracing::debug!(%err, "websocket read failed");
                    break;
                }
            }
        }
        for attachment in self.attached.values() {
            attachment.handle.detach(self.id).await;
        }
        self.attached.clear();
        drop(self.out);
        // A client that reads nothing cannot hold the connection open past its last frame's
        // grace and the close's.
        if tokio::time::timeout(STUCK_CLIENT + CLOSE_TIMEOUT, &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        self.app.metrics().connections.dec();
        crate::heap::trim_soon();
        tracing::debug!("connection closed");
    }

    async fn on_text(&mut self, text: &str) {
        let parse_error = |err: serde_json::Error| {
            RpcError::new(PARSE_ERROR, "parse_error", format!("invalid JSON: {err}"))
        };
        let invalid = || {
            RpcError::new(
                INVALID_REQUEST,
                "invalid_request",
                "a request needs a string \"method\"",
            )
        };
        // Only an object is a request (a derived struct would also take an array, by position).
        if !text.trim_start().starts_with('{') {
            let error = match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) => invalid(),
                Err(err) => parse_error(err),
            };
            let _ = self.out.send(response(None, Err(error))).await;
            return;
        }
        let Envelope { id, method, params } = match serde_json::from_str(text) {
            Ok(envelope) => envelope,
            Err(err) => {
                // Valid JSON that still does not read as a request: a duplicated member.
                let error = if err.is_data() {
                    invalid()
                } else {
                    parse_error(err)
                };
                let _ = self.out.send(response(None, Err(error))).await;
                return;
            }
        };
        let Value::String(method) = method else {
            let _ = self.out.send(response(id.as_deref(), Err(invalid()))).await;
            return;
        };
        match self.dispatch(&method, params, id.clone()).await {
            Dispatched::Answered => {}
            Dispatched::Now(outcome, route) => {
                let Some(frame) = answer(&id, outcome) else {
                    return;
                };
                let queue = match route {
                    Some(live) => live,
                    None => self.out.clone(),
                };
                let _ = queue.send(frame).await;
            }
        }
    }

    async fn dispatch(&mut self, method: &str, params: Value, id: Option<RequestId>) -> Dispatched {
        match method {
            "session/open" => match parse::<OpenParams>(params) {
                Ok(params) => self.open(params, id).await,
                Err(err) => Dispatched::Now(Err(err), None),
            },
            "tool/invoke" => {
                let params: InvokeParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let (handle, live) = match self.attachment(&params.session_id).await {
                    Ok(found) => found,
                    Err(err) => return Dispatched::Now(Err(err.into()), None),
                };
                // Counted against the session's in-flight limit now, in the order requests
                // arrive; tools may run for long, so the answer comes from a task and the
                // connection keeps reading.
                let call = handle.invoke_tool(params.name, params.arguments);
                tokio::spawn(async move {
                    let outcome = call
                        .await
                        .map(|result| json!(result))
                        .map_err(RpcError::from);
                    if let Some(frame) = answer(&id, outcome) {
                        let _ = live.send(frame).await;
                    }
                });
                Dispatched::Answered
            }
            "tool/list" => {
                self.with_session(params, |handle| async move {
                    handle.tool_list().await.map_err(RpcError::from)
                })
                .await
            }
            "turn/start" => {
                let params: TurnParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let text: Vec<&str> = params
                    .input
                    .iter()
                    .map(|InputItem::Text { text }| text.as_str())
                    .collect();
                if text.is_empty() {
                    return Dispatched::Now(
                        Err(RpcError::params(
                            "input needs at least one {kind: \"text\", text} item",
                        )),
                        None,
                    );
                }
                let input = text.join("\n");
                let turn_id = params.turn_id;
                let args = json!({"session_id": params.session_id});
                self.with_session(args, |handle| async move {
                    handle
                        .start_turn(input, turn_id)
                        .await
                        .map(|turn_id| json!({"turn_id": turn_id}))
                        .map_err(RpcError::from)
                })
                .await
            }
            "turn/interrupt" => {
                self.with_session(params, |handle| async move {
                    handle
                        .interrupt()
                        .await
                        .map(|interrupted| json!({"interrupted": interrupted}))
                        .map_err(RpcError::from)
                })
                .await
            }
            "user_input/respond" => {
                let params: RespondParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let args = json!({"session_id": params.session_id});
                self.with_session(args, |handle| async move {
                    handle
                        .respond_user_input(params.request_id, params.answers)
                        .await
                        .map(|()| json!({}))
                        .map_err(RpcError::from)
                })
                .await
            }
            "task/list" => {
                let params: SessionParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let outcome = self.task_list(&params.session_id).await;
                Dispatched::Now(outcome, None)
            }
            "task/output/read" => {
                let params: TaskParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                let outcome = self.read_output(&params).await;
                Dispatched::Now(outcome, None)
            }
            "task/cancel" => {
                let params: TaskParams = match parse(params) {
                    Ok(p) => p,
                    Err(err) => return Dispatched::Now(Err(err), None),
                };
                // Cancelling waits for the task to end; the connection keeps reading meanwhile.
                // The answer follows the session's own events when this connection watches it.
                let out = self
                    .attached
                    .get(&params.session_id)
                    .map_or_else(|| self.out.clone(), |a| a.live.clone());
                let (app, caller) = (self.app.clone(), self.caller.clone());
                tokio::spawn(async move {
                    let outcome = cancel_task(&app, &caller, &params).await;
                    if let Some(frame) = answer(&id, outcome) {
                        let _ = out.send(frame).await;
                    }
                });
                Dispatched::Answered
            }
            other => Dispatched::Now(
                Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    "method_not_found",
                    format!("unknown method {other:?}"),
                )),
                None,
            ),
        }
    }

    /// Runs `action` on the session named in `params`, answering through its live queue.
    async fn with_session<F, Fut>(&mut self, params: Value, action: F) -> Dispatched
    where
        F: FnOnce(SessionHandle) -> Fut,
        Fut: std::future::Future<Output = Result<Value, RpcError>>,
    {
        let params: SessionParams = match parse(params) {
            Ok(p) => p,
            Err(err) => return Dispatched::Now(Err(err), None),
        };
        match self.attachment(&params.session_id).await {
            Ok((handle, live)) => Dispatched::Now(action(handle).await, Some(live)),
            Err(err) => Dispatched::Now(Err(err.into()), None),
        }
    }

    /// The watched session, attaching (live only) when this connection has not opened it yet.
    async fn attachment(
        &mut self,
        session_id: &str,
    ) -> Result<(SessionHandle, mpsc::Sender<Outbound>), SessionError> {
        if let Some(existing) = self.attached.get(session_id)
            && !existing.handle.is_closed()
        {
            return Ok((existing.handle.clone(), existing.live.clone()));
        }
        let (live, live_rx) = mpsc::channel(self.app.config().server.ws_queue_frames);
        let watcher = Watcher {
            connection_id: self.id,
            tx: live.clone(),
            lagged: self.lagged.clone(),
        };
        let (handle, _) = self.attach(session_id, watcher).await?;
        self.forward(live_rx);
        self.attached.insert(
            session_id.to_string(),
            Attachment {
                handle: handle.clone(),
                live: live.clone(),
            },
        );
        Ok((handle, live))
    }

    /// Attaches a watcher, loading the actor again if it unloaded in between.
    async fn attach(
        &self,
        session_id: &str,
        watcher: Watcher,
    ) -> Result<(SessionHandle, (i64, Arc<ToolCatalog>)), SessionError> {
        let mut attempts = 0;
        loop {
            let handle = self.app.sessions().handle(&self.caller, session_id).await?;
            match handle.attach(watcher.clone()).await {
                Ok(attached) => return Ok((handle, attached)),
                // An idle actor may unload between lookup and attach; a fresh one is loaded.
                Err(SessionError::ActorGone) if attempts < 3 => attempts += 1,
                Err(err) => return Err(err),
            }
        }
    }

    /// Lets the writer drain a session's live frames, after everything queued so far.
    fn forward(&self, live_rx: mpsc::Receiver<Outbound>) {
        // Fails only once the writer has ended, and then nothing more is written anyway.
        let _ = self.follow.send(live_rx);
    }

    /// `session/open`: create or re-attach, replay `after_seq`, answer, then go live.
    async fn open(&mut self, params: OpenParams, id: Option<RequestId>) -> Dispatched {
        let sessions = self.app.sessions().clone();
        let (session_id, resumed) = match &params.session_id {
            Some(session_id) => match sessions.row(&self.caller, session_id).await {
                Ok(row) => (row.session_id, true),
                Err(err) => return Dispatched::Now(Err(err.into()), None),
            },
            None => match sessions.create(&self.caller, params.cwd.as_deref()).await {
                Ok((_handle, row)) => (row.session_id, false),
                Err(err) => return Dispatched::Now(Err(err.into()), None),
            },
        };
        if let Some(previous) = self.attached.remove(&session_id) {
            previous.handle.detach(self.id).await;
        }
        let (live, live_rx) = mpsc::channel(self.app.config().server.ws_queue_frames);
        let watcher = Watcher {
            connection_id: self.id,
            tx: live.clone(),
            lagged: self.lagged.clone(),
        };
        let (handle, (last_seq, catalog)) = match self.attach(&session_id, watcher).await {
            Ok(attached) => attached,
            Err(err) => return Dispatched::Now(Err(err.into()), None),
        };
        // Events up to last_seq come from the store, later ones from the live queue, which
        // starts draining only after the replay and the answer: no gap, no duplicate.
        if let Some(after_seq) = params.after_seq
            && let Err(err) = self.replay(&session_id, after_seq, last_seq).await
        {
            handle.detach(self.id).await;
            return Dispatched::Now(Err(err.into()), None);
        }
        let opened = OpenedSession {
            session_id: session_id.clone(),
            resumed,
            last_seq,
            capabilities: sessions.capabilities(&catalog),
            tools: ToolNames::of(&catalog),
        };
        let mut result = json!(opened);
        // Extension: a client can offer the tool console before a turn/start is refused.
        result["llm_configured"] = json!(self.app.config().llm.is_configured());
        result["sandbox"] = json!(sessions.sandbox_report());
        if let Some(frame) = answer(&id, Ok(result)) {
            let _ = self.out.send(frame).await;
        }
        self.forward(live_rx);
        self.attached
            .insert(session_id, Attachment { handle, live });
        Dispatched::Answered
    }

    /// Sends stored events with `after_seq < seq <= up_to`, in order.
    async fn replay(
        &self,
        session_id: &str,
        after_seq: i64,
        up_to: i64,
    ) -> Result<(), SessionError> {
        let store = self.app.sessions().store();
        let mut cursor = after_seq.max(0);
        while cursor < up_to {
            let page = store
                .events_after(
                    session_id,
                    cursor,
                    REPLAY_PAGE.min(up_to.saturating_sub(cursor)),
                )
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            cursor = last.seq;
            for event in page.into_iter().filter(|e| e.seq <= up_to) {
                let frame = crate::session::notification_frame(&event.method, &event.params);
                if self.out.send(Outbound::Text(frame)).await.is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn task_list(&mut self, session_id: &str) -> Result<Value, RpcError> {
        self.app.sessions().row(&self.caller, session_id).await?;
        let tasks = self
            .app
            .sessions()
            .store()
            .list_tasks(session_id)
            .await
            .map_err(SessionError::from)?;
        let tasks: Vec<TaskRow> = tasks.into_iter().map(with_live_size).collect();
        Ok(json!({ "tasks": tasks }))
    }

    /// The session's task named in `params` (`unknown_task` for any other).
    async fn session_task(&mut self, params: &TaskParams) -> Result<TaskRow, RpcError> {
        self.app
            .sessions()
            .row(&self.caller, &params.session_id)
            .await?;
        task_of_session(
            self.app.sessions().store(),
            &params.task_id,
            &params.session_id,
        )
        .await
        .map_err(task_error)
    }

    async fn read_output(&mut self, params: &TaskParams) -> Result<Value, RpcError> {
        let task = self.session_task(params).await?;
        let query = params.output.to_query().map_err(RpcError::params)?;
        read_task_output(&task, query).await.map_err(task_error)
    }
}

/// `task/cancel`: stops the session's task and answers its final state.
async fn cancel_task(
    app: &AppState,
    caller: &Caller,
    params: &TaskParams,
) -> Result<Value, RpcError> {
    let sessions = app.sessions();
    sessions.row(caller, &params.session_id).await?;
    let task = task_of_session(sessions.store(), &params.task_id, &params.session_id)
        .await
        .map_err(task_error)?;
    if task.state == crate::store::TaskState::Running {
        let handle = sessions.handle(caller, &params.session_id).await?;
        if let Some(state) = handle.cancel_task(params.task_id.clone()).await? {
            return Ok(json!({"task_id": params.task_id, "state": state}));
        }
    }
    // Not running in this server: what the store says now is the answer.
    let task = task_of_session(sessions.store(), &params.task_id, &params.session_id)
        .await
        .map_err(task_error)?;
    Ok(json!({"task_id": params.task_id, "state": task.state}))
}

fn task_error(err: TaskReadError) -> RpcError {
    match err {
        TaskReadError::UnknownTask(id) => SessionError::UnknownTask(id).into(),
        TaskReadError::Store(err) => SessionError::Store(err).into(),
        TaskReadError::Unreadable(message) => RpcError::new(SERVER_ERROR, "internal", message),
    }
}

/// How a request was handled.
enum Dispatched {
    /// The answer was (or will be) sent by the handler itself.
    Answered,
    /// Send this answer, through the session's live queue when given.
    Now(Result<Value, RpcError>, Option<mpsc::Sender<Outbound>>),
}
