//! The workload: writers and receivers that run through the `mq-client` crate while faults
//! strike, recording every operation and its outcome in the [`History`].
//!
//! Queues (history names; on broker A unless said): `express`, `recoverable`, `multi` (the
//! second element of multiple-element sends), `tx1`, `txout` (filled by movers from `tx1`),
//! `tx2`, `purge`; with two brokers, `remote` and `remote-tx` on broker B, sent to through A
//! (store-and-forward).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mq_client::{Client, ConsumerOptions, Error, Message, QueueOptions, SenderOptions};
use tokio::task::JoinHandle;

use crate::faults::worker_rng;
use crate::history::{Durability, Event, History, Item, Outcome, Tag};

/// Prefetch of the streaming receivers (the checker's redelivery window).
pub const PREFETCH: u32 = 64;

/// A queue of the workload: its history name, the broker holding it, transactional or not.
#[derive(Debug, Clone, Copy)]
pub struct QueueSpec {
    pub name: &'static str,
    pub broker: usize,
    pub transactional: bool,
}

/// Every queue the workload uses; those on broker 1 only with two brokers.
pub const QUEUES: [QueueSpec; 9] = [
    q("express", 0, false),
    q("recoverable", 0, false),
    q("multi", 0, false),
    q("tx1", 0, true),
    q("txout", 0, true),
    q("tx2", 0, true),
    q("purge", 0, false),
    q("remote", 1, false),
    q("remote-tx", 1, true),
];

const fn q(name: &'static str, broker: usize, transactional: bool) -> QueueSpec {
    QueueSpec {
        name,
        broker,
        transactional,
    }
}

/// The local path name of a history queue name.
pub fn path(name: &str) -> String {
    format!(r".\private$\mqt-{name}")
}

/// What every worker shares.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub history: History,
    /// Broker URLs, A first.
    pub urls: Vec<String>,
    /// `127.0.0.1:<port>` of broker B, when there are two.
    pub remote_addr: Option<String>,
    pub stop: Arc<AtomicBool>,
    /// Longest wait for any one operation before its outcome counts as unknown.
    pub op_timeout: Duration,
    pub seed: u64,
}

