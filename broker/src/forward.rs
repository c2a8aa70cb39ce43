//! The sending side of store-and-forward: one outgoing queue per destination broker, and its
//! forwarder.
//!
//! A send to a queue on another broker is stored here, in the outgoing queue for that broker
//! (`host:port`): in the journal for recoverable and transactional messages, in memory for
//! express ones. The forwarder connects to the destination broker and streams batches
//! (`Forward`), pipelined up to a window; the destination answers each batch, in order, once it
//! has stored it. Only then are the messages removed here. Messages the destination refuses
//! come back in the answer with a class and go to this broker's dead-letter queue.
//!
//! The outgoing queue is strict FIFO, and its `seq` is the stream's sequence: the destination
//! keeps the highest sequence it stored per stream (in its journal, atomically with the
//! messages) and drops anything at or below it, so a batch resent after a lost answer or a
//! restart of either side is stored once, in order. Express messages carry sequence 0 and are
//! not deduplicated (best effort).
//!
//! When the connection fails, unacknowledged messages go back to the head of the queue and the
//! forwarder retries with exponential back-off (`--forward-retry-min` to
//! `--forward-retry-max`), resuming where the last acknowledgement left off.

use std::collections::{HashMap, VecDeque};

use mq_proto::limits::{quote, truncate, MAX_REASON_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, forward_service_client::ForwardServiceClient, OutgoingState};
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;

use crate::broker::Broker;
use crate::deadletter::DeadLetterItem;
use crate::message::{now_ms, Delivery};
use crate::queue::{Entry, Queue, QueueRole};

/// Most messages in one forwarded batch.
const BATCH_MESSAGES: usize = 512;
/// "cannot deliver; will retry" lines: one a second for all outgoing queues.
static RETRY_LOG: crate::ratelog::RateLimitedLog = crate::ratelog::RateLimitedLog::new(1000);
/// A batch is cut once its bodies reach this size (at first: see `Outgoing::batch_bytes`).
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// The smallest a batch is cut to after acknowledgements that did not come in time.
const MIN_BATCH_BYTES: usize = 64 * 1024;
/// Batches sent and not yet acknowledged, at most.
const WINDOW_BATCHES: usize = 16;
/// Body bytes sent and not yet acknowledged, at most.
const WINDOW_BYTES: usize = 32 * 1024 * 1024;
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct Status {
    state: OutgoingState,
    last_error: String,
    next_retry_ms: u64,
}

/// One outgoing queue and its forwarder's state.
#[derive(Debug)]
pub struct Outgoing {
    queue: Arc<Queue>,
    destination: String,
    stream_id: uuid::Uuid,
    paused: AtomicBool,
    started: AtomicBool,
    status: Mutex<Status>,
    forwarded: AtomicU64,
    dead_lettered: AtomicU64,
    /// Failed attempts to reach the destination, and Unix ms of the last (0: none).
    retries: AtomicU64,
    last_error_ms: AtomicU64,
    /// Wakes the forwarder: paused, resumed.
    wake: Notify,
    /// Held while the paused flag changes and its definition record is handed to the journal,
    /// so the journal's order of pause/resume records is the order the flag took its values.
    pause_order: Mutex<()>,
    /// Unix ms of the last send to it or acknowledgement from its destination (idle expiry).
    last_used_ms: AtomicU64,
    /// Where its batches are cut, in body bytes: a quarter of what it was (down to
    /// `MIN_BATCH_BYTES`) after a batch was not acknowledged within `--forward-ack-timeout`,
    /// twice (up to `BATCH_BYTES`) after a batch was acknowledged within a quarter of it. A
    /// link too slow to carry a whole batch in the timeout was given up and retried with the
    /// same batch for good.
    batch_bytes: AtomicUsize,
}

impl Outgoing {
    pub(crate) fn new(queue: Arc<Queue>) -> Self {
        let QueueRole::Outgoing {
            destination,
            stream_id,
            paused,
        } = queue.def().role.clone()
        else {
            panic!("an outgoing queue's definition has the Outgoing role");
        };
        Outgoing {
            queue,
            destination,
            stream_id,
            paused: AtomicBool::new(paused),
            started: AtomicBool::new(false),
            status: Mutex::new(Status {
                state: if paused {
                    OutgoingState::Onhold
                } else {
                    OutgoingState::Inactive
                },
                last_error: String::new(),
                next_retry_ms: 0,
            }),
            forwarded: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            last_error_ms: AtomicU64::new(0),
            wake: Notify::new(),
            pause_order: Mutex::new(()),
            last_used_ms: AtomicU64::new(now_ms()),
            batch_bytes: AtomicUsize::new(BATCH_BYTES),
        }
    }

