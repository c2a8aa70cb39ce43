//! [`Sender`]: pipelined, batched sends on one stream. Messages are gathered into batches while
//! earlier batches are in flight; the broker acknowledges each batch once it is stored. A window
//! bounds what is unacknowledged, so a fast producer waits instead of buffering without limit.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use mq_proto::v1;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::{unix_ms, Message, MessageId};
use crate::transaction::TxId;

/// One window unit per message plus one per this many body bytes.
const BYTES_PER_UNIT: usize = 4096;

/// How a [`Sender`] pipelines.
#[derive(Debug, Clone)]
pub struct SenderOptions {
    /// Most unacknowledged messages.
    pub window_messages: usize,
    /// Most unacknowledged body bytes (approximately).
    pub window_bytes: usize,
    /// Most messages in one batch.
    pub max_batch_messages: usize,
    /// A batch is cut once it holds this many body bytes.
    pub max_batch_bytes: usize,
    /// Send each message as its own single-message transaction (MSMQ's `MQ_SINGLE_MESSAGE`):
    /// required for transactional queues, refused by the others. Acknowledged once committed
    /// (on disk); priority is ignored (0). Each message's transaction has an id (a [`TxId`]
    /// derived from the stream's id and the message's number): if the stream breaks before its
    /// answer, its receipt fails with [`Error::InDoubt`] carrying that id
    /// ([`Sender::in_doubt_ids`] lists them all); [`Client::transaction_outcome`] tells whether
    /// it committed, and [`Client::send_once`] retries it at most once.
    pub transactional: bool,
}

impl Default for SenderOptions {
    fn default() -> Self {
        SenderOptions {
            window_messages: 8192,
            window_bytes: 32 * 1024 * 1024,
            max_batch_messages: 512,
            max_batch_bytes: 1024 * 1024,
            transactional: false,
        }
    }
}

type Reply = oneshot::Sender<Result<MessageId>>;

struct Item {
    msg: v1::OutMessage,
    units: u32,
    reply: Option<Reply>,
}

struct PendingBatch {
    first_seq: u64,
    units: Vec<u32>,
    replies: Vec<Option<Reply>>,
}

/// The batches handed to the stream and not yet answered, and whether the stream ended: one
/// lock, so a batch is either registered before the end (and failed in doubt by
/// [`end_stream`]) or refused by the batcher after it (never sent) — never registered after
/// the pending batches were failed, where nothing would answer it.
#[derive(Default)]
struct Pending {
    batches: VecDeque<PendingBatch>,
    /// Why the stream ended, once it has (set by [`end_stream`]).
    ended: Option<Error>,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Wakes the batcher when the stream ends (it may be waiting for room to send).
    ended: Notify,
    /// The first failure: a refused message, or the stream's end.
    first_error: Mutex<Option<Error>>,
    /// Set when the stream is gone; nothing more will be acknowledged.
    dead: Mutex<Option<Error>>,
    submitted: AtomicU64,
    acknowledged: AtomicU64,
    failed: AtomicU64,
    /// Messages handed to the stream whose answer never came because the stream ended: they
    /// may or may not be stored.
    in_doubt: AtomicU64,
    /// Transactional senders: the stream's id (`mq_proto::txid`); message `seq` is the
    /// transaction `stream | seq`.
    tx_stream: Option<u128>,
    /// The seqs of the in-doubt messages (inclusive ranges).
    in_doubt_seqs: Mutex<Vec<(u64, u64)>>,
}

impl Shared {
    fn record(&self, e: &Error) {
        let mut g = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e.clone());
        }
    }
    fn dead(&self) -> Option<Error> {
        self.dead.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A pipelining sender, from [`Client::sender`] or [`crate::Queue::sender`].
///
/// ```no_run
/// # async fn demo() -> mq_client::Result<()> {
/// use mq_client::{Client, Message, SenderOptions};
/// let client = Client::connect("http://127.0.0.1:1801").await?;
/// let sender = client.sender(r".\private$\orders", SenderOptions::default()).await?;
/// for i in 0..10_000 {
///     sender.send(Message::new(format!("order {i}"))).await?;
/// }
/// let summary = sender.close().await?; // waits for every acknowledgement
/// assert_eq!(summary.acknowledged, 10_000);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Sender {
    tx: Option<mpsc::UnboundedSender<Item>>,
    shared: Arc<Shared>,
    window: Arc<Semaphore>,
    window_units: u32,
    progress: watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// How long `flush` and `close` wait for acknowledgements; `None`: as long as it takes.
    ack_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("submitted", &self.submitted)
            .field("acknowledged", &self.acknowledged)
            .finish()
    }
}

