//! Flow limits (issue 11, points 5, 6, 7, 13, 14): what one client, connection or stream can
//! hold of the broker is bounded, and the client says when it could not confirm something.
//! Connections past `--max-connections` are closed; calls past the streams-per-connection
//! limit wait; a gRPC message above body limit + headroom is refused; transactions are charged
//! to the queue quota when staged and bounded in bytes, messages and per connection (and the
//! broker's memory stays flat); large peeks come in pages (`mq peek --count 1000000`);
//! receivers that grant huge credit and never read pin a bounded number of messages; an
//! unacknowledged message comes back after `--ack-timeout`; `Consumer::close` fails with
//! `Error::Timeout` when the broker did not confirm the acknowledgements.

use std::time::Duration;

use bytes::Bytes;
use mq_client::{Client, ConsumerOptions, Error, Message, QueueOptions};
use mq_proto::v1;
use mq_tests::{eventually, mq, temp_data_dir, InProcessBroker, MqdProcess};

const Q: &str = r".\private$\flow";
const WAIT: Duration = Duration::from_secs(30);

fn raw_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn raw(
    url: &str,
) -> v1::message_queue_service_client::MessageQueueServiceClient<tonic::transport::Channel> {
    v1::message_queue_service_client::MessageQueueServiceClient::connect(url.to_string())
        .await
        .unwrap()
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20)
}

async fn fill(client: &Client, queue: &str, n: usize, body: impl Fn(usize) -> Bytes) {
    let sender = client
        .queue(queue)
        .unwrap()
        .sender(Default::default())
        .await
        .unwrap();
    for i in 0..n {
        sender.send(Message::new(body(i))).await.unwrap();
    }
    let s = sender.close().await.unwrap();
    assert_eq!(s.acknowledged, n as u64);
}

fn quota_refusal(e: &Error, needle: &str) {
    assert!(
        matches!(e, Error::QuotaExceeded(m) if m.contains(needle)),
        "expected a RESOURCE_EXHAUSTED refusal naming {needle:?}, got {e:?}"
    );
}

