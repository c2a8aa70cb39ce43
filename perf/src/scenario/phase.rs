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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use mq_client::formatter::BodyType;
use mq_client::{
    Client, Consumer, ConsumerOptions, Delivery, Message, Queue, Receipt, ReceivedMessage, Sender,
    SenderOptions,
};
use tokio::sync::mpsc;

use super::Combo;
use crate::payload::decode;
use crate::progress::Progress;
use crate::rate::{Pacer, PacerHandle, Schedule};
use crate::stats::Latency;

/// Consumers of a [`ReceiveJob`] that share one connection (the broker serves 256 streams per
/// connection by default).
const CONSUMERS_PER_CONNECTION: usize = 100;
/// Senders one client keeps open at once. A client that sends to more queues (`--queues` in
/// the thousands) goes through them in groups of this many: opens their senders at once, sends
/// the group's messages, flushes and closes them, then the next group (the broker serves 256
/// streams per connection by default).
const MAX_OPEN_SENDERS: usize = 128;
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
/// senders at once, each on its own connection, sharing the count. Message `g` (0-based over
/// the whole job) goes to queue `g mod queues` and, with several clients, from client
/// `g mod clients`; with a rate it is due at `g / rate` s.
#[derive(Debug)]
pub(crate) struct SendJob {
    /// Where messages go, round-robin (at least one).
    pub queues: Vec<Queue>,
    pub combo: Arc<Combo>,
    pub count: u64,
    pub delivery: Delivery,
    /// Each message its own single-message transaction (TX; the queue is transactional).
    pub transactional: bool,
    /// TX: each message an explicit transaction (begin, send, commit), awaited before the next.
    pub one_at_a_time: bool,
    /// Each message one `Queue::send` (transactional: `Queue::send_tx`), awaited before the
    /// next (`--send-one`).
    pub send_one: bool,
    /// Concurrent senders (1: through `queues`' connection).
    pub clients: u32,
    /// Where each of several clients gets its connection (kept across jobs).
    pub pool: Arc<super::pool::Pool>,
    /// A label for every message (the CLIENT's run tag).
    pub label: Option<String>,
    /// `--rate`: open loop at this many messages/s, latencies from the intended send time.
    pub rate: Option<u64>,
    pub progress: Progress,
}

/// What a [`SendJob`] measured.
#[derive(Debug)]
pub(crate) struct Sent {
    /// From the first `send()` to the last acknowledgement (the senders are opened before).
    pub elapsed: Duration,
    pub acknowledged: u64,
    /// `send()` (with a rate: the intended send time) to acknowledgement, sampled.
    pub latency: Latency,
}

/// What one sender of a [`SendJob`] did.
struct Part {
    /// When its last message was acknowledged.
    finished: Instant,
    acknowledged: u64,
    latency: Latency,
}

/// The senders of one client: one per queue it sends to (`None` for the others).
type Senders = Vec<Option<Sender>>;

impl SendJob {
    fn what(&self) -> String {
        let q = &self.queues[0];
        match self.queues.len() {
            1 => format!("sending {} to {}", self.combo.name(), q.name()),
            n => format!(
                "sending {} to {n} queues ({} ...)",
                self.combo.name(),
                q.name()
            ),
        }
    }

    /// Opens a sender to every queue client `k` of `n` sends to (queue `g mod Q` of its
    /// messages `g = k + j*n`), through `queue(i)`.
    async fn open(
        &self,
        k: u64,
        n: u64,
        queue: impl Fn(usize) -> Result<Queue>,
    ) -> Result<Senders> {
        let options = SenderOptions {
            transactional: self.transactional,
            ..SenderOptions::default()
        };
        let q = self.queues.len() as u64;
        let mut senders: Senders = (0..q).map(|_| None).collect();
        if self.one_by_one() || self.grouped(k, n) {
            return Ok(senders);
        }
        let share = self.count / n + u64::from(k < self.count % n);
        for j in 0..share.min(q) {
            let i = ((k + j * n) % q) as usize;
            if senders[i].is_none() {
                let s = queue(i)?
                    .sender(options.clone())
                    .await
                    .with_context(|| self.what())?;
                senders[i] = Some(s);
            }
        }
        Ok(senders)
    }

    /// Every message awaited before the next (`--one-at-a-time`, `--send-one`): no senders.
    fn one_by_one(&self) -> bool {
        self.one_at_a_time || self.send_one
    }

