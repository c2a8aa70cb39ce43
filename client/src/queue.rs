//! [`Queue`]: a handle to one queue (or a multiple-element format name, for sending).

use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1;

use crate::client::{Client, QueueInfo};
use crate::consumer::{Consumer, ConsumerOptions};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId, ReceivedMessage};
use crate::sender::{Sender, SenderOptions};

/// The largest body [`Queue::send_tx`] sends as a transaction on a kept `Transact` stream;
/// larger ones go on a send stream of their own (not held in a transaction's requests).
const SEND_TX_IN_TRANSACTION_MAX_BYTES: usize = 64 << 10;

/// What the broker says when a transactional receive names a queue that is not
/// transactional.
const NOT_TRANSACTIONAL: &str = "a transactional receive needs a transactional queue";

/// The longest one transaction of [`Queue::receive`] from a transactional queue waits for a
/// message; a longer wait is several transactions one after another.
const TX_RECEIVE_SLICE: Duration = Duration::from_secs(5);

/// A handle to a queue, from [`Client::queue`].
#[derive(Debug, Clone)]
pub struct Queue {
    client: Client,
    name: String,
    parsed: FormatName,
}

impl Queue {
    pub(crate) fn new(client: Client, name: String, parsed: FormatName) -> Self {
        Queue {
            client,
            name,
            parsed,
        }
    }

