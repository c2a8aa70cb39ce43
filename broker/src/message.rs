//! A stored message: the header the broker keeps in memory and the body.

use std::sync::Arc;

use bytes::Bytes;
use mq_proto::v1;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{
    BrokerConfig, EXPRESS_OVERHEAD_BYTES, MAX_CORRELATION_ID_CHARS, MAX_LABEL_CHARS,
    MESSAGE_OVERHEAD_BYTES,
};
use crate::error::BrokerError;

/// Default priority when a sender gives none (MSMQ's default).
pub const DEFAULT_PRIORITY: u8 = 3;
/// Highest priority.
pub const MAX_PRIORITY: u8 = 7;

/// How a message is kept, and so what an acknowledged send promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// In memory: acknowledged once it is in the queue; gone if the broker stops.
    Express,
    /// In the journal: acknowledged once its record is on disk; survives `kill -9`.
    Recoverable,
}

/// A message as the broker stores it. Immutable once stored; shared by every queue that holds a
/// copy of a multiple-element send.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Broker-assigned UUID v7.
    pub id: uuid::Uuid,
    /// The body while it is in memory: always for express messages; for recoverable messages
    /// only until stored, after which it is read from the journal when delivered.
    pub body: Option<Bytes>,
    pub body_len: u32,
    pub label: String,
    pub priority: u8,
    pub correlation_id: String,
    pub app_specific: i64,
    pub body_type: u32,
    pub delivery: Delivery,
    pub sent_time_ms: u64,
    pub arrived_time_ms: u64,
    pub response_queue: String,
    /// Unix ms by which the message must be in its destination queue (0 = no limit). Only
    /// enforced on the way there: in outgoing queues and on arrival at the remote broker.
    pub reach_queue_by_ms: u64,
    /// Unix ms by which the message must be received (0 = no limit).
    pub receive_by_ms: u64,
    /// Sent in a transaction (decides DEADXACT over DEADLETTER, and what a remote queue accepts).
    pub transactional: bool,
    /// The format name the sender addressed when that was another broker's queue: in an
    /// outgoing queue, where it is going; in a local queue, how it was forwarded here. A dead
    /// letter names it as the original destination.
    pub route: Option<Arc<str>>,
    /// In a dead-letter queue: why it is there.
    pub dead_letter: Option<Arc<DeadLetterInfo>>,
    /// The identity that sent it into the first broker (MSMQ's SenderId), kept across hops.
    pub sender: Option<Arc<str>>,
    /// Times it was moved between a queue and its subqueues (MSMQ's PROPID_M_MOVE_COUNT).
    pub move_count: u32,
    /// Where its acknowledgements go (a format name as the sender wrote it), with `acknowledge`.
    pub admin_queue: Option<Arc<str>>,
    /// Which acknowledgements it asked for (`crate::acks` flags; 0 = none).
    pub acknowledge: u8,
    /// MSMQ's message class: 0 normal, else the acknowledgement class (`crate::acks`).
    pub class: u16,
    /// Source journaling (MSMQ's MQMSG_JOURNAL): a copy goes to this broker's
    /// `SYSTEM$;JOURNAL` once the message reaches its next hop (see `journal_queue.rs`).
    pub journal: bool,
}

/// What a dead letter's [`DeadLetterInfo`] costs in memory beside its texts (the struct and
/// its `Arc`), charged with the message ([`StoredMessage::charged_bytes`]): 1,000,000 tiny
/// recoverable dead letters were charged 128 MB and took 626 MiB.
pub const DEAD_LETTER_INFO_BYTES: u64 = 128;

/// Why a message is in a dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInfo {
    pub class: v1::DeadLetterClass,
    pub reason: String,
    /// The format name the message was sent to.
    pub destination: String,
    pub time_ms: u64,
    /// The broker that dead-lettered it.
    pub broker: String,
}

