//! Persistence: the [`Store`] trait every other module reads through, the [`Writer`] a
//! session's work is written through (one method, `write_all`), the rows both carry, and
//! [`connect`], which picks the backend from the database URL and runs its migrations.
//!
//! - [`sqlite`]: the default backend, one file under the data dir (WAL, one writing thread that
//!   commits together what queues meanwhile, few readers).
//! - [`postgres`]: the same schema on PostgreSQL (JSONB, TIMESTAMPTZ).
//! - `sql`: the statements both backends share, written once.
//! - [`journal`]: the group commit a server's writes go through on PostgreSQL.
//!
//! Timestamps are UTC at microsecond precision in both backends: values are truncated to the
//! microsecond when stored, so build them with [`timestamp_now`] (or [`truncate_to_micros`]) when
//! a row must compare equal to what is read back.

pub mod journal;
pub mod postgres;
mod rows;
mod sql;
pub mod sqlite;

#[cfg(test)]
pub(crate) mod tests;

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

/// What can go wrong talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row the call needs (a session, a user) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A unique key is taken: a duplicate session id, an event `seq` that is not past `last_seq`.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The database could not be reached when opening the store.
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    /// A query failed, or what it returned could not be decoded.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A write on the SQLite store's writing connection failed.
    #[error("database error: {0}")]
    Sqlite(#[source] rusqlite::Error),
    /// The schema migrations could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// The database URL names no backend we have or cannot be parsed. Never holds the URL itself,
    /// which may carry a password.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// A fenced write's lease epoch is no longer the session's: another node took it over.
    #[error("session {session_id}: lease epoch {epoch} is no longer held; the write was refused")]
    Fenced {
        /// The session.
        session_id: String,
        /// The epoch the write carried.
        epoch: i64,
    },
}

/// The result of every store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// Maps a driver error onto the store's kinds, so both backends report constraint violations
/// the same way.
pub(crate) fn db_error(err: sqlx::Error) -> StoreError {
    if let Some(db) = err.as_database_error() {
        if db.message().contains(SEQ_NOT_PAST_LAST) {
            return StoreError::Conflict(db.message().to_owned());
        }
        match db.kind() {
            sqlx::error::ErrorKind::UniqueViolation => {
                return StoreError::Conflict(db.message().to_owned());
            }
            sqlx::error::ErrorKind::ForeignKeyViolation => {
                return StoreError::NotFound(format!("referenced row missing ({})", db.message()));
            }
            _ => {}
        }
    }
    StoreError::Database(err)
}

/// What the schema's event trigger says when a `seq` is not past its session's `last_seq`
/// (see the migrations `0002_event_log.sql`).
pub(crate) const SEQ_NOT_PAST_LAST: &str = "event seq is not past last_seq";

/// A decoding failure of stored data (bad JSON text, a malformed timestamp) as a store error.
pub(crate) fn decode_error(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Database(sqlx::Error::Decode(Box::new(err)))
}

/// The current time, truncated to what the database keeps (microseconds).
pub fn timestamp_now() -> OffsetDateTime {
    truncate_to_micros(OffsetDateTime::now_utc())
}

/// `at` in UTC with its sub-microsecond part dropped, exactly as a store will return it.
pub fn truncate_to_micros(at: OffsetDateTime) -> OffsetDateTime {
    let at = at.to_offset(time::UtcOffset::UTC);
    let micros = at.nanosecond() / 1_000 * 1_000;
    // Cannot fail: `micros` is at most the original nanosecond value, which was valid.
    at.replace_nanosecond(micros).unwrap_or(at)
}

/// What creating a session needs; the store sets the timestamps and starts `last_seq` at 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    /// The session's id (a UUID the server chose).
    pub session_id: String,
    /// The owning user, or `None` on a server without users. Recorded in `users` if new.
    pub user_name: Option<String>,
    /// The session's working directory, relative to the (user's) workspace root.
    pub cwd: String,
    /// A title, if one is known at creation.
    pub title: Option<String>,
    /// The session it is forked from, for a fork.
    pub parent_session_id: Option<String>,
    /// The agent profile it is opened with (`[[agents]]`), if any.
    pub agent: Option<String>,
}

