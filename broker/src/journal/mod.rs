//! The broker's durable journal: an append-only log of opaque records in preallocated
//! segment files, with group commit, crash recovery and compaction.
//!
//! It owns the bytes on disk and an index of where every live queue def and message is.
//! It does not know what a def, header or body means (the broker encodes those), nor about
//! transactions: a transaction commits as one [`Journal::submit`] of many ops, which is atomic.
//!
//! An acknowledgement ([`Commit`] resolving to `Ok`) means the record is on disk: its
//! `fdatasync` returned. After a failed sync (or a failed write other than ENOSPC) the journal
//! is poisoned and refuses every later write until it is reopened.
//!
//! A full disk (ENOSPC) does not poison: the journal enters *disk-full* mode, where it refuses
//! records that store data ([`Op::Put`], [`Op::DefineQueue`]; not a detached definition,
//! [`Journal::submit_detached`], as refusing it would poison) with [`JournalError::NoSpace`]
//! and keeps writing records that only free data (removes, purges, deletes) and detached
//! definitions, for which it keeps a reserve file on disk (`reserve.bin`, one segment's size)
//! that it gives up when a new segment cannot be allocated otherwise. (The broker asks for
//! no new queue while the journal is in disk-full mode, so detached definitions there are
//! the few already under way when the disk filled.) It leaves disk-full mode by itself once the
//! reserve can be allocated again (tried at most every [`DISK_FULL_RETRY`]).
//!
//! Submissions wait in a bounded queue ([`JournalOptions::max_queued_bytes`],
//! [`JournalOptions::max_queued_records`]): when it is full, [`Journal::submit`] blocks the
//! calling thread until the writer has taken enough out (backpressure, at most about one
//! group commit).
//!
//! One thread, the writer, does every write and sync, except one: a caller that awaits its
//! commit before anything else ([`Journal::submit_awaited`], a transaction's commit) writes
//! and syncs its record itself when the writer is idle, holding the writer's lock
//! ([`JournalOptions::inline_commits`]). The writer holds that lock whenever it works and
//! releases it only while it waits for work, so records still reach the disk one group
//! commit at a time, in the order they were submitted.
//!
//! Layout:
//! - `op.rs`: [`Op`] and the payload encoding.
//! - `record.rs`: record framing (length, CRC32C) and the incomplete/corrupt decoder.
//! - `segment.rs`: segment file names and header.
//! - `io.rs`: the [`Io`] / [`SegmentFile`] storage traits and [`FileIo`].
//! - `faulty_io.rs`: [`FaultyIo`], in-memory storage that fails and crashes on request.
//! - `index.rs`: the live index and per-segment live bytes.
//! - `recovery.rs`: scanning, replay, torn-tail truncation, damage detection.
//! - `admission.rs`: the bounded submission queue (backpressure).
//! - `writer.rs`: the writer thread (group commit, rolling, compaction) and inline commits.
//! - `error.rs`: [`JournalError`].
//!
//! The byte layout is in `broker/docs/journal-format.md`.
//!
//! ```
//! use mq_broker::journal::{Journal, JournalOptions, Op};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let (journal, recovery) = Journal::open(dir.path(), JournalOptions::default())?;
//! println!("recovered {} queues", recovery.queues.len());
//! journal
//!     .submit(vec![Op::Put { queue_id: 1, seq: 1, header: "h".into(), body: "b".into() }])
//!     .wait()?; // durable now
//! assert_eq!(&journal.read_body(1, 1)?[..], b"b");
//! # Ok(()) }
//! ```

mod admission;
mod cache;
mod error;
mod faulty_io;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod gather;
mod index;
mod io;
mod msgs;
mod op;
mod record;
mod recovery;
mod segment;
mod unlink;
mod writer;

pub use error::JournalError;
pub use faulty_io::FaultyIo;
pub use io::{FileIo, Io, SegmentFile, RESERVE_FILE};
pub use op::Op;
pub use segment::{parse_segment_file_name, segment_file_name};

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Sender;
use tokio::sync::oneshot;

use index::Index;
use record::{FRAME_HEADER, MAX_PAYLOAD};
use segment::{segment_path, HEADER_LEN};
use writer::{Active, Msg, Writer};

/// The writer's answer to one submission.
type Completion = oneshot::Receiver<Result<(), JournalError>>;

