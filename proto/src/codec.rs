//! The gRPC codec of every `mq.v1` service (client and server stubs): prost's, except that the
//! encoder reserves a message's whole encoded length in tonic's buffer before writing it.
//!
//! Why: tonic's encode buffer (a `BytesMut`) starts each message with no room to spare, and
//! prost writes field by field. A 1 MB body grew the buffer to just fit the body, and the next
//! field after it (a message's label, times, ids) reallocated it, copying the whole body a
//! second time (`_int_realloc` under `encode_varint` in `perf`, about 3% of CPU for 1 MB
//! bodies, on the client's sends and on the broker's deliveries). With the length reserved
//! first, the body is copied once, into its final place.
//!
//! Decoding is prost's, with one guard ([`CompactingDecoder`]): with `bytes` fields
//! (`build.rs`), a decoded body is a slice of tonic's receive buffer (`Bytes`), not a copy,
//! and keeps that buffer for as long as the body lives. prost skips the fields it does not
//! know, but their bytes stay in that buffer: a one-byte body sent with a MiB of an unknown
//! field kept the MiB while the broker counted a byte (in an open transaction, or waiting in a
//! queue after a forward). So a message whose frame holds much more than its known fields is
//! decoded again from a compact copy of them.

use std::any::TypeId;
use std::marker::PhantomData;

use bytes::{Buf, BytesMut};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::v1;

/// [`Codec`] for `mq.v1`: a compacting decoder ([`CompactingDecoder`]) and a reserving encoder
/// ([`ReservingEncoder`]).
#[derive(Debug, Clone)]
pub struct MqCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for MqCodec<T, U> {
    fn default() -> Self {
        MqCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for MqCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ReservingEncoder<T>;
    type Decoder = CompactingDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ReservingEncoder { _pd: PhantomData }
    }

    fn decoder(&mut self) -> Self::Decoder {
        CompactingDecoder { _pd: PhantomData }
    }
}

/// Frames up to this size are left as decoded: tonic reads every frame into a buffer of at
/// least its default size (8 KiB), so a body of such a frame keeps that much whatever the
/// frame carried beside it.
pub const COMPACT_ABOVE: usize = 8 * 1024;

/// prost's decoder, except that a request whose bodies the broker keeps ([`keeps_bodies`]),
/// in a frame over [`COMPACT_ABOVE`] bytes whose unknown fields take more than a sixteenth of
/// what its message keeps ([`compacted`]), is decoded again from a compact copy of its known
/// fields, so its bodies no longer keep the unknown bytes.
#[derive(Debug, Clone)]
pub struct CompactingDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default + 'static> Decoder for CompactingDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let frame = buf.remaining();
        if crate::entries::has_nested::<U>() {
            // Entries nested in another field are counted before any is decoded
            // (crate::entries). A DecodeBuf's bytes are one slice: tonic gathers a message
            // whole into its BytesMut.
            let whole = buf.chunk();
            debug_assert_eq!(whole.len(), frame);
            crate::entries::check_nested::<U, _>(&whole).map_err(|e| e.into_status(""))?;
        }
        // Those at the top are counted as they are decoded.
        let message = crate::entries::decode::<U>(buf).map_err(|e| e.into_status(""))?;
        if !keeps_bodies::<U>() {
            return Ok(Some(message));
        }
        compacted(message, frame)
            .map(Some)
            .map_err(from_decode_error)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Whether `U` is a request whose `bytes` fields the broker keeps after the call has moved on
/// (message bodies and ids in a queue or an open transaction, a forward stream's id): Send
/// (tonic decodes it when it is compressed), Transact and Forward. Every other decoded message
/// (the broker's answers in a client, small requests the broker reads and drops) is left as
/// decoded, without the walk [`compacted`] costs: walking every delivery batch in the client
/// took 1000 B receives from a median of 435k to 401k msg/s (5 alternated rounds).
pub fn keeps_bodies<U: 'static>() -> bool {
    let t = TypeId::of::<U>();
    t == TypeId::of::<v1::SendRequest>()
        || t == TypeId::of::<v1::TransactRequest>()
        || t == TypeId::of::<v1::ForwardRequest>()
}

