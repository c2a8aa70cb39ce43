//! Large bodies are written from where they are (vectored writes, `gather.rs`): what lands on
//! disk must be byte for byte what a copying writer wrote, through group commits that mix
//! small and large bodies, segment rolls, compaction and a reopen.

use super::common::*;

const SEG: u64 = 4 << 20;

/// Sizes around the gathering threshold (16 KiB), and large ones.
fn len_of(q: u64, s: u64) -> usize {
    const SIZES: [usize; 9] = [
        1,
        100,
        16 * 1024 - 1,
        16 * 1024,
        16 * 1024 + 1,
        100_000,
        300_000,
        1 << 20,
        3,
    ];
    SIZES[((q * 7 + s) % SIZES.len() as u64) as usize]
}

#[test]
fn mixed_large_and_small_bodies_survive_group_commits_compaction_and_reopen() {
    mixed(JournalOptions {
        max_batch_bytes: 2 << 20,
        ..small_opts(SEG)
    });
}

/// The same on real files with every batch over 4 KiB written in pieces of 4 KiB, cut through
/// bodies and between records (`JournalOptions::writeback_bytes`).
#[test]
fn mixed_bodies_written_in_small_pieces() {
    mixed(JournalOptions {
        max_batch_bytes: 2 << 20,
        writeback_bytes: 4096,
        ..small_opts(SEG)
    });
}

fn mixed(opts: JournalOptions) {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), opts.clone()).unwrap();
    j.submit(
        (1..=2)
            .map(|q| Op::DefineQueue {
                queue_id: q,
                def: Bytes::from(format!("q{q}")),
            })
            .collect(),
    )
    .wait()
    .unwrap();
    // Queue 2 keeps everything (pinned in old segments: compaction must move its bodies);
    // queue 1 keeps its last 10. Several submissions in flight, so group commits gather
    // bodies of many records; some records carry several large bodies.
    let mut inflight = std::collections::VecDeque::new();
    for s in 1..=120u64 {
        let mut ops = vec![put(1, s, len_of(1, s))];
        if s % 3 == 0 {
            ops.push(put(1, 1000 + s, len_of(1, 1000 + s)));
            ops.push(Op::Remove {
                queue_id: 1,
                seqs: vec![1000 + s],
            });
        }
        if s % 4 == 0 {
            ops.push(put(2, s, len_of(2, s)));
        }
        if s > 10 {
            ops.push(Op::Remove {
                queue_id: 1,
                seqs: vec![s - 10],
            });
        }
        inflight.push_back(j.submit(ops));
        if inflight.len() > 6 {
            inflight.pop_front().unwrap().wait().unwrap();
        }
        if s % 20 == 0 {
            // Submissions up to s - 6 have been waited for (at most 6 in flight).
            for q in (4..=s - 8).step_by(4) {
                assert_eq!(j.read_body(2, q).unwrap(), body(2, q, len_of(2, q)));
            }
        }
    }
    for c in inflight {
        c.wait().unwrap();
    }
    let st = j.stats();
    assert!(st.segments_created >= 5, "segments rolled: {st:?}");
    assert!(st.compacted_bytes > 0, "compaction moved bodies: {st:?}");
    eprintln!("{} records in {} writes", st.records_written, st.batches);
    drop(j);

    let (j, r) = Journal::open(dir.path(), opts).unwrap();
    assert_eq!(seqs(&r, 1), (111..=120).collect::<Vec<_>>());
    assert_eq!(seqs(&r, 2), (4..=120).step_by(4).collect::<Vec<_>>());
    check_bodies(&j, &r, 1, |s| len_of(1, s));
    check_bodies(&j, &r, 2, |s| len_of(2, s));
}
