//! Read-only search tools over a session's workspace: `list_dir` (a tree listing), `glob`
//! (files by path pattern) and `grep` (regex search of file contents).
//!
//! Every walk runs on a blocking thread, stops when the call is cancelled and never leaves the
//! workspace, even while its directories are being swapped for symbolic links: each call opens
//! the root once ([`Workspace::open_root`]) and reaches every directory, file and ignore file
//! from that descriptor without following a link ([`Beneath`]); a directory is listed only if
//! it is still the one at its path once read, every path `glob` prints is checked again, and
//! `grep` reads only files opened that way, a line at most [`GREP_MAX_LINE_BYTES`] long.
//!
//! - `list_dir` — the `list_dir` tool and its tree.
//! - `glob` — the `glob` tool.
//! - `grep` — the `grep` tool: the regex search of each file and its answer.
//! - `walk` — which files a search visits: the ignore-aware walk and the glob path filter.

mod glob;
mod grep;
mod list_dir;
mod walk;

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

pub use self::glob::Glob;
pub use self::grep::{GREP_MAX_LINE_BYTES, Grep};
pub use self::list_dir::ListDir;
use crate::fs_safe::Beneath;
use crate::tools::{ToolError, Workspace};

const TAGS: &[&str] = &["search"];

/// Resolves the model's starting path and refuses it if it is, or passes through, a symlink.
fn resolve_start(
    workspace: &Workspace,
    root: &Beneath,
    path: Option<&str>,
) -> Result<PathBuf, ToolError> {
    let rel = workspace.resolve(path.unwrap_or("."))?;
    root.reject_symlink(&rel)?;
    Ok(rel)
}

/// A relative path as the model sees it; the root itself is ".".
fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

/// The answer of a walk stopped because its call was cancelled.
fn cancelled(tool: &str) -> ToolError {
    ToolError::model("cancelled", format!("{tool} was cancelled"))
}

/// Runs a filesystem walk on a blocking thread, handing it its own clone of the cancel token.
async fn blocking<T, F>(
    tool: &'static str,
    cancel: &CancellationToken,
    job: F,
) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(CancellationToken) -> Result<T, ToolError> + Send + 'static,
{
    let token = cancel.clone();
    let run = move || {
        if token.is_cancelled() {
            return Err(cancelled(tool));
        }
        job(token)
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(outcome) => outcome,
        Err(err) => Err(ToolError::model(
            "internal_error",
            format!("{tool} stopped unexpectedly: {err}"),
        )),
    }
}

#[cfg(test)]
mod tests;
