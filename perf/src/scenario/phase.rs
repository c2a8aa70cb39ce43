//! The timed building blocks every scenario is made of: [`SendJob`] (N pipelined sends through
//! one sender, or through several on their own connections, timed until the last
//! acknowledgement; TX: each a single-message transaction, acknowledged once committed) and [`ReceiveJob`] (N receives through one
//! consumer, each body decoded and compared with the payload that was sent).
//!
//! Latency, per message:
//! - send: from the `send()` call to its acknowledgement, sampled: every
//!   [`sample_every`]`(N)`-th message and the last one go through `send_with_receipt`, and a
//!   collector task awaits the receipts in order (acknowledgements arrive in order).
//! - receive: the time of `Consumer::next` plus decoding and comparing the body.
//! - transit (for e2e): every message carries, in `app_specific`, the sender's wall clock in
//!   nanoseconds since the Unix epoch, taken before the body is encoded; the receiver
//!   subtracts it from its own wall clock once the body is decoded. The broker's `sent_time`
//!   has only millisecond resolution. Across machines this includes their clock offset.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use mq_client::formatter::BodyType;
use mq_client::{
    ConsumerOptions, Delivery, Message, Queue, Receipt, ReceivedMessage, Sender, SenderOptions,
};
use tokio::sync::mpsc;

use super::Combo;
use crate::payload::decode;
use crate::progress::Progress;
use crate::stats::Latency;

/// Progress is reported in steps of this many messages.
const PROGRESS_STEP: u64 = 64;
/// Bytes a consumer may have prefetched (the broker sends up to 256 messages per delivery
/// batch and a gRPC message is at most 64 MiB, so big bodies need a small window).
const PREFETCH_BYTES: usize = 32 << 20;

/// Which sends carry a receipt: every k-th, k = N / 1000 clamped to 1..=64, so a run gives
/// about 1000 samples (every message when N <= 1000) and at most 1 in 64 messages pays for
/// a receipt.
pub fn sample_every(count: u64) -> u64 {
    (count / 1000).clamp(1, 64)
}

/// The consumer's prefetch for bodies of this size: 1024 messages, fewer for big bodies
/// (at most [`PREFETCH_BYTES`] in flight).
pub fn prefetch_for(body_bytes: usize) -> u32 {
    (PREFETCH_BYTES / body_bytes.max(1)).clamp(1, 1024) as u32
}

/// Wall clock in nanoseconds since the Unix epoch.
pub(crate) fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Send `count` messages of a combination through one pipelining sender, or through `clients`
/// senders at once, each on its own connection, sharing the count.
#[derive(Debug)]
pub(crate) struct SendJob {
    pub queue: Queue,
    pub combo: Arc<Combo>,
    pub count: u64,
    pub delivery: Delivery,
    /// Each message its own single-message transaction (TX; the queue is transactional).
    pub transactional: bool,
    /// Concurrent senders (1: through `queue`'s connection).
    pub clients: u32,
    /// The broker's URL, where each of several clients connects.
    pub url: String,
    /// A label for every message (the CLIENT's run tag).
    pub label: Option<String>,
    pub progress: Progress,
}

/// What a [`SendJob`] measured.
#[derive(Debug)]
pub(crate) struct Sent {
    /// From the first `send()` to the last acknowledgement (the senders are opened before).
    pub elapsed: Duration,
    pub acknowledged: u64,
    /// `send()` to acknowledgement, sampled.
    pub latency: Latency,
}

/// What one sender of a [`SendJob`] did.
struct Part {
    /// When its last message was acknowledged.
    finished: Instant,
    acknowledged: u64,
    latency: Latency,
}

impl SendJob {
    fn what(&self) -> String {
        format!("sending {} to {}", self.combo.name(), self.queue.name())
    }

    async fn open(&self, queue: &Queue) -> Result<Sender> {
        let options = SenderOptions {
            transactional: self.transactional,
            ..SenderOptions::default()
        };
        queue.sender(options).await.with_context(|| self.what())
    }

