//! The server's limits, each tested by breaking it: connection caps and the health allowance,
//! header and idle timeouts, TCP_NODELAY, the 4 MiB frame cap and the memory partial frames
//! may hold, stalled frames, the per-session in-flight cap, the stored-argument cap and
//! JSON-RPC ids echoed as sent.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use agentd::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, Semaphore};

use crate::support::wire::{self, RawWs, ServerFrame};
use crate::support::{ServerProcess, TestApp, WAIT};

/// The tests that open thousands of sockets or hundreds of MiB run one at a time, so one's
/// descriptors and memory do not show up in the other's figures.
static HEAVY: Mutex<()> = Mutex::const_new(());

#[tokio::test]
async fn accepted_sockets_have_tcp_nodelay() {
    let app = TestApp::spawn().await;
    let mut client = wire::connect(app.addr).await;
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", app.addr);
    client.write_all(request.as_bytes()).await.unwrap();
    // An answer means the server has accepted the connection and set it up.
    let mut answer = [0u8; 512];
    let read = tokio::time::timeout(WAIT, client.read(&mut answer)).await;
    assert!(matches!(read, Ok(Ok(n)) if n > 0), "answered");
    assert_eq!(wire::server_side_nodelay(&client), Some(true));
    // And after an upgrade, which keeps the same socket.
    let ws = RawWs::open(app.addr).await;
    assert_eq!(wire::server_side_nodelay(&ws.stream), Some(true));
}

#[tokio::test]
async fn a_flood_of_idle_connections_leaves_health_checks_answering() {
    let _heavy = HEAVY.lock().await;
    // 2,000 full connections and the flood past them: about 4,600 descriptors in this
    // process (both ends of each connection are ours), well under its limit of 20,000.
    const CAP: usize = 2_000;
    let app = TestApp::spawn_with(|c| {
        c.server.max_connections = CAP;
        // Long enough that nothing times out while the test runs.
        c.server.header_timeout_secs = 300;
    })
    .await;
    // A WebSocket from before the flood keeps working through it.
    let mut ws = app.ws().await;
    let session = ws.open().await;

    let mut held = Vec::new();
    for n in 0..CAP - 1 {
        let mut stream = wire::connect(app.addr).await;
        if n % 100 == 0 {
            // Every hundredth sends half its headers and stops.
            let half = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\nX-Slow: ", app.addr);
            stream.write_all(half.as_bytes()).await.unwrap();
        }
        held.push(stream);
    }
    // Past the cap: three times the allowance of idle connections, each evicting the oldest.
    for _ in 0..3 * agentd::http::accept::HEALTH_ALLOWANCE {
        held.push(wire::connect(app.addr).await);
    }

    // Connections are accepted in order, so these come after every held one.
    let (status, body) = wire::http_get(app.addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, body) = wire::http_get(app.addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = wire::http_get(app.addr, "/api/sessions").await;
    assert_eq!(status, 503, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "overloaded", "{body}");
    assert!(error["error"]["message"].is_string());
    assert_eq!(app.ws_with(None, None).await.err(), Some(503));
    // The probes were answered and closed; the idle flood is still there.
    let (status, _) = wire::http_get(app.addr, "/healthz").await;
    assert_eq!(status, 200);

    let tools = ws.result("tool/list", json!({"session_id": session})).await;
    assert!(tools["active"].is_array());
    drop(held);
    app.stop().await;
}

/// Holds `count` idle connections to `addr` from a process of its own (a descriptor limit is
/// per process); prints `held` once they are open and keeps them until its stdin closes.
const HOLDER: &str = r#"
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = [socket.create_connection((host, port)) for _ in range(count)]
print("held", len(held), flush=True)
sys.stdin.read()
"#;

#[tokio::test]
async fn twenty_five_thousand_idle_connections_leave_health_checks_answering() {
    let _heavy = HEAVY.lock().await;
    // The server runs alone in its process with the default cap, derived from its own
    // descriptor limit (20,000 here: fewer than the flood), as a deployment would.
    const PER_PROCESS: usize = 12_500;
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), "header_timeout_secs = 300\n");
    let addr = server.addr;

    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            HOLDER,
            &addr.ip().to_string(),
            &addr.port().to_string(),
        ])
        .arg(PER_PROCESS.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut held = Vec::with_capacity(PER_PROCESS);
    for _ in 0..PER_PROCESS {
        held.push(wire::connect(addr).await);
    }
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), format!("held {PER_PROCESS}"));

    let (status, body) = wire::http_get(addr, "/healthz").await;
    let (ready, ready_body) = wire::http_get(addr, "/readyz").await;
    drop(held);
    drop(holder.stdin.take());
    let _ = holder.wait();
    drop(server);
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    assert_eq!(ready, 200, "{ready_body}");
}

