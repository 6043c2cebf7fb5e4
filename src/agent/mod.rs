//! The turn loop: call the model with the session's history and visible tools, stream its
//! answer, run the tool calls it makes (Safe batches concurrently, anything Exclusive one by
//! one), and repeat until it answers without tools or a limit is hit.
//!
//! A turn runs as its own task. It never touches the session's registry directly: the session
//! actor owns that, so the turn asks it (through [`TurnRequest`]) to tick the LRU, prepare calls
//! and emit events, which keeps one writer for every piece of session state. A sub-agent runs
//! the same loop over its own state ([`child`]).

pub(crate) mod child;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{Value, json};
use tokio::sync::{RwLock, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::llm::pricing::Pricing;
use crate::llm::{ChatMessage, ChatRequest, LlmError, Provider, ToolCall, Usage};
use crate::metrics::Metrics;
use crate::store::{CostRow, Store, timestamp_now};
use crate::tools::{
    CatalogCell, ConcurrencyClass, DispatchError, PreparedCall, ToolContext, ToolEvent, ToolResult,
    ToolSpec,
};

/// Most bytes of one tool result placed into the history; the head and tail are kept.
pub const MAX_TOOL_OUTPUT_IN_HISTORY: usize = 32 * 1024;

/// The instructions every conversation starts with.
pub const SYSTEM_PROMPT: &str = "You are a coding agent working in a workspace directory on \
the user's behalf. Use the tools to read, search, change and run things in the workspace; paths \
are relative to it. Prefer small, verifiable steps, keep the plan up to date with update_plan \
for longer work, and answer plainly once the task is done.";

/// Budget set aside for work in flight — a model call between its reservation and its cost
/// row, a pipeline until its rows are in — by a key unique in the session: spent as far as
/// the cap is concerned, so agents running at once cannot each spend what is left.
///
/// Checking the cap and holding, and writing rows and releasing, happen under one ledger
/// lock ([`BudgetHolds::ledger`]), so no reservation sees a spend that is in neither the
/// rows nor the holds.
#[derive(Debug, Clone, Default)]
pub struct BudgetHolds {
    held: Arc<std::sync::Mutex<std::collections::HashMap<String, f64>>>,
    ledger: Arc<tokio::sync::Mutex<()>>,
}

impl BudgetHolds {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, f64>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Serialises budget checks with the writes that settle them; hold it from reading the
    /// spend to holding, and from writing cost rows to releasing.
    pub async fn ledger(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ledger.lock().await
    }

    /// Sets aside `usd` for the work `id`.
    pub fn hold(&self, id: &str, usd: f64) {
        self.lock().insert(id.to_string(), usd);
    }

    /// Gives back what `id` held; its actual spending is in the cost rows by now.
    pub fn release(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Everything held.
    pub fn total(&self) -> f64 {
        self.lock().values().sum()
    }
}

/// What the turn loop needs from the server; shared by every turn of every session.
pub struct AgentSettings {
    /// The model.
    pub provider: Arc<dyn Provider>,
    /// The model id sent with every request.
    pub model: String,
    /// Completion token cap per call.
    pub max_tokens: u32,
    /// Prices by model.
    pub pricing: Pricing,
    /// Hard cap on a session's spending, in USD.
    pub budget_usd: Option<f64>,
    /// Model calls per turn before it stops.
    pub max_iterations: u32,
    /// Wall-clock limit of one turn.
    pub turn_timeout: Duration,
    /// Most sub-agents one session may have open at once.
    pub max_sub_agents: usize,
    /// The model's context window in tokens: prompt and completion together.
    pub context_window: u32,
}

impl AgentSettings {
    /// The same settings calling `model` instead.
    pub fn with_model(&self, model: &str) -> Self {
        Self {
            provider: Arc::clone(&self.provider),
            model: model.to_string(),
            max_tokens: self.max_tokens,
            pricing: self.pricing.clone(),
            budget_usd: self.budget_usd,
            max_iterations: self.max_iterations,
            turn_timeout: self.turn_timeout,
            max_sub_agents: self.max_sub_agents,
            context_window: self.context_window,
        }
    }
}

impl std::fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSettings")
            .field("model", &self.model)
            .field("max_iterations", &self.max_iterations)
            .finish_non_exhaustive()
    }
}