/// `message`, decoded from a frame of `frame` bytes, as it is if its known fields take nearly
/// all of the frame (unknown bytes at most a sixteenth of them, the share
/// `broker/src/large_bodies.rs` lets a small body keep), or if the frame is at most
/// [`COMPACT_ABOVE`] bytes; otherwise decoded again from a copy of its known fields alone.
/// Costs one walk of the message (its encoded length) per large frame, and a copy only for a
/// frame that carried mostly unknown bytes.
pub fn compacted<U: Message + Default>(message: U, frame: usize) -> Result<U, prost::DecodeError> {
    if frame <= COMPACT_ABOVE {
        return Ok(message);
    }
    let known = message.encoded_len();
    if frame.saturating_sub(known) <= known / 16 {
        return Ok(message);
    }
    let mut compact = BytesMut::with_capacity(known);
    message.encode_raw(&mut compact);
    drop(message);
    U::decode(compact.freeze())
}

/// As tonic-prost maps a decode error: INTERNAL, as gRPC's status codes document.
fn from_decode_error(error: prost::DecodeError) -> Status {
    Status::internal(error.to_string())
}

/// Encodes a prost message after reserving its encoded length, so the buffer grows (and
/// copies what it holds) at most once per message.
#[derive(Debug, Clone)]
pub struct ReservingEncoder<T> {
    _pd: PhantomData<T>,
}

impl<T: Message> Encoder for ReservingEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let len = item.encoded_len();
        buf.reserve(len);
        // `encode_raw` rather than `encode`: the length is known, and `encode` would compute
        // it again (a walk over every message of a batch) only to compare it with the room of
        // a buffer that grows on demand.
        item.encode_raw(buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use bytes::Bytes;

    fn request(body: usize) -> v1::SendRequest {
        v1::SendRequest {
            destination: r".\private$\q".into(),
            messages: vec![v1::OutMessage {
                body: Bytes::from(vec![5u8; body]),
                label: "a label".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// `request(body)` encoded, then `unknown` bytes of field 1000.
    fn frame(body: usize, unknown: usize) -> Bytes {
        let mut encoded = request(body).encode_to_vec();
        if unknown > 0 {
            prost::encoding::bytes::encode(1000, &vec![7u8; unknown], &mut encoded);
        }
        Bytes::from(encoded)
    }

    /// Whether the decoded body is a slice of `frame` (keeps it) rather than of a copy.
    fn keeps(decoded: &v1::SendRequest, frame: &Bytes) -> bool {
        frame
            .as_ptr_range()
            .contains(&decoded.messages[0].body.as_ptr())
    }

    fn decode(frame: &Bytes) -> v1::SendRequest {
        let decoded = v1::SendRequest::decode(frame.clone()).unwrap();
        compacted(decoded, frame.len()).unwrap()
    }

    #[test]
    fn a_small_body_does_not_keep_the_unknown_bytes_beside_it() {
        for unknown in [1 << 20, 64 * 1024, COMPACT_ABOVE] {
            let frame = frame(1, unknown);
            // Without the guard, the body is a slice of the whole frame.
            assert!(keeps(
                &v1::SendRequest::decode(frame.clone()).unwrap(),
                &frame
            ));
            let decoded = decode(&frame);
            assert_eq!(decoded, request(1), "{unknown} unknown bytes");
            assert!(!keeps(&decoded, &frame), "{unknown} unknown bytes");
        }
    }

    #[test]
    fn frames_of_known_fields_or_small_frames_are_left_as_decoded() {
        // Known fields alone, small or large.
        for body in [0, 1, 1000, 100_000, 1 << 20] {
            let frame = frame(body, 0);
            let decoded = decode(&frame);
            assert_eq!(decoded, request(body));
            if body > 0 {
                assert!(keeps(&decoded, &frame), "body {body}");
            }
        }
        // Unknown bytes up to a sixteenth of the known ones (a newer client's new fields).
        let newer = frame(100_000, 100_000 / 16 - 64);
        assert!(keeps(&decode(&newer), &newer));
        // A frame of at most COMPACT_ABOVE bytes: tonic's buffer is at least that anyway.
        let small = frame(1, COMPACT_ABOVE - 200);
        assert!(small.len() <= COMPACT_ABOVE);
        assert!(keeps(&decode(&small), &small));
    }

    #[test]
    fn only_requests_whose_bodies_are_kept_are_compacted() {
        assert!(keeps_bodies::<v1::SendRequest>());
        assert!(keeps_bodies::<v1::TransactRequest>());
        assert!(keeps_bodies::<v1::ForwardRequest>());
        assert!(!keeps_bodies::<v1::ReceiveResponse>());
        assert!(!keeps_bodies::<v1::ReceiveRequest>());
    }

    #[test]
    fn a_large_body_with_as_many_unknown_bytes_is_copied_once() {
        let frame = frame(100_000, 100_000);
        let decoded = decode(&frame);
        assert_eq!(decoded, request(100_000));
        assert!(!keeps(&decoded, &frame));
    }
}
