//! The tool policy's matcher on any lists and names: deny always wins, `*` entries match by
//! prefix, and no entry (groups, MCP groups, odd wildcards) makes it panic.
#![no_main]

use agentd::tools::policy::{ToolPolicy, Verdict, entry_matches};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<String>, Vec<String>, Vec<String>, String, Vec<String>)| {
    let (allow, deny, require_tags, tool, tags) = input;
    let policy = ToolPolicy {
        allow,
        deny,
        require_tags,
        ..ToolPolicy::default()
    };
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    let verdict = policy.verdict(&tool, &tags);
    let denied = policy.deny.iter().any(|entry| entry_matches(entry, &tool));
    if denied {
        assert_eq!(verdict, Verdict::DeniedByName, "deny wins over {:?}", policy.allow);
        assert!(!policy.is_allowed(&tool));
    }
    if policy.allow.is_empty() && !denied {
        assert_ne!(verdict, Verdict::DeniedByName);
    }
    if verdict == Verdict::Allowed {
        assert!(policy.is_allowed(&tool));
    }
    for entry in policy.allow.iter().chain(&policy.deny) {
        if let Some(prefix) = entry.strip_suffix('*')
            && !entry.starts_with("group:")
        {
            assert_eq!(entry_matches(entry, &tool), tool.starts_with(prefix));
        }
    }
    assert!(entry_matches("*", &tool));
    assert!(entry_matches(&tool, &tool) || tool.starts_with("group:"));
});