/// What a running turn asks of its session actor. Sent on one ordered channel, so events and
/// registry changes happen in the order the turn made them.
#[derive(Debug)]
pub(crate) enum TurnRequest {
    /// Persist and stream one notification.
    Emit { method: &'static str, params: Value },
    /// Tick the LRU, evict, announce changes, and answer with the specs for the next call.
    BeginIteration {
        reply: oneshot::Sender<Arc<[ToolSpec]>>,
    },
    /// Check and ready one tool call (activating a deferred tool on the way).
    Prepare {
        name: String,
        arguments: Value,
        reply: oneshot::Sender<Result<PreparedCall, DispatchError>>,
    },
    /// Start a spawn_only call in the background; the answer is its task_handle envelope.
    /// Boxed: a channel reserves room for its largest message up front.
    SpawnTask(Box<SpawnRequest>),
    /// Something a tool of the turn reported while running.
    ToolEvent(ToolEvent),
    /// The turn is over.
    Finished { turn_id: String },
}

/// A spawn_only call a turn hands to the session's task supervisor.
#[derive(Debug)]
pub(crate) struct SpawnRequest {
    pub call: PreparedCall,
    pub arguments: Value,
    pub tool_call_id: String,
    pub turn_id: String,
    pub reply: oneshot::Sender<ToolResult>,
}

/// Where a turn runs: the session actor for a session's own turns, a child agent for a
/// sub-agent's. The loop is one; the host decides where history, events and tools live.
pub(crate) trait TurnHost: Send + Sync + 'static {
    /// The instructions the conversation starts with.
    fn system_prompt(&self) -> &'static str {
        SYSTEM_PROMPT
    }

    /// Streams or records one notification.
    fn emit(&self, method: &'static str, params: Value) -> impl Future<Output = ()> + Send;

    /// Ticks the LRU and answers the specs for the next model call; `None` once the host
    /// stopped.
    fn begin_iteration(&self) -> impl Future<Output = Option<Arc<[ToolSpec]>>> + Send;

    /// Checks and readies one call; `None` once the host stopped.
    fn prepare(
        &self,
        name: &str,
        arguments: &Value,
    ) -> impl Future<Output = Option<Result<PreparedCall, DispatchError>>> + Send;

    /// Starts a spawn_only call in the background and answers with its envelope.
    fn spawn(
        &self,
        call: PreparedCall,
        arguments: Value,
        tool_call_id: &str,
        turn_id: &str,
    ) -> impl Future<Output = ToolResult> + Send;

    /// Passes on something a running tool reported.
    fn tool_event(&self, event: ToolEvent) -> impl Future<Output = ()> + Send;

    /// The conversation so far, valid for a model; the error is said to the client.
    fn history(&self) -> impl Future<Output = Result<Vec<ChatMessage>, String>> + Send;

    /// Adds one message to the conversation; the error is said to the client.
    fn remember(&self, message: &ChatMessage) -> impl Future<Output = Result<(), String>> + Send;

    /// The turn is over and has said so.
    fn finished(&self, turn_id: &str) -> impl Future<Output = ()> + Send;
}

/// A session's own turn: state lives with the session actor, the history in the store.
pub(crate) struct ActorLink {
    /// To the session actor.
    pub actor: mpsc::Sender<TurnRequest>,
    pub store: Arc<dyn Store>,
    pub session_id: Arc<str>,
}

impl TurnHost for ActorLink {
    async fn emit(&self, method: &'static str, params: Value) {
        let _ = self.actor.send(TurnRequest::Emit { method, params }).await;
    }

    async fn begin_iteration(&self) -> Option<Arc<[ToolSpec]>> {
        let (reply, specs) = oneshot::channel();
        self.actor
            .send(TurnRequest::BeginIteration { reply })
            .await
            .ok()?;
        specs.await.ok()
    }

    async fn prepare(
        &self,
        name: &str,
        arguments: &Value,
    ) -> Option<Result<PreparedCall, DispatchError>> {
        let (reply, answer) = oneshot::channel();
        self.actor
            .send(TurnRequest::Prepare {
                name: name.to_string(),
                arguments: arguments.clone(),
                reply,
            })
            .await
            .ok()?;
        answer.await.ok()
    }

    async fn spawn(
        &self,
        call: PreparedCall,
        arguments: Value,
        tool_call_id: &str,
        turn_id: &str,
    ) -> ToolResult {
        let (reply, envelope) = oneshot::channel();
        let request = TurnRequest::SpawnTask(Box::new(SpawnRequest {
            call,
            arguments,
            tool_call_id: tool_call_id.to_string(),
            turn_id: turn_id.to_string(),
            reply,
        }));
        match self.actor.send(request).await {
            Ok(()) => envelope
                .await
                .unwrap_or_else(|_| ToolResult::failure("the session stopped")),
            Err(_) => ToolResult::failure("the session stopped"),
        }
    }

    async fn tool_event(&self, event: ToolEvent) {
        let _ = self.actor.send(TurnRequest::ToolEvent(event)).await;
    }

    async fn history(&self) -> Result<Vec<ChatMessage>, String> {
        let stored = self.store.messages(&self.session_id).await.map_err(|err| {
            tracing::error!(%err, "history unreadable");
            "the conversation could not be read".to_string()
        })?;
        Ok(repair(
            stored
                .into_iter()
                .filter_map(|value| serde_json::from_value(value).ok())
                .collect(),
        ))
    }

