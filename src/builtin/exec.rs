//! `exec_command` and `write_stdin`: long-running processes a session starts, talks to and
//! polls, on plain pipes or a real pseudo-terminal, kept in the session's [`ProcessTable`].
//!
//! What every process-starting tool shares (environment, workdir, sandboxed spawning, group
//! kills, the output cap) lives in [`super::process`]; its older paths here are re-exported.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::parse_args;
pub(crate) use super::process::{kill_group, sandboxed_command, signal_name};
use super::process::{merged_output, resolve_workdir, shell_command, truncate_middle};
use crate::mutex::lock;
use crate::tools::{
    CallSubject, Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace,
};

const EXEC_NAME: &str = "exec_command";
const WRITE_NAME: &str = "write_stdin";

/// Live processes a session may hold unless configured otherwise.
pub const DEFAULT_MAX_PROCESSES: usize = 64;
/// Unread output kept per process; older bytes are dropped (and counted) past this.
pub const OUTPUT_BUFFER_BYTES: usize = 1024 * 1024;

const MIN_YIELD_MS: u64 = 250;
const MAX_YIELD_MS: u64 = 30_000;
const EXEC_DEFAULT_YIELD_MS: u64 = 10_000;
const WRITE_DEFAULT_YIELD_MS: u64 = 250;
const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 10_000;
/// A token is counted as this many bytes, for budgets and `original_token_count`.
const BYTES_PER_TOKEN: usize = 4;
/// How long output may keep arriving after the main process exits before the exit is
/// reported anyway (something that left the process group may hold the pipe open).
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long `shutdown` waits for killed processes to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);
const PTY_ROWS: u16 = 40;
const PTY_COLS: u16 = 120;

/// How one process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ExitInfo {
    code: Option<i32>,
    signal: Option<i32>,
}

impl ExitInfo {
    fn from_wait(status: io::Result<ExitStatus>) -> Self {
        match status {
            Ok(status) => Self {
                code: status.code(),
                signal: status.signal(),
            },
            Err(_) => Self {
                code: None,
                signal: None,
            },
        }
    }

    /// The shell's convention: the exit code, or 128 + the signal that killed it.
    fn exit_code(self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => -1,
        }
    }
}

/// Unread output of one process, bounded; the oldest bytes give way.
#[derive(Debug, Default)]
struct OutputRing {
    buf: VecDeque<u8>,
    dropped: u64,
}

