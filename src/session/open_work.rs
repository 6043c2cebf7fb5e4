//! Work a stopped process left open in a session's event log — a running turn, calls without a
//! result, approvals nobody answered, tasks still `running` — and the events that end it, so a
//! replay shows every turn ended and no client waits on a ghost.
//!
//! Start-up ends it for every session the store marks (see `sessions_with_open_work`), before
//! any actor loads; a cluster takeover ends it for the session it takes.

use std::sync::Arc;

use serde_json::Value;

use crate::agent::SessionEvent;
use crate::agent::approval::{Decision, Unanswered};
use crate::agent::event::{TaskUpdate, ToolCompleted, TurnCompletion};
use crate::store::{NewEvent, Store, StoreResult, TaskState};

/// Why open work was ended; the `reason` its ending events carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The server stopped (or died) and started again.
    ServerRestarted,
    /// The cluster node running the session was lost and another took it over.
    NodeLost,
}

impl Ending {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServerRestarted => "server_restarted",
            Self::NodeLost => "node_lost",
        }
    }

    /// The `reason` of the `turn/completed` that ends a turn left open.
    fn completion(self) -> TurnCompletion {
        match self {
            Self::ServerRestarted => TurnCompletion::ServerRestarted,
            Self::NodeLost => TurnCompletion::NodeLost,
        }
    }

    /// The `reason` of the `approval/resolved` that declines a request left open.
    fn unanswered(self) -> Unanswered {
        match self {
            Self::ServerRestarted => Unanswered::ServerRestarted,
            Self::NodeLost => Unanswered::NodeLost,
        }
    }

    fn in_words(self) -> &'static str {
        match self {
            Self::ServerRestarted => "the server restarted before the call finished",
            Self::NodeLost => "the node running the call was lost before it finished",
        }
    }
}

/// A call that started and has no `tool/completed`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OpenCall {
    turn_id: Option<String>,
    tool_call_id: String,
    tool_name: String,
}

/// A task whose last `task/updated` says `running`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OpenTask {
    task_id: String,
    tool_call_id: String,
    tool_name: String,
}

/// What is open after a run of events, read in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct OpenWork {
    turn: Option<String>,
    calls: Vec<OpenCall>,
    approvals: Vec<String>,
    tasks: Vec<OpenTask>,
}