/// Tuning. The defaults suit a broker; tests use small segments.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// Size each segment file is preallocated to. A record larger than this gets a segment
    /// of its own size. Default 64 MiB; at least 4 KiB, at most 4 GiB.
    pub segment_size: u64,
    /// A sealed oldest segment whose live bytes are below this fraction of its written bytes
    /// is compacted (live records copied forward, file deleted). Default 0.5; in `[0, 0.9]`.
    pub compact_live_ratio: f64,
    /// A sealed segment that still holds live ops is not compacted before it has been sealed
    /// this long (unless the disk is full): what is consumed meanwhile is never copied. Under
    /// a steady flow the messages of a just-sealed segment are the few in flight, gone within
    /// milliseconds; compacting at once copied them forward and walked the whole segment on
    /// the writer, stalling every commit behind it. Segments of an earlier run (found by
    /// recovery) have no grace. Default 1 s; at most 1 h.
    pub compact_grace: std::time::Duration,
    /// Compaction finds a sealed segment's live ops through the index when there are few of
    /// them and the index is small (see `writer.rs`), instead of reading the whole segment.
    /// Default true; false always walks (tests of the walk).
    pub compact_from_index: bool,
    /// The writer stops draining queued submissions into one batch (one write, one sync)
    /// once it holds this many bytes; also bounds one compaction step. Default 8 MiB.
    pub max_batch_bytes: usize,
    /// Bytes of submissions allowed to wait for the writer; [`Journal::submit`] blocks while
    /// more are queued (a single larger submission waits until the queue is empty).
    /// Default 64 MiB.
    pub max_queued_bytes: usize,
    /// Submissions allowed to wait for the writer; [`Journal::submit`] blocks while the queue
    /// holds this many (the channel preallocates a slot for each). Default 4,096.
    pub max_queued_records: usize,
    /// Size of the reserve file kept for disk-full mode (see the module docs); `None` = one
    /// segment (`segment_size`). `Some(0)` keeps no reserve.
    pub reserve_bytes: Option<u64>,
    /// Open even if the last segment is damaged before records that were written after the
    /// damage (see `recovery.rs`): drop everything from the damage on, and log it
    /// (`mqd --truncate-damaged-journal`). Default false: opening fails with
    /// [`JournalError::Damaged`].
    pub truncate_damaged: bool,
    /// Recovery hands over each live message's header ([`RecoveredMessage::header`]).
    /// Default true. False: headers are left on disk and `header` is empty; the caller reads
    /// them with [`Journal::read_headers`] in batches, so opening a journal with millions of
    /// waiting messages never holds all their headers at once (the broker does this).
    pub recover_headers: bool,
    /// Bytes of recently written message bodies under 64 KiB kept in memory (each charged its
    /// length plus 128 bytes), so that reading a message soon after it was written needs no
    /// read from disk; the oldest are dropped first beyond it, and every body goes with its
    /// message.
    /// 0 keeps none. Default [`DEFAULT_BODY_CACHE_BYTES`] (`mqd --journal-body-cache-bytes`).
    pub body_cache_bytes: u64,
    /// On storage whose preallocated space is not yet written ([`Io::zero_ahead`]: real files),
    /// the writer keeps this many bytes after the end of the active segment's records written
    /// with zeros and synced, topping them up whenever it is idle and less than half are left.
    /// A commit into them then costs one data flush: its `fdatasync` has no extent conversion
    /// to commit to the filesystem's journal (on ext4 here: ~115 us instead of ~135 us at the
    /// median, ~130 us instead of ~230 us at p90). Under load the writer is never idle, writes
    /// into unwritten space as before, and zeros nothing. 0: off; more than `segment_size` counts as `segment_size`.
    /// Default [`DEFAULT_ZERO_AHEAD_BYTES`].
    pub zero_ahead_bytes: u64,
    /// A group commit (or compaction step) that writes more than this many bytes is written
    /// in pieces of this size, and the disk is told to start on each piece as soon as it is
    /// written ([`SegmentFile::start_writeback`]); the last piece goes with the `fdatasync`
    /// as before. The device then writes while the next piece is copied, instead of taking
    /// the whole batch only at the `fdatasync`: on ext4 here 1 MB recoverable sends went from
    /// 360-690 to 1,190-1,310 msg/s, 100 KB from 4.1-5.6k to 11.3-12.5k msg/s
    /// (docs/benchmarks.md, "Writeback started while the batch is written"). Same bytes, same
    /// one `fdatasync` per group commit. 0: off (one vectored write per batch). Default
    /// [`DEFAULT_WRITEBACK_BYTES`]; otherwise at least 4 KiB.
    pub writeback_bytes: u64,
    /// After a batch of one small submission (at most [`IDLE_SPIN_MAX_BYTES`]), with nothing
    /// else queued, the writer watches its queues for this long before it sleeps: a
    /// submission made meanwhile is taken at once, with no futex wake-up of the writer (on
    /// either side: the submitter's send finds nobody asleep). For callers that await each
    /// commit before the next one (synchronous transactions), whose next record comes one
    /// round trip after the last completed. It spins with `spin_loop` and gives the CPU away
    /// (`sched_yield`) between looks, so threads that are ready to run are not held up, but
    /// it costs CPU time while nothing arrives. Under a pipelined load the queue is never
    /// empty after a batch and it never spins. Zero (the default): sleeps at once.
    /// At most [`MAX_IDLE_SPIN`].
    pub idle_spin: Duration,
    /// A caller that awaits its commit before it does anything else
    /// ([`Journal::submit_awaited`]: a transaction's commit) writes and syncs its record on its
    /// own thread when the writer is idle (nothing queued, the writer asleep), instead of
    /// handing it to the writer thread and being woken by it: two thread hand-offs fewer, the
    /// most part of what a synchronous transaction costs besides its `fdatasync` on a small
    /// VM. The same group commit of a batch of one; under load the writer is never idle and
    /// every submission goes through its queue as before. The caller's thread is blocked for
    /// the write and the sync. Off while [`JournalOptions::idle_spin`] is set: a spinning
    /// writer takes such commits itself (faster on a 2-vCPU VM, for ~40% more CPU: see
    /// docs/benchmarks.md). Default true.
    pub inline_commits: bool,
}

/// Default [`JournalOptions::writeback_bytes`]: 1 MiB.
pub const DEFAULT_WRITEBACK_BYTES: u64 = 1 << 20;

/// A batch of one submission of at most this many bytes makes the writer spin
/// ([`JournalOptions::idle_spin`]) before it sleeps.
pub const IDLE_SPIN_MAX_BYTES: usize = 64 << 10;

/// A record of at most this many bytes may be committed on its caller's thread
/// ([`Journal::submit_awaited`]); a larger one goes to the writer thread, whose writes are
/// written in pieces with writeback started ([`JournalOptions::writeback_bytes`]).
pub const INLINE_MAX_BYTES: usize = 64 << 10;

/// Largest [`JournalOptions::idle_spin`].
pub const MAX_IDLE_SPIN: Duration = Duration::from_millis(1);

/// Default [`JournalOptions::zero_ahead_bytes`]: 1 MiB, about 900 one-message commits of
/// 1000 B bodies, topped up (one write of >= 512 KiB and one `fdatasync`, ~1 ms) when idle.
pub const DEFAULT_ZERO_AHEAD_BYTES: u64 = 1 << 20;

/// Default [`JournalOptions::body_cache_bytes`]: none. Measured on a quiet machine (1000 B
/// recoverable, closed loop, separate mqd), 64 MiB cost 15% of the send rate (every body under
/// 64 KiB copied and indexed as it is written) for no gain in receive, end-to-end rate or
/// latency; see docs/benchmarks.md "Recoverable bodies from memory".
pub const DEFAULT_BODY_CACHE_BYTES: u64 = 0;

/// A body [`Journal::read_bodies`] reads from a file: its index in the answer, the file, its
/// segment, offset and length.
type BodyRead = (usize, Arc<dyn SegmentFile>, u64, u64, u32);

/// Reads the run of `todo` (sorted by segment and offset) that starts at `start` with one
/// call: the same segment, each read starting at most [`RUN_GAP`] bytes after the one before
/// ends, all within [`MAX_RUN_BYTES`]. Returns the end of the run in `todo` (exclusive), the
/// run's first offset, and its bytes.
fn read_run(
    dir: &Path,
    todo: &[BodyRead],
    start: usize,
) -> Result<(usize, u64, Bytes), JournalError> {
    let (_, ref file, seg, first_off, first_len) = todo[start];
    let mut end_off = first_off + first_len as u64;
    let mut end = start + 1;
    while end < todo.len() {
        let (_, _, s, off, len) = todo[end];
        let next_end = off + len as u64;
        if s != seg
            || off < end_off
            || off - end_off > RUN_GAP
            || next_end - first_off > MAX_RUN_BYTES
        {
            break;
        }
        end_off = next_end;
        end += 1;
    }
    let buf = file
        .read_vec_at((end_off - first_off) as usize, first_off)
        .map_err(|e| JournalError::io("read", segment_path(dir, seg), e))?;
    Ok((end, first_off, Bytes::from(buf)))
}

