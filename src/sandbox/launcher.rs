//! `agentd sandbox-exec SPEC PROGRAM [ARGS…]`: the small process that confines one command
//! and then becomes it (or its parent), and `agentd sandbox-exec --probe`, which tells the
//! server which layers this kernel allows.
//!
//! The server starts the launcher, never the command itself, so that the confinement is
//! applied in a fresh single-threaded process, where forking and allocating are safe. With
//! namespaces the launcher forks an init that is PID 1 of a new PID namespace; when that init
//! ends, or the launcher is killed (which kills the init through its parent-death signal),
//! the kernel kills every process left in the namespace, `setsid` and double forks included.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::seccomp;
use super::spec::{LaunchSpec, ProbeReport};

/// Exit code of a launcher that could not confine its command; the command never ran.
pub const LAUNCH_FAILED: i32 = 125;
/// The subcommand name, `argv[1]` of a launcher.
pub const SUBCOMMAND: &str = "sandbox-exec";
/// The Landlock ABI whose rights are requested; older kernels get what they support.
const TARGET_ABI: ABI = ABI::V7;

/// Runs the launcher with `args` (everything after `sandbox-exec`); never returns.
pub fn main(args: Vec<OsString>) -> ! {
    let code = match args.first().map(|a| a.as_os_str()) {
        Some(flag) if flag == "--probe" => {
            let report = probe();
            let line = serde_json::to_string(&report).unwrap_or_default();
            let _ = writeln!(io::stdout(), "{line}");
            0
        }
        Some(spec) if args.len() >= 2 => {
            match serde_json::from_slice::<LaunchSpec>(spec.as_bytes()) {
                Ok(spec) => match launch(&spec, &args[1], &args[2..]) {
                    Ok(code) => code,
                    Err(err) => fail(&err),
                },
                Err(err) => fail(&format!("bad launch spec: {err}")),
            }
        }
        _ => fail(&"usage: agentd sandbox-exec SPEC PROGRAM [ARGS...] | --probe"),
    };
    std::process::exit(code)
}

fn fail(err: &dyn std::fmt::Display) -> i32 {
    let _ = writeln!(io::stderr(), "agentd sandbox: {err}");
    LAUNCH_FAILED
}

/// A step of the confinement that failed, with the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
struct StepError {
    step: String,
    #[source]
    source: io::Error,
}

fn step(step: impl Into<String>) -> impl FnOnce(io::Error) -> StepError {
    let step = step.into();
    move |source| StepError { step, source }
}

fn other(step: &str, message: impl std::fmt::Display) -> StepError {
    StepError {
        step: step.to_string(),
        source: io::Error::other(message.to_string()),
    }
}

/// Turns a libc return value into a result; `-1` carries `errno`.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// A path to be granted, opened before any mount changes what its name points at.
struct Grant {
    path: PathBuf,
    fd: PathFd,
    is_dir: bool,
    access: BitFlags<AccessFs>,
}

fn grant(path: &Path, access: BitFlags<AccessFs>) -> Option<Grant> {
    // A listed path that does not exist (no /lib32 here, say) simply grants nothing.
    let meta = std::fs::metadata(path).ok()?;
    let fd = PathFd::new(path).ok()?;
    let is_dir = meta.is_dir();
    let access = if is_dir {
        access
    } else {
        access & AccessFs::from_file(TARGET_ABI)
    };
    Some(Grant {
        path: path.to_path_buf(),
        fd,
        is_dir,
        access,
    })
}

