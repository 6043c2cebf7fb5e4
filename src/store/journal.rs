//! Group commit: [`GroupCommit`] is a [`Store`] whose writes on the turn's path — events,
//! history messages, cost rows — go through one writer, which commits whatever queued while its
//! previous commit ran together, so a busy server pays one commit per batch instead of one per
//! write. Everything else passes straight to the backend.
//!
//! The guarantee callers build on is unchanged: a write returns only once it is committed (or
//! has failed), so an event is durable before anyone is shown it. Each caller awaits its write
//! before making the next (a session's actor its events, a turn its history), so a session's
//! `seq` and history order hold within and across batches, also where several batches are
//! committed at once (PostgreSQL).

use std::sync::Arc;
use time::OffsetDateTime;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{
    CostRow, EventRow, NewEvent, NewSession, SessionPage, SessionRow, Store, StoreError,
    StoreResult, TaskRow, Write,
};

/// About the most writes one batch carries; more waiting go in the next.
const MAX_BATCH: usize = 64;
/// Batches committed at once on PostgreSQL (half its pool).
const POSTGRES_WRITERS: usize = 4;

/// One caller's write waiting for its batch, with where to say how it went (a message's index,
/// else 0).
struct Pending {
    write: Write,
    done: oneshot::Sender<StoreResult<i64>>,
}

/// A store whose event, history and cost writes are group-committed by one writer.
pub struct GroupCommit {
    inner: Arc<dyn Store>,
    queue: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// `inner` with its writer started on the current runtime, counting commits in `batches`.
    /// The writer ends when this store is dropped, after committing what is queued.
    pub fn wrap(inner: Arc<dyn Store>, batches: Counter) -> Arc<dyn Store> {
        let (queue, pending) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(pending));
        // SQLite has one writing connection, so one writer. PostgreSQL commits on several
        // connections at once and flushes their WAL together: a batch waiting for the one in
        // flight would add a flush to every write behind it.
        let writers = if inner.backend() == "postgres" {
            POSTGRES_WRITERS
        } else {
            1
        };
        for _ in 0..writers {
            tokio::spawn(write_batches(
                Arc::clone(&inner),
                Arc::clone(&pending),
                batches.clone(),
            ));
        }
        Arc::new(Self { inner, queue })
    }

    /// Queues `write` for the next batch and waits for its commit.
    async fn commit(&self, write: Write) -> StoreResult<i64> {
        let (done, outcome) = oneshot::channel();
        self.queue
            .send(Pending { write, done })
            .map_err(|_| writer_gone())?;
        outcome.await.unwrap_or_else(|_| Err(writer_gone()))
    }
}

fn writer_gone() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

/// How many rows a write adds, for the batch limit.
fn rows(write: &Write) -> usize {
    match write {
        Write::Events(events) => events.len(),
        Write::Message { .. } | Write::Cost(_) => 1,
        Write::Fence { .. } | Write::Notify { .. } => 0,
    }
}

/// The writer: waits for one write, takes every other one already queued (up to about
/// [`MAX_BATCH`] rows), commits them together — events alone as one statement, a mix as one
/// transaction.
async fn write_batches(
    store: Arc<dyn Store>,
    pending: Arc<Mutex<mpsc::UnboundedReceiver<Pending>>>,
    batches: Counter,
) {
    let mut writes: Vec<Write> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<StoreResult<i64>>> = Vec::new();
    loop {
        // A writer takes its batch under the lock and commits it after letting go, so several
        // writers commit at once while each batch is whatever queued meanwhile.
        {
            let mut queue = pending.lock().await;
            let Some(first) = queue.recv().await else {
                break;
            };
            let mut count = 0;
            let mut next = Some(first);
            while let Some(Pending { write, done }) = next.take() {
                count += rows(&write);
                writes.push(write);
                waiters.push(done);
                if count < MAX_BATCH {
                    next = queue.try_recv().ok();
                }
            }
        }
        match commit_batch(&*store, &writes).await {
            Ok(answers) => {
                batches.inc();
                for (done, answer) in waiters.drain(..).zip(answers) {
                    let _ = done.send(Ok(answer));
                }
            }
            // One bad write (its session deleted meanwhile, a stale seq) must not fail the
            // others: nothing of the batch was stored, so each is tried alone for its own answer.
            Err(err) if waiters.len() == 1 => {
                if let Some(done) = waiters.pop() {
                    let _ = done.send(Err(err));
                }
            }
            Err(_) => {
                for (write, done) in writes.iter().zip(waiters.drain(..)) {
                    let outcome = commit_batch(&*store, std::slice::from_ref(write)).await;
                    if outcome.is_ok() {
                        batches.inc();
                    }
                    let _ = done.send(outcome.map(|answers| answers.first().copied().unwrap_or(0)));
                }
            }
        }
        writes.clear();
    }
}

/// Commits `writes` together: only events, as one statement; one write, as itself; a mix, as
/// one transaction.
async fn commit_batch(store: &dyn Store, writes: &[Write]) -> StoreResult<Vec<i64>> {
    // The quiet server's case: one caller's events, stored as they came, without a copy.
    if let [Write::Events(events)] = writes {
        store.append_events(events).await?;
        return Ok(vec![0]);
    }
    if writes.iter().all(|w| matches!(w, Write::Events(_))) {
        let events: Vec<NewEvent> = writes
            .iter()
            .flat_map(|w| match w {
                Write::Events(events) => events.as_slice(),
                Write::Message { .. }
                | Write::Cost(_)
                | Write::Fence { .. }
                | Write::Notify { .. } => &[],
            })
            .cloned()
            .collect();
        store.append_events(&events).await?;
        return Ok(vec![0; writes.len()]);
    }
    match writes {
        [
            Write::Message {
                session_id,
                message,
                event_seq,
            },
        ] => Ok(vec![
            store
                .append_message(session_id, message, *event_seq)
                .await?,
        ]),
        [Write::Cost(row)] => {
            store.insert_cost_row(row).await?;
            Ok(vec![0])
        }
        _ => store.write_all(writes).await,
    }
}

