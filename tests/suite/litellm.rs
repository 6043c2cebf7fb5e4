//! agentd behind a real LLM gateway: LiteLLM's proxy (`litellm[proxy]` from PyPI), started by
//! the test, sits between agentd and the scripted model, so a streamed tool-call turn has to
//! survive what a gateway really does to requests and streams on their way through.
//!
//! `./scripts/test` installs the pinned LiteLLM under `target/litellm/`; without it the test
//! fails and says how to install it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentd::config::{Config, Secret};
use serde_json::{Value, json};

use crate::suite::agent::{of, run_turn};
use crate::support::TestApp;
use crate::support::mock_llm::{MockLlm, Reply, Script};

/// The LiteLLM release `scripts/test` installs (the same pin is written there): the newest whose
/// `[proxy]` extra resolves from PyPI here.
const LITELLM_VERSION: &str = "1.108.7";

/// The proxy's master key: agentd must send it as its bearer token (any other key makes this
/// database-less proxy answer 400 `no_db_connection`, as it then looks for virtual keys).
const MASTER_KEY: &str = "sk-agentd-litellm-test";

/// The model name agentd asks the proxy for (an alias in the proxy's `model_list`).
const ALIAS: &str = "gateway-model";

/// The model name the proxy forwards to the scripted model, which agentd never sends itself.
const UPSTREAM_MODEL: &str = "upstream-model";

/// The key the proxy sends upstream, which agentd never sends itself.
const UPSTREAM_KEY: &str = "sk-upstream-mock";

/// How long the proxy may take to answer its liveliness probe: it imports a large Python
/// package, which on a busy two-core machine compiling Rust beside it takes a while.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Starts of the proxy tried when the port chosen for it was taken before it could bind it.
const BIND_ATTEMPTS: u32 = 3;

/// Where `scripts/test` keeps LiteLLM's virtualenv.
fn litellm_venv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/litellm")
}

/// The `litellm` command of the pinned install; fails the test when it is missing or another
/// version, naming the command that installs it.
fn litellm_command() -> PathBuf {
    let venv = litellm_venv();
    let command = venv.join("bin/litellm");
    let install = format!(
        "run ./scripts/test, or `python3 -m venv target/litellm && target/litellm/bin/pip install \
         'litellm[proxy]=={LITELLM_VERSION}'`"
    );
    assert!(
        command.exists(),
        "the LiteLLM test needs {}: {install}",
        command.display()
    );
    let version = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ])
        .output()
        .expect("the LiteLLM virtualenv's python runs");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert_eq!(
        version, LITELLM_VERSION,
        "target/litellm holds litellm {version:?}, the test is written for {LITELLM_VERSION}: \
         {install}"
    );
    command
}

