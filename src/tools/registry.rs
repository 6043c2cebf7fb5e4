//! The per-session tool registry core: the registered tools and groups, what the model sees
//! (`specs()`), policies, snapshots and the catalog. The call path is in
//! [`dispatch`](super::dispatch), group deferral and activation in [`deferral`](super::deferral).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::args::{ArgsValidator, CompiledSchemas, DEFAULT_MAX_ARGS_BYTES};
use super::catalog::{CatalogCell, CatalogEntry, ToolCatalog, ToolState};
use super::deferral::DeferralTool;
use super::lifecycle::ToolLifecycle;
use super::policy::{self, HiddenReason, ToolPolicy, Verdict};
use super::workspace::Workspace;
use super::{Tool, ToolSpec};
use table::ToolTable;

pub use super::deferral::DeferralToolFactory;
pub use super::dispatch::{CANCEL_GRACE, DispatchError, PreparedCall};

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

/// One registered tool with what the registry derived from it once.
#[derive(Clone)]
pub(super) struct Entry {
    /// The tool itself.
    pub(super) tool: Arc<dyn Tool>,
    /// Its compiled argument schema.
    pub(super) validator: Arc<ArgsValidator>,
}

impl Entry {
    /// The tool's primary group, which a call to it brings back with it.
    pub(super) fn group(&self) -> Option<&'static str> {
        self.tool.meta().primary_group()
    }
}

