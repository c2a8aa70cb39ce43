//! The writer's spin before it sleeps (`JournalOptions::idle_spin`): after a lone small commit
//! it watches its queues for a while. A submission made while it spins is taken without a
//! wake-up; one made just as it gives up is taken by the select it falls into (never lost);
//! crashes at any sync keep every acknowledged transaction as without it; off by default.

use super::common::*;
use super::crash::{reopen_after_crash, run_until_crash};
use std::sync::mpsc;
use std::time::Duration;

/// Waits for `c` in a helper thread, at most `limit`: a submission the writer never picked up
/// fails the test instead of hanging it.
fn wait_bounded(c: Commit, limit: Duration, what: &str) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => panic!("{what}: not completed within {limit:?}: the writer never took it"),
    }
}

#[test]
fn a_submission_made_while_the_writer_spins_is_taken_without_sleeping() {
    let io = FaultyIo::new(7);
    let opts = JournalOptions {
        idle_spin: mq_broker::journal::MAX_IDLE_SPIN,
        ..small_opts(64 << 10)
    };
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
    // One at a time: each completion starts a spin of up to 1 ms, and the next submission
    // follows it at once (microseconds later).
    for seq in 1..=300u64 {
        j.submit(vec![put(1, seq, 200)]).wait().unwrap();
    }
    let s = j.stats();
    assert!(s.idle_spins >= 100, "a spin after lone commits: {s:?}");
    assert!(
        s.idle_spin_catches > 0,
        "no submission was taken while the writer spun: {s:?}"
    );
    drop(j);
    let (j, r) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.restart())).unwrap();
    assert_eq!(seqs(&r, 1), (1..=300).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |_| 200);
}

#[test]
fn a_submission_made_as_the_writer_stops_spinning_is_never_lost() {
    // A short spin and pauses around its length (a sleep also costs the timer's slack, ~50
    // us): submissions land before, at and after the moment the writer gives up and sleeps.
    // On a busy machine spins overrun and back off (fewer of them), so rounds are run until
    // 100 spins were seen in all (at most 5).
    let opts = JournalOptions {
        idle_spin: Duration::from_micros(200),
        segment_size: 1 << 20,
        ..JournalOptions::default()
    };
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let (mut spins, mut catches, mut rounds) = (0u64, 0u64, 0u64);
    while spins < 100 && rounds < 5 {
        rounds += 1;
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
        for seq in 1..=1500u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pause = Duration::from_micros(x % 300);
            if !x.is_multiple_of(3) {
                std::thread::sleep(pause);
            }
            wait_bounded(
                j.submit(vec![put(1, seq, 100)]),
                Duration::from_secs(30),
                &format!("round {rounds} commit {seq}"),
            );
        }
        let s = j.stats();
        spins += s.idle_spins;
        catches += s.idle_spin_catches;
        drop(j);
        let (j, r) = Journal::open(dir.path(), opts.clone()).unwrap();
        assert!(r.truncated.is_none());
        assert_eq!(seqs(&r, 1), (1..=1500).collect::<Vec<_>>());
        check_bodies(&j, &r, 1, |_| 100);
    }
    assert!(
        spins >= 100,
        "a spin after lone commits: {spins} in {rounds} rounds"
    );
    // (The spin after each round's last commit may still be going on.)
    assert!(
        catches + rounds < spins,
        "some pauses outlast the spin (the writer then sleeps and is woken): {catches} of {spins}"
    );
}

#[test]
fn spins_that_take_nothing_stop_for_a_while() {
    // Commits 2 ms apart and a 50 us spin: every spin misses; after 8 misses in a row the
    // writer spins once per 65 lone commits. On a machine so busy that the writer is not
    // scheduled for 2 ms, a spin can last into the next commit and take it (a catch, which
    // starts the count of misses again): such a round shows nothing, so up to 5 are run
    // until one has no catch.
    let mut rounds = Vec::new();
    for round in 0..5u64 {
        let io = FaultyIo::new(11 + round);
        let opts = JournalOptions {
            idle_spin: Duration::from_micros(50),
            ..small_opts(1 << 20)
        };
        let (j, _) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io)).unwrap();
        for seq in 1..=200u64 {
            j.submit(vec![put(1, seq, 100)]).wait().unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let s = j.stats();
        if s.idle_spin_catches == 0 {
            assert!(
                (8..=20).contains(&s.idle_spins),
                "8 spins, then about one per 65 commits: {s:?}"
            );
            return;
        }
        rounds.push((s.idle_spins, s.idle_spin_catches));
    }
    panic!("every round had spins that caught a commit 2 ms later (spins, catches): {rounds:?}");
}

#[test]
fn crash_at_any_sync_with_a_spinning_writer_keeps_every_acknowledged_transaction() {
    let opts = JournalOptions {
        idle_spin: Duration::from_micros(200),
        ..small_opts(16 << 10)
    };
    let (mut crashes, mut spins) = (0, 0u64);
    for seed in 0..2u64 {
        for n in 1..=40u64 {
            let io = FaultyIo::new(seed * 1000 + n);
            let (j, _) =
                Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone()))
                    .unwrap();
            io.crash_at_sync(n);
            let window = [1, 3][seed as usize];
            let (acked, submitted) = run_until_crash(&j, window, 100);
            spins += j.stats().idle_spins;
            crashes += u32::from(io.crashed());
            drop(j);
            reopen_after_crash(&io, &opts, &format!("seed {seed} n {n}"), acked, submitted);
        }
    }
    assert!(crashes > 60, "most runs should crash mid-way: {crashes}");
    assert!(spins > 0, "the writer never spun");
}

#[test]
fn no_spin_by_default_nor_after_a_batch_of_several() {
    let io = FaultyIo::new(3);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(64 << 10), Arc::new(io.clone()))
            .unwrap();
    assert_eq!(JournalOptions::default().idle_spin, Duration::ZERO);
    for seq in 1..=20u64 {
        j.submit(vec![put(1, seq, 100)]).wait().unwrap();
    }
    assert_eq!(j.stats().idle_spins, 0, "off by default");
    drop(j);

    // On: a large lone record does not make it spin.
    let opts = JournalOptions {
        idle_spin: Duration::from_micros(100),
        ..small_opts(1 << 20)
    };
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.restart())).unwrap();
    j.submit(vec![put(2, 1, 100 << 10)]).wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(j.stats().idle_spins, 0, "after a lone large record");

    let too_long = JournalOptions {
        idle_spin: Duration::from_millis(2),
        ..JournalOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    match Journal::open(dir.path(), too_long) {
        Err(JournalError::InvalidOptions(m)) => assert!(m.contains("idle_spin"), "{m}"),
        other => panic!(
            "an idle_spin above 1 ms must be refused: {:?}",
            other.map(|_| ())
        ),
    }
}
