//! Bodies (under 64 KiB) of recently written messages, kept in memory up to a byte budget
//! ([`super::JournalOptions::body_cache_bytes`]), so that a receiver that keeps up with its
//! senders is served without reading the disk.
//!
//! It lives in the index and changes with it, under the same lock: a body is added when the
//! writer applies its `Put` (after the record is written), and dropped when the index drops
//! the message (Remove, Purge, DeleteQueue, a later Put of the same key) or moves it (Rekey).
//! When the budget is exceeded the oldest bodies are dropped first; those are read from the
//! journal as before. Recovery starts with an empty cache.

use std::collections::{BTreeMap, VecDeque};

use hashbrown::HashMap;

use bytes::Bytes;

/// What one cached body is charged besides its bytes: the map and order entries and the
/// body's own allocation, so that many tiny bodies cannot outgrow the budget.
pub(crate) const ENTRY_OVERHEAD: u64 = 128;

/// Only bodies shorter than this are kept, each copied (one `memcpy` on the submitting
/// thread) rather than kept as a slice: a slice pins the whole buffer it came from (tonic's
/// receive buffer, with other messages' bytes), which the budget would not see. Larger bodies
/// are read back from the journal: a syscall per 64 KiB or more is not what costs there.
pub(crate) const MAX_BODY: usize = 64 * 1024;

type Key = (u64, u64);

#[derive(Default)]
pub(crate) struct BodyCache {
    budget: u64,
    bytes: u64,
    len: usize,
    /// By queue, then seq. Seqs grow, so puts land at the right end of a queue's map and
    /// removals mostly at its left end: both stay in the CPU's cache (a hash map of every
    /// `(queue, seq)` missed it on most inserts and removals: ~4% of mqd's CPU in a send).
    queues: HashMap<u64, BTreeMap<u64, Bytes>>,
    /// Insertion order, oldest first. May hold keys no longer cached (removed since); they
    /// are skipped when evicting and swept out once they outnumber the live ones.
    order: VecDeque<Key>,
}

fn charge(b: &Bytes) -> u64 {
    b.len() as u64 + ENTRY_OVERHEAD
}

impl BodyCache {
    pub fn new(budget: u64) -> Self {
        BodyCache {
            budget,
            ..BodyCache::default()
        }
    }

    /// Whether it keeps anything at all (a budget above 0).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Bytes charged for the bodies held now (at most the budget).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bodies held now.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, (queue, seq): Key) -> Option<&Bytes> {
        if self.len == 0 {
            return None;
        }
        self.queues.get(&queue)?.get(&seq)
    }

    /// Keeps `body` as the body of `key` (replacing one kept before), then drops the oldest
    /// bodies while over budget. Empty bodies, bodies of [`MAX_BODY`] or more and bodies larger
    /// than the budget are not kept.
    pub fn insert(&mut self, key: Key, body: Bytes) {
        self.remove(key);
        let c = charge(&body);
        if body.is_empty() || body.len() >= MAX_BODY || c > self.budget {
            return;
        }
        self.queues.entry(key.0).or_default().insert(key.1, body);
        self.len += 1;
        self.bytes += c;
        self.order.push_back(key);
        while self.bytes > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.take_one(old);
        }
        self.sweep();
    }

    /// Drops the body of `key`, if kept.
    pub fn remove(&mut self, key: Key) {
        self.take(key);
    }

    /// Drops the body of `key` and returns it.
    pub fn take(&mut self, key: Key) -> Option<Bytes> {
        let b = self.take_one(key)?;
        self.sweep();
        Some(b)
    }

    /// Drops the bodies of `queue` up to `through_seq` (a purge).
    pub fn purge(&mut self, queue: u64, through_seq: u64) {
        let Some(q) = self.queues.get_mut(&queue) else {
            return;
        };
        let keep = match through_seq.checked_add(1) {
            Some(next) => q.split_off(&next),
            None => BTreeMap::new(),
        };
        let gone = std::mem::replace(q, keep);
        if q.is_empty() {
            self.queues.remove(&queue);
        }
        self.forget(gone);
    }

    /// Drops every body of `queue` (its deletion).
    pub fn remove_queue(&mut self, queue: u64) {
        if let Some(gone) = self.queues.remove(&queue) {
            self.forget(gone);
        }
    }

    fn forget(&mut self, gone: BTreeMap<u64, Bytes>) {
        self.len -= gone.len();
        self.bytes -= gone.values().map(charge).sum::<u64>();
        self.sweep();
    }

    fn take_one(&mut self, (queue, seq): Key) -> Option<Bytes> {
        if self.len == 0 {
            return None;
        }
        let q = self.queues.get_mut(&queue)?;
        let b = q.remove(&seq)?;
        if q.is_empty() {
            self.queues.remove(&queue);
        }
        self.len -= 1;
        self.bytes -= charge(&b);
        Some(b)
    }

    fn contains(&self, key: Key) -> bool {
        self.get(key).is_some()
    }

    /// Keeps `order` within a small multiple of the live entries, and gives memory back once
    /// nothing is cached.
    fn sweep(&mut self) {
        if self.len == 0 {
            if self.order.capacity() > 4096 {
                self.order = VecDeque::new();
            } else {
                self.order.clear();
            }
        } else if self.order.len() > 4 * self.len + 1024 {
            let mut order = std::mem::take(&mut self.order);
            order.retain(|k| self.contains(*k));
            self.order = order;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize) -> Bytes {
        Bytes::from(vec![7u8; n])
    }

    #[test]
    fn stays_within_the_budget_dropping_the_oldest_first() {
        let mut c = BodyCache::new(3 * (1000 + ENTRY_OVERHEAD));
        for s in 1..=5 {
            c.insert((1, s), body(1000));
            assert!(c.bytes() <= 3 * (1000 + ENTRY_OVERHEAD));
        }
        assert_eq!(c.len(), 3);
        assert!(c.get((1, 2)).is_none());
        assert!(c.get((1, 3)).is_some() && c.get((1, 5)).is_some());
    }

    #[test]
    fn removal_gives_bytes_back_and_the_order_is_swept() {
        let mut c = BodyCache::new(1 << 30);
        for s in 0..10_000 {
            c.insert((1, s), body(10));
            c.remove((1, s));
        }
        assert_eq!((c.len(), c.bytes()), (0, 0));
        c.insert((1, 0), body(10));
        for s in 1..10_000 {
            c.insert((2, s), body(10));
            c.remove((2, s));
        }
        assert!(c.order.len() <= 4 * c.len() + 1024, "{}", c.order.len());
        assert_eq!(c.bytes(), 10 + ENTRY_OVERHEAD);
    }

    #[test]
    fn nothing_kept_without_a_budget_or_over_it() {
        let mut c = BodyCache::new(0);
        c.insert((1, 1), body(1));
        assert_eq!(c.len(), 0);
        let mut c = BodyCache::new(1 << 30);
        c.insert((1, 1), body(MAX_BODY));
        assert_eq!(c.len(), 0);
        let mut c = BodyCache::new(100);
        c.insert((1, 1), body(100));
        c.insert((1, 2), Bytes::new());
        assert_eq!(c.len(), 0);
    }
}
