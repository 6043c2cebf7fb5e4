//! Background work end to end: a spawn_only plugin's task, its envelope and events, every way
//! to read its output, cancellation, a crash mid-task, and a pipeline's cost rows.

use std::path::{Path, PathBuf};

use agentd::config::{Config, ModelCard, ModelPrice, PluginConfig};
use serde_json::{Value, json};

use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use crate::support::{ServerProcess, TestApp, WsClient};

/// A plugin that writes numbered lines to stderr until the file named by its argument exists,
/// then prints how many it wrote.
fn ticker(dir: &Path) -> (PluginConfig, PathBuf) {
    let script = dir.join("ticker.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\ni=0\nwhile [ ! -e \"$1\" ]; do i=$((i+1)); echo \"line $i\" >&2; sleep 0.02; done\necho \"done after $i lines\"\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    let stop = dir.join("stop");
    let plugin = PluginConfig {
        name: "ticker".into(),
        description: "Writes lines until told to stop.".into(),
        command: script.to_string_lossy().into_owned(),
        args: vec![stop.to_string_lossy().into_owned()],
        spawn_only: true,
        tags: vec!["runtime".into()],
        exclusive: false,
        timeout_ms: 600_000,
        input_schema: json!({"type": "object"}),
    };
    (plugin, stop)
}

fn with_ticker(dir: &Path) -> (impl FnOnce(&mut Config) + use<>, PathBuf) {
    let (plugin, stop) = ticker(dir);
    let scratch = dir.to_path_buf();
    // The stop file lies outside the workspace, where only `extra_read` lets a command look.
    let configure = move |c: &mut Config| {
        c.plugins.push(plugin);
        c.sandbox.extra_read.push(scratch);
    };
    (configure, stop)
}

/// Waits until a task/output/delta says `needle`, skipping other messages.
/// The model `m` at `url`, 100 completion tokens a call, priced at (input, output) USD per
/// million tokens, in sessions capped at `budget_usd`.
fn priced_model(url: String, price: (f64, f64), budget_usd: f64) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.llm.base_url = Some(url);
        c.llm.model = Some("m".into());
        c.llm.max_tokens = 100;
        c.llm.pricing.insert(
            "m".into(),
            ModelCard::priced(ModelPrice::new(price.0, price.1)),
        );
        c.budget.session_usd = Some(budget_usd);
    }
}

async fn until_output(ws: &mut WsClient, needle: &str) {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let params = ws.notification("task/output/delta").await;
        seen.push_str(params["text"].as_str().unwrap());
    }
}

