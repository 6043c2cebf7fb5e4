//! The statements both backends run as they are: written once, with `$N` placeholders, which
//! SQLite (through sqlx) reads as PostgreSQL does. Each backend binds its own types (TEXT or
//! TIMESTAMPTZ timestamps, TEXT or JSONB documents) in the order the numbers give.

/// The columns a session row is read from (`rows::session_row`), as a literal for `concat!`.
macro_rules! session_columns {
    () => {
        "session_id, user_name, title, cwd, created_at, updated_at, last_seq, \
         parent_session_id, model, reasoning_effort, agent, worktree"
    };
}
pub(crate) use session_columns;

/// The columns a task row is read from (`rows::task_row`), as a literal for `concat!`.
macro_rules! task_columns {
    () => {
        "task_id, session_id, tool_call_id, tool_name, state, exit_code, reason, total_bytes, \
         output_path, created_at, finished_at"
    };
}

/// Inserts a task, or updates the fields of it that change: task_id, session_id, tool_call_id,
/// tool_name, state, exit_code, reason, total_bytes, output_path, created_at, finished_at.
pub(crate) const UPSERT_TASK: &str = "INSERT INTO tasks (task_id, session_id, tool_call_id, \
     tool_name, state, exit_code, reason, total_bytes, output_path, created_at, finished_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
     ON CONFLICT (task_id) DO UPDATE SET state = excluded.state, \
     exit_code = excluded.exit_code, reason = excluded.reason, \
     total_bytes = excluded.total_bytes, output_path = excluded.output_path, \
     finished_at = excluded.finished_at";

/// Clears a session's open-work mark unless an event came since: session_id, last_seq.
pub(crate) const MARK_NO_OPEN_WORK: &str =
    "UPDATE sessions SET live_from_seq = NULL WHERE session_id = $1 AND last_seq = $2";

/// Records a cost row: session_id, node_id, model, reserved_usd, actual_usd, tokens_in,
/// tokens_out, tokens_cached, committed, turn_id, task_id, created_at.
pub(crate) const INSERT_COST: &str = "INSERT INTO cost_rows (session_id, node_id, model, \
     reserved_usd, actual_usd, tokens_in, tokens_out, tokens_cached, committed, turn_id, task_id, \
     created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// Appends a history message at the session's next index, answering it: session_id, message,
/// created_at, event_seq.
pub(crate) const INSERT_MESSAGE: &str = "INSERT INTO messages (session_id, idx, message, \
     created_at, event_seq) SELECT $1, COALESCE(MAX(idx) + 1, 0), $2, $3, $4 FROM messages \
     WHERE session_id = $1 RETURNING idx";

/// Records a user by name unless known: name, created_at.
pub(crate) const UPSERT_USER: &str =
    "INSERT INTO users (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";

/// One session: session_id.
pub(crate) const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1"
);

/// Deletes a session, its rows going with it: session_id.
pub(crate) const DELETE_SESSION: &str = "DELETE FROM sessions WHERE session_id = $1";

/// Sets the model a session uses: model, reasoning_effort, session_id.
pub(crate) const SET_SESSION_MODEL: &str =
    "UPDATE sessions SET model = $1, reasoning_effort = $2 WHERE session_id = $3";

/// Sets where a session works: cwd, worktree, session_id.
pub(crate) const SET_SESSION_WORKTREE: &str =
    "UPDATE sessions SET cwd = $1, worktree = $2 WHERE session_id = $3";

/// Gives a session without a title one: title, session_id.
pub(crate) const SET_TITLE_IF_UNSET: &str =
    "UPDATE sessions SET title = $1 WHERE session_id = $2 AND title IS NULL";

/// Sessions a retention may delete: before.
pub(crate) const IDLE_SESSIONS: &str = "SELECT session_id FROM sessions s WHERE updated_at < \
     $1 AND live_from_seq IS NULL AND worktree IS NULL AND NOT EXISTS (SELECT 1 FROM tasks \
     t WHERE t.session_id = s.session_id AND t.state = 'running') ORDER BY session_id";

/// Deletes ended tasks, answering their output paths: before.
pub(crate) const PRUNE_TASKS: &str = "DELETE FROM tasks WHERE state <> 'running' AND \
     finished_at IS NOT NULL AND finished_at < $1 RETURNING output_path";

/// What a fork's source had spent at the fork: session_id.
pub(crate) const INHERITED_USD: &str = "SELECT inherited_usd FROM sessions WHERE session_id = $1";

/// Sessions that may hold open work, with the seq to look after.
pub(crate) const SESSIONS_WITH_OPEN_WORK: &str = "SELECT session_id, live_from_seq FROM \
     sessions WHERE live_from_seq IS NOT NULL ORDER BY session_id";

/// Sets a session's title: title, session_id.
pub(crate) const SET_SESSION_TITLE: &str = "UPDATE sessions SET title = $1 WHERE session_id = $2";

/// Events after a seq, in order: session_id, after_seq, limit.
pub(crate) const EVENTS_AFTER: &str = "SELECT session_id, seq, method, params, created_at \
     FROM events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3";

/// A session's history, in order: session_id.
pub(crate) const MESSAGES: &str = "SELECT message FROM messages WHERE session_id = $1 ORDER \
     BY idx";

/// One task: task_id.
pub(crate) const GET_TASK: &str =
    concat!("SELECT ", task_columns!(), " FROM tasks WHERE task_id = $1");

/// A session's tasks, oldest first: session_id.
pub(crate) const LIST_TASKS: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE session_id = $1 ORDER BY created_at, task_id"
);

/// Fails every running task: reason, finished_at.
pub(crate) const FAIL_RUNNING_TASKS: &str = "UPDATE tasks SET state = 'failed', reason = $1, \
     exit_code = NULL, finished_at = $2 WHERE state = 'running'";

/// Fails one session's running tasks: reason, finished_at, session_id.
pub(crate) const FAIL_RUNNING_TASKS_OF: &str = "UPDATE tasks SET state = 'failed', reason = \
     $1, exit_code = NULL, finished_at = $2 WHERE state = 'running' AND session_id = $3";

/// A session's cost rows, oldest first: session_id.
pub(crate) const COST_ROWS: &str = "SELECT session_id, node_id, model, reserved_usd, \
     actual_usd, tokens_in, tokens_out, tokens_cached, committed, turn_id, task_id, \
     created_at FROM cost_rows WHERE session_id = $1 ORDER BY created_at, id";
