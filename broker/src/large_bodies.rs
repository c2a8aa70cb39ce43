//! Large bodies through mqd's gRPC service without tonic's copies, both ways.
//!
//! **Out (Receive).** tonic's server encodes every response message into one contiguous buffer
//! of its own (`EncodeBuf`, a `BytesMut`), so each delivered body was copied once more on its
//! way out: for 1 MB express bodies that copy (`Message::encode_raw`) was 13% of mqd's CPU
//! (docs/benchmarks.md, "Large bodies without tonic's copies"). The body of a stored message is
//! already a `Bytes` (a slice of the queue's memory or of a journal read), and h2 sends a data
//! chunk of 256 bytes or more as its own piece of a vectored write. So the Receive call's
//! response is encoded here instead ([`encode_response`]): the protobuf around each large body
//! goes into a small buffer, and the body itself follows as its own chunk, the same `Bytes`.
//! The bytes on the wire are exactly prost's encoding of the same `ReceiveResponse` in gRPC's
//! length-prefixed framing (uncompressed), chunked differently (tested below).
//!
//! **In (Send).** tonic's request decoder copies every HTTP/2 DATA frame into one contiguous
//! buffer before it decodes (`StreamingInner::poll_frame`), and for 1 MB bodies into freshly
//! allocated memory: with its page faults, the largest share of mqd's CPU in an express 1 MB
//! send. The frames h2 hands over are already `Bytes`, and a client's 1 MB message usually
//! arrives in one frame (mqd allows 1 MiB frames). [`FrameDecoder`] reads gRPC messages from the
//! frames as they are: a message within one frame is decoded from that frame's bytes (prost
//! takes a `bytes` field as a slice: the body is not copied); one spread over several frames is
//! gathered into one buffer first, as tonic does; frames under 4 KiB are copied together as
//! they come (a client sending a message a byte per frame costs its bytes, not a queued `Bytes`
//! per frame). Bounds and refusals are tonic's: a message over the limit is refused
//! (OUT_OF_RANGE) from its 5-byte prefix, before its bytes are read; a compressed-flag without
//! `grpc-encoding`, a bad flag, a truncated stream and undecodable bytes are INTERNAL, with
//! tonic's words.
//!
//! Every other call, and a Send or Receive whose request carries `grpc-encoding`, goes to
//! tonic as before.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use mq_proto::chunked::{self, FrameDecoder, SPLIT_BODY_BYTES};
use mq_proto::codec::MqCodec;
use mq_proto::v1;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;
use tonic::Status;

use crate::service::Service;

/// The Receive method's HTTP/2 path.
pub(crate) const RECEIVE_PATH: &str = "/mq.v1.MessageQueueService/Receive";

/// The Send method's HTTP/2 path.
pub(crate) const SEND_PATH: &str = "/mq.v1.MessageQueueService/Send";
/// The unary calls whose answers carry bodies (`unsent::AnswerHold`).
const PEEK_PATH: &str = "/mq.v1.MessageQueueService/Peek";
const RECEIVE_ONE_PATH: &str = "/mq.v1.MessageQueueService/ReceiveOne";

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Appends `resp` to `out` as one gRPC message (uncompressed): the chunks, in order, are the
/// 5-byte prefix and prost's encoding of `resp`, with each body of at least
/// [`SPLIT_BODY_BYTES`] its own chunk (that very `Bytes`). Refuses (OUT_OF_RANGE, as tonic does)
/// a message longer than `limit` bytes.
pub(crate) fn encode_response(
    resp: v1::ReceiveResponse,
    limit: usize,
    out: &mut VecDeque<Bytes>,
) -> Result<(), Status> {
    let split: usize = resp
        .messages
        .iter()
        .filter_map(|d| d.message.as_ref())
        .map(|m| m.body.len())
        .filter(|&n| n >= SPLIT_BODY_BYTES)
        .sum();
    // Everything but the split bodies, in one allocation.
    let mut head = buffer_within(resp.encoded_len(), split, limit)?;
    for d in resp.messages {
        encode_key(1, WireType::LengthDelimited, &mut head);
        encode_varint(d.encoded_len() as u64, &mut head);
        if d.message
            .as_ref()
            .is_none_or(|m| m.body.len() < SPLIT_BODY_BYTES)
        {
            d.encode_raw(&mut head);
            continue;
        }
        let v1::Delivered { tag, message } = d;
        let mut m = message.expect("a message with a large body");
        // prost's order: Delivered.tag (1), Delivered.message (2): Message.id (1),
        // Message.body (2), then the rest of Message's fields (3 and up).
        if tag != 0 {
            prost::encoding::uint64::encode(1, &tag, &mut head);
        }
        encode_key(2, WireType::LengthDelimited, &mut head);
        encode_varint(m.encoded_len() as u64, &mut head);
        let id = std::mem::take(&mut m.id);
        if !id.is_empty() {
            prost::encoding::bytes::encode(1, &id, &mut head);
        }
        chunked::push_body(2, std::mem::take(&mut m.body), &mut head, out);
        m.encode_raw(&mut head);
    }
    if !head.is_empty() {
        out.push_back(head.freeze());
    }
    Ok(())
}

