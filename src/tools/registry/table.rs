//! [`ToolTable`]: the tools one registry holds, by name.

use std::sync::Arc;

use super::Entry;

/// A registry's tools, sorted by name in one allocation.
///
/// Every session copies its parent's table, so its size is paid once per loaded session: a
/// B-tree's nodes, each with room for eleven entries, took about 2.7 KiB for some thirty tools
/// where this takes their exact size. Lookups are binary searches; insertions and removals,
/// which happen when tools come and go, shift the entries after them.
#[derive(Clone, Default)]
pub(in crate::tools) struct ToolTable(Vec<(Arc<str>, Entry)>);

impl ToolTable {
    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| (**key).cmp(name))
    }

    /// The tool registered as `name`.
    pub(in crate::tools) fn get(&self, name: &str) -> Option<&Entry> {
        self.position(name).ok().map(|at| &self.0[at].1)
    }

    /// Whether a tool is registered as `name`.
    pub(in crate::tools) fn contains_key(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// Registers `entry` as `name`, answering the entry it replaces.
    pub(in crate::tools) fn insert(&mut self, name: Arc<str>, entry: Entry) -> Option<Entry> {
        match self.position(&name) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, entry)),
            Err(at) => {
                self.0.insert(at, (name, entry));
                None
            }
        }
    }

    /// Unregisters `name`, answering its entry.
    pub(in crate::tools) fn remove(&mut self, name: &str) -> Option<Entry> {
        let at = self.position(name).ok()?;
        Some(self.0.remove(at).1)
    }

    /// How many tools are registered.
    pub(in crate::tools) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub(in crate::tools) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every tool with its name, in name order.
    pub(in crate::tools) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Entry)> {
        self.0.iter().map(|(name, entry)| (name, entry))
    }

    /// Every name, in order.
    pub(in crate::tools) fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.0.iter().map(|(name, _)| name)
    }

    /// Every entry, to change in place; a name never changes.
    pub(in crate::tools) fn values_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.0.iter_mut().map(|(_, entry)| entry)
    }
}

impl FromIterator<(Arc<str>, Entry)> for ToolTable {
    /// A table of `entries`; of two with one name, the later wins, as with a map.
    fn from_iter<I: IntoIterator<Item = (Arc<str>, Entry)>>(entries: I) -> Self {
        let mut table = Self(Vec::new());
        for (name, entry) in entries {
            // Entries taken from another table come in order: each goes at the end.
            table.insert(name, entry);
        }
        table.0.shrink_to_fit();
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::registry::tests::probe_entry;

    fn names(table: &ToolTable) -> Vec<&str> {
        table.keys().map(|name| &**name).collect()
    }

    #[test]
    fn a_table_keeps_names_in_order_and_replaces_by_name() {
        let mut table: ToolTable = ["grep", "shell", "apply_patch"]
            .into_iter()
            .map(|name| (Arc::from(name), probe_entry(name)))
            .collect();
        assert_eq!(names(&table), ["apply_patch", "grep", "shell"]);
        assert_eq!(table.0.capacity(), 3, "a copied table holds its exact size");

        assert!(table.insert("glob".into(), probe_entry("glob")).is_none());
        let replaced = table.insert("grep".into(), probe_entry("grep-2"));
        assert_eq!(
            replaced.map(|entry| entry.tool.name().to_string()),
            Some("grep".into())
        );
        assert_eq!(
            table.get("grep").map(|entry| entry.tool.name()),
            Some("grep-2")
        );
        assert_eq!(names(&table), ["apply_patch", "glob", "grep", "shell"]);

        assert!(table.remove("glob").is_some());
        assert!(table.remove("glob").is_none());
        assert!(!table.contains_key("glob") && table.contains_key("shell"));
        assert_eq!(table.len(), 3);
    }
}