/// [`Journal::read_bodies`] reads two bodies with one call when at most this many bytes lie
/// between them (the next record's frame and the message's header).
const RUN_GAP: u64 = 4096;
/// ... and while the whole read stays within this many bytes.
const MAX_RUN_BYTES: u64 = 1 << 20;

/// Largest [`JournalOptions::segment_size`]: offsets in the index are 32-bit.
pub const MAX_SEGMENT_SIZE: u64 = 1 << 32;

/// How often, at most, a journal in disk-full mode tries to allocate its reserve again.
pub const DISK_FULL_RETRY: Duration = Duration::from_millis(250);

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            segment_size: 64 << 20,
            compact_live_ratio: 0.5,
            compact_grace: std::time::Duration::from_secs(1),
            compact_from_index: true,
            max_batch_bytes: 8 << 20,
            max_queued_bytes: 64 << 20,
            max_queued_records: 4096,
            reserve_bytes: None,
            truncate_damaged: false,
            recover_headers: true,
            body_cache_bytes: DEFAULT_BODY_CACHE_BYTES,
            zero_ahead_bytes: DEFAULT_ZERO_AHEAD_BYTES,
            writeback_bytes: DEFAULT_WRITEBACK_BYTES,
            idle_spin: Duration::ZERO,
            inline_commits: true,
        }
    }
}

/// Submissions whose records must reach the disk in order, each only if every earlier one
/// did ([`Journal::submit_chained`]): once one fails, for any reason, every later one of the
/// chain fails with [`JournalError::EarlierFailed`] without being written, until
/// [`Chain::reset`]. A stream whose records each carry a high-water mark uses one, so that a
/// later record never marks an earlier, lost one as stored.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    broken: Arc<Mutex<Option<Arc<str>>>>,
}

impl Chain {
    /// A new, unbroken chain.
    pub fn new() -> Self {
        Chain::default()
    }

    /// Whether a submission of this chain failed since the last reset.
    pub fn is_broken(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Accepts submissions again. Call only once every earlier submission of the chain has
    /// completed.
    pub fn reset(&self) {
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Marks the chain broken by `e` (keeps the first cause).
    pub(crate) fn break_with(&self, e: &JournalError) {
        let mut b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_none() {
            *b = Some(Arc::from(e.to_string()));
        }
    }

    /// The error for a submission refused because the chain is broken.
    pub(crate) fn refusal(&self) -> Option<JournalError> {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .map(|cause| JournalError::EarlierFailed { cause })
    }
}

/// What recovery found. Bodies are not loaded: read them with [`Journal::read_body`].
#[derive(Debug, Clone)]
pub struct Recovery {
    /// Live queue definitions, by queue id.
    pub queues: Vec<(u64, Bytes)>,
    /// Live messages per queue, sorted by seq. Queues without live messages are absent.
    pub messages: BTreeMap<u64, Vec<RecoveredMessage>>,
    /// Highest queue id in any record ever written (kept across compaction by watermarks).
    pub max_queue_id: u64,
    /// Highest seq per queue in any Put, Remove or Purge (including `through_seq`), for
    /// queues that were not deleted. The broker must not reuse these.
    pub max_seq: BTreeMap<u64, u64>,
    /// Segment files scanned.
    pub segments: usize,
    /// Records replayed.
    pub records: u64,
    /// Bytes scanned up to the end of data (segment headers included).
    pub bytes: u64,
    /// `(segment, offset)` where a torn tail was cut, if one was.
    pub truncated: Option<(u64, u64)>,
    /// Valid records dropped with the damage because
    /// [`JournalOptions::truncate_damaged`] was set (0 for a torn tail).
    pub dropped_records: u64,
    /// How long the scan took.
    pub elapsed: Duration,
}

/// A live message found by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredMessage {
    /// Its seq in its queue.
    pub seq: u64,
    /// The header bytes as put (empty unless [`JournalOptions::recover_headers`]).
    pub header: Bytes,
    /// Length of the body, which stays on disk.
    pub body_len: u32,
}

/// Counters for monitoring. `syncs` counts every `fdatasync` (commits, compaction, new
/// segments); `records_written / batches` is the group-commit factor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalStats {
    /// Segment files in use.
    pub segments: usize,
    /// Bytes allocated on disk by those files.
    pub disk_bytes: u64,
    /// Bytes of live ops (defs and messages) in them.
    pub live_bytes: u64,
    /// `fdatasync` calls issued since open.
    pub syncs: u64,
    /// Records written for submissions since open.
    pub records_written: u64,
    /// Group commits (one write + one sync each, two if crossing a segment).
    pub batches: u64,
    /// Bytes written for submissions since open.
    pub bytes_written: u64,
    /// Segments created since open.
    pub segments_created: u64,
    /// Segments deleted by compaction since open.
    pub segments_deleted: u64,
    /// Bytes of live ops copied forward by compaction since open.
    pub compacted_bytes: u64,
    /// Bytes compaction read from sealed segments since open: its walks of whole segments,
    /// and the live ops it found through the index instead.
    pub compaction_read_bytes: u64,
    /// Bytes of zeros written ahead of the records since open
    /// ([`JournalOptions::zero_ahead_bytes`]).
    pub zeroed_bytes: u64,
    /// Times the writer spun before sleeping ([`JournalOptions::idle_spin`]) since open.
    pub idle_spins: u64,
    /// ... and of those, how many ended with a submission taken without sleeping.
    pub idle_spin_catches: u64,
    /// Commits written and synced by their caller while the writer was idle
    /// ([`Journal::submit_awaited`], [`JournalOptions::inline_commits`]) since open.
    pub inline_commits: u64,
    /// True once a sync (or a write, other than ENOSPC) failed.
    pub poisoned: bool,
    /// True while the disk is full: records that store data are refused.
    pub disk_full: bool,
    /// Duration of each `fdatasync`, in seconds.
    pub sync_seconds: crate::histogram::HistogramSnapshot,
    /// Records per group commit.
    pub batch_records: crate::histogram::HistogramSnapshot,
    /// Submissions waiting for the writer, and their bytes.
    pub queued_records: u64,
    /// Bytes of the submissions waiting for the writer.
    pub queued_bytes: u64,
    /// Bodies read from memory (recently written, [`JournalOptions::body_cache_bytes`]).
    pub body_cache_hits: u64,
    /// Bodies read from the segment files.
    pub bodies_read: u64,
    /// Read calls made for them (one per run of adjacent bodies).
    pub body_reads: u64,
    /// Bodies kept in memory now.
    pub body_cache_entries: u64,
    /// Bytes charged for the bodies kept in memory now (at most the budget).
    pub body_cache_bytes: u64,
}

