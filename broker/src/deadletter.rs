//! Dead-letter queues and message timers.
//!
//! Every broker has `SYSTEM$;DEADLETTER` (non-transactional messages) and `SYSTEM$;DEADXACT`
//! (transactional ones). A message lands there, with its class and reason, when it cannot be
//! delivered: the destination broker refused it (no such queue, transactional mismatch, over
//! quota, arrived after its time-to-reach-queue), its time-to-reach-queue passed while it
//! waited in an outgoing queue, or its time-to-be-received passed before anyone received it.
//!
//! A move is one journal record (`Put` into the dead-letter queue and `Remove` from where it
//! was), so a crash leaves the message in exactly one of the two places.

use std::sync::Arc;
use std::time::Duration;

use mq_proto::limits::quote;
use mq_proto::v1::{self, DeadLetterClass};

use crate::broker::{journal_failed, Broker};
use crate::journal::Op;
use crate::message::{now_ms, DeadLetterInfo, Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue, QueueRole};

/// Dead-letter log lines: one a second, with a count of those held back.
static DEAD_LETTER_LOG: crate::ratelog::RateLimitedLog = crate::ratelog::RateLimitedLog::new(1000);

/// How often queues with deadlines are swept for expired messages.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// Most messages, and most body bytes (at least one message), one sweep batch takes from a
/// queue: their bodies are read into memory and moved in one journal record. A queue whose
/// 400,000 messages expired at once was moved in one record, every body read first.
const SWEEP_BATCH: usize = 4096;
const SWEEP_BATCH_BYTES: u64 = 16 << 20;
/// Most batches one sweep moves from a queue (the next sweep goes on).
const SWEEP_BATCHES: usize = 64;

/// How often a sweep walks every queue even though the broker-wide hint says nothing is due.
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// One message to dead-letter: the entry (taken from its queue, counted in flight), why, and a
/// line for people.
#[derive(Debug)]
pub struct DeadLetterItem {
    pub entry: Entry,
    pub class: DeadLetterClass,
    pub reason: String,
}

/// The MSMQ-style name of a class, as `mq` prints it.
pub fn class_name(class: DeadLetterClass) -> &'static str {
    match class {
        DeadLetterClass::Unspecified => "Unspecified",
        DeadLetterClass::BadDestinationQueue => "BadDestinationQueue",
        DeadLetterClass::NotTransactionalQueue => "NotTransactionalQueue",
        DeadLetterClass::NotTransactionalMessage => "NotTransactionalMessage",
        DeadLetterClass::QueueExceedQuota => "QueueExceedQuota",
        DeadLetterClass::ReachQueueTimeout => "ReachQueueTimeout",
        DeadLetterClass::ReceiveTimeout => "ReceiveTimeout",
        DeadLetterClass::BadMessage => "BadMessage",
        DeadLetterClass::AccessDenied => "AccessDenied",
    }
}

impl Broker {
    /// Moves expired messages of every queue to a dead-letter queue (every
    /// [`SWEEP_INTERVAL`], see `Broker::start_background`).
    pub(crate) async fn sweep_expired(&self) {
        let b = self;
        let now = now_ms();
        // Nothing is due anywhere: no walk (an idle broker with 100,000 queues would spend
        // ~4 ms a sweep on one). A walk at least every FULL_SWEEP_EVERY whatever the hint says.
        let full = {
            let mut last = b.last_full_sweep.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() >= FULL_SWEEP_EVERY {
                *last = std::time::Instant::now();
                true
            } else {
                false
            }
        };
        if !full && !b.sweep_hint.due(now) {
            return;
        }
        b.sweep_hint.start_walk();
        // Only the queues whose earliest deadline has come (read without their locks); the
        // others' deadlines go back into the hint.
        let due = b.queues_where(|q| {
            if q.may_need_sweep(now) {
                true
            } else {
                b.sweep_hint.lower(q.sweep_at());
                false
            }
        });
        for q in due {
            // A batch at a time (their bodies are read and moved in one journal record), at
            // most SWEEP_BATCHES of them a sweep: a move that fails puts its messages back,
            // and the next sweep tries again.
            for _ in 0..SWEEP_BATCHES {
                let now = now_ms();
                if !q.needs_sweep(now) {
                    b.sweep_hint.lower(q.sweep_at());
                    break;
                }
                let expired = q.sweep_some(now, SWEEP_BATCH, SWEEP_BATCH_BYTES);
                b.sweep_hint.lower(q.sweep_at());
                if expired.is_empty() {
                    break;
                }
                if b.dead_letter_expired(&q, expired, now).await > 0 {
                    // Some could not be moved (and went back): the next sweep tries again.
                    break;
                }
            }
        }
    }

