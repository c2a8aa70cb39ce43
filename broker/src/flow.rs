//! Flow limits: live connections (those past `--max-connections` are closed at once), what each
//! connection holds (open transactions, unacknowledged deliveries), and the broker-wide budget
//! of bytes staged by open transactions.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Notify;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Which connection a request came on: a TCP peer's address, or the number of a connection on
/// the broker's Unix socket (`--unix-socket`), which has no address of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    Tcp(SocketAddr),
    Local(u64),
}

/// What a connection on the Unix socket tells each of its requests (tonic puts it in the
/// request's extensions, as it does a TCP connection's addresses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalConnectInfo {
    pub(crate) id: u64,
    /// The connecting process's user id, as the kernel tells it (`SO_PEERCRED`), if it did.
    pub(crate) uid: Option<u32>,
}

impl LocalConnectInfo {
    /// The address a local connection stands as where one is needed (login failure limits,
    /// logs): the loopback's, like a TCP client on the same machine.
    pub(crate) const ADDR: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
}

/// The connection `req` came on, if the server knows it.
pub(crate) fn peer_of<T>(req: &tonic::Request<T>) -> Option<Peer> {
    req.remote_addr().map(Peer::Tcp).or_else(|| {
        req.extensions()
            .get::<LocalConnectInfo>()
            .map(|i| Peer::Local(i.id))
    })
}

/// The connection an HTTP request came on (as [`peer_of`], from the extensions tonic's server
/// puts on every request: TCP, TLS over TCP, or the Unix socket).
pub(crate) fn peer_of_extensions(ext: &http::Extensions) -> Option<Peer> {
    use tonic::transport::server::TlsConnectInfo;
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
        .map(Peer::Tcp)
        .or_else(|| ext.get::<LocalConnectInfo>().map(|i| Peer::Local(i.id)))
}

/// The broker's live client connections, by peer.
#[derive(Debug)]
pub(crate) struct Connections {
    max: usize,
    /// Each connection's budget of deliveries not yet written (`crate::unsent`).
    unsent_limit: usize,
    /// Of it, what a connection holds whatever the others hold (one batch).
    unsent_floor: usize,
    /// The rest is shared by every connection (`--max-unsent-bytes`).
    unsent_shared: Arc<tokio::sync::Semaphore>,
    live: AtomicUsize,
    by_peer: Mutex<HashMap<Peer, Arc<Connection>>>,
    /// Most connections from one IP address (`--max-connections-per-address`).
    per_address: usize,
    /// Live TCP connections by the peer's IP address.
    by_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Live connections that have made no request yet, oldest first (by accept number): at
    /// the limit, a new connection closes the oldest of them rather than being refused.
    unproven: Mutex<BTreeMap<u64, Arc<Life>>>,
    /// Numbers the accepted connections.
    next_id: AtomicU64,
    /// Numbers the connections on the Unix socket.
    next_local: AtomicU64,
    /// Connections closed for the limit since the last warning, and when that was.
    refused: Mutex<(u64, Option<Instant>)>,
    /// The same for the limit per address.
    refused_address: Mutex<(u64, Option<Instant>)>,
    /// The same for connections closed to make room.
    evicted: Mutex<(u64, Option<Instant>)>,
    /// Connections closed for a limit since the start, by [`CLOSED_REASONS`].
    closed: [AtomicU64; 3],
}

/// Why the port closed a connection for a limit (the metric's `reason` label): refused at
/// `--max-connections` (every open one had made a request), refused at
/// `--max-connections-per-address`, or closed to make room (it had made no request).
pub(crate) const CLOSED_REASONS: [&str; 3] = ["max_connections", "per_address", "evicted"];

