//! `mqd --unix-socket PATH`: clients on the broker's machine connect with `unix:PATH`. The same
//! services, users and rights as the TCP port; the socket file is 0660, a stale one (a killed
//! mqd's) is replaced, one in use or a file that is not a socket is refused, and a clean stop
//! removes it. With `--unix-socket-os-users` a caller without credentials is its OS account.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use mq_client::{Client, Error, Message};
use mq_tests::{mq, mqd_command, run_with_timeout, temp_data_dir, MqdProcess};

const Q: &str = r".\private$\local";
const WAIT: Duration = Duration::from_secs(10);

fn socket_url(path: &std::path::Path) -> String {
    format!("unix:{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_the_unix_socket_sees_the_same_queues_as_tcp_clients() {
    let dir = temp_data_dir("mq-unix-");
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let (mqd, tcp) =
        MqdProcess::launch_with_queue(dir.path(), &["--unix-socket", &sock_arg], Q).await;
    let meta = std::fs::symlink_metadata(&sock).expect("the socket file exists once mqd listens");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);

    for url in [socket_url(&sock), format!("unix://{}", sock.display())] {
        let local = Client::connect(&url).await.unwrap();
        let lq = local.queue(Q).unwrap();
        let tq = tcp.queue(Q).unwrap();
        for i in 0..100 {
            lq.send(Message::new(format!("local {i}"))).await.unwrap();
        }
        for i in 0..100 {
            let m = tq
                .receive(WAIT)
                .await
                .unwrap()
                .expect("a message sent on the socket");
            assert_eq!(m.body, format!("local {i}").as_bytes());
        }
        tq.send(Message::new("from tcp")).await.unwrap();
        let m = lq
            .receive(WAIT)
            .await
            .unwrap()
            .expect("a message sent on TCP");
        assert_eq!(&m.body[..], b"from tcp");
        assert!(local
            .list_queues()
            .await
            .unwrap()
            .iter()
            .any(|q| q.name == Q));
    }

    // The command line too.
    let out = mq(&socket_url(&sock), &["send", Q, "by mq"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = mq(&socket_url(&sock), &["receive", Q, "--raw"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"by mq");
    drop(mqd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_is_replaced_and_a_clean_stop_removes_it() {
    let dir = temp_data_dir("mq-unix-stale-");
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let (mut mqd, _) =
        MqdProcess::launch_with_queue(dir.path(), &["--unix-socket", &sock_arg], Q).await;
    let local = Client::connect(socket_url(&sock)).await.unwrap();
    local
        .queue(Q)
        .unwrap()
        .send(Message::new("kept").recoverable(true))
        .await
        .unwrap();
    drop(local);
    mqd.kill9_checked();
    assert!(sock.exists(), "kill -9 leaves the socket file behind");

    let mut mqd = MqdProcess::launch(dir.path(), &["--unix-socket", &sock_arg]);
    let local = Client::connect(socket_url(&sock)).await.unwrap();
    let m = local.queue(Q).unwrap().receive(WAIT).await.unwrap();
    assert_eq!(&m.expect("the recoverable message").body[..], b"kept");
    drop(local);
    let status = mqd.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}: {}", mqd.stderr());
    assert!(!sock.exists(), "a clean stop removes the socket file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_in_use_or_a_file_that_is_not_a_socket_is_refused() {
    let dir = temp_data_dir("mq-unix-busy-");
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let _first = MqdProcess::launch(&dir.path().join("a"), &["--unix-socket", &sock_arg]);
    let start = |args: &[&str]| {
        let out = run_with_timeout(mqd_command(&dir.path().join("b"), args), None, WAIT * 3)
            .expect("mqd exits");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = start(&["--unix-socket", &sock_arg]);
    assert!(err.contains("another process is listening"), "{err}");
    // The first broker still serves it.
    Client::connect(socket_url(&sock))
        .await
        .unwrap()
        .list_queues()
        .await
        .unwrap();

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "data").unwrap();
    let err = start(&["--unix-socket", file.to_str().unwrap()]);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"data",
        "the file is left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_asks_for_the_same_credentials() {
    let dir = temp_data_dir("mq-unix-users-");
    let users = mq_tests::users_file(
        &dir.path().join("users.toml"),
        &[("admin", "admin-pw", &[], &["create-queue"])],
    );
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let users_arg = users.to_str().unwrap().to_string();
    let _mqd = MqdProcess::launch(
        &dir.path().join("data"),
        &["--users", &users_arg, "--unix-socket", &sock_arg],
    );
    let anon = Client::connect(socket_url(&sock)).await.unwrap();
    let r = anon
        .create_queue(Q, mq_client::QueueOptions::default())
        .await;
    assert!(matches!(r, Err(Error::PermissionDenied(_))), "{r:?}");
    assert_wrong_password_refused(&sock, "admin").await;
    let admin = Client::builder(socket_url(&sock))
        .user("admin", "admin-pw")
        .connect()
        .await
        .unwrap();
    admin
        .create_queue(Q, mq_client::QueueOptions::default())
        .await
        .unwrap();
    let q = admin.queue(Q).unwrap();
    q.send(Message::new("x")).await.unwrap();
    assert_eq!(q.receive(WAIT).await.unwrap().unwrap().sender, "admin");
}

/// A client on the socket with `user` and a wrong password is refused with UNAUTHENTICATED.
async fn assert_wrong_password_refused(sock: &std::path::Path, user: &str) {
    let wrong = Client::builder(socket_url(sock))
        .user(user, "wrong")
        .connect()
        .await
        .unwrap();
    let r = wrong.list_queues().await;
    assert!(matches!(r, Err(Error::Unauthenticated(_))), "{r:?}");
}

/// The account this test runs as (`id -un`).
fn os_account() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unix_socket_os_users_a_local_caller_is_its_account() {
    let dir = temp_data_dir("mq-unix-os-");
    let me = os_account();
    // The account may create queues; a queue's creator has every right on it.
    let users = mq_tests::users_file(
        &dir.path().join("users.toml"),
        &[(me.as_str(), "pw", &[], &["create-queue"])],
    );
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let users_arg = users.to_str().unwrap().to_string();
    let mqd = MqdProcess::launch(
        &dir.path().join("data"),
        &[
            "--users",
            &users_arg,
            "--unix-socket",
            &sock_arg,
            "--unix-socket-os-users",
        ],
    );
    // No credentials on the socket: the account, with its rights.
    let local = Client::connect(socket_url(&sock)).await.unwrap();
    local
        .create_queue(Q, mq_client::QueueOptions::default())
        .await
        .unwrap();
    let q = local.queue(Q).unwrap();
    q.send(Message::new("from my account")).await.unwrap();
    let m = q.receive(WAIT).await.unwrap().unwrap();
    assert_eq!(
        (m.sender.as_str(), &m.body[..]),
        (me.as_str(), &b"from my account"[..])
    );
    // The same broker over TCP without credentials: anonymous, no rights.
    let tcp = Client::connect(mqd.url()).await.unwrap();
    let r = tcp.queue(Q).unwrap().send(Message::new("x")).await;
    assert!(matches!(r, Err(Error::PermissionDenied(_))), "{r:?}");
    // Credentials on the socket still decide: a wrong password is refused.
    assert_wrong_password_refused(&sock, &me).await;

    // The option needs --unix-socket.
    let out = run_with_timeout(
        mqd_command(&dir.path().join("other"), &["--unix-socket-os-users"]),
        None,
        WAIT * 3,
    )
    .expect("mqd exits");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--unix-socket"), "{err}");
}

#[tokio::test]
async fn a_unix_url_without_a_path_or_with_tls_settings_is_refused() {
    let e = Client::connect("unix:").await.unwrap_err();
    assert!(e.to_string().contains("needs the socket's path"), "{e}");
    let e = Client::builder("unix:/nonexistent/mqd.sock")
        .ca_pem(b"not used".to_vec())
        .connect()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not use TLS"), "{e}");
    let e = Client::connect("unix:/nonexistent/mqd.sock")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/mqd.sock"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_on_the_socket_count_toward_max_connections() {
    let dir = temp_data_dir("mq-unix-max-");
    let sock = dir.path().join("mqd.sock");
    let sock_arg = sock.to_str().unwrap().to_string();
    let mqd = MqdProcess::launch(
        &dir.path().join("data"),
        &["--max-connections", "1", "--unix-socket", &sock_arg],
    );
    let works = |url: String| async move {
        match Client::connect(&url).await {
            Ok(c) => c.list_queues().await.is_ok(),
            Err(_) => false,
        }
    };
    let local = Client::connect(socket_url(&sock)).await.unwrap();
    local.list_queues().await.unwrap();
    assert!(
        !works(mqd.url().to_string()).await,
        "a TCP connection beside the socket's one is past --max-connections 1"
    );
    assert!(
        !works(socket_url(&sock)).await,
        "so is a second one on the socket"
    );
    drop(local);
    let url = mqd.url().to_string();
    assert!(
        mq_tests::eventually(WAIT, || works(url.clone())).await,
        "the socket's connection gives its place back when it closes"
    );
}
