//! Agent profiles end to end: `[[agents]]` picked by `session/open {agent}` (kept across a
//! restart) and by `spawn_agent {agent_type}`; each gets the profile's instructions, model and
//! tool limits, as the requests the scripted model receives show.

use serde_json::{Value, json};

use super::agent::{run_turn, tool_names, with_model};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use agentd::config::Config;
use agentd::session::profiles::AgentProfile;
use agentd::tools::ToolPolicy;

const REVIEWER_SAYS: &str = "You review changes; you never edit files.";

fn reviewer() -> AgentProfile {
    AgentProfile {
        name: "reviewer".into(),
        description: "Reads and comments; cannot write".into(),
        instructions: Some(REVIEWER_SAYS.into()),
        model: Some("review-model".into()),
        tool_policy: Some(ToolPolicy {
            deny: vec![
                "write_file".into(),
                "apply_patch".into(),
                "edit_file".into(),
            ],
            ..ToolPolicy::default()
        }),
    }
}

fn with_reviewer(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let configure = with_model(mock);
    move |c: &mut Config| {
        configure(c);
        c.agents.push(reviewer());
    }
}

fn system_of(request: &Value) -> String {
    request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn opener(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_session_opened_as_a_profile_keeps_its_instructions_model_and_limits() {
    let mock = MockLlm::start(Script::always(Reply::text(&["looks fine"]))).await;
    let app = TestApp::spawn_with(with_reviewer(&mock)).await;
    let mut ws = app.ws().await;

    let listed = ws.result("agent/list", json!({})).await;
    assert_eq!(
        listed,
        json!({"agents": [{"name": "reviewer", "description": "Reads and comments; cannot write", "model": "review-model"}]})
    );
    let (_, unknown) = ws.call("session/open", json!({"agent": "writer"})).await;
    assert_eq!(
        unknown["error"]["data"]["kind"], "invalid_params",
        "{unknown}"
    );
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reviewer"),
        "{unknown}"
    );

    let opened = ws
        .result("session/open", json!({"agent": "reviewer"}))
        .await;
    assert_eq!(opened["agent"], "reviewer");
    assert_eq!(opened["model"], "review-model");
    let session = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &session, "check my change").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], "review-model");
    assert!(system_of(&request).contains(REVIEWER_SAYS));
    let tools = tool_names(&request);
    assert!(tools.contains(&"read_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"write_file".to_string()), "{tools:?}");
    // Asked for anyway, the tool is refused by policy.
    let (_, invoked) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "write_file",
                   "arguments": {"path": "x.txt", "content": "no"}}),
        )
        .await;
    assert_eq!(
        invoked["error"]["data"]["kind"], "policy_denied",
        "{invoked}"
    );
    assert!(!app.workspace().join("x.txt").exists());

    // The agent is chosen at creation: re-opening as another is refused.
    let (_, again) = ws
        .call(
            "session/open",
            json!({"session_id": session, "agent": "someone-else"}),
        )
        .await;
    assert_eq!(again["error"]["data"]["kind"], "invalid_params", "{again}");
    let listed = app.get_json("/api/sessions", None).await;
    let row = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == session.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["agent"], "reviewer");

    // A session without a profile is untouched by it.
    let plain = ws.open().await;
    run_turn(&mut ws, &plain, "hello").await;
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], super::agent::MODEL);
    assert!(!system_of(&request).contains(REVIEWER_SAYS));
    assert!(tool_names(&request).contains(&"write_file".to_string()));

    // After a restart the session is still the reviewer.
    drop(ws);
    let dir = app.stop().await;
    let mut config = crate::support::config_in(dir.path());
    with_reviewer(&mock)(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let reopened = ws
        .result("session/open", json!({"session_id": session}))
        .await;
    assert_eq!(reopened["agent"], "reviewer");
    run_turn(&mut ws, &session, "and now?").await;
    let request = mock.requests().pop().unwrap();
    assert_eq!(request["model"], "review-model");
    assert!(system_of(&request).contains(REVIEWER_SAYS));
    assert!(!tool_names(&request).contains(&"write_file".to_string()));
}

#[tokio::test]
async fn spawn_agent_with_an_agent_type_starts_a_child_of_that_profile() {
    let script = Script::route(|request: &Value| {
        if opener(request) == "review the notes" {
            return Reply::text(&["reviewed"]);
        }
        let messages = request["messages"].as_array().unwrap();
        let answered = |id: &str| {
            messages
                .iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        };
        if !answered("p0") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p0",
                "spawn_agent",
                &json!({"message": "never started", "agent_type": "no-such-profile"}),
            )]);
        }
        if !answered("p1") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p1",
                "spawn_agent",
                &json!({"message": "review the notes", "agent_type": "reviewer"}),
            )]);
        }
        if !answered("p2") {
            return Reply::tool_calls(vec![ScriptedCall::whole("p2", "wait_agent", &json!({}))]);
        }
        Reply::text(&["done"])
    });
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_reviewer(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "delegate a review").await;
    assert_eq!(end["reason"], "completed", "{end}");

    let requests = mock.requests();
    let refusal = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().unwrap().clone())
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "p0")
        .expect("the unknown profile's answer");
    let refusal = refusal["content"].as_str().unwrap();
    assert!(
        refusal.contains("no-such-profile") && refusal.contains("reviewer"),
        "{refusal}"
    );
    assert!(
        !requests.iter().any(|r| opener(r) == "never started"),
        "no child for an unknown profile"
    );
    let child: Vec<&Value> = requests
        .iter()
        .filter(|r| opener(r) == "review the notes")
        .collect();
    assert_eq!(child.len(), 1);
    assert_eq!(child[0]["model"], "review-model");
    assert!(system_of(child[0]).contains(REVIEWER_SAYS));
    let tools = tool_names(child[0]);
    assert!(tools.contains(&"read_file".to_string()), "{tools:?}");
    assert!(!tools.contains(&"write_file".to_string()), "{tools:?}");
    // The parent stays a plain agent.
    let parent = requests
        .iter()
        .find(|r| opener(r) == "delegate a review")
        .unwrap();
    assert_eq!(parent["model"], super::agent::MODEL);
    assert!(!system_of(parent).contains(REVIEWER_SAYS));
}
