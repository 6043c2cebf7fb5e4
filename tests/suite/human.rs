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

/// `ask = ["shell"]`, with `git status` allowed at once.
fn asking(c: &mut agentd::config::Config) {
    c.tool_policy.ask = vec!["shell".into()];
    c.tool_policy.commands = vec![agentd::tools::approval::CommandRule {
        prefix: vec!["git".into(), "status".into()],
        action: agentd::tools::approval::RuleAction::Allow,
    }];
}

fn of<'a>(notes: &'a [Value], method: &str) -> Vec<&'a Value> {
    notes
        .iter()
        .filter(|n| n["method"] == method)
        .map(|n| &n["params"])
        .collect()
}

/// Sends `tool/invoke` of `shell` and waits for its approval request; the request id.
async fn invoke_until_asked(
    ws: &mut crate::support::WsClient,
    session: &str,
    command: &str,
) -> (u64, Value) {
    let id = ws
        .send(
            "tool/invoke",
            json!({"session_id": session, "name": "shell", "arguments": {"command": command}}),
        )
        .await;
    let asked = ws.notification("approval/requested").await;
    (id, asked)
}

/// Reads frames until the answer to request `id`; the notifications before it and the answer.
async fn answer_of(ws: &mut crate::support::WsClient, id: u64) -> (Vec<Value>, Value) {
    let mut notes = Vec::new();
    loop {
        let message = ws.next_json().await;
        if message["id"] == json!(id) {
            return (notes, message);
        }
        notes.push(message);
    }
}

#[tokio::test]
async fn approvals_accept_decline_and_accept_for_session_on_tool_invoke() {
    let app = TestApp::spawn_with(asking).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    for name in ["x", "y", "z"] {
        ws.invoke(
            &session,
            "write_file",
            json!({"path": name, "content": "keep\n"}),
        )
        .await;
    }

    // An allowed prefix runs at once.
    let (notes, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "shell", "arguments": {"command": "git status"}}),
        )
        .await;
    assert!(of(&notes, "approval/requested").is_empty(), "{notes:?}");
    assert!(answer["result"].is_object(), "{answer}");

    // Decline, with a message for the model.
    let (id, asked) = invoke_until_asked(&mut ws, &session, "rm -rf x").await;
    assert_eq!(asked["tool_name"], "shell");
    assert_eq!(asked["arguments"]["command"], "rm -rf x");
    assert!(
        asked["reason"]
            .as_str()
            .unwrap()
            .contains("tool_policy.ask"),
        "{asked}"
    );
    assert!(
        asked["cwd"].is_string() && asked["tool_call_id"].is_string(),
        "{asked}"
    );
    let approval = asked["approval_id"].as_str().unwrap().to_string();
    let (_, wrong) = ws
        .call(
            "approval/respond",
            json!({"session_id": session, "approval_id": "approval_nope", "decision": "accept"}),
        )
        .await;
    assert_eq!(
        wrong["error"]["data"]["kind"], "unknown_approval",
        "{wrong}"
    );
    ws.send(
        "approval/respond",
        json!({"session_id": session, "approval_id": approval, "decision": "decline", "message": "keep x"}),
    )
    .await;
    let (notes, declined) = answer_of(&mut ws, id).await;
    let resolved = of(&notes, "approval/resolved");
    assert_eq!(resolved[0]["approval_id"], approval.as_str());
    assert_eq!(resolved[0]["decision"], "decline");
    let result = &declined["result"];
    assert_eq!(result["success"], false, "{declined}");
    assert_eq!(result["structured_metadata"]["error"]["kind"], "declined");
    assert!(
        result["output"].as_str().unwrap().contains("keep x"),
        "{result}"
    );
    assert!(
        app.workspace().join("x").exists(),
        "a declined command does not run"
    );

    // Accept: it runs.
    let (id, asked) = invoke_until_asked(&mut ws, &session, "rm -f x").await;
    ws.send(
        "approval/respond",
        json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "accept"}),
    )
    .await;
    let (notes, accepted) = answer_of(&mut ws, id).await;
    assert_eq!(of(&notes, "approval/resolved")[0]["decision"], "accept");
    assert_eq!(accepted["result"]["success"], true, "{accepted}");
    assert!(!app.workspace().join("x").exists());

    // Accept for the session: the same tool and prefix run at once from then on.
    let (id, asked) = invoke_until_asked(&mut ws, &session, "rm -f y").await;
    ws.send(
        "approval/respond",
        json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "accept_for_session"}),
    )
    .await;
    answer_of(&mut ws, id).await;
    let (notes, again) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "shell", "arguments": {"command": "rm -f z"}}),
        )
        .await;
    assert!(of(&notes, "approval/requested").is_empty(), "{notes:?}");
    assert_eq!(again["result"]["success"], true, "{again}");
    assert!(!app.workspace().join("z").exists());
    // Another program still asks; the console may skip the question.
    let (id, _) = invoke_until_asked(&mut ws, &session, "cat y").await;
    let (notes, skipped) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "shell", "arguments": {"command": "echo console"}, "skip_approval": true}),
        )
        .await;
    assert!(of(&notes, "approval/requested").is_empty(), "{notes:?}");
    assert_eq!(skipped["result"]["success"], true, "{skipped}");
    let _ = id;
}

