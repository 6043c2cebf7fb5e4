//! Which calls need a person's yes before they run: the policies' `ask` lists and their command
//! rules for `shell` and `exec_command`, and what `accept_for_session` granted.
//!
//! Precedence: a hard deny has already removed the tool. For a command tool, a matching command
//! rule decides (the longest matching argv prefix; on a tie deny, then ask, then allow); a
//! command with no matching rule falls to the tool-level lists, where ask wins over allow. A
//! command that cannot be split safely (substitutions, redirections, variables, quoting shlex
//! cannot read) counts as ask whenever an ask rule could apply to it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::policy::{ToolPolicy, entry_matches};

/// What a command rule does with a matching command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Runs at once.
    Allow,
    /// Waits for a person's decision.
    Ask,
    /// Refused.
    Deny,
}

/// `[[tool_policy.commands]]`: what to do with commands that start with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRule {
    /// The argv prefix, after shell-word splitting.
    pub prefix: Vec<String>,
    /// What a matching command gets.
    pub action: RuleAction,
}

/// What `accept_for_session` lets through from then on: the tool, and for a command tool the
/// commands whose argv starts with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The tool.
    pub tool: String,
    /// For a command tool, the argv prefix; `None` for any call of the tool.
    pub prefix: Option<Vec<String>>,
}

/// What the rules say about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// It runs at once.
    Run,
    /// It waits for a decision; `grant` is what `accept_for_session` would allow, when the call
    /// can name one.
    Ask {
        /// Why, for the person deciding.
        reason: String,
        /// What accepting for the session grants.
        grant: Option<Grant>,
    },
    /// It is refused.
    Refuse {
        /// Why, for the model.
        reason: String,
    },
}

/// The tools whose calls are commands, and the argument holding the command line.
const COMMAND_TOOLS: &[(&str, &str)] = &[("shell", "command"), ("exec_command", "cmd")];

/// Tokens that join two commands of one line.
const SEPARATORS: &[&str] = &["|", "||", "&&", ";", "&"];

/// The approval side of a session's policies: the hard `[tool_policy]` and the model's soft one.
#[derive(Debug, Clone, Default)]
pub struct ApprovalRules {
    policies: Vec<ToolPolicy>,
}