#[tokio::test]
async fn a_spawn_only_plugin_runs_in_the_background_and_is_read_every_way() {
    let scratch = tempfile::tempdir().unwrap();
    let (configure, stop) = with_ticker(scratch.path());
    let app = TestApp::spawn_with(configure).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "ticker", "arguments": {}}),
        )
        .await;
    let methods: Vec<&str> = notes
        .iter()
        .map(|n| n["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, ["tool/started", "task/updated", "tool/completed"]);
    assert_eq!(notes[1]["params"]["state"], "running");
    let envelope: Value =
        serde_json::from_str(answer["result"]["output"].as_str().unwrap()).unwrap();
    let task = envelope["task_handle"].as_str().unwrap().to_string();
    assert_eq!(envelope["ok"], true);
    assert_eq!(envelope["read_with"], "read_task_output");
    assert_eq!(
        envelope["read_modes"],
        json!(["head", "tail", "grep", "line_range", "bytes"])
    );
    assert_eq!(envelope["output_url"], format!("/api/tasks/{task}/output"));
    assert_eq!(notes[1]["params"]["task_id"], task.as_str());

    until_output(&mut ws, "line 3\n").await;
    let head = app
        .get_json(&format!("/api/tasks/{task}/output?mode=head&lines=2"), None)
        .await;
    assert_eq!(head["text"], "line 1\nline 2\n");
    assert_eq!(head["state"], "running");
    assert_eq!(head["complete"], false);

    std::fs::write(&stop, "").unwrap();
    let updated = ws.notification("task/updated").await;
    assert_eq!(updated["state"], "completed");
    assert_eq!(updated["exit_code"], 0);
    let done = ws.notification("turn/spawn_complete").await;
    assert_eq!(done["task_id"], task.as_str());
    assert_eq!(done["success"], true);
    let lines = done["content"]
        .as_str()
        .unwrap()
        .trim()
        .strip_prefix("done after ")
        .and_then(|rest| rest.strip_suffix(" lines"))
        .unwrap()
        .parse::<usize>()
        .unwrap();
    assert!(lines >= 3);
    // The call took the one call path: counted once, with its background run's outcome.
    let (_, metrics) = app.get("/metrics", None).await;
    let counted = r#"agentd_tool_calls_total{tool="ticker",outcome="success"} 1"#;
    assert!(metrics.contains(counted), "missing {counted}\n{metrics}");

    let base = format!("/api/tasks/{task}/output");
    let tail = app
        .get_json(&format!("{base}?mode=tail&lines=2"), None)
        .await;
    assert_eq!(
        tail["text"],
        format!("line {lines}\ndone after {lines} lines\n")
    );
    assert_eq!(tail["complete"], true);
    let grep = app
        .get_json(&format!("{base}?mode=grep&pattern=line%202"), None)
        .await;
    assert!(
        grep["text"].as_str().unwrap().starts_with("line 2\n"),
        "{grep}"
    );
    let range = app
        .get_json(&format!("{base}?mode=line_range&start=2&end=3"), None)
        .await;
    assert_eq!(range["text"], "line 2\nline 3\n");
    let bytes = app
        .get_json(&format!("{base}?mode=bytes&offset=7&limit_bytes=7"), None)
        .await;
    assert_eq!(bytes["text"], "line 2\n");
    assert_eq!(bytes["next_offset"], 14);
    let (status, _) = app.get(&format!("{base}?mode=grep"), None).await;
    assert_eq!(status, 400, "grep needs a pattern");

    let over_ws = ws
        .result(
            "task/output/read",
            json!({"session_id": session, "task_id": task, "mode": "head", "lines": 1}),
        )
        .await;
    assert_eq!(over_ws["text"], "line 1\n");
    let listed = ws.result("task/list", json!({"session_id": session})).await;
    assert_eq!(listed["tasks"][0]["state"], "completed");
    assert_eq!(listed["tasks"][0]["total_bytes"], tail["total_bytes"]);

    // The model's own tools read the same data.
    let (_, read) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "read_task_output",
                   "arguments": {"task_handle": task, "mode": {"kind": "line_range", "start": 1, "end": 1}}}),
        )
        .await;
    assert!(
        read["result"]["output"]
            .as_str()
            .unwrap()
            .ends_with("line 1\n"),
        "{read}"
    );
    let (_, check) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "check_background_tasks", "arguments": {}}),
        )
        .await;
    assert!(
        check["result"]["output"]
            .as_str()
            .unwrap()
            .contains("ticker completed")
    );

    // Another session cannot see the task.
    let other = ws.open().await;
    let (_, foreign) = ws
        .call(
            "task/output/read",
            json!({"session_id": other, "task_id": task}),
        )
        .await;
    assert_eq!(foreign["error"]["data"]["kind"], "unknown_task");
    let (_, foreign) = ws
        .call(
            "tool/invoke",
            json!({"session_id": other, "name": "read_task_output", "arguments": {"task_handle": task}}),
        )
        .await;
    assert_eq!(foreign["result"]["success"], false);

    // The model learns of the result on its next turn: it is in the history.
    let history = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    let note = history["messages"][0]["content"].as_str().unwrap();
    assert!(note.contains(&task) && note.contains("completed"), "{note}");
}

