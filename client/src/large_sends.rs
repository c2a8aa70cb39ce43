//! A Send stream's requests written with their large bodies uncopied
//! ([`mq_proto::chunked::encode_send_request`]).
//!
//! tonic's client encodes each request into its own buffer, copying every body once more
//! before the kernel copies it to the socket. A [`crate::Sender`] opens its stream with its
//! requests in a [`SendSource`] (in the request's extensions), and [`LargeSends`], beneath
//! tonic in the client's service stack, makes the HTTP/2 request body from it: the protobuf
//! around each large body in a small buffer, the body as its own chunk. The stream tonic was
//! given reads the same source, so without the layer the requests go through tonic as before.
//!
//! The other way, tonic's decoder copies every received frame into its own buffer. A
//! [`crate::Consumer`] opens its Receive stream with a [`ReceiveTap`], and the layer hands it the
//! response's body (when the headers carry no status); the consumer reads it with
//! [`mq_proto::chunked::FrameDecoder`], which decodes a message lying within one frame from
//! that frame's bytes (the body is not copied). tonic is left an empty body it never reads.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use mq_proto::v1;
use tokio::sync::mpsc;
use tonic::codegen::http;
use tonic::Status;

/// The requests of one Send stream, taken once: by [`LargeSends`] (no copies), or, if no such
/// layer is there, by tonic through the [`SendSource::stream`] it was given.
#[derive(Clone)]
pub(crate) struct SendSource(Arc<Mutex<Option<mpsc::Receiver<v1::SendRequest>>>>);

impl SendSource {
    pub(crate) fn new(rx: mpsc::Receiver<v1::SendRequest>) -> Self {
        SendSource(Arc::new(Mutex::new(Some(rx))))
    }

    fn take(&self) -> Option<mpsc::Receiver<v1::SendRequest>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The requests as a stream for tonic: empty once [`LargeSends`] took them.
    pub(crate) fn stream(&self) -> impl Stream<Item = v1::SendRequest> + Send + 'static {
        let src = self.clone();
        let mut rx: Option<mpsc::Receiver<v1::SendRequest>> = None;
        futures::stream::poll_fn(move |cx| {
            if rx.is_none() {
                rx = src.take();
            }
            match rx.as_mut() {
                Some(rx) => rx.poll_recv(cx),
                None => Poll::Ready(None),
            }
        })
    }
}

/// The request body of a Send stream: each request as [`encode_send_request`] chunks it; the
/// end when the sender is done.
///
/// [`encode_send_request`]: mq_proto::chunked::encode_send_request
struct SendBody {
    rx: Option<mpsc::Receiver<v1::SendRequest>>,
    chunks: VecDeque<Bytes>,
}

impl tonic::codegen::Body for SendBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(c) = this.chunks.pop_front() {
                return Poll::Ready(Some(Ok(http_body::Frame::data(c))));
            }
            let Some(rx) = this.rx.as_mut() else {
                return Poll::Ready(None);
            };
            match std::task::ready!(rx.poll_recv(cx)) {
                Some(req) => {
                    if mq_proto::chunked::encode_send_request(req, &mut this.chunks).is_none() {
                        this.rx = None;
                        return Poll::Ready(Some(Err(Status::out_of_range(
                            "a send request of more than 4 GiB cannot be framed",
                        ))));
                    }
                }
                None => this.rx = None,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none() && self.chunks.is_empty()
    }
}

/// Where the layer puts a Receive stream's response body for the consumer to read
/// ([`mq_proto::chunked::FrameDecoder::response`]); empty if the response carried its status in
/// its headers (a refusal), which tonic reports as before.
#[derive(Clone, Default)]
pub(crate) struct ReceiveTap(Arc<Mutex<Option<tonic::body::Body>>>);

impl ReceiveTap {
    /// The response's body, if the layer took it.
    pub(crate) fn take(&self) -> Option<tonic::body::Body> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The client's service beneath tonic (module doc): a request carrying a [`SendSource`] gets
/// its body from it; the response to a request carrying a [`ReceiveTap`] leaves its body there.
#[derive(Debug, Clone)]
pub(crate) struct LargeSends<S>(pub(crate) S);

type Response = http::Response<tonic::body::Body>;

impl<S> tonic::codegen::Service<http::Request<tonic::body::Body>> for LargeSends<S>
where
    S: tonic::codegen::Service<http::Request<tonic::body::Body>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        if let Some(rx) = req
            .extensions_mut()
            .remove::<SendSource>()
            .and_then(|s| s.take())
        {
            *req.body_mut() = tonic::body::Body::new(SendBody {
                rx: Some(rx),
                chunks: VecDeque::new(),
            });
        }
        let tap = req.extensions_mut().remove::<ReceiveTap>();
        let fut = self.0.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            if let Some(tap) = tap {
                if resp.status() == http::StatusCode::OK
                    && !resp.headers().contains_key("grpc-status")
                {
                    let body = std::mem::replace(resp.body_mut(), tonic::body::Body::empty());
                    *tap.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(body);
                }
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use tonic::codegen::{Body as _, Service as _};

    /// Stands for the channel: keeps the request it is given.
    #[derive(Clone, Default)]
    struct Keep(Arc<Mutex<Option<http::Request<tonic::body::Body>>>>);

    impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Keep {
        type Response = Response;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response, std::convert::Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            *self.0.lock().unwrap() = Some(req);
            std::future::ready(Ok(http::Response::new(tonic::body::Body::new(
                http_body_full(b"the response's body"),
            ))))
        }
    }

