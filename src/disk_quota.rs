//! Disk space per user: `[limits.user] disk_max_mb` over one user's workspace, task output and
//! checkpoints, and `[server] min_free_mb` held back on the data and workspace filesystems for
//! the database and the event log, so that one user can neither fill the disk for the others
//! nor make the server's own writes fail.
//!
//! A user's usage is measured once, when first needed (a bounded walk of their workspace
//! root), then moved by the bytes each write adds or removes; commands write behind the
//! server's back, so the tree is measured again before the next write or command after one
//! has started.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::mutex::lock;

/// Most directory entries one measurement walks; a tree with more counts as full, so a user
/// cannot hide bytes past the bound.
pub const MAX_MEASURED_ENTRIES: u64 = 1_000_000;

const MIB: u64 = 1024 * 1024;

/// Why a write or a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// The write would take the user past `disk_max_mb`.
    #[error(
        "disk quota exceeded: this user's files take {used} bytes and this write adds {adding}, \
         over limits.user.disk_max_mb ({max} bytes); delete files first"
    )]
    OverQuota {
        /// Bytes the user's files take now.
        used: u64,
        /// Bytes the refused write would add.
        adding: u64,
        /// The quota in bytes.
        max: u64,
    },
    /// The user is at or past `disk_max_mb`, so no command may start.
    #[error(
        "disk quota exceeded: this user's files take {used} bytes, at or over \
         limits.user.disk_max_mb ({max} bytes); delete files before running commands"
    )]
    Full {
        /// Bytes the user's files take now.
        used: u64,
        /// The quota in bytes.
        max: u64,
    },
    /// The write would leave less than `min_free_mb` free on the server's filesystem.
    #[error(
        "not enough free disk space: {free} bytes free, and server.min_free_mb keeps {keep} \
         bytes for the server's database and event log"
    )]
    LowSpace {
        /// Bytes free now.
        free: u64,
        /// Bytes held back.
        keep: u64,
    },
}

/// Where the free space of the server's filesystems is read; tests give a fake.
pub trait FreeSpace: Send + Sync + fmt::Debug {
    /// Bytes an unprivileged writer may still use on the tightest of the filesystems.
    fn available(&self) -> io::Result<u64>;
}

/// Free space as `statvfs` reports it, the least over several paths (the data dir and the
/// workspace may be on different filesystems).
#[derive(Debug, Clone)]
pub struct Statvfs {
    paths: Vec<PathBuf>,
}

impl Statvfs {
    /// Free space on the filesystems holding `paths`.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self { paths }
    }
}

impl FreeSpace for Statvfs {
    fn available(&self) -> io::Result<u64> {
        let mut least = u64::MAX;
        for path in &self.paths {
            let stat = rustix::fs::statvfs(path)?;
            least = least.min(stat.f_bavail.saturating_mul(stat.f_frsize));
        }
        Ok(least)
    }
}

/// The limits, and each user's account; one per server.
#[derive(Debug)]
pub struct DiskQuotas {
    max_bytes: u64,
    keep_free: u64,
    free: Arc<dyn FreeSpace>,
    /// One account per user name (`None`: the single user of a server without users); the
    /// names come from the configuration, so the map does not grow with requests.
    users: Mutex<HashMap<Option<String>, Arc<UserDisk>>>,
}

impl DiskQuotas {
    /// `disk_max_mb` per user and `min_free_mb` held back (0 lifts either), free space read
    /// from `free`; `None` when both are lifted, so writes pay nothing.
    pub fn new(disk_max_mb: u64, min_free_mb: u64, free: Arc<dyn FreeSpace>) -> Option<Self> {
        (disk_max_mb > 0 || min_free_mb > 0).then(|| Self {
            max_bytes: disk_max_mb.saturating_mul(MIB),
            keep_free: min_free_mb.saturating_mul(MIB),
            free,
            users: Mutex::new(HashMap::new()),
        })
    }

    /// The account of `user`, whose workspace is `root`; made on first use, shared by all of
    /// the user's sessions.
    pub fn user(&self, user: Option<&str>, root: &Path) -> Arc<UserDisk> {
        let mut users = lock(&self.users);
        let account = users.entry(user.map(str::to_string)).or_insert_with(|| {
            Arc::new(UserDisk {
                root: root.to_path_buf(),
                max_bytes: self.max_bytes,
                keep_free: self.keep_free,
                free: Arc::clone(&self.free),
                usage: Mutex::new(Usage::default()),
            })
        });
        Arc::clone(account)
    }

    /// What is enforced, for the start-up log.
    pub fn describe(&self) -> String {
        let quota = match self.max_bytes {
            0 => "no per-user disk quota".to_string(),
            bytes => format!("per-user disk quota {} MiB", bytes / MIB),
        };
        format!("{quota}, {} MiB kept free", self.keep_free / MIB)
    }
}

