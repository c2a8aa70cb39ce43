//! One torture run: start the brokers, run the workload, strike the scheduled faults, stop the
//! workload, restart cleanly, read every queue, check, and write the failure file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use mq_client::{Client, Error};

use crate::checker::{check, CheckConfig, Drain, Report};
use crate::cluster::Node;
use crate::faults::{PlannedFault, Schedule};
use crate::history::{Event, FaultKind, History, Tag};
use crate::partition::Net;
use crate::workload::{self, path, Ctx, QUEUES};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub cycles: u64,
    pub brokers: usize,
    pub seed: u64,
    pub duration_per_cycle: Duration,
    /// Longest wait for one client operation before its outcome counts as unknown.
    pub op_timeout: Duration,
    /// Where a failing run writes its files.
    pub out_dir: PathBuf,
    /// A deliberate fault in the broker's storage, to prove the checker catches it.
    pub sabotage: Option<Sabotage>,
    /// Print a line per fault.
    pub verbose: bool,
    /// Write the history files even when the run passes.
    pub keep_history: bool,
    /// Partitions: this process runs in namespace A of [`Net::names`]`(id)` and broker B in
    /// namespace B (made by the parent `mqtorture --partitions`).
    pub net: Option<u32>,
}

impl Options {
    pub fn new(seed: u64) -> Options {
        Options {
            cycles: 3,
            brokers: 1,
            seed,
            duration_per_cycle: Duration::from_secs(5),
            op_timeout: Duration::from_secs(10),
            out_dir: std::env::temp_dir(),
            sabotage: None,
            verbose: false,
            keep_history: false,
            net: None,
        }
    }
}

/// A deliberately broken broker, for the harness's own tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// Remove broker A's data directory (its journal) while it is stopped before the final
    /// restart: every acknowledged recoverable and committed message is lost.
    WipeJournal,
}

/// What a run found.
#[derive(Debug)]
pub struct RunResult {
    pub seed: u64,
    pub report: Report,
    pub faults: Vec<PlannedFault>,
    /// Process-level problems: a broker that exited on its own, ignored SIGTERM, would not
    /// restart, or an outgoing queue that never emptied.
    pub incidents: Vec<String>,
    /// The failure file, when the run failed.
    pub failure_file: Option<PathBuf>,
    pub history_file: Option<PathBuf>,
}

impl RunResult {
    pub fn passed(&self) -> bool {
        self.report.failures() == 0 && self.incidents.is_empty()
    }
}

type Nodes = Arc<Mutex<Vec<Node>>>;

/// Runs `f` on the nodes on a blocking thread (process starts wait for a line on stdout).
async fn with_nodes<T: Send + 'static>(
    nodes: &Nodes,
    f: impl FnOnce(&mut Vec<Node>) -> T + Send + 'static,
) -> T {
    let nodes = nodes.clone();
    tokio::task::spawn_blocking(move || f(&mut nodes.lock().unwrap_or_else(|p| p.into_inner())))
        .await
        .expect("a node operation panicked")
}

