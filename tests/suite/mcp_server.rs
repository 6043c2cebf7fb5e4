//! agentd as an MCP server at `/mcp`, driven by real clients nobody here wrote: the official
//! Python SDK's `ClientSession` over streamable HTTP, and `@modelcontextprotocol/inspector --cli`.
//!
//! `./scripts/test` installs both under `target/`; without them the tests fail and say how to
//! install them, unless `AGENTD_SKIP_MCP_TESTS=1`.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::{Value, json};

use super::mcp::{everything_script, with_everything};
use crate::support::{TestApp, WsClient, alice_and_bob};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the MCP tests are skipped; otherwise `needed` must exist.
fn installed(needed: &std::path::Path, how: &str) -> bool {
    if needed.exists() {
        return true;
    }
    if std::env::var("AGENTD_SKIP_MCP_TESTS").as_deref() == Ok("1") {
        eprintln!("MCP test skipped (AGENTD_SKIP_MCP_TESTS=1)");
        return false;
    }
    panic!(
        "the MCP server tests need {}: run ./scripts/test, or {how} (or set AGENTD_SKIP_MCP_TESTS=1)",
        needed.display()
    );
}

/// Runs a program to its end (at most a minute); its stdout, failing with its stderr.
async fn run_to_end(program: &std::path::Path, args: &[String]) -> String {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("{} starts: {err}", program.display()));
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the client finishes within a minute")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed: {stderr}",
        program.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Collects notifications until `tool/completed` for `tool` arrives; returns them all.
async fn events_until_completed(ws: &mut WsClient, tool: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let message = ws.next_json().await;
        let done = message["method"] == "tool/completed" && message["params"]["tool_name"] == tool;
        seen.push(message);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn the_python_sdk_uses_a_sessions_tools_over_mcp() {
    let python = root().join("target/mcp-python/bin/python");
    if !installed(&python, "pip install mcp==2.3.0 into target/mcp-python") {
        return;
    }
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(|c| {
        alice_and_bob(c);
        with_everything(script)(c);
        c.tools.spawn_only = vec!["glob".into()];
    })
    .await;
    let mut ws = app.ws_with(Some("alice-token"), None).await.unwrap();
    let session = ws.open().await;
    let report = run_to_end(
        &python,
        &[
            root()
                .join("tests/mcp/agentd_client.py")
                .to_string_lossy()
                .into_owned(),
            app.url(&format!("/mcp?session_id={session}")),
            "alice-token".into(),
        ],
    )
    .await;
    let report: Value = serde_json::from_str(report.trim()).unwrap_or_else(|_| panic!("{report}"));

    assert_eq!(report["server"], "agentd", "{report}");
    assert_eq!(report["session_id"], session.as_str(), "{report}");
    let tools = report["tools"].as_array().unwrap();
    for name in ["read_file", "write_file", "read_task_output", "shell"] {
        assert!(tools.iter().any(|t| t == name), "{name} listed: {report}");
    }
    assert!(
        !tools
            .iter()
            .any(|t| t.as_str().unwrap().starts_with("mcp__")),
        "deferred tools are not listed: {report}"
    );
    assert_eq!(
        report["read_only"],
        json!({"read_file": true, "write_file": false})
    );
    assert_eq!(report["write"]["is_error"], false, "{report}");
    assert_eq!(report["read"]["is_error"], false, "{report}");
    assert!(
        report["read"]["text"]
            .as_str()
            .unwrap()
            .contains("hello over mcp"),
        "{report}"
    );
    assert_eq!(report["bad_arguments"]["is_error"], true, "{report}");
    assert_eq!(
        report["bad_arguments"]["structured"]["error"]["kind"], "invalid_arguments",
        "{report}"
    );
    assert!(
        report["unknown_tool"]
            .as_str()
            .unwrap()
            .contains("no_such_tool"),
        "an unknown tool is a protocol error: {report}"
    );
    // server-everything's progress, through agentd's tool/progress, to the Python client.
    assert_eq!(report["long"]["is_error"], false, "{report}");
    assert!(
        report["long"]["text"]
            .as_str()
            .unwrap()
            .contains("Long running operation completed"),
        "{report}"
    );
    let steps = report["long"]["progress"].as_array().unwrap();
    assert!(!steps.is_empty(), "progress reached the client: {report}");
    assert_eq!(report["list_changed"], true, "{report}");
    assert_eq!(report["listed_after"], true, "{report}");
    assert_ne!(report["cancelled"], "answered", "{report}");
    assert!(
        report["envelope"]["task_handle"].is_string(),
        "a spawn_only tool answers with its task: {report}"
    );
    assert_eq!(
        report["envelope_structured"]["task_id"], report["envelope"]["task_handle"],
        "{report}"
    );
    assert!(
        report["task_output"]
            .as_str()
            .unwrap()
            .contains("from-mcp.txt"),
        "{report}"
    );

    // The AppUI's watcher saw every call live; the abandoned command was stopped.
    let seen = events_until_completed(&mut ws, "shell").await;
    let started: Vec<&str> = seen
        .iter()
        .filter(|m| m["method"] == "tool/started")
        .filter_map(|m| m["params"]["tool_name"].as_str())
        .collect();
    for name in [
        "write_file",
        "read_file",
        "mcp__everything__trigger-long-running-operation",
    ] {
        assert!(started.contains(&name), "{name} started: {started:?}");
    }
    let shell = seen.last().unwrap();
    assert_eq!(shell["params"]["success"], false, "{shell}");
    assert_eq!(
        shell["params"]["structured_metadata"]["cancelled"], true,
        "{shell}"
    );
    // The events are stored too.
    let stored = app
        .get_json(
            &format!("/api/sessions/{session}/events?after_seq=0&limit=1000"),
            Some("alice-token"),
        )
        .await;
    assert!(
        stored.to_string().contains("from-mcp.txt"),
        "the calls' events are stored: {stored}"
    );
}

/// An MCP POST with a JSON-RPC message; status, `Mcp-Session-Id` and body.
async fn post_mcp(
    app: &TestApp,
    path: &str,
    token: Option<&str>,
    mcp_session: Option<&str>,
    message: Value,
) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(app.url(path))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(&message);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(id) = mcp_session {
        request = request.header("mcp-session-id", id);
    }
    let response = tokio::time::timeout(crate::support::WAIT, request.send())
        .await
        .expect("answer in time")
        .expect("request sent");
    let status = response.status().as_u16();
    let id = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    // A streamed answer is one SSE event; read up to it.
    let mut body = String::new();
    let mut response = response;
    while let Ok(Some(chunk)) = tokio::time::timeout(crate::support::WAIT, response.chunk())
        .await
        .expect("in time")
    {
        body.push_str(&String::from_utf8_lossy(&chunk));
        if body.contains("\"jsonrpc\"") && body.ends_with("\n\n") {
            break;
        }
    }
    (status, id, body)
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"}}})
}

