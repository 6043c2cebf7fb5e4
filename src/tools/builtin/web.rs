//! `web_fetch` (one URL as readable text) and `web_search` (a SearXNG-style JSON backend).
//!
//! `web_fetch` is the server reaching out on the model's behalf, so it guards against
//! server-side request forgery: every address a connection may go to — literal IPs in the first
//! URL and in each redirect hop, and every address a host name resolves to — is checked by
//! [`is_forbidden`] and against the addresses of this host's own interfaces before anything is
//! sent. Name resolution goes through `GuardedResolver`, which hands the HTTP client only the
//! addresses it checked, so a name that resolves to a public address once and to a private one
//! a moment later (DNS rebinding) cannot slip through.

mod host_addresses;

use std::any::Any;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::redirect::{Attempt, Policy};
use reqwest::{Client, Response, Url};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{ToolPermissions, parse_args};
use crate::tools::{ConcurrencyClass, Tool, ToolContext, ToolError, ToolResult};

/// The whole exchange, redirects and body included, must finish within this.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Establishing one connection (TCP and TLS) must finish within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirect hops followed before giving up.
const MAX_REDIRECTS: usize = 5;
/// The most body bytes read from one response; `max_bytes` may lower it, never raise it.
const MAX_BODY_BYTES: u64 = 5 * 1024 * 1024;
/// Body bytes read from an error response, of which an excerpt is shown.
const ERROR_BODY_BYTES: u64 = 64 * 1024;
/// Characters of an error response's body shown to the model.
const ERROR_EXCERPT_CHARS: usize = 500;
/// Bytes at the start of an untyped body searched for an `<html` tag.
const SNIFF_BYTES: usize = 1024;
/// Column width HTML is rendered to; wide enough that prose wraps like a browser's.
const HTML_RENDER_WIDTH: usize = 100;
/// Search results shown to the model.
const MAX_SEARCH_RESULTS: usize = 10;
/// Identifies the server to the sites it fetches.
const USER_AGENT: &str = concat!("agentd/", env!("CARGO_PKG_VERSION"), " (web_fetch)");

/// Cloud metadata endpoints; inside the link-local and unique-local ranges already, listed on
/// their own so the intent survives any change to those ranges.
const METADATA_ADDRESSES: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)),
];

/// Whether `web_fetch` must refuse to connect to `ip` (unless private addresses are allowed):
/// loopback, private, link-local, unspecified, broadcast, multicast, reserved, CGNAT,
/// documentation (TEST-NET) and metadata addresses, including every IPv6 form that embeds such
/// an IPv4 address. The host's own interface addresses are refused too, by the guard, since
/// they are known only at run time.
pub fn is_forbidden(ip: IpAddr) -> bool {
    if METADATA_ADDRESSES.contains(&ip) {
        return true;
    }
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // 0.0.0.0/8, "this network", includes the unspecified address
        || ip.is_loopback() // 127.0.0.0/8
        || ip.is_private() // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local() // 169.254/16, includes 169.254.169.254
        || (a == 100 && (b & 0xc0) == 64) // 100.64/10, carrier-grade NAT
        || (a == 192 && b == 0 && c == 0) // 192.0.0.0/24, IETF protocol assignments
        // TEST-NET-1, -2 and -3: documentation only, so never a real site, yet a host may
        // carry one on an interface (and then they reach its own services).
        || (a == 192 && b == 0 && c == 2) // 192.0.2.0/24
        || (a == 198 && b == 51 && c == 100) // 198.51.100.0/24
        || (a == 203 && b == 0 && c == 113) // 203.0.113.0/24
        || (a == 198 && (b & 0xfe) == 18) // 198.18/15, benchmarking
        || ip.is_multicast() // 224/4
        || a >= 240 // 240/4 reserved, includes 255.255.255.255
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    if let Some(v4) = embedded_v4(ip) {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1) // 64:ff9b:1::/48, local-use NAT64
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // 2001:db8::/32, documentation
        || (seg[0] & 0xfe00) == 0xfc00 // fc00::/7 unique local, includes fd00:ec2::254
        || (seg[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
        || (seg[0] & 0xffc0) == 0xfec0 // fec0::/10 deprecated site-local
        || (seg[0] & 0xff00) == 0xff00 // ff00::/8 multicast
}

/// The IPv4 address an IPv6 address stands for, in the forms that reach an IPv4 host: mapped
/// `::ffff:a.b.c.d`, SIIT-translated `::ffff:0:a.b.c.d`, compatible `::a.b.c.d` (deprecated),
/// NAT64 `64:ff9b::a.b.c.d` and 6to4 `2002:aabb:ccdd::/48`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let low = Ipv4Addr::from((u32::from(seg[6]) << 16) | u32::from(seg[7]));
    match seg {
        [0, 0, 0, 0, 0, 0xffff, _, _] // ::ffff:0:0/96
        | [0, 0, 0, 0, 0xffff, 0, _, _] // ::ffff:0:0:0/96
        | [0, 0, 0, 0, 0, 0, _, _] // ::/96
        | [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low), // 64:ff9b::/96
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))),
        _ => None,
    }
}

