//! The SQLite backend: one database file (WAL, `synchronous = NORMAL`, foreign keys on) behind
//! one writing connection and a small pool of readers. Timestamps are fixed-width RFC 3339 TEXT
//! (`2026-01-02T03:04:05.123456Z`) so that text order is time order; JSON is TEXT.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

use super::rows::{
    SESSION_COLUMNS, StoredRow, cost_row, decoded_columns, event_row, session_row, task_row,
};
use super::{
    CostRow, EventRow, NewEvent, NewSession, SessionPage, SessionRow, SessionWorktree, Store,
    StoreError, StoreResult, TaskRow, Write, Writer, db_error, decode_error, timestamp_now,
};

/// Reading connections: WAL lets readers run beside the one writer.
const MAX_CONNECTIONS: u32 = 4;
/// How long a writer waits for the database lock before failing with "database is locked".
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the WAL is copied back into the database file (see `checkpoint_periodically`).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// How long a call waits for a free connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// The WAL size past which the checkpointer waits for readers and rewinds it (a TRUNCATE
/// checkpoint), and the size it is cut back to whenever SQLite rewinds it.
const WAL_BOUND_BYTES: i64 = 64 << 20;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The store on a SQLite file (or an in-memory database, for tests and throwaway servers).
pub struct SqliteStore {
    /// Readers: WAL lets them run beside the writer.
    pool: SqlitePool,
    /// The one connection every write goes through. SQLite admits one writer at a time; a
    /// second writing connection would meet the lock and sleep in the busy handler (1 ms, then
    /// longer), while waiting for this pool is a queue that wakes as soon as it is free.
    writer: SqlitePool,
    /// Stops the checkpointer when the store goes.
    _checkpointer: Option<tokio_util::sync::DropGuard>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens `url` (`sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`), creating the file and
    /// its parent directory if missing, and runs the migrations.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_with_wal_bound(url, WAL_BOUND_BYTES).await
    }

    /// [`SqliteStore::connect`] with the WAL kept under `wal_bound` bytes instead of 64 MiB.
    pub async fn connect_with_wal_bound(url: &str, wal_bound: i64) -> StoreResult<Self> {
        let in_memory = is_in_memory(url);
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl(e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            // Whenever the WAL is rewound, a file grown past this is cut back to it.
            .pragma("journal_size_limit", wal_bound.to_string());
        if !in_memory {
            create_parent_dir(options.get_filename()).await?;
        }
        // A connection to a local file does not go stale: testing it before each use would be
        // one more round trip to its worker thread for every statement.
        let mut pool_options = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false);
        if in_memory {
            // A shared-cache in-memory database lives only while a connection is open.
            pool_options = pool_options
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let writer_options = pool_options.clone().max_connections(1);
        let pool = pool_options
            .connect_with(options.clone())
            .await
            .map_err(StoreError::Connect)?;
        MIGRATOR.run(&pool).await.map_err(StoreError::Migrate)?;
        // An in-memory database is one per pool: both roles share the one pool there, and it
        // has no WAL to checkpoint.
        if in_memory {
            return Ok(Self {
                writer: pool.clone(),
                pool,
                _checkpointer: None,
            });
        }
        // The writer never checkpoints: a checkpoint copies the WAL into the database file and
        // syncs both, which would hold every queued write behind the disk. A reader does it.
        let writer = writer_options
            .connect_with(options.pragma("wal_autocheckpoint", "0"))
            .await
            .map_err(StoreError::Connect)?;
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(checkpoint_periodically(
            pool.clone(),
            writer.clone(),
            wal_bound,
            stop.clone(),
        ));
        Ok(Self {
            pool,
            writer,
            _checkpointer: Some(stop.drop_guard()),
        })
    }
}

