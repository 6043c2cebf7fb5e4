//! Read-only search tools over a session's workspace: `list_dir` (a tree listing), `glob`
//! (files by path pattern) and `grep` (regex search of file contents).
//!
//! Every walk runs on a blocking thread, stops when the call is cancelled and never leaves the
//! workspace, even while its directories are being swapped for symbolic links: each call opens
//! the root once ([`Workspace::open_root`]) and reaches every directory, file and ignore file
//! from that descriptor without following a link ([`Beneath`]); a directory is listed only if
//! it is still the one at its path once read, every path `glob` prints is checked again, and
//! `grep` reads only files opened that way, a line at most [`GREP_MAX_LINE_BYTES`] long.

use std::any::Any;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::parse_args;
use crate::tools::fs_safe::{Beneath, DirEntryInfo, EntryKind};
use crate::tools::{ConcurrencyClass, Tool, ToolContext, ToolError, ToolResult, Workspace};

const TAGS: &[&str] = &["search"];

/// Deepest `list_dir` listing.
const LIST_MAX_DEPTH: usize = 5;
/// Entries `list_dir` shows.
const LIST_CAP: usize = 1_000;
/// Entries `list_dir` counts past its cap before it stops walking and reports "at least".
const LIST_COUNT_LIMIT: usize = 100_000;
/// Paths `glob` shows.
const GLOB_CAP: usize = 1_000;
/// Matching lines `grep` shows unless asked otherwise.
const GREP_DEFAULT_RESULTS: usize = 100;
/// Most matching lines `grep` will show.
const GREP_MAX_RESULTS: usize = 1_000;
/// Characters of one matching line `grep` shows.
const GREP_LINE_CHARS: usize = 500;
/// Longest line `grep` holds in memory; a file is searched only up to a longer line, which is
/// never read whole (and reported), so one huge line cannot take the server's memory.
pub const GREP_MAX_LINE_BYTES: usize = 1 << 20;
/// Files with such a line named in a `grep` answer.
const GREP_LONG_LINE_NAMES: usize = 10;
/// Largest ignore file read; a larger one is not applied.
const IGNORE_FILE_LIMIT: u64 = 1 << 20;

/// `list_dir`: an indented tree of a directory beneath the workspace root.
pub struct ListDir {
    workspace: Arc<Workspace>,
}

impl ListDir {
    /// A `list_dir` tool confined to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListDirArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<u64>,
}

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "List a directory of the workspace as an indented tree sorted by name. Directories end \
         with '/', symbolic links are shown as 'name -> (symlink, not followed)' and never \
         entered. Shows everything, including hidden and git-ignored entries. At most 1000 \
         entries are shown; a final line says how many more there were. Use `glob` to find \
         files by pattern and `grep` to search contents."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "Which directory to list and how deep.",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Directory to list, relative to the workspace root; defaults to the root. Absolute paths, '..' escapes and symbolic links are refused."
                },
                "depth": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": LIST_MAX_DEPTH,
                    "description": "How many levels to show: 1 (default) lists only the directory's own entries, 2 also the entries of its subdirectories, up to 5."
                }
            },
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        TAGS
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Safe
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(args, &CancellationToken::new()).await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.run(args, &ctx.cancel).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl ListDir {
    async fn run(&self, args: &Value, cancel: &CancellationToken) -> Result<ToolResult, ToolError> {
        let args: ListDirArgs = parse_args("list_dir", args)?;
        let depth = match args.depth {
            None => 1,
            Some(d) if (1..=LIST_MAX_DEPTH as u64).contains(&d) => d as usize,
            Some(d) => {
                return Err(ToolError::model(
                    "invalid_input",
                    format!("list_dir: depth must be between 1 and {LIST_MAX_DEPTH}, got {d}"),
                ));
            }
        };
        let workspace = Arc::clone(&self.workspace);
        blocking("list_dir", cancel, move |cancel| {
            let root = workspace.open_root()?;
            let rel = resolve_start(&workspace, &root, args.path.as_deref())?;
            list_tree(&root, &rel, depth, LIST_CAP, &cancel)
        })
        .await
    }
}

/// The lines of a `list_dir` answer and what did not fit.
struct Tree {
    lines: Vec<String>,
    cap: usize,
    more: usize,
}

impl Tree {
    fn push(&mut self, level: usize, text: String) {
        if self.lines.len() > self.cap {
            self.more += 1;
        } else {
            self.lines.push(format!("{}{text}", "  ".repeat(level)));
        }
    }

    /// Past this many entries beyond the cap, an exact count is not worth a longer walk.
    fn counted_enough(&self) -> bool {
        self.more >= LIST_COUNT_LIMIT
    }
}

