//! One turn: call the model with the history and the visible tools, stream its answer, run
//! the calls it makes (a Safe batch concurrently, anything Exclusive one by one, each through
//! [`call::run`]), and repeat until it answers without tools or a limit is hit.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::call::{self, Call, CallScope};
use super::compaction::{self, Compaction, CompactionError};
use super::context::{cap_output, fit_context};
use super::event::{SessionEvent, TurnCompletion};
use super::hooks::HookEvent;
use super::ledger::PricedRow;
use super::{AgentSettings, TurnHost};
use crate::error_kind::ErrorKind;
use crate::llm::ImageData;
use crate::llm::pricing::{CallCost, Pricing};
use crate::llm::{ChatMessage, ChatRequest, ChatResponse, Delta, LlmError, ToolCall, Usage};
use crate::metrics::Metrics;
use crate::tools::{ConcurrencyClass, PreparedCall};

/// The window the spend-rate guard (`budget.usd_per_minute`) looks back over.
const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// One turn's inputs.
pub(crate) struct Turn<H: TurnHost> {
    pub turn_id: String,
    /// The user message the turn starts with; `None` continues from the history as it is.
    pub input: Option<ChatMessage>,
    pub settings: Arc<AgentSettings>,
    pub metrics: Arc<Metrics>,
    /// Where the turn's state lives.
    pub host: Arc<H>,
    /// What the turn's calls share; its ledger is the session's (a sub-agent bills its
    /// parent), its labels mark the turn's cost rows.
    pub scope: CallScope,
    pub cancel: CancellationToken,
    /// The first turn of this load of the session: its `SessionStart` hooks run first.
    pub session_start: bool,
}

/// How a turn ended.
enum Ending {
    /// With `turn/completed`, and its reason.
    Completed(TurnCompletion),
    /// With `turn/error`.
    Failed { code: ErrorKind, message: String },
}

/// Counts how many batches in a row were the same calls with the same answers: a model that
/// repeats itself learns nothing new, and past a limit the turn stops.
#[derive(Default)]
struct Repeats {
    last: Option<u64>,
    count: u32,
}

impl Repeats {
    /// Records one batch; how many times in a row it has now been made.
    fn observe(&mut self, calls: &[ToolCall], results: &[String]) -> u32 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for (call, result) in calls.iter().zip(results) {
            call.name.hash(&mut hasher);
            // The same arguments however they were spaced.
            match serde_json::from_str::<Value>(&call.arguments) {
                Ok(arguments) => arguments.to_string().hash(&mut hasher),
                Err(_) => call.arguments.hash(&mut hasher),
            }
            result.hash(&mut hasher);
        }
        let batch = hasher.finish();
        if self.last == Some(batch) {
            self.count += 1;
        } else {
            self.last = Some(batch);
            self.count = 1;
        }
        self.count
    }
}

/// Totals of the model calls one turn made.
#[derive(Default)]
struct Spend {
    tokens_in: u64,
    tokens_out: u64,
    tokens_cached: u64,
    cost_usd: f64,
    /// Cost rows tools of this turn reported, in the order the calls finished.
    node_costs: Vec<CallCost>,
}

