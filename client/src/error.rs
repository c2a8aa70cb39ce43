//! The client's error type.

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Everything a client call can fail with. Each message says what happened and, where it helps,
/// what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No broker answered at the URL.
    #[error("cannot reach the broker at {url}: {reason}; is mqd running there? (set --broker or MQ_BROKER)")]
    Connect { url: String, reason: String },
    /// A queue or format name is malformed (checked before anything is sent).
    #[error(transparent)]
    InvalidName(#[from] mq_proto::format_name::FormatNameError),
    /// The broker refused the input (label too long, priority 8, body too large, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such queue.
    #[error("{0}")]
    NotFound(String),
    /// The queue exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// A quota is full; nothing was stored.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The operation does not apply (read-only queue, transactional mismatch, remote queue, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The broker is shutting down or the connection was lost.
    #[error("{0}")]
    Unavailable(String),
    /// The transaction was aborted by the broker (timeout, shutdown) instead of committed.
    #[error("{0}")]
    Aborted(String),
    /// A wait timed out: the text says what was not confirmed (and which timeout to raise).
    /// The outcome of what was asked is unknown.
    #[error("{0}")]
    Timeout(String),
    /// The broker failed internally, or answered something this client does not understand.
    #[error("{0}")]
    Internal(String),
    /// No or bad credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// The identity lacks a right; the text names the identity, the right and the queue.
    #[error("{0}")]
    PermissionDenied(String),
    /// The commit's answer was lost (the connection broke, or no answer within the deadline)
    /// after the commit was sent: the transaction may or may not have committed. Ask with
    /// `Client::transaction_outcome(id)` (`mq tx status ID`), or retry with
    /// `Client::commit_once(id, ..)`, which commits at most once.
    #[error("the outcome of transaction {id} is unknown ({reason}); it may or may not have committed: ask with `mq tx status {id}`, or retry with the same id (commits at most once)")]
    InDoubt {
        id: crate::transaction::TxId,
        reason: String,
    },
    /// A transaction with this id already committed (an earlier attempt whose answer was lost);
    /// nothing was done this time.
    #[error("transaction {id} was already committed; nothing was done this time")]
    AlreadyCommitted { id: crate::transaction::TxId },
    /// A body could not be encoded or decoded.
    #[error(transparent)]
    Format(#[from] crate::formatter::FormatError),
    /// The broker speaks an older revision of the mq.v1 protocol than this client needs
    /// ([`mq_proto::MIN_PROTOCOL_VERSION`]), or no mq.v1 at all; the text says what to upgrade.
    #[error("{0}")]
    Incompatible(String),
}

impl From<Status> for Error {
    fn from(s: Status) -> Self {
        // The broker's own word first: its error reason (google.rpc.ErrorInfo, domain mq).
        if let Some(e) = s
            .get_details_error_info()
            .filter(|i| i.domain == mq_proto::reason::DOMAIN)
            .and_then(|i| Error::from_reason(&i.reason, s.message()))
        {
            return e;
        }
        let msg = s.message().to_string();
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(msg),
            Code::NotFound => Error::NotFound(msg),
            Code::AlreadyExists => Error::AlreadyExists(msg),
            Code::ResourceExhausted => Error::QuotaExceeded(msg),
            Code::FailedPrecondition => Error::FailedPrecondition(msg),
            Code::Unauthenticated => Error::Unauthenticated(msg),
            Code::PermissionDenied => Error::PermissionDenied(msg),
            Code::Unavailable | Code::Cancelled | Code::Aborted => {
                Error::Unavailable(if msg.is_empty() {
                    "the connection to the broker was lost".to_string()
                } else {
                    format!("the connection to the broker was lost: {msg}")
                })
            }
            // tonic reports a broken connection (reset, h2 error) as Unknown; the broker itself
            // never answers with Unknown.
            Code::Unknown => {
                Error::Unavailable(format!("the connection to the broker was lost: {msg}"))
            }
            Code::DeadlineExceeded => Error::Timeout(msg),
            Code::Unimplemented => Error::Internal(format!(
                "the broker does not support this call (is it older than this client?): {msg}"
            )),
            _ => Error::Internal(format!("{}: {msg}", s.code())),
        }
    }
}

impl Error {
    /// The error for a broker's error reason (mq.proto's `ErrorReason` table), or `None` for a
    /// reason this client does not know or that the gRPC code tells as well (then the code
    /// decides).
    fn from_reason(reason: &str, msg: &str) -> Option<Self> {
        use mq_proto::reason as r;
        let msg = msg.to_string();
        Some(match reason {
            r::INVALID_ARGUMENT => Error::InvalidArgument(msg),
            r::QUEUE_NOT_FOUND | r::NOT_FOUND => Error::NotFound(msg),
            r::QUEUE_EXISTS | r::ALREADY_EXISTS => Error::AlreadyExists(msg),
            r::QUOTA_EXCEEDED => Error::QuotaExceeded(msg),
            r::FAILED_PRECONDITION => Error::FailedPrecondition(msg),
            // The broker said so itself: not a lost connection.
            r::STORAGE_UNAVAILABLE | r::SHUTTING_DOWN | r::STREAM_BUSY => Error::Unavailable(msg),
            r::INTERNAL => Error::Internal(msg),
            r::PERMISSION_DENIED => Error::PermissionDenied(msg),
            r::UNAUTHENTICATED => Error::Unauthenticated(msg),
            r::TX_TIMEOUT => Error::Aborted(msg),
            r::IDLE_TIMEOUT => Error::Timeout(msg),
            _ => return None,
        })
    }

    /// Builds an error from a per-message failure (`SendFailure`: a gRPC status code and an
    /// error reason).
    pub(crate) fn from_failure(code: i32, reason: &str, msg: String) -> Self {
        if let Some(e) = Error::from_reason(reason, &msg) {
            return e;
        }
        match Code::from_i32(code) {
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(msg),
            Code::NotFound => Error::NotFound(msg),
            Code::AlreadyExists => Error::AlreadyExists(msg),
            Code::ResourceExhausted => Error::QuotaExceeded(msg),
            Code::FailedPrecondition => Error::FailedPrecondition(msg),
            Code::Unavailable => Error::Unavailable(msg),
            Code::PermissionDenied => Error::PermissionDenied(msg),
            _ => Error::Internal(msg),
        }
    }
}

/// Results of client calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;
