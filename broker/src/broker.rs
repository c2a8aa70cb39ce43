//! The broker: its queues by name, the express memory quota, and name resolution
//! ("is this format name one of my queues?").

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;

use mq_proto::format_name::{FormatName, QueueAddress, QueueKind};
use mq_proto::limits::quote;
use mq_proto::v1;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::journal::{Journal, JournalOptions, Op};
use crate::message::{Delivery, StoredMessage};
use crate::queue::{group_by_queue, Entry, Queue, QueueDef, QueueRole};

/// The broker's state, shared by every connection.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    local_addrs: Vec<SocketAddr>,
    /// `config.name` and `config.aliases`: the host names (and IP aliases) that are local.
    local_names: Vec<String>,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    journal: Journal,
    /// Held while transactional messages get their queue positions and their journal record is
    /// submitted, so queue order, journal order and commit order agree.
    commit_order: std::sync::Mutex<()>,
    next_queue_id: AtomicU64,
    express_used: AtomicU64,
    /// How many of `queues` are the broker's own (not counted against `--max-queues`).
    own_queues: usize,
    stored_used: AtomicU64,
    /// The header budget of the queues that page (`crate::header_windows`).
    header_windows: Arc<crate::header_windows::HeaderWindows>,
    shutdown: tokio::sync::watch::Sender<bool>,
    dead_letter: Arc<Queue>,
    dead_xact: Arc<Queue>,
    /// Outgoing queues by destination (`host:port`), each with its forwarder.
    pub(crate) outgoing: RwLock<HashMap<String, Arc<crate::forward::Outgoing>>>,
    /// The receive side of forwarding: highest stored sequence per incoming stream.
    pub(crate) streams: std::sync::Mutex<crate::inbound::Streams>,
    /// Which transaction ids committed (see `outcome.rs`).
    outcomes: std::sync::Mutex<crate::outcome::Outcomes>,
    /// The runtime background tasks (forwarders, expiry sweep) run on, once started.
    background: std::sync::Mutex<Option<tokio::runtime::Handle>>,
    /// Bytes staged by all open transactions (`mqd --max-tx-total-bytes`).
    pub(crate) tx_staged: crate::flow::Budget,
    /// Counters for the metrics that nothing else keeps.
    counters: Arc<crate::metrics::Counters>,
    /// Acknowledgements to admin queues (`acks.rs`).
    pub(crate) acks: crate::acks::AckState,
    /// The totals saved across restarts (see `counters_store.rs`).
    counters_store: std::sync::Mutex<crate::counters_store::Store>,
    /// The queues whose saved totals are out of date (see `counters_store.rs`).
    changed_queues: Arc<crate::counters_store::ChangedQueues>,
    /// The earliest moment any registered queue may have something to sweep (`deadletter.rs`).
    pub(crate) sweep_hint: Arc<crate::queue::SweepHint>,
    /// When `sweep_expired` last walked every queue whatever the hint said (a safety net).
    pub(crate) last_full_sweep: std::sync::Mutex<std::time::Instant>,
    /// Held by a change of a queue's definition (ACL, properties, an outgoing queue's pause,
    /// a deletion) from reading the current definition until the change is journaled and
    /// applied: a change takes effect in memory only once its record is on disk.
    pub(crate) redefinitions: tokio::sync::Mutex<()>,
}

/// Bodies up to this size come back with a paged header (read with it, so delivery reads
/// nothing more); a window's entries then hold them.
const PAGED_BODY_MAX: u32 = 1024;

/// Reads paged message headers back from the journal (see `queue.rs`, "Headers paged").
struct JournalHeaders(Journal);

impl crate::queue::HeaderSource for JournalHeaders {
    fn headers(&self, queue_id: u64, seqs: &[u64]) -> Result<Vec<StoredMessage>, BrokerError> {
        let raw = self
            .0
            .read_headers(queue_id, seqs, PAGED_BODY_MAX)
            .map_err(|e| {
                BrokerError::Internal(format!(
                    "cannot read message headers of queue {queue_id} from the journal: {e}"
                ))
            })?;
        raw.into_iter()
            .zip(seqs)
            .map(|((h, body_len, body), seq)| {
                let mut m = StoredMessage::decode_header(&h, body_len).map_err(|e| {
                    BrokerError::Internal(format!(
                        "message {seq} of queue {queue_id} in the journal is unreadable: {e}"
                    ))
                })?;
                m.body = body;
                Ok(m)
            })
            .collect()
    }
}

/// Makes an application queue page its headers (`BrokerConfig::queue_header_window`).
/// Recovered messages whose headers are read from the journal at a time (the journal leaves
/// them on disk: `JournalOptions::recover_headers` is false).
const RECOVERY_BATCH: usize = 4096;

/// Fills in the headers of `batch` (recovered messages of queue `queue_id`) from the journal.
fn read_recovered_headers(
    journal: &Journal,
    queue_id: u64,
    batch: &mut [crate::journal::RecoveredMessage],
) -> Result<(), BrokerError> {
    let seqs: Vec<u64> = batch.iter().map(|m| m.seq).collect();
    let read = journal.read_headers(queue_id, &seqs, 0).map_err(|e| {
        BrokerError::Internal(format!(
            "recovery: reading the headers of queue {queue_id}'s messages: {e}"
        ))
    })?;
    for (m, (header, _, _)) in batch.iter_mut().zip(read) {
        m.header = header;
    }
    Ok(())
}

fn page(q: &Queue, journal: &Journal, windows: &Arc<crate::header_windows::HeaderWindows>) {
    let window = windows.max();
    // The dead-letter queues too: a dead letter's journal record is a `Put` of its own header,
    // dead-letter info included (`deadletter.rs`). Subqueues, journal queues and outgoing
    // queues keep every header in memory.
    let paged = matches!(
        q.def().role,
        QueueRole::Normal | QueueRole::DeadLetter | QueueRole::DeadXact
    );
    if paged && window > 0 {
        q.set_paging(crate::queue::Paging {
            window,
            share: Some(windows.join()),
            source: Arc::new(JournalHeaders(journal.clone())),
        });
    }
}

/// Keys of the system queues.
pub(crate) const DEADLETTER_KEY: &str = "system$;deadletter";
pub(crate) const DEADXACT_KEY: &str = "system$;deadxact";
const STREAMS_KEY: &str = "system$;streams";
const TXOUTCOMES_KEY: &str = "system$;txoutcomes";
const COUNTERS_KEY: &str = "system$;counters";

/// Where a send goes: a queue of this broker, or the outgoing queue of another broker with the
/// remote queue's format name.
#[derive(Debug, Clone)]
pub struct Target {
    pub queue: Arc<Queue>,
    pub route: Option<Arc<str>>,
}

/// Where a send will go, checked as a whole before anything is created: local queues, and the
/// brokers whose outgoing queues are looked up (or created) only once a message is stored.
#[derive(Debug, Clone, Default)]
pub struct Destinations {
    planned: Vec<Planned>,
}

#[derive(Debug, Clone)]
enum Planned {
    Local(Arc<Queue>),
    /// `host:port` of the broker, and the queue's format name there.
    Remote(String, Arc<str>),
}

impl Destinations {
    /// How many queues get a copy of each message.
    pub fn len(&self) -> usize {
        self.planned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.planned.is_empty()
    }

    /// Each destination: its local queue, or `None` for another broker's queue (for rights).
    pub(crate) fn local_queues(&self) -> impl Iterator<Item = Option<&Arc<Queue>>> {
        self.planned.iter().map(|p| match p {
            Planned::Local(q) => Some(q),
            Planned::Remote(..) => None,
        })
    }

    /// Refuses a local queue of the other kind: a transactional queue takes only
    /// transactional sends, and the others only non-transactional ones.
    pub(crate) fn check_kinds(&self, transactional: bool) -> Result<(), BrokerError> {
        for q in self.local_queues().flatten() {
            if q.def().transactional && !transactional {
                return Err(BrokerError::FailedPrecondition(format!(
                    "queue \"{}\" is transactional and accepts only transactional sends; this send is not transactional (use mq send --tx, or a transaction)",
                    q.def().name
                )));
            }
            if !q.def().transactional && transactional {
                return Err(BrokerError::FailedPrecondition(format!(
                    "queue \"{}\" is not transactional and accepts only non-transactional sends; this send is transactional (create the queue with --transactional)",
                    q.def().name
                )));
            }
        }
        Ok(())
    }

    /// Whether every local queue still exists (so the resolution can be reused).
    pub(crate) fn is_current(&self) -> bool {
        self.planned.iter().all(|p| match p {
            Planned::Local(q) => !q.is_deleted(),
            Planned::Remote(..) => true,
        })
    }
}

/// A queue definition as stored in the journal (postcard), version 1. Field order is the format.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct QueueDefRecord {
    name: String,
    key: String,
    transactional: bool,
    quota_bytes: Option<u64>,
    label: String,
    created_ms: u64,
}

/// Version 2: version 1's fields, then the queue's role. Field order is the format.
#[derive(serde::Serialize, serde::Deserialize)]
struct QueueDefRecordV2 {
    name: String,
    key: String,
    transactional: bool,
    quota_bytes: Option<u64>,
    label: String,
    created_ms: u64,
    role: RoleRecord,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum RoleRecord {
    Normal,
    DeadLetter,
    DeadXact,
    Outgoing {
        destination: String,
        stream_id: [u8; 16],
        paused: bool,
    },
    Streams,
    TxOutcomes,
    Subqueue,
    Journal,
    Counters,
}

impl QueueDefRecord {
    pub(crate) fn encode(def: &QueueDef) -> Bytes {
        let role = match &def.role {
            QueueRole::Normal => RoleRecord::Normal,
            QueueRole::DeadLetter => RoleRecord::DeadLetter,
            QueueRole::DeadXact => RoleRecord::DeadXact,
            QueueRole::Outgoing {
                destination,
                stream_id,
                paused,
            } => RoleRecord::Outgoing {
                destination: destination.clone(),
                stream_id: *stream_id.as_bytes(),
                paused: *paused,
            },
            QueueRole::Streams => RoleRecord::Streams,
            QueueRole::TxOutcomes => RoleRecord::TxOutcomes,
            QueueRole::Subqueue => RoleRecord::Subqueue,
            QueueRole::Journal => RoleRecord::Journal,
            QueueRole::Counters => RoleRecord::Counters,
        };
        let r = QueueDefRecordV2 {
            name: def.name.clone(),
            key: def.key.clone(),
            transactional: def.transactional,
            quota_bytes: def.quota_bytes,
            label: def.label.clone(),
            created_ms: def.created_ms,
            role,
        };
        let mut v = postcard::to_allocvec(&r).expect("encoding into a Vec cannot fail");
        let journal = def.journal != crate::journal_queue::JournalPolicy::default();
        // Version 3: the ACL follows version 2's fields, only when there is one (or the poison
        // policy follows).
        if !def.acl.0.is_empty() || !def.poison.is_default() || journal {
            v.extend(postcard::to_allocvec(&def.acl).expect("encoding into a Vec cannot fail"));
        }
        // Version 4: the poison policy follows the ACL, only when there is one (or the
        // journal policy follows).
        if !def.poison.is_default() || journal {
            v.extend(postcard::to_allocvec(&def.poison).expect("encoding into a Vec cannot fail"));
        }
        // Version 5: the journal policy follows the poison policy, only when there is one.
        if journal {
            v.extend(postcard::to_allocvec(&def.journal).expect("encoding into a Vec cannot fail"));
        }
        Bytes::from(v)
    }

    pub(crate) fn decode(id: u64, bytes: &[u8]) -> Result<QueueDef, postcard::Error> {
        let mut acl = crate::auth::Acl::default();
        let mut poison = crate::subqueue::PoisonPolicy::default();
        let mut journal = crate::journal_queue::JournalPolicy::default();
        let r = match postcard::take_from_bytes::<QueueDefRecordV2>(bytes) {
            Ok((r, rest)) => {
                if !rest.is_empty() {
                    let (a, rest) = postcard::take_from_bytes(rest)?;
                    acl = a;
                    if !rest.is_empty() {
                        let (p, rest) = postcard::take_from_bytes(rest)?;
                        poison = p;
                        if !rest.is_empty() {
                            journal = postcard::from_bytes(rest)?;
                        }
                    }
                }
                r
            }
            Err(_) => {
                let v1: QueueDefRecord = postcard::from_bytes(bytes)?;
                QueueDefRecordV2 {
                    name: v1.name,
                    key: v1.key,
                    transactional: v1.transactional,
                    quota_bytes: v1.quota_bytes,
                    label: v1.label,
                    created_ms: v1.created_ms,
                    role: RoleRecord::Normal,
                }
            }
        };
        let role = match r.role {
            RoleRecord::Normal => QueueRole::Normal,
            RoleRecord::DeadLetter => QueueRole::DeadLetter,
            RoleRecord::DeadXact => QueueRole::DeadXact,
            RoleRecord::Outgoing {
                destination,
                stream_id,
                paused,
            } => QueueRole::Outgoing {
                destination,
                stream_id: uuid::Uuid::from_bytes(stream_id),
                paused,
            },
            RoleRecord::Streams => QueueRole::Streams,
            RoleRecord::TxOutcomes => QueueRole::TxOutcomes,
            RoleRecord::Subqueue => QueueRole::Subqueue,
            RoleRecord::Journal => QueueRole::Journal,
            RoleRecord::Counters => QueueRole::Counters,
        };
        Ok(QueueDef {
            id,
            name: r.name,
            key: r.key,
            transactional: r.transactional,
            quota_bytes: r.quota_bytes,
            label: r.label,
            created_ms: r.created_ms,
            role,
            acl,
            poison,
            journal,
        })
    }
}

/// What recovery found, for the start-up log.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecoveryReport {
    pub queues: usize,
    pub messages: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub segments: usize,
    pub truncated: bool,
}

