//! The one dispatch path every call takes: checks (policy, activation, argument size and
//! schema) in [`ToolRegistry::prepare`], then [`PreparedCall::run`] with cancellation and the
//! session's concurrency rule.

use std::sync::Arc;

use serde_json::{Value, json};
use tracing::Instrument;

use crate::error_kind::ErrorKind;
use crate::metrics::Refusal;

use super::args::{InvalidArguments, estimate_json_size, json_size_exceeds};
use super::policy::HiddenReason;
use super::registry::ToolRegistry;
use super::{Tool, ToolContext, ToolError, ToolResult};

/// How long a cancelled call may take to answer for itself before it is dropped.
pub const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);

/// Why a call did not produce a tool result.
///
/// Everything but [`DispatchError::Fatal`] is the caller's mistake or a refusal, and its
/// `Display` is written for the model to read and correct.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// No tool of that name is registered.
    #[error("unknown tool {name:?}; call tool_search to find the right name")]
    UnknownTool {
        /// The name the caller used.
        name: String,
    },
    /// A policy refuses the tool.
    #[error("tool {name:?} is not allowed here ({})", reason.as_str())]
    PolicyDenied {
        /// The tool's name.
        name: String,
        /// Which rule refused it.
        reason: HiddenReason,
    },
    /// The arguments are larger than the registry's cap.
    #[error(
        "arguments for {name} are {size} bytes, over the {limit}-byte limit; send less data per call"
    )]
    ArgsTooLarge {
        /// The tool's name.
        name: String,
        /// Serialised size of the arguments.
        size: usize,
        /// The cap.
        limit: usize,
    },
    /// The arguments do not satisfy the tool's schema.
    #[error("{name}: {error}")]
    InvalidArguments {
        /// The tool's name.
        name: String,
        /// The failing path and what is wrong.
        error: InvalidArguments,
    },
    /// The call's cancellation token fired before the tool finished.
    #[error("{name} was cancelled")]
    Cancelled {
        /// The tool's name.
        name: String,
    },
    /// The tool failed in a way retrying cannot fix; the turn ends.
    #[error("{name} failed: {message}")]
    Fatal {
        /// The tool's name.
        name: String,
        /// What broke, for the log.
        message: String,
    },
}

impl DispatchError {
    /// The kind clients see as `data.kind`.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::UnknownTool { .. } => ErrorKind::UnknownTool,
            Self::PolicyDenied { .. } => ErrorKind::PolicyDenied,
            Self::ArgsTooLarge { .. } => ErrorKind::ArgsTooLarge,
            Self::InvalidArguments { .. } => ErrorKind::InvalidArguments,
            Self::Cancelled { .. } => ErrorKind::Cancelled,
            Self::Fatal { .. } => ErrorKind::Fatal,
        }
    }

    /// How the metrics count this refusal of a call to `tool`: a name no tool has counts as
    /// `unknown`, so callers cannot grow the label set.
    pub fn refusal<'a>(&'a self, tool: &'a str) -> Refusal<'a> {
        Refusal {
            tool: match self {
                Self::UnknownTool { .. } => "unknown",
                _ => tool,
            },
            kind: self.kind().as_str(),
            policy_reason: match self {
                Self::PolicyDenied { reason, .. } => Some(reason.as_str()),
                _ => None,
            },
        }
    }

    /// Whether the call was refused before the tool ran.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Cancelled { .. } | Self::Fatal { .. })
    }

    /// The unsuccessful result the model receives in place of this error.
    pub fn to_tool_result(&self) -> ToolResult {
        ToolResult::failure(self.to_string()).with_metadata(json!({"error": {"kind": self.kind()}}))
    }
}

/// A call that passed every check and is ready to run; holds no borrow of the registry, so
/// several prepared calls can run at once.
#[derive(Clone)]
pub struct PreparedCall {
    name: String,
    tool: Arc<dyn Tool>,
    spawn_only: bool,
}

impl std::fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCall")
            .field("name", &self.name)
            .field("spawn_only", &self.spawn_only)
            .finish()
    }
}

impl PreparedCall {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tool itself.
    pub fn tool(&self) -> &Arc<dyn Tool> {
        &self.tool
    }

    /// Whether the host must run this call in the background.
    pub fn spawn_only(&self) -> bool {
        self.spawn_only
    }

