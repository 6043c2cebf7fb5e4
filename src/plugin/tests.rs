//! Unit tests of plugin tools: the stdin/stdout protocol, stderr, limits, process-group
//! cleanup, the child environment and config validation.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::tools::process_probe::{gone, wait_gone};
use crate::tools::{ConcurrencyClass, ToolEvent};
use std::os::unix::fs::PermissionsExt;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    dir: tempfile::TempDir,
    ws: Arc<Workspace>,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let ws = Workspace::new(dir.path().join("root"));
        Self { dir, ws }
    }

    /// Writes an executable `#!/bin/sh` script outside the workspace; returns its path.
    fn script(&self, name: &str, body: &str) -> String {
        let path = self.dir.path().join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    fn plugin(&self, config: &PluginConfig) -> PluginTool {
        PluginTool::new(config, Arc::clone(&self.ws)).unwrap()
    }
}

fn config(name: &str, command: &str) -> PluginConfig {
    PluginConfig {
        name: name.to_owned(),
        description: "A test plugin.".to_owned(),
        command: command.to_owned(),
        args: Vec::new(),
        spawn_only: false,
        tags: Vec::new(),
        exclusive: true,
        timeout_ms: 30_000,
        input_schema: json!({"type": "object"}),
    }
}

async fn call(tool: &PluginTool, args: Value) -> Result<ToolResult, ToolError> {
    tokio::time::timeout(WAIT, tool.call(&ToolContext::detached("."), &args))
        .await
        .expect("the plugin answers within its timeout")
}

fn read_pids(path: &str) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("the plugin wrote no pid file {path}: {err}"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn arguments_arrive_on_stdin_and_stdout_is_the_result() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config("echo", &fx.script("echo.sh", "exec cat")));
    let args = json!({"query": "héllo \"world\"", "n": [1, 2, {"deep": null}]});
    let result = call(&tool, args.clone()).await.unwrap();
    assert!(result.success, "{}", result.output);
    let echoed: Value = serde_json::from_str(&result.output).unwrap();
    assert_eq!(echoed, args);
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["exit_code"], 0);
    assert_eq!(meta["stdout_truncated"], false);
    assert!(meta["duration_ms"].is_u64());

    // stderr is not part of a successful result; configured args reach the program.
    let mut with_args = config(
        "args",
        &fx.script("args.sh", "echo \"$1|$2\"; echo noise >&2"),
    );
    with_args.args = vec!["a b".into(), "c".into()];
    let result = call(&fx.plugin(&with_args), json!({})).await.unwrap();
    assert!(result.success);
    assert_eq!(result.output, "a b|c\n");
}

#[tokio::test]
async fn non_zero_exit_is_unsuccessful_with_code_and_stderr() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config(
        "fails",
        &fx.script(
            "fails.sh",
            "printf partial; echo 'first problem' >&2; echo 'boom' >&2; exit 3",
        ),
    ));
    let result = call(&tool, json!({})).await.unwrap();
    assert!(!result.success);
    assert_eq!(
        result.output,
        "partial\nplugin fails failed: exit code 3\nstderr:\nfirst problem\nboom\n"
    );
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["exit_code"], 3);
    assert_eq!(meta["timed_out"], false);

    let quiet = fx.plugin(&config("quiet", &fx.script("quiet.sh", "exit 1")));
    let result = call(&quiet, json!({})).await.unwrap();
    assert_eq!(
        result.output,
        "plugin quiet failed: exit code 1\nstderr: (empty)"
    );
}

#[tokio::test]
async fn long_stderr_keeps_its_tail() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config(
        "noisy",
        &fx.script(
            "noisy.sh",
            "i=0; while [ $i -lt 2000 ]; do echo \"line $i\" >&2; i=$((i+1)); done; exit 2",
        ),
    ));
    let result = call(&tool, json!({})).await.unwrap();
    assert!(!result.success);
    let stderr = result.output.split_once("stderr:\n").unwrap().1;
    assert!(stderr.starts_with("[… "), "{stderr}");
    assert!(stderr.ends_with("line 1998\nline 1999\n"), "{stderr}");
    assert!(!stderr.contains("line 0\n"));
    assert!(stderr.len() <= STDERR_TAIL_BYTES + 64);
    // The cut is on a line boundary.
    assert!(stderr.lines().nth(1).unwrap().starts_with("line "));
}

