//! Symlink-safe file access confined to a workspace root.
//!
//! A root is named by an anchor, opened normally (the operator chose it), and
//! optionally a path beneath the anchor ([`RootPath`]), which is reached like
//! any other path below: without following links, every time the root is
//! opened. Everything beneath the root is reached through directory file
//! descriptors that never follow symbolic links, so a link planted (or swapped
//! in) anywhere under the anchor cannot redirect a tool outside it.
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` does the walk in the kernel
//! when available; otherwise each component is opened with `O_NOFOLLOW`
//! relative to its parent's descriptor.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Why a path or file operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The requested path is absolute.
    #[error("path \"{0}\" is absolute; use a path relative to the workspace root")]
    Absolute(String),
    /// The requested path contains a NUL byte.
    #[error("path contains a NUL byte")]
    NulByte,
    /// A `..` component would leave the workspace root.
    #[error("path \"{0}\" escapes the workspace root")]
    EscapesRoot(String),
    /// A component of the path (parent directory or final entry) is a symlink.
    #[error("refusing to follow symbolic link at \"{0}\"")]
    Symlink(String),
    /// The path does not exist.
    #[error("\"{0}\" does not exist")]
    NotFound(String),
    /// A directory was required but something else was found.
    #[error("\"{0}\" is not a directory")]
    NotADirectory(String),
    /// A file was required but a directory was found.
    #[error("\"{0}\" is a directory")]
    IsADirectory(String),
    /// The file is bigger than the caller's limit.
    #[error("\"{path}\" is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The file, relative to the root.
        path: String,
        /// Its size in bytes (at least `limit + 1` if it grew while being read).
        size: u64,
        /// The caller's limit in bytes.
        limit: u64,
    },
    /// The root itself, a path beneath its anchor, cannot be opened as a plain directory
    /// reached without symlinks (it was swapped for a link, replaced or removed).
    #[error("the working directory \"{root}\" was refused: {source}")]
    Root {
        /// The root, relative to its anchor.
        root: String,
        /// Why opening it failed.
        #[source]
        source: Box<FsError>,
    },
    /// A directory was replaced while it was being listed, so what was read may not be its.
    #[error("\"{0}\" was replaced while it was being listed")]
    Changed(String),
    /// The user's disk quota, or the free space kept for the server, refuses the write
    /// (the message says which).
    #[error("{0}")]
    Quota(String),
    /// Any other I/O failure.
    #[error("I/O error on \"{path}\": {source}")]
    Io {
        /// The path involved, relative to the root.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl FsError {
    /// Stable snake_case name of the variant, for structured tool results.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Absolute(_) => "absolute_path",
            Self::NulByte => "nul_byte",
            Self::EscapesRoot(_) => "escapes_root",
            Self::Symlink(_) => "symlink",
            Self::NotFound(_) => "not_found",
            Self::NotADirectory(_) => "not_a_directory",
            Self::IsADirectory(_) => "is_a_directory",
            Self::TooLarge { .. } => "too_large",
            Self::Root { .. } => "workspace_root",
            Self::Changed(_) => "changed",
            Self::Quota(_) => "quota_exceeded",
            Self::Io { .. } => "io",
        }
    }
}

/// Kind of a directory entry as reported by [`list_dir_no_follow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (listed, never followed).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    /// File name within the directory.
    pub name: OsString,
    /// What the entry is, without following links.
    pub kind: EntryKind,
}

/// Lexically normalises `requested` into a path relative to the root; touches no filesystem.
pub fn resolve_path(_root: &Path, requested: &str) -> Result<PathBuf, FsError> {
    Ok(normalize(Path::new(requested))?.iter().collect())
}

/// Where a workspace root is: an anchor directory, opened following the links the operator put
/// in its path, and a path beneath it that must be a real directory reached with no symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPath {
    anchor: PathBuf,
    below: PathBuf,
}

impl RootPath {
    /// The directory `below` (relative) beneath `anchor`.
    pub fn new(anchor: impl Into<PathBuf>, below: impl Into<PathBuf>) -> Self {
        Self {
            anchor: anchor.into(),
            below: below.into(),
        }
    }

    /// A root that is its own anchor, for callers that have nothing above it to trust.
    pub fn plain(root: impl Into<PathBuf>) -> Self {
        Self::new(root, PathBuf::new())
    }

    /// The anchor directory.
    pub fn anchor(&self) -> &Path {
        &self.anchor
    }

    /// The root relative to the anchor; empty when the root is the anchor.
    pub fn below(&self) -> &Path {
        &self.below
    }

    /// The root as one path, for display and for processes that need a working directory.
    pub fn path(&self) -> PathBuf {
        if self.below.as_os_str().is_empty() {
            self.anchor.clone()
        } else {
            self.anchor.join(&self.below)
        }
    }

    /// Opens the root; a root swapped for a symlink (or anything else) is refused.
    pub fn open(&self) -> Result<Beneath, FsError> {
        Beneath::anchored(&self.anchor, &self.below, Walk::detect())
    }
}

/// Opens an existing regular file beneath `root` read-only.
pub fn open_no_follow(root: &Path, rel: &Path) -> Result<File, FsError> {
    Beneath::new(root, Walk::detect())?.open_file(rel)
}

/// Reads a whole regular file, refusing files larger than `limit` bytes.
pub fn read_no_follow(root: &Path, rel: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
    Beneath::new(root, Walk::detect())?.read(rel, limit)
}

