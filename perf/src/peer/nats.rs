//! NATS JetStream (`async-nats`): the queue is a work-queue stream (retention `workqueue`,
//! one subject of the same name), memory storage for express, file storage for recoverable
//! and TX. Sends are JetStream publishes whose acks are awaited in order (pipelined, at most
//! 4096 in flight; TX: each ack awaited before the next publish). Receives go through one
//! durable pull consumer (explicit acks) that asks for at most the messages still expected,
//! so no message is left in flight to a consumer that has gone; every message is acked
//! (TX: `double_ack`, the server confirms the ack). The sender's clock (ns) and the label
//! travel in headers.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;

use super::{Incoming, Kind};

const NS_HEADER: &str = "Mqperf-Ns";
const LABEL_HEADER: &str = "Mqperf-Label";
/// The durable consumer every receive of a stream uses.
const CONSUMER: &str = "mqperf";
/// Publishes whose acks may be outstanding at once.
const IN_FLIGHT: usize = 4096;

/// One connection to a NATS server with JetStream.
#[derive(Debug)]
pub(crate) struct Nats {
    client: async_nats::Client,
    js: jetstream::Context,
    kind: Kind,
}

impl Nats {
    pub async fn connect(url: &str, kind: Kind) -> Result<Nats> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await?;
        let js = jetstream::new(client.clone());
        Ok(Nats { client, js, kind })
    }

    pub fn version(&self) -> String {
        self.client.server_info().version
    }

    async fn stream(&self, queue: &str) -> Result<stream::Stream> {
        let config = stream::Config {
            name: queue.to_string(),
            subjects: vec![queue.to_string()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: if self.kind == Kind::Express {
                stream::StorageType::Memory
            } else {
                stream::StorageType::File
            },
            ..stream::Config::default()
        };
        match self.js.get_or_create_stream(config).await {
            Ok(s) => Ok(s),
            // Two mqperf processes (TX CLIENT and SERVER) may create the same stream at once:
            // the one that loses the race is told "subjects overlap with an existing stream",
            // and the stream is there on a second look.
            Err(e) => match self.js.get_stream(queue).await {
                Ok(s) => Ok(s),
                Err(_) => Err(e).with_context(|| format!("cannot create stream {queue}")),
            },
        }
    }

    /// Creates the stream and its durable consumer.
    pub async fn prepare(&self, queue: &str) -> Result<()> {
        self.consumer(queue).await.map(|_| ())
    }

    async fn consumer(&self, queue: &str) -> Result<consumer::PullConsumer> {
        let s = self.stream(queue).await?;
        s.get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.to_string()),
                ack_policy: consumer::AckPolicy::Explicit,
                max_ack_pending: 100_000,
                ..consumer::pull::Config::default()
            },
        )
        .await
        .with_context(|| format!("cannot create the consumer of stream {queue}"))
    }

    pub async fn purge(&self, queue: &str) -> Result<()> {
        let s = self.stream(queue).await?;
        s.purge()
            .await
            .with_context(|| format!("cannot purge stream {queue}"))?;
        Ok(())
    }

    /// As [`super::amqp::Amqp::send`].
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
        let tx = self.kind == Kind::Tx;
        let start = Instant::now();
        let mut pending = std::collections::VecDeque::new();
        for i in 0..count {
            let t0 = Instant::now();
            let (ns, b) = body()?;
            let mut headers = async_nats::HeaderMap::new();
            headers.append(NS_HEADER, ns.to_string());
            if let Some(l) = label {
                headers.append(LABEL_HEADER, l);
            }
            let ack = self
                .js
                .publish_with_headers(queue.to_string(), headers, b)
                .await
                .with_context(|| format!("cannot publish to {queue}"))?;
            let sampled = ((i + 1).is_multiple_of(sample) || i + 1 == count).then_some(t0);
            pending.push_back((ack, sampled));
            while pending.len() > if tx || awaited { 0 } else { IN_FLIGHT } {
                settle(pending.pop_front(), latency).await?;
            }
            if (i + 1).is_multiple_of(64) {
                on_progress(64);
            }
        }
        while let Some(p) = pending.pop_front() {
            settle(Some(p), latency).await?;
        }
        on_progress(count % 64);
        Ok(start.elapsed())
    }

    /// As [`super::amqp::Amqp::receive`]; `ack_each` changes nothing (explicit acks are
    /// always per message in a work-queue stream); `one`: every pull request asks for one
    /// message (waiting for it up to 1 s on the server), acknowledged before the next.
    #[allow(clippy::too_many_arguments)]
    pub async fn receive(
        &self,
        queue: &str,
        count: u64,
        prefetch: u32,
        _ack_each: bool,
        one: bool,
        timeout: Duration,
        wait_forever_for_first: bool,
        check: &mut (dyn FnMut(u64, Incoming<'_>) -> Result<()> + Send),
    ) -> Result<()> {
        let consumer = self.consumer(queue).await?;
        let tx = self.kind == Kind::Tx;
        let prefetch = if one { 1 } else { prefetch };
        let mut got = 0u64;
        let mut last = Instant::now();
        while got < count {
            let want = (count - got).min(u64::from(prefetch.max(1))) as usize;
            let mut batch = consumer
                .batch()
                .max_messages(want)
                .expires(Duration::from_secs(1).min(timeout))
                .messages()
                .await
                .with_context(|| format!("cannot pull from {queue}"))?;
            let before = got;
            while let Some(m) = batch.next().await {
                let m = m
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .with_context(|| format!("receiving from {queue}"))?;
                let h = m.headers.as_ref();
                let ns = h
                    .and_then(|h| h.get(NS_HEADER))
                    .and_then(|v| v.as_str().parse::<i64>().ok())
                    .unwrap_or(0);
                let label = h
                    .and_then(|h| h.get(LABEL_HEADER))
                    .map(|v| v.as_str().to_string())
                    .unwrap_or_default();
                check(
                    got,
                    Incoming {
                        body: &m.payload,
                        sent_ns: ns,
                        label: &label,
                    },
                )?;
                if tx {
                    m.double_ack()
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))
                        .context("double ack")?;
                } else {
                    m.ack()
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))
                        .context("ack")?;
                }
                got += 1;
            }
            if got > before {
                last = Instant::now();
            } else if !(before == 0 && wait_forever_for_first) && last.elapsed() >= timeout {
                bail!(
                    "got {got} of {count} messages from {queue}; nothing more arrived within {timeout:?}"
                );
            }
        }
        Ok(())
    }

    pub async fn close(&self) {
        let _ = self.client.flush().await;
    }
}

async fn settle(
    p: Option<(jetstream::context::PublishAckFuture, Option<Instant>)>,
    latency: &mut crate::stats::Latency,
) -> Result<()> {
    let Some((ack, t0)) = p else {
        return Ok(());
    };
    ack.await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("waiting for a JetStream publish ack")?;
    if let Some(t0) = t0 {
        latency.record(t0.elapsed());
    }
    Ok(())
}
