//! A scripted OpenAI-compatible chat completions server on loopback, for tests.
//!
//! Each POST to `/v1/chat/completions` is recorded (body and headers) and answered by the next
//! [`Reply`] of a [`Script`]: a streamed answer written exactly like OpenAI's SSE (role chunk,
//! content or tool-call fragments, a finish chunk, a `choices: []` usage chunk, `[DONE]`), an
//! HTTP error, a stream cut off mid-way, or a stream that holds until a [`Notify`] fires.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

/// The `created` timestamp of every chunk.
const CREATED: u64 = 1_700_000_000;

/// Frames queued between the script and hyper.
const FRAME_BUFFER: usize = 4;

/// Tokens reported in the final chunk unless a reply says otherwise.
pub const DEFAULT_USAGE: (u64, u64) = (10, 5);

/// One scripted tool call: its id, name, and the argument text in the fragments it streams in.
#[derive(Debug, Clone)]
pub struct ScriptedCall {
    /// The call id (sent in the first fragment).
    pub id: String,
    /// The tool name (sent in the first fragment).
    pub name: String,
    /// The argument fragments, concatenated by the client.
    pub fragments: Vec<String>,
}

impl ScriptedCall {
    /// A call whose arguments arrive in `fragments`.
    pub fn new(id: &str, name: &str, fragments: &[&str]) -> Self {
        Self {
            id: id.to_string(),
            name: name.to_string(),
            fragments: fragments.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// A call whose whole argument JSON arrives in one fragment.
    pub fn whole(id: &str, name: &str, arguments: &Value) -> Self {
        Self::new(id, name, &[&arguments.to_string()])
    }
}

/// One thing the stream does.
#[derive(Debug, Clone)]
enum Step {
    /// A chunk whose only choice carries this delta.
    Delta(Value),
    /// Waits for this notification before going on.
    Wait(Arc<Notify>),
    /// Raw bytes, written as they are.
    Raw(String),
    /// Breaks the connection without finishing the response.
    Cut,
}

/// How one request is answered.
#[derive(Debug, Clone)]
enum Kind {
    /// A streamed answer: its steps, then (unless `unfinished`) the finish chunk, usage, `[DONE]`.
    Stream {
        steps: Vec<Step>,
        finish_reason: String,
        unfinished: bool,
    },
    /// An HTTP error with a JSON body and maybe `Retry-After`.
    Status {
        status: u16,
        body: Value,
        retry_after: Option<String>,
    },
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    kind: Kind,
    usage: Option<(u64, u64)>,
    /// Prompt tokens the usage chunk says were cached (`prompt_tokens_details`).
    cached: Option<u64>,
}

fn role_delta() -> Value {
    json!({"role": "assistant", "content": ""})
}

fn text_steps(chunks: &[&str]) -> Vec<Step> {
    chunks
        .iter()
        .map(|chunk| Step::Delta(json!({"content": chunk})))
        .collect()
}

impl Reply {
    fn stream(steps: Vec<Step>, finish_reason: &str) -> Self {
        let mut all = vec![Step::Delta(role_delta())];
        all.extend(steps);
        Self {
            kind: Kind::Stream {
                steps: all,
                finish_reason: finish_reason.to_string(),
                unfinished: false,
            },
            usage: Some(DEFAULT_USAGE),
            cached: None,
        }
    }

    /// A text answer streamed in these chunks, finishing with `stop`.
    pub fn text(chunks: &[&str]) -> Self {
        Self::stream(text_steps(chunks), "stop")
    }

    /// Tool calls, each streamed whole before the next: the first fragment carries id, type
    /// and name with empty arguments, then one fragment per argument piece; finishes with
    /// `tool_calls`.
    pub fn tool_calls(calls: Vec<ScriptedCall>) -> Self {
        Self::text_then_tool_calls(&[], calls)
    }

    /// Text first, then tool calls, as models that think aloud do.
    pub fn text_then_tool_calls(text: &[&str], calls: Vec<ScriptedCall>) -> Self {
        let mut steps = text_steps(text);
        for (index, call) in calls.iter().enumerate() {
            steps.push(Step::Delta(call_head(index, call)));
            for fragment in &call.fragments {
                steps.push(Step::Delta(call_fragment(index, fragment)));
            }
        }
        Self::stream(steps, "tool_calls")
    }

    /// Tool calls whose fragments alternate between the calls (round robin), as parallel tool
    /// calls from some servers do.
    pub fn tool_calls_interleaved(calls: Vec<ScriptedCall>) -> Self {
        let mut steps = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            steps.push(Step::Delta(call_head(index, call)));
        }
        let longest = calls.iter().map(|c| c.fragments.len()).max().unwrap_or(0);
        for position in 0..longest {
            for (index, call) in calls.iter().enumerate() {
                if let Some(fragment) = call.fragments.get(position) {
                    steps.push(Step::Delta(call_fragment(index, fragment)));
                }
            }
        }
        Self::stream(steps, "tool_calls")
    }

    /// Streams `before`, waits until `until` is notified, then streams `after` and finishes.
    pub fn hold(before: &[&str], until: Arc<Notify>, after: &[&str]) -> Self {
        let mut steps = text_steps(before);
        steps.push(Step::Wait(until));
        steps.extend(text_steps(after));
        Self::stream(steps, "stop")
    }

    /// Waits until `until` is notified, then streams these tool calls.
    pub fn hold_then_tool_calls(until: Arc<Notify>, calls: Vec<ScriptedCall>) -> Self {
        let mut reply = Self::tool_calls(calls);
        if let Kind::Stream { steps, .. } = &mut reply.kind {
            steps.insert(0, Step::Wait(until));
        }
        reply
    }

    /// Streams these text chunks, then breaks the connection (no finish, no `[DONE]`).
    pub fn cut(chunks_before: &[&str]) -> Self {
        let mut steps = vec![Step::Delta(role_delta())];
        steps.extend(text_steps(chunks_before));
        steps.push(Step::Cut);
        Self {
            kind: Kind::Stream {
                steps,
                finish_reason: String::new(),
                unfinished: true,
            },
            usage: None,
            cached: None,
        }
    }

    /// Streams these text chunks, then ends the response cleanly without finishing the
    /// completion (no finish_reason, no `[DONE]`).
    pub fn truncated(chunks_before: &[&str]) -> Self {
        let mut reply = Self::cut(chunks_before);
        if let Kind::Stream { steps, .. } = &mut reply.kind {
            steps.pop();
        }
        reply
    }

    /// A `200 text/event-stream` whose body is exactly `body` (for malformed streams).
    pub fn raw_sse(body: &str) -> Self {
        Self {
            kind: Kind::Stream {
                steps: vec![Step::Raw(body.to_string())],
                finish_reason: String::new(),
                unfinished: true,
            },
            usage: None,
            cached: None,
        }
    }

    /// An HTTP error with an OpenAI-style error body.
    pub fn status(status: u16) -> Self {
        Self::error(
            status,
            json!({"error": {"message": format!("scripted status {status}"), "type": "server_error", "param": null, "code": null}}),
        )
    }

    /// An HTTP error with `Retry-After: seconds`.
    pub fn status_retry_after(status: u16, seconds: u64) -> Self {
        let mut reply = Self::status(status);
        if let Kind::Status { retry_after, .. } = &mut reply.kind {
            *retry_after = Some(seconds.to_string());
        }
        reply
    }

    /// An HTTP error with this JSON body.
    pub fn error(status: u16, body: Value) -> Self {
        Self {
            kind: Kind::Status {
                status,
                body,
                retry_after: None,
            },
            usage: None,
            cached: None,
        }
    }

    /// OpenAI's answer to a conversation longer than the context window.
    pub fn context_overflow() -> Self {
        Self::error(
            400,
            json!({"error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded"
            }}),
        )
    }

