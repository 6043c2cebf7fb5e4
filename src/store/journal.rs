//! Group commit for the event log: one writer per store takes the events of every session and
//! commits whatever queued while its previous commit ran as one statement, so a busy server
//! pays for one database round trip per batch instead of one transaction per event.
//!
//! The guarantee callers build on is unchanged: [`EventJournal::append`] returns only once the
//! event is committed (or has failed), so an event is durable before anyone is shown it. Events
//! are committed in the order they were queued; a session's actor awaits each append before
//! making the next, so its `seq` order holds within and across batches.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use super::{NewEvent, Store, StoreError, StoreResult};

/// The most events one statement carries; more waiting go in the next batch.
pub const MAX_BATCH: usize = 64;

/// Events of one caller waiting for their batch, stored all or none, with where to say how it
/// went.
struct Pending {
    events: Vec<NewEvent>,
    done: oneshot::Sender<StoreResult<()>>,
}

/// A handle to a store's event writer; cloning shares the writer.
#[derive(Clone)]
pub struct EventJournal {
    queue: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for EventJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventJournal").finish_non_exhaustive()
    }
}

impl EventJournal {
    /// Starts the writer of `store` on the current runtime, counting its commits in `batches`.
    /// It ends when the last handle is dropped, after committing what is queued.
    pub fn start(store: Arc<dyn Store>, batches: Counter) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(write_batches(store, pending, batches));
        Self { queue }
    }

    /// Appends `event` with the next batch; returns once it is committed. The errors are those
    /// of [`Store::append_events`] for this event alone.
    pub async fn append(&self, event: NewEvent) -> StoreResult<()> {
        self.append_all(vec![event]).await
    }

    /// Appends `events` together, all or none, with the next batch; returns once they are
    /// committed. The errors are those of [`Store::append_events`] for these events alone.
    pub async fn append_all(&self, events: Vec<NewEvent>) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let (done, outcome) = oneshot::channel();
        self.queue
            .send(Pending { events, done })
            .map_err(|_| writer_gone())?;
        outcome.await.unwrap_or_else(|_| Err(writer_gone()))
    }
}

fn writer_gone() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

/// The writer: waits for one append, takes every other one already queued (up to about
/// [`MAX_BATCH`] events), commits them as one statement.
async fn write_batches(
    store: Arc<dyn Store>,
    mut pending: mpsc::UnboundedReceiver<Pending>,
    batches: Counter,
) {
    let mut events: Vec<NewEvent> = Vec::with_capacity(MAX_BATCH);
    // Each caller's waiter with how many of `events` are its, in order.
    let mut waiters: Vec<(oneshot::Sender<StoreResult<()>>, usize)> = Vec::new();
    while let Some(first) = pending.recv().await {
        let mut next = Some(first);
        while let Some(Pending { events: more, done }) = next.take() {
            waiters.push((done, more.len()));
            events.extend(more);
            if events.len() < MAX_BATCH {
                next = pending.try_recv().ok();
            }
        }
        match store.append_events(&events).await {
            Ok(()) => {
                batches.inc();
                for (done, _) in waiters.drain(..) {
                    let _ = done.send(Ok(()));
                }
            }
            // One bad append (its session deleted meanwhile, a stale seq) must not fail the
            // others: nothing of the batch was stored, so each is tried alone for its own answer.
            Err(err) if waiters.len() == 1 => {
                if let Some((done, _)) = waiters.pop() {
                    let _ = done.send(Err(err));
                }
            }
            Err(_) => {
                let mut start = 0;
                for (done, len) in waiters.drain(..) {
                    let outcome = store.append_events(&events[start..start + len]).await;
                    start += len;
                    if outcome.is_ok() {
                        batches.inc();
                    }
                    let _ = done.send(outcome);
                }
            }
        }
        events.clear();
    }
}