    /// Where its next batch is cut, in body bytes.
    pub(crate) fn batch_bytes(&self) -> usize {
        self.batch_bytes.load(Ordering::Relaxed)
    }

    /// A batch was not acknowledged in time: smaller ones from here on. Returns the new size.
    fn shrink_batches(&self) -> usize {
        let smaller = (self.batch_bytes() / 4).max(MIN_BATCH_BYTES);
        self.batch_bytes.store(smaller, Ordering::Relaxed);
        smaller
    }

    /// A batch was acknowledged well within the time it had: larger ones may be.
    fn grow_batches(&self) {
        let larger = (self.batch_bytes() * 2).min(BATCH_BYTES);
        self.batch_bytes.store(larger, Ordering::Relaxed);
    }

    /// Notes a use (a send to it, an acknowledgement): it is not idle.
    pub(crate) fn touch(&self) {
        self.last_used_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// Unix ms of the last use.
    pub(crate) fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Relaxed)
    }

    /// Wakes the forwarder (it ends once its queue is deleted).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// `host:port` of the destination broker.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    pub fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// True the first time: the caller starts the forwarder.
    pub(crate) fn mark_started(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }

    /// Messages acknowledged by the destination, and dead-lettered (kept across restarts by
    /// `counters_store.rs`).
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.forwarded.load(Ordering::Relaxed),
            self.dead_lettered.load(Ordering::Relaxed),
        )
    }

    /// At recovery: the totals saved before the restart.
    pub(crate) fn restore_totals(&self, forwarded: u64, dead_lettered: u64) {
        self.forwarded.store(forwarded, Ordering::Relaxed);
        self.dead_lettered.store(dead_lettered, Ordering::Relaxed);
    }

    pub(crate) fn count_dead_lettered(&self, n: u64) {
        self.dead_lettered.fetch_add(n, Ordering::Relaxed);
        self.queue.note_unsaved();
    }

    /// Sets the paused flag; returns whether it changed.
    pub(crate) fn set_paused(&self, paused: bool) -> bool {
        let changed = self.paused.swap(paused, Ordering::AcqRel) != paused;
        self.wake.notify_one();
        changed
    }

    fn set(&self, state: OutgoingState, error: Option<String>, next_retry_ms: u64) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.state = state;
        if let Some(e) = error {
            if !e.is_empty() {
                self.retries.fetch_add(1, Ordering::Relaxed);
                self.last_error_ms.store(now_ms(), Ordering::Relaxed);
            }
            s.last_error = e;
        }
        s.next_retry_ms = next_retry_ms;
    }

    /// For the metrics: failed attempts to reach the destination, and Unix ms of the last.
    pub(crate) fn metrics(&self) -> (u64, u64) {
        (
            self.retries.load(Ordering::Relaxed),
            self.last_error_ms.load(Ordering::Relaxed),
        )
    }

    /// The wire description (`mq outgoing list`).
    pub fn info(&self) -> v1::OutgoingQueueInfo {
        let stats = self.queue.stats();
        let s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let state = if self.is_paused() {
            OutgoingState::Onhold
        } else {
            s.state
        };
        v1::OutgoingQueueInfo {
            destination: self.destination.clone(),
            state: state as i32,
            messages: stats.messages,
            bytes: stats.bytes,
            in_flight: stats.in_flight,
            last_error: s.last_error.clone(),
            next_retry_ms: if state == OutgoingState::Waiting {
                s.next_retry_ms
            } else {
                0
            },
            forwarded: self.forwarded.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            stream_id: bytes::Bytes::copy_from_slice(self.stream_id.as_bytes()),
        }
    }
}

