//! One queue: its definition, its messages in priority order, and the waiters for them.
//!
//! Invariants, all under the queue's one lock:
//! - `levels[p]` holds the ready messages of priority `p`, sorted by `seq` (FIFO within a
//!   priority); receivers take from the highest non-empty level.
//! - A message taken for delivery (`take`) leaves `levels` but still counts in `messages` and
//!   `bytes` until the receiver acknowledges it (`complete`) or gives it back (`restore`), which
//!   puts it back in its sequence position: "back at the head, in order".
//! - `seq` is the queue's own order; message ids never order anything.
//! - An entry taken from the middle of a level (by id, correlation id or cursor: `take_at`)
//!   stays there as a tombstone (`removed`, its message swapped for one shared empty message),
//!   skipped by everything that walks the levels, until it reaches the head or a compaction
//!   drops it; `restore` puts the entry back in its place.
//! - `index`, once built (on the first lookup by id or correlation id), holds exactly the ready
//!   entries that are not tombstones (see `index.rs`).
//! - Headers paged (a queue given a [`Paging`]: application queues, see `Broker`): each level
//!   keeps full entries only for a window at its head (`levels[p]`, about
//!   [`Paging::window`] entries); the ready messages after it are in `tails[p]`, as their seqs
//!   only (a recoverable message's header is in its journal `Put`, read back by
//!   [`HeaderSource`] when needed). Every seq in `levels[p]` is below every seq in
//!   `tails[p]`, so a level's order is its window, then its tail. A take that empties a
//!   window moves the next entries of the tail into it (reading their headers); peeks,
//!   cursors, lookups by id or correlation id and sweeps read tail headers where they need
//!   them without moving them. Entries that cannot be paged (express messages, ones with an
//!   abort count) but belong after the window stay in memory in the tail (`Tail::mem`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::error::BrokerError;
use crate::message::{now_ms, StoredMessage};

/// A message in a queue: its place in the queue's order and the shared message.
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: u64,
    pub msg: Arc<StoredMessage>,
    /// Times a transaction that received this message was aborted (kept across restarts by
    /// `counters_store.rs`, as of its last snapshot).
    pub aborts: u32,
    /// A tombstone: taken by [`Queue::take_at`], still in its level (fits in padding: the
    /// entry stays 24 bytes).
    removed: bool,
}

/// What a tombstone points at instead of the message it was (one empty message, shared):
/// nothing reads a tombstone's message, and the taken one's body and header go with it.
fn tombstone_message() -> Arc<StoredMessage> {
    static TOMBSTONE: std::sync::LazyLock<Arc<StoredMessage>> =
        std::sync::LazyLock::new(|| Arc::new(StoredMessage::empty()));
    TOMBSTONE.clone()
}

impl Entry {
    pub fn new(seq: u64, msg: Arc<StoredMessage>) -> Self {
        Entry {
            seq,
            msg,
            aborts: 0,
            removed: false,
        }
    }
}

/// Reads the headers of a queue's messages back from where they are stored (the journal).
pub trait HeaderSource: Send + Sync {
    /// The messages `(queue_id, seq)` for each of `seqs`, in that order, without bodies.
    /// Blocks on the disk.
    fn headers(&self, queue_id: u64, seqs: &[u64]) -> Result<Vec<StoredMessage>, BrokerError>;
}

/// How a queue pages its headers (see the module docs).
pub struct Paging {
    /// Entries each priority level keeps in memory at its head before it pages the rest (at
    /// most; `share` may say fewer).
    pub window: usize,
    /// The broker's header budget, shared out among its queues that page
    /// (`crate::header_windows`); `None`: `window` alone.
    pub share: Option<crate::header_windows::Share>,
    /// Where paged headers are read from.
    pub source: Arc<dyn HeaderSource>,
}

impl Paging {
    /// The window in force now.
    fn window_now(&self) -> usize {
        self.share
            .as_ref()
            .map_or(self.window, |s| s.windows().window().min(self.window))
    }
}

impl std::fmt::Debug for Paging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paging")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// A tail seq with this bit set is a tombstone: taken by [`Queue::take_by`], in flight.
const TAKEN: u64 = 1 << 63;
/// Headers read at once while walking a tail (peeks, lookups, sweeps).
const TAIL_READ: usize = 256;
/// Headers a refill reads at least (the window in force may be one: with many queues, a
/// one-at-a-time consumer would read the journal for every message).
const REFILL_AT_LEAST: usize = 16;

/// The ready messages of one priority level after its window (see the module docs).
#[derive(Debug)]
struct Tail {
    /// Their seqs, ascending; [`TAKEN`] marks a tombstone.
    seqs: VecDeque<u64>,
    /// The ones kept in memory (not pageable), by seq.
    mem: std::collections::BTreeMap<u64, Entry>,
    /// Tombstones in `seqs`.
    dead: usize,
    /// Quota charge of the paged ones (not in `mem`).
    paged_charged: u64,
    /// No entry of the tail has an earlier deadline (a lower bound; `u64::MAX` if none).
    deadline: u64,
    /// A sweep that stopped with a full batch goes on from this seq (0: from the start), so a
    /// backlog that expires is read once, not once per batch ([`Queue::sweep_some`]).
    sweep_from: u64,
    /// No entry before `sweep_from` has an earlier deadline (a lower bound).
    swept_deadline: u64,
}

impl Default for Tail {
    fn default() -> Self {
        Tail {
            seqs: VecDeque::new(),
            mem: std::collections::BTreeMap::new(),
            dead: 0,
            paged_charged: 0,
            deadline: u64::MAX,
            sweep_from: 0,
            swept_deadline: u64::MAX,
        }
    }
}

impl Tail {
    fn first_seq(&self) -> Option<u64> {
        self.seqs.front().map(|s| s & !TAKEN)
    }

    fn live(&self) -> usize {
        self.seqs.len() - self.dead
    }

    /// Where `seq` is (or would go), tombstones included.
    fn search(&self, seq: u64) -> Result<usize, usize> {
        self.seqs.binary_search_by(|s| (s & !TAKEN).cmp(&seq))
    }

    /// Puts a ready entry in its place (into its own tombstone if it has one); `paged`: keep
    /// only its seq.
    fn put(&mut self, e: Entry, paged: bool, deadline: Option<u64>) {
        match self.search(e.seq) {
            Ok(i) => {
                debug_assert!(self.seqs[i] & TAKEN != 0, "a seq twice in a tail");
                self.seqs[i] = e.seq;
                self.dead -= 1;
            }
            Err(i) if i == self.seqs.len() => self.seqs.push_back(e.seq),
            Err(i) => self.seqs.insert(i, e.seq),
        }
        if let Some(d) = deadline {
            self.deadline = self.deadline.min(d);
            // Behind where an unfinished sweep goes on: counted with what it has read.
            if e.seq < self.sweep_from {
                self.swept_deadline = self.swept_deadline.min(d);
            }
        }
        if paged {
            self.paged_charged += e.msg.charged_bytes();
        } else {
            self.mem.insert(e.seq, e);
        }
    }

    /// The entry `e` (read, or from `mem`) leaves the tail's accounting.
    fn forget(&mut self, e: &Entry) {
        if self.mem.remove(&e.seq).is_none() {
            self.paged_charged = self.paged_charged.saturating_sub(e.msg.charged_bytes());
        }
    }

    fn clear(&mut self) {
        *self = Tail::default();
    }
}

/// Puts `e` in its place by seq in a priority level: at either end without a search (new
/// arrivals go to the back, restored ones usually to the front), else over its own tombstone
/// (left by a take from the middle of the level) or inserted.
fn put_in_level(level: &mut VecDeque<Entry>, tombstones: &mut usize, e: Entry) {
    if level.back().is_none_or(|b| b.seq < e.seq) {
        return level.push_back(e);
    }
    if level.front().is_some_and(|f| f.seq > e.seq) {
        return level.push_front(e);
    }
    let pos = level.partition_point(|x| x.seq < e.seq);
    match level.get_mut(pos) {
        Some(t) if t.seq == e.seq && t.removed => {
            *t = e;
            *tombstones -= 1;
        }
        _ => level.insert(pos, e),
    }
}

/// A queue's fixed properties.
#[derive(Debug, Clone)]
pub struct QueueDef {
    /// The queue's id in the journal (never reused).
    pub id: u64,
    /// Path name as created, e.g. `.\private$\orders`.
    pub name: String,
    /// Canonical lowercase identity, e.g. `private$\orders`.
    pub key: String,
    pub transactional: bool,
    pub quota_bytes: Option<u64>,
    pub label: String,
    pub created_ms: u64,
    pub role: QueueRole,
    /// Who may do what with the queue, as stored with the definition (the live one is
    /// [`Queue::acl`]).
    pub acl: crate::auth::Acl,
    /// Poison-message handling of a transactional queue (see `subqueue.rs`).
    pub poison: crate::subqueue::PoisonPolicy,
    /// Target journaling (see `journal_queue.rs`).
    pub journal: crate::journal_queue::JournalPolicy,
}

/// See [`Queue::unadmit_on_drop`].
#[must_use = "dropped at once, it gives the position back at once"]
pub(crate) struct Unadmitted<'a> {
    queue: &'a Queue,
    seq: u64,
    charge: u64,
    armed: bool,
}

impl Unadmitted<'_> {
    /// The position is inserted (or given back) by the caller.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Unadmitted<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.unadmit(self.seq, self.charge);
        }
    }
}

/// What a queue is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueRole {
    /// A queue applications created.
    Normal,
    /// `SYSTEM$;DEADLETTER`: non-transactional messages that could not be delivered.
    DeadLetter,
    /// `SYSTEM$;DEADXACT`: transactional messages that could not be delivered.
    DeadXact,
    /// Messages waiting to be forwarded to the broker at `destination` (`host:port`). Strict
    /// FIFO (one lane): its `seq` is the forwarding stream's sequence.
    Outgoing {
        destination: String,
        stream_id: uuid::Uuid,
        paused: bool,
    },
    /// Internal: the receive side's forwarding-stream high-water marks.
    Streams,
    /// Internal: the ids of committed transactions (see `outcome.rs`).
    TxOutcomes,
    /// Internal: the totals saved across restarts (see `counters_store.rs`).
    Counters,
    /// `Q;name`: a subqueue of a queue (see `subqueue.rs`); its key is the main queue's key,
    /// `;` and the subqueue's name.
    Subqueue,
    /// `Q;JOURNAL` (key: the main queue's key and `;journal`) or `SYSTEM$;JOURNAL`: copies
    /// kept by target or source journaling (see `journal_queue.rs`).
    Journal,
}

impl QueueRole {
    /// Queues `mq queue list` shows and applications may delete.
    pub fn is_normal(&self) -> bool {
        matches!(self, QueueRole::Normal)
    }
}

/// Counters of a queue at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Stored and not removed, including delivered but unacknowledged.
    pub messages: u64,
    /// Body bytes of those messages.
    pub bytes: u64,
    /// Delivered to a streaming receiver, not yet acknowledged.
    pub in_flight: u64,
}

/// An emptied priority level keeping room for more entries than this gives it back.
const SHRINK_EMPTY_LEVEL_ABOVE: usize = 4096;

/// What went through a queue since the broker started (the metrics' counters). Kept under the
/// queue's lock with the other counters, so counting adds no lock or allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueTotals {
    /// Messages put in (sent, forwarded in, dead-lettered into it).
    pub sent: u64,
    /// Messages removed for good by an acknowledgement (received; for an outgoing queue
    /// forwarded), or moved out to a dead-letter queue (`dead_lettered`).
    pub removed: u64,
    /// Messages removed by purges.
    pub purged: u64,
    /// Messages moved from it to a dead-letter queue.
    pub dead_lettered: u64,
    /// Receives of its messages undone by an aborted transaction.
    pub receive_aborts: u64,
}

impl QueueTotals {
    /// Messages received (for an outgoing queue: forwarded).
    pub fn received(&self) -> u64 {
        self.removed.saturating_sub(self.dead_lettered)
    }
}

#[derive(Debug, Default)]
struct State {
    levels: [VecDeque<Entry>; 8],
    /// Each level's paged tail (empty unless the queue pages, see the module docs).
    tails: [Tail; 8],
    ready: usize,
    stats: QueueStats,
    totals: QueueTotals,
    /// Bytes charged against the queue quota (body + label + overhead).
    charged: u64,
    next_seq: u64,
    deleted: bool,
    /// Ready entries that have a deadline (so sweeps can skip queues without any).
    timed: usize,
    /// No ready entry's deadline is earlier than this (a lower bound; `u64::MAX` if none), so
    /// sweeps skip a long queue until something can have expired.
    next_deadline: u64,
    /// Expired entries found by `take` (counted in flight) waiting for the broker's sweep to
    /// move them to a dead-letter queue.
    expired: Vec<Entry>,
    /// Outgoing queues only: admitted positions not yet inserted (their journal write is in
    /// progress). Nothing at or after the lowest of them is handed out, so the forwarding
    /// stream sends in `seq` order even when concurrent sends finish out of order.
    pending: std::collections::BTreeSet<u64>,
    /// The queue quota and label now (`SetQueueProperties` changes them; `def` keeps the
    /// values the queue was created or recovered with).
    quota: Option<u64>,
    label: String,
    /// Tombstones in `levels` (see [`Entry::removed`]).
    tombstones: usize,
    /// Ready entries by id and by correlation id, built on first use.
    index: crate::index::MessageIndex,
    /// Abort counts of the messages that have one, by seq (for `counters_store.rs`): set when
    /// an aborted receive gives a message back, dropped when it leaves the queue. Empty in a
    /// queue without aborts, so the hot paths only test `is_empty`.
    aborted: std::collections::BTreeMap<u64, u32>,
    /// The totals, abort counts or deletion changed since `counters_store.rs` last read them:
    /// while set, the queue is in the broker's set of changed queues and is not added again.
    unsaved: bool,
}