#[tokio::test]
async fn stdout_is_capped_and_says_so() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config(
        "big",
        &fx.script("big.sh", "head -c 5000000 /dev/zero | tr '\\0' x"),
    ));
    let result = call(&tool, json!({})).await.unwrap();
    assert!(result.success);
    assert!(result.output.starts_with("xxx"));
    assert!(
        result
            .output
            .ends_with("x\n[stdout cut at 4194304 bytes; the plugin wrote 5000000 bytes]\n"),
        "{}",
        &result.output[result.output.len() - 100..]
    );
    assert_eq!(result.output.matches('x').count(), STDOUT_CAP_BYTES);
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["stdout_truncated"], true);
    assert_eq!(meta["stdout_bytes"], 5_000_000);
}

#[tokio::test]
async fn stderr_lines_stream_as_output_events() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config(
        "progress",
        &fx.script(
            "progress.sh",
            "echo 'step one' >&2; echo 'step two' >&2; printf 'unterminated' >&2; echo done",
        ),
    ));
    let (events, mut received) = mpsc::channel(16);
    let ctx = ToolContext {
        events: Some(events),
        tool_call_id: "call-7".into(),
        ..ToolContext::detached(fx.ws.root())
    };
    let result = tokio::time::timeout(WAIT, tool.call(&ctx, &json!({})))
        .await
        .unwrap()
        .unwrap();
    assert!(result.success);
    assert_eq!(result.output, "done\n");
    drop(ctx);
    let mut lines = Vec::new();
    while let Some(event) = received.recv().await {
        let ToolEvent::Output { tool_call_id, text } = event else {
            panic!("{event:?}");
        };
        assert_eq!(tool_call_id, "call-7");
        lines.push(text);
    }
    assert_eq!(lines, ["step one\n", "step two\n", "unterminated"]);
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let fx = Fixture::new();
    let pid_file = fx.path("pids");
    let mut slow = config(
        "slow",
        &fx.script(
            "slow.sh",
            "sleep 100 &\necho $$ $! > \"$1\"\necho 'started' >&2\nsleep 100",
        ),
    );
    slow.args = vec![pid_file.clone()];
    slow.timeout_ms = 1_500;
    let tool = fx.plugin(&slow);
    let started = Instant::now();
    let result = call(&tool, json!({})).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!result.success);
    assert!(
        result.output.starts_with(
            "plugin slow failed: timed out after 1500 ms; it and every process it started were killed\nstderr:\nstarted\n"
        ),
        "{}",
        result.output
    );
    let meta = result.structured_metadata.unwrap();
    assert_eq!(meta["timed_out"], true);
    assert_eq!(meta["exit_code"], Value::Null);
    let pids = read_pids(&pid_file);
    assert_eq!(pids.len(), 2);
    // The script was our child and is reaped; its background sleep died with the group.
    assert!(!Path::new(&format!("/proc/{}", pids[0])).exists());
    wait_gone(pids[1]).await;
}

#[tokio::test]
async fn cancellation_kills_the_process_group() {
    let fx = Fixture::new();
    let pid_file = fx.path("pids");
    let mut slow = config(
        "waits",
        &fx.script(
            "waits.sh",
            "sleep 100 &\necho $$ $! > \"$1\"\necho ready >&2\nsleep 100",
        ),
    );
    slow.args = vec![pid_file.clone()];
    let tool = fx.plugin(&slow);
    let (events, mut received) = mpsc::channel(16);
    let ctx = ToolContext {
        events: Some(events),
        ..ToolContext::detached(fx.ws.root())
    };
    let cancel = ctx.cancel.clone();
    let task = tokio::spawn(async move { tool.call(&ctx, &json!({})).await });
    let event = tokio::time::timeout(WAIT, received.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, ToolEvent::Output { text, .. } if text == "ready\n"),
        "{event:?}"
    );
    let pids = read_pids(&pid_file);
    assert!(pids.iter().all(|pid| !gone(*pid)));
    cancel.cancel();
    let result = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!result.success);
    assert!(
        result.output.starts_with("plugin waits failed: cancelled;"),
        "{}",
        result.output
    );
    assert_eq!(result.structured_metadata.unwrap()["cancelled"], true);
    assert!(!Path::new(&format!("/proc/{}", pids[0])).exists());
    wait_gone(pids[1]).await;
}

