//! The per-session tool registry: what the model sees (`specs()`), what it may call, and the one
//! dispatch path every call takes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tracing::Instrument;

use super::args::{
    ArgsValidator, DEFAULT_MAX_ARGS_BYTES, InvalidArguments, estimate_json_size, json_size_exceeds,
};
use super::catalog::{CatalogCell, CatalogEntry, ToolCatalog, ToolState};
use super::lifecycle::ToolLifecycle;
use super::policy::{self, HiddenReason, ToolPolicy, Verdict};
use super::workspace::Workspace;
use super::{Tool, ToolContext, ToolError, ToolResult, ToolSpec};

/// Builds the tool whose presence and description follow the deferred set (`activate_tools`):
/// given the deferred names, it returns the tool to show while any exist.
pub type DeferralToolFactory = Arc<dyn Fn(&[&str]) -> Arc<dyn Tool> + Send + Sync>;

#[derive(Clone)]
struct DeferralTool {
    name: String,
    factory: DeferralToolFactory,
    /// The deferred names the registered instance was built for.
    listed: Vec<String>,
}

/// How long a cancelled call may take to answer for itself before it is dropped.
pub const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);

/// A registry could not take a tool.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The tool's `input_schema` is not a valid JSON Schema.
    #[error("tool {tool}: invalid input schema: {message}")]
    InvalidSchema {
        /// The tool's name.
        tool: String,
        /// What is wrong with the schema.
        message: String,
    },
}

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
    /// The snake_case word clients see as `data.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownTool { .. } => "unknown_tool",
            Self::PolicyDenied { .. } => "policy_denied",
            Self::ArgsTooLarge { .. } => "args_too_large",
            Self::InvalidArguments { .. } => "invalid_arguments",
            Self::Cancelled { .. } => "cancelled",
            Self::Fatal { .. } => "fatal",
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

/// One registered tool with what the registry derived from it once.
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<ArgsValidator>,
    group: Option<&'static str>,
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
    /// ([`Tool::coordinates_only`]) stays out of it.
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
        let running = self.tool.execute_with_context(ctx, args).instrument(span);
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

/// The tools one session can use, with its own deferral, policy and LRU state.
///
/// Mutations take `&mut self`: a registry has one owner (the session actor), and calls are
/// prepared under that ownership and then run without it.
pub struct ToolRegistry {
    /// Keyed by shared names so a session snapshot copies no text.
    tools: BTreeMap<Arc<str>, Entry>,
    /// Tools the hard policy removed; kept only to describe them and to answer
    /// `policy_denied` instead of `unknown_tool`.
    removed: BTreeMap<String, Entry>,
    deferred: BTreeSet<String>,
    spawn_only: BTreeSet<String>,
    hard_policy: Option<ToolPolicy>,
    provider_policy: Option<ToolPolicy>,
    context_filter: Vec<String>,
    lifecycle: ToolLifecycle,
    max_args_bytes: usize,
    specs: OnceLock<Arc<[ToolSpec]>>,
    catalog: CatalogCell,
    workspace: Option<Arc<Workspace>>,
    deferral_tool: Option<DeferralTool>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new(ToolLifecycle::default())
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("deferred", &self.deferred)
            .field("spawn_only", &self.spawn_only)
            .field("iteration", &self.lifecycle.iteration())
            .finish_non_exhaustive()
    }
}

impl ToolRegistry {
    /// An empty registry with the given LRU settings.
    pub fn new(lifecycle: ToolLifecycle) -> Self {
        Self {
            tools: BTreeMap::new(),
            removed: BTreeMap::new(),
            deferred: BTreeSet::new(),
            spawn_only: BTreeSet::new(),
            hard_policy: None,
            provider_policy: None,
            context_filter: Vec::new(),
            lifecycle,
            max_args_bytes: DEFAULT_MAX_ARGS_BYTES,
            specs: OnceLock::new(),
            catalog: CatalogCell::default(),
            workspace: None,
            deferral_tool: None,
        }
    }

    /// The workspace the cwd-bound tools work in, once one is bound.
    pub fn workspace(&self) -> Option<&Arc<Workspace>> {
        self.workspace.as_ref()
    }

    /// Records the workspace the registered tools were built for.
    pub fn set_workspace(&mut self, workspace: Arc<Workspace>) {
        self.workspace = Some(workspace);
    }

    /// Installs the tool shown only while something is deferred (see [`DeferralToolFactory`]).
    pub fn set_deferral_tool(&mut self, name: impl Into<String>, factory: DeferralToolFactory) {
        self.deferral_tool = Some(DeferralTool {
            name: name.into(),
            factory,
            listed: Vec::new(),
        });
        self.changed();
    }