/// The outcome of one send batch: per message, its id or why it was refused.
#[derive(Debug)]
pub struct BatchOutcome {
    pub ids: Vec<Option<uuid::Uuid>>,
    pub failures: Vec<(usize, BrokerError)>,
}

impl Broker {
    /// Opens the broker's journal in `config.data_dir`, rebuilds every queue and its
    /// recoverable messages, and answers to `config.name` and `local_addrs`.
    pub fn open(
        config: BrokerConfig,
        local_addrs: Vec<SocketAddr>,
    ) -> Result<(Self, RecoveryReport), BrokerError> {
        // A commit's answer names each send of its transaction; clients decode at most
        // MAX_MAX_TX_MESSAGES of them (mqd's flag has the same range).
        if config.flow.max_tx_messages > crate::config::MAX_MAX_TX_MESSAGES {
            return Err(BrokerError::InvalidArgument(format!(
                "max_tx_messages is {}; at most {} (a commit's answer names each send)",
                config.flow.max_tx_messages,
                crate::config::MAX_MAX_TX_MESSAGES
            )));
        }
        // Requests are refused undecoded when their batches pass this (mq_proto::entries);
        // the service's own check then holds each broker of the process to its own limit.
        mq_proto::entries::allow_batch_messages(config.flow.max_batch_messages);
        let opts = JournalOptions {
            segment_size: config.journal_segment_bytes,
            truncate_damaged: config.truncate_damaged_journal,
            body_cache_bytes: config.journal_body_cache_bytes,
            idle_spin: config.journal_idle_spin,
            inline_commits: config.journal_inline_commits,
            // Read below, a batch at a time: never every header at once.
            recover_headers: false,
            ..JournalOptions::default()
        };
        let dir = config.data_dir.join("journal");
        let opened = match &config.journal_io {
            Some(io) => Journal::open_with_io(&dir, opts, io.clone()),
            None => Journal::open(&dir, opts),
        };
        let (journal, mut rec) = opened.map_err(|e| match e {
            crate::journal::JournalError::Damaged { .. }
            | crate::journal::JournalError::Corrupt { .. } => {
                BrokerError::FailedPrecondition(format!("cannot open the journal: {e}"))
            }
            e => BrokerError::Internal(format!("cannot open the journal: {e}")),
        })?;
        let mut report = RecoveryReport {
            segments: rec.segments,
            truncated: rec.truncated.is_some(),
            seconds: rec.elapsed.as_secs_f64(),
            ..RecoveryReport::default()
        };
        let mut queues = HashMap::new();
        // The headers all paged queues' windows may hold, shared out among them.
        let header_windows = crate::header_windows::HeaderWindows::new(
            config.max_window_headers,
            config.queue_header_window,
        );
        let mut stored = 0u64;
        let mut streams = crate::inbound::Streams::default();
        let mut outcomes: Option<crate::outcome::Outcomes> = None;
        let mut saved_counters = None;
        let changed_queues = Arc::new(crate::counters_store::ChangedQueues::default());
        let sweep_hint = Arc::new(crate::queue::SweepHint::default());
        let mut special: HashMap<&'static str, Arc<Queue>> = HashMap::new();
        for (id, def) in &rec.queues {
            let def = QueueDefRecord::decode(*id, def).map_err(|e| {
                BrokerError::Internal(format!(
                    "queue definition {id} in the journal is unreadable: {e}"
                ))
            })?;
            let mut recovered = rec.messages.remove(id).unwrap_or_default();
            let next_seq = rec.max_seq.get(id).copied().unwrap_or(0) + 1;
            if matches!(
                def.role,
                QueueRole::Streams | QueueRole::Counters | QueueRole::TxOutcomes
            ) {
                read_recovered_headers(&journal, *id, &mut recovered)?;
            }
            if def.role == QueueRole::Streams {
                streams = crate::inbound::Streams::recover(*id, &recovered, next_seq)?;
                continue;
            }
            if def.role == QueueRole::Counters {
                saved_counters = Some(crate::counters_store::Store::recover(*id, &recovered));
                continue;
            }
            if def.role == QueueRole::TxOutcomes {
                let (o, expired) = crate::outcome::Outcomes::recover(
                    *id,
                    &recovered,
                    next_seq,
                    config.tx_outcome_retention,
                    config.tx_outcome_max,
                )?;
                if !expired.is_empty() {
                    drop(journal.submit(vec![Op::Remove {
                        queue_id: *id,
                        seqs: expired,
                    }]));
                }
                outcomes = Some(o);
                continue;
            }
            let q = Queue::new_counted(def, &changed_queues, &sweep_hint);
            page(&q, &journal, &header_windows);
            let mut entries = Vec::new();
            let mut loaded = 0u64;
            // One shared copy of each route (an outgoing queue's messages mostly share a few).
            let mut routes: HashMap<Arc<str>, ()> = HashMap::new();
            // Headers are read a batch at a time, and a queue that pages keeps only its windows'
            // headers, so the decoded headers of the rest go as soon as they are loaded.
            for batch in recovered.chunks_mut(RECOVERY_BATCH) {
                read_recovered_headers(&journal, *id, batch)?;
                for m in batch.iter_mut() {
                    let header = std::mem::take(&mut m.header);
                    let mut msg =
                        StoredMessage::decode_header(&header, m.body_len).map_err(|e| {
                            BrokerError::Internal(format!(
                                "message {} of queue {id} in the journal is unreadable: {e}",
                                m.seq
                            ))
                        })?;
                    if let Some(r) = msg.route.take() {
                        let shared = match routes.get_key_value(&r) {
                            Some((k, _)) => k.clone(),
                            None => {
                                routes.insert(r.clone(), ());
                                r
                            }
                        };
                        msg.route = Some(shared);
                    }
                    stored += msg.charged_bytes();
                    report.bytes += m.body_len as u64;
                    entries.push(Entry::new(m.seq, Arc::new(msg)));
                }
                loaded += entries.len() as u64;
                q.load(std::mem::take(&mut entries), next_seq);
            }
            drop(recovered);
            report.messages += loaded;
            q.load(entries, next_seq);
            match q.def().role {
                QueueRole::DeadLetter => {
                    special.insert(DEADLETTER_KEY, q.clone());
                }
                QueueRole::DeadXact => {
                    special.insert(DEADXACT_KEY, q.clone());
                }
                _ => {}
            }
            queues.insert(q.def().key.clone(), q);
        }
        // Messages of a queue that has no definition: a send that raced the queue's deletion
        // wrote its Put after the DeleteQueue (before it was given back). They belong to no
        // queue; a fresh tombstone makes them dead so compaction stops copying them.
        for (id, orphans) in std::mem::take(&mut rec.messages) {
            if !orphans.is_empty() {
                tracing::warn!(
                    queue_id = id,
                    messages = orphans.len(),
                    "recovery: messages of a deleted queue; dropping them"
                );
                drop(journal.submit(vec![Op::DeleteQueue { queue_id: id }]));
            }
        }
        crate::subqueue::link_recovered(&queues);
        crate::journal_queue::link_recovered(&queues);
        report.queues = queues.values().filter(|q| q.def().role.is_normal()).count();
        let mut next_queue_id = rec.max_queue_id + 1;
        // The system queues exist on every broker; a new data directory gets them now. Their
        // definitions are written before anything can use them (the journal keeps order).
        let mut system = |key: &'static str, name: &str, transactional: bool, role: QueueRole| {
            if let Some(q) = special.get(key) {
                return q.clone();
            }
            let id = next_queue_id;
            next_queue_id += 1;
            let mut def = QueueDef::new(
                id,
                name.to_string(),
                key.to_string(),
                transactional,
                None,
                String::new(),
            );
            def.role = role;
            journal.submit_detached(vec![Op::DefineQueue {
                queue_id: id,
                def: QueueDefRecord::encode(&def),
            }]);
            if key == STREAMS_KEY || key == TXOUTCOMES_KEY || key == COUNTERS_KEY {
                return Arc::new(Queue::new(def));
            }
            let q = Queue::new_counted(def, &changed_queues, &sweep_hint);
            page(&q, &journal, &header_windows);
            queues.insert(key.to_string(), q.clone());
            q
        };
        let dead_letter = system(
            DEADLETTER_KEY,
            r".\SYSTEM$;DEADLETTER",
            false,
            QueueRole::DeadLetter,
        );
        let dead_xact = system(
            DEADXACT_KEY,
            r".\SYSTEM$;DEADXACT",
            true,
            QueueRole::DeadXact,
        );
        if streams.queue_id == 0 {
            let q = system(STREAMS_KEY, r".\SYSTEM$;STREAMS", false, QueueRole::Streams);
            streams.queue_id = q.def().id;
            streams.next_slot = 1;
        }
        let outcomes = match outcomes {
            Some(o) => o,
            None => {
                let q = system(
                    TXOUTCOMES_KEY,
                    r".\SYSTEM$;TXOUTCOMES",
                    false,
                    QueueRole::TxOutcomes,
                );
                crate::outcome::Outcomes::new(
                    q.def().id,
                    1,
                    config.tx_outcome_retention,
                    config.tx_outcome_max,
                )
            }
        };
        let (counters_store, saved_counters) = saved_counters.unwrap_or_else(|| {
            let q = system(
                COUNTERS_KEY,
                r".\SYSTEM$;COUNTERS",
                false,
                QueueRole::Counters,
            );
            (
                crate::counters_store::Store::new(q.def().id),
                Default::default(),
            )
        });
        let outgoing: HashMap<String, Arc<crate::forward::Outgoing>> = queues
            .values()
            .filter(|q| matches!(q.def().role, QueueRole::Outgoing { .. }))
            .map(|q| {
                let o = Arc::new(crate::forward::Outgoing::new(q.clone()));
                (o.destination().to_string(), o)
            })
            .collect();
        let counters = Arc::<crate::metrics::Counters>::default();
        saved_counters.apply(&queues, &outgoing, &counters);
        let local_names = std::iter::once(config.name.clone())
            .chain(config.aliases.iter().cloned())
            .collect();
        let tx_staged = crate::flow::Budget::new(config.flow.max_tx_total_bytes);
        // The broker's own queues (dead letters, forwarding streams, transaction outcomes,
        // counters): never deleted, and not counted against --max-queues.
        let own_queues = queues
            .values()
            .filter(|q| {
                matches!(
                    q.def().role,
                    QueueRole::DeadLetter
                        | QueueRole::DeadXact
                        | QueueRole::Streams
                        | QueueRole::TxOutcomes
                        | QueueRole::Counters
                )
            })
            .count();
        let broker = Broker {
            own_queues,
            tx_staged,
            config,
            local_names,
            local_addrs,
            queues: RwLock::new(queues),
            journal,
            commit_order: std::sync::Mutex::new(()),
            next_queue_id: AtomicU64::new(next_queue_id),
            express_used: AtomicU64::new(0),
            header_windows,
            // Every kept forwarding stream's record counts against the storage quota.
            stored_used: AtomicU64::new(
                stored + streams.len() as u64 * crate::stream_bounds::STREAM_RECORD_CHARGE,
            ),
            shutdown: tokio::sync::watch::channel(false).0,
            dead_letter,
            dead_xact,
            outgoing: RwLock::new(outgoing),
            streams: std::sync::Mutex::new(streams),
            outcomes: std::sync::Mutex::new(outcomes),
            background: std::sync::Mutex::new(None),
            counters,
            acks: Default::default(),
            counters_store: std::sync::Mutex::new(counters_store),
            changed_queues,
            sweep_hint,
            last_full_sweep: std::sync::Mutex::new(std::time::Instant::now()),
            redefinitions: tokio::sync::Mutex::new(()),
        };
        Ok((broker, report))
    }

    /// The lock that keeps queue order, journal order and commit order of transactional
    /// messages the same.
    pub(crate) fn commit_order_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.commit_order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Which transaction ids committed.
    pub(crate) fn outcomes(&self) -> std::sync::MutexGuard<'_, crate::outcome::Outcomes> {
        self.outcomes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails with a clear error if the journal refuses writes (a write or sync failed): an
    /// operation that must write (`what`) cannot succeed until mqd restarts.
    pub(crate) fn check_writable(&self, what: &str) -> Result<(), BrokerError> {
        if self.journal.is_poisoned() {
            return Err(BrokerError::Unavailable(format!(
                "cannot {what}: the journal refuses writes since a write or fdatasync failed; restart mqd after fixing the disk"
            )));
        }
        Ok(())
    }

    /// `taken` (just taken from `queue`), unless some of them are recoverable and the journal
    /// refuses writes: their removal could not be stored, so they go back and this fails.
    pub(crate) fn removable(
        &self,
        queue: &Queue,
        taken: Vec<Entry>,
    ) -> Result<Vec<Entry>, BrokerError> {
        if let Err(e) = self.check_removable(&taken) {
            let gone = queue.restore(taken);
            self.forget(queue, &gone);
            return Err(e);
        }
        Ok(taken)
    }

    /// Whether `entries` can be received for good: not if some are recoverable and the journal
    /// refuses writes (their removal could not be stored).
    pub(crate) fn check_removable(&self, entries: &[Entry]) -> Result<(), BrokerError> {
        if entries
            .iter()
            .any(|e| e.msg.delivery == Delivery::Recoverable)
        {
            self.check_writable("receive recoverable messages")?;
        }
        Ok(())
    }

    /// Stops the journal after writing what is pending (and the last snapshot of the totals).
    pub fn close(&self) {
        crate::counters_store::save_on_close(self);
        self.journal.shutdown();
    }

    /// The journal (for statistics).
    /// The addresses this broker answers on (the bound one, and the interfaces' for 0.0.0.0).
    pub(crate) fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    pub(crate) fn counters(&self) -> &Arc<crate::metrics::Counters> {
        &self.counters
    }

    pub(crate) fn counters_store(&self) -> std::sync::MutexGuard<'_, crate::counters_store::Store> {
        self.counters_store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn changed_queues(&self) -> &crate::counters_store::ChangedQueues {
        &self.changed_queues
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Tells every waiting receive and open stream to finish.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves once [`Broker::begin_shutdown`] has been called.
    pub async fn shutting_down(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Parses `name` and checks that it is one queue on this broker.
    pub fn resolve(&self, name: &str) -> Result<QueueAddress, BrokerError> {
        let parsed =
            FormatName::parse_with_max_elements(name, self.config.max_format_name_elements)?;
        let addr = parsed.single().cloned().ok_or_else(|| {
            BrokerError::InvalidArgument(format!(
                "\"{}\" is a multiple-element format name; those can only be sent to, not received from, peeked at or administered",
                quote(name)
            ))
        })?;
        self.check_local(name, &addr)?;
        Ok(addr)
    }

    fn check_local(&self, name: &str, addr: &QueueAddress) -> Result<(), BrokerError> {
        if self.is_local(addr) {
            Ok(())
        } else {
            Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" names a queue on another broker ({}); this broker is \"{}\" at {:?}. Remote queues can only be sent to (the message waits in this broker's outgoing queue and is forwarded); receive, peek and administer them on their own broker",
                quote(name),
                remote_destination(addr),
                self.config.name,
                self.local_addrs
            )))
        }
    }

    /// Whether `addr` is a queue of this broker.
    pub fn is_local(&self, addr: &QueueAddress) -> bool {
        addr.is_local_to(&self.local_names, &self.local_addrs)
    }

    fn normal_queue_key(&self, _name: &str, addr: &QueueAddress) -> Result<String, BrokerError> {
        match addr.kind {
            QueueKind::Normal
            | QueueKind::DeadLetter
            | QueueKind::DeadXact
            | QueueKind::Subqueue
            | QueueKind::Journal
            | QueueKind::SystemJournal => Ok(addr.key()),
        }
    }

    /// Creates a queue.
    pub async fn create_queue(
        &self,
        req: v1::CreateQueueRequest,
    ) -> Result<Arc<Queue>, BrokerError> {
        self.create_queue_with_acl(req, crate::auth::Acl::default())
            .await
    }

    /// Creates a queue with its first ACL (the creator's rights).
    pub(crate) async fn create_queue_with_acl(
        &self,
        req: v1::CreateQueueRequest,
        acl: crate::auth::Acl,
    ) -> Result<Arc<Queue>, BrokerError> {
        let addr = self.resolve(&req.name)?;
        let key = self.normal_queue_key(&req.name, &addr)?;
        if addr.kind == QueueKind::Subqueue {
            return Err(BrokerError::InvalidArgument(format!(
                "\"{}\" is a subqueue; subqueues are created by moving a message into them (mq move), or by opening them",
                quote(&req.name)
            )));
        }
        let poison = crate::subqueue::PoisonPolicy::from_request(&req)?;
        let journal = crate::journal_queue::JournalPolicy::from_request(&req)?;
        if addr.kind == QueueKind::Journal {
            return Err(BrokerError::InvalidArgument(format!(
                "\"{}\" is a queue journal: it comes with its queue and is not created (create the queue, with --journal to keep copies of what is received)",
                quote(&req.name)
            )));
        }
        if addr.kind != QueueKind::Normal {
            return Err(BrokerError::QueueExists(format!(
                "{} (the dead-letter queues, SYSTEM$;JOURNAL and each queue's journal exist without being created)",
                addr.path_name()
            )));
        }
        let label_chars = req.label.chars().count();
        if label_chars > crate::config::MAX_LABEL_CHARS {
            return Err(BrokerError::InvalidArgument(format!(
                "queue label is {label_chars} characters; the limit is {}",
                crate::config::MAX_LABEL_CHARS
            )));
        }
        // Not while a deletion is in flight (a refused one puts its queue back under the same
        // name). Held until the definition is submitted, not while it is written, so that
        // concurrent creates still share a group commit.
        let one = self.redefinitions.lock().await;
        let (q, commit) = {
            let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
            if queues.contains_key(&key) {
                return Err(BrokerError::QueueExists(local_path_name(&addr)));
            }
            crate::queue_count::check(queues.len() - self.own_queues, self.config.max_queues)?;
            let id = self.next_queue_id.fetch_add(1, Ordering::AcqRel);
            let def = QueueDef {
                acl,
                poison,
                journal,
                ..QueueDef::new(
                    id,
                    local_path_name(&addr),
                    key.clone(),
                    req.transactional,
                    req.quota_bytes,
                    req.label,
                )
            };
            let commit = self.journal.submit(vec![Op::DefineQueue {
                queue_id: id,
                def: QueueDefRecord::encode(&def),
            }]);
            let q = Queue::new_counted(def, &self.changed_queues, &self.sweep_hint);
            page(&q, &self.journal, &self.header_windows);
            queues.insert(key.clone(), q.clone());
            (q, commit)
        };
        drop(one);
        if let Err(e) = commit.await {
            {
                let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
                if queues.get(&key).is_some_and(|cur| Arc::ptr_eq(cur, &q)) {
                    queues.remove(&key);
                }
            }
            // Nothing was stored in it yet. Marked deleted also if a deletion took it out
            // meanwhile, so that a refused deletion does not put it back.
            let _ = q.mark_deleted();
            return Err(BrokerError::Unavailable(format!(
                "cannot store the queue definition: {e}"
            )));
        }
        tracing::info!(queue = %q.def().name, transactional = req.transactional, "queue created");
        Ok(q)
    }

    /// Deletes a queue and every message in it. In a task of its own, so a caller that goes
    /// away (a deadline) while its records are written does not leave the deletion half done:
    /// the queue out of the registry with its charges taken and its negative acknowledgements
    /// unposted until a restart.
    pub async fn delete_queue(self: &Arc<Self>, name: &str) -> Result<(), BrokerError> {
        let (b, name) = (self.clone(), name.to_string());
        tokio::spawn(async move { b.delete_queue_now(&name).await })
            .await
            .map_err(|e| BrokerError::Internal(format!("the deletion's task failed: {e}")))?
    }

    async fn delete_queue_now(self: &Arc<Self>, name: &str) -> Result<(), BrokerError> {
        let addr = self.resolve(name)?;
        let key = self.normal_queue_key(name, &addr)?;
        if addr.kind != QueueKind::Normal {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" is a dead-letter queue, a journal queue or a subqueue; those cannot be deleted (purge it instead; a queue's subqueues and journal go with it)",
                quote(name)
            )));
        }
        let _one = self.redefinitions.lock().await;
        self.check_writable("delete a queue")?;
        // More NACK_Q_DELETEDs than one record holds go first, with their messages' removals.
        self.nack_ahead_of_deletion(&key).await?;
        // NACK_Q_DELETEDs of its waiting messages, prepared before the registry lock (they
        // read bodies and look up admin queues) and stored in the deletion's record.
        let mut nacks = {
            let (b, key) = (self.clone(), key.clone());
            tokio::task::spawn_blocking(move || b.deletion_nacks(&key))
                .await
                .map_err(|e| BrokerError::Internal(format!("reading the NACKs' bodies: {e}")))?
        };
        // Out of the registry (with its subqueues and its journal) and the deletion submitted under its lock, so
        // no record of a later lookup comes before the deletion's; emptied only once the
        // deletion is on disk, and back in the registry if nothing was written.
        let (q, subqueues, commit) = {
            let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
            match queues.get(&key) {
                Some(q) if q.def().role.is_normal() => {}
                _ => return Err(BrokerError::QueueNotFound(local_path_name(&addr))),
            }
            let q = queues.remove(&key).expect("checked above");
            let prefix = format!("{};", q.def().key);
            let sub_keys: Vec<String> = queues
                .iter()
                .filter(|(k, s)| {
                    matches!(s.def().role, QueueRole::Subqueue | QueueRole::Journal)
                        && k.starts_with(&prefix)
                })
                .map(|(k, _)| k.clone())
                .collect();
            let subqueues: Vec<Arc<Queue>> =
                sub_keys.iter().filter_map(|k| queues.remove(k)).collect();
            let mut ops: Vec<Op> = std::iter::once(&q)
                .chain(&subqueues)
                .map(|s| Op::DeleteQueue {
                    queue_id: s.def().id,
                })
                .collect();
            ops.append(&mut nacks.ops);
            let commit = self.journal.submit(ops);
            (q, subqueues, commit)
        };
        if let Err(e) = commit.await {
            nacks.abort(self);
            if e.may_be_stored() {
                // Maybe deleted (the journal is poisoned now): it stays out of the registry.
                return Err(BrokerError::Unavailable(format!(
                    "the journal failed while storing the deletion, which may or may not be on disk (a restart tells): {e}"
                )));
            }
            let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
            for s in std::iter::once(q).chain(subqueues) {
                if s.is_deleted() {
                    continue; // its own creation failed meanwhile: it does not exist
                }
                queues.entry(s.def().key.clone()).or_insert(s);
            }
            return Err(BrokerError::Unavailable(format!(
                "cannot store the deletion, the queue is kept: {e}"
            )));
        }
        nacks.commit(self);
        for s in std::iter::once(&q).chain(&subqueues) {
            let (express, stored) = s.mark_deleted();
            self.release(Delivery::Express, express);
            self.release(Delivery::Recoverable, stored);
        }
        tracing::info!(queue = %q.def().name, "queue deleted");
        Ok(())
    }

    /// Stores a changed definition of `q` (its ACL) unless `q` was deleted: checked and
    /// submitted under the registry lock, so a deletion's record always comes after it.
    pub(crate) fn redefine_queue(
        &self,
        q: &Arc<Queue>,
        def: &QueueDef,
    ) -> Result<crate::journal::Commit, BrokerError> {
        let queues = self.queues.read().unwrap_or_else(|p| p.into_inner());
        match queues.get(&q.def().key) {
            Some(cur) if Arc::ptr_eq(cur, q) && !q.is_deleted() => {}
            _ => return Err(BrokerError::QueueDeleted(q.def().name.clone())),
        }
        Ok(self.journal.submit(vec![Op::DefineQueue {
            queue_id: def.id,
            def: QueueDefRecord::encode(def),
        }]))
    }

    /// The local queue `name` names.
    pub fn queue(&self, name: &str) -> Result<Arc<Queue>, BrokerError> {
        let addr = self.resolve(name)?;
        self.local_queue(name, &addr)
    }

    /// The queue `name` names, once `allow` passes on it. A subqueue or queue journal not opened
    /// yet is created (journaled) only after `allow` passes on its main queue, whose rights it
    /// has: a caller without rights creates nothing (subqueues count against a queue's limit of
    /// 64 and every queue against `mqd --max-queues`).
    pub fn queue_allowed<E: From<BrokerError>>(
        &self,
        name: &str,
        allow: impl Fn(&Arc<Queue>) -> Result<(), E>,
    ) -> Result<Arc<Queue>, E> {
        let addr = self.resolve(name)?;
        if matches!(addr.kind, QueueKind::Subqueue | QueueKind::Journal) {
            let key = self.normal_queue_key(name, &addr)?;
            if self.queue_by_key(&key).is_none() {
                allow(&self.local_queue(name, &addr.main_queue())?)?;
            }
        }
        let q = self.local_queue(name, &addr)?;
        allow(&q)?;
        Ok(q)
    }

    /// As [`Broker::queue_allowed`], for a look at a queue (its info): a subqueue or queue
    /// journal not opened yet is created only if `may_open` passes on its main queue (a caller
    /// who may read it), else NOT_FOUND once `allow` passes there. `allow` here is any right at
    /// all (`monitor`, `send`), and opening one for a look created it, journaled, for good: a
    /// caller with `send` could use up a queue's 64 subqueues, its poison subqueue with them
    /// (helper-61).
    pub fn queue_seen<E: From<BrokerError>>(
        &self,
        name: &str,
        allow: impl Fn(&Arc<Queue>) -> Result<(), E>,
        may_open: impl Fn(&Arc<Queue>) -> bool,
    ) -> Result<Arc<Queue>, E> {
        let addr = self.resolve(name)?;
        if matches!(addr.kind, QueueKind::Subqueue | QueueKind::Journal) {
            let key = self.normal_queue_key(name, &addr)?;
            if self.queue_by_key(&key).is_none() {
                let main = self.local_queue(name, &addr.main_queue())?;
                allow(&main)?;
                if may_open(&main) {
                    return self.queue_allowed(name, allow);
                }
                return Err(BrokerError::NotFound(format!(
                    "\"{}\" is not open: a subqueue or queue journal comes into being when a message goes into it or a reader (peek, receive) opens it",
                    quote(name)
                ))
                .into());
            }
        }
        self.queue_allowed(name, allow)
    }

    /// The queue an address already known to be local names (`name` as written, for errors).
    pub(crate) fn local_queue(
        &self,
        name: &str,
        addr: &QueueAddress,
    ) -> Result<Arc<Queue>, BrokerError> {
        let key = self.normal_queue_key(name, addr)?;
        match self.queue_by_key(&key) {
            Some(q) => Ok(q),
            None if addr.kind == QueueKind::Subqueue => self.open_subqueue(name, addr),
            None if matches!(addr.kind, QueueKind::Journal | QueueKind::SystemJournal) => {
                self.open_journal(name, addr)
            }
            None => Err(BrokerError::QueueNotFound(local_path_name(addr))),
        }
    }

    /// The queue registered as `key`, or a new one defined by `def(id)` (journaled, not
    /// awaited: every later record that uses it comes after it; a failed write poisons the
    /// journal) if `check` allows. Returns whether it was created.
    pub(crate) fn queue_or_define(
        &self,
        key: &str,
        check: impl FnOnce(&HashMap<String, Arc<Queue>>) -> Result<(), BrokerError>,
        def: impl FnOnce(u64) -> QueueDef,
    ) -> Result<(Arc<Queue>, bool), BrokerError> {
        if let Some(q) = self.queue_by_key(key) {
            return Ok((q, false));
        }
        let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = queues.get(key) {
            return Ok((q.clone(), false));
        }
        check(&queues)?;
        crate::queue_count::check(queues.len() - self.own_queues, self.config.max_queues)?;
        self.check_writable("create a queue")?;
        if self.journal.is_disk_full() {
            return Err(BrokerError::QuotaExceeded(
                "the disk under the journal is full: cannot create a queue".into(),
            ));
        }
        let id = self.next_queue_id.fetch_add(1, Ordering::AcqRel);
        let def = def(id);
        self.journal.submit_detached(vec![Op::DefineQueue {
            queue_id: id,
            def: QueueDefRecord::encode(&def),
        }]);
        let q = Queue::new_counted(def, &self.changed_queues, &self.sweep_hint);
        page(&q, &self.journal, &self.header_windows);
        queues.insert(key.to_string(), q.clone());
        Ok((q, true))
    }

    fn queue_by_key(&self, key: &str) -> Option<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .filter(|q| !matches!(q.def().role, QueueRole::Outgoing { .. }))
            .cloned()
    }

    /// Every queue applications created, sorted by name (not the system queues).
    pub fn list(&self) -> Vec<Arc<Queue>> {
        let mut v: Vec<_> = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|q| q.def().role.is_normal())
            .cloned()
            .collect();
        v.sort_by(|a, b| a.def().key.cmp(&b.def().key));
        v
    }

    /// Up to `max` queues of [`Broker::list`]'s order whose keys come after `after` (empty:
    /// from the first), and the key to go on after when more may follow. Linear in the number
    /// of queues (no sort of all of them per page).
    pub fn list_page(&self, after: &str, max: usize) -> (Vec<Arc<Queue>>, Option<String>) {
        self.page_of_queues(after, max, |q| q.def().role.is_normal())
    }

    /// [`Broker::list_page`] of the queues (of any role) that `keep` keeps.
    pub(crate) fn page_of_queues(
        &self,
        after: &str,
        max: usize,
        keep: impl Fn(&Queue) -> bool,
    ) -> (Vec<Arc<Queue>>, Option<String>) {
        let mut v: Vec<_> = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|q| q.def().key.as_str() > after && keep(q))
            .cloned()
            .collect();
        let more = v.len() > max;
        if more && max > 0 {
            v.select_nth_unstable_by(max - 1, |a, b| a.def().key.cmp(&b.def().key));
        }
        v.truncate(max);
        v.sort_by(|a, b| a.def().key.cmp(&b.def().key));
        let next = more
            .then(|| v.last().map(|q| q.def().key.clone()))
            .flatten();
        (v, next)
    }

    /// Removes every ready message of a queue; returns once their removal is on disk.
    pub async fn purge(self: &Arc<Self>, name: &str) -> Result<u64, BrokerError> {
        let q = self.queue(name)?;
        self.purge_queue(&q).await
    }

    /// Removes every waiting message of `q` (an application or outgoing queue), posting the
    /// purge's negative acknowledgements; journaled before it returns. One record per
    /// [`NACK_CHUNK_BYTES`] of negative acknowledgements' bodies (each carries its
    /// message's): 270 purged messages of 4 MiB that asked for them made one record past the
    /// journal's 1 GiB limit, so the purge failed for good and read every body into memory
    /// first (helper-72). The records are written by a task of their own, so a caller that goes
    /// away (a deadline) does not leave the rest out of the queue and their charges taken.
    pub(crate) async fn purge_queue(self: &Arc<Self>, q: &Arc<Queue>) -> Result<u64, BrokerError> {
        if self.journal.is_poisoned()
            && q.peek(usize::MAX)?
                .iter()
                .any(|e| e.msg.delivery == Delivery::Recoverable)
        {
            self.check_writable("purge recoverable messages")?;
        }
        let purged = q.purge();
        let class = match q.def().role {
            QueueRole::Outgoing { .. } => mq_proto::ack::class::NACK_PURGED,
            _ => mq_proto::ack::class::NACK_Q_PURGED,
        };
        let (b, q) = (self.clone(), q.clone());
        let total = purged.len();
        let task = tokio::spawn(async move {
            let mut rest = purged.as_slice();
            while !rest.is_empty() {
                let n = nack_chunk_len(rest);
                let (chunk, after) = rest.split_at(n);
                let mut nacks = match b.acks_for_entries_off_runtime(&q, chunk, class).await {
                    Ok(nacks) => nacks,
                    Err(e) => {
                        // Out of the queue already: their charges go with them.
                        let _ = b.release_entries(&q, rest);
                        return Err(e);
                    }
                };
                let removal = b.forget_removal_with(&q, chunk, std::mem::take(&mut nacks.ops));
                if let Some(removal) = removal {
                    if let Err(e) = removal.await {
                        nacks.abort(&b);
                        // Out of memory from here on, as this chunk: their charges go with them.
                        let _ = b.release_entries(&q, after);
                        return Err(BrokerError::Unavailable(format!(
                            "the purge of {} of {total} messages could not be stored ({e}); they are gone from the queue until the broker restarts (the {} before them were purged)",
                            rest.len(),
                            total - rest.len()
                        )));
                    }
                }
                nacks.commit(&b);
                rest = after;
            }
            Ok(total as u64)
        });
        task.await
            .map_err(|e| BrokerError::Internal(format!("the purge's task failed: {e}")))?
    }

    /// Before a deletion: while the `NACK_Q_DELETED`s of the messages waiting in the
    /// application queue `key` and its subqueues would not fit one record (bodies past
    /// [`NACK_CHUNK_BYTES`] or more than [`NACK_CHUNK_MESSAGES`]), takes a chunk of those
    /// messages and writes their removal with their NACKs, as a purge does. The deletion's own
    /// record then holds the rest. It held them all: 270 waiting messages of 4 MiB that asked
    /// for NACKs made one record past the journal's 1 GiB limit, so the deletion failed for
    /// good after reading every body into memory. A crash in between leaves the queue with
    /// fewer messages, each one removed having had its NACK; nothing is lost unacknowledged.
    async fn nack_ahead_of_deletion(self: &Arc<Self>, key: &str) -> Result<(), BrokerError> {
        let deleted = mq_proto::ack::class::NACK_Q_DELETED;
        let prefix = format!("{key};");
        // Each round removes a chunk or ends; the bound only guards against a queue refilled
        // as fast as it is emptied.
        for _ in 0..1_000_000 {
            let family = self.queues_where(|q| {
                let k = &q.def().key;
                (k == key && q.def().role.is_normal())
                    || (q.def().role == QueueRole::Subqueue && k.starts_with(&prefix))
            });
            let (mut bytes, mut count) = (0u64, 0usize);
            let mut first: Option<(Arc<Queue>, Vec<Entry>)> = None;
            for q in family {
                let nacked = q.waiting_matching(|e| crate::acks::wanted(&e.msg, deleted));
                bytes += nacked
                    .iter()
                    .map(|e| u64::from(e.msg.body_len))
                    .sum::<u64>();
                count += nacked.len();
                if first.is_none() && !nacked.is_empty() {
                    first = Some((q, nacked));
                }
            }
            if bytes <= NACK_CHUNK_BYTES && count <= NACK_CHUNK_MESSAGES {
                return Ok(());
            }
            let Some((q, nacked)) = first else {
                return Ok(());
            };
            let mut taken = Vec::new();
            for e in &nacked[..nack_chunk_len(&nacked)] {
                // Not waiting any more (received, expired) is left to the deletion.
                if let Some(t) = q.take_id(e.msg.id)? {
                    taken.push(t);
                }
            }
            if taken.is_empty() {
                return Ok(());
            }
            let mut nacks = self
                .acks_for_entries_off_runtime(&q, &taken, deleted)
                .await?;
            let mut ops = std::mem::take(&mut nacks.ops);
            let seqs: Vec<u64> = taken
                .iter()
                .filter(|e| e.msg.delivery == Delivery::Recoverable)
                .map(|e| e.seq)
                .collect();
            if !seqs.is_empty() {
                ops.push(Op::Remove {
                    queue_id: q.def().id,
                    seqs,
                });
            }
            match self.journal.submit(ops).await {
                Ok(()) => {
                    nacks.commit(self);
                    q.complete(&taken);
                    for e in &taken {
                        self.release(e.msg.delivery, e.msg.charged_bytes());
                    }
                }
                Err(e) => {
                    nacks.abort(self);
                    let gone = q.restore(taken);
                    self.forget(&q, &gone);
                    return Err(BrokerError::Unavailable(format!(
                        "cannot store the negative acknowledgements ahead of the deletion, the queue is kept: {e}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// [`Broker::acks_for_entries`] on a blocking thread: negative acknowledgements read their
    /// messages' bodies, up to [`NACK_CHUNK_BYTES`] of them from the journal.
    async fn acks_for_entries_off_runtime(
        self: &Arc<Self>,
        queue: &Arc<Queue>,
        entries: &[Entry],
        class: u16,
    ) -> Result<crate::acks::Prepared, BrokerError> {
        let (b, q, entries) = (self.clone(), queue.clone(), entries.to_vec());
        tokio::task::spawn_blocking(move || b.acks_for_entries(&q, &entries, class))
            .await
            .map_err(|e| BrokerError::Internal(format!("reading the NACKs' bodies: {e}")))
    }

    /// Every queue of this broker, system and outgoing ones included.
    /// The queues for which `pick` says yes (it runs under the registry's read lock).
    pub(crate) fn queues_where(&self, pick: impl Fn(&Queue) -> bool) -> Vec<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|q| pick(q))
            .cloned()
            .collect()
    }

    pub(crate) fn all_queues(&self) -> Vec<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Where a send destination goes: one queue, or several for a multiple-element name (at
    /// most `max_format_name_elements`). Everything is checked before anything is created: a
    /// local queue exists and matches transactional or not; a remote one is checked by its
    /// broker, and its outgoing queue is created only when a message is stored in it
    /// ([`Broker::targets`]).
    pub fn destinations(
        self: &Arc<Self>,
        name: &str,
        transactional: bool,
    ) -> Result<Destinations, BrokerError> {
        let plan = self.plan(name)?;
        plan.check_kinds(transactional)?;
        Ok(plan)
    }

    /// [`Broker::destinations`] without the check of the queues' kinds, so that a caller can
    /// check its rights first: a refusal for the kind tells whether a queue is transactional,
    /// and should go only to who may send there (helper-61).
    pub(crate) fn plan(self: &Arc<Self>, name: &str) -> Result<Destinations, BrokerError> {
        let parsed =
            FormatName::parse_with_max_elements(name, self.config.max_format_name_elements)?;
        let mut out = Destinations {
            planned: Vec::with_capacity(parsed.addresses().len()),
        };
        // The same queue twice in one multiple-element name gets one copy.
        let mut seen_local: HashSet<*const Queue> = HashSet::new();
        let mut seen_remote: HashSet<String> = HashSet::new();
        for addr in parsed.addresses() {
            if addr.is_read_only() {
                return Err(BrokerError::FailedPrecondition(format!(
                    "\"{}\" names a read-only queue ({}); journal queues, dead-letter queues and subqueues cannot be sent to (a message gets into a subqueue by mq move)",
                    quote(name),
                    addr.path_name()
                )));
            }
            if self.is_local(addr) {
                let q = self.local_queue(name, addr)?;
                if seen_local.insert(Arc::as_ptr(&q)) {
                    out.planned.push(Planned::Local(q));
                }
            } else {
                let route = addr.to_string();
                if seen_remote.insert(route.clone()) {
                    out.planned
                        .push(Planned::Remote(remote_destination(addr), Arc::from(route)));
                }
            }
        }
        Ok(out)
    }

    /// The queues of planned destinations, creating the outgoing queues that do not exist
    /// (or no longer exist). Called once a message is about to be stored.
    pub fn targets(self: &Arc<Self>, dests: &Destinations) -> Result<Vec<Target>, BrokerError> {
        dests
            .planned
            .iter()
            .map(|p| match p {
                Planned::Local(q) => Ok(Target {
                    queue: q.clone(),
                    route: None,
                }),
                Planned::Remote(dest, route) => {
                    let o = self.outgoing_for(dest)?;
                    o.touch();
                    Ok(Target {
                        queue: o.queue().clone(),
                        route: Some(route.clone()),
                    })
                }
            })
            .collect()
    }

    /// The outgoing queue for the broker at `destination` (`host:port`), created (journaled)
    /// and its forwarder started if it does not exist yet.
    pub(crate) fn outgoing_for(
        self: &Arc<Self>,
        destination: &str,
    ) -> Result<Arc<crate::forward::Outgoing>, BrokerError> {
        if let Some(o) = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(destination)
        {
            return Ok(o.clone());
        }
        let mut map = self.outgoing.write().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = map.get(destination) {
            return Ok(o.clone());
        }
        if self.journal.is_poisoned() {
            return Err(BrokerError::Unavailable(
                "the journal refuses writes; cannot create an outgoing queue; restart mqd after fixing the disk".into(),
            ));
        }
        if map.len() >= self.config.max_outgoing_queues {
            return Err(BrokerError::QuotaExceeded(format!(
                "this broker has {} outgoing queues; the limit is {} (mqd --max-outgoing-queues); empty ones can be deleted with `mq outgoing delete DEST`",
                map.len(),
                self.config.max_outgoing_queues
            )));
        }
        if self.journal.is_disk_full() {
            return Err(BrokerError::QuotaExceeded(
                "the disk under the journal is full: cannot create an outgoing queue; sends are refused until space is freed".into(),
            ));
        }
        let id = self.next_queue_id.fetch_add(1, Ordering::AcqRel);
        let key = format!("outgoing$;{destination}");
        let mut def = QueueDef::new(
            id,
            format!("OUTGOING$;{destination}"),
            key.clone(),
            false,
            None,
            String::new(),
        );
        def.role = QueueRole::Outgoing {
            destination: destination.to_string(),
            stream_id: uuid::Uuid::now_v7(),
            paused: false,
        };
        // Not awaited: every later record that uses the queue comes after this one in the
        // journal, and a failed detached write poisons the journal for all of them.
        self.journal.submit_detached(vec![Op::DefineQueue {
            queue_id: id,
            def: QueueDefRecord::encode(&def),
        }]);
        let q = Queue::new_counted(def, &self.changed_queues, &self.sweep_hint);
        self.queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, q.clone());
        let o = Arc::new(crate::forward::Outgoing::new(q));
        map.insert(destination.to_string(), o.clone());
        drop(map);
        tracing::info!(%destination, "outgoing queue created");
        self.start_forwarder(&o);
        Ok(o)
    }

    /// Puts back in the registry a queue whose deletion the journal refused, unless its key
    /// was taken meanwhile.
    pub(crate) fn reregister_queue(&self, q: &Arc<Queue>) {
        self.queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(q.def().key.clone())
            .or_insert_with(|| q.clone());
    }

    /// Removes a queue from the registry by key (the caller journals and marks the deletion).
    pub(crate) fn unregister_queue(&self, key: &str) -> Option<Arc<Queue>> {
        self.queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    }

    /// Starts the broker's background work once it runs on a Tokio runtime: a forwarder per
    /// outgoing queue and the expiry sweep. Called by the server; idempotent.
    pub fn start_background(self: &Arc<Self>) {
        {
            let mut bg = self.background.lock().unwrap_or_else(|p| p.into_inner());
            if bg.is_some() {
                return;
            }
            *bg = Some(tokio::runtime::Handle::current());
        }
        self.acks.set_broker(self);
        let all: Vec<_> = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for o in &all {
            self.start_forwarder(o);
        }
        self.spawn_periodic(crate::deadletter::SWEEP_INTERVAL, |b| async move {
            b.sweep_expired().await
        });
        self.spawn_periodic(crate::counters_store::SAVE_TICK, |b| async move {
            crate::counters_store::tick(&b).await
        });
        // Idle outgoing queues and incoming streams are checked every quarter of their idle
        // time (100 ms to 1 min).
        let quarter =
            |idle: Duration| (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let idle = self.config.outgoing_idle_expiry;
        self.spawn_periodic(quarter(idle), move |b| async move {
            b.expire_idle_outgoing(idle).await;
        });
        let idle = self.config.forward_stream_idle;
        self.spawn_periodic(quarter(idle), move |b| async move {
            b.prune_streams(idle);
        });
        // After a drained burst, give malloc's free pages back (off the async workers).
        let trimmer = Arc::new(std::sync::Mutex::new(crate::memtrim::Trimmer::default()));
        self.spawn_periodic(crate::memtrim::TRIM_INTERVAL, move |_| {
            let trimmer = trimmer.clone();
            async move {
                let _ = tokio::task::spawn_blocking(move || {
                    let mut t = trimmer.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(freed) = t.tick(crate::memtrim::TRIM_THRESHOLD_BYTES) {
                        tracing::debug!(
                            freed_mib = freed >> 20,
                            "returned free memory to the system"
                        );
                    }
                })
                .await;
            }
        });
    }

    /// Runs `work` every `period` (a late tick is delayed, not bunched) until the broker shuts
    /// down or is gone: the broker's background housekeeping.
    fn spawn_periodic<F, Fut>(self: &Arc<Self>, period: Duration, mut work: F)
    where
        F: FnMut(Arc<Broker>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                let Some(b) = broker.upgrade() else { return };
                work(b).await;
            }
        });
    }

    pub(crate) fn start_forwarder(self: &Arc<Self>, o: &Arc<crate::forward::Outgoing>) {
        let handle = self
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(handle) = handle {
            if o.mark_started() {
                handle.spawn(crate::forward::supervise(Arc::downgrade(self), o.clone()));
            }
        }
    }

    /// The dead-letter queue for a message: DEADXACT for transactional ones, else DEADLETTER.
    pub(crate) fn dead_letter_queue(&self, transactional: bool) -> &Arc<Queue> {
        if transactional {
            &self.dead_xact
        } else {
            &self.dead_letter
        }
    }

    /// Stores one batch of messages in every destination queue: each message gets one id, shared
    /// by its copies. Checks, quota charges and queue positions happen now, in call order;
    /// the returned future resolves once everything is stored: express messages at once,
    /// recoverable ones when their journal record is on disk (group commit).
    pub fn send_batch(
        self: &Arc<Self>,
        plan: &Destinations,
        msgs: Vec<v1::OutMessage>,
        transactional: bool,
    ) -> Pin<Box<dyn Future<Output = BatchOutcome> + Send + 'static>> {
        self.send_batch_on(plan, msgs, transactional, None, None, &mut |_| Ok(()))
    }

    /// [`Broker::send_batch`] of single-message transactions on a send stream with an id
    /// (`stream`, the first message's seq): the batch's record also records its outcome (see
    /// `outcome.rs`), so each message's transaction id can be asked about.
    pub(crate) fn send_batch_on(
        self: &Arc<Self>,
        plan: &Destinations,
        msgs: Vec<v1::OutMessage>,
        transactional: bool,
        stream: Option<(u128, u64)>,
        sender: Option<&Arc<str>>,
        may_acknowledge_to: &mut dyn FnMut(&str) -> Result<(), BrokerError>,
    ) -> Pin<Box<dyn Future<Output = BatchOutcome> + Send + 'static>> {
        let n = msgs.len();
        let ids = vec![None; n];
        let mut failures: Vec<(usize, BrokerError)> = Vec::new();
        let mut accepted: Vec<Arc<StoredMessage>> = Vec::with_capacity(n);
        let mut index: Vec<usize> = Vec::with_capacity(n);
        for (i, mut m) in msgs.into_iter().enumerate() {
            if self.is_shutting_down() {
                failures.push((i, BrokerError::ShuttingDown));
                continue;
            }
            // The broker posts acknowledgements to the admin queue in the sender's name: the
            // sender must be allowed to send there (the service's `AdminQueues`).
            if !m.admin_queue.is_empty() {
                if let Err(e) = may_acknowledge_to(&m.admin_queue) {
                    failures.push((i, e));
                    continue;
                }
            }
            if transactional {
                force_transactional(&mut m);
            }
            if sender.is_some() {
                // Replaced below: not copied from what the client put there.
                m.sender.clear();
            }
            match StoredMessage::accept(m, uuid::Uuid::now_v7(), &self.config) {
                Ok(mut sm) => {
                    sm.transactional = transactional;
                    if let Some(s) = sender {
                        // The stream's identity, shared: no copy of the name per message.
                        sm.sender = Some(s.clone());
                    }
                    let charge = sm.charged_bytes() * plan.len() as u64;
                    if let Err(e) = self.reserve(sm.delivery, charge) {
                        failures.push((i, e));
                        continue;
                    }
                    accepted.push(Arc::new(sm));
                    index.push(i);
                }
                Err(e) => failures.push((i, e)),
            }
        }
        // Outgoing queues are looked up (created) only now that a message is to be stored.
        let dests = if accepted.is_empty() {
            Vec::new()
        } else {
            match self.targets(plan) {
                Ok(d) => d,
                Err(e) => {
                    for (j, m) in accepted.iter().enumerate() {
                        self.release(m.delivery, m.charged_bytes() * plan.len() as u64);
                        failures.push((index[j], e.clone()));
                    }
                    accepted.clear();
                    index.clear();
                    Vec::new()
                }
            }
        };
        let mut refused = vec![false; accepted.len()];
        // Recoverable messages: their journal header and a body-less copy for the queue.
        let mut headers: Vec<Option<(Bytes, Arc<StoredMessage>)>> = vec![None; accepted.len()];
        let mut ops = Vec::new();
        let mut durable: Vec<(Arc<Queue>, usize, Entry)> = Vec::new();
        // Source journaling: copies of stored messages sent with the journal flag.
        let mut source = crate::journal_queue::Copies::default();
        let order_guard =
            transactional.then(|| self.commit_order.lock().unwrap_or_else(|p| p.into_inner()));
        // Every destination first: a message goes to all of its queues or to none (a
        // multiple-element send refused by one queue's quota leaves no copy elsewhere).
        let mut dests = dests;
        let admitted: Vec<Vec<Result<u64, BrokerError>>> = dests
            .iter_mut()
            .map(|t| {
                let mut r = t.queue.admit(&accepted);
                // An empty outgoing queue deleted since it was looked up: use its successor.
                if r.is_err() && t.route.is_some() {
                    if let QueueRole::Outgoing { destination, .. } = &t.queue.def().role {
                        if let Ok(o) = self.outgoing_for(destination) {
                            t.queue = o.queue().clone();
                            r = t.queue.admit(&accepted);
                        }
                    }
                }
                match r {
                    Ok(r) => r,
                    Err(e) => accepted.iter().map(|_| Err(e.clone())).collect(),
                }
            })
            .collect();
        for per_queue in &admitted {
            for (j, r) in per_queue.iter().enumerate() {
                if let Err(e) = r {
                    if !refused[j] {
                        refused[j] = true;
                        failures.push((index[j], e.clone()));
                        let m = &accepted[j];
                        self.release(m.delivery, m.charged_bytes() * plan.len() as u64);
                    }
                }
            }
        }
        // Arrivals in local queues that asked for an ack: (message index, queue).
        let mut arrived: Vec<(usize, Arc<Queue>)> = Vec::new();
        for (t, per_queue) in dests.iter().zip(admitted) {
            let q = &t.queue;
            let mut express = Vec::new();
            for (j, r) in per_queue.into_iter().enumerate() {
                let Ok(seq) = r else { continue };
                // A copy for a remote queue carries its route (one copy per destination).
                let routed;
                let m = match &t.route {
                    None => &accepted[j],
                    Some(route) => {
                        routed = Arc::new(StoredMessage {
                            route: Some(route.clone()),
                            ..(*accepted[j]).clone()
                        });
                        &routed
                    }
                };
                if !refused[j] && t.route.is_none() && m.acknowledge != 0 {
                    arrived.push((j, q.clone()));
                }
                if refused[j] {
                    q.unadmit(seq, m.charged_bytes());
                } else if m.delivery == Delivery::Express {
                    express.push(Entry::new(seq, m.clone()));
                } else {
                    let (header, bodyless) = if t.route.is_some() {
                        (m.encode_header(), Arc::new(m.without_body()))
                    } else {
                        headers[j]
                            .get_or_insert_with(|| (m.encode_header(), Arc::new(m.without_body())))
                            .clone()
                    };
                    ops.push(Op::Put {
                        queue_id: q.def().id,
                        seq,
                        header,
                        body: m.body.clone().unwrap_or_default(),
                    });
                    durable.push((q.clone(), j, Entry::new(seq, bodyless)));
                }
                if m.journal && t.route.is_none() && !refused[j] {
                    self.source_copy(m, &mut source);
                }
            }
            self.insert_or_forget(q, express);
        }
        // Express messages have arrived; recoverable ones arrive with their record.
        let (express_arrived, durable_arrived): (Vec<_>, Vec<_>) = arrived
            .into_iter()
            .partition(|(j, _)| accepted[*j].delivery == Delivery::Express);
        let arrival = |(j, q): &(usize, Arc<Queue>)| crate::acks::AckEvent {
            msg: &accepted[*j],
            class: mq_proto::ack::class::ACK_REACH_QUEUE,
            destination: crate::acks::destination_of(q),
            body: None,
        };
        self.post_acks(express_arrived.iter().map(arrival));
        let mut acks = self.prepare_acks(durable_arrived.iter().map(arrival));
        ops.append(&mut acks.ops);
        let stream = stream.map(|(id, first_seq)| {
            let mut refused: Vec<usize> = failures.iter().map(|(i, _)| *i).collect();
            refused.sort_unstable();
            refused.dedup();
            let (outcome_ops, batch) =
                self.outcomes()
                    .stream_batch(id, first_seq, n as u64, &refused, !ops.is_empty());
            ops.extend(outcome_ops);
            batch
        });
        ops.extend(source.take_ops());
        let commit = (!ops.is_empty()).then(|| self.journal.submit(ops));
        drop(order_guard);
        let mut pending = Unsettled(Some(BatchTail {
            broker: self.clone(),
            commit,
            stream,
            source,
            durable,
            acks,
            refused,
            failures,
            accepted,
            index,
            ids,
        }));
        Box::pin(async move {
            let result = match pending.0.as_mut().and_then(|t| t.commit.as_mut()) {
                Some(commit) => Some(commit.await),
                None => None,
            };
            let mut tail = pending.0.take().expect("settled once");
            tail.commit = None;
            tail.settle(result)
        })
    }

    pub(crate) fn reserve(&self, delivery: Delivery, bytes: u64) -> Result<(), BrokerError> {
        let (counter, quota, what) = match delivery {
            Delivery::Express => (
                &self.express_used,
                self.config.express_quota_bytes,
                "express memory quota (mqd --express-quota-bytes)",
            ),
            Delivery::Recoverable => (
                &self.stored_used,
                self.config.storage_quota_bytes,
                "storage quota for recoverable messages (mqd --storage-quota-bytes)",
            ),
        };
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            if cur + bytes > quota {
                return Err(BrokerError::QuotaExceeded(format!(
                    "the broker's {what} is full: {cur} of {quota} bytes used, this message needs {bytes}; receive or purge messages, or raise the quota"
                )));
            }
            match counter.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Bytes charged to the storage quota now.
    pub(crate) fn stored_used(&self) -> u64 {
        self.stored_used.load(Ordering::Acquire)
    }

    /// Charges `bytes` more to a quota without checking it: what a message already charged
    /// costs more where it moves (a dead letter's info, `deadletter.rs`); a move is not refused
    /// for it.
    pub(crate) fn charge_more(&self, delivery: Delivery, bytes: u64) {
        let counter = match delivery {
            Delivery::Express => &self.express_used,
            Delivery::Recoverable => &self.stored_used,
        };
        counter.fetch_add(bytes, Ordering::AcqRel);
    }

    pub(crate) fn release(&self, delivery: Delivery, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let counter = match delivery {
            Delivery::Express => &self.express_used,
            Delivery::Recoverable => &self.stored_used,
        };
        counter.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Removes delivered or purged entries for good: gives back their quota and journals the
    /// removal of recoverable ones. The removal is group-committed with everything else and not
    /// waited for: a crash before it reaches the disk redelivers the message (at least once);
    /// it never loses one.
    pub fn forget(&self, queue: &Queue, entries: &[Entry]) {
        // Not awaited on purpose (see above); a failure poisons the journal, and later sends
        // report it.
        drop(self.forget_removal(queue, entries));
    }

    /// [`Broker::forget`], returning the journal write of the removal (if any) to wait for.
    pub(crate) fn forget_removal(
        &self,
        queue: &Queue,
        entries: &[Entry],
    ) -> Option<crate::journal::Commit> {
        self.forget_removal_with(queue, entries, Vec::new())
    }

    /// [`Broker::forget_removal`] whose record also holds `extra` (acks' `Put`s).
    pub(crate) fn forget_removal_with(
        &self,
        queue: &Queue,
        entries: &[Entry],
        mut extra: Vec<Op>,
    ) -> Option<crate::journal::Commit> {
        let removal = self.release_entries(queue, entries);
        if !extra.is_empty() {
            // `Put`s must follow their queues' definitions: the normal lane.
            extra.extend(removal);
            return Some(self.journal.submit(extra));
        }
        // The removal lane: the entries' `Put`s are durable (they were in the queue), so it
        // rides the next group commit instead of queueing behind pending sends; that bounds
        // the redelivery window after a crash.
        removal.map(|op| self.journal.submit_removal(vec![op]))
    }

    /// Gives back the quota of entries leaving `queue` for good, and returns the journal's
    /// `Remove` of the recoverable ones (none when all are express).
    pub(crate) fn release_entries(&self, queue: &Queue, entries: &[Entry]) -> Option<Op> {
        let mut express = 0;
        let mut stored = 0;
        let mut seqs = Vec::new();
        for e in entries {
            match e.msg.delivery {
                Delivery::Express => express += e.msg.charged_bytes(),
                Delivery::Recoverable => {
                    stored += e.msg.charged_bytes();
                    seqs.push(e.seq);
                }
            }
        }
        self.release(Delivery::Express, express);
        self.release(Delivery::Recoverable, stored);
        (!seqs.is_empty()).then(|| Op::Remove {
            queue_id: queue.def().id,
            seqs,
        })
    }

    /// Makes admitted entries receivable; if their queue was deleted meanwhile, forgets them
    /// instead (gives back their quota, and journals the removal of recoverable ones so no
    /// Put of a deleted queue stays live in the journal).
    pub(crate) fn insert_or_forget(&self, queue: &Queue, entries: Vec<Entry>) {
        let gone = queue.insert(entries);
        if !gone.is_empty() {
            self.forget(queue, &gone);
        }
    }

    /// Removes taken entries for good, durably (transactional queues: a receive is a committed
    /// single-message transaction before the message is handed out): submits the removal of
    /// `entries` (with their journal copies and receive acknowledgements), written on this
    /// thread if the journal's writer is idle ([`Journal::submit_removal_awaited`]). Whoever
    /// awaits its outcome hands it to [`Broker::finish_durable_removal`]; if the journal fails,
    /// the entries go back to the queue.
    pub(crate) fn start_durable_removal(
        &self,
        queue: &Arc<Queue>,
        entries: &[Entry],
    ) -> DurableRemoval {
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        // Journal copies (target journaling) and ACK_RECEIVEs go into the removal's record.
        let mut copies = self.journal_copies(queue, entries);
        let mut acks = self.acks_for_entries(queue, entries, mq_proto::ack::class::ACK_RECEIVE);
        let mut ops = copies.take_ops();
        ops.append(&mut acks.ops);
        ops.push(Op::Remove {
            queue_id: queue.def().id,
            seqs,
        });
        // Copies' and acks' `Put`s must follow their queues' definitions: the normal lane.
        let urgent = ops.len() == 1;
        DurableRemoval {
            commit: self.journal.submit_removal_awaited(ops, urgent),
            copies,
            acks,
        }
    }

    /// What follows a [`Broker::start_durable_removal`] once its `result` is known: the
    /// entries are gone for good, or back in the queue.
    pub(crate) fn finish_durable_removal(
        &self,
        queue: &Arc<Queue>,
        entries: Vec<Entry>,
        removal: DurableRemoval,
        result: Result<(), crate::journal::JournalError>,
    ) -> Result<Vec<Entry>, BrokerError> {
        let DurableRemoval { copies, acks, .. } = removal;
        match &result {
            Ok(()) => {
                copies.stored(self);
                acks.commit(self);
            }
            Err(_) => {
                copies.failed(self);
                acks.abort(self);
            }
        }
        match result {
            Ok(()) => {
                queue.complete(&entries);
                for e in &entries {
                    self.release(e.msg.delivery, e.msg.charged_bytes());
                }
                Ok(entries)
            }
            Err(e) => {
                let gone = queue.restore(entries);
                self.forget(queue, &gone);
                Err(journal_failed(e))
            }
        }
    }

    /// The bodies of queued messages of `queue`, in order: in memory, recently written (kept
    /// by the journal), or read from the journal, several adjacent ones with one read, on a
    /// blocking thread, so that a slow disk read does not hold up the other tasks of an async
    /// worker.
    pub async fn bodies(
        &self,
        queue: &Queue,
        entries: &[Entry],
    ) -> Result<Vec<Bytes>, BrokerError> {
        let mut out: Vec<Option<Bytes>> = entries.iter().map(|e| e.msg.body.clone()).collect();
        let missing: Vec<usize> = (0..out.len()).filter(|&i| out[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(out.into_iter().map(Option::unwrap).collect());
        }
        let qid = queue.def().id;
        let seqs: Vec<u64> = missing.iter().map(|&i| entries[i].seq).collect();
        let cached = self.journal.cached_bodies(qid, &seqs);
        let mut unread = Vec::new();
        for (&i, b) in missing.iter().zip(cached) {
            match b {
                Some(b) => out[i] = Some(b),
                None => unread.push(i),
            }
        }
        if !unread.is_empty() {
            let seqs: Vec<u64> = unread.iter().map(|&i| entries[i].seq).collect();
            let journal = self.journal.clone();
            // On a blocking thread, not in `block_in_place`: that moved this worker's other
            // tasks to new threads (new malloc arenas), and mqd's RSS with 1 MB bodies rose from
            // ~230 to ~460 MiB.
            let read = tokio::task::spawn_blocking(move || journal.read_bodies(qid, &seqs))
                .await
                .map_err(|e| BrokerError::Internal(format!("the journal read task failed: {e}")))?
                .map_err(|e| {
                    BrokerError::Internal(format!(
                        "cannot read messages of {} from the journal: {e}",
                        queue.def().name
                    ))
                })?;
            for (i, b) in unread.into_iter().zip(read) {
                out[i] = Some(b);
            }
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every body found"))
            .collect())
    }

    /// The body of a queued message if it is in memory or at most `max` bytes: then
    /// [`Broker::body`] on this thread (the journal's read finds a recently written body in
    /// its cache, or reads it with a single pread, which mostly finds the page cache). `None`
    /// for a larger body not in memory: [`Broker::bodies`] reads it on a blocking thread.
    pub fn body_here(
        &self,
        queue: &Queue,
        entry: &Entry,
        max: u64,
    ) -> Option<Result<Bytes, BrokerError>> {
        (entry.msg.body.is_some() || u64::from(entry.msg.body_len) <= max)
            .then(|| self.body(queue, entry))
    }

    /// The body of a message that was looked at, not taken (a peek, a cursor, the console):
    /// `None` if it was removed meanwhile (received, purged, moved, its queue deleted) and its
    /// journal record is gone. A peek racing receivers answered INTERNAL "no live message with
    /// seq .. in the journal" for the whole page (helper-71).
    pub(crate) fn peeked_body(
        &self,
        queue: &Queue,
        entry: &Entry,
    ) -> Result<Option<Bytes>, BrokerError> {
        match &entry.msg.body {
            Some(b) => Ok(Some(b.clone())),
            None => match self.journal.read_body(queue.def().id, entry.seq) {
                Ok(b) => Ok(Some(b)),
                // Gone from the journal and from the queue: removed meanwhile. Still waiting in
                // the queue, its record is missing (damage, a bug): that is an error, not
                // something to leave out of pages quietly (helper-72).
                Err(e @ crate::journal::JournalError::NotFound { .. }) => {
                    let still_here = queue
                        .peek_by(&crate::queue::Select::Id(entry.msg.id))
                        .ok()
                        .flatten()
                        .is_some_and(|e| e.seq == entry.seq);
                    if !still_here {
                        return Ok(None);
                    }
                    tracing::error!(queue = %queue.def().name, id = %entry.msg.id, seq = entry.seq, "a waiting message has no record in the journal");
                    Err(BrokerError::Internal(format!(
                        "cannot read message {} of {} from the journal: {e}",
                        entry.msg.id,
                        queue.def().name
                    )))
                }
                Err(e) => Err(BrokerError::Internal(format!(
                    "cannot read message {} of {} from the journal: {e}",
                    entry.msg.id,
                    queue.def().name
                ))),
            },
        }
    }

    /// The body of a queued message: in memory, or read from the journal.
    pub fn body(&self, queue: &Queue, entry: &Entry) -> Result<Bytes, BrokerError> {
        match &entry.msg.body {
            Some(b) => Ok(b.clone()),
            None => self
                .journal
                .read_body(queue.def().id, entry.seq)
                .map_err(|e| {
                    BrokerError::Internal(format!(
                        "cannot read message {} of {} from the journal: {e}",
                        entry.msg.id,
                        queue.def().name
                    ))
                }),
        }
    }
}

/// A removal submitted by [`Broker::start_durable_removal`], with what follows its outcome.
pub(crate) struct DurableRemoval {
    pub(crate) commit: crate::journal::Commit,
    copies: crate::journal_queue::Copies,
    acks: crate::acks::Prepared,
}

/// What a send batch does once its record's outcome is known ([`Broker::send_batch_on`]).
struct BatchTail {
    broker: Arc<Broker>,
    commit: Option<crate::journal::Commit>,
    stream: Option<crate::outcome::StreamBatch>,
    source: crate::journal_queue::Copies,
    durable: Vec<(Arc<Queue>, usize, Entry)>,
    acks: crate::acks::Prepared,
    refused: Vec<bool>,
    failures: Vec<(usize, BrokerError)>,
    accepted: Vec<Arc<StoredMessage>>,
    index: Vec<usize>,
    ids: Vec<Option<uuid::Uuid>>,
}

impl BatchTail {
    /// The batch's recoverable messages become receivable (`Some(Ok)`), or give their
    /// positions and charges back (`Some(Err)`); `None`: it had no record.
    fn settle(mut self, result: Option<Result<(), crate::journal::JournalError>>) -> BatchOutcome {
        let broker = &self.broker;
        if let Some(result) = result {
            if let Some(batch) = self.stream.take() {
                match &result {
                    Ok(()) => broker.outcomes().stream_committed(batch),
                    Err(_) => broker.outcomes().stream_failed(batch),
                }
            }
            let source = std::mem::take(&mut self.source);
            match &result {
                Ok(()) => source.stored(broker),
                Err(_) => source.failed(broker),
            }
            let acks = std::mem::take(&mut self.acks);
            let durable = std::mem::take(&mut self.durable);
            match result {
                Ok(()) => {
                    let placed = durable.into_iter().map(|(q, _, e)| (q, e));
                    for (q, entries) in group_by_queue(placed) {
                        broker.insert_or_forget(&q, entries);
                    }
                    acks.commit(broker);
                }
                Err(e) => {
                    acks.abort(broker);
                    let err = journal_failed(e);
                    for (q, j, entry) in durable {
                        let charge = entry.msg.charged_bytes();
                        q.unadmit(entry.seq, charge);
                        broker.release(Delivery::Recoverable, charge);
                        if !self.refused[j] {
                            self.refused[j] = true;
                            self.failures.push((self.index[j], err.clone()));
                        }
                    }
                }
            }
        }
        for (j, m) in self.accepted.iter().enumerate() {
            if !self.refused[j] {
                self.ids[self.index[j]] = Some(m.id);
            }
        }
        let mut failures = std::mem::take(&mut self.failures);
        failures.sort_by_key(|(i, _)| *i);
        BatchOutcome {
            ids: std::mem::take(&mut self.ids),
            failures,
        }
    }
}

/// A send batch whose future was dropped before its record's outcome was known (an embedder's
/// deadline, a cancelled task) is still settled: by a task of its own on a runtime, else on
/// this thread. Its recoverable messages hold admitted positions, and an application's queue
/// hands out nothing past a position admitted and not yet inserted, so an unsettled batch
/// stopped its queue for good (review F6, stop 47).
struct Unsettled(Option<BatchTail>);

impl Drop for Unsettled {
    fn drop(&mut self) {
        let Some(mut tail) = self.0.take() else {
            return;
        };
        let Some(commit) = tail.commit.take() else {
            tail.settle(None);
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let result = commit.await;
                    tail.settle(Some(result));
                });
            }
            Err(_) => {
                let result = commit.wait();
                tail.settle(Some(result));
            }
        }
    }
}

