//! [`Client`]: a connection to one broker, queue administration, and handles to queues.

use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, message_queue_client::MessageQueueClient};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::sender::{Sender, SenderOptions};
use crate::transaction::Transaction;

/// The broker URL used when none is given.
pub const DEFAULT_BROKER_URL: &str = "http://127.0.0.1:1801";

/// A connection to a broker. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) rpc: MessageQueueClient<Channel>,
    url: String,
}

/// Properties of a new queue.
#[derive(Debug, Clone, Default)]
pub struct QueueOptions {
    /// Transactional queues accept only transactional sends (fixed at creation).
    pub transactional: bool,
    /// Most bytes the queue may hold; absent = only the broker-wide quota applies.
    pub quota_bytes: Option<u64>,
    /// A free-text label.
    pub label: String,
}

/// A queue's description and counters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueInfo {
    pub name: String,
    pub format_name: String,
    pub transactional: bool,
    pub messages: u64,
    pub bytes: u64,
    pub in_flight: u64,
    pub quota_bytes: Option<u64>,
    pub label: String,
    pub created_ms: u64,
}

impl From<v1::QueueInfo> for QueueInfo {
    fn from(q: v1::QueueInfo) -> Self {
        QueueInfo {
            name: q.name,
            format_name: q.format_name,
            transactional: q.transactional,
            messages: q.messages,
            bytes: q.bytes,
            in_flight: q.in_flight,
            quota_bytes: q.quota_bytes,
            label: q.label,
            created_ms: q.created_ms,
        }
    }
}

impl Client {
    /// Connects to the broker at `url` (e.g. `http://127.0.0.1:1801`).
    pub async fn connect(url: impl Into<String>) -> Result<Client> {
        let url = url.into();
        let connect_err = |reason: String| Error::Connect {
            url: url.clone(),
            reason,
        };
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| connect_err(format!("not a valid URL ({e})")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .initial_stream_window_size(Some(8 * 1024 * 1024))
            .initial_connection_window_size(Some(16 * 1024 * 1024));
        let channel = endpoint.connect().await.map_err(|e| {
            let mut reason = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                reason = s.to_string();
                src = s.source();
            }
            connect_err(reason)
        })?;
        let rpc = MessageQueueClient::new(channel)
            .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
            .max_encoding_message_size(mq_proto::MAX_GRPC_MESSAGE);
        Ok(Client { rpc, url })
    }

    /// The URL this client connected to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A handle to the queue (or multiple-element format name) `name`. The name is checked here;
    /// whether the queue exists is checked by each call.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        let parsed = FormatName::parse(name)?;
        Ok(Queue::new(self.clone(), name.to_string(), parsed))
    }

    /// Creates a queue.
    pub async fn create_queue(&self, name: &str, options: QueueOptions) -> Result<QueueInfo> {
        FormatName::parse(name)?;
        let req = v1::CreateQueueRequest {
            name: name.to_string(),
            transactional: options.transactional,
            quota_bytes: options.quota_bytes,
            label: options.label,
        };
        Ok(self
            .rpc
            .clone()
            .create_queue(req)
            .await?
            .into_inner()
            .into())
    }

    /// Deletes a queue and every message in it.
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        FormatName::parse(name)?;
        self.rpc
            .clone()
            .delete_queue(v1::QueueRequest {
                name: name.to_string(),
            })
            .await?;
        Ok(())
    }

    /// A queue's description and counters.
    pub async fn queue_info(&self, name: &str) -> Result<QueueInfo> {
        FormatName::parse(name)?;
        Ok(self
            .rpc
            .clone()
            .get_queue_info(v1::QueueRequest {
                name: name.to_string(),
            })
            .await?
            .into_inner()
            .into())
    }

    /// Every queue on the broker, sorted by name.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let r = self
            .rpc
            .clone()
            .list_queues(v1::ListQueuesRequest {})
            .await?;
        Ok(r.into_inner().queues.into_iter().map(Into::into).collect())
    }

    /// Removes every message waiting in a queue; returns how many.
    pub async fn purge(&self, name: &str) -> Result<u64> {
        FormatName::parse(name)?;
        let r = self
            .rpc
            .clone()
            .purge(v1::QueueRequest {
                name: name.to_string(),
            })
            .await?;
        Ok(r.into_inner().purged)
    }

    /// Begins a transaction (see [`Transaction`]).
    pub async fn begin(&self) -> Result<Transaction> {
        Transaction::begin(self).await
    }

    /// A pipelining sender to `destination` (a queue or a multiple-element format name).
    pub async fn sender(&self, destination: &str, options: SenderOptions) -> Result<Sender> {
        FormatName::parse(destination)?;
        Sender::open(self.clone(), destination.to_string(), options).await
    }
}
