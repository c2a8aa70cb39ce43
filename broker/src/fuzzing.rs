//! Entry points for the cargo-fuzz targets in `fuzz/` and their proptest versions: each takes
//! arbitrary bytes and must neither panic nor hang. Built for tests and with the `fuzzing`
//! feature only.

use std::cell::Cell;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Body as _;
use mq_proto::format_name::FormatName;
use mq_proto::v1::admin_service_server::AdminServiceServer;
use mq_proto::v1::forward_service_server::ForwardServiceServer;
use mq_proto::v1::message_queue_service_server::MessageQueueServiceServer;
use tonic::codegen::{http, Service as _};

use crate::journal::FaultyIo;
use crate::{Broker, BrokerConfig};

pub use crate::journal::fuzz::{damaged_journal, record_decoder, segment_recovery};

/// The format-name parser: never panics; what it accepts prints to a name that parses to the
/// same value.
pub fn format_name(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(f) = FormatName::parse(s) {
        let printed = f.to_string();
        let again = FormatName::parse(&printed)
            .unwrap_or_else(|e| panic!("{s:?} parsed, its printed form {printed:?} does not: {e}"));
        assert_eq!(again, f, "{s:?} -> {printed:?} parses differently");
        for a in f.addresses() {
            let _ = (a.key(), a.path_name(), a.is_read_only());
        }
    }
}

/// The RPCs, by the number a call starts with, and whether the request is a stream.
pub const METHODS: [(&str, bool); 17] = [
    ("CreateQueue", false),
    ("DeleteQueue", false),
    ("GetQueueInfo", false),
    ("ListQueues", false),
    ("Purge", false),
    ("Send", true),
    ("Receive", true),
    ("ReceiveOne", false),
    ("Peek", false),
    ("Transact", true),
    ("Forward", true),
    ("ListOutgoing", false),
    ("PauseOutgoing", false),
    ("ResumeOutgoing", false),
    ("SetQueueProperties", false),
    ("MoveMessage", false),
    ("Browse", true),
];

/// The service that serves `method`.
fn service_of(method: &str) -> &'static str {
    match method {
        "Forward" => "mq.v1.ForwardService",
        "CreateQueue" | "DeleteQueue" | "GetQueueInfo" | "ListQueues" | "Purge"
        | "SetQueueProperties" | "ChangeAcl" | "GetAcl" | "ListOutgoing" | "PauseOutgoing"
        | "ResumeOutgoing" | "DeleteOutgoing" | "PurgeOutgoing" => "mq.v1.AdminService",
        _ => "mq.v1.MessageQueueService",
    }
}

/// Most calls one input runs.
const MAX_CALLS: usize = 8;
/// Most messages one streaming call sends.
const MAX_STREAM_MESSAGES: usize = 4;

/// One call: the RPC's number in [`METHODS`] and its request messages (protobuf bytes).
#[derive(Debug, Clone)]
pub struct Call {
    /// Index into [`METHODS`] (taken modulo its length).
    pub method: u8,
    /// Encoded request messages; a unary RPC uses the first (or an empty one).
    pub messages: Vec<Vec<u8>>,
}

/// Splits fuzz input into calls: `method u8, count u8, count x (len u16 LE, bytes)`.
pub fn parse_calls(mut data: &[u8]) -> Vec<Call> {
    let mut calls = Vec::new();
    while calls.len() < MAX_CALLS && data.len() >= 2 {
        let (method, count) = (data[0], data[1] as usize % (MAX_STREAM_MESSAGES + 1));
        data = &data[2..];
        let mut messages = Vec::new();
        for _ in 0..count {
            if data.len() < 2 {
                break;
            }
            let len = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
            messages.push(data[2..2 + len].to_vec());
            data = &data[2 + len..];
        }
        calls.push(Call { method, messages });
    }
    calls
}

/// The inverse of [`parse_calls`], for seeds and proptests.
pub fn encode_calls(calls: &[Call]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in calls {
        out.push(c.method);
        out.push(c.messages.len() as u8);
        for m in &c.messages {
            out.extend_from_slice(&(m.len() as u16).to_le_bytes());
            out.extend_from_slice(m);
        }
    }
    out
}

