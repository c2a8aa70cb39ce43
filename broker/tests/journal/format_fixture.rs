//! A journal written by each format version N is kept in `tests/fixtures/vN/` (1 to 3);
//! every later version must still read them. When the format version changes, write the new
//! one into a new directory (change `CURRENT`): `cargo test --test journal write_fixture --
//! --ignored`.

use super::common::*;
use std::path::{Path, PathBuf};

/// The format version this code writes.
const CURRENT: &str = "v3";

fn fixture_dir(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(version)
}

fn opts() -> JournalOptions {
    JournalOptions {
        segment_size: 4096,
        compact_live_ratio: 0.0,
        max_batch_bytes: 1 << 20,
        reserve_bytes: Some(0),
        ..JournalOptions::default()
    }
}

#[test]
#[ignore = "writes the fixture; run by hand when introducing a format version"]
fn write_fixture() {
    let dir = fixture_dir(CURRENT);
    let _ = std::fs::remove_dir_all(&dir);
    let (j, _) = Journal::open(&dir, opts()).unwrap();
    j.submit(vec![
        Op::DefineQueue {
            queue_id: 1,
            def: "queue one".into(),
        },
        Op::DefineQueue {
            queue_id: 2,
            def: "queue two".into(),
        },
    ])
    .wait()
    .unwrap();
    j.submit((1..=3).map(|s| put(1, s, 100)).collect())
        .wait()
        .unwrap();
    j.submit(vec![put(2, 1, 10)]).wait().unwrap();
    // Large enough to roll into segments 2 and 3.
    j.submit(vec![put(1, 4, 3900)]).wait().unwrap();
    j.submit(vec![put(1, 5, 3900)]).wait().unwrap();
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![2],
    }])
    .wait()
    .unwrap();
    j.submit(vec![Op::DeleteQueue { queue_id: 2 }])
        .wait()
        .unwrap();
    j.submit(vec![
        Op::DefineQueue {
            queue_id: 3,
            def: "queue three".into(),
        },
        put(3, 7, 50),
    ])
    .wait()
    .unwrap();
    j.submit(vec![Op::Purge {
        queue_id: 1,
        through_seq: 1,
    }])
    .wait()
    .unwrap();
    // Version 3: a Rekey (then the Remove it makes a no-op, as the broker writes them).
    j.submit(vec![
        Op::Rekey {
            queue_id: 1,
            seq: 3,
            to_queue_id: 3,
            to_seq: 8,
        },
        Op::Remove {
            queue_id: 1,
            seqs: vec![3],
        },
    ])
    .wait()
    .unwrap();
    j.shutdown();
}

#[test]
fn format_fixture_v1_still_reads() {
    check_fixture("v1");
}

#[test]
fn format_fixture_v2_still_reads() {
    check_fixture("v2");
}

#[test]
fn format_fixture_v3_still_reads() {
    check_fixture("v3");
}

fn check_fixture(version: &str) {
    let tmp = tempfile::tempdir().unwrap();
    // Copy: opening may compact, and the fixture must stay as written.
    let mut n = 0;
    for e in std::fs::read_dir(fixture_dir(version)).expect("fixture present") {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
        n += 1;
    }
    assert!(n >= 3, "the fixture spans several segments");
    let (j, r) = Journal::open(tmp.path(), opts()).unwrap();
    assert!(r.truncated.is_none());
    assert_eq!(
        r.queues,
        vec![
            (1, Bytes::from("queue one")),
            (3, Bytes::from("queue three"))
        ]
    );
    assert!(seqs(&r, 2).is_empty());
    check_bodies(&j, &r, 1, |s| if s >= 4 { 3900 } else { 100 });
    assert_eq!(r.max_queue_id, 3);
    assert_eq!(r.max_seq.get(&1), Some(&5));
    if version < "v3" {
        assert_eq!(seqs(&r, 1), vec![3, 4, 5]);
        assert_eq!(seqs(&r, 3), vec![7]);
        check_bodies(&j, &r, 3, |_| 50);
        return;
    }
    // (1, 3) moved to (3, 8) by a Rekey: its header and body as put.
    assert_eq!(seqs(&r, 1), vec![4, 5]);
    assert_eq!(seqs(&r, 3), vec![7, 8]);
    let moved = &r.messages[&3][1];
    assert_eq!(moved.header, header(1, 3));
    assert_eq!(j.read_body(3, 8).unwrap(), body(1, 3, 100));
    assert_eq!(j.read_body(3, 7).unwrap(), body(3, 7, 50));
    assert_eq!(r.max_seq.get(&3), Some(&8));
}
