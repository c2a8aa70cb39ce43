//! Transactions: sends and receives across transactional queues that commit as one journal
//! record, or not at all.
//!
//! - A send is *staged*: checked and charged against the storage quota and its queue's quota,
//!   counted against the transaction's and the broker's staging limits (`mqd --max-tx-bytes`,
//!   `--max-tx-total-bytes`, `--max-tx-messages`), invisible to receivers.
//! - A receive takes a message from its queue and hides it (it is in flight to this transaction).
//! - Commit assigns the staged messages their queue positions (under the broker's commit-order
//!   lock), writes one atomic journal record with every send (`Put`) and every receive
//!   (`Remove`), waits for `fdatasync`, then makes the sends visible and forgets the receives.
//! - Abort (or dropping the transaction: client gone, timeout) releases the staged sends and
//!   puts each received message back at its place in its queue, its abort count incremented.
//! - Every transaction has an id; the commit record also records it (see `outcome.rs`), so its
//!   outcome can be asked for later, and an id that committed cannot commit again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mq_proto::v1;

use crate::broker::{force_transactional, journal_failed, Broker, Destinations};
use crate::error::BrokerError;
use crate::journal::Op;
use crate::message::{Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue};

/// What a staged copy costs in memory beyond its quota charge (a recoverable message's 128 B
/// of overhead; in memory it costs as an express one does, `EXPRESS_OVERHEAD_BYTES`): counted
/// against `--max-tx-bytes` and `--max-tx-total-bytes`, which bound memory. Charged the quota
/// charge alone, 3,960,000 tiny staged sends took 1.2 GiB against 507 MB counted (helper-52).
const STAGED_EXTRA_BYTES: u64 =
    crate::config::EXPRESS_OVERHEAD_BYTES - crate::config::MESSAGE_OVERHEAD_BYTES;

struct Staged {
    queue: Arc<Queue>,
    msg: Arc<StoredMessage>,
    /// Charged to the queue quota and the storage quota (the staging limits count it and
    /// [`STAGED_EXTRA_BYTES`]).
    charge: u64,
}

/// One open transaction. Dropping it without [`Transaction::commit`] aborts it.
pub struct Transaction {
    broker: Arc<Broker>,
    id: uuid::Uuid,
    /// The id is registered as open in the broker's outcomes (and must be released).
    registered: bool,
    sends: Vec<Staged>,
    received: Vec<(Arc<Queue>, Entry)>,
    /// The first send that could not be staged: the commit fails with it.
    failed: Option<BrokerError>,
    /// Bytes counted against the staging limits by `sends`.
    staged_bytes: u64,
    done: bool,
    /// Why it is aborted if it is rolled back now (the metrics' reason label).
    abort_reason: crate::metrics::AbortReason,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("id", &self.id)
            .field("sends", &self.sends.len())
            .field("received", &self.received.len())
            .field("failed", &self.failed)
            .finish()
    }
}

/// What a commit stored.
#[derive(Debug, Clone)]
pub struct Committed {
    /// Ids of the sent messages, in send order (one per message, shared by its copies).
    pub ids: Vec<uuid::Uuid>,
    /// Messages received (and now removed).
    pub received: usize,
    /// The transaction's id.
    pub id: uuid::Uuid,
}

impl Transaction {
    /// A new, empty transaction with a broker-assigned id.
    pub fn begin(broker: Arc<Broker>) -> Self {
        Self::begin_with_id(broker, uuid::Uuid::now_v7())
            .expect("a fresh UUID v7 is neither committed nor open")
    }

    /// A new, empty transaction with the client's `id`. Refused if a transaction with that id
    /// committed (within the retention window) or is open on another connection.
    pub fn begin_with_id(broker: Arc<Broker>, id: uuid::Uuid) -> Result<Self, BrokerError> {
        broker.outcomes().begin(id)?;
        broker.counters().tx_begun();
        Ok(Transaction {
            broker,
            id,
            registered: true,
            sends: Vec::new(),
            received: Vec::new(),
            failed: None,
            staged_bytes: 0,
            done: false,
            abort_reason: crate::metrics::AbortReason::Ended,
        })
    }

    /// The transaction's id.
    pub fn id(&self) -> uuid::Uuid {
        self.id
    }