/// Where a connection stands with the connection limit. One that has made a request
/// (`proven`) keeps its place; one that has not (a TLS or HTTP/2 handshake that never ends, a
/// socket that sends nothing) is closed to make room for a new connection at the limit: 1,024
/// silent sockets from one address held every place for as long as they liked (helper-67).
#[derive(Debug, Default)]
pub(crate) struct Life {
    proven: AtomicBool,
    /// Calls under way whose request is still being read ([`Proof::call`]): such a connection
    /// is not evicted, proven or not (a password being checked, an anonymous caller's receive
    /// stream). Proving only on the identity layer's answer let a flood of idle connections
    /// evict every first password login while its hash ran, and anonymous consumers mid-stream
    /// (helper-72).
    calls: AtomicUsize,
    evicted: AtomicBool,
    /// The connection's reader while it is unproven, woken when it is evicted.
    waker: AtomicWaker,
}

impl Life {
    /// The connection made a request: it keeps its place.
    pub(crate) fn prove(&self) {
        if !self.proven.load(Ordering::Relaxed) {
            self.proven.store(true, Ordering::Release);
        }
    }
}

/// Put in each request's extensions by `partial_requests`: the identity layer proves the
/// connection with it when the request's caller is someone ([`crate::auth::Auth::proves`]).
/// Before, any request proved it, even one refused for bad credentials: 1,024 connections that
/// made one such request each and then idled held the port for good (stop 46's note).
#[derive(Debug, Clone)]
pub(crate) struct Proof(Arc<Life>);

impl Proof {
    /// The connection keeps its place at the connection limit.
    pub(crate) fn prove(&self) {
        self.0.prove();
    }

    /// A call under way on the connection, until the returned guard is dropped.
    pub(crate) fn call(&self) -> CallUnderWay {
        self.0.calls.fetch_add(1, Ordering::AcqRel);
        CallUnderWay(self.0.clone())
    }
}

/// See [`Proof::call`].
#[derive(Debug)]
pub(crate) struct CallUnderWay(Arc<Life>);

impl Drop for CallUnderWay {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one connection holds.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Its standing with the connection limit.
    life: Arc<Life>,
    /// Delivered, unacknowledged messages of all its receive streams.
    unacked: AtomicU64,
    /// Wakes its receive streams when one of them gives room back.
    room: Notify,
    /// Receive streams registered on `room` ([`Connection::wait_for_room`]): only when some
    /// are does giving slots back wake anyone. Every stream used to register on every turn of
    /// its loop, and every acknowledgement and every delivery smaller than its credit woke
    /// them all: with 100 streams on a connection (mqperf `--consumers 1000`), about 100
    /// waiters walked under `room`'s lock per delivery, for nothing (no stream was blocked).
    room_waiters: AtomicUsize,
    /// Open transactions.
    transactions: AtomicUsize,
    /// Open cursors (browse streams).
    cursors: AtomicUsize,
    /// Bytes of request messages received in part (see `partial_requests`).
    partial: AtomicU64,
    /// Bytes its receive streams may still build ahead of what HTTP/2 has written, and its
    /// send streams' answers (`crate::unsent`), of `unsent_limit`.
    unsent: Arc<crate::unsent::Budget>,
    unsent_limit: usize,
}

impl Connections {
    /// At most `max` connections, each with `unsent_limit` bytes of deliveries not yet written,
    /// `unsent_floor` of them its own and the rest from the broker's `unsent_shared` bytes.
    pub(crate) fn new(
        max: usize,
        unsent_limit: usize,
        unsent_floor: usize,
        unsent_shared: usize,
    ) -> Self {
        Connections {
            max,
            unsent_limit,
            unsent_floor,
            unsent_shared: Arc::new(tokio::sync::Semaphore::new(unsent_shared)),
            live: AtomicUsize::new(0),
            by_peer: Mutex::new(HashMap::new()),
            per_address: usize::MAX,
            by_ip: Mutex::new(HashMap::new()),
            unproven: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            next_local: AtomicU64::new(1),
            refused: Mutex::new((0, None)),
            refused_address: Mutex::new((0, None)),
            evicted: Mutex::new((0, None)),
            closed: Default::default(),
        }
    }

    /// Connections closed for a limit since the start, by [`CLOSED_REASONS`].
    pub(crate) fn closed_for_limits(&self) -> [u64; 3] {
        self.closed.each_ref().map(|a| a.load(Ordering::Relaxed))
    }

