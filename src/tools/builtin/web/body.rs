//! A response body read up to a cap, and how it is shown to the model: HTML rendered as
//! readable text with its links listed, text as is, binary only described.

use reqwest::{Response, Url};
use tokio_util::sync::CancellationToken;

use super::request_error;
use crate::tools::ToolError;

/// Bytes at the start of an untyped body searched for an `<html` tag.
const SNIFF_BYTES: usize = 1024;
/// Column width HTML is rendered to; wide enough that prose wraps like a browser's.
const HTML_RENDER_WIDTH: usize = 100;

/// A body read up to a cap.
pub(super) struct Body {
    /// The bytes read, at most the cap.
    pub(super) bytes: Vec<u8>,
    /// Whether the body went on past the cap.
    pub(super) truncated: bool,
}

/// Streams a response body, stopping at `limit` bytes (and saying so) or on cancellation.
pub(super) async fn read_capped(
    tool: &str,
    response: &mut Response,
    limit: u64,
    cancel: &CancellationToken,
) -> Result<Body, ToolError> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    let mut truncated = false;
    loop {
        let chunk = tokio::select! {
            _ = cancel.cancelled() => {
                return Err(ToolError::model("cancelled", format!("{tool}: cancelled")));
            }
            chunk = response.chunk() => chunk.map_err(|err| request_error(tool, &err))?,
        };
        let Some(chunk) = chunk else { break };
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body { bytes, truncated })
}

/// The lowercase media type of a Content-Type value, without parameters.
pub(super) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// How a body is shown to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyKind {
    /// Rendered as readable text.
    Html,
    /// Shown as it is.
    Text,
    /// Described by type and size, not shown.
    Binary,
}

/// Decides from the declared type, looking at the bytes only when the type says nothing useful.
pub(super) fn classify(media: &str, head: &[u8]) -> BodyKind {
    match media {
        "text/html" | "application/xhtml+xml" => return BodyKind::Html,
        "" | "application/octet-stream" | "binary/octet-stream" => {}
        _ if is_textual(media) => return BodyKind::Text,
        _ => return BodyKind::Binary,
    }
    let head = &head[..head.len().min(SNIFF_BYTES)];
    let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
    if lower.contains("<html") || lower.contains("<!doctype html") {
        BodyKind::Html
    } else if utf8_prefix_ok(head) {
        BodyKind::Text
    } else {
        BodyKind::Binary
    }
}

/// Whether `bytes` is UTF-8 except possibly for a character cut off at the end.
fn utf8_prefix_ok(bytes: &[u8]) -> bool {
    if bytes.contains(&0) {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(err) => err.error_len().is_none(),
    }
}

/// Media types whose bodies are text worth showing as is.
fn is_textual(media: &str) -> bool {
    media.starts_with("text/")
        || media.ends_with("+json")
        || media.ends_with("+xml")
        || matches!(
            media,
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-javascript"
                | "application/ecmascript"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/x-sh"
                | "application/sql"
                | "application/graphql"
                | "application/x-ndjson"
                | "application/x-www-form-urlencoded"
        )
}

/// Renders HTML as plain text: links become `[text][n]` with a numbered list of their
/// (absolute) targets at the end.
pub(super) fn html_to_text(html: &[u8], base: &Url) -> String {
    match html2text::config::plain()
        .allow_width_overflow()
        .string_from_read(html, HTML_RENDER_WIDTH)
    {
        Ok(text) => absolutize_link_list(&text, base),
        // The parser accepts any input; a render failure still leaves the raw markup useful.
        Err(_) => String::from_utf8_lossy(html).into_owned(),
    }
}

/// Rewrites relative targets in html2text's link list (`[n]: target` lines) against `base`.
fn absolutize_link_list(text: &str, base: &Url) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let rewritten = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("]: "))
            .filter(|(number, _)| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|(number, target)| {
                let target = target.trim_end();
                if Url::parse(target).is_ok() {
                    return None;
                }
                let absolute = base.join(target).ok()?;
                let ending = &line[line.trim_end().len()..];
                Some(format!("[{number}]: {absolute}{ending}"))
            });
        match rewritten {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
    }
    out
}

/// The first `max` characters of `text`, marked when cut.
pub(super) fn excerpt(text: &str, max: usize) -> String {
    let trimmed = text.trim();
    match trimmed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}
