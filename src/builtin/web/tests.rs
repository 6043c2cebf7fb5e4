//! Tests of `web_fetch` and `web_search` against a loopback HTTP server: rendering, limits,
//! refusals before anything is sent, redirects and the search backend.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{MAX_REDIRECTS, WebFetch, WebSearch, host_addresses};
use crate::builtin::ToolPermissions;
use crate::tools::{ConcurrencyClass, Tool, ToolContext, ToolError, ToolResult};

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
    tokio::time::timeout(WAIT, tool.call(&ToolContext::detached("."), &args))
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
    let (kind, message) = model_error(run(&tool, json!({"url": format!("http://{addr}/")})).await);
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
