//! The OpenAI-compatible provider against the scripted mock server: streaming, tool-call
//! assembly, the wire request, retries, failure mapping, cancellation and key handling.

use std::sync::Arc;
use std::time::Duration;

use agentd::config::{LlmConfig, Secret};
use agentd::llm::openai::{OpenAiOptions, OpenAiProvider};
use agentd::llm::{
    ChatMessage, ChatRequest, ChatResponse, Delta, LlmError, Provider, ToolCall, Usage,
};
use agentd::tools::ToolSpec;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::support::WAIT;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// Short backoff so retry tests take milliseconds.
fn fast() -> OpenAiOptions {
    OpenAiOptions {
        backoff_base: Duration::from_millis(5),
        backoff_cap: Duration::from_millis(20),
        ..OpenAiOptions::default()
    }
}

fn llm_config(base_url: &str, key: Option<&str>) -> LlmConfig {
    LlmConfig {
        base_url: Some(base_url.to_string()),
        model: Some("test-model".into()),
        api_key: key.map(Secret::new),
        ..LlmConfig::default()
    }
}

fn provider(mock: &MockLlm, options: OpenAiOptions) -> OpenAiProvider {
    OpenAiProvider::with_options(&llm_config(&mock.base_url(), None), options).unwrap()
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest {
        model: "test-model".into(),
        messages: vec![
            ChatMessage::System {
                content: "Be brief.".into(),
            },
            ChatMessage::User {
                content: text.into(),
                images: Vec::new(),
            },
        ],
        tools: Vec::new().into(),
        max_tokens: 256,
        reasoning_effort: None,
    }
}

/// Runs one call, collecting the deltas concurrently; fails the test if it takes too long.
async fn call(
    provider: &OpenAiProvider,
    request: ChatRequest,
) -> (Result<ChatResponse, LlmError>, Vec<String>) {
    let (deltas, mut receiver) = mpsc::channel(8);
    let collect = async move {
        let mut seen = Vec::new();
        while let Some(delta) = receiver.recv().await {
            if let Delta::Text(text) = delta {
                seen.push(text);
            }
        }
        seen
    };
    let run = provider.stream_chat(request, deltas, CancellationToken::new());
    tokio::time::timeout(WAIT, async { tokio::join!(run, collect) })
        .await
        .expect("the call ends in time")
}

#[tokio::test]
async fn text_streams_in_pieces_in_order_and_usage_is_taken() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["Hel", "lo, ", "wor", "ld"]).with_usage(12, 4),
    ]))
    .await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["Hel", "lo, ", "wor", "ld"]);
    assert_eq!(response.text, "Hello, world");
    assert!(response.tool_calls.is_empty());
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        response.usage,
        Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 4,
            cached_tokens: 0,
            cache_write_tokens: 0,
        })
    );
}

#[tokio::test]
async fn a_stream_without_usage_answers_none() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::text(&["ok"]).without_usage()])).await;
    let (result, _) = call(&provider(&mock, fast()), ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "ok");
    assert_eq!(response.usage, None);
}

#[tokio::test]
async fn interleaved_tool_call_fragments_are_joined_by_index() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::tool_calls_interleaved(vec![
        ScriptedCall::new("call_a", "read_file", &["{\"pa", "th\":", "\"a.txt\"}"]),
        ScriptedCall::new("call_b", "grep", &["{\"pattern\"", ":\"x\"}"]),
    ])]))
    .await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("look")).await;
    let response = result.unwrap();
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(response.text, "");
    assert!(
        response.first_token.is_some(),
        "a tool call's fragment is a first token"
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read_file".into(),
                arguments: "{\"path\":\"a.txt\"}".into(),
            },
            ToolCall {
                id: "call_b".into(),
                name: "grep".into(),
                arguments: "{\"pattern\":\"x\"}".into(),
            },
        ]
    );
    for call in &response.tool_calls {
        serde_json::from_str::<Value>(&call.arguments).expect("arguments are whole JSON");
    }
}

#[tokio::test]
async fn text_and_tool_calls_arrive_together() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::text_then_tool_calls(
        &["Let me ", "check."],
        vec![ScriptedCall::whole(
            "call_1",
            "list_dir",
            &json!({"path": "."}),
        )],
    )]))
    .await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("look")).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["Let me ", "check."]);
    assert_eq!(response.text, "Let me check.");
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(response.tool_calls[0].name, "list_dir");
    assert_eq!(response.tool_calls[0].arguments, r#"{"path":"."}"#);
}

