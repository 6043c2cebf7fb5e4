//! The `shell` tool: one command through `sh -c` in the workspace, with a time limit, its
//! output streamed to the session as it arrives and capped (head and tail) in the result.
//!
//! stdout and stderr share one pipe, so the output interleaves them in the order the command
//! wrote them. The command runs in a process group of its own; a timeout or cancellation kills
//! the whole group, and so does the command's exit (nothing it left in the background lives
//! on). Long-running or interactive work belongs to `exec_command`.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::parse_args;
use super::process::{
    HeadTail, Utf8Chunks, kill_group, merged_output, resolve_workdir, shell_command, signal_name,
};
use crate::tools::{
    CallSubject, Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace,
};

const NAME: &str = "shell";
const DEFAULT_TIMEOUT_MS: u64 = 120_000;
const MIN_TIMEOUT_MS: u64 = 1_000;
const MAX_TIMEOUT_MS: u64 = 600_000;
/// Output kept in the result: the first and last halves of this.
pub const OUTPUT_CAP_BYTES: usize = 64 * 1024;
/// Output streamed to the session per call; past it only the result carries output.
const STREAM_CAP_BYTES: usize = 1024 * 1024;
/// How long one streamed chunk may wait for a slow listener before streaming stops.
const STREAM_SEND_WAIT: Duration = Duration::from_millis(100);
/// How long output may keep arriving once the command exited (and its group was killed),
/// for a process that left the group but still holds the pipe.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long reaping a killed command may take before giving up on it (tokio reaps it later).
const REAP_WAIT: Duration = Duration::from_secs(5);

