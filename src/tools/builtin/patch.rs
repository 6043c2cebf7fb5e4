//! `apply_patch`: applies a patch in the Codex format (add, delete, update and move files) to
//! the workspace, all-or-nothing.
//!
//! The whole patch is parsed, and every file's new content computed and every target checked,
//! in memory before anything is written; a failure anywhere changes no file. Should a write
//! fail halfway (an I/O error), the files already written are restored from their in-memory
//! originals.
//!
//! The text model shared with [`super::diff_edit`] lives here too: lines that keep their own
//! endings, the three matching strategies, and rendering that keeps CRLF and a missing final
//! newline.

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
use crate::tools::fs_safe::FsError;
use crate::tools::{ConcurrencyClass, Tool, ToolError, ToolResult, Workspace};

const TOOL: &str = "apply_patch";

/// Largest file either patch tool reads, edits or deletes.
pub(crate) const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

const BEGIN_PATCH: &str = "*** Begin Patch";
const END_PATCH: &str = "*** End Patch";
const ADD_FILE: &str = "*** Add File: ";
const DELETE_FILE: &str = "*** Delete File: ";
const UPDATE_FILE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

const DESCRIPTION: &str = "\
Create, delete, edit and rename files with one patch in the Codex patch format. All-or-nothing: \
if any operation or hunk fails, no file is changed, and the error names the file, the hunk and \
the lines that did not match.

Format (paths relative to the workspace):
*** Begin Patch
*** Add File: path/new.txt      then the new file's lines, each prefixed with '+'
*** Delete File: path/old.txt
*** Update File: path/file.txt
*** Move to: path/renamed.txt   optional, right after Update File, renames the file
@@ fn anchor()                  starts a hunk; the text after '@@ ' is an anchor line found \
first (searching forward); several '@@ ...' lines in a row narrow down one after another; a \
bare '@@' has no anchor
 context line                   unchanged (leading space; an empty line counts as empty context)
-removed line
+added line
*** End of File                 optional, after a hunk that must match the end of the file
*** End Patch

Rules: give about 3 lines of context around each change, enough to be unique after the anchor. \
Hunks of one file are located in order, each after the previous one. The first hunk of an \
Update may omit its '@@' line. A hunk's context and removed lines are matched exactly first, \
then ignoring trailing whitespace, then ignoring surrounding whitespace; context lines keep the \
file's own text. A hunk with only '+' lines is inserted right after its anchor, or at the end of \
the file when it has none. Add refuses an existing file; Move to refuses an existing target. \
CRLF files stay CRLF, and a file without a final newline keeps none unless lines are added \
after its last line.";

/// A parsed patch: its file operations, in the order they apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    /// The operations, in patch order.
    pub ops: Vec<FileOp>,
}

/// One file operation of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// `*** Add File:` creates a file that must not exist yet.
    Add {
        /// The file, as written in the patch.
        path: String,
        /// The whole new content (every line ends with `\n`).
        contents: String,
    },
    /// `*** Delete File:` removes an existing file.
    Delete {
        /// The file, as written in the patch.
        path: String,
    },
    /// `*** Update File:` edits a file with hunks and may move it.
    Update {
        /// The file, as written in the patch.
        path: String,
        /// The `*** Move to:` target, if any.
        move_to: Option<String>,
        /// The hunks, in file order.
        hunks: Vec<Hunk>,
    },
}

/// One hunk of an Update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// `@@ anchor` lines, each found after the previous one before the hunk is matched.
    pub anchors: Vec<String>,
    /// Context, removed and added lines, in order.
    pub lines: Vec<HunkLine>,
    /// Whether `*** End of File` closed the hunk: it must match the end of the file.
    pub end_of_file: bool,
    /// The 1-based patch line the hunk starts on, for messages.
    pub line: usize,
}

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HunkLine {
    /// An unchanged line (`' '` prefix, or an empty line).
    Context(String),
    /// A line to remove (`'-'` prefix).
    Remove(String),
    /// A line to add (`'+'` prefix).
    Add(String),
}

/// Why a patch could not be parsed: the 1-based line of the patch and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct PatchError {
    /// The 1-based line of the patch text at fault.
    pub line: usize,
    /// What is wrong and what was expected.
    pub message: String,
}

fn parse_error(line: usize, message: impl Into<String>) -> PatchError {
    PatchError {
        line,
        message: message.into(),
    }
}

/// Parses a patch in the Codex format; pure, touches no file.
///
/// Beyond Codex it tolerates CRLF patch text, blank lines between file operations, a
/// surrounding shell heredoc (`<<'EOF'` … `EOF`), several `@@ anchor` lines in a row, and an
/// Update with only a `*** Move to:`.
pub fn parse_patch(text: &str) -> Result<Patch, PatchError> {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let is_text = |l: &&str| !l.trim().is_empty();
    let (Some(mut first), Some(mut last)) = (
        lines.iter().position(is_text),
        lines.iter().rposition(is_text),
    ) else {
        return Err(parse_error(
            1,
            "the patch is empty; it must start with `*** Begin Patch` and end with `*** End Patch`",
        ));
    };
    if let Some(delimiter) = heredoc_delimiter(lines[first].trim())
        && last > first
        && lines[last].trim() == delimiter
    {
        let inner = first + 1..last;
        match (
            lines[inner.clone()].iter().position(is_text),
            lines[inner].iter().rposition(is_text),
        ) {
            (Some(a), Some(b)) => (first, last) = (first + 1 + a, first + 1 + b),
            _ => {
                return Err(parse_error(
                    first + 2,
                    "the heredoc is empty; expected `*** Begin Patch`",
                ));
            }
        }
    }
    if lines[first].trim() != BEGIN_PATCH {
        return Err(parse_error(
            first + 1,
            format!(
                "expected `{BEGIN_PATCH}` as the first line, found `{}`",
                clip(lines[first])
            ),
        ));
    }
    if last == first || lines[last].trim() != END_PATCH {
        let (line, found) = if last == first {
            (lines.len(), "the end of the input".to_string())
        } else {
            (last + 1, format!("`{}`", clip(lines[last])))
        };
        return Err(parse_error(
            line,
            format!("expected `{END_PATCH}` as the last line, found {found}"),
        ));
    }
    let mut parser = Parser {
        lines: &lines,
        at: first + 1,
        end: last,
    };
    let mut ops = Vec::new();
    while parser.at < parser.end {
        let line = parser.lines[parser.at];
        let trimmed = line.trim();
        if trimmed.is_empty() {
            parser.at += 1;
        } else if let Some(path) = after_marker(trimmed, ADD_FILE) {
            let path = parser.path(path, ADD_FILE)?;
            parser.at += 1;
            let mut contents = String::new();
            while parser.at < parser.end {
                let Some(body) = parser.lines[parser.at].strip_prefix('+') else {
                    break;
                };
                contents.push_str(body);
                contents.push('\n');
                parser.at += 1;
            }
            ops.push(FileOp::Add { path, contents });
        } else if let Some(path) = after_marker(trimmed, DELETE_FILE) {
            let path = parser.path(path, DELETE_FILE)?;
            parser.at += 1;
            ops.push(FileOp::Delete { path });
        } else if let Some(path) = after_marker(trimmed, UPDATE_FILE) {
            ops.push(parser.update(path)?);
        } else {
            let hint = if trimmed == END_PATCH {
                "; `*** End Patch` must be the last line".to_string()
            } else if line.starts_with('+') {
                "; every line of an Add File body starts with '+' (a lone '+' is an empty line), \
                 so a line without it ends the file"
                    .to_string()
            } else {
                String::new()
            };
            return Err(parse_error(
                parser.at + 1,
                format!(
                    "expected `{ADD_FILE}<path>`, `{DELETE_FILE}<path>`, `{UPDATE_FILE}<path>` or \
                     `{END_PATCH}`, found `{}`{hint}",
                    clip(line)
                ),
            ));
        }
    }
    if ops.is_empty() {
        return Err(parse_error(
            last + 1,
            "the patch has no file operations; expected `*** Add File:`, `*** Delete File:` or \
             `*** Update File:` before `*** End Patch`",
        ));
    }
    Ok(Patch { ops })
}

