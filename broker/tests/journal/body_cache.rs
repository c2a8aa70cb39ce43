//! Bodies of recently written messages kept in memory (`JournalOptions::body_cache_bytes`):
//! read without touching the files, within the budget (oldest dropped first), gone with their
//! message (Remove, Purge, DeleteQueue, a later Put), moved by a Rekey; bodies no longer kept
//! are read back intact, adjacent ones with one read; a reopened journal keeps none.

use super::common::*;

fn opts(budget: u64) -> JournalOptions {
    JournalOptions {
        body_cache_bytes: budget,
        ..JournalOptions::default()
    }
}

/// Bodies read from the files and the read calls made for them, since `before`.
fn reads(j: &Journal, before: &JournalStats) -> (u64, u64) {
    let s = j.stats();
    (
        s.bodies_read - before.bodies_read,
        s.body_reads - before.body_reads,
    )
}

#[test]
fn a_body_just_written_is_read_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts(1 << 20)).unwrap();
    for s in 1..=10 {
        j.submit(vec![put(1, s, 1000)]).wait().unwrap();
    }
    let before = j.stats();
    for s in 1..=10 {
        assert_eq!(j.read_body(1, s).unwrap(), body(1, s, 1000));
    }
    let seqs: Vec<u64> = (1..=10).collect();
    let got = j.read_bodies(1, &seqs).unwrap();
    assert!(got.iter().zip(&seqs).all(|(b, &s)| *b == body(1, s, 1000)));
    assert_eq!(reads(&j, &before), (0, 0));
    assert_eq!(j.stats().body_cache_hits - before.body_cache_hits, 20);
    assert_eq!(j.stats().body_cache_entries, 10);

    // The same without a budget: every body from the file.
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts(0)).unwrap();
    j.submit(vec![put(1, 1, 1000)]).wait().unwrap();
    let before = j.stats();
    assert_eq!(j.read_body(1, 1).unwrap(), body(1, 1, 1000));
    assert_eq!(reads(&j, &before), (1, 1));
    assert_eq!(j.stats().body_cache_entries, 0);
}

#[test]
fn the_budget_holds_and_older_bodies_are_read_back_intact_in_runs() {
    const LEN: usize = 3000;
    let budget = 10 * (LEN as u64 + 128);
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts(budget)).unwrap();
    for s in 1..=100 {
        j.submit(vec![put(1, s, LEN)]).wait().unwrap();
        assert!(j.stats().body_cache_bytes <= budget);
    }
    assert_eq!(j.stats().body_cache_entries, 10);
    let before = j.stats();
    let seqs: Vec<u64> = (1..=100).collect();
    let got = j.read_bodies(1, &seqs).unwrap();
    for (b, &s) in got.iter().zip(&seqs) {
        assert_eq!(*b, body(1, s, LEN), "body {s}");
    }
    let (read, calls) = reads(&j, &before);
    assert_eq!(read, 90, "the 90 oldest are no longer in memory");
    assert_eq!(calls, 1, "90 adjacent bodies in one read");
    // Not adjacent: every other message, and in another order.
    let before = j.stats();
    let odd: Vec<u64> = (1..=90).rev().filter(|s| s % 2 == 1).collect();
    let got = j.read_bodies(1, &odd).unwrap();
    for (b, &s) in got.iter().zip(&odd) {
        assert_eq!(*b, body(1, s, LEN), "body {s}");
    }
    assert_eq!(reads(&j, &before).0, 45);
}

#[test]
fn a_body_goes_with_its_message_and_moves_with_a_rekey() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts(1 << 20)).unwrap();
    for s in 1..=10 {
        j.submit(vec![put(1, s, 100), put(2, s, 100)])
            .wait()
            .unwrap();
    }
    assert_eq!(j.stats().body_cache_entries, 20);
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![1, 2],
    }])
    .wait()
    .unwrap();
    assert_eq!(j.stats().body_cache_entries, 18);
    j.submit(vec![Op::Purge {
        queue_id: 1,
        through_seq: 5,
    }])
    .wait()
    .unwrap();
    assert_eq!(j.stats().body_cache_entries, 15);
    // A later Put of the same key replaces the body, also with an empty one.
    j.submit(vec![Op::Put {
        queue_id: 1,
        seq: 6,
        header: header(1, 6),
        body: Bytes::new(),
    }])
    .wait()
    .unwrap();
    assert_eq!(j.stats().body_cache_entries, 14);
    assert_eq!(j.read_body(1, 6).unwrap(), Bytes::new());
    let before = j.stats();
    j.submit(vec![Op::Rekey {
        queue_id: 1,
        seq: 7,
        to_queue_id: 3,
        to_seq: 1,
    }])
    .wait()
    .unwrap();
    assert_eq!(j.read_body(3, 1).unwrap(), body(1, 7, 100));
    assert!(j.read_body(1, 7).is_err());
    assert_eq!(reads(&j, &before), (0, 0));
    assert_eq!(j.stats().body_cache_entries, 14);
    j.submit(vec![Op::DeleteQueue { queue_id: 2 }])
        .wait()
        .unwrap();
    assert_eq!(j.stats().body_cache_entries, 4);
    let left = j.stats().body_cache_bytes;
    assert_eq!(left, 4 * (100 + 128));

    // Reopened: nothing in memory, every body from the files.
    j.shutdown();
    drop(j);
    let (j, r) = Journal::open(dir.path(), opts(1 << 20)).unwrap();
    assert_eq!(j.stats().body_cache_entries, 0);
    check_bodies(&j, &r, 1, |s| if s == 6 { 0 } else { 100 });
    assert_eq!(j.read_body(3, 1).unwrap(), body(1, 7, 100));
    assert_eq!(j.stats().body_cache_hits, 0);
    assert!(j.stats().bodies_read >= 4);
}

#[test]
fn a_refused_put_keeps_no_body() {
    // A record that is not written (the journal is closed) leaves nothing in memory.
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts(1 << 20)).unwrap();
    j.shutdown();
    assert!(j.submit(vec![put(1, 1, 100)]).wait().is_err());
    assert_eq!(j.stats().body_cache_entries, 0);
}
