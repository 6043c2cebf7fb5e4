//! The sandbox of every process a session starts (`shell`, `exec_command`, background tasks,
//! plugins): probed once at start-up, applied by a small launcher (`agentd sandbox-exec`) in
//! front of each command.
//!
//! Layers, each applied where the kernel allows it (reported by [`Sandbox::report`]):
//! - `landlock`: the filesystem — the system read-only, the user's workspace root (and the
//!   session's own `/tmp`) writable, nothing else of the server's visible; `landlock_net`:
//!   no TCP bind or connect without network; `landlock_scope`: no signals to, and no abstract
//!   Unix sockets of, processes outside the sandbox.
//! - `user_ns`, `mount_ns`, `pid_ns`: a private `/tmp`, a `/proc` that shows only the
//!   command's processes, a process tree that dies as one; `net_ns` (no network interface)
//!   only where seccomp is not available, since its socket ban is stronger.
//! - `seccomp`: no ptrace, mount, bpf, kexec, module loading, new namespaces or io_uring, and
//!   without network no `socket(2)` at all; `no_new_privs` and an empty capability set.
//! - `pids_cgroup` (or `rlimit_nproc`): `max_processes` per session; `memory_cgroup` (or
//!   `rlimit_data`, per process): `memory_max_mb` per session; `cpu_cgroup`:
//!   `cpu_max_percent` per session.

pub mod cgroup;
pub mod command_env;
pub mod launcher;
pub mod seccomp;
pub mod spec;
pub mod toolchains;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use cgroup::{Controller, SessionCgroups, SessionLimits};
use spec::{LaunchSpec, ProbeReport};

/// How much of the machine a sandboxed command may see and change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// The system read-only, the user's workspace root read-write, a private `/tmp`.
    WorkspaceWrite,
    /// As `workspace-write`, but the workspace is read-only too.
    ReadOnly,
    /// No confinement: commands run as the server does.
    Off,
}

impl SandboxMode {
    /// The name used in the config file and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WorkspaceWrite => "workspace-write",
            Self::ReadOnly => "read-only",
            Self::Off => "off",
        }
    }
}

/// `[sandbox]`: the confinement of every process a session starts.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// What a command may see and change.
    pub mode: SandboxMode,
    /// Whether commands may open network sockets at all.
    pub network: bool,
    /// Absolute paths commands may also read.
    pub extra_read: Vec<PathBuf>,
    /// Absolute paths commands may also write.
    pub extra_write: Vec<PathBuf>,
    /// Processes one session's commands may have alive at once, all commands together.
    pub max_processes: u32,
    /// The most a session's private `/tmp` may hold, in MiB (its own tmpfs where the server
    /// may mount one); 0: no cap.
    pub tmp_max_mb: u64,
    /// Memory one session's commands may hold together, in MiB; 0: a quarter of the
    /// machine's memory, at most 4096.
    pub memory_max_mb: u64,
    /// CPU one session's commands may use together, in percent of one core.
    pub cpu_max_percent: u32,
    /// Variables passed from the server's environment to every command, hook, plugin and
    /// MCP stdio server, beside the few every one gets (see [`command_env`]).
    pub env_pass: Vec<String>,
    /// Variables set for every command, hook, plugin and MCP stdio server.
    pub env_set: std::collections::BTreeMap<String, String>,
    /// The agentd binary that launches sandboxed commands; the running executable unless an
    /// embedder (such as the test harness) names another.
    #[serde(skip)]
    pub launcher: Option<PathBuf>,
}