impl StoredMessage {
    /// A message with no body and every property empty or zero (nil id, express, priority 0):
    /// a queue's tombstones point at one, and tests build on it with `..StoredMessage::empty()`.
    pub(crate) fn empty() -> StoredMessage {
        StoredMessage {
            id: uuid::Uuid::nil(),
            body: None,
            body_len: 0,
            label: String::new(),
            priority: 0,
            correlation_id: String::new(),
            app_specific: 0,
            body_type: 0,
            delivery: Delivery::Express,
            sent_time_ms: 0,
            arrived_time_ms: 0,
            response_queue: String::new(),
            reach_queue_by_ms: 0,
            receive_by_ms: 0,
            transactional: false,
            route: None,
            dead_letter: None,
            sender: None,
            move_count: 0,
            admin_queue: None,
            acknowledge: 0,
            class: 0,
            journal: false,
        }
    }

    /// Checks a sender's message against the broker's rules and stamps id and arrival time.
    pub fn accept(
        m: v1::OutMessage,
        id: uuid::Uuid,
        config: &BrokerConfig,
    ) -> Result<Self, BrokerError> {
        let priority = match m.priority {
            None => DEFAULT_PRIORITY,
            Some(p) if p <= MAX_PRIORITY as u32 => p as u8,
            Some(p) => {
                return Err(BrokerError::InvalidArgument(format!(
                    "priority {p} is out of range; priorities are 0 (lowest) to 7 (highest)"
                )))
            }
        };
        let label_chars = m.label.chars().count();
        if label_chars > MAX_LABEL_CHARS {
            return Err(BrokerError::InvalidArgument(format!(
                "label is {label_chars} characters; the limit is {MAX_LABEL_CHARS}"
            )));
        }
        let corr_chars = m.correlation_id.chars().count();
        if corr_chars > MAX_CORRELATION_ID_CHARS {
            return Err(BrokerError::InvalidArgument(format!(
                "correlation id is {corr_chars} characters; the limit is {MAX_CORRELATION_ID_CHARS}"
            )));
        }
        if m.response_queue.len() > mq_proto::limits::MAX_RESPONSE_QUEUE_BYTES {
            return Err(BrokerError::InvalidArgument(format!(
                "response queue is {} bytes; the limit is {} bytes",
                m.response_queue.len(),
                mq_proto::limits::MAX_RESPONSE_QUEUE_BYTES
            )));
        }
        if m.body.len() > config.max_body_bytes {
            return Err(BrokerError::InvalidArgument(format!(
                "body is {} bytes; the broker's limit is {} bytes (mqd --max-body-bytes)",
                m.body.len(),
                config.max_body_bytes
            )));
        }
        let delivery = match v1::Delivery::try_from(m.delivery) {
            // Not set means express, the default (as MSMQ's).
            Ok(v1::Delivery::Unspecified | v1::Delivery::Express) => Delivery::Express,
            Ok(v1::Delivery::Recoverable) => Delivery::Recoverable,
            Err(_) => {
                return Err(BrokerError::InvalidArgument(format!(
                    "delivery {} is unknown; expected DELIVERY_EXPRESS (1, or 0 = not set) or DELIVERY_RECOVERABLE (2)",
                    m.delivery
                )))
            }
        };
        let (admin_queue, acknowledge) = crate::acks::check_request(&m.admin_queue, m.acknowledge)?;
        let arrived = now_ms();
        let deadline = |ms: u64| {
            if ms == 0 {
                0
            } else {
                arrived.saturating_add(ms)
            }
        };
        let receive_by_ms = deadline(m.time_to_be_received_ms);
        // Time-to-be-received covers the way there too (as MSMQ).
        let reach_queue_by_ms = match (deadline(m.time_to_reach_queue_ms), receive_by_ms) {
            (0, r) => r,
            (q, 0) => q,
            (q, r) => q.min(r),
        };
        Ok(StoredMessage {
            id,
            body_len: m.body.len() as u32,
            body: Some(m.body),
            label: m.label,
            priority,
            correlation_id: m.correlation_id,
            app_specific: m.app_specific,
            body_type: m.body_type,
            delivery,
            sent_time_ms: m.sent_time_ms,
            arrived_time_ms: arrived,
            response_queue: m.response_queue,
            reach_queue_by_ms,
            receive_by_ms,
            transactional: false,
            route: None,
            dead_letter: None,
            sender: (!m.sender.is_empty()).then(|| Arc::from(m.sender.as_str())),
            move_count: 0,
            admin_queue,
            acknowledge,
            class: 0,
            journal: m.journal,
        })
    }