/// Reads at most the first `limit` bytes of a regular file, however large it is; answers
/// them with the file's size, so a caller can say that it cut.
pub fn read_prefix_no_follow(root: &Path, rel: &Path, limit: u64) -> Result<Prefix, FsError> {
    Beneath::new(root, Walk::detect())?.read_prefix(rel, limit)
}

/// The start of a file and how long the file is: what [`read_prefix_no_follow`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    /// At most the limit's bytes, from the start.
    pub bytes: Vec<u8>,
    /// The file's size when it was opened, or the bytes seen if it grew past that.
    pub size: u64,
}

impl Prefix {
    /// Whether the file holds more than [`Prefix::bytes`].
    pub fn cut(&self) -> bool {
        self.size > self.bytes.len() as u64
    }
}

/// Atomically replaces (or creates) a file via a temp file and `renameat`.
pub fn write_no_follow(
    root: &Path,
    rel: &Path,
    contents: &[u8],
    create_parents: bool,
) -> Result<(), FsError> {
    Beneath::new(root, Walk::detect())?.write(rel, contents, create_parents)
}

/// Opens a directory beneath `root` (the root itself when `rel` is empty).
pub fn open_dir_no_follow(root: &Path, rel: &Path) -> Result<File, FsError> {
    Beneath::new(root, Walk::detect())?
        .open_dir(rel)
        .map(File::from)
}

/// Lists a directory beneath `root` without following links, sorted by name.
pub fn list_dir_no_follow(root: &Path, rel: &Path) -> Result<Vec<DirEntryInfo>, FsError> {
    Beneath::new(root, Walk::detect())?.list_dir(rel)
}

/// Lists at most `max_entries` entries of a directory (the first the file system gives,
/// then sorted by name), so a directory of millions of names costs no more than `max_entries`.
pub fn list_dir_at_most_no_follow(
    root: &Path,
    rel: &Path,
    max_entries: usize,
) -> Result<Vec<DirEntryInfo>, FsError> {
    Beneath::new(root, Walk::detect())?.list_dir_at_most(rel, max_entries)
}

/// Creates a directory and any missing parents beneath `root`.
pub fn create_dir_all_no_follow(root: &Path, rel: &Path) -> Result<(), FsError> {
    Beneath::new(root, Walk::detect())?.create_dir_all(rel)
}

/// Succeeds only if `rel` exists and none of its components is a symlink.
pub fn reject_symlink(root: &Path, rel: &Path) -> Result<(), FsError> {
    Beneath::new(root, Walk::detect())?.reject_symlink(rel)
}

/// Removes a file (never a symlink or directory) beneath `root`.
pub fn remove_file_no_follow(root: &Path, rel: &Path) -> Result<(), FsError> {
    Beneath::new(root, Walk::detect())?.remove_file(rel)
}

/// Renames `from` to `to`, both beneath `root`; neither may be a symlink.
pub fn rename_no_follow(
    root: &Path,
    from: &Path,
    to: &Path,
    create_parents: bool,
) -> Result<(), FsError> {
    Beneath::new(root, Walk::detect())?.rename(from, to, create_parents)
}

/// Metadata of the entry at `rel`, refusing symlinks anywhere on the way.
pub fn metadata_no_follow(root: &Path, rel: &Path) -> Result<std::fs::Metadata, FsError> {
    Beneath::new(root, Walk::detect())?.metadata(rel)
}

/// How paths beneath the root are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walk {
    /// One `openat2` call with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`.
    Openat2,
    /// One `openat(O_NOFOLLOW)` per component, for kernels or sandboxes without `openat2`.
    Components,
}

static WALK: AtomicU8 = AtomicU8::new(0);
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Walk {
    /// Probes `openat2` once per process; ENOSYS (old kernel) or EPERM (seccomp) selects the fallback.
    pub(crate) fn detect() -> Walk {
        match WALK.load(Ordering::Relaxed) {
            1 => Walk::Openat2,
            2 => Walk::Components,
            _ => {
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let probe = rustix::fs::openat2(CWD, ".", flags, Mode::empty(), RESOLVE);
                let walk = match probe {
                    Err(Errno::NOSYS | Errno::PERM) => Walk::Components,
                    _ => Walk::Openat2,
                };
                WALK.store(if walk == Walk::Openat2 { 1 } else { 2 }, Ordering::Relaxed);
                walk
            }
        }
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

/// Splits a relative path into plain components, resolving `.` and `..` lexically.
fn normalize(path: &Path) -> Result<Vec<&OsStr>, FsError> {
    let shown = || path.to_string_lossy().into_owned();
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(FsError::NulByte);
    }
    let mut out = Vec::new();
    for comp in path.components() {
        match comp {
            Component::Prefix(_) | Component::RootDir => return Err(FsError::Absolute(shown())),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop().ok_or_else(|| FsError::EscapesRoot(shown()))?;
            }
            Component::Normal(c) => out.push(c),
        }
    }
    Ok(out)
}