impl SandboxConfig {
    /// `memory_max_mb`, with 0 meaning a quarter of the machine's memory, at most 4096.
    pub fn memory_max_mb_or_default(&self) -> u64 {
        if self.memory_max_mb > 0 {
            return self.memory_max_mb;
        }
        let total = crate::capped_read::read_kernel_file("/proc/meminfo")
            .ok()
            .and_then(|text| {
                let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(4096, |kib| kib >> 10);
        (total / 4).clamp(64, 4096)
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::WorkspaceWrite,
            network: false,
            extra_read: Vec::new(),
            extra_write: Vec::new(),
            max_processes: 256,
            tmp_max_mb: 1024,
            memory_max_mb: 0,
            cpu_max_percent: 100,
            env_pass: Vec::new(),
            env_set: std::collections::BTreeMap::new(),
            launcher: None,
        }
    }
}

/// Directories of the system every sandboxed command may read and execute.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];
/// Device files every sandboxed command may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The read-only grants the server's `PATH` needs under its user's home (see [`toolchains`]),
/// each logged with the entry it serves; refused entries are logged with the way to grant them.
fn toolchain_grants_logged() -> Vec<PathBuf> {
    let (Some(path), Some(home)) = (std::env::var_os("PATH"), std::env::var_os("HOME")) else {
        return Vec::new();
    };
    let (grants, refused) = toolchains::toolchain_grants(&path, Path::new(&home));
    for grant in &grants {
        tracing::info!(
            grant = %grant.path.display(),
            path_entry = %grant.for_entry.display(),
            "sandbox: toolchain under the home readable by commands"
        );
    }
    for entry in &refused {
        tracing::warn!(
            path_entry = %entry.entry.display(),
            reason = entry.reason,
            "sandbox: PATH entry not readable by commands; name what it needs in [sandbox] extra_read"
        );
    }
    grants.into_iter().map(|grant| grant.path).collect()
}

/// A session's `/tmp` as a tmpfs of its own: capped in size, and on no disk (the data dir's
/// least of all), so a command cannot fill the database's volume through it.
struct TmpQuota;

impl TmpQuota {
    fn mount(dir: &Path, mib: u64) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        let options = std::ffi::CString::new(format!("size={mib}m,mode=0700"))
            .map_err(std::io::Error::other)?;
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let done = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn unmount(dir: &Path) {
        let Ok(target) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return;
        };
        // SAFETY: umount2(2) with a NUL-terminated path; a path that is no mount point fails
        // harmlessly.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }

    /// Whether `dir` is a mount point already (left by a stopped server, say).
    fn is_mounted(dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) {
            (Ok(here), Some(Ok(parent))) => here.dev() != parent.dev(),
            _ => false,
        }
    }
}

/// Git settings every sandboxed command gets, whatever a repository's config says.
const GIT_OVERRIDES: &[(&str, &str)] = &[
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.sshCommand", "ssh"),
    ("core.pager", "cat"),
];

/// How deep below a command's directory repositories are looked for.
const REPOSITORY_DEPTH: usize = 2;
/// The most repositories whose config one command's launch protects.
const MAX_REPOSITORIES: usize = 64;

/// The `.git/config` and `.git/hooks` of every repository a command in `cwd` may use: in `cwd`
/// and its parents within the session's grants, and up to two levels below it. Read-only in
/// the command's namespace, so no command can make a later git command (an allowed one
/// included) run something through them.
fn repository_config(cwd: &Path, roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut repositories = Vec::new();
    let mut dir = Some(cwd);
    while let Some(here) = dir.filter(|d| roots.iter().any(|root| d.starts_with(root))) {
        repositories.push(here.join(".git"));
        dir = here.parent();
    }
    let mut level = vec![cwd.to_path_buf()];
    for _ in 0..REPOSITORY_DEPTH {
        let mut next = Vec::new();
        for parent in &level {
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir && entry.file_name() != ".git" {
                    repositories.push(entry.path().join(".git"));
                    next.push(entry.path());
                }
                if next.len() > MAX_REPOSITORIES * 4 {
                    break;
                }
            }
        }
        level = next;
    }
    repositories
        .into_iter()
        .filter(|git| git.is_dir())
        .take(MAX_REPOSITORIES)
        .flat_map(|git| [git.join("config"), git.join("hooks")])
        .filter(|path| path.exists())
        .collect()
}

/// Why the sandbox cannot run as configured; start-up prints it on one line.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The kernel cannot confine the filesystem.
    #[error(
        "sandbox: the kernel does not enforce Landlock, so commands cannot be confined to the \
         workspace; enable Landlock (lsm=landlock,…) or set [sandbox] mode = \"off\" to run \
         commands unconfined knowingly"
    )]
    NoLandlock,
    /// The launcher could not be found or set up.
    #[error("sandbox: {0}; set [sandbox] mode = \"off\" to run commands unconfined knowingly")]
    Launcher(String),
    /// A confined `sh -c true` failed at start-up.
    #[error("sandbox: {0}; set [sandbox] mode = \"off\" to run commands unconfined knowingly")]
    SelfTest(#[from] SelfTestError),
}

