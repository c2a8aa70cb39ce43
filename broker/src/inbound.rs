//! The receiving side of store-and-forward: the `Forward` stream from another broker.
//!
//! Each batch is checked message by message (destination queue exists here, transactional
//! matches, quota, time-to-reach-queue), stored in one journal record together with the
//! stream's new high-water mark, and answered once that record is on disk. Messages that cannot
//! be delivered are answered with a class and reason; the sending broker dead-letters them.
//!
//! Exactly once, in order: the sender's outgoing queue is FIFO and numbers messages with its
//! `seq`. Here, per stream, the highest sequence stored is kept in memory and in the journal
//! (a record in the internal `SYSTEM$;STREAMS` queue, replaced by every batch, written in the
//! same journal record as the batch's messages). A message at or below it is a duplicate from a
//! resend and is dropped, unless it was refused: the refused seqs at or below the mark are kept
//! in the same record (compact ranges with their class, [`crate::refused_seqs`]), so a resend
//! gets its refusal again and the sender dead-letters it; the sender's `settled_below` lets
//! them go. The records of one stream are a journal [`Chain`]: a batch whose record fails makes
//! every later one of the connection fail unwritten (a later mark never covers an earlier, lost
//! batch), and the connection ends; the next one resumes from what is on disk. One connection
//! per stream is served at a time.
//!
//! A stream belongs to the identity that created it (kept with its high-water mark): another
//! identity that names it is refused with PERMISSION_DENIED before anything changes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mq_proto::format_name::FormatName;
use mq_proto::limits::{quote, MAX_SOURCE_BYTES};
use mq_proto::v1::{self, DeadLetterClass};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::broker::{journal_failed, Broker};
use crate::deadletter::rejection;
use crate::error::BrokerError;
use crate::journal::{Chain, Op, RecoveredMessage};
use crate::message::{now_ms, Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue};
use crate::refused_seqs::{RefusedSeqs, MAX_REFUSED_RANGES};

/// Batches whose answers may be pending at once on one stream.
const ACK_WINDOW: usize = 32;
/// How long a new connection of a stream waits for the previous one to finish.
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

/// Every incoming stream this broker has stored messages from (bounded and pruned: see
/// [`crate::stream_bounds`]).
#[derive(Debug, Default)]
pub(crate) struct Streams {
    /// The internal queue whose messages are the streams' high-water marks.
    pub queue_id: u64,
    /// The next free record slot (a `seq` of that queue).
    pub next_slot: u64,
    pub(crate) by_id: HashMap<uuid::Uuid, Arc<InboundStream>>,
    /// Per peer: its rate-limited refusal log line.
    pub(crate) peer_logs: HashMap<String, Arc<crate::ratelog::RateLimitedLog>>,
}

/// One incoming stream.
#[derive(Debug)]
pub(crate) struct InboundStream {
    pub(crate) id: uuid::Uuid,
    pub(crate) slot: u64,
    /// Highest sequence whose record is on disk.
    durable: AtomicU64,
    /// Refused seqs at or below the mark: as accepted (stored or being stored) and as on disk.
    refused_seqs: std::sync::Mutex<RefusedState>,
    /// The stream's records, in order; broken by a failed one until the next connection.
    chain: Chain,
    /// Held by the connection serving the stream; holds the highest sequence accepted so far
    /// (stored or being stored).
    serving: Arc<tokio::sync::Mutex<u64>>,
    /// The latest refusals, so that a batch resent after a lost answer gets the same refusal
    /// again rather than passing for a duplicate. Memory only, bounded in count, bytes and age.
    refused: std::sync::Mutex<crate::stream_bounds::Refusals>,
    /// Connections opened for this stream; a new one tells the one serving to stop.
    generation: AtomicU64,
    preempt: tokio::sync::Notify,
    /// The peer (sending address) it belongs to, for the per-peer limit.
    pub(crate) peer: std::sync::Mutex<String>,
    /// Unix ms of its last connection or batch.
    pub(crate) last_used_ms: AtomicU64,
    /// The identity that owns the stream; `None` for a stream recorded before owners were.
    owner: std::sync::Mutex<Option<Arc<str>>>,
}

/// A stream's refused seqs: `accepted` goes with the connection's accepted mark, `durable` with
/// the mark on disk.
#[derive(Debug, Default)]
struct RefusedState {
    accepted: RefusedSeqs,
    durable: RefusedSeqs,
    /// The highest `settled_below` the sender reported.
    settled_below: u64,
}

/// The reason answered for a refusal whose reason text is no longer remembered.
const REASON_FORGOTTEN: &str = "refused earlier; reason no longer known";

impl InboundStream {
    /// Whether no batch of it was ever accepted: no mark on disk or being written, so
    /// forgetting it forgets nothing a resend could pass for new.
    pub(crate) fn stored_nothing(&self) -> bool {
        self.durable.load(Ordering::Acquire) == 0
            && self.serving.try_lock().is_ok_and(|mark| *mark == 0)
            && self
                .refused_seqs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .accepted
                .is_empty()
    }

    fn new(id: uuid::Uuid, slot: u64, last_seq: u64) -> Self {
        InboundStream {
            id,
            slot,
            durable: AtomicU64::new(last_seq),
            refused_seqs: std::sync::Mutex::new(RefusedState::default()),
            chain: Chain::new(),
            serving: Arc::new(tokio::sync::Mutex::new(last_seq)),
            refused: std::sync::Mutex::new(crate::stream_bounds::Refusals::default()),
            generation: AtomicU64::new(0),
            preempt: tokio::sync::Notify::new(),
            peer: std::sync::Mutex::new(String::new()),
            last_used_ms: AtomicU64::new(now_ms()),
            owner: std::sync::Mutex::new(None),
        }
    }

    /// Takes the stream for `who` if it has no owner yet (or one from protected mode, before
    /// a users file: `anonymous`), else checks that `who` owns it.
    fn claim(&self, who: &crate::auth::Identity) -> Result<(), Status> {
        let mut owner = self.owner.lock().unwrap_or_else(|p| p.into_inner());
        match owner.as_deref() {
            Some(o) if *o == *who.name => Ok(()),
            Some(o) if o != crate::auth::ANONYMOUS || who.anonymous => {
                Err(Status::permission_denied(format!(
                    "identity \"{}\" lacks the right \"forward\" on forwarding stream {}: it belongs to another identity",
                    crate::auth::quote(&who.name),
                    self.id
                )))
            }
            _ => {
                *owner = Some(who.name.clone());
                Ok(())
            }
        }
    }

