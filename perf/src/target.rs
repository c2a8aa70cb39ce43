//! [`Target`]: what one `--target` names — the mq broker (embedded or `--broker`), RabbitMQ
//! (`amqp://`) or NATS JetStream (`nats://`) — and [`TargetInfo`], how the white paper's
//! delivery modes map onto it, for the banner and every report row.

use serde::Serialize;

use crate::config::{Config, DeliveryKind, Mode};

/// One system under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The mq broker: `--broker URL`, or an embedded one (`--target mq`, or no `--target`).
    Mq,
    /// RabbitMQ (AMQP 0-9-1), e.g. `amqp://guest:guest@127.0.0.1:5672`.
    Amqp(String),
    /// NATS JetStream, e.g. `nats://127.0.0.1:4222`.
    Nats(String),
}

impl Target {
    /// Parses `mq`, `amqp://...` or `nats://...`.
    pub fn parse(s: &str) -> Result<Target, String> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        if lower == "mq" {
            Ok(Target::Mq)
        } else if lower.starts_with("amqp://") {
            Ok(Target::Amqp(t.to_string()))
        } else if lower.starts_with("nats://") {
            Ok(Target::Nats(t.to_string()))
        } else if lower.starts_with("amqps://") || lower.starts_with("tls://") {
            Err(format!(
                "`{}`: TLS peers are not supported; use amqp:// or nats:// on loopback",
                truncate(t)
            ))
        } else {
            Err(format!(
                "`{}` is not a target: give mq, amqp://user:password@host:port or nats://host:port",
                truncate(t)
            ))
        }
    }

    /// `"mq"`, `"rabbitmq"` or `"nats"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Mq => "mq",
            Target::Amqp(_) => "rabbitmq",
            Target::Nats(_) => "nats",
        }
    }

    /// The URL without its password (for the banner and reports).
    pub fn display_url(&self) -> String {
        match self {
            Target::Mq => "mq".to_string(),
            Target::Amqp(u) | Target::Nats(u) => redact(u),
        }
    }
}

/// A URL with the password of `user:password@` replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Client-supplied text in messages: at most 120 characters.
fn truncate(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(MAX).collect::<String>())
    }
}

/// How a target runs the configured mode: the closest equivalent of mq's delivery, and
/// whether the target has the message on disk (fsync'd) before it acknowledges a send.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetInfo {
    /// `"mq"`, `"rabbitmq"`, `"nats"`.
    pub kind: &'static str,
    /// The server's version, when it says (`None` for the embedded broker: this build).
    pub version: Option<String>,
    /// The mode in the target's own terms.
    pub mapping: String,
    /// The acknowledgement of a send means the message was fsync'd.
    pub fsync_before_ack: bool,
    /// Why `fsync_before_ack` is what it is.
    pub fsync_note: String,
}

impl TargetInfo {
    /// mq itself.
    pub fn mq(config: &Config) -> TargetInfo {
        let (mapping, fsync, note) = match (config.mode, config.delivery) {
            (Mode::Notx, DeliveryKind::Express) => (
                "express: in memory, acknowledged once queued",
                false,
                "express messages are never written to disk",
            ),
            (Mode::Notx, DeliveryKind::Recoverable) => (
                "recoverable: journal record, acknowledged once on disk",
                true,
                "the journal is fsync'd (group commit) before the acknowledgement",
            ),
            (Mode::Tx, _) => (
                "TX: every send and every receive a single-message transaction",
                true,
                "a transaction commits once its journal record is fsync'd",
            ),
        };
        TargetInfo {
            kind: "mq",
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            mapping: mapping.to_string(),
            fsync_before_ack: fsync,
            fsync_note: note.to_string(),
        }
    }

