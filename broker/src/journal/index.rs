//! The live index: where every live def and message is, and how many live bytes each
//! segment holds.
//!
//! Recovery and the writer both change it only through [`Index::apply`], in file order, so
//! the index after a run and the index rebuilt by replaying that run's files are the same.
//! Every tombstone (Remove, Purge, DeleteQueue) matches on `(queue, seq)` or `queue` alone,
//! never on position, and kills only what the index holds when it is applied, i.e. records
//! earlier in file order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use super::cache::BodyCache;
use super::io::SegmentFile;
pub(crate) use super::msgs::Msgs;
use super::op::{Mark, Op, PUT_FIXED};

/// Where an op's bytes are: segment, file offset of the op (inside a record's payload), length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub seg: u64,
    pub off: u64,
    pub len: u32,
}

/// What a live op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    Def(u64),
    Msg(u64, u64),
}

pub(crate) struct SegMeta {
    pub file: Arc<dyn SegmentFile>,
    /// Allocated size of the file.
    pub cap: u64,
    /// End of written records (where the next record goes in the active segment).
    pub end: u64,
    /// Sum of `len` of live ops in this segment.
    pub live: u64,
    /// Number of live ops in this segment. (Which ops are live is not kept per segment:
    /// compaction walks the segment's records and asks the index, see [`Index::live_key`].)
    pub live_ops: u64,
}

/// Where a live message's `Put` is. Kept packed in [`Msgs`] (24 bytes with its seq); this is
/// the unpacked view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgEntry {
    pub loc: Loc,
    pub header_len: u32,
    pub body_len: u32,
}

impl MsgEntry {
    pub fn body_off(&self) -> u64 {
        self.loc.off + PUT_FIXED as u64 + self.header_len as u64
    }
}

#[derive(Default)]
pub(crate) struct QueueEntry {
    pub def: Option<(Loc, Bytes)>,
    pub msgs: Msgs,
}

#[derive(Default)]
pub(crate) struct Index {
    pub queues: HashMap<u64, QueueEntry>,
    pub segs: BTreeMap<u64, SegMeta>,
    pub max_queue_id: u64,
    pub max_seq: BTreeMap<u64, u64>,
    /// Recovery only: the header of every Put seen, by `(queue, seq)` (later Puts replace
    /// earlier ones; removed messages are dropped; purged or deleted ones are simply never
    /// asked for). Emptied when recovery hands the messages to the broker, so a running
    /// journal keeps no headers in memory.
    pub headers: HashMap<(u64, u64), Bytes>,
    /// Live `Put`s that a `Rekey` moved, by `(segment, offset)`: the `(queue, seq)` they are
    /// live under now (their bytes still name the key they were written with). Compaction
    /// finds them by it, and rewrites the key when it copies them forward.
    pub rekeyed: HashMap<(u64, u64), (u64, u64)>,
    /// Bodies of recently written messages (see `cache.rs`); dropped with their message.
    /// Recovery runs with no budget, so it keeps none.
    pub cache: BodyCache,
}

impl Index {
    /// Where live message `seq` of queue `queue_id` is.
    pub fn msg(&self, queue_id: u64, seq: u64) -> Option<MsgEntry> {
        self.queues.get(&queue_id)?.msgs.get(&seq)
    }

    fn kill(&mut self, loc: Loc) {
        if !self.rekeyed.is_empty() {
            self.rekeyed.remove(&(loc.seg, loc.off));
        }
        // Every live op is referenced from exactly one place (a queue's def or one entry of
        // its messages), and is killed when that reference goes or is replaced: once.
        if let Some(s) = self.segs.get_mut(&loc.seg) {
            debug_assert!(
                s.live >= loc.len as u64 && s.live_ops > 0,
                "index: op killed twice"
            );
            s.live = s.live.saturating_sub(loc.len as u64);
            s.live_ops = s.live_ops.saturating_sub(1);
        }
    }

    fn add(&mut self, loc: Loc) {
        let s = self
            .segs
            .get_mut(&loc.seg)
            .expect("index: op in a segment the index does not know");
        s.live += loc.len as u64;
        s.live_ops += 1;
    }

