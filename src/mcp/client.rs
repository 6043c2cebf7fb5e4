//! The connection to one MCP server and its tools as registry tools. A stdio server runs as a
//! child process in the sandbox, with only its configured environment; its tools are listed once
//! it is up, and each becomes an [`McpTool`] that calls it over the same connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ClientHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientNotification,
    ClientRequest, Notification, NumberOrString, ProgressNotificationParam, ProgressToken, Request,
    RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{McpServerConfig, result, tool_name};
use crate::builtin::process::sandboxed_command_with_network;
use crate::mutex::lock;
use crate::tools::{
    ConcurrencyClass, Effects, Tool, ToolContext, ToolError, ToolEvent, ToolMeta, ToolResult,
    Workspace,
};

/// Where a server is in its life, as `session/open` and `GET /api/sessions/{id}/mcp` say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpState {
    /// Being started.
    Starting,
    /// Up, its tools listed.
    Ready,
    /// Not usable, and why.
    Failed(String),
}

impl std::fmt::Display for McpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => f.write_str("starting"),
            Self::Ready => f.write_str("ready"),
            Self::Failed(reason) => write!(f, "failed: {reason}"),
        }
    }
}

/// Why a server could not be connected to, or its tools not listed; its words become the
/// `failed` state's reason.
#[derive(Debug, thiserror::Error)]
pub enum McpStartError {
    /// The entry's `startup_timeout_secs` passed.
    #[error("it did not start within {0} s")]
    Timeout(u64),
    /// `tools/list` was refused or broke.
    #[error("tools/list failed: {0}")]
    ListTools(#[source] Box<ServiceError>),
    /// The sandboxed command could not be built.
    #[error("cannot prepare `{program}`: {source}")]
    Prepare {
        /// The entry's command.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The entry's command.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The variable `bearer_token_env` names is not set.
    #[error("the environment variable {0} (bearer_token_env) is not set")]
    MissingToken(String),
    /// The MCP handshake failed (over HTTP: at `url`).
    #[error("the MCP handshake{} failed: {source}", url.as_deref().map(|url| format!(" with {url}")).unwrap_or_default())]
    Handshake {
        /// The endpoint, for an HTTP server.
        url: Option<String>,
        /// Why.
        #[source]
        source: Box<rmcp::service::ClientInitializeError>,
    },
}

/// The first wait before a crashed server is started again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The current connection to a server, `None` while it is down, numbered so a call can wait
/// for a newer one than the connection that failed it; tools wait on it.
type PeerSlot = watch::Sender<(u64, Option<Peer<RoleClient>>)>;

/// A connection to a server, with the handler that hears its notifications.
type Connection = RunningService<RoleClient, Notices>;

/// Where one call's progress notes go: its tool's event channel and its call id.
type ProgressTarget = (mpsc::Sender<ToolEvent>, String);

/// What the client side hears from a server: progress of calls in flight, which goes on to
/// the call's session as `tool/progress`, and that its tool list changed.
#[derive(Clone, Default)]
struct Notices {
    /// Calls in flight by progress token: where their tool's events go, and their call id.
    progress: Arc<Mutex<HashMap<String, ProgressTarget>>>,
    /// Woken by `notifications/tools/list_changed`; the supervisor lists the tools again.
    list_changed: Arc<tokio::sync::Notify>,
}

/// A progress token as the key of its route; rmcp numbers the tokens of requests it sends.
fn token_key(token: &ProgressToken) -> String {
    match &token.0 {
        NumberOrString::String(token) => token.to_string(),
        NumberOrString::Number(number) => number.to_string(),
    }
}

impl ClientHandler for Notices {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = token_key(&params.progress_token);
        let Some((events, tool_call_id)) = lock(&self.progress).get(&token).cloned() else {
            return;
        };
        let fraction = params
            .total
            .filter(|total| *total > 0.0)
            .map(|total| (params.progress / total).clamp(0.0, 1.0) as f32);
        let message = params.message.unwrap_or_else(|| match params.total {
            Some(total) => format!("{} of {total}", params.progress),
            None => format!("{}", params.progress),
        });
        // A full queue drops the note: the call's result is what matters.
        let _ = events.try_send(ToolEvent::Progress {
            tool_call_id,
            message,
            fraction,
        });
    }
}

/// One configured MCP server: its state and, once up, its connection and tools. A server that
/// exits is started again with backoff for as long as this lives; dropping it ends the server.
pub struct McpServer {
    config: McpServerConfig,
    state: Mutex<McpState>,
    peer: PeerSlot,
    tools: Mutex<Vec<Arc<dyn Tool>>>,
    /// Counts the tool lists the server gave; sessions follow it to keep their registries in
    /// step with the server.
    listings: watch::Sender<u64>,
    /// Where its process runs; its sandbox ends the process's cgroup when dropped, so the
    /// server keeps it for as long as it lives.
    workspace: Arc<Workspace>,
    /// Stops the supervisor, which owns the connection (and so the child process).
    stop: CancellationToken,
    /// The handler of every connection to it, shared with its tools.
    notices: Notices,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl McpServer {
    /// Starts the server of `config` (in `workspace`'s sandbox, working in its root) and lists
    /// its tools; a server that does not come up is reported in its state, never an error.
    pub async fn start(config: McpServerConfig, workspace: &Arc<Workspace>) -> Arc<Self> {
        let server = Arc::new(Self {
            config,
            state: Mutex::new(McpState::Starting),
            peer: watch::Sender::new((0, None)),
            tools: Mutex::new(Vec::new()),
            listings: watch::Sender::new(0),
            workspace: Arc::clone(workspace),
            stop: CancellationToken::new(),
            notices: Notices::default(),
        });
        let state = match server.connect_in_time().await {
            Ok(service) => match server.list_tools(service.peer()).await {
                Ok(()) => {
                    server.connected(&service);
                    tokio::spawn(supervise(
                        Arc::downgrade(&server),
                        service,
                        server.stop.clone(),
                    ));
                    McpState::Ready
                }
                Err(reason) => McpState::Failed(reason.to_string()),
            },
            Err(reason) => McpState::Failed(reason.to_string()),
        };
        if let McpState::Failed(reason) = &state {
            tracing::warn!(server = %server.config.name, %reason, "MCP server not connected");
        }
        server.set_state(state);
        server
    }

    /// Makes `service` the connection calls use.
    fn connected(&self, service: &Connection) {
        self.peer.send_modify(|(generation, peer)| {
            *generation += 1;
            *peer = Some(service.peer().clone());
        });
    }

    fn set_state(&self, state: McpState) {
        *lock(&self.state) = state;
    }

    /// A new connection, within the entry's startup timeout.
    async fn connect_in_time(&self) -> Result<Connection, McpStartError> {
        let timeout = Duration::from_secs(self.config.startup_timeout_secs);
        let connecting = async {
            match &self.config.url {
                Some(url) => self.connect_http(url).await,
                None => self.connect_stdio().await,
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(outcome) => outcome,
            Err(_) => Err(McpStartError::Timeout(timeout.as_secs())),
        }
    }

    /// Lists the server's tools once and makes each a registry tool that calls it through
    /// whatever connection is current.
    async fn list_tools(&self, peer: &Peer<RoleClient>) -> Result<(), McpStartError> {
        let listed = peer
            .list_all_tools()
            .await
            .map_err(|err| McpStartError::ListTools(Box::new(err)))?;
        let tools = listed
            .into_iter()
            .map(|tool| {
                let spec = serde_json::to_value(&tool).unwrap_or_default();
                Arc::new(McpTool::new(
                    &self.config,
                    &spec,
                    self.peer.subscribe(),
                    self.notices.clone(),
                )) as Arc<dyn Tool>
            })
            .collect();
        *lock(&self.tools) = tools;
        self.listings.send_modify(|listing| *listing += 1);
        Ok(())
    }

    /// Starts the server's program in the sandbox and speaks MCP over its stdin and stdout.
    async fn connect_stdio(&self) -> Result<Connection, McpStartError> {
        let workspace = &self.workspace;
        let program = self.config.command.as_deref().unwrap_or_default();
        let args: Vec<&std::ffi::OsStr> = self.config.args.iter().map(|a| a.as_ref()).collect();
        let mut command = sandboxed_command_with_network(
            workspace,
            program.as_ref(),
            &args,
            workspace.root(),
            &[],
            self.config.network,
        )
        .map_err(|source| McpStartError::Prepare {
            program: program.to_string(),
            source,
        })?;
        // The command already has the built environment every command gets; the entry's own
        // `env` goes on top.
        command.envs(&self.config.env);
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|source| McpStartError::Spawn {
                program: program.to_string(),
                source,
            })?;
        // What the server says on stderr is its log, not the client's business.
        if let Some(stderr) = stderr {
            let name = self.config.name.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(server = %name, "{line}");
                }
            });
        }
        self.notices
            .clone()
            .serve(transport)
            .await
            .map_err(|source| McpStartError::Handshake {
                url: None,
                source: Box::new(source),
            })
    }

    /// Speaks MCP to a streamable-HTTP endpoint, with the bearer token read from the
    /// environment when the entry names a variable.
    async fn connect_http(&self, url: &str) -> Result<Connection, McpStartError> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
        if let Some(variable) = &self.config.bearer_token_env {
            let token = std::env::var(variable)
                .map_err(|_| McpStartError::MissingToken(variable.clone()))?;
            config = config.auth_header(token);
        }
        // A server starting beside agentd, or one busy enough to drop a connection, refuses
        // the first requests: those are tried again for a short while (nothing listening at
        // all is then reported, not waited out), while an answer that is an error (a 401, a
        // bad protocol) ends it at once.
        let give_up = tokio::time::Instant::now() + HTTP_RETRY_WINDOW;
        let mut pause = Duration::from_millis(50);
        loop {
            let transport =
                StreamableHttpClientTransport::with_client(reqwest::Client::new(), config.clone());
            match self.notices.clone().serve(transport).await {
                Ok(connection) => return Ok(connection),
                Err(err) if never_reached(&err) && tokio::time::Instant::now() < give_up => {
                    tracing::debug!(server = %self.config.name, %err, "MCP server not reached yet; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(source) => {
                    return Err(McpStartError::Handshake {
                        url: Some(url.to_string()),
                        source: Box::new(source),
                    });
                }
            }
        }
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether its tools start deferred.
    pub fn defers(&self) -> bool {
        self.config.defer
    }

    /// Where it is in its life.
    pub fn state(&self) -> McpState {
        lock(&self.state).clone()
    }

    /// Its tools, once it is ready.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        lock(&self.tools).clone()
    }

    /// Changes whenever the server's tools were listed again (it said its list changed, or it
    /// was restarted); [`Self::tools`] then holds the new list.
    pub fn listings(&self) -> watch::Receiver<u64> {
        self.listings.subscribe()
    }
}

