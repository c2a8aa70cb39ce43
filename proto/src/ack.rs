//! MSMQ acknowledgements: the request bits a sender sets (`PROPID_M_ACKNOWLEDGE`), the class
//! codes an acknowledgement carries (`PROPID_M_CLASS`, `MQMSGCLASS` of MS-MQAC 2.2.2.9), their
//! names, and which request bits ask for which class.
//!
//! ```
//! use mq_proto::ack::{self, class};
//! let full = ack::parse_type("full-receive").unwrap();
//! assert_eq!(full, 14);
//! assert!(ack::wants(full, class::ACK_RECEIVE) && ack::wants(full, class::NACK_Q_PURGED));
//! assert!(!ack::wants(full, class::ACK_REACH_QUEUE));
//! assert_eq!(ack::class_name(0xC002), Some("NACK_RECEIVE_TIMEOUT"));
//! ```

/// Post a positive acknowledgement when the message reaches its destination queue.
pub const POS_ARRIVAL: u8 = 0x01;
/// Post a positive acknowledgement when the message is received (a committed receive).
pub const POS_RECEIVE: u8 = 0x02;
/// Post a negative acknowledgement when the message cannot reach its destination queue.
pub const NEG_ARRIVAL: u8 = 0x04;
/// Post a negative acknowledgement when the message is not received (timeout, purge, delete).
pub const NEG_RECEIVE: u8 = 0x08;
/// Every bit a sender may set.
pub const ALL: u8 = POS_ARRIVAL | POS_RECEIVE | NEG_ARRIVAL | NEG_RECEIVE;

/// `MQMSG_CLASS_*` codes (PROPID_M_CLASS).
pub mod class {
    /// A message an application sent.
    pub const NORMAL: u16 = 0x0000;
    /// The original message reached its destination queue.
    pub const ACK_REACH_QUEUE: u16 = 0x0002;
    /// The original message was received.
    pub const ACK_RECEIVE: u16 = 0x4000;
    /// The destination queue does not exist (or was not available to the sender).
    pub const NACK_BAD_DST_Q: u16 = 0x8000;
    /// Purged before it reached its destination queue (an outgoing queue was purged).
    pub const NACK_PURGED: u16 = 0x8001;
    /// Its time-to-reach-queue (or time-to-be-received) passed before it reached the queue.
    pub const NACK_REACH_QUEUE_TIMEOUT: u16 = 0x8002;
    /// The destination queue (or broker) was over quota.
    pub const NACK_Q_EXCEED_QUOTA: u16 = 0x8003;
    /// The destination refused the sender (ACL).
    pub const NACK_ACCESS_DENIED: u16 = 0x8004;
    /// Its hop count was exceeded (MSMQ routing; mq does not post it).
    pub const NACK_HOP_COUNT_EXCEEDED: u16 = 0x8005;
    /// A transactional message was sent to a non-transactional queue.
    pub const NACK_NOT_TRANSACTIONAL_Q: u16 = 0x8009;
    /// A non-transactional message was sent to a transactional queue.
    pub const NACK_NOT_TRANSACTIONAL_MSG: u16 = 0x800A;
    /// Its queue was deleted before it was received.
    pub const NACK_Q_DELETED: u16 = 0xC000;
    /// Its queue was purged before it was received.
    pub const NACK_Q_PURGED: u16 = 0xC001;
    /// Its time-to-be-received passed in its destination queue before it was received.
    pub const NACK_RECEIVE_TIMEOUT: u16 = 0xC002;
}

/// Every class an acknowledgement can carry, with its MSMQ name (without `MQMSG_CLASS_`).
pub const CLASSES: &[(u16, &str)] = &[
    (class::NORMAL, "NORMAL"),
    (class::ACK_REACH_QUEUE, "ACK_REACH_QUEUE"),
    (class::ACK_RECEIVE, "ACK_RECEIVE"),
    (class::NACK_BAD_DST_Q, "NACK_BAD_DST_Q"),
    (class::NACK_PURGED, "NACK_PURGED"),
    (class::NACK_REACH_QUEUE_TIMEOUT, "NACK_REACH_QUEUE_TIMEOUT"),
    (class::NACK_Q_EXCEED_QUOTA, "NACK_Q_EXCEED_QUOTA"),
    (class::NACK_ACCESS_DENIED, "NACK_ACCESS_DENIED"),
    (class::NACK_HOP_COUNT_EXCEEDED, "NACK_HOP_COUNT_EXCEEDED"),
    (class::NACK_NOT_TRANSACTIONAL_Q, "NACK_NOT_TRANSACTIONAL_Q"),
    (
        class::NACK_NOT_TRANSACTIONAL_MSG,
        "NACK_NOT_TRANSACTIONAL_MSG",
    ),
    (class::NACK_Q_DELETED, "NACK_Q_DELETED"),
    (class::NACK_Q_PURGED, "NACK_Q_PURGED"),
    (class::NACK_RECEIVE_TIMEOUT, "NACK_RECEIVE_TIMEOUT"),
];

