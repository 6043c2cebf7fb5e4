//! Background tasks as the actor sees them: a spawn_only call starts through the task
//! supervisor and runs [`call::execute`] there; its output, end and final state become events
//! and rows here.

use serde_json::{Value, json};

use super::SessionActor;
use crate::agent::call::{self, Call, Spawn};
use crate::agent::context::cap_text;
use crate::agent::event::{SessionEvent, TaskUpdate};
use crate::agent::ledger::CostLabels;
use crate::llm::ChatMessage;
use crate::store::{TaskRow, TaskState, timestamp_now};
use crate::tasks::supervisor::{RunningTask, TaskEnd, TaskReport};
use crate::tools::{ToolResult, ToolState};

/// How much of a background task's result `turn/spawn_complete` carries.
const SPAWN_CONTENT_BYTES: usize = 4096;

impl SessionActor {
    /// Starts a spawn_only call as a background task and answers with its envelope: the JSON
    /// task_handle when the model can read it with `read_task_output`, else a plain sentence.
    /// A turn's spawn_only call starts in the background; its `tool/completed` is emitted
    /// here, before any report of the task can be handled, so the call's completion always
    /// precedes the task's own events.
    pub(super) async fn on_spawn_asked(
        &mut self,
        spawn: Spawn,
        reply: tokio::sync::oneshot::Sender<ToolResult>,
    ) {
        let started = std::time::Instant::now();
        let (tool_call_id, tool_name) = (spawn.tool_call_id.clone(), spawn.call.name().to_string());
        let turn_id = spawn.turn_id.clone();
        let result = self.spawn_task(spawn).await;
        self.emit(crate::agent::event::ToolCompleted::of(
            turn_id,
            &tool_call_id,
            &tool_name,
            &result,
            started.elapsed(),
        ))
        .await;
        let _ = reply.send(result);
    }

    pub(super) async fn spawn_task(&mut self, spawn: Spawn) -> ToolResult {
        let Spawn {
            call,
            arguments,
            tool_call_id,
            turn_id,
        } = spawn;
        let task_id = uuid::Uuid::new_v4().to_string();
        let tool_name = call.name().to_string();
        // A task outlives the turn that started it, but not the session.
        let cancel = self.cancel.child_token();
        let mut scope = self.call_scope(CostLabels {
            node_id: "agent".into(),
            turn_id: turn_id.clone(),
            task_id: Some(task_id.clone()),
        });
        // A task outlives the batch that started it, so it stays out of the batch rule.
        scope.exclusivity = None;
        let run = Call {
            // A spawn_only call was approved before it was handed over.
            approved: true,
            tool_call_id: tool_call_id.clone(),
            prepared: call,
            arguments,
            hold_key: task_id.clone(),
            cancel: cancel.clone(),
        };
        let started = self
            .tasks
            .start(
                RunningTask::new(&tool_call_id, &tool_name, cancel),
                &task_id,
                move |events| async move { call::execute(&events, &scope, &run).await },
                self.events.sender(),
                self.reports.sender(),
                &self.tracker,
            )
            .await;
        let path = match started {
            Ok(path) => path,
            Err(err) => {
                tracing::error!(%err, "background task could not start");
                return ToolResult::failure(format!(
                    "{tool_name} could not start in the background: {err}"
                ));
            }
        };
        let row = TaskRow::running(&task_id, &self.session_id, &tool_call_id, &tool_name, &path);
        if let Err(err) = self.writer.upsert_task(&row).await {
            // A task nobody can look up must not run: stop it and say so.
            tracing::error!(%err, "task not recorded");
            self.tasks.cancel_unrecorded(&task_id);
            return ToolResult::failure(format!(
                "{tool_name} could not start in the background: the task could not be recorded"
            ));
        }
        self.metrics.record_task_state(TaskState::Running.as_str());
        self.emit(TaskUpdate::new(&task_id, &tool_call_id, &tool_name, TaskState::Running).event())
            .await;
        let readable = self
            .registry
            .catalog()
            .get("read_task_output")
            .is_some_and(|e| e.state == ToolState::Active);
        let output_url = format!("/api/tasks/{task_id}/output");
        let envelope = if readable {
            json!({
                "ok": true,
                "task_handle": task_id,
                "summary": format!("{tool_name} is running in the background"),
                "read_with": "read_task_output",
                "read_modes": ["head", "tail", "grep", "line_range", "bytes"],
                "output_url": output_url,
            })
            .to_string()
        } else {
            format!(
                "{tool_name} is running in the background as task {task_id}; its output is at {output_url}."
            )
        };
        ToolResult::ok(envelope).with_metadata(json!({"task_id": task_id}))
    }

