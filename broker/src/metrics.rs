//! Metrics: the counters nothing else keeps (transactions, dead letters by class, gRPC calls
//! and refusals) and the Prometheus collector that reads them and the broker's own state at
//! scrape time.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::auth::{Auth, Identity};
use crate::message::now_ms;
use crate::queue::QueueRole;
use crate::ready::Readiness;

/// Why a transaction was aborted (the `reason` label of `mq_transactions_aborted_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AbortReason {
    /// The client asked (`TxAbort`).
    Requested = 0,
    /// The commit failed (a refused send, a journal failure).
    CommitFailed = 1,
    /// Open longer than `--tx-timeout-secs`.
    Timeout = 2,
    /// The stream ended without a commit (client gone, an error, shutdown).
    Ended = 3,
}

const ABORT_REASONS: [&str; 4] = ["requested", "commit_failed", "timeout", "ended"];

/// gRPC status codes by number, as labels.
const CODES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// `DeadLetterClass` numbers, 0 (unspecified) to 8 (access denied).
const DEAD_LETTER_CLASSES: usize = 9;

/// Broker-wide counters kept where the work happens: relaxed atomics, no lock, no allocation.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    tx_begun: AtomicU64,
    tx_committed: AtomicU64,
    tx_aborted: [AtomicU64; 4],
    /// Dead-lettered messages by class (the `DeadLetterClass` number).
    dead_lettered: [AtomicU64; DEAD_LETTER_CLASSES],
    /// gRPC calls that ended with each status code (0 = OK is not counted here).
    refused: [AtomicU64; 17],
    calls: AtomicU64,
    calls_open: AtomicI64,
    /// Bytes of request messages received in part, broker-wide (`partial_requests`).
    pub(crate) partial_request_bytes: AtomicU64,
    /// Unix ms as of which the saved totals are on disk (`counters_store.rs`); 0: not yet.
    pub(crate) saved_ms: AtomicU64,
}

impl Counters {
    pub(crate) fn tx_begun(&self) {
        self.tx_begun.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn tx_committed(&self) {
        self.tx_committed.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn tx_aborted(&self, why: AbortReason) {
        self.tx_aborted[why as usize].fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn dead_lettered(&self, class: mq_proto::v1::DeadLetterClass, n: u64) {
        let i = (class as usize).min(DEAD_LETTER_CLASSES - 1);
        self.dead_lettered[i].fetch_add(n, Ordering::Relaxed);
    }
    fn call_ended(&self, code: Option<usize>) {
        self.calls_open.fetch_sub(1, Ordering::Relaxed);
        if let Some(c) = code.filter(|c| *c != 0) {
            self.refused[c.min(16)].fetch_add(1, Ordering::Relaxed);
        }
    }
    /// The broker-wide totals kept across restarts (`counters_store.rs`).
    pub(crate) fn durable(&self) -> crate::counters_store::BrokerTotals {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::counters_store::BrokerTotals {
            dead_lettered: std::array::from_fn(|i| load(&self.dead_lettered[i])),
            access_denied: load(&self.dead_lettered[8]),
            tx_committed: load(&self.tx_committed),
            tx_aborted: self.tx_aborted.each_ref().map(load),
        }
    }

    /// At recovery: the saved broker-wide totals (none of those transactions is open).
    pub(crate) fn restore(&self, t: &crate::counters_store::BrokerTotals) {
        for (a, v) in self.dead_lettered.iter().zip(t.dead_lettered) {
            a.store(v, Ordering::Relaxed);
        }
        self.dead_lettered[8].store(t.access_denied, Ordering::Relaxed);
        for (a, v) in self.tx_aborted.iter().zip(t.tx_aborted) {
            a.store(v, Ordering::Relaxed);
        }
        self.tx_committed.store(t.tx_committed, Ordering::Relaxed);
        let ended = t.tx_committed + t.tx_aborted.iter().sum::<u64>();
        self.tx_begun.store(ended, Ordering::Relaxed);
    }

    /// Transactions open now.
    pub(crate) fn tx_open(&self) -> u64 {
        let ended = self.tx_committed.load(Ordering::Relaxed)
            + self
                .tx_aborted
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .sum::<u64>();
        self.tx_begun.load(Ordering::Relaxed).saturating_sub(ended)
    }
}

/// Whom a scrape is for. With a users file the per-queue and per-outgoing-queue series are
/// those the caller may see in the API: queues it holds any right on ([`Auth::sees`]), outgoing
/// queues with the broker-wide right `outgoing`. The broker-wide series are everyone's.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub auth: Arc<Auth>,
    pub who: Identity,
}

impl Viewer {
    fn sees(&self, q: &crate::queue::Queue) -> bool {
        self.auth.sees(&self.who, q)
    }

    fn sees_outgoing(&self) -> bool {
        self.auth.lists_outgoing(&self.who)
    }
}

/// The collector behind `GET /metrics`: everything is read at scrape time. Without a viewer
/// (the users are not loaded yet) no queue or destination is named.
#[derive(Debug)]
pub(crate) struct Collector {
    pub ready: Arc<Readiness>,
    pub viewer: Option<Viewer>,
}

type Enc<'a> = DescriptorEncoder<'a>;
type Labels<'a> = [(&'static str, &'a str)];

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut Enc,
    name: &str,
    help: &str,
    v: V,
) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

fn counter(e: &mut Enc, name: &str, help: &str, v: u64) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, u64, f64>(&v, None)
}

