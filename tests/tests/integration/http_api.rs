//! The HTTP admin API (`/api/v1/` on `mqd --http-listen`) with a real HTTP client against real
//! `mqd` processes: every endpoint, every refusal (JSON errors with the CLI's line and a fitting
//! status), and rights over HTTPS with a users file.

use std::time::Duration;

use mq_tests::http::{enc, mqd_with_http, Http};
use mq_tests::{free_port, mq, temp_data_dir, users_file, wait_until, TestPki};
use serde_json::Value;

const Q: &str = r".\private$\api";
const WAIT: Duration = Duration::from_secs(30);
/// Every right, queue and broker-wide, but `monitor` and `forward`.
const ROOT_RIGHTS: &[&str] = &[
    "send",
    "receive",
    "peek",
    "admin",
    "create-queue",
    "outgoing",
    "dead-letter",
];

fn send(url: &str, queue: &str, body: &[u8], extra: &[&str]) -> String {
    let mut args = vec!["send", queue];
    args.extend_from_slice(extra);
    let out = mq(url, &args, Some(body));
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The entry of queue `name` in a `GET /api/v1/queues` answer (panics if it is not listed).
fn listed(list: &Value, name: &str) -> Value {
    list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .expect("listed")
        .clone()
}

fn qpath(q: &str) -> String {
    format!("/api/v1/queues/{}", enc(q))
}

/// A queue's totals in its JSON: sent, received, purged, dead-lettered, receive aborts.
#[track_caller]
fn totals(q: &Value) -> [u64; 5] {
    [
        "sent",
        "received",
        "purged",
        "dead_lettered",
        "receive_aborts",
    ]
    .map(|k| q[k].as_u64().unwrap_or_else(|| panic!("no {k} in {q}")))
}

/// The totals line of a queue's console page: the same five numbers.
#[track_caller]
fn page_totals(page: &str) -> [u64; 5] {
    [
        "sent",
        "received",
        "purged",
        "dead_lettered",
        "receive_aborts",
    ]
    .map(|k| {
        let start = format!("data-total=\"{k}\">");
        let at = page
            .find(&start)
            .unwrap_or_else(|| panic!("no {k} total on the page: {page}"))
            + start.len();
        let end = page[at..].find('<').expect("a closing tag") + at;
        page[at..end].parse().expect("a number")
    })
}

/// An error answer: its status, `code` and the one line.
#[track_caller]
fn refused(r: (u16, Value), status: u16, code: &str, line_has: &str) {
    let (s, v) = r;
    assert_eq!(s, status, "{v}");
    assert_eq!(v["code"], code, "{v}");
    let line = v["error"].as_str().expect("an error line");
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains(line_has),
        "{line:?} should contain {line_has:?}"
    );
}

