//! The provider for OpenAI-compatible chat completions endpoints (OpenAI, DeepSeek, vLLM,
//! llama.cpp, Ollama, LM Studio, OpenRouter, …).
//!
//! What goes over the wire is async-openai's types: the request is serialised from
//! [`CreateChatCompletionRequest`], every stream chunk is deserialised into
//! [`CreateChatCompletionStreamResponse`] and error bodies into [`WrappedError`]. The HTTP and SSE
//! layer is reqwest itself (`llm::transport`), because async-openai's client drops the
//! `Retry-After` header, cannot tell a stream that ended with `[DONE]` from one that was cut off,
//! and offers no way to retry only while nothing of the answer has been consumed yet.
//!
//! - `wire`: request and response wire types and the conversions to and from them.
//! - `sse`: the `text/event-stream` parser (every adapter's).
//! - `stream`: assembling the streamed deltas and tool-call fragments into one answer.
//!
//! [`CreateChatCompletionStreamResponse`]: async_openai::types::chat::CreateChatCompletionStreamResponse
//! [`WrappedError`]: async_openai::error::WrappedError

pub mod sse;
mod stream;
pub(crate) mod wire;

use std::time::Duration;

use async_openai::types::chat::CreateChatCompletionRequest;
use async_trait::async_trait;
use reqwest::Url;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::stream::Accumulator;
use super::transport::{Auth, Transport, endpoint_url};
use super::{ChatRequest, ChatResponse, Delta, LlmError, Provider};
use crate::secret::Secret;

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

/// Timeouts, retry policy and wire choices of a provider (every adapter's; the token-cap
/// field only matters to chat completions).
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
    transport: Transport,
    default_model: Option<String>,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.transport.shown_url())
            .field(
                "api_key",
                &if self.transport.has_key() {
                    crate::secret::REDACTED
                } else {
                    "none"
                },
            )
            .field("default_model", &self.default_model)
            .field("options", self.transport.options())
            .finish()
    }
}

/// Where a provider sends requests and as whom.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    /// The API's base URL, such as `https://api.openai.com/v1`.
    pub base_url: Option<String>,
    /// The model used when a request names none.
    pub model: Option<String>,
    /// The key, when the endpoint needs one.
    pub api_key: Option<Secret>,
}

impl Endpoint {
    /// The base URL, which must be set.
    pub(crate) fn base_url(&self) -> Result<&str, LlmError> {
        self.base_url
            .as_deref()
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .ok_or_else(|| {
                LlmError::Unavailable("no model endpoint is configured ([llm] base_url)".into())
            })
    }
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
        let url = endpoint_url(config.base_url()?, &["chat", "completions"])?;
        Ok(Self {
            transport: Transport::new(url, config.api_key.clone(), Auth::Bearer, &[], options)?,
            default_model: config.model.clone().filter(|model| !model.is_empty()),
        })
    }

    /// The URL requests go to (`…/chat/completions`).
    pub fn endpoint(&self) -> &Url {
        self.transport.url()
    }

    /// The options in force.
    pub fn options(&self) -> &OpenAiOptions {
        self.transport.options()
    }

    /// The wire request for `request`, as async-openai types.
    fn wire_request(&self, request: &ChatRequest) -> CreateChatCompletionRequest {
        wire::chat_request(
            request,
            self.default_model.as_deref(),
            self.transport.options().max_tokens_field,
        )
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<Delta>,
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
        self.transport
            .stream::<Accumulator>(&body, &wire.model, &deltas, &cancel)
            .await
    }
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
        use crate::llm::transport::parse_retry_after;
        use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
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
            let delay = provider.transport.backoff(retry);
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
                    images: Vec::new(),
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
                input_schema: json!({"type":"object"}).into(),
            }]
            .into(),
            max_tokens: 64,
            reasoning_effort: None,
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
            reasoning_effort: None,
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
            provider.transport.redact("bad key sk-very-secret"),
            "bad key [redacted]"
        );
    }
}
