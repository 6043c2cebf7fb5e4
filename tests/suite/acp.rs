//! `agentd acp` driven by software nobody here wrote: the official ACP TypeScript SDK as the
//! client (tests/acp/sdk_client.mjs, every frame checked against the schema.json the package
//! ships) and the headless client acpx. Both talk to the real binary over its stdio, with the
//! scripted mock model behind it.
//!
//! `./scripts/test` installs the pinned packages under `target/acp-clients/`; without them
//! these tests fail and say how to install them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// The pinned packages, as scripts/test installs them.
const SDK: (&str, &str) = ("@agentclientprotocol/sdk", "2.4.0");
const ACPX: (&str, &str) = ("acpx", "0.19.1");
const AJV: (&str, &str) = ("ajv", "8.20.0");

fn node_modules() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/acp-clients/node_modules")
}

/// The install dir, once each pinned package is there in its version; else the test fails
/// saying how to install them.
fn acp_clients() -> PathBuf {
    let modules = node_modules();
    for (name, version) in [SDK, ACPX, AJV] {
        let manifest = modules.join(name).join("package.json");
        let found = std::fs::read_to_string(&manifest)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|package| package["version"].as_str().map(str::to_string));
        assert_eq!(
            found.as_deref(),
            Some(version),
            "{name}@{version} is not installed in target/acp-clients: run ./scripts/test, or \
             `npm install --prefix target/acp-clients {}@{} {}@{} {}@{}`",
            SDK.0,
            SDK.1,
            ACPX.0,
            ACPX.1,
            AJV.0,
            AJV.1
        );
    }
    modules
}

/// A config for `agentd acp` in `dir`: its own store and workspace, the mock as the model,
/// `shell` asking for approval.
fn write_config(dir: &Path, mock: &MockLlm) -> PathBuf {
    let config = dir.join("acp.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{0}/data\"\nworkspace = \"{0}/ws\"\n[llm]\nbase_url = \"{1}\"\n\
             model = \"test-model\"\n[tool_policy]\nask = [\"shell\"]\n",
            dir.display(),
            mock.base_url()
        ),
    )
    .unwrap();
    config
}

/// A command with the test runner's own agentd settings removed.
fn command(program: &str) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars() {
        if name.starts_with("AGENTD_") || name == "DATABASE_URL" || name == "OPENAI_API_KEY" {
            command.env_remove(name);
        }
    }
    command
}

async fn output(mut command: Command) -> std::process::Output {
    command.stdin(Stdio::null());
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::task::spawn_blocking(move || command.output().expect("the client runs")),
    )
    .await
    .expect("the client finishes within 2 minutes")
    .unwrap()
}

/// The script the SDK client's run plays: two tools (shell asked about), a plan, a thought
/// with text, then a reply held until the client cancels it.
async fn sdk_mock() -> MockLlm {
    let thinking = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Both ran.\"}}]}\n\n\
                    data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"all done\"}}]}\n\n\
                    data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                    data: [DONE]\n\n";
    MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![
            ScriptedCall::whole("call_read", "read_file", &json!({"path": "notes.txt"})),
            ScriptedCall::whole(
                "call_shell",
                "shell",
                &json!({"command": "echo hi-from-shell"}),
            ),
        ]),
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_plan",
            "update_plan",
            &json!({"plan": [{"step": "Read the notes", "status": "completed"},
                              {"step": "Say hi", "status": "in_progress"}]}),
        )]),
        Reply::raw_sse(thinking),
        // Never released: the client cancels this prompt.
        Reply::hold(&["waiting"], Arc::new(Notify::new()), &["never"]),
    ]))
    .await
}

