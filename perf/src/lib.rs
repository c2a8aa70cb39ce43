//! `mq-perf`: `mqperf`, the benchmark tool of mq, modelled on the MsmqPerfTest tool of the
//! "System.Messaging performance" white paper: the same command line
//! (`mqperf <NOTX|TX> <SENDANDPURGE|SENDANDRECEIVE|SERVER|CLIENT> <QUEUE> [<RESPONSE-QUEUE>]`),
//! the same payloads and formatters, and a report of send, receive-only and end-to-end rates
//! (messages/s, MB/s; median and spread over runs) with latency percentiles.
//!
//! It is a tool, not a test suite: nothing here asserts speed. The library exists so the
//! integration tests can run scenarios in-process against an embedded broker.
//!
//! # Layout
//! - `cli`: [`Cli`], the command line (clap derive) and its usage checks.
//! - `config`: [`Config`], [`Mode`], [`Scenario`], [`DeliveryKind`].
//! - [`payload`]: the white paper's payloads, and encode/decode per formatter.
//! - `scenario`: the plan (what runs, what is skipped and why) and one file per scenario.
//! - `measurement`: [`ComboResult`], [`OpResult`], [`Op`]: what was measured.
//! - `stats`: [`Spread`] (median, min, max) and [`Latency`] (HdrHistogram).
//! - `report`: banner, table, JSON lines ([`Row`]).
//! - `embedded`: [`EmbeddedBroker`], the in-process broker used when `--broker` is absent.
//! - `forward`: [`Route`], [`BrokerAddr`]: `--forward`, sends through broker A to the queue on
//!   broker B, and the wait until A's outgoing queue is empty.
//! - `machine`: [`Machine`] (cores, CPU model) for the banner.
//! - `progress`: [`Progress`], the progress bar on a terminal.
//! - [`rate`]: `--rate`, the open-loop send schedule and its pacer thread.
//! - `rss`: [`rss_bytes`], a process's resident memory for the report.
//! - [`steal`]: the CPU time the hypervisor took while a phase ran, for the report.
//! - `benchmark`: [`run`], one invocation end to end.
//! - `connect`: [`ConnectSettings`]: TLS CA and credentials (`--ca`, `--user`, `--token`).
//! - `target`: [`Target`] (`--target`: mq, `amqp://`, `nats://`) and [`TargetInfo`], how the
//!   modes map onto each and whether it fsyncs before acknowledging.
//! - `peer`: the scenarios against RabbitMQ (`amqp`, cargo feature `amqp`) and NATS JetStream
//!   (`nats`, cargo feature `nats`).
//! - [`spreadsheet`]: `--csv`, and reading `--json` reports back.
//! - [`plot`]: `--plot` and `mqperf plot`, the figures (plotters, SVG or PNG).
//! - [`compare`]: `mqperf compare BEFORE.json AFTER.json`.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use mq_perf::{Config, Mode, Scenario};
//! let mut config = Config::new(Mode::Notx, Scenario::SendAndReceive, r".\private$\perf");
//! config.count = 1000;
//! let results = mq_perf::run(&config, &mut std::io::stdout(), &mut std::io::stderr()).await?;
//! # Ok(()) }
//! ```

mod benchmark;
mod cli;
pub mod compare;
mod config;
mod connect;
mod embedded;
mod forward;
mod machine;
mod measurement;
pub mod payload;
#[cfg(any(feature = "amqp", feature = "nats"))]
mod peer;
pub mod plot;
mod progress;
pub mod rate;
mod report;
mod rss;
mod scenario;
pub mod spreadsheet;
mod stats;
pub mod steal;
mod target;

pub use benchmark::{run, run_all};
pub use cli::{Cli, FormatterList, PayloadList};
pub use config::{Config, DeliveryKind, Mode, Scenario};
pub use connect::{set_connect_settings, ConnectSettings};
pub use embedded::EmbeddedBroker;
pub use forward::{BrokerAddr, Route};
pub use machine::Machine;
pub use measurement::{ComboResult, Op, OpResult, Outcome, RunSample};
#[cfg(any(feature = "amqp", feature = "nats"))]
pub use peer::peer_queue;
pub use progress::Progress;
pub use report::{ReportContext, Row};
pub use rss::rss_bytes;
pub use scenario::{prefetch_for, sample_every};
pub use stats::{Latency, Spread};
pub use target::{Target, TargetInfo};
