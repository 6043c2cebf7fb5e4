//! OpenTelemetry export: GenAI spans (`invoke_agent`, `chat {model}`, `execute_tool {tool}`)
//! and metrics (`gen_ai.client.*`) sent over OTLP/HTTP (protobuf) when an endpoint is set, and
//! W3C `traceparent` to carry a trace across the model request and node-to-node calls.
//!
//! The spans are ordinary `tracing` spans of target [`TARGET`]; the OpenTelemetry layer sees
//! only those, so the long-lived connection and session spans of the log never become traces.
//! When no endpoint is set nothing is built: [`on`] is false, the span helpers answer the plain
//! log spans the server always had, and the metric calls return at once.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span and event meant for export.
pub const TARGET: &str = "gen_ai";

/// Whether spans and metrics are exported.
static ON: AtomicBool = AtomicBool::new(false);
/// Whether message content goes into span attributes.
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);
/// The GenAI client metrics, built when export starts.
static METRICS: OnceLock<GenAiMetrics> = OnceLock::new();

/// Whether export is on (an endpoint was configured and the exporters were built).
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether `gen_ai.input.messages` and `gen_ai.output.messages` are recorded.
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// What export needs to know: the `[telemetry]` section read with the environment.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySettings {
    /// The OTLP/HTTP base URL (`/v1/traces` and `/v1/metrics` are appended); `None` leaves
    /// the `OTEL_EXPORTER_OTLP_*` variables to say where.
    pub endpoint: Option<String>,
    /// Whether message content is recorded.
    pub capture_content: bool,
}

impl TelemetrySettings {
    /// Whether export is asked for: an endpoint in the configuration or one of the standard
    /// variables, and `OTEL_SDK_DISABLED` not `true`.
    pub fn wanted(&self, env: &dyn Fn(&str) -> Option<String>) -> bool {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return false;
        }
        self.endpoint.as_deref().is_some_and(|e| !e.is_empty())
            || [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ]
            .iter()
            .any(|name| env(name).is_some_and(|v| !v.is_empty()))
    }
}

/// The running exporters; [`Telemetry::shutdown`] sends what is still queued.
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// Why export could not start: an exporter refused its settings (a malformed endpoint or
/// header variable).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The span exporter.
    #[error("[telemetry] the OTLP span exporter: {0}")]
    Spans(#[source] opentelemetry_otlp::ExporterBuildError),
    /// The metric exporter.
    #[error("[telemetry] the OTLP metric exporter: {0}")]
    Metrics(#[source] opentelemetry_otlp::ExporterBuildError),
}

impl Telemetry {
    /// Builds the span and metric exporters and turns export on; an error names what was
    /// wrong (a malformed endpoint or header variable). Call it outside any async runtime:
    /// the exporters send from threads of their own with a blocking HTTP client.
    pub fn start(settings: &TelemetrySettings) -> Result<Self, TelemetryError> {
        let signal_url = |path: &str| {
            settings
                .endpoint
                .as_deref()
                .filter(|e| !e.is_empty())
                .map(|e| format!("{}{path}", e.trim_end_matches('/')))
        };
        let mut spans = opentelemetry_otlp::SpanExporter::builder().with_http();
        if let Some(url) = signal_url("/v1/traces") {
            spans = spans.with_endpoint(url);
        }
        let spans = spans.build().map_err(TelemetryError::Spans)?;
        let mut metrics = opentelemetry_otlp::MetricExporter::builder().with_http();
        if let Some(url) = signal_url("/v1/metrics") {
            metrics = metrics.with_endpoint(url);
        }
        let metrics = metrics.build().map_err(TelemetryError::Metrics)?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("agentd");
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        // The sampler comes from OTEL_TRACES_SAMPLER (and _ARG), parent-based by default.
        let tracer = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let meter = SdkMeterProvider::builder()
            .with_periodic_exporter(metrics)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let _ = METRICS.set(GenAiMetrics::new(&meter));
        CAPTURE_CONTENT.store(settings.capture_content, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
        Ok(Self { tracer, meter })
    }

    /// The `tracing` layer that turns spans of [`TARGET`] into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.tracer("agentd"))
            // Only the attributes of the conventions and agentd's own: no source location,
            // thread, target or busy/idle timings.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::INFO),
            )
    }

    /// Sends what is queued and stops the exporters (blocking; call it off the runtime).
    pub fn shutdown(self) {
        ON.store(false, Ordering::Relaxed);
        if let Err(err) = self.tracer.shutdown() {
            eprintln!("agentd: telemetry: spans not all sent at shutdown: {err}");
        }
        if let Err(err) = self.meter.shutdown() {
            eprintln!("agentd: telemetry: metrics not all sent at shutdown: {err}");
        }
    }
}

