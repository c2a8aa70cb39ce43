//! One `mqperf` invocation end to end: pick the broker (embedded or `--broker`; with
//! `--forward` two: embedded, or `--broker` and `--receive-broker`), connect, print the
//! banner, run the scenario with a progress bar, print each result as it comes, stop the
//! embedded brokers.

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::config::{Config, Scenario};
use crate::embedded::EmbeddedBroker;
use crate::forward::{BrokerAddr, Route};
use crate::machine::Machine;
use crate::measurement::ComboResult;
use crate::progress::Progress;
use crate::report::{self, ReportContext, Row};
use crate::scenario::{self, Brokers};
use crate::target::{Target, TargetInfo};

/// Bytes the broker charges per message besides the body (label, headers), with margin.
const PER_MESSAGE_OVERHEAD: u64 = 512;

/// Runs the benchmark `config` describes. The table or the JSON lines go to `out`; with
/// `--json` the banner goes to `err` (so `out` holds only JSON lines), else to `out`.
pub async fn run(
    config: &Config,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<Vec<ComboResult>> {
    run_mq(config, out, err, &mut Vec::new()).await
}

/// Runs the benchmark against every `--target` (mq alone without one), one after another,
/// then prints the side-by-side table (several targets), and writes `--csv` and `--plot`.
/// Returns every row of every target. A peer that cannot be reached fails the whole run
/// before anything is measured.
pub async fn run_all(
    config: &Config,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<Vec<Row>> {
    let targets = if config.targets.is_empty() {
        vec![Target::Mq]
    } else {
        config.targets.clone()
    };
    for t in targets.iter().filter(|t| **t != Target::Mq) {
        check_peer(config, t).await?;
    }
    let mut rows = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if i > 0 {
            let w: &mut dyn Write = if config.json { err } else { out };
            writeln!(w)?;
        }
        match t {
            Target::Mq => {
                run_mq(config, out, err, &mut rows).await?;
            }
            peer => {
                run_peer(config, peer, out, err, &mut rows).await?;
            }
        }
    }
    if targets.len() > 1 {
        let w: &mut dyn Write = if config.json { err } else { out };
        report::write_side_by_side(w, &rows)?;
        w.flush()?;
    }
    if let Some(path) = &config.csv {
        crate::spreadsheet::write_csv_file(path, &rows)
            .with_context(|| format!("cannot write --csv {}", path.display()))?;
    }
    if let Some(path) = &config.plot {
        let caption = crate::plot::caption(&Machine::detect(), &config.command);
        crate::plot::draw_file(path, &rows, &caption)
            .with_context(|| format!("cannot draw --plot {}", path.display()))?;
    }
    Ok(rows)
}

#[cfg(any(feature = "amqp", feature = "nats"))]
async fn check_peer(config: &Config, target: &Target) -> Result<()> {
    crate::peer::check(config, target).await
}

#[cfg(not(any(feature = "amqp", feature = "nats")))]
async fn check_peer(_config: &Config, target: &Target) -> Result<()> {
    bail!(
        "--target {}: this mqperf was built without peer support (cargo features amqp, nats)",
        target.display_url()
    )
}

#[cfg(any(feature = "amqp", feature = "nats"))]
async fn run_peer(
    config: &Config,
    target: &Target,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    let plan = scenario::plan(config, mq_broker::DEFAULT_MAX_BODY_BYTES)?;
    crate::peer::run(config, target, plan, out, err, rows).await
}

#[cfg(not(any(feature = "amqp", feature = "nats")))]
async fn run_peer(
    config: &Config,
    target: &Target,
    _out: &mut (dyn Write + Send),
    _err: &mut (dyn Write + Send),
    _rows: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    check_peer(config, target).await.map(|()| Vec::new())
}

async fn run_mq(
    config: &Config,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows_out: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    // An external broker's limit is not known to the client: assume the default.
    let max_body = mq_broker::DEFAULT_MAX_BODY_BYTES;
    let plan = scenario::plan(config, max_body)?;
    if config.forward {
        return run_forward(config, plan, out, err, rows_out).await;
    }
    match &config.broker {
        Some(url) => {
            let ctx = ReportContext {
                config: config.clone(),
                broker: url.clone(),
                broker_detail: format!("(body limit assumed {max_body} bytes)"),
                forward: None,
                machine: Machine::detect(),
                target: TargetInfo::mq(config),
            };
            let brokers = connect(url, url, None).await?;
            run_against(config, &brokers, ctx, plan, out, err, rows_out).await
        }
        None => {
            let broker = EmbeddedBroker::start(express_quota(config, &plan)).await?;
            let ctx = ReportContext {
                config: config.clone(),
                broker: "embedded".to_string(),
                broker_detail: format!(
                    "({}, data dir {}, express quota {} MiB, body limit {} bytes)",
                    broker.url(),
                    broker.data_dir().display(),
                    broker.express_quota_bytes() >> 20,
                    broker.max_body_bytes()
                ),
                forward: None,
                machine: Machine::detect(),
                target: TargetInfo::mq(config),
            };
            let url = broker.url().to_string();
            let result = match connect(&url, &url, None).await {
                Ok(brokers) => run_against(config, &brokers, ctx, plan, out, err, rows_out).await,
                Err(e) => Err(e),
            };
            let stopped = broker.stop().await;
            let results = result?;
            stopped?;
            Ok(results)
        }
    }
}

/// The express quota an embedded broker needs: up to `count` messages are in its memory at
/// once (with `--forward`, in A's outgoing queue or in B's queue).
fn express_quota(config: &Config, plan: &[scenario::Planned]) -> u64 {
    config
        .count
        .max(config.backlog.unwrap_or(0))
        .saturating_mul((scenario::largest_body(plan) as u64 + PER_MESSAGE_OVERHEAD) * 5 / 4)
}

/// `--forward`: two embedded brokers (A and B), or `--broker` (A) and `--receive-broker` (B).
async fn run_forward(
    config: &Config,
    plan: Vec<scenario::Planned>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows_out: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    let max_body = mq_broker::DEFAULT_MAX_BODY_BYTES;
    match (&config.broker, &config.receive_broker) {
        (Some(a), Some(b)) => {
            let addr = |url: &str| BrokerAddr::from_url(url).map_err(anyhow::Error::msg);
            let route = Route::new(addr(a)?, addr(b)?).map_err(anyhow::Error::msg)?;
            let ctx = ReportContext {
                config: config.clone(),
                broker: format!("{a} -> {b}"),
                broker_detail: format!("(body limit assumed {max_body} bytes)"),
                forward: Some(describe(config, &route)?),
                machine: Machine::detect(),
                target: TargetInfo::mq(config),
            };
            let brokers = connect(a, b, Some(route)).await?;
            run_against(config, &brokers, ctx, plan, out, err, rows_out).await
        }
        (None, None) => {
            let quota = express_quota(config, &plan);
            let a = EmbeddedBroker::start(quota).await?;
            let b = match EmbeddedBroker::start(quota).await {
                Ok(b) => b,
                Err(e) => {
                    let _ = a.stop().await;
                    return Err(e);
                }
            };
            let route = Route::new(
                BrokerAddr::from_socket(a.addr()),
                BrokerAddr::from_socket(b.addr()),
            )
            .map_err(anyhow::Error::msg)?;
            let ctx = ReportContext {
                config: config.clone(),
                broker: "embedded".to_string(),
                broker_detail: format!(
                    "(two: A {} data dir {}, B {} data dir {}; express quota {} MiB each, body limit {} bytes)",
                    a.url(),
                    a.data_dir().display(),
                    b.url(),
                    b.data_dir().display(),
                    a.express_quota_bytes() >> 20,
                    a.max_body_bytes()
                ),
                forward: Some(describe(config, &route)?),
                machine: Machine::detect(),
                target: TargetInfo::mq(config),
            };
            let result = match connect(a.url(), b.url(), Some(route)).await {
                Ok(brokers) => run_against(config, &brokers, ctx, plan, out, err, rows_out).await,
                Err(e) => Err(e),
            };
            // A first: its forwarder talks to B.
            let stopped_a = a.stop().await;
            let stopped_b = b.stop().await;
            let results = result?;
            stopped_a.context("broker A")?;
            stopped_b.context("broker B")?;
            Ok(results)
        }
        // The command line refuses these; a Config built by hand may still ask.
        (Some(_), None) => {
            bail!(
                "--forward with --broker needs --receive-broker (broker B, where the queue lives)"
            )
        }
        (None, Some(_)) => {
            bail!("--receive-broker needs --broker too (broker A, where every send goes)")
        }
    }
}

/// The banner's `forwarded` line: the route and the queue's name on each side.
fn describe(config: &Config, route: &Route) -> Result<String> {
    let queue = &config.queue;
    let detail = match (config.scenario, &config.response_queue) {
        (Scenario::Server, Some(r)) => format!(
            "receives are from {queue} on B, replies go through B to {}",
            route.on_a(r)?
        ),
        (Scenario::Client, Some(r)) => format!(
            "sends go to A for {}, replies are received from {r} on A",
            route.on_b(queue)?
        ),
        _ => format!(
            "sends go to A for {}, receives are from {queue} on B",
            route.on_b(queue)?
        ),
    };
    Ok(format!("{} ({detail})", route.describe()))
}

/// Connects to the sending and the receiving broker (one connection when they are the same).
async fn connect(send_url: &str, receive_url: &str, route: Option<Route>) -> Result<Brokers> {
    let send = crate::connect::client(send_url).await?;
    let receive = if receive_url == send_url {
        send.clone()
    } else {
        crate::connect::client(receive_url).await?
    };
    Ok(Brokers {
        send,
        receive,
        route,
    })
}

async fn run_against(
    config: &Config,
    brokers: &Brokers,
    ctx: ReportContext,
    plan: Vec<scenario::Planned>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    rows_out: &mut Vec<Row>,
) -> Result<Vec<ComboResult>> {
    if config.json {
        report::write_banner(err, &ctx)?;
        err.flush()?;
    } else {
        report::write_banner(out, &ctx)?;
        report::write_table_header(out)?;
        out.flush()?;
    }
    let progress = if config.progress {
        Progress::bar(scenario::progress_per_run(config) * config.runs as u64 * plan.len() as u64)
    } else {
        Progress::hidden()
    };
    let mut write_error = None;
    let mut on_result = |r: &ComboResult| {
        let rows = report::rows(&ctx, r);
        let written = progress.suspend(|| {
            if config.json {
                report::write_json_rows(out, &rows)?;
            } else {
                report::write_table_rows(out, &rows)?;
                report::write_table_summary(out, &rows)?;
            }
            out.flush()
        });
        if let Err(e) = written {
            write_error.get_or_insert(e);
        }
        rows_out.extend(rows);
    };
    let results = scenario::run(config, brokers, plan, &progress, &mut on_result).await;
    progress.finish();
    if let Some(e) = write_error {
        return Err(e).context("cannot write the report");
    }
    results
}
