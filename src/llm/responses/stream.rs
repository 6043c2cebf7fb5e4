//! Assembling one streamed Responses API answer from its semantic events: text and reasoning
//! deltas, function calls by output index, the reasoning items to replay, usage and the end.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::llm::openai::sse::SseEvent;
use crate::llm::openai::wire::{MAX_ERROR_MESSAGE, is_context_overflow, truncate};
use crate::llm::transport::{Decoder, Step};
use crate::llm::{ChatResponse, Delta, LlmError, ProviderKind, Reasoning, ToolCall, Usage};

/// A function call whose arguments may still be arriving.
#[derive(Debug, Default)]
struct PartialCall {
    call_id: String,
    name: String,
    arguments: String,
}

/// A reasoning item, as far as it has arrived.
#[derive(Debug, Default)]
struct ReasoningItem {
    /// The whole item, once `output_item.done` brought it.
    item: Option<Value>,
    /// Whether any of its text streamed; else the summary it ends with is all it shows.
    streamed: bool,
}

/// How the model ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// `response.completed`.
    Completed,
    /// `response.incomplete`, with the finish reason it maps to.
    Incomplete(String),
}

/// Which reasoning part a delta belongs to: output index, summary or raw text, part index.
type Part = (Option<u64>, &'static str, u64);

/// The answer being assembled from events.
#[derive(Debug, Default)]
pub(super) struct ResponseStream {
    text: String,
    /// The readable reasoning: summary parts (or raw reasoning text) separated by blank lines.
    reasoning: String,
    /// Function calls by `output_index`, so they keep the model's order.
    calls: BTreeMap<u64, PartialCall>,
    /// Reasoning items by `output_index`, likewise.
    reasoning_items: BTreeMap<u64, ReasoningItem>,
    /// Item ids to their output index, for events that name only the item.
    indexes: HashMap<String, u64>,
    /// One past the highest output index seen, for an item that names none.
    next_index: u64,
    /// The part the last reasoning delta extended, to know when a new one starts.
    last_part: Option<Part>,
    usage: Option<Usage>,
    end: Option<End>,
    /// The model the response named.
    model: Option<String>,
}

impl Decoder for ResponseStream {
    const MISSING_END: &'static str = "no response.completed";

    fn apply(&mut self, event: &SseEvent) -> Result<Step, LlmError> {
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(Step::Continue);
        }
        let value: Value = serde_json::from_str(data).map_err(|err| {
            LlmError::BadResponse(format!(
                "malformed event ({err}): {}",
                truncate(data, MAX_ERROR_MESSAGE)
            ))
        })?;
        // The data's own `type` is authoritative; the `event:` line only repeats it.
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        let step = match kind {
            "response.output_item.added" => {
                self.item_added(&value);
                Step::Continue
            }
            "response.output_item.done" => self.item_done(&value),
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = text_field(&value, "delta");
                self.text.push_str(delta);
                emit(Delta::Text(delta.to_string()))
            }
            "response.reasoning_summary_text.delta" => {
                self.reasoning_delta(&value, "summary", "summary_index")
            }
            "response.reasoning_text.delta" => {
                self.reasoning_delta(&value, "text", "content_index")
            }
            "response.function_call_arguments.delta" => {
                if let Some(call) = self.call(&value) {
                    call.arguments.push_str(text_field(&value, "delta"));
                }
                Step::Continue
            }
            "response.function_call_arguments.done" => {
                if let Some(call) = self.call(&value) {
                    if let Some(arguments) = value.get("arguments").and_then(Value::as_str) {
                        call.arguments = arguments.to_string();
                    }
                    if let Some(name) = value.get("name").and_then(Value::as_str)
                        && call.name.is_empty()
                    {
                        call.name = name.to_string();
                    }
                }
                Step::Continue
            }
            "response.completed" | "response.incomplete" => {
                let response = value.get("response").unwrap_or(&Value::Null);
                if let Some(model) = response.get("model").and_then(Value::as_str) {
                    self.model = Some(model.to_string());
                }
                self.usage = response.get("usage").and_then(usage).or(self.usage);
                let incomplete = kind == "response.incomplete"
                    || response.get("status").and_then(Value::as_str) == Some("incomplete");
                self.end = Some(if incomplete {
                    End::Incomplete(incomplete_reason(response))
                } else {
                    End::Completed
                });
                Step::Done
            }
            "response.failed" => {
                let error = value
                    .get("response")
                    .and_then(|response| response.get("error"))
                    .filter(|error| error.is_object());
                return Err(failure(error));
            }
            // Documented as top-level `code`/`message`; some servers nest an `error` object.
            "error" => {
                let error = value
                    .get("error")
                    .filter(|error| error.is_object())
                    .unwrap_or(&value);
                return Err(failure(Some(error)));
            }
            _ => Step::Continue,
        };
        Ok(step)
    }

    fn has_output(&self) -> bool {
        !self.text.is_empty() || !self.reasoning.is_empty() || !self.calls.is_empty()
    }

    fn saw_end(&self) -> bool {
        self.end.is_some()
    }

    fn finish(&mut self) -> Result<ChatResponse, LlmError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in std::mem::take(&mut self.calls) {
            if call.name.is_empty() {
                return Err(LlmError::BadResponse(format!(
                    "function call at output {index} arrived without a name"
                )));
            }
            let id = if call.call_id.is_empty() {
                // The function_call_output must answer some call_id.
                format!("call_{index}_{}", uuid::Uuid::new_v4().simple())
            } else {
                call.call_id
            };
            tool_calls.push(ToolCall {
                id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        let reasoned = !self.reasoning.is_empty() || !self.reasoning_items.is_empty();
        // One that never finished has no encrypted_content to replay.
        let reasoning_items = std::mem::take(&mut self.reasoning_items)
            .into_values()
            .filter_map(|reasoning| reasoning.item)
            .collect();
        let finish_reason = if !tool_calls.is_empty() {
            "tool_calls".to_string()
        } else {
            match &self.end {
                Some(End::Incomplete(reason)) => reason.clone(),
                _ => "stop".to_string(),
            }
        };
        Ok(ChatResponse {
            text: std::mem::take(&mut self.text),
            tool_calls,
            reasoning: reasoned.then(|| Reasoning {
                kind: ProviderKind::OpenAiResponses,
                text: std::mem::take(&mut self.reasoning),
                items: reasoning_items,
            }),
            usage: self.usage,
            finish_reason: Some(finish_reason),
            first_token: None,
            model: self.model.take(),
        })
    }
}

impl ResponseStream {
    /// The output index an event refers to: its own `output_index`, else its item's.
    fn index_of(&mut self, event: &Value) -> Option<u64> {
        let index = match (
            event.get("output_index").and_then(Value::as_u64),
            item_id(event),
        ) {
            (Some(index), Some(id)) => {
                self.indexes.insert(id.to_string(), index);
                Some(index)
            }
            (Some(index), None) => Some(index),
            (None, Some(id)) => self.indexes.get(id).copied(),
            (None, None) => None,
        };
        if let Some(index) = index {
            self.next_index = self.next_index.max(index.saturating_add(1));
        }
        index
    }

    /// The index for an event that must land somewhere: after every item so far when it
    /// names none we know.
    fn index_or_next(&mut self, event: &Value) -> u64 {
        match self.index_of(event) {
            Some(index) => index,
            None => {
                let index = self.next_index;
                self.next_index = index.saturating_add(1);
                if let Some(id) = item_id(event) {
                    self.indexes.insert(id.to_string(), index);
                }
                index
            }
        }
    }

    /// `response.output_item.added`: a call starts with its id and name; reasoning is noted.
    fn item_added(&mut self, event: &Value) {
        let index = self.index_or_next(event);
        let item = event.get("item").unwrap_or(&Value::Null);
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let call = self.calls.entry(index).or_default();
                fill(&mut call.call_id, item, "call_id");
                fill(&mut call.name, item, "name");
                if let Some(arguments) = item.get("arguments").and_then(Value::as_str)
                    && call.arguments.is_empty()
                {
                    call.arguments = arguments.to_string();
                }
            }
            Some("reasoning") => {
                self.reasoning_items.entry(index).or_default();
            }
            _ => {}
        }
    }

    /// `response.output_item.done`: the complete item, authoritative over what streamed.
    fn item_done(&mut self, event: &Value) -> Step {
        let index = self.index_or_next(event);
        let Some(item) = event.get("item") else {
            return Step::Continue;
        };
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let call = self.calls.entry(index).or_default();
                for (slot, field) in [
                    (&mut call.call_id, "call_id"),
                    (&mut call.name, "name"),
                    (&mut call.arguments, "arguments"),
                ] {
                    if let Some(text) = item.get(field).and_then(Value::as_str) {
                        *slot = text.to_string();
                    }
                }
                Step::Continue
            }
            Some("reasoning") => {
                let reasoning = self.reasoning_items.entry(index).or_default();
                reasoning.item = Some(item.clone());
                if std::mem::replace(&mut reasoning.streamed, true) {
                    return Step::Continue;
                }
                // Nothing streamed: the summary the item ends with is all there is to show.
                let summary = item
                    .get("summary")
                    .and_then(Value::as_array)
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|part| part.get("text").and_then(Value::as_str))
                            .filter(|text| !text.is_empty())
                            .collect::<Vec<_>>()
                            .join("\n\n")
                    })
                    .unwrap_or_default();
                self.last_part = None;
                self.push_reasoning(&summary)
            }
            _ => Step::Continue,
        }
    }

    /// A reasoning delta; a new part (summary or raw text) starts after a blank line.
    fn reasoning_delta(&mut self, event: &Value, kind: &'static str, part_field: &str) -> Step {
        let index = self.index_of(event);
        if let Some(index) = index {
            self.reasoning_items.entry(index).or_default().streamed = true;
        }
        let part = (
            index,
            kind,
            event.get(part_field).and_then(Value::as_u64).unwrap_or(0),
        );
        let delta = text_field(event, "delta");
        if delta.is_empty() {
            return Step::Continue;
        }
        if self.last_part != Some(part) {
            self.last_part = Some(part);
            return self.push_reasoning(delta);
        }
        self.reasoning.push_str(delta);
        emit(Delta::Reasoning(delta.to_string()))
    }

    /// Appends the start of a reasoning part, after a blank line when text precedes it.
    fn push_reasoning(&mut self, text: &str) -> Step {
        if text.is_empty() {
            return Step::Continue;
        }
        let shown = if self.reasoning.is_empty() {
            text.to_string()
        } else {
            format!("\n\n{text}")
        };
        self.reasoning.push_str(&shown);
        emit(Delta::Reasoning(shown))
    }

    /// The call an argument event refers to, started if its `output_item.added` was missed
    /// (none when the event points at a reasoning item).
    fn call(&mut self, event: &Value) -> Option<&mut PartialCall> {
        let index = self.index_or_next(event);
        if self.reasoning_items.contains_key(&index) {
            return None;
        }
        Some(self.calls.entry(index).or_default())
    }
}

