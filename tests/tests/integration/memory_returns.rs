//! Memory goes back: after a burst of express messages is drained, `mqd`'s resident memory
//! falls back near where it started instead of staying at its peak (glibc's malloc keeps
//! freed pages until the broker trims; an emptied queue gives back its index).

use std::time::{Duration, Instant};

use mq_client::{ConsumerOptions, Message, SenderOptions};
use mq_tests::{temp_data_dir, MqdProcess};

/// 150,000 × 1000 B: a 150 MB burst (peak RSS about 200 MiB).
const COUNT: u64 = 150_000;
const BODY: usize = 1000;
/// RSS after the drain must fall to at most this much above mqd's RSS before the burst (a
/// release mqd goes from about 8 MiB to 16 MiB; before the fix it stayed at 74 MiB, for good).
const ABOVE_START_MIB: u64 = 40;
/// How long the RSS may take to fall.
const WITHIN: Duration = Duration::from_secs(60);

fn rss_mib(pid: u32) -> u64 {
    mq_tests::rss_kib(pid) / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_falls_after_an_express_burst_is_drained() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let dir = temp_data_dir("mq-memory-");
    let q = r".\private$\burst";
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], q).await;
    let bound = rss_mib(mqd.pid()) + ABOVE_START_MIB;
    let queue = client.queue(q).unwrap();
    let mut sender = queue.sender(SenderOptions::default()).await.unwrap();
    let body = bytes::Bytes::from(vec![b'm'; BODY]);
    for _ in 0..COUNT {
        sender.send(Message::new(body.clone())).await.unwrap();
    }
    assert_eq!(sender.flush().await.unwrap().acknowledged, COUNT);
    sender.close().await.unwrap();
    let peak = rss_mib(mqd.pid());
    assert!(
        peak > bound * 2,
        "the burst should have grown mqd: {peak} MiB"
    );

    let mut consumer = queue
        .consumer(ConsumerOptions {
            prefetch: 1024,
            limit: Some(COUNT),
        })
        .await
        .unwrap();
    for i in 0..COUNT {
        consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("message {i} did not arrive"));
    }
    consumer.close().await.unwrap();
    assert_eq!(client.queue_info(q).await.unwrap().messages, 0);

    let start = Instant::now();
    let mut rss = rss_mib(mqd.pid());
    while rss > bound && start.elapsed() < WITHIN {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss = rss_mib(mqd.pid());
    }
    assert!(
        rss <= bound,
        "mqd still holds {rss} MiB {:?} after draining the burst (peak {peak} MiB); bound {bound} MiB",
        start.elapsed()
    );
}
