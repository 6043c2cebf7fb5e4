//! Prometheus metrics for one server instance, kept in its own registry (no process globals, so
//! several servers in one test process never mix their counts).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A call refused before it ran, as the counts see it; the dispatcher's error gives one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal<'a> {
    /// The tool's name, or `unknown` for a name no tool has.
    pub tool: &'a str,
    /// The refusal's error kind.
    pub kind: &'a str,
    /// Why a policy hid the tool, when a policy refused it.
    pub policy_reason: Option<&'a str>,
}

/// One model call's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached: u64,
}

/// Labels of a tool call count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolCallLabels {
    /// The tool's name (`unknown` for names no tool has, so clients cannot grow the label set).
    pub tool: String,
    /// `success`, `failure`, or the refusal kind.
    pub outcome: String,
}

/// Labels of a policy refusal count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `policy_deny`, `provider_policy`, `require_tags` or `context_filter`.
    pub reason: String,
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Sessions created.
    pub sessions_created: Counter,
    /// Session actors currently loaded.
    pub actors_live: Gauge,
    /// WebSocket connections currently open.
    pub connections: Gauge,
    /// Bytes of checkpoint contents kept, as the last sweep found them.
    pub checkpoint_store_bytes: Gauge,
    /// Events persisted and streamed.
    pub events_written: Counter,
    /// Commits of the event writer; `events_written` over this is the mean batch size.
    pub event_batches: Counter,
    /// Tool calls by tool and outcome.
    pub tool_calls: Family<ToolCallLabels, Counter>,
    /// Calls refused by a policy, by reason.
    pub policy_denials: Family<ReasonLabels, Counter>,
    /// Tools the LRU moved out of view.
    pub evictions: Counter,
    /// Turns by how they ended (`completed` or the `turn/error` code).
    pub turns: Family<OutcomeLabels, Counter>,
    /// Model tokens by direction (`in`, `out`, and `cached`: the part of `in` served from the
    /// provider's prompt cache).
    pub llm_tokens: Family<DirectionLabels, Counter>,
    /// Micro-USD spent on model calls (integer, so sums stay exact).
    pub llm_cost_micro_usd: Counter,
    /// Model calls whose model has no price in the config.
    pub unpriced_calls: Counter,
    /// Background task state changes, by the state entered.
    pub task_states: Family<StateLabels, Counter>,
    /// Cluster mode: sessions whose lease this node holds.
    pub cluster_owned_sessions: Gauge,
    /// Cluster mode: requests this node passed to a session's owner.
    pub cluster_forwarded: Counter,
    /// Cluster mode: sessions this node took over from a lost node.
    pub cluster_takeovers: Counter,
    /// Cluster mode: seconds from an event's commit on its owner to its notice here.
    pub cluster_notify_lag: Histogram,
    /// Cluster mode: writes of an actor refused because its session was taken over.
    pub cluster_fenced_writes: Counter,
    /// Seconds tool calls ran, by tool (from the start of the run to its result).
    pub tool_duration: Family<ToolLabels, Histogram>,
    /// Seconds from a request's arrival to its response's headers, by method, route and status.
    pub http_duration: Family<HttpLabels, Histogram>,
    /// Seconds model calls took, retries included, by outcome.
    pub model_duration: Family<OutcomeLabels, Histogram>,
    /// Seconds from sending a model call to its first streamed text or tool-call fragment.
    pub model_first_token: Histogram,
}

/// Labels of an HTTP request's duration.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The method (`other` for one outside the usual few, so clients cannot grow the label set).
    pub method: &'static str,
    /// The matched route in axum's syntax (`/api/sessions/{id}`), or `unmatched`.
    pub route: String,
    /// The response status.
    pub status: u16,
}

/// Labels of a per-tool figure.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// The tool's name.
    pub tool: String,
}

/// Labels of `agentd_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
}

/// Labels of a task state count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `running`, `completed`, `failed` or `cancelled`.
    pub state: String,
}

/// Labels of a turn count or a model call's duration.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `completed` (a turn), `ok` (a model call), or a `turn/error` code.
    pub outcome: String,
}