impl OutputRing {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let excess = self.buf.len().saturating_sub(OUTPUT_BUFFER_BYTES);
        if excess > 0 {
            self.buf.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    fn take(&mut self) -> (Vec<u8>, u64) {
        let bytes = self.buf.drain(..).collect();
        (bytes, std::mem::take(&mut self.dropped))
    }
}

type Input = Box<dyn AsyncWrite + Send + Unpin>;
type Output = Box<dyn AsyncRead + Send + Unpin>;

/// One process started by `exec_command`.
struct Process {
    id: u64,
    /// Its process group (the leader's pid), which every kill targets.
    pgid: u32,
    command: String,
    input: tokio::sync::Mutex<Option<Input>>,
    output: Mutex<OutputRing>,
    /// Set once the process has exited and its output has been collected.
    exit: watch::Sender<Option<ExitInfo>>,
    /// Set as soon as the leader is reaped: its pid, and so the group id, may then be reused
    /// by an unrelated process, which a later kill must not hit.
    reaped: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("id", &self.id)
            .field("pgid", &self.pgid)
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

impl Process {
    /// Spawns `cmd` and the tasks that collect its output and reap it.
    fn spawn(
        workspace: &Workspace,
        id: u64,
        cmd: &str,
        dir: &Path,
        tty: bool,
    ) -> Result<Arc<Self>, ToolError> {
        let spawn_failed = |err: &dyn std::fmt::Display| {
            ToolError::model(
                "spawn_failed",
                format!("{EXEC_NAME}: could not start `sh -c`: {err}"),
            )
        };
        workspace.admit_command()?;
        let mut command = shell_command(workspace, cmd, dir).map_err(|e| spawn_failed(&e))?;
        let (mut child, reader, writer): (tokio::process::Child, Output, Input) = if tty {
            let (pty, pts) = pty_process::open().map_err(|e| spawn_failed(&e))?;
            // A zero-sized terminal confuses programs that lay out their output.
            let _ = pty.resize(pty_process::Size::new(PTY_ROWS, PTY_COLS));
            // pty-process makes the child a session leader (setsid), which also makes it the
            // leader of a new process group, so process_group(0) must not be set here.
            let child = pty_process::Command::from(command)
                .spawn(pts)
                .map_err(|e| spawn_failed(&e))?;
            let (read_half, write_half) = pty.into_split();
            (child, Box::new(read_half), Box::new(write_half))
        } else {
            command.process_group(0).stdin(Stdio::piped());
            let reader = merged_output(&mut command).map_err(|e| spawn_failed(&e))?;
            let mut child = command.spawn().map_err(|e| spawn_failed(&e))?;
            // The command still holds the pipe's write ends; EOF comes only once it is gone.
            drop(command);
            let Some(stdin) = child.stdin.take() else {
                return Err(spawn_failed(&"no stdin pipe"));
            };
            (child, Box::new(reader), Box::new(stdin))
        };
        let Some(pgid) = child.id() else {
            return Err(spawn_failed(&"the process vanished at once"));
        };
        let process = Arc::new(Self {
            id,
            pgid,
            command: cmd.to_owned(),
            input: tokio::sync::Mutex::new(Some(writer)),
            output: Mutex::new(OutputRing::default()),
            exit: watch::Sender::new(None),
            reaped: std::sync::atomic::AtomicBool::new(false),
        });
        let (read_done_tx, read_done_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(Self::collect_output(
            Arc::clone(&process),
            reader,
            read_done_tx,
        ));
        let waiter = Arc::clone(&process);
        tokio::spawn(async move {
            let status = child.wait().await;
            waiter
                .reaped
                .store(true, std::sync::atomic::Ordering::SeqCst);
            // Jobs the command left in the background would outlive it as orphans. Right
            // after the reap the id is still theirs (Linux hands out pids in sequence).
            kill_group(waiter.pgid);
            let _ = tokio::time::timeout(DRAIN_GRACE, read_done_rx).await;
            waiter.exit.send_replace(Some(ExitInfo::from_wait(status)));
        });
        Ok(process)
    }

    async fn collect_output(
        process: Arc<Self>,
        mut reader: Output,
        done: tokio::sync::oneshot::Sender<()>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            // A pty reports EIO once the terminal's last user is gone: that is its EOF.
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => lock(&process.output).push(&buf[..n]),
            }
        }
        let _ = done.send(());
    }

    fn exited(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    fn take_output(&self) -> (Vec<u8>, u64) {
        lock(&self.output).take()
    }

    async fn write_input(&self, bytes: &[u8]) -> io::Result<()> {
        let mut input = self.input.lock().await;
        let Some(writer) = input.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the process's input is closed",
            ));
        };
        let written = async {
            writer.write_all(bytes).await?;
            writer.flush().await
        }
        .await;
        if written.is_err() {
            *input = None;
        }
        written
    }

    /// Waits until the process has exited, `deadline` passes or `cancel` fires.
    async fn wait(&self, deadline: Instant, cancel: &CancellationToken) {
        let mut exit = self.exit.subscribe();
        tokio::select! {
            _ = exit.wait_for(Option::is_some) => {}
            _ = tokio::time::sleep_until(deadline.into()) => {}
            _ = cancel.cancelled() => {}
        }
    }

    /// The command shortened for listings.
    fn label(&self) -> String {
        let mut label: String = self.command.chars().take(60).collect();
        if label.len() < self.command.len() {
            label.push('…');
        }
        format!("{} (`{label}`)", self.id)
    }
}

#[derive(Debug)]
struct TableInner {
    max: usize,
    next_id: u64,
    processes: BTreeMap<u64, Arc<Process>>,
}

/// The processes one session started with `exec_command`, by session id. Shared by the
/// workspace's tools through [`Workspace::shared`]; dropping it kills every process group.
#[derive(Debug)]
pub struct ProcessTable {
    inner: Mutex<TableInner>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self::with_max(DEFAULT_MAX_PROCESSES)
    }
}

/// Stopping a session's work ends its processes.
impl crate::tools::workspace::SharedState for ProcessTable {
    fn stop_work(&self) {
        self.kill_all();
    }
}

impl ProcessTable {
    /// A table allowing at most `max` processes at once.
    pub fn with_max(max: usize) -> Self {
        Self {
            inner: Mutex::new(TableInner {
                max,
                next_id: 1,
                processes: BTreeMap::new(),
            }),
        }
    }

    /// Changes the limit; processes already running are kept.
    pub fn set_max(&self, max: usize) {
        lock(&self.inner).max = max;
    }

