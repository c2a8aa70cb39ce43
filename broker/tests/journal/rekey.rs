//! `Op::Rekey` (format version 3): a live message moves to another `(queue, seq)` without its
//! header or body being written again; reopen, compaction (and a crash between its copy and
//! unlink) keep it at its new key and its body readable; a journal of an older format takes no
//! Rekey until its next segment.

use super::common::*;
use mq_broker::journal::{FileIo, Io, SegmentFile};
use std::path::Path;

fn rekey(queue_id: u64, seq: u64, to_queue_id: u64, to_seq: u64) -> Op {
    Op::Rekey {
        queue_id,
        seq,
        to_queue_id,
        to_seq,
    }
}

fn define(queue_id: u64) -> Op {
    Op::DefineQueue {
        queue_id,
        def: Bytes::from(format!("q{queue_id}")),
    }
}

/// The recovered message `(queue_id, seq)` has the header and body of `(from_q, from_s)`.
fn check_moved(
    j: &Journal,
    r: &Recovery,
    (queue_id, seq): (u64, u64),
    from: (u64, u64),
    len: usize,
) {
    let m = r.messages[&queue_id]
        .iter()
        .find(|m| m.seq == seq)
        .unwrap_or_else(|| panic!("{queue_id}:{seq} not recovered"));
    assert_eq!(m.header, header(from.0, from.1));
    assert_eq!(m.body_len as usize, len);
    assert_eq!(
        j.read_body(queue_id, seq).unwrap(),
        body(from.0, from.1, len)
    );
}

#[test]
fn rekey_moves_a_message_without_writing_it_again_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert!(j.can_rekey());
    j.submit(vec![define(1), define(2)]).wait().unwrap();
    j.submit((1..=3).map(|s| put(1, s, 5000)).collect())
        .wait()
        .unwrap();
    let before = j.stats().bytes_written;
    // As the broker writes a journal copy: the Rekey, then the Remove of the same message
    // (which finds nothing left); a Rekey of a message that is not there is ignored.
    j.submit(vec![
        rekey(1, 2, 2, 10),
        rekey(1, 99, 2, 11),
        Op::Remove {
            queue_id: 1,
            seqs: vec![2],
        },
    ])
    .wait()
    .unwrap();
    assert!(
        j.stats().bytes_written - before < 200,
        "{} bytes written for a rekey",
        j.stats().bytes_written - before
    );
    assert_eq!(j.read_body(2, 10).unwrap(), body(1, 2, 5000));
    assert!(j.read_body(1, 2).is_err());
    assert!(j.read_body(2, 11).is_err());
    j.shutdown();

    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, 3]);
    assert_eq!(seqs(&r, 2), vec![10]);
    check_moved(&j, &r, (2, 10), (1, 2), 5000);
    // Both keys of a Rekey count as seen, even the one of a message that was not there.
    assert_eq!(r.max_seq.get(&2), Some(&11));
    // Moved again, then removed: gone after reopen.
    j.submit(vec![rekey(2, 10, 1, 20)]).wait().unwrap();
    assert_eq!(j.read_body(1, 20).unwrap(), body(1, 2, 5000));
    j.shutdown();
    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, 3, 20]);
    assert!(seqs(&r, 2).is_empty());
    check_moved(&j, &r, (1, 20), (1, 2), 5000);
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: vec![20],
    }])
    .wait()
    .unwrap();
    j.shutdown();
    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, 3]);
    // Deleting the queue a message left does not take it along.
    j.submit(vec![rekey(1, 3, 2, 12), Op::DeleteQueue { queue_id: 1 }])
        .wait()
        .unwrap();
    j.shutdown();
    let (j, r) = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert!(seqs(&r, 1).is_empty());
    assert_eq!(seqs(&r, 2), vec![12]);
    check_moved(&j, &r, (2, 12), (1, 3), 5000);
}

/// Real files, except that segments compaction drops stay on disk: as if the process died
/// between each copy and its unlink.
struct KeepSegments(FileIo);