    /// The key under which the op `op` found at `loc` is live, if it is: what compaction asks
    /// of each op of the segment it walks.
    pub fn live_key(&self, op: &Op, loc: Loc) -> Option<Key> {
        match op {
            Op::DefineQueue { queue_id, .. } => {
                let (l, _) = self.queues.get(queue_id)?.def.as_ref()?;
                (*l == loc).then_some(Key::Def(*queue_id))
            }
            Op::Put { queue_id, seq, .. } => {
                let (q, s) = if self.rekeyed.is_empty() {
                    None
                } else {
                    self.rekeyed.get(&(loc.seg, loc.off)).copied()
                }
                .unwrap_or((*queue_id, *seq));
                let m = self.msg(q, s)?;
                (m.loc == loc).then_some(Key::Msg(q, s))
            }
            _ => None,
        }
    }

    fn see(&mut self, queue_id: u64, seq: Option<u64>) {
        self.max_queue_id = self.max_queue_id.max(queue_id);
        if let Some(seq) = seq {
            let m = self.max_seq.entry(queue_id).or_insert(0);
            *m = (*m).max(seq);
        }
    }

    /// Applies one op found at `loc`. `keep_header`: keep Put headers (recovery only).
    /// Bytes kept in the index are copied so they do not pin a whole segment buffer.
    pub fn apply(&mut self, op: &Op, loc: Loc, keep_header: bool) {
        match op {
            Op::DefineQueue { queue_id, def } => {
                self.see(*queue_id, None);
                let old = self.queues.entry(*queue_id).or_default().def.take();
                if let Some((old, _)) = old {
                    self.kill(old);
                }
                self.add(loc);
                self.queues.get_mut(queue_id).unwrap().def =
                    Some((loc, Bytes::copy_from_slice(def)));
            }
            Op::DeleteQueue { queue_id } => {
                self.see(*queue_id, None);
                if let Some(q) = self.queues.remove(queue_id) {
                    if let Some((l, _)) = q.def {
                        self.kill(l);
                    }
                    for (_, m) in q.msgs.iter() {
                        self.kill(m.loc);
                    }
                    self.cache.remove_queue(*queue_id);
                }
            }
            Op::Put {
                queue_id,
                seq,
                header,
                body,
            } => {
                self.see(*queue_id, Some(*seq));
                let entry = MsgEntry {
                    loc,
                    header_len: header.len() as u32,
                    body_len: body.len() as u32,
                };
                if keep_header {
                    self.headers
                        .insert((*queue_id, *seq), Bytes::copy_from_slice(header));
                }
                let old = self
                    .queues
                    .entry(*queue_id)
                    .or_default()
                    .msgs
                    .insert(*seq, entry);
                if let Some(old) = old {
                    // Same (queue, seq) again: the later record wins.
                    self.kill(old.loc);
                }
                self.add(loc);
                // Replaces a body kept for an earlier Put of the key (nothing is kept without a
                // budget).
                if self.cache.enabled() {
                    self.cache.insert((*queue_id, *seq), body.clone());
                }
            }
            Op::Remove { queue_id, seqs } => {
                if let Some(&max) = seqs.iter().max() {
                    self.see(*queue_id, Some(max));
                } else {
                    self.see(*queue_id, None);
                }
                if !self.headers.is_empty() {
                    for s in seqs {
                        self.headers.remove(&(*queue_id, *s));
                    }
                }
                let mut dead = Vec::new();
                if let Some(q) = self.queues.get_mut(queue_id) {
                    for s in seqs {
                        if let Some(m) = q.msgs.remove(*s) {
                            dead.push(m.loc);
                            self.cache.remove((*queue_id, *s));
                        }
                    }
                }
                for l in dead {
                    self.kill(l);
                }
            }
            Op::Purge {
                queue_id,
                through_seq,
            } => {
                self.see(*queue_id, Some(*through_seq));
                let mut dead = Vec::new();
                if let Some(q) = self.queues.get_mut(queue_id) {
                    q.msgs.purge_through(*through_seq, |m| dead.push(m.loc));
                    self.cache.purge(*queue_id, *through_seq);
                }
                for l in dead {
                    self.kill(l);
                }
            }
            Op::Rekey {
                queue_id,
                seq,
                to_queue_id,
                to_seq,
            } => {
                self.see(*queue_id, Some(*seq));
                self.see(*to_queue_id, Some(*to_seq));
                if (queue_id, seq) == (to_queue_id, to_seq) {
                    return;
                }
                let Some(m) = self
                    .queues
                    .get_mut(queue_id)
                    .and_then(|q| q.msgs.remove(*seq))
                else {
                    return;
                };
                if let Some(h) = self.headers.remove(&(*queue_id, *seq)) {
                    self.headers.insert((*to_queue_id, *to_seq), h);
                }
                let body = self.cache.take((*queue_id, *seq));
                self.cache.remove((*to_queue_id, *to_seq));
                if let Some(b) = body {
                    self.cache.insert((*to_queue_id, *to_seq), b);
                }
                let loc = m.loc;
                let old = self
                    .queues
                    .entry(*to_queue_id)
                    .or_default()
                    .msgs
                    .insert(*to_seq, m);
                if let Some(old) = old {
                    // As for a Put: the later record wins.
                    self.kill(old.loc);
                }
                // The bytes still name the key they were written with.
                self.rekeyed
                    .insert((loc.seg, loc.off), (*to_queue_id, *to_seq));
            }
        }
    }

