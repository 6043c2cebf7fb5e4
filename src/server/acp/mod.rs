//! `agentd acp`: the Agent Client Protocol (v1) on stdio, so editors (Zed, JetBrains) and
//! headless clients (acpx) drive agentd sessions in-process, on the configured store, with the
//! same sandbox and policy as the server.
//!
//! Newline-delimited JSON-RPC 2.0: requests come on stdin, and stdout carries only protocol
//! lines, written by one writer task. Each ACP session is an agentd session watched like a
//! WebSocket client watches it; a pump task per session turns its notifications into
//! `session/update`s and its approval requests into `session/request_permission` requests.
//! `session/prompt` starts a turn with an id chosen here, so its end is recognised whatever
//! the order of the start's answer and the turn's last notification.
//!
//! `agentd acp --url ws://…/api/ws` speaks the same protocol to the editor but hosts nothing:
//! each ACP session is then a session of a running agentd, reached over its WebSocket and
//! REST API ([`remote`]), so the editor shares the server's sessions, store and users.

mod remote;

pub use remote::BridgeError;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Server;
use crate::agent::approval::Decision;
use crate::agent::event::TurnCompletion;
use crate::error_kind::{
    ErrorKind, RPC_INVALID_PARAMS, RPC_INVALID_REQUEST, RPC_METHOD_NOT_FOUND, RPC_PARSE_ERROR,
    RPC_SERVER_ERROR,
};
use crate::mcp::McpServerConfig;
use crate::mutex::lock;
use crate::session::frames::{FrameQueue, frame_queue};
use crate::session::{
    Caller, ImageInput, ModelChoice, Outbound, SessionError, SessionHandle, Sessions, Watcher,
};
use crate::store::Store;
use crate::tools::Effects;

/// The ACP version spoken.
pub const PROTOCOL_VERSION: u64 = 1;

/// ACP's error code for a resource that does not exist (JSON-RPC's own are `error_kind`'s).
const NOT_FOUND: i64 = -32002;

/// Frames waiting for the writer; the reader and every session's pump hold senders.
const OUT_QUEUE: usize = 1024;
/// Notifications waiting for a session's pump (the session's watcher queue).
const WATCH_QUEUE: usize = 4096;

/// The approval modes `session/set_mode` chooses between: how this connection answers the
/// calls the server's `[tool_policy]` says need a person.
const MODES: &[(&str, &str, &str)] = &[
    (
        "ask",
        "Ask",
        "Calls that need approval are asked about (session/request_permission)",
    ),
    (
        "approve",
        "Approve all",
        "Calls that need approval run without asking; deny rules still refuse",
    ),
    (
        "decline",
        "Decline all",
        "Calls that need approval are declined without asking",
    ),
];

/// A JSON-RPC error answer.
#[derive(Debug, Clone, PartialEq)]
struct RpcError {
    code: i64,
    message: String,
    kind: ErrorKind,
}

impl RpcError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: RPC_INVALID_PARAMS,
            message: message.into(),
            kind: ErrorKind::InvalidParams,
        }
    }

    fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message, "data": {"kind": self.kind}})
    }
}

impl From<SessionError> for RpcError {
    fn from(err: SessionError) -> Self {
        let kind = err.kind();
        // ACP has a code of its own for a resource that does not exist.
        let code = match kind {
            ErrorKind::UnknownSession => NOT_FOUND,
            kind => kind.row().rpc,
        };
        Self {
            code,
            message: err.to_string(),
            kind,
        }
    }
}

/// How a prompt's turn ended, as its pump saw it.
#[derive(Debug)]
struct TurnEnd {
    method: String,
    params: Value,
}

/// The prompt waiting for its turn to end.
struct Waiter {
    turn_id: String,
    done: oneshot::Sender<TurnEnd>,
    cancelled: bool,
}

/// Where the sessions live: in this process, or in a running agentd the connection bridges to.
enum Backend {
    Local {
        sessions: Sessions,
        store: Arc<dyn Store>,
    },
    Remote(Arc<remote::Remote>),
}

/// One stored event, as a replay reads it.
struct Replayed {
    seq: i64,
    method: String,
    params: Value,
}

/// One session as this connection acts on it: the in-process actor's handle, or the session's
/// id on the server bridged to.
#[derive(Clone)]
enum Link {
    Local(SessionHandle),
    Remote(Arc<remote::Remote>, String),
}

impl Link {
    async fn interrupt(&self) {
        match self {
            Self::Local(handle) => {
                let _ = handle.interrupt().await;
            }
            Self::Remote(remote, session_id) => {
                let _ = remote
                    .call("turn/interrupt", json!({"session_id": session_id}))
                    .await;
            }
        }
    }

    async fn respond_approval(
        &self,
        approval_id: String,
        decision: Decision,
        message: Option<String>,
    ) -> Result<(), RpcError> {
        match self {
            Self::Local(handle) => Ok(handle
                .respond_approval(approval_id, decision, message)
                .await?),
            Self::Remote(remote, session_id) => {
                let mut params = json!({"session_id": session_id, "approval_id": approval_id,
                    "decision": decision});
                if let Some(message) = message {
                    params["message"] = Value::String(message);
                }
                remote.call("approval/respond", params).await.map(|_| ())
            }
        }
    }

    /// Starts a turn with the id `turn_id` right after the last one was seen to end.
    async fn start_turn(
        &self,
        text: String,
        images: Vec<ImageInput>,
        turn_id: String,
    ) -> Result<(), RpcError> {
        match self {
            Self::Local(handle) => {
                handle
                    .start_turn_after_end(text, images, Some(turn_id), ModelChoice::default(), None)
                    .await?;
                Ok(())
            }
            Self::Remote(remote, session_id) => {
                let mut input = vec![json!({"kind": "text", "text": text})];
                for image in images {
                    let mut item = serde_json::to_value(image).unwrap_or_default();
                    item["kind"] = json!("image");
                    input.push(item);
                }
                let params = json!({"session_id": session_id, "input": input, "turn_id": turn_id});
                // As in-process: the last turn's `turn/completed` is out a moment before its
                // slot is free.
                let mut tries = 0;
                loop {
                    match remote.call("turn/start", params.clone()).await {
                        Err(err) if err.kind == ErrorKind::TurnInProgress && tries < 100 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => return other.map(|_| ()),
                    }
                }
            }
        }
    }

