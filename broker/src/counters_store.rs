//! Totals that survive restarts: snapshots of the counters in the internal `SYSTEM$;COUNTERS`
//! queue, written off the hot path and put back at recovery.
//!
//! What is kept (everything else in `/metrics` still counts from the start of mqd):
//! - per queue (applications' queues, subqueues, journal, dead-letter and outgoing queues):
//!   sent, removed (received or forwarded), purged, dead-lettered, receive aborts, poisoned,
//!   and the abort count of each message that has one (MSMQ keeps it with the message), at
//!   most [`MAX_ABORT_COUNTS_PER_QUEUE`] messages per queue;
//! - per outgoing queue: forwarded and dead-lettered;
//! - broker-wide: dead letters by class, transactions committed and aborted by reason.
//!
//! DESIGN. Why snapshots rather than deriving the totals from durable records at recovery:
//! express messages are never journaled, and compaction drops the records of every message
//! that was received, so neither "sent" nor "received" can be recounted from the journal; a
//! new record kind would need segment format version 3. A snapshot is an ordinary `Put` into
//! `SYSTEM$;COUNTERS` (as `SYSTEM$;TXOUTCOMES` keeps transaction outcomes): one message per
//! queue whose totals ever changed at seq `queue id + 1` (a queue without one restarts from
//! zero, which is what it had), the broker-wide one at seq 1. A `Put` of the same seq
//! replaces the earlier one, so the journal holds one live record per queue whatever the
//! traffic, and a deleted queue's entry is removed by the next snapshot.
//!
//! Which: where a queue's totals, abort counts or deletion change (under the queue's lock,
//! which the change holds anyway), the queue sets its `unsaved` flag; the first change after
//! the saving task last read the queue also adds it to the broker's [`ChangedQueues`] (a
//! short lock, once per queue per tick at most). So the send and receive paths pay a test of
//! a flag per counted batch, and no atomic operation in the steady state; counts kept outside
//! the queue's lock (poisoned, an outgoing queue's forwarded and dead-lettered) set the flag
//! after they change. The task reads only the queues in that set (a lock each, clearing the
//! flag before reading, so a later change adds the queue again) and the 13 broker-wide
//! numbers: an idle tick costs next to nothing however many queues exist, a busy one is
//! proportional to the queues that changed. Measured with `perf/scripts/idle_cost.sh` (release
//! builds, 100,000 queues holding one recoverable message each, 2 cores shared with other
//! builds, load 3.6-5.7, 3 alternated pairs of 30 s idle): before, when every tick read every
//! queue, a tick took 111-191 ms (median of run medians 113 ms; longer than [`SAVE_TICK`], so
//! 145-233 ticks ran in 30 s instead of 300) and the idle mqd used 95 % of a core (67-97 %);
//! now a tick takes 6-8 µs and the idle mqd uses 39 % of a core (38-40 %), nearly all of it
//! in the expiry sweep (`deadletter.rs`), which still visits every queue every 100 ms.
//!
//! When: every [`SAVE_TICK`] the task writes the entries that changed, all in one record: at
//! once while the journal has other submissions in flight (the record joins a group commit
//! that happens anyway), otherwise at most once per [`IDLE_SAVE_INTERVAL`]. Counting
//! therefore never adds an `fdatasync` per message: at most one per second, and only while
//! totals change with nothing else being written.
//!
//! What a crash loses: after a clean shutdown the totals are exact (the last snapshot is
//! submitted before the journal closes). After `kill -9` (or a power loss) they restart from
//! the last durable snapshot, which trails by what happened in the last [`SAVE_TICK`] plus one
//! group commit under load, and by at most [`IDLE_SAVE_INTERVAL`] plus one commit otherwise.
//! The gauge `mq_counters_saved_timestamp_seconds` tells the time the totals on disk are as
//! of. A message's abort count is restored only if the message itself survived.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::broker::Broker;
use crate::journal::{Op, RecoveredMessage};
use crate::message::now_ms;
use crate::queue::{Queue, QueueRole, QueueTotals};

