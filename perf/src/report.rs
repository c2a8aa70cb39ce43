//! What `mqperf` prints: the banner (configuration and machine, first), then per
//! (payload, formatter, op) a table line for people or a JSON line for machines ([`Row`]).
//!
//! Units: rates are messages/s and MB/s of body bytes (1 MB = 10^6 bytes); the median and the
//! min/max are over runs. Latencies are microseconds over every run's samples (HdrHistogram,
//! 3 significant digits); what they measure depends on the op (`latency` in JSON):
//! `send_to_ack`, `receive_and_decode`, `send_to_decode`.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Mode};
use crate::machine::Machine;
use crate::measurement::{ComboResult, Outcome};
use crate::payload::PayloadKind;
use crate::scenario::sample_every;
use crate::target::TargetInfo;

/// What every line shares: the configuration, the broker and the machine.
#[derive(Debug, Clone)]
pub struct ReportContext {
    pub config: Config,
    /// `"embedded"` or the broker's URL.
    pub broker: String,
    /// Extra words about the broker for the banner (address, data dir, quota).
    pub broker_detail: String,
    /// With `--forward`: the route, `A 127.0.0.1:x -> B 127.0.0.1:y`.
    pub forward: Option<String>,
    pub machine: Machine,
    /// The system under test and how the mode maps onto it.
    pub target: TargetInfo,
}

/// One (payload, formatter, op): a table line, a JSON line or a CSV record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The system under test: `mq`, `rabbitmq` or `nats`.
    pub target: String,
    pub op: String,
    pub mode: String,
    pub scenario: String,
    pub delivery: String,
    /// Concurrent sending clients.
    pub clients: u32,
    /// `--rate`: the open-loop send rate (messages/s); `null`: closed loop.
    pub rate: Option<u64>,
    /// Queues the messages were spread over.
    pub queues: u32,
    /// Receiving consumers.
    pub consumers: u32,
    /// `--backlog`: messages filled then drained per run.
    pub backlog: Option<u64>,
    /// Every received message acknowledged on its own (`--ack-each`).
    pub ack_each: bool,
    /// The queue journals every received message (`--journal`). Absent in reports written
    /// before the flag existed (read as false, so `mqperf compare` takes older reports).
    #[serde(default)]
    pub journal: bool,
    /// Sent through broker A to the queue on broker B (`--forward`).
    pub forwarded: bool,
    pub payload: String,
    pub formatter: String,
    pub body_bytes: Option<usize>,
    /// Messages per run.
    pub count: u64,
    pub runs: u32,
    pub msgs_per_s: Option<f64>,
    pub msgs_per_s_min: Option<f64>,
    pub msgs_per_s_max: Option<f64>,
    pub mb_per_s: Option<f64>,
    pub mb_per_s_min: Option<f64>,
    pub mb_per_s_max: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// What the latency measures: `send_to_ack`, `receive_and_decode`, `send_to_decode`
    /// (with `--rate` the send side counts from the intended send time).
    pub latency: String,
    /// The broker's resident memory at the end of this op's last run, MiB (`null`: unknown).
    pub rss_mib: Option<f64>,
    /// Share of the machine's CPU time the hypervisor took while this op's runs were timed,
    /// percent (`null`: unknown, e.g. not Linux). Above zero, the host's scheduling is in the
    /// figures (see `steal.rs`).
    pub steal_pct: Option<f64>,
    /// With several consumers: fewest and most messages one consumer received in a run.
    pub consumer_min: Option<u64>,
    pub consumer_max: Option<u64>,
    pub latency_samples: u64,
    /// Messages over all runs: acknowledged (send) or received and decoded equal (receive, e2e).
    pub messages: u64,
    pub skipped: bool,
    pub reason: Option<String>,
    pub broker: String,
    pub cores: usize,
    pub cpu: String,
    /// The target's server version, when known.
    pub target_version: Option<String>,
    /// The mode in the target's own terms (see `TargetInfo`).
    pub mapping: String,
    /// Whether an acknowledged send was fsync'd by the target.
    pub fsync_before_ack: bool,
}

fn round(x: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x * k).round() / k
}

