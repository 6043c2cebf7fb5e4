//! Sub-agents end to end: the scripted model tells conversations apart by their first user
//! message, so one script plays the parent and its children.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::agent::{of, run_turn, tool_names, with_model, with_tight_budget};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// What a sub-agent may never be offered.
const DELEGATED: &[&str] = &[
    "spawn_agent",
    "shell",
    "exec_command",
    "write_stdin",
    "request_user_input",
];

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().unwrap()
}

/// The first user message: which conversation a request belongs to.
fn opener(request: &Value) -> String {
    messages(request)
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn last(request: &Value) -> &Value {
    messages(request).last().unwrap()
}

/// The content of the tool message answering `call_id`.
fn tool_answer(request: &Value, call_id: &str) -> Option<Value> {
    messages(request)
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .map(|m| {
            let content = m["content"].as_str().unwrap();
            serde_json::from_str(content).unwrap_or(Value::String(content.into()))
        })
}

fn cost_of(rows: &[Value]) -> f64 {
    rows.iter().map(|r| r["actual_usd"].as_f64().unwrap()).sum()
}

#[tokio::test]
async fn a_parent_spawns_waits_and_steers_a_child_and_pays_for_both() {
    let script = Script::route(|request: &Value| {
        let last = last(request);
        if opener(request) == "inspect the notes" {
            // The child: tries a delegated tool, then answers each user message in turn.
            if last["role"] == "user" && last["content"] == "inspect the notes" {
                return Reply::tool_calls(vec![ScriptedCall::whole(
                    "c1",
                    "shell",
                    &json!({"command": "echo hi"}),
                )])
                .with_usage(200, 20);
            }
            if last["role"] == "tool" {
                let refusal = last["content"].as_str().unwrap();
                let answer = if refusal.contains("not allowed") {
                    "first answer"
                } else {
                    "the child could run shell"
                };
                return Reply::text(&[answer]).with_usage(300, 30);
            }
            return Reply::text(&["second answer"]).with_usage(400, 40);
        }
        // The parent.
        let Some(spawned) = tool_answer(request, "p1") else {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p1",
                "spawn_agent",
                &json!({"message": "inspect the notes"}),
            )])
            .with_usage(100, 10);
        };
        let agent = spawned["agent_id"].as_str().unwrap_or("none").to_string();
        match last["tool_call_id"].as_str() {
            Some("p1") => Reply::tool_calls(vec![ScriptedCall::whole(
                "p2",
                "wait_agent",
                &json!({"ids": [agent]}),
            )]),
            Some("p2") => Reply::tool_calls(vec![ScriptedCall::whole(
                "p3",
                "send_input",
                &json!({"target": agent, "message": "and the rest?"}),
            )]),
            Some("p3") => {
                Reply::tool_calls(vec![ScriptedCall::whole("p4", "wait_agent", &json!({}))])
            }
            _ => Reply::text(&["all done"]),
        }
        .with_usage(100, 10)
    });
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "delegate it").await;
    assert!(end.get("code").is_none(), "the turn failed: {end}");

    let requests = mock.requests();
    let parent: Vec<&Value> = requests
        .iter()
        .filter(|r| opener(r) == "delegate it")
        .collect();
    let child: Vec<&Value> = requests
        .iter()
        .filter(|r| opener(r) == "inspect the notes")
        .collect();
    assert_eq!(parent.len(), 5);
    assert_eq!(child.len(), 3);
    for request in &child {
        let offered = tool_names(request);
        assert!(offered.contains(&"read_file".to_string()), "{offered:?}");
        for name in DELEGATED.iter().chain(&["send_input", "wait_agent"]) {
            assert!(
                !offered.contains(&name.to_string()),
                "{name} offered to the child"
            );
        }
    }
    // The child kept its history: its third request holds both user messages and answers.
    let third: Vec<&str> = messages(child[2])
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(third.contains(&"first answer"), "{third:?}");
    assert_eq!(*third.last().unwrap(), "and the rest?");

    // Each wait returned the answer of the turn it waited for.
    let first_wait = tool_answer(parent[2], "p2").unwrap();
    assert_eq!(first_wait["agents"][0]["status"], "completed");
    assert_eq!(first_wait["agents"][0]["answer"], "first answer");
    let sent = tool_answer(parent[3], "p3").unwrap();
    assert_eq!(
        sent["status"], "running",
        "a finished child runs again at once"
    );
    let second_wait = tool_answer(parent[4], "p4").unwrap();
    assert_eq!(second_wait["agents"][0]["status"], "completed");
    assert_eq!(second_wait["agents"][0]["answer"], "second answer");

    // The client saw the child as a task, run by run.
    let agent = tool_answer(parent[1], "p1").unwrap()["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    let states: Vec<&str> = of(&notes, "task/updated")
        .iter()
        .filter(|u| u["task_id"] == agent.as_str())
        .map(|u| u["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["running", "completed", "running", "completed"]);
    let transcript = app
        .get_json(
            &format!("/api/tasks/{agent}/output?mode=head&lines=100"),
            None,
        )
        .await;
    let text = transcript["text"].as_str().unwrap();
    for line in [
        "user: inspect the notes",
        "-> shell",
        "assistant: first answer",
        "user: and the rest?",
        "assistant: second answer",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }

    // Both conversations are billed to the session, the child under its own node.
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let rows = cost["rows"].as_array().unwrap();
    let (child_rows, parent_rows): (Vec<Value>, Vec<Value>) = rows
        .iter()
        .cloned()
        .partition(|r| r["node_id"] == format!("agent:{agent}"));
    assert_eq!(child_rows.len(), 3);
    assert!(child_rows.iter().all(|r| r["task_id"] == agent.as_str()));
    assert_eq!(parent_rows.len(), 5);
    assert!(parent_rows.iter().all(|r| r["node_id"] == "agent"));
    let child_usd = (200.0 + 300.0 + 400.0) * 1.0 / 1e6 + (20.0 + 30.0 + 40.0) * 2.0 / 1e6;
    assert!(
        (cost_of(&child_rows) - child_usd).abs() < 1e-12,
        "{child_rows:?}"
    );
    let parent_usd = 5.0 * (100.0 * 1.0 + 10.0 * 2.0) / 1e6;
    assert!((cost_of(&parent_rows) - parent_usd).abs() < 1e-12);
    let total = cost["session_cost_usd"].as_f64().unwrap();
    assert!((total - (child_usd + parent_usd)).abs() < 1e-12, "{total}");
    assert_eq!(
        cost["tokens_in"],
        5 * 100 + 200 + 300 + 400,
        "tokens of both conversations"
    );
}

#[tokio::test]
async fn the_fifth_child_is_refused_until_one_is_closed() {
    let mock = MockLlm::start(Script::always(Reply::text(&["done"]))).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let mut agents = Vec::new();
    for n in 0..4 {
        let spawned = ws
            .invoke(
                &session,
                "spawn_agent",
                json!({"message": format!("task {n}")}),
            )
            .await;
        assert_eq!(spawned["success"], true, "{spawned}");
        agents.push(
            spawned["structured_metadata"]["agent_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let refused = ws
        .invoke(&session, "spawn_agent", json!({"message": "one more"}))
        .await;
    assert_eq!(refused["success"], false);
    assert!(
        refused["output"]
            .as_str()
            .unwrap()
            .contains("4 open sub-agents"),
        "{refused}"
    );

    let closed = ws
        .invoke(&session, "close_agent", json!({"target": agents[0]}))
        .await;
    assert_eq!(closed["success"], true, "{closed}");
    assert_eq!(closed["structured_metadata"]["status"], "closed");
    let again = ws
        .invoke(&session, "spawn_agent", json!({"message": "one more"}))
        .await;
    assert_eq!(again["success"], true, "{again}");

    // A closed or unknown child is an unsuccessful result that says which it is.
    let to_closed = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": agents[0], "message": "hello?"}),
        )
        .await;
    assert_eq!(to_closed["success"], false);
    assert!(to_closed["output"].as_str().unwrap().contains("was closed"));
    let to_unknown = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": "nobody", "message": "hello?"}),
        )
        .await;
    assert_eq!(to_unknown["success"], false);
    assert!(
        to_unknown["output"]
            .as_str()
            .unwrap()
            .contains("no sub-agent nobody")
    );
    let waited = ws
        .invoke(
            &session,
            "wait_agent",
            json!({"ids": [agents[0], agents[1]]}),
        )
        .await;
    let statuses = &waited["structured_metadata"]["agents"];
    assert_eq!(statuses[0]["status"], "closed");
    assert_eq!(statuses[1]["agent_id"], agents[1].as_str());
}

#[tokio::test]
async fn interrupting_the_turn_stops_its_children_and_resume_continues_them() {
    let release = Arc::new(Notify::new());
    let child_calls = Arc::new(AtomicUsize::new(0));
    let script = {
        let release = Arc::clone(&release);
        let child_calls = Arc::clone(&child_calls);
        Script::route(move |request: &Value| {
            if opener(request) == "work slowly" {
                return match child_calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Reply::hold(&["thinking"], Arc::clone(&release), &["never"]),
                    _ => Reply::text(&["resumed and done"]),
                };
            }
            match last(request)["tool_call_id"].as_str() {
                None => Reply::tool_calls(vec![ScriptedCall::whole(
                    "p1",
                    "spawn_agent",
                    &json!({"message": "work slowly"}),
                )]),
                Some("p1") => {
                    Reply::tool_calls(vec![ScriptedCall::whole("p2", "wait_agent", &json!({}))])
                }
                Some(_) => Reply::text(&["unexpected"]),
            }
        })
    };
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "go"}]}),
    )
    .await;
    let running = ws.notification("task/updated").await;
    assert_eq!(running["state"], "running");
    let agent = running["task_id"].as_str().unwrap().to_string();
    // The parent waits on the child, whose model call is held open.
    mock.wait_for_requests(3, crate::support::WAIT).await;
    let (notes, answer) = ws
        .call("turn/interrupt", json!({"session_id": session}))
        .await;
    assert_eq!(answer["result"]["interrupted"], true);
    let mut notes = notes;
    while !notes.iter().any(|n| {
        n["method"] == "task/updated"
            && n["params"]["task_id"] == agent.as_str()
            && n["params"]["state"] == "failed"
    }) {
        notes.push(ws.next_json().await);
    }
    let stopped = notes
        .iter()
        .find(|n| n["method"] == "task/updated" && n["params"]["state"] == "failed")
        .unwrap();
    assert!(
        stopped["params"]["reason"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{stopped}"
    );
    let status = ws
        .invoke(
            &session,
            "wait_agent",
            json!({"ids": [agent], "timeout_ms": 0}),
        )
        .await;
    assert_eq!(
        status["structured_metadata"]["agents"][0]["status"],
        "errored"
    );

    // Resumed from its history, it answers.
    let resumed = ws
        .invoke(&session, "resume_agent", json!({"id": agent}))
        .await;
    assert_eq!(
        resumed["structured_metadata"]["status"], "running",
        "{resumed}"
    );
    let waited = ws
        .invoke(&session, "wait_agent", json!({"ids": [agent]}))
        .await;
    let child = &waited["structured_metadata"]["agents"][0];
    assert_eq!(child["status"], "completed", "{waited}");
    assert_eq!(child["answer"], "resumed and done");
    release.notify_waiters();
}

