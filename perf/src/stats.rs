//! Arithmetic on measurements: [`Spread`] (median, min, max over runs) and [`Latency`]
//! (an HdrHistogram of per-message latencies).

use std::time::Duration;

use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;

/// Median, minimum and maximum of a set of per-run figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no values. The median of an even number of values is the mean of the middle
    /// two. NaNs are ignored.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }

    /// Every figure multiplied by `k` (messages/s to MB/s).
    pub fn scaled(self, k: f64) -> Spread {
        Spread {
            median: self.median * k,
            min: self.min * k,
            max: self.max * k,
        }
    }
}

/// Highest latency recorded: one hour (longer values are clamped to it).
const MAX_NS: u64 = 3_600_000_000_000;

/// Per-message latencies in nanoseconds, 3 significant digits, 1 ns to 1 h.
///
/// The histogram (about 260 KB of counters at these bounds) is allocated only once more than
/// [`PENDING_MAX`] values were recorded or merged: until then the values wait in a short list.
/// With 1,000 consumers and 200 senders (`--consumers`, `--clients`) each keeping its own
/// latencies, allocating, zeroing and merging a full histogram per task cost mqperf more CPU
/// than its messages did (`hdrhistogram::Histogram::add`, `memset` and page faults at the top
/// of its profile), inside the timed phases.
#[derive(Debug, Clone)]
pub struct Latency {
    /// Values not yet in `hist`, already clamped to 1 ns ..= 1 h.
    pending: Vec<u64>,
    hist: Option<Box<Histogram<u64>>>,
}

/// Values a [`Latency`] keeps as a list before it allocates its histogram.
const PENDING_MAX: usize = 4096;

fn empty_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid histogram bounds")
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Latency {
        Latency {
            pending: Vec::new(),
            hist: None,
        }
    }

    /// Records one latency (at least 1 ns, at most one hour).
    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(MAX_NS));
    }

    /// Records one latency in nanoseconds (clamped to 1 ns ..= 1 h).
    pub fn record_ns(&mut self, ns: u64) {
        self.pending.push(ns.clamp(1, MAX_NS));
        if self.pending.len() > PENDING_MAX {
            self.flush();
        }
    }

    /// Moves the pending values into the histogram (allocating it).
    fn flush(&mut self) {
        let h = self.hist.get_or_insert_with(|| Box::new(empty_histogram()));
        for v in self.pending.drain(..) {
            h.saturating_record(v);
        }
    }

    /// Every value as one histogram.
    fn histogram(&self) -> std::borrow::Cow<'_, Histogram<u64>> {
        match (&self.hist, self.pending.is_empty()) {
            (Some(h), true) => std::borrow::Cow::Borrowed(&**h),
            (h, _) => {
                let mut all = h.as_deref().cloned().unwrap_or_else(empty_histogram);
                for &v in &self.pending {
                    all.saturating_record(v);
                }
                std::borrow::Cow::Owned(all)
            }
        }
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Latency) {
        if let Some(h) = &other.hist {
            self.flush();
            // Same bounds on both sides, so adding cannot fail.
            let _ = self.hist.as_mut().expect("flushed").add(&**h);
        }
        for &v in &other.pending {
            self.record_ns(v);
        }
    }

    /// Values recorded.
    pub fn samples(&self) -> u64 {
        self.hist.as_ref().map_or(0, |h| h.len()) + self.pending.len() as u64
    }

    /// The value at quantile `q` (0.5 = p50) in microseconds; `None` if empty.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        (self.samples() > 0).then(|| self.histogram().value_at_quantile(q) as f64 / 1000.0)
    }

    /// The histogram in HdrHistogram's V2 encoding (to carry it in a message).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail, and V2 encodes every histogram.
        let _ = V2Serializer::new().serialize(&*self.histogram(), &mut out);
        out
    }

    /// Reads what [`Latency::to_bytes`] wrote.
    pub fn from_bytes(bytes: &[u8]) -> Result<Latency, String> {
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &bytes[..])
            .map_err(|e| format!("not an HdrHistogram V2 encoding: {e:?}"))?;
        let mut all = empty_histogram();
        all.add(&h)
            .map_err(|e| format!("histogram out of range: {e:?}"))?;
        Ok(Latency {
            pending: Vec::new(),
            hist: Some(Box::new(all)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 10.0]).unwrap().median, 3.0);
        assert_eq!(Spread::of(&[5.0]).unwrap().min, 5.0);
        assert_eq!(Spread::of(&[f64::NAN, 1.0]).unwrap().max, 1.0);
        let s = Spread::of(&[1000.0, 2000.0]).unwrap().scaled(0.5);
        assert_eq!((s.min, s.median, s.max), (500.0, 750.0, 1000.0));
    }

    #[test]
    fn latency_quantiles_merge_and_round_trip() {
        let mut l = Latency::new();
        assert_eq!(l.quantile_us(0.5), None);
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        l.record_ns(0);
        l.record_ns(u64::MAX);
        assert_eq!(l.samples(), 1002);
        let p50 = l.quantile_us(0.5).unwrap();
        let p99 = l.quantile_us(0.99).unwrap();
        assert!((495.0..=505.0).contains(&p50), "{p50}");
        assert!(p50 <= p99);
        let back = Latency::from_bytes(&l.to_bytes()).unwrap();
        assert_eq!(back.samples(), l.samples());
        assert_eq!(back.quantile_us(0.99), l.quantile_us(0.99));
        let mut m = Latency::new();
        m.merge(&l);
        m.merge(&back);
        assert_eq!(m.samples(), 2004);
        assert!(Latency::from_bytes(b"nope").is_err());
    }

    /// Few values stay a list; past the list's bound, and when merging lists into a
    /// histogram or a histogram into a list, every value counts once.
    #[test]
    fn latency_lists_and_histograms_mix() {
        let mut small = Latency::new();
        for us in 1..=10u64 {
            small.record(Duration::from_micros(us));
        }
        assert!(small.hist.is_none());
        assert_eq!(small.samples(), 10);
        let mut big = Latency::new();
        for us in 1..=(PENDING_MAX as u64 + 10) {
            big.record(Duration::from_micros(us));
        }
        assert!(big.hist.is_some());
        assert_eq!(big.samples(), PENDING_MAX as u64 + 10);
        let mut a = small.clone();
        a.merge(&big);
        let mut b = big.clone();
        b.merge(&small);
        assert_eq!(a.samples(), b.samples());
        assert_eq!(a.quantile_us(0.5), b.quantile_us(0.5));
        assert_eq!(a.quantile_us(1.0), b.quantile_us(1.0));
        assert_eq!(small.quantile_us(1.0).map(|v| v.round()), Some(10.0));
        let back = Latency::from_bytes(&small.to_bytes()).unwrap();
        assert_eq!(back.samples(), 10);
    }
}
