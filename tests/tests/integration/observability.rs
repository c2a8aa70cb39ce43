//! Operations: `mqd --metrics-listen` (Prometheus `/metrics`, `/healthz`, `/readyz`) scraped with
//! a real HTTP client after a known workload and parsed with a Prometheus text parser;
//! `grpc.health.v1` (SERVING after start, NOT_SERVING once SIGTERM arrives) and server
//! reflection on the main port, both without credentials; `mq info`.

use std::collections::HashMap;
use std::time::Duration;

use mq_client::{Message, QueueOptions};
use mq_tests::{free_port, mq, temp_data_dir, wait_until, MqdProcess};

const WAIT: Duration = Duration::from_secs(30);

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// GET `http://addr/path`: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut r = agent()
        .get(&format!("http://{addr}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let body = r.body_mut().read_to_string().expect("a text body");
    (r.status().as_u16(), body)
}

/// One scrape, parsed: `(name, labels)` to value, label values unescaped.
struct Scrape(Vec<(String, HashMap<String, String>, prometheus_parse::Value)>);

fn scrape(addr: &str) -> Scrape {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    let parsed =
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    Scrape(
        parsed
            .samples
            .into_iter()
            .map(|s| {
                let labels = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.replace("\\\\", "\\")))
                    .collect();
                (s.metric, labels, s.value)
            })
            .collect(),
    )
}

impl Scrape {
    /// The value of the sample `name` whose labels include `labels`; panics if there is none.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        use prometheus_parse::Value::*;
        for (m, l, v) in &self.0 {
            if m == name
                && labels
                    .iter()
                    .all(|(k, want)| l.get(*k).map(String::as_str) == Some(*want))
            {
                return match v {
                    Counter(x) | Gauge(x) | Untyped(x) => *x,
                    other => panic!("{name} is not a scalar: {other:?}"),
                };
            }
        }
        panic!("no sample {name} {labels:?}");
    }
}

const Q: &str = r".\private$\metrics-q";
const TQ: &str = r".\private$\metrics-tq";
const EXPIRING: &str = r".\private$\metrics-expiring";

