//! Clean shutdown, then reopen: the live state comes back exactly.

use super::common::*;

#[test]
fn reopen_recovers_defs_messages_and_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert!(r.queues.is_empty() && r.messages.is_empty() && r.truncated.is_none());

    let def = |q: u64, v: &str| Op::DefineQueue {
        queue_id: q,
        def: Bytes::from(format!("def{q}{v}")),
    };
    j.submit(vec![def(1, "a"), def(2, "a"), def(3, "a"), def(4, "a")])
        .wait()
        .unwrap();
    // Out of order on purpose: recovery sorts by seq.
    for s in (1..=50).rev() {
        j.submit(vec![put(1, s, 100 + s as usize)]).wait().unwrap();
    }
    j.submit((1..=20).map(|s| put(2, s, 10)).collect())
        .wait()
        .unwrap();
    j.submit((1..=5).map(|s| put(3, s, 10)).collect())
        .wait()
        .unwrap();
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![2, 4, 6, 999],
    }])
    .wait()
    .unwrap();
    j.submit(vec![Op::Purge {
        queue_id: 2,
        through_seq: 10,
    }])
    .wait()
    .unwrap();
    j.submit(vec![Op::DeleteQueue { queue_id: 3 }])
        .wait()
        .unwrap();
    j.submit(vec![def(1, "b")]).wait().unwrap();
    // Put to queue 4 then delete it in the same record, then define it again.
    j.submit(vec![
        put(4, 1, 5),
        Op::DeleteQueue { queue_id: 4 },
        def(4, "c"),
    ])
    .wait()
    .unwrap();
    // Same (queue, seq) twice: the later one wins.
    j.submit(vec![put(1, 7, 3)]).wait().unwrap();
    let empty = j.submit(vec![]);
    empty.wait().unwrap();
    assert!(matches!(
        j.read_body(1, 2),
        Err(JournalError::NotFound {
            queue_id: 1,
            seq: 2
        })
    ));
    j.shutdown();
    assert!(matches!(
        j.submit(vec![put(1, 100, 1)]).wait(),
        Err(JournalError::Closed)
    ));
    drop(j);

    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(
        r.queues,
        vec![
            (1, Bytes::from("def1b")),
            (2, Bytes::from("def2a")),
            (4, Bytes::from("def4c"))
        ]
    );
    let want1: Vec<u64> = (1..=50).filter(|s| ![2, 4, 6].contains(s)).collect();
    assert_eq!(seqs(&r, 1), want1);
    assert_eq!(seqs(&r, 2), (11..=20).collect::<Vec<_>>());
    assert!(seqs(&r, 3).is_empty() && seqs(&r, 4).is_empty());
    check_bodies(&j, &r, 1, |s| if s == 7 { 3 } else { 100 + s as usize });
    check_bodies(&j, &r, 2, |_| 10);
    assert_eq!(r.max_queue_id, 4);
    assert_eq!(
        r.max_seq.get(&1),
        Some(&999),
        "removes count towards max_seq"
    );
    assert_eq!(r.max_seq.get(&2), Some(&20));
    assert!(r.truncated.is_none());
    assert_eq!(r.segments, 1);
    assert!(r.records >= 10);
    assert!(matches!(
        j.read_body(3, 1),
        Err(JournalError::NotFound { .. })
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn commit_is_a_future() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let commits: Vec<_> = (1..=10).map(|s| j.submit(vec![put(9, s, 64)])).collect();
    for c in commits {
        c.await.unwrap();
    }
    assert_eq!(j.read_body(9, 10).unwrap(), body(9, 10, 64));
    let st = j.stats();
    assert_eq!(st.records_written, 10);
    assert!(st.syncs >= 1 && st.syncs <= 11);
}

#[test]
fn empty_directory_is_created_and_bad_options_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("a/b");
    let (j, r) = Journal::open(&sub, JournalOptions::default()).unwrap();
    assert_eq!(r.segments, 0);
    assert_eq!(j.stats().segments, 1);
    drop(j);
    let d = JournalOptions::default;
    for bad in [
        JournalOptions {
            segment_size: 10,
            ..d()
        },
        JournalOptions {
            compact_grace: std::time::Duration::from_secs(3601),
            ..d()
        },
        JournalOptions {
            writeback_bytes: 4095,
            ..d()
        },
    ] {
        assert!(matches!(
            Journal::open(&sub, bad),
            Err(JournalError::InvalidOptions(_))
        ));
    }
}
