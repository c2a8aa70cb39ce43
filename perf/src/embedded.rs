//! [`EmbeddedBroker`]: the broker `mqperf` starts when no `--broker` is given: in this process,
//! on `127.0.0.1:<any port>`, with a temporary data directory that is removed when it stops.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A broker running in this process.
#[derive(Debug)]
pub struct EmbeddedBroker {
    addr: SocketAddr,
    url: String,
    express_quota_bytes: u64,
    max_body_bytes: usize,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), mq_broker::RunError>>,
    // Dropped (and deleted) after the broker has stopped.
    data_dir: tempfile::TempDir,
}

impl EmbeddedBroker {
    /// Starts a broker with the default limits, except that the express quota is at least
    /// `min_express_quota_bytes` (a benchmark may hold `count` messages in memory at once).
    /// Must be called inside a Tokio runtime; the broker runs as a task of it.
    pub async fn start(min_express_quota_bytes: u64) -> Result<EmbeddedBroker> {
        let data_dir = tempfile::Builder::new()
            .prefix("mqperf-")
            .tempdir()
            .context("cannot create a temporary data directory for the embedded broker")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind 127.0.0.1:0 for the embedded broker")?;
        let addr = listener.local_addr()?;
        let mut config = mq_broker::BrokerConfig::new(data_dir.path());
        config.express_quota_bytes = config.express_quota_bytes.max(min_express_quota_bytes);
        let express_quota_bytes = config.express_quota_bytes;
        let max_body_bytes = config.max_body_bytes;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(mq_broker::run(listener, config, async {
            let _ = stopped.await;
        }));
        Ok(EmbeddedBroker {
            addr,
            url: format!("http://{addr}"),
            express_quota_bytes,
            max_body_bytes,
            stop,
            task,
            data_dir,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The temporary data directory.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// Its express memory quota, in bytes.
    pub fn express_quota_bytes(&self) -> u64 {
        self.express_quota_bytes
    }

    /// Its largest accepted body, in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// Shuts the broker down gracefully, waits for it, and removes the data directory.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        let r = self
            .task
            .await
            .context("the embedded broker's task panicked")?;
        r.context("the embedded broker failed")?;
        self.data_dir
            .close()
            .context("cannot remove the embedded broker's data directory")?;
        Ok(())
    }
}
