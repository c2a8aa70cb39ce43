//! Consecutive transactions on one `Transact` stream: the response headers that announce it
//! (and the idle bound), the per-transaction deadline that does not run between transactions,
//! and the idle bound that does (mqd --tx-stream-idle).

use tonic::metadata::MetadataValue;

/// Marks a `Transact` response: this broker runs the stream's transactions one after another
/// (after `committed` or `aborted` the next request begins the next transaction), so a client
/// may keep the stream for its next transaction instead of opening a new one.
/// The second header says how long the stream may wait with no transaction open, so the
/// client keeps it for less.
pub(crate) fn announce<T>(response: &mut tonic::Response<T>, idle: std::time::Duration) {
    let m = response.metadata_mut();
    m.insert(
        mq_proto::TX_STREAM_REUSE_METADATA,
        MetadataValue::from_static("1"),
    );
    m.insert(
        mq_proto::TX_STREAM_IDLE_METADATA,
        MetadataValue::from(idle.as_millis().min(u64::MAX as u128) as u64),
    );
}

/// What ended a stream's wait for its next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// The open transaction's deadline (mqd --tx-timeout-secs): it is aborted.
    Transaction,
    /// No transaction open for the idle bound (mqd --tx-stream-idle): the stream ends cleanly.
    Idle,
}

/// Sleeps until the open transaction's deadline, or with none open (`None`), until `idle_end`.
pub(crate) async fn sleep_until(
    deadline: Option<tokio::time::Instant>,
    idle_end: tokio::time::Instant,
) -> Expired {
    match deadline {
        Some(d) => {
            tokio::time::sleep_until(d).await;
            Expired::Transaction
        }
        None => {
            tokio::time::sleep_until(idle_end).await;
            Expired::Idle
        }
    }
}