    /// Moves `expired` (taken from `q` by a sweep at `now`) to a dead-letter queue, each with
    /// why; returns how many went back (not moved).
    async fn dead_letter_expired(&self, q: &Arc<Queue>, expired: Vec<Entry>, now: u64) -> usize {
        let outgoing = matches!(q.def().role, QueueRole::Outgoing { .. });
        let items = expired
            .into_iter()
            .map(|entry| {
                let m = &entry.msg;
                let (class, reason) = if m.receive_expired(now) {
                    (
                        DeadLetterClass::ReceiveTimeout,
                        format!(
                            "its time-to-be-received passed {} ms ago, before it was received",
                            now.saturating_sub(m.receive_by_ms)
                        ),
                    )
                } else {
                    (
                        DeadLetterClass::ReachQueueTimeout,
                        format!(
                            "its time-to-reach-queue passed {} ms ago while it waited in the outgoing queue",
                            now.saturating_sub(m.reach_queue_by_ms)
                        ),
                    )
                };
                let reason = if outgoing {
                    reason
                } else {
                    format!("{reason} (in {})", q.def().name)
                };
                DeadLetterItem {
                    entry,
                    class,
                    reason,
                }
            })
            .collect();
        self.dead_letter(q, items).await
    }

    /// Moves taken entries of `src` to the dead-letter queue that fits each (DEADXACT for
    /// transactional messages). Recoverable ones move in one journal record with their removal
    /// from `src`; if that write fails they go back to `src`. Returns how many went back.
    pub(crate) async fn dead_letter(&self, src: &Arc<Queue>, items: Vec<DeadLetterItem>) -> usize {
        if items.is_empty() {
            return 0;
        }
        let now = now_ms();
        let me = self.config().name.clone();
        let mut ops = Vec::new();
        let mut removed = Vec::new();
        let mut durable: Vec<(Arc<Queue>, Entry)> = Vec::new();
        let mut done: Vec<Entry> = Vec::new();
        let mut back: Vec<Entry> = Vec::new();
        let mut counted = 0u64;
        // What the recoverable dead letters' info adds to their charge (`charged_bytes`).
        let mut more = 0u64;
        let mut classes = Vec::new();
        // NACKs: express originals' are posted at once, recoverable ones' in the record.
        let reached = !matches!(src.def().role, QueueRole::Outgoing { .. });
        let mut nacks = crate::acks::Prepared::default();
        let mut express_nacks = crate::acks::Prepared::default();
        for item in items {
            let m = &item.entry.msg;
            let destination = match &m.route {
                Some(r) => r.to_string(),
                None => format!("DIRECT=OS:{}", src.def().name),
            };
            tracing::debug!(
                id = %m.id,
                class = class_name(item.class),
                destination = %quote(&destination),
                reason = %quote(&item.reason),
                "message dead-lettered"
            );
            if let Some(held_back) = DEAD_LETTER_LOG.allow(now, 1) {
                tracing::warn!(
                    id = %m.id,
                    class = class_name(item.class),
                    destination = %quote(&destination),
                    reason = %quote(&item.reason),
                    held_back,
                    "message dead-lettered (at most one line a second; RUST_LOG=mq_broker=debug shows each)"
                );
            }
            let body = match self.body(src, &item.entry) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(id = %m.id, error = %e, "cannot read a message to dead-letter it; it stays where it is");
                    back.push(item.entry);
                    continue;
                }
            };
            let dl = self.dead_letter_queue(m.transactional).clone();
            let moved = Arc::new(StoredMessage {
                body: Some(body),
                route: None,
                dead_letter: Some(Arc::new(DeadLetterInfo {
                    class: item.class,
                    reason: mq_proto::limits::truncate(
                        &item.reason,
                        mq_proto::limits::MAX_REASON_BYTES,
                    ),
                    destination,
                    time_ms: now,
                    broker: me.clone(),
                })),
                ..(**m).clone()
            });
            let seq = match dl.admit(std::slice::from_ref(&moved)) {
                Ok(mut r) => match r.pop() {
                    Some(Ok(seq)) => seq,
                    _ => {
                        back.push(item.entry);
                        continue;
                    }
                },
                Err(_) => {
                    back.push(item.entry);
                    continue;
                }
            };
            counted += 1;
            classes.push((item.class, m.delivery));
            let class = crate::acks::nack_class(item.class, reached);
            if crate::acks::wanted(m, class) {
                let mut p = self.prepare_acks([crate::acks::AckEvent {
                    msg: m,
                    class,
                    destination: moved
                        .dead_letter
                        .as_ref()
                        .map(|d| d.destination.clone())
                        .unwrap_or_default(),
                    body: moved.body.clone(),
                }]);
                if m.delivery == Delivery::Express {
                    express_nacks.absorb(p);
                } else {
                    ops.append(&mut p.ops);
                    nacks.absorb(p);
                }
            }
            match m.delivery {
                Delivery::Express => {
                    // The broker-wide quota counted the message as it was; its copy here
                    // also carries its dead-letter info.
                    self.charge_more(Delivery::Express, moved.charged_bytes() - m.charged_bytes());
                    self.insert_or_forget(&dl, vec![Entry::new(seq, moved)]);
                    done.push(item.entry);
                }
                Delivery::Recoverable => {
                    ops.push(moved.put_op(dl.def().id, seq));
                    removed.push(item.entry.seq);
                    more += moved.charged_bytes() - m.charged_bytes();
                    durable.push((dl, Entry::new(seq, Arc::new(moved.without_body()))));
                    done.push(item.entry);
                }
            }
        }
        if !removed.is_empty() {
            ops.push(Op::Remove {
                queue_id: src.def().id,
                seqs: removed,
            });
            if let Err(e) = self.journal().submit(ops).await {
                std::mem::take(&mut nacks).abort(self);
                let e = journal_failed(e);
                tracing::error!(error = %e, "cannot store dead letters; the messages stay where they were");
                // Express ones already moved; the recoverable ones go back.
                let (keep, undo): (Vec<Entry>, Vec<Entry>) = done
                    .into_iter()
                    .partition(|e| e.msg.delivery == Delivery::Express);
                for (dl, e) in &durable {
                    dl.unadmit(e.seq, e.msg.charged_bytes());
                }
                counted -= undo.len() as u64;
                classes.retain(|(_, d)| *d == Delivery::Express);
                done = keep;
                back.extend(undo);
                durable.clear();
                more = 0;
            }
        }
        self.charge_more(Delivery::Recoverable, more);
        for (dl, entries) in group_by_queue(durable) {
            self.insert_or_forget(&dl, entries);
        }
        nacks.commit(self);
        express_nacks.commit(self);
        src.complete(&done);
        src.count(done.len() as u64, 0);
        for (class, _) in &classes {
            self.counters().dead_lettered(*class, 1);
        }
        let went_back = back.len();
        let gone = src.restore(back);
        self.forget(src, &gone);
        if let QueueRole::Outgoing { destination, .. } = &src.def().role {
            if let Some(o) = self
                .outgoing
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(destination)
            {
                o.count_dead_lettered(counted);
            }
        }
        went_back
    }
}

/// A rejection as the forwarding protocol carries it.
pub(crate) fn rejection(
    index: usize,
    class: DeadLetterClass,
    reason: String,
) -> v1::ForwardRejection {
    v1::ForwardRejection {
        index: index as u32,
        dead_letter_class: class as i32,
        reason: mq_proto::limits::truncate(&reason, mq_proto::limits::MAX_REASON_BYTES),
    }
}
