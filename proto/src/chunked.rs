//! gRPC messages written with their large bodies as chunks of their own, not copied.
//!
//! tonic encodes every message into one contiguous buffer (`EncodeBuf`), so a body already
//! held as `Bytes` was copied once more on its way out. Here the protobuf around each body of
//! [`SPLIT_BODY_BYTES`] or more goes into a small buffer, and the body follows as its own chunk
//! (the same `Bytes`); h2 sends a chunk of 256 bytes or more as its own piece of a vectored
//! write. mq-client sends with [`encode_send_request`]; mqd answers Receive calls the same way
//! (`broker/src/large_bodies.rs`). The other way, [`FrameDecoder`] reads gRPC messages from the
//! frames as they arrive: mqd its Send requests (a request within one frame is not copied; one
//! spread over frames is gathered), mq-client its deliveries (decoded where the pieces lie).

use std::collections::VecDeque;
use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;

use tonic::Status;

use crate::v1;

/// A body at least this long goes out as its own chunk, not copied; shorter ones are copied
/// into the buffer with the rest (a copy of a few KiB costs less than another iovec and frame).
pub const SPLIT_BODY_BYTES: usize = 16 * 1024;

/// gRPC's message prefix: a compression flag and a 4-byte length.
pub const PREFIX_LEN: usize = 5;

/// The buffer for one uncompressed gRPC message of `len` bytes, `split` of which go out as
/// chunks of their own ([`push_body`]): room for the rest, with the 5-byte prefix written.
/// `None` if `len` is over 4 GiB, which gRPC cannot frame.
pub fn message_buffer(len: usize, split: usize) -> Option<BytesMut> {
    let len32 = u32::try_from(len).ok()?;
    let mut head = BytesMut::with_capacity(PREFIX_LEN + len - split);
    head.put_u8(0);
    head.put_u32(len32);
    Some(head)
}

/// Writes field `tag`'s key and `body`'s length into `head`, then moves what `head` holds and
/// then `body` itself (not a copy) to `out`.
pub fn push_body(tag: u32, body: Bytes, head: &mut BytesMut, out: &mut VecDeque<Bytes>) {
    encode_key(tag, WireType::LengthDelimited, head);
    encode_varint(body.len() as u64, head);
    out.push_back(head.split().freeze());
    out.push_back(body);
}

/// Appends `req` to `out` as one uncompressed gRPC message: the 5-byte prefix and the
/// protobuf encoding of `req`, with each body of at least [`SPLIT_BODY_BYTES`] its own chunk
/// (that very `Bytes`). The fields of `SendRequest` other than `messages` come first (protobuf
/// allows any order; decoders read the same message). `None` if the message is over 4 GiB,
/// which gRPC cannot frame (mqd refuses far less: its limit is the body limit plus 8 MiB).
pub fn encode_send_request(mut req: v1::SendRequest, out: &mut VecDeque<Bytes>) -> Option<()> {
    let split: usize = req
        .messages
        .iter()
        .map(|m| m.body.len())
        .filter(|&n| n >= SPLIT_BODY_BYTES)
        .sum();
    let mut head = message_buffer(req.encoded_len(), split)?;
    let messages = std::mem::take(&mut req.messages);
    req.encode_raw(&mut head);
    for mut m in messages {
        encode_key(3, WireType::LengthDelimited, &mut head);
        encode_varint(m.encoded_len() as u64, &mut head);
        if m.body.len() < SPLIT_BODY_BYTES {
            m.encode_raw(&mut head);
            continue;
        }
        // OutMessage.body is field 1: first, as prost writes it.
        push_body(1, std::mem::take(&mut m.body), &mut head, out);
        m.encode_raw(&mut head);
    }
    if !head.is_empty() {
        out.push_back(head.freeze());
    }
    Some(())
}

/// A frame shorter than this is copied into [`FrameDecoder`]'s buffer rather than kept as it
/// is.
pub const COALESCE_BYTES: usize = 4096;

