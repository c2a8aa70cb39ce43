//! The same scenarios against a peer broker (`--target amqp://...` or `nats://...`): the
//! plan, payloads, formatters, checks and report of mq's own runs, with each mode mapped to
//! the peer's closest equivalent (see [`crate::target::TargetInfo`] for the mapping as the
//! report states it).
//!
//! - `amqp`: RabbitMQ through `lapin` (cargo feature `amqp`).
//! - `nats`: NATS JetStream through `async-nats` (cargo feature `nats`).
//!
//! Per scenario: SENDANDPURGE times the sends, then purges; SENDANDRECEIVE times send,
//! receive and e2e (sender and receiver at once); CLIENT sends a run and waits for the
//! SERVER's reply (8 bytes little-endian: messages verified, then the HdrHistogram of its
//! send-to-decode latencies), SERVER drains a run, checking every label, and replies. Queue
//! names are derived from QUEUE's last path component (see [`peer_queue`]), one per mode, as a
//! peer cannot change a queue's durability or a stream's storage once created.

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "nats")]
mod nats;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::config::{Config, DeliveryKind, Mode, Scenario};
use crate::machine::Machine;
use crate::measurement::{ComboResult, Op, OpResult, Outcome};
use crate::payload::{decode, encode};
use crate::progress::Progress;
use crate::report::{self, ReportContext, Row};
use crate::scenario::{ops, prefetch_for, progress_per_run, sample_every, unix_ns, Combo, Planned};
use crate::stats::Latency;
use crate::steal::CpuTimes;
use crate::target::{Target, TargetInfo};

/// The mode as a peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Express,
    Recoverable,
    Tx,
}

impl Kind {
    fn of(config: &Config) -> Kind {
        match (config.mode, config.delivery) {
            (Mode::Tx, _) => Kind::Tx,
            (Mode::Notx, DeliveryKind::Express) => Kind::Express,
            (Mode::Notx, DeliveryKind::Recoverable) => Kind::Recoverable,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Kind::Express => "express",
            Kind::Recoverable => "recoverable",
            Kind::Tx => "tx",
        }
    }
}

/// One received message, as a backend hands it to the check.
#[derive(Debug)]
pub(crate) struct Incoming<'a> {
    pub body: &'a [u8],
    /// The sender's clock before encoding, ns since the Unix epoch (0: missing).
    pub sent_ns: i64,
    pub label: &'a str,
}

/// A number unique in this process (consumer tags).
pub(crate) fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The peer's name for an mq queue path: `mqperf_` + the last path component (characters
/// other than ASCII letters, digits, `-` and `_` become `_`, at most 64) + `_` + the mode
/// (`express`, `recoverable`, `tx`). `.\private$\perf` in TX mode is `mqperf_perf_tx`: a
/// valid AMQP queue name and JetStream stream name and subject.
pub fn peer_queue(queue: &str, mode: Mode, delivery: DeliveryKind) -> String {
    let last = queue.rsplit(['\\', '/']).next().unwrap_or(queue);
    let clean: String = last
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut config = Config::new(mode, Scenario::SendAndPurge, queue);
    config.delivery = delivery;
    format!("mqperf_{clean}_{}", Kind::of(&config).suffix())
}

/// A connection to a peer.
#[derive(Debug)]
pub(crate) enum Conn {
    #[cfg(feature = "amqp")]
    Amqp(amqp::Amqp),
    #[cfg(feature = "nats")]
    Nats(nats::Nats),
}

macro_rules! dispatch {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            #[cfg(feature = "amqp")]
            Conn::Amqp($c) => $e,
            #[cfg(feature = "nats")]
            Conn::Nats($c) => $e,
        }
    };
}

