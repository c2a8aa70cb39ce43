//! Messages: what a sender builds ([`Message`]) and what a receiver gets ([`ReceivedMessage`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mq_proto::v1;

use crate::error::{Error, Result};
use crate::formatter::{BodyType, Formatter};

/// A message's id: a UUID v7 assigned by the broker, unique and time-ordered.
pub type MessageId = uuid::Uuid;

/// How the broker keeps a message, and so what an acknowledged send promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// In memory: acknowledged once it is in the queue; gone if the broker stops.
    #[default]
    Express,
    /// On disk: acknowledged once its record is on disk; survives `kill -9` of the broker.
    Recoverable,
}

/// A message to send, built with chained setters.
///
/// ```
/// use mq_client::Message;
/// let m = Message::new("hello").label("greeting").priority(5).correlation_id("req-1").app_specific(42);
/// assert_eq!(m.body().as_ref(), b"hello");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Message {
    body: Bytes,
    label: String,
    priority: Option<u32>,
    correlation_id: String,
    app_specific: i64,
    body_type: u32,
    delivery: Delivery,
    response_queue: String,
}

impl Message {
    /// A message with this body (raw bytes) and defaults: priority 3, express.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Message {
            body: body.into(),
            ..Message::default()
        }
    }

    /// A message whose body is `value` encoded by `formatter`, tagged with its body type.
    pub fn encode<T, F: Formatter<T>>(value: &T, formatter: &F) -> Result<Self> {
        let body = formatter.encode(value)?;
        Ok(Message::new(body).body_type(formatter.body_type()))
    }

    /// Label, at most 250 characters.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }
    /// Priority 0 (lowest) to 7 (highest); default 3. The broker refuses anything above 7.
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority as u32);
        self
    }
    /// Correlation id, at most 255 characters (often the id of the request being answered).
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = id.into();
        self
    }
    /// An application-defined integer.
    pub fn app_specific(mut self, v: i64) -> Self {
        self.app_specific = v;
        self
    }
    /// The body's formatter tag (set by [`Message::encode`]).
    pub fn body_type(mut self, t: BodyType) -> Self {
        self.body_type = t as u32;
        self
    }
    /// Express (default) or recoverable.
    pub fn delivery(mut self, d: Delivery) -> Self {
        self.delivery = d;
        self
    }
    /// Shorthand for `delivery(Delivery::Recoverable)` (MSMQ's `Recoverable` property).
    pub fn recoverable(self, yes: bool) -> Self {
        self.delivery(if yes {
            Delivery::Recoverable
        } else {
            Delivery::Express
        })
    }
    /// The queue a receiver should answer to.
    pub fn response_queue(mut self, q: impl Into<String>) -> Self {
        self.response_queue = q.into();
        self
    }
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub(crate) fn into_wire(self) -> v1::OutMessage {
        v1::OutMessage {
            body: self.body,
            label: self.label,
            priority: self.priority,
            correlation_id: self.correlation_id,
            app_specific: self.app_specific,
            body_type: self.body_type,
            delivery: match self.delivery {
                Delivery::Express => v1::Delivery::Express as i32,
                Delivery::Recoverable => v1::Delivery::Recoverable as i32,
            },
            sent_time_ms: unix_ms(SystemTime::now()),
            response_queue: self.response_queue,
            time_to_reach_queue_ms: 0,
            time_to_be_received_ms: 0,
        }
    }
}

/// A message as received or peeked.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedMessage {
    pub id: MessageId,
    pub body: Bytes,
    pub label: String,
    pub priority: u8,
    pub correlation_id: String,
    pub app_specific: i64,
    pub body_type: u32,
    pub delivery: Delivery,
    pub sent_time: SystemTime,
    pub arrived_time: SystemTime,
    pub response_queue: String,
    /// The format name of the queue it came from.
    pub destination: String,
    /// Times a transaction that received this message was aborted.
    pub abort_count: u32,
}

impl ReceivedMessage {
    /// Decodes the body with `formatter`, checking the body-type tag.
    pub fn decode<T, F: Formatter<T>>(&self, formatter: &F) -> Result<T> {
        let found = BodyType::from_u32(self.body_type).ok_or(
            crate::formatter::FormatError::UnknownBodyType(self.body_type),
        )?;
        Ok(formatter.decode_tagged(&self.body, found)?)
    }

    pub(crate) fn from_wire(m: v1::Message) -> Result<Self> {
        let id = uuid::Uuid::from_slice(&m.id).map_err(|_| {
            Error::Internal(format!(
                "the broker sent a message id of {} bytes; expected 16",
                m.id.len()
            ))
        })?;
        Ok(ReceivedMessage {
            id,
            body: m.body,
            label: m.label,
            priority: m.priority.min(7) as u8,
            correlation_id: m.correlation_id,
            app_specific: m.app_specific,
            body_type: m.body_type,
            delivery: if m.delivery == v1::Delivery::Recoverable as i32 {
                Delivery::Recoverable
            } else {
                Delivery::Express
            },
            sent_time: UNIX_EPOCH + Duration::from_millis(m.sent_time_ms),
            arrived_time: UNIX_EPOCH + Duration::from_millis(m.arrived_time_ms),
            response_queue: m.response_queue,
            destination: m.destination,
            abort_count: m.abort_count,
        })
    }
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
