//! The history: every operation the workload and the fault injector did, with its outcome.
//!
//! Message bodies carry a [`Tag`] (`mqt/<writer>/<seq>/` then padding) so the checker can tell
//! every message apart; each writer's sequence numbers only grow.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The identity of one message: the writer that made it and its sequence number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tag {
    pub writer: u32,
    pub seq: u64,
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.writer, self.seq)
    }
}

const BODY_PREFIX: &str = "mqt/";

impl Tag {
    /// The body of the message with this tag, padded with `pad` bytes.
    pub fn body(&self, pad: usize) -> bytes::Bytes {
        let mut s = format!("{BODY_PREFIX}{}/{}/", self.writer, self.seq);
        s.extend(std::iter::repeat_n('.', pad));
        bytes::Bytes::from(s)
    }

    /// The tag a body carries; `None` if it is not a body [`Tag::body`] made.
    pub fn parse(body: &[u8]) -> Option<Tag> {
        let s = std::str::from_utf8(body).ok()?;
        let rest = s.strip_prefix(BODY_PREFIX)?;
        let mut parts = rest.splitn(3, '/');
        let writer = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let pad = parts.next()?;
        if !pad.bytes().all(|b| b == b'.') {
            return None;
        }
        Some(Tag { writer, seq })
    }
}

/// How a message is kept by the broker, as the sender asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    Express,
    Recoverable,
    Transactional,
}

/// What the client saw of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The broker acknowledged it (a send stored, a transaction committed or aborted as asked).
    Ok,
    /// The broker refused it: it did not happen.
    Failed,
    /// No answer (the connection broke, the call timed out): it may or may not have happened.
    Unknown,
}

/// A fault the injector applied to a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL, then a restart at once.
    Kill9,
    /// SIGKILL, then a restart after a pause (a slow start: clients meet a dead port).
    Kill9SlowStart,
    /// SIGTERM (graceful stop), then a restart.
    Term,
    /// SIGSTOP, a pause, SIGCONT: a broker that hangs.
    Stop,
    /// The link between the brokers' namespaces cut, then healed after a pause.
    Partition,
    /// `tc netem` loss, delay, reordering and duplication on the link, until the next one.
    Netem,
}

impl FaultKind {
    /// The faults of a run without partitions.
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Kill9,
        FaultKind::Kill9SlowStart,
        FaultKind::Term,
        FaultKind::Stop,
    ];

    /// Whether the broker process ends (memory, so express messages, is lost).
    pub fn ends_process(self) -> bool {
        !matches!(
            self,
            FaultKind::Stop | FaultKind::Partition | FaultKind::Netem
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill9",
            FaultKind::Kill9SlowStart => "kill9_slow_start",
            FaultKind::Term => "sigterm",
            FaultKind::Stop => "sigstop",
            FaultKind::Partition => "partition",
            FaultKind::Netem => "netem",
        }
    }
}

/// One message of an operation: the queue it went to (or came from) and its tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub queue: String,
    pub tag: Tag,
}

/// One entry of the history. Times are milliseconds since the run started (`t` when the
/// operation was issued, `t_end` when its outcome was known).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// Messages sent as one operation: one message, one pipelined message, the copies of a
    /// multiple-element send, or the sends of one transaction (all or nothing). `aborted`: a
    /// transaction the writer aborted on purpose (its outcome is that of the abort).
    Send {
        t: u64,
        t_end: u64,
        worker: String,
        broker: usize,
        durability: Durability,
        items: Vec<Item>,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        aborted: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        error: String,
    },
    /// A message handed out by a non-transactional (streaming) receive.
    Deliver {
        t: u64,
        worker: String,
        queue: String,
        tag: Tag,
    },
    /// A transaction that received `received` and sent `sent`, then committed
    /// (`aborted: false`) or aborted on purpose; `outcome` is what the client saw of that.
    TxReceive {
        t: u64,
        t_end: u64,
        worker: String,
        received: Vec<Item>,
        sent: Vec<Item>,
        aborted: bool,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        error: String,
    },
    /// A purge of `queue`.
    Purge {
        t: u64,
        t_end: u64,
        worker: String,
        queue: String,
        outcome: Outcome,
        purged: u64,
    },
    /// A receive stream or connection of a worker broke and it reconnected.
    Reconnect { t: u64, worker: String },
    /// A fault applied to broker `broker` (0 = A, 1 = B) at `t` (before the signal was sent).
    Fault {
        t: u64,
        /// For a fault that ends the process (kill -9, SIGTERM): when it was seen to have
        /// exited (0 in histories written before it was recorded: then `t`). A graceful stop
        /// takes a while, and what the broker accepted meanwhile is as gone as what it held.
        #[serde(default, skip_serializing_if = "is_zero")]
        t_end: u64,
        broker: usize,
        kind: FaultKind,
    },
}

impl Event {
    /// The tags this event mentions.
    pub fn tags(&self) -> Vec<Tag> {
        match self {
            Event::Send { items, .. } => items.iter().map(|i| i.tag).collect(),
            Event::Deliver { tag, .. } => vec![*tag],
            Event::TxReceive { received, sent, .. } => {
                received.iter().chain(sent).map(|i| i.tag).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The shared, append-only history of one run.
#[derive(Debug, Clone)]
pub struct History {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            events: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Milliseconds since the run started.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// A copy of every event so far, in the order they were recorded.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_carries_its_tag() {
        let t = Tag {
            writer: 7,
            seq: 123_456,
        };
        assert_eq!(Tag::parse(&t.body(0)), Some(t));
        assert_eq!(Tag::parse(&t.body(100)), Some(t));
        assert_eq!(Tag::parse(b"mqt/7/x/"), None);
        assert_eq!(Tag::parse(b"hello"), None);
        assert_eq!(Tag::parse(b"mqt/7/1/garbage"), None);
    }

    #[test]
    fn events_round_trip_as_json_lines() {
        let e = Event::Send {
            t: 1,
            t_end: 2,
            worker: "w".into(),
            broker: 0,
            durability: Durability::Transactional,
            items: vec![Item {
                queue: "q".into(),
                tag: Tag { writer: 1, seq: 2 },
            }],
            outcome: Outcome::Unknown,
            aborted: false,
            error: String::new(),
        };
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.starts_with(r#"{"ev":"send""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
    }
}