// ---- point 5: connections, streams per connection, message size ----------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_max_connections_are_closed_and_their_places_come_back() {
    let dir = temp_data_dir("mq-flow-conns-");
    let mqd = MqdProcess::launch(dir.path(), &["--max-connections", "2"]);
    let a = mqd.connect().await;
    let b = mqd.connect().await;
    a.list_queues().await.unwrap();
    b.list_queues().await.unwrap();
    // A third connection is closed at once: connecting or its first call fails.
    match Client::connect(mqd.url()).await {
        Err(_) => {}
        Ok(c) => {
            let r = tokio::time::timeout(WAIT, c.list_queues()).await;
            assert!(
                matches!(r, Ok(Err(_))),
                "a third connection past --max-connections 2 was served: {r:?}"
            );
        }
    }
    // The two live ones still work; closing one frees its place.
    a.list_queues().await.unwrap();
    drop(b);
    let url = mqd.url().to_string();
    let back = eventually(WAIT, || {
        let url = url.clone();
        async move {
            match Client::connect(url).await {
                Ok(c) => c.list_queues().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(
        back,
        "a place freed by a closed connection was not given back"
    );
    a.list_queues().await.unwrap();
}

/// Whether the broker closes `sock` (end of stream or an error) within `WAIT`.
fn closed_by_the_broker(sock: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return true,
            // The server's HTTP/2 SETTINGS before it closes: read on.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Sockets that never send a byte held every place at `--max-connections` for good (helper-67:
/// 1,024 from one address locked every client out). At the limit a new connection now closes
/// the oldest that has made no request; connections that have made one keep their places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_give_their_places_to_new_ones() {
    let dir = temp_data_dir("mq-flow-silent-");
    let mqd = MqdProcess::launch(dir.path(), &["--max-connections", "3"]);
    let working = mqd.connect().await;
    working.list_queues().await.unwrap();
    let mut silent: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(mqd.addr()).unwrap())
        .collect();
    // Both are accepted and counted (the broker has 3 open); a new client is served, and the
    // oldest silent one is closed for it.
    let newcomer = mqd.connect().await;
    newcomer.list_queues().await.unwrap();
    assert!(
        closed_by_the_broker(&mut silent[0]),
        "the oldest silent connection was not closed"
    );
    // Now all three have made requests, or are the younger silent one: one more closes that.
    let third = mqd.connect().await;
    third.list_queues().await.unwrap();
    assert!(closed_by_the_broker(&mut silent[1]));
    // Every open connection has made a request: a fourth is refused, the others still work.
    match Client::connect(mqd.url()).await {
        Err(_) => {}
        Ok(c) => {
            let r = tokio::time::timeout(WAIT, c.list_queues()).await;
            assert!(
                matches!(r, Ok(Err(_))),
                "a fourth connection was served: {r:?}"
            );
        }
    }
    for c in [&working, &newcomer, &third] {
        c.list_queues().await.unwrap();
    }
    assert!(
        mqd.logs_within(
            WAIT,
            "closed connections that had made no request to make room"
        ),
        "{}",
        mqd.stderr()
    );
}

/// `--max-connections-per-address`: past it a connection from the same address is closed at
/// once, while one from another address is served.
#[test]
fn connections_past_the_limit_per_address_are_closed() {
    let dir = temp_data_dir("mq-flow-per-address-");
    let mqd = MqdProcess::launch(dir.path(), &["--max-connections-per-address", "2"]);
    let from = |ip: [u8; 4]| {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(std::net::SocketAddr::from((ip, 0))).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = rt
            .block_on(s.connect(mqd.addr()))
            .unwrap()
            .into_std()
            .unwrap();
        s.set_nonblocking(false).unwrap();
        s
    };
    let mut held: Vec<_> = (0..2).map(|_| from([127, 0, 0, 1])).collect();
    let mut third = from([127, 0, 0, 1]);
    assert!(
        closed_by_the_broker(&mut third),
        "a third connection from 127.0.0.1 stayed open"
    );
    // Another address is served: the broker answers its HTTP/2 preface with SETTINGS.
    let mut other = from([127, 0, 0, 2]);
    use std::io::{Read, Write};
    other
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    other.set_read_timeout(Some(WAIT)).unwrap();
    let mut head = [0u8; 9];
    other.read_exact(&mut head).unwrap();
    assert_eq!(head[3], 4, "a SETTINGS frame: {head:?}");
    // The first two are still open.
    for s in &mut held {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 256];
        loop {
            match s.read(&mut b) {
                // What the broker sent first (its HTTP/2 SETTINGS).
                Ok(n) if n > 0 => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                other => panic!("a connection within the limit was closed: {other:?}"),
            }
        }
    }
    assert!(
        mqd.logs_within(WAIT, "--max-connections-per-address"),
        "{}",
        mqd.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_streams_per_connection_limit_wait_for_a_free_stream() {
    let broker = InProcessBroker::start_with(|c| c.flow.max_streams_per_connection = 4).await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(q.consumer(ConsumerOptions::default()).await.unwrap());
    }
    // A fifth call on the same connection waits; another connection is served meanwhile.
    let c2 = client.clone();
    let fifth = tokio::spawn(async move { c2.queue_info(Q).await });
    let other = broker.client().await;
    other.queue_info(Q).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fifth.is_finished(),
        "a fifth concurrent stream on a connection limited to 4 was served"
    );
    drop(open.pop());
    let r = tokio::time::timeout(WAIT, fifth).await;
    assert!(
        matches!(r, Ok(Ok(Ok(_)))),
        "the waiting call was not served once a stream ended: {r:?}"
    );
    drop(open);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_above_body_limit_plus_headroom_are_refused() {
    let broker = InProcessBroker::start_with(|c| c.max_body_bytes = 1000).await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    let limit = broker.config().grpc_message_limit();
    assert_eq!(limit, 1000 + 8 * 1024 * 1024);
    // One batch of 10 MiB: above the limit (it used to be decoded, up to 64 MiB).
    let big = v1::SendRequest {
        first_seq: 1,
        destination: Q.into(),
        messages: (0..10)
            .map(|_| v1::OutMessage {
                body: Bytes::from(vec![b'x'; 1 << 20]),
                ..Default::default()
            })
            .collect(),
        transactional: false,
        tx_stream: Default::default(),
    };
    let mut rpc = raw(broker.url()).await;
    let r = rpc.send(futures::stream::iter(vec![big])).await;
    let refused = match r {
        Err(status) => Some(status),
        Ok(resp) => resp.into_inner().message().await.err(),
    };
    let status = refused.expect("a 10 MiB gRPC message was decoded with --max-body-bytes 1000");
    assert!(
        status.message().contains("too large") || status.code() == tonic::Code::OutOfRange,
        "{status:?}"
    );
    // The broker still serves, and a message within the limit is stored.
    client
        .queue(Q)
        .unwrap()
        .send(Message::new("small"))
        .await
        .unwrap();
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 1);
    // A receive stream's later request above the limit ends it with the same refusal (it used
    // to end it with OK, as if the client had closed it); the delivered message goes back.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(v1::ReceiveRequest {
        queue: Q.into(),
        credit: 10,
        ack_through: 0,
    })
    .await
    .unwrap();
    let mut deliveries = rpc
        .receive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = deliveries.message().await.unwrap().expect("a delivery");
    assert_eq!(first.messages.len(), 1);
    tx.send(v1::ReceiveRequest {
        queue: "q".repeat(10 << 20),
        credit: 0,
        ack_through: 0,
    })
    .await
    .unwrap();
    let status = loop {
        match tokio::time::timeout(WAIT, deliveries.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("a 10 MiB receive request ended the stream with OK"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("a 10 MiB receive request: no answer within {WAIT:?}"),
        }
    };
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("mqd --max-body-bytes"),
        "{status:?}"
    );
    let back = eventually(WAIT, || async {
        client
            .queue_info(Q)
            .await
            .map(|i| i.messages == 1 && i.in_flight == 0)
            .unwrap_or(false)
    })
    .await;
    assert!(back, "{:?}", client.queue_info(Q).await);
    broker.stop().await.unwrap();
}

