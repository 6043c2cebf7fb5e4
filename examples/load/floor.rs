//! The floor: a bare axum WebSocket server that answers every JSON-RPC request frame with one
//! frame of similar size (its params echoed as the result). It reads with the buffer sizes
//! agentd uses and sets TCP_NODELAY on each accepted socket, so that what agentd costs beyond it
//! is agentd's own work.

use anyhow::Context;
use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

/// agentd's cap on one frame and one message.
const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Serves on 127.0.0.1 port 0 until SIGTERM or SIGINT; logs its address the way agentd does.
pub fn main() -> anyhow::Result<()> {
    // A load tool that dies without stopping its children must not leave a floor behind.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .context("cannot ask for the parent's death signal")?;
    // The same runtime agentd's main builds: multi-threaded, one worker per CPU.
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        eprintln!("floor: listening address={address}");
        let listener = listener.tap_io(|tcp| {
            // A lost option only slows multi-frame answers; the floor sends one frame.
            let _ = tcp.set_nodelay(true);
        });
        let app = Router::new().route("/api/ws", get(upgrade));
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        // Open WebSockets would hold a graceful shutdown; the floor has nothing to persist.
        tokio::select! {
            served = axum::serve(listener, app) => served?,
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        Ok(())
    })
}

async fn upgrade(ws: WebSocketUpgrade) -> Response {
    ws.read_buffer_size(1024)
        .write_buffer_size(0)
        .max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(echo)
}

/// Parses each text frame as a request and answers `{jsonrpc, id, result: params}`.
async fn echo(mut socket: WebSocket) {
    while let Some(Ok(message)) = socket.recv().await {
        let Message::Text(text) = message else {
            continue;
        };
        let answer = match serde_json::from_str::<Value>(text.as_str()) {
            Ok(mut request) => json!({
                "jsonrpc": "2.0",
                "id": request["id"].take(),
                "result": request["params"].take(),
            }),
            Err(_) => json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700}}),
        };
        if socket
            .send(Message::Text(answer.to_string().into()))
            .await
            .is_err()
        {
            return;
        }
    }
}
