//! Journal entry points for the fuzz targets and their proptest versions (see
//! `crate::fuzzing`): arbitrary bytes in, never a panic, and the properties checked here.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::op::{decode_payload, Entry};
use super::record::{decode_frame, Frame};
use super::segment::encode_header;
use super::{FaultyIo, Io, Journal, JournalError, JournalOptions, Op};

/// Decodes `data` as a run of records (in both format versions) and every payload as ops.
/// Checks that every op re-encodes to exactly the bytes it was decoded from.
pub fn record_decoder(data: &[u8]) {
    let _ = decode_payload(&Bytes::copy_from_slice(data));
    for flags in [false, true] {
        let mut at = 0;
        while let Frame::Record { payload, next, .. } = decode_frame(data, at, flags) {
            assert!(next > at && next <= data.len(), "frame must advance");
            let bytes = Bytes::copy_from_slice(&data[payload]);
            if let Ok(entries) = decode_payload(&bytes) {
                for (entry, r) in entries {
                    let mut out = Vec::new();
                    match &entry {
                        Entry::Op(op) => op.encode(&mut out),
                        Entry::Mark(m) => m.encode(&mut out),
                    }
                    assert_eq!(&out[..], &bytes[r], "op re-encodes differently");
                }
            }
            at = next;
        }
    }
}

fn opts(truncate_damaged: bool) -> JournalOptions {
    JournalOptions {
        segment_size: 4096,
        max_batch_bytes: 64 << 10,
        reserve_bytes: Some(0),
        max_queued_records: 64,
        truncate_damaged,
        // Compaction as soon as a segment qualifies, so that it runs within one input.
        compact_grace: std::time::Duration::ZERO,
        ..JournalOptions::default()
    }
}

fn dir() -> &'static std::path::Path {
    "/fuzz-journal".as_ref()
}

/// Opening must either refuse as corrupt/damaged, or give a journal that takes a write and
/// reopens cleanly with that write in it.
fn open_and_check(
    io: &FaultyIo,
    truncate_damaged: bool,
    check: impl FnOnce(&Journal, &super::Recovery),
) {
    let (j, r) = match Journal::open_with_io(dir(), opts(truncate_damaged), Arc::new(io.clone())) {
        Ok(x) => x,
        Err(JournalError::Corrupt { .. } | JournalError::Damaged { .. }) => return,
        Err(e) => panic!("unexpected error opening a damaged journal: {e}"),
    };
    for (q, msgs) in &r.messages {
        for m in msgs {
            let b = j.read_body(*q, m.seq).expect("a recovered body reads");
            assert_eq!(b.len(), m.body_len as usize);
        }
    }
    check(&j, &r);
    let probe = Op::Put {
        queue_id: u64::MAX - 1,
        seq: 1,
        header: Bytes::from_static(b"probe"),
        body: Bytes::from_static(b"probe body"),
    };
    j.submit(vec![probe])
        .wait()
        .expect("a write after recovery");
    drop(j);
    let io2 = io.restart();
    let (j, r2) = Journal::open_with_io(dir(), opts(false), Arc::new(io2))
        .unwrap_or_else(|e| panic!("reopening after recovery and a write fails: {e}"));
    assert!(r2.truncated.is_none(), "a second recovery cut again");
    assert_eq!(
        &j.read_body(u64::MAX - 1, 1).expect("the probe survived")[..],
        b"probe body"
    );
}

/// `data[0]` bits: 1 = prefix a valid segment header, 2 = `truncate_damaged`, 4 = a valid
/// first segment before it. The rest is the (last) segment's bytes.
pub fn segment_recovery(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let io = FaultyIo::new(1);
    let mut seg = 1;
    if mode & 4 != 0 {
        let (j, _) = Journal::open_with_io(dir(), opts(false), Arc::new(io.clone())).unwrap();
        j.submit(vec![Op::DefineQueue {
            queue_id: 1,
            def: Bytes::from_static(b"q"),
        }])
        .wait()
        .unwrap();
        drop(j);
        seg = 2;
    }
    let mut content = Vec::new();
    if mode & 1 != 0 {
        content.extend_from_slice(&encode_header(seg));
    }
    content.extend_from_slice(rest);
    let f = io.create(dir(), seg).unwrap();
    f.write_at(&content, 0).unwrap();
    f.sync().unwrap();
    drop(f);
    open_and_check(&io, mode & 2 != 0, |_, _| {});
}

/// A valid journal written from `data` (puts of various sizes, removes), then damaged by the
/// rest of `data` (offset, xor) pairs in any segment. Whatever recovery keeps must be a
/// message that was put, with the header and body it was put with.
pub fn damaged_journal(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let truncate = data[0] & 1 != 0;
    let n = (data[1] % 24) as u64 + 1;
    let io = FaultyIo::new(u64::from(data[2]));
    let mut put: BTreeMap<u64, (Bytes, Bytes)> = BTreeMap::new();
    {
        let (j, _) = Journal::open_with_io(dir(), opts(false), Arc::new(io.clone())).unwrap();
        for s in 1..=n {
            let len = (data[(s as usize) % data.len()] as usize) * 7 % 1500;
            let header = Bytes::from(format!("header {s}"));
            let body = Bytes::from(vec![s as u8; len]);
            put.insert(s, (header.clone(), body.clone()));
            let mut ops = vec![Op::Put {
                queue_id: 7,
                seq: s,
                header,
                body,
            }];
            if s % 5 == 0 {
                ops.push(Op::Remove {
                    queue_id: 7,
                    seqs: vec![s - 1],
                });
            }
            j.submit(ops).wait().unwrap();
        }
    }
    let segs = io.segments();
    for pair in data[3..].chunks(4).take(16) {
        if pair.len() < 4 {
            break;
        }
        let (seg, len) = segs[pair[0] as usize % segs.len()];
        let off = u64::from(u16::from_le_bytes([pair[1], pair[2]])) % len.max(1);
        let mut b = [0u8; 1];
        if let Ok(f) = io.open(dir(), seg) {
            if f.read_at(&mut b, off).is_ok() {
                io.corrupt(seg, off, &[b[0] ^ pair[3].max(1)]);
            }
        }
    }
    open_and_check(&io.restart(), truncate, |j, r| {
        for m in r.messages.get(&7).into_iter().flatten() {
            let (header, body) = put
                .get(&m.seq)
                .unwrap_or_else(|| panic!("recovered seq {} was never put", m.seq));
            assert_eq!(&m.header, header, "header of {}", m.seq);
            assert_eq!(&j.read_body(7, m.seq).unwrap(), body, "body of {}", m.seq);
        }
        let others: Vec<_> = r.messages.keys().filter(|&&q| q != 7).collect();
        assert!(
            others.is_empty(),
            "messages of queues never used: {others:?}"
        );
    });
}

/// Appends one framed record of two ops (a put and a remove): seeds and tests.
pub fn sample_record(out: &mut Vec<u8>) {
    super::record::encode_frame(out, |o| {
        Op::Put {
            queue_id: 3,
            seq: 9,
            header: Bytes::from_static(b"header"),
            body: Bytes::from_static(b"body bytes"),
        }
        .encode(o);
        Op::Remove {
            queue_id: 3,
            seqs: vec![1, 2],
        }
        .encode(o);
    });
}