    /// At most `n` connections from one IP address (the Unix socket's do not count).
    pub(crate) fn with_max_per_address(mut self, n: usize) -> Self {
        self.per_address = n.max(1);
        self
    }

    /// Connections open now.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Counts a new connection, or `None` if that would pass the limit per address, or the
    /// limit with every connection proven (else the oldest unproven one is closed for it).
    fn admit(self: &Arc<Self>, peer: Peer) -> Option<ConnectionGuard> {
        // Counted by address only when there is a limit per address (a map lock per accept).
        let ip = match peer {
            Peer::Tcp(a) if self.per_address != usize::MAX => Some(a.ip()),
            _ => None,
        };
        if let Some(ip) = ip {
            let mut by_ip = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
            let n = by_ip.entry(ip).or_insert(0);
            if *n >= self.per_address {
                drop(by_ip);
                self.closed[1].fetch_add(1, Ordering::Relaxed);
                warn_every_10s(
                    &self.refused_address,
                    self.per_address,
                    "closed new connections: their address has --max-connections-per-address open",
                );
                return None;
            }
            *n += 1;
        }
        // Evicted connections count until they have closed, which they do at once: the limit
        // may be passed by as many for a moment.
        if self.live.load(Ordering::Acquire) >= self.max && !self.evict_oldest_unproven() {
            if let Some(ip) = ip {
                self.forget_ip(ip);
            }
            self.closed[0].fetch_add(1, Ordering::Relaxed);
            warn_every_10s(
                &self.refused,
                self.max,
                "closed new connections: the broker has --max-connections open, each of which has made a request",
            );
            return None;
        }
        self.live.fetch_add(1, Ordering::AcqRel);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let life = Arc::new(Life::default());
        self.unproven
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, life.clone());
        self.by_peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, Arc::new(self.connection(life.clone())));
        Some(ConnectionGuard {
            connections: self.clone(),
            peer,
            id,
            life,
        })
    }

    /// Closes the oldest connection that is not proven and has no call under way; false if
    /// there is none.
    fn evict_oldest_unproven(&self) -> bool {
        let mut unproven = self.unproven.lock().unwrap_or_else(|p| p.into_inner());
        unproven.retain(|_, life| !life.proven.load(Ordering::Acquire));
        let victim = unproven
            .iter()
            .find(|(_, life)| life.calls.load(Ordering::Acquire) == 0)
            .map(|(&id, _)| id);
        if let Some(life) = victim.and_then(|id| unproven.remove(&id)) {
            life.evicted.store(true, Ordering::Release);
            life.waker.wake();
            self.closed[2].fetch_add(1, Ordering::Relaxed);
            drop(unproven);
            warn_every_10s(
                &self.evicted,
                self.max,
                "closed connections that had made no request to make room for new ones (--max-connections)",
            );
            return true;
        }
        false
    }

    fn forget_ip(&self, ip: IpAddr) {
        let mut by_ip = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&ip);
            }
        }
    }

    /// The connection a request came on ([`peer_of`]). A request whose connection is not known
    /// gets a connection of its own.
    pub(crate) fn get(&self, peer: Option<Peer>) -> Arc<Connection> {
        peer.and_then(|p| {
            self.by_peer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&p)
                .cloned()
        })
        .unwrap_or_else(|| Arc::new(self.connection(Arc::new(Life::default()))))
    }

    fn connection(&self, life: Arc<Life>) -> Connection {
        Connection::new(
            crate::unsent::Budget::new(
                self.unsent_limit,
                self.unsent_floor,
                self.unsent_shared.clone(),
            ),
            life,
        )
    }
}

/// One warning per 10 s at most for `what`, with how many it concerned since the last one.
fn warn_every_10s(state: &Mutex<(u64, Option<Instant>)>, limit: usize, what: &str) {
    let mut r = state.lock().unwrap_or_else(|p| p.into_inner());
    r.0 += 1;
    if r.1.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        tracing::warn!(closed = r.0, limit, "{what}");
        *r = (0, Some(Instant::now()));
    }
}

