//! Running a broker: bind, serve the gRPC service, shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use mq_proto::v1::admin_service_server::AdminServiceServer;
use mq_proto::v1::forward_service_server::ForwardServiceServer;
use mq_proto::v1::message_queue_service_server::MessageQueueServiceServer;
use tokio::net::{TcpListener, UnixListener};

use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::service::Service;

/// Why a broker could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("data directory {0} is in use by another running mqd; stop it or pass a different --data-dir")]
    Locked(String),
    #[error("{0}")]
    Journal(crate::error::BrokerError),
    #[error("cannot read the listener's address: {0}")]
    Listener(std::io::Error),
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Users(String),
    #[error("{0}")]
    Tls(String),
    /// Protected mode: a non-loopback address without TLS and a users file.
    #[error("{0}")]
    Protected(String),
    /// The HTTP port (metrics, health) cannot be served.
    #[error("{0}")]
    Http(String),
    /// The Unix socket (`--unix-socket`) cannot be served.
    #[error("{0}")]
    Local(String),
    /// The configuration refuses itself (an HTTP address protected mode refuses).
    #[error("{0}")]
    Config(String),
}

impl RunError {
    /// Whether the configuration is at fault (users file, TLS files, protected mode), not the
    /// machine or the journal: `mqd` exits 2 on these, as on a bad flag.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            RunError::Users(_) | RunError::Tls(_) | RunError::Protected(_) | RunError::Config(_)
        )
    }
}

/// Serves a broker on `listener` until `shutdown` resolves, then stops accepting, lets open
/// requests finish (up to `config.shutdown_grace`), and returns.
///
/// The caller binds the listener, so tests can pass `127.0.0.1:0`.
pub async fn run(
    listener: TcpListener,
    config: BrokerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    run_with_ready(listener, config, shutdown, || {}).await
}

