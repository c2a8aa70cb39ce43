//! Broker configuration: what `mqd`'s flags set, with the documented defaults.

use std::path::PathBuf;

/// Default largest message body: 4 MiB, as MSMQ.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Default broker-wide memory quota for express messages: 1 GiB.
pub const DEFAULT_EXPRESS_QUOTA_BYTES: u64 = 1024 * 1024 * 1024;
/// Default broker-wide quota for recoverable message bytes on disk: 64 GiB.
pub const DEFAULT_STORAGE_QUOTA_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Default journal segment size: 64 MiB.
pub const DEFAULT_JOURNAL_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Default `mqd --journal-idle-spin` (`JournalOptions::idle_spin`): off. 200 us (longer than
/// the ~100-150 us from one commit's completion to a synchronous client's next commit on the
/// 2-core machine of docs/benchmarks.md, "The journal's writer awake between synchronous
/// commits") gave one-at-a-time transactions +7-20% in quiet minutes, not in every round, for
/// ~20% more mqd CPU a transaction and up to a third of a core under a trickle of lone
/// commits: an opt-in for synchronous-transaction workloads, not a default.
pub const DEFAULT_JOURNAL_IDLE_SPIN: std::time::Duration = std::time::Duration::ZERO;
/// Default first wait before retrying a failed forwarding connection.
pub const DEFAULT_FORWARD_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// Default longest wait between forwarding connection attempts.
pub const DEFAULT_FORWARD_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest label, in characters.
pub const MAX_LABEL_CHARS: usize = 250;
/// Largest correlation id, in characters.
pub const MAX_CORRELATION_ID_CHARS: usize = 255;
/// Bytes charged against quotas for each recoverable message besides its body, label,
/// correlation id, response queue and admin queue.
pub const MESSAGE_OVERHEAD_BYTES: u64 = 128;
/// The same for an express message, which lives in memory: what one costs there beside those
/// bytes (its `StoredMessage` ~240 B, the `Arc` around it, its 24 B queue entry and its index
/// entries). Measured: 1,000,000 empty express messages took mqd from 14 to 333 MiB, 334 B each;
/// charged 128 B, the express quota (1 GiB) let tiny messages take ~2.6 GB.
pub const EXPRESS_OVERHEAD_BYTES: u64 = 384;
/// Default: an empty outgoing queue unused this long is deleted.
pub const DEFAULT_OUTGOING_IDLE_EXPIRY: std::time::Duration = std::time::Duration::from_secs(3600);
/// Default most outgoing queues (destination brokers) at once.
pub const DEFAULT_MAX_OUTGOING_QUEUES: usize = 10_000;
/// Default most queues (subqueues included) a broker holds.
pub const DEFAULT_MAX_QUEUES: usize = 200_000;
/// Default most incoming forwarding streams kept per peer (sending address).
pub const DEFAULT_MAX_FORWARD_STREAMS_PER_PEER: usize = 256;
/// Default most incoming forwarding streams kept in all.
pub const DEFAULT_MAX_FORWARD_STREAMS: usize = 4096;
/// Default: an incoming forwarding stream unused this long is forgotten (with its mark).
pub const DEFAULT_FORWARD_STREAM_IDLE: std::time::Duration =
    std::time::Duration::from_secs(24 * 3600);

// Flow limits (README "Limits"): what one client or connection can hold of the broker.
/// Default most open client connections (`mqd --max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default most concurrent HTTP/2 streams (calls) per connection.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Room above the body limit for one gRPC message: a batch's other messages (sends are cut at
/// 1 MiB, deliveries and forwards at 4 MiB of bodies) and every header field.
pub const GRPC_HEADROOM_BYTES: usize = 8 * 1024 * 1024;
/// Largest HTTP/2 header block a client may send (hyper's default, made explicit).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Default most delivered, unacknowledged messages per receive stream.
pub const DEFAULT_MAX_UNACKED_PER_STREAM: u64 = 10_000;
/// Default most delivered, unacknowledged messages per connection (all its receive streams).
pub const DEFAULT_MAX_UNACKED_PER_CONNECTION: u64 = 50_000;
/// Default time a receiver may hold a delivered message without acknowledging it.
pub const DEFAULT_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// Default most bytes one transaction may stage (its sends, held in memory until commit).
pub const DEFAULT_MAX_TX_BYTES: u64 = 64 * 1024 * 1024;
/// Default most bytes all open transactions together may stage.
pub const DEFAULT_MAX_TX_TOTAL_BYTES: u64 = 512 * 1024 * 1024;
/// Default most messages (sends and receives) in one transaction.
pub const DEFAULT_MAX_TX_MESSAGES: u64 = 100_000;
/// Default most open transactions per connection.
pub const DEFAULT_MAX_TX_PER_CONNECTION: usize = 64;
/// Default most messages in one send batch, transactional send or forwarded batch.
pub const DEFAULT_MAX_BATCH_MESSAGES: usize = mq_proto::entries::DEFAULT_MAX_BATCH_MESSAGES;
/// The most `--max-tx-messages` may be: a commit's answer names every send of its
/// transaction, and a client decodes at most this many names in one answer.
pub const MAX_MAX_TX_MESSAGES: u64 = mq_proto::entries::MAX_TX_MESSAGES;
/// The least `--max-batch-messages` may be: a forwarding broker sends batches of up to 512.
pub const MIN_MAX_BATCH_MESSAGES: usize = 512;
/// Most queues in one page of a queue list, gRPC `ListQueues` (whatever its `page_size`) and
/// `GET /api/v1/queues?limit=`: 10,000 queues are a few MB of JSON, ~0.9 MB of protobuf.
pub const MAX_QUEUE_PAGE: usize = 10_000;
/// Most messages in one `Peek` response (a page; the client asks for the next).
pub const PEEK_PAGE_MESSAGES: usize = 1000;
/// Default most open cursors per connection (mqd --max-cursors-per-connection).
pub const DEFAULT_MAX_CURSORS_PER_CONNECTION: usize = 64;
/// Default idle time after which a cursor is closed (mqd --cursor-idle-secs).
pub const DEFAULT_CURSOR_IDLE: std::time::Duration = std::time::Duration::from_secs(300);
/// Default time a `Transact` stream may wait with no transaction open before the broker ends
/// it (mqd --tx-stream-idle); clients keep idle streams for less (mq-client: 30 s).
pub const DEFAULT_TX_STREAM_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// A `Peek` page is cut once its bodies reach this size (at least one message per page).
pub const PEEK_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// What a broker needs to know to run.
#[derive(Clone)]
pub struct BrokerConfig {
    /// The broker's own name; format names with this host are local. Defaults to the host name.
    pub name: String,
    /// Other names and addresses of this broker (host names or IP addresses: a DNS alias, a
    /// NAT address); format names with these hosts are local too, like `name`.
    pub aliases: Vec<String>,
    /// Directory for durable state. Created if missing; one broker per directory (locked).
    pub data_dir: PathBuf,
    /// Largest accepted message body, in bytes.
    pub max_body_bytes: usize,
    /// Broker-wide quota of express message bytes held in memory.
    pub express_quota_bytes: u64,
    /// Broker-wide quota of recoverable message bytes stored in the journal.
    pub storage_quota_bytes: u64,
    /// Size of each preallocated journal segment file.
    pub journal_segment_bytes: u64,
    /// Bytes of recently written recoverable bodies kept in memory, so that a receiver that
    /// keeps up is served without reading the disk (`JournalOptions::body_cache_bytes`).
    pub journal_body_cache_bytes: u64,
    /// How long the journal's writer looks for the next record after a lone small one before
    /// it sleeps (`JournalOptions::idle_spin`; zero: at once). Default
    /// [`DEFAULT_JOURNAL_IDLE_SPIN`].
    pub journal_idle_spin: std::time::Duration,
    /// A transaction's commit is written and synced by the task that commits it when the
    /// journal's writer is idle (`JournalOptions::inline_commits`). Default true.
    pub journal_inline_commits: bool,
    /// Messages each priority level of an application queue keeps with their headers in
    /// memory; the recoverable messages waiting after them keep only their position, and
    /// their headers are read back from the journal when needed. 0: every header stays in
    /// memory.
    pub queue_header_window: usize,
    /// Most headers the windows of all queues that page together keep in memory: each level
    /// of each such queue keeps `budget / (8 × queues)`, at most `queue_header_window`, at
    /// least one (`crate::header_windows`).
    pub max_window_headers: usize,
    /// Open even when the journal's last segment is damaged before records written after the
    /// damage, dropping them (logged). Off: the broker refuses to start.
    pub truncate_damaged_journal: bool,
    /// Storage under the journal; `None` = real files. Tests pass a
    /// [`crate::journal::FaultyIo`] to fail or "crash" at a chosen sync.
    pub journal_io: Option<std::sync::Arc<dyn crate::journal::Io>>,
    /// A transaction open longer than this is aborted.
    pub tx_timeout: std::time::Duration,
    /// How long a graceful shutdown waits for open streams before closing them.
    pub shutdown_grace: std::time::Duration,
    /// How long the ids of committed transactions are remembered (`TransactionOutcome`).
    pub tx_outcome_retention: std::time::Duration,
    /// Most committed transaction ids remembered (the oldest are forgotten first).
    pub tx_outcome_max: usize,
    /// First wait before retrying a failed forwarding connection (doubles each failure).
    pub forward_retry_min: std::time::Duration,
    /// Longest wait between forwarding connection attempts.
    pub forward_retry_max: std::time::Duration,
    /// Longest a destination broker may take to answer a forwarding stream or acknowledge its
    /// oldest batch in flight; past it the connection is given up and retried.
    pub forward_ack_timeout: std::time::Duration,
    /// Security: users file, TLS, protected mode, forwarding credentials (see `auth`).
    pub security: crate::tls::SecurityConfig,
    /// Flow limits: see [`FlowLimits`].
    pub flow: FlowLimits,
    /// Most elements in a multiple-element format name a send may use.
    pub max_format_name_elements: usize,
    /// An empty, unpaused outgoing queue unused this long is deleted.
    pub outgoing_idle_expiry: std::time::Duration,
    /// Most outgoing queues (destination brokers) at once.
    pub max_outgoing_queues: usize,
    /// Most queues (subqueues included); a create beyond it is refused.
    pub max_queues: usize,
    /// Most bytes all queues' ACLs together may hold (each entry its principal and 64 bytes);
    /// a grant past it is refused.
    pub max_acl_bytes: u64,
    /// Most incoming forwarding streams kept per peer address.
    pub max_forward_streams_per_peer: usize,
    /// Most incoming forwarding streams kept in all.
    pub max_forward_streams: usize,
    /// An incoming forwarding stream unused this long is forgotten.
    pub forward_stream_idle: std::time::Duration,
    /// The HTTP port (`/metrics`, `/healthz`, `/readyz`); `None`: no HTTP server.
    pub http_listen: Option<std::net::SocketAddr>,
    /// Serve the HTTP port on a non-loopback address without TLS and a users file.
    pub http_insecure: bool,
    /// Most open connections on the HTTP port; more are closed as they are accepted.
    pub http_max_connections: usize,
    /// An HTTP connection that moves no byte for this long is closed.
    pub http_idle_timeout: std::time::Duration,
    /// A request on the HTTP port must be whole this long after its first byte.
    pub http_request_timeout: std::time::Duration,
    /// Also serve gRPC on this Unix socket (clients on this machine: `unix:PATH`).
    pub unix_socket: Option<std::path::PathBuf>,
    /// A caller on the Unix socket without credentials is the user named as its operating
    /// system account (`SO_PEERCRED`), not anonymous.
    pub unix_socket_os_users: bool,
}

/// Default [`BrokerConfig::queue_header_window`].
pub const DEFAULT_QUEUE_HEADER_WINDOW: usize = 4096;

/// What one client, connection or stream may hold of the broker (README "Limits").
#[derive(Debug, Clone)]
pub struct FlowLimits {
    /// Most open client connections; more are closed at once (or the oldest that has made
    /// no request is closed for them).
    pub max_connections: usize,
    /// Most open client connections from one IP address (more are closed at once); `None`:
    /// no limit of its own.
    pub max_connections_per_address: Option<usize>,
    /// Most concurrent HTTP/2 streams per connection (more wait, HTTP/2 flow control).
    pub max_streams_per_connection: u32,
    /// Most delivered, unacknowledged messages per receive stream, whatever credit it grants.
    pub max_unacked_per_stream: u64,
    /// Most delivered, unacknowledged messages per connection.
    pub max_unacked_per_connection: u64,
    /// Most bytes of deliveries (bodies, texts and 256 B a message) the receive streams of one
    /// connection hold before HTTP/2 has written them, i.e. before the client has read them;
    /// past it they take no more messages until it reads. Raised to at least one stream's
    /// budget (16 MiB, or two of the largest batches: 2 × (--max-body-bytes + 256 B)).
    pub max_unsent_bytes_per_connection: u64,
    /// The same for all connections together, beyond one batch a connection (each connection
    /// may hold one batch whatever the others hold). Raised to at least one connection's.
    pub max_unsent_bytes: u64,
    /// A receive stream holding a delivered message this long without acknowledging it is
    /// ended and its unacknowledged messages go back to the queue.
    pub ack_timeout: std::time::Duration,
    /// Most bytes one transaction may stage.
    pub max_tx_bytes: u64,
    /// Most bytes all open transactions together may stage.
    pub max_tx_total_bytes: u64,
    /// Most messages (sends and receives) in one transaction.
    pub max_tx_messages: u64,
    /// Most open transactions per connection.
    pub max_tx_per_connection: usize,
    /// Most open cursors (browse streams) per connection.
    pub max_cursors_per_connection: usize,
    /// A cursor with no request for this long is closed.
    pub cursor_idle: std::time::Duration,
    /// A `Transact` stream with no transaction open (before its first or between two) for
    /// this long is ended cleanly by the broker.
    pub tx_stream_idle: std::time::Duration,
    /// Most messages in one `SendRequest`, `TxSend` or `ForwardRequest`; a bigger one ends its
    /// stream with one refusal.
    pub max_batch_messages: usize,
    /// Most bytes of request messages received in part (not yet whole) on one connection; the
    /// stream whose bytes go over it is ended with RESOURCE_EXHAUSTED. At least one gRPC
    /// message ([`BrokerConfig::grpc_message_limit`]): raised to it.
    pub max_partial_bytes_per_connection: u64,
    /// The same, broker-wide (raised to at least the per-connection limit).
    pub max_partial_bytes: u64,
    /// A request message whose first byte came must be whole this long after it, or its stream
    /// is ended with DEADLINE_EXCEEDED; a Receive, Browse or Forward stream's first request
    /// must come within as long of its opening.
    pub message_arrival_timeout: std::time::Duration,
    /// HTTP/2 flow-control window of each request stream: how many bytes a client may send on
    /// one stream that the broker has not read yet (held in memory until it does).
    pub http2_stream_window: u32,
    /// The same for all the streams of one connection together: with
    /// [`FlowLimits::max_connections`] it bounds the unread request data the broker may hold
    /// (connections × this).
    pub http2_connection_window: u32,
}

/// Default [`FlowLimits::http2_stream_window`]: 8 MiB.
pub const DEFAULT_HTTP2_STREAM_WINDOW: u32 = 8 << 20;
/// Default [`FlowLimits::http2_connection_window`]: 16 MiB.
pub const DEFAULT_HTTP2_CONNECTION_WINDOW: u32 = 16 << 20;
/// The smallest HTTP/2 window (the protocol's initial one, RFC 9113 §6.9.2).
pub const MIN_HTTP2_WINDOW: u32 = 65_535;
/// The largest HTTP/2 window (RFC 9113 §6.9.1: 2^31 − 1).
pub const MAX_HTTP2_WINDOW: u32 = (1 << 31) - 1;

/// Default [`FlowLimits::max_partial_bytes_per_connection`]: 64 MiB.
pub const DEFAULT_MAX_PARTIAL_BYTES_PER_CONNECTION: u64 = 64 << 20;
/// Default [`FlowLimits::max_partial_bytes`]: 512 MiB.
pub const DEFAULT_MAX_PARTIAL_BYTES: u64 = 512 << 20;
/// Default [`FlowLimits::message_arrival_timeout`]: 120 s.
pub const DEFAULT_MESSAGE_ARRIVAL_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(120);

impl FlowLimits {
    /// The HTTP/2 windows in force, (stream, connection): each within
    /// [`MIN_HTTP2_WINDOW`]..=[`MAX_HTTP2_WINDOW`], the stream's at most the connection's.
    pub fn http2_windows(&self) -> (u32, u32) {
        let connection = self
            .http2_connection_window
            .clamp(MIN_HTTP2_WINDOW, MAX_HTTP2_WINDOW);
        let stream = self
            .http2_stream_window
            .clamp(MIN_HTTP2_WINDOW, MAX_HTTP2_WINDOW)
            .min(connection);
        (stream, connection)
    }
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: None,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_unacked_per_stream: DEFAULT_MAX_UNACKED_PER_STREAM,
            max_unacked_per_connection: DEFAULT_MAX_UNACKED_PER_CONNECTION,
            max_unsent_bytes_per_connection: crate::unsent::DEFAULT_MAX_UNSENT_BYTES_PER_CONNECTION,
            max_unsent_bytes: crate::unsent::DEFAULT_MAX_UNSENT_BYTES,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            max_tx_bytes: DEFAULT_MAX_TX_BYTES,
            max_tx_total_bytes: DEFAULT_MAX_TX_TOTAL_BYTES,
            max_tx_messages: DEFAULT_MAX_TX_MESSAGES,
            max_tx_per_connection: DEFAULT_MAX_TX_PER_CONNECTION,
            max_cursors_per_connection: DEFAULT_MAX_CURSORS_PER_CONNECTION,
            cursor_idle: DEFAULT_CURSOR_IDLE,
            tx_stream_idle: DEFAULT_TX_STREAM_IDLE,
            max_batch_messages: DEFAULT_MAX_BATCH_MESSAGES,
            max_partial_bytes_per_connection: DEFAULT_MAX_PARTIAL_BYTES_PER_CONNECTION,
            max_partial_bytes: DEFAULT_MAX_PARTIAL_BYTES,
            message_arrival_timeout: DEFAULT_MESSAGE_ARRIVAL_TIMEOUT,
            http2_stream_window: DEFAULT_HTTP2_STREAM_WINDOW,
            http2_connection_window: DEFAULT_HTTP2_CONNECTION_WINDOW,
        }
    }
}