#[derive(Debug, Default)]
struct Usage {
    /// Bytes of the user's workspace tree: measured, then moved by each write; `None` until
    /// first needed.
    tree: Option<u64>,
    /// Bytes of task output and checkpoint contents written for the user since start-up.
    beside: u64,
    /// A command started since the tree was last measured.
    stale: bool,
}

/// One user's disk account.
#[derive(Debug)]
pub struct UserDisk {
    root: PathBuf,
    max_bytes: u64,
    keep_free: u64,
    free: Arc<dyn FreeSpace>,
    usage: Mutex<Usage>,
}

impl UserDisk {
    /// Admits a write that adds `adding` bytes and removes `removing` (a file replaced or
    /// deleted), and counts it in the user's tree; a refused write counts nothing.
    pub fn charge_tree(&self, adding: u64, removing: u64) -> Result<(), QuotaError> {
        let mut usage = lock(&self.usage);
        if self.max_bytes > 0 {
            // Measured (again) before the write, which then moves the count.
            self.used(&mut usage);
        }
        let grows = adding.saturating_sub(removing);
        if grows > 0 {
            self.admit(&mut usage, grows)?;
        }
        if let Some(tree) = usage.tree.as_mut() {
            *tree = tree.saturating_add(adding).saturating_sub(removing);
        }
        Ok(())
    }

    /// Counts out bytes a removal freed.
    pub fn refund_tree(&self, bytes: u64) {
        self.undo_tree(bytes, 0);
    }

    /// Takes back a [`UserDisk::charge_tree`] whose write then failed.
    pub fn undo_tree(&self, added: u64, removed: u64) {
        if let Some(tree) = lock(&self.usage).tree.as_mut() {
            *tree = tree.saturating_sub(added).saturating_add(removed);
        }
    }

    /// Admits `adding` bytes of task output or checkpoint contents and counts them.
    pub fn charge_beside(&self, adding: u64) -> Result<(), QuotaError> {
        let mut usage = lock(&self.usage);
        self.admit(&mut usage, adding)?;
        usage.beside = usage.beside.saturating_add(adding);
        Ok(())
    }

    /// Lets a command start unless the user is at their quota or the disk is at its reserve;
    /// the command may write anything, so the tree is measured again before the next
    /// write or command.
    pub fn admit_command(&self) -> Result<(), QuotaError> {
        let mut usage = lock(&self.usage);
        if self.max_bytes > 0 {
            let used = self.used(&mut usage);
            if used >= self.max_bytes {
                // Measured again at the next attempt, so files deleted meanwhile (by an
                // operator, say) let commands run again.
                usage.stale = true;
                return Err(QuotaError::Full {
                    used,
                    max: self.max_bytes,
                });
            }
        }
        self.admit(&mut usage, 0)?;
        usage.stale = true;
        Ok(())
    }

    /// Bytes counted for the user now, measuring their tree when needed.
    pub fn usage(&self) -> u64 {
        let mut usage = lock(&self.usage);
        self.used(&mut usage)
    }

    fn admit(&self, usage: &mut Usage, adding: u64) -> Result<(), QuotaError> {
        if self.keep_free > 0 {
            match self.free.available() {
                Ok(free) if free < adding.saturating_add(self.keep_free) => {
                    return Err(QuotaError::LowSpace {
                        free,
                        keep: self.keep_free,
                    });
                }
                Ok(_) => {}
                // Refusing every write because the filesystem cannot be asked would stop
                // the server for everyone; the quota below still holds.
                Err(err) => tracing::warn!(%err, "free disk space could not be read"),
            }
        }
        if self.max_bytes > 0 {
            let used = self.used(usage);
            if used.saturating_add(adding) > self.max_bytes {
                // As for a refused command: measured again at the next attempt.
                usage.stale = true;
                return Err(QuotaError::OverQuota {
                    used,
                    adding,
                    max: self.max_bytes,
                });
            }
        }
        Ok(())
    }

    fn used(&self, usage: &mut Usage) -> u64 {
        if usage.tree.is_none() || usage.stale {
            let measured = measure(&self.root, MAX_MEASURED_ENTRIES);
            usage.tree = Some(if measured.complete {
                measured.bytes
            } else {
                tracing::warn!(root = %self.root.display(), "a user's workspace has too many files to measure; it counts as full");
                measured.bytes.max(self.max_bytes)
            });
            usage.stale = false;
        }
        usage.tree.unwrap_or(0).saturating_add(usage.beside)
    }
}

/// What a walk of a tree found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Bytes the tree's entries occupy on disk (allocated blocks, so a sparse file counts
    /// what it holds, not its length).
    pub bytes: u64,
    /// Whether every entry was seen (false: the walk stopped at its bound).
    pub complete: bool,
}

