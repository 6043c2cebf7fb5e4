//! A zero-latency OpenAI-compatible model inside the load tool's own process: it answers
//! `POST /v1/chat/completions` at once with the whole `stream: true` SSE answer agentd expects
//! (role chunk, content or tool calls, finish chunk, usage chunk, `[DONE]`).
//!
//! The last user message picks the answer: `tools K` gets K `read_file` calls, anything else a
//! short text; a conversation that ends in tool results always gets the text, which ends the
//! turn. It keeps the bodies it received since the last [`MockModel::clear`], so that they can
//! be replayed to time the model's own share of a turn.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::child::READ_FILE;
use crate::report::{Latencies, nanos};

/// The model id agentd is configured with.
pub const MODEL: &str = "load-mock";
/// The `created` timestamp of every chunk.
const CREATED: u64 = 1_700_000_000;

/// What the mock shares between its handler and the scenario.
#[derive(Default)]
struct Shared {
    /// Bodies received since the last clear.
    recorded: Mutex<Vec<Bytes>>,
    /// Completions answered so far.
    calls: AtomicU64,
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
            .route("/v1/chat/completions", post(complete))
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

    /// Completions answered so far, replays included.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Forgets the bodies received so far.
    pub fn clear(&self) {
        self.recorded().clear();
    }

    /// The bodies received since the last clear, in order.
    pub fn take(&self) -> Vec<Bytes> {
        std::mem::take(&mut *self.recorded())
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Vec<Bytes>> {
        self.shared
            .recorded
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Sends `body` `rounds` times over one kept-alive connection and times each answer read
    /// to its end: what a model call costs when the client does nothing else.
    pub async fn replay(&self, body: &Bytes, rounds: usize) -> anyhow::Result<Latencies> {
        let url = format!("{}/chat/completions", self.base_url());
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let sent = Instant::now();
            let response = self
                .client
                .post(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream")
                .body(body.clone())
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

/// The parts of a chat completions request the mock reads.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    messages: Vec<WireMessage>,
}

/// One message of the conversation; only its role and text matter here.
#[derive(Debug, Deserialize)]
struct WireMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// The answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A short text, which ends the turn.
    Text,
    /// This many `read_file` calls.
    ToolCalls(usize),
}

/// The answer the conversation asks for.
fn answer_for(messages: &[WireMessage]) -> Answer {
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
    match last_user
        .strip_prefix("tools ")
        .and_then(|k| k.trim().parse().ok())
    {
        Some(k) if k > 0 => Answer::ToolCalls(k),
        _ => Answer::Text,
    }
}

async fn complete(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let number = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "application/json")],
                json!({"error": {"message": format!("load mock: {err}"), "type": "invalid_request_error"}})
                    .to_string(),
            )
                .into_response();
        }
    };
    let answer = answer_for(&request.messages);
    shared
        .recorded
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .push(body);
    let id = format!("chatcmpl-load-{number}");
    let stream = sse(&id, &request.model, number, answer);
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

/// The whole event stream of one answer.
fn sse(id: &str, model: &str, number: u64, answer: Answer) -> String {
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
            let arguments = json!({ "path": READ_FILE }).to_string();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> WireMessage {
        WireMessage {
            role: role.into(),
            content: Some(Value::String(content.into())),
        }
    }

    #[test]
    fn the_last_user_message_picks_the_answer() {
        let system = message("system", "you are");
        assert_eq!(
            answer_for(&[message("system", "x"), message("user", "tools 3")]),
            Answer::ToolCalls(3)
        );
        assert_eq!(answer_for(&[system, message("user", "text")]), Answer::Text);
        assert_eq!(
            answer_for(&[message("user", "tools 3"), message("tool", "hello")]),
            Answer::Text
        );
    }
}
