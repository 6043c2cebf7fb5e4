//! The read side of task output: `read_task_output`'s five modes over a task log, each costing
//! about what its answer costs rather than what the whole log costs.
//!
//! Lines end at `\n`; a final line without one still counts, and a trailing `\n` does not start
//! an empty last line. `\r` is kept as part of the raw text. Every answer's `text` is capped at
//! [`MAX_TEXT_BYTES`] and never ends inside a UTF-8 character (unless the character alone is
//! cut); invalid UTF-8 in the log reads as U+FFFD.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use memchr::memmem;
use serde::Serialize;

pub use super::query::{
    DEFAULT_LIMIT_BYTES, DEFAULT_LINES, DEFAULT_MAX_MATCHES, MAX_LIMIT_BYTES, MAX_LINES,
    MAX_MATCHES, MAX_RANGE_LINES, OutputParams, OutputQuery, QueryError,
};

/// Most bytes of `text` any answer carries, so a few enormous lines cannot blow up an answer.
pub const MAX_TEXT_BYTES: usize = 1_048_576;
/// How much of a line grep looks at (and returns); the rest of a longer line is skipped.
pub const GREP_LINE_LIMIT: usize = 64 * 1024;
/// Unit of every read from the log; tail reads these backwards from the end.
pub const BLOCK_SIZE: usize = 16 * 1024;

/// One answer of `read_task_output` (without the task's id and state, which the caller adds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputSlice {
    /// The raw output selected, without line numbers.
    pub text: String,
    /// Length of the log when the read began.
    pub total_bytes: u64,
    /// Byte offset just after `text` in the log, for paging with mode bytes (head, line_range,
    /// bytes); `None` when `text` reaches the end, and always for tail and grep.
    pub next_offset: Option<u64>,
    /// Whether something was left out: more lines after (head, bytes) or before (tail), more
    /// matches (grep), or a range cut by the line or byte cap (line_range).
    pub truncated: bool,
}

impl OutputSlice {
    fn empty(total_bytes: u64) -> Self {
        Self {
            text: String::new(),
            total_bytes,
            next_offset: None,
            truncated: false,
        }
    }
}

/// Why reading a task log failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The log file does not exist.
    #[error("task output not found")]
    NotFound,
    /// The query is invalid (only possible for a query not built by `OutputParams::to_query`).
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The log could not be read.
    #[error("reading task output failed: {0}")]
    Io(io::Error),
}

impl OutputError {
    /// A snake_case word for error answers: `not_found`, `invalid_input` or `io_error`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Query(_) => "invalid_input",
            Self::Io(_) => "io_error",
        }
    }
}

impl From<io::Error> for OutputError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

/// Answers `query` from the log at `path`. Blocking: call it inside `spawn_blocking`.
pub fn read_output(path: &Path, query: &OutputQuery) -> Result<OutputSlice, OutputError> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(OutputError::NotFound),
        Err(err) => return Err(OutputError::Io(err)),
    };
    let total_bytes = file.metadata()?.len();
    read_slice(&mut file, total_bytes, query)
}

/// Answers `query` from the first `total_bytes` bytes of `reader` (bytes written later, by a
/// task still running, are not looked at, so one answer is consistent).
pub fn read_slice<R: Read + Seek>(
    reader: &mut R,
    total_bytes: u64,
    query: &OutputQuery,
) -> Result<OutputSlice, OutputError> {
    let slice = match query.normalized()? {
        OutputQuery::Head { lines } => {
            let taken = forward_lines(reader, total_bytes, 0, lines)?;
            let truncated = taken.end < total_bytes;
            taken.into_slice(total_bytes, truncated)
        }
        OutputQuery::LineRange { start, end } => {
            let wanted = end - start + 1;
            let take = wanted.min(MAX_RANGE_LINES);
            let taken = forward_lines(reader, total_bytes, start - 1, take)?;
            let cut = taken.hit_byte_cap || take < wanted;
            let truncated = cut && taken.end < total_bytes;
            taken.into_slice(total_bytes, truncated)
        }
        OutputQuery::Tail { lines } => tail(reader, total_bytes, lines)?,
        OutputQuery::Grep {
            pattern,
            max_matches,
        } => grep(reader, total_bytes, &pattern, max_matches)?,
        OutputQuery::Bytes { offset, limit } => bytes(reader, total_bytes, offset, limit)?,
    };
    Ok(slice)
}

