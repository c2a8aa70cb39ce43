//! The HTTP port (`mqd --metrics-listen` / `--http-listen`): `GET /metrics` (Prometheus),
//! `GET /healthz` (live) and `GET /readyz` (ready), the console (`console`) and its JSON API
//! (`http_api`); over TLS when mqd has a certificate (`http_tls`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::ready::Readiness;

/// The content type of the OpenMetrics text format `prometheus-client` writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Checks protected mode for the HTTP port, as for the gRPC port: a non-loopback address needs
/// TLS and a users file (the console and API then use HTTPS and the users' identities), unless
/// `insecure` (`mqd --http-insecure`).
pub(crate) fn check_address(
    addr: SocketAddr,
    insecure: bool,
    sec: &crate::tls::SecurityConfig,
) -> Result<(), String> {
    if addr.ip().is_loopback() || insecure || (sec.tls_enabled() && sec.users_file.is_some()) {
        return Ok(());
    }
    Err(format!(
        "refusing to serve HTTP (metrics, health, console, API) on {addr}: a non-loopback HTTP address needs TLS and a users file (--tls-cert, --tls-key, --users), so that the console and API authenticate over HTTPS; pass --http-insecure to serve it anyway"
    ))
}

/// Serves the HTTP port on `listener` until `stop` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    ready: Arc<Readiness>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    limits: crate::http_conns::Limits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let api = crate::http_api::Api::new(ready.clone());
    let guard = HostGuard {
        api: api.clone(),
        loopback: listener.local_addr()?.ip().is_loopback(),
    };
    let app = axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
        .merge(
            axum::Router::new()
                .route("/metrics", get(metrics))
                .with_state(api.clone()),
        )
        .merge(crate::http_api::router(api.clone()))
        .merge(crate::console::router(api))
        .layer(axum::middleware::from_fn_with_state(guard, host_guard))
        .layer(axum::middleware::from_fn(security_headers))
        .into_make_service_with_connect_info::<crate::http_tls::Peer>();
    match tls {
        None => {
            let listener = crate::http_conns::Bounded::new(listener, limits);
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
        Some(tls) => {
            let listener = crate::http_conns::Bounded::new(
                crate::http_tls::TlsListener::new(listener, tls),
                limits,
            );
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
    }
}

/// What [`host_guard`] needs: the broker (users file, names) and whether the port is loopback.
#[derive(Clone)]
struct HostGuard {
    api: Arc<crate::http_api::Api>,
    loopback: bool,
}

/// DNS rebinding: a page of another site whose name the attacker points at 127.0.0.1 reaches
/// a loopback port as a same-origin page, so without a users file (everyone has every right)
/// it could read and purge every queue. On a loopback port without a users file, a request
/// must name this machine in `Host`: `localhost`, a loopback address, or the broker's `--name`
/// or an `--alias`. With a users file the credentials guard it (a browser does not send them to
/// another site's name); a non-loopback port needs a users file unless `--http-insecure`.
async fn host_guard(
    State(g): State<HostGuard>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if g.loopback && !g.api.auth().is_ok_and(|a| a.has_users()) {
        if let Some(host) = req.headers().get(header::HOST) {
            let host = host.to_str().unwrap_or("");
            if !names_this_machine(host, g.api.ready.broker().map(|b| b.config())) {
                return (
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "refusing a request for host \"{}\": this HTTP port serves loopback without a users file, so a request must name localhost, a loopback address or the broker's --name/--alias (another site's page could reach it through DNS rebinding)\n",
                        mq_proto::limits::quote(host)
                    ),
                )
                    .into_response();
            }
        }
    }
    next.run(req).await
}

/// Whether `host` (a `Host` header: a name or address, and maybe a port) names this machine.
fn names_this_machine(host: &str, config: Option<&crate::config::BrokerConfig>) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    config.is_some_and(|c| {
        std::iter::once(&c.name)
            .chain(c.aliases.iter())
            .any(|n| n.eq_ignore_ascii_case(&name))
    })
}