fn launch(spec: &LaunchSpec, program: &OsStr, args: &[OsString]) -> Result<i32, StepError> {
    for procs in &spec.cgroup_procs {
        std::fs::write(procs, std::process::id().to_string())
            .map_err(step(format!("join {}", procs.display())))?;
    }
    set_rlimit(libc::RLIMIT_CORE, 0).map_err(step("RLIMIT_CORE"))?;
    if let Some(limit) = spec.nproc {
        set_rlimit(libc::RLIMIT_NPROC, limit).map_err(step("RLIMIT_NPROC"))?;
    }
    if let Some(limit) = spec.data_limit {
        set_rlimit(libc::RLIMIT_DATA, limit).map_err(step("RLIMIT_DATA"))?;
    }
    if !spec.namespaces {
        let (grants, tmp) = open_grants(spec, Terminals::None)?;
        confine(spec, &grants, tmp.as_ref(), None)?;
        return Err(exec(program, args, &spec.cwd));
    }

    let uid = unsafe { libc::getuid() };
    let gid = unsafe { libc::getgid() };
    let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
    // With seccomp refusing socket(2) a network namespace adds nothing but its cost (about
    // 2 ms to make and tear down); it stands in where seccomp is not available.
    if !spec.network && spec.net_namespace && !spec.seccomp {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: unshare only changes this (single-threaded) process's namespaces.
    check(unsafe { libc::unshare(flags) }).map_err(step("unshare"))?;
    write_id_maps(uid, gid).map_err(step("uid/gid map"))?;

    let (status_read, status_write) = pipe().map_err(step("pipe"))?;
    // SAFETY: the launcher is single-threaded, so the child may allocate and run normally.
    let init = check(unsafe { libc::fork() }).map_err(step("fork"))?;
    if init == 0 {
        drop(status_read);
        // SAFETY: prctl with these arguments only sets this process's parent-death signal.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let code = match run_init(spec, program, args, &status_write) {
            Ok(code) => code,
            Err(err) => fail(&err),
        };
        // SAFETY: ends the init without running the parent's atexit handlers twice.
        unsafe { libc::_exit(code) };
    }
    drop(status_write);
    ignore_terminal_signals();
    let status = wait_for(init).map_err(step("wait"))?;
    // The init reports the command's own wait status, so a command killed by a signal is
    // reported as killed by that signal rather than as the init's exit code.
    let mut raw = [0u8; 4];
    let reported = read_exact(&status_read, &mut raw)
        .ok()
        .map(|_| i32::from_ne_bytes(raw));
    Ok(finish(reported.unwrap_or(status)))
}

/// Exits the way the command's wait status says: its code, or death by its signal.
fn finish(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        // SAFETY: restoring the default action and raising the signal ends this process as
        // the command ended; it is single-threaded.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
        }
        128 + signal
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// PID 1 of the command's namespace: sets up mounts and confinement, forks the command,
/// reaps every orphan until the command ends, and reports its status.
fn run_init(
    spec: &LaunchSpec,
    program: &OsStr,
    args: &[OsString],
    status_write: &OwnedFd,
) -> Result<i32, StepError> {
    make_private()?;
    let terminals = if spec.private_pts {
        mount_private_pts()?
    } else {
        Terminals::None
    };
    // Opened only now: a mount of the parent namespace cannot be bound into this one (and
    // `/dev/pts` must be what was just mounted there).
    let (grants, tmp) = open_grants(spec, terminals)?;
    let (grants, tmp) = (&grants[..], tmp.as_ref());
    mount_tmp(grants, tmp)?;
    protect(&spec.read_only)?;
    let proc_grant = if spec.mount_proc {
        mount_fs(
            "proc",
            "/proc",
            "proc",
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        )
        .map_err(step("mount /proc"))?;
        grant(Path::new("/proc"), AccessFs::from_read(TARGET_ABI))
    } else {
        None
    };
    confine(spec, grants, tmp, proc_grant.as_ref())?;
    // SAFETY: this process is single-threaded.
    let command = check(unsafe { libc::fork() }).map_err(step("fork command"))?;
    if command == 0 {
        let err = exec(program, args, &spec.cwd);
        let _ = writeln!(io::stderr(), "agentd sandbox: {err}");
        // SAFETY: ends the failed child at once.
        unsafe { libc::_exit(127) };
    }
    loop {
        let mut status = 0;
        // SAFETY: waits for any child of this init, orphans adopted from the namespace too.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == command {
            let _ = write_all(status_write, &status.to_ne_bytes());
            return Ok(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if pid == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(other("wait command", io::Error::last_os_error()));
        }
    }
}

/// What `/dev/pts` holds in the command's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminals {
    /// The host's instance, every session's terminals in it: neither `/dev/pts` nor
    /// `/dev/ptmx` is granted. A command's own terminal is an inherited descriptor, and
    /// `/dev/tty` reaches it all the same.
    None,
    /// A devpts instance of the command's own, with its `ptmx`: it may open terminals, and
    /// sees only those.
    Instance,
    /// Only the command's own terminal, at the path the host gave it (so `tty` names it).
    OwnOnly,
}

