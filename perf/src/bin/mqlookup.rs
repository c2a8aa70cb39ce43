//! mqlookup: receive-by-correlation-id throughput on a long queue (issue 13): fills a queue
//! with `--messages` messages (correlation ids `c0`, `c1`, ...), then `--requesters` tasks
//! receive (or `--peek`) by correlation id, in a scattered order over the whole queue, for
//! `--secs`; prints lookups/s. With `--mqd-pid`, also the broker's RSS before and after the
//! first lookup (which builds the index).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use mq_client::{Client, Message, QueueOptions, SenderOptions};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:1801")]
    broker: String,
    #[arg(long, default_value = r".\private$\lookup")]
    queue: String,
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
    #[arg(long, default_value_t = 16)]
    requesters: u64,
    #[arg(long, default_value_t = 10)]
    secs: u64,
    #[arg(long, default_value_t = 100)]
    body: usize,
    /// Peek instead of receive.
    #[arg(long)]
    peek: bool,
    /// Skip filling (the queue holds the messages already).
    #[arg(long)]
    no_fill: bool,
    #[arg(long)]
    mqd_pid: Option<u32>,
}

fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let client = Client::connect(a.broker.clone()).await?;
    let _ = client.create_queue(&a.queue, QueueOptions::default()).await;
    let q = client.queue(&a.queue)?;
    if !a.no_fill {
        let t = Instant::now();
        let s = q.sender(SenderOptions::default()).await?;
        let body = vec![b'x'; a.body];
        for i in 0..a.messages {
            s.send(Message::new(body.clone()).correlation_id(format!("c{i}")))
                .await?;
        }
        s.close().await?;
        println!(
            "filled {} messages in {:.1}s",
            a.messages,
            t.elapsed().as_secs_f64()
        );
    }
    let info = q.info().await?;
    println!("queue holds {} messages", info.messages);
    let before = rss_kib(a.mqd_pid);
    let t = Instant::now();
    let _ = q.peek_by_correlation_id("c0", Duration::ZERO).await?;
    println!(
        "first lookup (builds the index): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    if let (Some(b), Some(after)) = (before, rss_kib(a.mqd_pid)) {
        println!(
            "mqd RSS {b} KiB -> {after} KiB: index ~{:.1} bytes/message",
            (after as f64 - b as f64) * 1024.0 / info.messages.max(1) as f64
        );
    }
    // A permutation of 0..n: i = k * P mod n, P prime and not a factor of n.
    let n = info.messages.max(1);
    const P: u64 = 999_983;
    let next = Arc::new(AtomicU64::new(1));
    let found = Arc::new(AtomicU64::new(0));
    let missed = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(a.secs);
    let mut tasks = Vec::new();
    for _ in 0..a.requesters {
        let (q, next, found, missed) = (q.clone(), next.clone(), found.clone(), missed.clone());
        let peek = a.peek;
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let c = format!("c{}", (k as u128 * P as u128 % n as u128) as u64);
                let r = if peek {
                    q.peek_by_correlation_id(&c, Duration::ZERO).await
                } else {
                    q.receive_by_correlation_id(&c, Duration::ZERO).await
                };
                match r {
                    Ok(Some(m)) if m.correlation_id == c => found.fetch_add(1, Ordering::Relaxed),
                    _ => missed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let t = Instant::now();
    for task in tasks {
        task.await?;
    }
    let secs = t.elapsed().as_secs_f64();
    let (f, m) = (
        found.load(Ordering::Relaxed),
        missed.load(Ordering::Relaxed),
    );
    println!(
        "{} by correlation id: {f} found, {m} missed in {secs:.1}s: {:.0} lookups/s ({} requesters)",
        if a.peek { "peek" } else { "receive" },
        f as f64 / secs,
        a.requesters
    );
    Ok(())
}