    /// A message forwarded by another broker, as it arrives here: id, times and deadlines as
    /// the sending broker set them; arrival time now. Checked like a local send.
    pub fn accept_forwarded(
        m: v1::Message,
        transactional: bool,
        config: &BrokerConfig,
    ) -> Result<Self, BrokerError> {
        let id = uuid::Uuid::from_slice(&m.id).map_err(|_| {
            BrokerError::InvalidArgument(format!(
                "a forwarded message id must be 16 bytes, not {}",
                m.id.len()
            ))
        })?;
        // Not charged against a quota (an identity name): bounded instead.
        if m.sender.len() > mq_proto::limits::MAX_SENDER_BYTES {
            return Err(BrokerError::InvalidArgument(format!(
                "a forwarded message's sender is {} bytes; the limit is {} (an identity name)",
                m.sender.len(),
                mq_proto::limits::MAX_SENDER_BYTES
            )));
        }
        let out = v1::OutMessage {
            body: m.body,
            label: m.label,
            priority: Some(m.priority),
            correlation_id: m.correlation_id,
            app_specific: m.app_specific,
            body_type: m.body_type,
            delivery: m.delivery,
            sent_time_ms: m.sent_time_ms,
            response_queue: m.response_queue,
            time_to_reach_queue_ms: 0,
            time_to_be_received_ms: 0,
            sender: m.sender,
            admin_queue: m.admin_queue,
            acknowledge: m.acknowledge,
            // Source journaling is the sending broker's: not asked of this one.
            journal: false,
        };
        if transactional && (m.delivery != v1::Delivery::Recoverable as i32 || m.priority != 0) {
            // A broker sends transactional messages recoverable at priority 0 (as MSMQ); anything
            // else was not sent by one.
            return Err(BrokerError::InvalidArgument(format!(
                "a transactional message must be recoverable with priority 0; this one is {} with priority {}",
                if m.delivery == v1::Delivery::Recoverable as i32 { "recoverable" } else { "express" },
                m.priority
            )));
        }
        let mut sm = StoredMessage::accept(out, id, config)?;
        sm.reach_queue_by_ms = m.reach_queue_by_ms;
        sm.receive_by_ms = m.receive_by_ms;
        sm.transactional = transactional;
        sm.class = crate::acks::check_class(m.message_class)?;
        Ok(sm)
    }

    /// Whether the message can no longer be received at `now` (time-to-be-received passed).
    pub fn receive_expired(&self, now: u64) -> bool {
        self.receive_by_ms != 0 && now >= self.receive_by_ms
    }

    /// Whether the message can no longer reach its queue at `now` (time-to-reach-queue passed).
    pub fn reach_expired(&self, now: u64) -> bool {
        self.reach_queue_by_ms != 0 && now >= self.reach_queue_by_ms
    }

    /// Bytes charged against quotas for this message: everything the sender chose the size of
    /// and the broker keeps (body, label, correlation id, response queue, admin queue) plus a
    /// fixed overhead: [`EXPRESS_OVERHEAD_BYTES`] for an express message (what it costs in
    /// memory), [`MESSAGE_OVERHEAD_BYTES`] for a recoverable one; a dead letter's copy also its
    /// [`DeadLetterInfo`] (its texts and [`DEAD_LETTER_INFO_BYTES`]). The same for a message
    /// wherever it is charged and released, and after recovery (a message's delivery never
    /// changes; a dead letter's info is made once, with the copy the dead-letter queue keeps).
    pub fn charged_bytes(&self) -> u64 {
        let overhead = match self.delivery {
            Delivery::Express => EXPRESS_OVERHEAD_BYTES,
            Delivery::Recoverable => MESSAGE_OVERHEAD_BYTES,
        };
        self.body_len as u64
            + self.label.len() as u64
            + self.correlation_id.len() as u64
            + self.response_queue.len() as u64
            + self.admin_queue.as_deref().map_or(0, |a| a.len() as u64)
            + self.dead_letter.as_deref().map_or(0, |d| {
                (d.reason.len() + d.destination.len() + d.broker.len()) as u64
                    + DEAD_LETTER_INFO_BYTES
            })
            + overhead
    }