/// The rows of one combination, one per op.
pub fn rows(ctx: &ReportContext, r: &ComboResult) -> Vec<Row> {
    let c = &ctx.config;
    let base = |op: crate::measurement::Op| Row {
        target: ctx.target.kind.to_string(),
        op: op.name().to_string(),
        mode: c.mode.name().to_string(),
        scenario: c.scenario.name().to_string(),
        delivery: c.delivery_name().to_string(),
        clients: c.clients,
        rate: c.rate,
        queues: c.queues,
        consumers: c.consumers(),
        backlog: c.backlog,
        ack_each: c.ack_each,
        journal: c.journal,
        forwarded: c.forward,
        payload: r.payload.clone(),
        formatter: r.formatter.to_string(),
        body_bytes: r.body_bytes,
        count: c.count,
        runs: c.runs,
        msgs_per_s: None,
        msgs_per_s_min: None,
        msgs_per_s_max: None,
        mb_per_s: None,
        mb_per_s_min: None,
        mb_per_s_max: None,
        p50_us: None,
        p99_us: None,
        p999_us: None,
        latency: op.latency_meaning().to_string(),
        rss_mib: None,
        steal_pct: None,
        consumer_min: None,
        consumer_max: None,
        latency_samples: 0,
        messages: 0,
        skipped: false,
        reason: None,
        broker: ctx.broker.clone(),
        cores: ctx.machine.cores,
        cpu: ctx.machine.cpu.clone(),
        target_version: ctx.target.version.clone(),
        mapping: ctx.target.mapping.clone(),
        fsync_before_ack: ctx.target.fsync_before_ack,
    };
    match &r.outcome {
        Outcome::Skipped { reason, ops } => ops
            .iter()
            .map(|&op| Row {
                skipped: true,
                reason: Some(reason.clone()),
                ..base(op)
            })
            .collect(),
        Outcome::Measured(results) => results
            .iter()
            .map(|o| {
                let mut row = base(o.op);
                if let Some(rate) = o.rate() {
                    let mb = rate.scaled(r.body_bytes.unwrap_or(0) as f64 / 1e6);
                    row.msgs_per_s = Some(round(rate.median, 1));
                    row.msgs_per_s_min = Some(round(rate.min, 1));
                    row.msgs_per_s_max = Some(round(rate.max, 1));
                    row.mb_per_s = Some(round(mb.median, 3));
                    row.mb_per_s_min = Some(round(mb.min, 3));
                    row.mb_per_s_max = Some(round(mb.max, 3));
                }
                row.p50_us = o.latency.quantile_us(0.5);
                row.p99_us = o.latency.quantile_us(0.99);
                row.p999_us = o.latency.quantile_us(0.999);
                row.latency_samples = o.latency.samples();
                row.rss_mib = o.rss_bytes.map(|b| round(b as f64 / (1 << 20) as f64, 1));
                row.steal_pct = o.steal.percent().map(|p| round(p, 1));
                if let Some((lo, hi)) = o.per_consumer.filter(|_| c.consumers() > 1) {
                    row.consumer_min = Some(lo);
                    row.consumer_max = Some(hi);
                }
                row.messages = o.messages();
                row
            })
            .collect(),
    }
}

