//! `run_pipeline`: a DAG of model calls. Each node is one tool-less model call whose prompt is
//! followed by the outputs of the nodes it depends on; independent nodes run in parallel.
//!
//! The whole graph is checked (ids, dependencies, cycles, prompts) before any call is made, so
//! a malformed pipeline costs nothing. Every node that was attempted — called, or refused by the
//! budget — yields a typed cost row in the result's `costs`, which the session's ledger records
//! (clients see them as `structured_metadata.node_costs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::parse_args;
use crate::llm::pricing::{Allowance, CallCost, Pricing};
use crate::llm::{ChatMessage, ChatRequest, ChatResponse, LlmError, Provider, Usage};
use crate::tools::{Effects, TokenUsage, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Model calls in flight at once when the call does not say.
pub const DEFAULT_MAX_PARALLEL: usize = 4;
/// The most model calls one pipeline may have in flight at once.
pub const MAX_PARALLEL: usize = 16;
/// The most nodes one pipeline may have.
pub const MAX_NODES: usize = 50;
/// The longest node id, in characters.
const MAX_ID_CHARS: usize = 64;
/// Bytes of each node's output shown to the calling model; dependents still get all of it.
pub const OUTPUT_CAP_BYTES: usize = 8 * 1024;
/// The system line of every node's call.
const SYSTEM_LINE: &str = "You are one step of a pipeline of model calls. Do the task below \
    directly and completely; your answer is passed on as plain text, so give the result itself, \
    without preamble.";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineArgs {
    nodes: Vec<NodeArgs>,
    #[serde(default)]
    max_parallel: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeArgs {
    id: String,
    prompt: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
}

/// One node of a checked pipeline.
#[derive(Debug)]
struct PlanNode {
    id: String,
    prompt: String,
    model: String,
    max_tokens: u32,
    /// Indices of the nodes it depends on, without repeats, in the order given.
    deps: Vec<usize>,
}

/// A pipeline that passed every check: acyclic, ids unique, dependencies known.
#[derive(Debug)]
struct Plan {
    nodes: Vec<PlanNode>,
    /// Every node index, dependencies before dependents, ties in the order given.
    order: Vec<usize>,
    max_parallel: usize,
}

/// Where one node stands while the pipeline runs.
#[derive(Debug, Clone)]
enum NodeState {
    Pending,
    Running {
        reserved_usd: f64,
    },
    Completed {
        output: String,
        cut_by_max_tokens: bool,
    },
    Failed {
        reason: &'static str,
        message: String,
    },
    Skipped {
        reason: &'static str,
        message: String,
    },
}

impl NodeState {
    fn is_done(&self) -> bool {
        !matches!(self, Self::Pending | Self::Running { .. })
    }

    fn did_not_complete(&self) -> bool {
        matches!(self, Self::Failed { .. } | Self::Skipped { .. })
    }
}

/// Runs a DAG of model calls against one provider, reserving each call's price against the
/// session's budget.
pub struct RunPipeline {
    provider: Arc<dyn Provider>,
    model: String,
    pricing: Pricing,
    default_max_tokens: u32,
}

impl RunPipeline {
    /// A pipeline tool calling `provider`; nodes use `model` and `default_max_tokens` unless
    /// they say otherwise, and are priced by `pricing`.
    pub fn new(
        provider: Arc<dyn Provider>,
        model: String,
        pricing: Pricing,
        default_max_tokens: u32,
    ) -> Self {
        Self {
            provider,
            model,
            pricing,
            default_max_tokens,
        }
    }

    /// A cost row for `node`, stamped now.
    fn cost_row(
        &self,
        node: &PlanNode,
        reserved_usd: f64,
        usage: Usage,
        committed: bool,
    ) -> CallCost {
        let actual = self.pricing.cost_usd(&node.model, &usage);
        CallCost {
            node_id: node.id.clone(),
            model: node.model.clone(),
            reserved_usd,
            actual_usd: actual.unwrap_or(0.0),
            tokens_in: usage.prompt_tokens,
            tokens_out: usage.completion_tokens,
            tokens_cached: usage.cached_tokens,
            committed,
            created_at: rfc3339_now(),
            unpriced: actual.is_none(),
        }
    }

    /// What run_pipeline is, known without a model to run it with.
    pub fn spec() -> &'static ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "run_pipeline",
                "Run several model calls as a dependency graph and get all their answers at once. \
                 Each node is one self-contained model call without tools: it receives its prompt \
                 followed by the outputs of the nodes it depends on, each under a heading with \
                 that node's id. Nodes whose dependencies are done run in parallel. Use it to fan \
                 out independent sub-tasks (summaries, drafts, reviews) and to combine their \
                 results in a final node. A node whose dependency failed is skipped. Each call is \
                 charged to the session's budget.",
                json!({
                    "type": "object",
                    "properties": {
                        "nodes": {
                            "type": "array",
                            "description": format!(
                                "The model calls, 1 to {MAX_NODES}. Dependencies must not form a cycle."
                            ),
                            "minItems": 1,
                            "maxItems": MAX_NODES,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": {
                                        "type": "string",
                                        "description": format!(
                                            "A unique name for the node (at most {MAX_ID_CHARS} \
                                             characters), used in depends_on and in the result."
                                        )
                                    },
                                    "prompt": {
                                        "type": "string",
                                        "description": "The complete, self-contained task for this \
                                            call; the call sees nothing of your conversation, only \
                                            this text. Write {{id}} where a dependency's output \
                                            belongs; outputs of dependencies not placed that way \
                                            are appended after it."
                                    },
                                    "model": {
                                        "type": "string",
                                        "description": "The model to call for this node; omit to \
                                            use the session's model."
                                    },
                                    "depends_on": {
                                        "type": "array",
                                        "description": "Ids of the nodes whose outputs this node \
                                            needs; it starts once they have all completed. Omit \
                                            for a node that needs none.",
                                        "items": {
                                            "type": "string",
                                            "description": "The id of another node of this pipeline."
                                        }
                                    },
                                    "max_tokens": {
                                        "type": "integer",
                                        "minimum": 1,
                                        "description": "The most tokens this node's answer may \
                                            have; omit for the default. The budget reserves for \
                                            the whole amount before the call."
                                    }
                                },
                                "required": ["id", "prompt"],
                                "additionalProperties": false
                            }
                        },
                        "max_parallel": {
                            "type": "integer",
                            "description": format!(
                                "How many model calls may run at once, 1 to {MAX_PARALLEL} (values \
                                 outside are clamped); default {DEFAULT_MAX_PARALLEL}."
                            )
                        }
                    },
                    "required": ["nodes"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .contract()
            .tags(&["agents"])
            .exclusive()
            .uses_models()
        });
        &META
    }
}

