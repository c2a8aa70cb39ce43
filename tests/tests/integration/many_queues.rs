//! Many queues on one `mqd` (issue 14 point 5): create N queues, send one recoverable message to
//! each, list them (`mq queue list`), kill -9 and restart; every queue and message is there after
//! the restart. Prints mqd's RSS and the times of the list and the restart.
//!
//! CI runs it with a few hundred queues. The measurement (a release mqd and mq):
//! `MQ_TEST_MQD=target/release/mqd MQ_TEST_MQ=target/release/mq MQ_MANY_QUEUES=100000 cargo test
//! -p mq-tests --test integration many_queues -- --nocapture`

use std::sync::Arc;
use std::time::{Duration, Instant};

use mq_client::{Client, Message, QueueOptions};
use mq_tests::{mq, temp_data_dir, MqdProcess};

/// Calls in flight at once while creating and sending (the journal group-commits them).
const CONCURRENCY: usize = 64;

fn queue_name(i: usize) -> String {
    format!(r".\private$\many-{i}")
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Runs `f(i)` for every i below `n`, `CONCURRENCY` at a time.
async fn for_each<F, Fut>(n: usize, f: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (f, next) = (f.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i).await;
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queues_survive_a_restart_and_list_whole() {
    let n: usize = std::env::var("MQ_MANY_QUEUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = temp_data_dir("mq-many-queues-");
    let mut mqd = MqdProcess::launch(dir.path(), &["--max-queues", &n.max(1000).to_string()]);
    let client = mqd.connect().await;

    let t = Instant::now();
    let c = client.clone();
    for_each(n, move |i| {
        let c = c.clone();
        async move {
            c.create_queue(&queue_name(i), QueueOptions::default())
                .await
                .unwrap_or_else(|e| panic!("create {}: {e}", queue_name(i)));
        }
    })
    .await;
    let created = t.elapsed();
    let t = Instant::now();
    let c = client.clone();
    for_each(n, move |i| {
        let c = c.clone();
        async move {
            let m = Message::new(format!("{i}")).delivery(mq_client::Delivery::Recoverable);
            c.queue(&queue_name(i)).unwrap().send(m).await.unwrap();
        }
    })
    .await;
    let sent = t.elapsed();
    let rss_filled = rss_mib(mqd.pid());

    let url = mqd.url().to_string();
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || mq(&url, &["queue", "list"], None))
        .await
        .unwrap();
    let listed = t.elapsed();
    assert!(out.status.success(), "{out:?}");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("many-"))
        .count();
    assert_eq!(lines, n, "mq queue list shows every queue");

    mqd.kill9_checked();
    let t = Instant::now();
    let addr = mqd.addr();
    let mqd = MqdProcess::launch_on(dir.path(), addr, &["--max-queues", &n.max(1000).to_string()]);
    let client: Client = mqd.connect().await;
    let queues = loop {
        match client.list_queues().await {
            Ok(q) => break q,
            Err(_) if t.elapsed() < Duration::from_secs(300) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("no answer after the restart: {e}"),
        }
    };
    let restarted = t.elapsed();
    let rss_restarted = rss_mib(mqd.pid());
    let many: Vec<_> = queues
        .iter()
        .filter(|q| q.name.contains("many-"))
        .collect();
    assert_eq!(many.len(), n, "every queue is back");
    assert!(
        many.iter().all(|q| q.messages == 1),
        "every queue holds its message"
    );
    println!(
        "many_queues: {n} queues: create {created:.1?}, send one each {sent:.1?}, mqd RSS {rss_filled:.0} MiB; \
         `mq queue list` {listed:.2?}; kill -9 and restart until ListQueues answers {restarted:.2?}, RSS {rss_restarted:.0} MiB"
    );
}
