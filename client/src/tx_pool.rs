//! `Transact` streams and the idle ones a [`Client`](crate::Client) keeps for its next
//! transaction, so that consecutive transactions neither open a stream nor wait for one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
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
#[derive(Debug)]
pub(crate) struct TxStream {
    pub(crate) out: mpsc::UnboundedSender<v1::TransactRequest>,
    pub(crate) inbound: Streaming<v1::TransactResponse>,
    /// The broker runs transactions one after another on it (its response header said so).
    reusable: bool,
    /// How long it may be kept idle: [`MAX_IDLE`], or half the broker's idle bound if less.
    keep_for: Duration,
}

impl TxStream {
    /// Opens a stream whose first request is `first`, waiting for the broker's response
    /// headers (within the client's call deadline).
    pub(crate) async fn open(client: &Client, first: v1::TransactRequest) -> Result<TxStream> {
        let (out, rx) = mpsc::unbounded_channel();
        let _ = out.send(first);
        let mut grpc = client.rpc.clone();
        let rpc = grpc.transact(UnboundedReceiverStream::new(rx));
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
        })
    }

    /// The broker has ended the stream (idle too long, shutting down) or sent something
    /// unasked: it cannot carry a transaction. Does not wait.
    fn ended(&mut self) -> bool {
        self.out.is_closed() || self.inbound.message().now_or_never().is_some()
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

/// The idle streams of a client (shared by its clones), newest last.
#[derive(Debug, Clone, Default)]
pub(crate) struct TxPool(Arc<Mutex<Vec<(TxStream, Instant)>>>);

impl TxPool {
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
            idle.push((stream, Instant::now()));
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