#[test]
fn mqd_refuses_zero_flow_limits() {
    let dir = temp_data_dir("mq-flow-flags-");
    for flag in [
        ["--max-connections", "0"],
        ["--ack-timeout", "0s"],
        ["--max-unacked-per-stream", "0"],
    ] {
        let out = mq_tests::run_with_timeout(
            mq_tests::mqd_command(dir.path(), &flag),
            None,
            mq_tests::START_TIMEOUT,
        )
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mqd {flag:?} started");
        // The flag's own parser refuses it (clap: "0 is not in 1..", exit 2), or mqd's check.
        assert!(
            stderr.contains(flag[0])
                && (stderr.contains("must be above zero") || stderr.contains("is not in 1..")),
            "mqd {flag:?}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_batch_above_the_destinations_limit_is_refused_with_the_reason() {
    // B takes bodies up to 4 MiB (gRPC messages up to 12 MiB); A up to 16 MiB.
    let b = InProcessBroker::start().await;
    let b_client = b.client().await;
    mq_tests::create_default_queue(&b_client, Q).await;
    let a = InProcessBroker::start_with(|c| c.max_body_bytes = 16 << 20).await;
    let a_client = a.client().await;
    let remote = format!(r"DIRECT=TCP:{}\private$\flow", b.addr());
    a_client
        .queue(&remote)
        .unwrap()
        .send(Message::new(vec![b'f'; 13 << 20]))
        .await
        .unwrap();
    let shown = eventually(WAIT, || {
        let c = a_client.clone();
        async move {
            c.outgoing().await.unwrap().iter().any(|q| {
                q.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("--max-body-bytes"))
            })
        }
    })
    .await;
    let last = a_client.outgoing().await.unwrap();
    assert!(
        shown,
        "the outgoing queue does not say why B refused: {last:?}"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

// ---- point 6: transactions -------------------------------------------------------------------

async fn create_tx_queue(client: &Client, name: &str, quota: Option<u64>) {
    client
        .create_queue(
            name,
            QueueOptions {
                transactional: true,
                quota_bytes: quota,
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_open_transactions_cannot_stage_past_a_queue_quota() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create_tx_queue(&client, Q, Some(1 << 20)).await;
    let body = || Bytes::from(vec![b'q'; 600 * 1024]);
    let mut t1 = client.begin().await.unwrap();
    t1.send(Q, Message::new(body())).unwrap();
    // A round trip on t1, so its send is staged before t2's.
    assert!(t1.receive(Q, Duration::ZERO).await.unwrap().is_none());
    let mut t2 = client.begin().await.unwrap();
    t2.send(Q, Message::new(body())).unwrap();
    // t1 is still open, so t2 was refused when it staged, not by a commit.
    let e = t2.commit().await.unwrap_err();
    quota_refusal(&e, "quota");
    let ids = t1.commit().await.unwrap();
    assert_eq!(ids.len(), 1);
    let info = client.queue_info(Q).await.unwrap();
    assert_eq!(info.messages, 1);
    broker.stop().await.unwrap();
}

/// A staged send counts what it costs in memory against the staging limits: its quota charge
/// and 256 B more (an empty recoverable message is charged 128 B to the quotas, 384 B to
/// `--max-tx-bytes`): 10 empty sends fit in 3,840 bytes, an 11th does not (before: 30 fit, and
/// 3,960,000 tiny staged sends took 1.2 GiB of RAM against 507 MB counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_send_counts_its_memory_against_the_staging_limits() {
    let broker = InProcessBroker::start_with(|c| c.flow.max_tx_bytes = 10 * 384).await;
    let client = broker.client().await;
    create_tx_queue(&client, Q, None).await;
    let mut tx = client.begin().await.unwrap();
    for _ in 0..10 {
        tx.send(Q, Message::new("")).unwrap();
    }
    assert_eq!(tx.commit().await.unwrap().len(), 10);
    let mut tx = client.begin().await.unwrap();
    for _ in 0..11 {
        tx.send(Q, Message::new("")).unwrap();
    }
    quota_refusal(&tx.commit().await.unwrap_err(), "--max-tx-bytes");
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 10);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_bounded_in_bytes_messages_and_per_connection() {
    let broker = InProcessBroker::start_with(|c| {
        c.flow.max_tx_bytes = 1 << 20;
        c.flow.max_tx_total_bytes = 1536 << 10;
        c.flow.max_tx_messages = 10;
        c.flow.max_tx_per_connection = 2;
    })
    .await;
    let client = broker.client().await;
    create_tx_queue(&client, Q, None).await;
    let kib = |n: usize| Bytes::from(vec![b't'; n << 10]);

    // Bytes per transaction.
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new(kib(600))).unwrap();
    tx.send(Q, Message::new(kib(600))).unwrap();
    quota_refusal(&tx.commit().await.unwrap_err(), "--max-tx-bytes");

    // Bytes of all open transactions (two connections, so the per-connection limit is not it).
    let other = broker.client().await;
    let mut a = client.begin().await.unwrap();
    a.send(Q, Message::new(kib(900))).unwrap();
    a.receive(Q, Duration::ZERO).await.unwrap(); // a round trip: a's send is staged
    let mut b = other.begin().await.unwrap();
    b.send(Q, Message::new(kib(900))).unwrap();
    quota_refusal(&b.commit().await.unwrap_err(), "--max-tx-total-bytes");
    assert_eq!(a.commit().await.unwrap().len(), 1);

    // Messages per transaction.
    let mut tx = client.begin().await.unwrap();
    for i in 0..11 {
        tx.send(Q, Message::new(format!("m{i}"))).unwrap();
    }
    quota_refusal(&tx.commit().await.unwrap_err(), "--max-tx-messages");

    // Open transactions per connection. (A transaction the broker just ended frees its place
    // as its task ends, a moment after the client hears why.)
    let begin = || async {
        for _ in 0..1000 {
            match client.begin().await {
                Ok(t) => return t,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("no transaction could begin");
    };
    let t1 = begin().await;
    let t2 = begin().await;
    let e = client.begin().await.unwrap_err();
    quota_refusal(&e, "--max-tx-per-connection");
    other.begin().await.unwrap().abort().await.unwrap();
    t1.abort().await.unwrap();
    let t3 = eventually(WAIT, || {
        let c = client.clone();
        async move { c.begin().await.is_ok() }
    })
    .await;
    assert!(t3, "an aborted transaction did not free its place");
    t2.abort().await.unwrap();
    // Nothing refused was stored; what committed is there.
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 1);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_staging_past_a_quota_do_not_grow_the_brokers_memory() {
    let dir = temp_data_dir("mq-flow-txrss-");
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    create_tx_queue(&client, Q, Some(1 << 20)).await;
    let before = mq_tests::rss_kib(mqd.pid());
    // Two open transactions each try to stage 64 MiB against a 1 MiB quota.
    let body = Bytes::from(vec![b'r'; 512 << 10]);
    let mut txs = Vec::new();
    for _ in 0..2 {
        let mut tx = client.begin().await.unwrap();
        for _ in 0..128 {
            tx.send(Q, Message::new(body.clone())).unwrap();
        }
        txs.push(tx);
    }
    for tx in txs {
        quota_refusal(&tx.commit().await.unwrap_err(), "quota");
    }
    let after = mq_tests::rss_kib(mqd.pid());
    let grown = after.saturating_sub(before);
    println!(
        "mqd RSS {before} KiB before, {after} KiB after staging 2 x 64 MiB (grew {grown} KiB)"
    );
    assert!(
        grown < 48 * 1024,
        "mqd's RSS grew by {grown} KiB while two transactions staged past a 1 MiB quota"
    );
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
    client
        .queue(Q)
        .unwrap()
        .send_tx(Message::new("fits"))
        .await
        .unwrap();
}

// ---- point 7: peek pages ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_with_a_huge_max_comes_in_pages_of_at_most_1000() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    fill(&client, Q, 2500, |i| Bytes::from(format!("m{i}"))).await;
    let mut rpc = raw(broker.url()).await;
    let first = rpc
        .peek(v1::PeekRequest {
            queue: Q.into(),
            max: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.messages.len(), mq_broker::PEEK_PAGE_MESSAGES);
    assert!(!first.next_cursor.is_empty());
    // A bad cursor is refused, naming what it should be.
    let e = rpc
        .peek(v1::PeekRequest {
            queue: Q.into(),
            max: 1,
            cursor: Bytes::from_static(b"xyz"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // The client asks page after page: every message once, in order, none removed.
    let all = client
        .queue(Q)
        .unwrap()
        .peek_many(u32::MAX, Duration::ZERO)
        .await
        .unwrap();
    let bodies: Vec<String> = all
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    let want: Vec<String> = (0..2500).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, want);
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 2500);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_of_more_than_64_mib_succeeds_in_parts_and_mq_peek_count_a_million_works() {
    let dir = temp_data_dir("mq-flow-peek-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    // 17 bodies of 4 MiB: 68 MiB, above the old 64 MiB gRPC limit.
    let n = 17;
    fill(&client, Q, n, |i| {
        Bytes::from(vec![b'a' + i as u8; 4 << 20])
    })
    .await;
    let all = client
        .queue(Q)
        .unwrap()
        .peek_many(u32::MAX, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(all.len(), n);
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m.body.len(), 4 << 20);
        assert_eq!(m.body[0], b'a' + i as u8);
    }
    drop(all);
    let out = mq(
        mqd.url(),
        &["peek", Q, "--count", "1000000", "--timeout", "1s"],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Fewer than --count arrived: exit 3, with every message printed.
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("17 of 1000000"), "{stderr}");
    let lines: Vec<&[u8]> = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), n);
    assert!(lines
        .iter()
        .enumerate()
        .all(|(i, l)| l.len() == 4 << 20 && l[0] == b'a' + i as u8));
    assert_eq!(client.queue_info(Q).await.unwrap().messages, n as u64);
}

// ---- point 13: Consumer::close says when it could not confirm --------------------------------

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
    if sig == "-STOP" {
        // Every thread stopped (state T in /proc/<pid>/task/*/stat), not just signalled.
        let stopped = mq_tests::wait_until(WAIT, || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|tasks| {
                    tasks.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat"))
                            .ok()
                            .and_then(|st| {
                                st.rsplit_once(')')
                                    .map(|(_, r)| r.trim_start().starts_with('T'))
                            })
                            .unwrap_or(false)
                    })
                })
                .unwrap_or(false)
        });
        assert!(stopped, "mqd {pid} did not stop after SIGSTOP");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_close_fails_with_timeout_when_the_broker_does_not_confirm() {
    let dir = temp_data_dir("mq-flow-close-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    fill(&client, Q, 2, |i| Bytes::from(format!("c{i}"))).await;
    let q = client.queue(Q).unwrap();

    // Confirmed: Ok, and the message is gone.
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 1,
            limit: Some(1),
        })
        .await
        .unwrap();
    assert!(c.next(WAIT).await.unwrap().is_some());
    c.close().await.unwrap();
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 1);

    // The broker cannot answer (stopped): close says so instead of returning Ok.
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 1,
            limit: Some(1),
        })
        .await
        .unwrap();
    assert!(c.next(WAIT).await.unwrap().is_some());
    c.set_close_timeout(Duration::from_millis(500));
    signal(mqd.pid(), "-STOP");
    let r = c.close().await;
    signal(mqd.pid(), "-CONT");
    match r {
        Err(Error::Timeout(m)) => assert!(m.contains("did not confirm"), "{m}"),
        other => panic!("Consumer::close without the broker's confirmation returned {other:?}"),
    }
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_close_fails_with_timeout_when_the_broker_does_not_acknowledge() {
    let dir = temp_data_dir("mq-flow-sendto-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let mut sender = client
        .queue(Q)
        .unwrap()
        .sender(Default::default())
        .await
        .unwrap();
    // Long enough that a close waiting for it again shows above a slow machine's noise.
    sender.set_ack_timeout(Some(Duration::from_secs(3)));
    sender.send(Message::new("first")).await.unwrap();
    assert_eq!(sender.flush().await.unwrap().acknowledged, 1);
    signal(mqd.pid(), "-STOP");
    sender.send(Message::new("unanswered")).await.unwrap();
    let r = tokio::time::timeout(WAIT, sender.flush()).await;
    match r {
        Ok(Err(Error::Timeout(m))) => assert!(m.contains("1 of the 2"), "{m}"),
        other => panic!("Sender::flush without the broker's answer: {other:?}"),
    }
    // Given up: the unanswered message is in doubt, and closing does not wait again.
    assert_eq!(sender.in_doubt(), 1);
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(WAIT, sender.close()).await;
    let took = started.elapsed();
    signal(mqd.pid(), "-CONT");
    assert!(matches!(r, Ok(Err(_))), "{r:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}

// ---- point 14: receivers that never read; the ack timeout ------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_granting_huge_credit_and_never_reading_do_not_starve_others() {
    let broker = InProcessBroker::start_with(|c| {
        c.flow.max_unacked_per_stream = 100;
        c.flow.max_unacked_per_connection = 300;
    })
    .await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    let total = 2000u64;
    fill(&client, Q, total as usize, |i| Bytes::from(format!("r{i}"))).await;
    // Ten streams grant 2^32-1 and never read nor acknowledge: five on one connection, five on
    // a connection each.
    let mut hold = Vec::new();
    let shared = raw(broker.url()).await;
    for i in 0..10 {
        let mut rpc = if i < 5 {
            shared.clone()
        } else {
            raw(broker.url()).await
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(v1::ReceiveRequest {
            queue: Q.into(),
            credit: u32::MAX,
            ack_through: 0,
        })
        .await
        .unwrap();
        let resp = rpc.receive(raw_stream(rx)).await.unwrap();
        hold.push((tx, resp, rpc));
    }
    // They pin at most 5 x 100 (one stream each) + 300 (the shared connection).
    let most = 5 * 100 + 300;
    let settled = eventually(WAIT, || {
        let c = client.clone();
        async move { c.queue_info(Q).await.unwrap().in_flight >= most }
    })
    .await;
    let pinned = client.queue_info(Q).await.unwrap().in_flight;
    assert!(
        settled && pinned == most,
        "the idle receivers pin {pinned} messages, expected {most}"
    );
    // A normal receiver gets all the rest.
    let mut c = client
        .queue(Q)
        .unwrap()
        .consumer(ConsumerOptions::default())
        .await
        .unwrap();
    let mut got = 0;
    while got < total - most {
        match c.next(WAIT).await.unwrap() {
            Some(_) => got += 1,
            None => break,
        }
    }
    c.close().await.unwrap();
    assert_eq!(got, total - most, "a normal receiver was starved");
    drop(hold);
    broker.stop().await.unwrap();
}

/// A stream held back by its connection's unacknowledged limit is woken when another stream of
/// the same connection acknowledges (streams register for room only once they are short of
/// it, and ask again after registering: issue 14 point 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_blocked_by_its_connection_gets_room_when_another_acknowledges() {
    const QB: &str = r".\private$\flow-b";
    let broker = InProcessBroker::start_with(|c| {
        c.flow.max_unacked_per_connection = 10;
    })
    .await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    mq_tests::create_default_queue(&client, QB).await;
    fill(&client, Q, 10, |i| Bytes::from(format!("a{i}"))).await;
    fill(&client, QB, 5, |i| Bytes::from(format!("b{i}"))).await;
    let rpc = raw(broker.url()).await;
    let open = |queue: &'static str, credit: u32| {
        let mut rpc = rpc.clone();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(v1::ReceiveRequest {
                queue: queue.into(),
                credit,
                ack_through: 0,
            })
            .await
            .unwrap();
            let resp = rpc.receive(raw_stream(rx)).await.unwrap().into_inner();
            (tx, resp)
        }
    };
    // Stream A takes the connection's 10 slots.
    let (a_tx, mut a) = open(Q, 10).await;
    let mut got_a = 0;
    while got_a < 10 {
        let batch = tokio::time::timeout(WAIT, a.message())
            .await
            .expect("stream A gets its messages")
            .unwrap()
            .expect("stream A open");
        got_a += batch.messages.len();
    }
    // Stream B, on the same connection, gets nothing while A holds them.
    let (_b_tx, mut b) = open(QB, 5).await;
    let early = tokio::time::timeout(Duration::from_millis(300), b.message()).await;
    assert!(
        early.is_err(),
        "stream B got messages past the connection's limit: {early:?}"
    );
    // A acknowledges: B is woken and gets all of QB.
    a_tx.send(v1::ReceiveRequest {
        queue: String::new(),
        credit: 0,
        ack_through: 10,
    })
    .await
    .unwrap();
    let mut got_b = 0;
    while got_b < 5 {
        let batch = tokio::time::timeout(WAIT, b.message())
            .await
            .expect("stream B is woken once A acknowledges")
            .unwrap()
            .expect("stream B open");
        got_b += batch.messages.len();
    }
    drop((a_tx, a, b));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_message_comes_back_after_the_ack_timeout() {
    let dir = temp_data_dir("mq-flow-ackto-");
    let (_mqd, client) =
        MqdProcess::launch_with_queue(dir.path(), &["--ack-timeout", "1s"], Q).await;
    fill(&client, Q, 1, |_| Bytes::from_static(b"held")).await;
    let q = client.queue(Q).unwrap();
    let mut holder = q.consumer(ConsumerOptions::default()).await.unwrap();
    let m = holder.next(WAIT).await.unwrap().expect("the message");
    assert_eq!(&m.body[..], b"held");
    // The holder never acknowledges: another receiver gets the message after the timeout.
    let other = Client::connect(client.url()).await.unwrap();
    let again = other.queue(Q).unwrap().receive(WAIT).await.unwrap();
    assert_eq!(again.map(|m| m.body), Some(Bytes::from_static(b"held")));
    // The holder learns why its stream ended.
    match holder.next(Duration::from_secs(5)).await {
        Err(Error::Timeout(m)) => assert!(m.contains("--ack-timeout"), "{m}"),
        other => panic!("the holder's stream after the ack timeout: {other:?}"),
    }
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
}

/// Once the broker has ended a consumer's stream (its ack timeout), the messages the consumer
/// had fetched ahead are not handed out and `Consumer::ack` of what it handed out fails: the
/// broker took them all back. The consumer handed out the rest of its buffer, and its `ack`
/// returned Ok while the acknowledgement went nowhere (helper-75, as in the Python client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_stream_the_broker_ended_hands_out_and_acknowledges_nothing_more() {
    let dir = temp_data_dir("mq-flow-ackto-buffer-");
    let (_mqd, client) =
        MqdProcess::launch_with_queue(dir.path(), &["--ack-timeout", "1s"], Q).await;
    fill(&client, Q, 3, |i| Bytes::from(format!("m{i}"))).await;
    let q = client.queue(Q).unwrap();
    let mut holder = q.consumer(ConsumerOptions::default()).await.unwrap();
    let first = holder.next(WAIT).await.unwrap().expect("a message");
    // Past the ack timeout the broker ends the stream and gives all three back.
    let mut ended = false;
    for _ in 0..400 {
        if holder.is_ended() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ended, "the broker ended the stream past --ack-timeout");
    match holder.ack().await {
        Err(Error::Timeout(m)) => assert!(m.contains("--ack-timeout"), "{m}"),
        other => panic!("ack of {:?} after the stream ended: {other:?}", first.body),
    }
    match holder.next(Duration::from_secs(1)).await {
        Err(Error::Timeout(_)) => {}
        other => panic!("a message fetched ahead was handed out: {other:?}"),
    }
    let info = client.queue_info(Q).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (3, 0), "{info:?}");
}