    /// The session is stopping (shutdown, deletion): every running task is cancelled and
    /// recorded so, rather than left `running` for the next start to mark failed.
    pub(super) async fn cancel_tasks_on_stop(&mut self) {
        self.tasks.cancel_all();
        for (task_id, task) in self.tasks.drain() {
            self.ledger.release(&task_id);
            let reason = "the session stopped";
            self.store_task_state(&task_id, TaskState::Cancelled, Some(reason), None, None)
                .await;
            self.metrics
                .record_task_state(TaskState::Cancelled.as_str());
            let update = TaskUpdate::new(
                &task_id,
                &task.tool_call_id,
                &task.tool_name,
                TaskState::Cancelled,
            )
            .because(Some(reason.into()));
            self.emit(update.event()).await;
            for waiter in task.cancel_waiters {
                let _ = waiter.send(Some(TaskState::Cancelled));
            }
        }
    }

    pub(super) async fn on_task_report(&mut self, report: TaskReport) {
        match report {
            TaskReport::Output {
                task_id,
                offset,
                text,
            } => {
                self.emit(SessionEvent::TaskOutputDelta {
                    task_id,
                    offset,
                    text,
                })
                .await;
            }
            TaskReport::ChildEnded(end) => self.on_child_run_end(*end).await,
            TaskReport::Finished(end) => {
                let TaskEnd {
                    task_id,
                    result,
                    total_bytes,
                } = *end;
                self.finish_task(task_id, result, total_bytes).await;
            }
        }
    }

    async fn finish_task(&mut self, task_id: String, result: ToolResult, total_bytes: u64) {
        let Some(task) = self.tasks.finish(&task_id) else {
            return;
        };
        let state = if task.cancel.is_cancelled() {
            TaskState::Cancelled
        } else if result.success {
            TaskState::Completed
        } else {
            TaskState::Failed
        };
        let exit_code = result
            .structured_metadata
            .as_ref()
            .and_then(|m| m.get("exit_code"))
            .and_then(Value::as_i64)
            .map(|c| c as i32);
        let reason = match state {
            TaskState::Cancelled => Some("cancelled on request".to_string()),
            TaskState::Failed => Some(first_line(&result.output)),
            _ => None,
        };
        self.store_task_state(
            &task_id,
            state,
            reason.as_deref(),
            exit_code,
            Some(total_bytes),
        )
        .await;
        self.metrics.record_task_state(state.as_str());
        let mut update =
            TaskUpdate::new(&task_id, &task.tool_call_id, &task.tool_name, state).because(reason);
        update.exit_code = exit_code;
        self.emit(update.event()).await;
        let content = cap_text(&result.output, SPAWN_CONTENT_BYTES);
        self.emit(SessionEvent::SpawnComplete {
            task_id: task_id.clone(),
            tool_call_id: task.tool_call_id.clone(),
            tool_name: task.tool_name.clone(),
            success: state == TaskState::Completed,
            content: content.clone(),
            node_costs: result.costs,
        })
        .await;
        // Whoever cancelled hears back only after the notifications the cancel caused.
        for waiter in task.cancel_waiters {
            let _ = waiter.send(Some(state));
        }
        let note = ChatMessage::user(format!(
            "[background task {task_id} ({}) {state}]\n{content}",
            task.tool_name
        ));
        if self.turn.running.is_some() {
            self.turn.notes.push(note);
        } else {
            self.remember_note(&note).await;
        }
    }

    /// Records a task's new state: its reason and exit code, the size of its output (`total`,
    /// else its output file's length) and `finished_at`, unless it runs (again).
    pub(super) async fn store_task_state(
        &self,
        task_id: &str,
        state: TaskState,
        reason: Option<&str>,
        exit_code: Option<i32>,
        total: Option<u64>,
    ) {
        match self.store.get_task(task_id).await {
            Ok(Some(mut row)) => {
                row.state = state;
                row.reason = reason.map(str::to_string);
                row.exit_code = exit_code;
                // A running writer may hold its spool; the file's length is the truth.
                row.total_bytes = match total {
                    Some(total) => total as i64,
                    None => std::fs::metadata(&row.output_path)
                        .map_or(row.total_bytes, |meta| meta.len() as i64),
                };
                row.finished_at = state.is_final().then(timestamp_now);
                if let Err(err) = self.writer.upsert_task(&row).await {
                    tracing::error!(%err, task_id, "task state not recorded");
                }
            }
            Ok(None) => {}
            Err(err) => tracing::error!(%err, task_id, "task unreadable"),
        }
    }
}

fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("failed");
    cap_text(line, 200)
}