/// Walks `root` without following links or leaving its filesystem, adding up the blocks of
/// at most `max_entries` entries.
pub fn measure(root: &Path, max_entries: u64) -> Measured {
    let device = match std::fs::symlink_metadata(root) {
        Ok(meta) => meta.dev(),
        Err(_) => {
            return Measured {
                bytes: 0,
                complete: true,
            };
        }
    };
    let mut bytes = 0u64;
    let mut seen = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > max_entries {
                return Measured {
                    bytes,
                    complete: false,
                };
            }
            // DirEntry::metadata does not follow a symlink.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            bytes = bytes.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() && meta.dev() == device {
                pending.push(entry.path());
            }
        }
    }
    Measured {
        bytes,
        complete: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Free space that is whatever the test says.
    #[derive(Debug)]
    struct FakeFree(u64);

    impl FreeSpace for FakeFree {
        fn available(&self) -> io::Result<u64> {
            Ok(self.0)
        }
    }

    fn quotas(max_mb: u64, keep_mb: u64, free: u64) -> DiskQuotas {
        DiskQuotas::new(max_mb, keep_mb, Arc::new(FakeFree(free))).unwrap()
    }

    #[test]
    fn lifted_limits_make_no_accounts() {
        assert!(DiskQuotas::new(0, 0, Arc::new(FakeFree(0))).is_none());
    }

    #[test]
    fn the_first_charge_measures_the_tree_and_later_ones_move_the_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![7u8; 64 * 1024]).unwrap();
        let quotas = quotas(1, 0, u64::MAX);
        let disk = quotas.user(Some("alice"), dir.path());
        let start = disk.usage();
        assert!(start >= 64 * 1024, "{start}");
        disk.charge_tree(1000, 0).unwrap();
        assert_eq!(disk.usage(), start + 1000);
        disk.charge_tree(0, 400).unwrap();
        assert_eq!(disk.usage(), start + 600);
        let err = disk.charge_tree(MIB, 0).unwrap_err();
        assert!(matches!(err, QuotaError::OverQuota { .. }), "{err}");
        // A refused write counts nothing, and the tree is measured again (these charges
        // wrote no file).
        assert_eq!(disk.usage(), start);
        // Another user's account is their own.
        let other = tempfile::tempdir().unwrap();
        quotas
            .user(Some("bob"), other.path())
            .charge_tree(MIB / 2, 0)
            .unwrap();
    }

    #[test]
    fn a_sparse_terabyte_counts_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("sparse")).unwrap();
        file.set_len(1 << 40).unwrap();
        let measured = measure(dir.path(), 100);
        assert!(measured.complete);
        assert!(measured.bytes < MIB, "{measured:?}");
    }

    #[test]
    fn a_tree_past_the_walk_bound_counts_as_full() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(dir.path().join(i.to_string()), b"x").unwrap();
        }
        assert!(!measure(dir.path(), 3).complete);
        assert!(measure(dir.path(), 5).complete);
    }

    #[test]
    fn a_command_is_refused_at_the_quota_and_the_tree_is_measured_again_after_one() {
        let dir = tempfile::tempdir().unwrap();
        let quotas = quotas(1, 0, u64::MAX);
        let disk = quotas.user(None, dir.path());
        disk.admit_command().unwrap();
        // What the command wrote, behind the account's back.
        std::fs::write(dir.path().join("big"), vec![1u8; 2 * MIB as usize]).unwrap();
        let err = disk.admit_command().unwrap_err();
        assert!(matches!(err, QuotaError::Full { .. }), "{err}");
        assert!(disk.charge_tree(1, 0).is_err());
        std::fs::remove_file(dir.path().join("big")).unwrap();
        disk.admit_command().unwrap();
    }

    #[test]
    fn writes_that_would_eat_the_reserve_are_refused_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let quotas = quotas(0, 512, 600 * MIB);
        let disk = quotas.user(None, dir.path());
        disk.charge_tree(50 * MIB, 0).unwrap();
        let err = disk.charge_tree(100 * MIB, 0).unwrap_err();
        assert_eq!(
            err,
            QuotaError::LowSpace {
                free: 600 * MIB,
                keep: 512 * MIB
            }
        );
        assert!(disk.charge_beside(100 * MIB).is_err());
        // Shrinking a file needs no room.
        disk.charge_tree(10, 100 * MIB).unwrap();
    }

    #[test]
    fn the_real_filesystem_has_room_for_the_default_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let free = Arc::new(Statvfs::new(vec![dir.path().to_path_buf()]));
        assert!(free.available().unwrap() > 0);
        let quotas = DiskQuotas::new(0, 512, free).unwrap();
        quotas.user(None, dir.path()).charge_tree(4096, 0).unwrap();
    }
}