#[async_trait]
impl Store for GroupCommit {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    async fn upsert_user(&self, name: &str) -> StoreResult<()> {
        self.inner.upsert_user(name).await
    }

    async fn create_session(&self, new: &NewSession) -> StoreResult<SessionRow> {
        self.inner.create_session(new).await
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRow>> {
        self.inner.get_session(session_id).await
    }

    async fn list_sessions(
        &self,
        user: Option<&str>,
        page: &SessionPage,
    ) -> StoreResult<Vec<SessionRow>> {
        self.inner.list_sessions(user, page).await
    }

    async fn count_sessions(&self, user: Option<&str>) -> StoreResult<i64> {
        self.inner.count_sessions(user).await
    }

    async fn delete_session(&self, session_id: &str) -> StoreResult<bool> {
        self.inner.delete_session(session_id).await
    }

    async fn set_session_title(&self, session_id: &str, title: &str) -> StoreResult<()> {
        self.inner.set_session_title(session_id, title).await
    }

    async fn set_title_if_unset(&self, session_id: &str, title: &str) -> StoreResult<bool> {
        self.inner.set_title_if_unset(session_id, title).await
    }

    async fn set_session_model(
        &self,
        session_id: &str,
        model: Option<&str>,
        reasoning_effort: Option<&str>,
    ) -> StoreResult<()> {
        self.inner
            .set_session_model(session_id, model, reasoning_effort)
            .await
    }

    async fn set_session_worktree(
        &self,
        session_id: &str,
        cwd: &str,
        worktree: Option<&crate::store::SessionWorktree>,
    ) -> StoreResult<()> {
        self.inner
            .set_session_worktree(session_id, cwd, worktree)
            .await
    }

    async fn idle_sessions(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        self.inner.idle_sessions(before).await
    }

    async fn prune_events(&self, before: OffsetDateTime) -> StoreResult<u64> {
        self.inner.prune_events(before).await
    }

    async fn prune_tasks(&self, before: OffsetDateTime) -> StoreResult<Vec<String>> {
        self.inner.prune_tasks(before).await
    }

    async fn inherited_usd(&self, session_id: &str) -> StoreResult<f64> {
        self.inner.inherited_usd(session_id).await
    }

    async fn sessions_with_open_work(&self) -> StoreResult<Vec<(String, i64)>> {
        self.inner.sessions_with_open_work().await
    }

    async fn mark_no_open_work(&self, session_id: &str, last_seq: i64) -> StoreResult<()> {
        self.inner.mark_no_open_work(session_id, last_seq).await
    }

    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        self.commit(Write::Events(events.to_vec())).await.map(drop)
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> StoreResult<Vec<EventRow>> {
        self.inner.events_after(session_id, after_seq, limit).await
    }

    async fn append_message(
        &self,
        session_id: &str,
        message: &Value,
        event_seq: i64,
    ) -> StoreResult<i64> {
        self.commit(Write::Message {
            session_id: session_id.to_owned(),
            message: message.clone(),
            event_seq,
        })
        .await
    }

    async fn messages(&self, session_id: &str) -> StoreResult<Vec<Value>> {
        self.inner.messages(session_id).await
    }

    async fn fork_session(&self, new: &NewSession, up_to_seq: i64) -> StoreResult<SessionRow> {
        self.inner.fork_session(new, up_to_seq).await
    }

    async fn upsert_task(&self, task: &TaskRow) -> StoreResult<()> {
        self.inner.upsert_task(task).await
    }

    async fn get_task(&self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        self.inner.get_task(task_id).await
    }

    async fn list_tasks(&self, session_id: &str) -> StoreResult<Vec<TaskRow>> {
        self.inner.list_tasks(session_id).await
    }

    async fn fail_running_tasks(&self, reason: &str) -> StoreResult<u64> {
        self.inner.fail_running_tasks(reason).await
    }

    async fn fail_running_tasks_of(&self, session_id: &str, reason: &str) -> StoreResult<u64> {
        self.inner.fail_running_tasks_of(session_id, reason).await
    }

    async fn insert_cost_row(&self, row: &CostRow) -> StoreResult<()> {
        self.commit(Write::Cost(row.clone())).await.map(drop)
    }

    async fn cost_rows(&self, session_id: &str) -> StoreResult<Vec<CostRow>> {
        self.inner.cost_rows(session_id).await
    }

    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        self.inner.write_all(writes).await
    }

    // Leases are never batched with other callers' writes: a refused fence must refuse only
    // its own batch.
    async fn acquire_lease(
        &self,
        session_id: &str,
        node_id: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<super::Lease>> {
        self.inner.acquire_lease(session_id, node_id, ttl).await
    }

    async fn renew_lease(
        &self,
        lease: &super::Lease,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<super::Lease>> {
        self.inner.renew_lease(lease, ttl).await
    }

    async fn release_lease(&self, lease: &super::Lease) -> StoreResult<bool> {
        self.inner.release_lease(lease).await
    }

    async fn lease(&self, session_id: &str) -> StoreResult<Option<super::Lease>> {
        self.inner.lease(session_id).await
    }
}