    /// Reports this usage in the final chunk (streamed replies only).
    pub fn with_usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = Some((prompt_tokens, completion_tokens));
        self
    }

    /// Says in the usage chunk that `cached_tokens` of the prompt came from the cache.
    pub fn with_cached(mut self, cached_tokens: u64) -> Self {
        self.cached = Some(cached_tokens);
        self
    }

    /// Sends no usage chunk.
    pub fn without_usage(mut self) -> Self {
        self.usage = None;
        self
    }
}

fn call_head(index: usize, call: &ScriptedCall) -> Value {
    json!({"tool_calls": [{
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""}
    }]})
}

fn call_fragment(index: usize, fragment: &str) -> Value {
    json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
}

/// Picks the reply to a request from its body.
type Pick = dyn Fn(&Value) -> Reply + Send + Sync;

/// Which reply each request gets.
pub struct Script {
    source: Source,
}

enum Source {
    Sequence(Mutex<VecDeque<Reply>>),
    Route(Box<Pick>),
}

impl Script {
    /// Replies in this order, one per request; requests beyond the list get a 400 saying so.
    pub fn sequence(replies: Vec<Reply>) -> Self {
        Self {
            source: Source::Sequence(Mutex::new(replies.into())),
        }
    }

    /// The reply a closure picks from the request body (e.g. by the first user message, or
    /// by how many tool messages the conversation holds).
    pub fn route(pick: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Route(Box::new(pick)),
        }
    }

    /// The same reply to every request.
    pub fn always(reply: Reply) -> Self {
        Self::route(move |_| reply.clone())
    }

    fn next(&self, body: &Value) -> Option<Reply> {
        match &self.source {
            Source::Sequence(queue) => queue.lock().unwrap().pop_front(),
            Source::Route(pick) => Some(pick(body)),
        }
    }
}

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The JSON body (a string value when it was not JSON).
    pub body: Value,
    /// The request headers.
    pub headers: HeaderMap,
}

