//! Fixed-bucket histograms of relaxed atomics: observing takes no lock and allocates nothing.

use std::sync::atomic::{AtomicU64, Ordering};

/// A histogram with fixed upper bounds (plus +Inf). The sum is kept in `1 / scale` units (for
/// seconds, `scale` 1e9 keeps nanoseconds) so it fits an integer atomic.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    /// One per bound, then +Inf. Not cumulative.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    scale: f64,
}

/// What a histogram held at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub sum: f64,
    pub count: u64,
    /// (upper bound, count in that bucket, not cumulative); the last bound is `f64::MAX` (+Inf).
    pub buckets: Vec<(f64, u64)>,
}

impl AtomicHistogram {
    pub fn new(bounds: &'static [f64], scale: f64) -> Self {
        AtomicHistogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            scale,
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum
            .fetch_add((v * self.scale).round() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect::<Vec<_>>();
        HistogramSnapshot {
            sum: self.sum.load(Ordering::Relaxed) as f64 / self.scale,
            // The buckets' total, so that +Inf always equals the count even mid-update.
            count: buckets.iter().map(|b| b.1).sum(),
            buckets,
        }
    }
}

/// Bounds for `fdatasync` durations, in seconds: 50 µs to 2.5 s.
pub const SYNC_SECONDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5,
];
/// Bounds for group-commit sizes, in records: 1 to 4096.
pub const BATCH_RECORDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = AtomicHistogram::new(&[1.0, 10.0], 1000.0);
        for v in [0.5, 1.0, 3.0, 50.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets, vec![(1.0, 2), (10.0, 1), (f64::MAX, 1)]);
        assert!((s.sum - 54.5).abs() < 1e-9, "{}", s.sum);
    }
}
