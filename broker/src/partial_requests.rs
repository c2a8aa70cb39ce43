//! Request messages received in part: their bytes are bounded per connection and broker-wide,
//! and a message must arrive whole within a time limit once its first byte has.
//!
//! A gRPC message is a 5-byte prefix (a flag and a length) and that many bytes. Both request
//! decoders (tonic's, and [`mq_proto::chunked::FrameDecoder`] for Send) gather a message's
//! bytes until it is whole, so what a client declares and then never finishes stays in memory:
//! one message up to the gRPC limit (`--max-body-bytes` + 8 MiB) per stream, 256 streams per
//! connection, 1,024 connections. HTTP/2's flow control does not bound it (a decoder takes the
//! bytes out of h2's window as they come). This layer sits in front of every service, follows
//! each request body's framing, and charges the bytes of its unfinished message to the
//! connection and to the broker; a body that would go over either limit, or whose message is
//! not whole in time, fails with RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED, which the services
//! pass on to the client as the stream's status. Whole messages cost nothing here.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::Frame;
use tonic::Status;

use crate::flow::{Connection, Connections};
use crate::metrics::Counters;

/// The limits, and the broker's count of bytes in unfinished messages.
#[derive(Debug)]
pub(crate) struct PartialLimits {
    per_connection: u64,
    total: u64,
    arrival: Duration,
    /// The broker's count (its `mq_partial_request_bytes` gauge).
    counters: Arc<Counters>,
}

impl PartialLimits {
    /// `per_connection` and `total` are raised to at least `message_limit` (one message that
    /// size must always be able to arrive), `total` to at least `per_connection`.
    pub(crate) fn new(
        per_connection: u64,
        total: u64,
        arrival: Duration,
        message_limit: u64,
        counters: Arc<Counters>,
    ) -> Self {
        let per_connection = per_connection.max(message_limit);
        PartialLimits {
            per_connection,
            total: total.max(per_connection),
            arrival,
            counters,
        }
    }
}

impl PartialLimits {
    /// The limits in force: (per connection, broker-wide).
    pub(crate) fn in_force(&self) -> (u64, u64) {
        (self.per_connection, self.total)
    }

    fn held(&self) -> &AtomicU64 {
        &self.counters.partial_request_bytes
    }
}

/// The tower layer (on tonic's server builder).
#[derive(Debug, Clone)]
pub(crate) struct PartialLayer {
    pub(crate) limits: Arc<PartialLimits>,
    pub(crate) connections: Arc<Connections>,
}

