//! The SQLite store's one writing connection: a thread of its own owning a rusqlite
//! connection, which takes every write queued while it committed the last and commits them
//! together (group commit), then answers each caller.
//!
//! Why not sqlx's connection: sqlx hands every statement, every row and the `BEGIN` and
//! `COMMIT` of a transaction to its connection's worker thread and back, a wake-up each way.
//! Here a caller's writes, whatever they hold, cost one hand-off to the thread and one back,
//! and callers who write at once share one commit. A write is answered only once committed,
//! so an event is still durable before anyone is shown it.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::{json_text, ts};
use crate::store::{NewEvent, StoreError, StoreResult, Write, sql, timestamp_now};

/// About the most rows one commit carries; more waiting go in the next.
const MAX_BATCH: usize = 64;
/// Prepared statements the connection keeps: every statement it runs, with room to spare.
const STATEMENT_CACHE: usize = 48;

/// The event insert, one row at a time: in the writer's own thread a prepared statement's
/// step costs microseconds, so a multi-row statement (one per row count) would only fill the
/// statement cache.
const INSERT_EVENT: &str = "INSERT INTO events (session_id, seq, method, params, created_at) \
     VALUES ($1, $2, $3, $4, $5)";

/// A write other than a session's work (a session created, a title set, a prune), run on the
/// writer's connection; it answers through a channel of its own.
type Apply = Box<dyn FnOnce(&mut Connection) + Send>;

/// What the thread is asked to do.
enum Job {
    /// One caller's writes, all or none; answered per write.
    Writes {
        writes: Vec<Write>,
        done: oneshot::Sender<StoreResult<Vec<i64>>>,
    },
    /// Any other write, on its own.
    Apply(Apply),
    /// Count each commit of writes here from now on.
    CountIn(Counter),
    /// Close the connection and end, after what was queued before.
    Stop(oneshot::Sender<()>),
}

/// How the writing thread is reached; it ends once every handle is gone or it is stopped,
/// after committing what was queued.
#[derive(Clone)]
pub(super) struct WriterThread {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for WriterThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterThread").finish_non_exhaustive()
    }
}

/// The write connection's settings: the readers' (WAL, `synchronous = NORMAL`, foreign keys),
/// and no checkpoints of its own: a checkpoint copies the WAL into the database file and syncs
/// both, which would hold every queued write behind the disk. A reader does it.
fn open(path: &Path, busy_timeout: Duration, wal_bound: i64) -> rusqlite::Result<Connection> {
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    connection.busy_timeout(busy_timeout)?;
    connection.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
         PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {wal_bound};"
    ))?;
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(connection)
}

impl WriterThread {
    /// Opens the database at `path` for writing and starts its thread.
    pub(super) async fn start(
        path: &Path,
        busy_timeout: Duration,
        wal_bound: i64,
    ) -> StoreResult<Self> {
        let (jobs, queue) = mpsc::channel();
        let (opened, outcome) = oneshot::channel();
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("agentd-sqlite-writer".into())
            .spawn(move || match open(&path, busy_timeout, wal_bound) {
                Ok(connection) => {
                    let _ = opened.send(Ok(()));
                    run(connection, &queue);
                }
                Err(err) => {
                    let _ = opened.send(Err(err));
                }
            })
            .map_err(|err| StoreError::Connect(sqlx::Error::Io(err)))?;
        match outcome.await {
            Ok(Ok(())) => Ok(Self { jobs }),
            Ok(Err(err)) => Err(StoreError::Sqlite(err)),
            Err(_) => Err(writer_gone()),
        }
    }

    /// Commits one caller's `writes` together, all or none, perhaps beside other callers'.
    pub(super) async fn write_all(&self, writes: Vec<Write>) -> StoreResult<Vec<i64>> {
        let (done, outcome) = oneshot::channel();
        self.jobs
            .send(Job::Writes { writes, done })
            .map_err(|_| writer_gone())?;
        outcome.await.unwrap_or_else(|_| Err(writer_gone()))
    }

    /// Runs `apply` on the writing connection, after the writes queued before it; its answer.
    pub(super) async fn apply<T: Send + 'static>(
        &self,
        apply: impl FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (done, outcome) = oneshot::channel();
        let job: Apply = Box::new(move |connection| {
            let _ = done.send(apply(connection));
        });
        self.jobs.send(Job::Apply(job)).map_err(|_| writer_gone())?;
        outcome.await.unwrap_or_else(|_| Err(writer_gone()))
    }

    /// Counts each commit of writes in `batches` from now on.
    pub(super) fn count_in(&self, batches: Counter) {
        let _ = self.jobs.send(Job::CountIn(batches));
    }

    /// Commits what is queued, closes the connection and ends the thread; later writes fail.
    pub(super) async fn stop(&self) {
        let (done, stopped) = oneshot::channel();
        if self.jobs.send(Job::Stop(done)).is_ok() {
            let _ = stopped.await;
        }
    }
}

