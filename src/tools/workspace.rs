//! A session's working directory as its tools see it: the root every path is confined to, the
//! journal of what tools changed there, and state its tools share (such as their processes).

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::disk_quota::UserDisk;
use crate::fs_safe::{self, Beneath, FsError, RootPath};
use crate::mutex::lock;
use crate::sandbox::SessionSandbox;
use crate::sandbox::command_env::CommandEnv;

/// What one tool call did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// The file did not exist before.
    Created,
    /// The file's contents were replaced.
    Modified,
    /// The file was removed.
    Deleted,
    /// The file was moved away from this path (see `moved_to`).
    Moved,
}

/// One entry of the workspace log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Position in the log, from 1.
    pub seq: u64,
    /// The file, relative to the workspace root.
    pub path: String,
    /// What happened to it.
    pub kind: ChangeKind,
    /// Where it went, for a move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
    /// The tool that made the change.
    pub tool: String,
    /// When, as RFC 3339 UTC.
    pub changed_at: String,
}

#[derive(Debug, Default)]
struct Journal {
    /// Each changed file's contents before the session first touched it; `None` when it did
    /// not exist.
    originals: BTreeMap<PathBuf, Option<Vec<u8>>>,
    /// Bytes held in `originals`.
    original_bytes: u64,
    /// Changed files whose original was too large to keep, alone or within the total.
    not_kept: std::collections::BTreeSet<PathBuf>,
    log: Vec<Change>,
}

/// A workspace bound to one root directory; shared by the tools of one registry binding.
pub struct Workspace {
    root: PathBuf,
    /// The session's sandbox, which every process its tools start runs in; `None` runs them
    /// unconfined (`[sandbox] mode = "off"`, and tools used outside a session).
    sandbox: Option<Arc<SessionSandbox>>,
    /// The environment every process its tools start gets (built once, from the config).
    command_env: Arc<CommandEnv>,
    /// The same root as an anchor and a path beneath it, opened afresh for every access.
    at: RootPath,
    journal: Mutex<Journal>,
    shared: Mutex<HashMap<TypeId, Arc<dyn SharedEntry>>>,
    /// The disk account of the session's user, which every write is charged to; `None`
    /// without `disk_max_mb` or `min_free_mb`.
    disk: Option<Arc<UserDisk>>,
}

/// A value a workspace's tools share, one per type (see [`Workspace::shared`]).
pub trait SharedState: Default + Send + Sync + 'static {
    /// Ends what the value keeps running, when the session stops its work (an interrupt, a
    /// close): the clean-up hook of the tools that start things outliving their call.
    fn stop_work(&self) {}
}

/// A shared value with its type erased, kept so [`Workspace::stop_work`] can reach it.
trait SharedEntry: Send + Sync {
    fn stop_work(&self);
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<T: SharedState> SharedEntry for T {
    fn stop_work(&self) {
        SharedState::stop_work(self);
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("root", &self.root)
            .field("anchor", &self.at.anchor())
            .finish_non_exhaustive()
    }
}

/// Largest file the journal keeps an original copy of; larger files are logged but not diffed.
const MAX_ORIGINAL_BYTES: u64 = 10 * 1024 * 1024;
/// Most bytes of originals one session's journal holds; files first touched beyond it are
/// logged but not diffed, so a session rewriting many large files cannot exhaust memory.
const MAX_ORIGINALS_TOTAL: u64 = 64 * 1024 * 1024;

impl Workspace {
    /// A workspace rooted at `root`, its own anchor, with an empty journal; its processes get
    /// the [minimal](CommandEnv::minimal) environment.
    pub fn new(root: impl Into<PathBuf>) -> Arc<Self> {
        Self::at(
            RootPath::plain(root),
            None,
            Arc::new(CommandEnv::minimal()),
            None,
        )
    }

    /// As [`Workspace::new`], its processes getting `command_env`.
    pub fn with_env(root: impl Into<PathBuf>, command_env: Arc<CommandEnv>) -> Arc<Self> {
        Self::at(RootPath::plain(root), None, command_env, None)
    }

