//! The provider for OpenAI-compatible chat completions endpoints (OpenAI, vLLM, llama.cpp,
//! Ollama, LM Studio, …).
//!
//! What goes over the wire is async-openai's types: the request is serialised from
//! [`CreateChatCompletionRequest`], every stream chunk is deserialised into
//! [`CreateChatCompletionStreamResponse`] and error bodies into [`WrappedError`]. The HTTP and SSE
//! layer is reqwest itself, because async-openai's client drops the `Retry-After` header, cannot
//! tell a stream that ended with `[DONE]` from one that was cut off, and offers no way to retry
//! only while nothing of the answer has been consumed yet.
//!
//! Failures map onto [`LlmError`]: 429, 5xx, 408 and transport errors are retried with
//! exponential backoff (or the server's `Retry-After`) as long as no byte of the answer has been
//! read; 401/403 are `Unauthorized`; any answer that says the context is too long is
//! `ContextOverflow`; a stream that is cut off or malformed is `BadResponse`. Cancellation wins
//! at every await point.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use async_openai::error::WrappedError;
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, ChatCompletionStreamOptions,
    ChatCompletionToolChoiceOption, ChatCompletionTools, CreateChatCompletionRequest,
    CreateChatCompletionStreamResponse, FunctionCall, FunctionObject, ToolChoiceOptions,
};
use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ChatMessage, ChatRequest, ChatResponse, LlmError, Provider, ToolCall, Usage};
use crate::config::{LlmConfig, Secret};
use crate::tools::ToolSpec;

/// How much of an error body is read; the rest is not worth the wait.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How much of an error message ends up in [`LlmError`].
const MAX_ERROR_MESSAGE: usize = 1000;
/// One SSE event may not grow beyond this (protects memory against a runaway stream).
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Which request field carries the completion token cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensField {
    /// `max_tokens`: what vLLM, llama.cpp, Ollama, LM Studio and OpenAI's non-reasoning models
    /// all accept, hence the default.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require instead.
    MaxCompletionTokens,
}

/// Timeouts, retry policy and wire choices of an [`OpenAiProvider`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiOptions {
    /// Limit for establishing the connection.
    pub connect_timeout: Duration,
    /// Limit for one whole request, from connecting to the end of the stream.
    pub request_timeout: Duration,
    /// Retries after the first attempt (429, 5xx, 408 and transport errors only).
    pub max_retries: u32,
    /// First backoff delay; it doubles on every retry.
    pub backoff_base: Duration,
    /// Longest backoff delay.
    pub backoff_cap: Duration,
    /// Longest wait a server's `Retry-After` may impose.
    pub retry_after_cap: Duration,
    /// Where the completion token cap goes.
    pub max_tokens_field: MaxTokensField,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            max_retries: 3,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(8),
            retry_after_cap: Duration::from_secs(30),
            max_tokens_field: MaxTokensField::MaxTokens,
        }
    }
}

/// A [`Provider`] for any OpenAI-compatible `/chat/completions` endpoint.
pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: Url,
    api_key: Option<Secret>,
    default_model: Option<String>,
    options: OpenAiOptions,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut endpoint = self.endpoint.clone();
        // A base URL may carry credentials of its own.
        let _ = endpoint.set_password(None);
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &endpoint.as_str())
            .field(
                "api_key",
                &self
                    .api_key
                    .as_ref()
                    .map(|_| "[redacted]")
                    .unwrap_or("none"),
            )
            .field("default_model", &self.default_model)
            .field("options", &self.options)
            .finish()
    }
}

impl OpenAiProvider {
    /// A provider for the configured endpoint with default timeouts and retries.
    pub fn new(config: &LlmConfig) -> Result<Self, LlmError> {
        Self::with_options(config, OpenAiOptions::default())
    }

