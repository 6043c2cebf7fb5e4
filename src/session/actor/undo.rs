//! The actor's undo: a checkpoint when each turn starts, the turn's `turn/diff` as it ends,
//! and `session/revert`, all kept in the checkpoint store so they outlive the actor.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{SessionActor, SessionError};
use crate::agent::SessionEvent;
use crate::checkpoint::{CheckpointStore, FileChange, KEPT, Snapshot};
use crate::tools::workspace::Workspace;

/// The name of the checkpoint of the workspace as the last turn (or revert) left it.
const SETTLED: &str = "settled";

/// A session's checkpoints while its actor runs.
pub(super) struct Undo {
    /// Where the contents and manifests live; `None`: no checkpoints at all.
    store: Option<Arc<CheckpointStore>>,
    /// Whether the stored checkpoints were read (lazily: most opens never need them).
    loaded: bool,
    /// The workspace as each recent turn found it, oldest first.
    checkpoints: std::collections::VecDeque<(String, Arc<Snapshot>)>,
    /// The workspace as the last turn (or revert) left it, with the number of the diff that
    /// found it: a revert compares the workspace with it to see what changed outside the
    /// session's turns since. Made when first needed: a watch channel is some 400 bytes, and
    /// most loaded sessions never take a diff.
    settled: Option<tokio::sync::watch::Sender<Settled>>,
    /// Diffs started after turns: `settled` is current once it carries this number.
    diffs_started: u64,
}

impl Undo {
    /// Checkpoints kept in `store`.
    pub(super) fn new(store: Option<Arc<CheckpointStore>>) -> Self {
        Self {
            store,
            loaded: false,
            checkpoints: std::collections::VecDeque::new(),
            settled: None,
            diffs_started: 0,
        }
    }
}

/// The number of the diff that found the workspace as it was last left, and that state.
type Settled = (u64, Option<Arc<Snapshot>>);

impl Undo {
    /// Where the settled state is kept, made on first use.
    fn settled(&mut self) -> &tokio::sync::watch::Sender<Settled> {
        self.settled
            .get_or_insert_with(|| tokio::sync::watch::Sender::new((0, None)))
    }
}

/// Nanoseconds since the epoch: the order of a session's checkpoints across restarts.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

impl SessionActor {
    /// The checkpoint store and the session's workspace, when both exist.
    fn undo_parts(&self) -> Option<(Arc<CheckpointStore>, Arc<Workspace>)> {
        Some((
            Arc::clone(self.undo.store.as_ref()?),
            Arc::clone(self.registry.workspace()?),
        ))
    }

    /// Reads the session's stored checkpoints, once per load of the actor.
    async fn load_checkpoints(&mut self) {
        if self.undo.loaded {
            return;
        }
        self.undo.loaded = true;
        let Some(store) = self.undo.store.clone() else {
            return;
        };
        let session_id = self.session_id.clone();
        let Ok(mut found) = tokio::task::spawn_blocking(move || store.load(&session_id)).await
        else {
            return;
        };
        if let Some(at) = found.iter().position(|(name, _)| name == SETTLED) {
            let (_, settled) = found.remove(at);
            self.undo.settled().send_if_modified(|(_, known)| {
                known
                    .is_none()
                    .then(|| *known = Some(Arc::new(settled)))
                    .is_some()
            });
        }
        let keep = found.len().saturating_sub(KEPT);
        self.undo.checkpoints = found
            .into_iter()
            .skip(keep)
            .map(|(name, snapshot)| (name, Arc::new(snapshot)))
            .collect();
    }