impl Io for KeepSegments {
    fn init(&self, dir: &Path) -> std::io::Result<()> {
        self.0.init(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<u64>> {
        self.0.list(dir)
    }
    fn open(&self, dir: &Path, segment: u64) -> std::io::Result<Arc<dyn SegmentFile>> {
        self.0.open(dir, segment)
    }
    fn create(&self, dir: &Path, segment: u64) -> std::io::Result<Arc<dyn SegmentFile>> {
        self.0.create(dir, segment)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.0.sync_dir(dir)
    }
    fn remove(&self, _dir: &Path, _segment: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// Segment 1: two Puts of queue 1, one moved to queue 2 there; segment 2: a Put, and the
/// other one moved to queue 2 (twice). No compaction yet.
fn write_rekeys(dir: &Path) {
    let keep = JournalOptions {
        compact_live_ratio: 0.0,
        ..small_opts(8192)
    };
    let (j, _) = Journal::open(dir, keep).unwrap();
    j.submit(vec![define(1), define(2), define(5)])
        .wait()
        .unwrap();
    j.submit(vec![put(1, 1, 1000), put(1, 2, 1000)])
        .wait()
        .unwrap();
    j.submit(vec![
        rekey(1, 1, 2, 7),
        Op::Remove {
            queue_id: 1,
            seqs: vec![1],
        },
    ])
    .wait()
    .unwrap();
    j.submit(vec![put(1, 3, 7000)]).wait().unwrap();
    assert!(dir.join(mq_broker::journal::segment_file_name(2)).exists());
    j.submit(vec![rekey(1, 2, 2, 8), rekey(2, 8, 2, 9)])
        .wait()
        .unwrap();
    j.shutdown();
}

/// Put/remove churn in queue 5 until compaction has dropped `segments` segments; the moved
/// bodies stay readable all along.
fn churn_until_dropped(j: &Journal, segments: u64) {
    let mut seq = 100;
    for _ in 0..1000 {
        if j.stats().segments_deleted >= segments {
            break;
        }
        seq += 1;
        j.submit(vec![put(5, seq, 1500)]).wait().unwrap();
        j.submit(vec![Op::Remove {
            queue_id: 5,
            seqs: vec![seq],
        }])
        .wait()
        .unwrap();
        assert_eq!(j.read_body(2, 7).unwrap(), body(1, 1, 1000));
        assert_eq!(j.read_body(2, 9).unwrap(), body(1, 2, 1000));
    }
    assert!(
        j.stats().segments_deleted >= segments,
        "compaction did not drop {segments} segments: {:?}",
        j.stats()
    );
}

fn check_rekeyed(dir: &Path) {
    let (j, r) = Journal::open(dir, small_opts(8192)).unwrap();
    assert_eq!(seqs(&r, 1), vec![3]);
    assert_eq!(seqs(&r, 2), vec![7, 9]);
    assert!(seqs(&r, 5).is_empty());
    check_moved(&j, &r, (2, 7), (1, 1), 1000);
    check_moved(&j, &r, (2, 9), (1, 2), 1000);
}

/// The segments of rekeyed Puts and of the Rekeys are compacted: the Puts are copied under
/// their new keys, the bodies stay readable all along, and reopening finds the messages at
/// their new keys only.
#[test]
fn compaction_copies_a_rekeyed_message_under_its_new_key() {
    let dir = tempfile::tempdir().unwrap();
    write_rekeys(dir.path());
    let (j, _) = Journal::open(dir.path(), small_opts(8192)).unwrap();
    churn_until_dropped(&j, 2);
    // A dropped segment is counted when the writer hands it to the unlink thread, which
    // unlinks it soon after (`unlink.rs`): wait for that, bounded.
    for n in [1, 2] {
        let f = dir.path().join(mq_broker::journal::segment_file_name(n));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while f.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!f.exists(), "segment {n} is still there");
    }
    j.shutdown();
    check_rekeyed(dir.path());
    check_rekeyed(dir.path());
}

/// As above, with every dropped segment left on disk (a crash between a compaction's copy and
/// its unlink): the Puts replay under their old keys, the Rekeys move them, and the copies,
/// later in the file, win.
#[test]
fn a_crash_between_copy_and_unlink_keeps_rekeyed_messages_once() {
    let dir = tempfile::tempdir().unwrap();
    write_rekeys(dir.path());
    let (j, _) =
        Journal::open_with_io(dir.path(), small_opts(8192), Arc::new(KeepSegments(FileIo)))
            .unwrap();
    churn_until_dropped(&j, 2);
    j.shutdown();
    for n in [1, 2] {
        assert!(dir
            .path()
            .join(mq_broker::journal::segment_file_name(n))
            .exists());
    }
    check_rekeyed(dir.path());
}

/// A journal written by format version 2 reads; its last segment (version 2) takes no Rekey,
/// the next segment (version 3) does, and the mix reads back.
#[test]
fn a_version_2_journal_takes_rekeys_from_its_next_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2");
    for e in std::fs::read_dir(fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let opts = JournalOptions {
        segment_size: 4096,
        compact_live_ratio: 0.0,
        reserve_bytes: Some(0),
        ..JournalOptions::default()
    };
    let (j, r) = Journal::open(tmp.path(), opts.clone()).unwrap();
    assert_eq!(seqs(&r, 3), vec![7]);
    assert!(!j.can_rekey());
    let refused = j.submit(vec![rekey(1, 3, 3, 8)]).wait();
    assert!(refused.is_err(), "{refused:?}");
    assert!(!j.is_poisoned());
    // A record that does not fit rolls into a new segment.
    j.submit(vec![put(1, 6, 3900)]).wait().unwrap();
    assert!(j.can_rekey());
    j.submit(vec![rekey(1, 3, 3, 8)]).wait().unwrap();
    j.shutdown();
    let (j, r) = Journal::open(tmp.path(), opts).unwrap();
    assert_eq!(seqs(&r, 1), vec![4, 5, 6]);
    assert_eq!(seqs(&r, 3), vec![7, 8]);
    check_moved(&j, &r, (3, 8), (1, 3), 100);
    assert!(j.can_rekey());
}
