//! Disk use follows live data.

use super::common::*;
use std::sync::atomic::{AtomicBool, Ordering};

const SEG: u64 = 64 << 10;

fn len_of(q: u64, s: u64) -> usize {
    if q == 2 {
        700
    } else {
        300 + (s % 400) as usize
    }
}

#[test]
fn churn_keeps_disk_bounded_and_live_messages_readable() {
    let st = churn(small_opts(SEG));
    // Few live ops in a small index: compaction found them through the index and read
    // nothing but them (a walk reads every segment it compacts: see the next test).
    assert_eq!(
        st.compaction_read_bytes, st.compacted_bytes,
        "compaction read more than the live ops it copied: {st:?}"
    );
}

#[test]
fn churn_keeps_disk_bounded_when_compaction_walks_segments() {
    let st = churn(JournalOptions {
        compact_from_index: false,
        ..small_opts(SEG)
    });
    assert!(
        st.compaction_read_bytes > st.bytes_written / 2,
        "every compacted segment was walked: {st:?}"
    );
}

/// Queue 2 keeps ten long-lived messages, queue 1 churns 4,000 with a backlog of 20; disk use
/// stays bounded, and everything live survives a reopen. Returns the stats before reopening.
fn churn(opts: JournalOptions) -> JournalStats {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    define_two_queues(&j);
    // Queue 2: ten long-lived messages in the oldest segment, never removed. They pin the
    // oldest segment, so compaction has to move them forward for dead segments to go.
    j.submit((1..=10).map(|s| put(2, s, len_of(2, s))).collect())
        .wait()
        .unwrap();

    // A reader checks the long-lived bodies all along, while compaction moves them.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let j = j.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for s in 1..=10 {
                    assert_eq!(j.read_body(2, s).unwrap(), body(2, s, len_of(2, s)));
                    reads += 1;
                }
            }
            reads
        })
    };

    // Queue 1: 4000 messages (~2 MB, ~30 segments' worth), keeping a backlog of 20.
    let mut max_segments = 0;
    let mut max_disk = 0;
    let mut inflight = std::collections::VecDeque::new();
    for s in 1..=4000u64 {
        let mut ops = vec![put(1, s, len_of(1, s))];
        if s > 20 {
            ops.push(Op::Remove {
                queue_id: 1,
                seqs: vec![s - 20],
            });
        }
        inflight.push_back(j.submit(ops));
        if inflight.len() > 8 {
            inflight.pop_front().unwrap().wait().unwrap();
        }
        if s % 50 == 0 {
            let st = j.stats();
            max_segments = max_segments.max(st.segments);
            max_disk = max_disk.max(st.disk_bytes);
        }
    }
    for c in inflight {
        c.wait().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);

    let st = j.stats();
    eprintln!("{st:?} max_segments={max_segments}");
    assert!(
        st.bytes_written > 30 * SEG,
        "enough was written to need compaction: {st:?}"
    );
    assert!(st.segments_deleted >= 20, "{st:?}");
    assert!(
        st.compacted_bytes > 0,
        "the pinned messages were copied forward: {st:?}"
    );
    assert!(
        max_segments <= 5,
        "segments stay bounded: max {max_segments}, {st:?}"
    );
    assert!(max_disk <= 5 * SEG);
    drop(j);
    let written = st;

    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(
        r.queues,
        vec![(1, Bytes::from("one")), (2, Bytes::from("two"))]
    );
    assert_eq!(seqs(&r, 1), (3981..=4000).collect::<Vec<_>>());
    assert_eq!(seqs(&r, 2), (1..=10).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |s| len_of(1, s));
    check_bodies(&j, &r, 2, |s| len_of(2, s));
    assert!(r.segments <= 5);
    // Segments holding the early records are gone, but the watermark is not.
    assert_eq!(r.max_seq.get(&1), Some(&4000));
    assert_eq!(r.max_queue_id, 2);
    written
}

/// Polls `cond` every 10 ms for up to 30 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if cond() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

/// Fills segment 1 with queue 1's messages `1..=n` (1000 B each) and rolls to segment 2 with
/// one more message; returns how many went into segment 1.
fn fill_first_segment(j: &Journal) -> u64 {
    let mut s = 0;
    while j.stats().segments_created < 2 {
        s += 1;
        j.submit(vec![put(1, s, 1000)]).wait().unwrap();
    }
    s - 1
}

