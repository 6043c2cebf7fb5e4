//! What a new user meets first: the README's own start in an empty directory, a restart that
//! leaves nothing hanging, long commands in the background, titles, and a fork's costs.

use serde_json::{Value, json};

use super::agent::with_model;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use crate::support::{ServerProcess, TestApp, config_in};

fn text_input(text: &str) -> Value {
    json!([{"kind": "text", "text": text}])
}

/// `ask = ["shell"]`: every shell call waits for a person.
fn asking(c: &mut agentd::config::Config) {
    c.tool_policy.ask = vec!["shell".into()];
}

fn of<'a>(notes: &'a [Value], method: &str) -> Vec<&'a Value> {
    notes
        .iter()
        .filter(|n| n["method"] == method)
        .map(|n| &n["params"])
        .collect()
}

#[tokio::test]
async fn the_readme_start_in_an_empty_directory_runs_shell_and_python() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let server = tokio::task::spawn_blocking({
        let cwd = cwd.clone();
        move || ServerProcess::start_bare(&cwd)
    })
    .await
    .unwrap();
    let log = server.startup_log.join("\n");
    // The start-up log names both directories absolutely and says no model is configured.
    let workspace = cwd.join("workspace");
    assert!(
        log.contains(&format!("workspace={}", workspace.display())),
        "{log}"
    );
    assert!(
        log.contains(&format!("data_dir={}", cwd.join("data").display())),
        "{log}"
    );
    assert!(log.contains("no model is configured"), "{log}");
    assert!(cwd.join("data/agentd.db").is_file());

    let mut ws = server.ws().await;
    let session = ws.open().await;
    let pwd = ws
        .invoke(
            &session,
            "shell",
            json!({"command": "pwd && echo made > made.txt"}),
        )
        .await;
    assert_eq!(pwd["success"], true, "{pwd}");
    assert!(
        pwd["output"]
            .as_str()
            .unwrap()
            .contains(&workspace.display().to_string()),
        "{pwd}"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("made.txt")).unwrap(),
        "made\n"
    );
    // Whatever `python3` PATH finds first (here a version manager's shim under the home).
    let python = ws
        .invoke(
            &session,
            "shell",
            json!({"command": "python3 -c 'print(6 * 7)'"}),
        )
        .await;
    assert_eq!(python["success"], true, "{python}");
    assert!(
        python["output"].as_str().unwrap().contains("42"),
        "{python}"
    );
    let exec = ws
        .invoke(&session, "exec_command", json!({"cmd": "pwd"}))
        .await;
    assert_eq!(exec["success"], true, "{exec}");
    drop(server);

    // check-config, from the same place, shows the paths in force.
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("check-config")
        .current_dir(&cwd)
        .env_remove("AGENTD_WORKSPACE")
        .env_remove("AGENTD_DATA_DIR")
        .env_remove("AGENTD_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{text}");
    assert!(
        text.contains(&format!("workspace = \"{}\"", workspace.display())),
        "{text}"
    );
}

/// The events a restarted server stored after `after`, read by a new client's replay.
async fn replay(ws: &mut crate::support::WsClient, session: &str) -> Vec<Value> {
    let (notes, opened) = ws
        .call(
            "session/open",
            json!({"session_id": session, "after_seq": 0}),
        )
        .await;
    assert_eq!(opened["result"]["resumed"], true, "{opened}");
    notes
}

