//! Where a session actor's answer to one request goes: to a caller waiting for it, or straight
//! on to where the asker wants it (a connection's answer frame, which the actor then queues
//! behind the session's events itself, with no task waiting in between).

use std::fmt;

use tokio::sync::oneshot;

use super::{SessionError, SessionReply};

/// What a request is answered with.
pub(crate) type Outcome = Result<SessionReply, SessionError>;

/// Where the actor sends its answer to one [`super::SessionRequest`].
#[derive(Debug)]
pub(crate) enum ReplyTx {
    /// A caller awaiting the answer.
    Waiting(oneshot::Sender<Outcome>),
    /// The asker's own delivery, run by whoever answers.
    Delivered(Delivery),
}

impl ReplyTx {
    /// Answers; the answer back when a waiting caller has stopped waiting.
    pub(crate) fn send(self, outcome: Outcome) -> Result<(), Outcome> {
        match self {
            Self::Waiting(waiting) => waiting.send(outcome),
            Self::Delivered(mut delivery) => {
                if let Some(deliver) = delivery.0.take() {
                    deliver(outcome);
                }
                Ok(())
            }
        }
    }
}

/// A delivery run once: with the answer, or with [`SessionError::ActorGone`] if it is dropped
/// unanswered (the actor stopped with the request queued), as a waiting caller hears when its
/// channel closes.
pub(crate) struct Delivery(Option<Box<dyn FnOnce(Outcome) + Send + Sync>>);

impl Delivery {
    /// A delivery running `deliver`.
    pub(crate) fn new(deliver: impl FnOnce(Outcome) + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(deliver)))
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(deliver) = self.0.take() {
            deliver(Err(SessionError::ActorGone));
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn recorder() -> (Delivery, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&seen);
        let delivery = Delivery::new(move |outcome: Outcome| {
            let said = match outcome {
                Ok(reply) => format!("ok {reply:?}"),
                Err(err) => format!("err {err}"),
            };
            into.lock().unwrap().push(said);
        });
        (delivery, seen)
    }

    #[test]
    fn a_delivery_runs_once_with_the_answer() {
        let (delivery, seen) = recorder();
        assert!(
            ReplyTx::Delivered(delivery)
                .send(Ok(SessionReply::Done))
                .is_ok()
        );
        assert_eq!(*seen.lock().unwrap(), ["ok Done"]);
    }

    #[test]
    fn a_delivery_dropped_unanswered_says_the_actor_is_gone() {
        let (delivery, seen) = recorder();
        drop(ReplyTx::Delivered(delivery));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0], format!("err {}", SessionError::ActorGone));
    }
}