/// The `mq_partial_request_bytes` gauge of the broker whose HTTP port is `http`.
fn partial_gauge(http: &str) -> Option<u64> {
    let mut r = ureq::get(&format!("http://{http}/metrics")).call().ok()?;
    let body = r.body_mut().read_to_string().ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("mq_partial_request_bytes "))
        .and_then(|v| v.trim().parse().ok())
}

/// A request body fed from a channel, for calls that send a gRPC message in part and stall.
pub(crate) struct FedBody(pub(crate) tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for FedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// The 5-byte prefix of a gRPC message of `declared` bytes, and `sent` of them.
fn part(declared: u32, sent: usize) -> Vec<Bytes> {
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    vec![Bytes::from(prefix), Bytes::from(vec![0u8; sent])]
}

/// Opens `path` on `channel` (one HTTP/2 connection) and sends `first` (for example the start
/// of a message, see [`part`]). Returns the body's feed (keep it: dropping it ends the request)
/// and the call's status once it ends (from its headers or trailers).
pub(crate) async fn unfinished_call(
    channel: &tonic::transport::Channel,
    url: &str,
    path: &str,
    first: Vec<Bytes>,
) -> (
    tokio::sync::mpsc::Sender<Bytes>,
    tokio::task::JoinHandle<tonic::Status>,
) {
    use tonic::client::GrpcService;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    for b in first {
        tx.send(b).await.unwrap();
    }
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("{url}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(FedBody(rx)))
        .unwrap();
    let mut ch = channel.clone();
    futures::future::poll_fn(|cx| GrpcService::poll_ready(&mut ch, cx))
        .await
        .unwrap();
    let call = GrpcService::call(&mut ch, req);
    let status = tokio::spawn(async move {
        let resp = call.await.expect("an HTTP/2 response");
        if let Some(s) = tonic::Status::from_header_map(resp.headers()) {
            return s;
        }
        let mut body = resp.into_body();
        loop {
            match futures::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            })
            .await
            {
                Some(Ok(frame)) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return tonic::Status::from_header_map(&trailers).unwrap_or_else(|| {
                            tonic::Status::unknown("trailers without a status")
                        });
                    }
                }
                Some(Err(s)) => return s,
                None => return tonic::Status::unknown("the response ended without a status"),
            }
        }
    });
    (tx, status)
}

