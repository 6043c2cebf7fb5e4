//! The Anthropic Messages adapter against a scripted server speaking its documented stream.

use std::time::Duration;

use agentd::config::{LlmConfig, Secret};
use agentd::llm::anthropic::AnthropicProvider;
use agentd::llm::openai::OpenAiOptions;
use agentd::llm::{
    ChatMessage, ChatRequest, ChatResponse, Delta, LlmError, Provider, ProviderKind, ToolCall,
    Usage,
};
use agentd::tools::ToolSpec;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::WAIT;
use crate::support::mock_llm::{MockLlm, Reply, Script};

const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";
const THOUGHT: &str = "The user wants a.txt; I will read it.";

/// Short backoff so a retry costs milliseconds.
fn fast() -> OpenAiOptions {
    OpenAiOptions {
        backoff_base: Duration::from_millis(5),
        backoff_cap: Duration::from_millis(20),
        ..OpenAiOptions::default()
    }
}

fn provider(mock: &MockLlm, key: Option<&str>) -> AnthropicProvider {
    let config = LlmConfig {
        base_url: Some(mock.base_url()),
        model: Some("claude-test".into()),
        api_key: key.map(Secret::new),
        ..LlmConfig::default()
    };
    AnthropicProvider::with_options(&config, fast()).unwrap()
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest {
        model: String::new(),
        messages: vec![
            ChatMessage::System {
                content: "Be brief.".into(),
            },
            ChatMessage::User {
                content: text.into(),
                images: Vec::new(),
            },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        }]
        .into(),
        max_tokens: 256,
        reasoning_effort: None,
    }
}

/// An SSE body of these events, each named by its `type` as Anthropic names them.
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

fn message_start(usage: Value) -> Value {
    json!({"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "stop_reason": null, "stop_sequence": null, "usage": usage,
    }})
}

