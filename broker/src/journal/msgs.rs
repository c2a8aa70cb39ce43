//! A queue's live messages in the index: seq -> where the message's `Put` is, at 24 bytes a
//! message plus a little per chunk.
//!
//! Messages are nearly always added in seq order and removed near the front (delivery in
//! order), sometimes from the middle (receive by id, expiry, a transaction's receive), and
//! recovery inserts the compacted copies of old messages out of order. A `BTreeMap<seq, _>`
//! costs ~75 bytes a message for that (std's leaves stay 6/11 full under appends in order);
//! here the messages sit in *chunks*, vectors of at most [`CHUNK`] slots sorted by seq, kept
//! in a `BTreeMap` by a lower bound of their seqs:
//! - appending fills the last chunk, then starts a new one: full chunks, no per-node waste;
//! - removing marks the slot dead (a tombstone), without shifting anything; a chunk with
//!   nothing live goes, and one that falls below a quarter live merges with a neighbour that
//!   has room, so chunks stay at least a quarter live whatever the removal order (in practice
//!   full: messages go from the front);
//! - inserting into a chunk squeezes its dead slots out when it is full, and splits it in
//!   halves when it is full of live ones.
//!
//! Invariants: every chunk holds a live slot; the seqs of a chunk's slots (dead ones
//! included) increase strictly, are at least the chunk's key and below the next chunk's key.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};

use super::index::{Loc, MsgEntry};
use super::op::PUT_FIXED;

/// Slots in a full chunk: 3 KiB of slots. Large enough that the per-chunk cost (~80 bytes:
/// the map entry and the vector's allocation) is under a byte a message, small enough that
/// squeezing, splitting or merging one is a short copy.
pub(crate) const CHUNK: usize = 128;

/// `seg` of a dead slot (no real segment has this number: see [`Slot::new`]).
const DEAD: u32 = u32::MAX;

/// One message: its seq and where its `Put` is. The op's length is not stored: a `Put` is
/// [`PUT_FIXED`] bytes, then the header, then the body.
#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    seg: u32,
    off: u32,
    header_len: u32,
    body_len: u32,
}

impl Slot {
    fn new(seq: u64, e: &MsgEntry) -> Slot {
        debug_assert_eq!(
            e.loc.len as u64,
            PUT_FIXED as u64 + e.header_len as u64 + e.body_len as u64,
            "a Put's length is its fixed part, header and body"
        );
        // Segments are numbered from 1 up by one each (4 billion segments of at least 4 KiB:
        // 16 TiB written); offsets are below the segment size, at most 4 GiB (checked when the
        // journal opens).
        let seg = u32::try_from(e.loc.seg)
            .ok()
            .filter(|&s| s != DEAD)
            .expect("journal index: segment number beyond 32 bits");
        let off = u32::try_from(e.loc.off).expect("journal index: offset beyond 4 GiB");
        Slot {
            seq,
            seg,
            off,
            header_len: e.header_len,
            body_len: e.body_len,
        }
    }

    fn live(&self) -> bool {
        self.seg != DEAD
    }

    fn entry(&self) -> MsgEntry {
        MsgEntry {
            loc: self.loc(),
            header_len: self.header_len,
            body_len: self.body_len,
        }
    }

    fn loc(&self) -> Loc {
        Loc {
            seg: self.seg as u64,
            off: self.off as u64,
            len: (PUT_FIXED as u32)
                .wrapping_add(self.header_len)
                .wrapping_add(self.body_len),
        }
    }
}

#[derive(Debug)]
struct Chunk {
    slots: Vec<Slot>,
    /// Live slots.
    live: u32,
}

impl Chunk {
    fn one(slot: Slot) -> Chunk {
        Chunk {
            slots: vec![slot],
            live: 1,
        }
    }

    fn find(&self, seq: u64) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&seq, |s| s.seq)
    }

    /// Drops the dead slots.
    fn squeeze(&mut self) {
        self.slots.retain(Slot::live);
    }
}

/// A queue's live messages by seq (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Msgs {
    chunks: BTreeMap<u64, Chunk>,
    len: usize,
}

impl Msgs {
    /// Live messages.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where message `seq` is, if it is live. (By reference like `BTreeMap::get`; the entry
    /// comes back by value, unpacked.)
    pub fn get(&self, seq: &u64) -> Option<MsgEntry> {
        let (_, c) = self.chunks.range(..=*seq).next_back()?;
        let s = c.slots[c.find(*seq).ok()?];
        s.live().then(|| s.entry())
    }