#[tokio::test]
async fn a_deny_rule_refuses_even_a_call_that_skips_approval() {
    let app = TestApp::spawn_with(|c| {
        c.tool_policy.commands = vec![agentd::tools::approval::CommandRule {
            prefix: vec!["rm".into()],
            action: agentd::tools::approval::RuleAction::Deny,
        }];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.invoke(
        &session,
        "write_file",
        json!({"path": "x", "content": "keep\n"}),
    )
    .await;
    for skip in [false, true] {
        let (notes, answer) = ws
            .call(
                "tool/invoke",
                json!({"session_id": session, "name": "shell", "arguments": {"command": "rm -f x"}, "skip_approval": skip}),
            )
            .await;
        assert!(of(&notes, "approval/requested").is_empty(), "{notes:?}");
        let result = &answer["result"];
        assert_eq!(result["success"], false, "{answer}");
        assert_eq!(
            result["structured_metadata"]["error"]["kind"],
            "policy_denied"
        );
        assert!(app.workspace().join("x").exists());
    }
}

#[tokio::test]
async fn an_approval_nobody_answers_is_declined_after_the_timeout() {
    let app = TestApp::spawn_with(|c| {
        asking(c);
        c.tools.approval_timeout_secs = 1;
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (id, asked) = invoke_until_asked(&mut ws, &session, "rm -rf nothing").await;
    let (notes, answer) = answer_of(&mut ws, id).await;
    let resolved = of(&notes, "approval/resolved");
    assert_eq!(resolved[0]["approval_id"], asked["approval_id"]);
    assert_eq!(resolved[0]["decision"], "decline");
    assert_eq!(resolved[0]["reason"], "timeout");
    assert_eq!(
        answer["result"]["structured_metadata"]["error"]["kind"],
        "declined"
    );
    assert_eq!(
        answer["result"]["structured_metadata"]["error"]["reason"],
        "timeout"
    );
}

#[tokio::test]
async fn a_pending_approval_is_replayed_to_a_client_that_reconnects() {
    let app = TestApp::spawn_with(asking).await;
    let mut first = app.ws().await;
    let session = first.open().await;
    let (id, asked) = invoke_until_asked(&mut first, &session, "rm -rf gone").await;
    let seq = asked["seq"].as_i64().unwrap();

    // A new client without replay, one resuming after the request, and one replaying from
    // before it: each sees the request exactly once.
    for after_seq in [None, Some(seq), Some(seq - 1)] {
        let mut other = app.ws().await;
        let mut params = json!({"session_id": session});
        if let Some(after) = after_seq {
            params["after_seq"] = json!(after);
        }
        let (before, opened) = other.call("session/open", params).await;
        assert!(opened.get("error").is_none(), "{opened}");
        let mut seen = of(&before, "approval/requested").len();
        if seen == 0 {
            let again = other.notification("approval/requested").await;
            assert_eq!(again["approval_id"], asked["approval_id"]);
            seen = 1;
        }
        assert_eq!(seen, 1, "after_seq {after_seq:?}: {before:?}");
        if after_seq == Some(seq - 1) {
            // The last client decides; the first one's call goes on.
            other
                .result(
                    "approval/respond",
                    json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "decline"}),
                )
                .await;
        }
    }
    let (_, answer) = answer_of(&mut first, id).await;
    assert_eq!(
        answer["result"]["structured_metadata"]["error"]["kind"],
        "declined"
    );
}

#[tokio::test]
async fn a_model_call_waits_for_approval_and_an_interrupt_declines_it() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_rm",
            "shell",
            &json!({"command": "rm -f kept"}),
        )]),
        Reply::text(&["removed"]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_rm2",
            "shell",
            &json!({"command": "rm -f kept"}),
        )]),
    ]))
    .await;
    let app = TestApp::spawn_with(|c| {
        with_model(&mock)(c);
        asking(c);
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    std::fs::write(app.workspace().join("kept"), "x").unwrap();

    // Accepted: the call runs, and the model hears its result.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("clean up")}),
    )
    .await;
    let asked = ws.notification("approval/requested").await;
    assert_eq!(asked["tool_call_id"], "call_rm");
    assert_eq!(mock.request_count(), 1);
    ws.result(
        "approval/respond",
        json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "accept"}),
    )
    .await;
    ws.notification("turn/completed").await;
    assert!(!app.workspace().join("kept").exists());
    let second = conversation(&mock.requests()[1]);
    assert_eq!(second[3].0, "tool", "{second:?}");

    // Interrupted while it waits: declined, and the turn ends interrupted.
    std::fs::write(app.workspace().join("kept"), "x").unwrap();
    let started = ws
        .result(
            "turn/start",
            json!({"session_id": session, "input": text_input("again")}),
        )
        .await;
    let asked = ws.notification("approval/requested").await;
    let (notes, _) = ws
        .call("turn/interrupt", json!({"session_id": session}))
        .await;
    let resolved = of(&notes, "approval/resolved");
    assert_eq!(
        resolved[0]["approval_id"], asked["approval_id"],
        "{notes:?}"
    );
    assert_eq!(resolved[0]["reason"], "interrupted");
    let completed = of(&notes, "tool/completed");
    assert_eq!(
        completed[0]["structured_metadata"]["error"]["kind"],
        "declined"
    );
    let ended = of(&notes, "turn/error");
    assert_eq!(ended[0]["turn_id"], started["turn_id"]);
    assert_eq!(ended[0]["code"], "interrupted");
    assert!(app.workspace().join("kept").exists());
}

