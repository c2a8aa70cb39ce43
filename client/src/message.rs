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
    time_to_reach_queue_ms: u64,
    time_to_be_received_ms: u64,
    admin_queue: String,
    acknowledge: u8,
    journal: bool,
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
    /// Time-to-reach-queue (MSMQ's `TimeToReachQueue`): the message must be in its destination
    /// queue within `d` of the send. A message still in an outgoing queue (store-and-forward, on
    /// its way to another broker) when this passes goes to the dead-letter queue with class
    /// [`DeadLetterClass::ReachQueueTimeout`]. Default: no limit.
    ///
    /// Sent in whole milliseconds, rounded up: anything under 1 ms (including zero) becomes
    /// 1 ms, since 0 on the wire means "no limit".
    pub fn time_to_reach_queue(mut self, d: Duration) -> Self {
        self.time_to_reach_queue_ms = limit_ms(d);
        self
    }
    /// Time-to-be-received (MSMQ's `TimeToBeReceived`): the message must be received within `d`
    /// of the send, wherever it is by then; otherwise it goes to the dead-letter queue with class
    /// [`DeadLetterClass::ReceiveTimeout`]. Default: no limit.
    ///
    /// Sent in whole milliseconds, rounded up: anything under 1 ms (including zero) becomes
    /// 1 ms, since 0 on the wire means "no limit".
    pub fn time_to_be_received(mut self, d: Duration) -> Self {
        self.time_to_be_received_ms = limit_ms(d);
        self
    }
    /// The administration queue (path or format name, possibly on another broker) where the
    /// broker posts this message's acknowledgements (MSMQ's `AdministrationQueue`). Without
    /// [`Message::acknowledge`] nothing is posted.
    pub fn admin_queue(mut self, q: impl Into<String>) -> Self {
        self.admin_queue = q.into();
        self
    }
    /// Which acknowledgements to post to the admin queue (MSMQ's `AcknowledgeType`): bits of
    /// [`crate::ack`] or-ed, e.g. `ack::POS_ARRIVAL | ack::NEG_ARRIVAL` (full reach-queue), or
    /// `ack::parse_type("full-receive")`. Each ack is a message whose `class` says what
    /// happened ([`crate::ack::class`]) and whose correlation id is this message's id.
    pub fn acknowledge(mut self, bits: u8) -> Self {
        self.acknowledge = bits;
        self
    }
    /// Source journaling (MSMQ's `UseJournalQueue`, `MQMSG_JOURNAL`): once the message reaches
    /// its next hop (stored in a queue of the broker it was sent to, or acknowledged by the
    /// broker it is forwarded to), that broker keeps a copy in its `SYSTEM$;JOURNAL`.
    pub fn journal(mut self, yes: bool) -> Self {
        self.journal = yes;
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
            time_to_reach_queue_ms: self.time_to_reach_queue_ms,
            time_to_be_received_ms: self.time_to_be_received_ms,
            // Set by the broker.
            sender: String::new(),
            admin_queue: self.admin_queue,
            acknowledge: self.acknowledge as u32,
            journal: self.journal,
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
    /// Sent in a transaction.
    pub transactional: bool,
    /// The time-to-reach-queue deadline set by the sender, if any.
    pub reach_queue_by: Option<SystemTime>,
    /// The time-to-be-received deadline set by the sender, if any.
    pub receive_by: Option<SystemTime>,
    /// Set for messages read from a dead-letter queue: why the message is there and where it
    /// was going.
    pub dead_letter: Option<DeadLetterInfo>,
    /// The identity that sent it into the first broker (`anonymous` without credentials),
    /// kept across forwarding; empty if the broker did not record one.
    pub sender: String,
    /// Times it was moved between a queue and its subqueues (MSMQ's move count).
    pub move_count: u32,
    /// MSMQ's message class: 0 for a normal message; an acknowledgement's
    /// [`crate::ack::class`] code (name: [`crate::ack::class_name`]).
    pub class: u16,
    /// The admin queue its acknowledgements go to (empty: none).
    pub admin_queue: String,
    /// The acknowledgements it asked for ([`crate::ack`] bits).
    pub acknowledge: u8,
}

