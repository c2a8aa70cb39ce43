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

/// A removal (`submit_removal`) does not queue behind pending submissions: it rides the next
/// group commit. Here it is durable at the second sync from now while most of a backlog of
/// earlier puts is not (the disk "crashes" at the third).
#[test]
fn a_removal_rides_the_next_group_commit_ahead_of_queued_submissions() {
    let io = FaultyIo::new(5);
    let opts = JournalOptions {
        max_batch_bytes: 4096,
        ..small_opts(1 << 20)
    };
    let (j, _) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.clone())).unwrap();
    for s in 1..=3 {
        j.submit(vec![put(1, s, 100)]).wait().unwrap();
    }
    io.pause_syncs(true);
    // The writer takes this one and waits in its sync.
    let _held = j.submit(vec![put(1, 4, 1000)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while j.stats().queued_bytes > 0 {
        assert!(
            Instant::now() < deadline,
            "the writer never took the first put"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let _backlog: Vec<_> = (5..=60).map(|s| j.submit(vec![put(1, s, 1000)])).collect();
    let removal = j.submit_removal(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![1],
    }]);
    io.crash_at_sync(3);
    io.pause_syncs(false);
    removal
        .wait()
        .expect("the removal is durable at the second sync");
    drop(j);
    let (_, r) = Journal::open_with_io(
        "/fake".as_ref(),
        small_opts(1 << 20),
        Arc::new(io.restart()),
    )
    .unwrap();
    let s = seqs(&r, 1);
    assert!(!s.contains(&1), "the removal is on disk: {s:?}");
    assert!(
        !s.contains(&60),
        "the removal was written ahead of the backlog: {s:?}"
    );
}

/// `pending()` counts removals too: it goes up when one is submitted and back to 0 once it is
/// complete (it used to wrap below zero after the first removal).
#[test]
fn pending_counts_removals_and_returns_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let io = FaultyIo::new(7);
    let (j, _) =
        Journal::open_with_io(dir.path(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    j.submit(vec![put(1, 1, 10), put(1, 2, 10)]).wait().unwrap();
    assert_eq!(j.pending(), 0);
    // Held in the writer's sync: the removal is pending while it waits.
    io.pause_syncs(true);
    let first = j.submit(vec![put(1, 3, 10)]);
    let removal = j.submit_removal(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![1],
    }]);
    assert!(j.pending() >= 1 && j.pending() <= 2, "{}", j.pending());
    io.pause_syncs(false);
    first.wait().unwrap();
    removal.wait().unwrap();
    j.submit_removal(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![2],
    }])
    .wait()
    .unwrap();
    assert_eq!(j.pending(), 0, "pending() must not wrap below zero");
}