    /// Each of the session's tools: its name, tags and effects.
    async fn tools(&self) -> Vec<(String, Vec<String>, Effects)> {
        match self {
            Self::Local(handle) => handle
                .catalog()
                .await
                .map(|catalog| {
                    catalog
                        .entries
                        .iter()
                        .map(|entry| {
                            (
                                entry.name().to_string(),
                                entry.tags().iter().map(|tag| (*tag).to_string()).collect(),
                                entry.effects(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            Self::Remote(remote, session_id) => {
                let Ok(list) = remote
                    .call("tool/list", json!({"session_id": session_id}))
                    .await
                else {
                    return Vec::new();
                };
                ["active", "deferred"]
                    .iter()
                    .filter_map(|part| list[*part].as_array())
                    .flatten()
                    .filter_map(|info| {
                        let tags = info["tags"]
                            .as_array()
                            .map(|tags| {
                                tags.iter()
                                    .filter_map(Value::as_str)
                                    .map(str::to_string)
                                    .collect()
                            })
                            .unwrap_or_default();
                        Some((
                            info["name"].as_str()?.to_string(),
                            tags,
                            // A tool whose effects are not told counts as doing everything.
                            serde_json::from_value(info["effects"].clone())
                                .unwrap_or(Effects::RUNS_COMMANDS),
                        ))
                    })
                    .collect()
            }
        }
    }
}

/// One ACP session: an agentd session this connection watches.
struct AcpSession {
    link: Link,
    /// The session's directory, absolute, for the locations of tool calls.
    dir: PathBuf,
    /// The `MODES` entry in force.
    mode: Mutex<&'static str>,
    /// Tools the client answered `reject_always` for: declined without asking again.
    rejected: Mutex<HashSet<String>>,
    /// The running prompt, when one runs.
    turn: Mutex<Option<Waiter>>,
}

impl AcpSession {
    fn mode(&self) -> &'static str {
        *lock(&self.mode)
    }
}

/// What the connection shares between its reader, its request tasks and its pumps.
struct Connection {
    backend: Backend,
    /// Whom the in-process sessions belong to.
    caller: Caller,
    /// The caller's workspace root, canonical: ACP's absolute `cwd`s must lie inside it.
    workspace: PathBuf,
    /// To the writer task, which ends once every sender is gone.
    out: mpsc::Sender<String>,
    next_id: AtomicU64,
    /// Requests sent to the client, by id, waiting for its answer.
    asked: Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>,
    open: Mutex<HashMap<String, Arc<AcpSession>>>,
    next_watcher: AtomicU64,
    /// Fired when stdin closes: pumps and waiting prompts stop.
    closed: CancellationToken,
}

/// Why in-process `agentd acp` cannot serve the `--user` it was given (or not given).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcpUserError {
    /// The configuration has users, and no `--user` says which one this is.
    #[error(
        "the configuration has [[server.users]]: agentd acp needs --user NAME to say whose \
         sessions and workspace it serves"
    )]
    Missing,
    /// `--user` names no configured user.
    #[error("--user {0:?} is not one of [[server.users]]")]
    Unknown(String),
    /// `--user` without `[[server.users]]`.
    #[error("--user goes with [[server.users]], and the configuration has none")]
    NoUsers,
}

/// Whom in-process `agentd acp` acts for: the configured user `user` names, which a
/// configuration with `[[server.users]]` requires, as the server requires a user's token.
pub fn acp_caller(
    users: &[crate::config::UserConfig],
    user: Option<String>,
) -> Result<Caller, AcpUserError> {
    match (users.is_empty(), user) {
        (true, None) => Ok(Caller::anonymous()),
        (true, Some(_)) => Err(AcpUserError::NoUsers),
        (false, None) => Err(AcpUserError::Missing),
        (false, Some(user)) if users.iter().any(|known| known.name == user) => {
            Ok(Caller { user: Some(user) })
        }
        (false, Some(user)) => Err(AcpUserError::Unknown(user)),
    }
}

impl Server {
    /// Speaks ACP on `input` and `output` for `caller` (from [`acp_caller`]) until `input`
    /// closes, then stops the server; answers the exit code. The caller's sessions live under
    /// their workspace root, as on the server: with users, `<workspace>/<user>`.
    pub async fn acp<R, W>(self, caller: Caller, input: R, output: W) -> u8
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let sessions = self.state.sessions().clone();
        let root = sessions.user_root(&caller);
        // Made now (the last component only, following no link), so the root canonicalises
        // as the editor's absolute cwds do from the first session on.
        match std::fs::create_dir(&root) {
            Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
                tracing::warn!(root = %root.display(), %err, "cannot create the workspace root");
            }
            _ => {}
        }
        let backend = Backend::Local {
            sessions,
            store: Arc::clone(&self.store),
        };
        speak(backend, caller, &root, input, output, self.cancel.clone()).await;
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.store.close().await;
        0
    }
}

/// `agentd acp --url`: speaks ACP on `input` and `output` for the sessions of the agentd whose
/// WebSocket is `url`, until `input` closes (exit code 0) or that agentd goes away (1). ACP's
/// absolute `cwd`s are taken relative to `workspace`, the server's workspace root as this
/// side sees it (the user's root, on a server with users).
pub async fn bridge<R, W>(
    url: &str,
    token: Option<String>,
    workspace: &Path,
    input: R,
    output: W,
) -> Result<u8, BridgeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let remote = remote::Remote::connect(url, token).await?;
    let gone = remote.gone();
    speak(
        Backend::Remote(Arc::clone(&remote)),
        // The token says who this is, to the server.
        Caller::anonymous(),
        workspace,
        input,
        output,
        gone.clone(),
    )
    .await;
    let code = if gone.is_cancelled() {
        tracing::error!(url, "agentd closed the connection");
        1
    } else {
        0
    };
    remote.close();
    Ok(code)
}

/// Serves one ACP client on `input` and `output` until `input` closes or `stop` fires.
async fn speak<R, W>(
    backend: Backend,
    caller: Caller,
    workspace: &Path,
    input: R,
    output: W,
    stop: CancellationToken,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, rx) = mpsc::channel(OUT_QUEUE);
    let writer = tokio::spawn(write_lines(rx, output));
    let connection = Arc::new(Connection {
        backend,
        caller,
        workspace: std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf()),
        out,
        next_id: AtomicU64::new(0),
        asked: Mutex::new(HashMap::new()),
        open: Mutex::new(HashMap::new()),
        next_watcher: AtomicU64::new(u64::MAX / 2),
        closed: CancellationToken::new(),
    });
    let mut lines = BufReader::new(input).lines();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            () = stop.cancelled() => break,
        };
        match line {
            Ok(Some(line)) if line.trim().is_empty() => {}
            Ok(Some(line)) => connection.receive(&line),
            Ok(None) | Err(_) => break,
        }
    }
    connection.closed.cancel();
    let open: Vec<Arc<AcpSession>> = lock(&connection.open).drain().map(|(_, s)| s).collect();
    for session in open {
        session.link.interrupt().await;
    }
    drop(connection);
    // Every sender is gone with the connection and its tasks: the writer drains and ends.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// Writes each frame as one line, flushed, so the client sees it at once.
