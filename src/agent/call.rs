//! The one path a prepared tool call takes through its life, whoever made it: a model's batch
//! (a session's turn or a sub-agent's), a client's `tool/invoke`, or a background task.
//!
//! [`run`] is the foreground life: `tool/started`, then the call (or its hand-off to the task
//! supervisor for a spawn_only tool), then `tool/completed`. [`execute`] is the part every call
//! shares, background tasks included: budget hold → the tool under the session's concurrency
//! rule, its events forwarded in order → the outcome as a [`ToolResult`] → metrics → its cost
//! rows into the ledger and the hold released. A step that every call must pass (approvals, for
//! one) belongs in one of these two functions and nowhere else.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio::sync::{RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use super::approval::{Answer, ApprovalAsk, Approvals, Decision, Unanswered};
use super::event::{SessionEvent, ToolCompleted};
use super::hooks::{HookEvent, Ran, SessionHooks};
use super::ledger::{CostLabels, Ledger};
use crate::metrics::Metrics;
use crate::tools::approval::Gate;
use crate::tools::args::arguments_for_event;
use crate::tools::{CatalogCell, DispatchError, PreparedCall, ToolContext, ToolEvent, ToolResult};

/// Where the events a running tool reports go.
pub(crate) trait EventSink: Send + Sync {
    /// Passes on one event; waits when the receiver is behind.
    fn tool_event(&self, event: ToolEvent) -> impl Future<Output = ()> + Send;
}

/// A background task's sink: the task supervisor's channel, which spools output to its file.
impl EventSink for mpsc::Sender<ToolEvent> {
    async fn tool_event(&self, event: ToolEvent) {
        // A closed receiver means the session is gone; the result is what matters.
        let _ = self.send(event).await;
    }
}

/// Where a foreground call runs and whom it tells.
pub(crate) trait CallHost: EventSink {
    /// Streams or records one notification.
    fn emit(&self, event: SessionEvent) -> impl Future<Output = ()> + Send;

    /// Starts a spawn_only call in the background, emits its `tool/completed`, and answers
    /// with its task_handle envelope.
    fn spawn(&self, spawn: Spawn) -> impl Future<Output = ToolResult> + Send;

    /// Asks the session's clients to decide about a call that must wait; `None` once the
    /// session stopped.
    fn ask_approval(&self, ask: ApprovalAsk) -> impl Future<Output = Option<Answer>> + Send;

    /// The call stopped waiting (interrupted, timed out): its request is resolved as declined.
    fn withdraw_approval(
        &self,
        approval_id: String,
        reason: Unanswered,
    ) -> impl Future<Output = ()> + Send;
}

/// A spawn_only call handed to the session's task supervisor.
#[derive(Debug)]
pub(crate) struct Spawn {
    pub call: PreparedCall,
    pub arguments: Value,
    pub tool_call_id: String,
    /// The turn that made the call; its rows are labelled with it.
    pub turn_id: Option<String>,
}

/// What every call of one caller shares: the session, the ledger, the concurrency rule.
#[derive(Clone)]
pub(crate) struct CallScope {
    pub session_id: Arc<str>,
    /// The turn whose calls these are, named in their events; `None` for a client's calls
    /// and background tasks.
    pub turn_id: Option<String>,
    pub cwd: PathBuf,
    pub catalog: CatalogCell,
    /// Safe calls share it, Exclusive ones hold it alone; `None` for background tasks, which
    /// outlive the batch that started them.
    pub exclusivity: Option<Arc<RwLock<()>>>,
    pub ledger: Ledger,
    pub labels: CostLabels,
    pub metrics: Arc<Metrics>,
    /// The session's approval rules and grants.
    pub approvals: Arc<Approvals>,
    /// The session's `[[hooks]]`; `None` without any.
    pub hooks: Option<Arc<SessionHooks>>,
}

/// One call ready to run.
#[derive(Debug)]
pub(crate) struct Call {
    pub tool_call_id: String,
    pub prepared: PreparedCall,
    pub arguments: Value,
    /// The ledger key of its budget hold; unique in the session.
    pub hold_key: String,
    /// Fires when the call must stop (interrupt, task/cancel, session close).
    pub cancel: CancellationToken,
    /// Decided already: the console's `tool/invoke` with `skip_approval`.
    pub approved: bool,
}