    /// A provider for the configured endpoint with explicit timeouts, retries and wire choices.
    pub fn with_options(config: &LlmConfig, options: OpenAiOptions) -> Result<Self, LlmError> {
        let base_url = config
            .base_url
            .as_deref()
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .ok_or_else(|| {
                LlmError::Unavailable("no model endpoint is configured ([llm] base_url)".into())
            })?;
        let endpoint = chat_completions_url(base_url)?;
        let api_key = config
            .api_key
            .as_ref()
            .filter(|key| !key.expose().is_empty())
            .cloned();
        if let Some(key) = &api_key
            && HeaderValue::from_str(&format!("Bearer {}", key.expose())).is_err()
        {
            return Err(LlmError::Unauthorized(
                "the API key contains characters that cannot be sent in an HTTP header".into(),
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .timeout(options.request_timeout)
            .build()
            .map_err(|err| LlmError::Unavailable(format!("cannot build the HTTP client: {err}")))?;
        Ok(Self {
            client,
            endpoint,
            api_key,
            default_model: config.model.clone().filter(|model| !model.is_empty()),
            options,
        })
    }

    /// The URL requests go to (`…/chat/completions`).
    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// The options in force.
    pub fn options(&self) -> &OpenAiOptions {
        &self.options
    }

    /// The wire request for `request`, as async-openai types.
    fn wire_request(&self, request: &ChatRequest) -> CreateChatCompletionRequest {
        let model = if request.model.is_empty() {
            self.default_model.clone().unwrap_or_default()
        } else {
            request.model.clone()
        };
        let tools: Option<Vec<ChatCompletionTools>> =
            (!request.tools.is_empty()).then(|| request.tools.iter().map(wire_tool).collect());
        let tool_choice = tools
            .as_ref()
            .map(|_| ChatCompletionToolChoiceOption::Mode(ToolChoiceOptions::Auto));
        let mut wire = CreateChatCompletionRequest {
            model,
            messages: request.messages.iter().map(wire_message).collect(),
            stream: Some(true),
            stream_options: Some(ChatCompletionStreamOptions {
                include_usage: Some(true),
                include_obfuscation: None,
            }),
            tools,
            tool_choice,
            ..Default::default()
        };
        if request.max_tokens > 0 {
            match self.options.max_tokens_field {
                MaxTokensField::MaxTokens => {
                    // Deprecated by OpenAI in favour of max_completion_tokens, yet it is the
                    // field every compatible server understands.
                    #[allow(deprecated)]
                    {
                        wire.max_tokens = Some(request.max_tokens);
                    }
                }
                MaxTokensField::MaxCompletionTokens => {
                    wire.max_completion_tokens = Some(request.max_tokens);
                }
            }
        }
        wire
    }

    /// The delay before retry number `retry` (0-based) when the server named none.
    fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.min(16));
        let delay = self
            .options
            .backoff_base
            .saturating_mul(factor)
            .min(self.options.backoff_cap);
        // Spread concurrent sessions that hit the same limit: 75 % to 125 % of the delay.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|elapsed| elapsed.subsec_nanos())
            .unwrap_or(0);
        let spread = 0.75 + f64::from(nanos % 1000) / 2000.0;
        delay.mul_f64(spread).min(self.options.backoff_cap)
    }

    /// One HTTP attempt: send, check the status, read the stream.
    async fn attempt(
        &self,
        body: &[u8],
        deltas: &mpsc::Sender<String>,
    ) -> Result<ChatResponse, Failure> {
        let mut builder = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body.to_vec());
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key.expose());
        }
        let response = builder.send().await.map_err(|err| Failure::Retry {
            error: LlmError::Unavailable(self.redact(&transport_error(err, &self.options))),
            retry_after: None,
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_failure(response).await);
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if is_json {
            let text = read_capped(response, MAX_ERROR_BODY).await;
            let message = error_message(&text);
            if is_context_overflow(&message) {
                return Err(Failure::Final(LlmError::ContextOverflow(
                    self.redact(&message),
                )));
            }
            return Err(Failure::Final(LlmError::BadResponse(self.redact(
                &format!(
                    "the endpoint answered a JSON document instead of an event stream: {message}"
                ),
            ))));
        }
        self.read_stream(response, deltas).await
    }

    /// Turns a non-2xx answer into a retryable or final failure.
    async fn status_failure(&self, response: reqwest::Response) -> Failure {
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let text = read_capped(response, MAX_ERROR_BODY).await;
        let message = error_message(&text);
        let detail = self.redact(&format!("HTTP {}: {message}", status.as_u16()));
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Failure::Final(LlmError::Unauthorized(detail));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Failure::Retry {
                error: LlmError::RateLimited(detail),
                retry_after,
            };
        }
        if is_context_overflow(&message) {
            return Failure::Final(LlmError::ContextOverflow(detail));
        }
        if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
            return Failure::Retry {
                error: LlmError::Unavailable(detail),
                retry_after,
            };
        }
        Failure::Final(LlmError::BadResponse(detail))
    }

    /// Reads the event stream to its end, forwarding text as it arrives.
    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        deltas: &mpsc::Sender<String>,
    ) -> Result<ChatResponse, Failure> {
        let mut parser = SseParser::default();
        let mut answer = Accumulator::default();
        let mut received_any = false;
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(err) => {
                    let timed_out = err.is_timeout();
                    let text = self.redact(&transport_error(err, &self.options));
                    if !received_any {
                        return Err(Failure::Retry {
                            error: LlmError::Unavailable(text),
                            retry_after: None,
                        });
                    }
                    if answer.finish_reason.is_some() {
                        // Everything but the trailing usage chunk arrived; the answer stands.
                        break;
                    }
                    let error = if timed_out {
                        LlmError::Unavailable(text)
                    } else {
                        LlmError::BadResponse(format!("the stream broke off: {text}"))
                    };
                    return Err(Failure::Final(error));
                }
            };
            received_any |= !chunk.is_empty();
            let events = parser.push(&chunk).map_err(|why| {
                Failure::Final(LlmError::BadResponse(format!(
                    "malformed event stream: {why}"
                )))
            })?;
            for event in events {
                match answer.apply(&event).map_err(|err| {
                    Failure::Final(match err {
                        LlmError::BadResponse(text) => LlmError::BadResponse(self.redact(&text)),
                        LlmError::ContextOverflow(text) => {
                            LlmError::ContextOverflow(self.redact(&text))
                        }
                        other => other,
                    })
                })? {
                    Step::Text(text) => {
                        // A dropped receiver only means nobody watches; the answer still counts.
                        let _ = deltas.send(text).await;
                    }
                    Step::Continue => {}
                    Step::Done => return answer.finish().map_err(Failure::Final),
                }
            }
        }
        if answer.finish_reason.is_some() {
            return answer.finish().map_err(Failure::Final);
        }
        Err(Failure::Final(LlmError::BadResponse(
            "the stream ended before the model finished (no [DONE] and no finish_reason)".into(),
        )))
    }

    /// `text` with the API key blanked out, should a server ever echo it.
    fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if text.contains(key.expose()) => text.replace(key.expose(), "[redacted]"),
            _ => text.to_string(),
        }
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<String>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let wire = self.wire_request(&request);
        let body = serde_json::to_vec(&wire)
            .map_err(|err| LlmError::BadResponse(format!("cannot encode the request: {err}")))?;
        tracing::debug!(
            model = %wire.model,
            messages = wire.messages.len(),
            tools = request.tools.len(),
            "model call"
        );
        let mut retry = 0;
        loop {
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
                outcome = self.attempt(&body, &deltas) => outcome,
            };
            let (error, retry_after) = match outcome {
                Ok(answer) => return Ok(answer),
                Err(Failure::Final(error)) => return Err(error),
                Err(Failure::Retry { error, retry_after }) => (error, retry_after),
            };
            if retry >= self.options.max_retries {
                tracing::warn!(attempts = retry + 1, error = %error, "model call failed");
                return Err(error);
            }
            let delay = match retry_after {
                Some(wait) => wait.min(self.options.retry_after_cap),
                None => self.backoff(retry),
            };
            tracing::warn!(
                retry = retry + 1,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                error = %error,
                "model call failed; retrying"
            );
            retry += 1;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// How one attempt failed.