/// Reads until `buf` is full or the reader is exhausted.
fn fill<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// Length of the longest prefix of `buf` that does not end inside a UTF-8 character; all of
/// `buf` when cutting would leave nothing, so a reader paging with tiny limits still advances.
fn complete_prefix_len(buf: &[u8]) -> usize {
    let len = buf.len();
    for back in 1..=len.min(4) {
        let byte = buf[len - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back && back < len {
            len - back
        } else {
            len
        };
    }
    len
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// Lines taken by a forward scan: where they start and end in the log, and their bytes.
struct Taken {
    start: u64,
    end: u64,
    bytes: Vec<u8>,
    hit_byte_cap: bool,
}

impl Taken {
    fn into_slice(self, total_bytes: u64, truncated: bool) -> OutputSlice {
        debug_assert_eq!(self.end, self.start + self.bytes.len() as u64);
        OutputSlice {
            text: String::from_utf8_lossy(&self.bytes).into_owned(),
            total_bytes,
            next_offset: (self.end < total_bytes).then_some(self.end),
            truncated,
        }
    }
}

/// Skips `skip` lines from the start of the log, then takes up to `take` lines (at most
/// [`MAX_TEXT_BYTES`] of them); reads stop as soon as that is done.
fn forward_lines<R: Read + Seek>(
    reader: &mut R,
    total: u64,
    skip: usize,
    take: usize,
) -> io::Result<Taken> {
    reader.seek(SeekFrom::Start(0))?;
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut pos = 0u64;
    let mut skipped = 0usize;
    let mut start = (skip == 0).then_some(0u64);
    let mut out = Vec::new();
    let mut taken = 0usize;
    let mut hit_byte_cap = false;

    'blocks: while pos < total && taken < take {
        let want = (total - pos).min(BLOCK_SIZE as u64) as usize;
        let n = fill(reader, &mut block[..want])?;
        if n == 0 {
            break;
        }
        let chunk = &block[..n];
        let mut i = 0;
        while i < n {
            if start.is_none() {
                match memchr::memchr(b'\n', &chunk[i..]) {
                    Some(k) => {
                        i += k + 1;
                        skipped += 1;
                        if skipped == skip {
                            start = Some(pos + i as u64);
                        }
                    }
                    None => i = n,
                }
                continue;
            }
            let rest = &chunk[i..];
            let room = MAX_TEXT_BYTES - out.len();
            let limit = rest.len().min(room);
            match memchr::memchr(b'\n', &rest[..limit]) {
                Some(k) => {
                    out.extend_from_slice(&rest[..=k]);
                    i += k + 1;
                    taken += 1;
                    if taken == take {
                        break 'blocks;
                    }
                }
                None => {
                    out.extend_from_slice(&rest[..limit]);
                    i += limit;
                    if out.len() == MAX_TEXT_BYTES {
                        hit_byte_cap = true;
                        break 'blocks;
                    }
                }
            }
        }
        pos += n as u64;
    }

    let Some(start) = start else {
        return Ok(Taken {
            start: total,
            end: total,
            bytes: Vec::new(),
            hit_byte_cap: false,
        });
    };
    let keep = complete_prefix_len(&out);
    out.truncate(keep);
    Ok(Taken {
        start,
        end: start + out.len() as u64,
        bytes: out,
        hit_byte_cap,
    })
}

/// The last `lines` lines, found by reading blocks backwards from the end of the log.
fn tail<R: Read + Seek>(reader: &mut R, total: u64, lines: usize) -> io::Result<OutputSlice> {
    let mut blocks: VecDeque<Vec<u8>> = VecDeque::new();
    let mut pos = total;
    let mut newlines = 0usize;
    let mut found = None;
    while pos > 0 {
        let block_start = pos.saturating_sub(BLOCK_SIZE as u64);
        let mut block = vec![0u8; (pos - block_start) as usize];
        reader.seek(SeekFrom::Start(block_start))?;
        if fill(reader, &mut block)? < block.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "task output shrank while being read",
            ));
        }
        // A final newline ends the last line; it does not start an empty one after it.
        let scan = if pos == total && block.last() == Some(&b'\n') {
            &block[..block.len() - 1]
        } else {
            &block[..]
        };
        for at in memchr::memrchr_iter(b'\n', scan) {
            newlines += 1;
            if newlines == lines {
                found = Some(block_start + at as u64 + 1);
                break;
            }
        }
        blocks.push_front(block);
        pos = block_start;
        if found.is_some() || total - pos >= MAX_TEXT_BYTES as u64 {
            break;
        }
    }

    // Not found and not at the start means the byte cap stopped the scan mid-line.
    let (mut start, mut capped) = match found {
        Some(start) => (start, false),
        None => (pos, pos > 0),
    };
    if total - start > MAX_TEXT_BYTES as u64 {
        start = total - MAX_TEXT_BYTES as u64;
        capped = true;
    }
    let truncated = start > 0;
    let mut text = Vec::with_capacity((total - start) as usize);
    let mut block_pos = pos;
    for block in &blocks {
        let block_end = block_pos + block.len() as u64;
        if block_end > start {
            let from = start.saturating_sub(block_pos) as usize;
            text.extend_from_slice(&block[from..]);
        }
        block_pos = block_end;
    }
    if capped {
        let skip = text
            .iter()
            .take(3)
            .take_while(|b| is_continuation(**b))
            .count();
        text.drain(..skip);
    }
    Ok(OutputSlice {
        text: String::from_utf8_lossy(&text).into_owned(),
        total_bytes: total,
        next_offset: None,
        truncated,
    })
}