    /// Adds a tool, replacing one of the same name. A tool the hard policy refuses is recorded
    /// as removed instead, so it stays forbidden rather than unknown.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.name().to_string();
        let validator = ArgsValidator::compile(&tool.input_schema()).map_err(|err| {
            RegistryError::InvalidSchema {
                tool: name.clone(),
                message: err.message,
            }
        })?;
        let entry = Entry {
            group: policy::primary_group(&name),
            validator: Arc::new(validator),
            tool,
        };
        let refused = self
            .hard_policy
            .as_ref()
            .is_some_and(|p| p.verdict(&name, entry.tool.tags()) != Verdict::Allowed);
        if refused {
            self.tools.remove(name.as_str());
            self.deferred.remove(&name);
            self.spawn_only.remove(&name);
            self.removed.insert(name, entry);
        } else {
            self.removed.remove(&name);
            self.lifecycle.touch(&name);
            self.tools.insert(name.into(), entry);
        }
        self.changed();
        Ok(())
    }

    /// Removes a tool; returns it when it was there.
    pub fn unregister(&mut self, name: &str) -> Option<Arc<dyn Tool>> {
        let entry = self.tools.remove(name)?;
        self.deferred.remove(name);
        self.spawn_only.remove(name);
        self.changed();
        Some(entry.tool)
    }

    /// The registered tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|entry| &entry.tool)
    }

    /// Whether a tool called `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Number of registered tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Sets the argument size cap.
    pub fn set_max_args_bytes(&mut self, limit: usize) {
        self.max_args_bytes = limit;
    }

    /// The LRU counters.
    pub fn lifecycle(&self) -> &ToolLifecycle {
        &self.lifecycle
    }

    /// Replaces the LRU limits and base tools (from the config's `[tools]`), keeping usage.
    pub fn configure_lifecycle(
        &mut self,
        max_active: usize,
        idle_threshold: u32,
        base_tools: impl IntoIterator<Item = String>,
    ) {
        self.lifecycle.max_active = max_active;
        self.lifecycle.idle_threshold = idle_threshold;
        self.lifecycle.base_tools = base_tools.into_iter().collect();
        for name in self.lifecycle.base_tools.clone() {
            self.deferred.remove(&name);
        }
        self.changed();
    }

    /// Pins a tool name against eviction and deferral, whether or not it is registered yet.
    pub fn pin_base_tool(&mut self, name: impl Into<String>) {
        let name = name.into();
        let was_deferred = self.deferred.remove(&name);
        self.lifecycle.pin(name);
        if was_deferred {
            self.changed();
        } else {
            // Pinning reorders specs (base tools come first).
            self.specs = OnceLock::new();
        }
    }

    /// Marks a registered tool as run in the background; unknown names are skipped.
    pub fn mark_spawn_only(&mut self, name: &str) {
        if self.tools.contains_key(name) && self.spawn_only.insert(name.to_string()) {
            self.changed();
        }
    }

    /// Whether calls to `name` run in the background.
    pub fn is_spawn_only(&self, name: &str) -> bool {
        self.spawn_only.contains(name)
    }

    /// Runs every tool in the foreground; a sub-agent is already background work.
    pub fn clear_spawn_only(&mut self) {
        if !self.spawn_only.is_empty() {
            self.spawn_only.clear();
            self.changed();
        }
    }

    /// Holds back every registered, non-base member of `group` (`group:web` or `web`); returns
    /// the names newly deferred. Unknown groups and unregistered members are skipped.
    pub fn defer_group(&mut self, group: &str) -> Vec<String> {
        let members = self.members_of(group);
        let mut deferred = Vec::new();
        for name in members {
            if !self.lifecycle.is_base(&name) && self.deferred.insert(name.clone()) {
                deferred.push(name);
            }
        }
        if !deferred.is_empty() {
            self.changed();
        }
        deferred
    }

    /// Defers `groups` only when more than `max_active` tools are visible; the start-of-session
    /// rule for the config's `defer_groups`.
    pub fn defer_groups_if_crowded(&mut self, groups: &[String]) -> Vec<String> {
        if self.active_names().len() <= self.lifecycle.max_active() {
            return Vec::new();
        }
        groups
            .iter()
            .flat_map(|group| self.defer_group(group))
            .collect()
    }

    /// Makes a deferred group (`group:NAME`) or tool visible again; returns the names newly
    /// activated. Unknown names are skipped.
    pub fn activate(&mut self, group_or_name: &str) -> Vec<String> {
        let candidates = if group_or_name.starts_with("group:") {
            self.members_of(group_or_name)
        } else {
            vec![group_or_name.to_string()]
        };
        let mut activated = Vec::new();
        for name in candidates {
            if self.deferred.remove(&name) {
                self.lifecycle.touch(&name);
                activated.push(name);
            }
        }
        if !activated.is_empty() {
            self.changed();
        }
        activated
    }

    /// Advances the LRU to the next model iteration; call before every model request. Applies
    /// activations tools asked for since the last iteration.
    pub fn tick(&mut self) {
        self.apply_activation_requests();
        self.lifecycle.tick();
    }

    /// Activates what tools asked for through the catalog cell; returns the names activated.
    pub fn apply_activation_requests(&mut self) -> Vec<String> {
        self.catalog
            .take_activation_requests()
            .iter()
            .flat_map(|name| self.activate(name))
            .collect()
    }

    /// Moves idle tools into the deferred set when too many are visible; returns their names.
    pub fn auto_evict(&mut self) -> Vec<String> {
        let evicted = {
            // The deferral tool exists because something is deferred; it does not take a slot.
            let deferral = self.deferral_tool.as_ref().map(|d| d.name.as_str());
            let active: Vec<&str> = self
                .active_names()
                .into_iter()
                .filter(|name| Some(*name) != deferral)
                .collect();
            self.lifecycle.find_evictable(&active, &self.spawn_only)
        };
        if !evicted.is_empty() {
            self.deferred.extend(evicted.iter().cloned());
            tracing::debug!(evicted = ?evicted, "tools evicted");
            self.changed();
        }
        evicted
    }

    /// Applies the system-wide policy: refused tools are removed for good (with their deferred
    /// and spawn_only marks) and remembered as hidden with reason `policy_deny`. Returns the
    /// names removed.
    pub fn apply_policy(&mut self, policy: ToolPolicy) -> Vec<String> {
        let refused: Vec<String> = self
            .tools
            .iter()
            .filter(|(name, entry)| policy.verdict(name, entry.tool.tags()) != Verdict::Allowed)
            .map(|(name, _)| name.to_string())
            .collect();
        for name in &refused {
            if let Some(entry) = self.tools.remove(name.as_str()) {
                self.removed.insert(name.clone(), entry);
            }
            self.deferred.remove(name);
            self.spawn_only.remove(name);
        }
        self.hard_policy = Some(policy);
        self.changed();
        refused
    }

    /// The system-wide policy applied to this registry, if any.
    pub fn hard_policy(&self) -> Option<&ToolPolicy> {
        self.hard_policy.as_ref()
    }

    /// Sets (or clears) the soft policy for the configured model: refused tools stay
    /// registered but leave `specs()` and are refused when called.
    pub fn set_provider_policy(&mut self, policy: Option<ToolPolicy>) {
        self.provider_policy = policy.filter(|p| !p.is_empty());
        self.changed();
    }

    /// Trims `specs()` to tools sharing one of `tags` (untagged tools always stay); empty
    /// clears the filter.
    pub fn set_context_filter(&mut self, tags: Vec<String>) {
        self.context_filter = tags;
        self.changed();
    }

    /// Why the provider policy refuses `name` with `tags`, if it does.
    fn provider_refusal(&self, name: &str, tags: &[&str]) -> Option<HiddenReason> {
        match self.provider_policy.as_ref()?.verdict(name, tags) {
            Verdict::Allowed => None,
            Verdict::DeniedByName => Some(HiddenReason::ProviderPolicy),
            Verdict::DeniedByTags => Some(HiddenReason::RequireTags),
        }
    }

    /// Where a registered tool stands.
    fn state_of(&self, name: &str, tool: &dyn Tool) -> ToolState {
        if let Some(reason) = self.provider_refusal(name, tool.tags()) {
            return ToolState::Hidden(reason);
        }
        if !policy::tags_pass(&self.context_filter, tool.tags()) {
            return ToolState::Hidden(HiddenReason::ContextFilter);
        }
        if self.deferred.contains(name) {
            return ToolState::Deferred;
        }
        ToolState::Active
    }

    /// Names of the tools the model currently sees, in name order.
    pub fn active_names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .filter(|(name, entry)| self.state_of(name, entry.tool.as_ref()) == ToolState::Active)
            .map(|(name, _)| &**name)
            .collect()
    }

    /// Names of deferred tools, in name order.
    pub fn deferred_names(&self) -> Vec<&str> {
        self.deferred.iter().map(String::as_str).collect()
    }

    /// What the model is shown: active tools, base tools first, then by name. Cached until
    /// the next mutation, so every request of a quiet session sends the same prefix.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(self.specs.get_or_init(|| {
            let mut visible: Vec<(bool, &str, &dyn Tool)> = self
                .tools
                .iter()
                .filter(|(name, entry)| {
                    self.state_of(name, entry.tool.as_ref()) == ToolState::Active
                })
                .map(|(name, entry)| (!self.lifecycle.is_base(name), &**name, entry.tool.as_ref()))
                .collect();
            // BTreeMap order is by name; a stable sort on "not base" puts base tools first.
            visible.sort_by_key(|(not_base, _, _)| *not_base);
            visible
                .into_iter()
                .map(|(_, name, tool)| ToolSpec {
                    name: name.to_string(),
                    description: tool.description().to_string(),
                    input_schema: tool.input_schema(),
                })
                .collect()
        }))
    }

    /// The current catalog of every tool, removed ones included.
    pub fn catalog(&self) -> Arc<ToolCatalog> {
        self.catalog.load()
    }

    /// A handle that always reads this registry's current catalog.
    pub fn catalog_cell(&self) -> CatalogCell {
        self.catalog.clone()
    }

    /// A child registry sharing the tool objects but with its own LRU counters, spec cache and
    /// catalog. Names in `excluded` (exact, `group:NAME` or `prefix*`) are left out. Policy,
    /// context filter, deferred set and spawn_only marks are copied; base tools and limits kept.
    pub fn snapshot_excluding(&self, excluded: &[&str]) -> ToolRegistry {
        let keep = |name: &str| {
            !excluded
                .iter()
                .any(|entry| policy::entry_matches(entry, name))
        };
        let child = ToolRegistry {
            tools: self
                .tools
                .iter()
                .filter(|(name, _)| keep(name))
                .map(|(name, entry)| (Arc::clone(name), entry.clone()))
                .collect(),
            removed: self.removed.clone(),
            deferred: self.deferred.iter().filter(|n| keep(n)).cloned().collect(),
            spawn_only: self
                .spawn_only
                .iter()
                .filter(|n| keep(n))
                .cloned()
                .collect(),
            hard_policy: self.hard_policy.clone(),
            provider_policy: self.provider_policy.clone(),
            context_filter: self.context_filter.clone(),
            lifecycle: self.lifecycle.fresh(),
            max_args_bytes: self.max_args_bytes,
            specs: OnceLock::new(),
            catalog: CatalogCell::default(),
            workspace: self.workspace.clone(),
            deferral_tool: self.deferral_tool.clone(),
        };
        child.refresh_catalog();
        child
    }

    /// Rebuilds the tools bound to a workspace directory so they work in a fresh workspace at
    /// `cwd` (its own change journal and shared state); every other tool stays the same shared
    /// object. Returns the new workspace.
    pub fn rebind_cwd(&mut self, cwd: &Path) -> Arc<Workspace> {
        self.rebind_workspace(Workspace::new(cwd))
    }

    /// As [`ToolRegistry::rebind_cwd`], with a workspace the caller built (one anchored
    /// beneath its user's root, say). Returns that workspace.
    pub fn rebind_workspace(&mut self, workspace: Arc<Workspace>) -> Arc<Workspace> {
        let mut rebound = false;
        for entry in self.tools.values_mut() {
            if let Some(tool) = entry.tool.rebind_cwd(&workspace) {
                entry.tool = tool;
                rebound = true;
            }
        }
        self.workspace = Some(Arc::clone(&workspace));
        if rebound {
            self.changed();
        }
        workspace
    }

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
            .map(|entry| entry.tool.tags());
        if let Some(tags) = known
            && let Some(reason) = self.provider_refusal(name, tags)
        {
            return Err(DispatchError::PolicyDenied {
                name: name.to_string(),
                reason,
            });
        }
        if self.deferred.contains(name) {
            let target = match policy::primary_group(name) {
                Some(group) => format!("group:{group}"),
                None => name.to_string(),
            };
            let mut activated = self.activate(&target);
            // A group activation must bring back the tool itself even if it is not a
            // registered member of that group's static list.
            activated.extend(self.activate(name));
            tracing::debug!(tool = name, activated = ?activated, "deferred tool activated on call");
        }
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
            spawn_only: self.spawn_only.contains(name),
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

    /// Registered names of `group` (bare or `group:` prefixed): its static members plus tools
    /// whose primary group it is.
    fn members_of(&self, group: &str) -> Vec<String> {
        let bare = group.strip_prefix("group:").unwrap_or(group);
        let listed = policy::group_members(bare);
        self.tools
            .iter()
            .filter(|(name, entry)| entry.group == Some(bare) || listed.contains(&&***name))
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Drops derived state after a mutation: the spec cache and the catalog.
    fn changed(&mut self) {
        self.sync_deferral_tool();
        self.specs = OnceLock::new();
        self.refresh_catalog();
    }

    /// Shows the deferral tool while anything is deferred, describing exactly what is.
    fn sync_deferral_tool(&mut self) {
        let Some(deferral) = self.deferral_tool.as_mut() else {
            return;
        };
        let listed: Vec<&str> = self
            .deferred
            .iter()
            .map(String::as_str)
            .filter(|name| *name != deferral.name)
            .collect();
        let registered = self.tools.contains_key(deferral.name.as_str());
        let refused = self
            .hard_policy
            .as_ref()
            .is_some_and(|p| !p.is_allowed(&deferral.name));
        if listed.is_empty() || refused {
            if registered {
                self.tools.remove(deferral.name.as_str());
            }
            deferral.listed.clear();
            return;
        }
        if registered && deferral.listed == listed {
            return;
        }
        let tool = (deferral.factory)(&listed);
        let Ok(validator) = ArgsValidator::compile(&tool.input_schema()) else {
            tracing::error!(tool = %deferral.name, "deferral tool has an invalid schema");
            return;
        };
        deferral.listed = listed.iter().map(|s| s.to_string()).collect();
        self.lifecycle.touch(&deferral.name);
        self.tools.insert(
            deferral.name.as_str().into(),
            Entry {
                tool,
                validator: Arc::new(validator),
                group: None,
            },
        );
    }

    fn refresh_catalog(&self) {
        let mut entries: Vec<CatalogEntry> = self
            .tools
            .iter()
            .map(|(name, entry)| CatalogEntry {
                tool: Arc::clone(&entry.tool),
                group: entry.group,
                spawn_only: self.spawn_only.contains(&**name),
                state: self.state_of(name, entry.tool.as_ref()),
            })
            .chain(self.removed.values().map(|entry| CatalogEntry {
                tool: Arc::clone(&entry.tool),
                group: entry.group,
                spawn_only: false,
                state: ToolState::Hidden(HiddenReason::PolicyDeny),
            }))
            .collect();
        if !self.removed.is_empty() {
            // Registered tools come out of the map in name order; only removed ones need merging.
            entries.sort_by(|a, b| a.name().cmp(b.name()));
        }
        self.catalog.store(ToolCatalog { entries });
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::tools::{ConcurrencyClass, ToolEvent};

    /// A configurable tool that counts its calls.
    struct Probe {
        name: String,
        tags: Vec<&'static str>,
        schema: Value,
        cwd: Option<PathBuf>,
        behaviour: Behaviour,
        calls: AtomicUsize,
    }

    #[derive(Clone, Copy)]
    enum Behaviour {
        Echo,
        ModelError,
        Fatal,
        Hang,
        Progress,
        StopsWhenAsked,
    }

    impl Probe {
        fn new(name: &str) -> Self {
            Self {
                name: name.to_string(),
                tags: Vec::new(),
                schema: json!({"type": "object"}),
                cwd: None,
                behaviour: Behaviour::Echo,
                calls: AtomicUsize::new(0),
            }
        }
        fn tags(mut self, tags: &[&'static str]) -> Self {
            self.tags = tags.to_vec();
            self
        }
        fn schema(mut self, schema: Value) -> Self {
            self.schema = schema;
            self
        }
        fn cwd(mut self, cwd: &str) -> Self {
            self.cwd = Some(PathBuf::from(cwd));
            self
        }
        fn behaviour(mut self, behaviour: Behaviour) -> Self {
            self.behaviour = behaviour;
            self
        }
        fn arc(self) -> Arc<Probe> {
            Arc::new(self)
        }
    }

    #[async_trait]
    impl Tool for Probe {
        fn name(&self) -> &str {
            &self.name
        }
        fn description(&self) -> &str {
            "a probe"
        }
        fn input_schema(&self) -> Value {
            self.schema.clone()
        }
        fn tags(&self) -> &[&str] {
            &self.tags
        }
        async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
            self.execute_with_context(&ToolContext::detached("."), args)
                .await
        }
        async fn execute_with_context(
            &self,
            ctx: &ToolContext,
            args: &Value,
        ) -> Result<ToolResult, ToolError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.behaviour {
                Behaviour::Echo => Ok(ToolResult::ok(format!("{} {args}", self.name))),
                Behaviour::ModelError => Err(ToolError::model("not_found", "no such file: a.txt")),
                Behaviour::Fatal => Err(ToolError::Fatal("disk on fire".into())),
                Behaviour::Hang => std::future::pending().await,
                Behaviour::StopsWhenAsked => {
                    ctx.cancel.cancelled().await;
                    Ok(ToolResult::failure("stopped early; spent 3 tokens"))
                }
                Behaviour::Progress => {
                    ctx.progress("halfway", Some(0.5)).await;
                    ctx.output("chunk").await;
                    Ok(ToolResult::ok("done"))
                }
            }
        }
        fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
            self.cwd.as_ref()?;
            let mut copy = Probe::new(&self.name).tags(&self.tags);
            copy.cwd = Some(workspace.root().to_path_buf());
            Some(Arc::new(copy))
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn registry_with(names: &[&str]) -> ToolRegistry {
        let mut registry = ToolRegistry::default();
        for name in names {
            registry.register(Probe::new(name).arc()).unwrap();
        }
        registry
    }

    fn spec_names(registry: &ToolRegistry) -> Vec<String> {
        registry.specs().iter().map(|s| s.name.clone()).collect()
    }

    fn ctx() -> ToolContext {
        ToolContext::detached(".")
    }

    fn numbered(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i:02}")).collect()
    }

    #[test]
    fn specs_put_base_tools_first_then_sort_by_name() {
        let mut registry = registry_with(&["zeta", "grep", "alpha", "read_file"]);
        registry.pin_base_tool("read_file");
        registry.pin_base_tool("zeta");
        assert_eq!(
            spec_names(&registry),
            ["read_file", "zeta", "alpha", "grep"]
        );
        let spec = &registry.specs()[0];
        assert_eq!(spec.description, "a probe");
        assert_eq!(spec.input_schema, json!({"type": "object"}));
    }

    #[test]
    fn specs_are_cached_until_a_mutation() {
        let mut registry = registry_with(&["a", "b"]);
        let first = registry.specs();
        assert!(
            Arc::ptr_eq(&first, &registry.specs()),
            "no rebuild without change"
        );
        registry.tick();
        registry.prepare("a", &json!({})).unwrap();
        assert!(
            Arc::ptr_eq(&first, &registry.specs()),
            "use and ticks keep the cache"
        );

        registry.register(Probe::new("c").arc()).unwrap();
        let second = registry.specs();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(second.len(), 3);

        registry.unregister("c");
        let third = registry.specs();
        assert!(!Arc::ptr_eq(&second, &third));
        assert_eq!(third.len(), 2);
    }

    #[test]
    fn defer_and_activate_skip_unknown_names_and_spare_base_tools() {
        let mut registry = registry_with(&["web_fetch", "read_file"]);
        registry.pin_base_tool("read_file");
        assert_eq!(
            registry.defer_group("group:web"),
            ["web_fetch"],
            "web_search not registered"
        );
        assert!(registry.defer_group("group:nonexistent").is_empty());
        assert!(
            registry.defer_group("group:fs").is_empty(),
            "base tools are never deferred"
        );
        assert_eq!(spec_names(&registry), ["read_file"]);
        assert!(registry.activate("no_such_tool").is_empty());
        assert!(registry.activate("group:nonexistent").is_empty());
        assert_eq!(
            registry.activate("web"),
            Vec::<String>::new(),
            "bare words are tool names"
        );
        assert_eq!(registry.activate("group:web"), ["web_fetch"]);
        assert_eq!(spec_names(&registry), ["read_file", "web_fetch"]);
    }

    #[tokio::test]
    async fn calling_a_deferred_tool_activates_its_whole_group() {
        let mut registry = registry_with(&["web_fetch", "web_search", "grep"]);
        registry.defer_group("group:web");
        assert_eq!(registry.deferred_names(), ["web_fetch", "web_search"]);
        let before = registry.specs();

        let result = registry
            .execute_with_context(&ctx(), "web_fetch", &json!({"url": "x"}))
            .await
            .unwrap();
        assert!(result.success);
        assert!(registry.deferred_names().is_empty());
        assert_eq!(spec_names(&registry), ["grep", "web_fetch", "web_search"]);
        assert!(!Arc::ptr_eq(&before, &registry.specs()));
    }

    #[tokio::test]
    async fn calling_a_deferred_ungrouped_tool_activates_only_it() {
        let mut registry = registry_with(&["custom_a", "custom_b"]);
        registry
            .deferred
            .extend(["custom_a".to_string(), "custom_b".to_string()]);
        registry.changed();
        registry
            .execute_with_context(&ctx(), "custom_a", &json!({}))
            .await
            .unwrap();
        assert_eq!(registry.deferred_names(), ["custom_b"]);
    }

    #[test]
    fn auto_evict_defers_the_oldest_idle_tool_and_a_call_brings_it_back() {
        let names = numbered("t", 16);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut registry = registry_with(&refs);
        // Use every tool but t00 later, so t00 is the oldest.
        for name in &names[1..] {
            registry.tick();
            registry.prepare(name, &json!({})).unwrap();
        }
        for _ in 0..5 {
            registry.tick();
        }
        assert_eq!(registry.auto_evict(), ["t00"]);
        assert_eq!(registry.deferred_names(), ["t00"]);
        assert_eq!(registry.specs().len(), 15);
        assert!(registry.auto_evict().is_empty(), "back at the limit");

        registry.prepare("t00", &json!({})).unwrap();
        assert_eq!(registry.specs().len(), 16);
        registry.tick();
        let evicted = registry.auto_evict();
        assert_eq!(evicted.len(), 1);
        assert_ne!(
            evicted,
            ["t00"],
            "just-used tool is protected by the idle threshold"
        );
    }

    #[test]
    fn spawn_only_and_pinned_tools_are_never_evicted() {
        let names = numbered("t", 17);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut registry = ToolRegistry::default();
        registry.pin_base_tool("t00"); // pinned before it exists
        for name in &refs {
            registry.register(Probe::new(name).arc()).unwrap();
        }
        registry.mark_spawn_only("t01");
        registry.mark_spawn_only("not_registered");
        assert!(!registry.is_spawn_only("not_registered"));
        for _ in 0..10 {
            registry.tick();
        }
        assert_eq!(registry.auto_evict(), ["t02", "t03"]);
    }

    #[test]
    fn an_all_base_registry_evicts_nothing() {
        let names = numbered("t", 20);
        let mut registry = ToolRegistry::default();
        for name in &names {
            registry.pin_base_tool(name.clone());
            registry.register(Probe::new(name).arc()).unwrap();
        }
        for _ in 0..50 {
            registry.tick();
        }
        assert!(registry.auto_evict().is_empty());
        assert_eq!(registry.specs().len(), 20);
    }

    #[test]
    fn snapshots_share_tools_but_keep_their_own_lru() {
        let names = numbered("t", 16);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut parent = registry_with(&refs);
        parent.pin_base_tool("t15");
        parent.tick();
        parent.prepare("t00", &json!({})).unwrap();

        let mut a = parent.snapshot_excluding(&[]);
        let mut b = parent.snapshot_excluding(&[]);
        assert!(Arc::ptr_eq(
            a.get("t03").unwrap(),
            parent.get("t03").unwrap()
        ));
        assert_eq!(a.lifecycle().iteration(), 0, "counters start fresh");
        assert!(a.lifecycle().is_base("t15"), "base tools carry over");

        // Session A keeps using t00; session B keeps using t01.
        for _ in 0..8 {
            a.tick();
            a.prepare("t00", &json!({})).unwrap();
            b.tick();
            b.prepare("t01", &json!({})).unwrap();
        }
        assert_eq!(a.auto_evict(), ["t01"]);
        assert_eq!(b.auto_evict(), ["t00"]);
        assert!(
            parent.deferred_names().is_empty(),
            "the parent is untouched"
        );
        assert_eq!(parent.lifecycle().iteration(), 1);
    }

    #[test]
    fn snapshot_excludes_names_and_groups_and_copies_state() {
        let mut parent =
            registry_with(&["shell", "spawn_agent", "web_fetch", "grep", "run_pipeline"]);
        parent.defer_group("group:web");
        parent.mark_spawn_only("run_pipeline");
        parent.set_provider_policy(Some(ToolPolicy {
            deny: vec!["grep".into()],
            ..ToolPolicy::default()
        }));
        parent.set_max_args_bytes(10);

        let mut child = parent.snapshot_excluding(&["group:delegated"]);
        assert!(!child.contains("shell") && !child.contains("spawn_agent"));
        assert_eq!(child.deferred_names(), ["web_fetch"]);
        assert!(child.is_spawn_only("run_pipeline"));
        assert!(matches!(
            child.prepare("grep", &json!({})),
            Err(DispatchError::PolicyDenied {
                reason: HiddenReason::ProviderPolicy,
                ..
            })
        ));
        assert!(matches!(
            child.prepare("run_pipeline", &json!({"big": "0123456789"})),
            Err(DispatchError::ArgsTooLarge { limit: 10, .. })
        ));
        assert_eq!(
            child.catalog().get("shell").map(|e| e.name().to_string()),
            None
        );

        let child = parent.snapshot_excluding(&["web_*", "grep"]);
        assert!(!child.contains("web_fetch") && !child.contains("grep"));
        assert!(child.deferred_names().is_empty());
    }

    #[test]
    fn rebind_cwd_rebuilds_only_cwd_bound_tools() {
        let mut registry = ToolRegistry::default();
        registry
            .register(Probe::new("read_file").cwd("/old").arc())
            .unwrap();
        registry.register(Probe::new("web_fetch").arc()).unwrap();
        let mut child = registry.snapshot_excluding(&[]);
        child.rebind_cwd(Path::new("/new"));

        let rebound = child.get("read_file").unwrap();
        assert!(!Arc::ptr_eq(rebound, registry.get("read_file").unwrap()));
        let probe = rebound.as_any().downcast_ref::<Probe>().unwrap();
        assert_eq!(probe.cwd.as_deref(), Some(Path::new("/new")));
        assert!(Arc::ptr_eq(
            child.get("web_fetch").unwrap(),
            registry.get("web_fetch").unwrap()
        ));
        let original = registry
            .get("read_file")
            .unwrap()
            .as_any()
            .downcast_ref::<Probe>()
            .unwrap();
        assert_eq!(
            original.cwd.as_deref(),
            Some(Path::new("/old")),
            "parent untouched"
        );
    }

    #[tokio::test]
    async fn hard_policy_removes_tools_for_good_and_answers_policy_denied() {
        let mut registry = registry_with(&["shell", "web_fetch", "web_search", "grep"]);
        registry.defer_group("group:web");
        registry.mark_spawn_only("web_search");
        let removed = registry.apply_policy(ToolPolicy {
            allow: vec!["grep".into(), "web_*".into()],
            deny: vec!["web_search".into()],
            ..ToolPolicy::default()
        });
        assert_eq!(removed, ["shell", "web_search"]);
        assert!(registry.get("shell").is_none());
        assert!(!registry.is_spawn_only("web_search"));
        assert_eq!(registry.deferred_names(), ["web_fetch"]);

        let err = registry
            .execute_with_context(&ctx(), "shell", &json!({}))
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            DispatchError::PolicyDenied {
                reason: HiddenReason::PolicyDeny,
                ..
            }
        ));
        assert_eq!(err.kind(), "policy_denied");
        let err = registry
            .execute_with_context(&ctx(), "shel", &json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "unknown_tool");

        let catalog = registry.catalog();
        let hidden: Vec<(&str, HiddenReason)> = catalog
            .hidden()
            .map(|(entry, reason)| (entry.name(), reason))
            .collect();
        assert_eq!(
            hidden,
            [
                ("shell", HiddenReason::PolicyDeny),
                ("web_search", HiddenReason::PolicyDeny)
            ]
        );

        // A later registration of a refused tool stays refused.
        registry.register(Probe::new("shell").arc()).unwrap();
        assert!(!registry.contains("shell"));
    }

    #[tokio::test]
    async fn provider_policy_hides_and_refuses_but_keeps_the_tool() {
        let web = Probe::new("web_fetch").tags(&["web"]).arc();
        let mut registry = ToolRegistry::default();
        registry.register(web.clone()).unwrap();
        registry
            .register(Probe::new("grep").tags(&["search", "code"]).arc())
            .unwrap();
        registry
            .register(Probe::new("shell").tags(&["runtime"]).arc())
            .unwrap();
        registry.register(Probe::new("plain").arc()).unwrap();
        registry.set_provider_policy(Some(ToolPolicy {
            deny: vec!["shell".into()],
            require_tags: vec!["code".into()],
            ..ToolPolicy::default()
        }));

        assert_eq!(spec_names(&registry), ["grep", "plain"]);
        assert!(registry.contains("web_fetch") && registry.contains("shell"));
        let catalog = registry.catalog();
        assert_eq!(
            catalog.get("shell").unwrap().state,
            ToolState::Hidden(HiddenReason::ProviderPolicy)
        );
        assert_eq!(
            catalog.get("web_fetch").unwrap().state,
            ToolState::Hidden(HiddenReason::RequireTags)
        );
        let err = registry
            .execute_with_context(&ctx(), "web_fetch", &json!({}))
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            DispatchError::PolicyDenied {
                reason: HiddenReason::RequireTags,
                ..
            }
        ));
        assert_eq!(
            web.calls.load(Ordering::SeqCst),
            0,
            "refused before running"
        );

        registry.set_provider_policy(None);
        assert_eq!(
            spec_names(&registry),
            ["grep", "plain", "shell", "web_fetch"]
        );
        registry
            .execute_with_context(&ctx(), "web_fetch", &json!({}))
            .await
            .unwrap();
        assert_eq!(web.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn context_filter_trims_specs_and_keeps_untagged_tools() {
        let mut registry = ToolRegistry::default();
        registry
            .register(Probe::new("grep").tags(&["search"]).arc())
            .unwrap();
        registry
            .register(Probe::new("web_fetch").tags(&["web"]).arc())
            .unwrap();
        registry.register(Probe::new("tool_search").arc()).unwrap();
        registry.set_context_filter(vec!["search".into()]);
        assert_eq!(spec_names(&registry), ["grep", "tool_search"]);
        assert_eq!(
            registry.catalog().get("web_fetch").unwrap().state,
            ToolState::Hidden(HiddenReason::ContextFilter)
        );
        registry.set_context_filter(Vec::new());
        assert_eq!(registry.specs().len(), 3);
    }

    #[tokio::test]
    async fn checks_run_in_the_documented_order() {
        let mut registry = registry_with(&["web_fetch", "web_search", "x_tool"]);
        registry.set_max_args_bytes(16);
        registry.set_provider_policy(Some(ToolPolicy {
            deny: vec!["x*".into()],
            ..ToolPolicy::default()
        }));
        let big = json!({"data": "0123456789abcdef"});

        // Provider policy comes before the size check.
        let err = registry.prepare("x_tool", &big).unwrap_err();
        assert_eq!(err.kind(), "policy_denied");
        // A name no tool has is unknown, even when a policy pattern would match it.
        assert_eq!(
            registry.prepare("xyz", &json!({})).unwrap_err().kind(),
            "unknown_tool"
        );
        // Size comes before the unknown-tool check.
        assert_eq!(
            registry.prepare("nope", &big).unwrap_err().kind(),
            "args_too_large"
        );
        // A deferred tool is activated even when its arguments are then refused.
        registry.defer_group("group:web");
        assert_eq!(
            registry.prepare("web_fetch", &big).unwrap_err().kind(),
            "args_too_large"
        );
        assert!(registry.deferred_names().is_empty());
    }

    #[tokio::test]
    async fn oversized_arguments_are_refused_with_their_exact_size() {
        let probe = Probe::new("write_file").arc();
        let mut registry = ToolRegistry::default();
        registry.register(probe.clone()).unwrap();
        let args = json!({"content": "x".repeat(2 * 1024 * 1024)});
        let err = registry
            .execute_with_context(&ctx(), "write_file", &args)
            .await
            .unwrap_err();
        match &err {
            DispatchError::ArgsTooLarge { size, limit, .. } => {
                assert_eq!(*size, serde_json::to_vec(&args).unwrap().len());
                assert_eq!(*limit, 1_048_576);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
        let result = err.to_tool_result();
        assert!(!result.success);
        assert_eq!(
            result.structured_metadata,
            Some(json!({"error": {"kind": "args_too_large"}}))
        );
    }

    #[tokio::test]
    async fn schema_violations_name_the_failing_path() {
        let schema = json!({
            "type": "object",
            "properties": {"edits": {"type": "array", "items": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            }}},
            "required": ["edits"]
        });
        let probe = Probe::new("multi_edit").schema(schema).arc();
        let mut registry = ToolRegistry::default();
        registry.register(probe.clone()).unwrap();
        let err = registry
            .execute_with_context(
                &ctx(),
                "multi_edit",
                &json!({"edits": [{"path": "a"}, {"path": 5}]}),
            )
            .await
            .unwrap_err();
        match &err {
            DispatchError::InvalidArguments { error, .. } => {
                assert_eq!(error.path, "/edits/1/path")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("/edits/1/path"), "{err}");
        assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
        registry
            .execute_with_context(&ctx(), "multi_edit", &json!({"edits": [{"path": "a"}]}))
            .await
            .unwrap();
        assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_invalid_schema_is_refused_at_registration() {
        let mut registry = ToolRegistry::default();
        let err = registry
            .register(Probe::new("broken").schema(json!({"type": 12})).arc())
            .unwrap_err();
        assert!(err.to_string().contains("broken"), "{err}");
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn model_errors_become_results_and_fatal_errors_do_not() {
        let mut registry = ToolRegistry::default();
        registry
            .register(
                Probe::new("read_file")
                    .behaviour(Behaviour::ModelError)
                    .arc(),
            )
            .unwrap();
        registry
            .register(Probe::new("broken").behaviour(Behaviour::Fatal).arc())
            .unwrap();
        let result = registry
            .execute_with_context(&ctx(), "read_file", &json!({}))
            .await
            .unwrap();
        assert!(!result.success);
        assert_eq!(result.output, "no such file: a.txt");
        assert_eq!(
            result.structured_metadata,
            Some(json!({"error": {"kind": "not_found"}}))
        );
        let err = registry
            .execute_with_context(&ctx(), "broken", &json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "fatal");
        assert!(!err.is_refusal());
    }

    #[tokio::test]
    async fn cancellation_stops_a_tool_that_ignores_it() {
        let mut registry = ToolRegistry::default();
        registry
            .register(Probe::new("hang").behaviour(Behaviour::Hang).arc())
            .unwrap();
        let ctx = ctx();
        let call = registry.prepare("hang", &json!({})).unwrap();
        let cancel = ctx.cancel.clone();
        let args = json!({});
        let (outcome, ()) = tokio::join!(call.run(&ctx, &args), async move { cancel.cancel() });
        assert!(matches!(outcome, Err(DispatchError::Cancelled { .. })));
    }

    #[tokio::test]
    async fn a_tool_that_honours_cancellation_answers_for_itself() {
        let mut registry = ToolRegistry::default();
        registry
            .register(
                Probe::new("polite")
                    .behaviour(Behaviour::StopsWhenAsked)
                    .arc(),
            )
            .unwrap();
        let ctx = ctx();
        let call = registry.prepare("polite", &json!({})).unwrap();
        let cancel = ctx.cancel.clone();
        let args = json!({});
        let (outcome, ()) = tokio::join!(call.run(&ctx, &args), async move { cancel.cancel() });
        let result = outcome.unwrap();
        assert!(!result.success);
        assert_eq!(result.output, "stopped early; spent 3 tokens");
    }

    #[tokio::test]
    async fn tools_report_progress_and_output_through_the_context() {
        let mut registry = ToolRegistry::default();
        registry
            .register(Probe::new("slow").behaviour(Behaviour::Progress).arc())
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let ctx = ToolContext {
            session_id: "s1".into(),
            tool_call_id: "call-7".into(),
            events: Some(tx),
            ..ToolContext::detached(".")
        };
        let result = registry
            .execute_with_context(&ctx, "slow", &json!({}))
            .await
            .unwrap();
        assert_eq!(result.output, "done");
        assert!(matches!(
            rx.recv().await,
            Some(ToolEvent::Progress { tool_call_id, message, fraction: Some(f) })
                if tool_call_id == "call-7" && message == "halfway" && f == 0.5
        ));
        assert!(matches!(
            rx.recv().await,
            Some(ToolEvent::Output { tool_call_id, text })
                if tool_call_id == "call-7" && text == "chunk"
        ));
    }

    #[test]
    fn prepared_calls_report_spawn_only_and_count_as_use() {
        let mut registry = registry_with(&["run_pipeline"]);
        registry.mark_spawn_only("run_pipeline");
        for _ in 0..3 {
            registry.tick();
        }
        let call = registry.prepare("run_pipeline", &json!({})).unwrap();
        assert!(call.spawn_only());
        assert_eq!(registry.lifecycle().last_used.get("run_pipeline"), Some(&3));
        registry.clear_spawn_only();
        assert!(
            !registry
                .prepare("run_pipeline", &json!({}))
                .unwrap()
                .spawn_only()
        );
    }

    #[test]
    fn the_catalog_cell_follows_every_mutation() {
        let mut registry = registry_with(&["web_fetch", "grep"]);
        let cell = registry.catalog_cell();
        assert_eq!(
            cell.load().names_in(ToolState::Active),
            ["grep", "web_fetch"]
        );
        registry.defer_group("group:web");
        assert_eq!(cell.load().names_in(ToolState::Deferred), ["web_fetch"]);
        registry.register(Probe::new("glob").arc()).unwrap();
        assert_eq!(cell.load().names_in(ToolState::Active), ["glob", "grep"]);
        let snapshot_cell = registry.snapshot_excluding(&[]).catalog_cell();
        registry.activate("group:web");
        assert_eq!(
            cell.load().names_in(ToolState::Deferred),
            Vec::<&str>::new()
        );
        assert_eq!(
            snapshot_cell.load().names_in(ToolState::Deferred),
            ["web_fetch"],
            "a snapshot has its own catalog"
        );
        let entry = serde_json::to_value(cell.load().get("grep").unwrap()).unwrap();
        assert_eq!(
            entry,
            json!({"name": "grep", "description": "a probe", "tags": [], "group": "search",
                   "concurrency": "safe", "spawn_only": false, "state": "active"})
        );
    }

    #[test]
    fn groups_defer_only_when_crowded() {
        let mut names = numbered("t", 14);
        names.push("web_fetch".into());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut registry = registry_with(&refs);
        let groups = vec!["group:web".to_string()];
        assert!(
            registry.defer_groups_if_crowded(&groups).is_empty(),
            "15 fit"
        );
        registry.register(Probe::new("web_search").arc()).unwrap();
        assert_eq!(
            registry.defer_groups_if_crowded(&groups),
            ["web_fetch", "web_search"]
        );
    }

    #[test]
    fn concurrency_class_defaults_to_safe() {
        assert_eq!(Probe::new("x").concurrency_class(), ConcurrencyClass::Safe);
    }

    #[test]
    fn activation_requests_from_tools_apply_before_the_next_iteration() {
        let mut registry = registry_with(&["web_fetch", "web_search", "custom"]);
        registry.defer_group("group:web");
        registry.deferred.insert("custom".into());
        registry.changed();
        let cell = registry.catalog_cell();
        cell.request_activation(["group:web".to_string(), "nope".to_string()]);
        assert_eq!(registry.specs().len(), 0, "nothing applied yet");
        registry.tick();
        assert_eq!(spec_names(&registry), ["web_fetch", "web_search"]);
        cell.request_activation(["custom".to_string()]);
        registry.prepare("web_fetch", &json!({})).unwrap();
        assert_eq!(registry.deferred_names(), Vec::<&str>::new());
    }

    #[test]
    fn the_deferral_tool_follows_the_deferred_set() {
        let mut registry = registry_with(&["web_fetch", "web_search", "grep"]);
        let factory: DeferralToolFactory = Arc::new(|deferred: &[&str]| {
            let mut probe = Probe::new("activate_tools");
            probe.name = format!("activate_tools[{}]", deferred.join(","));
            // The registry keys by the configured name; the probe's own name carries the list.
            Arc::new(Listing(probe)) as Arc<dyn Tool>
        });
        registry.set_deferral_tool("activate_tools", factory);
        assert!(!registry.contains("activate_tools"), "nothing deferred yet");
        registry.defer_group("group:web");
        let listed = registry
            .get("activate_tools")
            .unwrap()
            .description()
            .to_string();
        assert_eq!(listed, "activate_tools[web_fetch,web_search]");
        let mut child = registry.snapshot_excluding(&[]);
        child.activate("web_fetch");
        assert_eq!(
            child.get("activate_tools").unwrap().description(),
            "activate_tools[web_search]"
        );
        child.activate("web_search");
        assert!(!child.contains("activate_tools"));
        assert!(
            registry.contains("activate_tools"),
            "the parent keeps its own"
        );
    }

    /// Wraps a probe so its description is its (generated) name.
    struct Listing(Probe);

    #[async_trait]
    impl Tool for Listing {
        fn name(&self) -> &str {
            "activate_tools"
        }
        fn description(&self) -> &str {
            &self.0.name
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object"})
        }
        async fn execute(&self, args: &Value) -> Result<ToolResult, ToolError> {
            self.0.execute(args).await
        }
    }
}
