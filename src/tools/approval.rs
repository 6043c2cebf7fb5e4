//! Which calls need a person's yes before they run: the policies' `ask` lists, their command
//! rules for the tools whose calls are commands (`shell`, `exec_command`, `write_stdin`), what
//! `accept_for_session` granted, and writes into a `.git` directory. Which tools are which is
//! each tool's [`ToolMeta::subject`](super::ToolMeta::subject), read through [`ToolGroups`].
//!
//! Precedence: a hard deny has already removed the tool. A write of a tool naming the files it
//! writes (`write_file`, `edit_file`, `diff_edit`, `apply_patch`) inside a `.git` directory
//! always asks, policy or not: a
//! repository's configuration and hooks can make an allowed `git` command run anything. For a
//! command tool, the line is read by [`command_line`] into every command it runs, seen through
//! wrappers (`env rm`, `sudo rm`, `sh -c 'rm x'`, `find -delete`, …), and each must pass: a
//! matching command rule decides (the longest matching argv prefix; on a tie deny, then ask,
//! then allow); a command with no matching rule falls to the tool-level lists, where ask wins
//! over allow. What words cannot settle (a glob naming the program, code given to an
//! interpreter, a sourced file, git configuration on the command line, …) asks whenever a rule
//! could apply to it, and so does a line that cannot be read word by word (substitutions,
//! redirections, variables, quoting that does not close). Characters typed with `write_stdin`
//! are judged as command lines whenever there are command rules or `shell`/`exec_command` ask
//! by name. `docs/tools.md` ("What a command rule sees") has the table.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::CallSubject;
use super::command_line::{self, Concern, Seen, Source};
use super::policy::{ToolGroups, ToolPolicy, entry_matches};

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

/// The lines of an `apply_patch` patch that name a file it writes.
const PATCH_TARGETS: &[&str] = &[
    "*** Add File:",
    "*** Update File:",
    "*** Delete File:",
    "*** Move to:",
];

/// The approval side of a session's policies: the hard `[tool_policy]` and the model's soft one.
#[derive(Debug, Clone, Default)]
pub struct ApprovalRules {
    policies: Vec<ToolPolicy>,
    /// The groups of the tools a call may name, for `group:` entries of `ask`.
    groups: ToolGroups,
}

/// What the rules say about one command of a line.
enum Verdict {
    Run,
    Ask {
        reason: String,
        grant: Option<Vec<String>>,
    },
    Refuse(String),
}