/// The delimiter of a heredoc opener such as `<<'EOF'`, `<<"EOF"` or `<<EOF`.
fn heredoc_delimiter(line: &str) -> Option<&str> {
    let word = line.strip_prefix("<<")?.trim();
    let word = word
        .strip_prefix('\'')
        .and_then(|w| w.strip_suffix('\''))
        .or_else(|| word.strip_prefix('"').and_then(|w| w.strip_suffix('"')))
        .unwrap_or(word);
    (!word.is_empty() && !word.contains(char::is_whitespace)).then_some(word)
}

/// Walks the lines between `*** Begin Patch` and `*** End Patch`.
struct Parser<'a> {
    lines: &'a [&'a str],
    at: usize,
    end: usize,
}

impl Parser<'_> {
    fn path(&self, raw: &str, marker: &str) -> Result<String, PatchError> {
        let path = raw.trim();
        if path.is_empty() {
            return Err(parse_error(
                self.at + 1,
                format!("expected a file path after `{}`", marker.trim_end()),
            ));
        }
        Ok(path.to_string())
    }

    fn update(&mut self, raw_path: &str) -> Result<FileOp, PatchError> {
        let path = self.path(raw_path, UPDATE_FILE)?;
        self.at += 1;
        let mut move_to = None;
        if self.at < self.end
            && let Some(target) = after_marker(self.lines[self.at].trim(), MOVE_TO)
        {
            move_to = Some(self.path(target, MOVE_TO)?);
            self.at += 1;
        }
        let mut hunks = Vec::new();
        while self.at < self.end {
            let line = self.lines[self.at];
            if starts_operation(line) {
                break;
            }
            if line.trim().is_empty() {
                // Blank lines before the next operation or `@@` are spacing; before hunk lines
                // (a first hunk without `@@`) they are empty context.
                let next = (self.at..self.end).find(|&i| !self.lines[i].trim().is_empty());
                match next {
                    None => break,
                    Some(i) if starts_operation(self.lines[i]) => break,
                    Some(i) if self.lines[i].starts_with("@@") => {
                        self.at = i;
                        continue;
                    }
                    Some(_) => {}
                }
            }
            let hunk = self.hunk(&path, hunks.len() + 1)?;
            hunks.push(hunk);
        }
        if hunks.is_empty() && move_to.is_none() {
            return Err(parse_error(
                self.at + 1,
                format!(
                    "`{UPDATE_FILE}{path}` has no hunks; expected a hunk (`@@` or lines starting \
                     with ' ', '-' or '+') or `{MOVE_TO}<path>`"
                ),
            ));
        }
        Ok(FileOp::Update {
            path,
            move_to,
            hunks,
        })
    }

    fn hunk(&mut self, path: &str, number: usize) -> Result<Hunk, PatchError> {
        let start = self.at + 1;
        let mut anchors = Vec::new();
        let mut saw_marker = false;
        while self.at < self.end {
            let line = self.lines[self.at];
            let Some(rest) = line.strip_prefix("@@") else {
                break;
            };
            if let Some(anchor) = rest.strip_prefix(' ') {
                // A unified-diff range (`@@ -12,3 +12,4 @@`) carries no anchor line.
                if !anchor.trim().is_empty() && !is_unified_range(anchor) {
                    anchors.push(anchor.to_string());
                }
            } else if !rest.trim().is_empty() {
                return Err(parse_error(
                    self.at + 1,
                    format!(
                        "expected `@@` or `@@ <anchor line>` (a space after `@@`), found `{}`",
                        clip(line)
                    ),
                ));
            }
            saw_marker = true;
            self.at += 1;
        }
        if !saw_marker && number > 1 {
            return Err(parse_error(
                self.at + 1,
                format!(
                    "hunk {number} of `{path}` must start with `@@` (only the first hunk may omit \
                     it), found `{}`",
                    clip(self.lines[self.at])
                ),
            ));
        }
        let mut lines = Vec::new();
        let mut end_of_file = false;
        while self.at < self.end {
            let line = self.lines[self.at];
            if line.trim_end() == END_OF_FILE {
                end_of_file = true;
                self.at += 1;
                break;
            }
            if line.starts_with("@@") || starts_operation(line) {
                break;
            }
            let parsed = if let Some(text) = line.strip_prefix(' ') {
                HunkLine::Context(text.to_string())
            } else if let Some(text) = line.strip_prefix('-') {
                HunkLine::Remove(text.to_string())
            } else if let Some(text) = line.strip_prefix('+') {
                HunkLine::Add(text.to_string())
            } else if line.trim().is_empty() {
                HunkLine::Context(String::new())
            } else {
                return Err(parse_error(
                    self.at + 1,
                    format!(
                        "`{}` in hunk {number} of `{path}` is not a hunk line: every line starts \
                         with ' ' (context), '-' (removed) or '+' (added); a context line needs \
                         its leading space",
                        clip(line)
                    ),
                ));
            };
            lines.push(parsed);
            self.at += 1;
        }
        if lines.is_empty() {
            let found = if self.at < self.end {
                format!("`{}`", clip(self.lines[self.at]))
            } else {
                format!("`{END_PATCH}`")
            };
            return Err(parse_error(
                self.at + 1,
                format!(
                    "hunk {number} of `{path}` has no lines; expected lines starting with ' ', \
                     '-' or '+', found {found}"
                ),
            ));
        }
        Ok(Hunk {
            anchors,
            lines,
            end_of_file,
            line: start,
        })
    }
}

/// The rest of a (trimmed) line after a marker such as `*** Add File: `; the space after the
/// colon is optional.
fn after_marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.strip_prefix(marker.trim_end())
}

/// Whether an anchor is really a unified-diff range such as `-12,3 +12,4 @@`.
fn is_unified_range(anchor: &str) -> bool {
    let numbers = |s: &str, sign: char| {
        s.strip_prefix(sign).is_some_and(|r| {
            !r.is_empty()
                && r.split(',')
                    .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let mut parts = anchor.split_whitespace();
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(old), Some(new), Some(close))
            if numbers(old, '-') && numbers(new, '+') && close.starts_with("@@")
    )
}

/// Whether a patch line starts a file operation or ends the patch (and so ends a hunk).
fn starts_operation(line: &str) -> bool {
    let t = line.trim();
    [ADD_FILE, DELETE_FILE, UPDATE_FILE]
        .iter()
        .any(|m| after_marker(t, m).is_some())
        || t == END_PATCH
        || t.starts_with("*** ") && !line.starts_with(' ') && t != END_OF_FILE
}

/// Shortens a line quoted in a message.
pub(crate) fn clip(line: &str) -> String {
    const MAX: usize = 160;
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The text model shared with diff_edit.

/// A UTF-8 text file as lines, each keeping its own ending, so untouched lines come back
/// byte for byte.
#[derive(Debug, Clone)]
pub(crate) struct TextFile {
    /// Each line without its ending, with the ending (`"\n"`, `"\r\n"`, or `""` for a last line
    /// without one).
    lines: Vec<(String, &'static str)>,
    /// The ending new lines get: the file's first line ending, `\n` when it has none.
    eol: &'static str,
    /// Whether the file ends with a line ending (an empty file counts as ending with one).
    trailing_newline: bool,
}

impl TextFile {
    /// Splits file bytes into lines; `None` when they are not UTF-8.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('\n') {
                Some(i) => {
                    let (line, eol) = match rest[..i].strip_suffix('\r') {
                        Some(line) => (line, "\r\n"),
                        None => (&rest[..i], "\n"),
                    };
                    lines.push((line.to_string(), eol));
                    rest = &rest[i + 1..];
                }
                None => {
                    lines.push((rest.to_string(), ""));
                    rest = "";
                }
            }
        }
        let eol = lines
            .first()
            .map(|(_, eol)| *eol)
            .filter(|eol| !eol.is_empty())
            .unwrap_or("\n");
        let trailing_newline = lines.last().is_none_or(|(_, eol)| !eol.is_empty());
        Some(Self {
            lines,
            eol,
            trailing_newline,
        })
    }

    /// The lines' text, without endings.
    pub(crate) fn texts(&self) -> Vec<&str> {
        self.lines.iter().map(|(text, _)| text.as_str()).collect()
    }

    /// Applies non-overlapping replacements (in any order) and renders the bytes.
    ///
    /// `final_newline` forces whether the result ends with a newline; `None` keeps the file's
    /// own rule: a file that ended with a newline still does, and one that did not keeps none
    /// unless lines were added after its (kept) last line.
    pub(crate) fn render(
        &self,
        mut replacements: Vec<Replacement>,
        final_newline: Option<bool>,
    ) -> Result<Vec<u8>, String> {
        replacements.sort_by_key(|r| r.start);
        // (text, ending, index of the original line it is)
        let mut out: Vec<(&str, &str, Option<usize>)> = Vec::with_capacity(self.lines.len());
        let original = |i: usize| (self.lines[i].0.as_str(), self.lines[i].1, Some(i));
        let mut next = 0;
        for r in &replacements {
            if r.start < next || r.start + r.old_len > self.lines.len() {
                return Err(format!(
                    "internal error: overlapping edits at line {}",
                    r.start + 1
                ));
            }
            out.extend((next..r.start).map(original));
            for line in &r.new_lines {
                out.push(match line {
                    NewLine::Kept(i) => original(*i),
                    NewLine::Added(text) => (text.as_str(), self.eol, None),
                });
            }
            next = r.start + r.old_len;
        }
        out.extend((next..self.lines.len()).map(original));

        let last_original = self.lines.len().checked_sub(1);
        let final_newline = final_newline.unwrap_or_else(|| {
            let last_kept = out.iter().any(|(_, _, i)| *i == last_original);
            let ends_with_it = out.last().is_some_and(|(_, _, i)| *i == last_original);
            self.trailing_newline || (last_kept && !ends_with_it)
        });
        let mut bytes = Vec::new();
        let count = out.len();
        for (n, (text, eol, _)) in out.into_iter().enumerate() {
            bytes.extend_from_slice(text.as_bytes());
            let eol = if eol.is_empty() { self.eol } else { eol };
            if n + 1 < count || final_newline {
                bytes.extend_from_slice(eol.as_bytes());
            }
        }
        Ok(bytes)
    }
}