/// Labels of a token count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `in` (prompt) or `out` (completion).
    pub direction: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics in its own registry.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("agentd");
        let sessions_created = Counter::default();
        let actors_live = Gauge::default();
        let checkpoint_store_bytes = Gauge::default();
        let connections = Gauge::default();
        let events_written = Counter::default();
        let event_batches = Counter::default();
        let tool_calls = Family::<ToolCallLabels, Counter>::default();
        let policy_denials = Family::<ReasonLabels, Counter>::default();
        let evictions = Counter::default();
        let turns = Family::<OutcomeLabels, Counter>::default();
        let llm_tokens = Family::<DirectionLabels, Counter>::default();
        let llm_cost_micro_usd = Counter::default();
        let unpriced_calls = Counter::default();
        let task_states = Family::<StateLabels, Counter>::default();
        let cluster_owned_sessions = Gauge::default();
        let cluster_forwarded = Counter::default();
        let cluster_takeovers = Counter::default();
        let cluster_fenced_writes = Counter::default();
        // 100 µs to about 55 min.
        let tool_duration = Family::<ToolLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 3.0, 16))
        });
        registry.register(
            "tool_call_duration_seconds",
            "Seconds tool calls ran, by tool",
            tool_duration.clone(),
        );
        let http_duration = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            // 50 µs to about 2 min.
            Histogram::new(exponential_buckets(0.00005, 3.0, 14))
        });
        registry.register(
            "http_request_duration_seconds",
            "Seconds from a request's arrival to its response's headers",
            http_duration.clone(),
        );
        // 10 ms to about 22 min.
        let model_duration = Family::<OutcomeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.01, 2.5, 14))
        });
        registry.register(
            "model_call_duration_seconds",
            "Seconds model calls took, retries included, by outcome",
            model_duration.clone(),
        );
        // 1 ms to about 4 min.
        let model_first_token = Histogram::new(exponential_buckets(0.001, 2.5, 14));
        registry.register(
            "model_time_to_first_token_seconds",
            "Seconds from sending a model call to its first streamed fragment",
            model_first_token.clone(),
        );
        registry.register(
            "build",
            "The running build: its version",
            prometheus_client::metrics::info::Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        registry.register(
            "cluster_fenced_writes",
            "Writes refused because their session was taken over by another node",
            cluster_fenced_writes.clone(),
        );
        // 100 µs to about 3 s.
        let cluster_notify_lag = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "cluster_owned_sessions",
            "Sessions whose lease this node holds",
            cluster_owned_sessions.clone(),
        );
        registry.register(
            "cluster_forwarded_requests",
            "Requests passed to the node owning their session",
            cluster_forwarded.clone(),
        );
        registry.register(
            "cluster_takeovers",
            "Sessions taken over from a lost node",
            cluster_takeovers.clone(),
        );
        registry.register(
            "cluster_notify_lag_seconds",
            "Seconds from an event's commit on its owner to its notice on this node",
            cluster_notify_lag.clone(),
        );
        registry.register(
            "task_states",
            "Background task state changes by the state entered",
            task_states.clone(),
        );
        registry.register(
            "tool_evictions",
            "Tools evicted from view by the LRU",
            evictions.clone(),
        );
        registry.register("turns", "Turns by outcome", turns.clone());
        registry.register(
            "llm_tokens",
            "Model tokens by direction",
            llm_tokens.clone(),
        );
        registry.register(
            "llm_cost_micro_usd",
            "Spending on model calls in millionths of a USD",
            llm_cost_micro_usd.clone(),
        );
        registry.register(
            "llm_unpriced_calls",
            "Model calls whose model has no configured price",
            unpriced_calls.clone(),
        );
        registry.register(
            "sessions_created",
            "Sessions created",
            sessions_created.clone(),
        );
        registry.register("actors_live", "Session actors loaded", actors_live.clone());
        registry.register(
            "checkpoint_store_bytes",
            "Bytes of checkpoint contents kept, as the last sweep found them",
            checkpoint_store_bytes.clone(),
        );
        registry.register(
            "websocket_connections",
            "WebSocket connections open",
            connections.clone(),
        );
        registry.register(
            "events_written",
            "Session events persisted and streamed",
            events_written.clone(),
        );
        registry.register(
            "event_batches",
            "Commits of the event writer, each holding every event queued meanwhile",
            event_batches.clone(),
        );
        registry.register(
            "tool_calls",
            "Tool calls by tool and outcome",
            tool_calls.clone(),
        );
        registry.register(
            "policy_denials",
            "Tool calls refused by a policy, by reason",
            policy_denials.clone(),
        );
        Self {
            registry,
            sessions_created,
            actors_live,
            checkpoint_store_bytes,
            connections,
            events_written,
            event_batches,
            tool_calls,
            policy_denials,
            evictions,
            turns,
            llm_tokens,
            llm_cost_micro_usd,
            unpriced_calls,
            task_states,
            cluster_owned_sessions,
            cluster_forwarded,
            cluster_takeovers,
            cluster_notify_lag,
            cluster_fenced_writes,
            tool_duration,
            http_duration,
            model_duration,
            model_first_token,
        }
    }

    /// Records how long one HTTP request took to its response's headers.
    pub fn record_http(&self, method: &str, route: &str, status: u16, took: std::time::Duration) {
        let method = match method {
            "GET" => "GET",
            "POST" => "POST",
            "DELETE" => "DELETE",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "HEAD" => "HEAD",
            "OPTIONS" => "OPTIONS",
            _ => "other",
        };
        self.http_duration
            .get_or_create(&HttpLabels {
                method,
                route: route.to_string(),
                status,
            })
            .observe(took.as_secs_f64());
    }

    /// Records one model call: how long it took, how it ended (`ok` or the `turn/error` code),
    /// and, when it streamed anything, how long the first fragment took.
    pub fn record_model_call(
        &self,
        outcome: &str,
        took: std::time::Duration,
        first_token: Option<std::time::Duration>,
    ) {
        self.model_duration
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .observe(took.as_secs_f64());
        if let Some(first) = first_token {
            self.model_first_token.observe(first.as_secs_f64());
        }
    }

    /// Counts a background task entering `state`.
    pub fn record_task_state(&self, state: &str) {
        self.task_states
            .get_or_create(&StateLabels {
                state: state.to_string(),
            })
            .inc();
    }

    /// Counts a finished turn.
    pub fn record_turn(&self, outcome: &str) {
        self.turns
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Counts one model call's tokens and price.
    pub fn record_llm_usage(&self, tokens: TokenCounts, cost_usd: f64) {
        self.llm_tokens
            .get_or_create(&DirectionLabels { direction: "in" })
            .inc_by(tokens.prompt);
        self.llm_tokens
            .get_or_create(&DirectionLabels { direction: "out" })
            .inc_by(tokens.completion);
        self.llm_tokens
            .get_or_create(&DirectionLabels {
                direction: "cached",
            })
            .inc_by(tokens.cached);
        self.llm_cost_micro_usd
            .inc_by((cost_usd * 1_000_000.0).round().max(0.0) as u64);
    }

    /// Counts a finished tool call.
    pub fn record_tool_call(&self, tool: &str, outcome: &str) {
        self.tool_calls
            .get_or_create(&ToolCallLabels {
                tool: tool.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Records how long a call of `tool` ran.
    pub fn record_tool_duration(&self, tool: &str, took: std::time::Duration) {
        self.tool_duration
            .get_or_create(&ToolLabels {
                tool: tool.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a call refused before it ran.
    pub fn record_refusal(&self, refusal: Refusal<'_>) {
        self.record_tool_call(refusal.tool, refusal.kind);
        if let Some(reason) = refusal.policy_reason {
            self.policy_denials
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_and_tool_call_durations_are_exported() {
        let metrics = Metrics::new();
        metrics.record_tool_duration("read_file", std::time::Duration::from_millis(2));
        metrics.record_tool_duration("read_file", std::time::Duration::from_secs(1));
        let text = metrics.render();
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            text.contains(&format!(r#"agentd_build_info{{version="{version}"}} 1"#)),
            "{text}"
        );
        assert!(
            text.contains(r#"agentd_tool_call_duration_seconds_count{tool="read_file"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentd_tool_call_duration_seconds_sum{tool="read_file"} 1.002"#),
            "{text}"
        );
    }

    #[test]
    fn http_and_model_durations_are_exported_in_seconds() {
        let metrics = Metrics::new();
        let ms = std::time::Duration::from_millis;
        metrics.record_http("GET", "/api/sessions/{id}", 200, ms(3));
        metrics.record_http("BREW", "unmatched", 405, ms(1));
        metrics.record_model_call("ok", ms(1500), Some(ms(250)));
        metrics.record_model_call("llm_unavailable", ms(40), None);
        let text = metrics.render();
        for line in [
            r#"agentd_http_request_duration_seconds_count{method="GET",route="/api/sessions/{id}",status="200"} 1"#,
            r#"agentd_http_request_duration_seconds_sum{method="GET",route="/api/sessions/{id}",status="200"} 0.003"#,
            r#"agentd_http_request_duration_seconds_count{method="other",route="unmatched",status="405"} 1"#,
            r#"agentd_model_call_duration_seconds_sum{outcome="ok"} 1.5"#,
            r#"agentd_model_call_duration_seconds_count{outcome="llm_unavailable"} 1"#,
            "agentd_model_time_to_first_token_seconds_sum 0.25",
            "agentd_model_time_to_first_token_seconds_count 1",
        ] {
            assert!(text.contains(line), "missing {line} in {text}");
        }
    }

    #[test]
    fn renders_counts_with_labels() {
        let metrics = Metrics::new();
        metrics.record_tool_call("read_file", "success");
        metrics.record_refusal(Refusal {
            tool: "shell",
            kind: "policy_denied",
            policy_reason: Some("policy_deny"),
        });
        let text = metrics.render();
        assert!(
            text.contains(r#"agentd_tool_calls_total{tool="read_file",outcome="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentd_policy_denials_total{reason="policy_deny"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentd_tool_calls_total{tool="shell",outcome="policy_denied"} 1"#),
            "{text}"
        );
    }
}
