//! Per-session resource accounting in the kernel's cgroup controllers: one cgroup per session
//! under one cgroup per server, in each hierarchy that has a controller we use, so
//! `max_processes` counts every process of every command the session runs, `memory_max_mb`
//! caps the memory they hold together (the kernel's OOM killer acts inside the session only),
//! `cpu_max_percent` caps the CPU time they get, and ending the session kills them all
//! wherever they went.
//!
//! Works with writable cgroup v1 hierarchies (one per controller, or several mounted
//! together) and with a cgroup v2 tree whose controllers are delegated to the server's own
//! cgroup; each controller is used where it is found writable. Where `pids` or `memory` is
//! not, the sandbox falls back to `RLIMIT_NPROC` and `RLIMIT_DATA` (see the module above);
//! CPU has no per-process stand-in.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A cgroup controller agentd uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// Counts and caps processes.
    Pids,
    /// Caps resident memory and swap; its OOM killer acts inside the group.
    Memory,
    /// Caps CPU bandwidth (CFS quota).
    Cpu,
}

impl Controller {
    const ALL: [Self; 3] = [Self::Pids, Self::Memory, Self::Cpu];

    /// The controller's name in `/proc/self/cgroup`, mount options and `cgroup.controllers`.
    fn name(self) -> &'static str {
        match self {
            Self::Pids => "pids",
            Self::Memory => "memory",
            Self::Cpu => "cpu",
        }
    }

    /// A control file whose presence in a child shows the controller works there.
    fn probe_file(self, v2: bool) -> &'static str {
        match (self, v2) {
            (Self::Pids, _) => "pids.max",
            (Self::Memory, false) => "memory.limit_in_bytes",
            (Self::Memory, true) => "memory.max",
            (Self::Cpu, false) => "cpu.cfs_quota_us",
            (Self::Cpu, true) => "cpu.max",
        }
    }
}

/// What one session's commands may take together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Processes alive at once.
    pub max_processes: u32,
    /// Bytes of memory (swap included where the kernel accounts it).
    pub memory_bytes: u64,
    /// CPU time per wall time, in percent of one core.
    pub cpu_percent: u32,
}

/// The scheduler period the CPU quota is a share of (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// One hierarchy this server made its directory in, with the controllers it uses there.
#[derive(Debug)]
struct Hierarchy {
    /// `…/agentd-<pid>-<serial>`.
    base: PathBuf,
    controllers: Vec<Controller>,
    v2: bool,
    /// Whether `cgroup.kill` exists (cgroup v2, Linux 5.14+).
    has_kill: bool,
}

/// The server's own cgroup directories for sessions, one per hierarchy with a usable
/// controller.
#[derive(Debug)]
pub struct SessionCgroups {
    hierarchies: Vec<Hierarchy>,
}

/// Prefix of every server's cgroup directory; a sibling whose pid is dead is left over from
/// a server that was killed, and is emptied and removed at start-up.
const PREFIX: &str = "agentd-";

impl SessionCgroups {
    /// Finds the writable controllers and makes this server's directories for them; `None`
    /// when there is none.
    pub fn setup() -> Option<Self> {
        let mountinfo = crate::capped_read::read_kernel_file("/proc/self/mountinfo").ok()?;
        let own = crate::capped_read::read_kernel_file("/proc/self/cgroup").ok()?;
        // A process may run several servers (tests do): each gets directories of its own.
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let serial = SERVERS.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{serial}", std::process::id());
        let mut hierarchies: Vec<Hierarchy> = Vec::new();
        for (parent, v2, wanted) in find_dirs(&mountinfo, &own) {
            if let Some(hierarchy) = Hierarchy::make(&parent, v2, &wanted, &name) {
                hierarchies.push(hierarchy);
            }
        }
        (!hierarchies.is_empty()).then_some(Self { hierarchies })
    }

    /// Whether this controller is in use.
    pub fn has(&self, controller: Controller) -> bool {
        self.hierarchy(controller).is_some()
    }

    fn hierarchy(&self, controller: Controller) -> Option<&Hierarchy> {
        self.hierarchies
            .iter()
            .find(|h| h.controllers.contains(&controller))
    }

    /// Makes (or reuses) the cgroups of one session with its limits; returns the
    /// `cgroup.procs` files each launcher joins, one per hierarchy.
    pub fn session(&self, session_id: &str, limits: &SessionLimits) -> io::Result<Vec<PathBuf>> {
        self.hierarchies
            .iter()
            .map(|h| h.session(session_id, limits))
            .collect()
    }

    /// Kills every process in the session's cgroups and removes them.
    pub fn end_session(&self, session_id: &str) {
        for hierarchy in &self.hierarchies {
            kill_and_remove(&hierarchy.base.join(session_id), hierarchy.has_kill);
        }
    }