#[tokio::test]
async fn mcp_reaches_only_the_callers_own_sessions() {
    let app = TestApp::spawn_with(alice_and_bob).await;
    let (status, _, _) = post_mcp(&app, "/mcp", None, None, initialize()).await;
    assert_eq!(status, 401);
    let (status, _, _) = post_mcp(&app, "/mcp", Some("mallory"), None, initialize()).await;
    assert_eq!(status, 401);

    let mut ws = app.ws_with(Some("alice-token"), None).await.unwrap();
    let alices = ws.open().await;
    // Bob cannot attach to Alice's session by naming it.
    let (status, _, body) = post_mcp(
        &app,
        &format!("/mcp?session_id={alices}"),
        Some("bob-token"),
        None,
        initialize(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("unknown_session"), "{body}");

    // Nor use Alice's MCP session with his own token.
    let (status, mcp_session, body) = post_mcp(
        &app,
        &format!("/mcp?session_id={alices}"),
        Some("alice-token"),
        None,
        initialize(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&alices), "{body}");
    let mcp_session = mcp_session.expect("an MCP session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post_mcp(
        &app,
        "/mcp",
        Some("alice-token"),
        Some(&mcp_session),
        initialized,
    )
    .await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _, body) = post_mcp(
        &app,
        "/mcp",
        Some("bob-token"),
        Some(&mcp_session),
        list.clone(),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("read_file"), "{body}");
    // Nor follow its event stream, nor end it: every verb treats another caller's id as none.
    let bobs_get = mcp_verb(&app, reqwest::Method::GET, "bob-token", &mcp_session).await;
    assert_eq!(bobs_get, 404);
    let bobs_delete = mcp_verb(&app, reqwest::Method::DELETE, "bob-token", &mcp_session).await;
    assert_eq!(bobs_delete, 404);
    let (_, _, body) = post_mcp(
        &app,
        "/mcp",
        Some("alice-token"),
        Some(&mcp_session),
        list.clone(),
    )
    .await;
    assert!(body.contains("read_file"), "{body}");
    let alices_delete = mcp_verb(&app, reqwest::Method::DELETE, "alice-token", &mcp_session).await;
    assert!((200..300).contains(&alices_delete), "{alices_delete}");
    let (status, _, _) =
        post_mcp(&app, "/mcp", Some("alice-token"), Some(&mcp_session), list).await;
    assert_eq!(status, 404, "an ended MCP session is gone");
}