/// The banner: what runs where, so a pasted result says how it was obtained.
pub fn write_banner(w: &mut dyn Write, ctx: &ReportContext) -> io::Result<()> {
    let c = &ctx.config;
    let names = |v: Vec<String>| v.join(", ");
    writeln!(
        w,
        "mqperf {} -- {} {} {}",
        env!("CARGO_PKG_VERSION"),
        c.mode.name(),
        c.scenario.name(),
        c.queue
    )?;
    let mut line = |k: &str, v: String| writeln!(w, "  {k:<11} {v}");
    if !c.command.is_empty() {
        line("command", c.command.clone())?;
    }
    line(
        "broker",
        format!("{} {}", ctx.broker, ctx.broker_detail)
            .trim_end()
            .to_string(),
    )?;
    line(
        "target",
        match &ctx.target.version {
            Some(v) => format!("{} {v}", ctx.target.kind),
            None => ctx.target.kind.to_string(),
        },
    )?;
    line("mapping", ctx.target.mapping.clone())?;
    line(
        "fsync",
        format!(
            "{} before the acknowledgement: {}",
            if ctx.target.fsync_before_ack {
                "yes"
            } else {
                "no"
            },
            ctx.target.fsync_note
        ),
    )?;
    line("mode", c.mode.name().to_string())?;
    line("scenario", c.scenario.name().to_string())?;
    line("queue", c.queue.clone())?;
    if let Some(route) = &ctx.forward {
        line("forwarded", route.clone())?;
    }
    if let Some(r) = &c.response_queue {
        line("response", r.clone())?;
    }
    line(
        "delivery",
        match c.mode {
            Mode::Tx => "transactional (every send and receive its own transaction)".to_string(),
            Mode::Notx => c.delivery.name().to_string(),
        },
    )?;
    if c.clients > 1 {
        line(
            "clients",
            format!("{} concurrent senders, one connection each", c.clients),
        )?;
    }
    if let Some(rate) = c.rate {
        line(
            "rate",
            format!("{rate} msgs/s open loop (latency from the intended send time: coordinated omission corrected)"),
        )?;
    }
    if c.queues > 1 || c.consumers() > 1 {
        line(
            "queues",
            format!(
                "{} ({}-0 ... {}-{}), {} consumers",
                c.queues,
                c.queue,
                c.queue,
                c.queues.saturating_sub(1),
                c.consumers()
            ),
        )?;
    }
    if let Some(b) = c.backlog {
        line(
            "backlog",
            format!("{b} messages filled, then drained, per run"),
        )?;
    }
    if c.ack_each {
        line("acks", "every message acknowledged on its own".to_string())?;
    }
    let one_by_one = [
        (
            c.one_at_a_time,
            "sends and receives: explicit transactions, one at a time",
        ),
        (
            c.send_one,
            "sends: one Queue::send (TX: send_tx) call each, awaited",
        ),
        (
            c.receive_one,
            "receives: one unary Queue::receive call each, awaited",
        ),
    ];
    for (_, what) in one_by_one.iter().filter(|(on, _)| *on) {
        line("calls", what.to_string())?;
    }
    if c.journal {
        line(
            "journal",
            "queues journal every received message (QUEUE;JOURNAL)".to_string(),
        )?;
    }
    line(
        "rss",
        match (c.broker_pid, &c.broker) {
            _ if ctx.target.kind != "mq" => "not measured for peers".to_string(),
            (Some(pid), _) => format!("VmRSS of pid {pid} at the end of each phase"),
            (None, None) => {
                "VmRSS of this process (embedded broker and mqperf) at the end of each phase"
                    .to_string()
            }
            (None, Some(_)) => "not known (give --broker-pid PID)".to_string(),
        },
    )?;
    line(
        "payloads",
        names(c.payloads.iter().map(PayloadKind::name).collect()),
    )?;
    line(
        "formatters",
        names(c.formatters.iter().map(|f| f.name().to_string()).collect()),
    )?;
    line("count", format!("{} messages per run", c.count))?;
    line(
        "runs",
        format!("{} (rate: median, min-max over runs)", c.runs),
    )?;
    line(
        "machine",
        format!(
            "{} cores, {}{}",
            ctx.machine.cores,
            ctx.machine.cpu,
            ctx.machine
                .idle
                .as_deref()
                .map(|i| format!("; {i}"))
                .unwrap_or_default()
        ),
    )?;
    line(
        "latency",
        format!(
            "send: send() to ack, {}; receive: next()+decode; e2e: sender's clock before encode to decoded",
            match sample_every(c.count) {
                1 => "every message".to_string(),
                k => format!("1 in {k} messages"),
            }
        ),
    )?;
    writeln!(w)
}

const HEADER: [&str; 10] = [
    "payload",
    "formatter",
    "op",
    "body B",
    "msgs/s",
    "min-max",
    "MB/s",
    "p50 us",
    "p99 us",
    "p99.9 us",
];

/// The table's header line.
pub fn write_table_header(w: &mut dyn Write) -> io::Result<()> {
    let h = HEADER;
    writeln!(
        w,
        "{:<16} {:<9} {:<7} {:>9} {:>11} {:>23} {:>10} {:>9} {:>9} {:>9}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]
    )
}

