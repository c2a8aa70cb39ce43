//! [`Transaction`]: sends and receives across transactional queues, committed or aborted as one;
//! its id ([`TxId`]) and what a commit whose answer was lost means ([`Error::InDoubt`]).

use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, transact_request::Op, transact_response::Result as Res};

use crate::client::Client;
use crate::deadline::deadline_error;
use crate::error::{Error, Result};
use crate::message::{Message, MessageId, ReceivedMessage};
use crate::tx_pool::{TxPool, TxStream};

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
    id: TxId,
    stream: TxStream,
    /// Where the stream goes back once this transaction ended with an answer.
    pool: TxPool,
    call_timeout: Duration,
    /// Requests not sent yet: they leave together, with the next one that needs an answer
    /// (receive, commit, abort), or once they hold [`FLUSH_BYTES`] (see [`Transaction::flush`]).
    pending: Vec<v1::TransactRequest>,
    /// Encoded size of `pending`.
    pending_bytes: usize,
    /// Something of this transaction has left on `stream` (it cannot move to another stream).
    sent: bool,
    /// Messages sent in it: the commit's answer names each by its id.
    sends: usize,
    /// For a stream that turns out stale before anything was sent: the client to open another.
    client: Client,
}

/// Staged sends held back for one write at most this many bytes; more go out at once.
const FLUSH_BYTES: usize = 64 * 1024;

/// A transaction's id: 16 bytes, a UUID v7 chosen by the client unless given. The broker
/// journals it with the commit record, so [`Client::transaction_outcome`] can tell whether a
/// commit whose answer was lost happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TxId(pub uuid::Uuid);

impl TxId {
    /// A new id (UUID v7: it carries the time it was made).
    pub fn new() -> Self {
        TxId(uuid::Uuid::now_v7())
    }
}

impl Default for TxId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for TxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for TxId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        uuid::Uuid::parse_str(s.trim()).map(TxId).map_err(|e| {
            Error::InvalidArgument(format!(
                "\"{}\" is not a transaction id (a UUID such as 0190b6f0-7c1e-7d3a-9b1e-5f2a9c4d8e10): {e}",
                s.chars().take(64).collect::<String>()
            ))
        })
    }
}

/// What the broker knows about a transaction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TxOutcome {
    /// Its commit record is on disk.
    Committed,
    /// It did not commit and will not (aborted, or rolled back when the broker stopped).
    Aborted,
    /// Open or committing right now; ask again.
    InProgress,
    /// No record: older than the broker's retention window, or never seen.
    Unknown,
}

/// [`Client::transaction_outcome`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TxStatus {
    pub outcome: TxOutcome,
    /// When it committed or aborted (Unix ms), if known.
    pub time_ms: Option<u64>,
    /// One line for people.
    pub detail: String,
    /// How long the broker remembers commits, in ms.
    pub retention_ms: u64,
}

impl TxStatus {
    pub(crate) fn from_wire(r: v1::TransactionOutcomeResponse) -> Self {
        let outcome = match v1::TxOutcome::try_from(r.outcome).unwrap_or(v1::TxOutcome::Unknown) {
            v1::TxOutcome::Unspecified => TxOutcome::Unknown,
            v1::TxOutcome::Committed => TxOutcome::Committed,
            v1::TxOutcome::Aborted => TxOutcome::Aborted,
            v1::TxOutcome::InProgress => TxOutcome::InProgress,
            v1::TxOutcome::Unknown => TxOutcome::Unknown,
        };
        TxStatus {
            outcome,
            time_ms: (r.time_ms > 0).then_some(r.time_ms),
            detail: r.detail,
            retention_ms: r.retention_ms,
        }
    }
}

/// [`Client::commit_once`]'s success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOnce {
    /// This call committed it: the ids of the messages sent.
    Committed(Vec<MessageId>),
    /// It had committed before (an earlier, in-doubt attempt); nothing was done again.
    AlreadyCommitted,
}

