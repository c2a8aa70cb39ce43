//! [`CpuTimes`] and [`Steal`]: how much of the machine's CPU time the hypervisor took away
//! while a phase ran, for the report's `steal` line and the JSON rows' `steal_pct`.
//!
//! On a virtual machine, "steal" is the time a virtual CPU wanted to run but the host ran
//! something else (`/proc/stat`'s 8th column). It matters to every latency figure: on the
//! project's 2-vCPU VM, a recoverable run that writes to the disk while both vCPUs are busy
//! loses ~10 % of its CPU time in blocks of 12-17 ms, one every 100 ms, on both vCPUs at once
//! (docs/benchmarks.md, "The host's share"), and each block is a stall every message in flight
//! waits out. A phase whose steal share is above zero measured the host as well as mq.

/// The whole machine's CPU time counters (all CPUs, in `USER_HZ` ticks), from the `cpu`
/// line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// All ticks: user, nice, system, idle, iowait, irq, softirq and steal.
    pub total: u64,
    /// Ticks stolen by the hypervisor.
    pub steal: u64,
}

impl CpuTimes {
    /// The counters now; `None` where `/proc/stat` cannot tell (not Linux).
    pub fn now() -> Option<CpuTimes> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// The `cpu` line of `/proc/stat`: `cpu user nice system idle iowait irq softirq steal guest
/// guest_nice` (guest time is already counted in user and nice, so it is left out).
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 8 {
        return None;
    }
    Some(CpuTimes {
        total: v.iter().sum(),
        steal: v[7],
    })
}

/// Steal summed over the runs of one operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steal {
    total: u64,
    steal: u64,
    /// A run lacked a reading (or the counters went back): the share is unknown.
    unknown: bool,
}

impl Steal {
    /// Adds a run timed between `before` and `after` (either `None`: unknown).
    pub fn add(&mut self, before: Option<CpuTimes>, after: Option<CpuTimes>) {
        match (before, after) {
            (Some(b), Some(a)) if a.total >= b.total => {
                self.total += a.total - b.total;
                self.steal += a.steal.saturating_sub(b.steal);
            }
            _ => self.unknown = true,
        }
    }

    /// Stolen share of all CPU time over the runs, in percent; `None` if a run's share is
    /// unknown, or if the runs were too short for one tick.
    pub fn percent(&self) -> Option<f64> {
        (!self.unknown && self.total > 0).then(|| 100.0 * self.steal as f64 / self.total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  210466 5 13679 55063 734 1 325 965 7 0\n\
                        cpu0 105000 2 6800 27000 300 0 160 480 0 0\n\
                        intr 1 2 3\n";

    #[test]
    fn the_cpu_line_gives_total_and_steal() {
        let t = parse(STAT).unwrap();
        assert_eq!(t.steal, 965);
        assert_eq!(t.total, 210466 + 5 + 13679 + 55063 + 734 + 1 + 325 + 965);
    }

    #[test]
    fn a_short_or_garbled_cpu_line_is_unknown() {
        assert_eq!(parse("cpu  1 2 3\n"), None);
        assert_eq!(parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7 8\n"), None);
    }

    #[test]
    fn steal_is_summed_over_runs() {
        let at = |total, steal| Some(CpuTimes { total, steal });
        let mut s = Steal::default();
        assert_eq!(s.percent(), None);
        s.add(at(1000, 10), at(1200, 30)); // 20 of 200
        s.add(at(2000, 50), at(2600, 50)); // 0 of 600
        assert_eq!(s.percent(), Some(2.5));
    }

    #[test]
    fn one_unknown_run_makes_the_share_unknown() {
        let at = |total, steal| Some(CpuTimes { total, steal });
        let mut s = Steal::default();
        s.add(at(1000, 10), at(1200, 30));
        s.add(None, at(2600, 50));
        assert_eq!(s.percent(), None);
        s.add(at(3000, 50), at(3100, 60));
        assert_eq!(s.percent(), None);
        let mut first_unknown = Steal::default();
        first_unknown.add(at(1000, 10), None);
        first_unknown.add(at(1000, 10), at(1100, 20));
        assert_eq!(first_unknown.percent(), None);
    }

    #[test]
    fn this_machine_is_readable_where_proc_exists() {
        if std::path::Path::new("/proc/stat").exists() {
            let t = CpuTimes::now().expect("/proc/stat's cpu line");
            assert!(t.total > 0 && t.steal <= t.total);
        }
    }
}
