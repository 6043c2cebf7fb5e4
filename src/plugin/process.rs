//! The process protocol of one plugin call: spawn the program in its own process group, write
//! the arguments to stdin, read stdout and stderr until it exits, times out or is cancelled,
//! then kill the group and report.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::task::AbortOnDropHandle;

use super::PluginTool;
use super::output::{Capture, STDOUT_CAP_BYTES, StderrCapture, Tail};
use crate::builtin::exec::{kill_group, sandboxed_command, signal_name};
use crate::tools::{ToolContext, ToolError, ToolResult};

/// How long output may keep arriving once the program exited (and its group was killed),
/// for a process that left the group but still holds a pipe.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long reaping a killed program may take before giving up on it (tokio reaps it later).
const REAP_WAIT: Duration = Duration::from_secs(5);
/// How long output written before a kill may still be collected.
const KILL_DRAIN: Duration = Duration::from_millis(500);
/// Spawn attempts while the executable is briefly held open for writing by a forked child.
const SPAWN_ATTEMPTS: u32 = 5;

impl PluginTool {
    /// The program to run: a bare name is looked up on `PATH`; a relative path with a `/`
    /// is taken from the workspace root, where the program runs.
    fn program(&self) -> PathBuf {
        let command = Path::new(&self.def.command);
        if command.is_relative() && self.def.command.contains('/') {
            self.workspace.root().join(command)
        } else {
            command.to_path_buf()
        }
    }

    /// The sandboxed command for the program, in its own process group with piped stdio.
    fn command(&self) -> std::io::Result<tokio::process::Command> {
        let root = self.workspace.root();
        let program = self.program();
        let args: Vec<&std::ffi::OsStr> = self.def.args.iter().map(std::ffi::OsStr::new).collect();
        // A program named by path (beside the config file, say) is outside the workspace;
        // the sandbox lets it read and run that one file.
        let own_file: Vec<PathBuf> = program
            .is_absolute()
            .then(|| program.clone())
            .into_iter()
            .collect();
        let mut command =
            sandboxed_command(&self.workspace, program.as_os_str(), &args, root, &own_file)?;
        command
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(command)
    }

