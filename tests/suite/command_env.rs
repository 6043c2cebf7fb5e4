//! What the server's own environment gives the processes a session starts: commands, hooks,
//! plugins and MCP stdio servers get a built environment, never the server's, and no
//! variable the configuration names as a secret, whatever it is called.

use std::path::Path;
use std::time::Duration;

use agentd::config::Config;
use serde_json::json;

use crate::support::{TestApp, config_in};

const WAIT: Duration = Duration::from_secs(60);

/// Set in the child test process whose environment holds the server's secrets.
const PROBE_MARKER: &str = "AGENTD_COMMAND_ENV_PROBE";

/// The server's environment in the probe: secrets under names that do not look like secrets,
/// and two harmless variables.
const SERVER_ENV: [(&str, &str); 7] = [
    ("ZETA_PROVIDER_CRED", "zeta-provider-secret"),
    ("MCP_REMOTE_BEARER", "mcp-bearer-secret"),
    ("HOOK_SIGNING_WORD", "hook-signing-secret"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "x-team=otel-header-secret"),
    ("AGENTD_AUTH_TOKEN", "auth-token-secret"),
    ("FOO_VISIBLE", "foo-harmless"),
    ("BAR_PASSED", "bar-passed"),
];

/// The configuration naming those secrets where an operator would: a second provider's
/// `api_key_env`, an MCP server's `bearer_token_env`, a hook's `secret_env`.
const CONFIG: &str = r#"
[llm]
model = "zeta/some-model"

[[llm.providers]]
name = "zeta"
base_url = "http://127.0.0.1:9"
api_key_env = "ZETA_PROVIDER_CRED"

[[mcp_servers]]
name = "remote"
url = "http://127.0.0.1:9/mcp"
bearer_token_env = "MCP_REMOTE_BEARER"
scope = "session"

[[mcp_servers]]
name = "dumper"
command = "sh"
args = ["-c", "env > mcp-env.txt"]
scope = "server"
startup_timeout_secs = 10

[[hooks]]
event = "Stop"
url = "http://127.0.0.1:9/hook"
secret_env = "HOOK_SIGNING_WORD"

[[hooks]]
event = "PreToolUse"
matcher = "shell"
command = "env > hook-env.txt"

[[plugins]]
name = "show_env"
description = "Prints its environment."
command = "env"

[sandbox]
env_pass = ["BAR_PASSED"]
env_set = { SET_BY_CONFIG = "set-value" }
"#;

/// Re-runs the test `name` in a child process whose environment holds [`SERVER_ENV`], so this
/// (multi-threaded) process never changes its own environment; answers whether this is the
/// child, which does the work.
async fn in_probe(name: &str) -> bool {
    if std::env::var_os(PROBE_MARKER).is_some() {
        return true;
    }
    let module = module_path!().split_once("::").unwrap().1;
    let mut probe = tokio::process::Command::new(std::env::current_exe().unwrap());
    probe
        .args([&format!("{module}::{name}"), "--exact", "--test-threads=1"])
        .env(PROBE_MARKER, "1")
        .kill_on_drop(true);
    for (name, value) in SERVER_ENV {
        probe.env(name, value);
    }
    let probe = tokio::time::timeout(WAIT, probe.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&probe.stdout);
    let stderr = String::from_utf8_lossy(&probe.stderr);
    assert!(probe.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the probe did not run: {stdout}"
    );
    false
}

/// Fails naming the secret, or the unlisted variable, that `env`'s output shows.
fn assert_built(what: &str, env: &str) {
    for (name, value) in SERVER_ENV {
        if name == "BAR_PASSED" {
            continue;
        }
        assert!(!env.contains(value), "{what} got {name}:\n{env}");
        assert!(!env.contains(name), "{what} got {name}:\n{env}");
    }
    assert!(!env.contains(PROBE_MARKER), "{what}:\n{env}");
    for line in [
        "BAR_PASSED=bar-passed",
        "SET_BY_CONFIG=set-value",
        "NO_COLOR=1",
        "PAGER=cat",
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{what}: {line} missing:\n{env}"
        );
    }
    assert!(
        env.lines().any(|l| l.starts_with("PATH=")),
        "{what}:\n{env}"
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[tokio::test]
async fn commands_hooks_plugins_and_mcp_servers_get_the_built_environment_only() {
    if !in_probe("commands_hooks_plugins_and_mcp_servers_get_the_built_environment_only").await {
        return;
    }
    assert_eq!(
        std::env::var("ZETA_PROVIDER_CRED").unwrap(),
        "zeta-provider-secret"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::from_toml(CONFIG).unwrap();
    let base = config_in(dir.path());
    config.server = base.server;
    config.sandbox.launcher = base.sandbox.launcher;
    let data_dir = config.server.data_dir.clone();
    let app = TestApp::start_in(dir, config).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;

    let shell = ws
        .invoke(&session, "shell", json!({"command": "env"}))
        .await;
    assert_eq!(shell["success"], true, "{shell}");
    assert_built("shell", shell["output"].as_str().unwrap());
    assert_built(
        "a command hook",
        &read(&app.workspace().join("hook-env.txt")),
    );

    let exec = ws
        .invoke(
            &session,
            "exec_command",
            json!({"cmd": "env", "yield_time_ms": 10000}),
        )
        .await;
    // exec_command answers JSON, the process's output in it.
    let exec: serde_json::Value = serde_json::from_str(exec["output"].as_str().unwrap()).unwrap();
    assert_built("exec_command", exec["output"].as_str().unwrap());

    let plugin = ws.invoke(&session, "show_env", json!({})).await;
    assert_eq!(plugin["success"], true, "{plugin}");
    assert_built("a plugin", plugin["output"].as_str().unwrap());

    // The stdio server wrote its environment and exited, failing its handshake, before the
    // server finished starting.
    assert_built(
        "an MCP stdio server",
        &read(&data_dir.join("mcp/dumper/mcp-env.txt")),
    );
    app.stop().await;
}

#[test]
fn check_config_refuses_env_pass_naming_a_secret_the_config_names() {
    let dir = tempfile::tempdir().unwrap();
    for pass in [
        "ZETA_PROVIDER_CRED",
        "MCP_REMOTE_BEARER",
        "HOOK_SIGNING_WORD",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "AGENTD_AUTH_TOKEN",
    ] {
        let text = CONFIG.replace(
            r#"env_pass = ["BAR_PASSED"]"#,
            &format!("env_pass = [{pass:?}]"),
        );
        std::fs::write(dir.path().join("agentd.toml"), text).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["check-config", "--config", "agentd.toml"])
            .current_dir(dir.path())
            // The hook's secret is read at load.
            .env("HOOK_SIGNING_WORD", "hook-signing-secret")
            .env_remove("AGENTD_AUTH_TOKEN")
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{pass}: {stderr}");
        assert!(
            stderr.contains(&format!("sandbox.env_pass: {pass:?} holds a secret")),
            "{pass}: {stderr}"
        );
    }
}
