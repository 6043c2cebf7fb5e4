//! `web_search`: asks the configured SearXNG-style JSON backend and lists the top results;
//! without a backend it is `unsupported`.

use std::sync::LazyLock;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::ACCEPT;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::body::{excerpt, read_capped};
use super::{ERROR_EXCERPT_CHARS, LazyClient, MAX_BODY_BYTES, describe_error};
use crate::builtin::{ToolPermissions, parse_args};
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Search results shown to the model.
const MAX_SEARCH_RESULTS: usize = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
}

/// The part of a SearXNG JSON answer the tool uses.
#[derive(Debug, Deserialize)]
struct SearchResponse {
    #[serde(default)]
    results: Vec<SearchHit>,
}

/// One result of a SearXNG JSON answer; missing or null fields read as empty.
#[derive(Debug, Deserialize)]
struct SearchHit {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

/// `web_search`: asks the configured SearXNG-style backend and lists the top results.
pub struct WebSearch {
    endpoint: Option<String>,
    client: LazyClient,
}

impl WebSearch {
    /// A search tool using `permissions.web_search_url`; `unsupported` without one.
    pub fn new(permissions: &ToolPermissions) -> Self {
        Self {
            endpoint: permissions.web_search_url.clone(),
            client: LazyClient::default(),
        }
    }

    async fn search(
        &self,
        args: &Value,
        cancel: &CancellationToken,
    ) -> Result<ToolResult, ToolError> {
        const TOOL: &str = "web_search";
        let Some(endpoint) = &self.endpoint else {
            return Err(ToolError::unsupported(
                TOOL,
                "no search backend is configured (tools.web_search_url)",
            ));
        };
        let args: SearchArgs = parse_args(TOOL, args)?;
        let query = args.query.trim();
        if query.is_empty() {
            return Err(ToolError::model(
                "invalid_input",
                "web_search: query is empty; say what to search for",
            ));
        }
        let mut url = Url::parse(endpoint).map_err(|err| {
            ToolError::unsupported(
                TOOL,
                &format!("the configured web_search_url `{endpoint}` is not a valid URL: {err}"),
            )
        })?;
        url.query_pairs_mut()
            .append_pair("q", query)
            .append_pair("format", "json");
        // The endpoint is the operator's own choice (often a SearXNG on the same host), so the
        // model-facing address guard does not apply to it.
        let client = self.client.get(TOOL, None)?;

        let request = client.get(url).header(ACCEPT, "application/json").send();
        let mut response = tokio::select! {
            _ = cancel.cancelled() => {
                return Err(ToolError::model("cancelled", "web_search: cancelled"));
            }
            sent = request => match sent {
                Ok(response) => response,
                Err(err) => {
                    return Ok(ToolResult::failure(format!(
                        "web_search: the search backend could not be reached: {}",
                        describe_error(&err)
                    )));
                }
            },
        };
        let status = response.status();
        let body = match read_capped(TOOL, &mut response, MAX_BODY_BYTES, cancel).await {
            Ok(body) => body,
            Err(ToolError::Model { message, .. }) => return Ok(ToolResult::failure(message)),
            Err(fatal) => return Err(fatal),
        };
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body.bytes);
            let shown = excerpt(&text, ERROR_EXCERPT_CHARS);
            let mut output = format!("web_search: the search backend answered HTTP {status}.");
            if !shown.is_empty() {
                output.push_str("\nStart of its answer:\n");
                output.push_str(&shown);
            }
            return Ok(ToolResult::failure(output)
                .with_metadata(json!({"query": query, "status": status.as_u16()})));
        }
        let parsed: SearchResponse = match serde_json::from_slice(&body.bytes) {
            Ok(parsed) => parsed,
            Err(err) => {
                let why = if body.truncated {
                    format!("its answer is larger than {MAX_BODY_BYTES} bytes")
                } else {
                    format!("its answer is not the expected JSON ({err})")
                };
                return Ok(ToolResult::failure(format!(
                    "web_search: the search backend's answer could not be read: {why}"
                )));
            }
        };

        let hits: Vec<Value> = parsed
            .results
            .into_iter()
            .filter(|hit| hit.url.as_deref().is_some_and(|url| !url.is_empty()))
            .take(MAX_SEARCH_RESULTS)
            .map(|hit| {
                json!({
                    "title": hit.title.unwrap_or_default().trim(),
                    "url": hit.url.unwrap_or_default(),
                    "content": hit.content.unwrap_or_default().trim(),
                })
            })
            .collect();
        if hits.is_empty() {
            return Ok(ToolResult::ok(format!("No results for \"{query}\"."))
                .with_metadata(json!({"query": query, "results": []})));
        }
        let mut output = format!("Results for \"{query}\":\n");
        for (index, hit) in hits.iter().enumerate() {
            let field = |name: &str| hit[name].as_str().unwrap_or("").to_owned();
            let title = field("title");
            let title = if title.is_empty() {
                "(untitled)".to_owned()
            } else {
                title
            };
            output.push_str(&format!("\n{}. {title}\n   {}\n", index + 1, field("url")));
            let snippet = field("content");
            if !snippet.is_empty() {
                output.push_str(&format!("   {}\n", snippet.replace('\n', " ")));
            }
        }
        Ok(ToolResult::ok(output.trim_end().to_owned())
            .with_metadata(json!({"query": query, "results": hits})))
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "web_search",
                "Searches the web and returns the top 10 results as a numbered list of title, URL \
                 and snippet. Use web_fetch on a result's URL to read the page itself.",
                json!({
                    "type": "object",
                    "description": "What to search the web for.",
                    "properties": {
                        "query": {
                            "type": "string",
                            "description": "The search terms, as you would type them into a search engine."
                        }
                    },
                    "required": ["query"],
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
        self.search(args, &ctx.cancel).await
    }
}