/// Why a call of the model's did not get to run; its text is the model's answer.
#[derive(Debug, thiserror::Error)]
enum Unprepared {
    /// Its arguments are not JSON.
    #[error("the arguments of {tool} are not valid JSON ({source}); send a JSON object")]
    NotJson {
        /// The tool called.
        tool: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The registry refused it (unknown, denied, too large, invalid).
    #[error("{0}")]
    Refused(crate::tools::DispatchError),
    /// The session stopped before it could answer.
    #[error("the session stopped")]
    SessionStopped,
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
        let mut outcome = match self.prompt_hooks().await {
            Ok(input) => self.turn_loop(input.as_ref(), &mut spend).await,
            Err(ending) => ending,
        };
        let timed_out = timer.is_finished();
        timer.abort();
        if timed_out && !matches!(outcome, Ending::Completed(_)) {
            outcome = Ending::Failed {
                code: ErrorKind::TurnTimeout,
                message: format!("the turn took longer than {} s", timeout.as_secs()),
            };
        }
        let outcome_label = match &outcome {
            Ending::Completed(reason) => reason.as_str(),
            Ending::Failed { code, .. } => code.as_str(),
        };
        self.metrics.record_turn(outcome_label);
        let event = match outcome {
            Ending::Completed(reason) => {
                let node_usd: f64 = spend.node_costs.iter().map(|row| row.actual_usd).sum();
                SessionEvent::TurnCompleted {
                    turn_id: self.turn_id.clone(),
                    tokens_in: spend.tokens_in,
                    tokens_out: spend.tokens_out,
                    tokens_cached: spend.tokens_cached,
                    cost_usd: spend.cost_usd + node_usd,
                    session_cost_usd: self.scope.ledger.session_cost().await,
                    reason,
                    node_costs: spend.node_costs,
                }
            }
            Ending::Failed { code, message } => SessionEvent::TurnError {
                turn_id: self.turn_id.clone(),
                code,
                message,
            },
        };
        let diff = self.host.settle(&self.turn_id).await;
        self.host.emit(event).await;
        if let Some(diff) = diff {
            self.host.emit(diff).await;
        }
        // As in Claude Code, a turn a person interrupted runs no Stop hook: the interrupt's
        // answer waits for the turn's end, which must come at once.
        let interrupted = self.cancel.is_cancelled() && !timed_out;
        if let Some(hooks) = &self.scope.hooks
            && hooks.any(HookEvent::Stop, None)
            && !interrupted
        {
            let outcome = hooks
                .run(
                    HookEvent::Stop,
                    None,
                    json!({"stop_hook_active": false, "reason": outcome_label}),
                    &CancellationToken::new(),
                )
                .await;
            super::call::report_hooks(self.host.as_ref(), outcome.ran, None).await;
        }
        tracing::info!(turn_id = %self.turn_id, elapsed_ms = started.elapsed().as_millis() as u64, outcome = outcome_label, "turn ended");
        self.host.finished(&self.turn_id).await;
    }

    async fn remember(&self, message: &ChatMessage) -> Result<(), Ending> {
        self.host
            .remember(message)
            .await
            .map_err(|err| Ending::Failed {
                code: err.kind(),
                message: err.to_string(),
            })
    }

    /// The `SessionStart` (on a session's first turn) and `UserPromptSubmit` hooks: the input
    /// with the context they added, or the ending a block gives the turn.
    async fn prompt_hooks(&self) -> Result<Option<ChatMessage>, Ending> {
        let mut input = self.input.clone();
        let Some(hooks) = &self.scope.hooks else {
            return Ok(input);
        };
        let mut context = Vec::new();
        if self.session_start && hooks.any(HookEvent::SessionStart, None) {
            let outcome = hooks
                .run(
                    HookEvent::SessionStart,
                    None,
                    json!({"source": "startup"}),
                    &self.cancel,
                )
                .await;
            super::call::report_hooks(self.host.as_ref(), outcome.ran, None).await;
            context.extend(outcome.context);
        }
        if let Some(ChatMessage::User { content, .. }) = &input
            && hooks.any(HookEvent::UserPromptSubmit, None)
        {
            let outcome = hooks
                .run(
                    HookEvent::UserPromptSubmit,
                    None,
                    json!({"prompt": content}),
                    &self.cancel,
                )
                .await;
            super::call::report_hooks(self.host.as_ref(), outcome.ran, None).await;
            if let Some(reason) = outcome.blocked {
                return Err(Ending::Failed {
                    code: ErrorKind::HookBlocked,
                    message: format!("a UserPromptSubmit hook blocked the prompt: {reason}"),
                });
            }
            context.extend(outcome.context);
        }
        if let (Some(ChatMessage::User { content, .. }), false) = (&mut input, context.is_empty()) {
            for added in context {
                content.push_str(&format!("\n\n[context from a hook]\n{added}"));
            }
        }
        Ok(input)
    }

