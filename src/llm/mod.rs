//! Talking to models: the [`Provider`] trait the agent loop depends on, the conversation types,
//! and typed failures.
//!
//! - [`openai`]: the implementation for any OpenAI-compatible chat completions endpoint.
//! - [`responses`]: OpenAI's Responses API.
//! - [`anthropic`]: Anthropic's Messages API.
//! - [`router`]: several providers behind one, by model id.
//! - `transport`: the streamed POST with retries every adapter shares.
//! - [`pricing`]: USD per token by model.
//! - [`metered`]: the provider wrapper that times every model call into the metrics.

pub mod anthropic;
pub mod catalog;
pub mod metered;
pub mod openai;
pub mod pricing;
pub mod responses;
pub mod router;
pub(crate) mod transport;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use serde_json::Value;

use crate::error_kind::ErrorKind;

/// What the model is shown about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name; the API.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// JSON Schema of its arguments, shared with the tool's own: every session's list of
    /// specs, and every model request's, holds the schema without copying it.
    pub input_schema: Arc<Value>,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call; the tool message answering it carries the same id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments exactly as the model wrote them (JSON text, possibly malformed).
    pub arguments: String,
}

/// One message of the model-facing conversation; also what the store keeps as history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// Instructions for the model.
    System {
        /// The text.
        content: String,
    },
    /// What the user said.
    User {
        /// The text.
        content: String,
        /// Images given with it, after the text.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageData>,
    },
    /// What the model answered: text, tool calls, or both.
    Assistant {
        /// The text, when there is any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The tool calls, in the model's order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// What the model reasoned before answering, tagged with the API it came from; sent
        /// back with the message to that API only (DeepSeek's thinking mode refuses a
        /// tool-call turn without it; Anthropic and the Responses API need their signed or
        /// encrypted items back as they came).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "Reasoning::deserialize_stored"
        )]
        reasoning: Option<Reasoning>,
    },
    /// The result of one tool call.
    Tool {
        /// The call it answers.
        tool_call_id: String,
        /// The text the model sees.
        content: String,
    },
}

impl ChatMessage {
    /// A user message of text alone.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
            images: Vec::new(),
        }
    }
}

/// An image given to the model: its media type and its bytes, base64-encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageData {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub mime: String,
    /// The bytes, standard base64 with padding.
    pub data: String,
}

#[cfg(test)]
/// A 1×1 PNG, for tests.
pub(crate) const PIXEL_PNG: &[u8] = &[
    0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n', 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 0,
    0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f, 0x15, 0xc4, 0x89, 0, 0, 0, 13, b'I', b'D', b'A', b'T',
    0x78, 0x9c, 0x63, 0, 1, 0, 0, 5, 0, 1, 0x0d, 0x0a, 0x2d, 0xb4, 0, 0, 0, 0, b'I', b'E', b'N',
    b'D', 0xae, 0x42, 0x60, 0x82,
];

/// Why bytes are not an image a model can be shown.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Over [`ImageData::MAX_BYTES`] (its size, when known before decoding).
    #[error("{}", match bytes {
        Some(bytes) => format!("the image is {bytes} bytes, over the limit of {} bytes", ImageData::MAX_BYTES),
        None => format!("the image is over the limit of {} bytes", ImageData::MAX_BYTES),
    })]
    TooLarge {
        /// Its size.
        bytes: Option<usize>,
    },
    /// Its first bytes are none of the types taken.
    #[error("not a PNG, JPEG, GIF or WebP image (by its first bytes)")]
    NotAnImage,
    /// A media type the APIs do not take.
    #[error("mime {0:?} is not one of {list}", list = ImageData::MIME_TYPES.join(", "))]
    UnknownMime(String),
    /// The inline data does not decode.
    #[error("data is not standard base64: {0}")]
    NotBase64(base64::DecodeError),
    /// The data is an image of another type than the one stated.
    #[error("data is a {found} image, not {stated}")]
    OtherType {
        /// What the bytes are.
        found: String,
        /// What the caller said.
        stated: String,
    },
}