/// How often the changed totals are looked for and, if there are any, saved.
pub(crate) const SAVE_TICK: Duration = Duration::from_millis(100);
/// While nothing else is being written, changed totals are saved at most this often.
pub(crate) const IDLE_SAVE_INTERVAL: Duration = Duration::from_secs(1);
/// Messages per queue whose abort count is kept across restarts; the counts of further
/// aborted messages of the queue are kept in memory only.
pub(crate) const MAX_ABORT_COUNTS_PER_QUEUE: usize = 10_000;
/// Most entries written in one record (a snapshot after many queues changed is split).
const MAX_OPS_PER_RECORD: usize = 4096;
/// Seq of the broker-wide entry.
const BROKER_SLOT: u64 = 1;

/// The broker-wide totals (postcard; field order is the format).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct BrokerTotals {
    /// Dead letters by `DeadLetterClass` number, 0 to 7.
    pub dead_lettered: [u64; 8],
    pub tx_committed: u64,
    /// Transactions aborted by `metrics::AbortReason`.
    pub tx_aborted: [u64; 4],
    /// Dead letters of class 8 (`AccessDenied`); appended after 2026-12-07 (they were counted
    /// as class 7): a record written before has none ([`BrokerTotalsV1`]).
    pub access_denied: u64,
}

/// [`BrokerTotals`] as written before `access_denied` (read, never written).
#[derive(serde::Deserialize)]
struct BrokerTotalsV1 {
    dead_lettered: [u64; 8],
    tx_committed: u64,
    tx_aborted: [u64; 4],
}

/// The broker-wide entry, in either layout.
fn decode_broker(b: &[u8]) -> postcard::Result<BrokerTotals> {
    postcard::from_bytes(b).or_else(|e| {
        postcard::from_bytes::<BrokerTotalsV1>(b)
            .map(|v| BrokerTotals {
                dead_lettered: v.dead_lettered,
                tx_committed: v.tx_committed,
                tx_aborted: v.tx_aborted,
                access_denied: 0,
            })
            .map_err(|_| e)
    })
}

/// One queue's totals (postcard; field order is the format).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct QueueRecord {
    sent: u64,
    removed: u64,
    purged: u64,
    dead_lettered: u64,
    receive_aborts: u64,
    poisoned: u64,
    /// Outgoing queues: acknowledged by the destination, and dead-lettered.
    forwarded: u64,
    out_dead_lettered: u64,
    /// `(seq, abort count)` of its messages that have one.
    aborts: Vec<(u64, u32)>,
}

impl QueueRecord {
    /// The queue's totals now, or `None` if it is deleted. Marks the queue saved first (under
    /// its lock), then reads the counts kept outside the lock: a count that changes after
    /// this read marks the queue unsaved again (`Queue::note_unsaved`), so it is not lost.
    fn read(b: &Broker, q: &Arc<Queue>) -> Option<Self> {
        let (t, aborts) = q.totals_to_save()?;
        let (forwarded, out_dead_lettered) = match &q.def().role {
            QueueRole::Outgoing { destination, .. } => b
                .outgoing
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(destination)
                .filter(|o| Arc::ptr_eq(o.queue(), q))
                .map(|o| o.totals())
                .unwrap_or_default(),
            _ => (0, 0),
        };
        Some(QueueRecord {
            sent: t.sent,
            removed: t.removed,
            purged: t.purged,
            dead_lettered: t.dead_lettered,
            receive_aborts: t.receive_aborts,
            poisoned: q.poisoned.load(Ordering::Relaxed),
            forwarded,
            out_dead_lettered,
            aborts,
        })
    }

    fn totals(&self) -> QueueTotals {
        QueueTotals {
            sent: self.sent,
            removed: self.removed,
            purged: self.purged,
            dead_lettered: self.dead_lettered,
            receive_aborts: self.receive_aborts,
        }
    }
}