enum Failure {
    /// Worth another attempt; `error` is the answer once the retries are spent.
    Retry {
        error: LlmError,
        retry_after: Option<Duration>,
    },
    /// No retry can help.
    Final(LlmError),
}

/// `…/chat/completions` under `base_url` (which may already name it).
fn chat_completions_url(base_url: &str) -> Result<Url, LlmError> {
    let mut url = Url::parse(base_url).map_err(|err| {
        LlmError::Unavailable(format!("the configured base_url is not a valid URL: {err}"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(LlmError::Unavailable(
            "the configured base_url must be an http:// or https:// URL".into(),
        ));
    }
    if url
        .path()
        .trim_end_matches('/')
        .ends_with("/chat/completions")
    {
        return Ok(url);
    }
    url.path_segments_mut()
        .map_err(|()| LlmError::Unavailable("the configured base_url cannot have a path".into()))?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

/// One conversation message in wire form.
fn wire_message(message: &ChatMessage) -> ChatCompletionRequestMessage {
    match message {
        ChatMessage::System { content } => {
            ChatCompletionRequestMessage::System(ChatCompletionRequestSystemMessage {
                content: ChatCompletionRequestSystemMessageContent::Text(content.clone()),
                name: None,
            })
        }
        ChatMessage::User { content } => {
            ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage {
                content: ChatCompletionRequestUserMessageContent::Text(content.clone()),
                name: None,
            })
        }
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            let calls = tool_calls
                .iter()
                .map(|call| {
                    ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                        id: call.id.clone(),
                        function: FunctionCall {
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        },
                    })
                })
                .collect::<Vec<_>>();
            // Some servers refuse an assistant message with neither text nor calls.
            let content = match content {
                Some(text) => Some(text.clone()),
                None if calls.is_empty() => Some(String::new()),
                None => None,
            };
            ChatCompletionRequestMessage::Assistant(ChatCompletionRequestAssistantMessage {
                content: content.map(ChatCompletionRequestAssistantMessageContent::Text),
                tool_calls: (!calls.is_empty()).then_some(calls),
                ..Default::default()
            })
        }
        ChatMessage::Tool {
            tool_call_id,
            content,
        } => ChatCompletionRequestMessage::Tool(ChatCompletionRequestToolMessage {
            content: ChatCompletionRequestToolMessageContent::Text(content.clone()),
            tool_call_id: tool_call_id.clone(),
        }),
    }
}

