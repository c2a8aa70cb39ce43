//! Acknowledgements to an administration queue (MSMQ's `PROPID_M_ACKNOWLEDGE` and
//! `PROPID_M_CLASS`): which event posts which class, the ack message, and placing it in the
//! admin queue (or the outgoing queue towards it) in the same journal record as the event.
//!
//! The events and their classes (codes in [`mq_proto::ack`]):
//! - stored in its destination queue (local send, transaction commit, forwarded arrival):
//!   `ACK_REACH_QUEUE`;
//! - received for good (acknowledged receive, one-shot receive, committed transactional
//!   receive): `ACK_RECEIVE`;
//! - dead-lettered: the NACK of its dead-letter class ([`nack_class`]);
//! - purged or its queue deleted while waiting: `NACK_Q_PURGED` / `NACK_Q_DELETED` (an
//!   outgoing queue's purge: `NACK_PURGED`).
//!
//! The ack: a new id, `class`, correlation id = the original id (hyphenated), label,
//! priority, app-specific and delivery of the original, response queue = the original's
//! destination format name, no admin queue (an ack is never acknowledged), non-transactional;
//! the body is empty for positive acks and the original body for NACKs (as MSMQ).
//! A recoverable original's ack is recoverable and its `Put` rides in the event's own
//! record, so after `kill -9` there is an ack exactly when the event is on disk. An ack that
//! cannot be placed (no such local admin queue, a transactional one, over quota, the outgoing
//! queue cannot be created) is dropped and counted (`mq_acks_dropped_total`), never
//! dead-lettered: a missing admin queue cannot make work pile up. A remote admin queue's
//! broker that refuses the ack makes it a dead letter on this broker like any forwarded
//! message (it carries no admin queue, so that posts nothing further).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use mq_proto::ack::{self, class};
use mq_proto::format_name::FormatName;
use mq_proto::limits::quote;
use mq_proto::v1::DeadLetterClass;

use crate::broker::{remote_destination, Broker};
use crate::error::BrokerError;
use crate::journal::Op;
use crate::journal_queue::Copies;
use crate::message::{now_ms, Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue, QueueRole};

/// Log lines about dropped acks: one a second.
static DROP_LOG: crate::ratelog::RateLimitedLog = crate::ratelog::RateLimitedLog::new(1000);

/// Checks a sender's admin queue and acknowledgement bits: at most one queue (no
/// multiple-element name, not read-only), bits within [`ack::ALL`], and bits only with a queue.
pub(crate) fn check_request(
    admin_queue: &str,
    acknowledge: u32,
) -> Result<(Option<Arc<str>>, u8), BrokerError> {
    if acknowledge > ack::ALL as u32 {
        return Err(BrokerError::InvalidArgument(format!(
            "acknowledge {acknowledge:#x} has unknown bits; the bits are 1 (positive arrival), 2 (positive receive), 4 (negative arrival) and 8 (negative receive)"
        )));
    }
    if admin_queue.is_empty() {
        if acknowledge != 0 {
            return Err(BrokerError::InvalidArgument(
                "acknowledgements were asked for without an admin queue to post them to (set admin_queue, mq send --admin-queue)".into(),
            ));
        }
        return Ok((None, 0));
    }
    if admin_queue.len() > mq_proto::limits::MAX_RESPONSE_QUEUE_BYTES {
        return Err(BrokerError::InvalidArgument(format!(
            "admin queue is {} bytes; the limit is {} bytes",
            admin_queue.len(),
            mq_proto::limits::MAX_RESPONSE_QUEUE_BYTES
        )));
    }
    let parsed = FormatName::parse(admin_queue)?;
    let Some(addr) = parsed.single() else {
        return Err(BrokerError::InvalidArgument(format!(
            "admin queue \"{}\" is a multiple-element format name; acknowledgements go to one queue",
            quote(admin_queue)
        )));
    };
    if addr.is_read_only() {
        return Err(BrokerError::InvalidArgument(format!(
            "admin queue \"{}\" is read-only (a journal, dead-letter queue or subqueue); acknowledgements are sent to it",
            quote(admin_queue)
        )));
    }
    Ok((Some(Arc::from(admin_queue)), acknowledge as u8))
}

