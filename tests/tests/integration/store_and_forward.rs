//! Store-and-forward between real `mqd` processes on loopback: a send to a queue on another
//! broker lands in the sending broker's outgoing queue and is forwarded when the destination is
//! reachable. Recoverable and transactional messages arrive exactly once and in send order across
//! a destination that is down at send time, concurrent senders sharing one outgoing queue, a
//! `kill -9` of the destination mid-transfer and a `kill -9` of the sending broker
//! mid-transfer; express messages are best effort (memory only);
//! a remote transaction forwards nothing on abort and everything once on commit; a
//! multiple-element name reaches a local queue and two other brokers with one id; outgoing
//! queues pause and resume (client API and `mq outgoing`).
//!
//! Every broker runs with `--forward-retry-max 200ms` so reconnections are quick. Every wait is
//! bounded and polls a condition; nothing sleeps a fixed time.

use std::cell::Cell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use mq_client::{
    Client, Delivery, Message, MessageId, OutgoingQueue, OutgoingState, QueueOptions, SenderOptions,
};
use mq_tests::{
    drain_queue, eventually, free_port, loopback, mq, temp_data_dir, MqdProcess, STOP_TIMEOUT,
};

pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// One RPC to a broker that may be down or restarting.
const PROBE: Duration = Duration::from_secs(2);

/// A broker at a fixed `127.0.0.1` port with its own data directory, so it can stop and come
/// back where the other brokers expect it. Stopped by PID ([`MqdProcess`]) when dropped.
#[derive(Debug)]
pub(crate) struct Node {
    // First, so the process dies before its data directory is removed.
    mqd: Option<MqdProcess>,
    /// stderr of the earlier runs, for failure messages.
    earlier_logs: String,
    name: String,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Node {
    /// A node named `name` (`mqd --name`) at a free port; not started.
    pub(crate) fn new(name: &str) -> Node {
        Node {
            mqd: None,
            earlier_logs: String::new(),
            name: name.to_string(),
            addr: loopback(free_port()),
            dir: temp_data_dir(&format!("mq-saf-{name}-")),
        }
    }

    /// A node, started.
    pub(crate) fn started(name: &str) -> Node {
        let mut n = Node::new(name);
        n.start();
        n
    }

    /// Starts `mqd` on the node's port and data directory (retrying while the port is still
    /// held by a process killed a moment ago).
    pub(crate) fn start(&mut self) {
        assert!(self.mqd.is_none(), "{} already runs", self.name);
        let args = ["--name", self.name.as_str(), "--forward-retry-max", "200ms"];
        self.mqd = Some(MqdProcess::launch_on(self.dir.path(), self.addr, &args));
    }

    /// SIGKILL by PID.
    pub(crate) fn kill9(&mut self) {
        let mut p = self
            .mqd
            .take()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        p.kill9_checked();
        self.keep_logs(&p, "killed with SIGKILL");
    }

    fn keep_logs(&mut self, p: &MqdProcess, how: &str) {
        self.earlier_logs.push_str(&format!(
            "{}\n--- {} pid {} {how} ---\n",
            p.stderr(),
            self.name,
            p.pid()
        ));
    }

    /// Everything every run of this node wrote to stderr (its logs), for failure messages.
    pub(crate) fn logs(&self) -> String {
        format!(
            "--- {} logs ---\n{}{}",
            self.name,
            self.earlier_logs,
            self.mqd.as_ref().map(|p| p.stderr()).unwrap_or_default()
        )
    }

    /// SIGTERM by PID; asserts a clean exit.
    pub(crate) fn terminate(&mut self) {
        let mut p = self
            .mqd
            .take()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        let status = p.terminate(STOP_TIMEOUT).unwrap();
        self.keep_logs(&p, "stopped with SIGTERM");
        assert!(
            status.success(),
            "{} after SIGTERM: {status}; stderr: {}",
            self.name,
            p.stderr()
        );
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The destination as outgoing queues name it: `127.0.0.1:<port>`.
    pub(crate) fn dest(&self) -> String {
        self.addr.to_string()
    }

    /// The format name other brokers use for this node's private queue `queue`.
    pub(crate) fn queue(&self, queue: &str) -> String {
        format!(r"DIRECT=TCP:{}\private$\{queue}", self.addr)
    }

    /// A client connected to the running node.
    pub(crate) async fn client(&self) -> Client {
        self.mqd
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.name))
            .connect()
            .await
    }
}

/// `.\private$\<name>`: the local path name of a queue a [`Node::queue`] names remotely.
pub(crate) fn local(name: &str) -> String {
    format!(r".\private$\{name}")
}

