//! Which tools may be used: allow / deny / require_tags, where deny always wins.
//!
//! A policy names tools by name, by `prefix*`, or by `group:NAME`. A tool is in a group when its
//! [`ToolMeta::groups`](super::ToolMeta::groups) says so, so every check is given the tool's
//! groups; MCP tools are in `group:mcp` and `group:mcp:<server>` by their names.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{CallSubject, ToolMeta};

/// Groups a tool can have as its one primary group, the group a call to it while deferred
/// brings back. Which tools are in which group is in their [`ToolMeta::groups`]
/// (`delegated` is a policy-only group: what a sub-agent must never use).
///
/// [`ToolMeta::groups`]: super::ToolMeta::groups
pub const PRIMARY_GROUPS: &[&str] = &["fs", "search", "runtime", "web", "sessions"];

/// The group of every tool whose [`Effects`](super::Effects) say it changes files.
pub const WRITES_GROUP: &str = "writes";

/// The group of every tool whose [`Effects`](super::Effects) say it runs a command or types
/// into one.
pub const COMMANDS_GROUP: &str = "commands";

/// How every MCP tool's name starts: `mcp__<server>__<tool>`.
pub const MCP_TOOL_PREFIX: &str = "mcp__";

/// Whether `group` (bare or `group:` prefixed) is an MCP group and names `tool`: `mcp` holds
/// every MCP tool, `mcp:<server>` one server's; `None` for any other group.
pub fn mcp_group_names(group: &str, tool: &str) -> Option<bool> {
    let bare = group.strip_prefix("group:").unwrap_or(group);
    if bare == "mcp" {
        return Some(tool.starts_with(MCP_TOOL_PREFIX));
    }
    let server = bare.strip_prefix("mcp:")?;
    Some(
        tool.strip_prefix(MCP_TOOL_PREFIX)
            .and_then(|rest| rest.strip_prefix(server))
            .is_some_and(|rest| rest.starts_with("__")),
    )
}

/// Whether one policy entry names the tool `name` in `groups`: `group:NAME`, then a
/// trailing-`*` prefix, then exact.
pub fn entry_matches(entry: &str, name: &str, groups: &[&str]) -> bool {
    if let Some(group) = entry.strip_prefix("group:") {
        return mcp_group_names(group, name).unwrap_or_else(|| groups.contains(&group));
    }
    match entry.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => entry == name,
    }
}

/// The groups of a set of tools by name, and the argument each call names its command or
/// written files in, for checks that know a call's tool only by its name (approval rules, the
/// `.git` rule, hooks); taken from the session's registry. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ToolGroups(Arc<HashMap<String, Membership>>);

#[derive(Debug, Clone, Default)]
struct Membership {
    groups: Vec<&'static str>,
    subject: Option<CallSubject>,
}

impl ToolGroups {
    /// The groups of each `(name, groups)`, with no call subjects.
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a str, &'a [&'static str])>) -> Self {
        Self(Arc::new(
            tools
                .into_iter()
                .map(|(name, groups)| {
                    let membership = Membership {
                        groups: groups.to_vec(),
                        subject: None,
                    };
                    (name.to_string(), membership)
                })
                .collect(),
        ))
    }

    /// The groups and call subjects of each tool's meta.
    pub fn of_metas<'a>(metas: impl IntoIterator<Item = &'a ToolMeta>) -> Self {
        Self(Arc::new(
            metas
                .into_iter()
                .map(|meta| {
                    let membership = Membership {
                        groups: meta.groups.clone(),
                        subject: meta.subject,
                    };
                    (meta.name.clone(), membership)
                })
                .collect(),
        ))
    }

    /// The groups of the tool `name`; none for a tool not in the set.
    pub fn of(&self, name: &str) -> &[&'static str] {
        self.0.get(name).map_or(&[], |m| m.groups.as_slice())
    }

    /// The argument a call of `name` names its command or written files in, if any.
    pub fn subject(&self, name: &str) -> Option<CallSubject> {
        self.0.get(name).and_then(|m| m.subject)
    }

    /// The tools whose calls run a command line (`shell`, `exec_command`, …).
    pub fn command_line_tools(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(|(_, m)| matches!(m.subject, Some(CallSubject::CommandLine(_))))
            .map(|(name, _)| name.as_str())
    }
}

/// Why a tool is not visible to the model; the words are the wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HiddenReason {
    /// The system-wide `[tool_policy]` removed it.
    PolicyDeny,
    /// The configured model's `[tool_policy_by_provider]` entry refuses it by name.
    ProviderPolicy,
    /// A policy's `require_tags` shares no tag with it.
    RequireTags,
    /// The registry's context filter trims it from the specs.
    ContextFilter,
}