    fn owner(&self) -> Option<Arc<str>> {
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn remember_refusal(&self, seq: u64, r: &v1::ForwardRejection) {
        let mut q = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        q.remember(seq, r.dead_letter_class, &r.reason, now_ms());
    }

    fn refusal_of(&self, seq: u64) -> Option<(i32, String)> {
        let mut q = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        q.find(seq, now_ms())
    }

    fn refused_seqs(&self) -> std::sync::MutexGuard<'_, RefusedState> {
        self.refused_seqs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection's starting point: what is on disk. Every batch of earlier connections
    /// has completed (the serving lock is held), so the chain may accept records again.
    pub(crate) fn resume(&self, accepted: &mut u64) {
        *accepted = self.durable.load(Ordering::Acquire);
        let mut r = self.refused_seqs();
        r.accepted = r.durable.clone();
        drop(r);
        self.chain.reset();
    }

    /// Drops refusals past their retention time.
    pub(crate) fn expire_refusals(&self, now: u64) {
        let mut q = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        q.expire(now);
    }

    #[cfg(test)]
    pub(crate) fn refusals_kept(&self) -> (usize, usize) {
        let q = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        (q.len(), q.bytes())
    }

    pub(crate) fn touch(&self) {
        self.last_used_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }
}

/// A stream's high-water mark as stored in the journal (postcard), version 1. Field order is
/// the format.
#[derive(serde::Serialize, serde::Deserialize)]
struct StreamRecord {
    stream_id: [u8; 16],
    last_seq: u64,
    source: String,
}

/// Version 2: version 1's fields, then the peer and the time of the write (for the per-peer
/// limit and idle pruning after a restart). Field order is the format.
#[derive(serde::Serialize, serde::Deserialize)]
struct StreamRecordV2 {
    stream_id: [u8; 16],
    last_seq: u64,
    source: String,
    peer: String,
    written_ms: u64,
}

impl Streams {
    /// The streams found in the journal.
    pub(crate) fn recover(
        queue_id: u64,
        records: &[RecoveredMessage],
        next_slot: u64,
    ) -> Result<Streams, BrokerError> {
        let mut by_id = HashMap::new();
        for r in records {
            let unreadable = |e: postcard::Error| {
                BrokerError::Internal(format!(
                    "forwarding stream record {} in the journal is unreadable: {e}",
                    r.seq
                ))
            };
            let mut refused = RefusedSeqs::default();
            let (rec, owner) = match postcard::take_from_bytes::<StreamRecordV2>(&r.header) {
                // The owner follows version 2's fields, when there is one, then the refused
                // seqs, when there are any ("" for the owner when there is none).
                Ok((v2, [])) => (v2, None),
                Ok((v2, rest)) => {
                    let (owner, rest) =
                        postcard::take_from_bytes::<&str>(rest).map_err(unreadable)?;
                    if !rest.is_empty() {
                        refused = postcard::from_bytes(rest).map_err(unreadable)?;
                    }
                    (v2, (!owner.is_empty()).then(|| Arc::<str>::from(owner)))
                }
                Err(_) => {
                    let v1: StreamRecord = postcard::from_bytes(&r.header).map_err(unreadable)?;
                    let v2 = StreamRecordV2 {
                        stream_id: v1.stream_id,
                        last_seq: v1.last_seq,
                        peer: format!("source {}", v1.source),
                        source: v1.source,
                        written_ms: now_ms(),
                    };
                    (v2, None)
                }
            };
            let id = uuid::Uuid::from_bytes(rec.stream_id);
            let s = InboundStream::new(id, r.seq, rec.last_seq);
            {
                let mut st = s.refused_seqs();
                st.accepted = refused.clone();
                st.durable = refused;
            }
            *s.peer.lock().unwrap_or_else(|p| p.into_inner()) = rec.peer;
            *s.owner.lock().unwrap_or_else(|p| p.into_inner()) = owner;
            s.last_used_ms.store(rec.written_ms, Ordering::Relaxed);
            by_id.insert(id, Arc::new(s));
        }
        Ok(Streams {
            queue_id,
            next_slot,
            by_id,
            peer_logs: HashMap::new(),
        })
    }