/// Copies the WAL back into the database file every [`CHECKPOINT_EVERY`], on a reading
/// connection, until `stop`. A passive checkpoint waits for nobody; but under steady load some
/// reader always holds an old snapshot, the WAL is never rewound and grows without bound, so
/// once it passes `wal_bound` bytes a TRUNCATE checkpoint waits (up to the busy timeout)
/// for the readers to move on, copies the rest and empties the file.
///
/// Once no write has come for [`QUIET_TICKS`] ticks after a busy spell, the writer and a reader
/// give their page caches back (`PRAGMA shrink_memory`), and the heap is trimmed: a burst of
/// thousands of sessions leaves megabytes of cached pages that nothing will read soon.
async fn checkpoint_periodically(
    pool: SqlitePool,
    writer: SqlitePool,
    wal_bound: i64,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = QuietWatch::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if pool.is_closed() {
            break;
        }
        let checked = checkpoint(&pool, "PASSIVE").await;
        if let Ok(wal_bytes) = checked
            && quiet.fell_quiet(wal_bytes)
        {
            shrink_caches(&pool, &writer).await;
        }
        match checked {
            Ok(wal_bytes) if wal_bytes > wal_bound => match truncate_briefly(&pool).await {
                Ok(left) => tracing::debug!(wal_bytes, left, "WAL past its bound; truncated"),
                Err(err) if !pool.is_closed() => {
                    tracing::debug!(%err, wal_bytes, "WAL past its bound and not truncated; retrying at the next tick");
                }
                Err(_) => {}
            },
            Ok(_) => {}
            Err(err) if !pool.is_closed() => {
                tracing::warn!(%err, "WAL checkpoint failed; retrying at the next tick");
            }
            Err(_) => {}
        }
    }
}

/// Ticks without a write after which the page caches are given back.
const QUIET_TICKS: u32 = 10;

/// Tells, from the WAL's size at each tick, when writing has stopped for [`QUIET_TICKS`].
#[derive(Debug, Default)]
struct QuietWatch {
    /// The WAL's size at the last tick; `None` before the first.
    last: Option<i64>,
    /// Ticks since it last changed.
    quiet: u32,
}

impl QuietWatch {
    /// Takes a tick's WAL size; true once per quiet spell, when it has not changed for
    /// [`QUIET_TICKS`] ticks.
    fn fell_quiet(&mut self, wal_bytes: i64) -> bool {
        if self.last == Some(wal_bytes) {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.last = Some(wal_bytes);
            self.quiet = 0;
        }
        self.quiet == QUIET_TICKS
    }
}

/// Frees what the writer's and one reader's page caches hold, then trims the heap.
async fn shrink_caches(pool: &SqlitePool, writer: &SqlitePool) {
    for connections in [writer, pool] {
        if let Err(err) = sqlx::query("PRAGMA shrink_memory")
            .execute(connections)
            .await
        {
            tracing::debug!(%err, "could not shrink a connection's cache");
        }
    }
    crate::heap::trim_soon();
}

/// How long a TRUNCATE checkpoint under load may wait for readers. It holds the write lock
/// meanwhile, so this is how long it may stall the writer; a miss is tried again a tick later.
const TRUNCATE_WAIT_MS: u64 = 50;

/// A TRUNCATE checkpoint that gives up after [`TRUNCATE_WAIT_MS`] rather than the busy
/// timeout; the WAL's size it leaves.
async fn truncate_briefly(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    sqlx::query(&format!("PRAGMA busy_timeout = {TRUNCATE_WAIT_MS}"))
        .execute(&mut *connection)
        .await?;
    let outcome: Result<(i64, i64, i64), sqlx::Error> =
        sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut *connection)
            .await;
    sqlx::query(&format!(
        "PRAGMA busy_timeout = {}",
        BUSY_TIMEOUT.as_millis()
    ))
    .execute(&mut *connection)
    .await?;
    let (busy, frames, _) = outcome?;
    if busy != 0 {
        return Err(sqlx::Error::Protocol(
            "readers kept the WAL busy; truncating next time".into(),
        ));
    }
    Ok(frames.max(0))
}

/// Runs `PRAGMA wal_checkpoint(MODE)`; the WAL's size in bytes it leaves (0 once rewound).
async fn checkpoint(pool: &SqlitePool, mode: &str) -> Result<i64, sqlx::Error> {
    let (_busy, frames, _copied): (i64, i64, i64) =
        sqlx::query_as(&format!("PRAGMA wal_checkpoint({mode})"))
            .fetch_one(pool)
            .await?;
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(pool)
        .await?;
    // Each frame is a page and its 24-byte header; -1 frames means not in WAL mode.
    Ok(frames.max(0) * (page_size + 24))
}

