//! One session's background tasks: a spawn_only call starts here, its output is spooled to a
//! file as it is produced and reported in coalesced pieces, and its end is reported once. The
//! session actor owns the supervisor and turns the reports into events.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::spool::OutputSpool;
use crate::store::TaskState;
use crate::tools::{ToolEvent, ToolResult};

/// Output is reported at least this often while a task writes.
const DELTA_INTERVAL: Duration = Duration::from_millis(100);
/// ...or as soon as this much is waiting.
const DELTA_BYTES: usize = 4096;

/// What a running task tells its session.
#[derive(Debug)]
pub(crate) enum TaskReport {
    /// New output, starting at `offset` in the task's output file.
    Output {
        task_id: String,
        offset: u64,
        text: String,
    },
    /// The task ended (boxed: a channel reserves room for its largest message up front).
    Finished(Box<TaskEnd>),
    /// One run of a sub-agent ended (the agent itself lives on until closed).
    ChildEnded(Box<ChildRunEnd>),
}

/// What the session hears when one run of a sub-agent ends.
#[derive(Debug)]
pub(crate) struct ChildRunEnd {
    pub agent_id: String,
    /// Which run of the child this was; a stale one is ignored.
    pub run: u64,
    /// The answer, or why it failed.
    pub ending: Result<Option<String>, RunFailure>,
}

/// Why a sub-agent's run failed: its turn's error, as the turn reported it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct RunFailure {
    /// The turn's error kind; `None` when the run ended without saying how.
    pub kind: Option<crate::error_kind::ErrorKind>,
    /// What it said.
    pub message: String,
}

/// How a task ended.
#[derive(Debug)]
pub(crate) struct TaskEnd {
    pub task_id: String,
    /// What the call produced; its cost rows are in the ledger already.
    pub result: ToolResult,
    pub total_bytes: u64,
}

/// A task that has not reported its end yet.
#[derive(Debug)]
pub(crate) struct RunningTask {
    pub tool_call_id: String,
    pub tool_name: String,
    pub cancel: CancellationToken,
    /// Callers of `task/cancel` waiting for the final state.
    pub cancel_waiters: Vec<tokio::sync::oneshot::Sender<Option<TaskState>>>,
}

impl RunningTask {
    /// A task of `tool_name` started by `tool_call_id`, stopped by `cancel`.
    pub(crate) fn new(tool_call_id: &str, tool_name: &str, cancel: CancellationToken) -> Self {
        Self {
            tool_call_id: tool_call_id.to_string(),
            tool_name: tool_name.to_string(),
            cancel,
            cancel_waiters: Vec::new(),
        }
    }
}

/// The background tasks of one session.
pub(crate) struct TaskSupervisor {
    dir: PathBuf,
    running: HashMap<String, RunningTask>,
    /// The disk account task output is charged to.
    disk: Option<Arc<crate::disk_quota::UserDisk>>,
}

impl TaskSupervisor {
    /// A supervisor spooling output under `dir`.
    pub(crate) fn new(dir: PathBuf, disk: Option<Arc<crate::disk_quota::UserDisk>>) -> Self {
        Self {
            dir,
            running: HashMap::new(),
            disk,
        }
    }

    /// The disk account task output is charged to, if any.
    pub(crate) fn disk(&self) -> Option<&Arc<crate::disk_quota::UserDisk>> {
        self.disk.as_ref()
    }