    /// A workspace rooted at `cwd` (relative) beneath `anchor`: every access reopens the root
    /// from the anchor with no symlink on the way, so a swapped working directory is refused.
    /// Its tools start their processes in `sandbox`, when given, with `command_env`.
    pub fn anchored(
        anchor: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        sandbox: Option<Arc<SessionSandbox>>,
        command_env: Arc<CommandEnv>,
    ) -> Arc<Self> {
        Self::at(RootPath::new(anchor, cwd), sandbox, command_env, None)
    }

    /// [`Workspace::anchored`], its writes and commands charged to the user's `disk`.
    pub fn charged(
        anchor: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        sandbox: Option<Arc<SessionSandbox>>,
        command_env: Arc<CommandEnv>,
        disk: Option<Arc<UserDisk>>,
    ) -> Arc<Self> {
        Self::at(RootPath::new(anchor, cwd), sandbox, command_env, disk)
    }

    fn at(
        at: RootPath,
        sandbox: Option<Arc<SessionSandbox>>,
        command_env: Arc<CommandEnv>,
        disk: Option<Arc<UserDisk>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            root: at.path(),
            at,
            sandbox,
            command_env,
            journal: Mutex::new(Journal::default()),
            shared: Mutex::new(HashMap::new()),
            disk,
        })
    }

    /// The disk account this workspace's writes are charged to, if any.
    pub fn disk(&self) -> Option<&Arc<UserDisk>> {
        self.disk.as_ref()
    }

    /// Lets a command start unless the user's disk quota or the server's free-space reserve
    /// refuses it; every tool that starts a command asks first.
    pub fn admit_command(&self) -> Result<(), FsError> {
        match &self.disk {
            Some(disk) => disk.admit_command().map_err(refused),
            None => Ok(()),
        }
    }

    /// The root directory, as a path (for display and process working directories; file
    /// access goes through [`Workspace::open_root`]).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The sandbox processes of this workspace run in, if any.
    pub fn sandbox(&self) -> Option<&Arc<SessionSandbox>> {
        self.sandbox.as_ref()
    }

    /// The environment every process of this workspace starts with.
    pub fn command_env(&self) -> &Arc<CommandEnv> {
        &self.command_env
    }

    /// Where the root is: its anchor and the path beneath it.
    pub fn root_path(&self) -> &RootPath {
        &self.at
    }

    /// Opens the root for one operation; refused when it is no longer a real directory reached
    /// from the anchor without symlinks.
    pub fn open_root(&self) -> Result<Beneath, FsError> {
        self.at.open()
    }

    /// The one value of type `T` this workspace's tools share, created on first use; it lives
    /// (and is dropped) with the workspace.
    pub fn shared<T: SharedState>(&self) -> Arc<T> {
        let mut shared = lock(&self.shared);
        let entry = shared
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(entry).into_any().downcast::<T>() {
            Ok(value) => value,
            // The map is keyed by the value's own TypeId, so the downcast cannot fail.
            Err(_) => unreachable!("workspace shared state keyed by TypeId"),
        }
    }

    /// Tells every shared value to end what it keeps running (see [`SharedState::stop_work`]).
    pub fn stop_work(&self) {
        let shared: Vec<Arc<dyn SharedEntry>> = lock(&self.shared).values().cloned().collect();
        for value in shared {
            value.stop_work();
        }
    }

    /// Lexically resolves a path the model gave into one relative to the root.
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, FsError> {
        fs_safe::resolve_path(&self.root, requested)
    }

    /// Reads a file beneath the root, refusing symlinks and files over `limit` bytes.
    pub fn read(&self, rel: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
        self.open_root()?.read(rel, limit)
    }

    /// Atomically writes a file (creating parent directories) and records the change.
    pub fn write(&self, tool: &str, rel: &Path, contents: &[u8]) -> Result<ChangeKind, FsError> {
        let mut journal = lock(&self.journal);
        let root = self.open_root()?;
        let existed = remember_original(&root, &mut journal, rel)?;
        let replaced = self.charge(&root, rel, contents.len() as u64)?;
        if let Err(err) = root.write(rel, contents, true) {
            if let Some(disk) = &self.disk {
                disk.undo_tree(contents.len() as u64, replaced);
            }
            return Err(err);
        }
        let kind = if existed {
            ChangeKind::Modified
        } else {
            ChangeKind::Created
        };
        journal.record(rel, kind, None, tool);
        Ok(kind)
    }

    /// Removes a file and records the change.
    pub fn remove(&self, tool: &str, rel: &Path) -> Result<(), FsError> {
        let mut journal = lock(&self.journal);
        let root = self.open_root()?;
        remember_original(&root, &mut journal, rel)?;
        let size = self.size_if_charged(&root, rel);
        root.remove_file(rel)?;
        if let Some(disk) = &self.disk {
            disk.refund_tree(size);
        }
        journal.record(rel, ChangeKind::Deleted, None, tool);
        Ok(())
    }

    /// Moves a file (creating the destination's parents) and records the change.
    pub fn rename(&self, tool: &str, from: &Path, to: &Path) -> Result<(), FsError> {
        let mut journal = lock(&self.journal);
        let root = self.open_root()?;
        remember_original(&root, &mut journal, from)?;
        remember_original(&root, &mut journal, to)?;
        let replaced = self.size_if_charged(&root, to);
        root.rename(from, to, true)?;
        if let Some(disk) = &self.disk {
            disk.refund_tree(replaced);
        }
        journal.record(from, ChangeKind::Moved, Some(to), tool);
        Ok(())
    }

    /// Charges a write of `bytes` over `rel` to the user's account; answers the size of the
    /// file it replaces (counted back out).
    fn charge(&self, root: &Beneath, rel: &Path, bytes: u64) -> Result<u64, FsError> {
        let Some(disk) = &self.disk else {
            return Ok(0);
        };
        let replaced = self.size_if_charged(root, rel);
        disk.charge_tree(bytes, replaced).map_err(refused)?;
        Ok(replaced)
    }

    /// The length of the file at `rel` (0 when there is none), read only when writes are
    /// charged.
    fn size_if_charged(&self, root: &Beneath, rel: &Path) -> u64 {
        match &self.disk {
            Some(_) => root.metadata(rel).map_or(0, |meta| meta.len()),
            None => 0,
        }
    }

    /// The ordered log of changes tools made.
    pub fn changes(&self) -> Vec<Change> {
        lock(&self.journal).log.clone()
    }

    /// One unified diff of every file changed since the session first touched it, in path
    /// order; files changed back to their original contents are left out.
    pub fn diff(&self) -> String {
        let journal = lock(&self.journal);
        let mut out = String::new();
        let root = match self.open_root() {
            Ok(root) => root,
            Err(err) => return format!("# {err}\n"),
        };
        for rel in &journal.not_kept {
            out.push_str(&format!(
                "# {}: changed; its original was too large to keep, so no diff\n",
                rel.display()
            ));
        }
        for (rel, original) in &journal.originals {
            let current = match root.read(rel, MAX_ORIGINAL_BYTES) {
                Ok(bytes) => Some(bytes),
                Err(FsError::NotFound(_)) => None,
                Err(err) => {
                    out.push_str(&format!("# {}: {err}\n", rel.display()));
                    continue;
                }
            };
            if *original == current {
                continue;
            }
            let shown = rel.to_string_lossy();
            let old_text = original.as_deref().map(String::from_utf8_lossy);
            let new_text = current.as_deref().map(String::from_utf8_lossy);
            let old_name = if original.is_some() {
                format!("a/{shown}")
            } else {
                "/dev/null".to_string()
            };
            let new_name = if current.is_some() {
                format!("b/{shown}")
            } else {
                "/dev/null".to_string()
            };
            let diff = similar::TextDiff::from_lines(
                old_text.as_deref().unwrap_or(""),
                new_text.as_deref().unwrap_or(""),
            );
            out.push_str(&format!("diff --git a/{shown} b/{shown}\n"));
            out.push_str(
                &diff
                    .unified_diff()
                    .header(&old_name, &new_name)
                    .missing_newline_hint(true)
                    .to_string(),
            );
        }
        out
    }
}

