//! The text model `apply_patch` and `diff_edit` share: lines that keep their own endings, hunk
//! lines, the three matching strategies, and rendering that keeps CRLF and a missing final
//! newline.

/// Largest file either patch tool reads, edits or deletes.
pub(crate) const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

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

/// Why an edit cannot be made to a file's text; the words are for the model, which is told
/// the file was not changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The file is not UTF-8 text.
    #[error("the file is not UTF-8 text")]
    NotText,
    /// A hunk (its number, from 1) is not in the file where it may go: what was sought and
    /// what the file holds nearest.
    #[error("{explanation}")]
    NoMatch {
        /// The hunk.
        hunk: usize,
        /// Where it was sought and what is there.
        explanation: String,
    },
    /// Two edits claim the same lines: a fault of the engine, never of the model's input.
    #[error("internal error: overlapping edits at line {0}")]
    Overlap(usize),
}

/// Shortens a line quoted in a message.
pub(crate) fn clip(line: &str) -> String {
    const MAX: usize = 160;
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

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
    ) -> Result<Vec<u8>, EditError> {
        replacements.sort_by_key(|r| r.start);
        // (text, ending, index of the original line it is)
        let mut out: Vec<(&str, &str, Option<usize>)> = Vec::with_capacity(self.lines.len());
        let original = |i: usize| (self.lines[i].0.as_str(), self.lines[i].1, Some(i));
        let mut next = 0;
        for r in &replacements {
            if r.start < next || r.start + r.old_len > self.lines.len() {
                return Err(EditError::Overlap(r.start + 1));
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