    /// Adds message `seq`; returns the entry it replaces (a second `Put` of the same seq, or
    /// a `Rekey` onto it).
    pub fn insert(&mut self, seq: u64, e: MsgEntry) -> Option<MsgEntry> {
        let slot = Slot::new(seq, &e);
        let key = match self.chunks.range(..=seq).next_back() {
            Some((&k, _)) => k,
            None => match self.chunks.first_entry() {
                // Below every chunk: into the first one, which is keyed by it from now on.
                Some(first) => {
                    let c = first.remove();
                    self.chunks.insert(seq, c);
                    seq
                }
                None => {
                    self.chunks.insert(seq, Chunk::one(slot));
                    self.len += 1;
                    return None;
                }
            },
        };
        let c = self.chunks.get_mut(&key).expect("chunk just found");
        let i = match c.find(seq) {
            Ok(i) => {
                let old = std::mem::replace(&mut c.slots[i], slot);
                if old.live() {
                    return Some(old.entry());
                }
                c.live += 1;
                self.len += 1;
                return None;
            }
            Err(i) => i,
        };
        self.len += 1;
        if c.slots.len() < CHUNK {
            c.slots.insert(i, slot);
            c.live += 1;
        } else if (c.live as usize) < CHUNK {
            c.squeeze();
            let i = c.find(seq).expect_err("seq not in the chunk");
            c.slots.insert(i, slot);
            c.live += 1;
        } else if i == CHUNK {
            // After every slot of a full chunk (an append): a new chunk. The seq is below the
            // next chunk's key, if any, since it was not found in that one.
            self.chunks.insert(seq, Chunk::one(slot));
        } else {
            let tail = c.slots.split_off(CHUNK / 2);
            c.live = c.slots.len() as u32;
            let mut tail = Chunk {
                live: tail.len() as u32,
                slots: tail,
            };
            let half = if i < CHUNK / 2 { c } else { &mut tail };
            let i = half.find(seq).expect_err("seq not in the chunk");
            half.slots.insert(i, slot);
            half.live += 1;
            self.chunks.insert(tail.slots[0].seq, tail);
        }
        None
    }

    /// Removes message `seq`; returns its entry if it was live.
    pub fn remove(&mut self, seq: u64) -> Option<MsgEntry> {
        let (&key, c) = self.chunks.range_mut(..=seq).next_back()?;
        let i = c.find(seq).ok()?;
        let s = c.slots[i];
        if !s.live() {
            return None;
        }
        c.slots[i].seg = DEAD;
        c.live -= 1;
        self.len -= 1;
        if c.live == 0 {
            self.chunks.remove(&key);
        } else if (c.live as usize) < CHUNK / 4 {
            self.merge(key);
        }
        Some(s.entry())
    }

    /// Merges the sparse chunk at `key` with its next (or else its previous) neighbour if
    /// both fit in three quarters of a chunk.
    fn merge(&mut self, key: u64) {
        let live = self.chunks[&key].live as usize;
        let fits = |c: &Chunk| live + c.live as usize <= CHUNK * 3 / 4;
        let (first, second) = if let Some((&k, _)) = self
            .chunks
            .range((Excluded(key), Unbounded))
            .next()
            .filter(|(_, c)| fits(c))
        {
            (key, k)
        } else if let Some((&k, _)) = self
            .chunks
            .range(..key)
            .next_back()
            .filter(|(_, c)| fits(c))
        {
            (k, key)
        } else {
            return;
        };
        let second = self.chunks.remove(&second).expect("neighbour");
        let c = self.chunks.get_mut(&first).expect("chunk");
        c.squeeze();
        c.slots.extend(second.slots.into_iter().filter(Slot::live));
        c.live += second.live;
    }

    /// Removes every message with a seq up to `through`, calling `dead` with each live one.
    pub fn purge_through(&mut self, through: u64, mut dead: impl FnMut(MsgEntry)) {
        while let Some(mut first) = self.chunks.first_entry() {
            if *first.key() > through {
                break;
            }
            let c = first.get_mut();
            let whole = c.slots.last().is_some_and(|s| s.seq <= through);
            for s in c.slots.iter_mut().take_while(|s| s.seq <= through) {
                if s.live() {
                    dead(s.entry());
                    s.seg = DEAD;
                    c.live -= 1;
                    self.len -= 1;
                }
            }
            if c.live == 0 {
                first.remove();
            }
            if !whole {
                break;
            }
        }
    }

