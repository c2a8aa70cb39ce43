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
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let api = crate::http_api::Api::new(ready.clone());
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
        .merge(crate::http_api::router(api.clone()))
        .merge(crate::console::router(api))
        .into_make_service_with_connect_info::<crate::http_tls::Peer>();
    match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
        }
        Some(tls) => {
            axum::serve(crate::http_tls::TlsListener::new(listener, tls), app)
                .with_graceful_shutdown(stop)
                .await
        }
    }
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
