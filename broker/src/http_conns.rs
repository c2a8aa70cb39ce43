//! The HTTP port's connections: at most `mqd --http-max-connections` at once (more are closed
//! as they are accepted), and one that moves no byte either way for `mqd --http-idle-timeout`
//! is closed, so a client that opens connections and stalls (sends half a request, or nothing)
//! holds them, and their file descriptors, no longer. (axum's server sets no timer: hyper's
//! header read timeout is off.) A request must also be whole within `mqd
//! --http-request-timeout` of its first byte: the idle time restarts at every byte, so a client
//! that trickled a byte every few seconds held its connection for good, and 256 of them (4 bytes
//! a second) closed the port to everyone (helper-63). And the port speaks HTTP/1.1 only: axum's
//! server also answers HTTP/2 (its builder detects the preface), 200 streams a connection with
//! hyper's default windows, which let one connection hold ~200 times what the limits here
//! assume (helper-63: 40 connections of stalled uploads, +650 MB); a connection that opens with
//! the HTTP/2 preface is closed.

/// The HTTP port's connection limits (`mqd --http-max-connections`, `--http-idle-timeout`,
/// `--http-request-timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) idle: std::time::Duration,
    pub(crate) request: std::time::Duration,
}

/// The first bytes of an HTTP/2 connection (RFC 9113 §3.4); no HTTP/1 method is `PRI`.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A listener whose connections are counted and closed when idle.
pub(crate) struct Bounded<L> {
    inner: L,
    permits: Arc<Semaphore>,
    max: usize,
    idle: Duration,
    request: Duration,
    /// Connections closed at accept for the limit, and when the last warning was logged.
    refused: u64,
    warned: Option<Instant>,
}

impl<L> Bounded<L> {
    pub(crate) fn new(inner: L, limits: Limits) -> Bounded<L> {
        Bounded {
            inner,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            max: limits.max_connections,
            idle: limits.idle,
            request: limits.request,
            refused: 0,
            warned: None,
        }
    }
}

impl<L> axum::serve::Listener for Bounded<L>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    type Io = Idle<L::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, peer) = self.inner.accept().await;
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => return (Idle::new(io, permit, self.idle, self.request), peer),
                Err(_) => {
                    drop(io);
                    self.refused += 1;
                    let n = self.refused;
                    if self
                        .warned
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                    {
                        self.warned = Some(Instant::now());
                        tracing::warn!(%peer, refused = n, "HTTP port: {} connections open (mqd --http-max-connections); closing new ones", self.max);
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails its reads and writes once it has moved no byte for `idle`.
pub(crate) struct Idle<T> {
    /// Dropped first (fields drop in order): the place is free before the peer sees the close.
    _permit: OwnedSemaphorePermit,
    io: T,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    request: Duration,
    /// Set by the first byte read after the last byte written (a request begins), cleared by
    /// a byte written (its answer): a byte that comes after it ends the connection. Only
    /// bytes that come are checked, so an answer that takes long to make (the server reads
    /// nothing meanwhile) is bounded by the idle time alone, as before.
    request_deadline: Option<tokio::time::Instant>,
    /// The connection's first bytes, until they tell HTTP/2's preface from HTTP/1.
    head: Vec<u8>,
}

impl<T> Idle<T> {
    fn new(io: T, permit: OwnedSemaphorePermit, idle: Duration, request: Duration) -> Idle<T> {
        Idle {
            _permit: permit,
            io,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            request,
            request_deadline: None,
            head: Vec::with_capacity(HTTP2_PREFACE.len()),
        }
    }

    fn moved(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.timer.as_mut().reset(at);
    }

    /// Bytes read: a request begins if none is under way.
    fn read_some(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.moved();
        let now = tokio::time::Instant::now();
        match self.request_deadline {
            None => self.request_deadline = Some(now + self.request),
            Some(d) if now >= d => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "HTTP request not whole in time (mqd --http-request-timeout)",
                ))
            }
            Some(_) => {}
        }
        if self.head.len() < HTTP2_PREFACE.len() {
            let k = (HTTP2_PREFACE.len() - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..k]);
            if self.head.len() == HTTP2_PREFACE.len() && self.head == HTTP2_PREFACE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "HTTP/2 on the HTTP port (it serves HTTP/1.1 only)",
                ));
            }
        }
        Ok(())
    }

    /// A write's result: bytes written restart the idle time; pending, it may have run out.
    fn wrote(
        &mut self,
        r: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.moved();
                    self.request_deadline = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.expired(cx),
        }
    }

    /// With the I/O pending: an error once the connection has been idle too long.
    fn expired<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP connection idle (mqd --http-idle-timeout)",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Idle<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let this = &mut *self;
                    this.read_some(&buf.filled()[before..])?;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Idle<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The address of the peer of an HTTP connection, plain or TLS (`ConnectInfo<Peer>`).
impl<L> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Bounded<L>>>
    for crate::http_tls::Peer
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    fn connect_info(s: axum::serve::IncomingStream<'_, Bounded<L>>) -> crate::http_tls::Peer {
        crate::http_tls::Peer(*s.remote_addr())
    }
}
