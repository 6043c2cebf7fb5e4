//! Deferral: tools held back from the model's view (by group, by the LRU), the tool that
//! announces them, and bringing them back on request, on activation or when called.

use std::sync::Arc;

use super::registry::{Entry, ToolRegistry};
use super::{Tool, ToolMeta};

/// Builds the tool whose presence and description follow the deferred set (`activate_tools`):
/// given the deferred names, it returns the tool to show while any exist.
pub type DeferralToolFactory = Arc<dyn Fn(&[&str]) -> Arc<dyn Tool> + Send + Sync>;

/// The installed deferral tool: its name, how to build it, and what it last listed.
#[derive(Clone)]
pub(super) struct DeferralTool {
    /// The tool's name.
    pub(super) name: String,
    /// Builds it for a deferred set.
    factory: DeferralToolFactory,
    /// The deferred names the registered instance was built for.
    listed: Vec<String>,
}

impl DeferralTool {
    /// What the tool is, read from an instance listing nothing.
    pub(super) fn meta(&self) -> ToolMeta {
        (self.factory)(&[]).meta().clone()
    }
}

impl ToolRegistry {
    /// Installs the tool shown only while something is deferred (see [`DeferralToolFactory`]).
    pub fn set_deferral_tool(&mut self, name: impl Into<String>, factory: DeferralToolFactory) {
        self.deferral_tool = Some(DeferralTool {
            name: name.into(),
            factory,
            listed: Vec::new(),
        });
        self.changed();
    }

    /// Holds back every registered, non-base member of `group` (`group:web` or `web`); returns
    /// the names newly deferred. Unknown groups and unregistered members are skipped.
    pub fn defer_group(&mut self, group: &str) -> Vec<String> {
        let members = self.members_of(group);
        let mut deferred = Vec::new();
        for name in members {
            if !self.lifecycle.is_base(&name) && self.deferred.insert(&name) {
                deferred.push(name);
            }
        }
        if !deferred.is_empty() {
            self.changed();
        }
        deferred
    }

    /// Defers one registered tool (never a base tool); whether it was newly deferred.
    pub fn defer_tool(&mut self, name: &str) -> bool {
        let deferrable = self.tools.contains_key(name) && !self.lifecycle.is_base(name);
        if !deferrable || !self.deferred.insert(name) {
            return false;
        }
        self.changed();
        true
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
        self.activate_as(group_or_name, true)
    }

    /// [`ToolRegistry::activate`]; `asked` says the tools were wanted (touched, so the LRU
    /// spares them for a while) rather than brought along with a sibling the model called.
    fn activate_as(&mut self, group_or_name: &str, asked: bool) -> Vec<String> {
        let candidates = if group_or_name.starts_with("group:") {
            self.members_of(group_or_name)
        } else {
            vec![group_or_name.to_string()]
        };
        let mut activated = Vec::new();
        for name in candidates {
            if self.deferred.remove(&name) {
                if asked {
                    self.lifecycle.touch(&name);
                }
                self.show_last(&name);
                activated.push(name);
            }
        }
        if !activated.is_empty() {
            self.changed();
        }
        activated
    }

    /// Activates what tools asked for through the catalog cell; returns the names activated.
    pub fn apply_activation_requests(&mut self) -> Vec<String> {
        self.catalog
            .take_activation_requests()
            .iter()
            .flat_map(|name| self.activate(name))
            .collect()
    }

    /// Readies the registry for the next model request and answers its tools: advances the
    /// LRU and evicts only at `turn_start` or when the list changes anyway (a tool came back),
    /// so the list of consecutive requests stays byte-identical and the provider's prompt
    /// cache holds. Also answers the names evicted.
    pub fn next_request(&mut self, turn_start: bool) -> (Arc<[super::ToolSpec]>, Vec<String>) {
        self.tick();
        let specs = self.specs();
        let changed = self
            .last_offered
            .as_ref()
            .is_none_or(|last| !Arc::ptr_eq(last, &specs) && **last != *specs);
        let evicted = if turn_start || changed {
            self.auto_evict()
        } else {
            Vec::new()
        };
        let specs = self.specs();
        self.last_offered = Some(Arc::clone(&specs));
        (specs, evicted)
    }

    /// Moves idle tools into the deferred set when too many are visible; returns their names.
    pub fn auto_evict(&mut self) -> Vec<String> {
        let evicted = {
            // The deferral tool exists because something is deferred; it does not take a slot.
            let deferral = self.deferral_tool.as_ref().map(|d| d.name.as_str());
            // In the order the model sees them, so ties go from the end of the list.
            let specs = self.specs();
            let active: Vec<&str> = specs
                .iter()
                .map(|spec| spec.name.as_str())
                .filter(|name| Some(*name) != deferral)
                .collect();
            self.lifecycle.find_evictable(&active, &self.spawn_only)
        };
        if !evicted.is_empty() {
            self.deferred.extend(&evicted);
            tracing::debug!(evicted = ?evicted, "tools evicted");
            self.changed();
        }
        evicted
    }

    /// Names of deferred tools, in name order.
    pub fn deferred_names(&self) -> Vec<&str> {
        self.deferred.iter().map(String::as_str).collect()
    }

    /// Brings a deferred tool back because the model called it: its primary group, else the
    /// tool alone.
    pub(super) fn activate_for_call(&mut self, name: &str) {
        if self.deferred.contains(name) {
            let group = self.tools.get(name).and_then(Entry::group);
            let target = match group {
                Some(group) => format!("group:{group}"),
                None => name.to_string(),
            };
            // The siblings come along untouched: the first to go again when the list is
            // crowded. The tool itself is touched when the call is counted.
            let mut activated = self.activate_as(&target, false);
            // A group activation must bring back the tool itself even if it is not a
            // registered member of that group's static list.
            activated.extend(self.activate_as(name, false));
            tracing::debug!(tool = name, activated = ?activated, "deferred tool activated on call");
        }
    }

    /// Registered names of `group` (bare or `group:` prefixed): the tools whose metas name it,
    /// and MCP tools by their server.
    fn members_of(&self, group: &str) -> Vec<String> {
        let bare = group.strip_prefix("group:").unwrap_or(group);
        self.tools
            .iter()
            .filter(|(name, entry)| {
                entry.tool.meta().groups.contains(&bare)
                    || super::policy::mcp_group_names(bare, name) == Some(true)
            })
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Shows the deferral tool while anything is deferred, describing exactly what is.
    pub(super) fn sync_deferral_tool(&mut self) {
        let refused = match &self.deferral_tool {
            Some(deferral) => self.hard_refuses(&deferral.name, &[], &[]),
            None => return,
        };
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
        let schema = &tool.meta().input_schema;
        let Ok(validator) = self.validators.compile(schema) else {
            tracing::error!(tool = %deferral.name, "deferral tool has an invalid schema");
            return;
        };
        deferral.listed = listed.iter().map(|s| s.to_string()).collect();
        self.lifecycle.touch(&deferral.name);
        self.tools
            .insert(deferral.name.as_str().into(), Entry { tool, validator });
    }
}