    /// Takes the checkpoint of the turn `turn_id` about to start, and stores it meanwhile.
    ///
    /// The turn waits for the snapshot (its tools must not change a file before it is taken),
    /// not for the file it is stored in: that is for after a restart, and creating it costs a
    /// short turn more than the rest of its overhead.
    pub(super) async fn checkpoint(&mut self, turn_id: &str) {
        let Some((store, workspace)) = self.undo_parts() else {
            return;
        };
        self.load_checkpoints().await;
        let previous = self
            .undo
            .checkpoints
            .back()
            .map(|(_, snapshot)| Arc::clone(snapshot));
        let dropped = (self.undo.checkpoints.len() >= KEPT)
            .then(|| self.undo.checkpoints.pop_front())
            .flatten();
        let taken = {
            let (workspace, store) = (workspace, Arc::clone(&store));
            tokio::task::spawn_blocking(move || {
                // Ordered by when it was taken, whenever it is stored.
                let order = now_ns();
                (
                    Snapshot::take(&workspace, previous.as_deref(), &store),
                    order,
                )
            })
            .await
        };
        let Ok((snapshot, order)) = taken else {
            return;
        };
        let snapshot = Arc::new(snapshot);
        self.undo
            .checkpoints
            .push_back((turn_id.to_string(), Arc::clone(&snapshot)));
        let (session_id, name) = (self.session_id.clone(), turn_id.to_string());
        // Tracked: a server that stops waits for it.
        self.tracker.spawn_blocking(move || {
            if let Err(err) = store.save(&session_id, &name, order, &snapshot) {
                tracing::warn!(%err, "a checkpoint could not be stored; it lasts while the session is loaded");
            }
            if let Some((oldest, _)) = dropped {
                store.forget(&session_id, &oldest);
            }
        });
    }

    /// Answers what the turn `turn_id` changed in the workspace (`turn/diff`, when it changed
    /// something), as the turn is about to end; the walk runs beside the actor.
    pub(super) fn settle(
        &mut self,
        turn_id: &str,
        reply: tokio::sync::oneshot::Sender<Option<SessionEvent>>,
    ) {
        let before = self
            .undo
            .checkpoints
            .iter()
            .find(|(id, _)| id == turn_id)
            .map(|(_, before)| Arc::clone(before));
        let (Some(before), Some((store, workspace))) = (before, self.undo_parts()) else {
            let _ = reply.send(None);
            return;
        };
        let turn_id = turn_id.to_string();
        let session_id = self.session_id.clone();
        self.undo.diffs_started += 1;
        let number = self.undo.diffs_started;
        let settled = self.undo.settled().clone();
        self.tracker.spawn(async move {
            let found = {
                let store = Arc::clone(&store);
                tokio::task::spawn_blocking(move || {
                    let order = now_ns();
                    let after = Snapshot::take(&workspace, Some(&before), &store);
                    let files = before.changes(&after);
                    let diff = before.diff(&after, &files, &store);
                    let skipped = before.skipped_with(&after, 100);
                    (files, (diff, skipped), Arc::new(after), order)
                })
                .await
            };
            // Diffs may finish out of order: only a later one replaces what is settled. One
            // that failed settles on nothing known, so no revert waits for it.
            let after = found
                .as_ref()
                .ok()
                .map(|(_, _, after, _)| Arc::clone(after));
            let latest = settled.send_if_modified(|(known, snapshot)| {
                if number <= *known {
                    return false;
                }
                *known = number;
                *snapshot = after;
                true
            });
            let Ok((files, (diff, skipped), after, order)) = found else {
                let _ = reply.send(None);
                return;
            };
            let event = (!files.is_empty()).then_some(SessionEvent::TurnDiff {
                turn_id,
                diff,
                files,
                skipped,
            });
            let _ = reply.send(event);
            // Stored after the turn heard its diff: the file is for after a restart, and the
            // turn's end need not wait for it.
            if latest {
                let _ = tokio::task::spawn_blocking(move || {
                    store.save(&session_id, SETTLED, order, &after)
                })
                .await;
            }
        });
    }

    /// Files changed since the last turn (or revert) left the workspace, by whoever: a person,
    /// another session, a client's `tool/invoke` between turns. Empty when nothing is known.
    async fn changed_since_settled(
        &self,
        store: &Arc<CheckpointStore>,
        workspace: &Arc<Workspace>,
    ) -> Vec<FileChange> {
        // Without the channel, no turn has left the workspace yet: nothing is known.
        let Some(settled) = &self.undo.settled else {
            return Vec::new();
        };
        let mut settled = settled.subscribe();
        let wanted = self.undo.diffs_started;
        // The last turn's diff is still being taken: it is what the workspace was left as.
        let snapshot = match tokio::time::timeout(
            std::time::Duration::from_secs(60),
            settled.wait_for(|(number, _)| *number >= wanted),
        )
        .await
        {
            Ok(Ok(state)) => state.1.clone(),
            _ => None,
        };
        let Some(snapshot) = snapshot else {
            return Vec::new();
        };
        let (store, workspace) = (Arc::clone(store), Arc::clone(workspace));
        tokio::task::spawn_blocking(move || {
            let now = Snapshot::take(&workspace, Some(&snapshot), &store);
            snapshot.changes(&now)
        })
        .await
        .unwrap_or_default()
    }

