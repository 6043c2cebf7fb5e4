//! The command reader and the judgement it feeds, on any text: nothing panics or recurses
//! without bound, and a line whose first command is a denied program never runs.
#![no_main]

use agentd::tools::ToolPolicy;
use agentd::tools::approval::{ApprovalRules, CommandRule, Gate, RuleAction};
use agentd::tools::command_line::{Source, read};
use agentd::tools::policy::ToolGroups;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// The built-ins' groups and subjects: which argument of which tool is a command line.
static GROUPS: std::sync::LazyLock<ToolGroups> =
    std::sync::LazyLock::new(|| ToolGroups::of_metas(agentd::builtin::metas()));

fuzz_target!(|text: &str| {
    let _ = read(text, Source::Line);
    let _ = read(text, Source::Typed);
    let policy = ToolPolicy {
        commands: vec![CommandRule {
            prefix: vec!["rm".to_string()],
            action: RuleAction::Deny,
        }],
        ..ToolPolicy::default()
    };
    let rules = ApprovalRules::new([&policy], GROUPS.clone());
    let _ = rules.gate("shell", &json!({ "command": text }), &[]);
    let _ = rules.gate("exec_command", &json!({ "cmd": text, "tty": true }), &[]);
    let _ = rules.gate("write_stdin", &json!({ "chars": text }), &[]);
    // Whatever follows, a line that starts by running rm asks or is refused.
    let line = format!("rm {text}");
    let gate = rules.gate("shell", &json!({ "command": line }), &[]);
    assert!(!matches!(gate, Gate::Run), "{line:?} ran");
});