/// What a closed sender achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendSummary {
    /// Messages the broker acknowledged (stored).
    pub acknowledged: u64,
    /// Messages handed to [`Sender::send`].
    pub submitted: u64,
}

/// The outcome of one pipelined send: resolves to the message id once acknowledged.
#[derive(Debug)]
pub struct Receipt(oneshot::Receiver<Result<MessageId>>);

impl Future for Receipt {
    type Output = Result<MessageId>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(Error::Unavailable(
                    "the send stream ended before this message was acknowledged".into(),
                ))
            })
        })
    }
}

impl Sender {
    pub(crate) async fn open(
        client: Client,
        destination: String,
        options: SenderOptions,
    ) -> Result<Sender> {
        // The acknowledgements name every message of a batch (mq_proto::entries bounds them).
        // (At most a million: the process-wide bound also guards a broker the process hosts.)
        mq_proto::entries::allow_batch_messages(options.max_batch_messages.min(1_000_000));
        let window_units =
            (options.window_messages + options.window_bytes / BYTES_PER_UNIT).max(1) as u32;
        let (out_tx, out_rx) = mpsc::channel::<v1::SendRequest>(16);
        let mut grpc = client.rpc.clone();
        // The requests go out through `large_sends` (large bodies not copied again).
        let source = crate::large_sends::SendSource::new(out_rx);
        let mut req = tonic::Request::new(source.stream());
        req.extensions_mut().insert(source);
        let rpc = grpc.send(req);
        let mut inbound = client
            .call("opening the send stream", std::time::Duration::ZERO, rpc)
            .await?;
        let (tx, rx) = mpsc::unbounded_channel::<Item>();
        let tx_stream = options.transactional.then(|| {
            mq_proto::txid::new_stream(
                unix_ms(std::time::SystemTime::now()),
                uuid::Uuid::new_v4().as_u128(),
            )
        });
        let shared = Arc::new(Shared {
            tx_stream,
            ..Shared::default()
        });
        let window = Arc::new(Semaphore::new(window_units as usize));
        let (progress_tx, progress) = watch::channel(0u64);

        let batcher = tokio::spawn(batch_loop(rx, out_tx, shared.clone(), destination, options));
        let acker = {
            let shared = shared.clone();
            let window = window.clone();
            tokio::spawn(async move {
                let end = loop {
                    match inbound.message().await {
                        Ok(Some(ack)) => {
                            if let Err(e) = apply_ack(&shared, &window, ack) {
                                break e;
                            }
                            progress_tx.send_replace(
                                shared.acknowledged.load(Ordering::Acquire)
                                    + shared.failed.load(Ordering::Acquire),
                            );
                        }
                        Ok(None) => {
                            break Error::Unavailable("the broker closed the send stream".into())
                        }
                        Err(status) => break Error::from(status),
                    }
                };
                end_stream(&shared, &window, end);
                progress_tx.send_replace(u64::MAX);
            })
        };
        Ok(Sender {
            tx: Some(tx),
            shared,
            window,
            window_units,
            progress,
            tasks: vec![batcher, acker],
            ack_timeout: None,
        })
    }

    /// Queues a message for sending. Returns once it fits in the window (not when acknowledged);
    /// fails only if the stream to the broker is gone. Refusals of single messages (quota, a label
    /// too long, ...) are reported by [`Sender::flush`] and [`Sender::close`].
    pub async fn send(&self, message: Message) -> Result<()> {
        self.enqueue(message, None).await
    }