impl ApprovalRules {
    /// The rules of the policies that apply, for tools in `groups`; policies without ask
    /// entries or command rules are left out.
    pub fn new<'a>(policies: impl IntoIterator<Item = &'a ToolPolicy>, groups: ToolGroups) -> Self {
        Self {
            policies: policies
                .into_iter()
                .filter(|p| !p.ask.is_empty() || !p.commands.is_empty())
                .cloned()
                .collect(),
            groups,
        }
    }

    /// Whether no call waits or is refused here, writes into `.git` apart (those always ask).
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    fn asked_by_name(&self, tool: &str) -> bool {
        self.policies.iter().any(|p| {
            p.ask
                .iter()
                .any(|entry| entry_matches(entry, tool, self.groups.of(tool)))
        })
    }

    fn rules(&self) -> impl Iterator<Item = &CommandRule> {
        self.policies.iter().flat_map(|p| &p.commands)
    }

    /// Rules that ask or refuse.
    fn guards(&self) -> impl Iterator<Item = &CommandRule> {
        self.rules().filter(|rule| rule.action != RuleAction::Allow)
    }

    /// Whether a rule or the tool-level list could ask about, or refuse, a command the words
    /// cannot show.
    fn guarded(&self, by_name: bool) -> bool {
        by_name || self.guards().next().is_some()
    }

    /// Whether a rule about `rm` asks or refuses (`["rm"]`, `["rm", "-rf"]`, …).
    fn guards_deleting(&self) -> bool {
        self.guards().any(|rule| {
            rule.prefix
                .first()
                .is_some_and(|program| command_line::base_name(program) == "rm")
        })
    }

    /// Whether a tool that runs command lines (`shell`, `exec_command`) asks by name.
    fn command_lines_asked_by_name(&self) -> bool {
        self.groups
            .command_line_tools()
            .any(|tool| self.asked_by_name(tool))
    }

    /// Whether typed input (`write_stdin`) is judged: there are command rules, or the tools
    /// that run command lines ask by name.
    fn judges_typing(&self) -> bool {
        self.rules().next().is_some() || self.command_lines_asked_by_name()
    }

    /// The rule with the longest prefix matching `seen`; on a tie the strictest.
    fn rule_for(&self, seen: &Seen) -> Option<&CommandRule> {
        self.rules()
            .filter(|rule| prefix_matches(&rule.prefix, seen, rule.action != RuleAction::Allow))
            .max_by_key(|rule| (rule.prefix.len(), rule.action))
    }

    /// An ask or deny rule that arguments given at run time (`xargs`, `find -exec {}`) could
    /// make match `seen`.
    fn could_match(&self, seen: &Seen) -> Option<&CommandRule> {
        let run_time = seen.run_time_args.as_ref()?;
        self.guards().find(|rule| {
            !prefix_matches(&rule.prefix, seen, true)
                && rule
                    .prefix
                    .first()
                    .is_some_and(|p| program_matches(p, seen, true))
                && rule
                    .prefix
                    .iter()
                    .enumerate()
                    .skip(1)
                    .all(|(i, word)| match seen.argv.get(i) {
                        Some(arg) => arg == word || run_time.replaces(arg),
                        None => run_time.appended,
                    })
        })
    }

    /// What happens to a call of `tool` with `arguments`, given the session's grants.
    pub fn gate(&self, tool: &str, arguments: &Value, grants: &[Grant]) -> Gate {
        if let Some(path) = git_directory_target(self.groups.subject(tool), arguments) {
            return Gate::Ask {
                reason: format!(
                    "{tool} writes {path:?}, inside a .git directory: a repository's \
                     configuration and hooks can make an allowed git command run any program"
                ),
                grant: None,
            };
        }
        if self.is_empty() {
            return Gate::Run;
        }
        let whole_tool = grants.iter().any(|g| g.tool == tool && g.prefix.is_none());
        let Some((text, source)) = self.command_text(tool, arguments) else {
            return if self.asked_by_name(tool) && !whole_tool {
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
        // Typing into a process started by a command tool is judged as that tool would be.
        let by_name = self.asked_by_name(tool)
            || (source == Source::Typed && self.command_lines_asked_by_name());
        let reading = match command_line::read_with_terminal(text, source, arguments["tty"] == true)
        {
            Ok(reading) => reading,
            Err(why) => {
                return if self.guarded(by_name) && !whole_tool {
                    Gate::Ask {
                        reason: format!("the command cannot be judged word by word: {why}"),
                        grant: None,
                    }
                } else {
                    Gate::Run
                };
            }
        };
        // An empty line, a comment or a poll of write_stdin runs nothing: nothing to ask, and
        // no grant of the whole tool to offer for it.
        if reading.seen.is_empty() {
            return Gate::Run;
        }
        let mut asks = Vec::new();
        for seen in &reading.seen {
            match self.judge(tool, seen, by_name) {
                Verdict::Run => {}
                Verdict::Refuse(reason) => return Gate::Refuse { reason },
                Verdict::Ask { reason, grant } => {
                    if !granted(tool, seen, grants) {
                        asks.push((reason, grant));
                    }
                }
            }
        }
        let single = asks.len() == 1 && reading.commands == 1;
        match asks.into_iter().next() {
            None => Gate::Run,
            Some((reason, prefix)) => Gate::Ask {
                reason,
                // One command's prefix can be granted; a line of several, or a command asked
                // about twice, is asked again.
                grant: prefix.filter(|_| single).map(|prefix| Grant {
                    tool: tool.to_string(),
                    prefix: Some(prefix),
                }),
            },
        }
    }

    /// These rules with every ask turned into consent: `ask` lists emptied, ask rules made
    /// allow rules. What a hook's `allow` stands for: the deny rules still refuse, still ask
    /// about what they cannot see, and the `.git` rule still asks.
    pub fn without_asks(&self) -> Self {
        let policies = self
            .policies
            .iter()
            .filter(|policy| !policy.commands.is_empty())
            .map(|policy| {
                let mut policy = policy.clone();
                policy.ask.clear();
                for rule in &mut policy.commands {
                    if rule.action == RuleAction::Ask {
                        rule.action = RuleAction::Allow;
                    }
                }
                policy
            })
            .collect();
        Self {
            policies,
            groups: self.groups.clone(),
        }
    }

    /// The text a call of a command tool runs or types, and where it goes.
    fn command_text<'a>(&self, tool: &str, arguments: &'a Value) -> Option<(&'a str, Source)> {
        match self.groups.subject(tool)? {
            CallSubject::TypedInput(_) if !self.judges_typing() => None,
            // A poll without `chars` types nothing.
            CallSubject::TypedInput(field) => {
                Some((arguments[field].as_str().unwrap_or_default(), Source::Typed))
            }
            CallSubject::CommandLine(field) => Some((arguments[field].as_str()?, Source::Line)),
            CallSubject::WrittenPath(_) | CallSubject::Patch(_) => None,
        }
    }

    /// What the rules say about one command of a line.
    fn judge(&self, tool: &str, seen: &Seen, by_name: bool) -> Verdict {
        let context = match &seen.via {
            Some(via) => format!(" ({}, run by {via})", seen.argv.join(" ")),
            None => String::new(),
        };
        let rule = self.rule_for(seen);
        let (mut asks, mut reason, mut grant) = match rule {
            Some(rule) if rule.action == RuleAction::Deny => {
                return Verdict::Refuse(format!(
                    "tool_policy.commands refuses commands starting with {:?}{context}",
                    rule.prefix.join(" ")
                ));
            }
            Some(rule) => (
                rule.action == RuleAction::Ask,
                format!(
                    "tool_policy.commands asks before commands starting with {:?}{context}",
                    rule.prefix.join(" ")
                ),
                Some(rule.prefix.clone()),
            ),
            None if by_name && !seen.transparent && !seen.argv.is_empty() => {
                let program = if seen.local {
                    seen.program.clone()
                } else {
                    seen.argv[0].clone()
                };
                (
                    true,
                    format!("{tool} is in tool_policy.ask"),
                    Some(vec![program]),
                )
            }
            None => (false, String::new(), None),
        };
        if let Some(guard) = self.could_match(seen) {
            asks = true;
            reason = format!(
                "arguments given at run time could make it a command starting with {:?}{context}",
                guard.prefix.join(" ")
            );
            grant = None;
        }
        let concern = seen.concerns.iter().find(|concern| match concern {
            // The rm it counts as is judged by a rule about it, when one matches.
            Concern::Deletes => rule.is_none() && self.guards_deleting(),
            concern if concern.is_about_deleting() => self.guards_deleting(),
            _ => self.guarded(by_name),
        });
        if let Some(concern) = concern {
            asks = true;
            reason = concern.reason(seen);
            grant = None;
        }
        if asks {
            Verdict::Ask { reason, grant }
        } else {
            Verdict::Run
        }
    }
}

