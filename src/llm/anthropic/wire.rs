//! The request body for `POST /messages`, built as JSON values; its shape is described in the
//! parent module's documentation.

use serde_json::{Map, Value, json};

use crate::llm::{ChatMessage, ChatRequest, ProviderKind, ToolSpec};

/// The token cap when a request names none: Anthropic refuses a request without one.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 4096;

/// What the answer keeps beyond the thinking budget when the cap would not leave it any room.
const ANSWER_ROOM: u32 = 1024;

/// Anthropic refuses a request with more cache breakpoints than this.
pub(super) const MAX_CACHE_BREAKPOINTS: usize = 4;

/// What opens a conversation whose oldest kept message is the model's: Anthropic refuses a
/// first message that is not the user's, and trimming history to the context window may start
/// it at an assistant message.
const CONTINUATION: &str = "(The conversation continues.)";

/// The thinking budget in tokens for a `reasoning_effort`.
pub(super) fn thinking_budget(effort: &str) -> u32 {
    match effort {
        "low" => 1024,
        "high" => 16_384,
        // "medium" and any word Anthropic has no scale for.
        _ => 4096,
    }
}

/// The whole request body for `request`; `default_model` stands in when it names none.
pub(super) fn request_body(request: &ChatRequest, default_model: Option<&str>) -> Value {
    let model = if request.model.is_empty() {
        default_model.unwrap_or_default()
    } else {
        request.model.as_str()
    };
    let mut max_tokens = match request.max_tokens {
        0 => DEFAULT_MAX_TOKENS,
        cap => cap,
    };
    let mut body = Map::new();
    body.insert("model".into(), Value::from(model));
    body.insert("stream".into(), Value::Bool(true));
    // `none` asks for no thinking at all, as it does of OpenAI's models. Thinking also waits
    // while a tool loop that began without it is open: Anthropic refuses thinking when the
    // assistant message whose results are being sent back does not start with a thinking
    // block, which is what a loop begun by another provider kind, or with thinking off, holds.
    if let Some(effort) = request
        .reasoning_effort
        .as_ref()
        .filter(|e| *e != "none")
        .filter(|_| !open_tool_loop_without_thinking(&request.messages))
    {
        let budget = thinking_budget(effort);
        // Anthropic refuses a budget that is not below the cap.
        if max_tokens <= budget {
            max_tokens = budget + ANSWER_ROOM;
        }
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    body.insert("max_tokens".into(), Value::from(max_tokens));

    let mut system = system_blocks(&request.messages);
    let mut tools: Vec<Value> = request.tools.iter().map(wire_tool).collect();
    let mut messages = wire_messages(&request.messages);
    mark_cache_breakpoints(&mut tools, &mut system, &mut messages);
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
    }
    let messages = messages
        .into_iter()
        .map(|turn| json!({"role": turn.role, "content": turn.content}))
        .collect();
    body.insert("messages".into(), Value::Array(messages));
    Value::Object(body)
}

/// Whether the conversation ends in tool results for an assistant message that carries no
/// Anthropic thinking block.
fn open_tool_loop_without_thinking(messages: &[ChatMessage]) -> bool {
    if !matches!(messages.last(), Some(ChatMessage::Tool { .. })) {
        return false;
    }
    let caller = messages
        .iter()
        .rev()
        .find(|message| !matches!(message, ChatMessage::Tool { .. }));
    match caller {
        Some(ChatMessage::Assistant { reasoning, .. }) => !reasoning.as_ref().is_some_and(|r| {
            r.kind == ProviderKind::Anthropic
                && r.items
                    .first()
                    .and_then(block_type)
                    .is_some_and(|kind| matches!(kind, "thinking" | "redacted_thinking"))
        }),
        _ => false,
    }
}

/// One message of the wire conversation, still open to merging and marking.
#[derive(Debug)]
struct Turn {
    role: &'static str,
    content: Vec<Value>,
}

/// A text block, or none for text Anthropic would refuse (empty or only whitespace).
fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// The system messages as text blocks, in order.
fn system_blocks(messages: &[ChatMessage]) -> Vec<Value> {
    messages
        .iter()
        .filter_map(|message| match message {
            ChatMessage::System { content } => text_block(content),
            _ => None,
        })
        .collect()
}

