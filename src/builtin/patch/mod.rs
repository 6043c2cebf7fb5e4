//! `apply_patch`: applies a patch in the Codex format (add, delete, update and move files) to
//! the workspace, all-or-nothing.
//!
//! The whole patch is parsed, and every file's new content computed and every target checked,
//! in memory before anything is written; a failure anywhere changes no file. Should a write
//! fail halfway (an I/O error), the files already written are restored from their in-memory
//! originals.
//!
//! `parse` reads the patch grammar and `apply` plans and writes it; the text model shared with
//! [`super::diff_edit`] is `text_edit`.

mod apply;
mod parse;
#[cfg(test)]
mod tests;

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::parse_args;
pub use super::text_edit::HunkLine;
use crate::tools::{
    CallSubject, Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace,
};
pub use apply::apply_update;
use apply::{failure_result, plan, run_steps, success_result};
pub use parse::{FileOp, Hunk, Patch, PatchError, parse_patch};

const TOOL: &str = "apply_patch";

const DESCRIPTION: &str = "\
Create, delete, edit and rename files with one patch in the Codex patch format. All-or-nothing: \
if any operation or hunk fails, no file is changed, and the error names the file, the hunk and \
the lines that did not match.

Format (paths relative to the workspace):
*** Begin Patch
*** Add File: path/new.txt      then the new file's lines, each prefixed with '+'
*** Delete File: path/old.txt
*** Update File: path/file.txt
*** Move to: path/renamed.txt   optional, right after Update File, renames the file
@@ fn anchor()                  starts a hunk; the text after '@@ ' is an anchor line found \
first (searching forward); several '@@ ...' lines in a row narrow down one after another; a \
bare '@@' has no anchor
 context line                   unchanged (leading space; an empty line counts as empty context)
-removed line
+added line
*** End of File                 optional, after a hunk that must match the end of the file
*** End Patch

Rules: give about 3 lines of context around each change, enough to be unique after the anchor. \
Hunks of one file are located in order, each after the previous one. The first hunk of an \
Update may omit its '@@' line. A hunk's context and removed lines are matched exactly first, \
then ignoring trailing whitespace, then ignoring surrounding whitespace; context lines keep the \
file's own text. A hunk with only '+' lines is inserted right after its anchor, or at the end of \
the file when it has none. Add refuses an existing file; Move to refuses an existing target. \
CRLF files stay CRLF, and an updated file always ends with a newline.";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    input: String,
}

/// The `apply_patch` tool, bound to one workspace.
#[derive(Debug, Clone)]
pub struct ApplyPatch {
    workspace: Arc<Workspace>,
}

impl ApplyPatch {
    /// An `apply_patch` working in `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }

    /// Parses, plans and applies a patch text.
    fn apply(&self, input: &str) -> Result<ToolResult, ToolError> {
        let patch = parse_patch(input).map_err(|err| {
            ToolError::model(
                "invalid_input",
                format!("{TOOL}: invalid patch at {err}\nNo file was changed."),
            )
        })?;
        let (steps, summary) = plan(&self.workspace, &patch)?;
        match run_steps(&self.workspace, &steps) {
            Ok(()) => Ok(success_result(summary)),
            Err(failure) => Ok(failure_result(failure)),
        }
    }
}

#[async_trait]
impl Tool for ApplyPatch {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                TOOL,
                DESCRIPTION,
                json!({
                    "type": "object",
                    "description": "A patch to apply all-or-nothing.",
                    "properties": {
                        "input": {
                            "type": "string",
                            "description": "The whole patch, from `*** Begin Patch` to `*** End \
                                            Patch`, in the format described for this tool."
                        }
                    },
                    "required": ["input"],
                    "additionalProperties": false
                }),
                Effects::WRITES_FILES,
            )
            .subject(CallSubject::Patch("input"))
            .groups(&["fs"])
            .base()
            .contract()
            .tags(&["fs"])
            .exclusive()
        });
        &META
    }

    async fn call(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        let args: Args = parse_args(TOOL, args)?;
        let tool = self.clone();
        // File I/O blocks; keep it off the async workers.
        tokio::task::spawn_blocking(move || tool.apply(&args.input))
            .await
            .map_err(|err| ToolError::Fatal(format!("{TOOL} task failed: {err}")))?
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}