/// A port on loopback nobody listens on right now, for a process that cannot be handed a
/// listener (the proxy binds it itself a moment later).
fn free_loopback_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A running LiteLLM proxy with its config and log in a temporary directory; killed when
/// dropped, and its log printed when that happens during a failing test.
struct LitellmProxy {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LitellmProxy {
    /// Starts the proxy with a `model_list` that maps [`ALIAS`] to the OpenAI-compatible
    /// server at `upstream_base_url`; returns once it answers its liveliness probe.
    async fn start(upstream_base_url: &str) -> Self {
        let command = litellm_command();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("litellm.yaml");
        std::fs::write(
            &config,
            format!(
                "model_list:\n\
                 \x20 - model_name: {ALIAS}\n\
                 \x20   litellm_params:\n\
                 \x20     model: openai/{UPSTREAM_MODEL}\n\
                 \x20     api_base: {upstream_base_url}\n\
                 \x20     api_key: {UPSTREAM_KEY}\n\
                 general_settings:\n\
                 \x20 master_key: {MASTER_KEY}\n\
                 litellm_settings:\n\
                 \x20 telemetry: false\n"
            ),
        )
        .unwrap();
        let log = dir.path().join("litellm.log");
        let mut dir = Some(dir);
        // The port is free when chosen but taken only once the proxy has imported itself,
        // seconds later; another test's connection may take it meanwhile. A proxy that could
        // not bind it is started again on another.
        for attempt in 1..=BIND_ATTEMPTS {
            let output = File::create(&log).unwrap();
            let port = free_loopback_port();
            let child = Command::new(&command)
                .arg("--config")
                .arg(&config)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .current_dir(dir.as_ref().unwrap().path())
                // There is no internet here: no usage telemetry, and the price map LiteLLM
                // ships instead of the one it would download at start-up.
                .env("LITELLM_TELEMETRY", "False")
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                .env("PYTHONUNBUFFERED", "1")
                // A database URL in the environment would make the proxy start its Prisma
                // store.
                .env_remove("DATABASE_URL")
                .stdin(Stdio::null())
                .stdout(output.try_clone().unwrap())
                .stderr(output)
                .spawn()
                .expect("the LiteLLM proxy starts");
            let mut proxy = Self {
                child,
                port,
                log: log.clone(),
                _dir: dir.take().unwrap(),
            };
            match proxy.wait_until_alive().await {
                Ok(()) => return proxy,
                Err(status)
                    if attempt < BIND_ATTEMPTS
                        && proxy.log_text().contains("address already in use") =>
                {
                    eprintln!("the LiteLLM proxy exited with {status}: port {port} was taken");
                    // Its directory goes to the next attempt, and its log is started afresh.
                    dir = Some(std::mem::replace(
                        &mut proxy._dir,
                        tempfile::tempdir().unwrap(),
                    ));
                }
                Err(status) => panic!(
                    "the LiteLLM proxy exited with {status} before it was ready:\n{}",
                    proxy.log_text()
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Polls `/health/liveliness` until it answers 200; the proxy's exit status if it exits
    /// first. Fails with the log after [`STARTUP_TIMEOUT`].
    async fn wait_until_alive(&mut self) -> Result<(), std::process::ExitStatus> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let probe = format!("http://127.0.0.1:{}/health/liveliness", self.port);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(response) = client.get(&probe).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(status);
            }
            assert!(
                Instant::now() < deadline,
                "the LiteLLM proxy did not answer {probe} within {STARTUP_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL agentd is given.
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What the proxy printed so far.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|err| format!("(no log: {err})"))
    }
}

impl Drop for LitellmProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- LiteLLM proxy log ---\n{}", self.log_text());
        }
    }
}

/// One chat-completion chunk as OpenAI streams it: one choice with this delta and finish
/// reason, or, with `usage`, the closing usage chunk whose `choices` is empty.
fn sse_chunk(delta: Value, finish_reason: Option<&str>, usage: Option<Value>) -> String {
    let choices = if usage.is_some() {
        json!([])
    } else {
        json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
    };
    let mut chunk = json!({
        "id": "chatcmpl-gateway-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": UPSTREAM_MODEL,
        "system_fingerprint": null,
        "choices": choices,
    });
    if let Some(usage) = usage {
        chunk["usage"] = usage;
    }
    format!("data: {chunk}\n\n")
}

/// A thinking model's answer (DeepSeek's or vLLM's shape): `reasoning_content`, then one
/// `read_file` call whose arguments stream in two pieces, then usage. The mock has no helper
/// for reasoning, so the stream is written out here.
fn reasoning_then_read_file(reasoning: &[&str], call_id: &str, path: &str) -> Reply {
    let mut body = sse_chunk(json!({"role": "assistant", "content": ""}), None, None);
    for piece in reasoning {
        body.push_str(&sse_chunk(json!({"reasoning_content": piece}), None, None));
    }
    body.push_str(&sse_chunk(
        json!({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                               "function": {"name": "read_file", "arguments": ""}}]}),
        None,
        None,
    ));
    let arguments = json!({"path": path}).to_string();
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    for piece in [head, tail] {
        body.push_str(&sse_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            None,
            None,
        ));
    }
    body.push_str(&sse_chunk(json!({}), Some("tool_calls"), None));
    body.push_str(&sse_chunk(
        json!({}),
        None,
        Some(json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107})),
    ));
    body.push_str("data: [DONE]\n\n");
    Reply::raw_sse(&body)
}

/// agentd's config: the default provider is the proxy, reached with the proxy's master key.
fn through(proxy: &LitellmProxy) -> impl FnOnce(&mut Config) + use<> {
    let base_url = proxy.base_url();
    move |c: &mut Config| {
        c.llm.base_url = Some(base_url);
        c.llm.model = Some(ALIAS.into());
        c.llm.api_key = Some(Secret::new(MASTER_KEY));
    }
}