/// Whether `ip`, or the IPv4 address it embeds, is one of `host` (the interface addresses).
fn is_host_address(ip: IpAddr, host: &[IpAddr]) -> bool {
    let embedded = match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    host.iter().any(|own| *own == ip || Some(*own) == embedded)
}

/// Why a URL or an address was refused before any request went out.
#[derive(Debug)]
enum Refusal {
    /// Not http or https.
    Scheme(String),
    /// A forbidden address, with the host it came from.
    Address { ip: IpAddr, host: String },
    /// An address of one of this host's own interfaces, with the host it came from.
    OwnAddress { ip: IpAddr, host: String },
    /// The interface addresses could not be listed, so nothing could be checked against them.
    OwnAddressesUnknown(String),
    /// A host name that resolved to no address at all.
    NoAddress(String),
    /// More redirect hops than allowed.
    TooManyRedirects,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scheme(scheme) => write!(
                f,
                "web_fetch only fetches http and https URLs, not `{scheme}:`"
            ),
            Self::Address { ip, host } if host == &ip.to_string() => write!(
                f,
                "refused to connect to {ip}: loopback, private, link-local, reserved, \
                 documentation and cloud metadata addresses are blocked"
            ),
            Self::Address { ip, host } => write!(
                f,
                "refused to connect to {ip} (the address of {host}): loopback, private, \
                 link-local, reserved, documentation and cloud metadata addresses are blocked"
            ),
            Self::OwnAddress { ip, host } if host == &ip.to_string() => write!(
                f,
                "refused to connect to {ip}: it is an address of this server's own network \
                 interfaces"
            ),
            Self::OwnAddress { ip, host } => write!(
                f,
                "refused to connect to {ip} (the address of {host}): it is an address of this \
                 server's own network interfaces"
            ),
            Self::OwnAddressesUnknown(why) => write!(
                f,
                "refused to connect: this server's own addresses could not be listed ({why}), \
                 so the address could not be checked against them"
            ),
            Self::NoAddress(host) => write!(f, "{host} resolved to no address"),
            Self::TooManyRedirects => {
                write!(
                    f,
                    "more than {MAX_REDIRECTS} redirects; stopped following them"
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    fn kind(&self) -> &'static str {
        match self {
            Self::Scheme(_) => "invalid_input",
            Self::Address { .. } | Self::OwnAddress { .. } | Self::OwnAddressesUnknown(_) => {
                "forbidden_address"
            }
            Self::NoAddress(_) => "network_error",
            Self::TooManyRedirects => "limit_reached",
        }
    }

    fn to_tool_error(&self, tool: &str) -> ToolError {
        ToolError::model(self.kind(), format!("{tool}: {self}"))
    }
}

/// Which addresses one `WebFetch` may connect to.
#[derive(Debug, Clone, Default)]
struct AddressGuard {
    /// Skips every address check (`web_fetch_allow_private`).
    allow_private: bool,
    /// Literal-IP URLs with exactly this address and port pass even when forbidden; lets tests
    /// reach one loopback server while every other check stays on.
    allow_exact: Vec<SocketAddr>,
    /// Stands in for the host's interface addresses when set; lets tests name a public one.
    host_addresses: Option<Vec<IpAddr>>,
}

impl AddressGuard {
    /// The host's interface addresses as they are now (or the test's stand-in).
    fn own_addresses(&self) -> Result<Vec<IpAddr>, Refusal> {
        match &self.host_addresses {
            Some(fixed) => Ok(fixed.clone()),
            None => host_addresses::interface_addresses()
                .map_err(|err| Refusal::OwnAddressesUnknown(err.to_string())),
        }
    }

    /// Refuses `ip` (reached through `host`) when it is forbidden or one of `own`.
    fn check_address(&self, ip: IpAddr, host: &str, own: &[IpAddr]) -> Result<(), Refusal> {
        let host = host.to_owned();
        if self.allow_private {
            Ok(())
        } else if is_forbidden(ip) {
            Err(Refusal::Address { ip, host })
        } else if is_host_address(ip, own) {
            Err(Refusal::OwnAddress { ip, host })
        } else {
            Ok(())
        }
    }

