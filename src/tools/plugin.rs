//! Plugin tools: an external program from one `[[plugins]]` entry offered as a tool.
//!
//! A call runs the program directly (no shell) in the workspace root, with the secret-free
//! child environment, in a process group of its own. The call's arguments arrive on stdin as
//! one JSON document followed by EOF; stdout is the result text; stderr is streamed line by
//! line to the session as task output and its tail is kept for the failure message; a
//! non-zero exit makes the result unsuccessful. A timeout or cancellation kills the whole
//! process group, and so does the program's exit: nothing a plugin starts outlives its call.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::task::AbortOnDropHandle;

use crate::config::PluginConfig;
use crate::tools::args::ArgsValidator;
use crate::tools::builtin::exec::{kill_group, sandboxed_command, signal_name};
use crate::tools::{ConcurrencyClass, Tool, ToolContext, ToolError, ToolResult, Workspace};

/// Longest tool name a plugin may have.
pub const MAX_NAME_LEN: usize = 64;
/// stdout kept as the result; what a plugin writes past this is read and dropped.
pub const STDOUT_CAP_BYTES: usize = 4 * 1024 * 1024;
/// The end of stderr kept for the failure message.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// A stderr "line" longer than this is streamed in pieces of this size.
const MAX_LINE_BYTES: usize = 64 * 1024;
/// stderr streamed to the session per call; past it only the kept tail remains.
const STREAM_CAP_BYTES: usize = 1024 * 1024;
/// How long one streamed line may wait for a slow listener before streaming stops.
const STREAM_SEND_WAIT: Duration = Duration::from_millis(100);
/// How long output may keep arriving once the program exited (and its group was killed),
/// for a process that left the group but still holds a pipe.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long reaping a killed program may take before giving up on it (tokio reaps it later).
const REAP_WAIT: Duration = Duration::from_secs(5);
/// How long output written before a kill may still be collected.
const KILL_DRAIN: Duration = Duration::from_millis(500);
/// Spawn attempts while the executable is briefly held open for writing by a forked child.
const SPAWN_ATTEMPTS: u32 = 5;

/// Why a `[[plugins]]` entry cannot become a tool; the message names the plugin and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The name is empty, too long or has characters outside `[a-z0-9_-]`.
    #[error(
        "plugin {name:?}: invalid name: {why} (use 1 to {MAX_NAME_LEN} characters from a-z, 0-9, `_` and `-`)"
    )]
    InvalidName {
        /// The name as configured.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// `description` is blank; the model would not know when to call it.
    #[error("plugin {name}: `description` is empty; say what the plugin does for the model")]
    EmptyDescription {
        /// The plugin's name.
        name: String,
    },
    /// `command` is blank.
    #[error("plugin {name}: `command` is empty; give the program to run")]
    EmptyCommand {
        /// The plugin's name.
        name: String,
    },
    /// `timeout_ms` is 0.
    #[error("plugin {name}: `timeout_ms` must be greater than 0")]
    InvalidTimeout {
        /// The plugin's name.
        name: String,
    },
    /// A tag is blank.
    #[error("plugin {name}: tag {index} is empty")]
    EmptyTag {
        /// The plugin's name.
        name: String,
        /// Its position in `tags`.
        index: usize,
    },
    /// `input_schema` is not a valid JSON Schema for an object.
    #[error("plugin {name}: invalid `input_schema`: {message}")]
    InvalidSchema {
        /// The plugin's name.
        name: String,
        /// What is wrong with the schema.
        message: String,
    },
}

/// The validated, immutable part of a plugin, shared by every workspace binding of it.
#[derive(Debug)]
struct Definition {
    name: String,
    description: String,
    command: String,
    args: Vec<String>,
    spawn_only: bool,
    exclusive: bool,
    timeout: Duration,
    input_schema: Value,
    tags: Arc<[&'static str]>,
}

/// A tool that runs the external program of one `[[plugins]]` entry in its workspace.
#[derive(Debug, Clone)]
pub struct PluginTool {
    def: Arc<Definition>,
    workspace: Arc<Workspace>,
}

/// One shared copy of each distinct tag text, alive for the whole process.
///
/// [`Tool::tags`] returns `&[&str]` borrowed from the tool, so the strings must outlive any
/// one tool value. Leaking each distinct tag text once (and only once, however many times
/// plugins are built or rebound) keeps that sound at a cost bounded by the configured tags;
/// the per-plugin slice itself is an ordinary `Arc` shared by rebinds and freed with them.
fn intern(tag: &str) -> &'static str {
    static TAGS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut tags = TAGS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = tags.get(tag) {
        return known;
    }
    let leaked: &'static str = Box::leak(tag.to_owned().into_boxed_str());
    tags.insert(leaked);
    leaked
}

