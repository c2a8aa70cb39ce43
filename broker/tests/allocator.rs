//! A binary built with the `mimalloc` feature that makes mimalloc its global allocator (as mqd
//! and mqperf do) is seen as such by the broker's memory trimmer, and a trim gives freed memory
//! back at once (mimalloc alone would wait for its purge delay and the next allocation).
#![cfg(all(feature = "mimalloc", target_os = "linux"))]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
