//! One budget of headers in memory for all the queues that page (`--max-window-headers`).
//!
//! A queue that pages keeps the headers of up to `--queue-header-window` messages per priority
//! level in memory (its window) and only the positions of the rest. That bounds one queue, not
//! the broker: 2,097,152 empty recoverable messages over 64 queues at 8 priorities took 658 MiB
//! (helper-52), and at 10,000 queues of backlogs it would be tens of GB, with only the storage
//! quota to stop it. So the window in force is the broker's header budget shared out: each of
//! the 8 levels of each queue that pages gets `budget / (8 × queues)`, at most the configured
//! window and at least one. It is read on every placement, so it shrinks and grows as queues
//! come and go. It decides where new messages go; a level that filled its window while there
//! were fewer queues keeps what it holds until it drains (so the bound is soft: queues that
//! each filled their backlog while the count grew from 32 to n hold about
//! budget × (1 + ln(n / 32)), ~2.2 GB at 10,000 queues, against ~100 GB without it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Default `--max-window-headers`: ~330 MiB of headers at ~330 B each (a `StoredMessage`, its
/// `Arc` and its queue entry), the full window (4,096 per level) for up to 32 queues.
pub const DEFAULT_MAX_WINDOW_HEADERS: usize = 1 << 20;

/// Priority levels a queue has: each may keep a window.
const LEVELS: usize = 8;

/// The broker's header budget and the queues that share it.
#[derive(Debug)]
pub struct HeaderWindows {
    /// Headers all windows together may hold.
    budget: usize,
    /// The configured window: the most any level keeps.
    max: usize,
    /// Queues that page now.
    queues: AtomicUsize,
}

impl HeaderWindows {
    pub fn new(budget: usize, max: usize) -> Arc<Self> {
        Arc::new(HeaderWindows {
            budget,
            max,
            queues: AtomicUsize::new(0),
        })
    }

    /// The window each priority level keeps now.
    pub fn window(&self) -> usize {
        let queues = self.queues.load(Ordering::Relaxed).max(1);
        (self.budget / LEVELS.saturating_mul(queues)).clamp(1, self.max.max(1))
    }

    /// The most a level ever keeps (`--queue-header-window`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Counts one more queue that pages, for as long as the returned share lives.
    pub fn join(self: &Arc<Self>) -> Share {
        self.queues.fetch_add(1, Ordering::AcqRel);
        Share(self.clone())
    }
}

/// A queue's part in [`HeaderWindows`]: it counts while the queue lives.
#[derive(Debug)]
pub struct Share(Arc<HeaderWindows>);

impl Share {
    pub fn windows(&self) -> &HeaderWindows {
        &self.0
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.0.queues.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_out_among_the_queues_that_page() {
        let w = HeaderWindows::new(8 * 4096 * 4, 4096);
        let shares: Vec<Share> = (0..4).map(|_| w.join()).collect();
        assert_eq!(w.window(), 4096, "four queues: the full window");
        let more: Vec<Share> = (0..4).map(|_| w.join()).collect();
        assert_eq!(w.window(), 2048, "eight: half each");
        let many: Vec<Share> = (0..200_000).map(|_| w.join()).collect();
        assert_eq!(w.window(), 1, "at least one");
        drop(many);
        drop(more);
        assert_eq!(w.window(), 4096, "back as queues go");
        drop(shares);
        assert_eq!(w.window(), 4096);
    }
}
