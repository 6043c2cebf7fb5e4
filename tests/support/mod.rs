//! Test support: a real server on an ephemeral port with its own temporary data and workspace,
//! and small WebSocket and HTTP clients that wait on events with timeouts, never on sleeps.

pub mod mock_llm;
pub mod wire;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentd::Server;
use agentd::config::Config;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A running server and the directory it keeps everything in.
pub struct TestApp {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Holds data/ and workspace/.
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Two users, `alice` and `bob`, with the tokens `alice-token` and `bob-token`.
pub fn alice_and_bob(c: &mut Config) {
    c.server.users = vec![
        agentd::config::UserConfig {
            name: "alice".into(),
            token: agentd::config::Secret::new("alice-token"),
        },
        agentd::config::UserConfig {
            name: "bob".into(),
            token: agentd::config::Secret::new("bob-token"),
        },
    ];
}

/// A config rooted in `dir`: SQLite under `dir/data`, workspace `dir/workspace`.
pub fn config_in(dir: &Path) -> Config {
    let mut config = Config::default();
    config.server.bind = "127.0.0.1:0".parse().unwrap();
    config.server.data_dir = dir.join("data");
    config.server.workspace = dir.join("workspace");
    config.server.shutdown_grace_secs = 5;
    // The server runs inside the test binary; sandboxed commands go through the real agentd.
    config.sandbox.launcher = Some(PathBuf::from(env!("CARGO_BIN_EXE_agentd-sandbox")));
    config
}

impl TestApp {
    /// Starts a server with default settings.
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// Starts a server after `adjust` edits its config.
    pub async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_in(dir.path());
        adjust(&mut config);
        Self::start_in(dir, config).await
    }

    /// Starts a server with extra tools registered beside the built-ins.
    pub async fn spawn_with_tools(
        adjust: impl FnOnce(&mut Config),
        tools: Vec<std::sync::Arc<dyn agentd::tools::Tool>>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_in(dir.path());
        adjust(&mut config);
        Self::start_with(dir, config, tools).await
    }

    /// Starts a server on an existing directory (to restart on the same data).
    pub async fn start_in(dir: tempfile::TempDir, config: Config) -> Self {
        Self::start_with(dir, config, Vec::new()).await
    }

    /// Starts a server on a listener the test prepared (socket options, say).
    pub async fn spawn_on(
        listener: tokio::net::TcpListener,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_in(dir.path());
        adjust(&mut config);
        Self::start_on(listener, dir, config, Vec::new()).await
    }

