//! The checker: given a run's history and what every queue held at the end, proves (or refutes)
//! the broker's promises and counts every class of outcome.
//!
//! Messages are identified by `(family, tag)`: a family is a queue, or a group of queues one
//! message moves between inside transactions (`mqt-tx1` and `mqt-txout`, which the movers fill
//! from `mqt-tx1`). The classes, and what fails the run:
//!
//! | class | fails the run | meaning |
//! |---|---|---|
//! | `lost` | yes | an acknowledged recoverable send or committed transactional send is nowhere: not received, not consumed by a committed transaction, not in any queue at the end (purges excepted) |
//! | `tx_duplicates` | yes | a transactional message consumed by committed transactions or present at the end more than once in total |
//! | `stored_duplicates` | yes | the same message twice in one queue at the end |
//! | `order_violations` | yes | in a transactional queue, two acknowledged messages of one writer consumed or left in the wrong order |
//! | `phantoms` | yes | a message nobody sent (unknown tag, or a body the harness never writes) |
//! | `partial_transactions` | yes | a transaction (or multiple-element send) of which some messages are visible and others are not (checked where its outcome is unknown; an acknowledged one must be whole anyway) |
//! | `aborted_or_failed_visible` | yes | a message of an aborted or refused send, or the send half of an aborted move, is visible |
//! | `express_lost_without_kill` | yes | an acknowledged express message vanished although no broker holding it ended (its process exited) after it was sent |
//! | `duplicates_over_window` | yes | more non-transactional redeliveries than the at-least-once window allows |
//! | `express_vanished_across_kill` | no | express messages gone with a broker that stopped (by design) |
//! | `nontx_duplicates` | no | non-transactional messages delivered again after a broken stream (at-least-once) |

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Durability, Event, Outcome, Tag};

/// What the queues held at the end, in receive order: the tags, and bodies that carry none.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Drain {
    pub queues: BTreeMap<String, Vec<Tag>>,
    /// `(queue, the start of the body)` of messages whose body is not a harness body.
    pub garbage: Vec<(String, String)>,
}

/// How to read a history.
#[derive(Debug, Clone, Default)]
pub struct CheckConfig {
    /// Queue -> family, for queues that share messages with another (default: its own).
    pub families: BTreeMap<String, String>,
    /// Messages a receive stream may hold unacknowledged (its prefetch): each broken stream or
    /// broker fault may redeliver at most this many per receiver.
    pub redelivery_window: u64,
}

impl CheckConfig {
    fn family<'a>(&'a self, queue: &'a str) -> &'a str {
        self.families.get(queue).map_or(queue, String::as_str)
    }
}

/// One finding, for the failure file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub class: &'static str,
    pub queue: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<Tag>,
    pub detail: String,
}

/// The counts of one check. `failures()` is zero when every promise held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub operations: u64,
    pub faults: BTreeMap<String, u64>,
    pub messages_checked: u64,
    pub sends_by_durability: BTreeMap<String, u64>,
    pub sends_ok: u64,
    pub sends_failed: u64,
    pub sends_unknown: u64,
    pub sends_aborted_on_purpose: u64,
    pub unknown_sends_present: u64,
    pub unknown_sends_absent: u64,
    pub deliveries: u64,
    pub tx_receives_committed: u64,
    pub tx_receives_aborted: u64,
    pub tx_receives_unknown: u64,
    pub purges: u64,
    pub purged_or_maybe_purged: u64,
    pub drained: u64,
    pub reconnects: u64,
    // Failure classes.
    pub lost: u64,
    pub tx_duplicates: u64,
    pub stored_duplicates: u64,
    pub order_violations: u64,
    pub phantoms: u64,
    pub aborted_or_failed_visible: u64,
    pub partial_transactions: u64,
    pub express_lost_without_kill: u64,
    pub duplicates_over_window: u64,
    // Allowed.
    pub express_vanished_across_kill: u64,
    pub nontx_duplicates: u64,
    pub nontx_duplicate_window: u64,
    #[serde(skip)]
    pub problems: Vec<Problem>,
}

