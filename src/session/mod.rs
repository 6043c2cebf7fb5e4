//! Sessions: one [`actor::SessionActor`] per open session owns its state without locks; clonable
//! [`SessionHandle`]s talk to it; [`hub::Sessions`] finds, loads and unloads actors.

pub mod actor;
mod follower;
pub mod forwarding;
pub mod frames;
pub mod hub;
pub mod instructions;
pub mod open_work;
pub mod profiles;
pub mod protocol;
mod quota;
pub(crate) mod reply;
pub mod retention;
pub mod transfer;
pub mod worktree;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::error_kind::ErrorKind;
use crate::store::{StoreError, TaskState};
use crate::tools::{DispatchError, ToolCatalog, ToolState};

pub use hub::Sessions;
pub use protocol::{RevertTo, SessionReply, SessionRequest, TurnInput, TurnMeta};

/// Who is calling: a configured user, or nobody in particular when users are not configured.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The user's name, `None` without `[[server.users]]`.
    pub user: Option<String>,
}

impl Caller {
    /// The caller of a server without users.
    pub fn anonymous() -> Self {
        Self { user: None }
    }
}

/// Why a session request failed; `kind()` is the wire word in `data.kind`.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No such session for this caller (another user's session looks the same).
    #[error("unknown session {0}")]
    UnknownSession(String),
    /// A turn is already running.
    #[error("a turn is already in progress")]
    TurnInProgress,
    /// No turn runs, or the running one has another id.
    #[error("no turn {0} is running")]
    NoActiveTurn(String),
    /// No model is configured.
    #[error(
        "no model is configured: set llm.base_url and llm.model (or AGENTD_LLM_BASE_URL and AGENTD_LLM_MODEL); tools still work through tool/invoke"
    )]
    LlmNotConfigured,
    /// The capability exists in the protocol but not yet in this server.
    #[error("{0}")]
    NotYetAvailable(&'static str),
    /// No pending question has that id.
    #[error("no pending user input request {0}")]
    UnknownRequest(String),
    /// No call waits for an approval of that id.
    #[error("no pending approval {0}")]
    UnknownApproval(String),
    /// No task has that id in this session.
    #[error("unknown task {0}")]
    UnknownTask(String),
    /// Bad parameters.
    #[error("{0}")]
    InvalidParams(String),
    /// A tool call was refused before it ran.
    #[error("{0}")]
    Dispatch(#[from] DispatchError),
    /// The session already has `server.max_inflight_per_session` tool calls running or queued.
    #[error(
        "this session already has {0} tool calls running or queued; retry when one has finished"
    )]
    Overloaded(usize),
    /// `session/revert` found files changed since the session's last turn ended; the message
    /// names them.
    #[error("{0}")]
    RevertConflict(String),
    /// `session/merge` could not merge the session's branch (conflicts, or changes in the
    /// checkout in the way); nothing was changed, and the message says why.
    #[error("{0}")]
    MergeConflict(String),
    /// `session/merge` or `session/discard` for a session that works in no worktree.
    #[error("session {0} has no worktree (it was not opened with isolation \"worktree\")")]
    NoWorktree(String),
    /// The store cannot write (a full disk, a lost database): nothing that would need a
    /// write is acknowledged.
    #[error("the store cannot write ({0}); retry once it can")]
    StorageUnavailable(String),
    /// A per-user limit refuses the request; the message names the limit.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The actor stopped while handling the request (shutdown or unload).
    #[error("the session stopped; open it again")]
    ActorGone,
    /// The store failed; details are logged.
    #[error("storage error")]
    Store(#[from] StoreError),
    /// `session/compact` did not compact.
    #[error("{0}")]
    Compaction(#[from] crate::agent::compaction::CompactionError),
    /// The node owning the session refused the request (cluster mode); its kind and words.
    #[error("{message}")]
    Remote {
        /// The owner's `data.kind`.
        kind: ErrorKind,
        /// The owner's message.
        message: String,
    },
}

impl SessionError {
    /// The kind clients see as `data.kind` (and REST as `error.kind`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::UnknownSession(_) => ErrorKind::UnknownSession,
            Self::TurnInProgress => ErrorKind::TurnInProgress,
            Self::NoActiveTurn(_) => ErrorKind::NoActiveTurn,
            Self::LlmNotConfigured => ErrorKind::LlmNotConfigured,
            Self::NotYetAvailable(_) => ErrorKind::Unsupported,
            Self::UnknownRequest(_) => ErrorKind::UnknownRequest,
            Self::UnknownApproval(_) => ErrorKind::UnknownApproval,
            Self::UnknownTask(_) => ErrorKind::UnknownTask,
            Self::InvalidParams(_) => ErrorKind::InvalidParams,
            Self::Dispatch(err) => err.kind(),
            Self::Overloaded(_) => ErrorKind::Overloaded,
            Self::QuotaExceeded(_) => ErrorKind::QuotaExceeded,
            Self::StorageUnavailable(_) => ErrorKind::StorageUnavailable,
            Self::RevertConflict(_) => ErrorKind::RevertConflict,
            Self::MergeConflict(_) => ErrorKind::MergeConflict,
            Self::NoWorktree(_) => ErrorKind::NoWorktree,
            Self::ActorGone => ErrorKind::SessionUnavailable,
            Self::Store(_) => ErrorKind::Internal,
            Self::Compaction(err) => err.kind(),
            Self::Remote { kind, .. } => *kind,
        }
    }

    /// The error another node answered with `kind` and `message`; a word this node does not
    /// know reads `internal`.
    pub fn remote(kind: &str, message: String) -> Self {
        let kind = ErrorKind::from_word(kind).unwrap_or(ErrorKind::Internal);
        Self::Remote { kind, message }
    }
}