/// Checks that the turn waiting on `asked` was ended, in order, as a restart ends it.
fn assert_ended_by_restart(notes: &[Value], turn_id: &Value, asked: &Value) {
    let tail: Vec<&str> = notes
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|n| n["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        tail,
        ["approval/resolved", "tool/completed", "turn/completed"],
        "{notes:#?}"
    );
    let resolved = of(notes, "approval/resolved");
    assert_eq!(resolved.len(), 1, "{notes:#?}");
    assert_eq!(resolved[0]["approval_id"], asked["approval_id"]);
    assert_eq!(resolved[0]["decision"], "decline");
    assert_eq!(resolved[0]["reason"], "server_restarted");
    let completed = of(notes, "tool/completed");
    assert_eq!(completed[0]["tool_call_id"], asked["tool_call_id"]);
    assert_eq!(completed[0]["success"], false);
    assert_eq!(completed[0]["turn_id"], *turn_id);
    let ended = of(notes, "turn/completed");
    assert_eq!(ended[0]["turn_id"], *turn_id);
    assert_eq!(ended[0]["reason"], "server_restarted");
    // Every event is numbered on from the last one the old process stored.
    let seqs: Vec<i64> = notes
        .iter()
        .map(|n| n["params"]["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}

#[tokio::test]
async fn a_restart_while_a_model_call_waits_for_approval_ends_the_turn() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_rm",
            "shell",
            &json!({"command": "rm -f kept"}),
        )]),
        Reply::text(&["back again"]),
    ]))
    .await;
    let app = TestApp::spawn_with(|c| {
        with_model(&mock)(c);
        asking(c);
    })
    .await;
    std::fs::write(app.workspace().join("kept"), "x").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let started = ws
        .result(
            "turn/start",
            json!({"session_id": session, "input": text_input("clean up")}),
        )
        .await;
    let asked = ws.notification("approval/requested").await;
    drop(ws);
    let dir = app.stop().await;

    let mut config = config_in(dir.path());
    with_model(&mock)(&mut config);
    asking(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let notes = replay(&mut ws, &session).await;
    assert_ended_by_restart(&notes, &started["turn_id"], &asked);
    assert!(app.workspace().join("kept").exists(), "a declined call ran");

    // Nothing runs now: an interrupt says so, and the next turn starts and ends.
    let interrupted = ws
        .result("turn/interrupt", json!({"session_id": session}))
        .await;
    assert_eq!(interrupted, json!({"interrupted": false}));
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("again")}),
    )
    .await;
    let done = ws.notification("turn/completed").await;
    assert_eq!(done["reason"], "completed", "{done}");
    // The model is sent a result for the call that never ran, so the conversation is valid.
    let last = mock.requests().pop().unwrap();
    let answered = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "tool" && m["tool_call_id"] == "call_rm");
    assert!(answered, "{last:#}");

    // A second restart finds nothing left to end.
    drop(ws);
    let dir = app.stop().await;
    let mut config = config_in(dir.path());
    with_model(&mock)(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let again = replay(&mut ws, &session).await;
    assert_eq!(of(&again, "approval/resolved").len(), 1);
    assert_eq!(
        again.last().unwrap()["method"],
        "turn/completed",
        "{again:#?}"
    );
    assert_eq!(again.last().unwrap()["params"]["reason"], "completed");
}

#[tokio::test]
async fn a_crash_while_a_call_waits_for_approval_is_ended_at_the_next_start() {
    let mock = MockLlm::start(Script::always(Reply::tool_calls(vec![
        ScriptedCall::whole("call_ls", "shell", &json!({"command": "ls"})),
    ])))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nworkspace = \"{}\"\n\
         [llm]\nbase_url = \"{}\"\nmodel = \"m\"\n[tool_policy]\nask = [\"shell\"]\n",
        dir.path().join("data").display(),
        dir.path().join("workspace").display(),
        mock.base_url(),
    );
    let start = |dir: std::path::PathBuf, config: String| {
        tokio::task::spawn_blocking(move || ServerProcess::start_config(&dir, &config))
    };
    let mut server = start(dir.path().to_path_buf(), config.clone())
        .await
        .unwrap();
    let mut ws = server.ws().await;
    let session = ws.open().await;
    let started = ws
        .result(
            "turn/start",
            json!({"session_id": session, "input": text_input("look")}),
        )
        .await;
    let asked = ws.notification("approval/requested").await;
    // No shutdown at all: the process dies where it stands.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(ws);

    let server = start(dir.path().to_path_buf(), config).await.unwrap();
    let log = server.startup_log.join("\n");
    assert!(log.contains("server_restarted"), "{log}");
    let mut ws = server.ws().await;
    let notes = replay(&mut ws, &session).await;
    assert_ended_by_restart(&notes, &started["turn_id"], &asked);
    let answer = ws
        .call(
            "approval/respond",
            json!({"session_id": session, "approval_id": asked["approval_id"], "decision": "accept"}),
        )
        .await
        .1;
    assert!(answer.get("error").is_some(), "{answer}");
}