fn block_start(index: u64, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn block_delta(index: u64, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn block_stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn message_end(stop_reason: &str, output_tokens: u64) -> [Value; 2] {
    [
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
        json!({"type": "message_stop"}),
    ]
}

/// Thinking with its signature, then a call to `read_file` whose input streams in pieces.
fn think_then_call() -> String {
    let mut events = vec![
        message_start(json!({"input_tokens": 50, "output_tokens": 1})),
        block_start(
            0,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
        ),
        json!({"type": "ping"}),
        block_delta(
            0,
            json!({"type": "thinking_delta", "thinking": &THOUGHT[..10]}),
        ),
        block_delta(
            0,
            json!({"type": "thinking_delta", "thinking": &THOUGHT[10..]}),
        ),
        block_delta(
            0,
            json!({"type": "signature_delta", "signature": SIGNATURE}),
        ),
        block_stop(0),
        block_start(
            1,
            json!({"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {}}),
        ),
        block_delta(1, json!({"type": "input_json_delta", "partial_json": ""})),
        block_delta(
            1,
            json!({"type": "input_json_delta", "partial_json": "{\"path\": "}),
        ),
        block_delta(
            1,
            json!({"type": "input_json_delta", "partial_json": "\"a.txt\"}"}),
        ),
        block_stop(1),
    ];
    events.extend(message_end("tool_use", 40));
    sse(&events)
}

/// A text answer in these pieces.
fn text(pieces: &[&str]) -> String {
    let mut events = vec![
        message_start(json!({"input_tokens": 80, "output_tokens": 1})),
        block_start(0, json!({"type": "text", "text": ""})),
    ];
    for piece in pieces {
        events.push(block_delta(0, json!({"type": "text_delta", "text": piece})));
    }
    events.push(block_stop(0));
    events.extend(message_end("end_turn", 7));
    sse(&events)
}

/// Runs one call, collecting every delta; fails the test if it takes too long.
async fn call(
    provider: &AnthropicProvider,
    request: ChatRequest,
) -> (Result<ChatResponse, LlmError>, Vec<Delta>) {
    let (deltas, mut receiver) = mpsc::channel(8);
    let collect = async move {
        let mut seen = Vec::new();
        while let Some(delta) = receiver.recv().await {
            seen.push(delta);
        }
        seen
    };
    let run = provider.stream_chat(request, deltas, CancellationToken::new());
    tokio::time::timeout(WAIT, async { tokio::join!(run, collect) })
        .await
        .expect("the call ends in time")
}

fn count_cache_control(body: &Value) -> usize {
    body.to_string().matches("\"cache_control\"").count()
}

#[tokio::test]
async fn thinking_goes_back_signed_and_first_with_the_tool_call_it_preceded() {
    // Like Anthropic, the mock refuses a tool-use turn whose thinking did not come back as
    // it was sent.
    let mock = MockLlm::start(Script::route(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.len() == 1 {
            return Reply::raw_sse(&think_then_call());
        }
        let first = &messages[1]["content"][0];
        if *first != json!({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}) {
            return Reply::error(
                400,
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "thinking block signature missing"}}),
            );
        }
        Reply::raw_sse(&text(&["a.txt says ", "hello."]))
    }))
    .await;
    let provider = provider(&mock, Some("sk-ant-test"));
    let mut request = ask("What is in a.txt?");
    request.reasoning_effort = Some("low".into());

    let (first, deltas) = call(&provider, request.clone()).await;
    let first = first.unwrap();
    assert_eq!(
        deltas,
        vec![
            Delta::Reasoning(THOUGHT[..10].into()),
            Delta::Reasoning(THOUGHT[10..].into()),
        ]
    );
    assert_eq!(first.text, "");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        first.tool_calls,
        vec![ToolCall {
            id: "toolu_01".into(),
            name: "read_file".into(),
            arguments: r#"{"path": "a.txt"}"#.into(),
        }]
    );
    let reasoning = first.reasoning.clone().expect("the thinking is kept");
    assert_eq!(reasoning.kind, ProviderKind::Anthropic);
    assert_eq!(reasoning.text, THOUGHT);

    request.messages.push(ChatMessage::Assistant {
        content: (!first.text.is_empty()).then(|| first.text.clone()),
        tool_calls: first.tool_calls.clone(),
        reasoning: first.reasoning.clone(),
    });
    request.messages.push(ChatMessage::Tool {
        tool_call_id: "toolu_01".into(),
        content: "hello.".into(),
    });
    let (second, deltas) = call(&provider, request).await;
    let second = second.unwrap();
    assert_eq!(second.text, "a.txt says hello.");
    assert_eq!(second.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        deltas,
        vec![
            Delta::Text("a.txt says ".into()),
            Delta::Text("hello.".into())
        ]
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0]["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(requests[0]["max_tokens"], 1024 + 1024);
    assert_eq!(requests[1]["model"], "claude-test");
    assert_eq!(
        requests[1]["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
            {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a.txt"}},
        ]})
    );
    assert_eq!(
        requests[1]["messages"][2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "hello.", "cache_control": {"type": "ephemeral"}},
        ]})
    );
}

#[tokio::test]
async fn the_key_goes_in_x_api_key_with_the_api_version() {
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&text(&["ok"])))).await;
    let (result, _) = call(&provider(&mock, Some("sk-ant-test")), ask("hi")).await;
    assert_eq!(result.unwrap().text, "ok");
    let (result, _) = call(&provider(&mock, None), ask("hi")).await;
    assert_eq!(result.unwrap().text, "ok");

    let recorded = mock.recorded();
    let headers = &recorded[0].headers;
    assert_eq!(headers.get("x-api-key").unwrap(), "sk-ant-test");
    assert_eq!(headers.get("anthropic-version").unwrap(), "2023-06-01");
    assert!(headers.get("authorization").is_none());
    assert_eq!(headers.get("accept").unwrap(), "text/event-stream");
    let keyless = &recorded[1].headers;
    assert!(keyless.get("x-api-key").is_none());
    assert_eq!(keyless.get("anthropic-version").unwrap(), "2023-06-01");
}

#[tokio::test]
async fn a_stream_cut_before_the_model_finished_is_a_bad_response() {
    let cut = sse(&[
        message_start(json!({"input_tokens": 5, "output_tokens": 1})),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "half an ans"})),
    ]);
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&cut))).await;
    let (result, deltas) = call(&provider(&mock, None), ask("hi")).await;
    match result {
        Err(LlmError::BadResponse(text)) => {
            assert!(
                text.contains("no message_stop and no stop_reason"),
                "{text}"
            )
        }
        other => panic!("expected BadResponse, got {other:?}"),
    }
    assert_eq!(deltas, vec![Delta::Text("half an ans".into())]);
    assert_eq!(
        mock.request_count(),
        1,
        "a stream that began is not retried"
    );
}

