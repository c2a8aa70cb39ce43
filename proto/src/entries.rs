//! The entries of a message's repeated fields, counted on the wire before it is decoded.
//!
//! prost decodes a repeated message field of N entries into a `Vec` of N structs, and an entry
//! may take two bytes on the wire (`1a 00`: an empty `OutMessage`) where its struct takes
//! hundreds: one 11 MiB `SendRequest` of empty messages decoded into 5.8 million
//! `OutMessage`s took mqd from 12 MiB to 2.9 GB of RAM, and only then did the service refuse
//! the batch as over `--max-batch-messages` (a few such requests at once, from any client
//! that may connect, and the broker is out of memory). A broker's answers do the same to a
//! client. So every `mq.v1` message with a repeated field is walked first ([`check`]: keys and
//! lengths only, no allocation), and one with more entries than its field allows is refused
//! undecoded: a request with the status the service would have given it after decoding, an
//! answer as a broken one.
//!
//! The bounds: a batch of messages (sends, transactional sends, forwarded messages, and the
//! answers that name each of them) at most [`batch_messages`] (`mqd --max-batch-messages`,
//! default [`DEFAULT_MAX_BATCH_MESSAGES`]; a broker or a client raises it for the process with
//! [`allow_batch_messages`]); a transaction's ids at most [`MAX_TX_MESSAGES`]; lists of queues
//! [`MAX_LISTED`]; deliveries and peeked messages per answer [`MAX_DELIVERED`]; the rest far
//! above what a broker sends.

use std::any::TypeId;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Buf;
use tonic::{Code, Status};

use crate::v1;

/// Default most messages in one send batch, transactional send or forwarded batch
/// (`mqd --max-batch-messages`).
pub const DEFAULT_MAX_BATCH_MESSAGES: usize = 10_000;
/// Most messages one transaction may hold (`mqd --max-tx-messages` at most this): a commit's
/// answer names each of its sends.
pub const MAX_TX_MESSAGES: u64 = 1_000_000;
/// Most queues or outgoing queues in one list answer (an answer of every queue at once, as
/// `page_size` 0 asks, included; mqd holds at most `--max-queues`, 200,000 by default).
pub const MAX_LISTED: usize = 1_000_000;
/// Most messages in one answer of a receive stream or a peek (mqd sends at most 256 and 1,000).
pub const MAX_DELIVERED: usize = 10_000;
/// Bound of the small repeated fields (rights, ACL entries, listen addresses, limits).
pub const MAX_SMALL: usize = 10_000;

static BATCH_MESSAGES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_BATCH_MESSAGES);

/// Lets this process decode batches of up to `n` messages (it never lowers the bound): mqd
/// calls it with its `--max-batch-messages`, a client with the batch size it sends.
pub fn allow_batch_messages(n: usize) {
    BATCH_MESSAGES.fetch_max(n, Ordering::Relaxed);
}

/// Most messages in one batch this process decodes.
pub fn batch_messages() -> usize {
    BATCH_MESSAGES.load(Ordering::Relaxed)
}

/// A bound on one repeated field.
struct Bound {
    /// Field numbers from the top: every one but the last a message field, the last the
    /// repeated field. Its entries are summed over every occurrence of the fields enclosing
    /// it (prost merges the occurrences of a singular one; those of a repeated one, as
    /// `QueueAcl.entries`, are summed too: the bound is on all rights of the ACL).
    path: &'static [u32],
    /// The most entries, or `None` for [`batch_messages`].
    max: Option<usize>,
    /// How the refusal names what was too long, e.g. "a send batch".
    what: &'static str,
    /// What its entries are, e.g. "messages".
    entries: &'static str,
    /// The refusal's code: OUT_OF_RANGE for a request (as the service's own check), INTERNAL
    /// for an answer (a broken one, as prost's decode errors are).
    code: Code,
    /// A hint at the end of the refusal.
    hint: &'static str,
}

const BATCH_HINT: &str = " (mqd --max-batch-messages)";

const fn request(path: &'static [u32], what: &'static str) -> Bound {
    Bound {
        path,
        max: None,
        what,
        entries: "messages",
        code: Code::OutOfRange,
        hint: BATCH_HINT,
    }
}

