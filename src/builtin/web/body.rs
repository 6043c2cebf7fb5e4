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

/// The body as text in the charset it says it has: a byte-order mark first, then the
/// `Content-Type` header's `charset`, then (for HTML) a `<meta>` charset in its first 1 KiB;
/// UTF-8 when none names a known one. Bytes the charset cannot read become U+FFFD.
pub(super) fn decode_text(bytes: &[u8], content_type: &str, html: bool) -> String {
    let declared = |label: &str| encoding_rs::Encoding::for_label(label.trim().as_bytes());
    let from_header = content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| declared(value.trim().trim_matches('"')))?
    });
    let from_meta = || {
        let head = &bytes[..bytes.len().min(1024)];
        let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
        let at = lower.find("charset=")? + "charset=".len();
        let label: String = lower[at..]
            .trim_start_matches(['"', '\''])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
            .collect();
        declared(&label)
    };
    let encoding = from_header
        .or_else(|| if html { from_meta() } else { None })
        .unwrap_or(encoding_rs::UTF_8);
    // `decode` lets a byte-order mark override the declared charset, as browsers do.
    let (text, _, _) = encoding.decode(bytes);
    text.into_owned()
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

#[cfg(test)]
mod charset_tests {
    use super::decode_text;

    #[test]
    fn bodies_are_read_in_their_declared_charset() {
        // "café" in Latin-1 is not UTF-8.
        let latin1 = b"caf\xe9";
        assert_eq!(
            decode_text(latin1, "text/plain; charset=ISO-8859-1", false),
            "café"
        );
        assert_eq!(
            decode_text(latin1, "text/plain; charset=\"latin1\"", false),
            "café"
        );
        assert_eq!(decode_text(latin1, "text/plain", false), "caf\u{fffd}");
        // HTML may say it in a meta tag instead.
        let page = b"<html><head><meta charset=\"windows-1252\"></head><body>\x93hi\x94</body>";
        assert!(decode_text(page, "text/html", true).contains("\u{201c}hi\u{201d}"));
        let old_style =
            b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=Shift_JIS\">\x93\xfa";
        assert!(decode_text(old_style, "text/html", true).ends_with('日'));
        // A byte-order mark wins; an unknown label falls back to UTF-8.
        let utf16 = b"\xff\xfeh\0i\0";
        assert_eq!(
            decode_text(utf16, "text/plain; charset=iso-8859-1", false),
            "hi"
        );
        assert_eq!(
            decode_text("ok ✓".as_bytes(), "text/plain; charset=no-such", false),
            "ok ✓"
        );
    }
}