#[test]
fn a_just_sealed_segment_is_spared_for_its_grace_then_compacted_while_idle() {
    let dir = tempfile::tempdir().unwrap();
    let grace = std::time::Duration::from_secs(3);
    let opts = JournalOptions {
        compact_grace: grace,
        ..small_opts(SEG)
    };
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    define_two_queues(&j);
    let sealed_at = std::time::Instant::now();
    let n = fill_first_segment(&j);
    // Everything of segment 1 but message 1 goes: it is mostly dead, and would be compacted
    // at once without the grace.
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: (2..=n).collect(),
    }])
    .wait()
    .unwrap();
    let st = j.stats();
    if sealed_at.elapsed() < grace {
        assert_eq!(st.compacted_bytes, 0, "compacted within its grace: {st:?}");
        assert_eq!(st.segments_deleted, 0, "{st:?}");
    }
    // Nothing more is submitted: the idle writer compacts once the grace is over.
    wait_for("the sealed segment to be compacted", || {
        j.stats().segments_deleted >= 1
    });
    let st = j.stats();
    assert!(sealed_at.elapsed() >= grace, "{st:?}");
    assert!(
        st.compacted_bytes > 0,
        "message 1 was copied forward: {st:?}"
    );
    drop(j);
    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(seqs(&r, 1), vec![1, n + 1]);
    check_bodies(&j, &r, 1, |_| 1000);
}

#[test]
fn messages_consumed_within_the_grace_are_never_copied() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        compact_grace: std::time::Duration::from_secs(3),
        ..small_opts(SEG)
    };
    let (j, _) = Journal::open(dir.path(), opts).unwrap();
    define_two_queues(&j);
    // A steady flow: each message is consumed five messages later, so the segment that is
    // sealed holds the last few messages in flight (without the grace, compaction would copy
    // them forward at once).
    let mut s = 0;
    while j.stats().segments_created < 2 {
        s += 1;
        let mut ops = vec![put(1, s, 1000)];
        if s > 5 {
            ops.push(Op::Remove {
                queue_id: 1,
                seqs: vec![s - 5],
            });
        }
        j.submit(ops).wait().unwrap();
    }
    // The consumer catches up right after the roll.
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: (s - 4..=s).collect(),
    }])
    .wait()
    .unwrap();
    // Segment 1 then holds only the queue definitions: found through the index, copied,
    // and the segment dropped, after the grace.
    wait_for("segment 1 to go", || j.stats().segments_deleted >= 1);
    let st = j.stats();
    assert!(
        st.compacted_bytes < 200,
        "only the two queue definitions were copied: {st:?}"
    );
    assert!(st.compaction_read_bytes < 200, "{st:?}");
}