    /// Checks the scheme, and the address when the host is a literal IP (those never reach the
    /// resolver); host names are checked by `GuardedResolver` when they are resolved.
    fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Scheme(url.scheme().to_owned()));
        }
        let Some(ip) = literal_ip(url) else {
            return Ok(());
        };
        let port = url.port_or_known_default().unwrap_or(0);
        if self.allow_private || self.allow_exact.contains(&SocketAddr::new(ip, port)) {
            return Ok(());
        }
        self.check_address(ip, &ip.to_string(), &self.own_addresses()?)
    }
}

/// The host of `url` when it is an IP address rather than a name; the URL parser has already
/// normalised odd IPv4 spellings (`0x7f.1`, `2130706433`) to dotted form.
fn literal_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    host.parse().ok()
}

/// Resolves host names with the system resolver and passes on only the addresses the guard
/// allows; the client connects to nothing else, so what was checked is what is reached.
struct GuardedResolver {
    guard: Arc<AddressGuard>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = Arc::clone(&self.guard);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let boxed =
                |refusal: Refusal| Box::new(refusal) as Box<dyn std::error::Error + Send + Sync>;
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // The resolver does not know the port, so the exact allowances (which are per
            // address and port) do not apply to names.
            let own = if guard.allow_private {
                Vec::new()
            } else {
                guard.own_addresses().map_err(boxed)?
            };
            let mut allowed = Vec::new();
            let mut first_refusal = None;
            for addr in resolved {
                match guard.check_address(addr.ip(), &host, &own) {
                    Ok(()) => allowed.push(addr),
                    Err(refusal) => {
                        first_refusal.get_or_insert(refusal);
                    }
                }
            }
            if allowed.is_empty() {
                return Err(boxed(first_refusal.unwrap_or(Refusal::NoAddress(host))));
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Finds a refusal of ours anywhere in an error's chain of causes.
fn find_refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(refusal) = err.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        current = err.source();
    }
    None
}

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

/// A body read up to a cap.
struct Body {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Streams a response body, stopping at `limit` bytes (and saying so) or on cancellation.
async fn read_capped(
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
fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// How a body is shown to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    Html,
    Text,
    Binary,
}

/// Decides from the declared type, looking at the bytes only when the type says nothing useful.
fn classify(media: &str, head: &[u8]) -> BodyKind {
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
fn html_to_text(html: &[u8], base: &Url) -> String {
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
fn excerpt(text: &str, max: usize) -> String {
    let trimmed = text.trim();
    match trimmed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

/// Builds a client with the fetch limits; `guard` is `None` for the operator's own endpoints.
fn build_client(guard: Option<Arc<AddressGuard>>) -> Result<Client, String> {
    let mut builder = Client::builder()
        .user_agent(USER_AGENT)
        .timeout(TOTAL_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT);
    builder = match guard {
        Some(guard) => {
            let hop_guard = Arc::clone(&guard);
            builder
                // A proxy would connect on our behalf to addresses we never checked.
                .no_proxy()
                .dns_resolver(GuardedResolver { guard })
                .redirect(Policy::custom(move |attempt: Attempt| {
                    // `previous` starts with the original URL, so its length is the hop count.
                    if attempt.previous().len() > MAX_REDIRECTS {
                        return attempt.error(Refusal::TooManyRedirects);
                    }
                    match hop_guard.check_url(attempt.url()) {
                        Ok(()) => attempt.follow(),
                        Err(refusal) => attempt.error(refusal),
                    }
                }))
        }
        None => builder.redirect(Policy::limited(MAX_REDIRECTS)),
    };
    builder.build().map_err(|err| describe_error(&err))
}

/// A client built on first use and kept; building loads the TLS roots, which not every
/// registry that lists the tool will need.
#[derive(Default)]
struct LazyClient(OnceLock<Result<Client, String>>);

impl LazyClient {
    fn get(&self, tool: &str, guard: Option<&Arc<AddressGuard>>) -> Result<&Client, ToolError> {
        self.0
            .get_or_init(|| build_client(guard.cloned()))
            .as_ref()
            .map_err(|why| {
                ToolError::unsupported(tool, &format!("the HTTP client could not start: {why}"))
            })
    }
}

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
        allow_exact: Vec<SocketAddr>,
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
                BodyKind::Html => html_to_text(&body.bytes, &final_url),
                BodyKind::Text => String::from_utf8_lossy(&body.bytes).into_owned(),
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
                let html = body.bytes;
                let base = final_url.clone();
                let text = tokio::task::spawn_blocking(move || html_to_text(&html, &base))
                    .await
                    .map_err(|err| {
                        ToolError::Fatal(format!("web_fetch: HTML rendering failed: {err}"))
                    })?;
                output.push_str(text.trim_end());
            }
            BodyKind::Text => output.push_str(&String::from_utf8_lossy(&body.bytes)),
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
    fn name(&self) -> &str {
        "web_fetch"
    }

    fn description(&self) -> &str {
        "Fetches one http or https URL and returns its content as text: HTML pages are rendered \
         as readable text with links listed as numbered references, text and JSON are returned \
         as is, and binary files are only described (type and size). The first line gives the \
         final URL after redirects, the HTTP status and the content type. Bodies are cut at \
         5 MiB (or max_bytes); a cut body says it was truncated. Addresses on the server's own \
         network (loopback, private, link-local, cloud metadata, the server's own interfaces) \
         are refused."
    }

    fn input_schema(&self) -> Value {
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
                                    maximum 5242880, larger values are lowered to it); use a \
                                    small value to peek at a large page."
                }
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    fn tags(&self) -> &[&str] {
        &["web"]
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Safe
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.fetch(args, &CancellationToken::new()).await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.fetch(args, &ctx.cancel).await
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

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
    fn name(&self) -> &str {
        "web_search"
    }

    fn description(&self) -> &str {
        "Searches the web and returns the top 10 results as a numbered list of title, URL and \
         snippet. Use web_fetch on a result's URL to read the page itself."
    }

    fn input_schema(&self) -> Value {
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
        })
    }