    /// Moves message `seq` from `old` to `new` (compaction copied it), if it is live at
    /// `old`. Returns whether it was.
    pub fn relocate(&mut self, seq: u64, old: Loc, new: Loc) -> bool {
        let Some((_, c)) = self.chunks.range_mut(..=seq).next_back() else {
            return false;
        };
        let Ok(i) = c.find(seq) else {
            return false;
        };
        let s = &mut c.slots[i];
        if !s.live() || s.loc() != old {
            return false;
        }
        let moved = Slot::new(
            seq,
            &MsgEntry {
                loc: new,
                ..s.entry()
            },
        );
        *s = moved;
        true
    }

    /// Live messages in seq order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, MsgEntry)> + '_ {
        self.chunks
            .values()
            .flat_map(|c| c.slots.iter().filter(|s| s.live()))
            .map(|s| (s.seq, s.entry()))
    }

    /// Heap bytes of the slots and chunks, an estimate of what the structure costs (the
    /// map's nodes counted at ~2/3 full, allocator overhead not counted).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        let slots: usize = self
            .chunks
            .values()
            .map(|c| c.slots.capacity() * std::mem::size_of::<Slot>())
            .sum();
        let per_chunk = (8 + std::mem::size_of::<Chunk>()) * 3 / 2;
        slots + self.chunks.len() * per_chunk
    }

    /// Checks the invariants (tests).
    #[cfg(test)]
    pub fn check(&self) {
        let mut n = 0;
        let keys: Vec<u64> = self.chunks.keys().copied().collect();
        for (i, (k, c)) in self.chunks.iter().enumerate() {
            assert!(c.live > 0, "empty chunk at {k}");
            assert!(c.slots.len() <= CHUNK);
            assert_eq!(c.live as usize, c.slots.iter().filter(|s| s.live()).count());
            assert!(c.slots[0].seq >= *k, "chunk {k} starts below its key");
            assert!(c.slots.windows(2).all(|w| w[0].seq < w[1].seq));
            if let Some(next) = keys.get(i + 1) {
                assert!(
                    c.slots.last().unwrap().seq < *next,
                    "chunk {k} runs into {next}"
                );
            }
            n += c.live as usize;
        }
        assert_eq!(n, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seg: u64, off: u64, body_len: u32) -> MsgEntry {
        MsgEntry {
            loc: Loc {
                seg,
                off,
                len: PUT_FIXED as u32 + 10 + body_len,
            },
            header_len: 10,
            body_len,
        }
    }

    /// A reference model next to the chunks: every operation must agree with a BTreeMap.
    struct Both {
        m: Msgs,
        r: BTreeMap<u64, MsgEntry>,
    }

    impl Both {
        fn new() -> Both {
            Both {
                m: Msgs::default(),
                r: BTreeMap::new(),
            }
        }
        fn insert(&mut self, seq: u64, e: MsgEntry) {
            assert_eq!(self.m.insert(seq, e), self.r.insert(seq, e), "insert {seq}");
            self.m.check();
        }
        fn remove(&mut self, seq: u64) {
            assert_eq!(self.m.remove(seq), self.r.remove(&seq), "remove {seq}");
            self.m.check();
        }
        fn same(&self) {
            assert_eq!(self.m.len(), self.r.len());
            let a: Vec<(u64, MsgEntry)> = self.m.iter().collect();
            let b: Vec<(u64, MsgEntry)> = self.r.iter().map(|(s, e)| (*s, *e)).collect();
            assert_eq!(a, b);
            for s in self.r.keys() {
                assert_eq!(self.m.get(s), self.r.get(s).copied());
            }
        }
    }

    #[test]
    fn slots_are_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn appends_fill_chunks_and_cost_about_24_bytes_a_message() {
        let mut m = Msgs::default();
        let n = 100_000u64;
        for s in 1..=n {
            m.insert(s, entry(1 + s / 1000, 64 + s * 140, 100));
        }
        m.check();
        assert_eq!(m.len(), n as usize);
        let per = m.heap_bytes() as f64 / n as f64;
        assert!(per < 25.0, "{per} bytes a message");
        assert_eq!(m.get(&5000), Some(entry(6, 64 + 5000 * 140, 100)));
        assert_eq!(m.get(&0), None);
        assert_eq!(m.get(&(n + 1)), None);
    }

    #[test]
    fn removal_in_the_middle_leaves_the_neighbours_and_frees_memory() {
        let mut b = Both::new();
        for s in 1..=2000u64 {
            b.insert(s, entry(1, s * 200, s as u32));
        }
        // Take every other message from the middle, then a whole stretch.
        for s in (500..1500u64).step_by(2) {
            b.remove(s);
        }
        b.same();
        let before = b.m.heap_bytes();
        for s in 300..1700u64 {
            b.remove(s);
        }
        b.same();
        assert_eq!(b.m.get(&299).map(|e| e.body_len), Some(299));
        assert_eq!(b.m.get(&1700).map(|e| e.body_len), Some(1700));
        assert_eq!(b.m.get(&1000), None);
        // Emptied chunks went, sparse ones merged: memory follows the live count.
        assert!(
            b.m.heap_bytes() < before / 2,
            "{} vs {before}",
            b.m.heap_bytes()
        );
        // A removed seq can come back (a later Put of it), and nothing is removed twice.
        b.insert(1000, entry(2, 64, 7));
        b.remove(1000);
        b.remove(1000);
        b.same();
    }

    #[test]
    fn sparse_chunks_merge_so_memory_follows_the_live_count() {
        let mut b = Both::new();
        for s in 1..=4096u64 {
            b.insert(s, entry(1, s * 200, 1));
        }
        let before = b.m.heap_bytes();
        // Keep one message in eight (expiry or receive by id thinning a backlog): no chunk
        // empties, so only merging gives memory back.
        for s in (1..=4096u64).filter(|s| s % 8 != 0) {
            b.remove(s);
        }
        b.same();
        let after = b.m.heap_bytes();
        assert!(after * 2 < before, "{after} vs {before}");
        let chunks = b.m.chunks.len();
        assert!(chunks * CHUNK / 4 <= 4096 / 8 + CHUNK, "{chunks} chunks");
    }

    #[test]
    fn random_order_inserts_and_removals_match_a_btreemap() {
        // A small xorshift: deterministic, no dependency.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut b = Both::new();
        for round in 0..20_000u64 {
            let r = next();
            let seq = match r % 4 {
                // Mostly appends, some in the middle or below everything (recovery's copies).
                0 | 1 => b.r.keys().next_back().map_or(1000, |s| s + 1 + r % 3),
                _ => (r >> 8) % 1500,
            };
            if (r >> 32) % 3 == 0 {
                b.remove(seq);
            } else {
                b.insert(
                    seq,
                    entry(1 + round / 500, round * 64, (r >> 40) as u32 % 5000),
                );
            }
            if round % 1000 == 0 {
                b.same();
            }
        }
        b.same();
    }

    #[test]
    fn draining_from_the_front_empties_the_structure() {
        let mut b = Both::new();
        for s in 1..=1000u64 {
            b.insert(s, entry(1, s * 200, 1));
        }
        for s in 1..=1000u64 {
            assert!(b.m.remove(s).is_some());
        }
        assert!(b.m.is_empty());
        assert_eq!(b.m.chunks.len(), 0);
    }

    #[test]
    fn purge_through_kills_everything_up_to_the_seq() {
        let mut m = Msgs::default();
        for s in 1..=1000u64 {
            m.insert(s, entry(1, s * 200, 1));
        }
        m.remove(10);
        let mut dead = Vec::new();
        m.purge_through(700, |e| dead.push(e.loc.off / 200));
        m.check();
        let want: Vec<u64> = (1..=700).filter(|&s| s != 10).collect();
        assert_eq!(dead, want);
        assert_eq!(m.len(), 300);
        assert_eq!(m.iter().next().map(|(s, _)| s), Some(701));
        m.purge_through(u64::MAX, |_| {});
        assert!(m.is_empty());
    }

    #[test]
    fn relocate_moves_only_the_message_at_the_old_location() {
        let mut m = Msgs::default();
        for s in 1..=300u64 {
            m.insert(s, entry(1, s * 200, 5));
        }
        let old = m.get(&150).unwrap().loc;
        let new = Loc {
            seg: 9,
            off: 4096,
            len: old.len,
        };
        // A stale old location (the message was written again since) moves nothing.
        let stale = Loc { off: 1, ..old };
        assert!(!m.relocate(150, stale, new));
        assert!(m.relocate(150, old, new));
        assert_eq!(m.get(&150).unwrap().loc, new);
        // Moved already: a second move from the old place does nothing.
        assert!(!m.relocate(150, old, Loc { seg: 10, ..new }));
        assert_eq!(m.get(&150).unwrap().loc, new);
        // A removed message is not moved back to life.
        m.remove(151);
        let l151 = Loc {
            seg: 1,
            off: 151 * 200,
            len: old.len,
        };
        assert!(!m.relocate(151, l151, new));
        assert_eq!(m.get(&151), None);
        m.check();
    }
}