impl ApprovalRules {
    /// The rules of the policies that apply; policies without ask entries or command rules are
    /// left out.
    pub fn new<'a>(policies: impl IntoIterator<Item = &'a ToolPolicy>) -> Self {
        Self {
            policies: policies
                .into_iter()
                .filter(|p| !p.ask.is_empty() || !p.commands.is_empty())
                .cloned()
                .collect(),
        }
    }

    /// Whether no call ever waits or is refused here.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    fn asked_by_name(&self, tool: &str) -> bool {
        self.policies
            .iter()
            .any(|p| p.ask.iter().any(|entry| entry_matches(entry, tool)))
    }

    fn any_ask_rule(&self) -> bool {
        self.policies
            .iter()
            .flat_map(|p| &p.commands)
            .any(|rule| rule.action == RuleAction::Ask)
    }

    /// The rule with the longest prefix matching `argv`; on a tie the strictest.
    fn rule_for(&self, argv: &[String]) -> Option<&CommandRule> {
        self.policies
            .iter()
            .flat_map(|p| &p.commands)
            .filter(|rule| !rule.prefix.is_empty() && argv.starts_with(&rule.prefix))
            .max_by_key(|rule| (rule.prefix.len(), rule.action))
    }

    /// What happens to a call of `tool` with `arguments`, given the session's grants.
    pub fn gate(&self, tool: &str, arguments: &Value, grants: &[Grant]) -> Gate {
        if self.is_empty() {
            return Gate::Run;
        }
        let by_name = self.asked_by_name(tool);
        let Some(line) = command_line(tool, arguments) else {
            return if by_name && !grants.iter().any(|g| g.tool == tool && g.prefix.is_none()) {
                Gate::Ask {
                    reason: format!("{tool} is in tool_policy.ask"),
                    grant: Some(Grant {
                        tool: tool.to_string(),
                        prefix: None,
                    }),
                }
            } else {
                Gate::Run
            };
        };
        let granted = |argv: &[String]| {
            grants.iter().any(|g| {
                g.tool == tool
                    && g.prefix
                        .as_ref()
                        .is_none_or(|prefix| argv.starts_with(prefix))
            })
        };
        let Some(segments) = split_commands(line) else {
            let whole_tool = grants.iter().any(|g| g.tool == tool && g.prefix.is_none());
            return if (by_name || self.any_ask_rule()) && !whole_tool {
                Gate::Ask {
                    reason: "the command cannot be split safely into words".into(),
                    grant: None,
                }
            } else {
                Gate::Run
            };
        };
        let mut asked: Option<(String, Option<Vec<String>>)> = None;
        for argv in &segments {
            let (action, prefix) = match self.rule_for(argv) {
                Some(rule) => (rule.action, rule.prefix.clone()),
                None if by_name => (RuleAction::Ask, argv.iter().take(1).cloned().collect()),
                None => (RuleAction::Allow, Vec::new()),
            };
            match action {
                RuleAction::Deny => {
                    return Gate::Refuse {
                        reason: format!(
                            "tool_policy.commands refuses commands starting with {:?}",
                            prefix.join(" ")
                        ),
                    };
                }
                RuleAction::Ask if !granted(argv) && asked.is_none() => {
                    let reason = if self.rule_for(argv).is_some() {
                        format!(
                            "tool_policy.commands asks before commands starting with {:?}",
                            prefix.join(" ")
                        )
                    } else {
                        format!("{tool} is in tool_policy.ask")
                    };
                    asked = Some((reason, Some(prefix)));
                }
                _ => {}
            }
        }
        match asked {
            None => Gate::Run,
            Some((reason, prefix)) => Gate::Ask {
                reason,
                // One command's prefix can be granted; a line of several is asked again.
                grant: (segments.len() == 1).then(|| Grant {
                    tool: tool.to_string(),
                    prefix,
                }),
            },
        }
    }
}

/// The command line of a call of a command tool.
fn command_line<'a>(tool: &str, arguments: &'a Value) -> Option<&'a str> {
    let (_, field) = COMMAND_TOOLS.iter().find(|(name, _)| *name == tool)?;
    arguments[*field].as_str()
}

