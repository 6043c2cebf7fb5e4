//! [`FrameQueue`]: the bounded queue that carries frames to one connection's writer.
//!
//! Every connected session holds two (its connection's own and the live queue of the session it
//! watches) for as long as it stays connected, idle or not. tokio's bounded channel allocates
//! about a kilobyte for each before the first frame: a 512-byte shared half padded against
//! false sharing, and a first block with room for 32 frames. futures-channel's takes about a
//! fifth of that and allocates one small node per queued frame, freed when it is taken, so an
//! idle queue holds nothing but its shared half.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_channel::mpsc;
use futures_util::Stream;

pub use tokio::sync::mpsc::error::TrySendError;

use super::Outbound;

/// Makes a queue that holds at least `capacity` frames: each sender may add one more, which
/// the channel keeps for it (so a queue with two senders holds `capacity + 2`).
pub fn frame_queue(capacity: usize) -> (FrameSender, FrameQueue) {
    let (tx, rx) = mpsc::channel(capacity);
    (FrameSender(tx), FrameQueue(rx))
}

/// The receiver of a queue is gone: nothing sent to it will be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueClosed;

/// The sending half. Sending takes `&mut self`: each sender keeps whether the queue was full
/// when it last sent, and a clone is a sender of its own.
#[derive(Debug, Clone)]
pub struct FrameSender(mpsc::Sender<Outbound>);

impl FrameSender {
    /// Queues `frame`, waiting for room while the queue is full.
    pub async fn send(&mut self, frame: Outbound) -> Result<(), QueueClosed> {
        futures_util::future::poll_fn(|cx| self.0.poll_ready(cx))
            .await
            .map_err(|_| QueueClosed)?;
        self.0.start_send(frame).map_err(|_| QueueClosed)
    }

    /// Queues `frame` at once, or says why not: the queue is full or its receiver is gone.
    pub fn try_send(&mut self, frame: Outbound) -> Result<(), TrySendError<Outbound>> {
        self.0.try_send(frame).map_err(|err| {
            if err.is_full() {
                TrySendError::Full(err.into_inner())
            } else {
                TrySendError::Closed(err.into_inner())
            }
        })
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The receiving half: frames in the order they were queued, then `None` once every sender
/// is gone.
#[derive(Debug)]
pub struct FrameQueue(mpsc::Receiver<Outbound>);

impl FrameQueue {
    /// The next frame, waiting for one; `None` when every sender is gone and nothing is left.
    pub async fn recv(&mut self) -> Option<Outbound> {
        self.0.recv().await.ok()
    }

    /// The next frame if one is queued now.
    pub fn try_recv(&mut self) -> Option<Outbound> {
        self.0.try_recv().ok()
    }
}

impl Stream for FrameQueue {
    type Item = Outbound;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outbound>> {
        Pin::new(&mut self.0).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Outbound {
        Outbound::Text(n.to_string().into())
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_a_closed_one_says_so() {
        let (mut tx, mut rx) = frame_queue(2);
        // Room for the capacity, plus the one slot the channel keeps for this sender.
        for n in 0..3 {
            tx.try_send(text(n)).unwrap();
        }
        assert!(matches!(tx.try_send(text(3)), Err(TrySendError::Full(_))));
        for n in 0..3 {
            assert!(matches!(rx.try_recv(), Some(Outbound::Text(t)) if *t == *n.to_string()));
        }
        assert!(rx.try_recv().is_none());
        tx.try_send(text(4)).unwrap();
        drop(rx);
        assert!(tx.is_closed());
        assert!(matches!(tx.try_send(text(5)), Err(TrySendError::Closed(_))));
        assert!(tx.send(text(6)).await.is_err());
    }

    #[test]
    fn a_new_sender_finds_room_for_its_first_frame_in_a_full_queue() {
        // A request's answer is queued with a sender of its own, without waiting: it must
        // never be refused for room while the connection reads.
        let (mut tx, _rx) = frame_queue(1);
        tx.try_send(text(0)).unwrap();
        tx.try_send(text(1)).unwrap();
        assert!(matches!(tx.try_send(text(2)), Err(TrySendError::Full(_))));
        let mut answer = tx.clone();
        answer.try_send(text(3)).unwrap();
    }

    #[tokio::test]
    async fn a_waiting_send_goes_through_once_there_is_room() {
        let (mut tx, mut rx) = frame_queue(0);
        tx.send(text(0)).await.unwrap();
        let mut second = tx.clone();
        let waiting = tokio::spawn(async move {
            second.send(text(1)).await.unwrap();
            second.send(text(2)).await.unwrap();
        });
        let mut got = Vec::new();
        while let Some(Outbound::Text(t)) = rx.recv().await {
            got.push(t.to_string());
            if got.len() == 3 {
                break;
            }
        }
        waiting.await.unwrap();
        assert_eq!(got, ["0", "1", "2"]);
        drop(tx);
        assert!(rx.recv().await.is_none());
    }
}