/// Renders normalised components for messages; the root itself shows as ".".
fn show(comps: &[&OsStr]) -> String {
    if comps.is_empty() {
        return ".".to_owned();
    }
    comps
        .iter()
        .map(|c| c.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn io_err(comps: &[&OsStr], source: impl Into<io::Error>) -> FsError {
    FsError::Io {
        path: show(comps),
        source: source.into(),
    }
}

fn is_type(st: &rustix::fs::Stat, ty: FileType) -> bool {
    FileType::from_raw_mode(st.st_mode) == ty
}

/// Splits off the final component; the root itself has no name to operate on.
fn split_name<'a>(comps: &'a [&'a OsStr]) -> Result<(&'a OsStr, &'a [&'a OsStr]), FsError> {
    comps
        .split_last()
        .map(|(n, p)| (*n, p))
        .ok_or_else(|| FsError::IsADirectory(show(comps)))
}

/// An opened workspace root: every path beneath it is resolved from its descriptor without
/// following symlinks, so the root stays the directory it was when opened.
pub struct Beneath {
    root: OwnedFd,
    walk: Walk,
}

impl std::fmt::Debug for Beneath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beneath")
            .field("walk", &self.walk)
            .finish_non_exhaustive()
    }
}

impl Beneath {
    /// Opens `root` itself as the root, following links the operator put in its path.
    pub fn open(root: &Path) -> Result<Self, FsError> {
        Self::new(root, Walk::detect())
    }

    /// Opens the root directory itself, following links the operator put in its path.
    pub(crate) fn new(root: &Path, walk: Walk) -> Result<Self, FsError> {
        let flags = DIR_FLAGS | OFlags::CLOEXEC;
        let root = rustix::fs::open(root, flags, Mode::empty()).map_err(|e| io_err(&[], e))?;
        Ok(Self { root, walk })
    }

    /// Opens `anchor` as [`Beneath::new`] does, then `below` beneath it as the root, with no
    /// symlink anywhere on the way, so a working directory swapped for a link is refused.
    pub(crate) fn anchored(anchor: &Path, below: &Path, walk: Walk) -> Result<Self, FsError> {
        let top = Self::new(anchor, walk)?;
        let refused = |source: FsError| FsError::Root {
            root: below.to_string_lossy().into_owned(),
            source: Box::new(source),
        };
        let comps = normalize(below).map_err(refused)?;
        if comps.is_empty() {
            return Ok(top);
        }
        let root = top.open_at(&comps, DIR_FLAGS).map_err(refused)?;
        Ok(Self { root, walk })
    }