const fn answer(
    path: &'static [u32],
    max: Option<usize>,
    what: &'static str,
    entries: &'static str,
) -> Bound {
    Bound {
        path,
        max,
        what,
        entries,
        code: Code::Internal,
        hint: "",
    }
}

/// The bounded repeated fields of `U`, empty for a message without any.
fn bounds<U: 'static>() -> &'static [Bound] {
    let t = TypeId::of::<U>();
    macro_rules! table {
        ($($ty:ty => [$($b:expr),* $(,)?]),* $(,)?) => {
            $(if t == TypeId::of::<$ty>() {
                const B: &[Bound] = &[$($b),*];
                return B;
            })*
        };
    }
    table! {
        // What mqd decodes.
        v1::SendRequest => [request(&[3], "a send batch")],
        v1::TransactRequest => [request(&[1, 2], "a transactional send")],
        v1::ForwardRequest => [request(&[4], "a forwarded batch")],
        v1::ChangeAclRequest => [Bound {
            path: &[3],
            max: Some(MAX_SMALL),
            what: "a ChangeAcl request",
            entries: "rights",
            code: Code::InvalidArgument,
            hint: "",
        }],
        // What a client (or a forwarding mqd) decodes.
        v1::SendResponse => [
            answer(&[3], None, "a send acknowledgement", "ids"),
            answer(&[4], None, "a send acknowledgement", "failures"),
        ],
        v1::ForwardResponse => [answer(&[3], None, "a forward acknowledgement", "refusals")],
        v1::TransactResponse => [answer(
            &[3, 1],
            Some(MAX_TX_MESSAGES as usize),
            "a commit answer",
            "ids",
        )],
        v1::ReceiveResponse => [answer(&[1], Some(MAX_DELIVERED), "a delivery", "messages")],
        v1::PeekResponse => [answer(&[1], Some(MAX_DELIVERED), "a peek answer", "messages")],
        v1::ListQueuesResponse => [answer(&[1], Some(MAX_LISTED), "a queue list", "queues")],
        v1::ListOutgoingResponse => [answer(
            &[1],
            Some(MAX_LISTED),
            "an outgoing queue list",
            "queues",
        )],
        v1::QueueAcl => [
            answer(&[2], Some(MAX_SMALL), "an ACL", "entries"),
            answer(&[2, 2], Some(MAX_SMALL), "an ACL", "rights"),
        ],
        v1::BrokerInfo => [
            answer(&[6], Some(MAX_SMALL), "the broker's information", "listen addresses"),
            answer(&[17], Some(MAX_SMALL), "the broker's information", "limits"),
        ],
    }
    &[]
}

/// Whether `U` has a bounded repeated field inside another field: decoders walk such a
/// message first ([`check_nested`]). The others are counted as they are decoded ([`decode`]).
pub fn has_nested<U: 'static>() -> bool {
    bounds::<U>().iter().any(|b| b.path.len() > 1)
}

/// A message refused: malformed (prost's error, which callers report as they report any
/// decode error) or over a bound (the status to answer).
#[derive(Debug)]
pub enum Refused {
    /// prost could not decode it, or the walk could not read it: why.
    Malformed(String),
    /// One of its repeated fields holds more entries than it may.
    Over(Status),
}

impl Refused {
    /// The status to answer, with `prefix` before a decode error's text.
    pub fn into_status(self, prefix: &str) -> Status {
        match self {
            Refused::Malformed(e) => Status::internal(format!("{prefix}{e}")),
            Refused::Over(s) => s,
        }
    }
}

/// Decodes `U` from `buf` as prost does (its own loop of keys and fields), counting the
/// entries of each bounded repeated field at the top as they come: past its bound the
/// decoding stops, refused, with at most the bound's entries made. No walk before, so a message
/// costs no more than prost's decoding. Bounded fields nested deeper are not counted here:
/// walk those messages first with [`check_nested`].
pub fn decode<U: prost::Message + Default + 'static>(mut buf: impl Buf) -> Result<U, Refused> {
    let bounds = bounds::<U>();
    if bounds.is_empty() {
        return U::decode(buf).map_err(malformed);
    }
    let mut message = U::default();
    let mut counts = [0u64; 2];
    let ctx = prost::encoding::DecodeContext::default();
    while buf.has_remaining() {
        let (tag, wire) = prost::encoding::decode_key(&mut buf).map_err(malformed)?;
        for (i, bound) in bounds.iter().enumerate().take(counts.len()) {
            if bound.path.len() == 1 && bound.path[0] == tag {
                counts[i] += 1;
                over(bound, counts[i])?;
            }
        }
        // What `Message::merge` does for each field (prost's generated decoding).
        message
            .merge_field(tag, wire, &mut buf, ctx.clone())
            .map_err(malformed)?;
    }
    Ok(message)
}

