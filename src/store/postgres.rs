//! The PostgreSQL backend: the same schema as SQLite with TIMESTAMPTZ and JSONB, over plain TCP
//! (no TLS backend is built in; `sslmode=require` fails to connect).
//!
//! PostgreSQL cannot store NUL in TEXT or JSONB, so NULs in bound strings and JSON become U+FFFD
//! here; everything else round-trips exactly.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::types::Json;
use sqlx::{Connection, Row};
use time::OffsetDateTime;

use super::rows::{
    SESSION_COLUMNS, StoredRow, cost_row, decoded_columns, event_row, session_row, task_row,
};
use super::{
    CostRow, EventRow, NewEvent, NewSession, SessionPage, SessionRow, SessionWorktree, Store,
    StoreError, StoreResult, TaskRow, Write, Writer, db_error, decode_error, json_without_nul,
    timestamp_now, without_nul,
};

/// Connections in the pool.
const MAX_CONNECTIONS: u32 = 8;
/// How long opening the store, or a call waiting for a free connection, may take.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// The store on a PostgreSQL database.
pub struct PostgresStore {
    pool: PgPool,
}

impl std::fmt::Debug for PostgresStore {
    // The pool's options hold the password; print nothing of them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Opens `url` (`postgres://` or `postgresql://`) and runs the migrations.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_with(parse_url(url)?).await
    }

    /// Opens a database with these options and runs the migrations into the first schema of
    /// its `search_path`.
    pub async fn connect_with(options: PgConnectOptions) -> StoreResult<Self> {
        // One direct attempt first: the pool retries a refused connection until its timeout and
        // then reports only "timed out", while start-up wants the real reason, quickly.
        let probe =
            tokio::time::timeout(ACQUIRE_TIMEOUT, sqlx::PgConnection::connect_with(&options))
                .await
                .map_err(|_| {
                    StoreError::Connect(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {} s", ACQUIRE_TIMEOUT.as_secs()),
                    )))
                })?
                .map_err(StoreError::Connect)?;
        // Closing is a courtesy to the server; the probe has done its job either way.
        let _ = probe.close().await;
        // Not pinged before each use: that would be a second round trip for every statement. A
        // connection the server dropped fails the one statement that finds it and is replaced.
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(StoreError::Connect)?;
        MIGRATOR.run(&pool).await.map_err(StoreError::Migrate)?;
        Ok(Self { pool })
    }
}

/// Parses a PostgreSQL URL without echoing it (it may hold a password) in the error.
pub fn parse_url(url: &str) -> StoreResult<PgConnectOptions> {
    PgConnectOptions::from_str(url).map_err(|e| match e {
        sqlx::Error::Configuration(source) => StoreError::InvalidUrl(source.to_string()),
        other => StoreError::InvalidUrl(other.to_string()),
    })
}

fn get<'r, T>(row: &'r PgRow, column: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column).map_err(db_error)
}

fn get_json(row: &PgRow, column: &str) -> StoreResult<Value> {
    let Json(value): Json<Value> = get(row, column)?;
    Ok(value)
}

fn opt_text(value: &Option<String>) -> Option<String> {
    value.as_deref().map(|s| without_nul(s).into_owned())
}

impl StoredRow for PgRow {
    decoded_columns!();

    fn json(&self, column: &str) -> StoreResult<Value> {
        get_json(self, column)
    }
    fn time(&self, column: &str) -> StoreResult<OffsetDateTime> {
        get(self, column)
    }
    fn opt_time(&self, column: &str) -> StoreResult<Option<OffsetDateTime>> {
        get(self, column)
    }
}

#[async_trait]
impl Writer for PostgresStore {
    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        // One statement needs no transaction of its own: one round trip instead of three.
        if let [write] = writes {
            return Ok(vec![write_one(&self.pool, write).await?]);
        }
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let answers = write_in(&mut tx, writes).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(answers)
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    fn group_commit(self: Arc<Self>, batches: Counter) -> Arc<dyn Writer> {
        super::journal::GroupCommit::wrap(self, batches)
    }