/// Where acknowledgements to an admin queue would be posted, for the check of the right to
/// post there (the sender's on a send, the forwarding identity's on a forwarded message).
pub(crate) enum AckTarget {
    /// Nothing to check: a name the message's own checks refuse ([`check_request`] says
    /// why), or a local queue that does not exist (its acknowledgements are dropped, as MSMQ
    /// accepts any admin queue at the send).
    Unchecked,
    /// One of this broker's queues.
    Local(Arc<Queue>),
    /// Another broker's queue (that broker checks who posts there).
    Remote,
}

/// The [`AckTarget`] of `admin_queue` on `broker`; an error only from looking up a local
/// queue (other than its absence).
pub(crate) fn ack_target(broker: &Broker, admin_queue: &str) -> Result<AckTarget, BrokerError> {
    let Ok(parsed) = FormatName::parse(admin_queue) else {
        return Ok(AckTarget::Unchecked);
    };
    let Some(addr) = parsed.single() else {
        return Ok(AckTarget::Unchecked);
    };
    if addr.is_read_only() {
        return Ok(AckTarget::Unchecked);
    }
    if !broker.is_local(addr) {
        return Ok(AckTarget::Remote);
    }
    match broker.local_queue(admin_queue, addr) {
        Ok(q) => Ok(AckTarget::Local(q)),
        Err(BrokerError::QueueNotFound(_)) => Ok(AckTarget::Unchecked),
        Err(e) => Err(e),
    }
}

/// The answer of a check for the last admin queue it was asked about: a batch's messages
/// usually share one, so it is checked once a batch.
pub(crate) struct LastAnswer<T> {
    last: Option<(String, T)>,
}

impl<T: Clone> LastAnswer<T> {
    pub(crate) fn new() -> Self {
        LastAnswer { last: None }
    }

    /// The answer for `name`: the kept one if `name` was the last asked, else `check`'s.
    pub(crate) fn get(&mut self, name: &str, check: impl FnOnce() -> T) -> T {
        match &self.last {
            Some((last, answer)) if last == name => answer.clone(),
            _ => {
                let answer = check();
                self.last = Some((name.to_string(), answer.clone()));
                answer
            }
        }
    }
}

/// Checks the class of a forwarded message: 0 or a class mq knows.
pub(crate) fn check_class(code: u32) -> Result<u16, BrokerError> {
    match ack::class_name(code) {
        Some(_) => Ok(code as u16),
        None => Err(BrokerError::InvalidArgument(format!(
            "message class {code:#x} is not one mq knows"
        ))),
    }
}

/// Whether `m` gets an ack of `class`: it has an admin queue, asked for that kind, and is
/// not an ack itself.
pub(crate) fn wanted(m: &StoredMessage, class: u16) -> bool {
    m.acknowledge != 0 && m.class == class::NORMAL && ack::wants(m.acknowledge, class)
}

/// The NACK class of a dead letter; `reached` says whether it was in its destination queue
/// (a time-to-be-received that passes there is a receive NACK, on the way an arrival NACK).
pub(crate) fn nack_class(dl: DeadLetterClass, reached: bool) -> u16 {
    match dl {
        DeadLetterClass::BadDestinationQueue
        | DeadLetterClass::BadMessage
        | DeadLetterClass::Unspecified => class::NACK_BAD_DST_Q,
        DeadLetterClass::NotTransactionalQueue => class::NACK_NOT_TRANSACTIONAL_Q,
        DeadLetterClass::NotTransactionalMessage => class::NACK_NOT_TRANSACTIONAL_MSG,
        DeadLetterClass::QueueExceedQuota => class::NACK_Q_EXCEED_QUOTA,
        DeadLetterClass::ReachQueueTimeout => class::NACK_REACH_QUEUE_TIMEOUT,
        DeadLetterClass::ReceiveTimeout if reached => class::NACK_RECEIVE_TIMEOUT,
        DeadLetterClass::ReceiveTimeout => class::NACK_REACH_QUEUE_TIMEOUT,
        DeadLetterClass::AccessDenied => class::NACK_ACCESS_DENIED,
    }
}

/// The broker's acknowledgement state: counters, and a way back to the broker's `Arc` for
/// creating an outgoing queue towards a remote admin queue.
#[derive(Debug, Default)]
pub(crate) struct AckState {
    me: OnceLock<Weak<Broker>>,
    posted: AtomicU64,
    dropped: AtomicU64,
}

