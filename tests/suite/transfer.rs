//! A session exported as JSON Lines and imported as a new session that carries on.

use serde_json::{Value, json};

use crate::suite::agent::run_turn;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script};

#[tokio::test]
async fn an_exported_session_imports_as_a_new_one_that_carries_on() {
    let mock = MockLlm::start(Script::always(Reply::text(&["noted"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    std::fs::create_dir_all(app.workspace().join("proj")).unwrap();
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({"cwd": "proj"})).await;
    let source = opened["session_id"].as_str().unwrap().to_string();
    let (_, end) = run_turn(&mut ws, &source, "remember the number 42").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let started = ws
        .invoke(
            &source,
            "shell",
            json!({"command": "echo from the background", "run_in_background": true}),
        )
        .await;
    let envelope: Value = serde_json::from_str(started["output"].as_str().unwrap()).unwrap();
    let task = envelope["task_handle"].as_str().unwrap().to_string();
    while ws.notification("turn/spawn_complete").await["task_id"] != task.as_str() {}

    let response = reqwest::get(app.url(&format!("/api/sessions/{source}/export")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/jsonl");
    let body = response.text().await.unwrap();
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "session");
    assert_eq!(lines[0]["session_id"], source.as_str());
    assert_eq!(lines[0]["cwd"], "proj");
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"message") && kinds.contains(&"event") && kinds.contains(&"cost"));
    let tasks: Vec<&Value> = lines.iter().filter(|l| l["type"] == "task").collect();
    assert_eq!(tasks.len(), 1, "{body}");
    assert_eq!(
        (
            &tasks[0]["task_id"],
            &tasks[0]["state"],
            &tasks[0]["tool_name"]
        ),
        (&json!(task), &json!("completed"), &json!("shell"))
    );

    let imported = reqwest::Client::new()
        .post(app.url("/api/sessions/import"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(imported.status(), 201);
    let imported: Value = imported.json().await.unwrap();
    let copy = imported["session_id"].as_str().unwrap().to_string();
    assert_ne!(copy, source);
    assert_eq!(imported["cwd"], "proj");
    assert_eq!(imported["title"], lines[0]["title"]);

    // The same history and cost; the events replay under the new id, gapless.
    let get = async |path: String| app.get_json(&path, None).await;
    assert_eq!(
        get(format!("/api/sessions/{copy}/messages")).await,
        get(format!("/api/sessions/{source}/messages")).await
    );
    assert_eq!(
        get(format!("/api/sessions/{copy}/cost")).await["session_cost_usd"],
        get(format!("/api/sessions/{source}/cost")).await["session_cost_usd"]
    );
    let mut other = app.ws().await;
    let (events, _) = other
        .call("session/open", json!({"session_id": copy, "after_seq": 0}))
        .await;
    let replayed: Vec<&Value> = events.iter().filter(|e| e["method"].is_string()).collect();
    let exported = lines.iter().filter(|l| l["type"] == "event").count();
    assert_eq!(replayed.len(), exported);
    for (at, event) in replayed.iter().enumerate() {
        assert_eq!(event["params"]["session_id"], copy.as_str());
        assert_eq!(event["params"]["seq"], at as i64 + 1);
    }
    // The task's record comes along under a new id, which the events use; its output does not.
    let copied = get(format!("/api/sessions/{copy}/tasks")).await;
    let copied = &copied["tasks"][0];
    let new_task = copied["task_id"].as_str().unwrap().to_string();
    assert_ne!(new_task, task);
    assert_eq!(
        (&copied["state"], &copied["tool_name"]),
        (&json!("completed"), &json!("shell"))
    );
    let named: Vec<&&Value> = replayed
        .iter()
        .filter(|e| e["method"] == "task/updated")
        .collect();
    assert!(!named.is_empty());
    assert!(
        named
            .iter()
            .all(|e| e["params"]["task_id"] == new_task.as_str()),
        "{named:?}"
    );
    let (status, output) = app
        .get(&format!("/api/tasks/{new_task}/output"), None)
        .await;
    assert_eq!(status, 200, "{output}");
    assert!(!output.contains("from the background"), "{output}");

    // It carries on: the next turn's request holds the imported conversation.
    let (_, end) = run_turn(&mut other, &copy, "what was the number?").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let last = mock.requests().last().unwrap().to_string();
    assert!(last.contains("remember the number 42"), "{last}");

    // What is not an export is refused, in the one error shape.
    for bad in ["", "not json", "{\"type\":\"event\"}"] {
        let refused = reqwest::Client::new()
            .post(app.url("/api/sessions/import"))
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "{bad}");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["kind"], "invalid_params", "{bad}");
    }
    let (status, _) = app.get("/api/sessions/nope/export", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn agentd_export_and_import_carry_a_session_on_the_command_line() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mock = MockLlm::start(Script::always(Reply::text(&["noted"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let mut ws = app.ws().await;
    let source = ws.open().await;
    let (_, end) = run_turn(&mut ws, &source, "remember the number 42").await;
    assert_eq!(end["reason"], "completed", "{end}");
    drop(ws);
    let dir = app.stop().await;
    let config = dir.path().join("agentd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{}\"\nworkspace = \"{}\"\n[sandbox]\nmode = \"off\"\n",
            dir.path().join("data").display(),
            dir.path().join("workspace").display()
        ),
    )
    .unwrap();
    let agentd = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentd"));
        command
            .args(args)
            .args(["--config", config.to_str().unwrap()])
            .env_remove("AGENTD_LLM_BASE_URL")
            .env_remove("AGENTD_LLM_MODEL");
        command
    };
    let exported = agentd(&["export", &source]).output().unwrap();
    assert!(exported.status.success(), "{exported:?}");
    let body = String::from_utf8(exported.stdout).unwrap();
    assert!(body.lines().count() > 3, "{body}");

    let mut import = agentd(&["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    import
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let imported = import.wait_with_output().unwrap();
    assert!(imported.status.success(), "{imported:?}");
    let new_id = String::from_utf8(imported.stdout)
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(new_id, source);

    // The new session holds the same events and history as the source, under its own id.
    let again = agentd(&["export", &new_id]).output().unwrap();
    assert!(again.status.success(), "{again:?}");
    let shape = |text: &str| -> Vec<(String, String)> {
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|l| l["type"] != "session")
            .map(|l| {
                let kind = l["type"].as_str().unwrap().to_string();
                let what = match kind.as_str() {
                    "event" => l["method"].to_string(),
                    _ => l["message"]["content"].to_string(),
                };
                (kind, what)
            })
            .collect()
    };
    let copy = String::from_utf8(again.stdout).unwrap();
    assert_eq!(shape(&copy), shape(&body));
    assert!(copy.contains(&new_id) && copy.contains("remember the number 42"));

    // A broken export is refused with one line and exit code 2, and creates nothing.
    let mut broken = agentd(&["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    broken
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"type\": \"nonsense\"}\n")
        .unwrap();
    let refused = broken.wait_with_output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let missing = agentd(&["export", "no-such-session"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
}

/// Bob imports exports made to lift his budget, to confirm the contents of Alice's files by
/// their hash, and to have a revert write `.git/config`: each is refused whole, with the line
/// or the checkpoint at fault, and no session is made.
#[tokio::test]
async fn an_import_is_refused_what_it_cannot_have_made_itself() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let mock = MockLlm::start(Script::always(Reply::text(&["noted"]))).await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
        c.server.users = ["alice", "bob"]
            .map(|name| agentd::config::UserConfig {
                name: name.into(),
                token: agentd::config::Secret::new(format!("{name}-token")),
            })
            .to_vec();
    })
    .await;
    // Alice's secret is in the checkpoint store once a turn of hers has run.
    let secret = "alice's secret\n";
    std::fs::create_dir_all(app.workspace().join("alice")).unwrap();
    std::fs::write(app.workspace().join("alice/secret.txt"), secret).unwrap();
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let session = alice.open().await;
    let (_, end) = run_turn(&mut alice, &session, "hello").await;
    assert_eq!(end["reason"], "completed", "{end}");

    let header = json!({"type": "session", "version": 1, "session_id": "x", "cwd": ""});
    let hash = |bytes: &[u8]| {
        sha2::Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let manifest = |path: &str, sha: &str, size: usize| {
        json!({"type": "checkpoint", "manifest": {
            "version": 1, "name": "t1", "order": 1,
            "files": [[path, sha, size, 0, 0, 0]], "skipped": [],
        }})
    };
    let blob = |bytes: &[u8]| {
        json!({"type": "blob", "sha256": hash(bytes),
               "data": base64::engine::general_purpose::STANDARD.encode(bytes)})
    };
    let cost = |usd: f64, at: &str| {
        json!({"type": "cost", "session_id": "x", "node_id": "agent", "model": "m",
               "reserved_usd": 0.0, "actual_usd": usd, "tokens_in": 1, "tokens_out": 1,
               "committed": true, "turn_id": null, "task_id": null, "created_at": at})
    };
    let planted = b"[core]\n\tfsmonitor = rm -rf ~\n";
    let attempts = [
        (
            vec![manifest(
                "stolen.txt",
                &hash(secret.as_bytes()),
                secret.len(),
            )],
            "lacks",
        ),
        (
            vec![
                blob(planted),
                manifest(".git/config", &hash(planted), planted.len()),
            ],
            ".git/config",
        ),
        (
            vec![
                blob(planted),
                manifest("../escape", &hash(planted), planted.len()),
            ],
            "../escape",
        ),
        (vec![cost(-1000.0, "2026-01-01T00:00:00Z")], "line 2"),
        (vec![cost(0.5, "2099-01-01T00:00:00Z")], "future"),
    ];
    for (records, expected) in attempts {
        let mut body = format!("{header}\n");
        for record in &records {
            body.push_str(&format!("{record}\n"));
        }
        let answer = reqwest::Client::new()
            .post(app.url("/api/sessions/import"))
            .bearer_auth("bob-token")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{expected}");
        let answer: Value = answer.json().await.unwrap();
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{expected}: {message}");
    }
    let bobs = app.get_json("/api/sessions", Some("bob-token")).await;
    assert_eq!(bobs["sessions"], json!([]), "{bobs}");
}

/// An export body past the import limit is refused as it streams, and one line that never
/// ends is refused once it passes the line limit, without the server holding either.
#[tokio::test]
async fn an_endless_import_line_is_refused_at_its_limit() {
    let app = TestApp::spawn().await;
    let header = json!({"type": "session", "version": 1, "session_id": "x", "cwd": ""});
    let endless = format!("{header}\n{{\"type\": \"message\", \"message\": \"")
        + &"x".repeat(agentd::session::transfer::MAX_LINE_BYTES + 10);
    let answer = reqwest::Client::new()
        .post(app.url("/api/sessions/import"))
        .body(endless)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let answer: Value = answer.json().await.unwrap();
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 2 is longer than"),
        "{answer}"
    );
}
