//! The wire format: our conversation turned into async-openai's request types, and what comes
//! back (stream chunks, error bodies) bent into shapes those types and [`LlmError`] accept.
//!
//! [`LlmError`]: crate::llm::LlmError

use async_openai::error::WrappedError;
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestMessageContentPartImage,
    ChatCompletionRequestMessageContentPartText, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, ChatCompletionRequestUserMessageContentPart,
    ChatCompletionStreamOptions, ChatCompletionToolChoiceOption, ChatCompletionTools,
    CreateChatCompletionRequest, FunctionCall, FunctionObject, ImageUrl, ToolChoiceOptions,
};
use serde_json::Value;

use super::MaxTokensField;
use crate::llm::ToolSpec;
use crate::llm::{ChatMessage, ChatRequest, ProviderKind};

/// How much of an error message ends up in [`LlmError`](crate::llm::LlmError).
pub(crate) const MAX_ERROR_MESSAGE: usize = 1000;

/// The request body: `wire` as JSON, with each assistant message's chat-completions reasoning
/// put back as `reasoning_content` and the request's `reasoning_effort`, which the request
/// types have no field for. A server in thinking mode
/// (DeepSeek's) refuses a tool-call turn whose reasoning is not sent back; servers that do not
/// think never see the field, as no message of theirs has reasoning.
pub(super) fn request_body(
    request: &ChatRequest,
    wire: &CreateChatCompletionRequest,
) -> Result<Vec<u8>, serde_json::Error> {
    let reasoned = request
        .messages
        .iter()
        .enumerate()
        .filter_map(|(index, m)| match m {
            ChatMessage::Assistant {
                reasoning: Some(reasoning),
                ..
            } if reasoning.kind == ProviderKind::OpenAiChat => Some((index, &reasoning.text)),
            _ => None,
        });
    let mut reasoned = reasoned.peekable();
    if reasoned.peek().is_none() && request.reasoning_effort.is_none() {
        return serde_json::to_vec(wire);
    }
    let mut body = serde_json::to_value(wire)?;
    if let (Some(effort), Some(object)) = (&request.reasoning_effort, body.as_object_mut()) {
        object.insert("reasoning_effort".into(), Value::String(effort.clone()));
    }
    if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
        for (index, reasoning) in reasoned {
            if let Some(Value::Object(message)) = messages.get_mut(index) {
                message.insert("reasoning_content".into(), Value::String(reasoning.clone()));
            }
        }
    }
    serde_json::to_vec(&body)
}

/// The wire request for `request`: streamed with usage, tools offered with `auto` choice, the
/// token cap in `max_tokens_field`, and `default_model` when the request names none.
pub(super) fn chat_request(
    request: &ChatRequest,
    default_model: Option<&str>,
    max_tokens_field: MaxTokensField,
) -> CreateChatCompletionRequest {
    let model = if request.model.is_empty() {
        default_model.map(str::to_string).unwrap_or_default()
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
        match max_tokens_field {
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

/// One conversation message in wire form.
fn wire_message(message: &ChatMessage) -> ChatCompletionRequestMessage {
    match message {
        ChatMessage::System { content } => {
            ChatCompletionRequestMessage::System(ChatCompletionRequestSystemMessage {
                content: ChatCompletionRequestSystemMessageContent::Text(content.clone()),
                name: None,
            })
        }
        ChatMessage::User { content, images } if images.is_empty() => {
            ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage {
                content: ChatCompletionRequestUserMessageContent::Text(content.clone()),
                name: None,
            })
        }
        ChatMessage::User { content, images } => {
            let mut parts = vec![ChatCompletionRequestUserMessageContentPart::Text(
                ChatCompletionRequestMessageContentPartText {
                    text: content.clone(),
                    prompt_cache_breakpoint: None,
                },
            )];
            parts.extend(images.iter().map(|image| {
                ChatCompletionRequestUserMessageContentPart::ImageUrl(
                    ChatCompletionRequestMessageContentPartImage {
                        image_url: ImageUrl {
                            url: image.data_url(),
                            detail: None,
                        },
                        prompt_cache_breakpoint: None,
                    },
                )
            }));
            ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage {
                content: ChatCompletionRequestUserMessageContent::Array(parts),
                name: None,
            })
        }
        ChatMessage::Assistant {
            content,
            tool_calls,
            ..
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
            parameters: Some(Value::clone(&spec.input_schema)),
            strict: None,
        },
    })
}

/// The human part of an error body: the OpenAI error object when there is one, else the text.
pub(crate) fn error_message(body: &str) -> String {
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
pub(crate) fn is_context_overflow(message: &str) -> bool {
    let lower = message.to_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context_length",
        "maximum context",
        "context window",
        "context size",
        "exceed_context_size",
        "prompt is too long",
        "input is too long",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// `text` cut to at most `limit` bytes on a character boundary.
pub(crate) fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The prompt tokens a usage object says came from the provider's prompt cache: OpenAI's and
/// vLLM's `prompt_tokens_details.cached_tokens`, DeepSeek's `prompt_cache_hit_tokens`, or a
/// bare `cached_tokens` (Moonshot); 0 when it says nothing.
fn cached_prompt_tokens(usage: &serde_json::Map<String, Value>) -> u64 {
    usage
        .get("prompt_tokens_details")
        .and_then(|details| details.get("cached_tokens"))
        .or_else(|| usage.get("prompt_cache_hit_tokens"))
        .or_else(|| usage.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Bends a chunk from a not-quite-OpenAI server into the shape the async-openai type accepts,
/// and takes out each choice's `finish_reason` as raw text (servers send values outside
/// OpenAI's enum, such as `eos` or `abort`).
pub(crate) fn normalise_chunk(value: &mut Value) -> Vec<Option<String>> {
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
        // Cached prompt tokens under OpenAI's name, whichever name the server used.
        let cached = cached_prompt_tokens(usage);
        let details = usage
            .entry("prompt_tokens_details")
            .or_insert_with(|| Value::Object(Default::default()));
        if !details.is_object() {
            *details = Value::Object(Default::default());
        }
        if let Some(details) = details.as_object_mut() {
            details.retain(|_, value| value.is_u64());
            details.insert("cached_tokens".into(), Value::from(cached));
        }
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
}