    /// [`PreparedCall::run`] under a session's concurrency rule: an Exclusive tool holds
    /// `exclusivity` alone, a Safe one shares it, and a tool that only coordinates
    /// (`ToolMeta::coordinates_only`) stays out of it.
    pub async fn run_guarded(
        &self,
        ctx: &ToolContext,
        args: &Value,
        exclusivity: &tokio::sync::RwLock<()>,
    ) -> Result<ToolResult, DispatchError> {
        if self.tool.coordinates_only() {
            self.run(ctx, args).await
        } else if self.tool.concurrency_class() == super::ConcurrencyClass::Exclusive {
            let _alone = exclusivity.write().await;
            self.run(ctx, args).await
        } else {
            let _shared = exclusivity.read().await;
            self.run(ctx, args).await
        }
    }

    /// Runs the tool; a model-facing tool error becomes an unsuccessful result, and the call
    /// stops when `ctx.cancel` fires: at once if the tool answers, after [`CANCEL_GRACE`] if not.
    pub async fn run(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, DispatchError> {
        let span = tracing::debug_span!("tool", tool = %self.name, call_id = %ctx.tool_call_id);
        let running = self.tool.call(ctx, args).instrument(span);
        tokio::pin!(running);
        let outcome = tokio::select! {
            biased;
            outcome = &mut running => outcome,
            () = ctx.cancel.cancelled() => {
                // A tool that honours cancellation answers for itself (what it finished, what
                // it spent); one that ignores it is dropped after a short grace.
                match tokio::time::timeout(CANCEL_GRACE, &mut running).await {
                    Ok(outcome) => outcome,
                    Err(_) => return Err(DispatchError::Cancelled { name: self.name.clone() }),
                }
            }
        };
        match outcome {
            Ok(result) => Ok(result),
            Err(ToolError::Model { kind, message }) => {
                Ok(ToolResult::failure(message).with_metadata(json!({"error": {"kind": kind}})))
            }
            Err(ToolError::Fatal(message)) => Err(DispatchError::Fatal {
                name: self.name.clone(),
                message,
            }),
        }
    }
}

impl ToolRegistry {
    /// Checks a call and readies it to run, in this order: provider policy, activation of a
    /// deferred tool (its primary group, else itself), argument size, existence (or
    /// `policy_denied` for a tool the hard policy removed), schema, then usage accounting.
    pub fn prepare(&mut self, name: &str, args: &Value) -> Result<PreparedCall, DispatchError> {
        self.apply_activation_requests();
        // Names no tool has fall through to `unknown_tool`, so a misspelling is never reported
        // as a refusal.
        let known = self
            .tools
            .get(name)
            .or_else(|| self.removed.get(name))
            .map(|entry| (&entry.tool.meta().groups, entry.tool.tags()));
        if let Some((groups, tags)) = known
            && let Some(reason) = self.provider_refusal(name, groups, tags)
        {
            return Err(DispatchError::PolicyDenied {
                name: name.to_string(),
                reason,
            });
        }
        self.activate_for_call(name);
        if json_size_exceeds(args, self.max_args_bytes) {
            return Err(DispatchError::ArgsTooLarge {
                name: name.to_string(),
                size: estimate_json_size(args),
                limit: self.max_args_bytes,
            });
        }
        let Some(entry) = self.tools.get(name) else {
            return Err(if self.removed.contains_key(name) {
                DispatchError::PolicyDenied {
                    name: name.to_string(),
                    reason: HiddenReason::PolicyDeny,
                }
            } else {
                DispatchError::UnknownTool {
                    name: name.to_string(),
                }
            });
        };
        entry
            .validator
            .validate(args)
            .map_err(|error| DispatchError::InvalidArguments {
                name: name.to_string(),
                error,
            })?;
        let call = PreparedCall {
            name: name.to_string(),
            tool: Arc::clone(&entry.tool),
            spawn_only: self.spawn_only.contains(name) || entry.tool.runs_in_background(args),
        };
        self.lifecycle.touch(name);
        Ok(call)
    }

    /// Checks and runs one call in the foreground: `prepare` then `run`.
    pub async fn execute_with_context(
        &mut self,
        ctx: &ToolContext,
        name: &str,
        args: &Value,
    ) -> Result<ToolResult, DispatchError> {
        self.prepare(name, args)?.run(ctx, args).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_unknown_names_as_unknown_and_keeps_the_policys_reason() {
        let unknown = DispatchError::UnknownTool {
            name: "made_up_123".into(),
        };
        assert_eq!(
            unknown.refusal("made_up_123"),
            Refusal {
                tool: "unknown",
                kind: "unknown_tool",
                policy_reason: None
            }
        );
        let denied = DispatchError::PolicyDenied {
            name: "shell".into(),
            reason: HiddenReason::ProviderPolicy,
        };
        assert_eq!(
            denied.refusal("shell"),
            Refusal {
                tool: "shell",
                kind: "policy_denied",
                policy_reason: Some("provider_policy")
            }
        );
    }
}
