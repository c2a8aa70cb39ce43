//! Helpers shared by the behaviour tests.

#![allow(dead_code)]

pub use bytes::Bytes;
pub use mq_broker::journal::{
    Chain, Commit, FaultyIo, Journal, JournalError, JournalOptions, JournalStats, Op, Recovery,
};
pub use std::sync::Arc;

/// Small segments so that rolling and compaction happen in small tests.
pub fn small_opts(segment_size: u64) -> JournalOptions {
    JournalOptions {
        segment_size,
        compact_live_ratio: 0.5,
        max_batch_bytes: 256 << 10,
        // Compact as soon as a segment qualifies: these tests are about what compaction does.
        compact_grace: std::time::Duration::ZERO,
        ..JournalOptions::default()
    }
}

/// A deterministic body for (queue, seq) of the given length.
pub fn body(queue_id: u64, seq: u64, len: usize) -> Bytes {
    let mut x =
        queue_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    Bytes::from(v)
}

pub fn header(queue_id: u64, seq: u64) -> Bytes {
    Bytes::from(format!("h{queue_id}:{seq}"))
}

pub fn put(queue_id: u64, seq: u64, len: usize) -> Op {
    Op::Put {
        queue_id,
        seq,
        header: header(queue_id, seq),
        body: body(queue_id, seq, len),
    }
}

/// Seqs of the live messages of a queue in a recovery.
pub fn seqs(r: &Recovery, queue_id: u64) -> Vec<u64> {
    r.messages
        .get(&queue_id)
        .map(|v| v.iter().map(|m| m.seq).collect())
        .unwrap_or_default()
}

/// Asserts every recovered message of `queue_id` has the right header, length and body.
pub fn check_bodies(j: &Journal, r: &Recovery, queue_id: u64, len_of: impl Fn(u64) -> usize) {
    for m in r.messages.get(&queue_id).into_iter().flatten() {
        assert_eq!(
            m.header,
            header(queue_id, m.seq),
            "header of {queue_id}:{}",
            m.seq
        );
        let want = body(queue_id, m.seq, len_of(m.seq));
        assert_eq!(m.body_len as usize, want.len());
        assert_eq!(
            j.read_body(queue_id, m.seq).unwrap(),
            want,
            "body of {queue_id}:{}",
            m.seq
        );
    }
}
