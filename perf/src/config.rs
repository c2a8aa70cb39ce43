//! [`Config`]: one `mqperf` invocation, as the command line describes it (see `cli` for the
//! flags), plus the choices it is made of ([`Mode`], [`Scenario`], [`DeliveryKind`]).

use std::time::Duration;

use crate::payload::{FormatterKind, PayloadKind};

/// `NOTX` or `TX`: non-transactional or transactional sends and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Non-transactional sends and receives.
    #[value(name = "NOTX")]
    Notx,
    /// Transactional queues; every send and every receive its own single-message transaction.
    #[value(name = "TX")]
    Tx,
}

impl Mode {
    /// `"NOTX"` or `"TX"`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Notx => "NOTX",
            Mode::Tx => "TX",
        }
    }
}

/// What is timed (the white paper's four scenarios).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Time sending N messages, purge after each run.
    #[value(name = "SENDANDPURGE")]
    SendAndPurge,
    /// Time sending N, then receiving N, then both at once (end to end).
    #[value(name = "SENDANDRECEIVE")]
    SendAndReceive,
    /// Drain QUEUE, decode every message, reply to RESPONSE-QUEUE after each run.
    #[value(name = "SERVER")]
    Server,
    /// Send N per run to QUEUE and wait for the SERVER's reply on RESPONSE-QUEUE.
    #[value(name = "CLIENT")]
    Client,
}

impl Scenario {
    /// `"SENDANDPURGE"`, `"SENDANDRECEIVE"`, `"SERVER"`, `"CLIENT"`.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::SendAndPurge => "SENDANDPURGE",
            Scenario::SendAndReceive => "SENDANDRECEIVE",
            Scenario::Server => "SERVER",
            Scenario::Client => "CLIENT",
        }
    }

    /// Whether the scenario needs a response queue (and only then accepts one).
    pub fn needs_response_queue(self) -> bool {
        matches!(self, Scenario::Server | Scenario::Client)
    }
}

/// `--delivery`: how the broker keeps the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeliveryKind {
    /// In memory; acknowledged once in the queue.
    #[default]
    Express,
    /// On disk; acknowledged once its record is on disk.
    Recoverable,
}

impl DeliveryKind {
    /// `"express"` or `"recoverable"`.
    pub fn name(self) -> &'static str {
        match self {
            DeliveryKind::Express => "express",
            DeliveryKind::Recoverable => "recoverable",
        }
    }

    /// The client's delivery mode.
    pub fn to_client(self) -> mq_client::Delivery {
        match self {
            DeliveryKind::Express => mq_client::Delivery::Express,
            DeliveryKind::Recoverable => mq_client::Delivery::Recoverable,
        }
    }
}

/// Everything one run of `mqperf` needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub scenario: Scenario,
    /// The queue messages are sent to (created if missing).
    pub queue: String,
    /// SERVER and CLIENT only: where the server replies after each run.
    pub response_queue: Option<String>,
    /// A running broker's URL; `None`: an embedded broker in a temporary directory (two with
    /// `forward`). With `forward` this is broker A, where every send goes.
    pub broker: Option<String>,
    /// Store-and-forward (`--forward`): every send goes through broker A to the queue on broker
    /// B (by its remote format name), every receive is from B's local queue.
    pub forward: bool,
    /// `--receive-broker`: broker B's URL with `forward` and `broker`.
    pub receive_broker: Option<String>,
    pub payloads: Vec<PayloadKind>,
    pub formatters: Vec<FormatterKind>,
    pub delivery: DeliveryKind,
    /// Messages per run.
    pub count: u64,
    /// Runs per (payload, formatter); the report gives the median and the spread.
    pub runs: u32,
    /// JSON lines on stdout instead of the table (the banner then goes to stderr).
    pub json: bool,
    /// Longest wait for a message or a reply that should come.
    pub timeout: Duration,
    /// Concurrent senders, each on its own connection, sharing `count` (SENDANDPURGE and
    /// SENDANDRECEIVE; 1 elsewhere).
    pub clients: u32,
    /// `--rate`: open loop, sends paced at this many messages/s (all senders together);
    /// latencies measured from each message's intended send time. `None`: closed loop.
    pub rate: Option<u64>,
    /// `--queues`: messages spread round-robin over this many queues (`QUEUE-0` ...
    /// `QUEUE-<N-1>` when more than one).
    pub queues: u32,
    /// `--consumers`: receiving consumers (at least `queues`; consumer k reads queue
    /// k mod `queues`). `None`: one per queue.
    pub consumers: Option<u32>,
    /// `--backlog`: SENDANDRECEIVE fills the queues with this many messages, then times the
    /// drain (ops `fill` and `drain`) instead of send, receive and e2e.
    pub backlog: Option<u64>,
    /// `--broker-pid`: the process whose RSS the report shows (`None` with an embedded broker:
    /// this process).
    pub broker_pid: Option<u32>,
    /// `--ack-each`: acknowledge every received message on its own.
    pub ack_each: bool,
    /// `--journal`: queues are created with target journaling (`QUEUE;JOURNAL`).
    pub journal: bool,
    /// TX: explicit transactions of one message each, awaited one at a time (`--one-at-a-time`).
    pub one_at_a_time: bool,
    /// With `one_at_a_time`: receive transactions end with receive_and_commit (one round
    /// trip) instead of receive, commit (`--receive-and-commit`).
    pub receive_and_commit: bool,
    /// Every send one `Queue::send` call (TX: `Queue::send_tx`), awaited before the next
    /// (`--send-one`).
    pub send_one: bool,
    /// Every receive one unary `Queue::receive` call (`--receive-one`).
    pub receive_one: bool,
    /// SENDANDPURGE: the last run's messages stay in the queues (`--keep`).
    pub keep: bool,
    /// `--target`: the systems to run against, one after another (empty: mq only, the
    /// `--broker` or an embedded one).
    pub targets: Vec<crate::target::Target>,
    /// `--csv FILE`: the report's rows as CSV.
    pub csv: Option<std::path::PathBuf>,
    /// `--plot FILE`: the figures, SVG or PNG by the extension.
    pub plot: Option<std::path::PathBuf>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// The command line, for the banner.
    pub command: String,
}

