//! MCP servers as tools, against software nobody here wrote: the protocol's reference server,
//! `@modelcontextprotocol/server-everything`, over stdio in the sandbox.
//!
//! `./scripts/test` installs it under `target/mcp-servers/`; without it the tests fail and say
//! how to install it, unless `AGENTD_SKIP_MCP_TESTS=1`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use agentd::config::Config;
use agentd::mcp::{McpServerConfig, Scope};
use serde_json::{Value, json};

use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use crate::support::{TestApp, WsClient};

/// Where `scripts/test` installs the reference servers.
pub(super) fn servers_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/mcp-servers")
}

/// The entry script of server-everything, or `None` when the tests are skipped.
pub(super) fn everything_script() -> Option<PathBuf> {
    let script =
        servers_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if script.exists() {
        return Some(script);
    }
    if std::env::var("AGENTD_SKIP_MCP_TESTS").as_deref() == Ok("1") {
        eprintln!("MCP test skipped (AGENTD_SKIP_MCP_TESTS=1)");
        return None;
    }
    panic!(
        "the MCP tests need {}: run ./scripts/test, or `npm install --prefix target/mcp-servers \
         @modelcontextprotocol/server-everything@2026.8.31` (or set AGENTD_SKIP_MCP_TESTS=1)",
        script.display()
    );
}

pub(super) fn server(
    name: &str,
    command: &str,
    args: Vec<String>,
    scope: Scope,
) -> McpServerConfig {
    McpServerConfig {
        name: name.into(),
        command: Some(command.into()),
        args,
        env: BTreeMap::new(),
        url: None,
        bearer_token_env: None,
        scope,
        startup_timeout_secs: 20,
        tool_timeout_secs: 30,
        defer: true,
        network: false,
    }
}

/// server-everything as a shared stdio server, readable inside the sandbox.
pub(super) fn with_everything(script: PathBuf) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.mcp_servers.push(server(
            "everything",
            "node",
            vec![script.to_string_lossy().into_owned(), "stdio".into()],
            Scope::Server,
        ));
        c.sandbox.extra_read.push(servers_dir());
    }
}

#[tokio::test]
async fn an_mcp_servers_tools_are_registry_tools_that_answer() {
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(with_everything(script)).await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    assert_eq!(opened["mcp"], json!({"everything": "ready"}), "{opened}");
    assert_eq!(opened["capabilities"]["mcp"]["everything"], "ready");
    let session = opened["session_id"].as_str().unwrap().to_string();

    // Deferred until used, with the hints mapped to concurrency.
    let list = ws.result("tool/list", json!({"session_id": session})).await;
    let deferred = list["deferred"].as_array().unwrap();
    let info = |name: &str| {
        deferred
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not deferred: {list}"))
    };
    assert_eq!(info("mcp__everything__echo")["concurrency"], "safe");
    assert_eq!(
        info("mcp__everything__toggle-simulated-logging")["concurrency"],
        "exclusive"
    );
    // Effects follow the annotations: a read-only tool writes nothing, others count as writing.
    assert_eq!(
        info("mcp__everything__echo")["effects"]["writes_files"],
        false
    );
    assert_eq!(
        info("mcp__everything__toggle-simulated-logging")["effects"]["writes_files"],
        true
    );

    let (notes, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "mcp__everything__echo", "arguments": {"message": "hi there"}}),
        )
        .await;
    let result = &answer["result"];
    assert_eq!(result["success"], true, "{answer}");
    assert_eq!(result["output"], "Echo: hi there");
    let methods: Vec<&str> = notes.iter().filter_map(|n| n["method"].as_str()).collect();
    assert!(
        methods.contains(&"tool/started") && methods.contains(&"tool/completed"),
        "{methods:?}"
    );

    let sum = ws
        .invoke(
            &session,
            "mcp__everything__get-sum",
            json!({"a": 2, "b": 3}),
        )
        .await;
    assert!(sum["output"].as_str().unwrap().contains('5'), "{sum}");

    let image = ws
        .invoke(&session, "mcp__everything__get-tiny-image", json!({}))
        .await;
    let output = image["output"].as_str().unwrap();
    assert!(output.contains("[image: image/png, "), "{output}");
    let parts = image["structured_metadata"]["content"].as_array().unwrap();
    assert!(
        parts
            .iter()
            .any(|p| p["type"] == "image" && p["bytes"].as_u64() > Some(0))
    );

    let structured = ws
        .invoke(
            &session,
            "mcp__everything__get-structured-content",
            json!({"location": "New York"}),
        )
        .await;
    assert!(
        structured["structured_metadata"]["structured_content"].is_object(),
        "{structured}"
    );

    // The schema passes through and is checked like any tool's.
    let (_, refused) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "mcp__everything__get-sum", "arguments": {"a": "two"}}),
        )
        .await;
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_arguments",
        "{refused}"
    );

    let rest = app
        .get_json(&format!("/api/sessions/{session}/mcp"), None)
        .await;
    assert_eq!(rest, json!({"mcp": {"everything": "ready"}}));
}