pub(crate) async fn create(client: &Client, name: &str, transactional: bool, quota: Option<u64>) {
    client
        .create_queue(
            &local(name),
            QueueOptions {
                transactional,
                quota_bytes: quota,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// The outgoing queue for `dest` (`127.0.0.1:<port>`), if the broker lists one.
pub(crate) async fn outgoing_to(client: &Client, dest: &str) -> Option<OutgoingQueue> {
    client
        .outgoing()
        .await
        .unwrap_or_else(|e| panic!("list outgoing queues: {e}"))
        .into_iter()
        .find(|q| q.destination == dest)
}

/// Messages waiting or in flight for `dest` (an absent outgoing queue holds none).
pub(crate) async fn outgoing_messages(client: &Client, dest: &str) -> u64 {
    outgoing_to(client, dest).await.map_or(0, |q| q.messages)
}

/// Waits until the outgoing queue for `dest` is empty (or absent); panics with its state if not.
pub(crate) async fn wait_outgoing_empty(client: &Client, dest: &str) {
    let empty = eventually(WAIT, || async {
        outgoing_to(client, dest)
            .await
            .is_none_or(|q| q.messages == 0 && q.in_flight == 0)
    })
    .await;
    assert!(
        empty,
        "the outgoing queue for {dest} never emptied: {:?}",
        outgoing_to(client, dest).await
    );
}

/// A queue's message count, or `None` if the broker does not answer (down, restarting).
pub(crate) async fn try_count(client: &Client, queue: &str) -> Option<u64> {
    tokio::time::timeout(PROBE, client.queue_info(&local(queue)))
        .await
        .ok()
        .and_then(|r| r.ok())
        .map(|i| i.messages)
}

/// Waits until `queue` holds exactly `n` messages; panics with what it holds if not.
pub(crate) async fn wait_count(client: &Client, queue: &str, n: u64) {
    let reached = eventually(WAIT, || async { try_count(client, queue).await == Some(n) }).await;
    assert!(
        reached,
        "{queue} holds {:?} messages, expected {n}",
        try_count(client, queue).await
    );
}

/// Receives everything `queue` holds and returns the bodies as text.
pub(crate) async fn drain(client: &Client, queue: &str) -> Vec<String> {
    drain_queue(client, &local(queue), WAIT)
        .await
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect()
}

/// Bodies `"{prefix}{n}"` as numbers; panics on anything else.
fn numbers(bodies: &[String], prefix: &str) -> Vec<u64> {
    bodies
        .iter()
        .map(|s| {
            s.strip_prefix(prefix)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected body {s:?} (expected {prefix}<n>)"))
        })
        .collect()
}

/// Whether the bodies are exactly `{prefix}1 ..= {prefix}n`, in order; if not, what is wrong
/// (losses, duplicates, the first reordering), precisely.
pub(crate) fn order_problem(bodies: &[String], prefix: &str, n: u64) -> Option<String> {
    let got = numbers(bodies, prefix);
    let unique: HashSet<_> = got.iter().collect();
    let dups = got.len() - unique.len();
    let missing: Vec<u64> = (1..=n).filter(|i| !unique.contains(i)).collect();
    if dups != 0 || !missing.is_empty() || got.len() as u64 != n {
        return Some(format!(
            "{} messages, {dups} duplicates, {} of {n} missing: {}",
            got.len(),
            missing.len(),
            ranges(&missing)
        ));
    }
    (0..got.len()).find(|&i| got[i] != i as u64 + 1).map(|i| {
        format!(
            "out of order at position {i}: {:?}",
            &got[i.saturating_sub(3)..(i + 3).min(got.len())]
        )
    })
}

/// Asserts the bodies are exactly `{prefix}1 ..= {prefix}n`, in order (see [`order_problem`]).
#[track_caller]
pub(crate) fn assert_exactly_in_order(bodies: &[String], prefix: &str, n: u64, what: &str) {
    if let Some(p) = order_problem(bodies, prefix, n) {
        panic!("{what}: {p}");
    }
}

/// Like [`assert_exactly_in_order`], with the brokers' logs in the failure message.
#[track_caller]
fn assert_exactly_in_order_logs(
    bodies: &[String],
    prefix: &str,
    n: u64,
    what: &str,
    nodes: &[&Node],
) {
    if let Some(p) = order_problem(bodies, prefix, n) {
        let logs: Vec<String> = nodes.iter().map(|n| n.logs()).collect();
        panic!("{what}: {p}\n{}", logs.join("\n"));
    }
}

/// Polls `cond` every millisecond until it holds or `timeout` passes: for catching a transfer
/// in the middle, where [`eventually`]'s 10 ms could miss it.
async fn closely<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `1..=3, 7, 9..=10` for `[1, 2, 3, 7, 9, 10]` (sorted input).
fn ranges(ns: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ns.len() {
        let mut j = i;
        while j + 1 < ns.len() && ns[j + 1] == ns[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ns[i].to_string()
        } else {
            format!("{}..={}", ns[i], ns[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

fn bodies(prefix: &str, r: std::ops::RangeInclusive<u64>) -> Vec<String> {
    r.map(|i| format!("{prefix}{i}")).collect()
}

/// Sends `{prefix}1..={prefix}n` to `dest` through one pipelined sender (recoverable, or
/// single-message transactions) and returns the ids, in order, once all are acknowledged.
pub(crate) async fn send_numbered(
    client: &Client,
    dest: &str,
    prefix: &str,
    n: u64,
    transactional: bool,
) -> Vec<MessageId> {
    send_range(client, dest, prefix, 1..=n, transactional).await
}

/// [`send_numbered`] for the bodies `{prefix}{i}`, `i` in `range`.
async fn send_range(
    client: &Client,
    dest: &str,
    prefix: &str,
    range: std::ops::RangeInclusive<u64>,
    transactional: bool,
) -> Vec<MessageId> {
    let n = range.end() + 1 - range.start();
    let sender = client
        .sender(
            dest,
            SenderOptions {
                transactional,
                ..SenderOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("open a sender to {dest}: {e}"));
    let first = *range.start();
    let mut receipts = Vec::with_capacity(n as usize);
    for i in range {
        receipts.push(
            sender
                .send_with_receipt(Message::new(format!("{prefix}{i}")).recoverable(true))
                .await
                .unwrap_or_else(|e| panic!("send {prefix}{i} to {dest}: {e}")),
        );
    }
    let mut ids = Vec::with_capacity(n as usize);
    for (i, r) in receipts.into_iter().enumerate() {
        ids.push(
            r.await
                .unwrap_or_else(|e| panic!("{prefix}{} to {dest} refused: {e}", first + i as u64)),
        );
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, n);
    ids
}

/// Sends `{prefix}1..={prefix}n` to `dest` in transactions of `per_tx` messages each, committed
/// one after the other; returns the ids in order.
async fn send_in_transactions(
    client: &Client,
    dest: &str,
    prefix: &str,
    n: u64,
    per_tx: u64,
) -> Vec<MessageId> {
    let mut ids = Vec::with_capacity(n as usize);
    let mut next = 1;
    while next <= n {
        let mut tx = client.begin().await.unwrap();
        let last = (next + per_tx - 1).min(n);
        for i in next..=last {
            tx.send(dest, Message::new(format!("{prefix}{i}"))).unwrap();
        }
        let committed = tx
            .commit()
            .await
            .unwrap_or_else(|e| panic!("commit {prefix}{next}..{prefix}{last} to {dest}: {e}"));
        assert_eq!(committed.len() as u64, last - next + 1);
        ids.extend(committed);
        next = last + 1;
    }
    ids
}

// ---------------------------------------------------------------------------------------------
// 1. The destination is down at send time.

/// Sends `N` messages to a queue on B while B is down: every send is acknowledged by A, A's
/// outgoing queue holds them (WAITING or CONNECTING, with the connection error), and once B is
/// back on its port they arrive exactly once, in order, and A's outgoing queue empties.
async fn remote_down_at_send_time(transactional: bool) {
    const N: u64 = 2_000;
    let q = if transactional { "tq" } else { "q" };
    let mut b = Node::started("b");
    create(&b.client().await, q, transactional, None).await;
    b.terminate();

    let a = Node::started("a");
    let client = a.client().await;
    let dest = b.queue(q);
    let ids = if transactional {
        send_in_transactions(&client, &dest, "m", N, 250).await
    } else {
        send_numbered(&client, &dest, "m", N, false).await
    };
    assert_eq!(ids.len() as u64, N);

    // The forwarder has tried (and failed) to connect.
    let tried = eventually(WAIT, || async {
        outgoing_to(&client, &b.dest())
            .await
            .is_some_and(|o| o.last_error.is_some())
    })
    .await;
    let o = outgoing_to(&client, &b.dest()).await;
    assert!(
        tried,
        "no connection error reported for {}: {o:?}",
        b.dest()
    );
    let o = o.unwrap();
    assert!(
        matches!(o.state, OutgoingState::Waiting | OutgoingState::Connecting),
        "{o:?}"
    );
    assert_eq!((o.messages, o.forwarded), (N, 0), "{o:?}");
    assert!(o.bytes >= N, "{o:?}");
    assert!(!o.last_error.as_deref().unwrap_or("").is_empty(), "{o:?}");
    if o.state == OutgoingState::Waiting {
        assert!(
            o.next_retry.is_some(),
            "WAITING without a next retry: {o:?}"
        );
    }

    b.start();
    let bc = b.client().await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(
        try_count(&bc, q).await,
        Some(N),
        "B after A's queue emptied"
    );
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!(o.forwarded, N, "{o:?}");
    assert!(
        matches!(o.state, OutgoingState::Connected | OutgoingState::Inactive),
        "{o:?}"
    );

    let head = bc
        .queue(&local(q))
        .unwrap()
        .peek(Duration::ZERO)
        .await
        .unwrap()
        .expect("a message on B");
    assert_eq!(head.id, ids[0], "the id survives forwarding");
    assert_eq!(head.body.as_ref(), b"m1");
    assert_eq!(head.transactional, transactional);
    if !transactional {
        assert_eq!(head.delivery, Delivery::Recoverable);
    }
    assert_exactly_in_order(&drain(&bc, q).await, "m", N, "B's queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoverable_sent_while_remote_down_arrive_once_in_order() {
    remote_down_at_send_time(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_sent_while_remote_down_arrive_once_in_order() {
    remote_down_at_send_time(true).await;
}

// ---------------------------------------------------------------------------------------------
// 1b. Several senders into one outgoing queue, both brokers up.

/// Two recoverable senders (on two connections) and a sender of single-message transactions
/// send concurrently through A to three queues on B, which is up all along: every message
/// arrives exactly once, in each sender's order. (No crash: what is checked is that the outgoing
/// queue's order and the stream sequence agree when sends commit concurrently.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_to_one_destination_exactly_once_in_order() {
    const N: u64 = 5_000;
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q1", false, None).await;
    create(&bc, "q2", false, None).await;
    create(&bc, "tq", true, None).await;
    let a = Node::started("a");
    let (c1, c2, c3) = (a.client().await, a.client().await, a.client().await);
    let (q1, q2, tq) = (b.queue("q1"), b.queue("q2"), b.queue("tq"));
    futures::join!(
        send_numbered(&c1, &q1, "x", N, false),
        send_numbered(&c2, &q2, "y", N, false),
        send_numbered(&c3, &tq, "z", N, true)
    );
    wait_outgoing_empty(&c1, &b.dest()).await;
    let o = outgoing_to(&c1, &b.dest()).await.unwrap();
    assert_eq!((o.forwarded, o.dead_lettered), (3 * N, 0), "{o:?}");
    let got = [
        drain(&bc, "q1").await,
        drain(&bc, "q2").await,
        drain(&bc, "tq").await,
    ];
    let problems: Vec<String> = [("q1", "x"), ("q2", "y"), ("tq", "z")]
        .iter()
        .zip(&got)
        .filter_map(|((q, prefix), bodies)| {
            order_problem(bodies, prefix, N).map(|p| format!("{q}: {p}"))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "A forwarded (and B acknowledged) all {} messages, but B holds: {problems:#?}",
        3 * N
    );
}

// ---------------------------------------------------------------------------------------------
// 2. The destination killed mid-transfer.

/// A sends 5,000 recoverable messages and 1,000 single-message transactions to B (concurrently,
/// pipelined, so they interleave) while B is up; B is killed with SIGKILL as soon as it has
/// stored some (the second half is sent only after the kill, so B cannot have had all), then
/// restarted on its port and data directory: B then holds each message exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_mid_transfer_exactly_once_in_order() {
    const N: u64 = 5_000;
    const T: u64 = 1_000;
    let mut b = Node::started("b");
    {
        let bc = b.client().await;
        create(&bc, "q", false, None).await;
        create(&bc, "tq", true, None).await;
    }
    let a = Node::started("a");
    let client = a.client().await;

    let (killed_tx, killed_rx) = tokio::sync::oneshot::channel::<()>();
    let producer = {
        let (client, q, tq) = (client.clone(), b.queue("q"), b.queue("tq"));
        tokio::spawn(async move {
            futures::join!(
                send_range(&client, &q, "r", 1..=N / 2, false),
                send_range(&client, &tq, "t", 1..=T / 2, true)
            );
            killed_rx.await.unwrap();
            futures::join!(
                send_range(&client, &q, "r", N / 2 + 1..=N, false),
                send_range(&client, &tq, "t", T / 2 + 1..=T, true)
            );
        })
    };

    // Kill B as soon as it has stored some of the recoverable messages.
    let bc = b.client().await;
    let last = Cell::new(None);
    let caught = closely(WAIT, || async {
        last.set(try_count(&bc, "q").await);
        last.get().is_some_and(|n| n > 0)
    })
    .await;
    b.kill9();
    let _ = killed_tx.send(());
    assert!(
        caught,
        "B never stored anything (holds {:?})\n{}",
        last.get(),
        b.logs()
    );
    tokio::time::timeout(WAIT, producer)
        .await
        .expect("A acknowledges every send while B is down")
        .unwrap();
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    eprintln!(
        "B killed holding {:?} of {N}; A's outgoing queue after all sends: {o:?}",
        last.get()
    );
    assert!(o.messages >= (N + T) / 2, "{o:?}");

    b.start();
    let bc = b.client().await;
    wait_outgoing_empty(&client, &b.dest()).await;
    // Everything is acknowledged by B: B must hold each message once, in order.
    let (r, t) = (drain(&bc, "q").await, drain(&bc, "tq").await);
    assert_exactly_in_order_logs(&r, "r", N, "recoverable after kill -9 of B", &[&a, &b]);
    assert_exactly_in_order_logs(&t, "t", T, "transactional after kill -9 of B", &[&a, &b]);
}

// ---------------------------------------------------------------------------------------------
// 3. The sending broker killed mid-transfer.

/// A acknowledges 10,000 recoverable messages and 2,000 single-message transactions (sent
/// concurrently, so they interleave) for B while B is down; the outgoing queue is put on hold,
/// B starts, forwarding resumes, and A is killed with SIGKILL once B has some but not all. After
/// A restarts (same port, same data directory) B holds each exactly once, in order, and A's
/// outgoing queue empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_killed_mid_transfer_exactly_once_in_order() {
    const N: u64 = 10_000;
    const T: u64 = 2_000;
    let mut b = Node::started("b");
    {
        let bc = b.client().await;
        create(&bc, "q", false, None).await;
        create(&bc, "tq", true, None).await;
    }
    b.terminate();
    let mut a = Node::started("a");
    let client = a.client().await;
    let (q, tq) = (b.queue("q"), b.queue("tq"));
    futures::join!(
        send_numbered(&client, &q, "r", N, false),
        send_numbered(&client, &tq, "t", T, true)
    );
    assert_eq!(outgoing_messages(&client, &b.dest()).await, N + T);

    // Held while B starts, so the watch below sees the transfer from its first batch.
    client.pause_outgoing(&b.dest()).await.unwrap();
    b.start();
    let bc = b.client().await;
    assert_eq!(try_count(&bc, "q").await, Some(0));
    client.resume_outgoing(&b.dest()).await.unwrap();
    let last = Cell::new(None);
    let caught = closely(WAIT, || async {
        last.set(try_count(&bc, "q").await);
        last.get().is_some_and(|n| n > 0)
    })
    .await;
    a.kill9();
    assert!(caught, "B never received anything (holds {:?})", last.get());
    let at_kill = last.get().unwrap();
    // On a starved machine the watch can see B's count first when it is already whole (the
    // transactional ones may still be in transfer); what follows holds either way.
    eprintln!("A killed when B held {at_kill} of {N}");

    a.start();
    let client = a.client().await;
    wait_outgoing_empty(&client, &b.dest()).await;
    // Everything is acknowledged by B: B must hold each message once, in order.
    let (r, t) = (drain(&bc, "q").await, drain(&bc, "tq").await);
    assert_exactly_in_order_logs(&r, "r", N, "recoverable after kill -9 of A", &[&a, &b]);
    assert_exactly_in_order_logs(&t, "t", T, "transactional after kill -9 of A", &[&a, &b]);
    assert_eq!(outgoing_messages(&client, &b.dest()).await, 0);
}

// ---------------------------------------------------------------------------------------------
// 4. Express: best effort.

/// Sends `<prefix>1..=<prefix>n` as express messages through one pipelined sender; all acknowledged.
async fn send_express(client: &Client, dest: &str, prefix: &str, n: u64) {
    let sender = client.sender(dest, SenderOptions::default()).await.unwrap();
    for i in 1..=n {
        sender
            .send(Message::new(format!("{prefix}{i}")).delivery(Delivery::Express))
            .await
            .unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, n);
}

/// Express messages for a destination that is down wait in A's outgoing queue in memory: a
/// `kill -9` of A loses them (nothing arrives later), while with both brokers up express
/// forwarding delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn express_waits_in_memory_and_is_lost_with_the_sender() {
    const K: u64 = 100;
    let mut b = Node::started("b");
    create(&b.client().await, "q", false, None).await;
    b.terminate();
    let mut a = Node::started("a");
    let client = a.client().await;
    let dest = b.queue("q");
    send_express(&client, &dest, "lost", K).await;
    let o = outgoing_to(&client, &b.dest())
        .await
        .expect("an outgoing queue");
    assert_eq!(o.messages, K, "{o:?}");

    a.kill9();
    a.start();
    let client = a.client().await;
    assert_eq!(
        outgoing_messages(&client, &b.dest()).await,
        0,
        "express messages survived kill -9 of A: {:?}",
        outgoing_to(&client, &b.dest()).await
    );

    // A recoverable marker sent now arrives; had any express message survived, it would be in
    // the queue too (B is down until the marker is sent, so nothing was forwarded before).
    send_numbered(&client, &dest, "marker", 1, false).await;
    b.start();
    let bc = b.client().await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(drain(&bc, "q").await, ["marker1"]);

    // Both up: express forwarding delivers.
    send_express(&client, &dest, "e", K).await;
    wait_count(&bc, "q", K).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    let head = bc
        .queue(&local("q"))
        .unwrap()
        .peek(Duration::ZERO)
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(head.delivery, Delivery::Express);
    assert_exactly_in_order(&drain(&bc, "q").await, "e", K, "express with both up");
}

/// A client that vanishes while its batches are still being stored (nobody reads the
/// acknowledgements) must not leave A's outgoing queue stuck on a position that was admitted
/// and never made visible: a message sent afterwards still reaches B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_vanishes_mid_stream_does_not_stall_forwarding() {
    use mq_proto::v1;
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q", false, None).await;
    let a = Node::started("a");
    let dest = b.queue("q");
    let body = bytes::Bytes::from(vec![b'x'; 1000]);
    for _round in 0..4 {
        let mut rpc = v1::message_queue_service_client::MessageQueueServiceClient::connect(a.url())
            .await
            .unwrap();
        let batches: Vec<v1::SendRequest> = (0..200u64)
            .map(|i| v1::SendRequest {
                first_seq: i * 50 + 1,
                destination: dest.clone(),
                transactional: false,
                tx_stream: Default::default(),
                messages: (0..50)
                    .map(|_| v1::OutMessage {
                        body: body.clone(),
                        delivery: v1::Delivery::Recoverable as i32,
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect();
        let mut acks = rpc
            .send(futures::stream::iter(batches))
            .await
            .unwrap()
            .into_inner();
        // One answer, then the client is gone with everything else in flight.
        acks.message().await.unwrap();
        drop(acks);
        drop(rpc);
    }
    let client = a.client().await;
    send_numbered(&client, &dest, "last", 1, false).await;
    // A position admitted and never made visible would hold back everything after it.
    wait_outgoing_empty(&client, &b.dest()).await;
    let o = outgoing_to(&client, &b.dest())
        .await
        .expect("an outgoing queue");
    assert_eq!(o.dead_lettered, 0, "{o:?}");
    let stored = try_count(&bc, "q").await.expect("B answers");
    assert_eq!(stored, o.forwarded, "B holds what A forwarded: {o:?}");
    assert!(
        stored >= 51,
        "at least the first batch of each client and the last message"
    );
}

/// A forwarding connection that never closes (a sender behind a dead network looks like this)
/// does not lock its stream: the sender's next connection takes over at once, and what both
/// delivered is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_forwarding_connection_takes_over_from_a_silent_one() {
    use mq_proto::v1;
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q", false, None).await;
    let stream_id = bytes::Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes());
    let batch = |n: u64, seqs: std::ops::RangeInclusive<u64>| v1::ForwardRequest {
        stream_id: stream_id.clone(),
        source: "test".into(),
        batch: n,
        settled_below: 0,
        messages: seqs
            .map(|seq| v1::ForwardedMessage {
                seq,
                destination: b.queue("q"),
                transactional: false,
                message: Some(v1::Message {
                    id: bytes::Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
                    body: format!("m{seq}").into(),
                    priority: 3,
                    delivery: v1::Delivery::Recoverable as i32,
                    ..Default::default()
                }),
            })
            .collect(),
    };
    let connect = || async {
        v1::forward_service_client::ForwardServiceClient::connect(b.url())
            .await
            .unwrap()
    };
    // The first connection delivers 1..=3 and then goes silent, its stream still open.
    let (tx1, rx1) = tokio::sync::mpsc::channel(4);
    let mut old = connect().await;
    tx1.send(batch(1, 1..=3)).await.unwrap();
    let mut acks1 = old
        .forward(tokio_stream::wrappers::ReceiverStream::new(rx1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acks1.message().await.unwrap().unwrap().batch, 1);
    // The second connection resends 2..=3 (as after a lost answer) and adds 4..=5.
    let (tx2, rx2) = tokio::sync::mpsc::channel(4);
    let mut new = connect().await;
    tx2.send(batch(1, 2..=5)).await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut acks2 = new
            .forward(tokio_stream::wrappers::ReceiverStream::new(rx2))
            .await
            .unwrap()
            .into_inner();
        acks2.message().await
    })
    .await
    .expect("the new connection was not served within 10 s: the silent one still holds the stream");
    let ack = answered.unwrap().unwrap();
    assert_eq!((ack.batch, ack.count, ack.rejected.len()), (1, 4, 0));
    drop(tx1);
    assert_eq!(drain(&bc, "q").await, ["m1", "m2", "m3", "m4", "m5"]);
}

// ---------------------------------------------------------------------------------------------
// 5. A transaction that sends to a remote queue.

/// A transaction sending to a transactional queue on B (and one on A): abort forwards nothing
/// and leaves A's outgoing queue empty; commit forwards each message once, in order, with the
/// ids the commit returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_transaction_abort_forwards_nothing_commit_forwards_once() {
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "tq", true, None).await;
    let a = Node::started("a");
    let client = a.client().await;
    create(&client, "ltq", true, None).await;
    let remote = b.queue("tq");

    let mut tx = client.begin().await.unwrap();
    for i in 1..=3 {
        tx.send(&remote, Message::new(format!("aborted{i}")))
            .unwrap();
    }
    tx.send(local("ltq"), Message::new("aborted-local"))
        .unwrap();
    tx.abort().await.unwrap();
    let o = outgoing_to(&client, &b.dest()).await;
    assert!(
        o.as_ref()
            .is_none_or(|o| o.messages == 0 && o.forwarded == 0),
        "an aborted transaction reached the outgoing queue: {o:?}"
    );
    assert_eq!(try_count(&client, "ltq").await, Some(0));

    let mut tx = client.begin().await.unwrap();
    for i in 1..=3 {
        tx.send(&remote, Message::new(format!("c{i}"))).unwrap();
    }
    tx.send(local("ltq"), Message::new("c-local")).unwrap();
    let ids = tx.commit().await.unwrap();
    assert_eq!(ids.len(), 4);

    wait_count(&bc, "tq", 3).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!((o.forwarded, o.dead_lettered), (3, 0), "{o:?}");
    let got = bc
        .queue(&local("tq"))
        .unwrap()
        .peek_many(100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        got.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[..3],
        "ids as committed"
    );
    assert!(got.iter().all(|m| m.transactional));
    assert_eq!(drain(&bc, "tq").await, bodies("c", 1..=3));
    assert_eq!(drain(&client, "ltq").await, ["c-local"]);
}

// ---------------------------------------------------------------------------------------------
// 6. A multiple-element name across three brokers.

/// `FORMATNAME:` a local queue on A, a queue on B and a queue on C: each gets exactly one copy
/// of every message, with the same id, in order; C being down at send time delays only C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_element_name_reaches_local_and_two_remote_brokers() {
    const N: u64 = 200;
    let b = Node::started("b");
    let mut c = Node::started("c");
    create(&b.client().await, "m", false, None).await;
    create(&c.client().await, "m", false, None).await;
    c.terminate();
    let a = Node::started("a");
    let client = a.client().await;
    create(&client, "m", false, None).await;
    let multi = format!(
        r"FORMATNAME:DIRECT=OS:.\private$\m,{},{}",
        b.queue("m"),
        c.queue("m")
    );

    let first = client
        .queue(&multi)
        .unwrap()
        .send(Message::new("m1").recoverable(true).label("fan-out"))
        .await
        .unwrap();
    let mut ids = vec![first];
    // The rest pipelined; `send_numbered` would start at 1 again, so number from 2 by hand.
    let sender = client
        .sender(&multi, SenderOptions::default())
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for i in 2..=N {
        receipts.push(
            sender
                .send_with_receipt(Message::new(format!("m{i}")).recoverable(true))
                .await
                .unwrap(),
        );
    }
    for r in receipts {
        ids.push(r.await.unwrap());
    }
    sender.close().await.unwrap();
    assert_eq!(
        HashSet::<_>::from_iter(&ids).len() as u64,
        N,
        "distinct ids"
    );

    let bc = b.client().await;
    wait_count(&bc, "m", N).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(outgoing_messages(&client, &c.dest()).await, N, "C is down");

    c.start();
    let cc = c.client().await;
    wait_count(&cc, "m", N).await;
    wait_outgoing_empty(&client, &c.dest()).await;

    // A's own address spelled as a remote one is local: no outgoing queue to itself.
    let own = format!(r"DIRECT=TCP:{}\private$\self", a.addr);
    create(&client, "self", false, None).await;
    client
        .queue(&own)
        .unwrap()
        .send(Message::new("to-self").recoverable(true))
        .await
        .unwrap();
    assert_eq!(try_count(&client, "self").await, Some(1), "{own} is local");
    assert!(outgoing_to(&client, &a.dest()).await.is_none());

    for (who, cl) in [("A", &client), ("B", &bc), ("C", &cc)] {
        let got = cl
            .queue(&local("m"))
            .unwrap()
            .peek_many(1000, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            got.iter().map(|m| m.id).collect::<Vec<_>>(),
            ids,
            "{who}: one copy of each, same ids, same order"
        );
        assert_eq!(got[0].label, "fan-out", "{who}");
        assert_exactly_in_order(&drain(cl, "m").await, "m", N, who);
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Pause and resume.

/// Pausing an outgoing queue (API, then `mq outgoing pause`) holds messages on A (ONHOLD) even
/// though B is up; resuming (`mq outgoing resume`, then the API) drains them to B, in order.
/// `mq outgoing list --json` shows the state and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_messages_resume_drains_them() {
    const N: u64 = 500;
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q", false, None).await;
    let a = Node::started("a");
    let client = a.client().await;
    let dest = b.queue("q");

    // A first message, forwarded: the outgoing queue exists and is connected.
    send_numbered(&client, &dest, "warm", 1, false).await;
    wait_count(&bc, "q", 1).await;
    assert_eq!(drain(&bc, "q").await, ["warm1"]);
    wait_outgoing_empty(&client, &b.dest()).await;

    // Round 1: pause with the API, look with the CLI, resume with the CLI.
    let o = client.pause_outgoing(&b.dest()).await.unwrap();
    assert_eq!(o.state, OutgoingState::OnHold, "{o:?}");
    assert_eq!(o.destination, b.dest());
    let sender = client
        .sender(&dest, SenderOptions::default())
        .await
        .unwrap();
    for i in 1..=N {
        sender
            .send(Message::new(format!("p{i}")).recoverable(true))
            .await
            .unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, N);
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!(o.state, OutgoingState::OnHold, "{o:?}");
    assert_eq!((o.messages, o.in_flight, o.forwarded), (N, 0, 1), "{o:?}");
    assert_eq!(
        try_count(&bc, "q").await,
        Some(0),
        "B got messages while on hold"
    );

    let url = a.url();
    let out = cli(&url, &["outgoing", "list", "--json"]).await;
    let list: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("mq outgoing list --json is not JSON ({e}): {out}"));
    let entry = list
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {out}"))
        .iter()
        .find(|q| q["destination"] == b.dest().as_str())
        .unwrap_or_else(|| panic!("no {} in {out}", b.dest()));
    assert_eq!(entry["state"], "ONHOLD", "{entry}");
    assert_eq!(entry["messages"], N, "{entry}");
    let text = cli(&url, &["outgoing", "list"]).await;
    assert!(
        text.lines()
            .any(|l| l.contains(&b.dest()) && l.contains("ONHOLD")),
        "{text}"
    );

    cli(&url, &["outgoing", "resume", &b.dest()]).await;
    assert_ne!(
        outgoing_to(&client, &b.dest()).await.unwrap().state,
        OutgoingState::OnHold
    );
    wait_count(&bc, "q", N).await;
    wait_outgoing_empty(&client, &b.dest()).await;

    // Round 2: pause with the CLI, resume with the API.
    cli(&url, &["outgoing", "pause", &b.dest()]).await;
    assert_eq!(
        outgoing_to(&client, &b.dest()).await.unwrap().state,
        OutgoingState::OnHold
    );
    let sender = client
        .sender(&dest, SenderOptions::default())
        .await
        .unwrap();
    for i in N + 1..=N + 100 {
        sender
            .send(Message::new(format!("p{i}")).recoverable(true))
            .await
            .unwrap();
    }
    sender.close().await.unwrap();
    assert_eq!(outgoing_messages(&client, &b.dest()).await, 100);
    assert_eq!(try_count(&bc, "q").await, Some(N));
    let o = client.resume_outgoing(&b.dest()).await.unwrap();
    assert_ne!(o.state, OutgoingState::OnHold, "{o:?}");
    wait_count(&bc, "q", N + 100).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_exactly_in_order(
        &drain(&bc, "q").await,
        "p",
        N + 100,
        "after pause and resume",
    );
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!(o.forwarded, 1 + N + 100, "{o:?}");
}

/// Runs `mq` with `args` against `url` off the async threads; asserts exit 0, returns stdout.
pub(crate) async fn cli(url: &str, args: &[&str]) -> String {
    let out = cli_output(url, args).await;
    assert!(
        out.status.success(),
        "mq {args:?}: {}; stdout: {}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `mq` with `args` against `url` off the async threads.
pub(crate) async fn cli_output(url: &str, args: &[&str]) -> std::process::Output {
    let url = url.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        mq(&url, &args, None)
    })
    .await
    .unwrap()
}

/// Destinations nobody answers: "cannot deliver; will retry" is logged at most once a second
/// for all outgoing queues together, each line counting the ones held back (400 unreachable
/// destinations wrote ~350 lines a second, helper-60); every outgoing queue still shows its own
/// last error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_to_many_unreachable_destinations_log_a_line_a_second() {
    const DESTINATIONS: usize = 40;
    const LINE: &str = "forwarding: cannot deliver; will retry";
    let a = Node::started("a");
    let client = a.client().await;
    let started = std::time::Instant::now();
    // Nothing listens there: tests bind 127.0.0.1 (ports from the ephemeral range), and these
    // are another loopback address's privileged ports (a free port of 127.0.0.1 could be taken
    // by another test's broker meanwhile, helper-68).
    let dests: Vec<String> = (0..DESTINATIONS)
        .map(|i| format!("127.0.0.77:{}", 1000 + i))
        .collect();
    for d in &dests {
        send_express(&client, &format!(r"DIRECT=TCP:{d}\private$\q"), "x", 1).await;
    }
    // Every destination has failed, and two more lines (each with what it held back) came: at
    // least two seconds of retries every 200 ms at most.
    let failed = eventually(WAIT, || async {
        let list = client.outgoing().await.unwrap();
        dests.iter().all(|d| {
            list.iter().any(|o| {
                &o.destination == d && o.last_error.as_deref().is_some_and(|e| !e.is_empty())
            })
        }) && a.logs().matches(LINE).count() >= 3
    })
    .await;
    assert!(failed, "{:?}\n{}", client.outgoing().await, a.logs());
    let logs = a.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains(LINE)).collect();
    let seconds = started.elapsed().as_secs() as usize;
    assert!(
        lines.len() <= seconds + 2,
        "{} lines in {seconds} s:\n{logs}",
        lines.len()
    );
    let held_back: u64 = lines
        .iter()
        .filter_map(|l| {
            l.split_once("held_back=")?
                .1
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(held_back >= DESTINATIONS as u64, "{logs}");
}

/// A link too slow to carry a whole 4 MiB batch within `--forward-ack-timeout` (a destination
/// that acknowledges only batches of at most 400 KB): after each timeout batches are cut at a
/// quarter of the size, so everything arrives. Before, the same batch timed out for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_too_slow_for_a_whole_batch_is_sent_smaller_batches() {
    use mq_proto::v1;
    use std::sync::{Arc, Mutex};
    use v1::forward_service_server::{ForwardService, ForwardServiceServer};
    /// Acknowledges batches whose bodies come to at most `LINK` bytes at once; a larger batch
    /// never arrives whole (a link too slow for it within the ack timeout), so neither it nor
    /// any batch after it on the stream is acknowledged.
    const LINK: usize = 400_000;
    struct Slow {
        stored: Arc<Mutex<HashSet<Vec<u8>>>>,
    }
    #[tonic::async_trait]
    impl ForwardService for Slow {
        type ForwardStream = std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<v1::ForwardResponse, tonic::Status>> + Send>,
        >;
        async fn forward(
            &self,
            req: tonic::Request<tonic::Streaming<v1::ForwardRequest>>,
        ) -> Result<tonic::Response<Self::ForwardStream>, tonic::Status> {
            let stored = self.stored.clone();
            let acks = futures::stream::unfold(
                (req.into_inner(), stored, false),
                |(mut inbound, stored, mut stalled)| async move {
                    while let Ok(Some(batch)) = inbound.message().await {
                        let bytes: usize = batch
                            .messages
                            .iter()
                            .map(|m| m.message.as_ref().map_or(0, |m| m.body.len()))
                            .sum();
                        if stalled || bytes > LINK {
                            // Stalled: read on (so flow control holds nothing), answer none.
                            stalled = true;
                            continue;
                        }
                        let mut s = stored.lock().unwrap();
                        for m in &batch.messages {
                            s.insert(m.message.as_ref().unwrap().body.to_vec());
                        }
                        let ack = v1::ForwardResponse {
                            batch: batch.batch,
                            count: batch.messages.len() as u32,
                            rejected: vec![],
                        };
                        return Some((Ok(ack), (inbound, stored.clone(), stalled)));
                    }
                    std::future::pending::<()>().await;
                    None
                },
            );
            Ok(tonic::Response::new(Box::pin(acks)))
        }
    }
    let dir = temp_data_dir("mq-saf-slow-");
    let a = MqdProcess::launch(
        dir.path(),
        &[
            "--forward-ack-timeout",
            "1s",
            "--forward-retry-max",
            "200ms",
        ],
    );
    let client = a.connect().await;
    let stored = Arc::new(Mutex::new(HashSet::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dest = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ForwardServiceServer::new(Slow {
                stored: stored.clone(),
            }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    // 3 MB: one 4 MiB batch at first, which this link never acknowledges.
    let sender = client
        .sender(
            &format!(r"DIRECT=TCP:{dest}\private$\q"),
            SenderOptions::default(),
        )
        .await
        .unwrap();
    let sent: HashSet<Vec<u8>> = (0..30u8)
        .map(|i| {
            let mut body = vec![i; 100_000];
            body[..8].copy_from_slice(b"message ");
            body
        })
        .collect();
    for body in &sent {
        sender
            .send(Message::new(body.clone()).recoverable(true))
            .await
            .unwrap();
    }
    sender.close().await.unwrap();
    let delivered = eventually(WAIT, || async {
        outgoing_messages(&client, &dest).await == 0
    })
    .await;
    let got = stored.lock().unwrap().clone();
    assert!(
        delivered && got == sent,
        "{} of 30 stored; {:?}\n{}",
        got.intersection(&sent).count(),
        outgoing_to(&client, &dest).await,
        a.stderr()
    );
    // The operator is told why batches got smaller.
    assert!(
        a.logs_within(Duration::from_secs(10), "batches are cut at"),
        "{}",
        a.stderr()
    );
    server.abort();
}

/// A destination that takes a forwarding stream and then never answers it, or never
/// acknowledges a batch: the sender gives the connection up after `--forward-ack-timeout`,
/// the batches go back to the outgoing queue, and it tries again. It waited for good, the
/// messages in flight past their time to reach the queue (helper-65).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_never_acknowledges_is_given_up_and_retried() {
    use mq_proto::v1;
    use v1::forward_service_server::{ForwardService, ForwardServiceServer};
    /// Answers the stream (headers, then nothing) or not at all.
    struct Hung {
        headers: bool,
    }
    #[tonic::async_trait]
    impl ForwardService for Hung {
        type ForwardStream = std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<v1::ForwardResponse, tonic::Status>> + Send>,
        >;
        async fn forward(
            &self,
            req: tonic::Request<tonic::Streaming<v1::ForwardRequest>>,
        ) -> Result<tonic::Response<Self::ForwardStream>, tonic::Status> {
            if !self.headers {
                std::future::pending::<()>().await;
            }
            // Read the batches (so the sender is not held by flow control), answer none.
            let silent = futures::stream::unfold(req.into_inner(), |mut inbound| async move {
                while let Ok(Some(_)) = inbound.message().await {}
                std::future::pending::<
                    Option<(
                        Result<v1::ForwardResponse, tonic::Status>,
                        tonic::Streaming<v1::ForwardRequest>,
                    )>,
                >()
                .await
            });
            Ok(tonic::Response::new(Box::pin(silent)))
        }
    }
    let dir = temp_data_dir("mq-saf-hung-");
    let a = MqdProcess::launch(
        dir.path(),
        &[
            "--forward-ack-timeout",
            "1s",
            "--forward-retry-max",
            "200ms",
        ],
    );
    let client = a.connect().await;
    for (headers, says) in [
        (false, "did not answer the forwarding stream within 1s"),
        (true, "did not acknowledge batch 1 within 1s"),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dest = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ForwardServiceServer::new(Hung { headers }))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let sender = client
            .sender(
                &format!(r"DIRECT=TCP:{dest}\private$\q"),
                SenderOptions::default(),
            )
            .await
            .unwrap();
        for i in 0..3 {
            sender
                .send(Message::new(format!("m{i}")).recoverable(true))
                .await
                .unwrap();
        }
        sender.close().await.unwrap();
        let given_up = eventually(WAIT, || async {
            outgoing_to(&client, &dest)
                .await
                .and_then(|o| o.last_error)
                .is_some_and(|e| e.contains(says))
        })
        .await;
        assert!(
            given_up,
            "{:?}\n{}",
            outgoing_to(&client, &dest).await,
            a.stderr()
        );
        // Nothing was lost: the three wait in the outgoing queue for the next attempt.
        assert_eq!(outgoing_messages(&client, &dest).await, 3);
        server.abort();
    }
}

/// `mq outgoing purge DEST` drops what waits for a destination that will never come back: the
/// outgoing queue is empty at once and after a `kill -9` and restart (the purge is journaled
/// before the answer), a message that asked for negative acknowledgements gets `NACK_PURGED`,
/// and the queue can then be deleted. Before, such messages held their disk until their time
/// to reach the queue ran out (or for good without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outgoing_queue_for_a_destination_that_never_comes_back_is_purged() {
    use mq_proto::ack::class;
    const AQ: &str = r".\private$\purge-acks";
    let dir = temp_data_dir("mq-saf-purge-");
    let mut a = MqdProcess::launch(dir.path(), &["--forward-retry-max", "200ms"]);
    let client = a.connect().await;
    client
        .create_queue(AQ, QueueOptions::default())
        .await
        .unwrap();
    // A loopback address where nothing listens: every attempt is refused.
    let dest = "127.0.0.77:1";
    let far = client
        .queue(&format!(r"DIRECT=TCP:{dest}\private$\far"))
        .unwrap();
    let nacked = far
        .send(
            Message::new("never")
                .recoverable(true)
                .admin_queue(AQ)
                .acknowledge(4),
        )
        .await
        .unwrap();
    for i in 0..2 {
        far.send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    assert_eq!(outgoing_messages(&client, dest).await, 3);
    let out = mq(a.url(), &["outgoing", "purge", dest], None);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("purged 3 messages"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(outgoing_messages(&client, dest).await, 0);
    // Nothing left to send: INACTIVE, its last error still shown, not WAITING to retry nothing
    // (it stayed WAITING with a next retry of "now" for good, helper-73).
    let mut last = None;
    for _ in 0..400 {
        last = outgoing_to(&client, dest).await;
        if last
            .as_ref()
            .is_some_and(|o| o.state == OutgoingState::Inactive)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let o = last.expect("the outgoing queue is listed");
    assert_eq!(o.state, OutgoingState::Inactive, "{o:?}");
    assert!(
        o.last_error.as_deref().is_some_and(|e| !e.is_empty()),
        "{o:?}"
    );
    let ack = client
        .queue(AQ)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .expect("a NACK_PURGED");
    assert_eq!(ack.class, class::NACK_PURGED, "{ack:?}");
    assert_eq!(ack.correlation_id, nacked.to_string(), "{ack:?}");
    assert_eq!(ack.body.as_ref(), b"never", "{ack:?}");
    // Journaled: nothing comes back after a kill -9.
    a.kill9_checked();
    let a = MqdProcess::launch(dir.path(), &["--forward-retry-max", "200ms"]);
    let client = a.connect().await;
    assert_eq!(outgoing_messages(&client, dest).await, 0);
    client.delete_outgoing(dest).await.unwrap();
    assert!(outgoing_to(&client, dest).await.is_none());
}