#[tokio::test]
async fn a_sub_agents_approval_is_asked_of_the_parents_clients_naming_the_child() {
    let script = Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let opener = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let last = messages.last().unwrap();
        if opener == "write the note" {
            return if last["role"] == "user" {
                Reply::tool_calls(vec![ScriptedCall::whole(
                    "c1",
                    "write_file",
                    &json!({"path": "note.txt", "content": "from the child\n"}),
                )])
            } else {
                Reply::text(&["child done"])
            };
        }
        match last["tool_call_id"].as_str() {
            None => Reply::tool_calls(vec![ScriptedCall::whole(
                "p1",
                "spawn_agent",
                &json!({"message": "write the note"}),
            )]),
            Some("p1") => {
                Reply::tool_calls(vec![ScriptedCall::whole("p2", "wait_agent", &json!({}))])
            }
            Some(_) => Reply::text(&["parent done"]),
        }
    });
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(|c| {
        with_model(&mock)(c);
        c.tool_policy.ask = vec!["write_file".into()];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("delegate")}),
    )
    .await;
    let asked = ws.notification("approval/requested").await;
    assert_eq!(asked["tool_name"], "write_file", "{asked}");
    assert_eq!(asked["tool_call_id"], "c1");
    let agent_id = asked["agent_id"].as_str().expect("names the child");
    assert!(!agent_id.is_empty());
    assert!(!app.workspace().join("note.txt").exists());
    ws.result(
        "approval/respond",
        json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "accept"}),
    )
    .await;
    ws.notification("turn/completed").await;
    assert_eq!(
        std::fs::read_to_string(app.workspace().join("note.txt")).unwrap(),
        "from the child\n"
    );
}

#[tokio::test]
async fn a_fork_carries_the_history_up_to_the_fork_point_and_no_further() {
    let mock = MockLlm::start(Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let last = messages.last().unwrap()["content"]
            .as_str()
            .unwrap_or_default();
        Reply::text(&[&format!("answer to {last}")])
    }))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let source = ws.open().await;
    let (first_notes, _) = super::agent::run_turn(&mut ws, &source, "first").await;
    let first_end = first_notes.last().unwrap()["params"]["seq"]
        .as_i64()
        .unwrap();
    super::agent::run_turn(&mut ws, &source, "second").await;

    // A point inside the second turn rounds down to the end of the first.
    let forked = ws
        .result(
            "session/fork",
            json!({"session_id": source, "up_to_seq": first_end + 1}),
        )
        .await;
    let fork = forked["session_id"].as_str().unwrap().to_string();
    assert_ne!(fork, source);
    assert_eq!(forked["up_to_seq"], first_end, "{forked}");
    let row = app.get_json(&format!("/api/sessions/{fork}"), None).await;
    assert_eq!(row["parent_session_id"], source.as_str(), "{row}");
    assert_eq!(row["last_seq"], first_end);
    let source_row = app.get_json(&format!("/api/sessions/{source}"), None).await;
    assert!(source_row["parent_session_id"].is_null());

    // Its events are the source's, in its own name.
    let (replayed, opened) = ws
        .call("session/open", json!({"session_id": fork, "after_seq": 0}))
        .await;
    assert_eq!(opened["result"]["resumed"], true, "{opened}");
    assert_eq!(replayed.len() as i64, first_end);
    assert!(
        replayed
            .iter()
            .all(|e| e["params"]["session_id"] == fork.as_str())
    );

    // Its next turn sends the history up to the fork point, not the source's later turns.
    super::agent::run_turn(&mut ws, &fork, "third").await;
    let sent = conversation(mock.requests().last().unwrap());
    let contents: Vec<&str> = sent[1..].iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(contents, ["first", "answer to first", "third"], "{sent:?}");
    // The source is untouched.
    let messages = app
        .get_json(&format!("/api/sessions/{source}/messages"), None)
        .await;
    assert_eq!(
        messages["messages"].as_array().unwrap().len(),
        4,
        "{messages}"
    );

    // By default the whole history goes.
    let whole = ws
        .result("session/fork", json!({"session_id": source}))
        .await;
    let whole_messages = app
        .get_json(
            &format!(
                "/api/sessions/{}/messages",
                whole["session_id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(whole_messages["messages"], messages["messages"]);
    let (_, unknown) = ws
        .call("session/fork", json!({"session_id": "no-such-session"}))
        .await;
    assert_eq!(unknown["error"]["data"]["kind"], "unknown_session");
}