/// One edit of a [`TextFile`]: `old_len` original lines from `start` become `new_lines`.
#[derive(Debug, Clone)]
pub(crate) struct Replacement {
    start: usize,
    old_len: usize,
    new_lines: Vec<NewLine>,
}

#[derive(Debug, Clone)]
enum NewLine {
    /// An original line kept as it is (a context line keeps the file's text).
    Kept(usize),
    /// A line the patch adds.
    Added(String),
}

impl Replacement {
    /// The edit a hunk's lines make when their old lines match at `start`.
    pub(crate) fn from_hunk(start: usize, lines: &[HunkLine]) -> Self {
        let mut at = start;
        let mut new_lines = Vec::new();
        for line in lines {
            match line {
                HunkLine::Context(_) => {
                    new_lines.push(NewLine::Kept(at));
                    at += 1;
                }
                HunkLine::Remove(_) => at += 1,
                HunkLine::Add(text) => new_lines.push(NewLine::Added(text.clone())),
            }
        }
        Self {
            start,
            old_len: at - start,
            new_lines,
        }
    }

    /// How many original lines it replaces.
    pub(crate) fn old_len(&self) -> usize {
        self.old_len
    }
}

/// A hunk's old side: its context and removed lines.
pub(crate) fn old_lines(lines: &[HunkLine]) -> Vec<&str> {
    lines
        .iter()
        .filter_map(|l| match l {
            HunkLine::Context(t) | HunkLine::Remove(t) => Some(t.as_str()),
            HunkLine::Add(_) => None,
        })
        .collect()
}

/// The hunk lines without trailing empty context lines, or `None` when there are none to drop
/// (or dropping them would leave no old line): blank lines at a hunk's end are often just
/// spacing in the patch, so a failed match is retried without them.
pub(crate) fn without_trailing_blanks(lines: &[HunkLine]) -> Option<&[HunkLine]> {
    let keep = lines
        .iter()
        .rposition(|l| !matches!(l, HunkLine::Context(t) if t.trim().is_empty()))
        .map_or(0, |i| i + 1);
    let trimmed = &lines[..keep];
    (keep < lines.len() && !old_lines(trimmed).is_empty()).then_some(trimmed)
}

/// How a hunk's old lines were matched against the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matching {
    /// Byte for byte (line endings aside).
    Exact,
    /// Ignoring trailing whitespace.
    TrimEnd,
    /// Ignoring leading and trailing whitespace.
    Trim,
}

impl Matching {
    /// The strategies in the order they are tried.
    pub(crate) const ALL: [Matching; 3] = [Matching::Exact, Matching::TrimEnd, Matching::Trim];

    fn eq(self, file: &str, pattern: &str) -> bool {
        match self {
            Matching::Exact => file == pattern,
            Matching::TrimEnd => file.trim_end() == pattern.trim_end(),
            Matching::Trim => file.trim() == pattern.trim(),
        }
    }

    /// A snake_case name for metadata.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Matching::Exact => "exact",
            Matching::TrimEnd => "ignoring_trailing_whitespace",
            Matching::Trim => "ignoring_surrounding_whitespace",
        }
    }

    fn matches_at(self, lines: &[&str], pattern: &[&str], at: usize) -> bool {
        lines
            .get(at..at + pattern.len())
            .is_some_and(|window| window.iter().zip(pattern).all(|(f, p)| self.eq(f, p)))
    }
}

/// Finds `pattern` at or after `start`: every strategy in turn, first position wins; with
/// `at_end` only the position that ends at the end of the file is tried.
pub(crate) fn seek(
    lines: &[&str],
    pattern: &[&str],
    start: usize,
    at_end: bool,
) -> Option<(usize, Matching)> {
    let last = lines.len().checked_sub(pattern.len())?;
    if start > last {
        return None;
    }
    let first = if at_end { last } else { start };
    Matching::ALL.into_iter().find_map(|how| {
        (first..=last)
            .find(|&at| how.matches_at(lines, pattern, at))
            .map(|at| (at, how))
    })
}

/// Finds `pattern` at or after `min_start`, nearest to `hint` first (the earlier position wins a
/// tie); every position is tried with one strategy before the next strategy.
pub(crate) fn seek_near(
    lines: &[&str],
    pattern: &[&str],
    min_start: usize,
    hint: usize,
) -> Option<(usize, Matching)> {
    let last = lines.len().checked_sub(pattern.len())?;
    if min_start > last {
        return None;
    }
    let hint = hint.clamp(min_start, last);
    let reach = (hint - min_start).max(last - hint);
    let order = (0..=reach).flat_map(|d| {
        let before = hint.checked_sub(d).filter(|&at| at >= min_start);
        let after = (d > 0).then_some(hint + d).filter(|&at| at <= last);
        before.into_iter().chain(after)
    });
    let order: Vec<usize> = order.collect();
    Matching::ALL.into_iter().find_map(|how| {
        order
            .iter()
            .copied()
            .find(|&at| how.matches_at(lines, pattern, at))
            .map(|at| (at, how))
    })
}

/// Explains why `pattern` was not found at or after `from`: quotes its first lines and the
/// closest place in the file, where the first difference is.
pub(crate) fn describe_miss(lines: &[&str], pattern: &[&str], from: usize) -> String {
    const QUOTED: usize = 5;
    let mut out = String::from("Expected these lines (context and removed):\n");
    for line in pattern.iter().take(QUOTED) {
        out.push_str(&format!("  |{}\n", clip(line)));
    }
    if pattern.len() > QUOTED {
        out.push_str(&format!("  … and {} more\n", pattern.len() - QUOTED));
    }
    let same = |a: &str, b: &str| a.trim() == b.trim();
    let from = from.min(lines.len());
    let mut best = (0, 0);
    for at in from..lines.len() {
        let run = pattern
            .iter()
            .zip(&lines[at..])
            .take_while(|(p, f)| same(p, f))
            .count();
        if run > best.0 {
            best = (run, at);
        }
    }
    let Some(first) = pattern.first() else {
        return out;
    };
    match best {
        (0, _) => match lines[..from].iter().position(|l| same(l, first)) {
            Some(i) => out.push_str(&format!(
                "The first expected line occurs at line {}, before line {} where this search \
                 started: hunks must be in file order and must not overlap.",
                i + 1,
                from + 1
            )),
            None => out.push_str(&format!(
                "The first expected line `{}` does not occur in the file{}.",
                clip(first),
                if from > 0 {
                    format!(" at or after line {}", from + 1)
                } else {
                    String::new()
                }
            )),
        },
        (run, at) if run == pattern.len() => out.push_str(&format!(
            "They occur at lines {}-{}, which is not where this hunk may go.",
            at + 1,
            at + run
        )),
        (run, at) => {
            let span = format!("lines {}-{} match the first {run}", at + 1, at + run);
            match lines.get(at + run) {
                Some(found) => out.push_str(&format!(
                    "Closest: file {span}; then expected `{}` but line {} is `{}`.",
                    clip(pattern[run]),
                    at + run + 1,
                    clip(found)
                )),
                None => out.push_str(&format!(
                    "Closest: file {span}; then the file ends before `{}`.",
                    clip(pattern[run])
                )),
            }
        }
    }
    out
}