    async fn turn_loop(&self, input: Option<&ChatMessage>, spend: &mut Spend) -> Ending {
        if let Some(input) = input
            && let Err(ending) = self.remember(input).await
        {
            return ending;
        }
        let mut repeats = Repeats::default();
        // One failed (or pointless) compaction is enough for a turn; trimming takes over.
        let mut compaction_settled = false;
        for iteration in 0..self.settings.max_iterations {
            if self.cancel.is_cancelled() {
                return interrupted();
            }
            let Some(specs) = self.host.begin_iteration(iteration == 0).await else {
                return interrupted();
            };
            let history = match self.host.history().await {
                Ok(history) => history,
                Err(err) => {
                    return Ending::Failed {
                        code: err.kind(),
                        message: err.to_string(),
                    };
                }
            };
            let (history, measured) = self
                .compact_if_long(history, &specs, &mut compaction_settled, spend)
                .await;
            let room = u64::from(self.settings.context_window)
                .saturating_sub(u64::from(self.settings.max_tokens));
            let (messages, estimate) =
                fit_context(self.host.system_prompt(), history, &specs, room, measured);
            let request = ChatRequest {
                model: self.settings.model.clone(),
                messages,
                tools: specs,
                max_tokens: self.settings.max_tokens,
                reasoning_effort: self.settings.reasoning_effort.clone(),
            };
            if let Some(rate) = self.settings.usd_per_minute {
                let spent = self.scope.ledger.spent_within(RATE_WINDOW).await;
                if spent >= rate {
                    tracing::info!(
                        spent,
                        rate,
                        "turn paused: spending faster than budget.usd_per_minute"
                    );
                    return Ending::Completed(TurnCompletion::BudgetRateExceeded);
                }
            }
            let reserved = match self.reserve(&request, estimate).await {
                Ok(reserved) => reserved,
                Err(ending) => return ending,
            };
            let traced = TracedChat::start(&self.settings, &request);
            let response = match self
                .call_model(request)
                .instrument(traced.span.clone())
                .await
            {
                Ok(response) => response,
                Err(err) => {
                    traced.failed(err.kind().as_str());
                    // No row: what a failed call cost is unknown (see the protocol's deviations).
                    self.scope.ledger.release(&self.model_hold());
                    return Ending::Failed {
                        code: err.kind(),
                        message: err.to_string(),
                    };
                }
            };
            let priced = self.price(reserved, response.usage, spend);
            traced.finished(&response, priced.row.actual_usd);
            if !response.text.is_empty() {
                self.host
                    .emit(SessionEvent::MessageCompleted {
                        turn_id: self.turn_id.clone(),
                        text: response.text.clone(),
                    })
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
                reasoning: response.reasoning.clone(),
            };
            // The answer, its cost row and the events before it go in one commit.
            let remembered = self.host.remember_answer(&assistant, &priced.row).await;
            let stored = matches!(remembered, Ok(true));
            self.scope.ledger.written(priced, stored).await;
            if let Err(err) = remembered {
                return Ending::Failed {
                    code: err.kind(),
                    message: err.to_string(),
                };
            }
            if response.tool_calls.is_empty() {
                return Ending::Completed(TurnCompletion::Completed);
            }
            let mut images = Vec::new();
            let results = self
                .run_batch(&response.tool_calls, spend, &mut images)
                .await;
            let repeated = repeats.observe(&response.tool_calls, &results);
            let limit = self.settings.max_repeated_calls.max(1);
            let stuck = repeated >= limit.saturating_mul(2);
            for (call, mut content) in response.tool_calls.iter().zip(results) {
                if repeated >= limit {
                    content.push_str(&format!(
                        "\n\n[agentd] You have now made this same call with the same arguments \
                         {repeated} times in a row, and it gives the same answer. Do not \
                         repeat it: change the approach, or stop and tell the user what is in \
                         the way.{}",
                        if stuck { " The turn ends here." } else { "" }
                    ));
                }
                let message = ChatMessage::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                };
                if let Err(ending) = self.remember(&message).await {
                    return ending;
                }
            }
            // Tool messages carry text only in the chat API, so what a call gave to look at
            // follows the batch as the user's.
            if !images.is_empty()
                && let Err(ending) = self.remember(&self.shown_images(images)).await
            {
                return ending;
            }
            if self.cancel.is_cancelled() {
                return interrupted();
            }
            if stuck {
                return Ending::Completed(TurnCompletion::StuckInLoop);
            }
        }
        Ending::Failed {
            code: ErrorKind::IterationLimit,
            message: format!(
                "the turn stopped after {} model calls",
                self.settings.max_iterations
            ),
        }
    }

    /// Summarises the older part of `history` when the next request would pass
    /// `llm.compact_at` of the context window; answers the history to send, with the whole
    /// request's estimate when it measured that history and left it as it was (so
    /// `fit_context` need not measure it again). A failed compaction leaves it whole (the
    /// trimming of `fit_context` then applies) and is not tried again in this turn.
    async fn compact_if_long(
        &self,
        history: Vec<ChatMessage>,
        specs: &[crate::llm::ToolSpec],
        settled: &mut bool,
        spend: &mut Spend,
    ) -> (Vec<ChatMessage>, Option<u64>) {
        if *settled {
            return (history, None);
        }
        let system = self.host.system_prompt();
        let threshold = (f64::from(self.settings.context_window) * self.settings.compact_at) as u64;
        // Measured in place: the history is not copied for an estimate on every model call.
        let system_bytes = Pricing::json_bytes(&ChatMessage::System {
            content: system.to_string(),
        });
        let history_bytes: u64 = history.iter().map(Pricing::message_bytes).sum();
        let tool_bytes: u64 = specs.iter().map(Pricing::json_bytes).sum();
        let estimate = Pricing::tokens_from_parts(
            system_bytes + history_bytes,
            history.len() + 1,
            tool_bytes,
            specs.len(),
        );
        if estimate <= threshold {
            return (history, Some(estimate));
        }
        if let Some(hooks) = &self.scope.hooks
            && hooks.any(HookEvent::PreCompact, None)
        {
            let outcome = hooks
                .run(
                    HookEvent::PreCompact,
                    None,
                    json!({"trigger": "auto"}),
                    &self.cancel,
                )
                .await;
            super::call::report_hooks(self.host.as_ref(), outcome.ran, None).await;
        }
        let compaction = Compaction {
            settings: &self.settings,
            ledger: &self.scope.ledger,
            labels: &self.scope.labels,
            hold: format!("{}#compaction", self.turn_id),
            cancel: self.cancel.clone(),
        };
        let span = crate::telemetry::work_span("compaction", "auto");
        let outcome = compaction
            .run(system, &history, specs)
            .instrument(span.clone())
            .await;
        match outcome {
            Ok(compacted) => {
                crate::telemetry::attribute(&span, "agentd.cost.usd", compacted.cost_usd);
                spend.tokens_in += compacted.usage.prompt_tokens;
                spend.tokens_out += compacted.usage.completion_tokens;
                spend.tokens_cached += compacted.usage.cached_tokens;
                spend.cost_usd += compacted.cost_usd;
                let mut view = history;
                compaction::apply(&mut view, &compacted.marker);
                if let Err(err) = self.host.compacted(Some(&self.turn_id), compacted).await {
                    tracing::error!(%err, "compaction not recorded; sent for this request only");
                }
                (view, None)
            }
            Err(err) => {
                crate::telemetry::attribute(&span, "agentd.compaction.outcome", err.to_string());
                if !matches!(err, CompactionError::NothingToCompact) {
                    tracing::warn!(%err, "compaction failed; the oldest messages are left out instead");
                }
                *settled = true;
                (history, None)
            }
        }
    }

    /// Reserves the call's worst-case price (its prompt `estimate` plus the completion cap)
    /// against the budget; refuses it when the session would pass the cap. Returns the
    /// reserved USD.
    async fn reserve(&self, request: &ChatRequest, estimate: u64) -> Result<f64, Ending> {
        let ledger = &self.scope.ledger;
        let reserved = ledger
            .pricing()
            .reserve_usd(&request.model, estimate, request.max_tokens)
            .unwrap_or(0.0);
        ledger
            .reserve(
                &self.model_hold(),
                &request.model,
                reserved,
                &self.scope.labels,
            )
            .await
            .map(|()| reserved)
            .map_err(|refused| Ending::Failed {
                code: ErrorKind::BudgetExceeded,
                message: refused.to_string(),
            })
    }

    /// Records one model call's cost row and adds it to the turn's totals; answers its cost.
    /// Prices the model call that just ended and adds it to the turn's spend; its row is
    /// stored with the step's history.
    fn price(&self, reserved: f64, usage: Option<Usage>, spend: &mut Spend) -> PricedRow {
        let usage = usage.unwrap_or_default();
        let priced = self.scope.ledger.price(
            &self.model_hold(),
            &self.settings.model,
            reserved,
            usage,
            &self.scope.labels,
        );
        spend.tokens_in += usage.prompt_tokens;
        spend.tokens_out += usage.completion_tokens;
        spend.tokens_cached += usage.cached_tokens;
        spend.cost_usd += priced.row.actual_usd;
        priced
    }

    /// The hold of this turn's model call in flight (a turn makes one at a time).
    fn model_hold(&self) -> String {
        format!("{}#model", self.turn_id)
    }

    /// Streams one model call, turning text and reasoning deltas into `message/delta` and
    /// `reasoning/delta` events as they come.
    async fn call_model(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let (deltas, mut delta_rx) = mpsc::channel::<Delta>(64);
        let forward = async {
            while let Some(delta) = delta_rx.recv().await {
                let turn_id = self.turn_id.clone();
                let event = match delta {
                    Delta::Text(text) => SessionEvent::MessageDelta { turn_id, text },
                    Delta::Reasoning(text) => SessionEvent::ReasoningDelta { turn_id, text },
                };
                self.host.emit(event).await;
            }
        };
        let call = self
            .settings
            .provider
            .stream_chat(request, deltas, self.cancel.child_token());
        let (outcome, ()) = tokio::join!(call, forward);
        outcome
    }

    /// The message showing the model the images its calls returned, or saying it cannot see
    /// them when its model takes none.
    fn shown_images(&self, images: Vec<ImageData>) -> ChatMessage {
        if self.settings.pricing.takes_images(&self.settings.model) {
            ChatMessage::User {
                content: format!(
                    "[agentd] The {} image(s) the tool calls above returned, in order.",
                    images.len()
                ),
                images,
            }
        } else {
            ChatMessage::user(format!(
                "[agentd] The tool calls above returned {} image(s), but the model in use ({}) \
                 takes no image input, so they are not shown.",
                images.len(),
                self.settings.model
            ))
        }
    }

    /// Runs one batch of tool calls and returns the text each gives the model, in order; the
    /// images they returned are added to `images`.
    async fn run_batch(
        &self,
        calls: &[ToolCall],
        spend: &mut Spend,
        images: &mut Vec<ImageData>,
    ) -> Vec<String> {
        // Every call is checked first, in the model's order; refusals answer without running.
        let mut prepared: Vec<Result<(PreparedCall, Value), Unprepared>> = Vec::new();
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
                        Ok((ready, arguments)) => Ok(self.execute(call, ready, arguments).await),
                        Err(refusal) => Err(refusal),
                    }
                });
            return join_all(runs)
                .await
                .into_iter()
                .map(|outcome| match outcome {
                    Ok((text, _, costs, shown)) => {
                        spend.node_costs.extend(costs);
                        images.extend(shown);
                        text
                    }
                    Err(refusal) => refusal.to_string(),
                })
                .collect();
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
                    let (text, success, costs, shown) = self.execute(call, ready, arguments).await;
                    spend.node_costs.extend(costs);
                    images.extend(shown);
                    failed = !success;
                    results.push(text);
                }
                Err(refusal) => {
                    failed = true;
                    results.push(refusal.to_string());
                }
            }
        }
        results
    }

    /// Parses and checks one call through the host; a refusal becomes the model's text.
    async fn prepare(&self, call: &ToolCall) -> Result<(PreparedCall, Value), Unprepared> {
        let arguments: Value = if call.arguments.trim().is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            serde_json::from_str(&call.arguments).map_err(|source| Unprepared::NotJson {
                tool: call.name.clone(),
                source,
            })?
        };
        match self.host.prepare(&call.name, &arguments).await {
            Some(Ok(ready)) => Ok((ready, arguments)),
            Some(Err(refusal)) => {
                self.metrics.record_refusal(refusal.refusal(&call.name));
                Err(Unprepared::Refused(refusal))
            }
            None => Err(Unprepared::SessionStopped),
        }
    }

    /// Runs one prepared call through the call path; returns the model's text, whether it
    /// succeeded, the cost rows it reported and the images it returned.
    async fn execute(
        &self,
        call: &ToolCall,
        ready: PreparedCall,
        arguments: Value,
    ) -> (String, bool, Vec<CallCost>, Vec<ImageData>) {
        let call = Call {
            approved: false,
            // Call ids are the model's and may repeat across agents; turn ids do not.
            hold_key: format!("{}#{}", self.turn_id, call.id),
            tool_call_id: call.id.clone(),
            prepared: ready,
            arguments,
            cancel: self.cancel.child_token(),
        };
        let result = call::run(self.host.as_ref(), &self.scope, call).await;
        (
            cap_output(&result.output),
            result.success,
            result.costs,
            result.images,
        )
    }
}