    /// The limit on processes held at once.
    pub fn max(&self) -> usize {
        lock(&self.inner).max
    }

    /// Processes held: running ones and exited ones whose exit was not reported yet.
    pub fn len(&self) -> usize {
        lock(&self.inner).processes.len()
    }

    /// Whether no process is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session ids of the processes held, ascending.
    pub fn session_ids(&self) -> Vec<u64> {
        lock(&self.inner).processes.keys().copied().collect()
    }

    /// Kills every process group and forgets the processes; each is reaped by its own
    /// waiter task moments later. Returns how many there were.
    pub fn kill_all(&self) -> usize {
        self.take_all_killed().len()
    }

    /// Kills every process group and waits (a few seconds at most) until each is reaped.
    pub async fn shutdown(&self) {
        let killed = self.take_all_killed();
        let waits = killed.iter().map(|process| {
            let mut exit = process.exit.subscribe();
            async move {
                let _ = tokio::time::timeout(REAP_WAIT, exit.wait_for(Option::is_some)).await;
            }
        });
        for wait in waits {
            wait.await;
        }
    }

    fn take_all_killed(&self) -> Vec<Arc<Process>> {
        let processes = std::mem::take(&mut lock(&self.inner).processes);
        let processes: Vec<Arc<Process>> = processes.into_values().collect();
        for process in &processes {
            // A reaped leader's group was killed by its waiter; its id may be someone else's now.
            if !process.reaped.load(std::sync::atomic::Ordering::SeqCst) {
                kill_group(process.pgid);
            }
        }
        processes
    }

    /// Starts a process if the limit allows; the check and the insertion are one step.
    fn start(
        &self,
        workspace: &Workspace,
        cmd: &str,
        dir: &Path,
        tty: bool,
    ) -> Result<Arc<Process>, ToolError> {
        let mut inner = lock(&self.inner);
        if inner.processes.len() >= inner.max {
            let held: Vec<String> = inner.processes.values().map(|p| p.label()).collect();
            return Err(ToolError::model(
                "limit_reached",
                format!(
                    "{EXEC_NAME}: this session already holds {} processes, the limit is {}; \
                     finish one first (end or quit it through write_stdin, Ctrl-C \"\\u0003\" \
                     works for tty processes; an exited one is released once write_stdin \
                     reports its exit code). Held session ids: {}",
                    inner.processes.len(),
                    inner.max,
                    held.join(", ")
                ),
            ));
        }
        let id = inner.next_id;
        let process = Process::spawn(workspace, id, cmd, dir, tty)?;
        inner.next_id += 1;
        inner.processes.insert(id, Arc::clone(&process));
        Ok(process)
    }

    fn get(&self, id: u64) -> Option<Arc<Process>> {
        lock(&self.inner).processes.get(&id).cloned()
    }

    fn remove(&self, id: u64) {
        lock(&self.inner).processes.remove(&id);
    }

    /// A sentence naming the processes held, for "unknown session" answers.
    fn describe(&self) -> String {
        let inner = lock(&self.inner);
        if inner.processes.is_empty() {
            return "no processes are held by this session".to_owned();
        }
        let held: Vec<String> = inner.processes.values().map(|p| p.label()).collect();
        format!("known session ids: {}", held.join(", "))
    }

    /// The JSON answer of both tools: output since the last read, and the exit once there is
    /// one (which also releases the process from the table).
    fn report(
        &self,
        process: &Process,
        started: Instant,
        max_bytes: usize,
        stdin_error: Option<String>,
    ) -> ToolResult {
        // The exit is published only after all output was collected, so reading it first
        // guarantees the output taken next is complete.
        let exit = process.exited();
        let (bytes, dropped) = process.take_output();
        let mut output = String::new();
        if dropped > 0 {
            let _ = writeln!(
                output,
                "[… {dropped} earlier bytes dropped: more than {OUTPUT_BUFFER_BYTES} bytes \
                 arrived between two reads …]"
            );
        }
        output.push_str(&truncate_middle(&bytes, max_bytes));
        let original_bytes = dropped + bytes.len() as u64;
        let mut answer = Map::new();
        if exit.is_none() {
            answer.insert("session_id".into(), json!(process.id));
        }
        answer.insert("output".into(), json!(output));
        if let Some(exit) = exit {
            answer.insert("exit_code".into(), json!(exit.exit_code()));
            if let Some(signal) = exit.signal {
                answer.insert("signal".into(), json!(signal_name(signal)));
            }
            self.remove(process.id);
        }
        let wall = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        answer.insert("wall_time_seconds".into(), json!(wall));
        answer.insert(
            "original_token_count".into(),
            json!(original_bytes.div_ceil(BYTES_PER_TOKEN as u64)),
        );
        if let Some(err) = stdin_error {
            answer.insert("stdin_error".into(), json!(err));
        }
        let answer = Value::Object(answer);
        let text = answer.to_string();
        let failed = exit.is_some_and(|e| e.exit_code() != 0);
        let result = if failed {
            ToolResult::failure(text)
        } else {
            ToolResult::ok(text)
        };
        result.with_metadata(answer)
    }
}

