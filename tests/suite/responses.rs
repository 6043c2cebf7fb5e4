//! The Responses API adapter against a scripted server speaking its documented stream.

use std::time::Duration;

use agentd::config::{LlmConfig, Secret};
use agentd::llm::openai::OpenAiOptions;
use agentd::llm::responses::ResponsesProvider;
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

/// The reasoning item the model finishes with, to come back byte for byte.
fn reasoning_item() -> Value {
    json!({
        "type": "reasoning",
        "id": "rs_68b1f0d2a44c81a2b1e3",
        "summary": [{"type": "summary_text", "text": "**Reading the file**"}],
        "encrypted_content": "gAAAAABosfDUq3w-Xk9LrYd0opaque+ciphertext/only==",
    })
}

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

fn completed(usage: Value) -> Value {
    json!({"type": "response.completed", "response": {
        "id": "resp_68b1f0d2", "object": "response", "status": "completed",
        "output": [], "store": false, "usage": usage,
    }})
}

fn usage(input: u64, cached: u64, output: u64) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

/// A reasoning item with a streamed summary, then a `read_file` call in two fragments.
fn reasoning_then_call() -> String {
    let rs = "rs_68b1f0d2a44c81a2b1e3";
    let fc = "fc_68b1f0d3b7d481a2a9c1";
    sse(&[
        json!({"type":"response.created","response":{"id":"resp_68b1f0d2","status":"in_progress","output":[]}}),
        json!({"type":"response.output_item.added","output_index":0,"item":{"id":rs,"type":"reasoning","summary":[]}}),
        json!({"type":"response.reasoning_summary_part.added","item_id":rs,"output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}),
        json!({"type":"response.reasoning_summary_text.delta","item_id":rs,"output_index":0,"summary_index":0,"delta":"**Reading "}),
        json!({"type":"response.reasoning_summary_text.delta","item_id":rs,"output_index":0,"summary_index":0,"delta":"the file**"}),
        json!({"type":"response.reasoning_summary_text.done","item_id":rs,"output_index":0,"summary_index":0,"text":"**Reading the file**"}),
        json!({"type":"response.output_item.done","output_index":0,"item":reasoning_item()}),
        json!({"type":"response.output_item.added","output_index":1,"item":{"id":fc,"type":"function_call","status":"in_progress","arguments":"","call_id":"call_Kx81","name":"read_file"}}),
        json!({"type":"response.function_call_arguments.delta","item_id":fc,"output_index":1,"delta":"{\"path\":"}),
        json!({"type":"response.function_call_arguments.delta","item_id":fc,"output_index":1,"delta":"\"a.txt\"}"}),
        json!({"type":"response.function_call_arguments.done","item_id":fc,"output_index":1,"arguments":"{\"path\":\"a.txt\"}"}),
        json!({"type":"response.output_item.done","output_index":1,"item":{"id":fc,"type":"function_call","status":"completed","arguments":"{\"path\":\"a.txt\"}","call_id":"call_Kx81","name":"read_file"}}),
        completed(usage(320, 0, 96)),
    ])
}

/// A message streamed in these text pieces, then `response.completed` with this usage.
fn text_answer(pieces: &[&str], usage: Value) -> String {
    let msg = "msg_68b1f0d4c2e881a2";
    let mut events = vec![
        json!({"type":"response.output_item.added","output_index":0,"item":{"id":msg,"type":"message","status":"in_progress","role":"assistant","content":[]}}),
        json!({"type":"response.content_part.added","item_id":msg,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}),
    ];
    for piece in pieces {
        events.push(json!({"type":"response.output_text.delta","item_id":msg,"output_index":0,"content_index":0,"delta":piece}));
    }
    events.push(completed(usage));
    sse(&events)
}

fn provider(mock: &MockLlm, key: Option<&str>) -> ResponsesProvider {
    let config = LlmConfig {
        base_url: Some(mock.base_url()),
        model: Some("gpt-5-mini".into()),
        api_key: key.map(Secret::new),
        ..LlmConfig::default()
    };
    let options = OpenAiOptions {
        backoff_base: Duration::from_millis(5),
        backoff_cap: Duration::from_millis(20),
        ..OpenAiOptions::default()
    };
    ResponsesProvider::with_options(&config, options).unwrap()
}

fn ask(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest {
        model: String::new(),
        messages,
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file.".into(),
            input_schema: json!({"type":"object","properties":{"path":{"type":"string"}}}).into(),
        }]
        .into(),
        max_tokens: 1024,
        reasoning_effort: Some("low".into()),
    }
}

