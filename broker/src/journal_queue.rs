//! Journal queues: `Q;JOURNAL` keeps a copy of every message received from `Q` (MSMQ target
//! journaling) and `SYSTEM$;JOURNAL` a copy of every message sent with the journal flag once it
//! reached its next hop (MSMQ source journaling).
//!
//! - Target journaling copies a message when a receive removes it for good: a streaming
//!   receiver's acknowledgement, a one-shot receive, a committed transactional receive, a
//!   cursor's receive-current, and receives from the queue's subqueues (as MSMQ 4.0). Never on
//!   purge, expiry, dead-lettering or a move between a queue and its subqueues (as MSMQ), and
//!   not for a transaction that aborts.
//! - Source journaling copies a message sent with the journal flag when it is stored in a
//!   local queue (in the send's or commit's record), or when the broker it is forwarded to
//!   acknowledged it. One copy per destination it reaches.
//! - A recoverable message's copy is in the same journal record as the message's removal (or
//!   its store), so after a crash it is in its queue or in the journal queue, never in neither.
//!   A received message's copy is a `Rekey` of its stored `Put` to the journal queue (no body
//!   read or written again; a `Put` of the copy in a journal of an older format until its next
//!   segment), a sent one's a `Put` of its own.
//!   Copies become receivable once that record is durable; express copies at once.
//! - Each queue journal has a quota (`--journal-quota`, default [`DEFAULT_JOURNAL_QUOTA_BYTES`]);
//!   `SYSTEM$;JOURNAL` has that default. Past it, past the broker's express or storage quota,
//!   or while the disk is full, the copy is not kept (as MSMQ: journaling stops until the
//!   journal is emptied), and `journal_not_kept` counts it.
//! - Journal queues can be received from, peeked, browsed and purged, never sent to or moved
//!   into; a queue journal has its queue's ACL and is deleted with it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use mq_proto::format_name::{QueueAddress, QueueKind};
use mq_proto::v1;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::journal::Op;
use crate::message::{Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue, QueueDef, QueueRole};

/// A queue journal's quota when none is given, and `SYSTEM$;JOURNAL`'s: 1 GiB.
pub const DEFAULT_JOURNAL_QUOTA_BYTES: u64 = 1 << 30;
const SYSTEM_JOURNAL_KEY: &str = "system$;journal";
const SYSTEM_JOURNAL_NAME: &str = r".\SYSTEM$;JOURNAL";

/// Target journaling of a queue, journaled with its definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JournalPolicy {
    /// Received messages are copied to `Q;JOURNAL`.
    pub enabled: bool,
    /// Most bytes `Q;JOURNAL` may hold (each copy counts as its message does).
    pub quota_bytes: u64,
}

impl Default for JournalPolicy {
    fn default() -> Self {
        JournalPolicy {
            enabled: false,
            quota_bytes: DEFAULT_JOURNAL_QUOTA_BYTES,
        }
    }
}

impl JournalPolicy {
    /// The policy a create request asks for.
    pub(crate) fn from_request(req: &v1::CreateQueueRequest) -> Result<Self, BrokerError> {
        Ok(JournalPolicy {
            enabled: req.journal,
            quota_bytes: req
                .journal_quota_bytes
                .unwrap_or(DEFAULT_JOURNAL_QUOTA_BYTES),
        })
    }
}

/// A queue's live journaling and poison settings (`SetQueueProperties` changes them after
/// creation), its journal queue once opened, and the copies it could not keep.
#[derive(Debug)]
pub(crate) struct Journaling {
    enabled: AtomicBool,
    quota: AtomicU64,
    max_aborts: AtomicU32,
    /// Copies not kept since the broker started: of this queue's received messages, or (for
    /// `SYSTEM$;JOURNAL`) of messages sent with the journal flag.
    pub(crate) not_kept: AtomicU64,
    /// An application queue's `Q;JOURNAL`, once opened.
    journal: OnceLock<Arc<Queue>>,
    /// A queue journal's queue (whose ACL applies to it).
    owner: OnceLock<Weak<Queue>>,
}

impl Journaling {
    pub(crate) fn new(def: &QueueDef) -> Self {
        Journaling {
            enabled: AtomicBool::new(def.journal.enabled),
            quota: AtomicU64::new(def.journal.quota_bytes),
            max_aborts: AtomicU32::new(def.poison.max_aborts),
            not_kept: AtomicU64::new(0),
            journal: OnceLock::new(),
            owner: OnceLock::new(),
        }
    }