#[tokio::test]
async fn deleting_the_session_stops_its_running_children() {
    let release = Arc::new(Notify::new());
    let script = {
        let release = Arc::clone(&release);
        Script::route(move |_: &Value| Reply::hold(&["busy"], Arc::clone(&release), &["late"]))
    };
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let spawned = ws
        .invoke(&session, "spawn_agent", json!({"message": "forever"}))
        .await;
    let agent = spawned["structured_metadata"]["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    mock.wait_for_requests(1, crate::support::WAIT).await;
    let (status, _) = app
        .request(
            reqwest::Method::DELETE,
            &format!("/api/sessions/{session}"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    // The child was stopped, and said so, before the session went.
    let stopped = loop {
        let update = ws.notification("task/updated").await;
        if update["task_id"] == agent.as_str() && update["state"] != "running" {
            break update;
        }
    };
    assert_eq!(stopped["state"], "cancelled", "{stopped}");
    assert_eq!(stopped["reason"], "the session stopped");
    release.notify_waiters();
}

#[tokio::test]
async fn input_to_a_running_child_is_read_at_its_next_step_or_at_once_with_interrupt() {
    let release = Arc::new(Notify::new());
    let script = {
        let release = Arc::clone(&release);
        Script::route(move |request: &Value| {
            let last = last(request);
            match (opener(request).as_str(), last["content"].as_str()) {
                // Each child's first model call is held until the test lets it go.
                ("patient", Some("patient")) | ("hasty", Some("hasty")) => {
                    Reply::hold(&["working"], Arc::clone(&release), &[" on it"])
                }
                (_, Some(text)) => Reply::text(&[&format!("read: {text}")]),
                _ => Reply::text(&["?"]),
            }
        })
    };
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let mut agents = Vec::new();
    for opener in ["patient", "hasty"] {
        let spawned = ws
            .invoke(&session, "spawn_agent", json!({"message": opener}))
            .await;
        agents.push(
            spawned["structured_metadata"]["agent_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    mock.wait_for_requests(2, crate::support::WAIT).await;

    // Without interrupt the message waits for the held step to finish.
    let queued = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": agents[0], "message": "also this"}),
        )
        .await;
    assert_eq!(queued["structured_metadata"]["status"], "running");
    // With interrupt the held step is dropped and the message read at once.
    ws.invoke(
        &session,
        "send_input",
        json!({"target": agents[1], "message": "stop, do this", "interrupt": true}),
    )
    .await;
    let hasty = ws
        .invoke(&session, "wait_agent", json!({"ids": [agents[1]]}))
        .await;
    let hasty = &hasty["structured_metadata"]["agents"][0];
    assert_eq!(hasty["status"], "completed", "{hasty}");
    assert_eq!(hasty["answer"], "read: stop, do this");
    let patient = ws
        .invoke(
            &session,
            "wait_agent",
            json!({"ids": [agents[0]], "timeout_ms": 0}),
        )
        .await;
    assert_eq!(
        patient["structured_metadata"]["agents"][0]["status"], "running",
        "still held"
    );
    assert_eq!(patient["structured_metadata"]["timed_out"], true);

    release.notify_waiters();
    let patient = ws
        .invoke(&session, "wait_agent", json!({"ids": [agents[0]]}))
        .await;
    let patient = &patient["structured_metadata"]["agents"][0];
    assert_eq!(patient["status"], "completed", "{patient}");
    assert_eq!(patient["answer"], "read: also this");
    // The patient child's second request held its finished first answer, then the message.
    let requests = mock.requests();
    let second = requests
        .iter()
        .filter(|r| opener(r) == "patient")
        .nth(1)
        .unwrap();
    let contents: Vec<&str> = messages(second)
        .iter()
        .skip(1)
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents, ["patient", "working on it", "also this"]);
}

#[tokio::test]
async fn a_child_spends_the_parents_budget_and_may_use_another_model() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole("l", "list_dir", &json!({}))])
            .with_usage(100, 100),
        Reply::text(&["unreachable"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_tight_budget(&mock, &["other-model"])).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let spawned = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "spend", "model": "other-model"}),
        )
        .await;
    let agent = spawned["structured_metadata"]["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    let waited = ws.invoke(&session, "wait_agent", json!({})).await;
    let child = &waited["structured_metadata"]["agents"][0];
    assert_eq!(child["status"], "errored", "{child}");
    assert!(
        child["error"].as_str().unwrap().contains("budget"),
        "{child}"
    );
    assert_eq!(mock.request_count(), 1, "the second call was never made");
    assert_eq!(mock.requests()[0]["model"], "other-model");
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let rows = cost["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r["node_id"] == format!("agent:{agent}"))
    );
    assert_eq!(rows[0]["committed"], true);
    assert_eq!(rows[0]["model"], "other-model");
    assert_eq!(rows[1]["committed"], false);
    let task = app.get_json(&format!("/api/tasks/{agent}"), None).await;
    assert_eq!(task["state"], "failed");
    assert!(task["reason"].as_str().unwrap().contains("budget"));
}