    /// What the message puts in a delivery beside its queue's name and its fixed-size fields:
    /// its body and every text it carries.
    pub fn delivered_bytes(&self) -> u64 {
        self.body_len as u64
            + (self.label.len() + self.correlation_id.len() + self.response_queue.len()) as u64
            + self.admin_queue.as_deref().map_or(0, |a| a.len() as u64)
            + self.sender.as_deref().map_or(0, |a| a.len() as u64)
            + self.dead_letter.as_deref().map_or(0, |d| {
                (d.reason.len() + d.destination.len() + d.broker.len()) as u64
            })
    }

    /// The same message without its body in memory (kept in the journal).
    pub fn without_body(&self) -> StoredMessage {
        StoredMessage {
            body: None,
            ..self.clone()
        }
    }

    /// The header as stored in the journal (everything but the body).
    pub fn encode_header(&self) -> Bytes {
        let h = HeaderRecordV2 {
            id: *self.id.as_bytes(),
            label: &self.label,
            priority: self.priority,
            correlation_id: &self.correlation_id,
            app_specific: self.app_specific,
            body_type: self.body_type,
            sent_time_ms: self.sent_time_ms,
            arrived_time_ms: self.arrived_time_ms,
            response_queue: &self.response_queue,
            reach_queue_by_ms: self.reach_queue_by_ms,
            receive_by_ms: self.receive_by_ms,
            transactional: self.transactional,
            route: self.route.as_deref(),
            dead_letter: self.dead_letter.as_deref().map(|d| DeadLetterRecord {
                class: d.class as i32,
                reason: &d.reason,
                destination: &d.destination,
                time_ms: d.time_ms,
                broker: &d.broker,
            }),
        };
        let mut v = postcard::to_allocvec(&h).expect("encoding a header into a Vec cannot fail");
        let ext = HeaderExt {
            move_count: self.move_count,
        };
        let flags = HeaderFlags {
            journal: self.journal,
        };
        let acks = AckExt {
            admin_queue: self.admin_queue.as_deref().unwrap_or_default(),
            acknowledge: self.acknowledge,
            class: self.class,
        };
        // Each version appends to the one before and is written only when it (or a later one)
        // says something; the earlier ones are then written even when they hold defaults.
        // Version 3: the sender follows version 2's fields (an empty sender means none).
        if self.sender.is_some() || !ext.is_empty() || !flags.is_empty() || !acks.is_empty() {
            let s = self.sender.as_deref().unwrap_or_default();
            v.extend(postcard::to_allocvec(s).expect("encoding into a Vec cannot fail"));
        }
        // Version 4: the extension follows the sender.
        if !ext.is_empty() || !flags.is_empty() || !acks.is_empty() {
            v.extend(postcard::to_allocvec(&ext).expect("encoding into a Vec cannot fail"));
        }
        // Version 5: the flags follow the extension.
        if !flags.is_empty() || !acks.is_empty() {
            v.extend(postcard::to_allocvec(&flags).expect("encoding into a Vec cannot fail"));
        }
        // Version 6: acknowledgements follow the flags.
        if !acks.is_empty() {
            v.extend(postcard::to_allocvec(&acks).expect("encoding into a Vec cannot fail"));
        }
        Bytes::from(v)
    }

    /// The journal op that stores this message (header and in-memory body) at `seq` of a queue.
    pub(crate) fn put_op(&self, queue_id: u64, seq: u64) -> crate::journal::Op {
        crate::journal::Op::Put {
            queue_id,
            seq,
            header: self.encode_header(),
            body: self.body.clone().unwrap_or_default(),
        }
    }

