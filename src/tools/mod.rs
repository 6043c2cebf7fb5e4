//! The tool system: the `Tool` trait, what a call returns, and the registry, policy, LRU and
//! safety layers every call passes through.
//!
//! - [`registry`]: the per-session set of tools, groups, snapshots, spec cache and catalog.
//! - [`dispatch`]: preparing a call (policy, re-activation, size cap, schema) and running it.
//! - [`deferral`]: deferred groups, activation and activation requests.
//! - [`lifecycle`]: the LRU that evicts idle tools from the model's view.
//! - [`policy`]: allow / deny / require_tags with groups and wildcards.
//! - [`approval`]: which calls wait for a person (`ask`, command rules, session grants).
//! - [`catalog`]: the live list of every tool and why it is or is not visible.
//! - [`args`]: the argument size cap and schema validation.
//! - [`workspace`]: a session's directory, the journal of its changes, its tools' shared state.
//! - [`delegation`]: what sub-agent tools ask of their session.
//!
//! The tools themselves live beside the framework: `crate::builtin`, `crate::plugin` and
//! `crate::mcp`.

pub mod approval;
pub mod args;
pub mod catalog;
/// What a command line runs, seen through wrappers: the reading command rules judge.
pub mod command_line;
pub mod deferral;
pub mod delegation;
pub mod dispatch;
pub mod lifecycle;
pub mod policy;
#[cfg(test)]
pub(crate) mod process_probe;
pub mod registry;
pub mod workspace;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use crate::llm::ToolSpec;
use crate::llm::pricing::CallCost;
pub use catalog::{CatalogCell, CatalogEntry, ToolCatalog, ToolState};
pub use dispatch::{DispatchError, PreparedCall};
pub use lifecycle::ToolLifecycle;
pub use policy::{HiddenReason, ToolPolicy};
pub use registry::{RegistryError, ToolRegistry};
pub use workspace::Workspace;

/// Whether a tool may run at the same time as other tools of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyClass {
    /// Reads only or has no observable side effect: runs concurrently with other Safe tools.
    Safe,
    /// Writes files, starts processes or changes state: runs alone, in the model's order.
    Exclusive,
}

/// Tokens a tool spent on model calls of its own (sub-agents, pipelines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// What a tool call produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The text the model sees.
    pub output: String,
    /// Whether the call did what was asked.
    pub success: bool,
    /// A file the call changed, for the UI and the workspace log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_modified: Option<PathBuf>,
    /// Files the call hands to the user as downloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_to_send: Vec<PathBuf>,
    /// Model tokens the tool itself spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<TokenUsage>,
    /// A side channel for the host and the UI (process status, error kinds); the model never
    /// sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_metadata: Option<Value>,
    /// Model calls the tool made on the session's behalf; the session's ledger records them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub costs: Vec<CallCost>,
    /// Images for the model to look at (`view_image`); the turn shows them to the model
    /// after the batch's results. Never in events: they would bloat every replay.
    #[serde(skip)]
    pub images: Vec<crate::llm::ImageData>,
}

impl ToolResult {
    /// A successful result carrying `output`.
    pub fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            success: true,
            ..Self::default()
        }
    }

    /// An unsuccessful result carrying `output` for the model to act on.
    pub fn failure(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            success: false,
            ..Self::default()
        }
    }

    /// Attaches host-side metadata.
    pub fn with_metadata(mut self, metadata: Value) -> Self {
        self.structured_metadata = Some(metadata);
        self
    }

    /// `structured_metadata` as clients receive it: the cost rows join it as `node_costs`.
    pub fn wire_metadata(&self) -> Option<Value> {
        if self.costs.is_empty() {
            return self.structured_metadata.clone();
        }
        let mut metadata = match &self.structured_metadata {
            Some(Value::Object(map)) => map.clone(),
            _ => serde_json::Map::new(),
        };
        metadata.insert(
            "node_costs".into(),
            serde_json::to_value(&self.costs).unwrap_or_default(),
        );
        Some(Value::Object(metadata))
    }
}