impl AckState {
    /// Called once the broker runs (`Broker::start_background`).
    pub(crate) fn set_broker(&self, b: &Arc<Broker>) {
        let _ = self.me.set(Arc::downgrade(b));
    }

    /// `(posted, dropped)` since start.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.posted.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

/// One event that may post an ack.
pub(crate) struct AckEvent<'a> {
    pub msg: &'a StoredMessage,
    pub class: u16,
    /// The format name of the queue the original was sent to (the ack's response queue).
    pub destination: String,
    /// The original body, for NACKs (positive acks carry none).
    pub body: Option<Bytes>,
}

/// Acks placed in their queues but not receivable yet: `ops` go into the event's journal
/// record; then [`Prepared::commit`] (the record is durable) or [`Prepared::abort`].
#[derive(Default)]
#[must_use = "prepared acks must be committed or aborted"]
pub(crate) struct Prepared {
    pub ops: Vec<Op>,
    placed: Vec<(Arc<Queue>, Entry)>,
    /// Whose quotas the placed acks are charged to (for [`Drop`]).
    broker: Weak<Broker>,
}

impl Prepared {
    pub(crate) fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Takes `other`'s placed acks (its `ops` must already be in the same record).
    pub(crate) fn absorb(&mut self, mut other: Prepared) {
        debug_assert!(other.ops.is_empty());
        self.placed.append(&mut other.placed);
        if self.broker.strong_count() == 0 {
            self.broker = std::mem::take(&mut other.broker);
        }
    }

    /// The event's record is durable (or it had none): the acks become receivable.
    pub(crate) fn commit(mut self, b: &Broker) {
        let placed = std::mem::take(&mut self.placed);
        if placed.is_empty() {
            return;
        }
        b.acks
            .posted
            .fetch_add(placed.len() as u64, Ordering::Relaxed);
        for (q, entries) in group_by_queue(placed) {
            b.insert_or_forget(&q, entries);
        }
    }

    /// The event's record failed: the acks never were.
    pub(crate) fn abort(mut self, b: &Broker) {
        for (q, e) in std::mem::take(&mut self.placed) {
            let charge = e.msg.charged_bytes();
            q.unadmit(e.seq, charge);
            b.release(e.msg.delivery, charge);
        }
    }
}

impl Drop for Prepared {
    /// Acks neither committed nor aborted (the task that held them was cancelled while their
    /// record was being written) give their positions back, so an admin queue, which hands out
    /// nothing past a position not yet inserted, does not wait for them for good, and their
    /// charges; a record that was written brings them back at the next start.
    fn drop(&mut self) {
        let broker = self.broker.upgrade();
        for (q, e) in self.placed.drain(..) {
            let charge = e.msg.charged_bytes();
            q.unadmit(e.seq, charge);
            if let Some(b) = &broker {
                b.release(e.msg.delivery, charge);
            }
        }
    }
}