#[tokio::test]
async fn a_task_can_be_cancelled_and_its_output_stays_readable() {
    let scratch = tempfile::tempdir().unwrap();
    let (configure, _stop) = with_ticker(scratch.path());
    let app = TestApp::spawn_with(configure).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let invoked = ws
        .result(
            "tool/invoke",
            json!({"session_id": session, "name": "ticker", "arguments": {}}),
        )
        .await;
    let envelope: Value = serde_json::from_str(invoked["output"].as_str().unwrap()).unwrap();
    let task = envelope["task_handle"].as_str().unwrap().to_string();
    until_output(&mut ws, "line 2\n").await;
    let (status, body) = app
        .request(
            reqwest::Method::POST,
            &format!("/api/tasks/{task}/cancel"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["state"], "cancelled");
    let row = app.get_json(&format!("/api/tasks/{task}"), None).await;
    assert_eq!(row["state"], "cancelled");
    assert!(row["finished_at"].is_string());
    let head = app
        .get_json(&format!("/api/tasks/{task}/output?lines=2"), None)
        .await;
    assert_eq!(head["text"], "line 1\nline 2\n");
    let again = ws
        .result(
            "task/cancel",
            json!({"session_id": session, "task_id": task}),
        )
        .await;
    assert_eq!(again, json!({"task_id": task, "state": "cancelled"}));
}

#[tokio::test]
async fn a_task_running_when_the_server_dies_is_failed_after_restart_with_its_output() {
    let scratch = tempfile::tempdir().unwrap();
    let (plugin, stop) = ticker(scratch.path());
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        dir.path(),
        &format!(
            "\n[[plugins]]\nname = \"ticker\"\ndescription = \"ticks\"\ncommand = \"{cmd}\"\nargs = [\"{stop}\"]\nspawn_only = true\nexclusive = false\n",
            cmd = plugin.command,
            stop = plugin.args[0],
        ),
    );
    let address = server.addr;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{address}/api/ws"))
        .await
        .unwrap();
    use futures_util::{SinkExt, StreamExt};
    let send = |id: u64, method: &str, params: Value| {
        tokio_tungstenite::tungstenite::Message::Text(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                .to_string()
                .into(),
        )
    };
    ws.send(send(1, "session/open", json!({}))).await.unwrap();
    let mut session = String::new();
    let mut task = String::new();
    while let Some(Ok(message)) = ws.next().await {
        let message: Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
        if message["id"] == 1 {
            session = message["result"]["session_id"]
                .as_str()
                .unwrap()
                .to_string();
            ws.send(send(
                2,
                "tool/invoke",
                json!({"session_id": session, "name": "ticker", "arguments": {}}),
            ))
            .await
            .unwrap();
        }
        if message["method"] == "task/updated" {
            task = message["params"]["task_id"].as_str().unwrap().to_string();
        }
        if message["method"] == "task/output/delta"
            && message["params"]["text"]
                .as_str()
                .unwrap()
                .contains("line 2")
        {
            break;
        }
    }
    assert!(!task.is_empty());
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();

    let mut config = crate::support::config_in(dir.path());
    config.plugins.push(plugin);
    let app = TestApp::start_in(dir, config).await;
    let row = app.get_json(&format!("/api/tasks/{task}"), None).await;
    assert_eq!(row["state"], "failed");
    assert_eq!(row["exit_code"], Value::Null);
    assert!(row["reason"].as_str().unwrap().contains("stopped"), "{row}");
    let head = app
        .get_json(&format!("/api/tasks/{task}/output?lines=2"), None)
        .await;
    assert_eq!(head["text"], "line 1\nline 2\n");
    assert_eq!(head["complete"], true);
    let listed = app
        .get_json(&format!("/api/sessions/{session}/tasks"), None)
        .await;
    assert_eq!(listed["tasks"][0]["state"], "failed");
    // The orphaned plugin, if it outlived its pipe, stops now.
    std::fs::write(&stop, "").unwrap();
}

