//! The writer thread: group commit, segment rolling, and compaction.
//!
//! One thread owns the active segment. It blocks for the first submission, drains whatever
//! else is already queued (up to `max_batch_bytes`), encodes everything into one [`Gather`]
//! (headers copied, large bodies by reference), issues one (vectored) write and ONE
//! `fdatasync`, applies the ops to the index, then completes every waiter. There is no timer: a lone submission waits for exactly one sync, and under load
//! one sync covers every record that queued up during the previous one.
//!
//! The writer lives behind a mutex that its thread holds while it works and releases only while
//! it waits for work (`Writer::run`). While it is released and nothing is queued, a caller of
//! `Journal::submit_awaited` takes it and commits its one record on its own thread
//! ([`Writer::commit_inline`]): the same group commit, of a batch of one, with no thread
//! hand-off to the writer and back. Anything submitted meanwhile waits in the queue, and the
//! thread, woken by it, waits for the lock: order on disk is submission order as before. An
//! inline commit that leaves the thread work it would otherwise only find at its next wake-up
//! (zeros to lay ahead, a sealed or droppable segment) wakes it (`Msg::Wake`).
//!
//! After a batch of one small submission with nothing else queued, it watches its queues for
//! `JournalOptions::idle_spin` before it sleeps (`spin_idle`), so that a caller that awaits each
//! commit before making the next one finds it awake: no futex wake-up on either side.
//!
//! Every write starts with a record flagged `WRITE_START` (format version 2, `record.rs`): recovery
//! uses it to tell a torn last write from damage to synced records (see `recovery.rs`).
//!
//! A full disk (ENOSPC while creating a segment or writing) fails the records concerned with
//! [`JournalError::NoSpace`] and switches to disk-full mode instead of poisoning: records that
//! store data (Put, DefineQueue) are refused, records that only free data are still written,
//! if need be into a segment made from the space of the reserve file. Compaction then only
//! drops segments that hold nothing live. Growing submissions retry (at most every
//! [`DISK_FULL_RETRY`]) by allocating the reserve again; once that works, the mode ends.
//! Only a failed `fdatasync` (or another I/O error) poisons.
//!
//! Compaction runs on this same thread, one bounded step (at most `max_batch_bytes` copied,
//! or one segment dropped) between batches, and continuously when idle, so it never races
//! the writer and never starves senders for more than one step. A segment sealed in this run
//! that still holds live ops is left alone for `compact_grace` (1 s): under a steady flow its
//! live ops are the messages in flight, consumed within milliseconds, and copying them would
//! be wasted work on the thread every commit waits for. When a segment holds few live ops
//! and the index is small, compaction finds them through the index and copies them in one
//! step ([`Writer::live_from_index`]) instead of walking the whole segment for them (a queue
//! definition alone made every 64 MiB segment be read and decoded in 8 steps of 3-6 ms).
//!
//! # Why dropping only the oldest segment is safe
//!
//! Replay applies records in file order; a tombstone (Remove, Purge, DeleteQueue) kills what
//! the index holds when it is applied, i.e. matching records *earlier* in file order, and
//! matches on `(queue, seq)` or `queue` only, never on position. Let S be the oldest segment.
//! - Dead records of S: whatever killed them (a tombstone or a newer Put/DefineQueue of the
//!   same key) lies in S or later. Dropping S drops them; the killers then kill nothing,
//!   which gives the same live set.
//! - Tombstones in S refer only to records in S or older; older segments are already gone
//!   and S goes now, so they have nothing left to kill.
//! - Live records of S are first copied, as ordinary synced records, to the end of the
//!   journal. A live record was matched by no later tombstone (or it would be dead), and
//!   tombstones match by key, so moving it past them changes nothing. If we crash after the
//!   copy but before S is unlinked, replay sees the record twice and the later copy wins,
//!   which is the same state.
//! - Dropping S must not lower the ids recovery reports as "highest ever seen", so before S
//!   is unlinked a Mark (watermark) record is synced to the active segment.
//!
//! Dropping a segment other than the oldest would not be safe: its tombstones could still
//! refer to live-looking records in an older segment, which would come back to life.

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::{Receiver, TryRecvError};
use tokio::sync::oneshot;

use super::error::JournalError;
use super::gather::{Gather, Sink};
use super::index::{Key, Loc, SegMeta};
use super::io::{Io, SegmentFile};
use super::op::{decode_payload, Entry, Op};
use super::record::{
    decode_frame, encode_frame, set_write_start, Frame, FRAME_HEADER, WRITE_START,
};
use super::segment::{check_header, encode_header, segment_path, HEADER_LEN};
use super::{Chain, JournalOptions, Shared, DISK_FULL_RETRY};

pub(crate) type Done = oneshot::Sender<Result<(), JournalError>>;

pub(crate) enum Msg {
    Submit {
        ops: Vec<Op>,
        /// Encoded size, for batch limits.
        size: usize,
        done: Done,
        /// Nobody waits for it: a failure poisons the journal (`Journal::submit_detached`).
        detached: bool,
        /// Written only if the earlier submissions of this chain were (`Journal::submit_chained`).
        chain: Option<Chain>,
    },
    Shutdown,
    /// Nothing to write: wakes the thread for its own work after an inline commit
    /// ([`Writer::commit_inline`]).
    Wake,
}

/// Empties the writer's slot when its thread's loop ends, also by a panic (which poisons the
/// slot's mutex): the writer, and with it the receiving ends of its queues, is dropped, so later
/// submissions fail at once (the channel is closed) instead of waiting in a queue nobody reads,
/// and no inline commit can take it.
struct EmptyOnExit(Arc<Mutex<Option<Writer>>>);

impl Drop for EmptyOnExit {
    fn drop(&mut self) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // A stop that was not a panic took the writer and finished it already.
        if let Some(w) = g.take() {
            // A panic (on this thread, or on a caller's in an inline commit, which left the
            // mutex poisoned): the writer's state is not to be trusted. Refuse every later
            // write, and fail what is queued instead of leaving it to wait forever.
            let e = JournalError::io(
                "run the writer of",
                w.shared.dir.clone(),
                std::io::Error::other("the journal's writer panicked"),
            );
            tracing::error!(error = %e, "journal poisoned: refusing all further writes");
            w.shared.poison(&e);
            w.fail_queued(&w.shared.poisoned_error().unwrap_or(e));
        }
    }
}

/// What one turn of the writer's loop leaves to do next.
enum Turn {
    Continue,
    Wait(Wait),
    Stop,
}

/// What the writer waits for, with its lock released.
#[derive(Clone, Copy)]
enum Wait {
    /// A submission on either queue.
    Submission,
    /// A submission, or the deadline (compaction is due then).
    Until(Instant),
    /// A submission, or [`DISK_FULL_RETRY`] (then one compaction step, which waits for space).
    RetryCompaction,
}

impl Wait {
    /// Blocks until a queue has something (or is disconnected) or the time is up; returns
    /// whether the time was up.
    fn block(self, rx: &Receiver<Msg>, urgent: &Receiver<Msg>) -> bool {
        let mut sel = crossbeam_channel::Select::new();
        sel.recv(rx);
        sel.recv(urgent);
        match self {
            Wait::Submission => {
                sel.ready();
                false
            }
            Wait::Until(due) => sel.ready_deadline(due).is_err(),
            Wait::RetryCompaction => sel.ready_timeout(DISK_FULL_RETRY).is_err(),
        }
    }
}

/// One submission in a batch.
struct Sub {
    ops: Vec<Op>,
    done: Done,
    detached: bool,
    chain: Option<Chain>,
}

impl Sub {
    fn complete(self, shared: &Shared, r: Result<(), JournalError>) {
        if let (true, Err(e)) = (self.detached, &r) {
            if !e.is_poisoned() {
                tracing::error!(error = %e, "journal: a record nobody waited for failed");
                shared.poison(e);
            }
        }
        if let (Some(c), Err(e)) = (&self.chain, &r) {
            c.break_with(e);
        }
        // Before the answer, so a waiter that got it never still sees it pending.
        shared.pending.fetch_sub(1, Ordering::AcqRel);
        let _ = self.done.send(r);
    }
}

