//! A zero-latency model inside the load tool's own process, speaking the three APIs agentd's
//! adapters use, each answering at once with the whole `stream: true` SSE answer:
//!
//! - `POST /v1/chat/completions`: role chunk, content or tool calls, finish chunk, usage chunk,
//!   `[DONE]`;
//! - `POST /v1/responses`: `response.created`, then per output item `response.output_item.added`,
//!   its `response.output_text.delta` or `response.function_call_arguments.delta` and
//!   `response.output_item.done`, then `response.completed` with usage;
//! - `POST /v1/messages` (Anthropic): `message_start`, per block `content_block_start`,
//!   `content_block_delta`, `content_block_stop`, then `message_delta` and `message_stop`, with
//!   prompt-cache usage worked out as Anthropic would (see [`PromptCache`]).
//!
//! The last user message picks the answer: `tools K` gets K `read_file` calls, anything else a
//! short text; a conversation that ends in tool results always gets the text, which ends the
//! turn. It keeps the bodies it received since the last [`MockModel::clear`], so that they can
//! be replayed to time the model's own share of a turn.

use std::collections::HashSet;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::child::READ_FILE;
use crate::report::{Latencies, nanos};

/// The model id agentd is configured with.
pub const MODEL: &str = "load-mock";
/// The `created` timestamp of every chunk.
const CREATED: u64 = 1_700_000_000;
/// How many content blocks before a breakpoint Anthropic checks for an earlier cache entry
/// ("about 20" in its prompt-caching documentation).
const LOOKBACK_BLOCKS: usize = 20;
/// Bytes of canonical JSON per estimated token.
const BYTES_PER_TOKEN: usize = 4;

/// One of the model APIs the mock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions.
    Chat,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Anthropic,
}

impl Api {
    /// The path under the base URL.
    fn path(self) -> &'static str {
        match self {
            Self::Chat => "chat/completions",
            Self::Responses => "responses",
            Self::Anthropic => "messages",
        }
    }
}

/// One request body the mock received, with the API it came to.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Where it was sent.
    pub api: Api,
    /// The body as received.
    pub body: Bytes,
}

/// Token totals of the Anthropic answers, as their usage reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheTotals {
    /// Requests accounted.
    pub requests: u64,
    /// `input_tokens`: after the last breakpoint, or not cacheable.
    pub input: u64,
    /// `cache_read_input_tokens`.
    pub cache_read: u64,
    /// `cache_creation_input_tokens`.
    pub cache_creation: u64,
}

impl CacheTotals {
    /// All prompt tokens: input, read and written.
    pub fn prompt(&self) -> u64 {
        self.input + self.cache_read + self.cache_creation
    }

    /// The share of prompt tokens read from the cache, 0 to 1.
    pub fn read_share(&self) -> f64 {
        self.cache_read as f64 / self.prompt().max(1) as f64
    }

    /// What was added since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            requests: self.requests - earlier.requests,
            input: self.input - earlier.input,
            cache_read: self.cache_read - earlier.cache_read,
            cache_creation: self.cache_creation - earlier.cache_creation,
        }
    }

    /// Both added up.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            requests: self.requests + other.requests,
            input: self.input + other.input,
            cache_read: self.cache_read + other.cache_read,
            cache_creation: self.cache_creation + other.cache_creation,
        }
    }
}

/// Where a block sits in an Anthropic request, in cache order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `tools[i]`.
    Tool(usize),
    /// `system[i]` (a string system prompt is one block).
    System(usize),
    /// `messages[m].content[b]` (a string content is one block).
    Message(usize, usize),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tool(at) => write!(f, "tools[{at}]"),
            Self::System(at) => write!(f, "system[{at}]"),
            Self::Message(message, block) => write!(f, "messages[{message}][{block}]"),
        }
    }
}

/// How one Anthropic request went through the prompt cache, to explain a low read share.
#[derive(Debug, Clone, Default)]
pub struct CacheRecord {
    /// Its usage.
    pub tokens: CacheTotals,
    /// Its blocks in cache order.
    pub blocks: usize,
    /// The blocks carrying `cache_control`.
    pub breakpoints: Vec<Place>,
    /// The last block of the prefix read from the cache, if any was.
    pub read_through: Option<Place>,
    /// The first block that differs from the previous request's block at the same position;
    /// `None` when this request only extends the previous one.
    pub first_change: Option<Place>,
}

