//! The writer one session's actor writes through in cluster mode: every write of the session
//! goes in one transaction behind a check of the actor's lease epoch, and event appends send
//! their `NOTIFY` at commit.

use std::sync::Arc;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use sqlx::postgres::PgPool;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::lease::Lease;
use crate::store::{StoreError, StoreResult, Write, Writer, db_error};

/// The PostgreSQL channel of event notices: `<session_id> <seq> <unix micros>`, small on
/// purpose; listeners read the events themselves from the table.
pub const EVENTS_CHANNEL: &str = "agentd_events";

/// A [`Writer`] whose writes of one session are refused once its lease has a newer epoch.
pub struct FencedWriter {
    pool: PgPool,
    session_id: String,
    epoch: i64,
    /// Fired on the first refused write: the actor has lost its session and must stop.
    lost: CancellationToken,
    refused: Counter,
}

impl std::fmt::Debug for FencedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedWriter")
            .field("session_id", &self.session_id)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl FencedWriter {
    /// Writes to `pool` fenced by `lease`; `lost` fires when one is refused, which is counted
    /// in `refused`.
    pub fn for_lease(
        pool: PgPool,
        lease: &Lease,
        lost: CancellationToken,
        refused: Counter,
    ) -> Arc<dyn Writer> {
        Arc::new(Self {
            pool,
            session_id: lease.session_id.clone(),
            epoch: lease.epoch,
            lost,
            refused,
        })
    }

    /// `writes` behind the fence, and the notice of their last event, in one transaction.
    async fn fenced(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        // FOR SHARE: a takeover's UPDATE of the row waits until this commits, so no write of
        // an old owner lands after a new owner's first.
        let held: Option<i64> =
            sqlx::query_scalar("SELECT epoch FROM session_leases WHERE session_id = $1 FOR SHARE")
                .bind(&self.session_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_error)?;
        if held != Some(self.epoch) {
            return Err(StoreError::Fenced {
                session_id: self.session_id.clone(),
                epoch: self.epoch,
            });
        }
        let answers = crate::store::postgres::write_in(&mut tx, writes).await?;
        let last_seq = writes.iter().rev().find_map(|write| match write {
            Write::Events(events) => events.last().map(|event| event.seq),
            _ => None,
        });
        if let Some(seq) = last_seq {
            // Sent at commit, so a listener never hears of an event it cannot read.
            let micros = (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000) as i64;
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(EVENTS_CHANNEL)
                .bind(format!("{} {seq} {micros}", self.session_id))
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(answers)
    }
}

#[async_trait]
impl Writer for FencedWriter {
    async fn write_all(&self, writes: &[Write]) -> StoreResult<Vec<i64>> {
        let outcome = self.fenced(writes).await;
        if let Err(StoreError::Fenced { .. }) = &outcome {
            self.refused.inc();
            tracing::warn!(session_id = %self.session_id, epoch = self.epoch, "write refused: the session was taken over");
            self.lost.cancel();
        }
        outcome
    }
}
