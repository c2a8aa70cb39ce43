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
/// Default first wait before retrying a failed forwarding connection.
pub const DEFAULT_FORWARD_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// Default longest wait between forwarding connection attempts.
pub const DEFAULT_FORWARD_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest label, in characters.
pub const MAX_LABEL_CHARS: usize = 250;
/// Largest correlation id, in characters.
pub const MAX_CORRELATION_ID_CHARS: usize = 255;
/// Bytes charged against quotas for each message besides its body and label.
pub const MESSAGE_OVERHEAD_BYTES: u64 = 128;

/// What a broker needs to know to run.
#[derive(Clone)]
pub struct BrokerConfig {
    /// The broker's own name; format names with this host are local. Defaults to the host name.
    pub name: String,
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
}

impl BrokerConfig {
    /// A configuration with defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        BrokerConfig {
            name: default_name(),
            data_dir: data_dir.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            express_quota_bytes: DEFAULT_EXPRESS_QUOTA_BYTES,
            storage_quota_bytes: DEFAULT_STORAGE_QUOTA_BYTES,
            journal_segment_bytes: DEFAULT_JOURNAL_SEGMENT_BYTES,
            journal_io: None,
            tx_timeout: std::time::Duration::from_secs(60),
            shutdown_grace: std::time::Duration::from_secs(5),
            tx_outcome_retention: crate::outcome::DEFAULT_TX_OUTCOME_RETENTION,
            tx_outcome_max: crate::outcome::DEFAULT_TX_OUTCOME_MAX,
            forward_retry_min: DEFAULT_FORWARD_RETRY_MIN,
            forward_retry_max: DEFAULT_FORWARD_RETRY_MAX,
        }
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
            .field("faulty_journal_io", &self.journal_io.is_some())
            .field("tx_timeout", &self.tx_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("tx_outcome_retention", &self.tx_outcome_retention)
            .field("tx_outcome_max", &self.tx_outcome_max)
            .field("forward_retry_min", &self.forward_retry_min)
            .field("forward_retry_max", &self.forward_retry_max)
            .finish()
    }
}