impl Conn {
    /// Connects; the server's version when the protocol tells it.
    async fn connect(target: &Target, kind: Kind) -> Result<(Conn, Option<String>)> {
        let _ = kind;
        match target {
            Target::Mq => bail!("mq is not a peer"),
            #[cfg(feature = "amqp")]
            Target::Amqp(url) => Ok((Conn::Amqp(amqp::Amqp::connect(url, kind).await?), None)),
            #[cfg(feature = "nats")]
            Target::Nats(url) => {
                let n = nats::Nats::connect(url, kind).await?;
                let v = n.version();
                Ok((Conn::Nats(n), Some(v)))
            }
            #[allow(unreachable_patterns)]
            other => bail!(
                "this mqperf was built without the `{}` cargo feature",
                match other {
                    Target::Amqp(_) => "amqp",
                    _ => "nats",
                }
            ),
        }
    }

    async fn prepare(&self, queue: &str) -> Result<()> {
        dispatch!(self, c => c.prepare(queue).await)
    }

    async fn purge(&self, queue: &str) -> Result<()> {
        dispatch!(self, c => c.purge(queue).await)
    }

    async fn close(&self) {
        dispatch!(self, c => c.close().await)
    }

    /// Sends `count` messages of `combo` (each encoded after taking the sender's clock);
    /// returns the time until the last acknowledgement and the sampled send-to-ack latencies.
    /// `awaited` (`--send-one`): each acknowledgement awaited before the next send.
    async fn send(
        &self,
        queue: &str,
        combo: &Combo,
        count: u64,
        label: Option<&str>,
        awaited: bool,
        progress: &Progress,
    ) -> Result<(Duration, Latency)> {
        let body = || -> Result<(i64, bytes::Bytes)> {
            let ns = unix_ns();
            let (b, _) = encode(&combo.payload, combo.formatter)?;
            Ok((ns, b))
        };
        let on_progress = |n: u64| progress.inc(n);
        let mut latency = Latency::new();
        let sample = sample_every(count);
        let sample = if awaited { 1 } else { sample };
        let elapsed = dispatch!(self, c => c.send(queue, count, label, sample, awaited, &body, &mut latency, &on_progress).await)
            .with_context(|| format!("sending {} to {queue}", combo.name()))?;
        Ok((elapsed, latency))
    }

    /// Receives `count` messages of `combo`, decoding and checking each.
    async fn receive(&self, queue: &str, job: &ReceiveSpec<'_>) -> Result<Received> {
        let combo = job.combo;
        let mut service = Latency::new();
        let mut transit = Latency::new();
        let start = Instant::now();
        let mut first: Option<Instant> = None;
        let mut prev = start;
        let mut check = |i: u64, m: Incoming<'_>| -> Result<()> {
            let now = Instant::now();
            if first.is_none() {
                first = Some(now);
                if job.clock_from_first {
                    prev = now;
                }
            }
            if let Some(expected) = job.expect_label {
                if m.label != expected {
                    bail!(
                        "expected a message labelled `{expected}`, got `{}`; start SERVER and CLIENT with the same --payload, --formatter, --count and --runs",
                        m.label
                    );
                }
            }
            let got = decode(m.body, combo.formatter.body_type(), &combo.payload)
                .with_context(|| format!("message {}: cannot decode the body", i + 1))?;
            if got != combo.payload {
                bail!(
                    "message {}: the decoded {} differs from the {} that was sent",
                    i + 1,
                    got.variant_name(),
                    combo.payload.variant_name()
                );
            }
            if m.sent_ns > 0 {
                transit.record_ns(unix_ns().saturating_sub(m.sent_ns).max(0) as u64);
            }
            let done = Instant::now();
            service.record(done - prev);
            prev = done;
            if (i + 1).is_multiple_of(64) {
                job.progress.inc(64);
            }
            Ok(())
        };
        let prefetch = prefetch_for(combo.body_bytes);
        dispatch!(self, c => c.receive(queue, job.count, prefetch, job.ack_each, job.one, job.timeout, job.wait_forever_for_first, &mut check).await)
            .with_context(|| format!("receiving {} from {queue}", combo.name()))?;
        let end = Instant::now();
        job.progress.inc(job.count % 64);
        let from = if job.clock_from_first {
            first.unwrap_or(start)
        } else {
            start
        };
        Ok(Received {
            elapsed: end - from,
            verified: job.count,
            service,
            transit,
        })
    }

    /// The SERVER's reply after a run.
    async fn send_reply(&self, queue: &str, label: &str, verified: u64, l: &Latency) -> Result<()> {
        let mut body = verified.to_le_bytes().to_vec();
        body.extend_from_slice(&l.to_bytes());
        let body = bytes::Bytes::from(body);
        let make = || Ok((unix_ns(), body.clone()));
        let mut ignored = Latency::new();
        dispatch!(self, c => c.send(queue, 1, Some(label), 1, true, &make, &mut ignored, &|_| {}).await)
            .with_context(|| format!("cannot send the reply to {queue}"))?;
        Ok(())
    }

    /// The CLIENT's wait for the SERVER's reply: (messages verified, latencies).
    async fn receive_reply(
        &self,
        queue: &str,
        label: &str,
        timeout: Duration,
    ) -> Result<(u64, Latency)> {
        let mut reply = None;
        let mut check = |_: u64, m: Incoming<'_>| -> Result<()> {
            if m.label != label {
                bail!(
                    "expected the SERVER's reply `{label}` on {queue}, got `{}`; give SERVER and CLIENT the same --payload, --formatter, --count and --runs",
                    m.label
                );
            }
            if m.body.len() < 8 {
                bail!("the SERVER's reply is {} bytes, too short", m.body.len());
            }
            let verified = u64::from_le_bytes(m.body[..8].try_into().unwrap_or([0; 8]));
            let l = Latency::from_bytes(&m.body[8..])
                .map_err(anyhow::Error::msg)
                .context("cannot read the SERVER's latency histogram")?;
            reply = Some((verified, l));
            Ok(())
        };
        dispatch!(self, c => c.receive(queue, 1, 1, true, false, timeout, false, &mut check).await)
            .with_context(|| format!("no reply from the SERVER on {queue} within {timeout:?}; is `mqperf SERVER` running against the same peer with the same --payload, --formatter, --count and --runs?"))?;
        reply.context("no reply")
    }
}