    async fn remember(&self, message: &ChatMessage) -> Result<(), String> {
        append_history(&self.store, &self.session_id, message).await
    }

    async fn finished(&self, turn_id: &str) {
        let _ = self
            .actor
            .send(TurnRequest::Finished {
                turn_id: turn_id.to_string(),
            })
            .await;
    }
}

/// What counts against a session's cap: its committed cost rows plus budget held by running
/// work; `None` when the ledger cannot be read, which must refuse rather than allow.
pub(crate) async fn budget_spent(
    store: &Arc<dyn Store>,
    session_id: &str,
    holds: &BudgetHolds,
) -> Option<f64> {
    match store.cost_rows(session_id).await {
        Ok(rows) => Some(rows.iter().map(|r| r.actual_usd).sum::<f64>() + holds.total()),
        Err(err) => {
            tracing::error!(%err, "cost rows unreadable");
            None
        }
    }
}

/// Appends one message to a session's stored history; the error says what failed, for the
/// client, and was logged.
pub(crate) async fn append_history(
    store: &Arc<dyn Store>,
    session_id: &str,
    message: &ChatMessage,
) -> Result<(), String> {
    let value = serde_json::to_value(message).map_err(|err| {
        tracing::error!(%err, "history entry does not serialise");
        format!("history entry does not serialise: {err}")
    })?;
    store
        .append_message(session_id, &value)
        .await
        .map(|_| ())
        .map_err(|err| {
            tracing::error!(%err, "history not persisted");
            "the conversation could not be stored".to_string()
        })
}

/// How a turn's model calls are labelled in the session's cost ledger.
#[derive(Debug, Clone)]
pub(crate) struct CostLabels {
    /// `agent` for the session's own turns, `agent:<agent_id>` for a sub-agent's.
    pub node_id: String,
    /// The session turn the rows belong to, if any.
    pub turn_id: Option<String>,
    /// The task the rows belong to (a sub-agent is one).
    pub task_id: Option<String>,
}

/// One turn's inputs.
pub(crate) struct Turn<H: TurnHost> {
    pub turn_id: String,
    pub session_id: Arc<str>,
    /// The user message the turn starts with; `None` continues from the history as it is.
    pub input: Option<String>,
    pub settings: Arc<AgentSettings>,
    /// The session's cost ledger (a sub-agent bills its parent).
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// Where the turn's state lives.
    pub host: Arc<H>,
    pub labels: CostLabels,
    pub catalog: CatalogCell,
    pub cwd: std::path::PathBuf,
    pub cancel: CancellationToken,
    pub exclusivity: Arc<RwLock<()>>,
    /// Cost rows tools of this turn reported (concurrent calls add to it).
    pub node_costs: tokio::sync::Mutex<Vec<Value>>,
    /// Budget held by the session's running background work.
    pub holds: BudgetHolds,
}

