//! [`Client`]: a connection to one broker, queue administration, and handles to queues.

use std::time::Duration;

use mq_proto::format_name::FormatName;
use mq_proto::v1::{self, message_queue_client::MessageQueueClient};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::outgoing::OutgoingQueue;
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

    /// The broker's outgoing queues (store-and-forward: one per destination broker that this
    /// broker has messages for, or had since it started), with their state and counters.
    pub async fn outgoing(&self) -> Result<Vec<OutgoingQueue>> {
        let r = self.rpc.clone().list_outgoing(v1::Empty {}).await?;
        Ok(r.into_inner().queues.into_iter().map(Into::into).collect())
    }

    /// Pauses forwarding to a destination broker (state [`OnHold`](crate::OutgoingState::OnHold)):
    /// messages for it wait in its outgoing queue until [`Client::resume_outgoing`]. Time limits
    /// keep running while it is paused. `destination` is `host:port` as [`Client::outgoing`]
    /// shows it, or the format name of any queue on that broker. Returns the queue's new state.
    pub async fn pause_outgoing(&self, destination: &str) -> Result<OutgoingQueue> {
        let req = outgoing_request(destination)?;
        Ok(self
            .rpc
            .clone()
            .pause_outgoing(req)
            .await?
            .into_inner()
            .into())
    }

    /// Resumes forwarding to a destination broker paused by [`Client::pause_outgoing`]; the
    /// broker connects at once. `destination` as for [`Client::pause_outgoing`]. Returns the
    /// queue's new state.
    pub async fn resume_outgoing(&self, destination: &str) -> Result<OutgoingQueue> {
        let req = outgoing_request(destination)?;
        Ok(self
            .rpc
            .clone()
            .resume_outgoing(req)
            .await?
            .into_inner()
            .into())
    }

    /// Deletes the outgoing queue for a destination broker; refused (`FailedPrecondition`)
    /// while it holds messages. The next send to that broker creates a new one (empty ones
    /// also expire after `mqd --outgoing-idle-expiry`). `destination` as for
    /// [`Client::pause_outgoing`].
    pub async fn delete_outgoing(&self, destination: &str) -> Result<()> {
        let req = outgoing_request(destination)?;
        self.rpc.clone().delete_outgoing(req).await?;
        Ok(())
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

/// The request naming an outgoing queue: `host:port`, or a queue name (checked here, like every
/// other queue name, before anything is sent).
fn outgoing_request(destination: &str) -> Result<v1::OutgoingRequest> {
    let destination = destination.trim();
    if destination.is_empty() {
        return Err(Error::InvalidArgument(
            "no destination given: name the destination broker as host:port (as `mq outgoing \
             list` shows it) or give the format name of a queue on it"
                .to_string(),
        ));
    }
    if destination.contains(['\\', '/', '=']) {
        FormatName::parse(destination)?;
    }
    Ok(v1::OutgoingRequest {
        destination: destination.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_request_accepts_host_port_and_format_names() {
        assert_eq!(
            outgoing_request(" 10.0.0.5:1802 ").unwrap().destination,
            "10.0.0.5:1802"
        );
        let name = r"DIRECT=TCP:10.0.0.5:1802\private$\orders";
        assert_eq!(outgoing_request(name).unwrap().destination, name);
    }

    #[test]
    fn outgoing_request_refuses_empty_and_bad_names() {
        assert!(matches!(
            outgoing_request("  "),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            outgoing_request(r"DIRECT=BOGUS:host\private$\q"),
            Err(Error::InvalidName(_))
        ));
    }
}
