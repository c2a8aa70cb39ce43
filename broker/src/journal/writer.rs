//! The writer thread: group commit, segment rolling, and compaction.
//!
//! One thread owns the active segment. It blocks for the first submission, drains whatever
//! else is already queued (up to `max_batch_bytes`), encodes everything into one buffer,
//! issues one write and ONE `fdatasync`, applies the ops to the index, then completes every
//! waiter. There is no timer: a lone submission waits for exactly one sync, and under load
//! one sync covers every record that queued up during the previous one.
//!
//! Compaction runs on this same thread, one bounded step (at most `max_batch_bytes` copied,
//! or one segment dropped) between batches, and continuously when idle, so it never races
//! the writer and never starves senders for more than one step.
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

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, TryRecvError};
use tokio::sync::oneshot;

use super::error::JournalError;
use super::index::{Key, Loc, SegMeta};
use super::io::{Io, SegmentFile};
use super::op::{decode_payload, Entry, Op};
use super::record::encode_frame;
use super::segment::{encode_header, segment_path, HEADER_LEN};
use super::{JournalOptions, Shared};

pub(crate) type Done = oneshot::Sender<Result<(), JournalError>>;

pub(crate) enum Msg {
    Submit {
        ops: Vec<Op>,
        /// Encoded size, for batch limits.
        size: usize,
        done: Done,
    },
    Shutdown,
}

pub(crate) struct Active {
    pub seg: u64,
    pub file: Arc<dyn SegmentFile>,
    pub cap: u64,
    pub pos: u64,
}

