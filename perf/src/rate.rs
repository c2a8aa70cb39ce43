//! Open-loop sending (`--rate N`): the send [`Schedule`] (message `g` is due `g / N` seconds
//! after the start, whatever happened to the messages before it) and the [`Pacer`], a thread
//! that releases messages as they fall due.
//!
//! Coordinated omission: a closed-loop sender that is held up sends nothing while it waits, so
//! the messages that should have gone out meanwhile are never measured at their real delay. An
//! open-loop sender measures every message from its *intended* send time ([`Pacer::intended`],
//! [`Pacer::intended_unix_ns`]): if the broker (or mqperf) stalls, every message due during the
//! stall records the time it waited for its turn as well as its own trip.
//!
//! Tokio's timer has a 1 ms granularity, too coarse for sub-millisecond latencies, so the
//! pacer is an OS thread sleeping with `std::thread::sleep` (about 60-100 µs late on Linux) and
//! publishing the number of released messages through a `watch` channel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The shortest sleep of the pacer thread; finer ticks only burn CPU.
const MIN_TICK: Duration = Duration::from_micros(50);

/// `rate` messages per second, evenly spaced from time 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    rate: u64,
}

impl Schedule {
    /// `rate` messages per second (at least 1).
    pub fn new(rate: u64) -> Schedule {
        Schedule { rate: rate.max(1) }
    }

