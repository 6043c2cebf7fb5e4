//! A session as one node's clients see it in cluster mode, wherever its actor runs: the
//! follower streams the session's events from the table to this node's watchers (woken by
//! `NOTIFY`, and on a timer so a missed notice only delays), and passes every other request to
//! the owner, local or remote. Watchers never move when the owner changes, so a takeover is
//! seamless for them.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::forwarding::Relay;
use super::frames::TrySendError;
use super::hub::Sessions;
use super::{Command, Outbound, SessionView, Watcher, notification_frame};
use crate::cluster::Cluster;

/// Events read from the table per query.
const PAGE: i64 = 500;

/// A watcher whose session view was fetched, ready to join.
type Joining = (Watcher, SessionView, oneshot::Sender<(i64, SessionView)>);

/// One session's follower on this node.
pub(crate) struct Follower {
    pub session_id: Arc<str>,
    pub user: Option<String>,
    pub sessions: Sessions,
    pub cluster: Arc<Cluster>,
    /// The last seq handed to the watchers.
    pub cursor: i64,
    pub notices: watch::Receiver<i64>,
    pub idle_unload: Duration,
    pub cancel: CancellationToken,
}

impl Follower {
    /// Serves commands until closed, cancelled, or idle for `idle_unload`.
    pub(crate) async fn run(mut self, mut commands: super::CommandRx) {
        let mut watchers: Vec<Watcher> = Vec::new();
        let mut calls: JoinSet<()> = JoinSet::new();
        let (joining_tx, mut joining) = mpsc::channel::<Joining>(16);
        // A lost owner is noticed within a quarter lease; so are missed notices.
        let mut tick =
            tokio::time::interval((self.cluster.lease_ttl() / 4).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut taking_over = false;
        let (delivered, _) = watch::channel(self.cursor);
        loop {
            let idle = watchers.is_empty() && calls.is_empty();
            let idle_timer = tokio::time::sleep(self.idle_unload);
            tokio::select! {
                () = self.cancel.cancelled() => break,
                command = commands.next() => match command {
                    Some(Command::Close { .. }) | None => break,
                    Some(Command::Attach(attach)) => {
                        let super::Attach { watcher, reply, .. } = *attach;
                        // The view first: the watcher joins once it can be answered, so no
                        // event reaches it before the cursor it is told.
                        let (sessions, id, user, joining) = (self.sessions.clone(), Arc::clone(&self.session_id), self.user.clone(), joining_tx.clone());
                        let cursor = delivered.subscribe();
                        calls.spawn(async move {
                            let (tx, rx) = oneshot::channel();
                            sessions.relay(&id, user.as_deref(), Command::Request(Box::new((super::SessionRequest::Describe {}, super::ReplyTx::Waiting(tx)))), cursor).await;
                            if let Ok(Ok(super::SessionReply::View(view))) = rx.await {
                                let _ = joining.send((watcher, *view, reply)).await;
                            }
                        });
                    }
                    Some(Command::Detach { connection_id }) => {
                        watchers.retain(|w| w.connection_id != connection_id);
                    }
                    Some(command) => {
                        let (sessions, id, user) = (self.sessions.clone(), Arc::clone(&self.session_id), self.user.clone());
                        let cursor = delivered.subscribe();
                        calls.spawn(async move { sessions.relay(&id, user.as_deref(), command, cursor).await });
                    }
                },
                Some((watcher, view, reply)) = joining.recv() => {
                    self.catch_up(&mut watchers, &delivered).await;
                    watchers.push(watcher);
                    let _ = reply.send((self.cursor, view));
                }
                Ok(()) = self.notices.changed() => self.catch_up(&mut watchers, &delivered).await,
                _ = tick.tick() => {
                    self.catch_up(&mut watchers, &delivered).await;
                    if !watchers.is_empty() && !taking_over && self.owner_lost().await {
                        // Someone is watching a session whose node is gone: take it over,
                        // so its turn is ended and its clients can go on.
                        taking_over = true;
                        let (sessions, id) = (self.sessions.clone(), Arc::clone(&self.session_id));
                        calls.spawn(async move { sessions.take_over(&id).await });
                    }
                }
                Some(done) = calls.join_next(), if !calls.is_empty() => {
                    if done.is_ok() {
                        taking_over = false;
                    }
                }
                () = idle_timer, if idle => break,
            }
        }
        calls.abort_all();
    }

    /// Whether the session's lease lapsed without a release.
    async fn owner_lost(&self) -> bool {
        matches!(
            self.cluster.owner(&self.session_id).await,
            Ok(crate::cluster::Owner::Nobody { lost: true })
        )
    }

    /// Hands the watchers every stored event after the cursor, in order.
    async fn catch_up(&mut self, watchers: &mut Vec<Watcher>, delivered: &watch::Sender<i64>) {
        loop {
            let page = match self
                .sessions
                .store()
                .events_after(&self.session_id, self.cursor, PAGE)
                .await
            {
                Ok(page) => page,
                Err(err) => {
                    tracing::warn!(%err, session_id = %self.session_id, "events not read; retrying on the next notice");
                    return;
                }
            };
            let full = page.len() as i64 == PAGE;
            for event in page {
                self.cursor = event.seq;
                let frame = Outbound::Text(notification_frame(&event.method, &event.params));
                watchers.retain_mut(|watcher| match watcher.tx.try_send(frame.clone()) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        watcher.lagged.cancel();
                        false
                    }
                    Err(TrySendError::Closed(_)) => false,
                });
            }
            delivered.send_replace(self.cursor);
            if !full {
                return;
            }
        }
    }
}

/// Answers a command that could not reach any owner with `err`, where its answer can say so.
pub(crate) fn refuse(command: Command, err: super::SessionError) {
    // Attach, Detach, Catalog, Drain, Close: dropping the reply says the session is gone.
    if let Ok(relay) = Relay::of(command) {
        relay.answer(Err(err));
    }
}
