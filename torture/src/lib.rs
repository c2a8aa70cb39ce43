//! `mq-torture`: the `mqtorture` harness. Real `mqd` processes on loopback, a mixed workload
//! through `mq-client`, faults at random times (kill -9, SIGSTOP/SIGCONT, SIGTERM, slow
//! restarts) drawn from a seed, a history of every operation, and a checker that proves what
//! the broker promised after a clean restart. See `docs/reliability.md`.
//!
//! # Layout
//! - [`cluster`]: the brokers as processes and the faults done to them by PID.
//! - [`workload`]: the writers and receivers, recording into the [`history`].
//! - [`faults`]: the seeded fault schedule.
//! - [`partition`]: network namespaces, a veth pair and netem between two brokers.
//! - [`checker`]: the classes of outcome and what fails a run.
//! - [`run`]: one run from start to report.

pub mod checker;
pub mod cluster;
pub mod faults;
pub mod history;
pub mod partition;
pub mod run;
pub mod workload;

pub use checker::{check, CheckConfig, Drain, Report};
pub use run::{run, Options, RunResult, Sabotage};