/// Runs the forwarder of one outgoing queue and restarts it if it panics, with the failure
/// shown as its last error (a dead forwarder must not pass for a CONNECTED one). The batches it
/// had in flight went back to the queue when its session unwound.
pub(crate) async fn supervise(broker: Weak<Broker>, o: Arc<Outgoing>) {
    use futures::FutureExt;
    loop {
        let run = std::panic::AssertUnwindSafe(run(broker.clone(), o.clone()));
        let Err(panic) = run.catch_unwind().await else {
            // Ended: the broker stops, or the queue was deleted. A deletion the journal
            // refused puts the queue back and starts its forwarder again
            // (`Broker::restore_outgoing`): whichever of us comes second runs it.
            o.started.store(false, Ordering::Release);
            if !o.queue.is_deleted()
                && broker.upgrade().is_some_and(|b| !b.is_shutting_down())
                && o.mark_started()
            {
                continue;
            }
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        tracing::error!(destination = %o.destination, error = %what, "forwarder failed; restarting in 1 s");
        o.set(
            OutgoingState::Waiting,
            Some(format!("the forwarder failed ({what}); it restarts")),
            now_ms() + 1000,
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        if broker.upgrade().is_none_or(|b| b.is_shutting_down()) {
            return;
        }
    }
}

/// The forwarder of one outgoing queue: runs until the broker shuts down.
async fn run(broker: Weak<Broker>, o: Arc<Outgoing>) {
    let Some(b) = broker.upgrade() else { return };
    let (min, max) = (
        b.config().forward_retry_min,
        b.config()
            .forward_retry_max
            .max(b.config().forward_retry_min),
    );
    drop(b);
    let mut backoff = min;
    loop {
        let Some(b) = broker.upgrade() else { return };
        if b.is_shutting_down() || o.queue.is_deleted() {
            return;
        }
        // Nothing to do while paused or empty.
        let notified = o.queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if o.is_paused() || o.queue.stats().messages == 0 {
            if !o.is_paused() {
                // Nothing to send: INACTIVE, whatever happened before (its last error stays
                // shown). A queue emptied while WAITING (purged, expired) showed WAITING with a
                // next retry of "now" for good, and retried nothing (helper-73).
                let mut s = o.status.lock().unwrap_or_else(|p| p.into_inner());
                s.state = OutgoingState::Inactive;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = o.wake.notified() => {}
                _ = b.shutting_down() => return,
            }
            continue;
        }
        o.set(OutgoingState::Connecting, None, 0);
        let creds = b.config().security.forward.get(&o.destination).cloned();
        let error = match connect(&o.destination, creds.as_ref()).await {
            Ok(client) => {
                // A working connection: the last failure is history.
                o.set(OutgoingState::Connected, Some(String::new()), 0);
                tracing::info!(destination = %o.destination, "forwarding: connected");
                match session(&b, &o, client).await {
                    Ok(()) => {
                        backoff = min;
                        continue;
                    }
                    Err((e, progressed)) => {
                        if progressed {
                            backoff = min;
                        }
                        e
                    }
                }
            }
            Err(e) => e,
        };
        if b.is_shutting_down() {
            return;
        }
        let next = now_ms() + backoff.as_millis() as u64;
        // It may quote what the peer answered: kept and logged cut short.
        let error = truncate(&error, MAX_REASON_BYTES);
        // One line a second for all destinations (each outgoing queue's last error is in
        // `mq outgoing list`): 400 unreachable destinations wrote ~350 lines a second, 10,000
        // of them at the 30 s backoff would write ~330 (helper-60).
        if let Some(held_back) = RETRY_LOG.allow(now_ms(), 1) {
            tracing::warn!(destination = %o.destination, error = %error, retry_in_ms = backoff.as_millis() as u64, held_back, "forwarding: cannot deliver; will retry (held_back: such lines left out since the last one)");
        }
        o.set(OutgoingState::Waiting, Some(error), next);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = o.wake.notified() => {}
            _ = b.shutting_down() => return,
        }
        backoff = (backoff * 2).min(max);
    }
}

async fn connect(
    destination: &str,
    creds: Option<&crate::tls::ForwardCredentials>,
) -> Result<crate::tls::PeerClient, String> {
    let (endpoint, credentials) = crate::tls::peer_endpoint(destination, creds)?;
    let endpoint = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(8 * 1024 * 1024))
        .initial_connection_window_size(Some(16 * 1024 * 1024))
        .max_frame_size(Some(mq_proto::HTTP2_MAX_FRAME_SIZE))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {destination}: {}", error_chain(&e)))?;
    Ok(ForwardServiceClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
        .max_encoding_message_size(mq_proto::MAX_GRPC_MESSAGE))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// How often a session that has nothing it can take yet looks whether its queue emptied (its
/// messages expired and were dead-lettered).
const NOTHING_TO_TAKE_RECHECK: Duration = Duration::from_secs(1);

/// One connection's worth of forwarding. `Ok` when it ended on purpose (paused, shutting
/// down, nothing left to send before its first batch); `Err((why, whether anything was
/// acknowledged))` when the connection failed.
///
/// The stream opens with its first batch already queued: a destination ends a stream whose
/// first request does not come within its `--message-arrival-timeout`, and the messages the
/// supervisor saw may all have expired (or still be being stored) by the time they are taken.
async fn session(
    b: &Arc<Broker>,
    o: &Outgoing,
    mut client: crate::tls::PeerClient,
) -> Result<(), (String, bool)> {
    let (tx, rx) = mpsc::channel::<v1::ForwardRequest>(WINDOW_BATCHES);
    let source = b.config().name.clone();
    let queue = &o.queue;
    let mut in_flight = InFlight {
        b,
        queue,
        batches: VecDeque::new(),
        bytes: 0,
    };
    let first = loop {
        let notified = queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if o.is_paused() || queue.is_deleted() || b.is_shutting_down() {
            return Ok(());
        }
        let taken = queue
            .take_bounded(BATCH_MESSAGES, o.batch_bytes())
            .map_err(|e| (e.to_string(), false))?;
        if !taken.is_empty() {
            break taken;
        }
        if queue.stats().messages == 0 {
            return Ok(());
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = o.wake.notified() => {}
            _ = tokio::time::sleep(NOTHING_TO_TAKE_RECHECK) => {}
            _ = b.shutting_down() => return Ok(()),
        }
    };
    let mut next_batch = 1u64;
    let batch = in_flight
        .batch(o, &source, next_batch, first)
        .map_err(|e| (e, false))?;
    next_batch += 1;
    // Room for WINDOW_BATCHES and the receiver is here: this cannot wait or fail.
    let _ = tx.try_send(batch);
    // A destination that takes the stream and never answers held its batches in flight for
    // good, past their time to reach the queue (helper-65): it has `forward_ack_timeout` to
    // answer the stream, and then to acknowledge the oldest batch in flight.
    let ack_timeout = b.config().forward_ack_timeout;
    let no_answer = |what: &str| {
        format!(
            "{} did not {what} within {}s (mqd --forward-ack-timeout)",
            o.destination,
            ack_timeout.as_secs_f64()
        )
    };
    let opened = tokio::time::timeout(ack_timeout, client.forward(ReceiverStream::new(rx))).await;
    let mut acks = match opened {
        Err(_) => return Err((no_answer("answer the forwarding stream"), false)),
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            return Err((
                format!(
                    "{} refused the forwarding stream: {}",
                    o.destination,
                    s.message()
                ),
                false,
            ))
        }
    };
    let mut progressed = false;
    // The last acknowledgement (or the stream's answer): a batch's time to be acknowledged
    // counts from it or from its sending, whichever is later, so batches queued behind a slow
    // one on a slow link are not cut off for the time they waited (helper-68).
    let mut last_ack = tokio::time::Instant::now();
    let result = loop {
        let notified = queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if queue.is_deleted() && in_flight.batches.is_empty() {
            break Ok(());
        }
        let paused = o.is_paused();
        let room =
            !paused && in_flight.batches.len() < WINDOW_BATCHES && in_flight.bytes < WINDOW_BYTES;
        if room {
            let taken = match queue.take_bounded(BATCH_MESSAGES, o.batch_bytes()) {
                Ok(t) => t,
                Err(e) => break Err((e.to_string(), progressed)),
            };
            if !taken.is_empty() {
                let batch = match in_flight.batch(o, &source, next_batch, taken) {
                    Ok(batch) => batch,
                    Err(e) => break Err((e, progressed)),
                };
                next_batch += 1;
                if tx.send(batch).await.is_err() {
                    break Err((
                        format!("the stream to {} closed", o.destination),
                        progressed,
                    ));
                }
                continue;
            }
        }
        if paused && in_flight.batches.is_empty() {
            break Ok(());
        }
        let ack_due = in_flight
            .batches
            .front()
            .map(|b| b.3.max(last_ack) + ack_timeout);
        tokio::select! {
            ack = acks.message() => match ack {
                Ok(Some(ack)) => {
                    // Checked before anything is taken off the window: on a bad answer every
                    // unsettled entry goes back to the queue.
                    let Some((n, entries, _, _)) = in_flight.batches.front() else {
                        break Err((format!("{} acknowledged batch {} that was not sent", o.destination, ack.batch), progressed));
                    };
                    if ack.batch != *n || ack.count as usize != entries.len() {
                        break Err((format!("{} acknowledged batch {} ({} messages); expected batch {n} ({} messages)", o.destination, ack.batch, ack.count, entries.len()), progressed));
                    }
                    let (n, entries, bytes, sent) = in_flight.batches.pop_front().expect("checked above");
                    in_flight.bytes -= bytes;
                    let now = tokio::time::Instant::now();
                    // A batch cut at the size limit that took under a quarter of its time:
                    // one twice its size would have been in time.
                    if bytes >= o.batch_bytes() && now < sent.max(last_ack) + ack_timeout / 4 {
                        o.grow_batches();
                    }
                    last_ack = now;
                    if let Err((e, entries)) = settle(b, o, entries, ack.rejected).await {
                        in_flight.batches.push_front((n, entries, bytes, sent));
                        break Err((e, progressed));
                    }
                    progressed = true;
                }
                Ok(None) => break Err((format!("{} ended the forwarding stream", o.destination), progressed)),
                Err(s) => break Err((format!("{}: {}", o.destination, s.message()), progressed)),
            },
            _ = async {
                match ack_due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            } => {
                let n = in_flight.batches.front().map_or(0, |b| b.0);
                let smaller = o.shrink_batches();
                break Err((format!("{}; batches are cut at {smaller} bytes from now on", no_answer(&format!("acknowledge batch {n}"))), progressed));
            }
            _ = &mut notified, if room => {}
            _ = o.wake.notified() => {}
            _ = b.shutting_down() => break Ok(()),
        }
    };
    drop(tx);
    drop(in_flight);
    result
}