/// Owns a server's connection while it lives; lists its tools again when it says they
/// changed; when the server exits (or the connection closes), starts it again with backoff and
/// lists its tools again, until `stop` fires or the server is dropped.
async fn supervise(server: Weak<McpServer>, mut service: Connection, stop: CancellationToken) {
    let list_changed = match server.upgrade() {
        Some(server) => Arc::clone(&server.notices.list_changed),
        None => return,
    };
    loop {
        let peer = service.peer().clone();
        let waiting = service.waiting();
        tokio::pin!(waiting);
        // Stopping drops the connection (inside `waiting`), which ends the child process.
        let ended = loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = list_changed.notified() => {
                    let Some(server) = server.upgrade() else {
                        return;
                    };
                    if let Err(reason) = server.list_tools(&peer).await {
                        tracing::warn!(server = %server.config.name, %reason, "MCP tools not listed again");
                    }
                }
                ended = &mut waiting => break ended,
            }
        };
        let mut backoff = FIRST_BACKOFF;
        let mut reason = format!("it exited ({ended:?})");
        service = loop {
            {
                let Some(server) = server.upgrade() else {
                    return;
                };
                server.peer.send_modify(|(_, peer)| *peer = None);
                tracing::warn!(server = %server.config.name, %reason, "MCP server down; restarting");
                server.set_state(McpState::Failed(format!(
                    "{reason}; restarting in {} s",
                    backoff.as_secs()
                )));
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            let Some(server) = server.upgrade() else {
                return;
            };
            match server.connect_in_time().await {
                Ok(service) => {
                    if let Err(reason) = server.list_tools(service.peer()).await {
                        tracing::warn!(server = %server.config.name, %reason, "MCP tools not listed again");
                    }
                    server.connected(&service);
                    server.set_state(McpState::Ready);
                    tracing::info!(server = %server.config.name, "MCP server restarted");
                    break service;
                }
                Err(failed) => reason = failed.to_string(),
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
    }
}

impl McpTool {
    /// One `tools/call` on `peer`: the server's progress notes for it go to the call's events
    /// (rmcp numbers the request's progress token itself, so the route is opened once it is
    /// sent), and a call dropped before its answer (interrupt, task/cancel, timeout) tells the
    /// server with `notifications/cancelled`.
    async fn send(
        &self,
        peer: &Peer<RoleClient>,
        ctx: &ToolContext,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ServiceError> {
        let request = ClientRequest::CallToolRequest(Request::new(params));
        let handle = peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await?;
        let _route = ctx.events.as_ref().map(|events| {
            let token = token_key(&handle.progress_token);
            ProgressRoute::open(
                &self.notices,
                token,
                events.clone(),
                ctx.tool_call_id.clone(),
            )
        });
        let mut abandoned = Abandoned {
            peer: peer.clone(),
            id: Some(handle.id.clone()),
        };
        let answer = handle.await_response().await;
        abandoned.id = None;
        match answer? {
            ServerResult::CallToolResult(result) => Ok(result),
            _ => Err(ServiceError::UnexpectedResponse),
        }
    }
}

/// A request whose caller stopped waiting: the server hears `notifications/cancelled`.
struct Abandoned {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let peer = self.peer.clone();
        let notice = ClientNotification::CancelledNotification(Notification::new(
            CancelledNotificationParam::new(Some(id), Some("the call was cancelled".into())),
        ));
        tokio::spawn(async move {
            let _ = peer.send_notification(notice).await;
        });
    }
}

/// A call's entry in the progress routes, removed when the call ends.
struct ProgressRoute {
    notices: Notices,
    token: String,
}

impl ProgressRoute {
    fn open(
        notices: &Notices,
        token: String,
        events: mpsc::Sender<ToolEvent>,
        tool_call_id: String,
    ) -> Self {
        lock(&notices.progress).insert(token.clone(), (events, tool_call_id));
        Self {
            notices: notices.clone(),
            token,
        }
    }
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        lock(&self.notices.progress).remove(&self.token);
    }
}