fn encode<T: serde::Serialize>(v: &T) -> Bytes {
    Bytes::from(postcard::to_allocvec(v).expect("encoding into a Vec cannot fail"))
}

/// The queues whose saved totals are out of date, each at most once: a queue adds itself at
/// the first change after the saving task last read it (`Queue::unsaved`, under the queue's
/// lock), so a tick reads only these.
#[derive(Debug, Default)]
pub(crate) struct ChangedQueues(std::sync::Mutex<Vec<(u64, Weak<Queue>)>>);

impl ChangedQueues {
    /// Adds queue `id` (called once until the saving task reads the queue again).
    pub(crate) fn add(&self, id: u64, q: Weak<Queue>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, q));
    }

    fn take(&self) -> Vec<(u64, Weak<Queue>)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A saved value left in [`Store::saved`] where what is on disk is not known (a write
/// failed): it differs from every encoded entry, so the entry is written, or removed, again.
const UNKNOWN: Bytes = Bytes::new();

/// One entry to write: its seq, its new value (`None`: remove it), and its queue.
struct Change {
    slot: u64,
    value: Option<Bytes>,
    queue: Option<Weak<Queue>>,
}

/// The saved totals: what is on disk (or on its way there) per seq of `SYSTEM$;COUNTERS`.
#[derive(Debug)]
pub(crate) struct Store {
    queue_id: u64,
    saved: HashMap<u64, Bytes>,
    /// Changed queues not read yet (by id): their next write is waiting for
    /// [`IDLE_SAVE_INTERVAL`]. Each is still marked unsaved, so it is not added again.
    pending: HashMap<u64, Weak<Queue>>,
    /// When a snapshot was last submitted.
    last_write: Instant,
}

/// What recovery read, to be put back once the queues exist ([`Recovered::apply`]).
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    broker: Option<BrokerTotals>,
    queues: BTreeMap<u64, QueueRecord>,
}

impl Store {
    /// A store writing to the (new or recovered) queue `queue_id`.
    pub(crate) fn new(queue_id: u64) -> Self {
        Store {
            queue_id,
            saved: HashMap::new(),
            pending: HashMap::new(),
            last_write: Instant::now(),
        }
    }

    /// Reads the recovered entries. An unreadable one is skipped with a warning: its totals
    /// start from what recovery counts.
    pub(crate) fn recover(queue_id: u64, records: &[RecoveredMessage]) -> (Store, Recovered) {
        let mut store = Store::new(queue_id);
        let mut rec = Recovered::default();
        for r in records {
            let ok = if r.seq == BROKER_SLOT {
                decode_broker(&r.header).map(|t| rec.broker = Some(t))
            } else {
                postcard::from_bytes(&r.header).map(|q| {
                    rec.queues.insert(r.seq - 1, q);
                })
            };
            match ok {
                Ok(()) => {
                    store.saved.insert(r.seq, r.header.clone());
                }
                Err(e) => {
                    tracing::warn!(seq = r.seq, error = %e, "saved counters unreadable; those totals restart from 0")
                }
            }
        }
        (store, rec)
    }

    /// Reads the pending queues (marking them saved) and the broker-wide totals `broker`;
    /// returns the entries whose saved value differs, and removals of the entries of queues
    /// that are gone.
    fn read_pending(&mut self, b: &Broker, broker: Bytes) -> Vec<Change> {
        let mut out = Vec::new();
        if self.saved.get(&BROKER_SLOT) != Some(&broker) {
            out.push(Change {
                slot: BROKER_SLOT,
                value: Some(broker),
                queue: None,
            });
        }
        for (id, weak) in std::mem::take(&mut self.pending) {
            let slot = id + 1;
            let value = weak
                .upgrade()
                .and_then(|q| QueueRecord::read(b, &q))
                .map(|r| encode(&r));
            let changed = match &value {
                Some(v) => self.saved.get(&slot) != Some(v),
                None => self.saved.contains_key(&slot),
            };
            if changed {
                out.push(Change {
                    slot,
                    value,
                    queue: Some(weak),
                });
            }
        }
        out.sort_by_key(|c| c.slot);
        out
    }