/// A purge's or deletion's record holds at most about this many bytes of negative
/// acknowledgements' bodies (see [`Broker::purge_queue`], [`Broker::nack_ahead_of_deletion`]).
const NACK_CHUNK_BYTES: u64 = 64 * 1024 * 1024;
/// And at most this many removals.
const NACK_CHUNK_MESSAGES: usize = 65_536;

/// How many of `entries`, from the first, go into one record of removals with their negative
/// acknowledgements: at least one, at most [`NACK_CHUNK_MESSAGES`], and bodies of about
/// [`NACK_CHUNK_BYTES`] at most (one more message than fits).
fn nack_chunk_len(entries: &[Entry]) -> usize {
    let mut bytes = 0u64;
    entries
        .iter()
        .take_while(|e| {
            let more = bytes < NACK_CHUNK_BYTES;
            if e.msg.acknowledge != 0 {
                bytes += u64::from(e.msg.body_len);
            }
            more
        })
        .count()
        .clamp(1, NACK_CHUNK_MESSAGES)
}

/// `host:port` of the broker a remote queue lives on (the outgoing queue's destination).
pub(crate) fn remote_destination(addr: &QueueAddress) -> String {
    format!(
        "{}:{}",
        addr.host,
        addr.port.unwrap_or(mq_proto::format_name::DEFAULT_PORT)
    )
}

