//! Recovery: scan every segment in order, replay records into a fresh [`Index`], and cut
//! the torn tail of the last segment.
//!
//! Only the last segment may end badly: the writer syncs a segment completely before it
//! creates the next one, so in any earlier segment a bad record is real corruption, and
//! opening refuses with [`JournalError::Corrupt`] rather than silently dropping data.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use super::error::JournalError;
use super::index::{Index, Loc, SegMeta};
use super::io::Io;
use super::op::{decode_payload, Entry};
use super::record::{decode_frame, Frame};
use super::segment::{check_header, segment_path, HEADER_LEN};
use super::{RecoveredMessage, Recovery};

/// Result of scanning the directory: the live index (headers still inside), the scan's
/// numbers, and the highest segment number seen in the directory.
pub(crate) struct Scan {
    pub index: Index,
    pub segments: usize,
    pub records: u64,
    pub bytes: u64,
    pub truncated: Option<(u64, u64)>,
    pub highest_listed: u64,
}

pub(crate) fn scan(dir: &Path, io: &dyn Io) -> Result<Scan, JournalError> {
    let list = io.list(dir).map_err(|e| JournalError::io("list", dir, e))?;
    let mut out = Scan {
        index: Index::default(),
        segments: 0,
        records: 0,
        bytes: 0,
        truncated: None,
        highest_listed: list.last().copied().unwrap_or(0),
    };
    for (i, &n) in list.iter().enumerate() {
        let last = i + 1 == list.len();
        let path = segment_path(dir, n);
        let file = io
            .open(dir, n)
            .map_err(|e| JournalError::io("open", &path, e))?;
        let len = file.len().map_err(|e| JournalError::io("stat", &path, e))?;
        let mut buf = vec![0u8; len as usize];
        file.read_at(&mut buf, 0)
            .map_err(|e| JournalError::io("read", &path, e))?;

        if let Err(reason) = check_header(&buf, n) {
            if !last {
                return Err(JournalError::Corrupt {
                    path,
                    offset: 0,
                    reason,
                });
            }
            // The writer syncs a new segment's header before writing any record into it,
            // so a last segment with a bad header holds nothing that was acknowledged:
            // a crash while it was being created.
            tracing::warn!(path = %path.display(), %reason, "journal: removing half-created last segment");
            drop(file);
            io.remove(dir, n)
                .map_err(|e| JournalError::io("remove", &path, e))?;
            io.sync_dir(dir)
                .map_err(|e| JournalError::io("fsync directory", dir, e))?;
            out.truncated = Some((n, 0));
            continue;
        }

        out.index.segs.insert(
            n,
            SegMeta {
                file: file.clone(),
                cap: len,
                end: HEADER_LEN,
                live: 0,
                live_ops: BTreeMap::new(),
            },
        );
        out.segments += 1;

        let buf = Bytes::from(buf);
        let mut at = HEADER_LEN as usize;
        let bad: Option<String> = loop {
            match decode_frame(&buf, at) {
                Frame::Record { payload, next } => {
                    let entries = match decode_payload(&buf.slice(payload.clone())) {
                        Ok(e) => e,
                        Err(e) => break Some(format!("record does not decode: {}", e.0)),
                    };
                    // The whole record is valid before any of its ops is applied: a
                    // multi-op submit is all or nothing.
                    for (entry, r) in &entries {
                        match entry {
                            Entry::Op(op) => {
                                let loc = Loc {
                                    seg: n,
                                    off: (payload.start + r.start) as u64,
                                    len: r.len() as u32,
                                };
                                out.index.apply(op, loc, true);
                            }
                            Entry::Mark(m) => out.index.apply_mark(m),
                        }
                    }
                    out.records += 1;
                    at = next;
                }
                Frame::End => break None,
                Frame::Incomplete => {
                    break Some("record runs past the end of the file (torn write)".into());
                }
                Frame::Corrupt(why) => break Some(why.to_string()),
            }
        };
        if let Some(reason) = bad {
            if !last {
                return Err(JournalError::Corrupt {
                    path,
                    offset: at as u64,
                    reason,
                });
            }
            // Torn tail of the last segment: everything from here on was never
            // acknowledged. Zero it so these stale bytes can never be read as records
            // once new records are appended before them.
            let dirty_end = buf.iter().rposition(|&b| b != 0).map_or(at, |p| p + 1);
            tracing::warn!(path = %path.display(), offset = at, %reason, "journal: truncating torn tail");
            let zeros = vec![0u8; (dirty_end - at).min(1 << 20)];
            let mut off = at;
            while off < dirty_end {
                let n = (dirty_end - off).min(zeros.len());
                file.write_at(&zeros[..n], off as u64)
                    .map_err(|e| JournalError::write("zero-fill", &path, n as u64, e))?;
                off += n;
            }
            file.sync()
                .map_err(|e| JournalError::io("fdatasync", &path, e))?;
            out.truncated = Some((n, at as u64));
        }
        out.index.segs.get_mut(&n).unwrap().end = at as u64;
        out.bytes += at as u64;
    }
    Ok(out)
}

/// Builds the broker's view from a scanned index and drops the headers from the index.
pub(crate) fn take_recovery(scan: &mut Scan, elapsed: Duration) -> Recovery {
    let index = &mut scan.index;
    let mut queues: Vec<(u64, Bytes)> = index
        .queues
        .iter()
        .filter_map(|(q, e)| e.def.as_ref().map(|(_, d)| (*q, d.clone())))
        .collect();
    queues.sort_unstable_by_key(|(q, _)| *q);
    let mut messages = BTreeMap::new();
    let mut headers = std::mem::take(&mut index.headers);
    for (q, e) in index.queues.iter() {
        if e.msgs.is_empty() {
            continue;
        }
        let v: Vec<RecoveredMessage> = e
            .msgs
            .iter()
            .map(|(seq, m)| RecoveredMessage {
                seq: *seq,
                header: headers.remove(&(*q, *seq)).unwrap_or_default(),
                body_len: m.body_len,
            })
            .collect();
        messages.insert(*q, v);
    }
    drop(headers);
    Recovery {
        queues,
        messages,
        max_queue_id: index.max_queue_id,
        max_seq: index.max_seq.clone(),
        segments: scan.segments,
        records: scan.records,
        bytes: scan.bytes,
        truncated: scan.truncated,
        elapsed,
    }
}
