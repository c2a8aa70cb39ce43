//! Messages a one-message receive has taken from their queue (`ReceiveOne`, a cursor's
//! receive, the HTTP API's receive): in flight until their answer has gone, back in their
//! places if it does not.
//!
//! A receive's handler can be dropped at any await once it has taken a message: hyper drops a
//! unary call whose client reset it, axum one whose client closed its connection. Dropped
//! messages used to vanish (an express one for good, a recoverable one until a restart, the
//! queue's in-flight count never coming down). A [`Taken`] gives them back when dropped; it is
//! [kept](Taken::keep) once the answer is on its way: at once by a cursor and the HTTP API,
//! and for `ReceiveOne` once HTTP/2 has taken its whole answer (`large_bodies::HeldBody`), so
//! a client that reset its call meanwhile, or never opened its window, does not lose it.

use std::sync::Arc;

use crate::broker::Broker;
use crate::queue::{Entry, Queue};

/// Taken messages, given back to their queue when dropped unless [kept](Taken::keep).
#[must_use = "dropped, the messages go back to their queue"]
pub(crate) struct Taken {
    broker: Arc<Broker>,
    queue: Arc<Queue>,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taken")
            .field("queue", &self.queue.def().name)
            .field("messages", &self.entries.len())
            .finish()
    }
}

impl Taken {
    /// `entries`, just taken from `queue` (counted in flight).
    pub(crate) fn new(broker: &Arc<Broker>, queue: &Arc<Queue>, entries: Vec<Entry>) -> Taken {
        Taken {
            broker: broker.clone(),
            queue: queue.clone(),
            entries,
        }
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// The queue they were taken from.
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// Received for good: removed from the queue (recoverable ones by a journal record, with
    /// the `ACK_RECEIVE`s they ask for).
    pub(crate) fn keep(mut self) {
        let entries = std::mem::take(&mut self.entries);
        self.queue.complete(&entries);
        self.broker.forget_received_acked(&self.queue, &entries);
    }

    /// The entries, no longer given back when dropped: the caller removes them itself.
    pub(crate) fn into_entries(mut self) -> Vec<Entry> {
        std::mem::take(&mut self.entries)
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let gone = self.queue.restore(std::mem::take(&mut self.entries));
        self.broker.forget_deleted(&self.queue, &gone);
    }
}

/// The [`Taken`] of a `ReceiveOne` answer, in the answer's extensions: `large_bodies` moves it
/// into the answer's body, which [keeps](AnswerTaken::keep) it once HTTP/2 has taken the
/// whole answer (its trailers), and gives the message back when dropped before (the stream
/// reset, the connection gone). (Extensions must be `Clone`: the one clone is the body's.)
#[derive(Debug, Clone)]
pub(crate) struct AnswerTaken(Arc<std::sync::Mutex<Option<Taken>>>);

impl AnswerTaken {
    pub(crate) fn new(taken: Taken) -> AnswerTaken {
        AnswerTaken(Arc::new(std::sync::Mutex::new(Some(taken))))
    }

    /// The answer is written: received for good.
    pub(crate) fn keep(&self) {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = taken {
            t.keep();
        }
    }
}