fn check_name(name: &str) -> Result<(), PluginError> {
    let invalid = |why: String| PluginError::InvalidName {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(format!("it is {} characters long", name.len())));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
    {
        return Err(invalid(format!("{bad:?} is not allowed")));
    }
    Ok(())
}

fn check_schema(name: &str, schema: &Value) -> Result<(), PluginError> {
    let invalid = |message: String| PluginError::InvalidSchema {
        name: name.to_owned(),
        message,
    };
    let Some(object) = schema.as_object() else {
        return Err(invalid(format!("expected a JSON object, found {schema}")));
    };
    if object.get("type") != Some(&json!("object")) {
        return Err(invalid(
            "it must declare \"type\": \"object\" (a call's arguments are one JSON object)".into(),
        ));
    }
    ArgsValidator::compile(schema).map_err(|err| invalid(err.message))?;
    Ok(())
}

impl PluginTool {
    /// Validates one `[[plugins]]` entry and binds it to `workspace`, where its program runs.
    pub fn new(config: &PluginConfig, workspace: Arc<Workspace>) -> Result<Self, PluginError> {
        let name = config.name.clone();
        check_name(&name)?;
        if config.description.trim().is_empty() {
            return Err(PluginError::EmptyDescription { name });
        }
        if config.command.trim().is_empty() {
            return Err(PluginError::EmptyCommand { name });
        }
        if config.timeout_ms == 0 {
            return Err(PluginError::InvalidTimeout { name });
        }
        if let Some(index) = config.tags.iter().position(|t| t.trim().is_empty()) {
            return Err(PluginError::EmptyTag { name, index });
        }
        check_schema(&name, &config.input_schema)?;
        let tags: Arc<[&'static str]> = config.tags.iter().map(|t| intern(t)).collect();
        Ok(Self {
            def: Arc::new(Definition {
                name,
                description: config.description.clone(),
                command: config.command.clone(),
                args: config.args.clone(),
                spawn_only: config.spawn_only,
                exclusive: config.exclusive,
                timeout: Duration::from_millis(config.timeout_ms),
                input_schema: config.input_schema.clone(),
                tags,
            }),
            workspace,
        })
    }

    /// Whether the config asks for calls to run in the background; the host marks the tool
    /// spawn-only in the registry when this is true.
    pub fn spawn_only(&self) -> bool {
        self.def.spawn_only
    }

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
                            self.def.name, self.def.command
                        ),
                    ));
                }
            }
        }
    }

    async fn run(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let name = &self.def.name;
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
        let name = &self.def.name;
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

/// stdout up to a cap; the rest is counted, not kept.
struct Capture {
    cap: usize,
    bytes: Vec<u8>,
    total: u64,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            bytes: Vec::new(),
            total: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    /// The kept text; when cut, at a character boundary and with a line saying so.
    fn render(&self) -> String {
        if !self.truncated() {
            return String::from_utf8_lossy(&self.bytes).into_owned();
        }
        let mut text = String::from_utf8_lossy(complete_prefix(&self.bytes)).into_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[stdout cut at {} bytes; the plugin wrote {} bytes]\n",
            self.cap, self.total
        ));
        text
    }
}

/// The last bytes of a stream.
#[derive(Default)]
struct Tail {
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend(bytes);
        let excess = self.bytes.len().saturating_sub(STDERR_TAIL_BYTES);
        if excess > 0 {
            self.bytes.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// The kept text; when the start was dropped, from the next whole line on, after a line
    /// saying how much is missing.
    fn render(&self) -> String {
        let bytes: Vec<u8> = self.bytes.iter().copied().collect();
        if self.dropped == 0 {
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        // Without a newline to cut at, at least skip the rest of a split character.
        let start = bytes.iter().position(|b| *b == b'\n').map_or_else(
            || {
                bytes
                    .iter()
                    .take(3)
                    .take_while(|b| **b & 0xC0 == 0x80)
                    .count()
            },
            |newline| newline + 1,
        );
        let omitted = self.dropped + start as u64;
        format!(
            "[… {omitted} earlier bytes omitted …]\n{}",
            String::from_utf8_lossy(&bytes[start..])
        )
    }
}

/// stderr: kept as a tail and streamed to the session one line at a time.
struct StderrCapture<'a> {
    ctx: &'a ToolContext,
    tail: Tail,
    pending: Vec<u8>,
    streamed: usize,
    live: bool,
}

impl<'a> StderrCapture<'a> {
    fn new(ctx: &'a ToolContext) -> Self {
        Self {
            ctx,
            tail: Tail::default(),
            pending: Vec::new(),
            streamed: 0,
            live: ctx.events.is_some(),
        }
    }

    /// Keeps bytes for the failure message without streaming them.
    fn keep(&mut self, bytes: &[u8]) {
        self.tail.push(bytes);
    }