/// Applies an Update's hunks to a file's text; the error says which hunk failed and why.
pub(crate) fn apply_hunks(file: &TextFile, hunks: &[Hunk]) -> Result<Vec<u8>, String> {
    let texts = file.texts();
    let mut cursor = 0;
    let mut replacements = Vec::with_capacity(hunks.len());
    for (index, hunk) in hunks.iter().enumerate() {
        let number = index + 1;
        let label = format!("hunk {number} (patch line {})", hunk.line);
        for anchor in &hunk.anchors {
            match seek(&texts, &[anchor.as_str()], cursor, false) {
                Some((at, _)) => cursor = at + 1,
                None => {
                    let mut message =
                        format!("{label}: anchor `@@ {}` was not found", clip(anchor));
                    if cursor > 0 {
                        message.push_str(&format!(" at or after line {}", cursor + 1));
                    }
                    message.push_str(". The anchor must be a whole line of the file.");
                    return Err(message);
                }
            }
        }
        if old_lines(&hunk.lines).is_empty() {
            let at = if hunk.anchors.is_empty() || hunk.end_of_file {
                texts.len()
            } else {
                cursor
            };
            replacements.push(Replacement::from_hunk(at, &hunk.lines));
            continue;
        }
        let mut lines = hunk.lines.as_slice();
        let found = loop {
            if let Some((at, _)) = seek(&texts, &old_lines(lines), cursor, hunk.end_of_file) {
                break Some(at);
            }
            match without_trailing_blanks(lines) {
                Some(shorter) => lines = shorter,
                None => break None,
            }
        };
        let Some(at) = found else {
            let old = old_lines(&hunk.lines);
            let end = if hunk.end_of_file {
                " (it is marked `*** End of File`, so it must match the file's last lines)"
            } else {
                ""
            };
            return Err(format!(
                "{label} did not match{end}.\n{}",
                describe_miss(&texts, &old, cursor)
            ));
        };
        let replacement = Replacement::from_hunk(at, lines);
        cursor = at + replacement.old_len;
        replacements.push(replacement);
    }
    file.render(replacements, None)
}

// ---------------------------------------------------------------------------------------------
// Planning and writing.

/// One filesystem change of a planned patch, with what undoes it.
#[derive(Debug, Clone)]
enum Step {
    /// Writes `contents`; `before` is the file's content beforehand (`None`: it did not exist).
    Write {
        path: PathBuf,
        contents: Vec<u8>,
        before: Option<Vec<u8>>,
    },
    /// Removes a file whose content was `before`.
    Remove { path: PathBuf, before: Vec<u8> },
    /// Moves a file.
    Rename { from: PathBuf, to: PathBuf },
}

/// What a patch does, for the result.
#[derive(Debug, Default)]
struct Summary {
    added: Vec<String>,
    modified: Vec<String>,
    moved: Vec<(String, String)>,
    deleted: Vec<String>,
    first_changed: Option<PathBuf>,
}

impl Summary {
    fn touch(&mut self, path: &Path) {
        self.first_changed.get_or_insert_with(|| path.to_path_buf());
    }
}

/// The workspace as the patch sees it part-way through: files the patch already changed in
/// memory, the rest read from disk on demand.
struct Overlay<'a> {
    ws: &'a Workspace,
    files: HashMap<PathBuf, Option<Vec<u8>>>,
}

impl Overlay<'_> {
    /// The file's current content; `None` when it does not exist.
    fn get(&mut self, rel: &Path) -> Result<Option<Vec<u8>>, FsError> {
        if let Some(state) = self.files.get(rel) {
            return Ok(state.clone());
        }
        let state = match self.ws.read(rel, MAX_FILE_BYTES) {
            Ok(bytes) => Some(bytes),
            Err(FsError::NotFound(_)) => None,
            Err(err) => return Err(err),
        };
        self.files.insert(rel.to_path_buf(), state.clone());
        Ok(state)
    }

    /// Whether anything (a file, directory, …) is at `rel`; symlinks on the way are errors.
    fn exists(&self, rel: &Path) -> Result<bool, FsError> {
        if let Some(state) = self.files.get(rel) {
            return Ok(state.is_some());
        }
        match self.ws.open_root()?.metadata(rel) {
            Ok(_) => Ok(true),
            Err(FsError::NotFound(_)) => Ok(false),
            Err(err) => Err(err),
        }
    }

    fn set(&mut self, rel: &Path, state: Option<Vec<u8>>) {
        self.files.insert(rel.to_path_buf(), state);
    }
}

fn shown(rel: &Path) -> String {
    rel.to_string_lossy().into_owned()
}

/// A planning failure: nothing was written.
fn refuse(kind: &'static str, message: impl std::fmt::Display) -> ToolError {
    ToolError::model(kind, format!("{TOOL}: {message}\nNo file was changed."))
}

fn fs_refusal(op: &str, path: &str, err: FsError) -> ToolError {
    refuse(err.kind(), format!("{op} `{path}`: {err}"))
}

/// Checks every operation and computes every file's new content in memory; touches nothing.
fn plan(ws: &Workspace, patch: &Patch) -> Result<(Vec<Step>, Summary), ToolError> {
    let mut overlay = Overlay {
        ws,
        files: HashMap::new(),
    };
    let mut steps = Vec::new();
    let mut summary = Summary::default();
    let resolve = |op: &str, path: &str| {
        let rel = ws.resolve(path).map_err(|e| fs_refusal(op, path, e))?;
        if rel.as_os_str().is_empty() {
            return Err(refuse(
                "invalid_input",
                format!("{op} `{path}`: the path names the workspace root, not a file"),
            ));
        }
        Ok(rel)
    };
    for op in &patch.ops {
        match op {
            FileOp::Add { path, contents } => {
                let what = "Add File";
                let rel = resolve(what, path)?;
                if overlay
                    .exists(&rel)
                    .map_err(|e| fs_refusal(what, path, e))?
                {
                    return Err(refuse(
                        "already_exists",
                        format!(
                            "{what} `{path}`: the file already exists; use `*** Update File:` to \
                             change it (or delete it first)"
                        ),
                    ));
                }
                steps.push(Step::Write {
                    path: rel.clone(),
                    contents: contents.as_bytes().to_vec(),
                    before: None,
                });
                overlay.set(&rel, Some(contents.as_bytes().to_vec()));
                summary.added.push(shown(&rel));
                summary.touch(&rel);
            }
            FileOp::Delete { path } => {
                let what = "Delete File";
                let rel = resolve(what, path)?;
                let Some(before) = overlay.get(&rel).map_err(|e| fs_refusal(what, path, e))? else {
                    return Err(refuse(
                        "not_found",
                        format!("{what} `{path}`: the file does not exist"),
                    ));
                };
                steps.push(Step::Remove {
                    path: rel.clone(),
                    before,
                });
                overlay.set(&rel, None);
                summary.deleted.push(shown(&rel));
                summary.touch(&rel);
            }
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                let what = "Update File";
                let rel = resolve(what, path)?;
                let Some(before) = overlay.get(&rel).map_err(|e| fs_refusal(what, path, e))? else {
                    return Err(refuse(
                        "not_found",
                        format!(
                            "{what} `{path}`: the file does not exist; use `*** Add File:` to \
                             create it"
                        ),
                    ));
                };
                let after = if hunks.is_empty() {
                    before.clone()
                } else {
                    let file = TextFile::parse(&before).ok_or_else(|| {
                        refuse(
                            "invalid_input",
                            format!("{what} `{path}`: the file is not UTF-8 text"),
                        )
                    })?;
                    apply_hunks(&file, hunks)
                        .map_err(|why| refuse("no_match", format!("{what} `{path}`: {why}")))?
                };
                let target = match move_to {
                    Some(to) => Some((resolve("Move to", to)?, to)),
                    None => None,
                };
                match target {
                    Some((to_rel, to)) if to_rel != rel => {
                        if overlay
                            .exists(&to_rel)
                            .map_err(|e| fs_refusal("Move to", to, e))?
                        {
                            return Err(refuse(
                                "already_exists",
                                format!(
                                    "{what} `{path}`: the Move to target `{to}` already exists"
                                ),
                            ));
                        }
                        steps.push(Step::Rename {
                            from: rel.clone(),
                            to: to_rel.clone(),
                        });
                        summary.moved.push((shown(&rel), shown(&to_rel)));
                        if after != before {
                            steps.push(Step::Write {
                                path: to_rel.clone(),
                                contents: after.clone(),
                                before: Some(before),
                            });
                            summary.modified.push(shown(&to_rel));
                        }
                        overlay.set(&rel, None);
                        overlay.set(&to_rel, Some(after));
                        summary.touch(&to_rel);
                    }
                    _ => {
                        if after != before {
                            steps.push(Step::Write {
                                path: rel.clone(),
                                contents: after.clone(),
                                before: Some(before),
                            });
                            summary.modified.push(shown(&rel));
                            summary.touch(&rel);
                            overlay.set(&rel, Some(after));
                        }
                    }
                }
            }
        }
    }
    Ok((steps, summary))
}