impl Report {
    /// The number of findings in failure classes.
    pub fn failures(&self) -> u64 {
        self.lost
            + self.tx_duplicates
            + self.stored_duplicates
            + self.order_violations
            + self.phantoms
            + self.aborted_or_failed_visible
            + self.partial_transactions
            + self.express_lost_without_kill
            + self.duplicates_over_window
    }

    fn problem(&mut self, class: &'static str, queue: &str, tag: Option<Tag>, detail: String) {
        self.problems.push(Problem {
            class,
            queue: queue.to_string(),
            tag,
            detail,
        });
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let sends: Vec<String> = self
            .sends_by_durability
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            f,
            "operations {}  faults: {}",
            self.operations,
            if faults.is_empty() {
                "none".to_string()
            } else {
                faults.join(", ")
            }
        )?;
        writeln!(
            f,
            "messages checked {} ({}); sends ok {} failed {} unknown {} (present {}, absent {}) aborted on purpose {}",
            self.messages_checked,
            sends.join(", "),
            self.sends_ok,
            self.sends_failed,
            self.sends_unknown,
            self.unknown_sends_present,
            self.unknown_sends_absent,
            self.sends_aborted_on_purpose
        )?;
        writeln!(
            f,
            "deliveries {}  tx receives committed {} aborted {} unknown {}  purges {} (messages purged or maybe purged {})  left in queues {}  reconnects {}",
            self.deliveries,
            self.tx_receives_committed,
            self.tx_receives_aborted,
            self.tx_receives_unknown,
            self.purges,
            self.purged_or_maybe_purged,
            self.drained,
            self.reconnects
        )?;
        writeln!(
            f,
            "FAILURES: lost {}  tx_duplicates {}  stored_duplicates {}  order_violations {}  phantoms {}  aborted_or_failed_visible {}  partial_transactions {}  express_lost_without_kill {}  duplicates_over_window {}",
            self.lost,
            self.tx_duplicates,
            self.stored_duplicates,
            self.order_violations,
            self.phantoms,
            self.aborted_or_failed_visible,
            self.partial_transactions,
            self.express_lost_without_kill,
            self.duplicates_over_window
        )?;
        write!(
            f,
            "allowed: express_vanished_across_kill {}  nontx_duplicates {} (window {})",
            self.express_vanished_across_kill, self.nontx_duplicates, self.nontx_duplicate_window
        )
    }
}

type Key = (String, Tag);

#[derive(Debug)]
struct SendRec {
    durability: Durability,
    outcome: Outcome,
    aborted: bool,
    t: u64,
    broker: usize,
}

#[derive(Debug, Default)]
struct MoveRec {
    committed: u64,
    unknown: u64,
    aborted: u64,
}

