//! Transaction outcomes: the ids of committed transactions, journaled in their commit record and
//! remembered for a retention window, so a client whose commit reply was lost can find out.
//!
//! Every transaction has a 16-byte id (chosen by the client, else by the broker). Its commit
//! record carries one more op: a `Put` into the internal `SYSTEM$;TXOUTCOMES` queue whose header
//! is the id and the commit time. The same record removes the oldest such entries once there
//! are more than `max` or they are older than `retention`, so the journal and memory stay
//! bounded. Recovery rebuilds the set.
//!
//! Answers (see [`Outcomes::outcome`]):
//! - committed: the id is in the set;
//! - in progress: a connection has the transaction open or is committing it;
//! - aborted: this broker saw it abort (memory only, bounded), or the id is a UUID v7 stamped
//!   before this broker started and after the oldest commit it still remembers: such a
//!   transaction was open when the broker stopped and was rolled back;
//! - unknown: anything else (older than the window, or never seen).
//!
//! A transaction may not begin with an id that committed (ALREADY_EXISTS: "already committed")
//! or that is open on another connection, so retrying an in-doubt commit with the same id
//! commits at most once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use mq_proto::v1;

use crate::error::BrokerError;
use crate::journal::{Op, RecoveredMessage};
use crate::message::now_ms;

/// Default: commits are remembered for 24 hours...
pub const DEFAULT_TX_OUTCOME_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// ...and at most this many of them (the oldest are forgotten first).
pub const DEFAULT_TX_OUTCOME_MAX: usize = 100_000;

/// One committed transaction as stored in the journal (postcard). Field order is the format.
#[derive(serde::Serialize, serde::Deserialize)]
struct OutcomeRecord {
    id: [u8; 16],
    time_ms: u64,
}

/// The broker's memory of transaction outcomes.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    /// The internal queue whose messages are the committed ids.
    pub queue_id: u64,
    next_slot: u64,
    /// Committed and durable: id -> commit time.
    committed: HashMap<uuid::Uuid, u64>,
    /// Every journaled entry, oldest first: (slot, id, commit time).
    order: VecDeque<(u64, uuid::Uuid, u64)>,
    /// Seen to abort since this broker started: id -> time. Memory only, bounded by `max`.
    aborted: HashMap<uuid::Uuid, u64>,
    aborted_order: VecDeque<uuid::Uuid>,
    /// Open or committing on some connection.
    open: HashSet<uuid::Uuid>,
    /// Commit time of the newest entry forgotten early (the count limit): every commit after it
    /// is still remembered.
    forgotten_through_ms: u64,
    started_ms: u64,
    retention_ms: u64,
    max: usize,
}

/// What [`Outcomes::outcome`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub outcome: v1::TxOutcome,
    pub time_ms: u64,
    pub detail: String,
}

impl Outcomes {
    /// The outcomes found in the journal (entries of the internal queue `queue_id`). Returns
    /// them and the slots of entries already past the retention window (to remove).
    pub(crate) fn recover(
        queue_id: u64,
        records: &[RecoveredMessage],
        next_slot: u64,
        retention: Duration,
        max: usize,
    ) -> Result<(Outcomes, Vec<u64>), BrokerError> {
        let mut o = Outcomes::new(queue_id, next_slot, retention, max);
        let mut entries = Vec::with_capacity(records.len());
        for r in records {
            let rec: OutcomeRecord = postcard::from_bytes(&r.header).map_err(|e| {
                BrokerError::Internal(format!(
                    "transaction outcome record {} in the journal is unreadable: {e}",
                    r.seq
                ))
            })?;
            entries.push((r.seq, uuid::Uuid::from_bytes(rec.id), rec.time_ms));
        }
        entries.sort_by_key(|(slot, _, _)| *slot);
        for (slot, id, time) in entries {
            o.committed.insert(id, time);
            o.order.push_back((slot, id, time));
        }
        let expired = o.evict(now_ms(), 0);
        Ok((o, expired))
    }

    pub(crate) fn new(queue_id: u64, next_slot: u64, retention: Duration, max: usize) -> Outcomes {
        Outcomes {
            queue_id,
            next_slot: next_slot.max(1),
            started_ms: now_ms(),
            retention_ms: retention.as_millis() as u64,
            max: max.max(1),
            ..Outcomes::default()
        }
    }