fn opening() -> Vec<ChatMessage> {
    vec![
        ChatMessage::System {
            content: "Be brief.".into(),
        },
        ChatMessage::User {
            content: "What is in a.txt?".into(),
            images: Vec::new(),
        },
    ]
}

/// Runs one call, collecting every delta concurrently; fails the test if it takes too long.
async fn call(
    provider: &ResponsesProvider,
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

/// Whether a follow-up body replays the first answer as the stateless API needs it.
fn replays_the_reasoning(body: &Value) -> bool {
    let expected = json!([
        {"type":"message","role":"user","content":[{"type":"input_text","text":"What is in a.txt?"}]},
        reasoning_item(),
        {"type":"function_call","call_id":"call_Kx81","name":"read_file","arguments":"{\"path\":\"a.txt\"}"},
        {"type":"function_call_output","call_id":"call_Kx81","output":"hello"},
    ]);
    body["store"] == json!(false)
        && body["include"] == json!(["reasoning.encrypted_content"])
        && body["input"] == expected
}

#[tokio::test]
async fn reasoning_items_come_back_unchanged_before_their_call_and_its_output() {
    let mock = MockLlm::start(Script::route(|body| {
        let answered = body["input"]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i["type"] == "function_call_output"));
        if !answered {
            Reply::raw_sse(&reasoning_then_call())
        } else if replays_the_reasoning(body) {
            Reply::raw_sse(&text_answer(&["It says hello."], usage(400, 320, 8)))
        } else {
            Reply::error(
                400,
                json!({"error":{"message":"reasoning item missing","type":"invalid_request_error"}}),
            )
        }
    }))
    .await;
    let provider = provider(&mock, None);

    let (first, _) = call(&provider, ask(opening())).await;
    let first = first.unwrap();
    assert_eq!(
        first.tool_calls,
        vec![ToolCall {
            id: "call_Kx81".into(),
            name: "read_file".into(),
            arguments: "{\"path\":\"a.txt\"}".into(),
        }]
    );
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    let reasoning = first.reasoning.clone().expect("the model reasoned");
    assert_eq!(reasoning.kind, ProviderKind::OpenAiResponses);
    assert_eq!(reasoning.text, "**Reading the file**");
    assert_eq!(reasoning.items, vec![reasoning_item()]);

    // The conversation as the agent loop continues it.
    let mut messages = opening();
    messages.push(ChatMessage::Assistant {
        content: (!first.text.is_empty()).then(|| first.text.clone()),
        tool_calls: first.tool_calls.clone(),
        reasoning: first.reasoning.clone(),
    });
    messages.push(ChatMessage::Tool {
        tool_call_id: "call_Kx81".into(),
        content: "hello".into(),
    });
    let (second, _) = call(&provider, ask(messages)).await;
    let second = second.expect("the mock accepted the replayed reasoning");
    assert_eq!(second.text, "It says hello.");
    assert_eq!(second.reasoning, None);

    let bodies = mock.requests();
    assert_eq!(bodies.len(), 2);
    assert!(replays_the_reasoning(&bodies[1]), "{}", bodies[1]);
    assert_eq!(bodies[0]["model"], "gpt-5-mini");
    assert_eq!(bodies[0]["stream"], true);
    assert_eq!(bodies[0]["instructions"], "Be brief.");
    assert_eq!(bodies[0]["max_output_tokens"], 1024);
    assert_eq!(
        bodies[0]["reasoning"],
        json!({"effort":"low","summary":"auto"})
    );
    assert_eq!(bodies[0]["tool_choice"], "auto");
    assert_eq!(bodies[0]["tools"][0]["name"], "read_file");
}

