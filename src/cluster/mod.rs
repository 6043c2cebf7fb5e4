//! Cluster mode: any number of agentd nodes over one PostgreSQL, which holds everything they
//! share.
//!
//! - **One owner per session.** A session's actor runs on the node holding its lease (a row of
//!   `session_leases`, renewed here every third of `lease_secs`). Every write of the actor
//!   carries the lease's epoch ([`fenced::FencedWriter`]), and a takeover bumps it, so an owner
//!   that was paused and comes back cannot write a thing.
//! - **Any node serves any client.** A node's clients watch a session through its follower
//!   (`session::follower`), which reads the events from the table when a `NOTIFY` says there
//!   are new ones (and on a timer, so a missed notice only delays), and passes requests to the
//!   owner: to the local actor, or over HTTP to the owner's advertised URL ([`forward`]).
//! - **Node death.** A lease nobody renews lapses; the next request, or a follower with
//!   watchers, makes a live node take the session over, ending the lost turn `node_lost`.
//! - **Draining.** A stopping node takes no sessions, lets its turns end (up to the grace
//!   period), then releases its leases.

pub mod fenced;
pub mod forward;
pub mod lease;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::fenced::{EVENTS_CHANNEL, FencedWriter};
pub use self::lease::Lease;
use crate::metrics::Metrics;
use crate::mutex::lock;
use crate::secret::Secret;
use crate::store::{StoreError, StoreResult, Writer, db_error};

/// Connections to the shared database: the sessions' fenced writes, leases, heartbeats.
const POOL_CONNECTIONS: u32 = 8;

/// Who holds a session's lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This node (its actor may be stopping, or an earlier process under this node id held
    /// it until `expires_at`).
    Here {
        /// When the lease lapses unless renewed.
        expires_at: OffsetDateTime,
    },
    /// Another live node, reached at `url`.
    Node {
        /// Its node id.
        node_id: String,
        /// Its advertised URL.
        url: String,
        /// When the lease lapses unless renewed.
        expires_at: OffsetDateTime,
    },
    /// Nobody: never leased, released, or lapsed. `lost` when it lapsed without a release: its
    /// node stopped renewing it (died or was paused) and the session needs recovering.
    Nobody {
        /// Whether the last owner was lost rather than letting go.
        lost: bool,
    },
}

/// What a node needs to join: `[cluster]` and the database, as configured.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This node's id.
    pub node_id: String,
    /// How the other nodes reach this one.
    pub advertise_url: String,
    /// How long a lease lasts unless renewed.
    pub lease_ttl: Duration,
    /// What the nodes show each other.
    pub secret: Secret,
    /// The PostgreSQL every node shares.
    pub database_url: String,
}

struct Held {
    lease: Lease,
    /// Stops the session's actor when the lease is found taken over.
    stop: CancellationToken,
}

