//! `diff_edit`: applies one unified diff to one file, all-or-nothing.
//!
//! The parser is written here rather than taken from a crate: `diffy` (the well-kept option)
//! rejects hunks whose `@@` counts are off by one, only says "error applying hunk #N", and
//! compares lines with their endings, so CRLF files would not match an LF diff. Matching and
//! rendering are shared with `apply_patch` (see `text_edit`).

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
use super::text_edit::{
    EditError, HunkLine, MAX_FILE_BYTES, Matching, Replacement, TextFile, clip, describe_miss,
    old_lines, seek_near, without_trailing_blanks,
};
use crate::fs_safe::FsError;
use crate::tools::{
    CallSubject, Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace,
};

const TOOL: &str = "diff_edit";

const DESCRIPTION: &str = "\
Apply a unified diff (the `diff -u` / `git diff` format) to one file. All-or-nothing: if any \
hunk does not apply, the file is left unchanged and the error says which hunk failed and why.

Each hunk starts with `@@ -<old line>,<old count> +<new line>,<new count> @@`, followed by lines \
starting with ' ' (context), '-' (removed) or '+' (added); give about 3 context lines around each \
change. `---`/`+++` header lines are optional; when present they must name this file. \
`--- /dev/null` creates the file (it must not exist).

Line numbers may be off: each hunk is searched for at its stated old line (shifted by the offset \
at which the previous hunk was found), then alternately one line earlier and one later, nearest \
first; an exact match anywhere wins over one that ignores trailing whitespace, which wins over \
one that ignores surrounding whitespace. Hunks apply in order and must not overlap; a bare `@@` \
(no numbers) is searched for from the end of the previous hunk. The counts in \
the @@ line are not checked: the hunk's lines are what is applied. CRLF files stay CRLF; a file \
without a final newline keeps none unless the diff says otherwise (`\\ No newline at end of \
file`).";

/// A unified diff for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnifiedDiff {
    /// The `---` header's file name, if given.
    pub old_name: Option<String>,
    /// The `+++` header's file name, if given.
    pub new_name: Option<String>,
    /// The hunks, in file order.
    pub hunks: Vec<UnifiedHunk>,
}

/// The line numbers of a `@@ -a,b +c,d @@` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HunkRange {
    /// `a`: the first old line (1-based; for an empty old side, the line it follows).
    pub old_start: usize,
    /// `b`: the number of old lines.
    pub old_len: usize,
    /// `c`: the first new line.
    pub new_start: usize,
    /// `d`: the number of new lines.
    pub new_len: usize,
}

/// One hunk of a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnifiedHunk {
    /// The header's numbers; `None` for a bare `@@` (placed right after the previous hunk).
    pub range: Option<HunkRange>,
    /// Context, removed and added lines, in order.
    pub lines: Vec<HunkLine>,
    /// A `\ No newline at end of file` marker follows the old side's last line.
    pub old_missing_newline: bool,
    /// A `\ No newline at end of file` marker follows the new side's last line.
    pub new_missing_newline: bool,
    /// The 1-based line of the diff holding the `@@` header.
    pub line: usize,
}

/// Why a diff could not be parsed: the 1-based line of the diff and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct DiffError {
    /// The 1-based line of the diff text at fault.
    pub line: usize,
    /// What is wrong and what was expected.
    pub message: String,
}

fn diff_error(line: usize, message: impl Into<String>) -> DiffError {
    DiffError {
        line,
        message: message.into(),
    }
}

const HEADER_FORM: &str = "`@@ -<old line>,<old count> +<new line>,<new count> @@`";

