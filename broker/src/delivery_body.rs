//! The Receive stream's deliveries written without copying their large bodies.
//!
//! tonic's server encodes every response message into one contiguous buffer of its own
//! (`EncodeBuf`, a `BytesMut`), so each delivered body was copied once more on its way out: for
//! 1 MB express bodies that copy (`Message::encode_raw`) was 13% of mqd's CPU
//! (docs/benchmarks.md, "Deliveries without the encode copy"). The body of a stored message is
//! already a `Bytes` (a slice of the queue's memory or of a journal read), and h2 sends a data
//! chunk of 256 bytes or more as its own piece of a vectored write. So the Receive call's
//! response is encoded here instead: the protobuf around each large body goes into a small
//! buffer, and the body itself follows as its own chunk, the same `Bytes`, not a copy.
//!
//! The bytes on the wire are exactly prost's encoding of the same `ReceiveResponse` in gRPC's
//! length-prefixed framing (uncompressed), chunked differently (tested below). Every other call,
//! and a Receive call whose request is compressed (`grpc-encoding`), goes to tonic as before.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use mq_proto::codec::MqCodec;
use mq_proto::v1::{self, message_queue_service_server::MessageQueueService};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;
use tonic::Status;

use crate::service::Service;

/// A body at least this long goes out as its own chunk, not copied; shorter ones are copied
/// into the buffer with the rest (a copy of a few KiB costs less than another iovec and frame).
pub(crate) const SPLIT_BODY_BYTES: usize = 16 * 1024;

/// The Receive method's HTTP/2 path.
pub(crate) const RECEIVE_PATH: &str = "/mq.v1.MessageQueueService/Receive";

/// gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX_LEN: usize = 5;

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
    let len = resp.encoded_len();
    if len > limit || len > u32::MAX as usize {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    let split: usize = resp
        .messages
        .iter()
        .filter_map(|d| d.message.as_ref())
        .map(|m| m.body.len())
        .filter(|&n| n >= SPLIT_BODY_BYTES)
        .sum();
    // Everything but the split bodies, in one allocation.
    let mut head = BytesMut::with_capacity(PREFIX_LEN + len - split);
    head.put_u8(0);
    head.put_u32(len as u32);
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
        let body = std::mem::take(&mut m.body);
        encode_key(2, WireType::LengthDelimited, &mut head);
        encode_varint(body.len() as u64, &mut head);
        out.push_back(head.split().freeze());
        out.push_back(body);
        m.encode_raw(&mut head);
    }
    if !head.is_empty() {
        out.push_back(head.freeze());
    }
    Ok(())
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

/// The response body of a Receive call: the deliveries ([`encode_response`]), then the
/// trailers with the stream's status (OK when it ends, the error that ended it otherwise).
pub(crate) struct DeliveryBody {
    stream: Option<BoxStream<v1::ReceiveResponse>>,
    chunks: VecDeque<Bytes>,
    limit: usize,
}

impl DeliveryBody {
    pub(crate) fn new(stream: BoxStream<v1::ReceiveResponse>, limit: usize) -> Self {
        DeliveryBody {
            stream: Some(stream),
            chunks: VecDeque::new(),
            limit,
        }
    }
}

impl http_body::Body for DeliveryBody {
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
            Some(Ok(resp)) => match encode_response(resp, this.limit, &mut this.chunks) {
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

/// In front of the generated `MessageQueueService` server: answers Receive calls with a
/// [`DeliveryBody`], passes every other call (and a compressed Receive) to `inner`.
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
        if req.uri().path() != RECEIVE_PATH || req.headers().contains_key("grpc-encoding") {
            return Box::pin(self.inner.call(req));
        }
        let service = self.service.clone();
        let limit = self.limit;
        Box::pin(async move {
            let decoder = MqCodec::<v1::ReceiveResponse, v1::ReceiveRequest>::default().decoder();
            let req = tonic::Request::from_http(
                req.map(|body| Streaming::new_request(decoder, body, None, Some(limit))),
            );
            let resp = match MessageQueueService::receive(&service, req).await {
                Ok(r) => r,
                Err(status) => return Ok(status.into_http()),
            };
            let (metadata, stream, extensions) = resp.into_parts();
            let mut http =
                http::Response::new(tonic::body::Body::new(DeliveryBody::new(stream, limit)));
            *http.headers_mut() = metadata.into_headers();
            http.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            *http.extensions_mut() = extensions;
            Ok(http)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

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

    fn prost_framed(resp: &v1::ReceiveResponse) -> Vec<u8> {
        let body = resp.encode_to_vec();
        let mut v = vec![0u8];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
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
            let want = prost_framed(&resp);
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

    async fn frames(body: DeliveryBody) -> (Vec<u8>, http::HeaderMap) {
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
        let (data, t) = frames(DeliveryBody::new(ok, usize::MAX)).await;
        let mut want = prost_framed(&one);
        want.extend(prost_framed(&one));
        assert_eq!(data, want);
        assert_eq!(t.get("grpc-status").unwrap(), "0");

        let failing: BoxStream<v1::ReceiveResponse> = Box::pin(futures::stream::iter(vec![
            Ok(one.clone()),
            Err(Status::not_found("the queue was deleted")),
            Ok(one.clone()),
        ]));
        let (data, t) = frames(DeliveryBody::new(failing, usize::MAX)).await;
        assert_eq!(data, prost_framed(&one));
        let s = Status::from_header_map(&t).unwrap();
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert_eq!(s.message(), "the queue was deleted");

        let too_big: BoxStream<v1::ReceiveResponse> =
            Box::pin(futures::stream::iter(vec![Ok(one.clone())]));
        let (data, t) = frames(DeliveryBody::new(too_big, 1000)).await;
        assert!(data.is_empty());
        assert_eq!(
            Status::from_header_map(&t).unwrap().code(),
            tonic::Code::OutOfRange
        );
    }
}
