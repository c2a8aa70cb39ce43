//! Bounds on the receive side of forwarding: incoming streams per peer and in all (the least
//! recently used idle one of the same peer gives way; another peer's never), idle streams pruned with their journal records, a
//! storage-quota charge per stream record, bounded refusal memory, rate-limited refusal logs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use mq_proto::limits::{quote, truncate};
use mq_proto::v1;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::inbound::{InboundStream, Streams};
use crate::journal::Op;
use crate::message::{now_ms, Delivery};
use crate::ratelog::RateLimitedLog;

/// Storage-quota bytes charged per kept stream (its journal record: id, mark, source of at most
/// 255 bytes, peer, time, and the message overhead).
pub(crate) const STREAM_RECORD_CHARGE: u64 = 512;
/// Refusals remembered per stream, at most.
pub(crate) const MAX_REFUSALS_PER_STREAM: usize = 1024;
/// Bytes of refusals remembered per stream, at most (reasons plus a fixed cost each).
pub(crate) const MAX_REFUSAL_BYTES_PER_STREAM: usize = 64 * 1024;
/// A remembered refusal's reason is cut to this many bytes.
pub(crate) const REFUSAL_REASON_BYTES: usize = 256;
/// A refusal is remembered this long (a resend after a lost answer comes much sooner).
pub(crate) const REFUSAL_RETENTION_MS: u64 = 10 * 60 * 1000;
/// Fixed bytes counted per remembered refusal besides its reason.
const REFUSAL_FIXED_BYTES: usize = 48;
/// One refusal log line per peer this often, with a count of those held back.
const REFUSAL_LOG_EVERY_MS: u64 = 10_000;

/// The latest refusals of one stream, bounded in count, bytes and age.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    q: VecDeque<Refusal>,
    bytes: usize,
}

#[derive(Debug)]
struct Refusal {
    seq: u64,
    class: i32,
    reason: String,
    at_ms: u64,
}

impl Refusals {
    pub(crate) fn remember(&mut self, seq: u64, class: i32, reason: &str, now: u64) {
        self.expire(now);
        let reason = truncate(reason, REFUSAL_REASON_BYTES);
        let cost = reason.len() + REFUSAL_FIXED_BYTES;
        while self.q.len() >= MAX_REFUSALS_PER_STREAM
            || (!self.q.is_empty() && self.bytes + cost > MAX_REFUSAL_BYTES_PER_STREAM)
        {
            self.pop();
        }
        self.bytes += cost;
        self.q.push_back(Refusal {
            seq,
            class,
            reason,
            at_ms: now,
        });
    }

    pub(crate) fn find(&mut self, seq: u64, now: u64) -> Option<(i32, String)> {
        self.expire(now);
        self.q
            .iter()
            .rev()
            .find(|r| r.seq == seq)
            .map(|r| (r.class, r.reason.clone()))
    }