#[tokio::test]
async fn the_request_body_carries_the_conversation_tools_and_limits() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["done"]),
        Reply::text(&["again"]),
    ]))
    .await;
    let provider = provider(&mock, fast());
    let read_schema = json!({
        "type": "object",
        "properties": {"path": {"type": "string", "description": "File to read."}},
        "required": ["path"],
        "additionalProperties": false
    });
    let grep_schema = json!({
        "type": "object",
        "properties": {"pattern": {"type": "string", "description": "What to find."}},
        "required": ["pattern"]
    });
    let request = ChatRequest {
        model: "test-model".into(),
        messages: vec![
            ChatMessage::System {
                content: "You are a test.".into(),
            },
            ChatMessage::User {
                content: "Read a.txt and find x".into(),
                images: Vec::new(),
            },
            ChatMessage::Assistant {
                reasoning: None,
                content: Some("Looking.".into()),
                tool_calls: vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "read_file".into(),
                        arguments: r#"{"path":"a.txt"}"#.into(),
                    },
                    ToolCall {
                        id: "call_2".into(),
                        name: "grep".into(),
                        arguments: r#"{"pattern":"x"}"#.into(),
                    },
                ],
            },
            ChatMessage::Tool {
                tool_call_id: "call_1".into(),
                content: "contents of a".into(),
            },
            ChatMessage::Tool {
                tool_call_id: "call_2".into(),
                content: "a.txt:1:x".into(),
            },
        ],
        tools: vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Reads a file.".into(),
                input_schema: read_schema.clone().into(),
            },
            ToolSpec {
                name: "grep".into(),
                description: "Searches files.".into(),
                input_schema: grep_schema.clone().into(),
            },
        ]
        .into(),
        max_tokens: 777,
        reasoning_effort: None,
    };
    let (result, _) = call(&provider, request).await;
    result.unwrap();

    let bodies = mock.requests();
    let body = &bodies[0];
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(body["max_tokens"], 777);
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(
        body["tools"],
        json!([
            {"type": "function", "function": {"name": "read_file", "description": "Reads a file.", "parameters": read_schema}},
            {"type": "function", "function": {"name": "grep", "description": "Searches files.", "parameters": grep_schema}},
        ])
    );
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(messages[0]["content"], "You are a test.");
    assert_eq!(messages[1]["content"], "Read a.txt and find x");
    assert_eq!(messages[2]["content"], "Looking.");
    assert_eq!(
        messages[2]["tool_calls"],
        json!([
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "grep", "arguments": "{\"pattern\":\"x\"}"}},
        ])
    );
    assert_eq!(messages[3]["tool_call_id"], "call_1");
    assert_eq!(messages[3]["content"], "contents of a");
    assert_eq!(messages[4]["tool_call_id"], "call_2");
    assert_eq!(messages[4]["content"], "a.txt:1:x");

    // Without tools, neither `tools` nor `tool_choice` is sent.
    let (result, _) = call(&provider, ask("plain")).await;
    result.unwrap();
    let second = &mock.requests()[1];
    assert!(second.get("tools").is_none(), "{second}");
    assert!(second.get("tool_choice").is_none(), "{second}");
    assert_eq!(second["max_tokens"], 256);
}

#[tokio::test]
async fn a_500_is_retried_and_the_retry_answers() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::status(500),
        Reply::text(&["recovered"]),
    ]))
    .await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("hi")).await;
    assert_eq!(result.unwrap().text, "recovered");
    assert_eq!(deltas, ["recovered"]);
    assert_eq!(mock.requests().len(), 2);
    assert_eq!(mock.requests()[0], mock.requests()[1]);
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_rather_than_the_backoff() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::status_retry_after(429, 0),
        Reply::text(&["ok"]),
    ]))
    .await;
    // A backoff this long would outlast the test's wait: only Retry-After: 0 lets it pass.
    let slow = OpenAiOptions {
        backoff_base: Duration::from_secs(600),
        backoff_cap: Duration::from_secs(600),
        ..OpenAiOptions::default()
    };
    let (result, _) = call(&provider(&mock, slow), ask("hi")).await;
    assert_eq!(result.unwrap().text, "ok");
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn retry_after_is_capped() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::status_retry_after(503, 3600),
        Reply::text(&["ok"]),
    ]))
    .await;
    let capped = OpenAiOptions {
        retry_after_cap: Duration::from_millis(10),
        ..fast()
    };
    let (result, _) = call(&provider(&mock, capped), ask("hi")).await;
    assert_eq!(result.unwrap().text, "ok");
}

