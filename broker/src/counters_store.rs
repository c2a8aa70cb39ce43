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
//! counted queue at seq `queue id + 1`, the broker-wide one at seq 1. A `Put` of the same seq
//! replaces the earlier one, so the journal holds one live record per queue whatever the
//! traffic, and a deleted queue's entry is removed by the next snapshot.
//!
//! When: a background task reads the totals every [`SAVE_TICK`] (a lock per queue, as a
//! scrape of `/metrics` does; nothing is added to the send or receive path) and writes the
//! entries that changed, all in one record: at once while the journal has other submissions
//! in flight (the record joins a group commit that happens anyway), otherwise at most once
//! per [`IDLE_SAVE_INTERVAL`]. Counting therefore never adds an `fdatasync` per message: at
//! most one per second, and only while totals change with nothing else being written.
//!
//! What a crash loses: after a clean shutdown the totals are exact (the last snapshot is
//! submitted before the journal closes). After `kill -9` (or a power loss) they restart from
//! the last durable snapshot, which trails by what happened in the last [`SAVE_TICK`] plus one
//! group commit under load, and by at most [`IDLE_SAVE_INTERVAL`] plus one commit otherwise.
//! The gauge `mq_counters_saved_timestamp_seconds` tells the time the totals on disk are as
//! of. A message's abort count is restored only if the message itself survived.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::broker::Broker;
use crate::journal::{Op, RecoveredMessage};
use crate::message::now_ms;
use crate::queue::{Queue, QueueRole, QueueTotals};

/// How often the totals are read and, if they changed, saved.
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
    /// Dead letters by `DeadLetterClass` number.
    pub dead_lettered: [u64; 8],
    pub tx_committed: u64,
    /// Transactions aborted by `metrics::AbortReason`.
    pub tx_aborted: [u64; 4],
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
    fn read(q: &Queue, outgoing: Option<(u64, u64)>) -> Self {
        let (t, aborts) = q.totals_and_aborts();
        let (forwarded, out_dead_lettered) = outgoing.unwrap_or_default();
        QueueRecord {
            sent: t.sent,
            removed: t.removed,
            purged: t.purged,
            dead_lettered: t.dead_lettered,
            receive_aborts: t.receive_aborts,
            poisoned: q.poisoned.load(Ordering::Relaxed),
            forwarded,
            out_dead_lettered,
            aborts,
        }
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

/// The saved totals: what is on disk (or on its way there) per seq of `SYSTEM$;COUNTERS`.
#[derive(Debug)]
pub(crate) struct Store {
    queue_id: u64,
    saved: HashMap<u64, Bytes>,
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
                postcard::from_bytes(&r.header).map(|t| rec.broker = Some(t))
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

    /// The entries whose saved value differs from `now` (and removals of entries whose queue
    /// is gone), without marking them saved.
    fn changes(&self, now: &HashMap<u64, Bytes>) -> Vec<(u64, Option<Bytes>)> {
        let mut out: Vec<(u64, Option<Bytes>)> = now
            .iter()
            .filter(|(slot, v)| self.saved.get(slot) != Some(v))
            .map(|(slot, v)| (*slot, Some(v.clone())))
            .collect();
        out.extend(
            self.saved
                .keys()
                .filter(|slot| !now.contains_key(slot))
                .map(|slot| (*slot, None)),
        );
        out.sort_by_key(|(slot, _)| *slot);
        out
    }

    /// Marks `changes` saved and returns their ops, in records of at most
    /// [`MAX_OPS_PER_RECORD`] entries.
    fn take(&mut self, changes: Vec<(u64, Option<Bytes>)>) -> Vec<Vec<Op>> {
        self.last_write = Instant::now();
        let mut records = Vec::new();
        for chunk in changes.chunks(MAX_OPS_PER_RECORD) {
            let mut ops = Vec::with_capacity(chunk.len());
            let mut removed = Vec::new();
            for (slot, v) in chunk {
                match v {
                    Some(v) => {
                        self.saved.insert(*slot, v.clone());
                        ops.push(Op::Put {
                            queue_id: self.queue_id,
                            seq: *slot,
                            header: v.clone(),
                            body: Bytes::new(),
                        });
                    }
                    None => {
                        self.saved.remove(slot);
                        removed.push(*slot);
                    }
                }
            }
            if !removed.is_empty() {
                ops.push(Op::Remove {
                    queue_id: self.queue_id,
                    seqs: removed,
                });
            }
            records.push(ops);
        }
        records
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

/// Every counted entry now, encoded.
fn read_all(b: &Broker) -> HashMap<u64, Bytes> {
    let outgoing: HashMap<u64, (u64, u64)> = b
        .outgoing
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|o| (o.queue().def().id, o.totals()))
        .collect();
    let mut now: HashMap<u64, Bytes> = b
        .all_queues()
        .iter()
        .filter(|q| !q.is_deleted() && !matches!(q.def().role, QueueRole::Counters))
        .map(|q| {
            let id = q.def().id;
            let r = QueueRecord::read(q, outgoing.get(&id).copied());
            (id + 1, encode(&r))
        })
        .collect();
    now.insert(BROKER_SLOT, encode(&b.counters().durable()));
    now
}

/// One tick of the saving task (see the module docs).
pub(crate) async fn tick(b: &Arc<Broker>) {
    let as_of = now_ms();
    let started = Instant::now();
    let records = {
        let now = read_all(b);
        let mut store = b.counters_store();
        let changes = store.changes(&now);
        tracing::trace!(
            micros = started.elapsed().as_micros() as u64,
            entries = now.len(),
            changed = changes.len(),
            "counters tick"
        );
        if changes.is_empty() {
            drop(store);
            b.counters().saved_ms.fetch_max(as_of, Ordering::Relaxed);
            return;
        }
        let busy = b.journal().pending() > 0;
        if !busy && store.last_write.elapsed() < IDLE_SAVE_INTERVAL {
            return;
        }
        store.take(changes)
    };
    let mut ok = true;
    for ops in records {
        if let Err(e) = b.journal().submit(ops).await {
            tracing::debug!(error = %e, "cannot save the counters; retrying later");
            ok = false;
        }
    }
    if ok {
        b.counters().saved_ms.fetch_max(as_of, Ordering::Relaxed);
    } else {
        // Not knowing which entries are on disk, write all of them next time.
        b.counters_store().saved.clear();
    }
}

/// At shutdown, before the journal closes: submits the last snapshot (the journal writes and
/// syncs it before it stops).
pub(crate) fn save_on_close(b: &Broker) {
    let now = read_all(b);
    let mut store = b.counters_store();
    let changes = store.changes(&now);
    for ops in store.take(changes) {
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

    fn queue(b: &Broker, name: &str) -> Arc<Queue> {
        b.all_queues()
            .into_iter()
            .find(|q| q.def().name == name)
            .unwrap()
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
        let dests = b.destinations(r".\private$\a", false).unwrap();
        let msgs = (0..3)
            .map(|i| v1::OutMessage {
                body: Bytes::from(format!("m{i}")),
                ..Default::default()
            })
            .collect();
        b.send_batch(&dests, msgs, false).await;
        let a = queue(&b, r".\private$\a");
        a.count(2, 5);
        a.poisoned.store(1, Ordering::Relaxed);
        b.counters()
            .dead_lettered(v1::DeadLetterClass::ReceiveTimeout, 4);
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
        assert_eq!(t.tx_committed, 1);
        assert_eq!(b.counters().tx_open(), 0);
        let b_id = queue(&b, r".\private$\b").def().id;
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
}
