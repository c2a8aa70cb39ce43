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
    (max_connections, idle): (usize, std::time::Duration),
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let api = crate::http_api::Api::new(ready.clone());
    let guard = HostGuard {
        api: api.clone(),
        loopback: listener.local_addr()?.ip().is_loopback(),
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
        .merge(crate::http_api::router(api.clone()))
        .merge(crate::console::router(api))
        .layer(axum::middleware::from_fn_with_state(guard, host_guard))
        .layer(axum::middleware::from_fn(security_headers))
        .into_make_service_with_connect_info::<crate::http_tls::Peer>();
    match tls {
        None => {
            let listener = crate::http_conns::Bounded::new(listener, max_connections, idle);
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
        Some(tls) => {
            let listener = crate::http_conns::Bounded::new(
                crate::http_tls::TlsListener::new(listener, tls),
                max_connections,
                idle,
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

async fn metrics(State(ready): State<Arc<Readiness>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS)],
        crate::metrics::render(&ready),
    )
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