    pub async fn run(self) -> Result<Sent> {
        let job = Arc::new(self);
        let parts = if job.clients <= 1 {
            let sender = job.open(&job.queue).await?;
            let start = Instant::now();
            let part = job.drive(sender, job.count).await?;
            vec![(start, part)]
        } else {
            // Every client connects and opens its sender first; then all start at once.
            let n = u64::from(job.clients);
            let gate = Arc::new(tokio::sync::Barrier::new(job.clients as usize + 1));
            let mut tasks = Vec::new();
            for k in 0..n {
                let share = job.count / n + u64::from(k < job.count % n);
                let (job, gate) = (job.clone(), gate.clone());
                tasks.push(tokio::spawn(async move {
                    let opened = async {
                        let client = crate::connect::client(&job.url)
                            .await
                            .with_context(|| job.what())?;
                        let queue = client.queue(job.queue.name())?;
                        job.open(&queue).await
                    }
                    .await;
                    // Pass the gate even on failure, so the others are not left waiting.
                    gate.wait().await;
                    let start = Instant::now();
                    job.drive(opened?, share)
                        .await
                        .map(|p| (start, p))
                        .with_context(|| format!("sender {} of {n}", k + 1))
                }));
            }
            gate.wait().await;
            let mut parts = Vec::new();
            for t in tasks {
                parts.push(t.await.context("a sender task panicked")??);
            }
            parts
        };
        let start = parts
            .iter()
            .map(|(s, _)| *s)
            .min()
            .expect("one sender at least");
        let finished = parts.iter().map(|(_, p)| p.finished).max().expect("one");
        let mut latency = Latency::new();
        let mut acknowledged = 0;
        for (_, p) in &parts {
            latency.merge(&p.latency);
            acknowledged += p.acknowledged;
        }
        if acknowledged != job.count {
            bail!(
                "{}: the broker acknowledged {acknowledged} of {} messages",
                job.what(),
                job.count
            );
        }
        Ok(Sent {
            elapsed: finished.saturating_duration_since(start),
            acknowledged,
            latency,
        })
    }

    /// Sends `count` messages through `sender`, timed until the last acknowledgement.
    async fn drive(&self, mut sender: Sender, count: u64) -> Result<Part> {
        let what = self.what();
        let every = sample_every(self.count);
        let (tx, rx) = mpsc::unbounded_channel::<(Instant, Receipt)>();
        let collector = tokio::spawn(collect_receipts(rx));
        let combo = &self.combo;
        for i in 0..count {
            let stamp = unix_ns();
            let (body, body_type) = crate::payload::encode(&combo.payload, combo.formatter)
                .with_context(|| what.clone())?;
            let mut m = Message::new(body)
                .body_type(body_type)
                .delivery(self.delivery)
                .app_specific(stamp);
            if let Some(l) = &self.label {
                m = m.label(l.clone());
            }
            if i % every == 0 || i + 1 == count {
                let t = Instant::now();
                let receipt = sender
                    .send_with_receipt(m)
                    .await
                    .with_context(|| what.clone())?;
                let _ = tx.send((t, receipt));
            } else {
                sender.send(m).await.with_context(|| what.clone())?;
            }
            if (i + 1) % PROGRESS_STEP == 0 {
                self.progress.inc(PROGRESS_STEP);
            }
        }
        let summary = sender.flush().await.with_context(|| what.clone())?;
        let finished = Instant::now();
        self.progress.inc(count % PROGRESS_STEP);
        drop(tx);
        sender.close().await.with_context(|| what.clone())?;
        let latency = collector.await.context("the receipt collector panicked")?;
        if summary.acknowledged != count {
            bail!(
                "{what}: the broker acknowledged {} of {count} messages",
                summary.acknowledged
            );
        }
        Ok(Part {
            finished,
            acknowledged: summary.acknowledged,
            latency,
        })
    }
}

async fn collect_receipts(mut rx: mpsc::UnboundedReceiver<(Instant, Receipt)>) -> Latency {
    let mut l = Latency::new();
    while let Some((t, receipt)) = rx.recv().await {
        // A refused message is reported by flush(); it has no latency.
        if receipt.await.is_ok() {
            l.record(t.elapsed());
        }
    }
    l
}

