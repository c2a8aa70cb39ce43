//! Operations: what a record's payload is made of, and their byte encoding (see FORMAT.md).
//!
//! A payload is a sequence of ops, each starting with a one-byte tag. Every op is
//! self-contained, so compaction can copy the bytes of a live op into a new record as they are
//! (a `Put` that a `Rekey` moved gets its new key written in, see [`rekey_put`]).

use std::ops::Range;

use bytes::Bytes;

use super::gather::Sink;

const TAG_DEFINE: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_PUT: u8 = 3;
const TAG_REMOVE: u8 = 4;
const TAG_PURGE: u8 = 5;
const TAG_MARK: u8 = 6;
/// Format version 3 and later only (see `segment.rs`).
pub(crate) const TAG_REKEY: u8 = 7;

/// Bytes of a Put before its header: tag, queue id, seq, header length, body length.
pub(crate) const PUT_FIXED: usize = 1 + 8 + 8 + 4 + 4;

/// Rewrites the key of the encoded `Put` in `op` (its bytes, from the tag on) from `from` to
/// `to` (`(queue_id, seq)`): what compaction does to a message that a `Rekey` moved, so that
/// its copy stands on its own. Returns false, changing nothing, if `op` is not a `Put` of
/// `from`.
pub(crate) fn rekey_put(op: &mut [u8], from: (u64, u64), to: (u64, u64)) -> bool {
    if op.len() < PUT_FIXED
        || op[0] != TAG_PUT
        || op[1..9] != from.0.to_le_bytes()
        || op[9..17] != from.1.to_le_bytes()
    {
        return false;
    }
    op[1..9].copy_from_slice(&to.0.to_le_bytes());
    op[9..17].copy_from_slice(&to.1.to_le_bytes());
    true
}

/// One change to durable state. The journal treats defs, headers and bodies as opaque bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Defines (or redefines, replacing the old def) a queue. Live until `DeleteQueue`.
    DefineQueue {
        /// The queue's id, chosen by the broker.
        queue_id: u64,
        /// The broker's encoding of the definition.
        def: Bytes,
    },
    /// Deletes a queue's def and every message of the queue written before it.
    DeleteQueue {
        /// The queue's id.
        queue_id: u64,
    },
    /// Stores a message. Live until removed, purged, or its queue deleted. A second Put of
    /// the same `(queue_id, seq)` replaces the first.
    Put {
        /// The queue's id.
        queue_id: u64,
        /// The message's position in its queue, chosen by the broker.
        seq: u64,
        /// The broker's encoding of the message header; returned by recovery.
        header: Bytes,
        /// The message body; read back with `Journal::read_body`.
        body: Bytes,
    },
    /// Removes messages of one queue.
    Remove {
        /// The queue's id.
        queue_id: u64,
        /// Sequence numbers to remove; unknown ones are ignored.
        seqs: Vec<u64>,
    },
    /// Removes every message of the queue with `seq <= through_seq`.
    Purge {
        /// The queue's id.
        queue_id: u64,
        /// Highest sequence number removed.
        through_seq: u64,
    },
    /// Moves the live message `(queue_id, seq)` to `(to_queue_id, to_seq)`, header and body
    /// as they are on disk, without writing them again: one op removes it from its queue and
    /// stores it in the other. Ignored if `(queue_id, seq)` is not live (like a `Remove`), so
    /// it must come before any `Remove` of the same message in a record. Only in segments of
    /// format version 3 or later ([`crate::journal::Journal::can_rekey`]).
    Rekey {
        /// The message's queue.
        queue_id: u64,
        /// Its seq there.
        seq: u64,
        /// The queue it moves to.
        to_queue_id: u64,
        /// Its seq there (a new one: a seq is never reused).
        to_seq: u64,
    },
}

/// The journal's own op: a watermark of the highest ids seen, written whenever a segment is
/// dropped so that dropping old records never lowers the ids recovery reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Mark {
    pub max_queue_id: u64,
    pub max_seqs: Vec<(u64, u64)>,
}

/// A decoded op, and where its bytes are within the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    Op(Op),
    Mark(Mark),
}

/// Why a payload did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub &'static str);