impl Drop for ProcessTable {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn yield_duration(requested: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(
        requested
            .unwrap_or(default)
            .clamp(MIN_YIELD_MS, MAX_YIELD_MS),
    )
}

fn output_budget(max_output_tokens: Option<u64>) -> usize {
    let max_tokens = (OUTPUT_BUFFER_BYTES / BYTES_PER_TOKEN) as u64;
    let tokens = max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS)
        .clamp(1, max_tokens);
    tokens as usize * BYTES_PER_TOKEN
}

/// `exec_command`: starts a process the session can talk to and poll.
#[derive(Debug, Clone)]
pub struct ExecCommand {
    workspace: Arc<Workspace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    cmd: String,
    workdir: Option<String>,
    #[serde(default)]
    tty: bool,
    yield_time_ms: Option<u64>,
    max_output_tokens: Option<u64>,
    #[serde(default)]
    run_in_background: bool,
}

impl ExecCommand {
    /// The tool bound to `workspace`, whose [`ProcessTable`] holds its processes.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    async fn run(&self, cancel: &CancellationToken, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ExecArgs = parse_args(EXEC_NAME, args)?;
        if args.cmd.trim().is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                format!("{EXEC_NAME}: `cmd` is empty; give the command line to run"),
            ));
        }
        if args.run_in_background {
            return Err(ToolError::model(
                "invalid_input",
                format!(
                    "{EXEC_NAME}: tty and run_in_background do not go together; nobody can type \
                     into a background task"
                ),
            ));
        }
        let dir = resolve_workdir(&self.workspace, EXEC_NAME, args.workdir.as_deref())?;
        let wait = yield_duration(args.yield_time_ms, EXEC_DEFAULT_YIELD_MS);
        let max_bytes = output_budget(args.max_output_tokens);
        let table = self.workspace.shared::<ProcessTable>();
        let started = Instant::now();
        let process = table.start(&self.workspace, &args.cmd, &dir, args.tty)?;
        tracing::debug!(
            session_id = process.id,
            pgid = process.pgid,
            tty = args.tty,
            "exec_command started"
        );
        process.wait(started + wait, cancel).await;
        Ok(table.report(&process, started, max_bytes, None))
    }
}