/// Receive `count` messages of a combination through one consumer, checking each.
#[derive(Debug)]
pub(crate) struct ReceiveJob {
    pub queue: Queue,
    pub combo: Arc<Combo>,
    pub count: u64,
    /// Longest wait for the next message.
    pub timeout: Duration,
    /// Start the clock when the first message arrives instead of at the start (SERVER: the
    /// time waiting for the client is not the server's).
    pub clock_from_first: bool,
    /// Wait for the first message without a limit (SERVER, before the client's first run).
    pub wait_forever_for_first: bool,
    /// The label every message must carry (SERVER: the client's run tag).
    pub expect_label: Option<String>,
    pub progress: Progress,
}

/// What a [`ReceiveJob`] measured.
#[derive(Debug)]
pub(crate) struct Received {
    /// From opening the consumer (or the first message) until the last message is decoded and
    /// acknowledged.
    pub elapsed: Duration,
    /// Messages received, decoded and found equal to the payload.
    pub verified: u64,
    /// Per message: `next()` plus decode and compare.
    pub service: Latency,
    /// Per message: sender's stamp to decoded.
    pub transit: Latency,
}

impl ReceiveJob {
    pub async fn run(self) -> Result<Received> {
        let what = format!("receiving {} from {}", self.combo.name(), self.queue.name());
        let mut start = Instant::now();
        let mut consumer = self
            .queue
            .consumer(ConsumerOptions {
                prefetch: prefetch_for(self.combo.body_bytes),
                limit: Some(self.count),
            })
            .await
            .with_context(|| what.clone())?;
        let mut service = Latency::new();
        let mut transit = Latency::new();
        let mut verified = 0u64;
        for i in 0..self.count {
            let mut t0 = Instant::now();
            let m = loop {
                match consumer
                    .next(self.timeout)
                    .await
                    .with_context(|| what.clone())?
                {
                    Some(m) => break m,
                    None if i == 0 && self.wait_forever_for_first => continue,
                    None => bail!(
                        "{what}: got {i} of {} messages; nothing more arrived within {:?}",
                        self.count,
                        self.timeout
                    ),
                }
            };
            if i == 0 && self.clock_from_first {
                start = Instant::now();
                t0 = start;
            }
            if let Some(expected) = &self.expect_label {
                if &m.label != expected {
                    bail!(
                        "{what}: expected a message labelled `{expected}`, got `{}`; start SERVER and CLIENT with the same --payload, --formatter, --count and --runs (or purge a queue holding an earlier client's messages)",
                        m.label
                    );
                }
            }
            verify(&m, &self.combo).with_context(|| format!("{what}: message {}", i + 1))?;
            transit.record_ns(unix_ns().saturating_sub(m.app_specific).max(0) as u64);
            service.record(t0.elapsed());
            verified += 1;
            if (i + 1) % PROGRESS_STEP == 0 {
                self.progress.inc(PROGRESS_STEP);
            }
        }
        consumer.close().await.with_context(|| what.clone())?;
        let elapsed = start.elapsed();
        self.progress.inc(self.count % PROGRESS_STEP);
        Ok(Received {
            elapsed,
            verified,
            service,
            transit,
        })
    }
}

/// Decodes the body with the formatter its tag names and checks it is the payload sent.
fn verify(m: &ReceivedMessage, combo: &Combo) -> Result<()> {
    let expected = combo.formatter.body_type();
    let found = BodyType::from_u32(m.body_type);
    if found != Some(expected) {
        bail!(
            "body type {} where {} was sent",
            found.map_or_else(|| m.body_type.to_string(), |b| b.name().to_string()),
            expected.name()
        );
    }
    let got = decode(&m.body, expected, &combo.payload).context("cannot decode the body")?;
    if got != combo.payload {
        bail!(
            "the decoded {} differs from the {} that was sent",
            got.variant_name(),
            combo.payload.variant_name()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_and_prefetch() {
        assert_eq!(sample_every(1), 1);
        assert_eq!(sample_every(200), 1);
        assert_eq!(sample_every(5000), 5);
        assert_eq!(sample_every(20_000), 20);
        assert_eq!(sample_every(10_000_000), 64);
        assert_eq!(prefetch_for(0), 1024);
        assert_eq!(prefetch_for(1000), 1024);
        assert_eq!(prefetch_for(100_000), 335);
        assert_eq!(prefetch_for(2_000_000), 16);
        assert_eq!(prefetch_for(64 << 20), 1);
    }
}
