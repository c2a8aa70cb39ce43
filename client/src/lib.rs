//! `mq-client`: the async client of the mq message-queue broker, its body formatters, and the
//! `mq` command line.
//!
//! It talks to one broker (`mqd`) over gRPC. Sends are pipelined and batched ([`Sender`]);
//! receives stream with a prefetch window ([`Consumer`]). It is not a broker: see `mq-broker`.
//!
//! # Layout
//! - `client`: [`Client`]: connect, queue administration, outgoing queues, queue rights,
//!   transaction outcomes.
//! - `builder`: [`ClientBuilder`]: TLS (CA, client certificate) and credentials.
//! - `deadline`: [`ClientOptions`]: call deadlines and HTTP/2 keepalive.
//! - `queue`: [`Queue`]: send, receive, peek, purge one queue.
//! - `sender`: [`Sender`]: pipelined sends with acknowledgements.
//! - `transaction`: [`Transaction`]: atomic sends and receives across transactional queues.
//! - `consumer`: [`Consumer`]: streaming receives with prefetch and acknowledgement.
//! - `cursor`: [`Cursor`]: MSMQ cursors: peek current, peek next, receive current.
//! - `message`: [`Message`] (builder) and [`ReceivedMessage`] (with [`DeadLetterInfo`]).
//! - `outgoing`: [`OutgoingQueue`], [`OutgoingState`]: store-and-forward to other brokers.
//! - [`stats`]: queue rates between two snapshots (`mq stats`).
//! - [`formatter`]: typed bodies: binary (postcard), XML, JSON, raw, manual.
//! - `error`: [`Error`].
//!
//! # Example
//! ```no_run
//! # async fn demo() -> mq_client::Result<()> {
//! use std::time::Duration;
//! use mq_client::{Client, Message, QueueOptions};
//!
//! let client = Client::connect("http://127.0.0.1:1801").await?;
//! client.create_queue(r".\private$\orders", QueueOptions::default()).await?;
//! let orders = client.queue(r".\private$\orders")?;
//! let id = orders.send(Message::new("order 1").label("new order").priority(5)).await?;
//! let got = orders.receive(Duration::from_secs(1)).await?.expect("a message");
//! assert_eq!(got.id, id);
//! # Ok(()) }
//! ```

mod builder;
mod client;
mod consumer;
mod cursor;
mod deadline;
mod error;
pub mod formatter;
mod large_sends;
mod message;
mod outgoing;
mod queue;
mod queue_kinds;
mod send_pool;
mod sender;
pub mod stats;
mod transaction;
mod tx_pool;

pub use builder::ClientBuilder;
pub use client::{Client, QueueAcl, QueueInfo, QueueOptions, QueueProperties, DEFAULT_BROKER_URL};
pub use consumer::{Consumer, ConsumerOptions, DEFAULT_CLOSE_TIMEOUT};
pub use cursor::Cursor;
pub use deadline::{ClientOptions, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT};
pub use error::{Error, Result};
pub use message::{DeadLetterClass, DeadLetterInfo, Delivery, Message, MessageId, ReceivedMessage};
pub use mq_proto::ack;
pub use mq_proto::format_name;
/// What [`Client::broker_info`] returns (the wire message).
pub use mq_proto::v1::BrokerInfo;
/// The protocol revision this client speaks (compare with [`BrokerInfo::protocol_version`]).
pub use mq_proto::PROTOCOL_VERSION;
pub use outgoing::{OutgoingQueue, OutgoingState};
pub use queue::{PeekCursor, PeekPage, Queue};
pub use sender::{Receipt, SendSummary, Sender, SenderOptions};
pub use transaction::{CommitOnce, Transaction, TxId, TxOutcome, TxStatus};
