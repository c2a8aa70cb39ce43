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
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Latency {
        Latency(Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid histogram bounds"))
    }

    /// Records one latency (at least 1 ns, at most one hour).
    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(MAX_NS));
    }

    /// Records one latency in nanoseconds (clamped to 1 ns ..= 1 h).
    pub fn record_ns(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, MAX_NS));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// Values recorded.
    pub fn samples(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0.5 = p50) in microseconds; `None` if empty.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.value_at_quantile(q) as f64 / 1000.0)
    }

    /// The histogram in HdrHistogram's V2 encoding (to carry it in a message).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail, and V2 encodes every histogram.
        let _ = V2Serializer::new().serialize(&self.0, &mut out);
        out
    }

    /// Reads what [`Latency::to_bytes`] wrote.
    pub fn from_bytes(bytes: &[u8]) -> Result<Latency, String> {
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &bytes[..])
            .map_err(|e| format!("not an HdrHistogram V2 encoding: {e:?}"))?;
        let mut l = Latency::new();
        l.0.add(&h)
            .map_err(|e| format!("histogram out of range: {e:?}"))?;
        Ok(l)
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
}