#[tokio::test]
async fn a_stream_whose_stop_reason_came_stands_without_message_stop() {
    let mut events = vec![
        message_start(json!({"input_tokens": 5, "output_tokens": 1})),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "done"})),
        block_stop(0),
    ];
    events.push(message_end("max_tokens", 3)[0].clone());
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&sse(&events)))).await;
    let (result, _) = call(&provider(&mock, None), ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "done");
    assert_eq!(response.finish_reason.as_deref(), Some("length"));
}

#[tokio::test]
async fn cache_reads_and_writes_count_as_prompt_tokens() {
    let mut events = vec![
        message_start(json!({
            "input_tokens": 20,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 300,
            "output_tokens": 1,
        })),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "ok"})),
        block_stop(0),
    ];
    events.extend(message_end("end_turn", 42));
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&sse(&events)))).await;
    let (result, _) = call(&provider(&mock, None), ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(
        response.usage,
        Some(Usage {
            prompt_tokens: 20 + 1000 + 300,
            completion_tokens: 42,
            cached_tokens: 1000,
            cache_write_tokens: 300,
        })
    );
    assert!(response.first_token.is_some());
}

#[tokio::test]
async fn no_request_carries_more_than_four_cache_breakpoints() {
    let mock = MockLlm::start(Script::route(|body| {
        let turns = body["messages"].as_array().map_or(0, Vec::len);
        if turns % 4 == 1 {
            Reply::raw_sse(&think_then_call())
        } else {
            Reply::raw_sse(&text(&["noted"]))
        }
    }))
    .await;
    let provider = provider(&mock, None);
    let mut request = ask("start");
    for round in 0..6 {
        let (result, _) = call(&provider, request.clone()).await;
        let response = result.unwrap();
        request.messages.push(ChatMessage::Assistant {
            content: (!response.text.is_empty()).then(|| response.text.clone()),
            tool_calls: response.tool_calls.clone(),
            reasoning: response.reasoning.clone(),
        });
        if response.tool_calls.is_empty() {
            request.messages.push(ChatMessage::User {
                content: format!("round {round}"),
                images: Vec::new(),
            });
        } else {
            for call in &response.tool_calls {
                request.messages.push(ChatMessage::Tool {
                    tool_call_id: call.id.clone(),
                    content: "contents".into(),
                });
            }
        }
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), 6);
    for (number, body) in requests.iter().enumerate() {
        let count = count_cache_control(body);
        assert!(count <= 4, "request {number} has {count}: {body}");
        // The tools and the system prompt are the stable prefix every request caches.
        assert_eq!(
            body["tools"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert_eq!(
            body["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        let newest = body["messages"].as_array().unwrap().last().unwrap();
        let last_block = newest["content"].as_array().unwrap().last().unwrap();
        assert_eq!(last_block["cache_control"], json!({"type": "ephemeral"}));
    }
    assert_eq!(count_cache_control(&requests[5]), 4);
}

#[tokio::test]
async fn anthropic_errors_map_to_typed_failures() {
    let overloaded = sse(&[
        message_start(json!({"input_tokens": 5, "output_tokens": 1})),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::error(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
        ),
        Reply::error(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "tools.0: bad schema"}}),
        ),
        Reply::raw_sse(&overloaded),
    ]))
    .await;
    let provider = provider(&mock, None);
    let (result, _) = call(&provider, ask("hi")).await;
    assert!(
        matches!(&result, Err(LlmError::ContextOverflow(text)) if text.contains("prompt is too long")),
        "{result:?}"
    );
    let (result, _) = call(&provider, ask("hi")).await;
    assert!(
        matches!(&result, Err(LlmError::BadResponse(text)) if text.contains("tools.0: bad schema")),
        "{result:?}"
    );
    let (result, _) = call(&provider, ask("hi")).await;
    assert!(
        matches!(&result, Err(LlmError::Unavailable(text)) if text.contains("Overloaded")),
        "{result:?}"
    );
}
