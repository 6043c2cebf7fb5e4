//! `telemetry`: what OpenTelemetry export costs a turn with tool calls. The tool-call turns of
//! `turns`, measured as `turns` measures them, on an agentd with export off, then on a fresh one
//! whose `[telemetry] otlp_endpoint` is an OTLP/HTTP sink in this process. The sink answers
//! every export at once, so the difference is agentd's own work: the spans and metrics built,
//! batched, encoded and sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::serve::ListenerExt;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use tokio::task::JoinHandle;

use crate::Settings;
use crate::child::ServerProcess;
use crate::client::RpcClient;
use crate::mock_model::{MODEL, MockModel};
use crate::report::{Table, count, ratio, us};
use crate::turns::{TurnRun, measure, with_server_state};

/// Turns of each run unless --requests says otherwise.
const TURNS: u64 = 500;
/// Most unmeasured turns of each run.
const MAX_WARMUP: u64 = 50;

/// The sink's running totals; the handlers add, [`OtlpSink::received`] reads.
#[derive(Debug, Default)]
struct Counters {
    trace_requests: AtomicU64,
    trace_bytes: AtomicU64,
    spans: AtomicU64,
    metric_requests: AtomicU64,
    metric_bytes: AtomicU64,
}

/// What the sink had received at one moment, or between two.
#[derive(Debug, Clone, Copy, Default)]
struct Received {
    /// `POST /v1/traces` requests.
    trace_requests: u64,
    /// Their bodies' bytes, as sent (protobuf, uncompressed unless agentd compresses).
    trace_bytes: u64,
    /// Spans in those bodies, decoded: the check that none were dropped.
    spans: u64,
    /// `POST /v1/metrics` requests.
    metric_requests: u64,
    /// Their bodies' bytes.
    metric_bytes: u64,
}

impl Received {
    /// Requests of both signals.
    fn requests(&self) -> u64 {
        self.trace_requests + self.metric_requests
    }

    /// Body bytes of both signals.
    fn bytes(&self) -> u64 {
        self.trace_bytes + self.metric_bytes
    }

    /// What arrived after `earlier`.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            trace_requests: self.trace_requests - earlier.trace_requests,
            trace_bytes: self.trace_bytes - earlier.trace_bytes,
            spans: self.spans - earlier.spans,
            metric_requests: self.metric_requests - earlier.metric_requests,
            metric_bytes: self.metric_bytes - earlier.metric_bytes,
        }
    }
}