/// One session as stored; serialises as the REST `sessions` entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// The session's id.
    pub session_id: String,
    /// The owning user; `None` when the server has no users.
    pub user_name: Option<String>,
    /// The session's title, once it has one.
    pub title: Option<String>,
    /// Working directory relative to the (user's) workspace root.
    pub cwd: String,
    /// When the session was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When the last event was appended (creation time before that).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The highest event `seq` stored; 0 before the first event.
    pub last_seq: i64,
    /// The session it was forked from, for a fork (until that one is deleted).
    pub parent_session_id: Option<String>,
    /// The agent profile it was opened with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The model it uses, when it chose one (else the server's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The reasoning effort it asked for, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// The git worktree it works in, when it was opened with `isolation: "worktree"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<SessionWorktree>,
}

/// A session's own git worktree: where it is, its branch, and where the session came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionWorktree {
    /// The repository's top directory, relative to the (user's) workspace root.
    pub repo: String,
    /// The worktree's directory, relative to the (user's) workspace root.
    pub path: String,
    /// The branch made for the session.
    pub branch: String,
    /// The commit the branch started from, as asked (`HEAD` when none was named).
    pub base: String,
    /// The cwd the session asked for, where it works once the worktree is merged or discarded.
    pub origin_cwd: String,
}

/// Which part of a session listing to read: at most `limit` rows, after the row a cursor named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    /// The most rows to answer.
    pub limit: i64,
    /// The `(updated_at, session_id)` of the last row of the previous page, if any.
    pub after: Option<(OffsetDateTime, String)>,
}

impl SessionPage {
    /// Every row.
    pub fn all() -> Self {
        Self {
            limit: i64::MAX,
            after: None,
        }
    }
}

/// Whether the store takes writes: how many sessions hold events it refused (and are trying
/// them again). Read by `/readyz` and by requests that would need a write.
#[derive(Debug, Default)]
pub struct WriteHealth {
    waiting: std::sync::atomic::AtomicUsize,
}

impl WriteHealth {
    /// A session's events were refused; it now waits to store them.
    pub fn session_waiting(&self, err: &StoreError) {
        if self
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            == 0
        {
            tracing::error!(%err, "the store cannot write; refusing new work until it can");
        }
    }

    /// A waiting session stored its events (or gave up on them as it stopped).
    pub fn session_done(&self) {
        if self
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            tracing::warn!("the store writes again");
        }
    }

    /// Whether some session's events wait for the store.
    pub fn is_failing(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::Acquire) > 0
    }
}

/// One persisted notification, the unit of replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    /// The session the event belongs to.
    pub session_id: String,
    /// Its per-session sequence number.
    pub seq: i64,
    /// The notification's JSON-RPC method, e.g. `turn/started`.
    pub method: String,
    /// The notification's params, exactly as appended.
    pub params: Value,
    /// When it was stored.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// One event to append. Its params are serialised once, by the caller, so the text that is
/// stored is the text watchers are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The session the event belongs to.
    pub session_id: Arc<str>,
    /// Its per-session sequence number: the session's `last_seq + 1`.
    pub seq: i64,
    /// The notification's JSON-RPC method, shared as the params are.
    pub method: Arc<str>,
    /// The notification's params as JSON text, shared: a queued copy costs no allocation.
    pub params_json: Arc<str>,
    /// When it happened; also the session's new `updated_at`.
    pub created_at: OffsetDateTime,
}

impl NewEvent {
    /// An event happening now, serialising `params`.
    pub fn now(session_id: Arc<str>, seq: i64, method: &str, params: &Value) -> Self {
        Self {
            session_id,
            seq,
            method: method.into(),
            // A `Value` always serialises: its keys are strings.
            params_json: params.to_string().into(),
            created_at: timestamp_now(),
        }
    }
}

/// One write of a session's work. Every such write goes through [`Writer::write_all`], which
/// is all a group commit or a fence has to wrap.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Events, in one statement, all or none, in the order given (several of one session in
    /// ascending `seq`). Each sets its session's `last_seq` to its `seq` and `updated_at` to
    /// its `created_at`. The caller owns the counter and passes `last_seq + 1`; a `seq` not
    /// greater than `last_seq` (a duplicate, a reordering) is `Conflict`, a missing session
    /// `NotFound`, and either stores nothing of the batch.
    Events(Vec<NewEvent>),
    /// One message of the model-facing history; answers its 0-based index in the session.
    Message {
        /// The session whose history it extends.
        session_id: String,
        /// The message.
        message: Value,
        /// The seq of the session's last event before the message (committed or about to
        /// be), which a fork cuts the history by.
        event_seq: i64,
    },
    /// One cost row. `NotFound` if its session does not exist.
    Cost(CostRow),
    /// A task inserted, or the mutable fields (state, exit_code, reason, total_bytes,
    /// output_path, finished_at) of an existing one updated. `NotFound` without its session.
    Task(TaskRow),
    /// Marks a session as holding no open work, if its last event is still `last_seq` (an
    /// event appended since keeps the mark).
    NoOpenWork {
        /// The session.
        session_id: String,
        /// The last event's seq when its work was seen to be closed.
        last_seq: i64,
    },
}