/// Every path the spec grants, opened, and the session's tmp; the terminal devices as
/// `terminals` allows.
fn open_grants(
    spec: &LaunchSpec,
    terminals: Terminals,
) -> Result<(Vec<Grant>, Option<Grant>), StepError> {
    let read = AccessFs::from_read(TARGET_ABI);
    let all = AccessFs::from_all(TARGET_ABI);
    let mut grants: Vec<Grant> = Vec::new();
    grants.extend(spec.read.iter().filter_map(|p| grant(p, read)));
    grants.extend(spec.write.iter().filter_map(|p| grant(p, all)));
    let allowed = |path: &Path| match terminals {
        Terminals::None => path != Path::new("/dev/pts") && path != Path::new("/dev/ptmx"),
        Terminals::Instance => true,
        Terminals::OwnOnly => path != Path::new("/dev/ptmx"),
    };
    grants.extend(
        spec.devices
            .iter()
            .filter(|p| allowed(p))
            .filter_map(|p| grant(p, all)),
    );
    let tmp = match &spec.tmp {
        Some(dir) => Some(grant(dir, all).ok_or_else(|| other("tmp", "missing"))?),
        None => None,
    };
    Ok((grants, tmp))
}

/// Hides the host's terminals (other sessions', the operator's) from the command. A command
/// on a terminal of its own (`exec_command` with `tty`) gets an empty `/dev/pts` with only
/// that terminal bound back at its path; any other gets a new devpts instance with its own
/// `ptmx`, so the terminals it opens are its namespace's alone.
fn mount_private_pts() -> Result<Terminals, StepError> {
    // SAFETY: isatty only inspects descriptor 0.
    if unsafe { libc::isatty(0) } == 1
        && let Ok(own) = std::fs::read_link("/proc/self/fd/0")
        && own.starts_with("/dev/pts/")
    {
        // Reached through this namespace's copy of the host's mount: a descriptor opened
        // in the parent namespace (descriptor 0) cannot be bound here.
        let terminal = PathFd::new(&own).map_err(|e| other("open terminal", e))?;
        mount_fs(
            "tmpfs",
            "/dev/pts",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NOEXEC,
        )
        .map_err(step("mount /dev/pts"))?;
        std::fs::File::create(&own).map_err(step(format!("mount point {}", own.display())))?;
        bind_fd(&terminal, &own).map_err(step(format!("bind {}", own.display())))?;
        return Ok(Terminals::OwnOnly);
    }
    mount_devpts().map_err(step("mount devpts"))?;
    let source = c"/dev/pts/ptmx";
    let target = c"/dev/ptmx";
    // SAFETY: mount(2) with NUL-terminated strings; binds one file over another.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })
    .map_err(step("bind /dev/ptmx"))?;
    Ok(Terminals::Instance)
}

/// A new devpts instance at `/dev/pts` (allowed in a user namespace of one's own).
fn mount_devpts() -> io::Result<()> {
    let options = c"newinstance,ptmxmode=0666,mode=0620";
    // SAFETY: mount(2) with NUL-terminated strings.
    check(unsafe {
        libc::mount(
            c"devpts".as_ptr(),
            c"/dev/pts".as_ptr(),
            c"devpts".as_ptr(),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        )
    })
    .map(drop)
}

/// Makes each of `paths` that exists a read-only mount of itself: writable grants above them
/// cannot change them, nor can a rename or unlink replace them (a mount point is busy).
fn protect(paths: &[PathBuf]) -> Result<(), StepError> {
    for path in paths {
        let Ok(fd) = PathFd::new(path) else {
            continue;
        };
        bind_fd(&fd, path).map_err(step(format!("bind {}", path.display())))?;
        remount_read_only(path).map_err(step(format!("read-only {}", path.display())))?;
    }
    Ok(())
}

/// Keeps this namespace's mounts from propagating back to the host's.
fn make_private() -> Result<(), StepError> {
    let root = c"/";
    // SAFETY: plain mount(2) calls on NUL-terminated strings.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })
    .map_err(step("make / private"))?;
    Ok(())
}