impl Config {
    /// Sends awaited one by one (`--one-at-a-time`, `--send-one`): the loop runs on a runtime
    /// worker, as an application's task would.
    pub fn one_by_one_sends(&self) -> bool {
        self.one_at_a_time || self.send_one
    }

    /// Receives awaited one by one (`--one-at-a-time`, `--receive-one`): likewise.
    pub fn one_by_one_receives(&self) -> bool {
        self.one_at_a_time || self.receive_one
    }

    /// What the report calls the delivery: `"transactional"` for TX (transactional messages are
    /// always recoverable; `--delivery` does not apply), else `--delivery`.
    pub fn delivery_name(&self) -> &'static str {
        match self.mode {
            Mode::Tx => "transactional",
            Mode::Notx => self.delivery.name(),
        }
    }

    /// The client's delivery mode for sends (recoverable for TX, as the broker forces it).
    pub fn send_delivery(&self) -> mq_client::Delivery {
        match self.mode {
            Mode::Tx => mq_client::Delivery::Recoverable,
            Mode::Notx => self.delivery.to_client(),
        }
    }

    /// Receiving consumers (`--consumers`, default one per queue).
    pub fn consumers(&self) -> u32 {
        self.consumers
            .unwrap_or(self.queues)
            .max(self.queues)
            .max(1)
    }

    /// The names of the queues messages go to: QUEUE itself, or `QUEUE-0` ... `QUEUE-<N-1>`
    /// with `--queues N` > 1.
    pub fn queue_names(&self) -> Vec<String> {
        if self.queues <= 1 {
            return vec![self.queue.clone()];
        }
        (0..self.queues)
            .map(|i| format!("{}-{i}", self.queue))
            .collect()
    }

    /// A configuration with the command line's defaults (10 000 messages, 5 runs,
    /// `string:1000` with the binary formatter, express, embedded broker, not forwarded, 60 s
    /// timeout, one sending client).
    pub fn new(mode: Mode, scenario: Scenario, queue: impl Into<String>) -> Config {
        Config {
            mode,
            scenario,
            queue: queue.into(),
            response_queue: None,
            broker: None,
            forward: false,
            receive_broker: None,
            payloads: vec![PayloadKind::Str(1000)],
            formatters: vec![FormatterKind::Binary],
            delivery: DeliveryKind::Express,
            count: 10_000,
            runs: 5,
            json: false,
            timeout: Duration::from_secs(60),
            clients: 1,
            rate: None,
            queues: 1,
            consumers: None,
            backlog: None,
            broker_pid: None,
            ack_each: false,
            journal: false,
            one_at_a_time: false,
            receive_and_commit: false,
            send_one: false,
            receive_one: false,
            keep: false,
            targets: Vec::new(),
            csv: None,
            plot: None,
            progress: false,
            command: String::new(),
        }
    }
}