#[tokio::test]
async fn dropping_the_call_kills_the_process_group() {
    let fx = Fixture::new();
    let pid_file = fx.path("pids");
    let mut slow = config(
        "dropped",
        &fx.script(
            "dropped.sh",
            "sleep 100 &\necho $$ $! > \"$1\"\necho ready >&2\nsleep 100",
        ),
    );
    slow.args = vec![pid_file.clone()];
    let tool = fx.plugin(&slow);
    let (events, mut received) = mpsc::channel(16);
    let ctx = ToolContext {
        events: Some(events),
        ..ToolContext::detached(fx.ws.root())
    };
    let task = tokio::spawn(async move { tool.call(&ctx, &json!({})).await });
    tokio::time::timeout(WAIT, received.recv())
        .await
        .unwrap()
        .unwrap();
    let pids = read_pids(&pid_file);
    // As the registry does on interrupt: the call's future is dropped, not cancelled.
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test]
async fn background_jobs_die_when_the_plugin_exits() {
    let fx = Fixture::new();
    let tool = fx.plugin(&config(
        "leaves",
        &fx.script("leaves.sh", "sleep 100 &\necho $!"),
    ));
    let result = call(&tool, json!({})).await.unwrap();
    assert!(result.success, "{}", result.output);
    wait_gone(result.output.trim().parse().unwrap()).await;
}

