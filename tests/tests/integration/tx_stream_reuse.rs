//! Consecutive transactions on one `Transact` stream (issue 14): many on one stream, an abort
//! between commits, a timeout that counts per transaction, and a connection broken between two
//! transactions of a client (the next one is in doubt or not started, never silently lost).

use std::time::Duration;

use bytes::Bytes;
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

/// One raw `Transact` stream.
struct Raw {
    out: mpsc::UnboundedSender<v1::TransactRequest>,
    inbound: tonic::Streaming<v1::TransactResponse>,
}

impl Raw {
    /// Opens a stream; asserts the broker announces that it carries transactions one after
    /// another.
    async fn open(url: &str) -> Raw {
        let mut rpc =
            v1::message_queue_service_client::MessageQueueServiceClient::connect(url.to_string())
                .await
                .unwrap();
        let (out, rx) = mpsc::unbounded_channel();
        let response = rpc
            .transact(UnboundedReceiverStream::new(rx))
            .await
            .unwrap();
        assert!(
            response
                .metadata()
                .get(mq_proto::TX_STREAM_REUSE_METADATA)
                .is_some(),
            "the broker announces reusable Transact streams"
        );
        Raw {
            out,
            inbound: response.into_inner(),
        }
    }

    fn op(&self, op: Op) {
        self.out.send(v1::TransactRequest { op: Some(op) }).unwrap();
    }

    fn begin(&self, id: TxId) {
        self.op(Op::Begin(v1::TxBegin {
            id: Bytes::copy_from_slice(id.0.as_bytes()),
        }));
    }

    fn send(&self, body: &str) {
        self.op(Op::Send(v1::TxSend {
            destination: Q.to_string(),
            messages: vec![v1::OutMessage {
                body: Bytes::copy_from_slice(body.as_bytes()),
                ..Default::default()
            }],
        }));
    }

    fn receive(&self) {
        self.op(Op::Receive(v1::TxReceive {
            queue: Q.to_string(),
            timeout_ms: WAIT.as_millis() as u64,
            ..Default::default()
        }));
    }

    async fn answer(&mut self) -> Result<Res, tonic::Status> {
        match tokio::time::timeout(WAIT, self.inbound.message()).await {
            Ok(Ok(Some(v1::TransactResponse { result: Some(r) }))) => Ok(r),
            Ok(Ok(other)) => panic!("the stream ended or sent nothing: {other:?}"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within {WAIT:?}"),
        }
    }

    /// Commits; asserts it committed as `id`.
    async fn commit(&mut self, id: TxId) -> v1::TxCommitted {
        self.op(Op::Commit(()));
        match self.answer().await {
            Ok(Res::Committed(c)) => {
                assert_eq!(c.id.as_ref(), id.0.as_bytes());
                c
            }
            other => panic!("commit of {id}: {other:?}"),
        }
    }
}

async fn bodies(client: &Client) -> Vec<(String, u32)> {
    client
        .queue(Q)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (String::from_utf8_lossy(&m.body).into_owned(), m.abort_count))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_transactions_one_after_another_on_one_stream() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create_tx_queue(&client).await;
    let mut raw = Raw::open(broker.url()).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        let id = TxId::new();
        raw.begin(id);
        raw.send(&format!("m{i}"));
        assert_eq!(raw.commit(id).await.ids.len(), 1);
        ids.push(id);
    }
    // Receives too, and a transaction without TxBegin (the broker names it).
    for i in 0..10 {
        raw.receive();
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
    let mut raw = Raw::open(broker.url()).await;

    let first = TxId::new();
    raw.begin(first);
    raw.send("a");
    raw.commit(first).await;

    // Sends "x" and receives "a", then aborts: "x" never appears, "a" comes back.
    let aborted = TxId::new();
    raw.begin(aborted);
    raw.send("x");
    raw.receive();
    match raw.answer().await.unwrap() {
        Res::Received(m) => assert_eq!(m.body, "a".as_bytes()),
        other => panic!("{other:?}"),
    }
    raw.op(Op::Abort(()));
    assert_eq!(raw.answer().await.unwrap(), Res::Aborted(()));

    let third = TxId::new();
    raw.begin(third);
    raw.send("b");
    raw.commit(third).await;
    assert_eq!(
        bodies(&client).await,
        vec![("a".to_string(), 1), ("b".to_string(), 0)]
    );
    let s = client.transaction_outcome(aborted).await.unwrap();
    assert_eq!(s.outcome, TxOutcome::Aborted);

    // The aborted transaction's id cannot be reused for a commit on the same stream either way
    // round: a committed one is refused, and the refusal ends the stream.
    raw.begin(first);
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
    let mut raw = Raw::open(broker.url()).await;
    let first = TxId::new();
    raw.begin(first);
    raw.send("one");
    raw.commit(first).await;
    // Idle between transactions for longer than the transaction timeout (time must pass).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = TxId::new();
    raw.begin(second);
    raw.send("two");
    raw.commit(second).await;
    // Inside a transaction the timeout still holds: it aborts, and the error ends the stream.
    raw.begin(TxId::new());
    raw.send("never");
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