/// [`encode_response`], each chunk holding the delivery's count against its stream's and
/// connection's budgets of deliveries not yet written (`crate::unsent`) until HTTP/2 has
/// written it and drops it.
pub(crate) fn encode_counted(
    (resp, count): crate::service::Delivery,
    limit: usize,
    out: &mut VecDeque<Bytes>,
) -> Result<(), Status> {
    let first = out.len();
    encode_response(resp, limit, out)?;
    for chunk in out.iter_mut().skip(first) {
        *chunk = crate::unsent::hold(std::mem::take(chunk), &count);
    }
    Ok(())
}

/// [`chunked::message_buffer`] for a message of `len` bytes, refused (OUT_OF_RANGE, with
/// tonic's words) over `limit`.
fn buffer_within(len: usize, split: usize, limit: usize) -> Result<BytesMut, Status> {
    chunked::message_buffer(len, split)
        .filter(|_| len <= limit)
        .ok_or_else(|| {
            Status::out_of_range(format!(
                "Error, encoded message length too large: found {len} bytes, the limit is: {limit} bytes"
            ))
        })
}

/// The trailers that end a gRPC response with `status`.
fn trailers(status: &Status) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    if status.add_header(&mut h).is_err() {
        // A message that cannot be a header value: the code alone.
        h.clear();
        h.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
    h
}

/// Appends `resp` to `out` as one gRPC message, encoded by prost into one buffer (what tonic
/// does; for answers without large bodies).
pub(crate) fn encode_plain<T: prost::Message>(
    resp: T,
    limit: usize,
    out: &mut VecDeque<Bytes>,
) -> Result<(), Status> {
    let mut buf = buffer_within(resp.encoded_len(), 0, limit)?;
    resp.encode_raw(&mut buf);
    out.push_back(buf.freeze());
    Ok(())
}

/// How a [`ResponseBody`] encodes its messages: [`encode_response`] or [`encode_plain`].
type Encode<T> = fn(T, usize, &mut VecDeque<Bytes>) -> Result<(), Status>;

/// The response body of a streaming call: the stream's messages (`encode`), then the
/// trailers with the stream's status (OK when it ends, the error that ended it otherwise).
pub(crate) struct ResponseBody<T> {
    stream: Option<BoxStream<T>>,
    chunks: VecDeque<Bytes>,
    limit: usize,
    encode: Encode<T>,
}

impl<T> ResponseBody<T> {
    pub(crate) fn new(stream: BoxStream<T>, limit: usize, encode: Encode<T>) -> Self {
        ResponseBody {
            stream: Some(stream),
            chunks: VecDeque::new(),
            limit,
            encode,
        }
    }
}

impl<T> http_body::Body for ResponseBody<T> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(c) = this.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(c))));
        }
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let end = match std::task::ready!(stream.as_mut().poll_next(cx)) {
            Some(Ok(resp)) => match (this.encode)(resp, this.limit, &mut this.chunks) {
                Ok(()) => {
                    let c = this.chunks.pop_front().expect("a message has its prefix");
                    return Poll::Ready(Some(Ok(Frame::data(c))));
                }
                Err(status) => status,
            },
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        // Dropping the stream ends the call on the broker's side (its deliveries go back).
        this.stream = None;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&end)))))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none() && self.chunks.is_empty()
    }
}

/// Where a Send call's requests come from: tonic's `Streaming`, or [`FrameDecoder`]; either way
/// with [`own_small_bodies`] applied.
pub(crate) trait Inbound: Send + 'static {
    /// Whether [`Inbound::whole`] tells when the next request has arrived.
    const TELLS_ARRIVAL: bool;
    /// Waits until the next request is all here (not decoded) or the requests ended; an
    /// error ends the stream as [`Inbound::message`]'s do.
    fn whole(&mut self) -> impl Future<Output = Result<(), Status>> + Send;
    /// The next request; `None` at the end of the requests; an error ends the stream.
    fn message(&mut self) -> impl Future<Output = Result<Option<v1::SendRequest>, Status>> + Send;
}

impl Inbound for Streaming<v1::SendRequest> {
    const TELLS_ARRIVAL: bool = false;
    async fn whole(&mut self) -> Result<(), Status> {
        Ok(())
    }
    async fn message(&mut self) -> Result<Option<v1::SendRequest>, Status> {
        // tonic's decoder (a compressed Send) does not tell the length it decoded, but it
        // compacts a request with many unknown bytes (`mq_proto::codec::compacted`), so the
        // request's own encoding stands for the buffer its bodies are sliced from.
        Ok(Streaming::message(self).await?.map(|mut req| {
            let len = tonic_buffer_len(req.encoded_len());
            own_small_bodies(&mut req.messages, len);
            req
        }))
    }
}

impl Inbound for FrameDecoder<v1::SendRequest> {
    const TELLS_ARRIVAL: bool = true;
    async fn whole(&mut self) -> Result<(), Status> {
        FrameDecoder::whole(self).await
    }
    async fn message(&mut self) -> Result<Option<v1::SendRequest>, Status> {
        Ok(self.message_with_len().await?.map(|(mut req, len)| {
            own_small_bodies(&mut req.messages, len);
            req
        }))
    }
}

/// How many times the bytes it is charged (bodies and [`crate::config::MESSAGE_OVERHEAD_BYTES`]
/// each) a request's small bodies may keep in memory.
pub(crate) const PINNED_SHARE: usize = 16;

