//! Security: identities (password, token, certificate, anonymous), every right allowed and
//! denied (client crate and `mq`), rights after a restart, protected mode, TLS and mTLS,
//! authenticated store-and-forward between two TLS brokers (the stream-hijack attack, express
//! into a transactional queue, `sender` across hops).

use std::time::Duration;

use mq_client::{Client, Error, Message, QueueOptions};
use mq_tests::{mq, InProcessBroker, MqdProcess, TestPki};

const Q: &str = r".\private$\secured";

/// admin: create-queue, outgoing, dead-letter; alice: nothing; bob: group readers.
fn users(pki: &TestPki) -> std::path::PathBuf {
    mq_tests::users_file(
        &pki.path("users.toml"),
        &[
            (
                "admin",
                "admin-pw",
                &[],
                &["create-queue", "outgoing", "dead-letter"],
            ),
            ("alice", "alice-pw", &[], &[]),
            ("bob", "bob-pw", &["readers"], &[]),
        ],
    )
}

async fn as_user(url: &str, user: &str, password: &str) -> Client {
    Client::builder(url)
        .user(user, password)
        .connect()
        .await
        .expect("connect")
}

fn denied<T: std::fmt::Debug>(r: mq_client::Result<T>, needles: &[&str]) {
    match r {
        Err(Error::PermissionDenied(m)) => {
            for n in needles {
                assert!(m.contains(n), "{m:?} should name {n:?}");
            }
        }
        other => panic!("expected PERMISSION_DENIED naming {needles:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn every_right_allowed_and_denied_through_the_client() {
    let pki = TestPki::new("test CA");
    let users = users(&pki);
    let broker = InProcessBroker::start_with(|c| c.security.users_file = Some(users)).await;
    let url = broker.url().to_string();
    let admin = as_user(&url, "admin", "admin-pw").await;
    let alice = as_user(&url, "alice", "alice-pw").await;
    let bob = as_user(&url, "bob", "bob-pw").await;
    let anon = Client::connect(&url).await.unwrap();

    // Bad credentials: UNAUTHENTICATED, not anonymous.
    let wrong = as_user(&url, "alice", "nope").await;
    match wrong.list_queues().await {
        Err(Error::Unauthenticated(m)) => assert!(m.contains("alice"), "{m}"),
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }

    // create-queue
    denied(
        alice.create_queue(Q, QueueOptions::default()).await,
        &["alice", "create-queue"],
    );
    admin
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    let acl = admin.acl(Q).await.unwrap();
    assert_eq!(
        acl.entries,
        [(
            "admin".to_string(),
            vec!["send", "receive", "peek", "admin"]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        )]
    );
    // Invisible without a right.
    assert!(alice.list_queues().await.unwrap().is_empty());

    // send
    let aq = alice.queue(Q).unwrap();
    denied(
        aq.send(Message::new("x")).await,
        &["alice", "\"send\"", r"private$\secured"],
    );
    denied(
        anon.queue(Q).unwrap().send(Message::new("x")).await,
        &["anonymous", "send"],
    );
    admin.grant(Q, "alice", &["send"]).await.unwrap();
    aq.send(Message::new("from alice")).await.unwrap();
    assert_eq!(alice.list_queues().await.unwrap().len(), 1);

    // receive and peek, through a group
    denied(aq.receive(Duration::ZERO).await, &["alice", "receive"]);
    denied(aq.peek(Duration::ZERO).await, &["alice", "peek"]);
    let bq = bob.queue(Q).unwrap();
    denied(bq.peek(Duration::ZERO).await, &["bob", "peek"]);
    admin
        .grant(Q, "group:readers", &["peek", "receive"])
        .await
        .unwrap();
    let peeked = bq.peek(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(peeked.sender, "alice");
    let got = bq.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(&got.body[..], b"from alice");
    assert_eq!(got.sender, "alice");

    // admin: purge, delete, change rights
    denied(bq.purge().await, &["bob", "admin"]);
    denied(bob.grant(Q, "bob", &["admin"]).await, &["bob", "admin"]);
    denied(bob.delete_queue(Q).await, &["bob", "admin"]);
    admin
        .revoke(Q, "group:readers", &["receive"])
        .await
        .unwrap();
    denied(bq.receive(Duration::ZERO).await, &["bob", "receive"]);

    // outgoing
    denied(alice.outgoing().await, &["alice", "outgoing"]);
    admin.outgoing().await.unwrap();

    // dead-letter
    let dlq = r"DIRECT=OS:.\SYSTEM$;DEADLETTER";
    denied(
        alice.queue(dlq).unwrap().peek(Duration::ZERO).await,
        &["alice", "dead-letter"],
    );
    admin
        .queue(dlq)
        .unwrap()
        .peek(Duration::ZERO)
        .await
        .unwrap();

    // forward is a broker right
    admin.delete_queue(Q).await.unwrap();
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn without_a_users_file_everyone_has_every_right() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    q.send(Message::new("x")).await.unwrap();
    let got = q.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(got.sender, "anonymous");
    client.outgoing().await.unwrap();
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn tokens_and_tls_with_clear_errors() {
    let pki = TestPki::new("test CA");
    let users = users(&pki);
    let token = mq_broker::add_user(&users, "ci", None, &[], &["create-queue".into()], true)
        .unwrap()
        .unwrap();
    let (cert, key) = pki.issue("broker");
    let broker = InProcessBroker::start_with(|c| {
        c.security.users_file = Some(users);
        c.security.tls_cert = Some(cert);
        c.security.tls_key = Some(key);
    })
    .await;
    let https = format!("https://{}", broker.addr());
    let ci = Client::builder(&https)
        .ca_pem(pki.ca_pem())
        .token(&token)
        .connect()
        .await
        .unwrap();
    ci.create_queue(Q, QueueOptions::default()).await.unwrap();
    let q = ci.queue(Q).unwrap();
    q.send(Message::new("over tls")).await.unwrap();
    assert_eq!(
        q.receive(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap()
            .sender,
        "ci"
    );
    let bad = Client::builder(&https)
        .ca_pem(pki.ca_pem())
        .token("mqt_not-a-token")
        .connect()
        .await
        .unwrap();
    assert!(matches!(
        bad.list_queues().await,
        Err(Error::Unauthenticated(_))
    ));

    // A client that does not trust the CA.
    let other = TestPki::new("another CA");
    let e = Client::builder(&https)
        .ca_pem(other.ca_pem())
        .connect()
        .await
        .expect_err("an untrusted certificate must fail");
    let text = e.to_string();
    assert!(
        text.contains("certificate") || text.contains("UnknownIssuer"),
        "{text}"
    );
    // No CA at all for an https:// URL.
    let e = Client::builder(&https).connect().await.unwrap_err();
    assert!(e.to_string().contains("--ca"), "{e}");
    // Plaintext against the TLS port.
    let plain = format!("http://{}", broker.addr());
    let r = match Client::connect(&plain).await {
        Ok(c) => c.list_queues().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let e = r.expect_err("plaintext against a TLS port must fail");
    assert!(
        matches!(e, Error::Connect { .. } | Error::Unavailable(_)),
        "{e:?}"
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_and_names_the_identity() {
    let pki = TestPki::new("test CA");
    let users = users(&pki);
    // A certificate user: no password, rights from the users file.
    mq_broker::add_user(&users, "app-1", None, &[], &["create-queue".into()], false).unwrap();
    let (cert, key) = pki.issue("broker");
    let (ccert, ckey) = pki.issue("app-1");
    let broker = InProcessBroker::start_with(|c| {
        c.security.users_file = Some(users);
        c.security.tls_cert = Some(cert);
        c.security.tls_key = Some(key);
        c.security.tls_client_ca = Some(pki.ca.clone());
    })
    .await;
    let https = format!("https://{}", broker.addr());
    let no_cert = Client::builder(&https).ca_pem(pki.ca_pem()).connect().await;
    let r = match no_cert {
        Ok(c) => c.list_queues().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(r.is_err(), "a client without a certificate must be refused");
    let app = Client::builder(&https)
        .ca_pem(pki.ca_pem())
        .client_cert_pem(
            std::fs::read(&ccert).unwrap(),
            std::fs::read(&ckey).unwrap(),
        )
        .connect()
        .await
        .unwrap();
    app.create_queue(Q, QueueOptions::default()).await.unwrap();
    let q = app.queue(Q).unwrap();
    q.send(Message::new("m")).await.unwrap();
    let got = q.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(got.sender, "app-1");
    broker.stop().await.unwrap();
}

/// `mq` with --user / MQ_PASSWORD and --token; refusals exit 1 with one line naming identity,
/// right and queue; rights survive a restart.
#[tokio::test]
async fn rights_through_mq_and_after_a_restart() {
    let pki = TestPki::new("test CA");
    let users = users(&pki);
    let dir = mq_tests::temp_data_dir("mq-sec-");
    let users_arg = users.to_str().unwrap().to_string();
    let mut mqd = MqdProcess::launch(dir.path(), &["--users", &users_arg]);
    let run = |url: &str, user: &str, pw: &str, args: &[&str]| {
        let mut cmd = std::process::Command::new(mq_tests::mq_path());
        cmd.args(["--user", user])
            .args(args)
            .env("MQ_BROKER", url)
            .env("MQ_PASSWORD", pw);
        mq_tests::run_with_timeout(cmd, None, mq_tests::CLI_TIMEOUT).unwrap()
    };
    let url = mqd.url().to_string();
    let out = run(&url, "alice", "alice-pw", &["queue", "create", Q]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("alice") && err.contains("create-queue") && err.lines().count() == 1,
        "{err}"
    );
    let out = run(&url, "admin", "admin-pw", &["queue", "create", Q]);
    assert!(out.status.success(), "{out:?}");
    let out = run(
        &url,
        "admin",
        "admin-pw",
        &["queue", "grant", Q, "alice", "send"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(
        &url,
        "alice",
        "alice-pw",
        &["send", Q, "hello", "--recoverable"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(
        &url,
        "alice",
        "alice-pw",
        &["receive", Q, "--timeout", "0s"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("alice") && err.contains("receive") && err.contains(r"private$\secured"),
        "{err}"
    );
    // Anonymous `mq` is refused too.
    let out = mq(&url, &["send", Q, "anon"], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    // Restart: the ACL is in the journal.
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
    let mqd = MqdProcess::launch(dir.path(), &["--users", &users_arg]);
    let url = mqd.url().to_string();
    let out = run(&url, "admin", "admin-pw", &["queue", "acl", Q, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["acl"]["alice"], serde_json::json!(["send"]));
    assert_eq!(
        v["acl"]["admin"],
        serde_json::json!(["send", "receive", "peek", "admin"])
    );
    let out = run(
        &url,
        "alice",
        "alice-pw",
        &["send", Q, "again", "--recoverable"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(
        &url,
        "admin",
        "admin-pw",
        &["receive", Q, "--count", "2", "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["sender"], "alice", "{line}");
    }
    let out = run(
        &url,
        "admin",
        "admin-pw",
        &["queue", "revoke", Q, "alice", "send"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(&url, "alice", "alice-pw", &["send", Q, "no more"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn protected_mode_refuses_a_public_address_without_tls_and_users() {
    let dir = mq_tests::temp_data_dir("mq-sec-");
    // Port 0 on the wildcard address: mqd refuses before it serves anything.
    let cmd = mq_tests::mqd_command_on(dir.path(), "0.0.0.0:0", &[]);
    let out = mq_tests::run_with_timeout(cmd, None, mq_tests::START_TIMEOUT).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("non-loopback") && err.contains("--insecure"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "it must not announce an address");
    // Loopback with --insecure (or without it) starts.
    let mut mqd = MqdProcess::launch(dir.path(), &["--insecure"]);
    mqd.terminate(mq_tests::STOP_TIMEOUT).unwrap();
}