    pub(crate) fn policy(&self) -> JournalPolicy {
        JournalPolicy {
            enabled: self.enabled.load(Ordering::Acquire),
            quota_bytes: self.quota.load(Ordering::Acquire),
        }
    }

    pub(crate) fn poison(&self) -> crate::subqueue::PoisonPolicy {
        crate::subqueue::PoisonPolicy {
            max_aborts: self.max_aborts.load(Ordering::Acquire),
        }
    }

    /// Applies a changed definition's settings (after it was journaled or submitted).
    pub(crate) fn set(&self, def: &QueueDef) {
        self.enabled.store(def.journal.enabled, Ordering::Release);
        self.quota.store(def.journal.quota_bytes, Ordering::Release);
        self.max_aborts
            .store(def.poison.max_aborts, Ordering::Release);
        if let Some(j) = self.journal.get() {
            j.set_quota(Some(def.journal.quota_bytes));
        }
    }

    /// A queue journal's queue.
    pub(crate) fn owner(&self) -> Option<Arc<Queue>> {
        self.owner.get().and_then(Weak::upgrade)
    }

    fn count_not_kept(&self) {
        self.not_kept.fetch_add(1, Ordering::Relaxed);
    }
}

/// Links every recovered queue journal to its queue (its ACL and live quota follow the
/// queue's); one whose queue is gone (they are deleted together) is left alone.
pub(crate) fn link_recovered(queues: &std::collections::HashMap<String, Arc<Queue>>) {
    for j in queues.values() {
        if j.def().role != QueueRole::Journal {
            continue;
        }
        let Some(main) = j.def().key.strip_suffix(";journal") else {
            continue;
        };
        if let Some(main) = queues.get(main).filter(|m| m.def().role.is_normal()) {
            let _ = j.journaling.owner.set(Arc::downgrade(main));
            j.set_quota(Some(main.journaling.policy().quota_bytes));
            let _ = main.journaling.journal.set(j.clone());
        }
    }
}

/// Copies of messages for journal queues, each with its position there and its charges taken,
/// waiting for the journal record that holds their ops (see [`Copies::take_ops`]): a `Put`,
/// or a `Rekey` that moves the received message's own `Put` to the journal queue.
#[derive(Debug, Default)]
pub(crate) struct Copies {
    ops: Vec<Op>,
    durable: Vec<(Arc<Queue>, Entry)>,
}

impl Copies {
    /// The ops of the recoverable copies, for the record that removes (or stores) their
    /// messages, where they must come before the messages' `Remove` (a `Rekey` moves only a
    /// message that is still there).
    pub(crate) fn take_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.ops)
    }

    /// Whether recoverable copies wait for a record.
    pub(crate) fn is_empty(&self) -> bool {
        self.durable.is_empty()
    }

    pub(crate) fn extend(&mut self, other: Copies) {
        self.ops.extend(other.ops);
        self.durable.extend(other.durable);
    }

    /// Their record is durable: the copies become receivable.
    pub(crate) fn stored(self, b: &Broker) {
        for (q, entries) in group_by_queue(self.durable) {
            b.insert_or_forget(&q, entries);
        }
    }

    /// Their record failed: positions and charges go back.
    pub(crate) fn failed(self, b: &Broker) {
        for (q, e) in self.durable {
            let charge = e.msg.charged_bytes();
            q.unadmit(e.seq, charge);
            b.release(Delivery::Recoverable, charge);
        }
    }
}

/// Where a journal copy's bytes come from.
enum CopyOf {
    /// An express message: kept in memory only.
    Express,
    /// A recoverable copy written as a `Put` of this body.
    Body(bytes::Bytes),
    /// A recoverable message removed from `(queue_id, seq)` in the same record: its `Put`
    /// moves to the journal queue by an [`Op::Rekey`] (no body read or written).
    Stored { queue_id: u64, seq: u64 },
}

impl Broker {
    /// `Q;JOURNAL` or `SYSTEM$;JOURNAL` (created, journaled, if it does not exist yet: every
    /// application queue has a journal, as in MSMQ).
    pub(crate) fn open_journal(
        &self,
        name: &str,
        addr: &QueueAddress,
    ) -> Result<Arc<Queue>, BrokerError> {
        if addr.kind == QueueKind::SystemJournal {
            return self.system_journal();
        }
        let main = self.local_queue(name, &addr.main_queue())?;
        self.journal_of(&main)
    }