/// Writes a consistent copy of the SQLite store at `url` into `file` (`VACUUM INTO`), while a
/// server may be writing to it; the copy's size in bytes. The file must not exist. A
/// PostgreSQL store is refused, naming `pg_dump`.
pub async fn backup(url: &str, file: &Path) -> StoreResult<u64> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(StoreError::InvalidUrl(
            "backup copies a SQLite store; for PostgreSQL use pg_dump".into(),
        ));
    }
    if is_in_memory(url) {
        return Err(StoreError::InvalidUrl(
            "an in-memory database has nothing to back up".into(),
        ));
    }
    if file.exists() {
        return Err(StoreError::Conflict(format!(
            "{} exists already; name a new file",
            file.display()
        )));
    }
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::InvalidUrl(e.to_string()))?
        .busy_timeout(BUSY_TIMEOUT);
    if !options.get_filename().exists() {
        return Err(StoreError::NotFound(format!(
            "no database at {}",
            options.get_filename().display()
        )));
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.read_only(true))
        .await
        .map_err(StoreError::Connect)?;
    let copied = sqlx::query("VACUUM INTO ?")
        .bind(file.to_string_lossy().into_owned())
        .execute(&pool)
        .await
        .map_err(db_error);
    pool.close().await;
    copied?;
    Ok(std::fs::metadata(file).map(|m| m.len()).unwrap_or(0))
}

/// Whether the URL names an in-memory database, which has no file or directory to create.
fn is_in_memory(url: &str) -> bool {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|p| p == "mode=memory")
}

/// Creates the directory the database file goes in, so a fresh data dir works.
async fn create_parent_dir(file: &Path) -> StoreResult<()> {
    let Some(parent) = file.parent() else {
        return Ok(());
    };
    if parent.as_os_str().is_empty() {
        return Ok(());
    }
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| StoreError::Connect(sqlx::Error::Io(e)))
}

/// The stored form of a timestamp: UTC, microseconds, fixed width.
fn ts(at: OffsetDateTime) -> StoreResult<String> {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");
    at.to_offset(time::UtcOffset::UTC)
        .format(format)
        .map_err(decode_error)
}

fn parse_ts(text: &str) -> StoreResult<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).map_err(decode_error)
}

fn get_ts(row: &SqliteRow, column: &str) -> StoreResult<OffsetDateTime> {
    let text: String = row.try_get(column).map_err(db_error)?;
    parse_ts(&text)
}

fn get_opt_ts(row: &SqliteRow, column: &str) -> StoreResult<Option<OffsetDateTime>> {
    let text: Option<String> = row.try_get(column).map_err(db_error)?;
    text.as_deref().map(parse_ts).transpose()
}

fn get_json(row: &SqliteRow, column: &str) -> StoreResult<Value> {
    let text: String = row.try_get(column).map_err(db_error)?;
    serde_json::from_str(&text).map_err(decode_error)
}

/// The insert of a new session's row, created (and last updated) at `now_text`.
fn session_insert<'q>(
    new: &'q NewSession,
    now_text: &'q str,
) -> sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>> {
    sqlx::query(
        "INSERT INTO sessions (session_id, user_name, title, cwd, created_at, updated_at, \
         last_seq, parent_session_id, agent) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
    )
    .bind(&new.session_id)
    .bind(&new.user_name)
    .bind(&new.title)
    .bind(&new.cwd)
    .bind(now_text)
    .bind(now_text)
    .bind(&new.parent_session_id)
    .bind(&new.agent)
}

/// Appends one message of a session's history; returns its index.
async fn insert_message<'c, E>(
    executor: E,
    session_id: &str,
    message: &Value,
    event_seq: i64,
) -> StoreResult<i64>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    sqlx::query_scalar(super::sql::INSERT_MESSAGE)
        .bind(session_id)
        .bind(json_text(message)?)
        .bind(ts(timestamp_now())?)
        .bind(event_seq)
        .fetch_one(executor)
        .await
        .map_err(db_error)
}

/// Records one cost row.
async fn insert_cost<'c, E>(executor: E, row: &CostRow) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    sqlx::query(super::sql::INSERT_COST)
        .bind(&row.session_id)
        .bind(&row.node_id)
        .bind(&row.model)
        .bind(row.reserved_usd)
        .bind(row.actual_usd)
        .bind(row.tokens_in)
        .bind(row.tokens_out)
        .bind(row.tokens_cached)
        .bind(row.committed)
        .bind(&row.turn_id)
        .bind(&row.task_id)
        .bind(ts(row.created_at)?)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// Rows in one INSERT of events: 5 parameters each, far below SQLite's limit of 32,766.
const ROWS_PER_INSERT: usize = 64;

/// One INSERT of `events` (at most [`ROWS_PER_INSERT`]).
async fn insert_events<'c, E>(executor: E, events: &[NewEvent]) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let sql = insert_events_sql(events.len());
    let mut query = sqlx::query(&sql);
    for event in events {
        query = query
            .bind(&*event.session_id)
            .bind(event.seq)
            .bind(&event.method)
            .bind(&*event.params_json)
            .bind(ts(event.created_at)?);
    }
    query.execute(executor).await.map_err(db_error)?;
    Ok(())
}