impl ImageData {
    /// The media types every API that takes images accepts.
    pub const MIME_TYPES: [&'static str; 4] =
        ["image/png", "image/jpeg", "image/gif", "image/webp"];
    /// Tokens an image is counted as in prompt estimates: about what the APIs charge for one
    /// of about a megapixel (they scale images down to about that size).
    pub const ESTIMATED_TOKENS: u64 = 1600;

    /// The largest image taken, decoded: Anthropic's limit per image, and well under the
    /// OpenAI APIs'.
    pub const MAX_BYTES: usize = 5 * 1024 * 1024;

    /// An image from a file's bytes; refused when it is too large or not a PNG, JPEG, GIF or
    /// WebP image.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ImageError> {
        use base64::Engine as _;
        if bytes.len() > Self::MAX_BYTES {
            return Err(ImageError::TooLarge {
                bytes: Some(bytes.len()),
            });
        }
        let mime = Self::sniff_mime(bytes).ok_or(ImageError::NotAnImage)?;
        Ok(Self {
            mime: mime.to_string(),
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        })
    }

    /// An image sent inline as base64; refused unless `mime` is one the APIs take, `data`
    /// decodes, fits [`ImageData::MAX_BYTES`] and really is an image of that type.
    pub fn from_base64(mime: &str, data: &str) -> Result<Self, ImageError> {
        use base64::Engine as _;
        if !Self::MIME_TYPES.contains(&mime) {
            return Err(ImageError::UnknownMime(mime.to_string()));
        }
        // Checked before decoding, so an oversized image costs no allocation.
        if data.len() / 4 * 3 > Self::MAX_BYTES + 2 {
            return Err(ImageError::TooLarge { bytes: None });
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(ImageError::NotBase64)?;
        let image = Self::from_bytes(&bytes)?;
        if image.mime != mime {
            return Err(ImageError::OtherType {
                found: image.mime,
                stated: mime.to_string(),
            });
        }
        Ok(image)
    }

    /// The image as a `data:` URL, the form the OpenAI APIs take.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime, self.data)
    }

    /// The media type of an image file from its first bytes; `None` for anything else.
    pub fn sniff_mime(bytes: &[u8]) -> Option<&'static str> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some("image/png")
        } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
            Some("image/jpeg")
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some("image/gif")
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some("image/webp")
        } else {
            None
        }
    }
}

/// The wire API a provider speaks; reasoning is only ever sent back to the kind it came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProviderKind {
    /// OpenAI-compatible `/chat/completions` (OpenAI, DeepSeek, vLLM, Ollama, OpenRouter, …).
    #[default]
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    /// OpenAI's `/responses`.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic's `/v1/messages`.
    #[serde(rename = "anthropic")]
    Anthropic,
}

impl ProviderKind {
    /// The name in the config file and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAiChat => "openai-chat",
            Self::OpenAiResponses => "openai-responses",
            Self::Anthropic => "anthropic",
        }
    }
}

/// What a model reasoned before one answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reasoning {
    /// The API it came from.
    pub kind: ProviderKind,
    /// The text people may read: the reasoning itself (`reasoning_content`, thinking blocks)
    /// or its summary (the Responses API); may be empty.
    #[serde(default)]
    pub text: String,
    /// The provider's own items, to send back exactly as they came: Anthropic's `thinking` /
    /// `redacted_thinking` blocks with their signatures, the Responses API's `reasoning`
    /// items with their `encrypted_content`. Empty for chat completions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Value>,
}

impl Reasoning {
    /// Reasoning a chat-completions server streamed as text.
    pub fn chat(text: impl Into<String>) -> Self {
        Self {
            kind: ProviderKind::OpenAiChat,
            text: text.into(),
            items: Vec::new(),
        }
    }

    /// Reads what the store holds: this struct, or the bare text history kept before the
    /// kind was recorded (which only chat completions wrote).
    fn deserialize_stored<'de, D>(deserializer: D) -> Result<Option<Self>, D::Error>
    where
        D: serde::Deserializer<'de>,
    {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Text(String),
            Typed(Reasoning),
        }
        Ok(match Option::<Stored>::deserialize(deserializer)? {
            None => None,
            Some(Stored::Text(text)) => Some(Self::chat(text)),
            Some(Stored::Typed(reasoning)) => Some(reasoning),
        })
    }
}

