//! The floor under a synchronous transaction on this machine (issue 14 point 3), measured in one
//! go: what one durable commit and one round trip between two processes cost at best, with
//! nothing of mq's own work in them. Not shipped in mqd; a probe for docs/benchmarks.md.
//!
//! ```sh
//! cargo build --release -p mq-perf --example txfloor
//! target/release/examples/txfloor --dir /tmp --count 3000
//! ```
//!
//! It measures, one after another (each line: rate, p50, p90, p99 in µs):
//! - `fsync fallocated`: `pwrite` of one `--record`-byte record (1,137 B: what a one-send
//!   transaction of a 1000 B body writes) at the next offset of a file preallocated with
//!   `fallocate`, as the journal's segments are, then `fdatasync`, awaited one at a time.
//! - `fsync zeroed`: the same into a file whose blocks were written (zeros) and synced first:
//!   no unwritten extents to convert, so `fdatasync` has no metadata to commit.
//! - `tcp`: a ping-pong over loopback TCP (nodelay) between this process and a child, blocking
//!   sockets: the cheapest round trip between two processes.
//! - `grpc`: a tonic bidi stream between this process and a child, with mqd's server settings
//!   (HTTP/2 windows, frame size, keepalive, nodelay, `#[tokio::main]`'s runtime) and
//!   mq-client's endpoint settings, mq's codec: one `--record`-byte request, a 16-byte answer,
//!   awaited one at a time. `task`: the server answers from a spawned task through a channel, as
//!   mqd's `Transact` does; `map`: the answer stream is the request stream mapped (cheapest).
//!   `block_on`: the client loop runs on `block_on`'s thread (as mqperf's one-at-a-time loop did);
//!   `worker`: inside `tokio::spawn`, on a runtime worker.
//!
//! The ceiling of a synchronous transaction is then 1 / (fsync + round trip).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use hdrhistogram::Histogram;
use mq_proto::codec::MqCodec;

const PATH: &str = "/probe.Ping/Ping";
const REPLY: usize = 16;

struct Args {
    dir: PathBuf,
    count: usize,
    record: usize,
    rounds: usize,
    only: Option<String>,
}

fn args() -> Result<(Option<String>, Args)> {
    let mut a = Args {
        dir: std::env::temp_dir(),
        count: 3000,
        record: 1137,
        rounds: 1,
        only: None,
    };
    let mut role = None;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--dir" => a.dir = v()?.into(),
            "--count" => a.count = v()?.parse()?,
            "--record" => a.record = v()?.parse()?,
            "--rounds" => a.rounds = v()?.parse()?,
            "--only" => a.only = Some(v()?),
            "--serve-grpc" | "--serve-tcp" => role = Some(format!("{k}:{}", v()?)),
            _ => bail!("unknown argument {k}"),
        }
    }
    Ok((role, a))
}

fn main() -> Result<()> {
    let (role, a) = args()?;
    match role.as_deref() {
        Some(r) if r.starts_with("--serve-grpc:") => return serve_grpc(&r[13..]),
        Some(r) if r.starts_with("--serve-tcp:") => return serve_tcp(r[12..].parse()?),
        _ => {}
    }
    let want = |name: &str| a.only.as_deref().is_none_or(|o| name.starts_with(o));
    println!(
        "# {} x {} B, dir {}, {}",
        a.count,
        a.record,
        a.dir.display(),
        load()
    );
    println!(
        "{:<24} {:>8} {:>8} {:>8} {:>8}",
        "what", "per s", "p50 µs", "p90 µs", "p99 µs"
    );
    for _ in 0..a.rounds {
        if want("fsync fallocated") {
            report("fsync fallocated", &fsync(&a, false)?);
        }
        if want("fsync zeroed") {
            report("fsync zeroed", &fsync(&a, true)?);
        }
        if want("tcp") {
            report("tcp", &tcp(&a)?);
        }
        for (server, client) in [("task", "block_on"), ("task", "worker"), ("map", "worker")] {
            let name = format!("grpc {server} {client}");
            if want(&name) {
                report(&name, &grpc(&a, server, client)?);
            }
        }
    }
    Ok(())
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| {
            format!(
                "load {}",
                l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
            )
        })
        .unwrap_or_default()
}