/// Why a tool could not do its job.
///
/// The split decides who hears about it: [`ToolError::Model`] becomes an unsuccessful
/// [`ToolResult`] the model reads and can correct; [`ToolError::Fatal`] ends the turn, because
/// retrying cannot help (the host is broken, not the call).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A mistake or refusal the model should read: bad input, a missing file, no backend.
    #[error("{message}")]
    Model {
        /// A snake_case word for the UI and metrics (`invalid_input`, `not_found`,
        /// `unsupported`, …).
        kind: &'static str,
        /// What went wrong and how to fix the call.
        message: String,
    },
    /// A failure of the host itself; the turn stops.
    #[error("fatal tool error: {0}")]
    Fatal(String),
}

impl ToolError {
    /// A model-facing error of the given kind.
    pub fn model(kind: &'static str, message: impl Into<String>) -> Self {
        Self::Model {
            kind,
            message: message.into(),
        }
    }

    /// The typed answer of a tool that has no backend on this server.
    pub fn unsupported(tool: &str, why: &str) -> Self {
        Self::model("unsupported", format!("{tool} is unsupported here: {why}"))
    }
}

impl From<crate::fs_safe::FsError> for ToolError {
    fn from(err: crate::fs_safe::FsError) -> Self {
        Self::model(err.kind(), err.to_string())
    }
}

/// Something a running tool tells its session before it finishes.
#[derive(Debug)]
pub enum ToolEvent {
    /// A human-readable progress note, optionally with a completed fraction in 0..=1.
    Progress {
        /// The call this belongs to.
        tool_call_id: String,
        /// What is happening.
        message: String,
        /// How far along, when known.
        fraction: Option<f32>,
    },
    /// A chunk of output produced while running.
    Output {
        /// The call this belongs to.
        tool_call_id: String,
        /// The text produced.
        text: String,
    },
    /// The model's plan changed; becomes `plan/updated`.
    PlanUpdated {
        /// Why the plan changed.
        explanation: Option<String>,
        /// The steps, each `{step, status}`.
        plan: Value,
    },
    /// The model asks the user questions; becomes `user_input/requested`. The session sends
    /// the answers (`{question_id: text}`) through `reply`; dropping it means nobody will answer.
    UserInputRequested {
        /// Identifies the request in `user_input/respond`.
        request_id: String,
        /// The questions as the model wrote them.
        questions: Value,
        /// Where the answers go.
        reply: oneshot::Sender<Value>,
    },
    /// A sub-agent tool asks the session, which owns the children, to act; it answers
    /// through the request's reply.
    SubAgent(delegation::SubAgentRequest),
}

/// Everything a tool may know about the call it is serving.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session the call runs in.
    pub session_id: String,
    /// The model's (or client's) id for this call.
    pub tool_call_id: String,
    /// The directory relative paths resolve against; the session's workspace.
    pub cwd: PathBuf,
    /// Fires when the turn is interrupted or the session closes; long tools must stop.
    pub cancel: CancellationToken,
    /// Progress, output, plan and question events; the session actor holds the receiver and
    /// forwards them to clients. `None` when nobody listens (tests, plain dispatch).
    pub events: Option<mpsc::Sender<ToolEvent>>,
    /// The live catalog of the registry serving this call, for discovery tools.
    pub catalog: Option<CatalogCell>,
    /// What the session may still spend on model calls, in USD, when it has a budget; tools
    /// that call models themselves (pipelines) reserve against it.
    pub budget_left_usd: Option<f64>,
}

impl ToolContext {
    /// A context nobody listens to, for direct calls and tests.
    pub fn detached(cwd: impl Into<PathBuf>) -> Self {
        Self {
            session_id: String::new(),
            tool_call_id: String::new(),
            cwd: cwd.into(),
            cancel: CancellationToken::new(),
            events: None,
            catalog: None,
            budget_left_usd: None,
        }
    }

    /// Sends a progress note; waits when the listener is behind, drops it when nobody listens.
    pub async fn progress(&self, message: impl Into<String>, fraction: Option<f32>) {
        // A closed receiver means the session is gone; the tool's result is what matters.
        self.emit(ToolEvent::Progress {
            tool_call_id: self.tool_call_id.clone(),
            message: message.into(),
            fraction,
        })
        .await;
    }

    /// Sends a chunk of output produced while running.
    pub async fn output(&self, text: impl Into<String>) {
        self.emit(ToolEvent::Output {
            tool_call_id: self.tool_call_id.clone(),
            text: text.into(),
        })
        .await;
    }

    /// Sends any event; returns false when nobody listens.
    pub async fn emit(&self, event: ToolEvent) -> bool {
        match &self.events {
            Some(events) => events.send(event).await.is_ok(),
            None => false,
        }
    }
}

