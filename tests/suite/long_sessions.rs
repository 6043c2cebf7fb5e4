//! Long sessions: the loop breaker. The scripted model records every request, so the tests
//! assert on what it was told and when it was stopped.

use serde_json::{Value, json};

use super::agent::{run_turn, with_model};
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
