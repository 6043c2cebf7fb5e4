//! The hold one process keeps on its data directory, so a second `serve` (or an in-process
//! command) cannot run start-up recovery over a live server's store and files.
//!
//! The hold is an exclusive `flock` on `<data_dir>/agentd.lock`, whose text is the holder's
//! pid. The kernel drops it when the process ends, however it ends: a lock file a dead process
//! left behind blocks nothing.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "agentd.lock";

/// Most bytes of the lock file read when naming the holder: a pid and a newline.
const MAX_PID_BYTES: usize = 32;

/// How often, and how far apart, a hold this process's own lock file names is tried again.
const SAME_PROCESS_TRIES: u32 = 50;
const SAME_PROCESS_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// The pid the lock file names, if it names one.
fn holder(file: &File) -> Option<u32> {
    let mut bytes = [0u8; MAX_PID_BYTES];
    let len = file.read_at(&mut bytes, 0).ok()?;
    std::str::from_utf8(&bytes[..len]).ok()?.trim().parse().ok()
}

/// Why the data directory could not be held.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// Another process holds it; `pid` is what its lock file says, when it says it yet.
    #[error("{}", held_message(*.pid, .dir))]
    Held {
        /// The holder's pid, from the lock file.
        pid: Option<u32>,
        /// The data directory.
        dir: PathBuf,
    },
    /// The directory or its lock file could not be made, opened or locked.
    #[error("cannot lock the data directory {}: {source}", .path.display())]
    Io {
        /// The lock file (or the directory, when making it failed).
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn held_message(pid: Option<u32>, dir: &Path) -> String {
    match pid {
        Some(pid) => format!("data directory in use by pid {pid} ({})", dir.display()),
        None => format!(
            "data directory in use by another process ({})",
            dir.display()
        ),
    }
}

/// The exclusive hold on a data directory; released when dropped or when the process ends.
#[derive(Debug)]
pub struct DataDirLock {
    /// Open for as long as the hold lasts: closing it is what releases the lock.
    _file: File,
}

impl DataDirLock {
    /// Makes `dir` when missing and holds it, writing this process's pid into its lock file;
    /// [`DataDirError::Held`] (touching nothing else) when another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, DataDirError> {
        std::fs::create_dir_all(dir).map_err(|source| DataDirError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(LOCK_FILE);
        let io = |source| DataDirError::Io {
            path: path.clone(),
            source,
        };
        // Not truncated on open: the holder's pid must still be there to be read.
        // O_NOFOLLOW: a link planted in its place must not make the pid land elsewhere.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io)?;
        let mut tries = 0;
        loop {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let pid = holder(&file);
                    // A hold of this very process's that was just released can live on for a
                    // moment in a child forked before it exec'd (the lock belongs to the open
                    // file, which the child shares until exec closes it): a restart within one
                    // process waits for that. A hold that lasts is a real one.
                    if pid == Some(std::process::id()) && tries < SAME_PROCESS_TRIES {
                        tries += 1;
                        std::thread::sleep(SAME_PROCESS_WAIT);
                        continue;
                    }
                    return Err(DataDirError::Held {
                        pid,
                        dir: dir.to_path_buf(),
                    });
                }
                Err(err) => return Err(io(err.into())),
            }
        }
        // Written over the old text, then cut to length, so a reader never sees it empty.
        let pid = format!("{}\n", std::process::id());
        file.write_all_at(pid.as_bytes(), 0).map_err(io)?;
        file.set_len(pid.len() as u64).map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_hold_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let held = DataDirLock::acquire(&data).unwrap();
        let pid = std::process::id();
        assert_eq!(
            std::fs::read_to_string(data.join(LOCK_FILE)).unwrap(),
            format!("{pid}\n")
        );
        // flock conflicts between two opens of the file even within one process.
        let err = DataDirLock::acquire(&data).unwrap_err();
        assert!(
            matches!(err, DataDirError::Held { pid: Some(p), .. } if p == pid),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("data directory in use by pid {pid} (")),
            "{err}"
        );
        // The refused attempt left the holder's pid as it was.
        assert_eq!(
            std::fs::read_to_string(data.join(LOCK_FILE)).unwrap(),
            format!("{pid}\n")
        );
        drop(held);
        let again = DataDirLock::acquire(&data).unwrap();
        drop(again);
    }

    #[test]
    fn a_lock_file_a_dead_process_left_blocks_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), format!("{dead}\n9999999999")).unwrap();
        let _held = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    #[test]
    fn a_symlink_in_place_of_the_lock_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirError::Io { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
