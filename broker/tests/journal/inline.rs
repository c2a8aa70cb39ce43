//! Commits written by their caller (`Journal::submit_awaited`, `JournalOptions::inline_commits`):
//! when the writer is idle, an awaited commit is written and synced on the caller's thread. It
//! is durable like any other, lands in the order the caller's lock gave it, survives a crash at
//! any sync, and leaves the writer thread its own work (compaction, zeros laid ahead).

use super::common::*;
use super::crash::{reopen_after_crash, txn};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Submits awaited puts to queue 99 until one is written inline (at most 1,000): then the
/// writer thread is asleep with nothing queued, and an awaited submission made at once is
/// written inline too. (Right after a commit of its own, or its first turn after opening, the
/// writer may still hold its lock, and a submission made then goes to it.)
fn until_the_writer_sleeps(j: &Journal) {
    for seq in 1..=1000u64 {
        let before = j.stats().inline_commits;
        j.submit_awaited(vec![put(99, seq, 10)], ()).wait().unwrap();
        if j.stats().inline_commits > before {
            return;
        }
    }
    panic!("no awaited submission of 1,000 was written inline");
}

/// Submits transactions one at a time through `submit_awaited` until one fails or `limit`;
/// returns (acked, submitted).
fn run_awaited_until_crash(j: &Journal, limit: u64) -> (u64, u64) {
    let (mut acked, mut submitted) = (0, 0);
    while submitted < limit {
        submitted += 1;
        match j.submit_awaited(txn(submitted), ()).wait() {
            Ok(()) => acked = submitted,
            Err(_) => break,
        }
    }
    (acked, submitted)
}

#[test]
fn an_awaited_commit_of_an_idle_journal_is_written_by_its_caller() {
    let io = FaultyIo::new(5);
    let opts = small_opts(1 << 20);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
    for seq in 1..=300u64 {
        j.submit_awaited(vec![put(1, seq, 300)], ()).wait().unwrap();
    }
    let s = j.stats();
    // The writer thread holds its lock only while it works (here: the first turn after
    // opening); otherwise every one of these finds it idle.
    assert!(s.inline_commits >= 250, "{s:?}");
    assert_eq!(s.records_written, 300, "{s:?}");
    assert_eq!(j.pending(), 0);
    drop(j);
    let (j, r) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.restart())).unwrap();
    assert_eq!(seqs(&r, 1), (1..=300).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |_| 300);

    // Off: every commit goes through the writer thread.
    let off = JournalOptions {
        inline_commits: false,
        ..small_opts(1 << 20)
    };
    let io = FaultyIo::new(6);
    let (j, _) = Journal::open_with_io("/fake".as_ref(), off, Arc::new(io)).unwrap();
    for seq in 1..=20u64 {
        j.submit_awaited(vec![put(1, seq, 300)], ()).wait().unwrap();
    }
    assert_eq!(j.stats().inline_commits, 0);
    // A record over the inline limit goes to the writer thread too.
    let (j2, _) = Journal::open_with_io(
        "/fake".as_ref(),
        small_opts(1 << 20),
        Arc::new(FaultyIo::new(8)),
    )
    .unwrap();
    j2.submit_awaited(vec![put(1, 1, mq_broker::journal::INLINE_MAX_BYTES)], ())
        .wait()
        .unwrap();
    assert_eq!(j2.stats().inline_commits, 0);
    // A spinning writer takes them itself (`idle_spin` set): none inline.
    let spin = JournalOptions {
        idle_spin: Duration::from_micros(100),
        ..small_opts(1 << 20)
    };
    let (j3, _) =
        Journal::open_with_io("/fake".as_ref(), spin, Arc::new(FaultyIo::new(10))).unwrap();
    for seq in 1..=20u64 {
        j3.submit_awaited(vec![put(1, seq, 300)], ())
            .wait()
            .unwrap();
    }
    let s = j3.stats();
    assert_eq!(s.inline_commits, 0, "{s:?}");
    assert!(s.idle_spins > 0, "{s:?}");
}