#[tokio::test]
async fn headers_and_idle_connections_time_out() {
    let app = TestApp::spawn_with(|c| c.server.header_timeout_secs = 1).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let started = Instant::now();

    let mut silent = wire::connect(app.addr).await;
    let mut half = wire::connect(app.addr).await;
    let head = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\nX-Slow: ", app.addr);
    half.write_all(head.as_bytes()).await.unwrap();
    let mut kept_alive = wire::connect(app.addr).await;
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", app.addr);
    kept_alive.write_all(request.as_bytes()).await.unwrap();

    for (what, stream) in [
        ("a connection that never sends", &mut silent),
        ("half-sent headers", &mut half),
        ("an idle keep-alive connection", &mut kept_alive),
    ] {
        let seen = wire::read_to_close(stream, WAIT)
            .await
            .unwrap_or_else(|_| panic!("{what} is closed"));
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{what} was closed before its timeout"
        );
        if what.contains("keep-alive") {
            let text = String::from_utf8_lossy(&seen);
            assert!(text.starts_with("HTTP/1.1 200"), "answered first: {text}");
        }
    }
    // A WebSocket is not an idle HTTP connection: it outlives the header timeout.
    let tools = ws.result("tool/list", json!({"session_id": session})).await;
    assert!(tools["active"].is_array());
}

#[tokio::test]
async fn frames_over_4_mib_are_refused_from_their_header() {
    let _heavy = HEAVY.lock().await;
    const CAP: usize = 4 * 1024 * 1024;
    let app = TestApp::spawn().await;
    // Exactly the cap is a message like any other.
    let mut ws = RawWs::open(app.addr).await;
    let prefix = r#"{"jsonrpc":"2.0","id":1,"method":"no/such","params":""#;
    let suffix = r#""}"#;
    let padding = "x".repeat(CAP - prefix.len() - suffix.len());
    ws.send_text(&format!("{prefix}{padding}{suffix}")).await;
    match ws.next_frame().await {
        Some(ServerFrame::Text(text)) => assert!(text.contains("-32601"), "{text}"),
        other => panic!("expected an answer, got {other:?}"),
    }
    // One byte more is refused from the header alone: nothing of it is read or buffered.
    assert!(ws.write(&RawWs::text_header(CAP as u64 + 1)).await);
    assert_eq!(ws.close_code().await, Some(1009));
}

