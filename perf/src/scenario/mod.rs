//! The four scenarios and what they share: the plan (which (payload, formatter) combinations
//! run, which are skipped and why), queue set-up, and the dispatch to one file per scenario.
//!
//! - `send_and_purge`: SENDANDPURGE.
//! - `send_and_receive`: SENDANDRECEIVE.
//! - `server`, `client`: the two halves of SERVER/CLIENT; `protocol` is what they agree on.
//! - `phase`: the timed building blocks ([`phase::SendJob`], [`phase::ReceiveJob`]).

mod client;
mod phase;
mod pool;
mod protocol;
mod send_and_purge;
mod send_and_receive;
mod server;
mod setup;

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use mq_client::{Client, Queue, QueueOptions};

use crate::config::{Config, Mode, Scenario};
use crate::forward::{self, BrokerAddr, Route};
use crate::measurement::{ComboResult, Op, Outcome};
use crate::payload::{encode, FormatterKind, Payload, PayloadKind};
use crate::progress::Progress;

pub(crate) use phase::unix_ns;
pub use phase::{prefetch_for, sample_every};

/// One (payload, formatter) to run: the payload built once, its encoded size known.
#[derive(Debug)]
pub struct Combo {
    pub kind: PayloadKind,
    pub payload: Payload,
    pub formatter: FormatterKind,
    /// Size of one encoded body (every message of a run carries the same bytes).
    pub body_bytes: usize,
}

impl Combo {
    /// `"string:1000/raw"`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.kind.name(), self.formatter.name())
    }
}

/// A combination to run, or one to report as skipped.
#[derive(Debug)]
pub enum Planned {
    Run(Arc<Combo>),
    Skip {
        payload: String,
        formatter: FormatterKind,
        body_bytes: Option<usize>,
        reason: String,
    },
}

/// Every (payload, formatter) of the configuration, payload-major. A combination is skipped,
/// with its reason, when the formatter cannot carry the payload or the body is larger than
/// `max_body_bytes` (the broker's limit). Any other encoding failure is an error.
pub fn plan(config: &Config, max_body_bytes: usize) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    for kind in &config.payloads {
        let payload = Payload::make(kind);
        for &formatter in &config.formatters {
            match encode(&payload, formatter) {
                Ok((body, _)) if body.len() > max_body_bytes => out.push(Planned::Skip {
                    payload: kind.name(),
                    formatter,
                    body_bytes: Some(body.len()),
                    reason: format!(
                        "the {} body is {} bytes; the broker accepts at most {} bytes",
                        formatter.name(),
                        body.len(),
                        max_body_bytes
                    ),
                }),
                Ok((body, _)) => out.push(Planned::Run(Arc::new(Combo {
                    kind: kind.clone(),
                    payload: payload.clone(),
                    formatter,
                    body_bytes: body.len(),
                }))),
                Err(e) if e.is_unsupported() => out.push(Planned::Skip {
                    payload: kind.name(),
                    formatter,
                    body_bytes: None,
                    reason: e.to_string(),
                }),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot encode {} with {}", kind.name(), formatter.name())
                    })
                }
            }
        }
    }
    Ok(out)
}

/// The largest body of the plan (0 if nothing runs).
pub fn largest_body(plan: &[Planned]) -> usize {
    plan.iter()
        .filter_map(|p| match p {
            Planned::Run(c) => Some(c.body_bytes),
            Planned::Skip { .. } => None,
        })
        .max()
        .unwrap_or(0)
}

/// The operations a configuration times, in report order.
pub fn ops(config: &Config) -> Vec<Op> {
    if config.backlog.is_some() && config.scenario == Scenario::SendAndReceive {
        return vec![Op::Fill, Op::Drain];
    }
    match config.scenario {
        Scenario::SendAndPurge => vec![Op::Send],
        Scenario::SendAndReceive => vec![Op::Send, Op::Receive, Op::E2e],
        Scenario::Server => vec![Op::Receive],
        Scenario::Client => vec![Op::Send, Op::E2e],
    }
}

/// Messages the progress bar counts per run of one combination (a message sent and received
/// counts twice).
pub fn progress_per_run(config: &Config) -> u64 {
    let phases = match config.scenario {
        Scenario::SendAndPurge | Scenario::Server | Scenario::Client => 1,
        // fill and drain
        Scenario::SendAndReceive if config.backlog.is_some() => {
            return 2 * config.backlog.unwrap_or(0)
        }
        // send, receive, and the e2e phase's send and receive.
        Scenario::SendAndReceive => 4,
    };
    phases * config.count
}

/// The brokers a benchmark talks to.
#[derive(Debug, Clone)]
pub struct Brokers {
    /// Where every send goes (broker A with `--forward`).
    pub send: Client,
    /// Where the queue lives and every receive happens (broker B with `--forward`; else the same
    /// broker as `send`).
    pub receive: Client,
    /// With `--forward`: A and B.
    pub route: Option<Route>,
}