    /// Like [`Sender::send`], and returns a [`Receipt`] that resolves to the message's id.
    pub async fn send_with_receipt(&self, message: Message) -> Result<Receipt> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(message, Some(tx)).await?;
        Ok(Receipt(rx))
    }

    async fn enqueue(&self, message: Message, reply: Option<Reply>) -> Result<()> {
        if let Some(e) = self.shared.dead() {
            return Err(e);
        }
        let msg = message.into_wire();
        let units = (1 + msg.body.len() / BYTES_PER_UNIT).min(self.window_units as usize) as u32;
        match self.window.acquire_many(units).await {
            Ok(p) => p.forget(),
            Err(_) => {
                return Err(self
                    .shared
                    .dead()
                    .unwrap_or_else(|| Error::Unavailable("the send stream is closed".into())))
            }
        }
        let seq = self.shared.submitted.fetch_add(1, Ordering::AcqRel) + 1;
        if self.shared.tx_stream.is_some() && seq > mq_proto::txid::MAX_SEQ {
            self.shared.submitted.fetch_sub(1, Ordering::AcqRel);
            self.window.add_permits(units as usize);
            return Err(Error::InvalidArgument(format!(
                "a transactional sender sends at most {} messages; open a new one",
                mq_proto::txid::MAX_SEQ
            )));
        }
        let tx = self.tx.as_ref().expect("sender is open until close");
        if tx.send(Item { msg, units, reply }).is_err() {
            return Err(self
                .shared
                .dead()
                .unwrap_or_else(|| Error::Unavailable("the send stream is closed".into())));
        }
        Ok(())
    }

    /// Whether the stream has ended (the broker closed it, the connection broke): nothing more
    /// can be sent on it.
    pub fn is_dead(&self) -> bool {
        self.shared.dead().is_some()
    }

    /// Messages acknowledged so far.
    pub fn acknowledged(&self) -> u64 {
        self.shared.acknowledged.load(Ordering::Acquire)
    }

    /// How long [`Sender::flush`] and [`Sender::close`] wait for the broker to acknowledge
    /// what was sent; past it they fail with [`Error::Timeout`] and the stream is given up: the
    /// unacknowledged messages may or may not be stored ([`Sender::in_doubt`],
    /// [`Sender::in_doubt_ids`]). `None` (the default): as long as the connection lives.
    pub fn set_ack_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.ack_timeout = timeout;
    }

    /// Messages whose outcome is unknown: handed to the stream, and the stream ended (the
    /// connection broke, the broker stopped) before their acknowledgement or refusal came. They
    /// may or may not be stored. 0 while the stream is alive.
    pub fn in_doubt(&self) -> u64 {
        self.shared.in_doubt.load(Ordering::Acquire)
    }

    /// Transactional senders: the transaction ids of the in-doubt messages ([`Sender::in_doubt`]),
    /// in send order. Ask about each with [`Client::transaction_outcome`], or retry it with
    /// [`Client::send_once`] (commits at most once). Empty for other senders.
    pub fn in_doubt_ids(&self) -> Vec<TxId> {
        let Some(stream) = self.shared.tx_stream else {
            return Vec::new();
        };
        let ranges = self
            .shared
            .in_doubt_seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ranges
            .into_iter()
            .flat_map(|(a, b)| (a..=b).map(move |seq| tx_id(stream, seq)))
            .collect()
    }

    /// Waits until every message sent so far is acknowledged or refused. Returns the first
    /// refusal, or the error that ended the stream, if any; [`Error::Timeout`] if the
    /// acknowledgements did not come within [`Sender::set_ack_timeout`].
    pub async fn flush(&mut self) -> Result<SendSummary> {
        let submitted = self.shared.submitted.load(Ordering::Acquire);
        // A stream already given up (an earlier timeout) answers nothing more: no wait.
        let timed_out = self.shared.dead().is_none() && {
            let wait = self.progress.wait_for(|done| *done >= submitted);
            match self.ack_timeout {
                Some(t) => tokio::time::timeout(t, wait).await.is_err(),
                None => {
                    let _ = wait.await;
                    false
                }
            }
        };
        if let Some(t) = self.ack_timeout.filter(|_| timed_out) {
            let acked = self.shared.acknowledged.load(Ordering::Acquire)
                + self.shared.failed.load(Ordering::Acquire);
            let e = Error::Timeout(format!(
                "the broker answered {acked} of the {submitted} messages sent within {} (Sender::set_ack_timeout); the others may or may not be stored",
                humantime::format_duration(t)
            ));
            // The stream is given up: what it carried unanswered is in doubt (`in_doubt`,
            // `in_doubt_ids`), and nothing more is sent on it.
            end_stream(&self.shared, &self.window, e.clone());
            return Err(e);
        }
        self.summary()
    }

    fn summary(&self) -> Result<SendSummary> {
        let s = SendSummary {
            acknowledged: self.shared.acknowledged.load(Ordering::Acquire),
            submitted: self.shared.submitted.load(Ordering::Acquire),
        };
        if let Some(e) = self
            .shared
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(e);
        }
        if s.acknowledged < s.submitted {
            if let Some(e) = self.shared.dead() {
                return Err(e);
            }
        }
        Ok(s)
    }

    /// Flushes and closes the stream. Once everything is answered, the broker's end of the
    /// stream is waited for at most [`CLOSE_WAIT`] (or the ack timeout, if shorter): what was
    /// acknowledged is stored, whether or not it ends the stream.
    pub async fn close(mut self) -> Result<SendSummary> {
        let r = self.flush().await;
        self.tx = None;
        let timed_out = matches!(r, Err(Error::Timeout(_)));
        let wait = self.ack_timeout.unwrap_or(CLOSE_WAIT).min(CLOSE_WAIT);
        for mut t in self.tasks.drain(..) {
            // The broker does not answer: do not wait for the stream's end.
            if timed_out || tokio::time::timeout(wait, &mut t).await.is_err() {
                t.abort();
            }
        }
        r
    }
}

