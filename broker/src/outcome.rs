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
//!
//! Single-message transactional sends on a pipelined send stream (`SendRequest.tx_stream`) have
//! ids too, one per message, derived from the stream's id (`mq_proto::txid`). They cost one
//! entry per *stream*, not per message: each batch's record replaces the stream's entry with one
//! saying "every message through seq N is decided (committed unless it is in the refused
//! ranges)". Since the journal writes records in order, the newest durable entry is the truth
//! for everything up to its seq; a message after it committed only if a later record did.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use mq_proto::{txid, v1};

use crate::error::BrokerError;
use crate::journal::{Op, RecoveredMessage};
use crate::message::now_ms;

/// Default: commits are remembered for 24 hours...
pub const DEFAULT_TX_OUTCOME_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// ...and at most this many of them (the oldest are forgotten first).
pub const DEFAULT_TX_OUTCOME_MAX: usize = 100_000;

/// One committed transaction as stored in the journal (postcard). Field order is the format.
/// A send stream's entry is this, followed by a [`StreamTail`].
#[derive(serde::Serialize, serde::Deserialize)]
struct OutcomeRecord {
    id: [u8; 16],
    time_ms: u64,
}

/// The rest of a send stream's entry (postcard, after its [`OutcomeRecord`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct StreamTail {
    /// Every message through this seq is decided: committed unless refused.
    through: u64,
    /// Refusals are remembered from this seq on (older ones were dropped: `MAX_REFUSED_RANGES`).
    exact_from: u64,
    /// Refused messages (never stored), as inclusive seq ranges.
    refused: Vec<(u64, u64)>,
}

/// A send stream remembers at most this many ranges of refused messages; when there are more,
/// the oldest are dropped and the answer for messages before them becomes "unknown".
const MAX_REFUSED_RANGES: usize = 64;

/// One pipelined transactional send stream.
#[derive(Debug, Default)]
struct Stream {
    /// Journal slot of its entry; 0: none.
    slot: u64,
    /// Time of its newest entry.
    time_ms: u64,
    /// Durable: every seq through it is decided (committed unless refused).
    through: u64,
    /// Highest seq whose journal record was handed to the journal.
    submitted: u64,
    /// The next batch must start at or after this seq.
    next_seq: u64,
    exact_from: u64,
    refused: Vec<(u64, u64)>,
    /// The journal failed writing a record with messages from this seq on: unknown until a
    /// restart reads what reached the disk.
    failed_from: Option<u64>,
    /// A connection has the stream open.
    open: bool,
}

impl Stream {
    fn refuse(&mut self, first: u64, last: u64) {
        match self.refused.last_mut() {
            Some((_, end)) if *end + 1 == first => *end = last,
            _ => self.refused.push((first, last)),
        }
        while self.refused.len() > MAX_REFUSED_RANGES {
            let (_, end) = self.refused.remove(0);
            self.exact_from = self.exact_from.max(end + 1);
        }
    }

    fn is_refused(&self, seq: u64) -> bool {
        self.refused.iter().any(|&(a, b)| a <= seq && seq <= b)
    }
}

