//! Checkpoints of a session's workspace, taken when each turn starts: what a turn changed
//! (`turn/diff`, whatever made the change: an edit tool, `shell`, a build) and how to put the
//! workspace back as it was before a turn (`session/revert`).
//!
//! A checkpoint holds the contents of the workspace's files, walked without following links
//! and with `.gitignore` rules (so `target/` or `node_modules/` of a repository that ignores
//! them are not copied), `.git/` left out, at most [`MAX_FILES`] files of at most
//! [`MAX_FILE_BYTES`] each and [`MAX_TOTAL_BYTES`] in all: a file past a limit is neither
//! diffed nor reverted, and the checkpoint says it was cut. Checkpoints live in the session's
//! memory, the last [`KEPT`] turns' of the session while it is loaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::tools::workspace::Workspace;

/// Most files a checkpoint copies.
pub const MAX_FILES: usize = 20_000;
/// The largest file a checkpoint copies.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Most bytes a checkpoint copies in all.
pub const MAX_TOTAL_BYTES: u64 = 128 * 1024 * 1024;
/// Checkpoints kept per loaded session, the newest turns'.
pub const KEPT: usize = 20;
/// Most bytes of `turn/diff`'s `diff`; the file list is always whole.
pub const MAX_DIFF_BYTES: usize = 256 * 1024;

/// The workspace's files at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Contents by path relative to the workspace root.
    files: BTreeMap<PathBuf, Arc<[u8]>>,
    /// Files past a limit, not copied: never reported as changed nor reverted.
    skipped: std::collections::BTreeSet<PathBuf>,
    /// What each copied file's metadata said when it was read.
    stamps: BTreeMap<PathBuf, Stamp>,
}

/// A file's size, inode and modification and change times: while all four stay the same the
/// file was not written (the change time moves on every write and cannot be set back), so the
/// previous checkpoint's copy is shared without reading the file again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    inode: u64,
    modified_ns: i128,
    changed_ns: i128,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            size: metadata.len(),
            inode: metadata.ino(),
            modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
            changed_ns: i128::from(metadata.ctime()) * 1_000_000_000
                + i128::from(metadata.ctime_nsec()),
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
    /// The files of `workspace` now. A file whose metadata or bytes are those it had in
    /// `previous` shares that copy (unread, when the metadata says it was not written), so the
    /// checkpoints of a session hold each version of a file once.
    pub fn take(workspace: &Workspace, previous: Option<&Snapshot>) -> Self {
        let root = workspace.root().to_path_buf();
        let mut snapshot = Self::default();
        let mut total = 0u64;
        let walk = ignore::WalkBuilder::new(&root)
            .hidden(false)
            .follow_links(false)
            .require_git(false)
            .filter_entry(|entry| entry.file_name() != ".git")
            .build();
        for entry in walk.flatten() {
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let Ok(rel) = entry.path().strip_prefix(&root) else {
                continue;
            };
            let rel = rel.to_path_buf();
            let metadata = entry.metadata().ok();
            let size = metadata.as_ref().map_or(u64::MAX, |m| m.len());
            if snapshot.files.len() >= MAX_FILES
                || size > MAX_FILE_BYTES
                || total + size > MAX_TOTAL_BYTES
            {
                snapshot.skipped.insert(rel);
                continue;
            }
            let stamp = metadata.as_ref().map(Stamp::of);
            let unchanged = previous.and_then(|previous| {
                let known = previous.stamps.get(&rel)?;
                (Some(*known) == stamp).then(|| previous.files.get(&rel))?
            });
            if let (Some(copy), Some(stamp)) = (unchanged, stamp) {
                total += copy.len() as u64;
                snapshot.files.insert(rel.clone(), Arc::clone(copy));
                snapshot.stamps.insert(rel, stamp);
                continue;
            }
            // Read through the workspace: a file swapped for a link meanwhile is refused.
            match workspace.read(&rel, MAX_FILE_BYTES) {
                Ok(bytes) => {
                    total += bytes.len() as u64;
                    let shared = previous
                        .and_then(|previous| previous.files.get(&rel))
                        .filter(|known| ***known == *bytes)
                        .map_or_else(|| Arc::from(bytes), Arc::clone);
                    if let Some(stamp) = stamp {
                        snapshot.stamps.insert(rel.clone(), stamp);
                    }
                    snapshot.files.insert(rel, shared);
                }
                Err(_) => {
                    snapshot.skipped.insert(rel);
                }
            }
        }
        snapshot
    }

    /// What changed from `self` to `later`, by path.
    pub fn changes(&self, later: &Snapshot) -> Vec<FileChange> {
        let mut changes = Vec::new();
        for (path, before) in &self.files {
            match later.files.get(path) {
                Some(after) if after == before => {}
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

    /// A unified diff from `self` to `later` of the `changes` (text files; a binary one is
    /// named), at most [`MAX_DIFF_BYTES`].
    pub fn diff(&self, later: &Snapshot, changes: &[FileChange]) -> String {
        let empty: Arc<[u8]> = Arc::from(Vec::new());
        let mut out = String::new();
        for change in changes {
            let path = Path::new(&change.path);
            let before = self.files.get(path).unwrap_or(&empty);
            let after = later.files.get(path).unwrap_or(&empty);
            let (Ok(old), Ok(new)) = (std::str::from_utf8(before), std::str::from_utf8(after))
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
    /// removed ones written back. With `dry_run` nothing is touched; either way the answer
    /// is what differs (as the change that reverting undoes).
    pub fn restore(&self, workspace: &Workspace, dry_run: bool) -> Result<Vec<FileChange>, String> {
        let now = Snapshot::take(workspace, Some(self));
        let changes = self.changes(&now);
        if dry_run {
            return Ok(changes);
        }
        for change in &changes {
            let rel = Path::new(&change.path);
            let outcome = match change.change {
                "added" => workspace.remove("session/revert", rel),
                _ => workspace
                    .write("session/revert", rel, &self.files[rel])
                    .map(drop),
            };
            outcome.map_err(|err| format!("{}: {err}", change.path))?;
        }
        Ok(changes)
    }
}

fn change(path: &Path, change: &'static str) -> FileChange {
    FileChange {
        path: path.to_string_lossy().into_owned(),
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
        let before = Snapshot::take(&workspace, None);
        assert!(!before.files.contains_key(Path::new(".git/HEAD")));

        // As a shell command would: behind the tools' back.
        std::fs::write(root.join("edit.txt"), "one\nTWO\n").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::write(root.join("new.txt"), "hello\n").unwrap();
        std::fs::write(root.join("build/out.o"), "ignored\n").unwrap();
        let after = Snapshot::take(&workspace, Some(&before));
        // An unchanged file is the same copy in both.
        assert!(Arc::ptr_eq(
            &before.files[Path::new("keep.txt")],
            &after.files[Path::new("keep.txt")]
        ));
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
        let diff = before.diff(&after, &changes);
        assert!(diff.contains("-two\n+TWO\n"), "{diff}");
        assert!(diff.contains("+++ b/new.txt"), "{diff}");

        let planned = before.restore(&workspace, true).unwrap();
        assert_eq!(planned.len(), 3);
        assert!(root.join("new.txt").exists(), "a dry run touched the files");
        before.restore(&workspace, false).unwrap();
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
        assert!(before.changes(&Snapshot::take(&workspace, None)).is_empty());
    }
}