/// The batches sent on one connection and not yet acknowledged. Dropping it (the session
/// ended, failed, was cancelled or panicked) gives them back to the head of the outgoing queue,
/// in order, for the next connection.
struct InFlight<'a> {
    b: &'a Broker,
    queue: &'a Queue,
    /// Number, entries, body bytes and when it was sent.
    batches: VecDeque<(u64, Vec<Entry>, usize, tokio::time::Instant)>,
    bytes: usize,
}

impl InFlight<'_> {
    /// Batch `n` of the messages `taken`, which are in flight from here on (given back to the
    /// queue if the session ends before they are settled). Err if a body cannot be read.
    fn batch(
        &mut self,
        o: &Outgoing,
        source: &str,
        n: u64,
        taken: Vec<Entry>,
    ) -> Result<v1::ForwardRequest, String> {
        let mut messages = Vec::with_capacity(taken.len());
        let mut bytes = 0usize;
        let mut failed = None;
        for e in &taken {
            let body = match self.b.body(self.queue, e) {
                Ok(body) => body,
                Err(err) => {
                    failed = Some(err.to_string());
                    break;
                }
            };
            bytes += body.len();
            let route = e.msg.route.as_deref().unwrap_or_default();
            messages.push(v1::ForwardedMessage {
                seq: match e.msg.delivery {
                    Delivery::Express => 0,
                    Delivery::Recoverable => e.seq,
                },
                destination: route.to_string(),
                transactional: e.msg.transactional,
                message: Some(e.msg.to_wire(route, body, 0)),
            });
        }
        self.batches
            .push_back((n, taken, bytes, tokio::time::Instant::now()));
        self.bytes += bytes;
        if let Some(err) = failed {
            return Err(err);
        }
        Ok(v1::ForwardRequest {
            stream_id: bytes::Bytes::copy_from_slice(o.stream_id.as_bytes()),
            source: source.to_string(),
            batch: n,
            messages,
            settled_below: self.settled_below(),
        })
    }

    /// The lowest seq this outgoing queue may still send: every message below it is settled
    /// (acknowledged as stored, or its dead-letter record is on disk; a dead-letter that fails
    /// puts the message back in the queue). The batch just taken came from the head of the
    /// FIFO queue, so nothing left in the queue is below the batches in flight.
    fn settled_below(&self) -> u64 {
        self.batches
            .iter()
            .filter_map(|(_, entries, _, _)| entries.iter().map(|e| e.seq).min())
            .min()
            .unwrap_or(0)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let back: Vec<Entry> = self.batches.drain(..).flat_map(|(_, e, _, _)| e).collect();
        if !back.is_empty() {
            let gone = self.queue.restore(back);
            self.b.forget(self.queue, &gone);
        }
    }
}

