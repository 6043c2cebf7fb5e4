//! The `text/event-stream` parser: bytes in, complete server-sent events out.

/// One SSE event may not grow beyond this (protects memory against a runaway stream).
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty for the default `message`.
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// An incremental parser for `text/event-stream`. Lines end in `\n` or `\r\n` (a lone `\r`, which
/// no chat completions server sends, is not treated as a line end).
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line not yet ended.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no `\n`, so a long line arriving in many small
    /// chunks is scanned once rather than from its start on every chunk.
    scanned: usize,
    event: String,
    data: String,
    has_data: bool,
}

/// Why a stream is not a server-sent event stream the parser takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line is not UTF-8.
    #[error("a line is not UTF-8")]
    NotUtf8,
    /// One event grew past the cap.
    #[error("an event exceeds {MAX_EVENT_BYTES} bytes")]
    EventTooLarge,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        // Taken out so `line` can borrow `self` mutably; moving a Vec copies no bytes.
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        // Taken as well, so a parser that refused a line is left empty and consistent.
        let mut from = std::mem::take(&mut self.scanned);
        while let Some(offset) = pending[from..].iter().position(|&byte| byte == b'\n') {
            let end = from + offset;
            let raw = pending[start..end]
                .strip_suffix(b"\r")
                .unwrap_or(&pending[start..end]);
            let line = std::str::from_utf8(raw).map_err(|_| SseError::NotUtf8)?;
            self.line(line, &mut events);
            start = end + 1;
            from = start;
        }
        // What stays is the unended line, all of it from this chunk once a line ended here.
        pending.drain(..start);
        self.scanned = pending.len();
        self.pending = pending;
        if self.pending.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(SseError::EventTooLarge);
        }
        Ok(events)
    }

    /// Applies one complete line: a field, a comment, or the blank line that ends an event.
    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                events.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event.clear();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> SseEvent {
        SseEvent {
            event: String::new(),
            data: data.to_string(),
        }
    }

    #[test]
    fn sse_parser_splits_events_across_arbitrary_chunk_boundaries() {
        let stream = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: ping\ndata: x\n\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        for size in 1..stream.len() {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            for piece in stream.chunks(size) {
                events.extend(parser.push(piece).unwrap());
            }
            assert_eq!(
                events,
                vec![
                    event("{\"a\":1}"),
                    SseEvent {
                        event: "ping".into(),
                        data: "x".into()
                    },
                    event("l1\nl2"),
                    event("[DONE]"),
                ],
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn sse_parser_keeps_multibyte_characters_split_between_chunks() {
        let stream = "data: {\"t\":\"héllo ✓\"}\n\n".as_bytes();
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for byte in stream {
            events.extend(parser.push(std::slice::from_ref(byte)).unwrap());
        }
        assert_eq!(events, vec![event("{\"t\":\"héllo ✓\"}")]);
    }

    #[test]
    fn sse_parser_refuses_invalid_utf8() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: \xff\xfe\n\n").is_err());
    }

    #[test]
    fn sse_parser_joins_one_long_line_fed_in_small_chunks() {
        let payload: String = (0..40_000).map(|i| ["a", "é", "✓", "\r"][i % 4]).collect();
        let stream = format!(": hi\r\ndata: {payload}\r\ndata: tail\r\n\r\ndata: [DONE]\n\n");
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for piece in stream.as_bytes().chunks(7) {
            events.extend(parser.push(piece).unwrap());
            assert!(parser.scanned <= parser.pending.len());
        }
        assert_eq!(
            events,
            vec![event(&format!("{payload}\ntail")), event("[DONE]")]
        );
        assert!(parser.pending.is_empty());
    }
}
