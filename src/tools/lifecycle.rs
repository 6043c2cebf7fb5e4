//! The LRU that keeps the model's tool list short: idle, non-base tools are evicted into the
//! deferred set once more than `max_active` are visible.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Default number of tools the model sees before eviction starts.
pub const DEFAULT_MAX_ACTIVE: usize = 15;
/// Default number of model iterations a tool must sit unused before it may be evicted.
pub const DEFAULT_IDLE_THRESHOLD: u32 = 5;

/// Per-session usage counters driving eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLifecycle {
    /// Tool name → the iteration it was last used (or activated) in.
    pub(crate) last_used: HashMap<String, u32>,
    /// Model iterations so far; advanced by `tick()` before every model call.
    pub(crate) iteration: u32,
    /// Names never evicted, pinned by name even before such a tool is registered. Shared by
    /// every session's snapshot until one pins a name of its own.
    pub(crate) base_tools: Arc<HashSet<String>>,
    /// Visible tools allowed before eviction starts.
    pub(crate) max_active: usize,
    /// Iterations of disuse before a tool may be evicted; protects against thrashing.
    pub(crate) idle_threshold: u32,
}

impl Default for ToolLifecycle {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ACTIVE, DEFAULT_IDLE_THRESHOLD)
    }
}

impl ToolLifecycle {
    /// Fresh counters with the given limits and no base tools.
    pub fn new(max_active: usize, idle_threshold: u32) -> Self {
        Self {
            last_used: HashMap::new(),
            iteration: 0,
            base_tools: Arc::default(),
            max_active,
            idle_threshold,
        }
    }

    /// Fresh counters that keep this one's limits and base tools; what a session snapshot gets.
    pub fn fresh(&self) -> Self {
        Self {
            last_used: HashMap::new(),
            iteration: 0,
            base_tools: Arc::clone(&self.base_tools),
            max_active: self.max_active,
            idle_threshold: self.idle_threshold,
        }
    }

    /// Advances to the next model iteration.
    pub fn tick(&mut self) {
        self.iteration = self.iteration.saturating_add(1);
    }

    /// The current iteration.
    pub fn iteration(&self) -> u32 {
        self.iteration
    }

    /// Records that `tool` was used (or brought back) in the current iteration.
    pub fn touch(&mut self, tool: &str) {
        match self.last_used.get_mut(tool) {
            Some(last) => *last = self.iteration,
            None => {
                self.last_used.insert(tool.to_string(), self.iteration);
            }
        }
    }

    /// Pins `tool` by name so it is never evicted.
    pub fn pin(&mut self, tool: impl Into<String>) {
        Arc::make_mut(&mut self.base_tools).insert(tool.into());
    }

    /// Whether `tool` is pinned.
    pub fn is_base(&self, tool: &str) -> bool {
        self.base_tools.contains(tool)
    }

    /// The iteration each tool was last used or brought back in, by name.
    pub fn last_used(&self) -> impl Iterator<Item = (&str, u32)> {
        self.last_used.iter().map(|(name, at)| (name.as_str(), *at))
    }

    /// The visible-tool limit.
    pub fn max_active(&self) -> usize {
        self.max_active
    }

    /// The idle threshold in iterations.
    pub fn idle_threshold(&self) -> u32 {
        self.idle_threshold
    }