    /// Marks `changes` saved and returns them with their ops, in records of at most
    /// [`MAX_OPS_PER_RECORD`] entries.
    fn take(&mut self, mut changes: Vec<Change>) -> Vec<(Vec<Op>, Vec<Change>)> {
        self.last_write = Instant::now();
        let mut records = Vec::new();
        while !changes.is_empty() {
            let rest = changes.split_off(changes.len().min(MAX_OPS_PER_RECORD));
            let chunk = std::mem::replace(&mut changes, rest);
            let mut ops = Vec::with_capacity(chunk.len());
            let mut removed = Vec::new();
            for c in &chunk {
                match &c.value {
                    Some(v) => {
                        self.saved.insert(c.slot, v.clone());
                        ops.push(Op::Put {
                            queue_id: self.queue_id,
                            seq: c.slot,
                            header: v.clone(),
                            body: Bytes::new(),
                        });
                    }
                    None => {
                        self.saved.remove(&c.slot);
                        removed.push(c.slot);
                    }
                }
            }
            if !removed.is_empty() {
                ops.push(Op::Remove {
                    queue_id: self.queue_id,
                    seqs: removed,
                });
            }
            records.push((ops, chunk));
        }
        records
    }

    /// A record of `changes` was not written, or may not have been: they are written again.
    fn failed(&mut self, changes: Vec<Change>) {
        for c in changes {
            self.saved.insert(c.slot, UNKNOWN);
            if let Some(q) = c.queue {
                self.pending.insert(c.slot - 1, q);
            }
        }
    }
}

impl Recovered {
    /// Puts the saved totals back: into the queues (replacing what loading counted), the
    /// outgoing queues and the broker-wide counters.
    pub(crate) fn apply(
        self,
        queues: &HashMap<String, Arc<Queue>>,
        outgoing: &HashMap<String, Arc<crate::forward::Outgoing>>,
        counters: &crate::metrics::Counters,
    ) {
        if let Some(b) = &self.broker {
            counters.restore(b);
        }
        let by_id: HashMap<u64, &Arc<crate::forward::Outgoing>> =
            outgoing.values().map(|o| (o.queue().def().id, o)).collect();
        for q in queues.values() {
            let Some(r) = self.queues.get(&q.def().id) else {
                continue;
            };
            q.restore_totals(r.totals(), &r.aborts);
            q.poisoned.store(r.poisoned, Ordering::Relaxed);
            if let Some(o) = by_id.get(&q.def().id) {
                o.restore_totals(r.forwarded, r.out_dead_lettered);
            }
        }
    }
}

/// One tick of the saving task (see the module docs).
pub(crate) async fn tick(b: &Arc<Broker>) {
    let as_of = now_ms();
    let started = Instant::now();
    let records = {
        let mut store = b.counters_store();
        for (id, q) in b.changed_queues().take() {
            store.pending.insert(id, q);
        }
        let broker = encode(&b.counters().durable());
        if store.pending.is_empty() && store.saved.get(&BROKER_SLOT) == Some(&broker) {
            drop(store);
            tracing::trace!(
                micros = started.elapsed().as_micros() as u64,
                read = 0,
                changed = 0,
                "counters tick"
            );
            b.counters().saved_ms.fetch_max(as_of, Ordering::Relaxed);
            return;
        }
        let busy = b.journal().pending() > 0;
        if !busy && store.last_write.elapsed() < IDLE_SAVE_INTERVAL {
            return;
        }
        let read = store.pending.len();
        let changes = store.read_pending(b, broker);
        tracing::trace!(
            micros = started.elapsed().as_micros() as u64,
            read,
            changed = changes.len(),
            "counters tick"
        );
        if changes.is_empty() {
            drop(store);
            b.counters().saved_ms.fetch_max(as_of, Ordering::Relaxed);
            return;
        }
        store.take(changes)
    };
    let mut ok = true;
    for (ops, changes) in records {
        if let Err(e) = b.journal().submit(ops).await {
            tracing::debug!(error = %e, "cannot save the counters; retrying later");
            b.counters_store().failed(changes);
            ok = false;
        }
    }
    if ok {
        b.counters().saved_ms.fetch_max(as_of, Ordering::Relaxed);
    }
}