pub(crate) struct Counters {
    pub syncs: AtomicU64,
    /// Duration of each `fdatasync`, in seconds.
    pub sync_seconds: crate::histogram::AtomicHistogram,
    /// Records per group commit.
    pub batch_records: crate::histogram::AtomicHistogram,
    pub records: AtomicU64,
    pub batches: AtomicU64,
    pub bytes_written: AtomicU64,
    pub segments_created: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub compacted_bytes: AtomicU64,
    pub compaction_read_bytes: AtomicU64,
    pub zeroed_bytes: AtomicU64,
    pub idle_spins: AtomicU64,
    pub idle_spin_catches: AtomicU64,
    pub inline_commits: AtomicU64,
    pub body_cache_hits: AtomicU64,
    pub bodies_read: AtomicU64,
    pub body_reads: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        use crate::histogram::{AtomicHistogram, BATCH_RECORDS, SYNC_SECONDS};
        Counters {
            syncs: AtomicU64::new(0),
            sync_seconds: AtomicHistogram::new(SYNC_SECONDS, 1e9),
            batch_records: AtomicHistogram::new(BATCH_RECORDS, 1.0),
            records: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            segments_created: AtomicU64::new(0),
            segments_deleted: AtomicU64::new(0),
            compacted_bytes: AtomicU64::new(0),
            compaction_read_bytes: AtomicU64::new(0),
            zeroed_bytes: AtomicU64::new(0),
            idle_spins: AtomicU64::new(0),
            idle_spin_catches: AtomicU64::new(0),
            inline_commits: AtomicU64::new(0),
            body_cache_hits: AtomicU64::new(0),
            bodies_read: AtomicU64::new(0),
            body_reads: AtomicU64::new(0),
        }
    }
}

/// State shared by handles and the writer thread.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub io: Arc<dyn Io>,
    pub index: RwLock<Index>,
    poisoned: AtomicBool,
    poison_cause: Mutex<Option<Arc<str>>>,
    pub counters: Counters,
    /// Disk-full mode (see the module docs); set and cleared by the writer.
    pub disk_full: AtomicBool,
    pub admission: admission::Admission,
    /// Submissions sent to the writer and not completed yet.
    pub pending: AtomicU64,
    /// The active segment is format version 3 or later, so records may hold [`Op::Rekey`]
    /// (set at open, or by the first new segment after it; never cleared, as every later
    /// active segment is new).
    pub rekey: AtomicBool,
    /// Bodies are kept in memory after they are written ([`JournalOptions::body_cache_bytes`]).
    pub cache_bodies: bool,
}

impl Shared {
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    pub fn poisoned_error(&self) -> Option<JournalError> {
        if !self.is_poisoned() {
            return None;
        }
        let cause = self.poison_cause.lock().unwrap().clone();
        Some(JournalError::Poisoned {
            cause: cause.unwrap_or_else(|| Arc::from("unknown")),
        })
    }