/// Encodes `ops` as one record at the end of `buf`: the record's range and each op's.
fn encode_record(buf: &mut Gather, ops: &[Op]) -> (Range<usize>, Vec<Range<usize>>) {
    let start = buf.len();
    let mut ranges = Vec::with_capacity(ops.len());
    encode_frame(buf, |out| {
        for op in ops {
            let s = out.len();
            op.encode(out);
            ranges.push(s..out.len());
        }
    });
    (start..buf.len(), ranges)
}

/// Puts a written record's ops (`ranges` of them in the batch's buffer, the record at `rec`
/// of it) into the index: the record starts at `(segment, offset)`.
fn index_record(
    idx: &mut super::index::Index,
    ops: &[Op],
    ranges: &[Range<usize>],
    rec: &Range<usize>,
    (seg, file_off): (u64, u64),
) {
    for (op, r) in ops.iter().zip(ranges) {
        let loc = Loc {
            seg,
            off: file_off + (r.start - rec.start) as u64,
            len: r.len() as u32,
        };
        idx.apply(op, loc, false);
    }
}

/// Whether a submission stores data (refused while the disk is full) or only frees it.
fn stores_data(ops: &[Op]) -> bool {
    ops.iter()
        .any(|op| matches!(op, Op::Put { .. } | Op::DefineQueue { .. }))
}

pub(crate) struct Active {
    pub seg: u64,
    pub file: Arc<dyn SegmentFile>,
    pub cap: u64,
    pub pos: u64,
    /// Format version 2: records carry the write-start flag.
    pub flags: bool,
    /// End of bytes a failed (ENOSPC) write may have left after `pos`; zeroed before the
    /// segment is sealed or overwritten by a shorter write. 0: none.
    pub stale_end: u64,
    /// Bytes before this are written (records, or zeros laid ahead of them) and synced
    /// (`JournalOptions::zero_ahead_bytes`); what lies after may be unwritten space.
    pub zeroed: u64,
}

pub(crate) struct Writer {
    pub shared: Arc<Shared>,
    pub rx: Receiver<Msg>,
    /// Removals of durable records (`Journal::submit_removal`): taken into the very next batch,
    /// ahead of whatever queues in `rx`, so an acknowledged message's removal is never stuck
    /// behind a backlog of sends.
    pub urgent: Receiver<Msg>,
    pub opts: JournalOptions,
    pub active: Active,
    /// The bytes of the next write: small parts copied, large bodies by reference.
    pub buf: Gather,
    /// Size of the reserve file (0: none kept).
    reserve_len: u64,
    /// The reserve file exists at full size.
    has_reserve: bool,
    /// Disk-full mode: the next attempt to leave it is not before this.
    retry_at: Instant,
    /// After a compaction step failed for want of space: not again before this.
    compact_retry_at: Option<Instant>,
    /// Unlinks dropped segments off this thread (see `unlink.rs`).
    unlinker: super::unlink::Unlinker,
    /// Compaction's walk of the oldest sealed segment.
    walk: Option<Walk>,
    /// When each segment sealed in this run was sealed (for `compact_grace`).
    sealed_at: BTreeMap<u64, Instant>,
    /// Is the oldest sealed segment being drained? `(segment, since, its live bytes then)`:
    /// see [`Writer::draining_until`].
    drain_probe: std::cell::Cell<Option<(u64, Instant, u64)>>,
    /// Bytes of zeros to keep ahead of the records (0: off; see `zero_ahead_step`).
    zero_ahead: u64,
    /// The last batch was one small submission: the writer spins before it sleeps
    /// (`JournalOptions::idle_spin`, `spin_idle`).
    lone_commit: bool,
    /// Spins in a row that ended with nothing taken.
    spin_misses: u32,
    /// Lone commits left after which the writer tries a spin again (after
    /// [`SPIN_MISS_LIMIT`] misses in a row).
    spin_backoff: u32,
}

/// After this many spins in a row that took nothing, the writer stops spinning ...
const SPIN_MISS_LIMIT: u32 = 8;
/// ... for this many lone commits, then tries once (and backs off again if that misses too):
/// where submissions come further apart than the spin, it wastes at most one spin in 65.
const SPIN_BACKOFF: u32 = 64;

/// A live op compaction copies: its key, where it is, its bytes, and the key its bytes name
/// if a `Rekey` moved it since.
type CopyItem = (Key, Loc, Bytes, Option<(u64, u64)>);

/// How long compaction watches the oldest sealed segment's live bytes before deciding whether
/// consumers are draining it ([`Writer::draining_until`]).
const DRAIN_PROBE: std::time::Duration = std::time::Duration::from_millis(100);

/// Compaction finds a segment's live ops through the index instead of walking the segment
/// when there are at most this many of them ...
const INDEX_SCAN_MAX_OPS: usize = 4096;

/// ... and the index holds at most this many queues and messages in all (looking through
/// them all costs about as much as walking a few MiB of a segment).
const INDEX_SCAN_MAX_ENTRIES: usize = 65_536;

/// One compaction step reads at least this much of the segment it walks (and at most
/// `max_batch_bytes`, if larger, or one record).
const COMPACT_WALK_MIN: usize = 256 << 10;

/// How far compaction's walk of the oldest sealed segment has got: every op before `pos` that
/// was live has been copied forward.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walk {
    seg: u64,
    pos: u64,
    /// Format version 2 or later: records carry the write-start flag.
    flags: bool,
}

fn is_enospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull
}

/// Creates, preallocates and durably initialises segment `seg` of `cap` bytes.
pub(crate) fn create_segment(
    dir: &Path,
    io: &dyn Io,
    seg: u64,
    cap: u64,
    shared: Option<&Shared>,
) -> Result<Arc<dyn SegmentFile>, JournalError> {
    let path = segment_path(dir, seg);
    let file = io
        .create(dir, seg)
        .map_err(|e| JournalError::write("create", &path, cap, e))?;
    let init = || -> Result<(), JournalError> {
        file.preallocate(cap)
            .map_err(|e| JournalError::write("preallocate", &path, cap, e))?;
        file.write_at(&encode_header(seg), 0)
            .map_err(|e| JournalError::write("write", &path, HEADER_LEN, e))?;
        if let Some(s) = shared {
            s.counters.syncs.fetch_add(1, Ordering::Relaxed);
        }
        file.sync()
            .map_err(|e| JournalError::io("fdatasync", &path, e))?;
        io.sync_dir(dir)
            .map_err(|e| JournalError::io("fsync directory", dir, e))
    };
    if let Err(e) = init() {
        // Best effort: a half-made last segment is also removed by recovery.
        drop(file);
        let _ = io.remove(dir, seg);
        return Err(e);
    }
    Ok(file)
}

impl Writer {
    pub fn new(
        shared: Arc<Shared>,
        rx: Receiver<Msg>,
        urgent: Receiver<Msg>,
        opts: JournalOptions,
        active: Active,
    ) -> Self {
        let reserve_len = opts.reserve_bytes.unwrap_or(opts.segment_size);
        let unlinker = super::unlink::Unlinker::start(shared.dir.clone(), shared.io.clone());
        let zero_ahead = if shared.io.zero_ahead() {
            opts.zero_ahead_bytes
        } else {
            0
        };
        Writer {
            zero_ahead,
            lone_commit: false,
            spin_misses: 0,
            spin_backoff: 0,
            unlinker,
            shared,
            rx,
            urgent,
            opts,
            active,
            buf: Gather::default(),
            reserve_len,
            has_reserve: false,
            retry_at: Instant::now(),
            compact_retry_at: None,
            sealed_at: BTreeMap::new(),
            drain_probe: std::cell::Cell::new(None),
            walk: None,
        }
    }