    /// The CPU cap in force for each session, in words: `percent` through the cpu controller,
    /// or none without one.
    pub fn cpu_cap(cgroups: Option<&Self>, percent: u32) -> String {
        let v2 = cgroups
            .and_then(|cgroups| cgroups.hierarchy(Controller::Cpu))
            .map(|hierarchy| hierarchy.v2);
        cpu_cap_text(percent, v2)
    }

    /// Processes the session's cgroup holds now.
    pub fn count(&self, session_id: &str) -> Option<usize> {
        let hierarchy = self.hierarchy(Controller::Pids)?;
        let procs = hierarchy.base.join(session_id).join("cgroup.procs");
        Some(
            crate::capped_read::read_kernel_file(procs)
                .map(|text| text.lines().count())
                .unwrap_or(0),
        )
    }

    /// How many processes the kernel has killed in the session for going over its memory
    /// cap so far; `None` without a memory controller.
    pub fn oom_kills(&self, session_id: &str) -> Option<u64> {
        let hierarchy = self.hierarchy(Controller::Memory)?;
        let file = if hierarchy.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = crate::capped_read::read_kernel_file(hierarchy.base.join(session_id).join(file))
            .ok()?;
        Some(counter(&text, "oom_kill").unwrap_or(0))
    }
}

impl Drop for SessionCgroups {
    fn drop(&mut self) {
        for hierarchy in &self.hierarchies {
            for dir in subdirectories(&hierarchy.base) {
                kill_and_remove(&dir, hierarchy.has_kill);
            }
            let _ = std::fs::remove_dir(&hierarchy.base);
        }
    }
}

impl Hierarchy {
    /// Makes the server's directory under `parent` and keeps the controllers that work in a
    /// child of it; `None` when none does.
    fn make(parent: &Path, v2: bool, wanted: &[Controller], name: &str) -> Option<Self> {
        let enable = |dir: &Path| {
            // Children only get a controller if the parent delegates it; this fails (and the
            // probe below notices) where the parent still holds processes of its own.
            for controller in wanted {
                let _ = std::fs::write(
                    dir.join("cgroup.subtree_control"),
                    format!("+{}", controller.name()),
                );
            }
        };
        if v2 {
            enable(parent);
        }
        remove_stale(parent);
        let base = parent.join(name);
        std::fs::create_dir_all(&base).ok()?;
        if v2 {
            enable(&base);
        }
        let probe = base.join("probe");
        let made = std::fs::create_dir(&probe).is_ok();
        let controllers: Vec<Controller> = wanted
            .iter()
            .copied()
            .filter(|c| made && probe.join(c.probe_file(v2)).exists())
            .collect();
        let _ = std::fs::remove_dir(&probe);
        if controllers.is_empty() {
            let _ = std::fs::remove_dir(&base);
            return None;
        }
        Some(Self {
            has_kill: base.join("cgroup.kill").exists(),
            base,
            controllers,
            v2,
        })
    }

    fn session(&self, session_id: &str, limits: &SessionLimits) -> io::Result<PathBuf> {
        let dir = self.base.join(session_id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
        let write = |file: &str, value: String| {
            std::fs::write(dir.join(file), value)
                .map_err(|err| io::Error::new(err.kind(), format!("{file}: {err}")))
        };
        for controller in &self.controllers {
            match (controller, self.v2) {
                (Controller::Pids, _) => write("pids.max", limits.max_processes.to_string())?,
                (Controller::Memory, false) => {
                    write("memory.limit_in_bytes", limits.memory_bytes.to_string())?;
                    // Without it the group would page out to swap instead of meeting its
                    // cap; absent where the kernel has no swap accounting.
                    let _ = write(
                        "memory.memsw.limit_in_bytes",
                        limits.memory_bytes.to_string(),
                    );
                }
                (Controller::Memory, true) => {
                    write("memory.max", limits.memory_bytes.to_string())?;
                    let _ = write("memory.swap.max", "0".to_string());
                }
                (Controller::Cpu, false) => {
                    write("cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                    write(
                        "cpu.cfs_quota_us",
                        cpu_quota_us(limits.cpu_percent).to_string(),
                    )?;
                }
                (Controller::Cpu, true) => write(
                    "cpu.max",
                    format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.cpu_percent)),
                )?,
            }
        }
        Ok(dir.join("cgroup.procs"))
    }
}

