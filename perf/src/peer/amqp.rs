//! RabbitMQ over AMQP 0-9-1 (`lapin`): the queue is a classic queue on the default exchange,
//! durable for recoverable and TX; sends go through one channel with publisher confirms
//! (pipelined, timed until the last confirm) or, for TX, `tx.select` and one `tx.commit` per
//! message; receives through a consumer with prefetch (`basic.qos`), acknowledged in batches
//! (`multiple`), one by one with `--ack-each`, or `basic.ack` + `tx.commit` per message (TX);
//! with `--receive-one` every receive is a `basic.get` (retried after 1 ms while the queue is
//! empty), acknowledged before the next (and committed, TX). Every message carries the
//! sender's clock (ns) and its label in AMQP headers.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::{Incoming, Kind};

const NS_HEADER: &str = "mqperf-ns";
const LABEL_HEADER: &str = "mqperf-label";
/// How long [`Amqp::connect`] waits for RabbitMQ's handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection to RabbitMQ.
pub(crate) struct Amqp {
    conn: Connection,
    kind: Kind,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp").field("kind", &self.kind).finish()
    }
}

impl Amqp {
    /// Connects within [`CONNECT_TIMEOUT`], as the NATS peer does: lapin's connect has no
    /// timeout of its own and waited for ever for a handshake from a port where something
    /// accepted the connection but said nothing (perf/tests/peers.rs).
    pub async fn connect(url: &str, kind: Kind) -> Result<Amqp> {
        let conn = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no AMQP connection within {CONNECT_TIMEOUT:?}"))??;
        Ok(Amqp { conn, kind })
    }

    async fn channel(&self) -> Result<Channel> {
        Ok(self.conn.create_channel().await?)
    }

    /// Declares the queue (durable unless express).
    pub async fn prepare(&self, queue: &str) -> Result<()> {
        let ch = self.channel().await?;
        let options = QueueDeclareOptions {
            durable: self.kind != Kind::Express,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(queue.into(), options, FieldTable::default())
            .await
            .with_context(|| format!("cannot declare queue {queue}"))?;
        let _ = ch.close(200, "OK".into()).await;
        Ok(())
    }

    pub async fn purge(&self, queue: &str) -> Result<()> {
        let ch = self.channel().await?;
        ch.queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .with_context(|| format!("cannot purge {queue}"))?;
        let _ = ch.close(200, "OK".into()).await;
        Ok(())
    }

    fn properties(&self, ns: i64, label: Option<&str>) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(NS_HEADER.into(), AMQPValue::LongLongInt(ns));
        if let Some(l) = label {
            headers.insert(LABEL_HEADER.into(), AMQPValue::LongString(l.into()));
        }
        BasicProperties::default()
            .with_delivery_mode(if self.kind == Kind::Express { 1 } else { 2 })
            .with_headers(headers)
    }