#[tokio::test]
async fn partial_frames_hold_at_most_the_cap_each() {
    let _heavy = HEAVY.lock().await;
    const CONNECTIONS: usize = 100;
    const CAP: usize = 4 * 1024 * 1024;
    // Small socket buffers: once a client's write returns, the server has read all but
    // about 64 + 128 KiB of it, so what it holds is what it read.
    let listener = wire::listener_with_receive_buffer(64 * 1024);
    let app = TestApp::spawn_on(listener, |_| {}).await;
    let payload = vec![b'a'; 2 * CAP];
    let mut under = Vec::new();
    let mut over = Vec::new();
    for _ in 0..CONNECTIONS {
        let stream = wire::connect_with_send_buffer(app.addr, 64 * 1024).await;
        under.push(RawWs::handshake(stream, app.addr).await);
        let stream = wire::connect_with_send_buffer(app.addr, 64 * 1024).await;
        over.push(RawWs::handshake(stream, app.addr).await);
    }
    let before = wire::rss_bytes();

    // Each announces exactly the cap and sends all of it but the last byte.
    for ws in &mut under {
        assert!(ws.write(&RawWs::text_header(CAP as u64)).await);
        assert!(ws.write(&payload[..CAP - 1]).await);
    }
    let after_under = wire::rss_bytes();
    // Each announces twice the cap and tries to send it all; the server refuses it from its
    // header and only drains (never keeps) the rest while it closes.
    for ws in &mut over {
        let _ = ws.write(&RawWs::text_header(2 * CAP as u64)).await;
        let _ = ws.write(&payload[..2 * CAP - 1]).await;
    }
    let after_over = wire::rss_bytes();

    const MIB: u64 = 1024 * 1024;
    let held = after_under.saturating_sub(before);
    let refused = after_over.saturating_sub(after_under);
    eprintln!(
        "partial frames: {CONNECTIONS} under the cap added {} MiB of RSS, {CONNECTIONS} over it {} MiB",
        held / MIB,
        refused / MIB
    );
    // The bound: the socket layer reserves the announced length (at most the cap) when it
    // reads a frame header and fills it as bytes arrive, so a partial frame holds what has
    // arrived, at most 4 MiB, plus its 4 KiB read buffer and the connection's own state; 64 KiB
    // each covers those, and 48 MiB the allocator's rounding and whatever else this test
    // process does meanwhile. Buffering frames up to 16 MiB, as before, makes the refused
    // group alone add 800 MiB; they should add nothing but their lingering closes' buffers.
    let bound = CONNECTIONS as u64 * (CAP as u64 + 64 * 1024) + 48 * MIB;
    assert!(
        held <= bound,
        "{held} bytes for partial frames, bound {bound}"
    );
    assert!(
        refused <= 48 * MIB,
        "{refused} bytes for refused frames; nothing of them should be kept"
    );
    for ws in &mut over {
        assert_eq!(ws.close_code().await, Some(1009));
    }
    drop(under);
}

#[tokio::test]
async fn a_stalled_frame_is_dropped_and_a_quiet_client_is_not() {
    let app = TestApp::spawn_with(|c| c.server.ws_ping_secs = 1).await;
    let mut quiet = app.ws().await;
    let session = quiet.open().await;
    let started = Instant::now();

    let mut stalled = RawWs::open(app.addr).await;
    assert!(stalled.write(&RawWs::text_header(1000)).await);
    assert!(stalled.write(b"{\"jsonrpc\":").await);
    // It cannot answer the ping from inside its frame, so it is pinged, then closed.
    let watch_stalled = async {
        assert_eq!(stalled.next_frame().await, Some(ServerFrame::Ping));
        assert_eq!(stalled.close_code().await, Some(1008));
        assert!(
            stalled.next_frame().await.is_none(),
            "then the socket closes"
        );
    };
    tokio::select! {
        // The well-behaved client reads meanwhile, and so answers its pings.
        frame = quiet.next() => panic!("the quiet client got {frame:?}"),
        () = watch_stalled => {}
    }
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let tools = quiet
        .result("tool/list", json!({"session_id": session}))
        .await;
    assert!(
        tools["active"].is_array(),
        "the quiet client is still connected"
    );
}

/// A Safe tool that waits until the test lets it finish.
struct Gate(Arc<Semaphore>);

#[async_trait]
impl Tool for Gate {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "gate",
                "Waits until released.",
                json!({"type": "object"}),
                Effects::NONE,
            )
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        match tokio::time::timeout(WAIT, self.0.acquire()).await {
            Ok(Ok(permit)) => {
                permit.forget();
                Ok(ToolResult::ok("released"))
            }
            _ => Ok(ToolResult::failure("never released")),
        }
    }
}

