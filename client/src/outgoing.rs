//! Outgoing queues (store-and-forward): [`OutgoingQueue`] and [`OutgoingState`].
//!
//! A send to a queue on another broker lands in the local broker's outgoing queue for that
//! destination broker; a forwarder moves the messages on and removes them once the destination
//! has stored them. See [`Client::outgoing`](crate::Client::outgoing),
//! [`Client::pause_outgoing`](crate::Client::pause_outgoing) and
//! [`Client::resume_outgoing`](crate::Client::resume_outgoing).

use std::time::SystemTime;

use mq_proto::v1;
use serde::ser::SerializeStruct;

use crate::message::{deadline, unix_ms};

/// The state of an outgoing queue. `Display` gives the operator's name: `INACTIVE`,
/// `CONNECTING`, `CONNECTED`, `WAITING`, `ONHOLD` (or `UNKNOWN(<n>)` for a code this client does
/// not know).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutgoingState {
    /// Nothing to send; not connected.
    Inactive,
    /// Connecting to the destination broker.
    Connecting,
    /// Connected; forwarding messages as they come.
    Connected,
    /// The last attempt failed; retrying with back-off at [`OutgoingQueue::next_retry`].
    Waiting,
    /// Paused by an operator: messages wait until it is resumed.
    OnHold,
    /// A wire code this client does not know (including 0, unspecified).
    Unknown(i32),
}

impl OutgoingState {
    /// The state for a wire code (`mq.v1.OutgoingState`).
    pub fn from_i32(code: i32) -> Self {
        use v1::OutgoingState as W;
        match W::try_from(code) {
            Ok(W::Inactive) => OutgoingState::Inactive,
            Ok(W::Connecting) => OutgoingState::Connecting,
            Ok(W::Connected) => OutgoingState::Connected,
            Ok(W::Waiting) => OutgoingState::Waiting,
            Ok(W::Onhold) => OutgoingState::OnHold,
            Ok(W::Unspecified) | Err(_) => OutgoingState::Unknown(code),
        }
    }

    /// The wire code.
    pub fn as_i32(self) -> i32 {
        use v1::OutgoingState as W;
        match self {
            OutgoingState::Inactive => W::Inactive as i32,
            OutgoingState::Connecting => W::Connecting as i32,
            OutgoingState::Connected => W::Connected as i32,
            OutgoingState::Waiting => W::Waiting as i32,
            OutgoingState::OnHold => W::Onhold as i32,
            OutgoingState::Unknown(n) => n,
        }
    }
}

impl From<i32> for OutgoingState {
    fn from(code: i32) -> Self {
        OutgoingState::from_i32(code)
    }
}

impl std::fmt::Display for OutgoingState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            OutgoingState::Inactive => "INACTIVE",
            OutgoingState::Connecting => "CONNECTING",
            OutgoingState::Connected => "CONNECTED",
            OutgoingState::Waiting => "WAITING",
            OutgoingState::OnHold => "ONHOLD",
            OutgoingState::Unknown(n) => return write!(f, "UNKNOWN({n})"),
        };
        f.write_str(name)
    }
}

/// Serialized as its `Display` name (`"CONNECTED"`).
impl serde::Serialize for OutgoingState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One outgoing queue: the messages waiting on this broker for one destination broker.
///
/// Serializes (e.g. for `mq outgoing list --json`) as
/// `{"destination", "state", "messages", "bytes", "in_flight", "forwarded", "dead_lettered",
/// "next_retry_ms", "last_error"}`, with `state` as its name (`"WAITING"`), `next_retry_ms` in
/// Unix milliseconds, and `null` for an absent `next_retry_ms` or `last_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingQueue {
    /// The destination broker, `host:port`.
    pub destination: String,
    pub state: OutgoingState,
    /// Messages waiting or in flight.
    pub messages: u64,
    /// Body bytes of those messages.
    pub bytes: u64,
    /// Sent, not yet acknowledged by the destination.
    pub in_flight: u64,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When the next connection attempt is due (state [`OutgoingState::Waiting`]).
    pub next_retry: Option<SystemTime>,
    /// Acknowledged by the destination (kept across restarts of the broker).
    pub forwarded: u64,
    /// Moved to a dead-letter queue (kept across restarts of the broker).
    pub dead_lettered: u64,
}

