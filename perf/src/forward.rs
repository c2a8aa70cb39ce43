//! Store-and-forward (`--forward`): the [`Route`] from broker A, where every send goes, to
//! broker B, where the queue lives and every receive happens; the queue's names on each side;
//! and [`wait_outgoing_empty`], the wait until A has handed everything to B.
//!
//! The queue is given as a local path (`.\private$\perf`). On B it is used as given; A is sent
//! it by B's address: `DIRECT=TCP:127.0.0.1:<port of B>\private$\perf` (`DIRECT=OS:` for a host
//! name). A broker takes a name as its own when host and port match its listen address, so any
//! other port is remote: A stores the message in its outgoing queue for B (`host:port`) and
//! forwards it.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mq_client::format_name::{FormatName, Host, QueueAddress, QueueKind};
use mq_client::{Client, OutgoingQueue};

/// Where a broker listens, as format names and outgoing queues name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub host: Host,
    pub port: u16,
}

impl BrokerAddr {
    /// The address in a broker URL (`http://127.0.0.1:1801`, `http://[::1]:1801`,
    /// `http://host:1801/`); the port must be given.
    pub fn from_url(url: &str) -> Result<BrokerAddr, String> {
        let trimmed = url.trim();
        let lower = trimmed.to_ascii_lowercase();
        let rest = ["http://", "https://"]
            .iter()
            .find_map(|p| lower.starts_with(p).then(|| &trimmed[p.len()..]))
            .ok_or_else(|| format!("`{url}` is not a broker URL (http://host:port)"))?;
        let host_port = rest.split('/').next().unwrap_or_default();
        let bad =
            |why: &str| format!("`{url}`: {why}; a broker URL looks like http://127.0.0.1:1801");
        let parsed =
            FormatName::parse(&format!("{host_port}\\q")).map_err(|_| bad("no host:port"))?;
        let Some(addr) = parsed.single() else {
            return Err(bad("no host:port"));
        };
        match (&addr.host, addr.port) {
            (Host::Local, _) => Err(bad("no host")),
            (_, None) => Err(bad("no port")),
            (host, Some(port)) => Ok(BrokerAddr {
                host: host.clone(),
                port,
            }),
        }
    }