/// How a turn ended.
enum Ending {
    Completed,
    Failed { code: &'static str, message: String },
}

/// Totals of the model calls one turn made.
#[derive(Default)]
struct Spend {
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
}

impl<H: TurnHost> Turn<H> {
    /// Runs the turn to its end and reports it; never panics the session.
    pub(crate) async fn run(self) {
        let started = Instant::now();
        let mut spend = Spend::default();
        let timeout = self.settings.turn_timeout;
        // The limit cancels the turn like an interruption, so the loop still answers every
        // tool call it started before it stops.
        let timer = {
            let cancel = self.cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                cancel.cancel();
            })
        };
        let mut outcome = self.turn_loop(&mut spend).await;
        let timed_out = timer.is_finished();
        timer.abort();
        if timed_out && !matches!(outcome, Ending::Completed) {
            outcome = Ending::Failed {
                code: "turn_timeout",
                message: format!("the turn took longer than {} s", timeout.as_secs()),
            };
        }
        let outcome_label = match &outcome {
            Ending::Completed => "completed",
            Ending::Failed { code, .. } => code,
        };
        self.metrics.record_turn(outcome_label);
        match outcome {
            Ending::Completed => {
                let session_cost = self.session_cost().await;
                let node_costs = std::mem::take(&mut *self.node_costs.lock().await);
                let node_usd: f64 = node_costs
                    .iter()
                    .filter_map(|row| row["actual_usd"].as_f64())
                    .sum();
                let mut params = json!({
                    "turn_id": self.turn_id,
                    "tokens_in": spend.tokens_in,
                    "tokens_out": spend.tokens_out,
                    "cost_usd": spend.cost_usd + node_usd,
                    "session_cost_usd": session_cost,
                });
                if !node_costs.is_empty() {
                    params["node_costs"] = Value::Array(node_costs);
                }
                self.emit("turn/completed", params).await;
            }
            Ending::Failed { code, message } => {
                self.emit(
                    "turn/error",
                    json!({"turn_id": self.turn_id, "code": code, "message": message}),
                )
                .await;
            }
        }
        tracing::info!(turn_id = %self.turn_id, elapsed_ms = started.elapsed().as_millis() as u64, outcome = outcome_label, "turn ended");
        self.host.finished(&self.turn_id).await;
    }

    async fn emit(&self, method: &'static str, params: Value) {
        self.host.emit(method, params).await;
    }

    /// What the session may still spend, when it has a budget.
    async fn budget_left(&self) -> Option<f64> {
        let cap = self.settings.budget_usd?;
        Some(
            self.budget_spent()
                .await
                .map_or(0.0, |spent| (cap - spent).max(0.0)),
        )
    }

    /// What counts against the cap: committed cost rows plus budget held by running work;
    /// `None` when the ledger cannot be read, which must refuse rather than allow.
    async fn budget_spent(&self) -> Option<f64> {
        budget_spent(&self.store, &self.session_id, &self.holds).await
    }

    async fn session_cost(&self) -> f64 {
        match self.store.cost_rows(&self.session_id).await {
            Ok(rows) => rows.iter().map(|r| r.actual_usd).sum(),
            Err(err) => {
                tracing::error!(%err, "cost rows unreadable");
                0.0
            }
        }
    }

    async fn remember(&self, message: &ChatMessage) -> Result<(), Ending> {
        self.host
            .remember(message)
            .await
            .map_err(|message| Ending::Failed {
                code: "internal",
                message,
            })
    }

    async fn history(&self) -> Result<Vec<ChatMessage>, Ending> {
        self.host.history().await.map_err(|message| Ending::Failed {
            code: "internal",
            message,
        })
    }

    async fn turn_loop(&self, spend: &mut Spend) -> Ending {
        if let Some(input) = &self.input
            && let Err(ending) = self
                .remember(&ChatMessage::User {
                    content: input.clone(),
                })
                .await
        {
            return ending;
        }
        for _ in 0..self.settings.max_iterations {
            if self.cancel.is_cancelled() {
                return interrupted();
            }
            let Some(specs) = self.host.begin_iteration().await else {
                return interrupted();
            };
            let history = match self.history().await {
                Ok(history) => history,
                Err(ending) => return ending,
            };
            let room = u64::from(self.settings.context_window)
                .saturating_sub(u64::from(self.settings.max_tokens));
            let (messages, estimate) =
                fit_context(self.host.system_prompt(), history, &specs, room);
            let request = ChatRequest {
                model: self.settings.model.clone(),
                messages,
                tools: specs,
                max_tokens: self.settings.max_tokens,
            };
            let reserved = match self.reserve(&request, estimate).await {
                Ok(reserved) => reserved,
                Err(ending) => return ending,
            };
            let response = match self.call_model(request).await {
                Ok(response) => response,
                Err(err) => {
                    // No row: what a failed call cost is unknown (see the protocol's deviations).
                    self.holds.release(&self.model_hold());
                    return Ending::Failed {
                        code: err.kind(),
                        message: err.to_string(),
                    };
                }
            };
            self.bill(reserved, response.usage, spend).await;
            if !response.text.is_empty() {
                self.emit(
                    "message/completed",
                    json!({"turn_id": self.turn_id, "text": response.text}),
                )
                .await;
            }
            // Some servers re-parse stored arguments and refuse malformed ones, so the history
            // keeps `{}` in their place; the tool message says what was wrong.
            let stored_calls = response
                .tool_calls
                .iter()
                .map(
                    |call| match serde_json::from_str::<Value>(&call.arguments) {
                        Ok(_) => call.clone(),
                        Err(_) => ToolCall {
                            arguments: "{}".into(),
                            ..call.clone()
                        },
                    },
                )
                .collect();
            let assistant = ChatMessage::Assistant {
                content: (!response.text.is_empty()).then(|| response.text.clone()),
                tool_calls: stored_calls,
            };
            if let Err(ending) = self.remember(&assistant).await {
                return ending;
            }
            if response.tool_calls.is_empty() {
                return Ending::Completed;
            }
            let results = self.run_batch(&response.tool_calls).await;
            for (call, content) in response.tool_calls.iter().zip(results) {
                let message = ChatMessage::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                };
                if let Err(ending) = self.remember(&message).await {
                    return ending;
                }
            }
            if self.cancel.is_cancelled() {
                return interrupted();
            }
        }
        Ending::Failed {
            code: "iteration_limit",
            message: format!(
                "the turn stopped after {} model calls",
                self.settings.max_iterations
            ),
        }
    }

    /// Reserves the call's worst-case price (its prompt `estimate` plus the completion cap)
    /// against the budget; refuses it when the session would pass the cap. Returns the
    /// reserved USD.
    async fn reserve(&self, request: &ChatRequest, estimate: u64) -> Result<f64, Ending> {
        let reserved = self
            .settings
            .pricing
            .reserve_usd(&request.model, estimate, request.max_tokens)
            .unwrap_or(0.0);
        let Some(cap) = self.settings.budget_usd else {
            return Ok(reserved);
        };
        let _ledger = self.holds.ledger().await;
        let spent = self.budget_spent().await.unwrap_or(f64::INFINITY);
        if spent + reserved <= cap {
            self.holds.hold(&self.model_hold(), reserved);
            return Ok(reserved);
        }
        let row = CostRow {
            session_id: self.session_id.to_string(),
            node_id: self.labels.node_id.clone(),
            model: request.model.clone(),
            reserved_usd: reserved,
            actual_usd: 0.0,
            tokens_in: 0,
            tokens_out: 0,
            committed: false,
            turn_id: self.labels.turn_id.clone(),
            task_id: self.labels.task_id.clone(),
            created_at: timestamp_now(),
        };
        if let Err(err) = self.store.insert_cost_row(&row).await {
            tracing::error!(%err, "cost row not persisted");
        }
        Err(Ending::Failed {
            code: "budget_exceeded",
            message: format!(
                "the session has spent {spent:.4} USD of its {cap:.4} USD budget; the next model \
                 call could cost up to {reserved:.4} USD"
            ),
        })
    }

    /// Records one model call's cost row and adds it to the turn's totals.
    async fn bill(&self, reserved: f64, usage: Option<Usage>, spend: &mut Spend) {
        let usage = usage.unwrap_or_default();
        let actual = match self.settings.pricing.cost_usd(&self.settings.model, &usage) {
            Some(cost) => cost,
            None => {
                self.metrics.unpriced_calls.inc();
                0.0
            }
        };
        self.metrics.record_llm_usage(usage, actual);
        spend.tokens_in += usage.prompt_tokens;
        spend.tokens_out += usage.completion_tokens;
        spend.cost_usd += actual;
        let row = CostRow {
            session_id: self.session_id.to_string(),
            node_id: self.labels.node_id.clone(),
            model: self.settings.model.clone(),
            reserved_usd: reserved,
            actual_usd: actual,
            tokens_in: usage.prompt_tokens as i64,
            tokens_out: usage.completion_tokens as i64,
            committed: true,
            turn_id: self.labels.turn_id.clone(),
            task_id: self.labels.task_id.clone(),
            created_at: timestamp_now(),
        };
        let _ledger = self.holds.ledger().await;
        if let Err(err) = self.store.insert_cost_row(&row).await {
            tracing::error!(%err, "cost row not persisted");
        }
        self.holds.release(&self.model_hold());
    }

    /// The hold of this turn's model call in flight (a turn makes one at a time).
    fn model_hold(&self) -> String {
        format!("{}#model", self.turn_id)
    }

    /// The hold of a tool call of this turn; call ids are the model's and may repeat across
    /// agents, turn ids do not.
    fn call_hold(&self, call_id: &str) -> String {
        format!("{}#{call_id}", self.turn_id)
    }

    /// Streams one model call, turning text deltas into `message/delta` events as they come.
    async fn call_model(&self, request: ChatRequest) -> Result<crate::llm::ChatResponse, LlmError> {
        let (deltas, mut delta_rx) = mpsc::channel::<String>(64);
        let forward = async {
            while let Some(text) = delta_rx.recv().await {
                self.emit(
                    "message/delta",
                    json!({"turn_id": self.turn_id, "text": text}),
                )
                .await;
            }
        };
        let call = self
            .settings
            .provider
            .stream_chat(request, deltas, self.cancel.child_token());
        let (outcome, ()) = tokio::join!(call, forward);
        outcome
    }

    /// Runs one batch of tool calls and returns the text each gives the model, in order.
    async fn run_batch(&self, calls: &[ToolCall]) -> Vec<String> {
        // Every call is checked first, in the model's order; refusals answer without running.
        let mut prepared: Vec<Result<(PreparedCall, Value), String>> = Vec::new();
        for call in calls {
            prepared.push(self.prepare(call).await);
        }
        let all_safe = prepared.iter().all(|p| match p {
            Ok((call, _)) => call.tool().concurrency_class() == ConcurrencyClass::Safe,
            Err(_) => true,
        });
        if all_safe {
            let runs = calls
                .iter()
                .zip(prepared)
                .map(|(call, prepared)| async move {
                    match prepared {
                        Ok((ready, arguments)) => self.execute(call, ready, arguments).await.0,
                        Err(refusal) => refusal,
                    }
                });
            return join_all(runs).await;
        }
        let mut results = Vec::with_capacity(calls.len());
        let mut failed = false;
        for (call, prepared) in calls.iter().zip(prepared) {
            if failed || self.cancel.is_cancelled() {
                results.push(
                    "cancelled: an earlier call of this batch failed, so this one was not run"
                        .to_string(),
                );
                continue;
            }
            match prepared {
                Ok((ready, arguments)) => {
                    let (text, success) = self.execute(call, ready, arguments).await;
                    failed = !success;
                    results.push(text);
                }
                Err(refusal) => {
                    failed = true;
                    results.push(refusal);
                }
            }
        }
        results
    }

    /// Parses and checks one call through the actor; a refusal becomes the model's text.
    async fn prepare(&self, call: &ToolCall) -> Result<(PreparedCall, Value), String> {
        let arguments: Value = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(&call.arguments).map_err(|err| {
                format!(
                    "the arguments of {} are not valid JSON ({err}); send a JSON object",
                    call.name
                )
            })?
        };
        match self.host.prepare(&call.name, &arguments).await {
            Some(Ok(ready)) => Ok((ready, arguments)),
            Some(Err(refusal)) => {
                self.metrics.record_refusal(&call.name, &refusal);
                Err(refusal.to_string())
            }
            None => Err("the session stopped".to_string()),
        }
    }

    /// Runs one prepared call with its notifications; returns the model's text and success.
    async fn execute(
        &self,
        call: &ToolCall,
        ready: PreparedCall,
        arguments: Value,
    ) -> (String, bool) {
        self.emit(
            "tool/started",
            json!({
                "turn_id": self.turn_id,
                "tool_call_id": call.id,
                "tool_name": call.name,
                "arguments": crate::tools::args::arguments_for_event(&arguments),
            }),
        )
        .await;
        let (events, mut events_rx) = mpsc::channel(64);
        let budget_left_usd = if ready.tool().uses_models() {
            let _ledger = self.holds.ledger().await;
            let left = self.budget_left().await;
            if let Some(left) = left {
                self.holds.hold(&self.call_hold(&call.id), left);
            }
            left
        } else {
            None
        };
        let ctx = ToolContext {
            session_id: self.session_id.to_string(),
            tool_call_id: call.id.clone(),
            cwd: self.cwd.clone(),
            cancel: self.cancel.child_token(),
            events: Some(events),
            catalog: Some(self.catalog.clone()),
            budget_left_usd,
        };
        let started = Instant::now();
        if ready.spawn_only() {
            let result = self
                .host
                .spawn(ready, arguments, &call.id, &self.turn_id)
                .await;
            // The actor emitted the call's tool/completed when it started the task.
            return (result.output, result.success);
        }
        // The call's events go to the session through the turn's channel, in order, before
        // its tool/completed.
        let outcome = {
            let run = ready.run_guarded(&ctx, &arguments, &self.exclusivity);
            tokio::pin!(run);
            loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    Some(event) = events_rx.recv() => self.host.tool_event(event).await,
                }
            }
        };
        drop(ctx);
        while let Ok(event) = events_rx.try_recv() {
            self.host.tool_event(event).await;
        }
        let result = match outcome {
            Ok(result) => result,
            Err(DispatchError::Cancelled { .. }) => {
                ToolResult::failure("interrupted: the turn was stopped while this call ran")
                    .with_metadata(json!({"error": {"kind": "interrupted"}}))
            }
            Err(err) => {
                if let DispatchError::Fatal { message, .. } = &err {
                    tracing::error!(tool = %call.name, %message, "tool failed fatally");
                }
                err.to_tool_result()
            }
        };
        self.metrics.record_tool_call(
            &call.name,
            if result.success { "success" } else { "failure" },
        );
        let ledger = self.holds.ledger().await;
        let rows = record_node_costs(
            &self.store,
            &self.metrics,
            &self.session_id,
            &result,
            self.labels.turn_id.as_deref(),
            self.labels.task_id.as_deref(),
        )
        .await;
        // Held until its rows are in the ledger, so the cap never sees a gap.
        self.holds.release(&self.call_hold(&call.id));
        drop(ledger);
        if let Some(rows) = rows {
            let mut costs = self.node_costs.lock().await;
            costs.extend(rows.as_array().cloned().unwrap_or_default());
        }
        let mut params =
            crate::session::completed_params(&call.id, &call.name, &result, started.elapsed());
        params["turn_id"] = Value::String(self.turn_id.clone());
        self.emit("tool/completed", params).await;
        (cap_output(&result.output), result.success)
    }
}