    /// Client `k` of `n` sends to more queues than it keeps senders open: it sends in groups
    /// ([`MAX_OPEN_SENDERS`]).
    fn grouped(&self, k: u64, n: u64) -> bool {
        let share = self.count / n + u64::from(k < self.count % n);
        distinct_queues(share, n, self.queues.len() as u64) > MAX_OPEN_SENDERS as u64
    }

    pub async fn run(self) -> Result<Sent> {
        if self.rate.is_some() && !self.one_by_one() && self.grouped(0, u64::from(self.clients)) {
            bail!(
                "{}: --rate needs a sender per queue, and each client keeps at most {MAX_OPEN_SENDERS} open; use fewer --queues or more --clients",
                self.what()
            );
        }
        let job = Arc::new(self);
        let total = job.count;
        let parts = if job.clients <= 1 {
            let senders = job.open(0, 1, |i| Ok(job.queues[i].clone())).await?;
            let pacer = job.rate.map(|r| Pacer::start(Schedule::new(r), total));
            let handle = pacer.as_ref().map(Pacer::handle);
            // Open loop: from the schedule's start (see `PacerHandle::start`).
            let start = handle
                .as_ref()
                .map_or_else(Instant::now, PacerHandle::start);
            let client = job.queues[0].client().clone();
            // --one-at-a-time, --send-one: on a runtime worker, as a client's task would be
            // (not on block_on's thread, which is not a worker: every answer would cost it one
            // more hand-off), whichever scenario runs the phase.
            let part = if job.one_by_one() {
                let job = job.clone();
                tokio::spawn(async move { job.drive(client, senders, 0, 1, handle).await })
                    .await
                    .context("the one-at-a-time sender task panicked")??
            } else {
                job.drive(client, senders, 0, 1, handle).await?
            };
            vec![(start, part)]
        } else {
            // Every client connects and opens its senders first; then all start at once (the
            // pacer starts between the two gates).
            let n = u64::from(job.clients);
            let mut clients = job
                .pool
                .clients(job.clients as usize)
                .await
                .with_context(|| job.what())?
                .into_iter();
            let opened_gate = Arc::new(tokio::sync::Barrier::new(job.clients as usize + 1));
            let start_gate = Arc::new(tokio::sync::Barrier::new(job.clients as usize + 1));
            let (pacer_tx, pacer_rx) = tokio::sync::watch::channel(None::<PacerHandle>);
            let mut tasks = Vec::new();
            for k in 0..n {
                let (job, opened_gate, start_gate) =
                    (job.clone(), opened_gate.clone(), start_gate.clone());
                let mut pacer_rx = pacer_rx.clone();
                let client = clients.next().expect("a connection per client");
                tasks.push(tokio::spawn(async move {
                    let opened = async {
                        let name = |i: usize| job.queues[i].name().to_string();
                        let senders = job.open(k, n, |i| Ok(client.queue(&name(i))?)).await?;
                        anyhow::Ok((client, senders))
                    }
                    .await;
                    // Pass the gates even on failure, so the others are not left waiting.
                    opened_gate.wait().await;
                    start_gate.wait().await;
                    let pacer = pacer_rx.borrow_and_update().clone();
                    // Open loop: from the schedule's start (see `PacerHandle::start`).
                    let start = pacer.as_ref().map_or_else(Instant::now, PacerHandle::start);
                    let (client, senders) = opened?;
                    job.drive(client, senders, k, n, pacer)
                        .await
                        .map(|p| (start, p))
                        .with_context(|| format!("sender {} of {n}", k + 1))
                }));
            }
            opened_gate.wait().await;
            let pacer = job.rate.map(|r| Pacer::start(Schedule::new(r), total));
            pacer_tx.send_replace(pacer.as_ref().map(Pacer::handle));
            start_gate.wait().await;
            let mut parts = Vec::new();
            for t in tasks {
                parts.push(t.await.context("a sender task panicked")??);
            }
            drop(pacer);
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

    /// Sends client `k` of `n`'s messages (`g = k, k+n, k+2n, ...` below the count) through
    /// its senders, timed until the last acknowledgement; paced by `pacer` if given.
    async fn drive(
        &self,
        client: Client,
        mut senders: Senders,
        k: u64,
        n: u64,
        mut pacer: Option<PacerHandle>,
    ) -> Result<Part> {
        let count = self.count / n + u64::from(k < self.count % n);
        if !self.one_by_one() && self.grouped(k, n) {
            return self.drive_grouped(&client, k, n, count).await;
        }
        let what = self.what();
        let every = sample_every(self.count);
        let (tx, rx) = mpsc::unbounded_channel::<(Instant, Receipt)>();
        let collector = tokio::spawn(collect_receipts(rx));
        let q = self.queues.len() as u64;
        // --one-at-a-time, --send-one: every send is awaited, so every one is a latency sample.
        let mut latency = Latency::new();
        let mut one_at_a_time = 0;
        for j in 0..count {
            let g = k + j * n;
            let (stamp, t) = match &mut pacer {
                Some(p) => {
                    p.wait(g).await;
                    (p.intended_unix_ns(g), p.intended(g))
                }
                None => (unix_ns(), Instant::now()),
            };
            let m = self.message(stamp).with_context(|| what.clone())?;
            if self.one_by_one() {
                let t = if pacer.is_some() { t } else { Instant::now() };
                let queue = &self.queues[(g % q) as usize];
                if self.send_one && self.transactional {
                    queue.send_tx(m).await.with_context(|| what.clone())?;
                } else if self.send_one {
                    queue.send(m).await.with_context(|| what.clone())?;
                } else {
                    let mut tx = client.begin().await.with_context(|| what.clone())?;
                    tx.send(queue.name(), m).with_context(|| what.clone())?;
                    tx.commit().await.with_context(|| what.clone())?;
                }
                latency.record(t.elapsed());
                one_at_a_time += 1;
                if (j + 1) % PROGRESS_STEP == 0 {
                    self.progress.inc(PROGRESS_STEP);
                }
                continue;
            }
            let sender = senders[(g % q) as usize]
                .as_mut()
                .context("no sender for a queue this client sends to")?;
            if j % every == 0 || j + 1 == count {
                let t = if pacer.is_some() { t } else { Instant::now() };
                let receipt = sender
                    .send_with_receipt(m)
                    .await
                    .with_context(|| what.clone())?;
                let _ = tx.send((t, receipt));
            } else {
                sender.send(m).await.with_context(|| what.clone())?;
            }
            if (j + 1) % PROGRESS_STEP == 0 {
                self.progress.inc(PROGRESS_STEP);
            }
        }
        let mut acknowledged = one_at_a_time;
        for s in senders.iter_mut().flatten() {
            acknowledged += s.flush().await.with_context(|| what.clone())?.acknowledged;
        }
        let finished = Instant::now();
        self.progress.inc(count % PROGRESS_STEP);
        drop(tx);
        for s in senders.into_iter().flatten() {
            s.close().await.with_context(|| what.clone())?;
        }
        latency.merge(&collector.await.context("the receipt collector panicked")?);
        if acknowledged != count {
            bail!("{what}: the broker acknowledged {acknowledged} of {count} messages");
        }
        Ok(Part {
            finished,
            acknowledged,
            latency,
        })
    }
}

impl SendJob {
    /// One message of the job, stamped with the sender's clock `stamp` (ns since the epoch).
    fn message(&self, stamp: i64) -> Result<Message> {
        let (body, body_type) = crate::payload::encode(&self.combo.payload, self.combo.formatter)?;
        let mut m = Message::new(body)
            .body_type(body_type)
            .delivery(self.delivery)
            .app_specific(stamp);
        if let Some(l) = &self.label {
            m = m.label(l.clone());
        }
        Ok(m)
    }

    /// [`SendJob::drive`] for a client with more queues than [`MAX_OPEN_SENDERS`]: its
    /// messages in order, cut into groups that go to at most that many queues; per group the
    /// senders open at once, the messages go out (every [`sample_every`]-th with a receipt),
    /// and the senders are flushed and closed at once. Closed loop only.
    async fn drive_grouped(&self, client: &Client, k: u64, n: u64, count: u64) -> Result<Part> {
        let what = self.what();
        let every = sample_every(self.count);
        let options = SenderOptions {
            transactional: self.transactional,
            ..SenderOptions::default()
        };
        let q = self.queues.len() as u64;
        let mut latency = Latency::new();
        let mut acknowledged = 0;
        let mut j = 0;
        while j < count {
            // The next group: messages j.. up to the one that would need one queue too many.
            let mut group: Vec<usize> = Vec::new();
            let mut slot_of = std::collections::HashMap::new();
            let mut end = j;
            while end < count {
                let i = ((k + end * n) % q) as usize;
                if let std::collections::hash_map::Entry::Vacant(e) = slot_of.entry(i) {
                    if group.len() == MAX_OPEN_SENDERS {
                        break;
                    }
                    e.insert(group.len());
                    group.push(i);
                }
                end += 1;
            }
            let mut senders = futures::future::try_join_all(group.iter().map(|&i| {
                let name = self.queues[i].name().to_string();
                let options = options.clone();
                async move { client.queue(&name)?.sender(options).await }
            }))
            .await
            .with_context(|| what.clone())?;
            let mut receipts = Vec::new();
            for jj in j..end {
                let i = ((k + jj * n) % q) as usize;
                let m = self.message(unix_ns()).with_context(|| what.clone())?;
                let sender = &senders[slot_of[&i]];
                if jj % every == 0 || jj + 1 == count {
                    let t = Instant::now();
                    let r = sender
                        .send_with_receipt(m)
                        .await
                        .with_context(|| what.clone())?;
                    receipts.push((t, r));
                } else {
                    sender.send(m).await.with_context(|| what.clone())?;
                }
                if (jj + 1) % PROGRESS_STEP == 0 {
                    self.progress.inc(PROGRESS_STEP);
                }
            }
            let flushed = futures::future::try_join_all(senders.iter_mut().map(|s| s.flush()))
                .await
                .with_context(|| what.clone())?;
            acknowledged += flushed.iter().map(|f| f.acknowledged).sum::<u64>();
            for (t, r) in receipts {
                if r.await.is_ok() {
                    latency.record(t.elapsed());
                }
            }
            futures::future::try_join_all(senders.into_iter().map(|s| s.close()))
                .await
                .with_context(|| what.clone())?;
            j = end;
        }
        let finished = Instant::now();
        self.progress.inc(count % PROGRESS_STEP);
        if acknowledged != count {
            bail!("{what}: the broker acknowledged {acknowledged} of {count} messages");
        }
        Ok(Part {
            finished,
            acknowledged,
            latency,
        })
    }
}

/// How many queues a client of `n` with `share` messages sends to, over `q` queues round-robin:
/// its queues `(k + j*n) mod q` repeat every `q / gcd(n, q)` messages (200 clients over 1,000
/// queues: 5 each). Counting `min(share, q)` instead made each of 200 clients look as if it
/// sent to 1,000 queues and go through them in groups, opening its senders with the clock
/// running.
fn distinct_queues(share: u64, n: u64, q: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    share.min(q / gcd(n.max(1), q).max(1))
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

/// Receive `count` messages of a combination through one consumer, checking each; or, with
/// several queues or consumers, through `consumers` consumers at once (consumer k on queue
/// k mod Q; queue q holds the messages `g` with `g mod Q = q`).
#[derive(Debug)]
pub(crate) struct ReceiveJob {
    /// The queues, at least one (SERVER: exactly one).
    pub queues: Vec<Queue>,
    /// Consumers, at least `queues.len()`.
    pub consumers: u32,
    /// Acknowledge every message on its own.
    pub ack_each: bool,
    /// TX: every receive an explicit transaction (begin, receive, commit), awaited.
    pub one_at_a_time: bool,
    /// With `one_at_a_time`: begin, receive_and_commit (one round trip) instead.
    pub receive_and_commit: bool,
    /// Every receive one unary `Queue::receive`, awaited (`--receive-one`).
    pub receive_one: bool,
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
    /// Where consumers past the first [`CONSUMERS_PER_CONNECTION`] get their connections.
    pub pool: Arc<super::pool::Pool>,
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
    /// Messages each consumer received.
    pub per_consumer: Vec<u64>,
}

impl ReceiveJob {
    pub async fn run(self) -> Result<Received> {
        if self.queues.len() <= 1 && self.consumers <= 1 {
            self.run_one().await
        } else {
            self.run_many().await
        }
    }

    async fn run_one(self) -> Result<Received> {
        let queue = &self.queues[0];
        let what = format!("receiving {} from {}", self.combo.name(), queue.name());
        let mut start = Instant::now();
        let mut consumer = Source::open(&self, queue, Some(self.count))
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
            if self.ack_each {
                consumer.ack().await.with_context(|| what.clone())?;
            }
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
            per_consumer: vec![verified],
        })
    }

    /// Several consumers at once. Each queue's consumers share its count: they stop once the
    /// queue's last message is verified; a consumer fails only when its queue made no progress
    /// for the timeout.
    async fn run_many(self) -> Result<Received> {
        let job = Arc::new(self);
        let q = job.queues.len() as u64;
        let start = Instant::now();
        let shares: Vec<Arc<Share>> = (0..q)
            .map(|i| {
                let (done, _) = tokio::sync::watch::channel(false);
                Arc::new(Share {
                    left: AtomicU64::new(job.count / q + u64::from(i < job.count % q)),
                    done,
                })
            })
            .collect();
        let mut consumers_per_queue = vec![0u64; q as usize];
        for k in 0..u64::from(job.consumers) {
            consumers_per_queue[(k % q) as usize] += 1;
        }
        // Up to CONSUMERS_PER_CONNECTION consumers share a connection (the first group the
        // job's own), so many consumers stay below the broker's streams per connection.
        let mut connections = vec![job.queues[0].client().clone()];
        let extra = (job.consumers as usize).div_ceil(CONSUMERS_PER_CONNECTION) - 1;
        connections.extend(
            job.pool
                .clients(extra)
                .await
                .with_context(|| format!("another consumer connection to {}", job.pool.url()))?,
        );
        let mut tasks = Vec::new();
        for k in 0..job.consumers as usize {
            let i = k % q as usize;
            let (job, share) = (job.clone(), shares[i].clone());
            let alone = consumers_per_queue[i] == 1;
            let client = connections[k / CONSUMERS_PER_CONNECTION].clone();
            tasks.push(tokio::spawn(async move {
                let queue = client.queue(job.queues[i].name())?;
                job.consume(&queue, share, alone)
                    .await
                    .with_context(|| format!("consumer {} of {}", k + 1, job.consumers))
            }));
        }
        let mut results = Vec::with_capacity(tasks.len());
        for t in tasks {
            results.push(t.await.context("a consumer task panicked")??);
        }
        // Timed until the last message was verified (the other consumers of its queue finish
        // the receive they were waiting in after it); adding up their latencies is not.
        let mut elapsed = Duration::ZERO;
        let mut service = Latency::new();
        let mut transit = Latency::new();
        let mut per_consumer = Vec::new();
        for (n, s, tr, last) in results {
            service.merge(&s);
            transit.merge(&tr);
            per_consumer.push(n);
            elapsed = elapsed.max(last.map_or(Duration::ZERO, |t| t.duration_since(start)));
        }
        let verified: u64 = per_consumer.iter().sum();
        job.progress
            .inc(per_consumer.iter().map(|n| n % PROGRESS_STEP).sum());
        Ok(Received {
            elapsed,
            verified,
            service,
            transit,
            per_consumer,
        })
    }

    /// One consumer on queue `i`: receives until the queue's share is done. Returns what it
    /// verified and when it verified its last message.
    async fn consume(
        &self,
        queue: &Queue,
        share: Arc<Share>,
        alone: bool,
    ) -> Result<(u64, Latency, Latency, Option<Instant>)> {
        let what = format!("receiving {} from {}", self.combo.name(), queue.name());
        let mut service = Latency::new();
        let mut transit = Latency::new();
        let done = share.done.subscribe();
        let total = share.left.load(Ordering::Acquire);
        let mut got = 0u64;
        let mut last = None;
        if total == 0 {
            return Ok((0, service, transit, last));
        }
        // Alone on its queue it knows its count; sharing, any of them may get the rest.
        let mut consumer = Source::open(self, queue, alone.then_some(total))
            .await
            .with_context(|| what.clone())?;
        let mut last_progress = (share.left.load(Ordering::Acquire), Instant::now());
        loop {
            if *done.borrow() {
                break;
            }
            let t0 = Instant::now();
            // Not given up when another consumer takes the queue's last message: a receive
            // dropped while it waits may still take a message (a later run's) for nobody, as the
            // broker cannot tell until the client's reset reaches it. It ends within 200 ms.
            let next = consumer
                .next(Duration::from_millis(200))
                .await
                .with_context(|| what.clone())?;
            let Some(m) = next else {
                let left = share.left.load(Ordering::Acquire);
                if left != last_progress.0 {
                    last_progress = (left, Instant::now());
                } else if last_progress.1.elapsed() >= self.timeout {
                    bail!(
                        "{what}: {left} of the queue's messages still to come; nothing arrived within {:?}",
                        self.timeout
                    );
                }
                continue;
            };
            verify(&m, &self.combo).with_context(|| format!("{what}: message {}", got + 1))?;
            transit.record_ns(unix_ns().saturating_sub(m.app_specific).max(0) as u64);
            service.record(t0.elapsed());
            got += 1;
            if self.ack_each {
                consumer.ack().await.with_context(|| what.clone())?;
            }
            last = Some(Instant::now());
            if got.is_multiple_of(PROGRESS_STEP) {
                self.progress.inc(PROGRESS_STEP);
            }
            let before = share.left.fetch_sub(1, Ordering::AcqRel);
            if before == 0 {
                bail!("{what}: more messages than were sent to this queue");
            }
            if before == 1 {
                share.done.send_replace(true);
                break;
            }
        }
        consumer.close().await.with_context(|| what.clone())?;
        Ok((got, service, transit, last))
    }
}

/// Where a [`ReceiveJob`] gets its messages: a streaming consumer, or (`--one-at-a-time`)
/// one explicit transaction per message.
enum Source {
    Consumer(Box<Consumer>),
    /// With whether each ends with receive_and_commit (`--receive-and-commit`).
    OneAtATime(Box<Queue>, bool),
    /// `--receive-one`: one unary receive per message.
    ReceiveOne(Box<Queue>),
}

impl Source {
    async fn open(job: &ReceiveJob, queue: &Queue, limit: Option<u64>) -> mq_client::Result<Self> {
        if job.receive_one {
            return Ok(Source::ReceiveOne(Box::new(queue.clone())));
        }
        if job.one_at_a_time {
            return Ok(Source::OneAtATime(
                Box::new(queue.clone()),
                job.receive_and_commit,
            ));
        }
        let options = ConsumerOptions {
            prefetch: prefetch_for(job.combo.body_bytes),
            limit,
        };
        Ok(Source::Consumer(Box::new(queue.consumer(options).await?)))
    }