/// `shell`: runs one command to completion and reports its output and exit status.
#[derive(Debug, Clone)]
pub struct Shell {
    workspace: Arc<Workspace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellArgs {
    command: String,
    workdir: Option<String>,
    timeout_ms: Option<u64>,
    /// Read by the registry, which then hands the call to the task supervisor; here it only
    /// lengthens the default timeout.
    #[serde(default)]
    run_in_background: bool,
}

/// Why the command stopped.
enum Ending {
    Exited(io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

/// Kills the command's process group however the call ends, even if its future is dropped.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Sends output chunks to the session without ever holding the command up for long.
struct LiveOutput<'a> {
    ctx: &'a ToolContext,
    text: Utf8Chunks,
    sent: usize,
    live: bool,
}

impl<'a> LiveOutput<'a> {
    fn new(ctx: &'a ToolContext) -> Self {
        Self {
            ctx,
            text: Utf8Chunks::default(),
            sent: 0,
            live: ctx.events.is_some(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        if !self.live {
            return;
        }
        let text = self.text.push(bytes);
        if text.is_empty() {
            return;
        }
        self.sent += text.len();
        if self.sent > STREAM_CAP_BYTES {
            self.live = false;
            return;
        }
        // A listener that cannot keep up loses the live view, not the result.
        if tokio::time::timeout(STREAM_SEND_WAIT, self.ctx.output(text))
            .await
            .is_err()
        {
            self.live = false;
        }
    }
}

impl Shell {
    /// The tool bound to `workspace`; commands run in its root unless given a workdir.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    async fn run(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ShellArgs = parse_args(NAME, args)?;
        if args.command.trim().is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                format!("{NAME}: `command` is empty; give the command line to run"),
            ));
        }
        let dir = resolve_workdir(&self.workspace, NAME, args.workdir.as_deref())?;
        let default_timeout = if args.run_in_background {
            MAX_TIMEOUT_MS
        } else {
            DEFAULT_TIMEOUT_MS
        };
        let timeout_ms = args
            .timeout_ms
            .unwrap_or(default_timeout)
            .clamp(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
        if ctx.cancel.is_cancelled() {
            return Ok(ToolResult::failure(format!(
                "{NAME}: cancelled before the command started"
            )));
        }
        let spawn_failed = |err: io::Error| {
            ToolError::model(
                "spawn_failed",
                format!("{NAME}: could not start `sh -c`: {err}"),
            )
        };

        self.workspace.admit_command()?;
        let started = Instant::now();
        let sandbox = self.workspace.sandbox();
        // A session's cgroup is made at its first command: no counter yet reads as none.
        let oom_kills_before = sandbox.and_then(|s| s.oom_kills()).unwrap_or(0);
        let mut command =
            shell_command(&self.workspace, &args.command, &dir).map_err(spawn_failed)?;
        command.process_group(0).stdin(Stdio::null());
        let mut reader = merged_output(&mut command).map_err(spawn_failed)?;
        let mut child = command.spawn().map_err(spawn_failed)?;
        // The command still holds the pipe's write ends; EOF comes only once it is gone.
        drop(command);
        let pgid = child.id().unwrap_or(0);
        let _guard = GroupGuard(pgid);

        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        let mut capture = HeadTail::new(OUTPUT_CAP_BYTES);
        let mut live = LiveOutput::new(ctx);
        let mut buf = vec![0u8; 16 * 1024];
        let mut eof = false;
        let mut status: Option<io::Result<ExitStatus>> = None;
        let mut drain_deadline = deadline;
        let mut stopped: Option<Ending> = None;

        while stopped.is_none() && !(eof && status.is_some()) {
            tokio::select! {
                biased;
                _ = ctx.cancel.cancelled() => stopped = Some(Ending::Cancelled),
                _ = tokio::time::sleep_until(deadline) => stopped = Some(Ending::TimedOut),
                exited = child.wait(), if status.is_none() => {
                    status = Some(exited);
                    // Background jobs would outlive the command and keep the pipe open.
                    kill_group(pgid);
                    drain_deadline = tokio::time::Instant::now() + DRAIN_GRACE;
                }
                _ = tokio::time::sleep_until(drain_deadline), if status.is_some() => eof = true,
                read = reader.read(&mut buf), if !eof => match read {
                    Ok(0) | Err(_) => eof = true,
                    Ok(n) => {
                        capture.push(&buf[..n]);
                        live.send(&buf[..n]).await;
                    }
                },
            }
        }

        let ending = match stopped {
            Some(ending) => {
                kill_group(pgid);
                let _ = tokio::time::timeout(REAP_WAIT, child.wait()).await;
                // What the killed processes wrote before dying is still in the pipe.
                let drain = async {
                    while let Ok(n @ 1..) = reader.read(&mut buf).await {
                        capture.push(&buf[..n]);
                    }
                };
                let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
                ending
            }
            None => Ending::Exited(status.unwrap_or_else(|| Err(io::Error::other("no status")))),
        };
        let wall = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let mut result = report(&ending, timeout_ms, wall, &capture);
        // The session's OOM counter moved while the command ran: the memory cap killed one
        // of its processes. When that ended the command (the shell's 137) it is said first,
        // as that is what to act on; when the command survived it, it is said after.
        if let Some(sandbox) = sandbox
            && sandbox.oom_kills().unwrap_or(0) > oom_kills_before
        {
            let killed = format!(
                "killed: out of memory (limit {} MiB)",
                sandbox.memory_max_mb()
            );
            let ended_it = matches!(&ending, Ending::Exited(Ok(status))
                if status.code() == Some(137) || status.signal() == Some(9));
            result.output = if ended_it {
                format!("{killed}\n{}", result.output)
            } else {
                format!(
                    "{}\n{killed}: a process this command started",
                    result.output
                )
            };
            if let Some(metadata) = result
                .structured_metadata
                .as_mut()
                .and_then(|m| m.as_object_mut())
            {
                metadata.insert("out_of_memory".into(), json!(true));
            }
        }
        // 127 (not found) and 126 (not runnable) are what a program behind a PATH entry the
        // sandbox hides gives; say which entries those are, so nobody guesses.
        if let Ending::Exited(Ok(status)) = &ending
            && matches!(status.code(), Some(126 | 127))
            && let Some(hint) = sandbox.and_then(|s| s.unreachable_path_hint())
        {
            result.output.push('\n');
            result.output.push_str(&hint);
        }
        if args.run_in_background {
            // The output streamed into the task's log already; the result ends that log, so it
            // says how the command ended instead of repeating what it wrote.
            let status = result.output.lines().take(2).collect::<Vec<_>>().join("\n");
            result.output = format!(
                "{status}\noutput: {} bytes, in this task's log above (read_task_output)",
                capture.total()
            );
        }
        Ok(result)
    }
}

/// The model's text and the host's metadata for a finished command.
fn report(ending: &Ending, timeout_ms: u64, wall: f64, capture: &HeadTail) -> ToolResult {
    let (mut code, mut signal) = (None, None);
    let status_line = match ending {
        Ending::Exited(Ok(status)) => {
            code = status.code();
            signal = status.signal();
            match (code, signal) {
                (Some(c), _) => format!("exit code: {c}"),
                (None, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
                (None, None) => "exited with an unknown status".to_owned(),
            }
        }
        Ending::Exited(Err(err)) => format!("exit status unknown: {err}"),
        Ending::TimedOut => {
            format!("timed out after {timeout_ms} ms; the command and its children were killed")
        }
        Ending::Cancelled => "cancelled; the command and its children were killed".to_owned(),
    };
    let output = capture.render();
    let mut text = format!("{status_line}\nwall time: {wall:.3} s\n");
    if output.is_empty() {
        text.push_str("output: (none)");
    } else {
        text.push_str("output:\n");
        text.push_str(&output);
    }
    let metadata = json!({
        "exit_code": code,
        "signal": signal,
        "timed_out": matches!(ending, Ending::TimedOut),
        "cancelled": matches!(ending, Ending::Cancelled),
        "wall_time_seconds": wall,
        "output_bytes": capture.total(),
        "truncated": capture.truncated(),
    });
    let result = if code == Some(0) {
        ToolResult::ok(text)
    } else {
        ToolResult::failure(text)
    };
    result.with_metadata(metadata)
}

#[async_trait]
impl Tool for Shell {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                NAME,
                "Run one shell command (`sh -c`) in the workspace and wait for it to finish. \
                 Returns the exit code and the combined output, stdout and stderr interleaved in \
                 the order they were written; output over 64 KiB keeps its beginning and end. \
                 Input is empty (nothing can be typed), colours and pagers are off. The command is \
                 killed with everything it started after timeout_ms (default 120000), and anything \
                 it leaves in the background is killed when it exits. For long builds or test runs \
                 set run_in_background: the call answers at once with a task_handle, and \
                 read_task_output reads the output while it runs and after. For servers, \
                 watchers or interactive programs use exec_command instead.",
                json!({
                    "type": "object",
                    "description": "Run one shell command to completion.",
                    "properties": {
                        "command": {
                            "type": "string",
                            "description": "The command line, run with `sh -c`, e.g. \"cargo test 2>&1 | tail -n 50\"."
                        },
                        "workdir": {
                            "type": "string",
                            "description": "Directory to run in, relative to the workspace root (default: the root). It must exist inside the workspace and not pass through a symlink."
                        },
                        "timeout_ms": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "Kill the command after this many milliseconds; 1000 to 600000, default 120000 (600000 in the background)."
                        },
                        "run_in_background": {
                            "type": "boolean",
                            "description": "true to run it as a background task: the answer is a task_handle at once, the output is read with read_task_output. Default false."
                        }
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }),
                Effects::RUNS_COMMANDS,
            )
            .subject(CallSubject::CommandLine("command"))
            .groups(&["runtime", "delegated"])
            .base()
            .contract()
            .tags(&["runtime"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(ctx, args).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn runs_in_background(&self, args: &Value) -> bool {
        crate::tools::asks_background(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::process_probe::{pids_in, wait_gone};
    use crate::tools::{ConcurrencyClass, ToolEvent};
    use tokio::sync::mpsc;

    const WAIT: Duration = Duration::from_secs(30);

    fn workspace() -> (tempfile::TempDir, Arc<Workspace>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let ws = Workspace::new(dir.path().join("root"));
        (dir, ws)
    }

    async fn shell(ws: &Arc<Workspace>, args: Value) -> Result<ToolResult, ToolError> {
        let tool = Shell::new(Arc::clone(ws));
        tokio::time::timeout(WAIT, tool.call(&ToolContext::detached("."), &args))
            .await
            .expect("shell answers within its timeout")
    }

    #[tokio::test]
    async fn reports_exit_code_and_interleaved_output() {
        let (_dir, ws) = workspace();
        let result = shell(
            &ws,
            json!({"command": "echo one; echo two >&2; echo three"}),
        )
        .await
        .unwrap();
        assert!(result.success);
        assert!(
            result.output.starts_with("exit code: 0\nwall time: "),
            "{}",
            result.output
        );
        assert!(
            result.output.ends_with("output:\none\ntwo\nthree\n"),
            "{}",
            result.output
        );
        let meta = result.structured_metadata.unwrap();
        assert_eq!(meta["exit_code"], 0);
        assert_eq!(meta["timed_out"], false);
        assert_eq!(meta["output_bytes"], 14);

        let result = shell(&ws, json!({"command": "true"})).await.unwrap();
        assert!(
            result.output.ends_with("output: (none)"),
            "{}",
            result.output
        );
    }

    #[tokio::test]
    async fn non_zero_exit_and_signals_are_failures() {
        let (_dir, ws) = workspace();
        let result = shell(&ws, json!({"command": "echo bad; exit 3"}))
            .await
            .unwrap();
        assert!(!result.success);
        assert!(
            result.output.starts_with("exit code: 3\n"),
            "{}",
            result.output
        );
        assert!(result.output.ends_with("bad\n"));

        let result = shell(&ws, json!({"command": "kill -TERM $$"}))
            .await
            .unwrap();
        assert!(!result.success);
        assert!(
            result.output.starts_with("killed by signal 15 (SIGTERM)\n"),
            "{}",
            result.output
        );
        assert_eq!(result.structured_metadata.unwrap()["signal"], 15);
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let (_dir, ws) = workspace();
        let started = Instant::now();
        let result = shell(
            &ws,
            json!({
                "command": "echo pid:$$; sleep 100 & echo pid:$!; sleep 100 & echo pid:$!; wait",
                "timeout_ms": 1000
            }),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(!result.success);
        assert!(
            result.output.starts_with("timed out after 1000 ms;"),
            "{}",
            result.output
        );
        assert_eq!(
            result.structured_metadata.as_ref().unwrap()["timed_out"],
            true
        );
        let pids = pids_in(&result.output);
        assert_eq!(pids.len(), 3, "{}", result.output);
        // The shell itself was our child and is reaped; its sleeps are killed with the group.
        assert!(!std::path::Path::new(&format!("/proc/{}", pids[0])).exists());
        for pid in pids {
            wait_gone(pid).await;
        }
    }

    #[tokio::test]
    async fn timeout_is_clamped_to_at_least_a_second() {
        let (_dir, ws) = workspace();
        let result = shell(&ws, json!({"command": "sleep 100", "timeout_ms": 1}))
            .await
            .unwrap();
        assert!(
            result.output.starts_with("timed out after 1000 ms;"),
            "{}",
            result.output
        );
    }

    #[tokio::test]
    async fn background_jobs_die_when_the_command_exits() {
        let (_dir, ws) = workspace();
        let result = shell(&ws, json!({"command": "sleep 100 & echo pid:$!"}))
            .await
            .unwrap();
        assert!(result.success, "{}", result.output);
        let pids = pids_in(&result.output);
        assert_eq!(pids.len(), 1);
        wait_gone(pids[0]).await;
    }

    #[tokio::test]
    async fn large_output_keeps_head_and_tail() {
        let (_dir, ws) = workspace();
        let result = shell(
            &ws,
            json!({"command": "echo START; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END"}),
        )
        .await
        .unwrap();
        assert!(result.success);
        let output = result.output.split_once("output:\n").unwrap().1;
        assert!(output.starts_with("START\nxxx"));
        assert!(output.ends_with("xxx\nEND\n"));
        let omitted = 6 + 200_000 + 1 + 4 - OUTPUT_CAP_BYTES;
        assert!(
            output.contains(&format!("\n[… {omitted} bytes omitted …]\n")),
            "{}",
            &output[32_760..32_800]
        );
        assert!(output.len() <= OUTPUT_CAP_BYTES + 40);
        let meta = result.structured_metadata.unwrap();
        assert_eq!(meta["truncated"], true);
        assert_eq!(meta["output_bytes"], 200_011);
    }

    #[tokio::test]
    async fn workdir_stays_inside_the_workspace() {
        let (dir, ws) = workspace();
        std::fs::create_dir(ws.root().join("sub")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), ws.root().join("link")).unwrap();

        let result = shell(&ws, json!({"command": "pwd", "workdir": "sub"}))
            .await
            .unwrap();
        assert!(result.output.ends_with("/root/sub\n"), "{}", result.output);
        let absolute = ws.root().join("sub").to_string_lossy().into_owned();
        let result = shell(&ws, json!({"command": "pwd", "workdir": absolute}))
            .await
            .unwrap();
        assert!(result.output.ends_with("/root/sub\n"), "{}", result.output);

        for (workdir, kind) in [
            ("..", "escapes_root"),
            ("sub/../../outside", "escapes_root"),
            ("/tmp", "absolute_path"),
            ("link", "symlink"),
            ("missing", "not_found"),
        ] {
            match shell(&ws, json!({"command": "pwd", "workdir": workdir})).await {
                Err(ToolError::Model { kind: got, message }) => {
                    assert_eq!(got, kind, "{workdir}: {message}");
                    assert!(message.starts_with("shell: workdir: "), "{message}");
                }
                other => panic!("{workdir}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn cancellation_kills_the_command_and_output_streams() {
        let (_dir, ws) = workspace();
        let (events, mut received) = mpsc::channel(16);
        let ctx = ToolContext {
            events: Some(events),
            tool_call_id: "call-1".into(),
            ..ToolContext::detached(ws.root())
        };
        let cancel = ctx.cancel.clone();
        let tool = Shell::new(Arc::clone(&ws));
        let task = tokio::spawn(async move {
            tool.call(&ctx, &json!({"command": "echo pid:$$; sleep 100"}))
                .await
        });
        let event = tokio::time::timeout(WAIT, received.recv())
            .await
            .unwrap()
            .unwrap();
        let ToolEvent::Output { tool_call_id, text } = event else {
            panic!("{event:?}");
        };
        assert_eq!(tool_call_id, "call-1");
        let pid = pids_in(&text)[0];
        cancel.cancel();
        let result = tokio::time::timeout(WAIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!result.success);
        assert!(result.output.starts_with("cancelled;"), "{}", result.output);
        assert!(result.output.contains(&format!("pid:{pid}")));
        assert_eq!(result.structured_metadata.unwrap()["cancelled"], true);
        wait_gone(pid).await;
    }

    /// Set in the child test process that holds the fake secrets.
    const PROBE_MARKER: &str = "AGENTD_SHELL_ENV_PROBE";

    #[tokio::test]
    async fn secrets_do_not_reach_the_command() {
        if std::env::var_os(PROBE_MARKER).is_none() {
            // Re-run this very test in a child process whose environment holds fake secrets,
            // so this (multi-threaded) process never has to modify its own environment.
            let module = module_path!().split_once("::").unwrap().1;
            let name = format!("{module}::secrets_do_not_reach_the_command");
            let probe = tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([name.as_str(), "--exact", "--test-threads=1"])
                .env(PROBE_MARKER, "1")
                .env("AGENTD_LLM_API_KEY", "sk-fake-agentd")
                .env("OPENAI_API_KEY", "sk-fake-openai")
                .env("ZETA_PROVIDER_CRED", "zeta-fake")
                .env("RUNTIME_TEST_VISIBLE", "not-listed")
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
        assert_eq!(std::env::var("OPENAI_API_KEY").unwrap(), "sk-fake-openai");
        let (_dir, ws) = workspace();
        let result = shell(&ws, json!({"command": "env"})).await.unwrap();
        assert!(result.success);
        let output = &result.output;
        assert!(!output.contains("sk-fake"), "{output}");
        assert!(!output.contains("AGENTD_LLM_API_KEY"), "{output}");
        assert!(!output.contains("OPENAI_API_KEY"), "{output}");
        assert!(!output.contains(PROBE_MARKER), "{output}");
        // Nothing the built environment does not list is inherited, secret-looking or not.
        assert!(!output.contains("zeta-fake"), "{output}");
        assert!(!output.contains("RUNTIME_TEST_VISIBLE"), "{output}");
        assert!(output.lines().any(|l| l.starts_with("PATH=")), "{output}");
        for line in ["NO_COLOR=1", "TERM=dumb", "PAGER=cat", "GIT_PAGER=cat"] {
            assert!(
                output.lines().any(|l| l == line),
                "{line} missing: {output}"
            );
        }
        let root = ws.root().to_string_lossy().into_owned();
        assert!(
            output.lines().any(|l| l == format!("PWD={root}")),
            "{output}"
        );
    }

    #[tokio::test]
    async fn bad_input_is_refused() {
        let (_dir, ws) = workspace();
        for args in [
            json!({"command": ""}),
            json!({"command": "true", "extra": true}),
            json!({"cmd": "true"}),
            json!({"command": "true", "timeout_ms": -5}),
        ] {
            match shell(&ws, args.clone()).await {
                Err(ToolError::Model { kind, .. }) => assert_eq!(kind, "invalid_input", "{args}"),
                other => panic!("{args}: {other:?}"),
            }
        }
    }

    #[test]
    fn shell_is_an_exclusive_runtime_tool() {
        let (_dir, ws) = workspace();
        let tool = Shell::new(ws);
        assert_eq!(tool.meta().name, "shell");
        assert_eq!(tool.meta().tags, ["runtime"]);
        assert_eq!(tool.meta().concurrency, ConcurrencyClass::Exclusive);
        let schema = &tool.meta().input_schema;
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"], json!(["command"]));
        for (name, property) in schema["properties"].as_object().unwrap() {
            assert!(property["description"].is_string(), "{name}");
        }
    }
}