/// One tool in wire form: a function tool whose parameters are the tool's input schema.
fn wire_tool(spec: &ToolSpec) -> ChatCompletionTools {
    ChatCompletionTools::Function(async_openai::types::chat::ChatCompletionTool {
        function: FunctionObject {
            name: spec.name.clone(),
            description: (!spec.description.is_empty()).then(|| spec.description.clone()),
            parameters: Some(spec.input_schema.clone()),
            strict: None,
        },
    })
}

/// `Retry-After` in seconds (integer or decimal); HTTP dates are ignored in favour of backoff.
fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = value.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(86_400.0)))
}

/// Up to `limit` bytes of a body as text; a broken body reads as what arrived.
async fn read_capped(mut response: reqwest::Response, limit: usize) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(limit);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The human part of an error body: the OpenAI error object when there is one, else the text.
fn error_message(body: &str) -> String {
    let parsed = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|mut value| {
            let error = value.get_mut("error")?;
            // Several servers send `code` (and `param`) as numbers; the type wants strings.
            if let Some(object) = error.as_object_mut() {
                for field in ["code", "param", "type"] {
                    if let Some(slot) = object.get_mut(field)
                        && !slot.is_string()
                        && !slot.is_null()
                    {
                        *slot = Value::String(slot.to_string());
                    }
                }
            }
            if error.is_string() {
                // {"error": "text"} (Ollama and others).
                let text = error.as_str().unwrap_or_default().to_string();
                *error = serde_json::json!({ "message": text });
            }
            serde_json::from_value::<WrappedError>(value).ok()
        })
        .map(|wrapped| wrapped.error.to_string());
    let message = parsed.unwrap_or_else(|| body.trim().to_string());
    let message = if message.is_empty() {
        "(empty body)".to_string()
    } else {
        message
    };
    truncate(&message, MAX_ERROR_MESSAGE)
}

