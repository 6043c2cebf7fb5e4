//! OpenTelemetry export end to end: agentd processes send OTLP/HTTP to a collector started
//! here, which decodes the protobuf bodies with the `opentelemetry-proto` messages and checks
//! span names, parentage and GenAI attributes for a turn with a tool call and a sub-agent, the
//! `traceparent` sent to the model, the client metrics, and a turn forwarded between two
//! cluster nodes staying one trace.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::cluster::Database;
use crate::support::ServerProcess;
use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};

/// The trace a client started before its `turn/start`: trace id, then its span id.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// What the collector received.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    service_names: Vec<String>,
    metric_names: Vec<String>,
}

/// A fake OTLP/HTTP collector on loopback.
struct Collector {
    url: String,
    received: Arc<Mutex<Received>>,
    arrived: Arc<Notify>,
}

type Shared = (Arc<Mutex<Received>>, Arc<Notify>);

async fn traces(State((received, arrived)): State<Shared>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace request");
    let mut received = received.lock().unwrap();
    for resource in request.resource_spans {
        if let Some(name) = resource
            .resource
            .as_ref()
            .and_then(|r| string_of(&r.attributes, "service.name"))
        {
            received.service_names.push(name);
        }
        for scope in resource.scope_spans {
            received.spans.extend(scope.spans);
        }
    }
    arrived.notify_waiters();
    ""
}

async fn metrics(State((received, arrived)): State<Shared>, body: Bytes) -> &'static str {
    let request = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics request");
    let mut received = received.lock().unwrap();
    for resource in request.resource_metrics {
        for scope in resource.scope_metrics {
            received
                .metric_names
                .extend(scope.metrics.into_iter().map(|m| m.name));
        }
    }
    arrived.notify_waiters();
    ""
}