/// A write that failed part-way, after the earlier steps were undone as far as possible.
#[derive(Debug)]
struct StepFailure {
    path: PathBuf,
    error: FsError,
    restored: Vec<String>,
    not_restored: Vec<(String, FsError)>,
}

/// Runs the steps in order; on a failure undoes the steps already done, newest first.
fn run_steps(ws: &Workspace, steps: &[Step]) -> Result<(), StepFailure> {
    for (done, step) in steps.iter().enumerate() {
        let outcome = match step {
            Step::Write { path, contents, .. } => ws.write(TOOL, path, contents).map(drop),
            Step::Remove { path, .. } => ws.remove(TOOL, path),
            Step::Rename { from, to } => ws.rename(TOOL, from, to),
        };
        if let Err(error) = outcome {
            let path = match step {
                Step::Write { path, .. } | Step::Remove { path, .. } => path.clone(),
                Step::Rename { to, .. } => to.clone(),
            };
            let mut failure = StepFailure {
                path,
                error,
                restored: Vec::new(),
                not_restored: Vec::new(),
            };
            for step in steps[..done].iter().rev() {
                let (path, undone) = match step {
                    Step::Write {
                        path,
                        before: Some(before),
                        ..
                    } => (path, ws.write(TOOL, path, before).map(drop)),
                    Step::Write {
                        path, before: None, ..
                    } => (path, ws.remove(TOOL, path)),
                    Step::Remove { path, before } => (path, ws.write(TOOL, path, before).map(drop)),
                    Step::Rename { from, to } => (from, ws.rename(TOOL, to, from)),
                };
                match undone {
                    Ok(()) => failure.restored.push(shown(path)),
                    Err(err) => failure.not_restored.push((shown(path), err)),
                }
            }
            return Err(failure);
        }
    }
    Ok(())
}

fn failure_result(failure: StepFailure) -> ToolResult {
    let mut text = format!(
        "{TOOL}: writing `{}` failed: {}.",
        shown(&failure.path),
        failure.error
    );
    if failure.restored.is_empty() && failure.not_restored.is_empty() {
        text.push_str(" It was the first change, so no file was changed.");
    } else if failure.not_restored.is_empty() {
        text.push_str(&format!(
            " The changes already made were rolled back ({}), so no file was changed.",
            failure.restored.join(", ")
        ));
    } else {
        let broken: Vec<String> = failure
            .not_restored
            .iter()
            .map(|(path, err)| format!("{path} ({err})"))
            .collect();
        text.push_str(&format!(
            " Rolling back failed for: {}; these files are left part-way. Restored: {}.",
            broken.join(", "),
            if failure.restored.is_empty() {
                "none".to_string()
            } else {
                failure.restored.join(", ")
            }
        ));
    }
    let not_restored: Vec<&str> = failure
        .not_restored
        .iter()
        .map(|(p, _)| p.as_str())
        .collect();
    ToolResult::failure(text).with_metadata(json!({
        "error": {"kind": failure.error.kind()},
        "rolled_back": failure.restored,
        "not_restored": not_restored,
    }))
}

fn success_result(summary: Summary) -> ToolResult {
    let mut text = String::new();
    for path in &summary.added {
        text.push_str(&format!("A {path}\n"));
    }
    for (from, to) in &summary.moved {
        text.push_str(&format!("R {from} -> {to}\n"));
    }
    for path in &summary.modified {
        text.push_str(&format!("M {path}\n"));
    }
    for path in &summary.deleted {
        text.push_str(&format!("D {path}\n"));
    }
    let text = if text.is_empty() {
        "Success. The patch applied but changed no file (its hunks left every file as it was)."
            .to_string()
    } else {
        format!("Success. Updated the following files:\n{text}")
    };
    let moved: Vec<Value> = summary
        .moved
        .iter()
        .map(|(from, to)| json!({"from": from, "to": to}))
        .collect();
    let mut result = ToolResult::ok(text).with_metadata(json!({
        "added": summary.added,
        "modified": summary.modified,
        "moved": moved,
        "deleted": summary.deleted,
    }));
    result.file_modified = summary.first_changed;
    result
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    input: String,
}

/// The `apply_patch` tool, bound to one workspace.
#[derive(Debug, Clone)]
pub struct ApplyPatch {
    workspace: Arc<Workspace>,
}

impl ApplyPatch {
    /// An `apply_patch` working in `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    /// Parses, plans and applies a patch text.
    fn apply(&self, input: &str) -> Result<ToolResult, ToolError> {
        let patch = parse_patch(input).map_err(|err| {
            ToolError::model(
                "invalid_input",
                format!("{TOOL}: invalid patch at {err}\nNo file was changed."),
            )
        })?;
        let (steps, summary) = plan(&self.workspace, &patch)?;
        match run_steps(&self.workspace, &steps) {
            Ok(()) => Ok(success_result(summary)),
            Err(failure) => Ok(failure_result(failure)),
        }
    }
}

