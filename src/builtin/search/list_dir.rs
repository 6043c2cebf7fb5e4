//! `list_dir`: an indented tree of a directory beneath the workspace root, capped in entries
//! shown and in entries counted past the cap.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{TAGS, blocking, cancelled, display, resolve_start};
use crate::builtin::parse_args;
use crate::fs_safe::{Beneath, DirEntryInfo, EntryKind};
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace};

/// Deepest `list_dir` listing.
const LIST_MAX_DEPTH: usize = 5;
/// Entries `list_dir` shows.
const LIST_CAP: usize = 1_000;
/// Entries `list_dir` counts past its cap before it stops walking and reports "at least".
const LIST_COUNT_LIMIT: usize = 100_000;

/// `list_dir`: an indented tree of a directory beneath the workspace root.
pub struct ListDir {
    workspace: Arc<Workspace>,
}

impl ListDir {
    /// A `list_dir` tool confined to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListDirArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<u64>,
}

#[async_trait]
impl Tool for ListDir {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "list_dir",
                "List a directory of the workspace as an indented tree sorted by name. Directories \
                 end with '/', symbolic links are shown as 'name -> (symlink, not followed)' and \
                 never entered. Shows everything, including hidden and git-ignored entries. At \
                 most 1000 entries are shown; a final line says how many more there were. Use \
                 `glob` to find files by pattern and `grep` to search contents.",
                json!({
                    "type": "object",
                    "description": "Which directory to list and how deep.",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "Directory to list, relative to the workspace root; defaults to the root. Absolute paths, '..' escapes and symbolic links are refused."
                        },
                        "depth": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": LIST_MAX_DEPTH,
                            "description": "How many levels to show: 1 (default) lists only the directory's own entries, 2 also the entries of its subdirectories, up to 5."
                        }
                    },
                    "additionalProperties": false
                }),
Effects::NONE,
            )
            .groups(&["search"])
            .base()
            .contract()
            .tags(TAGS)
        });
        &META
    }

    async fn call(&self, ctx: &ToolContext, args: &Value) -> Result<ToolResult, ToolError> {
        self.run(args, &ctx.cancel).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

impl ListDir {
    async fn run(&self, args: &Value, cancel: &CancellationToken) -> Result<ToolResult, ToolError> {
        let args: ListDirArgs = parse_args("list_dir", args)?;
        let depth = match args.depth {
            None => 1,
            Some(d) if (1..=LIST_MAX_DEPTH as u64).contains(&d) => d as usize,
            Some(d) => {
                return Err(ToolError::model(
                    "invalid_input",
                    format!("list_dir: depth must be between 1 and {LIST_MAX_DEPTH}, got {d}"),
                ));
            }
        };
        let workspace = Arc::clone(&self.workspace);
        blocking("list_dir", cancel, move |cancel| {
            let root = workspace.open_root()?;
            let rel = resolve_start(&workspace, &root, args.path.as_deref())?;
            list_tree(&root, &rel, depth, LIST_CAP, &cancel)
        })
        .await
    }
}

/// The lines of a `list_dir` answer and what did not fit.
struct Tree {
    lines: Vec<String>,
    cap: usize,
    more: usize,
}

impl Tree {
    fn push(&mut self, level: usize, text: String) {
        if self.lines.len() > self.cap {
            self.more += 1;
        } else {
            self.lines.push(format!("{}{text}", "  ".repeat(level)));
        }
    }

    /// Past this many entries beyond the cap, an exact count is not worth a longer walk.
    fn counted_enough(&self) -> bool {
        self.more >= LIST_COUNT_LIMIT
    }
}

/// Lists `rel` to `depth` levels, showing at most `cap` entries.
pub(super) fn list_tree(
    root: &Beneath,
    rel: &Path,
    depth: usize,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<ToolResult, ToolError> {
    let entries = root.list_dir(rel)?;
    let shown = display(rel);
    let mut tree = Tree {
        // The header line is not an entry, so it does not count against the cap.
        lines: vec![format!("{shown}/")],
        cap,
        more: 0,
    };
    list_entries(root, rel, entries, 1, depth, &mut tree, cancel)?;
    let shown_entries = tree.lines.len() - 1;
    let mut output = if shown_entries == 0 {
        format!("{shown}/ is empty")
    } else {
        tree.lines.join("\n")
    };
    if tree.more > 0 {
        let at_least = if tree.counted_enough() {
            "at least "
        } else {
            ""
        };
        output.push_str(&format!(
            "\n… {at_least}{} more entries not shown; list a subdirectory or use a smaller depth",
            tree.more
        ));
    }
    let metadata = json!({"entries": shown_entries, "more": tree.more});
    Ok(ToolResult::ok(output).with_metadata(metadata))
}

fn list_entries(
    root: &Beneath,
    dir: &Path,
    entries: Vec<DirEntryInfo>,
    level: usize,
    depth: usize,
    tree: &mut Tree,
    cancel: &CancellationToken,
) -> Result<(), ToolError> {
    if cancel.is_cancelled() {
        return Err(cancelled("list_dir"));
    }
    for entry in entries {
        if tree.counted_enough() {
            return Ok(());
        }
        let name = entry.name.to_string_lossy();
        let text = match entry.kind {
            EntryKind::Dir => format!("{name}/"),
            EntryKind::Symlink => format!("{name} -> (symlink, not followed)"),
            EntryKind::File => name.into_owned(),
            EntryKind::Other => format!("{name} (special file)"),
        };
        tree.push(level, text);
        if entry.kind == EntryKind::Dir && level < depth {
            let child = dir.join(&entry.name);
            match root.list_dir(&child) {
                Ok(children) => {
                    list_entries(root, &child, children, level + 1, depth, tree, cancel)?;
                }
                // One unreadable subdirectory should not hide the rest of the tree.
                Err(err) => tree.push(level + 1, format!("(not listed: {err})")),
            }
        }
    }
    Ok(())
}