/// Runs the whole torture test. The brokers are stopped by PID when it returns or panics.
pub async fn run(opts: &Options) -> anyhow::Result<RunResult> {
    if !(1..=2).contains(&opts.brokers) {
        bail!("--brokers must be 1 or 2, not {}", opts.brokers);
    }
    let brokers = opts.brokers;
    let net = opts.net.map(Net::names).map(Arc::new);
    if net.is_some() && brokers != 2 {
        bail!("partitions need two brokers");
    }
    let nodes: Nodes = Arc::new(Mutex::new(Vec::new()));
    let net2 = net.clone();
    with_nodes(&nodes, move |n| -> anyhow::Result<()> {
        for i in 0..brokers {
            let mut node = match &net2 {
                Some(net) if i == 1 => Node::in_namespace(1, &net.ns_b, net.ip_b.parse()?),
                _ => Node::new(i),
            };
            node.start()?;
            n.push(node);
        }
        Ok(())
    })
    .await?;
    let (urls, addrs): (Vec<String>, Vec<String>) = with_nodes(&nodes, |n| {
        n.iter().map(|n| (n.url(), n.addr().to_string())).unzip()
    })
    .await;

    let history = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let ctx = Ctx {
        history: history.clone(),
        urls: urls.clone(),
        remote_addr: addrs.get(1).cloned(),
        stop: stop.clone(),
        op_timeout: opts.op_timeout,
        seed: opts.seed,
    };
    workload::create_queues(&ctx).await?;
    let tasks = workload::spawn_all(&ctx);

    // The faults.
    let mut incidents = Vec::new();
    let mut done = Vec::new();
    let netem_ok = match net.as_deref().map(Net::netem_unavailable) {
        Some(Some(why)) => {
            println!("netem faults skipped (no-ops) in this run: {why}");
            false
        }
        _ => true,
    };
    let schedule = Schedule::new(opts.seed, brokers, opts.duration_per_cycle, net.is_some());
    for f in schedule.take(opts.cycles as usize) {
        let cycle_start = tokio::time::Instant::now();
        if !opts.verbose && f.cycle % 50 == 0 {
            println!(
                "cycle {} of {}, {} s into the run",
                f.cycle,
                opts.cycles,
                history.now() / 1000
            );
        }
        tokio::time::sleep(f.at).await;
        if f.kind == FaultKind::Netem && !netem_ok {
            if opts.verbose {
                println!("cycle {}: netem skipped", f.cycle);
            }
            tokio::time::sleep_until(cycle_start + opts.duration_per_cycle).await;
            continue;
        }
        if opts.verbose {
            println!(
                "cycle {}: {} {} at {:?} (pause {:?}{})",
                f.cycle,
                f.kind.name(),
                match f.kind {
                    FaultKind::Partition | FaultKind::Netem => "link A-B".to_string(),
                    _ => format!("broker {}", f.broker),
                },
                f.at,
                f.pause,
                if f.kind == FaultKind::Netem {
                    format!(", netem {:?}", f.netem)
                } else {
                    String::new()
                }
            );
        }
        let t = history.now();
        let struck = strike(&nodes, net.as_deref(), f, &history).await;
        history.push(Event::Fault {
            t,
            t_end: struck.as_ref().ok().copied().flatten().unwrap_or(0),
            broker: f.broker,
            kind: f.kind,
        });
        if let Err(e) = struck {
            incidents.push(format!("cycle {}: {e:#}", f.cycle));
            break;
        }
        done.push(f);
        tokio::time::sleep_until(cycle_start + opts.duration_per_cycle).await;
    }

    // Heal the network, then stop the workload.
    if let Some(net) = &net {
        if let Err(e) = net.heal().and_then(|()| net.netem(0, 0, 0, 0, 0)) {
            incidents.push(format!("healing the link: {e:#}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout(opts.op_timeout * 3, t).await.is_err() {
            abort.abort();
            incidents.push("a worker did not stop in time".to_string());
        }
    }

    let result = finish(opts, &nodes, &urls, &addrs, &history).await;
    let (drain, mut more) = match result {
        Ok(x) => x,
        Err(e) => {
            incidents.push(format!("final drain: {e:#}"));
            (Drain::default(), Vec::new())
        }
    };
    incidents.append(&mut more);
    incidents.extend(
        with_nodes(&nodes, |n| {
            n.iter_mut()
                .flat_map(|n| n.incidents.drain(..))
                .collect::<Vec<_>>()
        })
        .await,
    );
    // Stop every broker by PID.
    with_nodes(&nodes, |n| {
        for node in n.iter_mut() {
            let _ = node.terminate();
        }
        n.clear();
    })
    .await;

    let events = history.events();
    let config = CheckConfig {
        families: [("txout".to_string(), "tx1".to_string())].into(),
        redelivery_window: workload::PREFETCH as u64,
    };
    let report = check(&events, &drain, &config);
    let mut result = RunResult {
        seed: opts.seed,
        report,
        faults: done,
        incidents,
        failure_file: None,
        history_file: None,
    };
    if !result.passed() || opts.keep_history {
        let (failure, full) = write_failure(opts, &result, &events, &drain)?;
        result.failure_file = Some(failure);
        result.history_file = Some(full);
    }
    Ok(result)
}

/// Applies one fault; the broker is running again (or continued) when it returns. For a fault
/// that ends the process, returns when (on `history`'s clock) it was seen to have exited.
async fn strike(
    nodes: &Nodes,
    net: Option<&Net>,
    f: PlannedFault,
    history: &History,
) -> anyhow::Result<Option<u64>> {
    let b = f.broker;
    let mut ended = None;
    match f.kind {
        FaultKind::Partition => {
            let net = net.context("a partition without namespaces")?;
            net.cut()?;
            tokio::time::sleep(f.pause).await;
            net.heal()?;
        }
        FaultKind::Netem => {
            let [loss, delay, jitter, reorder, duplicate] = f.netem;
            net.context("netem without namespaces")?
                .netem(loss, delay, jitter, reorder, duplicate)?;
        }
        FaultKind::Kill9 => {
            with_nodes(nodes, move |n| n[b].kill9()).await?;
            ended = Some(history.now());
            with_nodes(nodes, move |n| n[b].start()).await?
        }
        FaultKind::Kill9SlowStart => {
            with_nodes(nodes, move |n| n[b].kill9()).await?;
            ended = Some(history.now());
            tokio::time::sleep(f.pause).await;
            with_nodes(nodes, move |n| n[b].start()).await?;
        }
        FaultKind::Term => {
            with_nodes(nodes, move |n| n[b].terminate()).await?;
            ended = Some(history.now());
            with_nodes(nodes, move |n| n[b].start()).await?
        }
        FaultKind::Stop => {
            with_nodes(nodes, move |n| n[b].stop()).await?;
            tokio::time::sleep(f.pause).await;
            with_nodes(nodes, move |n| n[b].cont()).await?;
        }
    }
    // A broker that died on its own since the last fault is a finding, not a fault of ours.
    with_nodes(nodes, |n| -> anyhow::Result<()> {
        for node in n.iter_mut() {
            if !node.is_up() {
                let msg = format!(
                    "{} exited on its own; log tail: {}",
                    node.name(),
                    node.log_tail(2000)
                );
                node.incidents.push(msg);
                let _ = node.kill9();
                node.start()?;
            }
        }
        Ok(())
    })
    .await?;
    Ok(ended)
}

/// After the workload: waits for in-flight messages and outgoing queues to settle, reads the
/// express queue, restarts every broker cleanly (SIGTERM, start), reads every other queue.
async fn finish(
    opts: &Options,
    nodes: &Nodes,
    urls: &[String],
    addrs: &[String],
    history: &History,
) -> anyhow::Result<(Drain, Vec<String>)> {
    let _ = history;
    let mut incidents = Vec::new();
    let settle = Duration::from_secs(60);
    let mut drain = Drain::default();
    {
        let a = connect(&urls[0]).await?;
        for spec in QUEUES.iter().filter(|s| s.broker < urls.len()) {
            let c = if spec.broker == 0 {
                a.clone()
            } else {
                connect(&urls[spec.broker]).await?
            };
            let p = path(spec.name);
            let settled = mq_tests::eventually(settle, || async {
                c.queue_info(&p).await.is_ok_and(|i| i.in_flight == 0)
            })
            .await;
            if !settled {
                incidents.push(format!(
                    "{} still had messages in flight {settle:?} after the workload stopped",
                    spec.name
                ));
            }
        }
        if let Some(b) = addrs.get(1) {
            let emptied = mq_tests::eventually(settle, || async {
                a.outgoing().await.is_ok_and(|qs| {
                    qs.iter()
                        .filter(|q| &q.destination == b)
                        .all(|q| q.messages == 0 && q.in_flight == 0)
                })
            })
            .await;
            if !emptied {
                incidents.push(format!(
                    "the outgoing queue to broker B never emptied: {:?}",
                    a.outgoing().await
                ));
            }
        }
        read_queue(&a, "express", &mut drain).await?;
    }
    // The clean restart (or the sabotage).
    let sabotage = opts.sabotage;
    with_nodes(nodes, move |n| -> anyhow::Result<()> {
        for node in n.iter_mut() {
            node.terminate()?;
            if sabotage == Some(Sabotage::WipeJournal) && node.index() == 0 {
                let dir = node.data_dir().to_path_buf();
                for entry in std::fs::read_dir(&dir)? {
                    let p = entry?.path();
                    if p.is_dir() {
                        std::fs::remove_dir_all(&p)?;
                    } else {
                        std::fs::remove_file(&p)?;
                    }
                }
            }
            node.start()?;
        }
        Ok(())
    })
    .await?;
    for spec in QUEUES
        .iter()
        .filter(|s| s.broker < urls.len() && s.name != "express")
    {
        let c = connect(&urls[spec.broker]).await?;
        read_queue(&c, spec.name, &mut drain).await?;
    }
    Ok((drain, incidents))
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    for _ in 0..100 {
        if let Ok(Ok(c)) =
            tokio::time::timeout(Duration::from_secs(10), Client::connect(url.to_string())).await
        {
            return Ok(c);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("cannot connect to {url}")
}

/// Every message `queue` holds, in receive order (peeked, so nothing is removed); a queue
/// that does not exist holds none.
async fn read_queue(client: &Client, name: &str, drain: &mut Drain) -> anyhow::Result<()> {
    let queue = client.queue(&path(name))?;
    let tags = drain.queues.entry(name.to_string()).or_default();
    let mut after = None;
    loop {
        let page = match queue.peek_page(1000, after.as_ref(), Duration::ZERO).await {
            Ok(p) => p,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("peek {name}")),
        };
        for m in &page.messages {
            match Tag::parse(&m.body) {
                Some(t) => tags.push(t),
                None => drain.garbage.push((
                    name.to_string(),
                    String::from_utf8_lossy(&m.body[..m.body.len().min(60)]).into_owned(),
                )),
            }
        }
        match page.next {
            Some(c) => after = Some(c),
            None => return Ok(()),
        }
    }
}

/// Writes `mqtorture-<seed>-failure.jsonl` (the report, the incidents, every problem, the
/// faults, and the history events of the messages concerned: small enough to read) and
/// `mqtorture-<seed>-history.jsonl` (every event, then what the queues held).
fn write_failure(
    opts: &Options,
    result: &RunResult,
    events: &[Event],
    drain: &Drain,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(&opts.out_dir)?;
    let failure = opts
        .out_dir
        .join(format!("mqtorture-{}-failure.jsonl", opts.seed));
    let full = opts
        .out_dir
        .join(format!("mqtorture-{}-history.jsonl", opts.seed));
    let line = |v: serde_json::Value| format!("{v}\n");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&failure)?);
    f.write_all(
        line(serde_json::json!({
            "seed": opts.seed,
            "cycles": opts.cycles,
            "brokers": opts.brokers,
            "duration_per_cycle_ms": opts.duration_per_cycle.as_millis() as u64,
            "report": &result.report,
        }))
        .as_bytes(),
    )?;
    for i in &result.incidents {
        f.write_all(line(serde_json::json!({ "incident": i })).as_bytes())?;
    }
    // At most 50 problems per class, and the events of their messages.
    let mut per_class: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tags = std::collections::BTreeSet::new();
    for p in &result.report.problems {
        let n = per_class.entry(p.class).or_default();
        *n += 1;
        if *n > 50 {
            continue;
        }
        if let Some(t) = p.tag {
            tags.insert(t);
        }
        f.write_all(line(serde_json::json!({ "problem": p })).as_bytes())?;
    }
    for e in events {
        let related = matches!(e, Event::Fault { .. }) || e.tags().iter().any(|t| tags.contains(t));
        if related {
            f.write_all(line(serde_json::to_value(e)?).as_bytes())?;
        }
    }
    f.flush()?;
    let mut h = std::io::BufWriter::new(std::fs::File::create(&full)?);
    for e in events {
        h.write_all(line(serde_json::to_value(e)?).as_bytes())?;
    }
    h.write_all(line(serde_json::json!({ "drain": drain })).as_bytes())?;
    h.flush()?;
    Ok((failure, full))
}