/// Counts one connection while it lives.
#[derive(Debug)]
struct ConnectionGuard {
    connections: Arc<Connections>,
    peer: Peer,
    /// Its accept number (its place among the unproven).
    id: u64,
    life: Arc<Life>,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let c = &self.connections;
        c.by_peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.peer);
        c.unproven
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        if let Peer::Tcp(a) = self.peer {
            if c.per_address != usize::MAX {
                c.forget_ip(a.ip());
            }
        }
        c.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A counted connection (TCP, or the Unix socket's): what the gRPC server reads and writes.
#[derive(Debug)]
pub(crate) struct CountedStream<S> {
    stream: S,
    guard: ConnectionGuard,
}

/// A listener of client connections: TCP (`--listen`) or the Unix socket (`--unix-socket`).
pub(crate) trait Listener: Send + 'static {
    type Stream: Send + 'static;
    /// The next connection and the peer it counts as (a Unix socket connection gets the next
    /// number of `connections`).
    fn next(
        &self,
        connections: &Connections,
    ) -> impl std::future::Future<Output = io::Result<(Self::Stream, Peer)>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn next(&self, _: &Connections) -> io::Result<(TcpStream, Peer)> {
        let (stream, peer) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, Peer::Tcp(peer)))
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    async fn next(&self, connections: &Connections) -> io::Result<(UnixStream, Peer)> {
        let (stream, _) = self.accept().await?;
        let id = connections.next_local.fetch_add(1, Ordering::Relaxed);
        Ok((stream, Peer::Local(id)))
    }
}

/// Accepts connections on `listener`, closing at once those past the limit; TCP and the Unix
/// socket count toward the same limit.
pub(crate) fn accept<L: Listener>(
    listener: L,
    connections: Arc<Connections>,
) -> impl Stream<Item = io::Result<CountedStream<L::Stream>>> {
    futures::stream::unfold((listener, connections), |(l, c)| async move {
        loop {
            match l.next(&c).await {
                Ok((stream, peer)) => {
                    let Some(guard) = c.admit(peer) else {
                        drop(stream);
                        continue;
                    };
                    return Some((Ok(CountedStream { stream, guard }), (l, c)));
                }
                Err(e) => {
                    // Out of file descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Some((Err(e), (l, c)));
                }
            }
        }
    })
}

impl Connected for CountedStream<TcpStream> {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl Connected for CountedStream<UnixStream> {
    type ConnectInfo = LocalConnectInfo;
    fn connect_info(&self) -> LocalConnectInfo {
        match self.guard.peer {
            Peer::Local(id) => LocalConnectInfo {
                id,
                uid: self.stream.peer_cred().ok().map(|c| c.uid()),
            },
            Peer::Tcp(_) => unreachable!("a Unix socket connection is counted as local"),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CountedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.guard.life.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(evicted()));
        }
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if read.is_pending() && !self.guard.life.proven.load(Ordering::Acquire) {
            // Waiting for bytes that may never come: eviction must wake it.
            let life = &self.guard.life;
            life.waker.register(cx.waker());
            if life.evicted.load(Ordering::Acquire) {
                return Poll::Ready(Err(evicted()));
            }
        }
        read
    }
}

fn evicted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed to make room for a new connection (--max-connections): it had made no request",
    )
}

