//! The bytes of one journal write, gathered rather than copied: frame headers, op headers and
//! small fields are copied into one buffer, large bodies are kept by reference (`Bytes`) and
//! handed to the kernel in place by one vectored write (`pwritev`).
//!
//! Before, every body was copied into the write buffer first (`Op::encode` was ~3% of CPU for
//! 1 MB recoverable sends in `perf`, besides the kernel's copy into the page cache), and
//! compaction copied every live record it moved a second time, from its read buffer into the
//! write buffer.
//!
//! Offsets are *logical*: positions in the bytes as they land on disk, bodies included. The
//! frame header of a record is always in the copied part, so it can be patched (length, CRC,
//! write-start flag) after its payload is known.

use std::io::IoSlice;
use std::ops::Range;

use bytes::Bytes;

/// Bodies at least this long are written from where they are; shorter ones are copied (a
/// copy of a few KiB costs less than an extra entry in the vectored write).
pub(crate) const GATHER_MIN: usize = 16 * 1024;

/// Where encoded records go: a plain `Vec<u8>` (everything copied) or a [`Gather`].
pub(crate) trait Sink {
    /// Logical length so far.
    fn len(&self) -> usize;
    /// Appends `bytes` (copied).
    fn put(&mut self, bytes: &[u8]);
    /// Appends a body; a sink may keep it by reference instead of copying it.
    fn put_body(&mut self, body: &Bytes) {
        self.put(body);
    }
    /// CRC-32C of the logical range `r`.
    fn crc(&self, r: Range<usize>) -> u32;
    /// Mutable access to the copied bytes at logical `at..at + n`, which must not overlap a
    /// body kept by reference (frame headers never do).
    fn patch(&mut self, at: usize, n: usize) -> &mut [u8];
}

impl Sink for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn crc(&self, r: Range<usize>) -> u32 {
        crc32c::crc32c(&self[r])
    }

    fn patch(&mut self, at: usize, n: usize) -> &mut [u8] {
        &mut self[at..at + n]
    }
}

/// Copied bytes with large bodies spliced in by reference.
#[derive(Debug, Default)]
pub(crate) struct Gather {
    /// Everything but the bodies kept by reference.
    small: Vec<u8>,
    /// Bodies kept by reference, in order: (offset in `small` they come before, bytes).
    bodies: Vec<(usize, Bytes)>,
    /// Logical length: `small.len()` plus the bodies' lengths.
    len: usize,
}

impl Gather {
    /// Empties it, keeping the copied part's allocation.
    pub fn clear(&mut self) {
        self.small.clear();
        self.bodies.clear();
        self.len = 0;
    }

    /// Capacity of the copied part.
    pub fn capacity(&self) -> usize {
        self.small.capacity()
    }

    /// The pieces (copied runs and bodies) in logical order, each with its logical start.
    fn pieces(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        let mut small_at = 0usize;
        let mut logical = 0usize;
        let mut bodies = self.bodies.iter();
        let mut next_body = bodies.next();
        std::iter::from_fn(move || match next_body {
            Some((pos, b)) if *pos == small_at => {
                let piece = (logical, &b[..]);
                logical += b.len();
                next_body = bodies.next();
                Some(piece)
            }
            _ => {
                // Copied bytes up to the next body (which starts later) or to the end.
                let end = next_body.map_or(self.small.len(), |(pos, _)| *pos);
                if small_at >= end {
                    return None;
                }
                let piece = (logical, &self.small[small_at..end]);
                logical += end - small_at;
                small_at = end;
                Some(piece)
            }
        })
    }

