//! `Transact` streams and the idle ones a [`Client`](crate::Client) keeps for its next
//! transaction, so that consecutive transactions neither open a stream nor wait for one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use mq_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::Result;

/// Idle streams a client keeps at most (each counts against the broker's
/// `--max-tx-per-connection` while it is open).
pub(crate) const MAX_IDLE_STREAMS: usize = 4;
/// An idle stream older than this is closed rather than reused (and older than half the idle
/// bound the broker announces, `mq-tx-idle-ms`, if that is less).
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(30);

/// One `Transact` stream: requests out, answers in.
///
/// Requests go out in batches: every batch is one item of the channel, so the HTTP/2 task
/// wakes once for it and encodes all of its requests into one write (a transaction's begin,
/// sends and commit reach the broker together, and it reads them at once).
#[derive(Debug)]
pub(crate) struct TxStream {
    pub(crate) out: mpsc::UnboundedSender<Vec<v1::TransactRequest>>,
    pub(crate) inbound: Streaming<v1::TransactResponse>,
    /// The broker runs transactions one after another on it (its response header said so).
    reusable: bool,
    /// How long it may be kept idle: [`MAX_IDLE`], or half the broker's idle bound if less.
    keep_for: Duration,
    /// Since when it has carried no transaction (kept in the pool); `None` while new.
    idle_since: Option<Instant>,
}

impl TxStream {
    /// Opens a stream whose first requests are `first`, waiting for the broker's response
    /// headers (within the client's call deadline).
    pub(crate) async fn open(client: &Client, first: Vec<v1::TransactRequest>) -> Result<TxStream> {
        let (out, rx) = mpsc::unbounded_channel::<Vec<v1::TransactRequest>>();
        let _ = out.send(first);
        client.tx_pool.count_batch();
        let mut grpc = client.rpc.clone();
        let requests = UnboundedReceiverStream::new(rx).flat_map(futures::stream::iter);
        let rpc = grpc.transact(requests);
        let response = crate::deadline::within(
            client.options.call_timeout,
            "beginning the transaction",
            rpc,
        )
        .await?;
        let reusable = response
            .metadata()
            .get(mq_proto::TX_STREAM_REUSE_METADATA)
            .is_some();
        let keep_for = keep_for(
            response
                .metadata()
                .get(mq_proto::TX_STREAM_IDLE_METADATA)
                .and_then(|v| v.to_str().ok()?.parse().ok()),
        );
        Ok(TxStream {
            out,
            inbound: response.into_inner(),
            reusable,
            keep_for,
            idle_since: None,
        })
    }

    /// The broker has ended the stream (idle too long, shutting down) or sent something
    /// unasked: it cannot carry a transaction. Does not wait.
    fn ended(&mut self) -> bool {
        self.out.is_closed() || self.inbound.message().now_or_never().is_some()
    }

    /// Taken from the pool and kept idle (nothing of the transaction sent yet) for so long
    /// that the broker may end it any moment, or already ended: a transaction whose first
    /// requests are still unsent opens a new stream for them instead.
    pub(crate) fn stale(&mut self) -> bool {
        self.idle_since
            .is_some_and(|since| since.elapsed() >= self.keep_for)
            || self.ended()
    }
}

/// How long an idle stream is kept, given the broker's idle bound in milliseconds (none: an
/// older broker without one). Half the bound leaves the broker's end of the stream (and a begin
/// on its way) clear of each other.
fn keep_for(broker_idle_ms: Option<u64>) -> Duration {
    match broker_idle_ms {
        Some(ms) => MAX_IDLE.min(Duration::from_millis(ms / 2)),
        None => MAX_IDLE,
    }
}

/// The idle streams of a client (shared by its clones), newest last, and how many request
/// batches its transactions wrote.
#[derive(Debug, Clone, Default)]
pub(crate) struct TxPool(Arc<Mutex<Vec<(TxStream, Instant)>>>, Arc<AtomicU64>);

impl TxPool {
    /// One batch of requests handed to a `Transact` stream.
    pub(crate) fn count_batch(&self) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }

    /// Batches handed to `Transact` streams so far.
    pub(crate) fn batches(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }

    /// The most recently idle stream that is still open and not too old, if any; the others
    /// are closed.
    pub(crate) fn take(&self) -> Option<TxStream> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((mut s, since)) = idle.pop() {
            if since.elapsed() < s.keep_for && !s.ended() {
                return Some(s);
            }
        }
        None
    }

    /// Keeps `stream`, whose last transaction ended with an answer (committed or aborted), for
    /// the next transaction; closes it instead if the broker does not reuse streams or enough
    /// are kept.
    pub(crate) fn put(&self, stream: TxStream) {
        if !stream.reusable || stream.out.is_closed() {
            return;
        }
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_STREAMS {
            let mut stream = stream;
            let now = Instant::now();
            stream.idle_since = Some(now);
            idle.push((stream, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_stream_is_kept_for_half_the_brokers_bound_at_most_30_s() {
        assert_eq!(keep_for(None), MAX_IDLE);
        assert_eq!(keep_for(Some(60_000)), Duration::from_secs(30));
        assert_eq!(keep_for(Some(3_600_000)), MAX_IDLE);
        assert_eq!(keep_for(Some(1_000)), Duration::from_millis(500));
        assert_eq!(keep_for(Some(0)), Duration::ZERO);
    }
}