/// [`run`], calling `ready` once recovery is done and the service is about to accept requests
/// (`mqd` prints its `listening on` line there).
pub async fn run_with_ready(
    listener: TcpListener,
    config: BrokerConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(),
) -> Result<(), RunError> {
    let local = listener.local_addr().map_err(RunError::Listener)?;
    let sec = config.security.clone();
    let secured = sec.tls_enabled() && sec.users_file.is_some();
    if !(local.ip().is_loopback() || sec.insecure || secured) {
        return Err(RunError::Protected(format!(
            "refusing to serve {local}: a non-loopback address needs TLS and a users file (--tls-cert, --tls-key, --users){}; pass --insecure to serve it anyway",
            match (sec.tls_enabled(), sec.users_file.is_some()) {
                (false, false) => ", and neither is set",
                (true, false) => ", and no users file is set",
                _ => ", and TLS is not set",
            }
        )));
    }
    let ready = Arc::new(crate::ready::Readiness::default());
    // The HTTP port answers from the start: live at once, ready after recovery.
    let http = match config.http_listen {
        Some(addr) => {
            crate::http::check_address(addr, config.http_insecure, &sec)
                .map_err(RunError::Config)?;
            let http_tls = crate::http_tls::server_config(&sec).map_err(RunError::Tls)?;
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| RunError::Http(format!("cannot listen on {addr} for HTTP: {e}")))?;
            let bound = l.local_addr().map_err(RunError::Listener)?;
            ready.set_http_addr(bound);
            tracing::info!(%bound, tls = http_tls.is_some(), "serving HTTP: the console at /, its API at /api/v1/, /metrics, /healthz, /readyz");
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let limits = crate::http_conns::Limits {
                max_connections: config.http_max_connections,
                idle: config.http_idle_timeout,
                request: config.http_request_timeout,
            };
            let task = tokio::spawn(crate::http::serve(
                l,
                ready.clone(),
                http_tls,
                limits,
                async {
                    let _ = rx.await;
                },
            ));
            Some((tx, task))
        }
        None => None,
    };
    let tls = sec.server_tls().map_err(RunError::Tls)?;
    crate::http_tls::check_grpc_files(&sec).map_err(RunError::Tls)?;
    let auth = Arc::new(
        match &sec.users_file {
            Some(path) => crate::auth::Auth::from_file(path).map_err(RunError::Users)?,
            None => crate::auth::Auth::open(),
        }
        .with_os_users(config.unix_socket_os_users),
    );
    ready.set_auth(auth.clone());
    // Before recovery, which may take a while: a SIGHUP then rereads the file too.
    let _reloader = auth.has_users().then(|| spawn_reloader(auth.clone()));
    let _lock = lock_data_dir(&config)?;
    let local_listener = match &config.unix_socket {
        Some(path) => Some((bind_local(path)?, path.clone())),
        None => None,
    };
    let grace = config.shutdown_grace;
    let (broker, rec) = Broker::open(config, local_addresses(local)).map_err(RunError::Journal)?;
    tracing::info!(
        queues = rec.queues,
        messages = rec.messages,
        bytes = rec.bytes,
        segments = rec.segments,
        seconds = format!("{:.3}", rec.seconds),
        torn_tail_truncated = rec.truncated,
        "recovered the journal"
    );
    let broker = Arc::new(broker);
    broker.start_background();
    let grpc_addrs = broker.local_addrs().to_vec();
    let limit = broker.config().grpc_message_limit();
    let flow = broker.config().flow.clone();
    let unsent_limit = crate::unsent::connection_limit(
        flow.max_unsent_bytes_per_connection,
        crate::service::delivery_batch_bytes(broker.config()),
    );
    if unsent_limit as u64 != flow.max_unsent_bytes_per_connection {
        tracing::warn!(
            per_connection = unsent_limit,
            "--max-unsent-bytes-per-connection raised: it holds at least one receive stream's budget (16 MiB, or two batches of the largest message: 2 × (--max-body-bytes + 256))"
        );
    }
    let (stream_window, connection_window) = flow.http2_windows();
    if stream_window != flow.http2_stream_window {
        tracing::warn!(
            stream_window,
            "--http2-stream-window lowered to the connection window (--http2-connection-window)"
        );
    }
    tracing::info!(
        stream_window,
        connection_window,
        max_connections = flow.max_connections,
        most_unread_request_bytes = connection_window as u64 * flow.max_connections as u64,
        "HTTP/2 windows: request data the broker has not read is at most the connection window per connection"
    );
    // The broker's budget holds at least one connection's; each connection's first batch is
    // its own (`crate::unsent::Budget`).
    let unsent_floor = crate::service::delivery_batch_bytes(broker.config()).min(unsent_limit);
    let unsent_shared = (flow.max_unsent_bytes as usize).max(unsent_limit);
    if unsent_shared as u64 != flow.max_unsent_bytes {
        tracing::warn!(
            total = unsent_shared,
            "--max-unsent-bytes raised: it holds at least one connection's budget (--max-unsent-bytes-per-connection)"
        );
    }
    let connections = Arc::new(
        crate::flow::Connections::new(
            flow.max_connections,
            unsent_limit,
            unsent_floor,
            unsent_shared,
        )
        .with_max_per_address(flow.max_connections_per_address.unwrap_or(usize::MAX)),
    );
    let service = Service::new(broker.clone(), connections.clone(), auth.clone())
        .with_readiness(ready.clone());
    // The identity of every call is established here, once per call (a stream is one call),
    // asynchronously: password hashes run on blocking threads, a core at a time. Each method
    // then checks its right (service.rs), whichever of the three services it belongs to.
    // Receive calls are answered by `large_bodies` (large bodies leave without a copy).
    let svc = crate::auth_layer::Authenticated::new(
        crate::large_bodies::LargeBodies::new(
            MessageQueueServiceServer::new(service.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            service.clone(),
            limit,
        ),
        auth.clone(),
    );
    let admin = crate::auth_layer::Authenticated::new(
        AdminServiceServer::new(service.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit),
        auth.clone(),
    );
    let forward = crate::auth_layer::Authenticated::new(
        ForwardServiceServer::new(service)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit),
        auth.clone(),
    );
    // Health and reflection are served beside the identity layer: they need no credentials
    // (README "Security"), and they only describe the broker.
    let health =
        tonic_health::pb::health_server::HealthServer::new(crate::ready::Health(ready.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mq_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| RunError::Http(format!("cannot build gRPC reflection: {e}")))?;
    let partial = crate::partial_requests::PartialLayer {
        limits: std::sync::Arc::new(crate::partial_requests::PartialLimits::new(
            flow.max_partial_bytes_per_connection,
            flow.max_partial_bytes,
            flow.message_arrival_timeout,
            limit as u64,
            broker.counters().clone(),
        )),
        connections: connections.clone(),
    };
    let asked = (
        flow.max_partial_bytes_per_connection,
        flow.max_partial_bytes,
    );
    if partial.limits.in_force() != asked {
        let (per_connection, total) = partial.limits.in_force();
        tracing::warn!(
            per_connection,
            total,
            "--max-partial-bytes-per-connection / --max-partial-bytes raised: each holds at least one gRPC message (--max-body-bytes + 8 MiB), and the total at least one connection's"
        );
    }
    let incoming = crate::flow::accept(listener, connections.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // The same services, for TCP (with TLS if configured) and for the Unix socket (never TLS:
    // the file's permissions and the users file guard it).
    let router = |tls: Option<tonic::transport::ServerTlsConfig>| {
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        Ok::<_, RunError>(
            builder
                // Notices peers that vanished without closing (a forwarding broker behind a
                // dead network), so their streams end and give back what they hold.
                .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
                .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
                .initial_stream_window_size(Some(stream_window))
                .initial_connection_window_size(Some(connection_window))
                .max_frame_size(Some(mq_proto::HTTP2_MAX_FRAME_SIZE))
                .max_concurrent_streams(Some(flow.max_streams_per_connection))
                .http2_max_header_list_size(Some(crate::config::MAX_HEADER_LIST_BYTES))
                .layer(crate::metrics::CountCalls(broker.counters().clone()))
                // Bytes of unfinished request messages, per connection and in all, and time.
                .layer(partial.clone())
                // Every error status gets its google.rpc.ErrorInfo (domain mq, a reason).
                .layer(crate::rich_error::ErrorInfoLayer)
                .add_service(svc.clone())
                .add_service(admin.clone())
                .add_service(forward.clone())
                .add_service(health.clone())
                .add_service(reflection.clone()),
        )
    };
    let local_server = match local_listener {
        Some((l, path)) => {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let serve = router(None)?.serve_with_incoming_shutdown(
                crate::flow::accept(l, connections.clone()),
                async {
                    let _ = rx.await;
                },
            );
            tracing::info!(path = %path.display(), "serving the Unix socket");
            Some(LocalServer {
                task: tokio::spawn(serve),
                stop: tx,
                path,
            })
        }
        None => None,
    };
    let server = router(tls)?.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(server);
    ready.recovered(broker.clone(), connections, grpc_addrs);
    let watch = ready.spawn_watch();
    on_ready();
    tracing::info!(%local, name = %broker.config().name, allocator = ?crate::memtrim::allocator(), "broker started");
    tokio::select! {
        r = &mut server => {
            ready.stopping();
            if let Some(l) = local_server {
                l.stop(grace).await;
            }
            broker.close();
            stop_http(http).await;
            return r.map_err(RunError::from);
        }
        _ = shutdown => {}
    }
    tracing::info!("shutting down: no new connections; finishing what is in flight");
    ready.stopping();
    watch.abort();
    broker.begin_shutdown();
    let _ = stop_tx.send(());
    let (r, ()) = tokio::join!(tokio::time::timeout(grace, server), async {
        if let Some(l) = local_server {
            l.stop(grace).await;
        }
    });
    match r {
        Ok(r) => r?,
        Err(_) => tracing::warn!(
            ?grace,
            "streams still open after the grace period; closing them"
        ),
    }
    // Whatever the streams wrote on their way out (removals of acknowledged messages, given
    // back in-flight ones) is written and synced before `run` returns.
    broker.close();
    stop_http(http).await;
    tracing::info!("broker stopped");
    Ok(())
}

/// The gRPC server on the Unix socket, beside the TCP one.
struct LocalServer {
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    stop: tokio::sync::oneshot::Sender<()>,
    path: std::path::PathBuf,
}

impl LocalServer {
    /// Stops accepting, lets open requests finish (up to `grace`), and removes the socket file.
    async fn stop(self, grace: std::time::Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the Unix socket's server failed"),
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "streams on the Unix socket still open after the grace period; closing them"
                );
                task.abort();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the broker's Unix socket at `path`, readable and writable by its owner and group
/// (0660). A socket file nobody answers on (left by a broker that was killed) is replaced; a
/// socket some process answers on, or a file that is not a socket, is an error.
fn bind_local(path: &std::path::Path) -> Result<UnixListener, RunError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(RunError::Local(format!(
                    "cannot listen on {shown}: another process is listening on this socket; stop it or pass a different --unix-socket"
                )));
            }
            std::fs::remove_file(path).map_err(|e| {
                RunError::Local(format!("cannot replace the stale socket {shown}: {e}"))
            })?;
        }
        Ok(_) => {
            return Err(RunError::Local(format!(
                "cannot listen on {shown}: it exists and is not a socket (mqd replaces only a stale socket file)"
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(RunError::Local(format!("cannot listen on {shown}: {e}"))),
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| RunError::Local(format!("cannot listen on {shown}: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| RunError::Local(format!("cannot set the permissions of {shown}: {e}")))?;
    Ok(listener)
}

/// Stops the HTTP port (after the broker, so `/readyz` says "shutting down" meanwhile).
async fn stop_http(
    http: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
) {
    if let Some((tx, task)) = http {
        let _ = tx.send(());
        if tokio::time::timeout(std::time::Duration::from_secs(2), task)
            .await
            .is_err()
        {
            tracing::warn!("the HTTP port did not stop within 2s");
        }
    }
}

/// Rereads the users file on SIGHUP (the old one stays in force if the new one is bad).
fn spawn_reloader(auth: Arc<crate::auth::Auth>) -> Option<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                "cannot install the SIGHUP handler; the users file is read at start only: {e}"
            );
            return None;
        }
    };
    Some(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            // Off the async workers: a big file (200,000 users stalled every client 2.8 s) or
            // one on a hung file system (a FIFO stalled them all until written) must not stop
            // the service (helper-67).
            // On a thread of its own, not the runtime's blocking pool: a reread that hangs
            // must not hold up the runtime's end when mqd stops (helper-68).
            let a = auth.clone();
            let started = std::time::Instant::now();
            let (done, reread) = tokio::sync::oneshot::channel();
            let spawned = std::thread::Builder::new()
                .name("mqd-users-reread".into())
                .spawn(move || {
                    let _ = done.send(a.reload());
                });
            if let Err(e) = spawned {
                tracing::error!(
                    "SIGHUP: cannot start the reread ({e}); the previous users file stays in force"
                );
                continue;
            }
            // Awaited apart: a reread that hangs must not keep the next SIGHUP from rereading
            // (helper-69).
            tokio::spawn(async move {
                let reread = reread.await;
                let seconds = format!("{:.3}", started.elapsed().as_secs_f64());
                match reread {
                    Ok(Ok(0)) => tracing::warn!(
                        seconds,
                        "SIGHUP: reread the users file: it has no users, so every caller is anonymous now"
                    ),
                    Ok(Ok(n)) => {
                        tracing::info!(users = n, seconds, "SIGHUP: reread the users file")
                    }
                    Ok(Err(e)) => tracing::error!(
                        seconds,
                        "SIGHUP: {e}; the previous users file stays in force"
                    ),
                    Err(_) => tracing::error!(
                        "SIGHUP: rereading the users file failed; the previous one stays in force"
                    ),
                }
            });
        }
    }))
}