#[async_trait]
impl Tool for ApplyPatch {
    fn name(&self) -> &str {
        TOOL
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "description": "A patch to apply all-or-nothing.",
            "properties": {
                "input": {
                    "type": "string",
                    "description": "The whole patch, from `*** Begin Patch` to `*** End Patch`, \
                                    in the format described for this tool."
                }
            },
            "required": ["input"],
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        &["fs"]
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Exclusive
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        let args: Args = parse_args(TOOL, args)?;
        let tool = self.clone();
        // File I/O blocks; keep it off the async workers.
        tokio::task::spawn_blocking(move || tool.apply(&args.input))
            .await
            .map_err(|err| ToolError::Fatal(format!("{TOOL} task failed: {err}")))?
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn workspace(files: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Workspace>) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let full = dir.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, text).unwrap();
        }
        let ws = Workspace::new(dir.path());
        (dir, ws)
    }

    fn wrap(body: &str) -> String {
        format!("*** Begin Patch\n{body}\n*** End Patch\n")
    }

    async fn run(ws: &Arc<Workspace>, input: &str) -> Result<ToolResult, ToolError> {
        ApplyPatch::new(Arc::clone(ws))
            .execute(&json!({ "input": input }))
            .await
    }

    fn read(dir: &tempfile::TempDir, path: &str) -> Option<String> {
        fs::read_to_string(dir.path().join(path)).ok()
    }

    fn message(err: ToolError) -> (&'static str, String) {
        match err {
            ToolError::Model { kind, message } => (kind, message),
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    struct Case {
        name: &'static str,
        files: &'static [(&'static str, &'static str)],
        body: &'static str,
        expect: &'static [(&'static str, Option<&'static str>)],
    }

    const CASES: &[Case] = &[
        Case {
            name: "add creates parents; a lone '+' is an empty line",
            files: &[],
            body: "*** Add File: dir/new.txt\n+hello\n+\n+world",
            expect: &[("dir/new.txt", Some("hello\n\nworld\n"))],
        },
        Case {
            name: "add an empty file",
            files: &[],
            body: "*** Add File: empty.txt",
            expect: &[("empty.txt", Some(""))],
        },
        Case {
            name: "delete",
            files: &[("old.txt", "bye\n")],
            body: "*** Delete File: old.txt",
            expect: &[("old.txt", None)],
        },
        Case {
            name: "update whose first hunk has no @@",
            files: &[("a.txt", "one\ntwo\nthree\n")],
            body: "*** Update File: a.txt\n one\n-two\n+TWO\n three",
            expect: &[("a.txt", Some("one\nTWO\nthree\n"))],
        },
        Case {
            name: "update with a bare @@",
            files: &[("a.txt", "one\ntwo\nthree\n")],
            body: "*** Update File: a.txt\n@@\n one\n-two\n+TWO\n three",
            expect: &[("a.txt", Some("one\nTWO\nthree\n"))],
        },
        Case {
            name: "two hunks in order",
            files: &[("a.txt", "a\nb\nc\nd\ne\nf\ng\n")],
            body: "*** Update File: a.txt\n@@\n a\n-b\n+B\n@@\n f\n-g\n+G",
            expect: &[("a.txt", Some("a\nB\nc\nd\ne\nf\nG\n"))],
        },
        Case {
            name: "an anchor picks the second of two identical blocks",
            files: &[(
                "a.rs",
                "fn one() {\n    x = 1;\n}\nfn two() {\n    x = 1;\n}\n",
            )],
            body: "*** Update File: a.rs\n@@ fn two() {\n-    x = 1;\n+    x = 2;",
            expect: &[(
                "a.rs",
                Some("fn one() {\n    x = 1;\n}\nfn two() {\n    x = 2;\n}\n"),
            )],
        },
        Case {
            name: "stacked anchors are found one after another",
            files: &[(
                "a.py",
                "class A:\n    def f(self):\n        return 1\nclass B:\n    def g(self):\n        \
                 return 1\n    def f(self):\n        return 1\n",
            )],
            body: "*** Update File: a.py\n@@ class B:\n@@     def f(self):\n-        return 1\n+        \
                   return 2",
            expect: &[(
                "a.py",
                Some(
                    "class A:\n    def f(self):\n        return 1\nclass B:\n    def g(self):\n        \
                     return 1\n    def f(self):\n        return 2\n",
                ),
            )],
        },
        Case {
            name: "End of File matches the last occurrence",
            files: &[("a.txt", "x\nmid\nx\n")],
            body: "*** Update File: a.txt\n@@\n-x\n+y\n*** End of File",
            expect: &[("a.txt", Some("x\nmid\ny\n"))],
        },
        Case {
            name: "move and update",
            files: &[("old/name.txt", "keep\nchange\n")],
            body: "*** Update File: old/name.txt\n*** Move to: new/name.txt\n@@\n keep\n-change\n+changed",
            expect: &[
                ("old/name.txt", None),
                ("new/name.txt", Some("keep\nchanged\n")),
            ],
        },
        Case {
            name: "move only",
            files: &[("a.txt", "same\n")],
            body: "*** Update File: a.txt\n*** Move to: b.txt",
            expect: &[("a.txt", None), ("b.txt", Some("same\n"))],
        },
        Case {
            name: "matching ignores trailing whitespace when exact fails",
            files: &[("a.txt", "alpha   \nbeta\n")],
            body: "*** Update File: a.txt\n@@\n-alpha\n+ALPHA",
            expect: &[("a.txt", Some("ALPHA\nbeta\n"))],
        },
        Case {
            name: "context lines keep the file's text under fuzzy matching",
            files: &[("a.txt", "ctx  \nold\n")],
            body: "*** Update File: a.txt\n ctx\n-old\n+new",
            expect: &[("a.txt", Some("ctx  \nnew\n"))],
        },
        Case {
            name: "matching ignores surrounding whitespace as the last resort",
            files: &[("a.txt", "    indented\nnext\n")],
            body: "*** Update File: a.txt\n@@\n-indented\n+    INDENTED",
            expect: &[("a.txt", Some("    INDENTED\nnext\n"))],
        },
        Case {
            name: "an exact match later wins over a fuzzy one earlier",
            files: &[("a.txt", "foo \nfoo\n")],
            body: "*** Update File: a.txt\n@@\n-foo\n+bar",
            expect: &[("a.txt", Some("foo \nbar\n"))],
        },
        Case {
            name: "a blank line inside a hunk is empty context",
            files: &[("a.txt", "a\n\nb\n")],
            body: "*** Update File: a.txt\n a\n\n-b\n+B",
            expect: &[("a.txt", Some("a\n\nB\n"))],
        },
        Case {
            name: "blank lines after a hunk are spacing",
            files: &[("a.txt", "a\nb\n")],
            body: "*** Update File: a.txt\n@@\n-a\n+A\n\n",
            expect: &[("a.txt", Some("A\nb\n"))],
        },
        Case {
            name: "blank lines after End of File before the next file",
            files: &[("a.txt", "a\nb\n"), ("c.txt", "c\n")],
            body: "*** Update File: a.txt\n@@\n-b\n+B\n*** End of File\n\n*** Update File: \
                   c.txt\n-c\n+C",
            expect: &[("a.txt", Some("a\nB\n")), ("c.txt", Some("C\n"))],
        },
        Case {
            name: "a pure addition goes right after its anchor",
            files: &[("a.rs", "fn main() {\n}\n")],
            body: "*** Update File: a.rs\n@@ fn main() {\n+    run();",
            expect: &[("a.rs", Some("fn main() {\n    run();\n}\n"))],
        },
        Case {
            name: "a pure addition without anchor is appended",
            files: &[("a.txt", "a\n")],
            body: "*** Update File: a.txt\n@@\n+b",
            expect: &[("a.txt", Some("a\nb\n"))],
        },
        Case {
            name: "a unified-diff range after @@ is not an anchor",
            files: &[("a.txt", "a\nb\n")],
            body: "*** Update File: a.txt\n@@ -1,2 +1,2 @@\n-a\n+A\n b",
            expect: &[("a.txt", Some("A\nb\n"))],
        },
        Case {
            name: "delete then add the same path",
            files: &[("a.txt", "old\n")],
            body: "*** Delete File: a.txt\n*** Add File: a.txt\n+new",
            expect: &[("a.txt", Some("new\n"))],
        },
        Case {
            name: "CRLF file stays CRLF",
            files: &[("w.txt", "one\r\ntwo\r\nthree\r\n")],
            body: "*** Update File: w.txt\n@@\n one\n-two\n+TWO\n+2b\n three",
            expect: &[("w.txt", Some("one\r\nTWO\r\n2b\r\nthree\r\n"))],
        },
        Case {
            name: "no trailing newline: a middle edit keeps none",
            files: &[("n.txt", "a\nb\nc")],
            body: "*** Update File: n.txt\n@@\n-b\n+B",
            expect: &[("n.txt", Some("a\nB\nc"))],
        },
        Case {
            name: "no trailing newline: replacing the last line keeps none",
            files: &[("n.txt", "a\nb")],
            body: "*** Update File: n.txt\n@@\n a\n-b\n+B",
            expect: &[("n.txt", Some("a\nB"))],
        },
        Case {
            name: "no trailing newline: adding after the last line ends with one",
            files: &[("n.txt", "a\nb")],
            body: "*** Update File: n.txt\n@@\n b\n+c",
            expect: &[("n.txt", Some("a\nb\nc\n"))],
        },
    ];

    #[tokio::test]
    async fn each_grammar_form_and_matching_strategy_applies() {
        for case in CASES {
            let (dir, ws) = workspace(case.files);
            let result = run(&ws, &wrap(case.body))
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert!(result.success, "{}: {}", case.name, result.output);
            for (path, want) in case.expect {
                assert_eq!(read(&dir, path).as_deref(), *want, "{}: {path}", case.name);
            }
            assert!(!ws.changes().is_empty(), "{}: journal", case.name);
            assert!(ws.changes().iter().all(|c| c.tool == TOOL), "{}", case.name);
        }
    }

    #[tokio::test]
    async fn the_result_lists_every_change() {
        let (dir, ws) = workspace(&[
            ("edit.txt", "a\n"),
            ("gone.txt", "x\n"),
            ("from.txt", "m\n"),
        ]);
        let patch = wrap(
            "*** Add File: new.txt\n+n\n*** Update File: edit.txt\n-a\n+b\n*** Delete File: \
             gone.txt\n*** Update File: from.txt\n*** Move to: sub/to.txt\n@@\n-m\n+M",
        );
        let result = run(&ws, &patch).await.unwrap();
        assert!(result.success);
        assert_eq!(
            result.output,
            "Success. Updated the following files:\nA new.txt\nR from.txt -> sub/to.txt\nM \
             edit.txt\nM sub/to.txt\nD gone.txt\n"
        );
        assert_eq!(
            result.structured_metadata.unwrap(),
            json!({
                "added": ["new.txt"],
                "modified": ["edit.txt", "sub/to.txt"],
                "moved": [{"from": "from.txt", "to": "sub/to.txt"}],
                "deleted": ["gone.txt"],
            })
        );
        assert_eq!(result.file_modified, Some(PathBuf::from("new.txt")));
        assert_eq!(read(&dir, "sub/to.txt").as_deref(), Some("M\n"));
        let kinds: Vec<_> = ws.changes().into_iter().map(|c| (c.path, c.kind)).collect();
        use crate::tools::workspace::ChangeKind::*;
        assert_eq!(
            kinds,
            [
                ("new.txt".to_string(), Created),
                ("edit.txt".to_string(), Modified),
                ("gone.txt".to_string(), Deleted),
                ("from.txt".to_string(), Moved),
                ("sub/to.txt".to_string(), Modified),
            ]
        );
    }

    #[tokio::test]
    async fn a_failing_hunk_in_the_second_file_changes_nothing() {
        let (dir, ws) = workspace(&[("one.txt", "1\n"), ("two.txt", "2\nkeep\n")]);
        let patch = wrap(
            "*** Add File: created.txt\n+x\n*** Update File: one.txt\n-1\n+ONE\n*** Update File: \
             two.txt\n@@\n-2\n+TWO\n@@\n keep\n-missing line\n+x",
        );
        let (kind, text) = message(run(&ws, &patch).await.unwrap_err());
        assert_eq!(kind, "no_match");
        for want in [
            "Update File `two.txt`",
            "hunk 2 (patch line 11) did not match",
            "  |keep\n  |missing line\n",
            "lines 2-2 match the first 1; then the file ends before `missing line`",
            "No file was changed.",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert_eq!(read(&dir, "one.txt").as_deref(), Some("1\n"));
        assert_eq!(read(&dir, "two.txt").as_deref(), Some("2\nkeep\n"));
        assert_eq!(read(&dir, "created.txt"), None);
        assert!(ws.changes().is_empty());
    }

    #[tokio::test]
    async fn refusals_name_the_problem_and_change_nothing() {
        /// Name, files beforehand, patch body, error kind, texts the message must contain.
        type Refusal = (
            &'static str,
            Files,
            &'static str,
            &'static str,
            &'static [&'static str],
        );
        type Files = &'static [(&'static str, &'static str)];
        let cases: &[Refusal] = &[
            (
                "escape with ..",
                &[],
                "*** Add File: ../x.txt\n+x",
                "escapes_root",
                &["Add File `../x.txt`", "escapes the workspace root"],
            ),
            (
                "absolute path",
                &[],
                "*** Update File: /etc/x\n@@\n-a\n+b",
                "absolute_path",
                &["Update File `/etc/x`", "is absolute"],
            ),
            (
                "add over an existing file",
                &[("a.txt", "a\n")],
                "*** Add File: a.txt\n+x",
                "already_exists",
                &["Add File `a.txt`: the file already exists"],
            ),
            (
                "update a missing file",
                &[],
                "*** Update File: nope.txt\n@@\n-a\n+b",
                "not_found",
                &["Update File `nope.txt`: the file does not exist"],
            ),
            (
                "delete a missing file",
                &[],
                "*** Delete File: nope.txt",
                "not_found",
                &["Delete File `nope.txt`: the file does not exist"],
            ),
            (
                "move onto an existing file",
                &[("a.txt", "a\n"), ("b.txt", "b\n")],
                "*** Update File: a.txt\n*** Move to: b.txt",
                "already_exists",
                &["the Move to target `b.txt` already exists"],
            ),
            (
                "anchor not found",
                &[("a.txt", "a\n")],
                "*** Update File: a.txt\n@@ fn nope()\n-a\n+b",
                "no_match",
                &["hunk 1 (patch line 3): anchor `@@ fn nope()` was not found"],
            ),
            (
                "End of File hunk not at the end",
                &[("a.txt", "x\ny\n")],
                "*** Update File: a.txt\n@@\n-x\n+X\n*** End of File",
                "no_match",
                &["marked `*** End of File`", "They occur at lines 1-1"],
            ),
            (
                "hunks out of order",
                &[("a.txt", "a\nb\nc\n")],
                "*** Update File: a.txt\n@@\n-c\n+C\n@@\n-a\n+A",
                "no_match",
                &["hunk 2", "occurs at line 1, before line 4"],
            ),
            (
                "a line that is nowhere",
                &[("a.txt", "a\n")],
                "*** Update File: a.txt\n@@\n-zzz\n+b",
                "no_match",
                &["The first expected line `zzz` does not occur in the file."],
            ),
        ];
        for (name, files, body, want_kind, wants) in cases {
            let (dir, ws) = workspace(files);
            let (kind, text) = message(run(&ws, &wrap(body)).await.unwrap_err());
            assert_eq!(kind, *want_kind, "{name}: {text}");
            for want in *wants {
                assert!(text.contains(want), "{name}: missing {want:?} in:\n{text}");
            }
            assert!(text.ends_with("No file was changed."), "{name}: {text}");
            for (path, contents) in *files {
                assert_eq!(read(&dir, path).as_deref(), Some(*contents), "{name}");
            }
            assert!(ws.changes().is_empty(), "{name}");
        }
    }

    #[tokio::test]
    async fn symlinked_files_are_refused() {
        let (dir, ws) = workspace(&[]);
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret.txt"), "secret\n").unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            dir.path().join("link.txt"),
        )
        .unwrap();
        for body in [
            "*** Update File: link.txt\n@@\n-secret\n+pwned",
            "*** Delete File: link.txt",
            "*** Add File: link.txt\n+pwned",
        ] {
            let (kind, text) = message(run(&ws, &wrap(body)).await.unwrap_err());
            assert_eq!(kind, "symlink", "{body}: {text}");
            assert!(text.contains("refusing to follow symbolic link"), "{text}");
        }
        assert_eq!(
            fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
            "secret\n"
        );
        assert!(
            fs::symlink_metadata(dir.path().join("link.txt"))
                .unwrap()
                .is_symlink()
        );
        assert!(ws.changes().is_empty());
    }

    #[tokio::test]
    async fn malformed_patches_say_which_line_is_wrong() {
        let (_dir, ws) = workspace(&[("a.txt", "one\n")]);
        let cases = [
            (
                "*** Update File: a.txt\n-one\n+two\n*** End Patch",
                "invalid patch at line 1: expected `*** Begin Patch` as the first line, found \
                 `*** Update File: a.txt`",
            ),
            (
                "*** Begin Patch\n*** Add File: b.txt\n+x",
                "invalid patch at line 3: expected `*** End Patch` as the last line, found `+x`",
            ),
            (
                "*** Begin Patch\n*** Update File: a.txt\n@@\n one\ntwo\n*** End Patch",
                "invalid patch at line 5: `two` in hunk 1 of `a.txt` is not a hunk line",
            ),
        ];
        for (input, want) in cases {
            let (kind, text) = message(run(&ws, input).await.unwrap_err());
            assert_eq!(kind, "invalid_input");
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert!(ws.changes().is_empty());
    }

    #[test]
    fn parse_patch_reads_every_form() {
        let patch = parse_patch(
            "*** Begin Patch\n*** Add File: a.txt\n+one\n+\n*** Delete File: b.txt\n\n*** Update \
             File: c.txt\n*** Move to: d.txt\n ctx\n-old\n+new\n@@ class A\n@@ def f\n\n-x\n+y\n*** \
             End of File\n*** End Patch",
        )
        .unwrap();
        use HunkLine::*;
        assert_eq!(
            patch.ops,
            [
                FileOp::Add {
                    path: "a.txt".into(),
                    contents: "one\n\n".into()
                },
                FileOp::Delete {
                    path: "b.txt".into()
                },
                FileOp::Update {
                    path: "c.txt".into(),
                    move_to: Some("d.txt".into()),
                    hunks: vec![
                        Hunk {
                            anchors: vec![],
                            lines: vec![
                                Context("ctx".into()),
                                Remove("old".into()),
                                Add("new".into())
                            ],
                            end_of_file: false,
                            line: 9,
                        },
                        Hunk {
                            anchors: vec!["class A".into(), "def f".into()],
                            lines: vec![
                                Context(String::new()),
                                Remove("x".into()),
                                Add("y".into())
                            ],
                            end_of_file: true,
                            line: 12,
                        },
                    ],
                },
            ]
        );
    }

    #[test]
    fn blank_lines_between_an_end_of_file_hunk_and_the_next_hunk_are_spacing() {
        let patch = parse_patch(
            "*** Begin Patch\n*** Update File: a\n@@\n-x\n+y\n*** End of File\n\n\n@@ f\n-z\n*** \
             End Patch",
        )
        .unwrap();
        let FileOp::Update { hunks, .. } = &patch.ops[0] else {
            panic!("{patch:?}");
        };
        assert_eq!(hunks.len(), 2);
        assert_eq!(hunks[1].anchors, ["f"]);
        assert_eq!(hunks[1].lines, [HunkLine::Remove("z".into())]);
        assert_eq!(hunks[1].line, 9);
    }

    #[test]
    fn parse_patch_tolerates_crlf_heredocs_and_surrounding_blank_lines() {
        let plain = parse_patch("*** Begin Patch\n*** Delete File: x\n*** End Patch").unwrap();
        for input in [
            "*** Begin Patch\r\n*** Delete File: x\r\n*** End Patch\r\n",
            "\n\n  *** Begin Patch\n*** Delete File:   x  \n*** End Patch  \n\n",
            "<<'EOF'\n*** Begin Patch\n*** Delete File: x\n*** End Patch\nEOF\n",
            "<<EOF\n*** Begin Patch\n*** Delete File: x\n*** End Patch\nEOF",
        ] {
            assert_eq!(parse_patch(input).as_ref(), Ok(&plain), "{input:?}");
        }
    }

    #[test]
    fn parse_patch_errors_name_the_line_and_what_was_expected() {
        let cases = [
            ("", 1, "the patch is empty"),
            (
                "*** Begin Patch",
                1,
                "expected `*** End Patch` as the last line, found the end",
            ),
            (
                "*** Begin Patch\n*** End Patch",
                2,
                "the patch has no file operations",
            ),
            (
                "*** Begin Patch\n*** Frobnicate File: x\n*** End Patch",
                2,
                "expected `*** Add File: <path>`, `*** Delete File: <path>`, `*** Update File: \
                 <path>` or `*** End Patch`, found `*** Frobnicate File: x`",
            ),
            (
                "*** Begin Patch\n*** Add File: a\n+x\ny\n*** End Patch",
                4,
                "found `y`",
            ),
            (
                "*** Begin Patch\n*** Add File: a\n+x\n\n+y\n*** End Patch",
                5,
                "every line of an Add File body starts with '+'",
            ),
            (
                "*** Begin Patch\n*** Add File:   \n*** End Patch",
                2,
                "expected a file path after `*** Add File:`",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n*** End Patch",
                3,
                "`*** Update File: a` has no hunks",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n@@\n*** End Patch",
                4,
                "hunk 1 of `a` has no lines",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n@@x\n-a\n*** End Patch",
                3,
                "a space after `@@`",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n@@\n-a\n+b\n*** End of File\n c\n*** End Patch",
                7,
                "hunk 2 of `a` must start with `@@` (only the first hunk may omit it)",
            ),
            (
                "*** Begin Patch\n*** Delete File: a\n*** End Patch\n*** Delete File: b\n*** End \
                 Patch",
                3,
                "`*** End Patch` must be the last line",
            ),
        ];
        for (input, line, want) in cases {
            let err = parse_patch(input).unwrap_err();
            assert_eq!(err.line, line, "{input:?}: {err}");
            assert!(err.message.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn a_failed_write_rolls_back_what_was_already_written() {
        let (dir, ws) = workspace(&[("a.txt", "orig\n"), ("b.txt", "b\n"), ("c.txt", "c\n")]);
        let steps = [
            Step::Write {
                path: "a.txt".into(),
                contents: b"changed\n".to_vec(),
                before: Some(b"orig\n".to_vec()),
            },
            Step::Write {
                path: "new.txt".into(),
                contents: b"new\n".to_vec(),
                before: None,
            },
            Step::Remove {
                path: "b.txt".into(),
                before: b"b\n".to_vec(),
            },
            Step::Rename {
                from: "c.txt".into(),
                to: "d.txt".into(),
            },
            // A regular file cannot be a directory: this write fails.
            Step::Write {
                path: "a.txt/child.txt".into(),
                contents: b"x".to_vec(),
                before: None,
            },
        ];
        let failure = run_steps(&ws, &steps).unwrap_err();
        assert_eq!(failure.path, PathBuf::from("a.txt/child.txt"));
        assert_eq!(failure.restored, ["c.txt", "b.txt", "new.txt", "a.txt"]);
        assert!(failure.not_restored.is_empty());
        assert_eq!(read(&dir, "a.txt").as_deref(), Some("orig\n"));
        assert_eq!(read(&dir, "b.txt").as_deref(), Some("b\n"));
        assert_eq!(read(&dir, "c.txt").as_deref(), Some("c\n"));
        assert_eq!(read(&dir, "d.txt"), None);
        assert_eq!(read(&dir, "new.txt"), None);
        let result = failure_result(failure);
        assert!(!result.success);
        assert!(
            result.output.contains(
                "writing `a.txt/child.txt` failed: \"a.txt\" is not a directory. The changes \
                 already made were rolled back (c.txt, b.txt, new.txt, a.txt), so no file was \
                 changed."
            ),
            "{}",
            result.output
        );
        assert_eq!(
            result.structured_metadata.unwrap()["rolled_back"],
            json!(["c.txt", "b.txt", "new.txt", "a.txt"])
        );
    }

    #[test]
    fn seek_tries_each_strategy_over_the_whole_file_before_the_next() {
        let lines = ["  a", "a ", "a"];
        assert_eq!(seek(&lines, &["a"], 0, false), Some((2, Matching::Exact)));
        assert_eq!(seek(&lines, &["a"], 0, true), Some((2, Matching::Exact)));
        assert_eq!(
            seek(&lines[..2], &["a"], 0, false),
            Some((1, Matching::TrimEnd))
        );
        assert_eq!(
            seek(&lines[..1], &["a"], 0, false),
            Some((0, Matching::Trim))
        );
        assert_eq!(seek(&lines, &["a"], 3, false), None);
        assert_eq!(seek(&lines, &["a", "a", "a", "a"], 0, false), None);
        assert_eq!(
            seek_near(&["x", "y", "x", "z", "x"], &["x"], 0, 3),
            Some((2, Matching::Exact)),
            "nearest first, the earlier one wins a tie"
        );
        assert_eq!(
            seek_near(&["x", "y", "x", "z", "x"], &["x"], 3, 0),
            Some((4, Matching::Exact))
        );
    }

    #[tokio::test]
    async fn the_tool_is_an_exclusive_fs_tool_that_rebinds_and_checks_its_arguments() {
        let (_dir, ws) = workspace(&[]);
        let tool = ApplyPatch::new(Arc::clone(&ws));
        assert_eq!(tool.name(), "apply_patch");
        assert_eq!(tool.tags(), ["fs"]);
        assert_eq!(tool.concurrency_class(), ConcurrencyClass::Exclusive);
        let schema = tool.input_schema();
        assert_eq!(schema["additionalProperties"], json!(false));
        let mut registry = crate::tools::ToolRegistry::default();
        registry
            .register(Arc::new(ApplyPatch::new(Arc::clone(&ws))))
            .expect("the schema compiles");
        assert!(schema["properties"]["input"]["description"].is_string());
        let (kind, text) = message(
            tool.execute(&json!({"input": "x", "extra": 1}))
                .await
                .unwrap_err(),
        );
        assert_eq!(kind, "invalid_input");
        assert!(text.contains("unknown field `extra`"), "{text}");

        let (other_dir, other) = workspace(&[]);
        let rebound = tool.rebind_cwd(&other).unwrap();
        let result = rebound
            .execute(&json!({"input": wrap("*** Add File: here.txt\n+x")}))
            .await
            .unwrap();
        assert!(result.success);
        assert_eq!(read(&other_dir, "here.txt").as_deref(), Some("x\n"));
        assert!(ws.changes().is_empty());
        assert!(rebound.as_any().downcast_ref::<ApplyPatch>().is_some());
    }
}
