//! Requests that travel between the nodes of a cluster: a follower's [`SessionRequest`] as it
//! goes to the session's owner ([`Forwarded`]), and how the owner runs it on its actor.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Command, ReplyTx, SessionError, SessionHandle, SessionReply, SessionRequest};

/// The body of a forwarded request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Forwarded {
    /// The session.
    pub session_id: String,
    /// Who asked (checked by the owner against the session, as its own clients are).
    pub user: Option<String>,
    /// What was asked.
    pub call: SessionRequest,
}

/// A follower's request on its way to the owner, and where its answer goes.
pub(crate) struct Relay {
    /// The request.
    pub call: SessionRequest,
    reply: ReplyTx,
}

impl Relay {
    /// Splits a follower's command; the command back for those that never leave this node.
    pub(crate) fn of(command: Command) -> Result<Self, Command> {
        match command {
            Command::Request(asked) => {
                let (call, reply) = *asked;
                Ok(Self { call, reply })
            }
            other => Err(other),
        }
    }

    /// Answers the asker.
    pub(crate) fn answer(self, outcome: Result<SessionReply, SessionError>) {
        let _ = self.reply.send(outcome);
    }

    /// Answers the asker with the owner's reply, as the owner's node serialised it.
    pub(crate) fn answer_wire(self, outcome: Result<Value, SessionError>) {
        let reply = outcome.and_then(|value| {
            serde_json::from_value(value)
                .map_err(|err| SessionError::remote("internal", format!("owner's answer: {err}")))
        });
        self.answer(reply);
    }
}

/// Runs a forwarded call on the owner's actor; the reply, serialised for the follower.
pub(crate) async fn run(
    handle: &SessionHandle,
    call: SessionRequest,
) -> Result<Value, SessionError> {
    let reply = handle.request(call).await?;
    serde_json::to_value(reply)
        .map_err(|err| SessionError::remote("internal", format!("unserialisable answer: {err}")))
}