#[tokio::test]
async fn cancelling_a_childs_task_stops_its_turn_but_keeps_it_open() {
    let release = Arc::new(Notify::new());
    let script = {
        let release = Arc::clone(&release);
        Script::route(
            move |request: &Value| match last(request)["content"].as_str() {
                Some("slow start") => Reply::hold(&["busy"], Arc::clone(&release), &["late"]),
                Some(text) => Reply::text(&[&format!("read: {text}")]),
                None => Reply::text(&["?"]),
            },
        )
    };
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let spawned = ws
        .invoke(&session, "spawn_agent", json!({"message": "slow start"}))
        .await;
    let agent = spawned["structured_metadata"]["agent_id"]
        .as_str()
        .unwrap()
        .to_string();
    mock.wait_for_requests(1, crate::support::WAIT).await;
    let (status, body) = app
        .request(
            reqwest::Method::POST,
            &format!("/api/tasks/{agent}/cancel"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer, json!({"task_id": agent, "state": "cancelled"}));
    let task = app.get_json(&format!("/api/tasks/{agent}"), None).await;
    assert_eq!(task["state"], "cancelled");
    assert_eq!(task["reason"], "cancelled on request");

    // Still open: a new message starts a new turn with its history.
    let sent = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": agent, "message": "try again"}),
        )
        .await;
    assert_eq!(sent["success"], true, "{sent}");
    let waited = ws
        .invoke(&session, "wait_agent", json!({"ids": [agent]}))
        .await;
    let child = &waited["structured_metadata"]["agents"][0];
    assert_eq!(child["status"], "completed", "{waited}");
    assert_eq!(child["answer"], "read: try again");
    release.notify_waiters();
}