/// The tools one session can use, with its own deferral, policy and LRU state.
///
/// Mutations take `&mut self`: a registry has one owner (the session actor), and calls are
/// prepared under that ownership and then run without it. The fields are open to the sibling
/// `dispatch` and `deferral` modules, which add the call path and deferral to this type.
pub struct ToolRegistry {
    /// Keyed by shared names so a session snapshot copies no text.
    pub(super) tools: ToolTable,
    /// Tools the hard policy removed; kept only to describe them and to answer
    /// `policy_denied` instead of `unknown_tool`.
    /// Shared by every snapshot until one changes it.
    pub(super) removed: RemovedTools,
    /// Shared, like the two sets below, by every session's snapshot until one changes it.
    pub(super) deferred: SharedNames,
    pub(super) spawn_only: SharedNames,
    /// Names marked spawn_only that are not registered (yet): a session's own MCP server
    /// registers its tools later, and a server's tool that went away may come back.
    pub(super) spawn_only_pending: SharedNames,
    /// Shared, as the policies below are, by every snapshot: set once, read on every check.
    pub(super) hard_policy: Option<Arc<ToolPolicy>>,
    /// Policies that narrow this registry further (an agent profile's): a tool must pass
    /// each, and tools registered later are held to them too.
    pub(super) narrowed: Vec<Arc<ToolPolicy>>,
    pub(super) provider_policy: Option<Arc<ToolPolicy>>,
    pub(super) context_filter: Vec<String>,
    pub(super) lifecycle: ToolLifecycle,
    pub(super) max_args_bytes: usize,
    pub(super) specs: OnceLock<Arc<[ToolSpec]>>,
    pub(super) catalog: CatalogCell,
    pub(super) workspace: Option<Arc<Workspace>>,
    pub(super) deferral_tool: Option<DeferralTool>,
    /// When each tool became visible, as a sequence number: `specs()` lists tools in this
    /// order, so a tool that comes back is appended and an eviction never reorders the rest,
    /// which keeps the provider's prompt cache valid for the longest prefix.
    /// Shared by every session's snapshot until one shows a tool of its own.
    pub(super) shown_at: Arc<HashMap<String, u64>>,
    /// The next sequence number of `shown_at`.
    pub(super) next_shown: u64,
    /// The tools the last model request was offered (see `next_request`).
    pub(super) last_offered: Option<Arc<[ToolSpec]>>,
    /// The validators compiled for this registry and every snapshot of it.
    pub(super) validators: Arc<CompiledSchemas>,
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
            tools: ToolTable::default(),
            removed: RemovedTools::default(),
            deferred: SharedNames::default(),
            spawn_only: SharedNames::default(),
            spawn_only_pending: SharedNames::default(),
            hard_policy: None,
            narrowed: Vec::new(),
            provider_policy: None,
            context_filter: Vec::new(),
            lifecycle,
            max_args_bytes: DEFAULT_MAX_ARGS_BYTES,
            specs: OnceLock::new(),
            catalog: CatalogCell::default(),
            workspace: None,
            deferral_tool: None,
            shown_at: Arc::default(),
            next_shown: 0,
            last_offered: None,
            validators: Arc::default(),
        }
    }

    /// Records that `name` became visible now: it goes to the end of `specs()`.
    pub(super) fn show_last(&mut self, name: &str) {
        Arc::make_mut(&mut self.shown_at).insert(name.to_string(), self.next_shown);
        self.next_shown += 1;
    }

    /// The workspace the cwd-bound tools work in, once one is bound.
    pub fn workspace(&self) -> Option<&Arc<Workspace>> {
        self.workspace.as_ref()
    }

    /// Records the workspace the registered tools were built for.
    pub fn set_workspace(&mut self, workspace: Arc<Workspace>) {
        self.workspace = Some(workspace);
    }

    /// Adds a tool, replacing one of the same name. A tool the hard policy refuses is recorded
    /// as removed instead, so it stays forbidden rather than unknown.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.name().to_string();
        let validator = self
            .validators
            .compile(tool.input_schema())
            .map_err(|err| RegistryError::InvalidSchema {
                tool: name.clone(),
                message: err.message,
            })?;
        let entry = Entry { validator, tool };

        let refused = self.hard_refuses(&name, &entry.tool.meta().groups, entry.tool.tags());
        if refused {
            self.tools.remove(name.as_str());
            self.deferred.remove(&name);
            self.spawn_only.remove(&name);
            self.removed.insert(name, entry);
        } else {
            self.removed.remove(&name);
            self.lifecycle.touch(&name);
            if !self.shown_at.contains_key(&name) {
                self.show_last(&name);
            }
            if self.spawn_only_pending.remove(&name) {
                self.spawn_only.insert(&name);
            }
            self.tools.insert(name.into(), entry);
        }
        self.changed();
        Ok(())
    }

    /// Removes a tool; returns it when it was there.
    pub fn unregister(&mut self, name: &str) -> Option<Arc<dyn Tool>> {
        let entry = self.tools.remove(name)?;
        self.deferred.remove(name);
        if self.shown_at.contains_key(name) {
            Arc::make_mut(&mut self.shown_at).remove(name);
        }
        if self.spawn_only.remove(name) {
            self.spawn_only_pending.insert(name);
        }
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

    /// Sets the LRU limits (from the config's `[tools]`), keeping usage; `base_tools`, when
    /// given, replaces the tools pinned by their marks.
    pub fn configure_lifecycle(
        &mut self,
        max_active: usize,
        idle_threshold: u32,
        base_tools: Option<impl IntoIterator<Item = String>>,
    ) {
        self.lifecycle.max_active = max_active;
        self.lifecycle.idle_threshold = idle_threshold;
        if let Some(base_tools) = base_tools {
            self.lifecycle.base_tools = Arc::new(base_tools.into_iter().collect());
        }
        for name in self.lifecycle.base_tools.iter() {
            self.deferred.remove(name);
        }
        self.changed();
    }

    /// Pins every registered tool its meta marks a base tool, and the deferral tool when its
    /// meta does: the default base set, which `[tools] base_tools` may replace.
    pub fn pin_marked_base_tools(&mut self) {
        let mut marked: Vec<String> = self
            .tools
            .iter()
            .filter(|(_, entry)| entry.tool.meta().base)
            .map(|(name, _)| name.to_string())
            .collect();
        if let Some(deferral) = &self.deferral_tool
            && deferral.meta().base
        {
            marked.push(deferral.name.clone());
        }
        for name in marked {
            self.pin_base_tool(name);
        }
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

    /// Marks a tool as run in the background; a name not registered yet takes the mark when
    /// it is.
    pub fn mark_spawn_only(&mut self, name: &str) {
        if !self.tools.contains_key(name) {
            self.spawn_only_pending.insert(name);
        } else if self.spawn_only.insert(name) {
            self.changed();
        }
    }

    /// Whether calls to `name` run in the background.
    pub fn is_spawn_only(&self, name: &str) -> bool {
        self.spawn_only.contains(name)
    }

    /// Runs every tool in the foreground; a sub-agent is already background work.
    pub fn clear_spawn_only(&mut self) {
        self.spawn_only_pending.clear();
        if !self.spawn_only.is_empty() {
            self.spawn_only.clear();
            self.changed();
        }
    }

    /// Advances the LRU to the next model iteration; call before every model request. Applies
    /// activations tools asked for since the last iteration.
    pub fn tick(&mut self) {
        self.apply_activation_requests();
        self.lifecycle.tick();
    }

    /// Applies the system-wide policy: refused tools are removed for good (with their deferred
    /// and spawn_only marks) and remembered as hidden with reason `policy_deny`. Returns the
    /// names removed.
    pub fn apply_policy(&mut self, policy: ToolPolicy) -> Vec<String> {
        let refused = self.remove_refused(&policy);
        self.hard_policy = Some(Arc::new(policy));
        self.changed();
        refused
    }

    /// Moves the tools `policy` refuses to `removed`; answers their names.
    fn remove_refused(&mut self, policy: &ToolPolicy) -> Vec<String> {
        let refused: Vec<String> = self
            .tools
            .iter()
            .filter(|(name, entry)| {
                policy.verdict(name, &entry.tool.meta().groups, entry.tool.tags())
                    != Verdict::Allowed
            })
            .map(|(name, _)| name.to_string())
            .collect();
        for name in &refused {
            if let Some(entry) = self.tools.remove(name.as_str()) {
                self.removed.insert(name.clone(), entry);
            }
            self.deferred.remove(name);
            self.spawn_only.remove(name);
        }
        refused
    }

    /// Narrows the registry by one more policy (an agent profile's) on top of the hard one:
    /// tools it refuses are removed as by [`ToolRegistry::apply_policy`], and tools registered
    /// later must pass it too. Answers the names removed.
    pub fn narrow(&mut self, policy: ToolPolicy) -> Vec<String> {
        let refused = self.remove_refused(&policy);
        self.narrowed.push(Arc::new(policy));
        self.changed();
        refused
    }

    /// Whether the hard policy or a narrowing one refuses the tool `name` in `groups`.
    pub(super) fn hard_refuses(&self, name: &str, groups: &[&str], tags: &[&str]) -> bool {
        self.hard_policy
            .iter()
            .chain(&self.narrowed)
            .any(|p| p.verdict(name, groups, tags) != Verdict::Allowed)
    }

    /// The system-wide policy applied to this registry, if any.
    pub fn hard_policy(&self) -> Option<&ToolPolicy> {
        self.hard_policy.as_deref()
    }

    /// Sets (or clears) the soft policy for the configured model: refused tools stay
    /// registered but leave `specs()` and are refused when called.
    pub fn set_provider_policy(&mut self, policy: Option<ToolPolicy>) {
        self.provider_policy = policy.filter(|p| !p.is_empty()).map(Arc::new);
        self.changed();
    }

    /// Trims `specs()` to tools sharing one of `tags` (untagged tools always stay); empty
    /// clears the filter.
    pub fn set_context_filter(&mut self, tags: Vec<String>) {
        self.context_filter = tags;
        self.changed();
    }

    /// Why the provider policy refuses the tool `name` in `groups` with `tags`, if it does.
    pub(super) fn provider_refusal(
        &self,
        name: &str,
        groups: &[&str],
        tags: &[&str],
    ) -> Option<HiddenReason> {
        match self.provider_policy.as_ref()?.verdict(name, groups, tags) {
            Verdict::Allowed => None,
            Verdict::DeniedByName => Some(HiddenReason::ProviderPolicy),
            Verdict::DeniedByTags => Some(HiddenReason::RequireTags),
        }
    }

    /// Where a registered tool stands.
    fn state_of(&self, name: &str, tool: &dyn Tool) -> ToolState {
        if let Some(reason) = self.provider_refusal(name, &tool.meta().groups, tool.tags()) {
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

    /// What the model is shown: active tools in the order they became visible (registration
    /// order, a tool brought back from the deferred set last). Cached until the next mutation,
    /// so every request of a quiet session sends the same bytes, and a change appends or
    /// removes tools without moving the others.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(self.specs.get_or_init(|| {
            let mut visible: Vec<(u64, &str, &dyn Tool)> = self
                .tools
                .iter()
                .filter(|(name, entry)| {
                    self.state_of(name, entry.tool.as_ref()) == ToolState::Active
                })
                .map(|(name, entry)| {
                    // Only the deferral tool has no place: its description follows the
                    // deferred set, so it goes last, where its changes disturb nothing else.
                    let shown = self.shown_at.get(&**name).copied().unwrap_or(u64::MAX);
                    (shown, &**name, entry.tool.as_ref())
                })
                .collect();
            // Stable: ties (none in practice) stay in name order.
            visible.sort_by_key(|(shown, _, _)| *shown);
            visible
                .into_iter()
                .map(|(_, name, tool)| ToolSpec {
                    name: name.to_string(),
                    description: tool.description().to_string(),
                    input_schema: Arc::clone(&tool.meta().input_schema),
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

    /// The groups of every tool registered here, by name, for checks that know a call's tool
    /// only by its name.
    pub fn tool_groups(&self) -> policy::ToolGroups {
        policy::ToolGroups::of_metas(
            self.tools
                .iter()
                .map(|(_, entry)| entry.tool.meta())
                .chain(self.removed.values().map(|entry| entry.tool.meta())),
        )
    }

    /// A child registry sharing the tool objects but with its own LRU counters, spec cache and
    /// catalog. Names in `excluded` (exact, `group:NAME` or `prefix*`) are left out. Policy,
    /// context filter, deferred set and spawn_only marks are copied; base tools and limits kept.
    pub fn snapshot_excluding(&self, excluded: &[&str]) -> ToolRegistry {
        let keep = |name: &str| {
            let groups = self
                .tools
                .get(name)
                .map_or(&[][..], |entry| &entry.tool.meta().groups[..]);
            !excluded
                .iter()
                .any(|entry| policy::entry_matches(entry, name, groups))
        };
        let child = ToolRegistry {
            tools: self
                .tools
                .iter()
                .filter(|(name, _)| keep(name))
                .map(|(name, entry)| (Arc::clone(name), entry.clone()))
                .collect(),
            removed: self.removed.clone(),
            deferred: self.deferred.kept(keep),
            spawn_only: self.spawn_only.kept(keep),
            spawn_only_pending: self.spawn_only_pending.kept(keep),
            hard_policy: self.hard_policy.clone(),
            narrowed: self.narrowed.clone(),
            provider_policy: self.provider_policy.clone(),
            context_filter: self.context_filter.clone(),
            lifecycle: self.lifecycle.fresh(),
            max_args_bytes: self.max_args_bytes,
            specs: OnceLock::new(),
            catalog: CatalogCell::default(),
            workspace: self.workspace.clone(),
            deferral_tool: self.deferral_tool.clone(),
            shown_at: Arc::clone(&self.shown_at),
            next_shown: self.next_shown,
            last_offered: None,
            validators: Arc::clone(&self.validators),
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

    /// Drops derived state after a mutation: the spec cache and the catalog.
    pub(super) fn changed(&mut self) {
        self.sync_deferral_tool();
        self.specs = OnceLock::new();
        self.refresh_catalog();
    }

    /// Publishes the catalog of every tool, removed ones included, through the shared cell.
    fn refresh_catalog(&self) {
        let mut entries: Vec<CatalogEntry> = self
            .tools
            .iter()
            .map(|(name, entry)| CatalogEntry {
                tool: Arc::clone(&entry.tool),
                spawn_only: self.spawn_only.contains(&**name),
                state: self.state_of(name, entry.tool.as_ref()),
            })
            .chain(self.removed.values().map(|entry| CatalogEntry {
                tool: Arc::clone(&entry.tool),
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

/// A set of tool names shared by a registry's snapshots until one of them changes it: a
/// change that changes nothing (removing an absent name) copies nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct SharedNames(Arc<BTreeSet<String>>);

impl SharedNames {
    /// Adds `name`; whether it was absent.
    pub(super) fn insert(&mut self, name: &str) -> bool {
        !self.0.contains(name) && Arc::make_mut(&mut self.0).insert(name.to_string())
    }

    /// Removes `name`; whether it was there.
    pub(super) fn remove(&mut self, name: &str) -> bool {
        self.0.contains(name) && Arc::make_mut(&mut self.0).remove(name)
    }

    /// Adds every name of `names`.
    pub(super) fn extend(&mut self, names: impl IntoIterator<Item = impl AsRef<str>>) {
        for name in names {
            self.insert(name.as_ref());
        }
    }

    /// Empties the set.
    pub(super) fn clear(&mut self) {
        if !self.0.is_empty() {
            self.0 = Arc::default();
        }
    }

    /// The names `keep` keeps: this set itself, shared, when it keeps them all.
    fn kept(&self, keep: impl Fn(&str) -> bool) -> Self {
        if self.0.iter().all(|name| keep(name)) {
            self.clone()
        } else {
            Self(Arc::new(
                self.0.iter().filter(|name| keep(name)).cloned().collect(),
            ))
        }
    }

    /// Whether `other` is this very set, not a copy.
    #[cfg(test)]
    pub(super) fn shares(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for SharedNames {
    type Target = BTreeSet<String>;

    fn deref(&self) -> &BTreeSet<String> {
        &self.0
    }
}

/// The tools a hard policy removed, by name, shared by a registry's snapshots as
/// [`SharedNames`] is: only a real change copies the map.
#[derive(Clone, Default)]
pub(super) struct RemovedTools(Arc<BTreeMap<String, Entry>>);

impl RemovedTools {
    /// Records `entry` as removed, replacing an earlier one of that name.
    fn insert(&mut self, name: String, entry: Entry) {
        Arc::make_mut(&mut self.0).insert(name, entry);
    }

    /// Forgets the removed tool `name`, if there is one.
    fn remove(&mut self, name: &str) {
        if self.0.contains_key(name) {
            Arc::make_mut(&mut self.0).remove(name);
        }
    }

    /// Whether `other` is this very map, not a copy.
    #[cfg(test)]
    pub(super) fn shares(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for RemovedTools {
    type Target = BTreeMap<String, Entry>;

    fn deref(&self) -> &BTreeMap<String, Entry> {
        &self.0
    }
}

mod table;
#[cfg(test)]
mod tests;