impl Collector {
    async fn start() -> Self {
        let received = Arc::new(Mutex::new(Received::default()));
        let arrived = Arc::new(Notify::new());
        let app = axum::Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .with_state((Arc::clone(&received), Arc::clone(&arrived)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url,
            received,
            arrived,
        }
    }

    /// Waits until `done` holds for what arrived (the exporters send every 50 ms here);
    /// fails after 30 s with what did arrive.
    async fn until(&self, what: &str, done: impl Fn(&Received) -> bool) {
        let wait = async {
            loop {
                let notified = self.arrived.notified();
                if done(&self.received.lock().unwrap()) {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .is_err()
        {
            let received = self.received.lock().unwrap();
            let names: Vec<&str> = received.spans.iter().map(|s| s.name.as_str()).collect();
            panic!(
                "{what} never arrived; spans: {names:?}, metrics: {:?}",
                received.metric_names
            );
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap().spans.clone()
    }
}

fn string_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value_of(attributes, key)? {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn value_of<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn attr(span: &Span, key: &str) -> Option<String> {
    string_of(&span.attributes, key)
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match value_of(&span.attributes, key)? {
        Any::IntValue(n) => Some(*n),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "one {name:?} span; got {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

/// Starts agentd with `config` and the exporters sending every 50 ms.
fn start_agentd(dir: &Path, config: &str) -> ServerProcess {
    let path = dir.join("agentd.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
    command
        .args(["--config", path.to_str().unwrap()])
        .env_remove("AGENTD_BIND")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "50");
    ServerProcess::spawn(command)
}

/// One agentd in `dir` on the scripted model, with `extra` TOML after its own sections.
fn start_single(dir: &Path, mock: &MockLlm, extra: &str) -> ServerProcess {
    start_agentd(
        dir,
        &format!(
            "[server]\nbind = \"127.0.0.1:0\"\ndata_dir = \"{data}\"\nworkspace = \"{ws}\"\n\
             [llm]\nbase_url = \"{llm}\"\nmodel = \"mock-model\"\n\
             [sandbox]\nmode = \"off\"\n{extra}",
            data = dir.join("data").display(),
            ws = dir.join("workspace").display(),
            llm = mock.base_url(),
        ),
    )
}

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().unwrap()
}

fn opener(request: &Value) -> String {
    messages(request)
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn answered(request: &Value, call_id: &str) -> bool {
    messages(request)
        .iter()
        .any(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
}

/// The parent reads a file, then hands a question to a sub-agent and waits for it; the child
/// answers at once.
fn delegating_model() -> Script {
    Script::route(|request: &Value| {
        if opener(request) == "count the notes" {
            return Reply::text(&["three notes"]).with_usage(50, 5);
        }
        if !answered(request, "p1") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p1",
                "read_file",
                &json!({"path": "notes.txt"}),
            )])
            .with_usage(100, 10);
        }
        if !answered(request, "p2") {
            return Reply::tool_calls(vec![ScriptedCall::whole(
                "p2",
                "spawn_agent",
                &json!({"message": "count the notes"}),
            )])
            .with_usage(120, 12);
        }
        if !answered(request, "p3") {
            return Reply::tool_calls(vec![ScriptedCall::whole("p3", "wait_agent", &json!({}))])
                .with_usage(140, 14);
        }
        Reply::text(&["all done"]).with_usage(160, 16)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_a_tool_and_a_sub_agent_exports_genai_spans_and_metrics() {
    let collector = Collector::start().await;
    let mock = MockLlm::start(delegating_model()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    std::fs::write(dir.path().join("workspace/notes.txt"), "a\nb\nc\n").unwrap();
    let server = start_single(
        dir.path(),
        &mock,
        &format!(
            "[llm.pricing.\"mock-model\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n\
             [telemetry]\notlp_endpoint = \"{}\"\n",
            collector.url
        ),
    );
    let mut ws = server.ws().await;
    let session = ws.open().await;
    let (_, started) = ws
        .call(
            "turn/start",
            json!({"session_id": session,
                   "input": [{"kind": "text", "text": "read the notes and delegate"}],
                   "_meta": {"traceparent": format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")}}),
        )
        .await;
    assert!(started.get("error").is_none(), "{started}");
    let end = ws.notification("turn/completed").await;
    assert_eq!(end["reason"], "completed", "{end}");

    // Parent: four model calls; child: one; and the parent's three tool calls.
    collector
        .until("the turn's spans", |r| {
            r.spans
                .iter()
                .filter(|s| s.name == "chat mock-model")
                .count()
                >= 5
                && r.spans
                    .iter()
                    .filter(|s| s.name.starts_with("invoke_agent"))
                    .count()
                    >= 2
                && r.spans
                    .iter()
                    .filter(|s| s.name.starts_with("execute_tool"))
                    .count()
                    >= 3
        })
        .await;
    let spans = collector.spans();
    let turn = one(&spans, "invoke_agent agentd");
    assert_eq!(
        hex(&turn.trace_id),
        CLIENT_TRACE,
        "the turn continues the client's trace"
    );
    assert_eq!(hex(&turn.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        attr(turn, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(attr(turn, "gen_ai.agent.name").as_deref(), Some("agentd"));
    assert_eq!(attr(turn, "gen_ai.conversation.id"), Some(session.clone()));
    for noise in [
        "thread.id",
        "thread.name",
        "target",
        "busy_ns",
        "code.file.path",
    ] {
        assert!(
            !turn.attributes.iter().any(|kv| kv.key == noise),
            "{noise} is not exported"
        );
    }

    for (tool, call_id) in [
        ("read_file", "p1"),
        ("spawn_agent", "p2"),
        ("wait_agent", "p3"),
    ] {
        let span = one(&spans, &format!("execute_tool {tool}"));
        assert_eq!(span.parent_span_id, turn.span_id, "{tool} runs in the turn");
        assert_eq!(span.trace_id, turn.trace_id);
        assert_eq!(
            attr(span, "gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(attr(span, "gen_ai.tool.name").as_deref(), Some(tool));
        assert_eq!(attr(span, "gen_ai.tool.call.id").as_deref(), Some(call_id));
        assert_eq!(
            attr(span, "agentd.tool.outcome").as_deref(),
            Some("success")
        );
        assert_eq!(
            attr(span, "gen_ai.tool.call.arguments"),
            None,
            "content is opt-in"
        );
    }

    let chats = named(&spans, "chat mock-model");
    let parent_chats: Vec<&&Span> = chats
        .iter()
        .filter(|s| s.parent_span_id == turn.span_id)
        .collect();
    assert_eq!(parent_chats.len(), 4, "the parent's four model calls");
    let mut inputs: Vec<i64> = parent_chats
        .iter()
        .map(|s| int_attr(s, "gen_ai.usage.input_tokens").unwrap())
        .collect();
    inputs.sort_unstable();
    assert_eq!(inputs, [100, 120, 140, 160]);
    for chat in &chats {
        assert_eq!(chat.kind, SpanKind::Client as i32);
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            attr(chat, "gen_ai.request.model").as_deref(),
            Some("mock-model")
        );
        // As the server named it in its stream.
        assert_eq!(
            attr(chat, "gen_ai.response.model").as_deref(),
            Some("mock-model")
        );
        // `[llm] provider` (default "openai") names the vendor of the single-endpoint form.
        assert_eq!(
            attr(chat, "gen_ai.provider.name").as_deref(),
            Some("openai")
        );
        assert!(int_attr(chat, "gen_ai.usage.output_tokens").unwrap() > 0);
        let Some(Any::DoubleValue(cost)) = value_of(&chat.attributes, "agentd.cost.usd") else {
            panic!("no cost on {chat:?}");
        };
        assert!(*cost > 0.0, "a priced call has a cost");
        assert!(
            matches!(
                value_of(&chat.attributes, "gen_ai.response.finish_reasons"),
                Some(Any::ArrayValue(_))
            ),
            "finish reasons are an array"
        );
        assert_eq!(
            attr(chat, "gen_ai.input.messages"),
            None,
            "content is opt-in"
        );
    }

    // The sub-agent's turn nests in the parent's; its model call nests in it.
    let child = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent ") && s.span_id != turn.span_id)
        .expect("the child's invoke_agent");
    assert_eq!(child.trace_id, turn.trace_id);
    assert_eq!(child.parent_span_id, turn.span_id);
    assert_eq!(attr(child, "gen_ai.conversation.id"), Some(session.clone()));
    let child_chat = chats
        .iter()
        .find(|s| s.parent_span_id == child.span_id)
        .expect("the child's chat span");
    assert_eq!(int_attr(child_chat, "gen_ai.usage.input_tokens"), Some(50));

    // Each model request carried the traceparent of its own chat span.
    let chat_ids: HashMap<String, String> = chats
        .iter()
        .map(|s| (hex(&s.span_id), hex(&s.trace_id)))
        .collect();
    let sent: Vec<String> = mock
        .recorded()
        .iter()
        .map(|r| {
            r.headers
                .get("traceparent")
                .expect("a traceparent on the model request")
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(sent.len(), 5);
    for traceparent in &sent {
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{traceparent}");
        assert_eq!(
            chat_ids.get(parts[2]).map(String::as_str),
            Some(parts[1]),
            "{traceparent}"
        );
    }

    // Only the GenAI spans are exported, under the service's name.
    for span in &spans {
        assert!(
            ["invoke_agent ", "chat ", "execute_tool "]
                .iter()
                .any(|prefix| span.name.starts_with(prefix)),
            "unexpected span {:?}",
            span.name
        );
    }
    assert!(
        collector
            .received
            .lock()
            .unwrap()
            .service_names
            .iter()
            .all(|n| n == "agentd")
    );
    collector
        .until("the GenAI client metrics", |r| {
            [
                "gen_ai.client.token.usage",
                "gen_ai.client.operation.duration",
            ]
            .iter()
            .all(|name| r.metric_names.iter().any(|m| m == name))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_recorded_only_when_asked() {
    let collector = Collector::start().await;
    let mock = MockLlm::start(Script::always(
        Reply::text(&["the answer"]).with_usage(7, 3),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = start_single(
        dir.path(),
        &mock,
        &format!(
            "[telemetry]\notlp_endpoint = \"{}/\"\ncapture_content = true\n",
            collector.url
        ),
    );
    let mut ws = server.ws().await;
    let session = ws.open().await;
    ws.call(
        "turn/start",
        json!({"session_id": session, "input": [{"kind": "text", "text": "the secret question"}]}),
    )
    .await;
    ws.notification("turn/completed").await;
    collector
        .until("the turn's spans", |r| {
            r.spans.iter().any(|s| s.name == "chat mock-model")
                && r.spans.iter().any(|s| s.name == "invoke_agent agentd")
        })
        .await;
    let spans = collector.spans();
    let chat = one(&spans, "chat mock-model");
    let input = attr(chat, "gen_ai.input.messages").expect("input messages");
    assert!(input.contains("the secret question"), "{input}");
    let output = attr(chat, "gen_ai.output.messages").expect("output messages");
    assert!(output.contains("the answer"), "{output}");
    // Without a caller's trace the turn is the root of its own.
    let turn = one(&spans, "invoke_agent agentd");
    assert!(turn.parent_span_id.is_empty(), "a root span");
}

/// A cluster node with telemetry on, over `db`.
fn cluster_node(
    root: &Path,
    name: &str,
    db: &Database,
    llm: &MockLlm,
    otlp: &str,
) -> ServerProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    start_agentd(
        &dir,
        &format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\ndata_dir = \"{data}\"\nworkspace = \"{ws}\"\n\
             database_url = \"{db}\"\n\
             [llm]\nbase_url = \"{llm}\"\nmodel = \"mock-model\"\n\
             [sandbox]\nmode = \"off\"\n\
             [cluster]\nenabled = true\nnode_id = \"{name}\"\nadvertise_url = \"http://127.0.0.1:{port}\"\n\
             secret = \"telemetry-cluster-secret-0123456789\"\n\
             [telemetry]\notlp_endpoint = \"{otlp}\"\n",
            data = dir.join("data").display(),
            ws = root.join("workspace").display(),
            db = db.url,
            llm = llm.base_url(),
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_forwarded_to_the_owning_node_stays_in_the_callers_trace() {
    let Some(db) = Database::create().await else {
        return;
    };
    let collector = Collector::start().await;
    let mock = MockLlm::start(Script::always(Reply::text(&["hello"]).with_usage(5, 1))).await;
    let root = tempfile::tempdir().unwrap();
    let owner = cluster_node(root.path(), "owner", &db, &mock, &collector.url);
    let follower = cluster_node(root.path(), "follower", &db, &mock, &collector.url);

    let mut on_owner = owner.ws().await;
    let session = on_owner.open().await;
    let mut on_follower = follower.ws().await;
    let (_, opened) = on_follower
        .call("session/open", json!({"session_id": session}))
        .await;
    assert!(opened.get("error").is_none(), "{opened}");
    let (_, started) = on_follower
        .call(
            "turn/start",
            json!({"session_id": session,
                   "input": [{"kind": "text", "text": "say hi"}],
                   "_meta": {"traceparent": format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")}}),
        )
        .await;
    assert!(started.get("error").is_none(), "{started}");
    on_follower.notification("turn/completed").await;
    collector
        .until("both nodes' spans", |r| {
            r.spans
                .iter()
                .any(|s| s.name == "cluster_forward turn/start")
                && r.spans.iter().any(|s| s.name == "chat mock-model")
                && r.spans.iter().any(|s| s.name == "invoke_agent agentd")
        })
        .await;
    let spans = collector.spans();
    let forward = one(&spans, "cluster_forward turn/start");
    assert_eq!(hex(&forward.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&forward.parent_span_id), CLIENT_SPAN);
    let turn = one(&spans, "invoke_agent agentd");
    assert_eq!(
        turn.trace_id, forward.trace_id,
        "one trace across the nodes"
    );
    assert_eq!(
        turn.parent_span_id, forward.span_id,
        "the owner's turn continues the follower's forward"
    );
    let chat = one(&spans, "chat mock-model");
    assert_eq!(chat.parent_span_id, turn.span_id);
    drop((owner, follower));
    db.drop_now().await;
}
