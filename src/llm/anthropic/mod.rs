//! The provider for Anthropic's Messages API (`POST {base_url}/messages`, such as
//! `https://api.anthropic.com/v1/messages`), streamed.
//!
//! The key goes in `x-api-key` (never `Authorization`), with `anthropic-version: 2023-06-01`.
//! The body is built as JSON values (`wire`):
//!
//! ```json
//! {
//!   "model": "…", "max_tokens": 4096, "stream": true,
//!   "thinking": {"type": "enabled", "budget_tokens": 4096},
//!   "system": [{"type": "text", "text": "…", "cache_control": {"type": "ephemeral"}}],
//!   "tools": [{"name": "…", "description": "…", "input_schema": {…}}],
//!   "messages": [
//!     {"role": "user", "content": [{"type": "text", "text": "…"}]},
//!     {"role": "assistant", "content": [
//!       {"type": "thinking", "thinking": "…", "signature": "…"},
//!       {"type": "text", "text": "…"},
//!       {"type": "tool_use", "id": "…", "name": "…", "input": {…}}]},
//!     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "…", "content": "…"}]}
//!   ]
//! }
//! ```
//!
//! - `max_tokens` is the request's cap, 4096 when it names none (Anthropic requires one).
//! - `system` holds every system message as a text block, in order.
//! - `messages` alternate user and assistant as Anthropic requires: tool results are
//!   `tool_result` blocks of a user message, consecutive messages of one role merge into one
//!   (a user message's tool results first), empty or blank text is left out, a message left
//!   with nothing is dropped, and a conversation opening with the model's message gets a short
//!   user message before it. A tool call's arguments go as its `input` object, `{}` when they
//!   are not one.
//! - An assistant message's reasoning is sent only when it came from Anthropic: its
//!   `thinking` / `redacted_thinking` blocks, exactly as they came (signatures included), open
//!   the message. Reasoning from other APIs is never sent.
//! - `reasoning_effort` turns extended thinking on with a token budget: `low` 1024, `medium`
//!   4096, `high` 16384, any other word 4096. The budget must stay below `max_tokens`, which is
//!   raised to budget + 1024 when it would not.
//! - `tool_choice` is left out (the model chooses).
//! - Prompt caching: `cache_control: {"type": "ephemeral"}` on the last tool, the last system
//!   block, the last block of the newest message and that of the user message before it (the
//!   previous request's newest) — four breakpoints at most, Anthropic's limit; thinking blocks
//!   never carry one.
//!
//! - `wire`: the request body.
//! - `stream`: reading the event stream into one answer.

mod stream;
mod wire;

use async_trait::async_trait;
use reqwest::Url;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::stream::MessageStream;
use super::openai::{Endpoint, OpenAiOptions};
use super::transport::{Auth, Transport, endpoint_url};
use super::{ChatRequest, ChatResponse, Delta, LlmError, Provider};

/// The API version every request names; the stream format read here is this version's.
const API_VERSION: &str = "2023-06-01";

/// A [`Provider`] for Anthropic's `/messages` endpoint.
pub struct AnthropicProvider {
    transport: Transport,
    default_model: Option<String>,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
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

impl AnthropicProvider {
    /// A provider for the configured endpoint with default timeouts and retries.
    pub fn new(endpoint: impl Into<Endpoint>) -> Result<Self, LlmError> {
        Self::with_options(endpoint, OpenAiOptions::default())
    }

    /// A provider for the configured endpoint with explicit timeouts and retries (the
    /// token-cap field choice does not apply: Anthropic has one).
    pub fn with_options(
        endpoint: impl Into<Endpoint>,
        options: OpenAiOptions,
    ) -> Result<Self, LlmError> {
        let config: Endpoint = endpoint.into();
        let url = endpoint_url(config.base_url()?, &["messages"])?;
        Ok(Self {
            transport: Transport::new(
                url,
                config.api_key.clone(),
                Auth::Header("x-api-key"),
                &[("anthropic-version", API_VERSION)],
                options,
            )?,
            default_model: config.model.clone().filter(|model| !model.is_empty()),
        })
    }

    /// The URL requests go to (`…/messages`).
    pub fn endpoint(&self) -> &Url {
        self.transport.url()
    }

    /// The options in force.
    pub fn options(&self) -> &OpenAiOptions {
        self.transport.options()
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<Delta>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let body = wire::request_body(&request, self.default_model.as_deref());
        let model = body["model"].as_str().unwrap_or_default().to_string();
        tracing::debug!(
            model = %model,
            messages = body["messages"].as_array().map_or(0, Vec::len),
            tools = request.tools.len(),
            thinking = request.reasoning_effort.is_some(),
            "model call"
        );
        let body = serde_json::to_vec(&body)
            .map_err(|err| LlmError::BadResponse(format!("cannot encode the request: {err}")))?;
        self.transport
            .stream::<MessageStream>(&body, &model, &deltas, &cancel)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn config(base_url: &str) -> Endpoint {
        Endpoint {
            base_url: Some(base_url.to_string()),
            model: Some("claude-test".into()),
            ..Endpoint::default()
        }
    }

    #[test]
    fn endpoint_is_derived_from_the_base_url() {
        for (base, expected) in [
            (
                "https://api.anthropic.com/v1",
                "https://api.anthropic.com/v1/messages",
            ),
            ("http://127.0.0.1:9/v1/", "http://127.0.0.1:9/v1/messages"),
            ("http://h/v1/messages", "http://h/v1/messages"),
        ] {
            let provider = AnthropicProvider::new(config(base)).unwrap();
            assert_eq!(provider.endpoint().as_str(), expected);
        }
        assert!(matches!(
            AnthropicProvider::new(Endpoint::default()),
            Err(LlmError::Unavailable(_))
        ));
        assert!(AnthropicProvider::new(config("ftp://h/v1")).is_err());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let mut settings = config("https://user:pw@api.anthropic.com/v1");
        settings.api_key = Some(Secret::new("sk-ant-very-secret"));
        let provider = AnthropicProvider::new(settings).unwrap();
        let shown = format!("{provider:?}");
        assert!(!shown.contains("sk-ant-very-secret"), "{shown}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
        assert!(shown.contains("claude-test"), "{shown}");
    }
}