#[tokio::test]
async fn tool_calls_past_the_in_flight_cap_are_overloaded() {
    let gate = Arc::new(Semaphore::new(0));
    let app = TestApp::spawn_with_tools(|_| {}, vec![Arc::new(Gate(Arc::clone(&gate)))]).await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let other = ws.open().await;
    let invoke =
        |session: &str, name: &str| json!({"session_id": session, "name": name, "arguments": {}});
    let mut ids = Vec::new();
    for _ in 0..32 {
        ids.push(ws.send("tool/invoke", invoke(&session, "gate")).await);
    }
    let mut started = 0;
    while started < 32 {
        let message = ws.next_json().await;
        assert!(message.get("id").is_none(), "no answer yet: {message}");
        if message["method"] == "tool/started" {
            started += 1;
        }
    }
    // The 33rd, from another connection: the cap is the session's.
    let mut second = app.ws().await;
    let (_, refused) = second.call("tool/invoke", invoke(&session, "gate")).await;
    assert_eq!(refused["error"]["code"], -32001, "{refused}");
    assert_eq!(refused["error"]["data"]["kind"], "overloaded");
    // Another session is not held up.
    let (_, answer) = second.call("tool/invoke", invoke(&other, "list_dir")).await;
    assert_eq!(answer["result"]["success"], true, "{answer}");

    gate.add_permits(32);
    let mut answered = 0;
    while answered < 32 {
        let message = ws.next_json().await;
        if let Some(id) = message.get("id") {
            assert!(ids.contains(&id.as_u64().unwrap()));
            assert_eq!(message["result"]["output"], "released", "{message}");
            answered += 1;
        }
    }
    gate.add_permits(1);
    let result = ws.invoke(&session, "gate", json!({})).await;
    assert_eq!(
        result["output"], "released",
        "room again once calls have finished"
    );
}

#[tokio::test]
async fn stored_tool_arguments_are_capped_and_the_call_gets_them_whole() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    let session = ws.open().await;
    let content = "0123456789".repeat(20_000);
    let arguments = json!({"path": "big.txt", "content": content});
    let result = ws.invoke(&session, "write_file", arguments.clone()).await;
    assert_eq!(result["success"], true, "{result}");
    let written = std::fs::read_to_string(app.workspace().join("big.txt")).unwrap();
    assert_eq!(written, content, "the tool got every byte");
    let small = json!({"path": "small.txt", "content": "hi"});
    ws.invoke(&session, "write_file", small.clone()).await;

    let events = app
        .get_json(&format!("/api/sessions/{session}/events"), None)
        .await;
    let started: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "tool/started")
        .map(|e| &e["params"]["arguments"])
        .collect();
    assert_eq!(started.len(), 2);
    let full = arguments.to_string();
    let marker = started[0];
    assert_eq!(marker["truncated"], true, "{marker}");
    assert_eq!(marker["original_bytes"], full.len());
    let preview = marker["preview"].as_str().unwrap();
    assert!(full.starts_with(preview));
    assert_eq!(
        marker["omitted_bytes"].as_u64().unwrap() as usize,
        full.len() - preview.len()
    );
    assert!(marker.to_string().len() <= 64 * 1024);
    assert_eq!(started[1], &small, "small arguments are stored as they are");
}

#[tokio::test]
async fn request_ids_are_echoed_exactly_as_sent() {
    let app = TestApp::spawn().await;
    let mut ws = app.ws().await;
    for id in [
        "123456789012345678901234567890",
        "-98765432109876543210.5e-3",
        "1.50",
        r#""a\u0041""#,
        "null",
        r#"{"nested": [1, 2]}"#,
    ] {
        ws.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"no/such"}}"#
        ))
        .await;
        let reply = ws.next_text().await;
        let expected = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"unknown method \"no/such\"","data":{{"kind":"method_not_found"}}}}}}"#
        );
        assert_eq!(reply, expected);
    }
    // A batch is still refused as a whole, with a null id.
    ws.send_text(r#"[{"jsonrpc":"2.0","id":1,"method":"tool/list"}]"#)
        .await;
    let reply: Value = serde_json::from_str(&ws.next_text().await).unwrap();
    assert_eq!(reply["id"], Value::Null);
    assert_eq!(reply["error"]["code"], -32600);
    assert_eq!(reply["error"]["data"]["kind"], "batch_unsupported");
    // An id that does not decode (a lone surrogate, a number past every float: both found by
    // the frame fuzzer) is a parse error answered to `null`, never copied into an answer no
    // strict reader can parse.
    for id in [r#""\uD890x""#, r#"{"k": ["\udc00"]}"#, "1e400", "-1e999"] {
        ws.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tool/list"}}"#
        ))
        .await;
        let reply: Value = serde_json::from_str(&ws.next_text().await).unwrap();
        assert_eq!(reply["id"], Value::Null, "{reply}");
        assert_eq!(reply["error"]["code"], -32700, "{reply}");
    }
}