/// One gRPC message's bytes as the frames brought them (none empty), read by prost where
/// they lie: a `bytes` field that lies within one piece is a slice of it (no copy), and
/// mq's own writers put each large body in a piece of its own ([`push_body`]); a field spread
/// over pieces is gathered.
#[derive(Debug)]
pub struct MessageBuf {
    chunks: VecDeque<Bytes>,
    remaining: usize,
}

/// A read-only cursor over a [`MessageBuf`]'s pieces, for walking a message before it is
/// decoded ([`crate::entries::check`]) without copying or allocating.
#[derive(Debug, Clone, Copy)]
struct Pieces<'a> {
    chunks: &'a VecDeque<Bytes>,
    /// The piece being read, and the offset in it.
    at: usize,
    off: usize,
    remaining: usize,
}

impl<'a> Pieces<'a> {
    fn of(msg: &'a MessageBuf) -> Self {
        let mut p = Pieces {
            chunks: &msg.chunks,
            at: 0,
            off: 0,
            remaining: msg.remaining,
        };
        p.skip_empty();
        p
    }

    fn skip_empty(&mut self) {
        while self.at < self.chunks.len() && self.off == self.chunks[self.at].len() {
            self.at += 1;
            self.off = 0;
        }
    }
}

impl bytes::Buf for Pieces<'_> {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.get(self.at).map_or(&[], |c| &c[self.off..])
    }

    #[inline]
    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advance past the end of the message");
        self.remaining -= n;
        if let Some(c) = self.chunks.get(self.at) {
            if self.off + n < c.len() {
                self.off += n;
                return;
            }
        }
        while n > 0 {
            let k = (self.chunks[self.at].len() - self.off).min(n);
            self.off += k;
            n -= k;
            self.skip_empty();
        }
    }
}

impl bytes::Buf for MessageBuf {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| &c[..])
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advance past the end of the message");
        self.remaining -= n;
        while n > 0 {
            let c = self
                .chunks
                .front_mut()
                .expect("remaining counts the pieces");
            let k = c.len().min(n);
            c.advance(k);
            n -= k;
            if c.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.remaining,
            "copy_to_bytes past the end of the message"
        );
        if let Some(c) = self.chunks.front_mut().filter(|c| c.len() >= len) {
            let b = c.split_to(len);
            if c.is_empty() {
                self.chunks.pop_front();
            }
            self.remaining -= len;
            return b;
        }
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len {
            let k = self.chunk().len().min(len - out.len());
            out.extend_from_slice(&self.chunk()[..k]);
            self.advance(k);
        }
        out.freeze()
    }
}

/// A stream's gRPC messages read from the HTTP/2 frames as they arrive: a message that lies
/// within one frame is decoded from that frame's bytes (prost takes a `bytes` field as a slice,
/// so a body is not copied); one spread over several frames is gathered first, as tonic does;
/// frames under [`COALESCE_BYTES`] are copied together as they come. tonic's bounds and
/// refusals, with its words: a message over the limit is refused (OUT_OF_RANGE) from its 5-byte
/// prefix; a compressed flag (no `grpc-encoding` is negotiated), a bad flag, a truncated stream
/// and undecodable bytes are INTERNAL. mqd reads Send requests with it
/// ([`FrameDecoder::request`]) and mq-client reads Receive responses
/// ([`FrameDecoder::response`]: the stream ends with the status of its trailers).
pub struct FrameDecoder<T> {
    /// The body, its errors made statuses by tonic (as its `Streaming` does).
    body: tonic::body::Body,
    /// A response: it ends with the status in its trailers.
    response: bool,
    /// The trailers' status, once they came.
    status: Option<Status>,
    /// Data received and not yet taken, in order; none is empty. Each is a frame of at least
    /// [`COALESCE_BYTES`], or small frames copied together (see `tail`).
    chunks: VecDeque<Bytes>,
    /// Frames under [`COALESCE_BYTES`] received after `chunks`, copied into one buffer: a
    /// stream of tiny frames costs its bytes, not a `Bytes` (and a queue slot) per frame.
    tail: BytesMut,
    /// The length of `chunks` and `tail` together.
    buffered: usize,
    /// The largest message accepted (the server's max_decoding_message_size).
    limit: usize,
    /// The body has ended.
    ended: bool,
    _pd: std::marker::PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for FrameDecoder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameDecoder")
            .field("buffered", &self.buffered)
            .field("response", &self.response)
            .field("ended", &self.ended)
            .finish()
    }
}