/// A queue. Shared by the broker's registry and every stream that uses it.
#[derive(Debug)]
pub struct Queue {
    def: QueueDef,
    state: Mutex<State>,
    notify: Notify,
    acl: std::sync::RwLock<Arc<crate::auth::Acl>>,
    /// A subqueue's main queue: its ACL and quota are the main queue's.
    parent: std::sync::OnceLock<Arc<Queue>>,
    /// Messages moved to this queue's poison subqueue since the broker started.
    pub(crate) poisoned: std::sync::atomic::AtomicU64,
    /// Live journaling and poison settings, and the journal queue (see `journal_queue.rs`).
    pub(crate) journaling: crate::journal_queue::Journaling,
    /// No sweep finds anything before this Unix ms (`Broker::sweep_expired` reads it without
    /// the lock, so an idle broker with many queues does not lock each of them every sweep).
    /// A lower bound: lowered under the lock wherever a deadline or an expired entry is added,
    /// made exact (under the lock) by every look at the queue's state that finds nothing due.
    sweep_at: std::sync::atomic::AtomicU64,
    /// Where the queue reports that its saved totals are out of date, and the queue itself
    /// (for the report); `None` for queues whose totals are not kept.
    changes: Option<(
        std::sync::Weak<Queue>,
        Arc<crate::counters_store::ChangedQueues>,
    )>,
    /// The broker-wide lower bound of every registered queue's `sweep_at` (lowered with it);
    /// `None` for queues the sweep never walks.
    broker_sweep: Option<Arc<SweepHint>>,
    /// Set (before any message is inserted) for a queue that pages its headers.
    paging: std::sync::OnceLock<Paging>,
}

/// The earliest Unix ms at which any queue of a broker may have something to sweep (a lower
/// bound), so that an idle broker with many queues does not walk all of them every sweep.
/// Every queue lowers it when it lowers its own `sweep_at`; `Broker::sweep_expired` raises it
/// only by [`SweepHint::start_walk`] before a walk that folds every queue's bound back in.
/// All its operations and those of `Queue::sweep_at` are `SeqCst`: a queue's lowering during
/// a walk either is seen by the walk or lands after the walk's reset.
#[derive(Debug)]
pub(crate) struct SweepHint(std::sync::atomic::AtomicU64);

impl Default for SweepHint {
    fn default() -> Self {
        SweepHint(std::sync::atomic::AtomicU64::new(u64::MAX))
    }
}

impl SweepHint {
    pub(crate) fn lower(&self, at: u64) {
        self.0.fetch_min(at, Ordering::SeqCst);
    }

    /// Whether a walk at `now` might find anything.
    pub(crate) fn due(&self, now: u64) -> bool {
        now >= self.0.load(Ordering::SeqCst)
    }

    /// Before a walk over every queue: forget the bound (the walk and the queues lower it
    /// again).
    pub(crate) fn start_walk(&self) {
        self.0.store(u64::MAX, Ordering::SeqCst);
    }
}

impl Queue {
    /// A new, empty queue.
    pub fn new(def: QueueDef) -> Self {
        Self::with_changes(def, None)
    }