/// A decoded body is a slice of the buffer its request arrived in (`len` bytes: the request's
/// encoding) and keeps all of it for as long as it waits in a queue, even when every other
/// body of its batch was received long ago (by id, by priority, from another queue of a
/// multiple-destination batch). So no body may keep more than `PINNED_SHARE` times what it is
/// charged (its length plus [`crate::config::MESSAGE_OVERHEAD_BYTES`]): a body charged less
/// than `len / PINNED_SHARE` is copied out, into chunks shared by consecutive such bodies,
/// each chunk at most `PINNED_SHARE` times the smallest charge among its bodies. One byte sent
/// with megabytes of padding, or one message left behind by a batch of 512, keeps at most
/// `PINNED_SHARE` × 129 bytes of buffer while the quotas count 129. No chunk is over
/// [`CHUNK_BYTES`], so the allocator page that a chunk keeps resident is a small one (64 KiB
/// with mimalloc), not the 512 KiB of a medium block. Bodies large beside their request (a 1 MB
/// body alone, ten 100 KB bodies in a 1 MiB batch) stay where they are, uncopied.
pub(crate) fn own_small_bodies(messages: &mut [v1::OutMessage], len: usize) {
    own_small(messages, |m| Some(&mut m.body), len);
}

/// [`own_small_bodies`] for a forwarded batch (`len`: its encoded length; tonic's decoder does
/// not tell the length it read; it compacts a batch with many unknown bytes,
/// `mq_proto::codec::compacted`, so the encoded length stands for that buffer).
pub(crate) fn own_small_forwarded_bodies(req: &mut v1::ForwardRequest) {
    let len = tonic_buffer_len(req.encoded_len());
    own_small(
        &mut req.messages,
        |m| m.message.as_mut().map(|m| &mut m.body),
        len,
    );
}

/// The bytes a body decoded by tonic keeps: its request's known encoding (a request with many
/// unknown bytes was decoded again from a compact copy, `mq_proto::codec::compacted`), and at
/// least tonic's receive buffer. tonic reads frames into a buffer of at least
/// [`mq_proto::codec::COMPACT_ABOVE`] (8 KiB), shared by the frames that fit in it, so a small
/// frame's body keeps that much. 8,192 one-byte transactional sends, each framed with 6 KiB of
/// unknown bytes (under the codec's threshold), kept +82 MiB while charged 1 MiB.
pub(crate) fn tonic_buffer_len(encoded_len: usize) -> usize {
    encoded_len.max(mq_proto::codec::COMPACT_ABOVE)
}

fn own_small<M>(items: &mut [M], body: impl FnMut(&mut M) -> Option<&mut Bytes>, len: usize) {
    let charged = |b: &Bytes| b.len() + crate::config::MESSAGE_OVERHEAD_BYTES as usize;
    let mut chunk = Chunk::default();
    for b in items.iter_mut().filter_map(body) {
        // An empty body is `Bytes::new()`: it keeps nothing.
        if b.is_empty() || charged(b).saturating_mul(PINNED_SHARE) >= len {
            continue;
        }
        let room = (chunk.least_charged.min(charged(b)) * PINNED_SHARE).min(CHUNK_BYTES);
        if chunk.len + b.len() > room {
            chunk.copy_out();
        }
        chunk.least_charged = chunk.least_charged.min(charged(b));
        chunk.len += b.len();
        chunk.bodies.push(b);
    }
    chunk.copy_out();
}

/// Most bytes copied into one chunk: small enough to be one of mimalloc's small blocks (at most
/// 10 KiB, kept in 64 KiB pages). A chunk is freed only with the last of its bodies, and a live
/// block keeps its allocator page resident: a 64 KiB chunk is a medium block of a 512 KiB page,
/// so 128 bodies left behind by their batches kept +75-80 MiB of RSS with 64 KiB chunks, +21
/// MiB with these (`large_deliveries::a_body_left_behind_by_its_batch_keeps_little`).
const CHUNK_BYTES: usize = 8 * 1024;

/// Bodies to be copied together into one allocation of `len` bytes.
struct Chunk<'a> {
    bodies: Vec<&'a mut Bytes>,
    len: usize,
    least_charged: usize,
}

impl Default for Chunk<'_> {
    fn default() -> Self {
        Chunk {
            bodies: Vec::new(),
            len: 0,
            least_charged: usize::MAX,
        }
    }
}

impl Chunk<'_> {
    /// Copies the bodies into one new buffer, each becoming its slice; starts a new chunk.
    fn copy_out(&mut self) {
        if !self.bodies.is_empty() {
            let mut buf = BytesMut::with_capacity(self.len);
            for b in &self.bodies {
                buf.extend_from_slice(b);
            }
            let mut all = buf.freeze();
            for b in self.bodies.drain(..) {
                *b = all.split_to(b.len());
            }
        }
        self.len = 0;
        self.least_charged = usize::MAX;
    }
}

/// In front of the generated `MessageQueueService` server: answers Receive calls with a
/// [`ResponseBody`] of [`encode_response`], reads Send calls' requests with a [`FrameDecoder`],
/// and passes every other call (and a compressed Send or Receive) to `inner`.
#[derive(Debug, Clone)]
pub(crate) struct LargeBodies<S> {
    inner: S,
    service: Service,
    /// The largest message decoded or encoded (the server's `max_*_message_size`).
    limit: usize,
}