/// Request messages received in part cost memory until they are whole: a client that declares
/// a message and sends part of it is bounded per connection (`--max-partial-bytes-per-connection`),
/// broker-wide (`--max-partial-bytes`) and in time (`--message-arrival-timeout`), each refusal
/// naming its limit, and what a refused or timed-out call held is given back; a stream that
/// never sends its first request ends after the same time. (Before: 8 stalled Send streams of
/// one connection held ~12 MiB each, and a Receive or Browse stream waited, for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_request_messages_are_bounded_in_bytes_and_time() {
    const SEND: &str = "/mq.v1.MessageQueueService/Send";
    const RECEIVE: &str = "/mq.v1.MessageQueueService/Receive";
    let arrival = Duration::from_secs(3);
    let http = format!("127.0.0.1:{}", mq_tests::free_port());
    let broker = InProcessBroker::start_with(|c| {
        c.max_body_bytes = 1000; // one gRPC message: 1000 B + 8 MiB
        c.flow.max_partial_bytes_per_connection = 10 << 20;
        c.flow.max_partial_bytes = 12 << 20;
        c.flow.message_arrival_timeout = arrival;
        c.http_listen = Some(http.parse().unwrap());
    })
    .await;
    // The broker's count of bytes in unfinished messages (its gauge), once it is `want`: the
    // calls below run one at a time, each once the broker has what the one before sent.
    let held = |want: u64| {
        let http = http.clone();
        async move {
            let got = eventually(WAIT, || {
                let http = http.clone();
                async move {
                    tokio::task::spawn_blocking(move || partial_gauge(&http))
                        .await
                        .unwrap()
                        == Some(want)
                }
            })
            .await;
            assert!(
                got,
                "mq_partial_request_bytes never {want}: {:?}",
                partial_gauge(&http)
            );
        }
    };
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    let url = broker.url().to_string();
    let connect = || async {
        tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    let (a, b) = (connect().await, connect().await);
    let begun = std::time::Instant::now();
    // Streams that never send their first request (the one naming the queue).
    const BROWSE: &str = "/mq.v1.MessageQueueService/Browse";
    let (_r0, r0) = unfinished_call(&b, &url, RECEIVE, Vec::new()).await;
    let (_c0, c0) = unfinished_call(&b, &url, BROWSE, Vec::new()).await;
    // Connection A: 6 MB of an 8 MB message, then nothing.
    let (_a1, a1) = unfinished_call(&a, &url, SEND, part(8_000_000, 6_000_000)).await;
    held(6_000_005).await;
    // 6 MB more on A: over its 10 MiB.
    let (_a2, a2) = unfinished_call(&a, &url, RECEIVE, part(8_000_000, 6_000_000)).await;
    let s = tokio::time::timeout(WAIT, a2).await.unwrap().unwrap();
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(
        s.message()
            .contains("mqd --max-partial-bytes-per-connection"),
        "{s:?}"
    );
    held(6_000_005).await;
    // 7 MB on B: within B's own limit, over the broker's 12 MiB (A still holds 6 MB).
    let (_b1, b1) = unfinished_call(&b, &url, SEND, part(8_000_000, 7_000_000)).await;
    let s = tokio::time::timeout(WAIT, b1).await.unwrap().unwrap();
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("(mqd --max-partial-bytes)"), "{s:?}");
    held(6_000_005).await;
    // A's message is not whole in time: its stream ends, naming the limit.
    let s = tokio::time::timeout(WAIT, a1).await.unwrap().unwrap();
    assert!(
        begun.elapsed() >= arrival,
        "ended after {:?}",
        begun.elapsed()
    );
    assert_eq!(s.code(), tonic::Code::DeadlineExceeded, "{s:?}");
    assert!(
        s.message().contains("mqd --message-arrival-timeout"),
        "{s:?}"
    );
    held(0).await;
    for (what, call) in [("receive", r0), ("browse", c0)] {
        let s = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
        assert_eq!(s.code(), tonic::Code::DeadlineExceeded, "{what}: {s:?}");
        assert!(
            s.message()
                .contains(&format!("a {what} stream sent no first request within 3s")),
            "{s:?}"
        );
    }
    // Everything held was given back: 7 MB on B now fits, and is finished into a whole
    // (if undecodable) message that is refused for what it is, not for its size.
    let (b2_feed, b2) = unfinished_call(&b, &url, SEND, part(7_000_000, 6_000_000)).await;
    b2_feed
        .send(Bytes::from(vec![0u8; 1_000_000]))
        .await
        .unwrap();
    drop(b2_feed);
    let s = tokio::time::timeout(WAIT, b2).await.unwrap().unwrap();
    assert!(
        !matches!(
            s.code(),
            tonic::Code::ResourceExhausted | tonic::Code::DeadlineExceeded
        ),
        "{s:?}"
    );
    held(0).await;
    // The broker still serves.
    client
        .queue(Q)
        .unwrap()
        .send(Message::new("after"))
        .await
        .unwrap();
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 1);
    broker.stop().await.unwrap();
}