/// Parses a unified diff of one file; pure, touches no file.
///
/// Lines before the first `---`, `+++` or `@@` (such as `diff --git` or `index`) are skipped.
/// A hunk's body runs until the next `@@`, or, once its counts are reached, until a new file
/// section or a line that is not a hunk line; blank lines past the counts are dropped.
pub fn parse_unified_diff(text: &str) -> Result<UnifiedDiff, DiffError> {
    let mut lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    if text.ends_with('\n') {
        lines.pop();
    }
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.starts_with("--- ") || line.starts_with("+++ ") || line.starts_with("@@") {
            break;
        }
        if line.starts_with([' ', '-', '+']) {
            return Err(diff_error(
                at + 1,
                format!(
                    "`{}` looks like a hunk line, but no hunk header {HEADER_FORM} came before it",
                    clip(line)
                ),
            ));
        }
        at += 1;
    }
    let mut old_name = None;
    let mut new_name = None;
    if let Some(name) = lines.get(at).and_then(|l| l.strip_prefix("--- ")) {
        old_name = Some(header_name(name));
        at += 1;
        match lines.get(at).and_then(|l| l.strip_prefix("+++ ")) {
            Some(name) => new_name = Some(header_name(name)),
            None => {
                return Err(diff_error(
                    at + 1,
                    "expected a `+++ <file>` line right after the `--- <file>` line",
                ));
            }
        }
        at += 1;
    } else if let Some(name) = lines.get(at).and_then(|l| l.strip_prefix("+++ ")) {
        new_name = Some(header_name(name));
        at += 1;
    }
    let mut hunks = Vec::new();
    while at < lines.len() {
        let line = lines[at];
        if line.starts_with("@@") {
            hunks.push(parse_hunk(&lines, &mut at, hunks.len() + 1)?);
        } else if line.trim().is_empty() {
            at += 1;
        } else if line.starts_with("--- ") || line.starts_with("+++ ") || line.starts_with("diff ")
        {
            return Err(diff_error(
                at + 1,
                "a second file section starts here, but diff_edit changes one file per call: \
                 send each file's diff in its own call, or use apply_patch for several files",
            ));
        } else {
            return Err(diff_error(
                at + 1,
                format!(
                    "expected a hunk header {HEADER_FORM}, found `{}`",
                    clip(line)
                ),
            ));
        }
    }
    if hunks.is_empty() {
        return Err(diff_error(
            lines.len().max(1),
            format!("the diff has no hunks; each hunk starts with {HEADER_FORM}"),
        ));
    }
    Ok(UnifiedDiff {
        old_name,
        new_name,
        hunks,
    })
}

/// A `---`/`+++` file name without a tab-separated timestamp or quotes.
fn header_name(raw: &str) -> String {
    let name = raw.split('\t').next().unwrap_or(raw).trim();
    name.strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(name)
        .to_string()
}

/// Parses `@@ -a,b +c,d @@ …` (the diff's line `number`); a bare `@@` (or `@@ @@`) has no
/// numbers.
fn parse_header(line: &str, number: usize) -> Result<Option<HunkRange>, DiffError> {
    let rest = line.strip_prefix("@@").unwrap_or(line).trim_start();
    if rest.is_empty() || rest.starts_with("@@") {
        return Ok(None);
    }
    let ranges = rest.find("@@").map_or(rest, |end| &rest[..end]);
    let range = |part: Option<&str>, sign: char| -> Option<(usize, usize)> {
        let part = part?.strip_prefix(sign)?;
        match part.split_once(',') {
            Some((start, len)) => Some((start.parse().ok()?, len.parse().ok()?)),
            None => Some((part.parse().ok()?, 1)),
        }
    };
    let mut parts = ranges.split_whitespace();
    match (
        range(parts.next(), '-'),
        range(parts.next(), '+'),
        parts.next(),
    ) {
        (Some((old_start, old_len)), Some((new_start, new_len)), None) => Ok(Some(HunkRange {
            old_start,
            old_len,
            new_start,
            new_len,
        })),
        _ => Err(diff_error(
            number,
            format!(
                "expected a hunk header like `@@ -12,3 +12,4 @@`, found `{}`",
                clip(line)
            ),
        )),
    }
}

