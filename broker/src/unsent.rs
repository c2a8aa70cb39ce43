//! Deliveries built and not yet written: the bytes a receive stream holds for a client that
//! has not read them.
//!
//! A receive stream takes messages while its credit and the unacknowledged limits allow, reads
//! their bodies, and hands them to HTTP/2, which writes them as fast as the client reads. The
//! limits count messages, not bytes: 32 streams with credit 1,000 whose client never read held
//! 6 delivered 4 MiB messages each (the stream's channel, the item being encoded and HTTP/2's
//! buffer): +676 MiB of mqd for one connection (helper-52, stop 43), and a connection may open
//! 256 streams.
//!
//! So every batch a stream takes is counted (each message its body and texts, its queue's name
//! and [`DELIVERY_OVERHEAD_BYTES`])
//! against two budgets: the stream's ([`STREAM_UNSENT_BYTES`], or two of the largest batches)
//! and its connection's (`--max-unsent-bytes-per-connection`). The count is reserved before
//! the messages are taken (the most a batch may need), what the batch took is kept, and it is
//! given back once HTTP/2 has written the last of its bytes: every chunk of the encoded
//! response holds the count ([`hold`], in `large_bodies`), and h2 drops a chunk once it
//! is written. A stream out of budget takes nothing and waits (the client's own reading gives
//! the budget back; a stream that is not read ends with the ack timeout as before). A stream
//! that ends drops the deliveries still queued for HTTP/2 (their messages went back to the
//! queue), so what it holds then is what h2 and hyper hold of it (the item being written: at
//! most about two messages), counted until the client reads it or resets the stream. Nothing
//! is given back before its bytes are gone: a client that ends its streams (a half-close) and
//! opens new ones holds no more than the budget (a first version gave an ended stream's count
//! back at once: +578 MiB for 48 streams, helper-57). A compressed Receive (tonic's encoder)
//! gives its count back once tonic takes the batch.
//!
//! A send stream's answers (ids and failures) its client has not taken count against the same
//! connection budget, beside the stream's own ([`Unsent::answers`]): each stream alone held
//! 8 MiB of answers and one decoded batch, and a connection may open 256 streams (32 streams
//! whose answers nobody read grew mqd by ~410 MiB). The stream reserves a batch's share once
//! the batch's first byte comes and before it decodes it, so an idle stream holds nothing.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Semaphore;

/// Bytes a delivered message is counted beside its body: its headers and framing.
pub(crate) const DELIVERY_OVERHEAD_BYTES: usize = 256;

/// Most bytes of deliveries one receive stream holds unwritten (raised to two of its largest
/// batches).
pub(crate) const STREAM_UNSENT_BYTES: usize = 16 << 20;

/// Default `--max-unsent-bytes-per-connection`: sixteen streams' budgets. A connection whose
/// streams hold it all delivers nothing more until its client reads, so an application whose
/// receivers share one connection and pause (each may hold its stream's 16 MiB of large
/// messages) stops the others once sixteen have paused; at 64 MiB, four did (helper-59:
/// ten paused streams of 3 MB messages stopped a reader of the same connection).
pub const DEFAULT_MAX_UNSENT_BYTES_PER_CONNECTION: u64 = 256 << 20;

/// Default `--max-unsent-bytes`: what all connections together hold beyond one batch each.
pub const DEFAULT_MAX_UNSENT_BYTES: u64 = 1 << 30;

/// The per-connection limit in force: at least one stream's ([`stream_limit`]).
pub(crate) fn connection_limit(asked: u64, batch: usize) -> usize {
    (asked.min(MAX_LIMIT as u64) as usize).max(stream_limit(batch))
}

/// One stream's limit, for batches of at most `batch` bytes.
fn stream_limit(batch: usize) -> usize {
    STREAM_UNSENT_BYTES
        .max(batch.saturating_mul(2))
        .min(MAX_LIMIT)
}

/// What a tokio semaphore acquires at once (`u32`), and more than any sensible limit.
const MAX_LIMIT: usize = u32::MAX as usize;