/// Prompt-cache accounting the way Anthropic does it. Blocks are serialised in cache order
/// (tools, system, messages) as canonical JSON (sorted keys, `cache_control` taken out: moving a
/// breakpoint does not change the prefix); every block carrying `cache_control` makes the
/// prefix up to and including it a cache entry. A request reads the longest entry found at a
/// breakpoint or at one of the [`LOOKBACK_BLOCKS`] block boundaries before it; the tokens from
/// there to its last breakpoint are written; the rest is uncached input. Entries never expire
/// (a run is far shorter than the 5 minutes an entry lives unread).
#[derive(Debug, Default)]
pub struct PromptCache {
    /// (prefix length in bytes, hash of the prefix) of every entry written.
    entries: HashSet<(usize, u64)>,
    /// Each block's own hash in the previous request, to find where the next one departs.
    previous: Vec<u64>,
    totals: CacheTotals,
    log: Vec<CacheRecord>,
}

/// One block of a request in cache order.
struct CacheBlock {
    place: Place,
    /// Whether it carries `cache_control`.
    breakpoint: bool,
    /// Bytes of the prefix through this block.
    end: usize,
    /// Hash of the prefix through this block.
    prefix: u64,
    /// Hash of this block alone.
    own: u64,
}

impl PromptCache {
    /// Accounts one request: its usage, remembered in the totals and the log.
    fn account(&mut self, request: &MessagesRequest) -> CacheTotals {
        let blocks = cache_blocks(request);
        let total = blocks.last().map_or(0, |block| block.end);
        let breakpoints: Vec<usize> = (0..blocks.len())
            .filter(|&at| blocks[at].breakpoint)
            .collect();
        let read_at = breakpoints
            .iter()
            .flat_map(|&at| (at.saturating_sub(LOOKBACK_BLOCKS)..=at).rev())
            .filter(|&at| self.entries.contains(&(blocks[at].end, blocks[at].prefix)))
            .max();
        let read = read_at.map_or(0, |at| blocks[at].end);
        let written = breakpoints.last().map_or(0, |&at| blocks[at].end).max(read);
        for &at in &breakpoints {
            self.entries.insert((blocks[at].end, blocks[at].prefix));
        }
        let tokens = |bytes: usize| (bytes / BYTES_PER_TOKEN) as u64;
        let usage = CacheTotals {
            requests: 1,
            input: tokens(total) - tokens(written),
            cache_read: tokens(read),
            cache_creation: tokens(written) - tokens(read),
        };
        let first_change = blocks
            .iter()
            .zip(&self.previous)
            .find(|(block, previous)| block.own != **previous)
            .map(|(block, _)| block.place);
        self.previous = blocks.iter().map(|block| block.own).collect();
        self.totals = self.totals.plus(&usage);
        self.log.push(CacheRecord {
            tokens: usage,
            blocks: blocks.len(),
            breakpoints: breakpoints.iter().map(|&at| blocks[at].place).collect(),
            read_through: read_at.map(|at| blocks[at].place),
            first_change,
        });
        usage
    }
}

/// The request's blocks in cache order with their prefix hashes.
fn cache_blocks(request: &MessagesRequest) -> Vec<CacheBlock> {
    let mut items: Vec<(Place, String, bool)> = Vec::new();
    let mut push = |place: Place, prefix: &str, block: &Value| {
        let mut block = block.clone();
        let breakpoint = match &mut block {
            Value::Object(object) => object.remove("cache_control").is_some(),
            _ => false,
        };
        // serde_json's map is ordered by key, so this is canonical.
        items.push((place, format!("{prefix}{block}"), breakpoint));
    };
    for (at, tool) in request.tools.iter().enumerate() {
        push(Place::Tool(at), "", tool);
    }
    for (at, block) in content_blocks(request.system.as_ref()).iter().enumerate() {
        push(Place::System(at), "", block);
    }
    for (message, turn) in request.messages.iter().enumerate() {
        // The role is part of what the model reads, so it is part of the prefix.
        let role = format!("{}:", turn.role);
        for (at, block) in content_blocks(Some(&turn.content)).iter().enumerate() {
            push(Place::Message(message, at), &role, block);
        }
    }
    let mut running = DefaultHasher::new();
    let mut end = 0;
    items
        .into_iter()
        .map(|(place, text, breakpoint)| {
            running.write(text.as_bytes());
            // A separator, so that two blocks never hash like one.
            running.write_u8(0xff);
            end += text.len();
            let mut own = DefaultHasher::new();
            own.write(text.as_bytes());
            CacheBlock {
                place,
                breakpoint,
                end,
                prefix: running.finish(),
                own: own.finish(),
            }
        })
        .collect()
}