    /// The retention window.
    pub(crate) fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    /// Drops the oldest entries past the window, and as many more as needed to leave room for
    /// `room` new ones under `max`. Returns their slots.
    fn evict(&mut self, now: u64, room: usize) -> Vec<u64> {
        let mut slots = Vec::new();
        let horizon = now.saturating_sub(self.retention_ms);
        while let Some(&(slot, id, time)) = self.order.front() {
            let expired = time < horizon;
            if !expired && self.order.len() + room <= self.max {
                break;
            }
            if !expired {
                self.forgotten_through_ms = self.forgotten_through_ms.max(time);
            }
            self.order.pop_front();
            if self.committed.get(&id) == Some(&time) {
                self.committed.remove(&id);
            }
            slots.push(slot);
        }
        slots
    }

    /// A transaction begins with `id`: refused if that id committed, or is open elsewhere.
    pub(crate) fn begin(&mut self, id: uuid::Uuid) -> Result<(), BrokerError> {
        if let Some(&t) = self.committed.get(&id) {
            if t >= now_ms().saturating_sub(self.retention_ms) {
                return Err(BrokerError::AlreadyExists(format!(
                    "transaction {id} was already committed (at {} Unix ms); nothing was done this time",
                    t
                )));
            }
        }
        if !self.open.insert(id) {
            return Err(BrokerError::FailedPrecondition(format!(
                "transaction {id} is open on another connection; ask its outcome (mq tx status {id}) and retry once it has ended"
            )));
        }
        self.aborted.remove(&id);
        Ok(())
    }

    /// The ops that record `id` as committed, for the transaction's commit record (called under
    /// the commit-order lock): a `Put` of the id, and a `Remove` of entries it pushes out.
    pub(crate) fn commit_ops(&mut self, id: uuid::Uuid) -> (Vec<Op>, u64) {
        let now = now_ms();
        let slot = self.next_slot;
        self.next_slot += 1;
        let evicted = self.evict(now, 1);
        self.order.push_back((slot, id, now));
        let header = OutcomeRecord {
            id: *id.as_bytes(),
            time_ms: now,
        };
        let mut ops = vec![Op::Put {
            queue_id: self.queue_id,
            seq: slot,
            header: Bytes::from(postcard::to_allocvec(&header).expect("encoding into a Vec")),
            body: Bytes::new(),
        }];
        if !evicted.is_empty() {
            ops.push(Op::Remove {
                queue_id: self.queue_id,
                seqs: evicted,
            });
        }
        (ops, now)
    }

    /// The commit record of `id` (committed at `time_ms`) is on disk.
    pub(crate) fn committed(&mut self, id: uuid::Uuid, time_ms: u64) {
        self.open.remove(&id);
        if self
            .order
            .iter()
            .rev()
            .any(|(_, i, t)| *i == id && *t == time_ms)
        {
            self.committed.insert(id, time_ms);
        }
    }

    /// The transaction `id` ended without committing.
    pub(crate) fn aborted(&mut self, id: uuid::Uuid) {
        if !self.open.remove(&id) {
            return;
        }
        if self.aborted.insert(id, now_ms()).is_none() {
            self.aborted_order.push_back(id);
        }
        while self.aborted_order.len() > self.max {
            if let Some(old) = self.aborted_order.pop_front() {
                self.aborted.remove(&old);
            }
        }
    }

    /// What this broker knows about `id`.
    pub(crate) fn outcome(&self, id: uuid::Uuid) -> Answer {
        let now = now_ms();
        let horizon = now.saturating_sub(self.retention_ms);
        let hours = self.retention_ms as f64 / 3_600_000.0;
        if self.open.contains(&id) {
            return Answer {
                outcome: v1::TxOutcome::InProgress,
                time_ms: 0,
                detail: format!(
                    "transaction {id} is open or committing right now; ask again shortly"
                ),
            };
        }
        if let Some(&t) = self.committed.get(&id) {
            if t >= horizon {
                return Answer {
                    outcome: v1::TxOutcome::Committed,
                    time_ms: t,
                    detail: format!("transaction {id} committed"),
                };
            }
        }
        if let Some(&t) = self.aborted.get(&id) {
            return Answer {
                outcome: v1::TxOutcome::Aborted,
                time_ms: t,
                detail: format!("transaction {id} was aborted and did not commit"),
            };
        }
        // A UUID v7 carries the time it was made. One made before this broker started, and
        // after the oldest commit still remembered, would be remembered had it committed: it
        // was rolled back when the broker stopped (or never reached it).
        let complete_since = horizon.max(self.forgotten_through_ms);
        if let Some(made) = uuid_v7_ms(id) {
            if made < self.started_ms && made > complete_since {
                return Answer {
                    outcome: v1::TxOutcome::Aborted,
                    time_ms: 0,
                    detail: format!(
                        "transaction {id} did not commit: it was open when the broker stopped, and was rolled back"
                    ),
                };
            }
        }
        Answer {
            outcome: v1::TxOutcome::Unknown,
            time_ms: 0,
            detail: format!(
                "no record of transaction {id}: it did not commit within the last {hours:.1} h (and the last {} commits), or this broker never saw it",
                self.max
            ),
        }
    }
}

