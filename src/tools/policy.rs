//! Which tools may be used: allow / deny / require_tags, where deny always wins.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Groups a tool can have as its one primary group, the group a call to it while deferred
/// brings back. Which tools are in which group is in their [`ToolMeta::groups`]
/// (`delegated` is a policy-only group: what a sub-agent must never use).
///
/// [`ToolMeta::groups`]: super::ToolMeta::groups
pub const PRIMARY_GROUPS: &[&str] = &["fs", "search", "runtime", "web", "sessions"];

/// The built-in members of `group` (with or without the `group:` prefix), from the tools' own
/// metas; empty for an unknown group.
pub fn group_members(group: &str) -> impl Iterator<Item = &'static str> + '_ {
    let bare = group.strip_prefix("group:").unwrap_or(group);
    super::builtin::metas()
        .iter()
        .filter(move |meta| meta.groups.contains(&bare))
        .map(|meta| meta.name.as_str())
}

/// Whether one policy entry names `tool`: `group:NAME`, then a trailing-`*` prefix, then exact.
pub fn entry_matches(entry: &str, tool: &str) -> bool {
    if entry.starts_with("group:") {
        return super::mcp::group_names(entry, tool)
            .unwrap_or_else(|| group_members(entry).any(|member| member == tool));
    }
    match entry.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => entry == tool,
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

    /// Whether the allow and deny lists let `tool` through, ignoring tags.
    pub fn is_allowed(&self, tool: &str) -> bool {
        if self.deny.iter().any(|entry| entry_matches(entry, tool)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|entry| entry_matches(entry, tool))
    }

    /// The full verdict for a tool with `tags`: names first (deny wins), then tags.
    pub fn verdict(&self, tool: &str, tags: &[&str]) -> Verdict {
        if !self.is_allowed(tool) {
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
        assert!(p.is_allowed("shell"));
        assert_eq!(p.verdict("shell", &["runtime"]), Verdict::Allowed);
    }

    #[test]
    fn deny_wins_over_allow_for_a_tool_in_both_lists() {
        let p = policy(&["shell", "read_file"], &["shell"], &[]);
        assert!(!p.is_allowed("shell"));
        assert!(p.is_allowed("read_file"));
        // Deny by group still beats an exact allow.
        let p = policy(&["web_fetch"], &["group:web"], &[]);
        assert!(!p.is_allowed("web_fetch"));
    }

    #[test]
    fn non_empty_allow_list_refuses_everything_else() {
        let p = policy(&["read_file"], &[], &[]);
        assert!(p.is_allowed("read_file"));
        assert!(!p.is_allowed("write_file"));
    }

    #[test]
    fn wildcards_match_prefixes_only() {
        let p = policy(&[], &["web_*"], &[]);
        assert!(!p.is_allowed("web_search"));
        assert!(!p.is_allowed("web_fetch"));
        assert!(p.is_allowed("read_file"));
        assert!(p.is_allowed("my_web_tool"));
        assert!(entry_matches("*", "anything"));
        assert!(!entry_matches("web_", "web_fetch"), "no star means exact");
    }

    #[test]
    fn groups_expand_to_their_members() {
        let p = policy(&["group:fs", "group:search"], &[], &[]);
        for tool in [
            "read_file",
            "write_file",
            "edit_file",
            "diff_edit",
            "apply_patch",
        ] {
            assert!(p.is_allowed(tool), "{tool}");
        }
        for tool in ["glob", "grep", "list_dir"] {
            assert!(p.is_allowed(tool), "{tool}");
        }
        assert!(!p.is_allowed("shell"));
        let delegated = policy(&[], &["group:delegated"], &[]);
        for tool in [
            "spawn_agent",
            "shell",
            "exec_command",
            "write_stdin",
            "request_user_input",
        ] {
            assert!(!delegated.is_allowed(tool), "{tool}");
        }
        assert!(delegated.is_allowed("wait_agent"));
        assert!(!entry_matches("group:nope", "read_file"));
    }

    #[test]
    fn require_tags_lets_through_sharing_and_untagged_tools() {
        let p = policy(&[], &[], &["code"]);
        assert_eq!(p.verdict("grep", &["search", "code"]), Verdict::Allowed);
        assert_eq!(p.verdict("web_fetch", &["web"]), Verdict::DeniedByTags);
        assert_eq!(
            p.verdict("plain", &[]),
            Verdict::Allowed,
            "untagged is universal"
        );
        // Names are judged before tags.
        let p = policy(&[], &["grep"], &["code"]);
        assert_eq!(p.verdict("grep", &["code"]), Verdict::DeniedByName);
    }

    #[test]
    fn groups_are_the_contract_groups() {
        let members = |group: &str| {
            let mut names: Vec<&str> = group_members(group).collect();
            names.sort_unstable();
            names
        };
        assert_eq!(
            members("group:fs"),
            [
                "apply_patch",
                "diff_edit",
                "edit_file",
                "read_file",
                "view_image",
                "write_file"
            ]
        );
        assert_eq!(members("search"), ["glob", "grep", "list_dir"]);
        assert_eq!(members("runtime"), ["exec_command", "shell", "write_stdin"]);
        assert_eq!(members("web"), ["web_fetch", "web_search"]);
        assert_eq!(
            members("sessions"),
            [
                "close_agent",
                "resume_agent",
                "send_input",
                "spawn_agent",
                "wait_agent"
            ]
        );
        assert_eq!(
            members("delegated"),
            [
                "exec_command",
                "request_user_input",
                "shell",
                "spawn_agent",
                "write_stdin"
            ]
        );
        assert!(members("nope").is_empty());
        let primary = |tool: &str| {
            crate::tools::builtin::metas()
                .iter()
                .find(|meta| meta.name == tool)
                .unwrap()
                .primary_group()
        };
        assert_eq!(primary("spawn_agent"), Some("sessions"));
        assert_eq!(
            primary("request_user_input"),
            None,
            "delegated is policy-only"
        );
        assert_eq!(primary("tool_search"), None);
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
