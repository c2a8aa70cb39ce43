//! The submission queue is bounded in records and bytes: while the writer is busy, submitters
//! block instead of queueing without bound, and continue once it drains.

use super::common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Submits `n` puts of `len` bytes from a thread while the writer is held in a sync; returns
/// how many `submit` calls had returned once the queue stopped growing, and the stats then.
fn blocked_submitters(opts: JournalOptions, n: u64, len: usize) -> (u64, JournalStats) {
    let io = FaultyIo::new(21);
    let (j, _) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.clone())).unwrap();
    io.pause_syncs(true);
    let returned = Arc::new(AtomicU64::new(0));
    let t = {
        let (j, returned) = (j.clone(), returned.clone());
        std::thread::spawn(move || {
            let commits: Vec<_> = (1..=n)
                .map(|s| {
                    let c = j.submit(vec![put(1, s, len)]);
                    returned.fetch_add(1, Ordering::SeqCst);
                    c
                })
                .collect();
            commits.into_iter().map(|c| c.wait()).collect::<Vec<_>>()
        })
    };
    // Wait until the submitter stops making progress (or finished: the unbounded case).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = returned.load(Ordering::SeqCst);
        if now == last || now == n {
            break;
        }
        last = now;
        assert!(Instant::now() < deadline, "the submitter never settled");
    }
    let got = returned.load(Ordering::SeqCst);
    let stats = j.stats();
    io.pause_syncs(false);
    let results = t.join().unwrap();
    assert!(results.iter().all(Result::is_ok), "all stored once drained");
    assert_eq!(returned.load(Ordering::SeqCst), n);
    drop(j);
    let (_, r) =
        Journal::open_with_io("/fake".as_ref(), JournalOptions::default(), Arc::new(io)).unwrap();
    assert_eq!(seqs(&r, 1), (1..=n).collect::<Vec<_>>(), "in order");
    (got, stats)
}

#[test]
fn submitters_block_when_the_queue_holds_max_records() {
    let opts = JournalOptions {
        max_queued_records: 4,
        ..small_opts(1 << 20)
    };
    let (returned, stats) = blocked_submitters(opts, 40, 10);
    // One batch is inside the writer (held in its sync), at most 4 wait in the queue, the
    // submitter is blocked on the next.
    assert!(stats.queued_records <= 4, "{stats:?}");
    assert!(
        returned < 40,
        "all 40 submissions were queued while the writer was stuck"
    );
}

#[test]
fn submitters_block_when_the_queue_holds_max_bytes() {
    let opts = JournalOptions {
        max_queued_bytes: 10_000,
        ..small_opts(1 << 20)
    };
    let (returned, stats) = blocked_submitters(opts, 40, 2000);
    assert!(stats.queued_bytes <= 10_000, "{stats:?}");
    assert!(returned < 40, "all 40 submissions of 2 KB were queued");
}

#[test]
fn one_submission_larger_than_the_byte_limit_still_goes_through() {
    let io = FaultyIo::new(22);
    let opts = JournalOptions {
        max_queued_bytes: 1000,
        ..small_opts(1 << 20)
    };
    let (j, _) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io)).unwrap();
    j.submit(vec![put(1, 1, 50_000)]).wait().unwrap();
    assert_eq!(j.read_body(1, 1).unwrap(), body(1, 1, 50_000));
}
