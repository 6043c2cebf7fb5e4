//! The tools every registry offers, one file per tool or family, and [`all`] which builds
//! them for a workspace.
//!
//! - [`files`] — read_file, write_file, edit_file.
//! - [`patch`] — apply_patch (the Codex patch grammar, all-or-nothing).
//! - [`agents`] — spawn_agent, send_input, resume_agent, wait_agent, close_agent (the session
//!   runs the children, so [`all`] builds them with a model only).
//! - [`diff_edit`] — diff_edit (one unified diff, one file).
//! - `text_edit` — the line model and hunk matching apply_patch and diff_edit share.
//! - [`search`] — list_dir, glob, grep.
//! - [`history`] — workspace_diff, workspace_log.
//! - [`shell`] — shell.
//! - [`exec`] — exec_command, write_stdin and the session's process table.
//! - [`process`] — what every process-starting tool shares: child environment, workdir,
//!   sandboxed spawning, process-group kills, the head-and-tail output cap.
//! - [`web`] — web_fetch, web_search.
//! - [`plan`] — update_plan, request_user_input.
//! - [`discovery`] — tool_search, tool_suggest, activate_tools.
//! - [`image`] — image_generation (no backend: always `unsupported`).
//! - [`pipeline`] — run_pipeline (a DAG of model calls; [`all`] builds it with a model only).

pub mod agents;
pub mod diff_edit;
pub mod discovery;
pub mod exec;
pub mod files;
pub mod history;
pub mod image;
pub mod patch;
pub mod pipeline;
pub mod plan;
pub mod process;
pub mod search;
pub mod shell;
pub mod skill;
mod text_edit;
pub mod web;

use std::path::Path;
use std::sync::{Arc, LazyLock};

use crate::tools::deferral::DeferralToolFactory;
use crate::tools::registry::{RegistryError, ToolRegistry};
use crate::tools::workspace::Workspace;
use crate::tools::{Tool, ToolMeta};

/// What the built-in tools may do beyond the workspace; from the config's `[tools]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPermissions {
    /// Lets `web_fetch` reach loopback, private, link-local and metadata addresses.
    pub web_fetch_allow_private: bool,
    /// A SearXNG-style JSON endpoint for `web_search`; without one it is `unsupported`.
    pub web_search_url: Option<String>,
}

pub(crate) use crate::tools::args::parse_args;

/// The model run_pipeline and the sub-agent tools work with.
#[derive(Clone)]
pub struct BuiltinModel {
    /// The provider its calls go to.
    pub provider: Arc<dyn crate::llm::Provider>,
    /// The model id.
    pub model: String,
    /// What its tokens cost.
    pub pricing: crate::llm::pricing::Pricing,
    /// The output cap of a call that names none.
    pub max_tokens: u32,
}

/// What the built-in tools are built from.
#[derive(Clone)]
pub struct BuiltinDeps {
    /// The workspace the file, search and process tools work in.
    pub workspace: Arc<Workspace>,
    /// What they may do beyond it.
    pub permissions: ToolPermissions,
    /// The model; without one, the tools that need it are left out ([`metas`] still lists
    /// them).
    pub model: Option<BuiltinModel>,
}

impl BuiltinDeps {
    /// The built-ins of a workspace at `cwd`, with no model.
    pub fn at(cwd: &Path, permissions: &ToolPermissions) -> Self {
        Self {
            workspace: Workspace::new(cwd),
            permissions: permissions.clone(),
            model: None,
        }
    }
}