#[async_trait]
impl Tool for RunPipeline {
    fn meta(&self) -> &ToolMeta {
        Self::spec()
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: PipelineArgs = parse_args(&self.meta().name, args)?;
        let plan = check(args, &self.model, self.default_max_tokens)?;
        Ok(self.run(ctx, &plan).await)
    }
}

impl RunPipeline {
    /// Runs a checked plan to its end (or until cancelled) and reports every node.
    async fn run(&self, ctx: &ToolContext, plan: &Plan) -> ToolResult {
        let total = plan.nodes.len();
        let mut states = vec![NodeState::Pending; total];
        let mut costs: Vec<CallCost> = Vec::new();
        let mut allowance = Allowance::new(ctx.budget_left_usd);
        let mut in_flight = FuturesUnordered::new();
        // Each running node's span, closed when its call ends.
        let mut node_spans = vec![tracing::Span::none(); total];
        let mut reported_done = 0;
        let mut cancelled = false;
        loop {
            if ctx.cancel.is_cancelled() {
                cancelled = true;
                break;
            }
            // One pass in dependency order settles every node whose dependencies are settled,
            // including dependents of a node the budget refuses in this very pass.
            for &idx in &plan.order {
                if !matches!(states[idx], NodeState::Pending) {
                    continue;
                }
                let node = &plan.nodes[idx];
                if let Some(&dep) = node.deps.iter().find(|&&d| states[d].did_not_complete()) {
                    states[idx] = NodeState::Skipped {
                        reason: "dependency_failed",
                        message: format!("dependency `{}` did not complete", plan.nodes[dep].id),
                    };
                    continue;
                }
                let ready = node
                    .deps
                    .iter()
                    .all(|&d| matches!(states[d], NodeState::Completed { .. }));
                if !ready || in_flight.len() >= plan.max_parallel {
                    continue;
                }
                let request = node_request(plan, idx, &states);
                let estimate = Pricing::estimate_prompt_tokens(&request.messages, &[]);
                let reserved = self
                    .pricing
                    .reserve_usd(&node.model, estimate, node.max_tokens)
                    .unwrap_or(0.0);
                if let Err(left) = allowance.reserve(reserved) {
                    states[idx] = NodeState::Failed {
                        reason: "budget_exceeded",
                        message: format!(
                            "the call could cost up to {reserved:.4} USD but only {left:.4} USD \
                             of the session's budget is left"
                        ),
                    };
                    costs.push(self.cost_row(node, reserved, Usage::default(), false));
                    continue;
                }
                states[idx] = NodeState::Running {
                    reserved_usd: reserved,
                };
                let span = crate::telemetry::work_span("pipeline_node", &node.id);
                crate::telemetry::attribute(&span, "gen_ai.request.model", node.model.clone());
                in_flight.push(
                    call_node(
                        Arc::clone(&self.provider),
                        idx,
                        request,
                        ctx.cancel.child_token(),
                    )
                    .instrument(span.clone()),
                );
                node_spans[idx] = span;
            }
            let done = states.iter().filter(|s| s.is_done()).count();
            if done != reported_done {
                reported_done = done;
                ctx.progress(
                    format!("{done}/{total} nodes"),
                    Some(done as f32 / total as f32),
                )
                .await;
            }
            if in_flight.is_empty() {
                break;
            }
            let (idx, outcome) = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    cancelled = true;
                    break;
                }
                Some(finished) = in_flight.next() => finished,
            };
            let reserved = match states[idx] {
                NodeState::Running { reserved_usd } => reserved_usd,
                _ => 0.0,
            };
            let node = &plan.nodes[idx];
            let usage = match &outcome {
                Ok(response) => response.usage.unwrap_or_default(),
                Err(_) => Usage::default(),
            };
            let row = self.cost_row(node, reserved, usage, true);
            let span = std::mem::replace(&mut node_spans[idx], tracing::Span::none());
            crate::telemetry::attribute(&span, "agentd.cost.usd", row.actual_usd);
            crate::telemetry::attribute(
                &span,
                "gen_ai.usage.input_tokens",
                i64::try_from(usage.prompt_tokens).unwrap_or(i64::MAX),
            );
            crate::telemetry::attribute(
                &span,
                "gen_ai.usage.output_tokens",
                i64::try_from(usage.completion_tokens).unwrap_or(i64::MAX),
            );
            if let Err(err) = &outcome {
                crate::telemetry::failed(&span, err.kind().as_str());
            }
            allowance.settle(reserved, row.actual_usd);
            costs.push(row);
            states[idx] = match outcome {
                Ok(response) => NodeState::Completed {
                    cut_by_max_tokens: response.finish_reason.as_deref() == Some("length"),
                    output: response.text,
                },
                Err(err) => NodeState::Failed {
                    reason: err.kind().as_str(),
                    message: err.to_string(),
                },
            };
        }
        // Dropping the calls stops them; what they cost is unknown, so their rows carry none.
        drop(in_flight);
        if cancelled {
            for idx in plan.order.iter().copied() {
                let node = &plan.nodes[idx];
                match states[idx] {
                    NodeState::Running { reserved_usd } => {
                        costs.push(self.cost_row(node, reserved_usd, Usage::default(), true));
                        states[idx] = NodeState::Failed {
                            reason: "cancelled",
                            message: "cancelled while the model was answering".into(),
                        };
                    }
                    NodeState::Pending => {
                        states[idx] = NodeState::Skipped {
                            reason: "cancelled",
                            message: "the pipeline was cancelled before the node started".into(),
                        };
                    }
                    _ => {}
                }
            }
        }
        report(plan, &states, costs, cancelled)
    }
}

