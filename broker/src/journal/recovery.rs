//! Recovery: scan every segment in order, replay records into a fresh [`Index`], and cut
//! the torn tail of the last segment, but only if it is provably a torn write.
//!
//! Only the last segment may end badly: the writer syncs a segment completely before it
//! creates the next one, so in any earlier segment a bad record is real corruption, and
//! opening refuses with [`JournalError::Corrupt`] rather than silently dropping data.
//!
//! In the last segment, a crash can tear only the last write (one group commit), which was
//! never acknowledged. The rule that tells a torn write from damage to synced records (see
//! `docs/journal-format.md`, "Damage or torn tail"): after the first bad frame, search every
//! later byte offset for a valid record that starts a write (format version 2: the
//! [`WRITE_START`] flag; version 1 has no flag, so any valid record counts). The writer starts
//! a write only after the previous one was synced, so such a record proves the damaged bytes
//! were synced, i.e. acknowledged: opening refuses with [`JournalError::Damaged`] unless
//! [`JournalOptions::truncate_damaged`](super::JournalOptions) is set, which drops them and logs
//! what it dropped. Without such a record, the damage is a torn last write and is cut as before.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use super::error::JournalError;
use super::index::{Index, Loc, SegMeta};
use super::io::Io;
use super::op::{decode_payload, Entry};
use super::record::{decode_frame, Frame, FRAME_HEADER, MAX_PAYLOAD, WRITE_START};
use super::segment::{check_header, segment_path, HEADER_LEN, REKEY_VERSION};
use super::{RecoveredMessage, Recovery};

/// Result of scanning the directory: the live index (headers still inside), the scan's
/// numbers, and the highest segment number seen in the directory.
pub(crate) struct Scan {
    pub index: Index,
    pub segments: usize,
    pub records: u64,
    pub bytes: u64,
    pub truncated: Option<(u64, u64)>,
    pub dropped_records: u64,
    pub highest_listed: u64,
    /// Format version of each segment kept.
    pub versions: BTreeMap<u64, u32>,
}

/// The first offset at or after `from` where a valid record begins that proves an earlier
/// write was synced: with `flags` (format version 2) a record carrying the write-start flag,
/// without (version 1, or a segment whose header is unreadable) any valid record. Returns the
/// offset and the record's end. A record is valid when its length fits the buffer, its payload
/// decodes as ops and its CRC matches.
pub(crate) fn find_valid_record(buf: &[u8], from: usize, flags: bool) -> Option<(usize, usize)> {
    let mut x = from;
    while x + FRAME_HEADER < buf.len() {
        // Zeros (preallocated space) are the common case: skip them without decoding. A zero
        // length word is never a record; the next candidate starts at most 3 bytes before the
        // next non-zero byte (a length word may begin with zeros).
        if buf[x..x + 4] == [0; 4] {
            match buf[x..].iter().position(|&b| b != 0) {
                Some(p) => {
                    x = (x + p - 3).max(x + 1);
                    continue;
                }
                None => return None,
            }
        }
        if let Some(end) = valid_record_at(buf, x, flags) {
            return Some((x, end));
        }
        x += 1;
    }
    None
}

/// The end of the valid record at `x`, if there is one (see [`find_valid_record`]). Checks
/// the cheap things first: the length, then the ops' structure, then the CRC.
fn valid_record_at(buf: &[u8], x: usize, flags: bool) -> Option<usize> {
    let word = u32::from_le_bytes(buf[x..x + 4].try_into().unwrap());
    if flags && word & WRITE_START == 0 {
        return None;
    }
    let len = (word & !WRITE_START) as usize;
    if len == 0 || len > MAX_PAYLOAD || buf.len() - x - FRAME_HEADER < len {
        return None;
    }
    let payload = x + FRAME_HEADER..x + FRAME_HEADER + len;
    if !matches!(buf[payload.start], 1..=7) {
        return None;
    }
    decode_payload(&Bytes::copy_from_slice(&buf[payload.clone()])).ok()?;
    let crc = u32::from_le_bytes(buf[x + 4..x + 8].try_into().unwrap());
    (crc32c::crc32c(&buf[payload.clone()]) == crc).then_some(payload.end)
}