/// The commands of a line as argv lists, split at `|`, `||`, `&&`, `;` and `&`; `None` when
/// the line holds what word splitting cannot judge: substitutions, redirections, variables,
/// newlines, separators inside words, or quoting shlex cannot read.
pub fn split_commands(line: &str) -> Option<Vec<Vec<String>>> {
    let risky = ['`', '$', '<', '>', '\n', '\r', '(', ')', '{', '}', '\\'];
    if line.contains(risky) {
        return None;
    }
    let words = shlex::split(line)?;
    let mut segments = vec![Vec::new()];
    for word in words {
        if SEPARATORS.contains(&word.as_str()) {
            segments.push(Vec::new());
        } else if word.contains(['|', '&', ';']) {
            return None;
        } else if let Some(last) = segments.last_mut() {
            last.push(word);
        }
    }
    if segments.iter().any(Vec::is_empty) {
        return None;
    }
    Some(segments)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules(ask: &[&str], commands: &[(&[&str], RuleAction)]) -> ApprovalRules {
        let policy = ToolPolicy {
            ask: ask.iter().map(|s| s.to_string()).collect(),
            commands: commands
                .iter()
                .map(|(prefix, action)| CommandRule {
                    prefix: prefix.iter().map(|s| s.to_string()).collect(),
                    action: *action,
                })
                .collect(),
            ..ToolPolicy::default()
        };
        ApprovalRules::new([&policy])
    }

    fn shell(command: &str) -> Value {
        json!({ "command": command })
    }

    fn asks(gate: &Gate) -> bool {
        matches!(gate, Gate::Ask { .. })
    }

    #[test]
    fn without_ask_entries_or_rules_everything_runs() {
        let empty = ApprovalRules::new([&ToolPolicy::default()]);
        assert!(empty.is_empty());
        assert_eq!(empty.gate("shell", &shell("rm -rf /"), &[]), Gate::Run);
    }

    #[test]
    fn the_longest_matching_prefix_decides() {
        let r = rules(
            &[],
            &[
                (&["git"], RuleAction::Ask),
                (&["git", "status"], RuleAction::Allow),
                (&["rm"], RuleAction::Deny),
            ],
        );
        assert_eq!(
            r.gate("shell", &shell("git status --short"), &[]),
            Gate::Run
        );
        assert!(asks(&r.gate("shell", &shell("git push"), &[])));
        assert!(matches!(
            r.gate("exec_command", &json!({"cmd": "rm -rf x"}), &[]),
            Gate::Refuse { .. }
        ));
        // No rule and no ask list: it runs.
        assert_eq!(r.gate("shell", &shell("ls -l"), &[]), Gate::Run);
    }

    #[test]
    fn a_rule_beats_the_tool_level_ask() {
        let r = rules(&["shell"], &[(&["echo"], RuleAction::Allow)]);
        assert_eq!(r.gate("shell", &shell("echo hi"), &[]), Gate::Run);
        assert!(asks(&r.gate("shell", &shell("cat x"), &[])));
        assert!(asks(&r.gate("shell", &shell("echo hi | sh"), &[])));
    }

    #[test]
    fn every_command_of_a_line_must_pass() {
        let r = rules(
            &[],
            &[
                (&["git", "status"], RuleAction::Allow),
                (&["rm"], RuleAction::Deny),
            ],
        );
        assert!(matches!(
            r.gate("shell", &shell("git status && rm -rf x"), &[]),
            Gate::Refuse { .. }
        ));
        assert_eq!(
            r.gate("shell", &shell("git status; git status"), &[]),
            Gate::Run
        );
    }

    #[test]
    fn a_line_that_cannot_be_split_safely_asks_when_an_ask_rule_exists() {
        let r = rules(&[], &[(&["git"], RuleAction::Ask)]);
        for line in [
            "echo $(rm -rf x)",
            "echo `id`",
            "cat < /etc/passwd",
            "a;b",
            "echo \"open",
        ] {
            assert!(asks(&r.gate("shell", &shell(line), &[])), "{line}");
        }
        // Without any ask rule there is nothing to ask for.
        let r = rules(&[], &[(&["git", "status"], RuleAction::Allow)]);
        assert_eq!(r.gate("shell", &shell("echo $(id)"), &[]), Gate::Run);
    }

    #[test]
    fn tools_in_the_ask_list_ask_by_name_wildcard_or_group() {
        let r = rules(&["web_*", "group:fs"], &[]);
        assert!(asks(&r.gate("web_fetch", &json!({}), &[])));
        assert!(asks(&r.gate("write_file", &json!({}), &[])));
        assert_eq!(r.gate("grep", &json!({}), &[]), Gate::Run);
    }

    #[test]
    fn a_grant_lets_the_same_tool_and_prefix_through() {
        let r = rules(&["shell", "write_file"], &[(&["git"], RuleAction::Ask)]);
        let Gate::Ask {
            grant: Some(grant), ..
        } = r.gate("shell", &shell("git push origin"), &[])
        else {
            panic!("asks with a grant");
        };
        assert_eq!(grant.prefix.as_deref(), Some(&["git".to_string()][..]));
        let grants = [grant];
        assert_eq!(r.gate("shell", &shell("git fetch"), &grants), Gate::Run);
        assert!(asks(&r.gate("shell", &shell("rm x"), &grants)));
        assert!(asks(&r.gate(
            "exec_command",
            &json!({"cmd": "git fetch"}),
            &grants
        )));
        let Gate::Ask {
            grant: Some(file), ..
        } = r.gate("write_file", &json!({}), &[])
        else {
            panic!("asks by name");
        };
        assert_eq!(
            r.gate("write_file", &json!({"path": "x"}), &[file]),
            Gate::Run
        );
    }
}