    pub(crate) fn expire(&mut self, now: u64) {
        while self
            .q
            .front()
            .is_some_and(|r| now.saturating_sub(r.at_ms) >= REFUSAL_RETENTION_MS)
        {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some(r) = self.q.pop_front() {
            self.bytes -= r.reason.len() + REFUSAL_FIXED_BYTES;
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

fn peer_of(s: &InboundStream) -> String {
    s.peer.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Nobody but the table holds it: no connection serves it, no answer is pending.
fn is_idle(s: &Arc<InboundStream>) -> bool {
    Arc::strong_count(s) == 1
}

impl Broker {
    /// The stream `id` for a new connection from `peer`: an existing one, or a new one within
    /// the limits (per peer, in all, storage quota). At a limit the least recently used idle
    /// stream of that peer is forgotten; if it has none, the stream is refused (another peer's
    /// stream is never forgotten for it).
    pub(crate) fn open_stream(
        &self,
        id: uuid::Uuid,
        peer: &str,
    ) -> Result<Arc<InboundStream>, BrokerError> {
        let (per_peer, total) = (
            self.config().max_forward_streams_per_peer.max(1),
            self.config().max_forward_streams.max(1),
        );
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = streams.by_id.get(&id).cloned() {
            *s.peer.lock().unwrap_or_else(|p| p.into_inner()) = peer.to_string();
            s.touch();
            return Ok(s);
        }
        let of_peer = streams
            .by_id
            .values()
            .filter(|s| *s.peer.lock().unwrap_or_else(|p| p.into_inner()) == peer)
            .count();
        if of_peer >= per_peer && !self.evict_lru(&mut streams, Some(peer)) {
            return Err(BrokerError::QuotaExceeded(format!(
                "{} has {of_peer} forwarding streams in use; the limit is {per_peer} per peer (mqd --max-forward-streams-per-peer)",
                quote(peer)
            )));
        }
        // At the broker-wide limit only the peer's own least recently used idle stream gives
        // way: another peer's stream (its duplicate mark, its owner) is never forgotten for a
        // new one, so one peer cannot make another's resends pass as new messages.
        // A stream that never stored anything has no mark to keep: any peer's such idle stream
        // gives way first (4,096 streams opened with an empty batch and closed, from 16
        // addresses, refused every new peer for the 24 h of --forward-stream-idle: helper-65).
        if streams.len() >= total
            && !self.evict_empty(&mut streams)
            && !self.evict_lru(&mut streams, Some(peer))
        {
            return Err(BrokerError::QuotaExceeded(format!(
                "this broker has {} forwarding streams in use; the limit is {total} (mqd --max-forward-streams), and no idle stream of {} can give way (other peers' streams are kept)",
                streams.len(),
                quote(peer)
            )));
        }
        self.reserve(Delivery::Recoverable, STREAM_RECORD_CHARGE)?;
        let s = streams.get_or_create(id);
        *s.peer.lock().unwrap_or_else(|p| p.into_inner()) = peer.to_string();
        Ok(s)
    }

    /// Forgets the least recently used idle stream (of `peer`, or of anyone). False if none is
    /// idle.
    fn evict_lru(&self, streams: &mut Streams, peer: Option<&str>) -> bool {
        self.evict_idle(
            streams,
            |s| peer.is_none_or(|p| peer_of(s) == p),
            "it was the least recently used at a limit",
        )
    }

    /// Forgets the least recently used idle stream, of any peer, that never stored anything.
    /// False if there is none.
    fn evict_empty(&self, streams: &mut Streams) -> bool {
        self.evict_idle(
            streams,
            |s| s.stored_nothing(),
            "it had stored nothing, at the broker's limit",
        )
    }

    /// Forgets the least recently used idle stream that `which` picks; false if none.
    fn evict_idle(
        &self,
        streams: &mut Streams,
        which: impl Fn(&InboundStream) -> bool,
        why: &str,
    ) -> bool {
        let victim = streams
            .by_id
            .values()
            .filter(|s| is_idle(s) && which(s))
            .min_by_key(|s| s.last_used_ms.load(std::sync::atomic::Ordering::Relaxed))
            .map(|s| s.id);
        match victim {
            Some(id) => {
                self.forget_stream(streams, id, why);
                true
            }
            None => false,
        }
    }

    /// Drops a stream, its journal record and its quota charge.
    fn forget_stream(&self, streams: &mut Streams, id: uuid::Uuid, why: &str) {
        let Some(s) = streams.by_id.remove(&id) else {
            return;
        };
        // Not awaited, like every removal: if it does not reach the disk, the stream comes back
        // after a restart and is pruned again.
        drop(self.journal().submit(vec![Op::Remove {
            queue_id: streams.queue_id,
            seqs: vec![s.slot],
        }]));
        self.release(Delivery::Recoverable, STREAM_RECORD_CHARGE);
        tracing::debug!(stream = %id, peer = %quote(&peer_of(&s)), why, "forwarding stream forgotten");
    }

    /// Forgets every idle stream unused for `idle`, drops expired refusals and the log state
    /// of peers without streams. Returns how many streams were forgotten.
    pub(crate) fn prune_streams(&self, idle: Duration) -> usize {
        let now = now_ms();
        let idle_ms = idle.as_millis() as u64;
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let old: Vec<uuid::Uuid> = streams
            .by_id
            .values()
            .filter(|s| {
                is_idle(s)
                    && now.saturating_sub(s.last_used_ms.load(std::sync::atomic::Ordering::Relaxed))
                        >= idle_ms
            })
            .map(|s| s.id)
            .collect();
        for id in &old {
            self.forget_stream(&mut streams, *id, "it was idle");
        }
        for s in streams.by_id.values() {
            s.expire_refusals(now);
        }
        let peers: std::collections::HashSet<String> =
            streams.by_id.values().map(|s| peer_of(s)).collect();
        streams.peer_logs.retain(|p, _| peers.contains(p));
        old.len()
    }

    /// Logs refusals of a batch: one line per peer every 10 s, counting those held back.
    pub(crate) fn log_refusals(
        &self,
        stream: &InboundStream,
        source: &str,
        rejected: &[v1::ForwardRejection],
    ) {
        let peer = peer_of(stream);
        let log = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peer_logs
            .entry(peer.clone())
            .or_insert_with(|| Arc::new(RateLimitedLog::new(REFUSAL_LOG_EVERY_MS)))
            .clone();
        if let Some(held_back) = log.allow(now_ms(), rejected.len() as u64) {
            let first = &rejected[0];
            tracing::warn!(
                peer = %quote(&peer),
                source = %quote(source),
                refused = rejected.len(),
                held_back,
                class = first.dead_letter_class,
                reason = %quote(&first.reason),
                "refused forwarded messages (at most one line per peer every 10 s)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review M4: at the broker-wide limit a new stream from another peer does not take the
    /// place of a stream with a mark (inbound::tests::
    /// streams_that_stored_nothing_give_way_to_another_peer); an idle one that never stored
    /// anything has nothing to keep and gives way (the least recently used), and the peer
    /// itself may replace its own idle ones.
    #[tokio::test]
    async fn the_broker_wide_stream_limit_takes_only_streams_that_stored_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = crate::config::BrokerConfig::new(dir.path());
        c.max_forward_streams = 4;
        let (b, _) = Broker::open(c, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
        let ids: Vec<uuid::Uuid> = (0..4).map(|_| uuid::Uuid::now_v7()).collect();
        for id in &ids {
            drop(b.open_stream(*id, "10.0.0.1").unwrap());
            // Distinct last uses: the first is the least recently used.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop(b.open_stream(uuid::Uuid::now_v7(), "10.0.0.2").unwrap());
        {
            let streams = b.streams.lock().unwrap();
            assert_eq!(streams.len(), 4);
            assert!(
                !streams.by_id.contains_key(&ids[0]),
                "the oldest empty one gave way"
            );
            assert!(ids[1..].iter().all(|id| streams.by_id.contains_key(id)));
        }
        // The same peer replaces its own least recently used idle stream.
        drop(b.open_stream(uuid::Uuid::now_v7(), "10.0.0.1").unwrap());
        assert_eq!(b.streams.lock().unwrap().len(), 4);
        b.close();
    }

    #[test]
    fn refusals_are_bounded_in_count_bytes_and_age() {
        let mut r = Refusals::default();
        for seq in 0..10_000u64 {
            r.remember(seq, 1, "short", 1_000);
        }
        assert_eq!(r.len(), MAX_REFUSALS_PER_STREAM);
        assert_eq!(r.find(9_999, 1_000).map(|x| x.0), Some(1));
        assert_eq!(r.find(0, 1_000), None, "the oldest went first");
        let huge = "why".repeat(1 << 20);
        for seq in 0..1_000u64 {
            r.remember(seq, 2, &huge, 2_000);
        }
        assert!(r.bytes() <= MAX_REFUSAL_BYTES_PER_STREAM, "{}", r.bytes());
        let (_, reason) = r.find(999, 2_000).unwrap();
        assert!(reason.len() <= REFUSAL_REASON_BYTES, "{}", reason.len());
        // After the retention time they are gone.
        assert_eq!(r.find(999, 2_000 + REFUSAL_RETENTION_MS), None);
        assert_eq!((r.len(), r.bytes()), (0, 0));
    }
}