impl<T: prost::Message + Default + 'static> FrameDecoder<T> {
    /// A request stream (mqd's side): its trailers are ignored, a cancelled body is its end.
    pub fn request<B>(body: B, limit: usize) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Self::new(tonic::body::Body::new(body), limit, false)
    }

    /// A response stream (a client's side) whose headers carried no status: it ends with the
    /// status of its trailers (an error status is returned as the error), or UNKNOWN without
    /// one, as tonic does.
    pub fn response(body: tonic::body::Body, limit: usize) -> Self {
        Self::new(body, limit, true)
    }

    fn new(body: tonic::body::Body, limit: usize, response: bool) -> Self {
        FrameDecoder {
            body,
            response,
            status: None,
            chunks: VecDeque::new(),
            tail: BytesMut::new(),
            buffered: 0,
            limit,
            ended: false,
            _pd: std::marker::PhantomData,
        }
    }

    /// The next message's declared length, once its prefix has arrived.
    fn next_len(&self) -> Result<Option<usize>, Status> {
        if self.buffered < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        let mut n = 0;
        for c in self.chunks.iter().map(|c| &c[..]).chain([&self.tail[..]]) {
            let k = c.len().min(PREFIX_LEN - n);
            prefix[n..n + k].copy_from_slice(&c[..k]);
            n += k;
            if n == PREFIX_LEN {
                break;
            }
        }
        match prefix[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while {}",
                    if self.response { "receiving response" } else { "sending request" }
                )))
            }
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.limit {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.limit
            )));
        }
        Ok(Some(len))
    }

    /// The next whole message's bytes, without its prefix, if all of it has arrived.
    fn take(&mut self) -> Result<Option<MessageBuf>, Status> {
        let Some(len) = self.next_len()? else {
            return Ok(None);
        };
        if self.buffered < PREFIX_LEN + len {
            return Ok(None);
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.skip(PREFIX_LEN);
        self.buffered -= len;
        // The message's pieces, as they came: decoded where they lie (`MessageBuf`).
        let mut msg = MessageBuf {
            chunks: VecDeque::new(),
            remaining: len,
        };
        let mut need = len;
        while need > 0 {
            let c = self.chunks.front_mut().expect("buffered counts the chunks");
            if c.len() <= need {
                need -= c.len();
                msg.chunks
                    .push_back(self.chunks.pop_front().expect("a chunk"));
            } else {
                msg.chunks.push_back(c.split_to(need));
                need = 0;
            }
        }
        if !self.response && msg.chunks.len() > 1 {
            // A request spread over frames is gathered (one copy, as tonic does). Decoded where
            // its pieces lie, a separate mqd took less CPU but accepted 100 KB sends 10-32%
            // slower, with as many page faults and reads but more waits for data
            // (docs/benchmarks.md, "mq-client's deliveries without tonic's copy"); why is not
            // known.
            let mut whole = BytesMut::with_capacity(len);
            for c in msg.chunks.drain(..) {
                whole.extend_from_slice(&c);
            }
            msg.chunks.push_back(whole.freeze());
        }
        Ok(Some(msg))
    }

    /// Buffers a frame's data: a large one as it is, a small one copied into `tail`.
    fn push(&mut self, data: Bytes) {
        self.buffered += data.len();
        if data.len() < COALESCE_BYTES {
            self.tail.extend_from_slice(&data);
            return;
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.chunks.push_back(data);
    }

    /// Drops the first `n` buffered bytes (all in `chunks`).
    fn skip(&mut self, mut n: usize) {
        self.buffered -= n;
        while n > 0 {
            let c = self.chunks.front_mut().expect("buffered counts the chunks");
            let k = c.len().min(n);
            bytes::Buf::advance(c, k);
            n -= k;
            if c.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    /// The next message; `None` at the end (a response's: with an OK status); an error ends
    /// the stream.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        Ok(self.message_with_len().await?.map(|(m, _)| m))
    }

    /// As [`FrameDecoder::message`], with the length of the message's encoding (without its
    /// prefix): what a `bytes` field sliced from it may keep in memory (unknown fields
    /// included, which the decoded message no longer shows).
    pub async fn message_with_len(&mut self) -> Result<Option<(T, usize)>, Status> {
        loop {
            if let Some(raw) = self.take()? {
                let len = raw.remaining;
                const PREFIX: &str = "failed to decode Protobuf message: ";
                // Repeated fields' entries: those nested in another field counted before any
                // is decoded, those at the top as they are (crate::entries).
                if crate::entries::has_nested::<T>() {
                    crate::entries::check_nested::<T, _>(&Pieces::of(&raw))
                        .map_err(|e| e.into_status(PREFIX))?;
                }
                return crate::entries::decode::<T>(raw)
                    .map(|m| Some((m, len)))
                    .map_err(|e| e.into_status(PREFIX));
            }
            if self.ended {
                if self.buffered > 0 {
                    return Err(Status::internal("Unexpected EOF decoding stream."));
                }
                if !self.response {
                    return Ok(None);
                }
                return match &self.status {
                    Some(s) if s.code() == tonic::Code::Ok => Ok(None),
                    Some(s) => Err(s.clone()),
                    None => Err(Status::unknown(
                        "protocol error: missing grpc-status trailer, stream was terminated without a final status",
                    )),
                };
            }
            self.read_frame().await?;
        }
    }

    /// Waits until the next message is all here (not decoded), or the stream ended (`Ok`
    /// either way; the next [`FrameDecoder::message_with_len`] tells which): a stream can
    /// reserve what a message will cost once it has it, holding nothing while its client is
    /// idle or still sending it.
    pub async fn whole(&mut self) -> Result<(), Status> {
        loop {
            if let Some(len) = self.next_len()? {
                if self.buffered >= PREFIX_LEN + len {
                    return Ok(());
                }
            }
            if self.ended {
                return Ok(());
            }
            self.read_frame().await?;
        }
    }

    /// Reads one frame of the body: data is buffered, trailers kept, the end noted.
    async fn read_frame(&mut self) -> Result<(), Status> {
        let body = &mut self.body;
        match std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut *body), cx)).await
        {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => self.push(data),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        self.status = Status::from_header_map(&trailers);
                    }
                }
            },
            Some(Err(status)) => {
                // As tonic: a request stream the client cancelled has ended.
                if !self.response && status.code() == tonic::Code::Cancelled {
                    self.ended = true;
                    return Ok(());
                }
                return Err(status);
            }
            None => self.ended = true,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(sizes: &[usize]) -> v1::SendRequest {
        v1::SendRequest {
            first_seq: 41,
            destination: r".\private$\q".into(),
            transactional: true,
            tx_stream: Bytes::from_static(b"0123456789abcdef"),
            messages: sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| v1::OutMessage {
                    body: (0..n)
                        .map(|i| (i * 31 + k) as u8)
                        .collect::<Vec<u8>>()
                        .into(),
                    label: format!("m{k}"),
                    priority: Some(k as u32 % 8),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_send_request_decodes_as_itself_and_its_large_bodies_are_not_copied() {
        for sizes in [
            &[][..],
            &[0],
            &[SPLIT_BODY_BYTES - 1],
            &[SPLIT_BODY_BYTES],
            &[1, 1_000_000, 7, SPLIT_BODY_BYTES, 300_000, 0],
        ] {
            let req = request(sizes);
            let bodies: Vec<Bytes> = req.messages.iter().map(|m| m.body.clone()).collect();
            let mut out = VecDeque::new();
            encode_send_request(req.clone(), &mut out).unwrap();
            let wire: Vec<u8> = out.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(wire[0], 0, "uncompressed");
            let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, wire.len() - PREFIX_LEN);
            assert_eq!(len, req.encoded_len());
            assert_eq!(v1::SendRequest::decode(&wire[PREFIX_LEN..]).unwrap(), req);
            for b in bodies.iter().filter(|b| b.len() >= SPLIT_BODY_BYTES) {
                assert!(
                    out.iter()
                        .any(|c| c.as_ptr() == b.as_ptr() && c.len() == b.len()),
                    "a {} B body was copied",
                    b.len()
                );
            }
        }
    }

    /// A body of the given frames (data or trailers), then, if `hang`, nothing more (never
    /// ends), else its end.
    struct Frames(VecDeque<Result<http_body::Frame<Bytes>, Status>>, bool);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
            match self.0.pop_front() {
                Some(f) => std::task::Poll::Ready(Some(f)),
                None if self.1 => std::task::Poll::Pending,
                None => std::task::Poll::Ready(None),
            }
        }
    }

    #[test]
    fn a_message_in_pieces_is_walked_where_they_lie() {
        // A SendRequest of 5 empty messages cut into pieces of every size from 1 byte.
        let mut frame = vec![0x08, 0x01];
        for _ in 0..5 {
            frame.extend_from_slice(&[0x1a, 0x00]);
        }
        for size in 1..=frame.len() {
            let msg = MessageBuf {
                chunks: frame.chunks(size).map(Bytes::copy_from_slice).collect(),
                remaining: frame.len(),
            };
            let mut p = Pieces::of(&msg);
            assert_eq!(
                bytes::Buf::copy_to_bytes(&mut p, frame.len()),
                frame[..],
                "pieces of {size}"
            );
            crate::entries::check::<v1::SendRequest, _>(&Pieces::of(&msg)).unwrap();
        }
        let mut over = frame[..2].to_vec();
        for _ in 0..=crate::entries::batch_messages() {
            over.extend_from_slice(&[0x1a, 0x00]);
        }
        let msg = MessageBuf {
            chunks: over.chunks(7).map(Bytes::copy_from_slice).collect(),
            remaining: over.len(),
        };
        let e = crate::entries::check::<v1::SendRequest, _>(&Pieces::of(&msg))
            .unwrap_err()
            .into_status("");
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
    }

    fn framed(m: &impl prost::Message) -> Vec<u8> {
        let body = m.encode_to_vec();
        let mut v = vec![0u8];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }

    fn data(b: &[u8]) -> Result<http_body::Frame<Bytes>, Status> {
        Ok(http_body::Frame::data(Bytes::copy_from_slice(b)))
    }

    fn trailers(s: &Status) -> Result<http_body::Frame<Bytes>, Status> {
        let mut h = tonic::codegen::http::HeaderMap::new();
        s.add_header(&mut h).unwrap();
        Ok(http_body::Frame::trailers(h))
    }

    #[tokio::test]
    async fn tiny_frames_are_copied_together_not_queued_one_by_one() {
        let one = framed(&request(&[100_000]));
        // All but the last byte, one byte per frame: the message is not whole yet.
        let frames = one[..one.len() - 1].iter().map(|b| data(&[*b])).collect();
        let mut d = FrameDecoder::<v1::SendRequest>::request(Frames(frames, true), usize::MAX);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(200), d.message()).await;
        assert!(waited.is_err(), "no message yet");
        assert_eq!(d.buffered, one.len() - 1);
        assert!(d.chunks.is_empty(), "{} queued pieces", d.chunks.len());
        assert_eq!(d.tail.len(), one.len() - 1);
        // The last byte makes it whole.
        let frames = one.iter().map(|b| data(&[*b])).collect();
        let mut d = FrameDecoder::<v1::SendRequest>::request(Frames(frames, false), usize::MAX);
        assert_eq!(d.message().await.unwrap().unwrap(), request(&[100_000]));
        assert!(d.message().await.unwrap().is_none());
    }

    fn response_of(
        frames: Vec<Result<http_body::Frame<Bytes>, Status>>,
    ) -> FrameDecoder<v1::SendRequest> {
        FrameDecoder::response(
            tonic::body::Body::new(Frames(frames.into(), false)),
            1 << 20,
        )
    }

    #[tokio::test]
    async fn a_response_ends_with_the_status_of_its_trailers() {
        let a = request(&[100_000]);
        let b = request(&[5]);
        let wire: Vec<u8> = [framed(&a), framed(&b)].concat();
        // OK: both messages (the large body a slice of its frame), then the end.
        let frame = Bytes::from(wire.clone());
        let mut d = response_of(vec![
            Ok(http_body::Frame::data(frame.clone())),
            trailers(&Status::ok("")),
        ]);
        let got = d.message().await.unwrap().unwrap();
        assert_eq!(got, a);
        let p = got.messages[0].body.as_ptr() as usize;
        assert!(p >= frame.as_ptr() as usize && p < frame.as_ptr() as usize + frame.len());
        assert_eq!(d.message().await.unwrap().unwrap(), b);
        assert!(d.message().await.unwrap().is_none());
        // An error status: the messages before it, then the error, its details kept.
        let mut d = response_of(vec![
            data(&wire[..10]),
            data(&wire[10..]),
            trailers(&Status::with_details(
                tonic::Code::NotFound,
                "the queue was deleted",
                Bytes::from_static(b"details"),
            )),
        ]);
        assert_eq!(d.message().await.unwrap().unwrap(), a);
        assert_eq!(d.message().await.unwrap().unwrap(), b);
        let e = d.message().await.unwrap_err();
        assert_eq!(
            (e.code(), e.message(), e.details()),
            (
                tonic::Code::NotFound,
                "the queue was deleted",
                &b"details"[..]
            )
        );
        // No trailers: UNKNOWN, as tonic; cut short: INTERNAL.
        let mut d = response_of(vec![data(&wire)]);
        d.message().await.unwrap();
        d.message().await.unwrap();
        assert_eq!(d.message().await.unwrap_err().code(), tonic::Code::Unknown);
        let mut d = response_of(vec![
            data(&wire[..wire.len() - 1]),
            trailers(&Status::ok("")),
        ]);
        d.message().await.unwrap();
        let e = d.message().await.unwrap_err();
        assert_eq!(e.message(), "Unexpected EOF decoding stream.");
        // A cancelled response body is an error, not an end (a request's is an end).
        let mut d = response_of(vec![Err(Status::cancelled("reset"))]);
        assert_eq!(
            d.message().await.unwrap_err().code(),
            tonic::Code::Cancelled
        );
    }

    #[tokio::test]
    async fn a_response_body_in_a_frame_of_its_own_is_not_copied_a_request_is_gathered() {
        // As mq writes them: the fields around a large body in one piece, the body in its own.
        let big = Bytes::from(vec![3u8; 100_000]);
        let req = v1::SendRequest {
            messages: vec![v1::OutMessage {
                body: big.clone(),
                label: "x".into(),
                ..Default::default()
            }],
            ..request(&[])
        };
        let mut out = VecDeque::new();
        encode_send_request(req.clone(), &mut out).unwrap();
        assert!(out.len() >= 3, "head, body, rest");
        let frames = || -> Vec<_> {
            out.iter()
                .map(|c| Ok(http_body::Frame::data(c.clone())))
                .collect()
        };
        // A response (mq-client's deliveries): decoded where the pieces lie.
        let mut d = response_of(frames());
        let got = d.message().await.unwrap().unwrap();
        assert_eq!(got, req);
        assert_eq!(
            got.messages[0].body.as_ptr(),
            big.as_ptr(),
            "the body was copied"
        );
        // A request (mqd's sends) spread over frames is gathered: the same message, a copy.
        let mut d =
            FrameDecoder::<v1::SendRequest>::request(Frames(frames().into(), false), usize::MAX);
        let got = d.message().await.unwrap().unwrap();
        assert_eq!(got, req);
        assert_ne!(got.messages[0].body.as_ptr(), big.as_ptr(), "not gathered");
    }
}
