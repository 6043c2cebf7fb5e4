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

#[tokio::test]
async fn the_official_sdk_drives_a_session_and_every_frame_fits_the_schema() {
    let modules = acp_clients();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("ws/proj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "the notes\n").unwrap();
    let thinking = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Both ran.\"}}]}\n\n\
                    data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"all done\"}}]}\n\n\
                    data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                    data: [DONE]\n\n";
    let mock = MockLlm::start(Script::sequence(vec![
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
    .await;
    let config = write_config(dir.path(), &mock);
    let mut client = command("node");
    client
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/acp/sdk_client.mjs"))
        .arg(&modules)
        .arg(env!("CARGO_BIN_EXE_agentd"))
        .arg(&config)
        .arg(&project);
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