    /// Applies a watermark. Marks are never live: the newest is always newer than every
    /// dropped segment, which is all they need to be.
    pub fn apply_mark(&mut self, m: &Mark) {
        self.max_queue_id = self.max_queue_id.max(m.max_queue_id);
        for &(q, s) in &m.max_seqs {
            self.see(q, Some(s));
        }
    }

    /// The watermark to write before dropping a segment: max ids of queues that still exist.
    /// (A deleted queue's id is never reused, since `max_queue_id` covers it, so its seqs
    /// need not be remembered.)
    pub fn mark(&self) -> Mark {
        Mark {
            max_queue_id: self.max_queue_id,
            max_seqs: self
                .max_seq
                .iter()
                .filter(|(q, _)| self.queues.contains_key(q))
                .map(|(q, s)| (*q, *s))
                .collect(),
        }
    }

    /// Moves a live op to a new location (compaction copied it forward).
    pub fn relocate(&mut self, key: Key, old: Loc, new: Loc) {
        match key {
            Key::Def(q) => {
                let d = self.queues.get_mut(&q).and_then(|q| q.def.as_mut());
                match d {
                    Some((l, _)) if *l == old => *l = new,
                    _ => return,
                }
            }
            Key::Msg(q, s) => {
                let moved = self
                    .queues
                    .get_mut(&q)
                    .is_some_and(|q| q.msgs.relocate(s, old, new));
                if !moved {
                    return;
                }
            }
        }
        self.kill(old);
        self.add(new);
    }