    /// The tools to evict from `active_tools` (in the model's order): none at or under
    /// `max_active`; otherwise, as many as bring the count back to `max_active`, of the
    /// non-base tools never used here (they cannot thrash, so they go first and at once) and
    /// then the oldest-used idle for at least `idle_threshold` iterations; among equals, the
    /// latest in the list first, so the list keeps the longest prefix. Names in `exempt`
    /// (spawn_only tools) are never candidates but still count as active.
    pub fn find_evictable(&self, active_tools: &[&str], exempt: &BTreeSet<String>) -> Vec<String> {
        if active_tools.len() <= self.max_active {
            return Vec::new();
        }
        let mut candidates: Vec<(usize, &str, Option<u32>)> = active_tools
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, name)| !self.base_tools.contains(*name) && !exempt.contains(*name))
            .map(|(position, name)| (position, name, self.last_used.get(name).copied()))
            .filter(|(_, _, last)| {
                last.is_none_or(|last| self.iteration.saturating_sub(last) >= self.idle_threshold)
            })
            .collect();
        candidates.sort_by(|a, b| a.2.cmp(&b.2).then(b.0.cmp(&a.0)));
        let to_evict = active_tools.len() - self.max_active;
        candidates
            .into_iter()
            .take(to_evict)
            .map(|(_, name, _)| name.to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("tool_{i:02}")).collect()
    }

    fn refs(names: &[String]) -> Vec<&str> {
        names.iter().map(String::as_str).collect()
    }

    #[test]
    fn nothing_is_evicted_at_or_under_the_limit() {
        let mut lc = ToolLifecycle::default();
        for _ in 0..100 {
            lc.tick();
        }
        let tools = names(15);
        assert!(
            lc.find_evictable(&refs(&tools), &BTreeSet::new())
                .is_empty()
        );
    }

    #[test]
    fn sixteen_active_evicts_exactly_the_oldest_idle_one() {
        let mut lc = ToolLifecycle::default();
        let tools = names(16);
        // tool_i used at iteration i + 1; at iteration 30 all are idle >= 5.
        for (i, tool) in tools.iter().enumerate() {
            while lc.iteration() < i as u32 + 1 {
                lc.tick();
            }
            lc.touch(tool);
        }
        while lc.iteration() < 30 {
            lc.tick();
        }
        assert_eq!(
            lc.find_evictable(&refs(&tools), &BTreeSet::new()),
            vec!["tool_00".to_string()]
        );
    }

    #[test]
    fn a_tool_used_four_iterations_ago_is_safe() {
        let mut lc = ToolLifecycle::default();
        let tools = names(16);
        for _ in 0..10 {
            lc.tick();
        }
        for tool in &tools {
            lc.touch(tool);
        }
        for _ in 0..4 {
            lc.tick();
        }
        assert!(
            lc.find_evictable(&refs(&tools), &BTreeSet::new())
                .is_empty()
        );
        lc.tick();
        assert_eq!(lc.find_evictable(&refs(&tools), &BTreeSet::new()).len(), 1);
    }

    #[test]
    fn recently_used_tools_survive_while_older_ones_go() {
        let mut lc = ToolLifecycle::default();
        let tools = names(18);
        for _ in 0..20 {
            lc.tick();
        }
        // tool_00 is fresh, tool_01 used long ago; the rest were never used and go first,
        // from the end of the list.
        lc.touch(&tools[0]);
        lc.last_used.insert(tools[1].clone(), 1);
        let evicted = lc.find_evictable(&refs(&tools), &BTreeSet::new());
        assert_eq!(evicted, vec!["tool_17", "tool_16", "tool_15"]);
        // Once only used tools are left, the oldest use goes first.
        let used: Vec<String> = tools[..2].to_vec();
        let mut crowded = lc.clone();
        crowded.max_active = 1;
        assert_eq!(
            crowded.find_evictable(&refs(&used), &BTreeSet::new()),
            vec!["tool_01"]
        );
    }

    #[test]
    fn all_base_registries_evict_nothing() {
        let mut lc = ToolLifecycle::default();
        let tools = names(20);
        for tool in &tools {
            lc.pin(tool.clone());
        }
        for _ in 0..50 {
            lc.tick();
        }
        assert!(
            lc.find_evictable(&refs(&tools), &BTreeSet::new())
                .is_empty()
        );
    }

    #[test]
    fn base_and_exempt_tools_are_never_candidates_but_still_count() {
        let mut lc = ToolLifecycle::default();
        let tools = names(17);
        lc.pin("tool_00");
        let exempt: BTreeSet<String> = ["tool_01".to_string()].into();
        for _ in 0..10 {
            lc.tick();
        }
        assert_eq!(
            lc.find_evictable(&refs(&tools), &exempt),
            vec!["tool_16", "tool_15"]
        );
    }

    #[test]
    fn fresh_keeps_limits_and_base_tools_but_not_usage() {
        let mut lc = ToolLifecycle::new(3, 2);
        lc.pin("read_file");
        lc.tick();
        lc.touch("grep");
        let fresh = lc.fresh();
        assert_eq!(fresh.iteration(), 0);
        assert!(fresh.last_used.is_empty());
        assert!(fresh.is_base("read_file"));
        assert_eq!((fresh.max_active(), fresh.idle_threshold()), (3, 2));
    }
}
