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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, message_queue_client::MessageQueueClient, OutgoingState};
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::broker::Broker;
use crate::deadletter::DeadLetterItem;
use crate::message::{now_ms, Delivery};
use crate::queue::{Entry, Queue, QueueRole};

/// Most messages in one forwarded batch.
const BATCH_MESSAGES: usize = 512;
/// A batch is cut once its bodies reach this size.
const BATCH_BYTES: usize = 4 * 1024 * 1024;
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
    /// Wakes the forwarder: paused, resumed.
    wake: Notify,
    /// Unix ms of the last send to it or acknowledgement from its destination (idle expiry).
    last_used_ms: AtomicU64,
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
            wake: Notify::new(),
            last_used_ms: AtomicU64::new(now_ms()),
        }
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

    pub(crate) fn count_dead_lettered(&self, n: u64) {
        self.dead_lettered.fetch_add(n, Ordering::Relaxed);
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
            s.last_error = e;
        }
        s.next_retry_ms = next_retry_ms;
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

/// The forwarder of one outgoing queue: runs until the broker shuts down.
pub(crate) async fn run(broker: Weak<Broker>, o: Arc<Outgoing>) {
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
                let mut s = o.status.lock().unwrap_or_else(|p| p.into_inner());
                if s.state != OutgoingState::Waiting {
                    s.state = OutgoingState::Inactive;
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = o.wake.notified() => {}
                _ = b.shutting_down() => return,
            }
            continue;
        }
        o.set(OutgoingState::Connecting, None, 0);
        let error = match connect(&o.destination).await {
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
        tracing::warn!(destination = %o.destination, error = %error, retry_in_ms = backoff.as_millis() as u64, "forwarding: cannot deliver; will retry");
        o.set(OutgoingState::Waiting, Some(error), next);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = o.wake.notified() => {}
            _ = b.shutting_down() => return,
        }
        backoff = (backoff * 2).min(max);
    }
}

