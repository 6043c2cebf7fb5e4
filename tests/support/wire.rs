//! Bytes on the wire, for tests that must do what a well-behaved client never would: hold a
//! connection without a request, send half a request or half a frame, announce a frame larger
//! than the cap. Also the process-level facts such tests measure (RSS, a socket's options).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::WAIT;

/// A plain TCP connection to `addr`.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connects in time")
        .expect("connects")
}

/// A connection with a small send buffer, so a write that returns means the peer has read all
/// but about `bytes` (plus its own receive buffer) of it.
pub async fn connect_with_send_buffer(addr: SocketAddr, bytes: u32) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(bytes).unwrap();
    tokio::time::timeout(WAIT, socket.connect(addr))
        .await
        .expect("connects in time")
        .expect("connects")
}

/// A loopback listener whose accepted sockets have a small receive buffer (accepted sockets
/// inherit it), so what a client has written is, give or take that much, what the server read.
pub fn listener_with_receive_buffer(bytes: u32) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(bytes).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    socket.listen(1024).unwrap()
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

/// A frame the server sent.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerFrame {
    /// A text frame.
    Text(String),
    /// A ping.
    Ping,
    /// A close frame with its code, if any.
    Close(Option<u16>),
    /// Another opcode.
    Other(u8),
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

    /// The header of a final, masked text frame announcing `len` payload bytes.
    pub fn text_header(len: u64) -> Vec<u8> {
        let mut header = vec![0x81];
        match len {
            0..=125 => header.push(0x80 | len as u8),
            126..=0xffff => {
                header.push(0x80 | 126);
                header.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                header.push(0x80 | 127);
                header.extend_from_slice(&len.to_be_bytes());
            }
        }
        header.extend_from_slice(&[0, 0, 0, 0]);
        header
    }

    /// Writes raw bytes; `false` when the server had closed the connection.
    pub async fn write(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    /// Sends one whole text frame.
    pub async fn send_text(&mut self, text: &str) {
        let mut frame = Self::text_header(text.len() as u64);
        frame.extend_from_slice(text.as_bytes());
        assert!(self.write(&frame).await, "the server is still reading");
    }

    /// The next frame the server sends; `None` when the connection ends first.
    pub async fn next_frame(&mut self) -> Option<ServerFrame> {
        let reading = async {
            let mut head = [0u8; 2];
            self.stream.read_exact(&mut head).await.ok()?;
            let len = match head[1] & 0x7f {
                126 => u64::from(self.stream.read_u16().await.ok()?),
                127 => self.stream.read_u64().await.ok()?,
                n => u64::from(n),
            };
            let mut payload = vec![0; usize::try_from(len).ok()?];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some(match head[0] & 0x0f {
                0x1 => ServerFrame::Text(String::from_utf8(payload).ok()?),
                0x8 => ServerFrame::Close(
                    (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]])),
                ),
                0x9 => ServerFrame::Ping,
                other => ServerFrame::Other(other),
            })
        };
        tokio::time::timeout(WAIT, reading)
            .await
            .expect("a frame or the end arrives in time")
    }

    /// The code of the close frame that ends this connection, skipping other frames.
    pub async fn close_code(&mut self) -> Option<u16> {
        loop {
            match self.next_frame().await? {
                ServerFrame::Close(code) => return code,
                _ => continue,
            }
        }
    }
}

/// This process's resident set size in bytes, from `/proc/self/status`.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
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
