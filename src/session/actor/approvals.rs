//! Calls waiting for a person: `approval/requested` goes to the session's clients and waits
//! here until `approval/respond` answers it, or the call gives up (interrupt, timeout) and
//! withdraws it. A client that attaches while one waits is sent it again.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::SessionActor;
use crate::agent::SessionEvent;
use crate::agent::approval::{Answer, ApprovalAsk, Decision, Unanswered};
use crate::session::{Outbound, SessionError, Watcher, notification_frame, stamp};

/// Calls waiting for a person: the session's approval rules and grants, and the requests no
/// one has decided yet, by approval id.
pub(super) struct ApprovalDesk {
    pub(super) rules: Arc<crate::agent::approval::Approvals>,
    pub(super) waiting: std::collections::HashMap<String, PendingApproval>,
}

/// One approval request no one has decided yet.
#[derive(Debug)]
pub(super) struct PendingApproval {
    reply: oneshot::Sender<Answer>,
    /// The seq of its `approval/requested`.
    seq: i64,
    /// That event's frame, sent again to clients that attach meanwhile.
    frame: Arc<str>,
}

impl SessionActor {
    /// A call must wait: the clients are asked, and the call hears when one answers.
    pub(super) async fn on_approval_asked(
        &mut self,
        ask: ApprovalAsk,
        reply: oneshot::Sender<Answer>,
    ) {
        let approval_id = ask.approval_id.clone();
        let event = SessionEvent::ApprovalRequested {
            approval_id: ask.approval_id,
            tool_call_id: ask.tool_call_id,
            tool_name: ask.tool_name,
            arguments: ask.arguments,
            reason: ask.reason,
            cwd: ask.cwd,
            agent_id: ask.agent_id,
        };
        let (method, params) = event.clone().into_wire();
        self.emit(event).await;
        let seq = self.log.last_seq;
        let frame = notification_frame(&method, &stamp(&self.session_id, seq, params));
        self.approvals
            .waiting
            .insert(approval_id, PendingApproval { reply, seq, frame });
    }

    /// The call stopped waiting; its request is resolved as declined, saying why.
    pub(super) async fn on_approval_withdrawn(&mut self, approval_id: String, reason: Unanswered) {
        if self.approvals.waiting.remove(&approval_id).is_some() {
            self.emit(SessionEvent::ApprovalResolved {
                approval_id,
                decision: Decision::Decline,
                reason: Some(reason),
            })
            .await;
        }
    }

    /// `approval/respond`: the waiting call hears the decision, then every client does.
    pub(super) async fn respond_approval(
        &mut self,
        approval_id: String,
        answer: Answer,
    ) -> Result<(), SessionError> {
        let Some(pending) = self.approvals.waiting.remove(&approval_id) else {
            return Err(SessionError::UnknownApproval(approval_id));
        };
        let decision = answer.decision;
        if pending.reply.send(answer).is_err() {
            // The call gave up meanwhile; its withdrawal is on its way.
            return Err(SessionError::UnknownApproval(approval_id));
        }
        self.emit(SessionEvent::ApprovalResolved {
            approval_id,
            decision,
            reason: None,
        })
        .await;
        Ok(())
    }

    /// Sends a newly attached watcher the requests still waiting that its replay (from
    /// `after_seq`, when it replays) does not hold.
    pub(super) fn send_pending_approvals(&self, watcher: &mut Watcher, after_seq: Option<i64>) {
        let covered = after_seq.unwrap_or(i64::MAX);
        let mut waiting: Vec<&PendingApproval> = self
            .approvals
            .waiting
            .values()
            .filter(|pending| pending.seq <= covered && !pending.reply.is_closed())
            .collect();
        waiting.sort_by_key(|pending| pending.seq);
        for pending in waiting {
            // A full queue cuts the watcher off at the next event anyway.
            let _ = watcher
                .tx
                .try_send(Outbound::Text(Arc::clone(&pending.frame)));
        }
    }
}
