//! The request body: our conversation as Responses API input items.

use serde_json::{Map, Value, json};

use crate::llm::{ChatMessage, ChatRequest, ProviderKind, ToolSpec};

/// The JSON body for `request`: streamed, stateless, asking for the encrypted reasoning that
/// statelessness makes us send back; `default_model` when the request names none.
pub(super) fn request_body(request: &ChatRequest, default_model: Option<&str>) -> Value {
    let model = if request.model.is_empty() {
        default_model.unwrap_or_default()
    } else {
        request.model.as_str()
    };
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("stream".into(), json!(true));
    // Nothing is kept on OpenAI's side, so every request carries the whole conversation and
    // the reasoning comes back encrypted for us to replay.
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    let instructions = request
        .messages
        .iter()
        .filter_map(|message| match message {
            ChatMessage::System { content } => Some(content.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>();
    if !instructions.is_empty() {
        body.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    let input = request
        .messages
        .iter()
        .flat_map(input_items)
        .collect::<Vec<_>>();
    body.insert("input".into(), Value::Array(input));
    if !request.tools.is_empty() {
        let tools = request.tools.iter().map(wire_tool).collect::<Vec<_>>();
        body.insert("tools".into(), Value::Array(tools));
        body.insert("tool_choice".into(), json!("auto"));
    }
    if request.max_tokens > 0 {
        body.insert("max_output_tokens".into(), json!(request.max_tokens));
    }
    if let Some(effort) = &request.reasoning_effort {
        body.insert(
            "reasoning".into(),
            json!({"effort": effort, "summary": "auto"}),
        );
    }
    Value::Object(body)
}

/// The input items one message becomes (none for system messages, which are `instructions`).
fn input_items(message: &ChatMessage) -> Vec<Value> {
    match message {
        ChatMessage::System { .. } => Vec::new(),
        ChatMessage::User { content, images } => {
            let mut parts = vec![json!({"type": "input_text", "text": content})];
            parts.extend(images.iter().map(|image| {
                json!({"type": "input_image", "image_url": image.data_url(), "detail": "auto"})
            }));
            vec![json!({"type": "message", "role": "user", "content": parts})]
        }
        ChatMessage::Assistant {
            content,
            tool_calls,
            reasoning,
        } => {
            let text = content.as_deref().filter(|text| !text.is_empty());
            let mut items = Vec::new();
            // The API refuses a reasoning item without the output it led to, and reasoning
            // from another API means nothing to this one.
            if let Some(reasoning) = reasoning
                && reasoning.kind == ProviderKind::OpenAiResponses
                && (text.is_some() || !tool_calls.is_empty())
            {
                items.extend(reasoning.items.iter().cloned());
            }
            if let Some(text) = text {
                items.push(json!({
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }));
            }
            items.extend(tool_calls.iter().map(|call| {
                json!({
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                })
            }));
            items
        }
        ChatMessage::Tool {
            tool_call_id,
            content,
        } => vec![json!({
            "type": "function_call_output",
            "call_id": tool_call_id,
            "output": content,
        })],
    }
}

/// One tool as a Responses function tool (flat, unlike chat completions' nested `function`).
fn wire_tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.input_schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{Reasoning, ToolCall};

    fn reasoning_item(id: &str) -> Value {
        json!({
            "type": "reasoning",
            "id": id,
            "summary": [{"type": "summary_text", "text": "Checking the file."}],
            "encrypted_content": format!("gAAAAB-{id}-opaque=="),
        })
    }

    fn request(messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            model: String::new(),
            messages,
            tools: Vec::new().into(),
            max_tokens: 0,
            reasoning_effort: None,
        }
    }

    #[test]
    fn the_body_is_stateless_streamed_and_asks_for_encrypted_reasoning() {
        let body = request_body(&request(vec![]), Some("gpt-5"));
        assert_eq!(
            body,
            json!({
                "model": "gpt-5",
                "stream": true,
                "store": false,
                "include": ["reasoning.encrypted_content"],
                "input": [],
            })
        );
        let mut named = request(vec![]);
        named.model = "o4-mini".into();
        assert_eq!(request_body(&named, Some("gpt-5"))["model"], "o4-mini");
    }

    #[test]
    fn system_messages_become_instructions_and_limits_tools_and_effort_are_set() {
        let mut request = request(vec![
            ChatMessage::System {
                content: "Be brief.".into(),
            },
            ChatMessage::User {
                content: "hi".into(),
                images: Vec::new(),
            },
            ChatMessage::System {
                content: "Use tools.".into(),
            },
        ]);
        request.max_tokens = 512;
        request.reasoning_effort = Some("high".into());
        request.tools = vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file.".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        }]
        .into();
        let body = request_body(&request, None);
        assert_eq!(body["instructions"], "Be brief.\n\nUse tools.");
        assert_eq!(
            body["input"],
            json!([{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}])
        );
        assert_eq!(body["max_output_tokens"], 512);
        assert_eq!(
            body["reasoning"],
            json!({"effort": "high", "summary": "auto"})
        );
        assert_eq!(body["tool_choice"], "auto");
        assert_eq!(
            body["tools"],
            json!([{
                "type": "function",
                "name": "read_file",
                "description": "Reads a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }])
        );
        assert_eq!(body["model"], "");
    }

    #[test]
    fn input_keeps_the_conversation_order_and_replays_only_responses_reasoning() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: format!("{{\"path\":\"{id}.txt\"}}"),
        };
        let body = request_body(
            &request(vec![
                ChatMessage::System {
                    content: "sys".into(),
                },
                ChatMessage::User {
                    content: "read a and b".into(),
                    images: Vec::new(),
                },
                ChatMessage::Assistant {
                    content: Some("Reading.".into()),
                    tool_calls: vec![call("a"), call("b")],
                    reasoning: Some(Reasoning {
                        kind: ProviderKind::OpenAiResponses,
                        text: "Checking the file.".into(),
                        items: vec![reasoning_item("rs_1"), reasoning_item("rs_2")],
                    }),
                },
                ChatMessage::Tool {
                    tool_call_id: "a".into(),
                    content: "A".into(),
                },
                ChatMessage::Tool {
                    tool_call_id: "b".into(),
                    content: "B".into(),
                },
                // From a chat-completions model earlier in the session: its reasoning stays.
                ChatMessage::Assistant {
                    content: Some("Both read.".into()),
                    tool_calls: vec![],
                    reasoning: Some(Reasoning::chat("thinking aloud")),
                },
                ChatMessage::User {
                    content: "thanks".into(),
                    images: Vec::new(),
                },
                // Reasoning with nothing after it would be refused; empty text is no message.
                ChatMessage::Assistant {
                    content: Some(String::new()),
                    tool_calls: vec![],
                    reasoning: Some(Reasoning {
                        kind: ProviderKind::OpenAiResponses,
                        text: String::new(),
                        items: vec![reasoning_item("rs_3")],
                    }),
                },
            ]),
            None,
        );
        assert_eq!(body["instructions"], "sys");
        assert_eq!(
            body["input"],
            json!([
                {"type":"message","role":"user","content":[{"type":"input_text","text":"read a and b"}]},
                reasoning_item("rs_1"),
                reasoning_item("rs_2"),
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Reading."}]},
                {"type":"function_call","call_id":"a","name":"read_file","arguments":"{\"path\":\"a.txt\"}"},
                {"type":"function_call","call_id":"b","name":"read_file","arguments":"{\"path\":\"b.txt\"}"},
                {"type":"function_call_output","call_id":"a","output":"A"},
                {"type":"function_call_output","call_id":"b","output":"B"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Both read."}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"thanks"}]},
            ])
        );
    }

    #[test]
    fn anthropic_reasoning_is_never_sent() {
        let body = request_body(
            &request(vec![ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "c".into(),
                    name: "x".into(),
                    arguments: "{}".into(),
                }],
                reasoning: Some(Reasoning {
                    kind: ProviderKind::Anthropic,
                    text: "t".into(),
                    items: vec![json!({"type": "thinking", "thinking": "t", "signature": "s"})],
                }),
            }]),
            None,
        );
        assert_eq!(
            body["input"],
            json!([{"type":"function_call","call_id":"c","name":"x","arguments":"{}"}])
        );
    }

    #[test]
    fn images_are_input_image_parts_after_the_text() {
        let image = crate::llm::ImageData {
            mime: "image/jpeg".into(),
            data: "/9j/4AAQ".into(),
        };
        let body = request_body(
            &request(vec![ChatMessage::User {
                content: "and this?".into(),
                images: vec![image],
            }]),
            Some("gpt-5"),
        );
        assert_eq!(
            body["input"][0],
            json!({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "and this?"},
                {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "auto"},
            ]})
        );
    }
}
