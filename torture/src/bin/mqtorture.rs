//! `mqtorture`: random faults against real `mqd` processes under a mixed workload, then a
//! check of every promise. Exits 0 when nothing was lost, duplicated or invented, 1 when the
//! checker found something (the failure file says what), 2 when the run itself could not
//! be carried out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mq_torture::{Options, Sabotage};

#[derive(Debug, Parser)]
#[command(
    name = "mqtorture",
    version,
    about = "torture test for mqd: random faults under a mixed workload, a history, a checker"
)]
struct Args {
    /// Fault cycles: one fault (kill -9, slow restart, SIGTERM or SIGSTOP/SIGCONT) per cycle.
    #[arg(long, default_value_t = 10)]
    cycles: u64,
    /// Brokers: 1, or 2 (store-and-forward from A to queues on B; faults on either).
    #[arg(long, default_value_t = 1)]
    brokers: usize,
    /// The seed of the fault schedule and of every worker's choices (default: random; always
    /// printed). The same seed replays the same choices; timing may differ.
    #[arg(long)]
    seed: Option<u64>,
    /// How long one cycle lasts (the fault strikes within its first 80%).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration_per_cycle: Duration,
    /// Longest wait for one client operation before its outcome counts as unknown.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    op_timeout: Duration,
    /// Where a failing run writes mqtorture-<seed>-failure.jsonl and -history.jsonl.
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// Harness self-test: wipe broker A's journal before the final restart (the run must fail).
    #[arg(long, hide = true)]
    sabotage_wipe_journal: bool,
    /// Write the history files (as a failing run does) even when the run passes.
    #[arg(long)]
    keep_history: bool,
    /// Print each fault as it strikes.
    #[arg(long, short)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!("mqtorture seed {seed} (replay with --seed {seed})");
    let opts = Options {
        cycles: args.cycles,
        brokers: args.brokers,
        seed,
        duration_per_cycle: args.duration_per_cycle,
        op_timeout: args.op_timeout,
        out_dir: args.out_dir,
        sabotage: args.sabotage_wipe_journal.then_some(Sabotage::WipeJournal),
        verbose: args.verbose,
        keep_history: args.keep_history,
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mqtorture: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match rt.block_on(mq_torture::run(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mqtorture: the run could not be carried out (seed {seed}): {e:#}");
            return ExitCode::from(2);
        }
    };
    println!(
        "seed {seed}: {} cycles on {} broker(s), {} per cycle",
        result.faults.len(),
        opts.brokers,
        humantime::format_duration(opts.duration_per_cycle)
    );
    println!("{}", result.report);
    for i in &result.incidents {
        println!("INCIDENT: {i}");
    }
    if result.passed() {
        println!("PASS: every promise held (seed {seed})");
        ExitCode::SUCCESS
    } else {
        println!(
            "FAIL (seed {seed}): {} findings, {} incidents; see {} (all events: {})",
            result.report.failures(),
            result.incidents.len(),
            result
                .failure_file
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            result
                .history_file
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        ExitCode::from(1)
    }
}
