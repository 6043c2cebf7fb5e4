//! Reading Anthropic's event stream into one answer: content blocks by index (text, thinking
//! with its signature, redacted thinking, tool calls with their input in JSON fragments),
//! usage from `message_start` and `message_delta`, and the stop reason.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::llm::openai::sse::SseEvent;
use crate::llm::openai::wire::{MAX_ERROR_MESSAGE, error_message, is_context_overflow, truncate};
use crate::llm::transport::{Decoder, Step};
use crate::llm::{ChatResponse, Delta, LlmError, ProviderKind, Reasoning, ToolCall, Usage};

/// One content block as it streams in.
#[derive(Debug)]
enum Block {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// The `input` of `content_block_start`, for a call whose input never streams.
        input: Value,
        /// The `partial_json` fragments joined.
        arguments: String,
    },
    /// A block this adapter does not use (server tools, citations, …); its deltas are ignored.
    Other,
}

/// The answer being assembled from events.
#[derive(Debug, Default)]
pub(super) struct MessageStream {
    blocks: BTreeMap<u64, Block>,
    input_tokens: u64,
    cache_read_tokens: u64,
    cache_creation_tokens: u64,
    output_tokens: u64,
    /// Whether any event carried usage.
    saw_usage: bool,
    stop_reason: Option<String>,
    /// The model `message_start` named.
    model: Option<String>,
}

/// A field of an event as text, empty when missing.
fn text_field(value: &Value, field: &str) -> String {
    value
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn malformed(what: &str, data: &str) -> LlmError {
    LlmError::BadResponse(format!(
        "malformed event ({what}): {}",
        truncate(data, MAX_ERROR_MESSAGE)
    ))
}

/// An `error` event as the failure it reports.
fn stream_error(value: &Value, data: &str) -> LlmError {
    let message = error_message(data);
    match value.pointer("/error/type").and_then(Value::as_str) {
        Some("overloaded_error" | "api_error") => {
            LlmError::Unavailable(format!("the model failed mid-stream: {message}"))
        }
        Some("rate_limit_error") => LlmError::RateLimited(message),
        _ if is_context_overflow(&message) => LlmError::ContextOverflow(message),
        _ => LlmError::BadResponse(format!("the model failed mid-stream: {message}")),
    }
}

impl MessageStream {
    /// Takes what a usage object holds; later events repeat counts cumulatively, so each
    /// value replaces the one before.
    fn read_usage(&mut self, usage: Option<&Value>) {
        let Some(usage) = usage.filter(|usage| usage.is_object()) else {
            return;
        };
        self.saw_usage = true;
        for (field, slot) in [
            ("input_tokens", &mut self.input_tokens),
            ("cache_read_input_tokens", &mut self.cache_read_tokens),
            (
                "cache_creation_input_tokens",
                &mut self.cache_creation_tokens,
            ),
            ("output_tokens", &mut self.output_tokens),
        ] {
            if let Some(count) = usage.get(field).and_then(Value::as_u64) {
                *slot = count;
            }
        }
    }

    fn start_block(&mut self, value: &Value, data: &str) -> Result<Step, LlmError> {
        let index = value
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("a block without an index", data))?;
        let start = value
            .get("content_block")
            .ok_or_else(|| malformed("a block start without its block", data))?;
        let mut emit = Vec::new();
        let block = match start.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = text_field(start, "text");
                if !text.is_empty() {
                    emit.push(Delta::Text(text.clone()));
                }
                Block::Text(text)
            }
            Some("thinking") => {
                let thinking = text_field(start, "thinking");
                if !thinking.is_empty() {
                    emit.push(Delta::Reasoning(thinking.clone()));
                }
                Block::Thinking {
                    thinking,
                    signature: text_field(start, "signature"),
                }
            }
            Some("redacted_thinking") => Block::RedactedThinking {
                data: text_field(start, "data"),
            },
            Some("tool_use") => Block::ToolUse {
                id: text_field(start, "id"),
                name: text_field(start, "name"),
                input: start.get("input").cloned().unwrap_or(Value::Null),
                arguments: String::new(),
            },
            _ => Block::Other,
        };
        self.blocks.insert(index, block);
        Ok(if emit.is_empty() {
            Step::Continue
        } else {
            Step::Emit(emit)
        })
    }

    fn apply_delta(&mut self, value: &Value, data: &str) -> Result<Step, LlmError> {
        let index = value
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("a delta without an index", data))?;
        let delta = value
            .get("delta")
            .ok_or_else(|| malformed("a delta event without its delta", data))?;
        let kind = delta
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let block = self
            .blocks
            .get_mut(&index)
            .ok_or_else(|| malformed("a delta for a block that never started", data))?;
        let emitted = match (kind, block) {
            ("text_delta", Block::Text(text)) => {
                let piece = text_field(delta, "text");
                text.push_str(&piece);
                Delta::Text(piece)
            }
            ("thinking_delta", Block::Thinking { thinking, .. }) => {
                let piece = text_field(delta, "thinking");
                thinking.push_str(&piece);
                Delta::Reasoning(piece)
            }
            ("signature_delta", Block::Thinking { signature, .. }) => {
                // One delta in practice, just before the block stops; appended like any delta.
                signature.push_str(&text_field(delta, "signature"));
                return Ok(Step::Continue);
            }
            ("input_json_delta", Block::ToolUse { arguments, .. }) => {
                arguments.push_str(&text_field(delta, "partial_json"));
                return Ok(Step::Continue);
            }
            (_, Block::Other) => return Ok(Step::Continue),
            ("text_delta" | "thinking_delta" | "signature_delta" | "input_json_delta", _) => {
                return Err(malformed("a delta of another kind than its block", data));
            }
            // Newer delta kinds (citations, …) carry nothing this adapter keeps.
            _ => return Ok(Step::Continue),
        };
        Ok(match emitted {
            Delta::Text(piece) | Delta::Reasoning(piece) if piece.is_empty() => Step::Continue,
            delta => Step::Emit(vec![delta]),
        })
    }
}