/// What a tool can do to the world beyond answering, stated by every tool when its
/// [`ToolMeta`] is built (there is no default): the groups `group:writes` and
/// `group:commands`, the `.git` rule, approvals and ACP's tool kinds are derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Effects {
    /// It can change files: by itself, or through a command or program it runs.
    pub writes_files: bool,
    /// It runs a command or a program, or types into a running one.
    pub runs_commands: bool,
    /// It can reach the network.
    pub reaches_network: bool,
}

impl Effects {
    /// Reads, computes or coordinates only.
    pub const NONE: Self = Self {
        writes_files: false,
        runs_commands: false,
        reaches_network: false,
    };
    /// Changes files itself and nothing more.
    pub const WRITES_FILES: Self = Self {
        writes_files: true,
        ..Self::NONE
    };
    /// Reaches the network and changes no file.
    pub const REACHES_NETWORK: Self = Self {
        reaches_network: true,
        ..Self::NONE
    };
    /// Runs a command or program: it can then change files and reach the network too, so it
    /// counts as doing all three.
    pub const RUNS_COMMANDS: Self = Self {
        writes_files: true,
        runs_commands: true,
        reaches_network: true,
    };

    /// The policy groups these effects put a tool in: `writes`, `commands`.
    pub fn groups(self) -> impl Iterator<Item = &'static str> {
        [
            (self.writes_files, policy::WRITES_GROUP),
            (self.runs_commands, policy::COMMANDS_GROUP),
        ]
        .into_iter()
        .filter_map(|(member, group)| member.then_some(group))
    }
}

