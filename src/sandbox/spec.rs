//! What the server hands the launcher for one command: the paths it may use, the layers to
//! apply and where to account its processes. Serialised as one JSON argument.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One sandboxed command's confinement, as the launcher applies it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Paths the command may read and execute (directories with everything beneath).
    pub read: Vec<PathBuf>,
    /// Paths the command may read, write and execute.
    pub write: Vec<PathBuf>,
    /// Device files the command may read and write (`/dev/null`, the terminal, …).
    pub devices: Vec<PathBuf>,
    /// Files and directories beneath the writable grants that stay read-only (a repository's
    /// `.git/config` and `.git/hooks`); applied with a mount namespace only.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// The session's own temporary directory: mounted at `/tmp` with a mount namespace,
    /// otherwise granted as it is (and named by `TMPDIR`).
    pub tmp: Option<PathBuf>,
    /// Where the command starts.
    pub cwd: PathBuf,
    /// Whether the command may open network sockets.
    pub network: bool,
    /// Whether to enter new user, mount and PID namespaces (and a network one without network).
    pub namespaces: bool,
    /// Whether the network namespace is available (only read with `namespaces`).
    pub net_namespace: bool,
    /// Whether to mount a fresh `/proc` that shows only the command's own processes.
    pub mount_proc: bool,
    /// Whether to mount a devpts instance of the command's own at `/dev/pts` (and its
    /// `ptmx` at `/dev/ptmx`), so no other session's terminal is there to open; without it
    /// neither path is granted.
    #[serde(default)]
    pub private_pts: bool,
    /// Whether to confine the filesystem (and TCP, where the ABI has it) with Landlock.
    pub landlock: bool,
    /// Whether to install the seccomp filter.
    pub seccomp: bool,
    /// The `cgroup.procs` files of the session's cgroups (one per hierarchy), which the
    /// launcher joins.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
    /// `RLIMIT_NPROC` for the command, where no cgroup counts its processes.
    pub nproc: Option<u64>,
    /// `RLIMIT_DATA` in bytes for each process, where no cgroup caps the session's memory.
    #[serde(default)]
    pub data_limit: Option<u64>,
}

/// What the launcher's `--probe` found the kernel allows, printed as one JSON line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The Landlock ABI version, 0 when Landlock is not available.
    pub landlock_abi: i32,
    /// Whether an unprivileged user namespace (with mount and PID namespaces) can be made.
    pub namespaces: bool,
    /// Whether a network namespace can be made beside them.
    pub net_namespace: bool,
    /// Whether a fresh `/proc` can be mounted in the new PID namespace.
    pub mount_proc: bool,
    /// Whether a new devpts instance can be mounted in the new mount namespace.
    #[serde(default)]
    pub private_pts: bool,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
}