    async fn upsert_user(&self, name: &str) -> StoreResult<()> {
        sqlx::query(super::sql::UPSERT_USER)
            .bind(without_nul(name))
            .bind(timestamp_now())
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn create_session(&self, new: &NewSession) -> StoreResult<SessionRow> {
        let now = timestamp_now();
        let user_name = opt_text(&new.user_name);
        let title = opt_text(&new.title);
        let insert = session_insert(new, &user_name, &title, now);
        match &user_name {
            // Without a user the session is one statement, in autocommit.
            None => {
                insert.execute(&self.pool).await.map_err(db_error)?;
            }
            Some(user) => {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                sqlx::query(
                    "INSERT INTO users (name, created_at) VALUES ($1, $2) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .bind(user)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                insert.execute(&mut *tx).await.map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
            }
        }
        Ok(SessionRow {
            session_id: without_nul(&new.session_id).into_owned(),
            user_name,
            title,
            cwd: without_nul(&new.cwd).into_owned(),
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
        let (user_name, title) = (opt_text(&new.user_name), opt_text(&new.title));
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        session_insert(new, &user_name, &title, timestamp_now())
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // In seq order, which the trigger keeping last_seq demands.
        sqlx::query(
            "INSERT INTO events (session_id, seq, method, params, created_at) \
             SELECT $1, seq, method, jsonb_set(params, '{session_id}', to_jsonb($1::text)), \
             created_at FROM events WHERE session_id = $2 AND seq <= $3 ORDER BY seq",
        )
        .bind(without_nul(&new.session_id))
        .bind(without_nul(source))
        .bind(up_to_seq)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        sqlx::query(
            "INSERT INTO messages (session_id, idx, message, created_at, event_seq) \
             SELECT $1, idx, message, created_at, event_seq FROM messages \
             WHERE session_id = $2 AND event_seq <= $3",
        )
        .bind(without_nul(&new.session_id))
        .bind(without_nul(source))
        .bind(up_to_seq)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // The copied events are closed work (the cut is at a turn boundary), and what the source
        // had spent up to the cut is the fork's inheritance.
        sqlx::query(
            "UPDATE sessions SET live_from_seq = NULL, inherited_usd = \
             (SELECT inherited_usd FROM sessions WHERE session_id = $2) + COALESCE( \
             (SELECT SUM(actual_usd) FROM cost_rows WHERE session_id = $2 AND created_at <= \
             (SELECT created_at FROM events WHERE session_id = $2 AND seq = $3)), 0) \
             WHERE session_id = $1",
        )
        .bind(without_nul(&new.session_id))
        .bind(without_nul(source))
        .bind(up_to_seq)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        let row = sqlx::query(super::sql::GET_SESSION)
            .bind(without_nul(&new.session_id))
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
        let row = session_row(&row)?;
        tx.commit().await.map_err(db_error)?;
        Ok(row)
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRow>> {
        let row = sqlx::query(super::sql::GET_SESSION)
            .bind(without_nul(session_id))
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
        // Two statements rather than `IS NOT DISTINCT FROM`, which cannot use the index.
        let who = if user.is_some() {
            "user_name = $1"
        } else {
            "user_name IS NULL AND $1::text IS NULL"
        };
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE {who} \
             AND ($2::timestamptz IS NULL OR (updated_at, session_id) < ($2, $3)) \
             ORDER BY updated_at DESC, session_id DESC LIMIT $4"
        );
        let rows = sqlx::query(&sql)
            .bind(user.map(without_nul))
            .bind(page.after.as_ref().map(|(at, _)| *at))
            .bind(page.after.as_ref().map(|(_, id)| without_nul(id)))
            .bind(page.limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(session_row).collect()
    }

    async fn count_sessions(&self, user: Option<&str>) -> StoreResult<i64> {
        let rows = match user {
            Some(user) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE user_name = $1")
                    .bind(without_nul(user))
                    .fetch_one(&self.pool)
                    .await
            }
            None => {
                sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE user_name IS NULL")
                    .fetch_one(&self.pool)
                    .await
            }
        };
        rows.map_err(db_error)
    }

    async fn delete_session(&self, session_id: &str) -> StoreResult<bool> {
        let done = sqlx::query(super::sql::DELETE_SESSION)
            .bind(without_nul(session_id))
            .execute(&self.pool)
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
            .bind(model.map(without_nul))
            .bind(reasoning_effort.map(without_nul))
            .bind(without_nul(session_id))
            .execute(&self.pool)
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
            .bind(without_nul(cwd))
            .bind(worktree.as_deref().map(without_nul))
            .bind(without_nul(session_id))
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn set_title_if_unset(&self, session_id: &str, title: &str) -> StoreResult<bool> {
        let done = sqlx::query(super::sql::SET_TITLE_IF_UNSET)
            .bind(without_nul(title))
            .bind(without_nul(session_id))
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }

    async fn idle_sessions(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(super::sql::IDLE_SESSIONS)
            .bind(before)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn prune_events(&self, before: OffsetDateTime) -> StoreResult<u64> {
        let done = sqlx::query(
            "DELETE FROM events e WHERE e.created_at < $1 AND e.seq <= COALESCE( \
             (SELECT s.live_from_seq FROM sessions s WHERE s.session_id = e.session_id), e.seq)",
        )
        .bind(before)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn prune_tasks(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(super::sql::PRUNE_TASKS)
            .bind(before)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn inherited_usd(&self, session_id: &str) -> StoreResult<f64> {
        let usd: Option<f64> = sqlx::query_scalar(super::sql::INHERITED_USD)
            .bind(without_nul(session_id))
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
            .bind(without_nul(title))
            .bind(without_nul(session_id))
            .execute(&self.pool)
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
            .bind(without_nul(session_id))
            .bind(after_seq)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(event_row).collect()
    }

    async fn messages(&self, session_id: &str) -> StoreResult<Vec<Value>> {
        let rows = sqlx::query(super::sql::MESSAGES)
            .bind(without_nul(session_id))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(|row| get_json(row, "message")).collect()
    }

    async fn get_task(&self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        let row = sqlx::query(super::sql::GET_TASK)
            .bind(without_nul(task_id))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.as_ref().map(task_row).transpose()
    }

    async fn list_tasks(&self, session_id: &str) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(super::sql::LIST_TASKS)
            .bind(without_nul(session_id))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(task_row).collect()
    }

    async fn fail_running_tasks(&self, reason: &str) -> StoreResult<u64> {
        let done = sqlx::query(super::sql::FAIL_RUNNING_TASKS)
            .bind(without_nul(reason))
            .bind(timestamp_now())
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn fail_running_tasks_of(&self, session_id: &str, reason: &str) -> StoreResult<u64> {
        let done = sqlx::query(super::sql::FAIL_RUNNING_TASKS_OF)
            .bind(without_nul(reason))
            .bind(timestamp_now())
            .bind(without_nul(session_id))
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    async fn cost_rows(&self, session_id: &str) -> StoreResult<Vec<CostRow>> {
        let rows = sqlx::query(super::sql::COST_ROWS)
            .bind(without_nul(session_id))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(cost_row).collect()
    }
}

/// JSON text PostgreSQL's JSONB can hold: escaped NULs (`\u0000`) become U+FFFD. The scan is
/// of the text; only text that may hold one is parsed.
fn json_text_without_nul(text: &str) -> StoreResult<std::borrow::Cow<'_, str>> {
    if !text.contains("\\u0000") {
        return Ok(std::borrow::Cow::Borrowed(text));
    }
    let value: Value = serde_json::from_str(text).map_err(decode_error)?;
    Ok(std::borrow::Cow::Owned(
        json_without_nul(&value).to_string(),
    ))
}

/// Appends events in one statement of fixed text (see [`Write::Events`]).
async fn insert_events<'c, E>(executor: E, events: &[NewEvent]) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    if events.is_empty() {
        return Ok(());
    }
    let owned: Vec<_> = events
        .iter()
        .map(|event| {
            Ok((
                without_nul(&event.session_id),
                without_nul(&event.method),
                json_text_without_nul(&event.params_json)?,
            ))
        })
        .collect::<StoreResult<_>>()?;
    let ids: Vec<&str> = owned.iter().map(|(id, _, _)| id.as_ref()).collect();
    let methods: Vec<&str> = owned.iter().map(|(_, m, _)| m.as_ref()).collect();
    let params: Vec<&str> = owned.iter().map(|(_, _, p)| p.as_ref()).collect();
    let seqs: Vec<i64> = events.iter().map(|event| event.seq).collect();
    let times: Vec<OffsetDateTime> = events.iter().map(|event| event.created_at).collect();
    // One statement of fixed text (prepared once) for any batch; WITH ORDINALITY keeps
    // the rows in the order given, which the seq trigger of `0002_event_log.sql`
    // relies on for several events of one session.
    sqlx::query(
        "INSERT INTO events (session_id, seq, method, params, created_at) \
         SELECT e.session_id, e.seq, e.method, e.params::jsonb, e.created_at \
         FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::timestamptz[]) \
              WITH ORDINALITY AS e (session_id, seq, method, params, created_at, n) \
         ORDER BY e.n",
    )
    .bind(&ids)
    .bind(&seqs)
    .bind(&methods)
    .bind(&params)
    .bind(&times)
    .execute(executor)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Appends one message of a session's history; returns its index.
async fn insert_message<'c, E>(
    executor: E,
    session_id: &str,
    message: &Value,
    event_seq: i64,
) -> StoreResult<i64>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    sqlx::query_scalar(super::sql::INSERT_MESSAGE)
        .bind(without_nul(session_id))
        .bind(Json(json_without_nul(message).as_ref()))
        .bind(timestamp_now())
        .bind(event_seq)
        .fetch_one(executor)
        .await
        .map_err(db_error)
}

/// The insert of a new session's row, created (and last updated) at `now`; `user_name` and
/// `title` as they are stored.
fn session_insert<'q>(
    new: &'q NewSession,
    user_name: &'q Option<String>,
    title: &'q Option<String>,
    now: OffsetDateTime,
) -> sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>> {
    sqlx::query(
        "INSERT INTO sessions (session_id, user_name, title, cwd, created_at, updated_at, \
         last_seq, parent_session_id, agent) VALUES ($1, $2, $3, $4, $5, $5, 0, $6, $7)",
    )
    .bind(without_nul(&new.session_id))
    .bind(user_name)
    .bind(title)
    .bind(without_nul(&new.cwd))
    .bind(now)
    .bind(new.parent_session_id.as_deref().map(without_nul))
    .bind(new.agent.as_deref().map(without_nul))
}

/// Records one cost row.
async fn insert_cost<'c, E>(executor: E, row: &CostRow) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    sqlx::query(super::sql::INSERT_COST)
        .bind(without_nul(&row.session_id))
        .bind(without_nul(&row.node_id))
        .bind(without_nul(&row.model))
        .bind(row.reserved_usd)
        .bind(row.actual_usd)
        .bind(row.tokens_in)
        .bind(row.tokens_out)
        .bind(row.tokens_cached)
        .bind(row.committed)
        .bind(opt_text(&row.turn_id))
        .bind(opt_text(&row.task_id))
        .bind(row.created_at)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// Inserts `task`, or updates the fields of it that change.
async fn upsert_task<'c, E>(executor: E, task: &TaskRow) -> StoreResult<()>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    sqlx::query(super::sql::UPSERT_TASK)
        .bind(without_nul(&task.task_id))
        .bind(without_nul(&task.session_id))
        .bind(without_nul(&task.tool_call_id))
        .bind(without_nul(&task.tool_name))
        .bind(task.state.as_str())
        .bind(task.exit_code)
        .bind(opt_text(&task.reason))
        .bind(task.total_bytes)
        .bind(without_nul(&task.output_path))
        .bind(task.created_at)
        .bind(task.finished_at)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// One write on `executor`; its answer.
async fn write_one<'c, E>(executor: E, write: &Write) -> StoreResult<i64>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    match write {
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
        } => {
            sqlx::query(super::sql::MARK_NO_OPEN_WORK)
                .bind(without_nul(session_id))
                .bind(*last_seq)
                .execute(executor)
                .await
                .map_err(db_error)?;
            Ok(0)
        }
    }
}

/// Does `writes` in order inside the transaction `tx` is in (the caller commits): what a
/// fenced writer runs after checking its lease on the same connection.
pub async fn write_in(tx: &mut sqlx::PgConnection, writes: &[Write]) -> StoreResult<Vec<i64>> {
    let mut answers = Vec::with_capacity(writes.len());
    for write in writes {
        answers.push(write_one(&mut *tx, write).await?);
    }
    Ok(answers)
}
