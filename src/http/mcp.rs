//! `/mcp`: the session's tools served over the Model Context Protocol (streamable HTTP).
//!
//! An MCP session is bound at `initialize` to an agentd session of the caller's: a new one, or
//! the one `?session_id=` names. `tools/list` is that session's visible tool list, and
//! `tools/call` runs through the same path as `tool/invoke`, so the session's WebSocket
//! watchers see the call and its events are stored. The session's `tools/changed` events become
//! `notifications/tools/list_changed`, a call's `tool/progress` events the caller's
//! `notifications/progress`, and `notifications/cancelled` cancels the call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, InitializeRequestParams, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::auth::{origin_allowed, origin_and_host};
use super::error::ApiError;
use crate::error_kind::McpClass;
use crate::mutex::lock;
use crate::session::frames::{FrameQueue, frame_queue};
use crate::session::{
    Caller, InvokeOptions, InvokeResult, Outbound, SessionError, SessionHandle, Watcher,
};
use crate::tools::{ConcurrencyClass, ToolState};

/// The tower service mounted at `/mcp`.
pub type McpService = StreamableHttpService<SessionBridge, LocalSessionManager>;

/// The `/mcp` service over `app`'s sessions; it stops with the server.
pub fn service(app: AppState) -> McpService {
    // The `Host` and `Origin` rules are agentd's own, applied in `authenticate` as for `/api/`.
    let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    config.cancellation_token = app.shutdown().child_token();
    StreamableHttpService::new(
        move || Ok(SessionBridge::new(app.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// The `/api/` rules in front of `/mcp`: the bearer token (401), the loopback `Host` rule and
/// the `Origin` rule (403). The caller rides in the request's extensions to the handler. A
/// JSON body that is not an MCP message is a 400: the transport calls it 415, which is for
/// bodies of the wrong media type.
pub async fn authenticate(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    accept_any_as_mcp(&mut parts.headers);
    let caller =
        match <Caller as FromRequestParts<AppState>>::from_request_parts(&mut parts, &app).await {
            Ok(caller) => caller,
            Err(rejection) => return ApiError::into_response(rejection),
        };
    let (origin, host) = origin_and_host(&parts.headers);
    if !origin_allowed(origin, host, &app.config().server.allowed_origins) {
        return ApiError::ForbiddenOrigin.into_response();
    }
    // The transport serves GET (the event stream) and DELETE by session id alone: an id is no
    // credential, so another caller's is answered as one that does not exist.
    let session_id = parts
        .headers
        .get(MCP_SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session_id
        && app.mcp_owners().owned_by_other(id, &caller)
    {
        return (StatusCode::NOT_FOUND, "no such MCP session").into_response();
    }
    let method = parts.method.clone();
    let owner = caller.clone();
    parts.extensions.insert::<Caller>(caller);
    let sent_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if sent_json && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        *response.status_mut() = StatusCode::BAD_REQUEST;
    }
    let issued = response
        .headers()
        .get(MCP_SESSION_ID)
        .and_then(|value| value.to_str().ok());
    match (issued, &session_id) {
        (Some(new), None) if response.status().is_success() => {
            app.mcp_owners().record(new, owner);
        }
        (_, Some(id)) if method == axum::http::Method::DELETE => app.mcp_owners().forget(id),
        _ => {}
    }
    response
}

/// The header naming an MCP session.
const MCP_SESSION_ID: &str = "mcp-session-id";

/// Which caller opened each `/mcp` session, so that no other caller can use its id.
#[derive(Debug, Default)]
pub struct McpOwners {
    owners: Mutex<HashMap<String, Caller>>,
}

impl McpOwners {
    fn record(&self, session_id: &str, caller: Caller) {
        self.lock().insert(session_id.to_owned(), caller);
    }

    fn forget(&self, session_id: &str) {
        self.lock().remove(session_id);
    }

    /// Whether `session_id` was opened by a caller other than `caller`.
    fn owned_by_other(&self, session_id: &str, caller: &Caller) -> bool {
        self.lock()
            .get(session_id)
            .is_some_and(|owner| owner != caller)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Caller>> {
        // A panic while holding it leaves a map that is still whole.
        crate::mutex::lock(&self.owners)
    }
}

/// What the MCP transport answers with, for a request that accepts anything.
const MCP_ACCEPT: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");

/// A request without `Accept`, or with a `*/*` range, accepts every media type (RFC 9110,
/// 12.5.1), so it accepts the transport's JSON and event streams; the transport itself wants
/// both named, and would answer such a request 406.
fn accept_any_as_mcp(headers: &mut HeaderMap) {
    let accepts_anything = match headers.get(header::ACCEPT) {
        None => true,
        Some(value) => value.to_str().is_ok_and(|value| {
            value.split(',').any(|range| {
                range
                    .split(';')
                    .next()
                    .is_some_and(|media| media.trim() == "*/*")
            })
        }),
    };
    if accepts_anything {
        headers.insert(header::ACCEPT, MCP_ACCEPT);
    }
}

/// One MCP session's handler: unbound until `initialize`, then bound to one agentd session.
pub struct SessionBridge {
    app: AppState,
    bound: OnceLock<Arc<Bound>>,
}

/// The agentd session an MCP session is bound to, and what follows its events.
struct Bound {
    caller: Caller,
    handle: SessionHandle,
    /// The watcher this MCP session attached, detached when the MCP session ends.
    connection_id: Arc<Mutex<u64>>,
    /// Calls whose caller asked for progress, by tool call id.
    progress: Arc<Mutex<HashMap<String, ProgressToken>>>,
    /// Stops the event follower when the MCP session ends.
    done: CancellationToken,
}

impl Drop for Bound {
    fn drop(&mut self) {
        self.done.cancel();
        let handle = self.handle.clone();
        let connection_id = *lock(&self.connection_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { handle.detach(connection_id).await });
        }
    }
}

impl SessionBridge {
    fn new(app: AppState) -> Self {
        Self {
            app,
            bound: OnceLock::new(),
        }
    }

    /// The bound session, checked against the request's caller: an MCP session id is no
    /// key to another user's session.
    fn bound(&self, context: &RequestContext<RoleServer>) -> Result<&Arc<Bound>, ErrorData> {
        let bound = self
            .bound
            .get()
            .ok_or_else(|| ErrorData::invalid_request("initialize first", None))?;
        if request_caller(context) != Some(&bound.caller) {
            return Err(ErrorData::invalid_request(
                "this MCP session belongs to another caller",
                Some(json!({"kind": "unknown_session"})),
            ));
        }
        Ok(bound)
    }

    /// Opens or attaches the agentd session, and starts following its events for `peer`.
    async fn bind(
        &self,
        caller: Caller,
        session_id: Option<String>,
        peer: Peer<RoleServer>,
    ) -> Result<Arc<Bound>, SessionError> {
        let sessions = self.app.sessions();
        let handle = match session_id {
            Some(session_id) => sessions.handle(&caller, &session_id).await?,
            None => sessions.create(&caller, None).await?.0,
        };
        let connection_id = Arc::new(Mutex::new(0));
        let progress = Arc::new(Mutex::new(HashMap::new()));
        let done = CancellationToken::new();
        let follower = Follower {
            app: self.app.clone(),
            handle: handle.clone(),
            connection_id: Arc::clone(&connection_id),
            progress: Arc::clone(&progress),
            peer,
            done: done.clone(),
        };
        let events = follower.attach().await?;
        tokio::spawn(follower.run(events));
        Ok(Arc::new(Bound {
            caller,
            handle,
            connection_id,
            progress,
            done,
        }))
    }
}

/// The caller `authenticate` put into the request.
fn request_caller(context: &RequestContext<RoleServer>) -> Option<&Caller> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
}

/// `?session_id=` of the request.
fn requested_session(context: &RequestContext<RoleServer>) -> Option<String> {
    let query = context
        .extensions
        .get::<axum::http::request::Parts>()?
        .uri
        .query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "session_id")
        .map(|(_, value)| value.into_owned())
}

/// Moves the session's events to the MCP peer: tool list changes, and progress of the calls
/// that asked for it.
struct Follower {
    app: AppState,
    handle: SessionHandle,
    connection_id: Arc<Mutex<u64>>,
    progress: Arc<Mutex<HashMap<String, ProgressToken>>>,
    peer: Peer<RoleServer>,
    done: CancellationToken,
}

/// A follower's queue of the session's events, and the token fired when it fell behind.
type Events = (FrameQueue, CancellationToken);

impl Follower {
    /// Attaches a fresh watcher (the first, or after falling behind).
    async fn attach(&self) -> Result<Events, SessionError> {
        let (tx, rx) = frame_queue(self.app.config().server.ws_queue_frames);
        let lagged = CancellationToken::new();
        let connection_id = self.app.next_connection_id();
        *lock(&self.connection_id) = connection_id;
        self.handle
            .attach(Watcher {
                connection_id,
                tx,
                lagged: lagged.clone(),
            })
            .await?;
        Ok((rx, lagged))
    }

    async fn run(self, (mut events, mut lagged): Events) {
        // Progress is counted per call when the tool gives no fraction: MCP wants it to grow.
        let mut steps: HashMap<String, f64> = HashMap::new();
        loop {
            let frame = tokio::select! {
                () = self.done.cancelled() => return,
                () = lagged.cancelled() => {
                    // Events were missed; the list may have changed meanwhile.
                    match self.attach().await {
                        Ok((fresh, fresh_lagged)) => (events, lagged) = (fresh, fresh_lagged),
                        Err(_) => return,
                    }
                    let _ = self.peer.notify_tool_list_changed().await;
                    continue;
                }
                frame = events.recv() => frame,
            };
            let Some(Outbound::Text(frame)) = frame else {
                return;
            };
            // Only two kinds of event matter here; the rest are not parsed.
            if frame.starts_with(r#"{"jsonrpc":"2.0","method":"tools/changed""#) {
                let _ = self.peer.notify_tool_list_changed().await;
            } else if frame.starts_with(r#"{"jsonrpc":"2.0","method":"tool/progress""#) {
                let Ok(event) = serde_json::from_str::<Value>(&frame) else {
                    continue;
                };
                let params = &event["params"];
                let Some(call) = params["tool_call_id"].as_str() else {
                    continue;
                };
                let Some(token) = lock(&self.progress).get(call).cloned() else {
                    continue;
                };
                let (progress, total) = match params["fraction"].as_f64() {
                    Some(fraction) => (fraction, Some(1.0)),
                    None => {
                        let step = steps.entry(call.to_string()).or_default();
                        *step += 1.0;
                        (*step, None)
                    }
                };
                let mut notice = ProgressNotificationParam::new(token, progress);
                notice.total = total;
                notice.message = params["message"].as_str().map(str::to_string);
                let _ = self.peer.notify_progress(notice).await;
            }
        }
    }
}

/// One visible tool as MCP lists it.
fn listed(entry: &crate::tools::CatalogEntry) -> Option<Tool> {
    let Value::Object(schema) = entry.input_schema().clone() else {
        return None;
    };
    let mut tool = Tool::new(
        entry.name().to_string(),
        entry.description().to_string(),
        Arc::new(schema),
    );
    let mut annotations = rmcp::model::ToolAnnotations::default();
    annotations.read_only_hint = Some(entry.concurrency() == ConcurrencyClass::Safe);
    tool.annotations = Some(annotations);
    Some(tool)
}

/// A `tool/invoke` answer as an MCP tool result.
fn call_result(result: InvokeResult) -> CallToolResult {
    let content = vec![ContentBlock::text(result.output)];
    let mut answer = if result.success {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    answer.structured_content = result.structured_metadata.filter(Value::is_object);
    answer
}

/// A refused call: an unknown tool is a protocol error, as MCP asks; the rest are tool
/// errors the model can read and correct.
fn refusal(err: SessionError) -> Result<CallToolResult, ErrorData> {
    let kind = err.kind();
    let data = json!({"kind": kind});
    // By kind, so a refusal told by the session's owner on another node reads the same.
    match kind.row().mcp {
        McpClass::InvalidParams => Err(ErrorData::invalid_params(err.to_string(), Some(data))),
        McpClass::Internal => Err(ErrorData::internal_error(err.to_string(), Some(data))),
        McpClass::ToolResult => {
            let mut answer = CallToolResult::error(vec![ContentBlock::text(err.to_string())]);
            answer.structured_content = Some(json!({"error": data}));
            Ok(answer)
        }
    }
}

impl rmcp::ServerHandler for SessionBridge {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("agentd", env!("CARGO_PKG_VERSION")))
    }

    /// Only versions with an `initialize` handshake: that is where an MCP session is bound to
    /// an agentd session.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let caller = request_caller(&context)
            .cloned()
            .ok_or_else(|| ErrorData::invalid_request("no caller", None))?;
        if self.bound.get().is_some() {
            return Err(ErrorData::invalid_request("already initialized", None));
        }
        let bound = self
            .bind(caller, requested_session(&context), context.peer.clone())
            .await
            .map_err(|err| {
                let data = Some(json!({"kind": err.kind()}));
                // No tool result answers an initialize: a refusal the model could correct is
                // the caller's invalid params here.
                match err.kind().row().mcp {
                    McpClass::Internal => ErrorData::internal_error(err.to_string(), data),
                    McpClass::InvalidParams | McpClass::ToolResult => {
                        ErrorData::invalid_params(err.to_string(), data)
                    }
                }
            })?;
        let session_id = bound.handle.session_id().to_string();
        if self.bound.set(bound).is_err() {
            return Err(ErrorData::invalid_request("already initialized", None));
        }
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        result.instructions = Some(format!(
            "These are the tools of agentd session {session_id}; its WebSocket watchers see \
             every call. Long tools answer with a task handle: read their output with \
             read_task_output."
        ));
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert("agentd/session_id".into(), Value::String(session_id));
        result.meta = Some(meta);
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let bound = self.bound(&context)?;
        let catalog = bound
            .handle
            .catalog()
            .await
            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
        let tools = catalog
            .entries
            .iter()
            .filter(|entry| entry.state == ToolState::Active)
            .filter_map(listed)
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let bound = Arc::clone(self.bound(&context)?);
        let tool_call_id = format!("call_{}", uuid::Uuid::new_v4().simple());
        let progress = context.meta.get_progress_token();
        if let Some(token) = progress.clone() {
            lock(&bound.progress).insert(tool_call_id.clone(), token);
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let outcome = bound
            .handle
            .invoke_tool_with(
                request.name.into_owned(),
                arguments,
                InvokeOptions {
                    tool_call_id: Some(tool_call_id.clone()),
                    cancel: Some(context.ct.clone()),
                    skip_approval: false,
                },
            )
            .await;
        if progress.is_some() {
            lock(&bound.progress).remove(&tool_call_id);
        }
        let answer = match outcome {
            Ok(result) => call_result(result),
            Err(err) => refusal(err)?,
        };
        Ok(CallToolResponse::Complete(answer))
    }
}