impl From<v1::OutgoingQueueInfo> for OutgoingQueue {
    fn from(q: v1::OutgoingQueueInfo) -> Self {
        OutgoingQueue {
            destination: q.destination,
            state: OutgoingState::from_i32(q.state),
            messages: q.messages,
            bytes: q.bytes,
            in_flight: q.in_flight,
            last_error: (!q.last_error.is_empty()).then_some(q.last_error),
            next_retry: deadline(q.next_retry_ms),
            forwarded: q.forwarded,
            dead_lettered: q.dead_lettered,
        }
    }
}

impl serde::Serialize for OutgoingQueue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut o = s.serialize_struct("OutgoingQueue", 9)?;
        o.serialize_field("destination", &self.destination)?;
        o.serialize_field("state", &self.state)?;
        o.serialize_field("messages", &self.messages)?;
        o.serialize_field("bytes", &self.bytes)?;
        o.serialize_field("in_flight", &self.in_flight)?;
        o.serialize_field("forwarded", &self.forwarded)?;
        o.serialize_field("dead_lettered", &self.dead_lettered)?;
        o.serialize_field("next_retry_ms", &self.next_retry.map(unix_ms))?;
        o.serialize_field("last_error", &self.last_error)?;
        o.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn state_names_and_codes() {
        let all = [
            (1, OutgoingState::Inactive, "INACTIVE"),
            (2, OutgoingState::Connecting, "CONNECTING"),
            (3, OutgoingState::Connected, "CONNECTED"),
            (4, OutgoingState::Waiting, "WAITING"),
            (5, OutgoingState::OnHold, "ONHOLD"),
        ];
        for (code, state, name) in all {
            assert_eq!(OutgoingState::from_i32(code), state);
            assert_eq!(OutgoingState::from(code), state);
            assert_eq!(state.as_i32(), code);
            assert_eq!(state.to_string(), name);
        }
        assert_eq!(OutgoingState::from_i32(0), OutgoingState::Unknown(0));
        assert_eq!(OutgoingState::from_i32(17).to_string(), "UNKNOWN(17)");
        assert_eq!(OutgoingState::Unknown(17).as_i32(), 17);
    }

    #[test]
    fn from_wire_empty_error_and_zero_retry_are_none() {
        let q = OutgoingQueue::from(v1::OutgoingQueueInfo {
            destination: "10.0.0.5:1802".into(),
            state: v1::OutgoingState::Connected as i32,
            messages: 3,
            bytes: 30,
            in_flight: 2,
            forwarded: 7,
            dead_lettered: 1,
            ..v1::OutgoingQueueInfo::default()
        });
        assert_eq!(
            q,
            OutgoingQueue {
                destination: "10.0.0.5:1802".into(),
                state: OutgoingState::Connected,
                messages: 3,
                bytes: 30,
                in_flight: 2,
                last_error: None,
                next_retry: None,
                forwarded: 7,
                dead_lettered: 1,
            }
        );
    }

    #[test]
    fn from_wire_waiting() {
        let q = OutgoingQueue::from(v1::OutgoingQueueInfo {
            destination: "b:1801".into(),
            state: v1::OutgoingState::Waiting as i32,
            last_error: "connection refused".into(),
            next_retry_ms: 1_700_000_000_123,
            ..v1::OutgoingQueueInfo::default()
        });
        assert_eq!(q.state, OutgoingState::Waiting);
        assert_eq!(q.last_error.as_deref(), Some("connection refused"));
        assert_eq!(
            q.next_retry,
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123))
        );
    }

    #[test]
    fn json_shape() {
        let mut q = OutgoingQueue {
            destination: "b:1801".into(),
            state: OutgoingState::Waiting,
            messages: 2,
            bytes: 10,
            in_flight: 0,
            last_error: Some("connection refused".into()),
            next_retry: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            forwarded: 5,
            dead_lettered: 1,
        };
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"destination":"b:1801","state":"WAITING","messages":2,"bytes":10,"in_flight":0,"forwarded":5,"dead_lettered":1,"next_retry_ms":1700000000123,"last_error":"connection refused"}"#
        );
        q.state = OutgoingState::OnHold;
        q.last_error = None;
        q.next_retry = None;
        let v = serde_json::to_value(&q).unwrap();
        assert_eq!(v["state"], "ONHOLD");
        assert!(v["next_retry_ms"].is_null());
        assert!(v["last_error"].is_null());
    }
}
