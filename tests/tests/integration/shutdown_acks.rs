//! SIGTERM during a streaming receive: the broker reads and applies the acknowledgements the
//! receiver has already sent (and those it sends while it finishes its prefetched messages)
//! and writes their removals before it gives anything back, so after the restart nothing that
//! was acknowledged is delivered again, and nothing unacknowledged is lost.

use std::collections::HashSet;
use std::time::Duration;

use mq_client::{ConsumerOptions, Message, SenderOptions};
use mq_tests::{temp_data_dir, MqdProcess, STOP_TIMEOUT};

const Q: &str = r".\private$\shutdown-acks";
const WAIT: Duration = Duration::from_secs(20);

fn number(b: &[u8]) -> u64 {
    String::from_utf8_lossy(b).parse().expect("a numbered body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_streaming_receive_keeps_its_acknowledgements() {
    const N: u64 = 20_000;
    for trial in 0..3u64 {
        let dir = temp_data_dir("mq-shutdown-acks-");
        let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
        let sender = client.sender(Q, SenderOptions::default()).await.unwrap();
        for i in 1..=N {
            sender
                .send(Message::new(i.to_string()).recoverable(true))
                .await
                .unwrap();
        }
        sender.close().await.unwrap();

        let mut consumer = client
            .queue(Q)
            .unwrap()
            .consumer(ConsumerOptions::default())
            .await
            .unwrap();
        // Every message handed out is acknowledged: by the next `next`, before it waits.
        let mut handed = HashSet::new();
        let signal_at = 3000 + trial * 2500;
        loop {
            match consumer.next(WAIT).await {
                Ok(Some(m)) => {
                    handed.insert(number(&m.body));
                    if handed.len() as u64 == signal_at {
                        consumer.ack().await.unwrap();
                        mqd.signal("TERM").unwrap();
                    }
                }
                Ok(None) => panic!("trial {trial}: no message and no end within {WAIT:?}"),
                Err(_) => break, // the broker ended the stream: shutting down
            }
        }
        drop(consumer);
        let status = mqd.wait_exit(STOP_TIMEOUT).unwrap().expect("mqd exits");
        assert!(status.success(), "trial {trial}: mqd exited {status}");

        let mqd = MqdProcess::launch(dir.path(), &[]);
        let client = mqd.connect().await;
        let back: Vec<u64> = mq_tests::drain_queue(&client, Q, WAIT)
            .await
            .iter()
            .map(|b| number(b))
            .collect();
        let again: Vec<u64> = back
            .iter()
            .copied()
            .filter(|n| handed.contains(n))
            .collect();
        assert!(
            again.is_empty(),
            "trial {trial}: {} of {} acknowledged messages delivered again after SIGTERM (first {:?})",
            again.len(),
            handed.len(),
            &again[..again.len().min(5)]
        );
        let all: HashSet<u64> = back.iter().copied().chain(handed.iter().copied()).collect();
        assert_eq!(all.len() as u64, N, "trial {trial}: messages lost");
        assert_eq!(back.len() + handed.len(), N as usize, "trial {trial}");
        drop(client);
        let mut mqd = mqd;
        mqd.terminate(STOP_TIMEOUT).unwrap();
    }
}
