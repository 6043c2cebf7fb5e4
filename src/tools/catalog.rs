//! The live catalog: every tool a registry knows, visible or not, and why; refreshed on every
//! registry mutation so discovery tools and `tool/list` never read a stale picture.

use crate::mutex::lock;
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};

use super::policy::HiddenReason;
use super::{ConcurrencyClass, Effects, Tool};

/// Where a tool stands in one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolState {
    /// Visible to the model.
    Active,
    /// Registered but held back until activated or called.
    Deferred,
    /// Not visible, for the given reason.
    Hidden(HiddenReason),
}

impl ToolState {
    /// The wire word: `active`, `deferred` or `hidden`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Deferred => "deferred",
            Self::Hidden(_) => "hidden",
        }
    }
}

/// One tool as the catalog describes it; holds the shared tool object, so building a catalog
/// copies no text.
#[derive(Clone)]
pub struct CatalogEntry {
    pub(crate) tool: Arc<dyn Tool>,
    /// Whether calls to it run in the background.
    pub spawn_only: bool,
    /// Whether and why it is visible.
    pub state: ToolState,
}

impl CatalogEntry {
    /// The tool's name.
    pub fn name(&self) -> &str {
        self.tool.name()
    }

    /// Its primary group, when it has one.
    pub fn group(&self) -> Option<&'static str> {
        self.tool.meta().primary_group()
    }

    /// Its description.
    pub fn description(&self) -> &str {
        self.tool.description()
    }

    /// Its capability tags.
    pub fn tags(&self) -> &[&str] {
        self.tool.tags()
    }

    /// The JSON Schema its arguments must match.
    pub fn input_schema(&self) -> &serde_json::Value {
        self.tool.input_schema()
    }

    /// Whether it runs alongside other tools.
    pub fn concurrency(&self) -> ConcurrencyClass {
        self.tool.concurrency_class()
    }

    /// What it can do to files, commands and the network.
    pub fn effects(&self) -> Effects {
        self.tool.meta().effects
    }
}

impl std::fmt::Debug for CatalogEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogEntry")
            .field("name", &self.name())
            .field("group", &self.group())
            .field("spawn_only", &self.spawn_only)
            .field("state", &self.state)
            .finish()
    }
}

/// Serialises as the contract's `ToolInfo` plus `state` and, for hidden tools, `reason`.
impl Serialize for CatalogEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("CatalogEntry", 9)?;
        s.serialize_field("name", self.name())?;
        s.serialize_field("description", self.description())?;
        s.serialize_field("tags", self.tags())?;
        if let Some(group) = self.group() {
            s.serialize_field("group", group)?;
        }
        s.serialize_field("concurrency", &self.concurrency())?;
        s.serialize_field("effects", &self.effects())?;
        s.serialize_field("spawn_only", &self.spawn_only)?;
        s.serialize_field("state", self.state.as_str())?;
        if let ToolState::Hidden(reason) = self.state {
            s.serialize_field("reason", &reason)?;
        }
        s.end()
    }
}

/// A point-in-time list of a registry's tools, sorted by name.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ToolCatalog {
    /// Every tool, policy-removed ones included.
    pub entries: Vec<CatalogEntry>,
}

impl ToolCatalog {
    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Option<&CatalogEntry> {
        self.entries
            .binary_search_by(|entry| entry.name().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Names of the entries in `state`, in name order.
    pub fn names_in(&self, state: ToolState) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|entry| entry.state == state)
            .map(CatalogEntry::name)
            .collect()
    }

    /// Hidden entries with their reasons.
    pub fn hidden(&self) -> impl Iterator<Item = (&CatalogEntry, HiddenReason)> {
        self.entries.iter().filter_map(|entry| match entry.state {
            ToolState::Hidden(reason) => Some((entry, reason)),
            _ => None,
        })
    }
}

/// A shared, always-current view of one registry's catalog; discovery tools hold a clone and
/// read it while the registry's owner keeps mutating. It also carries activation requests back:
/// a tool cannot borrow the registry while it runs, so it asks, and the registry applies the
/// request before its next model iteration or call.
#[derive(Debug, Clone, Default)]
pub struct CatalogCell(Arc<CatalogShared>);

#[derive(Debug, Default)]
struct CatalogShared {
    current: RwLock<Arc<ToolCatalog>>,
    activation_requests: Mutex<Vec<String>>,
}

impl CatalogCell {
    /// The current catalog.
    pub fn load(&self) -> Arc<ToolCatalog> {
        // A poisoned lock only means a writer panicked between two whole-Arc swaps; the
        // catalog inside is still a complete value.
        match self.0.current.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Asks the registry to activate these tools or `group:` names.
    pub fn request_activation(&self, names: impl IntoIterator<Item = String>) {
        lock(&self.0.activation_requests).extend(names);
    }

    pub(crate) fn take_activation_requests(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.0.activation_requests))
    }

    pub(crate) fn store(&self, catalog: ToolCatalog) {
        let catalog = Arc::new(catalog);
        match self.0.current.write() {
            Ok(mut guard) => *guard = catalog,
            Err(poisoned) => *poisoned.into_inner() = catalog,
        }
    }
}
