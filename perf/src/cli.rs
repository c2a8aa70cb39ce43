//! The command line (clap derive) and its checks; [`Cli::into_config`] turns it into a
//! [`Config`]. Usage errors are `clap::Error`s (exit code 2).

use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use mq_client::format_name::FormatName;

use crate::config::{Config, DeliveryKind, Mode, Scenario};
use crate::forward;
use crate::payload::{FormatterKind, PayloadKind};
use crate::target::Target;

const AFTER_HELP: &str = "\
Scenarios:
  SENDANDPURGE    time sending N messages (pipelined, until the last acknowledgement); purge
  SENDANDRECEIVE  time sending N, then receiving N (decoded and checked), then both at once (e2e)
  SERVER          drain QUEUE (decoded and checked), reply to RESPONSE-QUEUE after each run of N;
                  exits after --runs runs of every payload x formatter
  CLIENT          send N per run to QUEUE and wait for the SERVER's reply (e2e)
  SERVER and CLIENT must get the same --payload, --formatter, --count and --runs.
  SENDANDPURGE and SENDANDRECEIVE purge QUEUE first; CLIENT purges RESPONSE-QUEUE first.

Modes:
  NOTX  plain sends (--delivery express or recoverable) and receives; QUEUE (and
        RESPONSE-QUEUE) must not be transactional
  TX    every send and every receive its own single-message transaction (MSMQ's
        MQ_SINGLE_MESSAGE): sends pipelined through a transactional sender, each acknowledged
        once committed on disk; receives through a consumer, each delivery committed by the
        broker; SERVER replies likewise. Queues are created transactional if missing and must be
        transactional if they exist. --delivery is ignored (reported as \"transactional\").
  A mode that does not match an existing queue is an error (exit 1).

Concurrent senders (--clients N, SENDANDPURGE and SENDANDRECEIVE):
  N clients, each with its own connection and sender, send count/N messages each at once; the
  send rate is all N*count/N messages over the time from the common start to the last
  acknowledgement. Receives stay on one consumer.

Store-and-forward (--forward): every send goes through broker A to QUEUE on broker B (A stores
  it in its outgoing queue for B and forwards it; B acknowledges once stored, on disk for
  recoverable and TX); every receive is from B's local QUEUE. QUEUE (and RESPONSE-QUEUE) must be
  local paths (.\\private$\\perf); A is sent DIRECT=TCP:<B's host:port>\\private$\\perf.
  No --broker: two embedded brokers. --broker URL_A --receive-broker URL_B: two running ones.
  send = acknowledged by A; receive = drained from B after the sends (so it includes waiting
  for the forwarding); e2e = sent on A and received on B at once. Between runs mqperf waits
  until A's outgoing queue for B is empty. SENDANDPURGE: send, wait until every message is on
  B (not timed), purge B. SERVER/CLIENT: both need --broker A --receive-broker B; CLIENT sends
  through A and waits for the reply on A's RESPONSE-QUEUE, SERVER receives on B and replies
  through B to A's RESPONSE-QUEUE.

Load shape:
  --rate N       open loop: message g of a run is due g/N s after its start, sent then (or at
                 once if overdue) whatever happened to the ones before; latencies count from
                 the intended send time (coordinated omission corrected), so a stall shows in
                 every message due during it. The achieved msgs/s is close to N unless the
                 broker cannot keep up. Without it sends are closed loop (as fast as the
                 pipeline allows).
  --queues N     messages round-robin over QUEUE-0 ... QUEUE-<N-1>, created (or checked) and
                 purged 64 at a time; every sender opens a stream to each queue it sends to,
                 or, past 128 queues per sender, goes through them 128 at a time (open, send,
                 flush, close; not with --rate). --keep (SENDANDPURGE) leaves the last run's
                 messages in the queues.
  --consumers N  N consumers receive at once (consumer k on queue k mod --queues); rows show
                 the fewest and most messages one consumer got (starvation shows as 0).
  --backlog N    SENDANDRECEIVE: fill N messages (op fill), then time their drain (op drain).
  --one-at-a-time  TX: each send is begin, send, commit and each receive is begin, receive,
                 commit, awaited before the next (a synchronous application's transactions);
                 the loop runs in a task on a runtime worker, as an application's would.
  --receive-and-commit  with --one-at-a-time: each receive is begin, receive_and_commit (the
                 receive and the commit in one round trip) instead of begin, receive, commit.
  --send-one     each send is one Queue::send (TX: Queue::send_tx, a single-message
                 transaction), awaited before the next: an application sending one at a time.
  --receive-one  each receive is one unary Queue::receive (TX: a single-message transaction),
                 awaited before the next, instead of a streaming consumer.
  RSS: after each phase the table prints a line `rss ...` with the broker's VmRSS at the end
  of it (embedded broker: mqperf's own process, client included; --broker: only with
  --broker-pid PID); JSON rows carry it as rss_mib.

Latency: send = send() to acknowledgement, sampled (every max(1, min(64, N/1000))th message);
  receive = next() plus decode; e2e = sender's clock before encoding to decoded.

Peers (--target, repeatable; run one after another, then a side-by-side table):
  --target mq                               the mq broker (--broker URL, or embedded)
  --target amqp://guest:guest@127.0.0.1:5672  RabbitMQ (AMQP 0-9-1, classic queues)
  --target nats://127.0.0.1:4222            NATS JetStream (nats-server -js)
  The same payloads, formatters, counts, runs and checks; each mode mapped to the peer's
  closest equivalent (printed in the banner as `mapping` and `fsync`, and in every row):
    express      RabbitMQ: non-durable queue, transient messages, publisher confirms
                 NATS: memory-storage work-queue stream, publish acks
    recoverable  RabbitMQ: durable queue, persistent messages, publisher confirms (after fsync)
                 NATS: file-storage work-queue stream, publish acks (written, not fsync'd)
    TX           RabbitMQ: tx.select, one tx.commit per message sent and per message received
                 NATS: file storage, each publish ack awaited before the next, each receive
                 acked synchronously (double ack)
  Peer queues are named mqperf_<last part of QUEUE>_<express|recoverable|tx>. --forward,
  --rate, --backlog, --broker-pid, --receive-and-commit are mq-only (a peer's TX receive is
  what its mapping above says). --clients N, --queues N and --consumers N (= --queues) work
  with a peer in NOTX SENDANDRECEIVE, shaped as mq's: N connections (message g from sender
  g mod N, each sender's share of each queue published from a task and a channel of its own),
  queues mqperf_<QUEUE part>-<k>_<mode>, one consumer per queue, 100 on a connection; all
  connections opened and queues declared before the clock starts. --send-one with a peer: each
  publisher confirm (RabbitMQ) or publish ack (NATS) awaited before the next publish (TX sends
  are one at a time anyway). --receive-one with a peer: every receive a basic.get (RabbitMQ; an
  empty queue is asked again after 1 ms) or a pull request of one message (NATS), acknowledged
  (TX: committed) before the next.
  A peer that cannot be reached fails the run (exit 1) before anything is measured.

Files: --csv FILE writes every row (the --json fields) as CSV; --plot FILE.svg|FILE.png draws
  the figures: per delivery mode and op, bars of msgs/s per payload/formatter, one per target,
  whiskers min-max over runs.

Other commands:
  mqperf compare BEFORE.json AFTER.json   ratio per cell of two --json reports; flagged when
                                          the runs' min-max ranges do not overlap; exit 3 when
                                          a cell is slower beyond them
  mqperf plot A.json [B.json ...] --out F.svg   the figures of several reports in one picture

Exit codes: 0 success, 1 failure (broker unreachable or refusing, a message lost or
  different), 2 usage error; compare: 3 a cell slower beyond the run-to-run spread.

Examples:
  mqperf NOTX SENDANDRECEIVE '.\\private$\\perf' --payload empty,string:1000 --formatter raw
  mqperf TX SENDANDPURGE '.\\private$\\tx' --payload string:1000 --formatter raw --clients 8
  mqperf NOTX SENDANDRECEIVE '.\\private$\\perf' --forward --delivery recoverable --formatter raw
  mqperf NOTX SENDANDRECEIVE '.\\private$\\perf' --target mq --target amqp://guest:guest@127.0.0.1:5672 --target nats://127.0.0.1:4222 --plot cmp.svg";

/// mqperf: the System.Messaging white paper's MsmqPerfTest scenarios against an mq broker.
#[derive(Debug, Parser)]
#[command(name = "mqperf", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// NOTX or TX (case-insensitive)
    #[arg(value_enum, ignore_case = true, value_name = "NOTX|TX")]
    pub mode: Mode,
    /// SENDANDPURGE, SENDANDRECEIVE, SERVER or CLIENT (case-insensitive)
    #[arg(
        value_enum,
        ignore_case = true,
        value_name = "SENDANDPURGE|SENDANDRECEIVE|SERVER|CLIENT"
    )]
    pub scenario: Scenario,
    /// The queue (path or format name), created if missing, e.g. '.\private$\perf'
    #[arg(value_name = "QUEUE")]
    pub queue: String,
    /// SERVER and CLIENT: where the server replies after each run
    #[arg(value_name = "RESPONSE-QUEUE")]
    pub response_queue: Option<String>,
    /// A running broker, e.g. http://127.0.0.1:1801 or unix:/run/mqd/mqd.sock (absent: an
    /// embedded broker in a temporary directory, started and stopped by mqperf). With
    /// --forward: broker A, where every send goes
    #[arg(long, value_name = "URL")]
    pub broker: Option<String>,
    /// Store-and-forward: send through broker A to QUEUE on broker B, receive on B (no
    /// --broker: two embedded brokers)
    #[arg(long)]
    pub forward: bool,
    /// With --forward and --broker: broker B, where QUEUE lives and every receive happens
    /// (its host:port names the queue for A)
    #[arg(long, value_name = "URL")]
    pub receive_broker: Option<String>,
    /// Comma list of empty, string:N, strings, xml, order, int, all
    #[arg(long, value_name = "LIST", default_value = "string:1000", value_parser = parse_payloads)]
    pub payload: PayloadList,
    /// Comma list of binary, xml, json, raw, manual, all
    #[arg(long, value_name = "LIST", default_value = "binary", value_parser = parse_formatters)]
    pub formatter: FormatterList,
    /// How the broker keeps messages (NOTX only; TX messages are always transactional, which
    /// implies recoverable, and this option is ignored)
    #[arg(long, value_enum, ignore_case = true, default_value_t = DeliveryKind::Express)]
    pub delivery: DeliveryKind,
    /// Messages per run
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Runs per payload x formatter (the report gives the median and min-max)
    #[arg(long, value_name = "R", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// One JSON object per line on stdout (banner on stderr, no progress bar)
    #[arg(long)]
    pub json: bool,
    /// Longest wait, in seconds, for a message or reply that should come
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// SENDANDPURGE and SENDANDRECEIVE: send with N concurrent clients, each on its own
    /// connection with its own pipelining sender, sharing --count (the e2e phase too)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub clients: u32,
    /// Open loop: send at N messages/s in all (all --clients together) instead of as fast as
    /// possible; every latency is measured from the message's intended send time, so a stall
    /// counts for every message due during it (coordinated omission corrected). Paces the
    /// send and e2e phases (not a --backlog fill)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub rate: Option<u64>,
    /// SENDANDPURGE and SENDANDRECEIVE: spread the messages round-robin over N queues, named
    /// QUEUE-0 ... QUEUE-<N-1> (N > 1), each created if missing
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub queues: u32,
    /// SENDANDRECEIVE: receive with N consumers at once, each its own stream, consumer k on
    /// queue k mod --queues (N >= --queues; default: one per queue). The report gives the
    /// fewest and most messages one consumer got
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub consumers: Option<u32>,
    /// SENDANDRECEIVE: per run, fill the queue(s) with N messages (op `fill`, closed loop),
    /// then time draining them (op `drain`), instead of the send, receive and e2e phases
    /// (--count is not used)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub backlog: Option<u64>,
    /// The broker process (with --broker) whose resident memory (VmRSS) the report shows at
    /// the end of each phase; without --broker the embedded broker's (this process's) is shown
    #[arg(long, value_name = "PID")]
    pub broker_pid: Option<u32>,
    /// Acknowledge every received message on its own (as RabbitMQ and NATS consumers do)
    /// instead of in batches
    #[arg(long)]
    pub ack_each: bool,
    /// Create the queue(s) with target journaling: every received message is copied to
    /// QUEUE;JOURNAL (no journal quota), to measure what journaling costs
    #[arg(long)]
    pub journal: bool,
    /// TX: every send is an explicit transaction (begin, send one message, commit) and every
    /// receive one too (begin, receive one message, commit), each awaited before the next,
    /// instead of pipelined single-message transactions (with --clients N: N such loops at once)
    #[arg(long)]
    pub one_at_a_time: bool,
    /// With --one-at-a-time: every receive transaction is begin, then receive_and_commit (the
    /// receive and the commit in one round trip; the broker commits whatever message it
    /// takes) instead of begin, receive, commit
    #[arg(long)]
    pub receive_and_commit: bool,
    /// Every send is one call of the client's one-message send (NOTX: `Queue::send`, TX:
    /// `Queue::send_tx`, a single-message transaction), awaited before the next: what an
    /// application that sends one message at a time gets (with --clients N: N such loops)
    #[arg(long, conflicts_with = "one_at_a_time")]
    pub send_one: bool,
    /// Every receive is one unary receive (`Queue::receive`; on a TX queue a single-message
    /// transaction, on disk before the message is returned), awaited before the next, instead
    /// of a streaming consumer
    #[arg(long, conflicts_with_all = ["one_at_a_time", "ack_each"])]
    pub receive_one: bool,
    /// SENDANDPURGE: leave the last run's messages in the queue(s) instead of purging them
    /// (to look at, or restart the broker with, a known load: e.g. --queues 100000 --count
    /// 100000 leaves one message in each queue)
    #[arg(long)]
    pub keep: bool,
    /// Run against this system; repeat to run several one after another and report them side
    /// by side: `mq` (the --broker, or an embedded one), `amqp://user:password@host:port`
    /// (RabbitMQ) or `nats://host:port` (NATS JetStream). Default: mq only
    #[arg(long, value_name = "URL", value_parser = parse_target)]
    pub target: Vec<Target>,
    /// Also write the report's rows (the JSON lines' fields) to FILE as CSV
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    /// Draw the figures of this run to FILE: SVG, or PNG when FILE ends in .png
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// The CA certificate (PEM) that signed the broker's certificate, for --broker https://...
    #[arg(long, value_name = "FILE", env = "MQ_CA")]
    pub ca: Option<std::path::PathBuf>,
    /// Authenticate as this user (password from MQ_PASSWORD)
    #[arg(long, value_name = "NAME", env = "MQ_USER")]
    pub user: Option<String>,
    /// Authenticate with this bearer token
    #[arg(long, value_name = "TOKEN", env = "MQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// A parsed `--payload` list (a newtype, so clap takes it as one value).
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadList(pub Vec<PayloadKind>);

/// A parsed `--formatter` list.
#[derive(Debug, Clone, PartialEq)]
pub struct FormatterList(pub Vec<FormatterKind>);

fn parse_payloads(s: &str) -> Result<PayloadList, String> {
    PayloadKind::parse_list(s).map(PayloadList)
}

fn parse_formatters(s: &str) -> Result<FormatterList, String> {
    FormatterKind::parse_list(s).map(FormatterList)
}

impl Cli {
    /// Checks what clap cannot (the response queue) and builds the configuration. `progress`:
    /// whether a progress bar may be drawn (the caller knows about terminals); never with
    /// `--json`. `command`: the command line, for the banner.
    pub fn into_config(self, progress: bool, command: String) -> Result<Config, clap::Error> {
        let usage = |kind: ErrorKind, msg: String| Cli::command().error(kind, msg);
        let scenario = self.scenario;
        for name in std::iter::once(&self.queue).chain(&self.response_queue) {
            if let Err(e) = FormatName::parse(name) {
                return Err(usage(ErrorKind::ValueValidation, e.to_string()));
            }
        }
        match (&self.response_queue, scenario.needs_response_queue()) {
            (None, true) => {
                return Err(usage(
                    ErrorKind::MissingRequiredArgument,
                    format!(
                        "{} needs a <RESPONSE-QUEUE> after <QUEUE> (SERVER replies there, CLIENT waits there)",
                        scenario.name()
                    ),
                ))
            }
            (Some(r), false) => {
                return Err(usage(
                    ErrorKind::ArgumentConflict,
                    format!(
                        "{} takes no <RESPONSE-QUEUE> (got `{r}`); only SERVER and CLIENT do",
                        scenario.name()
                    ),
                ))
            }
            (Some(r), true) if same_queue(r, &self.queue) => {
                return Err(usage(
                    ErrorKind::ArgumentConflict,
                    format!("<RESPONSE-QUEUE> `{r}` must differ from <QUEUE>"),
                ))
            }
            _ => {}
        }
        self.check_forward()?;
        if self.clients > 1 && scenario.needs_response_queue() {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                format!(
                    "--clients applies to SENDANDPURGE and SENDANDRECEIVE only, not {}",
                    scenario.name()
                ),
            ));
        }
        self.check_load_shape()?;
        self.check_targets()?;
        Ok(Config {
            mode: self.mode,
            scenario,
            queue: self.queue,
            response_queue: self.response_queue,
            broker: self.broker,
            forward: self.forward,
            receive_broker: self.receive_broker,
            payloads: self.payload.0,
            formatters: self.formatter.0,
            delivery: self.delivery,
            count: self.count,
            runs: self.runs,
            json: self.json,
            timeout: Duration::from_secs(self.timeout),
            clients: self.clients,
            rate: self.rate,
            queues: self.queues,
            consumers: self.consumers,
            backlog: self.backlog,
            broker_pid: self.broker_pid,
            ack_each: self.ack_each,
            journal: self.journal,
            one_at_a_time: self.one_at_a_time,
            receive_and_commit: self.receive_and_commit,
            send_one: self.send_one,
            receive_one: self.receive_one,
            keep: self.keep,
            targets: self.target,
            csv: self.csv,
            plot: self.plot,
            progress: progress && !self.json,
            command,
        })
    }
}