/// The INSERT of `rows` events.
fn insert_events_sql(rows: usize) -> String {
    let mut sql =
        String::from("INSERT INTO events (session_id, seq, method, params, created_at) VALUES ");
    for row in 0..rows {
        if row > 0 {
            sql.push(',');
        }
        sql.push_str("(?, ?, ?, ?, ?)");
    }
    sql
}

/// Inserts `task`, or updates the fields of it that change.
async fn upsert_task<'c, E>(executor: E, task: &TaskRow) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let finished_at = task.finished_at.map(ts).transpose()?;
    sqlx::query(super::sql::UPSERT_TASK)
        .bind(&task.task_id)
        .bind(&task.session_id)
        .bind(&task.tool_call_id)
        .bind(&task.tool_name)
        .bind(task.state.as_str())
        .bind(task.exit_code)
        .bind(&task.reason)
        .bind(task.total_bytes)
        .bind(&task.output_path)
        .bind(ts(task.created_at)?)
        .bind(finished_at)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// Clears a session's open-work mark if no event came since `last_seq`.
async fn mark_no_open_work<'c, E>(executor: E, session_id: &str, last_seq: i64) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    sqlx::query(super::sql::MARK_NO_OPEN_WORK)
        .bind(session_id)
        .bind(last_seq)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// One write on `executor`; its answer.
async fn write_one<'c, E>(executor: E, write: &Write) -> StoreResult<i64>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    match write {
        Write::Events(events) if events.is_empty() => Ok(0),
        Write::Events(events) => insert_events(executor, events).await.map(|()| 0),
        Write::Message {
            session_id,
            message,
            event_seq,
        } => insert_message(executor, session_id, message, *event_seq).await,
        Write::Cost(row) => insert_cost(executor, row).await.map(|()| 0),
        Write::Task(task) => upsert_task(executor, task).await.map(|()| 0),
        Write::NoOpenWork {
            session_id,
            last_seq,
        } => mark_no_open_work(executor, session_id, *last_seq)
            .await
            .map(|()| 0),
    }
}

fn json_text(value: &Value) -> StoreResult<String> {
    serde_json::to_string(value).map_err(decode_error)
}

fn get<'r, T>(row: &'r SqliteRow, column: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(column).map_err(db_error)
}

impl StoredRow for SqliteRow {
    decoded_columns!();

    fn json(&self, column: &str) -> StoreResult<Value> {
        get_json(self, column)
    }
    fn time(&self, column: &str) -> StoreResult<OffsetDateTime> {
        get_ts(self, column)
    }
    fn opt_time(&self, column: &str) -> StoreResult<Option<OffsetDateTime>> {
        get_opt_ts(self, column)
    }
}

#[async_trait]
impl Writer for SqliteStore {
    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        // One statement in autocommit is a single round trip to the connection's worker
        // thread: the quiet server's case, and a group commit's batch of events alone. Event
        // rows go in statements of at most ROWS_PER_INSERT, so the statement cache holds every
        // variant; a longer batch is several in one transaction.
        if let [write] = writes
            && write.rows() <= ROWS_PER_INSERT
        {
            return Ok(vec![write_one(&self.writer, write).await?]);
        }
        let mut tx = self.writer.begin().await.map_err(db_error)?;
        let mut answers = Vec::with_capacity(writes.len());
        for write in writes {
            answers.push(match write {
                Write::Events(events) => {
                    for chunk in events.chunks(ROWS_PER_INSERT) {
                        insert_events(&mut *tx, chunk).await?;
                    }
                    0
                }
                other => write_one(&mut *tx, other).await?,
            });
        }
        tx.commit().await.map_err(db_error)?;
        Ok(answers)
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn close(&self) {
        self.writer.close().await;
        // The last word: everything into the database file and the WAL emptied, so a stopped
        // server leaves no large WAL behind.
        if let Err(err) = checkpoint(&self.pool, "TRUNCATE").await {
            tracing::warn!(%err, "WAL not truncated at close");
        }
        self.pool.close().await;
    }