async fn write_lines<W: AsyncWrite + Unpin>(mut rx: mpsc::Receiver<String>, mut output: W) {
    while let Some(mut line) = rx.recv().await {
        line.push('\n');
        if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}

impl Connection {
    async fn send(&self, frame: Value) {
        let _ = self.out.send(frame.to_string()).await;
    }

    async fn notify(&self, session_id: &str, update: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session_id, "update": update}}))
            .await;
    }

    /// Sends a request to the client and waits for its answer (`Err` holds its error).
    async fn ask(&self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.asked).insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        tokio::select! {
            answer = rx => answer.unwrap_or_else(|_| Err(json!({"message": "no answer"}))),
            () = self.closed.cancelled() => Err(json!({"message": "the client went away"})),
        }
    }

    /// Handles one line from the client: a request (in a task of its own, so a long prompt
    /// never holds up a cancel), a notification, or the answer to one of our requests.
    fn receive(self: &Arc<Self>, line: &str) {
        let frame: Value = match serde_json::from_str(line) {
            Ok(frame) => frame,
            Err(err) => {
                let error = RpcError {
                    code: RPC_PARSE_ERROR,
                    message: format!("not JSON: {err}"),
                    kind: ErrorKind::ParseError,
                };
                self.answer_later(Value::Null, Err(error));
                return;
            }
        };
        let id = frame.get("id").cloned();
        let Some(method) = frame.get("method").and_then(Value::as_str) else {
            // An answer to a request of ours.
            if let Some(waiting) = id
                .as_ref()
                .and_then(Value::as_u64)
                .and_then(|id| lock(&self.asked).remove(&id))
            {
                let answer = match frame.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = waiting.send(answer);
            } else if id.is_some() && frame.get("result").is_none() && frame.get("error").is_none()
            {
                let error = RpcError {
                    code: RPC_INVALID_REQUEST,
                    message: "a request needs a string method".into(),
                    kind: ErrorKind::InvalidRequest,
                };
                self.answer_later(id.unwrap_or(Value::Null), Err(error));
            }
            return;
        };
        let method = method.to_string();
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        let connection = Arc::clone(self);
        match id {
            None => {
                tokio::spawn(async move { connection.notification(&method, params).await });
            }
            Some(id) => {
                tokio::spawn(async move {
                    let answer = connection.request(&method, params).await;
                    connection.answer(id, answer).await;
                });
            }
        }
    }

    fn answer_later(self: &Arc<Self>, id: Value, answer: Result<Value, RpcError>) {
        let connection = Arc::clone(self);
        tokio::spawn(async move { connection.answer(id, answer).await });
    }

    async fn answer(&self, id: Value, answer: Result<Value, RpcError>) {
        let frame = match answer {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error.to_json()}),
        };
        self.send(frame).await;
    }

    async fn notification(self: &Arc<Self>, method: &str, params: Value) {
        if method == "session/cancel"
            && let Some(session_id) = params["sessionId"].as_str()
            && let Some(session) = self.session(session_id)
        {
            if let Some(waiter) = lock(&session.turn).as_mut() {
                waiter.cancelled = true;
            }
            session.link.interrupt().await;
        }
        // Other notifications ($/cancel_request among them) need nothing from us.
    }

    async fn request(self: &Arc<Self>, method: &str, params: Value) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(initialize_result()),
            "authenticate" => Ok(json!({})),
            "session/new" => self.new_session(&params).await,
            "session/load" => self.load_session(&params).await,
            "session/prompt" => self.prompt(&params).await,
            "session/set_mode" => self.set_mode(&params).await,
            _ => Err(RpcError {
                code: RPC_METHOD_NOT_FOUND,
                message: format!("agentd acp does not offer {method}"),
                kind: ErrorKind::MethodNotFound,
            }),
        }
    }

    fn session(&self, session_id: &str) -> Option<Arc<AcpSession>> {
        lock(&self.open).get(session_id).cloned()
    }

    /// `cwd` (absolute) as a directory relative to the workspace, or why it cannot be one.
    fn relative_cwd(&self, params: &Value) -> Result<String, RpcError> {
        let cwd = params["cwd"]
            .as_str()
            .ok_or_else(|| RpcError::invalid("cwd (an absolute path) is required"))?;
        let path = Path::new(cwd);
        if !path.is_absolute() {
            return Err(RpcError::invalid(format!(
                "cwd {cwd} is not an absolute path"
            )));
        }
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        path.strip_prefix(&self.workspace)
            .map(|rel| rel.to_string_lossy().into_owned())
            .map_err(|_| {
                RpcError::invalid(format!(
                    "cwd {cwd} is outside agentd's workspace {}; open a folder inside it, or \
                     start agentd acp with --workspace set to the project",
                    self.workspace.display()
                ))
            })
    }

    async fn new_session(self: &Arc<Self>, params: &Value) -> Result<Value, RpcError> {
        let cwd = self.relative_cwd(params)?;
        let mcp = mcp_servers(&params["mcpServers"])?;
        let names: Vec<String> = mcp.iter().map(|server| server.name.clone()).collect();
        let session_id = match &self.backend {
            Backend::Local { sessions, .. } => {
                let caller = self.caller.clone();
                let (handle, row) = sessions.create_with_mcp(&caller, Some(&cwd), mcp).await?;
                if let Err(err) = wait_for_mcp(&handle, &names).await {
                    let _ = sessions.delete(&caller, &row.session_id).await;
                    return Err(err);
                }
                let dir = self.workspace.join(&row.cwd);
                let attached = self.attach_local(&handle).await?;
                self.open(Link::Local(handle), dir, attached, None).await?;
                row.session_id
            }
            Backend::Remote(remote) => {
                refuse_client_mcp(&names)?;
                let opened = remote.call("session/open", json!({"cwd": cwd})).await?;
                let session_id = opened["session_id"]
                    .as_str()
                    .ok_or_else(|| RpcError::invalid("agentd answered session/open without an id"))?
                    .to_string();
                let (tx, rx) = frame_queue(WATCH_QUEUE);
                let lagged = CancellationToken::new();
                remote.route(&session_id, tx, lagged.clone());
                let last_seq = opened["last_seq"].as_i64().unwrap_or_default();
                let link = Link::Remote(Arc::clone(remote), session_id.clone());
                let dir = self.workspace.join(&cwd);
                self.open(link, dir, (last_seq, rx, lagged), None).await?;
                session_id
            }
        };
        Ok(json!({"sessionId": session_id, "modes": modes("ask")}))
    }

    async fn load_session(self: &Arc<Self>, params: &Value) -> Result<Value, RpcError> {
        let session_id = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid("sessionId is required"))?;
        let caller = self.caller.clone();
        let (last_seq, cwd, messages) = match &self.backend {
            Backend::Local { sessions, store } => {
                let row = sessions.row(&caller, session_id).await?;
                let messages = store
                    .messages(session_id)
                    .await
                    .map_err(|err| RpcError::from(SessionError::from(err)))?;
                (row.last_seq, row.cwd, messages)
            }
            Backend::Remote(remote) => {
                let row = remote.get(&format!("/api/sessions/{session_id}")).await?;
                let messages = remote
                    .get(&format!("/api/sessions/{session_id}/messages"))
                    .await?;
                let cwd = row["cwd"].as_str().unwrap_or_default().to_string();
                let messages = messages["messages"].as_array().cloned().unwrap_or_default();
                (row["last_seq"].as_i64().unwrap_or_default(), cwd, messages)
            }
        };
        let replay = Replay {
            last_seq,
            prompts: user_prompts(&messages),
        };
        if let Some(session) = self.session(session_id) {
            let mut translator = Translator::new(&session, true);
            translator.prompts = replay.prompts.into();
            self.replay(session_id, &session, &mut translator, replay.last_seq)
                .await?;
            return Ok(json!({"modes": modes(session.mode())}));
        }
        let mcp = mcp_servers(&params["mcpServers"])?;
        let names: Vec<String> = mcp.iter().map(|server| server.name.clone()).collect();
        let dir = self.workspace.join(&cwd);
        match &self.backend {
            Backend::Local { sessions, .. } => {
                let handle = sessions.handle_with_mcp(&caller, session_id, mcp).await?;
                wait_for_mcp(&handle, &names).await?;
                let attached = self.attach_local(&handle).await?;
                self.open(Link::Local(handle), dir, attached, Some(replay))
                    .await?;
            }
            Backend::Remote(remote) => {
                refuse_client_mcp(&names)?;
                // Routed before the attach, so nothing after its `last_seq` is missed.
                let (tx, rx) = frame_queue(WATCH_QUEUE);
                let lagged = CancellationToken::new();
                remote.route(session_id, tx, lagged.clone());
                let opened = remote
                    .call("session/open", json!({"session_id": session_id}))
                    .await;
                let opened = match opened {
                    Ok(opened) => opened,
                    Err(err) => {
                        remote.unroute(session_id);
                        return Err(err);
                    }
                };
                let last_seq = opened["last_seq"].as_i64().unwrap_or_default();
                let link = Link::Remote(Arc::clone(remote), session_id.to_string());
                self.open(link, dir, (last_seq, rx, lagged), Some(replay))
                    .await?;
            }
        }
        Ok(json!({"modes": modes("ask")}))
    }

    /// Watches an in-process session like a WebSocket client: its last `seq` when attached,
    /// and the queue its later events arrive on.
    async fn attach_local(&self, handle: &SessionHandle) -> Result<Attached, RpcError> {
        let (tx, rx) = frame_queue(WATCH_QUEUE);
        let lagged = CancellationToken::new();
        let watcher = Watcher {
            connection_id: self.next_watcher.fetch_add(1, Ordering::Relaxed),
            tx,
            lagged: lagged.clone(),
        };
        let (last_seq, _) = handle.attach_replaying(watcher, None).await?;
        Ok((last_seq, rx, lagged))
    }

    /// Watches a session for the client: replays what `replay` asks for first, then starts
    /// the session's pump on the live events (held in the attachment's queue meanwhile).
    async fn open(
        self: &Arc<Self>,
        link: Link,
        dir: PathBuf,
        (last_seq, rx, lagged): Attached,
        replay: Option<Replay>,
    ) -> Result<(), RpcError> {
        let session_id = match &link {
            Link::Local(handle) => handle.session_id().to_string(),
            Link::Remote(_, session_id) => session_id.clone(),
        };
        let session = Arc::new(AcpSession {
            link,
            dir,
            mode: Mutex::new("ask"),
            rejected: Mutex::new(HashSet::new()),
            turn: Mutex::new(None),
        });
        let mut translator = Translator::new(&session, false);
        translator.learn(&session.link).await;
        if let Some(replay) = replay {
            let mut replaying = Translator::new(&session, true);
            replaying.kinds = translator.kinds.clone();
            replaying.prompts = replay.prompts.into();
            self.replay(&session_id, &session, &mut replaying, last_seq)
                .await?;
        }
        lock(&self.open).insert(session_id.clone(), Arc::clone(&session));
        let connection = Arc::clone(self);
        tokio::spawn(async move {
            connection
                .pump(&session_id, session, translator, rx, lagged)
                .await;
        });
        Ok(())
    }

    /// Up to `limit` stored events of a session after `after`, in order.
    async fn events_after(
        &self,
        session_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Replayed>, RpcError> {
        match &self.backend {
            Backend::Local { store, .. } => Ok(store
                .events_after(session_id, after, limit.into())
                .await
                .map_err(|err| RpcError::from(SessionError::from(err)))?
                .into_iter()
                .map(|event| Replayed {
                    seq: event.seq,
                    method: event.method,
                    params: event.params,
                })
                .collect()),
            Backend::Remote(remote) => {
                let page = remote
                    .get(&format!(
                        "/api/sessions/{session_id}/events?after_seq={after}&limit={limit}"
                    ))
                    .await?;
                Ok(page["events"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|event| {
                        Some(Replayed {
                            seq: event["seq"].as_i64()?,
                            method: event["method"].as_str()?.to_string(),
                            params: event["params"].clone(),
                        })
                    })
                    .collect())
            }
        }
    }

    /// Sends the stored events up to `last_seq` as `session/update`s.
    async fn replay(
        &self,
        session_id: &str,
        session: &Arc<AcpSession>,
        translator: &mut Translator,
        last_seq: i64,
    ) -> Result<(), RpcError> {
        let mut cursor = 0;
        while cursor < last_seq {
            let page = self.events_after(session_id, cursor, 500).await?;
            let Some(last) = page.last() else { break };
            cursor = last.seq;
            for event in page.into_iter().filter(|event| event.seq <= last_seq) {
                if translator.needs_catalog(&event.method, &event.params) {
                    translator.learn(&session.link).await;
                }
                for step in translator.step(&event.method, &event.params) {
                    if let Step::Update(update) = step {
                        self.notify(session_id, update).await;
                    }
                }
            }
        }
        Ok(())
    }

    /// Follows one session's live events until it or the connection goes away.
    async fn pump(
        self: Arc<Self>,
        session_id: &str,
        session: Arc<AcpSession>,
        mut translator: Translator,
        mut rx: FrameQueue,
        lagged: CancellationToken,
    ) {
        loop {
            let frame = tokio::select! {
                frame = rx.recv() => frame,
                () = self.closed.cancelled() => None,
                () = lagged.cancelled() => None,
            };
            let Some(Outbound::Text(text)) = frame else {
                break;
            };
            let Ok(frame) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let method = frame["method"].as_str().unwrap_or_default();
            let params = &frame["params"];
            if translator.needs_catalog(method, params) {
                translator.learn(&session.link).await;
            }
            for step in translator.step(method, params) {
                match step {
                    Step::Update(update) => self.notify(session_id, update).await,
                    Step::Ask(ask) => {
                        let connection = Arc::clone(&self);
                        let session = Arc::clone(&session);
                        let session_id = session_id.to_string();
                        tokio::spawn(async move {
                            connection.decide(&session_id, &session, ask).await;
                        });
                    }
                    Step::Ended(end) => {
                        let mut turn = lock(&session.turn);
                        if turn
                            .as_ref()
                            .is_some_and(|w| params["turn_id"] == w.turn_id.as_str())
                            && let Some(waiter) = turn.take()
                        {
                            let _ = waiter.done.send(end);
                        }
                    }
                }
            }
        }
        // The session went away under the prompt, if one waits: it ends with an error.
        lock(&session.turn).take();
        lock(&self.open).remove(session_id);
    }

    /// Decides one call waiting for approval: by the mode, by an earlier `reject_always`, or
    /// by asking the client.
    async fn decide(&self, session_id: &str, session: &AcpSession, ask: Ask) {
        let rejected = lock(&session.rejected).contains(&ask.tool_name);
        let (decision, message) = match session.mode() {
            _ if rejected => (
                Decision::Decline,
                Some("the user declined this tool for the rest of the session".to_string()),
            ),
            "approve" => (Decision::Accept, None),
            "decline" => (
                Decision::Decline,
                Some("the session's mode declines calls that need approval".to_string()),
            ),
            _ => {
                let params = json!({
                    "sessionId": session_id,
                    "toolCall": ask.tool_call,
                    "options": permission_options(),
                });
                let answer = self.ask("session/request_permission", params).await;
                let option = answer.as_ref().ok().and_then(|result| {
                    (result["outcome"]["outcome"] == "selected")
                        .then(|| result["outcome"]["optionId"].as_str())
                        .flatten()
                });
                match option {
                    Some("allow_once") => (Decision::Accept, None),
                    Some("allow_always") => (Decision::AcceptForSession, None),
                    Some("reject_always") => {
                        lock(&session.rejected).insert(ask.tool_name.clone());
                        (
                            Decision::Decline,
                            Some("the user declined this tool".to_string()),
                        )
                    }
                    Some("reject_once") => (
                        Decision::Decline,
                        Some("the user declined this call".to_string()),
                    ),
                    _ => (
                        Decision::Decline,
                        Some("the permission request was cancelled".to_string()),
                    ),
                }
            }
        };
        let accepted = decision != Decision::Decline;
        let answered = session
            .link
            .respond_approval(ask.approval_id, decision, message)
            .await;
        if accepted && answered.is_ok() {
            self.notify(
                session_id,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": ask.tool_call["toolCallId"],
                    "status": "in_progress"}),
            )
            .await;
        }
    }

    async fn prompt(self: &Arc<Self>, params: &Value) -> Result<Value, RpcError> {
        let session_id = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid("sessionId is required"))?;
        let session = self.session(session_id).ok_or_else(|| RpcError {
            code: NOT_FOUND,
            message: format!(
                "session {session_id} is not open on this connection; session/new or session/load it first"
            ),
            kind: ErrorKind::UnknownSession,
        })?;
        let (text, images) = prompt_input(&params["prompt"])?;
        let turn_id = format!("turn_{}", uuid::Uuid::new_v4().simple());
        let (done, ended) = oneshot::channel();
        {
            let mut turn = lock(&session.turn);
            if turn.is_some() {
                return Err(SessionError::TurnInProgress.into());
            }
            *turn = Some(Waiter {
                turn_id: turn_id.clone(),
                done,
                cancelled: false,
            });
        }
        let started = session.link.start_turn(text, images, turn_id.clone()).await;
        if let Err(err) = started {
            lock(&session.turn).take();
            return Err(err);
        }
        // A cancel that came before the turn was under way interrupted nothing.
        if lock(&session.turn)
            .as_ref()
            .is_some_and(|waiter| waiter.cancelled)
        {
            session.link.interrupt().await;
        }
        let end = tokio::select! {
            end = ended => end.ok(),
            () = self.closed.cancelled() => None,
        };
        let cancelled = end.is_none() && self.closed.is_cancelled();
        match end {
            Some(end) => prompt_result(&end),
            None if cancelled => Ok(json!({"stopReason": "cancelled"})),
            None => Err(SessionError::ActorGone.into()),
        }
    }

    async fn set_mode(&self, params: &Value) -> Result<Value, RpcError> {
        let session_id = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid("sessionId is required"))?;
        let session = self.session(session_id).ok_or_else(|| RpcError {
            code: NOT_FOUND,
            message: format!("session {session_id} is not open on this connection"),
            kind: ErrorKind::UnknownSession,
        })?;
        let wanted = params["modeId"].as_str().unwrap_or_default();
        let Some((id, _, _)) = MODES.iter().find(|(id, _, _)| *id == wanted) else {
            let known: Vec<&str> = MODES.iter().map(|(id, _, _)| *id).collect();
            return Err(RpcError::invalid(format!(
                "unknown mode {wanted:?}; agentd's modes are {}",
                known.join(", ")
            )));
        };
        *lock(&session.mode) = id;
        Ok(json!({}))
    }
}

