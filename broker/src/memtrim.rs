//! Memory goes back after a burst: an allocator keeps freed pages (glibc's malloc: per-thread
//! arenas, a raised mmap threshold; mimalloc: empty pages whose purge waits for the next
//! allocation), so without help mqd's RSS can stay at its peak after a backlog is drained; a
//! housekeeping tick ([`Trimmer`]) asks the allocator to return free pages once a lot was freed
//! since the last time.
//!
//! Which allocator serves the process is found at run time ([`allocator`]): glibc's malloc
//! unless the binary was built with the `mimalloc` feature and made [`mimalloc::MiMalloc`] its
//! `#[global_allocator]` (mqd, mqperf and mq do). With glibc, "freed but resident" is RSS minus
//! malloc's bytes in use (`mallinfo2`), and a trim is `malloc_trim(0)`. mimalloc does not count
//! bytes in use in a release build, so there the tick watches the RSS itself (it grew by the
//! threshold above its lowest level since the last trim), and a trim is `mi_collect(true)`
//! (this thread's heap, and every arena's delayed purges done now; each runtime worker
//! collects its own heap at its next park, [`on_worker_park`]).
//!
//! A trim is not free for the traffic: `malloc_trim` walks every arena under malloc's locks,
//! and every allocation in the process waits meanwhile. Measured (docs/benchmarks.md, "Latency
//! sweep"): with a trim every 2 s during an express run at half the maximum rate, e2e p99 was
//! 25-34 ms; with trims turned off, 0.9-1.2 ms. So while the process is busy (more than
//! [`QUIET_CPU`] of a core since the last tick) a due trim waits for a quiet tick, at most
//! [`MAX_TRIM_DEFER`]: after a burst is drained the broker goes quiet and trims at once, and
//! under load that never ends the memory still goes back within that bound.

use std::time::{Duration, Instant};

/// How often the broker looks at its memory.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(2);

/// Resident bytes not in use by the allocator (glibc: RSS minus malloc's bytes in use;
/// mimalloc: the RSS), beyond what stayed after the last trim (or the lowest since), that make a
/// trim worth its cost (it walks every arena).
pub const TRIM_THRESHOLD_BYTES: usize = 16 << 20;

/// The process counts as busy when it used more than this share of one core since the last
/// tick (its own threads: the broker, and in mqperf's embedded broker the client too).
pub const QUIET_CPU: f64 = 0.25;

/// The longest a due trim waits for a quiet tick.
pub const MAX_TRIM_DEFER: Duration = Duration::from_secs(30);

/// Trims when much more memory is resident than malloc has in use, preferably while quiet.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// Resident bytes not in use that a trim could not give back (after the last trim, or
    /// lower since).
    settled_gap: usize,
    /// Since when a trim has been due but deferred because the process was busy.
    due_since: Option<Instant>,
    /// The process's CPU time at the last tick, and when that was.
    last_cpu: Option<(Instant, Duration)>,
}

impl Trimmer {
    /// If the resident memory exceeds malloc's bytes in use by at least `threshold` more than
    /// after the last trim, returns free pages to the system (at once while quiet, else within
    /// [`MAX_TRIM_DEFER`]); returns the bytes given back when it trimmed. Blocking (it may walk
    /// the heap): call it off the async workers. With an unknown allocator (or without `/proc`)
    /// it does nothing.
    pub fn tick(&mut self, threshold: usize) -> Option<usize> {
        let now = Instant::now();
        let busy = self.busy(now);
        self.tick_at(threshold, busy, now)
    }

    /// [`Trimmer::tick`] with the busy verdict given.
    fn tick_at(&mut self, threshold: usize, busy: bool, now: Instant) -> Option<usize> {
        let in_use = in_use_bytes()?;
        let gap = rss_bytes()?.saturating_sub(in_use);
        if !self.due(gap, threshold, busy, now) {
            return None;
        }
        trim();
        let after = rss_bytes()?.saturating_sub(in_use);
        self.settled_gap = after;
        Some(gap.saturating_sub(after))
    }

    /// Whether the process used more than [`QUIET_CPU`] of a core since the last tick (the
    /// first tick, or without `getrusage`: not busy).
    fn busy(&mut self, now: Instant) -> bool {
        let Some(cpu) = cpu_time() else {
            return false;
        };
        let busy = self.last_cpu.is_some_and(|(then, used)| {
            let wall = now.saturating_duration_since(then).as_secs_f64();
            wall > 0.0 && cpu.saturating_sub(used).as_secs_f64() > QUIET_CPU * wall
        });
        self.last_cpu = Some((now, cpu));
        busy
    }

    /// The decision: is a trim due now, given the gap, the threshold and whether busy?
    fn due(&mut self, gap: usize, threshold: usize, busy: bool, now: Instant) -> bool {
        if gap < self.settled_gap.saturating_add(threshold) {
            self.settled_gap = self.settled_gap.min(gap);
            self.due_since = None;
            return false;
        }
        let since = *self.due_since.get_or_insert(now);
        if busy && now.saturating_duration_since(since) < MAX_TRIM_DEFER {
            return false;
        }
        self.due_since = None;
        true
    }
}

