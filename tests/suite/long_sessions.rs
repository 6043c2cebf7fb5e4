//! Long sessions: the loop breaker, the spend-rate guard, cached-token pricing, compaction and
//! the tool list's stability. The scripted model records every request, so the tests assert on
//! what it was told and when it was stopped.

use agentd::config::Config;
use serde_json::{Value, json};

use super::agent::{MODEL, run_turn, with_model};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// The content of a request's last message.
fn last_content(request: &Value) -> String {
    request["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_model_repeating_the_same_call_is_told_then_stopped() {
    let mock = MockLlm::start(Script::always(Reply::tool_calls(vec![
        ScriptedCall::whole("again", "read_file", &json!({"path": "same.txt"})),
    ])))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::write(app.workspace().join("same.txt"), "nothing new\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "read it").await;
    assert_eq!(end["reason"], "stuck_in_loop", "{end}");
    // Three in a row and the model is told; six and the turn ends.
    let requests = mock.requests();
    assert_eq!(requests.len(), 6);
    assert!(!last_content(&requests[2]).contains("[agentd]"));
    assert!(
        last_content(&requests[3]).contains("3 times in a row"),
        "{}",
        last_content(&requests[3])
    );

    // A turn that answers ends as completed.
    let answering = MockLlm::start(Script::always(Reply::text(&["done"]))).await;
    let app = TestApp::spawn_with(with_model(&answering)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "hi").await;
    assert_eq!(end["reason"], "completed", "{end}");
}

#[tokio::test]
async fn cached_prompt_tokens_are_stored_priced_and_reported() {
    // Two calls: the first reads a file (600 of 1000 prompt tokens cached), the second answers
    // (900 of 1500 cached).
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "read_file",
            &json!({"path": "a.txt"}),
        )])
        .with_usage(1000, 10)
        .with_cached(600),
        Reply::text(&["done"]).with_usage(1500, 20).with_cached(900),
    ]))
    .await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        // 1 USD per million prompt tokens, 0.1 per million cached ones, 2 per million out.
        c.llm.pricing.get_mut(MODEL).unwrap().cached_input_per_mtok = Some(0.1);
    })
    .await;
    std::fs::write(app.workspace().join("a.txt"), "a\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "read a").await;
    assert_eq!(end["tokens_in"], 2500, "{end}");
    assert_eq!(end["tokens_cached"], 1500, "{end}");
    let expected = (1000.0 * 1.0 + 1500.0 * 0.1 + 30.0 * 2.0) / 1e6;
    let cost = end["cost_usd"].as_f64().unwrap();
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");

    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["tokens_cached"], 1500, "{cost}");
    let rows = cost["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["tokens_cached"], 600);
    assert_eq!(rows[1]["tokens_cached"], 900);
    let first = rows[0]["actual_usd"].as_f64().unwrap();
    assert!(
        (first - (400.0 + 60.0 + 20.0) / 1e6).abs() < 1e-12,
        "{first}"
    );

    // The reservation still assumed nothing was cached: the whole prompt at the input price.
    let reserved = rows[0]["reserved_usd"].as_f64().unwrap();
    assert!(reserved > first * 2.0, "{reserved} vs {first}");
}

#[tokio::test]
async fn a_session_spending_faster_than_its_rate_is_paused() {
    // Each call costs 1000 prompt tokens at 1 USD per million plus 20 out at 2: 0.00104 USD,
    // more than the 0.001 USD a minute allowed.
    let mock = MockLlm::start(Script::always(
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c",
            "read_file",
            &json!({"path": "a.txt"}),
        )])
        .with_usage(1000, 20),
    ))
    .await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        c.budget.usd_per_minute = 0.001;
    })
    .await;
    std::fs::write(app.workspace().join("a.txt"), "a\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "go").await;
    assert_eq!(end["reason"], "budget_rate_exceeded", "{end}");
    assert_eq!(
        mock.request_count(),
        1,
        "the second call waits for the rate"
    );
    // The call that was made still got its answer into the history.
    assert!(
        notes.iter().any(|n| n["method"] == "tool/completed"),
        "{notes:?}"
    );
    // Within the same minute a new turn is paused before it calls the model at all.
    let (_, end) = run_turn(&mut ws, &session, "go on").await;
    assert_eq!(end["reason"], "budget_rate_exceeded", "{end}");
    assert_eq!(mock.request_count(), 1);
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(cost["rows"].as_array().unwrap().len(), 1, "{cost}");
}