/// One piece of a streamed answer, as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Answer text.
    Text(String),
    /// Reasoning text (or its summary), shown to people as `reasoning/delta`.
    Reasoning(String),
}

/// Tokens one model call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Of the prompt tokens, those the provider served from its prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Of the prompt tokens, those the provider wrote to its prompt cache (Anthropic bills
    /// them apart).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// The tokens the metrics count.
    pub fn counts(&self) -> crate::metrics::TokenCounts {
        crate::metrics::TokenCounts {
            prompt: self.prompt_tokens,
            completion: self.completion_tokens,
            cached: self.cached_tokens,
        }
    }
}

/// One request to the model.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The model id.
    pub model: String,
    /// The whole conversation so far.
    pub messages: Vec<ChatMessage>,
    /// The tools the model may call (already filtered by policy), in a stable order.
    pub tools: Arc<[ToolSpec]>,
    /// Completion token cap.
    pub max_tokens: u32,
    /// How hard a reasoning model should think (`low`, `medium`, `high`, …), when asked.
    pub reasoning_effort: Option<String>,
}

/// What one streamed model call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    /// The whole text, the concatenation of every delta.
    pub text: String,
    /// Tool calls, their fragments joined by index, in index order.
    pub tool_calls: Vec<ToolCall>,
    /// The reasoning streamed beside the answer, when the server sent any (for chat
    /// completions: when the field was there at all, even empty).
    pub reasoning: Option<Reasoning>,
    /// Token usage from the final chunk; `None` when the server sent none.
    pub usage: Option<Usage>,
    /// Why the model stopped (`stop`, `tool_calls`, `length`, …), when it said.
    pub finish_reason: Option<String>,
    /// How long after the answering attempt was sent its first text or tool-call fragment
    /// came; `None` when nothing streamed.
    pub first_token: Option<std::time::Duration>,
    /// The model that answered, as the server named it (it may differ from the one asked
    /// for: a dated snapshot, a gateway's route), when it said.
    pub model: Option<String>,
}

/// Why a model call failed; `kind()` is the `turn/error` code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// The endpoint could not be reached or kept failing (connection errors, 5xx, timeouts)
    /// after the retries.
    #[error("the model is unavailable: {0}")]
    Unavailable(String),
    /// The endpoint kept answering 429 after the retries.
    #[error("the model is rate limited: {0}")]
    RateLimited(String),
    /// The endpoint answered something that is not a valid completion stream (including a
    /// stream cut off before it finished).
    #[error("the model answered badly: {0}")]
    BadResponse(String),
    /// The conversation no longer fits the model's context window.
    #[error("the conversation is too long for the model: {0}")]
    ContextOverflow(String),
    /// The endpoint refused the credentials (401/403).
    #[error("the model refused the credentials: {0}")]
    Unauthorized(String),
    /// The call was cancelled (turn interrupted).
    #[error("the model call was interrupted")]
    Cancelled,
}

impl LlmError {
    /// The code clients see in `turn/error`.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unavailable(_) => ErrorKind::LlmUnavailable,
            Self::RateLimited(_) => ErrorKind::LlmRateLimited,
            Self::BadResponse(_) => ErrorKind::LlmBadResponse,
            Self::ContextOverflow(_) => ErrorKind::ContextOverflow,
            Self::Unauthorized(_) => ErrorKind::LlmUnauthorized,
            Self::Cancelled => ErrorKind::Interrupted,
        }
    }
}

/// A model the agent loop can call.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Streams one chat completion: every text and reasoning fragment goes to `deltas` as it
    /// arrives (the receiver may be dropped; streaming then continues silently), and the whole
    /// response is returned at the end. Stops with [`LlmError::Cancelled`] as soon as `cancel`
    /// fires.
    async fn stream_chat(
        &self,
        request: ChatRequest,
        deltas: mpsc::Sender<Delta>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError>;
}