/// A `system` or `content` field as blocks: a string is one text block.
fn content_blocks(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

/// What the mock shares between its handlers and the scenario.
#[derive(Default)]
struct Shared {
    /// Bodies received since the last clear.
    recorded: Mutex<Vec<Recorded>>,
    /// Answers given so far.
    calls: AtomicU64,
    /// Anthropic's prompt cache.
    cache: Mutex<PromptCache>,
}

/// Locks a mutex whose holder may have panicked; what it guards stays usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A running mock; its server task ends when this is dropped.
pub struct MockModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    client: reqwest::Client,
}

impl MockModel {
    /// Serves on 127.0.0.1 port 0.
    pub async fn start() -> anyhow::Result<Self> {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .route("/v1/messages", post(messages))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            // The answer is one write; a lost option could only delay it.
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client = reqwest::Client::builder()
            .build()
            .context("cannot build the replay client")?;
        Ok(Self {
            addr,
            shared,
            task,
            client,
        })
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Answers given so far, replays included.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Forgets the bodies received so far.
    pub fn clear(&self) {
        lock(&self.shared.recorded).clear();
    }

    /// The bodies received since the last clear, in order.
    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *lock(&self.shared.recorded))
    }

    /// Token totals of every Anthropic answer so far.
    pub fn cache_totals(&self) -> CacheTotals {
        lock(&self.shared.cache).totals
    }

    /// How each Anthropic request since the last call went through the cache.
    pub fn take_cache_log(&self) -> Vec<CacheRecord> {
        std::mem::take(&mut lock(&self.shared.cache).log)
    }

    /// Sends `request` `rounds` times over one kept-alive connection and times each answer
    /// read to its end: what a model call costs when the client does nothing else.
    pub async fn replay(&self, request: &Recorded, rounds: usize) -> anyhow::Result<Latencies> {
        let url = format!("{}/{}", self.base_url(), request.api.path());
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let sent = Instant::now();
            let response = self
                .client
                .post(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream")
                .body(request.body.clone())
                .send()
                .await
                .context("replay to the mock")?;
            if !response.status().is_success() {
                bail!("the mock answered {}", response.status());
            }
            response.bytes().await.context("replay answer")?;
            samples.push(nanos(sent.elapsed()));
        }
        Ok(Latencies::new(samples))
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A short text, which ends the turn.
    Text,
    /// This many `read_file` calls.
    ToolCalls(usize),
}

/// The answer to a conversation whose last user text is `text`: `tools K` asks for K calls.
fn pick(text: &str) -> Answer {
    match text
        .trim()
        .strip_prefix("tools ")
        .and_then(|k| k.trim().parse().ok())
    {
        Some(k) if k > 0 => Answer::ToolCalls(k),
        _ => Answer::Text,
    }
}

/// The arguments of every `read_file` call the mock makes.
fn read_file_arguments() -> String {
    json!({ "path": READ_FILE }).to_string()
}

/// Parses a body, or answers 400 the way the APIs do.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|err| {
        Box::new(
            (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "application/json")],
                json!({"type": "error", "error": {"message": format!("load mock: {err}"), "type": "invalid_request_error"}})
                    .to_string(),
            )
                .into_response(),
        )
    })
}

/// Counts the call, keeps the body, and wraps the stream as the answer.
fn answer(shared: &Shared, api: Api, body: Bytes, stream: String) -> Response {
    lock(&shared.recorded).push(Recorded { api, body });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from(stream),
    )
        .into_response()
}

// ---- chat completions ----

/// The parts of a chat completions request the mock reads.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