#[test]
fn every_endpoint_and_refusal_without_a_users_file() {
    let dir = temp_data_dir("mq-api-");
    let (mqd, http) = mqd_with_http(dir.path(), &[]);
    let url = mqd.url().to_string();
    let api = Http::new(&format!("http://{http}"));

    // Overview.
    let (s, b) = api.get("/api/v1/broker");
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        b["uptime_ms"].as_u64().is_some() && b["name"].is_string(),
        "{b}"
    );
    assert!(b["journal"]["segments"].as_u64().unwrap() >= 1, "{b}");
    assert_eq!(b["journal"]["poisoned"], false);
    assert!(b["journal"]["disk_bytes"].as_u64().unwrap() > 0);

    // Create, list, info.
    let (s, q) = api.post(
        "/api/v1/queues",
        Some(&format!(
            r#"{{"name": {}, "quota_bytes": 1000000, "label": "api test"}}"#,
            serde_json::to_string(Q).unwrap()
        )),
    );
    assert_eq!(s, 201, "{q}");
    assert_eq!(q["name"], Q);
    refused(
        api.post(
            "/api/v1/queues",
            Some(&format!(
                r#"{{"name": {}}}"#,
                serde_json::to_string(Q).unwrap()
            )),
        ),
        409,
        "already_exists",
        "already exists",
    );
    // The same line the CLI prints for the same refusal.
    let cli = mq(&url, &["queue", "create", Q], None);
    let cli_line = String::from_utf8_lossy(&cli.stderr).to_string();
    let (_, v) = api.post(
        "/api/v1/queues",
        Some(&format!(
            r#"{{"name": {}}}"#,
            serde_json::to_string(Q).unwrap()
        )),
    );
    assert!(
        cli_line.contains(v["error"].as_str().unwrap()),
        "CLI {cli_line:?} vs API {v}"
    );

    send(
        &url,
        Q,
        br#"{"order":1,"items":[1,2]}"#,
        &["--label", "json one"],
    );
    send(
        &url,
        Q,
        b"<order><id>2</id></order>",
        &["--label", "xml two"],
    );
    send(
        &url,
        Q,
        &[0u8, 1, 2, 0xfe, 0xff],
        &["--label", "binary three"],
    );
    let (s, l) = api.get("/api/v1/queues");
    assert_eq!(s, 200);
    let mine = listed(&l, Q);
    assert_eq!(mine["messages"], 3, "{mine}");
    assert_eq!(mine["kind"], "queue");
    assert_eq!(mine["quota_bytes"], 1000000);
    assert!(mine["quota_used"].as_f64().unwrap() > 0.0);
    assert!(l["queues"]
        .as_array()
        .unwrap()
        .iter()
        .any(|q| q["kind"] == "dead-letter"));
    let (s, i) = api.get(&qpath(Q));
    assert_eq!((s, i["messages"].as_u64()), (200, Some(3)), "{i}");
    let (s, r) = api.get("/api/v1/rates");
    assert_eq!(s, 200, "{r}");
    assert!(r["queues"].is_object());

    // Pages: 2 then 1, without removing.
    let (s, p1) = api.get(&format!("{}/messages?limit=2", qpath(Q)));
    assert_eq!(s, 200, "{p1}");
    let m1 = p1["messages"].as_array().unwrap().clone();
    assert_eq!(m1.len(), 2);
    assert_eq!(m1[0]["label"], "json one");
    let next = p1["next"].as_str().expect("a next cursor").to_string();
    let (_, p2) = api.get(&format!("{}/messages?limit=2&after={next}", qpath(Q)));
    let m2 = p2["messages"].as_array().unwrap().clone();
    assert_eq!(m2.len(), 1, "{p2}");
    assert_eq!(m2[0]["label"], "binary three");
    assert!(p2["next"].is_null());
    assert_eq!(
        api.get(&qpath(Q)).1["messages"],
        3,
        "browsing removed nothing"
    );

    // One message: the preview's formatter, by id and by position.
    let id = |m: &Value| m["id"].as_str().unwrap().to_string();
    let (s, j) = api.get(&format!("{}/messages/{}", qpath(Q), id(&m1[0])));
    assert_eq!(s, 200, "{j}");
    assert_eq!(j["preview"]["formatter"], "json");
    assert!(
        j["preview"]["text"]
            .as_str()
            .unwrap()
            .contains("\n  \"order\": 1"),
        "{j}"
    );
    let (_, x) = api.get(&format!(
        "{}/messages/{}?at={}",
        qpath(Q),
        id(&m1[1]),
        m1[1]["at"].as_str().unwrap()
    ));
    assert_eq!(x["preview"]["formatter"], "xml", "{x}");
    let (_, h) = api.get(&format!("{}/messages/{}", qpath(Q), id(&m2[0])));
    assert_eq!(h["preview"]["formatter"], "hex", "{h}");
    assert!(h["preview"]["text"]
        .as_str()
        .unwrap()
        .starts_with("00000000  00 01 02 fe ff"));

    // Receive one by id; move one to a subqueue; the rest is purged.
    let (s, r) = api.post(
        &format!("{}/messages/{}/receive", qpath(Q), id(&m1[0])),
        None,
    );
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["received"]["label"], "json one");
    assert_eq!(r["received"]["preview"]["formatter"], "json");
    refused(
        api.post(
            &format!("{}/messages/{}/receive", qpath(Q), id(&m1[0])),
            None,
        ),
        404,
        "not_found",
        "MQ_ERROR_MESSAGE_NOT_FOUND",
    );
    let (s, m) = api.post(
        &format!("{}/messages/{}/move", qpath(Q), id(&m1[1])),
        Some(r#"{"destination": "retry"}"#),
    );
    assert_eq!(s, 200, "{m}");
    // A move's answer carries no body, so no size (it said 0 bytes, helper-73).
    assert!(
        m["moved"]["id"].is_string() && m["moved"].get("body_bytes").is_none(),
        "{m}"
    );
    let sub = format!("{Q};retry");
    assert_eq!(api.get(&qpath(&sub)).1["messages"], 1);
    let (s, d) = api.json(
        "DELETE",
        &format!("{}/messages/{}", qpath(&sub), id(&m1[1])),
        None,
    );
    assert_eq!(s, 200, "{d}");
    assert_eq!(api.get(&qpath(&sub)).1["messages"], 0);
    let (s, p) = api.post(&format!("{}/purge", qpath(Q)), None);
    assert_eq!((s, p["purged"].as_u64()), (200, Some(1)), "{p}");
    assert_eq!(api.get(&qpath(Q)).1["messages"], 0);
    // The totals after that: 3 sent, 1 received, 1 purged (the move to a subqueue is neither);
    // the subqueue got 1 and gave it up by the delete. The list, the queue and its console
    // page agree.
    let (_, i) = api.get(&qpath(Q));
    assert_eq!(totals(&i), [3, 1, 1, 0, 0], "{i}");
    let (_, l) = api.get("/api/v1/queues");
    let listed = listed(&l, Q);
    assert_eq!(totals(&listed), [3, 1, 1, 0, 0], "{listed}");
    assert_eq!(totals(&api.get(&qpath(&sub)).1), [1, 1, 0, 0, 0]);
    let (s, page) = api.page(&format!("/queues/{}", enc(Q)));
    assert_eq!(s, 200, "{page}");
    assert_eq!(page_totals(&page), [3, 1, 1, 0, 0]);

    // Refusals: every input bounded and refused with one line.
    let page = |q: &str| api.get(&format!("{}/messages?{q}", qpath(Q)));
    refused(page("limit=0"), 400, "invalid_argument", "1 to 500");
    refused(page("limit=501"), 400, "invalid_argument", "limit 501");
    refused(page("limit=x"), 400, "invalid_argument", "limit");
    refused(
        page("after=nonsense"),
        400,
        "invalid_argument",
        "not a page cursor",
    );
    refused(page("bogus=1"), 400, "invalid_argument", "bogus");
    refused(
        api.get(&format!("{}/messages/not-a-uuid", qpath(Q))),
        400,
        "invalid_argument",
        "not a message id",
    );
    refused(
        api.get(&format!("{}/messages/{}", qpath(Q), id(&m2[0]))),
        404,
        "not_found",
        "no message with id",
    );
    refused(
        api.get(&qpath(r".\private$\nosuch")),
        404,
        "not_found",
        "does not exist; create it with `mq queue create",
    );
    let long = "x".repeat(2000);
    refused(
        api.get(&qpath(&long)),
        400,
        "invalid_argument",
        "the limit is 1024",
    );
    refused(
        api.post("/api/v1/queues", Some(&format!(r#"{{"name": "{long}"}}"#))),
        400,
        "invalid_argument",
        "the limit is 1024",
    );
    refused(
        api.post("/api/v1/queues", Some("{not json")),
        400,
        "invalid_argument",
        "not the JSON expected",
    );
    refused(
        api.post("/api/v1/queues", Some(r#"{"name": "a", "colour": 1}"#)),
        400,
        "invalid_argument",
        "colour",
    );
    let huge = format!(r#"{{"name": "a", "label": "{}"}}"#, "y".repeat(70 * 1024));
    refused(
        api.post("/api/v1/queues", Some(&huge)),
        413,
        "invalid_argument",
        "65536 bytes",
    );
    refused(
        api.post(
            &format!("{}/messages/{}/move", qpath(Q), id(&m2[0])),
            Some(r#"{"destination": " "}"#),
        ),
        400,
        "invalid_argument",
        "destination is empty",
    );
    refused(
        api.get("/api/v1/nothing-here"),
        404,
        "not_found",
        "no API endpoint GET /api/v1/nothing-here",
    );
    refused(
        api.post("/api/v1/outgoing/127.0.0.1:9/pause", None),
        404,
        "not_found",
        "no outgoing queue",
    );
    refused(
        api.json("DELETE", &qpath(r".\SYSTEM$;DEADLETTER"), None),
        409,
        "failed_precondition",
        "cannot be deleted",
    );
    // Another site's page may not make the browser change things.
    let (s, _, t) = api
        .raw(
            "POST",
            &format!("{}/purge", qpath(Q)),
            None,
            &[("origin", "http://evil.example")],
        )
        .unwrap();
    assert_eq!(s, 403, "{t}");
    assert!(t.contains("only pages of this console"), "{t}");

    // Delete.
    let (s, d) = api.json("DELETE", &qpath(Q), None);
    assert_eq!(s, 200, "{d}");
    refused(api.get(&qpath(Q)), 404, "not_found", "does not exist");
}

#[test]
fn dead_letters_replay_and_outgoing_pause() {
    let dir = temp_data_dir("mq-api-dl-");
    let (mqd, http) = mqd_with_http(dir.path(), &[]);
    let url = mqd.url().to_string();
    let api = Http::new(&format!("http://{http}"));
    assert!(mq(&url, &["queue", "create", Q], None).status.success());
    // Two messages expire unreceived: ReceiveTimeout.
    send(
        &url,
        Q,
        b"late one",
        &["--ttbr", "1ms", "--label", "late 1"],
    );
    send(
        &url,
        Q,
        b"late two",
        &["--ttbr", "1ms", "--label", "late 2"],
    );
    let mut dl = Value::Null;
    assert!(
        wait_until(WAIT, || {
            dl = api.get("/api/v1/deadletter").1;
            dl["queues"][0]["messages"] == 2
        }),
        "{dl}"
    );
    let dlq = dl["queues"][0]["name"].as_str().unwrap().to_string();
    let msgs = dl["queues"][0]["messages_page"].as_array().unwrap().clone();
    assert_eq!(msgs[0]["dead_letter"]["class"], "ReceiveTimeout", "{dl}");
    assert!(
        msgs[0]["dead_letter"]["reason"].as_str().unwrap().len() > 5,
        "{dl}"
    );
    assert!(
        msgs[0]["dead_letter"]["destination"]
            .as_str()
            .unwrap()
            .contains(r"private$\api"),
        "{dl}"
    );
    // The same through the queue's pages and one message.
    let (_, one) = api.get(&format!(
        "{}/messages/{}",
        qpath(&dlq),
        msgs[0]["id"].as_str().unwrap()
    ));
    assert_eq!(one["dead_letter"]["class"], "ReceiveTimeout", "{one}");
    // Replay one to where it was going, delete the other.
    let (s, r) = api.post(
        &format!(
            "{}/messages/{}/replay",
            qpath(&dlq),
            msgs[0]["id"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(s, 200, "{r}");
    assert_eq!(api.get(&qpath(Q)).1["messages"], 1);
    let (s, d) = api.json(
        "DELETE",
        &format!(
            "{}/messages/{}",
            qpath(&dlq),
            msgs[1]["id"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(s, 200, "{d}");
    assert_eq!(api.get(&qpath(&dlq)).1["messages"], 0);
    // Totals: both were dead-lettered from the queue, one came back by the replay; the
    // dead-letter queue got 2 and gave both up (replay, delete).
    let (_, i) = api.get(&qpath(Q));
    assert_eq!(totals(&i), [3, 0, 0, 2, 0], "{i}");
    assert_eq!(totals(&api.get(&qpath(&dlq)).1), [2, 2, 0, 0, 0]);
    assert_eq!(
        page_totals(&api.page(&format!("/queues/{}", enc(Q))).1),
        [3, 0, 0, 2, 0]
    );

    // Receive aborts: a transactional queue whose message's receive is aborted twice.
    let tq = r".\private$\api-tx";
    assert!(mq(&url, &["queue", "create", tq, "--transactional"], None)
        .status
        .success());
    send(&url, tq, b"t", &["--tx"]);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = mq_client::Client::connect(&url).await.unwrap();
        for _ in 0..2 {
            let mut tx = client.begin().await.unwrap();
            tx.receive(tq, WAIT).await.unwrap().expect("the message");
            tx.abort().await.unwrap();
        }
    });
    assert_eq!(totals(&api.get(&qpath(tq)).1), [1, 0, 0, 0, 2]);
    assert_eq!(
        page_totals(&api.page(&format!("/queues/{}", enc(tq))).1),
        [1, 0, 0, 0, 2]
    );

    // An outgoing queue to a broker that is not there: WAITING with its last error.
    let port = free_port();
    let remote = format!(r"DIRECT=TCP:127.0.0.1:{port}\private$\far");
    send(&url, &remote, b"to a broker that is down", &[]);
    let dest = format!("127.0.0.1:{port}");
    let mut o = Value::Null;
    assert!(
        wait_until(WAIT, || {
            o = api.get("/api/v1/outgoing").1;
            o["outgoing"][0]["last_error"]
                .as_str()
                .is_some_and(|e| !e.is_empty())
        }),
        "{o}"
    );
    let q = &o["outgoing"][0];
    assert_eq!(q["destination"], dest.as_str());
    assert_eq!(q["messages"], 1);
    assert!(q["last_error_age_ms"].as_u64().is_some(), "{q}");
    let (s, p) = api.post(&format!("/api/v1/outgoing/{}/pause", enc(&dest)), None);
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        api.get("/api/v1/outgoing").1["outgoing"][0]["state"],
        "ONHOLD"
    );
    let cli = mq(&url, &["outgoing", "list"], None);
    assert!(
        String::from_utf8_lossy(&cli.stdout).contains("ONHOLD"),
        "{cli:?}"
    );
    let (s, _) = api.post(&format!("/api/v1/outgoing/{}/resume", enc(&dest)), None);
    assert_eq!(s, 200);
    assert_ne!(
        api.get("/api/v1/outgoing").1["outgoing"][0]["state"],
        "ONHOLD"
    );
    // The outgoing queue's totals: one that cannot reach its queue in time is dead-lettered.
    send(&url, &remote, b"too late", &["--ttrq", "1ms"]);
    assert!(
        wait_until(WAIT, || {
            o = api.get("/api/v1/outgoing").1;
            o["outgoing"][0]["dead_lettered"] == 1
        }),
        "{o}"
    );
    assert_eq!(o["outgoing"][0]["forwarded"], 0, "{o}");

    // Forwarded: to a broker that is there.
    let far_dir = temp_data_dir("mq-api-far-");
    let far = mq_tests::MqdProcess::launch(far_dir.path(), &[]);
    assert!(mq(far.url(), &["queue", "create", r".\private$\far"], None)
        .status
        .success());
    let there = format!(r"DIRECT=TCP:{}\private$\far", far.addr());
    send(&url, &there, b"one", &["--recoverable"]);
    send(&url, &there, b"two", &["--recoverable"]);
    let far_dest = far.addr().to_string();
    assert!(
        wait_until(WAIT, || {
            o = api.get("/api/v1/outgoing").1;
            o["outgoing"]
                .as_array()
                .unwrap()
                .iter()
                .any(|q| q["destination"] == far_dest.as_str() && q["forwarded"] == 2)
        }),
        "{o}"
    );
    let q = o["outgoing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["destination"] == far_dest.as_str())
        .unwrap();
    assert_eq!(q["dead_lettered"], 0, "{o}");
    let page = api.page("/outgoing").1;
    assert!(page.contains(&far_dest), "{page}");
}

/// With a users file and mqd's certificate: the HTTP port is HTTPS, the API uses the users'
/// identities and rights (403 for a reader's actions, 401 for bad credentials), and the
/// console shows a reader no buttons that would fail.
#[test]
fn rights_over_https_with_a_users_file() {
    let pki = TestPki::new("api CA");
    let (cert, key) = pki.issue("mqd");
    let users = users_file(
        &pki.path("users.toml"),
        &[
            ("root", "root-pw", &[], ROOT_RIGHTS),
            ("reader", "reader-pw", &[], &["peek"]),
        ],
    );
    let dir = temp_data_dir("mq-api-tls-");
    let (_mqd, http) = mqd_with_http(
        dir.path(),
        &[
            "--users",
            users.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    // Plain HTTP gets no answer from the HTTPS port.
    assert!(Http::new(&format!("http://{http}"))
        .raw("GET", "/api/v1/broker", None, &[])
        .is_err());
    let https = Http::tls(&format!("https://{http}"), &pki.ca_pem());
    let root = https.as_user("root", "root-pw");
    let reader = https.as_user("reader", "reader-pw");
    let (s, q) = root.post(
        "/api/v1/queues",
        Some(&format!(
            r#"{{"name": {}}}"#,
            serde_json::to_string(Q).unwrap()
        )),
    );
    assert_eq!(s, 201, "{q}");
    // Anonymous sees nothing and may do nothing; the console asks for a login.
    let (s, l) = https.get("/api/v1/queues");
    assert_eq!(s, 200);
    assert_eq!(l["queues"].as_array().unwrap().len(), 0, "{l}");
    refused(
        https.post(&format!("{}/purge", qpath(Q)), None),
        403,
        "permission_denied",
        "identity \"anonymous\" lacks",
    );
    let (s, h, _) = https.raw("GET", "/", None, &[]).unwrap();
    assert_eq!(s, 401);
    assert!(h.get("www-authenticate").is_some());
    // A console form posted without credentials asks for them too (not 403 for a right).
    let (s, h, _) = https
        .raw(
            "POST",
            &format!("/queues/{}/purge", enc(Q)),
            None,
            &[("content-type", "application/x-www-form-urlencoded")],
        )
        .unwrap();
    assert_eq!(s, 401);
    assert!(h.get("www-authenticate").is_some());
    refused(
        https.as_user("reader", "wrong").get("/api/v1/queues"),
        401,
        "unauthenticated",
        "password is wrong",
    );
    // The reader browses but may not act.
    let (s, p) = reader.get(&format!("{}/messages", qpath(Q)));
    assert_eq!(s, 200, "{p}");
    refused(
        reader.post(&format!("{}/purge", qpath(Q)), None),
        403,
        "permission_denied",
        "lacks the right \"admin\"",
    );
    refused(
        reader.json("DELETE", &qpath(Q), None),
        403,
        "permission_denied",
        "lacks the right \"admin\"",
    );
    refused(
        reader.post("/api/v1/queues", Some(r#"{"name": ".\\private$\\r"}"#)),
        403,
        "permission_denied",
        "create-queue",
    );
    refused(
        reader.get("/api/v1/outgoing"),
        403,
        "permission_denied",
        "outgoing",
    );
    let (s, page) = reader.page(&format!("/queues/{}", enc(Q)));
    assert_eq!(s, 200, "{page}");
    assert!(
        !page.contains("/purge"),
        "a reader sees no purge button: {page}"
    );
    let (_, page) = reader.page("/queues");
    assert!(
        !page.contains("Create a queue") && !page.contains("/delete"),
        "{page}"
    );
    // Every action without its right: 403 with the right named, for the reader and for
    // anonymous (who may not even look).
    let msg = format!("{}/messages/0190a5c4-0000-7000-8000-000000000000", qpath(Q));
    for (method, path, body, right) in [
        ("POST", format!("{msg}/receive"), None, "receive"),
        ("DELETE", msg.clone(), None, "receive"),
        (
            "POST",
            format!("{msg}/move"),
            Some(r#"{"destination": "x"}"#),
            "receive",
        ),
        ("POST", format!("{msg}/replay"), None, "receive"),
        (
            "POST",
            "/api/v1/outgoing/127.0.0.1:9/pause".into(),
            None,
            "outgoing",
        ),
        (
            "POST",
            "/api/v1/outgoing/127.0.0.1:9/resume".into(),
            None,
            "outgoing",
        ),
    ] {
        refused(
            reader.json(method, &path, body),
            403,
            "permission_denied",
            &format!("right \"{right}\""),
        );
    }
    for path in [
        qpath(Q),
        format!("{}/messages", qpath(Q)),
        msg.clone(),
        "/api/v1/deadletter".into(),
    ] {
        refused(
            https.get(&path),
            403,
            "permission_denied",
            "identity \"anonymous\" lacks the right",
        );
    }
    let (_, page) = root.page(&format!("/queues/{}", enc(Q)));
    assert!(page.contains("/purge"), "{page}");
    let (s, p) = root.post(&format!("{}/purge", qpath(Q)), None);
    assert_eq!(s, 200, "{p}");
}

/// Every route's refusals, route by route (no users file): an unknown queue, a malformed id,
/// cursor or query, a page over 500, a body over 64 KiB, a method the route does not take, and
/// a POST or DELETE from another origin (API and console alike). Each answer is JSON with the
/// one line and the queue is untouched by all of them.
#[test]
fn every_route_refuses_bad_input() {
    let dir = temp_data_dir("mq-api-refusals-");
    let (mqd, http) = mqd_with_http(dir.path(), &[]);
    let url = mqd.url().to_string();
    let api = Http::new(&format!("http://{http}"));
    assert!(mq(&url, &["queue", "create", Q], None).status.success());
    send(&url, Q, b"stays", &["--label", "stays"]);
    let (_, p) = api.get(&format!("{}/messages", qpath(Q)));
    let id = p["messages"][0]["id"].as_str().expect("an id").to_string();
    let q = qpath(Q);
    let msg = format!("{q}/messages/{id}");
    let dlq = qpath(r".\SYSTEM$;DEADLETTER");

    // A queue that does not exist, on every route that names one.
    let nosuch = qpath(r".\private$\nosuch");
    let other = format!("{nosuch}/messages/{id}");
    for (method, path, body) in [
        ("GET", nosuch.clone(), None),
        ("DELETE", nosuch.clone(), None),
        ("POST", format!("{nosuch}/purge"), None),
        ("GET", format!("{nosuch}/messages"), None),
        ("GET", other.clone(), None),
        ("DELETE", other.clone(), None),
        ("POST", format!("{other}/receive"), None),
        (
            "POST",
            format!("{other}/move"),
            Some(r#"{"destination": "x"}"#),
        ),
        ("POST", format!("{other}/replay"), None),
    ] {
        refused(
            api.json(method, &path, body),
            404,
            "not_found",
            "does not exist",
        );
    }

    // A malformed message id, on every route that takes one.
    let bad = format!("{q}/messages/not-a-uuid");
    for (method, path, body) in [
        ("GET", bad.clone(), None),
        ("DELETE", bad.clone(), None),
        ("POST", format!("{bad}/receive"), None),
        (
            "POST",
            format!("{bad}/move"),
            Some(r#"{"destination": "x"}"#),
        ),
        ("POST", format!("{bad}/replay"), None),
    ] {
        refused(
            api.json(method, &path, body),
            400,
            "invalid_argument",
            "not a message id",
        );
    }

    // Cursors, limits and unknown parameters on both paged routes and on `?at=`.
    for pages in [format!("{q}/messages"), "/api/v1/deadletter".to_string()] {
        let get = |query: &str| api.get(&format!("{pages}?{query}"));
        refused(
            get("after=7-x"),
            400,
            "invalid_argument",
            "not a page cursor",
        );
        refused(
            get("after=9-1"),
            400,
            "invalid_argument",
            "not a page cursor",
        );
        refused(get("limit=501"), 400, "invalid_argument", "1 to 500");
        refused(get("limit=0"), 400, "invalid_argument", "1 to 500");
        refused(get("limit=-1"), 400, "invalid_argument", "limit");
        refused(get("colour=red"), 400, "invalid_argument", "colour");
    }
    refused(
        api.get(&format!("{msg}?at=nonsense")),
        400,
        "invalid_argument",
        "not a page cursor",
    );
    refused(
        api.get(&format!("{msg}?colour=red")),
        400,
        "invalid_argument",
        "colour",
    );

    // Bodies: over the limit, not JSON, not the fields expected.
    let huge = format!(r#"{{"destination": "{}"}}"#, "y".repeat(70 * 1024));
    // On a client of its own: the server closes the connection after refusing a body it did
    // not read, and a pooled connection closed that way fails the next POST ("Peer
    // disconnected", seen about once in eight runs).
    refused(
        Http::new(&format!("http://{http}")).post(&format!("{msg}/move"), Some(&huge)),
        413,
        "invalid_argument",
        "65536 bytes",
    );
    refused(
        api.post(&format!("{msg}/move"), Some("[1, 2")),
        400,
        "invalid_argument",
        "not the JSON expected",
    );
    refused(
        api.post(&format!("{msg}/move"), Some(r#"{"to": "x"}"#)),
        400,
        "invalid_argument",
        "not the JSON expected",
    );
    let long = "d".repeat(2000);
    refused(
        api.post(&format!("/api/v1/outgoing/{long}/resume"), None),
        400,
        "invalid_argument",
        "the limit is 1024",
    );

    // A method the route does not take: 405, JSON, and the methods it does take.
    for (method, path) in [
        ("POST", "/api/v1/broker".to_string()),
        ("DELETE", "/api/v1/queues".to_string()),
        ("POST", "/api/v1/rates".to_string()),
        ("PUT", q.clone()),
        ("GET", format!("{q}/purge")),
        ("POST", format!("{q}/messages")),
        ("PUT", msg.clone()),
        ("GET", format!("{msg}/receive")),
        ("GET", format!("{msg}/move")),
        ("DELETE", format!("{msg}/replay")),
        ("POST", "/api/v1/deadletter".to_string()),
        ("DELETE", "/api/v1/outgoing".to_string()),
        ("GET", "/api/v1/outgoing/127.0.0.1:9/pause".to_string()),
        ("GET", "/api/v1/outgoing/127.0.0.1:9/resume".to_string()),
    ] {
        let (s, h, t) = api.raw(method, &path, None, &[]).unwrap();
        let v: Value = serde_json::from_str(&t)
            .unwrap_or_else(|e| panic!("{method} {path}: {s} is not JSON ({e}): {t:?}"));
        refused((s, v), 405, "unimplemented", &format!("takes no {method}"));
        assert!(h.get("allow").is_some(), "{method} {path}: {h:?}");
    }

    // Another site's page may change nothing, through the API or the console.
    let console_msg = format!("/queues/{}/messages/{id}", enc(Q));
    for (method, path, body) in [
        (
            "POST",
            "/api/v1/queues".to_string(),
            Some(r#"{"name": "x"}"#),
        ),
        ("DELETE", q.clone(), None),
        ("POST", format!("{q}/purge"), None),
        ("DELETE", msg.clone(), None),
        ("POST", format!("{msg}/receive"), None),
        (
            "POST",
            format!("{msg}/move"),
            Some(r#"{"destination": "x"}"#),
        ),
        ("POST", format!("{msg}/replay"), None),
        ("POST", format!("{dlq}/purge"), None),
        (
            "POST",
            "/api/v1/outgoing/127.0.0.1:9/pause".to_string(),
            None,
        ),
        (
            "POST",
            "/api/v1/outgoing/127.0.0.1:9/resume".to_string(),
            None,
        ),
        ("POST", "/queues".to_string(), Some("name=x")),
        ("POST", format!("/queues/{}/purge", enc(Q)), None),
        ("POST", format!("/queues/{}/delete", enc(Q)), None),
        ("POST", format!("{console_msg}/receive"), None),
        ("POST", format!("{console_msg}/move"), Some("destination=x")),
        ("POST", "/outgoing/127.0.0.1%3A9/pause".to_string(), None),
    ] {
        for header in [
            ("origin", "http://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ] {
            let (s, _, t) = api.raw(method, &path, body, &[header]).unwrap();
            let v: Value = serde_json::from_str(&t)
                .unwrap_or_else(|e| panic!("{method} {path}: {s} is not JSON ({e}): {t:?}"));
            refused((s, v), 403, "permission_denied", "refusing a");
        }
    }
    let (_, i) = api.get(&q);
    assert_eq!(i["messages"], 1, "nothing refused changed the queue: {i}");
    assert_eq!(api.get(&msg).1["label"], "stays");
}

/// One raw HTTP/1.1 request with the `Host` header given: the status line and the headers.
fn raw_http(addr: &str, method: &str, path: &str, host: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// DNS rebinding: without a users file (everyone has every right) a loopback HTTP port answers
/// only requests whose `Host` names this machine, so a page of another site whose name points
/// at 127.0.0.1 cannot create, read or purge queues. (It used to create the queue: 201.) Every
/// answer forbids framing by other sites.
#[test]
fn a_request_for_another_sites_name_is_refused() {
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let port = http.rsplit_once(':').unwrap().1.to_string();
    let body = format!(r#"{{"name": {}}}"#, serde_json::to_string(Q).unwrap());
    let evil = format!("evil.example:{port}");
    let out = raw_http(&http, "POST", "/api/v1/queues", &evil, &body);
    assert!(out.starts_with("HTTP/1.1 421"), "{out}");
    assert!(out.contains("DNS rebinding"), "{out}");
    let out = raw_http(&http, "GET", "/api/v1/queues", &evil, "");
    assert!(out.starts_with("HTTP/1.1 421"), "{out}");
    // This machine's names pass, and nothing was created.
    let out = raw_http(
        &http,
        "GET",
        "/api/v1/queues",
        &format!("localhost:{port}"),
        "",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!out.contains("private$"), "{out}");
    let out = raw_http(&http, "POST", "/api/v1/queues", &http, &body);
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    let lower = out.to_ascii_lowercase();
    assert!(
        lower.contains("x-frame-options: deny")
            && lower.contains("content-security-policy: frame-ancestors 'none'")
            && lower.contains("x-content-type-options: nosniff"),
        "{out}"
    );
}

/// Slow and silent HTTP clients: past `--http-max-connections` a connection is closed as it is
/// accepted, and one that moves no byte for `--http-idle-timeout` is closed (half a request's
/// headers, or nothing at all, held a connection and its descriptor for ever). The port still
/// serves afterwards.
#[test]
fn stalled_http_connections_are_closed_and_counted() {
    use std::io::{Read, Write};
    // Opens `n` connections that stall: the first sends nothing, the others half a request.
    let stall = |http: &str, n: usize| -> Vec<std::net::TcpStream> {
        (0..n)
            .map(|i| {
                let mut s = std::net::TcpStream::connect(http).unwrap();
                if i > 0 {
                    write!(s, "GET /healthz HTTP/1.1\r\nHost: {http}\r\n").unwrap();
                }
                s
            })
            .collect()
    };
    // Whether the server closed `s` (EOF or reset) rather than answer or wait.
    let closed = |mut s: std::net::TcpStream| {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };

    // The limit: three stalled connections hold their places (the idle time is long), and a
    // fourth, accepted after them, is closed without an answer.
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(dir.path(), &["--http-max-connections", "3"]);
    let healthy =
        |http: &str| raw_http(http, "GET", "/healthz", http, "").starts_with("HTTP/1.1 200");
    // No request before the stalls (the port is bound before mqd's first line): the server
    // may still count a request's connection a moment after the client has read its end, and
    // then the third stall was refused and the fourth served (seen once under load).
    let held = stall(&http, 3);
    let mut fourth = std::net::TcpStream::connect(&http).unwrap();
    let _ = write!(fourth, "GET /healthz HTTP/1.1\r\nHost: {http}\r\n\r\n");
    assert!(closed(fourth), "a fourth connection was served");
    drop(held);
    assert!(
        wait_until(WAIT, || healthy(&http)),
        "no room after the three closed"
    );

    // The idle time: stalled connections are closed after it, not before.
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(dir.path(), &["--http-idle-timeout", "2s"]);
    assert!(healthy(&http));
    let begun = std::time::Instant::now();
    for s in stall(&http, 3) {
        assert!(closed(s), "a stalled connection was not closed");
    }
    let took = begun.elapsed();
    assert!(took >= Duration::from_secs(2), "closed after {took:?}");
    assert!(healthy(&http));
}

/// A GET creates nothing: with no users file everyone may read, and a GET is not checked for
/// the site it came from, so another site's page could make a browser open subqueues (64 a
/// queue, journaled, for good) by image links to their info or message pages (helper-63,
/// helper-64). Now those GETs answer 404 for a subqueue not opened yet, and the queue's 64
/// subqueues are still there for a move.
#[test]
fn a_get_opens_no_subqueue() {
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let body = format!(r#"{{"name": {}}}"#, serde_json::to_string(Q).unwrap());
    let out = raw_http(&http, "POST", "/api/v1/queues", &http, &body);
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    for i in 0..70 {
        let sub = qpath(&format!("{Q};look{i}"));
        for path in [sub.clone(), format!("{sub}/messages")] {
            let out = raw_http(&http, "GET", &path, &http, "");
            assert!(out.starts_with("HTTP/1.1 404"), "GET {path}: {out}");
        }
    }
    let out = raw_http(&http, "GET", "/api/v1/queues?limit=1000", &http, "");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!out.contains("look"), "a GET opened a subqueue: {out}");
}

/// A request must be whole within `--http-request-timeout` of its first byte: a client that
/// trickled a byte every few seconds restarted the idle time each time and held its connection
/// for good (helper-63: 64 such connections closed a 64-connection port to everyone). And the
/// port speaks HTTP/1.1 only: a connection that opens with HTTP/2's preface is closed (axum's
/// server answered HTTP/2, 200 streams a connection, with hyper's windows).
#[test]
fn trickled_requests_and_http2_are_closed() {
    use std::io::{Read, Write};
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(
        dir.path(),
        &["--http-request-timeout", "2s", "--http-idle-timeout", "60s"],
    );
    let healthy =
        |http: &str| raw_http(http, "GET", "/healthz", http, "").starts_with("HTTP/1.1 200");
    assert!(healthy(&http));
    // A byte every 200 ms: never idle, never whole. Closed after about 2 s (at most 30 s of
    // trickling here).
    let mut s = std::net::TcpStream::connect(&http).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: {http}\r\n").unwrap();
    let begun = std::time::Instant::now();
    let mut closed = false;
    for _ in 0..150 {
        if s.write_all(b"X").is_err() {
            closed = true;
            break;
        }
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => panic!("a request never finished was answered"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(_) => {} // the read timeout: still open
        }
    }
    let took = begun.elapsed();
    assert!(closed, "a trickling request was still open after {took:?}");
    assert!(took >= Duration::from_secs(2), "closed after {took:?}");
    assert!(healthy(&http));
    println!("trickle closed after {took:?}");
    // HTTP/2's preface (and a SETTINGS frame): closed, no HTTP/2 SETTINGS in answer.
    let mut s = std::net::TcpStream::connect(&http).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = Vec::new();
    let begun = std::time::Instant::now();
    let _ = s.read_to_end(&mut got);
    println!(
        "HTTP/2 attempt ended after {:?} with {} bytes",
        begun.elapsed(),
        got.len()
    );
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 4"),
        "HTTP/2 was answered: {got:?}"
    );
    assert!(healthy(&http));
}

/// HTTPS handshakes: one address holds at most 8 in progress; more from it are closed as they
/// are accepted, so a client's silent sockets cannot take all 64 places (70 of them held a
/// browser's handshake for 9.5 s). The ninth is closed while the eight still wait (they would
/// be closed first if it were only the 10 s handshake time).
#[test]
fn one_address_holds_at_most_eight_tls_handshakes() {
    use std::io::Read;
    let pki = TestPki::new("api CA");
    let (cert, key) = pki.issue("mqd");
    let dir = temp_data_dir("mq-api-tls-");
    let (_mqd, http) = mqd_with_http(
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let silent: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(&http).unwrap())
        .collect();
    let mut ninth = std::net::TcpStream::connect(&http).unwrap();
    ninth.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 16];
    let r = ninth.read(&mut b);
    assert!(
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the ninth: {r:?}"
    );
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let r = s.read(&mut b);
        assert!(
            r.as_ref().is_err_and(|e| matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )),
            "one of the eight was closed before the ninth: {r:?}"
        );
    }
}

/// A console form over the body limit is 413, as the API answers (it was 400 with axum's
/// "Failed to buffer the request body").
#[test]
fn a_console_form_over_the_limit_is_413() {
    use std::io::{Read, Write};
    let dir = temp_data_dir("mq-api-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let mut s = std::net::TcpStream::connect(&http).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let body = format!("name={}", "x".repeat(70_000));
    write!(
        s,
        "POST /queues HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
}

/// With a users file, `/metrics` names only what the caller may see, as the API lists it:
/// anonymous gets the broker-wide series and no queue or destination; a user the queues it
/// holds a right on; a user with broker-wide rights every queue, the dead-letter queues and
/// (with `outgoing`) the outgoing queues. Wrong credentials are 401.
#[test]
fn metrics_name_only_what_the_caller_may_see() {
    let pki = TestPki::new("metrics CA");
    let users = users_file(
        &pki.path("users.toml"),
        &[
            ("root", "root-pw", &[], ROOT_RIGHTS),
            ("alice", "alice-pw", &[], &["create-queue"]),
            ("prom", "prom-pw", &[], &["monitor"]),
        ],
    );
    let dir = temp_data_dir("mq-metrics-view-");
    let (mqd, http) = mqd_with_http(dir.path(), &["--users", users.to_str().unwrap()]);
    let api = Http::new(&format!("http://{http}"));
    let alice = api.as_user("alice", "alice-pw");
    let root = api.as_user("root", "root-pw");
    let (s, q) = alice.post("/api/v1/queues", Some(r#"{"name": ".\\private$\\alices"}"#));
    assert_eq!(s, 201, "{q}");
    // An outgoing queue: root sends to a broker that is not there.
    let dest_port = free_port();
    let mut cmd = std::process::Command::new(mq_tests::mq_path());
    cmd.args([
        "--user",
        "root",
        "send",
        &format!("DIRECT=TCP:127.0.0.1:{dest_port}\\private$\\far"),
    ])
    .env("MQ_BROKER", mqd.url())
    .env("MQ_PASSWORD", "root-pw");
    let out = mq_tests::run_with_timeout(cmd, Some(b"x"), mq_tests::CLI_TIMEOUT).unwrap();
    assert!(out.status.success(), "{out:?}");
    let outgoing = format!("mq_outgoing_messages{{destination=\"127.0.0.1:{dest_port}\"}} 1");
    let alices = r#"mq_queue_messages{queue=".\\private$\\alices"} 0"#;

    let (s, anonymous) = api.page("/metrics");
    assert_eq!(s, 200, "{anonymous}");
    assert!(anonymous.contains("mq_ready 1"), "{anonymous}");
    assert!(anonymous.contains("mq_connections "), "{anonymous}");
    for hidden in ["alices", "DEADLETTER", "destination=", "queue=\""] {
        assert!(
            !anonymous.contains(hidden),
            "anonymous sees {hidden}: {anonymous}"
        );
    }
    let (s, text) = alice.page("/metrics");
    assert_eq!(s, 200, "{text}");
    assert!(text.contains(alices), "{text}");
    for hidden in ["DEADLETTER", "destination="] {
        assert!(!text.contains(hidden), "alice sees {hidden}: {text}");
    }
    let (s, text) = root.page("/metrics");
    assert_eq!(s, 200, "{text}");
    assert!(text.contains(alices), "{text}");
    assert!(text.contains(&outgoing), "{text}");
    assert!(
        text.contains(r#"mq_queue_messages{queue=".\\SYSTEM$;DEADLETTER"}"#),
        "{text}"
    );
    // `monitor` sees all of it, lists queues and outgoing queues, and may not read or act.
    let prom = api.as_user("prom", "prom-pw");
    let (s, monitored) = prom.page("/metrics");
    assert_eq!(s, 200, "{monitored}");
    // The series with a queue or destination, without their values (and without the
    // outgoing queue's state, which may change between two scrapes).
    let series = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains("queue=") || l.contains("destination="))
            .filter(|l| !l.starts_with("mq_outgoing_state"))
            .map(|l| l.rsplit_once(' ').map_or(l, |(k, _)| k).to_string())
            .collect()
    };
    assert_eq!(
        series(&monitored),
        series(&text),
        "monitor sees what root sees"
    );
    let (s, l) = prom.get("/api/v1/queues");
    assert_eq!(s, 200, "{l}");
    listed(&l, r".\private$\alices");
    let (s, o) = prom.get("/api/v1/outgoing");
    assert_eq!(s, 200, "{o}");
    let (_, page) = prom.page("/outgoing");
    assert!(
        page.contains(&format!("127.0.0.1:{dest_port}")) && !page.contains("/pause"),
        "{page}"
    );
    refused(
        prom.get(&format!("{}/messages", qpath(r".\private$\alices"))),
        403,
        "permission_denied",
        "lacks the right \"peek\"",
    );
    refused(
        prom.post(
            &format!("/api/v1/outgoing/127.0.0.1:{dest_port}/pause"),
            None,
        ),
        403,
        "permission_denied",
        "outgoing",
    );
    let (s, _) = api.as_user("alice", "wrong").page("/metrics");
    assert_eq!(s, 401);
}

/// The queue list comes in pages (`?after=NEXT&limit=N`, default 1000, at most 10,000):
/// following `next` yields every queue once, in name order; the console's Queues page pages
/// the same way with a "Next page" link, and the overview shows the first 100.
#[test]
fn the_queue_list_comes_in_pages() {
    let dir = temp_data_dir("mq-api-pages-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let api = Http::new(&format!("http://{http}"));
    for i in 0..7 {
        let (s, q) = api.post(
            "/api/v1/queues",
            Some(&format!(r#"{{"name": ".\\private$\\page{i}"}}"#)),
        );
        assert_eq!(s, 201, "{q}");
    }
    let (s, all) = api.get("/api/v1/queues");
    assert_eq!(s, 200, "{all}");
    assert_eq!(all["next"], Value::Null, "{all}");
    let names = |l: &Value| -> Vec<String> {
        l["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["name"].as_str().unwrap().to_string())
            .collect()
    };
    let every = names(&all);
    assert_eq!(every.len(), 9, "7 and the two dead-letter queues: {all}");
    let mut paged = Vec::new();
    let mut path = "/api/v1/queues?limit=3".to_string();
    for _ in 0..10 {
        let (s, l) = api.get(&path);
        assert_eq!(s, 200, "{l}");
        assert!(l["queues"].as_array().unwrap().len() <= 3, "{l}");
        paged.extend(names(&l));
        let (s, r) = api.get(&path.replace("/queues", "/rates"));
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["next"], l["next"], "{r}");
        match l["next"].as_str() {
            Some(n) => path = format!("/api/v1/queues?limit=3&after={}", enc(n)),
            None => break,
        }
    }
    assert_eq!(paged, every);
    for (query, says) in [
        ("limit=0", "a page has 1 to 10000 queues"),
        ("limit=10001", "a page has 1 to 10000 queues"),
        (
            &format!("after={}", "x".repeat(1025))[..],
            "the limit is 1024",
        ),
        ("page=2", "unknown field"),
    ] {
        refused(
            api.get(&format!("/api/v1/queues?{query}")),
            400,
            "invalid_argument",
            says,
        );
    }
    // The console: pages of the Queues page, linked.
    let mut seen = 0;
    let mut path = "/queues?limit=4".to_string();
    for _ in 0..10 {
        let (s, page) = api.page(&path);
        assert_eq!(s, 200, "{page}");
        seen += page.matches("<tr data-name=").count();
        // The "Next page" link's target: `<a href="…" rel="next">`.
        let next = page
            .split_once("\" rel=\"next\"")
            .and_then(|(before, _)| before.rsplit_once("href=\""))
            .map(|(_, href)| href.replace("&amp;", "&"));
        match next {
            Some(next) => path = next,
            None => break,
        }
    }
    assert_eq!(seen, 9);
}

/// The console's Queues page shows at most 500 rows whatever `?limit=` asks (a page of 10,000
/// built 8.9 MB of HTML a request); the rest follow through its "Next page" link.
#[test]
fn the_consoles_queue_page_has_at_most_500_rows() {
    let dir = temp_data_dir("mq-api-page-cap-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let api = Http::new(&format!("http://{http}"));
    for i in 0..501 {
        let (s, q) = api.post(
            "/api/v1/queues",
            Some(&format!(r#"{{"name": ".\\private$\\cap{i:03}"}}"#)),
        );
        assert_eq!(s, 201, "{q}");
    }
    // 501 and the two dead-letter queues.
    let (s, page) = api.page("/queues?limit=10000");
    assert_eq!(s, 200, "{page}");
    assert_eq!(page.matches("<tr data-name=").count(), 500);
    let next = page
        .split_once("\" rel=\"next\"")
        .and_then(|(before, _)| before.rsplit_once("href=\""))
        .map(|(_, href)| href.replace("&amp;", "&"))
        .expect("a next page");
    assert!(next.contains("limit=500"), "{next}");
    let (s, rest) = api.page(&next);
    assert_eq!(s, 200, "{rest}");
    assert_eq!(rest.matches("<tr data-name=").count(), 3);
}

/// The console shows a notice only if it wrote it: an action's redirect carries the notice and
/// its signature, and the page shows it; a link with a notice of someone else's words (or a
/// wrong signature) shows nothing.
#[test]
fn the_console_shows_only_its_own_notices() {
    let dir = temp_data_dir("mq-api-notice-");
    let (_mqd, http) = mqd_with_http(dir.path(), &[]);
    let api = Http::new(&format!("http://{http}"));
    let (s, q) = api.post("/api/v1/queues", Some(r#"{"name": ".\\private$\\n"}"#));
    assert_eq!(s, 201, "{q}");
    let (s, h, _) = api
        .raw(
            "POST",
            &format!("/queues/{}/purge", enc(r".\private$\n")),
            None,
            &[("content-type", "application/x-www-form-urlencoded")],
        )
        .unwrap();
    assert_eq!(s, 303);
    let to = h["location"].to_str().unwrap().to_string();
    assert!(to.contains("msg=") && to.contains("&sig="), "{to}");
    let (s, page) = api.page(&to);
    assert_eq!(s, 200);
    assert!(
        page.contains(r#"<p class="notice" role="status">purged 0 messages"#),
        "{page}"
    );
    let forged = "Your+session+expired%3A+log+in+at+evil.example";
    for q in [
        format!("msg={forged}"),
        format!("msg={forged}&sig=00000000000000000000000000000000"),
        // A real signature of another text.
        format!("msg={forged}&{}", to.split_once('&').unwrap().1),
    ] {
        let (s, page) = api.page(&format!("/queues?{q}"));
        assert_eq!(s, 200);
        assert!(
            !page.contains("evil.example") && !page.contains(r#"class="notice""#),
            "{q}: {page}"
        );
    }
}