    /// Keeps bytes and streams every line they complete.
    async fn push(&mut self, bytes: &[u8]) {
        self.tail.push(bytes);
        if !self.live {
            return;
        }
        self.pending.extend_from_slice(bytes);
        while let Some(newline) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=newline).collect();
            self.send(&line).await;
        }
        if self.pending.len() >= MAX_LINE_BYTES {
            let cut = complete_prefix(&self.pending).len().max(1);
            let piece: Vec<u8> = self.pending.drain(..cut).collect();
            self.send(&piece).await;
        }
    }

    /// Streams a last line that had no newline.
    async fn finish(&mut self) {
        if self.live && !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.send(&rest).await;
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        if !self.live {
            return;
        }
        self.streamed += bytes.len();
        if self.streamed > STREAM_CAP_BYTES {
            self.live = false;
            return;
        }
        let text = String::from_utf8_lossy(bytes).into_owned();
        // A listener that cannot keep up loses the live view, not the result.
        if tokio::time::timeout(STREAM_SEND_WAIT, self.ctx.output(text))
            .await
            .is_err()
        {
            self.live = false;
        }
    }
}

/// `bytes` without a trailing, unfinished UTF-8 sequence.
fn complete_prefix(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Err(err) if err.error_len().is_none() => &bytes[..err.valid_up_to()],
        _ => bytes,
    }
}

#[async_trait]
impl Tool for PluginTool {
    fn name(&self) -> &str {
        &self.def.name
    }

    fn description(&self) -> &str {
        &self.def.description
    }

    fn input_schema(&self) -> Value {
        self.def.input_schema.clone()
    }

    fn tags(&self) -> &[&str] {
        &self.def.tags
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        if self.def.exclusive {
            ConcurrencyClass::Exclusive
        } else {
            ConcurrencyClass::Safe
        }
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(&ToolContext::detached(self.workspace.root()), args)
            .await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.run(ctx, args).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self {
            def: Arc::clone(&self.def),
            workspace: Arc::clone(workspace),
        }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolEvent;
    use crate::tools::process_probe::{gone, wait_gone};
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
        tokio::time::timeout(WAIT, tool.execute(&args))
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
        let result = tokio::time::timeout(WAIT, tool.execute_with_context(&ctx, &json!({})))
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
        let task = tokio::spawn(async move { tool.execute_with_context(&ctx, &json!({})).await });
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
        let task = tokio::spawn(async move { tool.execute_with_context(&ctx, &json!({})).await });
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
                        message
                            .starts_with(&format!("plugin missing: could not start `{command}`")),
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
    async fn the_plugin_gets_the_secret_free_child_environment() {
        if std::env::var_os(PROBE_MARKER).is_none() {
            // Re-run this very test in a child process whose environment holds a fake secret,
            // so this (multi-threaded) process never has to modify its own environment.
            let module = module_path!().split_once("::").unwrap().1;
            let name = format!("{module}::the_plugin_gets_the_secret_free_child_environment");
            let probe = tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([name.as_str(), "--exact", "--test-threads=1"])
                .env(PROBE_MARKER, "1")
                .env("AGENTD_TEST_SECRET_TOKEN", "fake-secret-value")
                .env("PLUGIN_TEST_VISIBLE", "visible")
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
        for line in [
            "PLUGIN_TEST_VISIBLE=visible",
            "NO_COLOR=1",
            "PAGER=cat",
            &format!("PWD={root}"),
        ] {
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
        assert_eq!(tool.name(), "lint-file_2");
        assert_eq!(tool.description(), "Lints one file.");
        assert_eq!(tool.tags(), ["fs", "custom-plugin-tag"]);
        assert_eq!(tool.concurrency_class(), ConcurrencyClass::Safe);
        assert!(tool.spawn_only());
        assert_eq!(tool.input_schema(), schema);

        let plain = fx.plugin(&config("plain", "/bin/true"));
        assert_eq!(plain.tags(), [] as [&str; 0]);
        assert_eq!(plain.concurrency_class(), ConcurrencyClass::Exclusive);
        assert!(!plain.spawn_only());

        // Building the same tags again reuses the interned strings.
        let again = fx.plugin(&linter);
        assert!(std::ptr::eq(tool.tags()[1], again.tags()[1]));

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
        let result = tokio::time::timeout(WAIT, rebound.execute(&json!({})))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            Path::new(result.output.trim()),
            other_dir.path().canonicalize().unwrap()
        );
        let rebound = rebound.as_any().downcast_ref::<PluginTool>().unwrap();
        assert!(Arc::ptr_eq(&rebound.def, &tool.def));
        assert!(std::ptr::eq(rebound.tags(), tool.tags()));
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
}