/// One connection's budget of bytes built for its client and not yet taken: its own limit
/// (`--max-unsent-bytes-per-connection`), of which `floor` bytes (one batch) are its own
/// whatever other connections hold, the rest shared with every connection of the broker
/// (`--max-unsent-bytes`). Without the broker's share, each connection could hold its whole
/// limit: clients that never read could grow mqd by 256 MiB a connection (helper-60: three
/// connections of 50 unread receive streams each, +720 MiB), 1,024 connections allowed.
/// With it the broker holds at most its budget plus one floor a connection, and a connection
/// whose client reads still delivers a batch at a time when clients that do not read hold all
/// of the shared part.
#[derive(Debug)]
pub(crate) struct Budget {
    own: Semaphore,
    floor: Semaphore,
    /// The floor's size.
    floor_size: usize,
    broker: Arc<Semaphore>,
    limit: usize,
}

impl Budget {
    /// A connection's budget: `limit` bytes, the first `floor` of them its own, the rest from
    /// `broker`.
    pub(crate) fn new(limit: usize, floor: usize, broker: Arc<Semaphore>) -> Self {
        let limit = limit.min(MAX_LIMIT);
        Budget {
            own: Semaphore::new(limit),
            floor: Semaphore::new(floor.min(limit)),
            floor_size: floor.min(limit),
            broker,
            limit,
        }
    }

    /// The connection's limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// `n` bytes now, all or nothing; how many came from the floor.
    fn try_take(&self, n: u32) -> Option<u32> {
        let own = self.own.try_acquire_many(n).ok()?;
        let floor = self.floor_part(n);
        let from_floor = floor.as_ref().map_or(0, |p| p.num_permits() as u32);
        let broker = self.broker.try_acquire_many(n - from_floor).ok()?;
        own.forget();
        if let Some(f) = floor {
            f.forget();
        }
        broker.forget();
        Some(from_floor)
    }

    /// `n` bytes once the budgets have them (the connection's own first, then what the floor
    /// has, then the broker's for the rest); how many came from the floor.
    async fn take(&self, n: u32) -> u32 {
        // None of the semaphores is ever closed. A wait dropped halfway gives back what it
        // had (the permits are forgotten only once all are held).
        let Ok(own) = self.own.acquire_many(n).await else {
            return 0;
        };
        let floor = self.floor_part(n);
        let from_floor = floor.as_ref().map_or(0, |p| p.num_permits() as u32);
        if let Ok(broker) = self.broker.try_acquire_many(n - from_floor) {
            own.forget();
            if let Some(f) = floor {
                f.forget();
            }
            broker.forget();
            return from_floor;
        }
        if n as usize > self.floor_size {
            // More than the floor ever holds: what it has now, the rest from the broker's
            // share once it has it.
            let Ok(broker) = self.broker.acquire_many(n - from_floor).await else {
                return 0;
            };
            own.forget();
            if let Some(f) = floor {
                f.forget();
            }
            broker.forget();
            return from_floor;
        }
        drop(floor);
        // All of it from the floor or from the broker's share, whichever has it first (what is
        // acquired is kept: given back and looked for again, the permits went round the
        // waiters and none of them got any). Waiting on the broker's share alone missed the
        // floor coming free: while other connections held the whole share, a connection's
        // second call waited for them to go, though its first had long given its floor back
        // (helper-76).
        tokio::select! {
            p = self.floor.acquire_many(n) => {
                let Ok(p) = p else { return 0 };
                own.forget();
                p.forget();
                n
            }
            p = self.broker.acquire_many(n) => {
                let Ok(p) = p else { return 0 };
                own.forget();
                p.forget();
                0
            }
        }
    }

    /// As much of `n` as the floor has now.
    fn floor_part(&self, n: u32) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let f = (self.floor.available_permits().min(MAX_LIMIT) as u32).min(n);
        (f > 0)
            .then(|| self.floor.try_acquire_many(f).ok())
            .flatten()
    }

    fn give(&self, n: usize, from_floor: usize) {
        self.own.add_permits(n);
        self.floor.add_permits(from_floor);
        self.broker.add_permits(n - from_floor);
    }
}