    /// A recoverable message from its journal header; the body stays on disk.
    pub fn decode_header(bytes: &[u8], body_len: u32) -> Result<StoredMessage, postcard::Error> {
        // Version 2 appends fields to version 1; a version-1 header ends early.
        let mut ext = HeaderExt::default();
        let mut flags = HeaderFlags::default();
        let mut acks: Option<(Option<Arc<str>>, u8, u16)> = None;
        let (h, v2, sender) = match postcard::take_from_bytes::<HeaderRecordV2<'_>>(bytes) {
            Ok((v2, rest)) => {
                // Version 3 appends the sender, version 4 the extension.
                let sender = if rest.is_empty() {
                    None
                } else {
                    let (s, rest) = postcard::take_from_bytes::<&str>(rest)?;
                    if !rest.is_empty() {
                        let (e, rest) = postcard::take_from_bytes::<HeaderExt>(rest)?;
                        ext = e;
                        if !rest.is_empty() {
                            let (f, rest) = postcard::take_from_bytes::<HeaderFlags>(rest)?;
                            flags = f;
                            if !rest.is_empty() {
                                let a = postcard::from_bytes::<AckExt<'_>>(rest)?;
                                let q =
                                    (!a.admin_queue.is_empty()).then(|| Arc::from(a.admin_queue));
                                acks = Some((q, a.acknowledge, a.class));
                            }
                        }
                    }
                    (!s.is_empty()).then(|| Arc::from(s))
                };
                (v2.v1(), Some(v2), sender)
            }
            Err(_) => (postcard::from_bytes::<HeaderRecord<'_>>(bytes)?, None, None),
        };
        Ok(StoredMessage {
            id: uuid::Uuid::from_bytes(h.id),
            body: None,
            body_len,
            label: h.label.to_string(),
            priority: h.priority.min(MAX_PRIORITY),
            correlation_id: h.correlation_id.to_string(),
            app_specific: h.app_specific,
            body_type: h.body_type,
            delivery: Delivery::Recoverable,
            sent_time_ms: h.sent_time_ms,
            arrived_time_ms: h.arrived_time_ms,
            response_queue: h.response_queue.to_string(),
            reach_queue_by_ms: v2.as_ref().map_or(0, |v| v.reach_queue_by_ms),
            receive_by_ms: v2.as_ref().map_or(0, |v| v.receive_by_ms),
            transactional: v2.as_ref().is_some_and(|v| v.transactional),
            route: v2.as_ref().and_then(|v| v.route).map(Arc::from),
            dead_letter: v2.as_ref().and_then(|v| v.dead_letter.as_ref()).map(|d| {
                Arc::new(DeadLetterInfo {
                    class: v1::DeadLetterClass::try_from(d.class)
                        .unwrap_or(v1::DeadLetterClass::Unspecified),
                    reason: d.reason.to_string(),
                    destination: d.destination.to_string(),
                    time_ms: d.time_ms,
                    broker: d.broker.to_string(),
                })
            }),
            sender,
            move_count: ext.move_count,
            journal: flags.journal,
            admin_queue: acks.as_ref().and_then(|a| a.0.clone()),
            acknowledge: acks.as_ref().map_or(0, |a| a.1),
            class: acks.as_ref().map_or(0, |a| a.2),
        })
    }

