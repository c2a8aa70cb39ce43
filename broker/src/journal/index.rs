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
    /// Live ops by file offset, so compaction can find them without scanning every queue.
    pub live_ops: BTreeMap<u64, (Key, u32)>,
}

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
    pub msgs: BTreeMap<u64, MsgEntry>,
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
    /// Live `Put`s that a `Rekey` moved, by `(segment, offset)`: the `(queue, seq)` their
    /// bytes still name. Compaction rewrites that key when it copies them forward.
    pub rekeyed: HashMap<(u64, u64), (u64, u64)>,
    /// Bodies of recently written messages (see `cache.rs`); dropped with their message.
    /// Recovery runs with no budget, so it keeps none.
    pub cache: BodyCache,
}

impl Index {
    fn kill(&mut self, loc: Loc) {
        if !self.rekeyed.is_empty() {
            self.rekeyed.remove(&(loc.seg, loc.off));
        }
        if let Some(s) = self.segs.get_mut(&loc.seg) {
            if s.live_ops.remove(&loc.off).is_some() {
                s.live -= loc.len as u64;
            }
        }
    }

    fn add(&mut self, loc: Loc, key: Key) {
        let s = self
            .segs
            .get_mut(&loc.seg)
            .expect("index: op in a segment the index does not know");
        s.live += loc.len as u64;
        s.live_ops.insert(loc.off, (key, loc.len));
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
                self.add(loc, Key::Def(*queue_id));
                self.queues.get_mut(queue_id).unwrap().def =
                    Some((loc, Bytes::copy_from_slice(def)));
            }
            Op::DeleteQueue { queue_id } => {
                self.see(*queue_id, None);
                if let Some(q) = self.queues.remove(queue_id) {
                    if let Some((l, _)) = q.def {
                        self.kill(l);
                    }
                    for m in q.msgs.values() {
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
                self.add(loc, Key::Msg(*queue_id, *seq));
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
                        if let Some(m) = q.msgs.remove(s) {
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
                    let keep = match through_seq.checked_add(1) {
                        Some(next) => q.msgs.split_off(&next),
                        None => BTreeMap::new(),
                    };
                    let gone = std::mem::replace(&mut q.msgs, keep);
                    dead.extend(gone.values().map(|m| m.loc));
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
                    .and_then(|q| q.msgs.remove(seq))
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
                if let Some(e) = self
                    .segs
                    .get_mut(&loc.seg)
                    .and_then(|s| s.live_ops.get_mut(&loc.off))
                {
                    e.0 = Key::Msg(*to_queue_id, *to_seq);
                }
                // The bytes still name the key they were written with (a second move keeps it).
                self.rekeyed
                    .entry((loc.seg, loc.off))
                    .or_insert((*queue_id, *seq));
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
                let m = self.queues.get_mut(&q).and_then(|q| q.msgs.get_mut(&s));
                match m {
                    Some(m) if m.loc == old => m.loc = new,
                    _ => return,
                }
            }
        }
        self.kill(old);
        self.add(new, key);
    }

    pub fn live_bytes(&self) -> u64 {
        self.segs.values().map(|s| s.live).sum()
    }
}
