//! workspace_diff and workspace_log: what this session changed in its workspace.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde_json::{Value, json};

use super::parse_args;
use crate::tools::workspace::Workspace;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};

/// Largest diff returned whole; a longer one keeps its head and says how much was cut.
const MAX_DIFF_BYTES: usize = 256 * 1024;

/// The empty argument object these tools take; anything else is a mistake worth reporting.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

/// One unified diff of every file the session changed, against its state before the first change.
pub struct WorkspaceDiff {
    workspace: Arc<Workspace>,
}

impl WorkspaceDiff {
    /// A workspace_diff bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[async_trait]
impl Tool for WorkspaceDiff {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "workspace_diff",
                "Show one unified diff of every file this session has changed, compared with each \
                 file's content before the session first touched it. Use it to review your work.",
                no_arguments(),
                Effects::NONE,
            )
            .contract()
            .tags(&["fs"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        parse_args::<NoArgs>(&self.meta().name, args)?;
        let mut diff = self.workspace.diff();
        if diff.is_empty() {
            return Ok(ToolResult::ok("no changes in this session"));
        }
        if diff.len() > MAX_DIFF_BYTES {
            let total = diff.len();
            let mut cut = MAX_DIFF_BYTES;
            while !diff.is_char_boundary(cut) {
                cut -= 1;
            }
            diff.truncate(cut);
            diff.push_str(&format!(
                "\n[diff truncated: {} of {total} bytes not shown]\n",
                total - cut
            ));
        }
        Ok(ToolResult::ok(diff))
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

/// The ordered list of changes the session made, with the tool that made each.
pub struct WorkspaceLog {
    workspace: Arc<Workspace>,
}

impl WorkspaceLog {
    /// A workspace_log bound to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[async_trait]
impl Tool for WorkspaceLog {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "workspace_log",
                "List, in order, every file change this session made: created, modified, moved or \
                 deleted, and by which tool.",
                no_arguments(),
                Effects::NONE,
            )
            .contract()
            .tags(&["fs"])
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        parse_args::<NoArgs>(&self.meta().name, args)?;
        let changes = self.workspace.changes();
        if changes.is_empty() {
            return Ok(ToolResult::ok("no changes in this session"));
        }
        let text: String = changes
            .iter()
            .map(|c| {
                let target = c
                    .moved_to
                    .as_deref()
                    .map(|to| format!(" -> {to}"))
                    .unwrap_or_default();
                let kind = serde_json::to_value(c.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                format!(
                    "{}. {kind} {}{target} by {} at {}\n",
                    c.seq, c.path, c.tool, c.changed_at
                )
            })
            .collect();
        Ok(ToolResult::ok(text).with_metadata(json!({ "changes": changes })))
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[tokio::test]
    async fn diff_and_log_report_the_sessions_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "old\n").unwrap();
        let ws = Workspace::new(dir.path());
        let diff = WorkspaceDiff::new(Arc::clone(&ws));
        let log = WorkspaceLog::new(Arc::clone(&ws));
        assert_eq!(
            diff.call(&ToolContext::detached("."), &json!({}))
                .await
                .unwrap()
                .output,
            "no changes in this session"
        );

        ws.write("edit_file", Path::new("a.txt"), b"new\n").unwrap();
        ws.rename("apply_patch", Path::new("a.txt"), Path::new("b.txt"))
            .unwrap();

        let shown = diff
            .call(&ToolContext::detached("."), &json!({}))
            .await
            .unwrap()
            .output;
        assert!(shown.contains("--- a/a.txt\n+++ /dev/null\n"), "{shown}");
        assert!(shown.contains("--- /dev/null\n+++ b/b.txt\n"), "{shown}");
        assert!(shown.contains("+new\n"), "{shown}");

        let listed = log
            .call(&ToolContext::detached("."), &json!({}))
            .await
            .unwrap();
        let lines: Vec<&str> = listed.output.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("1. modified a.txt by edit_file at "),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("2. moved a.txt -> b.txt by apply_patch"),
            "{}",
            lines[1]
        );
        let meta = listed.structured_metadata.unwrap();
        assert_eq!(meta["changes"][1]["moved_to"], "b.txt");
        assert!(
            log.call(&ToolContext::detached("."), &json!({"x": 1}))
                .await
                .is_err(),
            "no arguments accepted"
        );
    }

    #[tokio::test]
    async fn rebinding_starts_a_fresh_journal() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path());
        ws.write("write_file", Path::new("x"), b"1").unwrap();
        let log = WorkspaceLog::new(ws);
        let fresh = log.rebind_cwd(&Workspace::new(dir.path())).unwrap();
        assert_eq!(
            fresh
                .call(&ToolContext::detached("."), &json!({}))
                .await
                .unwrap()
                .output,
            "no changes in this session"
        );
    }
}