/// A session being watched: its last `seq` when attached, the queue its later events arrive
/// on, and the token that fires when that queue overflowed.
type Attached = (i64, FrameQueue, CancellationToken);

/// What `session/load` replays.
struct Replay {
    last_seq: i64,
    prompts: Vec<String>,
}

/// The `initialize` answer: what this agent offers.
fn initialize_result() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": {"image": true, "audio": false, "embeddedContext": true},
            "mcpCapabilities": {"http": true, "sse": false},
        },
        "authMethods": [],
        "agentInfo": {"name": "agentd", "title": "agentd", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// The `modes` of a session's answer, `current` in force.
fn modes(current: &str) -> Value {
    let available: Vec<Value> = MODES
        .iter()
        .map(|(id, name, description)| json!({"id": id, "name": name, "description": description}))
        .collect();
    json!({"currentModeId": current, "availableModes": available})
}

/// The four ACP answers to a permission request; each maps to an agentd decision.
fn permission_options() -> Value {
    json!([
        {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "allow_always", "name": "Allow for this session", "kind": "allow_always"},
        {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
        {"optionId": "reject_always", "name": "Reject for this session", "kind": "reject_always"},
    ])
}

/// An ACP prompt as agentd's input: the texts joined by newlines, and the images.
fn prompt_input(blocks: &Value) -> Result<(String, Vec<ImageInput>), RpcError> {
    let blocks = blocks
        .as_array()
        .ok_or_else(|| RpcError::invalid("prompt must be an array of content blocks"))?;
    let mut texts = Vec::new();
    let mut images = Vec::new();
    for block in blocks {
        match block["type"].as_str().unwrap_or_default() {
            "text" => texts.push(block["text"].as_str().unwrap_or_default().to_string()),
            "image" => {
                let mime = block["mimeType"].as_str().unwrap_or_default();
                let data = block["data"].as_str().unwrap_or_default();
                let image = crate::llm::ImageData::from_base64(mime, data)
                    .map_err(|why| RpcError::invalid(format!("image: {why}")))?;
                images.push(ImageInput::Inline(image));
            }
            "resource_link" => texts.push(format!(
                "[resource {}: {}]",
                block["name"].as_str().unwrap_or_default(),
                block["uri"].as_str().unwrap_or_default()
            )),
            "resource" => {
                let resource = &block["resource"];
                let uri = resource["uri"].as_str().unwrap_or_default();
                match resource["text"].as_str() {
                    Some(text) => texts.push(format!("[contents of {uri}]\n{text}")),
                    None => {
                        return Err(RpcError::invalid(format!(
                            "resource {uri}: only text resources are taken"
                        )));
                    }
                }
            }
            other => {
                return Err(RpcError::invalid(format!(
                    "content blocks of type {other:?} are not taken (text, image, resource_link, resource are)"
                )));
            }
        }
    }
    if images.len() > crate::session::MAX_INPUT_IMAGES {
        return Err(RpcError::invalid(format!(
            "at most {} images per prompt",
            crate::session::MAX_INPUT_IMAGES
        )));
    }
    let text = texts.join("\n");
    if text.trim().is_empty() && images.is_empty() {
        return Err(RpcError::invalid("the prompt is empty"));
    }
    Ok((text, images))
}

/// The answer to `session/prompt` for how its turn ended.
fn prompt_result(end: &TurnEnd) -> Result<Value, RpcError> {
    let params = &end.params;
    let meta = json!({"agentd": {
        "turn_id": params["turn_id"],
        "reason": params.get("reason").or_else(|| params.get("code")),
        "tokens_in": params.get("tokens_in"),
        "tokens_out": params.get("tokens_out"),
        "cost_usd": params.get("cost_usd"),
    }});
    let stop = if end.method == "turn/completed" {
        match TurnCompletion::of(params) {
            // The loop breaker is a limit on the model's requests within one prompt.
            Some(TurnCompletion::StuckInLoop) => "max_turn_requests",
            _ => "end_turn",
        }
    } else {
        let code = params["code"].as_str().unwrap_or_default();
        match ErrorKind::from_word(code) {
            Some(ErrorKind::Interrupted) => "cancelled",
            Some(ErrorKind::IterationLimit) => "max_turn_requests",
            _ => {
                return Err(RpcError {
                    code: RPC_SERVER_ERROR,
                    message: format!(
                        "the turn failed ({code}): {}",
                        params["message"].as_str().unwrap_or_default()
                    ),
                    kind: ErrorKind::TurnFailed,
                });
            }
        }
    };
    Ok(json!({"stopReason": stop, "_meta": meta}))
}

/// The client's `mcpServers` as agentd MCP server configs; a server that cannot be attached
/// is an error naming it.
fn mcp_servers(list: &Value) -> Result<Vec<McpServerConfig>, RpcError> {
    let Some(list) = list.as_array() else {
        return Ok(Vec::new());
    };
    let mut configs = Vec::new();
    let mut names = HashSet::new();
    for server in list {
        let given = server["name"].as_str().unwrap_or_default();
        let name = mcp_name(given);
        if !names.insert(name.clone()) {
            return Err(RpcError::invalid(format!(
                "MCP server {given:?}: another server has the name {name:?}"
            )));
        }
        let pairs = |field: &str| -> Vec<(String, String)> {
            server[field]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|item| {
                            (
                                item["name"].as_str().unwrap_or_default().to_string(),
                                item["value"].as_str().unwrap_or_default().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let config = match server["type"].as_str() {
            None | Some("stdio") => {
                let env: serde_json::Map<String, Value> = pairs("env")
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                json!({"name": name, "command": server["command"], "args": server["args"],
                    "env": env, "defer": false})
            }
            Some("http") if pairs("headers").is_empty() => {
                json!({"name": name, "url": server["url"], "defer": false})
            }
            Some("http") => {
                return Err(RpcError::invalid(format!(
                    "MCP server {given:?}: headers are not supported for HTTP servers (agentd \
                     sends only a bearer token named in its own config)"
                )));
            }
            Some(other) => {
                return Err(RpcError::invalid(format!(
                    "MCP server {given:?}: transport {other:?} is not supported (stdio and http are)"
                )));
            }
        };
        let config: McpServerConfig = serde_json::from_value(config)
            .map_err(|err| RpcError::invalid(format!("MCP server {given:?}: {err}")))?;
        configs.push(config);
    }
    Ok(configs)
}

/// A client's server name in agentd's form (`[a-z0-9_-]+`, the middle of its tools' names).
fn mcp_name(given: &str) -> String {
    let name: String = given
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '_',
        })
        .collect();
    if name.is_empty() { "mcp".into() } else { name }
}

/// A bridged session cannot run the client's MCP servers: the server would start them, on its
/// side, from a WebSocket client's word.
fn refuse_client_mcp(names: &[String]) -> Result<(), RpcError> {
    if names.is_empty() {
        return Ok(());
    }
    Err(RpcError::invalid(format!(
        "agentd acp --url does not carry the client's MCP servers ({}); list them in the \
         server's [[mcp_servers]], or run agentd acp without --url",
        names.join(", ")
    )))
}

/// Waits until each of `names` is up or failed; a failed one is the error.
async fn wait_for_mcp(handle: &SessionHandle, names: &[String]) -> Result<(), RpcError> {
    if names.is_empty() {
        return Ok(());
    }
    // The actor starts them in the background and records each state; the longest allowed
    // start-up is the default `startup_timeout_secs`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(21);
    loop {
        let states = handle.mcp().states();
        let mut pending = false;
        for name in names {
            match states.get(name).map(String::as_str) {
                Some("ready") => {}
                Some(state) if state.starts_with("failed") => {
                    return Err(RpcError {
                        code: RPC_SERVER_ERROR,
                        message: format!("MCP server {name}: {state}"),
                        kind: ErrorKind::McpFailed,
                    });
                }
                _ => pending = true,
            }
        }
        if !pending {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RpcError {
                code: RPC_SERVER_ERROR,
                message: "the client's MCP servers did not start in time".into(),
                kind: ErrorKind::McpFailed,
            });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The texts of the user's prompts in a stored conversation, in order: what `session/load`
/// shows as `user_message_chunk`s, one per turn. agentd's own notes to the model and hook
/// context are left out.
fn user_prompts(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|message| message["role"] == "user")
        .filter_map(|message| message["content"].as_str())
        .filter(|text| !text.starts_with("[agentd]"))
        .map(|text| match text.find("\n\n[context from a hook]\n") {
            Some(at) => text[..at].to_string(),
            None => text.to_string(),
        })
        .collect()
}

/// A call waiting for approval, as the client is asked about it.
#[derive(Debug)]
struct Ask {
    approval_id: String,
    tool_name: String,
    tool_call: Value,
}

/// What one agentd notification means for the client.
#[derive(Debug)]
enum Step {
    Update(Value),
    Ask(Ask),
    Ended(TurnEnd),
}

/// Turns one session's notifications into ACP's terms.
struct Translator {
    /// Each tool's ACP kind, from its tags.
    kinds: HashMap<String, &'static str>,
    /// The session's directory, to make tool call locations absolute.
    dir: PathBuf,
    /// Replaying: the user's prompts still to show, one per `turn/started`; approvals are
    /// history, not questions.
    replay: bool,
    prompts: std::collections::VecDeque<String>,
}

impl Translator {
    fn new(session: &AcpSession, replay: bool) -> Self {
        Self {
            kinds: HashMap::new(),
            dir: session.dir.clone(),
            replay,
            prompts: std::collections::VecDeque::new(),
        }
    }

    /// Whether a notification names a tool whose kind is not known yet.
    fn needs_catalog(&self, method: &str, params: &Value) -> bool {
        matches!(method, "tool/started" | "approval/requested")
            && params["tool_name"]
                .as_str()
                .is_some_and(|name| !self.kinds.contains_key(name))
    }

    /// Learns the kinds of the session's tools as they are now.
    async fn learn(&mut self, link: &Link) {
        for (name, tags, effects) in link.tools().await {
            let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
            let kind = tool_kind(&name, &tags, effects);
            self.kinds.insert(name, kind);
        }
    }

    fn kind(&self, name: &str) -> &'static str {
        self.kinds.get(name).copied().unwrap_or("other")
    }

    /// The tool call as ACP's `tool_call` fields.
    fn tool_call(&self, params: &Value, status: &str) -> Value {
        let name = params["tool_name"].as_str().unwrap_or_default();
        let arguments = &params["arguments"];
        let mut call = json!({
            "toolCallId": params["tool_call_id"],
            "title": title(name, arguments),
            "kind": self.kind(name),
            "status": status,
            "rawInput": arguments,
        });
        if let Some(path) = arguments["path"].as_str().filter(|p| !p.is_empty()) {
            let path = self.dir.join(path);
            call["locations"] = json!([{"path": path.to_string_lossy()}]);
        }
        call
    }

    fn step(&mut self, method: &str, params: &Value) -> Vec<Step> {
        let text = |kind: &str| {
            json!({"sessionUpdate": kind,
                "content": {"type": "text", "text": params["text"].as_str().unwrap_or_default()}})
        };
        let update = match method {
            "message/delta" => text("agent_message_chunk"),
            "reasoning/delta" => text("agent_thought_chunk"),
            "turn/started" if self.replay => match self.prompts.pop_front() {
                Some(prompt) => json!({"sessionUpdate": "user_message_chunk",
                    "content": {"type": "text", "text": prompt}}),
                None => return Vec::new(),
            },
            "tool/started" => {
                let mut call = self.tool_call(params, "in_progress");
                call["sessionUpdate"] = json!("tool_call");
                call
            }
            "tool/completed" => {
                let success = params["success"].as_bool().unwrap_or(false);
                let preview = params["output_preview"].as_str().unwrap_or_default();
                let mut update = json!({
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": params["tool_call_id"],
                    "status": if success { "completed" } else { "failed" },
                    "rawOutput": {"success": success, "output": preview},
                });
                if !preview.is_empty() {
                    update["content"] = json!([{"type": "content",
                        "content": {"type": "text", "text": preview}}]);
                }
                if let Some(meta) = params.get("structured_metadata") {
                    update["rawOutput"]["structured_metadata"] = meta.clone();
                }
                update
            }
            "plan/updated" => {
                let entries: Vec<Value> = params["plan"]
                    .as_array()
                    .map(|steps| {
                        steps
                            .iter()
                            .map(|step| {
                                json!({"content": step["step"].as_str().unwrap_or_default(),
                                "priority": "medium",
                                "status": match step["status"].as_str() {
                                    Some("in_progress") => "in_progress",
                                    Some("completed") => "completed",
                                    _ => "pending",
                                }})
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                json!({"sessionUpdate": "plan", "entries": entries})
            }
            "approval/requested" if !self.replay => {
                let mut call = self.tool_call(params, "pending");
                if let Some(reason) = params["reason"].as_str() {
                    call["content"] = json!([{"type": "content",
                        "content": {"type": "text", "text": format!("Needs approval: {reason}")}}]);
                }
                return vec![Step::Ask(Ask {
                    approval_id: params["approval_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    tool_name: params["tool_name"].as_str().unwrap_or_default().to_string(),
                    tool_call: call,
                })];
            }
            "turn/completed" | "turn/error" if !self.replay => {
                return vec![Step::Ended(TurnEnd {
                    method: method.to_string(),
                    params: params.clone(),
                })];
            }
            _ => return Vec::new(),
        };
        vec![Step::Update(update)]
    }
}

/// ACP's kind of a tool: from its effects (a tool that runs commands executes, one that writes
/// files edits), then for the others from the names and capability tags that say more.
fn tool_kind(name: &str, tags: &[&str], effects: Effects) -> &'static str {
    if effects.runs_commands {
        return "execute";
    }
    if effects.writes_files {
        return "edit";
    }
    match name {
        "grep" | "glob" | "web_search" | "tool_search" => return "search",
        "update_plan" => return "think",
        _ => {}
    }
    let tagged = |tag: &str| tags.contains(&tag);
    if tagged("search") {
        "search"
    } else if tagged("web") || effects.reaches_network {
        "fetch"
    } else if tagged("plan") {
        "think"
    } else if tagged("fs") {
        "read"
    } else {
        "other"
    }
}

/// A short title for a call: the tool and what it works on.
fn title(name: &str, arguments: &Value) -> String {
    let subject = ["path", "command", "cmd", "pattern", "url", "query"]
        .iter()
        .find_map(|key| match &arguments[*key] {
            Value::String(text) => Some(text.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        });
    match subject {
        Some(subject) if !subject.is_empty() => {
            let mut title = format!("{name} {subject}");
            if title.chars().count() > 100 {
                title = title.chars().take(99).collect::<String>() + "…";
            }
            title
        }
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_users_the_acp_caller_must_be_one_of_them() {
        let alice = crate::config::UserConfig {
            name: "alice".into(),
            token: crate::config::Secret::new("alice-token"),
        };
        let users = [alice];
        assert_eq!(acp_caller(&[], None), Ok(Caller::anonymous()));
        assert_eq!(
            acp_caller(&[], Some("alice".into())),
            Err(AcpUserError::NoUsers)
        );
        assert_eq!(acp_caller(&users, None), Err(AcpUserError::Missing));
        assert_eq!(
            acp_caller(&users, Some("mallory".into())),
            Err(AcpUserError::Unknown("mallory".into()))
        );
        assert_eq!(
            acp_caller(&users, Some("alice".into())),
            Ok(Caller {
                user: Some("alice".into())
            })
        );
    }

    fn translator() -> Translator {
        Translator {
            kinds: HashMap::from([
                ("read_file".to_string(), "read"),
                ("shell".to_string(), "execute"),
            ]),
            dir: PathBuf::from("/ws/proj"),
            replay: false,
            prompts: Default::default(),
        }
    }

    fn update(steps: Vec<Step>) -> Value {
        match steps.into_iter().next() {
            Some(Step::Update(update)) => update,
            other => panic!("not an update: {other:?}"),
        }
    }

    #[test]
    fn notifications_become_session_updates() {
        let mut t = translator();
        assert_eq!(
            update(t.step("message/delta", &json!({"text": "hi"}))),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}})
        );
        assert_eq!(
            update(t.step("reasoning/delta", &json!({"text": "hm"})))["sessionUpdate"],
            "agent_thought_chunk"
        );
        let started = json!({"tool_call_id": "c1", "tool_name": "read_file",
            "arguments": {"path": "a.txt"}});
        assert_eq!(
            update(t.step("tool/started", &started)),
            json!({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "read_file a.txt",
                "kind": "read", "status": "in_progress", "rawInput": {"path": "a.txt"},
                "locations": [{"path": "/ws/proj/a.txt"}]})
        );
        let completed = json!({"tool_call_id": "c1", "tool_name": "read_file", "success": false,
            "output_preview": "no such file"});
        let done = update(t.step("tool/completed", &completed));
        assert_eq!(done["status"], "failed");
        assert_eq!(done["content"][0]["content"]["text"], "no such file");
        let plan = json!({"plan": [{"step": "a", "status": "completed"}, {"step": "b", "status": "pending"}]});
        assert_eq!(
            update(t.step("plan/updated", &plan)),
            json!({"sessionUpdate": "plan", "entries": [
                {"content": "a", "priority": "medium", "status": "completed"},
                {"content": "b", "priority": "medium", "status": "pending"}]})
        );
        assert!(
            t.step("message/completed", &json!({"text": "x"}))
                .is_empty()
        );
        assert!(matches!(
            t.step("turn/completed", &json!({"turn_id": "t"}))[..],
            [Step::Ended(_)]
        ));
        let asked = t.step(
            "approval/requested",
            &json!({"approval_id": "a1", "tool_call_id": "c2", "tool_name": "shell",
                "arguments": {"command": "ls"}, "reason": "ask = [\"shell\"]"}),
        );
        let [Step::Ask(ask)] = &asked[..] else {
            panic!("{asked:?}")
        };
        assert_eq!(ask.tool_call["kind"], "execute");
        assert_eq!(ask.tool_call["status"], "pending");
        assert_eq!(ask.tool_call["title"], "shell ls");
    }

    #[test]
    fn a_replay_shows_prompts_and_asks_nothing() {
        let mut t = translator();
        t.replay = true;
        t.prompts = vec!["first".to_string()].into();
        assert_eq!(
            update(t.step("turn/started", &json!({"turn_id": "t1"}))),
            json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "first"}})
        );
        assert!(t.step("turn/started", &json!({"turn_id": "t2"})).is_empty());
        assert!(
            t.step("approval/requested", &json!({"approval_id": "a"}))
                .is_empty()
        );
        assert!(
            t.step("turn/completed", &json!({"turn_id": "t1"}))
                .is_empty()
        );
    }

    #[test]
    fn kinds_come_from_effects_then_tags_and_names() {
        let none = Effects::NONE;
        assert_eq!(tool_kind("read_file", &["fs"], none), "read");
        assert_eq!(
            tool_kind("write_file", &["fs"], Effects::WRITES_FILES),
            "edit"
        );
        assert_eq!(
            tool_kind("shell", &["runtime"], Effects::RUNS_COMMANDS),
            "execute"
        );
        // A plugin runs a program whatever its tags say.
        assert_eq!(
            tool_kind("lint", &["search"], Effects::RUNS_COMMANDS),
            "execute"
        );
        let network = Effects::REACHES_NETWORK;
        assert_eq!(tool_kind("web_fetch", &["web"], network), "fetch");
        assert_eq!(tool_kind("web_search", &["web"], network), "search");
        assert_eq!(tool_kind("update_plan", &["plan"], none), "think");
        // MCP tools: unannotated ones write, read-only open-world ones fetch.
        assert_eq!(
            tool_kind("mcp__x__y", &["mcp"], Effects::WRITES_FILES),
            "edit"
        );
        assert_eq!(tool_kind("mcp__x__z", &["mcp"], network), "fetch");
        assert_eq!(tool_kind("mcp__x__w", &["mcp"], none), "other");
    }

    #[test]
    fn turn_endings_become_stop_reasons_or_errors() {
        let end = |method: &str, params: Value| {
            prompt_result(&TurnEnd {
                method: method.into(),
                params,
            })
        };
        let stop = |r: Result<Value, RpcError>| r.unwrap()["stopReason"].clone();
        assert_eq!(
            stop(end("turn/completed", json!({"reason": "completed"}))),
            "end_turn"
        );
        assert_eq!(
            stop(end("turn/error", json!({"code": "interrupted"}))),
            "cancelled"
        );
        assert_eq!(
            stop(end("turn/error", json!({"code": "iteration_limit"}))),
            "max_turn_requests"
        );
        let err = end(
            "turn/error",
            json!({"code": "llm_unavailable", "message": "down"}),
        )
        .unwrap_err();
        assert!(err.message.contains("llm_unavailable") && err.message.contains("down"));
    }

    #[test]
    fn prompts_mcp_servers_and_stored_prompts_are_read() {
        let (text, images) = prompt_input(&json!([{"type": "text", "text": "a"},
            {"type": "resource_link", "name": "n", "uri": "file:///x"}]))
        .unwrap();
        assert_eq!(
            (text.as_str(), images.len()),
            ("a\n[resource n: file:///x]", 0)
        );
        assert!(
            prompt_input(&json!([{"type": "audio", "data": "", "mimeType": "audio/wav"}])).is_err()
        );
        assert!(prompt_input(&json!([])).is_err());
        let servers = mcp_servers(
            &json!([{"name": "My Files", "command": "npx", "args": ["x"],
            "env": [{"name": "A", "value": "1"}]}]),
        )
        .unwrap();
        assert_eq!(servers[0].name, "my_files");
        assert_eq!(servers[0].env.get("A").map(String::as_str), Some("1"));
        assert!(
            mcp_servers(&json!([{"type": "sse", "name": "s", "url": "http://x", "headers": []}]))
                .is_err()
        );
        let messages = vec![
            json!({"role": "user", "content": "hello\n\n[context from a hook]\nx"}),
            json!({"role": "assistant", "content": "hi"}),
            json!({"role": "user", "content": "[agentd] The 1 image(s)"}),
            json!({"role": "user", "content": "again"}),
        ];
        assert_eq!(user_prompts(&messages), vec!["hello", "again"]);
    }
}