    /// A new, empty queue whose totals are kept across restarts: every change of them adds it
    /// to `changes` (once until `counters_store.rs` reads them again).
    /// Its deadlines lower `sweep` (the broker's registered queues: the ones the sweep walks).
    pub(crate) fn new_counted(
        def: QueueDef,
        changes: &Arc<crate::counters_store::ChangedQueues>,
        sweep: &Arc<SweepHint>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| {
            let mut q = Self::with_changes(def, Some((me.clone(), changes.clone())));
            q.broker_sweep = Some(sweep.clone());
            q
        })
    }

    fn with_changes(
        def: QueueDef,
        changes: Option<(
            std::sync::Weak<Queue>,
            Arc<crate::counters_store::ChangedQueues>,
        )>,
    ) -> Self {
        Queue {
            acl: std::sync::RwLock::new(Arc::new(def.acl.clone())),
            state: Mutex::new(State {
                next_seq: 1,
                next_deadline: u64::MAX,
                quota: def.quota_bytes,
                label: def.label.clone(),
                ..State::default()
            }),
            notify: Notify::new(),
            sweep_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            parent: std::sync::OnceLock::new(),
            poisoned: std::sync::atomic::AtomicU64::new(0),
            journaling: crate::journal_queue::Journaling::new(&def),
            changes,
            broker_sweep: None,
            paging: std::sync::OnceLock::new(),
            def,
        }
    }

    /// Notes, under the queue's lock, that what `counters_store.rs` saves of it changed. The
    /// hot paths pay a test of a flag they hold the lock for; only the first change after the
    /// saving task read the queue adds it to the broker's set (a short lock).
    fn unsaved(&self, st: &mut State) {
        if st.unsaved {
            return;
        }
        st.unsaved = true;
        if let Some((me, changes)) = &self.changes {
            changes.add(self.def.id, me.clone());
        }
    }

    /// [`Queue::unsaved`] for counts kept outside the lock (poisoned, an outgoing queue's
    /// totals): called after the count changed, so the saving task reads the new value.
    pub(crate) fn note_unsaved(&self) {
        let mut st = self.lock();
        self.unsaved(&mut st);
    }

    /// One more message moved to the poison subqueue.
    pub(crate) fn count_poisoned(&self) {
        self.poisoned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.note_unsaved();
    }

    pub fn def(&self) -> &QueueDef {
        &self.def
    }

    /// Who may do what with the queue now.
    pub fn acl(&self) -> Arc<crate::auth::Acl> {
        if let Some(owner) = self.rights_owner() {
            return owner.acl();
        }
        self.acl.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The queue whose ACL this one has: a subqueue's main queue, a queue journal's queue.
    pub(crate) fn rights_owner(&self) -> Option<Arc<Queue>> {
        self.parent
            .get()
            .cloned()
            .or_else(|| self.journaling.owner())
    }

    /// The live ACL, locked for a change (the caller journals it before releasing).
    pub(crate) fn acl_lock(&self) -> std::sync::RwLockWriteGuard<'_, Arc<crate::auth::Acl>> {
        self.acl.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The priority level an entry is kept at: its priority, or 0 in a FIFO outgoing queue.
    fn lane(&self, e: &Entry) -> usize {
        match self.def.role {
            QueueRole::Outgoing { .. } => 0,
            _ => e.msg.priority as usize,
        }
    }

    /// The deadline (Unix ms) this queue enforces for the entry, if any: time-to-reach-queue
    /// (capped by time-to-be-received) in an outgoing queue, time-to-be-received elsewhere.
    fn deadline_ms(&self, e: &Entry) -> Option<u64> {
        let m = &e.msg;
        let d = match self.def.role {
            QueueRole::Outgoing { .. } if m.reach_queue_by_ms != 0 => m.reach_queue_by_ms,
            // Dead letters and journal copies keep their timers as properties; nothing
            // expires out of a dead-letter or journal queue.
            QueueRole::DeadLetter | QueueRole::DeadXact | QueueRole::Journal => 0,
            _ => m.receive_by_ms,
        };
        (d != 0).then_some(d)
    }

    /// Whether the entry has a deadline this queue enforces, and whether it has passed at `now`.
    fn deadline(&self, e: &Entry, now: u64) -> (bool, bool) {
        match self.deadline_ms(e) {
            Some(d) => (true, now >= d),
            None => (false, false),
        }
    }

    /// Ready messages whose headers are not in memory (paged out to the journal).
    #[cfg(test)]
    pub(crate) fn paged_out(&self) -> usize {
        self.lock()
            .tails
            .iter()
            .map(|t| t.seqs.len() - t.mem.len())
            .sum()
    }

    /// Makes the queue page its headers (see the module docs). Call before anything is
    /// inserted; a second call changes nothing.
    pub fn set_paging(&self, paging: Paging) {
        if paging.window > 0 {
            let _ = self.paging.set(paging);
        }
    }

    /// Whether the entry's header can be read back from the journal (so need not stay here):
    /// a recoverable message is in a queue only once its `Put` is durable. A body it carries
    /// (read with its header) is read again when needed.
    fn pageable(e: &Entry) -> bool {
        e.aborts == 0 && e.msg.delivery == crate::message::Delivery::Recoverable
    }

    /// Puts a ready entry of `lane` in its place: its window, or (a queue that pages) its tail
    /// when it belongs after the window and the window is full.
    fn place(&self, st: &mut State, lane: usize, e: Entry, deadline: Option<u64>) {
        if let Some(p) = self.paging.get() {
            let level = &st.levels[lane];
            let tail = &mut st.tails[lane];
            let into_tail = match tail.first_seq() {
                Some(f) => e.seq >= f,
                None => {
                    level.len() >= p.window_now()
                        && level.back().is_some_and(|b| b.seq < e.seq)
                        && Self::pageable(&e)
                }
            };
            if into_tail {
                let paged = Self::pageable(&e);
                tail.put(e, paged, deadline);
                return;
            }
        }
        put_in_level(&mut st.levels[lane], &mut st.tombstones, e);
    }

    /// Up to `max` live entries of `lane`'s tail from index `from` on, with their indexes
    /// (headers read from the journal, or from `mem`), and the index after the last one looked
    /// at.
    fn read_tail(
        &self,
        st: &State,
        lane: usize,
        from: usize,
        max: usize,
    ) -> Result<(Vec<(usize, Entry)>, usize), BrokerError> {
        let tail = &st.tails[lane];
        let mut picked: Vec<(usize, u64)> = Vec::new();
        let mut i = from;
        while i < tail.seqs.len() && picked.len() < max {
            let s = tail.seqs[i];
            if s & TAKEN == 0 {
                picked.push((i, s));
            }
            i += 1;
        }
        let paged: Vec<u64> = picked
            .iter()
            .map(|&(_, s)| s)
            .filter(|s| !tail.mem.contains_key(s))
            .collect();
        let mut read = if paged.is_empty() {
            Vec::new()
        } else {
            let p = self.paging.get().ok_or_else(|| {
                BrokerError::Internal("a queue without paging has a paged tail".into())
            })?;
            p.source.headers(self.def.id, &paged)?
        }
        .into_iter();
        let mut out = Vec::with_capacity(picked.len());
        for (idx, seq) in picked {
            let e = match tail.mem.get(&seq) {
                Some(e) => e.clone(),
                None => {
                    let msg = read.next().ok_or_else(|| {
                        BrokerError::Internal("the journal returned too few headers".into())
                    })?;
                    let mut e = Entry::new(seq, Arc::new(msg));
                    e.aborts = st.aborted.get(&seq).copied().unwrap_or(0);
                    e
                }
            };
            out.push((idx, e));
        }
        Ok((out, i))
    }

    /// Moves up to `want` (at least a window's half) entries from the head of `lane`'s tail to
    /// the back of its window, reading their headers. Tombstones at the tail's head go (their
    /// entries, if given back, return to the window).
    fn refill(&self, st: &mut State, lane: usize, want: usize) -> Result<(), BrokerError> {
        // As many as the take wants (one read), at most the configured window; half the window
        // in force at least, so that a level does not read its tail a message at a time.
        let (window, most) = self
            .paging
            .get()
            .map_or((1, 1), |p| (p.window_now(), p.window));
        let n = want
            .max(window / 2)
            .max(REFILL_AT_LEAST)
            .clamp(1, most.max(1));
        let (got, upto) = self.read_tail(st, lane, 0, n)?;
        let tail = &mut st.tails[lane];
        let dropped = tail.seqs.drain(..upto).filter(|s| s & TAKEN != 0).count();
        tail.dead -= dropped;
        for (_, e) in got {
            tail.forget(&e);
            st.levels[lane].push_back(e);
        }
        if tail.seqs.is_empty() {
            tail.clear();
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent counters (no multi-step updates
        // span a panic point), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends messages in order (admit, then insert). Each either goes in or fails alone (over
    /// the queue quota); the result has one entry per message. Wakes receivers. (The broker
    /// admits and inserts separately; this is the two together, for tests.)
    #[cfg(test)]
    pub fn push(
        &self,
        msgs: &[Arc<StoredMessage>],
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        let admitted = self.admit(msgs)?;
        let mut entries = Vec::with_capacity(msgs.len());
        let out = admitted
            .into_iter()
            .zip(msgs)
            .map(|(r, m)| {
                r.map(|seq| {
                    entries.push(Entry::new(seq, m.clone()));
                })
            })
            .collect();
        assert!(self.insert(entries).is_empty());
        Ok(out)
    }

    /// First half of a send: checks the queue quota, charges it, and assigns each message its
    /// place (`seq`) in the queue's order. The messages become receivable with
    /// [`Queue::insert`]; if they never do (their journal write failed), give the charge back
    /// with [`Queue::unadmit`].
    pub fn admit(
        &self,
        msgs: &[Arc<StoredMessage>],
    ) -> Result<Vec<Result<u64, BrokerError>>, BrokerError> {
        let mut st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let mut out = Vec::with_capacity(msgs.len());
        for m in msgs {
            let charge = m.charged_bytes();
            if let Some(q) = st.quota {
                if st.charged + charge > q {
                    out.push(Err(BrokerError::QuotaExceeded(format!(
                        "queue \"{}\" is over its quota: {} of {} bytes used, this message needs {}; receive or purge messages, or raise the quota",
                        self.def.name, st.charged, q, charge
                    ))));
                    continue;
                }
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            st.charged += charge;
            if self.keeps_strict_order() {
                st.pending.insert(seq);
            }
            out.push(Ok(seq));
        }
        Ok(out)
    }

    /// Charges a message that will be admitted later (a send staged in a transaction) against
    /// the queue quota now, so staged sends cannot overcommit it; [`Queue::admit_reserved`]
    /// gives it its place at commit, [`Queue::release_quota`] gives the charge back.
    pub fn reserve_quota(&self, charge: u64) -> Result<(), BrokerError> {
        let mut st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        if let Some(q) = st.quota {
            if st.charged + charge > q {
                return Err(BrokerError::QuotaExceeded(format!(
                    "queue \"{}\" is over its quota: {} of {} bytes used or staged by open transactions, this message needs {}; receive or purge messages, or raise the quota",
                    self.def.name, st.charged, q, charge
                )));
            }
        }
        st.charged += charge;
        Ok(())
    }

    /// Gives back a charge taken by [`Queue::reserve_quota`].
    pub fn release_quota(&self, charge: u64) {
        let mut st = self.lock();
        st.charged = st.charged.saturating_sub(charge);
    }

    /// [`Queue::admit`] for one message whose quota charge was reserved already.
    pub fn admit_reserved(&self) -> Result<u64, BrokerError> {
        let mut st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        if self.keeps_strict_order() {
            st.pending.insert(seq);
        }
        Ok(seq)
    }

    /// Gives back the position and quota charge of an admitted message that will never be
    /// inserted.
    pub fn unadmit(&self, seq: u64, charged: u64) {
        let mut st = self.lock();
        st.charged = st.charged.saturating_sub(charged);
        if st.pending.remove(&seq) {
            drop(st);
            self.notify.notify_waiters();
        }
    }

    /// Gives back `seq` (admitted, charged `charge`) when the returned guard is dropped before
    /// [`Unadmitted::disarm`]: a task cancelled between admitting a message and inserting it
    /// (a client gone while its move's journal record was written) would otherwise leave a
    /// queue that keeps strict order handing out nothing past it, for good.
    pub(crate) fn unadmit_on_drop(&self, seq: u64, charge: u64) -> Unadmitted<'_> {
        Unadmitted {
            queue: self,
            seq,
            charge,
            armed: true,
        }
    }

    fn is_outgoing(&self) -> bool {
        matches!(self.def.role, QueueRole::Outgoing { .. })
    }

    /// Outgoing queues (the stream sequence), transactional queues (commit order) and
    /// applications' queues hand out nothing past a position that is admitted but not yet
    /// inserted: sends and commits whose journal writes finish out of order still become
    /// visible in queue order. Applications' queues did not: an express message sent after a
    /// recoverable one, in the same batch, was received first (it is inserted at once, the
    /// recoverable one after its sync), and a cursor waiting at the end skipped recoverable
    /// messages of concurrent senders whose syncs ended out of order (helper-70).
    fn keeps_strict_order(&self) -> bool {
        self.is_outgoing() || self.def.transactional || self.def.role == QueueRole::Normal
    }

    /// Second half of a send: makes admitted messages receivable, each in its `seq` position.
    /// If the queue was deleted since they were admitted, returns them: their quota (and, for
    /// recoverable ones, their journal record) is the caller's to give back.
    #[must_use = "entries of a deleted queue come back and must be forgotten"]
    pub fn insert(&self, entries: Vec<Entry>) -> Vec<Entry> {
        if entries.is_empty() {
            return entries;
        }
        let mut st = self.lock();
        if st.deleted {
            return entries;
        }
        for e in entries {
            if !st.pending.is_empty() {
                st.pending.remove(&e.seq);
            }
            st.stats.messages += 1;
            st.stats.bytes += e.msg.body_len as u64;
            st.totals.sent += 1;
            self.unsaved(&mut st);
            st.ready += 1;
            let deadline = self.deadline_ms(&e);
            if let Some(d) = deadline {
                st.timed += 1;
                st.next_deadline = st.next_deadline.min(d);
                self.lower_sweep_at(d);
            }
            let lane = self.lane(&e);
            st.index.add(lane as u8, &e);
            self.place(&mut st, lane, e, deadline);
        }
        drop(st);
        self.notify.notify_waiters();
        Vec::new()
    }

    /// Loads messages found by recovery (sorted by seq) and sets the next seq.
    pub fn load(&self, entries: Vec<Entry>, next_seq: u64) {
        {
            let mut st = self.lock();
            st.next_seq = st.next_seq.max(next_seq);
            st.charged += entries.iter().map(|e| e.msg.charged_bytes()).sum::<u64>();
        }
        let gone = self.insert(entries);
        debug_assert!(gone.is_empty(), "recovery loads into a live queue");
    }

    /// Takes up to `max` ready messages, highest priority first, for delivery. They stay counted
    /// until [`Queue::complete`] or [`Queue::restore`].
    ///
    /// Messages whose deadline has passed are never handed out: they are set aside (still
    /// counted in flight) for [`Queue::sweep`].
    pub fn take(&self, max: usize) -> Result<Vec<Entry>, BrokerError> {
        self.take_bounded(max, usize::MAX)
    }

    /// [`Queue::take`], stopping once the bodies taken reach `max_bytes` (at least one message
    /// is taken if any is ready).
    pub fn take_bounded(&self, max: usize, max_bytes: usize) -> Result<Vec<Entry>, BrokerError> {
        self.take_until(max, Bound::Reach(max_bytes))
    }

    /// [`Queue::take`], of messages that come to at most `budget` bytes, each counted as its
    /// body and texts (`StoredMessage::delivered_bytes`) and `overhead` (the first message is
    /// taken whatever its size). Stops at the first message that does not fit, as the order of
    /// delivery requires.
    pub fn take_within(
        &self,
        max: usize,
        budget: usize,
        overhead: usize,
    ) -> Result<Vec<Entry>, BrokerError> {
        self.take_until(max, Bound::Within { budget, overhead })
    }

    fn take_until(&self, max: usize, bound: Bound) -> Result<Vec<Entry>, BrokerError> {
        let (max_bytes, overhead, within) = match bound {
            Bound::Reach(max_bytes) => (max_bytes, 0, false),
            Bound::Within { budget, overhead } => (budget, overhead, true),
        };
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let now = if st.timed > 0 { now_ms() } else { 0 };
        // Outgoing queues: never past a position whose send is still being stored.
        let limit = st.pending.first().copied().unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity(max.min(st.ready).min(1024));
        let mut bytes = 0usize;
        let mut expired = 0usize;
        let mut failed = None;
        'levels: for p in (0..8).rev() {
            while out.len() < max && bytes < max_bytes {
                if st.levels[p].is_empty() && st.tails[p].first_seq().is_some_and(|s| s <= limit) {
                    // The window is empty: its tail's next entries come in (headers read).
                    if let Err(e) = self.refill(st, p, max - out.len()) {
                        failed = Some(e);
                        break 'levels;
                    }
                }
                if st.levels[p].front().is_none_or(|e| e.seq > limit) {
                    break;
                }
                let Some(e) = st.levels[p].pop_front() else {
                    break;
                };
                if e.removed {
                    st.tombstones -= 1;
                    continue;
                }
                let cost = if within {
                    (e.msg.delivered_bytes() as usize).saturating_add(overhead)
                } else {
                    e.msg.body_len as usize
                };
                if within && !out.is_empty() && bytes.saturating_add(cost) > max_bytes {
                    st.levels[p].push_front(e);
                    break 'levels;
                }
                st.index.remove(p as u8, &e);
                if st.timed > 0 {
                    let (timed, gone) = self.deadline(&e, now);
                    if timed {
                        st.timed -= 1;
                    }
                    if gone {
                        expired += 1;
                        st.expired.push(e);
                        self.lower_sweep_at(0);
                        continue;
                    }
                }
                bytes = bytes.saturating_add(cost);
                out.push(e);
            }
            if out.len() >= max || bytes >= max_bytes {
                break 'levels;
            }
        }
        st.ready -= out.len() + expired;
        st.stats.in_flight += (out.len() + expired) as u64;
        // A drained backlog gives its index memory back (1,000,000 entries: 32 MiB).
        for level in st.levels.iter_mut() {
            if level.is_empty() && level.capacity() > SHRINK_EMPTY_LEVEL_ABOVE {
                level.shrink_to_fit();
            }
        }
        for tail in st.tails.iter_mut() {
            if tail.seqs.is_empty() && tail.seqs.capacity() > SHRINK_EMPTY_LEVEL_ABOVE {
                tail.seqs.shrink_to_fit();
            }
        }
        match failed {
            // What was taken before the failed read is delivered; the error comes next time.
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Takes every message whose deadline has passed at `now` (set aside by `take`, or still
    /// waiting), counted in flight, for the broker to move to a dead-letter queue.
    #[cfg(test)]
    pub fn sweep(&self, now: u64) -> Vec<Entry> {
        self.sweep_some(now, usize::MAX, u64::MAX)
    }

    /// [`Queue::sweep`], stopping once it took `max` messages or bodies of `max_bytes` (at least
    /// one message): the broker reads the bodies of what it takes and moves them in one journal
    /// record, so a backlog that expires at once is moved a bounded batch at a time. What is
    /// left stays due ([`Queue::sweep_at`] is `now` or earlier).
    pub fn sweep_some(&self, now: u64, max: usize, max_bytes: u64) -> Vec<Entry> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut out = Budget::new(max, max_bytes);
        let (mut n, mut bytes) = (0, 0);
        while n < st.expired.len() && !out.would_be_full(n, bytes) {
            bytes += st.expired[n].msg.body_len as u64;
            n += 1;
        }
        for e in st.expired.drain(..n) {
            out.push(e);
        }
        if !out.full() && st.timed > 0 && !st.deleted && now >= st.next_deadline {
            let mut next = u64::MAX;
            for p in 0..8 {
                if st.levels[p].is_empty() {
                    continue;
                }
                let level = std::mem::take(&mut st.levels[p]);
                let mut keep = VecDeque::with_capacity(level.len());
                for e in level {
                    if e.removed {
                        st.tombstones -= 1;
                        continue;
                    }
                    match self.deadline_ms(&e) {
                        Some(d) if now >= d && !out.full() => {
                            st.index.remove(p as u8, &e);
                            st.timed -= 1;
                            st.ready -= 1;
                            st.stats.in_flight += 1;
                            out.push(e);
                        }
                        Some(d) => {
                            next = next.min(d);
                            keep.push_back(e);
                        }
                        None => keep.push_back(e),
                    }
                }
                st.levels[p] = keep;
            }
            for p in 0..8 {
                if st.tails[p].seqs.is_empty() {
                    continue;
                }
                if now >= st.tails[p].deadline && !out.full() {
                    if let Err(e) = self.sweep_tail(st, p, now, &mut out) {
                        tracing::error!(queue = %self.def.name, error = %e,
                            "cannot read paged headers to find expired messages; trying again at the next sweep");
                    }
                }
                next = next.min(st.tails[p].deadline);
            }
            st.next_deadline = next;
        }
        self.set_sweep_at(st);
        out.entries
    }

    /// The sweep of one level's tail: reads its headers, takes the expired entries (into
    /// `out`, counted in flight, until it is full) and makes the tail's deadline exact (or
    /// `now`, if it stopped before the end).
    fn sweep_tail(
        &self,
        st: &mut State,
        lane: usize,
        now: u64,
        out: &mut Budget,
    ) -> Result<(), BrokerError> {
        // Where the last sweep stopped, and the least deadline of what it read before.
        let (mut i, mut next) = {
            let tail = &st.tails[lane];
            if tail.sweep_from == 0 {
                (0, u64::MAX)
            } else {
                let at = tail.search(tail.sweep_from).unwrap_or_else(|i| i);
                (at, tail.swept_deadline)
            }
        };
        let mut gone = Vec::new();
        let mut gone_bytes = 0u64;
        // The seq the next sweep goes on from, once this one is full.
        let mut resume = None;
        while i < st.tails[lane].seqs.len() && resume.is_none() {
            if out.would_be_full(gone.len(), gone_bytes) {
                resume = Some(st.tails[lane].seqs[i] & !TAKEN);
                break;
            }
            let (got, upto) = self.read_tail(st, lane, i, TAIL_READ)?;
            i = upto;
            for (idx, e) in got {
                if resume.is_some() {
                    break;
                }
                match self.deadline_ms(&e) {
                    Some(d) if now >= d => {
                        if out.would_be_full(gone.len(), gone_bytes) {
                            resume = Some(e.seq);
                        } else {
                            gone_bytes += e.msg.body_len as u64;
                            gone.push((idx, e));
                        }
                    }
                    Some(d) => next = next.min(d),
                    None => {}
                }
            }
        }
        let tail = &mut st.tails[lane];
        for (idx, e) in gone {
            tail.seqs[idx] |= TAKEN;
            tail.dead += 1;
            tail.forget(&e);
            st.index.remove(lane as u8, &e);
            st.timed -= 1;
            st.ready -= 1;
            st.stats.in_flight += 1;
            out.push(e);
        }
        // Tombstones need not stay: an entry given back finds its place by its seq.
        tail.seqs.retain(|s| s & TAKEN == 0);
        tail.dead = 0;
        match resume {
            // Full: the next sweep, due at once, reads on from there.
            Some(seq) => {
                (tail.sweep_from, tail.swept_deadline) = (seq, next);
                tail.deadline = now;
            }
            None => {
                (tail.sweep_from, tail.swept_deadline) = (0, u64::MAX);
                tail.deadline = next;
            }
        }
        if tail.seqs.is_empty() {
            tail.clear();
        }
        Ok(())
    }

    /// Makes [`Queue::sweep_at`] exact (the caller holds the lock: `st` is its state).
    fn set_sweep_at(&self, st: &State) {
        let at = if !st.expired.is_empty() {
            0
        } else if st.timed > 0 {
            st.next_deadline
        } else {
            u64::MAX
        };
        self.sweep_at.store(at, Ordering::SeqCst);
    }

    /// Lowers this queue's `sweep_at` and the broker's (the caller holds the lock).
    fn lower_sweep_at(&self, at: u64) {
        self.sweep_at.fetch_min(at, Ordering::SeqCst);
        if let Some(b) = &self.broker_sweep {
            b.lower(at);
        }
    }

    /// This queue's `sweep_at` (no sweep finds anything before it).
    pub(crate) fn sweep_at(&self) -> u64 {
        self.sweep_at.load(Ordering::SeqCst)
    }

    /// Whether a sweep at `now` might find something, without the lock (false: it finds
    /// nothing; true: ask [`Queue::needs_sweep`]).
    pub fn may_need_sweep(&self, now: u64) -> bool {
        now >= self.sweep_at()
    }

    /// Whether a sweep at `now` could find anything.
    pub fn needs_sweep(&self, now: u64) -> bool {
        let st = self.lock();
        self.set_sweep_at(&st);
        !st.expired.is_empty() || (st.timed > 0 && now >= st.next_deadline)
    }

    /// Acknowledges delivered messages: they are removed for good. (Their broker-wide quota is
    /// given back by `Broker::forget`.)
    pub fn complete(&self, entries: &[Entry]) {
        let mut st = self.lock();
        let charged: u64 = entries.iter().map(|e| e.msg.charged_bytes()).sum();
        let body: u64 = entries.iter().map(|e| e.msg.body_len as u64).sum();
        let n = entries.len() as u64;
        // After a delete the counters were reset; saturate rather than underflow.
        st.stats.bytes = st.stats.bytes.saturating_sub(body);
        st.stats.messages = st.stats.messages.saturating_sub(n);
        st.stats.in_flight = st.stats.in_flight.saturating_sub(n);
        st.charged = st.charged.saturating_sub(charged);
        st.totals.removed += n;
        if n > 0 {
            self.unsaved(&mut st);
        }
        if !st.aborted.is_empty() {
            for e in entries {
                st.aborted.remove(&e.seq);
            }
        }
        drop(st);
        self.release_parent_quota(charged);
    }

    /// Counts messages moved out to a dead-letter queue (also completed) and receives undone
    /// by aborted transactions.
    pub(crate) fn count(&self, dead_lettered: u64, receive_aborts: u64) {
        if dead_lettered == 0 && receive_aborts == 0 {
            return;
        }
        let mut st = self.lock();
        st.totals.dead_lettered += dead_lettered;
        st.totals.receive_aborts += receive_aborts;
        self.unsaved(&mut st);
    }

    /// Gives delivered, unacknowledged messages back: each returns to its place in the order.
    /// If the queue was deleted meanwhile, returns them (their quota is the caller's to give
    /// back).
    #[must_use = "entries of a deleted queue come back and must be forgotten"]
    pub fn restore(&self, entries: Vec<Entry>) -> Vec<Entry> {
        if entries.is_empty() {
            return entries;
        }
        let mut st = self.lock();
        if st.deleted {
            return entries;
        }
        st.stats.in_flight -= entries.len() as u64;
        st.ready += entries.len();
        for e in entries.iter().filter(|e| e.aborts > 0) {
            if st.aborted.len() < crate::counters_store::MAX_ABORT_COUNTS_PER_QUEUE
                || st.aborted.contains_key(&e.seq)
            {
                st.aborted.insert(e.seq, e.aborts);
                self.unsaved(&mut st);
            }
        }
        // Entries come in delivery order; most belong before the current head, so walk backwards
        // and push to the front when possible.
        for e in entries.into_iter().rev() {
            let deadline = self.deadline_ms(&e);
            if let Some(d) = deadline {
                st.timed += 1;
                st.next_deadline = st.next_deadline.min(d);
                self.lower_sweep_at(d);
            }
            let lane = self.lane(&e);
            st.index.add(lane as u8, &e);
            if st.tails[lane].first_seq().is_some_and(|f| e.seq >= f) {
                // Back into the tail (its place is after the window).
                let paged = Self::pageable(&e);
                st.tails[lane].put(e, paged, deadline);
                continue;
            }
            let st = &mut *st;
            put_in_level(&mut st.levels[lane], &mut st.tombstones, e);
        }
        drop(st);
        self.notify.notify_waiters();
        Vec::new()
    }

    /// Takes and removes up to `max` messages at once (for tests).
    #[cfg(test)]
    pub fn remove(&self, max: usize) -> Result<Vec<Entry>, BrokerError> {
        let taken = self.take(max)?;
        self.complete(&taken);
        Ok(taken)
    }

    /// Up to `max` ready messages from the head, in receive order, not removed.
    pub fn peek(&self, max: usize) -> Result<Vec<Entry>, BrokerError> {
        let st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let now = now_ms();
        let limit = st.pending.first().copied().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        for p in (0..8).rev() {
            out.extend(
                st.levels[p]
                    .iter()
                    .take_while(|e| e.seq < limit)
                    .filter(|e| !e.removed && (st.timed == 0 || !self.deadline(e, now).1))
                    .take(max - out.len())
                    .cloned(),
            );
            // Then the tail's, headers read (not kept).
            let mut i = 0;
            while out.len() < max && i < st.tails[p].seqs.len() {
                let (got, upto) = self.read_tail(&st, p, i, (max - out.len()).min(TAIL_READ))?;
                i = upto;
                for (_, e) in got {
                    if e.seq >= limit {
                        i = usize::MAX;
                        break;
                    }
                    if st.timed == 0 || !self.deadline(&e, now).1 {
                        out.push(e);
                    }
                }
            }
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    /// A page of [`Queue::peek`]: up to `max` ready messages after `after` (a cursor from the
    /// previous page), stopping once their bodies reach `max_bytes` (at least one message).
    /// Returns the cursor of the last one if the page was cut by a limit (more may follow).
    pub fn peek_page(
        &self,
        after: Option<PeekCursor>,
        max: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Entry>, Option<PeekCursor>), BrokerError> {
        let (max, max_bytes) = (max.max(1), max_bytes.max(1));
        let st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let now = now_ms();
        // As `peek`: nothing at or past a position whose send is still being stored.
        let limit = st.pending.first().copied().unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity(max.min(st.ready).min(1024));
        let mut bytes = 0usize;
        let full = |out: &Vec<Entry>, bytes: usize| out.len() >= max || bytes >= max_bytes;
        let cut = |out: Vec<Entry>| {
            let last: &Entry = out.last().expect("max and max_bytes are above zero");
            let cursor = PeekCursor {
                lane: self.lane(last) as u8,
                seq: last.seq,
            };
            Ok((out, Some(cursor)))
        };
        for lane in (0..8u8).rev() {
            let level = &st.levels[lane as usize];
            let tail = &st.tails[lane as usize];
            let (start, tail_start) = match after {
                Some(c) if lane > c.lane => continue,
                Some(c) if lane == c.lane => (
                    level.partition_point(|e| e.seq <= c.seq),
                    tail.seqs.partition_point(|s| s & !TAKEN <= c.seq),
                ),
                _ => (0, 0),
            };
            for e in level.iter().skip(start).take_while(|e| e.seq < limit) {
                if full(&out, bytes) {
                    return cut(out);
                }
                if e.removed || (st.timed > 0 && self.deadline(e, now).1) {
                    continue;
                }
                bytes += e.msg.body_len as usize;
                out.push(e.clone());
            }
            // Then the tail's, headers read (not kept).
            let mut i = tail_start;
            while i < tail.seqs.len() {
                if full(&out, bytes) {
                    // Whether anything live follows is not known without reading: say "more".
                    return cut(out);
                }
                let (got, upto) = self.read_tail(&st, lane as usize, i, max - out.len())?;
                i = upto;
                for e in got.into_iter().map(|(_, e)| e) {
                    if e.seq >= limit {
                        i = usize::MAX;
                        break;
                    }
                    if full(&out, bytes) {
                        return cut(out);
                    }
                    if st.timed > 0 && self.deadline(&e, now).1 {
                        continue;
                    }
                    bytes += e.msg.body_len as usize;
                    out.push(e);
                }
            }
        }
        Ok((out, None))
    }

    /// Removes every ready message and returns them.
    pub fn purge(&self) -> Vec<Entry> {
        let mut st = self.lock();
        let mut out = Vec::with_capacity(st.ready.min(1 << 20));
        for level in st.levels.iter_mut() {
            // Tombstones are in flight elsewhere: their receivers complete or restore them.
            out.extend(level.drain(..).filter(|e| !e.removed));
        }
        st.tombstones = 0;
        st.index.clear();
        // Paged tails: their headers are read (the caller needs each message).
        let mut kept = false;
        for lane in 0..8 {
            let mut i = 0;
            let mut read = Vec::new();
            let mut failed = false;
            while i < st.tails[lane].seqs.len() {
                match self.read_tail(&st, lane, i, TAIL_READ) {
                    Ok((got, upto)) => {
                        i = upto;
                        read.extend(got.into_iter().map(|(_, e)| e));
                    }
                    Err(e) => {
                        tracing::error!(queue = %self.def.name, error = %e,
                            "purge: cannot read paged headers; those messages stay in the queue");
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                kept = true;
                continue;
            }
            out.extend(read);
            st.tails[lane].clear();
        }
        let charged: u64 = out.iter().map(|e| e.msg.charged_bytes()).sum();
        let body: u64 = out.iter().map(|e| e.msg.body_len as u64).sum();
        if kept {
            // What stays is the tails that could not be read (their deadlines still count).
            st.ready = st.tails.iter().map(Tail::live).sum();
            st.next_deadline = st
                .tails
                .iter()
                .map(|t| t.deadline)
                .min()
                .unwrap_or(u64::MAX);
        } else {
            st.ready = 0;
            st.timed = 0;
            st.next_deadline = u64::MAX;
        }
        st.stats.messages -= out.len() as u64;
        st.stats.bytes -= body;
        st.charged = st.charged.saturating_sub(charged);
        st.totals.purged += out.len() as u64;
        if !out.is_empty() {
            self.unsaved(&mut st);
        }
        if !st.aborted.is_empty() {
            for e in &out {
                st.aborted.remove(&e.seq);
            }
        }
        drop(st);
        self.release_parent_quota(charged);
        out
    }

    /// Marks the queue deleted if it holds nothing (no message stored, in flight, expired or
    /// being stored), atomically with that check; returns whether it did.
    pub fn mark_deleted_if_empty(&self) -> bool {
        let mut st = self.lock();
        if st.deleted
            || st.stats.messages != 0
            || st.stats.in_flight != 0
            || !st.pending.is_empty()
            || !st.expired.is_empty()
        {
            return false;
        }
        st.deleted = true;
        self.unsaved(&mut st);
        drop(st);
        self.notify.notify_waiters();
        true
    }

    /// Undoes [`Queue::mark_deleted_if_empty`] for a deletion the journal refused before storing
    /// anything: the queue was empty, so nothing was dropped.
    pub(crate) fn unmark_deleted(&self) {
        let mut st = self.lock();
        st.deleted = false;
        self.unsaved(&mut st);
    }

    /// Marks the queue deleted: pushes and takes fail, waiters wake. Returns the quota bytes the
    /// dropped ready (and expired, not yet swept) messages held, by delivery:
    /// `(express, recoverable)`, counted under the same lock so that nothing inserted meanwhile
    /// is missed. Messages in flight are given back by their receivers ([`Queue::restore`]),
    /// and ones admitted but not yet inserted by their senders ([`Queue::insert`]).
    #[must_use = "the broker-wide quota of the dropped messages must be given back"]
    pub fn mark_deleted(&self) -> (u64, u64) {
        let mut st = self.lock();
        let mut charged = (0, 0);
        for e in st
            .levels
            .iter()
            .flat_map(|l| l.iter())
            .filter(|e| !e.removed)
            .chain(st.expired.iter())
            .chain(st.tails.iter().flat_map(|t| t.mem.values()))
        {
            match e.msg.delivery {
                crate::message::Delivery::Express => charged.0 += e.msg.charged_bytes(),
                crate::message::Delivery::Recoverable => charged.1 += e.msg.charged_bytes(),
            }
        }
        // Paged entries are all recoverable.
        charged.1 += st.tails.iter().map(|t| t.paged_charged).sum::<u64>();
        for tail in st.tails.iter_mut() {
            tail.clear();
        }
        st.deleted = true;
        self.unsaved(&mut st);
        for level in st.levels.iter_mut() {
            level.clear();
        }
        st.tombstones = 0;
        st.index.clear();
        st.charged = 0;
        st.ready = 0;
        st.timed = 0;
        st.next_deadline = u64::MAX;
        st.expired.clear();
        st.pending.clear();
        st.stats = QueueStats::default();
        drop(st);
        self.notify.notify_waiters();
        charged
    }

    /// Copies of the waiting entries (and expired ones not yet swept) that `keep` picks, left
    /// in the queue: those of a queue about to be deleted that asked for an acknowledgement.
    pub(crate) fn waiting_matching(&self, keep: impl Fn(&Entry) -> bool) -> Vec<Entry> {
        let st = self.lock();
        let mut out: Vec<Entry> = st
            .levels
            .iter()
            .flat_map(|l| l.iter())
            .filter(|e| !e.removed)
            .chain(st.expired.iter())
            .filter(|e| keep(e))
            .cloned()
            .collect();
        // Paged tails: headers read in batches, only the matching ones kept.
        for lane in 0..8 {
            let mut i = 0;
            while i < st.tails[lane].seqs.len() {
                match self.read_tail(&st, lane, i, TAIL_READ) {
                    Ok((got, upto)) => {
                        i = upto;
                        out.extend(got.into_iter().map(|(_, e)| e).filter(|e| keep(e)));
                    }
                    Err(e) => {
                        tracing::error!(queue = %self.def.name, error = %e,
                            "cannot read paged headers; their messages are not looked at");
                        break;
                    }
                }
            }
        }
        out
    }

    pub fn is_deleted(&self) -> bool {
        self.lock().deleted
    }

    pub fn stats(&self) -> QueueStats {
        self.lock().stats
    }

    /// The counters and the totals, read together.
    pub fn stats_and_totals(&self) -> (QueueStats, QueueTotals) {
        let st = self.lock();
        (st.stats, st.totals)
    }

    /// Resolves when messages arrive, come back, or the queue is deleted. To not miss a wake-up,
    /// create and `enable` the future before checking the queue.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// The first ready message (in receive order) that `key` selects, not removed: the head,
    /// the message with an id, the first with a correlation id, or the message at a cursor
    /// position. Lookups by id or correlation id use the queue's index (built on first use).
    pub fn peek_by(&self, key: &Select) -> Result<Option<Entry>, BrokerError> {
        let mut st = self.lock();
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        Ok(self.find(&mut st, key)?.map(|(lane, at)| match at {
            Found::Window(i) => {
                let mut e = st.levels[lane as usize][i].clone();
                e.removed = false;
                e
            }
            Found::Tail(_, e) => e,
        }))
    }

    /// [`Queue::peek_by`], taken for delivery as [`Queue::take`] does (in flight until
    /// [`Queue::complete`] or [`Queue::restore`]). A message taken from the middle of the
    /// queue leaves a tombstone in its place, so this is O(1) (plus a binary search), not a
    /// shift of the queue.
    pub fn take_by(&self, key: &Select) -> Result<Option<Entry>, BrokerError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.deleted {
            return Err(BrokerError::QueueDeleted(self.def.name.clone()));
        }
        let Some((lane, at)) = self.find(st, key)? else {
            return Ok(None);
        };
        let e = match at {
            Found::Window(i) => {
                let level = &mut st.levels[lane as usize];
                if i == 0 {
                    level.pop_front().expect("found")
                } else {
                    let t = &mut level[i];
                    t.removed = true;
                    st.tombstones += 1;
                    // The tombstone keeps its seq, not the message: a body taken from the
                    // middle must not stay in memory until the tombstone reaches the head.
                    let msg = std::mem::replace(&mut t.msg, tombstone_message());
                    Entry {
                        seq: t.seq,
                        msg,
                        aborts: t.aborts,
                        removed: false,
                    }
                }
            }
            Found::Tail(i, e) => {
                let tail = &mut st.tails[lane as usize];
                tail.seqs[i] |= TAKEN;
                tail.dead += 1;
                tail.forget(&e);
                // Tombstones never outnumber live entries.
                if tail.dead > 1024 && tail.dead * 2 > tail.seqs.len() {
                    tail.seqs.retain(|s| s & TAKEN == 0);
                    tail.dead = 0;
                }
                e
            }
        };
        st.index.remove(lane, &e);
        if self.deadline_ms(&e).is_some() {
            st.timed -= 1;
        }
        st.ready -= 1;
        st.stats.in_flight += 1;
        // Tombstones never outnumber live entries (amortised O(1) per take).
        if st.tombstones > 1024 && st.tombstones * 2 > st.ready {
            for level in st.levels.iter_mut() {
                level.retain(|e| !e.removed);
            }
            st.tombstones = 0;
        }
        Ok(Some(e))
    }

    /// Where the ready entry at `(lane, seq)` is, if it is there, not expired and not behind a
    /// position still being stored (a tail entry comes with its header read).
    fn usable(
        &self,
        st: &State,
        lane: u8,
        seq: u64,
        now: u64,
        limit: u64,
    ) -> Result<Option<Found>, BrokerError> {
        if seq >= limit {
            return Ok(None);
        }
        let level = &st.levels[lane as usize];
        let i = level.partition_point(|e| e.seq < seq);
        if let Some(e) = level.get(i).filter(|e| e.seq == seq) {
            let ok = !e.removed && (st.timed == 0 || !self.deadline(e, now).1);
            return Ok(ok.then_some(Found::Window(i)));
        }
        let tail = &st.tails[lane as usize];
        let Ok(i) = tail.search(seq) else {
            return Ok(None);
        };
        if tail.seqs[i] & TAKEN != 0 {
            return Ok(None);
        }
        let (mut got, _) = self.read_tail(st, lane as usize, i, 1)?;
        let Some((_, e)) = got.pop() else {
            return Ok(None);
        };
        let ok = st.timed == 0 || !self.deadline(&e, now).1;
        Ok(ok.then_some(Found::Tail(i, e)))
    }

    /// Where `key`'s message is: its lane and place, if it is ready, not expired and not behind
    /// a position still being stored.
    fn find(&self, st: &mut State, key: &Select) -> Result<Option<(u8, Found)>, BrokerError> {
        let now = if st.timed > 0 { now_ms() } else { 0 };
        let limit = st.pending.first().copied().unwrap_or(u64::MAX);
        match key {
            Select::At(c) => Ok(self
                .usable(st, c.lane, c.seq, now, limit)?
                .map(|f| (c.lane, f))),
            Select::Head | Select::After(_) => {
                let from = match key {
                    Select::After(Some(c)) => Some((c.lane, c.seq + 1)),
                    _ => None,
                };
                match self.first_from(st, from, now, limit)? {
                    Some((lane, seq)) => {
                        Ok(self.usable(st, lane, seq, now, limit)?.map(|f| (lane, f)))
                    }
                    None => Ok(None),
                }
            }
            Select::Id(_) | Select::Correlation(_) => {
                if !st.index.is_built(key) {
                    let State { levels, index, .. } = st;
                    index.build(
                        key,
                        (0..8u8).flat_map(|l| {
                            levels[l as usize]
                                .iter()
                                .filter(|e| !e.removed)
                                .map(move |e| (l, e))
                        }),
                    );
                    // The tails' headers are read in batches to index them, and dropped.
                    for lane in 0..8usize {
                        let mut i = 0;
                        while i < st.tails[lane].seqs.len() {
                            let (got, upto) = match self.read_tail(st, lane, i, TAIL_READ) {
                                Ok(r) => r,
                                Err(e) => {
                                    st.index.unbuild(key);
                                    return Err(e);
                                }
                            };
                            i = upto;
                            st.index
                                .extend(key, got.iter().map(|(_, e)| (lane as u8, e)));
                        }
                    }
                }
                // The first match in receive order: highest lane, then lowest seq.
                let mut best: Option<(u8, u64, Found)> = None;
                for (lane, seq) in st.index.candidates(key) {
                    if best.as_ref().is_some_and(|(bl, bs, _)| {
                        (*bl, std::cmp::Reverse(*bs)) > (lane, std::cmp::Reverse(seq))
                    }) {
                        continue;
                    }
                    let Some(f) = self.usable(st, lane, seq, now, limit)? else {
                        continue;
                    };
                    let matches = match &f {
                        Found::Window(i) => key.matches(&st.levels[lane as usize][*i]),
                        Found::Tail(_, e) => key.matches(e),
                    };
                    if matches {
                        best = Some((lane, seq, f));
                    }
                }
                Ok(best.map(|(lane, _, f)| (lane, f)))
            }
        }
    }

    /// The position of the first usable entry at or after `from` (lane, seq) in receive order
    /// (from the head if `None`).
    fn first_from(
        &self,
        st: &State,
        from: Option<(u8, u64)>,
        now: u64,
        limit: u64,
    ) -> Result<Option<(u8, u64)>, BrokerError> {
        for lane in (0..8u8).rev() {
            let level = &st.levels[lane as usize];
            let tail = &st.tails[lane as usize];
            let (start, tail_start) = match from {
                Some((l, _)) if lane > l => continue,
                Some((l, s)) if lane == l => (
                    level.partition_point(|e| e.seq < s),
                    tail.seqs.partition_point(|x| x & !TAKEN < s),
                ),
                _ => (0, 0),
            };
            for e in level.iter().skip(start).take_while(|e| e.seq < limit) {
                if e.removed || (st.timed > 0 && self.deadline(e, now).1) {
                    continue;
                }
                return Ok(Some((lane, e.seq)));
            }
            let mut i = tail_start;
            while i < tail.seqs.len() {
                let (got, upto) = self.read_tail(st, lane as usize, i, 16)?;
                i = upto;
                for (_, e) in got {
                    if e.seq >= limit {
                        return Ok(None);
                    }
                    if st.timed > 0 && self.deadline(&e, now).1 {
                        continue;
                    }
                    return Ok(Some((lane, e.seq)));
                }
            }
        }
        Ok(None)
    }

    /// The definition with the live label and quota (what a redefinition journals). Its ACL
    /// is the caller's to set from the live one, under [`Queue::acl_lock`], which serialises
    /// redefinitions.
    pub(crate) fn current_def(&self) -> QueueDef {
        let (quota_bytes, label) = {
            let st = self.lock();
            (st.quota, st.label.clone())
        };
        QueueDef {
            quota_bytes,
            label,
            poison: self.journaling.poison(),
            journal: self.journaling.policy(),
            ..self.def.clone()
        }
    }

    /// The cursor position of an entry (its lane and seq).
    pub(crate) fn position(&self, e: &Entry) -> PeekCursor {
        PeekCursor {
            lane: self.lane(e) as u8,
            seq: e.seq,
        }
    }

    /// Sets the live label and quota (after their redefinition was journaled or submitted).
    pub(crate) fn set_properties(&self, label: String, quota: Option<u64>) {
        let mut st = self.lock();
        st.label = label;
        st.quota = quota;
    }

    /// Sets the live quota (a journal queue's follows its queue's journal quota).
    pub(crate) fn set_quota(&self, quota: Option<u64>) {
        self.lock().quota = quota;
    }

    /// Bytes the queue's index holds now (0 until a lookup by id or correlation id built it).
    pub fn index_bytes(&self) -> usize {
        self.lock().index.bytes()
    }

    /// The wire description of this queue.
    pub fn info(&self) -> mq_proto::v1::QueueInfo {
        let (s, t, quota_bytes, label) = {
            let st = self.lock();
            (st.stats, st.totals, st.quota, st.label.clone())
        };
        mq_proto::v1::QueueInfo {
            name: self.def.name.clone(),
            format_name: format!("DIRECT=OS:{}", self.def.name),
            transactional: self.def.transactional,
            messages: s.messages,
            bytes: s.bytes,
            quota_bytes,
            label,
            created_ms: self.def.created_ms,
            in_flight: s.in_flight,
            sent: t.sent,
            received: t.received(),
            max_aborts: self.journaling.poison().max_aborts,
            poisoned: self.poisoned.load(std::sync::atomic::Ordering::Relaxed),
            journal: self.journaling.policy().enabled,
            journal_quota_bytes: self.journaling.policy().quota_bytes,
            journal_not_kept: self
                .journaling
                .not_kept
                .load(std::sync::atomic::Ordering::Relaxed),
            dead_lettered: t.dead_lettered,
            receive_aborts: t.receive_aborts,
            purged: t.purged,
        }
    }
}

/// Where a [`Queue::peek_page`] stopped: the priority lane and position of the last message
/// returned. On the wire: 9 bytes, the lane then the seq (little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeekCursor {
    pub lane: u8,
    pub seq: u64,
}

impl PeekCursor {
    pub fn encode(&self) -> bytes::Bytes {
        let mut b = Vec::with_capacity(9);
        b.push(self.lane);
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.into()
    }

    /// `None` for an empty cursor (the first page).
    pub fn decode(b: &[u8]) -> Result<Option<PeekCursor>, BrokerError> {
        match b.len() {
            0 => Ok(None),
            9 if b[0] < 8 => Ok(Some(PeekCursor {
                lane: b[0],
                seq: u64::from_le_bytes(b[1..9].try_into().expect("8 bytes")),
            })),
            9 => Err(BrokerError::InvalidArgument(format!(
                "this peek cursor names priority level {} (there are 8); a peek cursor is the next_cursor of a previous peek response",
                b[0]
            ))),
            n => Err(BrokerError::InvalidArgument(format!(
                "a peek cursor is the next_cursor of a previous peek response (9 bytes); got {n} bytes"
            ))),
        }
    }
}

/// Where [`Queue::find`] found a ready entry of a lane.
/// Entries a sweep takes, up to a count and body bytes (at least one entry).
struct Budget {
    entries: Vec<Entry>,
    bytes: u64,
    max: usize,
    max_bytes: u64,
}

impl Budget {
    fn new(max: usize, max_bytes: u64) -> Self {
        Budget {
            entries: Vec::new(),
            bytes: 0,
            max,
            max_bytes,
        }
    }

    fn full(&self) -> bool {
        self.would_be_full(0, 0)
    }

    /// Whether it would be full with `n` more entries of `bytes` more.
    fn would_be_full(&self, n: usize, bytes: u64) -> bool {
        self.entries.len() + n >= self.max || self.bytes + bytes >= self.max_bytes
    }

    fn push(&mut self, e: Entry) {
        self.bytes += e.msg.body_len as u64;
        self.entries.push(e);
    }
}

/// Where a take stops ([`Queue::take_bounded`], [`Queue::take_within`]).
#[derive(Clone, Copy)]
enum Bound {
    /// Once the bodies taken reach this many bytes.
    Reach(usize),
    /// Before the message whose body, texts and `overhead` would take the total past `budget`.
    Within { budget: usize, overhead: usize },
}

enum Found {
    /// In the window, at this index.
    Window(usize),
    /// In the tail, at this index (its header read).
    Tail(usize, Entry),
}

/// Which message a [`Queue::peek_by`] or [`Queue::take_by`] wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// The first in receive order.
    Head,
    /// The message with this id (.NET `ReceiveById`).
    Id(uuid::Uuid),
    /// The first message with this correlation id (.NET `ReceiveByCorrelationId`).
    Correlation(String),
    /// The message at a cursor position, if it is still there.
    At(PeekCursor),
    /// The first message after a cursor position (from the head if `None`).
    After(Option<PeekCursor>),
}

impl Select {
    /// Whether `e` is the message this selects (for index candidates, whose hash matched).
    pub(crate) fn matches(&self, e: &Entry) -> bool {
        match self {
            Select::Id(id) => e.msg.id == *id,
            Select::Correlation(c) => e.msg.correlation_id == *c,
            _ => true,
        }
    }
}

/// Subqueues and moves (see `subqueue.rs`): a subqueue's messages are charged to its main
/// queue's quota, so moving between them changes no charge.
impl Queue {
    /// Makes this queue a subqueue of `parent`: its ACL and quota are the parent's from now on,
    /// and what it holds charged (recovery loaded it) moves to the parent.
    pub(crate) fn set_parent(&self, parent: Arc<Queue>) {
        let moved = std::mem::take(&mut self.lock().charged);
        parent.lock().charged += moved;
        let _ = self.parent.set(parent);
    }

    /// A subqueue's main queue.
    pub fn parent(&self) -> Option<&Arc<Queue>> {
        self.parent.get()
    }

    fn release_parent_quota(&self, charged: u64) {
        if let Some(p) = self.parent.get() {
            p.release_quota(charged);
        }
    }

    /// Takes the ready message with this id (counted in flight, as [`Queue::take`]), or
    /// `None` if it is not waiting here (in flight, expired, or never here). Indexed: see
    /// [`Queue::take_by`].
    pub fn take_id(&self, id: uuid::Uuid) -> Result<Option<Entry>, BrokerError> {
        self.take_by(&Select::Id(id))
    }

    /// An entry taken from here that now lives in another queue of the same main queue: it
    /// leaves this queue's counters; its quota charge stays with the main queue
    /// (`keep_charge`), or is given back (a dead letter moved elsewhere).
    pub fn complete_moved(&self, e: &Entry, keep_charge: bool) {
        if !keep_charge {
            self.complete(std::slice::from_ref(e));
            return;
        }
        let mut st = self.lock();
        st.stats.bytes = st.stats.bytes.saturating_sub(e.msg.body_len as u64);
        st.stats.messages = st.stats.messages.saturating_sub(1);
        st.stats.in_flight = st.stats.in_flight.saturating_sub(1);
        if !st.aborted.is_empty() && st.aborted.remove(&e.seq).is_some() {
            self.unsaved(&mut st);
        }
    }

    /// For `counters_store.rs`: the totals and the messages' abort counts, read together, or
    /// `None` if the queue is deleted; the queue is saved as of now (a later change adds it to
    /// the broker's set again).
    pub(crate) fn totals_to_save(&self) -> Option<(QueueTotals, Vec<(u64, u32)>)> {
        let mut st = self.lock();
        st.unsaved = false;
        (!st.deleted).then(|| {
            (
                st.totals,
                st.aborted.iter().map(|(s, a)| (*s, *a)).collect(),
            )
        })
    }

    /// At recovery, before the queue is used: the totals and abort counts saved before the
    /// restart replace the ones loading counted. Abort counts of messages that are gone are
    /// ignored.
    pub(crate) fn restore_totals(&self, totals: QueueTotals, aborts: &[(u64, u32)]) {
        let mut st = self.lock();
        st.totals = totals;
        if aborts.is_empty() {
            return;
        }
        let want: std::collections::HashMap<u64, u32> = aborts.iter().copied().collect();
        let st = &mut *st;
        for level in st.levels.iter_mut() {
            for e in level.iter_mut() {
                if let Some(a) = want.get(&e.seq) {
                    e.aborts = *a;
                    st.aborted.insert(e.seq, *a);
                }
            }
        }
        // A paged entry takes its count from `aborted` when its header is read.
        for tail in st.tails.iter_mut() {
            for (&seq, &a) in &want {
                if tail.search(seq).is_ok() {
                    st.aborted.insert(seq, a);
                    if let Some(e) = tail.mem.get_mut(&seq) {
                        e.aborts = a;
                    }
                }
            }
        }
    }
}

/// Entries grouped by their queue, each queue's entries in the order given (for inserting or
/// restoring one batch per queue).
pub(crate) fn group_by_queue(
    entries: impl IntoIterator<Item = (Arc<Queue>, Entry)>,
) -> Vec<(Arc<Queue>, Vec<Entry>)> {
    let mut out: Vec<(Arc<Queue>, Vec<Entry>)> = Vec::new();
    for (q, e) in entries {
        match out.iter_mut().find(|(bq, _)| Arc::ptr_eq(bq, &q)) {
            Some((_, v)) => v.push(e),
            None => out.push((q, vec![e])),
        }
    }
    out
}

impl QueueDef {
    /// A definition created now.
    pub fn new(
        id: u64,
        name: String,
        key: String,
        transactional: bool,
        quota_bytes: Option<u64>,
        label: String,
    ) -> Self {
        QueueDef {
            id,
            name,
            key,
            transactional,
            quota_bytes,
            label,
            created_ms: now_ms(),
            role: QueueRole::Normal,
            acl: crate::auth::Acl::default(),
            poison: crate::subqueue::PoisonPolicy::default(),
            journal: crate::journal_queue::JournalPolicy::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Delivery;
    use bytes::Bytes;

    fn msg(priority: u8, body: &str) -> Arc<StoredMessage> {
        Arc::new(StoredMessage {
            id: uuid::Uuid::now_v7(),
            body: Some(Bytes::copy_from_slice(body.as_bytes())),
            body_len: body.len() as u32,
            priority,
            ..StoredMessage::empty()
        })
    }

    fn queue(quota: Option<u64>) -> Queue {
        Queue::new(QueueDef::new(
            1,
            ".\\q".into(),
            "q".into(),
            false,
            quota,
            String::new(),
        ))
    }

    /// Two commits to one transactional queue: the later one's journal write finished first.
    /// Nothing may be handed out (or peeked) past the earlier one's positions until it is in.
    #[test]
    fn transactional_queues_show_commits_in_commit_order() {
        let q = Queue::new(QueueDef::new(
            1,
            ".\\tx".into(),
            "tx".into(),
            true,
            None,
            String::new(),
        ));
        let (a, b) = (vec![msg(0, "a1"), msg(0, "a2")], vec![msg(0, "b1")]);
        let sa: Vec<u64> = q
            .admit(&a)
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let sb: Vec<u64> = q
            .admit(&b)
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(q.insert(vec![Entry::new(sb[0], b[0].clone())]).is_empty());
        assert!(q.peek(10).unwrap().is_empty());
        assert!(q.take(10).unwrap().is_empty());
        let first: Vec<Entry> = sa
            .iter()
            .zip(&a)
            .map(|(s, m)| Entry::new(*s, m.clone()))
            .collect();
        assert!(q.insert(first).is_empty());
        assert_eq!(bodies(&q.peek(10).unwrap()), ["a1", "a2", "b1"]);
        assert_eq!(bodies(&q.take(10).unwrap()), ["a1", "a2", "b1"]);
    }

    /// A queue deleted between a send's admission and its insertion hands the entries back
    /// (their quota is still charged), and says what the dropped ready messages held.
    #[test]
    fn a_deleted_queue_returns_late_inserts_and_its_charges() {
        let q = queue(None);
        let ready = msg(3, "ready");
        let late = msg(3, "late");
        let s = q.admit(&[ready.clone(), late.clone()]).unwrap();
        let (s0, s1) = (*s[0].as_ref().unwrap(), *s[1].as_ref().unwrap());
        assert!(q.insert(vec![Entry::new(s0, ready.clone())]).is_empty());
        assert_eq!(q.mark_deleted(), (ready.charged_bytes(), 0));
        let back = q.insert(vec![Entry::new(s1, late)]);
        assert_eq!(bodies(&back), ["late"]);
    }

    fn bodies(es: &[Entry]) -> Vec<String> {
        es.iter()
            .map(|e| String::from_utf8(e.msg.body.clone().unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn priority_then_fifo() {
        let q = queue(None);
        q.push(&[
            msg(3, "a"),
            msg(7, "b"),
            msg(3, "c"),
            msg(0, "d"),
            msg(7, "e"),
        ])
        .unwrap();
        let got = q.remove(10).unwrap();
        assert_eq!(bodies(&got), ["b", "e", "a", "c", "d"]);
        assert_eq!(q.stats(), QueueStats::default());
    }

    #[test]
    fn restore_puts_back_in_order() {
        let q = queue(None);
        q.push(&[msg(3, "1"), msg(3, "2"), msg(3, "3"), msg(3, "4")])
            .unwrap();
        let first = q.take(2).unwrap();
        let second = q.take(1).unwrap();
        assert!(q.restore(second).is_empty());
        assert!(q.restore(first).is_empty());
        assert_eq!(q.stats().in_flight, 0);
        assert_eq!(bodies(&q.peek(10).unwrap()), ["1", "2", "3", "4"]);
    }

    #[test]
    fn quota_refuses_only_what_does_not_fit() {
        let q = queue(Some(2 * (crate::config::EXPRESS_OVERHEAD_BYTES + 1)));
        let r = q.push(&[msg(3, "a"), msg(3, "b"), msg(3, "c")]).unwrap();
        assert!(r[0].is_ok() && r[1].is_ok());
        assert!(matches!(r[2], Err(BrokerError::QuotaExceeded(_))));
        assert_eq!(q.stats().messages, 2);
    }

    fn timed(priority: u8, body: &str, receive_by_ms: u64) -> Arc<StoredMessage> {
        let mut m = (*msg(priority, body)).clone();
        m.receive_by_ms = receive_by_ms;
        Arc::new(m)
    }

    #[test]
    fn expired_messages_are_never_taken_and_are_swept() {
        let q = queue(None);
        let past = now_ms() - 1;
        let future = now_ms() + 3_600_000;
        q.push(&[
            msg(3, "a"),
            timed(3, "late", past),
            timed(3, "b", future),
            timed(5, "late2", past),
        ])
        .unwrap();
        assert!(q.needs_sweep(now_ms()));
        assert_eq!(bodies(&q.peek(10).unwrap()), ["a", "b"]);
        let got = q.take(10).unwrap();
        assert_eq!(bodies(&got), ["a", "b"]);
        // The expired ones were set aside, counted in flight until the sweep hands them over.
        assert_eq!(q.stats().in_flight, 4);
        let swept = q.sweep(now_ms());
        let mut names = bodies(&swept);
        names.sort();
        assert_eq!(names, ["late", "late2"]);
        q.complete(&swept);
        q.complete(&got);
        assert_eq!(q.stats(), QueueStats::default());
        assert!(!q.needs_sweep(now_ms()));
    }

    #[test]
    fn sweep_finds_waiting_expired_messages() {
        let q = queue(None);
        let soon = now_ms() + 50;
        q.push(&[timed(3, "x", soon), msg(3, "y")]).unwrap();
        assert!(q.sweep(soon - 1).is_empty());
        let swept = q.sweep(soon);
        assert_eq!(bodies(&swept), ["x"]);
        assert_eq!(q.stats().in_flight, 1);
        assert_eq!(bodies(&q.peek(10).unwrap()), ["y"]);
    }

    #[test]
    fn sweeps_wait_for_the_earliest_deadline() {
        let q = queue(None);
        let t = now_ms() + 60_000;
        q.push(&[
            timed(3, "later", t + 10),
            msg(3, "none"),
            timed(3, "first", t),
        ])
        .unwrap();
        assert!(!q.needs_sweep(t - 1), "nothing can have expired yet");
        assert!(q.needs_sweep(t));
        assert_eq!(bodies(&q.sweep(t)), ["first"]);
        assert!(!q.needs_sweep(t + 9), "the next deadline is t + 10");
        assert!(q.needs_sweep(t + 10));
        assert_eq!(bodies(&q.sweep(t + 10)), ["later"]);
        assert!(!q.needs_sweep(u64::MAX - 1));
    }

    #[test]
    fn the_lock_free_sweep_hint_is_never_later_than_a_due_sweep() {
        let q = queue(None);
        assert!(!q.may_need_sweep(u64::MAX - 1), "no timed message");
        let t = now_ms() + 60_000;
        q.push(&[msg(3, "none"), timed(3, "later", t + 10)])
            .unwrap();
        assert!(!q.may_need_sweep(t + 9));
        assert!(q.may_need_sweep(t + 10));
        // Taken: nothing is due any more (made exact by a look under the lock)...
        let taken = q.take(3).unwrap();
        assert!(!q.needs_sweep(u64::MAX - 1));
        assert!(!q.may_need_sweep(u64::MAX - 1));
        // ... and given back: due again at its deadline.
        assert!(q.restore(taken).is_empty());
        assert!(!q.may_need_sweep(t + 9));
        assert!(q.may_need_sweep(t + 10));
        q.push(&[timed(3, "first", t)]).unwrap();
        assert!(q.may_need_sweep(t));
        assert_eq!(bodies(&q.sweep(t)), ["first"]);
        assert!(!q.may_need_sweep(t + 9), "exact again after a sweep");
        assert_eq!(bodies(&q.sweep(t + 10)), ["later"]);
        assert!(!q.may_need_sweep(u64::MAX - 1), "nothing timed is left");
        // A take that finds an expired message sets it aside: due at once.
        let q = queue(None);
        q.push(&[timed(3, "late", now_ms() - 1), msg(3, "on time")])
            .unwrap();
        q.sweep(0); // exact: nothing set aside yet, the deadline is in the past
        assert_eq!(bodies(&q.take(3).unwrap()), ["on time"]);
        assert!(q.may_need_sweep(0), "the expired one waits for the sweep");
    }

    #[test]
    fn the_broker_wide_sweep_hint_follows_every_queue() {
        let changes = Arc::new(crate::counters_store::ChangedQueues::default());
        let hint = Arc::new(SweepHint::default());
        let def = |id: u64| {
            QueueDef::new(
                id,
                format!(".\\q{id}"),
                format!("q{id}"),
                false,
                None,
                String::new(),
            )
        };
        let a = Queue::new_counted(def(1), &changes, &hint);
        let b = Queue::new_counted(def(2), &changes, &hint);
        assert!(!hint.due(u64::MAX - 1), "no timed message anywhere");
        let t = now_ms() + 60_000;
        a.push(&[timed(3, "a", t + 10)]).unwrap();
        assert!(!hint.due(t + 9));
        assert!(hint.due(t + 10), "a push lowers the broker's hint");
        // A walk forgets the bound and folds back what each queue says...
        hint.start_walk();
        assert!(!hint.due(t + 10));
        hint.lower(a.sweep_at());
        assert!(hint.due(t + 10));
        // ... and a deadline added during a walk, after the reset, lowers it by itself.
        hint.start_walk();
        b.push(&[timed(3, "b", t)]).unwrap();
        assert!(hint.due(t), "a queue's lowering after the reset stays");
        // Given back after a take: lowered again.
        hint.start_walk();
        let taken = a.take(1).unwrap();
        assert!(!hint.due(u64::MAX - 1));
        assert!(a.restore(taken).is_empty());
        assert!(hint.due(t + 10), "a restore lowers the broker's hint");
        // A queue made without the hint (internal ones, never walked) leaves it alone.
        hint.start_walk();
        queue(None).push(&[timed(3, "c", t)]).unwrap();
        assert!(!hint.due(u64::MAX - 1));
    }

    fn outgoing_queue() -> Queue {
        let mut def = QueueDef::new(1, "o".into(), "o".into(), false, None, String::new());
        def.role = QueueRole::Outgoing {
            destination: "127.0.0.1:1".into(),
            stream_id: uuid::Uuid::now_v7(),
            paused: false,
        };
        Queue::new(def)
    }

    #[test]
    fn outgoing_queues_are_fifo_whatever_the_priority() {
        let q = outgoing_queue();
        q.push(&[msg(1, "1"), msg(7, "2"), msg(3, "3")]).unwrap();
        let first = q.take_bounded(2, usize::MAX).unwrap();
        assert_eq!(bodies(&first), ["1", "2"]);
        assert!(q.restore(first).is_empty());
        assert_eq!(bodies(&q.take(10).unwrap()), ["1", "2", "3"]);
    }

    /// An application's queue shows messages in their order too (helper-70): an express
    /// message admitted after a recoverable one still being stored waits for it, whatever
    /// their priorities, and a position given back by a cancelled task (the guard dropped)
    /// releases what follows.
    #[test]
    fn applications_queues_hold_back_everything_after_a_send_still_being_stored() {
        let q = Queue::new(QueueDef::new(
            1,
            ".\\q".into(),
            "q".into(),
            false,
            None,
            String::new(),
        ));
        let (r0, e1, e2) = (msg(3, "r0"), msg(3, "e1"), msg(7, "e2"));
        let s = q.admit(&[r0.clone(), e1.clone(), e2.clone()]).unwrap();
        let s: Vec<u64> = s.into_iter().map(Result::unwrap).collect();
        assert!(q
            .insert(vec![Entry::new(s[1], e1), Entry::new(s[2], e2)])
            .is_empty());
        assert!(q.take(10).unwrap().is_empty(), "e1 and e2 must wait for r0");
        assert!(q.insert(vec![Entry::new(s[0], r0)]).is_empty());
        assert_eq!(bodies(&q.take(10).unwrap()), ["e2", "r0", "e1"]);
        let c = msg(3, "c");
        let sc = q.admit(std::slice::from_ref(&c)).unwrap()[0]
            .clone()
            .unwrap();
        let guard = q.unadmit_on_drop(sc, c.charged_bytes());
        q.push(&[msg(3, "d")]).unwrap();
        assert!(q.take(10).unwrap().is_empty(), "d must wait for c");
        drop(guard);
        assert_eq!(bodies(&q.take(10).unwrap()), ["d"]);
    }

    #[test]
    fn outgoing_queues_hold_back_everything_after_a_send_still_being_stored() {
        let q = outgoing_queue();
        let (a, b, c) = (msg(3, "a"), msg(3, "b"), msg(3, "c"));
        // Two concurrent sends: a (seq 1) is still being written when b (seq 2) is done.
        let sa = q.admit(std::slice::from_ref(&a)).unwrap()[0]
            .clone()
            .unwrap();
        let sb = q.admit(std::slice::from_ref(&b)).unwrap()[0]
            .clone()
            .unwrap();
        let sc = q.admit(std::slice::from_ref(&c)).unwrap()[0]
            .clone()
            .unwrap();
        assert!(q.insert(vec![Entry::new(sb, b)]).is_empty());
        assert!(q.take(10).unwrap().is_empty(), "b must wait for a");
        assert!(q.insert(vec![Entry::new(sa, a)]).is_empty());
        assert_eq!(bodies(&q.take(10).unwrap()), ["a", "b"]);
        // A failed write gives its position back and releases what follows.
        q.push(&[msg(3, "d")]).unwrap();
        assert!(q.take(10).unwrap().is_empty());
        q.unadmit(sc, c.charged_bytes());
        assert_eq!(bodies(&q.take(10).unwrap()), ["d"]);
    }

    #[test]
    fn take_within_stops_before_the_message_that_does_not_fit_and_keeps_the_order() {
        let q = queue(None);
        q.push(&[msg(5, "aaaa"), msg(3, "bbbbbbbb"), msg(3, "cc")])
            .unwrap();
        // 4 + 10 fits 14; the next (8 + 10) does not, and "cc" behind it must wait too.
        assert_eq!(bodies(&q.take_within(10, 30, 10).unwrap()), ["aaaa"]);
        // The first message is taken whatever its size.
        assert_eq!(bodies(&q.take_within(10, 1, 10).unwrap()), ["bbbbbbbb"]);
        assert_eq!(bodies(&q.take_within(10, 12, 10).unwrap()), ["cc"]);
        assert!(q.take_within(10, 100, 0).unwrap().is_empty());
        q.push(&[msg(3, "1"), msg(3, "2"), msg(3, "3")]).unwrap();
        assert_eq!(bodies(&q.take_within(10, 22, 10).unwrap()), ["1", "2"]);
        assert_eq!(bodies(&q.take_within(10, 33, 10).unwrap()), ["3"]);
    }

    #[test]
    fn take_bounded_stops_at_bytes_but_takes_one() {
        let q = queue(None);
        q.push(&[msg(3, "aaaa"), msg(3, "bbbb"), msg(3, "cccc")])
            .unwrap();
        assert_eq!(bodies(&q.take_bounded(10, 1).unwrap()), ["aaaa"]);
        assert_eq!(bodies(&q.take_bounded(10, 5).unwrap()), ["bbbb", "cccc"]);
    }

    #[test]
    fn peek_pages_cover_the_queue_once_in_receive_order() {
        let q = queue(None);
        q.push(&[
            msg(3, "a"),
            msg(7, "b"),
            msg(3, "c"),
            msg(0, "d"),
            msg(7, "e"),
        ])
        .unwrap();
        let mut cursor = None;
        let mut seen = Vec::new();
        loop {
            let (page, next) = q.peek_page(cursor, 2, usize::MAX).unwrap();
            assert!(page.len() <= 2);
            seen.extend(bodies(&page));
            match next {
                Some(c) => cursor = Some(PeekCursor::decode(&c.encode()).unwrap().unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, ["b", "e", "a", "c", "d"]);
        // A byte budget cuts the page, but never below one message.
        let (page, next) = q.peek_page(None, 100, 1).unwrap();
        assert_eq!(bodies(&page), ["b"]);
        assert!(next.is_some());
        assert!(PeekCursor::decode(&[9; 9]).is_err());
        assert!(PeekCursor::decode(&[1, 2]).is_err());
    }

    #[test]
    fn reserved_quota_refuses_other_sends_until_released() {
        let charge = crate::config::EXPRESS_OVERHEAD_BYTES + 1;
        let q = queue(Some(2 * charge));
        q.reserve_quota(charge).unwrap();
        q.reserve_quota(charge).unwrap();
        assert!(matches!(
            q.reserve_quota(charge),
            Err(BrokerError::QuotaExceeded(_))
        ));
        assert!(q.push(&[msg(3, "a")]).unwrap()[0].is_err());
        q.release_quota(charge);
        assert!(q.push(&[msg(3, "a")]).unwrap()[0].is_ok());
        let seq = q.admit_reserved().unwrap();
        assert!(q.insert(vec![Entry::new(seq, msg(3, "b"))]).is_empty());
        assert_eq!(bodies(&q.peek(10).unwrap()), ["a", "b"]);
    }

    fn with_corr(priority: u8, body: &str, corr: &str) -> Arc<StoredMessage> {
        let mut m = (*msg(priority, body)).clone();
        m.correlation_id = corr.into();
        Arc::new(m)
    }

    /// By id and by correlation id from the middle of the queue: the rest keeps its order,
    /// the tombstone is invisible, a restore puts the message back in its place, and the
    /// index follows every way in and out (take, sweep, purge).
    #[test]
    fn take_by_id_and_correlation_leave_order_and_restore_in_place() {
        let q = queue(None);
        let ms = [
            with_corr(3, "a", "x"),
            with_corr(3, "b", "y"),
            with_corr(5, "c", "y"),
            with_corr(3, "d", ""),
        ];
        q.push(&ms).unwrap();
        let b = q.take_by(&Select::Id(ms[1].id)).unwrap().unwrap();
        assert_eq!(bodies(std::slice::from_ref(&b)), ["b"]);
        assert!(q.take_by(&Select::Id(ms[1].id)).unwrap().is_none());
        assert_eq!(bodies(&q.peek(10).unwrap()), ["c", "a", "d"]);
        assert_eq!(q.stats().in_flight, 1);
        // The first "y" in receive order is c (priority 5), then none is left.
        let c = q
            .take_by(&Select::Correlation("y".into()))
            .unwrap()
            .unwrap();
        assert_eq!(bodies(std::slice::from_ref(&c)), ["c"]);
        assert!(q
            .peek_by(&Select::Correlation("y".into()))
            .unwrap()
            .is_none());
        // The tombstone keeps no reference to b's message: the taken entry holds the only one
        // besides this test's.
        assert_eq!(
            Arc::strong_count(&b.msg),
            2,
            "a tombstone keeps b's message"
        );
        // Back: b returns to its own place (into its tombstone), and is found again.
        assert!(q.restore(vec![b]).is_empty());
        assert_eq!(bodies(&q.peek(10).unwrap()), ["a", "b", "d"]);
        assert_eq!(
            bodies(&[q
                .peek_by(&Select::Correlation("y".into()))
                .unwrap()
                .unwrap()]),
            ["b"]
        );
        // A plain take removes from the index: a is no longer found by id.
        assert_eq!(bodies(&q.take(1).unwrap()), ["a"]);
        assert!(q.peek_by(&Select::Id(ms[0].id)).unwrap().is_none());
        q.complete(&[c]);
        assert_eq!(bodies(&q.take(10).unwrap()), ["b", "d"]);
        assert_eq!(q.stats().in_flight, 3);
        // Cursor positions: at, after.
        q.push(&[msg(3, "e"), msg(3, "f")]).unwrap();
        let e = q.peek_by(&Select::Head).unwrap().unwrap();
        let pe = q.position(&e);
        let f = q.peek_by(&Select::After(Some(pe))).unwrap().unwrap();
        assert_eq!(bodies(&[e, f.clone()]), ["e", "f"]);
        assert!(q.take_by(&Select::At(pe)).unwrap().is_some());
        assert!(q.peek_by(&Select::At(pe)).unwrap().is_none());
        assert_eq!(
            bodies(&[q.peek_by(&Select::After(Some(pe))).unwrap().unwrap()]),
            ["f"]
        );
        assert_eq!(q.purge().len(), 1);
        assert!(q.peek_by(&Select::Id(f.msg.id)).unwrap().is_none());
    }

    /// Many takes from the middle: tombstones are compacted, counts stay right, and every
    /// message is found exactly once.
    #[test]
    fn many_takes_by_id_compact_tombstones() {
        let q = queue(None);
        let ms: Vec<_> = (0..5000).map(|i| msg(3, &i.to_string())).collect();
        q.push(&ms).unwrap();
        for m in ms.iter().skip(1).step_by(2) {
            assert_eq!(q.take_by(&Select::Id(m.id)).unwrap().unwrap().msg.id, m.id);
        }
        assert!(q.lock().tombstones < 2500, "compacted");
        assert_eq!(q.stats().in_flight, 2500);
        let rest = q.take(10_000).unwrap();
        assert_eq!(rest.len(), 2500);
        assert!(rest
            .iter()
            .zip(ms.iter().step_by(2))
            .all(|(e, m)| e.msg.id == m.id));
        assert_eq!(q.lock().tombstones, 0);
        assert!(q.index_bytes() > 0 || q.lock().index.bytes() == 0);
    }

    #[test]
    fn purge_and_delete() {
        let q = queue(None);
        q.push(&[msg(3, "a"), msg(3, "b")]).unwrap();
        let inflight = q.take(1).unwrap();
        assert_eq!(q.purge().len(), 1);
        assert_eq!(q.stats().messages, 1);
        q.complete(&inflight);
        assert_eq!(q.stats(), QueueStats::default());
        let _ = q.mark_deleted();
        assert!(q.push(&[msg(3, "x")]).is_err());
    }

    /// A journal stand-in for paged headers: every message put, by seq, and the reads made.
    #[derive(Default)]
    struct Headers {
        msgs: Mutex<std::collections::HashMap<u64, StoredMessage>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl HeaderSource for Headers {
        fn headers(&self, _queue: u64, seqs: &[u64]) -> Result<Vec<StoredMessage>, BrokerError> {
            self.reads.fetch_add(seqs.len(), Ordering::Relaxed);
            let m = self.msgs.lock().unwrap();
            seqs.iter()
                .map(|s| {
                    m.get(s)
                        .cloned()
                        .ok_or_else(|| BrokerError::Internal(format!("no header {s}")))
                })
                .collect()
        }
    }

    /// A queue that pages with a window of 4, and its header store.
    fn paged_queue() -> (Queue, Arc<Headers>) {
        let q = queue(None);
        let h = Arc::new(Headers::default());
        q.set_paging(Paging {
            window: 4,
            share: None,
            source: h.clone(),
        });
        (q, h)
    }

    /// A recoverable message named by its label (its body is in the "journal").
    fn rec(priority: u8, label: &str) -> Arc<StoredMessage> {
        let mut m = (*msg(priority, label)).clone();
        m.label = label.into();
        m.delivery = Delivery::Recoverable;
        m.body = None;
        Arc::new(m)
    }

    /// Sends as the broker does: admit, "store" the header, insert.
    fn send(q: &Queue, h: &Headers, msgs: &[Arc<StoredMessage>]) {
        let seqs = q.admit(msgs).unwrap();
        let mut entries = Vec::new();
        for (s, m) in seqs.into_iter().zip(msgs) {
            let s = s.unwrap();
            if m.delivery == Delivery::Recoverable {
                h.msgs.lock().unwrap().insert(s, (**m).clone());
            }
            entries.push(Entry::new(s, m.clone()));
        }
        assert!(q.insert(entries).is_empty());
    }

    fn labels(es: &[Entry]) -> Vec<String> {
        es.iter().map(|e| e.msg.label.clone()).collect()
    }

    fn paged(q: &Queue) -> usize {
        q.paged_out()
    }

    /// Priority then FIFO across the window's edge, with an express message (kept in memory)
    /// in the middle of a paged tail; peeks and pages see the same order without moving
    /// anything; takes read the tail's headers in as the window empties.
    #[test]
    fn paged_queues_keep_priority_and_fifo_order() {
        let (q, h) = paged_queue();
        let mut want_hi = Vec::new();
        let mut want_lo = Vec::new();
        for i in 0..10 {
            send(
                &q,
                &h,
                &[rec(3, &format!("lo{i}")), rec(5, &format!("hi{i}"))],
            );
            want_lo.push(format!("lo{i}"));
            want_hi.push(format!("hi{i}"));
            if i == 6 {
                let mut e = (*msg(3, "x")).clone();
                e.label = "express".into();
                send(&q, &h, &[Arc::new(e)]);
                want_lo.push("express".into());
            }
        }
        let want: Vec<String> = want_hi.iter().chain(&want_lo).cloned().collect();
        assert_eq!(paged(&q), 12, "two levels of 10 (+1 express) keep 4 each");
        assert_eq!(q.stats().messages, 21);
        assert_eq!(labels(&q.peek(100).unwrap()), want);
        assert_eq!(labels(&q.peek(6).unwrap()), want[..6]);
        let mut cursor = None;
        let mut seen = Vec::new();
        loop {
            let (page, next) = q.peek_page(cursor, 3, usize::MAX).unwrap();
            seen.extend(labels(&page));
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, want);
        assert_eq!(paged(&q), 12, "peeks move nothing");
        let mut got = Vec::new();
        let mut gave_back = false;
        loop {
            let t = q.take(3).unwrap();
            if t.is_empty() {
                break;
            }
            // A given-back batch returns to its place, paged or not.
            if got.len() == 6 && !gave_back {
                assert!(q.restore(t).is_empty());
                gave_back = true;
                continue;
            }
            got.extend(t);
        }
        assert_eq!(labels(&got), want);
        assert!(h.reads.load(Ordering::Relaxed) >= 12);
        q.complete(&got);
        assert_eq!(q.stats(), QueueStats::default());
        assert_eq!(paged(&q), 0);
    }

    /// By id and correlation id in a paged tail: found, taken from its place, given back into
    /// it; the cursor positions of paged messages work as any other.
    #[test]
    fn paged_messages_are_found_by_id_and_correlation() {
        let (q, h) = paged_queue();
        let ms: Vec<_> = (0..12)
            .map(|i| {
                let mut m = (*rec(3, &format!("m{i}"))).clone();
                m.correlation_id = format!("c{}", i % 3);
                Arc::new(m)
            })
            .collect();
        send(&q, &h, &ms);
        assert_eq!(paged(&q), 8);
        let m9 = q.take_by(&Select::Id(ms[9].id)).unwrap().unwrap();
        assert_eq!(m9.msg.label, "m9");
        assert!(q.peek_by(&Select::Id(ms[9].id)).unwrap().is_none());
        assert_eq!(q.stats().in_flight, 1);
        // The first "c1" is m1 (in the window), then m4, m7 (paged), m10 (m9 is taken).
        let c = q
            .take_by(&Select::Correlation("c1".into()))
            .unwrap()
            .unwrap();
        assert_eq!(c.msg.label, "m1");
        let c = q
            .take_by(&Select::Correlation("c1".into()))
            .unwrap()
            .unwrap();
        assert_eq!(c.msg.label, "m4");
        assert!(q.restore(vec![c, m9]).is_empty());
        let all = labels(&q.peek(100).unwrap());
        let want: Vec<String> = (0..12)
            .filter(|&i| i != 1)
            .map(|i| format!("m{i}"))
            .collect();
        assert_eq!(all, want, "given back in place");
        // Cursor positions of paged messages.
        let m8 = q.peek_by(&Select::Id(ms[8].id)).unwrap().unwrap();
        let p8 = q.position(&m8);
        let next = q.peek_by(&Select::After(Some(p8))).unwrap().unwrap();
        assert_eq!(next.msg.label, "m9");
        assert_eq!(q.take_by(&Select::At(p8)).unwrap().unwrap().msg.label, "m8");
        assert!(q.peek_by(&Select::At(p8)).unwrap().is_none());
        // Everything else, in order.
        let rest = q.take(100).unwrap();
        let want: Vec<String> = (0..12)
            .filter(|&i| i != 1 && i != 8)
            .map(|i| format!("m{i}"))
            .collect();
        assert_eq!(labels(&rest), want);
    }

    /// A paged message expires on time: the sweep reads the tail's headers when its earliest
    /// deadline is due, takes the expired one, and leaves the others paged.
    #[test]
    fn paged_messages_expire() {
        let (q, h) = paged_queue();
        let t = now_ms() + 60_000;
        let mut ms: Vec<_> = (0..8).map(|i| rec(3, &format!("m{i}"))).collect();
        let mut late = (*rec(3, "late")).clone();
        late.receive_by_ms = t;
        ms.insert(6, Arc::new(late));
        send(&q, &h, &ms);
        assert_eq!(paged(&q), 5);
        assert!(!q.needs_sweep(t - 1));
        assert!(q.needs_sweep(t));
        let swept = q.sweep(t);
        assert_eq!(labels(&swept), ["late"]);
        assert_eq!(paged(&q), 4);
        assert!(!q.needs_sweep(u64::MAX - 1), "nothing timed is left");
        q.complete(&swept);
        assert_eq!(labels(&q.take(100).unwrap()).len(), 8);
        // An expired paged message is never handed out: a take sets it aside for the sweep.
        let (q, h) = paged_queue();
        let mut ms: Vec<_> = (0..6).map(|i| rec(3, &format!("m{i}"))).collect();
        let mut gone = (*rec(3, "gone")).clone();
        gone.receive_by_ms = now_ms() - 1;
        ms.push(Arc::new(gone));
        send(&q, &h, &ms);
        let got = q.take(100).unwrap();
        assert_eq!(labels(&got).len(), 6);
        assert_eq!(labels(&q.sweep(now_ms())), ["gone"]);
    }

    /// A sweep takes a bounded batch (count, body bytes, at least one), in its window and its
    /// paged tail alike, and leaves the rest due: 14 expired messages (4 in the window, 10
    /// paged) come out 5, 5, 4 by count; then by bytes, one at a time when each is bigger.
    #[test]
    fn a_sweep_takes_a_bounded_batch_and_leaves_the_rest_due() {
        let (q, h) = paged_queue();
        let t = now_ms() + 60_000;
        let ms: Vec<_> = (0..14)
            .map(|i| {
                let mut m = (*rec(3, &format!("m{i}"))).clone();
                m.receive_by_ms = t;
                m.body_len = 10;
                Arc::new(m)
            })
            .collect();
        send(&q, &h, &ms);
        assert_eq!(paged(&q), 10);
        let mut got = Vec::new();
        for want in [5, 5, 4] {
            assert!(q.needs_sweep(t), "the rest is due");
            let swept = q.sweep_some(t, 5, u64::MAX);
            assert_eq!(swept.len(), want);
            got.extend(labels(&swept));
        }
        assert_eq!(got, (0..14).map(|i| format!("m{i}")).collect::<Vec<_>>());
        assert!(q.sweep_some(t, 5, u64::MAX).is_empty());
        assert!(!q.needs_sweep(u64::MAX - 1), "nothing timed is left");
        // By bytes: 25 bytes hold two bodies of 10 and reach the bound with the third.
        let (q, h) = paged_queue();
        send(&q, &h, &ms);
        assert_eq!(q.sweep_some(t, 100, 25).len(), 3);
        assert_eq!(q.sweep_some(t, 100, 1).len(), 1, "at least one");
        assert_eq!(q.sweep_some(t, 100, 1000).len(), 10);
    }

    /// A sweep that stops with a full batch goes on where it stopped: 300 paged messages
    /// without a deadline before 40 that expire are read once, not once per batch (helper-56:
    /// 1,000,000 before 400,000 read 6.5 GB of headers, 42 s, one batch of 4,096 at a time).
    #[test]
    fn a_bounded_sweep_reads_on_from_where_it_stopped() {
        let (q, h) = paged_queue();
        let t = now_ms() + 60_000;
        let mut ms: Vec<_> = (0..304).map(|i| rec(3, &format!("keep{i}"))).collect();
        ms.extend((0..40).map(|i| {
            let mut m = (*rec(3, &format!("gone{i}"))).clone();
            m.receive_by_ms = t;
            Arc::new(m)
        }));
        send(&q, &h, &ms);
        let mut got = Vec::new();
        for _ in 0..4 {
            assert!(q.needs_sweep(t));
            got.extend(labels(&q.sweep_some(t, 10, u64::MAX)));
        }
        assert_eq!(got, (0..40).map(|i| format!("gone{i}")).collect::<Vec<_>>());
        assert!(q.sweep_some(t, 10, u64::MAX).is_empty());
        // The first sweep reads 340 headers (the 300 kept and the first 40 it comes to), the
        // others only what is left after where the last one stopped: 30, 20, 10.
        let reads = h.reads.load(Ordering::Relaxed);
        assert!(reads <= 400, "{reads} headers read");
        // A message given back behind where a sweep goes on still counts for the deadline.
        assert!(!q.needs_sweep(u64::MAX - 1), "nothing timed is left");
    }

    /// Purge, delete and the quota with a paged tail: every charge and count comes back.
    #[test]
    fn paged_queues_purge_and_delete_with_their_charges() {
        let (q, h) = paged_queue();
        let ms: Vec<_> = (0..10).map(|i| rec(3, &format!("m{i}"))).collect();
        send(&q, &h, &ms);
        let taken = q.take(1).unwrap();
        let purged = q.purge();
        assert_eq!(labels(&purged).len(), 9);
        assert_eq!(q.stats().messages, 1);
        q.complete(&taken);
        assert_eq!(q.stats(), QueueStats::default());
        assert_eq!(q.lock().charged, 0);
        send(&q, &h, &ms);
        let charge: u64 = ms.iter().map(|m| m.charged_bytes()).sum();
        assert_eq!(q.mark_deleted(), (0, charge));
    }
}
