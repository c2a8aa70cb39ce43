//! Finds a queue's ready messages by id or by correlation id without a scan: one hash table per
//! key kind, built on a queue's first lookup of that kind and kept by the queue under its lock.
//!
//! A slot is 16 bytes (the key's 64-bit hash and the entry's position, lane and seq); the key
//! itself is not copied: a candidate is checked against the message in the queue. Memory per
//! indexed message: 17 bytes per slot (with hashbrown's control byte) at a load factor between
//! 7/16 and 7/8, so 19–39 bytes; nothing for queues nobody looks up by id or correlation id.

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::HashTable;

use crate::queue::{Entry, Select};

/// Lane in the top 3 bits, seq below (seqs stay far below 2^61).
const LANE_SHIFT: u32 = 61;

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    pos: u64,
}

#[derive(Debug, Default)]
struct Table(HashTable<Slot>);

/// The index of one queue (both tables absent until first used).
#[derive(Debug, Default)]
pub(crate) struct MessageIndex {
    by_id: Option<Table>,
    by_correlation: Option<Table>,
}

fn hasher() -> &'static hashbrown::DefaultHashBuilder {
    static H: OnceLock<hashbrown::DefaultHashBuilder> = OnceLock::new();
    H.get_or_init(Default::default)
}

fn id_hash(id: &uuid::Uuid) -> u64 {
    hasher().hash_one(id.as_u128())
}

fn correlation_hash(c: &str) -> u64 {
    hasher().hash_one(c)
}

impl Table {
    fn add(&mut self, hash: u64, lane: u8, seq: u64) {
        let pos = (lane as u64) << LANE_SHIFT | seq;
        self.0.insert_unique(hash, Slot { hash, pos }, |s| s.hash);
    }

    fn remove(&mut self, hash: u64, lane: u8, seq: u64) {
        let pos = (lane as u64) << LANE_SHIFT | seq;
        if let Ok(e) = self.0.find_entry(hash, |s| s.pos == pos) {
            e.remove();
        }
        // A drained queue gives its table's memory back.
        if self.0.is_empty() && self.0.capacity() > 1024 {
            self.0 = HashTable::new();
        }
    }
}

impl MessageIndex {
    fn table(&self, key: &Select) -> Option<&Table> {
        match key {
            Select::Id(_) => self.by_id.as_ref(),
            Select::Correlation(_) => self.by_correlation.as_ref(),
            _ => None,
        }
    }

    pub(crate) fn is_built(&self, key: &Select) -> bool {
        self.table(key).is_some()
    }

    /// Builds the table `key` needs from the queue's ready entries `(lane, entry)`.
    pub(crate) fn build<'a>(
        &mut self,
        key: &Select,
        entries: impl Iterator<Item = (u8, &'a Entry)>,
    ) {
        let mut t = Table::default();
        match key {
            Select::Id(_) => {
                for (lane, e) in entries {
                    t.add(id_hash(&e.msg.id), lane, e.seq);
                }
                self.by_id = Some(t);
            }
            Select::Correlation(_) => {
                for (lane, e) in entries.filter(|(_, e)| !e.msg.correlation_id.is_empty()) {
                    t.add(correlation_hash(&e.msg.correlation_id), lane, e.seq);
                }
                self.by_correlation = Some(t);
            }
            _ => {}
        }
    }

    /// A ready entry was put in its lane.
    pub(crate) fn add(&mut self, lane: u8, e: &Entry) {
        if let Some(t) = &mut self.by_id {
            t.add(id_hash(&e.msg.id), lane, e.seq);
        }
        if let Some(t) = &mut self.by_correlation {
            if !e.msg.correlation_id.is_empty() {
                t.add(correlation_hash(&e.msg.correlation_id), lane, e.seq);
            }
        }
    }

    /// A ready entry left its lane (taken, swept).
    pub(crate) fn remove(&mut self, lane: u8, e: &Entry) {
        if let Some(t) = &mut self.by_id {
            t.remove(id_hash(&e.msg.id), lane, e.seq);
        }
        if let Some(t) = &mut self.by_correlation {
            if !e.msg.correlation_id.is_empty() {
                t.remove(correlation_hash(&e.msg.correlation_id), lane, e.seq);
            }
        }
    }

    /// Adds more ready entries to the table `key` needs, after [`MessageIndex::build`] (the
    /// paged tails of a queue, read in batches).
    pub(crate) fn extend<'a>(
        &mut self,
        key: &Select,
        entries: impl Iterator<Item = (u8, &'a Entry)>,
    ) {
        match key {
            Select::Id(_) => {
                if let Some(t) = &mut self.by_id {
                    for (lane, e) in entries {
                        t.add(id_hash(&e.msg.id), lane, e.seq);
                    }
                }
            }
            Select::Correlation(_) => {
                if let Some(t) = &mut self.by_correlation {
                    for (lane, e) in entries.filter(|(_, e)| !e.msg.correlation_id.is_empty()) {
                        t.add(correlation_hash(&e.msg.correlation_id), lane, e.seq);
                    }
                }
            }
            _ => {}
        }
    }

    /// Drops the table `key` needs (a build that could not finish).
    pub(crate) fn unbuild(&mut self, key: &Select) {
        match key {
            Select::Id(_) => self.by_id = None,
            Select::Correlation(_) => self.by_correlation = None,
            _ => {}
        }
    }

    /// Every ready entry left (purge, delete): the tables go; the next lookup rebuilds them.
    pub(crate) fn clear(&mut self) {
        *self = MessageIndex::default();
    }

    /// Positions `(lane, seq)` whose key hashes like `key`'s (the caller checks each message).
    pub(crate) fn candidates(&self, key: &Select) -> Vec<(u8, u64)> {
        let hash = match key {
            Select::Id(id) => id_hash(id),
            Select::Correlation(c) => correlation_hash(c),
            _ => return Vec::new(),
        };
        let Some(t) = self.table(key) else {
            return Vec::new();
        };
        t.0.iter_hash(hash)
            .filter(|s| s.hash == hash)
            .map(|s| ((s.pos >> LANE_SHIFT) as u8, s.pos & ((1 << LANE_SHIFT) - 1)))
            .collect()
    }

    /// Heap bytes of the tables.
    pub(crate) fn bytes(&self) -> usize {
        [&self.by_id, &self.by_correlation]
            .into_iter()
            .flatten()
            .map(|t| t.0.allocation_size())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_slot_is_16_bytes_and_an_entry_stays_24() {
        assert_eq!(std::mem::size_of::<super::Slot>(), 16);
        assert_eq!(std::mem::size_of::<crate::queue::Entry>(), 24);
    }
}
