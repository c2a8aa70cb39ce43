//! Fresh large allocations mapped in one call, not one page fault per 4 KiB page.
//!
//! An express or cached body waits in the buffer it was received into (HTTP/2's read buffer,
//! or the buffer a request spread over frames is gathered into). After a drained burst the
//! allocator gives its pages back (`memtrim`, issue 14 point 2), so the next burst's buffers are
//! fresh memory, and the kernel's copy from the socket into them took a page fault per 4 KiB:
//! 250,000 faults for 10,000 express sends of 100 KB or 1,000 of 1 MB. On this project's VM a
//! fault costs ~3.7 µs (fresh memory touched page by page at 1.1 GB/s), while
//! `madvise(MADV_POPULATE_WRITE)` maps the same memory at 1.6-2.1 GB/s (docs/benchmarks.md,
//! "Express sends into fresh memory").
//!
//! [`Prefaulting`] wraps mqd's global allocator (not mqperf's: its client's receives of 1 MB
//! bodies were slower with it, and a client's buffers are short-lived): a block of
//! [`POPULATE_MIN`]..=[`POPULATE_MAX`] bytes from `alloc` whose last whole page is not
//! resident (`mincore`) is populated in one call. The last page, not the first: mimalloc writes
//! its free list into the first word of a free block, so that page is resident already. Warm
//! memory (pages the allocator kept) pays only the `mincore` (~2.8 µs here), and a thread whose
//! blocks keep coming back warm checks less and less often ([`Backoff`]: down to one block in
//! 8 after 64 warm ones in a row; the first fresh one found checks every block again). Not
//! populated:
//! - `realloc`'s growth, the way a `Vec` or `VecDeque` doubles: the new half is mostly unused
//!   for a while, and populating it would raise a backlog's RSS (issue 14 point 4);
//! - `alloc_zeroed`: fresh pages are zero already, and untouched ones cost nothing;
//! - blocks over [`POPULATE_MAX`] (large collections, whose capacity runs ahead of use).
//!
//! Both calls are hints: a failure (a kernel before Linux 5.14 has no `MADV_POPULATE_WRITE`)
//! leaves the block to fault as before, and the contents are not changed.

use std::alloc::{GlobalAlloc, Layout};

/// Blocks from this size are populated when fresh: 16 pages. Below it the two system calls
/// cost about what the faults do.
pub const POPULATE_MIN: usize = 64 * 1024;

/// Blocks up to this size are populated when fresh: the largest gRPC request mqd takes (a
/// body at the 4 MiB default limit with its frame) fits, and a large collection does not.
pub const POPULATE_MAX: usize = 16 * 1024 * 1024;

/// The page size assumed for alignment. On a kernel with larger pages `madvise` refuses the
/// unaligned range and the block faults as before.
const PAGE: usize = 4096;

/// A global allocator that maps fresh blocks of [`POPULATE_MIN`]..=[`POPULATE_MAX`] bytes in
/// one call (module docs); everything else is the inner allocator's, unchanged.
#[derive(Debug)]
pub struct Prefaulting<A>(pub A);

#[allow(unsafe_code)]
// SAFETY: every call is forwarded to the inner allocator with the same arguments, and its
// result returned unchanged; `populate` only maps pages of the block just returned (which no
// one else holds yet) without changing their contents.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Prefaulting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded; the caller's contract is the inner allocator's.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() && (POPULATE_MIN..=POPULATE_MAX).contains(&layout.size()) {
            // A const-initialized thread-local of a `Copy` type: no allocation, no destructor.
            let _ = BACKOFF.try_with(|b| {
                let mut backoff = b.get();
                if backoff.check() {
                    backoff.found(populate(p as usize, layout.size()));
                }
                b.set(backoff);
            });
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

thread_local! {
    /// This thread's [`Backoff`].
    static BACKOFF: std::cell::Cell<Backoff> = const { std::cell::Cell::new(Backoff::new()) };
}

/// How often a thread checks its large blocks for fresh memory: every one until
/// [`Backoff::STREAK`] in a row are found warm, then it skips 1, 3 and at most 7 between
/// checks; a fresh block found makes it check every one again. Steady traffic on warm memory
/// pays a `mincore` per 8 large blocks, and a burst into fresh memory is seen within 8 of them.
/// Measured (docs/benchmarks.md, "Express sends into fresh memory"): 10,000 express sends of
/// 100 KB into fresh memory took 18,000-26,000 faults (250,000 without `Prefaulting`; 10,000
/// checking every block; 58,000-65,000 with a streak of 8 and skips up to 15, as fresh and warm
/// blocks interleave), and 300,000 × 1000 B sent and received three times made 1,742 `mincore`
/// calls (9,861 checking every block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Blocks still to skip before the next check.
    skip: u8,
    /// How many the last warm finding made it skip.
    span: u8,
    /// Warm findings in a row.
    warm: u8,
}

impl Backoff {
    /// The most blocks skipped between two checks.
    pub const MAX_SKIP: u8 = 7;

    /// Warm findings in a row before checks are skipped.
    pub const STREAK: u8 = 64;

    /// Checks every block.
    pub const fn new() -> Self {
        Backoff {
            skip: 0,
            span: 0,
            warm: 0,
        }
    }