    /// Sends `count` bodies made by `body` (called per message with its index; returns the
    /// sender's clock taken before encoding, and the body). Returns the elapsed time and the
    /// sampled send-to-confirm latencies (every `sample`-th message and the last).
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        queue: &str,
        count: u64,
        label: Option<&str>,
        sample: u64,
        awaited: bool,
        body: &(dyn Fn() -> Result<(i64, bytes::Bytes)> + Send + Sync),
        latency: &mut crate::stats::Latency,
        on_progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<Duration> {
        let ch = self.channel().await?;
        let tx = self.kind == Kind::Tx;
        if tx {
            ch.tx_select().await.context("tx.select")?;
        } else {
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .context("confirm.select")?;
        }
        let start = Instant::now();
        let mut pending = std::collections::VecDeque::new();
        for i in 0..count {
            let t0 = Instant::now();
            let (ns, b) = body()?;
            let confirm = ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &b,
                    self.properties(ns, label),
                )
                .await
                .with_context(|| format!("cannot publish to {queue}"))?;
            let sampled = (i + 1).is_multiple_of(sample) || i + 1 == count;
            if tx {
                ch.tx_commit().await.context("tx.commit")?;
                if sampled {
                    latency.record(t0.elapsed());
                }
            } else {
                pending.push_back((confirm, sampled.then_some(t0)));
                // Bound the confirms in flight (none with `awaited`); await them in order.
                while pending.len() > if awaited { 0 } else { 4096 } {
                    settle(pending.pop_front(), latency).await?;
                }
            }
            if (i + 1).is_multiple_of(64) {
                on_progress(64);
            }
        }
        while let Some(p) = pending.pop_front() {
            settle(Some(p), latency).await?;
        }
        let elapsed = start.elapsed();
        on_progress(count % 64);
        let _ = ch.close(200, "OK".into()).await;
        Ok(elapsed)
    }

    /// Receives `count` messages, handing each to `check`; acknowledges as the mode says.
    /// `one`: every receive a `basic.get`, acknowledged (TX: and committed) before the next.
    #[allow(clippy::too_many_arguments)]
    pub async fn receive(
        &self,
        queue: &str,
        count: u64,
        prefetch: u32,
        ack_each: bool,
        one: bool,
        timeout: Duration,
        wait_forever_for_first: bool,
        check: &mut (dyn FnMut(u64, Incoming<'_>) -> Result<()> + Send),
    ) -> Result<()> {
        let ch = self.channel().await?;
        let tx = self.kind == Kind::Tx;
        if tx {
            ch.tx_select().await.context("tx.select")?;
        }
        if one {
            let r = get_each(
                &ch,
                queue,
                count,
                tx,
                timeout,
                wait_forever_for_first,
                check,
            )
            .await;
            let _ = ch.close(200, "OK".into()).await;
            return r;
        }
        let prefetch = prefetch.clamp(1, u16::MAX as u32) as u16;
        ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let tag = format!("mqperf-{}", super::unique());
        let mut consumer = ch
            .basic_consume(
                queue.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("cannot consume from {queue}"))?;
        let batch = u64::from(prefetch / 2).max(1);
        let mut unacked = 0u64;
        for i in 0..count {
            let d = loop {
                match tokio::time::timeout(timeout, consumer.next()).await {
                    Ok(Some(d)) => break d.with_context(|| format!("receiving from {queue}"))?,
                    Ok(None) => bail!("the consumer on {queue} was cancelled by the server"),
                    Err(_) if i == 0 && wait_forever_for_first => continue,
                    Err(_) => bail!(
                        "got {i} of {count} messages from {queue}; nothing more arrived within {timeout:?}"
                    ),
                }
            };
            let (ns, label) = stamps(&d);
            check(
                i,
                Incoming {
                    body: &d.data,
                    sent_ns: ns,
                    label: &label,
                },
            )?;
            unacked += 1;
            if tx {
                d.ack(BasicAckOptions::default()).await?;
                ch.tx_commit().await.context("tx.commit")?;
                unacked = 0;
            } else if ack_each || unacked >= batch || i + 1 == count {
                d.ack(BasicAckOptions {
                    multiple: !ack_each,
                })
                .await?;
                unacked = 0;
            }
        }
        let _ = ch
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await;
        let _ = ch.close(200, "OK".into()).await;
        Ok(())
    }

    pub async fn close(&self) {
        let _ = self.conn.close(200, "OK".into()).await;
    }
}

/// The sender's clock (ns, 0 if absent) and label a delivery carries in its headers.
fn stamps(d: &Delivery) -> (i64, String) {
    let headers = d.properties.headers().as_ref();
    let ns = match headers.and_then(|h| h.inner().get(NS_HEADER)) {
        Some(AMQPValue::LongLongInt(n)) => *n,
        _ => 0,
    };
    let label = match headers.and_then(|h| h.inner().get(LABEL_HEADER)) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        _ => String::new(),
    };
    (ns, label)
}

/// `--receive-one`: `count` messages, each a `basic.get` (an empty queue answers at once, so it
/// is asked again after 1 ms, until `timeout` passes without a message), acknowledged (TX: and
/// committed) before the next.
async fn get_each(
    ch: &Channel,
    queue: &str,
    count: u64,
    tx: bool,
    timeout: Duration,
    wait_forever_for_first: bool,
    check: &mut (dyn FnMut(u64, Incoming<'_>) -> Result<()> + Send),
) -> Result<()> {
    for i in 0..count {
        let since = Instant::now();
        let m = loop {
            let got = ch
                .basic_get(queue.into(), BasicGetOptions::default())
                .await
                .with_context(|| format!("basic.get from {queue}"))?;
            match got {
                Some(m) => break m,
                None if i == 0 && wait_forever_for_first => {}
                None if since.elapsed() >= timeout => bail!(
                    "got {i} of {count} messages from {queue}; nothing more arrived within {timeout:?}"
                ),
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let (ns, label) = stamps(&m.delivery);
        check(
            i,
            Incoming {
                body: &m.delivery.data,
                sent_ns: ns,
                label: &label,
            },
        )?;
        m.delivery.ack(BasicAckOptions::default()).await?;
        if tx {
            ch.tx_commit().await.context("tx.commit")?;
        }
    }
    Ok(())
}

async fn settle(
    p: Option<(lapin::PublisherConfirm, Option<Instant>)>,
    latency: &mut crate::stats::Latency,
) -> Result<()> {
    let Some((confirm, t0)) = p else {
        return Ok(());
    };
    let c = confirm.await.context("waiting for a publisher confirm")?;
    if !c.is_ack() {
        bail!("RabbitMQ refused a message (basic.nack)");
    }
    if let Some(t0) = t0 {
        latency.record(t0.elapsed());
    }
    Ok(())
}