/// Unary answers count against their connection's budget of bytes built and not yet taken
/// (`--max-unsent-bytes-per-connection`), until HTTP/2 has written them: a client that set its
/// window to 0 and sent 256 Peeks of a 4 MiB page on each connection held ~1 GiB of mqd per
/// connection (helper-74). With a 16 MiB budget, three pages of ~4 MiB are built and wait for
/// the client; the other Peeks wait for budget (no answer yet) and go on once the client
/// resets one of the waiting answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_answers_a_client_does_not_read_hold_its_connections_budget() {
    use futures::StreamExt;
    const Q: &str = r".\private$\unread-pages";
    let dir = temp_data_dir("mq-unread-pages-");
    let mut mqd = MqdProcess::launch(
        dir.path(),
        &["--max-unsent-bytes-per-connection", "16777216"],
    );
    let client = mqd.connect().await;
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    let q = client.queue(Q).unwrap();
    for _ in 0..4 {
        q.send(Message::new(vec![7u8; 1 << 20])).await.unwrap();
    }
    let (mut h2c, conn) = unread_h2(mqd.addr()).await;
    let peek = v1::PeekRequest {
        queue: Q.into(),
        max: 10,
        ..Default::default()
    };
    let mut answers = futures::stream::FuturesUnordered::new();
    for i in 0..16 {
        let (answer, body) = h2_call(&mut h2c, mqd.addr(), "Peek", &peek, true).await;
        answers.push(async move { (i, answer.await, body) });
    }
    // Answers come as far as the budget has room: three pages of ~4 MiB in 16 MiB.
    let mut answered = Vec::new();
    while answered.len() < 3 {
        let (i, r, body) = tokio::time::timeout(Duration::from_secs(30), answers.next())
            .await
            .expect("three answers within the budget")
            .unwrap();
        answered.push((i, r.expect("an answer"), body));
    }
    let more = tokio::time::timeout(Duration::from_secs(2), answers.next()).await;
    assert!(
        more.is_err(),
        "a fourth page was built while three wait unread in a 16 MiB budget"
    );
    // The client gives up one unread answer (its stream is reset): one more is built.
    drop(answered.remove(0));
    let (_, r, _) = tokio::time::timeout(Duration::from_secs(30), answers.next())
        .await
        .expect("the budget given back lets another answer be built")
        .unwrap();
    assert_eq!(r.expect("an answer").status(), 200);
    // Other connections go on meanwhile.
    assert!(q.peek(Duration::ZERO).await.unwrap().is_some());
    drop((answered, answers, h2c));
    conn.abort();
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}