/// Opens a session as the client's user; the whole answer.
async fn open_as(ws: &mut crate::support::WsClient) -> Value {
    ws.call("session/open", json!({})).await.1
}

#[tokio::test]
async fn one_user_cannot_keep_more_sessions_than_the_quota_and_others_are_untouched() {
    let app = TestApp::spawn_with(|c| {
        crate::support::alice_and_bob(c);
        c.server.max_sessions_per_user = 3;
        c.server.session_creates_per_minute = 0;
    })
    .await;
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let mut alices = Vec::new();
    for _ in 0..3 {
        let opened = open_as(&mut alice).await;
        alices.push(opened["result"]["session_id"].as_str().unwrap().to_string());
    }
    let refused = open_as(&mut alice).await;
    assert_eq!(
        refused["error"]["data"]["kind"], "quota_exceeded",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_sessions_per_user (3)"), "{message}");
    // A fork is a session too.
    let (_, fork) = alice
        .call("session/fork", json!({"session_id": alices[0]}))
        .await;
    assert_eq!(fork["error"]["data"]["kind"], "quota_exceeded", "{fork}");
    // So is one made over REST: 429 with the same kind.
    let (status, body) = app
        .request(reqwest::Method::POST, "/api/sessions", Some("alice-token"))
        .await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("quota_exceeded"), "{body}");
    // Bob's quota is his own.
    let bobs = open_as(&mut bob).await;
    assert!(bobs["result"]["session_id"].is_string(), "{bobs}");
    // A deleted session makes room again.
    let (status, _) = app
        .request(
            reqwest::Method::DELETE,
            &format!("/api/sessions/{}", alices[2]),
            Some("alice-token"),
        )
        .await;
    assert_eq!(status, 204);
    let again = open_as(&mut alice).await;
    assert!(again["result"]["session_id"].is_string(), "{again}");
}

#[tokio::test]
async fn a_flood_of_new_sessions_is_held_to_the_per_minute_rate_per_user() {
    let app = TestApp::spawn_with(|c| {
        crate::support::alice_and_bob(c);
        c.server.session_creates_per_minute = 5;
    })
    .await;
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let mut made = 0;
    let mut refusal = Value::Null;
    for _ in 0..50 {
        let answer = open_as(&mut alice).await;
        if answer["result"]["session_id"].is_string() {
            made += 1;
        } else {
            refusal = answer;
        }
    }
    assert_eq!(made, 5, "a burst of a minute's worth, then refusals");
    assert_eq!(
        refusal["error"]["data"]["kind"], "quota_exceeded",
        "{refusal}"
    );
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session_creates_per_minute"),
        "{refusal}"
    );
    let listed = app.get_json("/api/sessions", Some("alice-token")).await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 5);
    // Bob is not held back by Alice's flood.
    let bobs = open_as(&mut bob).await;
    assert!(bobs["result"]["session_id"].is_string(), "{bobs}");
}