/// Headers on every answer: no framing by other sites (clickjacking: a framed console's forms
/// would post as same-origin), no content sniffing.
async fn security_headers(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(header::HeaderValue::from_static("frame-ancestors 'none'"));
    resp
}

/// `GET /metrics` renders alive at once (being made, or held by answers being sent), at most;
/// a scrape that would need another is answered 503. An answer holds its render until the
/// client has read it (54 MB at 100,000 queues); answers that share a render hold one.
const MAX_SCRAPES_SENDING: usize = 4;
/// The pieces a render is sent in: the answer's permit is held until the last ones are queued.
const SCRAPE_CHUNK: usize = 64 * 1024;

/// `GET /metrics` renders. One is made at a time, on a blocking thread (at 100,000 queues a
/// render walks them all for a few hundred ms), and a scrape that arrived while a render of
/// the same view was being made waits for it and is answered from it: what it shows began
/// after the scrape arrived, so it is as fresh as one of its own. A render is kept only while
/// scrapes wait (no later one may use it). At most [`MAX_SCRAPES_SENDING`] renders are alive,
/// so slow readers cannot pile them up.
#[derive(Debug)]
pub(crate) struct Scrapes {
    /// The latest render of views that scrapes wait for: (view, when it began, the text and
    /// its place).
    latest: tokio::sync::Mutex<Vec<(String, std::time::Instant, Render)>>,
    /// Scrapes queued for `latest`, by view. Counted out by a guard, so a scrape dropped while
    /// it waits (its client went away) is not counted for ever.
    waiting: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    sending: Arc<tokio::sync::Semaphore>,
}

impl Default for Scrapes {
    fn default() -> Self {
        Scrapes {
            latest: tokio::sync::Mutex::new(Vec::new()),
            waiting: std::sync::Mutex::new(std::collections::HashMap::new()),
            sending: Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES_SENDING)),
        }
    }
}

/// A render, and its place among the [`MAX_SCRAPES_SENDING`] alive (given back when the last
/// answer sending it is done).
type Render = (bytes::Bytes, Arc<tokio::sync::OwnedSemaphorePermit>);

/// One scrape counted among those waiting for its view, until dropped.
struct Waiting<'a> {
    scrapes: &'a Scrapes,
    key: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut w = self
            .scrapes
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = w.get_mut(self.key) {
            *n -= 1;
            if *n == 0 {
                w.remove(self.key);
            }
        }
    }
}

impl Scrapes {
    fn wait<'a>(&'a self, key: &'a str) -> Waiting<'a> {
        *self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default() += 1;
        Waiting { scrapes: self, key }
    }

    fn waiters(&self, key: &str) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// The text for `viewer`, from a render that began at or after `arrived`; `None` if that
    /// needs a render and [`MAX_SCRAPES_SENDING`] are alive.
    async fn render(
        &self,
        ready: &Arc<Readiness>,
        viewer: Option<crate::metrics::Viewer>,
        arrived: std::time::Instant,
    ) -> Option<Render> {
        let key = match &viewer {
            None => "-".to_string(),
            Some(v) if !v.auth.has_users() => "*".to_string(),
            Some(v) if v.who.anonymous => "anonymous".to_string(),
            Some(v) => format!("user:{}", v.who.name),
        };
        self.render_view(ready, key, viewer, arrived).await
    }