fn lock_data_dir(config: &BrokerConfig) -> Result<std::fs::File, RunError> {
    let dir = &config.data_dir;
    let err = |source| RunError::DataDir {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))
        .map_err(err)?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(RunError::Locked(dir.display().to_string())),
        Err(std::fs::TryLockError::Error(e)) => Err(err(e)),
    }
}

/// The addresses this broker answers on: the bound address, and for an unspecified one
/// (`0.0.0.0`, `::`) every address of the machine's interfaces on that port, so that format
/// names with the machine's own IP address are local (not forwarded to itself).
pub(crate) fn local_addresses(bound: SocketAddr) -> Vec<SocketAddr> {
    let mut out = vec![bound];
    if bound.ip().is_unspecified() {
        match if_addrs::get_if_addrs() {
            Ok(ifs) => {
                for i in ifs {
                    // `::` usually accepts IPv4 as well (dual stack); `0.0.0.0` only IPv4.
                    if bound.is_ipv4() && !i.ip().is_ipv4() {
                        continue;
                    }
                    let a = SocketAddr::new(i.ip(), bound.port());
                    if !out.contains(&a) {
                        out.push(a);
                    }
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "cannot list the network interfaces; only loopback and --alias names count as this broker"
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::local_addresses;

    /// `--listen 0.0.0.0:P` answers on every interface address at P: those are local.
    #[test]
    fn an_unspecified_listen_address_counts_every_interface_address() {
        let addrs = local_addresses("0.0.0.0:1801".parse().unwrap());
        assert!(
            addrs.contains(&"127.0.0.1:1801".parse().unwrap()),
            "{addrs:?}"
        );
        for i in if_addrs::get_if_addrs().unwrap() {
            if i.ip().is_ipv4() {
                assert!(
                    addrs.contains(&std::net::SocketAddr::new(i.ip(), 1801)),
                    "{} missing from {addrs:?}",
                    i.ip()
                );
            }
        }
        assert_eq!(
            local_addresses("127.0.0.1:1801".parse().unwrap()),
            vec!["127.0.0.1:1801".parse().unwrap()]
        );
    }
}