/// How long [`Sender::close`] waits for the broker to end the stream once everything sent is
/// answered, without an ack timeout.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Sender {
    fn drop(&mut self) {
        // Dropping the item channel ends the batch loop, which ends the request stream.
        self.tx = None;
    }
}

/// The transaction id of message `seq` of the transactional stream `stream`.
fn tx_id(stream: u128, seq: u64) -> TxId {
    TxId(uuid::Uuid::from_u128(mq_proto::txid::message_id(
        stream, seq,
    )))
}

/// The stream is gone (`end` says why): every batch handed to it and not answered is in doubt
/// (it may or may not be stored), nothing more is acknowledged, and the window closes.
fn end_stream(shared: &Shared, window: &Semaphore, end: Error) {
    let pending: Vec<_> = {
        let mut p = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.ended = Some(end.clone());
        p.batches.drain(..).collect()
    };
    shared.ended.notify_waiters();
    if !pending.is_empty() {
        shared.record(&end);
    }
    let lost: usize = pending.iter().map(|b| b.replies.len()).sum();
    shared.in_doubt.fetch_add(lost as u64, Ordering::AcqRel);
    if let (Some(first), Some(last)) = (pending.first(), pending.last()) {
        let through = last.first_seq + last.replies.len() as u64 - 1;
        shared
            .in_doubt_seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((first.first_seq, through));
    }
    for b in pending {
        for (i, r) in b.replies.into_iter().enumerate() {
            let Some(r) = r else { continue };
            let e = match shared.tx_stream {
                Some(stream) => Error::InDoubt {
                    id: tx_id(stream, b.first_seq + i as u64),
                    reason: end.to_string(),
                },
                None => end.clone(),
            };
            let _ = r.send(Err(e));
        }
    }
    *shared.dead.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
    window.close();
}

/// Checks an acknowledgement against the batch it must answer: the same first seq and count,
/// one id per message (16 bytes, empty only where a failure names the message), failures in
/// ascending seq inside the batch. The broker is not trusted: anything else is
/// [`Error::Internal`], which ends the stream with the batch still in doubt.
fn check_ack(batch: &PendingBatch, ack: &v1::SendResponse) -> Result<()> {
    let n = batch.replies.len();
    if batch.first_seq != ack.first_seq || ack.count as usize != n {
        return Err(Error::Internal(format!(
            "the broker acknowledged batch {} ({} messages) where batch {} ({n} messages) was expected",
            ack.first_seq, ack.count, batch.first_seq
        )));
    }
    if ack.ids.len() != n {
        return Err(Error::Internal(format!(
            "the broker answered batch {} of {n} messages with {} ids",
            ack.first_seq,
            ack.ids.len()
        )));
    }
    let mut last = None;
    for f in &ack.failures {
        let i = f.seq.wrapping_sub(batch.first_seq);
        if f.seq < batch.first_seq || i >= n as u64 || last.is_some_and(|l| f.seq <= l) {
            return Err(Error::Internal(format!(
                "the broker refused seq {} in its answer to batch {} ({n} messages): not in the batch, or not in ascending order",
                f.seq, batch.first_seq
            )));
        }
        last = Some(f.seq);
    }
    // The failures are in ascending order now: walked beside the ids (no allocation per batch).
    let mut failures = ack
        .failures
        .iter()
        .map(|f| f.seq - batch.first_seq)
        .peekable();
    for (i, id) in ack.ids.iter().enumerate() {
        let failed = failures.next_if_eq(&(i as u64)).is_some();
        if !failed && id.len() != 16 {
            return Err(Error::Internal(format!(
                "the broker acknowledged message {} with an id of {} bytes",
                batch.first_seq + i as u64,
                id.len()
            )));
        }
    }
    Ok(())
}

