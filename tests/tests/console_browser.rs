//! The web console in a real headless Chromium (Debian's `chromium` and `chromedriver`, driven
//! over WebDriver with `fantoccini`): one browser for the whole run. The overview shows a
//! queue's count after `mq send`; purging through the UI empties the queue; a dead-lettered
//! message shows its reason; pausing an outgoing queue shows ONHOLD and `mq outgoing list`
//! agrees. Every page is saved as a PNG under `target/console-screenshots/`.
//!
//! Without `chromium` or `chromedriver` on the machine the test says why and passes without
//! running (`.ci/run` installs them where it can).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt;
use mq_tests::http::{enc, mqd_with_http, Http};
use mq_tests::{free_port, mq, temp_data_dir, wait_until};

const Q: &str = r".\private$\orders";
const WAIT: Duration = Duration::from_secs(30);

/// The first of `names` found on `PATH` (or as an absolute path).
fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for n in names {
        let p = Path::new(n);
        if p.is_absolute() && p.exists() {
            return Some(p.to_path_buf());
        }
        for dir in std::env::split_paths(&path) {
            let c = dir.join(n);
            if c.is_file() {
                return Some(c);
            }
        }
    }
    None
}

/// `chromedriver` on a free port, stopped by its PID when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver(chromedriver: &Path) -> Driver {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let d = Driver { child, port };
    assert!(
        wait_until(WAIT, || TcpStream::connect(("127.0.0.1", port)).is_ok()),
        "chromedriver did not listen on port {port}"
    );
    d
}

async fn browser(driver: &Driver, chromium: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,800", "--hide-scrollbars", "--force-device-scale-factor=1"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session with chromium")
}

fn shots_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
    std::fs::create_dir_all(&d).expect("create target/console-screenshots");
    d
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(shots_dir().join(format!("{name}.png")), png).expect("write screenshot");
}

