//! Damage in the last segment that is not a torn write: valid records written after it
//! follow. Opening refuses (naming file and offset) unless `truncate_damaged` is set, which
//! drops everything from the damage and reports what it dropped. A torn last write, even one
//! whose later records reached the disk, is still cut without asking.

use super::common::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

fn seg_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(mq_broker::journal::segment_file_name(n))
}

/// Size of the record of `put(1, s, 200)`.
fn rec_len(s: u64) -> u64 {
    8 + 25 + header(1, s).len() as u64 + 200
}

/// Writes puts 1..=n (200 bytes, one write each) and returns each record's offset.
fn write_puts(dir: &Path, n: u64) -> Vec<u64> {
    let (j, _) = Journal::open(dir, small_opts(1 << 20)).unwrap();
    for s in 1..=n {
        j.submit(vec![put(1, s, 200)]).wait().unwrap();
    }
    drop(j);
    let mut off = 32;
    (1..=n)
        .map(|s| {
            let o = off;
            off += rec_len(s);
            o
        })
        .collect()
}

fn flip(path: &Path, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

#[test]
fn damage_in_the_middle_of_the_last_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let offs = write_puts(dir.path(), 20);
    // A flipped byte in the body of record 5: its CRC no longer matches.
    flip(&seg_path(dir.path(), 1), offs[4] + 100);
    let err = Journal::open(dir.path(), small_opts(1 << 20)).unwrap_err();
    match &err {
        JournalError::Damaged {
            path,
            offset,
            next_record,
            ..
        } => {
            assert_eq!(path, &seg_path(dir.path(), 1));
            assert_eq!(*offset, offs[4]);
            assert_eq!(*next_record, offs[5]);
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
    let t = err.to_string();
    assert!(
        t.contains("--truncate-damaged-journal")
            && t.contains(&format!("offset {}", offs[4]))
            && t.contains("00000000000000000001.seg")
            && !t.contains('\n'),
        "one line naming file, offset and the way out: {t}"
    );
    // Refusing changed nothing: the same refusal again.
    assert!(matches!(
        Journal::open(dir.path(), small_opts(1 << 20)),
        Err(JournalError::Damaged { .. })
    ));
}

#[test]
fn damaged_length_word_mid_segment_refuses_too() {
    let dir = tempfile::tempdir().unwrap();
    let offs = write_puts(dir.path(), 10);
    // An impossible length in record 3.
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    f.write_all_at(&[0xFF, 0xFF, 0xFF, 0x7F], offs[2]).unwrap();
    drop(f);
    match Journal::open(dir.path(), small_opts(1 << 20)) {
        Err(JournalError::Damaged {
            offset,
            next_record,
            ..
        }) => {
            assert_eq!(offset, offs[2]);
            assert_eq!(next_record, offs[3]);
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
}

#[test]
fn truncate_damaged_drops_from_the_damage_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let offs = write_puts(dir.path(), 20);
    flip(&seg_path(dir.path(), 1), offs[4] + 100);
    let opts = JournalOptions {
        truncate_damaged: true,
        ..small_opts(1 << 20)
    };
    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(r.truncated, Some((1, offs[4])));
    assert_eq!(
        r.dropped_records, 15,
        "records 6..=20 were valid and are dropped"
    );
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4]);
    check_bodies(&j, &r, 1, |_| 200);
    j.submit(vec![put(1, 100, 200)]).wait().unwrap();
    drop(j);
    // Zeroed: the next open is clean, without the flag.
    let (_, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert!(r.truncated.is_none());
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4, 100]);
}

#[test]
fn bad_header_of_a_last_segment_with_records_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let opts = small_opts(8 << 10);
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    for s in 1..=30 {
        j.submit(vec![put(1, s, 500)]).wait().unwrap();
    }
    let segs = j.stats().segments as u64;
    assert!(segs >= 2);
    drop(j);
    let last = seg_path(dir.path(), segs);
    let f = OpenOptions::new().write(true).open(&last).unwrap();
    f.write_all_at(b"XX", 0).unwrap();
    drop(f);
    match Journal::open(dir.path(), opts.clone()) {
        Err(JournalError::Damaged { path, offset, .. }) => {
            assert_eq!(path, last);
            assert_eq!(offset, 0);
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
    assert!(last.exists(), "nothing deleted without the flag");
    let (_, r) = Journal::open(
        dir.path(),
        JournalOptions {
            truncate_damaged: true,
            ..opts
        },
    )
    .unwrap();
    assert!(r.dropped_records > 0);
    assert_eq!(r.truncated, Some((segs, 0)));
    assert!(!last.exists());
}

/// The last write is one group commit of several records. A crash tears its first record
/// while later records of the same write reached the disk: those were never acknowledged,
/// and no record after the damage starts a new write, so this is a torn tail: cut, no flag.
#[test]
fn torn_group_commit_with_later_records_intact_is_truncated() {
    let io = FaultyIo::new(9);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io.clone())).unwrap();
    for s in 1..=3 {
        j.submit(vec![put(1, s, 200)]).wait().unwrap();
    }
    // Hold the writer in a sync so that the next submissions form one batch (one write).
    io.pause_syncs(true);
    let c4 = j.submit(vec![put(1, 4, 200)]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while j.stats().queued_records > 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    let later: Vec<_> = (5..=9).map(|s| j.submit(vec![put(1, s, 200)])).collect();
    io.pause_syncs(false);
    c4.wait().unwrap();
    for c in later {
        c.wait().unwrap();
    }
    drop(j);
    let mut off = 32;
    let offs: Vec<u64> = (1..=9)
        .map(|s| {
            let o = off;
            off += rec_len(s);
            o
        })
        .collect();
    // The last write began at seq 5 (or 6, if the writer took 5 into the batch of 4). Damage
    // seq 7, inside it either way; 8 and 9 stay intact but start no write.
    let io2 = io.restart();
    io2.corrupt(1, offs[6] + 60, b"\xEE\xEE");
    let (_, r) =
        Journal::open_with_io("/fake".as_ref(), small_opts(1 << 20), Arc::new(io2)).unwrap();
    assert_eq!(r.truncated, Some((1, offs[6])));
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(r.dropped_records, 0);
}

#[test]
fn damage_in_a_format_1_segment_with_records_after_refuses() {
    // The fixture was written by format version 1 (no write-start flags): any valid record
    // after the damage counts.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    let dir = tempfile::tempdir().unwrap();
    let mut last = 0;
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        if let Some(n) = e
            .file_name()
            .to_str()
            .and_then(mq_broker::journal::parse_segment_file_name)
        {
            last = last.max(n);
        }
    }
    let opts = JournalOptions {
        segment_size: 4096,
        compact_live_ratio: 0.0,
        ..JournalOptions::default()
    };
    let (_, r) = Journal::open(dir.path(), opts.clone()).unwrap();
    let end = r.bytes;
    drop(r);
    // Find the last segment's records: damage its first record if a second follows.
    let path = seg_path(dir.path(), last);
    let data = std::fs::read(&path).unwrap();
    let first_len = u32::from_le_bytes(data[32..36].try_into().unwrap()) as usize;
    let second = 32 + 8 + first_len;
    let second_len = u32::from_le_bytes(data[second..second + 4].try_into().unwrap());
    if second_len == 0 {
        eprintln!("fixture's last segment has one record; nothing to check (end {end})");
        return;
    }
    flip(&path, 32 + 8 + 3);
    assert!(matches!(
        Journal::open(dir.path(), opts),
        Err(JournalError::Damaged { offset: 32, .. })
    ));
}