/// One message of the conversation; only its role and text matter here.
#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// The answer a chat conversation asks for.
fn chat_answer(messages: &[ChatMessage]) -> Answer {
    if messages
        .last()
        .is_some_and(|message| message.role == "tool")
    {
        return Answer::Text;
    }
    let last_user = messages
        .iter()
        .rev()
        .find(|message| message.role == "user")
        .and_then(|message| message.content.as_ref())
        .and_then(Value::as_str)
        .unwrap_or_default();
    pick(last_user)
}

async fn chat(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let number = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let request: ChatRequest = match parse(&body) {
        Ok(request) => request,
        Err(refusal) => return *refusal,
    };
    let stream = chat_sse(number, &request.model, chat_answer(&request.messages));
    answer(&shared, Api::Chat, body, stream)
}

/// The whole chat completions event stream of one answer.
fn chat_sse(number: u64, model: &str, answer: Answer) -> String {
    let id = format!("chatcmpl-load-{number}");
    let chunk = |choices: Value, usage: Option<Value>| {
        let mut object = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if let Some(usage) = usage {
            object["usage"] = usage;
        }
        format!("data: {object}\n\n")
    };
    let delta = |delta: Value| {
        chunk(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
            None,
        )
    };
    let mut text = delta(json!({"role": "assistant", "content": ""}));
    let finish = match answer {
        Answer::Text => {
            text.push_str(&delta(json!({"content": "done"})));
            "stop"
        }
        Answer::ToolCalls(k) => {
            let arguments = read_file_arguments();
            for index in 0..k {
                text.push_str(&delta(json!({"tool_calls": [{
                    "index": index,
                    "id": format!("call_{number}_{index}"),
                    "type": "function",
                    "function": {"name": "read_file", "arguments": arguments},
                }]})));
            }
            "tool_calls"
        }
    };
    text.push_str(&chunk(
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish}]),
        None,
    ));
    text.push_str(&chunk(
        json!([]),
        Some(json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})),
    ));
    text.push_str("data: [DONE]\n\n");
    text
}

/// One named SSE event, as the Responses and Anthropic APIs write them.
fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

// ---- Responses ----

/// The parts of a Responses request the mock reads.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    input: Vec<Value>,
}

/// The answer a Responses conversation asks for: text after a function call's output, else
/// what the last user message says.
fn responses_answer(input: &[Value]) -> Answer {
    if input
        .last()
        .and_then(|item| item.get("type"))
        .and_then(Value::as_str)
        == Some("function_call_output")
    {
        return Answer::Text;
    }
    let last_user = input
        .iter()
        .rev()
        .find(|item| item.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|item| item.get("content"));
    let text = match last_user {
        Some(Value::String(text)) => text.as_str(),
        Some(Value::Array(parts)) => parts
            .iter()
            .rev()
            .find(|part| part.get("type").and_then(Value::as_str) == Some("input_text"))
            .and_then(|part| part.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default(),
        _ => "",
    };
    pick(text)
}

async fn responses(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let number = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let request: ResponsesRequest = match parse(&body) {
        Ok(request) => request,
        Err(refusal) => return *refusal,
    };
    // No prompt cache here: bytes/4 of the body stands for the prompt.
    let input_tokens = (body.len() / BYTES_PER_TOKEN) as u64;
    let stream = responses_sse(
        number,
        &request.model,
        responses_answer(&request.input),
        input_tokens,
    );
    answer(&shared, Api::Responses, body, stream)
}

/// The whole Responses event stream of one answer.
fn responses_sse(number: u64, model: &str, answer: Answer, input_tokens: u64) -> String {
    let mut sequence = 0_u64;
    let mut text = String::new();
    let mut emit = |kind: &str, mut data: Value| {
        data["type"] = Value::from(kind);
        data["sequence_number"] = Value::from(sequence);
        sequence += 1;
        text.push_str(&event(kind, &data));
    };
    let response = |status: &str, output: Value, usage: Value| {
        json!({
            "id": format!("resp_load_{number}"), "object": "response", "created_at": CREATED,
            "status": status, "model": model, "output": output, "store": false, "usage": usage,
        })
    };
    emit(
        "response.created",
        json!({"response": response("in_progress", json!([]), Value::Null)}),
    );
    let mut output = Vec::new();
    match answer {
        Answer::Text => {
            let id = format!("msg_load_{number}");
            emit(
                "response.output_item.added",
                json!({"output_index": 0, "item": {"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
            );
            emit(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": "done"}),
            );
            let item = json!({"id": id, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "done", "annotations": []}]});
            emit(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            );
            output.push(item);
        }
        Answer::ToolCalls(k) => {
            let arguments = read_file_arguments();
            for index in 0..k {
                let id = format!("fc_load_{number}_{index}");
                let call_id = format!("call_load_{number}_{index}");
                emit(
                    "response.output_item.added",
                    json!({"output_index": index, "item": {"id": id, "type": "function_call", "status": "in_progress",
                        "arguments": "", "call_id": call_id, "name": "read_file"}}),
                );
                emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": arguments}),
                );
                let item = json!({"id": id, "type": "function_call", "status": "completed",
                    "arguments": arguments, "call_id": call_id, "name": "read_file"});
                emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                output.push(item);
            }
        }
    }
    let usage = json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + 5,
    });
    emit(
        "response.completed",
        json!({"response": response("completed", Value::Array(output), usage)}),
    );
    text
}