/// One node's model call; answers with the node's index so results can arrive in any order.
async fn call_node(
    provider: Arc<dyn Provider>,
    idx: usize,
    request: ChatRequest,
    cancel: CancellationToken,
) -> (usize, Result<ChatResponse, LlmError>) {
    // Nobody reads the deltas: the pipeline reports whole outputs, and interleaved fragments of
    // parallel nodes would mean nothing to the client.
    let (deltas, _) = mpsc::channel(1);
    (idx, provider.stream_chat(request, deltas, cancel).await)
}

/// The request for node `idx`: the system line, then its prompt with each `{{id}}` of a
/// dependency replaced by that dependency's output; dependencies the prompt does not place are
/// appended under a heading naming them.
fn node_request(plan: &Plan, idx: usize, states: &[NodeState]) -> ChatRequest {
    let node = &plan.nodes[idx];
    let mut content = node.prompt.clone();
    let mut unplaced = Vec::new();
    for &dep in &node.deps {
        if let NodeState::Completed { output, .. } = &states[dep] {
            let placeholder = format!("{{{{{}}}}}", plan.nodes[dep].id);
            if node.prompt.contains(&placeholder) {
                content = content.replace(&placeholder, output);
            } else {
                unplaced.push((dep, output));
            }
        }
    }
    for (dep, output) in unplaced {
        content.push_str(&format!(
            "\n\n## Output of `{}`\n\n{output}",
            plan.nodes[dep].id
        ));
    }
    ChatRequest {
        model: node.model.clone(),
        messages: vec![
            ChatMessage::System {
                content: SYSTEM_LINE.to_string(),
            },
            ChatMessage::user(content),
        ],
        tools: Vec::new().into(),
        max_tokens: node.max_tokens,
        reasoning_effort: None,
    }
}

/// The tool result: every node's status and (capped) output in dependency order for the model,
/// node statuses and cost rows for the host.
fn report(plan: &Plan, states: &[NodeState], costs: Vec<CallCost>, cancelled: bool) -> ToolResult {
    let count = |f: fn(&NodeState) -> bool| states.iter().filter(|s| f(s)).count();
    let completed = count(|s| matches!(s, NodeState::Completed { .. }));
    let failed = count(|s| matches!(s, NodeState::Failed { .. }));
    let skipped = count(|s| matches!(s, NodeState::Skipped { .. }));
    let total = plan.nodes.len();
    let mut text = format!(
        "pipeline{}: {completed} of {total} nodes completed, {failed} failed, {skipped} skipped",
        if cancelled { " cancelled" } else { "" }
    );
    let mut nodes = Vec::with_capacity(total);
    for &idx in &plan.order {
        let id = &plan.nodes[idx].id;
        match &states[idx] {
            NodeState::Completed {
                output,
                cut_by_max_tokens,
            } => {
                text.push_str(&format!("\n\n## {id} (completed)\n"));
                if *cut_by_max_tokens {
                    text.push_str("[the answer stopped at its max_tokens limit]\n");
                }
                text.push_str(&cap_output(output));
                nodes.push(json!({"id": id, "status": "completed"}));
            }
            NodeState::Failed { reason, message } => {
                text.push_str(&format!("\n\n## {id} (failed: {reason})\n{message}"));
                nodes.push(json!({
                    "id": id, "status": "failed", "reason": reason, "error": message
                }));
            }
            NodeState::Skipped { reason, message } => {
                text.push_str(&format!("\n\n## {id} (skipped)\n{message}"));
                nodes.push(json!({
                    "id": id, "status": "skipped", "reason": reason, "error": message
                }));
            }
            // Unreachable after `run`: every node is settled; kept total for safety.
            NodeState::Pending | NodeState::Running { .. } => {
                text.push_str(&format!("\n\n## {id} (not run)"));
                nodes.push(json!({"id": id, "status": "skipped", "error": "not run"}));
            }
        }
    }
    let tokens = TokenUsage {
        input_tokens: costs.iter().map(|c| c.tokens_in).sum(),
        output_tokens: costs.iter().map(|c| c.tokens_out).sum(),
    };
    let mut metadata = json!({ "nodes": nodes });
    let error_kind = if cancelled {
        Some("cancelled")
    } else if completed == total {
        None
    } else if states.iter().any(|s| {
        matches!(
            s,
            NodeState::Failed {
                reason: "budget_exceeded",
                ..
            }
        )
    }) {
        Some("budget_exceeded")
    } else {
        Some("node_failed")
    };
    let mut result = match error_kind {
        None => ToolResult::ok(text),
        Some(kind) => {
            metadata["error"] = json!({"kind": kind});
            ToolResult::failure(text)
        }
    };
    result.tokens_used = Some(tokens);
    result.costs = costs;
    result.with_metadata(metadata)
}

/// At most [`OUTPUT_CAP_BYTES`] of `output`, cut on a character boundary, saying when cut.
fn cap_output(output: &str) -> String {
    if output.len() <= OUTPUT_CAP_BYTES {
        return output.to_string();
    }
    let mut end = OUTPUT_CAP_BYTES;
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[output cut at {end} of {} bytes]",
        &output[..end],
        output.len()
    )
}

