//! Queue set-up at scale (`--queues` up to hundreds of thousands): creating or checking and
//! purging every queue with a bounded number of calls in flight, so group commit carries the
//! journal writes and set-up does not cost one round trip and one fsync per queue in a row.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use mq_client::{Client, Queue};

use crate::config::Mode;

/// Set-up calls (create, check, purge) in flight at once.
pub(crate) const SETUP_CONCURRENCY: usize = 64;

/// Creates every queue of `names` unless it exists, checking the mode of those that do (see
/// [`super::ensure_queue`]), [`SETUP_CONCURRENCY`] at a time; returns the time it took.
pub(crate) async fn ensure_all(
    client: &Client,
    names: &[String],
    mode: Mode,
    journal: bool,
) -> Result<Duration> {
    let start = Instant::now();
    // Owned items: futures borrowing from the iterator are not `Send` for every lifetime,
    // which a spawned caller needs.
    futures::stream::iter(names.to_vec())
        .map(|name| {
            let client = client.clone();
            async move { super::ensure_queue(&client, &name, mode, journal).await }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(start.elapsed())
}

/// Purges every queue, [`SETUP_CONCURRENCY`] at a time.
pub(crate) async fn purge_all(queues: &[Queue]) -> Result<()> {
    futures::stream::iter(queues.to_vec())
        .map(|q| async move {
            q.purge()
                .await
                .map(|_| ())
                .with_context(|| format!("cannot purge {}", q.name()))
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}
