//! [`Pool`]: the extra connections of concurrent senders (`--clients`) and of many consumers
//! (`--consumers`), opened the first time a phase needs them and kept for the whole
//! invocation, as an application keeps its connections. Opening 200 connections took about
//! 1.4 s on the 2-core test machine; inside every e2e phase (where senders and consumers start
//! with the clock running) that was most of the time of a 2,000-message run and a quarter of a
//! 200,000-message one, a cost of connecting, not of moving messages.

use anyhow::{Context, Result};
use mq_client::Client;
use tokio::sync::Mutex;

/// Connections to one broker, opened on demand and reused.
#[derive(Debug)]
pub(crate) struct Pool {
    url: String,
    clients: Mutex<Vec<Client>>,
}

impl Pool {
    pub fn new(url: impl Into<String>) -> Pool {
        Pool {
            url: url.into(),
            clients: Mutex::new(Vec::new()),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `n` connections: those opened before, and new ones (at once) for the rest.
    pub async fn clients(&self, n: usize) -> Result<Vec<Client>> {
        let mut clients = self.clients.lock().await;
        if clients.len() < n {
            let url = &self.url;
            let more = futures::future::try_join_all(
                (clients.len()..n).map(|_| crate::connect::client(url)),
            )
            .await
            .with_context(|| format!("connecting to {url}"))?;
            clients.extend(more);
        }
        Ok(clients[..n].to_vec())
    }
}