/// A known workload, then one scrape: every counter and gauge equals what was done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_known_workload() {
    let dir = temp_data_dir("mq-metrics");
    let http = format!("127.0.0.1:{}", free_port());
    let mqd = MqdProcess::launch(dir.path(), &["--metrics-listen", &http]);
    let (status, body) = get(&http, "/readyz");
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    assert_eq!(get(&http, "/healthz").0, 200);
    let client = mqd.connect().await;
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    client
        .create_queue(
            TQ,
            QueueOptions {
                transactional: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    client
        .create_queue(EXPIRING, QueueOptions::default())
        .await
        .unwrap();

    // 10 recoverable sends, 4 receives.
    let q = client.queue(Q).unwrap();
    for i in 0..10 {
        q.send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    for _ in 0..4 {
        q.receive(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("a message");
    }
    // One that expires in its queue: dead-lettered with class ReceiveTimeout.
    client
        .queue(EXPIRING)
        .unwrap()
        .send(Message::new("late").time_to_be_received(Duration::from_millis(1)))
        .await
        .unwrap();
    // A transaction that sends one message (committed), one whose receive is aborted.
    let mut tx = client.begin().await.unwrap();
    tx.send(TQ, Message::new("t")).unwrap();
    tx.commit().await.unwrap();
    let mut tx = client.begin().await.unwrap();
    tx.receive(TQ, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the committed message");
    tx.abort().await.unwrap();
    // A refused request.
    assert!(client
        .queue_info(r".\private$\no-such-queue")
        .await
        .is_err());

    let deadletter = r".\SYSTEM$;DEADLETTER";
    // The dead letter shows in its queue a moment before the counters of where it came from.
    assert!(
        wait_until(WAIT, || {
            let s = scrape(&http);
            s.value("mq_queue_messages", &[("queue", deadletter)]) == 1.0
                && s.value("mq_queue_dead_lettered_total", &[("queue", EXPIRING)]) == 1.0
                && s.value("mq_dead_lettered_total", &[("class", "ReceiveTimeout")]) == 1.0
        }),
        "the expired message never reached the dead-letter queue"
    );
    let s = scrape(&http);
    let q = |name: &str, queue: &str| s.value(name, &[("queue", queue)]);
    assert_eq!(q("mq_queue_sent_total", Q), 10.0);
    assert_eq!(q("mq_queue_received_total", Q), 4.0);
    assert_eq!(q("mq_queue_messages", Q), 6.0);
    assert_eq!(q("mq_queue_bytes", Q), 12.0);
    assert_eq!(q("mq_queue_in_flight_messages", Q), 0.0);
    assert_eq!(q("mq_queue_dead_lettered_total", EXPIRING), 1.0);
    assert_eq!(q("mq_queue_received_total", EXPIRING), 0.0);
    assert_eq!(q("mq_queue_sent_total", deadletter), 1.0);
    assert_eq!(
        s.value("mq_dead_lettered_total", &[("class", "ReceiveTimeout")]),
        1.0
    );
    assert_eq!(
        s.value(
            "mq_dead_lettered_total",
            &[("class", "BadDestinationQueue")]
        ),
        0.0
    );
    assert_eq!(q("mq_queue_receive_aborts_total", TQ), 1.0);
    assert_eq!(q("mq_queue_messages", TQ), 1.0);
    assert_eq!(s.value("mq_transactions_committed_total", &[]), 1.0);
    assert_eq!(
        s.value("mq_transactions_aborted_total", &[("reason", "requested")]),
        1.0
    );
    assert_eq!(s.value("mq_transactions_open", &[]), 0.0);
    assert!(s.value("mq_journal_fdatasync_total", &[]) > 0.0);
    assert!(s.value("mq_journal_fdatasync_duration_seconds_count", &[]) > 0.0);
    assert!(s.value("mq_journal_written_bytes_total", &[]) > 0.0);
    assert_eq!(s.value("mq_journal_poisoned", &[]), 0.0);
    assert!(s.value("mq_journal_segments", &[]) >= 1.0);
    assert!(s.value("mq_refused_requests_total", &[("code", "not_found")]) >= 1.0);
    assert!(s.value("mq_connections", &[]) >= 1.0);
    for reason in ["max_connections", "per_address", "evicted"] {
        assert_eq!(
            s.value("mq_connections_closed_total", &[("reason", reason)]),
            0.0
        );
    }
    assert_eq!(s.value("mq_ready", &[]), 1.0);
    // The histogram has its buckets.
    assert!(s
        .0
        .iter()
        .any(|(m, _, v)| m == "mq_journal_fdatasync_duration_seconds"
            && matches!(v, prometheus_parse::Value::Histogram(b) if !b.is_empty())));
    drop(client);
    let mut mqd = mqd;
    mqd.terminate(WAIT).unwrap();
}

/// Protected mode: a non-loopback HTTP address needs --http-insecure.
#[test]
fn a_non_loopback_http_port_needs_http_insecure() {
    let dir = temp_data_dir("mq-metrics-protected");
    let out = mq_tests::run_with_timeout(
        mq_tests::mqd_command(dir.path(), &["--metrics-listen", "0.0.0.0:0"]),
        None,
        WAIT,
    )
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a configuration mistake: {out:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--http-insecure") && err.contains("0.0.0.0:0"),
        "{err}"
    );
}

/// gRPC health without credentials (a users file is in force): SERVING after start; a watcher
/// sees NOT_SERVING when SIGTERM arrives, and its stream ends so shutdown is not held up.
/// Reflection lists the services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_and_reflection_answer_without_credentials() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let dir = temp_data_dir("mq-health");
    let users = mq_tests::users_file(
        &dir.path().join("users.toml"),
        &[("alice", "pw", &[], &["create-queue"])],
    );
    let data = dir.path().join("data");
    let mut mqd = MqdProcess::launch(&data, &["--users", users.to_str().unwrap()]);
    let channel = tonic::transport::Endpoint::from_shared(mqd.url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // The queue service still checks identities and rights (anonymous may not create) ...
    let anonymous = mq_client::Client::connect(mqd.url()).await.unwrap();
    let refused = anonymous
        .create_queue(r".\private$\health", QueueOptions::default())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("anonymous"), "{refused}");
    // ... health does not.
    let mut health = HealthClient::new(channel.clone());
    for service in [
        "",
        "mq.v1.MessageQueueService",
        "mq.v1.AdminService",
        "mq.v1.ForwardService",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // Reflection lists the services.
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("an answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "mq.v1.MessageQueueService",
        "mq.v1.AdminService",
        "mq.v1.ForwardService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // The file that defines mq.v1.MessageQueueService is there (what `grpcurl describe` reads).
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "mq.v1.MessageQueueService".into(),
        )),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("an answer");
    assert!(
        matches!(
            answer.message_response,
            Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()
        ),
        "{answer:?}"
    );

    // Watch: SERVING, then NOT_SERVING on SIGTERM, then the stream ends.
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().expect("a first status");
    assert_eq!(first.status(), ServingStatus::Serving);
    mqd.signal("TERM").unwrap();
    let next = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("a status within the wait")
        .unwrap()
        .expect("NOT_SERVING before the stream ends");
    assert_eq!(next.status(), ServingStatus::NotServing);
    let end = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("the stream ends");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    let status = mqd.wait_exit(WAIT).unwrap().expect("mqd exits");
    assert!(status.success(), "{status}");
}

/// `mq info` through the real binaries: name, versions, the addresses, limits.
#[test]
fn mq_info_describes_the_broker() {
    let dir = temp_data_dir("mq-info");
    let http = format!("127.0.0.1:{}", free_port());
    let mut mqd = MqdProcess::launch(
        dir.path(),
        &[
            "--name",
            "info-test",
            "--metrics-listen",
            &http,
            "--max-body-bytes",
            "12345",
        ],
    );
    let out = mq(mqd.url(), &["info", "--json"], None);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "info-test");
    assert_eq!(v["protocol_version"], mq_client::PROTOCOL_VERSION);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["ready"], true);
    assert_eq!(v["http_listen"], http.as_str());
    assert_eq!(v["listen"][0], mqd.addr().to_string());
    assert_eq!(v["limits"]["max-body-bytes"], 12345);
    assert_eq!(v["data_dir"], dir.path().display().to_string());
    assert!(v["uptime_ms"].as_u64().is_some());
    let out = mq(mqd.url(), &["info"], None);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("name        info-test"), "{text}");
    assert!(text.contains(&format!("http        {http}")), "{text}");
    mqd.terminate(WAIT).unwrap();
}

