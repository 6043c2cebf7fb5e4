//! Measures what one loaded, idle session costs: starts a server in-process on a temporary
//! SQLite database, opens N sessions over real WebSockets, closes the sockets so the actors sit
//! idle, and reports the growth of the process's resident memory per session.
//!
//! `cargo run --release --example session_memory -- 2000`

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use agentd::Server;
use agentd::config::Config;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// Resident set size of this process in bytes, from /proc.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sessions: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.server.data_dir = dir.path().join("data");
    config.server.workspace = dir.path().join("workspace");
    // This binary is not agentd, so it cannot stand in for the sandbox launcher; idle sessions
    // run no commands, so the sandbox costs them nothing either way.
    config.sandbox.mode = agentd::config::SandboxMode::Off;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = Server::start(config).await?;
    tokio::spawn(server.serve(listener, std::future::pending()));

    let url = format!("ws://{addr}/api/ws");
    let open = r#"{"jsonrpc":"2.0","id":1,"method":"session/open","params":{}}"#;
    // Warm up allocator arenas and lazily built state before the baseline.
    for _ in 0..50 {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await?;
        ws.send(Message::Text(open.into())).await?;
        ws.next().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_bytes();
    for _ in 0..sessions {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await?;
        ws.send(Message::Text(open.into())).await?;
        ws.next().await;
        ws.close(None).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_bytes();
    let per_session = (after.saturating_sub(before)) as f64 / sessions as f64;
    println!(
        "{sessions} idle sessions: RSS {:.1} MiB -> {:.1} MiB, {:.1} KiB per session",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        per_session / 1024.0
    );
    Ok(())
}