fn apply_ack(shared: &Shared, window: &Semaphore, ack: v1::SendResponse) -> Result<()> {
    let batch = {
        let mut p = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Some(front) = p.batches.front() else {
            return Err(Error::Internal(format!(
                "the broker acknowledged batch {} that was never sent",
                ack.first_seq
            )));
        };
        // A bad answer leaves the batch pending: the stream's end puts it in doubt.
        check_ack(front, &ack)?;
        p.batches.pop_front().expect("checked above")
    };
    let mut failures = ack.failures.into_iter().peekable();
    let mut ok = 0u64;
    let mut failed = 0u64;
    for (i, reply) in batch.replies.into_iter().enumerate() {
        let seq = batch.first_seq + i as u64;
        let result = match failures.peek() {
            Some(f) if f.seq == seq => {
                let f = failures.next().expect("peeked");
                let e = Error::from_failure(f.code, &f.reason, f.message);
                shared.record(&e);
                failed += 1;
                Err(e)
            }
            _ => {
                ok += 1;
                Ok(uuid::Uuid::from_slice(&ack.ids[i]).expect("checked: 16 bytes"))
            }
        };
        if let Some(r) = reply {
            let _ = r.send(result);
        }
    }
    shared.acknowledged.fetch_add(ok, Ordering::AcqRel);
    shared.failed.fetch_add(failed, Ordering::AcqRel);
    window.add_permits(batch.units.iter().map(|u| *u as usize).sum());
    Ok(())
}

async fn batch_loop(
    mut rx: mpsc::UnboundedReceiver<Item>,
    out: mpsc::Sender<v1::SendRequest>,
    shared: Arc<Shared>,
    destination: String,
    options: SenderOptions,
) {
    let mut next_seq = 1u64;
    let tx_stream = shared
        .tx_stream
        .map(|s| bytes::Bytes::copy_from_slice(&s.to_be_bytes()))
        .unwrap_or_default();
    loop {
        let first = tokio::select! {
            biased;
            _ = stream_ended(&shared) => break,
            first = rx.recv() => match first {
                Some(first) => first,
                None => return, // the sender is closed or dropped
            },
        };
        let mut bytes = first.msg.body.len();
        let mut items = vec![first];
        while items.len() < options.max_batch_messages && bytes < options.max_batch_bytes {
            match rx.try_recv() {
                Ok(i) => {
                    bytes += i.msg.body.len();
                    items.push(i);
                }
                Err(_) => break,
            }
        }
        let first_seq = next_seq;
        next_seq += items.len() as u64;
        let mut messages = Vec::with_capacity(items.len());
        let mut units = Vec::with_capacity(items.len());
        let mut replies = Vec::with_capacity(items.len());
        for i in items {
            messages.push(i.msg);
            units.push(i.units);
            replies.push(i.reply);
        }
        // Registered before it is handed over (its acknowledgement may come at once), unless
        // the stream already ended: then it never leaves.
        let refused = {
            let mut p = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
            match &p.ended {
                Some(end) => Some((replies, end.clone())),
                None => {
                    p.batches.push_back(PendingBatch {
                        first_seq,
                        units,
                        replies,
                    });
                    None
                }
            }
        };
        if let Some((replies, end)) = refused {
            for r in replies.into_iter().flatten() {
                let _ = r.send(Err(not_sent(&end)));
            }
            break;
        }
        let batch = v1::SendRequest {
            first_seq,
            destination: destination.clone(),
            messages,
            transactional: options.transactional,
            tx_stream: tx_stream.clone(),
        };
        // A registered batch is answered by the acknowledgement task (acknowledged, refused,
        // or in doubt when the stream ends), also if the send fails or is given up here.
        tokio::select! {
            biased;
            _ = stream_ended(&shared) => break,
            sent = out.send(batch) => if sent.is_err() { break },
        }
    }
    // The stream is gone (or no longer takes requests): what is still queued never left.
    // Closing the channel makes later sends fail at `Sender::enqueue`.
    rx.close();
    let end = shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .ended
        .clone()
        .unwrap_or_else(|| Error::Unavailable("the send stream is closed".into()));
    while let Some(item) = rx.recv().await {
        if let Some(r) = item.reply {
            let _ = r.send(Err(not_sent(&end)));
        }
    }
}

