//! `mqperf`: see the `mq-perf` library. Exit codes: 0 success, 1 failure, 2 usage error;
//! `mqperf compare` also 3 (a cell is slower beyond the run-to-run spread).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use mq_perf::Cli;

// mimalloc instead of glibc's malloc (feature `mimalloc`), as in mqd: the embedded broker runs
// on the same allocator as a separate mqd. Not wrapped in mqd's `mq_broker::Prefaulting`: with
// it, mqperf's receives of 1 MB bodies from a separate mqd were slower (1,970-2,389 msg/s
// against 2,304-2,636, docs/benchmarks.md "Express sends into fresh memory"), and it is the
// broker's backlog, not the client's short-lived buffers, that lands in fresh memory.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    mq_broker::tune_allocator();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("compare") => {
            let cli = mq_perf::compare::CompareCli::parse_from(&args[1..]);
            return match mq_perf::compare::main(&cli, &mut std::io::stdout()) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("mqperf compare: error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Some("plot") => {
            let cli = mq_perf::plot::PlotCli::parse_from(&args[1..]);
            return match mq_perf::plot::main(&cli) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mqperf plot: error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    // Usage errors print clap's message and exit with 2; --help and --version with 0.
    let cli = Cli::parse();
    let progress = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let ca = match &cli.ca {
        Some(p) => match std::fs::read(p) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("mqperf: error: cannot read --ca {}: {e}", p.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let user = match cli.user.clone() {
        Some(u) => match std::env::var("MQ_PASSWORD") {
            Ok(password) => Some((u, password)),
            Err(_) => {
                eprintln!("mqperf: error: --user {u} needs its password in MQ_PASSWORD");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    mq_perf::set_connect_settings(mq_perf::ConnectSettings {
        ca,
        user,
        token: cli.token.clone(),
    });
    let config = match cli.into_config(progress, command) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // The embedded broker's memory trims reach every worker's heap (as in mqd).
        .on_thread_park(mq_broker::on_worker_park)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mqperf: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let mut out = std::io::stdout();
        let mut err = std::io::stderr();
        mq_perf::run_all(&config, &mut out, &mut err).await
    });
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain, outermost first.
            eprintln!("mqperf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