fn writer_gone() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

/// One caller's writes waiting for their commit, with where to answer.
type Waiting = (Vec<Write>, oneshot::Sender<StoreResult<Vec<i64>>>);

/// The thread: a job, and with a caller's writes every other caller's already queued (up to
/// about [`MAX_BATCH`] rows), committed together.
fn run(mut connection: Connection, queue: &mpsc::Receiver<Job>) {
    let mut batches: Option<Counter> = None;
    let mut next: Option<Job> = None;
    let mut batch: Vec<Waiting> = Vec::new();
    loop {
        let Some(job) = next.take().or_else(|| queue.recv().ok()) else {
            break;
        };
        match job {
            Job::Writes { writes, done } => {
                let mut rows: usize = writes.iter().map(Write::rows).sum();
                batch.push((writes, done));
                while rows < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(Job::Writes { writes, done }) => {
                            rows += writes.iter().map(Write::rows).sum::<usize>();
                            batch.push((writes, done));
                        }
                        // Anything else waits its turn, after this batch.
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                commit_batch(&mut connection, &mut batch, batches.as_ref());
            }
            Job::Apply(apply) => apply(&mut connection),
            Job::CountIn(counter) => batches = Some(counter),
            Job::Stop(done) => {
                if let Err((_, err)) = connection.close() {
                    tracing::warn!(%err, "the SQLite writer did not close cleanly");
                }
                let _ = done.send(());
                return;
            }
        }
    }
}

/// Commits the waiting callers' writes in one transaction and answers each. One bad write (its
/// session deleted meanwhile, a stale seq) must not fail the others: nothing of the batch was
/// stored, so each caller's writes are then tried alone for their own answer.
fn commit_batch(connection: &mut Connection, batch: &mut Vec<Waiting>, batches: Option<&Counter>) {
    let committed = transaction(connection, batch.iter().flat_map(|(writes, _)| writes));
    match committed {
        Ok(answers) => {
            if let Some(batches) = batches {
                batches.inc();
            }
            let mut answers = answers.into_iter();
            for (writes, done) in batch.drain(..) {
                let _ = done.send(Ok(answers.by_ref().take(writes.len()).collect()));
            }
        }
        Err(err) if batch.len() == 1 => {
            if let Some((_, done)) = batch.pop() {
                let _ = done.send(Err(err));
            }
        }
        Err(_) => {
            for (writes, done) in batch.drain(..) {
                let outcome = transaction(connection, &writes);
                if let (Ok(_), Some(batches)) = (&outcome, batches) {
                    batches.inc();
                }
                let _ = done.send(outcome);
            }
        }
    }
}

/// Does `writes` in one transaction, all or none; answers, per write, a message's index or 0.
fn transaction<'w>(
    connection: &mut Connection,
    writes: impl IntoIterator<Item = &'w Write>,
) -> StoreResult<Vec<i64>> {
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error)?;
    let answers = writes
        .into_iter()
        .map(|write| write_one(&tx, write))
        .collect::<StoreResult<Vec<i64>>>()?;
    // A failed COMMIT (a full disk) leaves the transaction open; dropping it rolls it back.
    tx.commit().map_err(sqlite_error)?;
    Ok(answers)
}

/// One write on `connection`, inside the caller's transaction; its answer.
fn write_one(connection: &Connection, write: &Write) -> StoreResult<i64> {
    match write {
        Write::Events(events) => insert_events(connection, events).map(|()| 0),
        Write::Message {
            session_id,
            message,
            event_seq,
        } => {
            let (message, created_at) = (json_text(message)?, ts(timestamp_now())?);
            connection
                .prepare_cached(sql::INSERT_MESSAGE)
                .and_then(|mut insert| {
                    insert.query_row(params![session_id, message, created_at, event_seq], |row| {
                        row.get(0)
                    })
                })
                .map_err(sqlite_error)
        }
        Write::Cost(row) => {
            let created_at = ts(row.created_at)?;
            connection
                .prepare_cached(sql::INSERT_COST)
                .and_then(|mut insert| {
                    insert.execute(params![
                        row.session_id,
                        row.node_id,
                        row.model,
                        row.reserved_usd,
                        row.actual_usd,
                        row.tokens_in,
                        row.tokens_out,
                        row.tokens_cached,
                        row.committed,
                        row.turn_id,
                        row.task_id,
                        created_at
                    ])
                })
                .map(|_| 0)
                .map_err(sqlite_error)
        }
        Write::Task(task) => {
            let created_at = ts(task.created_at)?;
            let finished_at = task.finished_at.map(ts).transpose()?;
            connection
                .prepare_cached(sql::UPSERT_TASK)
                .and_then(|mut upsert| {
                    upsert.execute(params![
                        task.task_id,
                        task.session_id,
                        task.tool_call_id,
                        task.tool_name,
                        task.state.as_str(),
                        task.exit_code,
                        task.reason,
                        task.total_bytes,
                        task.output_path,
                        created_at,
                        finished_at
                    ])
                })
                .map(|_| 0)
                .map_err(sqlite_error)
        }
        Write::NoOpenWork {
            session_id,
            last_seq,
        } => connection
            .prepare_cached(sql::MARK_NO_OPEN_WORK)
            .and_then(|mut mark| mark.execute(params![session_id, last_seq]))
            .map(|_| 0)
            .map_err(sqlite_error),
    }
}

