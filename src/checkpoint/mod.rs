//! Checkpoints of a session's workspace, taken when each turn starts: what a turn changed
//! (`turn/diff`, whatever made the change: an edit tool, `shell`, a build) and how to put the
//! workspace back as it was before a turn (`session/revert`).
//!
//! A checkpoint records the workspace's files, walked without following links and with
//! `.gitignore` rules (so `target/` or `node_modules/` of a repository that ignores them are
//! not copied), `.git/` left out, within the store's [`Limits`]: a file past a limit (or
//! whose path is not UTF-8) is neither diffed nor reverted, and the checkpoint says it was
//! cut. Contents live in the [`store::CheckpointStore`] under the data dir, once per distinct
//! content; a snapshot in memory holds only each path's hash and metadata, and a session keeps
//! the last [`KEPT`] turns' checkpoints there, loaded again when its actor is.

pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

pub use store::{CheckpointStore, ExportedCheckpoints};

use crate::tools::workspace::Workspace;

/// Checkpoints kept per session, the newest turns'.
pub const KEPT: usize = 20;
/// Most bytes of `turn/diff`'s `diff`; the file list is always whole.
pub const MAX_DIFF_BYTES: usize = 256 * 1024;

/// What one checkpoint copies at most (`[checkpoints]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most files.
    pub max_files: usize,
    /// The largest file.
    pub max_file_bytes: u64,
    /// Most bytes in all.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_files: 20_000,
            max_file_bytes: 1024 * 1024,
            max_total_bytes: 128 * 1024 * 1024,
        }
    }
}

/// A file's content hash (SHA-256).
type Hash = [u8; 32];

/// The workspace's files at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Each copied file by path relative to the workspace root.
    files: BTreeMap<String, Entry>,
    /// Files past a limit, not copied: never reported as changed nor reverted.
    skipped: BTreeSet<String>,
}

/// One copied file: its content's hash and what its metadata said when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    hash: Hash,
    stamp: Stamp,
}

/// A file's size, inode and modification and change times: while all four stay the same the
/// file was not written (the change time moves on every write and cannot be set back), so the
/// previous checkpoint's hash is taken without reading the file again.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    inode: u64,
    modified_ns: i64,
    changed_ns: i64,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            size: metadata.len(),
            inode: metadata.ino(),
            modified_ns: metadata
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(metadata.mtime_nsec()),
            changed_ns: metadata
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(metadata.ctime_nsec()),
        }
    }
}

/// How one file changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileChange {
    /// Relative to the session's root.
    pub path: String,
    /// `added`, `modified` or `deleted`.
    pub change: &'static str,
}

impl Snapshot {
    /// The files of `workspace` now, their contents put in `store`. A file whose metadata is
    /// what it was in `previous` keeps that hash unread, so a checkpoint reads only what
    /// changed, and the store holds each version of a file once. Contents new to the store
    /// are charged to the workspace's disk account; a file it has no room for is skipped.
    pub fn take(
        workspace: &Workspace,
        previous: Option<&Snapshot>,
        store: &CheckpointStore,
    ) -> Self {
        let limits = store.limits();
        let root = workspace.root().to_path_buf();
        let mut snapshot = Self::default();
        let mut total = 0u64;
        let walk = ignore::WalkBuilder::new(&root)
            .hidden(false)
            .follow_links(false)
            .require_git(false)
            // The server user's git configuration says nothing about a session's workspace,
            // and reading it again for every turn's snapshot was a tenth of the snapshot.
            .git_global(false)
            .filter_entry(|entry| entry.file_name() != ".git")
            .build();
        for entry in walk.flatten() {
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let Some(rel) = entry
                .path()
                .strip_prefix(&root)
                .ok()
                .and_then(Path::to_str)
                .map(str::to_string)
            else {
                continue;
            };
            let metadata = entry.metadata().ok();
            let size = metadata.as_ref().map_or(u64::MAX, |m| m.len());
            if snapshot.files.len() >= limits.max_files
                || size > limits.max_file_bytes
                || total + size > limits.max_total_bytes
            {
                snapshot.skipped.insert(rel);
                continue;
            }
            let stamp = metadata.as_ref().map(Stamp::of);
            let known = previous
                .and_then(|previous| previous.files.get(&rel))
                .filter(|known| Some(known.stamp) == stamp);
            if let Some(known) = known {
                total += known.stamp.size;
                snapshot.files.insert(rel, *known);
                continue;
            }
            // Read through the workspace: a file swapped for a link meanwhile is refused.
            let stored = workspace
                .read(Path::new(&rel), limits.max_file_bytes)
                .ok()
                .and_then(|bytes| {
                    let hash = store.put_charged(&bytes, workspace.disk().map(|d| &**d));
                    Some((bytes.len() as u64, hash.ok()?))
                });
            match (stored, stamp) {
                (Some((size, hash)), Some(stamp)) => {
                    total += size;
                    let stamp = Stamp { size, ..stamp };
                    snapshot.files.insert(rel, Entry { hash, stamp });
                }
                _ => {
                    snapshot.skipped.insert(rel);
                }
            }
        }
        snapshot
    }

