//! What every process-starting tool shares (`shell`, `exec_command`, plugins, hooks, MCP
//! stdio servers, git): workdir resolution, spawning through the workspace's sandbox with the
//! workspace's built environment (never the server's own), one merged output pipe, process-group killing, signal names and the
//! head-and-tail output cap.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::fs_safe;
use crate::tools::{ToolError, Workspace};

/// The directory a command runs in: the workspace root, or `workdir` beneath it.
///
/// The check is lexical plus a no-follow open, so the argument cannot name a place outside
/// the root; it is not a sandbox, since the command itself may `cd` anywhere.
pub(crate) fn resolve_workdir(
    workspace: &Workspace,
    tool: &str,
    workdir: Option<&str>,
) -> Result<PathBuf, ToolError> {
    let root = workspace.root();
    // A session directory swapped for a link elsewhere is refused here, as for the file tools.
    if let Err(err) = workspace.open_root() {
        return Err(ToolError::model(err.kind(), format!("{tool}: {err}")));
    }
    let Some(requested) = workdir.filter(|w| !w.is_empty()) else {
        return Ok(root.to_path_buf());
    };
    // Models often echo back the absolute path of the root; accept it when it lies beneath.
    let requested_path = Path::new(requested);
    let relative = match requested_path.strip_prefix(root) {
        Ok(rest) if requested_path.is_absolute() => rest.to_string_lossy().into_owned(),
        _ => requested.to_owned(),
    };
    let checked = workspace
        .resolve(&relative)
        .and_then(|rel| fs_safe::open_dir_no_follow(root, &rel).map(|_| rel));
    match checked {
        Ok(rel) => Ok(root.join(rel)),
        Err(err) => Err(ToolError::model(
            err.kind(),
            format!("{tool}: workdir: {err}"),
        )),
    }
}

/// A `sh -c` command in `dir` with the workspace's environment, confined by the workspace's
/// sandbox when it has one; the caller picks its stdio.
pub(crate) fn shell_command(
    workspace: &Workspace,
    cmd: &str,
    dir: &Path,
) -> io::Result<tokio::process::Command> {
    sandboxed_command(
        workspace,
        OsStr::new("sh"),
        &[OsStr::new("-c"), OsStr::new(cmd)],
        dir,
        &[],
    )
}

/// `program args` in `dir` with the workspace's environment, through the workspace's sandbox when
/// it has one (`extra_read`: files outside the workspace the program needs, such as itself).
pub(crate) fn sandboxed_command(
    workspace: &Workspace,
    program: &OsStr,
    args: &[&OsStr],
    dir: &Path,
    extra_read: &[PathBuf],
) -> io::Result<tokio::process::Command> {
    sandboxed_command_with_network(workspace, program, args, dir, extra_read, false)
}

/// [`sandboxed_command`], with network for this command when `network` is set.
pub(crate) fn sandboxed_command_with_network(
    workspace: &Workspace,
    program: &OsStr,
    args: &[&OsStr],
    dir: &Path,
    extra_read: &[PathBuf],
    network: bool,
) -> io::Result<tokio::process::Command> {
    let mut command = match workspace.sandbox() {
        Some(sandbox) => {
            let mut command =
                sandbox.command_with_network(program, args, dir, extra_read, network)?;
            // The launcher changes into `dir` itself once confined; it starts in the root.
            command.current_dir(workspace.root());
            command
                .env_clear()
                .envs(workspace.command_env().vars().iter().cloned());
            // The sandbox's TMPDIR and HOME win over the server's.
            sandbox.apply_env(&mut command);
            command
        }
        None => {
            let mut command = tokio::process::Command::new(program);
            command
                .args(args)
                .current_dir(dir)
                .env_clear()
                .envs(workspace.command_env().vars().iter().cloned());
            command
        }
    };
    command.env("PWD", dir).kill_on_drop(true);
    Ok(command)
}

/// Points the command's stdout and stderr at one pipe, so output keeps the order the process
/// wrote it; returns the pipe's read end, to be read after the command is spawned and dropped.
pub(crate) fn merged_output(
    command: &mut tokio::process::Command,
) -> io::Result<tokio::net::unix::pipe::Receiver> {
    let (reader, writer) = io::pipe()?;
    let second_writer = writer.try_clone()?;
    command.stdout(writer).stderr(second_writer);
    tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
}

/// Sends SIGKILL to a whole process group; a group that is already gone is not an error.
pub(crate) fn kill_group(pgid: u32) {
    // Group 0 would be our own and group 1 init's: never targets, whatever went wrong.
    let Some(pid) = i32::try_from(pgid)
        .ok()
        .filter(|p| *p > 1)
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

/// The conventional name of a signal number, for status lines.
pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// Length of a trailing UTF-8 sequence that has not been completed yet.
fn incomplete_suffix_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let needed = match byte {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

/// Keeps the first and last halves of a capped byte stream and counts what fell between.
#[derive(Debug)]
pub(crate) struct HeadTail {
    half: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    /// A capture keeping at most `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            half: cap / 2,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Adds bytes as they arrive.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.half.saturating_sub(self.head.len());
        let into_head = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        if bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.half {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.half..]);
        } else {
            self.tail.extend(bytes);
            let excess = self.tail.len().saturating_sub(self.half);
            self.tail.drain(..excess);
        }
    }

    /// Every byte pushed so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Whether anything was left out.
    pub(crate) fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept text, with a marker line saying how many bytes were left out between the
    /// halves; the cut is moved to character boundaries.
    pub(crate) fn render(&self) -> String {
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let head_end = self.head.len() - incomplete_suffix_len(&self.head);
        let tail_start = tail
            .iter()
            .take(3)
            .take_while(|b| **b & 0xC0 == 0x80)
            .count();
        let kept = (head_end + tail.len() - tail_start) as u64;
        let omitted = self.total - kept;
        let mut out = String::from_utf8_lossy(&self.head[..head_end]).into_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = writeln!(out, "[… {omitted} bytes omitted …]");
        out.push_str(&String::from_utf8_lossy(&tail[tail_start..]));
        out
    }
}

/// `bytes` as text of at most about `max` bytes, keeping its head and tail.
pub(crate) fn truncate_middle(bytes: &[u8], max: usize) -> String {
    let mut capture = HeadTail::new(max);
    capture.push(bytes);
    capture.render()
}

/// Turns a byte stream into text chunks without splitting a UTF-8 sequence between two.
#[derive(Debug, Default)]
pub(crate) struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    /// The text that is complete after adding `bytes`; an unfinished character waits.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let split = self.pending.len() - incomplete_suffix_len(&self.pending);
        let text = String::from_utf8_lossy(&self.pending[..split]).into_owned();
        self.pending.drain(..split);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_tail_keeps_both_ends_on_char_boundaries() {
        let mut capture = HeadTail::new(10);
        capture.push(b"hello");
        assert_eq!(capture.render(), "hello");
        assert!(!capture.truncated());
        for _ in 0..100 {
            capture.push(b"-");
        }
        capture.push("wörld".as_bytes());
        assert_eq!(capture.total(), 111);
        assert_eq!(capture.render(), "hello\n[… 101 bytes omitted …]\nörld");
        assert_eq!(
            truncate_middle("ééééé".as_bytes(), 4),
            "é\n[… 6 bytes omitted …]\né"
        );
        let mut chunks = Utf8Chunks::default();
        let bytes = "aé".as_bytes();
        assert_eq!(chunks.push(&bytes[..2]), "a");
        assert_eq!(chunks.push(&bytes[2..]), "é");
    }
}
