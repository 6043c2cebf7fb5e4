//! spawn_agent, send_input, resume_agent, wait_agent, close_agent: the model hands work to
//! child agents and steers them.
//!
//! The tools only ask: each call becomes a [`SubAgentRequest`] sent to the session through the
//! call's event channel, and the session actor, which owns the children, answers it. So a
//! child's state has one writer, and every change it makes reaches the client as `task/updated`
//! in order.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::select_all;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::parse_args;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolEvent, ToolMeta, ToolResult};

/// How long `wait_agent` waits when the model does not say.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The longest `wait_agent` may wait in one call.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

pub use crate::tools::delegation::{AgentReply, AgentState, AgentStatus, SubAgentRequest};

/// The five sub-agent tools, for a server with a model.
pub fn tools() -> Vec<std::sync::Arc<dyn Tool>> {
    vec![
        std::sync::Arc::new(SpawnAgent),
        std::sync::Arc::new(SendInput),
        std::sync::Arc::new(ResumeAgent),
        std::sync::Arc::new(WaitAgent),
        std::sync::Arc::new(CloseAgent),
    ]
}

/// Sends `request` to the session and waits for its answer.
async fn ask<T>(
    ctx: &ToolContext,
    request: SubAgentRequest,
    answer: oneshot::Receiver<Result<T, ToolError>>,
) -> Result<T, ToolError> {
    if !ctx.emit(ToolEvent::SubAgent(request)).await {
        return Err(ToolError::unsupported(
            "sub-agents",
            "they run only inside a session with a model configured",
        ));
    }
    tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => Err(ToolError::model("cancelled", "the turn was interrupted")),
        answer = answer => answer.map_err(|_| ToolError::model(
            "session_stopped",
            "the session stopped before it answered",
        ))?,
    }
}

/// Sends the request `make` builds around its reply and answers with the child's status.
async fn ask_status(
    ctx: &ToolContext,
    make: impl FnOnce(AgentReply) -> SubAgentRequest,
) -> Result<ToolResult, ToolError> {
    let (reply, answer) = oneshot::channel();
    let status = ask(ctx, make(reply), answer).await?;
    let value = json!(status);
    Ok(ToolResult::ok(value.to_string()).with_metadata(value))
}

const MESSAGE_SCHEMA: &str = "The message, written as a task for the agent: it sees nothing of \
this conversation but what you write here.";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnArgs {
    message: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    agent_type: Option<String>,
    #[serde(default)]
    isolation: Option<String>,
}

/// Starts a child agent on a task.
#[derive(Debug, Default)]
pub struct SpawnAgent;

