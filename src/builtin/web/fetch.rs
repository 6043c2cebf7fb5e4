//! `web_fetch`: downloads one http(s) URL, through the SSRF guard, and returns it as text.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::body::{
    Body, BodyKind, classify, decode_text, excerpt, html_to_text, media_type, read_capped,
};
use super::guard::AddressGuard;
use super::{ERROR_EXCERPT_CHARS, LazyClient, MAX_BODY_BYTES, request_error};
use crate::builtin::{ToolPermissions, parse_args};
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Body bytes read from an error response, of which an excerpt is shown.
const ERROR_BODY_BYTES: u64 = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FetchArgs {
    url: String,
    #[serde(default)]
    max_bytes: Option<u64>,
}

/// `web_fetch`: downloads one http(s) URL and returns it as readable text.
pub struct WebFetch {
    guard: Arc<AddressGuard>,
    client: LazyClient,
}

impl WebFetch {
    /// A fetcher obeying `permissions.web_fetch_allow_private`.
    pub fn new(permissions: &ToolPermissions) -> Self {
        Self::with_guard(AddressGuard {
            allow_private: permissions.web_fetch_allow_private,
            ..AddressGuard::default()
        })
    }

    /// A fetcher that also reaches exactly these address-and-port pairs when a URL names them
    /// literally; every other check stays as `permissions` says.
    #[cfg(test)]
    pub(crate) fn with_allowed_addresses(
        permissions: &ToolPermissions,
        allow_exact: Vec<std::net::SocketAddr>,
    ) -> Self {
        Self::with_guard(AddressGuard {
            allow_private: permissions.web_fetch_allow_private,
            allow_exact,
            host_addresses: None,
        })
    }

    fn with_guard(guard: AddressGuard) -> Self {
        Self {
            guard: Arc::new(guard),
            client: LazyClient::default(),
        }
    }

    async fn fetch(
        &self,
        args: &Value,
        cancel: &CancellationToken,
    ) -> Result<ToolResult, ToolError> {
        const TOOL: &str = "web_fetch";
        let args: FetchArgs = parse_args(TOOL, args)?;
        let limit = match args.max_bytes {
            Some(0) => {
                return Err(ToolError::model(
                    "invalid_input",
                    "web_fetch: max_bytes must be at least 1",
                ));
            }
            Some(requested) => requested.min(MAX_BODY_BYTES),
            None => MAX_BODY_BYTES,
        };
        let url = Url::parse(args.url.trim()).map_err(|err| {
            ToolError::model(
                "invalid_input",
                format!(
                    "web_fetch: `{}` is not a valid absolute URL: {err}",
                    args.url
                ),
            )
        })?;
        self.guard
            .check_url(&url)
            .map_err(|refusal| refusal.to_tool_error(TOOL))?;
        let client = self.client.get(TOOL, Some(&self.guard))?;

        let request = client
            .get(url)
            .header(
                ACCEPT,
                "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.5",
            )
            .send();
        let mut response = tokio::select! {
            _ = cancel.cancelled() => {
                return Err(ToolError::model("cancelled", "web_fetch: cancelled"));
            }
            sent = request => sent.map_err(|err| request_error(TOOL, &err))?,
        };

        let final_url = response.url().clone();
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let media = media_type(&content_type);
        let shown_type = if content_type.is_empty() {
            "unknown type"
        } else {
            content_type.as_str()
        };
        let header_line = format!("URL: {final_url} (status {status}, {shown_type})");

        if !status.is_success() {
            let body =
                read_capped(TOOL, &mut response, limit.min(ERROR_BODY_BYTES), cancel).await?;
            let text = match classify(&media, &body.bytes) {
                BodyKind::Html => html_to_text(
                    decode_text(&body.bytes, &content_type, true).as_bytes(),
                    &final_url,
                ),
                BodyKind::Text => decode_text(&body.bytes, &content_type, false),
                BodyKind::Binary => String::new(),
            };
            let shown = excerpt(&text, ERROR_EXCERPT_CHARS);
            let mut output = format!("{header_line}\nThe server answered HTTP {status}.");
            if !shown.is_empty() {
                output.push_str("\nStart of the body:\n");
                output.push_str(&shown);
            }
            return Ok(ToolResult::failure(output).with_metadata(json!({
                "url": final_url.as_str(),
                "status": status.as_u16(),
                "content_type": content_type,
                "bytes": body.bytes.len(),
                "truncated": body.truncated,
            })));
        }

        // A declared binary type is described from its headers without downloading it.
        let declared_binary = !media.is_empty() && classify(&media, &[]) == BodyKind::Binary;
        let (kind, body, size) = match (declared_binary, response.content_length()) {
            (true, Some(length)) => (
                BodyKind::Binary,
                Body {
                    bytes: Vec::new(),
                    truncated: false,
                },
                length,
            ),
            _ => {
                let body = read_capped(TOOL, &mut response, limit, cancel).await?;
                let size = body.bytes.len() as u64;
                (classify(&media, &body.bytes), body, size)
            }
        };

        let mut output = header_line;
        output.push('\n');
        match kind {
            BodyKind::Html => {
                let (html, declared) = (body.bytes, content_type.clone());
                let base = final_url.clone();
                let text = tokio::task::spawn_blocking(move || {
                    html_to_text(decode_text(&html, &declared, true).as_bytes(), &base)
                })
                .await
                .map_err(|err| {
                    ToolError::Fatal(format!("web_fetch: HTML rendering failed: {err}"))
                })?;
                output.push_str(text.trim_end());
            }
            BodyKind::Text => output.push_str(&decode_text(&body.bytes, &content_type, false)),
            BodyKind::Binary => {
                let size_text = if body.truncated {
                    format!("more than {size} bytes")
                } else {
                    format!("{size} bytes")
                };
                output.push_str(&format!(
                    "[binary content of type {}, {size_text}; not shown]",
                    if media.is_empty() { "unknown" } else { &media }
                ));
            }
        }
        if body.truncated && kind != BodyKind::Binary {
            output.push_str(&format!(
                "\n[truncated: stopped reading after {size} bytes; the rest of the body was not fetched]"
            ));
        }
        Ok(ToolResult::ok(output).with_metadata(json!({
            "url": final_url.as_str(),
            "status": status.as_u16(),
            "content_type": content_type,
            "bytes": size,
            "truncated": body.truncated,
        })))
    }
}

#[async_trait]
impl Tool for WebFetch {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "web_fetch",
                "Fetches one http or https URL and returns its content as text: HTML pages are \
                 rendered as readable text with links listed as numbered references, text and JSON \
                 are returned as is, and binary files are only described (type and size). The \
                 first line gives the final URL after redirects, the HTTP status and the content \
                 type. Bodies are cut at 5 MiB (or max_bytes); a cut body says it was truncated. \
                 Addresses on the server's own network (loopback, private, link-local, cloud \
                 metadata, the server's own interfaces) are refused.",
                json!({
                    "type": "object",
                    "description": "Which URL to fetch and how much of its body to read.",
                    "properties": {
                        "url": {
                            "type": "string",
                            "description": "The absolute http:// or https:// URL to fetch."
                        },
                        "max_bytes": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Read at most this many bytes of the body (default and \
                                            maximum 5242880, larger values are lowered to it); use \
                                            a small value to peek at a large page."
                        }
                    },
                    "required": ["url"],
                    "additionalProperties": false
                }),
                Effects::REACHES_NETWORK,
            )
            .groups(&["web"])
            .contract()
            .tags(&["web"])
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.fetch(args, &ctx.cancel).await
    }
}