/// Collects lines containing `pattern` while streaming the log with one bounded line buffer.
struct Grep<'p> {
    finder: memmem::Finder<'p>,
    max_matches: usize,
    matches: usize,
    out: Vec<u8>,
    truncated: bool,
}

impl Grep<'_> {
    /// Looks at one line (its first [`GREP_LINE_LIMIT`] bytes, without `\n`); false to stop.
    fn line(&mut self, line: &[u8], cut: bool, newline: bool) -> bool {
        let content = match line {
            [rest @ .., b'\r'] if newline && !cut => rest,
            _ => line,
        };
        if self.finder.find(content).is_none() {
            return true;
        }
        if self.matches == self.max_matches {
            self.truncated = true;
            return false;
        }
        let shown = if cut {
            &line[..complete_prefix_len(line)]
        } else {
            line
        };
        let added = shown.len() + usize::from(newline || cut);
        if self.out.len() + added > MAX_TEXT_BYTES {
            self.truncated = true;
            return false;
        }
        self.out.extend_from_slice(shown);
        if newline || cut {
            self.out.push(b'\n');
        }
        self.matches += 1;
        true
    }
}

/// Lines containing `pattern`, stopping once one more match than asked for is seen.
fn grep<R: Read + Seek>(
    reader: &mut R,
    total: u64,
    pattern: &str,
    max_matches: usize,
) -> io::Result<OutputSlice> {
    let mut grep = Grep {
        finder: memmem::Finder::new(pattern.as_bytes()),
        max_matches,
        matches: 0,
        out: Vec::new(),
        truncated: false,
    };
    reader.seek(SeekFrom::Start(0))?;
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    let mut pos = 0u64;
    let mut stopped = false;
    'blocks: while pos < total {
        let want = (total - pos).min(BLOCK_SIZE as u64) as usize;
        let n = fill(reader, &mut block[..want])?;
        if n == 0 {
            break;
        }
        let mut chunk = &block[..n];
        loop {
            let newline = memchr::memchr(b'\n', chunk);
            let segment = &chunk[..newline.unwrap_or(chunk.len())];
            let room = GREP_LINE_LIMIT - line.len();
            if segment.len() > room {
                cut = true;
            }
            line.extend_from_slice(&segment[..segment.len().min(room)]);
            let Some(k) = newline else { break };
            if !grep.line(&line, cut, true) {
                stopped = true;
                break 'blocks;
            }
            line.clear();
            cut = false;
            chunk = &chunk[k + 1..];
        }
        pos += n as u64;
    }
    if !stopped && (!line.is_empty() || cut) {
        grep.line(&line, cut, false);
    }
    Ok(OutputSlice {
        text: String::from_utf8_lossy(&grep.out).into_owned(),
        total_bytes: total,
        next_offset: None,
        truncated: grep.truncated,
    })
}