/// What an MCP tool can do, by its annotations (hints its server gives, which the spec's
/// defaults fill in): it writes unless it says `readOnlyHint: true` (and a tool that also says
/// `destructiveHint: true` contradicts itself, so it counts as writing); it reaches the network
/// unless it says `openWorldHint: false`. What runs on its server is the server's own, so it
/// never counts as running a command of the session.
fn effects_of(annotations: &Value) -> Effects {
    let read_only = annotations["readOnlyHint"] == true && annotations["destructiveHint"] != true;
    Effects {
        writes_files: !read_only,
        runs_commands: false,
        reaches_network: annotations["openWorldHint"] != false,
    }
}

/// One tool of an MCP server as a registry tool.
pub struct McpTool {
    meta: ToolMeta,
    /// The tool's own name on its server.
    remote: String,
    /// The server's current connection, numbered; `None` while it restarts.
    peer: watch::Receiver<(u64, Option<Peer<RoleClient>>)>,
    timeout: Duration,
    /// Where the server's progress notes for a call are routed.
    notices: Notices,
}

impl McpTool {
    /// The tool `spec` (an MCP `Tool` object) of `server`, calling it through `peer`.
    fn new(
        server: &McpServerConfig,
        spec: &Value,
        peer: watch::Receiver<(u64, Option<Peer<RoleClient>>)>,
        notices: Notices,
    ) -> Self {
        let remote = spec["name"].as_str().unwrap_or_default().to_string();
        let description = spec["description"]
            .as_str()
            .unwrap_or("a tool of an MCP server")
            .to_string();
        let schema = match &spec["inputSchema"] {
            Value::Object(schema) => Value::Object(schema.clone()),
            _ => serde_json::json!({"type": "object"}),
        };
        let effects = effects_of(&spec["annotations"]);
        let mut meta = ToolMeta::new(
            tool_name(&server.name, &remote),
            description,
            schema,
            effects,
        );
        meta.tags = vec!["mcp"];
        meta.concurrency = if effects.writes_files {
            ConcurrencyClass::Exclusive
        } else {
            ConcurrencyClass::Safe
        };
        Self {
            meta,
            remote,
            peer,
            timeout: Duration::from_secs(server.tool_timeout_secs),
            notices,
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn meta(&self) -> &ToolMeta {
        &self.meta
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = args.as_object().cloned();
        // A server that is restarting is waited for, within the same limit as the call. A
        // read-only call whose connection closed under it (the server died) is sent once more
        // to the restarted server; any other call may have had effects, so it reports the loss.
        let retries = usize::from(self.meta.concurrency == ConcurrencyClass::Safe);
        let call = async {
            let mut current = self.peer.clone();
            let mut newer_than = 0;
            let mut attempt = 0;
            loop {
                let connected = current
                    .wait_for(|(generation, peer)| *generation > newer_than && peer.is_some())
                    .await
                    .map(|slot| slot.clone());
                let Ok((generation, Some(peer))) = connected else {
                    return Err(CallFailure::Gone);
                };
                match self.send(&peer, ctx, params.clone()).await {
                    Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))
                        if attempt < retries =>
                    {
                        attempt += 1;
                        newer_than = generation;
                    }
                    outcome => return outcome.map_err(CallFailure::Service),
                }
            }
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(self.timeout, call) => outcome,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::model("cancelled", format!("{}: cancelled", self.meta.name)));
            }
        };
        match outcome {
            Ok(Ok(answer)) => Ok(result::from_mcp(
                &serde_json::to_value(&answer).unwrap_or_default(),
            )),
            Ok(Err(err)) => Err(ToolError::model(
                "mcp_unavailable",
                format!("{}: the MCP server did not answer: {err}", self.meta.name),
            )),
            Err(_) => Err(ToolError::model(
                "timeout",
                format!(
                    "{}: no answer within {} s",
                    self.meta.name,
                    self.timeout.as_secs()
                ),
            )),
        }
    }
}