/// One frame for a connection's socket; notifications are serialised once and shared by every
/// watcher. Two words: each queued frame allocates a node of this size.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A JSON text frame.
    Text(Arc<str>),
    /// Close the socket with this code and reason.
    Close(&'static Closing),
}

/// A close frame's status code and reason.
#[derive(Debug, PartialEq, Eq)]
pub struct Closing {
    /// The WebSocket status code.
    pub code: u16,
    /// Why, for the client.
    pub reason: &'static str,
}

/// A connection watching a session's event stream.
#[derive(Debug, Clone)]
pub struct Watcher {
    /// Identifies the connection within the server.
    pub connection_id: u64,
    /// The connection's bounded outbound queue; the connection's writer task holds the
    /// receiver and ends when it closes.
    pub tx: frames::FrameSender,
    /// Fired by an actor when the queue is full: the connection must close with 1013 and the
    /// client resume with `after_seq`.
    pub lagged: CancellationToken,
}

/// What `session/open` tells the client.
#[derive(Debug, Clone, Serialize)]
pub struct OpenedSession {
    /// The session.
    pub session_id: String,
    /// Whether it existed before this open.
    pub resumed: bool,
    /// The last event seq at the moment the connection was attached.
    pub last_seq: i64,
    /// The coding-tool contract and each contract tool's status.
    pub capabilities: Value,
    /// Visible and deferred tool names.
    pub tools: ToolNames,
}

/// What `session/open` reports of a session besides its events: the same on every node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    /// The coding-tool contract and each contract tool's status.
    pub capabilities: Value,
    /// Visible and deferred tool names.
    pub tools: ToolNames,
    /// Each configured MCP server's state, by name.
    pub mcp: Value,
    /// Where the agent's instructions come from: the operator's and each `AGENTS.md`, with
    /// its size and whether it was cut.
    #[serde(default)]
    pub instructions: Vec<instructions::InstructionSource>,
    /// The turn running now, if one is (and not being stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_turn: Option<String>,
}

/// Visible and deferred tool names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolNames {
    /// Visible to the model.
    pub active: Vec<String>,
    /// Loaded on demand.
    pub deferred: Vec<String>,
}