fn text(params: &Value, key: &str) -> Option<String> {
    params.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl OpenWork {
    /// Takes one stored event into account.
    pub(crate) fn observe(&mut self, method: &str, params: &Value) {
        match method {
            "turn/started" => self.turn = text(params, "turn_id"),
            "turn/completed" | "turn/error" if self.turn == text(params, "turn_id") => {
                self.turn = None;
            }
            "tool/started" => {
                if let (Some(tool_call_id), Some(tool_name)) =
                    (text(params, "tool_call_id"), text(params, "tool_name"))
                {
                    self.calls.push(OpenCall {
                        turn_id: text(params, "turn_id"),
                        tool_call_id,
                        tool_name,
                    });
                }
            }
            "tool/completed" => {
                let id = text(params, "tool_call_id");
                self.calls
                    .retain(|call| Some(&call.tool_call_id) != id.as_ref());
            }
            "approval/requested" => {
                if let Some(id) = text(params, "approval_id") {
                    self.approvals.push(id);
                }
            }
            "approval/resolved" => {
                let id = text(params, "approval_id");
                self.approvals.retain(|open| Some(open) != id.as_ref());
            }
            "task/updated" => {
                let Some(task_id) = text(params, "task_id") else {
                    return;
                };
                self.tasks.retain(|task| task.task_id != task_id);
                if params.get("state").and_then(Value::as_str) == Some("running")
                    && let (Some(tool_call_id), Some(tool_name)) =
                        (text(params, "tool_call_id"), text(params, "tool_name"))
                {
                    self.tasks.push(OpenTask {
                        task_id,
                        tool_call_id,
                        tool_name,
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether nothing is open.
    pub(crate) fn is_empty(&self) -> bool {
        self.turn.is_none()
            && self.calls.is_empty()
            && self.approvals.is_empty()
            && self.tasks.is_empty()
    }

    /// The events that end it, in the order a live server would have sent them: approvals
    /// declined, calls failed, tasks failed, then the turn.
    pub(crate) fn endings(self, ending: Ending, session_cost_usd: f64) -> Vec<SessionEvent> {
        let mut events = Vec::new();
        for approval_id in self.approvals {
            events.push(SessionEvent::ApprovalResolved {
                approval_id,
                decision: Decision::Decline,
                reason: Some(ending.unanswered()),
            });
        }
        for call in self.calls {
            let result =
                crate::tools::ToolResult::failure(format!("interrupted: {}", ending.in_words()))
                    .with_metadata(serde_json::json!({
                        "error": {"kind": "interrupted", "reason": ending.as_str()}
                    }));
            events.push(ToolCompleted::of(
                call.turn_id,
                &call.tool_call_id,
                &call.tool_name,
                &result,
                std::time::Duration::ZERO,
            ));
        }
        for task in self.tasks {
            events.push(
                TaskUpdate::new(
                    &task.task_id,
                    &task.tool_call_id,
                    &task.tool_name,
                    TaskState::Failed,
                )
                .because(Some(ending.in_words().replace("call", "task")))
                .event(),
            );
        }
        if let Some(turn_id) = self.turn {
            events.push(SessionEvent::TurnCompleted {
                turn_id,
                tokens_in: 0,
                tokens_out: 0,
                tokens_cached: 0,
                cost_usd: 0.0,
                session_cost_usd,
                reason: ending.completion(),
                node_costs: Vec::new(),
            });
        }
        events
    }
}

/// What [`end_open_work`] appended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Events appended.
    pub events: usize,
    /// Whether one of them ended a turn.
    pub turn: bool,
}

/// Reads the session's events after `after_seq` and appends the events that end whatever is
/// open, then marks the session clear. Call it only while no actor of the session runs (at
/// start-up, or holding a fresh lease).
pub(crate) async fn end_open_work(
    store: &dyn Store,
    session_id: &str,
    after_seq: i64,
    ending: Ending,
) -> StoreResult<Ended> {
    const PAGE: i64 = 500;
    let mut open = OpenWork::default();
    let mut cursor = after_seq;
    loop {
        let page = store.events_after(session_id, cursor, PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        cursor = last.seq;
        for event in &page {
            open.observe(&event.method, &event.params);
        }
        if (page.len() as i64) < PAGE {
            break;
        }
    }
    let mut last_seq = cursor;
    let mut ended = Ended {
        events: 0,
        turn: open.turn.is_some(),
    };
    if !open.is_empty() {
        let session_cost_usd = store
            .cost_rows(session_id)
            .await?
            .iter()
            .fold(0.0, |sum, row| sum + row.actual_usd);
        let sid: Arc<str> = Arc::from(session_id);
        let events: Vec<NewEvent> = open
            .endings(ending, session_cost_usd)
            .into_iter()
            .zip(cursor + 1..)
            .map(|(event, seq)| {
                let (method, params) = event.into_wire();
                let params = super::stamp(session_id, seq, params);
                NewEvent::now(Arc::clone(&sid), seq, &method, &params)
            })
            .collect();
        store.append_events(&events).await?;
        ended.events = events.len();
        last_seq = cursor + ended.events as i64;
    }
    store.mark_no_open_work(session_id, last_seq).await?;
    Ok(ended)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(events: &[(&str, Value)]) -> OpenWork {
        let mut open = OpenWork::default();
        for (method, params) in events {
            open.observe(method, params);
        }
        open
    }

    #[test]
    fn a_turn_waiting_on_an_approval_ends_declined_failed_and_completed() {
        let open = read(&[
            ("turn/started", json!({"turn_id": "t1"})),
            ("turn/completed", json!({"turn_id": "t1"})),
            ("turn/started", json!({"turn_id": "t2"})),
            (
                "tool/started",
                json!({"turn_id": "t2", "tool_call_id": "c1", "tool_name": "read_file"}),
            ),
            (
                "tool/completed",
                json!({"turn_id": "t2", "tool_call_id": "c1", "tool_name": "read_file"}),
            ),
            (
                "tool/started",
                json!({"turn_id": "t2", "tool_call_id": "c2", "tool_name": "shell"}),
            ),
            (
                "approval/requested",
                json!({"approval_id": "a1", "tool_call_id": "c2"}),
            ),
            (
                "task/updated",
                json!({"task_id": "k1", "tool_call_id": "c0", "tool_name": "run_pipeline", "state": "running"}),
            ),
            (
                "task/updated",
                json!({"task_id": "k2", "tool_call_id": "c9", "tool_name": "shell", "state": "running"}),
            ),
            (
                "task/updated",
                json!({"task_id": "k2", "tool_call_id": "c9", "tool_name": "shell", "state": "completed"}),
            ),
        ]);
        let wire: Vec<(String, Value)> = open
            .endings(Ending::ServerRestarted, 0.25)
            .into_iter()
            .map(SessionEvent::into_wire)
            .collect();
        let methods: Vec<&str> = wire.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            methods,
            [
                "approval/resolved",
                "tool/completed",
                "task/updated",
                "turn/completed"
            ]
        );
        assert_eq!(
            wire[0].1,
            json!({"approval_id": "a1", "decision": "decline", "reason": "server_restarted"})
        );
        assert_eq!(wire[1].1["tool_call_id"], "c2");
        assert_eq!(wire[1].1["turn_id"], "t2");
        assert_eq!(wire[1].1["success"], false);
        assert_eq!(
            wire[1].1["structured_metadata"]["error"]["reason"],
            "server_restarted"
        );
        assert_eq!(wire[2].1["task_id"], "k1");
        assert_eq!(wire[2].1["state"], "failed");
        assert_eq!(wire[3].1["turn_id"], "t2");
        assert_eq!(wire[3].1["reason"], "server_restarted");
        assert_eq!(wire[3].1["session_cost_usd"], 0.25);
    }

    #[test]
    fn closed_work_leaves_nothing_to_end() {
        let open = read(&[
            ("turn/started", json!({"turn_id": "t1"})),
            (
                "tool/started",
                json!({"tool_call_id": "c1", "tool_name": "shell"}),
            ),
            ("approval/requested", json!({"approval_id": "a1"})),
            (
                "approval/resolved",
                json!({"approval_id": "a1", "decision": "accept"}),
            ),
            (
                "tool/completed",
                json!({"tool_call_id": "c1", "tool_name": "shell"}),
            ),
            (
                "turn/error",
                json!({"turn_id": "t1", "code": "interrupted"}),
            ),
        ]);
        assert!(open.is_empty(), "{open:?}");
        assert!(open.endings(Ending::NodeLost, 0.0).is_empty());
    }
}