/// Whether a grant lets `seen` through without asking.
fn granted(tool: &str, seen: &Seen, grants: &[Grant]) -> bool {
    grants.iter().any(|g| {
        g.tool == tool
            && g.prefix
                .as_ref()
                .is_none_or(|prefix| prefix_matches(prefix, seen, false))
    })
}

/// Whether a rule's or grant's program word names the program of `seen`: by base name
/// (`/usr/bin/rm` and `rm` alike), except that a path outside the system directories (`./ls`)
/// is only named by that path. `strict` rules (ask, deny) also meet such a path by its base
/// name.
fn program_matches(word: &str, seen: &Seen, strict: bool) -> bool {
    if command_line::is_local(word) {
        return seen.program == word;
    }
    seen.argv.first().map(String::as_str) == Some(command_line::base_name(word))
        && (strict || !seen.local)
}

/// Whether `seen` starts with `prefix`.
fn prefix_matches(prefix: &[String], seen: &Seen, strict: bool) -> bool {
    match prefix.split_first() {
        None => false,
        Some((program, args)) => {
            seen.argv.len() > args.len()
                && program_matches(program, seen, strict)
                && seen.argv[1..=args.len()] == *args
        }
    }
}

/// The path inside a `.git` directory that a call of a tool writing the files its `subject`
/// names writes, if any.
fn git_directory_target(subject: Option<CallSubject>, arguments: &Value) -> Option<String> {
    let paths: Vec<&str> = match subject? {
        CallSubject::WrittenPath(field) => arguments[field].as_str().into_iter().collect(),
        CallSubject::Patch(field) => arguments[field]
            .as_str()
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                PATCH_TARGETS
                    .iter()
                    .find_map(|marker| line.trim().strip_prefix(marker))
            })
            .map(str::trim)
            .collect(),
        CallSubject::CommandLine(_) | CallSubject::TypedInput(_) => return None,
    };
    paths
        .into_iter()
        .find(|path| {
            path.split(['/', '\\'])
                .any(|part| part.eq_ignore_ascii_case(".git"))
        })
        .map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
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
        ApprovalRules::new([&policy], tool_groups())
    }

    /// The built-ins' subjects and groups as the tools state them (`crate::builtin` sits
    /// above this module; its own test checks the real metas say the same).
    pub(crate) fn tool_groups() -> ToolGroups {
        use crate::tools::{Effects, ToolMeta};
        let meta = |name: &str, effects, subject: Option<CallSubject>, groups: &[&'static str]| {
            let meta = ToolMeta::new(name, "", json!({"type": "object"}), effects).groups(groups);
            match subject {
                Some(subject) => meta.subject(subject),
                None => meta,
            }
        };
        let command = Effects::RUNS_COMMANDS;
        let writes = Effects::WRITES_FILES;
        let runtime = &["runtime", "delegated"][..];
        ToolGroups::of_metas(&[
            meta(
                "shell",
                command,
                Some(CallSubject::CommandLine("command")),
                runtime,
            ),
            meta(
                "exec_command",
                command,
                Some(CallSubject::CommandLine("cmd")),
                runtime,
            ),
            meta(
                "write_stdin",
                command,
                Some(CallSubject::TypedInput("chars")),
                runtime,
            ),
            meta(
                "write_file",
                writes,
                Some(CallSubject::WrittenPath("path")),
                &["fs"],
            ),
            meta(
                "edit_file",
                writes,
                Some(CallSubject::WrittenPath("path")),
                &["fs"],
            ),
            meta(
                "diff_edit",
                writes,
                Some(CallSubject::WrittenPath("path")),
                &["fs"],
            ),
            meta(
                "apply_patch",
                writes,
                Some(CallSubject::Patch("input")),
                &["fs"],
            ),
            meta("read_file", Effects::NONE, None, &["fs"]),
            meta("grep", Effects::NONE, None, &["search"]),
        ])
    }

    fn shell(command: &str) -> Value {
        json!({ "command": command })
    }

    fn asks(gate: &Gate) -> bool {
        matches!(gate, Gate::Ask { .. })
    }

    /// What a hook's `allow` stands for: the ask rules answered, nothing else.
    #[test]
    fn without_asks_keeps_deny_rules_and_the_git_rule() {
        let r = rules(
            &["shell", "write_file"],
            &[
                (&["rm"], RuleAction::Deny),
                (&["git", "push"], RuleAction::Ask),
            ],
        );
        let allowed = r.without_asks();
        assert!(asks(&r.gate("shell", &shell("ls"), &[])));
        assert_eq!(allowed.gate("shell", &shell("ls"), &[]), Gate::Run);
        assert_eq!(allowed.gate("shell", &shell("git push"), &[]), Gate::Run);
        assert!(matches!(
            allowed.gate("shell", &shell("rm victim"), &[]),
            Gate::Refuse { .. }
        ));
        // What the deny rule cannot see through still asks.
        assert!(asks(&allowed.gate("shell", &shell("r=rm; $r victim"), &[])));
        assert!(asks(&allowed.gate(
            "write_file",
            &json!({"path": ".git/config", "content": "x"}),
            &[]
        )));
        assert_eq!(
            allowed.gate("write_file", &json!({"path": "a", "content": "x"}), &[]),
            Gate::Run
        );
        // Without a deny rule nothing is left but the `.git` rule.
        let asking = rules(&["shell"], &[(&["git"], RuleAction::Ask)]).without_asks();
        assert_eq!(asking.gate("shell", &shell("$x y"), &[]), Gate::Run);
    }

    #[test]
    fn without_ask_entries_or_rules_everything_runs() {
        let empty = ApprovalRules::new([&ToolPolicy::default()], tool_groups());
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
            "echo $(git push)",
            "echo `git push`",
            "$GIT status",
            "echo \"open",
        ] {
            assert!(asks(&r.gate("shell", &shell(line), &[])), "{line}");
        }
        // `a;b` is two commands, read as the shell reads them.
        assert_eq!(r.gate("shell", &shell("a;b"), &[]), Gate::Run);
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

    /// The issue's rules: `git status` allowed, `rm` asked.
    fn rm_asked() -> ApprovalRules {
        rules(
            &[],
            &[
                (&["git", "status"], RuleAction::Allow),
                (&["rm"], RuleAction::Ask),
            ],
        )
    }

    #[test]
    fn an_rm_ask_rule_asks_through_every_wrapper() {
        let r = rm_asked();
        for line in [
            "rm v",
            "command rm v",
            "env rm v",
            "exec rm v",
            "nice rm v",
            "timeout 5 rm v",
            "time rm v",
            "/bin/rm v",
            "/usr/bin/rm v",
            "/usr/bin/r? v",
            "/usr/bin/r[m] v",
            "FOO=1 rm v",
            "echo v | xargs rm",
            "xargs -a lst rm",
            "find . -name v -delete",
            "sh -c 'rm v'",
            "bash -c 'rm v'",
            "eval rm v",
            "git -c alias.x='!rm v' x",
            "unlink v",
            "perl -e 'unlink \"v\"'",
            // Beyond the issue's list, the same holes.
            "sudo -u root rm v",
            "env -i PATH=/bin nice -n 5 timeout 5 rm v",
            "find . -name v -exec rm {} \\;",
            "find . -name v -exec rm {} +",
            "echo v | xargs -I{} rm {}",
            "sh -c 'env sh -c \"rm v\"'",
            "git status && rm v",
            "git status; rm v",
            "if true; then rm v; fi",
            "! rm v",
            "busybox rm v",
            "\\rm v",
            "r\"m\" v",
            "shred -u v",
            "python3 -c 'import os; os.remove(\"v\")'",
            "node -e 'require(\"fs\").unlinkSync(\"v\")'",
            "ruby -e 'File.delete(\"v\")'",
            "php -r 'unlink(\"v\");'",
            "echo 'import os' | python3",
            "echo rm v | sh",
            "source ./x.sh",
            ". ./x.sh",
            "echo rm v | xargs sh -c",
            "echo rm v | xargs env",
            "alias ls='rm v'",
            "trap 'rm v' EXIT",
            "git config alias.x '!rm v'",
            "git -c core.pager='rm v' log",
            "git submodule foreach 'rm v'",
            "git clean -fdx",
            "rsync -a --delete empty/ v/",
            "PATH=. ls",
            "watch rm v",
            "awk 'BEGIN { system(\"rm v\") }'",
            "cp x .git/config",
        ] {
            assert!(asks(&r.gate("shell", &shell(line), &[])), "{line}");
            assert!(
                asks(&r.gate("exec_command", &json!({ "cmd": line }), &[])),
                "{line}"
            );
        }
    }

    #[test]
    fn plain_allowed_commands_still_run() {
        let r = rm_asked();
        for line in [
            "git status",
            "git status --short",
            "ls -la",
            "cargo test",
            "ls *.rs",
            "git status && ls -la | head -n 3",
            "grep -n 'a|b' src/main.rs",
            "find . -name '*.rs' -print",
            "python3 script.py",
            "python3 -m pytest",
            "awk '{ print $1 }' f",
            "echo v | xargs echo",
            "command -v rm",
            "git log --oneline",
            "env FOO=1 cargo test",
            "sh -c 'cargo test'",
        ] {
            assert_eq!(r.gate("shell", &shell(line), &[]), Gate::Run, "{line}");
        }
    }

    #[test]
    fn a_deny_rule_refuses_through_wrappers_and_paths() {
        let r = rules(&[], &[(&["curl"], RuleAction::Deny)]);
        for line in [
            "curl https://x",
            "/usr/bin/curl https://x",
            "env curl https://x",
            "FOO=1 curl https://x",
            "sudo curl https://x",
            "sh -c 'curl https://x'",
            "echo https://x | xargs curl",
            "ls && timeout 5 curl https://x",
            "git -c alias.x='!curl https://x' x",
            // A deny rule meets a program of the workspace by its base name too.
            "./curl https://x",
        ] {
            assert!(
                matches!(r.gate("shell", &shell(line), &[]), Gate::Refuse { .. }),
                "{line}"
            );
        }
        // What words cannot show could be curl: it asks rather than run.
        for line in ["/usr/bin/cu?l https://x", "$(echo curl) https://x"] {
            assert!(asks(&r.gate("shell", &shell(line), &[])), "{line}");
        }
        assert_eq!(r.gate("shell", &shell("wget x"), &[]), Gate::Run);
        // A rule about rm does not make an interpreter ask.
        assert_eq!(r.gate("shell", &shell("python3 -c 1"), &[]), Gate::Run);
    }

    #[test]
    fn rules_and_the_tool_level_ask_meet_only_the_programs_they_name() {
        let r = rules(&["shell"], &[(&["ls"], RuleAction::Allow)]);
        assert_eq!(r.gate("shell", &shell("ls -l"), &[]), Gate::Run);
        assert_eq!(r.gate("shell", &shell("/usr/bin/ls -l"), &[]), Gate::Run);
        // `./ls` is whatever the workspace holds, not the ls the rule allows.
        assert!(asks(&r.gate("shell", &shell("./ls"), &[])));
        assert!(asks(&r.gate("shell", &shell("PATH=. ls"), &[])));
        // A wrapper that only runs its command is judged by that command.
        assert_eq!(r.gate("shell", &shell("time ls"), &[]), Gate::Run);
        assert_eq!(r.gate("shell", &shell("sh -c 'ls'"), &[]), Gate::Run);
        assert!(asks(&r.gate("shell", &shell("sudo ls"), &[])));
        assert!(asks(&r.gate("shell", &shell("time cat x"), &[])));
    }

    #[test]
    fn arguments_given_at_run_time_could_match_a_longer_rule() {
        let r = rules(&[], &[(&["rm", "-rf"], RuleAction::Deny)]);
        assert!(matches!(
            r.gate("shell", &shell("rm -rf x"), &[]),
            Gate::Refuse { .. }
        ));
        assert!(asks(&r.gate("shell", &shell("echo -rf x | xargs rm"), &[])));
        assert!(asks(&r.gate("shell", &shell("xargs -I{} rm {} x"), &[])));
        // A rule starting with rm makes deleting without rm ask.
        assert!(asks(&r.gate("shell", &shell("unlink x"), &[])));
        assert_eq!(r.gate("shell", &shell("rm x"), &[]), Gate::Run);
    }

    #[test]
    fn write_stdin_is_judged_like_a_command_line() {
        let r = rm_asked();
        let typed = |chars: &str| json!({ "session_id": 1, "chars": chars });
        assert!(asks(&r.gate("write_stdin", &typed("rm v\n"), &[])));
        assert!(asks(&r.gate("write_stdin", &typed("ls\nenv rm v\n"), &[])));
        assert!(asks(&r.gate("write_stdin", &typed("rm v"), &[])));
        // A later write finishes a line; editing keys and completion change it.
        for chars in ["r", "rx\u{7f}m v\n", "unl\tv\n", "\u{1b}[A\n", "!!\n"] {
            assert!(
                asks(&r.gate("write_stdin", &typed(chars), &[])),
                "{chars:?}"
            );
        }
        assert_eq!(r.gate("write_stdin", &typed("ls -la\n"), &[]), Gate::Run);
        assert_eq!(r.gate("write_stdin", &typed("\u{3}"), &[]), Gate::Run);
        assert_eq!(
            r.gate("write_stdin", &json!({ "session_id": 1 }), &[]),
            Gate::Run
        );
        // Granted for the session like a command.
        let Gate::Ask {
            grant: Some(grant), ..
        } = r.gate("write_stdin", &typed("rm v\n"), &[])
        else {
            panic!("asks with a grant");
        };
        assert_eq!(grant.tool, "write_stdin");
        assert_eq!(
            r.gate(
                "write_stdin",
                &typed("rm w\n"),
                std::slice::from_ref(&grant)
            ),
            Gate::Run
        );
        assert!(asks(&r.gate("shell", &shell("rm w"), &[grant])));
        // `shell` asked by name: typing into its processes asks too.
        let by_name = rules(&["exec_command"], &[]);
        assert!(asks(&by_name.gate("write_stdin", &typed("ls\n"), &[])));
        // Without command rules or a command tool asked by name, typing is not judged.
        let unrelated = rules(&["web_fetch"], &[]);
        assert_eq!(
            unrelated.gate("write_stdin", &typed("rm v\n"), &[]),
            Gate::Run
        );
    }

    #[test]
    fn a_grant_for_a_wrapped_command_is_the_inner_commands() {
        let r = rm_asked();
        let Gate::Ask {
            grant: Some(grant), ..
        } = r.gate("shell", &shell("env rm v"), &[])
        else {
            panic!("asks with a grant");
        };
        assert_eq!(grant.prefix.as_deref(), Some(&["rm".to_string()][..]));
        let grants = [grant];
        assert_eq!(r.gate("shell", &shell("nice rm w"), &grants), Gate::Run);
        // What words cannot settle is asked every time.
        assert!(matches!(
            r.gate("shell", &shell("/usr/bin/r? v"), &grants),
            Gate::Ask { grant: None, .. }
        ));
    }

    #[test]
    fn writes_into_a_git_directory_always_ask() {
        for r in [ApprovalRules::new([], tool_groups()), rm_asked()] {
            for (tool, arguments) in [
                ("write_file", json!({"path": ".git/config", "content": "x"})),
                (
                    "write_file",
                    json!({"path": ".git", "content": "gitdir: /x"}),
                ),
                (
                    "edit_file",
                    json!({"path": "sub/.git/config", "old_string": "a", "new_string": "b"}),
                ),
                (
                    "diff_edit",
                    json!({"path": "./.GIT/hooks/pre-commit", "diff": ""}),
                ),
                (
                    "apply_patch",
                    json!({"input": "*** Begin Patch\n*** Add File: a/.git/hooks/post-checkout\n+x\n*** End Patch"}),
                ),
                (
                    "apply_patch",
                    json!({"input": "*** Begin Patch\n*** Update File: cfg\n*** Move to: .git/config\n@@\n-a\n+b\n*** End Patch"}),
                ),
                (
                    "apply_patch",
                    json!({"input": "*** Begin Patch\n*** Delete File: .git/index\n*** End Patch"}),
                ),
            ] {
                let gate = r.gate(tool, &arguments, &[]);
                assert!(
                    matches!(&gate, Gate::Ask { grant: None, reason } if reason.contains(".git")),
                    "{tool} {arguments}: {gate:?}"
                );
            }
            for (tool, arguments) in [
                ("write_file", json!({"path": ".gitignore", "content": "x"})),
                (
                    "write_file",
                    json!({"path": "x.git/config", "content": "x"}),
                ),
                (
                    "apply_patch",
                    json!({"input": "*** Begin Patch\n*** Add File: .github/x\n+x\n*** End Patch"}),
                ),
                ("read_file", json!({"path": ".git/config"})),
            ] {
                assert_eq!(
                    r.gate(tool, &arguments, &[]),
                    Gate::Run,
                    "{tool} {arguments}"
                );
            }
        }
    }
}