#[tokio::test]
async fn a_policy_naming_the_servers_group_hides_its_tools() {
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(|c| {
        with_everything(script)(c);
        c.tool_policy.deny = vec!["group:mcp:everything".into()];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let list = ws.result("tool/list", json!({"session_id": session})).await;
    let hidden = list["hidden"].as_array().unwrap();
    assert!(
        hidden
            .iter()
            .any(|t| t["name"] == "mcp__everything__echo" && t["reason"] == "policy_deny"),
        "{list}"
    );
    let (_, denied) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "mcp__everything__echo", "arguments": {"message": "x"}}),
        )
        .await;
    assert_eq!(denied["error"]["data"]["kind"], "policy_denied", "{denied}");
}

#[tokio::test]
async fn a_server_that_cannot_start_is_reported_and_the_session_works() {
    let app = TestApp::spawn_with(|c| {
        c.mcp_servers.push(server(
            "missing",
            "/nonexistent/mcp-server",
            Vec::new(),
            Scope::Server,
        ));
        // Nothing listens on the discard port.
        let mut http = server("remote", "unused", Vec::new(), Scope::Server);
        http.command = None;
        http.url = Some("http://127.0.0.1:9/mcp".into());
        c.mcp_servers.push(http);
    })
    .await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    let missing = opened["mcp"]["missing"].as_str().unwrap();
    assert!(missing.starts_with("failed: "), "{missing}");
    let remote = opened["mcp"]["remote"].as_str().unwrap();
    assert!(
        remote.starts_with("failed: ") && remote.contains("handshake with http://127.0.0.1:9/mcp"),
        "{remote}"
    );
    let session = opened["session_id"].as_str().unwrap().to_string();
    let listed = ws.invoke(&session, "list_dir", json!({})).await;
    assert_eq!(listed["success"], true);
}

#[tokio::test]
async fn a_model_turn_calls_an_mcp_tool_by_its_name() {
    let Some(script) = everything_script() else {
        return;
    };
    let mock = MockLlm::start(Script::route(|request: &Value| {
        let messages = request["messages"].as_array().unwrap();
        if messages.last().unwrap()["role"] == "tool" {
            return Reply::text(&["it echoed"]);
        }
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "mcp__everything__echo",
            &json!({"message": "from the model"}),
        )])
    }))
    .await;
    let url = mock.base_url();
    let app = TestApp::spawn_with(move |c| {
        with_everything(script)(c);
        c.llm.base_url = Some(url);
        c.llm.model = Some("m".into());
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    ws.result(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "echo something"}]}),
    )
    .await;
    let completed = ws.notification("tool/completed").await;
    assert_eq!(completed["tool_name"], "mcp__everything__echo");
    assert_eq!(completed["success"], true, "{completed}");
    ws.notification("turn/completed").await;
    let history = app
        .get_json(&format!("/api/sessions/{session}/messages"), None)
        .await;
    let answered = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "tool" && m["content"] == "Echo: from the model");
    assert!(answered, "{history}");
}

#[tokio::test]
async fn a_session_scoped_server_starts_with_its_session_and_serves_it() {
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(|c| {
        with_everything(script)(c);
        c.mcp_servers[0].scope = Scope::Session;
    })
    .await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    // It starts in the background; its tools arrive with a tools/changed once it is up.
    if opened["mcp"]["everything"] != "ready" {
        assert_eq!(opened["mcp"]["everything"], "starting", "{opened}");
        loop {
            let changed = ws.notification("tools/changed").await;
            let deferred = changed["deferred"].as_array().unwrap();
            if deferred.iter().any(|name| name == "mcp__everything__echo") {
                break;
            }
        }
    }
    let echoed = ws
        .invoke(
            &session,
            "mcp__everything__echo",
            json!({"message": "mine"}),
        )
        .await;
    assert_eq!(echoed["output"], "Echo: mine", "{echoed}");
    let rest = app
        .get_json(&format!("/api/sessions/{session}/mcp"), None)
        .await;
    assert_eq!(rest, json!({"mcp": {"everything": "ready"}}));
}

