//! Consecutive transactions on one `Transact` stream (issue 14): many on one stream, an abort
//! between commits, a timeout that counts per transaction, and a connection broken between two
//! transactions of a client (the next one is in doubt or not started, never silently lost).

use std::time::Duration;

use mq_client::{Client, Error, Message, QueueOptions, TxId, TxOutcome};
use mq_proto::v1::{self, transact_request::Op, transact_response::Result as Res};
use mq_tests::{eventually, free_port, loopback, temp_data_dir, InProcessBroker, MqdProcess};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

const Q: &str = r".\private$\reuse";
const WAIT: Duration = Duration::from_secs(20);

async fn create_tx_queue(client: &Client) {
    let opts = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(Q, opts).await.unwrap();
}

use mq_tests::RawTransact;

/// Opens a raw stream; asserts the broker announces that it carries transactions one after
/// another.
async fn open_raw(url: &str) -> RawTransact {
    let raw = RawTransact::open(url).await;
    assert!(
        raw.reusable,
        "the broker announces reusable Transact streams"
    );
    raw
}

/// Commits on `raw`; asserts it committed as `id`.
async fn commit(raw: &mut RawTransact, id: TxId) -> v1::TxCommitted {
    raw.op(Op::Commit(()));
    match raw.answer().await {
        Ok(Res::Committed(c)) => {
            assert_eq!(c.id.as_ref(), id.0.as_bytes());
            c
        }
        other => panic!("commit of {id}: {other:?}"),
    }
}

async fn bodies(client: &Client) -> Vec<(String, u32)> {
    mq_tests::peek_bodies_and_aborts(client, Q).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_transactions_one_after_another_on_one_stream() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create_tx_queue(&client).await;
    let mut raw = open_raw(broker.url()).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        let id = TxId::new();
        raw.begin(id.0);
        raw.send(Q, &format!("m{i}"));
        assert_eq!(commit(&mut raw, id).await.ids.len(), 1);
        ids.push(id);
    }
    // Receives too, and a transaction without TxBegin (the broker names it).
    for i in 0..10 {
        raw.receive(Q, WAIT, false);
        match raw.answer().await.unwrap() {
            Res::Received(m) => assert_eq!(m.body, format!("m{i}").as_bytes()),
            other => panic!("receive {i}: {other:?}"),
        }
        raw.op(Op::Commit(()));
        match raw.answer().await.unwrap() {
            Res::Committed(c) => assert_eq!(c.received, 1),
            other => panic!("commit of receive {i}: {other:?}"),
        }
    }
    let left = bodies(&client).await;
    assert_eq!(left.len(), 40);
    assert_eq!(left[0], ("m10".to_string(), 0));
    for id in [ids[0], ids[25], ids[49]] {
        let s = client.transaction_outcome(id).await.unwrap();
        assert_eq!(s.outcome, TxOutcome::Committed, "{id}");
    }
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_between_commits_keeps_the_stream_and_undoes_only_its_transaction() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create_tx_queue(&client).await;
    let mut raw = open_raw(broker.url()).await;

    let first = TxId::new();
    raw.begin(first.0);
    raw.send(Q, "a");
    commit(&mut raw, first).await;

    // Sends "x" and receives "a", then aborts: "x" never appears, "a" comes back.
    let aborted = TxId::new();
    raw.begin(aborted.0);
    raw.send(Q, "x");
    raw.receive(Q, WAIT, false);
    match raw.answer().await.unwrap() {
        Res::Received(m) => assert_eq!(m.body, "a".as_bytes()),
        other => panic!("{other:?}"),
    }
    raw.op(Op::Abort(()));
    assert_eq!(raw.answer().await.unwrap(), Res::Aborted(()));

    let third = TxId::new();
    raw.begin(third.0);
    raw.send(Q, "b");
    commit(&mut raw, third).await;
    assert_eq!(
        bodies(&client).await,
        vec![("a".to_string(), 1), ("b".to_string(), 0)]
    );
    let s = client.transaction_outcome(aborted).await.unwrap();
    assert_eq!(s.outcome, TxOutcome::Aborted);

    // The aborted transaction's id cannot be reused for a commit on the same stream either way
    // round: a committed one is refused, and the refusal ends the stream.
    raw.begin(first.0);
    let e = raw.answer().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert_eq!(bodies(&client).await.len(), 2);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_counts_per_transaction_not_while_the_stream_waits_between_them() {
    let broker = InProcessBroker::start_with(|c| c.tx_timeout = Duration::from_secs(1)).await;
    let client = broker.client().await;
    create_tx_queue(&client).await;
    let mut raw = open_raw(broker.url()).await;
    let first = TxId::new();
    raw.begin(first.0);
    raw.send(Q, "one");
    commit(&mut raw, first).await;
    // Idle between transactions for longer than the transaction timeout (time must pass).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = TxId::new();
    raw.begin(second.0);
    raw.send(Q, "two");
    commit(&mut raw, second).await;
    // Inside a transaction the timeout still holds: it aborts, and the error ends the stream.
    raw.begin(TxId::new().0);
    raw.send(Q, "never");
    let e = raw.answer().await.unwrap_err();
    assert!(e.message().contains("timeout"), "{e:?}");
    assert!(matches!(raw.inbound.message().await, Ok(None) | Err(_)));
    assert_eq!(
        bodies(&client).await,
        vec![("one".to_string(), 0), ("two".to_string(), 0)]
    );
    broker.stop().await.unwrap();
}