/// With `--forward`: what waiting for the forwarding needs.
#[derive(Debug, Clone)]
pub(crate) struct Forwarding {
    /// Broker A.
    pub a: Client,
    /// Broker B, as A's outgoing queue for it is named.
    pub b: BrokerAddr,
}

/// What every scenario needs.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub config: Config,
    /// The queues as sends name them: on the sending broker, or with `--forward` B's queues
    /// by their remote format names, through A (`--queues`: several).
    pub send_queues: Vec<Queue>,
    /// The first of `queues` (SERVER and CLIENT have one).
    pub queue: Queue,
    /// The queues as receives and purges name them (local; on B with `--forward`).
    pub queues: Vec<Queue>,
    pub forwarding: Option<Forwarding>,
    pub progress: Progress,
    /// Connections of concurrent senders (to the sending broker), kept across phases.
    pub send_pool: Arc<pool::Pool>,
    /// Extra connections of many consumers (to the receiving broker), kept across phases.
    pub receive_pool: Arc<pool::Pool>,
}

impl Ctx {
    /// A [`phase::SendJob`] of `count` messages of `combo` to the queue, as the mode says
    /// (transactional for TX), with `clients` concurrent senders.
    pub fn send_job(
        &self,
        combo: &Arc<Combo>,
        label: Option<String>,
        clients: u32,
    ) -> phase::SendJob {
        phase::SendJob {
            queues: self.send_queues.clone(),
            combo: combo.clone(),
            count: self.config.count,
            rate: self.config.rate,
            delivery: self.config.send_delivery(),
            transactional: self.config.mode == Mode::Tx,
            one_at_a_time: self.config.one_at_a_time,
            send_one: self.config.send_one,
            clients,
            pool: self.send_pool.clone(),
            label,
            progress: self.progress.clone(),
        }
    }

    /// The broker's resident memory now: `--broker-pid`'s, or this process's with embedded
    /// brokers; `None` against a `--broker` without `--broker-pid`.
    pub fn rss(&self) -> Option<u64> {
        match (self.config.broker_pid, &self.config.broker) {
            (Some(pid), _) => crate::rss::rss_bytes(Some(pid)),
            (None, None) => crate::rss::rss_bytes(None),
            (None, Some(_)) => None,
        }
    }

    /// Purges every queue (not timed; many at once).
    pub async fn purge_all(&self) -> Result<()> {
        setup::purge_all(&self.queues).await
    }

    /// With `--forward`: waits until A has handed every message to B (A's outgoing queue for B
    /// is empty, every message acknowledged by B); not timed. Fails when nothing moves for the
    /// `--timeout`. Without `--forward`: nothing to wait for.
    pub async fn settle(&self) -> Result<()> {
        match &self.forwarding {
            Some(f) => forward::wait_outgoing_empty(&f.a, &f.b, self.config.timeout).await,
            None => Ok(()),
        }
    }
}