/// Up to `limit` bytes from `offset`, ending on a character boundary.
fn bytes<R: Read + Seek>(
    reader: &mut R,
    total: u64,
    offset: u64,
    limit: usize,
) -> io::Result<OutputSlice> {
    if offset >= total {
        return Ok(OutputSlice::empty(total));
    }
    let want = (total - offset).min(limit as u64) as usize;
    let mut buf = vec![0u8; want];
    reader.seek(SeekFrom::Start(offset))?;
    let got = fill(reader, &mut buf)?;
    buf.truncate(got);
    buf.truncate(complete_prefix_len(&buf));
    let end = offset + buf.len() as u64;
    let next_offset = (end < total).then_some(end);
    Ok(OutputSlice {
        text: String::from_utf8_lossy(&buf).into_owned(),
        total_bytes: total,
        next_offset,
        truncated: next_offset.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::query::fixtures::*;
    use serde_json::json;
    use std::io::Write;

    fn log(content: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.log");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    fn read(content: &[u8], query: OutputQuery) -> OutputSlice {
        let (_dir, path) = log(content);
        read_output(&path, &query).unwrap()
    }

    fn slice(text: &str, total: u64, next: Option<u64>, truncated: bool) -> OutputSlice {
        OutputSlice {
            text: text.into(),
            total_bytes: total,
            next_offset: next,
            truncated,
        }
    }

    /// Counts the bytes pulled through it, to show how much of a log a query touches.
    struct Counting<R> {
        inner: R,
        read: u64,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    const ABC: &[u8] = b"alpha\nbeta\ngamma\n";

    #[test]
    fn head_returns_the_first_lines_and_where_to_continue() {
        assert_eq!(read(ABC, head(1)), slice("alpha\n", 17, Some(6), true));
        assert_eq!(
            read(ABC, head(2)),
            slice("alpha\nbeta\n", 17, Some(11), true)
        );
        assert_eq!(
            read(ABC, head(3)),
            slice("alpha\nbeta\ngamma\n", 17, None, false)
        );
        assert_eq!(
            read(ABC, head(50)),
            slice("alpha\nbeta\ngamma\n", 17, None, false)
        );
    }

    #[test]
    fn tail_returns_the_last_lines() {
        assert_eq!(read(ABC, tail_q(1)), slice("gamma\n", 17, None, true));
        assert_eq!(read(ABC, tail_q(2)), slice("beta\ngamma\n", 17, None, true));
        assert_eq!(
            read(ABC, tail_q(3)),
            slice("alpha\nbeta\ngamma\n", 17, None, false)
        );
        assert_eq!(
            read(ABC, tail_q(9)),
            slice("alpha\nbeta\ngamma\n", 17, None, false)
        );
    }

    #[test]
    fn a_missing_final_newline_still_ends_a_line() {
        let text = b"alpha\nbeta\ngamma";
        assert_eq!(read(text, tail_q(1)), slice("gamma", 16, None, true));
        assert_eq!(read(text, tail_q(2)), slice("beta\ngamma", 16, None, true));
        assert_eq!(
            read(text, head(3)),
            slice("alpha\nbeta\ngamma", 16, None, false)
        );
        assert_eq!(
            read(text, head(2)),
            slice("alpha\nbeta\n", 16, Some(11), true)
        );
        assert_eq!(read(text, range(3, 3)), slice("gamma", 16, None, false));
        assert_eq!(
            read(text, grep_q("gam", 5)),
            slice("gamma", 16, None, false)
        );
    }

    #[test]
    fn blank_lines_count_as_lines() {
        assert_eq!(read(b"\n\n\n", tail_q(1)), slice("\n", 3, None, true));
        assert_eq!(read(b"\n\n\n", tail_q(3)), slice("\n\n\n", 3, None, false));
        assert_eq!(read(b"\n", tail_q(1)), slice("\n", 1, None, false));
        assert_eq!(
            read(b"a\n\nb\n", range(2, 2)),
            slice("\n", 5, Some(3), false)
        );
        assert_eq!(read(b"a\n\nb\n", head(2)), slice("a\n\n", 5, Some(3), true));
    }

    #[test]
    fn crlf_lines_keep_their_carriage_returns() {
        let text = b"one\r\ntwo\r\nthree\r\n";
        assert_eq!(read(text, head(1)), slice("one\r\n", 17, Some(5), true));
        assert_eq!(read(text, tail_q(1)), slice("three\r\n", 17, None, true));
        assert_eq!(
            read(text, range(2, 2)),
            slice("two\r\n", 17, Some(10), false)
        );
        assert_eq!(
            read(text, grep_q("tw", 5)),
            slice("two\r\n", 17, None, false)
        );
        // The line terminator is not part of what grep matches against.
        assert_eq!(read(text, grep_q("o\r", 5)).text, "");
    }

    #[test]
    fn an_empty_log_answers_empty_text_in_every_mode() {
        for query in [
            head(5),
            tail_q(5),
            grep_q("x", 5),
            range(1, 10),
            bytes_q(0, 100),
        ] {
            assert_eq!(
                read(b"", query.clone()),
                slice("", 0, None, false),
                "{query:?}"
            );
        }
    }

    #[test]
    fn tail_finds_lines_longer_than_a_block() {
        let long = "x".repeat(3 * BLOCK_SIZE + 17);
        let text = format!("first\n{long}\nshort\n");
        let total = text.len() as u64;
        assert_eq!(
            read(text.as_bytes(), tail_q(1)),
            slice("short\n", total, None, true)
        );
        let two = format!("{long}\nshort\n");
        assert_eq!(
            read(text.as_bytes(), tail_q(2)),
            slice(&two, total, None, true)
        );
        assert_eq!(
            read(text.as_bytes(), tail_q(3)),
            slice(&text, total, None, false)
        );
        // The long line is also the last one, without a final newline.
        let text = format!("first\n{long}");
        let total = text.len() as u64;
        assert_eq!(
            read(text.as_bytes(), tail_q(1)),
            slice(&long, total, None, true)
        );
    }

    /// Lines of awkward lengths around the block size, so newlines land on block edges.
    fn awkward_log() -> Vec<u8> {
        let lengths = [
            0,
            1,
            BLOCK_SIZE - 1,
            BLOCK_SIZE,
            BLOCK_SIZE + 1,
            5,
            2 * BLOCK_SIZE - 7,
            0,
            0,
            BLOCK_SIZE - 2,
            3,
        ];
        let mut out = Vec::new();
        for (i, len) in lengths.iter().enumerate() {
            out.extend(std::iter::repeat_n(b'a' + i as u8, *len));
            out.push(b'\n');
        }
        out
    }

    fn naive_lines(content: &[u8]) -> Vec<&[u8]> {
        content.split_inclusive(|b| *b == b'\n').collect()
    }

    #[test]
    fn line_modes_agree_with_a_naive_split_across_block_edges() {
        let mut unterminated = awkward_log();
        unterminated.pop();
        for content in [awkward_log(), unterminated] {
            let (_dir, path) = log(&content);
            let lines = naive_lines(&content);
            let total = content.len() as u64;
            for n in 1..=lines.len() + 1 {
                let want_tail = lines[lines.len().saturating_sub(n)..].concat();
                let got = read_output(&path, &tail_q(n)).unwrap();
                assert_eq!(got.text.as_bytes(), &want_tail[..], "tail {n}");
                assert_eq!(got.truncated, n < lines.len(), "tail {n}");

                let want_head = lines[..n.min(lines.len())].concat();
                let got = read_output(&path, &head(n)).unwrap();
                assert_eq!(got.text.as_bytes(), &want_head[..], "head {n}");
                let end = want_head.len() as u64;
                assert_eq!(got.next_offset, (end < total).then_some(end), "head {n}");

                for start in 1..=n {
                    let want: Vec<u8> = lines
                        .iter()
                        .skip(start - 1)
                        .take(n - start + 1)
                        .flat_map(|l| l.iter().copied())
                        .collect();
                    let got = read_output(&path, &range(start, n)).unwrap();
                    assert_eq!(got.text.as_bytes(), &want[..], "range {start}..{n}");
                    assert!(!got.truncated);
                }
            }
        }
    }

    #[test]
    fn grep_returns_matching_lines_as_a_plain_substring() {
        let text = b"ok 1\nerror: a.c failed\nok 2\nabc\nerror: b\n";
        let total = text.len() as u64;
        assert_eq!(
            read(text, grep_q("error", 20)),
            slice("error: a.c failed\nerror: b\n", total, None, false)
        );
        // `.` is a literal dot, not a regex wildcard.
        assert_eq!(read(text, grep_q("a.c", 20)).text, "error: a.c failed\n");
        assert_eq!(
            read(text, grep_q("missing", 20)),
            slice("", total, None, false)
        );
        // Case-sensitive.
        assert_eq!(read(text, grep_q("ERROR", 20)).text, "");
    }

    #[test]
    fn grep_stops_at_max_matches_and_says_more_exist() {
        let text: String = (0..50).map(|i| format!("hit {i}\nmiss\n")).collect();
        let got = read(text.as_bytes(), grep_q("hit", 3));
        assert_eq!(got.text, "hit 0\nhit 1\nhit 2\n");
        assert!(got.truncated);
        let got = read(text.as_bytes(), grep_q("hit 49", 1));
        assert_eq!(got.text, "hit 49\n");
        assert!(!got.truncated);
        // Exactly max_matches matches: nothing was left out.
        let got = read(b"hit\nhit\nmiss\n", grep_q("hit", 2));
        assert_eq!(got.text, "hit\nhit\n");
        assert!(!got.truncated);
    }

    #[test]
    fn grep_looks_only_at_the_start_of_a_huge_line() {
        let mut text = "é".repeat(GREP_LINE_LIMIT / 2 - 1).into_bytes();
        text.extend_from_slice(b"xNEEDLE-LATE tail\nNEEDLE-EARLY\n");
        assert_eq!(text[GREP_LINE_LIMIT - 2], b'x');
        let got = read(&text, grep_q("NEEDLE", 10));
        assert_eq!(got.text, "NEEDLE-EARLY\n");
        let got = read(&text, grep_q("éé", 10));
        // The long line is returned up to the limit, cut on a character boundary.
        let mut want = "é".repeat(GREP_LINE_LIMIT / 2 - 1);
        want.push_str("xN\n");
        assert_eq!(got.text, want);
        // A huge last line without a newline is still looked at.
        let mut text = b"x".repeat(3 * GREP_LINE_LIMIT);
        text.splice(0..0, b"tail-hit ".iter().copied());
        let got = read(&text, grep_q("tail-hit", 10));
        assert_eq!(got.text.len(), GREP_LINE_LIMIT + 1);
        assert!(got.text.starts_with("tail-hit xxx"));
    }

    #[test]
    fn line_range_returns_inclusive_lines() {
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let total = text.len() as u64;
        let got = read(text.as_bytes(), range(3, 4));
        assert_eq!(got.text, "line 3\nline 4\n");
        assert_eq!(got.next_offset, Some(28));
        assert!(!got.truncated);
        assert_eq!(&text[28..35], "line 5\n");
        assert_eq!(
            read(text.as_bytes(), range(9, 400)),
            slice("line 9\nline 10\n", total, None, false)
        );
        assert_eq!(
            read(text.as_bytes(), range(11, 20)),
            slice("", total, None, false)
        );
        assert_eq!(
            read(text.as_bytes(), range(99, 99)),
            slice("", total, None, false)
        );
    }

    #[test]
    fn line_range_is_capped_at_500_lines_and_says_so() {
        let text: String = (1..=700).map(|i| format!("{i}\n")).collect();
        let got = read(text.as_bytes(), range(2, 700));
        let want: String = (2..=501).map(|i| format!("{i}\n")).collect();
        assert_eq!(got.text, want);
        assert!(got.truncated);
        assert_eq!(got.next_offset, Some(want.len() as u64 + 2));
        // Asking for exactly 500 lines is not a cut.
        let got = read(text.as_bytes(), range(2, 501));
        assert_eq!(got.text, want);
        assert!(!got.truncated);
        // A capped range that runs to the end of the log left nothing out.
        let got = read(text.as_bytes(), range(201, 900));
        assert_eq!(got.text.lines().count(), 500);
        assert!(!got.truncated);
        assert_eq!(got.next_offset, None);
    }

    #[test]
    fn bytes_pages_through_the_log() {
        let text = b"0123456789";
        assert_eq!(read(text, bytes_q(0, 4)), slice("0123", 10, Some(4), true));
        assert_eq!(read(text, bytes_q(4, 4)), slice("4567", 10, Some(8), true));
        assert_eq!(read(text, bytes_q(8, 4)), slice("89", 10, None, false));
        assert_eq!(read(text, bytes_q(10, 4)), slice("", 10, None, false));
        assert_eq!(read(text, bytes_q(1000, 4)), slice("", 10, None, false));
    }

    #[test]
    fn bytes_never_split_a_character() {
        // "aé€😀" = 61 | c3 a9 | e2 82 ac | f0 9f 98 80
        let text = "aé€😀".as_bytes();
        assert_eq!(read(text, bytes_q(0, 2)), slice("a", 10, Some(1), true));
        assert_eq!(read(text, bytes_q(1, 2)), slice("é", 10, Some(3), true));
        assert_eq!(read(text, bytes_q(1, 4)), slice("é", 10, Some(3), true));
        assert_eq!(read(text, bytes_q(3, 6)), slice("€", 10, Some(6), true));
        assert_eq!(read(text, bytes_q(3, 7)), slice("€😀", 10, None, false));
        assert_eq!(read(text, bytes_q(6, 3)).next_offset, Some(9));
        // A limit smaller than one character still makes progress, as replacement characters.
        assert_eq!(
            read(text, bytes_q(1, 1)),
            slice("\u{fffd}", 10, Some(2), true)
        );
        // Paging with next_offset reassembles the text exactly (given room for any character).
        let mut offset = 0;
        let mut whole = String::new();
        loop {
            let got = read(text, bytes_q(offset, 4));
            whole.push_str(&got.text);
            match got.next_offset {
                Some(next) => offset = next,
                None => break,
            }
        }
        assert_eq!(whole, "aé€😀");
    }

    #[test]
    fn invalid_utf8_reads_as_replacement_characters() {
        let text = b"ok\n\xff\xfe bad\nend\n";
        assert_eq!(read(text, range(2, 2)).text, "\u{fffd}\u{fffd} bad\n");
        assert_eq!(read(text, grep_q("bad", 5)).text, "\u{fffd}\u{fffd} bad\n");
        assert_eq!(read(text, tail_q(2)).text, "\u{fffd}\u{fffd} bad\nend\n");
        // A lead byte at the end may be a character still being written: it is held back once,
        // then shown when asked for on its own, so paging never stalls.
        assert_eq!(
            read(b"ab\xe2", bytes_q(0, 10)),
            slice("ab", 3, Some(2), true)
        );
        assert_eq!(
            read(b"ab\xe2", bytes_q(2, 10)),
            slice("\u{fffd}", 3, None, false)
        );
    }

    #[test]
    fn queries_built_by_hand_are_clamped_and_checked_when_read() {
        let text: String = (1..=600).map(|i| format!("{i}\n")).collect();
        let got = read(text.as_bytes(), head(10_000));
        assert_eq!(got.text.lines().count(), 500);
        assert!(got.truncated);
        let (_dir, path) = log(b"x\n");
        let err = read_output(&path, &tail_q(0)).unwrap_err();
        assert!(matches!(err, OutputError::Query(QueryError::Zero("lines"))));
        assert_eq!(err.kind(), "invalid_input");
        let err = read_output(&path, &range(3, 2)).unwrap_err();
        assert_eq!(err.kind(), "invalid_input");
    }

    #[test]
    fn a_missing_log_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_output(&dir.path().join("nope.log"), &head(5)).unwrap_err();
        assert!(matches!(err, OutputError::NotFound));
        assert_eq!(err.kind(), "not_found");
    }

    #[test]
    fn a_slice_serialises_with_a_null_next_offset() {
        let value = serde_json::to_value(slice("x", 1, None, false)).unwrap();
        assert_eq!(
            value,
            json!({"text": "x", "total_bytes": 1, "next_offset": null, "truncated": false})
        );
    }

    #[test]
    fn reading_stops_at_the_length_given_for_a_growing_log() {
        let mut cursor = io::Cursor::new(b"one\ntwo\nthree\n".to_vec());
        let got = read_slice(&mut cursor, 8, &tail_q(5)).unwrap();
        assert_eq!(got, slice("one\ntwo\n", 8, None, false));
        let got = read_slice(&mut cursor, 6, &head(5)).unwrap();
        assert_eq!(got, slice("one\ntw", 6, None, false));
        let got = read_slice(&mut cursor, 8, &grep_q("three", 5)).unwrap();
        assert_eq!(got.text, "");
        let got = read_slice(&mut cursor, 8, &bytes_q(4, 100)).unwrap();
        assert_eq!(got, slice("two\n", 8, None, false));
    }

    #[test]
    fn head_and_tail_of_one_enormous_line_stop_at_the_text_cap() {
        let mut text = "é".repeat(MAX_TEXT_BYTES).into_bytes();
        text.push(b'\n');
        let total = text.len() as u64;
        let got = read(&text, head(1));
        assert_eq!(got.text.len(), MAX_TEXT_BYTES);
        assert_eq!(got.next_offset, Some(MAX_TEXT_BYTES as u64));
        assert!(got.truncated);
        let got = read(&text, tail_q(1));
        // The cap cuts inside "é", so the answer starts at the next whole character.
        assert_eq!(got.text.len(), MAX_TEXT_BYTES - 1);
        assert!(got.text.starts_with('é') && got.text.ends_with("é\n"));
        assert!(got.truncated);
        assert_eq!(got.total_bytes, total);
        let got = read(&text, range(1, 1));
        assert!(got.truncated);
        assert_eq!(got.next_offset, Some(MAX_TEXT_BYTES as u64));
    }

    /// A 200 MiB log that is all hole except a few real lines at the end.
    fn sparse_log(dir: &Path) -> (std::path::PathBuf, u64) {
        let path = dir.join("sparse.log");
        let mut file = File::create(&path).unwrap();
        let size: u64 = 200 * 1024 * 1024;
        file.set_len(size).unwrap();
        let tail_lines = b"\nline one\nline two\nline three\n";
        file.seek(SeekFrom::Start(size - tail_lines.len() as u64))
            .unwrap();
        file.write_all(tail_lines).unwrap();
        assert_eq!(file.metadata().unwrap().len(), size);
        (path, size)
    }

    fn counted(path: &Path, query: &OutputQuery) -> (OutputSlice, u64) {
        let file = File::open(path).unwrap();
        let total = file.metadata().unwrap().len();
        let mut reader = Counting {
            inner: file,
            read: 0,
        };
        let got = read_slice(&mut reader, total, query).unwrap();
        (got, reader.read)
    }

    #[test]
    fn reads_of_a_huge_log_touch_only_what_they_return() {
        let dir = tempfile::tempdir().unwrap();
        let (path, size) = sparse_log(dir.path());

        let (got, read) = counted(&path, &tail_q(3));
        assert_eq!(
            got,
            slice("line one\nline two\nline three\n", size, None, true)
        );
        assert!(read <= BLOCK_SIZE as u64, "tail read {read} bytes");

        // The fourth line is the hole itself: 200 MiB of zeros, cut at the text cap.
        let (got, read) = counted(&path, &tail_q(5));
        assert!(got.text.starts_with('\0') && got.text.ends_with("line three\n"));
        assert!(got.truncated);
        assert!(
            read <= (MAX_TEXT_BYTES + BLOCK_SIZE) as u64,
            "tail read {read} bytes"
        );

        let (got, read) = counted(&path, &bytes_q(size / 2, 65_536));
        assert_eq!(got.text.len(), 65_536);
        assert_eq!(got.next_offset, Some(size / 2 + 65_536));
        assert_eq!(read, 65_536);

        // The hole has no newline: head gives up at the text cap, not at the end of the file.
        let (got, read) = counted(&path, &head(50));
        assert_eq!(got.text.len(), MAX_TEXT_BYTES);
        assert!(got.truncated);
        assert!(
            read <= (MAX_TEXT_BYTES + BLOCK_SIZE) as u64,
            "head read {read} bytes"
        );
    }

    #[test]
    fn head_of_a_log_with_many_lines_reads_one_block() {
        let text: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        let (_dir, path) = log(text.as_bytes());
        let (got, read) = counted(&path, &head(50));
        assert_eq!(got.text.lines().count(), 50);
        assert!(read <= BLOCK_SIZE as u64, "head read {read} bytes");
        let (got, read) = counted(&path, &range(10, 12));
        assert_eq!(got.text, "line 9\nline 10\nline 11\n");
        assert!(read <= BLOCK_SIZE as u64, "line_range read {read} bytes");
        let (got, read) = counted(&path, &grep_q("line 1", 3));
        assert_eq!(got.text, "line 1\nline 10\nline 11\n");
        assert!(got.truncated);
        assert!(read <= BLOCK_SIZE as u64, "grep read {read} bytes");
    }
}