    pub fn poison(&self, e: &JournalError) {
        let mut c = self.poison_cause.lock().unwrap();
        if c.is_none() {
            *c = Some(Arc::from(e.to_string()));
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// The error for a waiter whose completion was dropped without an answer.
    fn dropped_error(&self) -> JournalError {
        self.poisoned_error().unwrap_or(JournalError::Closed)
    }
}

struct Inner {
    shared: Arc<Shared>,
    tx: Sender<Msg>,
    /// The lane of [`Journal::submit_removal`].
    urgent: Sender<Msg>,
    closed: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The writer, locked by its thread except while that waits for work; empty once it
    /// stopped. [`Journal::submit_awaited`] takes it to commit on the caller's thread.
    writer: Arc<Mutex<Option<Writer>>>,
    /// [`JournalOptions::inline_commits`].
    inline_commits: bool,
}

impl Inner {
    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let handle = self.thread.lock().unwrap().take();
        if let Some(h) = handle {
            let _ = self.tx.send(Msg::Shutdown);
            if h.join().is_err() {
                tracing::error!("journal writer thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A handle to an open journal. Cheap to clone, `Send + Sync`; the writer thread stops on
/// [`Journal::shutdown`] or when the last handle is dropped.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.inner.shared.dir)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (or creates) the journal in `dir` on real files.
    pub fn open(dir: &Path, opts: JournalOptions) -> Result<(Journal, Recovery), JournalError> {
        Self::open_with_io(dir, opts, Arc::new(FileIo))
    }

    /// Opens (or creates) the journal in `dir` on the given storage: recovers (cutting a torn
    /// tail of the last segment; refusing with [`JournalError::Damaged`] if valid records
    /// follow the damage, unless `truncate_damaged`), then starts the writer thread.
    pub fn open_with_io(
        dir: &Path,
        opts: JournalOptions,
        io: Arc<dyn Io>,
    ) -> Result<(Journal, Recovery), JournalError> {
        if opts.segment_size < 4096 {
            return Err(JournalError::InvalidOptions(format!(
                "segment_size {} is below the minimum of 4096 bytes",
                opts.segment_size
            )));
        }
        // The index keeps offsets in 32 bits (`msgs.rs`).
        if opts.segment_size > MAX_SEGMENT_SIZE {
            return Err(JournalError::InvalidOptions(format!(
                "segment_size {} is above the maximum of {MAX_SEGMENT_SIZE} bytes (4 GiB)",
                opts.segment_size
            )));
        }
        // Near 1.0 every sealed segment qualifies (frame headers and marks are never live),
        // so compaction would rewrite live data forever.
        if !(0.0..=0.9).contains(&opts.compact_live_ratio) {
            return Err(JournalError::InvalidOptions(format!(
                "compact_live_ratio {} is not within 0..=0.9",
                opts.compact_live_ratio
            )));
        }
        if opts.max_batch_bytes == 0 {
            return Err(JournalError::InvalidOptions(
                "max_batch_bytes must be positive".into(),
            ));
        }
        if opts.writeback_bytes != 0 && opts.writeback_bytes < 4096 {
            return Err(JournalError::InvalidOptions(format!(
                "writeback_bytes {} is below the minimum of 4 KiB (0 turns it off)",
                opts.writeback_bytes
            )));
        }
        if opts.compact_grace > Duration::from_secs(3600) {
            return Err(JournalError::InvalidOptions(format!(
                "compact_grace {:?} is above the maximum of 1 h",
                opts.compact_grace
            )));
        }
        if opts.idle_spin > MAX_IDLE_SPIN {
            return Err(JournalError::InvalidOptions(format!(
                "idle_spin {:?} is above the maximum of {MAX_IDLE_SPIN:?}",
                opts.idle_spin
            )));
        }
        let start = Instant::now();
        io.init(dir)
            .map_err(|e| JournalError::io("create directory", dir, e))?;
        if opts.max_queued_bytes == 0 || opts.max_queued_records == 0 {
            return Err(JournalError::InvalidOptions(
                "max_queued_bytes and max_queued_records must be positive".into(),
            ));
        }
        let mut scan = recovery::scan(dir, &*io, opts.truncate_damaged, opts.recover_headers)?;
        let recovery = recovery::take_recovery(&mut scan, Duration::ZERO);
        let mut index = scan.index;
        index.cache = cache::BodyCache::new(opts.body_cache_bytes);

        let versions = std::mem::take(&mut scan.versions);
        let mut rekey = true;
        let active = match index.segs.iter_mut().next_back() {
            Some((&seg, meta)) => {
                if meta.cap < opts.segment_size {
                    // A segment whose preallocation did not survive a crash: top it up.
                    let path = segment_path(dir, seg);
                    meta.file.preallocate(opts.segment_size).map_err(|e| {
                        JournalError::write("preallocate", &path, opts.segment_size, e)
                    })?;
                    meta.cap = opts.segment_size;
                }
                // A journal written by an older version appends to its last segment, which
                // keeps its version: no Rekey there (the next segment is new).
                rekey = versions
                    .get(&seg)
                    .is_some_and(|&v| v >= segment::REKEY_VERSION);
                Active {
                    seg,
                    file: meta.file.clone(),
                    cap: meta.cap,
                    pos: meta.end,
                    flags: versions.get(&seg).is_some_and(|&v| v >= 2),
                    stale_end: 0,
                    zeroed: meta.end,
                }
            }
            None => {
                let seg = scan.highest_listed + 1;
                let file = writer::create_segment(dir, &*io, seg, opts.segment_size, None)?;
                index.segs.insert(
                    seg,
                    index::SegMeta {
                        file: file.clone(),
                        cap: opts.segment_size,
                        end: HEADER_LEN,
                        live: 0,
                        live_ops: 0,
                    },
                );
                Active {
                    seg,
                    file,
                    cap: opts.segment_size,
                    pos: HEADER_LEN,
                    flags: true,
                    stale_end: 0,
                    zeroed: HEADER_LEN,
                }
            }
        };

        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            io,
            index: RwLock::new(index),
            poisoned: AtomicBool::new(false),
            poison_cause: Mutex::new(None),
            counters: Counters::default(),
            disk_full: AtomicBool::new(false),
            admission: admission::Admission::new(opts.max_queued_bytes),
            pending: AtomicU64::new(0),
            rekey: AtomicBool::new(rekey),
            cache_bodies: opts.body_cache_bytes > 0,
        });
        let (tx, rx) = crossbeam_channel::bounded(opts.max_queued_records);
        let (urgent, urgent_rx) = crossbeam_channel::unbounded();
        let mut w = Writer::new(shared.clone(), rx, urgent_rx, opts.clone(), active);
        w.restore_reserve();
        let writer = Arc::new(Mutex::new(Some(w)));
        let slot = writer.clone();
        let thread = std::thread::Builder::new()
            .name("mq-journal-writer".into())
            .spawn(move || Writer::run(slot))
            .map_err(|e| JournalError::io("spawn writer thread for", dir, e))?;
        let recovery = Recovery {
            elapsed: start.elapsed(),
            ..recovery
        };
        tracing::info!(
            dir = %dir.display(),
            segments = recovery.segments,
            records = recovery.records,
            queues = recovery.queues.len(),
            elapsed_ms = recovery.elapsed.as_millis() as u64,
            truncated = ?recovery.truncated,
            dropped_records = recovery.dropped_records,
            disk_full = shared.disk_full.load(Ordering::Relaxed),
            "journal opened"
        );
        let journal = Journal {
            inner: Arc::new(Inner {
                shared,
                tx,
                urgent,
                closed: AtomicBool::new(false),
                thread: Mutex::new(Some(thread)),
                writer,
                // A spinning writer takes lone commits itself (`idle_spin`).
                inline_commits: opts.inline_commits && opts.idle_spin.is_zero(),
            }),
        };
        Ok((journal, recovery))
    }

    /// Queues `ops` to be written as ONE record: after a crash either all of them are there
    /// or none is. The returned [`Commit`] completes once the record is durable (its
    /// `fdatasync` returned) or failed. Submissions are written in the order they are made
    /// from one thread; an empty `ops` completes after everything submitted before it.
    pub fn submit(&self, ops: Vec<Op>) -> Commit {
        self.submit_inner(ops, false, None)
    }

    /// Like [`Journal::submit`], as the next record of `chain`: written only if every earlier
    /// submission of the chain was (see [`Chain`]).
    pub fn submit_chained(&self, ops: Vec<Op>, chain: &Chain) -> Commit {
        if let Some(e) = chain.refusal() {
            return Commit::ready(Err(e));
        }
        self.submit_inner(ops, false, Some(chain.clone()))
    }

    /// Like [`Journal::submit`], for ops that only remove records that are already durable
    /// (the `Remove` of a message that was delivered, or purged, after its `Put` was synced):
    /// it rides the very next group commit, ahead of submissions queued before it, instead of
    /// waiting behind them (and is not held back by the queue's bounds). That bounds the time
    /// from a receiver's acknowledgement to the durable removal to about two group commits.
    /// Because its targets are durable, writing it before earlier submissions changes nothing
    /// else; do not use it for anything that must follow an earlier record.
    pub fn submit_removal(&self, ops: Vec<Op>) -> Commit {
        let (msg, _, rx) = match self.prepare(ops, false, None) {
            Ok(p) => p,
            Err(failed) => return failed,
        };
        self.send_urgent(msg, rx)
    }

    /// Like [`Journal::submit_removal`] (`urgent`) or [`Journal::submit`] (not), for a removal
    /// its caller awaits before it answers (a receive from a transactional queue, a committed
    /// single-message transaction): if the writer is idle, the record is written and synced
    /// right here, as with [`Journal::submit_awaited`], and the returned commit is complete
    /// ([`Commit::try_outcome`] tells).
    pub fn submit_removal_awaited(&self, ops: Vec<Op>, urgent: bool) -> Commit {
        let (msg, size, rx) = match self.prepare(ops, false, None) {
            Ok(p) => p,
            Err(failed) => return failed,
        };
        match self.try_inline(msg, size, rx, ()) {
            Ok(done) => done,
            Err((msg, rx, ())) if urgent => self.send_urgent(msg, rx),
            Err((msg, rx, ())) => self.enqueue(msg, size, rx, None),
        }
    }

    /// Hands a prepared removal to the writer's urgent lane (see [`Journal::submit_removal`]).
    fn send_urgent(&self, msg: Msg, rx: Completion) -> Commit {
        let shared = &self.inner.shared;
        // Counted like every submission: the writer's completion takes it off again.
        shared.pending.fetch_add(1, Ordering::AcqRel);
        if self.inner.urgent.send(msg).is_err() {
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Commit::ready(Err(shared.dropped_error()));
        }
        self.pending_commit(rx)
    }

    /// Like [`Journal::submit`], for a caller that awaits this commit before it does anything
    /// else (a transaction's commit) and holds `held` (a lock that orders its submissions
    /// against others'). If the writer is idle, the record is written and synced right here,
    /// on the caller's thread ([`JournalOptions::inline_commits`]), and the returned commit is
    /// already complete; `held` is released as soon as the writer's lock is taken, so a
    /// submission made after it still comes after it on disk, and does not wait for its sync
    /// to be made. Otherwise (the writer busy or asleep with work queued, a large record) it
    /// is queued as by `submit`, then `held` is released.
    pub fn submit_awaited<G>(&self, ops: Vec<Op>, held: G) -> Commit {
        let (msg, size, rx) = match self.prepare(ops, false, None) {
            Ok(p) => p,
            Err(failed) => return failed,
        };
        let (msg, rx, held) = match self.try_inline(msg, size, rx, held) {
            Ok(done) => return done,
            Err(p) => p,
        };
        let commit = self.enqueue(msg, size, rx, None);
        drop(held);
        commit
    }

    /// Commits a prepared submission on the caller's thread if inline commits are on, the
    /// record is at most [`INLINE_MAX_BYTES`] and the writer is idle (its lock free, both of
    /// its queues empty, not poisoned): then `held` is dropped as soon as the writer's lock is
    /// taken and the commit returned is complete. Otherwise the submission (and `held`) comes
    /// back.
    #[allow(clippy::type_complexity)]
    fn try_inline<G>(
        &self,
        msg: Msg,
        size: usize,
        rx: Completion,
        held: G,
    ) -> Result<Commit, (Msg, Completion, G)> {
        if !self.inner.inline_commits || size > INLINE_MAX_BYTES {
            return Err((msg, rx, held));
        }
        let Ok(mut slot) = self.inner.writer.try_lock() else {
            return Err((msg, rx, held));
        };
        let Some(w) = slot.as_mut().filter(|w| w.is_idle()) else {
            drop(slot);
            return Err((msg, rx, held));
        };
        drop(held);
        let Msg::Submit { ops, done, .. } = msg else {
            unreachable!("prepare makes a submission")
        };
        // Counted like every submission: the completion takes it off again.
        self.inner.shared.pending.fetch_add(1, Ordering::AcqRel);
        let wake = w.commit_inline(ops, done);
        drop(slot);
        if wake {
            // Full: the writer has work queued and wakes for it anyway.
            let _ = self.inner.tx.try_send(Msg::Wake);
        }
        Ok(self.pending_commit(rx))
    }

    fn submit_inner(&self, ops: Vec<Op>, detached: bool, chain: Option<Chain>) -> Commit {
        let (msg, size, rx) = match self.prepare(ops, detached, chain.clone()) {
            Ok(p) => p,
            Err(failed) => {
                if let (Some(c), CommitState::Ready(Some(Err(e)))) = (&chain, &failed.state) {
                    c.break_with(e);
                }
                return failed;
            }
        };
        self.enqueue(msg, size, rx, chain)
    }

    /// Queues a prepared submission for the writer thread.
    fn enqueue(&self, msg: Msg, size: usize, rx: Completion, chain: Option<Chain>) -> Commit {
        let shared = &self.inner.shared;
        // Backpressure: wait for room in the queue (bytes here, count in the channel).
        shared.admission.acquire(size);
        shared.pending.fetch_add(1, Ordering::AcqRel);
        if self.inner.tx.send(msg).is_err() {
            shared.admission.release(size);
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            let e = shared.dropped_error();
            if let Some(c) = &chain {
                c.break_with(&e);
            }
            return Commit::ready(Err(e));
        }
        self.pending_commit(rx)
    }

    /// The checks every submission passes (poisoned, closed, too large) and its message for
    /// the writer: `(message, record size, completion)`, or the already failed commit.
    fn prepare(
        &self,
        mut ops: Vec<Op>,
        detached: bool,
        chain: Option<Chain>,
    ) -> Result<(Msg, usize, Completion), Commit> {
        let shared = &self.inner.shared;
        if let Some(e) = shared.poisoned_error() {
            return Err(Commit::ready(Err(e)));
        }
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Commit::ready(Err(JournalError::Closed)));
        }
        if !shared.rekey.load(Ordering::Acquire)
            && ops.iter().any(|o| matches!(o, Op::Rekey { .. }))
        {
            return Err(Commit::ready(Err(JournalError::InvalidOptions(
                "a rekey op needs a format version 3 segment; ask can_rekey first".into(),
            ))));
        }
        debug_assert!(
            rekeys_come_first(&ops),
            "a Remove before a Rekey of the same message"
        );
        let payload: usize = ops.iter().map(Op::encoded_len).sum();
        if payload > MAX_PAYLOAD || ops.iter().any(Op::has_oversized_field) {
            return Err(Commit::ready(Err(JournalError::TooLarge {
                size: (payload + FRAME_HEADER) as u64,
                max: (MAX_PAYLOAD + FRAME_HEADER) as u64,
            })));
        }
        if shared.cache_bodies {
            // The body the writer keeps in memory after writing it: a small one is copied out
            // of the buffer it arrived in, which it would pin otherwise (see `cache.rs`).
            for op in &mut ops {
                if let Op::Put { body, .. } = op {
                    if !body.is_empty() && body.len() < cache::MAX_BODY {
                        *body = Bytes::copy_from_slice(body);
                    }
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        let size = payload + FRAME_HEADER;
        let msg = Msg::Submit {
            ops,
            size,
            done: tx,
            detached,
            chain,
        };
        Ok((msg, size, rx))
    }

    fn pending_commit(&self, rx: Completion) -> Commit {
        Commit {
            state: CommitState::Pending {
                rx,
                shared: self.inner.shared.clone(),
            },
        }
    }

    /// Like [`Journal::submit`], for a record nobody waits for but that later records depend
    /// on (a queue definition whose queue is used at once): written even on a full disk, into
    /// the reserve's space if need be, as removals are; if it fails anyway (no reserve left,
    /// or any other failure) the journal is poisoned, so no later record that depends on it
    /// can become durable without it.
    pub fn submit_detached(&self, ops: Vec<Op>) {
        // A pending one is checked by the writer (`Msg::Submit::detached`).
        if let CommitState::Ready(Some(Err(e))) = self.submit_inner(ops, true, None).state {
            if !e.is_poisoned() && !matches!(e, JournalError::Closed) {
                self.inner.shared.poison(&e);
            }
        }
    }

    /// Submissions made and not completed yet (neither durable nor failed).
    pub fn pending(&self) -> u64 {
        self.inner.shared.pending.load(Ordering::Acquire)
    }

    /// Whether records may hold [`Op::Rekey`]: the active segment is format version 3 or
    /// later. False after opening a journal of an older version, until its next segment; once
    /// true it stays true.
    pub fn can_rekey(&self) -> bool {
        self.inner.shared.rekey.load(Ordering::Acquire)
    }

    /// True while the disk under the journal is full: records that store data are refused
    /// with [`JournalError::NoSpace`]; records that free data are still written.
    pub fn is_disk_full(&self) -> bool {
        self.inner.shared.disk_full.load(Ordering::Acquire)
    }

    /// Reads the body of a live message: from memory if it was written recently (see
    /// [`JournalOptions::body_cache_bytes`]), else from its segment. Safe to call while
    /// compaction moves the message or deletes its old segment: the open file stays readable.
    pub fn read_body(&self, queue_id: u64, seq: u64) -> Result<Bytes, JournalError> {
        let mut v = self.read_bodies(queue_id, &[seq])?;
        Ok(v.pop().expect("one body per seq"))
    }

    /// The bodies of those live messages of a queue that are kept in memory (recently
    /// written), in the order of `seqs`; never reads the disk (so it does not block).
    pub fn cached_bodies(&self, queue_id: u64, seqs: &[u64]) -> Vec<Option<Bytes>> {
        let shared = &self.inner.shared;
        if !shared.cache_bodies {
            // No cache (the default): no lock, no lookups.
            return vec![None; seqs.len()];
        }
        let out: Vec<Option<Bytes>> = {
            let idx = shared.index.read().unwrap();
            seqs.iter()
                .map(|&s| idx.cache.get((queue_id, s)).cloned())
                .collect()
        };
        let hits = out.iter().filter(|b| b.is_some()).count() as u64;
        if hits > 0 {
            shared
                .counters
                .body_cache_hits
                .fetch_add(hits, Ordering::Relaxed);
        }
        out
    }

    /// The bodies of live messages of a queue, in the order of `seqs`: from memory where kept
    /// (see [`JournalOptions::body_cache_bytes`]), else read from their segments, with one read
    /// for each run of messages that lie close together in one segment (a batch of messages
    /// written one after another). Blocks on the disk: call it off async worker threads.
    pub fn read_bodies(&self, queue_id: u64, seqs: &[u64]) -> Result<Vec<Bytes>, JournalError> {
        let shared = &self.inner.shared;
        let mut out: Vec<Option<Bytes>> = Vec::with_capacity(seqs.len());
        let mut todo: Vec<BodyRead> = Vec::new();
        let mut hits = 0u64;
        {
            let idx = shared.index.read().unwrap();
            for (i, &seq) in seqs.iter().enumerate() {
                let m = idx
                    .msg(queue_id, seq)
                    .ok_or(JournalError::NotFound { queue_id, seq })?;
                if let Some(b) = idx.cache.get((queue_id, seq)) {
                    out.push(Some(b.clone()));
                    hits += 1;
                    continue;
                }
                out.push(if m.body_len == 0 {
                    Some(Bytes::new())
                } else {
                    None
                });
                if m.body_len > 0 {
                    let seg = &idx.segs[&m.loc.seg];
                    todo.push((i, seg.file.clone(), m.loc.seg, m.body_off(), m.body_len));
                }
            }
        }
        let c = &shared.counters;
        let mut reads = 0u64;
        let mut start = 0;
        while start < todo.len() {
            let (end, first_off, buf) = read_run(&shared.dir, &todo, start)?;
            reads += 1;
            for &(i, _, _, off, len) in &todo[start..end] {
                let from = (off - first_off) as usize;
                out[i] = Some(if end - start == 1 {
                    buf.clone()
                } else {
                    buf.slice(from..from + len as usize)
                });
            }
            start = end;
        }
        if hits > 0 {
            c.body_cache_hits.fetch_add(hits, Ordering::Relaxed);
        }
        c.bodies_read
            .fetch_add(todo.len() as u64, Ordering::Relaxed);
        c.body_reads.fetch_add(reads, Ordering::Relaxed);
        Ok(out
            .into_iter()
            .map(|b| b.expect("every body found or read"))
            .collect())
    }

    /// The headers (as put) and body lengths of live messages of a queue, in the order of
    /// `seqs`, with the bodies of those whose body is at most `max_body` bytes (read with their
    /// header: they follow it in the record), read from their segments with one read for each
    /// run of messages that lie close together in one segment. What a queue that keeps only
    /// some headers in memory reads back. Blocks on the disk.
    #[allow(clippy::type_complexity)]
    pub fn read_headers(
        &self,
        queue_id: u64,
        seqs: &[u64],
        max_body: u32,
    ) -> Result<Vec<(Bytes, u32, Option<Bytes>)>, JournalError> {
        let shared = &self.inner.shared;
        // With bodies kept in memory, delivery finds them there: none are read here.
        let max_body = if shared.cache_bodies { 0 } else { max_body };
        // (index in the answer, file, segment, header offset, header (+ body) length)
        let mut todo: Vec<BodyRead> = Vec::with_capacity(seqs.len());
        let mut lens = Vec::with_capacity(seqs.len());
        {
            let idx = shared.index.read().unwrap();
            for (i, &seq) in seqs.iter().enumerate() {
                let m = idx
                    .msg(queue_id, seq)
                    .ok_or(JournalError::NotFound { queue_id, seq })?;
                let seg = &idx.segs[&m.loc.seg];
                let off = m.loc.off + op::PUT_FIXED as u64;
                let with_body = m.body_len > 0 && m.body_len <= max_body;
                let len = m.header_len + if with_body { m.body_len } else { 0 };
                todo.push((i, seg.file.clone(), m.loc.seg, off, len));
                lens.push((m.header_len, m.body_len, with_body));
            }
        }
        let mut out: Vec<(Bytes, Option<Bytes>)> = vec![(Bytes::new(), None); seqs.len()];
        let (mut bodies, mut body_reads) = (0u64, 0u64);
        // Runs in file order (a queue's records usually follow one another).
        todo.sort_by_key(|t| (t.2, t.3));
        let mut start = 0;
        while start < todo.len() {
            let (end, first_off, buf) = read_run(&shared.dir, &todo, start)?;
            let mut any_body = false;
            for &(i, _, _, off, _) in &todo[start..end] {
                let from = (off - first_off) as usize;
                let (hl, bl, with_body) = lens[i];
                if with_body {
                    bodies += 1;
                    any_body = true;
                }
                let to = from + hl as usize;
                // Slices: the caller decodes the header at once; a body kept pins the run's
                // buffer (at most MAX_RUN_BYTES) while it is kept.
                out[i] = (
                    buf.slice(from..to),
                    with_body.then(|| buf.slice(to..to + bl as usize)),
                );
            }
            body_reads += any_body as u64;
            start = end;
        }
        // Bodies read from the segments, as `read_bodies` counts them.
        let c = &shared.counters;
        c.bodies_read.fetch_add(bodies, Ordering::Relaxed);
        c.body_reads.fetch_add(body_reads, Ordering::Relaxed);
        Ok(out
            .into_iter()
            .zip(lens)
            .map(|((h, b), (_, bl, _))| (h, bl, b))
            .collect())
    }

    /// Whether a failed write made the journal refuse writes until restart.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.is_poisoned()
    }

    /// Current counters.
    pub fn stats(&self) -> JournalStats {
        let s = &self.inner.shared;
        let (segments, disk_bytes, live_bytes, cache_entries, cache_bytes) = {
            let idx = s.index.read().unwrap();
            (
                idx.segs.len(),
                idx.segs.values().map(|m| m.cap).sum(),
                idx.live_bytes(),
                idx.cache.len() as u64,
                idx.cache.bytes(),
            )
        };
        let c = &s.counters;
        JournalStats {
            segments,
            disk_bytes,
            live_bytes,
            syncs: c.syncs.load(Ordering::Relaxed),
            sync_seconds: c.sync_seconds.snapshot(),
            batch_records: c.batch_records.snapshot(),
            records_written: c.records.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            segments_created: c.segments_created.load(Ordering::Relaxed),
            segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
            compacted_bytes: c.compacted_bytes.load(Ordering::Relaxed),
            compaction_read_bytes: c.compaction_read_bytes.load(Ordering::Relaxed),
            zeroed_bytes: c.zeroed_bytes.load(Ordering::Relaxed),
            idle_spins: c.idle_spins.load(Ordering::Relaxed),
            idle_spin_catches: c.idle_spin_catches.load(Ordering::Relaxed),
            inline_commits: c.inline_commits.load(Ordering::Relaxed),
            poisoned: s.is_poisoned(),
            disk_full: s.disk_full.load(Ordering::Relaxed),
            queued_records: self.inner.tx.len() as u64,
            queued_bytes: s.admission.queued() as u64,
            body_cache_hits: c.body_cache_hits.load(Ordering::Relaxed),
            bodies_read: c.bodies_read.load(Ordering::Relaxed),
            body_reads: c.body_reads.load(Ordering::Relaxed),
            body_cache_entries: cache_entries,
            body_cache_bytes: cache_bytes,
        }
    }

    /// Writes and syncs everything submitted before this call, then stops the writer thread.
    /// Later submits fail with [`JournalError::Closed`]. Also happens when the last handle
    /// is dropped. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.shared.dir
    }
}

/// No `Rekey` of a message that a `Remove` earlier in the same record already removed (the
/// Rekey would find nothing to move: the message would be in neither queue).
fn rekeys_come_first(ops: &[Op]) -> bool {
    let mut removed = std::collections::HashSet::new();
    for op in ops {
        match op {
            Op::Remove { queue_id, seqs } => removed.extend(seqs.iter().map(|s| (*queue_id, *s))),
            Op::Rekey { queue_id, seq, .. } if removed.contains(&(*queue_id, *seq)) => {
                return false
            }
            _ => {}
        }
    }
    true
}

/// Completion of one [`Journal::submit`]: `Ok(())` once the record is durable.
/// Await it from async code, or call [`Commit::wait`] from a plain thread.
#[must_use = "a submission is only durable once its Commit resolves to Ok"]
pub struct Commit {
    state: CommitState,
}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Commit")
    }
}