/// One receive stream's budgets: its own and its connection's.
pub(crate) struct Unsent {
    stream: Arc<Semaphore>,
    connection: Arc<Budget>,
    /// What a batch reserves before it takes its messages.
    batch: u32,
}

impl Unsent {
    /// The budgets of a stream on a connection whose budget is `connection` (of
    /// `connection_limit` bytes), for batches of at most `batch` bytes.
    pub(crate) fn new(connection: Arc<Budget>, connection_limit: usize, batch: usize) -> Self {
        let stream = stream_limit(batch).min(connection_limit);
        Unsent {
            stream: Arc::new(Semaphore::new(stream)),
            connection,
            batch: batch.min(stream) as u32,
        }
    }

    /// A send stream's budgets for the answers its client has not taken yet: its own (`limit`) and
    /// its connection's (the one its receive streams' deliveries count against, with the
    /// broker's share beyond the floor: helper-64 showed answers charged to the connection's
    /// own alone let 12 connections hold 12 × their budget, +778 MiB against +251).
    pub(crate) fn answers(connection: Arc<Budget>, limit: usize) -> Self {
        Unsent {
            stream: Arc::new(Semaphore::new(limit)),
            connection,
            batch: 0,
        }
    }

    /// `n` bytes once both budgets have them (the stream's first, then the connection's).
    pub(crate) async fn reserve_bytes(&self, n: u32) -> Reserved {
        let Ok(s) = self.stream.acquire_many(n).await else {
            return self.reserved(0, 0);
        };
        let from_floor = self.connection.take(n).await;
        s.forget();
        self.reserved(n, from_floor)
    }

    /// `n` bytes if both budgets have them now.
    pub(crate) fn try_reserve_bytes(&self, n: u32) -> Option<Reserved> {
        let s = self.stream.try_acquire_many(n).ok()?;
        let from_floor = self.connection.try_take(n)?;
        s.forget();
        Some(self.reserved(n, from_floor))
    }

    /// A batch's bytes if both budgets have them now.
    pub(crate) fn try_reserve(&self) -> Option<Reserved> {
        self.try_reserve_bytes(self.batch)
    }

    /// A batch's bytes once both budgets have them (the stream's first, then the connection's,
    /// each in turn with the streams waiting before it).
    pub(crate) async fn reserve(&self) -> Reserved {
        self.reserve_bytes(self.batch).await
    }

    fn reserved(&self, bytes: u32, from_floor: u32) -> Reserved {
        Reserved {
            bytes: bytes as usize,
            from_floor: from_floor as usize,
            stream: self.stream.clone(),
            connection: self.connection.clone(),
        }
    }
}

/// Bytes counted against a stream's and its connection's budgets, given back when dropped.
pub(crate) struct Reserved {
    bytes: usize,
    /// Of `bytes`, those from the connection's floor (the rest are the broker's).
    from_floor: usize,
    stream: Arc<Semaphore>,
    connection: Arc<Budget>,
}

impl Reserved {
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `used` bytes (at most what was reserved) and gives the rest back.
    pub(crate) fn keep(mut self, used: usize) -> Self {
        let back = self.bytes.saturating_sub(used);
        self.give_back(back);
        self
    }

    /// Counts up to `more` bytes more, as much as both budgets have now (without waiting:
    /// what would free the rest may be waiting behind this), and keeps at most `size` bytes in
    /// all: what an answer holds once it is built.
    pub(crate) fn resize_now(&mut self, size: usize) {
        if size <= self.bytes {
            self.give_back(self.bytes - size);
            return;
        }
        let more = (size - self.bytes)
            .min(self.stream.available_permits())
            .min(self.connection.own.available_permits())
            .min(MAX_LIMIT) as u32;
        if more == 0 {
            return;
        }
        let Ok(s) = self.stream.try_acquire_many(more) else {
            return;
        };
        let Some(from_floor) = self.connection.try_take(more) else {
            return;
        };
        s.forget();
        self.bytes += more as usize;
        self.from_floor += from_floor as usize;
    }