/// This node's part in the cluster: its leases, its row in `cluster_nodes`, the event notices
/// it hears, and the client it forwards requests with.
pub struct Cluster {
    node_id: String,
    advertise_url: String,
    ttl: Duration,
    secret: Secret,
    pool: PgPool,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    draining: AtomicBool,
    held: Mutex<HashMap<String, Held>>,
    notices: Mutex<HashMap<String, watch::Sender<i64>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.node_id)
            .field("advertise_url", &self.advertise_url)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the cluster: registers this node, then renews its leases and listens for event
    /// notices in the background until `cancel`.
    pub async fn join(
        settings: ClusterSettings,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
        tracker: &TaskTracker,
    ) -> StoreResult<Arc<Self>> {
        // A node paused in the middle of a fenced write holds its lease row's lock, and a
        // takeover would wait on it for as long as the pause lasts: PostgreSQL ends such a
        // transaction after a lease, so the takeover waits at most that long once more.
        let options = crate::store::postgres::parse_url(&settings.database_url)?.options([(
            "idle_in_transaction_session_timeout",
            format!("{}s", settings.lease_ttl.as_secs().max(1)),
        )]);
        let pool = PgPoolOptions::new()
            .max_connections(POOL_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(db_error)?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|err| StoreError::InvalidUrl(format!("cluster client: {err}")))?;
        let cluster = Arc::new(Self {
            node_id: settings.node_id,
            advertise_url: settings.advertise_url.trim_end_matches('/').to_string(),
            ttl: settings.lease_ttl,
            secret: settings.secret,
            pool,
            http,
            metrics,
            draining: AtomicBool::new(false),
            held: Mutex::new(HashMap::new()),
            notices: Mutex::new(HashMap::new()),
        });
        cluster.heartbeat().await?;
        tracing::info!(
            node_id = %cluster.node_id,
            advertise_url = %cluster.advertise_url,
            lease_secs = cluster.ttl.as_secs(),
            "joined the cluster"
        );
        // Listening starts before any follower reads the table, so no notice is missed.
        let listener = PgListener::connect_with(&cluster.pool)
            .await
            .map_err(db_error)?;
        tracker.spawn(Arc::clone(&cluster).listen(listener, cancel.clone()));
        tracker.spawn(Arc::clone(&cluster).renew(cancel));
        Ok(cluster)
    }

    /// How long a lease lasts unless renewed.
    pub fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// What forwarded requests must show.
    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether this node is handing its sessions over.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Upserts this node's row: it is alive, reached at its URL, draining or not.
    async fn heartbeat(&self) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO cluster_nodes (node_id, advertise_url, seen_at, draining) \
             VALUES ($1, $2, now(), $3) ON CONFLICT (node_id) DO UPDATE SET \
             advertise_url = EXCLUDED.advertise_url, seen_at = now(), draining = EXCLUDED.draining",
        )
        .bind(&self.node_id)
        .bind(&self.advertise_url)
        .bind(self.is_draining())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Every third of a lease: the node's row and every held lease are renewed. A lease found
    /// taken over stops its actor (whose writes the new epoch refuses anyway).
    async fn renew(self: Arc<Self>, cancel: CancellationToken) {
        let period = self.ttl / 3;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            if let Err(err) = self.heartbeat().await {
                tracing::warn!(%err, "cluster heartbeat failed");
            }
            let leases: Vec<Lease> = lock(&self.held)
                .values()
                .map(|held| held.lease.clone())
                .collect();
            for lease in leases {
                match lease::renew(&self.pool, &lease, self.ttl).await {
                    Ok(Some(renewed)) => {
                        if let Some(held) = lock(&self.held).get_mut(&lease.session_id) {
                            held.lease = renewed;
                        }
                    }
                    Ok(None) => {
                        tracing::warn!(session_id = %lease.session_id, epoch = lease.epoch, "lease taken over; stopping the actor");
                        if let Some(held) = lock(&self.held).remove(&lease.session_id) {
                            held.stop.cancel();
                        }
                        self.count_held();
                    }
                    Err(err) => {
                        tracing::warn!(%err, session_id = %lease.session_id, "lease not renewed")
                    }
                }
            }
        }
    }

    /// Hears `NOTIFY`s of new events and tells the followers; after a lost connection every
    /// follower reads the table again, since notices may have been missed meanwhile.
    async fn listen(self: Arc<Self>, mut listener: PgListener, cancel: CancellationToken) {
        if let Err(err) = listener.listen(EVENTS_CHANNEL).await {
            tracing::error!(%err, "cannot listen for event notices; followers poll");
        }
        loop {
            let notice = tokio::select! {
                () = cancel.cancelled() => return,
                notice = listener.try_recv() => notice,
            };
            match notice {
                Ok(Some(notice)) => self.on_notice(notice.payload()),
                Ok(None) => self.wake_all(),
                Err(err) => {
                    tracing::warn!(%err, "event notices interrupted");
                    self.wake_all();
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        }
    }

    /// `<session_id> <seq> <unix micros>`.
    fn on_notice(&self, payload: &str) {
        let mut parts = payload.split(' ');
        let (Some(session_id), Some(seq)) = (parts.next(), parts.next()) else {
            return;
        };
        let Ok(seq) = seq.parse::<i64>() else {
            return;
        };
        if let Some(sent) = parts.next().and_then(|micros| micros.parse::<i128>().ok()) {
            let now = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000;
            self.metrics
                .cluster_notify_lag
                .observe(((now - sent).max(0) as f64) / 1e6);
        }
        if let Some(tx) = lock(&self.notices).get(session_id) {
            tx.send_if_modified(|known| {
                let newer = seq > *known;
                if newer {
                    *known = seq;
                }
                newer
            });
        }
    }

    fn wake_all(&self) {
        for tx in lock(&self.notices).values() {
            tx.send_modify(|_| {});
        }
    }

    /// Notices of `session_id`'s events: the last seq heard of changes.
    pub(crate) fn subscribe(&self, session_id: &str) -> watch::Receiver<i64> {
        lock(&self.notices)
            .entry(session_id.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Forgets `session_id`'s notices once nobody follows it.
    pub(crate) fn unsubscribe(&self, session_id: &str) {
        let mut notices = lock(&self.notices);
        if notices
            .get(session_id)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            notices.remove(session_id);
        }
    }

    /// Takes `session_id`'s lease if nobody holds it (and this node is not draining).
    pub async fn acquire(&self, session_id: &str) -> StoreResult<Option<Lease>> {
        if self.is_draining() {
            return Ok(None);
        }
        lease::acquire(&self.pool, session_id, &self.node_id, self.ttl).await
    }

    /// The writer of the session `lease` is for: refused, and `lost` fired, once the lease is
    /// taken over.
    pub(crate) fn writer(&self, lease: &Lease, lost: CancellationToken) -> Arc<dyn Writer> {
        FencedWriter::for_lease(
            self.pool.clone(),
            lease,
            lost,
            self.metrics.cluster_fenced_writes.clone(),
        )
    }

    /// The current lease of `session_id`, lapsed or not.
    pub async fn lease(&self, session_id: &str) -> StoreResult<Option<Lease>> {
        lease::current(&self.pool, session_id).await
    }

    /// Lets go of a lease taken but never held (its session turned out not to exist).
    pub(crate) async fn let_go(&self, taken: &Lease) {
        if let Err(err) = lease::release(&self.pool, taken).await {
            tracing::warn!(%err, session_id = %taken.session_id, "lease not released; it lapses by itself");
        }
    }

    /// Keeps `lease` renewed until [`Self::release`]; `stop` ends its actor if it is lost.
    pub(crate) fn hold(&self, lease: Lease, stop: CancellationToken) {
        lock(&self.held).insert(lease.session_id.clone(), Held { lease, stop });
        self.count_held();
    }

    /// Whether this node holds `session_id`'s lease (its actor runs or is stopping).
    pub(crate) fn holds(&self, session_id: &str) -> bool {
        lock(&self.held).contains_key(session_id)
    }

    /// Lets `session_id`'s lease of `epoch` go, once its actor has stopped.
    pub(crate) async fn release(&self, session_id: &str, epoch: i64) {
        let held = {
            let mut held = lock(&self.held);
            match held.get(session_id) {
                Some(h) if h.lease.epoch == epoch => held.remove(session_id),
                _ => None,
            }
        };
        self.count_held();
        if let Some(held) = held
            && let Err(err) = lease::release(&self.pool, &held.lease).await
        {
            tracing::warn!(%err, %session_id, "lease not released; it lapses by itself");
        }
    }

    fn count_held(&self) {
        let held = lock(&self.held).len();
        self.metrics
            .cluster_owned_sessions
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Who holds `session_id` now.
    pub async fn owner(&self, session_id: &str) -> StoreResult<Owner> {
        let Some(lease) = self.lease(session_id).await? else {
            return Ok(Owner::Nobody { lost: false });
        };
        if lease.expires_at <= OffsetDateTime::now_utc() {
            return Ok(Owner::Nobody {
                lost: !lease.released(),
            });
        }
        if lease.node_id == self.node_id {
            return Ok(Owner::Here {
                expires_at: lease.expires_at,
            });
        }
        let url: Option<String> =
            sqlx::query_scalar("SELECT advertise_url FROM cluster_nodes WHERE node_id = $1")
                .bind(&lease.node_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(Owner::Node {
            node_id: lease.node_id,
            url: url.unwrap_or_default(),
            expires_at: lease.expires_at,
        })
    }

    /// A live node other than this one that takes sessions, to hand a request to while this
    /// one drains.
    pub async fn other_node(&self) -> StoreResult<Option<String>> {
        sqlx::query_scalar(
            "SELECT advertise_url FROM cluster_nodes WHERE node_id <> $1 AND NOT draining \
             AND seen_at > now() - make_interval(secs => $2) ORDER BY random() LIMIT 1",
        )
        .bind(&self.node_id)
        .bind(self.ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Stops taking sessions, and says so to the other nodes.
    pub async fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
        if let Err(err) = self.heartbeat().await {
            tracing::warn!(%err, "could not mark the node draining");
        }
    }

    /// Leaves the cluster: the node's row goes.
    pub async fn leave(&self) {
        let gone = sqlx::query("DELETE FROM cluster_nodes WHERE node_id = $1")
            .bind(&self.node_id)
            .execute(&self.pool)
            .await;
        if let Err(err) = gone {
            tracing::warn!(%err, "could not leave the cluster table");
        }
    }
}