/// Calls that wait for a message (`ReceiveOne`, a peek with a timeout) hold nothing of their
/// connection's budget while they wait: counted from the start, 20 long polls of 2 s on one
/// connection with a 16 MiB budget went three at a time (helper-76: with the defaults 63 on one
/// connection, the rest failed at their deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_on_one_connection_wait_together() {
    let dir = temp_data_dir("mq-flow-long-polls-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(
        dir.path(),
        &["--max-unsent-bytes-per-connection", "16777216"],
        Q,
    )
    .await;
    let q = client.queue(Q).unwrap();
    let started = std::time::Instant::now();
    let polls = (0..20).map(|i| {
        let q = q.clone();
        async move {
            if i % 2 == 0 {
                q.receive(Duration::from_secs(2)).await
            } else {
                q.peek(Duration::from_secs(2)).await
            }
        }
    });
    let got = futures::future::join_all(polls).await;
    let took = started.elapsed();
    assert!(got.iter().all(|r| matches!(r, Ok(None))), "{got:?}");
    assert!(
        took < Duration::from_secs(8),
        "20 long polls of 2 s took {took:?}: they waited for each other"
    );
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}

/// A `ReceiveOne` whose answer HTTP/2 could not write in full (the client's window stays
/// below the answer's size: 0, 1,000 bytes of a 100 KB message, HTTP/2's default 65,535 bytes
/// of a 70 KB one) and whose client then
/// resets it gives its message back, on express and recoverable messages: the message stays in
/// flight until the client's window has had room for the whole answer, and returns to its
/// place when it cannot. The broker removed it as soon as the answer was built, and it was lost
/// (stop 49); then, for a window above 0, as soon as hyper had the answer (helper-78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_whose_answer_was_never_written_gives_its_message_back() {
    const Q: &str = r".\private$\unwritten";
    let dir = temp_data_dir("mq-unwritten-receive-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let q = client.queue(Q).unwrap();
    let in_flight = || async { q.info().await.unwrap().in_flight };
    for (recoverable, window, size) in [
        (false, 0, 20),
        (true, 0, 20),
        (false, 1_000, 100_000),
        (true, 1_000, 100_000),
        (true, 65_535, 70_000),
    ] {
        let body = format!("recoverable {recoverable} window {window}")
            .into_bytes()
            .into_iter()
            .chain(std::iter::repeat(b'.'))
            .take(size)
            .collect::<Vec<u8>>();
        q.send(Message::new(body.clone()).recoverable(recoverable))
            .await
            .unwrap();
        let (mut h2c, conn) = h2_with_window(mqd.addr(), window).await;
        let receive = v1::ReceiveOneRequest {
            queue: Q.into(),
            timeout_ms: 5_000,
            ..Default::default()
        };
        let (answer, request) = h2_call(&mut h2c, mqd.addr(), "ReceiveOne", &receive, true).await;
        // The answer's headers come (they need no window); its message cannot.
        let answer = tokio::time::timeout(WAIT, answer)
            .await
            .expect("the answer's headers")
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            in_flight().await,
            1,
            "window {window}: taken, its answer unwritten"
        );
        // The client resets the call.
        drop((answer, request));
        assert!(
            eventually(WAIT, || async { in_flight().await == 0 }).await,
            "window {window}: the message stayed in flight"
        );
        let got = q.receive(Duration::from_secs(5)).await.unwrap();
        assert!(
            got.is_some_and(|m| m.body == body),
            "window {window}, recoverable {recoverable}: the message whose answer was never written in full was lost"
        );
        drop(h2c);
        conn.abort();
    }
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}

