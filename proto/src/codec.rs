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
//! Decoding is prost's own decoder: with `bytes` fields (`build.rs`), a decoded body is a slice
//! of tonic's receive buffer (`Bytes`), not a copy.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// [`Codec`] for `mq.v1`: prost's decoder and a reserving encoder ([`ReservingEncoder`]).
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
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ReservingEncoder { _pd: PhantomData }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
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