impl Write {
    /// How many rows it adds, for the size of a batch.
    pub fn rows(&self) -> usize {
        match self {
            Self::Events(events) => events.len(),
            Self::Message { .. } | Self::Cost(_) | Self::Task(_) | Self::NoOpenWork { .. } => 1,
        }
    }
}

/// Where a session's work is written: one method, [`Writer::write_all`], and the one-write
/// forms built on it. The backends and the cluster's fence implement only `write_all`; the
/// group commit also takes a single [`Writer::write`] by value, to queue it without a copy.
#[async_trait]
pub trait Writer: Send + Sync + 'static {
    /// Does `writes` in order in one transaction, all or none, with the errors each would have
    /// alone; answers, per write, the message index of a `Message` and 0 for the others.
    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>>;

    /// One write; its answer.
    async fn write(&self, write: Write) -> StoreResult<i64> {
        let answers = self.write_all(std::slice::from_ref(&write)).await?;
        Ok(answers.first().copied().unwrap_or(0))
    }

    /// [`Writer::write_all`] of writes the caller gives up, so a writer that hands them to
    /// another thread moves them instead of copying a step's message and events.
    async fn write_vec(&self, writes: Vec<Write>) -> StoreResult<Vec<i64>> {
        match <[Write; 1]>::try_from(writes) {
            Ok([write]) => Ok(vec![self.write(write).await?]),
            Err(writes) => self.write_all(&writes).await,
        }
    }

    /// Appends events, all or none ([`Write::Events`]); nothing when there are none.
    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        self.write(Write::Events(events.to_vec())).await.map(drop)
    }

    /// Appends one event happening now (see [`Write::Events`]) and returns it as stored.
    async fn append_event(
        &self,
        session_id: &str,
        seq: i64,
        method: &str,
        params: &Value,
    ) -> StoreResult<EventRow> {
        let event = NewEvent::now(Arc::from(session_id), seq, method, params);
        let created_at = event.created_at;
        self.write(Write::Events(vec![event])).await?;
        Ok(EventRow {
            session_id: session_id.to_owned(),
            seq,
            method: method.to_owned(),
            params: params.clone(),
            created_at,
        })
    }

    /// Appends a message of the model-facing history ([`Write::Message`]); its index.
    async fn append_message(
        &self,
        session_id: &str,
        message: &Value,
        event_seq: i64,
    ) -> StoreResult<i64> {
        self.write(Write::Message {
            session_id: session_id.to_owned(),
            message: message.clone(),
            event_seq,
        })
        .await
    }

    /// Records one cost row ([`Write::Cost`]).
    async fn insert_cost_row(&self, row: &CostRow) -> StoreResult<()> {
        self.write(Write::Cost(row.clone())).await.map(drop)
    }

    /// Inserts or updates a task ([`Write::Task`]).
    async fn upsert_task(&self, task: &TaskRow) -> StoreResult<()> {
        self.write(Write::Task(task.clone())).await.map(drop)
    }

    /// Marks a session as holding no open work ([`Write::NoOpenWork`]).
    async fn mark_no_open_work(&self, session_id: &str, last_seq: i64) -> StoreResult<()> {
        self.write(Write::NoOpenWork {
            session_id: session_id.to_owned(),
            last_seq,
        })
        .await
        .map(drop)
    }
}

/// Where a background task is in its life; stored and sent as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Started and not ended.
    Running,
    /// Ended as asked.
    Completed,
    /// Ended with an error, or was running when the server stopped.
    Failed,
    /// Stopped on request or with its session.
    Cancelled,
}

impl TaskState {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the task will not change again.
    pub fn is_final(self) -> bool {
        self != Self::Running
    }

    /// The state a stored name stands for.
    pub fn parse(name: &str) -> StoreResult<Self> {
        Ok(match name {
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(decode_error(UnknownTaskState(other.to_string()))),
        })
    }
}

