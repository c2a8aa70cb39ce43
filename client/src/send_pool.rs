//! The send streams [`Queue::send`](crate::Queue::send) keeps open, one per queue (the most
//! recently used [`MAX_KEPT`]), so that an application sending one message at a time pays one
//! round trip per message on an open stream instead of opening and closing a stream each time
//! (two more round trips, and a stream's setup on the broker).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::client::Client;
use crate::error::Result;
use crate::sender::{Sender, SenderOptions};

/// Queues whose send streams a client keeps at most (each is one HTTP/2 stream of the
/// connection, counted against the broker's `--max-streams-per-connection`).
pub(crate) const MAX_KEPT: usize = 8;

/// A kept sender and the queue it sends to.
type Kept = (String, Arc<Sender>);

/// The kept senders of a client (shared by its clones), most recently used last, and how many
/// it has opened.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendPool {
    kept: Arc<Mutex<Vec<Kept>>>,
    opened: Arc<AtomicU64>,
}

impl SendPool {
    /// The kept sender to `queue` whose stream is still alive, if any (a dead one is dropped).
    pub(crate) fn get(&self, queue: &str) -> Option<Arc<Sender>> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let i = kept.iter().position(|(q, _)| q == queue)?;
        let (name, sender) = kept.remove(i);
        if sender.is_dead() {
            return None;
        }
        kept.push((name, sender.clone()));
        Some(sender)
    }

    /// Forgets `sender` (its stream refused a message before taking it: it ended meanwhile).
    pub(crate) fn forget(&self, sender: &Arc<Sender>) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(_, s)| !Arc::ptr_eq(s, sender));
    }

    /// Opens a sender to `queue` and keeps it, dropping the least recently used one past
    /// [`MAX_KEPT`] (its stream ends once what it carries is answered). If another task kept
    /// one for `queue` meanwhile, that one is used and the new one closed.
    pub(crate) async fn open(&self, client: &Client, queue: &str) -> Result<Arc<Sender>> {
        let sender = Arc::new(
            Sender::open(client.clone(), queue.to_string(), SenderOptions::default()).await?,
        );
        self.opened.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, other)) = kept.iter().find(|(q, s)| q == queue && !s.is_dead()) {
            return Ok(other.clone());
        }
        kept.retain(|(q, _)| q != queue);
        kept.push((queue.to_string(), sender.clone()));
        if kept.len() > MAX_KEPT {
            kept.remove(0);
        }
        Ok(sender)
    }

    /// Send streams opened for one-message sends so far.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}