#[tokio::test]
async fn a_program_that_cannot_start_is_spawn_failed() {
    let fx = Fixture::new();
    let missing = fx.path("bin/missing-plugin");
    for command in [missing.as_str(), "agentd-no-such-plugin-program"] {
        let tool = fx.plugin(&config("missing", command));
        match call(&tool, json!({})).await {
            Err(ToolError::Model { kind, message }) => {
                assert_eq!(kind, "spawn_failed");
                assert!(
                    message.starts_with(&format!("plugin missing: could not start `{command}`")),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // A file that is not executable cannot start either.
    let script = fx.script("not-exec.sh", "echo hi");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let tool = fx.plugin(&config("noexec", &script));
    assert!(matches!(
        call(&tool, json!({})).await,
        Err(ToolError::Model {
            kind: "spawn_failed",
            ..
        })
    ));
}

/// Set in the child test process that carries the fake secret.
const PROBE_MARKER: &str = "AGENTD_PLUGIN_ENV_PROBE";

#[tokio::test]
async fn the_plugin_gets_the_built_environment_not_the_servers() {
    if std::env::var_os(PROBE_MARKER).is_none() {
        // Re-run this very test in a child process whose environment holds a fake secret,
        // so this (multi-threaded) process never has to modify its own environment.
        let module = module_path!().split_once("::").unwrap().1;
        let name = format!("{module}::the_plugin_gets_the_built_environment_not_the_servers");
        let probe = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--test-threads=1"])
            .env(PROBE_MARKER, "1")
            .env("AGENTD_TEST_SECRET_TOKEN", "fake-secret-value")
            .env("PLUGIN_TEST_UNLISTED", "not-listed")
            .kill_on_drop(true)
            .output();
        let probe = tokio::time::timeout(WAIT, probe).await.unwrap().unwrap();
        let stdout = String::from_utf8_lossy(&probe.stdout);
        let stderr = String::from_utf8_lossy(&probe.stderr);
        assert!(probe.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("1 passed"),
            "the probe did not run: {stdout}"
        );
        return;
    }
    assert_eq!(
        std::env::var("AGENTD_TEST_SECRET_TOKEN").unwrap(),
        "fake-secret-value"
    );
    let fx = Fixture::new();
    let tool = fx.plugin(&config("env", &fx.script("env.sh", "env")));
    let result = call(&tool, json!({})).await.unwrap();
    assert!(result.success);
    let output = &result.output;
    assert!(!output.contains("AGENTD_TEST_SECRET_TOKEN"), "{output}");
    assert!(!output.contains("fake-secret-value"), "{output}");
    assert!(!output.contains(PROBE_MARKER), "{output}");
    let root = fx.ws.root().to_string_lossy().into_owned();
    assert!(!output.contains("PLUGIN_TEST_UNLISTED"), "{output}");
    for line in ["NO_COLOR=1", "PAGER=cat", &format!("PWD={root}")] {
        assert!(
            output.lines().any(|l| l == line),
            "{line} missing: {output}"
        );
    }
}

#[tokio::test]
async fn tags_concurrency_spawn_only_and_schema_come_from_the_config() {
    let fx = Fixture::new();
    let schema = json!({
        "type": "object",
        "description": "Lint a file.",
        "properties": {"path": {"type": "string", "description": "The file."}},
        "required": ["path"],
        "additionalProperties": false
    });
    let mut linter = config("lint-file_2", "/bin/true");
    linter.description = "Lints one file.".into();
    linter.tags = vec!["fs".into(), "custom-plugin-tag".into()];
    linter.exclusive = false;
    linter.spawn_only = true;
    linter.input_schema = schema.clone();
    let tool = fx.plugin(&linter);
    assert_eq!(tool.meta().name, "lint-file_2");
    assert_eq!(tool.meta().description, "Lints one file.");
    assert_eq!(tool.meta().tags, ["fs", "custom-plugin-tag"]);
    assert_eq!(tool.meta().concurrency, ConcurrencyClass::Safe);
    assert!(tool.spawn_only());
    assert_eq!(*tool.meta().input_schema, schema);

    let plain = fx.plugin(&config("plain", "/bin/true"));
    assert_eq!(plain.meta().tags, [] as [&str; 0]);
    assert_eq!(plain.meta().concurrency, ConcurrencyClass::Exclusive);
    assert!(!plain.spawn_only());

    // Building the same tags again reuses the interned strings.
    let again = fx.plugin(&linter);
    assert!(std::ptr::eq(tool.meta().tags[1], again.meta().tags[1]));

    let mut registry = crate::tools::ToolRegistry::default();
    registry.register(Arc::new(tool)).unwrap();
    assert!(registry.contains("lint-file_2"));
}

#[tokio::test]
async fn rebind_moves_the_working_directory() {
    let fx = Fixture::new();
    let other_dir = tempfile::tempdir().unwrap();
    let other = Workspace::new(other_dir.path());
    let mut pwd = config("pwd", &fx.script("pwd.sh", "pwd"));
    pwd.tags = vec!["runtime".into()];
    let tool = fx.plugin(&pwd);
    let result = call(&tool, json!({})).await.unwrap();
    assert_eq!(
        Path::new(result.output.trim()),
        fx.ws.root().canonicalize().unwrap()
    );

    let rebound = tool.rebind_cwd(&other).unwrap();
    let result = tokio::time::timeout(WAIT, rebound.call(&ToolContext::detached("."), &json!({})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Path::new(result.output.trim()),
        other_dir.path().canonicalize().unwrap()
    );
    // The rebound tool shares the definition: the very same metadata, tags included.
    assert!(std::ptr::eq(rebound.meta(), tool.meta()));
    assert!(std::ptr::eq(rebound.tags(), &tool.meta().tags[..]));
    assert_eq!(rebound.name(), "pwd");
}

#[test]
fn invalid_entries_are_refused() {
    let fx = Fixture::new();
    let refuse = |config: PluginConfig| {
        PluginTool::new(&config, Arc::clone(&fx.ws)).expect_err("must be refused")
    };
    let long = "a".repeat(MAX_NAME_LEN + 1);
    for name in [
        "",
        "Upper",
        "has space",
        "dot.ted",
        "group:web",
        "ünï",
        &long,
    ] {
        match refuse(config(name, "/bin/true")) {
            PluginError::InvalidName { name: got, .. } => assert_eq!(got, name),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    assert!(
        PluginTool::new(
            &config(&"a".repeat(MAX_NAME_LEN), "/bin/true"),
            fx.ws.clone()
        )
        .is_ok()
    );

    let err = refuse(config("bad name", "/bin/true"));
    assert!(err.to_string().contains("' ' is not allowed"), "{err}");

    let mut zero = config("zero", "/bin/true");
    zero.timeout_ms = 0;
    assert_eq!(
        refuse(zero),
        PluginError::InvalidTimeout {
            name: "zero".into()
        }
    );

    let mut blank = config("blank", " ");
    assert!(matches!(
        refuse(blank.clone()),
        PluginError::EmptyCommand { .. }
    ));
    blank.command = "/bin/true".into();
    blank.description = "\n".into();
    assert!(matches!(
        refuse(blank),
        PluginError::EmptyDescription { .. }
    ));

    let mut tagged = config("tagged", "/bin/true");
    tagged.tags = vec!["fs".into(), String::new()];
    assert_eq!(
        refuse(tagged),
        PluginError::EmptyTag {
            name: "tagged".into(),
            index: 1
        }
    );

    for schema in [
        json!("object"),
        json!({"type": "string"}),
        json!({"properties": {}}),
        json!({"type": "object", "properties": 5}),
    ] {
        let mut bad = config("schema", "/bin/true");
        bad.input_schema = schema.clone();
        match refuse(bad) {
            PluginError::InvalidSchema { name, message } => {
                assert_eq!(name, "schema");
                assert!(!message.is_empty(), "{schema}");
            }
            other => panic!("{schema}: {other:?}"),
        }
    }
}