impl BrokerConfig {
    /// A configuration with defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        BrokerConfig {
            name: default_name(),
            aliases: Vec::new(),
            data_dir: data_dir.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            express_quota_bytes: DEFAULT_EXPRESS_QUOTA_BYTES,
            storage_quota_bytes: DEFAULT_STORAGE_QUOTA_BYTES,
            journal_segment_bytes: DEFAULT_JOURNAL_SEGMENT_BYTES,
            journal_body_cache_bytes: crate::journal::DEFAULT_BODY_CACHE_BYTES,
            journal_idle_spin: DEFAULT_JOURNAL_IDLE_SPIN,
            journal_inline_commits: true,
            queue_header_window: DEFAULT_QUEUE_HEADER_WINDOW,
            max_window_headers: crate::header_windows::DEFAULT_MAX_WINDOW_HEADERS,
            truncate_damaged_journal: false,
            journal_io: None,
            tx_timeout: std::time::Duration::from_secs(60),
            shutdown_grace: std::time::Duration::from_secs(5),
            tx_outcome_retention: crate::outcome::DEFAULT_TX_OUTCOME_RETENTION,
            tx_outcome_max: crate::outcome::DEFAULT_TX_OUTCOME_MAX,
            forward_retry_min: DEFAULT_FORWARD_RETRY_MIN,
            forward_retry_max: DEFAULT_FORWARD_RETRY_MAX,
            forward_ack_timeout: std::time::Duration::from_secs(60),
            security: Default::default(),
            flow: FlowLimits::default(),
            max_format_name_elements: mq_proto::limits::DEFAULT_MAX_FORMAT_NAME_ELEMENTS,
            outgoing_idle_expiry: DEFAULT_OUTGOING_IDLE_EXPIRY,
            max_outgoing_queues: DEFAULT_MAX_OUTGOING_QUEUES,
            max_queues: DEFAULT_MAX_QUEUES,
            max_acl_bytes: crate::auth::MAX_ACL_BYTES,
            max_forward_streams_per_peer: DEFAULT_MAX_FORWARD_STREAMS_PER_PEER,
            max_forward_streams: DEFAULT_MAX_FORWARD_STREAMS,
            forward_stream_idle: DEFAULT_FORWARD_STREAM_IDLE,
            http_listen: None,
            unix_socket: None,
            unix_socket_os_users: false,
            http_insecure: false,
            http_max_connections: 256,
            http_idle_timeout: std::time::Duration::from_secs(60),
            http_request_timeout: std::time::Duration::from_secs(30),
        }
    }

    /// Largest gRPC message the broker decodes or encodes: the body limit plus headroom.
    pub fn grpc_message_limit(&self) -> usize {
        self.max_body_bytes.saturating_add(GRPC_HEADROOM_BYTES)
    }
}