    /// Gives `n` bytes back: the broker's first, so the connection keeps its floor.
    fn give_back(&mut self, n: usize) {
        if n > 0 {
            let from_broker = n.min(self.bytes - self.from_floor);
            let from_floor = n - from_broker;
            self.bytes -= n;
            self.from_floor -= from_floor;
            self.stream.add_permits(n);
            self.connection.give(n, from_floor);
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let n = self.bytes;
        self.give_back(n);
    }
}

impl std::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserved")
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// A unary call's answer (a Peek page, a ReceiveOne message) counted against its connection's
/// budget, in the answer's extensions; `large_bodies::LargeBodies` moves it into the answer's
/// body, which HTTP/2 drops once it has written the last byte or the stream is reset. Unary
/// answers were counted nowhere: a client that set its window to 0 and asked for 256 pages of
/// 4 MiB on each connection held ~1 GiB of mqd per connection (helper-74).
#[derive(Debug, Clone)]
pub(crate) struct AnswerHold(#[allow(dead_code)] pub(crate) Arc<Reserved>);

/// `bytes` of `connection`'s budget for one unary answer (at most the connection's limit),
/// once the budget has them: a client that does not read its answers waits for its own.
pub(crate) async fn reserve_answer(connection: Arc<Budget>, bytes: usize) -> Reserved {
    let limit = connection.limit();
    let n = bytes.min(limit).min(MAX_LIMIT) as u32;
    // The answer's own limit is the connection's: once built it may count more
    // ([`Reserved::resize_now`]), as far as the connection's budget has it.
    Unsent::answers(connection, limit).reserve_bytes(n).await
}

/// `chunk`, keeping `count` until it is dropped (once HTTP/2 has written it).
pub(crate) fn hold(chunk: Bytes, count: &Arc<Reserved>) -> Bytes {
    struct Held(Bytes, #[allow(dead_code)] Arc<Reserved>);
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    Bytes::from_owner(Held(chunk, count.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker budget no test reaches.
    fn broker() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MAX_LIMIT))
    }

    /// A take waiting for the broker's share while other connections hold all of it goes on
    /// once its own connection's floor comes free (it waited for the others to go: helper-76).
    #[tokio::test]
    async fn a_take_waiting_for_the_share_goes_on_when_its_floor_comes_free() {
        let shared = Arc::new(Semaphore::new(50));
        let greedy = Arc::new(Budget::new(100, 10, shared.clone()));
        let honest = Arc::new(Budget::new(100, 10, shared.clone()));
        // The greedy connection holds its floor and the whole share.
        let _held = Unsent::new(greedy.clone(), 100, 1).reserve_bytes(60).await;
        let mine = Unsent::new(honest.clone(), 100, 1);
        let first = mine.reserve_bytes(10).await; // the floor
        let second = mine.reserve_bytes(10);
        tokio::pin!(second);
        assert!(futures::poll!(second.as_mut()).is_pending());
        drop(first);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), second)
            .await
            .expect("the floor came free");
        assert_eq!(got.bytes(), 10);
    }

    #[tokio::test]
    async fn connections_share_the_brokers_budget_beyond_their_floor() {
        let shared = Arc::new(Semaphore::new(50));
        let a = Arc::new(Budget::new(100, 10, shared.clone()));
        let b = Arc::new(Budget::new(100, 10, shared.clone()));
        let ua = Unsent::new(a.clone(), 100, 1);
        let ub = Unsent::new(b.clone(), 100, 1);
        // a takes its floor and all the shared part.
        let ra = ua.reserve_bytes(60).await;
        assert_eq!(shared.available_permits(), 0);
        // b still has its floor, and no more.
        let rb = ub.reserve_bytes(10).await;
        let mut more = Box::pin(ub.reserve_bytes(1));
        assert!(
            futures::poll!(more.as_mut()).is_pending(),
            "beyond its floor, b waits for the shared part"
        );
        // a gives back 30: the shared part first (it keeps its floor), and b's wait ends.
        let ra = ra.keep(30);
        assert_eq!(a.floor.available_permits(), 0);
        let r1 = more.await;
        assert_eq!(shared.available_permits(), 29);
        drop((ra, rb, r1));
        assert_eq!(shared.available_permits(), 50);
        assert_eq!(a.floor.available_permits(), 10);
        assert_eq!(b.floor.available_permits(), 10);
        assert_eq!(a.own.available_permits(), 100);
        assert_eq!(b.own.available_permits(), 100);
    }

