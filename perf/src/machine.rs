//! [`Machine`]: the hardware a benchmark ran on, for the banner and every JSON line.

/// Cores and CPU model of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// `std::thread::available_parallelism` (what this process may use).
    pub cores: usize,
    /// The first `model name` of `/proc/cpuinfo`, or `"unknown"`.
    pub cpu: String,
    /// How idle CPUs wait (Linux cpuidle): the driver, and for `haltpoll` (a KVM guest) how
    /// long an idle vCPU polls before it halts, which sets the tail of a wake-up there
    /// (README, "Latency on a virtual machine"); `None` where it cannot be read.
    pub idle: Option<String>,
}

impl Machine {
    /// Reads the machine's description.
    pub fn detect() -> Machine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| cpu_model(&s))
            .unwrap_or_else(|| "unknown".to_string());
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let idle = idle_line(
            read("/sys/devices/system/cpu/cpuidle/current_driver").as_deref(),
            read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").as_deref(),
        );
        Machine { cores, cpu, idle }
    }
}

/// `cpuidle DRIVER`, with `guest_halt_poll_ns N` for the haltpoll driver.
fn idle_line(driver: Option<&str>, halt_poll_ns: Option<&str>) -> Option<String> {
    let driver = driver.map(str::trim).filter(|d| !d.is_empty())?;
    Some(match halt_poll_ns.map(str::trim) {
        Some(ns) if driver == "haltpoll" && !ns.is_empty() => {
            format!("cpuidle haltpoll, guest_halt_poll_ns {ns}")
        }
        _ => format!("cpuidle {driver}"),
    })
}

/// The value of the first `model name` line (x86) or `Model`/`Hardware` line (ARM).
fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Model", "Hardware"].iter().find_map(|key| {
        cpuinfo.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_string())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_model_name() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(info).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(
            cpu_model("Hardware\t: BCM2835\n").as_deref(),
            Some("BCM2835")
        );
        assert_eq!(cpu_model("processor: 0\n"), None);
        let m = Machine::detect();
        assert!(m.cores >= 1 && !m.cpu.is_empty());
    }

    #[test]
    fn names_the_idle_driver_and_the_halt_polling() {
        assert_eq!(
            idle_line(Some("haltpoll\n"), Some("0\n")).as_deref(),
            Some("cpuidle haltpoll, guest_halt_poll_ns 0")
        );
        assert_eq!(
            idle_line(Some("intel_idle\n"), None).as_deref(),
            Some("cpuidle intel_idle")
        );
        // The module's parameter is only about haltpoll.
        assert_eq!(
            idle_line(Some("acpi_idle"), Some("200000")).as_deref(),
            Some("cpuidle acpi_idle")
        );
        assert_eq!(
            idle_line(Some("none\n"), None).as_deref(),
            Some("cpuidle none")
        );
        assert_eq!(idle_line(None, Some("0")), None);
        assert_eq!(idle_line(Some(" \n"), None), None);
    }
}
