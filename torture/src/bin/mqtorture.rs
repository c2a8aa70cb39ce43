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
    /// Partitions: broker A and broker B in two network namespaces joined by a veth pair
    /// (10.200.x.x inside them only), with the link cut and healed and `tc netem` loss, delay,
    /// reordering and duplication; implies --brokers 2. Needs root, `ip` and `tc`; skipped
    /// with a printed reason where namespaces cannot be created. Everything made is removed.
    #[arg(long)]
    partitions: bool,
    /// Internal: this process runs inside namespace A of partition set ID.
    #[arg(long, hide = true)]
    net_id: Option<u32>,
    /// Print each fault as it strikes.
    #[arg(long, short)]
    verbose: bool,
    /// Longest wait for a (re)started broker to listen (its recovery included); long runs
    /// grow large journals. Sets MQ_TEST_START_TIMEOUT_SECS for this process and its children.
    #[arg(long, value_parser = humantime::parse_duration)]
    start_timeout: Option<Duration>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(t) = args.start_timeout {
        // Still one thread here: nothing reads the environment concurrently.
        std::env::set_var(mq_tests::START_TIMEOUT_ENV, t.as_secs().max(1).to_string());
    }
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!("mqtorture seed {seed} (replay with --seed {seed})");
    if args.partitions && args.net_id.is_none() {
        return partitioned(&args, seed);
    }
    let opts = Options {
        cycles: args.cycles,
        brokers: if args.net_id.is_some() {
            2
        } else {
            args.brokers
        },
        seed,
        duration_per_cycle: args.duration_per_cycle,
        op_timeout: args.op_timeout,
        out_dir: args.out_dir,
        sabotage: args.sabotage_wipe_journal.then_some(Sabotage::WipeJournal),
        verbose: args.verbose,
        keep_history: args.keep_history,
        net: args.net_id,
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mqtorture: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C drops the run, and with it the brokers (stopped by their PIDs).
    let run = async {
        tokio::select! {
            r = mq_torture::run(&opts) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    };
    let result = match rt.block_on(run) {
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

/// `--partitions`: creates the namespaces and the link, runs this program again inside
/// namespace A (`ip netns exec`), removes everything, and exits as the inner run did. Where
/// namespaces cannot be made, says why and runs two brokers on loopback instead.
fn partitioned(args: &Args, seed: u64) -> ExitCode {
    use mq_torture::partition::{unavailable, Net};
    let why = unavailable();
    // Build mqd before entering the namespace (the inner run finds it built).
    let _ = mq_tests::mqd_path();
    let net = match why {
        Some(why) => Err(why),
        None => Net::create(std::process::id()).map_err(|e| format!("{e:#}")),
    };
    let net = match net {
        Ok(net) => net,
        Err(why) => {
            println!("partitions skipped: {why}; running two brokers on loopback instead");
            let mut cmd = std::process::Command::new(std::env::current_exe().expect("current_exe"));
            cmd.args(inner_args(args, seed)).arg("--brokers").arg("2");
            return relay(cmd);
        }
    };
    println!(
        "partitions: namespaces {} ({}) and {} ({}), veth {} / {}",
        net.ns_a, net.ip_a, net.ns_b, net.ip_b, net.veth_a, net.veth_b
    );
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &net.ns_a])
        .arg(std::env::current_exe().expect("current_exe"))
        .args(inner_args(args, seed))
        .arg("--net-id")
        .arg(std::process::id().to_string());
    // Ctrl-C reaches the inner run too: this process waits for it to clean up, then removes
    // the namespaces.
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.spawn(async { while tokio::signal::ctrl_c().await.is_ok() {} });
    let code = relay(cmd);
    drop(net);
    code
}

/// The flags of `args` for the inner run, with the seed fixed.
fn inner_args(args: &Args, seed: u64) -> Vec<String> {
    let mut v = vec![
        "--cycles".to_string(),
        args.cycles.to_string(),
        "--seed".to_string(),
        seed.to_string(),
        "--duration-per-cycle".to_string(),
        humantime::format_duration(args.duration_per_cycle).to_string(),
        "--op-timeout".to_string(),
        humantime::format_duration(args.op_timeout).to_string(),
        "--out-dir".to_string(),
        args.out_dir.display().to_string(),
    ];
    if args.keep_history {
        v.push("--keep-history".to_string());
    }
    if args.verbose {
        v.push("--verbose".to_string());
    }
    if args.sabotage_wipe_journal {
        v.push("--sabotage-wipe-journal".to_string());
    }
    v
}

/// Runs `cmd` with this process's stdout and stderr; its exit code (2 if it could not run).
fn relay(mut cmd: std::process::Command) -> ExitCode {
    match cmd.status() {
        Ok(s) => ExitCode::from(s.code().unwrap_or(2).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("mqtorture: cannot run {cmd:?}: {e}");
            ExitCode::from(2)
        }
    }
}
