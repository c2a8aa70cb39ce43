//! Queue properties changed after creation (`SetQueueProperties`, `mq queue set`): label and
//! quota, enforced at once, shown by `mq queue info --json`, kept across `kill -9`, and not
//! undone by a later ACL change (which journals the definition too).

use mq_client::{Error, Message, QueueOptions, QueueProperties};
use mq_tests::{mq, temp_data_dir, MqdProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_label_and_quota_survive_kill9() {
    let dir = temp_data_dir("mq-props-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let name = r".\private$\props";
    client
        .create_queue(name, QueueOptions::default())
        .await
        .unwrap();
    let q = client.queue(name).unwrap();
    // A quota that holds one small message, set through the client.
    let mut p = QueueProperties::default();
    p.quota_bytes = Some(Some(200));
    let info = client.set_queue_properties(name, p).await.unwrap();
    assert_eq!(info.quota_bytes, Some(200));
    q.send(Message::new("one").recoverable(true)).await.unwrap();
    assert!(matches!(
        q.send(Message::new("two")).await,
        Err(Error::QuotaExceeded(_))
    ));
    // The CLI: label and quota, then info --json.
    let url = mqd.url().to_string();
    let out = mq(
        &url,
        &[
            "queue",
            "set",
            name,
            "--label",
            "orders v2",
            "--quota",
            "5000",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    q.send(Message::new("two")).await.unwrap();
    // An ACL change journals the definition too: it must keep the new label and quota.
    client.grant(name, "everyone", &["peek"]).await.unwrap();
    let out = mq(
        &url,
        &["queue", "set", name, "--label", &"x".repeat(251)],
        None,
    );
    assert!(
        !out.status.success(),
        "a label past 250 characters is refused"
    );
    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let out = mq(mqd.url(), &["queue", "info", name, "--json"], None);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["label"], "orders v2");
    assert_eq!(v["quota_bytes"], 5000);
    let out = mq(
        mqd.url(),
        &["queue", "set", name, "--no-quota", "--json"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["quota_bytes"].is_null(), "{v}");
    let client = mqd.connect().await;
    let acl = client.acl(name).await.unwrap();
    assert!(
        acl.entries.iter().any(|(p, _)| p == "everyone"),
        "the ACL change survived too: {acl:?}"
    );
}