/// The project the SDK client opens, `<dir>/ws/proj`, with the notes the model reads.
fn sdk_project(dir: &Path) -> PathBuf {
    let project = dir.join("ws/proj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "the notes\n").unwrap();
    project
}

/// Runs tests/acp/sdk_client.mjs with agentd started as `args` says (in-process with
/// `config` when `None`) and checks everything its summary says.
async fn sdk_run_checks_out(mock: &MockLlm, config: &Path, project: &Path, args: Option<Value>) {
    let modules = acp_clients();
    let mut client = command("node");
    client
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/acp/sdk_client.mjs"))
        .arg(&modules)
        .arg(env!("CARGO_BIN_EXE_agentd"))
        .arg(config)
        .arg(project);
    if let Some(args) = args {
        client.arg(args.to_string());
    }
    let out = output(client).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed: {stderr}");
    let summary: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&out.stdout)));

    // Every frame is a JSON line valid against the schema; both agentd processes exit 0.
    assert_eq!(summary["schemaErrors"], json!([]), "{summary:#}");
    assert_eq!(summary["nonJsonLines"], json!([]), "{summary:#}");
    assert!(summary["frames"].as_u64().unwrap() > 15, "{summary:#}");
    assert_eq!(summary["exitCodes"], json!([0, 0]), "{stderr}");

    assert_eq!(summary["protocolVersion"], 1);
    assert_eq!(summary["agentCapabilities"]["loadSession"], true);
    assert_eq!(summary["modes"]["currentModeId"], "ask");
    // A cwd outside the workspace and an unknown mode are clear errors.
    assert_eq!(summary["badCwd"]["code"], -32602, "{summary:#}");
    assert!(
        summary["badCwd"]["message"]
            .as_str()
            .unwrap()
            .contains("outside")
    );
    assert_eq!(summary["badMode"]["code"], -32602, "{summary:#}");

    // The prompt: two tools (the shell one asked about and allowed), a plan, a thought, text.
    assert_eq!(summary["stopReason"], "end_turn", "{summary:#}");
    assert_eq!(summary["agentText"], "all done");
    assert_eq!(summary["thoughtText"], "Both ran.");
    assert_eq!(
        summary["toolCalls"],
        json!([
            {"title": "read_file notes.txt", "kind": "read", "status": "completed"},
            {"title": "shell echo hi-from-shell", "kind": "execute", "status": "completed"},
            {"title": "update_plan", "kind": "think", "status": "completed"},
        ]),
        "{summary:#}"
    );
    assert_eq!(
        summary["permissions"],
        json!([{"title": "shell echo hi-from-shell", "kind": "execute",
                "options": ["allow_once", "allow_always", "reject_once", "reject_always"]}])
    );
    assert_eq!(
        summary["plan"],
        json!([[{"content": "Read the notes", "priority": "medium", "status": "completed"},
                {"content": "Say hi", "priority": "medium", "status": "in_progress"}]])
    );
    // The allowed command ran: its output went back to the model.
    let second = mock.requests()[1].to_string();
    assert!(second.contains("hi-from-shell"), "{second}");
    assert!(second.contains("the notes"), "{second}");

    // The cancelled prompt answers `cancelled`.
    assert_eq!(summary["cancelledStopReason"], "cancelled", "{summary:#}");

    // session/load on a new connection replays the history before it answers.
    let load = &summary["load"];
    assert_eq!(load["answer"]["modes"]["currentModeId"], "ask");
    assert_eq!(
        load["userText"], "read notes.txt and say hiwait for me",
        "{load:#}"
    );
    assert!(
        load["agentText"]
            .as_str()
            .unwrap()
            .starts_with("all donewaiting"),
        "{load:#}"
    );
    assert_eq!(load["toolCalls"], json!(["read", "execute", "think"]));
    assert!(
        load["updatesBeforeAnswer"].as_u64().unwrap() >= 8,
        "{load:#}"
    );
}

#[tokio::test]
async fn the_official_sdk_drives_a_session_and_every_frame_fits_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let project = sdk_project(dir.path());
    let mock = sdk_mock().await;
    let config = write_config(dir.path(), &mock);
    sdk_run_checks_out(&mock, &config, &project, None).await;
}

/// `agentd acp --url` hosts nothing: the same client run passes with every session living in
/// a separate agentd server (auth on) that the bridge reaches over its WebSocket and REST.
#[tokio::test]
async fn the_official_sdk_drives_a_session_through_a_bridge_to_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let project = sdk_project(dir.path());
    let mock = sdk_mock().await;
    let server = crate::support::ServerProcess::start_config(
        dir.path(),
        &format!(
            "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{0}/data\"\nworkspace = \"{0}/ws\"\n\
             auth_token = \"bridge-secret\"\n[llm]\nbase_url = \"{1}\"\nmodel = \"test-model\"\n\
             [tool_policy]\nask = [\"shell\"]\n",
            dir.path().display(),
            mock.base_url()
        ),
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "bridge-secret\n").unwrap();
    let args = json!([
        "acp",
        "--url",
        format!("ws://{}/api/ws", server.addr),
        "--token-file",
        token,
        "--workspace",
        dir.path().join("ws")
    ]);
    sdk_run_checks_out(&mock, &dir.path().join("unused.toml"), &project, Some(args)).await;
    // The sessions are the server's: its REST API lists the one the client made and loaded.
    let listed: Value = reqwest::Client::new()
        .get(format!("http://{}/api/sessions", server.addr))
        .bearer_auth("bridge-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["sessions"].as_array().unwrap().len(),
        1,
        "{listed:#}"
    );

    // A wrong token and a server that is not there are one clear line each, exit code 2.
    std::fs::write(&token, "not-the-token").unwrap();
    let url = format!("ws://{}/api/ws", server.addr);
    for (url, expected) in [
        (url.as_str(), "refused the token (401)"),
        ("ws://127.0.0.1:1/api/ws", "cannot reach agentd"),
        ("wss://127.0.0.1:1/api/ws", "wss:// is not supported"),
    ] {
        let mut bridge = command(env!("CARGO_BIN_EXE_agentd"));
        bridge
            .args(["acp", "--url", url, "--token-file"])
            .arg(&token)
            .arg("--workspace")
            .arg(dir.path().join("ws"));
        let out = output(bridge).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains(expected), "{url}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{url}: stdout is the protocol's alone"
        );
    }
}

#[tokio::test]
async fn acpx_runs_a_prompt_through_agentd_acp() {
    let modules = acp_clients();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("ws/proj");
    std::fs::create_dir_all(&project).unwrap();
    let mock = MockLlm::start(Script::always(Reply::text(&["hello ", "from agentd"]))).await;
    let config = write_config(dir.path(), &mock);
    let agent = format!(
        "{} acp --config {}",
        env!("CARGO_BIN_EXE_agentd"),
        config.display()
    );
    let mut acpx = command("node");
    acpx.arg(modules.join("acpx/dist/cli.js"))
        .args(["--agent", &agent, "--cwd"])
        .arg(&project)
        .args(["--format", "json", "--approve-all", "exec", "say hello"])
        // acpx keeps its state under HOME: a home of the test's own.
        .env("HOME", dir.path())
        .current_dir(&project);
    let out = output(acpx).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "acpx failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("hello ") && stdout.contains("from agentd"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(mock.request_count(), 1);
    let request = mock.requests()[0].to_string();
    assert!(request.contains("say hello"), "{request}");
}