/// Which argument of a call says what it runs or writes: what approvals' command rules judge
/// and what the `.git` rule checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallSubject {
    /// The argument holds a command line the tool runs (`shell`'s `command`).
    CommandLine(&'static str),
    /// The argument holds characters typed into a running command (`write_stdin`'s `chars`).
    TypedInput(&'static str),
    /// The argument names the one file the call writes (`write_file`'s `path`).
    WrittenPath(&'static str),
    /// The argument holds a patch whose `*** Add File:`, `*** Update File:`,
    /// `*** Delete File:` and `*** Move to:` lines name the files it writes (`apply_patch`).
    Patch(&'static str),
}

impl CallSubject {
    /// Whether the subject is a command: the tool must then run commands.
    pub fn is_command(self) -> bool {
        matches!(self, Self::CommandLine(_) | Self::TypedInput(_))
    }
}

/// What a tool is, as data fixed when it is built: what the model is shown, how the
/// dispatcher schedules it, and what it can do ([`Effects`]).
///
/// Built with [`ToolMeta::new`] (an untagged Safe tool that calls no model, with the effects
/// it states) and the chained setters below; tools whose metadata never varies keep one in a
/// `static` `LazyLock`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMeta {
    /// The unique name the model calls it by.
    pub name: String,
    /// What it does, written for the model.
    pub description: String,
    /// JSON Schema of the arguments, shared with every spec made of it.
    pub input_schema: Arc<Value>,
    /// Capability tags (`fs`, `search`, `web`, …); an untagged tool passes every tag filter.
    pub tags: Vec<&'static str>,
    /// Safe tools run concurrently within a batch; Exclusive ones run alone.
    pub concurrency: ConcurrencyClass,
    /// Whether the tool calls models itself (and so spends the session's budget): it is then
    /// given what is left of the budget, held for it until it ends.
    pub uses_models: bool,
    /// Whether the tool only asks its session to act and waits for the answer, touching no
    /// workspace state itself: it then stays out of the Safe/Exclusive lock, so a long wait
    /// (`wait_agent`) never holds off the session's other calls. Batch order still follows
    /// [`ToolMeta::concurrency`].
    pub coordinates_only: bool,
    /// What it can do to the world: files, commands, network.
    pub effects: Effects,
    /// The argument approvals and the `.git` rule read, for a tool whose calls name a command
    /// or the files they write.
    pub subject: Option<CallSubject>,
    /// The named groups it belongs to, for `group:NAME` in policies, deferral and activation:
    /// at most one primary group (`fs`, `search`, `runtime`, `web`, `sessions`), any
    /// policy-only ones (`delegated`), and those its [`Effects`] put it in (`writes`,
    /// `commands`), which [`ToolMeta::groups`] keeps.
    pub groups: Vec<&'static str>,
    /// Whether it is a base tool: never evicted nor deferred unless `[tools] base_tools` names
    /// another set.
    pub base: bool,
    /// Whether the coding-tool contract names it, so `session/open` reports its status.
    pub contract: bool,
}

impl ToolMeta {
    /// An untagged, Safe tool that calls no model, with the `effects` it states.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        effects: Effects,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            input_schema: Arc::new(input_schema),
            tags: Vec::new(),
            concurrency: ConcurrencyClass::Safe,
            uses_models: false,
            coordinates_only: false,
            effects,
            subject: None,
            groups: effects.groups().collect(),
            base: false,
            contract: false,
        }
    }

    /// Sets the argument approvals and the `.git` rule read (see the field of that name).
    pub fn subject(mut self, subject: CallSubject) -> Self {
        self.subject = Some(subject);
        self
    }

    /// Sets the capability tags.
    pub fn tags(mut self, tags: &[&'static str]) -> Self {
        self.tags = tags.to_vec();
        self
    }

    /// Marks the tool Exclusive: it runs alone, in the model's order.
    pub fn exclusive(mut self) -> Self {
        self.concurrency = ConcurrencyClass::Exclusive;
        self
    }

    /// Marks the tool as one that calls models itself (see the field of that name).
    pub fn uses_models(mut self) -> Self {
        self.uses_models = true;
        self
    }

    /// Marks the tool as one that only coordinates (see the field of that name).
    pub fn coordinates_only(mut self) -> Self {
        self.coordinates_only = true;
        self
    }

    /// Sets the named groups it belongs to (see the field of that name); the groups of its
    /// effects stay.
    pub fn groups(mut self, groups: &[&'static str]) -> Self {
        self.groups = groups.to_vec();
        self.groups.extend(self.effects.groups());
        self
    }

    /// Marks it a base tool (see the field of that name).
    pub fn base(mut self) -> Self {
        self.base = true;
        self
    }

    /// Marks it as named by the coding-tool contract.
    pub fn contract(mut self) -> Self {
        self.contract = true;
        self
    }

    /// Its primary group, the one a call to it while deferred brings back.
    pub fn primary_group(&self) -> Option<&'static str> {
        self.groups
            .iter()
            .copied()
            .find(|group| policy::PRIMARY_GROUPS.contains(group))
    }
}

/// A capability the model can call: its [`ToolMeta`] and what one call does.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// What the tool is: name, description, schema, tags and scheduling.
    fn meta(&self) -> &ToolMeta;

    /// Runs one call with its context (session, cancellation, progress events, catalog).
    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError>;

    /// A copy of this tool working in `workspace`, for tools bound to a workspace directory;
    /// `None` for tools that do not depend on one (they stay shared as they are).
    fn rebind_cwd(&self, _workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        None
    }

    /// Whether this one call asks to run as a background task (`shell`'s
    /// `run_in_background`), answered with a task_handle envelope like a spawn_only tool.
    fn runs_in_background(&self, _args: &Value) -> bool {
        false
    }
}

/// Whether `args` holds `"run_in_background": true`.
pub(crate) fn asks_background(args: &Value) -> bool {
    args.get("run_in_background").and_then(Value::as_bool) == Some(true)
}

/// Shorthands for the fields of [`Tool::meta`], so callers holding a `dyn Tool` read as before.
impl dyn Tool {
    /// The unique name the model calls it by.
    pub fn name(&self) -> &str {
        &self.meta().name
    }

    /// What it does, written for the model.
    pub fn description(&self) -> &str {
        &self.meta().description
    }

    /// JSON Schema of the arguments.
    pub fn input_schema(&self) -> &Value {
        &self.meta().input_schema
    }

    /// Capability tags.
    pub fn tags(&self) -> &[&'static str] {
        &self.meta().tags
    }

    /// Whether it runs alongside other tools of a batch.
    pub fn concurrency_class(&self) -> ConcurrencyClass {
        self.meta().concurrency
    }

    /// Whether it calls models itself.
    pub fn uses_models(&self) -> bool {
        self.meta().uses_models
    }

    /// Whether it only coordinates and so stays out of the Safe/Exclusive lock.
    pub fn coordinates_only(&self) -> bool {
        self.meta().coordinates_only
    }
}