/// Per-iteration times and the whole loop's time.
struct Timed {
    hist: Histogram<u64>,
    elapsed: Duration,
}

impl Timed {
    fn new() -> Self {
        Timed {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
            elapsed: Duration::ZERO,
        }
    }
    fn record(&mut self, d: Duration) {
        let _ = self.hist.record((d.as_nanos() as u64).max(1));
    }
}

fn report(name: &str, t: &Timed) {
    let us = |q: f64| t.hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{:<24} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
        name,
        t.hist.len() as f64 / t.elapsed.as_secs_f64(),
        us(0.5),
        us(0.9),
        us(0.99)
    );
}

fn fsync(a: &Args, zeroed: bool) -> Result<Timed> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let size = (a.count * a.record + (1 << 20)) as u64;
    let path = a.dir.join(format!("txfloor-{}.dat", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    let cleanup = scopeguard(path.clone());
    if zeroed {
        // Zeros written and synced 1 MiB at a time, as a journal would lay a runway ahead of
        // its writes; the time of one such step is printed.
        let zeros = vec![0u8; 1 << 20];
        let mut off = 0;
        let mut steps = Timed::new();
        let t = Instant::now();
        while off < size {
            let t0 = Instant::now();
            f.write_all_at(&zeros, off)?;
            f.sync_data()?;
            steps.record(t0.elapsed());
            off += zeros.len() as u64;
        }
        steps.elapsed = t.elapsed();
        report("  zeroing 1 MiB + sync", &steps);
    } else {
        #[allow(unsafe_code)]
        // SAFETY: a plain syscall on a descriptor we own.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) };
        if r != 0 {
            bail!("fallocate: {}", std::io::Error::last_os_error());
        }
    }
    f.sync_all()?;
    let rec = vec![0x5au8; a.record];
    let mut t = Timed::new();
    let start = Instant::now();
    for i in 0..a.count {
        let t0 = Instant::now();
        f.write_all_at(&rec, (i * a.record) as u64)?;
        f.sync_data()?;
        t.record(t0.elapsed());
    }
    t.elapsed = start.elapsed();
    drop(cleanup);
    Ok(t)
}

/// Removes the file when dropped.
struct Remove(PathBuf);
impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
fn scopeguard(p: PathBuf) -> Remove {
    Remove(p)
}

/// Starts this program again as the server of `role`; returns the child and the port it
/// printed.
fn child(flag: &str, mode: &str) -> Result<(std::process::Child, u16)> {
    let mut c = Command::new(std::env::current_exe()?)
        .args([flag, mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = c.stdout.take().expect("piped");
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b)? == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let port = String::from_utf8(line)?.trim().parse()?;
    Ok((c, port))
}

fn serve_tcp(_: u32) -> Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", l.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut s, _) = l.accept()?;
    s.set_nodelay(true)?;
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    while s.read_exact(&mut len).is_ok() {
        buf.resize(u32::from_le_bytes(len) as usize, 0);
        s.read_exact(&mut buf)?;
        s.write_all(&[1u8; REPLY])?;
    }
    Ok(())
}

fn tcp(a: &Args) -> Result<Timed> {
    let (mut c, port) = child("--serve-tcp", "0")?;
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let mut req = (a.record as u32).to_le_bytes().to_vec();
    req.extend(std::iter::repeat_n(0x5au8, a.record));
    let mut reply = [0u8; REPLY];
    let mut t = Timed::new();
    let start = Instant::now();
    for _ in 0..a.count {
        let t0 = Instant::now();
        s.write_all(&req)?;
        s.read_exact(&mut reply)?;
        t.record(t0.elapsed());
    }
    t.elapsed = start.elapsed();
    drop(s);
    let _ = c.wait();
    Ok(t)
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Bytes, tonic::Status>> + Send>>;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// The probe's gRPC service: one bidi method, `PATH`.
#[derive(Clone)]
struct Ping {
    /// Answer from a spawned task through a channel (as mqd's Transact), or map the stream.
    task: bool,
}

impl tonic::server::NamedService for Ping {
    const NAME: &'static str = "probe.Ping";
}

struct PingSvc(bool);

impl tonic::server::StreamingService<Bytes> for PingSvc {
    type Response = Bytes;
    type ResponseStream = BoxStream;
    type Future = BoxFuture<Result<tonic::Response<BoxStream>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let task = self.0;
        Box::pin(async move {
            let mut inbound = request.into_inner();
            let reply = Bytes::from_static(&[1u8; REPLY]);
            if !task {
                let s = inbound.map(move |r| r.map(|_| reply.clone()));
                return Ok(tonic::Response::new(Box::pin(s) as BoxStream));
            }
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, tonic::Status>>(4);
            tokio::spawn(async move {
                while let Some(Ok(_)) = inbound.next().await {
                    if tx.send(Ok(reply.clone())).await.is_err() {
                        break;
                    }
                }
            });
            let s = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
            Ok(tonic::Response::new(Box::pin(s) as BoxStream))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Ping {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let task = self.task;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(MqCodec::<Bytes, Bytes>::default());
            Ok(grpc.streaming(PingSvc(task), req).await)
        })
    }
}

/// The server side, with mqd's runtime (`#[tokio::main]`: multi-thread, one worker per core)
/// and its HTTP/2 settings (broker/src/server.rs).
fn serve_grpc(mode: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let task = mode == "task";
    rt.block_on(async move {
        let incoming = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse()?)?
            .with_nodelay(Some(true));
        println!("{}", incoming.local_addr()?.port());
        std::io::stdout().flush()?;
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .initial_stream_window_size(Some(8 * 1024 * 1024))
            .initial_connection_window_size(Some(16 * 1024 * 1024))
            .max_frame_size(Some(mq_proto::HTTP2_MAX_FRAME_SIZE))
            .add_service(Ping { task })
            .serve_with_incoming_shutdown(incoming, async {
                // Ends when the parent closes our stdin.
                let mut b = [0u8; 1];
                let _ = tokio::task::spawn_blocking(move || std::io::stdin().read(&mut b)).await;
            })
            .await?;
        anyhow::Ok(())
    })
}

/// The client side, with mq-client's endpoint settings (client/src/builder.rs) on mqperf's
/// runtime; `client`: `block_on` (the loop on `block_on`'s thread) or `worker` (in a task).
fn grpc(a: &Args, server: &str, client: &str) -> Result<Timed> {
    let (mut c, port) = child("--serve-grpc", server)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (count, record) = (a.count, a.record);
    let run = async move {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .initial_stream_window_size(Some(8 * 1024 * 1024))
            .initial_connection_window_size(Some(16 * 1024 * 1024))
            .max_frame_size(Some(mq_proto::HTTP2_MAX_FRAME_SIZE));
        let channel = endpoint.connect().await?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let resp = grpc
            .streaming(
                tonic::Request::new(outbound),
                http::uri::PathAndQuery::from_static(PATH),
                MqCodec::<Bytes, Bytes>::default(),
            )
            .await?;
        let mut inbound = resp.into_inner();
        let req = Bytes::from(vec![0x5au8; record]);
        // Warm-up.
        for _ in 0..100 {
            tx.send(req.clone()).await?;
            inbound.message().await?.context("stream ended")?;
        }
        let mut t = Timed::new();
        let start = Instant::now();
        for _ in 0..count {
            let t0 = Instant::now();
            tx.send(req.clone()).await?;
            inbound.message().await?.context("stream ended")?;
            t.record(t0.elapsed());
        }
        t.elapsed = start.elapsed();
        anyhow::Ok(t)
    };
    let t = if client == "worker" {
        rt.block_on(async { tokio::spawn(run).await? })?
    } else {
        rt.block_on(run)?
    };
    drop(rt);
    drop(c.stdin.take());
    let _ = c.wait();
    Ok(t)
}