/// Why the start-up check's confined command failed.
#[derive(Debug, thiserror::Error)]
pub enum SelfTestError {
    /// Its directory, or its launch spec, could not be made.
    #[error("cannot prepare the self-test: {0}")]
    Prepare(#[source] std::io::Error),
    /// The launcher could not be started.
    #[error("cannot run {}: {source}", launcher.display())]
    Spawn {
        /// The launcher.
        launcher: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command ran and failed.
    #[error("a confined command failed ({status}): {stderr}")]
    Failed {
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
}

/// How the sandbox runs on this machine, for `/readyz` and `session/open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxReport {
    /// The configured mode.
    pub mode: &'static str,
    /// Whether commands have network.
    pub network: bool,
    /// The layers enforced on every command.
    pub layers: Vec<&'static str>,
}

impl SandboxReport {
    /// The report of a server whose commands run unconfined.
    pub fn off() -> Self {
        Self {
            mode: SandboxMode::Off.as_str(),
            network: true,
            layers: Vec::new(),
        }
    }
}

/// The server-wide sandbox: the probed layers and the paths every command may use.
#[derive(Debug)]
pub struct Sandbox {
    mode: SandboxMode,
    network: bool,
    launcher: PathBuf,
    probe: ProbeReport,
    /// Whether commands enter namespaces (probed, then checked end to end).
    namespaces: bool,
    /// Read-only grants: the system and `extra_read`, with hidden paths carved out.
    read: Vec<PathBuf>,
    /// Writable grants from `extra_write`, with hidden paths carved out.
    extra_write: Vec<PathBuf>,
    /// Paths no command may see: the data dir and the config file (other users' workspaces
    /// are simply never granted).
    hidden: Vec<PathBuf>,
    /// Where each session's private `/tmp` lives.
    tmp_root: PathBuf,
    /// Each session's `/tmp` is a tmpfs of this many MiB; `None` where none can be mounted
    /// (or with no cap).
    tmp_quota_mb: Option<u64>,
    /// `PATH` entries no grant covers: a command found only there cannot run.
    unreachable_path: Vec<PathBuf>,
    cgroup: Option<SessionCgroups>,
    limits: SessionLimits,
    /// Whether `RLIMIT_NPROC` stands in for the cgroup (it cannot bind root).
    nproc: bool,
    /// Whether `RLIMIT_DATA` stands in for the memory cgroup.
    rlimit_data: bool,
}

impl Sandbox {
    /// Probes the kernel and checks a confined command end to end; `None` with mode `off`.
    pub async fn start(
        settings: &SandboxConfig,
        data_dir: &Path,
        config_file: Option<&Path>,
    ) -> Result<Option<Arc<Self>>, SandboxError> {
        if settings.mode == SandboxMode::Off {
            return Ok(None);
        }
        let launcher = match &settings.launcher {
            Some(path) => path.clone(),
            None => default_launcher()?,
        };
        let probe = run_probe(&launcher).await?;
        if probe.landlock_abi < 1 {
            return Err(SandboxError::NoLandlock);
        }
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut hidden = vec![absolute(data_dir)];
        if let Some(file) = config_file {
            hidden.push(absolute(file));
        }
        let toolchains = toolchain_grants_logged();
        let read_wanted: Vec<PathBuf> = SYSTEM_READ
            .iter()
            .map(PathBuf::from)
            .chain(settings.extra_read.iter().cloned())
            .chain(toolchains)
            .collect();
        let read = carve(&read_wanted, &hidden);
        let unreachable_path: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|entry| entry.is_absolute() && entry.is_dir())
            .filter(|entry| {
                let entry = entry.canonicalize().unwrap_or_else(|_| entry.clone());
                !read.iter().any(|grant| entry.starts_with(grant))
            })
            .collect();
        let extra_write = carve(&settings.extra_write, &hidden);
        let is_root = rustix::process::getuid().is_root();
        let cgroup = SessionCgroups::setup();
        let has_pids = cgroup.as_ref().is_some_and(|g| g.has(Controller::Pids));
        let has_memory = cgroup.as_ref().is_some_and(|g| g.has(Controller::Memory));
        let limits = SessionLimits {
            max_processes: settings.max_processes,
            memory_bytes: settings.memory_max_mb_or_default() << 20,
            cpu_percent: settings.cpu_max_percent,
        };
        let mut sandbox = Self {
            unreachable_path,
            mode: settings.mode,
            network: settings.network,
            launcher,
            probe,
            namespaces: probe.namespaces,
            read,
            extra_write,
            hidden,
            tmp_root: absolute(data_dir).join("sandbox"),
            tmp_quota_mb: None,
            nproc: !has_pids && !is_root,
            rlimit_data: !has_memory,
            cgroup,
            limits,
        };
        std::fs::create_dir_all(&sandbox.tmp_root).map_err(|err| {
            SandboxError::Launcher(format!(
                "cannot create {}: {err}",
                sandbox.tmp_root.display()
            ))
        })?;
        if settings.tmp_max_mb > 0 {
            let probe = sandbox
                .tmp_root
                .join(format!("tmpfs-probe-{}", std::process::id()));
            if TmpQuota::mount(&probe, 1).is_ok() {
                TmpQuota::unmount(&probe);
                sandbox.tmp_quota_mb = Some(settings.tmp_max_mb);
            } else {
                tracing::warn!(
                    "sandbox: cannot mount a tmpfs (the server needs CAP_SYS_ADMIN), so \
                     sandbox.tmp_max_mb is not enforced and each session's /tmp lives under \
                     the data dir"
                );
            }
            let _ = std::fs::remove_dir(&probe);
        }
        if let Err(first) = sandbox.self_test().await {
            if !sandbox.namespaces {
                return Err(first.into());
            }
            tracing::warn!(error = %first, "sandboxed commands fail inside namespaces; using the other layers");
            sandbox.namespaces = false;
            sandbox.self_test().await?;
        }
        let report = sandbox.report();
        tracing::info!(mode = report.mode, network = report.network, layers = ?report.layers, "sandbox enforced");
        tracing::info!(
            max_processes = limits.max_processes,
            memory_max_mb = limits.memory_bytes >> 20,
            cpu = %SessionCgroups::cpu_cap(sandbox.cgroup.as_ref(), limits.cpu_percent),
            "sandbox: per-session caps"
        );
        if !has_pids && is_root {
            tracing::warn!(
                "sandbox: no writable pids cgroup and the server runs as root, so \
                 sandbox.max_processes is not enforced"
            );
        }
        Ok(Some(Arc::new(sandbox)))
    }

    /// What is enforced.
    pub fn report(&self) -> SandboxReport {
        let mut layers = vec!["landlock"];
        if self.probe.landlock_abi >= 4 && !self.network {
            layers.push("landlock_net");
        }
        if self.probe.landlock_abi >= 6 {
            layers.push("landlock_scope");
        }
        if self.namespaces {
            layers.extend(["user_ns", "mount_ns", "pid_ns"]);
            if self.probe.net_namespace && !self.network && !self.probe.seccomp {
                layers.push("net_ns");
            }
            if self.probe.mount_proc {
                layers.push("private_proc");
            }
            if self.probe.private_pts {
                layers.push("private_pts");
            }
        }
        if self.probe.seccomp {
            layers.push("seccomp");
        }
        layers.push("no_new_privs");
        if self.tmp_quota_mb.is_some() {
            layers.push("tmp_quota");
        }
        let has = |c: Controller| self.cgroup.as_ref().is_some_and(|g| g.has(c));
        if has(Controller::Pids) {
            layers.push("pids_cgroup");
        } else if self.nproc {
            layers.push("rlimit_nproc");
        }
        if has(Controller::Memory) {
            layers.push("memory_cgroup");
        } else if self.rlimit_data {
            layers.push("rlimit_data");
        }
        if has(Controller::Cpu) {
            layers.push("cpu_cgroup");
        }
        SandboxReport {
            mode: self.mode.as_str(),
            network: self.network,
            layers,
        }
    }

    /// The sandbox of one session, whose user's files live under `user_root`.
    pub fn for_session(
        self: &Arc<Self>,
        session_id: &str,
        user_root: &Path,
    ) -> Arc<SessionSandbox> {
        let user_root = std::path::absolute(user_root).unwrap_or_else(|_| user_root.to_path_buf());
        Arc::new(SessionSandbox {
            sandbox: Arc::clone(self),
            session_id: session_id.to_string(),
            // Carved once: it may read the directory when the data dir lies inside the root.
            root_grant: carve(&[user_root], &self.hidden),
            tmp: self.tmp_root.join(session_id).join("tmp"),
            prepared: OnceLock::new(),
        })
    }

    /// Removes what a deleted session left: its `/tmp`.
    pub fn remove_session(&self, session_id: &str) {
        TmpQuota::unmount(&self.tmp_root.join(session_id).join("tmp"));
        let _ = std::fs::remove_dir_all(self.tmp_root.join(session_id));
    }

    /// Runs `sh -c true` confined as a session's command would be, so that a layer the
    /// probe believed in but that fails for real is found now, not at the first command.
    async fn self_test(&self) -> Result<(), SelfTestError> {
        // One per process: nodes of a cluster may share the data directory and start together.
        let dir = self
            .tmp_root
            .join(format!("self-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(SelfTestError::Prepare)?;
        let spec = self.spec(&[], Path::new("/"), Some(dir.clone()), &[], Vec::new());
        let mut command = self
            .command(
                &spec,
                OsStr::new("sh"),
                &[OsStr::new("-c"), OsStr::new("true")],
            )
            .map_err(SelfTestError::Prepare)?;
        let output = crate::capped_read::output(&mut command, PROBE_OUTPUT_BYTES)
            .await
            .map_err(|source| SelfTestError::Spawn {
                launcher: self.launcher.clone(),
                source,
            })?;
        let _ = std::fs::remove_dir_all(&dir);
        if output.status.success() {
            Ok(())
        } else {
            Err(SelfTestError::Failed {
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr.bytes)
                    .trim()
                    .to_string(),
            })
        }
    }

    fn spec(
        &self,
        root_grant: &[PathBuf],
        cwd: &Path,
        tmp: Option<PathBuf>,
        extra_read: &[PathBuf],
        cgroup_procs: Vec<PathBuf>,
    ) -> LaunchSpec {
        let mut read = self.read.clone();
        read.extend(carve(extra_read, &self.hidden));
        let mut write = self.extra_write.clone();
        match self.mode {
            SandboxMode::ReadOnly => read.extend_from_slice(root_grant),
            _ => write.extend_from_slice(root_grant),
        }
        LaunchSpec {
            read,
            write,
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            read_only: Vec::new(),
            tmp,
            cwd: cwd.to_path_buf(),
            network: self.network,
            namespaces: self.namespaces,
            net_namespace: self.probe.net_namespace,
            mount_proc: self.probe.mount_proc,
            private_pts: self.namespaces && self.probe.private_pts,
            landlock: true,
            seccomp: self.probe.seccomp,
            nproc: self.nproc.then_some(u64::from(self.limits.max_processes)),
            data_limit: self.rlimit_data.then_some(self.limits.memory_bytes),
            cgroup_procs,
        }
    }

    fn command(
        &self,
        spec: &LaunchSpec,
        program: &OsStr,
        args: &[&OsStr],
    ) -> std::io::Result<tokio::process::Command> {
        let spec = serde_json::to_string(spec).map_err(std::io::Error::other)?;
        let mut command = tokio::process::Command::new(&self.launcher);
        command
            .arg(launcher::SUBCOMMAND)
            .arg(spec)
            .arg(program)
            .args(args);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and only marks the child: the
        // launcher dies with the thread that started it, and the whole sandbox with it, even
        // when the server is killed with SIGKILL.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Ok(command)
    }
}

/// One session's sandbox: where its user's files and its `/tmp` are, and its process cgroup.
#[derive(Debug)]
pub struct SessionSandbox {
    sandbox: Arc<Sandbox>,
    session_id: String,
    /// The user's workspace root as granted, with hidden paths carved out.
    root_grant: Vec<PathBuf>,
    /// The session's private `/tmp` on disk.
    tmp: PathBuf,
    /// Done at the first command: the tmp directory made, and the session cgroups'
    /// `cgroup.procs` files (none without cgroups).
    prepared: OnceLock<std::io::Result<Vec<PathBuf>>>,
}

impl SessionSandbox {
    /// A command that runs `program args` confined, starting in `cwd`; `extra_read` are
    /// files it may also read (such as a plugin's program). The caller adds stdio and env.
    pub fn command(
        &self,
        program: &OsStr,
        args: &[&OsStr],
        cwd: &Path,
        extra_read: &[PathBuf],
    ) -> std::io::Result<tokio::process::Command> {
        self.command_with_network(program, args, cwd, extra_read, false)
    }

    /// [`Self::command`], with network for this command when `network` is set, whatever
    /// `[sandbox] network` says (an MCP server's own `network = true`).
    pub fn command_with_network(
        &self,
        program: &OsStr,
        args: &[&OsStr],
        cwd: &Path,
        extra_read: &[PathBuf],
        network: bool,
    ) -> std::io::Result<tokio::process::Command> {
        let prepared = self.prepared.get_or_init(|| {
            std::fs::create_dir_all(&self.tmp)?;
            if let Some(mib) = self.sandbox.tmp_quota_mb
                && !TmpQuota::is_mounted(&self.tmp)
            {
                TmpQuota::mount(&self.tmp, mib)?;
            }
            let Some(cgroup) = self.sandbox.cgroup.as_ref() else {
                return Ok(Vec::new());
            };
            match cgroup.session(&self.session_id, &self.sandbox.limits) {
                Ok(procs) => Ok(procs),
                Err(err) => {
                    tracing::warn!(session_id = %self.session_id, error = %err, "cannot make the session's cgroups");
                    cgroup.end_session(&self.session_id);
                    Ok(Vec::new())
                }
            }
        });
        let procs = match prepared {
            Ok(procs) => procs.clone(),
            Err(err) => return Err(std::io::Error::new(err.kind(), err.to_string())),
        };
        let mut spec = self.sandbox.spec(
            &self.root_grant,
            cwd,
            Some(self.tmp.clone()),
            extra_read,
            procs,
        );
        spec.network |= network;
        if self.sandbox.namespaces && self.sandbox.mode == SandboxMode::WorkspaceWrite {
            spec.read_only = repository_config(cwd, &self.root_grant);
        }
        self.sandbox.command(&spec, program, args)
    }

    /// Sets the environment the sandbox needs on a command made by [`Self::command`]: `TMPDIR`
    /// and `HOME` point at the session's private `/tmp`, the one writable place besides the
    /// workspace. Call it after the caller has set (or cleared) the rest of the environment.
    pub fn apply_env(&self, command: &mut tokio::process::Command) {
        let tmp = if self.sandbox.namespaces {
            PathBuf::from("/tmp")
        } else {
            self.tmp.clone()
        };
        command.env("TMPDIR", &tmp).env("HOME", &tmp);
        // Settings a repository's own config could use to run a command of its choosing
        // under any git command, an allowed `git status` included; the environment's
        // `GIT_CONFIG_*` outranks every config file.
        for (index, (key, value)) in GIT_OVERRIDES.iter().enumerate() {
            command
                .env(format!("GIT_CONFIG_KEY_{index}"), key)
                .env(format!("GIT_CONFIG_VALUE_{index}"), value);
        }
        command
            .env("GIT_CONFIG_COUNT", GIT_OVERRIDES.len().to_string())
            .env("GIT_PAGER", "cat");
    }

    /// For a command that could not be found or run (exit 126 or 127): the `PATH` entries the
    /// sandbox does not let commands read, and how to grant one; `None` when there are none.
    pub fn unreachable_path_hint(&self) -> Option<String> {
        let entries = &self.sandbox.unreachable_path;
        if entries.is_empty() {
            return None;
        }
        let shown: Vec<String> = entries.iter().map(|e| e.display().to_string()).collect();
        Some(format!(
            "note: the sandbox does not let commands read these PATH entries, so a program \
             found only there cannot run: {}. An operator can grant one with [sandbox] \
             extra_read.",
            shown.join(", ")
        ))
    }

    /// Processes the session has alive now, where a cgroup counts them.
    pub fn process_count(&self) -> Option<usize> {
        self.sandbox.cgroup.as_ref()?.count(&self.session_id)
    }

    /// How many of the session's processes the kernel has killed for its memory cap so far,
    /// where a memory cgroup caps it; compared before and after a command to tell an
    /// out-of-memory kill from any other `SIGKILL`.
    pub fn oom_kills(&self) -> Option<u64> {
        self.sandbox.cgroup.as_ref()?.oom_kills(&self.session_id)
    }

    /// The session's memory cap in MiB.
    pub fn memory_max_mb(&self) -> u64 {
        self.sandbox.limits.memory_bytes >> 20
    }
}

impl Drop for SessionSandbox {
    /// A session that ends (unloaded, deleted, the server stopping) leaves no process behind,
    /// and its `/tmp` tmpfs gives its memory back.
    fn drop(&mut self) {
        if self.sandbox.tmp_quota_mb.is_some() && matches!(self.prepared.get(), Some(Ok(_))) {
            TmpQuota::unmount(&self.tmp);
        }
        if let Some(cgroup) = &self.sandbox.cgroup
            && matches!(self.prepared.get(), Some(Ok(procs)) if !procs.is_empty())
        {
            cgroup.end_session(&self.session_id);
        }
    }
}

/// `agentd-sandbox` beside the running binary when it is there (it starts faster), else the
/// running binary itself, which has the same `sandbox-exec` subcommand.
fn default_launcher() -> Result<PathBuf, SandboxError> {
    let exe = std::env::current_exe()
        .map_err(|err| SandboxError::Launcher(format!("cannot find agentd: {err}")))?;
    let small = exe.with_file_name("agentd-sandbox");
    Ok(if small.is_file() { small } else { exe })
}

/// Most bytes kept of each stream of the launcher's probes: a report, or why it failed.
const PROBE_OUTPUT_BYTES: usize = 1024 * 1024;

/// Runs the launcher's probe.
async fn run_probe(launcher: &Path) -> Result<ProbeReport, SandboxError> {
    let mut command = tokio::process::Command::new(launcher);
    command.arg(launcher::SUBCOMMAND).arg("--probe");
    let output = crate::capped_read::output(&mut command, PROBE_OUTPUT_BYTES)
        .await
        .map_err(|err| {
            SandboxError::Launcher(format!("cannot run {}: {err}", launcher.display()))
        })?;
    serde_json::from_slice(&output.stdout.bytes).map_err(|err| {
        SandboxError::Launcher(format!(
            "{} sandbox-exec --probe answered no report ({err}): {}",
            launcher.display(),
            String::from_utf8_lossy(&output.stderr.bytes).trim()
        ))
    })
}

/// `wanted` with every hidden path cut out: a wanted directory that holds a hidden path is
/// replaced by its entries, except the one on the way to the hidden path, recursively; a
/// wanted path that is itself hidden is dropped. A path granted inside a hidden directory
/// stays granted (the image's workspace is `/data/workspace` beside the database in `/data`):
/// Landlock then grants that subtree and nothing around it.
fn carve(wanted: &[PathBuf], hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in wanted {
        carve_one(path, hidden, &mut out, 0);
    }
    out
}

fn carve_one(path: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>, depth: usize) {
    if hidden.iter().any(|h| path == h) {
        return;
    }
    if depth > 16 || !hidden.iter().any(|h| h.starts_with(path)) {
        out.push(path.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        carve_one(&entry.path(), hidden, out, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_keeps_siblings_and_drops_the_hidden_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["a", "b/secret", "b/open"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let mut got = carve(&[root.to_path_buf()], &[root.join("b/secret")]);
        got.sort();
        assert_eq!(got, vec![root.join("a"), root.join("b/open")]);
        assert!(carve(&[root.join("b/secret")], &[root.join("b/secret")]).is_empty());
        assert_eq!(
            carve(&[root.join("b/secret/x")], &[root.join("b/secret")]),
            vec![root.join("b/secret/x")]
        );
        assert_eq!(
            carve(&[root.join("a")], &[root.join("b")]),
            vec![root.join("a")]
        );
    }
}