#[tokio::test]
async fn a_pipeline_diamond_bills_every_node() {
    // The agent calls run_pipeline, then answers; pipeline nodes (requests without tools)
    // answer by their prompt.
    let script = Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let has_tools = request
            .get("tools")
            .is_some_and(|t| !t.as_array().unwrap().is_empty());
        let last = messages.last().unwrap();
        if !has_tools {
            let prompt = last["content"].as_str().unwrap();
            let node = prompt.split_whitespace().next().unwrap().to_string();
            return Reply::text(&[&format!("out-{node}")]).with_usage(100, 10);
        }
        if last["role"] == "tool" {
            return Reply::text(&["started it"]).with_usage(50, 5);
        }
        Reply::tool_calls(vec![ScriptedCall::whole(
            "p1",
            "run_pipeline",
            &json!({"nodes": [
                {"id": "a", "prompt": "a: start"},
                {"id": "b", "prompt": "b: left {{a}}", "depends_on": ["a"]},
                {"id": "c", "prompt": "c: right {{a}}", "depends_on": ["a"]},
                {"id": "d", "prompt": "d: join", "depends_on": ["b", "c"]}
            ]}),
        )])
        .with_usage(50, 5)
    });
    let mock = MockLlm::start(script).await;
    let url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(url);
        c.llm.model = Some("m".into());
        c.llm
            .pricing
            .insert("m".into(), ModelCard::priced(ModelPrice::new(10.0, 20.0)));
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "plan it"}]}),
    )
    .await;
    let done = ws.notification("turn/spawn_complete").await;
    assert_eq!(done["tool_name"], "run_pipeline");
    assert_eq!(done["success"], true, "{done}");
    let rows = done["node_costs"].as_array().unwrap();
    let mut nodes: Vec<&str> = rows
        .iter()
        .map(|r| r["node_id"].as_str().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "b", "c", "d"]);
    let node_usd: f64 = rows.iter().map(|r| r["actual_usd"].as_f64().unwrap()).sum();
    let per_node = 100.0 * 10.0 / 1e6 + 10.0 * 20.0 / 1e6;
    assert!((node_usd - 4.0 * per_node).abs() < 1e-12, "{node_usd}");

    // Node b saw a's output where its prompt placed it.
    let prompts: Vec<String> = mock
        .requests()
        .iter()
        .filter(|r| r.get("tools").is_none())
        .map(|r| {
            r["messages"].as_array().unwrap().last().unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        prompts.contains(&"b: left out-a:".to_string()),
        "{prompts:?}"
    );

    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let ledger = cost["rows"].as_array().unwrap();
    let agent_usd: f64 = ledger
        .iter()
        .filter(|r| r["node_id"] == "agent")
        .map(|r| r["actual_usd"].as_f64().unwrap())
        .sum();
    assert_eq!(ledger.iter().filter(|r| r["node_id"] != "agent").count(), 4);
    let total = cost["session_cost_usd"].as_f64().unwrap();
    assert!(
        (total - (agent_usd + 4.0 * per_node)).abs() < 1e-12,
        "{cost}"
    );
    assert!(
        ledger
            .iter()
            .filter(|r| r["node_id"] != "agent")
            .all(|r| r["task_id"] == done["task_id"])
    );
}

