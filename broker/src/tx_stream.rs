//! The id of a pipelined transactional send stream (`SendRequest.tx_stream`): registered with the
//! broker's transaction outcomes at its first batch, checked on every batch, closed when the
//! stream ends.

use std::sync::Arc;

use mq_proto::v1;

use crate::broker::Broker;
use crate::error::BrokerError;

/// The transactional send stream of one `Send` call; closes it when dropped.
pub(crate) struct TxStream {
    broker: Arc<Broker>,
    id: Option<u128>,
}

impl TxStream {
    pub(crate) fn new(broker: Arc<Broker>) -> TxStream {
        TxStream { broker, id: None }
    }

    /// The stream id and first seq to store `batch` under, or `None` if it has no stream id (not
    /// transactional, an older client, or no messages). Refused: a malformed id, another id than
    /// the stream's first, an id used before, seqs with a gap.
    pub(crate) fn batch(
        &mut self,
        batch: &v1::SendRequest,
    ) -> Result<Option<(u128, u64)>, BrokerError> {
        if !batch.transactional || batch.tx_stream.is_empty() || batch.messages.is_empty() {
            return Ok(None);
        }
        let bytes: [u8; 16] = batch.tx_stream.as_ref().try_into().map_err(|_| {
            BrokerError::InvalidArgument(format!(
                "tx_stream is 16 bytes; got {}",
                batch.tx_stream.len()
            ))
        })?;
        let id = u128::from_be_bytes(bytes);
        let mut outcomes = self.broker.outcomes();
        match self.id {
            Some(mine) if mine != id => {
                return Err(BrokerError::InvalidArgument(
                    "every batch of a send stream carries the same tx_stream".into(),
                ))
            }
            Some(_) => {}
            None => {
                outcomes.stream_open(id)?;
                self.id = Some(id);
            }
        }
        outcomes.stream_check(id, batch.first_seq, batch.messages.len() as u64)?;
        Ok(Some((id, batch.first_seq)))
    }

    /// A batch of this stream refused as a whole before it was stored.
    pub(crate) fn refused(&self, first_seq: u64, count: usize) {
        if let Some(id) = self.id {
            let all: Vec<usize> = (0..count).collect();
            let _ = self
                .broker
                .outcomes()
                .stream_batch(id, first_seq, count as u64, &all, false);
        }
    }
}

impl Drop for TxStream {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.broker.outcomes().stream_closed(id);
        }
    }
}
