//! `GetBrokerInfo`: what this broker is (name, versions, uptime, addresses, data directory use,
//! limits), for `mq info` and clients that check what they talk to.

use std::collections::HashMap;

use mq_proto::v1;

use crate::broker::Broker;
use crate::ready::Readiness;

pub(crate) fn broker_info(b: &Broker, ready: Option<&Readiness>) -> v1::BrokerInfo {
    let c = b.config();
    let j = b.journal().stats();
    let queues = b.list();
    let f = &c.flow;
    let limits: HashMap<String, u64> = [
        ("max-body-bytes", c.max_body_bytes as u64),
        ("express-quota-bytes", c.express_quota_bytes),
        ("storage-quota-bytes", c.storage_quota_bytes),
        ("journal-segment-bytes", c.journal_segment_bytes),
        ("tx-timeout-secs", c.tx_timeout.as_secs()),
        ("max-connections", f.max_connections as u64),
        (
            "max-streams-per-connection",
            u64::from(f.max_streams_per_connection),
        ),
        ("max-unacked-per-stream", f.max_unacked_per_stream),
        ("max-unacked-per-connection", f.max_unacked_per_connection),
        ("ack-timeout-secs", f.ack_timeout.as_secs()),
        ("max-tx-bytes", f.max_tx_bytes),
        ("max-tx-total-bytes", f.max_tx_total_bytes),
        ("max-tx-messages", f.max_tx_messages),
        ("max-tx-per-connection", f.max_tx_per_connection as u64),
        (
            "max-format-name-elements",
            c.max_format_name_elements as u64,
        ),
        ("max-outgoing-queues", c.max_outgoing_queues as u64),
        ("max-queues", c.max_queues as u64),
        (
            "max-forward-streams-per-peer",
            c.max_forward_streams_per_peer as u64,
        ),
        ("max-forward-streams", c.max_forward_streams as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    v1::BrokerInfo {
        name: c.name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: mq_proto::PROTOCOL_VERSION,
        started_ms: ready.map_or(0, |r| r.started_ms()),
        uptime_ms: ready.map_or(0, |r| r.uptime().as_millis() as u64),
        listen: ready
            .map(|r| r.grpc_addrs().iter().map(|a| a.to_string()).collect())
            .unwrap_or_default(),
        http_listen: ready
            .and_then(|r| r.http_addr())
            .map(|a| a.to_string())
            .unwrap_or_default(),
        data_dir: c.data_dir.display().to_string(),
        journal_disk_bytes: j.disk_bytes,
        journal_live_bytes: j.live_bytes,
        journal_segments: j.segments as u32,
        journal_poisoned: j.poisoned,
        stored_bytes: b.stored_used(),
        storage_quota_bytes: c.storage_quota_bytes,
        queues: queues.len() as u32,
        // Their subqueues' too (`Q;poison` piling up was in no total, helper-70).
        messages: queues.iter().map(|q| q.stats().messages).sum::<u64>()
            + b.queues_where(|q| q.def().role == crate::queue::QueueRole::Subqueue)
                .iter()
                .map(|q| q.stats().messages)
                .sum::<u64>(),
        limits,
        ready: ready.is_some_and(|r| r.check().is_ok()),
    }
}

/// What an anonymous caller learns when mqd has a users file: only what a client checks at
/// connect (name, versions, ready); not the data directory, addresses, limits or counts, and
/// without walking the queues.
pub(crate) fn public_broker_info(b: &Broker, ready: Option<&Readiness>) -> v1::BrokerInfo {
    v1::BrokerInfo {
        name: b.config().name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: mq_proto::PROTOCOL_VERSION,
        ready: ready.is_some_and(|r| r.check().is_ok()),
        ..Default::default()
    }
}