#[tokio::test]
async fn the_session_list_pages_with_a_cursor_and_never_shows_another_users() {
    let app = TestApp::spawn_with(crate::support::alice_and_bob).await;
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    for _ in 0..5 {
        open_as(&mut alice).await;
    }
    open_as(&mut bob).await;
    let all = app.get_json("/api/sessions", Some("alice-token")).await;
    let expected: Vec<Value> = all["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].clone())
        .collect();
    assert_eq!(expected.len(), 5);
    assert_eq!(all["next_cursor"], Value::Null);
    let mut paged = Vec::new();
    let mut path = "/api/sessions?limit=2".to_string();
    loop {
        let page = app.get_json(&path, Some("alice-token")).await;
        let rows = page["sessions"].as_array().unwrap();
        assert!(rows.len() <= 2, "{page}");
        paged.extend(rows.iter().map(|s| s["session_id"].clone()));
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                let cursor: String = form_urlencoded::byte_serialize(cursor.as_bytes()).collect();
                path = format!("/api/sessions?limit=2&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(
        paged, expected,
        "the pages, in order, are the whole list once"
    );
    for (bad, expected) in [
        ("/api/sessions?limit=0", 400),
        ("/api/sessions?limit=1001", 400),
        ("/api/sessions?cursor=nope", 404),
    ] {
        let (status, body) = app
            .request(reqwest::Method::GET, bad, Some("alice-token"))
            .await;
        assert_eq!(status, expected, "{bad}: {body}");
    }
    let first = app
        .get_json("/api/sessions?limit=2&cursor=", Some("alice-token"))
        .await;
    assert_eq!(first["sessions"].as_array().unwrap().len(), 2);
}

/// The kind of a tool call's error answer (`null` for a success).
fn tool_error_kind(result: &Value) -> &Value {
    &result["structured_metadata"]["error"]["kind"]
}

#[tokio::test]
async fn a_user_at_their_disk_quota_is_refused_writes_and_commands_and_another_user_is_not() {
    let app = TestApp::spawn_with(|c| {
        crate::support::alice_and_bob(c);
        c.limits.user.disk_max_mb = 1;
    })
    .await;
    let mut alice = app.ws_with(Some("alice-token"), None).await.unwrap();
    let mut bob = app.ws_with(Some("bob-token"), None).await.unwrap();
    let first = alice.open().await;
    let second = alice.open().await;
    let bobs = bob.open().await;
    let big = "x".repeat(600 * 1024);
    let write = |path: &str| json!({"path": path, "content": big});

    let written = alice.invoke(&first, "write_file", write("a.txt")).await;
    assert_eq!(written["success"], true, "{written}");
    // The quota is the user's, over all of their sessions.
    let refused = alice.invoke(&second, "write_file", write("b.txt")).await;
    assert_eq!(tool_error_kind(&refused), "quota_exceeded", "{refused}");
    assert!(!app.workspace().join("alice/b.txt").exists());
    // Bob's writes are his own.
    let bobs_write = bob.invoke(&bobs, "write_file", write("b.txt")).await;
    assert_eq!(bobs_write["success"], true, "{bobs_write}");

    // A command writes behind the tools' back: it runs, and the next one is refused.
    let filled = alice
        .invoke(
            &first,
            "shell",
            json!({"command": "head -c 3000000 /dev/zero > filler && echo filled"}),
        )
        .await;
    assert!(
        filled["output"].as_str().unwrap().contains("filled"),
        "{filled}"
    );
    let next = alice
        .invoke(&second, "shell", json!({"command": "echo hi"}))
        .await;
    assert_eq!(tool_error_kind(&next), "quota_exceeded", "{next}");
    let started = alice
        .invoke(&second, "exec_command", json!({"cmd": "echo hi"}))
        .await;
    assert_eq!(tool_error_kind(&started), "quota_exceeded", "{started}");
    let small = alice
        .invoke(
            &second,
            "write_file",
            json!({"path": "c.txt", "content": "c"}),
        )
        .await;
    assert_eq!(tool_error_kind(&small), "quota_exceeded", "{small}");
    let bobs_command = bob
        .invoke(&bobs, "shell", json!({"command": "echo bob"}))
        .await;
    assert!(
        bobs_command["output"].as_str().unwrap().contains("bob"),
        "{bobs_command}"
    );

    // Deleting through a tool makes room again.
    let patch = "*** Begin Patch\n*** Delete File: filler\n*** End Patch\n";
    let deleted = alice
        .invoke(&first, "apply_patch", json!({"input": patch}))
        .await;
    assert_eq!(deleted["success"], true, "{deleted}");
    let again = alice
        .invoke(&second, "shell", json!({"command": "echo again"}))
        .await;
    assert!(
        again["output"].as_str().unwrap().contains("again"),
        "{again}"
    );
}
