//! The agent: the turn loop and everything a tool call passes through on its way.
//!
//! - [`turn`]: one turn of the model loop, shared by a session's turns and sub-agents'.
//! - [`call`]: the one path every tool call takes, from `tool/started` to `tool/completed`.
//! - [`approval`]: the approval step of that path: rules, grants, decisions.
//! - [`ledger`]: the session's budget, holds and cost rows.
//! - [`context`]: what of the history is sent to the model.
//! - [`compaction`]: summarising the older conversation when it grows long.
//! - [`event`]: the typed notifications of a session's event stream.
//! - [`child`]: a sub-agent's host of the turn loop.
//!
//! A turn runs as its own task. It never touches the session's registry directly: the session
//! actor owns that, so the turn asks its host ([`TurnHost`], [`call::CallHost`]) to tick the
//! LRU, prepare calls, keep the history and emit events, which keeps one writer for every piece
//! of session state. The session's `ActorLink` (`session/actor/link.rs`) is that host, and
//! sends each ask to the actor as a message the session owns.

pub(crate) mod approval;
pub(crate) mod call;
pub(crate) mod child;
pub mod compaction;
pub mod context;
pub mod event;
pub mod hooks;
pub(crate) mod ledger;
pub(crate) mod turn;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use self::call::CallHost;
use self::compaction::Compacted;
pub use self::context::{MAX_TOOL_OUTPUT_IN_HISTORY, cap_output};
pub use self::event::SessionEvent;
use crate::error_kind::ErrorKind;
use crate::llm::pricing::Pricing;
use crate::llm::router::ModelRouter;
use crate::llm::{ChatMessage, Provider, ToolSpec};
use crate::store::{CostRow, StoreError};
use crate::tools::{DispatchError, PreparedCall};

/// The instructions every conversation starts with.
pub const SYSTEM_PROMPT: &str = "You are a coding agent working in a workspace directory on \
the user's behalf. Use the tools to read, search, change and run things in the workspace; paths \
are relative to it. Prefer small, verifiable steps, keep the plan up to date with update_plan \
for longer work, and answer plainly once the task is done.";

/// What the turn loop needs from the server; shared by every turn of every session.
pub struct AgentSettings {
    /// The model: the router over every configured provider, metered.
    pub provider: Arc<dyn Provider>,
    /// The configured providers and models, to check a chosen model and list them.
    pub models: Arc<ModelRouter>,
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
    /// The model's context window in tokens, prompt and completion together: the catalog's
    /// (or `[llm.pricing]`'s) for the model, at most `context_limit`.
    pub context_window: u32,
    /// `[llm] context_window`: the most any model's window is taken to be.
    pub context_limit: u32,
    /// Identical calls in a row before the model is told so; twice that ends the turn.
    pub max_repeated_calls: u32,
    /// Most a session may spend in any minute before its turn ends `budget_rate_exceeded`;
    /// `None` is off.
    pub usd_per_minute: Option<f64>,
    /// Share of the context window past which the older conversation is summarised.
    pub compact_at: f64,
    /// How hard a reasoning model should think, when the session or turn asked.
    pub reasoning_effort: Option<String>,
}

impl AgentSettings {
    /// The same settings with the model and reasoning effort a session or turn chose, checked
    /// against the configured providers; `None` keeps what these settings have.
    pub fn with_choice(
        &self,
        model: Option<&str>,
        reasoning_effort: Option<&str>,
    ) -> Result<Self, crate::llm::router::UnknownModel> {
        let model = match model {
            Some(model) => {
                self.models.resolve(model)?;
                model
            }
            None => &self.model,
        };
        let mut settings = self.with_model(model);
        if let Some(effort) = reasoning_effort {
            settings.reasoning_effort = Some(effort.to_string());
        }
        Ok(settings)
    }