impl<S> LargeBodies<S> {
    pub(crate) fn new(inner: S, service: Service, limit: usize) -> Self {
        LargeBodies {
            inner,
            service,
            limit,
        }
    }
}

impl<S: NamedService> NamedService for LargeBodies<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for LargeBodies<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        if path == PEEK_PATH || path == RECEIVE_ONE_PATH {
            // Their answers hold their connection's budget until written (`unsent::AnswerHold`),
            // and a ReceiveOne's message stays taken until then (`taken::AnswerTaken`).
            let answer = self.inner.call(req);
            return Box::pin(async move {
                let mut resp = answer.await?;
                let hold = resp.extensions_mut().remove::<crate::unsent::AnswerHold>();
                let taken = resp.extensions_mut().remove::<crate::taken::AnswerTaken>();
                if hold.is_none() && taken.is_none() {
                    return Ok(resp);
                }
                Ok(resp.map(|body| {
                    tonic::body::Body::new(HeldBody {
                        body,
                        hold,
                        taken,
                        last_byte: None,
                    })
                }))
            });
        }
        let ours = (path == RECEIVE_PATH || path == SEND_PATH)
            && !req.headers().contains_key("grpc-encoding");
        if !ours {
            return Box::pin(self.inner.call(req));
        }
        let service = self.service.clone();
        let limit = self.limit;
        if path == SEND_PATH {
            return Box::pin(async move {
                let req =
                    tonic::Request::from_http(req.map(|body| FrameDecoder::request(body, limit)));
                Ok(answer(
                    service.send_from(req).await,
                    limit,
                    encode_plain::<v1::SendResponse>,
                ))
            });
        }
        Box::pin(async move {
            let decoder = MqCodec::<v1::ReceiveResponse, v1::ReceiveRequest>::default().decoder();
            let req = tonic::Request::from_http(
                req.map(|body| Streaming::new_request(decoder, body, None, Some(limit))),
            );
            Ok(answer(
                service.receive_counted(req).await,
                limit,
                encode_counted,
            ))
        })
    }
}

/// The largest answer chunk a ReceiveOne's [`HeldBody`] does not split: HTTP/2's default
/// initial window (RFC 9113 §6.9.2).
const SPLIT_ABOVE: usize = 65_535;