/// Why a message is in a dead-letter queue, and where it was going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInfo {
    /// The reason, as a class.
    pub class: DeadLetterClass,
    /// The reason, one line for people.
    pub reason: String,
    /// The format name the message was sent to.
    pub destination: String,
    /// The broker that dead-lettered it.
    pub broker: String,
    /// When it was dead-lettered.
    pub time: SystemTime,
}

impl DeadLetterInfo {
    pub(crate) fn from_wire(d: v1::DeadLetter) -> Self {
        DeadLetterInfo {
            class: DeadLetterClass::from_i32(d.dead_letter_class),
            reason: d.reason,
            destination: d.destination,
            broker: d.broker,
            time: from_unix_ms(d.time_ms),
        }
    }
}

/// Why a message was dead-lettered: MSMQ's negative acknowledgment classes. `Display` gives the
/// MSMQ-style name (`ReachQueueTimeout`), or `Unknown(<n>)` for a code this client does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterClass {
    /// No such queue on the destination broker.
    BadDestinationQueue,
    /// A transactional message for a non-transactional queue.
    NotTransactionalQueue,
    /// A non-transactional message for a transactional queue.
    NotTransactionalMessage,
    /// The destination queue or broker is over its quota.
    QueueExceedQuota,
    /// The time-to-reach-queue passed before the message reached its queue.
    ReachQueueTimeout,
    /// The time-to-be-received passed before the message was received.
    ReceiveTimeout,
    /// The destination refused the message itself.
    BadMessage,
    /// The destination queue's ACL does not let the forwarding broker send to it (MSMQ's
    /// `MQMSG_CLASS_NACK_ACCESS_DENIED`).
    AccessDenied,
    /// A wire code this client does not know (including 0, unspecified).
    Unknown(i32),
}

impl DeadLetterClass {
    /// The class for a wire code (`mq.v1.DeadLetterClass`).
    pub fn from_i32(code: i32) -> Self {
        use v1::DeadLetterClass as W;
        match W::try_from(code) {
            Ok(W::BadDestinationQueue) => DeadLetterClass::BadDestinationQueue,
            Ok(W::NotTransactionalQueue) => DeadLetterClass::NotTransactionalQueue,
            Ok(W::NotTransactionalMessage) => DeadLetterClass::NotTransactionalMessage,
            Ok(W::QueueExceedQuota) => DeadLetterClass::QueueExceedQuota,
            Ok(W::ReachQueueTimeout) => DeadLetterClass::ReachQueueTimeout,
            Ok(W::ReceiveTimeout) => DeadLetterClass::ReceiveTimeout,
            Ok(W::BadMessage) => DeadLetterClass::BadMessage,
            Ok(W::AccessDenied) => DeadLetterClass::AccessDenied,
            Ok(W::Unspecified) | Err(_) => DeadLetterClass::Unknown(code),
        }
    }

    /// The wire code.
    pub fn as_i32(self) -> i32 {
        use v1::DeadLetterClass as W;
        match self {
            DeadLetterClass::BadDestinationQueue => W::BadDestinationQueue as i32,
            DeadLetterClass::NotTransactionalQueue => W::NotTransactionalQueue as i32,
            DeadLetterClass::NotTransactionalMessage => W::NotTransactionalMessage as i32,
            DeadLetterClass::QueueExceedQuota => W::QueueExceedQuota as i32,
            DeadLetterClass::ReachQueueTimeout => W::ReachQueueTimeout as i32,
            DeadLetterClass::ReceiveTimeout => W::ReceiveTimeout as i32,
            DeadLetterClass::BadMessage => W::BadMessage as i32,
            DeadLetterClass::AccessDenied => W::AccessDenied as i32,
            DeadLetterClass::Unknown(n) => n,
        }
    }
}

impl From<i32> for DeadLetterClass {
    fn from(code: i32) -> Self {
        DeadLetterClass::from_i32(code)
    }
}