/// The table lines of one combination (a skipped one gets one line with its reason).
pub fn write_table_rows(w: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    if let Some(first) = rows.first().filter(|r| r.skipped) {
        let body = first.body_bytes.map_or("-".to_string(), |b| b.to_string());
        return writeln!(
            w,
            "{:<16} {:<9} {:<7} {:>9}  skipped: {}",
            first.payload,
            first.formatter,
            "-",
            body,
            first.reason.as_deref().unwrap_or("")
        );
    }
    for r in rows {
        let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or("-".to_string(), f);
        let spread = match (r.msgs_per_s_min, r.msgs_per_s_max) {
            (Some(a), Some(b)) => format!("{}-{}", group(a), group(b)),
            _ => "-".into(),
        };
        writeln!(
            w,
            "{:<16} {:<9} {:<7} {:>9} {:>11} {:>23} {:>10} {:>9} {:>9} {:>9}",
            r.payload,
            r.formatter,
            r.op,
            r.body_bytes.map_or("-".to_string(), |b| b.to_string()),
            opt(r.msgs_per_s, group),
            spread,
            opt(r.mb_per_s, |x| format!("{x:.2}")),
            opt(r.p50_us, micros),
            opt(r.p99_us, micros),
            opt(r.p999_us, micros),
        )?;
    }
    Ok(())
}