/// An OTLP/HTTP collector that keeps nothing but counts; its task ends when this is dropped.
struct OtlpSink {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl OtlpSink {
    /// Serves `POST /v1/traces` and `POST /v1/metrics` on 127.0.0.1 port 0.
    async fn start() -> anyhow::Result<Self> {
        let counters = Arc::new(Counters::default());
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .with_state(Arc::clone(&counters));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            // The answer is one write; a lost option could only delay it.
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            counters,
            task,
        })
    }

    /// The base URL for `[telemetry] otlp_endpoint`: `http://127.0.0.1:PORT`.
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The totals so far.
    fn received(&self) -> Received {
        let c = &self.counters;
        Received {
            trace_requests: c.trace_requests.load(Ordering::Relaxed),
            trace_bytes: c.trace_bytes.load(Ordering::Relaxed),
            spans: c.spans.load(Ordering::Relaxed),
            metric_requests: c.metric_requests.load(Ordering::Relaxed),
            metric_bytes: c.metric_bytes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts a trace export and its spans; 200 with an empty body is an OTLP success.
async fn traces(State(counters): State<Arc<Counters>>, body: Bytes) -> StatusCode {
    counters.trace_requests.fetch_add(1, Ordering::Relaxed);
    counters
        .trace_bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    // A body that does not decode counts no spans, which the report then shows as missing.
    let spans = ExportTraceServiceRequest::decode(body).map_or(0, |request| {
        request
            .resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .map(|scope| scope.spans.len() as u64)
            .sum()
    });
    counters.spans.fetch_add(spans, Ordering::Relaxed);
    StatusCode::OK
}

/// Counts a metric export.
async fn metrics(State(counters): State<Arc<Counters>>, body: Bytes) -> StatusCode {
    counters.metric_requests.fetch_add(1, Ordering::Relaxed);
    counters
        .metric_bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    StatusCode::OK
}

/// One agentd's run: its turns, and what the sink received from it, up to its exit.
struct ExportRun {
    /// The measured turns.
    turns: TurnRun,
    /// What the sink received from this agentd.
    received: Received,
}

/// Measures tool-call turns with export off, then on, each on a fresh agentd.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let turns = settings.requests_or(TURNS);
    let warmup = settings.warmup(turns).min(MAX_WARMUP);
    let k = settings.tool_calls;
    println!("### telemetry: tool-call turns with the OTLP exporter off, then on");
    println!();
    println!(
        "{turns} measured turns of {k} tool calls after {warmup} unmeasured, as in `turns`, on \
         one agentd without `[telemetry]`, then on a fresh one whose `otlp_endpoint` is a sink \
         in this process that answers every export 200 at once; both on {}, the exporter's \
         batching at its defaults. The sink's counts run to agentd's exit, so they include the \
         warm-up turns and the flush at shutdown.",
        settings.backend()
    );
    println!();
    let mock = MockModel::start().await?;
    let sink = OtlpSink::start().await?;
    let off = export_run(settings, &mock, &sink, "", k, turns, warmup).await?;
    let config = format!("[telemetry]\notlp_endpoint = \"{}\"\n", sink.url());
    let on = export_run(settings, &mock, &sink, &config, k, turns, warmup).await?;

    let mut table = Table::new(&[
        "exporter",
        "turns",
        "p50 µs",
        "p90 µs",
        "CPU µs/turn",
        "mock µs/turn",
        "overhead p50 µs",
        "µs per tool call",
        "OTLP requests",
        "OTLP bytes",
    ]);
    for (label, run) in [("off", &off), ("on", &on)] {
        let measured = &run.turns.measured;
        table.row(vec![
            label.to_string(),
            count(measured.latencies.len() as u64),
            us(measured.latencies.p50()),
            us(measured.latencies.quantile(0.9)),
            us(measured.cpu_per_request()),
            us(run.turns.mock_per_turn),
            us(run.turns.overhead()),
            String::new(),
            count(run.received.requests()),
            count(run.received.bytes()),
        ]);
    }
    let micros = |run: &ExportRun, figure: fn(&TurnRun) -> f64| figure(&run.turns) * 1e6;
    let p50 = |run: &TurnRun| run.measured.latencies.p50().as_secs_f64();
    let p90 = |run: &TurnRun| run.measured.latencies.quantile(0.9).as_secs_f64();
    let cpu = |run: &TurnRun| run.measured.cpu_per_request().as_secs_f64();
    let overhead = |run: &TurnRun| run.overhead().as_secs_f64();
    // Signed, unlike a Duration: on a busy machine the exporter's cost can be within the noise.
    let difference =
        |figure: fn(&TurnRun) -> f64| format!("{:+.1}", micros(&on, figure) - micros(&off, figure));
    let per_call =
        |figure: fn(&TurnRun) -> f64| (micros(&on, figure) - micros(&off, figure)) / k as f64;
    table.row(vec![
        "on − off".to_string(),
        String::new(),
        difference(p50),
        difference(p90),
        difference(cpu),
        String::new(),
        difference(overhead),
        format!("{:+.1}", per_call(overhead)),
    ]);
    let quotient = |figure: fn(&TurnRun) -> f64| ratio(figure(&on.turns), figure(&off.turns));
    table.row(vec![
        "on ÷ off".to_string(),
        String::new(),
        quotient(p50),
        quotient(p90),
        quotient(cpu),
        String::new(),
        quotient(overhead),
    ]);
    table.print();
    println!();
    let received = &on.received;
    let made = (turns + warmup) as f64;
    println!(
        "Per tool call, exporter on less off: {:+.1} µs of turn overhead (p50) and {:+.1} µs of \
         agentd CPU, the turn's own spans (`invoke_agent`, two `chat`) spread over the {k} \
         calls. From the exporter-on agentd's {} turns the sink received {} spans ({:.2} a \
         turn; {} expected: `invoke_agent`, two `chat {MODEL}`, {k} `execute_tool read_file`) \
         in {} trace requests of {} bytes ({:.0} bytes a span), and {} metric requests of {} \
         bytes. The exporter-off agentd sent {} requests.",
        per_call(overhead),
        per_call(cpu),
        count(turns + warmup),
        count(received.spans),
        received.spans as f64 / made,
        k + 3,
        count(received.trace_requests),
        count(received.trace_bytes),
        received.trace_bytes as f64 / received.spans.max(1) as f64,
        count(received.metric_requests),
        count(received.metric_bytes),
        count(off.received.requests()),
    );
    Ok(())
}

/// Starts agentd with `config`, measures its tool-call turns, stops it (which flushes its
/// exporter), and reads what the sink received meanwhile.
async fn export_run(
    settings: &Settings,
    mock: &MockModel,
    sink: &OtlpSink,
    config: &str,
    k: usize,
    turns: u64,
    warmup: u64,
) -> anyhow::Result<ExportRun> {
    let before = sink.received();
    let base_url = mock.base_url();
    let mut agentd =
        ServerProcess::agentd_configured(settings, Some((&base_url, MODEL)), config).await?;
    let mut client = RpcClient::connect(agentd.addr()).await?;
    let input = format!("tools {k}");
    let measured = measure(&agentd, &mut client, mock, &input, None, turns, warmup).await;
    let measured = measured.map_err(|err| with_server_state(err, &mut agentd))?;
    client.close().await?;
    // The exporter's last batch and the metrics are sent at shutdown; stop waits for the exit.
    agentd.stop().await?;
    Ok(ExportRun {
        turns: measured,
        received: sink.received().since(&before),
    })
}
