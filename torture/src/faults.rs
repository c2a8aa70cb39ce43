//! The fault schedule: which fault, on which broker, when in its cycle and for how long, all
//! drawn from the run's seed, so `--seed S` replays the same choices.

use std::time::Duration;

use serde::Serialize;

use crate::history::FaultKind;

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlannedFault {
    pub cycle: u64,
    pub broker: usize,
    pub kind: FaultKind,
    /// When in the cycle it strikes.
    pub at: Duration,
    /// How long a SIGSTOPped broker hangs, a killed one stays down before its (slow) start,
    /// or the link stays cut.
    pub pause: Duration,
    /// For [`FaultKind::Netem`]: loss %, delay ms, jitter ms, reorder %, duplicate %.
    pub netem: [u32; 5],
}

/// The schedule of one run: a pure function of `(seed, brokers, cycle length)`.
#[derive(Debug)]
pub struct Schedule {
    rng: fastrand::Rng,
    brokers: usize,
    cycle: Duration,
    next_cycle: u64,
    partitions: bool,
}

impl Schedule {
    /// With `partitions` (two brokers in namespaces), link cuts and netem are drawn too.
    pub fn new(seed: u64, brokers: usize, cycle: Duration, partitions: bool) -> Schedule {
        Schedule {
            rng: fastrand::Rng::with_seed(seed),
            brokers: brokers.max(1),
            cycle,
            next_cycle: 0,
            partitions,
        }
    }
}

impl Iterator for Schedule {
    type Item = PlannedFault;

    fn next(&mut self) -> Option<PlannedFault> {
        let cycle = self.next_cycle;
        self.next_cycle += 1;
        let kind = if self.partitions {
            match self.rng.u32(0..100) {
                0..25 => FaultKind::Kill9,
                25..35 => FaultKind::Kill9SlowStart,
                35..45 => FaultKind::Term,
                45..55 => FaultKind::Stop,
                55..85 => FaultKind::Partition,
                _ => FaultKind::Netem,
            }
        } else {
            match self.rng.u32(0..100) {
                0..40 => FaultKind::Kill9,
                40..55 => FaultKind::Kill9SlowStart,
                55..75 => FaultKind::Term,
                _ => FaultKind::Stop,
            }
        };
        let broker = self.rng.usize(0..self.brokers);
        let ms = self.cycle.as_millis().max(2) as u64;
        // Somewhere in the first 80% of the cycle, so the workload runs after the fault too.
        let at = Duration::from_millis(self.rng.u64(ms / 10..=ms * 8 / 10));
        let pause = match kind {
            FaultKind::Kill9SlowStart => Duration::from_millis(self.rng.u64(500..=2500)),
            FaultKind::Stop => Duration::from_millis(self.rng.u64(100..=2000)),
            FaultKind::Partition => Duration::from_millis(self.rng.u64(500..=4000)),
            _ => Duration::ZERO,
        };
        let netem = if kind == FaultKind::Netem {
            [
                self.rng.u32(0..=20),
                self.rng.u32(0..=80),
                self.rng.u32(0..=20),
                self.rng.u32(0..=25),
                self.rng.u32(0..=5),
            ]
        } else {
            [0; 5]
        };
        Some(PlannedFault {
            cycle,
            broker,
            kind,
            at,
            pause,
            netem,
        })
    }
}

/// A worker's own random choices (batch sizes, aborts), derived from the run's seed.
pub fn worker_rng(seed: u64, worker: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule_and_another_seed_does_not() {
        let c = Duration::from_secs(5);
        let a: Vec<_> = Schedule::new(42, 2, c, false).take(50).collect();
        let b: Vec<_> = Schedule::new(42, 2, c, false).take(50).collect();
        let other: Vec<_> = Schedule::new(43, 2, c, false).take(50).collect();
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert!(a.iter().all(|f| f.at < c && f.broker < 2));
        for k in FaultKind::ALL {
            assert!(
                a.iter().any(|f| f.kind == k),
                "{k:?} never drawn in 50 cycles"
            );
        }
        assert!(a.iter().any(|f| f.broker == 1));
        assert!(Schedule::new(1, 1, c, false)
            .take(50)
            .all(|f| f.broker == 0));
        let p: Vec<_> = Schedule::new(42, 2, c, true).take(50).collect();
        assert!(p.iter().any(|f| f.kind == FaultKind::Partition));
        assert!(p
            .iter()
            .any(|f| f.kind == FaultKind::Netem && f.netem != [0; 5]));
        assert!(a.iter().all(|f| f.kind != FaultKind::Partition));
    }
}
