//! The provider for OpenAI's Responses API (`POST {base_url}/responses`), streamed and
//! stateless.
//!
//! Nothing is stored on OpenAI's side (`store: false`), so every request carries the whole
//! conversation, and the model's reasoning comes back encrypted to be replayed with the
//! assistant message it led to. The body (built as `serde_json` values, since only a handful
//! of the API's fields are used):
//!
//! ```json
//! {
//!   "model": "…", "stream": true, "store": false,
//!   "include": ["reasoning.encrypted_content"],
//!   "instructions": "the system messages, joined by blank lines",
//!   "input": [
//!     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "…"}]},
//!     {"type": "reasoning", "id": "rs_…", "summary": […], "encrypted_content": "…"},
//!     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "…"}]},
//!     {"type": "function_call", "call_id": "…", "name": "…", "arguments": "…"},
//!     {"type": "function_call_output", "call_id": "…", "output": "…"}
//!   ],
//!   "tools": [{"type": "function", "name": "…", "description": "…", "parameters": {…}}],
//!   "tool_choice": "auto",
//!   "max_output_tokens": 4096,
//!   "reasoning": {"effort": "medium", "summary": "auto"}
//! }
//! ```
//!
//! `instructions`, `tools`/`tool_choice`, `max_output_tokens` and `reasoning` are left out when
//! there is nothing to say. An assistant message's reasoning items are sent exactly as they
//! came, before its text and calls, only when they came from this API and something follows
//! them (the API refuses a reasoning item without the output it led to).
//!
//! The answer streams as semantic events (`response.output_text.delta`,
//! `response.reasoning_summary_text.delta`, `response.function_call_arguments.delta`,
//! `response.output_item.done`, …) and ends with `response.completed` or
//! `response.incomplete`; `response.failed` and `error` are failures.
//!
//! - `wire`: the request body.
//! - `stream`: assembling the events into one answer.

mod stream;
mod wire;

use async_trait::async_trait;
use reqwest::Url;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::stream::ResponseStream;
use super::openai::{Endpoint, OpenAiOptions};
use super::transport::{Auth, Transport, endpoint_url};
use super::{ChatRequest, ChatResponse, Delta, LlmError, Provider};

/// A [`Provider`] for OpenAI's `/responses`.
pub struct ResponsesProvider {
    transport: Transport,
    default_model: Option<String>,
}

impl std::fmt::Debug for ResponsesProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponsesProvider")
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

impl ResponsesProvider {
    /// A provider for the configured endpoint with default timeouts and retries.
    pub fn new(endpoint: impl Into<Endpoint>) -> Result<Self, LlmError> {
        Self::with_options(endpoint, OpenAiOptions::default())
    }

    /// A provider for the configured endpoint with explicit timeouts and retries (the
    /// token-cap field choice does not apply: this API has only `max_output_tokens`).
    pub fn with_options(
        endpoint: impl Into<Endpoint>,
        options: OpenAiOptions,
    ) -> Result<Self, LlmError> {
        let config: Endpoint = endpoint.into();
        let url = endpoint_url(config.base_url()?, &["responses"])?;
        Ok(Self {
            transport: Transport::new(url, config.api_key.clone(), Auth::Bearer, &[], options)?,
            default_model: config.model.clone().filter(|model| !model.is_empty()),
        })
    }

    /// The URL requests go to (`…/responses`).
    pub fn endpoint(&self) -> &Url {
        self.transport.url()
    }
}

#[async_trait]
impl Provider for ResponsesProvider {
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<Delta>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let body = wire::request_body(&request, self.default_model.as_deref());
        let model = body["model"].as_str().unwrap_or_default().to_string();
        let bytes = serde_json::to_vec(&body)
            .map_err(|err| LlmError::BadResponse(format!("cannot encode the request: {err}")))?;
        tracing::debug!(
            model = %model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "model call"
        );
        self.transport
            .stream::<ResponseStream>(&bytes, &model, &deltas, &cancel)
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
            model: Some("gpt-5".into()),
            ..Endpoint::default()
        }
    }

    #[test]
    fn endpoint_is_derived_from_the_base_url() {
        for (base, expected) in [
            (
                "https://api.openai.com/v1",
                "https://api.openai.com/v1/responses",
            ),
            (
                "http://127.0.0.1:8000/v1/",
                "http://127.0.0.1:8000/v1/responses",
            ),
            ("http://h/v1/responses", "http://h/v1/responses"),
        ] {
            let provider = ResponsesProvider::new(config(base)).unwrap();
            assert_eq!(provider.endpoint().as_str(), expected);
        }
        assert!(matches!(
            ResponsesProvider::new(Endpoint::default()),
            Err(LlmError::Unavailable(_))
        ));
        assert!(ResponsesProvider::new(config("ftp://h/v1")).is_err());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let mut settings = config("http://user:pw@h/v1");
        settings.api_key = Some(Secret::new("sk-very-secret"));
        let shown = format!("{:?}", ResponsesProvider::new(settings).unwrap());
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
}