/// A `ReceiveOne` whose answer the broker cannot encode (a message stored under a larger
/// `--max-body-bytes` than the broker now runs with) fails, and the message stays in its queue:
/// tonic ends such an answer with an error in its trailers, which counted as written, and the
/// message was gone (helper-78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_whose_answer_cannot_be_encoded_leaves_the_message() {
    const Q: &str = r".\private$\too-big-now";
    let dir = temp_data_dir("mq-unencodable-");
    let (mut mqd, client) =
        MqdProcess::launch_with_queue(dir.path(), &["--max-body-bytes", "16000000"], Q).await;
    let q = client.queue(Q).unwrap();
    q.send(Message::new(vec![7u8; 12_000_000]).recoverable(true))
        .await
        .unwrap();
    drop((q, client));
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
    let mqd = MqdProcess::launch(dir.path(), &["--max-body-bytes", "1000000"]);
    let client = mqd.connect().await;
    let q = client.queue(Q).unwrap();
    let r = q.receive(Duration::from_secs(5)).await;
    assert!(r.is_err(), "a 12 MB message over a 1 MB limit: {r:?}");
    let info = || async { q.info().await.unwrap() };
    assert!(
        eventually(WAIT, || async { info().await.in_flight == 0 }).await,
        "{:?}",
        info().await
    );
    assert_eq!(info().await.messages, 1, "the message was lost");
}

/// A raw HTTP/2 connection to `addr` that never lets the broker send it a byte of data (its
/// window is 0), and the task that runs it.
async fn unread_h2(
    addr: std::net::SocketAddr,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    h2_with_window(addr, 0).await
}

/// A raw HTTP/2 connection to `addr` whose streams let the broker send `window` bytes of data
/// each and no more (nothing read is acknowledged), and the task that runs it.
async fn h2_with_window(
    addr: std::net::SocketAddr,
    window: u32,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2c, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    (h2c, conn)
}

/// Starts the gRPC call `method` of MessageQueueService on `h2c` with `request` as its first
/// message (the request stream ends after it if `end`).
async fn h2_call(
    h2c: &mut h2::client::SendRequest<Bytes>,
    addr: std::net::SocketAddr,
    method: &str,
    request: &impl prost::Message,
    end: bool,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    *h2c = h2c.clone().ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/mq.v1.MessageQueueService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut body) = h2c.send_request(req, false).unwrap();
    body.send_data(grpc_frame(request), end).unwrap();
    (answer, body)
}

/// `message` in gRPC's framing (uncompressed).
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);
    Bytes::from(framed)
}