fn interrupted() -> Ending {
    Ending::Failed {
        code: ErrorKind::Interrupted,
        message: "the turn was interrupted".into(),
    }
}

/// One model request's `chat` span and what its metrics need; inert when export is off.
struct TracedChat {
    span: tracing::Span,
    provider: String,
    model: String,
    started: Instant,
}

impl TracedChat {
    /// Opens the span of `request`, named by the provider's vendor (else its configured
    /// name) and the model id as that provider knows it.
    fn start(settings: &AgentSettings, request: &ChatRequest) -> Self {
        use crate::telemetry;
        let started = Instant::now();
        if !telemetry::on() {
            return Self {
                span: tracing::Span::none(),
                provider: String::new(),
                model: String::new(),
                started,
            };
        }
        let (provider, model) = match settings.models.resolve(&request.model) {
            Ok((route, bare)) => (
                route
                    .vendor
                    .map_or_else(|| route.name.clone(), str::to_string),
                bare.to_string(),
            ),
            Err(_) => ("unknown".to_string(), request.model.clone()),
        };
        let span = telemetry::chat_span(&provider, &model);
        telemetry::attribute(
            &span,
            "gen_ai.request.max_tokens",
            i64::from(request.max_tokens),
        );
        if telemetry::capture_content() {
            let messages = serde_json::to_string(&request.messages).unwrap_or_default();
            telemetry::attribute(&span, "gen_ai.input.messages", messages);
        }
        Self {
            span,
            provider,
            model,
            started,
        }
    }