enum CommitState {
    Ready(Option<Result<(), JournalError>>),
    Pending {
        rx: oneshot::Receiver<Result<(), JournalError>>,
        shared: Arc<Shared>,
    },
}

impl Commit {
    fn ready(r: Result<(), JournalError>) -> Self {
        Commit {
            state: CommitState::Ready(Some(r)),
        }
    }

    /// The outcome if it is known now (an inline commit, a failed submission, a completion
    /// that came), without waiting; `None` while the writer has not answered. After `Some`,
    /// the commit must not be awaited again.
    pub fn try_outcome(&mut self) -> Option<Result<(), JournalError>> {
        match &mut self.state {
            CommitState::Ready(r) => r.take(),
            CommitState::Pending { rx, shared } => match rx.try_recv() {
                Ok(r) => Some(r),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => Some(Err(shared.dropped_error())),
            },
        }
    }

    /// Blocks the current thread until the record is durable or failed.
    ///
    /// # Panics
    /// When called inside an async runtime (tokio forbids blocking there); `.await` instead.
    pub fn wait(self) -> Result<(), JournalError> {
        match self.state {
            CommitState::Ready(r) => r.expect("Commit already completed"),
            CommitState::Pending { rx, shared } => rx
                .blocking_recv()
                .unwrap_or_else(|_| Err(shared.dropped_error())),
        }
    }
}

impl Future for Commit {
    type Output = Result<(), JournalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            CommitState::Ready(r) => Poll::Ready(r.take().expect("Commit polled after completion")),
            CommitState::Pending { rx, shared } => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(r),
                Poll::Ready(Err(_)) => Poll::Ready(Err(shared.dropped_error())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