    /// [`Scrapes::render`] of the view named `key`.
    async fn render_view(
        &self,
        ready: &Arc<Readiness>,
        key: String,
        viewer: Option<crate::metrics::Viewer>,
        arrived: std::time::Instant,
    ) -> Option<Render> {
        let waiting = self.wait(&key);
        let mut latest = self.latest.lock().await;
        drop(waiting);
        // A kept render serves only scrapes of its view that arrived before it began: of another
        // view, none once nobody of it waits; of this view, this one if it arrived before the
        // render began (the lock is first come, first served: those still waiting arrived
        // after this scrape).
        latest.retain(|(k, t, _)| {
            if *k == key {
                *t >= arrived
            } else {
                self.waiters(k) > 0
            }
        });
        if let Some((_, _, r)) = latest.iter().find(|(k, _, _)| *k == key) {
            let r = r.clone();
            if self.waiters(&key) == 0 {
                latest.retain(|(k, _, _)| *k != key);
            }
            return Some(r);
        }
        let place = Arc::new(self.sending.clone().try_acquire_owned().ok()?);
        let began = std::time::Instant::now();
        let ready = ready.clone();
        let text = match tokio::task::spawn_blocking(move || crate::metrics::render(&ready, viewer))
            .await
        {
            Ok(text) => bytes::Bytes::from(text),
            Err(e) => {
                tracing::error!(error = %e, "rendering the metrics failed");
                bytes::Bytes::new()
            }
        };
        let r = (text, place);
        // Kept only for scrapes of this view already waiting (a later one wants a later render).
        // (At most MAX_SCRAPES_SENDING are kept: each holds its place.)
        if self.waiters(&key) > 0 {
            latest.push((key, began, r.clone()));
        }
        Some(r)
    }
}

/// A `/metrics` answer: the render in [`SCRAPE_CHUNK`] pieces, holding the render's place
/// until it is dropped.
struct ScrapeBody {
    text: bytes::Bytes,
    _place: Arc<tokio::sync::OwnedSemaphorePermit>,
}

impl http_body::Body for ScrapeBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.text.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let n = self.text.len().min(SCRAPE_CHUNK);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(self.text.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.text.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.text.len() as u64)
    }
}

