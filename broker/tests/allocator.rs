//! A binary built with the `mimalloc` feature that makes mimalloc its global allocator (as mqd
//! and mqperf do) is seen as such by the broker's memory trimmer, and a trim gives freed memory
//! back at once (mimalloc alone would wait for its purge delay and the next allocation). The
//! allocator is mqd's: mimalloc inside `Prefaulting`, which maps fresh large blocks at once.
#![cfg(all(feature = "mimalloc", target_os = "linux"))]

#[global_allocator]
static GLOBAL: mq_broker::Prefaulting<mimalloc::MiMalloc> =
    mq_broker::Prefaulting(mimalloc::MiMalloc);

#[test]
fn the_trimmer_finds_mimalloc_and_its_trim_returns_freed_pages() {
    assert_eq!(mq_broker::allocator(), mq_broker::Allocator::Mimalloc);
    let rss = || mq_broker::rss_bytes_of(None).expect("VmRSS");
    // 128 MiB in 1000-byte blocks, every 1024th kept (one in every 16 of mimalloc's 64 KiB
    // pages), so the freed memory is fragmented but most pages are empty.
    let mut blocks: Vec<Vec<u8>> = (0..128_000).map(|i| vec![i as u8; 1000]).collect();
    let kept: Vec<Vec<u8>> = blocks
        .iter_mut()
        .step_by(1024)
        .map(std::mem::take)
        .collect();
    drop(blocks);
    let before = rss();
    mq_broker::trim_memory();
    let after = rss();
    assert!(
        after + (64 << 20) <= before,
        "RSS {} MiB before the trim, {} MiB after",
        before >> 20,
        after >> 20
    );
    drop(kept);
}

/// Resident pages among the whole pages of `[start, start + len)`, and how many there are.
#[allow(unsafe_code)]
fn resident(start: usize, len: usize) -> (usize, usize) {
    let first = start.next_multiple_of(4096);
    let end = (start + len) / 4096 * 4096;
    let mut v = vec![0u8; (end - first) / 4096];
    // SAFETY: the range lies within a live allocation; `v` has one byte per page.
    let rc = unsafe { libc::mincore(first as *mut libc::c_void, end - first, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    (v.iter().filter(|&&b| b & 1 != 0).count(), v.len())
}

#[test]
fn a_fresh_large_block_is_resident_before_it_is_written() {
    // Blocks of 100 KB and 1 MB, as an express body's buffer; then more than POPULATE_MAX,
    // and a grown Vec, which stay lazily mapped. Each asked several times: some may reuse
    // memory an earlier block warmed.
    let mut fresh_seen = 0;
    for size in [100_000usize, 1 << 20] {
        for _ in 0..8 {
            let v: Vec<u8> = Vec::with_capacity(size);
            let (res, pages) = resident(v.as_ptr() as usize, size);
            if res == pages {
                fresh_seen += 1;
            }
            assert!(
                res == pages || res <= 2,
                "{size} B: {res} of {pages} pages resident; either all (populated) or none \
                 but mimalloc's first-word page (left to fault)"
            );
            std::hint::black_box(&v);
        }
    }
    assert!(fresh_seen > 0, "no block was populated");
    let big: Vec<u8> = Vec::with_capacity(mq_broker::POPULATE_MAX + (1 << 20));
    let (res, pages) = resident(big.as_ptr() as usize, big.capacity());
    assert!(
        res * 2 < pages,
        "a block over POPULATE_MAX: {res} of {pages} pages resident"
    );
    drop(big);
}