/// The client keeps a committed transaction's stream for the next one. A broker killed between
/// two transactions: the next commit is committed (and there), in doubt, or not started (and
/// not there), never reported wrongly; the client then works again on the restarted broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_broken_between_two_transactions_never_loses_the_next_one() {
    let dir = temp_data_dir("mq-txreuse-");
    let addr = loopback(free_port());
    for (round, restart_first) in [false, true].into_iter().enumerate() {
        let mut mqd = MqdProcess::launch_on(dir.path(), addr, &[]);
        let client = mqd.connect().await;
        if round == 0 {
            create_tx_queue(&client).await;
        }
        let count =
            |all: &[(String, u32)], body: &str| all.iter().filter(|(b, _)| b == body).count();
        let kept = format!("kept {round}");
        let next = format!("next {round}");
        for _ in 0..3 {
            let mut tx = client.begin().await.unwrap();
            tx.send(Q, Message::new(kept.clone())).unwrap();
            tx.commit().await.unwrap();
        }
        mqd.kill9_checked();
        if restart_first {
            mqd = MqdProcess::launch_on(dir.path(), addr, &[]);
        }
        let id = TxId::new();
        let result = async {
            let mut tx = client.begin_with_id(id).await?;
            tx.send(Q, Message::new(next.clone()))?;
            tx.commit().await
        }
        .await;
        if !restart_first {
            mqd = MqdProcess::launch_on(dir.path(), addr, &[]);
        }
        // The client recovers: a new stream on the new connection.
        let recovered = eventually(WAIT, || async { client.queue_info(Q).await.is_ok() }).await;
        assert!(recovered, "the client reconnects to the restarted broker");
        let outcome = client.transaction_outcome(id).await.unwrap().outcome;
        let now = bodies(&client).await;
        assert_eq!(count(&now, &kept), 3, "round {round}: {now:?}");
        let there = count(&now, &next);
        match &result {
            Ok(ids) => {
                assert_eq!(ids.len(), 1);
                assert_eq!(there, 1, "round {round}: acknowledged, so it is there");
                assert_eq!(outcome, TxOutcome::Committed);
            }
            Err(Error::InDoubt { id: got, .. }) => {
                assert_eq!(*got, id);
                let committed = outcome == TxOutcome::Committed;
                assert_eq!(there, usize::from(committed), "round {round}: {outcome:?}");
            }
            Err(e) => {
                assert_eq!(
                    there, 0,
                    "round {round}: reported as not committed ({e}), but it is there"
                );
                assert_ne!(outcome, TxOutcome::Committed);
            }
        }
        // The next transaction of the same client commits.
        let after = format!("after {round}");
        let mut tx = client.begin().await.unwrap();
        tx.send(Q, Message::new(after.clone())).unwrap();
        tx.commit().await.unwrap();
        assert_eq!(count(&bodies(&client).await, &after), 1);
        mqd.kill9_checked();
    }
}