/// Whether an error message says the conversation does not fit the context window.
fn is_context_overflow(message: &str) -> bool {
    let lower = message.to_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context_length",
        "maximum context",
        "context window",
        "context size",
        "exceed_context_size",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// `text` cut to at most `limit` bytes on a character boundary.
fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A transport error and its causes on one line, without the URL.
fn transport_error(err: reqwest::Error, options: &OpenAiOptions) -> String {
    let err = err.without_url();
    if err.is_timeout() {
        return format!(
            "the request timed out (limits: {} s to connect, {} s in total)",
            options.connect_timeout.as_secs_f64(),
            options.request_timeout.as_secs_f64()
        );
    }
    let mut text = err.to_string();
    let mut current = std::error::Error::source(&err);
    while let Some(cause) = current {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        current = cause.source();
    }
    text
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SseEvent {
    /// The `event:` field; empty for the default `message`.
    event: String,
    /// The `data:` lines joined by `\n`.
    data: String,
}

/// An incremental parser for `text/event-stream`. Lines end in `\n` or `\r\n` (a lone `\r`, which
/// no chat completions server sends, is not treated as a line end).
#[derive(Debug, Default)]
struct SseParser {
    pending: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.pending.extend_from_slice(bytes);
        let pending = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = pending[start..].iter().position(|&byte| byte == b'\n') {
            let end = start + offset;
            let raw = pending[start..end]
                .strip_suffix(b"\r")
                .unwrap_or(&pending[start..end]);
            let line = std::str::from_utf8(raw).map_err(|_| "a line is not UTF-8".to_string())?;
            self.line(line, &mut events);
            start = end + 1;
        }
        self.pending = pending[start..].to_vec();
        if self.pending.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(format!("an event exceeds {MAX_EVENT_BYTES} bytes"));
        }
        Ok(events)
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                events.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event.clear();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            _ => {}
        }
    }
}

/// What one event meant for the caller.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Text to forward.
    Text(String),
    /// Nothing to forward.
    Continue,
    /// `[DONE]`.
    Done,
}

/// A tool call whose fragments are still arriving.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The answer being assembled from chunks.
#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    calls: BTreeMap<u32, PartialCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
}