impl HiddenReason {
    /// The wire word, also used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PolicyDeny => "policy_deny",
            Self::ProviderPolicy => "provider_policy",
            Self::RequireTags => "require_tags",
            Self::ContextFilter => "context_filter",
        }
    }
}

/// What a policy says about one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The tool may be used.
    Allowed,
    /// Refused by the allow or deny list.
    DeniedByName,
    /// Refused because it carries tags and none is required.
    DeniedByTags,
}

/// A set of rules deciding which tools may be used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolPolicy {
    /// When non-empty, only tools matching an entry are allowed.
    pub allow: Vec<String>,
    /// Tools matching an entry are refused, whatever `allow` says.
    pub deny: Vec<String>,
    /// When non-empty, a tagged tool must carry one of these tags; untagged tools always pass.
    pub require_tags: Vec<String>,
    /// Tools whose calls wait for a person's decision (same names, wildcards and groups).
    pub ask: Vec<String>,
    /// Rules for the commands of `shell` and `exec_command`, by argv prefix.
    pub commands: Vec<super::approval::CommandRule>,
}

impl ToolPolicy {
    /// Whether the policy has no rules at all.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
            && self.deny.is_empty()
            && self.require_tags.is_empty()
            && self.ask.is_empty()
            && self.commands.is_empty()
    }

    /// Whether the allow and deny lists let the tool `name` in `groups` through, ignoring tags.
    pub fn is_allowed(&self, name: &str, groups: &[&str]) -> bool {
        let named = |entry: &String| entry_matches(entry, name, groups);
        if self.deny.iter().any(named) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(named)
    }

    /// The full verdict for the tool `name` in `groups` with `tags`: names first (deny wins),
    /// then tags.
    pub fn verdict(&self, name: &str, groups: &[&str], tags: &[&str]) -> Verdict {
        if !self.is_allowed(name, groups) {
            return Verdict::DeniedByName;
        }
        if !tags_pass(&self.require_tags, tags) {
            return Verdict::DeniedByTags;
        }
        Verdict::Allowed
    }
}

/// Whether a tool with `tags` passes a required-tag list: no requirement, no tags (a universal
/// tool), or at least one shared tag.
pub fn tags_pass(required: &[String], tags: &[&str]) -> bool {
    required.is_empty()
        || tags.is_empty()
        || tags.iter().any(|tag| required.iter().any(|r| r == tag))
}