#[async_trait]
impl Tool for ExecCommand {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                EXEC_NAME,
                "Start a command (run with `sh -c` in the workspace) as a process you can keep \
                 talking to: interactive programs, REPLs, servers, watchers, anything slow. For a \
                 quick one-shot command prefer `shell`. Waits up to yield_time_ms for output \
                 (returns early if the process exits) and answers JSON {session_id, output, \
                 exit_code, wall_time_seconds, original_token_count}. While the process runs, \
                 `session_id` is set and `exit_code` absent: pass the id to write_stdin to type \
                 input or, with empty chars, to collect more output. Once it has exited, \
                 `exit_code` is set and `session_id` is gone. stdout and stderr are merged. \
                 Background jobs (`&`) are killed when the command exits, so run servers in the \
                 foreground. A session holds at most 64 processes by default.",
                json!({
                    "type": "object",
                    "description": "Start a long-running or interactive process.",
                    "properties": {
                        "cmd": {
                            "type": "string",
                            "description": "The command line, run with `sh -c`, e.g. \"python3 -i\" or \"npm run dev\"."
                        },
                        "workdir": {
                            "type": "string",
                            "description": "Directory to run in, relative to the workspace root (default: the root). It must exist inside the workspace and not pass through a symlink."
                        },
                        "tty": {
                            "type": "boolean",
                            "description": "true to attach a real pseudo-terminal, for programs that need one (REPLs, prompts, curses tools); your input is then echoed back and lines end in \\r\\n. Default false: plain pipes."
                        },
                        "yield_time_ms": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "How long to wait for output before answering, in milliseconds; 250 to 30000, default 10000. The answer comes sooner if the process exits."
                        },
                        "max_output_tokens": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Most output to return, in tokens of about 4 bytes (default 10000); longer output keeps its beginning and end and says how much was left out."
                        },
                        "run_in_background": {
                            "type": "boolean",
                            "description": "true to run the command to completion as a background task (no tty, no write_stdin): the answer is a task_handle at once, the output is read with read_task_output. Default false."
                        }
                    },
                    "required": ["cmd"],
                    "additionalProperties": false
                }),
                Effects::RUNS_COMMANDS,
            )
            .subject(CallSubject::CommandLine("cmd"))
            .groups(&["runtime", "delegated"])
            .contract()
            .tags(&["runtime"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        if self.runs_in_background(args) {
            return self.run_to_completion(ctx, args).await;
        }
        self.run(&ctx.cancel, args).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn runs_in_background(&self, args: &Value) -> bool {
        // With a tty the call is refused in the foreground, where the model hears why.
        crate::tools::asks_background(args)
            && args.get("tty").and_then(Value::as_bool) != Some(true)
    }
}

impl ExecCommand {
    /// The background form: nobody can type into a task, so the command runs to completion
    /// as `shell` runs it, its output streamed into the task's log.
    async fn run_to_completion(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        let args: ExecArgs = parse_args(EXEC_NAME, args)?;
        let mut shell_args =
            serde_json::json!({"command": args.cmd, "run_in_background": args.run_in_background});
        if let Some(workdir) = args.workdir {
            shell_args["workdir"] = Value::String(workdir);
        }
        super::shell::Shell::new(Arc::clone(&self.workspace))
            .call(ctx, &shell_args)
            .await
    }
}

/// `write_stdin`: types into a process started by `exec_command` and collects its output.
#[derive(Debug, Clone)]
pub struct WriteStdin {
    workspace: Arc<Workspace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    session_id: u64,
    chars: Option<String>,
    yield_time_ms: Option<u64>,
    max_output_tokens: Option<u64>,
}

impl WriteStdin {
    /// The tool bound to `workspace`, whose [`ProcessTable`] it looks processes up in.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    async fn run(&self, cancel: &CancellationToken, args: &Value) -> Result<ToolResult, ToolError> {
        let args: WriteArgs = parse_args(WRITE_NAME, args)?;
        let wait = yield_duration(args.yield_time_ms, WRITE_DEFAULT_YIELD_MS);
        let max_bytes = output_budget(args.max_output_tokens);
        let table = self.workspace.shared::<ProcessTable>();
        let Some(process) = table.get(args.session_id) else {
            return Err(ToolError::model(
                "not_found",
                format!(
                    "{WRITE_NAME}: no process has session_id {}; {}. A process is forgotten \
                     once its exit code has been reported.",
                    args.session_id,
                    table.describe()
                ),
            ));
        };
        let started = Instant::now();
        let deadline = started + wait;
        let mut stdin_error = None;
        if let Some(chars) = args.chars.filter(|c| !c.is_empty()) {
            let write =
                tokio::time::timeout_at(deadline.into(), process.write_input(chars.as_bytes()));
            stdin_error = tokio::select! {
                written = write => match written {
                    Ok(Ok(())) => None,
                    Ok(Err(err)) => Some(format!("the characters could not be written: {err}")),
                    Err(_) => Some(
                        "timed out writing the characters: the process is not reading its input"
                            .to_owned(),
                    ),
                },
                _ = cancel.cancelled() => {
                    Some("cancelled while writing the characters".to_owned())
                }
            };
        }
        process.wait(deadline, cancel).await;
        Ok(table.report(&process, started, max_bytes, stdin_error))
    }
}