/// Lists `rel` to `depth` levels, showing at most `cap` entries.
fn list_tree(
    root: &Beneath,
    rel: &Path,
    depth: usize,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<ToolResult, ToolError> {
    let entries = root.list_dir(rel)?;
    let shown = display(rel);
    let mut tree = Tree {
        // The header line is not an entry, so it does not count against the cap.
        lines: vec![format!("{shown}/")],
        cap,
        more: 0,
    };
    list_entries(root, rel, entries, 1, depth, &mut tree, cancel)?;
    let shown_entries = tree.lines.len() - 1;
    let mut output = if shown_entries == 0 {
        format!("{shown}/ is empty")
    } else {
        tree.lines.join("\n")
    };
    if tree.more > 0 {
        let at_least = if tree.counted_enough() {
            "at least "
        } else {
            ""
        };
        output.push_str(&format!(
            "\n… {at_least}{} more entries not shown; list a subdirectory or use a smaller depth",
            tree.more
        ));
    }
    let metadata = json!({"entries": shown_entries, "more": tree.more});
    Ok(ToolResult::ok(output).with_metadata(metadata))
}

fn list_entries(
    root: &Beneath,
    dir: &Path,
    entries: Vec<DirEntryInfo>,
    level: usize,
    depth: usize,
    tree: &mut Tree,
    cancel: &CancellationToken,
) -> Result<(), ToolError> {
    if cancel.is_cancelled() {
        return Err(cancelled("list_dir"));
    }
    for entry in entries {
        if tree.counted_enough() {
            return Ok(());
        }
        let name = entry.name.to_string_lossy();
        let text = match entry.kind {
            EntryKind::Dir => format!("{name}/"),
            EntryKind::Symlink => format!("{name} -> (symlink, not followed)"),
            EntryKind::File => name.into_owned(),
            EntryKind::Other => format!("{name} (special file)"),
        };
        tree.push(level, text);
        if entry.kind == EntryKind::Dir && level < depth {
            let child = dir.join(&entry.name);
            match root.list_dir(&child) {
                Ok(children) => {
                    list_entries(root, &child, children, level + 1, depth, tree, cancel)?;
                }
                // One unreadable subdirectory should not hide the rest of the tree.
                Err(err) => tree.push(level + 1, format!("(not listed: {err})")),
            }
        }
    }
    Ok(())
}

/// `glob`: files whose path matches a glob pattern, honouring ignore files.
pub struct Glob {
    workspace: Arc<Workspace>,
}

impl Glob {
    /// A `glob` tool confined to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> &str {
        "Find files whose path matches a glob pattern, e.g. '**/*.rs' or 'src/**/test_*.py'. \
         The pattern is matched against each file's path relative to the workspace root (and, \
         when `path` is given, also relative to `path`); '*' and '?' do not cross '/', '**' \
         spans directories, '{a,b}' and '[abc]' work as usual. Files ignored by .gitignore or \
         .ignore, hidden files and directories (names starting with '.') and symbolic links \
         are skipped; give `path` to search inside a hidden directory. Returns sorted paths \
         relative to the root, at most 1000, with a count of the rest."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "Which files to find.",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Glob pattern matched against file paths relative to the workspace root, e.g. '**/*.rs'. Use '**/' to match at any depth: '*.rs' matches only files at the top."
                },
                "path": {
                    "type": "string",
                    "description": "Directory to search, relative to the workspace root; defaults to the root."
                }
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        TAGS
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Safe
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(args, &CancellationToken::new(), GLOB_CAP).await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.run(args, &ctx.cancel, GLOB_CAP).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Glob {
    async fn run(
        &self,
        args: &Value,
        cancel: &CancellationToken,
        cap: usize,
    ) -> Result<ToolResult, ToolError> {
        let args: GlobArgs = parse_args("glob", args)?;
        let matcher = compile_glob("glob", "pattern", &args.pattern)?;
        let workspace = Arc::clone(&self.workspace);
        blocking("glob", cancel, move |cancel| {
            let root = workspace.open_root()?;
            let rel = resolve_start(&workspace, &root, args.path.as_deref())?;
            let filter = PathFilter {
                matcher,
                by_name: false,
            };
            glob_files(&root, &rel, &filter, &args.pattern, cap, &cancel)
        })
        .await
    }
}

/// Walks `rel` and answers the sorted paths `filter` accepts, at most `cap` of them.
fn glob_files(
    root: &Beneath,
    rel: &Path,
    filter: &PathFilter,
    pattern: &str,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<ToolResult, ToolError> {
    let mut shown = Vec::new();
    let mut more = 0usize;
    // Unreadable directories are skipped, as a shell glob would.
    for file in FileWalk::new(root, rel) {
        if cancel.is_cancelled() {
            return Err(cancelled("glob"));
        }
        if !filter.accepts(&file, rel) {
            continue;
        }
        if shown.len() < cap {
            // Checked again at the moment it is reported: a regular file at this very path
            // beneath the root, reached without a link.
            if root.metadata(&file).is_ok_and(|m| m.is_file()) {
                shown.push(file);
            }
        } else {
            more += 1;
        }
    }
    // The walk already yields this order; sorting keeps it true whatever the walker does.
    shown.sort();
    let count = shown.len();
    let mut output = if shown.is_empty() {
        format!("No files match '{pattern}' under {}", display(rel))
    } else {
        shown
            .iter()
            .map(|p| display(p))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if more > 0 {
        output.push_str(&format!(
            "\n… {more} more not shown; narrow the pattern or the path"
        ));
    }
    Ok(ToolResult::ok(output).with_metadata(json!({"files": count, "more": more})))
}

/// `grep`: regex search of file contents, honouring ignore files and skipping binary files.
pub struct Grep {
    workspace: Arc<Workspace>,
}

impl Grep {
    /// A `grep` tool confined to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: Option<bool>,
    #[serde(default)]
    max_results: Option<u64>,
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        "Search file contents with a regular expression (Rust regex syntax, one line at a \
         time). Answers 'path:line:text' lines, sorted by path then line number, paths \
         relative to the workspace root, each line cut at 500 characters. Files ignored by \
         .gitignore or .ignore, hidden files, binary files and symbolic links are skipped. \
         Shows at most `max_results` lines (default 100) and says when it stopped there."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "What to search for and where.",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Regular expression to find, e.g. 'fn\\s+main' or 'TODO|FIXME'. Escape regex metacharacters to search for them literally. It cannot match across lines."
                },
                "path": {
                    "type": "string",
                    "description": "File or directory to search, relative to the workspace root; defaults to the root."
                },
                "glob": {
                    "type": "string",
                    "description": "Only search files matching this glob. Without a '/' it matches file names at any depth ('*.rs'); with one it matches paths relative to the workspace root ('src/**/*.rs')."
                },
                "case_insensitive": {
                    "type": "boolean",
                    "description": "Match letters regardless of case; default false."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": GREP_MAX_RESULTS,
                    "description": "Most matching lines to return, 1 to 1000; default 100."
                }
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        TAGS
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Safe
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(args, &CancellationToken::new()).await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.run(args, &ctx.cancel).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Grep {
    async fn run(&self, args: &Value, cancel: &CancellationToken) -> Result<ToolResult, ToolError> {
        let args: GrepArgs = parse_args("grep", args)?;
        let max_results = match args.max_results {
            None => GREP_DEFAULT_RESULTS,
            Some(n) if (1..=GREP_MAX_RESULTS as u64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ToolError::model(
                    "invalid_input",
                    format!("grep: max_results must be between 1 and {GREP_MAX_RESULTS}, got {n}"),
                ));
            }
        };
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(args.case_insensitive.unwrap_or(false))
            // Searching is line by line; a pattern that needs '\n' could never match.
            .line_terminator(Some(b'\n'))
            // Binary detection stops at NUL, so a pattern for it could never match either.
            .ban_byte(Some(b'\x00'))
            .build(&args.pattern)
            .map_err(|err| {
                ToolError::model(
                    "invalid_input",
                    format!("grep: invalid regular expression: {err}"),
                )
            })?;
        let filter = match &args.glob {
            Some(glob) => Some(PathFilter {
                matcher: compile_glob("grep", "glob", glob)?,
                by_name: !glob.contains('/'),
            }),
            None => None,
        };
        let workspace = Arc::clone(&self.workspace);
        blocking("grep", cancel, move |cancel| {
            let root = workspace.open_root()?;
            let rel = resolve_start(&workspace, &root, args.path.as_deref())?;
            let found = grep_files(&root, &rel, &matcher, filter.as_ref(), max_results, &cancel)?;
            Ok(found.into_result(&args.pattern, &rel, max_results))
        })
        .await
    }
}

/// What a grep walk found.
#[derive(Debug, Default)]
struct GrepFound {
    lines: Vec<String>,
    truncated: bool,
    files_searched: usize,
    binary_skipped: usize,
    unreadable: usize,
    /// Files searched only up to a line longer than [`GREP_MAX_LINE_BYTES`].
    long_lines: Vec<String>,
}

impl GrepFound {
    fn into_result(self, pattern: &str, rel: &Path, max_results: usize) -> ToolResult {
        let count = self.lines.len();
        let mut output = if self.lines.is_empty() {
            format!(
                "No matches for /{pattern}/ under {} ({} files searched)",
                display(rel),
                self.files_searched
            )
        } else {
            self.lines.join("\n")
        };
        if self.truncated {
            output.push_str(&format!(
                "\n… results truncated at {max_results}; narrow the pattern, path or glob, or \
                 raise max_results"
            ));
        }
        if self.unreadable > 0 {
            output.push_str(&format!(
                "\n({} files or directories could not be read)",
                self.unreadable
            ));
        }
        if !self.long_lines.is_empty() {
            let mut names =
                self.long_lines[..self.long_lines.len().min(GREP_LONG_LINE_NAMES)].join(", ");
            if self.long_lines.len() > GREP_LONG_LINE_NAMES {
                names.push_str(&format!(
                    " and {} more",
                    self.long_lines.len() - GREP_LONG_LINE_NAMES
                ));
            }
            output.push_str(&format!(
                "\n({} files searched only up to a line longer than {} bytes, which was skipped \
                 with the rest of the file: {names})",
                self.long_lines.len(),
                GREP_MAX_LINE_BYTES
            ));
        }
        ToolResult::ok(output).with_metadata(json!({
            "matches": count,
            "truncated": self.truncated,
            "files_searched": self.files_searched,
            "binary_files_skipped": self.binary_skipped,
            "unreadable": self.unreadable,
            "long_line_files": self.long_lines,
        }))
    }
}

/// Searches the files under `rel`, stopping once more than `max_results` lines matched.
fn grep_files(
    root: &Beneath,
    rel: &Path,
    matcher: &RegexMatcher,
    filter: Option<&PathFilter>,
    max_results: usize,
    cancel: &CancellationToken,
) -> Result<GrepFound, ToolError> {
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(b'\x00'))
        .line_number(true)
        .heap_limit(Some(GREP_MAX_LINE_BYTES))
        .build();
    let mut found = GrepFound::default();
    let mut walk = FileWalk::new(root, rel);
    for file_rel in &mut walk {
        if cancel.is_cancelled() {
            return Err(cancelled("grep"));
        }
        if filter.is_some_and(|f| !f.accepts(&file_rel, rel)) {
            continue;
        }
        // Reopened without following links: the walk's view may be stale by now.
        let Ok(file) = root.open_file(&file_rel) else {
            found.unreadable += 1;
            continue;
        };
        let mut sink = FileSink {
            hits: Vec::new(),
            // One past the limit tells "exactly max_results" apart from "more".
            room: max_results + 1 - found.lines.len(),
            binary: false,
            cancel,
        };
        let shown = display(&file_rel);
        match searcher.search_file(matcher, &file, &mut sink) {
            Ok(()) => {}
            // The lines before it were searched; their matches still count.
            Err(err) if is_line_too_long(&err) => found.long_lines.push(shown.clone()),
            Err(_) => {
                found.unreadable += 1;
                continue;
            }
        }
        found.files_searched += 1;
        if sink.binary {
            found.binary_skipped += 1;
            continue;
        }
        for (line, text) in sink.hits {
            found.lines.push(format!("{shown}:{line}:{text}"));
        }
        if found.lines.len() > max_results {
            found.lines.truncate(max_results);
            found.truncated = true;
            break;
        }
    }
    if cancel.is_cancelled() {
        return Err(cancelled("grep"));
    }
    found.unreadable += walk.unreadable;
    Ok(found)
}

/// Whether a search stopped at the heap limit. grep-searcher reports it only as an I/O error
/// with this message; should the wording change, such a file counts as unreadable instead,
/// still without being read whole.
fn is_line_too_long(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::Other && err.to_string().contains("allocation limit")
}

/// Collects one file's matching lines; drops them all if the file turns out to be binary.
struct FileSink<'a> {
    hits: Vec<(u64, String)>,
    room: usize,
    binary: bool,
    cancel: &'a CancellationToken,
}