/// Picks the soft policy for a model: the exact model id first, then the provider name.
pub fn provider_policy_for<'a>(
    by_provider: &'a BTreeMap<String, ToolPolicy>,
    model_id: &str,
    provider: &str,
) -> Option<&'a ToolPolicy> {
    by_provider
        .get(model_id)
        .or_else(|| by_provider.get(provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str], require_tags: &[&str]) -> ToolPolicy {
        let owned = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        ToolPolicy {
            allow: owned(allow),
            deny: owned(deny),
            require_tags: owned(require_tags),
            ..ToolPolicy::default()
        }
    }

    #[test]
    fn empty_policy_allows_everything() {
        let p = ToolPolicy::default();
        assert!(p.is_empty());
        assert!(p.is_allowed("shell", &["runtime"]));
        assert_eq!(
            p.verdict("shell", &["runtime"], &["runtime"]),
            Verdict::Allowed
        );
    }

    #[test]
    fn deny_wins_over_allow_for_a_tool_in_both_lists() {
        let p = policy(&["shell", "read_file"], &["shell"], &[]);
        assert!(!p.is_allowed("shell", &[]));
        assert!(p.is_allowed("read_file", &[]));
        // Deny by group still beats an exact allow.
        let p = policy(&["web_fetch"], &["group:web"], &[]);
        assert!(!p.is_allowed("web_fetch", &["web"]));
    }

    #[test]
    fn non_empty_allow_list_refuses_everything_else() {
        let p = policy(&["read_file"], &[], &[]);
        assert!(p.is_allowed("read_file", &["fs"]));
        assert!(!p.is_allowed("write_file", &["fs"]));
    }

    #[test]
    fn wildcards_match_prefixes_only() {
        let p = policy(&[], &["web_*"], &[]);
        assert!(!p.is_allowed("web_search", &[]));
        assert!(!p.is_allowed("web_fetch", &[]));
        assert!(p.is_allowed("read_file", &[]));
        assert!(p.is_allowed("my_web_tool", &[]));
        assert!(entry_matches("*", "anything", &[]));
        assert!(
            !entry_matches("web_", "web_fetch", &[]),
            "no star means exact"
        );
    }

    #[test]
    fn a_group_names_the_tools_whose_groups_hold_it() {
        let p = policy(&["group:fs", "group:search"], &[], &[]);
        assert!(p.is_allowed("read_file", &["fs"]));
        assert!(p.is_allowed("my_plugin", &["search", "web"]));
        assert!(!p.is_allowed("shell", &["runtime", "delegated"]));
        assert!(
            !p.is_allowed("read_file", &[]),
            "a name alone is in no group: membership is the tool's to say"
        );
        let delegated = policy(&[], &["group:delegated"], &[]);
        assert!(!delegated.is_allowed("spawn_agent", &["sessions", "delegated"]));
        assert!(delegated.is_allowed("wait_agent", &["sessions"]));
        assert!(!entry_matches("group:nope", "read_file", &["fs"]));
    }

    #[test]
    fn mcp_groups_go_by_the_tool_name() {
        let tool = format!("{MCP_TOOL_PREFIX}everything__echo");
        assert_eq!(mcp_group_names("group:mcp", &tool), Some(true));
        assert_eq!(mcp_group_names("group:mcp:everything", &tool), Some(true));
        assert_eq!(mcp_group_names("group:mcp:every", &tool), Some(false));
        assert_eq!(mcp_group_names("group:mcp:other", &tool), Some(false));
        assert_eq!(mcp_group_names("group:mcp", "read_file"), Some(false));
        assert_eq!(mcp_group_names("group:fs", &tool), None);
        assert!(entry_matches("group:mcp:everything", &tool, &[]));
        // A tool cannot claim an MCP group by its meta.
        assert!(!entry_matches("group:mcp", "read_file", &["mcp"]));
    }

    #[test]
    fn tool_groups_answer_by_name() {
        let groups = ToolGroups::new([
            ("shell", &["runtime", "delegated"][..]),
            ("grep", &["search"][..]),
        ]);
        assert_eq!(groups.of("shell"), ["runtime", "delegated"]);
        assert_eq!(groups.of("grep"), ["search"]);
        assert!(groups.of("unknown").is_empty());
    }

    #[test]
    fn require_tags_lets_through_sharing_and_untagged_tools() {
        let p = policy(&[], &[], &["code"]);
        assert_eq!(
            p.verdict("grep", &["search"], &["search", "code"]),
            Verdict::Allowed
        );
        assert_eq!(
            p.verdict("web_fetch", &["web"], &["web"]),
            Verdict::DeniedByTags
        );
        assert_eq!(
            p.verdict("plain", &[], &[]),
            Verdict::Allowed,
            "untagged is universal"
        );
        // Names are judged before tags.
        let p = policy(&[], &["grep"], &["code"]);
        assert_eq!(p.verdict("grep", &[], &["code"]), Verdict::DeniedByName);
    }

    #[test]
    fn provider_policy_prefers_the_exact_model_id() {
        let mut map = BTreeMap::new();
        map.insert("gpt-x".to_string(), policy(&[], &["shell"], &[]));
        map.insert("openai".to_string(), policy(&[], &["grep"], &[]));
        assert_eq!(
            provider_policy_for(&map, "gpt-x", "openai").map(|p| p.deny.clone()),
            Some(vec!["shell".to_string()])
        );
        assert_eq!(
            provider_policy_for(&map, "gpt-y", "openai").map(|p| p.deny.clone()),
            Some(vec!["grep".to_string()])
        );
        assert!(provider_policy_for(&map, "gpt-y", "vllm").is_none());
    }

    #[test]
    fn policy_reads_from_toml_shaped_json_and_rejects_unknown_keys() {
        let p: ToolPolicy = serde_json::from_str(r#"{"deny":["web_*"]}"#).unwrap();
        assert_eq!(p, policy(&[], &["web_*"], &[]));
        assert!(serde_json::from_str::<ToolPolicy>(r#"{"denny":["x"]}"#).is_err());
    }

    #[test]
    fn hidden_reasons_have_their_wire_words() {
        for reason in [
            HiddenReason::PolicyDeny,
            HiddenReason::ProviderPolicy,
            HiddenReason::RequireTags,
            HiddenReason::ContextFilter,
        ] {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::Value::String(reason.as_str().to_string())
            );
        }
    }
}