impl Cli {
    /// `--rate`, `--queues`, `--consumers`, `--backlog`, `--broker-pid`: which scenarios take
    /// them and how they combine.
    fn check_load_shape(&self) -> Result<(), clap::Error> {
        let usage = |kind: ErrorKind, msg: String| Cli::command().error(kind, msg);
        let scenario = self.scenario;
        let only = |flag: &str, ok: bool, which: &str| {
            if ok {
                Ok(())
            } else {
                Err(usage(
                    ErrorKind::ArgumentConflict,
                    format!("{flag} applies to {which} only, not {}", scenario.name()),
                ))
            }
        };
        let purge_or_receive =
            matches!(scenario, Scenario::SendAndPurge | Scenario::SendAndReceive);
        if self.rate.is_some() {
            only(
                "--rate",
                scenario != Scenario::Server,
                "the sending scenarios (SENDANDPURGE, SENDANDRECEIVE, CLIENT)",
            )?;
        }
        if self.queues > 1 {
            only(
                "--queues",
                purge_or_receive,
                "SENDANDPURGE and SENDANDRECEIVE",
            )?;
        }
        if self.consumers.is_some() {
            only(
                "--consumers",
                scenario == Scenario::SendAndReceive,
                "SENDANDRECEIVE",
            )?;
        }
        if self.backlog.is_some() {
            only(
                "--backlog",
                scenario == Scenario::SendAndReceive,
                "SENDANDRECEIVE",
            )?;
        }
        if let Some(c) = self.consumers {
            if c < self.queues {
                return Err(usage(
                    ErrorKind::ArgumentConflict,
                    format!(
                        "--consumers {c} is fewer than --queues {}: every queue needs a consumer",
                        self.queues
                    ),
                ));
            }
        }
        if self.one_at_a_time && self.mode != crate::config::Mode::Tx {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                "--one-at-a-time applies to TX only (it times explicit transactions)".to_string(),
            ));
        }
        if self.receive_and_commit && !self.one_at_a_time {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                "--receive-and-commit needs --one-at-a-time (it changes how each receive transaction ends)".to_string(),
            ));
        }
        if self.broker_pid.is_some() && self.broker.is_none() {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                "--broker-pid names the process of --broker URL; without --broker the embedded broker runs in mqperf's own process and its RSS is shown anyway".to_string(),
            ));
        }
        Ok(())
    }

    /// `--forward` and `--receive-broker`: together or not at all with `--broker`; local queue
    /// paths; two different brokers; SERVER/CLIENT only against running brokers.
    fn check_forward(&self) -> Result<(), clap::Error> {
        let usage = |kind: ErrorKind, msg: String| Cli::command().error(kind, msg);
        if !self.forward {
            return match &self.receive_broker {
                Some(_) => Err(usage(
                    ErrorKind::ArgumentConflict,
                    "--receive-broker applies only with --forward (broker B, where a forwarded QUEUE lives)".to_string(),
                )),
                None => Ok(()),
            };
        }
        for name in std::iter::once(&self.queue).chain(&self.response_queue) {
            if let Err(e) = forward::local_queue(name) {
                return Err(usage(ErrorKind::ValueValidation, e));
            }
        }
        match (&self.broker, &self.receive_broker) {
            (Some(_), None) => {
                return Err(usage(
                    ErrorKind::MissingRequiredArgument,
                    "--forward with --broker needs --receive-broker URL (broker B, where QUEUE lives); without --broker mqperf starts two embedded brokers".to_string(),
                ))
            }
            (None, Some(_)) => {
                return Err(usage(
                    ErrorKind::MissingRequiredArgument,
                    "--receive-broker needs --broker URL too (broker A, where every send goes)"
                        .to_string(),
                ))
            }
            (Some(a), Some(b)) => {
                let addr = |url: &str, flag: &str| {
                    forward::BrokerAddr::from_url(url)
                        .map_err(|e| usage(ErrorKind::ValueValidation, format!("{flag} {e}")))
                };
                forward::Route::new(addr(a, "--broker")?, addr(b, "--receive-broker")?)
                    .map_err(|e| usage(ErrorKind::ArgumentConflict, e))?;
            }
            (None, None) if self.scenario.needs_response_queue() => {
                return Err(usage(
                    ErrorKind::MissingRequiredArgument,
                    format!(
                        "{} with --forward needs --broker URL_A --receive-broker URL_B: SERVER and CLIENT are two processes and must use the same two brokers",
                        self.scenario.name()
                    ),
                ))
            }
            (None, None) => {}
        }
        Ok(())
    }
}