/// A family: one sample per label set, counters (`_total`) or gauges.
fn family<'l, V>(
    e: &mut Enc,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (&'l Labels<'l>, V)>,
) -> std::fmt::Result
where
    V: prometheus_client::encoding::EncodeGaugeValue
        + prometheus_client::encoding::EncodeCounterValue,
{
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        let mut f = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => f.encode_counter::<NoLabelSet, V, f64>(&v, None)?,
            _ => f.encode_gauge(&v)?,
        }
    }
    Ok(())
}

fn histogram(
    e: &mut Enc,
    name: &str,
    help: &str,
    unit: Option<&prometheus_client::registry::Unit>,
    h: &crate::histogram::HistogramSnapshot,
) -> std::fmt::Result {
    e.encode_descriptor(name, help, unit, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let r = &self.ready;
        gauge(
            &mut e,
            "mq_ready",
            "1 once recovery finished, while the journal is healthy and the broker is not shutting down",
            u64::from(r.check().is_ok()),
        )?;
        gauge(
            &mut e,
            "mq_uptime_seconds",
            "Seconds since mqd started",
            r.uptime().as_secs_f64(),
        )?;
        let Some(b) = r.broker() else {
            return Ok(());
        };
        let c = b.counters();
        let sees = |q: &crate::queue::Queue| self.viewer.as_ref().is_some_and(|v| v.sees(q));

        // Queues (applications' and the dead-letter queues).
        let mut queues: Vec<_> = b
            .all_queues()
            .into_iter()
            .filter(|q| {
                matches!(
                    q.def().role,
                    QueueRole::Normal | QueueRole::DeadLetter | QueueRole::DeadXact
                ) && sees(q)
            })
            .map(|q| {
                let (s, t) = q.stats_and_totals();
                (escape(&q.def().name), s, t)
            })
            .collect();
        queues.sort_by(|a, b| a.0.cmp(&b.0));
        let labels: Vec<[(&'static str, &str); 1]> =
            queues.iter().map(|q| [("queue", q.0.as_str())]).collect();
        let per_queue =
            |e: &mut Enc,
             name: &str,
             help: &str,
             kind: MetricType,
             f: &dyn Fn(&crate::queue::QueueStats, &crate::queue::QueueTotals) -> u64| {
                family(
                    e,
                    name,
                    help,
                    kind,
                    labels
                        .iter()
                        .zip(&queues)
                        .map(|(l, q)| (&l[..], f(&q.1, &q.2))),
                )
            };
        per_queue(
            &mut e,
            "mq_queue_messages",
            "Messages stored in the queue, including delivered and not yet acknowledged",
            MetricType::Gauge,
            &|s, _| s.messages,
        )?;
        per_queue(
            &mut e,
            "mq_queue_bytes",
            "Body bytes of the messages stored in the queue",
            MetricType::Gauge,
            &|s, _| s.bytes,
        )?;
        per_queue(
            &mut e,
            "mq_queue_in_flight_messages",
            "Messages delivered to a receiver and not yet acknowledged",
            MetricType::Gauge,
            &|s, _| s.in_flight,
        )?;
        per_queue(
            &mut e,
            "mq_queue_sent",
            "Messages put into the queue (sent, forwarded in, dead-lettered into it) (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|_, t| t.sent,
        )?;
        per_queue(
            &mut e,
            "mq_queue_received",
            "Messages received (removed for good) from the queue (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|_, t| t.received(),
        )?;
        per_queue(
            &mut e,
            "mq_queue_purged",
            "Messages removed by purges (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|_, t| t.purged,
        )?;
        per_queue(
            &mut e,
            "mq_queue_dead_lettered",
            "Messages moved from the queue to a dead-letter queue (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|_, t| t.dead_lettered,
        )?;
        per_queue(
            &mut e,
            "mq_queue_receive_aborts",
            "Transactional receives from the queue undone by an abort (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|_, t| t.receive_aborts,
        )?;
        let classes: Vec<[(&'static str, &str); 1]> = (0..DEAD_LETTER_CLASSES as i32)
            .map(|i| {
                let class = mq_proto::v1::DeadLetterClass::try_from(i)
                    .unwrap_or(mq_proto::v1::DeadLetterClass::Unspecified);
                [("class", crate::deadletter::class_name(class))]
            })
            .collect();
        family(
            &mut e,
            "mq_dead_lettered",
            "Messages moved to a dead-letter queue, by class (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            classes
                .iter()
                .zip(&c.dead_lettered)
                .map(|(l, v)| (&l[..], v.load(Ordering::Relaxed))),
        )?;
        let (posted, dropped) = b.acks.counts();
        counter(
            &mut e,
            "mq_acks_posted",
            "Acknowledgements posted to admin queues (or their outgoing queues) since mqd started",
            posted,
        )?;
        counter(
            &mut e,
            "mq_acks_dropped",
            "Acknowledgements dropped since mqd started: no such local admin queue, a transactional one, over quota",
            dropped,
        )?;
        let not_kept: Vec<_> = b
            .journal_not_kept(sees)
            .into_iter()
            .map(|(q, n)| (escape(&q), n))
            .collect();
        let labels: Vec<[(&'static str, &str); 1]> =
            not_kept.iter().map(|q| [("queue", q.0.as_str())]).collect();
        family(
            &mut e,
            "mq_journal_copies_not_kept",
            "Journal copies not kept since mqd started (journal quota, broker quota or disk full): of messages received from the queue, or for SYSTEM$;JOURNAL of messages sent with the journal flag",
            MetricType::Counter,
            labels.iter().zip(&not_kept).map(|(l, q)| (&l[..], q.1)),
        )?;

        // Outgoing queues.
        let now = now_ms();
        let mut outgoing: Vec<_> = if self.viewer.as_ref().is_some_and(Viewer::sees_outgoing) {
            b.outgoing
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        outgoing.sort_by(|a, b| a.destination().cmp(b.destination()));
        let infos: Vec<_> = outgoing.iter().map(|o| (o.info(), o.metrics())).collect();
        let states: Vec<String> = infos
            .iter()
            .map(|(i, _)| {
                mq_proto::v1::OutgoingState::try_from(i.state)
                    .map(|s| {
                        s.as_str_name()
                            .trim_start_matches("OUTGOING_STATE_")
                            .to_string()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let dest: Vec<[(&'static str, &str); 1]> = infos
            .iter()
            .map(|(i, _)| [("destination", i.destination.as_str())])
            .collect();
        let dest_state: Vec<[(&'static str, &str); 2]> = infos
            .iter()
            .zip(&states)
            .map(|((i, _), s)| {
                [
                    ("destination", i.destination.as_str()),
                    ("state", s.as_str()),
                ]
            })
            .collect();
        family(
            &mut e,
            "mq_outgoing_state",
            "1 for the outgoing queue's current state (INACTIVE, CONNECTING, CONNECTED, WAITING, ONHOLD)",
            MetricType::Gauge,
            dest_state.iter().map(|l| (&l[..], 1u64)),
        )?;
        let per_dest =
            |e: &mut Enc, name: &str, help: &str, kind: MetricType, v: &dyn Fn(usize) -> u64| {
                family(
                    e,
                    name,
                    help,
                    kind,
                    dest.iter().enumerate().map(|(i, l)| (&l[..], v(i))),
                )
            };
        per_dest(
            &mut e,
            "mq_outgoing_messages",
            "Messages waiting in the outgoing queue or in flight to the destination",
            MetricType::Gauge,
            &|i| infos[i].0.messages,
        )?;
        per_dest(
            &mut e,
            "mq_outgoing_bytes",
            "Body bytes of the messages in the outgoing queue",
            MetricType::Gauge,
            &|i| infos[i].0.bytes,
        )?;
        per_dest(
            &mut e,
            "mq_outgoing_forwarded",
            "Messages acknowledged by the destination broker (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|i| infos[i].0.forwarded,
        )?;
        per_dest(
            &mut e,
            "mq_outgoing_dead_lettered",
            "Messages of the outgoing queue moved to a dead-letter queue (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            &|i| infos[i].0.dead_lettered,
        )?;
        per_dest(
            &mut e,
            "mq_outgoing_retries",
            "Failed attempts to reach the destination broker since mqd started",
            MetricType::Counter,
            &|i| infos[i].1 .0,
        )?;
        let with_error: Vec<_> = (0..infos.len()).filter(|i| infos[*i].1 .1 != 0).collect();
        family(
            &mut e,
            "mq_outgoing_last_error_age_seconds",
            "Seconds since the last failure to reach the destination (absent if none)",
            MetricType::Gauge,
            with_error.iter().map(|i| {
                (
                    &dest[*i][..],
                    now.saturating_sub(infos[*i].1 .1) as f64 / 1000.0,
                )
            }),
        )?;

        // The journal.
        let j = b.journal().stats();
        counter(
            &mut e,
            "mq_journal_fdatasync",
            "fdatasync calls since mqd started",
            j.syncs,
        )?;
        histogram(
            &mut e,
            "mq_journal_fdatasync_duration",
            "Duration of the journal's fdatasync calls for group commits",
            Some(&prometheus_client::registry::Unit::Seconds),
            &j.sync_seconds,
        )?;
        histogram(
            &mut e,
            "mq_journal_batch_records",
            "Records per group commit (one write and one fdatasync)",
            None,
            &j.batch_records,
        )?;
        counter(
            &mut e,
            "mq_journal_records",
            "Records written for submissions since mqd started",
            j.records_written,
        )?;
        counter(
            &mut e,
            "mq_journal_written_bytes",
            "Bytes written for submissions since mqd started",
            j.bytes_written,
        )?;
        gauge(
            &mut e,
            "mq_journal_segments",
            "Segment files in use",
            j.segments as u64,
        )?;
        gauge(
            &mut e,
            "mq_journal_disk_bytes",
            "Bytes allocated on disk by the segment files",
            j.disk_bytes,
        )?;
        gauge(
            &mut e,
            "mq_journal_live_bytes",
            "Bytes of live records in the segment files",
            j.live_bytes,
        )?;
        counter(
            &mut e,
            "mq_journal_segments_created",
            "Segments created since mqd started",
            j.segments_created,
        )?;
        counter(
            &mut e,
            "mq_journal_compactions",
            "Segments compacted away (deleted) since mqd started",
            j.segments_deleted,
        )?;
        counter(
            &mut e,
            "mq_journal_compacted_bytes",
            "Bytes of live records copied forward by compaction since mqd started",
            j.compacted_bytes,
        )?;
        counter(
            &mut e,
            "mq_journal_compaction_read_bytes",
            "Bytes compaction read from sealed segments since mqd started (whole-segment walks, and live records found through the index)",
            j.compaction_read_bytes,
        )?;
        counter(
            &mut e,
            "mq_journal_zeroed_bytes",
            "Bytes of zeros written (and synced) ahead of the records while the journal was idle, so that commits write into written space (since mqd started)",
            j.zeroed_bytes,
        )?;
        counter(
            &mut e,
            "mq_journal_idle_spins",
            "Times the journal's writer watched its queues before sleeping after a lone commit (mqd --journal-idle-spin; 0 when off), since mqd started",
            j.idle_spins,
        )?;
        counter(
            &mut e,
            "mq_journal_idle_spin_catches",
            "Of those, the times a submission arrived during the watch (taken without a wake-up), since mqd started",
            j.idle_spin_catches,
        )?;
        counter(
            &mut e,
            "mq_journal_inline_commits",
            "Transaction commits written and synced by the committing task because the journal's writer was idle (mqd --journal-inline-commits), since mqd started",
            j.inline_commits,
        )?;
        gauge(
            &mut e,
            "mq_journal_poisoned",
            "1 once an fdatasync (or write) failed: the journal refuses writes until restart",
            u64::from(j.poisoned),
        )?;
        gauge(
            &mut e,
            "mq_journal_disk_full",
            "1 while the disk is full: records that store data are refused",
            u64::from(j.disk_full),
        )?;
        gauge(
            &mut e,
            "mq_journal_queued_records",
            "Submissions waiting for the journal writer",
            j.queued_records,
        )?;
        counter(
            &mut e,
            "mq_journal_body_cache_hits",
            "Recoverable bodies delivered from memory (recently written) since mqd started",
            j.body_cache_hits,
        )?;
        counter(
            &mut e,
            "mq_journal_bodies_read",
            "Recoverable bodies read back from the journal files since mqd started",
            j.bodies_read,
        )?;
        counter(
            &mut e,
            "mq_journal_body_reads",
            "Read calls for those bodies (one per run of adjacent bodies) since mqd started",
            j.body_reads,
        )?;
        gauge(
            &mut e,
            "mq_journal_body_cache_bytes",
            "Bytes charged for the recently written bodies kept in memory (mqd --journal-body-cache-bytes)",
            j.body_cache_bytes,
        )?;

        gauge(
            &mut e,
            "mq_counters_saved_timestamp_seconds",
            "The totals kept across restarts are on disk as they were at this time (Unix seconds; 0: not yet): a kill -9 loses what was counted after it",
            c.saved_ms.load(Ordering::Relaxed) as f64 / 1000.0,
        )?;

        // Transactions.
        gauge(
            &mut e,
            "mq_transactions_open",
            "Transactions open now",
            c.tx_open(),
        )?;
        counter(
            &mut e,
            "mq_transactions_committed",
            "Transactions committed (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            c.tx_committed.load(Ordering::Relaxed),
        )?;
        let reasons: Vec<[(&'static str, &str); 1]> =
            ABORT_REASONS.iter().map(|r| [("reason", *r)]).collect();
        family(
            &mut e,
            "mq_transactions_aborted",
            "Transactions aborted, by reason (kept across restarts: see mq_counters_saved_timestamp_seconds)",
            MetricType::Counter,
            reasons
                .iter()
                .zip(&c.tx_aborted)
                .map(|(l, v)| (&l[..], v.load(Ordering::Relaxed))),
        )?;

        // Connections, calls, refusals.
        if let Some(conns) = r.connections() {
            gauge(
                &mut e,
                "mq_connections",
                "Open client connections on the gRPC port",
                conns.live() as u64,
            )?;
            let reasons: Vec<[(&'static str, &str); 1]> = crate::flow::CLOSED_REASONS
                .iter()
                .map(|r| [("reason", *r)])
                .collect();
            family(
                &mut e,
                "mq_connections_closed",
                "Client connections the gRPC port closed for a limit since mqd started, by reason: max_connections (refused: every open connection had made a request), per_address (refused: --max-connections-per-address), evicted (had made no request; closed to make room at --max-connections)",
                MetricType::Counter,
                reasons
                    .iter()
                    .zip(conns.closed_for_limits())
                    .map(|(l, v)| (&l[..], v)),
            )?;
        }
        gauge(
            &mut e,
            "mq_grpc_calls_open",
            "gRPC calls (HTTP/2 streams) open now: send, receive and transaction streams and unary calls",
            c.calls_open.load(Ordering::Relaxed).max(0),
        )?;
        gauge(
            &mut e,
            "mq_partial_request_bytes",
            "Bytes of gRPC request messages received in part (not yet whole), all connections (mqd --max-partial-bytes)",
            c.partial_request_bytes.load(Ordering::Relaxed),
        )?;
        counter(
            &mut e,
            "mq_grpc_calls",
            "gRPC calls since mqd started",
            c.calls.load(Ordering::Relaxed),
        )?;
        let codes: Vec<[(&'static str, &str); 1]> = CODES.iter().map(|c| [("code", *c)]).collect();
        family(
            &mut e,
            "mq_refused_requests",
            "gRPC calls that ended with an error status since mqd started, by code",
            MetricType::Counter,
            codes
                .iter()
                .zip(&c.refused)
                .skip(1)
                .map(|(l, v)| (&l[..], v.load(Ordering::Relaxed))),
        )?;
        gauge(
            &mut e,
            "mq_stored_bytes",
            "Bytes charged against the storage quota (--storage-quota-bytes)",
            b.stored_used(),
        )?;
        gauge(
            &mut e,
            "mq_storage_quota_bytes",
            "The storage quota (--storage-quota-bytes)",
            b.config().storage_quota_bytes,
        )?;
        Ok(())
    }
}

/// A label value as the text format wants it: backslash, double quote and newline escaped
/// (path names hold backslashes: `.\private$\orders`).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Renders every metric `viewer` may see in the OpenMetrics text format (what `GET /metrics`
/// serves).
pub(crate) fn render(ready: &Arc<Readiness>, viewer: Option<Viewer>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Collector {
        ready: ready.clone(),
        viewer,
    }));
    let mut out = String::with_capacity(16 * 1024);
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}

pin_project_lite::pin_project! {
    /// The response future of a counted call.
    #[derive(Debug)]
    pub(crate) struct CountedFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

pin_project_lite::pin_project! {
    /// A response body that notes the call's gRPC status (from its trailers) and its end.
    #[derive(Debug)]
    pub(crate) struct CountedBody<B> {
        #[pin]
        inner: B,
        call: Call,
    }
}

/// One open call; counted as ended (with its status, if seen) when dropped.
#[derive(Debug)]
pub(crate) struct Call {
    counters: Arc<Counters>,
    code: Option<usize>,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.counters.call_ended(self.code);
    }
}

fn grpc_status(h: &http::HeaderMap) -> Option<usize> {
    h.get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A tower layer in front of every gRPC service: counts calls, open calls, and calls that
/// ended with an error status by code. Per call, not per message: an atomic or two.
#[derive(Debug, Clone)]
pub(crate) struct CountCalls(pub Arc<Counters>);

impl<S> tower::Layer<S> for CountCalls {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counters: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<CountedBody<RB>>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.counters.calls_open.fetch_add(1, Ordering::Relaxed);
        CountedFuture {
            inner: self.inner.call(req),
            call: Some(Call {
                counters: self.counters.clone(),
                code: None,
            }),
        }
    }
}

impl<F, RB, E> std::future::Future for CountedFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<CountedBody<RB>>, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let r = std::task::ready!(this.inner.poll(cx));
        let mut call = this.call.take().expect("polled after completion");
        Poll::Ready(r.map(|resp| {
            // A trailers-only response carries its status in the headers.
            call.code = grpc_status(resp.headers());
            resp.map(|inner| CountedBody { inner, call })
        }))
    }
}

impl<B: http_body::Body> http_body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let r = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(Ok(f)) = &r {
            if let Some(t) = f.trailers_ref() {
                if let Some(code) = grpc_status(t) {
                    this.call.code = Some(code);
                }
            }
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
