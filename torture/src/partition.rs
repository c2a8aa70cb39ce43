//! Network partitions between the two brokers: two Linux network namespaces created by the
//! harness, joined by a veth pair with 10.200.x.x addresses (only inside those namespaces),
//! `tc netem` for loss, delay, duplication and reordering, and the link cut and healed.
//! Everything created is removed when the [`Net`] is dropped.

use std::process::{Command, Stdio};

use anyhow::{bail, Context};

/// The two namespaces and the link between them.
#[derive(Debug)]
pub struct Net {
    pub ns_a: String,
    pub ns_b: String,
    pub veth_a: String,
    pub veth_b: String,
    pub ip_a: String,
    pub ip_b: String,
    /// Namespaces created so far (removed on drop; removing one removes its veth end).
    created: Vec<String>,
}

/// Runs `ip`/`tc` with `args`; an error with its stderr if it fails.
fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Why partitions cannot run here, if they cannot: not root, no `ip` or `tc`.
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok();
    let root = uid.is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("partitions need root (network namespaces)".to_string());
    }
    for (p, arg) in [("ip", "-V"), ("tc", "-V")] {
        if sh(p, &[arg]).is_err() {
            return Some(format!(
                "partitions need `{p}` (Debian: apt-get install -y iproute2); the harness installs nothing"
            ));
        }
    }
    None
}

impl Net {
    /// The names [`Net::create`] uses for `id`, without creating anything (and without
    /// removing anything when dropped): for the harness process running inside namespace A.
    pub fn names(id: u32) -> Net {
        let n = id % 250;
        Net {
            ns_a: format!("mqt{id}a"),
            ns_b: format!("mqt{id}b"),
            veth_a: format!("mqt{id}va"),
            veth_b: format!("mqt{id}vb"),
            ip_a: format!("10.200.{n}.1"),
            ip_b: format!("10.200.{n}.2"),
            created: Vec::new(),
        }
    }

    /// Creates the namespaces `mqt<id>a` and `mqt<id>b`, a veth pair between them with
    /// 10.200.<n>.1/30 and .2/30, and brings up their links and loopbacks. Fails (having
    /// removed what it made) where namespaces cannot be created.
    pub fn create(id: u32) -> anyhow::Result<Net> {
        let mut net = Net::names(id);
        for ns in [net.ns_a.clone(), net.ns_b.clone()] {
            sh("ip", &["netns", "add", &ns])?;
            net.created.push(ns.clone());
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        }
        sh(
            "ip",
            &[
                "-n",
                &net.ns_a,
                "link",
                "add",
                &net.veth_a,
                "type",
                "veth",
                "peer",
                "name",
                &net.veth_b,
                "netns",
                &net.ns_b,
            ],
        )?;
        for (ns, dev, ip) in [
            (&net.ns_a, &net.veth_a, &net.ip_a),
            (&net.ns_b, &net.veth_b, &net.ip_b),
        ] {
            sh(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/30"), "dev", dev],
            )?;
            sh("ip", &["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(net)
    }

    /// Cuts the link (A's end down: B's loses its carrier too).
    pub fn cut(&self) -> anyhow::Result<()> {
        sh(
            "ip",
            &["-n", &self.ns_a, "link", "set", &self.veth_a, "down"],
        )
    }

    /// Heals the link.
    pub fn heal(&self) -> anyhow::Result<()> {
        sh("ip", &["-n", &self.ns_a, "link", "set", &self.veth_a, "up"])
    }

    /// `tc netem` on both ends: `loss`% loss, `delay_ms`±`jitter_ms` delay, `reorder`% of
    /// packets sent at once (reordered), `duplicate`% duplicated. All zero: removes it.
    pub fn netem(
        &self,
        loss: u32,
        delay_ms: u32,
        jitter_ms: u32,
        reorder: u32,
        duplicate: u32,
    ) -> anyhow::Result<()> {
        for (ns, dev) in [(&self.ns_a, &self.veth_a), (&self.ns_b, &self.veth_b)] {
            let _ = sh("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
            if loss + delay_ms + reorder + duplicate == 0 {
                continue;
            }
            let (delay, jitter) = (format!("{delay_ms}ms"), format!("{jitter_ms}ms"));
            let (loss, reorder, duplicate) = (
                format!("{loss}%"),
                format!("{reorder}%"),
                format!("{duplicate}%"),
            );
            sh(
                "tc",
                &[
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "netem",
                    "delay",
                    &delay,
                    &jitter,
                    "loss",
                    &loss,
                    "reorder",
                    &reorder,
                    "duplicate",
                    &duplicate,
                ],
            )?;
        }
        Ok(())
    }

    /// Why `tc netem` cannot be used on the link, if it cannot (a kernel without
    /// `CONFIG_NET_SCH_NETEM`, for one).
    pub fn netem_unavailable(&self) -> Option<String> {
        match self.netem(0, 1, 0, 0, 0) {
            Ok(()) => {
                let _ = self.netem(0, 0, 0, 0, 0);
                None
            }
            Err(e) => Some(format!("{e:#}")),
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.created.drain(..).rev() {
            let _ = sh("ip", &["netns", "del", &ns]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where namespaces can be made: two pings across the veth pair, none after a cut, and
    /// everything gone after the drop.
    #[test]
    fn a_link_between_two_namespaces_cuts_heals_and_is_removed() {
        if let Some(why) = unavailable() {
            println!("skipped: {why}");
            return;
        }
        let net = match Net::create(std::process::id() % 100_000 + 900_000) {
            Ok(n) => n,
            Err(e) => {
                println!("skipped: network namespaces cannot be created here: {e:#}");
                return;
            }
        };
        let ping = |net: &Net| {
            sh(
                "ip",
                &[
                    "netns", "exec", &net.ns_a, "ping", "-c", "1", "-W", "1", &net.ip_b,
                ],
            )
            .is_ok()
        };
        let has_ping = Command::new("ping").arg("-V").output().is_ok();
        if has_ping {
            assert!(ping(&net), "no ping across the healed link");
        }
        net.cut().unwrap();
        if has_ping {
            assert!(!ping(&net), "a ping across the cut link");
        }
        net.heal().unwrap();
        match net.netem_unavailable() {
            None => {
                net.netem(10, 20, 5, 25, 1).unwrap();
                net.netem(0, 0, 0, 0, 0).unwrap();
            }
            Some(why) => println!("netem not tested: {why}"),
        }
        let names = (net.ns_a.clone(), net.ns_b.clone());
        drop(net);
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        assert!(
            !list.contains(&names.0) && !list.contains(&names.1),
            "{list}"
        );
    }
}