impl Broker {
    /// Builds and places the acks `events` call for (skipping those not wanted). Recoverable
    /// ones add their `Put` to the result's `ops`, for the caller's record.
    pub(crate) fn prepare_acks<'a>(
        &self,
        events: impl IntoIterator<Item = AckEvent<'a>>,
    ) -> Prepared {
        let mut out = Prepared {
            ops: Vec::new(),
            placed: Vec::new(),
            broker: self.acks.me.get().cloned().unwrap_or_default(),
        };
        for ev in events {
            if !wanted(ev.msg, ev.class) {
                continue;
            }
            let Some(admin) = ev.msg.admin_queue.as_deref() else {
                continue;
            };
            match self.place_ack(&ev, admin) {
                Ok((q, entry)) => {
                    if entry.msg.delivery == Delivery::Recoverable {
                        out.ops.push(entry.msg.put_op(q.def().id, entry.seq));
                        let bodyless = Arc::new(entry.msg.without_body());
                        out.placed.push((q, Entry::new(entry.seq, bodyless)));
                    } else {
                        out.placed.push((q, entry));
                    }
                }
                Err(e) => {
                    self.acks.dropped.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = DROP_LOG.allow(now_ms(), 1) {
                        tracing::warn!(
                            id = %ev.msg.id,
                            class = ev.class,
                            admin_queue = %quote(admin),
                            error = %e,
                            held_back,
                            "acknowledgement dropped"
                        );
                    }
                }
            }
        }
        out
    }

    /// Prepares acks for events that have no journal record of their own and finishes them:
    /// recoverable ones get a record of their own.
    pub(crate) fn post_acks<'a>(&self, events: impl IntoIterator<Item = AckEvent<'a>>) {
        let mut p = self.prepare_acks(events);
        let ops = std::mem::take(&mut p.ops);
        self.finish_acks(ops, p, Copies::default());
    }

    /// Submits `ops` (the event's record, with the acks' and journal copies' `Put`s) unless
    /// empty, and makes the acks and copies receivable once it is durable; not awaited.
    fn finish_acks(&self, ops: Vec<Op>, acks: Prepared, copies: Copies) {
        if ops.is_empty() {
            acks.commit(self);
            copies.stored(self);
            return;
        }
        // The normal lane, not the removal lane: an ack's `Put` must follow its queue's
        // definition (an outgoing queue may have been defined just now).
        let commit = self.journal().submit(ops);
        let Some(me) = self.acks.me.get().and_then(Weak::upgrade) else {
            match commit.wait() {
                Ok(()) => {
                    acks.commit(self);
                    copies.stored(self);
                }
                Err(_) => {
                    acks.abort(self);
                    copies.failed(self);
                }
            }
            return;
        };
        tokio::spawn(async move {
            match commit.await {
                Ok(()) => {
                    acks.commit(&me);
                    copies.stored(&me);
                }
                Err(_) => {
                    acks.abort(&me);
                    copies.failed(&me);
                }
            }
        });
    }

    /// Admits one ack into the admin queue (or the outgoing queue towards it).
    fn place_ack(
        &self,
        ev: &AckEvent<'_>,
        admin: &str,
    ) -> Result<(Arc<Queue>, Entry), BrokerError> {
        let o = ev.msg;
        let body = if ev.class & 0x8000 != 0 {
            ev.body.clone().unwrap_or_default()
        } else {
            Bytes::new()
        };
        let parsed = FormatName::parse(admin)?;
        let addr = parsed
            .single()
            .ok_or_else(|| BrokerError::InvalidArgument("not one queue".into()))?;
        let (queue, route) = if self.is_local(addr) {
            let q = self.local_queue(admin, addr)?;
            if q.def().transactional {
                return Err(BrokerError::FailedPrecondition(format!(
                    "admin queue \"{}\" is transactional; acknowledgements are not transactional",
                    q.def().name
                )));
            }
            (q, None)
        } else {
            let o = self.outgoing_towards(&remote_destination(addr))?;
            (o.queue().clone(), Some(Arc::<str>::from(addr.to_string())))
        };
        let now = now_ms();
        let ack = Arc::new(StoredMessage {
            id: uuid::Uuid::now_v7(),
            body_len: body.len() as u32,
            body: Some(body),
            label: o.label.clone(),
            priority: o.priority,
            correlation_id: o.id.to_string(),
            app_specific: o.app_specific,
            body_type: o.body_type,
            delivery: o.delivery,
            sent_time_ms: now,
            arrived_time_ms: now,
            response_queue: mq_proto::limits::truncate(
                &ev.destination,
                mq_proto::limits::MAX_RESPONSE_QUEUE_BYTES,
            ),
            reach_queue_by_ms: 0,
            receive_by_ms: 0,
            transactional: false,
            route,
            dead_letter: None,
            sender: o.sender.clone(),
            move_count: 0,
            // An ack is never journaled at its source.
            journal: false,
            admin_queue: None,
            acknowledge: 0,
            class: ev.class,
        });
        let charge = ack.charged_bytes();
        self.reserve(ack.delivery, charge)?;
        match queue.admit(std::slice::from_ref(&ack)).map(|mut r| r.pop()) {
            Ok(Some(Ok(seq))) => Ok((queue, Entry::new(seq, ack))),
            Ok(Some(Err(e))) | Err(e) => {
                self.release(ack.delivery, charge);
                Err(e)
            }
            Ok(None) => unreachable!("one result per message"),
        }
    }

    /// The outgoing queue towards `destination`, created if the broker runs.
    fn outgoing_towards(
        &self,
        destination: &str,
    ) -> Result<Arc<crate::forward::Outgoing>, BrokerError> {
        if let Some(o) = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(destination)
        {
            return Ok(o.clone());
        }
        match self.acks.me.get().and_then(Weak::upgrade) {
            Some(me) => me.outgoing_for(destination),
            None => Err(BrokerError::Unavailable(
                "the broker is not running yet; no outgoing queue can be created".into(),
            )),
        }
    }

    /// Acks for entries of `queue` that are gone for good with `class` (received, purged,
    /// deleted), with the original bodies read where a NACK needs them.
    pub(crate) fn acks_for_entries(
        &self,
        queue: &Queue,
        entries: &[Entry],
        class: u16,
    ) -> Prepared {
        // Journal copies and dead letters keep the original's request but post nothing more.
        let posts = matches!(
            queue.def().role,
            QueueRole::Normal | QueueRole::Subqueue | QueueRole::Outgoing { .. }
        );
        if !posts || !entries.iter().any(|e| wanted(&e.msg, class)) {
            return Prepared::default();
        }
        let destination = destination_of(queue);
        let events: Vec<AckEvent<'_>> = entries
            .iter()
            .filter(|e| wanted(&e.msg, class))
            .map(|e| AckEvent {
                msg: &e.msg,
                class,
                destination: e
                    .msg
                    .route
                    .as_deref()
                    .map_or_else(|| destination.clone(), str::to_string),
                body: if class & 0x8000 != 0 {
                    self.body(queue, e).ok()
                } else {
                    None
                },
            })
            .collect();
        self.prepare_acks(events)
    }

    /// Entries received for good from `queue` (a streaming receiver's acknowledgement, a
    /// one-shot receive): [`Broker::forget_received`], with their `ACK_RECEIVE`s in the same
    /// record as the removal and the journal copies.
    pub(crate) fn forget_received_acked(self: &Arc<Self>, queue: &Arc<Queue>, entries: &[Entry]) {
        let mut acks = self.acks_for_entries(queue, entries, class::ACK_RECEIVE);
        if acks.is_empty() {
            self.forget_received(queue, entries);
            return;
        }
        let mut copies = self.journal_copies(queue, entries);
        let mut ops = copies.take_ops();
        ops.append(&mut acks.ops);
        ops.extend(self.release_entries(queue, entries));
        self.finish_acks(ops, acks, copies);
    }

    /// Entries that could not go back to `queue` because it was deleted meanwhile (delivered,
    /// taken or received in a transaction when the deletion came, given back after it):
    /// forgotten, with the `NACK_Q_DELETED`s they ask for in the same record as their release.
    /// The deletion's own NACKs cover only the messages waiting then; these got none (the
    /// stop 48 note: a sender never heard of a message in flight when its queue was deleted).
    pub(crate) fn forget_deleted(&self, queue: &Queue, gone: &[Entry]) {
        if gone.is_empty() {
            return;
        }
        let mut acks = self.acks_for_entries(queue, gone, class::NACK_Q_DELETED);
        if acks.is_empty() {
            self.forget(queue, gone);
            return;
        }
        let mut ops = std::mem::take(&mut acks.ops);
        ops.extend(self.release_entries(queue, gone));
        self.finish_acks(ops, acks, Copies::default());
    }

    /// The `NACK_Q_DELETED`s of the messages waiting in the application queue `key` and its
    /// subqueues (not its journal: copies post nothing), for the deletion's record. A message
    /// received between this and the deletion gets both its `ACK_RECEIVE` and this NACK; one
    /// sent in between gets none (the deletion holds the redefinitions lock, not the queue).
    pub(crate) fn deletion_nacks(&self, key: &str) -> Prepared {
        let deleted = class::NACK_Q_DELETED;
        let prefix = format!("{key};");
        let mut out = Prepared::default();
        for q in self.all_queues() {
            let k = &q.def().key;
            let ours = (k == key && q.def().role.is_normal())
                || (q.def().role == QueueRole::Subqueue && k.starts_with(&prefix));
            if !ours {
                continue;
            }
            let nacked = q.waiting_matching(|e| wanted(&e.msg, deleted));
            let mut p = self.acks_for_entries(&q, &nacked, deleted);
            out.ops.append(&mut p.ops);
            out.absorb(p);
        }
        out
    }
}

/// The format name a local queue's messages were sent to.
pub(crate) fn destination_of(queue: &Queue) -> String {
    match &queue.def().role {
        QueueRole::Outgoing { .. } => String::new(),
        _ => queue.info().format_name,
    }
}