/// What the journal record of one batch of a send stream carries, and what to report back once
/// it is on disk ([`Outcomes::stream_committed`]) or failed ([`Outcomes::stream_failed`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamBatch {
    pub stream: u128,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// The broker's memory of transaction outcomes.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    /// The internal queue whose messages are the committed ids.
    pub queue_id: u64,
    next_slot: u64,
    /// Committed and durable: id -> commit time.
    committed: HashMap<uuid::Uuid, u64>,
    /// Every journaled entry, oldest first: slot -> (id, commit time). A send stream's entry
    /// moves to a new slot with each batch.
    order: BTreeMap<u64, (uuid::Uuid, u64)>,
    /// Pipelined transactional send streams, by stream id.
    streams: HashMap<u128, Stream>,
    /// Seen to abort since this broker started: id -> time. Memory only, bounded by `max`.
    aborted: HashMap<uuid::Uuid, u64>,
    aborted_order: VecDeque<uuid::Uuid>,
    /// Open or committing on some connection.
    open: HashSet<uuid::Uuid>,
    /// The journal failed while storing their commit records (it is poisoned): unknown until a
    /// restart reads what reached the disk. Bounded by `max`.
    in_doubt: HashSet<uuid::Uuid>,
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
            let unreadable = |e: postcard::Error| {
                BrokerError::Internal(format!(
                    "transaction outcome record {} in the journal is unreadable: {e}",
                    r.seq
                ))
            };
            let (rec, rest): (OutcomeRecord, _) =
                postcard::take_from_bytes(&r.header).map_err(unreadable)?;
            let tail = if rest.is_empty() {
                None
            } else {
                Some(postcard::from_bytes::<StreamTail>(rest).map_err(unreadable)?)
            };
            entries.push((r.seq, uuid::Uuid::from_bytes(rec.id), rec.time_ms, tail));
        }
        entries.sort_by_key(|(slot, _, _, _)| *slot);
        for (slot, id, time, tail) in entries {
            match tail {
                None => {
                    o.committed.insert(id, time);
                }
                Some(t) => {
                    o.streams.insert(
                        id.as_u128(),
                        Stream {
                            slot,
                            time_ms: time,
                            through: t.through,
                            submitted: t.through,
                            next_seq: t.through + 1,
                            exact_from: t.exact_from,
                            refused: t.refused,
                            failed_from: None,
                            open: false,
                        },
                    );
                }
            }
            o.order.insert(slot, (id, time));
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
        while let Some((&slot, &(id, time))) = self.order.first_key_value() {
            let expired = time < horizon;
            if !expired && self.order.len() + room <= self.max {
                break;
            }
            if !expired {
                self.forgotten_through_ms = self.forgotten_through_ms.max(time);
            }
            self.order.remove(&slot);
            if self.committed.get(&id) == Some(&time) {
                self.committed.remove(&id);
            }
            if let Some(st) = self.streams.get_mut(&id.as_u128()) {
                if st.slot == slot {
                    st.slot = 0;
                    if !st.open {
                        self.streams.remove(&id.as_u128());
                    }
                }
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
        if let Some(a) = self.stream_outcome(id) {
            match a.outcome {
                v1::TxOutcome::Committed => {
                    return Err(BrokerError::AlreadyExists(format!(
                        "transaction {id} was already committed (by its send stream); nothing was done this time"
                    )))
                }
                v1::TxOutcome::InProgress => {
                    return Err(BrokerError::FailedPrecondition(format!(
                        "transaction {id} is open on another connection (its send stream); ask its outcome (mq tx status {id}) and retry once it has ended"
                    )))
                }
                _ => {}
            }
        }
        if self.in_doubt.contains(&id) {
            return Err(BrokerError::Unavailable(format!(
                "transaction {id} is in doubt: the journal failed while storing its commit; restart the broker, then ask its outcome (mq tx status {id})"
            )));
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
        self.order.insert(slot, (id, now));
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
            .values()
            .rev()
            .any(|(i, t)| *i == id && *t == time_ms)
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

    /// The journal failed while storing the commit record of `id`, which may be on disk.
    pub(crate) fn in_doubt(&mut self, id: uuid::Uuid) {
        self.open.remove(&id);
        if self.in_doubt.len() < self.max {
            self.in_doubt.insert(id);
        }
    }

    /// A send stream with id `stream` opens. Refused if the id was used before.
    pub(crate) fn stream_open(&mut self, stream: u128) -> Result<(), BrokerError> {
        if !txid::is_stream_id(stream) || txid::split(stream).map(|(_, s)| s) != Some(0) {
            return Err(BrokerError::InvalidArgument(format!(
                "{} is not a send stream id (a UUID v8 laid out as mq_proto::txid says, with seq 0)",
                uuid::Uuid::from_u128(stream)
            )));
        }
        if self.streams.contains_key(&stream) {
            return Err(BrokerError::AlreadyExists(format!(
                "send stream id {} is already in use or was used before; open the sender again (it picks a new id)",
                uuid::Uuid::from_u128(stream)
            )));
        }
        self.streams.insert(
            stream,
            Stream {
                open: true,
                next_seq: 1,
                ..Stream::default()
            },
        );
        Ok(())
    }

    /// Checks that a batch of `count` messages from `first_seq` may follow on `stream`.
    pub(crate) fn stream_check(
        &self,
        stream: u128,
        first_seq: u64,
        count: u64,
    ) -> Result<(), BrokerError> {
        let next = self.streams.get(&stream).map(|s| s.next_seq).unwrap_or(1);
        let last = first_seq.saturating_add(count.max(1) - 1);
        if first_seq != next || last > txid::MAX_SEQ {
            return Err(BrokerError::InvalidArgument(format!(
                "batch {first_seq} of {count} messages on a transactional send stream: batches must number their messages without gaps (the next is {next}) up to {}; open a new sender",
                txid::MAX_SEQ
            )));
        }
        Ok(())
    }

    /// One batch of `stream` (called under the commit-order lock, in journal order): messages
    /// `first_seq..first_seq + count`, of which those at `refused` (indexes) were refused.
    /// With `writes` (the batch has a journal record) returns the ops that replace the stream's
    /// entry, for the same record; else only memory changes.
    pub(crate) fn stream_batch(
        &mut self,
        stream: u128,
        first_seq: u64,
        count: u64,
        refused: &[usize],
        writes: bool,
    ) -> (Vec<Op>, StreamBatch) {
        let last_seq = first_seq + count.max(1) - 1;
        let batch = StreamBatch {
            stream,
            first_seq,
            last_seq,
        };
        let Some(st) = self.streams.get_mut(&stream) else {
            return (Vec::new(), batch);
        };
        st.next_seq = last_seq + 1;
        let mut run: Option<(u64, u64)> = None;
        for &i in refused {
            let seq = first_seq + i as u64;
            run = match run {
                Some((a, b)) if b + 1 == seq => Some((a, seq)),
                Some((a, b)) => {
                    st.refuse(a, b);
                    Some((seq, seq))
                }
                None => Some((seq, seq)),
            };
        }
        if let Some((a, b)) = run {
            st.refuse(a, b);
        }
        if !writes {
            return (Vec::new(), batch);
        }
        st.submitted = last_seq;
        let old = st.slot;
        let now = now_ms();
        let slot = self.next_slot;
        self.next_slot += 1;
        if old != 0 {
            self.order.remove(&old);
        }
        let mut removed = self.evict(now, 1);
        if old != 0 && !removed.contains(&old) {
            removed.push(old);
        }
        let removal = |removed: Vec<u64>| Op::Remove {
            queue_id: self.queue_id,
            seqs: removed,
        };
        let Some(st) = self.streams.get_mut(&stream) else {
            // Not reached: eviction keeps open streams.
            return (vec![removal(removed)], batch);
        };
        st.slot = slot;
        st.time_ms = now;
        let mut header = postcard::to_allocvec(&OutcomeRecord {
            id: uuid::Uuid::from_u128(stream).into_bytes(),
            time_ms: now,
        })
        .expect("encoding into a Vec");
        let tail = StreamTail {
            through: last_seq,
            exact_from: st.exact_from,
            refused: st.refused.clone(),
        };
        header.extend(postcard::to_allocvec(&tail).expect("encoding into a Vec"));
        self.order
            .insert(slot, (uuid::Uuid::from_u128(stream), now));
        let mut ops = vec![Op::Put {
            queue_id: self.queue_id,
            seq: slot,
            header: Bytes::from(header),
            body: Bytes::new(),
        }];
        if !removed.is_empty() {
            ops.push(removal(removed));
        }
        (ops, batch)
    }

    /// The record of `batch` is on disk.
    pub(crate) fn stream_committed(&mut self, batch: StreamBatch) {
        if let Some(st) = self.streams.get_mut(&batch.stream) {
            st.through = st.through.max(batch.last_seq);
        }
    }

    /// The journal failed to write the record of `batch`.
    pub(crate) fn stream_failed(&mut self, batch: StreamBatch) {
        if let Some(st) = self.streams.get_mut(&batch.stream) {
            st.failed_from = Some(st.failed_from.unwrap_or(u64::MAX).min(batch.first_seq));
        }
    }

    /// The connection's send stream ended (its batches may still be committing).
    pub(crate) fn stream_closed(&mut self, stream: u128) {
        if let Some(st) = self.streams.get_mut(&stream) {
            st.open = false;
            // Nothing of it is in the journal: after the close it is answered like a
            // transaction this broker never saw.
            if st.slot == 0 && st.failed_from.is_none() {
                self.streams.remove(&stream);
            }
        }
    }

    /// What the send streams say about `id`, if it names a message of a known stream.
    fn stream_outcome(&self, id: uuid::Uuid) -> Option<Answer> {
        let (stream, seq) = txid::split(id.as_u128())?;
        let st = self.streams.get(&stream)?;
        if seq == 0 {
            return None;
        }
        let horizon = now_ms().saturating_sub(self.retention_ms);
        if !st.open && st.slot != 0 && st.time_ms < horizon {
            return None;
        }
        let answer = |outcome, time_ms, detail: String| {
            Some(Answer {
                outcome,
                time_ms,
                detail,
            })
        };
        if st.failed_from.is_some_and(|f| seq >= f) {
            return answer(
                v1::TxOutcome::Unknown,
                0,
                format!("transaction {id}: the broker's journal failed while storing it; after the broker restarts it can tell"),
            );
        }
        if seq < st.exact_from {
            return answer(
                v1::TxOutcome::Unknown,
                0,
                format!("transaction {id}: its send stream had more than {MAX_REFUSED_RANGES} runs of refused messages; the broker no longer knows which of the early ones were refused"),
            );
        }
        if st.is_refused(seq) {
            return answer(
                v1::TxOutcome::Aborted,
                0,
                format!("transaction {id} (a single-message send) was refused and not stored"),
            );
        }
        if seq <= st.through {
            return answer(
                v1::TxOutcome::Committed,
                st.time_ms,
                format!("transaction {id} (a single-message send) committed"),
            );
        }
        if seq <= st.submitted || st.open {
            return answer(
                v1::TxOutcome::InProgress,
                0,
                format!("transaction {id} (a single-message send) is on a send stream that is open or committing right now; ask again shortly"),
            );
        }
        answer(
            v1::TxOutcome::Aborted,
            0,
            format!("transaction {id} (a single-message send) did not commit: its send stream ended (or the broker stopped) before it was stored"),
        )
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
        if let Some(a) = self.stream_outcome(id) {
            return a;
        }
        if self.in_doubt.contains(&id) {
            return Answer {
                outcome: v1::TxOutcome::Unknown,
                time_ms: 0,
                detail: format!("transaction {id}: the broker's journal failed while storing its commit, which may or may not have reached the disk; after the broker restarts it can tell"),
            };
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

/// The Unix-ms timestamp of a UUID v7 or a send stream's message id, if `id` is one.
fn uuid_v7_ms(id: uuid::Uuid) -> Option<u64> {
    if id.get_version_num() != 7 && !txid::is_stream_id(id.as_u128()) {
        return None;
    }
    Some(txid::unix_ms(id.as_u128()))
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

    fn msg(stream: u128, seq: u64) -> uuid::Uuid {
        uuid::Uuid::from_u128(txid::message_id(stream, seq))
    }

    #[test]
    fn a_send_streams_messages_answer_from_one_entry_and_survive_recovery() {
        let mut o = outcomes(10);
        let s = txid::new_stream(now_ms(), 12345);
        o.stream_open(s).unwrap();
        assert!(o.stream_open(s).is_err(), "an id is used once");
        o.stream_check(s, 1, 4).unwrap();
        // Batch 1..4, message 3 refused; its record is written.
        let (ops, b1) = o.stream_batch(s, 1, 4, &[2], true);
        assert_eq!(ops.len(), 1);
        assert_eq!(o.outcome(msg(s, 1)).outcome, v1::TxOutcome::InProgress);
        assert_eq!(o.outcome(msg(s, 3)).outcome, v1::TxOutcome::Aborted);
        o.stream_committed(b1);
        assert_eq!(o.outcome(msg(s, 4)).outcome, v1::TxOutcome::Committed);
        assert!(o.stream_check(s, 4, 1).is_err(), "no overlap");
        assert!(o.stream_check(s, 6, 1).is_err(), "no gap");
        // Batch 5..6: its entry replaces the first.
        let (ops, b2) = o.stream_batch(s, 5, 2, &[], true);
        let first_slot = match &ops[1] {
            Op::Remove { seqs, .. } => seqs.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(first_slot.len(), 1);
        assert_eq!(o.order.len(), 1, "one entry per stream");
        assert_eq!(o.outcome(msg(s, 6)).outcome, v1::TxOutcome::InProgress);
        o.stream_committed(b2);
        // Message 7 was never sent: in progress while the stream is open, aborted after.
        assert_eq!(o.outcome(msg(s, 7)).outcome, v1::TxOutcome::InProgress);
        o.stream_closed(s);
        assert_eq!(o.outcome(msg(s, 7)).outcome, v1::TxOutcome::Aborted);
        assert_eq!(o.outcome(msg(s, 6)).outcome, v1::TxOutcome::Committed);
        // A retry of a committed message is refused; of a refused one allowed.
        assert!(o
            .begin(msg(s, 5))
            .unwrap_err()
            .to_string()
            .contains("already committed"));
        o.begin(msg(s, 3)).unwrap();
        // Recovery from the second record alone.
        let Op::Put { seq, header, .. } = &ops[0] else {
            panic!("a put first")
        };
        let rec = RecoveredMessage {
            seq: *seq,
            header: header.clone(),
            body_len: 0,
        };
        let (r, _) = Outcomes::recover(9, &[rec], seq + 1, Duration::from_secs(3600), 10).unwrap();
        assert_eq!(r.outcome(msg(s, 1)).outcome, v1::TxOutcome::Committed);
        assert_eq!(r.outcome(msg(s, 3)).outcome, v1::TxOutcome::Aborted);
        assert_eq!(r.outcome(msg(s, 6)).outcome, v1::TxOutcome::Committed);
        assert_eq!(r.outcome(msg(s, 7)).outcome, v1::TxOutcome::Aborted);
    }

    #[test]
    fn a_journal_failure_leaves_a_streams_messages_unknown() {
        let mut o = outcomes(10);
        let s = txid::new_stream(now_ms(), 7);
        o.stream_open(s).unwrap();
        let (_, b) = o.stream_batch(s, 1, 3, &[], true);
        o.stream_failed(b);
        o.stream_closed(s);
        assert_eq!(o.outcome(msg(s, 2)).outcome, v1::TxOutcome::Unknown);
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