/// The conversation without its system messages, as alternating user and assistant turns.
fn wire_messages(messages: &[ChatMessage]) -> Vec<Turn> {
    let mut turns: Vec<Turn> = Vec::new();
    for message in messages {
        let (role, blocks) = match message {
            ChatMessage::System { .. } => continue,
            ChatMessage::User { content, images } => {
                let mut blocks: Vec<Value> = images
                    .iter()
                    .map(|image| {
                        json!({
                            "type": "image",
                            "source": {"type": "base64", "media_type": image.mime, "data": image.data},
                        })
                    })
                    .collect();
                // Images first: Anthropic's guidance puts them before the text about them.
                blocks.extend(text_block(content));
                ("user", blocks)
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => ("user", vec![tool_result(tool_call_id, content)]),
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                let mut blocks = Vec::new();
                if let Some(reasoning) = reasoning
                    && reasoning.kind == ProviderKind::Anthropic
                {
                    // Signed as they came: Anthropic refuses altered thinking blocks.
                    blocks.extend(reasoning.items.iter().cloned());
                }
                blocks.extend(content.as_deref().and_then(text_block));
                blocks.extend(tool_calls.iter().map(|call| {
                    json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": tool_input(&call.arguments),
                    })
                }));
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            // A message with nothing Anthropic accepts is left out; its neighbours then merge.
            continue;
        }
        match turns.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => turns.push(Turn {
                role,
                content: blocks,
            }),
        }
    }
    for turn in turns.iter_mut().filter(|turn| turn.role == "user") {
        // Anthropic wants a user message's tool results before its text; the sort is stable,
        // so each kind keeps its order.
        turn.content
            .sort_by_key(|block| block_type(block) != Some("tool_result"));
    }
    if turns.first().is_some_and(|turn| turn.role != "user") {
        turns.insert(
            0,
            Turn {
                role: "user",
                content: text_block(CONTINUATION).into_iter().collect(),
            },
        );
    }
    turns
}

/// A tool result block; empty output sends no content, since Anthropic refuses empty text.
fn tool_result(tool_call_id: &str, content: &str) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": tool_call_id});
    if !content.trim().is_empty() {
        block["content"] = Value::from(content);
    }
    block
}

/// A tool call's arguments as the object Anthropic requires; `{}` when the model wrote
/// something that is not a JSON object (the tool already answered that call with an error).
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// One tool definition; an empty description is left out rather than sent empty.
fn wire_tool(spec: &ToolSpec) -> Value {
    let mut tool = json!({"name": spec.name, "input_schema": spec.input_schema});
    if !spec.description.is_empty() {
        tool["description"] = Value::from(spec.description.as_str());
    }
    tool
}

/// A content block's `type`.
fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// Sets cache breakpoints, at most [`MAX_CACHE_BREAKPOINTS`]: after the tools and after the
/// system prompt (both byte-stable across a session), on the newest message (so the next
/// request reads this one's prefix), and on the user message before it (where the previous
/// request put its newest breakpoint: Anthropic looks back only about 20 blocks for a cached
/// prefix, and a turn with many tool results adds more than that).
fn mark_cache_breakpoints(tools: &mut [Value], system: &mut [Value], messages: &mut [Turn]) {
    let mut left = MAX_CACHE_BREAKPOINTS;
    mark(tools.last_mut(), &mut left);
    mark(system.last_mut(), &mut left);
    let newest = messages.len().checked_sub(1);
    let previous_user = messages
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, turn)| turn.role == "user")
        .map(|(at, _)| at)
        .find(|&at| Some(at) != newest);
    for at in [newest, previous_user].into_iter().flatten() {
        // Thinking blocks cannot carry a breakpoint; the block before them can stand in.
        let block = messages[at]
            .content
            .iter_mut()
            .rev()
            .find(|block| !matches!(block_type(block), Some("thinking" | "redacted_thinking")));
        mark(block, &mut left);
    }
}