/// Runs the plan against connected brokers, calling `on_result` as each combination finishes.
pub async fn run(
    config: &Config,
    brokers: &Brokers,
    plan: Vec<Planned>,
    progress: &Progress,
    on_result: &mut (dyn FnMut(&ComboResult) + Send),
) -> Result<Vec<ComboResult>> {
    let route = brokers.route.as_ref();
    // The queue lives on the receiving broker; the response queue (SERVER/CLIENT) on the
    // sending one, where the CLIENT waits (with --forward the SERVER replies through B to A).
    let names = config.queue_names();
    let took = setup::ensure_all(&brokers.receive, &names, config.mode, config.journal).await?;
    if names.len() > 1 {
        progress.suspend(|| {
            eprintln!(
                "mqperf: {} queues created or checked in {:.2} s ({} at a time)",
                names.len(),
                took.as_secs_f64(),
                setup::SETUP_CONCURRENCY
            )
        });
    }
    let response = match &config.response_queue {
        Some(name) => {
            ensure_queue(&brokers.send, name, config.mode, config.journal).await?;
            Some(match (route, config.scenario) {
                (Some(r), Scenario::Server) => brokers.receive.queue(&r.on_a(name)?)?,
                _ => brokers.send.queue(name)?,
            })
        }
        None => None,
    };
    let mut queues = Vec::new();
    let mut send_queues = Vec::new();
    for name in &names {
        queues.push(brokers.receive.queue(name)?);
        send_queues.push(match route {
            Some(r) => brokers.send.queue(&r.on_b(name)?)?,
            None => brokers.send.queue(name)?,
        });
    }
    let ctx = Ctx {
        config: config.clone(),
        send_pool: Arc::new(pool::Pool::new(brokers.send.url())),
        receive_pool: Arc::new(pool::Pool::new(brokers.receive.url())),
        send_queues,
        queue: queues[0].clone(),
        queues,
        forwarding: route.map(|r| Forwarding {
            a: brokers.send.clone(),
            b: r.b.clone(),
        }),
        progress: progress.clone(),
    };
    // Messages of an earlier invocation still on their way to B would arrive during this one.
    if config.scenario != Scenario::Server {
        ctx.settle().await?;
    }
    match config.scenario {
        // These scenarios own the queue: leftovers would be received as this run's messages.
        Scenario::SendAndPurge | Scenario::SendAndReceive => ctx.purge_all().await?,
        // Stale replies of an earlier client would end runs early.
        Scenario::Client => {
            if let Some(r) = &response {
                r.purge()
                    .await
                    .with_context(|| format!("cannot purge {}", r.name()))?;
            }
        }
        // The client may already be sending.
        Scenario::Server => {}
    }
    let mut server = server::Session::default();
    let mut results = Vec::new();
    for p in plan {
        let result = match p {
            Planned::Skip {
                payload,
                formatter,
                body_bytes,
                reason,
            } => {
                progress.inc(progress_per_run(config) * config.runs as u64);
                ComboResult {
                    payload,
                    formatter: formatter.name(),
                    body_bytes,
                    outcome: Outcome::Skipped {
                        reason,
                        ops: ops(config),
                    },
                }
            }
            Planned::Run(combo) => {
                let measured = match (config.scenario, &response) {
                    (Scenario::SendAndPurge, _) => send_and_purge::measure(&ctx, &combo).await,
                    (Scenario::SendAndReceive, _) => send_and_receive::measure(&ctx, &combo).await,
                    (Scenario::Server, Some(r)) => {
                        server::measure(&ctx, &combo, r, &mut server).await
                    }
                    (Scenario::Client, Some(r)) => client::measure(&ctx, &combo, r).await,
                    (Scenario::Server | Scenario::Client, None) => {
                        anyhow::bail!("{} needs a response queue", config.scenario.name())
                    }
                }
                .with_context(|| combo.name())?;
                ComboResult {
                    payload: combo.kind.name(),
                    formatter: combo.formatter.name(),
                    body_bytes: Some(combo.body_bytes),
                    outcome: Outcome::Measured(measured),
                }
            }
        };
        on_result(&result);
        results.push(result);
    }
    Ok(results)
}

/// Creates the queue unless it exists (transactional for TX); an existing queue must match the
/// mode (transactional for TX, not for NOTX).
async fn ensure_queue(client: &Client, name: &str, mode: Mode, journal: bool) -> Result<()> {
    let transactional = mode == Mode::Tx;
    let options = QueueOptions {
        transactional,
        label: "mqperf".to_string(),
        journal,
        journal_quota_bytes: journal.then_some(u64::MAX),
        ..QueueOptions::default()
    };
    match client.create_queue(name, options).await {
        Ok(_) => return Ok(()),
        Err(mq_client::Error::AlreadyExists(_)) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create queue {name}")),
    }
    let info = client
        .queue_info(name)
        .await
        .with_context(|| format!("cannot read queue {name}"))?;
    match (mode, info.transactional) {
        (Mode::Tx, false) => bail!(
            "TX needs a transactional queue, but {name} exists and is not transactional (a queue cannot change; use another queue name, or run NOTX)"
        ),
        (Mode::Notx, true) => bail!(
            "NOTX needs a non-transactional queue, but {name} exists and is transactional (a queue cannot change; use another queue name, or run TX)"
        ),
        _ if info.journal != journal => bail!(
            "{name} exists with journaling {}; --journal asks for it {} (mq queue set {name} --journal on|off)",
            if info.journal { "on" } else { "off" },
            if journal { "on" } else { "off" }
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_skips_order_with_raw_and_oversized_bodies() {
        let mut c = Config::new(Mode::Notx, Scenario::SendAndPurge, "q");
        c.payloads = vec![PayloadKind::Order, PayloadKind::Str(5000), PayloadKind::Int];
        c.formatters = vec![FormatterKind::Raw, FormatterKind::Manual];
        let p = plan(&c, 4096).unwrap();
        assert_eq!(p.len(), 6);
        let skipped: Vec<(&str, &str)> = p
            .iter()
            .filter_map(|p| match p {
                Planned::Skip {
                    formatter, reason, ..
                } => Some((formatter.name(), reason.as_str())),
                Planned::Run(_) => None,
            })
            .collect();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert_eq!(skipped[0].0, "raw");
        assert!(skipped[0].1.contains("serializing formatter"));
        assert!(
            skipped[1].1.contains("at most 4096 bytes"),
            "{}",
            skipped[1].1
        );
        // order/manual (about 3 KB) is the largest body that runs.
        assert!((1000..=4096).contains(&largest_body(&p)));
    }
}