    /// The journal queue of `main` (an application queue), created if missing.
    fn journal_of(&self, main: &Arc<Queue>) -> Result<Arc<Queue>, BrokerError> {
        if let Some(j) = main.journaling.journal.get() {
            return Ok(j.clone());
        }
        if !main.def().role.is_normal() {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" has no journal: only application queues do",
                main.def().name
            )));
        }
        let key = format!("{};journal", main.def().key);
        let quota = main.journaling.policy().quota_bytes;
        let (q, created) = self.queue_or_define(
            &key,
            |_| Ok(()),
            |id| {
                let mut def = QueueDef::new(
                    id,
                    format!("{};JOURNAL", main.def().name),
                    key.clone(),
                    main.def().transactional,
                    Some(quota),
                    String::new(),
                );
                def.role = QueueRole::Journal;
                def
            },
        )?;
        if q.def().role != QueueRole::Journal {
            return Err(BrokerError::QueueNotFound(q.def().name.clone()));
        }
        if created {
            tracing::info!(queue = %q.def().name, "queue journal created");
        }
        let _ = q.journaling.owner.set(Arc::downgrade(main));
        // The live quota is the main queue's policy (the journal's definition keeps the
        // quota it was created with).
        q.set_quota(Some(main.journaling.policy().quota_bytes));
        Ok(main.journaling.journal.get_or_init(|| q).clone())
    }

    /// `SYSTEM$;JOURNAL`, created if missing.
    pub(crate) fn system_journal(&self) -> Result<Arc<Queue>, BrokerError> {
        let (q, _) = self.queue_or_define(
            SYSTEM_JOURNAL_KEY,
            |_| Ok(()),
            |id| {
                let mut def = QueueDef::new(
                    id,
                    SYSTEM_JOURNAL_NAME.to_string(),
                    SYSTEM_JOURNAL_KEY.to_string(),
                    false,
                    Some(DEFAULT_JOURNAL_QUOTA_BYTES),
                    String::new(),
                );
                def.role = QueueRole::Journal;
                def
            },
        )?;
        Ok(q)
    }

    /// Copies of `entries`, being removed from `queue` for good by a receive (or, from an
    /// outgoing queue, because the next broker stored them), for the journal queue they go to:
    /// `Q;JOURNAL` if `queue` (or its main queue) journals, `SYSTEM$;JOURNAL` for forwarded
    /// messages sent with the journal flag. Express copies are inserted at once; recoverable
    /// ones wait for the caller's record (see [`Copies`]). What cannot be kept is counted.
    pub(crate) fn journal_copies(&self, queue: &Arc<Queue>, entries: &[Entry]) -> Copies {
        let mut copies = Copies::default();
        let (target, counter_of, all) = match queue.def().role {
            QueueRole::Normal | QueueRole::Subqueue => {
                let main = queue.parent().unwrap_or(queue);
                if !main.journaling.enabled.load(Ordering::Acquire) {
                    return copies;
                }
                (self.journal_of(main), main.clone(), true)
            }
            QueueRole::Outgoing { .. } => {
                if !entries.iter().any(|e| e.msg.journal) {
                    return copies;
                }
                let j = self.system_journal();
                let counter_of = match &j {
                    Ok(j) => j.clone(),
                    Err(_) => queue.clone(),
                };
                (j, counter_of, false)
            }
            _ => return copies,
        };
        let wanted = entries.iter().filter(|e| all || e.msg.journal);
        let target = match target {
            Ok(t) => t,
            Err(e) => {
                let n = wanted.count() as u64;
                counter_of
                    .journaling
                    .not_kept
                    .fetch_add(n, Ordering::Relaxed);
                tracing::warn!(queue = %queue.def().name, error = %e, copies = n, "cannot open the journal queue; copies not kept");
                return copies;
            }
        };
        let mut express = Vec::new();
        let rekey = self.journal().can_rekey();
        for e in wanted {
            let source = match e.msg.delivery {
                Delivery::Express => CopyOf::Express,
                // The message's Put (header and body) moves to the journal queue as it is.
                Delivery::Recoverable if rekey => CopyOf::Stored {
                    queue_id: queue.def().id,
                    seq: e.seq,
                },
                // A journal of an older format, until its next segment: a Put of the copy.
                Delivery::Recoverable => match self.body(queue, e) {
                    Ok(b) => CopyOf::Body(b),
                    Err(err) => {
                        tracing::warn!(id = %e.msg.id, error = %err, "cannot read a message for its journal copy; not kept");
                        counter_of.journaling.count_not_kept();
                        continue;
                    }
                },
            };
            if let Some(entry) = self.place_copy(&target, &e.msg, source, &mut copies) {
                express.push(entry);
            }
        }
        if !express.is_empty() {
            self.insert_or_forget(&target, express);
        }
        copies
    }

    /// Takes the charges and a position in `target` for a copy of `msg` (`source`: where a
    /// recoverable copy's bytes come from). Returns an express copy's entry; a recoverable one
    /// goes into `copies`. Counts a copy that cannot be kept on `target`'s owner.
    fn place_copy(
        &self,
        target: &Arc<Queue>,
        msg: &Arc<StoredMessage>,
        source: CopyOf,
        copies: &mut Copies,
    ) -> Option<Entry> {
        let not_kept = |why: &str| {
            let counter = target.journaling.owner();
            match &counter {
                Some(o) => o.journaling.count_not_kept(),
                None => target.journaling.count_not_kept(),
            }
            tracing::debug!(queue = %target.def().name, id = %msg.id, why, "journal copy not kept");
        };
        if msg.delivery == Delivery::Recoverable && self.journal().is_disk_full() {
            not_kept("the disk is full");
            return None;
        }
        let charge = msg.charged_bytes();
        if self.reserve(msg.delivery, charge).is_err() {
            not_kept("the broker's quota is full");
            return None;
        }
        let seq = match target.admit(std::slice::from_ref(msg)).map(|mut r| r.pop()) {
            Ok(Some(Ok(seq))) => seq,
            _ => {
                self.release(msg.delivery, charge);
                not_kept("the journal quota is full");
                return None;
            }
        };
        let op = match source {
            CopyOf::Express => return Some(Entry::new(seq, msg.clone())),
            CopyOf::Body(body) => Op::Put {
                queue_id: target.def().id,
                seq,
                header: msg.encode_header(),
                body,
            },
            CopyOf::Stored {
                queue_id,
                seq: from_seq,
            } => Op::Rekey {
                queue_id,
                seq: from_seq,
                to_queue_id: target.def().id,
                to_seq: seq,
            },
        };
        copies.ops.push(op);
        let bodyless = if msg.body.is_some() {
            Arc::new(msg.without_body())
        } else {
            msg.clone()
        };
        copies
            .durable
            .push((target.clone(), Entry::new(seq, bodyless)));
        None
    }

    /// Source journaling of `msg` (sent with the journal flag), stored in a local queue by the
    /// record being built: its copy for `SYSTEM$;JOURNAL` (express: kept at once; recoverable:
    /// its `Put` goes into `copies`, for that record).
    pub(crate) fn source_copy(&self, msg: &Arc<StoredMessage>, copies: &mut Copies) {
        let target = match self.system_journal() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(id = %msg.id, error = %e, "cannot open SYSTEM$;JOURNAL; copy not kept");
                return;
            }
        };
        let source = match msg.delivery {
            Delivery::Express => CopyOf::Express,
            // The message's own Put is in the same record: the copy is a Put of its own.
            Delivery::Recoverable => CopyOf::Body(msg.body.clone().unwrap_or_default()),
        };
        if let Some(entry) = self.place_copy(&target, msg, source, copies) {
            self.insert_or_forget(&target, vec![entry]);
        }
    }

    /// Removes received (or forwarded) entries for good, as [`Broker::forget`] does, and keeps
    /// their journal copies: the copies' `Put`s and the removal are one journal record
    /// (ordered behind the journal queue's definition, so not on the removal lane), and the
    /// copies become receivable once it is durable.
    pub(crate) fn forget_received(self: &Arc<Self>, queue: &Arc<Queue>, entries: &[Entry]) {
        let mut copies = self.journal_copies(queue, entries);
        if copies.is_empty() {
            self.forget(queue, entries);
            return;
        }
        let mut ops = copies.take_ops();
        ops.extend(self.release_entries(queue, entries));
        let commit = self.journal().submit(ops);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let broker = self.clone();
                rt.spawn(async move {
                    match commit.await {
                        Ok(()) => copies.stored(&broker),
                        Err(_) => copies.failed(&broker),
                    }
                });
            }
            // Not on a runtime (tests): the copies are shown before their record is durable.
            Err(_) => {
                drop(commit);
                copies.stored(self);
            }
        }
    }

    /// The copies each journaling queue that `shown` keeps could not keep, by queue name (for
    /// the metrics).
    pub(crate) fn journal_not_kept(&self, shown: impl Fn(&Queue) -> bool) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .all_queues()
            .into_iter()
            .filter(|q| {
                (q.def().role.is_normal()
                    || (q.def().role == QueueRole::Journal && q.def().key == SYSTEM_JOURNAL_KEY))
                    && shown(q)
            })
            .map(|q| {
                (
                    q.def().name.clone(),
                    q.journaling.not_kept.load(Ordering::Relaxed),
                )
            })
            .collect();
        v.sort();
        v
    }
}