    /// Stages messages for `destination` (transactional queues only). A failure is remembered
    /// and returned by [`Transaction::commit`], which then aborts: all or nothing. From the
    /// first failure on nothing more is staged and what was staged is given back at once.
    /// Returns the failure too, so the caller can end a transaction refused by a limit
    /// ([`BrokerError::QuotaExceeded`]) right away.
    pub fn send(
        &mut self,
        destination: &str,
        msgs: Vec<v1::OutMessage>,
    ) -> Result<(), BrokerError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let plan = match self.broker.destinations(destination, true) {
            Ok(p) => p,
            Err(e) => {
                self.refuse(e.clone());
                return Err(e);
            }
        };
        self.send_planned(&plan, msgs)
    }

    /// [`Transaction::send`] to destinations the caller resolved (and checked the rights and
    /// kinds of) itself, so that they are not looked up again.
    pub(crate) fn send_planned(
        &mut self,
        plan: &Destinations,
        msgs: Vec<v1::OutMessage>,
    ) -> Result<(), BrokerError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Err(e) = self.try_send(plan, msgs) {
            self.release_staged();
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// Records a send refused before it was staged: [`Transaction::commit`] then fails with
    /// `e` and aborts, as for [`Transaction::send`]'s own refusals.
    pub(crate) fn refuse(&mut self, e: BrokerError) {
        if self.failed.is_none() {
            self.release_staged();
            self.failed = Some(e);
        }
    }

    /// Checks the transaction's message count (sends and receives) before adding one.
    fn check_count(&self) -> Result<(), BrokerError> {
        let max = self.broker.config().flow.max_tx_messages;
        if (self.sends.len() + self.received.len()) as u64 >= max {
            return Err(BrokerError::QuotaExceeded(format!(
                "a transaction holds at most {max} messages (sends and receives, mqd --max-tx-messages); commit it and use another"
            )));
        }
        Ok(())
    }

    /// Charges one staged copy to every limit it counts against, or to none: `charge` to the
    /// queue and storage quotas, and what the staged copy costs in memory (`charge` and
    /// [`STAGED_EXTRA_BYTES`]) to the staging limits.
    fn charge(&mut self, queue: &Queue, charge: u64) -> Result<(), BrokerError> {
        let flow = &self.broker.config().flow;
        let staged = charge + STAGED_EXTRA_BYTES;
        if self.staged_bytes + staged > flow.max_tx_bytes {
            return Err(BrokerError::QuotaExceeded(format!(
                "a transaction may stage at most {} bytes (mqd --max-tx-bytes); {} are staged, this message needs {staged}; commit it and use another",
                flow.max_tx_bytes, self.staged_bytes
            )));
        }
        let budget = &self.broker.tx_staged;
        if !budget.try_take(staged) {
            return Err(BrokerError::QuotaExceeded(format!(
                "open transactions together may stage at most {} bytes (mqd --max-tx-total-bytes); {} are staged, this message needs {staged}; retry once other transactions have committed",
                budget.limit(),
                budget.used()
            )));
        }
        if let Err(e) = queue.reserve_quota(charge) {
            budget.give(staged);
            return Err(e);
        }
        if let Err(e) = self.broker.reserve(Delivery::Recoverable, charge) {
            queue.release_quota(charge);
            budget.give(staged);
            return Err(e);
        }
        self.staged_bytes += staged;
        Ok(())
    }

    /// Gives back every charge of the staged sends and forgets them.
    fn release_staged(&mut self) {
        for s in self.sends.drain(..) {
            self.broker.release(Delivery::Recoverable, s.charge);
            s.queue.release_quota(s.charge);
        }
        self.broker.tx_staged.give(self.staged_bytes);
        self.staged_bytes = 0;
    }

    fn try_send(
        &mut self,
        plan: &Destinations,
        msgs: Vec<v1::OutMessage>,
    ) -> Result<(), BrokerError> {
        // Outgoing queues are looked up (created) once a message has passed its checks.
        let mut targets = None;
        for mut m in msgs {
            force_transactional(&mut m);
            let mut msg = StoredMessage::accept(m, uuid::Uuid::now_v7(), self.broker.config())?;
            msg.transactional = true;
            let msg = Arc::new(msg);
            let charge = msg.charged_bytes();
            let dests = match &targets {
                Some(t) => t,
                None => targets.insert(self.broker.targets(plan)?),
            };
            for t in dests.iter() {
                self.check_count()?;
                self.charge(&t.queue, charge)?;
                // A remote queue's copy waits in the outgoing queue (on commit) with its route.
                let msg = match &t.route {
                    None => msg.clone(),
                    Some(route) => Arc::new(StoredMessage {
                        route: Some(route.clone()),
                        ..(*msg).clone()
                    }),
                };
                self.sends.push(Staged {
                    queue: t.queue.clone(),
                    msg,
                    charge,
                });
            }
        }
        Ok(())
    }

    /// Receives one message from a transactional queue, waiting up to `timeout`; it stays hidden
    /// from every other receiver until this transaction commits (then it is gone) or aborts
    /// (then it is back at the head).
    pub async fn receive(
        &mut self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<v1::Message>, BrokerError> {
        self.receive_selected(queue, &crate::queue::Select::Head, timeout)
            .await
    }

    /// [`Transaction::receive`] of the message `select` names (by id or correlation id).
    pub(crate) async fn receive_selected(
        &mut self,
        queue: &str,
        select: &crate::queue::Select,
        timeout: Duration,
    ) -> Result<Option<v1::Message>, BrokerError> {
        self.check_count()?;
        let q = self.broker.queue(queue)?;
        if !q.def().transactional {
            return Err(BrokerError::FailedPrecondition(format!(
                "queue \"{}\" is not transactional; a transactional receive needs a transactional queue",
                q.def().name
            )));
        }
        let timeout_ms = timeout.as_millis() as u64;
        let found = crate::service::wait_for(&self.broker, &q, timeout_ms, |q| match select {
            crate::queue::Select::Head => q.take(1),
            s => Ok(q.take_by(s)?.into_iter().collect()),
        })
        .await?;
        // Nothing (for a selection: no such message now) is `None`, not an error, so the
        // transaction goes on (the client says MQ_ERROR_MESSAGE_NOT_FOUND).
        let Some(entry) = found.into_iter().next() else {
            return Ok(None);
        };
        let body = match self.broker.body(&q, &entry) {
            Ok(b) => b,
            Err(e) => {
                let gone = q.restore(vec![entry]);
                self.broker.forget(&q, &gone);
                return Err(e);
            }
        };
        let wire = entry.msg.to_wire(&q.info().format_name, body, entry.aborts);
        self.received.push((q, entry));
        Ok(Some(wire))
    }

    /// Commits: returns once the commit record is on disk. On any failure the transaction is
    /// aborted and the error returned.
    pub async fn commit(mut self) -> Result<Committed, BrokerError> {
        self.abort_reason = crate::metrics::AbortReason::CommitFailed;
        if let Some(e) = self.failed.take() {
            return Err(e); // Drop aborts.
        }
        let broker = self.broker.clone();
        // Positions and the journal record, in commit order.
        let (commit, placed, committed_at, copies, acks) = {
            let order = broker.commit_order_lock();
            let mut placed: Vec<(Arc<Queue>, Entry)> = Vec::with_capacity(self.sends.len());
            let mut ops = Vec::new();
            let mut header_cache: Option<(uuid::Uuid, Bytes)> = None;
            for s in &self.sends {
                // The quota was charged when the send was staged.
                let seq = match s.queue.admit_reserved() {
                    Ok(seq) => seq,
                    Err(e) => {
                        for (q, e) in &placed {
                            q.unadmit(e.seq, 0);
                        }
                        return Err(e); // Drop aborts and releases the reservations.
                    }
                };
                let header = match &header_cache {
                    Some((id, h)) if *id == s.msg.id && s.msg.route.is_none() => h.clone(),
                    _ => {
                        let h = s.msg.encode_header();
                        if s.msg.route.is_none() {
                            header_cache = Some((s.msg.id, h.clone()));
                        }
                        h
                    }
                };
                ops.push(Op::Put {
                    queue_id: s.queue.def().id,
                    seq,
                    header,
                    body: s.msg.body.clone().unwrap_or_default(),
                });
                placed.push((
                    s.queue.clone(),
                    Entry::new(seq, Arc::new(s.msg.without_body())),
                ));
            }
            // Journal copies, in this record (before the removals: a received message's copy
            // moves its stored Put): of the received messages (target journaling) and of sends
            // to local queues with the journal flag (source journaling).
            let mut copies = crate::journal_queue::Copies::default();
            for (q, e) in &self.received {
                copies.extend(broker.journal_copies(q, std::slice::from_ref(e)));
            }
            for s in self
                .sends
                .iter()
                .filter(|s| s.msg.journal && s.msg.route.is_none())
            {
                broker.source_copy(&s.msg, &mut copies);
            }
            ops.extend(copies.take_ops());
            for (q, e) in &self.received {
                ops.push(Op::Remove {
                    queue_id: q.def().id,
                    seqs: vec![e.seq],
                });
            }
            // Acks: arrivals of the sends to local queues, and the receives.
            let class = mq_proto::ack::class::ACK_REACH_QUEUE;
            let arrivals = self.sends.iter().filter(|s| s.msg.route.is_none());
            let mut acks = broker.prepare_acks(arrivals.map(|s| crate::acks::AckEvent {
                msg: &s.msg,
                class,
                destination: crate::acks::destination_of(&s.queue),
                body: None,
            }));
            ops.append(&mut acks.ops);
            for (q, e) in &self.received {
                let mut r = broker.acks_for_entries(
                    q,
                    std::slice::from_ref(e),
                    mq_proto::ack::class::ACK_RECEIVE,
                );
                ops.append(&mut r.ops);
                acks.absorb(r);
            }
            let (outcome_ops, committed_at) = broker.outcomes().commit_ops(self.id);
            ops.extend(outcome_ops);
            (
                // Written on this thread if the journal's writer is idle; `order` is released
                // as soon as the record's place in the journal is taken.
                broker.journal().submit_awaited(ops, order),
                placed,
                committed_at,
                copies,
                acks,
            )
        };
        if let Err(e) = commit.await {
            copies.failed(&broker);
            acks.abort(&broker);
            for (q, e) in &placed {
                q.unadmit(e.seq, 0);
            }
            if e.may_be_stored() {
                // The record may be on disk (the journal is poisoned now): the outcome is
                // unknown until a restart reads the journal, so it is not recorded as aborted.
                self.registered = false;
                broker.outcomes().in_doubt(self.id);
                let id = self.id;
                return Err(BrokerError::InDoubt(format!(
                    "the journal failed while storing the commit of transaction {id}, which may or may not have committed: {e}; after the restart ask its outcome (mq tx status {id}) before retrying"
                ))); // Drop gives back what is held in memory.
            }
            return Err(journal_failed(e)); // Drop aborts and releases the reservations.
        }
        copies.stored(&broker);
        acks.commit(&broker);
        self.done = true;
        self.registered = false;
        broker.counters().tx_committed();
        broker.outcomes().committed(self.id, committed_at);
        // The queue and storage charges now belong to the stored messages; the staging budget
        // is free again.
        self.broker
            .tx_staged
            .give(std::mem::take(&mut self.staged_bytes));
        let mut ids: Vec<uuid::Uuid> = Vec::new();
        for s in &self.sends {
            if ids.last() != Some(&s.msg.id) {
                ids.push(s.msg.id);
            }
        }
        for (q, entries) in group_by_queue(placed) {
            broker.insert_or_forget(&q, entries);
        }
        let received = std::mem::take(&mut self.received);
        for (q, e) in &received {
            q.complete(std::slice::from_ref(e));
            broker.release(e.msg.delivery, e.msg.charged_bytes());
        }
        Ok(Committed {
            ids,
            received: received.len(),
            id: self.id,
        })
    }

    /// Aborts: staged sends vanish, received messages go back to the head of their queues.
    pub fn abort(mut self) {
        self.abort_reason = crate::metrics::AbortReason::Requested;
        self.rollback();
    }

    /// It ran out of time (`--tx-timeout-secs`): an abort from now on counts as a timeout.
    pub(crate) fn timed_out(&mut self) {
        self.abort_reason = crate::metrics::AbortReason::Timeout;
    }

    fn rollback(&mut self) {
        if self.registered {
            self.registered = false;
            self.broker.outcomes().aborted(self.id);
        }
        if self.done {
            return;
        }
        self.done = true;
        self.broker.counters().tx_aborted(self.abort_reason);
        self.release_staged();
        // Back in their original order; each queue restores by seq. A message aborted as
        // often as its queue's max_aborts goes to the poison subqueue instead.
        let received = self.received.drain(..).map(|(q, mut e)| {
            e.aborts += 1;
            (q, e)
        });
        for (q, entries) in group_by_queue(received) {
            q.count(0, entries.len() as u64);
            let max = q.journaling.poison().max_aborts;
            let (poison, back): (Vec<Entry>, Vec<Entry>) = entries
                .into_iter()
                .partition(|e| max > 0 && e.aborts >= max);
            if !poison.is_empty() {
                self.broker.poison_later(q.clone(), poison);
            }
            let gone = q.restore(back);
            self.broker.forget_deleted(&q, &gone);
        }
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.rollback();
    }
}