impl Op {
    /// Bytes this op takes in a payload.
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            Op::DefineQueue { def, .. } => 1 + 8 + 4 + def.len(),
            Op::DeleteQueue { .. } => 1 + 8,
            Op::Put { header, body, .. } => PUT_FIXED + header.len() + body.len(),
            Op::Remove { seqs, .. } => 1 + 8 + 4 + 8 * seqs.len(),
            Op::Purge { .. } => 1 + 8 + 8,
            Op::Rekey { .. } => 1 + 8 + 8 + 8 + 8,
        }
    }

    /// The queue this op touches (a `Rekey`: the queue the message leaves).
    pub fn queue_id(&self) -> u64 {
        match self {
            Op::DefineQueue { queue_id, .. }
            | Op::DeleteQueue { queue_id }
            | Op::Put { queue_id, .. }
            | Op::Remove { queue_id, .. }
            | Op::Purge { queue_id, .. }
            | Op::Rekey { queue_id, .. } => *queue_id,
        }
    }

    /// Appends the op's encoding. Lengths must fit in u32 (checked by `submit`).
    pub(crate) fn encode(&self, out: &mut impl Sink) {
        match self {
            Op::DefineQueue { queue_id, def } => {
                out.put(&[TAG_DEFINE]);
                put_u64(out, *queue_id);
                put_u32(out, def.len() as u32);
                out.put(def);
            }
            Op::DeleteQueue { queue_id } => {
                out.put(&[TAG_DELETE]);
                put_u64(out, *queue_id);
            }
            Op::Put {
                queue_id,
                seq,
                header,
                body,
            } => {
                out.put(&[TAG_PUT]);
                put_u64(out, *queue_id);
                put_u64(out, *seq);
                put_u32(out, header.len() as u32);
                put_u32(out, body.len() as u32);
                out.put(header);
                out.put_body(body);
            }
            Op::Remove { queue_id, seqs } => {
                out.put(&[TAG_REMOVE]);
                put_u64(out, *queue_id);
                put_u32(out, seqs.len() as u32);
                for s in seqs {
                    put_u64(out, *s);
                }
            }
            Op::Purge {
                queue_id,
                through_seq,
            } => {
                out.put(&[TAG_PURGE]);
                put_u64(out, *queue_id);
                put_u64(out, *through_seq);
            }
            Op::Rekey {
                queue_id,
                seq,
                to_queue_id,
                to_seq,
            } => {
                out.put(&[TAG_REKEY]);
                put_u64(out, *queue_id);
                put_u64(out, *seq);
                put_u64(out, *to_queue_id);
                put_u64(out, *to_seq);
            }
        }
    }

    /// True if some length field would not fit its u32.
    pub(crate) fn has_oversized_field(&self) -> bool {
        let big = |n: usize| n > u32::MAX as usize;
        match self {
            Op::DefineQueue { def, .. } => big(def.len()),
            Op::Put { header, body, .. } => big(header.len()) || big(body.len()),
            Op::Remove { seqs, .. } => big(seqs.len()),
            _ => false,
        }
    }
}

impl Mark {
    pub(crate) fn encode(&self, out: &mut impl Sink) {
        out.put(&[TAG_MARK]);
        put_u64(out, self.max_queue_id);
        put_u32(out, self.max_seqs.len() as u32);
        for (q, s) in &self.max_seqs {
            put_u64(out, *q);
            put_u64(out, *s);
        }
    }
}

fn put_u64(out: &mut impl Sink, v: u64) {
    out.put(&v.to_le_bytes());
}

fn put_u32(out: &mut impl Sink, v: u32) {
    out.put(&v.to_le_bytes());
}

/// Reads fields off a payload, failing cleanly at its end.
struct Cursor<'a> {
    payload: &'a Bytes,
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<Range<usize>, DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.payload.len())
            .ok_or(DecodeError("op runs past the end of the payload"))?;
        let r = self.at..end;
        self.at = end;
        Ok(r)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let r = self.take(1)?;
        Ok(self.payload[r.start])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let r = self.take(4)?;
        Ok(u32::from_le_bytes(self.payload[r].try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let r = self.take(8)?;
        Ok(u64::from_le_bytes(self.payload[r].try_into().unwrap()))
    }
    fn bytes(&mut self, n: u32) -> Result<Bytes, DecodeError> {
        let r = self.take(n as usize)?;
        Ok(self.payload.slice(r))
    }
    fn count(&mut self, each: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.payload.len() - self.at {
            return Err(DecodeError("count runs past the end of the payload"));
        }
        Ok(n)
    }
}