impl ToolNames {
    /// The names in a catalog.
    pub fn of(catalog: &ToolCatalog) -> Self {
        let names = |state| {
            catalog
                .names_in(state)
                .into_iter()
                .map(str::to_string)
                .collect()
        };
        Self {
            active: names(ToolState::Active),
            deferred: names(ToolState::Deferred),
        }
    }
}

/// The answer to `tool/invoke`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvokeResult {
    /// The id given to this call.
    pub tool_call_id: String,
    /// Whether the tool did what was asked.
    pub success: bool,
    /// The text the model would see.
    pub output: String,
    /// Host-side metadata, when the tool gave some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_metadata: Option<Value>,
}

/// What a caller other than the WebSocket may choose about its `tool/invoke`.
#[derive(Debug, Default)]
pub struct InvokeOptions {
    /// The call's id, chosen by the caller so it can follow the call's events while it runs
    /// (an MCP client's progress); a fresh one when `None`.
    pub tool_call_id: Option<String>,
    /// Cancelling it cancels the call, which then ends with a cancelled result.
    pub cancel: Option<CancellationToken>,
    /// Runs it without asking for approval (the console's `tool/invoke` with `skip_approval`).
    pub skip_approval: bool,
}

/// Builds the JSON-RPC notification frame for one event.
pub fn notification_frame(method: &str, params: &Value) -> Arc<str> {
    notification_text(method, &params.to_string())
}

/// The notification frame around params already serialised, as the event log stores them: the
/// params are written once, not copied into a new object and serialised again.
pub fn notification_text(method: &str, params_json: &str) -> Arc<str> {
    // Keys in the order serde_json writes an object's: sorted.
    let method = Value::from(method).to_string();
    let mut frame = String::with_capacity(36 + method.len() + params_json.len());
    frame.push_str(r#"{"jsonrpc":"2.0","method":"#);
    frame.push_str(&method);
    frame.push_str(r#","params":"#);
    frame.push_str(params_json);
    frame.push('}');
    frame.into()
}

/// Adds `session_id` and `seq` to notification params.
pub(crate) fn stamp(session_id: &str, seq: i64, params: Value) -> Value {
    let mut map = match params {
        Value::Object(map) => map,
        Value::Null => Map::new(),
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other);
            map
        }
    };
    map.insert("session_id".into(), Value::String(session_id.to_string()));
    map.insert("seq".into(), Value::from(seq));
    Value::Object(map)
}

pub(crate) use reply::ReplyTx;

/// A message to a session actor: a request of the session protocol, or one of the few
/// internal ones that never leave this node.
#[derive(Debug)]
pub(crate) enum Command {
    /// A request of the session protocol, with where to send the reply. Boxed together: every
    /// queued command takes a node as large as the largest command.
    Request(Box<(SessionRequest, ReplyTx)>),
    /// A connection starts watching. Boxed, as `Request` is.
    Attach(Box<Attach>),
    /// Stop taking turns; answered once none runs (cluster draining).
    Drain {
        reply: oneshot::Sender<()>,
    },
    Detach {
        connection_id: u64,
    },
    Catalog {
        reply: oneshot::Sender<Arc<ToolCatalog>>,
    },
    /// Stop; `stopped` is dropped once the actor has, with everything it ran.
    Close {
        stopped: oneshot::Sender<()>,
    },
}

/// Where an actor's commands are sent.
///
/// Unbounded, and so without a kilobyte of slots allocated up front for each loaded session
/// (tokio's bounded queue allocates room for 32 commands before the first): every sender but
/// `Detach` waits for its reply before it sends again, and tool calls are limited per session
/// ([`InflightCalls`]), so the queue holds about one command per caller at most.
pub(crate) type CommandTx = futures_channel::mpsc::UnboundedSender<Command>;

/// An actor's end of its [`CommandTx`]: commands in the order they were sent.
pub(crate) type CommandRx = futures_channel::mpsc::UnboundedReceiver<Command>;

/// A new actor's command queue.
pub(crate) fn command_queue() -> (CommandTx, CommandRx) {
    futures_channel::mpsc::unbounded()
}