/// At shutdown, before the journal closes: submits the last snapshot (the journal writes and
/// syncs it before it stops).
pub(crate) fn save_on_close(b: &Broker) {
    let mut store = b.counters_store();
    for (id, q) in b.changed_queues().take() {
        store.pending.insert(id, q);
    }
    let changes = store.read_pending(b, encode(&b.counters().durable()));
    for (ops, _) in store.take(changes) {
        drop(b.journal().submit(ops));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use bytes::Bytes;
    use mq_proto::v1;

    use crate::broker::Broker;
    use crate::config::BrokerConfig;
    use crate::journal::{Journal, JournalOptions};
    use crate::queue::{Queue, QueueRole};

    fn open(dir: &std::path::Path) -> Arc<Broker> {
        let (b, _) = Broker::open(
            BrokerConfig::new(dir),
            vec!["127.0.0.1:4000".parse().unwrap()],
        )
        .unwrap();
        Arc::new(b)
    }

    async fn send(b: &Arc<Broker>, name: &str, n: usize) {
        let dests = b.destinations(name, false).unwrap();
        let msgs = (0..n)
            .map(|i| v1::OutMessage {
                body: Bytes::from(format!("m{i}")),
                ..Default::default()
            })
            .collect();
        b.send_batch(&dests, msgs, false).await;
    }

    fn queue(b: &Broker, name: &str) -> Arc<Queue> {
        b.all_queues()
            .into_iter()
            .find(|q| q.def().name == name)
            .unwrap()
    }

    /// The broker's entry as written before `access_denied` was appended still reads.
    #[test]
    fn broker_totals_of_the_earlier_layout_read() {
        #[derive(serde::Serialize)]
        struct Earlier {
            dead_lettered: [u64; 8],
            tx_committed: u64,
            tx_aborted: [u64; 4],
        }
        let old = postcard::to_allocvec(&Earlier {
            dead_lettered: [1, 2, 3, 4, 5, 6, 7, 8],
            tx_committed: 9,
            tx_aborted: [10, 11, 12, 13],
        })
        .unwrap();
        let t = super::decode_broker(&old).unwrap();
        assert_eq!(t.dead_lettered, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            (t.tx_committed, t.tx_aborted, t.access_denied),
            (9, [10, 11, 12, 13], 0)
        );
        let new = super::BrokerTotals {
            access_denied: 14,
            ..t
        };
        assert_eq!(super::decode_broker(&super::encode(&new)).unwrap(), new);
    }

    /// The totals come back after a clean close (the last snapshot is written then), and the
    /// entry of a deleted queue is removed from the journal.
    #[tokio::test]
    async fn totals_come_back_after_close_and_deleted_queues_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        for name in [r".\private$\a", r".\private$\b"] {
            b.create_queue(v1::CreateQueueRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        send(&b, r".\private$\a", 3).await;
        send(&b, r".\private$\b", 1).await;
        let a = queue(&b, r".\private$\a");
        a.count(2, 5);
        a.poisoned.store(1, Ordering::Relaxed);
        b.counters()
            .dead_lettered(v1::DeadLetterClass::ReceiveTimeout, 4);
        b.counters()
            .dead_lettered(v1::DeadLetterClass::AccessDenied, 3);
        b.counters().tx_committed();
        let want = a.stats_and_totals().1;
        assert_eq!(
            (want.sent, want.dead_lettered, want.receive_aborts),
            (3, 2, 5)
        );
        b.close();
        drop((a, b));

        let b = open(dir.path());
        let a = queue(&b, r".\private$\a");
        assert_eq!(a.stats_and_totals().1, want);
        assert_eq!(a.poisoned.load(Ordering::Relaxed), 1);
        let t = b.counters().durable();
        assert_eq!(
            t.dead_lettered[v1::DeadLetterClass::ReceiveTimeout as usize],
            4
        );
        assert_eq!(
            (t.access_denied, t.dead_lettered[7]),
            (3, 0),
            "access denied is a class of its own, not BadMessage"
        );
        assert_eq!(t.tx_committed, 1);
        assert_eq!(b.counters().tx_open(), 0);
        let b_id = queue(&b, r".\private$\b").def().id;
        assert!(b.counters_store().saved.contains_key(&(b_id + 1)));
        b.delete_queue(r".\private$\b").await.unwrap();
        b.close();
        drop((a, b));

        // Reopen the journal alone: the counters queue holds the broker's entry and a's, not b's.
        let (j, rec) =
            Journal::open(&dir.path().join("journal"), JournalOptions::default()).unwrap();
        let counters_id = rec
            .queues
            .iter()
            .find(|(id, def)| {
                crate::broker::QueueDefRecord::decode(*id, def)
                    .unwrap()
                    .role
                    == QueueRole::Counters
            })
            .map(|(id, _)| *id)
            .unwrap();
        let slots: Vec<u64> = rec.messages[&counters_id].iter().map(|m| m.seq).collect();
        assert!(slots.contains(&super::BROKER_SLOT));
        assert!(!slots.contains(&(b_id + 1)), "{slots:?}");
        j.shutdown();
    }

    /// A tick reads only the queues that changed since the last one, each once however often
    /// it changed; an idle tick reads none. A change after a tick read the queue is saved by
    /// the next one.
    #[tokio::test]
    async fn a_tick_reads_only_the_changed_queues() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        let names: Vec<String> = (0..20).map(|i| format!(r".\private$\q{i}")).collect();
        for name in &names {
            b.create_queue(v1::CreateQueueRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        // Creating queues changes no totals.
        assert!(b.changed_queues().take().is_empty());
        for _ in 0..5 {
            send(&b, &names[3], 1).await;
        }
        send(&b, &names[7], 2).await;
        let changed = |b: &Broker| {
            let mut ids: Vec<u64> = b
                .changed_queues()
                .0
                .lock()
                .unwrap()
                .iter()
                .map(|(id, _)| *id)
                .collect();
            ids.sort();
            ids
        };
        let (q3, q7) = (queue(&b, &names[3]), queue(&b, &names[7]));
        assert_eq!(changed(&b), vec![q3.def().id, q7.def().id]);
        // Not waiting for the idle interval: the journal is busy, or a second has passed.
        b.counters_store().last_write -= super::IDLE_SAVE_INTERVAL;
        super::tick(&b).await;
        assert!(changed(&b).is_empty());
        assert!(b.counters_store().pending.is_empty());
        let saved =
            |b: &Broker, q: &Queue| b.counters_store().saved.get(&(q.def().id + 1)).cloned();
        let want = |q: &Queue| {
            super::encode(&super::QueueRecord {
                sent: q.stats_and_totals().1.sent,
                ..Default::default()
            })
        };
        assert_eq!(saved(&b, &q3), Some(want(&q3)));
        assert_eq!(saved(&b, &q7), Some(want(&q7)));
        assert_eq!(
            saved(&b, &queue(&b, &names[0])),
            None,
            "unchanged: not written"
        );
        // Idle: nothing to read.
        super::tick(&b).await;
        assert!(b.counters_store().pending.is_empty());
        // A change after the read is saved by the next tick.
        send(&b, &names[3], 1).await;
        assert_eq!(changed(&b), vec![q3.def().id]);
        b.counters_store().last_write -= super::IDLE_SAVE_INTERVAL;
        super::tick(&b).await;
        assert_eq!(q3.stats_and_totals().1.sent, 6);
        assert_eq!(saved(&b, &q3), Some(want(&q3)));
        b.close();
    }
}
