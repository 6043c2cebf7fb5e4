//! The Codex patch grammar: `*** Begin Patch` … `*** End Patch` with Add, Delete and Update
//! (optionally Move to) operations, parsed into a [`Patch`] without touching any file.

use crate::builtin::text_edit::HunkLine;
use crate::builtin::text_edit::clip;

const BEGIN_PATCH: &str = "*** Begin Patch";
const END_PATCH: &str = "*** End Patch";
const ADD_FILE: &str = "*** Add File: ";
const DELETE_FILE: &str = "*** Delete File: ";
const UPDATE_FILE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