#[tokio::test]
async fn persistent_5xx_is_unavailable_after_the_retries() {
    let mock = MockLlm::start(Script::always(Reply::status(503))).await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("hi")).await;
    match result {
        Err(LlmError::Unavailable(text)) => assert!(text.contains("503"), "{text}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(deltas.is_empty());
    assert_eq!(mock.requests().len(), 4, "one attempt and three retries");
}

#[tokio::test]
async fn persistent_429_is_rate_limited_after_the_retries() {
    let mock = MockLlm::start(Script::always(Reply::status_retry_after(429, 0))).await;
    let options = OpenAiOptions {
        max_retries: 2,
        ..fast()
    };
    let (result, _) = call(&provider(&mock, options), ask("hi")).await;
    let error = result.unwrap_err();
    assert!(matches!(error, LlmError::RateLimited(_)), "{error:?}");
    assert_eq!(error.kind(), "llm_rate_limited");
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let provider = OpenAiProvider::with_options(
        &llm_config(&format!("http://{addr}/v1"), None),
        OpenAiOptions {
            max_retries: 1,
            ..fast()
        },
    )
    .unwrap();
    let (result, _) = call(&provider, ask("hi")).await;
    let error = result.unwrap_err();
    assert!(matches!(error, LlmError::Unavailable(_)), "{error:?}");
    assert_eq!(error.kind(), "llm_unavailable");
    // An operator must see where the server tried to go.
    let text = error.to_string();
    assert!(text.contains(&format!("http://{addr}/v1")), "{text}");
}

#[tokio::test]
async fn a_cut_stream_is_a_bad_response_and_is_not_retried() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::cut(&["partial ", "answ"]),
        Reply::text(&["must not be asked for"]),
    ]))
    .await;
    let (result, deltas) = call(&provider(&mock, fast()), ask("hi")).await;
    match result {
        Err(LlmError::BadResponse(text)) => assert!(text.contains("broke off"), "{text}"),
        other => panic!("expected BadResponse, got {other:?}"),
    }
    assert_eq!(deltas, ["partial ", "answ"]);
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_stream_ending_without_done_is_a_bad_response() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::truncated(&["half"])])).await;
    let (result, _) = call(&provider(&mock, fast()), ask("hi")).await;
    match result {
        Err(LlmError::BadResponse(text)) => assert!(text.contains("[DONE]"), "{text}"),
        other => panic!("expected BadResponse, got {other:?}"),
    }
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_malformed_chunk_is_a_bad_response() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::raw_sse(
        "data: {\"choices\": [oops\n\ndata: [DONE]\n\n",
    )]))
    .await;
    let (result, _) = call(&provider(&mock, fast()), ask("hi")).await;
    let error = result.unwrap_err();
    assert!(matches!(error, LlmError::BadResponse(_)), "{error:?}");
    assert_eq!(error.kind(), "llm_bad_response");
}

#[tokio::test]
async fn context_overflow_is_recognised_in_openai_and_vllm_wordings() {
    let vllm = Reply::error(
        400,
        json!({"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.", "type": "BadRequestError", "param": null, "code": 400}),
    );
    let mock = MockLlm::start(Script::sequence(vec![Reply::context_overflow(), vllm])).await;
    let provider = provider(&mock, fast());
    for _ in 0..2 {
        let (result, _) = call(&provider, ask("hi")).await;
        let error = result.unwrap_err();
        assert!(matches!(error, LlmError::ContextOverflow(_)), "{error:?}");
        assert_eq!(error.kind(), "context_overflow");
    }
    assert_eq!(mock.requests().len(), 2, "no retries");
}

