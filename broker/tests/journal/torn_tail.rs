//! Torn and damaged tails of the last segment, and damage in earlier segments.

use super::common::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

fn seg_path(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    dir.join(mq_broker::journal::segment_file_name(n))
}

/// Writes puts 1..=n of 200 bytes each to queue 1 and returns the end of data.
fn write_some(dir: &std::path::Path, n: u64) -> u64 {
    let (j, _) = Journal::open(dir, small_opts(1 << 20)).unwrap();
    for s in 1..=n {
        j.submit(vec![put(1, s, 200)]).wait().unwrap();
    }
    drop(j);
    let (_, r) = Journal::open(dir, small_opts(1 << 20)).unwrap();
    assert_eq!(r.segments, 1);
    r.bytes
}

fn append_and_check(dir: &std::path::Path, want_before: Vec<u64>) {
    let (j, _) = Journal::open(dir, small_opts(1 << 20)).unwrap();
    j.submit(vec![put(1, 100, 300), put(1, 101, 301)])
        .wait()
        .unwrap();
    drop(j);
    let (j, r) = Journal::open(dir, small_opts(1 << 20)).unwrap();
    assert!(
        r.truncated.is_none(),
        "the tail was zeroed: {:?}",
        r.truncated
    );
    let mut want = want_before;
    want.extend([100, 101]);
    assert_eq!(seqs(&r, 1), want);
    check_bodies(&j, &r, 1, |s| match s {
        100 => 300,
        101 => 301,
        _ => 200,
    });
}

#[test]
fn cut_mid_record_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let end = write_some(dir.path(), 5);
    let rec = 8 + 25 + header(1, 5).len() as u64 + 200;
    // Cut the file inside the last record (this also drops the preallocated tail).
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    f.set_len(end - 10).unwrap();
    drop(f);
    let (j, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(r.truncated, Some((1, end - rec)));
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4]);
    check_bodies(&j, &r, 1, |_| 200);
    drop(j);
    append_and_check(dir.path(), vec![1, 2, 3, 4]);
}

#[test]
fn garbage_after_last_record_is_truncated_and_zeroed() {
    let dir = tempfile::tempdir().unwrap();
    let end = write_some(dir.path(), 5);
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    // A plausible-looking frame (length 16, wrong CRC), then more garbage further on.
    f.write_all_at(&[16, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8], end)
        .unwrap();
    f.write_all_at(&[0xAB; 100], end + 5000).unwrap();
    drop(f);
    let (_, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(r.truncated, Some((1, end)));
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4, 5]);
    append_and_check(dir.path(), vec![1, 2, 3, 4, 5]);
}

#[test]
fn zero_length_then_stray_bytes_is_truncated() {
    // A torn write can reach the disk out of order: zeros where the record starts, its
    // later bytes present. That is a bad tail, not a clean end.
    let dir = tempfile::tempdir().unwrap();
    let end = write_some(dir.path(), 3);
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    f.write_all_at(&[0x55; 64], end + 4096).unwrap();
    drop(f);
    let (_, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(r.truncated, Some((1, end)));
    append_and_check(dir.path(), vec![1, 2, 3]);
}

#[test]
fn flipped_byte_in_last_record_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let end = write_some(dir.path(), 5);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, end - 3).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], end - 3).unwrap();
    drop(f);
    let (_, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, 2, 3, 4]);
    assert!(r.truncated.is_some());
    append_and_check(dir.path(), vec![1, 2, 3, 4]);
}

#[test]
fn damage_in_an_earlier_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let opts = small_opts(16 << 10);
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    // All live, so nothing is compacted away.
    for s in 1..=100 {
        j.submit(vec![put(1, s, 500)]).wait().unwrap();
    }
    assert!(j.stats().segments >= 3);
    drop(j);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    f.write_all_at(&[0xFF; 4], 32 + 8 + 30).unwrap();
    drop(f);
    match Journal::open(dir.path(), opts.clone()) {
        Err(JournalError::Corrupt { path, offset, .. }) => {
            assert_eq!(path, seg_path(dir.path(), 1));
            assert_eq!(offset, 32);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A damaged header in an earlier segment is refused too.
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 2))
        .unwrap();
    f.write_all_at(b"XX", 0).unwrap();
    drop(f);
    let err = Journal::open(dir.path(), opts).unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
}

#[test]
fn half_created_last_segment_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path(), 2);
    // A crash right after creating segment 2, before its header was written.
    let f = std::fs::File::create(seg_path(dir.path(), 2)).unwrap();
    f.set_len(4096).unwrap();
    drop(f);
    let (j, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(r.truncated, Some((2, 0)));
    assert_eq!(seqs(&r, 1), vec![1, 2]);
    j.submit(vec![put(1, 3, 10)]).wait().unwrap();
    drop(j);
    let (_, r) = Journal::open(dir.path(), small_opts(1 << 20)).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, 2, 3]);
}