/// The `rss` line under a combination's rows: the broker's RSS at the end of each phase (last
/// run); the `host steal` line: the share of CPU time the hypervisor took during each phase
/// (where known); and with several consumers the fewest and most messages one consumer got.
pub fn write_table_summary(w: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    let measured: Vec<&Row> = rows.iter().filter(|r| !r.skipped).collect();
    if measured.is_empty() {
        return Ok(());
    }
    // "<prefix><op> <figure>" per phase, "-" where the figure is unknown.
    let per_op = |prefix: &str, figure: &dyn Fn(&Row) -> Option<String>| {
        measured
            .iter()
            .map(|r| {
                let f = figure(r).unwrap_or_else(|| "-".to_string());
                format!("{prefix}{} {f}", r.op)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rss = per_op("after ", &|r| r.rss_mib.map(|m| format!("{m:.1} MiB")));
    writeln!(w, "  rss: {rss}")?;
    if measured.iter().any(|r| r.steal_pct.is_some()) {
        let steal = per_op("", &|r| r.steal_pct.map(|p| format!("{p:.1}%")));
        writeln!(w, "  host steal (CPU time the hypervisor took): {steal}")?;
    }
    let per: Vec<String> = measured
        .iter()
        .filter_map(|r| Some(format!("{} {}-{}", r.op, r.consumer_min?, r.consumer_max?)))
        .collect();
    if !per.is_empty() {
        writeln!(w, "  messages per consumer (min-max): {}", per.join(", "))?;
    }
    Ok(())
}

/// Several targets: one line per (payload, formatter, op) with each target's median msgs/s
/// (and its min-max), in the order the rows came; `-` where a target has no figure.
pub fn write_side_by_side(w: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    let mut targets: Vec<&str> = Vec::new();
    let mut keys: Vec<(&str, &str, &str)> = Vec::new();
    for r in rows {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
        let k = (r.payload.as_str(), r.formatter.as_str(), r.op.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    writeln!(w, "side by side (msgs/s, median and min-max over runs):")?;
    write!(w, "{:<16} {:<9} {:<7}", "payload", "formatter", "op")?;
    for t in &targets {
        write!(w, " {t:>28}")?;
    }
    writeln!(w)?;
    for (payload, formatter, op) in keys {
        write!(w, "{payload:<16} {formatter:<9} {op:<7}")?;
        for t in &targets {
            let cell = rows
                .iter()
                .find(|r| {
                    r.target == *t && r.payload == payload && r.formatter == formatter && r.op == op
                })
                .and_then(|r| {
                    Some(format!(
                        "{} ({}-{})",
                        group(r.msgs_per_s?),
                        group(r.msgs_per_s_min?),
                        group(r.msgs_per_s_max?)
                    ))
                })
                .unwrap_or_else(|| "-".to_string());
            write!(w, " {cell:>28}")?;
        }
        writeln!(w)?;
    }
    Ok(())
}

/// One JSON object per row, one per line.
pub fn write_json_rows(w: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    for r in rows {
        serde_json::to_writer(&mut *w, r)?;
        writeln!(w)?;
    }
    Ok(())
}

/// A whole number with thin grouping: 1234567.8 -> "1,234,568".
fn group(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Microseconds: one decimal below 100, whole above.
fn micros(x: f64) -> String {
    if x < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mode, Scenario};
    use crate::measurement::{Op, OpResult};
    use crate::stats::Latency;
    use std::time::Duration;

    fn ctx() -> ReportContext {
        ReportContext {
            config: Config::new(Mode::Notx, Scenario::SendAndReceive, r".\private$\q"),
            broker: "embedded".into(),
            broker_detail: String::new(),
            forward: None,
            machine: Machine {
                cores: 2,
                cpu: "Test CPU".into(),
                idle: Some("cpuidle haltpoll, guest_halt_poll_ns 0".into()),
            },
            target: TargetInfo::mq(&Config::new(
                Mode::Notx,
                Scenario::SendAndReceive,
                r".\private$\q",
            )),
        }
    }

    #[test]
    fn number_formats() {
        assert_eq!(group(0.4), "0");
        assert_eq!(group(999.0), "999");
        assert_eq!(group(1000.0), "1,000");
        assert_eq!(group(1234567.8), "1,234,568");
        assert_eq!(micros(12.34), "12.3");
        assert_eq!(micros(1234.5), "1234");
    }

    #[test]
    fn rows_table_and_json() {
        let ctx = ctx();
        let mut send = OpResult::new(Op::Send);
        let mut l = Latency::new();
        l.record(Duration::from_micros(10));
        send.add_run(1000, Duration::from_millis(100), &l);
        send.add_run(1000, Duration::from_millis(50), &l);
        send.add_run(1000, Duration::from_millis(200), &l);
        let measured = ComboResult {
            payload: "string:1000".into(),
            formatter: "raw",
            body_bytes: Some(1000),
            outcome: Outcome::Measured(vec![send]),
        };
        let rows_m = rows(&ctx, &measured);
        assert_eq!(rows_m.len(), 1);
        let r = &rows_m[0];
        assert_eq!(r.msgs_per_s, Some(10_000.0));
        assert_eq!(r.msgs_per_s_min, Some(5_000.0));
        assert_eq!(r.msgs_per_s_max, Some(20_000.0));
        assert_eq!(r.mb_per_s, Some(10.0));
        assert_eq!(r.messages, 3000);
        assert_eq!(r.latency_samples, 3);

        let skipped = ComboResult {
            payload: "order".into(),
            formatter: "raw",
            body_bytes: None,
            outcome: Outcome::Skipped {
                reason: "no way".into(),
                ops: vec![Op::Send, Op::Receive, Op::E2e],
            },
        };
        let rows_s = rows(&ctx, &skipped);
        assert_eq!(rows_s.len(), 3);
        assert!(rows_s.iter().all(|r| r.skipped && r.msgs_per_s.is_none()));

        let mut table = Vec::new();
        write_table_header(&mut table).unwrap();
        write_table_rows(&mut table, &rows_m).unwrap();
        write_table_rows(&mut table, &rows_s).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("10,000"), "{table}");
        assert!(table.contains("5,000-20,000"), "{table}");
        assert!(table.contains("skipped: no way"), "{table}");
        assert_eq!(table.lines().count(), 3);

        let mut json = Vec::new();
        write_json_rows(&mut json, &rows_s).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(json)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["op"], "receive");
        assert_eq!(lines[1]["reason"], "no way");
        assert!(lines[1]["msgs_per_s"].is_null());

        let mut banner = Vec::new();
        write_banner(&mut banner, &ctx).unwrap();
        let banner = String::from_utf8(banner).unwrap();
        for word in [
            "embedded",
            "express",
            "NOTX",
            "SENDANDRECEIVE",
            "2 cores, Test CPU; cpuidle haltpoll, guest_halt_poll_ns 0",
        ] {
            assert!(banner.contains(word), "{word}: {banner}");
        }
    }
}