fn parse_hunk(lines: &[&str], at: &mut usize, number: usize) -> Result<UnifiedHunk, DiffError> {
    let header_line = *at + 1;
    let range = parse_header(lines[*at], header_line)?;
    *at += 1;
    let mut body = Vec::new();
    let (mut old_seen, mut new_seen, mut blank_tail) = (0, 0, 0);
    let (mut old_missing_newline, mut new_missing_newline) = (false, false);
    while *at < lines.len() {
        let line = lines[*at];
        let counted = range.is_none_or(|r| old_seen >= r.old_len && new_seen >= r.new_len);
        if line.starts_with("@@") {
            break;
        }
        let next_file = line.starts_with("diff ")
            || line.starts_with("--- ")
                && lines.get(*at + 1).is_some_and(|n| n.starts_with("+++ "));
        if counted && next_file {
            break;
        }
        let (parsed, blank) = if let Some(text) = line.strip_prefix(' ') {
            (HunkLine::Context(text.to_string()), false)
        } else if let Some(text) = line.strip_prefix('-') {
            (HunkLine::Remove(text.to_string()), false)
        } else if let Some(text) = line.strip_prefix('+') {
            (HunkLine::Add(text.to_string()), false)
        } else if line.starts_with('\\') {
            match body.last() {
                Some(HunkLine::Context(_)) => {
                    (old_missing_newline, new_missing_newline) = (true, true)
                }
                Some(HunkLine::Remove(_)) => old_missing_newline = true,
                Some(HunkLine::Add(_)) => new_missing_newline = true,
                None => {
                    return Err(diff_error(
                        *at + 1,
                        "a `\\ No newline at end of file` marker must follow a hunk line",
                    ));
                }
            }
            *at += 1;
            continue;
        } else if line.trim().is_empty() {
            (HunkLine::Context(String::new()), true)
        } else if counted {
            break;
        } else {
            return Err(diff_error(
                *at + 1,
                format!(
                    "`{}` in hunk {number} is not a hunk line: every line starts with ' ' \
                     (context), '-' (removed) or '+' (added); a context line needs its leading \
                     space",
                    clip(line)
                ),
            ));
        };
        match parsed {
            HunkLine::Context(_) => (old_seen, new_seen) = (old_seen + 1, new_seen + 1),
            HunkLine::Remove(_) => old_seen += 1,
            HunkLine::Add(_) => new_seen += 1,
        }
        blank_tail = if blank { blank_tail + 1 } else { 0 };
        body.push(parsed);
        *at += 1;
    }
    // Blank lines beyond what the header counts are spacing between hunks, not context.
    if let Some(r) = range {
        while blank_tail > 0 && old_seen > r.old_len && new_seen > r.new_len {
            body.pop();
            (old_seen, new_seen, blank_tail) = (old_seen - 1, new_seen - 1, blank_tail - 1);
        }
    }
    if body.is_empty() {
        return Err(diff_error(
            header_line,
            format!("hunk {number} has no lines; expected lines starting with ' ', '-' or '+'"),
        ));
    }
    Ok(UnifiedHunk {
        range,
        lines: body,
        old_missing_newline,
        new_missing_newline,
        line: header_line,
    })
}

/// Where one hunk went.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    hunk: usize,
    stated_line: Option<usize>,
    applied_line: usize,
    matching: Matching,
}

impl Placement {
    fn offset(&self) -> Option<i64> {
        let stated = i64::try_from(self.stated_line?).ok()?;
        Some(i64::try_from(self.applied_line).ok()? - stated)
    }
}

/// Applies a parsed diff to a file's bytes in memory, as `diff_edit` computes the new content
/// before it writes: the new bytes, or why they cannot be made.
pub fn apply_to_bytes(bytes: &[u8], diff: &UnifiedDiff) -> Result<Vec<u8>, EditError> {
    let file = TextFile::parse(bytes).ok_or(EditError::NotText)?;
    apply_diff(&file, diff).map(|(after, _)| after)
}