/// The CPU cap `percent` (of one core) as the start-up log says it: through the cpu controller
/// of cgroup v2 (`Some(true)`) or v1 (`Some(false)`), or not capped at all (`None`).
pub fn cpu_cap_text(percent: u32, cpu_controller_v2: Option<bool>) -> String {
    match cpu_controller_v2 {
        Some(v2) => format!(
            "{percent}% of a core (cgroup {})",
            if v2 { "cpu.max" } else { "v1 cpu.cfs_quota_us" }
        ),
        None => "not capped (no writable cpu controller)".to_string(),
    }
}

fn cpu_quota_us(percent: u32) -> u64 {
    // The kernel refuses quotas under 1 ms.
    (CPU_PERIOD_US * u64::from(percent) / 100).max(1_000)
}

/// The value of `name` in a flat-keyed control file (`oom_kill 3`).
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// This process's own cgroup directories holding the controllers we use: per v1 hierarchy
/// (each mount with one of them), or the v2 tree for those v1 does not have; each with
/// whether it is v2 and the controllers wanted there.
fn find_dirs(mountinfo: &str, own: &str) -> Vec<(PathBuf, bool, Vec<Controller>)> {
    let mut found: Vec<(PathBuf, bool, Vec<Controller>)> = Vec::new();
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let fstype = right.next().unwrap_or("");
        let options = right.nth(1).unwrap_or("");
        if fstype == "cgroup2" && v2_mount.is_none() {
            v2_mount = Some(mount_point.to_string());
        }
        if fstype != "cgroup" {
            continue;
        }
        let wanted: Vec<Controller> = Controller::ALL
            .into_iter()
            .filter(|c| options.split(',').any(|o| o == c.name()))
            .filter(|c| !found.iter().any(|(_, _, have)| have.contains(c)))
            .collect();
        let Some(first) = wanted.first() else {
            continue;
        };
        let path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == first.name())
                .then(|| path.to_string())
        });
        if let Some(path) = path {
            found.push((join_cgroup(mount_point, &path), false, wanted));
        }
    }
    let missing: Vec<Controller> = Controller::ALL
        .into_iter()
        .filter(|c| !found.iter().any(|(_, _, have)| have.contains(c)))
        .collect();
    if let (Some(mount), false) = (v2_mount, missing.is_empty())
        && let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::"))
    {
        let dir = join_cgroup(&mount, path);
        let available = crate::capped_read::read_kernel_file(dir.join("cgroup.controllers"))
            .unwrap_or_default();
        let wanted: Vec<Controller> = missing
            .into_iter()
            .filter(|c| available.split_whitespace().any(|a| a == c.name()))
            .collect();
        if !wanted.is_empty() {
            found.push((dir, true, wanted));
        }
    }
    found
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
        let procs =
            crate::capped_read::read_kernel_file(dir.join("cgroup.procs")).unwrap_or_default();
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
    fn the_cpu_cap_is_said_as_it_is_enforced() {
        assert_eq!(
            cpu_cap_text(100, Some(true)),
            "100% of a core (cgroup cpu.max)"
        );
        assert_eq!(
            cpu_cap_text(250, Some(false)),
            "250% of a core (cgroup v1 cpu.cfs_quota_us)"
        );
        assert_eq!(
            cpu_cap_text(100, None),
            "not capped (no writable cpu controller)"
        );
        assert_eq!(
            SessionCgroups::cpu_cap(None, 100),
            "not capped (no writable cpu controller)"
        );
    }

    #[test]
    fn finds_each_v1_hierarchy_with_this_process_path() {
        let mountinfo = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
38 25 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let own = "8:pids:/srv/agentd\n4:memory:/x\n2:cpu,cpuacct:/\n0::/";
        assert_eq!(
            find_dirs(mountinfo, own),
            vec![
                (
                    PathBuf::from("/sys/fs/cgroup/memory/x"),
                    false,
                    vec![Controller::Memory]
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/pids/srv/agentd"),
                    false,
                    vec![Controller::Pids]
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                    false,
                    vec![Controller::Cpu]
                ),
            ]
        );
    }

    #[test]
    fn without_any_cgroup_mount_there_is_none() {
        let mountinfo = "22 1 0:21 / /proc rw - proc proc rw";
        assert!(find_dirs(mountinfo, "0::/").is_empty());
    }

    #[test]
    fn reads_the_oom_kill_counter_of_either_version() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        let v2 = "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n";
        assert_eq!(counter(v1, "oom_kill"), Some(2));
        assert_eq!(counter(v2, "oom_kill"), Some(1));
        assert_eq!(counter(v2, "oom_group_kill"), None);
    }

    #[test]
    fn the_cpu_quota_is_a_share_of_the_period_never_under_a_millisecond() {
        assert_eq!(cpu_quota_us(100), 100_000);
        assert_eq!(cpu_quota_us(250), 250_000);
        assert_eq!(cpu_quota_us(0), 1_000);
    }
}