    pub fn live_bytes(&self) -> u64 {
        self.segs.values().map(|s| s.live).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{FaultyIo, Io};

    fn index(segs: u64) -> Index {
        let io = FaultyIo::new(1);
        let mut idx = Index::default();
        for seg in 1..=segs {
            let file = io.create("/index-test".as_ref(), seg).unwrap();
            idx.segs.insert(
                seg,
                SegMeta {
                    file,
                    cap: 1 << 20,
                    end: 32,
                    live: 0,
                    live_ops: 0,
                },
            );
        }
        idx
    }

    fn put(queue_id: u64, seq: u64, body: usize) -> Op {
        Op::Put {
            queue_id,
            seq,
            header: Bytes::from_static(b"hdr"),
            body: Bytes::from(vec![7u8; body]),
        }
    }

    fn define(queue_id: u64) -> Op {
        Op::DefineQueue {
            queue_id,
            def: Bytes::from_static(b"def"),
        }
    }

    fn at(seg: u64, off: u64, op: &Op) -> Loc {
        Loc {
            seg,
            off,
            len: op.encoded_len() as u32,
        }
    }

    fn counts(idx: &Index, seg: u64) -> (u64, u64) {
        (idx.segs[&seg].live, idx.segs[&seg].live_ops)
    }

    #[test]
    fn compaction_asks_the_index_which_ops_are_live() {
        let mut idx = index(2);
        let (d1, p1, p2, p3) = (define(1), put(1, 1, 10), put(1, 2, 20), put(1, 3, 30));
        let (ld1, lp1, lp2, lp3) = (
            at(1, 32, &d1),
            at(1, 100, &p1),
            at(1, 300, &p2),
            at(1, 500, &p3),
        );
        for (op, l) in [(&d1, ld1), (&p1, lp1), (&p2, lp2), (&p3, lp3)] {
            idx.apply(op, l, false);
        }
        assert_eq!(idx.live_key(&d1, ld1), Some(Key::Def(1)));
        assert_eq!(idx.live_key(&p1, lp1), Some(Key::Msg(1, 1)));
        // Not the op at that place (another offset): not live.
        assert_eq!(idx.live_key(&p1, Loc { off: 101, ..lp1 }), None);
        let all = ld1.len + lp1.len + lp2.len + lp3.len;
        assert_eq!(counts(&idx, 1), (all as u64, 4));

        // Removed: dead.
        let remove = Op::Remove {
            queue_id: 1,
            seqs: vec![2],
        };
        idx.apply(&remove, at(2, 32, &remove), false);
        assert_eq!(idx.live_key(&p2, lp2), None);
        // Written again elsewhere: the old copy is dead, the new one live.
        let lp3b = at(2, 100, &p3);
        idx.apply(&p3, lp3b, false);
        assert_eq!(idx.live_key(&p3, lp3), None);
        assert_eq!(idx.live_key(&p3, lp3b), Some(Key::Msg(1, 3)));
        // Moved by a Rekey: its bytes still name (1, 1), it is live as (5, 7).
        let rekey = Op::Rekey {
            queue_id: 1,
            seq: 1,
            to_queue_id: 5,
            to_seq: 7,
        };
        idx.apply(&rekey, at(2, 300, &rekey), false);
        assert_eq!(idx.live_key(&p1, lp1), Some(Key::Msg(5, 7)));
        // Redefined: the old def is dead.
        let ld1b = at(2, 400, &d1);
        idx.apply(&d1, ld1b, false);
        assert_eq!(idx.live_key(&d1, ld1), None);
        assert_eq!(idx.live_key(&d1, ld1b), Some(Key::Def(1)));
        // Tombstones and marks are never live.
        assert_eq!(idx.live_key(&remove, at(2, 32, &remove)), None);
        assert_eq!(counts(&idx, 1), (lp1.len as u64, 1));

        // Compaction copies the rekeyed Put under its new key: live there, not here, and
        // segment 1 holds nothing live any more.
        let moved = put(5, 7, 10);
        let lm = at(2, 600, &moved);
        idx.relocate(Key::Msg(5, 7), lp1, lm);
        assert_eq!(counts(&idx, 1), (0, 0));
        assert_eq!(idx.live_key(&p1, lp1), None);
        assert_eq!(idx.live_key(&moved, lm), Some(Key::Msg(5, 7)));
        assert!(idx.rekeyed.is_empty());
        // A second relocation from the old place (stale) changes nothing.
        idx.relocate(Key::Msg(5, 7), lp1, at(2, 900, &moved));
        assert_eq!(idx.live_key(&moved, lm), Some(Key::Msg(5, 7)));

        // Deleting queue 1 kills its def and message 3; message (5, 7) stays.
        let seg2 = counts(&idx, 2);
        assert_eq!(seg2, ((lp3b.len + ld1b.len + lm.len) as u64, 3));
        let del = Op::DeleteQueue { queue_id: 1 };
        idx.apply(&del, at(2, 1000, &del), false);
        assert_eq!(counts(&idx, 2), (lm.len as u64, 1));
        assert_eq!(idx.live_key(&p3, lp3b), None);
    }

    #[test]
    fn purge_and_removal_give_back_each_segments_live_bytes_once() {
        let mut idx = index(3);
        let mut locs = Vec::new();
        for s in 1..=600u64 {
            let op = put(4, s, (s % 50) as usize);
            let l = at(1 + s % 3, 32 + s * 200, &op);
            idx.apply(&op, l, false);
            locs.push((op, l));
        }
        let live_of = |idx: &Index| -> u64 { (1..=3).map(|s| idx.segs[&s].live).sum() };
        let total: u64 = locs.iter().map(|(_, l)| l.len as u64).sum();
        assert_eq!(live_of(&idx), total);
        // Remove from the middle, twice (the second time is a no-op), then purge across.
        let seqs: Vec<u64> = (200..400).collect();
        let remove = Op::Remove { queue_id: 4, seqs };
        idx.apply(&remove, at(3, 1 << 19, &remove), false);
        idx.apply(&remove, at(3, 1 << 19, &remove), false);
        let gone: u64 = locs[199..399].iter().map(|(_, l)| l.len as u64).sum();
        assert_eq!(live_of(&idx), total - gone);
        let purge = Op::Purge {
            queue_id: 4,
            through_seq: 500,
        };
        idx.apply(&purge, at(3, 1 << 19, &purge), false);
        let left: u64 = locs[500..].iter().map(|(_, l)| l.len as u64).sum();
        assert_eq!(live_of(&idx), left);
        let ops: u64 = (1..=3).map(|s| idx.segs[&s].live_ops).sum();
        assert_eq!(ops, 100);
        for (op, l) in &locs[..500] {
            assert_eq!(idx.live_key(op, *l), None);
        }
        for (op, l) in &locs[500..] {
            assert!(idx.live_key(op, *l).is_some());
        }
    }
}