/// Applies every hunk to the file's text, or explains which hunk failed and why.
fn apply_diff(file: &TextFile, diff: &UnifiedDiff) -> Result<(Vec<u8>, Vec<Placement>), EditError> {
    let texts = file.texts();
    let mut min_start = 0;
    let mut shift: i64 = 0;
    let mut replacements = Vec::with_capacity(diff.hunks.len());
    let mut placements = Vec::with_capacity(diff.hunks.len());
    let mut final_newline = None;
    for (index, hunk) in diff.hunks.iter().enumerate() {
        let number = index + 1;
        // 0-based: the first old line, or for an empty old side the line it goes before.
        let stated = hunk.range.map(|r| {
            if r.old_len == 0 {
                r.old_start
            } else {
                r.old_start.saturating_sub(1)
            }
        });
        let hint = stated.map_or(min_start, |s| {
            usize::try_from(
                (i64::try_from(s).unwrap_or(i64::MAX))
                    .saturating_add(shift)
                    .max(0),
            )
            .unwrap_or(usize::MAX)
        });
        let (at, lines, matching) = if old_lines(&hunk.lines).is_empty() {
            (
                hint.clamp(min_start, texts.len()),
                hunk.lines.as_slice(),
                Matching::Exact,
            )
        } else {
            let mut lines = hunk.lines.as_slice();
            loop {
                if let Some((at, how)) = seek_near(&texts, &old_lines(lines), min_start, hint) {
                    break (at, lines, how);
                }
                match without_trailing_blanks(lines) {
                    Some(shorter) => lines = shorter,
                    None => {
                        let header = match hunk.range {
                            Some(r) => format!(
                                "@@ -{},{} +{},{} @@",
                                r.old_start, r.old_len, r.new_start, r.new_len
                            ),
                            None => "@@".to_string(),
                        };
                        return Err(EditError::NoMatch {
                            hunk: number,
                            explanation: format!(
                                "hunk {number} (`{header}`, diff line {}) does not apply: its \
                                 context and removed lines are not in the file at or after line \
                                 {} (searched nearest to line {} first).\n{}",
                                hunk.line,
                                min_start + 1,
                                hint.max(min_start) + 1,
                                describe_miss(&texts, &old_lines(&hunk.lines), min_start)
                            ),
                        });
                    }
                }
            }
        };
        let replacement = Replacement::from_hunk(at, lines);
        if let Some(s) = stated {
            shift = i64::try_from(at).unwrap_or(i64::MAX) - i64::try_from(s).unwrap_or(i64::MAX);
        }
        min_start = at + replacement.old_len();
        if min_start == texts.len() {
            final_newline = if hunk.new_missing_newline {
                Some(false)
            } else if hunk.old_missing_newline {
                Some(true)
            } else {
                None
            };
        }
        placements.push(Placement {
            hunk: number,
            stated_line: stated.map(|s| s + 1),
            applied_line: at + 1,
            matching,
        });
        replacements.push(replacement);
    }
    let bytes = file.render(replacements, final_newline)?;
    Ok((bytes, placements))
}

/// Whether a `---`/`+++` file name plausibly names `rel` (`a/`/`b/` prefixes, a longer or
/// shorter path to the same file).
fn names_match(header: &str, rel: &Path) -> bool {
    let header: PathBuf = Path::new(header)
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    !header.as_os_str().is_empty() && (header.ends_with(rel) || rel.ends_with(&header))
}