/// A poisoned journal (a failed fdatasync, injected) is not ready: `/readyz` 503 naming it,
/// gRPC health NOT_SERVING, `mq_journal_poisoned` 1; `/healthz` still 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_journal_is_not_ready() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let dir = temp_data_dir("mq-poison-ready");
    let io = mq_broker::journal::FaultyIo::new(19);
    let http = format!("127.0.0.1:{}", free_port());
    let broker = {
        let (dir, io, http) = (dir.path().to_path_buf(), io.clone(), http.clone());
        mq_tests::InProcessBroker::start_with(move |c| {
            c.data_dir = dir;
            c.journal_io = Some(std::sync::Arc::new(io));
            c.http_listen = Some(http.parse().unwrap());
        })
        .await
    };
    let client = broker.client().await;
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    let readyz = |http: String| async move {
        tokio::task::spawn_blocking(move || get(&http, "/readyz"))
            .await
            .unwrap()
    };
    assert_eq!(readyz(http.clone()).await.0, 200);
    let mut health = HealthClient::new(
        tonic::transport::Endpoint::from_shared(broker.url().to_string())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let status = |mut h: HealthClient<tonic::transport::Channel>| async move {
        h.check(HealthCheckRequest {
            service: "mq.v1.MessageQueueService".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
    };
    assert_eq!(status(health.clone()).await, ServingStatus::Serving);

    io.fail_sync_at(1);
    let q = client.queue(Q).unwrap();
    assert!(q.send(Message::new("x").recoverable(true)).await.is_err());

    let (code, body) = readyz(http.clone()).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("poisoned"), "{body}");
    assert!(
        mq_tests::eventually(WAIT, || {
            let h = health.clone();
            async move { status(h).await == ServingStatus::NotServing }
        })
        .await,
        "gRPC health never said NOT_SERVING"
    );
    let http2 = http.clone();
    let s = tokio::task::spawn_blocking(move || scrape(&http2))
        .await
        .unwrap();
    assert_eq!(s.value("mq_journal_poisoned", &[]), 1.0);
    assert_eq!(s.value("mq_ready", &[]), 0.0);
    let h = http.clone();
    assert_eq!(
        tokio::task::spawn_blocking(move || get(&h, "/healthz"))
            .await
            .unwrap()
            .0,
        200
    );
    let _ = health.check(HealthCheckRequest::default()).await;
    drop(client);
    let _ = broker.stop().await;
}