/// Stores the cost rows a tool reported in `structured_metadata.node_costs` (pipelines, agents)
/// in the session's ledger; returns them for `turn/completed` or `turn/spawn_complete`.
pub(crate) async fn record_node_costs(
    store: &Arc<dyn Store>,
    metrics: &Metrics,
    session_id: &str,
    result: &ToolResult,
    turn_id: Option<&str>,
    task_id: Option<&str>,
) -> Option<Value> {
    let rows = result
        .structured_metadata
        .as_ref()?
        .get("node_costs")?
        .clone();
    for row in rows.as_array().into_iter().flatten() {
        if row["unpriced"] == true {
            metrics.unpriced_calls.inc();
        }
        let usage = Usage {
            prompt_tokens: row["tokens_in"].as_u64().unwrap_or(0),
            completion_tokens: row["tokens_out"].as_u64().unwrap_or(0),
        };
        metrics.record_llm_usage(usage, row["actual_usd"].as_f64().unwrap_or(0.0));
        let cost = CostRow {
            session_id: session_id.to_string(),
            node_id: row["node_id"].as_str().unwrap_or("node").to_string(),
            model: row["model"].as_str().unwrap_or_default().to_string(),
            reserved_usd: row["reserved_usd"].as_f64().unwrap_or(0.0),
            actual_usd: row["actual_usd"].as_f64().unwrap_or(0.0),
            tokens_in: row["tokens_in"].as_i64().unwrap_or(0),
            tokens_out: row["tokens_out"].as_i64().unwrap_or(0),
            committed: row["committed"].as_bool().unwrap_or(true),
            turn_id: turn_id.map(str::to_string),
            task_id: task_id.map(str::to_string),
            created_at: timestamp_now(),
        };
        if let Err(err) = store.insert_cost_row(&cost).await {
            tracing::error!(%err, "cost row not persisted");
        }
    }
    Some(rows)
}