#[tokio::test]
async fn refused_credentials_are_unauthorized_and_not_retried() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::error(
            401,
            json!({"error": {"message": "Incorrect API key provided: sk-echoed-secret", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
        Reply::status(403),
    ]))
    .await;
    let provider = OpenAiProvider::with_options(
        &llm_config(&mock.base_url(), Some("sk-echoed-secret")),
        fast(),
    )
    .unwrap();
    for _ in 0..2 {
        let (result, _) = call(&provider, ask("hi")).await;
        match result {
            Err(LlmError::Unauthorized(text)) => {
                assert!(!text.contains("sk-echoed-secret"), "{text}")
            }
            other => panic!("expected Unauthorized, got {other:?}"),
        }
    }
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn other_client_errors_are_bad_responses_without_retry() {
    let mock = MockLlm::start(Script::always(Reply::status(404))).await;
    let (result, _) = call(&provider(&mock, fast()), ask("hi")).await;
    let error = result.unwrap_err();
    assert!(matches!(error, LlmError::BadResponse(_)), "{error:?}");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn cancelling_while_the_stream_is_held_answers_cancelled_at_once() {
    let gate = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![Reply::hold(
        &["first"],
        gate.clone(),
        &["second"],
    )]))
    .await;
    let provider = Arc::new(provider(&mock, fast()));
    let (deltas, mut receiver) = mpsc::channel(8);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let provider = provider.clone();
        let cancel = cancel.clone();
        async move { provider.stream_chat(ask("hi"), deltas, cancel).await }
    });
    let first = tokio::time::timeout(WAIT, receiver.recv()).await.unwrap();
    assert_eq!(first, Some(Delta::Text("first".into())));
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("cancellation is prompt")
        .unwrap();
    assert_eq!(result, Err(LlmError::Cancelled));
    assert_eq!(LlmError::Cancelled.kind(), "interrupted");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_held_stream_goes_on_when_released() {
    let gate = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![Reply::hold(
        &["first "],
        gate.clone(),
        &["second"],
    )]))
    .await;
    let provider = provider(&mock, fast());
    let (deltas, mut receiver) = mpsc::channel(8);
    let started = std::time::Instant::now();
    let run = provider.stream_chat(ask("hi"), deltas, CancellationToken::new());
    let drive = async {
        let first = receiver.recv().await;
        let released_after = started.elapsed();
        gate.notify_one();
        let mut rest = Vec::new();
        while let Some(delta) = receiver.recv().await {
            rest.push(delta);
        }
        (first, rest, released_after)
    };
    let (result, (first, rest, released_after)) =
        tokio::time::timeout(WAIT, async { tokio::join!(run, drive) })
            .await
            .unwrap();
    assert_eq!(first, Some(Delta::Text("first ".into())));
    assert_eq!(rest, [Delta::Text("second".into())]);
    let answer = result.unwrap();
    assert_eq!(answer.text, "first second");
    // The first fragment is timed when it came, not when the answer ended.
    let first_token = answer.first_token.expect("a fragment streamed");
    assert!(
        first_token <= released_after,
        "{first_token:?} after the gate opened at {released_after:?}"
    );
}

#[tokio::test]
async fn cancelling_during_a_backoff_answers_cancelled_at_once() {
    let mock = MockLlm::start(Script::always(Reply::status_retry_after(503, 30))).await;
    let options = OpenAiOptions {
        retry_after_cap: Duration::from_secs(30),
        ..fast()
    };
    let provider = Arc::new(provider(&mock, options));
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let provider = provider.clone();
        let cancel = cancel.clone();
        async move {
            let (deltas, _receiver) = mpsc::channel(8);
            provider.stream_chat(ask("hi"), deltas, cancel).await
        }
    });
    mock.wait_for_requests(1, WAIT).await;
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("cancellation is prompt")
        .unwrap();
    assert_eq!(result, Err(LlmError::Cancelled));
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn an_already_cancelled_call_sends_nothing() {
    let mock = MockLlm::start(Script::always(Reply::text(&["x"]))).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let (deltas, _receiver) = mpsc::channel(8);
    let result = provider(&mock, fast())
        .stream_chat(ask("hi"), deltas, cancel)
        .await;
    assert_eq!(result, Err(LlmError::Cancelled));
    assert_eq!(mock.requests().len(), 0);
}

#[tokio::test]
async fn the_key_is_sent_as_a_bearer_header_and_never_shown() {
    let mock = MockLlm::start(Script::always(Reply::text(&["ok"]))).await;
    let secret = "sk-test-secret-0123456789";
    let keyed =
        OpenAiProvider::with_options(&llm_config(&mock.base_url(), Some(secret)), fast()).unwrap();
    let (result, _) = call(&keyed, ask("hi")).await;
    result.unwrap();
    let shown = format!("{keyed:?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("[redacted]"), "{shown}");

    // Local servers often need no key: then no Authorization header at all.
    let keyless = provider(&mock, fast());
    let (result, _) = call(&keyless, ask("hi")).await;
    result.unwrap();

    let recorded = mock.recorded();
    assert_eq!(
        recorded[0].headers.get("authorization").unwrap(),
        &format!("Bearer {secret}")
    );
    assert!(recorded[1].headers.get("authorization").is_none());
    assert_eq!(
        recorded[0].headers.get("accept").unwrap(),
        "text/event-stream"
    );
}

#[tokio::test]
async fn a_routed_script_answers_by_conversation() {
    let mock = MockLlm::start(Script::route(|body| {
        let first_user = body["messages"]
            .as_array()
            .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        match first_user.as_str() {
            "alpha" => Reply::text(&["A"]),
            _ => Reply::text(&["B"]),
        }
    }))
    .await;
    let provider = provider(&mock, fast());
    let ((beta, _), (alpha, _)) =
        tokio::join!(call(&provider, ask("beta")), call(&provider, ask("alpha")));
    assert_eq!(beta.unwrap().text, "B");
    assert_eq!(alpha.unwrap().text, "A");
    mock.wait_for_requests(2, WAIT).await;
}