    /// Spawns the program, retrying while the executable is busy: a file just written is
    /// briefly held open by any child another thread forked meanwhile (ETXTBSY).
    async fn spawn(&self) -> Result<tokio::process::Child, ToolError> {
        self.workspace.admit_command()?;
        let mut attempt = 1;
        loop {
            match self.command().and_then(|mut command| command.spawn()) {
                Ok(child) => return Ok(child),
                Err(err)
                    if attempt < SPAWN_ATTEMPTS
                        && err.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error()) =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
                Err(err) => {
                    return Err(ToolError::model(
                        "spawn_failed",
                        format!(
                            "plugin {}: could not start `{}`: {err}",
                            self.def.meta.name, self.def.command
                        ),
                    ));
                }
            }
        }
    }

    /// Runs the program once for `args`: stdin in, stdout and stderr collected, the process
    /// group killed however the call ends.
    pub(super) async fn run(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        let name = &self.def.meta.name;
        if ctx.cancel.is_cancelled() {
            return Ok(ToolResult::failure(format!(
                "plugin {name}: cancelled before the program started"
            )));
        }
        let input = serde_json::to_vec(args)
            .map_err(|err| ToolError::Fatal(format!("plugin {name}: arguments: {err}")))?;

        let started = Instant::now();
        let mut child = self.spawn().await?;
        let pgid = child.id().unwrap_or(0);
        let _group = GroupGuard(pgid);
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ToolError::model(
                "spawn_failed",
                format!(
                    "plugin {name}: `{}` started without pipes",
                    self.def.command
                ),
            ));
        };
        // Written on the side: a plugin that writes a lot before reading must not deadlock
        // against us. A plugin that never reads just makes the write fail, which is fine.
        let _writer = AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }));

        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(self.def.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut out = Capture::new(STDOUT_CAP_BYTES);
        let mut err = StderrCapture::new(ctx);
        let mut out_buf = vec![0u8; 16 * 1024];
        let mut err_buf = vec![0u8; 16 * 1024];
        let (mut out_eof, mut err_eof) = (false, false);
        let mut status: Option<io::Result<ExitStatus>> = None;
        let mut drain_deadline = deadline;
        let mut stopped: Option<Ending> = None;

        while stopped.is_none() && !(out_eof && err_eof && status.is_some()) {
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => stopped = Some(Ending::Cancelled),
                () = tokio::time::sleep_until(deadline) => stopped = Some(Ending::TimedOut),
                exited = child.wait(), if status.is_none() => {
                    status = Some(exited);
                    // Background jobs would outlive the call and keep the pipes open.
                    kill_group(pgid);
                    drain_deadline = tokio::time::Instant::now() + DRAIN_GRACE;
                }
                () = tokio::time::sleep_until(drain_deadline), if status.is_some() => {
                    out_eof = true;
                    err_eof = true;
                }
                read = stdout.read(&mut out_buf), if !out_eof => match read {
                    Ok(0) | Err(_) => out_eof = true,
                    Ok(n) => out.push(&out_buf[..n]),
                },
                read = stderr.read(&mut err_buf), if !err_eof => match read {
                    Ok(0) | Err(_) => err_eof = true,
                    Ok(n) => err.push(&err_buf[..n]).await,
                },
            }
        }

        let ending = match stopped {
            Some(ending) => {
                kill_group(pgid);
                let _ = tokio::time::timeout(REAP_WAIT, child.wait()).await;
                // What the killed processes wrote before dying is still in the pipes.
                let drain = async {
                    while !(out_eof && err_eof) {
                        tokio::select! {
                            read = stdout.read(&mut out_buf), if !out_eof => match read {
                                Ok(0) | Err(_) => out_eof = true,
                                Ok(n) => out.push(&out_buf[..n]),
                            },
                            read = stderr.read(&mut err_buf), if !err_eof => match read {
                                Ok(0) | Err(_) => err_eof = true,
                                Ok(n) => err.keep(&err_buf[..n]),
                            },
                        }
                    }
                };
                let _ = tokio::time::timeout(KILL_DRAIN, drain).await;
                ending
            }
            None => Ending::Exited(status.unwrap_or_else(|| Err(io::Error::other("no status")))),
        };
        err.finish().await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(self.report(&ending, duration_ms, &out, &err.tail))
    }

    /// The model's text and the host's metadata for a finished call.
    fn report(
        &self,
        ending: &Ending,
        duration_ms: u64,
        out: &Capture,
        stderr: &Tail,
    ) -> ToolResult {
        let name = &self.def.meta.name;
        let (mut code, mut signal) = (None, None);
        let failure = match ending {
            Ending::Exited(Ok(status)) => {
                code = status.code();
                signal = status.signal();
                match (code, signal) {
                    (Some(0), _) => None,
                    (Some(c), _) => Some(format!("exit code {c}")),
                    (None, Some(s)) => Some(format!("killed by signal {s} ({})", signal_name(s))),
                    (None, None) => Some("exited with an unknown status".to_owned()),
                }
            }
            Ending::Exited(Err(err)) => Some(format!("exit status unknown: {err}")),
            Ending::TimedOut => Some(format!(
                "timed out after {} ms; it and every process it started were killed",
                self.def.timeout.as_millis()
            )),
            Ending::Cancelled => {
                Some("cancelled; it and every process it started were killed".to_owned())
            }
        };
        let mut text = out.render();
        let metadata = json!({
            "exit_code": code,
            "signal": signal,
            "duration_ms": duration_ms,
            "stdout_truncated": out.truncated(),
            "stdout_bytes": out.total,
            "timed_out": matches!(ending, Ending::TimedOut),
            "cancelled": matches!(ending, Ending::Cancelled),
        });
        let Some(failure) = failure else {
            return ToolResult::ok(text).with_metadata(metadata);
        };
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("plugin {name} failed: {failure}\n"));
        let tail = stderr.render();
        if tail.is_empty() {
            text.push_str("stderr: (empty)");
        } else {
            text.push_str("stderr:\n");
            text.push_str(&tail);
        }
        ToolResult::failure(text).with_metadata(metadata)
    }
}

/// Why the program stopped.
enum Ending {
    Exited(io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

/// Kills the program's process group however the call ends, even if its future is dropped
/// (the registry drops a call's future when the turn is interrupted).
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}