/// Checks a peer's rejections of a batch of `len` messages: each index names a message of
/// the batch, at most once, in any order. Anything else is a protocol error (the peer is not
/// trusted: nothing it sends may panic the forwarder).
fn index_rejections(
    len: usize,
    rejected: Vec<v1::ForwardRejection>,
) -> Result<HashMap<usize, v1::ForwardRejection>, String> {
    let mut by_index = HashMap::with_capacity(rejected.len());
    for r in rejected {
        let i = r.index as usize;
        if i >= len {
            return Err(format!("refused message {} of a batch of {len}", r.index));
        }
        if by_index.insert(i, r).is_some() {
            return Err(format!("refused message {i} twice in one acknowledgement"));
        }
    }
    Ok(by_index)
}

/// Applies one acknowledged batch: stored messages are removed; refused ones are dead-lettered.
/// A malformed answer settles nothing: the entries are handed back for the caller to restore.
async fn settle(
    b: &Arc<Broker>,
    o: &Outgoing,
    entries: Vec<Entry>,
    rejected: Vec<v1::ForwardRejection>,
) -> Result<(), (String, Vec<Entry>)> {
    let queue = &o.queue;
    o.touch();
    if rejected.is_empty() {
        o.forwarded
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        queue.complete(&entries);
        b.forget_received(queue, &entries);
        return Ok(());
    }
    let mut reasons = match index_rejections(entries.len(), rejected) {
        Ok(r) => r,
        Err(e) => return Err((format!("{}: {e}", o.destination), entries)),
    };
    let mut stored = Vec::with_capacity(entries.len());
    let mut dead = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        match reasons.remove(&i) {
            Some(r) => {
                let class = v1::DeadLetterClass::try_from(r.dead_letter_class)
                    .unwrap_or(v1::DeadLetterClass::BadMessage);
                dead.push(DeadLetterItem {
                    entry: e,
                    class,
                    // The peer's reason, cut to a bounded length before it is kept.
                    reason: format!(
                        "{} refused it: {}",
                        o.destination,
                        truncate(&r.reason, MAX_REASON_BYTES)
                    ),
                });
            }
            None => stored.push(e),
        }
    }
    o.forwarded
        .fetch_add(stored.len() as u64, Ordering::Relaxed);
    queue.complete(&stored);
    b.forget_received(queue, &stored);
    b.dead_letter(queue, dead).await;
    Ok(())
}