impl std::fmt::Display for DeadLetterClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            DeadLetterClass::BadDestinationQueue => "BadDestinationQueue",
            DeadLetterClass::NotTransactionalQueue => "NotTransactionalQueue",
            DeadLetterClass::NotTransactionalMessage => "NotTransactionalMessage",
            DeadLetterClass::QueueExceedQuota => "QueueExceedQuota",
            DeadLetterClass::ReachQueueTimeout => "ReachQueueTimeout",
            DeadLetterClass::ReceiveTimeout => "ReceiveTimeout",
            DeadLetterClass::BadMessage => "BadMessage",
            DeadLetterClass::AccessDenied => "AccessDenied",
            DeadLetterClass::Unknown(n) => return write!(f, "Unknown({n})"),
        };
        f.write_str(name)
    }
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
            sent_time: from_unix_ms(m.sent_time_ms),
            arrived_time: from_unix_ms(m.arrived_time_ms),
            response_queue: m.response_queue,
            destination: m.destination,
            abort_count: m.abort_count,
            transactional: m.transactional,
            reach_queue_by: deadline(m.reach_queue_by_ms),
            receive_by: deadline(m.receive_by_ms),
            dead_letter: m.dead_letter.map(DeadLetterInfo::from_wire),
            sender: m.sender,
            move_count: m.move_count,
            class: m.message_class as u16,
            admin_queue: m.admin_queue,
            acknowledge: m.acknowledge as u8,
        })
    }
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix milliseconds to a time, saturating far in the future rather than overflowing.
pub(crate) fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(UNIX_EPOCH + Duration::from_secs(i32::MAX as u64))
}

/// A wire deadline in Unix milliseconds: 0 = none.
pub(crate) fn deadline(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| from_unix_ms(ms))
}