/// Every built-in tool, each carrying its groups and its base and contract marks, so a new one
/// is its file and a line here. `activate_tools` is not among them: the registry shows it only
/// while something is deferred (see [`registry`]).
pub fn all(deps: &BuiltinDeps) -> Vec<Arc<dyn Tool>> {
    let ws = || Arc::clone(&deps.workspace);
    let permissions = &deps.permissions;
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(files::ReadFile::new(ws())),
        Arc::new(files::WriteFile::new(ws())),
        Arc::new(files::EditFile::new(ws())),
        Arc::new(diff_edit::DiffEdit::new(ws())),
        Arc::new(patch::ApplyPatch::new(ws())),
        Arc::new(search::ListDir::new(ws())),
        Arc::new(search::Glob::new(ws())),
        Arc::new(search::Grep::new(ws())),
        Arc::new(shell::Shell::new(ws())),
        Arc::new(exec::ExecCommand::new(ws())),
        Arc::new(exec::WriteStdin::new(ws())),
        Arc::new(web::WebFetch::new(permissions)),
        Arc::new(web::WebSearch::new(permissions)),
        Arc::new(history::WorkspaceDiff::new(ws())),
        Arc::new(history::WorkspaceLog::new(ws())),
        Arc::new(plan::UpdatePlan),
        Arc::new(plan::RequestUserInput::default()),
        Arc::new(discovery::ToolSearch),
        Arc::new(discovery::ToolSuggest),
        Arc::new(image::ImageGeneration),
        Arc::new(image::ViewImage::new(ws())),
        Arc::new(skill::SkillTool::new(ws())),
    ];
    if let Some(model) = &deps.model {
        tools.push(Arc::new(pipeline::RunPipeline::new(
            Arc::clone(&model.provider),
            model.model.clone(),
            model.pricing.clone(),
            model.max_tokens,
        )));
        tools.extend(agents::tools());
    }
    tools
}

/// What the built-ins [`all`] leaves out without a model: the sub-agent tools and
/// run_pipeline. The contract still lists them, as `unsupported`.
fn needing_model() -> Vec<ToolMeta> {
    let mut metas: Vec<ToolMeta> = agents::tools()
        .iter()
        .map(|tool| tool.meta().clone())
        .collect();
    metas.push(pipeline::RunPipeline::spec().clone());
    metas
}

/// The tool the registry shows while something is deferred.
fn deferral_tool() -> (&'static str, DeferralToolFactory) {
    ("activate_tools", discovery::ActivateTools::factory())
}

/// Every built-in's meta, with or without a model: what `group:NAME` names and the contract
/// lists, known without any session.
pub fn metas() -> &'static [ToolMeta] {
    static METAS: LazyLock<Vec<ToolMeta>> = LazyLock::new(|| {
        // The tools are built only to read what they are; none of them runs.
        let unbound = BuiltinDeps::at(Path::new("."), &ToolPermissions::default());
        let (_, deferral) = deferral_tool();
        all(&unbound)
            .iter()
            .map(|tool| tool.meta().clone())
            .chain(needing_model())
            .chain(std::iter::once(deferral(&[]).meta().clone()))
            .collect()
    });
    &METAS
}