    fn tags(&self) -> &[&str] {
        &["web"]
    }

    fn concurrency_class(&self) -> ConcurrencyClass {
        ConcurrencyClass::Safe
    }

    async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
        self.search(args, &CancellationToken::new()).await
    }

    async fn execute_with_context(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<ToolResult, ToolError> {
        self.search(args, &ctx.cancel).await
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const WAIT: Duration = Duration::from_secs(20);

    /// A loopback HTTP/1.1 server answering every request with one canned response and
    /// remembering what it was asked.
    struct TestServer {
        addr: SocketAddr,
        hits: Arc<AtomicUsize>,
        request_lines: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl TestServer {
        async fn start(response: Vec<u8>) -> Self {
            Self::start_with(|_| response).await
        }

        /// Starts a server whose response may mention its own address.
        async fn start_with(make_response: impl FnOnce(SocketAddr) -> Vec<u8>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("local addr");
            let response = make_response(addr);
            let hits = Arc::new(AtomicUsize::new(0));
            let request_lines = Arc::new(Mutex::new(Vec::new()));
            let (task_hits, task_lines) = (Arc::clone(&hits), Arc::clone(&request_lines));
            let task = tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if head.is_empty() {
                        continue;
                    }
                    task_hits.fetch_add(1, Ordering::SeqCst);
                    let text = String::from_utf8_lossy(&head);
                    let line = text.lines().next().unwrap_or("").to_owned();
                    task_lines.lock().expect("lines").push(line);
                    // The client may hang up early on a capped body; that is the point.
                    let _ = stream.write_all(&response).await;
                    let _ = stream.shutdown().await;
                }
            });
            Self {
                addr,
                hits,
                request_lines,
                task,
            }
        }

        fn url(&self, path: &str) -> String {
            format!("http://{}{path}", self.addr)
        }

        fn hits(&self) -> usize {
            self.hits.load(Ordering::SeqCst)
        }
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (name, value) in headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut out = out.into_bytes();
        out.extend_from_slice(body);
        out
    }

    fn permissive() -> ToolPermissions {
        ToolPermissions {
            web_fetch_allow_private: true,
            ..ToolPermissions::default()
        }
    }

    async fn run(tool: &dyn Tool, args: Value) -> Result<ToolResult, ToolError> {
        tokio::time::timeout(WAIT, tool.execute(&args))
            .await
            .expect("the call finished in time")
    }

    fn model_error(result: Result<ToolResult, ToolError>) -> (&'static str, String) {
        match result {
            Err(ToolError::Model { kind, message }) => (kind, message),
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    fn metadata(result: &ToolResult) -> &Value {
        result.structured_metadata.as_ref().expect("metadata")
    }

    #[test]
    fn forbidden_address_table() {
        let cases: &[(&str, bool)] = &[
            ("127.0.0.1", true),
            ("127.255.0.9", true),
            ("10.1.2.3", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("172.32.0.1", false),
            ("192.168.1.1", true),
            ("169.254.169.254", true),
            ("169.254.10.10", true),
            ("100.64.0.1", true),
            ("100.127.255.255", true),
            ("100.128.0.1", false),
            ("0.0.0.0", true),
            ("0.1.2.3", true),
            ("255.255.255.255", true),
            ("224.0.0.1", true),
            ("8.8.8.8", false),
            ("93.184.215.14", false),
            ("::1", true),
            ("::", true),
            ("fc00::1", true),
            ("fd00:ec2::254", true),
            ("fe80::1", true),
            ("febf::1", true),
            ("ff02::1", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.0.0.1", true),
            ("::ffff:169.254.169.254", true),
            ("::ffff:8.8.8.8", false),
            ("::127.0.0.1", true),
            ("64:ff9b::a00:1", true),
            ("64:ff9b::808:808", false),
            ("2002:7f00:1::", true),
            ("2002:808:808::", false),
            ("2001:4860:4860::8888", false),
            ("2606:4700::1111", false),
            // TEST-NET-1, -2, -3 and their edges.
            ("192.0.2.0", true),
            ("192.0.2.2", true),
            ("192.0.2.255", true),
            ("192.0.3.1", false),
            ("192.0.1.255", false),
            ("198.51.100.7", true),
            ("198.51.101.1", false),
            ("198.51.99.1", false),
            ("203.0.113.9", true),
            ("203.0.114.1", false),
            ("203.0.112.1", false),
            ("2001:db8::1", true),
            ("2001:db9::1", false),
            // IPv4-translated (SIIT) ::ffff:0:0/96.
            ("::ffff:0:127.0.0.1", true),
            ("::ffff:0:10.0.0.1", true),
            ("::ffff:0:192.0.2.2", true),
            ("::ffff:0:8.8.8.8", false),
            // Every embedding of a TEST-NET address.
            ("::ffff:192.0.2.2", true),
            ("::192.0.2.2", true),
            ("64:ff9b::c000:202", true),
            ("64:ff9b::cb00:7101", true),
            ("64:ff9b::c633:6401", true),
            ("2002:c000:202::", true),
            ("::ffff:203.0.113.1", true),
            ("::ffff:198.51.100.1", true),
        ];
        for (text, forbidden) in cases {
            let ip: IpAddr = text.parse().expect("test address parses");
            assert_eq!(is_forbidden(ip), *forbidden, "is_forbidden({text})");
        }
    }

    /// The IPv6 forms an IPv4 address can take to reach it.
    fn embeddings(v4: Ipv4Addr) -> Vec<IpAddr> {
        let [a, b, c, d] = v4.octets();
        let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
        vec![
            IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1)),
        ]
    }

    #[test]
    fn a_host_address_is_refused_in_every_form_whatever_its_range() {
        let public = Ipv4Addr::new(8, 8, 8, 8);
        let public_v6: IpAddr = "2606:4700::1111".parse().unwrap();
        let guard = AddressGuard {
            host_addresses: Some(vec![IpAddr::V4(public), public_v6]),
            ..AddressGuard::default()
        };
        let mut refused = embeddings(public);
        refused.extend([IpAddr::V4(public), public_v6]);
        for ip in refused {
            let url = Url::parse(&format!("http://{}/", SocketAddr::new(ip, 80))).unwrap();
            match guard.check_url(&url) {
                Err(refusal @ Refusal::OwnAddress { .. }) => {
                    assert_eq!(refusal.kind(), "forbidden_address");
                    assert!(refusal.to_string().contains("own network interfaces"));
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        for ip in ["8.8.4.4", "::ffff:8.8.4.4", "2606:4700::1001"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(
                guard.check_address(ip, "x", &[public.into()]).is_ok(),
                "{ip}"
            );
        }
        let allowing = AddressGuard {
            allow_private: true,
            ..guard
        };
        let url = Url::parse("http://8.8.8.8/").unwrap();
        assert!(allowing.check_url(&url).is_ok());
    }

    #[test]
    fn every_address_of_this_machine_is_refused_in_every_form() {
        let own = host_addresses::interface_addresses().unwrap();
        assert!(!own.is_empty());
        let guard = AddressGuard::default();
        for ip in &own {
            let mut forms = vec![*ip];
            if let IpAddr::V4(v4) = ip {
                forms.extend(embeddings(*v4));
            }
            for form in forms {
                assert!(
                    guard.check_address(form, "x", &own).is_err(),
                    "{form} (of {ip})"
                );
            }
        }
    }

    /// A server listening on one of this machine's non-loopback interface addresses (in a
    /// documentation range here, which is how such an address slipped through) is never
    /// contacted.
    #[tokio::test]
    async fn an_interface_address_of_this_machine_is_refused_before_sending() {
        let own = host_addresses::interface_addresses().unwrap();
        let ip = own
            .iter()
            .find(|ip| matches!(ip, IpAddr::V4(v4) if !v4.is_loopback()))
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let tool = WebFetch::new(&ToolPermissions::default());
        let (kind, message) =
            model_error(run(&tool, json!({"url": format!("http://{addr}/")})).await);
        assert_eq!(kind, "forbidden_address", "{message}");
        assert!(message.contains(&ip.to_string()), "{message}");
        // The first connection the listener sees must be this probe, made after the fetch.
        let probe = tokio::net::TcpStream::connect(addr).await.expect("probe");
        let (_, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer, probe.local_addr().expect("probe addr"));
    }

    #[tokio::test]
    async fn html_becomes_readable_text_with_links() {
        let html = b"<!DOCTYPE html><html><head><title>T</title><style>p{color:red}</style></head>\
            <body><h1>Release notes</h1><p>Version <b>2.0</b> is out. \
            Read the <a href=\"/docs/guide\">guide</a> or the \
            <a href=\"https://example.org/faq\">FAQ</a>.</p></body></html>";
        let server = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "text/html; charset=utf-8")],
            html,
        ))
        .await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/page")}))
            .await
            .expect("fetch");
        assert!(result.success, "{}", result.output);
        let first = result.output.lines().next().expect("header line");
        assert!(first.contains(&server.url("/page")), "{first}");
        assert!(
            first.contains("200") && first.contains("text/html"),
            "{first}"
        );
        assert!(result.output.contains("Release notes"), "{}", result.output);
        assert!(result.output.contains("Version"), "{}", result.output);
        assert!(!result.output.contains("<p>"), "{}", result.output);
        assert!(!result.output.contains("color:red"), "{}", result.output);
        assert!(
            result.output.contains(&server.url("/docs/guide")),
            "relative link made absolute: {}",
            result.output
        );
        assert!(
            result.output.contains("https://example.org/faq"),
            "{}",
            result.output
        );
        let meta = metadata(&result);
        assert_eq!(meta["status"], 200);
        assert_eq!(meta["bytes"], html.len());
        assert_eq!(meta["truncated"], false);
        assert_eq!(meta["url"], server.url("/page"));
        assert_eq!(server.hits(), 1);
    }

    #[tokio::test]
    async fn untyped_html_is_sniffed() {
        let server = TestServer::start(response(
            "200 OK",
            &[],
            b"<html><body><p>Sniffed</p></body></html>",
        ))
        .await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/")}))
            .await
            .expect("fetch");
        assert!(result.output.contains("Sniffed"), "{}", result.output);
        assert!(!result.output.contains("<p>"), "{}", result.output);
    }

    #[tokio::test]
    async fn plain_text_and_json_are_returned_as_is() {
        let text = "line one\n<not html> & raw\n";
        let server = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "text/plain")],
            text.as_bytes(),
        ))
        .await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/a.txt")}))
            .await
            .expect("fetch");
        assert!(result.success);
        assert!(result.output.ends_with(text), "{}", result.output);
        assert_eq!(metadata(&result)["content_type"], "text/plain");

        let body = r#"{"a": [1, 2], "b": "<x>"}"#;
        let server = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await;
        let result = run(&tool, json!({"url": server.url("/a.json")}))
            .await
            .expect("fetch");
        assert!(result.output.ends_with(body), "{}", result.output);
    }

    #[tokio::test]
    async fn binary_bodies_are_described_not_shown() {
        let png = [0x89u8, b'P', b'N', b'G', 0, 0, 0, 13, 1, 2, 3];
        let server =
            TestServer::start(response("200 OK", &[("Content-Type", "image/png")], &png)).await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/i.png")}))
            .await
            .expect("fetch");
        assert!(result.success);
        assert!(
            result
                .output
                .contains("binary content of type image/png, 11 bytes"),
            "{}",
            result.output
        );
        assert!(!result.output.contains("PNG"), "{}", result.output);
        assert_eq!(metadata(&result)["bytes"], 11);
    }

    #[tokio::test]
    async fn not_found_is_unsuccessful_with_excerpt() {
        let server = TestServer::start(response(
            "404 Not Found",
            &[("Content-Type", "text/plain")],
            b"no such page here",
        ))
        .await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/missing")}))
            .await
            .expect("fetch");
        assert!(!result.success);
        assert!(result.output.contains("404"), "{}", result.output);
        assert!(
            result.output.contains("no such page here"),
            "{}",
            result.output
        );
        assert_eq!(metadata(&result)["status"], 404);
    }

    #[tokio::test]
    async fn body_over_max_bytes_is_truncated() {
        let body = "x".repeat(200_000);
        let server = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "text/plain")],
            body.as_bytes(),
        ))
        .await;
        let tool = WebFetch::new(&permissive());
        let result = run(&tool, json!({"url": server.url("/big"), "max_bytes": 1000}))
            .await
            .expect("fetch");
        assert!(result.success);
        let meta = metadata(&result);
        assert_eq!(meta["truncated"], true);
        assert_eq!(meta["bytes"], 1000);
        assert!(result.output.contains("[truncated"), "{}", result.output);
        assert!(result.output.contains(&"x".repeat(1000)));
        assert!(!result.output.contains(&"x".repeat(1001)));

        let exact = run(
            &tool,
            json!({"url": server.url("/big"), "max_bytes": 200_000}),
        )
        .await
        .expect("fetch");
        assert_eq!(metadata(&exact)["truncated"], false);
        assert_eq!(metadata(&exact)["bytes"], 200_000);
    }

    #[tokio::test]
    async fn max_bytes_zero_and_bad_urls_are_invalid_input() {
        let tool = WebFetch::new(&ToolPermissions::default());
        let (kind, _) =
            model_error(run(&tool, json!({"url": "http://example.com/", "max_bytes": 0})).await);
        assert_eq!(kind, "invalid_input");
        let (kind, message) = model_error(run(&tool, json!({"url": "not a url"})).await);
        assert_eq!(kind, "invalid_input");
        assert!(message.contains("not a valid absolute URL"), "{message}");
        let (kind, _) = model_error(run(&tool, json!({"link": "http://example.com/"})).await);
        assert_eq!(kind, "invalid_input");
    }

    #[tokio::test]
    async fn other_schemes_are_refused() {
        let tool = WebFetch::new(&permissive());
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/x",
            "gopher://example.com/",
        ] {
            let (kind, message) = model_error(run(&tool, json!({"url": url})).await);
            assert_eq!(kind, "invalid_input", "{url}");
            assert!(message.contains("only fetches http and https"), "{message}");
        }
    }

    #[tokio::test]
    async fn literal_forbidden_addresses_are_refused_before_sending() {
        let server = TestServer::start(response("200 OK", &[], b"secret")).await;
        let port = server.addr.port();
        let tool = WebFetch::new(&ToolPermissions::default());
        let cases = [
            (format!("http://127.0.0.1:{port}/"), "127.0.0.1"),
            (format!("http://[::1]:{port}/"), "::1"),
            (
                format!("http://[::ffff:127.0.0.1]:{port}/"),
                "::ffff:127.0.0.1",
            ),
            (format!("http://0x7f000001:{port}/"), "127.0.0.1"),
            ("http://10.0.0.1/".to_owned(), "10.0.0.1"),
            ("http://192.168.0.1:8080/admin".to_owned(), "192.168.0.1"),
            (
                "http://169.254.169.254/latest/meta-data/".to_owned(),
                "169.254.169.254",
            ),
            ("http://[fd00:ec2::254]/".to_owned(), "fd00:ec2::254"),
        ];
        for (url, address) in cases {
            let (kind, message) = model_error(run(&tool, json!({"url": url})).await);
            assert_eq!(kind, "forbidden_address", "{url}: {message}");
            assert!(message.contains(address), "{url}: {message}");
        }
        assert_eq!(server.hits(), 0);
    }

    #[tokio::test]
    async fn redirect_to_forbidden_address_is_refused() {
        let target = TestServer::start(response("200 OK", &[], b"internal")).await;
        let location = target.url("/internal");
        let first = TestServer::start(response("302 Found", &[("Location", &location)], b"")).await;
        let tool = WebFetch::with_allowed_addresses(&ToolPermissions::default(), vec![first.addr]);

        let (kind, message) = model_error(run(&tool, json!({"url": first.url("/start")})).await);
        assert_eq!(kind, "forbidden_address", "{message}");
        assert!(message.contains("127.0.0.1"), "{message}");
        assert_eq!(first.hits(), 1);
        assert_eq!(
            target.hits(),
            0,
            "the redirect target must never be contacted"
        );

        // The same chain goes through once the second hop is allowed too, so the refusal above
        // came from the hop check and not from a broken server.
        let both = WebFetch::with_allowed_addresses(
            &ToolPermissions::default(),
            vec![first.addr, target.addr],
        );
        let result = run(&both, json!({"url": first.url("/start")}))
            .await
            .expect("fetch");
        assert!(result.success, "{}", result.output);
        assert!(result.output.contains("internal"));
        assert_eq!(metadata(&result)["url"], location);
        assert_eq!(target.hits(), 1);
    }

    #[tokio::test]
    async fn redirects_are_limited() {
        let server = TestServer::start_with(|addr| {
            let own = format!("http://{addr}/again");
            response("302 Found", &[("Location", &own)], b"")
        })
        .await;
        let tool = WebFetch::new(&permissive());
        let (kind, message) = model_error(run(&tool, json!({"url": server.url("/")})).await);
        assert_eq!(kind, "limit_reached", "{message}");
        assert!(message.contains("redirects"), "{message}");
        assert_eq!(server.hits(), MAX_REDIRECTS + 1);
    }

    #[tokio::test]
    async fn host_name_resolving_to_loopback_is_refused() {
        let server = TestServer::start(response("200 OK", &[], b"secret")).await;
        let tool = WebFetch::new(&ToolPermissions::default());
        let url = format!("http://localhost:{}/", server.addr.port());
        let (kind, message) = model_error(run(&tool, json!({"url": url})).await);
        assert_eq!(kind, "forbidden_address", "{message}");
        assert!(message.contains("localhost"), "{message}");
        assert_eq!(server.hits(), 0);

        let allowed = WebFetch::new(&permissive());
        let result = run(&allowed, json!({"url": url})).await.expect("fetch");
        assert!(result.success, "{}", result.output);
        assert_eq!(server.hits(), 1);
    }

    #[tokio::test]
    async fn web_search_is_unsupported_without_backend() {
        let tool = WebSearch::new(&ToolPermissions::default());
        let (kind, message) = model_error(run(&tool, json!({"query": "rust"})).await);
        assert_eq!(kind, "unsupported");
        assert!(message.contains("web_search"), "{message}");
    }

    #[tokio::test]
    async fn web_search_lists_backend_results() {
        let answer = json!({
            "query": "rust async",
            "results": [
                {"title": "Async Book", "url": "https://rust-lang.github.io/async-book/",
                 "content": "Asynchronous programming in Rust.", "engine": "x"},
                {"title": "Tokio", "url": "https://tokio.rs/", "content": null}
            ]
        });
        let server = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "application/json")],
            answer.to_string().as_bytes(),
        ))
        .await;
        let tool = WebSearch::new(&ToolPermissions {
            web_search_url: Some(server.url("/search")),
            ..ToolPermissions::default()
        });
        let result = run(&tool, json!({"query": "rust async"}))
            .await
            .expect("search");
        assert!(result.success, "{}", result.output);
        assert!(result.output.contains("1. Async Book"), "{}", result.output);
        assert!(
            result
                .output
                .contains("https://rust-lang.github.io/async-book/")
        );
        assert!(result.output.contains("Asynchronous programming in Rust."));
        assert!(
            result.output.contains("2. Tokio\n   https://tokio.rs/"),
            "{}",
            result.output
        );
        let results = metadata(&result)["results"].as_array().expect("results");
        assert_eq!(results.len(), 2);
        assert_eq!(results[1]["url"], "https://tokio.rs/");
        let lines = server.request_lines.lock().expect("lines").clone();
        assert_eq!(lines, ["GET /search?q=rust+async&format=json HTTP/1.1"]);
    }

    #[tokio::test]
    async fn web_search_backend_errors_are_unsuccessful() {
        let broken = TestServer::start(response(
            "200 OK",
            &[("Content-Type", "application/json")],
            b"<html>not json</html>",
        ))
        .await;
        let tool = WebSearch::new(&ToolPermissions {
            web_search_url: Some(broken.url("/search")),
            ..ToolPermissions::default()
        });
        let result = run(&tool, json!({"query": "x"})).await.expect("search");
        assert!(!result.success);
        assert!(
            result.output.contains("not the expected JSON"),
            "{}",
            result.output
        );

        let failing = TestServer::start(response("502 Bad Gateway", &[], b"upstream down")).await;
        let tool = WebSearch::new(&ToolPermissions {
            web_search_url: Some(failing.url("/search")),
            ..ToolPermissions::default()
        });
        let result = run(&tool, json!({"query": "x"})).await.expect("search");
        assert!(!result.success);
        assert!(result.output.contains("502"), "{}", result.output);
        assert!(result.output.contains("upstream down"), "{}", result.output);
    }

    #[test]
    fn tools_describe_themselves() {
        let fetch = WebFetch::new(&ToolPermissions::default());
        let search = WebSearch::new(&ToolPermissions::default());
        for tool in [&fetch as &dyn Tool, &search as &dyn Tool] {
            assert_eq!(tool.tags(), ["web"]);
            assert_eq!(tool.concurrency_class(), ConcurrencyClass::Safe);
            let schema = tool.input_schema();
            assert_eq!(schema["additionalProperties"], false);
            for (name, property) in schema["properties"].as_object().expect("properties") {
                assert!(
                    property["description"].is_string(),
                    "{name} has a description"
                );
            }
            let workspace_dir = tempfile::tempdir().expect("tempdir");
            let workspace = crate::tools::Workspace::new(workspace_dir.path());
            assert!(tool.rebind_cwd(&workspace).is_none());
        }
    }
}
