//! Bodies of recently written messages, kept in memory up to a byte budget
//! ([`super::JournalOptions::body_cache_bytes`]), so that a receiver that keeps up with its
//! senders is served without reading the disk.
//!
//! It lives in the index and changes with it, under the same lock: a body is added when the
//! writer applies its `Put` (after the record is written), and dropped when the index drops
//! the message (Remove, Purge, DeleteQueue, a later Put of the same key) or moves it (Rekey).
//! When the budget is exceeded the oldest bodies are dropped first; those are read from the
//! journal as before. Recovery starts with an empty cache.

use std::collections::VecDeque;

use hashbrown::HashMap;

use bytes::Bytes;

/// What one cached body is charged besides its bytes: the map and order entries and the
/// body's own allocation, so that many tiny bodies cannot outgrow the budget.
pub(crate) const ENTRY_OVERHEAD: u64 = 128;

/// Bodies shorter than this are copied into the cache (one `memcpy` on the submitting
/// thread) rather than kept as slices: a slice would pin the whole buffer it came from
/// (a gRPC frame with many other messages), which the budget would not see.
pub(crate) const COPY_BELOW: usize = 64 * 1024;

type Key = (u64, u64);

#[derive(Default)]
pub(crate) struct BodyCache {
    budget: u64,
    bytes: u64,
    /// By `(queue, seq)`; hashbrown's default hasher (foldhash): SipHash cost ~2.5% of
    /// mqd's CPU in a recoverable send and receive.
    map: HashMap<Key, Bytes>,
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

    /// Bytes charged for the bodies held now (at most the budget).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bodies held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, key: Key) -> Option<&Bytes> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&key)
    }

    /// Keeps `body` as the body of `key` (replacing one kept before), then drops the oldest
    /// bodies while over budget. Empty bodies and bodies larger than the budget are not kept.
    pub fn insert(&mut self, key: Key, body: Bytes) {
        self.remove(key);
        let c = charge(&body);
        if body.is_empty() || c > self.budget {
            return;
        }
        self.map.insert(key, body);
        self.bytes += c;
        self.order.push_back(key);
        while self.bytes > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(b) = self.map.remove(&old) {
                self.bytes -= charge(&b);
            }
        }
        self.sweep();
    }

    /// Drops the body of `key`, if kept.
    pub fn remove(&mut self, key: Key) {
        self.take(key);
    }

    /// Drops the body of `key` and returns it.
    pub fn take(&mut self, key: Key) -> Option<Bytes> {
        if self.map.is_empty() {
            return None;
        }
        let b = self.map.remove(&key)?;
        self.bytes -= charge(&b);
        self.sweep();
        Some(b)
    }

    /// Keeps `order` within a small multiple of the live entries, and gives memory back once
    /// nothing is cached.
    fn sweep(&mut self) {
        if self.map.is_empty() {
            if self.order.capacity() > 4096 || self.map.capacity() > 4096 {
                self.order = VecDeque::new();
                self.map = HashMap::new();
            } else {
                self.order.clear();
            }
        } else if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
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
        assert!(c.order.len() <= 2 * c.len() + 1024, "{}", c.order.len());
        assert_eq!(c.bytes(), 10 + ENTRY_OVERHEAD);
    }

    #[test]
    fn nothing_kept_without_a_budget_or_over_it() {
        let mut c = BodyCache::new(0);
        c.insert((1, 1), body(1));
        assert_eq!(c.len(), 0);
        let mut c = BodyCache::new(100);
        c.insert((1, 1), body(100));
        c.insert((1, 2), Bytes::new());
        assert_eq!(c.len(), 0);
    }
}
