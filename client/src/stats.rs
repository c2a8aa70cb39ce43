//! Queue rates for `mq stats`: what changed between two snapshots of the queue list.

use std::time::Duration;

use crate::QueueInfo;

/// One queue in one interval of `mq stats`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueueRate {
    pub name: String,
    /// Stored and not yet removed, at the end of the interval.
    pub messages: u64,
    /// Body bytes of those messages.
    pub bytes: u64,
    /// Delivered, not yet acknowledged.
    pub in_flight: u64,
    /// Messages that entered the queue since the broker started.
    pub sent: u64,
    /// Messages received (acknowledged) from the queue since the broker started.
    pub received: u64,
    /// Messages that entered the queue during the interval (`None`: the queue is new, or the
    /// broker restarted, since the last snapshot).
    pub sent_in_interval: Option<u64>,
    /// Messages received during the interval.
    pub received_in_interval: Option<u64>,
    /// `sent_in_interval` per second.
    pub sent_per_sec: Option<f64>,
    /// `received_in_interval` per second.
    pub received_per_sec: Option<f64>,
}

/// The rates of every queue in `now`, against `before` taken `elapsed` earlier, sorted by name.
pub fn rates(before: &[QueueInfo], now: &[QueueInfo], elapsed: Duration) -> Vec<QueueRate> {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut out: Vec<QueueRate> = now
        .iter()
        .map(|q| {
            let prev = before.iter().find(|p| p.name == q.name);
            // Totals start again at a broker restart: no rate for that interval.
            let delta = |now: u64, then: Option<u64>| then.filter(|t| *t <= now).map(|t| now - t);
            let sent_in = delta(q.sent, prev.map(|p| p.sent));
            let received_in = delta(q.received, prev.map(|p| p.received));
            QueueRate {
                name: q.name.clone(),
                messages: q.messages,
                bytes: q.bytes,
                in_flight: q.in_flight,
                sent: q.sent,
                received: q.received,
                sent_in_interval: sent_in,
                received_in_interval: received_in,
                sent_per_sec: sent_in.map(|d| d as f64 / secs),
                received_per_sec: received_in.map(|d| d as f64 / secs),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The table `mq stats` prints for one interval: a header and one line per queue.
pub fn table(rows: &[QueueRate]) -> String {
    let width = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("QUEUE".len());
    let rate = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    let mut s = format!(
        "{:<width$}  {:>10}  {:>12}  {:>9}  {:>10}  {:>10}\n",
        "QUEUE", "MESSAGES", "BYTES", "IN-FLIGHT", "SENT/S", "RECEIVED/S"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<width$}  {:>10}  {:>12}  {:>9}  {:>10}  {:>10}\n",
            r.name,
            r.messages,
            r.bytes,
            r.in_flight,
            rate(r.sent_per_sec),
            rate(r.received_per_sec)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, messages: u64, sent: u64, received: u64) -> QueueInfo {
        QueueInfo {
            name: name.into(),
            format_name: format!("DIRECT=OS:{name}"),
            transactional: false,
            messages,
            bytes: messages * 10,
            in_flight: 0,
            quota_bytes: None,
            label: String::new(),
            created_ms: 0,
            sent,
            received,
            max_aborts: 0,
            poisoned: 0,
            journal: false,
            journal_quota_bytes: 0,
            journal_not_kept: 0,
            dead_lettered: 0,
            receive_aborts: 0,
            purged: 0,
        }
    }

    #[test]
    fn rates_are_the_differences_over_the_interval() {
        let before = [q("a", 5, 10, 5), q("b", 0, 100, 100)];
        let now = [q("b", 0, 90, 90), q("a", 25, 40, 15), q("c", 1, 1, 0)];
        let r = rates(&before, &now, Duration::from_secs(2));
        assert_eq!(
            r.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(r[0].sent_in_interval, Some(30));
        assert_eq!(r[0].sent_per_sec, Some(15.0));
        assert_eq!(r[0].received_per_sec, Some(5.0));
        // A broker restart (totals went down) and a new queue: no rate, not a wrong one.
        assert_eq!(r[1].sent_per_sec, None);
        assert_eq!(r[2].received_in_interval, None);
        let t = table(&r);
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(
            t.lines().nth(1).unwrap().ends_with("15.0         5.0"),
            "{t}"
        );
    }
}