/// A request body that yields one chunk of gRPC frames, then ends.
struct Frames(Option<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }
}

thread_local! {
    static PANICKED: Cell<bool> = const { Cell::new(false) };
}

/// Notes panics on this thread (a panic inside a spawned task is otherwise swallowed by the
/// runtime; on a current-thread runtime every task runs on the calling thread).
fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.with(|p| p.set(true));
            previous(info);
        }));
    });
    PANICKED.with(|p| p.set(false));
}

/// Runs the calls of `data` (see [`parse_calls`]) against a fresh in-process broker (journal in
/// memory, no network: forwarders are not started) through its gRPC service, as a client would:
/// every request goes through decoding, validation and conversion. Time is virtual, so waits
/// cost nothing. Panics if handling any call panicked, anywhere on the runtime. Returns each
/// call's `grpc-status` (`None` if the stream was cut).
pub fn wire_requests(data: &[u8]) -> Vec<Option<String>> {
    let calls = parse_calls(data);
    if calls.is_empty() {
        return Vec::new();
    }
    watch_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let statuses = rt.block_on(async {
        let mut statuses = Vec::new();
        let mut config = BrokerConfig::new("/nonexistent/mq-fuzz");
        config.name = "fuzzhost".into();
        config.journal_io = Some(Arc::new(FaultyIo::new(0)));
        config.journal_segment_bytes = 64 << 10;
        config.express_quota_bytes = 1 << 20;
        config.storage_quota_bytes = 4 << 20;
        config.max_body_bytes = 64 << 10;
        let local = vec!["127.0.0.1:1801".parse().unwrap()];
        let (broker, _) = Broker::open(config, local).expect("open a broker on FaultyIo");
        let broker = Arc::new(broker);
        // Virtual time jumps ahead whenever the runtime is idle, also while a request waits
        // for the journal's writer thread; this task keeps it busy until the writer is done,
        // so a timer only fires early when nothing but timers is left.
        let journal = broker.journal().clone();
        let ticker = tokio::spawn(async move {
            loop {
                if journal.pending() > 0 {
                    std::thread::yield_now();
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
        let service = crate::service::Service::new(
            broker.clone(),
            Arc::new(crate::flow::Connections::new(
                16,
                64 << 20,
                4 << 20,
                1 << 30,
            )),
            Arc::new(crate::auth::Auth::open()),
        );
        // As mqd serves it: Receive through `large_bodies`, the rest through tonic.
        let mut server = tonic::service::Routes::new(crate::large_bodies::LargeBodies::new(
            MessageQueueServiceServer::new(service.clone())
                .max_decoding_message_size(1 << 20)
                .max_encoding_message_size(1 << 20),
            service.clone(),
            1 << 20,
        ))
        .add_service(
            AdminServiceServer::new(service.clone())
                .max_decoding_message_size(1 << 20)
                .max_encoding_message_size(1 << 20),
        )
        .add_service(
            ForwardServiceServer::new(service)
                .max_decoding_message_size(1 << 20)
                .max_encoding_message_size(1 << 20),
        )
        .prepare();
        for call in &calls {
            let (name, stream) = METHODS[call.method as usize % METHODS.len()];
            let mut frames = BytesMut::new();
            let empty = Vec::new();
            let msgs: Vec<&Vec<u8>> = if stream {
                call.messages.iter().collect()
            } else {
                vec![call.messages.first().unwrap_or(&empty)]
            };
            for m in msgs {
                frames.put_u8(0);
                frames.put_u32(m.len() as u32);
                frames.put_slice(m);
            }
            let req = http::Request::builder()
                .method("POST")
                .uri(format!("http://fuzz/{}/{name}", service_of(name)))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(Frames(Some(frames.freeze()))))
                .expect("a request");
            let Ok(resp) = server.call(req).await;
            let header_status = resp.headers().get("grpc-status").cloned();
            let mut body = resp.into_body();
            let mut trailer_status = None;
            // A stream that never ends (a receiver waiting for messages) is cut after a minute
            // of virtual time.
            let drain = async {
                while let Some(frame) =
                    std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                {
                    let Ok(frame) = frame else { break };
                    if let Some(t) = frame.trailers_ref() {
                        trailer_status = t.get("grpc-status").cloned();
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(60), drain).await;
            let status = header_status.or(trailer_status);
            statuses.push(status.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()));
        }
        ticker.abort();
        broker.close();
        statuses
    });
    drop(rt);
    assert!(
        !PANICKED.with(|p| p.get()),
        "handling {calls:?} panicked (see above)"
    );
    statuses
}

#[cfg(test)]
mod tests {
    //! The proptest versions of the fuzz targets: a few hundred cases each, on stable.

    use super::*;
    use mq_proto::v1;
    use proptest::prelude::*;
    use prost::Message as _;

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Queue names a client might send: valid ones, near misses and garbage.
    fn names() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r".\private$\q".to_string()),
            Just(r".\private$\tx".to_string()),
            Just(r"DIRECT=OS:.\private$\q".to_string()),
            Just(r"DIRECT=TCP:127.0.0.1:1801\private$\q".to_string()),
            Just(r"DIRECT=TCP:10.0.0.1:1\private$\remote".to_string()),
            Just(r"FORMATNAME:DIRECT=OS:.\private$\q,DIRECT=OS:.\private$\tx".to_string()),
            "[ -~]{0,40}",
            "\\PC{0,20}",
        ]
    }

    fn out_message() -> impl Strategy<Value = v1::OutMessage> {
        (
            prop::collection::vec(any::<u8>(), 0..64),
            "\\PC{0,8}",
            prop::option::of(0u32..10),
            any::<i32>(),
            0u64..3,
            0u64..100_000,
        )
            .prop_map(
                |(body, label, priority, delivery, ttrq, ttbr)| v1::OutMessage {
                    body: body.into(),
                    label,
                    priority,
                    delivery: delivery % 4,
                    time_to_reach_queue_ms: ttrq,
                    time_to_be_received_ms: ttbr,
                    ..Default::default()
                },
            )
    }

    /// A call whose messages are well-formed requests of its RPC with arbitrary fields, or
    /// (one in four) arbitrary bytes.
    fn call() -> impl Strategy<Value = Call> {
        let structured = (
            0..METHODS.len() as u8,
            names(),
            any::<bool>(),
            any::<u64>(),
            out_message(),
        )
            .prop_map(|(method, name, flag, n, m)| {
                let small = n % 5_000;
                // A message id: 16 bytes (that match nothing stored), or a wrong length.
                let id = || -> bytes::Bytes {
                    match n % 4 {
                        0 => bytes::Bytes::new(),
                        1 => vec![7u8; (n % 20) as usize].into(),
                        _ => small.to_le_bytes().repeat(2).into(),
                    }
                };
                let corr = if n % 5 == 0 {
                    name.clone()
                } else {
                    String::new()
                };
                let msg: Vec<Vec<u8>> = match METHODS[method as usize].0 {
                    "CreateQueue" => vec![v1::CreateQueueRequest {
                        name,
                        transactional: flag,
                        quota_bytes: (n % 3 == 0).then_some(n % 10_000),
                        label: String::new(),
                        max_aborts: (n % 4) as u32,
                        journal: n % 2 == 0,
                        journal_quota_bytes: (n % 7 == 0).then_some(small),
                    }
                    .encode_to_vec()],
                    "DeleteQueue" | "GetQueueInfo" | "Purge" => {
                        // The three requests are alike: a queue name in field 1.
                        vec![v1::DeleteQueueRequest { name }.encode_to_vec()]
                    }
                    "Send" => vec![v1::SendRequest {
                        first_seq: n,
                        destination: name,
                        messages: vec![m.clone(), m],
                        transactional: flag,
                        tx_stream: Default::default(),
                    }
                    .encode_to_vec()],
                    "Receive" => vec![
                        v1::ReceiveRequest {
                            queue: name,
                            credit: (n % 4) as u32,
                            ack_through: 0,
                        }
                        .encode_to_vec(),
                        v1::ReceiveRequest {
                            queue: String::new(),
                            credit: 1,
                            ack_through: n % 3,
                        }
                        .encode_to_vec(),
                    ],
                    "ReceiveOne" => vec![v1::ReceiveOneRequest {
                        queue: name,
                        timeout_ms: small,
                        peek: flag,
                        id: id(),
                        correlation_id: corr,
                    }
                    .encode_to_vec()],
                    "Peek" => vec![v1::PeekRequest {
                        queue: name,
                        timeout_ms: small,
                        max: (n % 7) as u32,
                        // Every third peek continues from a cursor, valid or not.
                        cursor: match n % 3 {
                            0 => Default::default(),
                            1 => crate::queue::PeekCursor {
                                lane: (n % 8) as u8,
                                seq: small,
                            }
                            .encode(),
                            _ => bytes::Bytes::copy_from_slice(&small.to_le_bytes()),
                        },
                        from_id: id(),
                    }
                    .encode_to_vec()],
                    "Transact" => {
                        use v1::transact_request::Op;
                        let op = |op| v1::TransactRequest { op: Some(op) }.encode_to_vec();
                        vec![
                            op(Op::Send(v1::TxSend {
                                destination: name.clone(),
                                messages: vec![m],
                            })),
                            op(Op::Receive(v1::TxReceive {
                                queue: name,
                                timeout_ms: small,
                                id: id(),
                                correlation_id: corr,
                                // Every other one commits with the receive (one round trip).
                                commit: n % 2 == 0,
                            })),
                            op(if flag { Op::Commit(()) } else { Op::Abort(()) }),
                        ]
                    }
                    "Forward" => vec![v1::ForwardRequest {
                        stream_id: (0..(n % 20) as u8).collect::<Vec<u8>>().into(),
                        source: "peer".into(),
                        batch: 1,
                        settled_below: 0,
                        messages: vec![v1::ForwardedMessage {
                            seq: small,
                            destination: name,
                            transactional: flag,
                            message: Some(v1::Message {
                                id: vec![1u8; 16].into(),
                                body: m.body,
                                ..Default::default()
                            }),
                        }],
                    }
                    .encode_to_vec()],
                    "PauseOutgoing" | "ResumeOutgoing" => {
                        // Pause and resume requests are alike: a destination in field 1.
                        vec![v1::PauseOutgoingRequest { destination: name }.encode_to_vec()]
                    }
                    "SetQueueProperties" => vec![v1::SetQueuePropertiesRequest {
                        name,
                        label: flag.then(|| "x".repeat((n % 300) as usize)),
                        quota_bytes: (n % 3 == 0).then_some(small),
                        remove_quota: n % 5 == 0,
                        journal: (n % 2 == 0).then_some(flag),
                        journal_quota_bytes: (n % 7 == 0).then_some(small),
                        max_aborts: (n % 3 == 1).then_some((n % 20_000) as u32),
                    }
                    .encode_to_vec()],
                    "MoveMessage" => vec![v1::MoveMessageRequest {
                        queue: name.clone(),
                        id: id(),
                        destination: match n % 3 {
                            0 => String::new(),
                            1 => "poison".into(),
                            _ => name,
                        },
                    }
                    .encode_to_vec()],
                    "Browse" => {
                        let action = |k: u64| (k % 5) as i32; // 4 is not an action
                        (0..=(n % 4))
                            .map(|k| {
                                v1::BrowseRequest {
                                    queue: if k == 0 { name.clone() } else { String::new() },
                                    action: action(n.rotate_right(k as u32 * 2)),
                                    timeout_ms: small,
                                }
                                .encode_to_vec()
                            })
                            .collect()
                    }
                    _ => vec![Vec::new()],
                };
                Call {
                    method,
                    messages: msg,
                }
            });
        let raw = (
            any::<u8>(),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..4),
        )
            .prop_map(|(method, messages)| Call { method, messages });
        prop_oneof![3 => structured, 1 => raw]
    }

    proptest! {
        #![proptest_config(config(64))]
        #[test]
        fn wire_requests_never_panic(calls in prop::collection::vec(call(), 1..6)) {
            wire_requests(&encode_calls(&calls));
        }
    }

    proptest! {
        #![proptest_config(config(2000))]
        #[test]
        fn format_names_never_panic_and_round_trip(s in prop_oneof![
            "[ -~]{0,60}",
            "(DIRECT=(OS|TCP|HTTP):|PUBLIC=|PRIVATE=|FORMATNAME:|\\.\\\\|[a-z]{1,8}\\\\)(private\\$\\\\)?[ -~]{0,20}(,[ -~]{0,20}){0,3}",
        ]) {
            format_name(s.as_bytes());
        }

        #[test]
        fn record_decoder_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
            record_decoder(&data);
        }
    }

    proptest! {
        #![proptest_config(config(200))]
        #[test]
        fn segment_recovery_of_random_bytes(mode in any::<u8>(), data in prop::collection::vec(any::<u8>(), 0..600)) {
            let mut input = vec![mode];
            input.extend(data);
            segment_recovery(&input);
        }

        #[test]
        fn damaged_journal_keeps_only_what_was_put(data in prop::collection::vec(any::<u8>(), 4..80)) {
            damaged_journal(&data);
        }
    }

    #[test]
    fn record_decoder_reencodes_real_records() {
        // A real record (two ops) decodes and re-encodes byte for byte.
        let mut buf = Vec::new();
        crate::journal::fuzz::sample_record(&mut buf);
        record_decoder(&buf);
    }

    /// The harness really reaches the service: create, send, receive all succeed; a bad
    /// queue name is refused with INVALID_ARGUMENT (3).
    #[test]
    fn wire_requests_reach_the_service() {
        let q = r".\private$\q".to_string();
        let create = |name: &str| Call {
            method: 0,
            messages: vec![v1::CreateQueueRequest {
                name: name.to_string(),
                ..Default::default()
            }
            .encode_to_vec()],
        };
        let send = Call {
            method: 5,
            messages: vec![v1::SendRequest {
                first_seq: 1,
                destination: q.clone(),
                messages: vec![v1::OutMessage {
                    body: Bytes::from_static(b"hello"),
                    delivery: v1::Delivery::Recoverable as i32,
                    ..Default::default()
                }],
                transactional: false,
                tx_stream: Default::default(),
            }
            .encode_to_vec()],
        };
        let receive = Call {
            method: 7,
            messages: vec![v1::ReceiveOneRequest {
                queue: q.clone(),
                timeout_ms: 10,
                peek: false,
                ..Default::default()
            }
            .encode_to_vec()],
        };
        let got = wire_requests(&encode_calls(&[
            create(&q),
            send,
            receive,
            create("\\\\bad"),
        ]));
        let want: Vec<Option<String>> = ["0", "0", "0", "3"]
            .iter()
            .map(|s| Some(s.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn calls_round_trip() {
        let calls = vec![
            Call {
                method: 0,
                messages: vec![vec![1, 2, 3]],
            },
            Call {
                method: 5,
                messages: vec![vec![], vec![9; 300]],
            },
        ];
        let back = parse_calls(&encode_calls(&calls));
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].messages, calls[1].messages);
    }

    /// Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/`.
    /// `cargo test -p mq-broker --lib write_fuzz_seeds -- --ignored`
    #[test]
    #[ignore = "writes the fuzz seed corpus; run by hand"]
    fn write_fuzz_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let write = |target: &str, name: &str, data: &[u8]| {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), data).unwrap();
        };
        for (i, s) in [
            r".\private$\orders",
            r"DIRECT=OS:.\private$\orders",
            r"DIRECT=TCP:10.1.2.3:1801\private$\q",
            r"FORMATNAME:DIRECT=OS:.\private$\a,DIRECT=TCP:h:1\b",
            r"DIRECT=OS:.\SYSTEM$;DEADLETTER",
        ]
        .iter()
        .enumerate()
        {
            write("format_name", &format!("seed{i}"), s.as_bytes());
        }
        let mut rec = Vec::new();
        crate::journal::fuzz::sample_record(&mut rec);
        write("journal_record", "seed0", &rec);
        write("journal_record", "seed1", &rec[..rec.len() - 3]);
        let mut seg = vec![1u8];
        seg.extend_from_slice(&rec);
        write("segment_recovery", "seed0", &seg);
        let mut seg2 = vec![7u8];
        seg2.extend_from_slice(&rec);
        seg2.extend_from_slice(&[0, 0, 0, 0, 9, 9]);
        seg2.extend_from_slice(&rec);
        write("segment_recovery", "seed1", &seg2);
        write("damaged_journal", "seed0", &[0, 10, 3, 0, 40, 0, 1]);
        write(
            "damaged_journal",
            "seed1",
            &[1, 23, 9, 0, 100, 0, 0x40, 0, 200, 1, 0x80],
        );
        let q = r".\private$\q".to_string();
        let create = Call {
            method: 0,
            messages: vec![v1::CreateQueueRequest {
                name: q.clone(),
                ..Default::default()
            }
            .encode_to_vec()],
        };
        let send = Call {
            method: 5,
            messages: vec![v1::SendRequest {
                first_seq: 1,
                destination: q.clone(),
                messages: vec![v1::OutMessage {
                    body: Bytes::from_static(b"hello"),
                    delivery: v1::Delivery::Recoverable as i32,
                    ..Default::default()
                }],
                transactional: false,
                tx_stream: Default::default(),
            }
            .encode_to_vec()],
        };
        let receive = Call {
            method: 7,
            messages: vec![v1::ReceiveOneRequest {
                queue: q.clone(),
                timeout_ms: 10,
                peek: false,
                ..Default::default()
            }
            .encode_to_vec()],
        };
        write(
            "wire_request",
            "seed0",
            &encode_calls(std::slice::from_ref(&create)),
        );
        write(
            "wire_request",
            "seed1",
            &encode_calls(&[create.clone(), send.clone(), receive]),
        );
        let tx = Call {
            method: 9,
            messages: vec![
                v1::TransactRequest {
                    op: Some(v1::transact_request::Op::Send(v1::TxSend {
                        destination: q.clone(),
                        messages: vec![v1::OutMessage::default()],
                    })),
                }
                .encode_to_vec(),
                v1::TransactRequest {
                    op: Some(v1::transact_request::Op::Commit(())),
                }
                .encode_to_vec(),
            ],
        };
        write(
            "wire_request",
            "seed2",
            &encode_calls(&[create.clone(), tx]),
        );
        let fwd = Call {
            method: 10,
            messages: vec![v1::ForwardRequest {
                stream_id: vec![7u8; 16].into(),
                source: "peer".into(),
                batch: 1,
                settled_below: 0,
                messages: vec![v1::ForwardedMessage {
                    seq: 1,
                    destination: r"DIRECT=TCP:127.0.0.1:1801\private$\q".into(),
                    transactional: false,
                    message: Some(v1::Message {
                        id: vec![1u8; 16].into(),
                        body: Bytes::from_static(b"x"),
                        ..Default::default()
                    }),
                }],
            }
            .encode_to_vec()],
        };
        write("wire_request", "seed3", &encode_calls(&[create, fwd]));
        let remote = Call {
            method: 5,
            messages: vec![v1::SendRequest {
                first_seq: 1,
                destination: r"DIRECT=TCP:10.9.9.9:1801\private$\r".into(),
                messages: vec![v1::OutMessage {
                    body: Bytes::from_static(b"r"),
                    delivery: v1::Delivery::Recoverable as i32,
                    ..Default::default()
                }],
                transactional: false,
                tx_stream: Default::default(),
            }
            .encode_to_vec()],
        };
        let pause = Call {
            method: 12,
            messages: vec![v1::PauseOutgoingRequest {
                destination: "10.9.9.9:1801".into(),
            }
            .encode_to_vec()],
        };
        write("wire_request", "seed4", &encode_calls(&[remote, pause]));
    }
}