/// The Unix-ms timestamp of a UUID v7, if `id` is one.
fn uuid_v7_ms(id: uuid::Uuid) -> Option<u64> {
    if id.get_version_num() != 7 {
        return None;
    }
    let b = id.as_bytes();
    Some(u64::from_be_bytes([
        0, 0, b[0], b[1], b[2], b[3], b[4], b[5],
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcomes(max: usize) -> Outcomes {
        Outcomes::new(9, 1, Duration::from_secs(3600), max)
    }

    #[test]
    fn begin_commit_and_answer() {
        let mut o = outcomes(10);
        let id = uuid::Uuid::now_v7();
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::Unknown);
        o.begin(id).unwrap();
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::InProgress);
        assert!(o.begin(id).is_err(), "open elsewhere");
        let (ops, t) = o.commit_ops(id);
        assert_eq!(ops.len(), 1);
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::InProgress);
        o.committed(id, t);
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::Committed);
        let e = o.begin(id).unwrap_err();
        assert!(e.to_string().contains("already committed"), "{e}");
    }

    #[test]
    fn abort_is_remembered_and_a_retry_may_begin() {
        let mut o = outcomes(10);
        let id = uuid::Uuid::now_v7();
        o.begin(id).unwrap();
        o.aborted(id);
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::Aborted);
        o.begin(id).unwrap();
        assert_eq!(o.outcome(id).outcome, v1::TxOutcome::InProgress);
    }

    #[test]
    fn the_count_limit_removes_the_oldest_in_the_same_record() {
        let mut o = outcomes(3);
        let ids: Vec<_> = (0..5u128).map(|i| uuid::Uuid::from_u128(i + 1)).collect();
        let mut removed = Vec::new();
        for id in &ids {
            o.begin(*id).unwrap();
            let (ops, t) = o.commit_ops(*id);
            for op in &ops {
                if let Op::Remove { seqs, .. } = op {
                    removed.extend(seqs.iter().copied());
                }
            }
            o.committed(*id, t);
        }
        assert_eq!(removed, vec![1, 2]);
        assert_eq!(o.outcome(ids[0]).outcome, v1::TxOutcome::Unknown);
        assert_eq!(o.outcome(ids[4]).outcome, v1::TxOutcome::Committed);
        assert_eq!(o.order.len(), 3);
    }

    #[test]
    fn recovery_reads_what_commit_wrote() {
        let mut o = outcomes(10);
        let id = uuid::Uuid::now_v7();
        o.begin(id).unwrap();
        let (ops, _) = o.commit_ops(id);
        let Op::Put { seq, header, .. } = &ops[0] else {
            panic!("a put first")
        };
        let rec = RecoveredMessage {
            seq: *seq,
            header: header.clone(),
            body_len: 0,
        };
        let (r, expired) =
            Outcomes::recover(9, &[rec], seq + 1, Duration::from_secs(3600), 10).unwrap();
        assert!(expired.is_empty());
        assert_eq!(r.outcome(id).outcome, v1::TxOutcome::Committed);
    }

    #[test]
    fn a_v7_id_from_before_the_start_that_is_not_recorded_did_not_commit() {
        let mut o = outcomes(10);
        let before = uuid::Uuid::now_v7();
        o.started_ms = now_ms() + 1000;
        assert_eq!(o.outcome(before).outcome, v1::TxOutcome::Aborted);
        // Not a v7 id: the broker cannot tell.
        assert_eq!(
            o.outcome(uuid::Uuid::from_u128(42)).outcome,
            v1::TxOutcome::Unknown
        );
    }
}