struct Shared {
    script: Script,
    recorded: Mutex<Vec<Recorded>>,
    count: watch::Sender<usize>,
}

/// A running mock; stops when dropped.
pub struct MockLlm {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl MockLlm {
    /// Starts the mock on 127.0.0.1 with an ephemeral port.
    pub async fn start(script: Script) -> Self {
        let (count, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            script,
            recorded: Mutex::new(Vec::new()),
            count,
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            // The other APIs' paths answer from the same script (with `Reply::raw_sse`).
            .route("/v1/messages", post(handle))
            .route("/v1/responses", post(handle))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.recorded().into_iter().map(|r| r.body).collect()
    }

    /// Every request received (body and headers), in order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared.recorded.lock().unwrap().clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.shared.recorded.lock().unwrap().len()
    }

    /// Waits until at least `n` requests arrived; panics after `timeout`.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) {
        let mut count = self.shared.count.subscribe();
        tokio::time::timeout(timeout, count.wait_for(|seen| *seen >= n))
            .await
            .unwrap_or_else(|_| panic!("expected {n} requests, got {}", self.request_count()))
            .unwrap();
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let body = serde_json::from_slice::<Value>(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let number = {
        let mut recorded = shared.recorded.lock().unwrap();
        recorded.push(Recorded {
            body: body.clone(),
            headers,
        });
        recorded.len()
    };
    shared.count.send_replace(number);
    let Some(reply) = shared.script.next(&body) else {
        return error_response(
            400,
            &json!({"error": {"message": format!("mock_llm: no scripted reply left for request {number}"), "type": "invalid_request_error"}}),
            None,
        );
    };
    let model = body["model"].as_str().unwrap_or("mock").to_string();
    match reply.kind {
        Kind::Status {
            status,
            body,
            retry_after,
        } => error_response(status, &body, retry_after.as_deref()),
        Kind::Stream {
            steps,
            finish_reason,
            unfinished,
        } => stream_response(
            format!("chatcmpl-mock-{number}"),
            model,
            steps,
            (!unfinished).then_some(finish_reason),
            reply.usage,
            reply.cached,
        ),
    }
}

fn error_response(status: u16, body: &Value, retry_after: Option<&str>) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_str(seconds).unwrap());
    }
    response
}

fn chunk(id: &str, model: &str, choices: Value, usage: Option<Value>) -> String {
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
}

fn stream_response(
    id: String,
    model: String,
    steps: Vec<Step>,
    finish_reason: Option<String>,
    usage: Option<(u64, u64)>,
    cached: Option<u64>,
) -> Response {
    let (frames, receiver) = mpsc::channel::<Result<Bytes, std::io::Error>>(FRAME_BUFFER);
    tokio::spawn(async move {
        for step in steps {
            let frame = match step {
                Step::Delta(delta) => chunk(
                    &id,
                    &model,
                    json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
                    None,
                ),
                Step::Raw(text) => text,
                Step::Wait(notify) => {
                    tokio::select! {
                        _ = notify.notified() => continue,
                        _ = frames.closed() => return,
                    }
                }
                Step::Cut => {
                    // hyper drops what it has buffered when the body fails, so the chunks
                    // before the cut must be on the wire first: wait until hyper took them
                    // all, then give it a moment to flush.
                    drop(frames.reserve_many(FRAME_BUFFER).await);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = frames
                        .send(Err(std::io::Error::other("scripted cut")))
                        .await;
                    return;
                }
            };
            if frames.send(Ok(Bytes::from(frame))).await.is_err() {
                return;
            }
        }
        let Some(reason) = finish_reason else {
            return;
        };
        let mut tail = chunk(
            &id,
            &model,
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]),
            None,
        );
        if let Some((prompt, completion)) = usage {
            let mut usage = json!({
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion
            });
            if let Some(cached) = cached {
                usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
            }
            tail.push_str(&chunk(&id, &model, json!([]), Some(usage)));
        }
        tail.push_str("data: [DONE]\n\n");
        let _ = frames.send(Ok(Bytes::from(tail))).await;
    });
    let body = Body::from_stream(futures_util::stream::unfold(
        receiver,
        |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
    ));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