/// The messages of the next request: the system prompt and as much of the history, newest
/// last, as the estimate says fits in `room` prompt tokens with `tools`. The oldest messages go
/// first, a model answer always together with the tool results that follow it, so what is
/// sent stays a valid conversation; the system prompt then says how many were left out. The
/// newest exchange is always sent, fitting or not (the endpoint then says the context is too
/// long). The stored history is untouched.
fn fit_context(
    system: &str,
    history: Vec<ChatMessage>,
    tools: &[ToolSpec],
    room: u64,
) -> (Vec<ChatMessage>, u64) {
    // Each message is measured once; the trials below only add up sizes.
    let tool_bytes: u64 = tools.iter().map(Pricing::json_bytes).sum();
    let estimate = |system: &ChatMessage, history_bytes: u64, history_len: usize| {
        Pricing::tokens_from_parts(
            Pricing::json_bytes(system) + history_bytes,
            history_len + 1,
            tool_bytes,
            tools.len(),
        )
    };
    let sizes: Vec<u64> = history.iter().map(Pricing::json_bytes).collect();
    // after[i]: the bytes of history[i..].
    let mut after = vec![0u64; sizes.len() + 1];
    for at in (0..sizes.len()).rev() {
        after[at] = after[at + 1] + sizes[at];
    }
    let whole = ChatMessage::System {
        content: system.to_string(),
    };
    let whole_estimate = estimate(&whole, after[0], history.len());
    let untrimmed = |history: Vec<ChatMessage>| {
        let mut messages = Vec::with_capacity(history.len() + 1);
        messages.push(whole.clone());
        messages.extend(history);
        (messages, whole_estimate)
    };
    if whole_estimate <= room {
        return untrimmed(history);
    }
    // Where each droppable exchange starts: any message but a tool result.
    let starts: Vec<usize> = (0..history.len())
        .filter(|&at| !matches!(history[at], ChatMessage::Tool { .. }))
        .collect();
    let note = |dropped: usize| ChatMessage::System {
        content: format!(
            "{system}\n\n({dropped} earlier messages of this conversation were left out to fit \
             the model's context window.)"
        ),
    };
    let mut keep_from = 0;
    let mut kept_estimate = whole_estimate;
    for &start in starts.iter().skip(1) {
        keep_from = start;
        kept_estimate = estimate(&note(start), after[start], history.len() - start);
        if kept_estimate <= room {
            break;
        }
    }
    if keep_from == 0 {
        return untrimmed(history);
    }
    tracing::info!(dropped = keep_from, "history trimmed to the context window");
    let mut trimmed = vec![note(keep_from)];
    trimmed.extend(history.into_iter().skip(keep_from));
    (trimmed, kept_estimate)
}