/// Inserts `events` in order; the schema's trigger moves each session's `last_seq`.
fn insert_events(connection: &Connection, events: &[NewEvent]) -> StoreResult<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut insert = connection
        .prepare_cached(INSERT_EVENT)
        .map_err(sqlite_error)?;
    for event in events {
        insert
            .execute(params![
                &*event.session_id,
                event.seq,
                &*event.method,
                &*event.params_json,
                ts(event.created_at)?
            ])
            .map_err(sqlite_error)?;
    }
    Ok(())
}

/// Maps a rusqlite error onto the store's kinds, as `db_error` does sqlx's, so both drivers
/// report a taken key, a missing row and a stale seq alike.
pub(super) fn sqlite_error(err: rusqlite::Error) -> StoreError {
    use rusqlite::ffi;
    if let rusqlite::Error::SqliteFailure(failure, message) = &err {
        let message = message.clone().unwrap_or_else(|| failure.to_string());
        if message.contains(crate::store::SEQ_NOT_PAST_LAST) {
            return StoreError::Conflict(message);
        }
        match failure.extended_code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                return StoreError::Conflict(message);
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => {
                return StoreError::NotFound(format!("referenced row missing ({message})"));
            }
            _ => {}
        }
    }
    StoreError::Sqlite(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rusqlite binds by position, and SQLite numbers a `$N` parameter by where it first
    /// appears; the shared statements are written for sqlx, which binds by the number. They
    /// agree only while each statement's numbers first appear in order.
    #[test]
    fn the_shared_statements_number_their_parameters_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::open(dir.path().join("db")).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE sessions (session_id, user_name, title, cwd, created_at, \
                 updated_at, last_seq, parent_session_id, model, reasoning_effort, agent, \
                 worktree, live_from_seq, inherited_usd); \
                 CREATE TABLE messages (session_id, idx, message, created_at, event_seq); \
                 CREATE TABLE cost_rows (id, session_id, node_id, model, reserved_usd, \
                 actual_usd, tokens_in, tokens_out, tokens_cached, committed, turn_id, task_id, \
                 created_at); \
                 CREATE TABLE tasks (task_id PRIMARY KEY, session_id, tool_call_id, tool_name, \
                 state, exit_code, reason, total_bytes, output_path, created_at, finished_at); \
                 CREATE TABLE users (name PRIMARY KEY, created_at); \
                 CREATE TABLE events (session_id, seq, method, params, created_at);",
            )
            .unwrap();
        for statement in [
            INSERT_EVENT,
            super::super::INSERT_SESSION,
            sql::INSERT_MESSAGE,
            sql::INSERT_COST,
            sql::UPSERT_TASK,
            sql::MARK_NO_OPEN_WORK,
            sql::UPSERT_USER,
            sql::DELETE_SESSION,
            sql::SET_SESSION_MODEL,
            sql::SET_SESSION_WORKTREE,
            sql::SET_TITLE_IF_UNSET,
            sql::SET_SESSION_TITLE,
            sql::PRUNE_TASKS,
            sql::FAIL_RUNNING_TASKS,
            sql::FAIL_RUNNING_TASKS_OF,
        ] {
            let prepared = connection.prepare(statement).unwrap();
            let count = prepared.parameter_count();
            assert!(count > 0, "{statement}");
            for index in 1..=count {
                assert_eq!(
                    prepared.parameter_name(index),
                    Some(format!("${index}").as_str()),
                    "{statement}"
                );
            }
        }
    }

    fn event(session_id: &str, seq: i64) -> Write {
        Write::Events(vec![NewEvent::now(
            session_id.into(),
            seq,
            "message/delta",
            &serde_json::json!({"seq": seq}),
        )])
    }

    /// Queues `writes`, one caller each, while the thread is held busy, then lets it go; each
    /// caller's answer, and how many commits they took.
    async fn queued_while_busy(
        writer: &WriterThread,
        batches: &Counter,
        writes: Vec<Write>,
    ) -> (Vec<StoreResult<Vec<i64>>>, u64) {
        let (busy, is_busy) = oneshot::channel();
        let (release, released) = mpsc::channel::<()>();
        let held = writer.clone();
        let hold = tokio::spawn(async move {
            held.apply(move |_| {
                let _ = busy.send(());
                let _ = released.recv();
                Ok(())
            })
            .await
        });
        is_busy.await.unwrap();
        let before = batches.get();
        let mut all = Box::pin(futures_util::future::join_all(
            writes
                .into_iter()
                .map(|write| writer.write_all(vec![write])),
        ));
        // One poll sends every caller's job to the held thread.
        assert!(futures_util::poll!(&mut all).is_pending());
        release.send(()).unwrap();
        let answers = all.await;
        hold.await.unwrap().unwrap();
        (answers, batches.get() - before)
    }

    #[tokio::test]
    async fn writes_queued_while_the_writer_commits_are_one_commit_and_a_bad_one_is_answered_alone()
    {
        let store = super::super::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap();
        for id in ["a", "b"] {
            let new = crate::store::NewSession {
                session_id: id.into(),
                user_name: None,
                cwd: ".".into(),
                title: None,
                parent_session_id: None,
                agent: None,
            };
            crate::store::Store::create_session(&store, &new)
                .await
                .unwrap();
        }
        let batches = Counter::default();
        store.writer.count_in(batches.clone());
        let message = |id: &str, n: i64| Write::Message {
            session_id: id.into(),
            message: serde_json::json!({"n": n}),
            event_seq: 0,
        };

        let (answers, commits) = queued_while_busy(
            &store.writer,
            &batches,
            vec![
                event("a", 1),
                message("a", 0),
                event("b", 1),
                message("b", 0),
                message("a", 1),
            ],
        )
        .await;
        let answers: Vec<Vec<i64>> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, [[0], [0], [0], [0], [1]]);
        assert_eq!(commits, 1, "five callers, one commit");

        // A write for a session nobody has fails the batch; each caller is then tried alone,
        // so the bad one gets its own error and the good ones land, in order.
        let (answers, commits) = queued_while_busy(
            &store.writer,
            &batches,
            vec![
                event("a", 2),
                event("missing", 1),
                message("a", 2),
                event("a", 2),
            ],
        )
        .await;
        assert!(answers[0].is_ok(), "{answers:?}");
        assert!(
            matches!(answers[1], Err(StoreError::NotFound(_))),
            "{answers:?}"
        );
        assert_eq!(answers[2].as_ref().unwrap(), &[2]);
        assert!(
            matches!(answers[3], Err(StoreError::Conflict(_))),
            "{answers:?}"
        );
        assert_eq!(commits, 2, "the good two, each alone");
        let last_seq = crate::store::Store::get_session(&store, "a")
            .await
            .unwrap()
            .unwrap()
            .last_seq;
        assert_eq!(last_seq, 2);
    }

    #[tokio::test]
    async fn a_stopped_writer_refuses_what_comes_after() {
        let store = super::super::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap();
        store.writer.stop().await;
        let refused = store.writer.write_all(vec![event("a", 1)]).await;
        assert!(
            matches!(refused, Err(StoreError::Database(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn constraint_failures_read_as_the_store_kinds() {
        let connection = Connection::open_in_memory().unwrap();
        connection
            .execute_batch(
                "PRAGMA foreign_keys = ON; CREATE TABLE a (id PRIMARY KEY); \
                 CREATE TABLE b (a_id REFERENCES a (id)); INSERT INTO a VALUES (1); \
                 CREATE TABLE c (n); CREATE TRIGGER stale BEFORE INSERT ON c BEGIN \
                 SELECT RAISE(ABORT, 'event seq is not past last_seq'); END;",
            )
            .unwrap();
        let taken = connection
            .execute("INSERT INTO a VALUES (1)", [])
            .unwrap_err();
        assert!(matches!(sqlite_error(taken), StoreError::Conflict(_)));
        let missing = connection
            .execute("INSERT INTO b VALUES (2)", [])
            .unwrap_err();
        assert!(matches!(sqlite_error(missing), StoreError::NotFound(_)));
        let stale = connection
            .execute("INSERT INTO c VALUES (1)", [])
            .unwrap_err();
        assert!(matches!(sqlite_error(stale), StoreError::Conflict(_)));
        let other = connection
            .execute("INSERT INTO nowhere VALUES (1)", [])
            .unwrap_err();
        assert!(matches!(sqlite_error(other), StoreError::Sqlite(_)));
    }
}
