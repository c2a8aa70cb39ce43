//! Rate-limited log lines: at most one per interval per source, counting those left out.

use std::sync::Mutex;

/// Allows one log line per `every_ms`; counts the lines it holds back.
#[derive(Debug)]
pub(crate) struct RateLimitedLog {
    every_ms: u64,
    /// (Unix ms of the last line allowed, lines held back since).
    state: Mutex<(u64, u64)>,
}

impl RateLimitedLog {
    pub(crate) const fn new(every_ms: u64) -> Self {
        RateLimitedLog {
            every_ms,
            state: Mutex::new((0, 0)),
        }
    }

    /// `Some(events held back since the last line)` if a line about `n` events may be written
    /// at `now_ms`; else `None`, and the `n` events are counted as held back.
    pub(crate) fn allow(&self, now_ms: u64, n: u64) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.0 == 0 || now_ms.saturating_sub(st.0) >= self.every_ms {
            let held = st.1;
            *st = (now_ms, 0);
            Some(held)
        } else {
            st.1 += n;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_a_count_of_the_rest() {
        let l = RateLimitedLog::new(1000);
        assert_eq!(l.allow(10_000, 1), Some(0));
        for t in 0..500 {
            assert_eq!(l.allow(10_001 + t, 2), None);
        }
        assert_eq!(l.allow(11_000, 1), Some(1000));
        assert_eq!(l.allow(11_001, 1), None);
    }
}