    /// Up to `most` files past a limit in `self` or `later`, in order: what a diff between
    /// them cannot see.
    pub fn skipped_with(&self, later: &Snapshot, most: usize) -> Vec<String> {
        self.skipped
            .union(&later.skipped)
            .take(most)
            .cloned()
            .collect()
    }

    /// What changed from `self` to `later`, by path.
    pub fn changes(&self, later: &Snapshot) -> Vec<FileChange> {
        let mut changes = Vec::new();
        for (path, before) in &self.files {
            match later.files.get(path) {
                Some(after) if after.hash == before.hash => {}
                Some(_) => changes.push(change(path, "modified")),
                None if later.skipped.contains(path) => {}
                None => changes.push(change(path, "deleted")),
            }
        }
        for path in later.files.keys() {
            if !self.files.contains_key(path) && !self.skipped.contains(path) {
                changes.push(change(path, "added"));
            }
        }
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        changes
    }

    /// The stored contents of `path` here; empty when it is not here (or its blob is gone).
    fn contents(&self, path: &str, store: &CheckpointStore) -> Vec<u8> {
        self.files
            .get(path)
            .and_then(|entry| store.get(&entry.hash).ok())
            .unwrap_or_default()
    }

    /// A unified diff from `self` to `later` of the `changes` (text files; a binary one is
    /// named), at most [`MAX_DIFF_BYTES`].
    pub fn diff(
        &self,
        later: &Snapshot,
        changes: &[FileChange],
        store: &CheckpointStore,
    ) -> String {
        let mut out = String::new();
        for change in changes {
            let before = self.contents(&change.path, store);
            let after = later.contents(&change.path, store);
            let (Ok(old), Ok(new)) = (std::str::from_utf8(&before), std::str::from_utf8(&after))
            else {
                out.push_str(&format!("Binary file {} {}\n", change.path, change.change));
                continue;
            };
            let (from, to) = match change.change {
                "added" => ("/dev/null".to_string(), format!("b/{}", change.path)),
                "deleted" => (format!("a/{}", change.path), "/dev/null".to_string()),
                _ => (format!("a/{}", change.path), format!("b/{}", change.path)),
            };
            let diff = similar::TextDiff::from_lines(old, new);
            out.push_str(
                &diff
                    .unified_diff()
                    .context_radius(3)
                    .header(&from, &to)
                    .to_string(),
            );
            if out.len() > MAX_DIFF_BYTES {
                let mut cut = MAX_DIFF_BYTES;
                while !out.is_char_boundary(cut) {
                    cut -= 1;
                }
                out.truncate(cut);
                out.push_str("\n[diff cut: see workspace_diff or the files themselves]\n");
                break;
            }
        }
        out
    }

