//! What a turn changed, whatever changed it (`turn/diff`), and the workspace put back as it
//! was before a turn (`session/revert`).

use serde_json::{Value, json};

use crate::suite::agent::run_turn;
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

fn files(value: &Value) -> Vec<(String, String)> {
    value["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["change"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn a_shell_turns_changes_are_diffed_and_reverted() {
    let command = "echo made > made.txt && sed -i 's/one/ONE/' edit.txt && rm gone.txt";
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "shell",
            &json!({"command": command}),
        )]),
        Reply::text(&["changed"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let root = app.workspace();
    std::fs::write(root.join("edit.txt"), "one\ntwo\n").unwrap();
    std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "change things").await;
    assert_eq!(end["reason"], "completed", "{end}");
    let turn_id = end["turn_id"].as_str().unwrap().to_string();
    let diff = match notes.iter().find(|n| n["method"] == "turn/diff") {
        Some(note) => note["params"].clone(),
        None => ws.notification("turn/diff").await,
    };
    assert_eq!(diff["turn_id"], turn_id.as_str());
    assert_eq!(
        files(&diff),
        pairs(&[
            ("edit.txt", "modified"),
            ("gone.txt", "deleted"),
            ("made.txt", "added")
        ])
    );
    let text = diff["diff"].as_str().unwrap();
    assert!(
        text.contains("-one\n+ONE\n") && text.contains("+made"),
        "{text}"
    );

    // A dry run says what a revert would do and touches nothing.
    let planned = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id, "dry_run": true}),
        )
        .await;
    let undo = pairs(&[
        ("edit.txt", "modified"),
        ("gone.txt", "added"),
        ("made.txt", "deleted"),
    ]);
    assert_eq!(files(&planned), undo);
    assert!(root.join("made.txt").exists());
    let reverted = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(files(&reverted), undo);
    assert_eq!(
        std::fs::read_to_string(root.join("edit.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("gone.txt")).unwrap(),
        "bye\n"
    );
    assert!(!root.join("made.txt").exists());
    let again = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id}),
        )
        .await;
    assert!(files(&again).is_empty(), "{again}");
    assert!(again.get("revert_id").is_none(), "nothing to undo: {again}");

    // The revert can itself be reverted: the workspace is as the turn left it again.
    let revert_id = reverted["revert_id"]
        .as_str()
        .expect("a revert id")
        .to_string();
    let undone = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": revert_id}),
        )
        .await;
    assert_eq!(
        files(&undone),
        pairs(&[
            ("edit.txt", "modified"),
            ("gone.txt", "deleted"),
            ("made.txt", "added")
        ])
    );
    assert_eq!(
        std::fs::read_to_string(root.join("edit.txt")).unwrap(),
        "ONE\ntwo\n"
    );
    assert!(root.join("made.txt").exists() && !root.join("gone.txt").exists());

    let (_, refused) = ws
        .call(
            "session/revert",
            json!({"session_id": session, "turn_id": "turn_unknown"}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_params",
        "{refused}"
    );
    // The diff was stored with the session's events.
    let events = app.replay(&session).await;
    assert!(events.iter().any(|e| e["method"] == "turn/diff"));
    // So were both reverts, each naming the checkpoint that undoes it.
    let reverts: Vec<&Value> = events
        .iter()
        .filter(|e| e["method"] == "session/reverted")
        .collect();
    assert_eq!(reverts.len(), 2, "{events:?}");
    assert_eq!(reverts[0]["params"]["turn_id"], turn_id.as_str());
    assert_eq!(reverts[0]["params"]["revert_id"], revert_id.as_str());
    assert_eq!(reverts[1]["params"]["turn_id"], revert_id.as_str());
}

/// A file changed after the session's last turn ended (by a person, another session) is not
/// silently overwritten: the revert is refused naming it, a dry run lists it, and `force`
/// reverts over it.
#[tokio::test]
async fn a_revert_over_a_change_made_outside_the_session_needs_force() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "shell",
            &json!({"command": "echo turn > notes.txt && echo made > made.txt"}),
        )]),
        Reply::text(&["changed"]),
    ]))
    .await;
    let base_url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some("test-model".into());
    })
    .await;
    let root = app.workspace();
    std::fs::write(root.join("notes.txt"), "mine\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "change things").await;
    let turn_id = end["turn_id"].as_str().unwrap().to_string();

    // The person edits the file the turn wrote, and adds one of their own.
    std::fs::write(root.join("notes.txt"), "turn, then my edit\n").unwrap();
    std::fs::write(root.join("mine.txt"), "by hand\n").unwrap();
    let (_, refused) = ws
        .call(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "revert_conflict",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("notes.txt (modified)") && message.contains("mine.txt (added)"),
        "{message}"
    );
    // Nothing was touched.
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "turn, then my edit\n"
    );
    assert!(root.join("made.txt").exists());

    let planned = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id, "dry_run": true}),
        )
        .await;
    assert_eq!(
        files(&json!({"files": planned["conflicts"]})),
        pairs(&[("mine.txt", "added"), ("notes.txt", "modified")])
    );

    let forced = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id, "force": true}),
        )
        .await;
    assert!(forced["revert_id"].is_string(), "{forced}");
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "mine\n"
    );
    assert!(!root.join("made.txt").exists());
    // A file the turn never had is the person's: the revert takes it away only as part of
    // the state before the turn, which it was not.
    assert!(
        !root.join("mine.txt").exists(),
        "forced: back to before the turn"
    );
    // The forced revert settled the workspace: undoing it needs no force.
    let revert_id = forced["revert_id"].as_str().unwrap();
    let undone = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": revert_id}),
        )
        .await;
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "turn, then my edit\n",
        "{undone}"
    );
}