#[tokio::test]
async fn children_calling_at_once_cannot_spend_past_the_cap_together() {
    let release = Arc::new(Notify::new());
    let script = {
        let release = Arc::clone(&release);
        Script::route(move |_: &Value| {
            Reply::hold(&["half"], Arc::clone(&release), &[" done"]).with_usage(100, 100)
        })
    };
    let mock = MockLlm::start(script).await;
    // One call reserves just over 1 USD: two cannot both fit in the cap.
    let app = TestApp::spawn_with(with_tight_budget(&mock, &[])).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let mut ids = Vec::new();
    for task in ["one", "two"] {
        let spawned = ws
            .invoke(&session, "spawn_agent", json!({"message": task}))
            .await;
        ids.push(spawned["structured_metadata"]["agent_id"].clone());
    }
    // One child holds its reservation while its call is held open; the other is refused.
    let first = ws.invoke(&session, "wait_agent", json!({"ids": ids})).await;
    let agents = first["structured_metadata"]["agents"].as_array().unwrap();
    let refused: Vec<&Value> = agents.iter().filter(|a| a["status"] == "errored").collect();
    assert_eq!(refused.len(), 1, "{first}");
    assert!(refused[0]["error"].as_str().unwrap().contains("budget"));
    assert_eq!(
        mock.request_count(),
        1,
        "the refused child never called the model"
    );

    // One call is held: a stored permit wakes it even if it has not reached its wait yet.
    release.notify_one();
    let second = ws.invoke(&session, "wait_agent", json!({})).await;
    let completed: Vec<&Value> = second["structured_metadata"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["status"] == "completed")
        .collect();
    assert_eq!(completed.len(), 1, "{second}");
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert!(cost["session_cost_usd"].as_f64().unwrap() <= 1.5, "{cost}");

    // A model the cap cannot price is refused while there is a cap.
    let unpriced = ws
        .invoke(
            &session,
            "spawn_agent",
            json!({"message": "free", "model": "unpriced-model"}),
        )
        .await;
    assert_eq!(unpriced["success"], false);
    assert!(
        unpriced["output"].as_str().unwrap().contains("no price"),
        "{unpriced}"
    );
}