    /// `session/revert`: the workspace as it was before the turn `turn_id`.
    pub(super) async fn revert(
        &mut self,
        turn_id: &str,
        dry_run: bool,
        force: bool,
    ) -> Result<Value, SessionError> {
        if self.turn.running.is_some() {
            return Err(SessionError::TurnInProgress);
        }
        let Some((store, workspace)) = self.undo_parts() else {
            return Err(SessionError::InvalidParams(
                "the session has no workspace".into(),
            ));
        };
        self.load_checkpoints().await;
        let Some((_, before)) = self.undo.checkpoints.iter().find(|(id, _)| id == turn_id) else {
            return Err(SessionError::InvalidParams(format!(
                "no checkpoint of turn {turn_id:?}: the session keeps the workspace as each of \
                 its last {KEPT} turns found it"
            )));
        };
        let before = Arc::clone(before);
        let conflicts = self.changed_since_settled(&store, &workspace).await;
        if !conflicts.is_empty() && !dry_run && !force {
            let mut named: Vec<String> = conflicts
                .iter()
                .take(20)
                .map(|file| format!("{} ({})", file.path, file.change))
                .collect();
            if conflicts.len() > named.len() {
                named.push(format!("and {} more", conflicts.len() - named.len()));
            }
            return Err(SessionError::RevertConflict(format!(
                "{} changed since the session's last turn ended: {}; nothing was reverted \
                 (force: true reverts over them)",
                if conflicts.len() == 1 {
                    "a file"
                } else {
                    "files"
                },
                named.join(", ")
            )));
        }
        let restore = |dry_run: bool| {
            let (before, workspace, store) = (
                Arc::clone(&before),
                Arc::clone(&workspace),
                Arc::clone(&store),
            );
            async move {
                tokio::task::spawn_blocking(move || before.restore(&workspace, &store, dry_run))
                    .await
                    .map_err(|err| SessionError::InvalidParams(format!("revert failed: {err}")))?
                    .map_err(|err| SessionError::InvalidParams(format!("revert stopped at {err}")))
            }
        };
        let mut revert_id = None;
        let files = if dry_run {
            restore(true).await?
        } else {
            let planned = restore(true).await?;
            if planned.is_empty() {
                planned
            } else {
                // The revert is a checkpoint of its own: reverting `revert_id` undoes it.
                let id = format!("revert_{}", uuid::Uuid::new_v4().simple());
                self.checkpoint(&id).await;
                revert_id = Some(id);
                restore(false).await?
            }
        };
        // What reverting undoes is the opposite of what the turns did.
        let undone: Vec<Value> = files
            .iter()
            .map(|file| {
                let change = match file.change {
                    "added" => "deleted",
                    "deleted" => "added",
                    other => other,
                };
                json!({"path": file.path, "change": change})
            })
            .collect();
        let Some(revert_id) = revert_id else {
            return Ok(json!({"files": undone, "dry_run": dry_run, "conflicts": conflicts}));
        };
        // What the revert left is the new settled state: a revert of the revert is no conflict.
        let settled = {
            let session_id = self.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let settled = Snapshot::take(&workspace, Some(&before), &store);
                let _ = store.save(&session_id, SETTLED, now_ns(), &settled);
                settled
            })
            .await
            .ok()
            .map(Arc::new)
        };
        self.undo.diffs_started += 1;
        let number = self.undo.diffs_started;
        self.undo.settled().send_replace((number, settled));
        tracing::info!(turn_id, files = undone.len(), "workspace reverted");
        self.emit(SessionEvent::SessionReverted {
            turn_id: turn_id.to_string(),
            revert_id: revert_id.clone(),
            files: undone.clone(),
        })
        .await;
        Ok(
            json!({"files": undone, "dry_run": false, "revert_id": revert_id,
            "conflicts": conflicts}),
        )
    }
}
