//! Memory goes back after a burst: glibc's malloc keeps freed heap pages (per-thread arenas, a
//! raised mmap threshold), so without help mqd's RSS stays at its peak after a backlog is
//! drained; a housekeeping tick ([`Trimmer`]) asks malloc to return free pages once a lot was
//! freed since the last time.

use std::time::Duration;

/// How often the broker looks at its memory.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(2);

/// Resident bytes not in use by malloc (RSS minus malloc's bytes in use), beyond what stayed
/// after the last trim, that make a trim worth its cost (it walks every arena).
pub const TRIM_THRESHOLD_BYTES: usize = 16 << 20;

/// Trims when much more memory is resident than malloc has in use.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// Resident bytes not in use that a trim could not give back (after the last trim, or
    /// lower since).
    settled_gap: usize,
}

impl Trimmer {
    /// If the resident memory exceeds malloc's bytes in use by at least `threshold` more than
    /// after the last trim, returns free pages to the system; returns the bytes given back when
    /// it trimmed. Blocking (it may walk the heap): call it off the async workers. Without
    /// glibc (or `/proc`) it does nothing.
    pub fn tick(&mut self, threshold: usize) -> Option<usize> {
        let in_use = in_use_bytes()?;
        let gap = rss_bytes()?.saturating_sub(in_use);
        if gap < self.settled_gap.saturating_add(threshold) {
            self.settled_gap = self.settled_gap.min(gap);
            return None;
        }
        trim();
        let after = rss_bytes()?.saturating_sub(in_use);
        self.settled_gap = after;
        Some(gap.saturating_sub(after))
    }
}

/// This process's resident memory (VmRSS), in bytes.
fn rss_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Bytes malloc has handed out and not got back (`None`: not glibc).
pub fn in_use_bytes() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a plain glibc call that takes malloc's own locks and returns a struct.
        #[allow(unsafe_code)]
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks.saturating_add(info.hblkhd))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Returns every free page malloc holds to the system (glibc; elsewhere nothing).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a plain glibc call without pointers; it takes malloc's own locks.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // It reads this process's RSS and malloc totals, which the other tests of this binary
    // change as they run in parallel (it failed once in a full run that way). The integration
    // test `memory_returns` checks the same behaviour on a real mqd; run this one alone with
    // `cargo test -p mq-broker --lib memtrim -- --ignored --test-threads=1`.
    #[test]
    #[ignore = "process-wide RSS: run alone (see above)"]
    fn trims_after_a_large_free_and_not_before() {
        if !cfg!(all(target_os = "linux", target_env = "gnu")) {
            return;
        }
        let mut t = Trimmer::default();
        // Whatever this test process holds already is settled first.
        t.tick(TRIM_THRESHOLD_BYTES);
        // 96 MiB in 1000-byte blocks, every 64th kept: the freed memory is fragmented, so
        // malloc cannot give it back by shrinking the heap's top.
        let mut blocks: Vec<Vec<u8>> = (0..100_000).map(|i| vec![i as u8; 1000]).collect();
        assert_eq!(t.tick(TRIM_THRESHOLD_BYTES), None, "nothing freed yet");
        let kept: Vec<Vec<u8>> = blocks.iter_mut().step_by(64).map(std::mem::take).collect();
        drop(blocks);
        let before = rss_bytes().unwrap();
        let freed = t.tick(TRIM_THRESHOLD_BYTES).expect("trimmed");
        assert!(freed >= 48 << 20, "{freed}");
        let after = rss_bytes().unwrap();
        // Other tests run in this process too: ask for a third of what was given back.
        assert!(
            after + (24 << 20) <= before,
            "RSS {before} before the trim, {after} after"
        );
        assert_eq!(t.tick(TRIM_THRESHOLD_BYTES), None, "nothing freed since");
        drop(kept);
    }
}
