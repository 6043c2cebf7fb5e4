//! The way back to a session's actor from the work it started — its turns, clients' calls, its
//! MCP servers: the messages they send on one ordered queue ([`ActorRequest`]), the host that
//! sends a turn's and a call's ([`ActorLink`], which gives the agent's loop the host traits it
//! is written against), and the routing of each message to the part of the actor it concerns.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::agent::approval::{Answer, ApprovalAsk, Unanswered};
use crate::agent::call::{CallHost, EventSink, Spawn};
use crate::agent::compaction::{Compacted, CompactionOutcome};
use crate::agent::{HistoryError, SYSTEM_PROMPT, SessionEvent, TurnHost};
use crate::llm::{ChatMessage, ToolSpec};
use crate::store::CostRow;
use crate::tools::{DispatchError, PreparedCall, ToolEvent, ToolResult};

/// What a running turn, a client's call or an MCP server of the session tells its actor. Sent on
/// one ordered queue, so events and registry changes happen in the order they were made.
#[derive(Debug)]
pub(crate) enum ActorRequest {
    /// One of the session's own MCP servers is up (or failed to start).
    McpStarted(Arc<crate::mcp::McpServer>),
    /// An MCP server the session follows listed its tools again.
    McpRelisted(Arc<crate::mcp::McpServer>),
    /// Persist and stream one notification.
    Emit(SessionEvent),
    /// Tick the LRU, evict at a turn's first call (`turn_start`), announce changes, and answer
    /// with the specs for the next call. Evicting only between turns keeps the tool list of a
    /// turn's requests byte-identical, so the provider's prompt cache holds.
    BeginIteration {
        turn_start: bool,
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
    SpawnTask(Box<(Spawn, oneshot::Sender<ToolResult>)>),
    /// Something a tool reported while running.
    ToolEvent(ToolEvent),
    /// The conversation so far, repaired for a model.
    History {
        reply: oneshot::Sender<Result<Vec<ChatMessage>, HistoryError>>,
    },
    /// Add one message to the conversation.
    Remember {
        message: Box<ChatMessage>,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    },
    /// Add the model's answer to the conversation with its call's cost row, in one commit
    /// with the events before it.
    RememberAnswer {
        answer: Box<(ChatMessage, CostRow)>,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    },
    /// Record a compaction and announce it.
    Compacted {
        turn_id: Option<String>,
        compacted: Box<Compacted>,
        reply: oneshot::Sender<Result<(), HistoryError>>,
    },
    /// A client's call ended; its events are in, its caller may hear the result.
    Invoked(Box<(String, ToolResult)>),
    /// A call waits for a person's decision; the answer is it.
    Approval(Box<(ApprovalAsk, oneshot::Sender<Answer>)>),
    /// A call stopped waiting for a decision (interrupted, timed out).
    ApprovalWithdrawn {
        approval_id: String,
        reason: Unanswered,
    },
    /// A `session/compact` ended: free the turn slot, then answer.
    CompactionDone(
        Box<(
            String,
            CompactionOutcome,
            oneshot::Sender<CompactionOutcome>,
        )>,
    ),
    /// The turn is about to say it ended: the workspace as it leaves it is the turn's diff
    /// (answered as the `turn/diff` to emit after the ending, when it changed files).
    Settle {
        turn_id: String,
        reply: oneshot::Sender<Option<SessionEvent>>,
    },
    /// The turn is over.
    Finished { turn_id: String },
}

impl super::SessionActor {
    /// Hands one message of the queue to the part of the actor it concerns: the turn, the
    /// call that ended, approvals, background tasks, the tool events, MCP.
    pub(super) async fn on_request(&mut self, request: ActorRequest) {
        match request {
            ActorRequest::Emit(event) => self.on_turn_event(event),
            ActorRequest::BeginIteration { turn_start, reply } => {
                self.on_begin_iteration(turn_start, reply).await;
            }
            ActorRequest::Prepare {
                name,
                arguments,
                reply,
            } => self.on_prepare(name, arguments, reply).await,
            ActorRequest::SpawnTask(spawn) => {
                let (spawn, reply) = *spawn;
                self.on_spawn_asked(spawn, reply).await;
            }
            ActorRequest::ToolEvent(event) => self.on_tool_event(event).await,
            ActorRequest::History { reply } => self.on_history_asked(reply).await,
            ActorRequest::Remember { message, reply } => self.on_remember(&message, reply).await,
            ActorRequest::RememberAnswer { answer, reply } => {
                let (message, cost) = *answer;
                self.on_remember_answer(&message, cost, reply).await;
            }
            ActorRequest::Compacted {
                turn_id,
                compacted,
                reply,
            } => self.on_compacted(turn_id, *compacted, reply).await,
            ActorRequest::CompactionDone(done) => {
                let (turn_id, outcome, reply) = *done;
                self.on_compaction_done(turn_id, outcome, reply);
            }
            ActorRequest::Invoked(invoked) => {
                let (tool_call_id, result) = *invoked;
                self.on_invoked(tool_call_id, result).await;
            }
            ActorRequest::Approval(asked) => {
                let (ask, reply) = *asked;
                self.on_approval_asked(ask, reply).await;
            }
            ActorRequest::ApprovalWithdrawn {
                approval_id,
                reason,
            } => self.on_approval_withdrawn(approval_id, reason).await,
            ActorRequest::Settle { turn_id, reply } => self.settle(&turn_id, reply),
            ActorRequest::Finished { turn_id } => self.on_turn_finished(turn_id).await,
            ActorRequest::McpStarted(server) => self.on_mcp_started(server).await,
            ActorRequest::McpRelisted(server) => self.on_mcp_relisted(server).await,
        }
    }
}

/// The way from a session's own turn, or a client's call, to its session actor.
#[derive(Clone)]
pub(crate) struct ActorLink {
    pub actor: mpsc::Sender<ActorRequest>,
    /// The session's system prompt for this turn: the built-in one with the operator's and
    /// the repository's instructions.
    pub system: Arc<str>,
}

impl ActorLink {
    /// A link to `actor` whose turns are told only the built-in prompt.
    pub(crate) fn new(actor: mpsc::Sender<ActorRequest>) -> Self {
        static BUILT_IN: std::sync::LazyLock<Arc<str>> =
            std::sync::LazyLock::new(|| SYSTEM_PROMPT.into());
        Self {
            actor,
            system: Arc::clone(&BUILT_IN),
        }
    }