#[tokio::test]
async fn waiting_holds_off_nothing_and_without_ids_ignores_children_already_done() {
    let release = Arc::new(Notify::new());
    let script = {
        let release = Arc::clone(&release);
        Script::route(move |request: &Value| match opener(request).as_str() {
            "quick" => Reply::text(&["quick answer"]),
            _ => Reply::hold(&["slow"], Arc::clone(&release), &[" answer"]),
        })
    };
    let mock = MockLlm::start(script).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.invoke(&session, "spawn_agent", json!({"message": "quick"}))
        .await;
    let quick = ws.invoke(&session, "wait_agent", json!({})).await;
    assert_eq!(
        quick["structured_metadata"]["agents"][0]["status"],
        "completed"
    );
    ws.invoke(&session, "spawn_agent", json!({"message": "slow"}))
        .await;
    mock.wait_for_requests(2, crate::support::WAIT).await;

    // Without ids the finished child does not end the wait: it runs out of time instead.
    let short = ws
        .invoke(&session, "wait_agent", json!({"timeout_ms": 50}))
        .await;
    assert_eq!(short["structured_metadata"]["timed_out"], true, "{short}");
    let statuses: Vec<&str> = short["structured_metadata"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["completed", "running"], "in the order spawned");

    // A long wait leaves the session free: an exclusive call goes through meanwhile.
    let waiting = ws
        .send(
            "tool/invoke",
            json!({"session_id": session, "name": "wait_agent", "arguments": {}}),
        )
        .await;
    let (seen, written) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "write_file",
                   "arguments": {"path": "during.txt", "content": "x"}}),
        )
        .await;
    assert_eq!(written["result"]["success"], true, "{written}");
    assert!(
        !seen.iter().any(|m| m["id"] == json!(waiting)),
        "the wait answered before the write"
    );
    release.notify_waiters();
    loop {
        let message = ws.next_json().await;
        if message["id"] == json!(waiting) {
            let agents = &message["result"]["structured_metadata"]["agents"];
            assert_eq!(agents[1]["answer"], "slow answer", "{message}");
            break;
        }
    }
}