    /// The name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client (connection) this handle uses, e.g. to begin a transaction on it.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn receivable(&self) -> Result<()> {
        if self.parsed.single().is_none() {
            return Err(Error::InvalidArgument(format!(
                "\"{}\" is a multiple-element format name; those can only be sent to",
                self.name
            )));
        }
        Ok(())
    }

    /// Sends one message and waits for the broker's acknowledgement (for a recoverable
    /// message: once it is on disk). The client keeps the send stream it opened for this queue
    /// (see [`Client::one_shot_senders_opened`]), so one message at a time costs one round
    /// trip. Concurrent calls share it and are pipelined. For many messages from one task use
    /// [`Queue::sender`], which pipelines without waiting for each.
    pub async fn send(&self, message: Message) -> Result<MessageId> {
        let pool = &self.client.send_pool;
        if let Some(sender) = pool.get(&self.name) {
            match sender.send_with_receipt(message.clone()).await {
                Ok(receipt) => return receipt.await,
                // Refused before it was handed to the stream (the stream ended meanwhile):
                // nothing was sent; once more on a new stream.
                Err(_) => pool.forget(&sender),
            }
        }
        let sender = pool.open(&self.client, &self.name).await?;
        sender.send_with_receipt(message).await?.await
    }

    /// Sends one message as a single-message transaction (MSMQ's `MQ_SINGLE_MESSAGE`), for
    /// transactional queues: returns once committed (on disk). A body of up to 64 KiB goes as
    /// a transaction of one send on a `Transact` stream the client keeps between transactions
    /// (one round trip); a larger one on a transactional send stream of its own. If the answer
    /// is lost, the error is [`Error::InDoubt`] with the transaction's id:
    /// [`Client::transaction_outcome`] tells whether it committed.
    pub async fn send_tx(&self, message: Message) -> Result<MessageId> {
        if message.body().len() <= SEND_TX_IN_TRANSACTION_MAX_BYTES {
            let mut tx = self.client.begin().await?;
            tx.send(&self.name, message)?;
            let ids = tx.commit().await?;
            return ids.into_iter().next().ok_or_else(|| {
                Error::Internal("the broker committed the send without the message's id".into())
            });
        }
        let options = SenderOptions {
            transactional: true,
            ..SenderOptions::default()
        };
        let sender = self.sender(options).await?;
        let receipt = sender.send_with_receipt(message).await?;
        let id = receipt.await?;
        sender.close().await?;
        Ok(id)
    }

    /// A pipelining sender to this queue.
    pub async fn sender(&self, options: SenderOptions) -> Result<Sender> {
        Sender::open(self.client.clone(), self.name.clone(), options).await
    }

    /// Receives (removes) one message, waiting up to `timeout`. `None` if none arrived. On a
    /// transactional queue this is a single-message transaction: the removal is on disk before
    /// the message is returned.
    ///
    /// Once a receive from a queue has returned a transactional message, the client knows the
    /// queue is transactional and receives from it as a transaction of one
    /// [`Transaction::receive_and_commit`](crate::Transaction::receive_and_commit) on a
    /// `Transact` stream it keeps (one round trip on an open stream instead of a call of its
    /// own; a wait longer than 5 s is several such transactions, so none outlives the
    /// broker's transaction timeout); if that answer is lost the error is [`Error::InDoubt`]
    /// (with the transaction's id; [`Client::transaction_outcome`] tells whether the message
    /// was taken).
    pub async fn receive(&self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        self.receivable()?;
        let kinds = &self.client.queue_kinds;
        let mut timeout = timeout;
        if kinds.is_transactional(&self.name) {
            // A transaction waits at most TX_RECEIVE_SLICE (the broker aborts one that stays
            // open past its transaction timeout); a longer wait is several.
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let started = tokio::time::Instant::now();
                let left = deadline.saturating_duration_since(started);
                let wait = left.min(TX_RECEIVE_SLICE);
                let tx = self.client.begin().await?;
                match tx.receive_and_commit(&self.name, wait).await {
                    Ok(Some((m, _))) => return Ok(Some(m)),
                    Ok(None) if tokio::time::Instant::now() >= deadline => return Ok(None),
                    // Its whole wait passed (sent in whole milliseconds): the next slice.
                    Ok(None) if started.elapsed() + Duration::from_millis(2) >= wait => continue,
                    // Nothing, sooner than its wait: the broker ended the transaction (a
                    // transaction timeout shorter than the wait). A plain receive for the rest.
                    Ok(None) => {}
                    // Not (or no longer) transactional: nothing was taken; a plain receive.
                    Err(Error::FailedPrecondition(m)) if m.contains(NOT_TRANSACTIONAL) => {
                        kinds.not_transactional(&self.name);
                    }
                    // The broker aborted it (a transaction timeout shorter than the wait):
                    // nothing was taken; a plain receive for the rest of the wait.
                    Err(Error::Aborted(_)) => {}
                    Err(e) => return Err(e),
                }
                timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
                break;
            }
        }
        let got = self.one(timeout, false).await?;
        if got.as_ref().is_some_and(|m| m.transactional) {
            kinds.saw_transactional(&self.name);
        }
        Ok(got)
    }

    /// Looks at the message a receive would get, without removing it, waiting up to `timeout`.
    pub async fn peek(&self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        self.one(timeout, true).await
    }

    /// Up to `max` messages from the head of the queue, in receive order, not removed, waiting
    /// up to `timeout` for the first. The broker answers in pages (at most 1000 messages or
    /// about 4 MiB each); this asks for pages until it has `max` or the queue has no more. For
    /// many messages, [`Queue::peek_page`] keeps only one page in memory at a time.
    pub async fn peek_many(&self, max: u32, timeout: Duration) -> Result<Vec<ReceivedMessage>> {
        let max = max.max(1); // as the protocol: 0 = 1
        let mut out = Vec::new();
        let mut after = None;
        let mut wait = timeout;
        while out.len() < max as usize {
            let page = self
                .peek_page(max - out.len() as u32, after.as_ref(), wait)
                .await?;
            out.extend(page.messages);
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
            wait = Duration::ZERO;
        }
        Ok(out)
    }

    /// One page of a peek: up to `max` messages (the broker may return fewer: at most 1000 or
    /// about 4 MiB per page) from the head of the queue, or after `after` (the
    /// [`PeekPage::next`] of the previous page), waiting up to `timeout` for a first message.
    pub async fn peek_page(
        &self,
        max: u32,
        after: Option<&PeekCursor>,
        timeout: Duration,
    ) -> Result<PeekPage> {
        self.receivable()?;
        let mut grpc = self.client.rpc.clone();
        let rpc = grpc.peek(v1::PeekRequest {
            queue: self.name.clone(),
            timeout_ms: timeout.as_millis() as u64,
            max,
            cursor: after.map(|c| c.0.clone()).unwrap_or_default(),
            from_id: Default::default(),
        });
        let r = self.client.call("to a peek", timeout, rpc).await?;
        check_page_size(r.messages.len(), max)?;
        let messages = r
            .messages
            .into_iter()
            .map(ReceivedMessage::from_wire)
            .collect::<Result<Vec<_>>>()?;
        let next = (!r.next_cursor.is_empty() && !messages.is_empty())
            .then_some(PeekCursor(r.next_cursor));
        Ok(PeekPage { messages, next })
    }

    /// The first page of a peek that starts at the message `id` (inclusive); the rest as
    /// [`Queue::peek_page`]. [`Error::NotFound`] if that message is not waiting.
    pub async fn peek_page_from(&self, max: u32, id: MessageId) -> Result<PeekPage> {
        self.receivable()?;
        let mut grpc = self.client.rpc.clone();
        let rpc = grpc.peek(v1::PeekRequest {
            queue: self.name.clone(),
            timeout_ms: 0,
            max,
            cursor: Default::default(),
            from_id: id.as_bytes().to_vec().into(),
        });
        let r = self.client.call("to a peek", Duration::ZERO, rpc).await?;
        check_page_size(r.messages.len(), max)?;
        let messages = r
            .messages
            .into_iter()
            .map(ReceivedMessage::from_wire)
            .collect::<Result<Vec<_>>>()?;
        let next = (!r.next_cursor.is_empty() && !messages.is_empty())
            .then_some(PeekCursor(r.next_cursor));
        Ok(PeekPage { messages, next })
    }

    /// Receives (removes) the message with id `id` (.NET `ReceiveById`), wherever it is in
    /// the queue, waiting up to `timeout` for it to arrive. With a zero timeout and no such
    /// message: [`Error::NotFound`] (MQ_ERROR_MESSAGE_NOT_FOUND); with a timeout, `None` once
    /// it passes. On a transactional queue this is a single-message transaction.
    pub async fn receive_by_id(
        &self,
        id: MessageId,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.selected(timeout, false, Some(id), "").await
    }

    /// [`Queue::receive_by_id`] without removing it (.NET `PeekById`).
    pub async fn peek_by_id(
        &self,
        id: MessageId,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.selected(timeout, true, Some(id), "").await
    }

    /// Receives the first message (in receive order) whose correlation id is `correlation_id`
    /// (.NET `ReceiveByCorrelationId`), as [`Queue::receive_by_id`]. The broker finds it
    /// through an index, not a scan.
    pub async fn receive_by_correlation_id(
        &self,
        correlation_id: &str,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.selected(timeout, false, None, correlation_id).await
    }

    /// [`Queue::receive_by_correlation_id`] without removing it (.NET `PeekByCorrelationId`).
    pub async fn peek_by_correlation_id(
        &self,
        correlation_id: &str,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.selected(timeout, true, None, correlation_id).await
    }

    /// A cursor on this queue (MSMQ `MQCreateCursor`, .NET `MessageEnumerator`).
    pub fn cursor(&self) -> Result<crate::cursor::Cursor> {
        self.receivable()?;
        Ok(crate::cursor::Cursor::new(
            self.client.clone(),
            self.name.clone(),
        ))
    }

    async fn one(&self, timeout: Duration, peek: bool) -> Result<Option<ReceivedMessage>> {
        self.selected(timeout, peek, None, "").await
    }

    async fn selected(
        &self,
        timeout: Duration,
        peek: bool,
        id: Option<MessageId>,
        correlation_id: &str,
    ) -> Result<Option<ReceivedMessage>> {
        self.receivable()?;
        let mut grpc = self.client.rpc.clone();
        let rpc = grpc.receive_one(v1::ReceiveOneRequest {
            queue: self.name.clone(),
            timeout_ms: timeout.as_millis() as u64,
            peek,
            id: id.map(|i| i.as_bytes().to_vec().into()).unwrap_or_default(),
            correlation_id: correlation_id.to_string(),
        });
        let r = self.client.call("to a receive", timeout, rpc).await?;
        r.message.map(ReceivedMessage::from_wire).transpose()
    }

    /// A streaming receiver with a prefetch window (the fast way to receive many messages).
    pub async fn consumer(&self, options: ConsumerOptions) -> Result<Consumer> {
        self.receivable()?;
        Consumer::open(self.client.clone(), self.name.clone(), options).await
    }

    /// Removes every waiting message; returns how many.
    pub async fn purge(&self) -> Result<u64> {
        self.receivable()?;
        self.client.purge(&self.name).await
    }

    /// The queue's description and counters.
    pub async fn info(&self) -> Result<QueueInfo> {
        self.receivable()?;
        self.client.queue_info(&self.name).await
    }
}

/// Where a peek page ended, to ask for the next one (opaque).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekCursor(bytes::Bytes);

/// One page of [`Queue::peek_page`].
#[derive(Debug, Clone)]
pub struct PeekPage {
    /// In receive order.
    pub messages: Vec<ReceivedMessage>,
    /// `Some`: more messages may follow; pass it to the next [`Queue::peek_page`].
    pub next: Option<PeekCursor>,
}

impl AsRef<str> for Queue {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

/// A peek's page holds at most the `max` asked for (0 asks for 1); more is a broken broker's
/// answer, refused rather than shown as if asked for.
fn check_page_size(got: usize, max: u32) -> Result<()> {
    let max = max.max(1) as usize;
    if got > max {
        return Err(Error::Internal(format!(
            "the broker answered a peek of at most {max} messages with {got}"
        )));
    }
    Ok(())
}
