//! Record framing: `len u32 | crc32c u32 | payload`, little-endian (see
//! `docs/journal-format.md`). In format version 2 bit 31 of the length word is the
//! write-start flag ([`WRITE_START`]).
//!
//! The decoder tells three outcomes apart: a good record, the end of data (a zero length
//! followed only by zeros), and a bad tail. A bad tail is either `Incomplete` (the bytes
//! stop before the record does: a torn write) or `Corrupt` (the bytes are there but wrong).

use std::ops::Range;

use super::gather::Sink;

/// Bytes before the payload: length and CRC.
pub(crate) const FRAME_HEADER: usize = 8;

/// Largest payload the journal accepts (1 GiB). Larger submissions fail with `TooLarge`.
pub(crate) const MAX_PAYLOAD: usize = 1 << 30;

/// Format version 2: bit 31 of the length word marks the first record of one write (a group
/// commit, a compaction step, a watermark). Every record before it in its segment was synced
/// before it was written, so a valid flagged record after damage proves the damage is not a
/// torn write (see `recovery.rs`). Not covered by the CRC (it covers the payload only).
pub(crate) const WRITE_START: u32 = 1 << 31;

/// Sets the write-start flag of the frame at `at` (format version 2 only).
pub(crate) fn set_write_start(buf: &mut impl Sink, at: usize) {
    buf.patch(at + 3, 1)[0] |= (WRITE_START >> 24) as u8;
}

/// What [`decode_frame`] found at an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A record whose CRC matches; `payload` indexes the buffer, `next` is the next frame.
    /// `write_start` is the flag of format version 2 (always false in version 1).
    Record {
        payload: Range<usize>,
        next: usize,
        write_start: bool,
    },
    /// End of data: a zero length word (or fewer than 8 bytes left), with only zeros after it.
    End,
    /// The record runs past the end of the buffer.
    Incomplete,
    /// The bytes are present but wrong.
    Corrupt(&'static str),
}

/// Appends a framed record whose payload is written by `fill`. Returns the payload's range
/// in `out`. The caller checks the payload is non-empty and at most [`MAX_PAYLOAD`].
pub(crate) fn encode_frame<S: Sink>(out: &mut S, fill: impl FnOnce(&mut S)) -> Range<usize> {
    let start = out.len();
    out.put(&[0u8; FRAME_HEADER]);
    fill(out);
    let payload = start + FRAME_HEADER..out.len();
    let len = payload.len() as u32;
    debug_assert!(len > 0, "an empty payload would read as end of data");
    let crc = out.crc(payload.clone());
    let head = out.patch(start, FRAME_HEADER);
    head[0..4].copy_from_slice(&len.to_le_bytes());
    head[4..8].copy_from_slice(&crc.to_le_bytes());
    payload
}

/// Decodes the frame at `at` in `buf`, which holds everything up to the end of the segment.
/// `flags`: the segment is format version 2, whose length word carries [`WRITE_START`].
pub(crate) fn decode_frame(buf: &[u8], at: usize, flags: bool) -> Frame {
    let rest = &buf[at.min(buf.len())..];
    if rest.len() < FRAME_HEADER {
        // The writer never starts a record it cannot finish in the segment, so a short tail
        // must be preallocated zeros.
        return if rest.iter().all(|&b| b == 0) {
            Frame::End
        } else {
            Frame::Incomplete
        };
    }
    let word = u32::from_le_bytes(rest[0..4].try_into().unwrap());
    let write_start = flags && word & WRITE_START != 0;
    let len = if flags { word & !WRITE_START } else { word } as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap());
    if len == 0 && write_start {
        return Frame::Corrupt("write-start flag on an empty record");
    }
    if len == 0 {
        // Data is written sequentially, so after the end there must be nothing but zeros.
        // A non-zero byte here is a torn write that reached the disk out of order (or a
        // flipped length word): either way the tail is bad, not the end.
        return if rest.iter().all(|&b| b == 0) {
            Frame::End
        } else {
            Frame::Corrupt("zero length word followed by non-zero bytes")
        };
    }
    if len > MAX_PAYLOAD {
        return Frame::Corrupt("length word larger than the largest record");
    }
    if rest.len() - FRAME_HEADER < len {
        return Frame::Incomplete;
    }
    let payload = at + FRAME_HEADER..at + FRAME_HEADER + len;
    if crc32c::crc32c(&buf[payload.clone()]) != crc {
        return Frame::Corrupt("CRC mismatch");
    }
    Frame::Record {
        next: payload.end,
        payload,
        write_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_all(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            encode_frame(&mut out, |o| o.extend_from_slice(p));
        }
        out
    }

    /// Decodes frames until something other than a record; returns the payloads and the stop.
    fn decode_all(buf: &[u8]) -> (Vec<Vec<u8>>, Frame) {
        let mut at = 0;
        let mut got = Vec::new();
        loop {
            match decode_frame(buf, at, true) {
                Frame::Record { payload, next, .. } => {
                    got.push(buf[payload].to_vec());
                    at = next;
                }
                other => return (got, other),
            }
        }
    }

    fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..200), 0..8)
    }

    proptest! {
        #[test]
        fn round_trip(ps in payloads(), zeros in 0usize..64) {
            let mut buf = encode_all(&ps);
            buf.extend(std::iter::repeat_n(0u8, zeros));
            let (got, stop) = decode_all(&buf);
            prop_assert_eq!(got, ps);
            prop_assert_eq!(stop, Frame::End);
        }

        #[test]
        fn truncation_never_yields_a_wrong_record(ps in payloads(), cut in any::<prop::sample::Index>()) {
            let buf = encode_all(&ps);
            let cut = cut.index(buf.len() + 1);
            let (got, stop) = decode_all(&buf[..cut]);
            // Every record decoded is one that was written, in order.
            prop_assert!(got.len() <= ps.len());
            prop_assert_eq!(&got[..], &ps[..got.len()]);
            // A cut inside a record is reported as incomplete, never as a clean end.
            let whole: usize = got.iter().map(|p| p.len() + FRAME_HEADER).sum();
            if whole < cut {
                prop_assert_eq!(stop, Frame::Incomplete);
            }
        }

        #[test]
        fn bit_flips_never_yield_a_wrong_record(ps in payloads(), flips in prop::collection::vec(any::<prop::sample::Index>(), 1..4), bit in 0u8..8) {
            let mut buf = encode_all(&ps);
            buf.extend_from_slice(&[0u8; 16]);
            if buf.is_empty() { return Ok(()); }
            for f in &flips {
                let i = f.index(buf.len());
                buf[i] ^= 1 << bit;
            }
            let (got, _stop) = decode_all(&buf);
            // Every decoded record is one that was written: a prefix of the originals.
            prop_assert!(got.len() <= ps.len());
            prop_assert_eq!(&got[..], &ps[..got.len()]);
        }
    }

    #[test]
    fn garbage_after_end_is_not_end() {
        let mut buf = encode_all(&[b"hello".to_vec()]);
        buf.extend_from_slice(&[0u8; 12]);
        buf.push(7);
        let (got, stop) = decode_all(&buf);
        assert_eq!(got.len(), 1);
        assert!(matches!(stop, Frame::Corrupt(_)));
    }
}