/// What the `PreToolUse` hooks said about a call's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookSays {
    /// Nothing: the rules decide.
    Nothing,
    /// `allow`: the session's ask rules do not ask; deny rules and the `.git` rule still hold.
    Allow,
    /// `ask`: a person is asked even where no rule would.
    Ask,
}

/// The result of a call the turn's interruption stopped before it ran or while it ran.
fn interrupted(scope: &CallScope, name: &str) -> ToolResult {
    if scope.turn_id.is_some() {
        ToolResult::failure("interrupted: the turn was stopped while this call ran")
            .with_metadata(json!({"error": {"kind": "interrupted"}}))
    } else {
        DispatchError::Cancelled {
            name: name.to_string(),
        }
        .to_tool_result()
    }
}

/// Tells `hook/ran` for each hook that ran.
pub(crate) async fn report_hooks<H: CallHost>(host: &H, ran: Vec<Ran>, tool_call_id: Option<&str>) {
    for ran in ran {
        host.emit(SessionEvent::HookRan {
            hook: ran.hook,
            event: ran.event.as_str(),
            tool_call_id: tool_call_id.map(str::to_string),
            decision: ran.decision,
            reason: ran.reason,
            duration_ms: ran.duration.as_millis() as u64,
        })
        .await;
    }
}

/// The `PreToolUse` hooks of a call: `Err` with the result a block (or an interruption) ends
/// it with; otherwise the call, its input rewritten, and what the hooks said about approval.
async fn pre_tool_use<H: CallHost>(
    host: &H,
    scope: &CallScope,
    hooks: &SessionHooks,
    mut call: Call,
    name: &str,
) -> Result<(Call, HookSays), ToolResult> {
    if !hooks.any(HookEvent::PreToolUse, Some(name)) {
        return Ok((call, HookSays::Nothing));
    }
    let outcome = hooks
        .run(
            HookEvent::PreToolUse,
            Some(name),
            json!({"tool_name": name, "tool_input": call.arguments, "tool_use_id": call.tool_call_id}),
            &call.cancel,
        )
        .await;
    report_hooks(host, outcome.ran, Some(&call.tool_call_id)).await;
    if outcome.interrupted {
        return Err(interrupted(scope, name));
    }
    if let Some(reason) = outcome.blocked {
        return Err(ToolResult::failure(format!("blocked by a hook: {reason}"))
            .with_metadata(json!({"error": {"kind": "hook_blocked", "message": reason}})));
    }
    if let Some(input) = outcome.updated_input {
        call.arguments = input;
    }
    let says = if outcome.ask {
        HookSays::Ask
    } else if outcome.allow {
        HookSays::Allow
    } else {
        HookSays::Nothing
    };
    Ok((call, says))
}

/// The `PostToolUse` hooks of a call that ran: what they add goes to the model with its result.
async fn post_tool_use<H: CallHost>(
    host: &H,
    hooks: &SessionHooks,
    call: &Call,
    name: &str,
    result: &mut ToolResult,
) {
    if !hooks.any(HookEvent::PostToolUse, Some(name)) {
        return;
    }
    let outcome = hooks
        .run(
            HookEvent::PostToolUse,
            Some(name),
            json!({
                "tool_name": name,
                "tool_input": call.arguments,
                "tool_use_id": call.tool_call_id,
                "tool_response": {"output": result.output, "success": result.success},
            }),
            &call.cancel,
        )
        .await;
    report_hooks(host, outcome.ran, Some(&call.tool_call_id)).await;
    if let Some(reason) = outcome.blocked {
        result
            .output
            .push_str(&format!("\n\n[a hook objects to this result] {reason}"));
    }
    for context in outcome.context {
        result
            .output
            .push_str(&format!("\n\n[from a hook] {context}"));
    }
}

/// Takes a call through its foreground life and answers what it produced; an
/// `execute_tool` span covers it (hooks and approval included) when traces are exported.
pub(crate) async fn run<H: CallHost>(host: &H, scope: &CallScope, call: Call) -> ToolResult {
    use crate::telemetry;
    use tracing::Instrument as _;
    if !telemetry::on() {
        return run_call(host, scope, call).await;
    }
    let span = telemetry::tool_span(call.prepared.name(), &call.tool_call_id);
    if telemetry::capture_content() {
        telemetry::attribute(
            &span,
            "gen_ai.tool.call.arguments",
            call.arguments.to_string(),
        );
    }
    let result = run_call(host, scope, call).instrument(span.clone()).await;
    if result.success {
        telemetry::attribute(&span, "agentd.tool.outcome", "success");
    } else {
        telemetry::attribute(&span, "agentd.tool.outcome", "failure");
        let kind = result
            .structured_metadata
            .as_ref()
            .and_then(|meta| meta["error"]["kind"].as_str())
            .unwrap_or("tool_error");
        telemetry::failed(&span, kind);
    }
    if telemetry::capture_content() {
        telemetry::attribute(&span, "gen_ai.tool.call.result", result.output.clone());
    }
    let cost: f64 = result.costs.iter().map(|row| row.actual_usd).sum();
    if cost > 0.0 {
        telemetry::attribute(&span, "agentd.cost.usd", cost);
    }
    result
}

