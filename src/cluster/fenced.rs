//! The store one session's actor writes through in cluster mode: every write of the session
//! goes in one transaction behind a [`Write::Fence`] of the actor's lease epoch, and event
//! appends send their `NOTIFY` at commit.

use std::sync::Arc;
use time::OffsetDateTime;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::store::{
    CostRow, EventRow, Lease, NewEvent, NewSession, SessionPage, SessionRow, Store, StoreError,
    StoreResult, TaskRow, Write,
};

/// A [`Store`] whose writes of one session are refused once its lease has a newer epoch.
pub struct FencedStore {
    inner: Arc<dyn Store>,
    session_id: String,
    epoch: i64,
    /// Fired on the first refused write: the actor has lost its session and must stop.
    lost: CancellationToken,
    refused: prometheus_client::metrics::counter::Counter,
}

impl std::fmt::Debug for FencedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStore")
            .field("session_id", &self.session_id)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl FencedStore {
    /// `inner`, with `session_id`'s writes fenced by `lease`; `lost` fires when one is refused.
    /// Refusals are counted in `refused`.
    pub fn wrap(
        inner: Arc<dyn Store>,
        lease: &Lease,
        lost: CancellationToken,
        refused: prometheus_client::metrics::counter::Counter,
    ) -> Arc<dyn Store> {
        Arc::new(Self {
            inner,
            session_id: lease.session_id.clone(),
            epoch: lease.epoch,
            lost,
            refused,
        })
    }

    fn fence(&self) -> Write {
        Write::Fence {
            session_id: self.session_id.clone(),
            epoch: self.epoch,
        }
    }

    /// `writes` behind the fence, in one transaction; the answers without the fence's.
    async fn fenced(&self, writes: Vec<Write>) -> StoreResult<Vec<i64>> {
        let mut all = Vec::with_capacity(writes.len() + 1);
        all.push(self.fence());
        all.extend(writes);
        match self.inner.write_all(&all).await {
            Ok(mut answers) => {
                answers.remove(0);
                Ok(answers)
            }
            Err(err) => {
                if matches!(err, StoreError::Fenced { .. }) {
                    self.refused.inc();
                    tracing::warn!(session_id = %self.session_id, epoch = self.epoch, "write refused: the session was taken over");
                    self.lost.cancel();
                }
                Err(err)
            }
        }
    }

    fn notify_of(events: &[NewEvent]) -> Option<Write> {
        let last = events.last()?;
        Some(Write::Notify {
            session_id: last.session_id.to_string(),
            seq: last.seq,
        })
    }
}

#[async_trait]
impl Store for FencedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }

    async fn close(&self) {}

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
        // Only the lease holder may say its session is clear.
        self.fenced(Vec::new()).await?;
        self.inner.mark_no_open_work(session_id, last_seq).await
    }

    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut writes = vec![Write::Events(events.to_vec())];
        writes.extend(Self::notify_of(events));
        self.fenced(writes).await.map(drop)
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
        let answers = self
            .fenced(vec![Write::Message {
                session_id: session_id.to_owned(),
                message: message.clone(),
                event_seq,
            }])
            .await?;
        Ok(answers.first().copied().unwrap_or_default())
    }

    async fn messages(&self, session_id: &str) -> StoreResult<Vec<Value>> {
        self.inner.messages(session_id).await
    }

    async fn fork_session(&self, new: &NewSession, up_to_seq: i64) -> StoreResult<SessionRow> {
        self.inner.fork_session(new, up_to_seq).await
    }

    async fn upsert_task(&self, task: &TaskRow) -> StoreResult<()> {
        // A task row is one statement of its own; the fence is checked just before it, which
        // is as good as a takeover can see (the new owner fails running tasks itself).
        self.fenced(Vec::new()).await?;
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
        self.fenced(vec![Write::Cost(row.clone())]).await.map(drop)
    }

    async fn cost_rows(&self, session_id: &str) -> StoreResult<Vec<CostRow>> {
        self.inner.cost_rows(session_id).await
    }

    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        let mut all = writes.to_vec();
        let notices: Vec<Write> = writes
            .iter()
            .filter_map(|write| match write {
                Write::Events(events) => Self::notify_of(events),
                _ => None,
            })
            .collect();
        all.extend(notices);
        let count = writes.len();
        let mut answers = self.fenced(all).await?;
        answers.truncate(count);
        Ok(answers)
    }

    async fn acquire_lease(
        &self,
        session_id: &str,
        node_id: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<Lease>> {
        self.inner.acquire_lease(session_id, node_id, ttl).await
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<Lease>> {
        self.inner.renew_lease(lease, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<bool> {
        self.inner.release_lease(lease).await
    }

    async fn lease(&self, session_id: &str) -> StoreResult<Option<Lease>> {
        self.inner.lease(session_id).await
    }
}
