//! What a client has learned about which queues are transactional, so that
//! [`Queue::receive`](crate::Queue::receive) from a transactional queue can go as a
//! `receive_and_commit` on a kept `Transact` stream (one round trip on an open stream) instead
//! of a unary call (a new HTTP/2 stream each time, about twice the cost here).
//!
//! A queue counts as transactional once a unary receive from it returned a transactional
//! message; a queue the broker said is not transactional (it was deleted and created again,
//! or holds transactional messages without being transactional: a dead-letter queue) stays
//! not transactional for this client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Queues remembered at most; past it the map starts again (it only saves round trips).
const MAX_REMEMBERED: usize = 4096;

/// Per queue name: `true` transactional, `false` known not to be (for good).
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueKinds(Arc<Mutex<HashMap<String, bool>>>);

impl QueueKinds {
    /// Whether `queue` is known to be transactional.
    pub(crate) fn is_transactional(&self, queue: &str) -> bool {
        let kinds = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kinds.get(queue).copied().unwrap_or(false)
    }

    /// A unary receive from `queue` returned a transactional message: it is transactional,
    /// unless the broker has said otherwise.
    pub(crate) fn saw_transactional(&self, queue: &str) {
        self.remember(queue, |kind| {
            kind.get_or_insert(true);
        });
    }

    /// The broker refused a transactional receive from `queue`: it is not transactional.
    pub(crate) fn not_transactional(&self, queue: &str) {
        self.remember(queue, |kind| *kind = Some(false));
    }

    /// Changes what is known of `queue` (`None`: nothing yet), within [`MAX_REMEMBERED`].
    fn remember(&self, queue: &str, change: impl FnOnce(&mut Option<bool>)) {
        let mut kinds = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut kind = kinds.get(queue).copied();
        change(&mut kind);
        if let Some(k) = kind {
            if kinds.len() >= MAX_REMEMBERED && !kinds.contains_key(queue) {
                kinds.clear();
            }
            kinds.insert(queue.to_string(), k);
        }
    }
}