    async fn upsert_user(&self, name: &str) -> StoreResult<()> {
        sqlx::query(super::sql::UPSERT_USER)
            .bind(name)
            .bind(ts(timestamp_now())?)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn create_session(&self, new: &NewSession) -> StoreResult<SessionRow> {
        let now = timestamp_now();
        let now_text = ts(now)?;
        let insert = session_insert(new, &now_text);
        match &new.user_name {
            // Without a user the session is one statement, in autocommit.
            None => {
                insert.execute(&self.writer).await.map_err(db_error)?;
            }
            Some(user) => {
                let mut tx = self.writer.begin().await.map_err(db_error)?;
                sqlx::query(
                    "INSERT INTO users (name, created_at) VALUES (?, ?) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .bind(user)
                .bind(&now_text)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                insert.execute(&mut *tx).await.map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
            }
        }
        Ok(SessionRow {
            session_id: new.session_id.clone(),
            user_name: new.user_name.clone(),
            title: new.title.clone(),
            cwd: new.cwd.clone(),
            created_at: now,
            updated_at: now,
            last_seq: 0,
            parent_session_id: new.parent_session_id.clone(),
            agent: new.agent.clone(),
            model: None,
            reasoning_effort: None,
            worktree: None,
        })
    }

    async fn fork_session(&self, new: &NewSession, up_to_seq: i64) -> StoreResult<SessionRow> {
        let source = new
            .parent_session_id
            .as_deref()
            .ok_or_else(|| StoreError::NotFound("a fork names its source session".into()))?;
        let now_text = ts(timestamp_now())?;
        let mut tx = self.writer.begin().await.map_err(db_error)?;
        session_insert(new, &now_text)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // In seq order, which the trigger keeping last_seq demands.
        sqlx::query(
            "INSERT INTO events (session_id, seq, method, params, created_at) \
             SELECT ?, seq, method, json_set(params, '$.session_id', ?), created_at FROM events \
             WHERE session_id = ? AND seq <= ? ORDER BY seq",
        )
        .bind(&new.session_id)
        .bind(&new.session_id)
        .bind(source)
        .bind(up_to_seq)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        sqlx::query(
            "INSERT INTO messages (session_id, idx, message, created_at, event_seq) \
             SELECT ?, idx, message, created_at, event_seq FROM messages \
             WHERE session_id = ? AND event_seq <= ?",
        )
        .bind(&new.session_id)
        .bind(source)
        .bind(up_to_seq)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // The copied events are closed work (the cut is at a turn boundary), and what the source
        // had spent up to the cut is the fork's inheritance.
        sqlx::query(
            "UPDATE sessions SET live_from_seq = NULL, inherited_usd = \
             (SELECT inherited_usd FROM sessions WHERE session_id = ?) + COALESCE( \
             (SELECT SUM(actual_usd) FROM cost_rows WHERE session_id = ? AND created_at <= \
             (SELECT created_at FROM events WHERE session_id = ? AND seq = ?)), 0) \
             WHERE session_id = ?",
        )
        .bind(source)
        .bind(source)
        .bind(source)
        .bind(up_to_seq)
        .bind(&new.session_id)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        let row = sqlx::query(super::sql::GET_SESSION)
            .bind(&new.session_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
        let row = session_row(&row)?;
        tx.commit().await.map_err(db_error)?;
        Ok(row)
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRow>> {
        let row = sqlx::query(super::sql::GET_SESSION)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.as_ref().map(session_row).transpose()
    }

    async fn list_sessions(
        &self,
        user: Option<&str>,
        page: &SessionPage,
    ) -> StoreResult<Vec<SessionRow>> {
        // `IS` matches NULL to NULL, so one statement serves both cases; a row value compares
        // both keys of the order at once.
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE user_name IS ? \
             AND (? IS NULL OR (updated_at, session_id) < (?, ?)) \
             ORDER BY updated_at DESC, session_id DESC LIMIT ?"
        );
        let after_at = page.after.as_ref().map(|(at, _)| ts(*at)).transpose()?;
        let after_id = page.after.as_ref().map(|(_, id)| id.as_str());
        let rows = sqlx::query(&sql)
            .bind(user)
            .bind(after_at.as_deref())
            .bind(after_at.as_deref())
            .bind(after_id)
            .bind(page.limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(session_row).collect()
    }

    async fn count_sessions(&self, user: Option<&str>) -> StoreResult<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE user_name IS ?")
            .bind(user)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn delete_session(&self, session_id: &str) -> StoreResult<bool> {
        let done = sqlx::query(super::sql::DELETE_SESSION)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_session_model(
        &self,
        session_id: &str,
        model: Option<&str>,
        reasoning_effort: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(super::sql::SET_SESSION_MODEL)
            .bind(model)
            .bind(reasoning_effort)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn set_session_worktree(
        &self,
        session_id: &str,
        cwd: &str,
        worktree: Option<&SessionWorktree>,
    ) -> StoreResult<()> {
        let worktree = worktree
            .map(serde_json::to_string)
            .transpose()
            .map_err(decode_error)?;
        sqlx::query(super::sql::SET_SESSION_WORKTREE)
            .bind(cwd)
            .bind(worktree)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn set_title_if_unset(&self, session_id: &str, title: &str) -> StoreResult<bool> {
        let done = sqlx::query(super::sql::SET_TITLE_IF_UNSET)
            .bind(title)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }

    async fn idle_sessions(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(super::sql::IDLE_SESSIONS)
            .bind(ts(before)?)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn prune_events(&self, before: OffsetDateTime) -> StoreResult<u64> {
        let done = sqlx::query(
            "DELETE FROM events WHERE created_at < ? AND seq <= COALESCE( \
             (SELECT s.live_from_seq FROM sessions s WHERE s.session_id = events.session_id), \
             seq)",
        )
        .bind(ts(before)?)
        .execute(&self.writer)
        .await
        .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn prune_tasks(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(super::sql::PRUNE_TASKS)
            .bind(ts(before)?)
            .fetch_all(&self.writer)
            .await
            .map_err(db_error)
    }

    async fn inherited_usd(&self, session_id: &str) -> StoreResult<f64> {
        let usd: Option<f64> = sqlx::query_scalar(super::sql::INHERITED_USD)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(usd.unwrap_or(0.0))
    }

    async fn sessions_with_open_work(&self) -> StoreResult<Vec<(String, i64)>> {
        sqlx::query_as(super::sql::SESSIONS_WITH_OPEN_WORK)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn set_session_title(&self, session_id: &str, title: &str) -> StoreResult<()> {
        let done = sqlx::query(super::sql::SET_SESSION_TITLE)
            .bind(title)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("session {session_id}")));
        }
        Ok(())
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> StoreResult<Vec<EventRow>> {
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(super::sql::EVENTS_AFTER)
            .bind(session_id)
            .bind(after_seq)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(event_row).collect()
    }

    async fn messages(&self, session_id: &str) -> StoreResult<Vec<Value>> {
        let rows = sqlx::query(super::sql::MESSAGES)
            .bind(session_id)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(|row| get_json(row, "message")).collect()
    }

    async fn get_task(&self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        let row = sqlx::query(super::sql::GET_TASK)
            .bind(task_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.as_ref().map(task_row).transpose()
    }

    async fn list_tasks(&self, session_id: &str) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(super::sql::LIST_TASKS)
            .bind(session_id)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(task_row).collect()
    }

    async fn fail_running_tasks(&self, reason: &str) -> StoreResult<u64> {
        let done = sqlx::query(super::sql::FAIL_RUNNING_TASKS)
            .bind(reason)
            .bind(ts(timestamp_now())?)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn fail_running_tasks_of(&self, session_id: &str, reason: &str) -> StoreResult<u64> {
        let done = sqlx::query(super::sql::FAIL_RUNNING_TASKS_OF)
            .bind(reason)
            .bind(ts(timestamp_now())?)
            .bind(session_id)
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn cost_rows(&self, session_id: &str) -> StoreResult<Vec<CostRow>> {
        let rows = sqlx::query(super::sql::COST_ROWS)
            .bind(session_id)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(cost_row).collect()
    }
}

#[cfg(test)]
mod quiet_tests {
    use super::*;

    #[test]
    fn the_caches_are_given_back_once_per_quiet_spell() {
        let mut watch = QuietWatch::default();
        // Writes: the WAL changes at every tick.
        assert!(!(0..50).any(|tick| watch.fell_quiet(tick * 4096)));
        // Quiet: the first tick at the new size still saw a write; once QUIET_TICKS more pass
        // unchanged, the caches go, once.
        let fired: Vec<u32> = (1..=3 * QUIET_TICKS)
            .filter(|_| watch.fell_quiet(999_999))
            .collect();
        assert_eq!(fired, [QUIET_TICKS + 1]);
        // A write (here a WAL truncated to nothing) starts a new spell.
        assert!(!watch.fell_quiet(0));
        let fired = (1..=2 * QUIET_TICKS)
            .filter(|_| watch.fell_quiet(0))
            .count();
        assert_eq!(fired, 1);
    }
}