    /// A body of one data frame.
    fn http_body_full(b: &'static [u8]) -> impl tonic::codegen::Body<Data = Bytes, Error = Status> {
        struct One(Option<Bytes>);
        impl tonic::codegen::Body for One {
            type Data = Bytes;
            type Error = Status;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
                Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        One(Some(Bytes::from_static(b)))
    }

    async fn all_data(mut body: tonic::body::Body) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(f) = futures::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if let Ok(d) = f.unwrap().into_data() {
                out.extend_from_slice(&d);
            }
        }
        out
    }

    #[tokio::test]
    async fn the_layer_leaves_a_receive_response_body_in_the_tap() {
        let tap = ReceiveTap::default();
        let mut req = http::Request::new(tonic::body::Body::empty());
        req.extensions_mut().insert(tap.clone());
        let resp = LargeSends(Keep::default()).call(req).await.unwrap();
        // tonic is left an empty body; the consumer gets the real one.
        assert!(all_data(resp.into_body()).await.is_empty());
        assert_eq!(
            all_data(tap.take().expect("the body")).await,
            b"the response's body"
        );
        // Without a tap, the body stays where it is.
        let req = http::Request::new(tonic::body::Body::empty());
        let resp = LargeSends(Keep::default()).call(req).await.unwrap();
        assert_eq!(all_data(resp.into_body()).await, b"the response's body");
    }

    fn request(i: u64, body: Bytes) -> v1::SendRequest {
        v1::SendRequest {
            first_seq: i,
            destination: "q".into(),
            messages: vec![v1::OutMessage {
                body,
                label: format!("m{i}"),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_layer_writes_the_requests_with_their_large_bodies_uncopied() {
        let big = Bytes::from(vec![5u8; 1_000_000]);
        let (tx, rx) = mpsc::channel(4);
        let source = SendSource::new(rx);
        // What tonic would send: the source's stream, which the layer replaces.
        let mut req = http::Request::new(tonic::body::Body::empty());
        req.extensions_mut().insert(source.clone());
        let keep = Keep::default();
        LargeSends(keep.clone()).call(req).await.unwrap();
        tx.send(request(1, big.clone())).await.unwrap();
        tx.send(request(2, Bytes::from_static(b"small")))
            .await
            .unwrap();
        drop(tx);
        let mut body = keep.0.lock().unwrap().take().unwrap().into_body();
        let mut chunks = Vec::new();
        while let Some(f) = futures::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            chunks.push(f.unwrap().into_data().unwrap());
        }
        assert!(
            chunks.iter().any(|c| c.as_ptr() == big.as_ptr()),
            "the 1 MB body was copied"
        );
        let wire: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let mut at = 0;
        for want in [
            request(1, big.clone()),
            request(2, Bytes::from_static(b"small")),
        ] {
            let len = u32::from_be_bytes(wire[at + 1..at + 5].try_into().unwrap()) as usize;
            let got = <v1::SendRequest as prost::Message>::decode(&wire[at + 5..at + 5 + len]);
            assert_eq!(got.unwrap(), want);
            at += 5 + len;
        }
        assert_eq!(at, wire.len());
        // The layer took the requests: tonic's stream is empty.
        assert_eq!(source.stream().count().await, 0);
    }

    #[tokio::test]
    async fn without_the_layer_tonic_reads_the_same_requests() {
        let (tx, rx) = mpsc::channel(4);
        let source = SendSource::new(rx);
        tx.send(request(1, Bytes::from_static(b"a"))).await.unwrap();
        tx.send(request(2, Bytes::from_static(b"b"))).await.unwrap();
        drop(tx);
        let got: Vec<v1::SendRequest> = source.stream().collect().await;
        assert_eq!(got.iter().map(|r| r.first_seq).collect::<Vec<_>>(), [1, 2]);
    }
}