/// Checks `events` against `drain`.
pub fn check(events: &[Event], drain: &Drain, config: &CheckConfig) -> Report {
    let mut r = Report::default();
    let fam = |q: &str| config.family(q).to_string();

    let mut sent: HashMap<Key, SendRec> = HashMap::new();
    let mut delivered: HashMap<Key, u64> = HashMap::new();
    let mut consumed_committed: HashMap<Key, u64> = HashMap::new();
    let mut consumed_unknown: HashMap<Key, u64> = HashMap::new();
    // Keyed by (target queue, tag).
    let mut moves: HashMap<(String, Tag), MoveRec> = HashMap::new();
    // Committed consumptions per queue, in history order (for the order check).
    let mut consumption_order: BTreeMap<String, Vec<Tag>> = BTreeMap::new();
    let mut purges: HashMap<String, Vec<u64>> = HashMap::new();
    // Messages received in a transaction whose outcome is unknown.
    let mut in_doubt: BTreeSet<Key> = BTreeSet::new();
    let mut stops: HashMap<usize, Vec<u64>> = HashMap::new();

    for e in events {
        match e {
            Event::Fault {
                t,
                t_end,
                broker,
                kind,
            } => {
                *r.faults.entry(kind.name().to_string()).or_default() += 1;
                // A stopped (SIGSTOP) broker loses nothing; only ends count for express, as of
                // when the process had exited: a broker told to stop (SIGTERM) may still accept
                // express messages while it finishes what is in flight, and they go with it.
                if kind.ends_process() {
                    stops
                        .entry(*broker)
                        .or_default()
                        .push(if *t_end > 0 { *t_end } else { *t });
                }
                continue;
            }
            Event::Reconnect { .. } => {
                r.reconnects += 1;
                continue;
            }
            _ => {}
        }
        r.operations += 1;
        match e {
            Event::Send {
                t,
                broker,
                durability,
                items,
                outcome,
                aborted,
                ..
            } => {
                match outcome {
                    Outcome::Ok => r.sends_ok += items.len() as u64,
                    Outcome::Failed => r.sends_failed += items.len() as u64,
                    Outcome::Unknown => r.sends_unknown += items.len() as u64,
                }
                if *aborted {
                    r.sends_aborted_on_purpose += items.len() as u64;
                }
                for i in items {
                    let name = match durability {
                        Durability::Express => "express",
                        Durability::Recoverable => "recoverable",
                        Durability::Transactional => "transactional",
                    };
                    *r.sends_by_durability.entry(name.to_string()).or_default() += 1;
                    sent.entry((fam(&i.queue), i.tag)).or_insert(SendRec {
                        durability: *durability,
                        outcome: *outcome,
                        aborted: *aborted,
                        t: *t,
                        broker: *broker,
                    });
                }
            }
            Event::Deliver { queue, tag, .. } => {
                r.deliveries += 1;
                *delivered.entry((fam(queue), *tag)).or_default() += 1;
            }
            Event::TxReceive {
                received,
                sent: tx_sent,
                aborted,
                outcome,
                ..
            } => {
                let committed = !aborted && *outcome == Outcome::Ok;
                match (aborted, outcome) {
                    (false, Outcome::Ok) => r.tx_receives_committed += 1,
                    (_, Outcome::Unknown) => r.tx_receives_unknown += 1,
                    _ => r.tx_receives_aborted += 1,
                }
                for i in received {
                    let key = (fam(&i.queue), i.tag);
                    let moved_to = tx_sent
                        .iter()
                        .find(|s| s.tag == i.tag && fam(&s.queue) == key.0);
                    if let Some(target) = moved_to {
                        let m = moves.entry((target.queue.clone(), i.tag)).or_default();
                        match (aborted, outcome) {
                            (false, Outcome::Ok) => m.committed += 1,
                            (false, Outcome::Unknown) => m.unknown += 1,
                            _ => m.aborted += 1,
                        }
                        if committed {
                            consumption_order
                                .entry(i.queue.clone())
                                .or_default()
                                .push(i.tag);
                        }
                        if *outcome == Outcome::Unknown {
                            in_doubt.insert(key);
                        }
                        continue;
                    }
                    if committed {
                        *consumed_committed.entry(key).or_default() += 1;
                        consumption_order
                            .entry(i.queue.clone())
                            .or_default()
                            .push(i.tag);
                    } else if *outcome == Outcome::Unknown {
                        if !aborted {
                            *consumed_unknown.entry(key.clone()).or_default() += 1;
                        }
                        in_doubt.insert(key);
                    }
                }
            }
            Event::Purge {
                t, queue, purged, ..
            } => {
                r.purges += 1;
                let _ = purged;
                purges.entry(fam(queue)).or_default().push(*t);
            }
            Event::Fault { .. } | Event::Reconnect { .. } => {}
        }
    }

    // What the queues hold at the end.
    let mut present: HashMap<Key, u64> = HashMap::new();
    for (queue, tags) in &drain.queues {
        let mut seen: HashMap<Tag, u64> = HashMap::new();
        for t in tags {
            r.drained += 1;
            *seen.entry(*t).or_default() += 1;
            *present.entry((fam(queue), *t)).or_default() += 1;
        }
        for (t, n) in seen {
            if n > 1 {
                r.stored_duplicates += n - 1;
                r.problem(
                    "stored_duplicates",
                    queue,
                    Some(t),
                    format!("held {n} times at the end"),
                );
            }
        }
        // The send half of an aborted move must not be visible.
        for t in tags {
            if let Some(m) = moves.get(&(queue.clone(), *t)) {
                if m.committed == 0 && m.unknown == 0 {
                    r.aborted_or_failed_visible += 1;
                    r.problem(
                        "aborted_or_failed_visible",
                        queue,
                        Some(*t),
                        format!(
                            "in {queue} although every one of its {} moves there was aborted",
                            m.aborted
                        ),
                    );
                }
            }
        }
    }
    for (queue, body) in &drain.garbage {
        r.phantoms += 1;
        r.problem(
            "phantoms",
            queue,
            None,
            format!("a body the harness never writes: {body:?}"),
        );
    }

    // Phantoms: seen anywhere but never sent.
    let mut phantom_keys: BTreeSet<Key> = BTreeSet::new();
    for k in present
        .keys()
        .chain(delivered.keys())
        .chain(consumed_committed.keys())
        .chain(consumed_unknown.keys())
    {
        if !sent.contains_key(k) {
            phantom_keys.insert(k.clone());
        }
    }
    for (q, t) in &phantom_keys {
        r.phantoms += 1;
        r.problem("phantoms", q, Some(*t), "seen but never sent".to_string());
    }

    // Every message sent.
    let mut nontx_dups = 0u64;
    let mut keys: Vec<&Key> = sent.keys().collect();
    keys.sort();
    for key in keys {
        let s = &sent[key];
        r.messages_checked += 1;
        let (q, tag) = (&key.0, key.1);
        let held = present.get(key).copied().unwrap_or(0);
        let deliv = delivered.get(key).copied().unwrap_or(0);
        let cc = consumed_committed.get(key).copied().unwrap_or(0);
        let cu = consumed_unknown.get(key).copied().unwrap_or(0);
        let seen = held + deliv + cc;
        let purged_after = purges.get(q).is_some_and(|p| p.iter().any(|&tp| tp >= s.t));
        if s.outcome == Outcome::Unknown {
            if seen + cu > 0 {
                r.unknown_sends_present += 1;
            } else {
                r.unknown_sends_absent += 1;
            }
        }
        let must_not_exist = s.aborted || s.outcome == Outcome::Failed;
        if must_not_exist {
            if seen > 0 {
                r.aborted_or_failed_visible += 1;
                r.problem(
                    "aborted_or_failed_visible",
                    q,
                    Some(tag),
                    format!(
                        "send {} but seen {seen} times (held {held}, delivered {deliv}, consumed {cc})",
                        if s.aborted { "aborted" } else { "refused" }
                    ),
                );
            }
            continue;
        }
        match s.durability {
            Durability::Transactional => {
                if held + cc > 1 {
                    r.tx_duplicates += held + cc - 1;
                    r.problem(
                        "tx_duplicates",
                        q,
                        Some(tag),
                        format!("held {held} times at the end and consumed by {cc} committed transactions"),
                    );
                }
                if deliv > 0 {
                    r.tx_duplicates += deliv;
                    r.problem(
                        "tx_duplicates",
                        q,
                        Some(tag),
                        format!("a transactional message handed out {deliv} times outside a transaction"),
                    );
                }
                if s.outcome == Outcome::Ok && seen + cu == 0 && !purged_after {
                    r.lost += 1;
                    r.problem(
                        "lost",
                        q,
                        Some(tag),
                        "committed transactional send: not consumed by a committed transaction, not in any queue".to_string(),
                    );
                }
            }
            Durability::Recoverable | Durability::Express => {
                if seen > 1 {
                    nontx_dups += seen - 1;
                }
                if s.outcome != Outcome::Ok || seen > 0 {
                    if purged_after && seen == 0 {
                        r.purged_or_maybe_purged += 1;
                    }
                    continue;
                }
                if purged_after {
                    r.purged_or_maybe_purged += 1;
                } else if s.durability == Durability::Recoverable {
                    r.lost += 1;
                    r.problem(
                        "lost",
                        q,
                        Some(tag),
                        "acknowledged recoverable send: never delivered, not in its queue"
                            .to_string(),
                    );
                } else if stops
                    .get(&s.broker)
                    .is_some_and(|st| st.iter().any(|&ts| ts >= s.t))
                {
                    r.express_vanished_across_kill += 1;
                } else {
                    r.express_lost_without_kill += 1;
                    r.problem(
                        "express_lost_without_kill",
                        q,
                        Some(tag),
                        format!(
                            "acknowledged express send to broker {}: gone, and that broker never stopped after it was sent",
                            s.broker
                        ),
                    );
                }
            }
        }
    }

    // Atomicity: every message of one transactional send operation, or none. (For an
    // acknowledged one, `lost` already requires all; this covers the unknown ones.)
    for e in events {
        let Event::Send {
            items,
            durability: Durability::Transactional,
            outcome: Outcome::Unknown,
            aborted: false,
            ..
        } = e
        else {
            continue;
        };
        if items.len() < 2 {
            continue;
        }
        let visible: Vec<bool> = items
            .iter()
            .map(|i| {
                let k = (fam(&i.queue), i.tag);
                [&present, &delivered, &consumed_committed, &consumed_unknown]
                    .iter()
                    .any(|m| m.get(&k).is_some_and(|n| *n > 0))
            })
            .collect();
        if visible.iter().any(|v| *v) && !visible.iter().all(|v| *v) {
            r.partial_transactions += 1;
            let first = &items[0];
            r.problem(
                "partial_transactions",
                &first.queue,
                Some(first.tag),
                format!(
                    "a transaction of unknown outcome is partly visible: {}",
                    items
                        .iter()
                        .zip(&visible)
                        .map(|(i, v)| format!(
                            "{} {} {}",
                            i.queue,
                            i.tag,
                            if *v { "visible" } else { "absent" }
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }

    // The at-least-once window: each broken stream or broker fault may redeliver what one
    // stream held unacknowledged.
    let breaks = r.reconnects + r.faults.values().sum::<u64>();
    r.nontx_duplicates = nontx_dups;
    r.nontx_duplicate_window = breaks * config.redelivery_window;
    if nontx_dups > r.nontx_duplicate_window {
        r.duplicates_over_window = nontx_dups - r.nontx_duplicate_window;
        r.problem(
            "duplicates_over_window",
            "*",
            None,
            format!(
                "{nontx_dups} redeliveries of non-transactional messages; {breaks} broken streams or faults x window {} allow {}",
                config.redelivery_window, r.nontx_duplicate_window
            ),
        );
    }

    // Order in transactional queues, per writer, among acknowledged messages: what committed
    // transactions took from a queue, in history order, then what is left there, in receive
    // order (a message twice is a duplicate, counted above; for a queue movers fill: only what a committed move put there). A message that was
    // in a transaction with an unknown outcome is left out: the broker may still have been
    // holding it (a hung broker, a client that gave up) while the next one was handed out.
    let mut sequences: BTreeMap<String, Vec<Tag>> = consumption_order;
    for (queue, tags) in &drain.queues {
        let is_target = moves.keys().any(|(q, _)| q == queue);
        sequences.entry(queue.clone()).or_default().extend(
            tags.iter()
                .filter(|t| {
                    !is_target
                        || moves
                            .get(&(queue.clone(), **t))
                            .is_some_and(|m| m.committed > 0)
                })
                .copied(),
        );
    }
    for (queue, seq) in &sequences {
        let mut last: HashMap<u32, u64> = HashMap::new();
        for t in seq {
            let key = (fam(queue), *t);
            let Some(s) = sent.get(&key) else { continue };
            if s.durability != Durability::Transactional
                || s.outcome != Outcome::Ok
                || in_doubt.contains(&key)
            {
                continue;
            }
            if let Some(&prev) = last.get(&t.writer) {
                if t.seq < prev {
                    r.order_violations += 1;
                    r.problem(
                        "order_violations",
                        queue,
                        Some(*t),
                        format!(
                            "writer {} message {} came after its message {prev}",
                            t.writer, t.seq
                        ),
                    );
                }
            }
            last.insert(t.writer, t.seq);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{FaultKind, Item};

    fn tag(writer: u32, seq: u64) -> Tag {
        Tag { writer, seq }
    }

    fn send(t: u64, d: Durability, queue: &str, tags: &[Tag], outcome: Outcome) -> Event {
        Event::Send {
            t,
            t_end: t + 1,
            worker: "w".into(),
            broker: 0,
            durability: d,
            items: tags
                .iter()
                .map(|t| Item {
                    queue: queue.into(),
                    tag: *t,
                })
                .collect(),
            outcome,
            aborted: false,
            error: String::new(),
        }
    }

    fn tx_receive(queue: &str, t: Tag, moved_to: Option<&str>, aborted: bool, o: Outcome) -> Event {
        Event::TxReceive {
            t: 50,
            t_end: 51,
            worker: "m".into(),
            received: vec![Item {
                queue: queue.into(),
                tag: t,
            }],
            sent: moved_to
                .map(|q| Item {
                    queue: q.into(),
                    tag: t,
                })
                .into_iter()
                .collect(),
            aborted,
            outcome: o,
            error: String::new(),
        }
    }

    fn drain(queues: &[(&str, &[Tag])]) -> Drain {
        Drain {
            queues: queues
                .iter()
                .map(|(q, t)| (q.to_string(), t.to_vec()))
                .collect(),
            garbage: Vec::new(),
        }
    }

    fn config() -> CheckConfig {
        CheckConfig {
            families: [("txout".to_string(), "tx1".to_string())].into(),
            redelivery_window: 10,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let ev = vec![
            send(
                1,
                Durability::Recoverable,
                "r",
                &[tag(1, 1), tag(1, 2)],
                Outcome::Ok,
            ),
            send(
                2,
                Durability::Transactional,
                "tx1",
                &[tag(2, 1)],
                Outcome::Ok,
            ),
            send(
                3,
                Durability::Transactional,
                "tx1",
                &[tag(2, 2)],
                Outcome::Ok,
            ),
            send(
                4,
                Durability::Transactional,
                "tx1",
                &[tag(2, 3)],
                Outcome::Unknown,
            ),
            send(5, Durability::Express, "e", &[tag(3, 1)], Outcome::Ok),
            Event::Deliver {
                t: 6,
                worker: "c".into(),
                queue: "r".into(),
                tag: tag(1, 1),
            },
            tx_receive("tx1", tag(2, 1), Some("txout"), true, Outcome::Ok),
            tx_receive("tx1", tag(2, 1), Some("txout"), false, Outcome::Ok),
        ];
        let d = drain(&[
            ("r", &[tag(1, 2)]),
            ("tx1", &[tag(2, 2)]),
            ("txout", &[tag(2, 1)]),
            ("e", &[tag(3, 1)]),
        ]);
        let r = check(&ev, &d, &config());
        assert_eq!(r.failures(), 0, "{r}\n{:#?}", r.problems);
        assert_eq!(r.messages_checked, 6);
        assert_eq!(r.unknown_sends_absent, 1);
    }

    #[test]
    fn a_lost_message_a_transactional_duplicate_and_a_phantom_are_each_reported() {
        let ev = vec![
            send(
                1,
                Durability::Recoverable,
                "r",
                &[tag(1, 1), tag(1, 2)],
                Outcome::Ok,
            ),
            send(
                2,
                Durability::Transactional,
                "tx2",
                &[tag(2, 1)],
                Outcome::Ok,
            ),
            tx_receive("tx2", tag(2, 1), None, false, Outcome::Ok),
        ];
        // 1/2 is lost; 2/1 was consumed by a committed transaction and is still in tx2; 9/9
        // was never sent.
        let d = drain(&[("r", &[tag(1, 1), tag(9, 9)]), ("tx2", &[tag(2, 1)])]);
        let r = check(&ev, &d, &config());
        assert_eq!(r.lost, 1, "{r}");
        assert_eq!(r.tx_duplicates, 1, "{r}");
        assert_eq!(r.phantoms, 1, "{r}");
        assert_eq!(r.failures(), 3, "{r}");
        let classes: BTreeSet<&str> = r.problems.iter().map(|p| p.class).collect();
        assert_eq!(
            classes,
            ["lost", "phantoms", "tx_duplicates"].into_iter().collect()
        );
        let lost = r.problems.iter().find(|p| p.class == "lost").unwrap();
        assert_eq!((lost.queue.as_str(), lost.tag), ("r", Some(tag(1, 2))));
    }

    #[test]
    fn an_aborted_transactions_effect_is_reported() {
        let mut aborted = send(
            1,
            Durability::Transactional,
            "tx2",
            &[tag(5, 1)],
            Outcome::Ok,
        );
        if let Event::Send { aborted: a, .. } = &mut aborted {
            *a = true;
        }
        let ev = vec![
            aborted,
            send(
                2,
                Durability::Transactional,
                "tx1",
                &[tag(6, 1)],
                Outcome::Ok,
            ),
            // The move was aborted, yet the copy is in txout and the original in tx1.
            tx_receive("tx1", tag(6, 1), Some("txout"), true, Outcome::Ok),
        ];
        let d = drain(&[
            ("tx2", &[tag(5, 1)]),
            ("tx1", &[tag(6, 1)]),
            ("txout", &[tag(6, 1)]),
        ]);
        let r = check(&ev, &d, &config());
        assert_eq!(r.aborted_or_failed_visible, 2, "{r}\n{:#?}", r.problems);
        assert_eq!(r.tx_duplicates, 1, "{r}");
    }

    #[test]
    fn a_transaction_of_unknown_outcome_must_be_whole_or_absent() {
        let ev = vec![send(
            1,
            Durability::Transactional,
            "tx2",
            &[tag(5, 1), tag(5, 2)],
            Outcome::Unknown,
        )];
        let none = check(&ev, &Drain::default(), &config());
        assert_eq!(none.failures(), 0, "{none}");
        let whole = check(&ev, &drain(&[("tx2", &[tag(5, 1), tag(5, 2)])]), &config());
        assert_eq!(whole.failures(), 0, "{whole}");
        let half = check(&ev, &drain(&[("tx2", &[tag(5, 2)])]), &config());
        assert_eq!(half.partial_transactions, 1, "{half}");
        assert_eq!(half.failures(), 1, "{half}");
    }

    #[test]
    fn order_and_stored_duplicates_are_reported() {
        let ev = vec![
            send(
                1,
                Durability::Transactional,
                "tx1",
                &[tag(1, 1)],
                Outcome::Ok,
            ),
            send(
                2,
                Durability::Transactional,
                "tx1",
                &[tag(1, 2)],
                Outcome::Ok,
            ),
            send(3, Durability::Recoverable, "r", &[tag(2, 1)], Outcome::Ok),
        ];
        let d = drain(&[
            ("tx1", &[tag(1, 2), tag(1, 1)]),
            ("r", &[tag(2, 1), tag(2, 1)]),
        ]);
        let r = check(&ev, &d, &config());
        assert_eq!(r.order_violations, 1, "{r}");
        assert_eq!(r.stored_duplicates, 1, "{r}");
    }

    #[test]
    fn express_may_vanish_only_across_a_stop_of_its_broker() {
        let ev = vec![
            send(10, Durability::Express, "e", &[tag(1, 1)], Outcome::Ok),
            Event::Fault {
                t: 20,
                t_end: 0,
                broker: 0,
                kind: FaultKind::Stop,
            },
        ];
        let r = check(&ev, &Drain::default(), &config());
        assert_eq!(
            r.express_lost_without_kill, 1,
            "a SIGSTOP loses nothing: {r}"
        );
        let mut ev2 = ev.clone();
        ev2.push(Event::Fault {
            t: 30,
            t_end: 0,
            broker: 0,
            kind: FaultKind::Kill9,
        });
        let r = check(&ev2, &Drain::default(), &config());
        assert_eq!(r.failures(), 0, "{r}");
        assert_eq!(r.express_vanished_across_kill, 1);
        // A kill before the send does not excuse it.
        let mut ev3 = vec![Event::Fault {
            t: 1,
            t_end: 2,
            broker: 0,
            kind: FaultKind::Kill9,
        }];
        ev3.extend(ev.clone());
        assert_eq!(
            check(&ev3, &Drain::default(), &config()).express_lost_without_kill,
            1
        );
        // A SIGTERM before the send whose process exited after it excuses it: the broker may
        // accept express messages while it stops (mqtorture seed 15557315674434685848: sends at
        // 5584 ms, SIGTERM at 5578).
        let mut ev4 = vec![Event::Fault {
            t: 5,
            t_end: 12,
            broker: 0,
            kind: FaultKind::Term,
        }];
        ev4.extend(ev);
        let r = check(&ev4, &Drain::default(), &config());
        assert_eq!(r.failures(), 0, "{r}");
        assert_eq!(r.express_vanished_across_kill, 1);
    }

    #[test]
    fn purges_excuse_only_messages_sent_before_them() {
        let ev = vec![
            send(1, Durability::Recoverable, "p", &[tag(1, 1)], Outcome::Ok),
            Event::Purge {
                t: 5,
                t_end: 6,
                worker: "p".into(),
                queue: "p".into(),
                outcome: Outcome::Ok,
                purged: 1,
            },
            send(7, Durability::Recoverable, "p", &[tag(1, 2)], Outcome::Ok),
        ];
        let r = check(&ev, &Drain::default(), &config());
        assert_eq!(r.lost, 1, "{r}");
        assert_eq!(r.purged_or_maybe_purged, 1);
        assert_eq!(r.problems[0].tag, Some(tag(1, 2)));
    }

    #[test]
    fn redeliveries_beyond_the_window_fail() {
        let mut ev = vec![send(
            1,
            Durability::Recoverable,
            "r",
            &[tag(1, 1)],
            Outcome::Ok,
        )];
        for _ in 0..3 {
            ev.push(Event::Deliver {
                t: 2,
                worker: "c".into(),
                queue: "r".into(),
                tag: tag(1, 1),
            });
        }
        let cfg = CheckConfig {
            redelivery_window: 1,
            ..config()
        };
        let r = check(&ev, &Drain::default(), &cfg);
        assert_eq!(r.duplicates_over_window, 2, "no break allows none: {r}");
        ev.push(Event::Reconnect {
            t: 3,
            worker: "c".into(),
        });
        ev.push(Event::Reconnect {
            t: 4,
            worker: "c".into(),
        });
        let r = check(&ev, &Drain::default(), &cfg);
        assert_eq!(r.failures(), 0, "{r}");
        assert_eq!(r.nontx_duplicates, 2);
    }
}