impl Accumulator {
    /// Applies one event.
    fn apply(&mut self, event: &SseEvent) -> Result<Step, LlmError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Step::Done);
        }
        if data.is_empty() || event.event == "ping" || event.event == "keepalive" {
            return Ok(Step::Continue);
        }
        let mut value: Value = serde_json::from_str(data).map_err(|err| {
            LlmError::BadResponse(format!(
                "malformed chunk ({err}): {}",
                truncate(data, MAX_ERROR_MESSAGE)
            ))
        })?;
        if value.get("error").is_some() || event.event == "error" {
            let message = error_message(data);
            return Err(if is_context_overflow(&message) {
                LlmError::ContextOverflow(message)
            } else {
                LlmError::BadResponse(format!("the model failed mid-stream: {message}"))
            });
        }
        let finish_reasons = normalise_chunk(&mut value);
        let chunk: CreateChatCompletionStreamResponse =
            serde_json::from_value(value).map_err(|err| {
                LlmError::BadResponse(format!(
                    "malformed chunk ({err}): {}",
                    truncate(data, MAX_ERROR_MESSAGE)
                ))
            })?;
        if let Some(usage) = &chunk.usage {
            self.usage = Some(Usage {
                prompt_tokens: u64::from(usage.prompt_tokens),
                completion_tokens: u64::from(usage.completion_tokens),
            });
        }
        if let Some(reason) = finish_reasons.into_iter().flatten().next() {
            self.finish_reason = Some(reason);
        }
        let mut text = String::new();
        // One completion is asked for (n = 1); other choices would be another answer.
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            let delta = choice.delta;
            if let Some(content) = delta.content {
                text.push_str(&content);
            }
            if let Some(refusal) = delta.refusal {
                text.push_str(&refusal);
            }
            for fragment in delta.tool_calls.unwrap_or_default() {
                let call = self.calls.entry(fragment.index).or_default();
                if let Some(id) = fragment.id.filter(|id| !id.is_empty())
                    && call.id.is_empty()
                {
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name.filter(|name| !name.is_empty())
                        && call.name.is_empty()
                    {
                        call.name = name;
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
        }
        if text.is_empty() {
            return Ok(Step::Continue);
        }
        self.text.push_str(&text);
        Ok(Step::Text(text))
    }

    /// The finished answer.
    fn finish(&mut self) -> Result<ChatResponse, LlmError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in std::mem::take(&mut self.calls) {
            if call.name.is_empty() {
                return Err(LlmError::BadResponse(format!(
                    "tool call {index} arrived without a name"
                )));
            }
            let id = if call.id.is_empty() {
                // The tool message must answer some id; a few servers never send one.
                format!("call_{index}_{}", uuid::Uuid::new_v4().simple())
            } else {
                call.id
            };
            tool_calls.push(ToolCall {
                id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        Ok(ChatResponse {
            text: std::mem::take(&mut self.text),
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason.clone(),
        })
    }
}

/// Bends a chunk from a not-quite-OpenAI server into the shape the async-openai type accepts,
/// and takes out each choice's `finish_reason` as raw text (servers send values outside
/// OpenAI's enum, such as `eos` or `abort`).
fn normalise_chunk(value: &mut Value) -> Vec<Option<String>> {
    let Some(object) = value.as_object_mut() else {
        return Vec::new();
    };
    object
        .entry("id")
        .or_insert_with(|| Value::String(String::new()));
    object
        .entry("object")
        .or_insert_with(|| Value::String("chat.completion.chunk".into()));
    if !object.get("created").is_some_and(Value::is_u64) {
        object.insert("created".into(), Value::from(0));
    }
    object
        .entry("model")
        .or_insert_with(|| Value::String(String::new()));
    // Unused here, and servers invent values the enum does not know.
    object.remove("service_tier");
    if !object.get("choices").is_some_and(Value::is_array) {
        object.insert("choices".into(), Value::Array(Vec::new()));
    }
    if let Some(usage) = object.get_mut("usage").and_then(Value::as_object_mut) {
        let prompt = usage
            .get("prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let completion = usage
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        usage.insert("prompt_tokens".into(), Value::from(prompt));
        usage.insert("completion_tokens".into(), Value::from(completion));
        usage
            .entry("total_tokens")
            .or_insert_with(|| Value::from(prompt + completion));
    }
    let mut reasons = Vec::new();
    if let Some(choices) = object.get_mut("choices").and_then(Value::as_array_mut) {
        for (position, choice) in choices.iter_mut().enumerate() {
            let Some(choice) = choice.as_object_mut() else {
                reasons.push(None);
                continue;
            };
            choice
                .entry("index")
                .or_insert_with(|| Value::from(position));
            if !choice.get("delta").is_some_and(Value::is_object) {
                choice.insert("delta".into(), Value::Object(Default::default()));
            }
            if let Some(calls) = choice
                .get_mut("delta")
                .and_then(|delta| delta.get_mut("tool_calls"))
                .and_then(Value::as_array_mut)
            {
                for (position, call) in calls.iter_mut().enumerate() {
                    if let Some(call) = call.as_object_mut() {
                        call.entry("index").or_insert_with(|| Value::from(position));
                    }
                }
            }
            let is_first = choice.get("index").and_then(Value::as_u64) == Some(0);
            let reason = choice
                .remove("finish_reason")
                .and_then(|reason| reason.as_str().map(str::to_string));
            reasons.push(reason.filter(|_| is_first));
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(base_url: &str) -> LlmConfig {
        LlmConfig {
            base_url: Some(base_url.to_string()),
            model: Some("m".into()),
            ..LlmConfig::default()
        }
    }

    fn event(data: &str) -> SseEvent {
        SseEvent {
            event: String::new(),
            data: data.to_string(),
        }
    }

    #[test]
    fn sse_parser_splits_events_across_arbitrary_chunk_boundaries() {
        let stream = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: ping\ndata: x\n\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        for size in 1..stream.len() {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            for piece in stream.chunks(size) {
                events.extend(parser.push(piece).unwrap());
            }
            assert_eq!(
                events,
                vec![
                    event("{\"a\":1}"),
                    SseEvent {
                        event: "ping".into(),
                        data: "x".into()
                    },
                    event("l1\nl2"),
                    event("[DONE]"),
                ],
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn sse_parser_keeps_multibyte_characters_split_between_chunks() {
        let stream = "data: {\"t\":\"héllo ✓\"}\n\n".as_bytes();
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for byte in stream {
            events.extend(parser.push(std::slice::from_ref(byte)).unwrap());
        }
        assert_eq!(events, vec![event("{\"t\":\"héllo ✓\"}")]);
    }

    #[test]
    fn sse_parser_refuses_invalid_utf8() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: \xff\xfe\n\n").is_err());
    }

    #[test]
    fn accumulator_joins_interleaved_tool_call_fragments_by_index() {
        let mut answer = Accumulator::default();
        let chunks = [
            json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"two","arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"one","arguments":"{\"x\""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}),
        ];
        for chunk in chunks {
            assert_eq!(
                answer.apply(&event(&chunk.to_string())).unwrap(),
                Step::Continue
            );
        }
        assert_eq!(answer.apply(&event("[DONE]")).unwrap(), Step::Done);
        let response = answer.finish().unwrap();
        assert_eq!(
            response.tool_calls,
            vec![
                ToolCall {
                    id: "a".into(),
                    name: "one".into(),
                    arguments: "{\"x\":1}".into()
                },
                ToolCall {
                    id: "b".into(),
                    name: "two".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            response.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
    }

    #[test]
    fn accumulator_accepts_unknown_finish_reasons_and_missing_fields() {
        let mut answer = Accumulator::default();
        let step = answer
            .apply(&event(
                r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":"eos"}],"service_tier":"odd"}"#,
            ))
            .unwrap();
        assert_eq!(step, Step::Text("hi".into()));
        let response = answer.finish().unwrap();
        assert_eq!(response.text, "hi");
        assert_eq!(response.finish_reason.as_deref(), Some("eos"));
    }

    #[test]
    fn accumulator_gives_missing_tool_call_ids_a_fresh_one_and_refuses_nameless_calls() {
        let mut answer = Accumulator::default();
        answer
            .apply(&event(
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"x","arguments":"{}"}}]}}]}"#,
            ))
            .unwrap();
        let response = answer.finish().unwrap();
        assert!(response.tool_calls[0].id.starts_with("call_0_"));

        let mut nameless = Accumulator::default();
        nameless
            .apply(&event(
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"arguments":"{}"}}]}}]}"#,
            ))
            .unwrap();
        assert!(matches!(nameless.finish(), Err(LlmError::BadResponse(_))));
    }

    #[test]
    fn accumulator_maps_errors_and_garbage() {
        let mut answer = Accumulator::default();
        assert!(matches!(
            answer.apply(&event("{not json")),
            Err(LlmError::BadResponse(_))
        ));
        assert!(matches!(
            answer.apply(&event(r#"{"choices":"nope"}"#)),
            Ok(Step::Continue)
        ));
        assert!(matches!(
            answer.apply(&event(r#"{"choices":[{"index":0,"delta":{"content":5}}]}"#)),
            Err(LlmError::BadResponse(_))
        ));
        assert!(matches!(
            answer.apply(&event(
                r#"{"error":{"message":"maximum context length is 8192 tokens","code":400}}"#
            )),
            Err(LlmError::ContextOverflow(_))
        ));
        assert!(matches!(
            answer.apply(&event(r#"{"error":"boom"}"#)),
            Err(LlmError::BadResponse(text)) if text.contains("boom")
        ));
    }

    #[test]
    fn error_messages_come_from_openai_error_objects_or_raw_text() {
        assert_eq!(
            error_message(
                r#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#
            ),
            "invalid_request_error: too long (code: context_length_exceeded)"
        );
        assert_eq!(
            error_message(r#"{"error":{"message":"bad","code":400}}"#),
            "bad (code: 400)"
        );
        assert_eq!(error_message("plain failure\n"), "plain failure");
        assert_eq!(error_message(""), "(empty body)");
        assert!(error_message(&"x".repeat(5000)).len() < 1100);
    }

    #[test]
    fn context_overflow_is_recognised_in_the_usual_wordings() {
        for message in [
            "invalid_request_error: ... (code: context_length_exceeded)",
            "This model's maximum context length is 4096 tokens. However, you requested 5000",
            "the request exceeds the available context size, try increasing it",
            "Input is longer than the context window",
        ] {
            assert!(is_context_overflow(message), "{message}");
        }
        assert!(!is_context_overflow("invalid tool schema"));
    }

    #[test]
    fn retry_after_is_read_in_seconds_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse_retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("0"));
        assert_eq!(parse_retry_after(&headers), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static(" 1.5 "));
        assert_eq!(
            parse_retry_after(&headers),
            Some(Duration::from_millis(1500))
        );
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(parse_retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-3"));
        assert_eq!(parse_retry_after(&headers), None);
    }

    #[test]
    fn endpoint_is_derived_from_the_base_url() {
        for (base, expected) in [
            (
                "https://api.openai.com/v1",
                "https://api.openai.com/v1/chat/completions",
            ),
            (
                "http://127.0.0.1:8000/v1/",
                "http://127.0.0.1:8000/v1/chat/completions",
            ),
            (
                "http://h/v1/chat/completions",
                "http://h/v1/chat/completions",
            ),
        ] {
            let provider = OpenAiProvider::new(&config(base)).unwrap();
            assert_eq!(provider.endpoint().as_str(), expected);
        }
        assert!(matches!(
            OpenAiProvider::new(&LlmConfig::default()),
            Err(LlmError::Unavailable(_))
        ));
        assert!(OpenAiProvider::new(&config("not a url")).is_err());
        assert!(OpenAiProvider::new(&config("ftp://h/v1")).is_err());
    }

    #[test]
    fn backoff_doubles_and_stays_under_the_cap() {
        let provider = OpenAiProvider::new(&config("http://h/v1")).unwrap();
        for retry in 0..40 {
            let delay = provider.backoff(retry);
            let nominal = Duration::from_millis(500)
                .saturating_mul(2u32.saturating_pow(retry.min(16)))
                .min(Duration::from_secs(8));
            assert!(delay >= nominal.mul_f64(0.74), "retry {retry}: {delay:?}");
            assert!(delay <= Duration::from_secs(8), "retry {retry}: {delay:?}");
        }
    }

    #[test]
    fn wire_request_maps_roles_tools_and_limits() {
        let provider = OpenAiProvider::new(&config("http://h/v1")).unwrap();
        let request = ChatRequest {
            model: String::new(),
            messages: vec![
                ChatMessage::System {
                    content: "sys".into(),
                },
                ChatMessage::User {
                    content: "hi".into(),
                },
                ChatMessage::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: "{\"path\":\"a\"}".into(),
                    }],
                },
                ChatMessage::Tool {
                    tool_call_id: "c1".into(),
                    content: "text".into(),
                },
                ChatMessage::Assistant {
                    content: None,
                    tool_calls: vec![],
                },
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Reads".into(),
                input_schema: json!({"type":"object"}),
            }]
            .into(),
            max_tokens: 64,
        };
        let wire = serde_json::to_value(provider.wire_request(&request)).unwrap();
        assert_eq!(wire["model"], "m");
        assert_eq!(wire["stream"], true);
        assert_eq!(wire["stream_options"], json!({"include_usage": true}));
        assert_eq!(wire["max_tokens"], 64);
        assert!(wire.get("max_completion_tokens").is_none());
        assert_eq!(wire["tool_choice"], "auto");
        assert_eq!(
            wire["tools"],
            json!([{"type":"function","function":{"name":"read_file","description":"Reads","parameters":{"type":"object"}}}])
        );
        assert_eq!(
            wire["messages"],
            json!([
                {"role":"system","content":"sys"},
                {"role":"user","content":"hi"},
                {"role":"assistant","tool_calls":[{"type":"function","id":"c1","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]},
                {"role":"tool","content":"text","tool_call_id":"c1"},
                {"role":"assistant","content":""},
            ])
        );

        let other = OpenAiProvider::with_options(
            &config("http://h/v1"),
            OpenAiOptions {
                max_tokens_field: MaxTokensField::MaxCompletionTokens,
                ..OpenAiOptions::default()
            },
        )
        .unwrap();
        let bare = ChatRequest {
            model: "x".into(),
            messages: vec![],
            tools: Vec::new().into(),
            max_tokens: 10,
        };
        let wire = serde_json::to_value(other.wire_request(&bare)).unwrap();
        assert_eq!(wire["max_completion_tokens"], 10);
        assert!(wire.get("max_tokens").is_none());
        assert!(wire.get("tools").is_none());
        assert!(wire.get("tool_choice").is_none());
        assert_eq!(wire["model"], "x");
    }

    #[test]
    fn debug_redacts_the_key_and_redact_blanks_echoes() {
        let mut settings = config("http://user:pw@h/v1");
        settings.api_key = Some(Secret::new("sk-very-secret"));
        let provider = OpenAiProvider::new(&settings).unwrap();
        let shown = format!("{provider:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("[redacted]"));
        assert_eq!(
            provider.redact("bad key sk-very-secret"),
            "bad key [redacted]"
        );
    }
}
