//! The seccomp filter of a sandboxed command: system calls that reach past the sandbox
//! (debugging other processes, mounting, loading kernel code, making namespaces) fail with
//! `EPERM`, and without network so does every socket that is not a Unix socket.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// System calls no sandboxed command needs and that could reach outside it.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_bpf,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_lookup_dcookie,
    // io_uring runs operations (sockets among them) that this filter would never see.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Namespace flags a `clone` must not carry: a new namespace would undo the sandbox's.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWCGROUP,
];

/// Why a filter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("seccomp filter: {0}")]
pub struct FilterError(String);

fn arch() -> Result<TargetArch, FilterError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|err| FilterError(format!("{err}")))
}

fn err(e: impl std::fmt::Display) -> FilterError {
    FilterError(e.to_string())
}

/// The programs to install, in order: the `EPERM` rules, then `clone3` answered `ENOSYS`
/// (its flags sit in memory a filter cannot read, so the C library must fall back to `clone`,
/// whose flags the first program checks).
pub fn programs(network: bool) -> Result<Vec<BpfProgram>, FilterError> {
    let arch = arch()?;
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&call| (call, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    denied.insert(libc::SYS_clone, clone_rules);
    if !network {
        let not_unix = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )
        .and_then(|condition| SeccompRule::new(vec![condition]))
        .map_err(err)?;
        // No socket at all: Landlock does not guard connecting to a Unix socket by path (the
        // database's, a container engine's), so a Unix socket could reach past the sandbox.
        // A socketpair has no address and links only processes that share it.
        denied.insert(libc::SYS_socket, Vec::new());
        denied.insert(libc::SYS_socketpair, vec![not_unix]);
    }
    let eperm = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    Ok(vec![
        eperm.try_into().map_err(err)?,
        clone3.try_into().map_err(err)?,
    ])
}

/// Installs the filters on the calling thread; `no_new_privs` must already be set.
pub fn install(network: bool) -> Result<(), FilterError> {
    for program in programs(network)? {
        seccompiler::apply_filter(&program).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_with_and_without_network() {
        for network in [false, true] {
            let programs = programs(network).unwrap();
            assert_eq!(programs.len(), 2);
            assert!(programs.iter().all(|p| !p.is_empty()));
        }
        // The socket rules make the no-network program longer.
        assert!(programs(false).unwrap()[0].len() > programs(true).unwrap()[0].len());
    }

    #[test]
    fn without_network_the_filter_refuses_every_socket_but_a_socketpair() {
        // Installed in a child process, which then reports what each call answered. The
        // programs are built before the fork: the child of a multi-threaded test process may
        // only make system calls.
        let programs = programs(false).unwrap();
        // SAFETY: the child only makes system calls and exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: each call only affects this child.
            let code = unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                for program in &programs {
                    if seccompiler::apply_filter(program).is_err() {
                        libc::_exit(10);
                    }
                }
                let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let inet = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                let mut pair = [0; 2];
                let paired =
                    libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr());
                i32::from(unix == -1) | i32::from(inet == -1) << 1 | i32::from(paired == 0) << 2
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0b111,
            "unix refused, inet refused, pair made"
        );
    }
}
