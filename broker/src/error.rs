//! The broker's error type and its one mapping to gRPC `Status`.

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
    /// The queue a call or transaction was using was deleted meanwhile.
    #[error("queue \"{0}\" does not exist: it was deleted while in use (a queue created since under the same name is another queue)")]
    QueueDeleted(String),
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
    /// The gRPC status code of this error (also in per-message failures, `SendFailure.code`).
    pub fn code(&self) -> Code {
        match self {
            BrokerError::InvalidArgument(_) => Code::InvalidArgument,
            BrokerError::QueueNotFound(_)
            | BrokerError::QueueDeleted(_)
            | BrokerError::NotFound(_) => Code::NotFound,
            BrokerError::QueueExists(_) | BrokerError::AlreadyExists(_) => Code::AlreadyExists,
            BrokerError::QuotaExceeded(_) => Code::ResourceExhausted,
            BrokerError::FailedPrecondition(_) => Code::FailedPrecondition,
            BrokerError::ShuttingDown | BrokerError::Unavailable(_) | BrokerError::InDoubt(_) => {
                Code::Unavailable
            }
            BrokerError::Internal(_) => Code::Internal,
            BrokerError::PermissionDenied(_) => Code::PermissionDenied,
        }
    }

    /// The error reason (`google.rpc.ErrorInfo.reason`, `SendFailure.reason`): one of the
    /// table in mq.proto.
    pub fn reason(&self) -> &'static str {
        use mq_proto::reason as r;
        match self {
            BrokerError::InvalidArgument(_) => r::INVALID_ARGUMENT,
            BrokerError::QueueNotFound(_) | BrokerError::QueueDeleted(_) => r::QUEUE_NOT_FOUND,
            BrokerError::NotFound(_) => r::NOT_FOUND,
            BrokerError::QueueExists(_) => r::QUEUE_EXISTS,
            BrokerError::AlreadyExists(_) => r::ALREADY_EXISTS,
            BrokerError::QuotaExceeded(_) => r::QUOTA_EXCEEDED,
            BrokerError::FailedPrecondition(_) => r::FAILED_PRECONDITION,
            BrokerError::Unavailable(_) | BrokerError::InDoubt(_) => r::STORAGE_UNAVAILABLE,
            BrokerError::ShuttingDown => r::SHUTTING_DOWN,
            BrokerError::Internal(_) => r::INTERNAL,
            BrokerError::PermissionDenied(_) => r::PERMISSION_DENIED,
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
        crate::rich_error::status(e.code(), e.reason(), e.to_string())
    }
}