/// A connection that starts watching a session, and where it is told the session's state.
#[derive(Debug)]
pub(crate) struct Attach {
    pub(crate) watcher: Watcher,
    /// Where the watcher's replay starts, when it replays.
    pub(crate) after_seq: Option<i64>,
    pub(crate) reply: oneshot::Sender<(i64, SessionView)>,
}

/// How many `tool/invoke` calls one session has running or queued, shared by every handle of
/// its actor.
#[derive(Debug)]
pub(crate) struct InflightCalls {
    count: AtomicUsize,
    limit: usize,
}

impl InflightCalls {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            count: AtomicUsize::new(0),
            limit,
        })
    }

    /// One more call, or `Overloaded` when the limit is reached.
    fn reserve(self: &Arc<Self>) -> Result<InflightCall, SessionError> {
        let limit = self.limit;
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|_| InflightCall(Arc::clone(self)))
            .map_err(|_| SessionError::Overloaded(limit))
    }
}

/// One counted call; it stops counting when dropped (answered, or abandoned by its caller).
struct InflightCall(Arc<InflightCalls>);

impl Drop for InflightCall {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The states of a session's own MCP servers (`scope = "session"`), written by its actor and
/// read by whoever holds its handle, without a round trip.
#[derive(Debug, Default)]
pub struct SessionMcp(std::sync::Mutex<std::collections::BTreeMap<String, String>>);

impl SessionMcp {
    /// Records that server `name` is now in `state`.
    pub fn set(&self, name: &str, state: &crate::mcp::McpState) {
        crate::mutex::lock(&self.0).insert(name.to_string(), state.to_string());
    }

    /// Every server's state, by name.
    pub fn states(&self) -> std::collections::BTreeMap<String, String> {
        crate::mutex::lock(&self.0).clone()
    }
}

/// A clonable address of one session actor.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    session_id: Arc<str>,
    tx: CommandTx,
    inflight: Arc<InflightCalls>,
    mcp: Arc<SessionMcp>,
}

impl SessionHandle {
    pub(crate) fn new(
        session_id: Arc<str>,
        tx: CommandTx,
        inflight: Arc<InflightCalls>,
        mcp: Arc<SessionMcp>,
    ) -> Self {
        Self {
            session_id,
            tx,
            inflight,
            mcp,
        }
    }

    /// The states of the session's own MCP servers.
    pub fn mcp(&self) -> &SessionMcp {
        &self.mcp
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Whether the actor has stopped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .unbounded_send(command(reply))
            .map_err(|_| SessionError::ActorGone)?;
        answer.await.map_err(|_| SessionError::ActorGone)
    }

    /// Starts streaming live events to `watcher`; returns the last seq before it joined (every
    /// later event reaches the watcher) and what `session/open` reports of the session.
    pub async fn attach(&self, watcher: Watcher) -> Result<(i64, SessionView), SessionError> {
        self.attach_replaying(watcher, None).await
    }