impl Broker {
    /// Every outgoing queue, by destination.
    pub fn outgoing_list(&self) -> Vec<v1::OutgoingQueueInfo> {
        let mut v: Vec<_> = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|o| o.info())
            .collect();
        v.sort_by(|a, b| a.destination.cmp(&b.destination));
        v
    }

    /// The outgoing queue for `key` (`host:port`), if there is one. One read-lock guard,
    /// dropped before it returns: taking the lock a second time while it is held deadlocks
    /// against a writer queued in between.
    pub(crate) fn outgoing_by_key(&self, key: &str) -> Option<Arc<Outgoing>> {
        self.outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Pauses (ONHOLD) or resumes the outgoing queue for `destination`: `host:port`, or a format
    /// name of a queue on that broker. The state is journaled, so it holds across restarts.
    pub async fn set_outgoing_paused(
        &self,
        destination: &str,
        paused: bool,
    ) -> Result<v1::OutgoingQueueInfo, crate::error::BrokerError> {
        let key = outgoing_key(|a| self.is_local(a), destination)?;
        let o = self
            .outgoing_by_key(&key)
            .ok_or_else(|| no_outgoing_queue(&key))?;
        // In force only once journaled: a refused change leaves the state as it was.
        let _one = self.redefinitions.lock().await;
        if o.is_paused() != paused {
            let mut def = o.queue().def().clone();
            if let QueueRole::Outgoing { paused: p, .. } = &mut def.role {
                *p = paused;
            }
            let commit = {
                let _order = o.pause_order.lock().unwrap_or_else(|p| p.into_inner());
                self.journal().submit(vec![crate::journal::Op::DefineQueue {
                    queue_id: def.id,
                    def: crate::broker::QueueDefRecord::encode(&def),
                }])
            };
            commit.await.map_err(crate::broker::journal_failed)?;
            o.set_paused(paused);
            tracing::info!(destination = %key, paused, "outgoing queue {}", if paused { "paused" } else { "resumed" });
        }
        Ok(o.info())
    }
}

/// The answer for a DEST without an outgoing queue (never a list of the others).
pub(crate) fn no_outgoing_queue(key: &str) -> crate::error::BrokerError {
    crate::error::BrokerError::NotFound(format!(
        "there is no outgoing queue for {}: one is created by the first send to a queue there (`mq outgoing list` shows them)",
        quote(key)
    ))
}

/// The outgoing queue key (`host:port`) an operator's DEST names.
pub(crate) fn outgoing_key(
    is_local: impl Fn(&mq_proto::format_name::QueueAddress) -> bool,
    dest: &str,
) -> Result<String, crate::error::BrokerError> {
    use crate::error::BrokerError;
    let dest = dest.trim();
    if dest.len() > mq_proto::limits::MAX_DESTINATION_BYTES {
        return Err(BrokerError::InvalidArgument(format!(
            "the destination \"{}\" is {} bytes; the limit is {} (host:port, or a queue's format name)",
            quote(dest),
            dest.len(),
            mq_proto::limits::MAX_DESTINATION_BYTES
        )));
    }
    if dest.contains('\\') || dest.contains('/') || dest.to_ascii_uppercase().starts_with("DIRECT=")
    {
        let parsed = FormatName::parse(dest)?;
        let addr = parsed.single().ok_or_else(|| {
            BrokerError::InvalidArgument(format!(
                "\"{}\" is a multiple-element format name; name one queue or host:port",
                quote(dest)
            ))
        })?;
        if is_local(addr) {
            return Err(BrokerError::InvalidArgument(format!(
                "\"{}\" is a queue of this broker; outgoing queues are for other brokers",
                quote(dest)
            )));
        }
        return Ok(crate::broker::remote_destination(addr));
    }
    let lower = dest.to_ascii_lowercase();
    // host:port, [v6]:port, or a bare host (default port).
    let has_port = match lower.rsplit_once(':') {
        Some((h, p))
            if (!h.contains(':') || h.ends_with(']'))
                && !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit()) =>
        {
            if !matches!(p.parse::<u16>(), Ok(1..)) {
                return Err(BrokerError::InvalidArgument(format!(
                    "port \"{}\" of \"{}\" is not 1 to 65535",
                    quote(p),
                    quote(dest)
                )));
            }
            true
        }
        _ => false,
    };
    if lower.is_empty() {
        return Err(BrokerError::InvalidArgument(
            "the destination is empty; give host:port as `mq outgoing list` shows it".into(),
        ));
    }
    Ok(if has_port {
        lower
    } else {
        format!("{lower}:{}", mq_proto::format_name::DEFAULT_PORT)
    })
}

