//! [`rss_bytes`]: a process's resident memory (VmRSS from `/proc/PID/status`), for the report's
//! `rss` line: the embedded broker's (this process) or `--broker-pid`'s.

/// VmRSS of `pid` (`None`: this process) in bytes; `None` where `/proc` cannot tell (not
/// Linux, no such process).
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    parse_vm_rss(&std::fs::read_to_string(path).ok()?)
}

/// The `VmRSS:   1234 kB` line of a `/proc/PID/status`, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
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
            assert!(rss_bytes(None).unwrap() > 0);
            assert!(rss_bytes(Some(std::process::id())).unwrap() > 0);
            assert_eq!(rss_bytes(Some(u32::MAX)), None);
        }
    }
}