/// server-everything in its streamable-HTTP mode on a free loopback port, ready to accept.
async fn everything_over_http(script: &std::path::Path) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new("node")
        .arg(script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // It says so on stderr once it listens.
    let ready = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "server-everything did not listen");
    (child, format!("http://127.0.0.1:{port}/mcp"))
}

#[tokio::test]
async fn a_streamable_http_server_is_used_the_same_way() {
    let Some(script) = everything_script() else {
        return;
    };
    let (_server, url) = everything_over_http(&script).await;
    let app = TestApp::spawn_with(move |c| {
        let mut remote = server("remote", "unused", Vec::new(), Scope::Server);
        remote.command = None;
        remote.url = Some(url);
        remote.defer = false;
        c.mcp_servers.push(remote);
    })
    .await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    assert_eq!(opened["mcp"], json!({"remote": "ready"}), "{opened}");
    let active = opened["tools"]["active"].as_array().unwrap();
    assert!(
        active.iter().any(|name| name == "mcp__remote__get-sum"),
        "defer = false: active at once: {opened}"
    );
    let session = opened["session_id"].as_str().unwrap().to_string();
    let sum = ws
        .invoke(&session, "mcp__remote__get-sum", json!({"a": 20, "b": 22}))
        .await;
    assert!(sum["output"].as_str().unwrap().contains("42"), "{sum}");
}

/// The Python reference server `mcp-server-time` (PyPI) and the directories its interpreter
/// must read inside the sandbox, or `None` when the tests are skipped.
pub(super) fn time_server() -> Option<(PathBuf, Vec<PathBuf>)> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/mcp-python");
    let program = venv.join("bin/mcp-server-time");
    if !program.exists() {
        if std::env::var("AGENTD_SKIP_MCP_TESTS").as_deref() == Ok("1") {
            return None;
        }
        panic!(
            "the MCP tests need {}: run ./scripts/test, which installs mcp-server-time into \
             target/mcp-python (or set AGENTD_SKIP_MCP_TESTS=1)",
            program.display()
        );
    }
    // A virtualenv's interpreter lives under its base installation.
    let base = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", "import sys; print(sys.base_prefix)"])
        .output()
        .expect("the virtualenv's python runs");
    let base = PathBuf::from(String::from_utf8(base.stdout).unwrap().trim());
    Some((program, vec![venv, base]))
}

#[tokio::test]
async fn a_second_implementation_in_python_answers_too() {
    let Some((program, readable)) = time_server() else {
        return;
    };
    let app = TestApp::spawn_with(move |c| {
        let mut time = server(
            "time",
            &program.to_string_lossy(),
            vec!["--local-timezone".into(), "Etc/UTC".into()],
            Scope::Session,
        );
        time.defer = false;
        c.mcp_servers.push(time);
        c.sandbox.extra_read.extend(readable);
    })
    .await;
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    if opened["mcp"]["time"] != "ready" {
        assert_eq!(opened["mcp"]["time"], "starting", "{opened}");
        loop {
            let changed = ws.notification("tools/changed").await;
            let active = changed["active"].as_array().unwrap();
            if active.iter().any(|name| name == "mcp__time__convert_time") {
                break;
            }
        }
    }
    let converted = ws
        .invoke(
            &session,
            "mcp__time__convert_time",
            json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        )
        .await;
    assert_eq!(converted["success"], true, "{converted}");
    let structured = &converted["structured_metadata"]["structured_content"];
    assert!(
        structured["target"]["datetime"]
            .as_str()
            .is_some_and(|at| at.contains("T21:00:00")),
        "{converted}"
    );
}