#[test]
fn a_submission_ordered_after_an_inline_one_lands_after_it() {
    // Threads take turns under one lock (the broker's commit order): turn 2k puts message k,
    // turn 2k+1 removes it. Each submits under the lock, through `submit_awaited` (which
    // releases the lock once the record's place is taken) or `submit`. If a removal reached
    // the disk before its put, recovery would bring the message back.
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        segment_size: 1 << 20,
        ..JournalOptions::default()
    };
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    const TURNS: u64 = 3000;
    // Rounds of TURNS turns until some commit was inline: four threads can settle into keeping
    // the writer busy for a whole round (each submitting while it syncs the others' batch).
    let turn = Arc::new(Mutex::new(0u64));
    let mut rounds = 0;
    let s = loop {
        rounds += 1;
        let end = rounds * TURNS;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (j, turn) = (j.clone(), turn.clone());
                std::thread::spawn(move || {
                    let mut commits = Vec::new();
                    loop {
                        let mut g = turn.lock().unwrap();
                        let n = *g;
                        if n >= end {
                            break;
                        }
                        *g += 1;
                        let k = n / 2 + 1;
                        let op = if n % 2 == 0 {
                            put(1, k, 100)
                        } else {
                            Op::Remove {
                                queue_id: 1,
                                seqs: vec![k],
                            }
                        };
                        if (n + t) % 5 == 0 {
                            let c = j.submit(vec![op]);
                            drop(g);
                            commits.push(c);
                        } else {
                            commits.push(j.submit_awaited(vec![op], g));
                        }
                        // Mostly one at a time (the writer idles), sometimes a few in flight.
                        if commits.len() > (t as usize % 3) {
                            for c in commits.drain(..) {
                                c.wait().unwrap();
                            }
                        }
                    }
                    for c in commits {
                        c.wait().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = j.stats();
        if s.inline_commits > 0 || rounds == 5 {
            break s;
        }
    };
    assert!(
        s.inline_commits > 0,
        "no commit was inline in {rounds} rounds: {s:?}"
    );
    assert!(
        s.inline_commits < rounds * TURNS,
        "every commit inline: the queued path was not mixed in: {s:?}"
    );
    drop(j);
    let (_j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(
        seqs(&r, 1),
        Vec::<u64>::new(),
        "removals that reached the disk before their put"
    );
}

#[test]
fn crash_at_any_sync_with_inline_commits_keeps_every_acknowledged_transaction() {
    // Small segments: rolls, compaction and zeros laid ahead happen between the crashes.
    let opts = JournalOptions {
        zero_ahead_bytes: 8 << 10,
        ..small_opts(16 << 10)
    };
    let (mut crashes, mut inline) = (0, 0u64);
    for seed in 0..2u64 {
        for n in 1..=60u64 {
            let io = FaultyIo::new(seed * 1000 + n);
            io.set_zero_ahead(seed == 1);
            let (j, _) =
                Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone()))
                    .unwrap();
            io.crash_at_sync(n);
            let (acked, submitted) = run_awaited_until_crash(&j, 100);
            inline += j.stats().inline_commits;
            crashes += u32::from(io.crashed());
            drop(j);
            reopen_after_crash(&io, &opts, &format!("seed {seed} n {n}"), acked, submitted);
        }
    }
    assert!(crashes > 60, "most runs should crash mid-way: {crashes}");
    assert!(inline > 1000, "few commits were inline: {inline}");
}

#[test]
fn inline_commits_leave_the_writer_its_compaction_and_zeros() {
    // Every transaction removes what an earlier one put (`txn`): segments of 16 KiB fill and
    // die. Only the writer thread compacts and lays zeros; it must be woken for them, since
    // inline commits never pass through its queue.
    let io = FaultyIo::new(9);
    io.set_zero_ahead(true);
    let opts = JournalOptions {
        zero_ahead_bytes: 8 << 10,
        ..small_opts(16 << 10)
    };
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
    let total: u64 = 600;
    for t in 1..=total {
        j.submit_awaited(txn(t), ()).wait().unwrap();
    }
    let until = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = j.stats();
        // About 1.8 MB went through 16 KiB segments; what stays live is the last 13 bodies.
        // (Never woken, the writer leaves ~110 segments and the first 8 KiB of zeros.)
        if s.segments <= 8 && s.zeroed_bytes >= 64 << 10 {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the writer neither compacted nor laid zeros after {} inline commits: {s:?}",
            s.inline_commits
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // (Most of these commits find the writer at work: with 16 KiB segments and 8 KiB of zeros,
    // nearly every commit leaves it a roll, a compaction step or zeros to lay.)
    assert!(s.inline_commits > 0, "{s:?}");
    assert!(s.segments_deleted > 50, "{s:?}");
    drop(j);
    let (_j, r) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.restart())).unwrap();
    assert_eq!(seqs(&r, 2), (total - 9..=total).collect::<Vec<_>>());
    assert_eq!(seqs(&r, 1), (total - 2..=total).collect::<Vec<_>>());
}

#[test]
fn an_inline_commit_fails_like_the_writers_on_a_failed_sync_or_a_full_disk() {
    // A failed fdatasync of an inline commit poisons the journal: that commit and every later
    // one fail, none inline after it.
    let io = FaultyIo::new(12);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    for seq in 1..=5u64 {
        j.submit_awaited(vec![put(1, seq, 100)], ()).wait().unwrap();
    }
    until_the_writer_sleeps(&j);
    let before = j.stats();
    io.fail_sync_at(1);
    let e = j
        .submit_awaited(vec![put(1, 6, 100)], ())
        .wait()
        .unwrap_err();
    assert!(j.is_poisoned(), "{e}");
    let after = j.stats();
    assert_eq!(after.inline_commits, before.inline_commits + 1, "{after:?}");
    assert!(j.submit_awaited(vec![put(1, 7, 100)], ()).wait().is_err());
    assert_eq!(
        j.stats().inline_commits,
        after.inline_commits,
        "none after poison"
    );

    // A full disk: an inline put is refused with NoSpace (not poisoned), a removal goes through.
    let io = FaultyIo::new(13);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(8 << 10), Arc::new(io.clone())).unwrap();
    io.fail_preallocate_with_enospc(true);
    let mut seq = 1;
    let err = loop {
        assert!(seq < 10_000, "the disk never filled up");
        match j.submit_awaited(vec![put(1, seq, 1000)], ()).wait() {
            Ok(()) => seq += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, JournalError::NoSpace { .. }), "{err}");
    assert!(!j.is_poisoned() && j.is_disk_full());
    assert!(j.stats().inline_commits > 0);
    j.submit_awaited(
        vec![Op::Remove {
            queue_id: 1,
            seqs: vec![1],
        }],
        (),
    )
    .wait()
    .unwrap();
    assert!(!j.is_poisoned());
}

