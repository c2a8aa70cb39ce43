//! [`Machine`]: the hardware a benchmark ran on, for the banner and every JSON line.

/// Cores and CPU model of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// `std::thread::available_parallelism` (what this process may use).
    pub cores: usize,
    /// The first `model name` of `/proc/cpuinfo`, or `"unknown"`.
    pub cpu: String,
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
        Machine { cores, cpu }
    }
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
}
