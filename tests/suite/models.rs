//! Several providers: models named `<provider>/<model>`, a model per session (kept across a
//! restart) and per turn, `model/list`, and clear refusals for models nobody serves.

use agentd::config::{Config, ModelPrice, ProviderConfig};
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
        c.llm
            .pricing
            .insert("beta/b-large".into(), ModelPrice::new(3.0, 15.0));
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