/// A GET or DELETE of `/mcp` naming an MCP session; the status.
async fn mcp_verb(app: &TestApp, method: reqwest::Method, token: &str, mcp_session: &str) -> u16 {
    let request = reqwest::Client::new()
        .request(method, app.url("/mcp"))
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", mcp_session)
        .bearer_auth(token);
    // A GET that is let through is a stream that stays open: its status is all that counts.
    let response = tokio::time::timeout(crate::support::WAIT, request.send())
        .await
        .expect("answer in time")
        .expect("request sent");
    response.status().as_u16()
}

#[tokio::test]
async fn the_inspector_cli_lists_and_calls_agentds_tools() {
    let inspector = root().join("target/mcp-inspector/node_modules/.bin/mcp-inspector");
    if !installed(
        &inspector,
        "npm install --prefix target/mcp-inspector @modelcontextprotocol/inspector@2.12.0",
    ) {
        return;
    }
    let app = TestApp::spawn_with(alice_and_bob).await;
    let mut ws = app.ws_with(Some("alice-token"), None).await.unwrap();
    let session = ws.open().await;
    ws.invoke(
        &session,
        "write_file",
        json!({"path": "note.txt", "content": "written over the WebSocket\n"}),
    )
    .await;
    let url = app.url(&format!("/mcp?session_id={session}"));
    let common = |method: &str| -> Vec<String> {
        vec![
            "--cli".into(),
            url.clone(),
            "--transport".into(),
            "http".into(),
            "--header".into(),
            "Authorization: Bearer alice-token".into(),
            "--method".into(),
            method.into(),
        ]
    };
    let listed = run_to_end(&inspector, &common("tools/list")).await;
    let listed: Value = serde_json::from_str(&listed).unwrap_or_else(|_| panic!("{listed}"));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"read_file"), "{listed}");
    assert!(names.contains(&"apply_patch"), "{listed}");

    let mut call = common("tools/call");
    call.extend(["--tool-name", "read_file", "--tool-arg", "path=note.txt"].map(String::from));
    let called = run_to_end(&inspector, &call).await;
    let called: Value = serde_json::from_str(&called).unwrap_or_else(|_| panic!("{called}"));
    assert_ne!(called["isError"], true, "{called}");
    assert!(
        called["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("written over the WebSocket"),
        "{called}"
    );
    let done = events_until_completed(&mut ws, "read_file").await;
    assert_eq!(done.last().unwrap()["params"]["success"], true);
}

/// A client that accepts anything (no `Accept`, or `*/*` as most HTTP libraries send) gets the
/// transport's event stream; one that names only other types is refused with 406.
#[tokio::test]
async fn mcp_serves_a_client_that_accepts_anything() {
    let app = TestApp::spawn().await;
    for accept in [None, Some("*/*"), Some("text/html;q=0.9, */*;q=0.1")] {
        let mut request = reqwest::Client::new()
            .post(app.url("/mcp"))
            .header("mcp-protocol-version", "2025-06-18")
            .json(&initialize());
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await.expect("request sent");
        assert_eq!(response.status(), 200, "Accept {accept:?}");
        assert!(
            response.headers().contains_key("mcp-session-id"),
            "Accept {accept:?}: {:?}",
            response.headers()
        );
    }
    let refused = reqwest::Client::new()
        .post(app.url("/mcp"))
        .header("accept", "text/html")
        .json(&initialize())
        .send()
        .await
        .expect("request sent");
    assert_eq!(refused.status(), 406);
}
