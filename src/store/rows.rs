//! How a result row becomes a [`SessionRow`], [`EventRow`], [`TaskRow`] or [`CostRow`]: one
//! mapping both backends share. Each backend says only how it reads a column of each kind
//! ([`StoredRow`]); the SQL stays in the backend's own file.

use serde_json::Value;
use time::OffsetDateTime;

use super::{CostRow, EventRow, SessionRow, StoreResult, TaskRow, TaskState};

/// The columns `session_row` reads, in every backend's `SELECT`.
pub(crate) const SESSION_COLUMNS: &str = super::sql::session_columns!();

/// One row of a backend's result, read column by column in the types the rows use.
pub(crate) trait StoredRow {
    /// A text column.
    fn text(&self, column: &str) -> StoreResult<String>;
    /// A nullable text column.
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>>;
    /// An integer column.
    fn int(&self, column: &str) -> StoreResult<i64>;
    /// A nullable 32-bit integer column.
    fn opt_int32(&self, column: &str) -> StoreResult<Option<i32>>;
    /// A floating-point column.
    fn real(&self, column: &str) -> StoreResult<f64>;
    /// A boolean column.
    fn flag(&self, column: &str) -> StoreResult<bool>;
    /// A JSON column.
    fn json(&self, column: &str) -> StoreResult<Value>;
    /// A timestamp column.
    fn time(&self, column: &str) -> StoreResult<OffsetDateTime>;
    /// A nullable timestamp column.
    fn opt_time(&self, column: &str) -> StoreResult<Option<OffsetDateTime>>;
}

/// The [`StoredRow`] methods of the column kinds a backend decodes as they are, with the `get`
/// function in scope where it is used.
macro_rules! decoded_columns {
    () => {
        fn text(&self, column: &str) -> StoreResult<String> {
            get(self, column)
        }
        fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
            get(self, column)
        }
        fn int(&self, column: &str) -> StoreResult<i64> {
            get(self, column)
        }
        fn opt_int32(&self, column: &str) -> StoreResult<Option<i32>> {
            get(self, column)
        }
        fn real(&self, column: &str) -> StoreResult<f64> {
            get(self, column)
        }
        fn flag(&self, column: &str) -> StoreResult<bool> {
            get(self, column)
        }
    };
}
pub(crate) use decoded_columns;

/// A session from the columns of [`SESSION_COLUMNS`].
pub(crate) fn session_row(row: &impl StoredRow) -> StoreResult<SessionRow> {
    Ok(SessionRow {
        session_id: row.text("session_id")?,
        user_name: row.opt_text("user_name")?,
        title: row.opt_text("title")?,
        cwd: row.text("cwd")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
        last_seq: row.int("last_seq")?,
        parent_session_id: row.opt_text("parent_session_id")?,
        agent: row.opt_text("agent")?,
        model: row.opt_text("model")?,
        reasoning_effort: row.opt_text("reasoning_effort")?,
        worktree: row
            .opt_text("worktree")?
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(super::decode_error)?,
    })
}

/// An event from `session_id, seq, method, params, created_at`.
pub(crate) fn event_row(row: &impl StoredRow) -> StoreResult<EventRow> {
    Ok(EventRow {
        session_id: row.text("session_id")?,
        seq: row.int("seq")?,
        method: row.text("method")?,
        params: row.json("params")?,
        created_at: row.time("created_at")?,
    })
}

/// A task from the columns of `sql::task_columns!`.
pub(crate) fn task_row(row: &impl StoredRow) -> StoreResult<TaskRow> {
    Ok(TaskRow {
        task_id: row.text("task_id")?,
        session_id: row.text("session_id")?,
        tool_call_id: row.text("tool_call_id")?,
        tool_name: row.text("tool_name")?,
        state: TaskState::parse(&row.text("state")?)?,
        exit_code: row.opt_int32("exit_code")?,
        reason: row.opt_text("reason")?,
        total_bytes: row.int("total_bytes")?,
        output_path: row.text("output_path")?,
        created_at: row.time("created_at")?,
        finished_at: row.opt_time("finished_at")?,
    })
}

/// A cost row from `session_id, node_id, model, reserved_usd, actual_usd, tokens_in,
/// tokens_out, tokens_cached, committed, turn_id, task_id, created_at`.
pub(crate) fn cost_row(row: &impl StoredRow) -> StoreResult<CostRow> {
    Ok(CostRow {
        session_id: row.text("session_id")?,
        node_id: row.text("node_id")?,
        model: row.text("model")?,
        reserved_usd: row.real("reserved_usd")?,
        actual_usd: row.real("actual_usd")?,
        tokens_in: row.int("tokens_in")?,
        tokens_out: row.int("tokens_out")?,
        tokens_cached: row.int("tokens_cached")?,
        committed: row.flag("committed")?,
        turn_id: row.opt_text("turn_id")?,
        task_id: row.opt_text("task_id")?,
        created_at: row.time("created_at")?,
    })
}