    /// Messages per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// When message `g` (0-based) is due, from the start: `floor(g * 1e9 / rate)` ns.
    pub fn due(&self, g: u64) -> Duration {
        let ns = u128::from(g) * 1_000_000_000 / u128::from(self.rate);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// How many messages are due at `elapsed` from the start: the number of `g` with
    /// `due(g) <= elapsed`.
    pub fn due_by(&self, elapsed: Duration) -> u64 {
        // due(g) <= e  <=>  g * 1e9 < (e + 1) * rate  (e in ns)
        let limit = (elapsed.as_nanos() + 1) * u128::from(self.rate);
        let n = limit.div_ceil(1_000_000_000);
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

/// Releases `total` messages on a [`Schedule`], from a thread of its own. Dropping it stops
/// the thread.
#[derive(Debug)]
pub struct Pacer {
    schedule: Schedule,
    start: Instant,
    start_unix_ns: i64,
    released: watch::Receiver<u64>,
    stop: Arc<AtomicBool>,
}

impl Pacer {
    /// Starts the clock now and the thread that releases messages as they fall due.
    pub fn start(schedule: Schedule, total: u64) -> Pacer {
        let (tx, released) = watch::channel(0u64);
        let start = Instant::now();
        let start_unix_ns = crate::scenario::unix_ns();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("mqperf-pacer".to_string())
            .spawn(move || loop {
                let n = schedule.due_by(start.elapsed()).min(total);
                tx.send_if_modified(|v| {
                    let changed = *v != n;
                    *v = n;
                    changed
                });
                if n >= total || stopped.load(Ordering::Relaxed) || tx.is_closed() {
                    break;
                }
                let next = schedule.due(n);
                let now = start.elapsed();
                std::thread::sleep(next.saturating_sub(now).max(MIN_TICK));
            })
            .expect("cannot start the pacer thread");
        Pacer {
            schedule,
            start,
            start_unix_ns,
            released: released.clone(),
            stop,
        }
    }

    /// A handle to wait on, for one sending task.
    pub fn handle(&self) -> PacerHandle {
        PacerHandle {
            schedule: self.schedule,
            start: self.start,
            start_unix_ns: self.start_unix_ns,
            released: self.released.clone(),
        }
    }

    /// When message `g` was meant to be sent.
    pub fn intended(&self, g: u64) -> Instant {
        self.start + self.schedule.due(g)
    }

    /// When message `g` was meant to be sent, in wall-clock ns since the Unix epoch (what
    /// the message carries for the receiver's send-to-decode latency).
    pub fn intended_unix_ns(&self, g: u64) -> i64 {
        self.start_unix_ns
            .saturating_add(i64::try_from(self.schedule.due(g).as_nanos()).unwrap_or(i64::MAX))
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a sending task needs of a [`Pacer`]: wait for a message's turn, and its intended time.
#[derive(Debug, Clone)]
pub struct PacerHandle {
    schedule: Schedule,
    start: Instant,
    start_unix_ns: i64,
    released: watch::Receiver<u64>,
}

impl PacerHandle {
    /// When the schedule started: message `g` is due `g / N` s after this. An open-loop
    /// phase's rate counts from here, so that it cannot beat N (a clock read after the
    /// pacer started would shorten the phase by the time in between).
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Waits until message `g` is due (returns at once if it is overdue).
    pub async fn wait(&mut self, g: u64) {
        // An error means the pacer thread is gone (it released everything, or was stopped).
        let _ = self.released.wait_for(|&n| n > g).await;
    }

    /// When message `g` was meant to be sent.
    pub fn intended(&self, g: u64) -> Instant {
        self.start + self.schedule.due(g)
    }

    /// [`Pacer::intended_unix_ns`].
    pub fn intended_unix_ns(&self, g: u64) -> i64 {
        self.start_unix_ns
            .saturating_add(i64::try_from(self.schedule.due(g).as_nanos()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Latency;
    use proptest::prelude::*;

    #[test]
    fn schedule_spaces_messages_evenly() {
        let s = Schedule::new(1000);
        assert_eq!(s.due(0), Duration::ZERO);
        assert_eq!(s.due(1), Duration::from_millis(1));
        assert_eq!(s.due(1500), Duration::from_millis(1500));
        assert_eq!(s.due_by(Duration::ZERO), 1);
        assert_eq!(s.due_by(Duration::from_micros(999)), 1);
        assert_eq!(s.due_by(Duration::from_millis(1)), 2);
        assert_eq!(s.due_by(Duration::from_secs(1)), 1001);
        // 3 per second: 0, 333_333_333 ns, 666_666_666 ns, 1 s.
        let s = Schedule::new(3);
        assert_eq!(s.due(1), Duration::from_nanos(333_333_333));
        assert_eq!(s.due(3), Duration::from_secs(1));
        assert_eq!(s.due_by(Duration::from_nanos(333_333_332)), 1);
        assert_eq!(s.due_by(Duration::from_nanos(333_333_333)), 2);
        assert_eq!(Schedule::new(0).rate(), 1);
    }

    proptest! {
        /// `due_by` counts exactly the messages whose `due` has passed, and stays monotonic.
        #[test]
        fn due_by_matches_due(rate in 1u64..5_000_000, g in 0u64..10_000_000) {
            let s = Schedule::new(rate);
            let d = s.due(g);
            prop_assert!(s.due_by(d) > g);
            if d > Duration::ZERO {
                prop_assert!(s.due_by(d - Duration::from_nanos(1)) <= g);
            }
            prop_assert!(s.due(g + 1) >= d);
        }
    }

    /// A sender that stalls does not skip what fell due meanwhile: after a stall every overdue
    /// message is released at once, and measured from its intended time each records the
    /// wait (coordinated omission corrected); measured from the actual send, the stall would
    /// show in none of them. Lower bounds only: a slow machine makes the waits longer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stall_is_charged_to_every_message_due_during_it() {
        const N: u64 = 200;
        let pacer = Pacer::start(Schedule::new(2000), N); // one every 0.5 ms, 100 ms in all
        let mut h = pacer.handle();
        let mut corrected = Latency::new();
        for g in 0..N {
            h.wait(g).await;
            if g == 10 {
                // The "broker" holds the sender for 50 ms: messages 10..=110 fall due meanwhile.
                std::thread::sleep(Duration::from_millis(50));
            }
            let sent = Instant::now();
            assert!(
                sent >= h.intended(g),
                "message {g} went out before its time"
            );
            // The message's trip itself takes no time here: all latency is waiting.
            corrected.record(sent.duration_since(h.intended(g)));
        }
        assert_eq!(corrected.samples(), N);
        // Message 10 waited the full 50 ms; about 100 messages were due during the stall, the
        // first 50 of them at least 25 ms before they could go: p75 of 200 >= 25 ms.
        assert!(corrected.quantile_us(1.0).unwrap() >= 49_000.0);
        assert!(
            corrected.quantile_us(0.75).unwrap() >= 25_000.0,
            "{corrected:?}"
        );
        let later = h.intended_unix_ns(N - 1) - h.intended_unix_ns(0);
        assert_eq!(later, Schedule::new(2000).due(N - 1).as_nanos() as i64);
    }
}
