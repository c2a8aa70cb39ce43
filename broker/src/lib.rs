//! `mq-broker`: the mq message-queue broker as a library, and the `mqd` daemon around it.
//!
//! A broker holds queues addressed by MSMQ path and format names, stores messages by priority
//! (express: in memory), and serves the `mq.v1` gRPC protocol with streamed, batched sends and
//! credit-paced streaming receives. It is not a client: see `mq-client`.
//!
//! # Layout
//! - `config`: [`BrokerConfig`] and the documented limits.
//! - `acks`: acknowledgements to an administration queue (MSMQ classes), posted with their event.
//! - [`config_file`]: `mqd`'s config file and `MQD_*` variables, derived from its flags.
//! - `flow`: live connections and what each holds (transactions, unacknowledged deliveries).
//! - `error`: [`BrokerError`] and its one mapping to gRPC status.
//! - `message`: [`StoredMessage`], validation of what senders send.
//! - `queue`: [`Queue`]: priority levels, delivery, acknowledgement, give-back.
//! - `index`: a queue's ready messages by id and correlation id (built on first lookup).
//! - `cursor`: MSMQ cursors (peek current, peek next, receive current) on a browse stream.
//! - `props`: queue properties changed after creation (`SetQueueProperties`).
//! - `broker`: [`Broker`]: the registry of queues, name resolution, quotas, recovery.
//! - [`journal`]: the durable journal: segments, group commit, recovery, compaction.
//! - `transaction`: [`Transaction`]: staged sends, hidden receives, one atomic commit record.
//! - `outcome`: which transaction ids committed (journaled with the commit, kept for a window).
//! - `tx_stream`: the id of a pipelined transactional send stream (one transaction per message).
//! - `service`: the gRPC service.
//! - `server`: [`run`]: bind, serve, graceful shutdown.
//! - `journal_queue`: queue journals (`Q;JOURNAL`, target journaling) and `SYSTEM$;JOURNAL`
//!   (source journaling).
//! - `subqueue`: subqueues (`Q;name`), moving a message by id, dead-letter replay, poison messages.
//! - `auth`: identities (users file, tokens, certificates), rights, queue ACLs, `authorize`.
//! - `tls`: [`SecurityConfig`]: TLS, protected mode, forwarding credentials.
//! - `memtrim`: after a burst is drained, malloc's free pages go back to the system.
//! - `receive_acks`: per-message acknowledgements waiting on a receive stream are applied as one.
//! - `ready`: [`Readiness`] (recovered, serving, shutting down) and gRPC health.
//! - `metrics`, `histogram`: counters and the Prometheus collector; `http`: the HTTP port.
//! - `http_api`: the JSON API under `/api/v1/`; `console`: the web console; `http_tls`: HTTPS;
//!   `preview`: message bodies shown to people.
//! - `fuzzing` (tests and the `fuzzing` feature): entry points of the fuzz targets in `fuzz/`.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = mq_broker::BrokerConfig::new("/tmp/mq-data");
//! mq_broker::run(listener, config, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod acks;
mod auth;
mod auth_layer;
mod broker;
mod config;
pub mod config_file;
mod console;
mod counters_store;
mod cursor;
mod deadletter;
mod error;
mod flow;
mod forward;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod header_windows;
mod histogram;
mod http;
mod http_api;
mod http_conns;
mod http_tls;
mod inbound;
mod index;
mod info;
pub mod journal;
mod journal_queue;
mod large_bodies;
mod memtrim;
mod message;
mod metrics;
mod outcome;
mod outgoing_admin;
mod partial_requests;
mod prefault;
mod preview;
mod props;
mod queue;
mod queue_count;
mod ratelog;
mod ready;
mod receive_acks;
mod refused_seqs;
mod rich_error;
mod server;
mod service;
mod stream_bounds;
mod subqueue;
mod taken;
mod tls;
mod transaction;
mod tx_reuse;
mod tx_stream;
mod unsent;

pub use auth::{add_user, hash_password, Acl, Identity, Right, Rights};
pub use broker::{Broker, Destinations, RecoveryReport, Target};
pub use config::{
    default_name, BrokerConfig, DEFAULT_EXPRESS_QUOTA_BYTES, DEFAULT_JOURNAL_IDLE_SPIN,
    DEFAULT_JOURNAL_SEGMENT_BYTES, DEFAULT_MAX_BODY_BYTES, DEFAULT_QUEUE_HEADER_WINDOW,
    DEFAULT_STORAGE_QUOTA_BYTES, MAX_CORRELATION_ID_CHARS, MAX_LABEL_CHARS,
};
pub use config::{
    FlowLimits, MAX_HTTP2_WINDOW, MAX_MAX_TX_MESSAGES, MIN_HTTP2_WINDOW, MIN_MAX_BATCH_MESSAGES,
    PEEK_PAGE_BYTES, PEEK_PAGE_MESSAGES,
};
pub use config::{
    DEFAULT_MAX_FORWARD_STREAMS, DEFAULT_MAX_FORWARD_STREAMS_PER_PEER, DEFAULT_MAX_OUTGOING_QUEUES,
    DEFAULT_MAX_QUEUES,
};
pub use deadletter::class_name;
pub use error::BrokerError;
pub use journal_queue::DEFAULT_JOURNAL_QUOTA_BYTES;
pub use memtrim::{
    allocator, on_worker_park, rss_bytes_of, trim as trim_memory, tune_allocator, Allocator,
};
pub use message::{Delivery, StoredMessage, DEFAULT_PRIORITY, MAX_PRIORITY};
pub use outcome::{DEFAULT_TX_OUTCOME_MAX, DEFAULT_TX_OUTCOME_RETENTION};
pub use prefault::{Prefaulting, POPULATE_MAX, POPULATE_MIN};
pub use queue::{Queue, QueueStats, QueueTotals};
pub use ready::Readiness;
pub use server::{run, run_with_ready, RunError};
pub use tls::{Credentials, ForwardCredentials, SecurityConfig, TLS_HANDSHAKE_TIMEOUT};
pub use transaction::{Committed, Transaction};
