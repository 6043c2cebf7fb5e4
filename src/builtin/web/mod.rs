//! `web_fetch` (one URL as readable text) and `web_search` (a SearXNG-style JSON backend).
//!
//! `web_fetch` is the server reaching out on the model's behalf, so it guards against
//! server-side request forgery: every address a connection may go to — literal IPs in the first
//! URL and in each redirect hop, and every address a host name resolves to — is checked by
//! [`is_forbidden`] and against the addresses of this host's own interfaces before anything is
//! sent. Name resolution goes through `GuardedResolver`, which hands the HTTP client only the
//! addresses it checked, so a name that resolves to a public address once and to a private one
//! a moment later (DNS rebinding) cannot slip through.
//!
//! - `guard` — the SSRF guard: which addresses are refused, the guarded resolver, redirect hops.
//! - `body` — reading a capped body and turning it into text (HTML rendered, binary described).
//! - `fetch` — the `web_fetch` tool.
//! - `search` — the `web_search` tool.
//! - `host_addresses` — this host's own interface addresses.

mod body;
mod fetch;
mod guard;
mod host_addresses;
mod search;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::Client;
use reqwest::redirect::Policy;

use crate::tools::ToolError;
pub use fetch::WebFetch;
pub use guard::is_forbidden;
use guard::{AddressGuard, find_refusal};
pub use search::WebSearch;

/// The whole exchange, redirects and body included, must finish within this.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Establishing one connection (TCP and TLS) must finish within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirect hops followed before giving up.
const MAX_REDIRECTS: usize = 5;
/// The most body bytes read from one response; `max_bytes` may lower it, never raise it.
const MAX_BODY_BYTES: u64 = 5 * 1024 * 1024;
/// Characters of an error response's body shown to the model.
const ERROR_EXCERPT_CHARS: usize = 500;
/// Identifies the server to the sites it fetches.
const USER_AGENT: &str = concat!("agentd/", env!("CARGO_PKG_VERSION"), " (web_fetch)");

/// An error and its causes on one line; reqwest's top-level message alone says little.
fn describe_error(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut current = err.source();
    while let Some(cause) = current {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        current = cause.source();
    }
    text
}

/// Turns a failed request into the error the model reads.
fn request_error(tool: &str, err: &reqwest::Error) -> ToolError {
    if let Some(refusal) = find_refusal(err) {
        return refusal.to_tool_error(tool);
    }
    if err.is_timeout() {
        return ToolError::model(
            "timeout",
            format!(
                "{tool}: the request timed out (limits: {}s to connect, {}s in total)",
                CONNECT_TIMEOUT.as_secs(),
                TOTAL_TIMEOUT.as_secs()
            ),
        );
    }
    ToolError::model(
        "network_error",
        format!("{tool}: the request failed: {}", describe_error(err)),
    )
}

/// Builds a client with the fetch limits; `guard` is `None` for the operator's own endpoints.
fn build_client(guard: Option<Arc<AddressGuard>>) -> reqwest::Result<Client> {
    let mut builder = Client::builder()
        .user_agent(USER_AGENT)
        .timeout(TOTAL_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT);
    builder = match guard {
        Some(guard) => guard::guarded(builder, guard),
        None => builder.redirect(Policy::limited(MAX_REDIRECTS)),
    };
    builder.build()
}

/// A client built on first use and kept; building loads the TLS roots, which not every
/// registry that lists the tool will need.
#[derive(Default)]
struct LazyClient(OnceLock<reqwest::Result<Client>>);

impl LazyClient {
    fn get(&self, tool: &str, guard: Option<&Arc<AddressGuard>>) -> Result<&Client, ToolError> {
        self.0
            .get_or_init(|| build_client(guard.cloned()))
            .as_ref()
            .map_err(|err| {
                let why = describe_error(err);
                ToolError::unsupported(tool, &format!("the HTTP client could not start: {why}"))
            })
    }
}