/// The text of the first element `css` selects, once `ok` holds for it (bounded wait).
async fn text_when(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            if let Ok(t) = e.text().await {
                if ok(&t) {
                    return t;
                }
                last = t;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{css}: the text {last:?} never became what was expected");
}

/// Clicks the button `css`, accepts the confirmation, waits for the next page.
async fn click_confirmed(c: &Client, css: &str) {
    let before = c.current_url().await.expect("url");
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .expect("click");
    let deadline = Instant::now() + WAIT;
    while c.accept_alert().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "{css}: clicking it asked for no confirmation (the form was not submitted; still on {before})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let now = c.current_url().await.expect("url");
        if now != before && now.as_str().contains("msg=") {
            break;
        }
        if Instant::now() >= deadline {
            let page = match c.find(Locator::Css("main")).await {
                Ok(m) => m.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            panic!(
                "{css}: the action did not come back to a console page with its notice; the browser is on {now}, showing: {:?}",
                page.chars().take(300).collect::<String>()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn send(url: &str, queue: &str, body: &[u8], extra: &[&str]) {
    let mut args = vec!["send", queue];
    args.extend_from_slice(extra);
    let out = mq(url, &args, Some(body));
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_headless_chromium() {
    let (Some(chromium), Some(chromedriver)) = (
        find_program(&["chromium", "chromium-browser", "google-chrome"]),
        find_program(&["chromedriver", "/usr/lib/chromium/chromedriver"]),
    ) else {
        eprintln!(
            "SKIPPED console_in_headless_chromium: chromium and chromedriver are not both installed (Debian: apt-get install chromium chromium-driver; .ci/run does this as root)"
        );
        return;
    };
    let driver = start_driver(&chromedriver);
    let c = browser(&driver, &chromium).await;
    // Whatever happens, the browser session ends (chromium exits) before the test does.
    let r = std::panic::AssertUnwindSafe(scenarios(&c))
        .catch_unwind()
        .await;
    let _ = c.close().await;
    drop(driver);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

async fn scenarios(c: &Client) {
    let dir = temp_data_dir("mq-console-");
    let (mqd, http) = mqd_with_http(dir.path(), &[]);
    let url = mqd.url().to_string();
    let base = format!("http://{http}");
    let api = Http::new(&base);
    for q in [Q, r".\private$\invoices", r".\private$\audit"] {
        assert!(mq(&url, &["queue", "create", q], None).status.success());
    }

    // The overview shows the queue's count after `mq send`, and its rates live.
    c.goto(&format!("{base}/")).await.expect("overview");
    for i in 0..6 {
        for j in 0..(i % 3 + 1) {
            let body = format!(
                r#"{{"order": {}, "customer": "c-{j}", "items": [{{"sku": "A-1", "qty": 2}}]}}"#,
                i * 10 + j + 1
            );
            send(
                &url,
                Q,
                body.as_bytes(),
                &["--label", &format!("order {i}{j}")],
            );
        }
        send(
            &url,
            r".\private$\invoices",
            b"<invoice><id>7</id><total>12.50</total></invoice>",
            &["--label", "invoice 7"],
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let count = api.get(&format!("/api/v1/queues/{}", enc(Q))).1["messages"]
        .as_u64()
        .unwrap();
    assert_eq!(count, 12);
    let cell = format!(
        r#"tr[data-name="{}"] td[data-f="messages"]"#,
        Q.replace('\\', "\\\\")
    );
    // Live: the page was loaded before the sends; polling brings the count.
    text_when(c, &cell, |t| t == "12").await;
    c.goto(&format!("{base}/")).await.expect("overview");
    text_when(c, &cell, |t| t == "12").await;
    text_when(c, "#total-messages", |t| t == "18").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    shot(c, "overview").await;

    // The queues table; at phone width too.
    c.goto(&format!("{base}/queues")).await.expect("queues");
    text_when(c, &cell, |t| t == "12").await;
    shot(c, "queues").await;
    c.set_window_size(390, 844).await.expect("phone width");
    shot(c, "queues-phone").await;
    c.set_window_size(1280, 800).await.expect("desktop width");

    // A queue's messages, one message.
    let qpage = format!("{base}/queues/{}", enc(Q));
    c.goto(&qpage).await.expect("queue page");
    text_when(c, "#queue-count", |t| t == "12").await;
    shot(c, "queue-messages").await;
    c.find(Locator::Css("table.messages td.id a"))
        .await
        .expect("a message link")
        .click()
        .await
        .expect("click");
    let body = text_when(c, "#body-preview", |t| t.contains("\"order\"")).await;
    assert!(
        body.contains("\n  \"customer\""),
        "pretty-printed JSON: {body}"
    );
    shot(c, "message").await;
    c.set_window_size(390, 844).await.expect("phone width");
    shot(c, "message-phone").await;
    c.set_window_size(1280, 800).await.expect("desktop width");

    // Purge through the UI empties the queue.
    c.goto(&qpage).await.expect("queue page");
    click_confirmed(c, ".summary form[action$='/purge'] button").await;
    text_when(c, "#queue-count", |t| t == "0").await;
    text_when(c, ".notice", |t| t.contains("purged 12 messages")).await;
    assert_eq!(
        api.get(&format!("/api/v1/queues/{}", enc(Q))).1["messages"],
        0
    );
    shot(c, "queue-purged").await;

    // A dead-lettered message shows its class and reason.
    send(
        &url,
        r".\private$\audit",
        b"nobody reads this in time",
        &["--ttbr", "1ms", "--label", "too late"],
    );
    assert!(wait_until(WAIT, || api.get("/api/v1/deadletter").1
        ["queues"][0]["messages"]
        == 1));
    c.goto(&format!("{base}/deadletter"))
        .await
        .expect("dead letters");
    text_when(c, "td .badge.warn", |t| t == "ReceiveTimeout").await;
    let reason = text_when(c, "td.reason", |t| !t.is_empty()).await;
    let api_reason = api.get("/api/v1/deadletter").1["queues"][0]["messages_page"][0]
        ["dead_letter"]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(reason, api_reason);
    shot(c, "deadletter").await;
    c.set_window_size(390, 844).await.expect("phone width");
    shot(c, "deadletter-phone").await;
    c.set_window_size(1280, 800).await.expect("desktop width");

    // Pausing an outgoing queue from the UI shows ONHOLD, and `mq outgoing list` agrees.
    let port = free_port();
    send(
        &url,
        &format!(r"DIRECT=TCP:127.0.0.1:{port}\private$\far"),
        b"to a broker that is down",
        &[],
    );
    assert!(wait_until(WAIT, || {
        api.get("/api/v1/outgoing").1["outgoing"][0]["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty())
    }));
    c.goto(&format!("{base}/outgoing")).await.expect("outgoing");
    click_confirmed(c, "form[action$='/pause'] button").await;
    text_when(c, r#"[data-f="state"]"#, |t| t == "ONHOLD").await;
    let list = mq(&url, &["outgoing", "list"], None);
    let list = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        list.lines()
            .any(|l| l.contains(&format!("127.0.0.1:{port}")) && l.contains("ONHOLD")),
        "{list}"
    );
    shot(c, "outgoing").await;
}