/// Decodes a whole payload into its ops, each with its byte range in the payload.
/// Bytes fields are zero-copy slices of `payload`.
pub(crate) fn decode_payload(payload: &Bytes) -> Result<Vec<(Entry, Range<usize>)>, DecodeError> {
    if payload.is_empty() {
        return Err(DecodeError("empty payload"));
    }
    let mut c = Cursor { payload, at: 0 };
    let mut out = Vec::new();
    while c.at < payload.len() {
        let start = c.at;
        let entry = match c.u8()? {
            TAG_DEFINE => {
                let queue_id = c.u64()?;
                let n = c.u32()?;
                Entry::Op(Op::DefineQueue {
                    queue_id,
                    def: c.bytes(n)?,
                })
            }
            TAG_DELETE => Entry::Op(Op::DeleteQueue { queue_id: c.u64()? }),
            TAG_PUT => {
                let queue_id = c.u64()?;
                let seq = c.u64()?;
                let hl = c.u32()?;
                let bl = c.u32()?;
                let header = c.bytes(hl)?;
                let body = c.bytes(bl)?;
                Entry::Op(Op::Put {
                    queue_id,
                    seq,
                    header,
                    body,
                })
            }
            TAG_REMOVE => {
                let queue_id = c.u64()?;
                let n = c.count(8)?;
                let mut seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    seqs.push(c.u64()?);
                }
                Entry::Op(Op::Remove { queue_id, seqs })
            }
            TAG_PURGE => Entry::Op(Op::Purge {
                queue_id: c.u64()?,
                through_seq: c.u64()?,
            }),
            TAG_REKEY => Entry::Op(Op::Rekey {
                queue_id: c.u64()?,
                seq: c.u64()?,
                to_queue_id: c.u64()?,
                to_seq: c.u64()?,
            }),
            TAG_MARK => {
                let max_queue_id = c.u64()?;
                let n = c.count(16)?;
                let mut max_seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    max_seqs.push((c.u64()?, c.u64()?));
                }
                Entry::Mark(Mark {
                    max_queue_id,
                    max_seqs,
                })
            }
            _ => return Err(DecodeError("unknown op tag")),
        };
        out.push((entry, start..c.at));
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn arb_op() -> impl Strategy<Value = Op> {
        let bytes = || prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
        prop_oneof![
            (any::<u64>(), bytes()).prop_map(|(queue_id, def)| Op::DefineQueue { queue_id, def }),
            any::<u64>().prop_map(|queue_id| Op::DeleteQueue { queue_id }),
            (any::<u64>(), any::<u64>(), bytes(), bytes()).prop_map(
                |(queue_id, seq, header, body)| Op::Put {
                    queue_id,
                    seq,
                    header,
                    body
                }
            ),
            (any::<u64>(), prop::collection::vec(any::<u64>(), 0..8))
                .prop_map(|(queue_id, seqs)| Op::Remove { queue_id, seqs }),
            (any::<u64>(), any::<u64>()).prop_map(|(queue_id, through_seq)| Op::Purge {
                queue_id,
                through_seq
            }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                |(queue_id, seq, to_queue_id, to_seq)| Op::Rekey {
                    queue_id,
                    seq,
                    to_queue_id,
                    to_seq
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn ops_round_trip(ops in prop::collection::vec(arb_op(), 1..10), mark in prop::option::of((any::<u64>(), prop::collection::vec((any::<u64>(), any::<u64>()), 0..4)))) {
            let mut buf = Vec::new();
            let mut ranges = Vec::new();
            for op in &ops {
                let s = buf.len();
                op.encode(&mut buf);
                prop_assert_eq!(buf.len() - s, op.encoded_len());
                ranges.push(s..buf.len());
            }
            let mark = mark.map(|(max_queue_id, max_seqs)| Mark { max_queue_id, max_seqs });
            if let Some(m) = &mark {
                let s = buf.len();
                m.encode(&mut buf);
                ranges.push(s..buf.len());
            }
            let payload = Bytes::from(buf);
            let got = decode_payload(&payload).unwrap();
            let mut want: Vec<Entry> = ops.into_iter().map(Entry::Op).collect();
            want.extend(mark.map(Entry::Mark));
            prop_assert_eq!(got.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>(), want);
            prop_assert_eq!(got.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(), ranges);
        }

        #[test]
        fn truncated_payload_is_an_error_or_a_prefix(ops in prop::collection::vec(arb_op(), 1..6), cut in any::<prop::sample::Index>()) {
            let mut buf = Vec::new();
            for op in &ops { op.encode(&mut buf); }
            let cut = cut.index(buf.len());
            let payload = Bytes::copy_from_slice(&buf[..cut]);
            // The frame CRC catches a cut payload; the op decoder on its own must still never
            // panic, and if it succeeds it can only be because the cut fell between ops.
            if let Ok(got) = decode_payload(&payload) {
                prop_assert!(got.len() < ops.len());
                for ((e, _), op) in got.iter().zip(&ops) {
                    prop_assert_eq!(e, &Entry::Op(op.clone()));
                }
            }
        }
    }
}