/// This process's CPU time (user and system) so far.
fn cpu_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes one rusage into the pointer it is given, which is valid.
        #[allow(unsafe_code)]
        let ru = unsafe {
            if libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) != 0 {
                return None;
            }
            ru.assume_init()
        };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        Some(tv(ru.ru_utime) + tv(ru.ru_stime))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// This process's resident memory (VmRSS), in bytes.
fn rss_bytes() -> Option<usize> {
    rss_bytes_of(None).map(|b| b as usize)
}

/// VmRSS of process `pid` (`None`: this process) in bytes, from `/proc/PID/status`; `None`
/// where `/proc` cannot tell (not Linux, no such process). (mqperf's `rss` line uses it too.)
pub fn rss_bytes_of(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    parse_vm_rss(&std::fs::read_to_string(path).ok()?)
}

/// The `VmRSS:   1234 kB` line of a `/proc/PID/status`, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The allocator behind this process's Rust allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// glibc's malloc (the Rust default on Linux-gnu).
    Glibc,
    /// mimalloc, the `#[global_allocator]` of a binary built with the `mimalloc` feature.
    Mimalloc,
    /// Anything else: the trimmer does nothing.
    Other,
}

/// Which allocator serves this process (decided once: a boxed value is asked whether it lies in
/// mimalloc's heap, so a test binary of this crate, which has no `#[global_allocator]`, is
/// glibc even with the feature on).
pub fn allocator() -> Allocator {
    static WHICH: std::sync::OnceLock<Allocator> = std::sync::OnceLock::new();
    *WHICH.get_or_init(|| {
        #[cfg(feature = "mimalloc")]
        {
            let probe = Box::new(0u64);
            let p: *const u64 = &*probe;
            // SAFETY: mimalloc only compares the address with its own heap map; nothing is read
            // through the pointer, which is valid anyway while `probe` lives.
            #[allow(unsafe_code)]
            let ours = unsafe { libmimalloc_sys::mi_is_in_heap_region(p.cast()) };
            if ours {
                return Allocator::Mimalloc;
            }
        }
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            Allocator::Glibc
        } else {
            Allocator::Other
        }
    })
}

/// mimalloc's purge delay, set by [`tune_allocator`]: freed pages are only scheduled for
/// purging while traffic runs (mimalloc's own 1 s purges, done inside allocation calls, made the
/// express e2e p99 at half load 37-53 ms against 0.6-0.9 ms without them), and the trimmer's
/// `mi_collect(true)` on a quiet tick purges them at once.
#[cfg_attr(not(feature = "mimalloc"), allow(dead_code))]
pub const MIMALLOC_PURGE_DELAY_MS: i64 = 600_000;

/// Sets the allocator's options for a broker; call it first thing in `main` (mimalloc: the
/// purge delay above; glibc: nothing).
pub fn tune_allocator() {
    #[cfg(feature = "mimalloc")]
    if allocator() == Allocator::Mimalloc {
        // `mi_option_purge_delay` is 15 in mimalloc v3's `mi_option_e` (libmimalloc-sys 0.1.49
        // names no constant for it).
        const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
        // SAFETY: a plain mimalloc call without pointers.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, MIMALLOC_PURGE_DELAY_MS as _);
        }
    }
}