/// Valid records from `from` to the end of `buf` (each found by [`find_valid_record`] with
/// `flags`, then those chained after it): what truncating at `from` drops, for the log. Returns
/// their number and a summary of their ops (the first few, by kind, queue and seq).
fn count_valid_records(buf: &[u8], from: usize, flags: bool) -> (u64, String) {
    const SHOWN: usize = 20;
    let mut n = 0;
    let mut ops: Vec<String> = Vec::new();
    let mut total_ops = 0usize;
    let mut note = |payload: &[u8]| {
        if let Ok(entries) = decode_payload(&Bytes::copy_from_slice(payload)) {
            for (e, _) in entries {
                total_ops += 1;
                if ops.len() < SHOWN {
                    ops.push(match e {
                        Entry::Op(super::Op::Put { queue_id, seq, .. }) => {
                            format!("put {queue_id}:{seq}")
                        }
                        Entry::Op(super::Op::Remove { queue_id, seqs }) => {
                            format!("remove {queue_id}:{} seqs", seqs.len())
                        }
                        Entry::Op(super::Op::DefineQueue { queue_id, .. }) => {
                            format!("define {queue_id}")
                        }
                        Entry::Op(super::Op::DeleteQueue { queue_id }) => {
                            format!("delete {queue_id}")
                        }
                        Entry::Op(super::Op::Purge {
                            queue_id,
                            through_seq,
                        }) => format!("purge {queue_id}:..={through_seq}"),
                        Entry::Op(super::Op::Rekey {
                            queue_id,
                            seq,
                            to_queue_id,
                            to_seq,
                        }) => format!("rekey {queue_id}:{seq} to {to_queue_id}:{to_seq}"),
                        Entry::Mark(_) => "mark".to_string(),
                    });
                }
            }
        }
    };
    let mut at = from;
    while let Some((start, mut end)) = find_valid_record(buf, at, flags) {
        n += 1;
        note(&buf[start + FRAME_HEADER..end]);
        while let Frame::Record { next, payload, .. } = decode_frame(buf, end, flags) {
            n += 1;
            note(&buf[payload]);
            end = next;
        }
        at = end;
    }
    if total_ops > ops.len() {
        ops.push(format!("and {} more ops", total_ops - ops.len()));
    }
    (n, ops.join(", "))
}

