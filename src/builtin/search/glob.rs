//! `glob`: the files beneath a directory whose path matches a glob pattern, honouring ignore
//! files, each checked again as it is reported.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::walk::{FileWalk, PathFilter, compile_glob};
use super::{TAGS, blocking, cancelled, display, resolve_start};
use crate::builtin::parse_args;
use crate::fs_safe::Beneath;
use crate::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult, Workspace};

/// Paths `glob` shows.
const GLOB_CAP: usize = 1_000;

/// `glob`: files whose path matches a glob pattern, honouring ignore files.
pub struct Glob {
    workspace: Arc<Workspace>,
}

impl Glob {
    /// A `glob` tool confined to `workspace`.
    pub fn new(workspace: Arc<Workspace>) -> Self {
        Self { workspace }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl Tool for Glob {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "glob",
                "Find files whose path matches a glob pattern, e.g. '**/*.rs' or \
                 'src/**/test_*.py'. The pattern is matched against each file's path relative to \
                 the workspace root (and, when `path` is given, also relative to `path`); '*' and \
                 '?' do not cross '/', '**' spans directories, '{a,b}' and '[abc]' work as usual. \
                 Files ignored by .gitignore or .ignore, hidden files and directories (names \
                 starting with '.') and symbolic links are skipped; give `path` to search inside a \
                 hidden directory. Returns sorted paths relative to the root, at most 1000, with a \
                 count of the rest.",
                json!({
                    "type": "object",
                    "description": "Which files to find.",
                    "properties": {
                        "pattern": {
                            "type": "string",
                            "description": "Glob pattern matched against file paths relative to the workspace root, e.g. '**/*.rs'. Use '**/' to match at any depth: '*.rs' matches only files at the top."
                        },
                        "path": {
                            "type": "string",
                            "description": "Directory to search, relative to the workspace root; defaults to the root."
                        }
                    },
                    "required": ["pattern"],
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
        self.run(args, &ctx.cancel, GLOB_CAP).await
    }

    fn rebind_cwd(&self, workspace: &Arc<Workspace>) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Self::new(Arc::clone(workspace))))
    }
}

impl Glob {
    async fn run(
        &self,
        args: &Value,
        cancel: &CancellationToken,
        cap: usize,
    ) -> Result<ToolResult, ToolError> {
        let args: GlobArgs = parse_args("glob", args)?;
        let matcher = compile_glob("glob", "pattern", &args.pattern)?;
        let workspace = Arc::clone(&self.workspace);
        blocking("glob", cancel, move |cancel| {
            let root = workspace.open_root()?;
            let rel = resolve_start(&workspace, &root, args.path.as_deref())?;
            let filter = PathFilter {
                matcher,
                by_name: false,
            };
            glob_files(&root, &rel, &filter, &args.pattern, cap, &cancel)
        })
        .await
    }
}

/// Walks `rel` and answers the sorted paths `filter` accepts, at most `cap` of them.
pub(super) fn glob_files(
    root: &Beneath,
    rel: &Path,
    filter: &PathFilter,
    pattern: &str,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<ToolResult, ToolError> {
    let mut shown = Vec::new();
    let mut more = 0usize;
    // Unreadable directories are skipped, as a shell glob would.
    for file in FileWalk::new(root, rel) {
        if cancel.is_cancelled() {
            return Err(cancelled("glob"));
        }
        if !filter.accepts(&file, rel) {
            continue;
        }
        if shown.len() < cap {
            // Checked again at the moment it is reported: a regular file at this very path
            // beneath the root, reached without a link.
            if root.metadata(&file).is_ok_and(|m| m.is_file()) {
                shown.push(file);
            }
        } else {
            more += 1;
        }
    }
    // The walk already yields this order; sorting keeps it true whatever the walker does.
    shown.sort();
    let count = shown.len();
    let mut output = if shown.is_empty() {
        format!("No files match '{pattern}' under {}", display(rel))
    } else {
        shown
            .iter()
            .map(|p| display(p))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if more > 0 {
        output.push_str(&format!(
            "\n… {more} more not shown; narrow the pattern or the path"
        ));
    }
    Ok(ToolResult::ok(output).with_metadata(json!({"files": count, "more": more})))
}