    /// Where task output files live.
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Whether no task is running.
    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Creates the task's output file and starts `run` in the background; returns the file's
    /// path. `run` is handed the sender its tool's events go to: output lands in the file,
    /// plans, questions and progress go on to `session_events`. Output and the end are reported
    /// on `reports`; `cancel` is what stops the task.
    pub(crate) async fn start<F, R>(
        &mut self,
        task: RunningTask,
        task_id: &str,
        run: F,
        session_events: mpsc::Sender<ToolEvent>,
        reports: mpsc::Sender<TaskReport>,
        tracker: &TaskTracker,
    ) -> std::io::Result<PathBuf>
    where
        F: FnOnce(mpsc::Sender<ToolEvent>) -> R + Send + 'static,
        R: Future<Output = ToolResult> + Send + 'static,
    {
        let mut spool = OutputSpool::create(&self.dir, task_id)
            .await?
            .charged_to(self.disk.clone());
        let path = spool.path().to_path_buf();
        self.running.insert(task_id.to_string(), task);
        let task_id = task_id.to_string();
        tracker.spawn(async move {
            let (events_tx, mut events_rx) = mpsc::channel(64);
            let mut pending = String::new();
            let mut offset = 0u64;
            let mut tick = tokio::time::interval(DELTA_INTERVAL);
            let result = {
                let run = run(events_tx);
                tokio::pin!(run);
                loop {
                    tokio::select! {
                        result = &mut run => break result,
                        Some(event) = events_rx.recv() => {
                            spool_event(event, &mut spool, &mut pending, &session_events).await;
                            if pending.len() >= DELTA_BYTES {
                                report_output(&reports, &task_id, &mut offset, &mut pending).await;
                            }
                        }
                        _ = tick.tick() => {
                            if !pending.is_empty() {
                                report_output(&reports, &task_id, &mut offset, &mut pending).await;
                            }
                        }
                    }
                }
            };
            // A tool may have handed its sender to work that outlives it; take what is queued.
            while let Ok(event) = events_rx.try_recv() {
                spool_event(event, &mut spool, &mut pending, &session_events).await;
            }
            // The result's own text ends the output, so a reader sees everything the tool said.
            let tail = result.output.clone();
            if !tail.is_empty() {
                let tail = if tail.ends_with('\n') {
                    tail
                } else {
                    format!("{tail}\n")
                };
                if let Err(err) = spool.append(tail.as_bytes()).await {
                    tracing::error!(%err, "task output not written");
                }
                pending.push_str(&tail);
            }
            if !pending.is_empty() {
                report_output(&reports, &task_id, &mut offset, &mut pending).await;
            }
            let _ = reports
                .send(TaskReport::Finished(Box::new(TaskEnd {
                    task_id,
                    result,
                    total_bytes: spool.total_bytes(),
                })))
                .await;
        });
        Ok(path)
    }

    /// Asks a running task to stop; `waiter` hears its final state once it has ended, or
    /// `None` at once when it is not running.
    pub(crate) fn cancel(
        &mut self,
        task_id: &str,
        waiter: tokio::sync::oneshot::Sender<Option<TaskState>>,
    ) {
        match self.running.get_mut(task_id) {
            Some(task) => {
                task.cancel.cancel();
                task.cancel_waiters.push(waiter);
            }
            None => {
                let _ = waiter.send(None);
            }
        }
    }

    /// Stops every running task (the session is closing).
    pub(crate) fn cancel_all(&self) {
        for task in self.running.values() {
            task.cancel.cancel();
        }
    }

    /// Stops a task that could not be recorded and forgets it; its end will not be reported.
    pub(crate) fn cancel_unrecorded(&mut self, task_id: &str) {
        if let Some(task) = self.running.remove(task_id) {
            task.cancel.cancel();
        }
    }

    /// Takes every running task out, for a session that is stopping.
    pub(crate) fn drain(&mut self) -> Vec<(String, RunningTask)> {
        self.running.drain().collect()
    }

    /// Forgets a task that reported its end.
    pub(crate) fn finish(&mut self, task_id: &str) -> Option<RunningTask> {
        self.running.remove(task_id)
    }
}

/// Writes a task's output event to its file (and the pending delta); other events go on to
/// the session.
async fn spool_event(
    event: ToolEvent,
    spool: &mut OutputSpool,
    pending: &mut String,
    session_events: &mpsc::Sender<ToolEvent>,
) {
    match event {
        ToolEvent::Output { text, .. } => {
            if let Err(err) = spool.append(text.as_bytes()).await
                && spool.refusals() <= 1
            {
                tracing::error!(%err, "task output not written");
            }
            pending.push_str(&text);
        }
        other => {
            let _ = session_events.send(other).await;
        }
    }
}

async fn report_output(
    reports: &mpsc::Sender<TaskReport>,
    task_id: &str,
    offset: &mut u64,
    pending: &mut String,
) {
    let text = std::mem::take(pending);
    let at = *offset;
    *offset += text.len() as u64;
    let _ = reports
        .send(TaskReport::Output {
            task_id: task_id.to_string(),
            offset: at,
            text,
        })
        .await;
}