#[cfg(test)]
mod tests {
    use super::outgoing_key;

    fn key(dest: &str) -> Result<String, String> {
        outgoing_key(|a| a.host == mq_proto::format_name::Host::Local, dest)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn operators_name_outgoing_queues_by_host_port_or_format_name() {
        assert_eq!(key("127.0.0.1:5000").unwrap(), "127.0.0.1:5000");
        assert_eq!(key(" Broker-B:1802 ").unwrap(), "broker-b:1802");
        assert_eq!(key("broker-b").unwrap(), "broker-b:1801");
        assert_eq!(
            key(r"DIRECT=TCP:127.0.0.1:5000\private$\q").unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(key(r"hostb\private$\q").unwrap(), "hostb:1801");
        assert_eq!(key("[::1]:5000").unwrap(), "[::1]:5000");
        assert!(key(r".\private$\q").unwrap_err().contains("this broker"));
        assert!(key("").is_err());
        assert!(key(r"DIRECT=TCP:bad name\q").is_err());
        // A port out of range is refused, not taken for part of the host (it used to become
        // "10.9.9.9:99999:1801", then NOT_FOUND).
        for bad in ["10.9.9.9:99999", "broker-b:0", "[::1]:70000"] {
            let e = key(bad).unwrap_err();
            assert!(e.contains("is not 1 to 65535"), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod settle_tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use mq_proto::v1;

    use super::settle;
    use crate::broker::Broker;
    use crate::config::BrokerConfig;

    fn rejection(index: u32) -> v1::ForwardRejection {
        v1::ForwardRejection {
            index,
            dead_letter_class: v1::DeadLetterClass::BadDestinationQueue as i32,
            reason: format!("no queue for {index}"),
        }
    }

    /// Three messages (`m` makes each) sent to queue `q` of the broker at `dest` (`host:port`):
    /// they wait in the outgoing queue for `dest`.
    async fn outgoing_three(
        dest: &str,
        m: impl Fn(usize) -> v1::OutMessage,
    ) -> (tempfile::TempDir, Arc<Broker>, Arc<super::Outgoing>) {
        let dir = tempfile::tempdir().unwrap();
        let (b, _) = Broker::open(
            BrokerConfig::new(dir.path()),
            vec!["127.0.0.1:4000".parse().unwrap()],
        )
        .unwrap();
        let b = Arc::new(b);
        let dests = b
            .destinations(&format!(r"DIRECT=TCP:{dest}\private$\q"), false)
            .unwrap();
        let out = b.send_batch(&dests, (0..3).map(m).collect(), false).await;
        assert!(out.failures.is_empty(), "{:?}", out.failures);
        let o = b.outgoing_for(dest).unwrap();
        (dir, b, o)
    }

    /// Three messages in an outgoing queue, taken as one batch.
    async fn batch_of_three() -> (tempfile::TempDir, Arc<Broker>, Arc<super::Outgoing>) {
        outgoing_three("10.0.0.9:1801", |i| v1::OutMessage {
            body: Bytes::from(format!("m{i}")),
            priority: Some(3),
            delivery: v1::Delivery::Recoverable as i32,
            ..Default::default()
        })
        .await
    }

    /// Messages that expire between the supervisor's look and the session's take: the session
    /// opens no stream (a destination would end one without a first request after its
    /// `--message-arrival-timeout`, and the outgoing queue would show that as an error) and
    /// ends quietly once they are dead-lettered. The client here can only fail: any attempt to
    /// open the stream would be an error.
    #[tokio::test]
    async fn nothing_to_take_opens_no_stream() {
        let (_dir, b, o) = outgoing_three("127.0.0.1:1", |i| v1::OutMessage {
            body: Bytes::from(format!("m{i}")),
            time_to_reach_queue_ms: 1,
            ..Default::default()
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let (endpoint, creds) = crate::tls::peer_endpoint("127.0.0.1:1", None).unwrap();
        let client = mq_proto::v1::forward_service_client::ForwardServiceClient::with_interceptor(
            endpoint.connect_lazy(),
            creds,
        );
        // mqd's sweeper, which dead-letters what expired.
        let sweeper = {
            let b = b.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    b.sweep_expired().await;
                }
            })
        };
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            super::session(&b, &o, client),
        )
        .await
        .expect("the session ends once the expired messages are dead-lettered");
        sweeper.abort();
        assert_eq!(ended, Ok(()));
        assert_eq!(o.queue().stats().messages, 0);
        assert_eq!(b.dead_letter_queue(false).stats().messages, 3);
    }

    /// A peer's rejections are its input: out of order they are still applied; out of range or
    /// twice they are refused, nothing is settled, and the batch is handed back — never a panic.
    #[tokio::test]
    async fn a_peers_rejections_in_any_order_or_malformed_never_panic() {
        let (_dir, b, o) = batch_of_three().await;
        let taken = o.queue().take_bounded(10, usize::MAX).unwrap();
        assert_eq!(taken.len(), 3);
        settle(&b, &o, taken, vec![rejection(2), rejection(0)])
            .await
            .unwrap();
        assert_eq!(o.queue().stats().messages, 0);
        assert_eq!(b.dead_letter_queue(false).stats().messages, 2);

        let (_dir, b, o) = batch_of_three().await;
        for bad in [vec![rejection(3)], vec![rejection(1), rejection(1)]] {
            let taken = o.queue().take_bounded(10, usize::MAX).unwrap();
            let (e, back) = settle(&b, &o, taken, bad).await.unwrap_err();
            assert!(e.contains("10.0.0.9:1801"), "{e}");
            assert_eq!(back.len(), 3);
            assert!(o.queue().restore(back).is_empty());
            assert_eq!(o.queue().stats().messages, 3);
            assert_eq!(b.dead_letter_queue(false).stats().messages, 0);
        }
    }
}

#[cfg(test)]
mod lock_tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::broker::Broker;
    use crate::config::BrokerConfig;

    /// Pauses and resumes racing each other: after a restart the outgoing queue is in the state
    /// it last showed (the journal got the records in the order the flag changed).
    #[test]
    fn racing_pause_and_resume_persist_the_last_state_shown() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let (b, _) = Broker::open(
                BrokerConfig::new(dir.path()),
                vec!["127.0.0.1:4000".parse().unwrap()],
            )
            .unwrap();
            Arc::new(b)
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let dest = "10.2.0.1:1801";
        for round in 0..20 {
            let b = open();
            let o = b.outgoing_for(dest).unwrap();
            rt.block_on(async {
                let mut tasks = Vec::new();
                for i in 0..200 {
                    let b = b.clone();
                    tasks.push(tokio::spawn(async move {
                        b.set_outgoing_paused(dest, i % 2 == 0).await.unwrap();
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
            });
            let shown = o.is_paused();
            b.close();
            drop((o, b));
            let b = open();
            let o = b.outgoing_for(dest).unwrap();
            assert_eq!(
                o.is_paused(),
                shown,
                "round {round}: the journal kept the other state"
            );
            b.close();
        }
    }

    /// A pause of an unknown destination used to take the outgoing table's read lock twice in
    /// one statement; a first send to a new destination (write lock) queued between the two
    /// then hung both, and every later use of the table.
    #[test]
    fn pausing_an_unknown_destination_beside_new_destinations_does_not_deadlock() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::new(dir.path());
        config.max_outgoing_queues = 20_000;
        let (b, _) = Broker::open(config, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
        let b = Arc::new(b);
        let deadline = Instant::now() + Duration::from_secs(3);
        let (done, finished) = std::sync::mpsc::channel();
        let creator = {
            let (b, done) = (b.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while Instant::now() < deadline
                    && (n as usize) < crate::config::DEFAULT_MAX_OUTGOING_QUEUES
                {
                    b.outgoing_for(&format!("10.1.{}.{}:1801", n / 250, n % 250))
                        .unwrap();
                    n += 1;
                }
                done.send(()).unwrap();
            })
        };
        let pauser = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            // Long, but within the DEST limit (1 KiB), so that the table is looked up.
            let unknown = format!("{}:1801", "u".repeat(1_000));
            while Instant::now() < deadline {
                let e = rt
                    .block_on(b.set_outgoing_paused(&unknown, true))
                    .unwrap_err();
                assert!(e.to_string().contains("no outgoing queue"), "{e}");
            }
            done.send(()).unwrap();
        });
        for _ in 0..2 {
            // Both threads stop by themselves within about 3 s; a minute means a deadlock.
            finished
                .recv_timeout(Duration::from_secs(60))
                .expect("pause and outgoing-queue creation deadlocked on the outgoing table");
        }
        creator.join().unwrap();
        pauser.join().unwrap();
    }
}