    /// The next message; one at a time: begin, receive, commit (an empty receive aborts), or
    /// begin, receive_and_commit (which aborts an empty receive itself).
    async fn next(&mut self, timeout: Duration) -> mq_client::Result<Option<ReceivedMessage>> {
        match self {
            Source::Consumer(c) => c.next(timeout).await,
            Source::ReceiveOne(q) => q.receive(timeout).await,
            Source::OneAtATime(q, true) => {
                let tx = q.client().begin().await?;
                Ok(tx
                    .receive_and_commit(q.name(), timeout)
                    .await?
                    .map(|(m, _)| m))
            }
            Source::OneAtATime(q, false) => {
                let mut tx = q.client().begin().await?;
                match tx.receive(q.name(), timeout).await? {
                    Some(m) => {
                        tx.commit().await?;
                        Ok(Some(m))
                    }
                    None => {
                        tx.abort().await?;
                        Ok(None)
                    }
                }
            }
        }
    }

    /// `--ack-each`: acknowledges what the consumer delivered (a transaction needs none).
    async fn ack(&mut self) -> mq_client::Result<()> {
        match self {
            Source::Consumer(c) => c.ack().await,
            Source::OneAtATime(..) | Source::ReceiveOne(_) => Ok(()),
        }
    }

    async fn close(self) -> mq_client::Result<()> {
        match self {
            Source::Consumer(c) => c.close().await,
            Source::OneAtATime(..) | Source::ReceiveOne(_) => Ok(()),
        }
    }
}

/// What the consumers of one queue share.
#[derive(Debug)]
struct Share {
    /// Messages still to receive from the queue.
    left: AtomicU64,
    /// Set once `left` reaches 0.
    done: tokio::sync::watch::Sender<bool>,
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
    fn a_client_sends_to_the_queues_its_round_robin_reaches() {
        assert_eq!(distinct_queues(1000, 200, 1000), 5);
        assert_eq!(distinct_queues(3, 200, 1000), 3);
        assert_eq!(distinct_queues(100_000, 1, 1000), 1000);
        assert_eq!(distinct_queues(1000, 3, 1000), 1000);
        assert_eq!(distinct_queues(10, 4, 6), 3);
        assert_eq!(distinct_queues(0, 1, 1), 0);
    }

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
