//! A batch larger than `JournalOptions::writeback_bytes` is written in pieces, and the disk is
//! told to start on each piece but the last as soon as it is written (`start_writeback`):
//! the pieces cover the batch exactly, in order, each hint comes after its bytes were written
//! and before the sync, and crashes in the middle of such batches keep every acknowledged
//! transaction (the same check as `crash.rs`).

use super::common::*;
use super::crash::{reopen_after_crash, run_until_crash};

fn opts(writeback_bytes: u64) -> JournalOptions {
    JournalOptions {
        writeback_bytes,
        ..small_opts(1 << 20)
    }
}

/// One 20,000 B body in one submission: its record is one write of a little over 20 KB.
fn one_big_commit(o: &JournalOptions) -> (FaultyIo, Vec<(u64, u64, bool)>) {
    let io = FaultyIo::new(7);
    let (j, _) = Journal::open_with_io("/fake".as_ref(), o.clone(), Arc::new(io.clone())).unwrap();
    j.submit(vec![Op::DefineQueue {
        queue_id: 1,
        def: Bytes::from_static(b"q"),
    }])
    .wait()
    .unwrap();
    let before = io.writebacks().len();
    let syncs = io.syncs();
    j.submit(vec![put(1, 1, 20_000)]).wait().unwrap();
    assert_eq!(io.syncs(), syncs + 1, "still one sync for the commit");
    let hints = io.writebacks()[before..].to_vec();
    drop(j);
    let (j, r) = Journal::open_with_io("/fake".as_ref(), o.clone(), Arc::new(io.clone())).unwrap();
    assert_eq!(seqs(&r, 1), vec![1]);
    check_bodies(&j, &r, 1, |_| 20_000);
    (io, hints)
}

#[test]
fn a_large_batch_is_written_in_hinted_pieces() {
    let (_, hints) = one_big_commit(&opts(4096));
    // 20,000 B of body plus the record's framing and header: 5 pieces of 4 KiB and a last
    // shorter one, which is not hinted (the sync follows at once).
    assert_eq!(hints.len(), 4, "hints: {hints:?}");
    for w in hints.windows(2) {
        assert_eq!(
            w[0].0 + w[0].1,
            w[1].0,
            "pieces follow each other: {hints:?}"
        );
    }
    for &(_, len, pending) in &hints {
        assert_eq!(len, 4096);
        assert!(
            pending,
            "a hint comes after its bytes were written, before the sync"
        );
    }
}

#[test]
fn no_pieces_when_off_or_when_the_batch_is_small() {
    let (_, off) = one_big_commit(&opts(0));
    assert!(
        off.is_empty(),
        "writeback_bytes 0: one write, no hints: {off:?}"
    );
    let (_, small) = one_big_commit(&opts(1 << 20));
    assert!(small.is_empty(), "a batch under the piece size: {small:?}");
}

#[test]
fn crash_at_nth_sync_with_batches_in_pieces_keeps_every_acknowledged_transaction() {
    let mut o = small_opts(16 << 10);
    o.writeback_bytes = 4096;
    let mut crashes = 0;
    let mut hinted = 0;
    for seed in 0..2u64 {
        for n in 1..=40u64 {
            let io = FaultyIo::new(seed * 1000 + n + 77);
            let (j, _) =
                Journal::open_with_io("/fake".as_ref(), o.clone(), Arc::new(io.clone())).unwrap();
            io.crash_at_sync(n);
            let (acked, submitted) = run_until_crash(&j, 8, 120);
            crashes += io.crashed() as u32;
            hinted += io.writebacks().len();
            drop(j);
            reopen_after_crash(&io, &o, &format!("seed {seed} n {n}"), acked, submitted);
        }
    }
    assert!(crashes > 60, "most runs should crash mid-way: {crashes}");
    assert!(
        hinted > 100,
        "batches were written in pieces: {hinted} hints"
    );
}