/// A stored task state no [`TaskState`] names.
#[derive(Debug, thiserror::Error)]
#[error("unknown task state `{0}`")]
pub struct UnknownTaskState(String);

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One background task; serialises as CONTRACT's `Task` (the output path stays internal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    /// The task's id (its `task_handle`).
    pub task_id: String,
    /// The session that started it.
    pub session_id: String,
    /// The tool call that started it.
    pub tool_call_id: String,
    /// The tool it runs.
    pub tool_name: String,
    /// Where it is in its life.
    pub state: TaskState,
    /// The process exit code, when it ended with one.
    pub exit_code: Option<i32>,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
    /// Bytes of output spooled so far.
    pub total_bytes: i64,
    /// Where the output spool lives on disk; never sent to clients.
    #[serde(skip_serializing, default)]
    pub output_path: String,
    /// When the task started.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it reached a final state.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
}

impl TaskRow {
    /// A task starting now, `running`, with its output spooled at `output_path`.
    pub fn running(
        task_id: &str,
        session_id: &str,
        tool_call_id: &str,
        tool_name: &str,
        output_path: &std::path::Path,
    ) -> Self {
        Self {
            task_id: task_id.to_string(),
            session_id: session_id.to_string(),
            tool_call_id: tool_call_id.to_string(),
            tool_name: tool_name.to_string(),
            state: TaskState::Running,
            exit_code: None,
            reason: None,
            total_bytes: 0,
            output_path: output_path.to_string_lossy().into_owned(),
            created_at: timestamp_now(),
            finished_at: None,
        }
    }
}

/// One priced model call; serialises as CONTRACT's `CostRow` (plus `session_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostRow {
    /// The session that pays for the call.
    pub session_id: String,
    /// Who made the call: `agent`, a pipeline node, or `agent:<agent_id>`.
    pub node_id: String,
    /// The model called.
    pub model: String,
    /// USD reserved against the budget before the call.
    pub reserved_usd: f64,
    /// USD the call actually cost.
    pub actual_usd: f64,
    /// Prompt tokens.
    pub tokens_in: i64,
    /// Completion tokens.
    pub tokens_out: i64,
    /// Of the prompt tokens, those the provider served from its prompt cache.
    #[serde(default)]
    pub tokens_cached: i64,
    /// Whether the call went ahead (false when the budget refused it).
    pub committed: bool,
    /// The turn that made the call, if any.
    pub turn_id: Option<String>,
    /// The background task that made the call, if any.
    pub task_id: Option<String>,
    /// When the row was recorded.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Everything agentd persists: what it reads, and the writes outside a session's work (its
/// [`Writer`] part). Both backends pass the same test suite.
#[async_trait]
pub trait Store: Writer {
    /// Which backend this is: `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// Checks the database answers (readiness).
    async fn ping(&self) -> StoreResult<()>;

    /// Closes the pool; later calls fail. For shutdown.
    async fn close(&self);

    /// The writer a server's sessions write through, committing together the writes of
    /// callers who write at once and counting each such commit in `batches`: SQLite's own
    /// writing thread, PostgreSQL's [`journal::GroupCommit`].
    fn group_commit(self: Arc<Self>, batches: Counter) -> Arc<dyn Writer>;

    /// Records a user by name; a no-op if it exists.
    async fn upsert_user(&self, name: &str) -> StoreResult<()>;

    /// Creates a session (and its user, if new). A taken `session_id` is `Conflict`.
    async fn create_session(&self, new: &NewSession) -> StoreResult<SessionRow>;

    /// One session, or `None`.
    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRow>>;

    /// A user's sessions, most recently updated first, one page of them; `None` lists the
    /// sessions without a user.
    async fn list_sessions(
        &self,
        user: Option<&str>,
        page: &SessionPage,
    ) -> StoreResult<Vec<SessionRow>>;

    /// How many sessions a user has (forks included); `None` counts those without a user.
    async fn count_sessions(&self, user: Option<&str>) -> StoreResult<i64>;

    /// Deletes a session with its events, messages, tasks and cost rows; false if it was not
    /// there. Task output files on disk are the caller's to remove.
    async fn delete_session(&self, session_id: &str) -> StoreResult<bool>;

    /// Sets a session's title (`updated_at` is left alone); `NotFound` if there is no session.
    async fn set_session_title(&self, session_id: &str, title: &str) -> StoreResult<()>;

    /// Sets a session's title only if it has none (a title a person gave is never replaced);
    /// whether it was set.
    async fn set_title_if_unset(&self, session_id: &str, title: &str) -> StoreResult<bool>;

    /// Sets the model and reasoning effort a session uses (`None`: the server's default).
    async fn set_session_model(
        &self,
        session_id: &str,
        model: Option<&str>,
        reasoning_effort: Option<&str>,
    ) -> StoreResult<()>;