#[tokio::test]
async fn a_child_goes_on_after_a_restart_from_its_history_unless_it_was_closed() {
    let script = Script::route(|request: &Value| {
        let said: Vec<&str> = messages(request)
            .iter()
            .skip(1)
            .filter_map(|m| m["content"].as_str())
            .collect();
        Reply::text(&[&format!("heard {}", said.join(" / "))])
    });
    let mock = MockLlm::start(script).await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(|c| configure(c)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let mut agents = Vec::new();
    for task in ["remember the code 41", "forget me"] {
        let spawned = ws
            .invoke(&session, "spawn_agent", json!({"message": task}))
            .await;
        agents.push(
            spawned["structured_metadata"]["agent_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        ws.invoke(&session, "wait_agent", json!({"ids": [agents.last()]}))
            .await;
    }
    ws.invoke(&session, "close_agent", json!({"target": agents[1]}))
        .await;
    drop(ws);
    let dir = app.stop().await;

    let mut config = crate::support::config_in(dir.path());
    with_model(&mock)(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    ws.result("session/open", json!({"session_id": session}))
        .await;
    // Named again, the first child is back, finished as it was, and takes more work.
    let waited = ws
        .invoke(
            &session,
            "wait_agent",
            json!({"ids": [agents[0]], "timeout_ms": 0}),
        )
        .await;
    let child = &waited["structured_metadata"]["agents"][0];
    assert_eq!(child["status"], "completed", "{waited}");
    assert_eq!(child["answer"], "heard remember the code 41");
    let sent = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": agents[0], "message": "what was the code?"}),
        )
        .await;
    assert_eq!(sent["success"], true, "{sent}");
    let waited = ws
        .invoke(&session, "wait_agent", json!({"ids": [agents[0]]}))
        .await;
    assert_eq!(
        waited["structured_metadata"]["agents"][0]["answer"],
        "heard remember the code 41 / heard remember the code 41 / what was the code?"
    );
    let transcript = app
        .get_json(&format!("/api/tasks/{}/output?lines=100", agents[0]), None)
        .await;
    let text = transcript["text"].as_str().unwrap();
    assert!(
        text.starts_with("user: remember the code 41\n")
            && text.contains("user: what was the code?"),
        "one transcript across both starts:\n{text}"
    );
    // The closed one stays closed.
    let closed = ws
        .invoke(
            &session,
            "send_input",
            json!({"target": agents[1], "message": "hello?"}),
        )
        .await;
    assert_eq!(closed["success"], false);
    assert!(
        closed["output"].as_str().unwrap().contains("was closed"),
        "{closed}"
    );
}