fn refuse(kind: &'static str, path: &str, message: impl std::fmt::Display) -> ToolError {
    ToolError::model(
        kind,
        format!("{TOOL} `{path}`: {message}\nThe file was not changed."),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    diff: String,
}

/// The `diff_edit` tool, bound to one workspace.
#[derive(Debug, Clone)]
pub struct DiffEdit {
    workspace: Arc<Workspace>,
}

impl DiffEdit {
    /// A `diff_edit` working in `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    fn apply(&self, path: &str, diff_text: &str) -> Result<ToolResult, ToolError> {
        let ws = &self.workspace;
        let rel = ws.resolve(path).map_err(|e| refuse(e.kind(), path, &e))?;
        if rel.as_os_str().is_empty() {
            return Err(refuse(
                "invalid_input",
                path,
                "the path names the workspace root, not a file",
            ));
        }
        let diff = parse_unified_diff(diff_text)
            .map_err(|e| refuse("invalid_input", path, format!("invalid diff at {e}")))?;
        let creates = diff.old_name.as_deref() == Some("/dev/null");
        if diff.new_name.as_deref() == Some("/dev/null") {
            return Err(refuse(
                "unsupported",
                path,
                "the diff deletes the file (`+++ /dev/null`); diff_edit only edits and creates \
                 files: use apply_patch with `*** Delete File:`",
            ));
        }
        for (marker, name) in [("---", &diff.old_name), ("+++", &diff.new_name)] {
            if let Some(name) = name.as_deref().filter(|n| *n != "/dev/null")
                && !names_match(name, &rel)
            {
                return Err(refuse(
                    "invalid_input",
                    path,
                    format!(
                        "the diff's `{marker}` header names `{name}`, which is not this file; \
                         fix `path` or the header (or leave the headers out)"
                    ),
                ));
            }
        }
        let only_additions = diff.hunks.iter().all(|h| old_lines(&h.lines).is_empty());
        let before = match ws.read(&rel, MAX_FILE_BYTES) {
            Ok(_) if creates => {
                return Err(refuse(
                    "already_exists",
                    path,
                    "the diff creates the file (`--- /dev/null`), but it already exists",
                ));
            }
            Ok(bytes) => Some(bytes),
            Err(FsError::NotFound(_)) if creates || only_additions => None,
            Err(FsError::NotFound(_)) => {
                return Err(refuse(
                    "not_found",
                    path,
                    "the file does not exist (a diff that creates it starts with `--- /dev/null` \
                     and has only '+' lines)",
                ));
            }
            Err(err) => return Err(refuse(err.kind(), path, &err)),
        };
        let file = TextFile::parse(before.as_deref().unwrap_or_default())
            .ok_or_else(|| refuse("invalid_input", path, "the file is not UTF-8 text"))?;
        let (after, placements) =
            apply_diff(&file, &diff).map_err(|why| refuse("no_match", path, why))?;
        let shown = rel.to_string_lossy().into_owned();
        let hunks: Vec<Value> = placements
            .iter()
            .map(|p| {
                json!({
                    "hunk": p.hunk,
                    "stated_line": p.stated_line,
                    "applied_line": p.applied_line,
                    "offset": p.offset(),
                    "matching": p.matching.name(),
                })
            })
            .collect();
        let metadata = json!({"path": shown, "created": before.is_none(), "hunks": hunks});
        if before.as_deref() == Some(after.as_slice()) {
            return Ok(ToolResult::ok(format!(
                "The diff applies to {shown} but changes nothing (its hunks have no '-' or '+' \
                 lines that differ); the file was not written."
            ))
            .with_metadata(metadata));
        }
        ws.write(TOOL, &rel, &after)
            .map_err(|e| refuse(e.kind(), path, &e))?;
        let count = placements.len();
        let mut text = format!(
            "{} {shown}: applied {count} hunk{}.",
            if before.is_none() {
                "Created"
            } else {
                "Edited"
            },
            if count == 1 { "" } else { "s" }
        );
        for p in &placements {
            let mut notes = Vec::new();
            match (p.stated_line, p.offset()) {
                (Some(stated), Some(offset)) if offset != 0 => notes.push(format!(
                    "found at line {} instead of {stated} (offset {offset:+})",
                    p.applied_line
                )),
                (None, _) => notes.push(format!("placed at line {}", p.applied_line)),
                _ => {}
            }
            if p.matching != Matching::Exact {
                notes.push(format!("matched {}", p.matching.name().replace('_', " ")));
            }
            if !notes.is_empty() {
                text.push_str(&format!("\nHunk {}: {}.", p.hunk, notes.join(", ")));
            }
        }
        let mut result = ToolResult::ok(text).with_metadata(metadata);
        result.file_modified = Some(rel);
        Ok(result)
    }
}