/// The W3C `traceparent` of `span`, when export is on and the span is being recorded.
pub fn traceparent_of(span: &Span) -> Option<String> {
    if !on() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// The `traceparent` of the current span, when there is one to pass on.
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&Span::current())
}

/// Makes the trace `traceparent` names the parent of `span` (which must not have been
/// entered yet); a malformed value is ignored, as the W3C rules say.
pub fn adopt_parent(span: &Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|_| on()) else {
        return;
    };
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(context);
}

/// The span a turn runs in: `invoke_agent` when exporting, a root of its own trace unless
/// `parent` (a sub-agent's parent turn) or an adopted `traceparent` says otherwise; else the
/// log's plain `turn` span.
pub fn agent_span(session_id: &str, turn_id: &str, agent: &str, parent: Option<&Span>) -> Span {
    if !on() {
        return tracing::info_span!("turn", turn_id = %turn_id);
    }
    tracing::info_span!(
        target: TARGET,
        parent: parent.and_then(Span::id),
        "invoke_agent",
        otel.name = %format!("invoke_agent {agent}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %agent,
        gen_ai.conversation.id = %session_id,
        agentd.turn.id = %turn_id,
    )
}

/// A `chat {model}` span for one model request, or a disabled span when not exporting.
pub fn chat_span(provider: &str, model: &str) -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %provider,
        gen_ai.request.model = %model,
    )
}

/// What one model request came to, for its span and the client metrics.
#[derive(Debug, Clone, Default)]
pub struct ChatOutcome<'a> {
    /// The provider's name (`gen_ai.provider.name`).
    pub provider: &'a str,
    /// The model asked for.
    pub model: &'a str,
    /// Why the model stopped.
    pub finish_reason: Option<&'a str>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// What the request cost.
    pub cost_usd: f64,
    /// From sending to the first streamed fragment.
    pub first_chunk: Option<Duration>,
    /// The whole request.
    pub duration: Duration,
    /// The failure's kind, when it failed.
    pub error: Option<&'a str>,
}

/// Records `outcome` on the chat span and in the client metrics.
pub fn chat_finished(span: &Span, outcome: &ChatOutcome<'_>) {
    if !on() {
        return;
    }
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(reason) = outcome.finish_reason {
        span.set_attribute(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(
                vec![opentelemetry::StringValue::from(reason.to_string())].into(),
            ),
        );
    }
    if outcome.error.is_none() {
        span.set_attribute("gen_ai.usage.input_tokens", tokens(outcome.input_tokens));
        span.set_attribute("gen_ai.usage.output_tokens", tokens(outcome.output_tokens));
        span.set_attribute(
            "gen_ai.usage.cache_read.input_tokens",
            tokens(outcome.cache_read_tokens),
        );
        span.set_attribute(
            "gen_ai.usage.cache_creation.input_tokens",
            tokens(outcome.cache_write_tokens),
        );
        span.set_attribute("agentd.cost.usd", outcome.cost_usd);
    }
    if let Some(first) = outcome.first_chunk {
        span.set_attribute(
            "agentd.time_to_first_chunk_ms",
            first.as_secs_f64() * 1000.0,
        );
    }
    if let Some(kind) = outcome.error {
        failed(span, kind);
    }
    if let Some(metrics) = METRICS.get() {
        metrics.record(outcome);
    }
}