/// A write or command the disk account refused, as the file error tools answer.
fn refused(err: crate::disk_quota::QuotaError) -> FsError {
    FsError::Quota(err.to_string())
}

/// Keeps the file's contents the first time the session touches it; returns whether the file
/// exists now.
fn remember_original(root: &Beneath, journal: &mut Journal, rel: &Path) -> Result<bool, FsError> {
    if journal.originals.contains_key(rel) || journal.not_kept.contains(rel) {
        // Kept already: only whether it exists now matters (a zero limit reads nothing).
        return match root.read(rel, 0) {
            Ok(_) | Err(FsError::TooLarge { .. }) => Ok(true),
            Err(FsError::NotFound(_)) => Ok(false),
            Err(err) => Err(err),
        };
    }
    let room = MAX_ORIGINALS_TOTAL
        .saturating_sub(journal.original_bytes)
        .min(MAX_ORIGINAL_BYTES);
    let current = match root.read(rel, room) {
        Ok(bytes) => Some(bytes),
        Err(FsError::NotFound(_)) => None,
        // Too large to keep: the change is still logged, and the diff names the file.
        Err(FsError::TooLarge { .. }) => {
            journal.not_kept.insert(rel.to_path_buf());
            return Ok(true);
        }
        Err(err) => return Err(err),
    };
    let exists = current.is_some();
    journal.original_bytes += current.as_ref().map_or(0, |b| b.len() as u64);
    journal.originals.insert(rel.to_path_buf(), current);
    Ok(exists)
}

