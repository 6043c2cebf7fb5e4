//! Per-session process accounting in the kernel's `pids` cgroup controller: one cgroup per
//! session under one cgroup per server, so `max_processes` counts every process of every
//! command the session runs, and ending the session kills them all wherever they went.
//!
//! Works with a writable cgroup v1 `pids` hierarchy or a cgroup v2 tree with the `pids`
//! controller delegated to the server's own cgroup. Where neither is writable the sandbox
//! falls back to `RLIMIT_NPROC` (see the module above).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The server's own cgroup directory for sessions, `…/agentd-<pid>-<serial>`.
#[derive(Debug)]
pub struct PidsCgroup {
    base: PathBuf,
    /// Whether `cgroup.kill` exists (cgroup v2, Linux 5.14+).
    has_kill: bool,
}

/// Prefix of every server's cgroup directory; a sibling whose pid is dead is left over from
/// a server that was killed, and is emptied and removed at start-up.
const PREFIX: &str = "agentd-";

impl PidsCgroup {
    /// Finds a writable `pids` controller and makes this server's directory in it; `None`
    /// when there is none.
    pub fn setup() -> Option<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let (parent, v2) = find_pids_dir(&mountinfo, &own)?;
        if v2 {
            // Children only get the controller if the parent delegates it; this fails (and the
            // check below notices) where the parent still holds processes of its own.
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+pids");
        }
        remove_stale(&parent);
        // A process may run several servers (tests do): each gets a directory of its own.
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let serial = SERVERS.fetch_add(1, Ordering::Relaxed);
        let base = parent.join(format!("{PREFIX}{}-{serial}", std::process::id()));
        std::fs::create_dir_all(&base).ok()?;
        let probe = base.join("probe");
        let usable = std::fs::create_dir(&probe).is_ok() && probe.join("pids.max").exists();
        let _ = std::fs::remove_dir(&probe);
        if v2 {
            let _ = std::fs::write(base.join("cgroup.subtree_control"), "+pids");
        }
        if !usable {
            let _ = std::fs::remove_dir(&base);
            return None;
        }
        Some(Self {
            has_kill: base.join("cgroup.kill").exists(),
            base,
        })
    }

    /// Makes (or reuses) the cgroup of one session with its process cap; returns its
    /// `cgroup.procs` file, which each launcher joins.
    pub fn session(&self, session_id: &str, max_processes: u32) -> io::Result<PathBuf> {
        let dir = self.base.join(session_id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
        std::fs::write(dir.join("pids.max"), max_processes.to_string())?;
        Ok(dir.join("cgroup.procs"))
    }

    /// Kills every process in the session's cgroup and removes it.
    pub fn end_session(&self, session_id: &str) {
        kill_and_remove(&self.base.join(session_id), self.has_kill);
    }

    /// Processes the session's cgroup holds now.
    pub fn count(&self, session_id: &str) -> usize {
        std::fs::read_to_string(self.base.join(session_id).join("cgroup.procs"))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        for dir in subdirectories(&self.base) {
            kill_and_remove(&dir, self.has_kill);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

/// The directory of this process's own cgroup in a hierarchy with the `pids` controller, and
/// whether it is cgroup v2.
fn find_pids_dir(mountinfo: &str, own: &str) -> Option<(PathBuf, bool)> {
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split(' ').nth(4)?;
        let mut right = right.split(' ');
        let fstype = right.next()?;
        let options = right.nth(1).unwrap_or("");
        if fstype == "cgroup" && options.split(',').any(|o| o == "pids") {
            let path = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "pids")
                    .then(|| path.to_string())
            })?;
            return Some((join_cgroup(mount_point, &path), false));
        }
        if fstype == "cgroup2" && v2_mount.is_none() {
            v2_mount = Some(mount_point.to_string());
        }
    }
    let mount = v2_mount?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = join_cgroup(&mount, path);
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
    controllers
        .split_whitespace()
        .any(|c| c == "pids")
        .then_some((dir, true))
}

fn join_cgroup(mount: &str, path: &str) -> PathBuf {
    Path::new(mount).join(path.trim_start_matches('/'))
}

/// Removes the directories of servers that are gone, killing what they left behind.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let has_kill = entry.path().join("cgroup.kill").exists();
        for session in subdirectories(&entry.path()) {
            kill_and_remove(&session, has_kill);
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// The child cgroups of a cgroup: its directories (the rest are its control files).
fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills every process in a cgroup (again and again while forks race the kill) and removes
/// the directory once it is empty.
fn kill_and_remove(dir: &Path, has_kill: bool) {
    if !dir.is_dir() {
        return;
    }
    if has_kill {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    }
    for round in 0..200 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() && std::fs::remove_dir(dir).is_ok() {
            return;
        }
        for pid in pids {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        // Killed processes leave the cgroup only once reaped by their parents.
        std::thread::sleep(Duration::from_millis(if round < 10 { 1 } else { 10 }));
    }
    tracing::warn!(cgroup = %dir.display(), "could not empty a session's cgroup");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v1_pids_hierarchy_and_this_process_path() {
        let mountinfo = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 25 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let own = "8:pids:/srv/agentd\n4:memory:/x\n0::/";
        assert_eq!(
            find_pids_dir(mountinfo, own),
            Some((PathBuf::from("/sys/fs/cgroup/pids/srv/agentd"), false))
        );
    }

    #[test]
    fn without_any_cgroup_mount_there_is_none() {
        let mountinfo = "22 1 0:21 / /proc rw - proc proc rw";
        assert_eq!(find_pids_dir(mountinfo, "0::/"), None);
    }
}
