//! `grep`: a regex search of file contents, line by line with a bounded line length, skipping
//! binary files, and its answer with what was skipped and why.

use std::io;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::walk::{FileWalk, PathFilter, compile_glob};
use super::{TAGS, blocking, cancelled, display, resolve_start};
use crate::builtin::parse_args;
use crate::fs_safe::Beneath;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace};

/// Matching lines `grep` shows unless asked otherwise.
const GREP_DEFAULT_RESULTS: usize = 100;
/// Most matching lines `grep` will show.
const GREP_MAX_RESULTS: usize = 1_000;
/// Characters of one matching line `grep` shows.
pub(super) const GREP_LINE_CHARS: usize = 500;
/// Longest line `grep` holds in memory; a file is searched only up to a longer line, which is
/// never read whole (and reported), so one huge line cannot take the server's memory.
pub const GREP_MAX_LINE_BYTES: usize = 1 << 20;
/// Files with such a line named in a `grep` answer.
const GREP_LONG_LINE_NAMES: usize = 10;

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
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "grep",
                "Search file contents with a regular expression (Rust regex syntax, one line at a \
                 time). Answers 'path:line:text' lines, sorted by path then line number, paths \
                 relative to the workspace root, each line cut at 500 characters. Files ignored by \
                 .gitignore or .ignore, hidden files, binary files and symbolic links are skipped. \
                 Shows at most `max_results` lines (default 100) and says when it stopped there.",
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
                }),
Effects::NONE,
            )
            .groups(&["search"])
            .base()
            .contract()
            .tags(TAGS)
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(args, &ctx.cancel).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
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
pub(super) struct GrepFound {
    /// The `path:line:text` lines, at most `max_results` of them.
    pub(super) lines: Vec<String>,
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
pub(super) fn grep_files(
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