    /// The address a broker listens on.
    pub fn from_socket(addr: SocketAddr) -> BrokerAddr {
        BrokerAddr {
            host: Host::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

impl fmt::Display for BrokerAddr {
    /// `host:port`, as `mq outgoing list` shows a destination (IPv6 in brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The queue named for `--forward`: a local path (`.\private$\perf` or `.\perf`), since mqperf
/// addresses it on each broker itself.
pub fn local_queue(queue: &str) -> Result<QueueAddress, String> {
    let addr: QueueAddress = queue.parse().map_err(|e| format!("{e}"))?;
    if addr.host != Host::Local || addr.port.is_some() || addr.kind != QueueKind::Normal {
        return Err(format!(
            "with --forward, <QUEUE> must be a local path such as .\\private$\\perf (got `{queue}`); mqperf sends to it on the receiving broker through the sending broker by itself"
        ));
    }
    Ok(addr)
}

/// Sends go to broker A, the queue (and every receive) is on broker B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The sending broker.
    pub a: BrokerAddr,
    /// The receiving broker (A's outgoing queue for it is named by this address).
    pub b: BrokerAddr,
}

impl Route {
    /// A route between two different brokers.
    pub fn new(a: BrokerAddr, b: BrokerAddr) -> Result<Route, String> {
        if a == b {
            return Err(format!(
                "--forward needs two brokers, but both are {a}; start a second one for --receive-broker"
            ));
        }
        Ok(Route { a, b })
    }

    /// The format name of the local path `queue` on B, as sent through A.
    pub fn on_b(&self, queue: &str) -> Result<String> {
        remote(queue, &self.b)
    }

    /// The format name of the local path `queue` on A, as sent through B (SERVER's replies).
    pub fn on_a(&self, queue: &str) -> Result<String> {
        remote(queue, &self.a)
    }

    /// `A 127.0.0.1:x -> B 127.0.0.1:y`.
    pub fn describe(&self) -> String {
        format!("A {} -> B {}", self.a, self.b)
    }
}

fn remote(queue: &str, at: &BrokerAddr) -> Result<String> {
    let local = local_queue(queue).map_err(anyhow::Error::msg)?;
    Ok(QueueAddress {
        host: at.host.clone(),
        port: Some(at.port),
        ..local
    }
    .to_string())
}

/// How often the outgoing queue is looked at while waiting.
const POLL: Duration = Duration::from_millis(5);

/// Waits until `a`'s outgoing queue for `destination` is empty: every message forwarded and
/// acknowledged by the destination (an absent outgoing queue is empty). Fails when the count
/// has not gone down for `stall`, naming the queue's state and last error.
pub async fn wait_outgoing_empty(
    a: &Client,
    destination: &BrokerAddr,
    stall: Duration,
) -> Result<()> {
    let name = destination.to_string();
    let mut best = u64::MAX;
    let mut progressed = Instant::now();
    loop {
        let queues = a
            .outgoing()
            .await
            .with_context(|| format!("cannot list the outgoing queues of {}", a.url()))?;
        let Some(q) = find(&queues, &name) else {
            return Ok(());
        };
        if q.messages == 0 {
            return Ok(());
        }
        if q.messages < best {
            best = q.messages;
            progressed = Instant::now();
        } else if progressed.elapsed() >= stall {
            bail!(
                "{} still holds {} message(s) for {name} after {stall:?} without progress (state {}{})",
                a.url(),
                q.messages,
                q.state,
                q.last_error
                    .as_deref()
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The outgoing queue for `destination` (`host:port`, compared ignoring case).
pub fn find<'a>(queues: &'a [OutgoingQueue], destination: &str) -> Option<&'a OutgoingQueue> {
    queues
        .iter()
        .find(|q| q.destination.eq_ignore_ascii_case(destination))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls() {
        let a = BrokerAddr::from_url("http://127.0.0.1:1801").unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:1801");
        let a = BrokerAddr::from_url("HTTP://[::1]:1802/").unwrap();
        assert_eq!(a.to_string(), "[::1]:1802");
        let a = BrokerAddr::from_url("https://LocalHost:1803").unwrap();
        assert_eq!(a.to_string(), "localhost:1803");
        for bad in [
            "127.0.0.1:1801",
            "http://127.0.0.1",
            "http://:1801",
            "http://",
        ] {
            assert!(BrokerAddr::from_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_on_each_side() {
        let route = Route::new(
            BrokerAddr::from_url("http://127.0.0.1:1801").unwrap(),
            BrokerAddr::from_url("http://127.0.0.1:1802").unwrap(),
        )
        .unwrap();
        assert_eq!(route.describe(), "A 127.0.0.1:1801 -> B 127.0.0.1:1802");
        assert_eq!(
            route.on_b(r".\private$\perf").unwrap(),
            r"DIRECT=TCP:127.0.0.1:1802\private$\perf"
        );
        assert_eq!(
            route.on_a(r".\Reply").unwrap(),
            r"DIRECT=TCP:127.0.0.1:1801\Reply"
        );
        let named = Route::new(
            BrokerAddr::from_url("http://localhost:1801").unwrap(),
            BrokerAddr::from_url("http://localhost:1802").unwrap(),
        )
        .unwrap();
        assert_eq!(
            named.on_b(r".\private$\q").unwrap(),
            r"DIRECT=OS:localhost:1802\private$\q"
        );
        assert!(Route::new(route.a.clone(), route.a.clone()).is_err());
        for bad in [
            r"DIRECT=TCP:127.0.0.1:1802\private$\perf",
            r"host\private$\perf",
            r".:1801\private$\perf",
            r".\private$\perf;journal",
        ] {
            assert!(local_queue(bad).is_err(), "{bad}");
            assert!(route.on_b(bad).is_err(), "{bad}");
        }
        assert!(local_queue(r".\private$\perf").is_ok());
    }
}