#[test]
fn deleted_queue_segments_go_and_ids_are_not_forgotten() {
    let io = FaultyIo::new(7);
    let opts = small_opts(SEG);
    let (j, _) =
        Journal::open_with_io("/fake".as_ref(), opts.clone(), Arc::new(io.clone())).unwrap();
    j.submit(vec![Op::DefineQueue {
        queue_id: 77,
        def: "x".into(),
    }])
    .wait()
    .unwrap();
    for chunk in (1..=600u64).collect::<Vec<_>>().chunks(20) {
        j.submit(chunk.iter().map(|&s| put(77, s, 1000)).collect())
            .wait()
            .unwrap();
    }
    j.submit(vec![Op::DeleteQueue { queue_id: 77 }])
        .wait()
        .unwrap();
    j.submit(vec![Op::DefineQueue {
        queue_id: 5,
        def: "y".into(),
    }])
    .wait()
    .unwrap();
    j.submit(vec![put(5, 1, 10)]).wait().unwrap();
    // Compaction runs when the writer is idle, and dropped segments are unlinked by a helper
    // thread after that; wait for both to settle (bounded).
    for _ in 0..200 {
        let st = j.stats();
        if st.segments <= 2 && io.segments().len() == st.segments {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = j.stats();
    assert!(st.segments <= 2, "{st:?}");
    assert_eq!(io.segments().len(), st.segments);
    drop(j);
    let (_, r) = Journal::open_with_io("/fake".as_ref(), opts, Arc::new(io.restart())).unwrap();
    assert_eq!(r.queues, vec![(5, Bytes::from("y"))]);
    assert_eq!(seqs(&r, 5), vec![1]);
    assert!(!r.messages.contains_key(&77));
    assert_eq!(r.max_queue_id, 77, "queue id 77 must never be reused");
}

/// Compaction walks a segment's records in bounded steps and copies what the index says is
/// live: records larger than a step's read, records of which only some ops are live, and a
/// budget so small that every step stops after one record.
#[test]
fn compaction_walks_large_and_partly_live_records_in_small_steps() {
    let dir = tempfile::tempdir().unwrap();
    let opts = JournalOptions {
        max_batch_bytes: 1,
        ..small_opts(1 << 20)
    };
    let len = |s: u64| match s % 3 {
        1 => 100,
        2 => 300_000,
        _ => 50,
    };
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    define_two_queues(&j);
    // Twelve records of three messages each (~300 KB a record: four segments).
    for k in 0..12u64 {
        j.submit((1..=3).map(|i| put(1, 3 * k + i, len(3 * k + i))).collect())
            .wait()
            .unwrap();
    }
    // Some messages of those records die, the others stay.
    let dead: Vec<u64> = (0..12u64)
        .flat_map(|k| {
            let mut d = Vec::new();
            if k % 2 == 0 {
                d.push(3 * k + 1);
            }
            if k % 3 == 0 {
                d.push(3 * k + 2);
            }
            d
        })
        .collect();
    j.submit(vec![Op::Remove {
        queue_id: 1,
        seqs: dead.clone(),
    }])
    .wait()
    .unwrap();
    let live: Vec<u64> = (1..=36).filter(|s| !dead.contains(s)).collect();
    // Churn on queue 2 until the segments of those records have been compacted away.
    let first = j.stats();
    for s in 1..=600u64 {
        let mut ops = vec![put(2, s, 20_000)];
        if s > 1 {
            ops.push(Op::Remove {
                queue_id: 2,
                seqs: vec![s - 1],
            });
        }
        j.submit(ops).wait().unwrap();
        for &q1 in live.iter().filter(|&&q1| q1 % 7 == s % 7) {
            assert_eq!(j.read_body(1, q1).unwrap(), body(1, q1, len(q1)));
        }
    }
    let st = j.stats();
    eprintln!("{st:?}");
    let live_bytes: u64 = live.iter().map(|&s| len(s) as u64).sum();
    assert!(
        st.compacted_bytes - first.compacted_bytes >= live_bytes,
        "the surviving messages were copied forward: {st:?}"
    );
    assert!(st.segments <= 6, "{st:?}");
    for &s in &live {
        assert_eq!(j.read_body(1, s).unwrap(), body(1, s, len(s)));
    }
    drop(j);

    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(seqs(&r, 1), live);
    assert_eq!(seqs(&r, 2), vec![600]);
    check_bodies(&j, &r, 1, len);
    assert!(
        !dir.path()
            .join(mq_broker::journal::segment_file_name(2))
            .exists(),
        "the segments of the first records are gone"
    );
}

/// Queues 1 ("one") and 2 ("two").
fn define_two_queues(j: &Journal) {
    j.submit(vec![
        Op::DefineQueue {
            queue_id: 1,
            def: "one".into(),
        },
        Op::DefineQueue {
            queue_id: 2,
            def: "two".into(),
        },
    ])
    .wait()
    .unwrap();
}

#[test]
fn a_segment_being_drained_is_left_to_its_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let grace = std::time::Duration::from_secs(2);
    let opts = JournalOptions {
        compact_grace: grace,
        ..small_opts(SEG)
    };
    let (j, _) = Journal::open(dir.path(), opts).unwrap();
    define_two_queues(&j);
    // A backlog of four segments' worth.
    let mut n = 0;
    while j.stats().segments_created < 5 {
        n += 1;
        j.submit(vec![put(1, n, 1000)]).wait().unwrap();
    }
    let filled = std::time::Instant::now();
    // Only time passes here: the segments' grace must be over before the drain starts.
    while filled.elapsed() < grace + std::time::Duration::from_millis(200) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A consumer drains it, ~60 messages (a segment) every ~100 ms: each segment is empty
    // well within the grace at that pace, so compaction leaves it alone (without the drain
    // probe it copied the second half of each segment forward once half was consumed).
    for chunk in (1..=n).collect::<Vec<_>>().chunks(6) {
        j.submit(vec![Op::Remove {
            queue_id: 1,
            seqs: chunk.to_vec(),
        }])
        .wait()
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    wait_for("the drained segments to go", || {
        j.stats().segments_deleted >= 4
    });
    let st = j.stats();
    assert!(
        st.compacted_bytes < 200,
        "only the queue definitions were copied: {st:?}"
    );
}