fn malformed(e: prost::DecodeError) -> Refused {
    Refused::Malformed(e.to_string())
}

/// Refuses `n` entries of `bound`'s field if that is more than it may hold.
fn over(bound: &Bound, n: u64) -> Result<(), Refused> {
    let max = bound.max.unwrap_or_else(batch_messages);
    if n <= max as u64 {
        return Ok(());
    }
    // Counted while decoding, a field at the top stops at one past its limit.
    let text = if bound.path.len() == 1 {
        format!(
            "{} holds more than {max} {}, its limit{}",
            bound.what, bound.entries, bound.hint
        )
    } else {
        format!(
            "{} holds {n} {}; the limit is {max}{}",
            bound.what, bound.entries, bound.hint
        )
    };
    Err(Refused::Over(Status::new(bound.code, text)))
}

/// Walks the encoded `U` in `buf` (a copy of the cursor: `buf` is not advanced) and refuses it
/// if a bounded field nested in another holds more entries than it may, or if it is malformed
/// where the walk reads (prost would refuse it too, perhaps only after decoding the entries
/// before the fault). Fields at the top are left to [`decode`].
pub fn check_nested<U: 'static, B: Buf + Clone>(buf: &B) -> Result<(), Refused> {
    walk::<U, B>(buf, |b| b.path.len() > 1)
}

/// As [`check_nested`], for every bounded field of `U` (the top ones included): the walk's
/// count checked against prost's decoding in tests (decoders count the top ones in [`decode`]).
#[cfg(test)]
pub(crate) fn check<U: 'static, B: Buf + Clone>(buf: &B) -> Result<(), Refused> {
    walk::<U, B>(buf, |_| true)
}

fn walk<U: 'static, B: Buf + Clone>(
    buf: &B,
    which: impl Fn(&Bound) -> bool,
) -> Result<(), Refused> {
    for bound in bounds::<U>().iter().filter(|b| which(b)) {
        let mut b = buf.clone();
        let len = b.remaining();
        let n = count(&mut b, len, bound.path, 0)
            .map_err(|e| Refused::Malformed(format!("a walk of the message found {e}")))?;
        over(bound, n)?;
    }
    Ok(())
}

/// Nesting of groups the walk follows, as prost's recursion limit.
const MAX_DEPTH: u32 = 100;

/// The entries of `path` in the next `len` bytes of `buf` (which it consumes).
fn count<B: Buf>(buf: &mut B, len: usize, path: &[u32], depth: u32) -> Result<u64, &'static str> {
    let end = buf
        .remaining()
        .checked_sub(len)
        .ok_or("a length past the end")?;
    let mut n = 0u64;
    while buf.remaining() > end {
        let (field, wire) = key_within(buf, end)?;
        match wire {
            2 => {
                let l = len_within(buf, end)?;
                if field == path[0] {
                    if path.len() == 1 {
                        n += 1;
                        buf.advance(l);
                    } else {
                        n += count(buf, l, &path[1..], depth)?;
                    }
                } else {
                    buf.advance(l);
                }
            }
            3 => skip_group(buf, end, field, depth + 1)?,
            4 => return Err("an unexpected end of group"),
            w => skip(buf, end, w)?,
        }
    }
    if buf.remaining() != end {
        return Err("a field past the end");
    }
    Ok(n)
}

/// A field key: its number and wire type (refused: 0, above 2^29 - 1, wire types 6 and 7).
fn key<B: Buf>(buf: &mut B) -> Result<(u32, u8), &'static str> {
    let k = varint(buf)?;
    if k > u64::from(u32::MAX) {
        return Err("an invalid key");
    }
    let wire = (k & 7) as u8;
    let field = (k >> 3) as u32;
    if field == 0 || wire > 5 {
        return Err("an invalid key");
    }
    Ok((field, wire))
}