/// The broker's `mq_grpc_calls_open` gauge (`mqd --http-listen` at `http`).
fn grpc_calls_open(http: &mq_tests::http::Http) -> u64 {
    let (status, body) = http.page("/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix("mq_grpc_calls_open "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no mq_grpc_calls_open in {body}"))
}

/// A stream with no transaction open (between two transactions, or before the first) is ended
/// cleanly by the broker after `--tx-stream-idle`, which it announces; inside a transaction the
/// idle bound does not apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_no_transaction_open_is_ended_after_the_idle_bound() {
    let dir = temp_data_dir("mq-txidle-");
    let mqd = MqdProcess::launch(dir.path(), &["--tx-stream-idle", "300ms"]);
    let client = mqd.connect().await;
    create_tx_queue(&client).await;

    let mut raw = open_raw(mqd.url()).await;
    // Between two transactions.
    let id = TxId::new();
    raw.begin(id.0);
    raw.send(Q, "kept");
    commit(&mut raw, id).await;
    let end = tokio::time::timeout(WAIT, raw.inbound.message()).await;
    assert!(
        matches!(end, Ok(Ok(None))),
        "the idle stream ends cleanly within {WAIT:?}: {end:?}"
    );
    // Before the first: a stream that never sends anything.
    let mut silent = open_raw(mqd.url()).await;
    let end = tokio::time::timeout(WAIT, silent.inbound.message()).await;
    assert!(matches!(end, Ok(Ok(None))), "{end:?}");
    // The header announces the bound.
    let mut rpc =
        v1::message_queue_service_client::MessageQueueServiceClient::connect(mqd.url().to_string())
            .await
            .unwrap();
    let (_out, rx) = mpsc::unbounded_channel::<v1::TransactRequest>();
    let response = rpc
        .transact(UnboundedReceiverStream::new(rx))
        .await
        .unwrap();
    let idle = response.metadata().get(mq_proto::TX_STREAM_IDLE_METADATA);
    assert_eq!(idle.and_then(|v| v.to_str().ok()), Some("300"));
    assert_eq!(bodies(&client).await, vec![("kept".to_string(), 0)]);
    drop(mqd);
}

/// The client never begins a transaction on a stream the broker ended for idling: after the
/// broker ended the kept stream (it has no call open any more), the next transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_does_not_reuse_a_stream_the_broker_ended() {
    let dir = temp_data_dir("mq-txidle-client-");
    let (mqd, http) = mq_tests::http::mqd_with_http(dir.path(), &["--tx-stream-idle", "1s"]);
    let http = mq_tests::http::Http::new(&format!("http://{http}"));
    let client = mqd.connect().await;
    create_tx_queue(&client).await;
    for round in 0..2 {
        let mut tx = client.begin().await.unwrap();
        tx.send(Q, Message::new(format!("m{round}"))).unwrap();
        tx.commit().await.unwrap();
        // The client keeps the stream; the broker ends it once idle for 1 s.
        let ended = eventually(WAIT, || {
            let http = http.clone();
            async move {
                tokio::task::spawn_blocking(move || grpc_calls_open(&http))
                    .await
                    .unwrap()
                    == 0
            }
        })
        .await;
        assert!(ended, "the broker ends the idle stream within {WAIT:?}");
    }
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new("m2")).unwrap();
    tx.commit().await.unwrap();
    let got: Vec<String> = bodies(&client).await.into_iter().map(|b| b.0).collect();
    assert_eq!(got, ["m0", "m1", "m2"]);
    drop(mqd);
}