    /// How many streams are kept (each charged to the storage quota).
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The stream `id`, created (unbounded: [`Broker::open_stream`] applies the limits).
    pub(crate) fn get_or_create(&mut self, id: uuid::Uuid) -> Arc<InboundStream> {
        if let Some(s) = self.by_id.get(&id) {
            return s.clone();
        }
        let slot = self.next_slot;
        self.next_slot += 1;
        let s = Arc::new(InboundStream::new(id, slot, 0));
        self.by_id.insert(id, s.clone());
        s
    }
}

type Pending = Pin<Box<dyn Future<Output = Result<v1::ForwardResponse, Status>> + Send>>;

/// Serves one `Forward` stream: stores batches in order and answers each once stored.
pub(crate) async fn forward_stream(
    broker: Arc<Broker>,
    peer: Option<std::net::SocketAddr>,
    auth: Arc<crate::auth::Auth>,
    who: crate::auth::Identity,
    mut inbound: Streaming<v1::ForwardRequest>,
    out: mpsc::Sender<Result<v1::ForwardResponse, Status>>,
) {
    let mut first =
        match crate::service::first_request(&broker, &mut inbound, "a forwarding stream").await {
            Ok(Some(b)) => b,
            Err(status) => {
                // A batch above the size limit, or none in time: the sending broker shows why (its
                // last error).
                if let Some(refused) = crate::service::refused_input(status) {
                    let _ = out.send(Err(refused)).await;
                }
                return;
            }
            Ok(None) => return,
        };
    crate::large_bodies::own_small_forwarded_bodies(&mut first);
    let Ok(id) = uuid::Uuid::from_slice(&first.stream_id) else {
        let _ = out
            .send(Err(Status::invalid_argument(
                "a forwarding stream id must be 16 bytes",
            )))
            .await;
        return;
    };
    if first.source.len() > MAX_SOURCE_BYTES {
        let _ = out
            .send(Err(Status::invalid_argument(format!(
                "a forwarding stream's source is {} bytes; the limit is {MAX_SOURCE_BYTES}",
                first.source.len()
            ))))
            .await;
        return;
    }
    // Streams are counted per sending address (per source name when unknown).
    let peer_key = match peer {
        Some(a) => a.ip().to_string(),
        None => format!("source {}", first.source),
    };
    // Ownership first, so another identity changes nothing of a stream (not even its peer).
    let existing = broker
        .streams
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .by_id
        .get(&id)
        .cloned();
    if let Some(Err(status)) = existing.map(|s| s.claim(&who)) {
        tracing::warn!(identity = %crate::auth::quote(&who.name), peer = ?who.peer, stream = %id, "refused a forwarding stream owned by another identity");
        let _ = out.send(Err(status)).await;
        return;
    }
    let stream = match broker.open_stream(id, &peer_key) {
        Ok(s) => s,
        Err(e) => {
            let _ = out.send(Err(Status::from(e))).await;
            return;
        }
    };
    if let Err(status) = stream.claim(&who) {
        tracing::warn!(identity = %crate::auth::quote(&who.name), peer = ?who.peer, stream = %id, "refused a forwarding stream owned by another identity");
        let _ = out.send(Err(status)).await;
        return;
    }
    // One connection per stream at a time. The sender only reconnects once it has given up on
    // its previous connection, so a new one takes over: the old one (perhaps half-open, its
    // peer gone without a word) is told to stop, finishes what it accepted, and lets go.
    let generation = stream.generation.fetch_add(1, Ordering::AcqRel) + 1;
    stream.preempt.notify_waiters();
    let mut accepted =
        match tokio::time::timeout(TAKEOVER_WAIT, stream.serving.clone().lock_owned()).await {
            Ok(g) => g,
            Err(_) => {
                let _ = out
                    .send(Err(crate::rich_error::status(
                        tonic::Code::Unavailable,
                        mq_proto::reason::STREAM_BUSY,
                        "another connection is still forwarding this stream; retry later",
                    )))
                    .await;
                return;
            }
        };
    // Anything accepted but not stored by an earlier connection was not acknowledged either.
    stream.resume(&mut accepted);
    tracing::info!(source = %quote(&first.source), peer = %peer_key, stream = %id, through = *accepted, "forwarding stream opened");
    let (pending_tx, mut pending_rx) = mpsc::channel::<Pending>(ACK_WINDOW);
    let acker = tokio::spawn(async move {
        // Every batch's future runs to the end, even after a failure or once the sender is
        // gone: it makes stored messages visible (or gives their positions and quota back).
        // After the first failure nothing more is answered, so the sender resends from there.
        let mut done = false;
        while let Some(ack) = pending_rx.recv().await {
            let r = ack.await;
            if done {
                continue;
            }
            let failed = r.is_err();
            if out.send(r).await.is_err() || failed {
                done = true;
            }
        }
    });
    let mut standing = crate::auth::Standing::new(&auth, &who);
    let from = Forwarder {
        auth,
        who: who.clone(),
    };
    let mut next = Some(first);
    loop {
        let batch = match next.take() {
            Some(b) => b,
            None => {
                let preempted = stream.preempt.notified();
                tokio::pin!(preempted);
                preempted.as_mut().enable();
                if stream.generation.load(Ordering::Acquire) != generation {
                    tracing::info!(stream = %id, "forwarding stream taken over by a new connection");
                    break;
                }
                let m = tokio::select! {
                    m = inbound.message() => m,
                    _ = broker.shutting_down() => break,
                    _ = &mut preempted => continue,
                };
                match m {
                    Ok(Some(mut b)) => {
                        crate::large_bodies::own_small_forwarded_bodies(&mut b);
                        b
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "forwarding stream ended by the sender");
                        if let Some(refused) = crate::service::refused_input(status) {
                            // Answered after every batch before it.
                            let _ = pending_tx.send(Box::pin(async move { Err(refused) })).await;
                        }
                        break;
                    }
                }
            }
        };
        // The forwarding identity removed from the users file (or changed) since the stream
        // opened: nothing more is stored (helper-62).
        if let Some(lost) = standing.lost() {
            let _ = pending_tx.send(Box::pin(async move { Err(lost) })).await;
            break;
        }
        if let Err(status) =
            crate::service::check_batch(&broker, batch.messages.len(), "a forwarded batch")
        {
            // Answered after every batch before it; nothing of this one is stored.
            let _ = pending_tx.send(Box::pin(async move { Err(status) })).await;
            break;
        }
        let ack = broker.store_forwarded_by(&stream, &mut accepted, batch, &from);
        if pending_tx.send(ack).await.is_err() {
            break;
        }
        if stream.chain.is_broken() {
            // A batch was not stored: nothing more is accepted on this connection (the sender
            // resends from the failed batch on the next one).
            break;
        }
    }
    drop(pending_tx);
    let _ = acker.await;
    drop(accepted);
}

/// Whether a forwarded message may be stored, else the class and reason it is refused with.
type Refusal = Result<(), (DeadLetterClass, String)>;

/// The identity forwarding on a stream, and the check of its rights on each destination queue.
///
/// A forwarded message needs `send` on its queue here for the forwarding broker's identity
/// (the one it authenticated with, which also needs `forward`). The `sender` it carries is not
/// checked: it names an identity of the sending broker, which this broker cannot verify (a
/// `carol` there is not the `carol` here), so the forwarding broker is the principal this
/// broker's ACLs decide on. MSMQ checks the sender's own rights at the destination; here a
/// destination that wants to tell the users of one sending broker apart gives that broker its
/// own identity and grants per queue.
pub(crate) struct Forwarder {
    auth: Arc<crate::auth::Auth>,
    who: crate::auth::Identity,
}

impl Forwarder {
    /// Everything allowed (tests of the storing logic).
    #[cfg(test)]
    fn trusted() -> Forwarder {
        Forwarder {
            auth: Arc::new(crate::auth::Auth::open()),
            who: crate::auth::Identity::anonymous(None),
        }
    }

    /// `send` for the forwarding identity on `admin_queue` if it is one of this broker's
    /// queues (acknowledgements go to another broker's in the forwarding identity's name,
    /// which that broker checks); what is not checked: [`crate::acks::AckTarget::Unchecked`]
    /// (and a failed lookup: its acknowledgements are dropped).
    fn may_acknowledge_to(&self, broker: &Broker, admin_queue: &str) -> Refusal {
        match crate::acks::ack_target(broker, admin_queue) {
            Ok(crate::acks::AckTarget::Local(q)) => self
                .may_send(&q, &broker.config().name)
                .map_err(|(class, reason)| {
                    (
                        class,
                        format!("its admin queue \"{}\": {reason}", quote(admin_queue)),
                    )
                }),
            _ => Ok(()),
        }
    }

