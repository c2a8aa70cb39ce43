//! The HTTP port (`mqd --metrics-listen` / `--http-listen`): `GET /metrics` (Prometheus),
//! `GET /healthz` (live) and `GET /readyz` (ready); later the console and its JSON API.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::ready::Readiness;

/// The content type of the OpenMetrics text format `prometheus-client` writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Checks protected mode for the HTTP port: it has no authentication, so only loopback
/// addresses unless `insecure` (`mqd --http-insecure`).
pub(crate) fn check_address(addr: SocketAddr, insecure: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || insecure {
        return Ok(());
    }
    Err(format!(
        "refusing to serve HTTP (metrics, health) on {addr}: the HTTP port has no authentication, so it serves loopback addresses only; pass --http-insecure to serve it anyway"
    ))
}

/// Serves the HTTP port on `listener` until `stop` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    ready: Arc<Readiness>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
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
