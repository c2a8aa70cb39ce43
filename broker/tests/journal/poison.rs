//! Failed syncs poison the journal; nothing is retried. (A full disk does not: `disk_full`.)

use super::common::*;

#[test]
fn failed_fdatasync_poisons() {
    let io = FaultyIo::new(1);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    j.submit(vec![put(1, 1, 10)]).wait().unwrap();
    io.fail_sync_at(1);
    let err = j.submit(vec![put(1, 2, 10)]).wait().unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::Io {
                action: "fdatasync",
                ..
            }
        ),
        "{err}"
    );
    for s in 3..6 {
        let e = j.submit(vec![put(1, s, 10)]).wait().unwrap_err();
        assert!(e.is_poisoned(), "{e}");
        assert!(e.to_string().contains("restart"), "says what to do: {e}");
    }
    assert!(j.stats().poisoned);
    // Reads still work.
    assert_eq!(j.read_body(1, 1).unwrap(), body(1, 1, 10));
    drop(j);
    let (_, r) = Journal::open_with_io(
        "/fake".as_ref(),
        small_opts(1 << 20),
        Arc::new(io.restart()),
    )
    .unwrap();
    let s = seqs(&r, 1);
    assert!(s == vec![1] || s == vec![1, 2], "{s:?}");
}

#[test]
fn every_waiter_of_the_failed_batch_fails() {
    let io = FaultyIo::new(2);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    io.fail_sync_at(1);
    let commits: Vec<_> = (1..=50).map(|s| j.submit(vec![put(1, s, 100)])).collect();
    let results: Vec<_> = commits.into_iter().map(Commit::wait).collect();
    assert!(
        results.iter().all(Result::is_err),
        "no commit after a failed sync is Ok"
    );
    assert!(matches!(results[0], Err(JournalError::Io { .. })));
}

use mq_broker::journal::Commit;