    /// Sends `request` to the actor and waits for its answer. A `tool/invoke` counts against
    /// the session's in-flight limit from the moment this is called (not when the future is
    /// first polled), so calls are admitted in the order they were made; past the limit the
    /// future answers `Overloaded` without reaching the actor.
    pub fn request(
        &self,
        request: SessionRequest,
    ) -> impl Future<Output = Result<SessionReply, SessionError>> + Send + 'static {
        let reserved = self.counted(&request);
        let handle = self.clone();
        async move {
            let _counted = reserved?;
            handle
                .ask(|reply| Command::Request(Box::new((request, ReplyTx::Waiting(reply)))))
                .await?
        }
    }

    /// [`Self::request`] with no one waiting: the actor runs `deliver` with the answer itself
    /// (or with `ActorGone` when it stops first, `Overloaded` past the in-flight limit), so
    /// the answer lands wherever `deliver` puts it right after the events before it.
    pub(crate) fn request_delivered(
        &self,
        request: SessionRequest,
        deliver: impl FnOnce(reply::Outcome) + Send + Sync + 'static,
    ) {
        let counted = match self.counted(&request) {
            Ok(counted) => counted,
            Err(refused) => return deliver(Err(refused)),
        };
        let delivery = reply::Delivery::new(move |outcome| {
            // Counted until answered, as a waiting caller's call is.
            let _counted = counted;
            deliver(outcome);
        });
        // Refused, the command and its delivery are dropped: ActorGone is delivered.
        let _ = self.tx.unbounded_send(Command::Request(Box::new((
            request,
            ReplyTx::Delivered(delivery),
        ))));
    }

    /// The in-flight slot `request` takes until it is answered: a `tool/invoke` counts
    /// against the session's limit, or is `Overloaded` past it; other requests take none.
    fn counted(&self, request: &SessionRequest) -> Result<Option<InflightCall>, SessionError> {
        matches!(request, SessionRequest::InvokeTool { .. })
            .then(|| self.inflight.reserve())
            .transpose()
    }

    /// [`Self::request`], for the answer `pick` takes; any other is the wrong kind.
    async fn expect<T>(
        &self,
        request: SessionRequest,
        pick: impl FnOnce(SessionReply) -> Result<T, SessionReply>,
    ) -> Result<T, SessionError> {
        pick(self.request(request).await?).map_err(SessionReply::unexpected)
    }

    /// [`Self::expect`] for a request answered `Done`.
    async fn expect_done(&self, request: SessionRequest) -> Result<(), SessionError> {
        self.expect(request, |reply| match reply {
            SessionReply::Done => Ok(()),
            other => Err(other),
        })
        .await
    }

    /// What `session/open` reports of the session now.
    pub async fn describe(&self) -> Result<SessionView, SessionError> {
        self.expect(SessionRequest::Describe {}, |reply| match reply {
            SessionReply::View(view) => Ok(*view),
            other => Err(other),
        })
        .await
    }

    /// Lets the actor take no more turns; answers once none runs.
    pub(crate) async fn drain(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Drain { reply }).await
    }

    /// Hands a command to the actor as it is (a follower passing on a client's request).
    pub(crate) fn send_command(&self, command: Command) -> Result<(), SessionError> {
        self.tx
            .unbounded_send(command)
            .map_err(|_| SessionError::ActorGone)
    }

    /// [`Self::attach`] for a client that replays the stored events after `after_seq`: the
    /// approvals still waiting that the replay does not hold are sent to it live.
    pub async fn attach_replaying(
        &self,
        watcher: Watcher,
        after_seq: Option<i64>,
    ) -> Result<(i64, SessionView), SessionError> {
        self.ask(|reply| {
            Command::Attach(Box::new(Attach {
                watcher,
                after_seq,
                reply,
            }))
        })
        .await
    }

    /// Stops streaming to a connection.
    pub async fn detach(&self, connection_id: u64) {
        let _ = self.tx.unbounded_send(Command::Detach { connection_id });
    }

    /// Runs a tool the way a model's call would run, counted as [`Self::request`] says.
    pub fn invoke_tool(
        &self,
        name: String,
        arguments: Value,
    ) -> impl Future<Output = Result<InvokeResult, SessionError>> + Send + 'static {
        self.invoke_tool_with(name, arguments, InvokeOptions::default())
    }

    /// [`Self::invoke_tool`] with the caller's own call id and cancellation.
    pub fn invoke_tool_with(
        &self,
        name: String,
        arguments: Value,
        options: InvokeOptions,
    ) -> impl Future<Output = Result<InvokeResult, SessionError>> + Send + 'static {
        let call = self.request(SessionRequest::invoke(name, arguments, options));
        async move {
            match call.await? {
                SessionReply::Invoked(result) => Ok(*result),
                other => Err(other.unexpected()),
            }
        }
    }

    /// The `tool/list` answer.
    pub async fn tool_list(&self) -> Result<Value, SessionError> {
        self.expect(SessionRequest::ToolList {}, |reply| match reply {
            SessionReply::ToolList(list) => Ok(list),
            other => Err(other),
        })
        .await
    }

    /// The session's tool catalog as it is now (what the model would be offered).
    pub async fn catalog(&self) -> Result<Arc<ToolCatalog>, SessionError> {
        self.ask(|reply| Command::Catalog { reply }).await
    }

    /// Starts a turn on `input` and `images`, with the model it chose (else the session's);
    /// returns its id once `turn/started` is out.
    pub async fn start_turn(
        &self,
        input: String,
        images: Vec<ImageInput>,
        turn_id: Option<String>,
        choice: ModelChoice,
    ) -> Result<String, SessionError> {
        self.start_turn_traced(input, images, turn_id, choice, None)
            .await
    }

    /// [`SessionHandle::start_turn`] continuing the caller's trace: `traceparent` (W3C) is
    /// the parent of the turn's `invoke_agent` span.
    pub async fn start_turn_traced(
        &self,
        input: String,
        images: Vec<ImageInput>,
        turn_id: Option<String>,
        choice: ModelChoice,
        traceparent: Option<String>,
    ) -> Result<String, SessionError> {
        let request = SessionRequest::StartTurn {
            input: TurnInput {
                text: input,
                images,
            },
            turn_id,
            model: choice.model,
            reasoning_effort: choice.reasoning_effort,
            meta: TurnMeta { traceparent },
        };
        self.expect(request, |reply| match reply {
            SessionReply::TurnStarted(turn_id) => Ok(turn_id),
            other => Err(other),
        })
        .await
    }

    /// [`SessionHandle::start_turn`] right after a turn was seen to end: its `turn/completed`
    /// is out a moment before its slot is free, so a refusal for that is tried again, for up
    /// to a second.
    pub async fn start_turn_after_end(
        &self,
        input: String,
        images: Vec<ImageInput>,
        turn_id: Option<String>,
        choice: ModelChoice,
        traceparent: Option<String>,
    ) -> Result<String, SessionError> {
        let mut tries = 0;
        loop {
            let started = self
                .start_turn_traced(
                    input.clone(),
                    images.clone(),
                    turn_id.clone(),
                    choice.clone(),
                    traceparent.clone(),
                )
                .await;
            match started {
                Err(SessionError::TurnInProgress) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                other => return other,
            }
        }
    }

    /// Makes `choice` the model the session's next turns use (already stored).
    pub async fn set_model(&self, choice: ModelChoice) -> Result<(), SessionError> {
        self.expect_done(SessionRequest::set_model(choice)).await
    }

    /// Interrupts the running turn; whether there was one.
    pub async fn interrupt(&self) -> Result<bool, SessionError> {
        self.expect(SessionRequest::Interrupt {}, |reply| match reply {
            SessionReply::Interrupted(interrupted) => Ok(interrupted),
            other => Err(other),
        })
        .await
    }

    /// Adds `input` to the running turn `turn_id`, read before its next model request.
    pub async fn steer(&self, turn_id: String, input: String) -> Result<(), SessionError> {
        self.expect_done(SessionRequest::Steer { turn_id, input })
            .await
    }

    /// Decides a call waiting for approval; `message` goes to the model with a decline.
    pub async fn respond_approval(
        &self,
        approval_id: String,
        decision: crate::agent::approval::Decision,
        message: Option<String>,
    ) -> Result<(), SessionError> {
        self.expect_done(SessionRequest::RespondApproval {
            approval_id,
            decision,
            message,
        })
        .await
    }

    /// Stops a running background task of this session and waits for it to end; its final
    /// state, or `None` when it was not running.
    pub async fn cancel_task(&self, task_id: String) -> Result<Option<TaskState>, SessionError> {
        self.expect(
            SessionRequest::CancelTask { task_id },
            |reply| match reply {
                SessionReply::TaskCancelled(state) => Ok(state),
                other => Err(other),
            },
        )
        .await
    }

    /// Stops the actor (the session is being deleted or the server is stopping) and waits
    /// until it has, so its running work is recorded as stopped before anything else happens.
    pub async fn close(&self) {
        let (stopped, done) = oneshot::channel();
        // The actor drops `stopped` when it has finished stopping; a queue already closed
        // means it has stopped.
        if self.tx.unbounded_send(Command::Close { stopped }).is_ok() {
            let _ = done.await;
        }
    }
}