    /// Opens one component relative to `dir` without following a symlink.
    fn step(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        flags: OFlags,
    ) -> rustix::io::Result<OwnedFd> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match self.walk {
            Walk::Openat2 => rustix::fs::openat2(dir, name, flags, Mode::empty(), RESOLVE),
            Walk::Components => rustix::fs::openat(dir, name, flags, Mode::empty()),
        }
    }

    /// Opens `comps` beneath the root with `flags` on the final component.
    fn open_at(&self, comps: &[&OsStr], flags: OFlags) -> Result<OwnedFd, FsError> {
        let res = match (self.walk, comps.split_last()) {
            (_, None) => self.step(self.root.as_fd(), OsStr::new("."), flags),
            (Walk::Openat2, Some(_)) => {
                let path: PathBuf = comps.iter().collect();
                self.step(self.root.as_fd(), path.as_os_str(), flags)
            }
            (Walk::Components, Some((last, parents))) => (|| {
                // O_PATH needs only search permission, matching what openat2 requires.
                let mut dir: Option<OwnedFd> = None;
                for c in parents {
                    let at = dir.as_ref().map_or(self.root.as_fd(), |d| d.as_fd());
                    dir = Some(self.step(at, c, OFlags::PATH | OFlags::DIRECTORY)?);
                }
                self.step(
                    dir.as_ref().map_or(self.root.as_fd(), |d| d.as_fd()),
                    last,
                    flags,
                )
            })(),
        };
        res.map_err(|e| self.classify(comps, e))
    }

    /// Maps an errno to an `FsError`, pinpointing which component is a symlink or non-directory.
    fn classify(&self, comps: &[&OsStr], err: Errno) -> FsError {
        if matches!(err, Errno::LOOP | Errno::NOTDIR) {
            // Diagnostic only: nothing is opened, so a concurrent swap can at worst blur the message.
            let mut prefix = PathBuf::new();
            for (i, c) in comps.iter().enumerate() {
                prefix.push(c);
                let Ok(st) = rustix::fs::statat(&self.root, &prefix, AtFlags::SYMLINK_NOFOLLOW)
                else {
                    break;
                };
                if is_type(&st, FileType::Symlink) {
                    return FsError::Symlink(show(&comps[..=i]));
                }
                if i + 1 < comps.len() && !is_type(&st, FileType::Directory) {
                    return FsError::NotADirectory(show(&comps[..=i]));
                }
            }
        }
        match err {
            Errno::LOOP => FsError::Symlink(show(comps)),
            Errno::NOTDIR => FsError::NotADirectory(show(comps)),
            Errno::NOENT => FsError::NotFound(show(comps)),
            Errno::ISDIR => FsError::IsADirectory(show(comps)),
            Errno::XDEV => FsError::EscapesRoot(show(comps)),
            e => io_err(comps, e),
        }
    }

    /// Opens the directory holding an entry, creating missing directories if asked.
    fn open_parent(&self, parents: &[&OsStr], create: bool) -> Result<OwnedFd, FsError> {
        if !create {
            return self.open_at(parents, DIR_FLAGS);
        }
        let mut dir = self.open_at(&[], DIR_FLAGS)?;
        for (i, c) in parents.iter().enumerate() {
            let shown = &parents[..=i];
            dir = match self.step(dir.as_fd(), c, DIR_FLAGS) {
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, *c, Mode::from_bits_truncate(0o777)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.classify(shown, e)),
                    }
                    self.step(dir.as_fd(), c, DIR_FLAGS)
                }
                other => other,
            }
            .map_err(|e| self.classify(shown, e))?;
        }
        Ok(dir)
    }

    /// `lstat` of an entry inside an already-opened parent; `None` when absent.
    fn stat_entry(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        comps: &[&OsStr],
    ) -> Result<Option<rustix::fs::Stat>, FsError> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if is_type(&st, FileType::Symlink) => Err(FsError::Symlink(show(comps))),
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.classify(comps, e)),
        }
    }

    /// See [`open_no_follow`].
    pub fn open_file(&self, rel: &Path) -> Result<File, FsError> {
        self.file_at(&normalize(rel)?)
    }

    fn file_at(&self, comps: &[&OsStr]) -> Result<File, FsError> {
        // O_NONBLOCK keeps a FIFO from hanging the open; it is refused just below anyway.
        let fd = self.open_at(comps, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(comps, e))?;
        if is_type(&st, FileType::Directory) {
            return Err(FsError::IsADirectory(show(comps)));
        }
        if !is_type(&st, FileType::RegularFile) {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
            return Err(io_err(comps, e));
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(|e| io_err(comps, e))?;
        Ok(File::from(fd))
    }

    /// See [`read_no_follow`].
    pub fn read(&self, rel: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
        let comps = normalize(rel)?;
        let file = self.file_at(&comps)?;
        let size = file.metadata().map_err(|e| io_err(&comps, e))?.len();
        if size > limit {
            let path = show(&comps);
            return Err(FsError::TooLarge { path, size, limit });
        }
        let mut buf = Vec::with_capacity(usize::try_from(size.min(limit)).unwrap_or(0));
        // The file may grow after fstat; one byte past the limit is enough to notice.
        #[allow(clippy::disallowed_methods)] // bounded by the `take` before it
        (&file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut buf)
            .map_err(|e| io_err(&comps, e))?;
        let read = buf.len() as u64;
        if read > limit {
            let (path, size) = (show(&comps), read.max(size));
            return Err(FsError::TooLarge { path, size, limit });
        }
        Ok(buf)
    }

    /// See [`read_prefix_no_follow`].
    pub fn read_prefix(&self, rel: &Path, limit: u64) -> Result<Prefix, FsError> {
        let comps = normalize(rel)?;
        let file = self.file_at(&comps)?;
        let size = file.metadata().map_err(|e| io_err(&comps, e))?.len();
        // The buffer is sized from the limit, never from the file: a 1 TiB sparse file costs
        // what its first `limit` bytes cost.
        let mut bytes = Vec::with_capacity(usize::try_from(size.min(limit)).unwrap_or(0));
        #[allow(clippy::disallowed_methods)] // bounded by the `take` before it
        (&file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(&comps, e))?;
        let seen = bytes.len() as u64;
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(Prefix {
            bytes,
            size: size.max(seen),
        })
    }

    /// See [`write_no_follow`].
    pub fn write(&self, rel: &Path, contents: &[u8], create_parents: bool) -> Result<(), FsError> {
        let comps = normalize(rel)?;
        let (name, parents) = split_name(&comps)?;
        let dir = self.open_parent(parents, create_parents)?;
        let existing = self.stat_entry(&dir, name, &comps)?;
        let mode = match &existing {
            Some(st) if is_type(st, FileType::Directory) => {
                return Err(FsError::IsADirectory(show(&comps)));
            }
            // Set-id bits are dropped on purpose: the contents are no longer the vetted ones.
            Some(st) => Some(Mode::from_bits_truncate(st.st_mode & 0o777)),
            None => None,
        };
        let (fd, temp) = create_temp(&dir, &comps)?;
        let guard = TempGuard {
            dir: &dir,
            name: Some(temp.clone()),
        };
        let fail = |e: io::Error| io_err(&comps, e);
        if let Some(mode) = mode {
            rustix::fs::fchmod(&fd, mode).map_err(|e| fail(e.into()))?;
        }
        let mut file = File::from(fd);
        file.write_all(contents).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        rustix::fs::renameat(&dir, &temp, &dir, name).map_err(|e| self.classify(&comps, e))?;
        guard.disarm();
        // Without this the rename itself may not survive a crash.
        rustix::fs::fsync(&dir).map_err(|e| fail(e.into()))
    }

    /// See [`open_dir_no_follow`].
    pub fn open_dir(&self, rel: &Path) -> Result<OwnedFd, FsError> {
        self.open_at(&normalize(rel)?, DIR_FLAGS)
    }

    /// See [`list_dir_no_follow`].
    pub fn list_dir(&self, rel: &Path) -> Result<Vec<DirEntryInfo>, FsError> {
        self.list_dir_at_most(rel, usize::MAX)
    }

    /// See [`list_dir_at_most_no_follow`].
    pub fn list_dir_at_most(
        &self,
        rel: &Path,
        max_entries: usize,
    ) -> Result<Vec<DirEntryInfo>, FsError> {
        let comps = normalize(rel)?;
        let fd = self.open_at(&comps, DIR_FLAGS)?;
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io_err(&comps, e))?;
        let mut out = Vec::new();
        while out.len() < max_entries
            && let Some(entry) = dir.read()
        {
            let entry = entry.map_err(|e| io_err(&comps, e))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let mut ty = entry.file_type();
            if ty == FileType::Unknown {
                // Some filesystems leave d_type empty.
                let st = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW);
                ty = st.map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode));
            }
            let kind = match ty {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            out.push(DirEntryInfo {
                name: name.to_owned(),
                kind,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        // The directory may have been moved away (and something else put in its place) while
        // it was read; the names are only this path's if the path still leads to it.
        let before = rustix::fs::fstat(&fd).map_err(|e| io_err(&comps, e))?;
        let now = self.open_at(&comps, OFlags::PATH | OFlags::DIRECTORY)?;
        let now = rustix::fs::fstat(&now).map_err(|e| io_err(&comps, e))?;
        if (before.st_dev, before.st_ino) != (now.st_dev, now.st_ino) {
            return Err(FsError::Changed(show(&comps)));
        }
        Ok(out)
    }

    /// See [`create_dir_all_no_follow`].
    pub fn create_dir_all(&self, rel: &Path) -> Result<(), FsError> {
        self.open_parent(&normalize(rel)?, true).map(drop)
    }

    /// Opens the entry itself (O_PATH), so a final symlink is seen rather than followed.
    fn open_entry(&self, comps: &[&OsStr]) -> Result<OwnedFd, FsError> {
        let fd = self.open_at(comps, OFlags::PATH)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(comps, e))?;
        if is_type(&st, FileType::Symlink) {
            return Err(FsError::Symlink(show(comps)));
        }
        Ok(fd)
    }

    /// See [`reject_symlink`].
    pub fn reject_symlink(&self, rel: &Path) -> Result<(), FsError> {
        self.open_entry(&normalize(rel)?).map(drop)
    }

    /// See [`metadata_no_follow`].
    pub fn metadata(&self, rel: &Path) -> Result<std::fs::Metadata, FsError> {
        let comps = normalize(rel)?;
        let fd = self.open_entry(&comps)?;
        File::from(fd).metadata().map_err(|e| io_err(&comps, e))
    }

    /// See [`remove_file_no_follow`].
    pub fn remove_file(&self, rel: &Path) -> Result<(), FsError> {
        let comps = normalize(rel)?;
        let (name, parents) = split_name(&comps)?;
        let dir = self.open_parent(parents, false)?;
        match self.stat_entry(&dir, name, &comps)? {
            None => return Err(FsError::NotFound(show(&comps))),
            Some(st) if is_type(&st, FileType::Directory) => {
                return Err(FsError::IsADirectory(show(&comps)));
            }
            Some(_) => {}
        }
        // A swap to a symlink after the check only unlinks the link entry itself, inside the root.
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| self.classify(&comps, e))
    }

    /// See [`rename_no_follow`].
    pub fn rename(&self, from: &Path, to: &Path, create_parents: bool) -> Result<(), FsError> {
        let (from_c, to_c) = (normalize(from)?, normalize(to)?);
        let (from_name, from_parents) = split_name(&from_c)?;
        let (to_name, to_parents) = split_name(&to_c)?;
        let from_dir = self.open_parent(from_parents, false)?;
        if self.stat_entry(&from_dir, from_name, &from_c)?.is_none() {
            return Err(FsError::NotFound(show(&from_c)));
        }
        let to_dir = self.open_parent(to_parents, create_parents)?;
        self.stat_entry(&to_dir, to_name, &to_c)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name)
            .map_err(|e| self.classify(&to_c, e))
    }
}

