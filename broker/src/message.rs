//! A stored message: the header the broker keeps in memory and the body.

use bytes::Bytes;
use mq_proto::v1;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{
    BrokerConfig, MAX_CORRELATION_ID_CHARS, MAX_LABEL_CHARS, MESSAGE_OVERHEAD_BYTES,
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
}

impl StoredMessage {
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
        if m.body.len() > config.max_body_bytes {
            return Err(BrokerError::InvalidArgument(format!(
                "body is {} bytes; the broker's limit is {} bytes (mqd --max-body-bytes)",
                m.body.len(),
                config.max_body_bytes
            )));
        }
        let delivery = match v1::Delivery::try_from(m.delivery) {
            Ok(v1::Delivery::Express) => Delivery::Express,
            Ok(v1::Delivery::Recoverable) => Delivery::Recoverable,
            Err(_) => {
                return Err(BrokerError::InvalidArgument(format!(
                    "delivery {} is unknown; expected express (0) or recoverable (1)",
                    m.delivery
                )))
            }
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
            arrived_time_ms: now_ms(),
            response_queue: m.response_queue,
        })
    }

    /// Bytes charged against quotas for this message.
    pub fn charged_bytes(&self) -> u64 {
        self.body_len as u64 + self.label.len() as u64 + MESSAGE_OVERHEAD_BYTES
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
        let h = HeaderRecord {
            id: *self.id.as_bytes(),
            label: &self.label,
            priority: self.priority,
            correlation_id: &self.correlation_id,
            app_specific: self.app_specific,
            body_type: self.body_type,
            sent_time_ms: self.sent_time_ms,
            arrived_time_ms: self.arrived_time_ms,
            response_queue: &self.response_queue,
        };
        Bytes::from(postcard::to_allocvec(&h).expect("encoding a header into a Vec cannot fail"))
    }

    /// A recoverable message from its journal header; the body stays on disk.
    pub fn decode_header(bytes: &[u8], body_len: u32) -> Result<StoredMessage, postcard::Error> {
        let h: HeaderRecord<'_> = postcard::from_bytes(bytes)?;
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
            ..Default::default()
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