    /// Whether to check this block (counts it).
    pub fn check(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            false
        } else {
            true
        }
    }

    /// What the check found: `fresh` memory (populated) or warm.
    pub fn found(&mut self, fresh: bool) {
        if fresh {
            *self = Backoff::new();
            return;
        }
        self.warm = self.warm.saturating_add(1);
        if self.warm >= Self::STREAK {
            self.span = (self.span * 2 + 1).min(Self::MAX_SKIP);
            self.skip = self.span;
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// Maps the whole pages within `[start, start + len)` if the last of them is not resident.
/// Returns whether it mapped them: `false` for warm memory, and for a kernel without
/// `MADV_POPULATE_WRITE`, whose threads then back off as on warm memory ([`Backoff`]).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn populate(start: usize, len: usize) -> bool {
    /// Linux's `MADV_POPULATE_WRITE` (5.14), not in every `libc` release.
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let first = start.next_multiple_of(PAGE);
    let end = (start + len) / PAGE * PAGE;
    if end <= first {
        return false;
    }
    let mut resident = 0u8;
    // SAFETY: `first..end` lies within a block just allocated for the caller, whom nobody else
    // knows yet. `mincore` reads the page tables and writes one byte (one page asked) into
    // `resident`. `MADV_POPULATE_WRITE` maps pages as a write would, without changing their
    // contents (a missing anonymous page becomes a zero page, as the first write's fault would
    // make it).
    unsafe {
        if libc::mincore((end - PAGE) as *mut libc::c_void, PAGE, &mut resident) != 0
            || resident & 1 != 0
        {
            return false;
        }
        libc::madvise(first as *mut libc::c_void, end - first, MADV_POPULATE_WRITE) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn populate(_start: usize, _len: usize) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident pages of `[start, start + len)`, whole pages only.
    #[allow(unsafe_code)]
    fn resident_pages(start: usize, len: usize) -> usize {
        let first = start.next_multiple_of(PAGE);
        let end = (start + len) / PAGE * PAGE;
        let mut v = vec![0u8; (end - first) / PAGE];
        // SAFETY: the range is within the caller's mapping; `v` has one byte per page.
        let rc = unsafe { libc::mincore(first as *mut libc::c_void, end - first, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// A fresh anonymous mapping of `len` bytes (not through any allocator).
    #[allow(unsafe_code)]
    fn fresh(len: usize) -> usize {
        // SAFETY: a new private anonymous mapping; unmapped by the test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    #[allow(unsafe_code)]
    fn unmap(p: usize, len: usize) {
        // SAFETY: the mapping `fresh` made.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }

    #[test]
    fn a_fresh_block_is_mapped_in_one_call_and_keeps_its_zeros() {
        let len = 256 * 1024;
        let p = fresh(len);
        assert_eq!(resident_pages(p, len), 0);
        // An unaligned block inside the mapping: its whole pages get mapped.
        if !populate(p + 100, len - 200) {
            // Linux before 5.14 refuses MADV_POPULATE_WRITE; the block faults as before.
            assert_eq!(resident_pages(p, len), 0);
            eprintln!("MADV_POPULATE_WRITE not supported here; the block faults as before");
            unmap(p, len);
            return;
        }
        assert_eq!(resident_pages(p + 100, len - 200), len / PAGE - 2);
        // SAFETY: within the mapping, which is zero-filled memory.
        #[allow(unsafe_code)]
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        assert!(bytes.iter().all(|&b| b == 0), "contents unchanged");
        unmap(p, len);
    }

    #[test]
    fn checks_back_off_while_blocks_are_warm_and_resume_at_a_fresh_one() {
        let mut b = Backoff::new();
        let mut checked = Vec::new();
        for i in 0..100 {
            if b.check() {
                checked.push(i);
                b.found(false);
            }
        }
        // Every one while fewer than 64 in a row were warm, then skips of 1, 3, and 7 at most.
        let mut expected: Vec<i32> = (0..64).collect();
        expected.extend([65, 69, 77, 85, 93]);
        assert_eq!(checked, expected);
        // Fresh and warm blocks mixed: every one is checked.
        let mut b = Backoff::new();
        for i in 0..100 {
            assert!(b.check(), "block {i}");
            b.found(i % 3 == 0);
        }
        // A fresh block found: every block is checked again.
        b.found(true);
        assert!(b.check() && b.check() && b.check());
        assert_eq!(b, Backoff::new());
    }

    #[test]
    fn a_warm_block_is_left_alone() {
        let len = 128 * 1024;
        let p = fresh(len);
        // Touch only the last page: the block counts as warm, and nothing else is mapped.
        // SAFETY: within the mapping.
        #[allow(unsafe_code)]
        unsafe {
            *((p + len - 1) as *mut u8) = 7;
        }
        assert!(!populate(p, len));
        assert_eq!(resident_pages(p, len), 1);
        unmap(p, len);
    }

    #[test]
    fn a_block_without_a_whole_page_is_left_alone() {
        let p = fresh(2 * PAGE);
        assert!(!populate(p + 10, PAGE));
        assert_eq!(resident_pages(p, 2 * PAGE), 0);
        unmap(p, 2 * PAGE);
    }

    #[test]
    fn the_wrapper_hands_out_the_inner_allocators_blocks() {
        let a = Prefaulting(std::alloc::System);
        for size in [16, POPULATE_MIN, 1 << 20, POPULATE_MAX + 1] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a non-zero layout; the block is written within bounds and freed with the
            // same layout.
            #[allow(unsafe_code)]
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                p.write_bytes(0xab, size);
                assert_eq!(*p.add(size - 1), 0xab);
                let q = a.realloc(p, layout, size * 2);
                assert_eq!(*q.add(size - 1), 0xab, "realloc keeps the contents");
                a.dealloc(q, Layout::from_size_align(size * 2, 8).unwrap());
                let z = a.alloc_zeroed(layout);
                assert_eq!(*z.add(size / 2), 0);
                a.dealloc(z, layout);
            }
        }
    }
}