    /// The wire form, as a receiver sees it in `destination`, with `body`.
    pub fn to_wire(&self, destination: &str, body: Bytes, abort_count: u32) -> v1::Message {
        v1::Message {
            id: Bytes::copy_from_slice(self.id.as_bytes()),
            body,
            label: self.label.clone(),
            priority: self.priority as u32,
            correlation_id: self.correlation_id.clone(),
            app_specific: self.app_specific,
            body_type: self.body_type,
            delivery: match self.delivery {
                Delivery::Express => v1::Delivery::Express as i32,
                Delivery::Recoverable => v1::Delivery::Recoverable as i32,
            },
            sent_time_ms: self.sent_time_ms,
            arrived_time_ms: self.arrived_time_ms,
            response_queue: self.response_queue.clone(),
            destination: destination.to_string(),
            abort_count,
            reach_queue_by_ms: self.reach_queue_by_ms,
            receive_by_ms: self.receive_by_ms,
            transactional: self.transactional,
            dead_letter: self.dead_letter.as_deref().map(|d| v1::DeadLetter {
                dead_letter_class: d.class as i32,
                reason: d.reason.clone(),
                destination: d.destination.clone(),
                time_ms: d.time_ms,
                broker: d.broker.clone(),
            }),
            sender: self.sender.as_deref().unwrap_or_default().to_string(),
            move_count: self.move_count,
            admin_queue: self.admin_queue.as_deref().unwrap_or_default().to_string(),
            acknowledge: self.acknowledge as u32,
            message_class: self.class as u32,
        }
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A message header in the journal (postcard). Field order is the format: append only.
#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderRecord<'a> {
    id: [u8; 16],
    label: &'a str,
    priority: u8,
    correlation_id: &'a str,
    app_specific: i64,
    body_type: u32,
    sent_time_ms: u64,
    arrived_time_ms: u64,
    response_queue: &'a str,
}

/// Version 2 of the header: version 1's fields, then timers, transactional, route and the
/// dead-letter record. Field order is the format: append only.
#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderRecordV2<'a> {
    id: [u8; 16],
    label: &'a str,
    priority: u8,
    correlation_id: &'a str,
    app_specific: i64,
    body_type: u32,
    sent_time_ms: u64,
    arrived_time_ms: u64,
    response_queue: &'a str,
    reach_queue_by_ms: u64,
    receive_by_ms: u64,
    transactional: bool,
    route: Option<&'a str>,
    dead_letter: Option<DeadLetterRecord<'a>>,
}

/// Version 4 of the header: what follows the sender (written only when not all default).
/// Field order is the format: append only.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct HeaderExt {
    move_count: u32,
}

impl HeaderExt {
    fn is_empty(&self) -> bool {
        self.move_count == 0
    }
}

/// Version 5 of the header: flags after the extension (written only when one is set, or
/// version 6 follows). Field order is the format: append only.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct HeaderFlags {
    /// Source journaling was asked for.
    journal: bool,
}

impl HeaderFlags {
    fn is_empty(&self) -> bool {
        !self.journal
    }
}

/// Version 6 of the header: acknowledgements after the version-5 flags (written only when not
/// all default). Field order is the format: append only.
#[derive(serde::Serialize, serde::Deserialize)]
struct AckExt<'a> {
    admin_queue: &'a str,
    acknowledge: u8,
    class: u16,
}

impl AckExt<'_> {
    fn is_empty(&self) -> bool {
        self.admin_queue.is_empty() && self.acknowledge == 0 && self.class == 0
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct DeadLetterRecord<'a> {
    class: i32,
    reason: &'a str,
    destination: &'a str,
    time_ms: u64,
    broker: &'a str,
}