/// Now, UTC, as RFC 3339.
fn rfc3339_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Checks the whole pipeline before anything runs: every problem is reported at once, and a
/// cycle is named node by node.
fn check(
    args: PipelineArgs,
    default_model: &str,
    default_max_tokens: u32,
) -> Result<Plan, ToolError> {
    let invalid =
        |message: String| ToolError::model("invalid_input", format!("run_pipeline: {message}"));
    if args.nodes.is_empty() {
        return Err(invalid("give at least one node".into()));
    }
    if args.nodes.len() > MAX_NODES {
        return Err(invalid(format!(
            "{} nodes given; a pipeline has at most {MAX_NODES}",
            args.nodes.len()
        )));
    }
    let mut problems: Vec<String> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, node) in args.nodes.iter().enumerate() {
        if node.id.trim().is_empty() {
            problems.push(format!("node #{} has an empty id", i + 1));
            continue;
        }
        if node.id.chars().count() > MAX_ID_CHARS {
            problems.push(format!(
                "node id `{}` is longer than {MAX_ID_CHARS} characters",
                node.id
            ));
        }
        if let Some(&first) = index.get(node.id.as_str()) {
            problems.push(format!(
                "duplicate id `{}` (nodes #{} and #{})",
                node.id,
                first + 1,
                i + 1
            ));
        } else {
            index.insert(&node.id, i);
        }
    }
    for (i, node) in args.nodes.iter().enumerate() {
        let name = if node.id.trim().is_empty() {
            format!("#{}", i + 1)
        } else {
            format!("`{}`", node.id)
        };
        if node.prompt.trim().is_empty() {
            problems.push(format!("node {name} has an empty prompt"));
        }
        if node.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            problems.push(format!(
                "node {name} has an empty model; omit it to use the default"
            ));
        }
        if node.max_tokens == Some(0) {
            problems.push(format!("node {name} has max_tokens 0; give at least 1"));
        }
        for dep in &node.depends_on {
            if !index.contains_key(dep.as_str()) {
                problems.push(format!("node {name} depends on unknown node `{dep}`"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(invalid(problems.join("; ")));
    }
    let deps: Vec<Vec<usize>> = args
        .nodes
        .iter()
        .map(|node| {
            let mut deps: Vec<usize> = Vec::new();
            for dep in &node.depends_on {
                if let Some(&d) = index.get(dep.as_str())
                    && !deps.contains(&d)
                {
                    deps.push(d);
                }
            }
            deps
        })
        .collect();
    let nodes: Vec<PlanNode> = args
        .nodes
        .into_iter()
        .zip(deps)
        .map(|(node, deps)| PlanNode {
            model: node.model.unwrap_or_else(|| default_model.to_string()),
            max_tokens: node.max_tokens.unwrap_or(default_max_tokens).max(1),
            id: node.id,
            prompt: node.prompt,
            deps,
        })
        .collect();
    let order = topological_order(&nodes).map_err(|cycle| {
        let names: Vec<String> = cycle
            .iter()
            .map(|&i| format!("`{}`", nodes[i].id))
            .collect();
        invalid(format!(
            "the dependencies form a cycle: {} (each depends on the next); a node cannot \
             depend on itself, directly or through others",
            names.join(" → ")
        ))
    })?;
    let max_parallel = args
        .max_parallel
        .unwrap_or(DEFAULT_MAX_PARALLEL as u64)
        .clamp(1, MAX_PARALLEL as u64) as usize;
    Ok(Plan {
        nodes,
        order,
        max_parallel,
    })
}

/// Kahn's algorithm, taking ready nodes in the order given; on a cycle, the nodes of one cycle
/// as a path that starts and ends at the same node, each depending on the next.
fn topological_order(nodes: &[PlanNode]) -> Result<Vec<usize>, Vec<usize>> {
    let mut waiting_on: Vec<usize> = nodes.iter().map(|n| n.deps.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for &dep in &node.deps {
            dependents[dep].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| waiting_on[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &d in &dependents[i] {
            waiting_on[d] -= 1;
            if waiting_on[d] == 0 {
                ready.insert(d);
            }
        }
    }
    if order.len() == nodes.len() {
        return Ok(order);
    }
    // Every node left over waits on a dependency that is left over too, so following such
    // dependencies from any of them must come back to a node already on the path.
    let left: Vec<bool> = waiting_on.iter().map(|&w| w > 0).collect();
    let mut path: Vec<usize> = Vec::new();
    let mut position: HashMap<usize, usize> = HashMap::new();
    let mut current = left.iter().position(|&l| l).unwrap_or(0);
    loop {
        if let Some(&start) = position.get(&current) {
            let mut cycle = path[start..].to_vec();
            cycle.push(current);
            return Err(cycle);
        }
        position.insert(current, path.len());
        path.push(current);
        match nodes[current].deps.iter().find(|&&d| left[d]) {
            Some(&next) => current = next,
            // Cannot happen (see above); the path so far still names the nodes involved.
            None => return Err(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::pricing::ModelPrice;
    use crate::tools::{ConcurrencyClass, ToolEvent};
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Semaphore;

    const WAIT: Duration = Duration::from_secs(10);

    /// What the fake model does for one prompt.
    #[derive(Clone)]
    enum Behaviour {
        /// Answers with this text and usage.
        Answer(String, Usage),
        /// Fails with this error.
        Fail(LlmError),
        /// Takes a permit from the gate, then answers with this text.
        Gated(String),
    }

    /// A model that answers by the first line of the user message (the node's prompt).
    struct FakeProvider {
        behaviours: HashMap<String, Behaviour>,
        requests: Mutex<Vec<ChatRequest>>,
        gate: Semaphore,
        entered: mpsc::UnboundedSender<String>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    impl FakeProvider {
        fn new(behaviours: &[(&str, Behaviour)]) -> (Arc<Self>, mpsc::UnboundedReceiver<String>) {
            let (entered, entered_rx) = mpsc::unbounded_channel();
            let provider = Self {
                behaviours: behaviours
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
                requests: Mutex::new(Vec::new()),
                gate: Semaphore::new(0),
                entered,
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
            };
            (Arc::new(provider), entered_rx)
        }

        fn requests(&self) -> Vec<ChatRequest> {
            self.requests.lock().unwrap().clone()
        }

        /// The user message of the call whose prompt starts with `prompt`.
        fn user_message(&self, prompt: &str) -> String {
            let requests = self.requests();
            let matching: Vec<String> = requests
                .iter()
                .map(|r| user_text(r).to_string())
                .filter(|text| text.lines().next() == Some(prompt))
                .collect();
            assert_eq!(matching.len(), 1, "calls for {prompt}: {matching:?}");
            matching[0].clone()
        }
    }

    fn user_text(request: &ChatRequest) -> &str {
        request
            .messages
            .iter()
            .find_map(|m| match m {
                ChatMessage::User { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .unwrap()
    }

    #[async_trait]
    impl Provider for FakeProvider {
        async fn stream_chat(
            &self,
            request: ChatRequest,
            _deltas: mpsc::Sender<crate::llm::Delta>,
            cancel: CancellationToken,
        ) -> Result<ChatResponse, LlmError> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let prompt = user_text(&request).lines().next().unwrap_or("").to_string();
            self.requests.lock().unwrap().push(request);
            let _ = self.entered.send(prompt.clone());
            let behaviour =
                self.behaviours.get(&prompt).cloned().unwrap_or_else(|| {
                    Behaviour::Answer(format!("answer to {prompt}"), usage(10, 5))
                });
            let outcome = match behaviour {
                Behaviour::Answer(text, usage) => Ok(response(text, usage)),
                Behaviour::Fail(err) => Err(err),
                Behaviour::Gated(text) => {
                    tokio::select! {
                        permit = self.gate.acquire() => {
                            permit.unwrap().forget();
                            Ok(response(text, usage(1, 1)))
                        }
                        () = cancel.cancelled() => Err(LlmError::Cancelled),
                    }
                }
            };
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            outcome
        }
    }

    fn usage(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            cache_write_tokens: 0,
        }
    }

    fn response(text: String, usage: Usage) -> ChatResponse {
        ChatResponse {
            reasoning: None,
            text,
            tool_calls: Vec::new(),
            usage: Some(usage),
            finish_reason: Some("stop".into()),
            first_token: None,
            model: None,
        }
    }

    fn pricing() -> Pricing {
        let mut table = BTreeMap::new();
        table.insert("m".to_string(), ModelPrice::new(2.0, 4.0));
        Pricing::new(table)
    }

    fn tool(provider: &Arc<FakeProvider>) -> RunPipeline {
        RunPipeline::new(provider.clone(), "m".into(), pricing(), 100)
    }

    fn ctx() -> ToolContext {
        ToolContext::detached(PathBuf::new())
    }

    async fn run(tool: &RunPipeline, ctx: &ToolContext, args: Value) -> ToolResult {
        tokio::time::timeout(WAIT, tool.call(ctx, &args))
            .await
            .expect("pipeline finished")
            .expect("pipeline ran")
    }

    fn meta(result: &ToolResult) -> &Value {
        result.structured_metadata.as_ref().unwrap()
    }

    fn status_of(result: &ToolResult, id: &str) -> String {
        meta(result)["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .map(|n| n["status"].as_str().unwrap().to_string())
            .unwrap()
    }

    /// The cost rows as clients receive them.
    fn node_costs(result: &ToolResult) -> Value {
        result.wire_metadata().unwrap()["node_costs"].clone()
    }

    fn cost_of(result: &ToolResult, id: &str) -> Value {
        node_costs(result)
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["node_id"] == id)
            .unwrap()
            .clone()
    }

    #[tokio::test]
    async fn placeholders_put_a_dependency_output_where_the_prompt_says() {
        let (provider, _entered) = FakeProvider::new(&[
            (
                "write a haiku",
                Behaviour::Answer("old pond".into(), usage(1, 1)),
            ),
            (
                "name a colour",
                Behaviour::Answer("blue".into(), usage(1, 1)),
            ),
            ("wrap it", Behaviour::Answer("done".into(), usage(1, 1))),
        ]);
        let result = run(
            &tool(&provider),
            &ctx(),
            json!({"nodes": [
                {"id": "haiku", "prompt": "write a haiku"},
                {"id": "colour", "prompt": "name a colour"},
                {"id": "wrap", "prompt": "wrap it\n<<{{haiku}}>>", "depends_on": ["haiku", "colour"]},
            ]}),
        )
        .await;
        assert!(result.success, "{}", result.output);
        assert_eq!(
            provider.user_message("wrap it"),
            "wrap it\n<<old pond>>\n\n## Output of `colour`\n\nblue",
            "placed where named; the unnamed dependency is appended"
        );
    }

    #[tokio::test]
    async fn a_chain_passes_each_output_downstream_and_reports_progress() {
        let (provider, _entered) = FakeProvider::new(&[
            (
                "write a haiku",
                Behaviour::Answer("old pond".into(), usage(10, 5)),
            ),
            (
                "translate it",
                Behaviour::Answer("vieil étang".into(), usage(20, 6)),
            ),
            ("review it", Behaviour::Answer("fine".into(), usage(30, 7))),
        ]);
        let (events, mut events_rx) = mpsc::channel(64);
        let mut ctx = ctx();
        ctx.events = Some(events);
        let result = run(
            &tool(&provider),
            &ctx,
            json!({"nodes": [
                {"id": "review", "prompt": "review it", "depends_on": ["translate"]},
                {"id": "haiku", "prompt": "write a haiku"},
                {"id": "translate", "prompt": "translate it", "depends_on": ["haiku"]},
            ]}),
        )
        .await;
        assert!(result.success, "{}", result.output);
        let prompts: Vec<String> = provider
            .requests()
            .iter()
            .map(|r| user_text(r).lines().next().unwrap().to_string())
            .collect();
        assert_eq!(prompts, ["write a haiku", "translate it", "review it"]);
        assert_eq!(provider.user_message("write a haiku"), "write a haiku");
        assert_eq!(
            provider.user_message("translate it"),
            "translate it\n\n## Output of `haiku`\n\nold pond"
        );
        assert_eq!(
            provider.user_message("review it"),
            "review it\n\n## Output of `translate`\n\nvieil étang"
        );
        for request in provider.requests() {
            assert!(request.tools.is_empty());
            assert_eq!(request.model, "m");
            assert_eq!(request.max_tokens, 100);
            assert!(matches!(request.messages[0], ChatMessage::System { .. }));
            assert_eq!(request.messages.len(), 2);
        }
        // The model reads the nodes in dependency order.
        let haiku = result
            .output
            .find("## haiku (completed)\nold pond")
            .unwrap();
        let translate = result.output.find("## translate (completed)").unwrap();
        let review = result.output.find("## review (completed)\nfine").unwrap();
        assert!(haiku < translate && translate < review, "{}", result.output);
        assert!(
            result
                .output
                .starts_with("pipeline: 3 of 3 nodes completed")
        );
        assert_eq!(
            result.tokens_used,
            Some(TokenUsage {
                input_tokens: 60,
                output_tokens: 18
            })
        );
        let mut progress = Vec::new();
        while let Ok(event) = events_rx.try_recv() {
            if let ToolEvent::Progress {
                message, fraction, ..
            } = event
            {
                progress.push((message, fraction));
            }
        }
        assert_eq!(progress.last(), Some(&("3/3 nodes".to_string(), Some(1.0))));
        assert_eq!(progress.len(), 3, "{progress:?}");
    }

    #[tokio::test]
    async fn a_diamond_joins_both_branches_and_runs_each_node_once() {
        let (provider, _entered) = FakeProvider::new(&[
            ("root", Behaviour::Answer("R".into(), usage(1, 1))),
            ("left", Behaviour::Answer("L".into(), usage(1, 1))),
            ("right", Behaviour::Answer("Rt".into(), usage(1, 1))),
            ("join", Behaviour::Answer("J".into(), usage(1, 1))),
        ]);
        let result = run(
            &tool(&provider),
            &ctx(),
            json!({"nodes": [
                {"id": "d", "prompt": "join", "depends_on": ["b", "c", "b"]},
                {"id": "b", "prompt": "left", "depends_on": ["a"]},
                {"id": "c", "prompt": "right", "depends_on": ["a"]},
                {"id": "a", "prompt": "root"},
            ]}),
        )
        .await;
        assert!(result.success, "{}", result.output);
        let requests = provider.requests();
        assert_eq!(requests.len(), 4);
        assert_eq!(user_text(&requests[0]), "root");
        assert_eq!(user_text(&requests[3]).lines().next(), Some("join"));
        assert_eq!(
            provider.user_message("left"),
            "left\n\n## Output of `a`\n\nR"
        );
        assert_eq!(
            provider.user_message("right"),
            "right\n\n## Output of `a`\n\nR"
        );
        assert_eq!(
            provider.user_message("join"),
            "join\n\n## Output of `b`\n\nL\n\n## Output of `c`\n\nRt"
        );
        assert_eq!(node_costs(&result).as_array().unwrap().len(), 4);
        let ids: Vec<&str> = meta(&result)["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
    }

    #[tokio::test]
    async fn malformed_pipelines_are_refused_before_any_call() {
        let (provider, _entered) = FakeProvider::new(&[]);
        let tool = tool(&provider);
        let cases = [
            (
                json!({"nodes": [
                    {"id": "a", "prompt": "p", "depends_on": ["c"]},
                    {"id": "b", "prompt": "p", "depends_on": ["a"]},
                    {"id": "c", "prompt": "p", "depends_on": ["b"]},
                    {"id": "d", "prompt": "p", "depends_on": ["a"]},
                    {"id": "e", "prompt": "p"},
                ]}),
                vec!["cycle", "`a` → `c` → `b` → `a`"],
            ),
            (
                json!({"nodes": [{"id": "self", "prompt": "p", "depends_on": ["self"]}]}),
                vec!["cycle", "`self` → `self`"],
            ),
            (
                json!({"nodes": [{"id": "a", "prompt": "p"}, {"id": "a", "prompt": "q"}]}),
                vec!["duplicate id `a`"],
            ),
            (
                json!({"nodes": [{"id": "a", "prompt": "p", "depends_on": ["ghost"]}]}),
                vec!["node `a` depends on unknown node `ghost`"],
            ),
            (
                json!({"nodes": [{"id": "a", "prompt": "  "}, {"id": "", "prompt": "p"}]}),
                vec!["node `a` has an empty prompt", "node #2 has an empty id"],
            ),
            (json!({"nodes": []}), vec!["at least one node"]),
            (
                json!({"nodes": [{"id": "a", "prompt": "p", "max_tokens": 0}]}),
                vec!["max_tokens 0"],
            ),
            (
                json!({"nodes": [{"id": "a", "prompt": "p", "extra": 1}]}),
                vec!["unknown field"],
            ),
        ];
        for (args, needles) in cases {
            let err = tool.call(&ctx(), &args).await.unwrap_err();
            let ToolError::Model { kind, message } = err else {
                panic!("not a model error for {args}");
            };
            assert_eq!(kind, "invalid_input", "{message}");
            for needle in needles {
                assert!(message.contains(needle), "{message} lacks {needle}");
            }
        }
        let many: Vec<Value> = (0..=MAX_NODES)
            .map(|i| json!({"id": format!("n{i}"), "prompt": "p"}))
            .collect();
        let err = tool
            .call(&ctx(), &json!({ "nodes": many }))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at most 50"), "{err}");
        assert!(provider.requests().is_empty());
    }

    #[tokio::test]
    async fn a_cycle_message_leaves_out_nodes_merely_downstream_of_it() {
        let (provider, _entered) = FakeProvider::new(&[]);
        let err = tool(&provider)
            .call(
                &ctx(),
                &json!({"nodes": [
                    {"id": "after", "prompt": "p", "depends_on": ["x"]},
                    {"id": "x", "prompt": "p", "depends_on": ["y"]},
                    {"id": "y", "prompt": "p", "depends_on": ["x"]},
                ]}),
            )
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("`x` → `y` → `x`"), "{message}");
        assert!(!message.contains("after"), "{message}");
        assert!(provider.requests().is_empty());
    }

    #[test]
    fn max_parallel_is_clamped_and_defaults_to_four() {
        let plan_with = |max_parallel: Value| {
            let args: PipelineArgs = serde_json::from_value(json!({
                "nodes": [{"id": "a", "prompt": "p"}],
                "max_parallel": max_parallel
            }))
            .unwrap();
            check(args, "m", 10).unwrap().max_parallel
        };
        assert_eq!(plan_with(json!(0)), 1);
        assert_eq!(plan_with(json!(100)), MAX_PARALLEL);
        assert_eq!(plan_with(json!(3)), 3);
        assert_eq!(plan_with(Value::Null), DEFAULT_MAX_PARALLEL);
    }

    #[tokio::test]
    async fn no_more_than_max_parallel_calls_are_in_flight() {
        let (provider, mut entered) = FakeProvider::new(&[
            ("one", Behaviour::Gated("1".into())),
            ("two", Behaviour::Gated("2".into())),
            ("three", Behaviour::Gated("3".into())),
        ]);
        let tool = Arc::new(tool(&provider));
        let running = {
            let tool = Arc::clone(&tool);
            tokio::spawn(async move {
                let args = json!({"max_parallel": 2, "nodes": [
                    {"id": "a", "prompt": "one"},
                    {"id": "b", "prompt": "two"},
                    {"id": "c", "prompt": "three"},
                ]});
                tool.call(&ctx(), &args).await
            })
        };
        let mut next_entry = async || {
            tokio::time::timeout(WAIT, entered.recv())
                .await
                .unwrap()
                .unwrap()
        };
        assert_eq!(next_entry().await, "one");
        assert_eq!(next_entry().await, "two");
        assert_eq!(provider.in_flight.load(Ordering::SeqCst), 2);
        // Both calls hold until a permit comes, so a third call starting now would be seen.
        provider.gate.add_permits(1);
        assert_eq!(next_entry().await, "three");
        provider.gate.add_permits(2);
        let result = tokio::time::timeout(WAIT, running)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(result.success, "{}", result.output);
        assert_eq!(provider.requests().len(), 3);
        assert_eq!(provider.max_in_flight.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failing_node_skips_its_dependents_but_not_the_rest() {
        let (provider, _entered) = FakeProvider::new(&[
            (
                "fails",
                Behaviour::Fail(LlmError::Unavailable("connection refused".into())),
            ),
            ("fine", Behaviour::Answer("ok".into(), usage(3, 4))),
        ]);
        let result = run(
            &tool(&provider),
            &ctx(),
            json!({"max_parallel": 1, "nodes": [
                {"id": "a", "prompt": "fails"},
                {"id": "b", "prompt": "after a", "depends_on": ["a"]},
                {"id": "c", "prompt": "after b", "depends_on": ["b"]},
                {"id": "d", "prompt": "fine"},
            ]}),
        )
        .await;
        assert!(!result.success);
        assert_eq!(meta(&result)["error"]["kind"], "node_failed");
        assert_eq!(status_of(&result, "a"), "failed");
        assert_eq!(status_of(&result, "b"), "skipped");
        assert_eq!(status_of(&result, "c"), "skipped");
        assert_eq!(status_of(&result, "d"), "completed");
        let nodes = meta(&result)["nodes"].as_array().unwrap();
        assert_eq!(nodes[0]["reason"], "llm_unavailable");
        assert!(nodes[1]["error"].as_str().unwrap().contains("`a`"));
        assert!(nodes[2]["error"].as_str().unwrap().contains("`b`"));
        assert!(
            result
                .output
                .contains("## a (failed: llm_unavailable)\nthe model is unavailable"),
            "{}",
            result.output
        );
        assert!(result.output.contains("## d (completed)\nok"));
        // Only the failed call and d were attempted; the failed one went ahead and cost nothing.
        let calls: Vec<String> = provider
            .requests()
            .iter()
            .map(|r| user_text(r).to_string())
            .collect();
        assert_eq!(calls, ["fails", "fine"]);
        let costs = node_costs(&result);
        let costs = costs.as_array().unwrap();
        assert_eq!(costs.len(), 2);
        assert_eq!(cost_of(&result, "a")["committed"], true);
        assert_eq!(cost_of(&result, "a")["actual_usd"], 0.0);
    }

    #[tokio::test]
    async fn the_budget_refuses_a_node_that_does_not_fit() {
        let (provider, _entered) = FakeProvider::new(&[]);
        let mut ctx = ctx();
        // 300k completion tokens at 4 USD per million reserve 1.2 USD and a bit: the first
        // fits in 2 USD, the second does not while the first's reservation stands.
        ctx.budget_left_usd = Some(2.0);
        let result = run(
            &tool(&provider),
            &ctx,
            json!({"nodes": [
                {"id": "a", "prompt": "first", "max_tokens": 300000},
                {"id": "b", "prompt": "second", "max_tokens": 300000},
                {"id": "c", "prompt": "after b", "depends_on": ["b"]},
                {"id": "small", "prompt": "small", "max_tokens": 10},
            ]}),
        )
        .await;
        assert!(!result.success);
        assert_eq!(meta(&result)["error"]["kind"], "budget_exceeded");
        assert_eq!(status_of(&result, "a"), "completed");
        assert_eq!(status_of(&result, "b"), "failed");
        assert_eq!(status_of(&result, "c"), "skipped");
        assert_eq!(status_of(&result, "small"), "completed");
        let nodes = meta(&result)["nodes"].as_array().unwrap();
        let b = nodes.iter().find(|n| n["id"] == "b").unwrap();
        assert_eq!(b["reason"], "budget_exceeded");
        let row = cost_of(&result, "b");
        assert_eq!(row["committed"], false);
        assert_eq!(row["actual_usd"], 0.0);
        assert_eq!(row["tokens_in"], 0);
        assert!(row["reserved_usd"].as_f64().unwrap() > 1.2);
        assert!(result.output.contains("## b (failed: budget_exceeded)"));
        let mut calls: Vec<String> = provider
            .requests()
            .iter()
            .map(|r| user_text(r).to_string())
            .collect();
        calls.sort();
        assert_eq!(calls, ["first", "small"]);
        assert_eq!(node_costs(&result).as_array().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn without_a_budget_nothing_is_refused() {
        let (provider, _entered) = FakeProvider::new(&[]);
        let result = run(
            &tool(&provider),
            &ctx(),
            json!({"nodes": [{"id": "a", "prompt": "huge", "max_tokens": 4000000000u32}]}),
        )
        .await;
        assert!(result.success, "{}", result.output);
    }

    #[tokio::test]
    async fn cost_rows_carry_tokens_prices_and_reservations() {
        let (provider, _entered) = FakeProvider::new(&[
            ("priced", Behaviour::Answer("p".into(), usage(1000, 500))),
            ("unpriced", Behaviour::Answer("u".into(), usage(70, 30))),
        ]);
        let mut ctx = ctx();
        ctx.budget_left_usd = Some(10.0);
        let result = run(
            &tool(&provider),
            &ctx,
            json!({"nodes": [
                {"id": "a", "prompt": "priced", "max_tokens": 800},
                {"id": "b", "prompt": "unpriced", "model": "other", "depends_on": ["a"]},
            ]}),
        )
        .await;
        assert!(result.success, "{}", result.output);
        let requests = provider.requests();
        let a = cost_of(&result, "a");
        assert_eq!(a["model"], "m");
        assert_eq!(a["tokens_in"], 1000);
        assert_eq!(a["tokens_out"], 500);
        assert_eq!(a["committed"], true);
        assert!((a["actual_usd"].as_f64().unwrap() - 0.004).abs() < 1e-12);
        let estimate = Pricing::estimate_prompt_tokens(&requests[0].messages, &[]);
        let expected = pricing().reserve_usd("m", estimate, 800).unwrap();
        assert!((a["reserved_usd"].as_f64().unwrap() - expected).abs() < 1e-12);
        assert!(a.get("unpriced").is_none());
        let created = a["created_at"].as_str().unwrap();
        assert!(created.ends_with('Z'), "{created}");
        time::OffsetDateTime::parse(created, &time::format_description::well_known::Rfc3339)
            .unwrap();

        let b = cost_of(&result, "b");
        assert_eq!(requests[1].model, "other");
        assert_eq!(requests[1].max_tokens, 100);
        assert_eq!(b["model"], "other");
        assert_eq!(b["unpriced"], true);
        assert_eq!(b["actual_usd"], 0.0);
        assert_eq!(b["reserved_usd"], 0.0);
        assert_eq!(b["tokens_in"], 70);
        assert_eq!(b["tokens_out"], 30);
        assert_eq!(b["committed"], true);
    }

    #[tokio::test]
    async fn cancelling_stops_the_pipeline_and_skips_what_is_left() {
        let (provider, mut entered) = FakeProvider::new(&[
            ("quick", Behaviour::Answer("q".into(), usage(5, 5))),
            ("slow", Behaviour::Gated("never".into())),
        ]);
        let tool = Arc::new(tool(&provider));
        let ctx = ctx();
        let cancel = ctx.cancel.clone();
        let running = {
            let tool = Arc::clone(&tool);
            tokio::spawn(async move {
                let args = json!({"max_parallel": 1, "nodes": [
                    {"id": "a", "prompt": "quick"},
                    {"id": "b", "prompt": "slow"},
                    {"id": "c", "prompt": "later"},
                    {"id": "d", "prompt": "after b", "depends_on": ["b"]},
                ]});
                tool.call(&ctx, &args).await
            })
        };
        loop {
            let prompt = tokio::time::timeout(WAIT, entered.recv())
                .await
                .unwrap()
                .unwrap();
            if prompt == "slow" {
                break;
            }
        }
        cancel.cancel();
        let result = tokio::time::timeout(WAIT, running)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!result.success);
        assert_eq!(meta(&result)["error"]["kind"], "cancelled");
        assert!(result.output.starts_with("pipeline cancelled: 1 of 4"));
        assert_eq!(status_of(&result, "a"), "completed");
        assert_eq!(status_of(&result, "b"), "failed");
        assert_eq!(status_of(&result, "c"), "skipped");
        assert_eq!(status_of(&result, "d"), "skipped");
        assert_eq!(provider.requests().len(), 2);
        let costs = node_costs(&result);
        let costs = costs.as_array().unwrap();
        assert_eq!(costs.len(), 2);
        assert_eq!(cost_of(&result, "b")["committed"], true);
        assert_eq!(cost_of(&result, "b")["tokens_out"], 0);
    }

    #[tokio::test]
    async fn long_outputs_are_cut_for_the_model_but_passed_whole_downstream() {
        let long = "é".repeat(OUTPUT_CAP_BYTES);
        let (provider, _entered) =
            FakeProvider::new(&[("long", Behaviour::Answer(long.clone(), usage(1, 1)))]);
        let result = run(
            &tool(&provider),
            &ctx(),
            json!({"nodes": [
                {"id": "a", "prompt": "long"},
                {"id": "b", "prompt": "use it", "depends_on": ["a"]},
            ]}),
        )
        .await;
        assert!(result.success);
        assert!(
            result.output.contains(&format!(
                "[output cut at {OUTPUT_CAP_BYTES} of {} bytes]",
                long.len()
            )),
            "{}",
            &result.output[..200]
        );
        assert!(result.output.len() < long.len());
        assert!(provider.user_message("use it").ends_with(&long));
    }

    #[test]
    fn the_schema_describes_every_property_and_the_tool_is_exclusive() {
        fn check_schema(path: &str, schema: &Value) {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                assert_eq!(schema["additionalProperties"], false, "{path}");
                for (name, prop) in props {
                    assert!(
                        prop.get("description").and_then(Value::as_str).is_some(),
                        "{path}/{name} has no description"
                    );
                    check_schema(&format!("{path}/{name}"), prop);
                }
            }
            if let Some(items) = schema.get("items") {
                check_schema(&format!("{path}[]"), items);
            }
        }
        let (provider, _entered) = FakeProvider::new(&[]);
        let tool = tool(&provider);
        check_schema("", &tool.meta().input_schema);
        assert_eq!(tool.meta().name, "run_pipeline");
        assert_eq!(tool.meta().tags, ["agents"]);
        assert_eq!(tool.meta().concurrency, ConcurrencyClass::Exclusive);
    }
}
