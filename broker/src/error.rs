//! The broker's error type and its one mapping to gRPC `Status`.

use mq_proto::v1::ErrorCode;
use tonic::{Code, Status};

/// Everything a broker operation can refuse or fail with. Messages say what happened, quote the
/// value, and name the rule.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The input broke a rule (bad name, label too long, priority 8, body too large, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such queue.
    #[error("queue \"{0}\" does not exist; create it with `mq queue create {0}`")]
    QueueNotFound(String),
    /// Something other than a queue does not exist; the text says what and what to do.
    #[error("{0}")]
    NotFound(String),
    /// The queue exists already.
    #[error("queue \"{0}\" already exists")]
    QueueExists(String),
    /// Something other than a queue exists already (a transaction id that committed, ...).
    #[error("{0}")]
    AlreadyExists(String),
    /// A quota would be exceeded; nothing was stored.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The operation does not apply to this queue (read-only queue, remote queue, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The broker cannot store anything right now (the journal failed, or refuses writes after
    /// a failed sync).
    #[error("{0}")]
    Unavailable(String),
    /// A transaction's commit record was handed to the journal and the write or its
    /// `fdatasync` failed: it may be on disk. Nobody knows whether it committed until a restart.
    #[error("{0}")]
    InDoubt(String),
    /// The broker is shutting down.
    #[error("the broker is shutting down; retry against a running broker")]
    ShuttingDown,
    /// Something went wrong inside the broker.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller lacks a right; the text names the identity, the right and the queue.
    #[error("{0}")]
    PermissionDenied(String),
}

impl BrokerError {
    /// The wire error code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            BrokerError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            BrokerError::QueueNotFound(_) | BrokerError::NotFound(_) => ErrorCode::NotFound,
            BrokerError::QueueExists(_) | BrokerError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            BrokerError::QuotaExceeded(_) => ErrorCode::ResourceExhausted,
            BrokerError::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            BrokerError::ShuttingDown | BrokerError::Unavailable(_) | BrokerError::InDoubt(_) => {
                ErrorCode::Unavailable
            }
            BrokerError::Internal(_) => ErrorCode::Internal,
            BrokerError::PermissionDenied(_) => ErrorCode::PermissionDenied,
        }
    }
}

impl From<mq_proto::format_name::FormatNameError> for BrokerError {
    fn from(e: mq_proto::format_name::FormatNameError) -> Self {
        BrokerError::InvalidArgument(e.to_string())
    }
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Status {
        let code = match e.code() {
            ErrorCode::InvalidArgument => Code::InvalidArgument,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::ResourceExhausted => Code::ResourceExhausted,
            ErrorCode::FailedPrecondition => Code::FailedPrecondition,
            ErrorCode::Unavailable => Code::Unavailable,
            ErrorCode::PermissionDenied => Code::PermissionDenied,
            ErrorCode::Internal | ErrorCode::ErrorUnspecified => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}