#[async_trait]
impl Tool for SpawnAgent {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "spawn_agent",
                "Start a sub-agent on a self-contained task; it works in the background in the \
                 same workspace with its own conversation and returns {agent_id, status} at once. \
                 Collect its answer with wait_agent, steer it with send_input, stop it with \
                 close_agent. It cannot run shell commands or start agents of its own.",
                json!({
                    "type": "object",
                    "properties": {
                        "message": {"type": "string", "minLength": 1, "description": MESSAGE_SCHEMA},
                        "model": {"type": "string", "description": "Another model id for this agent; the session's model when omitted."},
                        "agent_type": {"type": "string", "description": "An agent profile the server offers (its name), whose instructions, model and tool limits the agent gets; a plain sub-agent when omitted."},
                        "isolation": {"type": "string", "enum": ["none", "worktree"], "description": "worktree: the agent works in a git worktree of its own (the workspace must be in a git repository), so its edits stay apart from yours; close_agent commits them to its branch and names it, for you to merge with git. none (the default): it works in your workspace."}
                    },
                    "required": ["message"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["sessions", "delegated"])
            .contract()
            .tags(&["sessions"])
            .exclusive()
            .coordinates_only()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: SpawnArgs = parse_args(&self.meta().name, args)?;
        ask_status(ctx, |reply| SubAgentRequest::Spawn {
            message: args.message,
            model: args.model,
            agent_type: args.agent_type,
            worktree: args.isolation.as_deref() == Some("worktree"),
            tool_call_id: ctx.tool_call_id.clone(),
            cancel: ctx.cancel.clone(),
            reply,
        })
        .await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendInputArgs {
    target: String,
    message: String,
    #[serde(default)]
    interrupt: bool,
}

/// Delivers a message into a child agent's conversation.
#[derive(Debug, Default)]
pub struct SendInput;

#[async_trait]
impl Tool for SendInput {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "send_input",
                "Send a message to a sub-agent. A running agent reads it before its next model \
                 call (at once, stopping its current step, with interrupt: true); a finished agent \
                 starts a new turn with its history kept. Wait for the new answer with wait_agent.",
                json!({
                    "type": "object",
                    "properties": {
                        "target": {"type": "string", "description": "The agent_id."},
                        "message": {"type": "string", "minLength": 1, "description": "The message."},
                        "interrupt": {"type": "boolean", "description": "Stop the agent's current step and take the message now.", "default": false}
                    },
                    "required": ["target", "message"],
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["sessions"])
            .contract()
            .tags(&["sessions"])
            .exclusive()
            .coordinates_only()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: SendInputArgs = parse_args(&self.meta().name, args)?;
        ask_status(ctx, |reply| SubAgentRequest::SendInput {
            target: args.target,
            message: args.message,
            interrupt: args.interrupt,
            reply,
        })
        .await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeArgs {
    id: String,
}

/// Starts a finished or failed child agent again from its history.
#[derive(Debug, Default)]
pub struct ResumeAgent;

#[async_trait]
impl Tool for ResumeAgent {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "resume_agent",
                "Start a sub-agent that finished or failed again from its history, without a new \
                 message (to continue after an error or an interruption).",
                json!({
                    "type": "object",
                    "properties": {"id": {"type": "string", "description": "The agent_id."}},
                    "required": ["id"],
                    "additionalProperties": false
                }),
                Effects::NONE,
            )
            .groups(&["sessions"])
            .contract()
            .tags(&["sessions"])
            .exclusive()
            .coordinates_only()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: ResumeArgs = parse_args(&self.meta().name, args)?;
        ask_status(ctx, |reply| SubAgentRequest::Resume { id: args.id, reply }).await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitArgs {
    #[serde(default)]
    ids: Option<Vec<String>>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Waits for child agents to finish their current turn.
#[derive(Debug, Default)]
pub struct WaitAgent;

#[async_trait]
impl Tool for WaitAgent {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "wait_agent",
                "Wait until one of the named sub-agents has finished its current turn (without \
                 ids: one of those running now), or the timeout passes; returns every named (or \
                 open) agent's status and, for those that completed, its answer.",
                json!({
                    "type": "object",
                    "properties": {
                        "ids": {"type": "array", "items": {"type": "string"}, "description": "The agent_ids; all of the session's agents when omitted."},
                        "timeout_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT.as_millis() as u64, "description": "How long to wait at most (default 30000)."}
                    },
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["sessions"])
            .contract()
            .tags(&["sessions"])
            .coordinates_only()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: WaitArgs = parse_args(&self.meta().name, args)?;
        let timeout = args
            .timeout_ms
            .map_or(DEFAULT_WAIT, Duration::from_millis)
            .min(MAX_WAIT);
        let named = args.ids.is_some();
        let (reply, answer) = oneshot::channel();
        let request = SubAgentRequest::Watch {
            ids: args.ids,
            reply,
        };
        let mut watched = ask(ctx, request, answer).await?;
        if watched.is_empty() {
            return Err(ToolError::model(
                "no_agents",
                "there are no sub-agents to wait for; start one with spawn_agent",
            ));
        }
        // Named agents are waited for whatever they are doing; without names, the ones running
        // now, so an agent that finished long ago does not end every later wait at once.
        let waited: Vec<bool> = if named {
            vec![true; watched.len()]
        } else {
            watched
                .iter()
                .map(|w| w.borrow().status == AgentState::Running)
                .collect()
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut timed_out = false;
        // Done when a waited-for agent is not running, or its sender is gone (it was freed).
        loop {
            let finished = watched
                .iter()
                .zip(&waited)
                .any(|(w, &waited)| waited && w.borrow().status != AgentState::Running);
            if finished || !waited.contains(&true) {
                break;
            }
            let changes = select_all(
                watched
                    .iter_mut()
                    .zip(&waited)
                    .filter(|(_, waited)| **waited)
                    .map(|(w, _)| Box::pin(w.changed())),
            );
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    return Err(ToolError::model("cancelled", "the wait was interrupted"));
                }
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = true;
                    break;
                }
                (changed, _, _) = changes => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        let agents: Vec<AgentStatus> = watched.iter().map(|w| w.borrow().clone()).collect();
        let value = json!({"agents": agents, "timed_out": timed_out});
        Ok(ToolResult::ok(value.to_string()).with_metadata(value))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseArgs {
    target: String,
}

/// Stops a child agent and frees it.
#[derive(Debug, Default)]
pub struct CloseAgent;

#[async_trait]
impl Tool for CloseAgent {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "close_agent",
                "Stop a sub-agent (cancelling what it is doing) and free it; it cannot be used \
                 again. Its transcript stays readable with read_task_output.",
                json!({
                    "type": "object",
                    "properties": {"target": {"type": "string", "description": "The agent_id."}},
                    "required": ["target"],
                    "additionalProperties": false
                }),
                Effects::NONE,
            )
            .groups(&["sessions"])
            .contract()
            .tags(&["sessions"])
            .exclusive()
            .coordinates_only()
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: CloseArgs = parse_args(&self.meta().name, args)?;
        ask_status(ctx, |reply| SubAgentRequest::Close {
            target: args.target,
            reply,
        })
        .await
    }
}