    /// `send` on `queue` for the forwarding identity, else the class and reason to refuse with.
    fn may_send(&self, queue: &Queue, broker: &str) -> Refusal {
        if self
            .auth
            .allowed(&self.who, crate::auth::Right::Send, Some(queue))
        {
            return Ok(());
        }
        Err((
            DeadLetterClass::AccessDenied,
            format!(
                "access denied: identity \"{}\" (the forwarding broker) lacks the right \"send\" on queue \"{}\" on {broker}",
                quote(&self.who.name),
                queue.def().name
            ),
        ))
    }
}

impl Broker {
    /// [`Broker::store_forwarded_by`] for a forwarder with every right.
    #[cfg(test)]
    fn store_forwarded(
        self: &Arc<Self>,
        stream: &Arc<InboundStream>,
        accepted: &mut u64,
        batch: v1::ForwardRequest,
    ) -> Pending {
        self.store_forwarded_by(stream, accepted, batch, &Forwarder::trusted())
    }

    /// Checks and stores one forwarded batch from `from`. Positions and the journal record are
    /// taken now, in stream order; the returned future resolves with the answer once the
    /// record is on disk.
    fn store_forwarded_by(
        self: &Arc<Self>,
        stream: &Arc<InboundStream>,
        accepted: &mut u64,
        batch: v1::ForwardRequest,
        from: &Forwarder,
    ) -> Pending {
        let now = now_ms();
        let n = batch.messages.len();
        if let Some(e) = stream.chain.refusal() {
            let status = Status::from(journal_failed(e));
            return Box::pin(async move { Err(status) });
        }
        // A batch's numbers rise: each is checked against the stream's mark as it was before
        // the batch, so a repeat within one batch (5, 5, 5) was stored as often as it came
        // (helper-65: three copies in a transactional queue), and 9, 7, 8 out of order.
        let mut last = 0u64;
        for seq in batch.messages.iter().map(|m| m.seq).filter(|&s| s != 0) {
            if seq <= last {
                let status = Status::invalid_argument(format!(
                    "forwarding stream {}: a batch's message numbers must rise; {seq} comes after {last}",
                    stream.id
                ));
                return Box::pin(async move { Err(status) });
            }
            last = seq;
        }
        {
            let mut r = stream.refused_seqs();
            r.settled_below = r.settled_below.max(batch.settled_below);
            let floor = r.settled_below;
            r.accepted.prune_below(floor);
            if r.accepted.len() + n > MAX_REFUSED_RANGES {
                let status = Status::resource_exhausted(format!(
                    "forwarding stream {} holds {} ranges of refused messages that the sender has not settled; the limit is {MAX_REFUSED_RANGES}: dead-letter them (and report settled_below) before sending more",
                    stream.id,
                    r.accepted.len()
                ));
                return Box::pin(async move { Err(status) });
            }
        }
        let mut rejected = Vec::new();
        let mut ops = Vec::new();
        let mut durable: Vec<(Arc<Queue>, Entry)> = Vec::new();
        let mut arrived: Vec<(Arc<StoredMessage>, Arc<Queue>)> = Vec::new();
        let mut high = *accepted;
        let any_tx = batch.messages.iter().any(|m| m.transactional);
        let order_guard = any_tx.then(|| self.commit_order_lock());
        let mut cached: Option<(Arc<str>, bool, Arc<Queue>)> = None;
        let mut last_admin = crate::acks::LastAnswer::<Refusal>::new();
        let seqs: Vec<u64> = batch.messages.iter().map(|m| m.seq).collect();
        let before = *accepted;
        for (i, fm) in batch.messages.into_iter().enumerate() {
            if fm.seq != 0 {
                if fm.seq <= *accepted {
                    // A resend: stored before (drop it), or refused before (refuse it again).
                    let class = stream.refused_seqs().accepted.class_of(fm.seq);
                    if let Some(class) = class {
                        let reason = match stream.refusal_of(fm.seq) {
                            Some((c, reason)) if c == class => reason,
                            _ => REASON_FORGOTTEN.to_string(),
                        };
                        rejected.push(v1::ForwardRejection {
                            index: i as u32,
                            dead_letter_class: class,
                            reason,
                        });
                    }
                    continue;
                }
                high = high.max(fm.seq);
            }
            let queue = match &cached {
                Some((d, t, q))
                    if **d == *fm.destination && *t == fm.transactional && !q.is_deleted() =>
                {
                    Ok(q.clone())
                }
                _ => self
                    .forward_target(&fm.destination, fm.transactional)
                    .and_then(|q| from.may_send(&q, &self.config().name).map(|()| q)),
            };
            let queue = match queue {
                Ok(q) => {
                    if !matches!(&cached, Some((d, _, _)) if **d == *fm.destination) {
                        cached = Some((
                            Arc::from(fm.destination.as_str()),
                            fm.transactional,
                            q.clone(),
                        ));
                    }
                    q
                }
                Err((class, reason)) => {
                    rejected.push(rejection(i, class, reason));
                    continue;
                }
            };
            let Some(m) = fm.message else {
                rejected.push(rejection(
                    i,
                    DeadLetterClass::BadMessage,
                    "the forwarded message was empty".into(),
                ));
                continue;
            };
            let msg = match StoredMessage::accept_forwarded(m, fm.transactional, self.config()) {
                // Keeps the format name the sender used (a dead letter names it).
                Ok(m) => StoredMessage {
                    route: cached.as_ref().map(|(d, _, _)| d.clone()),
                    ..m
                },
                Err(e) => {
                    rejected.push(rejection(i, DeadLetterClass::BadMessage, e.to_string()));
                    continue;
                }
            };
            // Its acknowledgements are posted here in the forwarding identity's name: a local
            // admin queue needs `send` for it, as a destination does (helper-62: any user of
            // the sending broker had acks written into any queue here).
            if let Some(aq) = &msg.admin_queue {
                let answer = last_admin.get(aq, || from.may_acknowledge_to(self, aq));
                if let Err((class, reason)) = answer {
                    rejected.push(rejection(i, class, reason));
                    continue;
                }
            }
            if msg.reach_expired(now) {
                rejected.push(rejection(
                    i,
                    DeadLetterClass::ReachQueueTimeout,
                    format!(
                        "it arrived {} ms after its time-to-reach-queue",
                        now.saturating_sub(msg.reach_queue_by_ms)
                    ),
                ));
                continue;
            }
            let charge = msg.charged_bytes();
            if let Err(e) = self.reserve(msg.delivery, charge) {
                rejected.push(rejection(
                    i,
                    DeadLetterClass::QueueExceedQuota,
                    e.to_string(),
                ));
                continue;
            }
            let msg = Arc::new(msg);
            let seq = match queue.admit(std::slice::from_ref(&msg)).map(|mut r| r.pop()) {
                Ok(Some(Ok(seq))) => seq,
                Ok(Some(Err(e))) | Err(e) => {
                    self.release(msg.delivery, charge);
                    let class = match e {
                        BrokerError::QuotaExceeded(_) => DeadLetterClass::QueueExceedQuota,
                        _ => DeadLetterClass::BadDestinationQueue,
                    };
                    rejected.push(rejection(i, class, e.to_string()));
                    continue;
                }
                Ok(None) => unreachable!("one result per message"),
            };
            let arrival = msg.acknowledge != 0;
            match msg.delivery {
                Delivery::Express => {
                    self.insert_or_forget(&queue, vec![Entry::new(seq, msg.clone())])
                }
                Delivery::Recoverable => {
                    ops.push(msg.put_op(queue.def().id, seq));
                    durable.push((queue.clone(), Entry::new(seq, Arc::new(msg.without_body()))));
                }
            }
            if arrival {
                arrived.push((msg, queue));
            }
        }
        // Arrival acks: express ones now, recoverable ones in the batch's record.
        let (express_arrived, durable_arrived): (Vec<_>, Vec<_>) = arrived
            .into_iter()
            .partition(|(m, _)| m.delivery == Delivery::Express);
        fn arrival((m, q): &(Arc<StoredMessage>, Arc<Queue>)) -> crate::acks::AckEvent<'_> {
            crate::acks::AckEvent {
                msg: m,
                class: mq_proto::ack::class::ACK_REACH_QUEUE,
                destination: m
                    .route
                    .as_deref()
                    .map_or_else(|| crate::acks::destination_of(q), str::to_string),
                body: None,
            }
        }
        self.post_acks(express_arrived.iter().map(arrival));
        let mut acks = self.prepare_acks(durable_arrived.iter().map(arrival));
        ops.append(&mut acks.ops);
        let refused_now = {
            let mut state = stream.refused_seqs();
            for r in &rejected {
                let seq = seqs[r.index as usize];
                if seq > before {
                    stream.remember_refusal(seq, r);
                    state.accepted.insert(seq, r.dead_letter_class);
                }
            }
            state.accepted.clone()
        };
        stream.touch();
        if !rejected.is_empty() {
            self.log_refusals(stream, &batch.source, &rejected);
        }
        if high > *accepted {
            *accepted = high;
            let rec = StreamRecordV2 {
                stream_id: *stream.id.as_bytes(),
                last_seq: high,
                source: mq_proto::limits::truncate(&batch.source, MAX_SOURCE_BYTES),
                peer: stream
                    .peer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
                written_ms: now,
            };
            let streams_queue = self
                .streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .queue_id;
            ops.push(Op::Put {
                queue_id: streams_queue,
                seq: stream.slot,
                header: {
                    let mut v =
                        postcard::to_allocvec(&rec).expect("encoding into a Vec cannot fail");
                    let owner = stream.owner();
                    if owner.is_some() || !refused_now.is_empty() {
                        let owner = owner.as_deref().unwrap_or("");
                        v.extend(postcard::to_allocvec(owner).expect("encoding cannot fail"));
                    }
                    if !refused_now.is_empty() {
                        v.extend(
                            postcard::to_allocvec(&refused_now).expect("encoding cannot fail"),
                        );
                    }
                    Bytes::from(v)
                },
                body: Bytes::new(),
            });
        }
        let wrote_mark = high > before;
        let commit = (!ops.is_empty()).then(|| self.journal().submit_chained(ops, &stream.chain));
        drop(order_guard);
        let broker = self.clone();
        let stream = stream.clone();
        let ack = v1::ForwardResponse {
            batch: batch.batch,
            count: n as u32,
            rejected,
        };
        Box::pin(async move {
            if let Some(commit) = commit {
                if let Err(e) = commit.await {
                    acks.abort(&broker);
                    for (q, e) in &durable {
                        q.unadmit(e.seq, e.msg.charged_bytes());
                        broker.release(Delivery::Recoverable, e.msg.charged_bytes());
                    }
                    return Err(Status::from(journal_failed(e)));
                }
            }
            for (q, entries) in group_by_queue(durable) {
                broker.insert_or_forget(&q, entries);
            }
            acks.commit(&broker);
            if wrote_mark {
                // Records complete in stream order, and none after a failed one: this one is
                // the newest on disk.
                stream.refused_seqs().durable = refused_now;
            }
            stream.durable.fetch_max(high, Ordering::AcqRel);
            Ok(ack)
        })
    }

    /// The local queue a forwarded message is for, or why it cannot be delivered.
    fn forward_target(
        &self,
        destination: &str,
        transactional: bool,
    ) -> Result<Arc<Queue>, (DeadLetterClass, String)> {
        let bad = |reason: String| (DeadLetterClass::BadDestinationQueue, reason);
        let parsed = FormatName::parse(destination).map_err(|e| bad(e.to_string()))?;
        let addr = parsed
            .single()
            .ok_or_else(|| bad(format!("\"{}\" is not a single queue", quote(destination))))?;
        if !self.is_local(addr) {
            return Err(bad(format!(
                "\"{}\" is not a queue of this broker ({})",
                quote(destination),
                self.config().name
            )));
        }
        if addr.is_read_only() {
            return Err(bad(format!(
                "\"{}\" is a read-only queue",
                quote(destination)
            )));
        }
        let q = self
            .local_queue(destination, addr)
            .map_err(|e| bad(e.to_string()))?;
        if q.def().transactional && !transactional {
            return Err((
                DeadLetterClass::NotTransactionalMessage,
                format!(
                    "queue \"{}\" on {} is transactional; the message was not sent in a transaction",
                    q.def().name,
                    self.config().name
                ),
            ));
        }
        if !q.def().transactional && transactional {
            return Err((
                DeadLetterClass::NotTransactionalQueue,
                format!(
                    "the message was sent in a transaction; queue \"{}\" on {} is not transactional",
                    q.def().name,
                    self.config().name
                ),
            ));
        }
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;

    fn wire(
        body: &str,
        seq: u64,
        destination: &str,
        delivery: v1::Delivery,
    ) -> v1::ForwardedMessage {
        v1::ForwardedMessage {
            seq,
            destination: destination.to_string(),
            transactional: false,
            message: Some(v1::Message {
                id: bytes::Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
                body: Bytes::copy_from_slice(body.as_bytes()),
                priority: 3,
                delivery: delivery as i32,
                ..Default::default()
            }),
        }
    }

    fn batch(n: u64, messages: Vec<v1::ForwardedMessage>) -> v1::ForwardRequest {
        v1::ForwardRequest {
            stream_id: Bytes::copy_from_slice(&[7u8; 16]),
            source: "a".into(),
            batch: n,
            settled_below: 0,
            messages,
        }
    }

    async fn open(dir: &std::path::Path) -> Arc<Broker> {
        let (b, _) = Broker::open(
            BrokerConfig::new(dir),
            vec!["127.0.0.1:4000".parse().unwrap()],
        )
        .unwrap();
        Arc::new(b)
    }

    /// Creates `.\private$\q`, the queue the tests forward to.
    async fn create_q(b: &Broker) {
        b.create_queue(v1::CreateQueueRequest {
            name: r".\private$\q".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    /// The incoming stream whose id is 16 bytes of `n`.
    fn stream_of(b: &Broker, n: u8) -> Arc<InboundStream> {
        b.streams
            .lock()
            .unwrap()
            .get_or_create(uuid::Uuid::from_bytes([n; 16]))
    }

    fn bodies(b: &Broker, q: &str) -> Vec<String> {
        let q = b.queue(q).unwrap();
        q.peek(100)
            .unwrap()
            .iter()
            .map(|e| String::from_utf8(b.body(&q, e).unwrap().to_vec()).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn resent_batches_are_stored_once_and_refusals_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let q = r"DIRECT=TCP:127.0.0.1:4000\private$\q";
        let missing = r"DIRECT=TCP:127.0.0.1:4000\private$\missing";
        let rec = v1::Delivery::Recoverable;
        {
            let b = open(dir.path()).await;
            create_q(&b).await;
            let stream = stream_of(&b, 7);
            let mut accepted = 0;
            let first = batch(
                1,
                vec![
                    wire("1", 1, q, rec),
                    wire("2", 2, missing, rec),
                    wire("3", 3, q, rec),
                ],
            );
            let ack = b
                .store_forwarded(&stream, &mut accepted, first.clone())
                .await
                .unwrap();
            assert_eq!(ack.rejected.len(), 1);
            assert_eq!(ack.rejected[0].index, 1);
            assert_eq!(
                ack.rejected[0].dead_letter_class,
                DeadLetterClass::BadDestinationQueue as i32
            );
            // The same batch again (its answer was lost): nothing new, the same refusal.
            let again = b
                .store_forwarded(&stream, &mut accepted, first.clone())
                .await
                .unwrap();
            assert_eq!(again.rejected, ack.rejected);
            // Overlapping resend plus new messages, express ones (seq 0) always taken.
            let next = batch(
                2,
                vec![
                    wire("3", 3, q, rec),
                    wire("4", 4, q, rec),
                    wire("e", 0, q, v1::Delivery::Express),
                ],
            );
            let ack = b
                .store_forwarded(&stream, &mut accepted, next)
                .await
                .unwrap();
            assert!(ack.rejected.is_empty());
            assert_eq!(bodies(&b, r".\private$\q"), ["1", "3", "4", "e"]);
            b.close();
        }
        // After a restart the mark is still there: the resend is dropped, the express one is gone.
        let b = open(dir.path()).await;
        let stream = stream_of(&b, 7);
        assert_eq!(stream.durable.load(Ordering::Acquire), 4);
        let mut accepted = stream.durable.load(Ordering::Acquire);
        let resend = batch(
            1,
            vec![
                wire("3", 3, q, rec),
                wire("4", 4, q, rec),
                wire("5", 5, q, rec),
            ],
        );
        let ack = b
            .store_forwarded(&stream, &mut accepted, resend)
            .await
            .unwrap();
        assert!(ack.rejected.is_empty());
        assert_eq!(bodies(&b, r".\private$\q"), ["1", "3", "4", "5"]);
    }

    #[tokio::test]
    async fn forwarded_transactional_messages_must_be_recoverable_at_priority_0() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path()).await;
        b.create_queue(v1::CreateQueueRequest {
            name: r".\private$\tx".into(),
            transactional: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let stream = b
            .streams
            .lock()
            .unwrap()
            .get_or_create(uuid::Uuid::now_v7());
        let mut accepted = 0;
        let dest = r"DIRECT=TCP:127.0.0.1:4000\private$\tx";
        let mut express = wire("e", 1, dest, v1::Delivery::Express);
        express.transactional = true;
        express.message.as_mut().unwrap().priority = 0;
        let mut high = wire("p", 2, dest, v1::Delivery::Recoverable);
        high.transactional = true;
        high.message.as_mut().unwrap().priority = 7;
        let mut ok = wire("ok", 3, dest, v1::Delivery::Recoverable);
        ok.transactional = true;
        ok.message.as_mut().unwrap().priority = 0;
        let ack = b
            .store_forwarded(&stream, &mut accepted, batch(1, vec![express, high, ok]))
            .await
            .unwrap();
        let refused: Vec<(u32, i32)> = ack
            .rejected
            .iter()
            .map(|r| (r.index, r.dead_letter_class))
            .collect();
        assert_eq!(
            refused,
            [
                (0, DeadLetterClass::BadMessage as i32),
                (1, DeadLetterClass::BadMessage as i32)
            ]
        );
        assert!(
            ack.rejected[0].reason.contains("express"),
            "{:?}",
            ack.rejected
        );
        assert_eq!(bodies(&b, r".\private$\tx"), ["ok"]);
    }

    #[tokio::test]
    async fn forwarded_messages_are_checked_like_local_sends() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path()).await;
        b.create_queue(v1::CreateQueueRequest {
            name: r".\private$\tx".into(),
            transactional: true,
            ..Default::default()
        })
        .await
        .unwrap();
        b.create_queue(v1::CreateQueueRequest {
            name: r".\private$\small".into(),
            quota_bytes: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
        let stream = b
            .streams
            .lock()
            .unwrap()
            .get_or_create(uuid::Uuid::now_v7());
        let mut accepted = 0;
        let mut late = wire(
            "late",
            4,
            r"DIRECT=TCP:127.0.0.1:4000\private$\small",
            v1::Delivery::Recoverable,
        );
        late.message.as_mut().unwrap().reach_queue_by_ms = 1;
        let msgs = vec![
            wire(
                "a",
                1,
                r"DIRECT=TCP:127.0.0.1:4000\private$\tx",
                v1::Delivery::Recoverable,
            ),
            wire(
                "b",
                2,
                r"DIRECT=TCP:127.0.0.1:4000\private$\small",
                v1::Delivery::Recoverable,
            ),
            wire(
                "c",
                3,
                r"DIRECT=TCP:127.0.0.1:4001\private$\tx",
                v1::Delivery::Recoverable,
            ),
            late,
            wire(
                "d",
                5,
                r"DIRECT=TCP:127.0.0.1:4000\SYSTEM$;DEADLETTER",
                v1::Delivery::Recoverable,
            ),
        ];
        let ack = b
            .store_forwarded(&stream, &mut accepted, batch(1, msgs))
            .await
            .unwrap();
        let classes: Vec<i32> = ack.rejected.iter().map(|r| r.dead_letter_class).collect();
        assert_eq!(
            classes,
            [
                DeadLetterClass::NotTransactionalMessage as i32,
                DeadLetterClass::QueueExceedQuota as i32,
                DeadLetterClass::BadDestinationQueue as i32,
                DeadLetterClass::ReachQueueTimeout as i32,
                DeadLetterClass::BadDestinationQueue as i32,
            ]
        );
        assert_eq!(accepted, 5);
    }

    /// Issue 11 (15): 1,008 refusals of a 1 MiB name took 1.2 GiB. Refusals kept per stream are
    /// bounded in count and bytes, and each reason (kept or answered) is cut short.
    #[tokio::test]
    async fn refusals_of_huge_names_are_kept_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path()).await;
        let stream = b
            .streams
            .lock()
            .unwrap()
            .get_or_create(uuid::Uuid::now_v7());
        let mut accepted = 0;
        let huge = format!(
            r"DIRECT=TCP:127.0.0.1:4000\private$\{}",
            "n".repeat(100_000)
        );
        for n in 0..40u64 {
            let msgs = (1..=50)
                .map(|i| wire("x", n * 50 + i, &huge, v1::Delivery::Recoverable))
                .collect();
            let ack = b
                .store_forwarded(&stream, &mut accepted, batch(n + 1, msgs))
                .await
                .unwrap();
            assert_eq!(ack.rejected.len(), 50);
            for r in &ack.rejected {
                assert!(
                    r.reason.len() <= mq_proto::limits::MAX_REASON_BYTES,
                    "{}",
                    r.reason.len()
                );
            }
        }
        let (count, bytes) = stream.refusals_kept();
        assert!(
            count <= crate::stream_bounds::MAX_REFUSALS_PER_STREAM,
            "{count}"
        );
        assert!(
            bytes <= crate::stream_bounds::MAX_REFUSAL_BYTES_PER_STREAM,
            "{bytes}"
        );
        // The latest one is still answered again on a resend.
        let again = b
            .store_forwarded(
                &stream,
                &mut accepted,
                batch(99, vec![wire("x", 2000, &huge, v1::Delivery::Recoverable)]),
            )
            .await
            .unwrap();
        assert_eq!(again.rejected.len(), 1);
    }

    /// Review C2: a refusal is journaled with the mark, so a resend after a restart (or after
    /// the bounded memory of reasons has let it go) is refused again, never dropped as a
    /// duplicate; the sender's `settled_below` lets refusals go.
    #[tokio::test]
    async fn refusals_are_answered_again_after_a_restart_and_beyond_the_memory_bound() {
        let dir = tempfile::tempdir().unwrap();
        let q = r"DIRECT=TCP:127.0.0.1:4000\private$\q";
        let missing = r"DIRECT=TCP:127.0.0.1:4000\private$\missing";
        let rec = v1::Delivery::Recoverable;
        let first = batch(
            1,
            vec![
                wire("1", 1, q, rec),
                wire("2", 2, missing, rec),
                wire("3", 3, q, rec),
            ],
        );
        let huge = format!(r"DIRECT=TCP:127.0.0.1:4000\private$\{}", "n".repeat(2_000));
        {
            let b = open(dir.path()).await;
            create_q(&b).await;
            let stream = stream_of(&b, 7);
            let mut accepted = 0;
            let ack = b
                .store_forwarded(&stream, &mut accepted, first.clone())
                .await
                .unwrap();
            assert_eq!(ack.rejected.len(), 1);
            // Far more refusals than the memory of reasons keeps.
            for n in 0..20u64 {
                let msgs = (0..100)
                    .map(|i| wire("x", 10 + n * 100 + i, &huge, rec))
                    .collect();
                let ack = b
                    .store_forwarded(&stream, &mut accepted, batch(2 + n, msgs))
                    .await
                    .unwrap();
                assert_eq!(ack.rejected.len(), 100);
            }
            // The oldest reasons are gone from memory; the refusals are not.
            let old: Vec<_> = (10..110).map(|s| wire("x", s, &huge, rec)).collect();
            let ack = b
                .store_forwarded(&stream, &mut accepted, batch(30, old))
                .await
                .unwrap();
            assert_eq!(
                ack.rejected.len(),
                100,
                "every refused resend is refused again"
            );
            assert_eq!(ack.rejected[0].reason, REASON_FORGOTTEN);
            assert_eq!(
                ack.rejected[0].dead_letter_class,
                DeadLetterClass::BadDestinationQueue as i32
            );
            b.close();
        }
        let b = open(dir.path()).await;
        let stream = stream_of(&b, 7);
        let mut accepted = stream.durable.load(Ordering::Acquire);
        assert_eq!(accepted, 2009);
        // After the restart: the stored ones are duplicates, the refused one is refused again.
        let ack = b
            .store_forwarded(&stream, &mut accepted, first.clone())
            .await
            .unwrap();
        let refused: Vec<(u32, i32)> = ack
            .rejected
            .iter()
            .map(|r| (r.index, r.dead_letter_class))
            .collect();
        assert_eq!(refused, [(1, DeadLetterClass::BadDestinationQueue as i32)]);
        assert_eq!(bodies(&b, r".\private$\q"), ["1", "3"]);
        // Once the sender says it settled everything below 3, seq 2 is forgotten.
        let mut settled = first.clone();
        settled.settled_below = 3;
        let ack = b
            .store_forwarded(&stream, &mut accepted, settled)
            .await
            .unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        assert_eq!(bodies(&b, r".\private$\q"), ["1", "3"]);
    }

    /// Review C3: a batch whose record failed (ENOSPC part way through its write) is not
    /// covered by the mark of a later batch: the later one fails unwritten, and after the
    /// sender reconnects the resent batch is stored, not dropped as a duplicate.
    #[tokio::test]
    async fn a_failed_batch_is_not_covered_by_a_later_mark() {
        let dir = tempfile::tempdir().unwrap();
        let io = crate::journal::FaultyIo::new(3);
        let mut config = BrokerConfig::new(dir.path());
        config.journal_io = Some(Arc::new(io.clone()));
        let (b, _) = Broker::open(config, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
        let b = Arc::new(b);
        b.create_queue(v1::CreateQueueRequest {
            name: r".\private$\q".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let q = r"DIRECT=TCP:127.0.0.1:4000\private$\q";
        let rec = v1::Delivery::Recoverable;
        let stream = b
            .streams
            .lock()
            .unwrap()
            .get_or_create(uuid::Uuid::from_bytes([9; 16]));
        let one = batch(
            1,
            (1..=3).map(|s| wire(&s.to_string(), s, q, rec)).collect(),
        );
        let two = batch(
            2,
            (4..=6).map(|s| wire(&s.to_string(), s, q, rec)).collect(),
        );
        let mut accepted = 0;
        io.fail_next_write_with_enospc_after(100);
        let first = b.store_forwarded(&stream, &mut accepted, one.clone()).await;
        assert!(first.is_err(), "the write failed");
        // The connection goes on (a pipelined batch): it must not be stored with its mark.
        let second = b.store_forwarded(&stream, &mut accepted, two.clone()).await;
        assert!(second.is_err(), "a batch after a failed one is not stored");
        assert_eq!(stream.durable.load(Ordering::Acquire), 0);
        // The sender reconnects and resends both (the disk-full mode ends by itself).
        let mut stored = false;
        for _ in 0..100 {
            stream.resume(&mut accepted);
            let a = b.store_forwarded(&stream, &mut accepted, one.clone()).await;
            let c = b.store_forwarded(&stream, &mut accepted, two.clone()).await;
            if a.is_ok() && c.is_ok() {
                stored = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(stored, "the resend was stored once space was back");
        assert_eq!(bodies(&b, r".\private$\q"), ["1", "2", "3", "4", "5", "6"]);
    }

    /// At the broker-wide limit of forwarding streams, another peer's idle stream that never
    /// stored anything gives way to a new peer (there is no mark to forget); one that stored
    /// something never does (helper-65: 4,096 empty streams refused every new peer for 24 h).
    #[tokio::test]
    async fn streams_that_stored_nothing_give_way_to_another_peer() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = BrokerConfig::new(dir.path());
        c.max_forward_streams = 4;
        let (b, _) = Broker::open(c, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
        let b = Arc::new(b);
        let q = r"DIRECT=TCP:127.0.0.1:4000\private$\missing";
        for _ in 0..4 {
            drop(b.open_stream(uuid::Uuid::now_v7(), "10.0.0.1").unwrap());
        }
        // Full of empty idle streams of 10.0.0.1: 10.0.0.2 still gets one.
        let mut kept = Vec::new();
        for _ in 0..4 {
            let s = b.open_stream(uuid::Uuid::now_v7(), "10.0.0.2").unwrap();
            let mut accepted = 0;
            b.store_forwarded(
                &s,
                &mut accepted,
                batch(1, vec![wire("x", 1, q, v1::Delivery::Recoverable)]),
            )
            .await
            .unwrap();
            kept.push(s.id);
        }
        assert_eq!(b.streams.lock().unwrap().len(), 4);
        // Now every stream has a mark: a third peer is refused, and none of them is forgotten.
        let e = b.open_stream(uuid::Uuid::now_v7(), "10.0.0.3").unwrap_err();
        assert!(matches!(e, BrokerError::QuotaExceeded(_)), "{e}");
        let streams = b.streams.lock().unwrap();
        assert!(kept.iter().all(|id| streams.by_id.contains_key(id)));
        drop(streams);
        b.close();
    }

    /// Issue 11 (2): a loop of random stream ids from one peer keeps at most the per-peer limit
    /// of streams, in memory, in the storage quota and in the journal (after a restart).
    #[tokio::test]
    async fn random_stream_ids_do_not_pile_up() {
        let dir = tempfile::tempdir().unwrap();
        let config = || {
            let mut c = BrokerConfig::new(dir.path());
            c.max_forward_streams_per_peer = 8;
            c
        };
        let open_with = |c: BrokerConfig| {
            let (b, _) = Broker::open(c, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
            Arc::new(b)
        };
        let q = r"DIRECT=TCP:127.0.0.1:4000\private$\missing";
        {
            let b = open_with(config());
            let base = b.stored_used();
            for _ in 0..100 {
                let s = b.open_stream(uuid::Uuid::now_v7(), "10.0.0.1").unwrap();
                let mut accepted = 0;
                // Every message refused: the stream still gets its mark written.
                let ack = b
                    .store_forwarded(
                        &s,
                        &mut accepted,
                        batch(1, vec![wire("x", 1, q, v1::Delivery::Recoverable)]),
                    )
                    .await
                    .unwrap();
                assert_eq!(ack.rejected.len(), 1);
            }
            assert_eq!(b.streams.lock().unwrap().len(), 8);
            assert_eq!(
                b.stored_used() - base,
                8 * crate::stream_bounds::STREAM_RECORD_CHARGE
            );
            // Another peer has its own allowance; the total is bounded too.
            b.open_stream(uuid::Uuid::now_v7(), "10.0.0.2").unwrap();
            assert_eq!(b.streams.lock().unwrap().len(), 9);
            b.close();
        }
        // The one without a batch has no record: after a restart only the eight are there.
        let b = open_with(config());
        assert_eq!(
            b.streams.lock().unwrap().len(),
            8,
            "recovery keeps what was kept"
        );
        assert_eq!(
            b.stored_used(),
            8 * crate::stream_bounds::STREAM_RECORD_CHARGE,
            "recovery charges each kept stream"
        );
        // Idle ones are pruned, with their charge.
        assert_eq!(b.prune_streams(Duration::ZERO), 8);
        assert_eq!(b.stored_used(), 0);
        b.close();
        let b = open_with(config());
        assert_eq!(b.streams.lock().unwrap().len(), 0, "their records are gone");
    }
}