/// What a receive is asked to do.
#[derive(Debug)]
struct ReceiveSpec<'a> {
    combo: &'a Combo,
    count: u64,
    timeout: Duration,
    ack_each: bool,
    /// `--receive-one`: one synchronous receive per message.
    one: bool,
    clock_from_first: bool,
    wait_forever_for_first: bool,
    expect_label: Option<&'a str>,
    progress: Progress,
}

/// How a run's receives wait and acknowledge (`--timeout`, `--ack-each`, `--receive-one`).
#[derive(Debug, Clone, Copy)]
struct ReceiveOptions {
    timeout: Duration,
    ack_each: bool,
    one: bool,
}

impl ReceiveOptions {
    fn of(config: &Config) -> ReceiveOptions {
        ReceiveOptions {
            timeout: config.timeout,
            ack_each: config.ack_each,
            one: config.receive_one,
        }
    }
}

impl<'a> ReceiveSpec<'a> {
    /// `count` messages of `combo` with any label, timed from the start of the receive.
    fn new(combo: &'a Combo, count: u64, o: ReceiveOptions, progress: Progress) -> ReceiveSpec<'a> {
        ReceiveSpec {
            combo,
            count,
            timeout: o.timeout,
            ack_each: o.ack_each,
            one: o.one,
            clock_from_first: false,
            wait_forever_for_first: false,
            expect_label: None,
            progress,
        }
    }
}

/// What a receive measured.
#[derive(Debug)]
struct Received {
    elapsed: Duration,
    verified: u64,
    service: Latency,
    transit: Latency,
}

/// Connects to the peer and disconnects: a peer that is not running fails here, before
/// anything is measured, with one line naming the URL and the error.
pub(crate) async fn check(config: &Config, target: &Target) -> Result<()> {
    let (c, _) = Conn::connect(target, Kind::of(config))
        .await
        .with_context(|| format!("cannot connect to --target {}", target.display_url()))?;
    c.close().await;
    Ok(())
}

/// Runs the plan against a peer, printing the banner and each combination's rows as mq's
/// runs do, and appending the rows to `rows`.
pub(crate) async fn run(
    config: &Config,
    target: &Target,
    plan: Vec<Planned>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows_out: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    let kind = Kind::of(config);
    let url = target.display_url();
    let (conn, version) = Conn::connect(target, kind)
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    let conn = Arc::new(conn);
    let shape = match Shape::connect(config, target, kind, conn.clone()).await {
        Ok(s) => s,
        Err(e) => {
            conn.close().await;
            return Err(e);
        }
    };
    let info = match target {
        Target::Nats(_) => TargetInfo::nats(config, version),
        _ => TargetInfo::rabbitmq(config, version),
    };
    let response = config
        .response_queue
        .as_deref()
        .map(|r| peer_queue(r, config.mode, config.delivery));
    let ctx = ReportContext {
        config: config.clone(),
        broker: url.clone(),
        broker_detail: if shape.is_spread() {
            format!(
                "(queues {} ... {}, {} connections)",
                shape.queues[0],
                shape.queues[shape.queues.len() - 1],
                shape.conns.len()
            )
        } else {
            format!(
                "(queue {}{})",
                shape.queue(),
                response
                    .as_deref()
                    .map(|r| format!(", response queue {r}"))
                    .unwrap_or_default()
            )
        },
        forward: None,
        machine: Machine::detect(),
        target: info,
    };
    let result = run_plan(
        config,
        &shape,
        &ctx,
        response.as_deref(),
        plan,
        out,
        err,
        rows_out,
    )
    .await;
    for c in &shape.conns {
        c.close().await;
    }
    result
}

/// Consumers that share one connection, as mq's runs do (`scenario::phase`).
const CONSUMERS_PER_CONNECTION: usize = 100;
/// Queues prepared (declared or created, and purged) at once.
const PREPARE_AT_ONCE: usize = 16;

/// The queues and connections of a run against a peer: one queue and one connection, or with
/// `--queues N` the queues `QUEUE-0` ... `QUEUE-<N-1>` (by the peer's names) and with
/// `--clients M` M connections, the first the run's own. As in mq's runs, message `g` goes
/// from sender `g mod M` (on connection `g mod M`) to queue `g mod N`, and consumer `k` reads
/// queue `k`, on connection `k / 100`.
#[derive(Debug)]
struct Shape {
    queues: Vec<String>,
    conns: Vec<Arc<Conn>>,
    senders: usize,
}

impl Shape {
    async fn connect(
        config: &Config,
        target: &Target,
        kind: Kind,
        first: Arc<Conn>,
    ) -> Result<Shape> {
        let queues: Vec<String> = if config.queues > 1 {
            (0..config.queues)
                .map(|k| {
                    peer_queue(
                        &format!("{}-{k}", config.queue),
                        config.mode,
                        config.delivery,
                    )
                })
                .collect()
        } else {
            vec![peer_queue(&config.queue, config.mode, config.delivery)]
        };
        let senders = config.clients.max(1) as usize;
        let wanted = senders.max(queues.len().div_ceil(CONSUMERS_PER_CONNECTION));
        let mut conns = vec![first];
        let mut failed = None;
        let mut left = wanted - 1;
        while left > 0 && failed.is_none() {
            let n = left.min(PREPARE_AT_ONCE);
            left -= n;
            let opened =
                futures::future::join_all((0..n).map(|_| Conn::connect(target, kind))).await;
            for c in opened {
                match c {
                    Ok((c, _)) => conns.push(Arc::new(c)),
                    Err(e) => failed = Some(e),
                }
            }
        }
        if let Some(e) = failed {
            for c in &conns[1..] {
                c.close().await;
            }
            return Err(e.context(format!("another connection to {}", target.display_url())));
        }
        Ok(Shape {
            queues,
            conns,
            senders,
        })
    }

