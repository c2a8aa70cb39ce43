//! Readiness: one notion of "recovered and serving" (journal healthy, not shutting down) for
//! `/readyz`, the `grpc.health.v1.Health` service it also implements, and `GetBrokerInfo`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::broker::Broker;
use crate::flow::Connections;

/// How often the journal's health is looked at for readiness (a poisoned journal is not ready).
const POLL: Duration = Duration::from_millis(250);

/// The services `grpc.health.v1.Health` answers for: the whole server (`""`) and the three
/// `mq.v1` services; all have the broker's readiness.
pub(crate) const HEALTH_SERVICES: [&str; 4] = [
    "",
    "mq.v1.MessageQueueService",
    "mq.v1.AdminService",
    "mq.v1.ForwardService",
];

/// Where the broker is in its life, shared by everything that reports it.
#[derive(Debug)]
pub struct Readiness {
    started: Instant,
    started_ms: u64,
    broker: OnceLock<Arc<Broker>>,
    connections: OnceLock<Arc<Connections>>,
    grpc_addrs: OnceLock<Vec<SocketAddr>>,
    http_addr: OnceLock<SocketAddr>,
    /// The identities and rights (for the HTTP API and console).
    auth: OnceLock<Arc<crate::auth::Auth>>,
    stopping: AtomicBool,
    /// Whether it is ready, for watchers (gRPC health `Watch`).
    serving: tokio::sync::watch::Sender<bool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            started: Instant::now(),
            started_ms: crate::message::now_ms(),
            broker: OnceLock::new(),
            connections: OnceLock::new(),
            grpc_addrs: OnceLock::new(),
            http_addr: OnceLock::new(),
            auth: OnceLock::new(),
            stopping: AtomicBool::new(false),
            serving: tokio::sync::watch::channel(false).0,
        }
    }
}

impl Readiness {
    /// `Ok` when the broker serves: recovery finished, the journal is not poisoned, and it is
    /// not shutting down; else why not (one line).
    pub fn check(&self) -> Result<(), &'static str> {
        if self.stopping.load(Ordering::Acquire) {
            return Err("shutting down");
        }
        let Some(b) = self.broker.get() else {
            return Err("recovering the journal");
        };
        if b.journal().is_poisoned() {
            return Err("the journal is poisoned (a write or fdatasync failed); restart mqd");
        }
        if b.is_shutting_down() {
            return Err("shutting down");
        }
        Ok(())
    }

    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn started_ms(&self) -> u64 {
        self.started_ms
    }

    pub(crate) fn broker(&self) -> Option<&Arc<Broker>> {
        self.broker.get()
    }

    pub(crate) fn connections(&self) -> Option<&Arc<Connections>> {
        self.connections.get()
    }

    pub(crate) fn grpc_addrs(&self) -> &[SocketAddr] {
        self.grpc_addrs.get().map_or(&[], |v| v)
    }

    pub(crate) fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr.get().copied()
    }

    pub(crate) fn auth(&self) -> Option<&Arc<crate::auth::Auth>> {
        self.auth.get()
    }

    pub(crate) fn set_auth(&self, auth: Arc<crate::auth::Auth>) {
        let _ = self.auth.set(auth);
    }

    pub(crate) fn set_http_addr(&self, a: SocketAddr) {
        let _ = self.http_addr.set(a);
    }

    /// Recovery is done: the broker serves from now on.
    pub(crate) fn recovered(
        &self,
        broker: Arc<Broker>,
        connections: Arc<Connections>,
        grpc_addrs: Vec<SocketAddr>,
    ) {
        let _ = self.broker.set(broker);
        let _ = self.connections.set(connections);
        let _ = self.grpc_addrs.set(grpc_addrs);
        self.refresh();
    }

    /// Shutdown began: not ready any more.
    pub(crate) fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
        self.refresh();
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn refresh(&self) {
        let ok = self.check().is_ok();
        self.serving
            .send_if_modified(|v| std::mem::replace(v, ok) != ok);
    }

    /// Keeps the watchers current (a journal can become poisoned at any time) until shutdown.
    pub(crate) fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            while !me.is_stopping() {
                me.refresh();
                tokio::time::sleep(POLL).await;
            }
        })
    }
}

/// `grpc.health.v1.Health` on the main port: SERVING while [`Readiness::check`] is `Ok`.
/// Reachable without credentials (it is served beside, not behind, the identity layer).
#[derive(Debug, Clone)]
pub(crate) struct Health(pub Arc<Readiness>);

fn response(serving: bool) -> HealthCheckResponse {
    HealthCheckResponse {
        status: if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        } as i32,
    }
}

type WatchStream = Pin<
    Box<dyn futures::Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for Health {
    async fn check(
        &self,
        req: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let service = req.into_inner().service;
        if !HEALTH_SERVICES.contains(&service.as_str()) {
            return Err(tonic::Status::not_found(format!(
                "no health status for service {}; known: {}",
                mq_proto::limits::quote(&service),
                HEALTH_SERVICES.map(|s| format!("{s:?}")).join(", ")
            )));
        }
        Ok(tonic::Response::new(response(self.0.check().is_ok())))
    }

    type WatchStream = WatchStream;

    /// Sends the status now and on every change; ends after NOT_SERVING for a shutdown, so a
    /// watcher does not hold the graceful shutdown open.
    async fn watch(
        &self,
        req: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<WatchStream>, tonic::Status> {
        let service = req.into_inner().service;
        if !HEALTH_SERVICES.contains(&service.as_str()) {
            let unknown = HealthCheckResponse {
                status: ServingStatus::ServiceUnknown as i32,
            };
            return Ok(tonic::Response::new(Box::pin(futures::stream::once(
                async move { Ok(unknown) },
            ))));
        }
        let ready = self.0.clone();
        let rx = ready.serving.subscribe();
        let stream = futures::stream::unfold(
            (rx, ready, false, true),
            |(mut rx, ready, ended, first)| async move {
                if ended {
                    return None;
                }
                if !first && rx.changed().await.is_err() {
                    return None;
                }
                let serving = *rx.borrow_and_update();
                let ended = ready.is_stopping();
                Some((Ok(response(serving)), (rx, ready, ended, false)))
            },
        );
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}
