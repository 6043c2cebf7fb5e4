//! Test probes for whether a process still runs, shared by the tests of every tool that starts
//! processes.

use std::time::Duration;

/// Whether a process no longer runs: absent, or a zombie waiting for a parent that is not us
/// (orphans are reparented to a PID 1 that may reap lazily).
pub(crate) fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X'))
        }
    }
}

/// Waits until the kernel reports `pid` gone, for at most five seconds; the kernel gives no
/// event to wait on for another process's exit, so this polls.
pub(crate) async fn wait_gone(pid: u32) {
    for _ in 0..200 {
        if gone(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("process {pid} is still running");
}

/// The pids a test command printed as `pid:N` words.
pub(crate) fn pids_in(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("pid:"))
        .map(|p| p.parse().unwrap())
        .collect()
}