#[tokio::test]
async fn a_background_pipeline_from_a_turn_gives_its_budget_back_when_it_ends() {
    // A turn starts run_pipeline in the background. The task holds what is left of the budget
    // while it runs and must give it back when it ends; the call that started it holds nothing.
    let script = Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        let has_tools = request
            .get("tools")
            .is_some_and(|t| !t.as_array().unwrap().is_empty());
        let last = messages.last().unwrap();
        if !has_tools {
            return Reply::text(&["node output"]).with_usage(100, 10);
        }
        if last["role"] == "tool" {
            return Reply::text(&["started it"]).with_usage(50, 5);
        }
        if last["content"] == "thanks" {
            return Reply::text(&["you are welcome"]).with_usage(50, 5);
        }
        Reply::tool_calls(vec![ScriptedCall::whole(
            "p1",
            "run_pipeline",
            &json!({"nodes": [{"id": "a", "prompt": "a: start"}, {"id": "b", "prompt": "b", "depends_on": ["a"]}]}),
        )])
        .with_usage(50, 5)
    });
    let mock = MockLlm::start(script).await;
    // Room for many calls of this size.
    let app = TestApp::spawn_with(priced_model(mock.base_url(), (10.0, 20.0), 1.0)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "plan it"}]}),
    )
    .await;
    // The turn's second model call may or may not meet the running task's hold; what counts
    // is that the task had the budget to run and gave it back.
    let (mut spawned, mut turn_ended) = (None, false);
    while spawned.is_none() || !turn_ended {
        let message = ws.next_json().await;
        match message["method"].as_str() {
            Some("turn/spawn_complete") => spawned = Some(message["params"].clone()),
            Some("turn/completed" | "turn/error") => turn_ended = true,
            _ => {}
        }
    }
    let spawned = spawned.unwrap();
    assert_eq!(
        spawned["success"], true,
        "the task had budget to run: {spawned}"
    );
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "thanks"}]}),
    )
    .await;
    loop {
        let message = ws.next_json().await;
        match message["method"].as_str() {
            Some("turn/completed") => break,
            Some("turn/error") => panic!("nothing is held any more: {message}"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_graceful_shutdown_records_running_tasks_as_cancelled() {
    let scratch = tempfile::tempdir().unwrap();
    let (plugin, _stop) = ticker(scratch.path());
    let keep = plugin.clone();
    let app = TestApp::spawn_with(move |c| c.plugins.push(plugin)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let invoked = ws
        .result(
            "tool/invoke",
            json!({"session_id": session, "name": "ticker", "arguments": {}}),
        )
        .await;
    let envelope: Value = serde_json::from_str(invoked["output"].as_str().unwrap()).unwrap();
    let task = envelope["task_handle"].as_str().unwrap().to_string();
    until_output(&mut ws, "line 1\n").await;
    drop(ws);
    let dir = app.stop().await;

    let mut config = crate::support::config_in(dir.path());
    config.plugins.push(keep);
    let app = TestApp::start_in(dir, config).await;
    let row = app.get_json(&format!("/api/tasks/{task}"), None).await;
    assert_eq!(row["state"], "cancelled", "{row}");
    assert!(row["total_bytes"].as_u64().unwrap() > 0);
    let head = app
        .get_json(&format!("/api/tasks/{task}/output?lines=1"), None)
        .await;
    assert_eq!(head["text"], "line 1\n");
}

#[tokio::test]
async fn concurrent_pipelines_cannot_spend_past_the_budget_together() {
    // The first pipeline's model call waits until the second pipeline has been judged, so the
    // two really overlap.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::hold(&["node "], std::sync::Arc::clone(&release), &["output"]).with_usage(100, 100),
    ]))
    .await;
    // One node reserves just over 1 USD; the cap leaves room for one, not two.
    let app = TestApp::spawn_with(priced_model(mock.base_url(), (1.0, 10_000.0), 1.5)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let pipeline = json!({"nodes": [{"id": "only", "prompt": "say something"}]});
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let (notes, _) = ws
            .call(
                "tool/invoke",
                json!({"session_id": session, "name": "run_pipeline", "arguments": pipeline}),
            )
            .await;
        outcomes.extend(
            notes
                .iter()
                .filter(|n| n["method"] == "turn/spawn_complete")
                .map(|n| n["params"]["success"].as_bool().unwrap()),
        );
    }
    if outcomes.is_empty() {
        let done = ws.notification("turn/spawn_complete").await;
        outcomes.push(done["success"].as_bool().unwrap());
    }
    assert_eq!(
        outcomes,
        [false],
        "the second pipeline is refused while the first holds the budget"
    );
    release.notify_one();
    let done = ws.notification("turn/spawn_complete").await;
    outcomes.push(done["success"].as_bool().unwrap());
    outcomes.sort();
    assert_eq!(
        outcomes,
        [false, true],
        "one pipeline ran, the other was refused"
    );
    let cost = app
        .get_json(&format!("/api/sessions/{session}/cost"), None)
        .await;
    let rows = cost["rows"].as_array().unwrap();
    assert_eq!(rows.iter().filter(|r| r["committed"] == true).count(), 1);
    assert_eq!(rows.iter().filter(|r| r["committed"] == false).count(), 1);
    assert!(cost["session_cost_usd"].as_f64().unwrap() <= 1.5);
}