    async fn start_with(
        dir: tempfile::TempDir,
        config: Config,
        tools: Vec<std::sync::Arc<dyn agentd::tools::Tool>>,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, dir, config, tools).await
    }

    async fn start_on(
        listener: tokio::net::TcpListener,
        dir: tempfile::TempDir,
        config: Config,
        tools: Vec<std::sync::Arc<dyn agentd::tools::Tool>>,
    ) -> Self {
        let addr = listener.local_addr().unwrap();
        let server = Server::start_with_tools(config, tools)
            .await
            .expect("server starts");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server and waits for it; returns the directory for a restart.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("server stops in time")
                .unwrap()
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    /// The workspace root.
    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    /// `http://addr{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// GET with an optional bearer token; returns status and body text.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        self.request(reqwest::Method::GET, path, token).await
    }

    /// Any method; returns status and body text.
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
    ) -> (u16, String) {
        let mut request = reqwest::Client::new().request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = tokio::time::timeout(WAIT, request.send())
            .await
            .expect("answer in time")
            .expect("request sent");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// `DELETE /api/sessions/{id}`; returns the status.
    pub async fn delete_session(&self, session: &str) -> u16 {
        self.request(
            reqwest::Method::DELETE,
            &format!("/api/sessions/{session}"),
            None,
        )
        .await
        .0
    }

    /// Every stored event of `session`, replayed to a new connection from the start.
    pub async fn replay(&self, session: &str) -> Vec<Value> {
        let mut ws = self.ws().await;
        let (events, answer) = ws
            .call(
                "session/open",
                json!({"session_id": session, "after_seq": 0}),
            )
            .await;
        assert!(answer.get("error").is_none(), "{answer}");
        events
    }

    /// GET returning parsed JSON; panics on a non-200 status.
    pub async fn get_json(&self, path: &str, token: Option<&str>) -> Value {
        let (status, body) = self.get(path, token).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Opens a WebSocket, optionally with a token and Origin.
    pub async fn ws(&self) -> WsClient {
        self.ws_with(None, None).await.expect("websocket connects")
    }

    /// Opens a WebSocket with a bearer token and/or Origin; the HTTP status on refusal.
    pub async fn ws_with(
        &self,
        token: Option<&str>,
        origin: Option<&str>,
    ) -> Result<WsClient, u16> {
        let mut request = format!("ws://{}/api/ws", self.addr)
            .into_client_request()
            .unwrap();
        if let Some(token) = token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        if let Some(origin) = origin {
            request
                .headers_mut()
                .insert("origin", origin.parse().unwrap());
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((stream, _)) => Ok(WsClient { stream, next_id: 1 }),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                Err(response.status().as_u16())
            }
            Err(err) => panic!("websocket failed: {err}"),
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The agentd binary serving in a process of its own (to be killed, or to have limits of its
/// own), killed when dropped so a failing test leaves no server behind.
pub struct ServerProcess {
    /// The process.
    pub child: std::process::Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it logged before it listened.
    pub startup_log: Vec<String>,
}

impl ServerProcess {
    /// Starts `agentd --config <dir>/agentd.toml` with a `[server]` section that binds port 0
    /// and keeps data and workspace in `dir`, followed by `extra` TOML; waits until it listens.
    pub fn start(dir: &Path, extra: &str) -> Self {
        Self::start_config(
            dir,
            &format!(
                "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nworkspace = \"{}\"\n{extra}",
                dir.join("data").display(),
                dir.join("workspace").display(),
            ),
        )
    }

    /// Starts `agentd --config <dir>/agentd.toml` with exactly `text` as its configuration;
    /// waits until it listens.
    pub fn start_config(dir: &Path, text: &str) -> Self {
        let config = dir.join("agentd.toml");
        std::fs::write(&config, text).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
        command
            .args(["--config", config.to_str().unwrap()])
            .env_remove("AGENTD_BIND");
        Self::spawn(command)
    }

    /// Starts `agentd` as the README does, with no config, flag or directory setting, in `cwd`
    /// (only the port is the system's choice, through `AGENTD_BIND`); waits until it listens.
    pub fn start_bare(cwd: &Path) -> Self {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
        command.current_dir(cwd).env("AGENTD_BIND", "127.0.0.1:0");
        for name in [
            "AGENTD_CONFIG",
            "AGENTD_DATA_DIR",
            "AGENTD_WORKSPACE",
            "DATABASE_URL",
            "AGENTD_LLM_BASE_URL",
            "AGENTD_LLM_MODEL",
            "AGENTD_AUTH_TOKEN",
            "AGENTD_LOG_FORMAT",
        ] {
            command.env_remove(name);
        }
        Self::spawn(command)
    }

    /// Starts the binary as `command` says (with its log read as the others are); waits until
    /// it listens.
    pub fn spawn(mut command: std::process::Command) -> Self {
        let mut child = command
            .env("AGENTD_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        let mut startup_log = Vec::new();
        let address = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| {
                let address = line
                    .contains("listening")
                    .then(|| line.rsplit("address=").next().unwrap().trim().to_string());
                startup_log.push(line);
                address
            })
            .expect("the server listens");
        // Keep draining the log so the server never blocks on a full pipe (and show it with
        // AGENTD_TEST_SHOW_LOGS, to see what a process did).
        let show = std::env::var_os("AGENTD_TEST_SHOW_LOGS").is_some();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if show {
                    eprintln!("[{}] {line}", std::process::id());
                }
            }
        });
        Self {
            child,
            addr: address.parse().unwrap(),
            startup_log,
        }
    }

    /// A JSON-RPC client on its WebSocket.
    pub async fn ws(&self) -> WsClient {
        let (stream, _) = tokio_tungstenite::connect_async(format!("ws://{}/api/ws", self.addr))
            .await
            .unwrap();
        WsClient::from_stream(stream)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What arrived on a WebSocket.
#[derive(Debug)]
pub enum Frame {
    /// A JSON message.
    Json(Value),
    /// The server closed with this code.
    Closed(Option<u16>),
}

/// A JSON-RPC client over one WebSocket.
pub struct WsClient {
    stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl WsClient {
    /// A client over a WebSocket opened elsewhere (to a server in another process, say).
    pub fn from_stream(stream: WebSocketStream<MaybeTlsStream<TcpStream>>) -> Self {
        Self { stream, next_id: 1 }
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: &str) {
        self.stream
            .send(Message::Text(text.into()))
            .await
            .expect("send");
    }

    /// Sends a request; returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_text(&request.to_string()).await;
        id
    }

    /// The next text frame exactly as it arrived, skipping other frames.
    pub async fn next_text(&mut self) -> String {
        loop {
            let message = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("a frame arrives in time");
            match message {
                Some(Ok(Message::Text(text))) => return text.as_str().to_string(),
                Some(Ok(Message::Close(frame))) => panic!("closed with {frame:?}"),
                Some(Ok(_)) => continue,
                Some(Err(err)) => panic!("websocket failed: {err}"),
                None => panic!("websocket ended"),
            }
        }
    }

    /// The next frame, failing the test after [`WAIT`].
    pub async fn next(&mut self) -> Frame {
        loop {
            let message = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("a frame arrives in time");
            match message {
                Some(Ok(Message::Text(text))) => {
                    return Frame::Json(serde_json::from_str(text.as_str()).unwrap());
                }
                Some(Ok(Message::Close(frame))) => {
                    return Frame::Closed(frame.map(|f| u16::from(f.code)));
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Frame::Closed(None),
            }
        }
    }

    /// The next JSON message.
    pub async fn next_json(&mut self) -> Value {
        match self.next().await {
            Frame::Json(value) => value,
            Frame::Closed(code) => panic!("closed with {code:?} while waiting for a message"),
        }
    }

    /// Sends a request and collects the notifications that arrive before its answer.
    pub async fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.send(method, params).await;
        let mut notes = Vec::new();
        loop {
            let message = self.next_json().await;
            if message.get("id") == Some(&json!(id)) {
                return (notes, message);
            }
            notes.push(message);
        }
    }

    /// A request's `result`, failing on an error answer.
    pub async fn result(&mut self, method: &str, params: Value) -> Value {
        let (_, answer) = self.call(method, params).await;
        assert!(answer.get("error").is_none(), "{method} failed: {answer}");
        answer["result"].clone()
    }

    /// `tool/invoke`'s result, failing on an error answer.
    pub async fn invoke(&mut self, session: &str, name: &str, arguments: Value) -> Value {
        self.result(
            "tool/invoke",
            json!({"session_id": session, "name": name, "arguments": arguments}),
        )
        .await
    }

    /// Waits for the next notification with `method`, skipping others.
    pub async fn notification(&mut self, method: &str) -> Value {
        loop {
            let message = self.next_json().await;
            if message["method"] == method {
                return message["params"].clone();
            }
        }
    }

    /// Opens a new session; returns its id.
    pub async fn open(&mut self) -> String {
        let opened = self.result("session/open", json!({})).await;
        opened["session_id"].as_str().unwrap().to_string()
    }
}
