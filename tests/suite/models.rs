//! Several providers: models named `<provider>/<model>`, a model per session (kept across a
//! restart) and per turn, `model/list`, and clear refusals for models nobody serves.

use agentd::config::{Config, ModelCard, ModelPrice, ProviderConfig};
use agentd::llm::ProviderKind;
use serde_json::json;

use crate::suite::agent::run_turn;
use crate::support::mock_llm::{MockLlm, Reply, Script};
use crate::support::{TestApp, config_in};

fn provider(name: &str, mock: &MockLlm, models: &[&str]) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        kind: ProviderKind::OpenAiChat,
        base_url: mock.base_url(),
        api_key_env: None,
        models: models.iter().map(|m| m.to_string()).collect(),
        api_key: None,
    }
}

fn two_providers(alpha: &MockLlm, beta: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let (a, b) = (
        provider("alpha", alpha, &[]),
        provider("beta", beta, &["b-large", "b-small"]),
    );
    move |c: &mut Config| {
        c.llm.model = Some("alpha/a-default".into());
        c.llm.providers = vec![a, b];
        c.llm.pricing.insert(
            "beta/b-large".into(),
            ModelCard::priced(ModelPrice::new(3.0, 15.0)),
        );
    }
}

#[tokio::test]
async fn each_session_and_turn_reaches_the_provider_of_its_model_and_the_choice_survives_a_restart()
{
    let alpha = MockLlm::start(Script::always(Reply::text(&["from alpha"]))).await;
    let beta = MockLlm::start(Script::always(Reply::text(&["from beta"]))).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    two_providers(&alpha, &beta)(&mut config);
    let app = TestApp::start_in(dir, config.clone()).await;
    let mut ws = app.ws().await;

    // model/list: the default first, each listed model, prices where known.
    let list = ws.result("model/list", json!({})).await;
    assert_eq!(list["default"], "alpha/a-default");
    let ids: Vec<&str> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha/a-default", "beta/b-large", "beta/b-small"]);
    assert_eq!(list["models"][1]["kind"], "openai-chat");
    assert_eq!(list["models"][1]["priced"], true);
    assert_eq!(list["models"][1]["prices"]["output_per_mtok"], 15.0);
    assert_eq!(list["models"][2]["priced"], false);

    // A session that chose beta's model talks to beta with the bare id.
    let opened = ws
        .result(
            "session/open",
            json!({"model": "beta/b-large", "reasoning_effort": "high"}),
        )
        .await;
    assert_eq!(opened["model"], "beta/b-large");
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &session, "hi").await;
    assert_eq!(end["reason"], "completed", "{end}");
    assert_eq!(beta.requests()[0]["model"], "b-large");
    assert_eq!(beta.requests()[0]["reasoning_effort"], "high");
    assert_eq!(alpha.request_count(), 0);

    // One turn may pick another model; the next goes back to the session's.
    ws.result(
        "turn/start",
        json!({"session_id": session, "model": "alpha/a-other",
               "input": [{"kind": "text", "text": "once"}]}),
    )
    .await;
    ws.notification("turn/completed").await;
    assert_eq!(alpha.requests()[0]["model"], "a-other");
    // The cost rows say which model each call went to.
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let models: Vec<&str> = cost["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["beta/b-large", "alpha/a-other"], "{cost}");

    // Nobody serves these: each refusal names the choices.
    let (_, refused) = ws
        .call(
            "turn/start",
            json!({"session_id": session, "model": "beta/b-huge",
                   "input": [{"kind": "text", "text": "x"}]}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_params",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("beta/b-large, beta/b-small"), "{message}");
    let (_, refused) = ws.call("session/open", json!({"model": "gamma/x"})).await;
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("alpha, beta"), "{message}");
    let (_, refused) = ws
        .call(
            "session/open",
            json!({"model": "beta/b-small", "reasoning_effort": "maximal"}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_params",
        "{refused}"
    );

    // After a restart the session still uses the model it chose.
    drop(ws);
    let dir = app.stop().await;
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let reopened = ws
        .result("session/open", json!({"session_id": session}))
        .await;
    assert_eq!(reopened["model"], "beta/b-large");
    let (_, end) = run_turn(&mut ws, &session, "again").await;
    assert_eq!(end["reason"], "completed", "{end}");
    assert_eq!(beta.requests().last().unwrap()["model"], "b-large");
    assert_eq!(alpha.request_count(), 1);
}

#[tokio::test]
async fn an_anthropic_provider_runs_a_turn_with_its_reasoning_shown() {
    let stream = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Weighing it.\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let mock = MockLlm::start(Script::always(Reply::raw_sse(stream))).await;
    let mut anthropic = provider("an", &mock, &[]);
    anthropic.kind = ProviderKind::Anthropic;
    let app = TestApp::spawn_with(move |c| {
        c.llm.model = Some("an/claude-x".into());
        c.llm.providers = vec![anthropic];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "think").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let reasoning: Vec<&serde_json::Value> = notes
        .iter()
        .filter(|n| n["method"] == "reasoning/delta")
        .collect();
    assert_eq!(reasoning[0]["params"]["text"], "Weighing it.");
    let request = &mock.recorded()[0];
    assert_eq!(request.body["model"], "claude-x");
    assert!(request.headers.get("anthropic-version").is_some());
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["rows"][0]["model"], "an/claude-x");
    assert_eq!(cost["tokens_cached"], 90, "{cost}");
}

/// A 1×1 PNG.
const PIXEL_PNG: &[u8] = &[
    0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n', 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 0,
    0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f, 0x15, 0xc4, 0x89, 0, 0, 0, 13, b'I', b'D', b'A', b'T',
    0x78, 0x9c, 0x63, 0, 1, 0, 0, 5, 0, 1, 0x0d, 0x0a, 0x2d, 0xb4, 0, 0, 0, 0, b'I', b'E', b'N',
    b'D', 0xae, 0x42, 0x60, 0x82,
];

/// The `data:` URLs of the images in one chat request's user messages, in order.
fn image_urls(request: &serde_json::Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|part| part["type"] == "image_url")
        .map(|part| part["image_url"]["url"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn images_reach_the_model_inline_from_the_workspace_and_through_view_image() {
    use crate::support::mock_llm::ScriptedCall;
    use base64::Engine as _;
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["a pixel"]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "view_image",
            &json!({"path": "shots/pixel.png"}),
        )]),
        Reply::text(&["seen twice"]),
        Reply::text(&["still here"]),
    ]))
    .await;
    let vision = provider("p", &mock, &[]);
    let app = TestApp::spawn_with(move |c| {
        c.llm.model = Some("p/vision".into());
        c.llm.providers = vec![vision];
        c.llm.pricing.insert(
            "p/blind".into(),
            ModelCard {
                images: Some(false),
                ..ModelCard::default()
            },
        );
    })
    .await;
    std::fs::create_dir_all(app.workspace().join("shots")).unwrap();
    std::fs::write(app.workspace().join("shots/pixel.png"), PIXEL_PNG).unwrap();
    std::fs::write(app.workspace().join("notes.txt"), "not an image").unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(PIXEL_PNG);
    let url = format!("data:image/png;base64,{data}");
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let list = ws.result("model/list", json!({})).await;
    let blind = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "p/blind")
        .unwrap();
    assert_eq!(blind["images"], false, "{list}");

    // Inline: the image follows the text in the user message, as the chat API takes it.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [
            {"kind": "text", "text": "what is this?"},
            {"kind": "image", "mime": "image/png", "data": data},
        ]}),
    )
    .await;
    let end = ws.notification("turn/completed").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let first = &mock.requests()[0];
    let user = first["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(user["content"][0]["text"], "what is this?", "{user}");
    assert_eq!(image_urls(first), std::slice::from_ref(&url));

    // From the workspace, then once more through view_image: the stored history keeps the
    // first turn's image, and the tool's image follows the tool result.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "image", "path": "shots/pixel.png"}]}),
    )
    .await;
    let end = ws.notification("turn/completed").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let requests = mock.requests();
    assert_eq!(image_urls(&requests[1]), [url.clone(), url.clone()]);
    let last = &requests[2];
    assert_eq!(image_urls(last), [url.clone(), url.clone(), url.clone()]);
    let messages = last["messages"].as_array().unwrap();
    let tool_at = messages.iter().position(|m| m["role"] == "tool").unwrap();
    assert!(
        messages[tool_at]["content"]
            .as_str()
            .unwrap()
            .contains("image/png"),
        "{}",
        messages[tool_at]
    );
    assert_eq!(messages[tool_at + 1]["role"], "user");
    assert_eq!(
        messages[tool_at + 1]["content"][1]["image_url"]["url"],
        url.as_str()
    );
    let before = mock.request_count();

    // Refusals, each before the turn starts and naming what is wrong.
    let refusals = [
        (
            json!({"kind": "image", "mime": "image/png", "data": data}),
            Some("p/blind"),
            "takes no image input",
        ),
        (
            json!({"kind": "image", "mime": "image/svg+xml", "data": data}),
            None,
            "not one of",
        ),
        (
            json!({"kind": "image", "mime": "image/jpeg", "data": data}),
            None,
            "image/png image",
        ),
        (
            json!({"kind": "image", "mime": "image/png", "data": "%%%"}),
            None,
            "base64",
        ),
        (json!({"kind": "image"}), None, "either {mime, data}"),
        (
            json!({"kind": "image", "path": "notes.txt"}),
            None,
            "not a PNG",
        ),
        (
            json!({"kind": "image", "path": "../outside.png"}),
            None,
            "escapes",
        ),
        (
            json!({"kind": "image", "path": "missing.png"}),
            None,
            "does not exist",
        ),
    ];
    for (item, model, expected) in refusals {
        let mut params = json!({"session_id": session, "input": [item.clone()]});
        if let Some(model) = model {
            params["model"] = json!(model);
        }
        let (_, refused) = ws.call("turn/start", params).await;
        assert_eq!(
            refused["error"]["data"]["kind"], "invalid_params",
            "{item}: {refused}"
        );
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{item}: {message}");
    }
    let (_, refused) = ws
        .call(
            "turn/steer",
            json!({"session_id": session, "turn_id": "t", "input": [
                {"kind": "image", "mime": "image/png", "data": data}]}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_params",
        "{refused}"
    );
    assert_eq!(
        mock.request_count(),
        before,
        "a refused turn reached the model"
    );
    // The session is free for the next turn after every refusal.
    let (_, end) = run_turn(&mut ws, &session, "still here").await;
    assert_eq!(end["reason"], "completed", "{end}");
}
