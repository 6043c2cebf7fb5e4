//! The tools every registry offers, one file per tool or family, and `with_builtins` which
//! registers them for a workspace.
//!
//! - [`files`] — read_file, write_file, edit_file.
//! - [`patch`] — apply_patch (the Codex patch grammar, all-or-nothing).
//! - [`diff_edit`] — diff_edit (one unified diff, one file).
//! - [`search`] — list_dir, glob, grep.
//! - [`history`] — workspace_diff, workspace_log.
//! - [`shell`] — shell.
//! - [`exec`] — exec_command, write_stdin and the session's process table.
//! - [`web`] — web_fetch, web_search.
//! - [`plan`] — update_plan, request_user_input.
//! - [`discovery`] — tool_search, tool_suggest, activate_tools.
//! - [`image`] — image_generation (no backend: always `unsupported`).

pub mod diff_edit;
pub mod discovery;
pub mod exec;
pub mod files;
pub mod history;
pub mod image;
pub mod patch;
pub mod plan;
pub mod search;
pub mod shell;
pub mod web;

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::registry::{RegistryError, ToolRegistry};
use super::workspace::Workspace;
use super::{Tool, ToolError};

/// Tools never evicted by the LRU nor deferred, unless the config says otherwise.
pub const DEFAULT_BASE_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "apply_patch",
    "list_dir",
    "glob",
    "grep",
    "shell",
    "tool_search",
    "activate_tools",
    "read_task_output",
];

/// What the built-in tools may do beyond the workspace; from the config's `[tools]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPermissions {
    /// Lets `web_fetch` reach loopback, private, link-local and metadata addresses.
    pub web_fetch_allow_private: bool,
    /// A SearXNG-style JSON endpoint for `web_search`; without one it is `unsupported`.
    pub web_search_url: Option<String>,
}

/// Decodes a tool's arguments into its typed form; a mismatch is the model's to fix.
pub(crate) fn parse_args<T: DeserializeOwned>(tool: &str, args: &Value) -> Result<T, ToolError> {
    T::deserialize(args).map_err(|err| {
        ToolError::model("invalid_input", format!("{tool}: invalid arguments: {err}"))
    })
}

/// A registry holding every built-in tool, bound to a workspace at `cwd`, with the default base
/// tools pinned and `activate_tools` shown whenever something is deferred.
pub fn with_builtins(
    cwd: &Path,
    permissions: &ToolPermissions,
) -> Result<ToolRegistry, RegistryError> {
    let workspace = Workspace::new(cwd);
    let ws = || Arc::clone(&workspace);
    let tools: Vec<Arc<dyn Tool>> = vec![
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
    ];
    let mut registry = ToolRegistry::default();
    for name in DEFAULT_BASE_TOOLS {
        registry.pin_base_tool(*name);
    }
    for tool in tools {
        registry.register(tool)?;
    }
    registry.set_workspace(workspace);
    registry.set_deferral_tool("activate_tools", discovery::ActivateTools::factory());
    Ok(registry)
}