/// Bytes the allocator has handed out and not got back, as far as it tells: glibc's
/// `mallinfo2`; 0 for mimalloc (a release build keeps no such count: the trimmer then compares
/// the RSS with itself); `None` for another allocator (no trims).
pub fn in_use_bytes() -> Option<usize> {
    match allocator() {
        Allocator::Glibc => glibc_in_use(),
        Allocator::Mimalloc => Some(0),
        Allocator::Other => None,
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_in_use() -> Option<usize> {
    // SAFETY: a plain glibc call that takes malloc's own locks and returns a struct.
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    Some(info.uordblks.saturating_add(info.hblkhd))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_in_use() -> Option<usize> {
    None
}

/// Counts [`trim`]s, so each runtime worker collects its own mimalloc heap once after each
/// ([`on_worker_park`]).
static TRIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// The [`TRIMS`] count this thread last collected for.
    static COLLECTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A runtime worker's park hook (`tokio::runtime::Builder::on_thread_park`): after a [`trim`],
/// the worker's next park collects its own heap. mimalloc's `mi_collect` reaches only the
/// calling thread's heap, and a small block freed by another thread goes back to the heap of
/// the thread that allocated it: pages of the small bodies a worker decoded (copied out of
/// their requests, `large_bodies::own_small_bodies`) stayed resident after a drain until that
/// worker collected. Costs an atomic load and a thread-local read per park otherwise.
pub fn on_worker_park() {
    let trims = TRIMS.load(std::sync::atomic::Ordering::Relaxed);
    if COLLECTED.with(|c| c.replace(trims)) != trims && allocator() == Allocator::Mimalloc {
        #[cfg(feature = "mimalloc")]
        // SAFETY: a plain mimalloc call without pointers.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_collect(true);
        }
    }
}

/// Returns the free pages the allocator holds to the system: glibc's `malloc_trim(0)`,
/// mimalloc's `mi_collect(true)` (this thread's heap now, each runtime worker's at its next
/// park: [`on_worker_park`]); nothing elsewhere.
pub fn trim() {
    TRIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match allocator() {
        Allocator::Glibc => {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: a plain glibc call without pointers; it takes malloc's own locks.
            #[allow(unsafe_code)]
            unsafe {
                libc::malloc_trim(0);
            }
        }
        Allocator::Mimalloc => {
            #[cfg(feature = "mimalloc")]
            // SAFETY: a plain mimalloc call without pointers.
            #[allow(unsafe_code)]
            unsafe {
                libmimalloc_sys::mi_collect(true);
            }
        }
        Allocator::Other => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tmqd\nVmHWM:\t  9000 kB\nVmRSS:\t   1234 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        if cfg!(target_os = "linux") {
            assert!(rss_bytes_of(None).unwrap() > 0);
            assert!(rss_bytes_of(Some(std::process::id())).unwrap() > 0);
            assert_eq!(rss_bytes_of(Some(u32::MAX)), None);
        }
    }

    #[test]
    fn a_binary_without_a_global_allocator_is_glibc() {
        // This test binary says no `#[global_allocator]`, feature `mimalloc` or not; the
        // positive case is tests/allocator.rs.
        let expected = if cfg!(all(target_os = "linux", target_env = "gnu")) {
            Allocator::Glibc
        } else {
            Allocator::Other
        };
        assert_eq!(allocator(), expected);
    }

    #[test]
    fn a_due_trim_waits_for_a_quiet_tick_but_not_longer_than_the_bound() {
        const T: usize = 16 << 20;
        let t0 = Instant::now();
        let mut t = Trimmer::default();
        // Below the threshold: never.
        assert!(!t.due(T - 1, T, false, t0));
        // Due while busy: deferred, tick after tick, until the bound.
        assert!(!t.due(T, T, true, t0));
        assert!(!t.due(T, T, true, t0 + MAX_TRIM_DEFER / 2));
        assert!(t.due(T, T, true, t0 + MAX_TRIM_DEFER));
        // Due and quiet: at once.
        let mut t = Trimmer::default();
        assert!(!t.due(T, T, true, t0));
        assert!(t.due(T, T, false, t0 + TRIM_INTERVAL));
        // A gap that closed while waiting restarts the wait.
        let mut t = Trimmer::default();
        assert!(!t.due(T, T, true, t0));
        assert!(!t.due(0, T, true, t0 + MAX_TRIM_DEFER / 2));
        assert!(!t.due(T, T, true, t0 + MAX_TRIM_DEFER));
        assert!(!t.due(T, T, true, t0 + MAX_TRIM_DEFER * 3 / 2));
        assert!(t.due(T, T, true, t0 + MAX_TRIM_DEFER * 2));
    }

    #[test]
    fn cpu_time_moves_with_work() {
        let Some(before) = cpu_time() else { return };
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        assert!(cpu_time().unwrap() > before, "{x}");
    }

    // It reads this process's RSS and malloc totals, which the other tests of this binary
    // change as they run in parallel (it failed once in a full run that way). The integration
    // test `memory_returns` checks the same behaviour on a real mqd; run this one alone with
    // `cargo test -p mq-broker --lib memtrim -- --ignored --test-threads=1`.
    #[test]
    #[ignore = "process-wide RSS: run alone (see above)"]
    fn trims_after_a_large_free_and_not_before() {
        if allocator() != Allocator::Glibc {
            return;
        }
        let mut t = Trimmer::default();
        // Whatever this test process holds already is settled first.
        t.tick_at(TRIM_THRESHOLD_BYTES, false, Instant::now());
        // 96 MiB in 1000-byte blocks, every 64th kept: the freed memory is fragmented, so
        // malloc cannot give it back by shrinking the heap's top.
        let mut blocks: Vec<Vec<u8>> = (0..100_000).map(|i| vec![i as u8; 1000]).collect();
        assert_eq!(
            t.tick_at(TRIM_THRESHOLD_BYTES, false, Instant::now()),
            None,
            "nothing freed yet"
        );
        let kept: Vec<Vec<u8>> = blocks.iter_mut().step_by(64).map(std::mem::take).collect();
        drop(blocks);
        let before = rss_bytes().unwrap();
        let freed = t
            .tick_at(TRIM_THRESHOLD_BYTES, false, Instant::now())
            .expect("trimmed");
        assert!(freed >= 48 << 20, "{freed}");
        let after = rss_bytes().unwrap();
        // Other tests run in this process too: ask for a third of what was given back.
        assert!(
            after + (24 << 20) <= before,
            "RSS {before} before the trim, {after} after"
        );
        assert_eq!(
            t.tick_at(TRIM_THRESHOLD_BYTES, false, Instant::now()),
            None,
            "nothing freed since"
        );
        drop(kept);
    }
}