    /// The same settings calling `model` instead.
    pub fn with_model(&self, model: &str) -> Self {
        Self {
            provider: Arc::clone(&self.provider),
            models: Arc::clone(&self.models),
            model: model.to_string(),
            max_tokens: self.max_tokens,
            pricing: self.pricing.clone(),
            budget_usd: self.budget_usd,
            max_iterations: self.max_iterations,
            turn_timeout: self.turn_timeout,
            max_sub_agents: self.max_sub_agents,
            context_window: self.pricing.context_window(model, self.context_limit),
            context_limit: self.context_limit,
            max_repeated_calls: self.max_repeated_calls,
            usd_per_minute: self.usd_per_minute,
            compact_at: self.compact_at,
            reasoning_effort: self.reasoning_effort.clone(),
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

/// Why a turn's host could not read or store the conversation; the turn ends with its kind.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The store could not read the conversation.
    #[error("the conversation could not be read: {0}")]
    Unreadable(#[source] StoreError),
    /// The store could not keep a message; nothing after it was acknowledged.
    #[error("the conversation could not be stored: {0}")]
    Unstored(#[source] StoreError),
    /// A history entry could not be written as JSON.
    #[error("a history entry does not serialise: {0}")]
    Unserialisable(#[source] serde_json::Error),
    /// The host stopped before it answered.
    #[error("the session stopped")]
    SessionStopped,
}

impl HistoryError {
    /// The kind a turn (or a compaction) that needed the conversation fails with.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unreadable(_) | Self::Unstored(_) => ErrorKind::StorageUnavailable,
            Self::Unserialisable(_) => ErrorKind::Internal,
            Self::SessionStopped => ErrorKind::SessionUnavailable,
        }
    }
}

/// Where a turn runs: the session actor for a session's own turns, a child agent for a
/// sub-agent's. The loop is one; the host decides where history, events and tools live.
pub(crate) trait TurnHost: CallHost + 'static {
    /// The instructions the conversation starts with.
    fn system_prompt(&self) -> &str {
        SYSTEM_PROMPT
    }

    /// Ticks the LRU (evicting only at `turn_start`, the turn's first call) and answers the
    /// specs for the next model call; `None` once the host stopped.
    fn begin_iteration(
        &self,
        turn_start: bool,
    ) -> impl Future<Output = Option<Arc<[ToolSpec]>>> + Send;

    /// Checks and readies one call; `None` once the host stopped.
    fn prepare(
        &self,
        name: &str,
        arguments: &Value,
    ) -> impl Future<Output = Option<Result<PreparedCall, DispatchError>>> + Send;

    /// The conversation so far, valid for a model; the error is said to the client.
    fn history(&self) -> impl Future<Output = Result<Vec<ChatMessage>, HistoryError>> + Send;

    /// Adds one message to the conversation; the error is said to the client.
    fn remember(
        &self,
        message: &ChatMessage,
    ) -> impl Future<Output = Result<(), HistoryError>> + Send;

    /// Adds the model's answer to the conversation, and stores its call's cost row in the same
    /// commit where the host can, so a model's step is one commit; answers whether the row
    /// was stored (when not, the ledger writes it). Nothing is stored on an error.
    fn remember_answer(
        &self,
        message: &ChatMessage,
        cost: &CostRow,
    ) -> impl Future<Output = Result<bool, HistoryError>> + Send;

    /// Records a compaction after the conversation so far (the next `history()` applies it)
    /// and says so; the error is said to the client.
    fn compacted(
        &self,
        turn_id: Option<&str>,
        compacted: Compacted,
    ) -> impl Future<Output = Result<(), HistoryError>> + Send;

    /// The turn is about to say it ended: what it changed, as the event to emit after its
    /// ending (`turn/diff`), taken before the ending so nothing done after it counts.
    fn settle(&self, _turn_id: &str) -> impl Future<Output = Option<SessionEvent>> + Send {
        std::future::ready(None)
    }

    /// The turn is over and has said so.
    fn finished(&self, turn_id: &str) -> impl Future<Output = ()> + Send;
}