impl<S> CountedStream<S> {
    /// A write's or flush's result for a connection that may be evicted: an error once it
    /// is, and a pending one of an unproven connection wakes at eviction. A peer that sends
    /// PINGs and reads nothing keeps the server flushing, never reading (helper-68).
    fn watch_write<T>(&self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let life = &self.guard.life;
        if r.is_pending() && !life.proven.load(Ordering::Acquire) {
            life.waker.register(cx.waker());
        }
        if life.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(evicted()));
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.guard.life.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(evicted()));
        }
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch_write(cx, r)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.guard.life.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(evicted()));
        }
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch_write(cx, r)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.guard.life.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Err(evicted()));
        }
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch_write(cx, r)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connection {
    fn new(unsent: crate::unsent::Budget, life: Arc<Life>) -> Self {
        let unsent_limit = unsent.limit();
        Connection {
            life,
            unacked: AtomicU64::new(0),
            room: Notify::new(),
            room_waiters: AtomicUsize::new(0),
            transactions: AtomicUsize::new(0),
            cursors: AtomicUsize::new(0),
            partial: AtomicU64::new(0),
            unsent: Arc::new(unsent),
            unsent_limit,
        }
    }

    /// The same, for a request's extensions ([`Proof`]).
    pub(crate) fn proof(&self) -> Proof {
        Proof(self.life.clone())
    }

    /// A receive stream's budgets of deliveries not yet written, for batches of at most
    /// `batch` bytes (`crate::unsent`).
    pub(crate) fn unsent(&self, batch: usize) -> crate::unsent::Unsent {
        crate::unsent::Unsent::new(self.unsent.clone(), self.unsent_limit, batch)
    }

    /// The connection's budget of bytes built for its client and not yet taken: its receive
    /// streams' deliveries and its send streams' answers (`crate::unsent`).
    pub(crate) fn unsent_budget(&self) -> Arc<crate::unsent::Budget> {
        self.unsent.clone()
    }

    /// Takes up to `want` delivery slots, keeping the connection's unacknowledged messages at
    /// most `max`; returns how many it got.
    ///
    /// A stream that got fewer than it wanted registers with [`Connection::wait_for_room`] and
    /// then asks again: slots given back between the two are seen by the second ask, those
    /// given back after it wake the stream (the orders are `SeqCst` on both sides).
    pub(crate) fn reserve_unacked(&self, want: u64, max: u64) -> u64 {
        let mut cur = self.unacked.load(Ordering::SeqCst);
        loop {
            let got = want.min(max.saturating_sub(cur));
            if got == 0 {
                return 0;
            }
            match self.unacked.compare_exchange_weak(
                cur,
                cur + got,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return got,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives delivery slots back (acknowledged, returned, or not used).
    pub(crate) fn release_unacked(&self, n: u64) {
        if n > 0 {
            let _ = self
                .unacked
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                    Some(c.saturating_sub(n))
                });
            if self.room_waiters.load(Ordering::SeqCst) > 0 {
                self.room.notify_waiters();
            }
        }
    }

    /// Registers a stream that found no room: the returned future resolves once another
    /// stream of this connection gives slots back. Register, then reserve again before
    /// waiting (see [`Connection::reserve_unacked`]).
    pub(crate) fn wait_for_room(&self) -> RoomWait<'_> {
        self.room_waiters.fetch_add(1, Ordering::SeqCst);
        let mut notified = Box::pin(self.room.notified());
        notified.as_mut().enable();
        RoomWait {
            conn: self,
            notified,
        }
    }

    /// Opens a transaction slot, or `None` if the connection has `max` open.
    pub(crate) fn open_transaction(self: &Arc<Self>, max: usize) -> Option<TransactionSlot> {
        let mut cur = self.transactions.load(Ordering::Acquire);
        loop {
            if cur >= max {
                return None;
            }
            match self.transactions.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(TransactionSlot(self.clone())),
                Err(now) => cur = now,
            }
        }
    }
}

/// A receive stream waiting for room on its connection ([`Connection::wait_for_room`]).
pub(crate) struct RoomWait<'a> {
    conn: &'a Connection,
    notified: Pin<Box<tokio::sync::futures::Notified<'a>>>,
}

impl std::future::Future for RoomWait<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.notified.as_mut().poll(cx)
    }
}

