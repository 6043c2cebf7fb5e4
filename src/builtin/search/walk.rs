//! Which files a search visits: the walk beneath the root that honours ignore files and
//! never follows a link, and the glob filter on the paths it yields.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::fs_safe::{Beneath, DirEntryInfo, EntryKind};
use crate::tools::ToolError;

/// Largest ignore file read; a larger one is not applied.
const IGNORE_FILE_LIMIT: u64 = 1 << 20;

/// A compiled glob and what it is matched against.
pub(super) struct PathFilter {
    /// The compiled pattern.
    pub(super) matcher: GlobMatcher,
    /// Match the file name alone (a pattern without '/') rather than the path.
    pub(super) by_name: bool,
}

impl PathFilter {
    /// Whether `file` (relative to the root) passes, for a search that started at `start`.
    pub(super) fn accepts(&self, file: &Path, start: &Path) -> bool {
        if self.by_name {
            return file
                .file_name()
                .is_some_and(|name| self.matcher.is_match(name));
        }
        if self.matcher.is_match(file) {
            return true;
        }
        // Models often write the pattern relative to the directory they named.
        !start.as_os_str().is_empty()
            && file
                .strip_prefix(start)
                .is_ok_and(|inner| !inner.as_os_str().is_empty() && self.matcher.is_match(inner))
    }
}

/// Compiles the model's glob, naming its `field` in the error; `*` does not cross `/`.
pub(super) fn compile_glob(
    tool: &str,
    field: &str,
    pattern: &str,
) -> Result<GlobMatcher, ToolError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|err| ToolError::model("invalid_input", format!("{tool}: invalid {field}: {err}")))
}

/// The files under a starting path (or the starting file itself), depth first in path order,
/// relative to the root, honouring ignore files and hidden-file rules.
///
/// Every directory is listed through the root's descriptor without following a link
/// ([`Beneath::list_dir`]), so what a directory swapped for a symlink points at is never
/// read, and symlinks found inside are skipped. Ignore files are read the same way, at most
/// [`IGNORE_FILE_LIMIT`] bytes each. Those above the root are never consulted (a stray
/// catch-all `.gitignore` in a parent directory would otherwise hide everything); those
/// between the root and the start apply as they would to a walk from the root.
pub(super) struct FileWalk<'a> {
    root: &'a Beneath,
    /// The start, when it is a file: the one path to yield.
    single: Option<PathBuf>,
    /// Directories being read, innermost last, each with its remaining entries.
    open: Vec<(PathBuf, std::vec::IntoIter<DirEntryInfo>)>,
    /// One level of ignore rules per directory from the root down to the innermost open one.
    ignores: Vec<DirIgnores>,
    /// Directories that could not be listed.
    pub(super) unreadable: usize,
}

impl<'a> FileWalk<'a> {
    /// A walk of `start` (a file or a directory) beneath `root`.
    pub(super) fn new(root: &'a Beneath, start: &Path) -> Self {
        let mut walk = Self {
            root,
            single: None,
            open: Vec::new(),
            ignores: Vec::new(),
            unreadable: 0,
        };
        match root.metadata(start) {
            Ok(meta) if meta.is_file() => walk.single = Some(start.to_path_buf()),
            Ok(meta) if meta.is_dir() => {
                let mut above = PathBuf::new();
                for comp in start.components() {
                    walk.ignores.push(DirIgnores::load(root, &above, None));
                    above.push(comp);
                }
                walk.enter(start.to_path_buf());
            }
            Ok(_) => {}
            Err(_) => walk.unreadable += 1,
        }
        walk
    }

    fn enter(&mut self, dir: PathBuf) {
        match self.root.list_dir(&dir) {
            Ok(entries) => {
                self.ignores
                    .push(DirIgnores::load(self.root, &dir, Some(&entries)));
                self.open.push((dir, entries.into_iter()));
            }
            Err(_) => self.unreadable += 1,
        }
    }

    /// Whether the nearest rule says to skip `path`; without one, hidden names are skipped.
    /// As ripgrep does, every `.ignore` outranks every `.gitignore`, which outranks every
    /// exclude file, and within each kind the deepest directory wins.
    fn skips(&self, path: &Path, name: &std::ffi::OsStr, is_dir: bool) -> bool {
        for kind in 0..IGNORE_FILES.len() {
            for level in self.ignores.iter().rev() {
                let Some(matcher) = &level.0[kind] else {
                    continue;
                };
                match matcher.matched(path, is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
        }
        name.as_bytes().first() == Some(&b'.')
    }
}

impl Iterator for FileWalk<'_> {
    type Item = PathBuf;

    fn next(&mut self) -> Option<PathBuf> {
        if let Some(file) = self.single.take() {
            return Some(file);
        }
        loop {
            let (dir, entries) = self.open.last_mut()?;
            let Some(entry) = entries.next() else {
                self.open.pop();
                self.ignores.pop();
                continue;
            };
            let is_dir = match entry.kind {
                EntryKind::Dir => true,
                EntryKind::File => false,
                EntryKind::Symlink | EntryKind::Other => continue,
            };
            let path = dir.join(&entry.name);
            if self.skips(&path, &entry.name, is_dir) {
                continue;
            }
            if is_dir {
                self.enter(path);
            } else {
                return Some(path);
            }
        }
    }
}

/// The ignore files a directory may hold, in falling precedence, and the name in its listing
/// that says the file may be there.
const IGNORE_FILES: [(&str, &str); 3] = [
    (".ignore", ".ignore"),
    (".gitignore", ".gitignore"),
    (".git/info/exclude", ".git"),
];

/// One directory's ignore rules, one slot per entry of [`IGNORE_FILES`].
struct DirIgnores([Option<Gitignore>; 3]);

impl DirIgnores {
    /// Reads `dir`'s ignore files through the root; with its listing at hand, only those the
    /// listing shows are opened.
    fn load(root: &Beneath, dir: &Path, listing: Option<&[DirEntryInfo]>) -> Self {
        let load_one = |(file, marker): (&str, &str)| {
            let present = listing.is_none_or(|entries| {
                entries
                    .binary_search_by(|e| e.name.as_os_str().cmp(std::ffi::OsStr::new(marker)))
                    .is_ok()
            });
            if !present {
                return None;
            }
            let bytes = root.read(&dir.join(file), IGNORE_FILE_LIMIT).ok()?;
            let mut builder = GitignoreBuilder::new(dir);
            for line in String::from_utf8_lossy(&bytes).lines() {
                // A bad line is dropped, as git does; the rest still apply.
                let _ = builder.add_line(None, line);
            }
            builder.build().ok().filter(|matcher| !matcher.is_empty())
        };
        Self(IGNORE_FILES.map(load_one))
    }
}