pub(crate) struct Writer {
    pub shared: Arc<Shared>,
    pub rx: Receiver<Msg>,
    pub opts: JournalOptions,
    pub active: Active,
    pub buf: Vec<u8>,
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
    pub fn run(mut self) {
        loop {
            let first = if self.compaction_target().is_some() {
                match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => {
                        self.compact_step();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match self.rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            };
            let mut batch: Vec<(Vec<Op>, Done)> = Vec::new();
            let mut bytes = 0usize;
            let mut stop = false;
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Msg::Shutdown => {
                        stop = true;
                        break;
                    }
                    Msg::Submit { ops, size, done } => {
                        bytes += size;
                        batch.push((ops, done));
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
                break;
            }
            if self.compaction_target().is_some() {
                self.compact_step();
            }
        }
        tracing::debug!("journal writer stopped");
    }

    fn poisoned(&self) -> Option<JournalError> {
        self.shared.poisoned_error()
    }

    fn poison(&self, e: &JournalError) {
        tracing::error!(error = %e, "journal poisoned: refusing all further writes");
        self.shared.poison(e);
    }

    /// Writes one batch of submissions as one group commit.
    fn commit(&mut self, batch: Vec<(Vec<Op>, Done)>) {
        if let Some(e) = self.poisoned() {
            for (_, done) in batch {
                let _ = done.send(Err(e.clone()));
            }
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // Per record: its range in buf, the batch entry, and each op's range in buf.
        let mut recs: Vec<Range<usize>> = Vec::with_capacity(batch.len());
        let mut rec_ops: Vec<(usize, Vec<Range<usize>>)> = Vec::with_capacity(batch.len());
        for (i, (ops, _)) in batch.iter().enumerate() {
            if ops.is_empty() {
                // Nothing to write; completing it with this batch makes it a barrier.
                continue;
            }
            let start = buf.len();
            let mut ranges = Vec::with_capacity(ops.len());
            encode_frame(&mut buf, |out| {
                for op in ops {
                    let s = out.len();
                    op.encode(out);
                    ranges.push(s..out.len());
                }
            });
            recs.push(start..buf.len());
            rec_ops.push((i, ranges));
        }

        let (locs, failure) = if recs.is_empty() {
            (Vec::new(), None)
        } else {
            match self.write_records(&buf, &recs) {
                Ok(locs) => (locs, None),
                // `durable` holds the records synced before the failure (a batch that crossed
                // a segment boundary): they are on disk and are acknowledged as such.
                Err((e, durable)) => (durable, Some(e)),
            }
        };
        {
            let mut idx = self.shared.index.write().unwrap();
            for ((i, ranges), (rec, &(seg, file_off))) in
                rec_ops.iter().zip(recs.iter().zip(locs.iter()))
            {
                for (op, r) in batch[*i].0.iter().zip(ranges) {
                    let loc = Loc {
                        seg,
                        off: file_off + (r.start - rec.start) as u64,
                        len: r.len() as u32,
                    };
                    idx.apply(op, loc, false);
                }
            }
        }
        let c = &self.shared.counters;
        c.records.fetch_add(locs.len() as u64, Ordering::Relaxed);
        c.batches.fetch_add(1, Ordering::Relaxed);
        let written = recs
            .get(..locs.len())
            .and_then(|r| r.last())
            .map_or(0, |r| r.end);
        c.bytes_written.fetch_add(written as u64, Ordering::Relaxed);
        match failure {
            None => {
                for (_, done) in batch {
                    let _ = done.send(Ok(()));
                }
            }
            Some(e) => {
                self.poison(&e);
                // Records are in batch order; the first `locs.len()` non-empty submissions are
                // durable. Empty ones (barriers) before them are complete too.
                let durable_upto = rec_ops.get(locs.len()).map_or(batch.len(), |(i, _)| *i);
                for (i, (_, done)) in batch.into_iter().enumerate() {
                    let _ = done.send(if i < durable_upto {
                        Ok(())
                    } else {
                        Err(e.clone())
                    });
                }
            }
        }
        // Keep the allocation for the next batch, unless one huge record inflated it.
        if buf.capacity() > 2 * self.opts.max_batch_bytes.max(1 << 20) {
            buf = Vec::new();
        }
        self.buf = buf;
    }

    /// Writes framed records (contiguous ranges of `buf`) and makes them durable. Returns
    /// each record's (segment, file offset). Usually one write and one sync; a batch that
    /// crosses a segment boundary syncs the full segment before the next one is created, so
    /// that only the last segment can ever have a torn tail.
    /// On failure, returns the error and the locations of the records already synced (a
    /// prefix of `recs`).
    #[allow(clippy::type_complexity)]
    fn write_records(
        &mut self,
        buf: &[u8],
        recs: &[Range<usize>],
    ) -> Result<Vec<(u64, u64)>, (JournalError, Vec<(u64, u64)>)> {
        let mut locs: Vec<(u64, u64)> = Vec::with_capacity(recs.len());
        let mut durable = 0usize;
        macro_rules! attempt {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(err) => {
                        locs.truncate(durable);
                        return Err((err, locs));
                    }
                }
            };
        }
        let mut chunk: Option<(usize, u64)> = None; // (start in buf, file offset)
        let mut chunk_end = 0usize;
        let mut dirty = false;
        for r in recs {
            let len = r.len() as u64;
            if self.active.pos + len > self.active.cap {
                if let Some((s, off)) = chunk.take() {
                    attempt!(self.write_chunk(&buf[s..chunk_end], off));
                    dirty = true;
                }
                if dirty {
                    attempt!(self.sync_active());
                    dirty = false;
                    durable = locs.len();
                }
                attempt!(self.roll(len));
            }
            if chunk.is_none() {
                chunk = Some((r.start, self.active.pos));
            }
            chunk_end = r.end;
            locs.push((self.active.seg, self.active.pos));
            self.active.pos += len;
        }
        if let Some((s, off)) = chunk {
            attempt!(self.write_chunk(&buf[s..chunk_end], off));
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

    fn write_chunk(&self, bytes: &[u8], off: u64) -> Result<(), JournalError> {
        self.active.file.write_at(bytes, off).map_err(|e| {
            JournalError::write(
                "write",
                segment_path(&self.shared.dir, self.active.seg),
                bytes.len() as u64,
                e,
            )
        })
    }

    fn sync_active(&self) -> Result<(), JournalError> {
        self.shared.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.active.file.sync().map_err(|e| {
            JournalError::io(
                "fdatasync",
                segment_path(&self.shared.dir, self.active.seg),
                e,
            )
        })
    }

    /// Seals the active segment (already synced) and starts the next one, big enough for a
    /// record of `need` bytes.
    fn roll(&mut self, need: u64) -> Result<(), JournalError> {
        let seg = self.active.seg + 1;
        let cap = self.opts.segment_size.max(HEADER_LEN + need);
        let file = create_segment(
            &self.shared.dir,
            &*self.shared.io,
            seg,
            cap,
            Some(&self.shared),
        )?;
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
        self.active = Active {
            seg,
            file,
            cap,
            pos: HEADER_LEN,
        };
        Ok(())
    }

    /// The oldest sealed segment, if it should be dropped now:
    /// - it holds nothing live: delete it;
    /// - its live ratio is below `compact_live_ratio`: copy its live ops forward, delete it;
    /// - the sealed segments together are below the ratio and at least a segment's worth of
    ///   space is dead: copy it forward even if it is mostly live. Otherwise one long-lived
    ///   oldest segment would pin every dead segment behind it and disk use would not follow
    ///   live data.
    fn compaction_target(&self) -> Option<u64> {
        if self.shared.is_poisoned() {
            return None;
        }
        let idx = self.shared.index.read().unwrap();
        let (&oldest, meta) = idx.segs.iter().next()?;
        if oldest == self.active.seg {
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

    /// One bounded step of compaction on the oldest sealed segment.
    fn compact_step(&mut self) {
        let Some(seg) = self.compaction_target() else {
            return;
        };
        if let Err(e) = self.try_compact_step(seg) {
            self.poison(&e);
        }
    }

    fn try_compact_step(&mut self, seg: u64) -> Result<(), JournalError> {
        let budget = self.opts.max_batch_bytes.max(1);
        let (file, items) = {
            let idx = self.shared.index.read().unwrap();
            let meta = &idx.segs[&seg];
            let mut items: Vec<(Key, Loc)> = Vec::new();
            let mut bytes = 0usize;
            for (&off, &(key, len)) in &meta.live_ops {
                if !items.is_empty() && bytes + len as usize > budget {
                    break;
                }
                bytes += len as usize;
                items.push((key, Loc { seg, off, len }));
            }
            (meta.file.clone(), items)
        };
        let path = segment_path(&self.shared.dir, seg);

        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if items.is_empty() {
            // Nothing live left: record the id watermark, then unlink.
            let mark = self.shared.index.read().unwrap().mark();
            encode_frame(&mut buf, |out| mark.encode(out));
            let r = self.write_records(&buf, std::slice::from_ref(&(0..buf.len())));
            self.buf = buf;
            r.map_err(|(e, _)| e)?;
            {
                let mut idx = self.shared.index.write().unwrap();
                idx.segs.remove(&seg);
            }
            // Readers holding this file's Arc keep reading it after the unlink.
            drop(file);
            if let Err(e) = self.shared.io.remove(&self.shared.dir, seg) {
                // Harmless for correctness: the file only holds dead or copied records, and
                // as the oldest segment it is dropped again after the next open.
                tracing::warn!(path = %path.display(), error = %e, "journal: could not remove segment");
            } else if let Err(e) = self.shared.io.sync_dir(&self.shared.dir) {
                tracing::warn!(error = %e, "journal: could not fsync the directory");
            }
            self.shared
                .counters
                .segments_deleted
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(segment = seg, "journal: dropped segment");
            return Ok(());
        }

        // Copy live ops forward verbatim: each op is self-contained.
        let mut payload = Vec::with_capacity(items.iter().map(|(_, l)| l.len as usize).sum());
        let mut ranges = Vec::with_capacity(items.len());
        for (_, loc) in &items {
            let s = payload.len();
            payload.resize(s + loc.len as usize, 0);
            file.read_at(&mut payload[s..], loc.off)
                .map_err(|e| JournalError::io("read", &path, e))?;
            ranges.push(s..payload.len());
        }
        // Check what we copy is what the index says it is, so a bug or bit rot is
        // caught here instead of being re-framed under a fresh, valid CRC.
        let payload = Bytes::from(payload);
        let decoded = decode_payload(&payload).map_err(|e| JournalError::Corrupt {
            path: path.clone(),
            offset: items[0].1.off,
            reason: format!("live op does not decode while compacting: {}", e.0),
        })?;
        let same = decoded.len() == items.len()
            && decoded
                .iter()
                .zip(&items)
                .all(|((e, _), (key, _))| match (e, key) {
                    (Entry::Op(Op::DefineQueue { queue_id, .. }), Key::Def(q)) => queue_id == q,
                    (Entry::Op(Op::Put { queue_id, seq, .. }), Key::Msg(q, s)) => {
                        queue_id == q && seq == s
                    }
                    _ => false,
                });
        if !same {
            self.buf = buf;
            return Err(JournalError::Corrupt {
                path,
                offset: items[0].1.off,
                reason: "live op differs from the index while compacting".into(),
            });
        }
        encode_frame(&mut buf, |out| out.extend_from_slice(&payload));
        let r = self.write_records(&buf, std::slice::from_ref(&(0..buf.len())));
        self.buf = buf;
        let (new_seg, rec_off) = r.map_err(|(e, _)| e)?[0];
        let payload_off = rec_off + super::record::FRAME_HEADER as u64;
        {
            let mut idx = self.shared.index.write().unwrap();
            for ((key, old), r) in items.iter().zip(&ranges) {
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
}