/// The machine's host name (from `/proc/sys/kernel/hostname` or `$HOSTNAME`), else "localhost".
pub fn default_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("name", &self.name)
            .field("data_dir", &self.data_dir)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("express_quota_bytes", &self.express_quota_bytes)
            .field("storage_quota_bytes", &self.storage_quota_bytes)
            .field("journal_segment_bytes", &self.journal_segment_bytes)
            .field("journal_body_cache_bytes", &self.journal_body_cache_bytes)
            .field("journal_idle_spin", &self.journal_idle_spin)
            .field("journal_inline_commits", &self.journal_inline_commits)
            .field("queue_header_window", &self.queue_header_window)
            .field("max_window_headers", &self.max_window_headers)
            .field("truncate_damaged_journal", &self.truncate_damaged_journal)
            .field("faulty_journal_io", &self.journal_io.is_some())
            .field("tx_timeout", &self.tx_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("tx_outcome_retention", &self.tx_outcome_retention)
            .field("tx_outcome_max", &self.tx_outcome_max)
            .field("forward_retry_min", &self.forward_retry_min)
            .field("forward_retry_max", &self.forward_retry_max)
            .field("forward_ack_timeout", &self.forward_ack_timeout)
            .field("security", &self.security)
            .field("flow", &self.flow)
            .field("max_format_name_elements", &self.max_format_name_elements)
            .field("outgoing_idle_expiry", &self.outgoing_idle_expiry)
            .field("max_outgoing_queues", &self.max_outgoing_queues)
            .field("max_queues", &self.max_queues)
            .field(
                "max_forward_streams_per_peer",
                &self.max_forward_streams_per_peer,
            )
            .field("max_forward_streams", &self.max_forward_streams)
            .field("forward_stream_idle", &self.forward_stream_idle)
            .field("http_listen", &self.http_listen)
            .field("unix_socket", &self.unix_socket)
            .field("unix_socket_os_users", &self.unix_socket_os_users)
            .field("http_insecure", &self.http_insecure)
            .field("http_max_connections", &self.http_max_connections)
            .field("http_idle_timeout", &self.http_idle_timeout)
            .field("http_request_timeout", &self.http_request_timeout)
            .finish()
    }
}