    /// Sets where a session works: its cwd and the worktree it holds (`None`: none any more).
    async fn set_session_worktree(
        &self,
        session_id: &str,
        cwd: &str,
        worktree: Option<&SessionWorktree>,
    ) -> StoreResult<()>;

    /// Sessions whose last event is older than `before`, with no open work, no running task
    /// and no git worktree (which may hold work nobody merged): what an idle-session retention
    /// may delete.
    async fn idle_sessions(&self, before: OffsetDateTime) -> StoreResult<Vec<String>>;

    /// Deletes events older than `before` that belong to closed work (at or below a session's
    /// `live_from_seq`, or any of a session holding no open work); how many went.
    async fn prune_events(&self, before: OffsetDateTime) -> StoreResult<u64>;

    /// Deletes the records of tasks that ended before `before`; their output files' paths,
    /// for the caller to remove.
    async fn prune_tasks(&self, before: OffsetDateTime) -> StoreResult<Vec<String>>;

    /// For a fork, what its source had spent up to the fork point; 0 for any other session.
    async fn inherited_usd(&self, session_id: &str) -> StoreResult<f64>;

    /// Sessions that may hold work a stopped server left open, each with the seq after which
    /// to look: every event appended since it was last marked clear is after that seq.
    async fn sessions_with_open_work(&self) -> StoreResult<Vec<(String, i64)>>;

    /// Up to `limit` events with `seq > after_seq`, ascending; empty when `limit <= 0`.
    async fn events_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> StoreResult<Vec<EventRow>>;

    /// The session's model-facing history, in order.
    async fn messages(&self, session_id: &str) -> StoreResult<Vec<Value>>;

    /// Creates `new` (its `parent_session_id` names the source) as a copy of the source up to
    /// event `up_to_seq`: its events (renumbered into nothing; the seqs stay, `session_id` in
    /// their params is the fork's) and the history messages written by then. One transaction.
    async fn fork_session(&self, new: &NewSession, up_to_seq: i64) -> StoreResult<SessionRow>;

    /// One task, or `None`.
    async fn get_task(&self, task_id: &str) -> StoreResult<Option<TaskRow>>;

    /// A session's tasks, oldest first.
    async fn list_tasks(&self, session_id: &str) -> StoreResult<Vec<TaskRow>>;

    /// After a crash: every task still `running` becomes `failed` with `reason`, `exit_code`
    /// NULL and `finished_at` now. Returns how many changed.
    async fn fail_running_tasks(&self, reason: &str) -> StoreResult<u64>;

    /// [`Store::fail_running_tasks`] for one session's tasks (a takeover after a lost node).
    async fn fail_running_tasks_of(&self, session_id: &str, reason: &str) -> StoreResult<u64>;

    /// A session's cost rows, oldest first (insertion order among equal timestamps).
    async fn cost_rows(&self, session_id: &str) -> StoreResult<Vec<CostRow>>;
}

/// Opens the backend named by the URL scheme (`sqlite://path`, `sqlite:path`, `sqlite::memory:`,
/// `postgres://…` or `postgresql://…`), runs its migrations, and returns it.
pub async fn connect(url: &str) -> StoreResult<Arc<dyn Store>> {
    match scheme_of(url) {
        Some("sqlite") => Ok(Arc::new(sqlite::SqliteStore::connect(url).await?)),
        Some("postgres" | "postgresql") => {
            Ok(Arc::new(postgres::PostgresStore::connect(url).await?))
        }
        Some(other) => Err(StoreError::InvalidUrl(format!(
            "unsupported scheme `{other}`; use sqlite:// or postgres://"
        ))),
        None => Err(StoreError::InvalidUrl(
            "no scheme; use sqlite://PATH or postgres://HOST/DB".to_owned(),
        )),
    }
}

/// The URL's scheme, if it has a plausible one.
fn scheme_of(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let valid = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

/// `s` unchanged, or with every NUL replaced by U+FFFD when it has any: PostgreSQL's TEXT and
/// JSONB cannot hold NUL, and tool output (a `cat` of a binary file) can contain it.
pub(crate) fn without_nul(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// `value` unchanged, or a copy with NULs in its strings and keys replaced (see [`without_nul`]).
pub(crate) fn json_without_nul(value: &Value) -> Cow<'_, Value> {
    fn has_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
    fn replace(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(without_nul(s).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(replace).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (without_nul(k).into_owned(), replace(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    if has_nul(value) {
        Cow::Owned(replace(value))
    } else {
        Cow::Borrowed(value)
    }
}