impl Journal {
    fn record(&mut self, rel: &Path, kind: ChangeKind, moved_to: Option<&Path>, tool: &str) {
        let seq = self.log.len() as u64 + 1;
        self.log.push(Change {
            seq,
            path: rel.to_string_lossy().into_owned(),
            kind,
            moved_to: moved_to.map(|p| p.to_string_lossy().into_owned()),
            tool: tool.to_string(),
            changed_at: now_rfc3339(),
        });
    }
}

/// Now as RFC 3339 UTC with seconds precision, the form every `*_at` field takes.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let now = now.replace_nanosecond(0).unwrap_or(now);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Free space that is whatever the test says.
    #[derive(Debug)]
    struct FakeFree(u64);

    impl crate::disk_quota::FreeSpace for FakeFree {
        fn available(&self) -> std::io::Result<u64> {
            Ok(self.0)
        }
    }

    #[test]
    fn a_write_that_would_eat_the_servers_reserve_is_refused_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        // 600 MiB free, 512 MiB held back: room for less than 88 MiB more.
        let quotas =
            crate::disk_quota::DiskQuotas::new(0, 512, Arc::new(FakeFree(600 << 20))).unwrap();
        let ws = Workspace::charged(
            dir.path(),
            "",
            None,
            Arc::default(),
            Some(quotas.user(Some("alice"), dir.path())),
        );
        ws.write("write_file", Path::new("small"), b"fits").unwrap();
        let err = ws
            .write("write_file", Path::new("big"), &vec![0u8; 100 << 20])
            .unwrap_err();
        assert_eq!(err.kind(), "quota_exceeded", "{err}");
        assert!(err.to_string().contains("server.min_free_mb"), "{err}");
        assert!(!dir.path().join("big").exists());
        assert_eq!(ws.changes().len(), 1, "the refused write is not logged");
        let refused = ws.admit_command();
        assert!(refused.is_ok(), "the reserve is still free: {refused:?}");
    }

    #[test]
    fn writes_removals_and_renames_move_the_users_count() {
        let dir = tempfile::tempdir().unwrap();
        let quotas =
            crate::disk_quota::DiskQuotas::new(1, 0, Arc::new(FakeFree(u64::MAX))).unwrap();
        let disk = quotas.user(None, dir.path());
        let ws = Workspace::charged(
            dir.path(),
            "",
            None,
            Arc::default(),
            Some(Arc::clone(&disk)),
        );
        let start = disk.usage();
        ws.write("write_file", Path::new("a"), &[1u8; 1000])
            .unwrap();
        ws.write("write_file", Path::new("b"), &[1u8; 300]).unwrap();
        assert_eq!(disk.usage(), start + 1300);
        ws.write("edit_file", Path::new("a"), &[1u8; 400]).unwrap();
        assert_eq!(disk.usage(), start + 700);
        ws.rename("apply_patch", Path::new("a"), Path::new("b"))
            .unwrap();
        assert_eq!(disk.usage(), start + 400);
        ws.remove("apply_patch", Path::new("b")).unwrap();
        assert_eq!(disk.usage(), start);
    }

    #[test]
    fn timestamps_are_rfc3339_utc_seconds() {
        let now = now_rfc3339();
        assert_eq!(now.len(), "2026-11-29T20:18:11Z".len(), "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }

    #[test]
    fn the_journal_keeps_originals_and_logs_every_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
        let ws = Workspace::new(dir.path());
        let a = Path::new("a.txt");
        assert_eq!(
            ws.write("edit_file", a, b"one\n2\n").unwrap(),
            ChangeKind::Modified
        );
        assert_eq!(
            ws.write("edit_file", a, b"one\nTWO\n").unwrap(),
            ChangeKind::Modified
        );
        assert_eq!(
            ws.write("write_file", Path::new("new/b.txt"), b"fresh\n")
                .unwrap(),
            ChangeKind::Created
        );
        ws.rename("apply_patch", Path::new("new/b.txt"), Path::new("c.txt"))
            .unwrap();

        let log: Vec<(u64, String, ChangeKind, String)> = ws
            .changes()
            .into_iter()
            .map(|c| (c.seq, c.path, c.kind, c.tool))
            .collect();
        assert_eq!(
            log,
            [
                (1, "a.txt".into(), ChangeKind::Modified, "edit_file".into()),
                (2, "a.txt".into(), ChangeKind::Modified, "edit_file".into()),
                (
                    3,
                    "new/b.txt".into(),
                    ChangeKind::Created,
                    "write_file".into()
                ),
                (
                    4,
                    "new/b.txt".into(),
                    ChangeKind::Moved,
                    "apply_patch".into()
                ),
            ]
        );
        let diff = ws.diff();
        assert!(diff.contains("--- a/a.txt\n+++ b/a.txt\n"), "{diff}");
        assert!(
            diff.contains("-two\n+TWO\n"),
            "diff is against the first original: {diff}"
        );
        assert!(diff.contains("--- /dev/null\n+++ b/c.txt\n"), "{diff}");
        assert!(
            !diff.contains("new/b.txt\n+++"),
            "created then moved away: {diff}"
        );
    }

    #[test]
    fn changing_a_file_back_leaves_it_out_of_the_diff_and_deletions_show() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep.txt"), "same\n").unwrap();
        std::fs::write(dir.path().join("gone.txt"), "bye\n").unwrap();
        let ws = Workspace::new(dir.path());
        ws.write("write_file", Path::new("keep.txt"), b"changed\n")
            .unwrap();
        ws.write("write_file", Path::new("keep.txt"), b"same\n")
            .unwrap();
        ws.remove("apply_patch", Path::new("gone.txt")).unwrap();
        let diff = ws.diff();
        assert!(!diff.contains("keep.txt"), "{diff}");
        assert!(
            diff.contains("--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"),
            "{diff}"
        );
    }

    #[test]
    fn originals_beyond_the_journal_cap_are_logged_and_named_but_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'a'; MAX_ORIGINAL_BYTES as usize];
        let files = MAX_ORIGINALS_TOTAL / MAX_ORIGINAL_BYTES + 1;
        for n in 0..files {
            std::fs::write(dir.path().join(format!("f{n}")), &big).unwrap();
        }
        let ws = Workspace::new(dir.path());
        for n in 0..files {
            let kind = ws
                .write("write_file", Path::new(&format!("f{n}")), b"small\n")
                .unwrap();
            assert_eq!(kind, ChangeKind::Modified);
        }
        // Put back the ones whose originals were kept, so the diff shows only the last.
        for n in 0..files - 1 {
            ws.write("write_file", Path::new(&format!("f{n}")), &big)
                .unwrap();
        }
        let journal = lock(&ws.journal);
        assert!(journal.original_bytes <= MAX_ORIGINALS_TOTAL);
        assert_eq!(journal.originals.len() as u64, files - 1);
        drop(journal);
        let last = format!("f{}", files - 1);
        assert_eq!(
            ws.diff(),
            format!("# {last}: changed; its original was too large to keep, so no diff\n")
        );
        assert_eq!(
            ws.changes().len() as u64,
            2 * files - 1,
            "every change is logged"
        );
    }

    #[test]
    fn refused_paths_change_nothing_and_log_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        let ws = Workspace::new(dir.path());
        let err = ws
            .write("write_file", Path::new("out/x.txt"), b"x")
            .unwrap_err();
        assert_eq!(err.kind(), "symlink");
        assert!(ws.changes().is_empty());
        assert!(!outside.path().join("x.txt").exists());
    }

    #[test]
    fn an_anchored_workspace_refuses_a_working_directory_swapped_for_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path().join("ws");
        std::fs::create_dir_all(anchor.join("alice/sw")).unwrap();
        std::fs::create_dir_all(anchor.join("bob/proj")).unwrap();
        std::fs::write(anchor.join("bob/proj/secret.txt"), "bob's").unwrap();
        let ws = Workspace::anchored(&anchor, "alice/sw", None, Arc::default());
        assert_eq!(ws.root(), anchor.join("alice/sw"));
        assert_eq!(ws.root_path().anchor(), anchor);
        let mine = Path::new("mine.txt");
        ws.write("write_file", mine, b"mine").unwrap();
        assert_eq!(ws.read(mine, 100).unwrap(), b"mine");

        // Done from another session's shell, or from outside the server.
        let sw = anchor.join("alice/sw");
        std::fs::rename(&sw, anchor.join("alice/sw.old")).unwrap();
        std::os::unix::fs::symlink("../bob/proj", &sw).unwrap();
        let secret = Path::new("secret.txt");
        let err = ws.read(secret, 100).unwrap_err();
        assert_eq!(err.kind(), "workspace_root");
        assert!(err.to_string().contains("\"alice/sw\""), "{err}");
        assert_eq!(
            ws.write("write_file", secret, b"pwned").unwrap_err().kind(),
            "workspace_root"
        );
        assert_eq!(
            ws.write("write_file", mine, b"x").unwrap_err().kind(),
            "workspace_root"
        );
        assert_eq!(
            ws.remove("apply_patch", secret).unwrap_err().kind(),
            "workspace_root"
        );
        assert!(ws.open_root().is_err());
        assert!(
            ws.diff().starts_with("# the working directory"),
            "{}",
            ws.diff()
        );
        assert_eq!(
            std::fs::read(anchor.join("bob/proj/secret.txt")).unwrap(),
            b"bob's"
        );
        assert!(!anchor.join("bob/proj/mine.txt").exists());
        assert_eq!(ws.changes().len(), 1, "refused calls log nothing");

        // Put back, the same workspace works again.
        std::fs::remove_file(&sw).unwrap();
        std::fs::rename(anchor.join("alice/sw.old"), &sw).unwrap();
        assert_eq!(ws.read(mine, 100).unwrap(), b"mine");
    }

    #[test]
    fn shared_state_is_one_value_per_type() {
        #[derive(Default)]
        struct Counter(std::sync::atomic::AtomicUsize);
        impl SharedState for Counter {}
        let ws = Workspace::new(".");
        ws.shared::<Counter>()
            .0
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            ws.shared::<Counter>()
                .0
                .load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        let other = Workspace::new(".");
        assert_eq!(
            other
                .shared::<Counter>()
                .0
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn stop_work_reaches_every_shared_value_of_the_workspace() {
        use std::sync::atomic::{AtomicBool, Ordering};
        #[derive(Default)]
        struct Runner(AtomicBool);
        impl SharedState for Runner {
            fn stop_work(&self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let ws = Workspace::new(".");
        let other = Workspace::new(".");
        let (mine, theirs) = (ws.shared::<Runner>(), other.shared::<Runner>());
        ws.stop_work();
        assert!(mine.0.load(Ordering::SeqCst));
        assert!(
            !theirs.0.load(Ordering::SeqCst),
            "another workspace's state is its own"
        );
    }
}