/// Why a call got no answer from its server.
#[derive(Debug, thiserror::Error)]
enum CallFailure {
    /// The server stopped for good (its entry was removed, or agentd is stopping).
    #[error("the server is gone")]
    Gone,
    /// The request or its answer failed.
    #[error(transparent)]
    Service(ServiceError),
}

/// How long an HTTP handshake whose requests cannot be sent is tried again.
const HTTP_RETRY_WINDOW: Duration = Duration::from_secs(2);

/// Whether a handshake failed before any answer came: the request could not be sent (nothing
/// listens yet, the connection was dropped), found in the error's chain or, where the
/// transport flattened it to text, in its words.
fn never_reached(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(cause) = next {
        if let Some(request) = cause.downcast_ref::<reqwest::Error>() {
            return request.is_connect() || (request.is_request() && request.status().is_none());
        }
        next = cause.source();
    }
    err.to_string().contains("error sending request")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_say_what_a_tool_does_and_silence_counts_as_writing() {
        let effects = |annotations: Value| effects_of(&annotations);
        let unannotated = effects(Value::Null);
        assert!(unannotated.writes_files && unannotated.reaches_network);
        assert!(!unannotated.runs_commands);
        assert!(!effects(serde_json::json!({"readOnlyHint": true})).writes_files);
        assert!(effects(serde_json::json!({"readOnlyHint": false})).writes_files);
        assert!(
            effects(serde_json::json!({"readOnlyHint": true, "destructiveHint": true}))
                .writes_files,
            "a read-only tool that destroys contradicts itself"
        );
        assert!(
            effects(serde_json::json!({"destructiveHint": false})).writes_files,
            "an additive tool still writes"
        );
        let closed = effects(serde_json::json!({"readOnlyHint": true, "openWorldHint": false}));
        assert_eq!(closed, Effects::NONE);
        let groups: Vec<&str> = unannotated.groups().collect();
        assert_eq!(groups, ["writes"]);
    }

    #[tokio::test]
    async fn a_refused_connection_is_tried_again_and_an_answer_is_not() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let refused = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/mcp"))
            .send()
            .await
            .unwrap_err();
        assert!(never_reached(&refused), "{refused}");
        let wrapped = std::io::Error::other(refused);
        assert!(never_reached(&wrapped));
        let answered = std::io::Error::other("401 Unauthorized: bad token");
        assert!(!never_reached(&answered));
    }
}