    fn outcome(&self) -> crate::telemetry::ChatOutcome<'_> {
        crate::telemetry::ChatOutcome {
            provider: &self.provider,
            model: &self.model,
            duration: self.started.elapsed(),
            ..Default::default()
        }
    }

    fn failed(&self, kind: &str) {
        if crate::telemetry::on() {
            let outcome = crate::telemetry::ChatOutcome {
                error: Some(kind),
                ..self.outcome()
            };
            crate::telemetry::chat_finished(&self.span, &outcome);
        }
    }

    fn finished(&self, response: &ChatResponse, cost_usd: f64) {
        use crate::telemetry;
        if !telemetry::on() {
            return;
        }
        let usage = response.usage.unwrap_or_default();
        if let Some(model) = &response.model {
            telemetry::attribute(&self.span, "gen_ai.response.model", model.clone());
        }
        if telemetry::capture_content() {
            let output = json!([{
                "role": "assistant",
                "content": response.text,
                "tool_calls": response.tool_calls,
            }]);
            telemetry::attribute(&self.span, "gen_ai.output.messages", output.to_string());
        }
        let outcome = telemetry::ChatOutcome {
            finish_reason: response.finish_reason.as_deref(),
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            cache_read_tokens: usage.cached_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            cost_usd,
            first_chunk: response.first_token,
            ..self.outcome()
        };
        telemetry::chat_finished(&self.span, &outcome);
    }
}