    /// Puts `workspace` back as it was at `self`: files made since are removed, changed or
    /// removed ones written back from `store`. With `dry_run` nothing is touched; either way
    /// the answer is what differs (as the change that reverting undoes).
    pub fn restore(
        &self,
        workspace: &Workspace,
        store: &CheckpointStore,
        dry_run: bool,
    ) -> Result<Vec<FileChange>, RestoreError> {
        let now = Snapshot::take(workspace, Some(self), store);
        let changes = self.changes(&now);
        if dry_run {
            return Ok(changes);
        }
        for change in &changes {
            let rel = Path::new(&change.path);
            let failed = |cause| RestoreError {
                path: change.path.clone(),
                cause,
            };
            match change.change {
                "added" => workspace
                    .remove("session/revert", rel)
                    .map_err(|err| failed(RestoreCause::Workspace(err)))?,
                _ => {
                    let hash = self.files[&change.path].hash;
                    let bytes = store
                        .get(&hash)
                        .map_err(|err| failed(RestoreCause::CopyGone(err)))?;
                    workspace
                        .write("session/revert", rel, &bytes)
                        .map_err(|err| failed(RestoreCause::Workspace(err)))?;
                }
            }
        }
        Ok(changes)
    }
}

/// Where a restore stopped: the file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {cause}")]
pub struct RestoreError {
    /// The file, relative to the workspace root.
    pub path: String,
    /// Why it could not be put back.
    pub cause: RestoreCause,
}

/// Why one file could not be put back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreCause {
    /// The workspace refused the write or removal.
    #[error("{0}")]
    Workspace(crate::fs_safe::FsError),
    /// The stored copy of its contents is gone.
    #[error("its checkpoint copy is gone ({0})")]
    CopyGone(std::io::Error),
}

fn change(path: &str, change: &'static str) -> FileChange {
    FileChange {
        path: path.to_string(),
        change,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_diffs_and_a_revert_see_every_kind_of_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("keep.txt"), "same\n").unwrap();
        std::fs::write(root.join("edit.txt"), "one\ntwo\n").unwrap();
        std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
        std::fs::create_dir(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref\n").unwrap();
        std::fs::write(root.join(".gitignore"), "build/\n").unwrap();
        std::fs::create_dir(root.join("build")).unwrap();
        let workspace = Workspace::new(root);
        let kept = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(kept.path(), Limits::default()).unwrap();
        let before = Snapshot::take(&workspace, None, &store);
        assert!(!before.files.contains_key(".git/HEAD"));

        // As a shell command would: behind the tools' back.
        std::fs::write(root.join("edit.txt"), "one\nTWO\n").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::write(root.join("new.txt"), "hello\n").unwrap();
        std::fs::write(root.join("build/out.o"), "ignored\n").unwrap();
        let after = Snapshot::take(&workspace, Some(&before), &store);
        // An unchanged file is the same entry in both.
        assert_eq!(before.files["keep.txt"], after.files["keep.txt"]);
        let changes = before.changes(&after);
        let listed: Vec<(&str, &str)> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.change))
            .collect();
        assert_eq!(
            listed,
            [
                ("edit.txt", "modified"),
                ("gone.txt", "deleted"),
                ("new.txt", "added")
            ]
        );
        let diff = before.diff(&after, &changes, &store);
        assert!(diff.contains("-two\n+TWO\n"), "{diff}");
        assert!(diff.contains("+++ b/new.txt"), "{diff}");

        let planned = before.restore(&workspace, &store, true).unwrap();
        assert_eq!(planned.len(), 3);
        assert!(root.join("new.txt").exists(), "a dry run touched the files");
        before.restore(&workspace, &store, false).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("edit.txt")).unwrap(),
            "one\ntwo\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("gone.txt")).unwrap(),
            "bye\n"
        );
        assert!(!root.join("new.txt").exists());
        assert!(
            root.join("build/out.o").exists(),
            "an ignored file was touched"
        );
        assert!(
            before
                .changes(&Snapshot::take(&workspace, None, &store))
                .is_empty()
        );
    }
}