/// An `execute_tool {tool}` span for one tool call the model made, or a disabled span.
pub fn tool_span(tool: &str, call_id: &str) -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = "function",
    )
}

/// A span of agentd's own work inside a turn (`compaction`, a pipeline node), with `name` as
/// its operation, or a disabled span.
pub fn work_span(name: &'static str, detail: &str) -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "agentd",
        otel.name = %if detail.is_empty() { name.to_string() } else { format!("{name} {detail}") },
        otel.kind = "internal",
        agentd.operation = name,
    )
}

/// Marks `span` failed with `error.type = kind`.
pub fn failed(span: &Span, kind: &str) {
    if !on() {
        return;
    }
    span.set_attribute("error.type", kind.to_string());
    span.set_status(opentelemetry::trace::Status::error(kind.to_string()));
}

/// Sets one attribute on `span` when exporting.
pub fn attribute(span: &Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    if on() {
        span.set_attribute(key, value);
    }
}

/// Adds a span event (an approval asked or answered, a hook's decision) when exporting.
pub fn event(span: &Span, name: &'static str, attributes: Vec<KeyValue>) {
    if on() {
        span.add_event(name, attributes);
    }
}

/// The GenAI client metrics of the semantic conventions.
struct GenAiMetrics {
    token_usage: Histogram<u64>,
    duration: Histogram<f64>,
    first_chunk: Histogram<f64>,
}

impl GenAiMetrics {
    fn new(provider: &SdkMeterProvider) -> Self {
        use opentelemetry::metrics::MeterProvider as _;
        let meter = provider.meter("agentd");
        Self {
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens used per model request, by gen_ai.token.type")
                .with_boundaries(vec![
                    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0,
                    1048576.0, 4194304.0, 16777216.0, 67108864.0,
                ])
                .build(),
            duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("The duration of model requests")
                .with_boundaries(vec![
                    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92,
                ])
                .build(),
            first_chunk: meter
                .f64_histogram("gen_ai.client.operation.time_to_first_chunk")
                .with_unit("s")
                .with_description("From a streamed model request to its first chunk")
                .with_boundaries(vec![
                    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                ])
                .build(),
        }
    }

    fn record(&self, outcome: &ChatOutcome<'_>) {
        let mut labels = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", outcome.provider.to_string()),
            KeyValue::new("gen_ai.request.model", outcome.model.to_string()),
        ];
        if let Some(kind) = outcome.error {
            labels.push(KeyValue::new("error.type", kind.to_string()));
        }
        self.duration
            .record(outcome.duration.as_secs_f64(), &labels);
        if let Some(first) = outcome.first_chunk {
            self.first_chunk.record(first.as_secs_f64(), &labels);
        }
        if outcome.error.is_none() {
            for (kind, count) in [
                ("input", outcome.input_tokens),
                ("output", outcome.output_tokens),
            ] {
                let mut labels = labels.clone();
                labels.push(KeyValue::new("gen_ai.token.type", kind));
                self.token_usage.record(count, &labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_is_wanted_only_with_an_endpoint_and_not_disabled() {
        let settings = TelemetrySettings::default();
        let none = |_: &str| None;
        assert!(!settings.wanted(&none));
        let env =
            |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://h:4318".into());
        assert!(settings.wanted(&env));
        let configured = TelemetrySettings {
            endpoint: Some("http://127.0.0.1:4318".into()),
            capture_content: false,
        };
        assert!(configured.wanted(&none));
        let disabled = |name: &str| (name == "OTEL_SDK_DISABLED").then(|| "TRUE".into());
        assert!(!configured.wanted(&disabled));
    }

    #[test]
    fn nothing_is_carried_while_export_is_off() {
        assert!(!on());
        let span = agent_span("s", "t", "agentd", None);
        assert_eq!(traceparent_of(&span), None);
        assert!(chat_span("p", "m").is_disabled());
    }
}
