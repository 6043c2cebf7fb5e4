//! A JSON-RPC client over one WebSocket, the same for the floor and for agentd. It parses only
//! the top-level fields it needs, so that the client's share of the two CPUs stays small.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::child::READ_FILE;

/// How long any one answer may take before the run fails (a stuck server, not a slow one).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a close may wait for the server's close frame.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One message from the server, borrowed from its frame.
#[derive(Debug, Deserialize)]
pub struct Incoming<'a> {
    /// The request id an answer carries.
    #[serde(default)]
    pub id: Option<u64>,
    /// A notification's method.
    #[serde(borrow, default)]
    pub method: Option<&'a str>,
    /// A successful answer.
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    /// A failed answer.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
    /// A notification's params.
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
}

/// The fields of a `session/open` result the client uses.
#[derive(Debug, Deserialize)]
struct Opened {
    /// Absent in the floor's echo, which has no sessions.
    #[serde(default)]
    session_id: String,
}

/// The fields of a `tool/invoke` result the client checks.
#[derive(Debug, Deserialize)]
struct Invoked {
    /// Absent in the floor's echo.
    #[serde(default)]
    success: Option<bool>,
    #[serde(default)]
    output: Option<String>,
}

/// A WebSocket to `/api/ws` and the next request id.
pub struct RpcClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// The session `invoke` calls, once `open` has run.
    session: String,
}

impl RpcClient {
    /// Connects with TCP_NODELAY and a 4 KiB read buffer, so that thousands of idle clients
    /// stay small.
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let config = WebSocketConfig::default().read_buffer_size(4096);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(
            format!("ws://{addr}/api/ws"),
            Some(config),
            true,
        )
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
        Ok(Self {
            ws,
            next_id: 1,
            session: String::new(),
        })
    }

    /// Sends a request whose params are this JSON text; returns its id.
    pub async fn send(&mut self, method: &str, params: &str) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let frame =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
        self.ws
            .send(Message::Text(frame.into()))
            .await
            .context("cannot send")?;
        Ok(id)
    }

    /// The next text frame, skipping control frames.
    pub async fn next_text(&mut self) -> anyhow::Result<tokio_tungstenite::tungstenite::Utf8Bytes> {
        loop {
            let message = tokio::time::timeout(ANSWER_TIMEOUT, self.ws.next())
                .await
                .map_err(|_| anyhow!("no frame within {ANSWER_TIMEOUT:?}"))?;
            match message {
                Some(Ok(Message::Text(text))) => return Ok(text),
                Some(Ok(Message::Close(frame))) => bail!("the server closed: {frame:?}"),
                Some(Ok(_)) => continue,
                Some(Err(err)) => bail!("the WebSocket failed: {err}"),
                None => bail!("the WebSocket ended"),
            }
        }
    }

    /// Reads until the answer to `id`, skipping the notifications that precede it; returns the
    /// result's JSON text.
    pub async fn answer(&mut self, id: u64) -> anyhow::Result<String> {
        loop {
            let text = self.next_text().await?;
            let message: Incoming<'_> =
                serde_json::from_str(text.as_str()).context("a frame is not JSON-RPC")?;
            if message.id != Some(id) {
                continue;
            }
            if let Some(error) = message.error {
                bail!("request {id} failed: {}", error.get());
            }
            return Ok(message.result.map_or("null", RawValue::get).to_string());
        }
    }

    /// A request and its answer.
    pub async fn call(&mut self, method: &str, params: &str) -> anyhow::Result<String> {
        let id = self.send(method, params).await?;
        self.answer(id).await
    }

    /// `session/open` of a new session, which later invokes use; returns its id.
    pub async fn open(&mut self) -> anyhow::Result<String> {
        let result = self.open_answer().await?;
        let opened: Opened = serde_json::from_str(&result).context("session/open result")?;
        Ok(opened.session_id)
    }

    /// [`RpcClient::open`], returning the whole result's JSON text (its `sandbox`, …).
    pub async fn open_answer(&mut self) -> anyhow::Result<String> {
        let result = self.call("session/open", "{}").await?;
        let opened: Opened = serde_json::from_str(&result).context("session/open result")?;
        self.session = opened.session_id;
        Ok(result)
    }

    /// The session `open` or `join` made, for requests the client has no method for.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// `session/open` of the existing `session_id`, which later invokes use.
    pub async fn join(&mut self, session_id: &str) -> anyhow::Result<()> {
        let params = format!(r#"{{"session_id":{}}}"#, serde_json::to_string(session_id)?);
        self.call("session/open", &params).await?;
        self.session = session_id.to_string();
        Ok(())
    }

    /// `tool/invoke` of `read_file` on the 12-byte file, in the session `open` made; a result
    /// with `success: false` is an error, since the figures would not be of the path measured.
    pub async fn invoke(&mut self) -> anyhow::Result<()> {
        self.invoke_tool("read_file", &format!(r#"{{"path":"{READ_FILE}"}}"#))
            .await
    }

    /// `tool/invoke` of `name` with `arguments` (JSON text) in the session `open` made; a
    /// result with `success: false` is an error.
    pub async fn invoke_tool(&mut self, name: &str, arguments: &str) -> anyhow::Result<()> {
        self.invoke_answer(name, arguments).await.map(drop)
    }

    /// [`RpcClient::invoke_tool`], returning the whole result's JSON text.
    pub async fn invoke_answer(&mut self, name: &str, arguments: &str) -> anyhow::Result<String> {
        let params = format!(
            r#"{{"session_id":{},"name":{},"arguments":{arguments}}}"#,
            serde_json::to_string(&self.session)?,
            serde_json::to_string(name)?,
        );
        let result = self.call("tool/invoke", &params).await?;
        let invoked: Invoked = serde_json::from_str(&result).context("tool/invoke result")?;
        if invoked.success == Some(false) {
            bail!("{name} failed: {}", invoked.output.unwrap_or_default());
        }
        Ok(result)
    }

    /// Sends a close frame and waits for the server's, so that the server has seen the close
    /// when this returns.
    pub async fn close(mut self) -> anyhow::Result<()> {
        // A server that already went away has nothing left to close.
        let _ = self.ws.close(None).await;
        let drain = async { while let Some(Ok(_)) = self.ws.next().await {} };
        tokio::time::timeout(CLOSE_TIMEOUT, drain)
            .await
            .map_err(|_| anyhow!("the server did not close within {CLOSE_TIMEOUT:?}"))
    }
}