async fn run_call<H: CallHost>(host: &H, scope: &CallScope, call: Call) -> ToolResult {
    let name = call.prepared.name().to_string();
    host.emit(SessionEvent::ToolStarted {
        turn_id: scope.turn_id.clone(),
        tool_call_id: call.tool_call_id.clone(),
        tool_name: name.clone(),
        arguments: arguments_for_event(&call.arguments),
    })
    .await;
    let tool_call_id = call.tool_call_id.clone();
    let (call, says) = match &scope.hooks {
        Some(hooks) => match pre_tool_use(host, scope, hooks, call, &name).await {
            Ok(decided) => decided,
            Err(blocked) => {
                host.emit(ToolCompleted::of(
                    scope.turn_id.clone(),
                    &tool_call_id,
                    &name,
                    &blocked,
                    std::time::Duration::ZERO,
                ))
                .await;
                return blocked;
            }
        },
        None => (call, HookSays::Nothing),
    };
    if let Some(refused) = approve(host, scope, &call, &name, says).await {
        host.emit(ToolCompleted::of(
            scope.turn_id.clone(),
            &call.tool_call_id,
            &name,
            &refused,
            std::time::Duration::ZERO,
        ))
        .await;
        return refused;
    }
    if call.prepared.spawn_only() {
        // The host emits this call's tool/completed as the task starts, so it precedes every
        // event of the task.
        return host
            .spawn(Spawn {
                call: call.prepared,
                arguments: call.arguments,
                tool_call_id: call.tool_call_id,
                turn_id: scope.turn_id.clone(),
            })
            .await;
    }
    let started = Instant::now();
    let mut result = execute(host, scope, &call).await;
    if let Some(hooks) = &scope.hooks {
        post_tool_use(host, hooks, &call, &name, &mut result).await;
    }
    host.emit(ToolCompleted::of(
        scope.turn_id.clone(),
        &call.tool_call_id,
        &name,
        &result,
        started.elapsed(),
    ))
    .await;
    result
}