/// The prefix of the temp file a write goes through before it is renamed over its target.
const TEMP_PREFIX: &str = ".tmp-write.";

/// Removes the temp files of writes that never finished (the process died between creating
/// and renaming one) anywhere below `root`, if last changed at least `older_than` ago;
/// answers how many went. Symlinks are not followed, so nothing outside `root` is touched.
pub fn remove_stale_temp_files(root: &Path, older_than: std::time::Duration) -> usize {
    let walk = ignore::WalkBuilder::new(root)
        .standard_filters(false)
        .follow_links(false)
        .build();
    let mut removed = 0;
    for entry in walk.flatten() {
        let stale = entry.file_type().is_some_and(|kind| kind.is_file())
            && entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(TEMP_PREFIX))
            && entry
                .metadata()
                .ok()
                .and_then(|meta| meta.modified().ok())
                .and_then(|at| at.elapsed().ok())
                .is_some_and(|age| age >= older_than);
        if stale && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Creates a uniquely named, empty temp file next to the target.
fn create_temp(dir: &OwnedFd, comps: &[&OsStr]) -> Result<(OwnedFd, OsString), FsError> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..16 {
        let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = OsString::from(format!("{TEMP_PREFIX}{}.{seq}.{nanos}", std::process::id()));
        // 0o666 lets the umask decide, as for any newly created file; fchmod overrides for replacements.
        match rustix::fs::openat(dir, &name, flags, Mode::from_bits_truncate(0o666)) {
            Ok(fd) => return Ok((fd, name)),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(io_err(comps, e)),
        }
    }
    Err(io_err(comps, Errno::EXIST))
}

/// Unlinks the temp file unless the rename already consumed it.
struct TempGuard<'a> {
    dir: &'a OwnedFd,
    name: Option<OsString>,
}