#[async_trait]
impl Tool for DiffEdit {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                TOOL,
                DESCRIPTION,
                json!({
                    "type": "object",
                    "description": "One unified diff for one file.",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "The file to change, relative to the workspace root."
                        },
                        "diff": {
                            "type": "string",
                            "description": "The unified diff: optional `---`/`+++` headers, then \
                                            one or more hunks each starting with `@@ -a,b +c,d \
                                            @@`."
                        }
                    },
                    "required": ["path", "diff"],
                    "additionalProperties": false
                }),
                Effects::WRITES_FILES,
            )
            .subject(CallSubject::WrittenPath("path"))
            .groups(&["fs"])
            .contract()
            .tags(&["fs"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: Args = parse_args(TOOL, args)?;
        let tool = self.clone();
        // File I/O blocks; keep it off the async workers.
        tokio::task::spawn_blocking(move || tool.apply(&args.path, &args.diff))
            .await
            .map_err(|err| ToolError::Fatal(format!("{TOOL} task failed: {err}")))?
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ConcurrencyClass;
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

    async fn run(ws: &Arc<Workspace>, path: &str, diff: &str) -> Result<ToolResult, ToolError> {
        DiffEdit::new(Arc::clone(ws))
            .call(
                &ToolContext::detached("."),
                &json!({ "path": path, "diff": diff }),
            )
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

    /// Lines "l1".."l{n}", each with a newline.
    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("l{i}\n")).collect()
    }

    #[tokio::test]
    async fn a_two_hunk_diff_applies() {
        let (dir, ws) = workspace(&[("src/a.txt", &numbered(12))]);
        let diff = "diff --git a/src/a.txt b/src/a.txt\nindex 1111111..2222222 100644\n--- \
                    a/src/a.txt\n+++ b/src/a.txt\n@@ -1,3 +1,3 @@\n l1\n-l2\n+two\n l3\n@@ -9,4 \
                    +9,5 @@ some section\n l9\n l10\n+ten and a half\n l11\n-l12\n+twelve\n";
        let result = run(&ws, "src/a.txt", diff).await.unwrap();
        assert!(result.success, "{}", result.output);
        assert_eq!(result.output, "Edited src/a.txt: applied 2 hunks.");
        assert_eq!(
            read(&dir, "src/a.txt").unwrap(),
            "l1\ntwo\nl3\nl4\nl5\nl6\nl7\nl8\nl9\nl10\nten and a half\nl11\ntwelve\n"
        );
        assert_eq!(result.file_modified, Some(PathBuf::from("src/a.txt")));
        let meta = result.structured_metadata.unwrap();
        assert_eq!(meta["hunks"][1]["applied_line"], json!(9));
        assert_eq!(meta["hunks"][1]["offset"], json!(0));
        assert_eq!(meta["created"], json!(false));
        let changes = ws.changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].tool, "diff_edit");
    }

    #[tokio::test]
    async fn a_hunk_that_does_not_apply_changes_nothing() {
        let original = numbered(12);
        let (dir, ws) = workspace(&[("a.txt", &original)]);
        let diff =
            "@@ -1,3 +1,3 @@\n l1\n-l2\n+two\n l3\n@@ -9,3 +9,3 @@\n l9\n-l10 typo\n+ten\n l11\n";
        let (kind, text) = message(run(&ws, "a.txt", diff).await.unwrap_err());
        assert_eq!(kind, "no_match");
        for want in [
            "diff_edit `a.txt`: hunk 2 (`@@ -9,3 +9,3 @@`, diff line 6) does not apply",
            "  |l9\n  |l10 typo\n  |l11\n",
            "Closest: file lines 9-9 match the first 1; then expected `l10 typo` but line 10 is \
             `l10`.",
            "The file was not changed.",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert_eq!(read(&dir, "a.txt").unwrap(), original);
        assert!(ws.changes().is_empty());
    }

    #[tokio::test]
    async fn line_numbers_that_are_off_are_tolerated() {
        let (dir, ws) = workspace(&[("a.txt", &numbered(30))]);
        // Both hunks say they are 10 lines earlier than they are; the counts of the first are
        // wrong too.
        let diff = "@@ -5,9 +5,3 @@\n l15\n-l16\n+sixteen\n l17\n@@ -15,3 +15,3 @@\n l25\n-l26\n+twenty-six\n l27\n";
        let result = run(&ws, "a.txt", diff).await.unwrap();
        assert!(result.success);
        assert_eq!(
            result.output,
            "Edited a.txt: applied 2 hunks.\nHunk 1: found at line 15 instead of 5 (offset \
             +10).\nHunk 2: found at line 25 instead of 15 (offset +10)."
        );
        let text = read(&dir, "a.txt").unwrap();
        assert!(text.contains("l15\nsixteen\nl17\n") && text.contains("l25\ntwenty-six\nl27\n"));
        assert_eq!(
            result.structured_metadata.unwrap()["hunks"][0]["offset"],
            json!(10)
        );
    }

    #[tokio::test]
    async fn the_nearest_occurrence_to_the_stated_line_wins() {
        let (dir, ws) = workspace(&[("a.txt", "x\na\nx\nb\nx\nc\n")]);
        let result = run(&ws, "a.txt", "@@ -4,1 +4,1 @@\n-x\n+X\n")
            .await
            .unwrap();
        assert!(result.success);
        assert_eq!(read(&dir, "a.txt").unwrap(), "x\na\nX\nb\nx\nc\n");
        let result = run(&ws, "a.txt", "@@ -6,1 +6,1 @@\n-x\n+Y\n")
            .await
            .unwrap();
        assert!(result.success);
        assert_eq!(read(&dir, "a.txt").unwrap(), "x\na\nX\nb\nY\nc\n");
    }

    #[tokio::test]
    async fn whitespace_crlf_and_missing_newlines_are_kept() {
        let (dir, ws) = workspace(&[
            ("w.txt", "one\r\ntwo  \r\nthree\r\n"),
            ("n.txt", "a\nb"),
            ("m.txt", "a\nb"),
        ]);
        let result = run(&ws, "w.txt", "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n")
            .await
            .unwrap();
        assert!(
            result
                .output
                .contains("Hunk 1: matched ignoring trailing whitespace."),
            "{}",
            result.output
        );
        assert_eq!(read(&dir, "w.txt").unwrap(), "one\r\nTWO\r\nthree\r\n");

        let keep_none = "--- n.txt\n+++ n.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of \
                         file\n+B\n\\ No newline at end of file\n";
        run(&ws, "n.txt", keep_none).await.unwrap();
        assert_eq!(read(&dir, "n.txt").unwrap(), "a\nB");

        let add_one = "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n";
        run(&ws, "m.txt", add_one).await.unwrap();
        assert_eq!(read(&dir, "m.txt").unwrap(), "a\nb\n");
    }

    #[tokio::test]
    async fn dev_null_creates_a_file_and_bare_hunks_follow_the_previous_one() {
        let (dir, ws) = workspace(&[("a.txt", "a\nb\nc\n")]);
        let create = "--- /dev/null\n+++ b/new/file.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n";
        let result = run(&ws, "new/file.txt", create).await.unwrap();
        assert_eq!(result.output, "Created new/file.txt: applied 1 hunk.");
        assert_eq!(read(&dir, "new/file.txt").unwrap(), "hello\nworld\n");
        let (kind, _) = message(
            run(&ws, "a.txt", create.replace("new/file", "a").as_str())
                .await
                .unwrap_err(),
        );
        assert_eq!(kind, "already_exists");

        let bare = "@@\n-a\n+A\n@@\n-c\n+C\n";
        run(&ws, "a.txt", bare).await.unwrap();
        assert_eq!(read(&dir, "a.txt").unwrap(), "A\nb\nC\n");
    }

    #[tokio::test]
    async fn refusals_change_nothing() {
        let (dir, ws) = workspace(&[("a.txt", "a\n")]);
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("s.txt"), "a\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("s.txt"), dir.path().join("link.txt"))
            .unwrap();
        let edit = "@@ -1 +1 @@\n-a\n+b\n";
        let cases = [
            (
                "../x.txt",
                edit.to_string(),
                "escapes_root",
                "escapes the workspace root",
            ),
            ("/etc/x", edit.to_string(), "absolute_path", "is absolute"),
            (
                "link.txt",
                edit.to_string(),
                "symlink",
                "refusing to follow symbolic link",
            ),
            (
                "missing.txt",
                edit.to_string(),
                "not_found",
                "the file does not exist",
            ),
            (
                "a.txt",
                format!("--- a/b.txt\n+++ b/b.txt\n{edit}"),
                "invalid_input",
                "the diff's `---` header names `a/b.txt`, which is not this file",
            ),
            (
                "a.txt",
                format!("--- a/a.txt\n+++ /dev/null\n{edit}"),
                "unsupported",
                "use apply_patch with `*** Delete File:`",
            ),
            (
                "a.txt",
                format!("--- a/a.txt\n+++ b/a.txt\n{edit}--- a/c.txt\n+++ b/c.txt\n{edit}"),
                "invalid_input",
                "invalid diff at line 6: a second file section starts here",
            ),
            (
                "a.txt",
                "-a\n+b\n".to_string(),
                "invalid_input",
                "invalid diff at line 1: `-a` looks like a hunk line, but no hunk header",
            ),
        ];
        for (path, diff, want_kind, want) in cases {
            let (kind, text) = message(run(&ws, path, &diff).await.unwrap_err());
            assert_eq!(kind, want_kind, "{path}: {text}");
            assert!(text.contains(want), "{path}: missing {want:?} in:\n{text}");
            assert!(text.ends_with("The file was not changed."), "{text}");
        }
        assert_eq!(read(&dir, "a.txt").unwrap(), "a\n");
        assert_eq!(
            fs::read_to_string(outside.path().join("s.txt")).unwrap(),
            "a\n"
        );
        assert!(ws.changes().is_empty());
    }

    #[test]
    fn parse_unified_diff_reads_headers_hunks_and_markers() {
        let diff = parse_unified_diff(
            "--- a/x.rs\t2024-01-01\n+++ b/x.rs\n@@ -3 +3,2 @@ fn main\n-old\n+new\n+more\n\\ \
             No newline at end of file\n\n@@ -10,2 +11,2 @@\n ctx\n\n-gone\n",
        )
        .unwrap();
        assert_eq!(diff.old_name.as_deref(), Some("a/x.rs"));
        assert_eq!(diff.new_name.as_deref(), Some("b/x.rs"));
        assert_eq!(diff.hunks.len(), 2);
        let first = &diff.hunks[0];
        assert_eq!(
            first.range,
            Some(HunkRange {
                old_start: 3,
                old_len: 1,
                new_start: 3,
                new_len: 2
            })
        );
        assert_eq!(
            first.lines,
            [
                HunkLine::Remove("old".into()),
                HunkLine::Add("new".into()),
                HunkLine::Add("more".into())
            ],
            "the blank line after the counted lines is spacing"
        );
        assert!(first.new_missing_newline && !first.old_missing_newline);
        assert_eq!(first.line, 3);
        assert_eq!(
            diff.hunks[1].lines,
            [
                HunkLine::Context("ctx".into()),
                HunkLine::Context(String::new()),
                HunkLine::Remove("gone".into())
            ],
            "a blank line within the counts is an empty context line"
        );
        // Counts not yet reached: a `--- ` line is a removed line starting with "-- ".
        let tricky = parse_unified_diff("@@ -1,2 +1 @@\n--- not a header\n+++ kept\n-x\n").unwrap();
        assert_eq!(
            tricky.hunks[0].lines,
            [
                HunkLine::Remove("-- not a header".into()),
                HunkLine::Add("++ kept".into()),
                HunkLine::Remove("x".into())
            ]
        );
    }

    #[test]
    fn parse_unified_diff_errors_name_the_line() {
        let cases = [
            ("", 1, "the diff has no hunks"),
            ("just words\n", 1, "the diff has no hunks"),
            ("--- a/x\n@@ -1 +1 @@\n", 2, "expected a `+++ <file>` line"),
            (
                "@@ -x +1 @@\n-a\n",
                1,
                "expected a hunk header like `@@ -12,3 +12,4 @@`",
            ),
            (
                "@@ -1,2 +1,2 @@\n a\nb\n",
                3,
                "`b` in hunk 1 is not a hunk line",
            ),
            (
                "@@ -1 +1 @@\n\\ No newline at end of file\n",
                2,
                "must follow a hunk line",
            ),
            (
                "@@ -1 +1 @@\n@@ -2 +2 @@\n-a\n+b\n",
                1,
                "hunk 1 has no lines",
            ),
            ("@@ -1 +1 @@\n-a\n+b\nstray\n", 4, "expected a hunk header"),
        ];
        for (input, line, want) in cases {
            let err = parse_unified_diff(input).unwrap_err();
            assert_eq!(err.line, line, "{input:?}: {err}");
            assert!(err.message.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn header_names_match_with_prefixes_and_partial_paths() {
        let rel = Path::new("src/lib.rs");
        for name in [
            "src/lib.rs",
            "a/src/lib.rs",
            "./src/lib.rs",
            "lib.rs",
            "/repo/src/lib.rs",
        ] {
            assert!(names_match(name, rel), "{name}");
        }
        for name in ["src/main.rs", "b/lib.rs.orig", "", "."] {
            assert!(!names_match(name, rel), "{name}");
        }
    }

    #[tokio::test]
    async fn the_tool_is_an_exclusive_fs_tool_that_rebinds() {
        let (_dir, ws) = workspace(&[]);
        let tool = DiffEdit::new(Arc::clone(&ws));
        assert_eq!(tool.meta().name, "diff_edit");
        assert_eq!(tool.meta().tags, ["fs"]);
        assert_eq!(tool.meta().concurrency, ConcurrencyClass::Exclusive);
        let schema = &tool.meta().input_schema;
        assert_eq!(schema["additionalProperties"], json!(false));
        let mut registry = crate::tools::ToolRegistry::default();
        registry
            .register(Arc::new(DiffEdit::new(Arc::clone(&ws))))
            .expect("the schema compiles");
        assert_eq!(schema["required"], json!(["path", "diff"]));
        let (other_dir, other) = workspace(&[("x.txt", "a\n")]);
        let rebound = tool.rebind_cwd(&other).unwrap();
        let result = rebound
            .call(
                &ToolContext::detached("."),
                &json!({"path": "x.txt", "diff": "@@ -1 +1 @@\n-a\n+b\n"}),
            )
            .await
            .unwrap();
        assert!(result.success);
        assert_eq!(read(&other_dir, "x.txt").unwrap(), "b\n");
        let (kind, _) = message(
            tool.call(&ToolContext::detached("."), &json!({"path": "x.txt"}))
                .await
                .unwrap_err(),
        );
        assert_eq!(kind, "invalid_input");
    }
}
