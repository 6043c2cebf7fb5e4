//! Group commit on PostgreSQL: [`GroupCommit`] is a [`Writer`] that sends the writes of many
//! callers — events, history messages, cost rows, tasks — through a few writers, each of which
//! commits together whatever queued while its previous commit ran, so a busy server pays one
//! commit per batch instead of one per write. (SQLite's writing thread batches by itself.)
//!
//! The guarantee callers build on is unchanged: a write returns only once it is committed (or
//! has failed), so an event is durable before anyone is shown it. Each caller awaits its write
//! before making the next (a session's actor its events, a turn its history), so a session's
//! `seq` and history order hold within and across batches, also where several batches are
//! committed at once (PostgreSQL).

use std::sync::Arc;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{NewEvent, StoreError, StoreResult, Write, Writer};

/// About the most rows one batch carries; more waiting go in the next.
const MAX_BATCH: usize = 64;
/// Batches committed at once (half the pool). PostgreSQL commits on several connections at
/// once and flushes their WAL together: a batch waiting for the one in flight would add a
/// flush to every write behind it.
const WRITERS: usize = 4;

/// One caller's write waiting for its batch, with where to say how it went (a message's index,
/// else 0).
struct Pending {
    write: Write,
    done: oneshot::Sender<StoreResult<i64>>,
}

/// A writer whose single writes are group-committed; a caller's several writes, which must
/// land together, pass straight to the backend.
pub struct GroupCommit {
    inner: Arc<dyn Writer>,
    queue: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// `inner` with its writers started on the current runtime, counting commits in
    /// `batches`. The writers end when this one is dropped, after committing what is queued.
    pub fn wrap(inner: Arc<dyn Writer>, batches: Counter) -> Arc<dyn Writer> {
        let (queue, pending) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(pending));
        for _ in 0..WRITERS {
            tokio::spawn(write_batches(
                Arc::clone(&inner),
                Arc::clone(&pending),
                batches.clone(),
            ));
        }
        Arc::new(Self { inner, queue })
    }
}

fn writer_gone() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

#[async_trait]
impl Writer for GroupCommit {
    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        match writes {
            [write] => Ok(vec![self.write(write.clone()).await?]),
            // Several writes of one caller are all or none; in a batch, a failing neighbour
            // would have them tried one by one.
            _ => self.inner.write_all(writes).await,
        }
    }

    async fn write(&self, write: Write) -> StoreResult<i64> {
        let (done, outcome) = oneshot::channel();
        self.queue
            .send(Pending { write, done })
            .map_err(|_| writer_gone())?;
        outcome.await.unwrap_or_else(|_| Err(writer_gone()))
    }
}

/// The writer: waits for one write, takes every other one already queued (up to about
/// [`MAX_BATCH`] rows), commits them together — events alone as one statement, a mix as one
/// transaction.
async fn write_batches(
    store: Arc<dyn Writer>,
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
                count += write.rows();
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
                    let outcome = store
                        .write_all(std::slice::from_ref(write))
                        .await
                        .map(|answers| answers.first().copied().unwrap_or(0));
                    if outcome.is_ok() {
                        batches.inc();
                    }
                    let _ = done.send(outcome);
                }
            }
        }
        writes.clear();
    }
}

/// Commits `writes` together, answering each: a batch of events alone goes as one statement.
async fn commit_batch(store: &dyn Writer, writes: &[Write]) -> StoreResult<Vec<i64>> {
    if writes.len() > 1 && writes.iter().all(|w| matches!(w, Write::Events(_))) {
        let events: Vec<NewEvent> = writes
            .iter()
            .flat_map(|w| match w {
                Write::Events(events) => events.as_slice(),
                _ => &[],
            })
            .cloned()
            .collect();
        store.write_all(&[Write::Events(events)]).await?;
        return Ok(vec![0; writes.len()]);
    }
    store.write_all(writes).await
}