/// What a tool call whose result was never stored answers in the history.
const UNRECORDED_RESULT: &str = "interrupted: no result was recorded for this call";

/// Makes a stored conversation valid for a model: every tool call answered exactly once, after
/// the assistant message that made it and before the next other message, and tool messages no
/// call asked for dropped. A crash between an assistant message and its tool messages would
/// otherwise make every later request of the session fail.
fn repair(history: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut repaired = Vec::with_capacity(history.len());
    let mut unanswered: Vec<String> = Vec::new();
    for message in history {
        match &message {
            ChatMessage::Tool { tool_call_id, .. } => {
                if let Some(at) = unanswered.iter().position(|id| id == tool_call_id) {
                    unanswered.remove(at);
                    repaired.push(message);
                }
            }
            _ => {
                for id in unanswered.drain(..) {
                    repaired.push(ChatMessage::Tool {
                        tool_call_id: id,
                        content: UNRECORDED_RESULT.into(),
                    });
                }
                if let ChatMessage::Assistant { tool_calls, .. } = &message {
                    unanswered.extend(tool_calls.iter().map(|call| call.id.clone()));
                }
                repaired.push(message);
            }
        }
    }
    for id in unanswered {
        repaired.push(ChatMessage::Tool {
            tool_call_id: id,
            content: UNRECORDED_RESULT.into(),
        });
    }
    repaired
}