/// Resolves once [`end_stream`] has run.
async fn stream_ended(shared: &Shared) {
    loop {
        let woken = shared.ended.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ended
            .is_some()
        {
            return;
        }
        woken.await;
    }
}

/// The answer for a message that was never handed to the stream because it had ended.
fn not_sent(end: &Error) -> Error {
    Error::Unavailable(format!(
        "not sent: the send stream had ended before this message was handed to it ({end})"
    ))
}

#[cfg(test)]
mod tests {
    //! The race behind the flaky `in_doubt_pipelined` kill -9 test (issue 19): a message the
    //! batcher takes after the acknowledgement task ended the stream must still be answered.
    use super::*;
    use std::time::Duration;

    /// Generous bound on a receipt that should resolve at once (a loaded machine); the bug
    /// being guarded against is a receipt that never resolves.
    const WAIT: Duration = Duration::from_secs(10);

    fn transactional() -> (Arc<Shared>, Semaphore) {
        let shared = Arc::new(Shared {
            tx_stream: Some(0x0123_4567_89ab_cdef_0000_0000_0000_0000),
            ..Shared::default()
        });
        (shared, Semaphore::new(1024))
    }

    fn item(body: &str) -> (Item, Receipt) {
        let (tx, rx) = oneshot::channel();
        let msg = Message::new(body.to_string()).into_wire();
        (
            Item {
                msg,
                units: 1,
                reply: Some(tx),
            },
            Receipt(rx),
        )
    }

    fn options() -> SenderOptions {
        SenderOptions {
            transactional: true,
            ..SenderOptions::default()
        }
    }

    /// A broker's acknowledgement is checked before it settles anything: ids missing or of
    /// the wrong length, failures out of order, twice or outside the batch are refused and the
    /// batch stays pending (in doubt once the stream ends), never counted as stored.
    #[test]
    fn acknowledgements_that_do_not_fit_the_batch_settle_nothing() {
        // A batch of seqs 10 to 12 waiting for its answer.
        let three_pending = || {
            let (shared, window) = transactional();
            shared
                .pending
                .lock()
                .unwrap()
                .batches
                .push_back(PendingBatch {
                    first_seq: 10,
                    units: vec![1; 3],
                    replies: vec![None, None, None],
                });
            (shared, window)
        };
        let id = bytes::Bytes::from_static(&[7u8; 16]);
        let fail = |seq| v1::SendFailure {
            seq,
            ..Default::default()
        };
        let ack = |ids: Vec<bytes::Bytes>, failures: Vec<v1::SendFailure>| v1::SendResponse {
            first_seq: 10,
            count: 3,
            ids,
            failures,
        };
        let none = bytes::Bytes::new();
        for (bad, says) in [
            (ack(vec![], vec![]), "with 0 ids"),
            (ack(vec![id.clone(); 2], vec![]), "with 2 ids"),
            (
                ack(vec![id.clone(), none.clone(), id.clone()], vec![]),
                "an id of 0 bytes",
            ),
            (
                ack(vec![none.clone(); 3], vec![fail(12), fail(10), fail(11)]),
                "ascending",
            ),
            (
                ack(vec![none.clone(); 3], vec![fail(10), fail(10)]),
                "ascending",
            ),
            (
                ack(vec![none.clone(); 3], vec![fail(13)]),
                "not in the batch",
            ),
            (
                ack(vec![none.clone(); 3], vec![fail(9)]),
                "not in the batch",
            ),
        ] {
            let (shared, window) = three_pending();
            let e = apply_ack(&shared, &window, bad).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert_eq!(shared.pending.lock().unwrap().batches.len(), 1, "{e}");
            assert_eq!(shared.acknowledged.load(Ordering::Acquire), 0);
        }
        let (shared, window) = three_pending();
        apply_ack(
            &shared,
            &window,
            ack(vec![id.clone(), none, id], vec![fail(11)]),
        )
        .unwrap();
        assert_eq!(shared.acknowledged.load(Ordering::Acquire), 2);
        assert_eq!(shared.failed.load(Ordering::Acquire), 1);
        assert!(shared.pending.lock().unwrap().batches.is_empty());
    }

