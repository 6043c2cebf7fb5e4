//! `[retention]`: deleting what sessions leave behind once it is old enough — events of closed
//! work, the output of ended tasks, sessions idle for long — daily in the server and at once
//! with `agentd gc`. Nothing open is ever touched: not a running turn's events, not a running
//! task, not a session with open work.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use time::OffsetDateTime;

use crate::store::{Store, StoreResult};
use serde::{Deserialize, Serialize};

/// `[retention]`: how long what sessions leave behind is kept; 0 keeps it forever.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Events older than this many days are deleted (only closed work: never those of a
    /// running turn, call, approval or task).
    pub events_days: u32,
    /// Background tasks that ended more than this many days ago lose their output and record.
    pub task_output_days: u32,
    /// Sessions with no event for this many days, and nothing running, are deleted.
    pub idle_session_days: u32,
}

impl RetentionConfig {
    /// Whether anything is ever deleted.
    pub fn is_enabled(&self) -> bool {
        self.events_days > 0 || self.task_output_days > 0 || self.idle_session_days > 0
    }
}

/// How often the server sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(24 * 60 * 60);

/// What one sweep deleted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Sessions deleted for being idle.
    pub sessions: Vec<String>,
    /// Events deleted.
    pub events: u64,
    /// Task records deleted (with their output files).
    pub tasks: usize,
    /// Bytes of checkpoint contents no checkpoint names any more, removed.
    pub checkpoint_bytes_removed: u64,
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deleted {} idle sessions, {} events, {} tasks' output and {} bytes of checkpoints",
            self.sessions.len(),
            self.events,
            self.tasks,
            self.checkpoint_bytes_removed
        )
    }
}

fn days_before(now: OffsetDateTime, days: u32) -> OffsetDateTime {
    now - time::Duration::days(i64::from(days))
}

