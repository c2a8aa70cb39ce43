//! The short mode of `mqtorture` that `cargo test` runs: a few fault cycles on one broker, and
//! proof that the checker fails a run against a broker that loses its journal.

use std::time::Duration;

use mq_torture::{Options, Sabotage};

/// `MQTORTURE_SEED` replays a seed; otherwise a random one, printed.
fn seed() -> u64 {
    let seed = std::env::var("MQTORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("mqtorture seed {seed} (replay with MQTORTURE_SEED={seed})");
    seed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_fault_cycles_on_one_broker_keep_every_promise() {
    let mut opts = Options::new(seed());
    opts.cycles = 3;
    opts.duration_per_cycle = Duration::from_secs(3);
    let r = mq_torture::run(&opts).await.expect("the run");
    println!("{}", r.report);
    assert!(
        r.passed(),
        "seed {}: {}\nincidents: {:?}\nfailure file: {:?}",
        r.seed,
        r.report,
        r.incidents,
        r.failure_file
    );
    assert_eq!(r.faults.len(), 3);
    assert_eq!(r.report.faults.values().sum::<u64>(), 3);
    // The workload did run: every kind of send was acknowledged and checked.
    assert!(r.report.sends_ok > 0 && r.report.messages_checked > 0);
    for d in ["express", "recoverable", "transactional"] {
        assert!(
            r.report.sends_by_durability.get(d).is_some_and(|n| *n > 0),
            "no {d} sends"
        );
    }
    assert!(r.report.tx_receives_committed > 0 && r.report.deliveries > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_loses_its_journal_fails_the_run() {
    let out = tempfile::tempdir().unwrap();
    let mut opts = Options::new(seed());
    opts.cycles = 1;
    opts.duration_per_cycle = Duration::from_secs(2);
    opts.out_dir = out.path().to_path_buf();
    opts.sabotage = Some(Sabotage::WipeJournal);
    let r = mq_torture::run(&opts).await.expect("the run");
    println!("{}", r.report);
    assert!(!r.passed());
    assert!(r.report.lost > 0, "{}", r.report);
    let file = r.failure_file.expect("a failure file");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.lines().next().unwrap().contains(r#""seed":"#),
        "{text}"
    );
    assert!(text.contains(r#""class":"lost""#), "{text}");
    // Every line is JSON.
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
}