/// Checkpoints live in the data dir: a turn can be reverted after the server restarted, a file
/// past `[checkpoints] max_file_mb` is neither diffed nor touched, and deleting the session
/// drops its checkpoints.
#[tokio::test]
async fn checkpoints_outlive_a_restart_within_their_limits() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "shell",
            &json!({"command": "echo v2 > notes.txt && head -c 2097152 /dev/zero > big.bin"}),
        )]),
        Reply::text(&["changed"]),
    ]))
    .await;
    let configure = |config: &mut agentd::config::Config| {
        crate::suite::agent::with_model(&mock)(config);
        config.checkpoints.max_file_mb = 1;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::support::config_in(dir.path());
    configure(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let root = app.workspace();
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("notes.txt"), "v1\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, end) = run_turn(&mut ws, &session, "change things").await;
    let turn_id = end["turn_id"].as_str().unwrap().to_string();
    let diff = match notes.iter().find(|n| n["method"] == "turn/diff") {
        Some(note) => note["params"].clone(),
        None => ws.notification("turn/diff").await,
    };
    // The 2 MiB file is past the 1 MiB limit: not part of the diff.
    assert_eq!(files(&diff), pairs(&[("notes.txt", "modified")]));
    assert_eq!(diff["skipped"], json!(["big.bin"]), "{diff}");
    drop(ws);
    let dir = app.stop().await;
    let stored = dir.path().join("data/checkpoints/sessions").join(&session);
    assert!(stored.is_dir(), "no checkpoint was stored");

    let mut config = crate::support::config_in(dir.path());
    configure(&mut config);
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    ws.result("session/open", json!({"session_id": session}))
        .await;
    let reverted = ws
        .result(
            "session/revert",
            json!({"session_id": session, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(files(&reverted), pairs(&[("notes.txt", "modified")]));
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "v1\n"
    );
    assert_eq!(
        std::fs::metadata(root.join("big.bin")).unwrap().len(),
        2 * 1024 * 1024,
        "a file past the limit was touched"
    );

    let deleted = reqwest::Client::new()
        .delete(app.url(&format!("/api/sessions/{session}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!stored.exists(), "a deleted session's checkpoints stayed");
}

#[tokio::test]
async fn an_export_with_its_checkpoints_imports_as_a_session_that_can_revert() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "shell",
            &json!({"command": "echo changed > edit.txt && echo made > made.txt"}),
        )]),
        Reply::text(&["changed"]),
    ]))
    .await;
    let app = TestApp::spawn_with(crate::suite::agent::with_model(&mock)).await;
    let root = app.workspace();
    std::fs::write(root.join("edit.txt"), "original\n").unwrap();
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (_, end) = run_turn(&mut ws, &session, "change things").await;
    let turn_id = end["turn_id"].as_str().unwrap().to_string();

    let export = |query: &'static str| {
        let url = app.url(&format!("/api/sessions/{session}/export{query}"));
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let lines = |body: &str| -> Vec<Value> {
        body.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let plain = lines(&export("").await);
    assert!(
        plain
            .iter()
            .all(|l| l["type"] != "blob" && l["type"] != "checkpoint")
    );
    let body = export("?checkpoints=true").await;
    let full = lines(&body);
    let blobs: Vec<&Value> = full.iter().filter(|l| l["type"] == "blob").collect();
    assert!(
        full.iter()
            .any(|l| l["type"] == "checkpoint" && l["manifest"]["name"] == turn_id.as_str()),
        "{body}"
    );
    // The content the turn overwrote travels with it.
    use base64::Engine as _;
    let original = base64::engine::general_purpose::STANDARD.encode("original\n");
    assert!(
        blobs.iter().any(|b| b["data"] == original.as_str()),
        "{body}"
    );

    // Contents that do not match their hash are refused whole: no session is made.
    let before = app.get_json("/api/sessions", None).await["sessions"]
        .as_array()
        .unwrap()
        .len();
    let forged = body.replace(
        &original,
        &base64::engine::general_purpose::STANDARD.encode("forged\n"),
    );
    let refused = reqwest::Client::new()
        .post(app.url("/api/sessions/import"))
        .body(forged)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SHA-256"),
        "{refused}"
    );
    let after = app.get_json("/api/sessions", None).await["sessions"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, before);

    let imported = reqwest::Client::new()
        .post(app.url("/api/sessions/import"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(imported.status(), 201);
    let copy = imported.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The imported session can undo the turn it carried.
    let mut other = app.ws().await;
    other
        .result("session/open", json!({"session_id": copy}))
        .await;
    let reverted = other
        .result(
            "session/revert",
            json!({"session_id": copy, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(
        files(&reverted),
        pairs(&[("edit.txt", "modified"), ("made.txt", "deleted")])
    );
    assert_eq!(
        std::fs::read_to_string(root.join("edit.txt")).unwrap(),
        "original\n"
    );
    assert!(!root.join("made.txt").exists());
}
