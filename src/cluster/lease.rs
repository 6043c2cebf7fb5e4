//! Session leases on PostgreSQL: which node owns a session's actor, until when, and under which
//! epoch. The database's clock decides expiry, so the nodes' clocks need not agree.

use std::time::Duration;

use serde::Serialize;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};
use time::OffsetDateTime;

use crate::store::{StoreResult, db_error};

/// A node's hold on a session's actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The session.
    pub session_id: String,
    /// The owning node.
    pub node_id: String,
    /// Bumped by every takeover; every write of the owner carries it (see
    /// [`super::fenced::FencedWriter`]).
    pub epoch: i64,
    /// When it lapses unless renewed; the Unix epoch once released.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

impl Lease {
    /// Whether its owner let it go (rather than stopping renewing it: a lost node).
    pub fn released(&self) -> bool {
        self.expires_at <= OffsetDateTime::UNIX_EPOCH
    }

    fn from_row(row: &PgRow) -> StoreResult<Self> {
        Ok(Self {
            session_id: row.try_get("session_id").map_err(db_error)?,
            node_id: row.try_get("node_id").map_err(db_error)?,
            epoch: row.try_get("epoch").map_err(db_error)?,
            expires_at: row.try_get("expires_at").map_err(db_error)?,
        })
    }
}

const COLUMNS: &str = "session_id, node_id, epoch, expires_at";

/// Takes the lease of `session_id` for `node_id` for `ttl`: a new lease at epoch 1, or a lapsed
/// one with its epoch bumped. `None` while anyone (this node included) holds it; `NotFound`
/// without the session.
pub async fn acquire(
    pool: &PgPool,
    session_id: &str,
    node_id: &str,
    ttl: Duration,
) -> StoreResult<Option<Lease>> {
    let row = sqlx::query(&format!(
        "INSERT INTO session_leases (session_id, node_id, epoch, expires_at) \
         VALUES ($1, $2, 1, now() + make_interval(secs => $3)) \
         ON CONFLICT (session_id) DO UPDATE SET node_id = EXCLUDED.node_id, \
         epoch = session_leases.epoch + 1, expires_at = EXCLUDED.expires_at \
         WHERE session_leases.expires_at <= now() RETURNING {COLUMNS}"
    ))
    .bind(session_id)
    .bind(node_id)
    .bind(ttl.as_secs_f64())
    .fetch_optional(pool)
    .await
    .map_err(db_error)?;
    row.as_ref().map(Lease::from_row).transpose()
}

/// Extends `lease` by `ttl` from now; `None` when it was taken over (its epoch is gone).
pub async fn renew(pool: &PgPool, lease: &Lease, ttl: Duration) -> StoreResult<Option<Lease>> {
    let row = sqlx::query(&format!(
        "UPDATE session_leases SET expires_at = now() + make_interval(secs => $4) \
         WHERE session_id = $1 AND node_id = $2 AND epoch = $3 RETURNING {COLUMNS}"
    ))
    .bind(&lease.session_id)
    .bind(&lease.node_id)
    .bind(lease.epoch)
    .bind(ttl.as_secs_f64())
    .fetch_optional(pool)
    .await
    .map_err(db_error)?;
    row.as_ref().map(Lease::from_row).transpose()
}

/// Lets `lease` lapse now (its `expires_at` becomes the Unix epoch, see [`Lease::released`]),
/// keeping its epoch so a later owner's is higher; whether it was still held.
pub async fn release(pool: &PgPool, lease: &Lease) -> StoreResult<bool> {
    let done = sqlx::query(
        "UPDATE session_leases SET expires_at = to_timestamp(0) \
         WHERE session_id = $1 AND node_id = $2 AND epoch = $3",
    )
    .bind(&lease.session_id)
    .bind(&lease.node_id)
    .bind(lease.epoch)
    .execute(pool)
    .await
    .map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

/// The current lease of `session_id`, lapsed or not.
pub async fn current(pool: &PgPool, session_id: &str) -> StoreResult<Option<Lease>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM session_leases WHERE session_id = $1"
    ))
    .bind(session_id)
    .fetch_optional(pool)
    .await
    .map_err(db_error)?;
    row.as_ref().map(Lease::from_row).transpose()
}