/// An image a turn starts with, as the client gave it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ImageInput {
    /// Sent inline, already checked.
    Inline(crate::llm::ImageData),
    /// A file of the session's workspace, read when the turn starts.
    Path {
        /// Relative to the workspace root.
        path: String,
    },
}

/// Most images one input may carry.
pub const MAX_INPUT_IMAGES: usize = 20;

/// The model (`<provider>/<model>`) and reasoning effort a session or a turn asked for; `None`
/// leaves each to the session, then to the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelChoice {
    /// The model id.
    pub model: Option<String>,
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    pub reasoning_effort: Option<String>,
}

/// What a turn starts with, as the actor is asked for it.
#[derive(Debug)]
pub(crate) struct TurnStart {
    pub(crate) input: String,
    pub(crate) images: Vec<ImageInput>,
    pub(crate) turn_id: Option<String>,
    pub(crate) choice: ModelChoice,
    /// The W3C trace context the turn's span continues.
    pub(crate) traceparent: Option<String>,
}

/// The reasoning efforts the APIs know.
pub const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

impl ModelChoice {
    /// Whether it chooses anything.
    pub fn is_empty(&self) -> bool {
        self.model.is_none() && self.reasoning_effort.is_none()
    }

    /// Checks the choice against the configured models; the error names the choices.
    pub fn check(&self, agent: Option<&crate::agent::AgentSettings>) -> Result<(), SessionError> {
        if self.is_empty() {
            return Ok(());
        }
        if let Some(effort) = &self.reasoning_effort
            && !REASONING_EFFORTS.contains(&effort.as_str())
        {
            return Err(SessionError::InvalidParams(format!(
                "reasoning_effort {effort:?} is not one of {}",
                REASONING_EFFORTS.join(", ")
            )));
        }
        let Some(agent) = agent else {
            return Err(SessionError::LlmNotConfigured);
        };
        agent
            .with_choice(self.model.as_deref(), self.reasoning_effort.as_deref())
            .map(drop)
            .map_err(|unknown| SessionError::InvalidParams(unknown.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::{FutureExt, StreamExt};
    use tokio::sync::oneshot;

    use super::{Command, InflightCalls, Outbound, SessionHandle, SessionMcp, command_queue};

    /// `close` promises the actor has stopped when it returns: deleting a session relies on
    /// it to find no process or write of the session still running.
    #[tokio::test]
    async fn close_returns_only_once_the_actor_has_stopped() {
        let (tx, mut commands) = command_queue();
        let handle = SessionHandle::new(
            Arc::from("s"),
            tx,
            InflightCalls::new(1),
            Arc::new(SessionMcp::default()),
        );
        let (release, released) = oneshot::channel::<()>();
        let actor = tokio::spawn(async move {
            let Some(Command::Close { stopped }) = commands.next().await else {
                panic!("expected a close");
            };
            // Still stopping: the closer must wait.
            let _ = released.await;
            drop(stopped);
            commands
        });
        let mut closing = Box::pin(handle.close());
        for _ in 0..100 {
            assert!(
                (&mut closing).now_or_never().is_none(),
                "close returned before the stop"
            );
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        closing.await;
        // An actor already gone answers at once.
        drop(actor.await.unwrap());
        handle.close().await;
    }

    /// Each queued command or frame takes a node of its own size (plus a pointer), allocated
    /// when it is sent; a session's turn queues hundreds of frames, and a burst of requests
    /// as many commands.
    #[test]
    fn queued_frames_and_commands_take_two_words() {
        let sizes = (
            std::mem::size_of::<Outbound>(),
            std::mem::size_of::<Command>(),
        );
        assert_eq!(sizes, (16, 16), "(frame, command) bytes");
    }
}
