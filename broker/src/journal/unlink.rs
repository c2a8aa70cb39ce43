//! Dropped segments are unlinked off the writer thread.
//!
//! Unlinking a 64 MiB preallocated segment makes the file system free its extents, which took
//! 15 ms on this project's VM (strace, during a recoverable run at half the maximum rate):
//! done by the writer, that stalls every group commit behind it, and the stalls were the
//! recoverable e2e p99 (docs/benchmarks.md, "Latency sweep"). So the writer hands the unlink
//! (and the directory fsync after it) to one helper thread and goes on.
//!
//! Off the writer was not enough: on ext4 the writer's `fdatasync`s still waited behind the
//! helper's unlink of a whole segment (recoverable e2e p99 at half the maximum rate 16-23 ms,
//! 3.6-4.8 ms with unlinks made no-ops). So the helper retires a segment ([`Io::retire`]): it
//! renames it out of the journal's sight, fsyncs the directory, and frees the space 1 MiB at a
//! time with a pause after each step before the unlink (`io.rs`, `RETIRE_STEP`).
//!
//! Safety: a segment is handed over only after the writer has made it dead (its live records
//! copied and synced, the id watermark synced) and removed it from the index, exactly where it
//! used to unlink it itself; a crash before the helper gets to it leaves a file that recovery
//! reads and drops again, as after a crash just before the old in-line unlink. Segments must go
//! oldest first (the module docs of `writer.rs`: a younger segment's tombstones may be what
//! kills an older one's records), so there is one helper thread and it takes them in order,
//! and the writer's in-line path ([`Unlinker::remove_now`], used in disk-full mode, where the
//! space is wanted at once) first waits for the ones handed over before.
//!
//! When the writer wants the space now ([`Unlinker::flush`]: disk-full mode, or a new segment
//! that did not fit, [`Unlinker::free_pending`]), the helper is told to hurry: the segment it
//! is retiring and the ones queued behind it are freed at once, without the pauses.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::io::Io;
use super::segment::segment_path;

enum Job {
    Remove(u64),
    /// Answered once every job before it is done.
    Flush(Sender<()>),
}

/// The helper thread that unlinks dropped segments, in order.
pub(crate) struct Unlinker {
    dir: PathBuf,
    io: Arc<dyn Io>,
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    state: Arc<State>,
}

/// What the writer and the helper share.
#[derive(Default)]
struct State {
    /// Segments handed to the helper and not yet removed.
    pending: AtomicUsize,
    /// Set while the writer waits for the space ([`Unlinker::flush`]): no pauses.
    hurry: AtomicBool,
}

impl Unlinker {
    /// Starts the helper thread; without one (the spawn failed) every unlink is in-line.
    pub fn start(dir: PathBuf, io: Arc<dyn Io>) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        let state = Arc::new(State::default());
        let (d, i, st) = (dir.clone(), io.clone(), state.clone());
        let thread = std::thread::Builder::new()
            .name("mq-journal-unlink".into())
            .spawn(move || run(&d, &*i, &rx, &st))
            .map_err(|e| tracing::warn!(error = %e, "journal: no unlink thread; unlinking in line"))
            .ok();
        Unlinker {
            dir,
            io,
            tx: thread.as_ref().map(|_| tx),
            thread,
            state,
        }
    }

    /// Unlinks `segment` on the helper thread, after the ones handed over before.
    pub fn remove(&self, segment: u64) {
        if let Some(tx) = &self.tx {
            self.state.pending.fetch_add(1, Ordering::AcqRel);
            if tx.send(Job::Remove(segment)).is_ok() {
                return;
            }
            self.state.pending.fetch_sub(1, Ordering::AcqRel);
        }
        remove_now(&self.dir, &*self.io, segment);
    }

    /// If segments handed over are still being freed, waits until they are (hurrying the
    /// helper) and returns true: space that was on its way back is there now.
    pub fn free_pending(&self) -> bool {
        if self.state.pending.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.flush();
        true
    }

    /// Unlinks `segment` before returning, after the ones handed over before.
    pub fn remove_now(&self, segment: u64) {
        self.flush();
        remove_now(&self.dir, &*self.io, segment);
    }

    /// Waits until every segment handed over is unlinked, the helper freeing them without its
    /// pauses meanwhile (the space is wanted now).
    pub fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done, wait) = crossbeam_channel::bounded(1);
            self.state.hurry.store(true, Ordering::Release);
            if tx.send(Job::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
            self.state.hurry.store(false, Ordering::Release);
        }
    }
}

impl Drop for Unlinker {
    /// Unlinks what was handed over before the journal is gone (so a closed journal's
    /// directory holds only its live segments, as before).
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.thread.take() {
            if h.join().is_err() {
                tracing::error!("journal unlink thread panicked");
            }
        }
    }
}

fn run(dir: &std::path::Path, io: &dyn Io, rx: &Receiver<Job>, state: &State) {
    for job in rx {
        match job {
            Job::Remove(segment) => {
                retire(dir, io, segment, &state.hurry);
                state.pending.fetch_sub(1, Ordering::AcqRel);
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// On the helper thread: [`Io::retire`], which frees the space a step at a time.
fn retire(dir: &std::path::Path, io: &dyn Io, segment: u64, hurry: &AtomicBool) {
    if let Err(e) = io.retire(dir, segment, hurry) {
        // Harmless for correctness, as in `remove_now`.
        tracing::warn!(path = %segment_path(dir, segment).display(), error = %e,
            "journal: could not remove segment");
    }
}

/// In line (disk-full mode, or no helper thread): one unlink, the space is wanted now.
fn remove_now(dir: &std::path::Path, io: &dyn Io, segment: u64) {
    if let Err(e) = io.remove(dir, segment) {
        // Harmless for correctness: the file only holds dead or copied records, and as the
        // oldest segment it is dropped again after the next open.
        tracing::warn!(path = %segment_path(dir, segment).display(), error = %e,
            "journal: could not remove segment");
    } else if let Err(e) = io.sync_dir(dir) {
        tracing::warn!(error = %e, "journal: could not fsync the directory");
    }
}