    /// RabbitMQ (classic queues, AMQP 0-9-1).
    pub fn rabbitmq(config: &Config, version: Option<String>) -> TargetInfo {
        let (mapping, fsync, note) = match (config.mode, config.delivery) {
            (Mode::Notx, DeliveryKind::Express) => (
                "express: non-durable queue, transient messages (delivery_mode 1), publisher confirms; consumer with prefetch, acks in batches",
                false,
                "transient messages are confirmed once in the queue (paged to disk only under memory pressure, never fsync'd)",
            ),
            (Mode::Notx, DeliveryKind::Recoverable) => (
                "recoverable: durable queue, persistent messages (delivery_mode 2), publisher confirms; consumer with prefetch, acks in batches",
                true,
                "RabbitMQ confirms a persistent message routed to a durable queue after it is fsync'd to disk (fsyncs are batched)",
            ),
            (Mode::Tx, _) => (
                "TX: durable queue, persistent messages; every publish its own tx.select transaction (basic.publish + tx.commit), every receive basic.ack + tx.commit",
                true,
                "tx.commit of persistent messages to a durable queue returns after the fsync",
            ),
        };
        let mapping = send_one_mapping(
            config,
            mapping,
            "publisher confirms",
            "publisher confirms, each awaited before the next publish (--send-one)",
        );
        let (consumed, got) = match config.mode {
            Mode::Notx => (
                "consumer with prefetch, acks in batches",
                "every receive a basic.get (an empty queue asked again after 1 ms), acked before the next (--receive-one)",
            ),
            Mode::Tx => (
                "every receive basic.ack + tx.commit",
                "every receive basic.get (an empty queue asked again after 1 ms), basic.ack + tx.commit (--receive-one)",
            ),
        };
        let mapping = one_mapping(config.receive_one, mapping, consumed, got);
        TargetInfo {
            kind: "rabbitmq",
            version,
            mapping,
            fsync_before_ack: fsync,
            fsync_note: note.to_string(),
        }
    }

    /// NATS JetStream.
    pub fn nats(config: &Config, version: Option<String>) -> TargetInfo {
        let (mapping, note) = match (config.mode, config.delivery) {
            (Mode::Notx, DeliveryKind::Express) => (
                "express: memory-storage work-queue stream, publish acks awaited (pipelined); durable pull consumer, every message acked (explicit ack)",
                "memory storage is never written to disk",
            ),
            (Mode::Notx, DeliveryKind::Recoverable) => (
                "recoverable: file-storage work-queue stream, publish acks awaited (pipelined); durable pull consumer, every message acked (explicit ack)",
                "JetStream acknowledges a publish once written to its file store, before any fsync: the file store syncs in the background on its own timer (nats-server 2.9 has no option to fsync every write)",
            ),
            (Mode::Tx, _) => (
                "TX: file-storage work-queue stream, every publish waits for its ack before the next; every receive an explicit ack confirmed by the server (double ack)",
                "JetStream acknowledges a publish (and a double ack) once written to its file store, before any fsync (nats-server 2.9 has no option to fsync every write)",
            ),
        };
        let mapping = send_one_mapping(
            config,
            mapping,
            "publish acks awaited (pipelined)",
            "each publish ack awaited before the next publish (--send-one)",
        );
        let (pulled, one) = match config.mode {
            Mode::Notx => (
                "durable pull consumer,",
                "durable pull consumer, one message per pull request (--receive-one),",
            ),
            Mode::Tx => (
                "every receive an explicit ack",
                "every receive one pull request of one message (--receive-one) and an explicit ack",
            ),
        };
        let mapping = one_mapping(config.receive_one, mapping, pulled, one);
        TargetInfo {
            kind: "nats",
            version,
            mapping,
            fsync_before_ack: false,
            fsync_note: note.to_string(),
        }
    }
}

/// A peer's `mapping` with its pipelined acknowledgements (`pipelined`, which it must contain)
/// said as `awaited` when `--send-one` applies (NOTX; a TX send is one at a time anyway).
fn send_one_mapping(config: &Config, mapping: &str, pipelined: &str, awaited: &str) -> String {
    one_mapping(
        config.send_one && config.mode == Mode::Notx,
        mapping.to_string(),
        pipelined,
        awaited,
    )
}

/// `mapping` with `from` (which it must contain) said as `to` when `on` (a one-at-a-time
/// flag applies).
fn one_mapping(on: bool, mapping: String, from: &str, to: &str) -> String {
    if !on {
        return mapping;
    }
    debug_assert!(mapping.contains(from), "{mapping}");
    mapping.replacen(from, to, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert_eq!(Target::parse("MQ"), Ok(Target::Mq));
        assert_eq!(
            Target::parse("amqp://guest:guest@127.0.0.1:5672").map(|t| t.kind()),
            Ok("rabbitmq")
        );
        assert_eq!(
            Target::parse("nats://127.0.0.1:4222").map(|t| t.kind()),
            Ok("nats")
        );
        assert!(Target::parse("http://x")
            .unwrap_err()
            .contains("not a target"));
        assert!(Target::parse("amqps://x").unwrap_err().contains("TLS"));
        assert_eq!(
            Target::parse("amqp://guest:secret@h:1")
                .unwrap()
                .display_url(),
            "amqp://guest:***@h:1"
        );
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }
}
