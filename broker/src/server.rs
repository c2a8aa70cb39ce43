//! Running a broker: bind, serve the gRPC service, shut down gracefully.

use std::future::Future;
use std::sync::Arc;

use mq_proto::v1::message_queue_server::MessageQueueServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;

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
    ready: impl FnOnce(),
) -> Result<(), RunError> {
    let local = listener.local_addr().map_err(RunError::Listener)?;
    let _lock = lock_data_dir(&config)?;
    let grace = config.shutdown_grace;
    let (broker, rec) = Broker::open(config, vec![local]).map_err(RunError::Journal)?;
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
    let svc = MessageQueueServer::new(Service::new(broker.clone()))
        .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
        .max_encoding_message_size(mq_proto::MAX_GRPC_MESSAGE);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        // Notices peers that vanished without closing (a forwarding broker behind a dead
        // network), so their streams end and give back what they hold.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .initial_stream_window_size(Some(8 * 1024 * 1024))
        .initial_connection_window_size(Some(16 * 1024 * 1024))
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    ready();
    tracing::info!(%local, name = %broker.config().name, "broker started");
    tokio::select! {
        r = &mut server => {
            broker.close();
            return r.map_err(RunError::from);
        }
        _ = shutdown => {}
    }
    tracing::info!("shutting down: no new connections; finishing what is in flight");
    broker.begin_shutdown();
    let _ = stop_tx.send(());
    match tokio::time::timeout(grace, server).await {
        Ok(r) => r?,
        Err(_) => tracing::warn!(
            ?grace,
            "streams still open after the grace period; closing them"
        ),
    }
    // Whatever the streams wrote on their way out (removals of acknowledged messages, given
    // back in-flight ones) is written and synced before `run` returns.
    broker.close();
    tracing::info!("broker stopped");
    Ok(())
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