/// `keep_headers`: keep every live Put's header for [`take_recovery`]
/// ([`JournalOptions::recover_headers`](super::JournalOptions)).
pub(crate) fn scan(
    dir: &Path,
    io: &dyn Io,
    truncate_damaged: bool,
    keep_headers: bool,
) -> Result<Scan, JournalError> {
    let list = io.list(dir).map_err(|e| JournalError::io("list", dir, e))?;
    let mut out = Scan {
        index: Index::default(),
        segments: 0,
        records: 0,
        bytes: 0,
        truncated: None,
        dropped_records: 0,
        highest_listed: list.last().copied().unwrap_or(0),
        versions: BTreeMap::new(),
    };
    for (i, &n) in list.iter().enumerate() {
        let last = i + 1 == list.len();
        let path = segment_path(dir, n);
        let file = io
            .open(dir, n)
            .map_err(|e| JournalError::io("open", &path, e))?;
        let len = file.len().map_err(|e| JournalError::io("stat", &path, e))?;
        if len > super::MAX_SEGMENT_SIZE {
            // The index keeps offsets in 32 bits; no journal writes a segment this large.
            return Err(JournalError::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "segment of {len} bytes, above the maximum of {} (4 GiB)",
                    super::MAX_SEGMENT_SIZE
                ),
            });
        }
        let mut buf = vec![0u8; len as usize];
        file.read_at(&mut buf, 0)
            .map_err(|e| JournalError::io("read", &path, e))?;

        let version = match check_header(&buf, n) {
            Ok(v) => v,
            Err(reason) => {
                if !last {
                    return Err(JournalError::Corrupt {
                        path,
                        offset: 0,
                        reason,
                    });
                }
                // The writer syncs a new segment's header before writing any record into
                // it, so a last segment with a bad header and no valid record was being
                // created when the process died: it holds nothing that was acknowledged.
                let hl = HEADER_LEN as usize;
                let found = find_valid_record(&buf, hl.min(buf.len()), false);
                if let Some((at, _)) = found {
                    if !truncate_damaged {
                        return Err(JournalError::Damaged {
                            path,
                            offset: 0,
                            reason,
                            next_record: at as u64,
                        });
                    }
                    let (dropped, ops) = count_valid_records(&buf, hl, false);
                    tracing::error!(path = %path.display(), %reason, records = dropped, bytes = len, %ops,
                        "journal: --truncate-damaged-journal: removing the last segment, whose header is damaged; its records are lost");
                    out.dropped_records += dropped;
                } else {
                    tracing::warn!(path = %path.display(), %reason, "journal: removing half-created last segment");
                }
                drop(file);
                io.remove(dir, n)
                    .map_err(|e| JournalError::io("remove", &path, e))?;
                io.sync_dir(dir)
                    .map_err(|e| JournalError::io("fsync directory", dir, e))?;
                out.truncated = Some((n, 0));
                continue;
            }
        };
        let flags = version >= 2;
        out.versions.insert(n, version);

        out.index.segs.insert(
            n,
            SegMeta {
                file: file.clone(),
                cap: len,
                end: HEADER_LEN,
                live: 0,
                live_ops: 0,
            },
        );
        out.segments += 1;

        let buf = Bytes::from(buf);
        let mut at = HEADER_LEN as usize;
        let bad: Option<String> = loop {
            match decode_frame(&buf, at, flags) {
                Frame::Record { payload, next, .. } => {
                    let entries = match decode_payload(&buf.slice(payload.clone())) {
                        Ok(e) => e,
                        Err(e) => break Some(format!("record does not decode: {}", e.0)),
                    };
                    if version < REKEY_VERSION
                        && entries
                            .iter()
                            .any(|(e, _)| matches!(e, Entry::Op(super::Op::Rekey { .. })))
                    {
                        break Some(format!(
                            "record holds a rekey op, which a format version {version} segment cannot"
                        ));
                    }
                    // The whole record is valid before any of its ops is applied: a
                    // multi-op submit is all or nothing.
                    apply(&mut out.index, n, &entries, &payload, keep_headers);
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
            if let Some((next, _)) = find_valid_record(&buf, at + 1, flags) {
                if !truncate_damaged {
                    return Err(JournalError::Damaged {
                        path,
                        offset: at as u64,
                        reason,
                        next_record: next as u64,
                    });
                }
                let (dropped, ops) = count_valid_records(&buf, at + 1, flags);
                tracing::error!(path = %path.display(), offset = at, %reason, records = dropped, %ops,
                    first_valid_record_after = next,
                    "journal: --truncate-damaged-journal: dropping everything from the damage to the end of the segment, including records that were written after it");
                out.dropped_records += dropped;
            } else {
                tracing::warn!(path = %path.display(), offset = at, %reason, "journal: truncating torn tail");
            }
            // Everything from here on goes. Zero it so these stale bytes can never be read
            // as records once new records are appended before them.
            let dirty_end = buf.iter().rposition(|&b| b != 0).map_or(at, |p| p + 1);
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

/// Applies the ops of one valid record found at `payload` in segment `seg`.
fn apply(
    index: &mut Index,
    seg: u64,
    entries: &[(Entry, Range<usize>)],
    payload: &Range<usize>,
    keep_headers: bool,
) {
    for (entry, r) in entries {
        match entry {
            Entry::Op(op) => {
                let loc = Loc {
                    seg,
                    off: (payload.start + r.start) as u64,
                    len: r.len() as u32,
                };
                index.apply(op, loc, keep_headers);
            }
            Entry::Mark(m) => index.apply_mark(m),
        }
    }
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
        // Sized up front: the iterator cannot say its length, and doubling would leave up to
        // half of a large queue's vector unused.
        let mut v: Vec<RecoveredMessage> = Vec::with_capacity(e.msgs.len());
        v.extend(e.msgs.iter().map(|(seq, m)| RecoveredMessage {
            seq,
            header: headers.remove(&(*q, seq)).unwrap_or_default(),
            body_len: m.body_len,
        }));
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
        dropped_records: scan.dropped_records,
        elapsed,
    }
}