#[async_trait]
impl Tool for WriteStdin {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                WRITE_NAME,
                "Send characters to a process started by exec_command and return the output it \
                 produced since the last read. Include \"\\n\" to press Enter; with tty processes \
                 \"\\u0003\" is Ctrl-C and \"\\u0004\" Ctrl-D. Leave chars empty to just wait and \
                 poll for more output. Waits yield_time_ms (default 250) unless the process exits \
                 first, and answers the same JSON as exec_command: exit_code is set and session_id \
                 gone once it has exited, after which the session id is no longer valid.",
                json!({
                    "type": "object",
                    "description": "Type into, or poll, a process started by exec_command.",
                    "properties": {
                        "session_id": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "The session_id exec_command returned for the process."
                        },
                        "chars": {
                            "type": "string",
                            "description": "Characters to write to the process's input, e.g. \"yes\\n\". Empty or omitted: write nothing, only collect output."
                        },
                        "yield_time_ms": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "How long to wait for output after writing, in milliseconds; 250 to 30000, default 250. The answer comes sooner if the process exits."
                        },
                        "max_output_tokens": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Most output to return, in tokens of about 4 bytes (default 10000); longer output keeps its beginning and end and says how much was left out."
                        }
                    },
                    "required": ["session_id"],
                    "additionalProperties": false
                }),
                Effects::RUNS_COMMANDS,
            )
            .subject(CallSubject::TypedInput("chars"))
            .groups(&["runtime", "delegated"])
            .contract()
            .tags(&["runtime"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(&ctx.cancel, args).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ConcurrencyClass;
    use crate::tools::process_probe::{gone, pids_in, wait_gone};

    const WAIT: Duration = Duration::from_secs(20);

    fn workspace() -> (tempfile::TempDir, Arc<Workspace>) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path());
        (dir, ws)
    }

    async fn exec(ws: &Arc<Workspace>, args: Value) -> Result<ToolResult, ToolError> {
        let tool = ExecCommand::new(Arc::clone(ws));
        tokio::time::timeout(WAIT, tool.call(&ToolContext::detached("."), &args))
            .await
            .expect("exec_command answers within its yield time")
    }

    async fn write(ws: &Arc<Workspace>, args: Value) -> Result<ToolResult, ToolError> {
        let tool = WriteStdin::new(Arc::clone(ws));
        tokio::time::timeout(WAIT, tool.call(&ToolContext::detached("."), &args))
            .await
            .expect("write_stdin answers within its yield time")
    }

    fn answer(result: &ToolResult) -> Value {
        let parsed: Value = serde_json::from_str(&result.output).unwrap();
        assert_eq!(Some(&parsed), result.structured_metadata.as_ref());
        parsed
    }

    /// Starting from an answer, polls with empty input until `done` holds for the collected
    /// output or the process exits; returns everything collected and the last answer.
    async fn poll_until(
        ws: &Arc<Workspace>,
        first: &Value,
        done: impl Fn(&str) -> bool,
    ) -> (String, Value) {
        let mut collected = first["output"].as_str().unwrap().to_owned();
        let mut last = first.clone();
        for _ in 0..40 {
            if done(&collected) || last.get("exit_code").is_some() {
                return (collected, last);
            }
            let id = last["session_id"].as_u64().unwrap();
            let result = write(ws, json!({"session_id": id, "yield_time_ms": 500}))
                .await
                .unwrap();
            last = answer(&result);
            collected.push_str(last["output"].as_str().unwrap());
        }
        panic!("the process never produced the expected output; got {collected:?}");
    }

    #[tokio::test]
    async fn interactive_program_over_pipes() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({"cmd": "echo ready; read line; echo got:$line", "yield_time_ms": 250}),
        )
        .await
        .unwrap();
        let first = answer(&result);
        assert!(result.success);
        let id = first["session_id"].as_u64().expect("still running");
        assert!(first.get("exit_code").is_none());
        let (seen, _) = poll_until(&ws, &first, |o| o.contains("ready")).await;
        assert_eq!(seen, "ready\n");

        // Nothing new to read while it waits for input.
        let polled = answer(&write(&ws, json!({"session_id": id})).await.unwrap());
        assert_eq!(polled["output"], "");
        assert_eq!(polled["session_id"], id);

        let result = write(
            &ws,
            json!({"session_id": id, "chars": "hello\n", "yield_time_ms": 10_000}),
        )
        .await
        .unwrap();
        let done = answer(&result);
        assert!(result.success);
        assert_eq!(done["output"], "got:hello\n");
        assert_eq!(done["exit_code"], 0);
        assert!(done.get("session_id").is_none());
        assert!(done["wall_time_seconds"].as_f64().unwrap() < 10.0);
        assert_eq!(done["original_token_count"], 3);
        assert!(ws.shared::<ProcessTable>().is_empty());
    }

    #[tokio::test]
    async fn tty_process_sees_a_terminal_and_echoes() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({"cmd": "test -t 0 && echo is-a-tty; exec cat", "tty": true, "yield_time_ms": 250}),
        )
        .await
        .unwrap();
        let first = answer(&result);
        let id = first["session_id"].as_u64().expect("cat keeps running");
        let (seen, _) = poll_until(&ws, &first, |o| o.contains("is-a-tty")).await;
        assert!(seen.contains("is-a-tty\r\n"), "{seen:?}");

        let typed = answer(
            &write(
                &ws,
                json!({"session_id": id, "chars": "ping\n", "yield_time_ms": 500}),
            )
            .await
            .unwrap(),
        );
        // The terminal echoes the line, then cat prints it back.
        let (seen, _) = poll_until(&ws, &typed, |o| o.matches("ping").count() >= 2).await;
        assert_eq!(seen.matches("ping\r\n").count(), 2, "{seen:?}");

        // Ctrl-D at the start of a line is end of input for cat.
        let eof = answer(
            &write(
                &ws,
                json!({"session_id": id, "chars": "\u{4}", "yield_time_ms": 500}),
            )
            .await
            .unwrap(),
        );
        let (_, last) = poll_until(&ws, &eof, |_| false).await;
        assert_eq!(last["exit_code"], 0);
        assert!(ws.shared::<ProcessTable>().is_empty());
    }

    #[tokio::test]
    async fn polling_with_empty_chars_until_exit_reports_the_code() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({"cmd": "sleep 1; echo done; exit 3", "yield_time_ms": 250}),
        )
        .await
        .unwrap();
        let first = answer(&result);
        let id = first["session_id"].as_u64().expect("sleeps past the yield");
        let (seen, last) = poll_until(&ws, &first, |_| false).await;
        assert_eq!(seen, "done\n");
        assert_eq!(last["exit_code"], 3);
        assert!(last.get("session_id").is_none());
        // The exit was reported: the id is released.
        let err = write(&ws, json!({"session_id": id})).await.unwrap_err();
        assert!(matches!(
            err,
            ToolError::Model {
                kind: "not_found",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn quick_exit_returns_early_with_the_code() {
        let (_dir, ws) = workspace();
        std::fs::create_dir(ws.root().join("sub")).unwrap();
        let started = Instant::now();
        let result = exec(
            &ws,
            json!({"cmd": "pwd; echo oops >&2; exit 2", "workdir": "sub", "yield_time_ms": 30_000}),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(15));
        let value = answer(&result);
        assert!(!result.success);
        assert_eq!(value["exit_code"], 2);
        let output = value["output"].as_str().unwrap();
        assert!(output.ends_with("/sub\noops\n"), "{output:?}");
    }

    #[tokio::test]
    async fn output_is_truncated_to_the_token_budget() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({
                "cmd": "echo START; head -c 10000 /dev/zero | tr '\\0' x; echo; echo END",
                "yield_time_ms": 30_000,
                "max_output_tokens": 25
            }),
        )
        .await
        .unwrap();
        let value = answer(&result);
        let output = value["output"].as_str().unwrap();
        assert!(output.starts_with("START\n"), "{output:?}");
        assert!(output.ends_with("\nEND\n"), "{output:?}");
        assert!(output.contains(" bytes omitted …]"), "{output:?}");
        assert!(output.len() < 200, "{output:?}");
        assert_eq!(
            value["original_token_count"],
            (6 + 10_000 + 1 + 4_u64).div_ceil(4)
        );
    }

    #[tokio::test]
    async fn stopping_the_workspaces_work_kills_every_process_group() {
        let (_dir, ws) = workspace();
        let mut pids = Vec::new();
        for _ in 0..2 {
            let result = exec(
                &ws,
                json!({"cmd": "echo pid:$$; sleep 100 & echo pid:$!; wait", "yield_time_ms": 250}),
            )
            .await
            .unwrap();
            let first = answer(&result);
            assert!(first["session_id"].is_u64(), "{first}");
            let (seen, _) = poll_until(&ws, &first, |o| pids_in(o).len() == 2).await;
            pids.extend(pids_in(&seen));
        }
        let table = ws.shared::<ProcessTable>();
        assert_eq!(table.len(), 2);
        assert!(pids.iter().all(|pid| !gone(*pid)));
        // What the session does on an interrupt or a close.
        ws.stop_work();
        assert!(table.is_empty());
        for pid in pids {
            wait_gone(pid).await;
        }
    }

    #[tokio::test]
    async fn shutdown_waits_until_processes_are_reaped() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({"cmd": "echo pid:$$; exec sleep 100", "yield_time_ms": 250}),
        )
        .await
        .unwrap();
        let first = answer(&result);
        assert!(first["session_id"].is_u64(), "{first}");
        let (seen, _) = poll_until(&ws, &first, |o| !pids_in(o).is_empty()).await;
        let pid = pids_in(&seen)[0];
        let table = ws.shared::<ProcessTable>();
        tokio::time::timeout(WAIT, table.shutdown()).await.unwrap();
        assert!(table.is_empty());
        // We are its parent and it was reaped: no zombie is left either.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[tokio::test]
    async fn dropping_the_table_kills_its_processes() {
        let (_dir, ws) = workspace();
        let result = exec(
            &ws,
            json!({"cmd": "echo pid:$$; sleep 100 & echo pid:$!; wait", "tty": true, "yield_time_ms": 250}),
        )
        .await
        .unwrap();
        let first = answer(&result);
        assert!(first["session_id"].is_u64(), "{first}");
        let (seen, _) = poll_until(&ws, &first, |o| pids_in(o).len() == 2).await;
        let pids = pids_in(&seen);
        assert!(pids.iter().all(|pid| !gone(*pid)));
        // The workspace owns the table; the tools hold the workspace.
        drop(ws);
        for pid in pids {
            wait_gone(pid).await;
        }
    }

    #[tokio::test]
    async fn process_cap_refuses_the_next_one() {
        let (_dir, ws) = workspace();
        let table = ws.shared::<ProcessTable>();
        table.set_max(2);
        for _ in 0..2 {
            let result = exec(&ws, json!({"cmd": "sleep 100", "yield_time_ms": 250}))
                .await
                .unwrap();
            assert!(answer(&result)["session_id"].is_u64());
        }
        let err = exec(&ws, json!({"cmd": "sleep 100", "yield_time_ms": 250}))
            .await
            .unwrap_err();
        match err {
            ToolError::Model { kind, message } => {
                assert_eq!(kind, "limit_reached");
                assert!(message.contains("the limit is 2"), "{message}");
                assert!(
                    message.contains("1 (`sleep 100`), 2 (`sleep 100`)"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(table.len(), 2);
        table.kill_all();
        let result = exec(&ws, json!({"cmd": "true", "yield_time_ms": 5_000}))
            .await
            .unwrap();
        assert_eq!(answer(&result)["exit_code"], 0);
    }

    #[test]
    fn default_cap_is_64() {
        assert_eq!(ProcessTable::default().max(), 64);
        assert_eq!(ProcessTable::with_max(3).max(), 3);
    }

    #[tokio::test]
    async fn unknown_session_id_names_the_known_ones() {
        let (_dir, ws) = workspace();
        let err = write(&ws, json!({"session_id": 7, "chars": "x"}))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("no processes are held"), "{message}");
        let result = exec(&ws, json!({"cmd": "sleep 100", "yield_time_ms": 250}))
            .await
            .unwrap();
        let id = answer(&result)["session_id"].as_u64().unwrap();
        match write(&ws, json!({"session_id": 99})).await.unwrap_err() {
            ToolError::Model { kind, message } => {
                assert_eq!(kind, "not_found");
                assert!(message.contains("session_id 99"), "{message}");
                assert!(
                    message.contains(&format!("known session ids: {id} (`sleep 100`)")),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        ws.shared::<ProcessTable>().kill_all();
    }

    #[tokio::test]
    async fn bad_input_is_refused() {
        let (_dir, ws) = workspace();
        for (args, kind) in [
            (json!({"cmd": "  "}), "invalid_input"),
            (json!({"cmd": "true", "bogus": 1}), "invalid_input"),
            (json!({"cmd": "true", "workdir": "../"}), "escapes_root"),
            (json!({"cmd": "true", "workdir": "missing"}), "not_found"),
        ] {
            match exec(&ws, args).await.unwrap_err() {
                ToolError::Model { kind: got, .. } => assert_eq!(got, kind),
                other => panic!("{other:?}"),
            }
        }
        assert!(ws.shared::<ProcessTable>().is_empty());
    }

    #[test]
    fn tools_are_exclusive_runtime_tools_with_strict_schemas() {
        let (_dir, ws) = workspace();
        let tools: [Arc<dyn Tool>; 2] = [
            Arc::new(ExecCommand::new(Arc::clone(&ws))),
            Arc::new(WriteStdin::new(Arc::clone(&ws))),
        ];
        for tool in tools {
            assert_eq!(tool.tags(), ["runtime"]);
            assert_eq!(tool.concurrency_class(), ConcurrencyClass::Exclusive);
            let schema = tool.input_schema();
            assert_eq!(schema["additionalProperties"], false);
            for (name, property) in schema["properties"].as_object().unwrap() {
                assert!(property["description"].is_string(), "{name}");
            }
            let other = Workspace::new("/tmp");
            assert!(tool.rebind_cwd(&other).is_some());
        }
    }
}