/// Kills (SIGKILL) every process whose command line holds `marker`; answers how many.
fn kill_marked(marker: &str) -> usize {
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        // The node process itself, not the launcher that started it.
        let is_node = args
            .first()
            .is_some_and(|program| program.ends_with(b"node"));
        if is_node && args.contains(&marker.as_bytes()) {
            // SAFETY: kill has no memory effects; a vanished pid only makes it fail.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

#[tokio::test]
async fn a_crashed_server_is_started_again_and_calls_wait_for_it() {
    let Some(script) = everything_script() else {
        return;
    };
    // server-everything reads only its first argument; the second marks its process.
    let marker = format!("agentd-test-{}", uuid::Uuid::new_v4().simple());
    let args = vec![
        script.to_string_lossy().into_owned(),
        "stdio".into(),
        marker.clone(),
    ];
    let app = TestApp::spawn_with(move |c| {
        let mut everything = server("everything", "node", args, Scope::Server);
        everything.defer = false;
        c.mcp_servers.push(everything);
        c.sandbox.extra_read.push(servers_dir());
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let first = ws
        .invoke(&session, "mcp__everything__echo", json!({"message": "one"}))
        .await;
    assert_eq!(first["output"], "Echo: one");

    assert_eq!(
        kill_marked(&marker),
        1,
        "the server's node process was found"
    );
    // The call waits for the restarted server (about a second of backoff) instead of failing.
    let second = ws
        .invoke(&session, "mcp__everything__echo", json!({"message": "two"}))
        .await;
    assert_eq!(second["output"], "Echo: two", "{second}");
    let state = app
        .get_json(&format!("/api/sessions/{session}/mcp"), None)
        .await;
    assert_eq!(state, json!({"mcp": {"everything": "ready"}}));
}

#[tokio::test]
async fn a_servers_progress_notes_become_tool_progress() {
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(with_everything(script)).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let (notes, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "mcp__everything__trigger-long-running-operation",
                   "arguments": {"duration": 1, "steps": 4}}),
        )
        .await;
    assert_eq!(answer["result"]["success"], true, "{answer}");
    let call_id = answer["result"]["tool_call_id"].as_str().unwrap();
    let progress: Vec<&Value> = notes
        .iter()
        .filter(|n| n["method"] == "tool/progress")
        .map(|n| &n["params"])
        .collect();
    assert!(progress.len() >= 3, "{notes:?}");
    assert!(progress.iter().all(|p| p["tool_call_id"] == call_id));
    let last = progress.last().unwrap()["fraction"].as_f64().unwrap();
    assert!(last > 0.5 && last <= 1.0, "{progress:?}");
}

#[tokio::test]
async fn an_mcp_tool_can_run_in_the_background() {
    let Some(script) = everything_script() else {
        return;
    };
    let app = TestApp::spawn_with(|c| {
        with_everything(script)(c);
        c.tools.spawn_only = vec!["mcp__everything__trigger-long-running-operation".into()];
    })
    .await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let envelope = ws
        .invoke(
            &session,
            "mcp__everything__trigger-long-running-operation",
            json!({"duration": 1, "steps": 2}),
        )
        .await;
    let task = envelope["structured_metadata"]["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task envelope: {envelope}"))
        .to_string();
    let done = ws.notification("turn/spawn_complete").await;
    assert_eq!(done["task_id"], task.as_str());
    assert_eq!(done["success"], true, "{done}");
    assert!(
        done["content"]
            .as_str()
            .unwrap()
            .contains("Long running operation completed"),
        "{done}"
    );
    let output = app
        .get_json(&format!("/api/tasks/{task}/output?mode=tail&lines=5"), None)
        .await;
    assert!(
        output["text"]
            .as_str()
            .unwrap()
            .contains("Long running operation completed"),
        "{output}"
    );
}

/// `tests/mcp/changing_server.py` as a session's own stdio server, with the Python SDK's venv.
fn with_changing_server(c: &mut Config) -> bool {
    let Some((_, readable)) = time_server() else {
        return false;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/mcp-python/bin/python");
    let script = root.join("tests/mcp/changing_server.py");
    let mut changing = server(
        "changing",
        &python.to_string_lossy(),
        vec![script.to_string_lossy().into_owned()],
        Scope::Session,
    );
    changing.defer = false;
    c.mcp_servers.push(changing);
    c.sandbox.extra_read.extend(readable);
    c.sandbox.extra_read.push(root.join("tests/mcp"));
    c.tools.spawn_only = vec!["mcp__changing__wait_for_cancel".into()];
    true
}

/// The first `tools/changed` whose lists satisfy `wanted`: among `seen` (what came before a
/// call's answer), else the next ones.
async fn tools_changed_until(
    ws: &mut WsClient,
    seen: Vec<Value>,
    wanted: impl Fn(&[Value]) -> bool,
) -> Value {
    let fits = |changed: &Value| {
        let mut names = changed["active"].as_array().unwrap().clone();
        names.extend(changed["deferred"].as_array().unwrap().iter().cloned());
        wanted(&names)
    };
    let earlier = seen
        .into_iter()
        .filter(|m| m["method"] == "tools/changed")
        .map(|m| m["params"].clone())
        .find(|changed| fits(changed));
    if let Some(changed) = earlier {
        return changed;
    }
    loop {
        let changed = ws.notification("tools/changed").await;
        if fits(&changed) {
            return changed;
        }
    }
}

/// `tool/invoke`, with the notifications that came before its answer.
async fn invoke_seeing(
    ws: &mut WsClient,
    session: &str,
    name: &str,
    arguments: Value,
) -> (Vec<Value>, Value) {
    let (seen, answer) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": name, "arguments": arguments}),
        )
        .await;
    (seen, answer["result"].clone())
}

#[tokio::test]
async fn a_servers_changed_tool_list_is_followed_and_its_calls_can_be_cancelled() {
    let mut usable = true;
    let app = TestApp::spawn_with(|c| usable = with_changing_server(c)).await;
    if !usable {
        return;
    }
    let mut ws = app.ws().await;
    let opened = ws.result("session/open", json!({})).await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    if opened["mcp"]["changing"] != "ready" {
        tools_changed_until(&mut ws, Vec::new(), |names| {
            names.iter().any(|n| n == "mcp__changing__add_tool")
        })
        .await;
    }
    let (seen, added) = invoke_seeing(
        &mut ws,
        &session,
        "mcp__changing__add_tool",
        json!({"name": "greet"}),
    )
    .await;
    assert_eq!(added["success"], true, "{added}");
    let changed = tools_changed_until(&mut ws, seen, |names| {
        names.iter().any(|n| n == "mcp__changing__greet")
    })
    .await;
    assert!(
        changed["active"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "mcp__changing__greet"),
        "a server that does not defer adds active tools: {changed}"
    );
    let greeted = ws.invoke(&session, "mcp__changing__greet", json!({})).await;
    assert_eq!(greeted["success"], true, "{greeted}");
    assert!(
        greeted["output"].as_str().unwrap().contains("I am greet"),
        "{greeted}"
    );

    let (seen, removed) = invoke_seeing(
        &mut ws,
        &session,
        "mcp__changing__remove_tool",
        json!({"name": "greet"}),
    )
    .await;
    assert_eq!(removed["success"], true, "{removed}");
    tools_changed_until(&mut ws, seen, |names| {
        !names.iter().any(|n| n == "mcp__changing__greet")
    })
    .await;
    let (_, gone) = ws
        .call(
            "tool/invoke",
            json!({"session_id": session, "name": "mcp__changing__greet", "arguments": {}}),
        )
        .await;
    assert_eq!(gone["error"]["data"]["kind"], "unknown_tool", "{gone}");

    // Cancelling the task drops the call, and the server hears notifications/cancelled.
    let envelope = ws
        .invoke(&session, "mcp__changing__wait_for_cancel", json!({}))
        .await;
    let task = envelope["structured_metadata"]["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {envelope}"))
        .to_string();
    let cancelled = ws
        .result(
            "task/cancel",
            json!({"session_id": session, "task_id": task}),
        )
        .await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    let deadline = tokio::time::Instant::now() + crate::support::WAIT;
    loop {
        let read = ws
            .invoke(&session, "read_file", json!({"path": "cancelled.txt"}))
            .await;
        if read["success"] == true {
            assert!(
                read["output"].as_str().unwrap().contains("cancelled"),
                "{read}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never heard notifications/cancelled: {read}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_servers_own_network_key_opens_the_network_for_it_alone() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut usable = true;
    let app = TestApp::spawn_with(|c| {
        usable = with_changing_server(c);
        if usable {
            let mut online = c.mcp_servers[0].clone();
            online.name = "online".into();
            online.network = true;
            c.mcp_servers.push(online);
        }
    })
    .await;
    if !usable {
        return;
    }
    let ready = app.get_json("/readyz", None).await;
    let layers = ready["sandbox"]["layers"].to_string();
    if !layers.contains("seccomp") && !layers.contains("landlock_net") {
        eprintln!("no network layer enforced here; skipped: {layers}");
        return;
    }
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let mut answers = BTreeMap::new();
    for server in ["changing", "online"] {
        let tool = format!("mcp__{server}__connect");
        let deadline = tokio::time::Instant::now() + crate::support::WAIT;
        // Each server joins the session when it is up.
        let answer = loop {
            let (_, answer) = ws
                .call(
                    "tool/invoke",
                    json!({"session_id": session, "name": tool, "arguments": {"port": port}}),
                )
                .await;
            if answer["error"]["data"]["kind"] != "unknown_tool" {
                break answer["result"].clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{tool} never came: {answer}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        answers.insert(
            server,
            answer["output"].as_str().unwrap_or_default().to_string(),
        );
    }
    assert!(answers["changing"].contains("refused"), "{answers:?}");
    assert!(answers["online"].contains("connected"), "{answers:?}");
}