#[tokio::test]
async fn the_key_is_sent_as_a_bearer_token_to_the_responses_path() {
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&text_answer(
        &["ok"],
        usage(3, 0, 1),
    ))))
    .await;
    let provider = provider(&mock, Some("sk-test-123"));
    assert_eq!(
        provider.endpoint().as_str(),
        format!("{}/responses", mock.base_url())
    );
    let (result, _) = call(&provider, ask(opening())).await;
    assert_eq!(result.unwrap().text, "ok");
    let recorded = mock.recorded();
    assert_eq!(
        recorded[0].headers["authorization"].to_str().unwrap(),
        "Bearer sk-test-123"
    );
    assert!(!format!("{provider:?}").contains("sk-test-123"));
}

#[tokio::test]
async fn a_stream_without_response_completed_is_a_bad_response() {
    let cut = text_answer(&["Half an ans"], usage(3, 0, 1));
    let cut = cut
        .rsplit_once("event: response.completed")
        .expect("the fixture ends with response.completed")
        .0
        .to_string();
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&cut))).await;
    let (result, deltas) = call(&provider(&mock, None), ask(opening())).await;
    assert!(
        matches!(&result, Err(LlmError::BadResponse(text)) if text.contains("no response.completed")),
        "{result:?}"
    );
    assert_eq!(deltas, vec![Delta::Text("Half an ans".into())]);
    // Something had been read: no retry.
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn usage_with_cached_input_tokens_is_mapped() {
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&text_answer(
        &["cached"],
        usage(5_000, 4_608, 42),
    ))))
    .await;
    let (result, _) = call(&provider(&mock, None), ask(opening())).await;
    let response = result.unwrap();
    assert_eq!(
        response.usage,
        Some(Usage {
            prompt_tokens: 5_000,
            completion_tokens: 42,
            cached_tokens: 4_608,
            cache_write_tokens: 0,
        })
    );
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn text_and_reasoning_summary_stream_as_deltas() {
    let rs = "rs_68b1f0d5";
    let msg = "msg_68b1f0d6";
    let body = sse(&[
        json!({"type":"response.output_item.added","output_index":0,"item":{"id":rs,"type":"reasoning","summary":[]}}),
        json!({"type":"response.reasoning_summary_text.delta","item_id":rs,"output_index":0,"summary_index":0,"delta":"**Greeting**"}),
        json!({"type":"response.reasoning_summary_text.delta","item_id":rs,"output_index":0,"summary_index":1,"delta":"Say hi."}),
        json!({"type":"response.output_item.done","output_index":0,"item":{"id":rs,"type":"reasoning","summary":[{"type":"summary_text","text":"**Greeting**"},{"type":"summary_text","text":"Say hi."}],"encrypted_content":"gAAAA-enc=="}}),
        json!({"type":"response.output_item.added","output_index":1,"item":{"id":msg,"type":"message","status":"in_progress","role":"assistant","content":[]}}),
        json!({"type":"response.output_text.delta","item_id":msg,"output_index":1,"content_index":0,"delta":"Hel"}),
        json!({"type":"response.output_text.delta","item_id":msg,"output_index":1,"content_index":0,"delta":"lo!"}),
        completed(usage(7, 0, 30)),
    ]);
    let mock = MockLlm::start(Script::always(Reply::raw_sse(&body))).await;
    let (result, deltas) = call(&provider(&mock, None), ask(opening())).await;
    assert_eq!(
        deltas,
        vec![
            Delta::Reasoning("**Greeting**".into()),
            Delta::Reasoning("\n\nSay hi.".into()),
            Delta::Text("Hel".into()),
            Delta::Text("lo!".into()),
        ]
    );
    let response = result.unwrap();
    assert_eq!(response.text, "Hello!");
    assert!(response.first_token.is_some());
    let reasoning = response.reasoning.unwrap();
    assert_eq!(reasoning.text, "**Greeting**\n\nSay hi.");
    assert_eq!(reasoning.items.len(), 1);
    assert_eq!(reasoning.items[0]["encrypted_content"], "gAAAA-enc==");
}