impl Cli {
    /// Peer targets run the white paper's scenarios and modes only: the mq-specific options
    /// are refused with them, and `--plot` needs an .svg or .png name.
    fn check_targets(&self) -> Result<(), clap::Error> {
        let usage = |kind: ErrorKind, msg: String| Cli::command().error(kind, msg);
        if let Some(p) = &self.plot {
            if crate::plot::Format::of(p).is_none() {
                return Err(usage(
                    ErrorKind::ValueValidation,
                    format!(
                        "--plot {}: the file name must end in .svg or .png",
                        p.display()
                    ),
                ));
            }
        }
        let Some(peer) = self.target.iter().find(|t| **t != Target::Mq) else {
            return Ok(());
        };
        let spread = [
            ("--clients", self.clients > 1),
            ("--queues", self.queues > 1),
            ("--consumers", self.consumers.is_some()),
        ];
        if let Some((flag, _)) = spread.iter().find(|(_, set)| *set) {
            if self.scenario != Scenario::SendAndReceive || self.mode != crate::config::Mode::Notx {
                return Err(usage(
                    ErrorKind::ArgumentConflict,
                    format!(
                        "{flag} with --target {} applies to NOTX SENDANDRECEIVE only",
                        peer.display_url()
                    ),
                ));
            }
            if let Some(c) = self.consumers {
                if c != self.queues {
                    return Err(usage(
                        ErrorKind::ArgumentConflict,
                        format!(
                            "--consumers {c} with --target {}: a peer's run has one consumer per queue (--consumers {})",
                            peer.display_url(),
                            self.queues
                        ),
                    ));
                }
            }
        }
        let mq_only = [
            ("--forward", self.forward),
            ("--rate", self.rate.is_some()),
            ("--backlog", self.backlog.is_some()),
            ("--broker-pid", self.broker_pid.is_some()),
            ("--receive-and-commit", self.receive_and_commit),
        ];
        if let Some((flag, _)) = mq_only.iter().find(|(_, set)| *set) {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                format!(
                    "{flag} applies to the mq target only, not to --target {}",
                    peer.display_url()
                ),
            ));
        }
        Ok(())
    }
}