#[tokio::test]
async fn shell_and_exec_command_run_in_the_background_on_request() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    for (tool, arguments) in [
        (
            "shell",
            json!({"command": "echo first; echo second", "run_in_background": true}),
        ),
        (
            "exec_command",
            json!({"cmd": "echo first; echo second", "run_in_background": true}),
        ),
    ] {
        let (notes, answer) = ws
            .call(
                "tool/invoke",
                json!({"session_id": session, "name": tool, "arguments": arguments}),
            )
            .await;
        let result = &answer["result"];
        assert_eq!(result["success"], true, "{answer}");
        let envelope: Value = serde_json::from_str(result["output"].as_str().unwrap()).unwrap();
        assert_eq!(envelope["ok"], true, "{envelope}");
        assert_eq!(envelope["read_with"], "read_task_output");
        let task_id = envelope["task_handle"].as_str().unwrap().to_string();
        assert_eq!(
            envelope["output_url"],
            format!("/api/tasks/{task_id}/output")
        );
        let completed = of(&notes, "tool/completed");
        assert_eq!(completed.len(), 1, "{notes:?}");
        let done = loop {
            let spawn = ws.notification("turn/spawn_complete").await;
            if spawn["task_id"] == task_id.as_str() {
                break spawn;
            }
        };
        assert_eq!(done["success"], true, "{done}");
        assert_eq!(done["tool_name"], tool);
        assert!(
            done["content"]
                .as_str()
                .unwrap()
                .starts_with("exit code: 0\n"),
            "{done}"
        );
        let output = app
            .get_json(&format!("/api/tasks/{task_id}/output?mode=head"), None)
            .await;
        let text = output["text"].as_str().unwrap();
        assert!(
            text.starts_with("first\nsecond\nexit code: 0\nwall time: "),
            "{output}"
        );
        assert!(
            text.ends_with("output: 13 bytes, in this task's log above (read_task_output)\n"),
            "{output}"
        );
        assert_eq!(output["state"], "completed");
        // The model reads it the same way.
        let read = ws
            .invoke(
                &session,
                "read_task_output",
                json!({"task_handle": task_id, "mode": {"kind": "tail", "lines": 1}}),
            )
            .await;
        assert!(
            read["output"]
                .as_str()
                .unwrap()
                .contains("read_task_output"),
            "{read}"
        );
        let read = ws
            .invoke(
                &session,
                "read_task_output",
                json!({"task_handle": task_id, "mode": {"kind": "grep", "pattern": "sec"}}),
            )
            .await;
        assert!(
            read["output"].as_str().unwrap().contains("second"),
            "{read}"
        );
    }
    // A terminal cannot go to the background: nobody could type into it.
    let refused = ws
        .invoke(
            &session,
            "exec_command",
            json!({"cmd": "cat", "tty": true, "run_in_background": true}),
        )
        .await;
    let text = refused.to_string();
    assert!(text.contains("tty and run_in_background"), "{text}");
}

#[tokio::test]
async fn titles_come_from_the_first_message_and_session_update_sets_them() {
    let mock = MockLlm::start(Script::always(Reply::text(&["ok"]))).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("\n  Fix the   flaky test\nin detail")}),
    )
    .await;
    ws.notification("turn/completed").await;
    let listed = app.get_json("/api/sessions", None).await;
    let row = &listed["sessions"][0];
    assert_eq!(row["title"], "Fix the flaky test", "{listed}");

    let updated = ws
        .result(
            "session/update",
            json!({"session_id": session, "title": "  Mine  "}),
        )
        .await;
    assert_eq!(updated, json!({"session_id": session, "title": "Mine"}));
    // A later first turn (after a reload of the actor) never replaces a title a person gave.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("something else")}),
    )
    .await;
    ws.notification("turn/completed").await;
    let one = app
        .get_json(&format!("/api/sessions/{session}"), None)
        .await;
    assert_eq!(one["title"], "Mine", "{one}");

    for bad in [json!(""), json!("two\nlines"), json!("x".repeat(201))] {
        let (_, answer) = ws
            .call(
                "session/update",
                json!({"session_id": session, "title": bad}),
            )
            .await;
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
    }
    let (_, unknown) = ws
        .call(
            "session/update",
            json!({"session_id": "nope", "title": "x"}),
        )
        .await;
    assert_eq!(unknown["error"]["data"]["kind"], "unknown_session");
}

#[tokio::test]
async fn a_fork_shows_what_it_inherited_apart_from_its_own_spend() {
    let mock = MockLlm::start(Script::always(
        Reply::text(&["ok"]).with_usage(1_000_000, 1_000_000),
    ))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("one")}),
    )
    .await;
    let first = ws.notification("turn/completed").await;
    // 1 M tokens in at 1 USD and 1 M out at 2 USD.
    assert_eq!(first["session_cost_usd"], 3.0, "{first}");
    let forked = ws
        .result("session/fork", json!({"session_id": session}))
        .await;
    let fork = forked["session_id"].as_str().unwrap().to_string();
    // The source spends more after the fork point; the fork inherits none of that.
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": text_input("two")}),
    )
    .await;
    ws.notification("turn/completed").await;

    let cost = app
        .get_json(&format!("/api/sessions/{fork}/cost"), None)
        .await;
    assert_eq!(cost["inherited_usd"], 3.0, "{cost}");
    assert_eq!(cost["session_cost_usd"], 0.0, "{cost}");
    let source = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    assert_eq!(source["inherited_usd"], 0.0);
    assert_eq!(source["session_cost_usd"], 6.0);
    // A fork of the fork inherits the whole chain up to its point.
    let again = ws.result("session/fork", json!({"session_id": fork})).await;
    let cost = app
        .get_json(
            &format!(
                "/api/sessions/{}/cost",
                again["session_id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(cost["inherited_usd"], 3.0, "{cost}");
}