/// The id of the item an event is about: its `item_id`, or the id of the item it carries.
fn item_id(event: &Value) -> Option<&str> {
    event
        .get("item_id")
        .or_else(|| event.get("item").and_then(|item| item.get("id")))
        .and_then(Value::as_str)
}

/// A step forwarding `delta`, or nothing when it is empty.
fn emit(delta: Delta) -> Step {
    match &delta {
        Delta::Text(text) | Delta::Reasoning(text) if text.is_empty() => Step::Continue,
        _ => Step::Emit(vec![delta]),
    }
}

/// A string field, empty when absent.
fn text_field<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or_default()
}

/// Sets `slot` from `item[field]` unless it already holds something.
fn fill(slot: &mut String, item: &Value, field: &str) {
    if let Some(text) = item.get(field).and_then(Value::as_str)
        && slot.is_empty()
    {
        *slot = text.to_string();
    }
}

/// A Responses usage object in our terms.
fn usage(usage: &Value) -> Option<Usage> {
    let count = |value: Option<&Value>| value.and_then(Value::as_u64).unwrap_or(0);
    usage.is_object().then(|| Usage {
        prompt_tokens: count(usage.get("input_tokens")),
        completion_tokens: count(usage.get("output_tokens")),
        cached_tokens: count(
            usage
                .get("input_tokens_details")
                .and_then(|details| details.get("cached_tokens")),
        ),
        cache_write_tokens: 0,
    })
}

