//! Crash at the Nth sync, for many N and seeds, then reopen on what survived.
//!
//! The workload is a sequence of transactions; transaction t is ONE submit of
//! `[Put(1, t), Put(2, t), Remove(1, [t - 3]), Remove(2, [t - 10])]`. After replaying
//! transactions 1..=k the state is: queue 1 holds `max(1, k - 2)..=k`, queue 2 holds
//! `max(1, k - 9)..=k`. Most data dies young, so segments roll and compaction deletes and
//! copies forward while crashes happen. Records are durable
//! in order, so after a crash the journal must hold exactly that state for one k with
//! `acked <= k <= submitted`: every acknowledged transaction is there, exactly once and in
//! order, and no transaction is half there.

use super::common::*;
use std::collections::VecDeque;

pub(super) fn body_len(t: u64) -> usize {
    // Varied sizes, some larger than a quarter segment, so records straddle boundaries.
    ((t * 7919) % 3000 + 1) as usize
}

pub(super) fn txn(t: u64) -> Vec<Op> {
    let mut ops = vec![put(1, t, body_len(t)), put(2, t, body_len(t))];
    if t > 3 {
        ops.push(Op::Remove {
            queue_id: 1,
            seqs: vec![t - 3],
        });
    }
    if t > 10 {
        ops.push(Op::Remove {
            queue_id: 2,
            seqs: vec![t - 10],
        });
    }
    ops
}

pub(super) fn state_k(r: &Recovery) -> u64 {
    let q2 = seqs(r, 2);
    let k = q2.last().copied().unwrap_or(0);
    let window = |w: u64| -> Vec<u64> {
        if k == 0 {
            vec![]
        } else {
            (k.saturating_sub(w - 1).max(1)..=k).collect()
        }
    };
    assert_eq!(q2, window(10), "queue 2 does not match k={k}");
    assert_eq!(seqs(r, 1), window(3), "queue 1 does not match k={k}");
    k
}

/// After `io` crashed (or not) with `acked` of `submitted` transactions acknowledged: reopens,
/// checks that what recovery holds is a prefix of at least the acknowledged ones, intact, that
/// the journal takes a write again and that the write survives a clean reopen. Returns whether
/// the first reopen found a torn tail.
pub(super) fn reopen_after_crash(
    io: &FaultyIo,
    opts: &JournalOptions,
    what: &str,
    acked: u64,
    submitted: u64,
) -> bool {
    let io2 = io.restart();
    let (j2, r) = Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io2.clone()))
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    let k = state_k(&r);
    assert!(
        k >= acked && k <= submitted,
        "{what}: k={k} acked={acked} submitted={submitted}"
    );
    check_bodies(&j2, &r, 1, body_len);
    check_bodies(&j2, &r, 2, body_len);
    assert!(r.max_seq.get(&2).copied().unwrap_or(0) >= k);

    // Writable again, and what it writes survives a clean reopen.
    j2.submit(txn(k + 1)).wait().unwrap();
    drop(j2);
    let (j3, r2) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io2.restart())).unwrap();
    assert_eq!(state_k(&r2), k + 1);
    assert!(r2.truncated.is_none());
    check_bodies(&j3, &r2, 2, body_len);
    r.truncated.is_some()
}

/// Runs the workload until the crash; returns (acked, submitted).
pub(super) fn run_until_crash(j: &Journal, window: usize, limit: u64) -> (u64, u64) {
    let mut inflight = VecDeque::new();
    let mut acked = 0;
    let mut submitted = 0;
    let mut failed = false;
    while submitted < limit && !failed {
        submitted += 1;
        inflight.push_back((submitted, j.submit(txn(submitted))));
        while inflight.len() >= window || (submitted == limit && !inflight.is_empty()) {
            let (t, c) = inflight.pop_front().unwrap();
            match c.wait() {
                Ok(()) => {
                    assert!(!failed, "an Ok after a failure");
                    assert_eq!(t, acked + 1, "acks complete in order");
                    acked = t;
                }
                Err(_) => failed = true,
            }
        }
    }
    for (_, c) in inflight {
        if c.wait().is_ok() {
            acked += 1;
        }
    }
    (acked, submitted)
}

#[test]
fn crash_at_nth_sync_keeps_every_acknowledged_transaction() {
    let opts = small_opts(16 << 10);
    let mut crashes = 0;
    let mut truncations = 0;
    for seed in 0..4u64 {
        for n in 1..=70u64 {
            let io = FaultyIo::new(seed * 1000 + n);
            let (j, _) =
                Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone()))
                    .unwrap();
            io.crash_at_sync(n);
            let window = 1 + (seed as usize * 3) % 8;
            let (acked, submitted) = run_until_crash(&j, window, 120);
            if io.crashed() {
                crashes += 1;
                assert!(
                    j.submit(txn(submitted + 1)).wait().is_err(),
                    "writes refused after the crash"
                );
            }
            drop(j);

            if reopen_after_crash(&io, &opts, &format!("seed {seed} n {n}"), acked, submitted) {
                truncations += 1;
            }
        }
    }
    assert!(crashes > 200, "most runs should crash mid-way: {crashes}");
    assert!(truncations > 0, "some crashes should leave a torn tail");
}

#[test]
fn power_loss_at_a_random_moment() {
    // No sync fails: the power goes out while the writer may be mid-batch.
    let opts = small_opts(16 << 10);
    for seed in 0..20u64 {
        let io = FaultyIo::new(seed);
        let (j, _) =
            Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
        let mut acked = 0;
        let mut inflight = VecDeque::new();
        for t in 1..=(40 + seed * 5) {
            inflight.push_back(j.submit(txn(t)));
            if inflight.len() > 4 {
                inflight.pop_front().unwrap().wait().unwrap();
                acked += 1;
            }
        }
        let image = io.restart();
        let submitted = 40 + seed * 5;
        let (_, r) =
            Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(image)).unwrap();
        let k = state_k(&r);
        assert!(
            k >= acked && k <= submitted,
            "seed {seed}: k={k} acked={acked}"
        );
        drop(j);
    }
}