/// A field key that ends before `end` (one read across `end` ends past it: refused, as prost
/// refuses it).
fn key_within<B: Buf>(buf: &mut B, end: usize) -> Result<(u32, u8), &'static str> {
    let k = key(buf)?;
    left(buf, end)?;
    Ok(k)
}

/// A length-delimited field's length, whose bytes lie before `end`.
fn len_within<B: Buf>(buf: &mut B, end: usize) -> Result<usize, &'static str> {
    let l = varint(buf)?;
    if l > left(buf, end)? as u64 {
        return Err("a length past the end");
    }
    Ok(l as usize)
}

/// The bytes of `buf` before `end`; refused if a read went past it.
fn left<B: Buf>(buf: &B, end: usize) -> Result<usize, &'static str> {
    buf.remaining()
        .checked_sub(end)
        .ok_or("a field past the end")
}

/// Skips a field of wire type 0, 1 or 5.
fn skip<B: Buf>(buf: &mut B, end: usize, wire: u8) -> Result<(), &'static str> {
    let n = match wire {
        0 => {
            varint(buf)?;
            left(buf, end)?;
            return Ok(());
        }
        1 => 8,
        5 => 4,
        _ => return Err("an invalid wire type"),
    };
    if left(buf, end)? < n {
        return Err("a field past the end");
    }
    buf.advance(n);
    Ok(())
}

/// Skips a group up to its end key (field `field`), groups within it included.
fn skip_group<B: Buf>(buf: &mut B, end: usize, field: u32, depth: u32) -> Result<(), &'static str> {
    if depth > MAX_DEPTH {
        return Err("groups nested too deep");
    }
    while buf.remaining() > end {
        let (f, wire) = key_within(buf, end)?;
        match wire {
            2 => {
                let l = len_within(buf, end)?;
                buf.advance(l);
            }
            3 => skip_group(buf, end, f, depth + 1)?,
            4 if f == field => return Ok(()),
            4 => return Err("an unexpected end of group"),
            w => skip(buf, end, w)?,
        }
    }
    Err("a group without its end")
}