/// The finish reason an incomplete response maps to, in chat-completions words.
fn incomplete_reason(response: &Value) -> String {
    let reason = response
        .get("incomplete_details")
        .and_then(|details| details.get("reason"))
        .and_then(Value::as_str);
    match reason {
        Some("max_output_tokens") | None => "length".to_string(),
        Some(other) => other.to_string(),
    }
}

/// The error a failed response or `error` event carries.
fn failure(error: Option<&Value>) -> LlmError {
    let message = error.map(describe).unwrap_or_default();
    let message = if message.is_empty() {
        "(no error detail)".to_string()
    } else {
        truncate(&message, MAX_ERROR_MESSAGE)
    };
    if is_context_overflow(&message) {
        LlmError::ContextOverflow(message)
    } else {
        LlmError::BadResponse(format!("the model failed mid-stream: {message}"))
    }
}

/// `message (code: code)` from an error object, either part possibly missing.
fn describe(error: &Value) -> String {
    let message = text_field(error, "message").trim();
    let code = match error.get("code") {
        Some(Value::String(code)) => code.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    match (message.is_empty(), code.is_empty()) {
        (_, true) => message.to_string(),
        (true, false) => code,
        (false, false) => format!("{message} (code: {code})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::openai::sse::SseParser;
    use serde_json::json;

    /// An SSE body as OpenAI writes it: `event:` named after the data's `type`.
    fn sse(events: &[Value]) -> String {
        events
            .iter()
            .map(|event| {
                format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// Feeds `body` through the real SSE parser; the steps and the decoder.
    fn decode(body: &str) -> (Vec<Step>, ResponseStream) {
        let mut parser = SseParser::default();
        let mut decoder = ResponseStream::default();
        let steps = parser
            .push(body.as_bytes())
            .unwrap()
            .iter()
            .map(|event| decoder.apply(event).unwrap())
            .collect();
        (steps, decoder)
    }

    fn reasoning_done() -> Value {
        json!({
            "type": "reasoning",
            "id": "rs_6820f382ee1c8191bc096bee70894d040ac5ba57aafcbac7",
            "summary": [
                {"type": "summary_text", "text": "**Finding the weather**\n\nI need Paris."},
                {"type": "summary_text", "text": "**Calling the tool**"},
            ],
            "encrypted_content": "gAAAAABoISQ24OyVRYbkYfukdnoC7dcAQbaKM0ECk8sj4Wr-opaque==",
        })
    }

    /// OpenAI's documented sequence for a reasoning model that thinks, then calls a function.
    fn reasoning_then_call() -> String {
        let rs = "rs_6820f382ee1c8191bc096bee70894d040ac5ba57aafcbac7";
        let fc = "fc_6820f3855a7c8191a6b2e1a1c6f5a6be0ac5ba57aafcbac7";
        let response = |status: &str, usage: Value| {
            json!({
                "id": "resp_6820f382ee1c8191bc096bee70894d04", "object": "response",
                "created_at": 1_746_989_954, "status": status, "model": "o4-mini-2025-04-16",
                "output": [], "store": false, "usage": usage,
            })
        };
        sse(&[
            json!({"type":"response.created","sequence_number":0,"response":response("in_progress", Value::Null)}),
            json!({"type":"response.in_progress","sequence_number":1,"response":response("in_progress", Value::Null)}),
            json!({"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":rs,"type":"reasoning","summary":[]}}),
            json!({"type":"response.reasoning_summary_part.added","sequence_number":3,"item_id":rs,"output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}),
            json!({"type":"response.reasoning_summary_text.delta","sequence_number":4,"item_id":rs,"output_index":0,"summary_index":0,"delta":"**Finding the weather**"}),
            json!({"type":"response.reasoning_summary_text.delta","sequence_number":5,"item_id":rs,"output_index":0,"summary_index":0,"delta":"\n\nI need Paris."}),
            json!({"type":"response.reasoning_summary_text.done","sequence_number":6,"item_id":rs,"output_index":0,"summary_index":0,"text":"**Finding the weather**\n\nI need Paris."}),
            json!({"type":"response.reasoning_summary_part.done","sequence_number":7,"item_id":rs,"output_index":0,"summary_index":0,"part":{"type":"summary_text","text":"**Finding the weather**\n\nI need Paris."}}),
            json!({"type":"response.reasoning_summary_part.added","sequence_number":8,"item_id":rs,"output_index":0,"summary_index":1,"part":{"type":"summary_text","text":""}}),
            json!({"type":"response.reasoning_summary_text.delta","sequence_number":9,"item_id":rs,"output_index":0,"summary_index":1,"delta":"**Calling the tool**"}),
            json!({"type":"response.reasoning_summary_text.done","sequence_number":10,"item_id":rs,"output_index":0,"summary_index":1,"text":"**Calling the tool**"}),
            json!({"type":"response.output_item.done","sequence_number":11,"output_index":0,"item":reasoning_done()}),
            json!({"type":"response.output_item.added","sequence_number":12,"output_index":1,"item":{"id":fc,"type":"function_call","status":"in_progress","arguments":"","call_id":"call_a5BkLzKPtGxcUbxyQOTiKbrX","name":"get_weather"}}),
            json!({"type":"response.function_call_arguments.delta","sequence_number":13,"item_id":fc,"output_index":1,"delta":"{\"location\":"}),
            json!({"type":"response.function_call_arguments.delta","sequence_number":14,"item_id":fc,"output_index":1,"delta":"\"Paris\"}"}),
            json!({"type":"response.function_call_arguments.done","sequence_number":15,"item_id":fc,"output_index":1,"arguments":"{\"location\":\"Paris\"}"}),
            json!({"type":"response.output_item.done","sequence_number":16,"output_index":1,"item":{"id":fc,"type":"function_call","status":"completed","arguments":"{\"location\":\"Paris\"}","call_id":"call_a5BkLzKPtGxcUbxyQOTiKbrX","name":"get_weather"}}),
            json!({"type":"response.completed","sequence_number":17,"response":response("completed", json!({
                "input_tokens": 2_112,
                "input_tokens_details": {"cached_tokens": 1_920},
                "output_tokens": 187,
                "output_tokens_details": {"reasoning_tokens": 128},
                "total_tokens": 2_299,
            }))}),
        ])
    }

    #[test]
    fn reasoning_then_a_function_call_decodes_to_a_replayable_answer() {
        let (steps, mut decoder) = decode(&reasoning_then_call());
        let emitted: Vec<Delta> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Emit(deltas) => Some(deltas.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(
            emitted,
            vec![
                Delta::Reasoning("**Finding the weather**".into()),
                Delta::Reasoning("\n\nI need Paris.".into()),
                Delta::Reasoning("\n\n**Calling the tool**".into()),
            ]
        );
        assert_eq!(steps.last(), Some(&Step::Done));
        assert!(decoder.saw_end());
        assert!(decoder.has_output());
        let response = decoder.finish().unwrap();
        assert_eq!(response.text, "");
        assert_eq!(response.model.as_deref(), Some("o4-mini-2025-04-16"));
        assert_eq!(
            response.tool_calls,
            vec![ToolCall {
                id: "call_a5BkLzKPtGxcUbxyQOTiKbrX".into(),
                name: "get_weather".into(),
                arguments: "{\"location\":\"Paris\"}".into(),
            }]
        );
        assert_eq!(
            response.reasoning,
            Some(Reasoning {
                kind: ProviderKind::OpenAiResponses,
                text: "**Finding the weather**\n\nI need Paris.\n\n**Calling the tool**".into(),
                items: vec![reasoning_done()],
            })
        );
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            response.usage,
            Some(Usage {
                prompt_tokens: 2_112,
                completion_tokens: 187,
                cached_tokens: 1_920,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn text_streams_and_an_answer_without_reasoning_has_none() {
        let msg = "msg_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654";
        let (steps, mut decoder) = decode(&sse(&[
            json!({"type":"response.output_item.added","output_index":0,"item":{"id":msg,"type":"message","status":"in_progress","role":"assistant","content":[]}}),
            json!({"type":"response.content_part.added","item_id":msg,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}),
            json!({"type":"response.output_text.delta","item_id":msg,"output_index":0,"content_index":0,"delta":"Hi"}),
            json!({"type":"response.output_text.delta","item_id":msg,"output_index":0,"content_index":0,"delta":" there"}),
            json!({"type":"response.output_text.done","item_id":msg,"output_index":0,"content_index":0,"text":"Hi there"}),
            json!({"type":"response.output_item.done","output_index":0,"item":{"id":msg,"type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there","annotations":[]}]}}),
            json!({"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":5,"output_tokens":2}}}),
        ]));
        assert!(steps.contains(&Step::Emit(vec![Delta::Text(" there".into())])));
        let response = decoder.finish().unwrap();
        assert_eq!(response.text, "Hi there");
        assert_eq!(response.reasoning, None);
        assert_eq!(response.finish_reason.as_deref(), Some("stop"));
        assert_eq!(response.usage.map(|usage| usage.cached_tokens), Some(0));
    }

    #[test]
    fn an_incomplete_response_ends_with_length() {
        let (steps, mut decoder) = decode(&sse(&[
            json!({"type":"response.output_text.delta","output_index":0,"delta":"Once upon"}),
            json!({"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":9,"output_tokens":16}}}),
        ]));
        assert_eq!(steps.last(), Some(&Step::Done));
        assert!(decoder.saw_end());
        let response = decoder.finish().unwrap();
        assert_eq!(response.finish_reason.as_deref(), Some("length"));
        assert_eq!(response.text, "Once upon");
    }

    #[test]
    fn a_summary_that_never_streamed_is_taken_from_the_finished_item() {
        let (steps, mut decoder) = decode(&sse(&[
            json!({"type":"response.output_item.added","output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}),
            json!({"type":"response.output_item.done","output_index":0,"item":reasoning_done()}),
            json!({"type":"response.output_text.delta","output_index":1,"delta":"Sunny."}),
            json!({"type":"response.completed","response":{"status":"completed"}}),
        ]));
        assert_eq!(
            steps[1],
            Step::Emit(vec![Delta::Reasoning(
                "**Finding the weather**\n\nI need Paris.\n\n**Calling the tool**".into()
            )])
        );
        let response = decoder.finish().unwrap();
        assert_eq!(
            response.reasoning.map(|reasoning| reasoning.items),
            Some(vec![reasoning_done()])
        );
        assert_eq!(response.usage, None);
    }

    #[test]
    fn failures_and_error_events_are_typed() {
        let failed = |error: Value| {
            let mut decoder = ResponseStream::default();
            decoder.apply(&SseEvent {
                event: String::new(),
                data: error.to_string(),
            })
        };
        assert!(matches!(
            failed(json!({"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"The model crashed."}}})),
            Err(LlmError::BadResponse(text)) if text.contains("The model crashed. (code: server_error)")
        ));
        assert!(matches!(
            failed(
                json!({"type":"error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":"input","sequence_number":1})
            ),
            Err(LlmError::ContextOverflow(_))
        ));
        assert!(matches!(
            failed(json!({"type":"error","error":{"type":"invalid_request_error","message":"Bad tool schema."}})),
            Err(LlmError::BadResponse(text)) if text.contains("Bad tool schema.")
        ));
        assert!(matches!(
            failed(json!({"type":"response.failed","response":{"status":"failed","error":null}})),
            Err(LlmError::BadResponse(text)) if text.contains("no error detail")
        ));
        let mut decoder = ResponseStream::default();
        assert!(matches!(
            decoder.apply(&SseEvent {
                event: "response.output_text.delta".into(),
                data: "{not json".into(),
            }),
            Err(LlmError::BadResponse(_))
        ));
    }

    #[test]
    fn a_stream_cut_before_the_end_has_not_ended_and_nameless_calls_are_refused() {
        let (_, mut decoder) = decode(&sse(&[
            json!({"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{}"}),
        ]));
        assert!(!decoder.saw_end());
        assert!(decoder.has_output());
        assert!(matches!(decoder.finish(), Err(LlmError::BadResponse(_))));
    }
}