impl Decoder for MessageStream {
    const MISSING_END: &'static str = "no message_stop and no stop_reason";

    fn apply(&mut self, event: &SseEvent) -> Result<Step, LlmError> {
        let data = event.data.trim();
        if data.is_empty() || event.event == "ping" {
            return Ok(Step::Continue);
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|err| malformed(&format!("not JSON: {err}"), data))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        if kind == "error" || event.event == "error" {
            return Err(stream_error(&value, data));
        }
        match kind {
            "message_start" => {
                self.read_usage(value.pointer("/message/usage"));
                self.model = value
                    .pointer("/message/model")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                Ok(Step::Continue)
            }
            "content_block_start" => self.start_block(&value, data),
            "content_block_delta" => self.apply_delta(&value, data),
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                self.read_usage(value.get("usage"));
                Ok(Step::Continue)
            }
            "message_stop" => Ok(Step::Done),
            // content_block_stop, ping and event kinds added after this was written.
            _ => Ok(Step::Continue),
        }
    }

    fn has_output(&self) -> bool {
        self.blocks.values().any(|block| match block {
            Block::Text(text) => !text.is_empty(),
            Block::Thinking { thinking, .. } => !thinking.is_empty(),
            Block::RedactedThinking { .. } | Block::ToolUse { .. } => true,
            Block::Other => false,
        })
    }

    /// Whether `message_delta` said why the model stopped: only usage may follow.
    fn saw_end(&self) -> bool {
        self.stop_reason.is_some()
    }

    fn finish(&mut self) -> Result<ChatResponse, LlmError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        let mut thinking_text = String::new();
        let mut items = Vec::new();
        for (index, block) in std::mem::take(&mut self.blocks) {
            match block {
                Block::Text(piece) => text.push_str(&piece),
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    thinking_text.push_str(&thinking);
                    items.push(
                        json!({"type": "thinking", "thinking": thinking, "signature": signature}),
                    );
                }
                Block::RedactedThinking { data } => {
                    items.push(json!({"type": "redacted_thinking", "data": data}));
                }
                Block::ToolUse {
                    id,
                    name,
                    input,
                    arguments,
                } => {
                    if name.is_empty() {
                        return Err(LlmError::BadResponse(format!(
                            "tool call {index} arrived without a name"
                        )));
                    }
                    let id = if id.is_empty() {
                        // The tool result must answer some id.
                        format!("toolu_{index}_{}", uuid::Uuid::new_v4().simple())
                    } else {
                        id
                    };
                    let arguments = if !arguments.is_empty() {
                        arguments
                    } else if input.as_object().is_some_and(|input| !input.is_empty()) {
                        input.to_string()
                    } else {
                        "{}".to_string()
                    };
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                Block::Other => {}
            }
        }
        let reasoning = (!items.is_empty()).then_some(Reasoning {
            kind: ProviderKind::Anthropic,
            text: thinking_text,
            items,
        });
        let usage = self.saw_usage.then_some(Usage {
            // Anthropic counts cached and cache-written prompt tokens apart from input_tokens.
            prompt_tokens: self.input_tokens + self.cache_read_tokens + self.cache_creation_tokens,
            completion_tokens: self.output_tokens,
            cached_tokens: self.cache_read_tokens,
            cache_write_tokens: self.cache_creation_tokens,
        });
        let finish_reason = self.stop_reason.as_deref().map(|reason| {
            match reason {
                "end_turn" => "stop",
                "tool_use" => "tool_calls",
                "max_tokens" => "length",
                other => other,
            }
            .to_string()
        });
        Ok(ChatResponse {
            text,
            tool_calls,
            reasoning,
            usage,
            finish_reason,
            first_token: None,
            model: self.model.take(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::openai::sse::SseParser;

    /// A stream written after Anthropic's documented example of extended thinking with tool
    /// use: thinking with its signature, text, then a tool call whose input arrives in pieces.
    const THINK_THEN_CALL: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":2}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        "\n\n",
        "event: ping\n",
        r#"data: {"type": "ping"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I need the weather, "}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"so I call the tool."}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me check "}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"the weather."}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":1}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ncisco, CA\"}"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":2}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );

    fn events(stream: &str) -> Vec<SseEvent> {
        SseParser::default().push(stream.as_bytes()).unwrap()
    }

    fn event(name: &str, data: Value) -> SseEvent {
        SseEvent {
            event: name.into(),
            data: data.to_string(),
        }
    }

    #[test]
    fn a_documented_stream_becomes_thinking_text_and_a_tool_call() {
        let mut answer = MessageStream::default();
        let mut emitted = Vec::new();
        let mut done = false;
        for event in events(THINK_THEN_CALL) {
            assert!(!done, "nothing is read after message_stop");
            match answer.apply(&event).unwrap() {
                Step::Emit(deltas) => emitted.extend(deltas),
                Step::Continue => {}
                Step::Done => done = true,
            }
        }
        assert!(done);
        assert!(answer.saw_end());
        assert!(answer.has_output());
        assert_eq!(
            emitted,
            vec![
                Delta::Reasoning("I need the weather, ".into()),
                Delta::Reasoning("so I call the tool.".into()),
                Delta::Text("Let me check ".into()),
                Delta::Text("the weather.".into()),
            ]
        );
        let response = answer.finish().unwrap();
        assert_eq!(response.text, "Let me check the weather.");
        assert_eq!(response.model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(
            response.tool_calls,
            vec![ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "get_weather".into(),
                arguments: r#"{"location": "San Francisco, CA"}"#.into(),
            }]
        );
        assert_eq!(
            response.reasoning,
            Some(Reasoning {
                kind: ProviderKind::Anthropic,
                text: "I need the weather, so I call the tool.".into(),
                items: vec![json!({
                    "type": "thinking",
                    "thinking": "I need the weather, so I call the tool.",
                    "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h",
                })],
            })
        );
        assert_eq!(
            response.usage,
            Some(Usage {
                prompt_tokens: 472 + 2000 + 100,
                completion_tokens: 89,
                cached_tokens: 2000,
                cache_write_tokens: 100,
            })
        );
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn redacted_thinking_and_silent_tool_calls_come_back_whole() {
        let mut answer = MessageStream::default();
        for (name, data) in [
            (
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3p"}}),
            ),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"list","input":{}}}),
            ),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t2","name":"read","input":{"path":"a"}}}),
            ),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":3,"content_block":{"type":"server_tool_use","id":"s","name":"web_search"}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{}"}}),
            ),
            (
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}),
            ),
        ] {
            assert_eq!(answer.apply(&event(name, data)).unwrap(), Step::Continue);
        }
        let response = answer.finish().unwrap();
        assert_eq!(
            response.reasoning,
            Some(Reasoning {
                kind: ProviderKind::Anthropic,
                text: String::new(),
                items: vec![json!({"type":"redacted_thinking","data":"EmwKAhgBEgy3va3p"})],
            })
        );
        let arguments: Vec<&str> = response
            .tool_calls
            .iter()
            .map(|call| call.arguments.as_str())
            .collect();
        assert_eq!(arguments, ["{}", r#"{"path":"a"}"#]);
        assert_eq!(response.finish_reason.as_deref(), Some("stop"));
        assert_eq!(
            response.usage,
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: 3,
                cached_tokens: 0,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn plain_text_has_no_reasoning_and_stop_reasons_map() {
        for (reason, mapped) in [
            ("end_turn", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("pause_turn", "pause_turn"),
        ] {
            let mut answer = MessageStream::default();
            answer
                .apply(&event(
                    "content_block_start",
                    json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                ))
                .unwrap();
            assert!(!answer.has_output());
            let step = answer
                .apply(&event(
                    "content_block_delta",
                    json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}),
                ))
                .unwrap();
            assert_eq!(step, Step::Emit(vec![Delta::Text("hi".into())]));
            assert!(!answer.saw_end());
            answer
                .apply(&event(
                    "message_delta",
                    json!({"type":"message_delta","delta":{"stop_reason":reason}}),
                ))
                .unwrap();
            assert!(answer.saw_end());
            let response = answer.finish().unwrap();
            assert_eq!(response.text, "hi");
            assert_eq!(response.reasoning, None);
            assert_eq!(response.usage, None);
            assert_eq!(response.finish_reason.as_deref(), Some(mapped));
        }
    }

    #[test]
    fn error_events_and_broken_events_fail() {
        let error = |kind: &str, message: &str| {
            MessageStream::default().apply(&event(
                "error",
                json!({"type":"error","error":{"type":kind,"message":message}}),
            ))
        };
        assert!(matches!(
            error("overloaded_error", "Overloaded"),
            Err(LlmError::Unavailable(text)) if text.contains("Overloaded")
        ));
        assert!(matches!(
            error(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum"
            ),
            Err(LlmError::ContextOverflow(_))
        ));
        assert!(matches!(
            error("invalid_request_error", "bad tool"),
            Err(LlmError::BadResponse(text)) if text.contains("bad tool")
        ));

        let mut answer = MessageStream::default();
        assert!(matches!(
            answer.apply(&SseEvent {
                event: "content_block_delta".into(),
                data: "{nope".into()
            }),
            Err(LlmError::BadResponse(_))
        ));
        assert!(matches!(
            answer.apply(&event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":5,"delta":{"type":"text_delta","text":"x"}}),
            )),
            Err(LlmError::BadResponse(_))
        ));
        answer
            .apply(&event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":""}}),
            ))
            .unwrap();
        assert!(matches!(
            answer.apply(&event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}),
            )),
            Err(LlmError::BadResponse(_))
        ));
        assert!(matches!(answer.finish(), Err(LlmError::BadResponse(_))));
    }

    #[test]
    fn anthropic_error_bodies_read_as_their_message() {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let message = error_message(body);
        assert_eq!(
            message,
            "invalid_request_error: prompt is too long: 210000 tokens > 200000 maximum"
        );
        assert!(is_context_overflow(&message));
    }
}
