//! Zeros laid ahead of the records while the writer is idle (`JournalOptions::zero_ahead_bytes`,
//! on storage that says it benefits: `Io::zero_ahead`): they are written and synced, they never
//! cover a record, and every acknowledged commit survives a crash at any sync, the zeroing's own
//! syncs included, in order, with transactions all or nothing.

use super::common::*;
use super::crash::{reopen_after_crash, run_until_crash};
use std::time::{Duration, Instant};

/// Waits (bounded) until the idle writer has laid at least `bytes` of zeros in all.
fn wait_zeroed(j: &Journal, bytes: u64) -> JournalStats {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let s = j.stats();
        if s.zeroed_bytes >= bytes {
            return s;
        }
        assert!(
            Instant::now() < until,
            "the idle writer zeroed {} of {bytes} bytes",
            s.zeroed_bytes
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn crash_at_any_sync_with_zeros_laid_ahead_keeps_every_acknowledged_transaction() {
    // Small segments and a runway of 8 KiB: the zeroing runs every few commits, rolls happen.
    let opts = JournalOptions {
        zero_ahead_bytes: 8 << 10,
        ..small_opts(16 << 10)
    };
    let (mut crashes, mut zeroed) = (0, 0u64);
    for seed in 0..3u64 {
        for n in 1..=60u64 {
            let io = FaultyIo::new(seed * 1000 + n);
            io.set_zero_ahead(true);
            let (j, _) =
                Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone()))
                    .unwrap();
            io.crash_at_sync(n);
            // One at a time (the writer idles between commits) and a few in flight.
            let window = [1, 1, 4][seed as usize];
            let (acked, submitted) = run_until_crash(&j, window, 120);
            zeroed += j.stats().zeroed_bytes;
            crashes += u32::from(io.crashed());
            drop(j);

            // Over the zeros too.
            reopen_after_crash(&io, &opts, &format!("seed {seed} n {n}"), acked, submitted);
        }
    }
    assert!(crashes > 120, "most runs should crash mid-way: {crashes}");
    assert!(zeroed > 0, "the idle writer never laid zeros ahead");
}

#[test]
fn zeros_on_real_files_are_laid_while_idle_and_commits_over_them_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        segment_size: 2 << 20,
        ..JournalOptions::default()
    };
    assert_eq!(opts.zero_ahead_bytes, 1 << 20, "the default runway");
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    // Idle after opening: the runway is laid before any commit.
    wait_zeroed(&j, 1 << 20);
    // 3,000 commits of ~1 KiB one at a time (about 3 MiB: the runway is topped up as they
    // go, and the segment rolls).
    for seq in 1..=3000u64 {
        j.submit(vec![put(1, seq, 1000)]).wait().unwrap();
    }
    let s = j.stats();
    assert!(
        s.zeroed_bytes >= 3 << 20,
        "zeros laid while committing one at a time: {}",
        s.zeroed_bytes
    );
    assert!(s.segments_created >= 1, "the segment rolled");
    drop(j);
    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert!(r.truncated.is_none());
    assert_eq!(seqs(&r, 1), (1..=3000).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |_| 1000);
}

#[test]
fn no_zeros_when_off_or_where_the_storage_does_not_ask() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        zero_ahead_bytes: 0,
        ..JournalOptions::default()
    };
    let (j, _) = Journal::open(dir.path(), opts).unwrap();
    for seq in 1..=20u64 {
        j.submit(vec![put(1, seq, 100)]).wait().unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(j.stats().zeroed_bytes, 0);
    drop(j);

    // In-memory storage does not ask by default: the other tests' sync counts stay as they were.
    let io = FaultyIo::new(1);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(16 << 10), Arc::new(io.clone()))
            .unwrap();
    let syncs = io.syncs();
    j.submit(vec![put(1, 1, 100)]).wait().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        io.syncs(),
        syncs + 1,
        "one sync for one commit, none for zeros"
    );
    assert_eq!(j.stats().zeroed_bytes, 0);
}
