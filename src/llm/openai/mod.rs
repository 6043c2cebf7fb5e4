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
//!
//! - `wire`: request and response wire types and the conversions to and from them.
//! - `sse`: the `text/event-stream` parser.
//! - `stream`: assembling the streamed deltas and tool-call fragments into one answer.
//!
//! [`CreateChatCompletionStreamResponse`]: async_openai::types::chat::CreateChatCompletionStreamResponse
//! [`WrappedError`]: async_openai::error::WrappedError

pub mod sse;
mod stream;
mod wire;

use std::time::{Duration, SystemTime};

use async_openai::types::chat::CreateChatCompletionRequest;
use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::sse::SseParser;
use self::stream::{Accumulator, Step};
use self::wire::{error_message, is_context_overflow};
use super::{ChatRequest, ChatResponse, LlmError, Provider};
use crate::secret::Secret;

/// How much of an error body is read; the rest is not worth the wait.
const MAX_ERROR_BODY: usize = 64 * 1024;

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
                    .map(|_| crate::secret::REDACTED)
                    .unwrap_or("none"),
            )
            .field("default_model", &self.default_model)
            .field("options", &self.options)
            .finish()
    }
}

/// Where the provider sends requests and as whom: what it needs of `[llm]`.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    /// Chat completions base URL, such as `https://api.openai.com/v1`.
    pub base_url: Option<String>,
    /// The model used when a request names none.
    pub model: Option<String>,
    /// The bearer key, when the endpoint needs one.
    pub api_key: Option<Secret>,
}

impl OpenAiProvider {
    /// A provider for the configured endpoint with default timeouts and retries.
    pub fn new(endpoint: impl Into<Endpoint>) -> Result<Self, LlmError> {
        Self::with_options(endpoint, OpenAiOptions::default())
    }

    /// A provider for the configured endpoint with explicit timeouts, retries and wire choices.
    pub fn with_options(
        endpoint: impl Into<Endpoint>,
        options: OpenAiOptions,
    ) -> Result<Self, LlmError> {
        let config: Endpoint = endpoint.into();
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
        wire::chat_request(
            request,
            self.default_model.as_deref(),
            self.options.max_tokens_field,
        )
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
        let sent = std::time::Instant::now();
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
            // A refused or unresolvable connection is an operator's to fix: name where to.
            error: LlmError::Unavailable(self.redact(&format!(
                "{}: {}",
                self.shown_endpoint(),
                transport_error(err, &self.options)
            ))),
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
        self.read_stream(response, deltas, sent).await
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
        sent: std::time::Instant,
    ) -> Result<ChatResponse, Failure> {
        let mut parser = SseParser::default();
        let mut answer = Accumulator::default();
        let mut received_any = false;
        let mut first_token = None;
        fn finish(
            answer: &mut Accumulator,
            first_token: Option<std::time::Duration>,
        ) -> Result<ChatResponse, Failure> {
            let mut done = answer.finish().map_err(Failure::Final)?;
            done.first_token = first_token;
            Ok(done)
        }
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
                    if answer.saw_finish_reason() {
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
                let step = answer.apply(&event).map_err(|err| {
                    Failure::Final(match err {
                        LlmError::BadResponse(text) => LlmError::BadResponse(self.redact(&text)),
                        LlmError::ContextOverflow(text) => {
                            LlmError::ContextOverflow(self.redact(&text))
                        }
                        other => other,
                    })
                })?;
                if first_token.is_none() && answer.has_output() {
                    first_token = Some(sent.elapsed());
                }
                match step {
                    Step::Text(text) => {
                        // A dropped receiver only means nobody watches; the answer still counts.
                        let _ = deltas.send(text).await;
                    }
                    Step::Continue => {}
                    Step::Done => return finish(&mut answer, first_token),
                }
            }
        }
        if answer.saw_finish_reason() {
            return finish(&mut answer, first_token);
        }
        Err(Failure::Final(LlmError::BadResponse(
            "the stream ended before the model finished (no [DONE] and no finish_reason)".into(),
        )))
    }

    /// The endpoint as logs may show it: without a password the base URL may carry.
    fn shown_endpoint(&self) -> String {
        let mut endpoint = self.endpoint.clone();
        let _ = endpoint.set_password(None);
        endpoint.to_string()
    }

    /// `text` with the API key blanked out, should a server ever echo it.
    fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if text.contains(key.expose()) => {
                text.replace(key.expose(), crate::secret::REDACTED)
            }
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
        let body = wire::request_body(&request, &wire)
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
                Err(Failure::Final(error)) => {
                    tracing::warn!(
                        url = %self.shown_endpoint(),
                        model = %wire.model,
                        kind = error.kind(),
                        error = %error,
                        "model call failed"
                    );
                    return Err(error);
                }
                Err(Failure::Retry { error, retry_after }) => (error, retry_after),
            };
            if retry >= self.options.max_retries {
                tracing::warn!(
                    url = %self.shown_endpoint(),
                    model = %wire.model,
                    kind = error.kind(),
                    attempts = retry + 1,
                    error = %error,
                    "model call failed"
                );
                return Err(error);
            }
            let delay = match retry_after {
                Some(wait) => wait.min(self.options.retry_after_cap),
                None => self.backoff(retry),
            };
            tracing::warn!(
                url = %self.shown_endpoint(),
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

/// `Retry-After` in seconds (integer or decimal) or as an HTTP date (a date passed means now);
/// at most a day.
fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    const DAY: Duration = Duration::from_secs(86_400);
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::from_secs_f64(seconds.min(DAY.as_secs_f64())));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let wait = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(wait.min(DAY))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolSpec;
    use crate::llm::{ChatMessage, ToolCall};
    use serde_json::json;

    fn config(base_url: &str) -> Endpoint {
        Endpoint {
            base_url: Some(base_url.to_string()),
            model: Some("m".into()),
            ..Endpoint::default()
        }
    }

    #[test]
    fn retry_after_is_read_in_seconds_or_as_a_date() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse_retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("0"));
        assert_eq!(parse_retry_after(&headers), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static(" 1.5 "));
        assert_eq!(
            parse_retry_after(&headers),
            Some(Duration::from_millis(1500))
        );
        // A date gone by: retry now.
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(parse_retry_after(&headers), Some(Duration::ZERO));
        // Two minutes from now, to the second the date can say.
        let later =
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        let wait = parse_retry_after(&headers).expect("a date is read");
        assert!(
            (Duration::from_secs(118)..=Duration::from_secs(120)).contains(&wait),
            "{wait:?}"
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
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
            let provider = OpenAiProvider::new(config(base)).unwrap();
            assert_eq!(provider.endpoint().as_str(), expected);
        }
        assert!(matches!(
            OpenAiProvider::new(Endpoint::default()),
            Err(LlmError::Unavailable(_))
        ));
        assert!(OpenAiProvider::new(config("not a url")).is_err());
        assert!(OpenAiProvider::new(config("ftp://h/v1")).is_err());
    }

    #[test]
    fn backoff_doubles_and_stays_under_the_cap() {
        let provider = OpenAiProvider::new(config("http://h/v1")).unwrap();
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
        let provider = OpenAiProvider::new(config("http://h/v1")).unwrap();
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
                    reasoning: None,
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
                    reasoning: None,
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
            config("http://h/v1"),
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
        let provider = OpenAiProvider::new(settings.clone()).unwrap();
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