/// Applies `policy` as of `now`: sessions idle past `idle_session_days` go (except those in
/// `loaded`, whose actors run here, and those holding a git worktree), then events past `events_days`, then the records and
/// output files of tasks that ended before `task_output_days`. `remove_session_files` clears
/// what a deleted session kept outside the store (its sandbox `/tmp`).
pub async fn sweep(
    store: &dyn Store,
    policy: &RetentionConfig,
    now: OffsetDateTime,
    loaded: &HashSet<String>,
    remove_session_files: &(dyn Fn(&str) + Send + Sync),
) -> StoreResult<SweepReport> {
    let mut report = SweepReport::default();
    if policy.idle_session_days > 0 {
        let before = days_before(now, policy.idle_session_days);
        for session_id in store.idle_sessions(before).await? {
            if loaded.contains(&session_id) {
                continue;
            }
            if store.delete_session(&session_id).await? {
                remove_session_files(&session_id);
                report.sessions.push(session_id);
            }
        }
    }
    if policy.events_days > 0 {
        report.events = store
            .prune_events(days_before(now, policy.events_days))
            .await?;
    }
    if policy.task_output_days > 0 {
        let paths = store
            .prune_tasks(days_before(now, policy.task_output_days))
            .await?;
        report.tasks = paths.len();
        for path in paths {
            // Gone already (a deleted session's) is as good as removed.
            let path = Path::new(&path);
            let _ = std::fs::remove_file(path);
            // A sub-agent's history and profile marker sit beside its output.
            if let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) {
                for beside in [format!("{stem}.history.jsonl"), format!("{stem}.agent")] {
                    let _ = std::fs::remove_file(path.with_file_name(beside));
                }
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::store::{NewEvent, NewSession, TaskRow, TaskState};

    fn session(id: &str) -> NewSession {
        NewSession {
            session_id: id.into(),
            user_name: None,
            cwd: String::new(),
            title: None,
            parent_session_id: None,
            agent: None,
        }
    }

    async fn events(
        store: &dyn Store,
        id: &str,
        seqs: std::ops::RangeInclusive<i64>,
        at: OffsetDateTime,
    ) {
        let sid: Arc<str> = Arc::from(id);
        for seq in seqs {
            let mut event = NewEvent::now(Arc::clone(&sid), seq, "tool/progress", &json!({}));
            event.created_at = at;
            store.append_events(&[event]).await.unwrap();
        }
    }

    fn task(
        id: &str,
        session: &str,
        state: TaskState,
        finished: Option<OffsetDateTime>,
        path: &Path,
    ) -> TaskRow {
        TaskRow {
            task_id: id.into(),
            session_id: session.into(),
            tool_call_id: "c".into(),
            tool_name: "shell".into(),
            state,
            exit_code: None,
            reason: None,
            total_bytes: 0,
            output_path: path.to_string_lossy().into_owned(),
            created_at: crate::store::truncate_to_micros(
                finished.unwrap_or_else(OffsetDateTime::now_utc),
            ),
            finished_at: finished.map(crate::store::truncate_to_micros),
        }
    }

    #[tokio::test]
    async fn a_sweep_deletes_only_old_closed_work() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::connect(&format!("sqlite://{}/r.db", dir.path().display()))
            .await
            .unwrap();
        let now = OffsetDateTime::now_utc();
        let old = crate::store::truncate_to_micros(now - time::Duration::days(40));
        for id in ["idle", "open", "tasked", "loaded", "half", "branched"] {
            store.create_session(&session(id)).await.unwrap();
            events(store.as_ref(), id, 1..=5, old).await;
        }
        // Clear: idle, tasked, loaded, branched. Open work: open. Half: clear up to 5, then 5
        // more.
        for id in ["idle", "tasked", "loaded", "half", "branched"] {
            store.mark_no_open_work(id, 5).await.unwrap();
        }
        let worktree = crate::store::SessionWorktree {
            repo: String::new(),
            path: ".agentd-worktrees/branched".into(),
            branch: "agentd/branched".into(),
            base: "HEAD".into(),
            origin_cwd: String::new(),
        };
        store
            .set_session_worktree("branched", &worktree.path, Some(&worktree))
            .await
            .unwrap();
        events(store.as_ref(), "half", 6..=10, old).await;
        let output = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "out").unwrap();
            path
        };
        let (ended_old, ended_new, running) = (output("a.log"), output("b.log"), output("c.log"));
        store
            .upsert_task(&task(
                "t-old",
                "half",
                TaskState::Completed,
                Some(old),
                &ended_old,
            ))
            .await
            .unwrap();
        store
            .upsert_task(&task(
                "t-new",
                "half",
                TaskState::Failed,
                Some(now),
                &ended_new,
            ))
            .await
            .unwrap();
        store
            .upsert_task(&task("t-run", "tasked", TaskState::Running, None, &running))
            .await
            .unwrap();

        let removed = std::sync::Mutex::new(Vec::new());
        let policy = RetentionConfig {
            events_days: 30,
            task_output_days: 30,
            idle_session_days: 30,
        };
        let loaded: HashSet<String> = ["loaded".to_string()].into();
        let report = sweep(store.as_ref(), &policy, now, &loaded, &|id| {
            removed.lock().unwrap().push(id.to_string());
        })
        .await
        .unwrap();

        // Idle and clear goes; open work, a running task, a loaded actor and a worktree stay.
        assert_eq!(report.sessions, ["idle"]);
        assert_eq!(*removed.lock().unwrap(), ["idle"]);
        for kept in ["open", "tasked", "loaded", "half", "branched"] {
            assert!(store.get_session(kept).await.unwrap().is_some(), "{kept}");
        }
        // Old events of closed work go; the open session's, and half's after its mark, stay.
        let seqs =
            |rows: Vec<crate::store::EventRow>| rows.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(
            seqs(store.events_after("half", 0, 100).await.unwrap()),
            [6, 7, 8, 9, 10]
        );
        assert_eq!(store.events_after("open", 0, 100).await.unwrap().len(), 5);
        assert!(
            store
                .events_after("tasked", 0, 100)
                .await
                .unwrap()
                .is_empty()
        );
        // Only the task that ended long ago loses its record and output.
        assert_eq!(report.tasks, 1);
        assert!(store.get_task("t-old").await.unwrap().is_none());
        assert!(!ended_old.exists());
        assert!(store.get_task("t-new").await.unwrap().is_some() && ended_new.exists());
        assert!(store.get_task("t-run").await.unwrap().is_some() && running.exists());
        // "loaded", "tasked", "branched" and the first five of "half"; "idle"'s went with it.
        assert_eq!(report.events, 20);
        store.close().await;
    }
}