/// Mounts the session's tmp at `/tmp` and binds back granted paths that lived under the
/// host's `/tmp`.
fn mount_tmp(grants: &[Grant], tmp: Option<&Grant>) -> Result<(), StepError> {
    let Some(tmp) = tmp else {
        return Ok(());
    };
    bind_fd(&tmp.fd, Path::new("/tmp")).map_err(step("bind /tmp"))?;
    let mut under_tmp: Vec<&Grant> = grants
        .iter()
        .filter(|g| g.path.starts_with("/tmp") && g.path != Path::new("/tmp"))
        .collect();
    // Parents before children, so a nested grant is bound inside its parent's bind.
    under_tmp.sort_by_key(|g| g.path.components().count());
    let mut bound: Vec<&Path> = Vec::new();
    for grant in under_tmp {
        // A grant inside one already bound is visible through it (and may not be creatable
        // there, in a read-only bind).
        if bound.iter().any(|b| grant.path.starts_with(b)) {
            continue;
        }
        bound.push(&grant.path);
        if grant.is_dir {
            std::fs::create_dir_all(&grant.path)
        } else {
            if let Some(parent) = grant.path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(step(format!("mkdir {}", grant.path.display())))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&grant.path)
                .map(drop)
        }
        .map_err(step(format!("mount point {}", grant.path.display())))?;
        bind_fd(&grant.fd, &grant.path).map_err(step(format!("bind {}", grant.path.display())))?;
        // Landlock unites the rights of every directory on the way up, and the way up from
        // here passes the writable /tmp: a read-only grant must be a read-only mount too.
        if !grant.access.contains(AccessFs::WriteFile) {
            remount_read_only(&grant.path)
                .map_err(step(format!("read-only {}", grant.path.display())))?;
        }
    }
    Ok(())
}

fn bind_fd(fd: &PathFd, target: &Path) -> io::Result<()> {
    let source = cstring(&PathBuf::from(format!(
        "/proc/self/fd/{}",
        fd.as_fd().as_raw_fd()
    )))?;
    let target = cstring(target)?;
    // SAFETY: mount(2) with NUL-terminated strings; binds the opened inode at `target`.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// Makes a bind mount read-only, keeping the flags a user namespace may not clear.
fn remount_read_only(target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: statvfs fills the struct for a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(target.as_ptr(), &mut stat) })?;
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
    for (st, ms) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if stat.f_flag & st != 0 {
            flags |= ms;
        }
    }
    // SAFETY: mount(2) with a NUL-terminated target; remounts an existing bind.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    })
    .map(drop)
}