impl Transaction {
    pub(crate) async fn begin(client: &Client, id: TxId) -> Result<Transaction> {
        // The id goes first; the broker answers nothing to it (an id it refuses ends the
        // stream, and the next answer says why). On a stream kept from an earlier transaction
        // it waits to leave with the next requests (nothing waits for the broker): a
        // transaction of sends and a commit, or of a receive, is one write.
        let begin = v1::TransactRequest {
            op: Some(Op::Begin(v1::TxBegin {
                id: id.0.as_bytes().to_vec().into(),
            })),
        };
        let (stream, pending, sent) = match client.tx_pool.take() {
            Some(s) => (s, vec![begin], false),
            None => (TxStream::open(client, vec![begin]).await?, Vec::new(), true),
        };
        Ok(Transaction {
            id,
            stream,
            pool: client.tx_pool.clone(),
            call_timeout: client.options.call_timeout,
            pending,
            pending_bytes: 0,
            sent,
            sends: 0,
            client: client.clone(),
        })
    }

    /// Sends the pending requests in one batch. Before anything of the transaction has left,
    /// a kept stream that went stale meanwhile (the broker may end it any moment, or did) is
    /// swapped for a new one, so the transaction does not fail for it. A failure to send means
    /// the broker already ended the stream: the next answer says why.
    /// Returns whether the requests left (false: the request stream is closed).
    async fn flush(&mut self) -> Result<bool> {
        if !self.sent && self.stream.stale() {
            let batch = std::mem::take(&mut self.pending);
            self.pending_bytes = 0;
            self.stream = TxStream::open(&self.client, batch).await?;
            self.sent = true;
            return Ok(true);
        }
        Ok(self.flush_now())
    }

    /// [`Transaction::flush`] without looking at the stream first. False: the request stream
    /// is closed (the broker ended it, or the connection broke).
    fn flush_now(&mut self) -> bool {
        if self.pending.is_empty() {
            return !self.stream.out.is_closed();
        }
        self.sent = true;
        self.pending_bytes = 0;
        self.pool.count_batch();
        self.stream
            .out
            .send(std::mem::take(&mut self.pending))
            .is_ok()
    }

    /// The transaction's id.
    pub fn id(&self) -> TxId {
        self.id
    }

