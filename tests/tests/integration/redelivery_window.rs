//! Measurement, not a check (ignored by default; it prints figures): the redelivery window
//! after `kill -9`, the time between a receiver's acknowledgement and the durable removal of
//! the message. A producer keeps sending recoverable 1000-byte messages while a streaming
//! receiver takes them and acknowledges every 256; `mqd` is killed at a random moment; after
//! the restart, the messages that come back although they were acknowledged show how long
//! before the kill an acknowledgement can still be lost.
//!
//! `MQ_TEST_MQD=target/release/mqd cargo test -p mq-tests --test integration redelivery_window -- --ignored --nocapture`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mq_client::{ConsumerOptions, Message, SenderOptions};
use mq_tests::{temp_data_dir, MqdProcess};

const Q: &str = r".\private$\window";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn redelivery_window_after_kill9() {
    let trials: u64 = std::env::var("TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let mut worst = Duration::ZERO;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for trial in 0..trials {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let dir = temp_data_dir("mq-window-");
        let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
        let sender = client.sender(Q, SenderOptions::default()).await.unwrap();
        let producer = tokio::spawn(async move {
            let body = vec![b'x'; 1000 - 12];
            for i in 1u64.. {
                let mut b = format!("{i:012}").into_bytes();
                b.extend_from_slice(&body);
                if sender
                    .send(Message::new(b).recoverable(true))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        // (highest acknowledged number, when the acknowledgement was sent)
        let acks: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let consumer = {
            let acks = acks.clone();
            let mut c = client
                .queue(Q)
                .unwrap()
                .consumer(ConsumerOptions::default())
                .await
                .unwrap();
            tokio::spawn(async move {
                let mut n = 0u64;
                while let Ok(Some(m)) = c.next(Duration::from_secs(5)).await {
                    n += 1;
                    if n.is_multiple_of(256) {
                        let num: u64 = String::from_utf8_lossy(&m.body[..12]).parse().unwrap();
                        if c.ack().await.is_err() {
                            break;
                        }
                        acks.lock().unwrap().push((num, Instant::now()));
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(1500 + rng % 2000)).await;
        mqd.kill9_checked();
        let killed = Instant::now();
        let _ = producer.await;
        let _ = consumer.await;
        let acks = acks.lock().unwrap().clone();
        let acked_through = acks.last().map_or(0, |a| a.0);

        let mqd = MqdProcess::launch(dir.path(), &[]);
        let client = mqd.connect().await;
        let mut c = client
            .queue(Q)
            .unwrap()
            .consumer(ConsumerOptions::default())
            .await
            .unwrap();
        // The queue is FIFO: what comes back first is what was acknowledged last.
        let mut back_acked = 0u64;
        let mut oldest: Option<u64> = None;
        while let Ok(Some(m)) = c.next(Duration::from_secs(2)).await {
            let num: u64 = String::from_utf8_lossy(&m.body[..12]).parse().unwrap();
            if num > acked_through {
                break;
            }
            back_acked += 1;
            oldest = Some(oldest.map_or(num, |o| o.min(num)));
        }
        drop(c);
        let age = oldest.and_then(|o| {
            acks.iter()
                .find(|(through, _)| *through >= o)
                .map(|(_, at)| killed.saturating_duration_since(*at))
        });
        let age = age.unwrap_or(Duration::ZERO);
        worst = worst.max(age);
        eprintln!(
            "trial {trial}: acknowledged through {acked_through}; {back_acked} acknowledged messages came back; the oldest was acknowledged {:.1} ms before the kill",
            age.as_secs_f64() * 1000.0
        );
        let mut mqd = mqd;
        mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
    }
    eprintln!(
        "worst over {trials} trials: {:.1} ms",
        worst.as_secs_f64() * 1000.0
    );
}
