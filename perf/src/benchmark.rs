//! One `mqperf` invocation end to end: pick the broker (embedded or `--broker`), connect,
//! print the banner, run the scenario with a progress bar, print each result as it comes,
//! stop the embedded broker.

use std::io::Write;

use anyhow::{Context, Result};
use mq_client::Client;

use crate::config::Config;
use crate::embedded::EmbeddedBroker;
use crate::machine::Machine;
use crate::measurement::ComboResult;
use crate::progress::Progress;
use crate::report::{self, ReportContext};
use crate::scenario;

/// Bytes the broker charges per message besides the body (label, headers), with margin.
const PER_MESSAGE_OVERHEAD: u64 = 512;

/// Runs the benchmark `config` describes. The table or the JSON lines go to `out`; with
/// `--json` the banner goes to `err` (so `out` holds only JSON lines), else to `out`.
pub async fn run(
    config: &Config,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<Vec<ComboResult>> {
    // An external broker's limit is not known to the client: assume the default.
    let max_body = mq_broker::DEFAULT_MAX_BODY_BYTES;
    let plan = scenario::plan(config, max_body)?;
    match &config.broker {
        Some(url) => {
            let ctx = ReportContext {
                config: config.clone(),
                broker: url.clone(),
                broker_detail: format!("(body limit assumed {max_body} bytes)"),
                machine: Machine::detect(),
            };
            run_against(config, url, ctx, plan, out, err).await
        }
        None => {
            // Up to `count` messages are in the broker's memory at once.
            let needed = config.count.saturating_mul(
                (scenario::largest_body(&plan) as u64 + PER_MESSAGE_OVERHEAD) * 5 / 4,
            );
            let broker = EmbeddedBroker::start(needed).await?;
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
                machine: Machine::detect(),
            };
            let url = broker.url().to_string();
            let result = run_against(config, &url, ctx, plan, out, err).await;
            let stopped = broker.stop().await;
            let results = result?;
            stopped?;
            Ok(results)
        }
    }
}

async fn run_against(
    config: &Config,
    url: &str,
    ctx: ReportContext,
    plan: Vec<scenario::Planned>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<Vec<ComboResult>> {
    let client = Client::connect(url).await?;
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
            }
            out.flush()
        });
        if let Err(e) = written {
            write_error.get_or_insert(e);
        }
    };
    let results = scenario::run(config, &client, plan, &progress, &mut on_result).await;
    progress.finish();
    if let Some(e) = write_error {
        return Err(e).context("cannot write the report");
    }
    results
}