    /// Sends a request. If the broker has already ended the stream (it aborted the transaction:
    /// timeout, shutdown, an error), returns the broker's reason.
    async fn request(&mut self, op: Op) -> Result<()> {
        self.pending.push(v1::TransactRequest { op: Some(op) });
        if self.flush().await? {
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
        let request = v1::TransactRequest { op: Some(op) };
        self.pending_bytes += prost::Message::encoded_len(&request);
        self.pending.push(request);
        self.sends += 1;
        // Many staged bytes leave now rather than wait for the commit (on a stream that is
        // not stale; a stale one waits for the commit, which opens another). A failure here
        // means the broker already ended the transaction; `commit` reports why.
        if self.pending_bytes >= FLUSH_BYTES && (self.sent || !self.stream.stale()) {
            let _ = self.flush_now();
        }
        Ok(())
    }

    /// Receives one message from a transactional queue, waiting up to `timeout`.
    pub async fn receive(
        &mut self,
        queue: impl AsRef<str>,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.receive_selected(queue.as_ref(), timeout, None, "")
            .await
    }

    /// Receives the message with id `id` from a transactional queue (.NET `ReceiveById` with
    /// a transaction), waiting up to `timeout` for it. With a zero timeout and no such message:
    /// [`Error::NotFound`] (MQ_ERROR_MESSAGE_NOT_FOUND); the transaction stays open.
    pub async fn receive_by_id(
        &mut self,
        queue: impl AsRef<str>,
        id: MessageId,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.receive_selected(queue.as_ref(), timeout, Some(id), "")
            .await
    }

    /// Receives the first message whose correlation id is `correlation_id` from a
    /// transactional queue, as [`Transaction::receive_by_id`].
    pub async fn receive_by_correlation_id(
        &mut self,
        queue: impl AsRef<str>,
        correlation_id: &str,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        self.receive_selected(queue.as_ref(), timeout, None, correlation_id)
            .await
    }

    async fn receive_selected(
        &mut self,
        queue: &str,
        timeout: Duration,
        id: Option<MessageId>,
        correlation_id: &str,
    ) -> Result<Option<ReceivedMessage>> {
        FormatName::parse(queue)?;
        let selected = id.is_some() || !correlation_id.is_empty();
        self.request(Op::Receive(v1::TxReceive {
            queue: queue.to_string(),
            timeout_ms: timeout.as_millis() as u64,
            id: id.map(|i| i.as_bytes().to_vec().into()).unwrap_or_default(),
            correlation_id: correlation_id.to_string(),
            commit: false,
        }))
        .await?;
        let limit = self.call_timeout.saturating_add(timeout);
        let next = tokio::time::timeout(limit, self.next())
            .await
            .map_err(|_| deadline_error("to a transactional receive", limit))?;
        match next? {
            Res::Received(m) => Ok(Some(ReceivedMessage::from_wire(m)?)),
            Res::ReceiveTimeout(_) if selected && timeout.is_zero() => {
                Err(Error::NotFound(match id {
                    Some(id) => format!(
                        "no message with id {id} is waiting in queue \"{queue}\" (MQ_ERROR_MESSAGE_NOT_FOUND)"
                    ),
                    None => format!(
                        "no message with correlation id \"{}\" is waiting in queue \"{queue}\" (MQ_ERROR_MESSAGE_NOT_FOUND)",
                        correlation_id.chars().take(128).collect::<String>()
                    ),
                }))
            }
            Res::ReceiveTimeout(_) => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// Commits; returns the ids of the messages sent, in send order, once the commit record is
    /// on disk.
    ///
    /// If the answer is lost (the connection breaks, or no answer within the call deadline)
    /// after the commit was sent, the transaction may or may not have committed: that is
    /// [`Error::InDoubt`], carrying the id. Ask with [`Client::transaction_outcome`], or retry
    /// with [`Client::commit_once`] (at most once). A transaction whose id already committed
    /// fails with [`Error::AlreadyCommitted`] and does nothing.
    pub async fn commit(mut self) -> Result<Vec<MessageId>> {
        self.send_commit(Op::Commit(())).await?;
        let (ids, _) = self.await_commit().await?;
        Ok(ids)
    }

    /// Receives one message from a transactional queue and commits the transaction with it,
    /// in one round trip: the broker takes the message, writes the commit record (this
    /// receive, and every send and receive before it) and answers once it is on disk, with
    /// the message. Returns the message and the ids of the messages sent (as
    /// [`Transaction::commit`]). If no message arrives within `timeout`, the whole transaction
    /// is aborted (nothing of it happens) and the answer is `None`.
    ///
    /// The same as [`Transaction::receive`] followed by [`Transaction::commit`], for a
    /// transaction that commits whatever message it gets (MSMQ's single-message transactional
    /// receive), one round trip shorter; a failed commit, or an answer lost after the request
    /// left ([`Error::InDoubt`]), is as with `commit`: if it did not commit, the message is
    /// back at the head of its queue.
    pub async fn receive_and_commit(
        mut self,
        queue: impl AsRef<str>,
        timeout: Duration,
    ) -> Result<Option<(ReceivedMessage, Vec<MessageId>)>> {
        let queue = queue.as_ref();
        FormatName::parse(queue)?;
        self.send_commit(Op::Receive(v1::TxReceive {
            queue: queue.to_string(),
            timeout_ms: timeout.as_millis() as u64,
            commit: true,
            ..Default::default()
        }))
        .await?;
        let (ids, message) = self.await_commit_within(timeout, true).await?;
        match message {
            Some(m) => Ok(Some((ReceivedMessage::from_wire(m)?, ids))),
            None => Ok(None),
        }
    }

    /// Sends `op` (a commit, or a receive that commits) with whatever is pending. If it cannot
    /// leave (the broker ended the transaction and says why, or the connection broke before
    /// it left), the transaction did not commit: that error.
    async fn send_commit(&mut self, op: Op) -> Result<()> {
        self.pending.push(v1::TransactRequest { op: Some(op) });
        if self.flush().await? {
            return Ok(());
        }
        Err(match self.next_raw().await {
            Err((e, _)) => self.classify(e, true),
            Ok(r) => unexpected(r),
        })
    }

    /// The commit's answer: the ids of the messages sent and the message a receive-and-commit
    /// got (`None` for a plain commit, or if the receive got nothing and the transaction was
    /// aborted). Puts the stream back for the next transaction once answered.
    async fn await_commit(self) -> Result<(Vec<MessageId>, Option<v1::Message>)> {
        self.await_commit_within(Duration::ZERO, false).await
    }

    /// [`Transaction::await_commit`] allowing `wait` more for a receive (`folded`: the request
    /// was a receive that commits).
    async fn await_commit_within(
        mut self,
        wait: Duration,
        folded: bool,
    ) -> Result<(Vec<MessageId>, Option<v1::Message>)> {
        let id = self.id;
        let in_doubt = |reason: String| Error::InDoubt { id, reason };
        let limit = self.call_timeout.saturating_add(wait);
        let next = match tokio::time::timeout(limit, self.next_raw()).await {
            Ok(r) => r,
            Err(_) => {
                return Err(in_doubt(format!(
                    "no answer to the commit within {} (the client's call deadline)",
                    humantime::format_duration(limit)
                )))
            }
        };
        match next {
            Ok(Res::Committed(c)) => {
                self.pool.put(self.stream);
                // Committed, by the broker's word; an answer that does not name each message
                // sent by its id is not trusted for the ids.
                if c.ids.len() != self.sends || c.ids.iter().any(|b| b.len() != 16) {
                    return Err(in_doubt(format!(
                        "the broker's answer to the commit names {} ids for the {} messages sent, not one 16-byte id each",
                        c.ids.len(),
                        self.sends
                    )));
                }
                let ids = c
                    .ids
                    .iter()
                    .map(|b| uuid::Uuid::from_slice(b).expect("checked: 16 bytes"))
                    .collect();
                Ok((ids, c.message))
            }
            // A receive-and-commit that got nothing: the broker aborted the transaction.
            Ok(Res::Aborted(_)) if folded => {
                self.pool.put(self.stream);
                Ok((Vec::new(), None))
            }
            // A broker that predates TxReceive.commit answered the receive as a plain one and
            // keeps the transaction open: commit it (or abort it if nothing came) now.
            Ok(Res::Received(m)) if folded => {
                self.send_commit(Op::Commit(())).await?;
                let (ids, _) = Box::pin(self.await_commit()).await?;
                Ok((ids, Some(m)))
            }
            Ok(Res::ReceiveTimeout(_)) if folded => {
                self.abort().await?;
                Ok((Vec::new(), None))
            }
            Ok(other) => Err(unexpected(other)),
            Err((e, definite)) => Err(self.classify(e, definite)),
        }
    }

    /// What an error ending the transaction's stream after the commit was sent means for its
    /// outcome. `definite`: the broker said so itself (it did not commit).
    fn classify(&self, e: Error, definite: bool) -> Error {
        match e {
            Error::AlreadyExists(_) => Error::AlreadyCommitted { id: self.id },
            e if definite => e,
            // A lost connection after the commit left: nobody knows whether it committed.
            e => Error::InDoubt {
                id: self.id,
                reason: e.to_string(),
            },
        }
    }

    /// Aborts: nothing sent in the transaction is stored; received messages go back.
    pub async fn abort(mut self) -> Result<()> {
        self.request(Op::Abort(())).await?;
        match self.next().await? {
            Res::Aborted(_) => {
                self.pool.put(self.stream);
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    async fn next(&mut self) -> Result<Res> {
        self.next_raw().await.map_err(|(e, _)| match e {
            Error::AlreadyExists(_) => Error::AlreadyCommitted { id: self.id },
            e => e,
        })
    }

    /// The next answer, or the error and whether the broker itself ended the transaction
    /// (then it did not commit) rather than the connection breaking.
    async fn next_raw(&mut self) -> std::result::Result<Res, (Error, bool)> {
        match self.stream.inbound.message().await {
            Ok(Some(v1::TransactResponse { result: Some(r) })) => Ok(r),
            Ok(Some(_)) => Err((
                Error::Internal("the broker sent an empty transaction response".into()),
                false,
            )),
            Ok(None) => Err((
                Error::Unavailable(
                    "the broker ended the transaction's stream without an answer".into(),
                ),
                false,
            )),
            Err(status) => {
                let definite = status.metadata().get(mq_proto::TX_ENDED_METADATA).is_some();
                Err((Error::from(status), definite))
            }
        }
    }
}

fn unexpected(r: Res) -> Error {
    Error::Internal(format!(
        "unexpected transaction response from the broker: {r:?}"
    ))
}