// ---- Anthropic Messages ----

/// The parts of a Messages request the mock reads.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    messages: Vec<MessagesTurn>,
}

/// One message; its content is a string or a list of blocks.
#[derive(Debug, Deserialize)]
struct MessagesTurn {
    role: String,
    #[serde(default)]
    content: Value,
}

/// The answer an Anthropic conversation asks for: text when the last message ends in a tool
/// result (tool results come before a user's text in a merged message), else what the last
/// user text says.
fn messages_answer(messages: &[MessagesTurn]) -> Answer {
    let Some(last) = messages.iter().rev().find(|turn| turn.role == "user") else {
        return Answer::Text;
    };
    let blocks = content_blocks(Some(&last.content));
    let is_last = |kind: &str| {
        blocks
            .last()
            .and_then(|block| block.get("type"))
            .and_then(Value::as_str)
            == Some(kind)
    };
    if messages.last().is_some_and(|turn| turn.role == "user") && is_last("tool_result") {
        return Answer::Text;
    }
    let text = blocks
        .iter()
        .rev()
        .find(|block| block.get("type").and_then(Value::as_str) == Some("text"))
        .and_then(|block| block.get("text"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    pick(text)
}

async fn messages(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let number = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let request: MessagesRequest = match parse(&body) {
        Ok(request) => request,
        Err(refusal) => return *refusal,
    };
    let usage = lock(&shared.cache).account(&request);
    let stream = messages_sse(
        number,
        &request.model,
        messages_answer(&request.messages),
        &usage,
    );
    answer(&shared, Api::Anthropic, body, stream)
}

/// The whole Anthropic event stream of one answer.
fn messages_sse(number: u64, model: &str, answer: Answer, usage: &CacheTotals) -> String {
    let mut text = String::new();
    let mut emit = |kind: &str, mut data: Value| {
        data["type"] = Value::from(kind);
        text.push_str(&event(kind, &data));
    };
    emit(
        "message_start",
        json!({"message": {
            "id": format!("msg_load_{number}"), "type": "message", "role": "assistant",
            "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
            "usage": {
                "input_tokens": usage.input,
                "cache_creation_input_tokens": usage.cache_creation,
                "cache_read_input_tokens": usage.cache_read,
                "output_tokens": 1,
            },
        }}),
    );
    let stop_reason = match answer {
        Answer::Text => {
            emit(
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            emit(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "text_delta", "text": "done"}}),
            );
            emit("content_block_stop", json!({"index": 0}));
            "end_turn"
        }
        Answer::ToolCalls(k) => {
            let arguments = read_file_arguments();
            for index in 0..k {
                emit(
                    "content_block_start",
                    json!({"index": index, "content_block": {"type": "tool_use",
                        "id": format!("toolu_load_{number}_{index}"), "name": "read_file", "input": {}}}),
                );
                emit(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                );
                emit("content_block_stop", json!({"index": index}));
            }
            "tool_use"
        }
    };
    emit(
        "message_delta",
        json!({"delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
    );
    emit("message_stop", json!({}));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(Value::String(content.into())),
        }
    }

    #[test]
    fn the_last_user_message_picks_the_answer() {
        let system = message("system", "you are");
        assert_eq!(
            chat_answer(&[message("system", "x"), message("user", "tools 3")]),
            Answer::ToolCalls(3)
        );
        assert_eq!(
            chat_answer(&[system, message("user", "text")]),
            Answer::Text
        );
        assert_eq!(
            chat_answer(&[message("user", "tools 3"), message("tool", "hello")]),
            Answer::Text
        );
    }

    #[test]
    fn responses_and_anthropic_pick_alike() {
        let user = |text: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]});
        assert_eq!(responses_answer(&[user("tools 2")]), Answer::ToolCalls(2));
        assert_eq!(
            responses_answer(&[
                user("tools 2"),
                json!({"type": "function_call_output", "call_id": "c", "output": "x"})
            ]),
            Answer::Text
        );
        let turn = |role: &str, content: Value| MessagesTurn {
            role: role.into(),
            content,
        };
        let asked = turn("user", json!([{"type": "text", "text": "tools 2"}]));
        assert_eq!(
            messages_answer(std::slice::from_ref(&asked)),
            Answer::ToolCalls(2)
        );
        let results = turn(
            "user",
            json!([{"type": "tool_result", "tool_use_id": "t", "content": "x"}]),
        );
        let called = turn(
            "assistant",
            json!([{"type": "tool_use", "id": "t", "name": "read_file", "input": {}}]),
        );
        assert_eq!(messages_answer(&[asked, called, results]), Answer::Text);
        assert_eq!(
            messages_answer(&[turn("user", Value::from("tools 4"))]),
            Answer::ToolCalls(4)
        );
    }

    fn request(tools: usize, messages: &[(&str, &str, bool)]) -> MessagesRequest {
        let mut tool_list: Vec<Value> = (0..tools)
            .map(|at| json!({"name": format!("tool_{at}"), "input_schema": {"type": "object", "description": "x".repeat(400)}}))
            .collect();
        if let Some(last) = tool_list.last_mut() {
            last["cache_control"] = json!({"type": "ephemeral"});
        }
        MessagesRequest {
            model: MODEL.into(),
            system: Some(
                json!([{"type": "text", "text": "s".repeat(800), "cache_control": {"type": "ephemeral"}}]),
            ),
            tools: tool_list,
            messages: messages
                .iter()
                .map(|(role, text, breakpoint)| {
                    let mut block = json!({"type": "text", "text": text});
                    if *breakpoint {
                        block["cache_control"] = json!({"type": "ephemeral"});
                    }
                    MessagesTurn {
                        role: (*role).into(),
                        content: json!([block]),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn a_growing_conversation_reads_what_the_previous_request_wrote() {
        let mut cache = PromptCache::default();
        let first = cache.account(&request(3, &[("user", "one", true)]));
        assert_eq!(first.cache_read, 0);
        assert!(first.cache_creation > 0);
        assert_eq!(first.input, 0, "everything is before the last breakpoint");
        let second = cache.account(&request(
            3,
            &[
                ("user", "one", true),
                ("assistant", "two", false),
                ("user", "three", true),
            ],
        ));
        // Everything the first request wrote is read; only the new messages are written.
        assert_eq!(second.cache_read, first.cache_creation);
        assert!(second.cache_creation > 0 && second.cache_creation < 20);
        assert_eq!(cache.log[1].first_change, None);
        assert_eq!(cache.log[1].read_through, Some(Place::Message(0, 0)));
        // Moving the breakpoint does not change the prefix: the same request without the old
        // one still reads it, through the lookback.
        let third = cache.account(&request(
            3,
            &[
                ("user", "one", false),
                ("assistant", "two", false),
                ("user", "three", true),
            ],
        ));
        assert_eq!(third.cache_read, second.prompt());
        assert_eq!(third.cache_creation, 0);
        // A tool added to the list: the tools before it are still read (found by looking back
        // from the new last tool's breakpoint), everything after it is written again.
        let fourth = cache.account(&request(
            4,
            &[
                ("user", "one", true),
                ("assistant", "two", false),
                ("user", "three", true),
            ],
        ));
        assert_eq!(cache.log[3].first_change, Some(Place::Tool(3)));
        assert_eq!(cache.log[3].read_through, Some(Place::Tool(2)));
        assert!(fourth.cache_read > 0 && fourth.cache_creation > 0);
        assert_eq!(cache.totals.requests, 4);
    }
}