impl<'a> HeaderRecordV2<'a> {
    fn v1(&self) -> HeaderRecord<'a> {
        HeaderRecord {
            id: self.id,
            label: self.label,
            priority: self.priority,
            correlation_id: self.correlation_id,
            app_specific: self.app_specific,
            body_type: self.body_type,
            sent_time_ms: self.sent_time_ms,
            arrived_time_ms: self.arrived_time_ms,
            response_queue: self.response_queue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredMessage {
        let config = BrokerConfig::new("/nonexistent");
        let mut m = StoredMessage::accept(
            v1::OutMessage {
                body: Bytes::from_static(b"hello"),
                label: "l".into(),
                priority: Some(5),
                correlation_id: "c".into(),
                app_specific: -7,
                body_type: 3,
                delivery: v1::Delivery::Recoverable as i32,
                sent_time_ms: 11,
                response_queue: "r".into(),
                time_to_reach_queue_ms: 5_000,
                time_to_be_received_ms: 2_000,
                sender: "alice".into(),
                admin_queue: String::new(),
                acknowledge: 0,
                journal: false,
            },
            uuid::Uuid::now_v7(),
            &config,
        )
        .unwrap();
        m.transactional = true;
        m
    }

    #[test]
    fn ttbr_caps_ttrq() {
        let m = sample();
        assert_eq!(m.receive_by_ms, m.arrived_time_ms + 2_000);
        assert_eq!(m.reach_queue_by_ms, m.receive_by_ms);
        assert!(!m.receive_expired(m.arrived_time_ms));
        assert!(m.receive_expired(m.receive_by_ms));
    }

    #[test]
    fn header_v2_round_trip() {
        let mut m = sample();
        m.route = Some(Arc::from(r"DIRECT=TCP:127.0.0.1:5000\private$\q"));
        m.dead_letter = Some(Arc::new(DeadLetterInfo {
            class: v1::DeadLetterClass::ReachQueueTimeout,
            reason: "late".into(),
            destination: "d".into(),
            time_ms: 99,
            broker: "b".into(),
        }));
        let back = StoredMessage::decode_header(&m.encode_header(), m.body_len).unwrap();
        assert_eq!(back.id, m.id);
        assert_eq!(back.reach_queue_by_ms, m.reach_queue_by_ms);
        assert_eq!(back.receive_by_ms, m.receive_by_ms);
        assert!(back.transactional);
        assert_eq!(back.route, m.route);
        assert_eq!(back.dead_letter, m.dead_letter);
        assert_eq!(back.label, "l");
        assert_eq!(back.sender.as_deref(), Some("alice"));
        let anon = StoredMessage { sender: None, ..m };
        let back = StoredMessage::decode_header(&anon.encode_header(), anon.body_len).unwrap();
        assert!(back.sender.is_none() && back.dead_letter.is_some());
        // Version 4: the move count, with and without a sender.
        for sender in [None, Some(Arc::from("bob"))] {
            let moved = StoredMessage {
                sender: sender.clone(),
                move_count: 7,
                ..anon.clone()
            };
            let back =
                StoredMessage::decode_header(&moved.encode_header(), moved.body_len).unwrap();
            assert_eq!(back.move_count, 7);
            assert_eq!(back.sender, sender);
            assert_eq!(back.dead_letter, moved.dead_letter);
        }
        assert_eq!(
            StoredMessage::decode_header(&anon.encode_header(), 5)
                .unwrap()
                .move_count,
            0
        );
        // Version 6: acknowledgements, with and without a sender and a move count.
        for (sender, move_count) in [(None, 0), (Some(Arc::from("bob")), 3)] {
            let acked = StoredMessage {
                sender: sender.clone(),
                move_count,
                admin_queue: Some(Arc::from(r".\private$\admin")),
                acknowledge: 14,
                class: 0x8002,
                ..anon.clone()
            };
            let back =
                StoredMessage::decode_header(&acked.encode_header(), acked.body_len).unwrap();
            assert_eq!(back.admin_queue, acked.admin_queue);
            assert_eq!((back.acknowledge, back.class), (14, 0x8002));
            assert_eq!((back.sender, back.move_count), (sender, move_count));
            assert_eq!(back.dead_letter, acked.dead_letter);
        }
        let plain = StoredMessage::decode_header(&anon.encode_header(), 5).unwrap();
        assert!(plain.admin_queue.is_none() && plain.acknowledge == 0 && plain.class == 0);
    }

    /// Version 5: the source-journaling flag, with and without a sender and a move count.
    #[test]
    fn header_v5_keeps_the_journal_flag() {
        let m = sample();
        for (sender, move_count) in [(None, 0), (Some(Arc::from("bob")), 0), (None, 3)] {
            let j = StoredMessage {
                sender: sender.clone(),
                move_count,
                journal: true,
                ..m.clone()
            };
            let back = StoredMessage::decode_header(&j.encode_header(), j.body_len).unwrap();
            assert!(back.journal);
            assert_eq!((back.sender, back.move_count), (sender, move_count));
        }
        let back = StoredMessage::decode_header(&m.encode_header(), m.body_len).unwrap();
        assert!(!back.journal);
    }

    /// Headers of versions 4, 5 and 6 as each version's writer lays them out (version 2's
    /// fields, then the sender, the extension, the flags and the acknowledgements): a header
    /// written before acknowledgements existed (version 5: the journal flag) still reads, and
    /// version 6 reads with the flags before it.
    #[test]
    fn header_v4_v5_v6_decode() {
        let m = StoredMessage {
            move_count: 2,
            ..sample()
        };
        let v2 = HeaderRecordV2 {
            id: *m.id.as_bytes(),
            label: &m.label,
            priority: m.priority,
            correlation_id: &m.correlation_id,
            app_specific: m.app_specific,
            body_type: m.body_type,
            sent_time_ms: m.sent_time_ms,
            arrived_time_ms: m.arrived_time_ms,
            response_queue: &m.response_queue,
            reach_queue_by_ms: m.reach_queue_by_ms,
            receive_by_ms: m.receive_by_ms,
            transactional: m.transactional,
            route: None,
            dead_letter: None,
        };
        let mut v4 = postcard::to_allocvec(&v2).unwrap();
        v4.extend(postcard::to_allocvec("alice").unwrap());
        v4.extend(postcard::to_allocvec(&HeaderExt { move_count: 2 }).unwrap());
        let mut v5 = v4.clone();
        v5.extend(postcard::to_allocvec(&HeaderFlags { journal: true }).unwrap());
        let mut v6 = v5.clone();
        v6.extend(
            postcard::to_allocvec(&AckExt {
                admin_queue: r".\private$\admin",
                acknowledge: 5,
                class: 0,
            })
            .unwrap(),
        );

        let back = StoredMessage::decode_header(&v4, 5).unwrap();
        assert_eq!((back.id, back.move_count), (m.id, 2));
        assert_eq!(back.sender.as_deref(), Some("alice"));
        assert!(!back.journal && back.admin_queue.is_none());
        assert_eq!((back.acknowledge, back.class), (0, 0));

        let back = StoredMessage::decode_header(&v5, 5).unwrap();
        assert_eq!((back.id, back.move_count), (m.id, 2));
        assert_eq!(back.sender.as_deref(), Some("alice"));
        assert!(back.journal && back.admin_queue.is_none());
        assert_eq!((back.acknowledge, back.class), (0, 0));

        let back = StoredMessage::decode_header(&v6, 5).unwrap();
        assert_eq!((back.id, back.move_count), (m.id, 2));
        assert!(back.journal);
        assert_eq!(back.admin_queue.as_deref(), Some(r".\private$\admin"));
        assert_eq!((back.acknowledge, back.class), (5, 0));

        // The encoder writes exactly these layouts.
        let written = StoredMessage {
            journal: true,
            admin_queue: Some(Arc::from(r".\private$\admin")),
            acknowledge: 5,
            ..m.clone()
        };
        assert_eq!(&written.encode_header()[..], &v6[..]);
        let written = StoredMessage {
            journal: true,
            ..m.clone()
        };
        assert_eq!(&written.encode_header()[..], &v5[..]);
        assert_eq!(&m.encode_header()[..], &v4[..]);
        // An ack (class only, no flags) writes the default flags before its version-6 part.
        let ack = StoredMessage {
            class: 0x4000,
            ..m.clone()
        };
        let back = StoredMessage::decode_header(&ack.encode_header(), 5).unwrap();
        assert_eq!(back.class, 0x4000);
        assert!(!back.journal && back.admin_queue.is_none());
    }

    #[test]
    fn header_v1_still_decodes() {
        let m = sample();
        let v1 = HeaderRecord {
            id: *m.id.as_bytes(),
            label: &m.label,
            priority: m.priority,
            correlation_id: &m.correlation_id,
            app_specific: m.app_specific,
            body_type: m.body_type,
            sent_time_ms: m.sent_time_ms,
            arrived_time_ms: m.arrived_time_ms,
            response_queue: &m.response_queue,
        };
        let bytes = postcard::to_allocvec(&v1).unwrap();
        let back = StoredMessage::decode_header(&bytes, 5).unwrap();
        assert_eq!(back.id, m.id);
        assert_eq!(back.response_queue, "r");
        assert_eq!(back.receive_by_ms, 0);
        assert!(!back.transactional && back.route.is_none() && back.dead_letter.is_none());
    }
}