/// `--target`.
fn parse_target(s: &str) -> Result<Target, String> {
    Target::parse(s)
}

/// Queue names compare case-insensitively, `/` and `\` alike.
fn same_queue(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.trim().replace('/', "\\").to_ascii_lowercase();
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Cli::try_parse_from(std::iter::once("mqperf").chain(args.iter().copied()))?
            .into_config(true, String::new())
    }

    #[test]
    fn parses_the_white_papers_command_line() {
        let c = parse(&["notx", "SendAndReceive", r".\private$\perf"]).unwrap();
        assert_eq!((c.mode, c.scenario), (Mode::Notx, Scenario::SendAndReceive));
        assert_eq!((c.count, c.runs), (10_000, 5));
        assert_eq!(c.payloads, vec![PayloadKind::Str(1000)]);
        assert_eq!(c.formatters, vec![FormatterKind::Binary]);
        assert!(c.broker.is_none() && c.progress);

        let c = parse(&[
            "TX",
            "client",
            r".\private$\q",
            r".\private$\r",
            "--payload",
            "order,int",
            "--formatter",
            "all",
            "--delivery",
            "RECOVERABLE",
            "--count",
            "7",
            "--runs",
            "1",
            "--json",
            "--broker",
            "http://h:1",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::Tx);
        assert_eq!(c.response_queue.as_deref(), Some(r".\private$\r"));
        assert_eq!(c.formatters.len(), 5);
        assert_eq!(c.delivery, DeliveryKind::Recoverable);
        assert!(c.json && !c.progress);
    }

    #[test]
    fn forward_options() {
        let q = r".\private$\perf";
        let c = parse(&["NOTX", "SENDANDRECEIVE", q, "--forward"]).unwrap();
        assert!(c.forward && c.broker.is_none() && c.receive_broker.is_none());
        let c = parse(&[
            "TX",
            "CLIENT",
            q,
            r".\private$\reply",
            "--forward",
            "--broker",
            "http://127.0.0.1:1801",
            "--receive-broker",
            "http://127.0.0.1:1802",
        ])
        .unwrap();
        assert_eq!(c.receive_broker.as_deref(), Some("http://127.0.0.1:1802"));
        assert!(!parse(&["NOTX", "SENDANDPURGE", q]).unwrap().forward);

        let kind = |args: &[&str]| parse(args).unwrap_err().kind();
        let a = "http://127.0.0.1:1801";
        assert_eq!(
            kind(&["NOTX", "SENDANDRECEIVE", q, "--receive-broker", a]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&["NOTX", "SENDANDRECEIVE", q, "--forward", "--broker", a]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            kind(&[
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--forward",
                "--receive-broker",
                a
            ]),
            ErrorKind::MissingRequiredArgument
        );
        let both = ["--forward", "--broker", a, "--receive-broker"];
        let with = |b: &str, queue: &str| {
            let mut v = vec!["NOTX", "SENDANDRECEIVE", queue];
            v.extend(both);
            v.push(b);
            kind(&v)
        };
        assert_eq!(with(a, q), ErrorKind::ArgumentConflict);
        assert_eq!(with("127.0.0.1:1802", q), ErrorKind::ValueValidation);
        assert_eq!(
            with(
                "http://127.0.0.1:1802",
                r"DIRECT=TCP:127.0.0.1:1802\private$\perf"
            ),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind(&["NOTX", "SERVER", q, r".\private$\r", "--forward"]),
            ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn usage_errors() {
        let kind = |args: &[&str]| parse(args).unwrap_err().kind();
        assert_eq!(
            kind(&["XA", "SENDANDPURGE", r".\private$\q"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            kind(&["NOTX", "SEND", r".\private$\q"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            kind(&["NOTX", "SERVER", r".\private$\q"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            kind(&["NOTX", "SENDANDPURGE", r".\private$\q", r".\private$\r"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&["NOTX", "CLIENT", r".\private$\q", r".\PRIVATE$\Q"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&["NOTX", "SENDANDPURGE", "bad name"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind(&["NOTX", "SENDANDPURGE", r".\private$\q", "--payload", "blob"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind(&["NOTX", "SENDANDPURGE", r".\private$\q", "--count", "0"]),
            ErrorKind::ValueValidation
        );
        let e = parse(&[
            "NOTX",
            "SENDANDPURGE",
            r".\private$\q",
            "--formatter",
            "soap",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("manual"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }
}