impl<S> tower::Layer<S> for PartialLayer {
    type Service = Partial<S>;
    fn layer(&self, inner: S) -> Partial<S> {
        Partial {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Partial<S> {
    inner: S,
    layer: PartialLayer,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Partial<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let conn = self
            .layer
            .connections
            .get(crate::flow::peer_of_extensions(req.extensions()));
        // A request from someone keeps the connection's place at the connection limit: the
        // identity layer (or a service without one) proves it with this.
        let mut req = req;
        let proof = conn.proof();
        // While its request is being read (authenticated, decoded; a stream's for as long as
        // it lasts) the connection is not evicted at the limit.
        let call = proof.call();
        req.extensions_mut().insert(proof);
        let limits = self.layer.limits.clone();
        self.inner.call(req.map(|body| {
            tonic::body::Body::new(Counted {
                _call: call,
                inner: body,
                framing: Framing::default(),
                charged: 0,
                conn,
                limits,
                deadline: None,
                armed: false,
            })
        }))
    }
}

/// Where a body is in gRPC's framing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Framing {
    /// Bytes of the current message's prefix seen (0..=5).
    prefix: usize,
    /// Its length's bytes as far as seen (big-endian).
    len: u32,
    /// Bytes of its body still to come (once the prefix is whole).
    remaining: u64,
    /// Bytes of the current, unfinished message seen (prefix included); 0 between messages.
    progress: u64,
}

impl Framing {
    /// Follows `data`; returns how many messages it finished.
    fn advance(&mut self, mut data: &[u8]) -> usize {
        let mut finished = 0;
        while !data.is_empty() {
            if self.prefix < 5 {
                let b = data[0];
                data = &data[1..];
                if self.prefix > 0 {
                    self.len = (self.len << 8) | u32::from(b);
                }
                self.prefix += 1;
                self.progress += 1;
                if self.prefix == 5 {
                    self.remaining = u64::from(self.len);
                }
            } else {
                let take = (self.remaining).min(data.len() as u64) as usize;
                data = &data[take..];
                self.remaining -= take as u64;
                self.progress += take as u64;
            }
            if self.prefix == 5 && self.remaining == 0 {
                *self = Framing::default();
                finished += 1;
            }
        }
        finished
    }
}

/// A request body whose unfinished message is charged.
struct Counted {
    /// Keeps the connection from eviction while the body lives.
    _call: crate::flow::CallUnderWay,
    inner: tonic::body::Body,
    framing: Framing,
    /// What this body has charged (its unfinished message's bytes).
    charged: u64,
    conn: Arc<Connection>,
    limits: Arc<PartialLimits>,
    /// When the unfinished message must be whole (while `armed`).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl Counted {
    /// Charges the unfinished message's bytes after `data`, or refuses.
    fn account(&mut self, data: &Bytes) -> Result<(), Status> {
        let before = self.framing.progress;
        let finished = self.framing.advance(data.chunk());
        let now = self.framing.progress;
        if now == 0 {
            self.armed = false;
        } else if before == 0 || finished > 0 {
            // A message began (after this frame finished the one before, if any): one timer
            // per body, reset for each message.
            let at = tokio::time::Instant::now() + self.limits.arrival;
            match self.deadline.as_mut() {
                Some(d) => d.as_mut().reset(at),
                None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            self.armed = true;
        }
        if now > self.charged {
            let more = now - self.charged;
            let conn = self.conn.partial_bytes().fetch_add(more, Ordering::AcqRel) + more;
            let total = self.limits.held().fetch_add(more, Ordering::AcqRel) + more;
            self.charged = now;
            if conn > self.limits.per_connection {
                return Err(Status::resource_exhausted(format!(
                    "this connection's unfinished request messages would hold {conn} bytes; the limit is {} (mqd --max-partial-bytes-per-connection)",
                    self.limits.per_connection
                )));
            }
            if total > self.limits.total {
                return Err(Status::resource_exhausted(format!(
                    "unfinished request messages would hold {total} bytes in this broker; the limit is {} (mqd --max-partial-bytes); try again",
                    self.limits.total
                )));
            }
        } else {
            self.release(self.charged - now);
        }
        Ok(())
    }

    fn release(&mut self, n: u64) {
        if n > 0 {
            self.conn.partial_bytes().fetch_sub(n, Ordering::AcqRel);
            self.limits.held().fetch_sub(n, Ordering::AcqRel);
            self.charged -= n;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.release(self.charged);
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = this.account(data) {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                // The end, or an error: nothing more of this body will be decoded.
                let charged = this.charged;
                this.release(charged);
                this.armed = false;
                Poll::Ready(other)
            }
            Poll::Pending => match this
                .deadline
                .as_mut()
                .filter(|_| this.armed)
                .map(|d| d.as_mut().poll(cx))
            {
                Some(Poll::Ready(())) => {
                    this.armed = false;
                    let (got, of) = (this.framing.progress, u64::from(this.framing.len) + 5);
                    Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "a request message of {of} bytes (prefix included) was not whole {:?} after its first byte ({got} bytes came); the limit is mqd --message-arrival-timeout",
                        this.limits.arrival
                    )))))
                }
                _ => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    /// Every split of two messages (one empty) into two frames: the progress is the bytes of
    /// the unfinished message, and both finish.
    #[test]
    fn framing_follows_messages_across_any_split() {
        let mut all = message(10);
        all.extend(message(0));
        all.extend(message(3));
        for cut in 0..=all.len() {
            let mut f = Framing::default();
            let a = f.advance(&all[..cut]);
            // At 15, 20 and 28 a message has just finished.
            let expect = match cut {
                0..=14 => cut,
                16..=19 => cut - 15,
                21..=27 => cut - 20,
                _ => 0,
            } as u64;
            assert_eq!(f.progress, expect, "cut {cut}");
            let b = f.advance(&all[cut..]);
            assert_eq!(a + b, 3, "cut {cut}");
            assert_eq!(f, Framing::default(), "cut {cut}");
        }
    }

    #[test]
    fn framing_reads_the_length_big_endian() {
        let mut f = Framing::default();
        assert_eq!(f.advance(&[0, 0x01, 0x02, 0x03, 0x04]), 0);
        assert_eq!(f.remaining, 0x0102_0304);
        assert_eq!(f.progress, 5);
    }

    #[test]
    fn limits_hold_at_least_one_message() {
        let l = PartialLimits::new(10, 5, Duration::from_secs(1), 1000, Default::default());
        assert_eq!((l.per_connection, l.total), (1000, 1000));
        let l = PartialLimits::new(4000, 2000, Duration::from_secs(1), 1000, Default::default());
        assert_eq!((l.per_connection, l.total), (4000, 4000));
    }
}