fn interrupted() -> Ending {
    Ending::Failed {
        code: "interrupted",
        message: "the turn was interrupted".into(),
    }
}

/// `text` cut to at most `limit` bytes at a character boundary, with an ellipsis when cut.
pub(crate) fn cap_text(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    // The ellipsis is three bytes, and the whole must stay within the limit.
    let mut cut = limit.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// Keeps a tool's output within [`MAX_TOOL_OUTPUT_IN_HISTORY`]: the head and the tail, with
/// what was dropped said in between, so one huge result cannot overflow the context.
pub fn cap_output(output: &str) -> String {
    if output.len() <= MAX_TOOL_OUTPUT_IN_HISTORY {
        return output.to_string();
    }
    let half = MAX_TOOL_OUTPUT_IN_HISTORY / 2;
    let mut head_end = half;
    while !output.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = output.len() - half;
    while !output.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &output[..head_end],
        tail_start - head_end,
        &output[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        }
    }

    fn tool(id: &str, content: &str) -> ChatMessage {
        ChatMessage::Tool {
            tool_call_id: id.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_history_cut_by_a_crash_is_repaired() {
        let user = |text: &str| ChatMessage::User {
            content: text.into(),
        };
        let assistant = |ids: &[&str]| ChatMessage::Assistant {
            content: None,
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        };
        let stored = vec![
            user("go"),
            assistant(&["a", "b"]),
            tool("a", "ok"),
            tool("stray", "nobody asked"),
            user("again"),
            assistant(&["c"]),
        ];
        assert_eq!(
            repair(stored),
            vec![
                user("go"),
                assistant(&["a", "b"]),
                tool("a", "ok"),
                tool("b", UNRECORDED_RESULT),
                user("again"),
                assistant(&["c"]),
                tool("c", UNRECORDED_RESULT),
            ]
        );
        let whole = vec![user("x"), assistant(&["a"]), tool("a", "ok")];
        assert_eq!(repair(whole.clone()), whole, "a valid history is unchanged");
    }

    #[test]
    fn the_oldest_exchanges_give_way_to_the_context_window() {
        let user = |text: &str| ChatMessage::User {
            content: text.into(),
        };
        let assistant = |ids: &[&str]| ChatMessage::Assistant {
            content: Some("x".repeat(300)),
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        };
        let history = vec![
            user(&"a".repeat(3000)),
            assistant(&["1"]),
            tool("1", &"r".repeat(3000)),
            user("second"),
            assistant(&[]),
            user("third"),
        ];
        let (whole, estimate) = fit_context("sys", history.clone(), &[], u64::MAX);
        assert_eq!(whole.len(), 7, "everything fits an unlimited window");
        assert_eq!(estimate, Pricing::estimate_prompt_tokens(&whole, &[]));

        let (fitted, estimate) = fit_context("sys", history.clone(), &[], 400);
        assert_eq!(estimate, Pricing::estimate_prompt_tokens(&fitted, &[]));
        let ChatMessage::System { content } = &fitted[0] else {
            panic!("the system prompt comes first");
        };
        assert!(
            content.starts_with("sys\n\n(3 earlier messages"),
            "{content}"
        );
        // The assistant answer went with its tool result: no unanswered or stray tool message.
        assert_eq!(&fitted[1..], &history[3..]);

        let (nothing_fits, estimate) = fit_context("sys", history.clone(), &[], 1);
        assert_eq!(
            estimate,
            Pricing::estimate_prompt_tokens(&nothing_fits, &[])
        );
        assert_eq!(
            &nothing_fits[1..],
            &history[5..],
            "the newest exchange is sent anyway"
        );
    }

    #[test]
    fn short_output_is_kept_whole() {
        assert_eq!(cap_output("hello"), "hello");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_what_was_dropped() {
        let output = format!(
            "{}{}{}",
            "a".repeat(20_000),
            "b".repeat(10_000),
            "é".repeat(10_000)
        );
        let capped = cap_output(&output);
        assert!(capped.len() <= MAX_TOOL_OUTPUT_IN_HISTORY + 64);
        assert!(capped.starts_with(&"a".repeat(1000)));
        assert!(capped.ends_with("é"));
        assert!(
            capped.contains("[… 17232 bytes omitted …]"),
            "{}",
            &capped[16_000..16_500]
        );
    }
}