    async fn ask<T>(&self, request: impl FnOnce(oneshot::Sender<T>) -> ActorRequest) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.actor.send(request(reply)).await.ok()?;
        answer.await.ok()
    }
}

impl EventSink for ActorLink {
    async fn tool_event(&self, event: ToolEvent) {
        let _ = self.actor.send(ActorRequest::ToolEvent(event)).await;
    }
}

impl CallHost for ActorLink {
    async fn emit(&self, event: SessionEvent) {
        let _ = self.actor.send(ActorRequest::Emit(event)).await;
    }

    async fn spawn(&self, spawn: Spawn) -> ToolResult {
        self.ask(|reply| ActorRequest::SpawnTask(Box::new((spawn, reply))))
            .await
            .unwrap_or_else(|| ToolResult::failure("the session stopped"))
    }

    async fn ask_approval(&self, ask: ApprovalAsk) -> Option<Answer> {
        self.ask(|reply| ActorRequest::Approval(Box::new((ask, reply))))
            .await
    }

    async fn withdraw_approval(&self, approval_id: String, reason: Unanswered) {
        let _ = self
            .actor
            .send(ActorRequest::ApprovalWithdrawn {
                approval_id,
                reason,
            })
            .await;
    }
}

impl TurnHost for ActorLink {
    fn system_prompt(&self) -> &str {
        &self.system
    }

    async fn begin_iteration(&self, turn_start: bool) -> Option<Arc<[ToolSpec]>> {
        self.ask(|reply| ActorRequest::BeginIteration { turn_start, reply })
            .await
    }

    async fn prepare(
        &self,
        name: &str,
        arguments: &Value,
    ) -> Option<Result<PreparedCall, DispatchError>> {
        self.ask(|reply| ActorRequest::Prepare {
            name: name.to_string(),
            arguments: arguments.clone(),
            reply,
        })
        .await
    }

    async fn history(&self) -> Result<Vec<ChatMessage>, HistoryError> {
        self.ask(|reply| ActorRequest::History { reply })
            .await
            .unwrap_or(Err(HistoryError::SessionStopped))
    }

    async fn remember(&self, message: &ChatMessage) -> Result<(), HistoryError> {
        self.ask(|reply| ActorRequest::Remember {
            message: Box::new(message.clone()),
            reply,
        })
        .await
        .unwrap_or(Err(HistoryError::SessionStopped))
    }

    async fn remember_answer(
        &self,
        message: &ChatMessage,
        cost: &CostRow,
    ) -> Result<bool, HistoryError> {
        self.ask(|reply| ActorRequest::RememberAnswer {
            answer: Box::new((message.clone(), cost.clone())),
            reply,
        })
        .await
        .unwrap_or(Err(HistoryError::SessionStopped))
        .map(|()| true)
    }

    async fn compacted(
        &self,
        turn_id: Option<&str>,
        compacted: Compacted,
    ) -> Result<(), HistoryError> {
        self.ask(|reply| ActorRequest::Compacted {
            turn_id: turn_id.map(str::to_string),
            compacted: Box::new(compacted),
            reply,
        })
        .await
        .unwrap_or(Err(HistoryError::SessionStopped))
    }

    async fn settle(&self, turn_id: &str) -> Option<SessionEvent> {
        let (reply, answer) = oneshot::channel();
        self.actor
            .send(ActorRequest::Settle {
                turn_id: turn_id.to_string(),
                reply,
            })
            .await
            .ok()?;
        answer.await.ok().flatten()
    }

    async fn finished(&self, turn_id: &str) {
        let _ = self
            .actor
            .send(ActorRequest::Finished {
                turn_id: turn_id.to_string(),
            })
            .await;
    }
}
