//! Transaction ids of single-message transactional sends on a pipelined send stream: one id per
//! message, derived from the stream's id and the message's sequence number, so neither the wire
//! nor the journal carries anything per message.
//!
//! Layout (a UUID version 8, 128 bits, most significant first):
//!
//! ```text
//!  127            80 79  76 75     64 63 62 61       40 39            0
//! +----------------+------+---------+-----+-----------+---------------+
//! | Unix ms (48)   | 1000 | rand 12 | 10  | rand 22   | seq (40)      |
//! +----------------+------+---------+-----+-----------+---------------+
//! ```
//!
//! The stream id is the same with `seq` 0 (`SendRequest.tx_stream`); message `seq` (the client's
//! `SendRequest.first_seq` numbering, from 1) has the id `stream | seq`. The time in the top 48
//! bits is the stream's start, in the same place as in a UUID v7.

/// Bits of the sequence number in an id.
pub const SEQ_BITS: u32 = 40;
/// The largest sequence number a stream may use.
pub const MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;

const VERSION_MASK: u128 = 0xf << 76;
const VERSION_8: u128 = 0x8 << 76;
const VARIANT_MASK: u128 = 0b11 << 62;
const VARIANT_RFC: u128 = 0b10 << 62;

/// A new stream id made at `unix_ms` from 34 bits of `random`.
pub fn new_stream(unix_ms: u64, random: u128) -> u128 {
    let time = ((unix_ms & 0xffff_ffff_ffff) as u128) << 80;
    let rand_a = (random & 0xfff) << 64;
    let rand_b = ((random >> 12) & 0x3f_ffff) << SEQ_BITS;
    time | VERSION_8 | rand_a | VARIANT_RFC | rand_b
}

/// Whether `id` is laid out as above (any `seq`).
pub fn is_stream_id(id: u128) -> bool {
    id & VERSION_MASK == VERSION_8 && id & VARIANT_MASK == VARIANT_RFC
}

/// `(stream, seq)` of a message's id, if `id` is laid out as above.
pub fn split(id: u128) -> Option<(u128, u64)> {
    is_stream_id(id).then_some((id & !(MAX_SEQ as u128), (id as u64) & MAX_SEQ))
}

/// The id of message `seq` of `stream`.
pub fn message_id(stream: u128, seq: u64) -> u128 {
    (stream & !(MAX_SEQ as u128)) | (seq & MAX_SEQ) as u128
}

/// The Unix ms in the top 48 bits (a UUID v7's or a stream id's time).
pub fn unix_ms(id: u128) -> u64 {
    (id >> 80) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_keep_their_time() {
        let s = new_stream(1_700_000_000_123, u128::MAX);
        assert!(is_stream_id(s));
        assert_eq!(split(s), Some((s, 0)));
        let m = message_id(s, 77);
        assert_eq!(split(m), Some((s, 77)));
        assert_eq!(split(message_id(s, MAX_SEQ)), Some((s, MAX_SEQ)));
        assert_eq!(unix_ms(m), 1_700_000_000_123);
        // A UUID v7 is not one.
        let v7: u128 = (1_700_000_000_123u128 << 80) | (0x7 << 76) | (0b10 << 62);
        assert_eq!(split(v7), None);
    }

    #[test]
    fn different_randomness_gives_different_streams() {
        let a = new_stream(5, 1);
        let b = new_stream(5, 1 << 12);
        let c = new_stream(5, 2);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(split(message_id(a, 3)).unwrap().0, a);
    }
}
