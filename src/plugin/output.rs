//! What a plugin writes: stdout kept up to a cap as the result, stderr kept as a tail for the
//! failure message and streamed line by line to the session while the call runs.

use std::collections::VecDeque;
use std::time::Duration;

use crate::tools::ToolContext;

/// stdout kept as the result; what a plugin writes past this is read and dropped.
pub const STDOUT_CAP_BYTES: usize = 4 * 1024 * 1024;
/// The end of stderr kept for the failure message.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// A stderr "line" longer than this is streamed in pieces of this size.
const MAX_LINE_BYTES: usize = 64 * 1024;
/// stderr streamed to the session per call; past it only the kept tail remains.
const STREAM_CAP_BYTES: usize = 1024 * 1024;
/// How long one streamed line may wait for a slow listener before streaming stops.
const STREAM_SEND_WAIT: Duration = Duration::from_millis(100);

/// stdout up to a cap; the rest is counted, not kept.
pub(super) struct Capture {
    cap: usize,
    bytes: Vec<u8>,
    /// Every byte the plugin wrote, kept or not.
    pub(super) total: u64,
}

impl Capture {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            bytes: Vec::new(),
            total: 0,
        }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    pub(super) fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    /// The kept text; when cut, at a character boundary and with a line saying so.
    pub(super) fn render(&self) -> String {
        if !self.truncated() {
            return String::from_utf8_lossy(&self.bytes).into_owned();
        }
        let mut text = String::from_utf8_lossy(complete_prefix(&self.bytes)).into_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[stdout cut at {} bytes; the plugin wrote {} bytes]\n",
            self.cap, self.total
        ));
        text
    }
}

/// The last bytes of a stream.
#[derive(Default)]
pub(super) struct Tail {
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend(bytes);
        let excess = self.bytes.len().saturating_sub(STDERR_TAIL_BYTES);
        if excess > 0 {
            self.bytes.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// The kept text; when the start was dropped, from the next whole line on, after a line
    /// saying how much is missing.
    pub(super) fn render(&self) -> String {
        let bytes: Vec<u8> = self.bytes.iter().copied().collect();
        if self.dropped == 0 {
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        // Without a newline to cut at, at least skip the rest of a split character.
        let start = bytes.iter().position(|b| *b == b'\n').map_or_else(
            || {
                bytes
                    .iter()
                    .take(3)
                    .take_while(|b| **b & 0xC0 == 0x80)
                    .count()
            },
            |newline| newline + 1,
        );
        let omitted = self.dropped + start as u64;
        format!(
            "[… {omitted} earlier bytes omitted …]\n{}",
            String::from_utf8_lossy(&bytes[start..])
        )
    }
}

/// stderr: kept as a tail and streamed to the session one line at a time.
pub(super) struct StderrCapture<'a> {
    ctx: &'a ToolContext,
    /// The end of stderr, for the failure message.
    pub(super) tail: Tail,
    pending: Vec<u8>,
    streamed: usize,
    live: bool,
}

impl<'a> StderrCapture<'a> {
    pub(super) fn new(ctx: &'a ToolContext) -> Self {
        Self {
            ctx,
            tail: Tail::default(),
            pending: Vec::new(),
            streamed: 0,
            live: ctx.events.is_some(),
        }
    }

    /// Keeps bytes for the failure message without streaming them.
    pub(super) fn keep(&mut self, bytes: &[u8]) {
        self.tail.push(bytes);
    }

    /// Keeps bytes and streams every line they complete.
    pub(super) async fn push(&mut self, bytes: &[u8]) {
        self.tail.push(bytes);
        if !self.live {
            return;
        }
        self.pending.extend_from_slice(bytes);
        while let Some(newline) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=newline).collect();
            self.send(&line).await;
        }
        if self.pending.len() >= MAX_LINE_BYTES {
            let cut = complete_prefix(&self.pending).len().max(1);
            let piece: Vec<u8> = self.pending.drain(..cut).collect();
            self.send(&piece).await;
        }
    }

    /// Streams a last line that had no newline.
    pub(super) async fn finish(&mut self) {
        if self.live && !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.send(&rest).await;
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        if !self.live {
            return;
        }
        self.streamed += bytes.len();
        if self.streamed > STREAM_CAP_BYTES {
            self.live = false;
            return;
        }
        let text = String::from_utf8_lossy(bytes).into_owned();
        // A listener that cannot keep up loses the live view, not the result.
        if tokio::time::timeout(STREAM_SEND_WAIT, self.ctx.output(text))
            .await
            .is_err()
        {
            self.live = false;
        }
    }
}

/// `bytes` without a trailing, unfinished UTF-8 sequence.
fn complete_prefix(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Err(err) if err.error_len().is_none() => &bytes[..err.valid_up_to()],
        _ => bytes,
    }
}
