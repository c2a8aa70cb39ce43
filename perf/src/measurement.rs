//! What a benchmark measured: per (payload, formatter) a [`ComboResult`], holding per operation
//! ([`Op`]) an [`OpResult`] with one [`RunSample`] per run and the merged latencies.

use std::time::Duration;

use crate::stats::{Latency, Spread};
use crate::steal::{CpuTimes, Steal};

/// A timed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Fire-and-forget sends through one pipelining sender, until the last acknowledgement.
    Send,
    /// Receive-only: one consumer with prefetch drains the queue, decoding and checking each
    /// body.
    Receive,
    /// Sender and receiver at once (SENDANDRECEIVE), or the CLIENT's send-to-reply time.
    E2e,
    /// `--backlog`: filling the queues (as Send).
    Fill,
    /// `--backlog`: draining the filled queues (as Receive).
    Drain,
}

impl Op {
    /// `"send"`, `"receive"`, `"e2e"`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Receive => "receive",
            Op::E2e => "e2e",
            Op::Fill => "fill",
            Op::Drain => "drain",
        }
    }

    /// What this operation's latency figures measure.
    pub fn latency_meaning(self) -> &'static str {
        match self {
            Op::Send | Op::Fill => "send_to_ack",
            Op::Receive | Op::Drain => "receive_and_decode",
            Op::E2e => "send_to_decode",
        }
    }
}

/// One run of one operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSample {
    /// Messages acknowledged (send) or received and decoded equal (receive, e2e).
    pub messages: u64,
    pub elapsed: Duration,
}

impl RunSample {
    /// Messages per second.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Every run of one operation for one (payload, formatter).
#[derive(Debug, Clone)]
pub struct OpResult {
    pub op: Op,
    pub runs: Vec<RunSample>,
    /// Per-message latencies of every run (see [`Op::latency_meaning`]).
    pub latency: Latency,
    /// The broker's resident memory (VmRSS) at the end of the last run of this op, if known.
    pub rss_bytes: Option<u64>,
    /// CPU time the hypervisor took from the machine while this op's runs were timed.
    pub steal: Steal,
    /// With several consumers: the fewest and the most messages one consumer received in a
    /// run (over all runs).
    pub per_consumer: Option<(u64, u64)>,
}

impl OpResult {
    /// No runs yet.
    pub fn new(op: Op) -> OpResult {
        OpResult {
            op,
            runs: Vec::new(),
            latency: Latency::new(),
            rss_bytes: None,
            steal: Steal::default(),
            per_consumer: None,
        }
    }

    /// Notes the broker's RSS at the end of a run (the last one is reported).
    pub fn set_rss(&mut self, rss_bytes: Option<u64>) {
        if rss_bytes.is_some() {
            self.rss_bytes = rss_bytes;
        }
    }

    /// Notes the machine's CPU times at the start and the end of a run (see [`Steal`]).
    pub fn add_steal(&mut self, before: Option<CpuTimes>, after: Option<CpuTimes>) {
        self.steal.add(before, after);
    }

    /// Notes how many messages each consumer of a run received.
    pub fn add_per_consumer(&mut self, counts: &[u64]) {
        let (Some(&lo), Some(&hi)) = (counts.iter().min(), counts.iter().max()) else {
            return;
        };
        self.per_consumer = Some(match self.per_consumer {
            Some((a, b)) => (a.min(lo), b.max(hi)),
            None => (lo, hi),
        });
    }

    /// Adds a run.
    pub fn add_run(&mut self, messages: u64, elapsed: Duration, latency: &Latency) {
        self.runs.push(RunSample { messages, elapsed });
        self.latency.merge(latency);
    }

    /// Messages per second: median, min and max over runs.
    pub fn rate(&self) -> Option<Spread> {
        let rates: Vec<f64> = self.runs.iter().map(RunSample::rate).collect();
        Spread::of(&rates)
    }

    /// Messages over all runs.
    pub fn messages(&self) -> u64 {
        self.runs.iter().map(|r| r.messages).sum()
    }
}

/// The result of one (payload, formatter).
#[derive(Debug, Clone)]
pub struct ComboResult {
    /// `"string:1000"`, `"order"`, ...
    pub payload: String,
    /// `"raw"`, `"manual"`, ...
    pub formatter: &'static str,
    /// Encoded body size; `None` if it could not be encoded.
    pub body_bytes: Option<usize>,
    pub outcome: Outcome,
}

/// Measured, or skipped with a reason.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The operations the scenario times, in order.
    Measured(Vec<OpResult>),
    /// Not run: the formatter cannot carry the payload, or the body is over the broker's limit.
    Skipped {
        reason: String,
        /// The operations that would have been timed (one skipped row each).
        ops: Vec<Op>,
    },
}

impl ComboResult {
    /// The operation's result, if measured.
    pub fn op(&self, op: Op) -> Option<&OpResult> {
        match &self.outcome {
            Outcome::Measured(v) => v.iter().find(|r| r.op == op),
            Outcome::Skipped { .. } => None,
        }
    }

    /// The reason it was skipped, if it was.
    pub fn skipped(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Skipped { reason, .. } => Some(reason),
            Outcome::Measured(_) => None,
        }
    }
}
