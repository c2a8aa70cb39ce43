//! A full disk (ENOSPC) does not poison the journal: records that store data are refused with
//! `NoSpace`, removals still go through (into the space of the reserve file if need be), and
//! the journal stores data again by itself once space is back.

use super::common::*;
use std::time::{Duration, Instant};

fn open(io: &FaultyIo, opts: JournalOptions) -> (Journal, Recovery) {
    Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.clone())).unwrap()
}

/// Submits puts of `len` bytes to queue 1 from `first` on until one fails; returns the last
/// acknowledged seq and the error.
fn fill(j: &Journal, first: u64, len: usize) -> (u64, JournalError) {
    let mut s = first;
    loop {
        assert!(s < first + 100_000, "the disk never filled up");
        match j.submit(vec![put(1, s, len)]).wait() {
            Ok(()) => s += 1,
            Err(e) => return (s - 1, e),
        }
    }
}

/// Retries a put until it is stored (the journal retries the disk at most every 250 ms).
fn put_when_space_is_back(j: &Journal, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match j.submit(vec![put(1, seq, 100)]).wait() {
            Ok(()) => return,
            Err(e) => {
                assert!(
                    matches!(e, JournalError::NoSpace { .. }),
                    "only NoSpace while waiting: {e}"
                );
                assert!(
                    Instant::now() < deadline,
                    "space came back, puts still fail"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn assert_no_space(e: &JournalError) {
    assert!(matches!(e, JournalError::NoSpace { .. }), "{e}");
    let t = e.to_string();
    assert!(
        t.contains("disk is full") && t.contains("no restart needed"),
        "{t}"
    );
}

#[test]
fn enospc_while_preallocating_refuses_data_but_does_not_poison() {
    let io = FaultyIo::new(3);
    let (j, _) = open(&io, small_opts(8 << 10));
    io.fail_preallocate_with_enospc(true);
    let (acked, err) = fill(&j, 1, 1000);
    assert!(acked >= 3, "{acked}");
    assert!(
        matches!(
            err,
            JournalError::NoSpace {
                action: "preallocate",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        !j.is_poisoned() && !j.stats().poisoned,
        "ENOSPC must not poison"
    );
    assert!(j.is_disk_full() && j.stats().disk_full);
    // Still refused while there is no space, with the disk-full error, not poison.
    assert_no_space(&j.submit(vec![put(1, 10_000, 1)]).wait().unwrap_err());
    // Removals still work.
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![1],
    }])
    .wait()
    .unwrap();
    // Space comes back: stores again by itself, no reopen.
    io.fail_preallocate_with_enospc(false);
    put_when_space_is_back(&j, acked + 1);
    for s in acked + 2..acked + 40 {
        j.submit(vec![put(1, s, 1000)]).wait().unwrap();
    }
    assert!(!j.is_disk_full() && !j.is_poisoned());
    drop(j);
    let (j, r) = open(&io.restart(), small_opts(8 << 10));
    let want: Vec<u64> = (2..=acked).chain(acked + 1..acked + 40).collect();
    assert_eq!(seqs(&r, 1), want);
    check_bodies(&j, &r, 1, |s| if s == acked + 1 { 100 } else { 1000 });
}

#[test]
fn enospc_on_write_is_not_poison_and_leaves_no_trace() {
    let io = FaultyIo::new(4);
    let (j, _) = open(&io, small_opts(1 << 20));
    j.submit(vec![put(1, 1, 10)]).wait().unwrap();
    io.fail_writes_with_enospc(true);
    let err = j.submit(vec![put(1, 2, 10)]).wait().unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::NoSpace {
                action: "write",
                ..
            }
        ),
        "{err}"
    );
    assert!(!j.is_poisoned());
    io.fail_writes_with_enospc(false);
    put_when_space_is_back(&j, 3);
    drop(j);
    let (j, r) = open(&io.restart(), small_opts(1 << 20));
    assert_eq!(seqs(&r, 1), vec![1, 3], "the refused put is not there");
    assert!(r.truncated.is_none());
    check_bodies(&j, &r, 1, |s| if s == 1 { 10 } else { 100 });
}

/// A real-looking full disk: a capacity. Sends fill it; then every message is removed, one
/// record each, which needs more room than the full active segment has: the removals go into
/// a segment made from the reserve, compaction drops the dead segments, and the journal leaves
/// disk-full mode by itself.
#[test]
fn full_disk_removals_use_the_reserve_and_space_comes_back_by_itself() {
    const SEG: u64 = 16 << 10;
    let io = FaultyIo::new(5);
    let (j, _) = open(&io, small_opts(SEG));
    assert_eq!(io.reserve(), Some(SEG), "a reserve of one segment is kept");
    // A queue definition stays live in the oldest segment: it must not pin the dead ones.
    j.submit(vec![Op::DefineQueue {
        queue_id: 1,
        def: "queue one".into(),
    }])
    .wait()
    .unwrap();
    io.set_capacity(Some(io.used() + 6 * SEG));
    let (acked, err) = fill(&j, 1, 500);
    assert_no_space(&err);
    assert!(j.is_disk_full());
    assert!(acked > 100, "{acked}");
    // More sends are refused at once.
    assert_no_space(&j.submit(vec![put(1, 99_999, 10)]).wait().unwrap_err());
    // Receive everything, one removal record per message: ~29 bytes each, more than what is
    // left in the active segment, so a new segment is needed while the disk is full.
    for s in 1..=acked {
        j.submit(vec![Op::Remove {
            queue_id: 1,
            seqs: vec![s],
        }])
        .wait()
        .unwrap_or_else(|e| panic!("removal of {s} failed on a full disk: {e}"));
    }
    assert!(!j.is_poisoned());
    assert!(j.stats().segments_deleted > 0, "dead segments were dropped");
    // Space is back without any outside help: sends work again.
    put_when_space_is_back(&j, acked + 1);
    for s in acked + 2..acked + 50 {
        j.submit(vec![put(1, s, 500)]).wait().unwrap();
    }
    assert!(!j.is_disk_full());
    let used = io.used();
    drop(j);
    let (j, r) = open(&io.restart(), small_opts(SEG));
    let want: Vec<u64> = (acked + 1..acked + 50).collect();
    assert_eq!(seqs(&r, 1), want);
    assert_eq!(r.queues.len(), 1, "the definition was copied, not lost");
    check_bodies(&j, &r, 1, |s| if s == acked + 1 { 100 } else { 500 });
    assert!(used <= io.used().max(used), "sanity");
}

/// Segments dropped a moment ago are freed on the unlink thread, a step at a time: a new
/// segment that does not fit yet waits for that space (hurrying the thread) instead of
/// refusing the records with NoSpace. (Found under load: a put right after disk-full mode
/// ended was refused while the space was on its way back.)
#[test]
fn a_new_segment_waits_for_the_space_the_unlink_thread_is_freeing() {
    const SEG: u64 = 16 << 10;
    let io = FaultyIo::new(8);
    let (j, _) = open(&io, small_opts(SEG));
    io.set_capacity(Some(io.used() + 6 * SEG));
    // The unlink thread frees nothing until the journal hurries it.
    io.hold_retires(true);
    let n = 100u64;
    for s in 1..=n {
        j.submit(vec![put(1, s, 500)]).wait().unwrap();
    }
    for s in 1..=n {
        j.submit(vec![Op::Remove {
            queue_id: 1,
            seqs: vec![s],
        }])
        .wait()
        .unwrap();
    }
    // The dead segments are dropped by compaction when the writer is idle (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(20);
    while j.stats().segments_deleted < 3 {
        assert!(
            Instant::now() < deadline,
            "no segment dropped: {:?}",
            j.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Their space is still taken: the next segments fit only once the thread frees it.
    for s in n + 1..=2 * n {
        j.submit(vec![put(1, s, 500)])
            .wait()
            .unwrap_or_else(|e| panic!("put {s} refused while space was being freed: {e}"));
    }
    assert!(io.retires_hurried() > 0, "the space was never waited for");
    assert!(!j.is_disk_full());
    io.hold_retires(false);
    drop(j);
    let (j, r) = open(&io.restart(), small_opts(SEG));
    assert_eq!(seqs(&r, 1), (n + 1..=2 * n).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |_| 500);
}

/// Without a reserve the same removals fail once the active segment is full: the reserve is
/// what keeps receives working.
#[test]
fn without_a_reserve_removals_fail_on_a_full_disk() {
    const SEG: u64 = 16 << 10;
    let io = FaultyIo::new(6);
    let opts = JournalOptions {
        reserve_bytes: Some(0),
        ..small_opts(SEG)
    };
    let (j, _) = open(&io, opts);
    io.set_capacity(Some(io.used() + 6 * SEG));
    let (acked, _) = fill(&j, 1, 500);
    let failed = (1..=acked).find(|&s| {
        j.submit(vec![Op::Remove {
            queue_id: 1,
            seqs: vec![s],
        }])
        .wait()
        .is_err()
    });
    assert!(
        failed.is_some(),
        "all {acked} removals fitted without a reserve"
    );
    assert!(!j.is_poisoned(), "still not poison");
}

#[test]
fn failed_sync_while_disk_full_still_poisons() {
    let io = FaultyIo::new(7);
    let (j, _) = open(&io, small_opts(8 << 10));
    io.fail_preallocate_with_enospc(true);
    fill(&j, 1, 1000);
    io.fail_sync_at(1);
    let e = j
        .submit(vec![Op::Remove {
            queue_id: 1,
            seqs: vec![1],
        }])
        .wait()
        .unwrap_err();
    assert!(
        matches!(
            e,
            JournalError::Io {
                action: "fdatasync",
                ..
            }
        ),
        "{e}"
    );
    assert!(j.is_poisoned());
}

/// Holds the writer in the sync of a first record, so that the next submissions form one
/// group commit; returns that first record's commit.
fn hold_writer(io: &FaultyIo, j: &Journal, seq: u64) -> Commit {
    io.pause_syncs(true);
    let held = j.submit(vec![put(1, seq, 10)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !io.sync_held() {
        assert!(
            Instant::now() < deadline,
            "the writer never reached its sync"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    held
}

/// Review C4: a write that runs out of space part way leaves whole records of the same group
/// commit in the page cache. They were answered "nothing stored", so they must not come back
/// after a `kill -9` (the page cache survives it): the writer zeroes and syncs them first.
#[test]
fn a_partial_enospc_write_is_zeroed_before_it_is_answered() {
    let io = FaultyIo::new(5);
    let (j, _) = open(&io, small_opts(1 << 20));
    j.submit(vec![put(1, 1, 10)]).wait().unwrap();
    let held = hold_writer(&io, &j, 2);
    // Two whole records of ~150 bytes, then ENOSPC in the third.
    io.fail_next_write_with_enospc_after(400);
    let a = j.submit(vec![put(1, 3, 100)]);
    let b = j.submit(vec![put(1, 4, 100)]);
    let c = j.submit(vec![put(1, 5, 1000)]);
    io.pause_syncs(false);
    held.wait().unwrap();
    for (n, r) in [a.wait(), b.wait(), c.wait()].into_iter().enumerate() {
        let e = r.unwrap_err();
        assert!(matches!(e, JournalError::NoSpace { .. }), "{n}: {e}");
        assert!(!e.may_be_stored(), "{n}: {e}");
    }
    assert!(!j.is_poisoned());
    // kill -9 now: everything written so far stays.
    let after_kill = io.restart_after_kill();
    drop(j);
    let (_, r) = open(&after_kill, small_opts(1 << 20));
    assert_eq!(
        seqs(&r, 1),
        vec![1, 2],
        "records answered NoSpace came back"
    );
}

/// Review C3: once a record of a chain fails, later records of the chain are not written,
/// even in a later group commit that could have stored them, until the chain is reset.
#[test]
fn a_chain_stops_at_its_first_failed_record() {
    let io = FaultyIo::new(6);
    let opts = JournalOptions {
        max_batch_bytes: 1, // one submission per group commit
        ..small_opts(1 << 20)
    };
    let (j, _) = open(&io, opts.clone());
    j.submit(vec![put(1, 1, 10)]).wait().unwrap();
    let chain = Chain::new();
    let held = hold_writer(&io, &j, 2);
    io.fail_next_write_with_enospc_after(10);
    let a = j.submit_chained(vec![put(1, 3, 100)], &chain);
    // Does not store data, so the disk-full mode would let it through: only the chain stops it.
    let b = j.submit_chained(
        vec![Op::Remove {
            queue_id: 1,
            seqs: vec![1],
        }],
        &chain,
    );
    io.pause_syncs(false);
    held.wait().unwrap();
    assert!(matches!(a.wait(), Err(JournalError::NoSpace { .. })));
    let e = b.wait().unwrap_err();
    assert!(matches!(e, JournalError::EarlierFailed { .. }), "{e}");
    assert!(chain.is_broken());
    let e = j
        .submit_chained(
            vec![Op::Remove {
                queue_id: 1,
                seqs: vec![2],
            }],
            &chain,
        )
        .wait()
        .unwrap_err();
    assert!(matches!(e, JournalError::EarlierFailed { .. }), "{e}");
    chain.reset();
    j.submit_chained(
        vec![Op::Remove {
            queue_id: 1,
            seqs: vec![2],
        }],
        &chain,
    )
    .wait()
    .unwrap();
    drop(j);
    let (_, r) = open(&io.restart(), opts);
    assert_eq!(
        seqs(&r, 1),
        vec![1],
        "seq 2 removed after the reset, seq 1 never"
    );
}

/// Review M6: a queue definition submitted detached (nobody waits; its queue is used at once)
/// while the journal is in disk-full mode is written if the active segment has room, instead
/// of being refused, which poisoned the journal.
#[test]
fn a_detached_definition_in_disk_full_mode_does_not_poison() {
    let io = FaultyIo::new(8);
    let (j, _) = open(&io, small_opts(1 << 20));
    j.submit(vec![put(1, 1, 10)]).wait().unwrap();
    io.fail_writes_with_enospc(true);
    assert!(j.submit(vec![put(1, 2, 10)]).wait().is_err());
    io.fail_writes_with_enospc(false);
    assert!(
        j.is_disk_full(),
        "a write that hit ENOSPC enters disk-full mode"
    );
    j.submit_detached(vec![Op::DefineQueue {
        queue_id: 9,
        def: Bytes::from_static(b"def"),
    }]);
    // A barrier: completes after the detached record.
    j.submit(vec![]).wait().unwrap();
    assert!(
        !j.is_poisoned(),
        "the detached definition poisoned the journal"
    );
    drop(j);
    let (_, r) = open(&io.restart(), small_opts(1 << 20));
    assert!(
        r.queues.iter().any(|(id, _)| *id == 9),
        "the definition is on disk"
    );
}

/// helper-66: queue definitions are submitted detached (a subqueue opened by a look, an
/// outgoing queue made by a send to a new remote broker), and one that needed a new segment
/// while the disk was full failed, which poisoned the journal: every receive refused until a
/// restart. Now they are written as removals are, into the reserve's space if need be: the
/// journal is in disk-full mode, not poisoned, and every definition is on disk.
#[test]
fn detached_definitions_that_need_a_new_segment_on_a_full_disk_use_the_reserve() {
    const SEG: u64 = 16 << 10;
    let io = FaultyIo::new(9);
    let (j, _) = open(&io, small_opts(SEG));
    assert_eq!(io.reserve(), Some(SEG));
    io.set_capacity(Some(io.used() + 3 * SEG));
    let (acked, err) = fill(&j, 1, 500);
    assert_no_space(&err);
    assert!(j.is_disk_full());
    // Definitions of ~1 KiB: the first that does not fit the active segment needs a new one.
    // Two batches: a put ahead of them (refused), and definitions alone.
    let def = |n: u64| Op::DefineQueue {
        queue_id: 100 + n,
        def: Bytes::from(vec![b'd'; 1000]),
    };
    let refused = j.submit(vec![put(1, acked + 1, 10)]);
    for n in 0..4 {
        j.submit_detached(vec![def(n)]);
    }
    assert_no_space(&refused.wait().unwrap_err());
    for n in 4..8 {
        j.submit_detached(vec![def(n)]);
    }
    // A barrier: completes after the detached records.
    j.submit(vec![]).wait().unwrap();
    assert!(
        !j.is_poisoned(),
        "a detached definition poisoned the journal"
    );
    assert!(j.is_disk_full(), "still in disk-full mode");
    assert_eq!(io.reserve(), None, "the reserve's space was used");
    assert_no_space(&j.submit(vec![put(1, acked + 2, 10)]).wait().unwrap_err());
    drop(j);
    let (_, r) = open(&io.restart(), small_opts(SEG));
    for n in 0..8 {
        assert!(
            r.queues.iter().any(|(id, _)| *id == 100 + n),
            "definition {n} is on disk"
        );
    }
    assert_eq!(seqs(&r, 1), (1..=acked).collect::<Vec<_>>());
}