/// Puts a breakpoint on `block` while any are left.
fn mark(block: Option<&mut Value>, left: &mut usize) {
    if *left == 0 {
        return;
    }
    if let Some(Value::Object(block)) = block {
        block.insert("cache_control".into(), json!({"type": "ephemeral"}));
        *left -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{Reasoning, ToolCall};

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User {
            content: text.into(),
            images: Vec::new(),
        }
    }

    fn system(text: &str) -> ChatMessage {
        ChatMessage::System {
            content: text.into(),
        }
    }

    fn tool(id: &str, text: &str) -> ChatMessage {
        ChatMessage::Tool {
            tool_call_id: id.into(),
            content: text.into(),
        }
    }

    fn assistant(
        text: Option<&str>,
        calls: &[(&str, &str)],
        reasoning: Option<Reasoning>,
    ) -> ChatMessage {
        ChatMessage::Assistant {
            content: text.map(str::to_string),
            tool_calls: calls
                .iter()
                .map(|(id, arguments)| ToolCall {
                    id: (*id).into(),
                    name: "read_file".into(),
                    arguments: (*arguments).into(),
                })
                .collect(),
            reasoning,
        }
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

    fn read_file() -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            input_schema: json!({"type": "object"}).into(),
        }
    }

    /// `value` with every `cache_control` taken out, to compare the rest whole.
    fn without_cache_control(mut value: Value) -> Value {
        fn strip(value: &mut Value) {
            match value {
                Value::Object(object) => {
                    object.remove("cache_control");
                    object.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        strip(&mut value);
        value
    }

    fn breakpoints(body: &Value) -> usize {
        body.to_string().matches("\"cache_control\"").count()
    }

    fn thinking(signature: &str) -> Value {
        json!({"type": "thinking", "thinking": "Let me look.", "signature": signature})
    }

    #[test]
    fn roles_merge_into_alternating_turns_with_tool_results_in_user_messages() {
        let mut asked = request(vec![
            system("Be brief."),
            system("Work in /repo."),
            user("hi"),
            user("read a and b"),
            assistant(
                Some("Reading."),
                &[("c1", r#"{"path":"a"}"#), ("c2", "not json")],
                None,
            ),
            tool("c1", "text of a"),
            tool("c2", ""),
            user("and then?"),
            // Nothing Anthropic accepts: left out, so the two user messages around it merge.
            assistant(Some("  "), &[], None),
            user("hello?"),
        ]);
        asked.tools = vec![read_file()].into();
        asked.max_tokens = 300;
        let body = request_body(&asked, Some("claude-x"));
        assert_eq!(
            without_cache_control(body),
            json!({
                "model": "claude-x",
                "max_tokens": 300,
                "stream": true,
                "system": [
                    {"type": "text", "text": "Be brief."},
                    {"type": "text", "text": "Work in /repo."},
                ],
                "tools": [{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "text", "text": "read a and b"},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a"}},
                        {"type": "tool_use", "id": "c2", "name": "read_file", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "c1", "content": "text of a"},
                        {"type": "tool_result", "tool_use_id": "c2"},
                        {"type": "text", "text": "and then?"},
                        {"type": "text", "text": "hello?"},
                    ]},
                ],
            })
        );
    }

    #[test]
    fn tool_results_come_before_text_and_a_leading_assistant_message_gets_a_user_one() {
        let body = request_body(
            &request(vec![
                assistant(None, &[("c1", "{}")], None),
                user("stop that"),
                tool("c1", "done"),
            ]),
            None,
        );
        assert_eq!(body["model"], "");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert!(body.get("system").is_none());
        assert!(body.get("tools").is_none());
        assert!(body.get("thinking").is_none());
        assert_eq!(
            without_cache_control(body["messages"].clone()),
            json!([
                {"role": "user", "content": [{"type": "text", "text": CONTINUATION}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "done"},
                    {"type": "text", "text": "stop that"},
                ]},
            ])
        );
    }

    #[test]
    fn anthropic_thinking_goes_first_and_other_reasoning_is_never_sent() {
        let signed = Reasoning {
            kind: ProviderKind::Anthropic,
            text: "Let me look.".into(),
            items: vec![
                thinking("sig-1"),
                json!({"type": "redacted_thinking", "data": "opaque"}),
            ],
        };
        let foreign = Reasoning {
            kind: ProviderKind::OpenAiResponses,
            text: "summary".into(),
            items: vec![json!({"type": "reasoning", "encrypted_content": "x"})],
        };
        let body = request_body(
            &request(vec![
                user("go"),
                assistant(Some("Looking."), &[("c1", "{}")], Some(signed)),
                tool("c1", "ok"),
                assistant(Some("Chat."), &[], Some(Reasoning::chat("chat reasoning"))),
                user("more"),
                assistant(Some("Other."), &[], Some(foreign)),
                user("again"),
                // Reasoning alone, with no text or calls, still makes a message.
                assistant(
                    None,
                    &[],
                    Some(Reasoning {
                        kind: ProviderKind::Anthropic,
                        text: String::new(),
                        items: vec![thinking("sig-2")],
                    }),
                ),
            ]),
            None,
        );
        let messages = without_cache_control(body["messages"].clone());
        assert_eq!(
            messages[1]["content"],
            json!([
                thinking("sig-1"),
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}},
            ])
        );
        assert_eq!(
            messages[3]["content"],
            json!([{"type": "text", "text": "Chat."}])
        );
        assert_eq!(
            messages[5]["content"],
            json!([{"type": "text", "text": "Other."}])
        );
        assert_eq!(messages[7]["content"], json!([thinking("sig-2")]));
        let text = body.to_string();
        assert!(!text.contains("chat reasoning"), "{text}");
        assert!(!text.contains("encrypted_content"), "{text}");
        // Thinking blocks never carry a breakpoint, so the message that holds only one has none.
        assert!(
            body["messages"][7]["content"][0]
                .get("cache_control")
                .is_none()
        );
    }

    #[test]
    fn cache_breakpoints_sit_on_tools_system_and_the_two_newest_user_turns() {
        let mut asked = request(vec![
            system("sys"),
            user("one"),
            assistant(Some("a1"), &[], None),
            user("two"),
            assistant(Some("a2"), &[("c1", "{}")], None),
            tool("c1", "r1"),
        ]);
        asked.tools = vec![read_file(), read_file()].into();
        let body = request_body(&asked, None);
        let ephemeral = json!({"type": "ephemeral"});
        assert_eq!(breakpoints(&body), MAX_CACHE_BREAKPOINTS);
        assert!(body["tools"][0].get("cache_control").is_none());
        assert_eq!(body["tools"][1]["cache_control"], ephemeral);
        assert_eq!(body["system"][0]["cache_control"], ephemeral);
        let messages = &body["messages"];
        assert_eq!(messages[4]["content"][0]["cache_control"], ephemeral);
        assert_eq!(messages[2]["content"][0]["cache_control"], ephemeral);
        assert!(messages[0]["content"][0].get("cache_control").is_none());
        assert!(messages[3]["content"][0].get("cache_control").is_none());

        // Fewer places, fewer breakpoints; never more than four whatever the shape.
        let bare = request_body(&request(vec![user("only")]), None);
        assert_eq!(breakpoints(&bare), 1);
        assert_eq!(
            bare["messages"][0]["content"][0]["cache_control"],
            ephemeral
        );
        for length in 0..12 {
            let mut messages = vec![system("s")];
            for turn in 0..length {
                messages.push(user(&format!("u{turn}")));
                messages.push(assistant(Some("a"), &[("c", "{}")], None));
                messages.push(tool("c", "r"));
            }
            let mut asked = request(messages);
            asked.tools = vec![read_file()].into();
            assert!(breakpoints(&request_body(&asked, None)) <= MAX_CACHE_BREAKPOINTS);
        }
    }

    #[test]
    fn reasoning_effort_turns_thinking_on_with_room_for_the_answer() {
        for (effort, budget, asked_cap, cap) in [
            ("low", 1024, 0, 4096),
            ("medium", 4096, 0, 4096 + 1024),
            ("high", 16_384, 32_000, 32_000),
            ("high", 16_384, 2000, 16_384 + 1024),
            ("extreme", 4096, 8000, 8000),
        ] {
            let mut asked = request(vec![user("think")]);
            asked.max_tokens = asked_cap;
            asked.reasoning_effort = Some(effort.into());
            let body = request_body(&asked, None);
            assert_eq!(
                body["thinking"],
                json!({"type": "enabled", "budget_tokens": budget}),
                "{effort}"
            );
            assert_eq!(body["max_tokens"], cap, "{effort} {asked_cap}");
        }
    }

    #[test]
    fn thinking_waits_while_a_tool_loop_begun_without_it_is_open() {
        let signed = Reasoning {
            kind: ProviderKind::Anthropic,
            text: String::new(),
            items: vec![thinking("sig-1")],
        };
        let effort = |messages| {
            let mut asked = request(messages);
            asked.reasoning_effort = Some("low".into());
            request_body(&asked, None)["thinking"].clone()
        };
        let on = json!({"type": "enabled", "budget_tokens": 1024});
        // A loop another provider kind began (its reasoning is never sent here): no thinking
        // until the user speaks again.
        let chat = Some(Reasoning::chat("chat reasoning"));
        assert_eq!(
            effort(vec![
                user("go"),
                assistant(None, &[("c1", "{}")], chat.clone()),
                tool("c1", "ok")
            ]),
            Value::Null
        );
        assert_eq!(
            effort(vec![
                user("go"),
                assistant(None, &[("c1", "{}")], None),
                tool("c1", "ok")
            ]),
            Value::Null
        );
        assert_eq!(
            effort(vec![
                user("go"),
                assistant(None, &[("c1", "{}")], chat),
                tool("c1", "ok"),
                assistant(Some("Done."), &[], None),
                user("next"),
            ]),
            on
        );
        // A loop that thought as it began thinks on.
        assert_eq!(
            effort(vec![
                user("go"),
                assistant(None, &[("c1", "{}")], Some(signed)),
                tool("c1", "ok")
            ]),
            on
        );
    }

    #[test]
    fn images_are_base64_blocks_before_the_text() {
        let image = crate::llm::ImageData {
            mime: "image/png".into(),
            data: "iVBORw0K".into(),
        };
        let body = request_body(
            &request(vec![ChatMessage::User {
                content: "what is this?".into(),
                images: vec![image],
            }]),
            Some("claude-x"),
        );
        let content = without_cache_control(body["messages"][0]["content"].clone());
        assert_eq!(
            content,
            json!([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
                {"type": "text", "text": "what is this?"},
            ])
        );
    }
}