impl TempGuard<'_> {
    fn disarm(mut self) {
        self.name = None;
    }
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = rustix::fs::unlinkat(self.dir, &name, AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    #[test]
    fn stale_temp_files_are_removed_below_the_root_only() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let old = |path: &Path| {
            fs::write(path, b"half").unwrap();
            fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        };
        old(&root.join("a/b/.tmp-write.1.2.3"));
        old(&root.join(".tmp-write.4.5.6"));
        old(&root.join("a/kept.txt"));
        old(&outside.join(".tmp-write.7.8.9"));
        fs::write(root.join("a/.tmp-write.9.9.9"), b"in flight").unwrap();
        symlink(&outside, root.join("link")).unwrap();

        let ten_minutes = std::time::Duration::from_secs(600);
        assert_eq!(remove_stale_temp_files(&root, ten_minutes), 2);
        assert!(!root.join("a/b/.tmp-write.1.2.3").exists());
        assert!(!root.join(".tmp-write.4.5.6").exists());
        assert!(root.join("a/kept.txt").exists(), "other files stay");
        assert!(
            root.join("a/.tmp-write.9.9.9").exists(),
            "a recent one may be in flight"
        );
        assert!(
            outside.join(".tmp-write.7.8.9").exists(),
            "the link is not followed"
        );
        // With no write in flight (a single node starting), every one is stale.
        assert_eq!(remove_stale_temp_files(&root, std::time::Duration::ZERO), 1);
    }

    /// A temp dir holding `root/` (the workspace) and `outside/secret.txt`.
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret.txt"), "top secret").unwrap();
        let _tmp = tmp;
        Fixture {
            _tmp,
            root,
            outside,
        }
    }

    /// Runs a behaviour test on a fresh fixture under every strategy this kernel supports.
    fn each_walk(test: impl Fn(&Fixture, &Beneath)) {
        let walks: &[Walk] = match Walk::detect() {
            Walk::Openat2 => &[Walk::Openat2, Walk::Components],
            Walk::Components => &[Walk::Components],
        };
        for &w in walks {
            eprintln!("walk strategy: {w:?}");
            let f = fixture();
            test(&f, &Beneath::new(&f.root, w).unwrap());
        }
    }

    #[track_caller]
    fn is<T: std::fmt::Debug>(r: Result<T, FsError>, want: &str) {
        assert_eq!(r.unwrap_err().kind(), want);
    }

    #[track_caller]
    fn msg<T: std::fmt::Debug>(r: Result<T, FsError>) -> String {
        r.unwrap_err().to_string()
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn names(dir: &Path) -> Vec<String> {
        let entries = fs::read_dir(dir).unwrap();
        let mut v: Vec<_> = entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn probe_is_consistent_with_kernel() {
        let raw = rustix::fs::openat2(CWD, ".", OFlags::PATH, Mode::empty(), RESOLVE);
        let supported = !matches!(raw, Err(Errno::NOSYS | Errno::PERM));
        assert_eq!(Walk::detect() == Walk::Openat2, supported);
    }

    #[test]
    fn resolve_path_is_lexical() {
        let r = Path::new("/ws");
        assert_eq!(resolve_path(r, "a/./b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(resolve_path(r, "a//b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(resolve_path(r, "a/../b").unwrap(), PathBuf::from("b"));
        assert_eq!(resolve_path(r, "").unwrap(), PathBuf::new());
        assert_eq!(resolve_path(r, ".").unwrap(), PathBuf::new());
        is(resolve_path(r, ".."), "escapes_root");
        is(resolve_path(r, "a/../../b"), "escapes_root");
        is(resolve_path(r, "/etc/passwd"), "absolute_path");
        is(resolve_path(r, "a\0b"), "nul_byte");
        let want = "path \"../x\" escapes the workspace root";
        assert_eq!(msg(resolve_path(r, "../x")), want);
    }

    #[test]
    fn public_api_round_trip() {
        let f = fixture();
        write_no_follow(&f.root, p("d/a.txt"), b"hi", true).unwrap();
        assert_eq!(read_no_follow(&f.root, p("d/a.txt"), 10).unwrap(), b"hi");
        assert_eq!(metadata_no_follow(&f.root, p("d/a.txt")).unwrap().len(), 2);
        let root_dir = open_dir_no_follow(&f.root, p("")).unwrap();
        assert!(root_dir.metadata().unwrap().is_dir());
        is(
            read_no_follow(&f.root, p("../outside/secret.txt"), 100),
            "escapes_root",
        );
        is(
            read_no_follow(&f.root, p("/etc/passwd"), 100),
            "absolute_path",
        );
    }

    #[test]
    fn read_write_round_trip() {
        each_walk(|_, b| {
            b.write(p("a.txt"), b"one", false).unwrap();
            assert_eq!(b.read(p("a.txt"), 100).unwrap(), b"one");
            b.write(p("./a.txt"), b"second", false).unwrap();
            assert_eq!(b.read(p("x/../a.txt"), 100).unwrap(), b"second");
            assert!(b.metadata(p("a.txt")).unwrap().is_file());
            assert!(b.metadata(p("")).unwrap().is_dir());
            b.reject_symlink(p("a.txt")).unwrap();
            is(b.read(p("missing.txt"), 100), "not_found");
            is(b.read(p(""), 100), "is_a_directory");
            is(b.write(p(""), b"x", false), "is_a_directory");
        });
    }

    #[test]
    fn write_creates_parents_only_when_asked() {
        each_walk(|f, b| {
            assert_eq!(
                msg(b.write(p("x/y/z.txt"), b"z", false)),
                "\"x/y\" does not exist"
            );
            assert!(!f.root.join("x").exists());
            b.write(p("x/y/z.txt"), b"z", true).unwrap();
            assert_eq!(fs::read(f.root.join("x/y/z.txt")).unwrap(), b"z");
            b.create_dir_all(p("x/q/r")).unwrap();
            let listed = b.list_dir(p("x")).unwrap();
            let got: Vec<_> = listed
                .iter()
                .map(|e| (e.name.to_str().unwrap(), e.kind))
                .collect();
            assert_eq!(got, [("q", EntryKind::Dir), ("y", EntryKind::Dir)]);
        });
    }

    #[test]
    fn symlinked_final_file_is_refused() {
        each_walk(|f, b| {
            symlink(f.outside.join("secret.txt"), f.root.join("link")).unwrap();
            fs::write(f.root.join("plain.txt"), "p").unwrap();
            let want = "refusing to follow symbolic link at \"link\"";
            assert_eq!(msg(b.read(p("link"), 100)), want);
            is(b.open_file(p("link")), "symlink");
            is(b.write(p("link"), b"pwned", false), "symlink");
            is(b.metadata(p("link")), "symlink");
            is(b.reject_symlink(p("link")), "symlink");
            is(b.remove_file(p("link")), "symlink");
            is(b.rename(p("link"), p("moved"), false), "symlink");
            is(b.rename(p("plain.txt"), p("link"), false), "symlink");
            assert_eq!(
                fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
                "top secret"
            );
            assert!(
                fs::symlink_metadata(f.root.join("link"))
                    .unwrap()
                    .is_symlink()
            );
            assert_eq!(names(&f.root), ["link", "plain.txt"]);
            assert_eq!(b.list_dir(p("")).unwrap()[0].kind, EntryKind::Symlink);
        });
    }

    #[test]
    fn symlinked_parent_directory_is_refused() {
        each_walk(|f, b| {
            symlink(&f.outside, f.root.join("sub")).unwrap();
            fs::create_dir(f.root.join("d")).unwrap();
            symlink(&f.outside, f.root.join("d/deep")).unwrap();
            fs::write(f.root.join("a.txt"), "a").unwrap();
            let want = "refusing to follow symbolic link at \"sub\"";
            assert_eq!(msg(b.read(p("sub/secret.txt"), 100)), want);
            let want = "refusing to follow symbolic link at \"d/deep\"";
            assert_eq!(msg(b.read(p("d/deep/secret.txt"), 100)), want);
            for create in [false, true] {
                is(b.write(p("sub/new.txt"), b"x", create), "symlink");
                is(b.write(p("sub/x/new.txt"), b"x", create), "symlink");
            }
            is(b.open_dir(p("sub")), "symlink");
            is(b.list_dir(p("sub")), "symlink");
            is(b.create_dir_all(p("sub/x")), "symlink");
            is(b.reject_symlink(p("sub")), "symlink");
            is(b.reject_symlink(p("sub/secret.txt")), "symlink");
            is(b.metadata(p("sub/secret.txt")), "symlink");
            is(b.remove_file(p("sub/secret.txt")), "symlink");
            is(
                b.rename(p("sub/secret.txt"), p("got.txt"), false),
                "symlink",
            );
            is(b.rename(p("a.txt"), p("sub/a.txt"), true), "symlink");
            assert_eq!(names(&f.outside), ["secret.txt"]);
            assert_eq!(
                fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
                "top secret"
            );
            assert_eq!(names(&f.root), ["a.txt", "d", "sub"]);
        });
    }

    #[test]
    fn file_swapped_for_symlink_between_calls_is_refused() {
        each_walk(|f, b| {
            b.write(p("f.txt"), b"mine", false).unwrap();
            assert_eq!(b.read(p("f.txt"), 100).unwrap(), b"mine");
            fs::remove_file(f.root.join("f.txt")).unwrap();
            symlink(f.outside.join("secret.txt"), f.root.join("f.txt")).unwrap();
            is(b.read(p("f.txt"), 100), "symlink");
        });
    }

    #[test]
    fn atomic_write_keeps_mode_and_leaves_no_temp_files() {
        each_walk(|f, b| {
            let target = f.root.join("f.txt");
            fs::write(&target, "old").unwrap();
            fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
            b.write(p("f.txt"), b"new", false).unwrap();
            assert_eq!(
                fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
                0o600
            );
            assert_eq!(fs::read(&target).unwrap(), b"new");
            symlink(f.outside.join("secret.txt"), f.root.join("link")).unwrap();
            is(b.write(p("link"), b"x", false), "symlink");
            fs::create_dir(f.root.join("dir")).unwrap();
            is(b.write(p("dir"), b"x", false), "is_a_directory");
            for create in [false, true] {
                let err = msg(b.write(p("f.txt/child.txt"), b"x", create));
                assert_eq!(err, "\"f.txt\" is not a directory");
            }
            assert_eq!(names(&f.root), ["dir", "f.txt", "link"]);
            assert_eq!(fs::read(&target).unwrap(), b"new");
        });
    }

    #[test]
    fn temp_guard_removes_temp_file_unless_disarmed() {
        let f = fixture();
        let dir = rustix::fs::open(&f.root, DIR_FLAGS, Mode::empty()).unwrap();
        let (_, name) = create_temp(&dir, &[]).unwrap();
        drop(TempGuard {
            dir: &dir,
            name: Some(name),
        });
        assert!(names(&f.root).is_empty());
        let (_, name) = create_temp(&dir, &[]).unwrap();
        TempGuard {
            dir: &dir,
            name: Some(name.clone()),
        }
        .disarm();
        assert_eq!(names(&f.root), [name.into_string().unwrap()]);
    }

    #[test]
    fn too_large_is_refused() {
        each_walk(|f, b| {
            fs::write(f.root.join("big"), [7u8; 100]).unwrap();
            match b.read(p("big"), 99) {
                Err(FsError::TooLarge {
                    path,
                    size: 100,
                    limit: 99,
                }) => assert_eq!(path, "big"),
                other => panic!("{other:?}"),
            }
            assert_eq!(b.read(p("big"), 100).unwrap().len(), 100);
        });
    }

    /// `anchor/alice/sw` as a root beneath `anchor`, and Bob's project beside it.
    fn anchored_fixture() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let anchor = tmp.path().join("ws");
        fs::create_dir_all(anchor.join("alice/sw")).unwrap();
        fs::create_dir_all(anchor.join("bob/proj")).unwrap();
        fs::write(anchor.join("alice/sw/mine.txt"), "alice").unwrap();
        fs::write(anchor.join("bob/proj/secret.txt"), "bob").unwrap();
        (tmp, anchor)
    }

    fn walks() -> Vec<Walk> {
        match Walk::detect() {
            Walk::Openat2 => vec![Walk::Openat2, Walk::Components],
            Walk::Components => vec![Walk::Components],
        }
    }

    #[test]
    fn an_anchored_root_is_reached_without_links() {
        for walk in walks() {
            let (_tmp, anchor) = anchored_fixture();
            let b = Beneath::anchored(&anchor, p("alice/sw"), walk).unwrap();
            assert_eq!(b.read(p("mine.txt"), 100).unwrap(), b"alice");
            is(b.read(p("../mine.txt"), 100), "escapes_root");
            // The anchor itself may sit behind a link the operator made.
            symlink(&anchor, anchor.with_file_name("ws-link")).unwrap();
            let via = Beneath::anchored(&anchor.with_file_name("ws-link"), p("alice/sw"), walk);
            assert_eq!(via.unwrap().read(p("mine.txt"), 100).unwrap(), b"alice");
            let plain = Beneath::anchored(&anchor, p(""), walk).unwrap();
            assert_eq!(plain.read(p("alice/sw/mine.txt"), 100).unwrap(), b"alice");
            assert_eq!(
                RootPath::new(&anchor, "alice/sw").path(),
                anchor.join("alice/sw")
            );
            assert_eq!(RootPath::plain(&anchor).path(), anchor);
        }
    }

    #[test]
    fn an_anchored_root_swapped_for_a_symlink_is_refused() {
        for walk in walks() {
            let (_tmp, anchor) = anchored_fixture();
            let root = anchor.join("alice/sw");
            fs::rename(&root, anchor.join("alice/sw.old")).unwrap();
            symlink("../bob/proj", &root).unwrap();
            let err = Beneath::anchored(&anchor, p("alice/sw"), walk).unwrap_err();
            assert_eq!(err.kind(), "workspace_root");
            assert_eq!(
                err.to_string(),
                "the working directory \"alice/sw\" was refused: refusing to follow symbolic \
                 link at \"alice/sw\""
            );
            // A link higher up (the user's own directory) is refused the same way.
            fs::remove_file(&root).unwrap();
            fs::rename(anchor.join("alice/sw.old"), &root).unwrap();
            fs::rename(anchor.join("alice"), anchor.join("alice.old")).unwrap();
            symlink("bob", anchor.join("alice")).unwrap();
            fs::create_dir(anchor.join("bob/sw")).unwrap();
            let err = Beneath::anchored(&anchor, p("alice/sw"), walk).unwrap_err();
            assert!(
                err.to_string()
                    .ends_with("refusing to follow symbolic link at \"alice\""),
                "{err}"
            );
            // Replaced by a file, or gone.
            fs::remove_file(anchor.join("alice")).unwrap();
            fs::write(anchor.join("alice"), "a file").unwrap();
            let err = Beneath::anchored(&anchor, p("alice/sw"), walk).unwrap_err();
            assert_eq!(err.kind(), "workspace_root", "{err}");
            fs::remove_file(anchor.join("alice")).unwrap();
            let err = Beneath::anchored(&anchor, p("alice/sw"), walk).unwrap_err();
            assert!(matches!(&err, FsError::Root { source, .. } if source.kind() == "not_found"));
            let err = Beneath::anchored(&anchor, p("../bob/proj"), walk).unwrap_err();
            assert!(
                matches!(&err, FsError::Root { source, .. } if source.kind() == "escapes_root")
            );
            assert_eq!(
                fs::read(anchor.join("bob/proj/secret.txt")).unwrap(),
                b"bob"
            );
        }
    }

    #[test]
    fn remove_and_rename_inside_root() {
        each_walk(|_, b| {
            b.write(p("a.txt"), b"a", false).unwrap();
            b.rename(p("a.txt"), p("n/e/b.txt"), true).unwrap();
            assert_eq!(b.read(p("n/e/b.txt"), 10).unwrap(), b"a");
            is(b.rename(p("a.txt"), p("c.txt"), false), "not_found");
            is(b.remove_file(p("n/e")), "is_a_directory");
            b.remove_file(p("n/e/b.txt")).unwrap();
            is(b.remove_file(p("n/e/b.txt")), "not_found");
            assert!(b.list_dir(p("n/e")).unwrap().is_empty());
        });
    }
}