    #[test]
    fn a_batch_is_counted_until_its_last_chunk_is_dropped() {
        let conn = Arc::new(Budget::new(100, 100, broker()));
        let unsent = Unsent::new(conn.clone(), 100, 30);
        let r = unsent.try_reserve().expect("room");
        assert_eq!(conn.own.available_permits(), 70);
        let count = Arc::new(r.keep(12));
        assert_eq!(conn.own.available_permits(), 88);
        let a = hold(Bytes::from_static(b"abc"), &count);
        let b = hold(Bytes::from_static(b"def"), &count);
        drop(count);
        assert_eq!(&a[..], b"abc");
        drop(a);
        assert_eq!(
            conn.own.available_permits(),
            88,
            "one chunk is still unwritten"
        );
        drop(b);
        assert_eq!(conn.own.available_permits(), 100);
    }

    #[test]
    fn a_stream_out_of_budget_reserves_nothing_until_bytes_come_back() {
        // A stream's limit is two batches at least; the connection's is what it was given.
        let limit = connection_limit(64 << 20, 40);
        assert_eq!(limit, 64 << 20);
        assert_eq!(connection_limit(10, 40), STREAM_UNSENT_BYTES);
        let conn = Arc::new(Budget::new(limit, limit, broker()));
        let unsent = Unsent::new(conn.clone(), limit, 40);
        let held: Vec<_> = (0..(STREAM_UNSENT_BYTES / 40))
            .map(|_| unsent.try_reserve().expect("within the stream's limit"))
            .collect();
        assert!(unsent.try_reserve().is_none());
        // Another stream of the same connection still has the rest of the connection's.
        let other = Unsent::new(conn.clone(), limit, 40);
        assert!(other.try_reserve().is_some());
        drop(held);
        assert!(unsent.try_reserve().is_some());
    }

    #[tokio::test]
    async fn an_answer_resized_takes_only_what_both_budgets_have_now() {
        let conn = Arc::new(Budget::new(100, 100, broker()));
        let answers = Unsent::answers(conn.clone(), 60);
        let mut r = answers.reserve_bytes(20).await;
        assert_eq!(conn.own.available_permits(), 80);
        // Larger than reserved: what the stream's budget still has (40 of 60), not more.
        r.resize_now(90);
        assert_eq!(r.bytes(), 60);
        assert_eq!(conn.own.available_permits(), 40);
        // Smaller: the rest goes back to both.
        r.resize_now(10);
        assert_eq!(r.bytes(), 10);
        assert_eq!(conn.own.available_permits(), 90);
        drop(r);
        assert_eq!(conn.own.available_permits(), 100);
    }

    #[tokio::test]
    async fn a_waiting_stream_gets_its_batch_when_another_gives_bytes_back() {
        let limit = connection_limit(0, 8 << 20);
        let conn = Arc::new(Budget::new(limit, limit, broker()));
        let a = Unsent::new(conn.clone(), limit, 8 << 20);
        let b = Unsent::new(conn.clone(), limit, 8 << 20);
        let first = a.try_reserve().expect("room");
        let second = a.try_reserve().expect("room");
        assert!(
            b.try_reserve().is_none(),
            "the connection's budget is taken"
        );
        let waiting = tokio::spawn(async move { b.reserve().await.bytes() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first.keep(0));
        assert_eq!(waiting.await.unwrap(), 8 << 20);
        drop(second);
    }
}
