//! Assembling one streamed answer: text deltas, tool-call fragments joined by index, usage and
//! the finish reason.

use std::collections::BTreeMap;

use async_openai::types::chat::CreateChatCompletionStreamResponse;
use serde_json::Value;

use super::sse::SseEvent;
use super::wire::{
    MAX_ERROR_MESSAGE, error_message, is_context_overflow, normalise_chunk, truncate,
};
use crate::llm::transport::{Decoder, Step};
use crate::llm::{ChatResponse, Delta, LlmError, Reasoning, ToolCall, Usage};

/// A tool call whose fragments are still arriving.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The answer being assembled from chunks.
#[derive(Debug, Default)]
pub(super) struct Accumulator {
    text: String,
    calls: BTreeMap<u32, PartialCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    /// The reasoning so far, once any chunk carried the field.
    reasoning: Option<String>,
    /// The model the first chunk named.
    model: Option<String>,
}

/// The reasoning text a chunk's first choice carries: `reasoning_content` (DeepSeek, vLLM and
/// Qwen's reasoning parsers) or `reasoning` (OpenRouter); `Some("")` for a field that is there
/// but empty, so a turn in thinking mode is known as one. A `null` field is none: servers that
/// never reason send that.
fn reasoning_delta(chunk: &Value) -> Option<String> {
    let delta = chunk
        .get("choices")?
        .as_array()?
        .iter()
        .find(|choice| choice.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)?
        .get("delta")?;
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|key| delta.get(*key).and_then(Value::as_str))
        .map(str::to_string)
}

impl Decoder for Accumulator {
    const MISSING_END: &'static str = "no [DONE] and no finish_reason";

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
        let reasoning = reasoning_delta(&value);
        let finish_reasons = normalise_chunk(&mut value);
        let chunk: CreateChatCompletionStreamResponse =
            serde_json::from_value(value).map_err(|err| {
                LlmError::BadResponse(format!(
                    "malformed chunk ({err}): {}",
                    truncate(data, MAX_ERROR_MESSAGE)
                ))
            })?;
        if self.model.is_none() && !chunk.model.is_empty() {
            self.model = Some(chunk.model.clone());
        }
        if let Some(usage) = &chunk.usage {
            self.usage = Some(Usage {
                prompt_tokens: u64::from(usage.prompt_tokens),
                completion_tokens: u64::from(usage.completion_tokens),
                cached_tokens: usage
                    .prompt_tokens_details
                    .as_ref()
                    .and_then(|details| details.cached_tokens)
                    .map_or(0, u64::from),
                cache_write_tokens: 0,
            });
        }
        if let Some(reason) = finish_reasons.into_iter().flatten().next() {
            self.finish_reason = Some(reason);
        }
        let mut emit = Vec::new();
        if let Some(reasoning) = reasoning {
            self.reasoning
                .get_or_insert_with(String::new)
                .push_str(&reasoning);
            if !reasoning.is_empty() {
                emit.push(Delta::Reasoning(reasoning));
            }
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
        if !text.is_empty() {
            self.text.push_str(&text);
            emit.push(Delta::Text(text));
        }
        Ok(if emit.is_empty() {
            Step::Continue
        } else {
            Step::Emit(emit)
        })
    }

    fn has_output(&self) -> bool {
        !self.text.is_empty()
            || !self.calls.is_empty()
            || self.reasoning.as_ref().is_some_and(|r| !r.is_empty())
    }

    /// Whether a choice carried a `finish_reason`: the model is done even if `[DONE]` never
    /// comes.
    fn saw_end(&self) -> bool {
        self.finish_reason.is_some()
    }

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
            reasoning: self.reasoning.take().map(Reasoning::chat),
            usage: self.usage,
            finish_reason: self.finish_reason.clone(),
            first_token: None,
            model: self.model.take(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(data: &str) -> SseEvent {
        SseEvent {
            event: String::new(),
            data: data.to_string(),
        }
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
                completion_tokens: 3,
                cached_tokens: 0,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn cached_prompt_tokens_are_read_under_each_providers_name() {
        let usages = [
            json!({"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":null}}),
            json!({"prompt_tokens":100,"completion_tokens":3,"prompt_cache_hit_tokens":64,"prompt_cache_miss_tokens":36}),
            json!({"prompt_tokens":100,"completion_tokens":3,"cached_tokens":64}),
            json!({"prompt_tokens":100,"completion_tokens":3}),
        ];
        for (usage, cached) in usages.into_iter().zip([64, 64, 64, 0]) {
            let mut answer = Accumulator::default();
            let chunk = json!({"choices":[], "usage": usage});
            answer.apply(&event(&chunk.to_string())).unwrap();
            answer.apply(&event("[DONE]")).unwrap();
            let usage = answer.finish().unwrap().usage.unwrap();
            assert_eq!(usage.cached_tokens, cached, "{chunk}");
            assert_eq!(usage.prompt_tokens, 100);
        }
    }

    #[test]
    fn accumulator_accepts_unknown_finish_reasons_and_missing_fields() {
        let mut answer = Accumulator::default();
        let step = answer
            .apply(&event(
                r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":"eos"}],"service_tier":"odd"}"#,
            ))
            .unwrap();
        assert_eq!(step, Step::Emit(vec![Delta::Text("hi".into())]));
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
    fn reasoning_is_read_from_either_field_and_an_empty_one_still_counts() {
        let mut answer = Accumulator::default();
        for data in [
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"a "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"b"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"done"},"finish_reason":"stop"}]}"#,
        ] {
            answer.apply(&event(data)).unwrap();
        }
        let done = answer.finish().unwrap();
        assert_eq!(
            done.reasoning.as_ref().map(|r| r.text.as_str()),
            Some("a b")
        );
        assert_eq!(done.text, "done");

        let mut thinking_silently = Accumulator::default();
        thinking_silently
            .apply(&event(
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"","content":"x"}}]}"#,
            ))
            .unwrap();
        assert_eq!(
            thinking_silently
                .finish()
                .unwrap()
                .reasoning
                .map(|r| r.text)
                .as_deref(),
            Some("")
        );
        let mut never = Accumulator::default();
        never
            .apply(&event(
                r#"{"choices":[{"index":0,"delta":{"reasoning":null,"content":"x"}}]}"#,
            ))
            .unwrap();
        assert_eq!(never.finish().unwrap().reasoning, None);

        let mut plain = Accumulator::default();
        plain
            .apply(&event(
                r#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
            ))
            .unwrap();
        assert_eq!(plain.finish().unwrap().reasoning, None);
    }
}