impl Ctx {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    async fn connect(&self, broker: usize) -> Option<Client> {
        while !self.stopping() {
            if let Ok(Ok(c)) =
                tokio::time::timeout(self.op_timeout, Client::connect(self.urls[broker].clone()))
                    .await
            {
                return Some(c);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

/// What an error says about an operation's outcome: a refusal means it did not happen; a
/// broken connection, a timeout or anything unexpected means it may have.
pub fn outcome_of(e: &Error) -> Outcome {
    match e {
        Error::InvalidName(_)
        | Error::InvalidArgument(_)
        | Error::NotFound(_)
        | Error::AlreadyExists(_)
        | Error::QuotaExceeded(_)
        | Error::FailedPrecondition(_)
        | Error::Format(_) => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}

/// Creates every queue on the brokers there are (an existing one is fine).
pub async fn create_queues(ctx: &Ctx) -> anyhow::Result<()> {
    for spec in QUEUES.iter().filter(|s| s.broker < ctx.urls.len()) {
        let client = Client::connect(ctx.urls[spec.broker].clone()).await?;
        match client
            .create_queue(
                &path(spec.name),
                QueueOptions {
                    transactional: spec.transactional,
                    ..QueueOptions::default()
                },
            )
            .await
        {
            Ok(_) | Err(Error::AlreadyExists(_)) => {}
            Err(e) => anyhow::bail!("create {}: {e}", spec.name),
        }
    }
    Ok(())
}

/// Starts every worker; they run until `ctx.stop` is set.
pub fn spawn_all(ctx: &Ctx) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let local = |n: &str| path(n);
    let multi_nontx =
        r"FORMATNAME:DIRECT=OS:.\private$\mqt-recoverable,DIRECT=OS:.\private$\mqt-multi"
            .to_string();
    let multi_tx = r"FORMATNAME:DIRECT=OS:.\private$\mqt-tx1,DIRECT=OS:.\private$\mqt-tx2";
    let c = ctx.clone();
    tasks.push(tokio::spawn(pipelined(
        c,
        1,
        local("express"),
        "express",
        0,
        Durability::Express,
    )));
    let c = ctx.clone();
    tasks.push(tokio::spawn(pipelined(
        c,
        2,
        local("recoverable"),
        "recoverable",
        0,
        Durability::Recoverable,
    )));
    tasks.push(tokio::spawn(one_at_a_time(ctx.clone(), 3, multi_nontx)));
    let c = ctx.clone();
    tasks.push(tokio::spawn(pipelined(
        c,
        4,
        local("tx1"),
        "tx1",
        0,
        Durability::Transactional,
    )));
    tasks.push(tokio::spawn(transactions(
        ctx.clone(),
        5,
        multi_tx.to_string(),
    )));
    tasks.push(tokio::spawn(tx_receiver(
        ctx.clone(),
        105,
        "tx1",
        Some("txout"),
    )));
    tasks.push(tokio::spawn(tx_receiver(ctx.clone(), 106, "tx2", None)));
    tasks.push(tokio::spawn(consumer(ctx.clone(), 107, "express")));
    tasks.push(tokio::spawn(consumer(ctx.clone(), 108, "recoverable")));
    tasks.push(tokio::spawn(purger(ctx.clone(), 6)));
    if let Some(b) = &ctx.remote_addr {
        let c = ctx.clone();
        tasks.push(tokio::spawn(pipelined(
            c,
            7,
            format!(r"DIRECT=TCP:{b}\private$\mqt-remote"),
            "remote",
            1,
            Durability::Recoverable,
        )));
        let c = ctx.clone();
        tasks.push(tokio::spawn(pipelined(
            c,
            8,
            format!(r"DIRECT=TCP:{b}\private$\mqt-remote-tx"),
            "remote-tx",
            1,
            Durability::Transactional,
        )));
    }
    tasks
}

fn message(tag: Tag, d: Durability, rng: &mut fastrand::Rng) -> Message {
    let m = Message::new(tag.body(rng.usize(0..200)));
    match d {
        Durability::Express => m,
        _ => m.recoverable(true),
    }
}

fn items(queues: &[&str], tag: Tag) -> Vec<Item> {
    queues
        .iter()
        .map(|q| Item {
            queue: q.to_string(),
            tag,
        })
        .collect()
}

/// Between two operations of a writer: keeps the rate (and the history's size) moderate on a
/// shared machine, and lets faults land between operations as well as inside them.
fn pause(rng: &mut fastrand::Rng) -> Duration {
    Duration::from_millis(rng.u64(2..=40))
}

/// A pipelined [`mq_client::Sender`]: batches of 1..=32 messages, each with its receipt.
/// `history_queue` is where the message ends up; `broker` holds it.
async fn pipelined(
    ctx: Ctx,
    writer: u32,
    destination: String,
    history_queue: &'static str,
    broker: usize,
    durability: Durability,
) {
    let mut rng = worker_rng(ctx.seed, writer as u64);
    let name = format!("pipelined-{history_queue}");
    let mut seq = 0u64;
    let options = SenderOptions {
        transactional: durability == Durability::Transactional,
        ..SenderOptions::default()
    };
    'connect: while let Some(client) = ctx.connect(0).await {
        let sender = match tokio::time::timeout(
            ctx.op_timeout,
            client.sender(&destination, options.clone()),
        )
        .await
        {
            Ok(Ok(s)) => s,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while !ctx.stopping() {
            let n = rng.usize(1..=16);
            let mut pending = Vec::with_capacity(n);
            for _ in 0..n {
                seq += 1;
                let tag = Tag { writer, seq };
                let t = ctx.history.now();
                match sender
                    .send_with_receipt(message(tag, durability, &mut rng))
                    .await
                {
                    Ok(r) => pending.push((tag, t, r)),
                    Err(e) => {
                        // Never handed to the stream: not sent.
                        ctx.history.push(Event::Send {
                            t,
                            t_end: ctx.history.now(),
                            worker: name.clone(),
                            broker,
                            durability,
                            items: items(&[history_queue], tag),
                            outcome: Outcome::Failed,
                            aborted: false,
                            error: format!("not submitted: {e}"),
                        });
                        break;
                    }
                }
            }
            let deadline = tokio::time::Instant::now() + ctx.op_timeout;
            let mut broken = pending.len() < n;
            for (tag, t, receipt) in pending {
                let (outcome, error) = match tokio::time::timeout_at(deadline, receipt).await {
                    Ok(Ok(_)) => (Outcome::Ok, String::new()),
                    Ok(Err(e)) => {
                        broken = true;
                        (outcome_of(&e), e.to_string())
                    }
                    Err(_) => {
                        broken = true;
                        (Outcome::Unknown, "no acknowledgement in time".to_string())
                    }
                };
                ctx.history.push(Event::Send {
                    t,
                    t_end: ctx.history.now(),
                    worker: name.clone(),
                    broker,
                    durability,
                    items: items(&[history_queue], tag),
                    outcome,
                    aborted: false,
                    error,
                });
            }
            if broken {
                continue 'connect;
            }
            tokio::time::sleep(pause(&mut rng)).await;
        }
        let _ = tokio::time::timeout(ctx.op_timeout, sender.close()).await;
        break;
    }
}

/// One message at a time (`Queue::send`, `Queue::send_tx`: its own stream, wait for the
/// acknowledgement): recoverable to `recoverable`, every fifth one to a multiple-element name
/// (`recoverable` and `multi`), express to `express`, single-message transactions to `tx2`.
async fn one_at_a_time(ctx: Ctx, writer: u32, multi: String) {
    let mut rng = worker_rng(ctx.seed, writer as u64);
    let mut seq = 0u64;
    while let Some(client) = ctx.connect(0).await {
        while !ctx.stopping() {
            seq += 1;
            let tag = Tag { writer, seq };
            let (dest, queues, durability): (String, &[&str], _) = match seq % 5 {
                0 => (
                    multi.clone(),
                    &["recoverable", "multi"],
                    Durability::Recoverable,
                ),
                1 => (path("express"), &["express"], Durability::Express),
                2 => (path("tx2"), &["tx2"], Durability::Transactional),
                _ => (
                    path("recoverable"),
                    &["recoverable"],
                    Durability::Recoverable,
                ),
            };
            let t = ctx.history.now();
            let m = message(tag, durability, &mut rng);
            let r = match client.queue(&dest) {
                // A single-message transaction (`Queue::send_tx`) for the transactional queue.
                Ok(q) if durability == Durability::Transactional => {
                    tokio::time::timeout(ctx.op_timeout, q.send_tx(m)).await
                }
                Ok(q) => tokio::time::timeout(ctx.op_timeout, q.send(m)).await,
                Err(e) => Ok(Err(e)),
            };
            let (outcome, error) = match &r {
                Ok(Ok(_)) => (Outcome::Ok, String::new()),
                Ok(Err(e)) => (outcome_of(e), e.to_string()),
                Err(_) => (Outcome::Unknown, "no acknowledgement in time".to_string()),
            };
            ctx.history.push(Event::Send {
                t,
                t_end: ctx.history.now(),
                worker: "one-at-a-time".into(),
                broker: 0,
                durability,
                items: items(queues, tag),
                outcome,
                aborted: false,
                error,
            });
            if outcome != Outcome::Ok {
                break;
            }
            tokio::time::sleep(pause(&mut rng)).await;
        }
        if ctx.stopping() {
            break;
        }
    }
}

/// Transactions of 1..=3 sends to `tx1`, `tx2` or both (a multiple-element name), committed,
/// or aborted on purpose one time in six.
async fn transactions(ctx: Ctx, writer: u32, multi: String) {
    let mut rng = worker_rng(ctx.seed, writer as u64);
    let mut seq = 0u64;
    while let Some(client) = ctx.connect(0).await {
        while !ctx.stopping() {
            let t = ctx.history.now();
            let mut all = Vec::new();
            let begun = tokio::time::timeout(ctx.op_timeout, client.begin()).await;
            let Ok(Ok(mut tx)) = begun else { break };
            for _ in 0..rng.usize(1..=3) {
                seq += 1;
                let tag = Tag { writer, seq };
                let (dest, queues): (String, &[&str]) = match rng.u32(0..3) {
                    0 => (path("tx1"), &["tx1"]),
                    1 => (path("tx2"), &["tx2"]),
                    _ => (multi.clone(), &["tx1", "tx2"]),
                };
                all.extend(items(queues, tag));
                let _ = tx.send(&dest, message(tag, Durability::Transactional, &mut rng));
            }
            let abort = rng.u32(0..6) == 0;
            let (outcome, error) = if abort {
                match tokio::time::timeout(ctx.op_timeout, tx.abort()).await {
                    Ok(Ok(())) => (Outcome::Ok, String::new()),
                    Ok(Err(e)) => (outcome_of(&e), e.to_string()),
                    Err(_) => (Outcome::Unknown, "no answer in time".to_string()),
                }
            } else {
                match tokio::time::timeout(ctx.op_timeout, tx.commit()).await {
                    Ok(Ok(_)) => (Outcome::Ok, String::new()),
                    Ok(Err(e)) => (outcome_of(&e), e.to_string()),
                    Err(_) => (Outcome::Unknown, "no answer in time".to_string()),
                }
            };
            ctx.history.push(Event::Send {
                t,
                t_end: ctx.history.now(),
                worker: "transactions".into(),
                broker: 0,
                durability: Durability::Transactional,
                items: all,
                outcome,
                aborted: abort,
                error,
            });
            if outcome != Outcome::Ok {
                break;
            }
            tokio::time::sleep(pause(&mut rng)).await;
        }
        if ctx.stopping() {
            break;
        }
    }
}

/// Transactional receives from `from`; with `to`, the same body is sent there in the same
/// transaction (a move). One in four is aborted on purpose.
async fn tx_receiver(ctx: Ctx, id: u64, from: &'static str, to: Option<&'static str>) {
    let mut rng = worker_rng(ctx.seed, id);
    let worker = match to {
        Some(to) => format!("move-{from}-{to}"),
        None => format!("tx-receive-{from}"),
    };
    while let Some(client) = ctx.connect(0).await {
        while !ctx.stopping() {
            let t = ctx.history.now();
            let Ok(Ok(mut tx)) = tokio::time::timeout(ctx.op_timeout, client.begin()).await else {
                break;
            };
            let got = tokio::time::timeout(
                ctx.op_timeout,
                tx.receive(path(from), Duration::from_millis(200)),
            )
            .await;
            let m = match got {
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => {
                    let _ = tokio::time::timeout(ctx.op_timeout, tx.abort()).await;
                    continue;
                }
                // Nothing committed: the broker aborts the transaction when the stream ends.
                _ => break,
            };
            let Some(tag) = Tag::parse(&m.body) else {
                // Not a harness body: leave it (the final drain reports it as a phantom).
                let _ = tokio::time::timeout(ctx.op_timeout, tx.abort()).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let received = items(&[from], tag);
            let mut sent = Vec::new();
            if let Some(to) = to {
                let _ = tx.send(path(to), Message::new(m.body.clone()));
                sent = items(&[to], tag);
            }
            let abort = rng.u32(0..4) == 0;
            let r = if abort {
                tokio::time::timeout(ctx.op_timeout, tx.abort()).await
            } else {
                tokio::time::timeout(ctx.op_timeout, async { tx.commit().await.map(|_| ()) }).await
            };
            let (outcome, error) = match r {
                Ok(Ok(())) => (Outcome::Ok, String::new()),
                Ok(Err(e)) => (outcome_of(&e), e.to_string()),
                Err(_) => (Outcome::Unknown, "no answer in time".to_string()),
            };
            ctx.history.push(Event::TxReceive {
                t,
                t_end: ctx.history.now(),
                worker: worker.clone(),
                received,
                sent,
                aborted: abort,
                outcome,
                error,
            });
            if outcome != Outcome::Ok {
                break;
            }
        }
        if ctx.stopping() {
            break;
        }
        ctx.history.push(Event::Reconnect {
            t: ctx.history.now(),
            worker: worker.clone(),
        });
    }
}

/// A streaming receiver ([`mq_client::Consumer`]) with acknowledgements. It reads in bursts
/// (up to 300 messages, then a pause of up to a second) so messages also wait in the queue
/// when a fault strikes.
async fn consumer(ctx: Ctx, id: u64, queue: &'static str) {
    let mut rng = worker_rng(ctx.seed, id);
    let mut burst = 0u32;
    let worker = format!("consumer-{queue}");
    while let Some(client) = ctx.connect(0).await {
        let opened = match client.queue(&path(queue)) {
            Ok(q) => {
                tokio::time::timeout(
                    ctx.op_timeout,
                    q.consumer(ConsumerOptions {
                        prefetch: PREFETCH,
                        limit: None,
                    }),
                )
                .await
            }
            Err(_) => return,
        };
        let Ok(Ok(mut c)) = opened else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut broken = false;
        while !ctx.stopping() {
            match tokio::time::timeout(ctx.op_timeout, c.next(Duration::from_millis(200))).await {
                Ok(Ok(Some(m))) => {
                    if let Some(tag) = Tag::parse(&m.body) {
                        ctx.history.push(Event::Deliver {
                            t: ctx.history.now(),
                            worker: worker.clone(),
                            queue: queue.to_string(),
                            tag,
                        });
                    }
                    burst += 1;
                    if burst >= 300 {
                        burst = 0;
                        // Acknowledge what was read, then wait (the queue fills meanwhile).
                        let _ = tokio::time::timeout(ctx.op_timeout, c.ack()).await;
                        tokio::time::sleep(Duration::from_millis(rng.u64(0..=1000))).await;
                    }
                }
                Ok(Ok(None)) => {}
                _ => {
                    broken = true;
                    break;
                }
            }
        }
        if !broken {
            let _ = tokio::time::timeout(ctx.op_timeout, c.close()).await;
            break;
        }
        ctx.history.push(Event::Reconnect {
            t: ctx.history.now(),
            worker: worker.clone(),
        });
    }
}

/// Recoverable sends to `purge`, one at a time, and a purge now and then.
async fn purger(ctx: Ctx, writer: u32) {
    let mut rng = worker_rng(ctx.seed, writer as u64);
    let mut seq = 0u64;
    while let Some(client) = ctx.connect(0).await {
        let Ok(queue) = client.queue(&path("purge")) else {
            return;
        };
        while !ctx.stopping() {
            let outcome = if rng.u32(0..8) == 0 {
                let t = ctx.history.now();
                let r = tokio::time::timeout(ctx.op_timeout, queue.purge()).await;
                let (outcome, purged) = match r {
                    Ok(Ok(n)) => (Outcome::Ok, n),
                    Ok(Err(e)) => (outcome_of(&e), 0),
                    Err(_) => (Outcome::Unknown, 0),
                };
                ctx.history.push(Event::Purge {
                    t,
                    t_end: ctx.history.now(),
                    worker: "purger".into(),
                    queue: "purge".into(),
                    outcome,
                    purged,
                });
                outcome
            } else {
                seq += 1;
                let tag = Tag { writer, seq };
                let t = ctx.history.now();
                let r = tokio::time::timeout(
                    ctx.op_timeout,
                    queue.send(message(tag, Durability::Recoverable, &mut rng)),
                )
                .await;
                let (outcome, error) = match &r {
                    Ok(Ok(_)) => (Outcome::Ok, String::new()),
                    Ok(Err(e)) => (outcome_of(e), e.to_string()),
                    Err(_) => (Outcome::Unknown, "no acknowledgement in time".to_string()),
                };
                ctx.history.push(Event::Send {
                    t,
                    t_end: ctx.history.now(),
                    worker: "purger".into(),
                    broker: 0,
                    durability: Durability::Recoverable,
                    items: items(&["purge"], tag),
                    outcome,
                    aborted: false,
                    error,
                });
                outcome
            };
            if outcome != Outcome::Ok {
                break;
            }
            tokio::time::sleep(pause(&mut rng)).await;
        }
        if ctx.stopping() {
            break;
        }
    }
}