async fn connect(destination: &str) -> Result<MessageQueueClient<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{destination}"))
        .map_err(|e| format!("bad destination address {destination}: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(8 * 1024 * 1024))
        .initial_connection_window_size(Some(16 * 1024 * 1024))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {destination}: {}", error_chain(&e)))?;
    Ok(MessageQueueClient::new(channel)
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

/// One connection's worth of forwarding. `Ok` when it ended on purpose (paused, shutting
/// down); `Err((why, whether anything was acknowledged))` when the connection failed.
async fn session(
    b: &Arc<Broker>,
    o: &Outgoing,
    mut client: MessageQueueClient<Channel>,
) -> Result<(), (String, bool)> {
    let (tx, rx) = mpsc::channel::<v1::ForwardBatch>(WINDOW_BATCHES);
    let mut acks = match client.forward(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
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
    let source = b.config().name.clone();
    let queue = &o.queue;
    let mut in_flight: VecDeque<(u64, Vec<Entry>, usize)> = VecDeque::new();
    let mut in_flight_bytes = 0usize;
    let mut next_batch = 1u64;
    let mut progressed = false;
    let result = loop {
        let notified = queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if queue.is_deleted() && in_flight.is_empty() {
            break Ok(());
        }
        let paused = o.is_paused();
        let room = !paused && in_flight.len() < WINDOW_BATCHES && in_flight_bytes < WINDOW_BYTES;
        if room {
            let taken = match queue.take_bounded(BATCH_MESSAGES, BATCH_BYTES) {
                Ok(t) => t,
                Err(e) => break Err((e.to_string(), progressed)),
            };
            if !taken.is_empty() {
                let mut messages = Vec::with_capacity(taken.len());
                let mut bytes = 0usize;
                let mut failed = None;
                for e in &taken {
                    let body = match b.body(queue, e) {
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
                in_flight.push_back((next_batch, taken, bytes));
                in_flight_bytes += bytes;
                if let Some(err) = failed {
                    break Err((err, progressed));
                }
                let batch = v1::ForwardBatch {
                    stream_id: bytes::Bytes::copy_from_slice(o.stream_id.as_bytes()),
                    source: source.clone(),
                    batch: next_batch,
                    messages,
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
        if paused && in_flight.is_empty() {
            break Ok(());
        }
        tokio::select! {
            ack = acks.message() => match ack {
                Ok(Some(ack)) => {
                    let Some((n, entries, bytes)) = in_flight.pop_front() else {
                        break Err((format!("{} acknowledged batch {} that was not sent", o.destination, ack.batch), progressed));
                    };
                    if ack.batch != n || ack.count as usize != entries.len() {
                        break Err((format!("{} acknowledged batch {} ({} messages); expected batch {n} ({} messages)", o.destination, ack.batch, ack.count, entries.len()), progressed));
                    }
                    in_flight_bytes -= bytes;
                    progressed = true;
                    settle(b, o, entries, ack.rejected).await;
                }
                Ok(None) => break Err((format!("{} ended the forwarding stream", o.destination), progressed)),
                Err(s) => break Err((format!("{}: {}", o.destination, s.message()), progressed)),
            },
            _ = &mut notified, if room => {}
            _ = o.wake.notified() => {}
            _ = b.shutting_down() => break Ok(()),
        }
    };
    drop(tx);
    // Whatever was not acknowledged goes back to the head, in order, for the next connection.
    let back: Vec<Entry> = in_flight.into_iter().flat_map(|(_, e, _)| e).collect();
    let gone = queue.restore(back);
    b.forget(queue, &gone);
    result
}

/// Applies one acknowledged batch: stored messages are removed; refused ones are dead-lettered.
async fn settle(
    b: &Arc<Broker>,
    o: &Outgoing,
    entries: Vec<Entry>,
    rejected: Vec<v1::ForwardRejection>,
) {
    let queue = &o.queue;
    o.touch();
    if rejected.is_empty() {
        o.forwarded
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        queue.complete(&entries);
        b.forget(queue, &entries);
        return;
    }
    // The peer's reasons are cut to a bounded length before they are kept in a dead letter.
    let refused: HashMap<usize, (i32, String)> = rejected
        .into_iter()
        .map(|r| {
            (
                r.index as usize,
                (r.class, truncate(&r.reason, MAX_REASON_BYTES)),
            )
        })
        .collect();
    let mut stored = Vec::with_capacity(entries.len());
    let mut dead = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        if let Some((class, reason)) = refused.get(&i) {
            let class =
                v1::DeadLetterClass::try_from(*class).unwrap_or(v1::DeadLetterClass::BadMessage);
            dead.push(DeadLetterItem {
                entry: e,
                class,
                reason: format!("{} refused it: {reason}", o.destination),
            });
        } else {
            stored.push(e);
        }
    }
    o.forwarded
        .fetch_add(stored.len() as u64, Ordering::Relaxed);
    queue.complete(&stored);
    b.forget(queue, &stored);
    b.dead_letter(queue, dead).await;
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

    /// Pauses (ONHOLD) or resumes the outgoing queue for `destination`: `host:port`, or a format
    /// name of a queue on that broker. The state is journaled, so it holds across restarts.
    pub async fn set_outgoing_paused(
        &self,
        destination: &str,
        paused: bool,
    ) -> Result<v1::OutgoingQueueInfo, crate::error::BrokerError> {
        let key = outgoing_key(|a| self.is_local(a), destination)?;
        let o = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
            .ok_or_else(|| no_outgoing_queue(&key))?;
        if o.set_paused(paused) {
            let mut def = o.queue().def().clone();
            if let QueueRole::Outgoing { paused: p, .. } = &mut def.role {
                *p = paused;
            }
            self.journal()
                .submit(vec![crate::journal::Op::DefineQueue {
                    queue_id: def.id,
                    def: crate::broker::QueueDefRecord::encode(&def),
                }])
                .await
                .map_err(crate::broker::journal_failed)?;
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
        Some((h, p)) => p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')),
        None => false,
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
    }
}