    /// `Sender::enqueue` checked the stream before the acknowledgement task ended it, so its
    /// item is queued; the batcher takes it only after the stream ended (and after the pending
    /// batches were failed). The request channel is still open (the HTTP/2 stream has not
    /// dropped it yet). The receipt must resolve — "not sent" (it never left) — not wait for
    /// ever while the `Sender` is alive.
    #[tokio::test]
    async fn a_message_batched_after_the_stream_ended_is_answered_not_sent() {
        let (shared, window) = transactional();
        let (items, rx) = mpsc::unbounded_channel();
        let (out, mut out_rx) = mpsc::channel(16);
        end_stream(
            &shared,
            &window,
            Error::Unavailable("the broker closed the send stream".into()),
        );
        let (it, receipt) = item("late");
        items.send(it).unwrap();
        let batcher = tokio::spawn(batch_loop(rx, out, shared.clone(), "q".into(), options()));
        let answer = tokio::time::timeout(WAIT, receipt)
            .await
            .expect("the receipt resolves while the sender (`items`) is alive");
        assert!(
            matches!(answer, Err(Error::Unavailable(_))),
            "never handed to the stream: not sent, {answer:?}"
        );
        assert_eq!(shared.in_doubt.load(Ordering::Acquire), 0);
        assert!(
            out_rx.try_recv().is_err(),
            "nothing goes out after the stream ended"
        );
        // The batcher stops (it drops the request stream) although the sender lives on.
        tokio::time::timeout(WAIT, batcher)
            .await
            .expect("the batcher ends with the stream")
            .unwrap();
        drop(items);
    }

    /// The batcher waits for room in the request channel (the HTTP/2 stream stopped taking
    /// requests) when the stream ends: the batch it holds was handed over (in doubt), and the
    /// messages queued behind it are answered "not sent" — nothing waits for ever.
    #[tokio::test]
    async fn a_batcher_blocked_on_a_full_request_channel_stops_when_the_stream_ends() {
        let (shared, window) = transactional();
        let (items, rx) = mpsc::unbounded_channel();
        let (out, out_rx) = mpsc::channel(1);
        out.try_send(v1::SendRequest::default()).unwrap(); // full
        let batcher = tokio::spawn(batch_loop(rx, out, shared.clone(), "q".into(), options()));
        let (a, first) = item("a");
        items.send(a).unwrap();
        // Wait until the batcher registered the first batch (and so is blocked sending it).
        let mut registered = false;
        for _ in 0..10_000 {
            if !shared.pending.lock().unwrap().batches.is_empty() {
                registered = true;
                break;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(registered, "the batcher takes the first message");
        end_stream(
            &shared,
            &window,
            Error::Unavailable("the broker closed the send stream".into()),
        );
        let (b, second) = item("b");
        items
            .send(b)
            .unwrap_or_else(|_| panic!("the item channel is open"));
        let first = tokio::time::timeout(WAIT, first)
            .await
            .expect("the first receipt resolves");
        assert!(
            matches!(first, Err(Error::InDoubt { .. })),
            "handed to the stream: in doubt, {first:?}"
        );
        let second = tokio::time::timeout(WAIT, second)
            .await
            .expect("the second receipt resolves while the sender (`items`) is alive");
        assert!(
            matches!(second, Err(Error::Unavailable(_))),
            "never handed to the stream: not sent, {second:?}"
        );
        assert_eq!(shared.in_doubt.load(Ordering::Acquire), 1);
        tokio::time::timeout(WAIT, batcher)
            .await
            .expect("the batcher ends with the stream")
            .unwrap();
        drop((items, out_rx));
    }
}