    fn is_spread(&self) -> bool {
        self.queues.len() > 1 || self.conns.len() > 1
    }

    /// The run's own connection.
    fn conn(&self) -> &Arc<Conn> {
        &self.conns[0]
    }

    /// The one queue of a run without `--queues`.
    fn queue(&self) -> &str {
        &self.queues[0]
    }

    /// Declares (creates) every queue, and purges it with `purge`, a few at a time.
    async fn prepare(&self, purge: bool) -> Result<()> {
        for (i, chunk) in self.queues.chunks(PREPARE_AT_ONCE).enumerate() {
            futures::future::try_join_all(chunk.iter().enumerate().map(|(j, q)| {
                let c = self.conns[(i * PREPARE_AT_ONCE + j) % self.conns.len()].clone();
                let q = q.clone();
                async move {
                    c.prepare(&q).await?;
                    if purge {
                        c.purge(&q).await?;
                    }
                    Ok::<_, anyhow::Error>(())
                }
            }))
            .await?;
        }
        Ok(())
    }

    /// Per sender, the messages it sends to each queue (queue index, count; none empty).
    fn sender_shares(&self, count: u64) -> Vec<Vec<(usize, u64)>> {
        let (s, q) = (self.senders as u64, self.queues.len() as u64);
        let mut shares = vec![vec![0u64; self.queues.len()]; self.senders];
        for g in 0..count {
            shares[(g % s) as usize][(g % q) as usize] += 1;
        }
        shares
            .into_iter()
            .map(|per_queue| {
                per_queue
                    .into_iter()
                    .enumerate()
                    .filter(|(_, n)| *n > 0)
                    .collect()
            })
            .collect()
    }