/// A unary answer's body with its count ([`crate::unsent::AnswerHold`]), given back when
/// HTTP/2 drops the body, and the message a ReceiveOne took ([`crate::taken::AnswerTaken`]):
/// received once the client's window has had room for the whole answer and its trailers say
/// OK, back in its queue if the body is dropped before.
///
/// hyper hands a DATA chunk to HTTP/2 as soon as the stream has room for one byte of it, and
/// then asks for the next frame at once: it would ask for the trailers with the whole answer
/// still buffered (a client with a 64 KiB window that reset a 1 MB answer lost its message,
/// helper-78). So while a message rides, a chunk larger than HTTP/2's default window
/// ([`SPLIT_ABOVE`]) goes out without its last byte, and that byte as a chunk of its own: hyper
/// hands it over only once the stream's window covers every byte buffered before it (h2's
/// `capacity()`), and only then asks for the trailers. A smaller chunk fits any window a client
/// has not shrunk below the default, and is not split: the split costs a wake-up of the
/// answer's task and a second write (one-at-a-time recoverable receives of 1000 B: -8% to -23%).
struct HeldBody {
    body: tonic::body::Body,
    #[allow(dead_code)]
    hold: Option<crate::unsent::AnswerHold>,
    taken: Option<crate::taken::AnswerTaken>,
    /// The last byte of the chunk just given, to give next.
    last_byte: Option<Bytes>,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(b) = self.last_byte.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(b))));
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if self.taken.is_none() {
            return polled;
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(mut data) => {
                        if data.len() > SPLIT_ABOVE {
                            self.last_byte = Some(data.split_off(data.len() - 1));
                        }
                        return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
                    }
                    Err(frame) => frame,
                };
                // The answer's trailers: received if they say OK (an answer tonic could not
                // encode ends with an error status: the message goes back).
                let ok = frame
                    .trailers_ref()
                    .and_then(|t| t.get("grpc-status"))
                    .is_some_and(|v| v.as_bytes() == b"0");
                if ok {
                    if let Some(taken) = self.taken.take() {
                        taken.keep();
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.last_byte.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The HTTP response of a streaming call: the refusal (trailers only), or the stream's
/// messages in a [`ResponseBody`] after the handler's metadata.
fn answer<T: Send + 'static>(
    resp: Result<tonic::Response<BoxStream<T>>, Status>,
    limit: usize,
    encode: Encode<T>,
) -> http::Response<tonic::body::Body> {
    let resp = match resp {
        Ok(r) => r,
        Err(status) => return status.into_http(),
    };
    let (metadata, stream, extensions) = resp.into_parts();
    let mut http = http::Response::new(tonic::body::Body::new(ResponseBody::new(
        stream, limit, encode,
    )));
    *http.headers_mut() = metadata.into_headers();
    http.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    *http.extensions_mut() = extensions;
    http
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use mq_proto::chunked::PREFIX_LEN;
    use proptest::strategy::Strategy as _;

    fn message(id: &[u8], body: Bytes, label: &str) -> v1::Message {
        v1::Message {
            id: Bytes::copy_from_slice(id),
            body,
            label: label.into(),
            priority: 3,
            ..Default::default()
        }
    }

    fn joined(chunks: &VecDeque<Bytes>) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }

    /// `encoded` as one uncompressed gRPC message: the 5-byte prefix, then the bytes.
    fn grpc_framed(encoded: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        v.extend_from_slice(encoded);
        v
    }

    /// `m` encoded by prost, framed.
    fn framed(m: &impl prost::Message) -> Vec<u8> {
        grpc_framed(&m.encode_to_vec())
    }

    #[test]
    fn the_bytes_are_prosts_and_large_bodies_are_not_copied() {
        let big = Bytes::from(vec![7u8; SPLIT_BODY_BYTES]);
        let bigger = Bytes::from((0..300_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let small = Bytes::from(vec![1u8; SPLIT_BODY_BYTES - 1]);
        let cases = vec![
            vec![],
            vec![(0, None)],
            vec![(1, Some(message(b"0123456789abcdef", small.clone(), "s")))],
            vec![(2, Some(message(b"0123456789abcdef", big.clone(), "big")))],
            vec![
                (0, Some(message(b"", bigger.clone(), ""))),
                (3, Some(message(b"x", Bytes::new(), "empty"))),
                (4, Some(message(b"0123456789abcdef", big.clone(), "a"))),
                (5, Some(message(b"0123456789abcdef", small.clone(), "b"))),
                (6, Some(message(b"0123456789abcdef", bigger.clone(), "c"))),
            ],
        ];
        for case in cases {
            let resp = v1::ReceiveResponse {
                messages: case
                    .into_iter()
                    .map(|(tag, message)| v1::Delivered { tag, message })
                    .collect(),
            };
            let want = framed(&resp);
            let bodies: Vec<Bytes> = resp
                .messages
                .iter()
                .filter_map(|d| d.message.as_ref())
                .map(|m| m.body.clone())
                .filter(|b| b.len() >= SPLIT_BODY_BYTES)
                .collect();
            let mut out = VecDeque::new();
            encode_response(resp.clone(), usize::MAX, &mut out).unwrap();
            assert_eq!(joined(&out), want, "{resp:?}");
            // Every large body is one of the chunks, the same memory (no copy).
            for b in &bodies {
                assert!(
                    out.iter()
                        .any(|c| c.as_ptr() == b.as_ptr() && c.len() == b.len()),
                    "a {} B body was copied",
                    b.len()
                );
            }
            // And it decodes back to the same response.
            let j = joined(&out);
            assert_eq!(v1::ReceiveResponse::decode(&j[PREFIX_LEN..]).unwrap(), resp);
        }
    }

    #[test]
    fn a_message_over_the_limit_is_refused_as_tonic_does() {
        let resp = v1::ReceiveResponse {
            messages: vec![v1::Delivered {
                tag: 1,
                message: Some(message(b"id", Bytes::from(vec![0u8; 100_000]), "")),
            }],
        };
        let len = resp.encoded_len();
        let mut out = VecDeque::new();
        let e = encode_response(resp.clone(), len - 1, &mut out).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(out.is_empty());
        encode_response(resp, len, &mut out).unwrap();
        assert!(!out.is_empty());
    }

    async fn frames(body: ResponseBody<v1::ReceiveResponse>) -> (Vec<u8>, http::HeaderMap) {
        let mut data = Vec::new();
        let mut trailers = None;
        let mut body = std::pin::pin!(body);
        while let Some(f) = futures::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let f = f.unwrap();
            assert!(trailers.is_none(), "a frame after the trailers");
            match f.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = Some(f.into_trailers().unwrap()),
            }
        }
        (data, trailers.expect("trailers"))
    }

    #[tokio::test]
    async fn the_body_ends_with_ok_or_with_the_error_that_ended_the_stream() {
        let one = v1::ReceiveResponse {
            messages: vec![v1::Delivered {
                tag: 1,
                message: Some(message(b"id", Bytes::from(vec![9u8; 40_000]), "l")),
            }],
        };
        let ok: BoxStream<v1::ReceiveResponse> = Box::pin(futures::stream::iter(vec![
            Ok(one.clone()),
            Ok(one.clone()),
        ]));
        let (data, t) = frames(ResponseBody::new(ok, usize::MAX, encode_response)).await;
        let mut want = framed(&one);
        want.extend(framed(&one));
        assert_eq!(data, want);
        assert_eq!(t.get("grpc-status").unwrap(), "0");

        let failing: BoxStream<v1::ReceiveResponse> = Box::pin(futures::stream::iter(vec![
            Ok(one.clone()),
            Err(Status::not_found("the queue was deleted")),
            Ok(one.clone()),
        ]));
        let (data, t) = frames(ResponseBody::new(failing, usize::MAX, encode_response)).await;
        assert_eq!(data, framed(&one));
        let s = Status::from_header_map(&t).unwrap();
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert_eq!(s.message(), "the queue was deleted");

        let too_big: BoxStream<v1::ReceiveResponse> =
            Box::pin(futures::stream::iter(vec![Ok(one.clone())]));
        let (data, t) = frames(ResponseBody::new(too_big, 1000, encode_response)).await;
        assert!(data.is_empty());
        assert_eq!(
            Status::from_header_map(&t).unwrap().code(),
            tonic::Code::OutOfRange
        );
    }

    /// A request body of the given pieces (data, or an error), in order.
    struct Pieces(VecDeque<Result<Bytes, Status>>);

    impl http_body::Body for Pieces {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front().map(|r| r.map(Frame::data)))
        }
    }

    fn send_request(i: usize, sizes: &[usize]) -> v1::SendRequest {
        v1::SendRequest {
            destination: format!("q{i}"),
            first_seq: i as u64,
            messages: sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| v1::OutMessage {
                    body: Bytes::from(vec![(i * 7 + k) as u8; n]),
                    label: format!("m{k}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    async fn decode_all(
        pieces: Vec<Result<Bytes, Status>>,
        limit: usize,
    ) -> (Vec<v1::SendRequest>, Result<(), Status>) {
        let mut d = FrameDecoder::<v1::SendRequest>::request(Pieces(pieces.into()), limit);
        let mut got = Vec::new();
        loop {
            match Inbound::message(&mut d).await {
                Ok(Some(m)) => got.push(m),
                Ok(None) => return (got, Ok(())),
                Err(e) => return (got, Err(e)),
            }
        }
    }

    #[tokio::test]
    async fn requests_cut_anywhere_into_frames_decode_and_whole_ones_are_not_copied() {
        let msgs = vec![
            send_request(0, &[100_000]),
            send_request(1, &[]),
            send_request(2, &[10, 20_000, 0, 5]),
            send_request(3, &[1_000_000]),
        ];
        let wire: Vec<u8> = msgs.iter().flat_map(framed).collect();
        // Cut at every size from 1 byte to the whole, and at each message's boundary.
        // (cut points, whether every message lies within one piece)
        let mut cuts: Vec<(Vec<usize>, bool)> =
            [1usize, 2, 3, 4, 5, 6, 7, 1000, 16_384, 65_536, 1 << 20]
                .iter()
                .map(|&step| ((step..wire.len()).step_by(step).collect(), false))
                .collect();
        let mut at = 0;
        cuts.push((
            msgs.iter()
                .map(|m| {
                    at += framed(m).len();
                    at
                })
                .filter(|&a| a < wire.len())
                .collect(),
            true,
        ));
        cuts.push((Vec::new(), true));
        for (cut, whole_messages) in cuts {
            let mut pieces = Vec::new();
            let mut from = 0;
            for &c in cut.iter().chain(std::iter::once(&wire.len())) {
                pieces.push(Ok(Bytes::copy_from_slice(&wire[from..c])));
                from = c;
            }
            let whole: Vec<Bytes> = pieces.iter().map(|p| p.clone().unwrap()).collect();
            let (got, end) = decode_all(pieces, usize::MAX).await;
            assert!(end.is_ok(), "{end:?}");
            assert_eq!(got, msgs, "cut every {:?}", cut.first());
            // A body whose message lies within one frame is a slice of that frame, but the
            // 10 B and 5 B bodies beside 20,000 B are copied (`own_small_bodies`).
            if whole_messages {
                for (i, m) in got.iter().enumerate() {
                    for (k, b) in m.messages.iter().map(|m| &m.body).enumerate() {
                        if b.is_empty() {
                            continue;
                        }
                        let copied = i == 2 && (k == 0 || k == 3);
                        assert_eq!(within(b, &whole), !copied, "body {k} of request {i}");
                    }
                }
            }
        }
    }

    /// Whether `b` lies within one of `bufs`.
    fn within(b: &Bytes, bufs: &[Bytes]) -> bool {
        let p = b.as_ptr() as usize;
        bufs.iter().any(|w| {
            let s = w.as_ptr() as usize;
            p >= s && p + b.len() <= s + w.len()
        })
    }

    /// `req` encoded with `pad` bytes of a field mqd does not know (prost skips it, so the
    /// decoded request does not show it), framed.
    fn framed_padded(req: &v1::SendRequest, pad: usize) -> Vec<u8> {
        let mut m = req.encode_to_vec();
        let mut unknown = BytesMut::new();
        prost::encoding::bytes::encode(1000, &vec![7u8; pad], &mut unknown);
        m.extend_from_slice(&unknown);
        grpc_framed(&m)
    }

    #[tokio::test]
    async fn small_bodies_do_not_keep_a_padded_or_lopsided_request_in_memory() {
        let one = send_request(0, &[1]);
        let batch = send_request(1, &[100; 64]);
        let lopsided = send_request(2, &[3, 1_000_000]);
        let mut wire = framed_padded(&one, 1 << 20);
        wire.extend_from_slice(&framed_padded(&batch, 1 << 20));
        wire.extend_from_slice(&framed(&lopsided));
        wire.extend_from_slice(&framed(&batch));
        let whole = [Bytes::from(wire)];
        let (got, end) = decode_all(vec![Ok(whole[0].clone())], usize::MAX).await;
        assert!(end.is_ok(), "{end:?}");
        assert_eq!(got, vec![one, batch.clone(), lopsided, batch]);
        // One byte with a MiB of padding, a batch with a MiB of padding, 3 B beside 1 MB: copied.
        assert!(!within(&got[0].messages[0].body, &whole), "1 B keeps 1 MiB");
        for m in &got[1].messages {
            assert!(!within(&m.body, &whole), "100 B keeps a padded batch");
        }
        assert!(!within(&got[2].messages[0].body, &whole), "3 B keeps 1 MB");
        // Large bodies are not copied.
        assert!(within(&got[2].messages[1].body, &whole), "1 MB was copied");
        // A batch of 100 B bodies that is its own request is copied too (one of them may be
        // all that is left of it), in two chunks: 36 bodies (3,600 B, at most 16 × 228) and 28.
        for m in &got[3].messages {
            assert!(!within(&m.body, &whole), "a 100 B body keeps its batch");
        }
        assert_eq!(chunks(&got[3].messages), [(3_600, 228), (2_800, 228)]);
    }

    /// The runs of consecutive bodies that lie one after another in memory (one copied chunk;
    /// two allocations are not adjacent: the test allocator puts a header between them): each
    /// run's bytes and the least charge of its bodies.
    fn chunks(messages: &[v1::OutMessage]) -> Vec<(usize, usize)> {
        let overhead = crate::config::MESSAGE_OVERHEAD_BYTES as usize;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut end = 0usize;
        for b in messages.iter().map(|m| &m.body).filter(|b| !b.is_empty()) {
            let charged = b.len() + overhead;
            match runs.last_mut() {
                Some((len, least)) if b.as_ptr() as usize == end => {
                    *len += b.len();
                    *least = (*least).min(charged);
                }
                _ => runs.push((b.len(), charged)),
            }
            end = b.as_ptr() as usize + b.len();
        }
        runs
    }

    #[test]
    fn no_body_keeps_more_than_its_share_of_a_batch() {
        // A client's batch of 512 bodies of 1000 B: any one of them may be left behind alone,
        // so each keeps at most 16 × 1,128 B, not the 512 KB request.
        let mut sizes = vec![1000; 512];
        // Mixed sizes: the 1 B body's chunk is held to 16 × 129 B; 64 KB stays in place.
        sizes[100] = 1;
        sizes[200] = 64_000;
        let req = send_request(0, &sizes);
        let wire = Bytes::from(req.encode_to_vec());
        let mut got = v1::SendRequest::decode(wire.clone()).unwrap();
        own_small_bodies(&mut got.messages, wire.len());
        assert_eq!(got, req, "the bodies' bytes are unchanged");
        let whole = [wire];
        for (k, m) in got.messages.iter().enumerate() {
            assert_eq!(within(&m.body, &whole), k == 200, "body {k}");
        }
        let runs = chunks(&got.messages);
        for &(len, least) in &runs {
            assert!(
                len <= PINNED_SHARE * least,
                "a chunk of {len} B for {least} B"
            );
        }
        assert_eq!(
            runs.iter().map(|r| r.0).sum::<usize>(),
            510 * 1000 + 1 + 64_000
        );
        // No chunk over CHUNK_BYTES (the 64 KB body is its request's, uncopied); full ones of 8
        // bodies: about 512 / 8 allocations, not one per body.
        assert!(
            runs.iter()
                .all(|&(len, _)| len <= CHUNK_BYTES || len == 64_000),
            "{runs:?}"
        );
        assert!(runs.len() <= 70, "{} chunks", runs.len());
        // The 1 B body ends a chunk of 1000 B bodies and starts one of 16 × 129 B at most.
        assert!(runs.contains(&(2_001, 129)), "{runs:?}");

        // Ten 100 KB bodies (a 1 MiB batch): each is more than 1/16 of it; none is copied.
        let req = send_request(1, &[100_000; 10]);
        let wire = Bytes::from(req.encode_to_vec());
        let mut got = v1::SendRequest::decode(wire.clone()).unwrap();
        own_small_bodies(&mut got.messages, wire.len());
        let whole = [wire];
        assert!(got.messages.iter().all(|m| within(&m.body, &whole)));
    }

    #[test]
    fn a_forwarded_small_body_beside_a_large_one_is_copied() {
        let fwd = |n: usize| v1::ForwardedMessage {
            seq: n as u64,
            message: Some(v1::Message {
                body: Bytes::from(vec![1u8; n]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut req = v1::ForwardRequest {
            messages: vec![fwd(3), fwd(1_000_000), fwd(0)],
            ..Default::default()
        };
        let before: Vec<Bytes> = req
            .messages
            .iter()
            .map(|m| m.message.as_ref().unwrap().body.clone())
            .collect();
        own_small_forwarded_bodies(&mut req);
        let after: Vec<&Bytes> = req
            .messages
            .iter()
            .map(|m| &m.message.as_ref().unwrap().body)
            .collect();
        assert_eq!(after, before.iter().collect::<Vec<_>>());
        assert_ne!(
            after[0].as_ptr(),
            before[0].as_ptr(),
            "3 B beside 1 MB kept"
        );
        assert_eq!(after[1].as_ptr(), before[1].as_ptr(), "1 MB copied");
        // Whether the first of `n` bodies of `len` bytes is copied out.
        let first_copied = |n: usize, len: usize| {
            let mut req = v1::ForwardRequest {
                messages: (0..n).map(|_| fwd(len)).collect(),
                ..Default::default()
            };
            let first = req.messages[0].message.as_ref().unwrap().body.as_ptr();
            own_small_forwarded_bodies(&mut req);
            req.messages[0].message.as_ref().unwrap().body.as_ptr() != first
        };
        // A batch of a few bodies that is most of its request is left as it is, if the bodies
        // are large beside tonic's 8 KiB buffer too.
        assert!(!first_copied(8, 1000));
        // Eight 100 B bodies are most of their 1 KB request, but tonic's buffer behind them is
        // 8 KiB at least: copied.
        assert!(first_copied(8, 100));
        // 64 of them are copied out, in chunks.
        let mut req = v1::ForwardRequest {
            messages: (0..64).map(|_| fwd(100)).collect(),
            ..Default::default()
        };
        let first = req.messages[0].message.as_ref().unwrap().body.as_ptr();
        own_small_forwarded_bodies(&mut req);
        let now = &req.messages[0].message.as_ref().unwrap().body;
        assert_ne!(now.as_ptr(), first);
        assert_eq!(now.as_ref(), &[1u8; 100][..]);
    }

    #[tokio::test]
    async fn bad_requests_are_refused_as_tonic_refuses_them() {
        let one = framed(&send_request(0, &[1000]));
        // Over the limit: refused from the prefix alone, before the bytes arrive.
        let (got, end) = decode_all(vec![Ok(Bytes::copy_from_slice(&one[..5]))], 100).await;
        let e = end.unwrap_err();
        assert!(got.is_empty());
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(e.message().contains("the limit is: 100 bytes"), "{e:?}");
        // The compressed flag without grpc-encoding, and a flag that is not one.
        for (flag, words) in [(1u8, "compressed-flag"), (7, "invalid compression flag: 7")] {
            let mut m = one.clone();
            m[0] = flag;
            let (_, end) = decode_all(vec![Ok(m.into())], usize::MAX).await;
            let e = end.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Internal);
            assert!(e.message().contains(words), "{e:?}");
        }
        // Cut short: the first message, then the end in the middle of the second.
        let mut two = one.clone();
        two.extend_from_slice(&one[..one.len() - 1]);
        let (got, end) = decode_all(vec![Ok(two.into())], usize::MAX).await;
        assert_eq!(got.len(), 1);
        assert_eq!(
            end.unwrap_err().message(),
            "Unexpected EOF decoding stream."
        );
        // Bytes that are no SendRequest.
        let junk = [0u8, 0, 0, 0, 3, 0xff, 0xff, 0xff];
        let (_, end) = decode_all(vec![Ok(Bytes::copy_from_slice(&junk))], usize::MAX).await;
        let e = end.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(
            e.message().contains("failed to decode Protobuf message"),
            "{e:?}"
        );
        // The body's own error ends the stream with it; a cancelled one is an end.
        let (got, end) = decode_all(
            vec![
                Ok(one.clone().into()),
                Err(Status::unavailable("connection reset")),
            ],
            usize::MAX,
        )
        .await;
        assert_eq!(
            (got.len(), end.unwrap_err().code()),
            (1, tonic::Code::Unavailable)
        );
        let (got, end) = decode_all(
            vec![Ok(one.clone().into()), Err(Status::cancelled("gone"))],
            usize::MAX,
        )
        .await;
        assert_eq!(got.len(), 1);
        assert!(end.is_ok(), "{end:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any bytes, cut anywhere: the decoder never panics, and what it returns before
        /// refusing is what a contiguous decode of the same bytes gives.
        #[test]
        fn any_bytes_cut_anywhere_never_panic(
            msgs in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        proptest::strategy::Just(0u8),
                        proptest::strategy::Just(0u8),
                        proptest::strategy::Just(1u8),
                        proptest::prelude::any::<u8>()
                    ],
                    proptest::prop_oneof![
                        // A real request, or any bytes.
                        (0usize..3, 0usize..600).prop_map(|(i, n)| {
                            send_request(i, &[n, n / 2]).encode_to_vec()
                        }),
                        proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                    ],
                ),
                0..6,
            ),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
            cuts in proptest::collection::vec(0usize..4096, 0..16),
            limit in proptest::prop_oneof![0usize..64, 64usize..100_000],
        ) {
            let mut data = Vec::new();
            for (flag, body) in &msgs {
                data.push(*flag);
                data.extend_from_slice(&(body.len() as u32).to_be_bytes());
                data.extend_from_slice(body);
            }
            data.extend_from_slice(&tail);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < data.len()).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut pieces = Vec::new();
            let mut from = 0;
            for &c in cuts.iter().chain(std::iter::once(&data.len())) {
                pieces.push(Ok(Bytes::copy_from_slice(&data[from..c])));
                from = c;
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (got, end) = rt.block_on(decode_all(pieces, limit));
            let (whole, whole_end) =
                rt.block_on(decode_all(vec![Ok(Bytes::copy_from_slice(&data))], limit));
            proptest::prop_assert_eq!(got, whole);
            proptest::prop_assert_eq!(
                end.map_err(|e| (e.code(), e.message().to_string())),
                whole_end.map_err(|e| (e.code(), e.message().to_string()))
            );
        }
    }
}