/// A varint: one or two bytes (keys, lengths under 16 KiB) read here, longer ones by prost.
#[inline]
fn varint<B: Buf>(buf: &mut B) -> Result<u64, &'static str> {
    let c = buf.chunk();
    if let Some(&b0) = c.first() {
        if b0 < 0x80 {
            buf.advance(1);
            return Ok(u64::from(b0));
        }
        if let Some(&b1) = c.get(1) {
            if b1 < 0x80 {
                buf.advance(2);
                return Ok(u64::from(b0 & 0x7f) | (u64::from(b1) << 7));
            }
        }
    }
    prost::encoding::decode_varint(buf).map_err(|_| "an invalid varint")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use prost::Message;

    fn empties(tag: u8, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(2 * n);
        for _ in 0..n {
            v.extend_from_slice(&[tag, 0]);
        }
        v
    }

    fn status(r: Refused) -> Status {
        match r {
            Refused::Over(s) => s,
            Refused::Malformed(e) => panic!("malformed, not over: {e}"),
        }
    }

    #[test]
    fn a_send_batch_over_the_limit_is_refused_while_it_is_decoded() {
        let limit = batch_messages();
        let mut ok = vec![0x08, 0x01];
        ok.extend(empties(0x1a, limit));
        let ok = Bytes::from(ok);
        let decoded = decode::<v1::SendRequest>(ok.clone()).unwrap();
        assert_eq!(decoded, v1::SendRequest::decode(ok.clone()).unwrap());
        assert_eq!(decoded.messages.len(), limit);
        check::<v1::SendRequest, _>(&&ok[..]).unwrap();
        let mut over = ok.to_vec();
        over.extend_from_slice(&[0x1a, 0]);
        let want = format!(
            "a send batch holds more than {limit} messages, its limit (mqd --max-batch-messages)"
        );
        for e in [
            status(decode::<v1::SendRequest>(&over[..]).unwrap_err()),
            status(check::<v1::SendRequest, _>(&&over[..]).unwrap_err()),
        ] {
            assert_eq!(e.code(), Code::OutOfRange);
            assert_eq!(e.message(), want);
        }
    }

    #[test]
    fn nested_entries_are_summed_over_every_occurrence_of_their_parent() {
        // TransactRequest.send (1) twice, each a TxSend with messages (2): prost merges them.
        let half = batch_messages() / 2 + 1;
        let inner = empties(0x12, half);
        let mut frame = Vec::new();
        for _ in 0..2 {
            frame.push(0x0a);
            prost::encoding::encode_varint(inner.len() as u64, &mut frame);
            frame.extend_from_slice(&inner);
        }
        let decoded = v1::TransactRequest::decode(&frame[..]).unwrap();
        match decoded.op {
            Some(v1::transact_request::Op::Send(s)) => assert_eq!(s.messages.len(), 2 * half),
            other => panic!("{other:?}"),
        }
        assert!(has_nested::<v1::TransactRequest>());
        let e = status(check_nested::<v1::TransactRequest, _>(&&frame[..]).unwrap_err());
        assert_eq!(
            e.message(),
            format!(
                "a transactional send holds {} messages; the limit is {} (mqd --max-batch-messages)",
                2 * half,
                batch_messages()
            )
        );
        // One TxSend at the limit passes.
        let mut one = vec![0x0a];
        let inner = empties(0x12, batch_messages());
        prost::encoding::encode_varint(inner.len() as u64, &mut one);
        one.extend_from_slice(&inner);
        check_nested::<v1::TransactRequest, _>(&&one[..]).unwrap();
    }

    #[test]
    fn unknown_fields_and_groups_are_skipped_as_prost_skips_them() {
        let mut frame = Vec::new();
        // field 9, varint; field 10, fixed64; field 11, fixed32; field 12, a group holding
        // field 3 entries (not counted: prost skips the whole group); then two real entries.
        frame.extend_from_slice(&[0x48, 0x96, 0x01]);
        frame.extend_from_slice(&[0x51, 1, 2, 3, 4, 5, 6, 7, 8]);
        frame.extend_from_slice(&[0x5d, 1, 2, 3, 4]);
        frame.extend_from_slice(&[0x63, 0x1a, 0x00, 0x1a, 0x00, 0x64]);
        frame.extend_from_slice(&[0x1a, 0x00, 0x1a, 0x00]);
        let decoded = v1::SendRequest::decode(&frame[..]).unwrap();
        assert_eq!(decoded.messages.len(), 2);
        assert_eq!(decode::<v1::SendRequest>(&frame[..]).unwrap(), decoded);
        let mut b = &frame[..];
        assert_eq!(count(&mut b, frame.len(), &[3], 0), Ok(2));
    }

    #[test]
    fn what_prost_refuses_the_walk_refuses() {
        let cases: &[&[u8]] = &[
            &[0x1a, 0x05, 0x00], // a length past the end
            &[0x1a],             // a key without its length
            &[0x00, 0x00],       // field 0
            &[0x1e],             // wire type 6
            &[0x1c],             // an end group never begun
            &[0x1b, 0x1a, 0x00], // a group never ended
            &[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ], // a varint
        ];
        refused_as_prost_refuses::<v1::SendRequest>(cases, |c| check::<v1::SendRequest, _>(&c));
        for case in cases {
            assert!(
                matches!(decode::<v1::SendRequest>(*case), Err(Refused::Malformed(_))),
                "{case:02x?}"
            );
        }
    }

    /// Each of `cases` is refused by prost as a `U`, and by `walk` as malformed.
    fn refused_as_prost_refuses<U: Message + Default>(
        cases: &[&[u8]],
        walk: impl Fn(&[u8]) -> Result<(), Refused>,
    ) {
        for case in cases {
            assert!(U::decode(*case).is_err(), "prost took {case:02x?}");
            assert!(
                matches!(walk(case), Err(Refused::Malformed(_))),
                "{case:02x?}"
            );
        }
    }

    #[test]
    fn a_nested_message_whose_last_field_runs_past_its_end_is_refused_not_a_panic() {
        // TransactRequest.send one byte long, its field's length (or key) lying outside it
        // (helper-53: the walk's subtraction overflowed, a panic any client could cause).
        let cases: &[&[u8]] = &[
            &[0x0a, 0x01, 0x12, 0x7f],
            &[0x0a, 0x01, 0x89, 0x01],
            &[0x0a, 0x01, 0x12, 0x00],
            &[0x0a, 0x02, 0x09, 0x01, 0x02, 0x03],
            &[0x0a, 0x01, 0x0b, 0x0c],
        ];
        refused_as_prost_refuses::<v1::TransactRequest>(cases, |c| {
            check_nested::<v1::TransactRequest, _>(&c)
        });
    }

    #[test]
    fn answers_are_bounded_too() {
        let frame = empties(0x0a, MAX_DELIVERED + 1);
        let e = status(decode::<v1::ReceiveResponse>(&frame[..]).unwrap_err());
        assert_eq!(e.code(), Code::Internal);
        assert_eq!(
            e.message(),
            "a delivery holds more than 10000 messages, its limit"
        );
        assert_eq!(
            decode::<v1::ReceiveResponse>(&frame[2..])
                .unwrap()
                .messages
                .len(),
            MAX_DELIVERED
        );
        // Two bounded fields of one message, each counted apart.
        let mut ack = empties(0x1a, batch_messages());
        ack.extend(empties(0x22, batch_messages()));
        decode::<v1::SendResponse>(&ack[..]).unwrap();
        ack.extend_from_slice(&[0x22, 0]);
        let e = status(decode::<v1::SendResponse>(&ack[..]).unwrap_err());
        assert!(e.message().contains("failures"), "{e}");
        // A commit's ids are nested in TransactResponse.committed.
        assert!(has_nested::<v1::TransactResponse>());
        assert!(!has_nested::<v1::SendRequest>());
    }

    proptest::proptest! {
        /// The walk and the counting decoder are never stricter than prost: whatever bytes
        /// prost decodes as a `TransactRequest` (a nested path) or a `SendRequest`, the walk
        /// reads too, counting exactly the entries prost made, and `decode` makes the same.
        #[test]
        fn the_walk_reads_what_prost_decodes_and_counts_what_it_makes(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::collection::vec(proptest::num::u8::ANY, 0..6),
                    proptest::strategy::Just(vec![0x0a, 0x02, 0x12, 0x00]),
                    proptest::strategy::Just(vec![0x1a, 0x00]),
                    proptest::strategy::Just(vec![0x12, 0x00]),
                    proptest::strategy::Just(vec![0x0a, 0x00]),
                    proptest::strategy::Just(vec![0x63, 0x64]),
                    proptest::strategy::Just(vec![0x0a, 0x01]),
                    proptest::strategy::Just(vec![0x0a, 0x03]),
                ],
                0..40,
            )
        ) {
            let frame: Vec<u8> = pieces.concat();
            let mut b = &frame[..];
            let walked = count(&mut b, frame.len(), &[1, 2], 0);
            if let Ok(m) = v1::TransactRequest::decode(&frame[..]) {
                let made = match &m.op {
                    Some(v1::transact_request::Op::Send(s)) => s.messages.len() as u64,
                    _ => 0,
                };
                // Entries of a TxSend that another op replaced are counted, not made: the walk
                // may count more, never fewer.
                proptest::prop_assert!(matches!(walked, Ok(n) if n >= made), "{walked:?} {made}");
                proptest::prop_assert_eq!(decode::<v1::TransactRequest>(&frame[..]).ok(), Some(m));
            }
            let mut b = &frame[..];
            let walked = count(&mut b, frame.len(), &[3], 0);
            match v1::SendRequest::decode(&frame[..]) {
                Ok(m) => {
                    proptest::prop_assert_eq!(walked, Ok(m.messages.len() as u64));
                    proptest::prop_assert_eq!(decode::<v1::SendRequest>(&frame[..]).ok(), Some(m));
                }
                Err(_) => proptest::prop_assert!(decode::<v1::SendRequest>(&frame[..]).is_err()),
            }
        }
    }

    #[test]
    fn allow_batch_messages_only_raises_the_bound() {
        let before = batch_messages();
        allow_batch_messages(before - 1);
        assert_eq!(batch_messages(), before);
    }
}