/// A time limit in whole milliseconds for the wire, rounded up, at least 1 (0 = no limit).
fn limit_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(m: Message) -> v1::OutMessage {
        m.into_wire()
    }

    #[test]
    fn limits_default_to_none() {
        let w = wire(Message::new("x"));
        assert_eq!(w.time_to_reach_queue_ms, 0);
        assert_eq!(w.time_to_be_received_ms, 0);
    }

    #[test]
    fn limits_are_whole_milliseconds() {
        let w = wire(
            Message::new("x")
                .time_to_reach_queue(Duration::from_secs(5))
                .time_to_be_received(Duration::from_millis(1500)),
        );
        assert_eq!(w.time_to_reach_queue_ms, 5000);
        assert_eq!(w.time_to_be_received_ms, 1500);
    }

    #[test]
    fn limits_round_up_and_never_become_zero() {
        let w = wire(
            Message::new("x")
                .time_to_reach_queue(Duration::from_nanos(1))
                .time_to_be_received(Duration::ZERO),
        );
        assert_eq!(w.time_to_reach_queue_ms, 1);
        assert_eq!(w.time_to_be_received_ms, 1);
        let w = wire(Message::new("x").time_to_reach_queue(Duration::from_micros(999)));
        assert_eq!(w.time_to_reach_queue_ms, 1);
        let w = wire(Message::new("x").time_to_reach_queue(Duration::from_micros(1001)));
        assert_eq!(w.time_to_reach_queue_ms, 2);
        let w = wire(Message::new("x").time_to_be_received(Duration::MAX));
        assert_eq!(w.time_to_be_received_ms, u64::MAX);
    }

    #[test]
    fn other_fields_survive_alongside_limits() {
        let w = wire(
            Message::new("body")
                .label("l")
                .priority(6)
                .recoverable(true)
                .time_to_reach_queue(Duration::from_millis(250)),
        );
        assert_eq!(w.body.as_ref(), b"body");
        assert_eq!(w.label, "l");
        assert_eq!(w.priority, Some(6));
        assert_eq!(w.delivery, v1::Delivery::Recoverable as i32);
        assert_eq!(w.time_to_reach_queue_ms, 250);
        assert_eq!(w.time_to_be_received_ms, 0);
    }

    fn wire_message() -> v1::Message {
        v1::Message {
            id: uuid::Uuid::now_v7().as_bytes().to_vec().into(),
            body: Bytes::from_static(b"hi"),
            sent_time_ms: 1_700_000_000_000,
            arrived_time_ms: 1_700_000_000_005,
            destination: r"DIRECT=OS:.\private$\q".into(),
            ..v1::Message::default()
        }
    }

    #[test]
    fn zero_deadlines_and_no_dead_letter_are_none() {
        let m = ReceivedMessage::from_wire(wire_message()).unwrap();
        assert_eq!(m.reach_queue_by, None);
        assert_eq!(m.receive_by, None);
        assert_eq!(m.dead_letter, None);
        assert!(!m.transactional);
        assert_eq!(
            m.sent_time,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
        );
    }

    #[test]
    fn deadlines_transactional_and_dead_letter_convert() {
        let mut w = wire_message();
        w.reach_queue_by_ms = 1_700_000_001_000;
        w.receive_by_ms = 1_700_000_002_000;
        w.transactional = true;
        w.dead_letter = Some(v1::DeadLetter {
            dead_letter_class: v1::DeadLetterClass::ReachQueueTimeout as i32,
            reason: "not delivered within 1s".into(),
            destination: r"DIRECT=TCP:10.0.0.5:1802\private$\orders".into(),
            time_ms: 1_700_000_001_001,
            broker: "alpha".into(),
        });
        let m = ReceivedMessage::from_wire(w).unwrap();
        assert!(m.transactional);
        assert_eq!(
            m.reach_queue_by,
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_001_000))
        );
        assert_eq!(
            m.receive_by,
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_002_000))
        );
        assert_eq!(
            m.dead_letter,
            Some(DeadLetterInfo {
                class: DeadLetterClass::ReachQueueTimeout,
                reason: "not delivered within 1s".into(),
                destination: r"DIRECT=TCP:10.0.0.5:1802\private$\orders".into(),
                broker: "alpha".into(),
                time: UNIX_EPOCH + Duration::from_millis(1_700_000_001_001),
            })
        );
    }

    #[test]
    fn unknown_dead_letter_class_is_kept() {
        let mut w = wire_message();
        w.dead_letter = Some(v1::DeadLetter {
            dead_letter_class: 42,
            ..v1::DeadLetter::default()
        });
        let d = ReceivedMessage::from_wire(w).unwrap().dead_letter.unwrap();
        assert_eq!(d.class, DeadLetterClass::Unknown(42));
        assert_eq!(d.time, UNIX_EPOCH);
    }

    #[test]
    fn dead_letter_class_names_and_codes() {
        let all = [
            (
                1,
                DeadLetterClass::BadDestinationQueue,
                "BadDestinationQueue",
            ),
            (
                2,
                DeadLetterClass::NotTransactionalQueue,
                "NotTransactionalQueue",
            ),
            (
                3,
                DeadLetterClass::NotTransactionalMessage,
                "NotTransactionalMessage",
            ),
            (4, DeadLetterClass::QueueExceedQuota, "QueueExceedQuota"),
            (5, DeadLetterClass::ReachQueueTimeout, "ReachQueueTimeout"),
            (6, DeadLetterClass::ReceiveTimeout, "ReceiveTimeout"),
            (7, DeadLetterClass::BadMessage, "BadMessage"),
            (8, DeadLetterClass::AccessDenied, "AccessDenied"),
        ];
        for (code, class, name) in all {
            assert_eq!(DeadLetterClass::from_i32(code), class);
            assert_eq!(DeadLetterClass::from(code), class);
            assert_eq!(class.as_i32(), code);
            assert_eq!(class.to_string(), name);
        }
        assert_eq!(DeadLetterClass::from_i32(0), DeadLetterClass::Unknown(0));
        assert_eq!(DeadLetterClass::from_i32(99).to_string(), "Unknown(99)");
        assert_eq!(DeadLetterClass::from_i32(-1).to_string(), "Unknown(-1)");
        assert_eq!(DeadLetterClass::Unknown(99).as_i32(), 99);
    }
}