fn mount_fs(source: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> io::Result<()> {
    let source = CString::new(source).map_err(io::Error::other)?;
    let target = CString::new(target).map_err(io::Error::other)?;
    let fstype = CString::new(fstype).map_err(io::Error::other)?;
    // SAFETY: mount(2) with NUL-terminated strings.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// Landlock, dropped capabilities, `no_new_privs` and seccomp, in that order: each later
/// layer would forbid what an earlier one needs.
fn confine(
    spec: &LaunchSpec,
    grants: &[Grant],
    tmp: Option<&Grant>,
    proc_grant: Option<&Grant>,
) -> Result<(), StepError> {
    if spec.landlock {
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(TARGET_ABI))
            .map_err(|e| other("landlock", e))?;
        if !spec.network {
            ruleset = ruleset
                .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
                .map_err(|e| other("landlock", e))?;
        }
        ruleset = ruleset
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(|e| other("landlock", e))?;
        let mut created = ruleset.create().map_err(|e| other("landlock", e))?;
        for grant in grants.iter().chain(tmp).chain(proc_grant) {
            created = created
                .add_rule(PathBeneath::new(&grant.fd, grant.access))
                .map_err(|e| other("landlock rule", format!("{}: {e}", grant.path.display())))?;
        }
        let status = created.restrict_self().map_err(|e| other("landlock", e))?;
        if status.ruleset == RulesetStatus::NotEnforced {
            return Err(other("landlock", "the kernel enforced no rule"));
        }
    }
    drop_capabilities();
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only affects this process and its children.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
        .map_err(step("no_new_privs"))?;
    if spec.seccomp {
        seccomp::install(spec.network).map_err(|e| other("seccomp", e))?;
    }
    Ok(())
}

/// Empties the capability bounding set, so that even a command running as root (or as root
/// of its user namespace) gains no capability when it executes a program.
fn drop_capabilities() {
    for cap in 0..=63 {
        // SAFETY: PR_CAPBSET_DROP only narrows this process's bounding set; an unknown
        // capability number is answered EINVAL, which ends nothing.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    // SAFETY: clears this process's ambient capabilities.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
}

fn exec(program: &OsStr, args: &[OsString], cwd: &Path) -> StepError {
    if let Err(err) = std::env::set_current_dir(cwd) {
        return other("chdir", format!("{}: {err}", cwd.display()));
    }
    let err = std::process::Command::new(program).args(args).exec();
    other("exec", format!("{}: {err}", program.to_string_lossy()))
}

fn set_rlimit(resource: libc::__rlimit_resource_t, limit: u64) -> io::Result<()> {
    let value = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: setrlimit with a valid struct.
    check(unsafe { libc::setrlimit(resource, &value) }).map(drop)
}

/// Maps the caller's own user and group to themselves in its new user namespace.
fn write_id_maps(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = std::io::pipe()?;
    Ok((OwnedFd::from(read), OwnedFd::from(write)))
}

fn read_exact(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<()> {
    let mut file = std::fs::File::from(fd.try_clone()?);
    io::Read::read_exact(&mut file, buf)
}

fn write_all(fd: &OwnedFd, buf: &[u8]) -> io::Result<()> {
    let mut file = std::fs::File::from(fd.try_clone()?);
    file.write_all(buf)
}

fn wait_for(pid: libc::pid_t) -> io::Result<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret == pid {
            return Ok(status);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

extern "C" fn ignore(_: libc::c_int) {}

/// The launcher shares the command's terminal and process group: a Ctrl-C meant for the
/// command must not end the launcher (and with it the whole namespace). A handler, unlike
/// `SIG_IGN`, is not inherited across exec.
fn ignore_terminal_signals() {
    for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGTSTP] {
        // SAFETY: installs an empty handler; the launcher is single-threaded.
        unsafe { libc::signal(signal, ignore as *const () as libc::sighandler_t) };
    }
}

/// What this kernel lets an unprivileged process do, tried for real in throwaway children.
fn probe() -> ProbeReport {
    // SAFETY: landlock_create_ruleset with a null attribute and the VERSION flag only asks
    // for the ABI version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    // SAFETY: prctl(PR_GET_SECCOMP) only reads this process's seccomp mode.
    let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
    let with_net = try_namespaces(true);
    let bits = if with_net & NS_OK != 0 {
        with_net
    } else {
        try_namespaces(false)
    };
    ProbeReport {
        landlock_abi: i32::try_from(abi).unwrap_or(0).max(0),
        namespaces: bits & NS_OK != 0,
        net_namespace: with_net & NS_OK != 0,
        mount_proc: bits & PROC_OK != 0,
        private_pts: bits & PTS_OK != 0,
        seccomp,
    }
}

const NS_OK: i32 = 1;
const PROC_OK: i32 = 2;
const PTS_OK: i32 = 4;

/// Forks a child that enters the namespaces (and a grandchild that mounts a fresh /proc);
/// the child's exit code is a bit set of what worked.
fn try_namespaces(net: bool) -> i32 {
    // SAFETY: the probe is single-threaded; the child only makes system calls and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return 0;
    }
    if child == 0 {
        let uid = unsafe { libc::getuid() };
        let gid = unsafe { libc::getgid() };
        let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        if net {
            flags |= libc::CLONE_NEWNET;
        }
        let mut bits = 0;
        // SAFETY: as in `launch`.
        if unsafe { libc::unshare(flags) } == 0 && write_id_maps(uid, gid).is_ok() {
            bits |= NS_OK;
            // SAFETY: single-threaded child.
            let init = unsafe { libc::fork() };
            if init == 0 {
                let private = unsafe {
                    libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    )
                } == 0;
                let proc = private
                    && mount_fs(
                        "proc",
                        "/proc",
                        "proc",
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    )
                    .is_ok();
                let pts = private && mount_devpts().is_ok();
                let code = if proc { PROC_OK } else { 0 } | if pts { PTS_OK } else { 0 };
                unsafe { libc::_exit(code) };
            }
            if init > 0
                && let Ok(status) = wait_for(init)
                && libc::WIFEXITED(status)
            {
                bits |= libc::WEXITSTATUS(status) & (PROC_OK | PTS_OK);
            }
        }
        unsafe { libc::_exit(bits) };
    }
    match wait_for(child) {
        Ok(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
        _ => 0,
    }
}