impl Drop for RoomWait<'_> {
    fn drop(&mut self) {
        self.conn.room_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Connection {
    /// Bytes of request messages received in part on this connection.
    pub(crate) fn partial_bytes(&self) -> &AtomicU64 {
        &self.partial
    }

    /// Opens a cursor slot, or `None` if the connection has `max` open.
    pub(crate) fn open_cursor(self: &Arc<Self>, max: usize) -> Option<CursorSlot> {
        let n = self.cursors.fetch_add(1, Ordering::AcqRel);
        if n >= max {
            self.cursors.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(CursorSlot(self.clone()))
    }
}

/// One open cursor of a connection; closes it when dropped.
#[derive(Debug)]
pub(crate) struct CursorSlot(Arc<Connection>);

impl Drop for CursorSlot {
    fn drop(&mut self) {
        self.0.cursors.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One open transaction of a connection; closes it when dropped.
#[derive(Debug)]
pub(crate) struct TransactionSlot(Arc<Connection>);

impl Drop for TransactionSlot {
    fn drop(&mut self) {
        self.0.transactions.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A broker-wide byte budget (bytes staged by open transactions).
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Self {
        Budget {
            used: AtomicU64::new(0),
            limit,
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `n` bytes if they fit.
    pub(crate) fn try_take(&self, n: u64) -> bool {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            if cur.saturating_add(n) > self.limit {
                return false;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn give(&self, n: u64) {
        if n > 0 {
            let _ = self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    Some(c.saturating_sub(n))
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_refuses_what_does_not_fit() {
        let b = Budget::new(10);
        assert!(b.try_take(6));
        assert!(!b.try_take(5));
        assert!(b.try_take(4));
        b.give(6);
        assert_eq!(b.used(), 4);
    }

    /// The next connection `incoming` accepts, in a task of its own (with `incoming` back).
    fn accept_next<S, T>(mut incoming: S) -> tokio::task::JoinHandle<(Option<T>, S)>
    where
        S: Stream<Item = io::Result<T>> + Unpin + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(async move {
            let s = futures::StreamExt::next(&mut incoming).await;
            (s.and_then(|r| r.ok()), incoming)
        })
    }

    /// A listener accepting at most one connection, and one connection accepted: its
    /// address, the count, the accepting stream, the client's end and the server's.
    async fn one_connection_of_one() -> (
        SocketAddr,
        Arc<Connections>,
        Pin<Box<impl Stream<Item = io::Result<CountedStream<TcpStream>>>>>,
        TcpStream,
        CountedStream<TcpStream>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(Connections::new(1, 64 << 20, 4 << 20, 1 << 30));
        let mut incoming = Box::pin(accept(listener, conns.clone()));
        let client = TcpStream::connect(addr).await.unwrap();
        let served = futures::StreamExt::next(&mut incoming)
            .await
            .unwrap()
            .unwrap();
        (addr, conns, incoming, client, served)
    }

    /// Asserts that the broker closed `s` (a connection past the limit): its read ends.
    async fn closed_at_once(s: &mut TcpStream) {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the connection past the limit is closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    /// A connection with 64 MiB budgets.
    fn test_connection() -> Connection {
        Connection::new(
            crate::unsent::Budget::new(
                64 << 20,
                64 << 20,
                Arc::new(tokio::sync::Semaphore::new(64 << 20)),
            ),
            Arc::default(),
        )
    }

    #[test]
    fn unacked_slots_are_capped_per_connection() {
        let c = test_connection();
        assert_eq!(c.reserve_unacked(8, 10), 8);
        assert_eq!(c.reserve_unacked(8, 10), 2);
        assert_eq!(c.reserve_unacked(1, 10), 0);
        c.release_unacked(5);
        assert_eq!(c.reserve_unacked(100, 10), 5);
    }

    /// A stream that registered for room is woken by slots given back after it registered,
    /// and one that registered late sees, on its second ask, the slots given back before.
    #[tokio::test]
    async fn a_stream_waiting_for_room_is_woken_or_finds_it() {
        let c = test_connection();
        assert_eq!(c.reserve_unacked(10, 10), 10);
        let wait = c.wait_for_room();
        assert_eq!(c.reserve_unacked(1, 10), 0);
        c.release_unacked(3);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("woken by the slots given back");
        assert_eq!(c.room_waiters.load(Ordering::SeqCst), 0);
        // Given back between the first ask and the registration: the second ask finds them.
        assert_eq!(c.reserve_unacked(5, 10), 3);
        c.release_unacked(2);
        let _wait = c.wait_for_room();
        assert_eq!(c.reserve_unacked(5, 10), 2);
    }

    #[test]
    fn transaction_slots_are_capped_and_given_back() {
        let c = Arc::new(test_connection());
        let a = c.open_transaction(2).unwrap();
        let _b = c.open_transaction(2).unwrap();
        assert!(c.open_transaction(2).is_none());
        drop(a);
        assert!(c.open_transaction(2).is_some());
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_and_counted_while_open() {
        let (addr, conns, incoming, _first, served) = one_connection_of_one().await;
        assert_eq!(conns.live(), 1);
        // It made a request: it keeps its place.
        served.guard.life.prove();
        // The second is accepted and closed: its reads end at once.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let next = accept_next(incoming);
        closed_at_once(&mut second).await;
        assert_eq!(
            conns.closed_for_limits(),
            [1, 0, 0],
            "one refused at the limit"
        );
        // Closing the first frees its place.
        drop(served);
        assert_eq!(conns.live(), 0);
        let _third = TcpStream::connect(addr).await.unwrap();
        let (got, _incoming) = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the third connection is accepted")
            .unwrap();
        assert!(got.is_some());
        assert_eq!(conns.live(), 1);
        drop(got);
        assert_eq!(conns.live(), 0);
    }

    /// A connection with a call under way (a password being checked, an anonymous receive
    /// stream) is not evicted, proven or not: at the limit the new connection is refused
    /// instead; once the call is over the connection gives its place again (helper-72).
    #[tokio::test]
    async fn a_connection_with_a_call_under_way_keeps_its_place() {
        let (addr, conns, incoming, _first, served) = one_connection_of_one().await;
        let call = Proof(served.guard.life.clone()).call();
        let next = accept_next(incoming);
        let mut second = TcpStream::connect(addr).await.unwrap();
        closed_at_once(&mut second).await;
        assert_eq!(
            conns.closed_for_limits(),
            [1, 0, 0],
            "refused, none evicted"
        );
        drop(call);
        let _third = TcpStream::connect(addr).await.unwrap();
        let (got, _incoming) = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the third connection is accepted")
            .unwrap();
        assert!(got.is_some());
        assert_eq!(
            conns.closed_for_limits(),
            [1, 0, 1],
            "the first was evicted"
        );
    }

    /// An evicted connection that is writing (its peer reads nothing, as one that sends
    /// PINGs and never reads the answers) is woken too: its write fails (helper-68).
    #[tokio::test]
    async fn an_evicted_connection_stuck_writing_is_woken() {
        use tokio::io::AsyncWriteExt;
        let (addr, _conns, mut incoming, _first, mut silent) = one_connection_of_one().await;
        let writing = tokio::spawn(async move {
            // Far more than the socket buffers hold: the write waits.
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..256 {
                silent.write_all(&chunk).await?;
            }
            Ok::<_, io::Error>(())
        });
        let _second = TcpStream::connect(addr).await.unwrap();
        let _served = tokio::time::timeout(
            Duration::from_secs(10),
            futures::StreamExt::next(&mut incoming),
        )
        .await
        .expect("the second connection is accepted");
        let wrote = tokio::time::timeout(Duration::from_secs(10), writing)
            .await
            .expect("the stuck write was woken")
            .unwrap();
        assert_eq!(wrote.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }

    /// At the limit, a new connection closes the oldest one that has made no request: its
    /// pending read ends with an error (it is woken), and the new one is served.
    #[tokio::test]
    async fn a_connection_that_made_no_request_gives_its_place_to_a_new_one() {
        use tokio::io::AsyncReadExt;
        let (addr, conns, mut incoming, _first, mut silent) = one_connection_of_one().await;
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            silent.read(&mut buf).await
        });
        let _second = TcpStream::connect(addr).await.unwrap();
        let served = tokio::time::timeout(
            Duration::from_secs(10),
            futures::StreamExt::next(&mut incoming),
        )
        .await
        .expect("the second connection is accepted")
        .unwrap()
        .unwrap();
        let read = tokio::time::timeout(Duration::from_secs(10), reading)
            .await
            .expect("the silent connection's read was woken")
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(conns.closed_for_limits(), [0, 0, 1], "one evicted");
        assert_eq!(conns.live(), 1);
        drop(served);
        assert_eq!(conns.live(), 0);
    }
}
