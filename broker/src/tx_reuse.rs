//! Consecutive transactions on one `Transact` stream: the response header that announces it,
//! and the per-transaction deadline that does not run between transactions.

use tonic::metadata::MetadataValue;

/// Marks a `Transact` response: this broker runs the stream's transactions one after another
/// (after `committed` or `aborted` the next request begins the next transaction), so a client
/// may keep the stream for its next transaction instead of opening a new one.
pub(crate) fn announce<T>(response: &mut tonic::Response<T>) {
    response.metadata_mut().insert(
        mq_proto::TX_STREAM_REUSE_METADATA,
        MetadataValue::from_static("1"),
    );
}

/// Sleeps until the open transaction's deadline; between transactions (`None`), forever.
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