/// The MSMQ name of a class (`ACK_RECEIVE`, `NACK_Q_PURGED`, ...), if it is one mq knows.
pub fn class_name(code: u32) -> Option<&'static str> {
    CLASSES
        .iter()
        .find(|(c, _)| *c as u32 == code)
        .map(|(_, n)| *n)
}

/// Whether a message that asked for `acknowledge` gets an acknowledgement of `class`:
/// positive classes by their own bit, arrival NACKs (0x8000..) by [`NEG_ARRIVAL`], receive
/// NACKs (0xC000..) by [`NEG_RECEIVE`].
pub fn wants(acknowledge: u8, class: u16) -> bool {
    let bit = match class {
        class::ACK_REACH_QUEUE => POS_ARRIVAL,
        class::ACK_RECEIVE => POS_RECEIVE,
        c if c & 0xC000 == 0xC000 => NEG_RECEIVE,
        c if c & 0x8000 != 0 => NEG_ARRIVAL,
        _ => 0,
    };
    acknowledge & bit != 0
}

/// The acknowledgement types by name (MSMQ's `MQMSG_ACKNOWLEDGMENT_*` and .NET's
/// `AcknowledgeTypes`), as `mq send --ack` takes them.
pub const TYPES: &[(&str, u8)] = &[
    ("none", 0),
    ("full-reach-queue", POS_ARRIVAL | NEG_ARRIVAL),
    ("full-receive", POS_RECEIVE | NEG_RECEIVE | NEG_ARRIVAL),
    ("nack-reach-queue", NEG_ARRIVAL),
    ("nack-receive", NEG_RECEIVE | NEG_ARRIVAL),
    ("pos-arrival", POS_ARRIVAL),
    ("pos-receive", POS_RECEIVE),
    ("neg-arrival", NEG_ARRIVAL),
    ("neg-receive", NEG_RECEIVE),
];

/// Parses `full-reach-queue`, `full-receive`, `nack-reach-queue`, `nack-receive`, the single
/// bits `pos-arrival`, `pos-receive`, `neg-arrival`, `neg-receive`, `none`, or several of them
/// joined by `,` or `+` (or-ed), into the request bits.
pub fn parse_type(s: &str) -> Result<u8, String> {
    let mut bits = 0;
    for part in s.split([',', '+']) {
        let part = part.trim().to_ascii_lowercase().replace('_', "-");
        match TYPES.iter().find(|(n, _)| *n == part) {
            Some((_, b)) => bits |= b,
            None => {
                return Err(format!(
                    "unknown acknowledgement type {:?}; expected one of {}",
                    crate::limits::truncate(&part, 64),
                    TYPES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ))
            }
        }
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msmq_values() {
        // MQMSG_ACKNOWLEDGMENT_FULL_REACH_QUEUE = 5, FULL_RECEIVE = 14, NACK_REACH_QUEUE = 4,
        // NACK_RECEIVE = 12 (windows-sys MQMSGACKNOWLEDGEMENT).
        assert_eq!(parse_type("full-reach-queue"), Ok(5));
        assert_eq!(parse_type("full-receive"), Ok(14));
        assert_eq!(parse_type("nack-reach-queue"), Ok(4));
        assert_eq!(parse_type("nack-receive"), Ok(12));
        assert_eq!(parse_type("pos-arrival+pos-receive"), Ok(3));
        assert!(parse_type("full").is_err());
    }

    #[test]
    fn which_bits_ask_for_which_class() {
        for (class, bit) in [
            (class::ACK_REACH_QUEUE, POS_ARRIVAL),
            (class::ACK_RECEIVE, POS_RECEIVE),
            (class::NACK_BAD_DST_Q, NEG_ARRIVAL),
            (class::NACK_NOT_TRANSACTIONAL_MSG, NEG_ARRIVAL),
            (class::NACK_Q_DELETED, NEG_RECEIVE),
            (class::NACK_RECEIVE_TIMEOUT, NEG_RECEIVE),
        ] {
            assert!(wants(bit, class), "{class:#x}");
            assert!(!wants(ALL & !bit, class), "{class:#x}");
        }
        assert!(!wants(ALL, class::NORMAL));
        assert_eq!(class_name(0x8001), Some("NACK_PURGED"));
        assert_eq!(class_name(0x1234), None);
    }
}