    /// Messages queue `k` receives of `count`.
    fn queue_share(&self, count: u64, k: usize) -> u64 {
        let q = self.queues.len() as u64;
        count / q + u64::from((k as u64) < count % q)
    }

    /// Every sender's share sent at once, each (sender, queue) pair from a task of its own;
    /// the time until the last is acknowledged, and all sampled latencies.
    async fn send_all(
        &self,
        combo: &Arc<Combo>,
        count: u64,
        awaited: bool,
        progress: &Progress,
    ) -> Result<(Duration, Latency)> {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (s, share) in self.sender_shares(count).into_iter().enumerate() {
            for (k, n) in share {
                let conn = self.conns[s].clone();
                let (queue, combo, progress) =
                    (self.queues[k].clone(), combo.clone(), progress.clone());
                tasks.push(tokio::spawn(async move {
                    conn.send(&queue, &combo, n, None, awaited, &progress).await
                }));
            }
        }
        let mut latency = Latency::new();
        for t in tasks {
            let (_, l) = t.await.context("a sender task panicked")??;
            latency.merge(&l);
        }
        Ok((start.elapsed(), latency))
    }

    /// One consumer per queue, all at once, each receiving its queue's share; the time until
    /// the last is done, messages per consumer, and the merged latencies.
    async fn receive_all(
        &self,
        combo: &Arc<Combo>,
        count: u64,
        config: &Config,
        progress: &Progress,
    ) -> Result<(Duration, Vec<u64>, Latency, Latency)> {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (k, queue) in self.queues.iter().enumerate() {
            let conn = self.conns[(k / CONSUMERS_PER_CONNECTION) % self.conns.len()].clone();
            let (queue, combo, progress) = (queue.clone(), combo.clone(), progress.clone());
            let (n, options) = (self.queue_share(count, k), ReceiveOptions::of(config));
            tasks.push(tokio::spawn(async move {
                let spec = ReceiveSpec::new(&combo, n, options, progress);
                conn.receive(&queue, &spec).await
            }));
        }
        let (mut counts, mut service, mut transit) = (Vec::new(), Latency::new(), Latency::new());
        for t in tasks {
            let r = t.await.context("a consumer task panicked")??;
            counts.push(r.verified);
            service.merge(&r.service);
            transit.merge(&r.transit);
        }
        Ok((start.elapsed(), counts, service, transit))
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_plan(
    config: &Config,
    shape: &Shape,
    ctx: &ReportContext,
    response: Option<&str>,
    plan: Vec<Planned>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows_out: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    if config.json {
        report::write_banner(err, ctx)?;
        err.flush()?;
    } else {
        report::write_banner(out, ctx)?;
        report::write_table_header(out)?;
        out.flush()?;
    }
    let conn = shape.conn();
    shape
        .prepare(matches!(
            config.scenario,
            Scenario::SendAndPurge | Scenario::SendAndReceive
        ))
        .await?;
    if let Some(r) = response {
        conn.prepare(r).await?;
        if config.scenario == Scenario::Client {
            conn.purge(r).await?;
        }
    }
    let progress = if config.progress {
        Progress::bar(progress_per_run(config) * config.runs as u64 * plan.len() as u64)
    } else {
        Progress::hidden()
    };
    let mut results = Vec::new();
    let mut server_started = false;
    for p in plan {
        let result = match p {
            Planned::Skip {
                payload,
                formatter,
                body_bytes,
                reason,
            } => ComboResult {
                payload,
                formatter: formatter.name(),
                body_bytes,
                outcome: Outcome::Skipped {
                    reason,
                    ops: ops(config),
                },
            },
            Planned::Run(combo) => {
                let measured = measure(
                    config,
                    shape,
                    response,
                    &combo,
                    &progress,
                    &mut server_started,
                )
                .await
                .with_context(|| combo.name())?;
                ComboResult {
                    payload: combo.kind.name(),
                    formatter: combo.formatter.name(),
                    body_bytes: Some(combo.body_bytes),
                    outcome: Outcome::Measured(measured),
                }
            }
        };
        let rows = report::rows(ctx, &result);
        progress.suspend(|| -> std::io::Result<()> {
            if config.json {
                report::write_json_rows(out, &rows)?;
            } else {
                report::write_table_rows(out, &rows)?;
            }
            out.flush()
        })?;
        rows_out.extend(rows);
        results.push(result);
    }
    progress.finish();
    Ok(results)
}

async fn measure(
    config: &Config,
    shape: &Shape,
    response: Option<&str>,
    combo: &Arc<Combo>,
    progress: &Progress,
    server_started: &mut bool,
) -> Result<Vec<OpResult>> {
    let count = config.count;
    let awaited = config.send_one;
    let spec = |clock_from_first, wait_forever_for_first| ReceiveSpec {
        combo,
        count,
        timeout: config.timeout,
        ack_each: config.ack_each,
        one: config.receive_one,
        clock_from_first,
        wait_forever_for_first,
        expect_label: None,
        progress: progress.clone(),
    };
    let message_label = |run: u32| format!("mqperf {} run {run}", combo.name());
    let reply_label = |run: u32| format!("mqperf reply {} run {run}", combo.name());
    let mut send = OpResult::new(Op::Send);
    let mut receive = OpResult::new(Op::Receive);
    let mut e2e = OpResult::new(Op::E2e);
    let (conn, queue) = (shape.conn(), shape.queue());
    for run in 1..=config.runs {
        match config.scenario {
            Scenario::SendAndPurge => {
                let cpu = CpuTimes::now();
                let (elapsed, l) = conn
                    .send(queue, combo, count, None, awaited, progress)
                    .await?;
                send.add_steal(cpu, CpuTimes::now());
                send.add_run(count, elapsed, &l);
                conn.purge(queue).await?;
            }
            Scenario::SendAndReceive => {
                let cpu = CpuTimes::now();
                let (elapsed, l) = if shape.is_spread() {
                    shape.send_all(combo, count, awaited, progress).await?
                } else {
                    conn.send(queue, combo, count, None, awaited, progress)
                        .await?
                };
                send.add_steal(cpu, CpuTimes::now());
                send.add_run(count, elapsed, &l);
                let cpu = CpuTimes::now();
                if shape.is_spread() {
                    let (elapsed, counts, service, _) =
                        shape.receive_all(combo, count, config, progress).await?;
                    receive.add_steal(cpu, CpuTimes::now());
                    receive.add_per_consumer(&counts);
                    receive.add_run(count, elapsed, &service);
                } else {
                    let r = conn.receive(queue, &spec(false, false)).await?;
                    receive.add_steal(cpu, CpuTimes::now());
                    receive.add_run(r.verified, r.elapsed, &r.service);
                }

                // End to end: every consumer and every sender at once, each a task of its own.
                let cpu = CpuTimes::now();
                let start = Instant::now();
                let (r, s) = tokio::join!(
                    shape.receive_all(combo, count, config, progress),
                    shape.send_all(combo, count, awaited, progress)
                );
                let elapsed = start.elapsed();
                e2e.add_steal(cpu, CpuTimes::now());
                let (_, counts, _, transit) = r?;
                s?;
                if shape.is_spread() {
                    e2e.add_per_consumer(&counts);
                }
                e2e.add_run(count, elapsed, &transit);
            }
            Scenario::Client => {
                let Some(response) = response else {
                    bail!("CLIENT needs a response queue")
                };
                let start = Instant::now();
                let label = message_label(run);
                let (elapsed, l) = conn
                    .send(queue, combo, count, Some(&label), awaited, progress)
                    .await?;
                send.add_run(count, elapsed, &l);
                let (verified, transit) = conn
                    .receive_reply(response, &reply_label(run), config.timeout)
                    .await?;
                if verified != count {
                    bail!("the SERVER verified {verified} of the {count} messages of run {run}");
                }
                e2e.add_run(verified, start.elapsed(), &transit);
            }
            Scenario::Server => {
                let Some(response) = response else {
                    bail!("SERVER needs a response queue")
                };
                let label = message_label(run);
                let job = ReceiveSpec {
                    expect_label: Some(&label),
                    ..spec(true, !*server_started)
                };
                let r = conn.receive(queue, &job).await?;
                receive.add_run(r.verified, r.elapsed, &r.service);
                *server_started = true;
                conn.send_reply(response, &reply_label(run), r.verified, &r.transit)
                    .await?;
            }
        }
    }
    Ok(match config.scenario {
        Scenario::SendAndPurge => vec![send],
        Scenario::SendAndReceive => vec![send, receive, e2e],
        Scenario::Client => vec![send, e2e],
        Scenario::Server => vec![receive],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(senders: usize, queues: usize) -> Shape {
        Shape {
            queues: (0..queues).map(|k| format!("q{k}")).collect(),
            conns: Vec::new(),
            senders,
        }
    }

    #[test]
    fn senders_and_queues_share_the_count_as_mq_does() {
        // The fan-out shape: each of 200 senders sends to 5 queues, 200 messages each.
        let s = shape(200, 1000);
        let shares = s.sender_shares(200_000);
        assert_eq!(shares.len(), 200);
        for (i, share) in shares.iter().enumerate() {
            let queues: Vec<usize> = share.iter().map(|(k, _)| *k).collect();
            assert_eq!(queues, (0..5).map(|j| i + 200 * j).collect::<Vec<_>>());
            assert!(share.iter().all(|(_, n)| *n == 200));
        }
        assert!((0..1000).all(|k| s.queue_share(200_000, k) == 200));
        // Uneven: message g from sender g mod 3 to queue g mod 4; every message once.
        let s = shape(3, 4);
        let shares = s.sender_shares(30);
        let mut per_queue = [0u64; 4];
        for share in &shares {
            for (k, n) in share {
                per_queue[*k] += n;
            }
        }
        assert_eq!(per_queue, [8, 8, 7, 7]);
        assert_eq!(
            (0..4).map(|k| s.queue_share(30, k)).collect::<Vec<_>>(),
            per_queue
        );
        assert_eq!(shares.iter().flatten().map(|(_, n)| n).sum::<u64>(), 30);
        // More senders than messages: the idle ones send nothing.
        let s = shape(5, 1);
        assert_eq!(
            s.sender_shares(3),
            vec![vec![(0, 1)], vec![(0, 1)], vec![(0, 1)], vec![], vec![]]
        );
    }

    #[test]
    fn peer_queue_names() {
        assert_eq!(
            peer_queue(r".\private$\perf", Mode::Notx, DeliveryKind::Express),
            "mqperf_perf_express"
        );
        assert_eq!(
            peer_queue(r".\private$\my q.1", Mode::Tx, DeliveryKind::Express),
            "mqperf_my_q_1_tx"
        );
        assert_eq!(
            peer_queue("plain", Mode::Notx, DeliveryKind::Recoverable),
            "mqperf_plain_recoverable"
        );
    }
}
