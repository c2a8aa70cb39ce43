//! `Transact` streams and the idle ones a [`Client`](crate::Client) keeps for its next
//! transaction, so that consecutive transactions neither open a stream nor wait for one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mq_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::Result;

/// Idle streams a client keeps at most (each counts against the broker's
/// `--max-tx-per-connection` while it is open).
pub(crate) const MAX_IDLE_STREAMS: usize = 4;
/// An idle stream older than this is closed rather than reused.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(30);

/// One `Transact` stream: requests out, answers in.
#[derive(Debug)]
pub(crate) struct TxStream {
    pub(crate) out: mpsc::UnboundedSender<v1::TransactRequest>,
    pub(crate) inbound: Streaming<v1::TransactResponse>,
    /// The broker runs transactions one after another on it (its response header said so).
    reusable: bool,
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
        Ok(TxStream {
            out,
            inbound: response.into_inner(),
            reusable,
        })
    }
}

/// The idle streams of a client (shared by its clones), newest last.
#[derive(Debug, Clone, Default)]
pub(crate) struct TxPool(Arc<Mutex<Vec<(TxStream, Instant)>>>);

impl TxPool {
    /// The most recently idle stream that is still open and not too old, if any.
    pub(crate) fn take(&self) -> Option<TxStream> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((s, since)) = idle.pop() {
            if !s.out.is_closed() && since.elapsed() < MAX_IDLE {
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