/// Runs `f` in a helper thread and fails the test if it takes longer than 20 s: a journal that
/// leaves a submission waiting in a queue nobody reads hangs instead of failing.
fn within_20s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
}

#[test]
fn after_a_panic_in_a_commit_later_submissions_fail_instead_of_hanging() {
    for inline in [true, false] {
        let io = FaultyIo::new(14);
        let opts = JournalOptions {
            inline_commits: inline,
            ..small_opts(1 << 20)
        };
        let (j, _) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.clone())).unwrap();
        j.submit_awaited(vec![put(1, 1, 100)], ()).wait().unwrap();
        if inline {
            until_the_writer_sleeps(&j);
        }
        io.panic_at_sync(1);
        // Inline: the panic is the caller's (this thread's); otherwise the writer thread's,
        // and the caller sees its commit dropped.
        let j2 = j.clone();
        let first = within_20s("the commit that panics", move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                j2.submit_awaited(vec![put(1, 2, 100)], ()).wait()
            }))
        });
        match (&first, inline) {
            (Err(_), true) | (Ok(Err(_)), false) => {}
            other => panic!("inline {inline}: {other:?}"),
        }
        for seq in 3..=4 {
            let j2 = j.clone();
            let r = within_20s("a later submission", move || {
                j2.submit(vec![put(1, seq, 100)]).wait()
            });
            assert!(
                r.is_err(),
                "inline {inline}: a write after the panic succeeded"
            );
            let j2 = j.clone();
            let r = within_20s("a later awaited submission", move || {
                j2.submit_awaited(vec![put(1, seq + 10, 100)], ()).wait()
            });
            assert!(
                r.is_err(),
                "inline {inline}: a write after the panic succeeded"
            );
        }
    }
}

#[test]
fn an_awaited_removal_is_written_by_its_caller_when_the_writer_is_idle() {
    // `submit_removal_awaited` (a receive from a transactional queue): inline when the writer
    // is idle, its outcome known at once (`Commit::try_outcome`); durable either way, urgent
    // lane or normal, and with inline commits off it goes through the writer thread.
    for inline in [true, false] {
        let io = FaultyIo::new(14);
        let opts = JournalOptions {
            inline_commits: inline,
            ..small_opts(1 << 20)
        };
        let (j, _) =
            Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
        // Awaited puts (inline when on): the writer thread stays asleep, as it is when
        // requests come one round trip apart. (Right after a commit of its own it may still
        // hold its lock, and an awaited submission made at once finds it busy.)
        for seq in 1..=100u64 {
            j.submit_awaited(vec![put(1, seq, 200)], ()).wait().unwrap();
        }
        let before = j.stats().inline_commits;
        let mut known_at_once = 0;
        for seq in 1..=60u64 {
            let op = Op::Remove {
                queue_id: 1,
                seqs: vec![seq],
            };
            let mut c = j.submit_removal_awaited(vec![op], seq % 2 == 0);
            match c.try_outcome() {
                Some(r) => {
                    r.unwrap();
                    known_at_once += 1;
                }
                None => c.wait().unwrap(),
            }
        }
        let inline_removals = j.stats().inline_commits - before;
        if inline {
            assert!(inline_removals >= 50, "{inline_removals} of 60 inline");
            assert!(known_at_once >= inline_removals, "{known_at_once}");
        } else {
            assert_eq!(inline_removals, 0);
        }
        assert_eq!(j.pending(), 0);
        drop(j);
        let (_j, r) =
            Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.restart())).unwrap();
        assert_eq!(
            seqs(&r, 1),
            (61..=100).collect::<Vec<_>>(),
            "inline {inline}"
        );
    }
}

#[test]
fn an_awaited_removal_of_a_poisoned_journal_fails_at_once() {
    let io = FaultyIo::new(15);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    j.submit(vec![put(1, 1, 100)]).wait().unwrap();
    io.fail_sync_at(1);
    assert!(j.submit(vec![put(1, 2, 100)]).wait().is_err());
    let op = Op::Remove {
        queue_id: 1,
        seqs: vec![1],
    };
    let mut c = j.submit_removal_awaited(vec![op], true);
    let e = c.try_outcome().expect("a poisoned journal answers at once");
    assert!(e.unwrap_err().is_poisoned());
}