    /// The logical range `r` as slices, for one vectored write.
    pub fn slices(&self, r: Range<usize>) -> Vec<IoSlice<'_>> {
        let mut out = Vec::new();
        for (start, p) in self.pieces() {
            let end = start + p.len();
            if end <= r.start || p.is_empty() {
                continue;
            }
            if start >= r.end {
                break;
            }
            let from = r.start.saturating_sub(start);
            let to = p.len() - end.saturating_sub(r.end);
            out.push(IoSlice::new(&p[from..to]));
        }
        out
    }

    /// Offset in `small` of logical offset `at`, which lies in the copied part.
    fn small_offset(&self, at: usize) -> usize {
        let mut before = 0usize; // body bytes before `at`
        for (pos, b) in &self.bodies {
            let start = pos + before;
            if start >= at {
                break;
            }
            debug_assert!(
                start + b.len() <= at,
                "offset {at} is inside a gathered body"
            );
            before += b.len();
        }
        at - before
    }
}

impl Sink for Gather {
    fn len(&self) -> usize {
        self.len
    }

    fn put(&mut self, bytes: &[u8]) {
        self.small.extend_from_slice(bytes);
        self.len += bytes.len();
    }

    fn put_body(&mut self, body: &Bytes) {
        if body.len() < GATHER_MIN {
            self.put(body);
        } else {
            self.bodies.push((self.small.len(), body.clone()));
            self.len += body.len();
        }
    }

    fn crc(&self, r: Range<usize>) -> u32 {
        self.slices(r)
            .iter()
            .fold(0, |crc, s| crc32c::crc32c_append(crc, s))
    }

    fn patch(&mut self, at: usize, n: usize) -> &mut [u8] {
        let s = self.small_offset(at);
        &mut self.small[s..s + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Builds the same bytes in a Vec and a Gather from a list of (copied?, bytes) pieces.
    fn both(parts: &[(bool, Vec<u8>)]) -> (Vec<u8>, Gather) {
        let mut v = Vec::new();
        let mut g = Gather::default();
        for (body, p) in parts {
            if *body {
                let b = Bytes::from(p.clone());
                v.put_body(&b);
                g.put_body(&b);
            } else {
                v.put(p);
                g.put(p);
            }
        }
        (v, g)
    }

    fn flat(g: &Gather, r: Range<usize>) -> Vec<u8> {
        g.slices(r).iter().flat_map(|s| s.to_vec()).collect()
    }

    #[test]
    fn large_bodies_are_kept_by_reference_small_ones_copied() {
        let big = Bytes::from(vec![9u8; GATHER_MIN]);
        let small = Bytes::from(vec![1u8; GATHER_MIN - 1]);
        let mut g = Gather::default();
        g.put(b"head");
        g.put_body(&big);
        g.put_body(&small);
        g.put(b"tail");
        assert_eq!(g.bodies.len(), 1);
        assert_eq!(g.small.len(), 4 + small.len() + 4);
        assert_eq!(g.len(), 8 + big.len() + small.len());
        assert_eq!(
            g.slices(0..g.len())[1].as_ptr(),
            big.as_ptr(),
            "the body is written from where it is"
        );
    }

    proptest! {
        #[test]
        fn reads_like_the_copied_bytes(
            parts in prop::collection::vec(
                (any::<bool>(), prop::collection::vec(any::<u8>(), 0..(GATHER_MIN + 64))), 0..6),
            a in 0usize..200_000, b in 0usize..200_000,
        ) {
            let (v, mut g) = both(&parts);
            prop_assert_eq!(g.len(), v.len());
            prop_assert_eq!(flat(&g, 0..g.len()), v.clone());
            let (a, b) = (a.min(v.len()), b.min(v.len()));
            let r = a.min(b)..a.max(b);
            prop_assert_eq!(flat(&g, r.clone()), v[r.clone()].to_vec());
            prop_assert_eq!(g.crc(r.clone()), crc32c::crc32c(&v[r]));
            // Offsets in the copied parts patch the byte a Vec would.
            let mut v2 = v.clone();
            let mut at = 0usize;
            for (body, p) in &parts {
                if (!*body || p.len() < GATHER_MIN) && !p.is_empty() {
                    for i in [0, p.len() / 2, p.len() - 1] {
                        v2.patch(at + i, 1)[0] ^= 0xff;
                        g.patch(at + i, 1)[0] ^= 0xff;
                    }
                }
                at += p.len();
            }
            prop_assert_eq!(flat(&g, 0..g.len()), v2);
        }
    }
}