/// `.\private$\name` or `.\name`: how a local queue is shown, with the name as written.
fn local_path_name(addr: &QueueAddress) -> String {
    if addr.private {
        format!(".\\private$\\{}", addr.name)
    } else {
        format!(".\\{}", addr.name)
    }
}

/// A journal failure as the broker reports it.
pub(crate) fn journal_failed(e: crate::journal::JournalError) -> BrokerError {
    if let crate::journal::JournalError::NoSpace { .. } = e {
        return BrokerError::QuotaExceeded(format!(
            "the disk under the journal is full, nothing was stored: {e}"
        ));
    }
    if e.is_poisoned() {
        BrokerError::Unavailable(format!(
            "the journal refuses writes: {e}; restart mqd after fixing the disk"
        ))
    } else {
        BrokerError::Unavailable(format!("the journal could not store the change: {e}"))
    }
}

/// Transactional messages: MSMQ ignores their priority (forces 0) and they are always durable.
pub(crate) fn force_transactional(m: &mut v1::OutMessage) {
    m.priority = Some(0);
    m.delivery = v1::Delivery::Recoverable as i32;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use bytes::Bytes;
    use mq_proto::v1;

    use super::Broker;
    use crate::config::BrokerConfig;
    use crate::journal::{Journal, JournalOptions, Op};

    fn open(dir: &std::path::Path) -> Arc<Broker> {
        open_with(dir, |_| {})
    }

    /// A recoverable message of `body`.
    fn recoverable(body: impl Into<Bytes>) -> v1::OutMessage {
        v1::OutMessage {
            body: body.into(),
            delivery: v1::Delivery::Recoverable as i32,
            ..Default::default()
        }
    }

    /// `n` recoverable messages `{prefix}0`, `{prefix}1`, ... asking the admin queue
    /// `.\private$\acks` for the acknowledgements `acknowledge` names.
    fn asking_acks(n: usize, prefix: &str, acknowledge: u32) -> Vec<v1::OutMessage> {
        (0..n)
            .map(|i| v1::OutMessage {
                admin_queue: r".\private$\acks".into(),
                acknowledge,
                ..recoverable(format!("{prefix}{i}"))
            })
            .collect()
    }

    /// Sends `msgs` to the local queue `name` and waits until every one is stored; their ids.
    async fn store(b: &Arc<Broker>, name: &str, msgs: Vec<v1::OutMessage>) -> Vec<uuid::Uuid> {
        let dests = b.destinations(name, false).unwrap();
        let sent = b.send_batch(&dests, msgs, false).await;
        assert!(sent.failures.is_empty(), "{:?}", sent.failures);
        sent.ids.into_iter().map(|id| id.expect("stored")).collect()
    }

    /// Creates the queue `name` (a local path name) with the defaults.
    async fn create(b: &Broker, name: &str) {
        b.create_queue(v1::CreateQueueRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    /// [`open`], with the configuration changed by `change` first.
    fn open_with(dir: &std::path::Path, change: impl FnOnce(&mut BrokerConfig)) -> Arc<Broker> {
        let mut config = BrokerConfig::new(dir);
        change(&mut config);
        let (b, _) = Broker::open(config, vec!["127.0.0.1:4000".parse().unwrap()]).unwrap();
        Arc::new(b)
    }

    /// Deleting a queue while a recoverable send to it is being stored used to leak that
    /// send's share of the storage quota for good (the late insert was dropped silently).
    #[tokio::test]
    async fn deleting_a_queue_with_sends_in_flight_gives_their_quota_back() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        let dests = b.destinations(r".\private$\q", false).unwrap();
        let msgs = (0..10)
            .map(|i| v1::OutMessage {
                body: Bytes::from(format!("m{i}")),
                label: "a label".into(),
                delivery: v1::Delivery::Recoverable as i32,
                ..Default::default()
            })
            .collect();
        let sending = b.send_batch(&dests, msgs, false);
        assert!(b.stored_used.load(Ordering::Acquire) > 0);
        b.delete_queue(r".\private$\q").await.unwrap();
        let _ = sending.await;
        assert_eq!(b.stored_used.load(Ordering::Acquire), 0);
        assert_eq!(b.express_used.load(Ordering::Acquire), 0);
    }

    /// How many messages `q` holds once it holds `n`, or after 10 s.
    async fn holds_soon(q: &crate::queue::Queue, n: u64) -> u64 {
        for _ in 0..2000 {
            if q.info().messages == n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        q.info().messages
    }

    /// A purge whose caller goes away while its record is written (a deadline) still completes:
    /// its negative acknowledgements are posted and nothing stays out of the queue with its
    /// charge taken (helper-72: 160 of 480 NACKs lost and 32 MB of the storage quota leaked
    /// by 23 purges cut by their deadlines).
    #[tokio::test]
    async fn a_purge_whose_caller_goes_away_still_completes() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        create(&b, r".\private$\acks").await;
        store(&b, r".\private$\q", asking_acks(5, "m", 8)).await;
        let charged = b.stored_used.load(Ordering::Acquire);
        // Polled until it waits for its record, then dropped.
        let r = futures::FutureExt::now_or_never(b.purge(r".\private$\q"));
        assert!(r.is_none(), "the purge waited for nothing: {r:?}");
        let acks = b.queue(r".\private$\acks").unwrap();
        assert_eq!(holds_soon(&acks, 5).await, 5, "every NACK_Q_PURGED posted");
        assert_eq!(b.queue(r".\private$\q").unwrap().info().messages, 0);
        assert_eq!(b.purge(r".\private$\acks").await.unwrap(), 5);
        assert_eq!(
            b.stored_used.load(Ordering::Acquire),
            0,
            "every charge came back (the purged messages' were {charged})"
        );
        b.close();
    }

    /// A move to a subqueue whose caller goes away while its record is written (a deadline)
    /// still completes: the message ends in the subqueue, not in flight in its queue until a
    /// restart (helper-72: 32-49 of 200 moves cut by their deadlines stayed in flight).
    #[tokio::test]
    async fn a_move_whose_caller_goes_away_still_completes() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        let id = store(&b, r".\private$\q", vec![recoverable("moved")]).await[0];
        let q = b.queue(r".\private$\q").unwrap();
        move_dropped_arrives(&b, &q, id, "poison", r".\private$\q;poison").await;
        b.close();
    }

    /// Moves message `id` out of `src` to `destination`, dropping the move once it waits for
    /// its record, and checks that it arrives in queue `lands_in` all the same, nothing of it
    /// left in `src`.
    async fn move_dropped_arrives(
        b: &Arc<Broker>,
        src: &Arc<crate::queue::Queue>,
        id: uuid::Uuid,
        destination: &str,
        lands_in: &str,
    ) {
        let r = futures::FutureExt::now_or_never(b.move_message(src, id, destination, &|_| Ok(())));
        assert!(r.is_none(), "the move waited for nothing: {r:?}");
        let dest = b.queue(lands_in).unwrap();
        assert_eq!(
            holds_soon(&dest, 1).await,
            1,
            "the message reached {lands_in}"
        );
        let info = src.info();
        assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");
    }

    /// A dead letter's replay whose caller goes away while its record is written still
    /// completes: the message ends in its original queue, not in flight in the dead-letter queue
    /// until a restart (stop 47's note; moves to a subqueue were mended by helper-72).
    #[tokio::test]
    async fn a_replay_whose_caller_goes_away_still_completes() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        let expiring = v1::OutMessage {
            time_to_be_received_ms: 1,
            ..recoverable("replayed")
        };
        let id = store(&b, r".\private$\q", vec![expiring]).await[0];
        let dlq = b.dead_letter_queue(false).clone();
        for _ in 0..1000 {
            if dlq.info().messages == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            b.sweep_expired().await;
        }
        assert_eq!(dlq.info().messages, 1, "the message is a dead letter");
        move_dropped_arrives(&b, &dlq, id, "", r".\private$\q").await;
        b.close();
    }

    /// A send batch whose future is dropped before its record is on disk (an embedder's
    /// deadline) is still settled: its recoverable messages arrive, with their acks, and the
    /// queue, which hands out nothing past a position admitted and not yet inserted, does not
    /// stop behind them (review F6, stop 47: the express message sent next was never received).
    #[tokio::test]
    async fn a_send_whose_future_is_dropped_still_arrives_and_its_queue_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        create(&b, r".\private$\acks").await;
        let dests = b.destinations(r".\private$\q", false).unwrap();
        drop(b.send_batch(&dests, asking_acks(2, "r", 1), false));
        let express = vec![v1::OutMessage {
            body: Bytes::from_static(b"e"),
            ..Default::default()
        }];
        assert!(b
            .send_batch(&dests, express, false)
            .await
            .failures
            .is_empty());
        let q = b.queue(r".\private$\q").unwrap();
        let mut got = Vec::new();
        for _ in 0..2000 {
            got.extend(q.take(10).unwrap());
            if got.len() == 3 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let bodies: Vec<String> = got
            .iter()
            .map(|e| {
                let body = b.body(&q, e).unwrap();
                String::from_utf8_lossy(&body).into_owned()
            })
            .collect();
        assert_eq!(bodies, ["r0", "r1", "e"], "in send order, none held back");
        let acks = b.queue(r".\private$\acks").unwrap();
        assert_eq!(
            holds_soon(&acks, 2).await,
            2,
            "both ACK_REACH_QUEUEs posted"
        );
        b.close();
    }

    /// Acks placed for a record that is never written (their holder was cancelled) give their
    /// broker-wide charge back with their positions: it stayed taken until a restart.
    #[tokio::test]
    async fn acks_dropped_unwritten_give_their_charge_back() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.acks.set_broker(&b);
        create(&b, r".\private$\acks").await;
        let out = v1::OutMessage {
            body: Bytes::from_static(b"m"),
            delivery: v1::Delivery::Recoverable as i32,
            admin_queue: r".\private$\acks".into(),
            acknowledge: 1,
            ..Default::default()
        };
        let msg =
            crate::message::StoredMessage::accept(out, uuid::Uuid::now_v7(), &b.config).unwrap();
        let before = b.stored_used.load(Ordering::Acquire);
        let acks = b.prepare_acks([crate::acks::AckEvent {
            msg: &msg,
            class: mq_proto::ack::class::ACK_REACH_QUEUE,
            destination: r".\private$\q".into(),
            body: None,
        }]);
        assert!(!acks.is_empty());
        assert!(b.stored_used.load(Ordering::Acquire) > before, "charged");
        drop(acks);
        assert_eq!(b.stored_used.load(Ordering::Acquire), before);
        b.close();
    }

    /// A deletion whose NACK_Q_DELETEDs carry more bodies than one record should hold writes
    /// them ahead in chunks, each with its messages' removal, and the rest with the deletion
    /// (one record of every body made 270 messages of 4 MiB fail the deletion for good, past
    /// the journal's 1 GiB record limit). Every NACK is posted once, across a restart too.
    #[tokio::test]
    async fn a_deletion_writes_its_negative_acknowledgements_in_chunks() {
        const N: usize = 17; // 68 MiB of bodies: one chunk of 16 ahead, one with the deletion
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.acks.set_broker(&b);
        create(&b, r".\private$\q").await;
        create(&b, r".\private$\acks").await;
        let body = Bytes::from(vec![7u8; 4 << 20]);
        for i in 0..N {
            let delivery = if i % 2 == 0 {
                v1::Delivery::Recoverable
            } else {
                v1::Delivery::Express
            };
            let msg = v1::OutMessage {
                delivery: delivery as i32,
                admin_queue: r".\private$\acks".into(),
                acknowledge: 8, // negative acks on receive
                ..recoverable(body.clone())
            };
            store(&b, r".\private$\q", vec![msg]).await;
        }
        let acks = b.queue(r".\private$\acks").unwrap();
        let q = b.queue(r".\private$\q").unwrap();
        b.nack_ahead_of_deletion(&q.def().key).await.unwrap();
        assert_eq!(q.info().messages, 1, "one chunk of 16 went ahead");
        assert_eq!(holds_soon(&acks, 16).await, 16);
        b.delete_queue(r".\private$\q").await.unwrap();
        assert_eq!(holds_soon(&acks, N as u64).await, N as u64);
        let nacks = acks.peek(N).unwrap();
        assert!(nacks
            .iter()
            .all(|e| e.msg.class == mq_proto::ack::class::NACK_Q_DELETED
                && e.msg.body_len == 4 << 20));
        drop((q, acks));
        b.close();
        drop(b);
        let b = open(dir.path());
        assert!(b.queue(r".\private$\q").is_err(), "deleted for good");
        let acks = b.queue(r".\private$\acks").unwrap();
        let stored = acks.info().messages;
        assert_eq!(
            stored,
            N.div_ceil(2) as u64,
            "the recoverable messages' NACKs, once each"
        );
        b.close();
    }

    /// A deletion whose caller goes away while its record is written (a deadline) still
    /// completes: its NACKs are posted and its messages' charges given back (inline, the queue
    /// was out of the registry with its charges taken and its NACKs unposted until a restart).
    #[tokio::test]
    async fn a_deletion_whose_caller_goes_away_still_completes() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.acks.set_broker(&b);
        create(&b, r".\private$\q").await;
        create(&b, r".\private$\acks").await;
        store(&b, r".\private$\q", asking_acks(2, "m", 8)).await;
        let r = futures::FutureExt::now_or_never(b.delete_queue(r".\private$\q"));
        assert!(r.is_none(), "the deletion waited for nothing: {r:?}");
        let acks = b.queue(r".\private$\acks").unwrap();
        assert_eq!(holds_soon(&acks, 2).await, 2, "both NACK_Q_DELETEDs posted");
        assert!(b.queue(r".\private$\q").is_err());
        assert_eq!(b.purge(r".\private$\acks").await.unwrap(), 2);
        assert_eq!(
            b.stored_used.load(Ordering::Acquire),
            0,
            "every charge came back"
        );
        b.close();
    }

    /// `--max-queues N` lets N queues be made: the broker's own (its dead-letter queues and
    /// internal ones) do not count (helper-73: with 3, the second create was refused).
    #[tokio::test]
    async fn the_brokers_own_queues_do_not_count_against_max_queues() {
        let dir = tempfile::tempdir().unwrap();
        let b = open_with(dir.path(), |c| c.max_queues = 3);
        for i in 0..3 {
            create(&b, &format!(r".\private$\q{i}")).await;
        }
        let e = b
            .create_queue(v1::CreateQueueRequest {
                name: r".\private$\q3".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("holds 3 queues"), "{e}");
        b.close();
    }

    /// A message looked at (a peek page, a cursor, the console) and removed before its body was
    /// read has no body (`None`), not an INTERNAL error: a peek racing receivers failed whole
    /// with "no live message with seq .. in the journal" (helper-71).
    #[tokio::test]
    async fn a_peeked_message_removed_before_its_body_is_read_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        create(&b, r".\private$\q").await;
        store(&b, r".\private$\q", vec![recoverable("peeked")]).await;
        let q = b.queue(r".\private$\q").unwrap();
        let seen = q.peek(1).unwrap();
        assert_eq!(
            b.peeked_body(&q, &seen[0]).unwrap().as_deref(),
            Some(&b"peeked"[..])
        );
        assert_eq!(b.purge(r".\private$\q").await.unwrap(), 1);
        assert_eq!(b.peeked_body(&q, &seen[0]).unwrap(), None);
        assert!(matches!(
            b.body(&q, &seen[0]),
            Err(crate::error::BrokerError::Internal(_))
        ));
        b.close();
    }

    /// `--listen 0.0.0.0` and `--alias`: the machine's own addresses and the broker's aliases
    /// (names or IPs) are this broker; forwarded messages to them are not refused.
    #[test]
    fn interface_addresses_and_aliases_are_local() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::new(dir.path());
        config.aliases = vec!["mq.example.net".into(), "203.0.113.7".into()];
        let (b, _) = Broker::open(
            config,
            crate::server::local_addresses("0.0.0.0:1801".parse().unwrap()),
        )
        .unwrap();
        let local = |name: &str| {
            let parsed = mq_proto::format_name::FormatName::parse(name).unwrap();
            b.is_local(parsed.single().unwrap())
        };
        for i in if_addrs::get_if_addrs().unwrap() {
            if i.ip().is_ipv4() {
                assert!(
                    local(&format!(r"DIRECT=TCP:{}\private$\q", i.ip())),
                    "{}",
                    i.ip()
                );
                assert!(!local(&format!(r"DIRECT=TCP:{}:1802\private$\q", i.ip())));
            }
        }
        assert!(local(r"DIRECT=OS:MQ.example.net\private$\q"));
        assert!(local(r"mq.example.net\private$\q"));
        assert!(local(r"DIRECT=TCP:203.0.113.7\private$\q"));
        assert!(!local(r"DIRECT=TCP:203.0.113.8\private$\q"));
        assert!(!local(r"DIRECT=OS:other.example.net\private$\q"));
        b.close();
    }

    /// The dead-letter queues page their headers as application queues do (a dead letter's
    /// `Put` holds its header with its dead-letter info): 40 recoverable dead letters with a
    /// window of 4 keep 4 headers in memory, the rest are read back with their info, before
    /// and after a restart; each is charged its info too, and gives it all back.
    #[tokio::test]
    async fn dead_letter_queues_page_their_headers() {
        const N: usize = 40;
        let dir = tempfile::tempdir().unwrap();
        let open_paged = || open_with(dir.path(), |c| c.queue_header_window = 4);
        let b = open_paged();
        create(&b, r".\private$\q").await;
        let msgs = (0..N)
            .map(|i| v1::OutMessage {
                time_to_be_received_ms: 1,
                ..recoverable(format!("m{i}"))
            })
            .collect();
        store(&b, r".\private$\q", msgs).await;
        let dlq = b.dead_letter_queue(false).clone();
        for _ in 0..1000 {
            if dlq.info().messages == N as u64 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            b.sweep_expired().await;
        }
        assert_eq!(dlq.info().messages, N as u64);
        let charged = b.stored_used.load(Ordering::Acquire);
        assert_eq!(dlq.paged_out(), N - 4, "the dead-letter queue pages");
        let check = |b: &Arc<Broker>| {
            let dlq = b.dead_letter_queue(false).clone();
            let taken = dlq.take(N).unwrap();
            let bodies: Vec<u32> = taken.iter().map(|e| e.msg.body_len).collect();
            assert_eq!(bodies.len(), N);
            for e in &taken {
                let d = e
                    .msg
                    .dead_letter
                    .as_ref()
                    .expect("dead-letter info read back");
                assert_eq!(d.class, v1::DeadLetterClass::ReceiveTimeout);
                assert_eq!(d.destination, r"DIRECT=OS:.\private$\q");
            }
            taken
        };
        let taken = check(&b);
        assert!(dlq.restore(taken).is_empty());
        b.close();
        drop((b, dlq));
        let b = open_paged();
        let dlq = b.dead_letter_queue(false).clone();
        assert_eq!(dlq.paged_out(), N - 4, "paged after recovery");
        assert_eq!(b.stored_used.load(Ordering::Acquire), charged);
        let taken = check(&b);
        // Charged: body, overhead and the info (its texts and 128 B) for each.
        let info = taken[0].msg.dead_letter.as_ref().unwrap();
        let one = 2
            + crate::config::MESSAGE_OVERHEAD_BYTES
            + crate::message::DEAD_LETTER_INFO_BYTES
            + (info.reason.len() + info.destination.len() + info.broker.len()) as u64;
        assert_eq!(charged, one * 10 + (one + 1) * 30);
        dlq.complete(&taken);
        b.forget_received_acked(&dlq, &taken);
        assert_eq!(b.stored_used.load(Ordering::Acquire), 0);
        b.close();
    }

    /// The queues that page share one header budget (`max_window_headers`): each level's
    /// window is budget / (8 × queues that page, the two dead-letter queues included), at most
    /// `queue_header_window`, and grows back as queues are deleted.
    #[tokio::test]
    async fn the_queues_that_page_share_one_header_budget() {
        let dir = tempfile::tempdir().unwrap();
        let b = open_with(dir.path(), |c| {
            c.queue_header_window = 4;
            c.max_window_headers = 8 * 4 * 4;
        });
        let create = |name: String| {
            let b = &b;
            async move { create(b, &format!(r".\private$\{name}")).await }
        };
        let fill = |name: &'static str| {
            let b = &b;
            async move {
                let q = format!(r".\private$\{name}");
                let dests = b.destinations(&q, false).unwrap();
                let msgs = (0..10)
                    .map(|i| v1::OutMessage {
                        body: Bytes::from(format!("m{i}")),
                        delivery: v1::Delivery::Recoverable as i32,
                        ..Default::default()
                    })
                    .collect();
                assert!(b.send_batch(&dests, msgs, false).await.failures.is_empty());
                b.queue(&q).unwrap().paged_out()
            }
        };
        // Two dead-letter queues and two of ours: 4 headers a level each.
        create("a".into()).await;
        create("b".into()).await;
        assert_eq!(fill("a").await, 6);
        for i in 0..4 {
            create(format!("more{i}")).await;
        }
        // Eight: 2 a level.
        assert_eq!(fill("b").await, 8);
        for i in 0..4 {
            b.delete_queue(&format!(r".\private$\more{i}"))
                .await
                .unwrap();
        }
        create("c".into()).await;
        // Five: 128 / 40 = 3.
        assert_eq!(fill("c").await, 7);
        b.close();
    }

    /// The ACLs of all queues together hold at most `max_acl_bytes` (each entry its principal
    /// and 64 B): a grant past it is refused, on any queue, until something is revoked.
    #[tokio::test]
    async fn grants_past_the_brokers_acl_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Entries of "uN", 66 B each: six fit in 400 B (396), a seventh does not (462).
        let b = open_with(dir.path(), |c| c.max_acl_bytes = 400);
        let mut send = crate::auth::Rights::default();
        send.insert(crate::auth::Right::Send);
        let mut queues = Vec::new();
        for name in ["a", "b"] {
            let name = format!(r".\private$\{name}");
            create(&b, &name).await;
            queues.push(b.queue(&name).unwrap());
        }
        for i in 0..6 {
            let q = &queues[i % 2];
            b.change_acl(q, &format!("u{i}"), send, true).await.unwrap();
        }
        // Granting more to a principal already there adds no entry.
        b.change_acl(&queues[0], "u0", send, true).await.unwrap();
        let err = b
            .change_acl(&queues[1], "u9", send, true)
            .await
            .expect_err("past the broker's ACL bytes");
        assert!(
            matches!(&err, crate::error::BrokerError::QuotaExceeded(m) if m.contains("mqd --max-acl-bytes") && m.contains("462 bytes")),
            "{err:?}"
        );
        assert!(b.change_acl(&queues[0], "u9", send, true).await.is_err());
        // Every queue with an ACL of its own counts, whatever its role: the broker's
        // SYSTEM$;JOURNAL too (its grants were not counted, and the sum underflowed).
        let journal = b.queue(r".\SYSTEM$;JOURNAL").unwrap();
        assert!(matches!(
            b.change_acl(&journal, "u9", send, true).await,
            Err(crate::error::BrokerError::QuotaExceeded(_))
        ));
        // A revoke makes room, for any queue.
        b.change_acl(&queues[0], "u0", send, false).await.unwrap();
        b.change_acl(&queues[1], "u9", send, true).await.unwrap();
        b.close();
    }

    /// A Put for a queue with no definition (a send that raced the queue's deletion) is
    /// dropped by recovery with a tombstone, so it is not recovered and copied again forever.
    #[tokio::test]
    async fn recovery_drops_messages_of_deleted_queues_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.journal()
            .submit(vec![Op::Put {
                queue_id: 9_999,
                seq: 1,
                header: Bytes::from_static(b"orphan"),
                body: Bytes::from_static(b"body"),
            }])
            .await
            .unwrap();
        b.close();
        drop(b);
        let b = open(dir.path());
        b.close();
        drop(b);
        let (j, rec) =
            Journal::open(&dir.path().join("journal"), JournalOptions::default()).unwrap();
        assert!(
            !rec.messages.contains_key(&9_999),
            "the orphan Put is still live"
        );
        j.shutdown();
    }

    /// Issue 19: a create does not take the name of a queue whose deletion is in flight. A
    /// deletion the journal refuses (ENOSPC: nothing stored) puts the queue back, and the name
    /// is that queue's — not a new empty one's that a concurrent create inserted meanwhile
    /// (which a failed create then took out, leaving no queue at all).
    #[tokio::test]
    async fn a_create_waits_for_a_deletion_in_flight_of_the_same_name() {
        use std::task::Poll;
        let dir = tempfile::tempdir().unwrap();
        let io = crate::journal::FaultyIo::new(41);
        let mut config = BrokerConfig::new(dir.path());
        config.journal_io = Some(Arc::new(io.clone()));
        let b = Arc::new(
            Broker::open(config, vec!["127.0.0.1:4000".parse().unwrap()])
                .unwrap()
                .0,
        );
        let req = |name: &str| v1::CreateQueueRequest {
            name: name.into(),
            ..Default::default()
        };
        let name = r".\private$\q";
        let old = b.create_queue(req(name)).await.unwrap();
        // Hold the journal's writer in the sync of another queue's definition: the records
        // submitted next wait behind it.
        io.pause_syncs(true);
        let other = b.create_queue(req(r".\private$\other"));
        tokio::pin!(other);
        assert!(futures::poll!(other.as_mut()).is_pending());
        let mut held = false;
        for _ in 0..6000 {
            if io.sync_held() {
                held = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(held, "the journal writes the other definition");
        io.fail_writes_with_enospc(true);
        let delete = b.delete_queue(name);
        tokio::pin!(delete);
        let delete_waits = futures::poll!(delete.as_mut()).is_pending();
        // The deletion runs in a task of its own: let it take the queue out.
        for _ in 0..2000 {
            if b.queue(name).is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let out_while_deleting = b.queue(name).is_err();
        let create = b.create_queue(req(name));
        tokio::pin!(create);
        let create_waits = matches!(futures::poll!(create.as_mut()), Poll::Pending);
        let name_free_while_deleting = b.queue(name).is_err();
        // Let the journal go on before checking (a failed check must not leave it held).
        io.pause_syncs(false);
        assert!(delete_waits, "the deletion waits for the journal");
        assert!(
            out_while_deleting,
            "out of the registry while its deletion is in flight"
        );
        assert!(create_waits);
        assert!(
            name_free_while_deleting,
            "a create of the same name waits for the deletion in flight"
        );
        other.await.unwrap();
        let deleted = delete.await;
        assert!(
            matches!(&deleted, Err(crate::error::BrokerError::Unavailable(m)) if m.contains("kept")),
            "the journal refused the deletion: {deleted:?}"
        );
        let created = create.await;
        assert!(
            matches!(created, Err(crate::error::BrokerError::QueueExists(_))),
            "the queue is back: {created:?}"
        );
        let q = b.queue(name).expect("the queue whose deletion was refused");
        assert!(Arc::ptr_eq(&q, &old) && !q.is_deleted());
    }
}
