//! Bytes on the wire, for tests that must do what a well-behaved client never would: hold a
//! connection without a request, or send half a request. Also the socket options such tests
//! check.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::WAIT;

/// A plain TCP connection to `addr`.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connects in time")
        .expect("connects")
}

/// Reads until the peer closes; `Err` with what was read if it has not after `within`.
pub async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    let reading = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    };
    match tokio::time::timeout(within, reading).await {
        Ok(()) => Ok(seen),
        Err(_) => Err(seen),
    }
}

/// One HTTP/1.1 request on its own connection with `Connection: close`: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = connect(addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = read_to_close(&mut stream, WAIT)
        .await
        .expect("answered and closed in time");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// A WebSocket spoken frame by frame over a plain TCP stream (client frames masked with a zero
/// key, which leaves the payload bytes as they are, so one buffer serves every connection).
pub struct RawWs {
    /// The connection, after the handshake.
    pub stream: TcpStream,
}

impl RawWs {
    /// Upgrades `stream` to a WebSocket at `/api/ws`.
    pub async fn handshake(mut stream: TcpStream, addr: SocketAddr) -> Self {
        let request = format!(
            "GET /api/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        // Byte by byte up to the blank line, so no frame byte is swallowed with the head.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let byte = tokio::time::timeout(WAIT, stream.read_u8())
                .await
                .expect("handshake answered in time")
                .expect("handshake answered");
            head.push(byte);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self { stream }
    }

    /// Connects and upgrades.
    pub async fn open(addr: SocketAddr) -> Self {
        Self::handshake(connect(addr).await, addr).await
    }
}

/// Whether the server's end of `client`'s connection has TCP_NODELAY. The server runs in this
/// process, so its socket is one of our descriptors: the one whose addresses mirror the client's.
pub fn server_side_nodelay(client: &TcpStream) -> Option<bool> {
    use std::mem::ManuallyDrop;
    use std::os::fd::FromRawFd;
    let (ours, theirs) = (client.local_addr().ok()?, client.peer_addr().ok()?);
    for entry in std::fs::read_dir("/proc/self/fd").ok()? {
        let Some(fd) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor is only queried, never closed (ManuallyDrop). Any descriptor
        // may be one other than a socket, or be closed and reused meanwhile; queries on it then
        // fail or describe another socket, which the address check below filters out.
        let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        if socket.local_addr().ok() == Some(theirs) && socket.peer_addr().ok() == Some(ours) {
            return socket.nodelay().ok();
        }
    }
    None
}
