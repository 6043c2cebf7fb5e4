//! The SQLite backend: one database file (WAL, `synchronous = NORMAL`, foreign keys on) behind
//! one writing connection, on a thread of its own (`writer`), and a small pool of sqlx
//! readers. Timestamps are fixed-width RFC 3339 TEXT (`2026-01-02T03:04:05.123456Z`) so that
//! text order is time order; JSON is TEXT.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

mod writer;

use writer::{WriterThread, sqlite_error};

use super::rows::{
    SESSION_COLUMNS, StoredRow, cost_row, decoded_columns, event_row, session_row, task_row,
};
use super::{
    CostRow, EventRow, NewSession, SessionPage, SessionRow, SessionWorktree, Store, StoreError,
    StoreResult, TaskRow, Write, Writer, db_error, decode_error, timestamp_now,
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

/// The store on a SQLite file (or a throwaway one, for tests and throwaway servers).
pub struct SqliteStore {
    /// Readers: WAL lets them run beside the writer.
    pool: SqlitePool,
    /// The one connection every write goes through, on a thread of its own. SQLite admits one
    /// writer at a time; a second writing connection would meet the lock and sleep in the busy
    /// handler (1 ms, then longer), while the writer's queue is taken as soon as it is free.
    writer: WriterThread,
    /// Stops the checkpointer when the store goes.
    _checkpointer: tokio_util::sync::DropGuard,
    /// Where a throwaway database (`sqlite::memory:`) lives, removed with the store.
    _scratch: Option<tempfile::TempDir>,
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
    ///
    /// An in-memory URL opens a database file in a private temporary directory instead,
    /// removed when the store is dropped: the writing thread and the readers are separate
    /// connections, which a real in-memory database cannot share.
    pub async fn connect_with_wal_bound(url: &str, wal_bound: i64) -> StoreResult<Self> {
        let scratch = if is_in_memory(url) {
            Some(tempfile::tempdir().map_err(|e| StoreError::Connect(sqlx::Error::Io(e)))?)
        } else {
            None
        };
        let options = match &scratch {
            Some(dir) => SqliteConnectOptions::new().filename(dir.path().join("agentd.db")),
            None => SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::InvalidUrl(e.to_string()))?,
        }
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT)
        // Whenever the WAL is rewound, a file grown past this is cut back to it.
        .pragma("journal_size_limit", wal_bound.to_string());
        create_parent_dir(options.get_filename()).await?;
        // A connection to a local file does not go stale: testing it before each use would be
        // one more round trip to its worker thread for every statement.
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(StoreError::Connect)?;
        MIGRATOR.run(&pool).await.map_err(StoreError::Migrate)?;
        let writer = WriterThread::start(options.get_filename(), BUSY_TIMEOUT, wal_bound).await?;
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
            _checkpointer: stop.drop_guard(),
            _scratch: scratch,
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
    writer: WriterThread,
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
async fn shrink_caches(pool: &SqlitePool, writer: &WriterThread) {
    let shrunk = writer
        .apply(|connection| {
            connection
                .execute_batch("PRAGMA shrink_memory")
                .map_err(sqlite_error)
        })
        .await;
    if let Err(err) = shrunk {
        tracing::debug!(%err, "could not shrink the writer's cache");
    }
    if let Err(err) = sqlx::query("PRAGMA shrink_memory").execute(pool).await {
        tracing::debug!(%err, "could not shrink a reader's cache");
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

/// The insert of a new session's row: session_id, user_name, title, cwd, created_at (also its
/// `updated_at`), parent_session_id, agent.
pub(super) const INSERT_SESSION: &str = "INSERT INTO sessions (session_id, user_name, title, cwd, \
     created_at, updated_at, last_seq, parent_session_id, agent) \
     VALUES ($1, $2, $3, $4, $5, $5, 0, $6, $7)";

/// Inserts a new session's row, created (and last updated) at `now_text`.
fn insert_session(
    connection: &rusqlite::Connection,
    new: &NewSession,
    now_text: &str,
) -> rusqlite::Result<usize> {
    connection
        .prepare_cached(INSERT_SESSION)?
        .execute(rusqlite::params![
            new.session_id,
            new.user_name,
            new.title,
            new.cwd,
            now_text,
            new.parent_session_id,
            new.agent
        ])
}

/// Copies a fork's source into it up to `up_to_seq` (see [`Store::fork_session`]), each named
/// `:source`, `:fork` and `:up_to`: its events in seq order (which the trigger keeping `last_seq`
/// demands), its history written by then, and what it had spent by then as the fork's
/// inheritance. The copied events are closed work: the cut is at a turn boundary.
const FORK_SESSION: [&str; 3] = [
    "INSERT INTO events (session_id, seq, method, params, created_at) \
     SELECT :fork, seq, method, json_set(params, '$.session_id', :fork), created_at FROM events \
     WHERE session_id = :source AND seq <= :up_to ORDER BY seq",
    "INSERT INTO messages (session_id, idx, message, created_at, event_seq) \
     SELECT :fork, idx, message, created_at, event_seq FROM messages \
     WHERE session_id = :source AND event_seq <= :up_to",
    "UPDATE sessions SET live_from_seq = NULL, inherited_usd = \
     (SELECT inherited_usd FROM sessions WHERE session_id = :source) + COALESCE( \
     (SELECT SUM(actual_usd) FROM cost_rows WHERE session_id = :source AND created_at <= \
     (SELECT created_at FROM events WHERE session_id = :source AND seq = :up_to)), 0) \
     WHERE session_id = :fork",
];

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
        self.writer.write_all(writes.to_vec()).await
    }

    async fn write(&self, write: Write) -> StoreResult<i64> {
        let answers = self.writer.write_all(vec![write]).await?;
        Ok(answers.first().copied().unwrap_or(0))
    }

    async fn write_vec(&self, writes: Vec<Write>) -> StoreResult<Vec<i64>> {
        self.writer.write_all(writes).await
    }
}

impl SqliteStore {
    /// Runs one statement with `params` on the writing connection; how many rows it changed.
    async fn execute<P>(&self, statement: &'static str, params: P) -> StoreResult<usize>
    where
        P: rusqlite::Params + Send + 'static,
    {
        self.writer
            .apply(move |connection| {
                connection
                    .prepare_cached(statement)
                    .and_then(|mut prepared| prepared.execute(params))
                    .map_err(sqlite_error)
            })
            .await
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
        self.writer.stop().await;
        // The last word: everything into the database file and the WAL emptied, so a stopped
        // server leaves no large WAL behind.
        if let Err(err) = checkpoint(&self.pool, "TRUNCATE").await {
            tracing::warn!(%err, "WAL not truncated at close");
        }
        self.pool.close().await;
    }

    fn group_commit(self: Arc<Self>, batches: Counter) -> Arc<dyn Writer> {
        // The writing thread commits together whatever queued meanwhile already.
        self.writer.count_in(batches);
        self
    }

    async fn upsert_user(&self, name: &str) -> StoreResult<()> {
        let now = ts(timestamp_now())?;
        self.execute(super::sql::UPSERT_USER, (name.to_owned(), now))
            .await
            .map(drop)
    }

    async fn create_session(&self, new: &NewSession) -> StoreResult<SessionRow> {
        let now = timestamp_now();
        let now_text = ts(now)?;
        let session = new.clone();
        self.writer
            .apply(move |connection| {
                let tx = connection.transaction().map_err(sqlite_error)?;
                if let Some(user) = &session.user_name {
                    tx.prepare_cached(super::sql::UPSERT_USER)
                        .and_then(|mut upsert| upsert.execute((user, &now_text)))
                        .map_err(sqlite_error)?;
                }
                insert_session(&tx, &session, &now_text).map_err(sqlite_error)?;
                tx.commit().map_err(sqlite_error)
            })
            .await?;
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
            .clone()
            .ok_or_else(|| StoreError::NotFound("a fork names its source session".into()))?;
        let now_text = ts(timestamp_now())?;
        let fork = new.clone();
        self.writer
            .apply(move |connection| {
                let tx = connection.transaction().map_err(sqlite_error)?;
                insert_session(&tx, &fork, &now_text).map_err(sqlite_error)?;
                for statement in FORK_SESSION {
                    let params = rusqlite::named_params! {
                        ":source": source,
                        ":fork": fork.session_id,
                        ":up_to": up_to_seq,
                    };
                    tx.execute(statement, params).map_err(sqlite_error)?;
                }
                tx.commit().map_err(sqlite_error)
            })
            .await?;
        // Committed: any reader sees it now.
        self.get_session(&new.session_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("session {}", new.session_id)))
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
        let deleted = self
            .execute(super::sql::DELETE_SESSION, (session_id.to_owned(),))
            .await?;
        Ok(deleted > 0)
    }

    async fn set_session_model(
        &self,
        session_id: &str,
        model: Option<&str>,
        reasoning_effort: Option<&str>,
    ) -> StoreResult<()> {
        let params = (
            model.map(str::to_owned),
            reasoning_effort.map(str::to_owned),
            session_id.to_owned(),
        );
        self.execute(super::sql::SET_SESSION_MODEL, params)
            .await
            .map(drop)
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
        let params = (cwd.to_owned(), worktree, session_id.to_owned());
        self.execute(super::sql::SET_SESSION_WORKTREE, params)
            .await
            .map(drop)
    }

    async fn set_title_if_unset(&self, session_id: &str, title: &str) -> StoreResult<bool> {
        let params = (title.to_owned(), session_id.to_owned());
        Ok(self.execute(super::sql::SET_TITLE_IF_UNSET, params).await? > 0)
    }

    async fn idle_sessions(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(super::sql::IDLE_SESSIONS)
            .bind(ts(before)?)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn prune_events(&self, before: OffsetDateTime) -> StoreResult<u64> {
        let deleted = self
            .execute(
                "DELETE FROM events WHERE created_at < $1 AND seq <= COALESCE( \
                 (SELECT s.live_from_seq FROM sessions s WHERE s.session_id = events.session_id), \
                 seq)",
                (ts(before)?,),
            )
            .await?;
        Ok(deleted as u64)
    }

    async fn prune_tasks(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        let before = ts(before)?;
        self.writer
            .apply(move |connection| {
                let mut prune = connection
                    .prepare_cached(super::sql::PRUNE_TASKS)
                    .map_err(sqlite_error)?;
                let paths = prune
                    .query_map((before,), |row| row.get::<_, String>(0))
                    .map_err(sqlite_error)?;
                paths
                    .collect::<rusqlite::Result<Vec<String>>>()
                    .map_err(sqlite_error)
            })
            .await
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
        let params = (title.to_owned(), session_id.to_owned());
        if self.execute(super::sql::SET_SESSION_TITLE, params).await? == 0 {
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
        let params = (reason.to_owned(), ts(timestamp_now())?);
        let failed = self.execute(super::sql::FAIL_RUNNING_TASKS, params).await?;
        Ok(failed as u64)
    }

    async fn fail_running_tasks_of(&self, session_id: &str, reason: &str) -> StoreResult<u64> {
        let params = (
            reason.to_owned(),
            ts(timestamp_now())?,
            session_id.to_owned(),
        );
        let failed = self
            .execute(super::sql::FAIL_RUNNING_TASKS_OF, params)
            .await?;
        Ok(failed as u64)
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
