//! `read_task_output` with one implementation behind its three doors: REST, the WebSocket
//! method, and the model's tool.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::output::{OutputQuery, read_output};
use crate::store::{Store, StoreError, TaskRow};

/// Why a task's output could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TaskReadError {
    /// No such task for this caller or session.
    #[error("unknown task {0}")]
    UnknownTask(String),
    /// The output file could not be read.
    #[error("the task's output could not be read: {0}")]
    Unreadable(String),
    /// The store failed.
    #[error("storage error")]
    Store(#[from] StoreError),
}

/// The task `task_id` when it belongs to `session_id`.
pub async fn task_of_session(
    store: &Arc<dyn Store>,
    task_id: &str,
    session_id: &str,
) -> Result<TaskRow, TaskReadError> {
    match store.get_task(task_id).await? {
        Some(task) if task.session_id == session_id => Ok(task),
        _ => Err(TaskReadError::UnknownTask(task_id.to_string())),
    }
}

/// The task with `total_bytes` taken from its output file, which is the truth while it runs
/// (the row is updated only when it ends) and after a crash.
pub fn with_live_size(mut task: TaskRow) -> TaskRow {
    if let Ok(meta) = std::fs::metadata(&task.output_path) {
        task.total_bytes = meta.len() as i64;
    }
    task
}

/// Reads part of a task's output: `{task_id, state, text, total_bytes, next_offset,
/// truncated, complete}`. `complete` says the task has ended, so no more output will come.
pub async fn read_task_output(task: &TaskRow, query: OutputQuery) -> Result<Value, TaskReadError> {
    let path = Path::new(&task.output_path).to_path_buf();
    let slice = tokio::task::spawn_blocking(move || read_output(&path, &query))
        .await
        .map_err(|err| TaskReadError::Unreadable(err.to_string()))?
        .map_err(|err| TaskReadError::Unreadable(err.to_string()))?;
    Ok(json!({
        "task_id": task.task_id,
        "state": task.state,
        "text": slice.text,
        "total_bytes": slice.total_bytes,
        "next_offset": slice.next_offset,
        "truncated": slice.truncated,
        "complete": task.state.is_final(),
    }))
}