/// The approval step: `None` when the call may run (no rule asks, a person accepted, or it was
/// decided already), else the result it ends with (a rule refuses it, or it was declined, timed
/// out or interrupted). A deny rule refuses even a call decided already. A hook's `allow` is no
/// person's decision: it answers only the session's ask rules, so the `.git` rule and what a
/// deny rule could be hiding (a program named by a variable) still ask.
async fn approve<H: CallHost>(
    host: &H,
    scope: &CallScope,
    call: &Call,
    name: &str,
    says: HookSays,
) -> Option<ToolResult> {
    let gate = if says == HookSays::Allow {
        scope.approvals.gate_without_asks(name, &call.arguments)
    } else {
        scope.approvals.gate(name, &call.arguments)
    };
    let (reason, grant) = match gate {
        Gate::Run if says == HookSays::Ask => {
            ("a hook asked for a person's approval".to_string(), None)
        }
        Gate::Run => return None,
        Gate::Refuse { reason } => {
            return Some(
                ToolResult::failure(reason)
                    .with_metadata(json!({"error": {"kind": "policy_denied"}})),
            );
        }
        Gate::Ask { .. } if call.approved => return None,
        Gate::Ask { reason, grant } => (reason, grant),
    };
    let approval_id = format!("approval_{}", uuid::Uuid::new_v4().simple());
    let ask = ApprovalAsk {
        approval_id: approval_id.clone(),
        tool_call_id: call.tool_call_id.clone(),
        tool_name: name.to_string(),
        arguments: arguments_for_event(&call.arguments),
        reason,
        cwd: scope.cwd.to_string_lossy().into_owned(),
        agent_id: None,
    };
    let timeout = scope.approvals.timeout();
    crate::telemetry::event(
        &tracing::Span::current(),
        "agentd.approval.requested",
        vec![opentelemetry::KeyValue::new(
            "agentd.approval.id",
            approval_id.clone(),
        )],
    );
    let outcome = tokio::select! {
        answer = host.ask_approval(ask) => answer.ok_or(Unanswered::SessionStopped),
        () = call.cancel.cancelled() => Err(Unanswered::Interrupted),
        () = tokio::time::sleep(timeout) => Err(Unanswered::Timeout),
    };
    let decision = match &outcome {
        Ok(answer) => answer.decision.as_str(),
        Err(why) => why.as_str(),
    };
    crate::telemetry::event(
        &tracing::Span::current(),
        "agentd.approval.resolved",
        vec![opentelemetry::KeyValue::new(
            "agentd.approval.decision",
            decision,
        )],
    );
    let declined = |text: String, detail: Value| {
        Some(ToolResult::failure(text).with_metadata(json!({"error": detail})))
    };
    match outcome {
        Ok(Answer {
            decision: Decision::Accept,
            ..
        }) => None,
        Ok(Answer {
            decision: Decision::AcceptForSession,
            ..
        }) => {
            if let Some(grant) = grant {
                scope.approvals.grant(grant);
            }
            None
        }
        Ok(Answer {
            decision: Decision::Decline,
            message,
        }) => {
            let text = match &message {
                Some(message) => format!("declined by the user: {message}"),
                None => "declined by the user".to_string(),
            };
            declined(text, json!({"kind": "declined", "message": message}))
        }
        Err(why) => {
            host.withdraw_approval(approval_id, why).await;
            let text = match why {
                Unanswered::Timeout => {
                    format!("declined: no decision came within {} s", timeout.as_secs())
                }
                Unanswered::Interrupted => {
                    "declined: the turn was stopped while the call waited for approval".to_string()
                }
                Unanswered::SessionStopped => "declined: the session stopped".to_string(),
                other => format!("declined: {}", other.as_str()),
            };
            declined(text, json!({"kind": "declined", "reason": why}))
        }
    }
}

/// Runs a call to its result: the part of its life every call shares, foreground or not.
pub(crate) async fn execute<S: EventSink>(sink: &S, scope: &CallScope, call: &Call) -> ToolResult {
    let tool = call.prepared.tool();
    let budget_left_usd = if tool.uses_models() {
        scope.ledger.hold_rest(&call.hold_key).await
    } else {
        None
    };
    let (events, mut events_rx) = mpsc::channel(64);
    let ctx = ToolContext {
        session_id: scope.session_id.to_string(),
        tool_call_id: call.tool_call_id.clone(),
        cwd: scope.cwd.clone(),
        cancel: call.cancel.clone(),
        events: Some(events),
        catalog: Some(scope.catalog.clone()),
        budget_left_usd,
    };
    let started = std::time::Instant::now();
    // The call's events reach the sink in order, all before its result.
    let outcome = {
        let running = async {
            match &scope.exclusivity {
                Some(exclusivity) => {
                    call.prepared
                        .run_guarded(&ctx, &call.arguments, exclusivity)
                        .await
                }
                None => call.prepared.run(&ctx, &call.arguments).await,
            }
        };
        tokio::pin!(running);
        loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                Some(event) = events_rx.recv() => sink.tool_event(event).await,
            }
        }
    };
    drop(ctx);
    // A tool may have handed its sender to work that outlives it; take what is queued.
    while let Ok(event) = events_rx.try_recv() {
        sink.tool_event(event).await;
    }
    let result = match outcome {
        Ok(result) => result,
        Err(DispatchError::Cancelled { .. }) if scope.turn_id.is_some() => {
            ToolResult::failure("interrupted: the turn was stopped while this call ran")
                .with_metadata(json!({"error": {"kind": "interrupted"}}))
        }
        Err(err) => {
            if let DispatchError::Fatal { message, .. } = &err {
                tracing::error!(tool = %call.prepared.name(), %message, "tool failed fatally");
            }
            err.to_tool_result()
        }
    };
    scope.metrics.record_tool_call(
        call.prepared.name(),
        if result.success { "success" } else { "failure" },
    );
    scope
        .metrics
        .record_tool_duration(call.prepared.name(), started.elapsed());
    if budget_left_usd.is_some() || !result.costs.is_empty() {
        scope
            .ledger
            .settle(&call.hold_key, &result.costs, &scope.labels)
            .await;
    }
    result
}