    fn set_disk_full(&self, on: bool) {
        if on {
            // Segments handed to the unlink thread give their space back first.
            self.unlinker.flush();
        }
        let was = self.shared.disk_full.swap(on, Ordering::AcqRel);
        if on && !was {
            tracing::warn!(dir = %self.shared.dir.display(),
                "journal: disk full: refusing records that store data until space is freed; removals still work");
        } else if !on && was {
            tracing::info!(dir = %self.shared.dir.display(), "journal: disk space is back: storing data again");
        }
    }

    fn disk_full(&self) -> bool {
        self.shared.disk_full.load(Ordering::Acquire)
    }

    /// (Re)creates the reserve file. Ok (or no reserve wanted): leaves disk-full mode.
    /// ENOSPC: enters it. Another error: logged, the journal runs without a reserve.
    pub fn restore_reserve(&mut self) {
        if self.has_reserve || self.reserve_len == 0 {
            self.has_reserve = true;
            self.set_disk_full(false);
            return;
        }
        let dir = &self.shared.dir;
        match self.shared.io.create_reserve(dir, self.reserve_len) {
            Ok(()) => {
                if let Err(e) = self.shared.io.sync_dir(dir) {
                    tracing::warn!(error = %e, "journal: could not fsync the directory");
                }
                self.has_reserve = true;
                self.set_disk_full(false);
            }
            Err(e) if is_enospc(&e) => {
                self.retry_at = Instant::now() + DISK_FULL_RETRY;
                self.set_disk_full(true);
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %dir.display(), "journal: cannot create the disk-full reserve file; running without");
                self.reserve_len = 0;
                self.has_reserve = true;
                self.set_disk_full(false);
            }
        }
    }

    /// The writer thread's loop. The writer lives in `slot`, locked while it works and
    /// unlocked only while it waits for a submission (or a deadline): that is when a caller
    /// may take the lock and commit on its own thread ([`Writer::commit_inline`]). When the
    /// loop ends the slot is emptied, so no inline commit can follow.
    pub fn run(slot: Arc<Mutex<Option<Writer>>>) {
        // Declared before the lock's guard, so dropped after it, even when a panic unwinds.
        let _empty_on_exit = EmptyOnExit(slot.clone());
        let mut g = slot.lock().unwrap();
        let (rx, urgent) = {
            let w = g.as_ref().expect("a writer in its slot");
            (w.rx.clone(), w.urgent.clone())
        };
        loop {
            let w = g.as_mut().expect("a writer in its slot");
            match w.turn() {
                Turn::Continue => {}
                Turn::Stop => break,
                Turn::Wait(wait) => {
                    drop(g);
                    let timed_out = wait.block(&rx, &urgent);
                    // Poisoned: an inline commit panicked (`EmptyOnExit` poisons the journal).
                    let Ok(relocked) = slot.lock() else { return };
                    g = relocked;
                    let w = g.as_mut().expect("a writer in its slot");
                    if timed_out && matches!(wait, Wait::RetryCompaction) {
                        w.compact_step();
                    }
                }
            }
        }
        let w = g.take().expect("a writer in its slot");
        drop(g);
        drop((rx, urgent));
        w.finish();
    }

    /// One turn of the loop: one batch (or one compaction step), or what to wait for.
    fn turn(&mut self) -> Turn {
        // Only right after the batch that set it (not after compaction steps in between).
        let lone_commit = std::mem::take(&mut self.lone_commit);
        // `None`: only urgent submissions are waiting.
        let first = if self.compaction_target().is_some() {
            match self.rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) if !self.urgent.is_empty() => None,
                Err(TryRecvError::Empty) => {
                    self.compact_step();
                    return Turn::Continue;
                }
                Err(TryRecvError::Disconnected) => return Turn::Stop,
            }
        } else {
            if self.rx.is_empty() && self.urgent.is_empty() {
                // Idle: the next commits' space gets written before they need it.
                self.zero_ahead_step();
            }
            if lone_commit {
                self.spin_idle();
            }
            match self.rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Disconnected) => return Turn::Stop,
                Err(TryRecvError::Empty) if !self.urgent.is_empty() => None,
                Err(TryRecvError::Empty) => {
                    return Turn::Wait(if self.compact_retry_at.is_some() {
                        // Compaction waits for space: look again after a while even when idle.
                        Wait::RetryCompaction
                    } else if let Some(due) = self.compaction_due() {
                        // The oldest sealed segment's grace ends then: compact it even if idle.
                        Wait::Until(due)
                    } else {
                        Wait::Submission
                    });
                }
            }
        };
        let mut batch: Vec<Sub> = Vec::new();
        let mut bytes = 0usize;
        // Urgent removals first: every one waiting rides this batch, whatever its size.
        loop {
            match self.urgent.try_recv() {
                Ok(Msg::Submit {
                    ops,
                    size,
                    done,
                    detached,
                    chain,
                }) => {
                    bytes += size;
                    batch.push(Sub {
                        ops,
                        done,
                        detached,
                        chain,
                    });
                }
                Ok(Msg::Shutdown | Msg::Wake) | Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if first.is_none() {
                        return Turn::Stop;
                    }
                    break;
                }
            }
        }
        let Some(first) = first else {
            if !batch.is_empty() {
                self.commit(batch);
            }
            return Turn::Continue;
        };
        let mut stop = false;
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Msg::Shutdown => {
                    stop = true;
                    break;
                }
                // Only wakes the thread (after an inline commit left it work).
                Msg::Wake => {}
                Msg::Submit {
                    ops,
                    size,
                    done,
                    detached,
                    chain,
                } => {
                    self.shared.admission.release(size);
                    bytes += size;
                    batch.push(Sub {
                        ops,
                        done,
                        detached,
                        chain,
                    });
                }
            }
            if bytes < self.opts.max_batch_bytes {
                next = self.rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            self.commit(batch);
        }
        if stop {
            return Turn::Stop;
        }
        if self.compaction_target().is_some() {
            self.compact_step();
        }
        Turn::Continue
    }

    /// Nothing is written any more: fails what is still queued, and lets submitters that wait
    /// for room through (their send then fails: the channel is closed).
    fn finish(self) {
        // Not written because the journal shut down: nothing to poison.
        self.fail_queued(&JournalError::Closed);
        tracing::debug!("journal writer stopped");
    }

    /// Lets submitters that wait for room through and completes every queued submission with
    /// `e`, unwritten.
    fn fail_queued(&self, e: &JournalError) {
        self.shared.admission.close();
        for (queue, admitted) in [(&self.rx, true), (&self.urgent, false)] {
            while let Ok(m) = queue.try_recv() {
                if let Msg::Submit {
                    ops,
                    size,
                    done,
                    chain,
                    ..
                } = m
                {
                    if admitted {
                        self.shared.admission.release(size);
                    }
                    let sub = Sub {
                        ops,
                        done,
                        detached: false,
                        chain,
                    };
                    sub.complete(&self.shared, Err(e.clone()));
                }
            }
        }
    }

    /// Nothing queued and nothing broken: a submission made now may be committed by its caller
    /// ([`Writer::commit_inline`]) without passing anything it must follow.
    pub fn is_idle(&self) -> bool {
        self.rx.is_empty() && self.urgent.is_empty() && !self.shared.is_poisoned()
    }

    /// Commits one submission on the calling thread, while the writer thread waits
    /// ([`Journal::submit_awaited`](super::Journal::submit_awaited)): the same group commit
    /// as the thread's, of a batch of one. Returns whether the thread has work to do now that
    /// it would otherwise only find at its next wake-up (zeros to lay ahead, a segment sealed
    /// or droppable), so the caller wakes it.
    pub fn commit_inline(&mut self, ops: Vec<Op>, done: Done) -> bool {
        let seg = self.active.seg;
        self.commit(vec![Sub {
            ops,
            done,
            detached: false,
            chain: None,
        }]);
        // The spin is for the thread's own lone commits; this one's caller is not coming back
        // to the queues.
        self.lone_commit = false;
        self.shared
            .counters
            .inline_commits
            .fetch_add(1, Ordering::Relaxed);
        self.active.seg != seg || self.zero_ahead_wanted() || self.compaction_target().is_some()
    }

    /// Keeps zeros written and synced ahead of the active segment's records
    /// (`JournalOptions::zero_ahead_bytes`), so that a commit writes into space that is
    /// already written on disk: its `fdatasync` then flushes data only, with no extent
    /// conversion to commit in the filesystem's journal. Called only while idle (nothing
    /// queued), so it delays at most a submission that arrives during it, by one write and one
    /// sync. Tops up to `zero_ahead` bytes once fewer than half are left.
    ///
    /// Safe for recovery: every byte after the last record is zero or torn garbage anyway
    /// (unwritten space reads as zeros), and this writes only after `pos`, on this thread,
    /// when no failed write left bytes there (`stale_end`). A failed sync poisons, as any.
    fn zero_ahead_step(&mut self) {
        if !self.zero_ahead_wanted() {
            return;
        }
        let a = &self.active;
        let from = a.zeroed.max(a.pos);
        let to = (a.pos + self.zero_ahead).min(a.cap);
        if to <= from {
            return;
        }
        match self.zero_active(from, to).and_then(|()| self.sync_active()) {
            Ok(()) => {
                self.active.zeroed = to;
                self.shared
                    .counters
                    .zeroed_bytes
                    .fetch_add(to - from, Ordering::Relaxed);
            }
            Err(JournalError::NoSpace { .. }) => {
                // Not expected in preallocated space; commits write there as before.
                self.active.zeroed = self.active.cap;
            }
            Err(e) => self.poison(&e),
        }
    }

    /// Fewer than half of `zero_ahead` bytes of zeros are left ahead of the records, and
    /// laying more is possible.
    fn zero_ahead_wanted(&self) -> bool {
        let a = &self.active;
        self.zero_ahead > 0
            && !self.shared.is_poisoned()
            && !self.disk_full()
            && a.stale_end == 0
            && a.zeroed.saturating_sub(a.pos) < self.zero_ahead / 2
    }

    /// Watches both queues for up to `idle_spin` before the writer goes to sleep in its select
    /// (called only after a batch of one small submission, `lone_commit`): a submission made
    /// meanwhile is taken without a futex wake-up on either side. Between looks it gives the
    /// CPU away (`sched_yield`), so on a busy machine the threads that produce the next
    /// submission (the caller's runtime worker, its client) are not held up by the spin. It
    /// only looks: whatever it sees (or misses, arriving just as it gives up) is taken by the
    /// select that follows, which sleeps only when both queues are empty. After
    /// [`SPIN_MISS_LIMIT`] spins in a row that took nothing it skips [`SPIN_BACKOFF`] lone
    /// commits, so a trickle of unrelated commits does not keep a core busy.
    fn spin_idle(&mut self) {
        let spin = self.opts.idle_spin;
        if spin.is_zero() || self.shared.is_poisoned() {
            return;
        }
        if self.spin_backoff > 0 {
            self.spin_backoff -= 1;
            return;
        }
        let c = &self.shared.counters;
        c.idle_spins.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + spin;
        loop {
            // The clock first: a spin that overran its time (the thread was not scheduled
            // for a while, on a busy machine) counts as a miss even if a submission came
            // meanwhile (the select takes it at once), so that the back-off also works when
            // the cores are busy.
            if Instant::now() >= until {
                self.spin_misses += 1;
                if self.spin_misses >= SPIN_MISS_LIMIT {
                    self.spin_backoff = SPIN_BACKOFF;
                }
                return;
            }
            if !self.rx.is_empty() || !self.urgent.is_empty() {
                c.idle_spin_catches.fetch_add(1, Ordering::Relaxed);
                self.spin_misses = 0;
                return;
            }
            for _ in 0..16 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
        }
    }

    fn poisoned(&self) -> Option<JournalError> {
        self.shared.poisoned_error()
    }

    fn poison(&self, e: &JournalError) {
        tracing::error!(error = %e, "journal poisoned: refusing all further writes");
        self.shared.poison(e);
    }

    /// Writes one batch of submissions as one group commit.
    fn commit(&mut self, batch: Vec<Sub>) {
        self.lone_commit = !self.opts.idle_spin.is_zero()
            && batch.len() == 1
            && batch[0].ops.iter().map(Op::encoded_len).sum::<usize>()
                <= super::IDLE_SPIN_MAX_BYTES;
        if let Some(e) = self.poisoned() {
            for sub in batch {
                sub.complete(&self.shared, Err(e.clone()));
            }
            return;
        }
        if self.disk_full()
            && Instant::now() >= self.retry_at
            && batch.iter().any(|s| stores_data(&s.ops))
        {
            // Has space come back? Allocating the reserve again is the test.
            self.restore_reserve();
            self.retry_at = Instant::now() + DISK_FULL_RETRY;
        }
        let refuse_data = self.disk_full();
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // Per record: its range in buf, whether it stores data, the batch entry, and each
        // op's range in buf.
        let mut recs: Vec<Range<usize>> = Vec::with_capacity(batch.len());
        let mut growth: Vec<bool> = Vec::with_capacity(batch.len());
        let mut rec_ops: Vec<(usize, Vec<Range<usize>>)> = Vec::with_capacity(batch.len());
        // Per submission: refused without being written (and why, if not for want of space).
        let mut refused: Vec<bool> = vec![false; batch.len()];
        let mut chain_refused: Vec<Option<JournalError>> = vec![None; batch.len()];
        for (i, sub) in batch.iter().enumerate() {
            if let Some(e) = sub.chain.as_ref().and_then(Chain::refusal) {
                // An earlier record of its chain failed (in an earlier batch, or in this one).
                chain_refused[i] = Some(e);
                continue;
            }
            let ops = &sub.ops;
            if ops.is_empty() {
                // Nothing to write; completing it with this batch makes it a barrier.
                continue;
            }
            let stores = stores_data(ops);
            // A detached record (a queue definition used at once) is written even in disk-full
            // mode, while the active segment has room: refusing it would poison the journal.
            if refuse_data && stores && !sub.detached {
                refused[i] = true;
                if let Some(c) = &sub.chain {
                    // Later records of its chain in this batch must not be written either.
                    c.break_with(&JournalError::NoSpace {
                        action: "store a record in",
                        path: self.shared.dir.clone(),
                        bytes: 0,
                        source: Arc::new(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                    });
                }
                continue;
            }
            let (rec, ranges) = encode_record(&mut buf, ops);
            recs.push(rec);
            growth.push(stores);
            rec_ops.push((i, ranges));
        }

        let (locs, failure) = if recs.is_empty() {
            (Vec::new(), None)
        } else {
            self.write_or_note_enospc(&mut buf, &recs, &growth)
        };
        {
            let mut idx = self.shared.index.write().unwrap();
            for ((i, ranges), (rec, &loc)) in rec_ops.iter().zip(recs.iter().zip(locs.iter())) {
                index_record(&mut idx, &batch[*i].ops, ranges, rec, loc);
            }
        }
        let c = &self.shared.counters;
        c.records.fetch_add(locs.len() as u64, Ordering::Relaxed);
        c.batches.fetch_add(1, Ordering::Relaxed);
        if !locs.is_empty() {
            c.batch_records.observe(locs.len() as f64);
        }
        let written = recs
            .get(..locs.len())
            .and_then(|r| r.last())
            .map_or(0, |r| r.end);
        c.bytes_written.fetch_add(written as u64, Ordering::Relaxed);
        let dir = self.shared.dir.clone();
        let no_space = |bytes: usize| JournalError::NoSpace {
            action: "store a record in",
            path: dir.clone(),
            bytes: bytes as u64,
            source: Arc::new(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        };
        // Records are in batch order; the first `locs.len()` non-empty submissions are
        // durable. Empty ones (barriers) before them are complete too.
        let durable_upto = match &failure {
            None => batch.len(),
            Some(e) => {
                if matches!(e, JournalError::NoSpace { .. }) {
                    tracing::warn!(error = %e, "journal: records refused for want of disk space");
                } else {
                    self.poison(e);
                }
                rec_ops.get(locs.len()).map_or(batch.len(), |(i, _)| *i)
            }
        };
        // Detached records (queue definitions nobody waits for, whose queues are in use)
        // that failed for want of space are written again on their own, with the reserve if
        // need be, as removals are: failing them would poison the journal, and a client that
        // only looked at a subqueue or sent to a new remote broker while the disk filled did
        // that (helper-66).
        let mut rewritten: Vec<Option<Result<(), JournalError>>> = Vec::new();
        if matches!(failure, Some(JournalError::NoSpace { .. })) {
            let again: Vec<usize> = (durable_upto..batch.len())
                .filter(|&i| {
                    batch[i].detached
                        && !refused[i]
                        && chain_refused[i].is_none()
                        && !batch[i].ops.is_empty()
                })
                .collect();
            if !again.is_empty() {
                let (written, err) = self.write_detached(again.iter().map(|&i| &batch[i].ops));
                rewritten = (0..batch.len()).map(|_| None).collect();
                for (k, &i) in again.iter().enumerate() {
                    rewritten[i] = Some(match &err {
                        Some(e) if k >= written => Err(e.clone()),
                        _ => Ok(()),
                    });
                }
            }
        }
        for (i, sub) in batch.into_iter().enumerate() {
            let r = if let Some(e) = chain_refused[i].take() {
                Err(e)
            } else if refused[i] {
                Err(no_space(sub.ops.iter().map(Op::encoded_len).sum()))
            } else if let Some(r) = rewritten.get_mut(i).and_then(Option::take) {
                r
            } else if i < durable_upto {
                Ok(())
            } else {
                Err(failure.clone().expect("a failure when not all are durable"))
            };
            sub.complete(&self.shared, r);
        }
        // Keep the allocation for the next batch, unless one huge record inflated it.
        if buf.capacity() > 2 * self.opts.max_batch_bytes.max(1 << 20) {
            buf = Gather::default();
        }
        // Drop the references to this batch's bodies now, not at the next batch.
        buf.clear();
        self.buf = buf;
    }

    /// [`Writer::write_records`]: the records written (on a failure, those synced before it, on
    /// disk and acknowledged as such: a batch that crossed a segment boundary) and the failure;
    /// ENOSPC is noted ([`Writer::after_enospc`]).
    fn write_or_note_enospc(
        &mut self,
        buf: &mut Gather,
        recs: &[Range<usize>],
        growth: &[bool],
    ) -> (Vec<(u64, u64)>, Option<JournalError>) {
        match self.write_records(buf, recs, growth) {
            Ok(locs) => (locs, None),
            Err((e @ JournalError::NoSpace { .. }, durable)) => {
                (durable, Some(self.after_enospc(e)))
            }
            Err((e, durable)) => (durable, Some(e)),
        }
    }

    /// Writes records of `ops` each (detached ones whose batch failed for want of space) as
    /// records that only free data are written: a new segment may take the reserve's space.
    /// Returns how many are durable (in order) and, if not all, why the rest failed.
    fn write_detached<'a>(
        &mut self,
        ops: impl Iterator<Item = &'a Vec<Op>>,
    ) -> (usize, Option<JournalError>) {
        let mut buf = Gather::default();
        let mut recs: Vec<Range<usize>> = Vec::new();
        let mut rec_ops: Vec<(&Vec<Op>, Vec<Range<usize>>)> = Vec::new();
        for ops in ops {
            let (rec, ranges) = encode_record(&mut buf, ops);
            recs.push(rec);
            rec_ops.push((ops, ranges));
        }
        let growth = vec![false; recs.len()];
        let (locs, failure) = self.write_or_note_enospc(&mut buf, &recs, &growth);
        {
            let mut idx = self.shared.index.write().unwrap();
            for ((ops, ranges), (rec, &loc)) in rec_ops.iter().zip(recs.iter().zip(locs.iter())) {
                index_record(&mut idx, ops, ranges, rec, loc);
            }
        }
        let c = &self.shared.counters;
        c.records.fetch_add(locs.len() as u64, Ordering::Relaxed);
        let written = recs
            .get(..locs.len())
            .and_then(|r| r.last())
            .map_or(0, |r| r.end);
        c.bytes_written.fetch_add(written as u64, Ordering::Relaxed);
        if locs.len() < recs.len() {
            tracing::error!(
                records = recs.len() - locs.len(),
                "journal: queue definitions could not be written even with the reserve's space"
            );
        }
        (locs.len(), failure)
    }

    /// A write (or a segment's allocation) failed with ENOSPC, `e`: whatever part of it reached
    /// the page cache is zeroed and synced now, so that "nothing stored" is true even if the
    /// process dies before the next write (whole records of the failed write would otherwise be
    /// found by recovery), and the journal enters disk-full mode. Returns the error for the
    /// records concerned: `e`, or, if the zeroing failed, that failure (which poisons: those
    /// records may be on disk).
    fn after_enospc(&mut self, e: JournalError) -> JournalError {
        self.retry_at = Instant::now() + DISK_FULL_RETRY;
        self.set_disk_full(true);
        if self.active.stale_end <= self.active.pos {
            return e;
        }
        // What a read returns is what a killed process leaves: nothing to zero if the failed
        // write left nothing (ENOSPC before any byte, as on a full preallocated segment).
        let (from, to) = (self.active.pos, self.active.stale_end);
        let mut left = vec![0u8; (to - from) as usize];
        if self.active.file.read_at(&mut left, from).is_ok() && left.iter().all(|&b| b == 0) {
            self.active.stale_end = 0;
            return e;
        }
        drop(left);
        let scrub = self
            .zero_active(self.active.pos, self.active.stale_end)
            .and_then(|()| self.sync_active());
        match scrub {
            Ok(()) => e,
            Err(z) => {
                let z = match z {
                    JournalError::NoSpace {
                        action,
                        path,
                        source,
                        ..
                    } => JournalError::Io {
                        action,
                        path,
                        source,
                    },
                    z => z,
                };
                self.poison(&z);
                z
            }
        }
    }

    /// Writes framed records (contiguous logical ranges of `buf`) and makes them durable. Returns
    /// each record's (segment, file offset). Usually one write and one sync; a batch that
    /// crosses a segment boundary syncs the full segment before the next one is created, so
    /// that only the last segment can ever have a torn tail. The first record of each write
    /// gets the write-start flag. `growth[i]`: record `i` stores data (it may not use the
    /// space of the reserve file).
    /// On failure, returns the error and the locations of the records already synced (a
    /// prefix of `recs`); the active position is back at the end of what is durable.
    #[allow(clippy::type_complexity)]
    fn write_records(
        &mut self,
        buf: &mut Gather,
        recs: &[Range<usize>],
        growth: &[bool],
    ) -> Result<Vec<(u64, u64)>, (JournalError, Vec<(u64, u64)>)> {
        let mut locs: Vec<(u64, u64)> = Vec::with_capacity(recs.len());
        let mut durable = 0usize;
        let mut durable_pos = self.active.pos;
        macro_rules! attempt {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(err) => {
                        locs.truncate(durable);
                        // Whatever was written after the durable end may be on the disk in
                        // part: it is zeroed before anything relies on those bytes.
                        self.active.stale_end = self.active.stale_end.max(self.active.pos);
                        self.active.pos = durable_pos;
                        return Err((err, locs));
                    }
                }
            };
        }
        let mut chunk: Option<(usize, u64)> = None; // (start in buf, file offset)
        let mut chunk_end = 0usize;
        let mut dirty = false;
        for (r, &grows) in recs.iter().zip(growth) {
            let len = r.len() as u64;
            if self.active.pos + len > self.active.cap {
                if let Some((s, off)) = chunk.take() {
                    attempt!(self.write_chunk(&buf.slices(s..chunk_end), off));
                    dirty = true;
                }
                if dirty {
                    attempt!(self.sync_active());
                    dirty = false;
                    durable = locs.len();
                    durable_pos = self.active.pos;
                }
                attempt!(self.roll(len, !grows));
                durable_pos = self.active.pos;
            }
            if chunk.is_none() {
                chunk = Some((r.start, self.active.pos));
                if self.active.flags {
                    set_write_start(buf, r.start);
                }
            }
            chunk_end = r.end;
            locs.push((self.active.seg, self.active.pos));
            self.active.pos += len;
        }
        if let Some((s, off)) = chunk {
            attempt!(self.write_chunk(&buf.slices(s..chunk_end), off));
            dirty = true;
        }
        if dirty {
            attempt!(self.sync_active());
        }
        let mut idx = self.shared.index.write().unwrap();
        if let Some(m) = idx.segs.get_mut(&self.active.seg) {
            m.end = self.active.pos;
        }
        Ok(locs)
    }

    /// Writes `bytes` (one vectored write) at `off` of the active segment, and zeros after
    /// them up to the end of what an earlier failed write may have left.
    fn write_chunk(&mut self, bytes: &[IoSlice<'_>], off: u64) -> Result<(), JournalError> {
        let path = || segment_path(&self.shared.dir, self.active.seg);
        let len: u64 = bytes.iter().map(|b| b.len() as u64).sum();
        let piece = self.opts.writeback_bytes;
        let written = if piece > 0 && len > piece {
            write_in_pieces(&*self.active.file, bytes, off, piece)
        } else {
            self.active.file.write_vectored_at(bytes, off)
        };
        written.map_err(|e| JournalError::write("write", path(), len, e))?;
        let end = off + len;
        if self.active.stale_end > end {
            self.zero_active(end, self.active.stale_end)?;
        }
        if self.active.stale_end <= end {
            self.active.stale_end = 0;
        }
        Ok(())
    }

    /// Writes zeros over `[from, to)` of the active segment (not synced).
    fn zero_active(&mut self, from: u64, to: u64) -> Result<(), JournalError> {
        let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
        let mut off = from;
        while off < to {
            let n = (to - off).min(zeros.len() as u64);
            self.active
                .file
                .write_at(&zeros[..n as usize], off)
                .map_err(|e| {
                    JournalError::write(
                        "zero-fill",
                        segment_path(&self.shared.dir, self.active.seg),
                        n,
                        e,
                    )
                })?;
            off += n;
        }
        self.active.stale_end = 0;
        Ok(())
    }

    fn sync_active(&self) -> Result<(), JournalError> {
        let c = &self.shared.counters;
        c.syncs.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let r = self.active.file.sync();
        c.sync_seconds.observe(started.elapsed().as_secs_f64());
        r.map_err(|e| {
            JournalError::io(
                "fdatasync",
                segment_path(&self.shared.dir, self.active.seg),
                e,
            )
        })
    }

    /// Seals the active segment (already synced) and starts the next one, big enough for a
    /// record of `need` bytes. On ENOSPC, `may_use_reserve` (the record only frees data)
    /// gives up the reserve file to make room; either way the journal enters disk-full mode.
    fn roll(&mut self, need: u64, may_use_reserve: bool) -> Result<(), JournalError> {
        if self.active.stale_end > self.active.pos {
            // Bytes of a failed write after the end: a sealed segment must end in zeros.
            self.zero_active(self.active.pos, self.active.stale_end)?;
            self.sync_active()?;
        }
        let seg = self.active.seg + 1;
        let cap = self.opts.segment_size.max(HEADER_LEN + need);
        let dir = &self.shared.dir;
        let io = &*self.shared.io;
        let mut made = create_segment(dir, io, seg, cap, Some(&self.shared));
        if matches!(made, Err(JournalError::NoSpace { .. })) && self.unlinker.free_pending() {
            // Dropped segments were still being freed on the unlink thread: their space is
            // back now, so try once more before refusing anything.
            made = create_segment(dir, io, seg, cap, Some(&self.shared));
        }
        let file = match made {
            Ok(f) => f,
            Err(e @ JournalError::NoSpace { .. }) => {
                self.retry_at = Instant::now() + DISK_FULL_RETRY;
                self.set_disk_full(true);
                if !(may_use_reserve && self.has_reserve && self.reserve_len > 0) {
                    return Err(e);
                }
                tracing::warn!(
                    segment = seg,
                    "journal: disk full: using the reserve for a segment of removals"
                );
                self.has_reserve = false;
                io.remove_reserve(dir)
                    .map_err(|e| JournalError::io("remove the reserve file in", dir, e))?;
                io.sync_dir(dir)
                    .map_err(|e| JournalError::io("fsync directory", dir, e))?;
                create_segment(dir, io, seg, cap, Some(&self.shared))?
            }
            Err(e) => return Err(e),
        };
        {
            let mut idx = self.shared.index.write().unwrap();
            if let Some(m) = idx.segs.get_mut(&self.active.seg) {
                m.end = self.active.pos;
            }
            idx.segs.insert(
                seg,
                SegMeta {
                    file: file.clone(),
                    cap,
                    end: HEADER_LEN,
                    live: 0,
                    live_ops: Default::default(),
                },
            );
        }
        self.shared
            .counters
            .segments_created
            .fetch_add(1, Ordering::Relaxed);
        self.sealed_at.insert(self.active.seg, Instant::now());
        self.active = Active {
            seg,
            file,
            cap,
            pos: HEADER_LEN,
            flags: true,
            stale_end: 0,
            zeroed: HEADER_LEN,
        };
        self.shared.rekey.store(true, Ordering::Release);
        Ok(())
    }

    /// The oldest sealed segment, if it should be dropped now:
    /// - it holds nothing live: delete it;
    /// - its live ratio is below `compact_live_ratio`: copy its live ops forward, delete it;
    /// - the sealed segments together are below the ratio and at least a segment's worth of
    ///   space is dead: copy it forward even if it is mostly live. Otherwise one long-lived
    ///   oldest segment would pin every dead segment behind it and disk use would not follow
    ///   live data.
    ///
    /// While the disk is full only a segment whose live bytes fit in half of the active
    /// segment's free space (the copy must not need a new segment), and not at all for a
    /// while after a step failed for want of space.
    fn compaction_target(&self) -> Option<u64> {
        if self.shared.is_poisoned() {
            return None;
        }
        if self.compact_retry_at.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        let idx = self.shared.index.read().unwrap();
        let (&oldest, meta) = idx.segs.iter().next()?;
        if oldest == self.active.seg {
            return None;
        }
        if self.disk_full() {
            // Dropping the segment frees a whole one; copying its few live bytes (a queue
            // definition, a long-lived message) is worth it if they fit in half of what is
            // left in the active segment, the rest staying for removals.
            let room = self.active.cap.saturating_sub(self.active.pos);
            let fits = meta.live + 64 <= room / 2;
            return (meta.live == 0 || fits).then_some(oldest);
        }
        if meta.live > 0
            && (self.grace_until(oldest).is_some()
                || self.draining_until(oldest, meta.live).is_some())
        {
            return None;
        }
        let ratio = self.opts.compact_live_ratio;
        let used = |m: &SegMeta| m.end.saturating_sub(HEADER_LEN);
        if meta.live == 0 || (meta.live as f64) < ratio * used(meta) as f64 {
            return Some(oldest);
        }
        let (mut live, mut total) = (0u64, 0u64);
        for (&n, m) in idx.segs.iter() {
            if n != self.active.seg {
                live += m.live;
                total += used(m);
            }
        }
        if total.saturating_sub(live) >= self.opts.segment_size
            && (live as f64) < ratio * total as f64
        {
            return Some(oldest);
        }
        None
    }

    /// Until when segment `seg`, sealed in this run, is spared compaction (`compact_grace`),
    /// if that is still ahead.
    fn grace_until(&self, seg: u64) -> Option<Instant> {
        let until = *self.sealed_at.get(&seg)? + self.opts.compact_grace;
        (Instant::now() < until).then_some(until)
    }

    /// Until when the oldest sealed segment `seg`, holding `live` bytes, is left to its
    /// consumers because they are draining it: its live bytes fell over the last
    /// [`DRAIN_PROBE`] fast enough to reach zero within `compact_grace` (copying what a
    /// consumer takes a moment later is wasted work on the thread every commit waits for; a
    /// backlog draining at 277k msg/s had 30 MB of each segment copied in 10-50 ms steps). A
    /// segment seen for the first time is watched for one probe; a segment whose live bytes
    /// stay put, or fall too slowly, is compacted. Off with a zero grace, and once a walk of
    /// the segment has begun.
    fn draining_until(&self, seg: u64, live: u64) -> Option<Instant> {
        let grace = self.opts.compact_grace;
        if grace.is_zero() || self.walk.is_some_and(|w| w.seg == seg) {
            return None;
        }
        let now = Instant::now();
        match self.drain_probe.get() {
            Some((s, since, _)) if s == seg && now < since + DRAIN_PROBE => {
                Some(since + DRAIN_PROBE)
            }
            Some((s, since, before)) if s == seg => {
                let fell = before.saturating_sub(live);
                // Empty within the grace at the rate of the last probe?
                // live / (fell / elapsed) <= grace
                let draining = fell > 0
                    && (live as u128) * (now - since).as_nanos()
                        <= (fell as u128) * grace.as_nanos();
                if draining {
                    self.drain_probe.set(Some((seg, now, live)));
                    Some(now + DRAIN_PROBE)
                } else {
                    None
                }
            }
            _ => {
                self.drain_probe.set(Some((seg, now, live)));
                Some(now + DRAIN_PROBE)
            }
        }
    }

    /// When an idle writer must look at compaction again: the oldest sealed segment holds
    /// live ops and its grace ends then.
    fn compaction_due(&self) -> Option<Instant> {
        if self.disk_full() || self.shared.is_poisoned() {
            return None;
        }
        let idx = self.shared.index.read().unwrap();
        let (&oldest, meta) = idx.segs.iter().next()?;
        if oldest == self.active.seg || meta.live == 0 {
            return None;
        }
        self.grace_until(oldest)
            .or_else(|| self.draining_until(oldest, meta.live))
    }

    /// One bounded step of compaction on the oldest sealed segment.
    fn compact_step(&mut self) {
        let Some(seg) = self.compaction_target() else {
            return;
        };
        match self.try_compact_step(seg) {
            Ok(()) => {
                self.compact_retry_at = None;
                if self.disk_full() {
                    // A segment was copied or dropped: maybe there is room again.
                    self.restore_reserve();
                }
            }
            Err(e @ JournalError::NoSpace { .. }) => {
                tracing::warn!(error = %e, "journal: compaction waits for disk space");
                self.compact_retry_at = Some(Instant::now() + DISK_FULL_RETRY);
            }
            Err(e) => self.poison(&e),
        }
    }

    fn try_compact_step(&mut self, seg: u64) -> Result<(), JournalError> {
        let budget = self.opts.max_batch_bytes.max(1);
        let (file, live, end) = {
            let idx = self.shared.index.read().unwrap();
            let meta = &idx.segs[&seg];
            (meta.file.clone(), meta.live, meta.end)
        };
        let path = segment_path(&self.shared.dir, seg);

        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if live == 0 {
            // Nothing live left: record the id watermark, then unlink.
            let mark = self.shared.index.read().unwrap().mark();
            encode_frame(&mut buf, |out| mark.encode(out));
            let whole = 0..buf.len();
            let r = self.write_records(&mut buf, std::slice::from_ref(&whole), &[false]);
            self.buf = buf;
            r.map_err(|(e, _)| e)?;
            {
                let mut idx = self.shared.index.write().unwrap();
                idx.segs.remove(&seg);
            }
            self.sealed_at.remove(&seg);
            self.walk = None;
            // Readers holding this file's Arc keep reading it after the unlink.
            drop(file);
            if self.shared.disk_full.load(Ordering::Acquire) {
                // The space is wanted now.
                self.unlinker.remove_now(seg);
            } else {
                self.unlinker.remove(seg);
            }
            self.shared
                .counters
                .segments_deleted
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(segment = seg, "journal: dropped segment");
            return Ok(());
        }
        self.buf = buf;

        // Few live ops and a small index: find them through the index and copy them in one
        // step, instead of walking the whole segment (64 MiB read and decoded on this thread
        // for a queue definition or a few messages).
        if let Some(found) = self.live_from_index(seg, live, budget) {
            let mut items: Vec<CopyItem> = Vec::with_capacity(found.len());
            for (key, loc) in found {
                let bytes = file
                    .read_vec_at(loc.len as usize, loc.off)
                    .map(Bytes::from)
                    .map_err(|e| JournalError::io("read", &path, e))?;
                self.shared
                    .counters
                    .compaction_read_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let named = match (key, decode_payload(&bytes)) {
                    (Key::Msg(q, s), Ok(entries)) => match entries.first() {
                        Some((Entry::Op(Op::Put { queue_id, seq, .. }), _))
                            if (*queue_id, *seq) != (q, s) =>
                        {
                            Some((*queue_id, *seq))
                        }
                        _ => None,
                    },
                    // What does not decode is reported by the check in `copy_forward`.
                    _ => None,
                };
                items.push((key, loc, bytes, named));
            }
            self.copy_forward(&path, items)?;
            self.walk = None;
            return Ok(());
        }

        // Walk the segment's records from where the last step stopped, asking the index
        // which ops are live; copy those forward verbatim: each op is self-contained (a
        // message a Rekey moved gets its current key written into its Put, so the copy no
        // longer needs the Rekey). What the walk has passed holds nothing live: the segment
        // is sealed, and the index only ever points at new places (writes, copies) or renames
        // what is live (Rekey), all on this thread.
        let walk = match self.walk {
            Some(w) if w.seg == seg => w,
            _ => {
                let mut h = [0u8; HEADER_LEN as usize];
                file.read_at(&mut h, 0)
                    .map_err(|e| JournalError::io("read", &path, e))?;
                let version = check_header(&h, seg).map_err(|reason| JournalError::Corrupt {
                    path: path.clone(),
                    offset: 0,
                    reason,
                })?;
                Walk {
                    seg,
                    pos: HEADER_LEN,
                    flags: version >= 2,
                }
            }
        };
        let corrupt = |offset: u64, reason: String| JournalError::Corrupt {
            path: path.clone(),
            offset,
            reason,
        };
        if walk.pos >= end {
            return Err(corrupt(
                end,
                format!(
                    "compaction walked the whole segment but the index still counts {live} live bytes in it"
                ),
            ));
        }
        let read = |len: u64| -> Result<Bytes, JournalError> {
            file.read_vec_at(len as usize, walk.pos)
                .map(Bytes::from)
                .map_err(|e| JournalError::io("read", &path, e))
        };
        let mut window = read((end - walk.pos).min(budget.max(COMPACT_WALK_MIN) as u64))?;
        self.shared
            .counters
            .compaction_read_bytes
            .fetch_add(window.len() as u64, Ordering::Relaxed);
        if window.len() < FRAME_HEADER {
            return Err(corrupt(
                walk.pos,
                "a few stray bytes at the segment's end".into(),
            ));
        }
        if let Frame::Incomplete = decode_frame(&window, 0, walk.flags) {
            // One record longer than the window: read it whole.
            let word = u32::from_le_bytes(window[..4].try_into().expect("4 bytes"));
            let len = FRAME_HEADER as u64 + (word & !WRITE_START) as u64;
            if walk.pos + len > end {
                return Err(corrupt(
                    walk.pos,
                    "record runs past the segment's end".into(),
                ));
            }
            window = read(len)?;
            self.shared
                .counters
                .compaction_read_bytes
                .fetch_add(len, Ordering::Relaxed);
        }

        let mut items: Vec<CopyItem> = Vec::new();
        let mut bytes = 0usize;
        let mut at = 0usize;
        {
            let idx = self.shared.index.read().unwrap();
            while at < window.len() {
                let (payload, next) = match decode_frame(&window, at, walk.flags) {
                    Frame::Record { payload, next, .. } => (payload, next),
                    // The rest of the record is beyond the window: the next step reads it.
                    Frame::Incomplete if at > 0 => break,
                    Frame::End => {
                        return Err(corrupt(
                            walk.pos + at as u64,
                            "end of records before the segment's end while compacting".into(),
                        ))
                    }
                    Frame::Incomplete => {
                        return Err(corrupt(
                            walk.pos,
                            "record runs past the segment's end while compacting".into(),
                        ))
                    }
                    Frame::Corrupt(why) => {
                        return Err(corrupt(
                            walk.pos + at as u64,
                            format!("while compacting: {why}"),
                        ))
                    }
                };
                let entries = decode_payload(&window.slice(payload.clone())).map_err(|e| {
                    corrupt(
                        walk.pos + at as u64,
                        format!("record does not decode while compacting: {}", e.0),
                    )
                })?;
                let first = items.len();
                let mut rec_bytes = 0usize;
                for (e, r) in &entries {
                    let Entry::Op(op) = e else { continue };
                    let inside = payload.start + r.start..payload.start + r.end;
                    let loc = Loc {
                        seg,
                        off: walk.pos + inside.start as u64,
                        len: r.len() as u32,
                    };
                    let Some(key) = idx.live_key(op, loc) else {
                        continue;
                    };
                    let named = match (op, key) {
                        (Op::Put { queue_id, seq, .. }, Key::Msg(q, s))
                            if (*queue_id, *seq) != (q, s) =>
                        {
                            Some((*queue_id, *seq))
                        }
                        _ => None,
                    };
                    rec_bytes += r.len();
                    items.push((key, loc, window.slice(inside), named));
                }
                if first > 0 && bytes + rec_bytes > budget {
                    // The budget is spent: this record is the next step's.
                    items.truncate(first);
                    break;
                }
                bytes += rec_bytes;
                at = next;
            }
        }
        // Where the next step goes on, once this one's copies are in the index.
        let walked = Walk {
            pos: walk.pos + at as u64,
            ..walk
        };
        if items.is_empty() {
            // Nothing live in this stretch.
            self.walk = Some(walked);
            return Ok(());
        }

        drop(window);
        self.copy_forward(&path, items)?;
        self.walk = Some(walked);
        Ok(())
    }

    /// Copies live ops of a sealed segment forward as one record, after checking that the
    /// bytes are the ops the index says, and points the index at the copies.
    fn copy_forward(&mut self, path: &Path, items: Vec<CopyItem>) -> Result<(), JournalError> {
        let bytes: usize = items.iter().map(|(_, _, b, _)| b.len()).sum();
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut payload = Vec::with_capacity(bytes);
        let mut ranges = Vec::with_capacity(items.len());
        for (key, _, op_bytes, named) in &items {
            let s = payload.len();
            payload.extend_from_slice(op_bytes);
            if let (Some(from), Key::Msg(q, seq)) = (named, key) {
                // If the bytes are not the Put the index says, nothing changes and the check
                // below reports it.
                super::op::rekey_put(&mut payload[s..], *from, (*q, *seq));
            }
            ranges.push(s..payload.len());
        }
        // Check what we copy is what the index says it is, so a bug or bit rot is
        // caught here instead of being re-framed under a fresh, valid CRC.
        let payload = Bytes::from(payload);
        let decoded = decode_payload(&payload).map_err(|e| JournalError::Corrupt {
            path: path.to_path_buf(),
            offset: items[0].1.off,
            reason: format!("live op does not decode while compacting: {}", e.0),
        })?;
        let same = decoded.len() == items.len()
            && decoded
                .iter()
                .zip(&items)
                .all(|((e, _), (key, ..))| match (e, key) {
                    (Entry::Op(Op::DefineQueue { queue_id, .. }), Key::Def(q)) => queue_id == q,
                    (Entry::Op(Op::Put { queue_id, seq, .. }), Key::Msg(q, s)) => {
                        queue_id == q && seq == s
                    }
                    _ => false,
                });
        if !same {
            self.buf = buf;
            return Err(JournalError::Corrupt {
                path: path.to_path_buf(),
                offset: items[0].1.off,
                reason: "live op differs from the index while compacting".into(),
            });
        }
        // The payload is written from its read buffer (a body-sized piece: `Gather`).
        encode_frame(&mut buf, |out| out.put_body(&payload));
        let whole = 0..buf.len();
        let r = self.write_records(&mut buf, std::slice::from_ref(&whole), &[true]);
        buf.clear();
        self.buf = buf;
        let (new_seg, rec_off) = r.map_err(|(e, _)| e)?[0];
        let payload_off = rec_off + super::record::FRAME_HEADER as u64;
        {
            let mut idx = self.shared.index.write().unwrap();
            for ((key, old, ..), r) in items.iter().zip(&ranges) {
                let new = Loc {
                    seg: new_seg,
                    off: payload_off + r.start as u64,
                    len: old.len,
                };
                idx.relocate(*key, *old, new);
            }
        }
        self.shared
            .counters
            .compacted_bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The live ops of sealed segment `seg` (`live` bytes of them), in file order, found
    /// through the index, when that is cheap and they fit one step: at most
    /// [`INDEX_SCAN_MAX_OPS`] of them, and at most [`INDEX_SCAN_MAX_ENTRIES`] queues and
    /// messages in the whole index to look through. `None`: walk the segment instead (also
    /// when the index's per-segment counts disagree with what it holds; the walk checks).
    fn live_from_index(&self, seg: u64, live: u64, budget: usize) -> Option<Vec<(Key, Loc)>> {
        if !self.opts.compact_from_index {
            return None;
        }
        let idx = self.shared.index.read().unwrap();
        let live_ops = idx.segs.get(&seg)?.live_ops;
        if live as usize > budget || live_ops > INDEX_SCAN_MAX_OPS as u64 {
            return None;
        }
        if idx.queues.len() > INDEX_SCAN_MAX_ENTRIES {
            return None;
        }
        let entries: usize =
            idx.queues.len() + idx.queues.values().map(|q| q.msgs.len()).sum::<usize>();
        if entries > INDEX_SCAN_MAX_ENTRIES {
            return None;
        }
        let mut found: Vec<(Key, Loc)> = Vec::new();
        for (&q, e) in &idx.queues {
            if let Some((l, _)) = &e.def {
                if l.seg == seg {
                    found.push((Key::Def(q), *l));
                }
            }
            for (s, m) in e.msgs.iter() {
                if m.loc.seg == seg {
                    found.push((Key::Msg(q, s), m.loc));
                }
            }
        }
        let sum: u64 = found.iter().map(|(_, l)| l.len as u64).sum();
        if found.len() as u64 != live_ops || sum != live {
            return None;
        }
        found.sort_unstable_by_key(|(_, l)| l.off);
        Some(found)
    }
}

/// Writes `bytes` at `off` in pieces of `piece` bytes (the last one shorter), cut wherever
/// they fall, and starts the writeback of every piece but the last as soon as it is written
/// (`JournalOptions::writeback_bytes`). The same bytes at the same offsets as one vectored
/// write; the caller's `fdatasync` follows as before.
fn write_in_pieces(
    file: &dyn SegmentFile,
    bytes: &[IoSlice<'_>],
    off: u64,
    piece: u64,
) -> std::io::Result<()> {
    let total: u64 = bytes.iter().map(|b| b.len() as u64).sum();
    let mut at = off;
    let mut cur: Vec<IoSlice<'_>> = Vec::new();
    let mut n = 0u64;
    for b in bytes {
        let mut s: &[u8] = b;
        while !s.is_empty() {
            let take = (piece - n).min(s.len() as u64) as usize;
            cur.push(IoSlice::new(&s[..take]));
            s = &s[take..];
            n += take as u64;
            if n == piece {
                file.write_vectored_at(&cur, at)?;
                at += n;
                if at < off + total {
                    file.start_writeback(at - n, n);
                }
                n = 0;
                cur.clear();
            }
        }
    }
    if n > 0 {
        file.write_vectored_at(&cur, at)?;
    }
    Ok(())
}