impl Sink for FileSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        let line = mat.line_number().unwrap_or(0);
        self.hits.push((line, clip_line(mat.bytes())));
        Ok(self.hits.len() < self.room && !self.cancel.is_cancelled())
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// A matched line without its terminator, cut to [`GREP_LINE_CHARS`] characters.
fn clip_line(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(GREP_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

/// A compiled glob and what it is matched against.
struct PathFilter {
    matcher: GlobMatcher,
    /// Match the file name alone (a pattern without '/') rather than the path.
    by_name: bool,
}

impl PathFilter {
    /// Whether `file` (relative to the root) passes, for a search that started at `start`.
    fn accepts(&self, file: &Path, start: &Path) -> bool {
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

fn compile_glob(tool: &str, field: &str, pattern: &str) -> Result<GlobMatcher, ToolError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|err| ToolError::model("invalid_input", format!("{tool}: invalid {field}: {err}")))
}

/// Resolves the model's starting path and refuses it if it is, or passes through, a symlink.
fn resolve_start(
    workspace: &Workspace,
    root: &Beneath,
    path: Option<&str>,
) -> Result<PathBuf, ToolError> {
    let rel = workspace.resolve(path.unwrap_or("."))?;
    root.reject_symlink(&rel)?;
    Ok(rel)
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
struct FileWalk<'a> {
    root: &'a Beneath,
    /// The start, when it is a file: the one path to yield.
    single: Option<PathBuf>,
    /// Directories being read, innermost last, each with its remaining entries.
    open: Vec<(PathBuf, std::vec::IntoIter<DirEntryInfo>)>,
    /// One level of ignore rules per directory from the root down to the innermost open one.
    ignores: Vec<DirIgnores>,
    /// Directories that could not be listed.
    unreadable: usize,
}

impl<'a> FileWalk<'a> {
    fn new(root: &'a Beneath, start: &Path) -> Self {
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

/// A relative path as the model sees it; the root itself is ".".
fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

fn cancelled(tool: &str) -> ToolError {
    ToolError::model("cancelled", format!("{tool} was cancelled"))
}

/// Runs a filesystem walk on a blocking thread, handing it its own clone of the cancel token.
async fn blocking<T, F>(
    tool: &'static str,
    cancel: &CancellationToken,
    job: F,
) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(CancellationToken) -> Result<T, ToolError> + Send + 'static,
{
    let token = cancel.clone();
    let run = move || {
        if token.is_cancelled() {
            return Err(cancelled(tool));
        }
        job(token)
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(outcome) => outcome,
        Err(err) => Err(ToolError::model(
            "internal_error",
            format!("{tool} stopped unexpectedly: {err}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    use tempfile::TempDir;

    use super::*;

    struct Fixture {
        _dir: TempDir,
        root: PathBuf,
        outside: PathBuf,
        ws: Arc<Workspace>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret.txt"), "needle top secret\n").unwrap();
        fs::write(outside.join("secret.rs"), "needle\n").unwrap();
        let ws = Workspace::new(&root);
        Fixture {
            _dir: dir,
            root,
            outside,
            ws,
        }
    }

    fn put(root: &Path, rel: &str, contents: impl AsRef<[u8]>) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    /// Runs a call and flattens it into (success, text) the way the registry would.
    async fn call(tool: &dyn Tool, args: Value) -> (bool, String) {
        let outcome = tokio::time::timeout(Duration::from_secs(30), tool.execute(&args))
            .await
            .expect("tool call timed out");
        match outcome {
            Ok(result) => (result.success, result.output),
            Err(ToolError::Model { message, .. }) => (false, message),
            Err(err) => panic!("unexpected fatal error: {err}"),
        }
    }

    async fn ok(tool: &dyn Tool, args: Value) -> String {
        let (success, output) = call(tool, args).await;
        assert!(success, "expected success, got: {output}");
        output
    }

    async fn fails(tool: &dyn Tool, args: Value) -> String {
        let (success, output) = call(tool, args).await;
        assert!(!success, "expected failure, got: {output}");
        output
    }

    // ---- list_dir ----

    #[tokio::test]
    async fn list_dir_depth_sorting_and_directory_marker() {
        let f = fixture();
        put(&f.root, "b.txt", "b");
        put(&f.root, "a.txt", "a");
        put(&f.root, "sub/inner.txt", "i");
        put(&f.root, "sub/deep/x.txt", "x");
        put(&f.root, "sub/deep/deeper/y.txt", "y");
        let tool = ListDir::new(Arc::clone(&f.ws));
        assert_eq!(ok(&tool, json!({})).await, "./\n  a.txt\n  b.txt\n  sub/");
        assert_eq!(
            ok(&tool, json!({"depth": 2})).await,
            "./\n  a.txt\n  b.txt\n  sub/\n    deep/\n    inner.txt"
        );
        assert_eq!(
            ok(&tool, json!({"path": "sub", "depth": 5})).await,
            "sub/\n  deep/\n    deeper/\n      y.txt\n    x.txt\n  inner.txt"
        );
        put(&f.root, "empty/.keep", "");
        fs::remove_file(f.root.join("empty/.keep")).unwrap();
        assert_eq!(ok(&tool, json!({"path": "empty"})).await, "empty/ is empty");
    }

    #[tokio::test]
    async fn list_dir_shows_symlinks_without_following_them() {
        let f = fixture();
        put(&f.root, "real/file.txt", "r");
        symlink(&f.outside, f.root.join("linkdir")).unwrap();
        symlink(f.outside.join("secret.txt"), f.root.join("linkfile")).unwrap();
        let tool = ListDir::new(Arc::clone(&f.ws));
        let out = ok(&tool, json!({"depth": 3})).await;
        assert_eq!(
            out,
            "./\n  linkdir -> (symlink, not followed)\n  linkfile -> (symlink, not followed)\n  real/\n    file.txt"
        );
        assert!(!out.contains("secret"));
        let err = fails(&tool, json!({"path": "linkdir"})).await;
        assert!(err.contains("symbolic link"), "{err}");
        let err = fails(&tool, json!({"path": "linkdir/"})).await;
        assert!(err.contains("symbolic link"), "{err}");
    }

    #[tokio::test]
    async fn list_dir_refuses_escapes_and_bad_input() {
        let f = fixture();
        put(&f.root, "a.txt", "a");
        let tool = ListDir::new(Arc::clone(&f.ws));
        let err = fails(&tool, json!({"path": "../outside"})).await;
        assert!(err.contains("escapes the workspace root"), "{err}");
        let err = fails(&tool, json!({"path": f.outside.to_str().unwrap()})).await;
        assert!(err.contains("absolute"), "{err}");
        let err = fails(&tool, json!({"path": "a.txt"})).await;
        assert!(err.contains("not a directory"), "{err}");
        let err = fails(&tool, json!({"path": "missing"})).await;
        assert!(err.contains("does not exist"), "{err}");
        for depth in [0, 6] {
            let err = fails(&tool, json!({"depth": depth})).await;
            assert!(err.contains("between 1 and 5"), "{err}");
        }
        let err = fails(&tool, json!({"recursive": true})).await;
        assert!(err.contains("unknown field"), "{err}");
    }

    #[test]
    fn list_dir_caps_entries_and_counts_the_rest() {
        let f = fixture();
        for name in ["a", "b", "c", "d"] {
            put(&f.root, &format!("{name}/x.txt"), "x");
        }
        let cancel = CancellationToken::new();
        let result = list_tree(&f.ws.open_root().unwrap(), Path::new(""), 2, 3, &cancel).unwrap();
        assert_eq!(
            result.output,
            "./\n  a/\n    x.txt\n  b/\n… 5 more entries not shown; list a subdirectory or use a smaller depth"
        );
        assert_eq!(
            result.structured_metadata,
            Some(json!({"entries": 3, "more": 5}))
        );
    }

    // ---- glob ----

    #[tokio::test]
    async fn glob_matches_recursively_and_sorts() {
        let f = fixture();
        for rel in [
            "z.rs",
            "a.rs",
            "src/lib.rs",
            "src/x/y.rs",
            "src-b/m.rs",
            "notes.txt",
        ] {
            put(&f.root, rel, "");
        }
        let tool = Glob::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*.rs"})).await,
            "a.rs\nsrc/lib.rs\nsrc/x/y.rs\nsrc-b/m.rs\nz.rs"
        );
        assert_eq!(ok(&tool, json!({"pattern": "*.rs"})).await, "a.rs\nz.rs");
        assert_eq!(
            ok(&tool, json!({"pattern": "src/**/*.rs", "path": "src"})).await,
            "src/lib.rs\nsrc/x/y.rs"
        );
        // A pattern written relative to `path` works too.
        assert_eq!(
            ok(&tool, json!({"pattern": "*.rs", "path": "src"})).await,
            "src/lib.rs"
        );
        let out = ok(&tool, json!({"pattern": "**/*.py"})).await;
        assert_eq!(out, "No files match '**/*.py' under .");
    }

    #[tokio::test]
    async fn glob_honours_gitignore_and_hidden_files() {
        let f = fixture();
        put(&f.root, ".gitignore", "target/\n*.log\n");
        put(&f.root, "keep.rs", "");
        put(&f.root, "debug.log", "");
        put(&f.root, "target/out.rs", "");
        put(&f.root, ".hidden.rs", "");
        put(&f.root, ".config/x.rs", "");
        put(&f.root, "sub/.ignore", "skip.rs\n");
        put(&f.root, "sub/skip.rs", "");
        put(&f.root, "sub/gen/a.log", "");
        put(&f.root, "sub/gen/b.rs", "");
        let tool = Glob::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*"})).await,
            "keep.rs\nsub/gen/b.rs"
        );
        // Starting below the root still applies the root's ignore file.
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*", "path": "sub/gen"})).await,
            "sub/gen/b.rs"
        );
        // Naming a hidden directory searches inside it.
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*.rs", "path": ".config"})).await,
            ".config/x.rs"
        );
    }

    #[tokio::test]
    async fn glob_ignores_ignore_files_above_the_root() {
        let f = fixture();
        // A catch-all ignore file in the directory holding the workspace.
        put(f.root.parent().unwrap(), ".gitignore", "*\n");
        put(&f.root, "src/a.rs", "");
        let tool = Glob::new(Arc::clone(&f.ws));
        assert_eq!(ok(&tool, json!({"pattern": "**/*.rs"})).await, "src/a.rs");
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*.rs", "path": "src"})).await,
            "src/a.rs"
        );
    }

    #[tokio::test]
    async fn ignore_rules_nest_and_linked_ignore_files_are_not_read() {
        let f = fixture();
        put(&f.root, ".gitignore", "*.log\n");
        put(&f.root, "a.log", "");
        put(&f.root, "keep/.gitignore", "!wanted.log\n");
        put(&f.root, "keep/wanted.log", "");
        put(&f.root, "keep/other.log", "");
        // A link to a catch-all ignore file outside would hide everything if it were read.
        put(&f.outside, "all", "*\n");
        put(&f.root, "sub/x.rs", "");
        symlink(f.outside.join("all"), f.root.join("sub/.gitignore")).unwrap();
        let tool = Glob::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*"})).await,
            "keep/wanted.log\nsub/x.rs"
        );
        assert_eq!(
            ok(&tool, json!({"pattern": "**/*", "path": "keep"})).await,
            "keep/wanted.log"
        );
    }

    #[tokio::test]
    async fn glob_never_follows_symlinks() {
        let f = fixture();
        put(&f.root, "own.rs", "");
        symlink(&f.outside, f.root.join("linkdir")).unwrap();
        symlink(f.outside.join("secret.rs"), f.root.join("link.rs")).unwrap();
        let tool = Glob::new(Arc::clone(&f.ws));
        assert_eq!(ok(&tool, json!({"pattern": "**/*.rs"})).await, "own.rs");
        let err = fails(&tool, json!({"pattern": "**/*.rs", "path": "linkdir"})).await;
        assert!(err.contains("symbolic link"), "{err}");
        let err = fails(&tool, json!({"pattern": "*", "path": ".."})).await;
        assert!(err.contains("escapes"), "{err}");
    }

    #[test]
    fn glob_caps_output_and_counts_the_rest() {
        let f = fixture();
        for name in ["e", "d", "c", "b", "a"] {
            put(&f.root, &format!("{name}.txt"), "");
        }
        let filter = PathFilter {
            matcher: compile_glob("glob", "pattern", "*.txt").unwrap(),
            by_name: false,
        };
        let cancel = CancellationToken::new();
        let result = glob_files(
            &f.ws.open_root().unwrap(),
            Path::new(""),
            &filter,
            "*.txt",
            3,
            &cancel,
        )
        .unwrap();
        assert_eq!(
            result.output,
            "a.txt\nb.txt\nc.txt\n… 2 more not shown; narrow the pattern or the path"
        );
    }

    #[tokio::test]
    async fn glob_reports_invalid_patterns() {
        let f = fixture();
        let tool = Glob::new(Arc::clone(&f.ws));
        let err = fails(&tool, json!({"pattern": "src/[abc"})).await;
        assert!(err.starts_with("glob: invalid pattern:"), "{err}");
        assert!(err.contains("unclosed character class"), "{err}");
        let err = fails(&tool, json!({})).await;
        assert!(err.contains("missing field `pattern`"), "{err}");
    }

    // ---- grep ----

    fn grep_tree(root: &Path) {
        put(root, "src/a.rs", "fn main() {\n    let needle = 1;\n}\n");
        put(root, "b.txt", "needle\nnothing\nNEEDLE\r\n");
        put(root, "docs/c.md", "a Needle here\n");
    }

    #[tokio::test]
    async fn grep_reports_file_line_text_sorted() {
        let f = fixture();
        grep_tree(&f.root);
        let tool = Grep::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "needle"})).await,
            "b.txt:1:needle\nsrc/a.rs:2:    let needle = 1;"
        );
        assert_eq!(
            ok(
                &tool,
                json!({"pattern": "needle", "case_insensitive": true})
            )
            .await,
            "b.txt:1:needle\nb.txt:3:NEEDLE\ndocs/c.md:1:a Needle here\nsrc/a.rs:2:    let needle = 1;"
        );
        assert_eq!(
            ok(&tool, json!({"pattern": "n[e]+dle", "path": "src/a.rs"})).await,
            "src/a.rs:2:    let needle = 1;"
        );
        let out = ok(&tool, json!({"pattern": "absent"})).await;
        assert_eq!(out, "No matches for /absent/ under . (3 files searched)");
    }

    #[tokio::test]
    async fn grep_glob_filter_by_name_or_path() {
        let f = fixture();
        grep_tree(&f.root);
        put(&f.root, "src/deep/d.rs", "needle\n");
        let tool = Grep::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "needle", "glob": "*.rs"})).await,
            "src/a.rs:2:    let needle = 1;\nsrc/deep/d.rs:1:needle"
        );
        assert_eq!(
            ok(&tool, json!({"pattern": "needle", "glob": "src/*.rs"})).await,
            "src/a.rs:2:    let needle = 1;"
        );
        assert_eq!(
            ok(
                &tool,
                json!({"pattern": "(?i)needle", "glob": "*.{md,txt}"})
            )
            .await,
            "b.txt:1:needle\nb.txt:3:NEEDLE\ndocs/c.md:1:a Needle here"
        );
        let err = fails(&tool, json!({"pattern": "x", "glob": "[oops"})).await;
        assert!(err.starts_with("grep: invalid glob:"), "{err}");
    }

    #[tokio::test]
    async fn grep_skips_binary_files() {
        let f = fixture();
        put(&f.root, "bin.dat", b"needle\x00\x01\x02needle\n");
        put(&f.root, "text.txt", "needle\n");
        let tool = Grep::new(Arc::clone(&f.ws));
        let result = tool.execute(&json!({"pattern": "needle"})).await.unwrap();
        assert_eq!(result.output, "text.txt:1:needle");
        let meta = result.structured_metadata.unwrap();
        assert_eq!(meta["binary_files_skipped"], 1);
        assert_eq!(meta["files_searched"], 2);
    }

    #[tokio::test]
    async fn grep_truncates_at_max_results() {
        let f = fixture();
        put(&f.root, "a.txt", "needle 1\nneedle 2\nneedle 3\n");
        put(&f.root, "b.txt", "needle 4\nneedle 5\n");
        let tool = Grep::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "needle", "max_results": 4})).await,
            "a.txt:1:needle 1\na.txt:2:needle 2\na.txt:3:needle 3\nb.txt:1:needle 4\n\
             … results truncated at 4; narrow the pattern, path or glob, or raise max_results"
        );
        assert_eq!(
            ok(&tool, json!({"pattern": "needle", "max_results": 2})).await,
            "a.txt:1:needle 1\na.txt:2:needle 2\n\
             … results truncated at 2; narrow the pattern, path or glob, or raise max_results"
        );
        // Exactly as many matches as allowed is not a truncation.
        let out = ok(&tool, json!({"pattern": "needle", "max_results": 5})).await;
        assert!(out.ends_with("b.txt:2:needle 5"), "{out}");
        for bad in [0, 1_001] {
            let err = fails(&tool, json!({"pattern": "needle", "max_results": bad})).await;
            assert!(err.contains("between 1 and 1000"), "{err}");
        }
    }

    #[tokio::test]
    async fn grep_honours_gitignore() {
        let f = fixture();
        put(&f.root, ".gitignore", "ignored.txt\n*.gen\n");
        put(&f.root, "ignored.txt", "needle\n");
        put(&f.root, "kept.txt", "needle\n");
        put(&f.root, "sub/x.gen", "needle\n");
        put(&f.root, "sub/y.txt", "needle\n");
        put(&f.root, ".hidden.txt", "needle\n");
        let tool = Grep::new(Arc::clone(&f.ws));
        assert_eq!(
            ok(&tool, json!({"pattern": "needle"})).await,
            "kept.txt:1:needle\nsub/y.txt:1:needle"
        );
        assert_eq!(
            ok(&tool, json!({"pattern": "needle", "path": "sub"})).await,
            "sub/y.txt:1:needle"
        );
    }

    #[tokio::test]
    async fn grep_never_reads_through_symlinks() {
        let f = fixture();
        put(&f.root, "own.txt", "needle mine\n");
        symlink(f.outside.join("secret.txt"), f.root.join("link.txt")).unwrap();
        symlink(&f.outside, f.root.join("linkdir")).unwrap();
        let tool = Grep::new(Arc::clone(&f.ws));
        let out = ok(&tool, json!({"pattern": "needle"})).await;
        assert_eq!(out, "own.txt:1:needle mine");
        let out = ok(&tool, json!({"pattern": "secret", "glob": "*.txt"})).await;
        assert!(out.starts_with("No matches"), "{out}");
        for path in ["link.txt", "linkdir", "linkdir/secret.txt"] {
            let err = fails(&tool, json!({"pattern": "needle", "path": path})).await;
            assert!(err.contains("symbolic link"), "{path}: {err}");
        }
        let err = fails(&tool, json!({"pattern": "needle", "path": "../outside"})).await;
        assert!(err.contains("escapes"), "{err}");
    }

    #[tokio::test]
    async fn grep_stops_a_file_at_a_line_over_the_limit_and_says_so() {
        let f = fixture();
        let mut big = b"needle before\n".to_vec();
        big.resize(big.len() + 3 * GREP_MAX_LINE_BYTES, b'x');
        big.extend_from_slice(b" needle inside the long line\nneedle after\n");
        put(&f.root, "big.txt", &big);
        put(&f.root, "small.txt", "needle\n");
        let tool = Grep::new(Arc::clone(&f.ws));
        let result = tool.execute(&json!({"pattern": "needle"})).await.unwrap();
        assert!(result.success, "{}", result.output);
        assert_eq!(
            result.output,
            format!(
                "big.txt:1:needle before\nsmall.txt:1:needle\n(1 files searched only up to a line \
                 longer than {GREP_MAX_LINE_BYTES} bytes, which was skipped with the rest of the \
                 file: big.txt)"
            )
        );
        let meta = result.structured_metadata.unwrap();
        assert_eq!(meta["long_line_files"], json!(["big.txt"]));
        assert_eq!(meta["files_searched"], 2);
        assert_eq!(meta["unreadable"], 0);
        // A line just under the limit is still searched whole.
        let mut fits = vec![b'y'; GREP_MAX_LINE_BYTES / 2];
        fits.extend_from_slice(b" needle\n");
        put(&f.root, "big.txt", &fits);
        let out = ok(&tool, json!({"pattern": "needle$", "path": "big.txt"})).await;
        assert!(out.starts_with("big.txt:1:yyy"), "{}", &out[..40]);
    }

    /// The hostile case: a directory of the workspace flipped 1,000 times with a symlink to a
    /// directory outside while the three tools run over it. No name or contents from outside
    /// may show in any answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_directory_swapped_for_a_symlink_during_walks_leaks_nothing() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

        let f = fixture();
        put(&f.outside, "passwd", "root:x:0:0 needle\n");
        put(&f.outside, "etc/passwd", "daemon:x:1:1 needle\n");
        put(&f.root, "d/own.txt", "needle inside\n");
        put(&f.root, "d/deep/mine.txt", "needle deep\n");
        put(&f.root, "alt/other.txt", "needle alt\n");
        // `d` and `swap` trade places on every flip: one is a directory, the other a link out.
        symlink(&f.outside, f.root.join("swap")).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let flipper = {
            let (d, swap) = (f.root.join("d"), f.root.join("swap"));
            let (done, calls) = (Arc::clone(&done), Arc::clone(&calls));
            std::thread::spawn(move || {
                // Flipping starts with the first call and then runs flat out: the more flips
                // land inside one walk, the likelier a walk that follows links is caught.
                while calls.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                for _ in 0..1_000 {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &d,
                        rustix::fs::CWD,
                        &swap,
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap();
                }
                done.store(true, Ordering::SeqCst);
            })
        };
        let tools: [(Arc<dyn Tool>, Value); 5] = [
            (
                Arc::new(Glob::new(Arc::clone(&f.ws))),
                json!({"pattern": "d*/**/passwd"}),
            ),
            (
                Arc::new(Glob::new(Arc::clone(&f.ws))),
                json!({"pattern": "**/*"}),
            ),
            (
                Arc::new(Grep::new(Arc::clone(&f.ws))),
                json!({"pattern": "needle|root"}),
            ),
            (
                Arc::new(ListDir::new(Arc::clone(&f.ws))),
                json!({"depth": 5}),
            ),
            (
                Arc::new(ListDir::new(Arc::clone(&f.ws))),
                json!({"path": "d", "depth": 3}),
            ),
        ];
        let mut rounds = 0;
        while !done.load(Ordering::SeqCst) && rounds < 100_000 {
            rounds += 1;
            for (tool, args) in &tools {
                calls.fetch_add(1, Ordering::SeqCst);
                let (_, out) = call(tool.as_ref(), args.clone()).await;
                // An answer that found nothing repeats the pattern; that is no leak.
                let out = out.replace(args["pattern"].as_str().unwrap_or("\0"), "");
                for leak in ["passwd", "root:x", "daemon", "etc", "secret"] {
                    assert!(!out.contains(leak), "{} leaked {leak}: {out}", tool.name());
                }
            }
        }
        flipper.join().unwrap();
        assert!(calls.load(Ordering::SeqCst) > 0);
        // The same tools still see the workspace's own files once the flipping stops.
        let out = ok(tools[1].0.as_ref(), tools[1].1.clone()).await;
        assert!(
            out.contains("own.txt") && out.contains("other.txt"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn grep_reports_invalid_regex() {
        let f = fixture();
        let tool = Grep::new(Arc::clone(&f.ws));
        let err = fails(&tool, json!({"pattern": "fn ("})).await;
        assert!(
            err.starts_with("grep: invalid regular expression:"),
            "{err}"
        );
        assert!(err.contains("unclosed group"), "{err}");
        let err = fails(&tool, json!({"pattern": "a\\nb"})).await;
        assert!(
            err.starts_with("grep: invalid regular expression:"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn grep_clips_long_lines() {
        let f = fixture();
        let long = format!("needle{}\n", "é".repeat(700));
        put(&f.root, "long.txt", long);
        let tool = Grep::new(Arc::clone(&f.ws));
        let out = ok(&tool, json!({"pattern": "needle"})).await;
        let text = out.strip_prefix("long.txt:1:").unwrap();
        assert_eq!(text.chars().count(), GREP_LINE_CHARS + 1);
        assert!(text.ends_with('…'));
    }

    #[tokio::test]
    async fn cancelled_calls_stop() {
        let f = fixture();
        grep_tree(&f.root);
        let mut ctx = ToolContext::detached(&f.root);
        ctx.cancel = CancellationToken::new();
        ctx.cancel.cancel();
        let tools: [Arc<dyn Tool>; 3] = [
            Arc::new(ListDir::new(Arc::clone(&f.ws))),
            Arc::new(Glob::new(Arc::clone(&f.ws))),
            Arc::new(Grep::new(Arc::clone(&f.ws))),
        ];
        for tool in tools {
            let args = if tool.name() == "list_dir" {
                json!({})
            } else {
                json!({"pattern": "x"})
            };
            let call = tool.execute_with_context(&ctx, &args);
            let outcome = tokio::time::timeout(Duration::from_secs(30), call).await;
            match outcome.unwrap() {
                Err(ToolError::Model { kind, message }) => {
                    assert_eq!(kind, "cancelled");
                    assert_eq!(message, format!("{} was cancelled", tool.name()));
                }
                other => panic!("{}: {other:?}", tool.name()),
            }
        }
    }

    #[test]
    fn walk_stops_when_cancelled_midway() {
        let f = fixture();
        for i in 0..20 {
            put(&f.root, &format!("f{i}.txt"), "needle\n");
        }
        let matcher = RegexMatcherBuilder::new().build("needle").unwrap();
        let cancel = CancellationToken::new();
        let found = grep_files(
            &f.ws.open_root().unwrap(),
            Path::new(""),
            &matcher,
            None,
            1000,
            &cancel,
        )
        .unwrap();
        assert_eq!(found.lines.len(), 20);
        cancel.cancel();
        let err = grep_files(
            &f.ws.open_root().unwrap(),
            Path::new(""),
            &matcher,
            None,
            1000,
            &cancel,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            ToolError::Model {
                kind: "cancelled",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn tools_describe_themselves_and_rebind() {
        let f = fixture();
        let other = fixture();
        put(&other.root, "there.rs", "needle\n");
        let tools: [Arc<dyn Tool>; 3] = [
            Arc::new(ListDir::new(Arc::clone(&f.ws))),
            Arc::new(Glob::new(Arc::clone(&f.ws))),
            Arc::new(Grep::new(Arc::clone(&f.ws))),
        ];
        for tool in &tools {
            assert_eq!(tool.tags(), ["search"]);
            assert_eq!(tool.concurrency_class(), ConcurrencyClass::Safe);
            let schema = tool.input_schema();
            assert_eq!(schema["additionalProperties"], false);
            for (name, prop) in schema["properties"].as_object().unwrap() {
                assert!(prop["description"].is_string(), "{}.{name}", tool.name());
            }
        }
        let rebound = tools[2].rebind_cwd(&other.ws).unwrap();
        assert!(rebound.as_any().downcast_ref::<Grep>().is_some());
        assert_eq!(
            ok(rebound.as_ref(), json!({"pattern": "needle"})).await,
            "there.rs:1:needle"
        );
    }
}
