//! [`Transaction`]: sends and receives across transactional queues, committed or aborted as one.

use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, tx_request::Op, tx_response::Result as Res};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::{Message, MessageId, ReceivedMessage};

/// An open transaction, from [`Client::begin`].
///
/// Messages sent in it are invisible until [`Transaction::commit`] returns, then appear all at
/// once, in send order; messages received in it are hidden from every other receiver until the
/// commit (then gone) or an abort (then back at the head of their queue, in order, with their
/// abort count incremented). `commit` returns once the commit record is on disk. Dropping an
/// uncommitted transaction aborts it, and so does the broker when the client disconnects or the
/// transaction stays open past the broker's timeout.
///
/// ```no_run
/// # async fn demo() -> mq_client::Result<()> {
/// use std::time::Duration;
/// use mq_client::{Client, Message};
/// let client = Client::connect("http://127.0.0.1:1801").await?;
/// let mut tx = client.begin().await?;
/// tx.send(r".\private$\billing", Message::new("invoice 7"))?;
/// tx.send(r".\private$\shipping", Message::new("parcel 7"))?;
/// let order = tx.receive(r".\private$\orders", Duration::from_secs(1)).await?;
/// let ids = tx.commit().await?; // both sends and the receive, or nothing
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Transaction {
    out: mpsc::UnboundedSender<v1::TxRequest>,
    inbound: Streaming<v1::TxResponse>,
}

impl Transaction {
    pub(crate) async fn begin(client: &Client) -> Result<Transaction> {
        let (out, rx) = mpsc::unbounded_channel();
        let inbound = client
            .rpc
            .clone()
            .transact(UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Transaction { out, inbound })
    }

    /// Sends a request. If the broker has already ended the stream (it aborted the transaction:
    /// timeout, shutdown, an error), returns the broker's reason.
    async fn request(&mut self, op: Op) -> Result<()> {
        if self.out.send(v1::TxRequest { op: Some(op) }).is_ok() {
            return Ok(());
        }
        Err(match self.next().await {
            Err(e) => e,
            Ok(r) => unexpected(r),
        })
    }

    /// Stages a message for `destination` (a transactional queue, or a multiple-element name of
    /// them). Does not wait: a send the broker cannot stage makes [`Transaction::commit`] fail,
    /// and then nothing of the transaction happens.
    pub fn send(&mut self, destination: impl AsRef<str>, message: Message) -> Result<()> {
        let destination = destination.as_ref();
        FormatName::parse(destination)?;
        let op = Op::Send(v1::TxSend {
            destination: destination.to_string(),
            messages: vec![message.into_wire()],
        });
        // A failure here means the broker already ended the transaction; `commit` reports why.
        let _ = self.out.send(v1::TxRequest { op: Some(op) });
        Ok(())
    }

    /// Receives one message from a transactional queue, waiting up to `timeout`.
    pub async fn receive(
        &mut self,
        queue: impl AsRef<str>,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        let queue = queue.as_ref();
        FormatName::parse(queue)?;
        self.request(Op::Receive(v1::TxReceive {
            queue: queue.to_string(),
            timeout_ms: timeout.as_millis() as u64,
        }))
        .await?;
        match self.next().await? {
            Res::Received(m) => Ok(Some(ReceivedMessage::from_wire(m)?)),
            Res::ReceiveTimeout(_) => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// Commits; returns the ids of the messages sent, in send order, once the commit record is
    /// on disk.
    pub async fn commit(mut self) -> Result<Vec<MessageId>> {
        self.request(Op::Commit(true)).await?;
        match self.next().await? {
            Res::Committed(c) => Ok(c
                .ids
                .chunks_exact(16)
                .map(|b| uuid::Uuid::from_slice(b).unwrap_or_default())
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    /// Aborts: nothing sent in the transaction is stored; received messages go back.
    pub async fn abort(mut self) -> Result<()> {
        self.request(Op::Abort(true)).await?;
        match self.next().await? {
            Res::Aborted(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn next(&mut self) -> Result<Res> {
        match self.inbound.message().await {
            Ok(Some(v1::TxResponse { result: Some(r) })) => Ok(r),
            Ok(Some(_)) => Err(Error::Internal(
                "the broker sent an empty transaction response".into(),
            )),
            Ok(None) => Err(Error::Unavailable(
                "the broker ended the transaction's stream; the transaction was aborted".into(),
            )),
            Err(status) => Err(Error::from(status)),
        }
    }
}

fn unexpected(r: Res) -> Error {
    Error::Internal(format!(
        "unexpected transaction response from the broker: {r:?}"
    ))
}