/// `GET /metrics`: the broker-wide series for everyone; with a users file, the series of the
/// queues and outgoing queues the caller may see (HTTP Basic or a bearer token, as the API).
async fn metrics(
    State(api): State<Arc<crate::http_api::Api>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let arrived = std::time::Instant::now();
    let (parts, _) = req.into_parts();
    let viewer = match api.ready.auth() {
        None => None,
        Some(auth) => match crate::http_api::identify(auth, &parts).await {
            Ok(who) => Some(crate::metrics::Viewer {
                auth: auth.clone(),
                who,
            }),
            Err(e) => return e.into_response(),
        },
    };
    let Some((text, place)) = api.scrapes.render(&api.ready, viewer, arrived).await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            format!("{MAX_SCRAPES_SENDING} renders of /metrics are being sent; try again\n"),
        )
            .into_response();
    };
    (
        [(header::CONTENT_TYPE, OPENMETRICS)],
        axum::body::Body::new(ScrapeBody {
            text,
            _place: place,
        }),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ready): State<Arc<Readiness>>) -> (StatusCode, String) {
    match ready.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::names_this_machine;
    use std::sync::Arc;
    use std::time::Instant;

    /// A scrape is answered from a render that began after it arrived: one made for an
    /// earlier scrape is shared only with scrapes that were waiting while it was made.
    #[tokio::test]
    async fn a_scrape_shares_only_a_render_that_began_after_it_arrived() {
        let ready = Arc::new(crate::ready::Readiness::default());
        let s = Arc::new(super::Scrapes::default());
        // Two scrapes arrive while a render is being made (the lock is held here).
        let t0 = Instant::now();
        let making = s.latest.lock().await;
        let scrape = |s: Arc<super::Scrapes>| {
            let ready = ready.clone();
            tokio::spawn(async move { s.render(&ready, None, t0).await })
        };
        let (one, two) = (scrape(s.clone()), scrape(s.clone()));
        for _ in 0..10_000 {
            if s.waiters("-") == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(s.waiters("-"), 2);
        drop(making);
        let (a, b) = (one.await.unwrap().unwrap().0, two.await.unwrap().unwrap().0);
        assert!(std::str::from_utf8(&a).unwrap().contains("mq_ready 0"));
        assert_eq!(
            a.as_ptr(),
            b.as_ptr(),
            "the second waited for the first's render"
        );
        assert!(s.latest.lock().await.is_empty(), "kept with nobody waiting");
        let later = s.render(&ready, None, Instant::now()).await.unwrap().0;
        assert_ne!(
            a.as_ptr(),
            later.as_ptr(),
            "arrived after it began: a new render"
        );
    }

    /// Scrapes of five views at once (a render of one view serves none of the others): those
    /// over the bound are 503, and once the answers are sent every later scrape is served (kept
    /// renders held the places for good, so every later scrape was 503); a scrape dropped while
    /// it waits is not counted as waiting for ever (it kept every later render, each holding a
    /// place).
    #[tokio::test]
    async fn renders_kept_for_nobody_hold_no_place() {
        let ready = Arc::new(crate::ready::Readiness::default());
        let s = Arc::new(super::Scrapes::default());
        let t0 = Instant::now();
        let making = s.latest.lock().await;
        let scrape = |key: String| {
            let (s, ready) = (s.clone(), ready.clone());
            tokio::spawn(async move { s.render_view(&ready, key, None, t0).await })
        };
        let views: Vec<_> = (1..=5).map(|i| scrape(format!("user:u{i}"))).collect();
        // And one whose client goes away while it waits.
        let gone = scrape("anonymous".into());
        for _ in 0..10_000 {
            if s.waiting.lock().unwrap().len() == 6 {
                break;
            }
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        assert_eq!(s.waiters("anonymous"), 0, "a dropped scrape is counted out");
        drop(making);
        let mut answers = Vec::new();
        for v in views {
            answers.push(v.await.unwrap());
        }
        assert!(answers.iter().filter(|a| a.is_some()).count() <= super::MAX_SCRAPES_SENDING);
        drop(answers); // sent
        for i in 1..=6 {
            let r = s
                .render_view(&ready, format!("user:v{i}"), None, Instant::now())
                .await;
            assert!(r.is_some(), "scrape {i} after the burst");
            assert!(s.latest.lock().await.is_empty(), "kept for nobody");
        }
    }

    /// At most four renders are alive (held by answers being sent); a scrape that needs a
    /// fifth is 503 until one is done.
    #[tokio::test]
    async fn answers_being_sent_are_bounded() {
        use axum::extract::{Request, State};
        let api = crate::http_api::Api::new(Arc::new(crate::ready::Readiness::default()));
        let get = || super::metrics(State(api.clone()), Request::new(axum::body::Body::empty()));
        let mut held = Vec::new();
        for _ in 0..super::MAX_SCRAPES_SENDING {
            let r = get().await;
            assert_eq!(r.status(), 200);
            held.push(r);
        }
        let r = get().await;
        assert_eq!(r.status(), 503);
        assert!(r.headers().get("retry-after").is_some());
        drop(held.pop());
        let r = get().await;
        assert_eq!(r.status(), 200);
        let body = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .starts_with("# HELP mq_ready"));
    }

    #[test]
    fn only_this_machines_names_pass_the_host_guard() {
        let mut c = crate::config::BrokerConfig::new("/nonexistent");
        c.name = "brokerA".into();
        c.aliases = vec!["mq.internal".into()];
        for ok in [
            "localhost",
            "localhost:8180",
            "LOCALHOST.:8180",
            "app.localhost:1",
            "127.0.0.1:8180",
            "127.9.9.9",
            "[::1]:8180",
            "brokera:8180",
            "mq.internal",
        ] {
            assert!(names_this_machine(ok, Some(&c)), "{ok}");
        }
        for bad in [
            "evil.example:8180",
            "10.0.0.1:8180",
            "[::2]:8180",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!names_this_machine(bad, Some(&c)), "{bad}");
        }
        assert!(!names_this_machine("brokera", None));
    }
}