/// A registry holding every built-in tool of `deps`, with their base tools pinned and
/// `activate_tools` shown whenever something is deferred.
pub fn registry(deps: &BuiltinDeps) -> Result<ToolRegistry, RegistryError> {
    let mut registry = ToolRegistry::default();
    for tool in all(deps) {
        registry.register(tool)?;
    }
    registry.set_workspace(Arc::clone(&deps.workspace));
    let (name, factory) = deferral_tool();
    registry.set_deferral_tool(name, factory);
    registry.pin_marked_base_tools();
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ConcurrencyClass, ToolContext, ToolState};
    use serde_json::Value;

    fn with_builtins(
        cwd: &Path,
        permissions: &ToolPermissions,
    ) -> Result<ToolRegistry, RegistryError> {
        registry(&BuiltinDeps::at(cwd, permissions))
    }

    /// Tools whose calls only read; everything else writes, runs processes or keeps state.
    const SAFE: &[&str] = &[
        "read_file",
        "list_dir",
        "glob",
        "grep",
        "web_fetch",
        "web_search",
        "workspace_diff",
        "workspace_log",
        "tool_search",
        "tool_suggest",
        "image_generation",
        "view_image",
        "skill",
    ];
    const TAGS: &[&str] = &["fs", "search", "runtime", "web", "plan", "agents", "meta"];

    #[test]
    fn the_groups_of_the_builtins_are_the_contract_groups() {
        let members = |group: &str| {
            let mut names: Vec<&str> = metas()
                .iter()
                .filter(|meta| meta.groups.contains(&group))
                .map(|meta| meta.name.as_str())
                .collect();
            names.sort_unstable();
            names
        };
        assert_eq!(
            members("fs"),
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
        let primary = |tool: &str| {
            metas()
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
        // A registry answers the same groups by name, for approvals and hooks.
        let dir = tempfile::tempdir().unwrap();
        let groups = with_builtins(dir.path(), &ToolPermissions::default())
            .unwrap()
            .tool_groups();
        assert_eq!(
            groups.of("shell"),
            ["runtime", "delegated", "writes", "commands"]
        );
        let deny_fs = crate::tools::ToolPolicy {
            deny: vec!["group:fs".into()],
            ..Default::default()
        };
        assert!(!deny_fs.is_allowed("write_file", groups.of("write_file")));
        assert!(deny_fs.is_allowed("grep", groups.of("grep")));
    }

    /// The built-ins that change files themselves, naming them in an argument.
    const FILE_WRITERS: &[&str] = &["apply_patch", "diff_edit", "edit_file", "write_file"];
    /// The built-ins that run commands or type into one.
    const COMMAND_RUNNERS: &[&str] = &["exec_command", "shell", "write_stdin"];
    /// The built-ins that reach the network without running a command.
    const NETWORK_READERS: &[&str] = &["web_fetch", "web_search"];

    #[test]
    fn every_builtin_states_what_it_does_and_the_groups_follow() {
        use crate::tools::{CallSubject, Effects};
        for meta in metas() {
            let name = meta.name.as_str();
            let expected = if COMMAND_RUNNERS.contains(&name) {
                Effects::RUNS_COMMANDS
            } else if FILE_WRITERS.contains(&name) {
                Effects::WRITES_FILES
            } else if NETWORK_READERS.contains(&name) {
                Effects::REACHES_NETWORK
            } else {
                Effects::NONE
            };
            assert_eq!(meta.effects, expected, "{name}");
            assert_eq!(
                meta.groups.contains(&"writes"),
                meta.effects.writes_files,
                "{name}: {:?}",
                meta.groups
            );
            assert_eq!(
                meta.groups.contains(&"commands"),
                meta.effects.runs_commands,
                "{name}: {:?}",
                meta.groups
            );
            // A writer that runs no command names what it writes, so the `.git` rule sees it;
            // a command tool names its command, so command rules judge it.
            let wants_subject = meta.effects.runs_commands || meta.effects.writes_files;
            assert_eq!(meta.subject.is_some(), wants_subject, "{name}");
            if let Some(subject) = meta.subject {
                assert_eq!(subject.is_command(), meta.effects.runs_commands, "{name}");
                let (CallSubject::CommandLine(field)
                | CallSubject::TypedInput(field)
                | CallSubject::WrittenPath(field)
                | CallSubject::Patch(field)) = subject;
                assert!(
                    meta.input_schema["properties"].get(field).is_some(),
                    "{name}: its subject {field:?} is not one of its arguments"
                );
            }
        }
    }

    #[test]
    fn the_git_rule_and_command_rules_reach_every_tool_the_metas_name() {
        use crate::tools::approval::{ApprovalRules, CommandRule, Gate, RuleAction};
        let dir = tempfile::tempdir().unwrap();
        let groups = with_builtins(dir.path(), &ToolPermissions::default())
            .unwrap()
            .tool_groups();
        let git_rule = ApprovalRules::new([], groups.clone());
        let into_git = |name: &str| match name {
            "apply_patch" => serde_json::json!({
                "input": "*** Begin Patch\n*** Add File: .git/hooks/pre-commit\n+x\n*** End Patch"
            }),
            _ => serde_json::json!({"path": ".git/config", "content": "x", "diff": "",
                                    "old_string": "a", "new_string": "b"}),
        };
        for name in FILE_WRITERS {
            assert!(
                matches!(git_rule.gate(name, &into_git(name), &[]), Gate::Ask { .. }),
                "{name} writes .git without asking"
            );
        }
        let policy = crate::tools::ToolPolicy {
            commands: vec![CommandRule {
                prefix: vec!["rm".into()],
                action: RuleAction::Deny,
            }],
            ..Default::default()
        };
        let rules = ApprovalRules::new([&policy], groups);
        let arguments = |name: &str| match name {
            "write_stdin" => serde_json::json!({"session_id": 1, "chars": "rm x\n"}),
            _ => serde_json::json!({"command": "rm x", "cmd": "rm x"}),
        };
        for name in COMMAND_RUNNERS {
            assert!(
                matches!(rules.gate(name, &arguments(name), &[]), Gate::Refuse { .. }),
                "{name} runs a denied command"
            );
        }
    }

    #[test]
    fn every_builtin_is_registered_with_a_tag_group_and_concurrency_class() {
        let dir = tempfile::tempdir().unwrap();
        let registry = with_builtins(dir.path(), &ToolPermissions::default()).unwrap();
        let catalog = registry.catalog();
        let names: Vec<&str> = catalog.entries.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            [
                "apply_patch",
                "diff_edit",
                "edit_file",
                "exec_command",
                "glob",
                "grep",
                "image_generation",
                "list_dir",
                "read_file",
                "request_user_input",
                "shell",
                "skill",
                "tool_search",
                "tool_suggest",
                "update_plan",
                "view_image",
                "web_fetch",
                "web_search",
                "workspace_diff",
                "workspace_log",
                "write_file",
                "write_stdin",
            ]
        );
        for entry in &catalog.entries {
            assert_eq!(entry.state, ToolState::Active, "{}", entry.name());
            assert!(
                entry.tags().iter().all(|t| TAGS.contains(t)) && !entry.tags().is_empty(),
                "{} has tags {:?}",
                entry.name(),
                entry.tags()
            );
            let expected = if SAFE.contains(&entry.name()) {
                ConcurrencyClass::Safe
            } else {
                ConcurrencyClass::Exclusive
            };
            assert_eq!(entry.concurrency(), expected, "{}", entry.name());
        }
        let group = |name: &str| catalog.get(name).and_then(|entry| entry.group());
        assert_eq!(
            ["read_file", "grep", "shell", "web_fetch", "update_plan"].map(group),
            [
                Some("fs"),
                Some("search"),
                Some("runtime"),
                Some("web"),
                None
            ]
        );
        // The marked ones are pinned; the server's own (read_task_output) it pins itself, and
        // `server::tests` checks the whole set.
        let lifecycle = registry.lifecycle();
        assert!(lifecycle.is_base("read_file") && lifecycle.is_base("activate_tools"));
        assert!(!lifecycle.is_base("diff_edit") && !lifecycle.is_base("read_task_output"));
        assert_eq!(
            registry.workspace().map(|w| w.root().to_path_buf()),
            Some(dir.path().to_path_buf())
        );
    }

    #[test]
    fn every_schema_describes_each_property_for_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let registry = with_builtins(dir.path(), &ToolPermissions::default()).unwrap();
        fn check(tool: &str, path: &str, schema: &Value) {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    assert!(
                        prop.get("description").and_then(Value::as_str).is_some(),
                        "{tool}: {path}/{name} has no description"
                    );
                    check(tool, &format!("{path}/{name}"), prop);
                }
            }
            if let Some(items) = schema.get("items") {
                check(tool, &format!("{path}[]"), items);
            }
        }
        for spec in registry.specs().iter() {
            assert!(!spec.description.is_empty(), "{}", spec.name);
            assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
            check(&spec.name, "", &spec.input_schema);
        }
    }

    #[tokio::test]
    async fn a_session_rebind_moves_every_workspace_tool_together() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let base = with_builtins(first.path(), &ToolPermissions::default()).unwrap();
        let mut session = base.snapshot_excluding(&[]);
        session.rebind_cwd(second.path());
        let ctx = crate::tools::ToolContext::detached(second.path());
        let write = serde_json::json!({"path": "note.txt", "content": "hello\n"});
        session
            .execute_with_context(&ctx, "write_file", &write)
            .await
            .unwrap();
        assert!(second.path().join("note.txt").exists());
        assert!(!first.path().join("note.txt").exists());
        // The journal that workspace_log reads is the one write_file wrote to.
        let log = session
            .execute_with_context(&ctx, "workspace_log", &serde_json::json!({}))
            .await
            .unwrap();
        assert!(
            log.output.contains("created note.txt by write_file"),
            "{}",
            log.output
        );
        let listing = session
            .execute_with_context(&ctx, "grep", &serde_json::json!({"pattern": "hello"}))
            .await
            .unwrap();
        assert!(
            listing.output.contains("note.txt:1:hello"),
            "{}",
            listing.output
        );
        let base_log = base
            .get("workspace_log")
            .unwrap()
            .call(&ToolContext::detached("."), &serde_json::json!({}))
            .await
            .unwrap();
        assert_eq!(base_log.output, "no changes in this session");
    }
}