/// Writes `text` to `relative` under `dir`, making the folders on the way.
fn write_workspace_file(dir: &Path, relative: &str, text: &str) {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn a_streamed_tool_call_turn_runs_through_the_litellm_proxy() {
    let reasoning = ["The user wants ", "the gateway note."];
    let final_text = ["The note says ", "the gateway works."];
    let mock = MockLlm::start(Script::sequence(vec![
        reasoning_then_read_file(&reasoning, "call_gateway_1", "notes/gateway.txt"),
        Reply::text(&final_text).with_usage(200, 9),
    ]))
    .await;
    let proxy = LitellmProxy::start(&mock.base_url()).await;
    let app = TestApp::spawn_with(through(&proxy)).await;
    write_workspace_file(
        &app.workspace(),
        "notes/gateway.txt",
        "marker-7f3a: proxied\n",
    );
    let mut ws = app.ws().await;
    let session = ws.open().await;

    // LiteLLM re-serialises the stream rather than passing it on: it renames the model to the
    // alias, restamps `created`, drops `logprobs` and `system_fingerprint`, adds `"type"` to
    // every tool-call fragment, and sends usage in a chunk with one empty-delta choice instead
    // of `choices: []` (with `completion_tokens_details` it estimated itself).
    let (notes, end) = run_turn(&mut ws, &session, "what does the gateway note say?").await;
    assert_eq!(end["reason"], "completed", "{end}");
    assert!(end.get("code").is_none(), "{end}");

    // The reasoning streamed back through the proxy: LiteLLM keeps `reasoning_content` deltas.
    let reasoned: String = of(&notes, "reasoning/delta")
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(reasoned, reasoning.concat(), "{notes:?}");

    // The tool ran, with the arguments the model streamed in pieces, joined whole.
    let started = of(&notes, "tool/started");
    assert_eq!(started.len(), 1, "{notes:?}");
    assert_eq!(started[0]["tool_call_id"], "call_gateway_1");
    assert_eq!(started[0]["tool_name"], "read_file");
    assert_eq!(
        started[0]["arguments"],
        json!({"path": "notes/gateway.txt"})
    );
    let completed = of(&notes, "tool/completed");
    assert_eq!(completed[0]["success"], true, "{completed:?}");
    assert!(
        completed[0]["output_preview"]
            .as_str()
            .unwrap()
            .contains("marker-7f3a"),
        "{completed:?}"
    );

    // The final text arrived in its pieces.
    let deltas: Vec<&str> = of(&notes, "message/delta")
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, final_text);
    let messages = of(&notes, "message/completed");
    assert_eq!(messages.last().unwrap()["text"], final_text.concat());
    // The upstream usage came through the proxy and was summed over both calls.
    assert_eq!(end["tokens_in"], 300, "{end}");
    assert_eq!(end["tokens_out"], 16, "{end}");

    // Both calls reached the mock through the proxy: with the upstream model and key from the
    // proxy's config, which agentd knows nothing of.
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), 2, "{:?}", mock.requests());
    for request in &recorded {
        assert_eq!(request.body["model"], UPSTREAM_MODEL, "{}", request.body);
        assert_eq!(request.body["stream"], true);
        assert_eq!(
            request.headers["authorization"],
            format!("Bearer {UPSTREAM_KEY}").as_str()
        );
    }
    let first = &recorded[0].body;
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(offered.contains(&"read_file"), "{offered:?}");
    assert_eq!(
        first["messages"].as_array().unwrap().last().unwrap()["content"],
        "what does the gateway note say?"
    );

    // The second request carries the call, its reasoning (which thinking models such as
    // DeepSeek require back on a tool-call turn, and LiteLLM forwards) and the tool's result.
    let second = recorded[1].body["messages"].as_array().unwrap();
    let assistant = &second[second.len() - 2];
    assert_eq!(assistant["role"], "assistant", "{assistant}");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_gateway_1");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "read_file");
    let arguments: Value = serde_json::from_str(
        assistant["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(arguments, json!({"path": "notes/gateway.txt"}));
    assert_eq!(assistant["reasoning_content"], reasoning.concat());
    let tool = &second[second.len() - 1];
    assert_eq!(tool["role"], "tool", "{tool}");
    assert_eq!(tool["tool_call_id"], "call_gateway_1");
    assert!(
        tool["content"].as_str().unwrap().contains("marker-7f3a"),
        "{tool}"
    );
}
