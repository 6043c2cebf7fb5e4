//! A human in the loop: steering a running turn, approvals, forks. The scripted model records
//! every request, so the tests assert on what the model was sent.

use serde_json::{Value, json};

use super::agent::with_model;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

fn text_input(text: &str) -> Value {
    json!([{"kind": "text", "text": text}])
}

/// The roles and contents of a recorded request's messages.
fn conversation(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_steer_lands_in_the_next_model_request_after_the_batch() {
    let questions = json!({"questions": [{"id": "go", "header": "Go", "question": "Go on?"}]});
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "ask_1",
            "request_user_input",
            &questions,
        )]),
        Reply::text(&["steered"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;

    // No turn runs yet.
    let (_, refused) = ws
        .call(
            "turn/steer",
            json!({"session_id": session, "turn_id": "t-none", "input": text_input("x")}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "no_active_turn",
        "{refused}"
    );

    let started = ws
        .result(
            "turn/start",
            json!({"session_id": session, "input": text_input("start")}),
        )
        .await;
    let turn_id = started["turn_id"].as_str().unwrap().to_string();
    // The batch in flight waits for the user; the steer arrives meanwhile.
    let asked = ws.notification("user_input/requested").await;
    let (_, wrong) = ws
        .call(
            "turn/steer",
            json!({"session_id": session, "turn_id": "t-other", "input": text_input("x")}),
        )
        .await;
    assert_eq!(wrong["error"]["data"]["kind"], "no_active_turn", "{wrong}");
    ws.result(
        "turn/steer",
        json!({"session_id": session, "turn_id": turn_id, "input": text_input("use sqlite, not postgres")}),
    )
    .await;
    assert_eq!(mock.request_count(), 1, "the steer waits for the batch");
    ws.result(
        "user_input/respond",
        json!({"session_id": session, "request_id": asked["request_id"], "answers": {"go": "yes"}}),
    )
    .await;
    let done = ws.notification("turn/completed").await;
    assert_eq!(done["turn_id"], turn_id.as_str());

    let second = conversation(&mock.requests()[1]);
    let roles: Vec<&str> = second.iter().map(|(role, _)| role.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "user"],
        "{second:?}"
    );
    assert_eq!(second[4].1, "use sqlite, not postgres");
    // It is part of the stored conversation too.
    let messages = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    assert!(
        messages["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "user" && m["content"] == "use sqlite, not postgres"),
        "{messages}"
    );
    // Once the turn is over, steering is refused.
    let (_, late) = ws
        .call(
            "turn/steer",
            json!({"session_id": session, "turn_id": turn_id, "input": text_input("x")}),
        )
        .await;
    assert_eq!(late["error"]["data"]["kind"], "no_active_turn", "{late}");
}
