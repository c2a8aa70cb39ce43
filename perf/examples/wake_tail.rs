//! The tail of a thread wake-up on this machine (issue 14 point 6), with nothing of mq's in it:
//! a paced chain of plain threads. Not shipped in mqd; a probe for docs/benchmarks.md.
//!
//! ```sh
//! cargo build --release -p mq-perf --example wake_tail
//! target/release/examples/wake_tail --rate 2000 --hops 4
//! taskset -c 0 target/release/examples/wake_tail --rate 2000 --hops 4   # one vCPU only
//! ```
//!
//! A pacer thread releases one timestamp every `1 / --rate` seconds (sleeping with
//! `std::thread::sleep` until the next is due, then sending every one due by then, as mqperf's
//! `--rate` pacer does); each crosses `--hops` threads, each blocked on a `std::sync::mpsc`
//! channel (a futex wake when it sleeps); the last thread records the time since the message was
//! *due* (coordinated omission corrected, as mqperf's e2e latency is). It prints two lines, µs:
//!
//! With `--batch`, each release is one batch (a `Vec` of the timestamps due), and each hop
//! forwards everything waiting for it as one batch, as a broker's stages do: one wake-up per
//! batch instead of per message.
//!
//! - `pacer`: how late the pacer woke against the time it asked for (the timer's own tail);
//! - `chain`: due to received at the end of the chain (the pacer's lateness included).
//!
//! A message path through a broker wakes at least as many threads (sender, broker, consumer), so
//! this chain's p99 is a floor under mqperf's e2e p99 at the same rate on the same machine.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// The most messages one invocation measures.
const MAX_MESSAGES: u64 = 20_000_000;

struct Args {
    rate: u64,
    hops: usize,
    seconds: u64,
    batch: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        rate: 2000,
        hops: 4,
        seconds: 4,
        batch: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name}: not a whole number"))
        };
        match flag.as_str() {
            "--rate" => a.rate = value("--rate")?,
            "--hops" => a.hops = usize::try_from(value("--hops")?)?,
            "--seconds" => a.seconds = value("--seconds")?,
            "--batch" => a.batch = true,
            "-h" | "--help" => {
                println!("usage: wake_tail [--rate MSGS_PER_S] [--hops N] [--seconds S] [--batch]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (try --help)"),
        }
    }
    if a.rate == 0 || a.rate > 1_000_000 {
        bail!("--rate must be 1..=1000000");
    }
    if a.hops == 0 || a.hops > 64 {
        bail!("--hops must be 1..=64");
    }
    if a.seconds == 0 || a.seconds > 600 {
        bail!("--seconds must be 1..=600");
    }
    // Every latency is kept (8 bytes each) to sort at the end.
    if a.rate * a.seconds > MAX_MESSAGES {
        bail!("--rate × --seconds must be at most {MAX_MESSAGES} messages");
    }
    Ok(a)
}

/// p50, p99, p99.9 and max of `v` (sorted here), in one line.
fn summary(v: &mut [u64]) -> String {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {} p99 {} p99.9 {} max {}",
        at(0.5),
        at(0.99),
        at(0.999),
        v[v.len() - 1]
    )
}

fn main() {
    if let Err(e) = run() {
        eprintln!("wake_tail: error: {e:#}");
        std::process::exit(2);
    }
}

fn run() -> Result<()> {
    let a = args()?;
    let total = a.rate * a.seconds;
    let (first, mut last) = mpsc::channel::<Vec<Instant>>();
    let mut hops = Vec::new();
    for _ in 0..a.hops {
        let (tx, rx) = mpsc::channel::<Vec<Instant>>();
        let from = last;
        let batch = a.batch;
        hops.push(std::thread::spawn(move || {
            while let Ok(mut b) = from.recv() {
                if batch {
                    while let Ok(more) = from.try_recv() {
                        b.extend(more);
                    }
                }
                if tx.send(b).is_err() {
                    break;
                }
            }
        }));
        last = rx;
    }
    let start = Instant::now();
    let (rate, batch) = (a.rate, a.batch);
    let due = move |g: u64| start + Duration::from_nanos(g * 1_000_000_000 / rate);
    let pacer = std::thread::spawn(move || {
        let mut late = Vec::new();
        let mut g = 0;
        while g < total {
            let now = Instant::now();
            if due(g) > now {
                std::thread::sleep(due(g) - now);
            }
            let now = Instant::now();
            late.push((now - due(g)).as_micros() as u64);
            let mut released = Vec::new();
            while g < total && due(g) <= now {
                released.push(due(g));
                g += 1;
            }
            let sent = if batch {
                first.send(released).is_ok()
            } else {
                released.into_iter().all(|t| first.send(vec![t]).is_ok())
            };
            if !sent {
                return late;
            }
        }
        late
    });
    let mut chain: Vec<u64> = Vec::with_capacity(total as usize);
    while chain.len() < total as usize {
        let Ok(b) = last.recv() else { break };
        chain.extend(b.iter().map(|t| t.elapsed().as_micros() as u64));
    }
    let mut late = pacer.join().expect("the pacer thread");
    for h in hops {
        h.join().expect("a hop thread");
    }
    println!(
        "rate {} hops {}{}: pacer ({} wake-ups) {} us; chain ({} messages) {} us",
        a.rate,
        a.hops,
        if a.batch { " batched" } else { "" },
        late.len(),
        summary(&mut late),
        chain.len(),
        summary(&mut chain)
    );
    Ok(())
}
