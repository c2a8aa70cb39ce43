//! The bound on bytes waiting in the journal's submission queue: submitters block for room.

use std::sync::{Condvar, Mutex};

/// Bytes of submissions queued for the writer, with a limit that blocks submitters.
pub(crate) struct Admission {
    max: usize,
    /// Bytes queued, and whether the writer stopped (nobody waits for room any more).
    queued: Mutex<(usize, bool)>,
    room: Condvar,
}

impl Admission {
    pub fn new(max: usize) -> Self {
        Admission {
            max,
            queued: Mutex::new((0, false)),
            room: Condvar::new(),
        }
    }

    /// Blocks until `size` more bytes fit under the limit (or the queue is empty, so that a
    /// submission larger than the limit still goes through, alone), then counts them.
    pub fn acquire(&self, size: usize) {
        let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        while !q.1 && q.0 > 0 && q.0 + size > self.max {
            q = self.room.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.0 += size;
    }

    /// The writer took `size` bytes out of the queue.
    pub fn release(&self, size: usize) {
        let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        q.0 = q.0.saturating_sub(size);
        drop(q);
        self.room.notify_all();
    }

    /// The writer stopped: never block again.
    pub fn close(&self) {
        self.queued.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.room.notify_all();
    }

    /// Bytes queued now.
    pub fn queued(&self) -> usize {
        self.queued.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}
