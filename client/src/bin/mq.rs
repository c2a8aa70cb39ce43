//! `mq`: the mq command line. Queue administration, send, receive and peek, and the outgoing
//! queues of store-and-forward, against one broker.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use clap::{Args, Parser, Subcommand};
use mq_client::{
    Client, ClientOptions, ConsumerOptions, DeadLetterInfo, Delivery, Message, OutgoingQueue,
    QueueOptions, ReceivedMessage, SenderOptions, TxId,
};

const AFTER_HELP: &str = "\
Queue names are MSMQ path names or format names, with \\ or / as separators:
  .\\private$\\orders   DIRECT=OS:.\\private$\\orders   DIRECT=TCP:127.0.0.1:1801\\private$\\orders
  FORMATNAME:DIRECT=OS:.\\private$\\a,DIRECT=OS:.\\private$\\b   (send only: one copy to each)
Quote them in the shell: mq send '.\\private$\\orders' hello

Exit codes:
  0  success
  1  error (one line on stderr says what and why)
  2  usage error (bad flags or arguments)
  3  the timeout passed before --count messages arrived (those that did arrive are printed)";

const OUTGOING_HELP: &str = "\
Store-and-forward: a send to a queue on another broker is stored in this broker's outgoing queue
for that broker, and a forwarder moves it on and removes it here once the destination has stored
it (if the destination is down, messages wait and the forwarder retries).

States:
  INACTIVE    nothing to send, not connected
  CONNECTING  connecting to the destination broker
  CONNECTED   connected, forwarding messages as they come
  WAITING     the last attempt failed (see LAST-ERROR); retrying with back-off at NEXT-RETRY
  ONHOLD      paused by an operator (mq outgoing pause); messages wait until mq outgoing resume

An empty outgoing queue can be deleted (mq outgoing delete DEST); one that stays empty and unused
for mqd --outgoing-idle-expiry (default 1h) is deleted by the broker. The messages waiting for a
destination that will never come back can be purged (mq outgoing purge DEST).

DEST is the destination broker as `mq outgoing list` shows it (host:port), or the format name of
any queue on that broker, e.g. 'DIRECT=TCP:10.0.0.5:1801\\private$\\orders'.

Exit codes: 0 success, 1 error (one line on stderr), 2 usage error.";

/// The mq command line: administer queues, send, receive and peek messages.
#[derive(Debug, Parser)]
#[command(name = "mq", version, after_help = AFTER_HELP)]
struct Cli {
    /// Broker URL: http://HOST:PORT, https://HOST:PORT (TLS), or unix:PATH (the broker's Unix
    /// socket, mqd --unix-socket).
    #[arg(long, global = true, env = "MQ_BROKER", default_value = mq_client::DEFAULT_BROKER_URL, value_name = "URL", help_heading = CONNECTION)]
    broker: String,
    /// Authenticate as this user; the password is read from MQ_PASSWORD or a prompt.
    #[arg(long, global = true, env = "MQ_USER", value_name = "NAME", help_heading = CONNECTION)]
    user: Option<String>,
    /// Authenticate with this bearer token.
    #[arg(
        long,
        global = true,
        env = "MQ_TOKEN",
        hide_env_values = true,
        conflicts_with = "user",
        help_heading = CONNECTION
    )]
    token: Option<String>,
    /// The CA certificate (PEM) that signed the broker's certificate (for https:// brokers).
    #[arg(long, global = true, env = "MQ_CA", value_name = "FILE", help_heading = CONNECTION)]
    ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for brokers that require one (mTLS); needs --key.
    #[arg(long, global = true, env = "MQ_CERT", requires = "key", value_name = "FILE", help_heading = CONNECTION)]
    cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, global = true, env = "MQ_KEY", value_name = "FILE", help_heading = CONNECTION)]
    key: Option<std::path::PathBuf>,
    /// Most time to connect to the broker (TCP and HTTP/2 handshake), e.g. 500ms, 5s.
    #[arg(long, global = true, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION", help_heading = CONNECTION)]
    connect_timeout: Duration,
    /// Most time a call waits for the broker's answer, beyond any wait it asks for
    /// (receive --timeout): a silent broker fails the command instead of hanging it.
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", help_heading = CONNECTION)]
    call_timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

/// The heading of the options every command takes (where the broker is, who is calling).
const CONNECTION: &str = "Connection (every command)";

/// What `mq receive` and `mq peek` allow beyond --timeout, in all, for the broker to answer.
const RECEIVE_ANSWER_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, delete, inspect, list and purge queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Send a message (or --count N of them, pipelined) to a queue or a multiple-element format name.
    #[command(after_help = AFTER_HELP)]
    Send(SendArgs),
    /// Receive (remove) messages, printing each body on its own line. A message from a
    /// dead-letter queue is preceded by lines saying why it is there and where it was going.
    #[command(after_help = AFTER_HELP)]
    Receive(ReceiveArgs),
    /// Show up to --count messages at the head of a queue without removing them (waits up to
    /// --timeout for the first; exit 3 if fewer than --count are there).
    #[command(after_help = AFTER_HELP)]
    Peek(ReceiveArgs),
    /// Page through a queue without removing anything, from the head (or --from a message),
    /// printing every waiting message in receive order; only one page (at most 1000 messages)
    /// is held in memory at a time.
    Browse(BrowseArgs),
    /// Outgoing queues (store-and-forward to other brokers): list, pause, resume, delete.
    #[command(subcommand, after_help = OUTGOING_HELP)]
    Outgoing(OutgoingCommand),
    /// Transactions: whether one whose outcome was unknown committed.
    #[command(subcommand)]
    Tx(TxCommand),
    /// About the broker: name, version, protocol version, uptime, addresses, data directory
    /// use and limits.
    Info {
        /// One JSON object (the fields of the GetBrokerInfo answer) instead of the lines.
        #[arg(long)]
        json: bool,
    },
    /// Move a waiting message by id: between a queue and its subqueues (QUEUE;name), or out
    /// of a dead-letter queue back to where it was going (replay; alias `requeue`).
    #[command(alias = "requeue", after_help = MOVE_HELP)]
    Move(MoveArgs),
    /// One line per queue: messages, bytes, in flight, and messages sent and received per
    /// second over the last --interval (like top with --watch; Ctrl-C ends it).
    Stats(StatsArgs),
}

const MOVE_HELP: &str = "\
Within a queue (MSMQ subqueues): DEST is a subqueue name, created on first use; '' (or nothing)
is the main queue. Each move adds 1 to the message's move count and resets its abort count.
  mq move '.\\private$\\orders' ID poison        mq move '.\\private$\\orders;poison' ID ''
Out of a dead-letter queue (replay): DEST is a queue's format name; '' (or nothing) is the
message's original destination. It keeps its id and properties; the dead-letter record and
timers that passed are removed.
  mq requeue 'DIRECT=OS:.\\SYSTEM$;DEADLETTER' ID          mq move '.\\SYSTEM$;DEADXACT' ID '.\\private$\\other'
Exit codes: 0 moved, 1 error (one line on stderr: no such message, bad name, no right), 2 usage.";

#[derive(Debug, Args)]
struct MoveArgs {
    /// Where the message is: a queue, a subqueue (QUEUE;name) or a dead-letter queue.
    queue: String,
    /// The message's id (as `mq receive --json` or `mq peek --json` shows it).
    id: String,
    /// A subqueue name ('' = the main queue), or for a dead letter a queue's format name
    /// ('' = its original destination).
    #[arg(default_value = "")]
    destination: String,
    /// The moved message (without body) as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct StatsArgs {
    /// Refresh in place every --interval until Ctrl-C (or --iterations).
    #[arg(long)]
    watch: bool,
    /// The interval the rates are measured over, e.g. 500ms, 1s, 5s.
    #[arg(long, default_value = "1s", value_parser = stats_interval, value_name = "DURATION")]
    interval: Duration,
    /// With --watch: stop after N intervals. Default: until Ctrl-C.
    #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// One JSON document per interval instead of the table: {"time_ms", "interval_ms",
    /// "queues": [{"name", "messages", "bytes", "in_flight", "sent", "received",
    /// "sent_in_interval", "received_in_interval", "sent_per_sec", "received_per_sec"}]}.
    #[arg(long)]
    json: bool,
}

/// An --interval: 10ms to 1h.
fn stats_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err("must be 10ms to 1h".into());
    }
    Ok(d)
}

/// `mq stats`: snapshots of the queue list an --interval apart, printed as rates.
async fn stats(
    client: &Client,
    a: StatsArgs,
    out: &mut impl std::io::Write,
) -> Result<(), Failure> {
    use std::io::IsTerminal;
    let redraw = a.watch && !a.json && std::io::stdout().is_terminal();
    let rounds = if a.watch { a.iterations } else { Some(1) };
    let mut before = client.list_queues().await?;
    let mut at = std::time::Instant::now();
    let mut done = 0u64;
    while rounds.is_none_or(|n| done < n) {
        tokio::time::sleep_until((at + a.interval).into()).await;
        let now = client.list_queues().await?;
        let now_at = std::time::Instant::now();
        let rows = mq_client::stats::rates(&before, &now, now_at - at);
        if a.json {
            let time_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let doc = serde_json::json!({
                "time_ms": time_ms,
                "interval_ms": (now_at - at).as_millis() as u64,
                "queues": rows,
            });
            writeln!(out, "{doc}")?;
        } else {
            if redraw {
                // Home and clear, like top.
                write!(out, "\x1b[H\x1b[2J")?;
            } else if done > 0 {
                writeln!(out)?;
            }
            write!(out, "{}", mq_client::stats::table(&rows))?;
        }
        out.flush()?;
        (before, at) = (now, now_at);
        done += 1;
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
enum TxCommand {
    /// Whether transaction ID committed: prints committed, aborted, in-progress or unknown and
    /// a line of detail (exit 0 whatever the answer). The broker remembers commits for
    /// mqd --tx-outcome-retention (default 24h).
    Status {
        /// The id `mq send --tx` printed with "outcome unknown".
        id: String,
        /// One JSON object: {"id", "outcome", "time_ms", "detail", "retention_ms"}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum OutgoingCommand {
    /// List the outgoing queues: destination broker, state, counters, next retry, last error.
    #[command(after_help = OUTGOING_HELP)]
    List {
        /// A JSON array of objects instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Pause forwarding to a destination broker (state ONHOLD): its messages wait here.
    #[command(after_help = OUTGOING_HELP)]
    Pause {
        /// host:port as `mq outgoing list` shows it, or the format name of a queue on that broker.
        #[arg(value_name = "DEST")]
        destination: String,
        /// The resulting queue as a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Resume forwarding to a paused destination broker.
    #[command(after_help = OUTGOING_HELP)]
    Resume {
        /// host:port as `mq outgoing list` shows it, or the format name of a queue on that broker.
        #[arg(value_name = "DEST")]
        destination: String,
        /// The resulting queue as a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete an empty outgoing queue (refused while it holds messages); the next send to that
    /// broker creates a new one.
    #[command(after_help = OUTGOING_HELP)]
    Delete {
        /// host:port as `mq outgoing list` shows it, or the format name of a queue on that broker.
        #[arg(value_name = "DEST")]
        destination: String,
    },
    /// Remove every message waiting to be forwarded to a destination broker (one that will
    /// never come back); messages in flight to it stay (pause it first to have none). Purged
    /// messages that asked for negative acknowledgements get NACK_PURGED.
    #[command(after_help = OUTGOING_HELP)]
    Purge {
        /// host:port as `mq outgoing list` shows it, or the format name of a queue on that broker.
        #[arg(value_name = "DEST")]
        destination: String,
    },
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Create a queue.
    Create {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
        /// Transactional queue (fixed at creation): accepts only transactional sends.
        #[arg(long)]
        transactional: bool,
        /// Most bytes the queue may hold (each message counts its body, label, ids and 128 bytes);
        /// sends past it are refused. Default: no limit but the broker's quotas.
        #[arg(long, value_name = "BYTES")]
        quota_bytes: Option<u64>,
        /// A free-text label (at most 250 characters). Default: none.
        #[arg(
            long,
            default_value = "",
            hide_default_value = true,
            value_name = "TEXT"
        )]
        label: String,
        /// Transactional queues: move a message whose receive was aborted N times to the
        /// subqueue NAME;poison instead of handing it out again (0 = never).
        #[arg(long, default_value_t = 0, value_name = "N")]
        max_aborts: u32,
        /// Target journaling: keep a copy of every message received from the queue in
        /// NAME;JOURNAL (read it with mq receive/peek/browse, empty it with mq queue purge).
        #[arg(long)]
        journal: bool,
        /// Most bytes NAME;JOURNAL may hold; past it received messages are not copied (counted
        /// as journal_not_kept). Default: 1 GiB.
        #[arg(long, value_name = "BYTES", visible_alias = "journal-quota-bytes")]
        journal_quota: Option<u64>,
    },
    /// Delete a queue and every message in it.
    Delete {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
    },
    /// Show a queue's properties and counters.
    Info {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
        /// One JSON object instead of the text lines.
        #[arg(long)]
        json: bool,
    },
    /// Change a queue's properties (needs admin on it); the change is on disk when this
    /// returns. Flags left out keep their value.
    Set {
        name: String,
        /// A free-text label (at most 250 characters).
        #[arg(long)]
        label: Option<String>,
        /// Most bytes the queue may hold (body + label + overhead per message).
        #[arg(long, visible_alias = "quota")]
        quota_bytes: Option<u64>,
        /// Remove the queue quota (only the broker's applies).
        #[arg(long, conflicts_with = "quota_bytes")]
        no_quota: bool,
        /// Target journaling on or off (received messages are copied to NAME;JOURNAL).
        #[arg(long, value_name = "on|off", value_parser = on_off)]
        journal: Option<bool>,
        /// Most bytes NAME;JOURNAL may hold.
        #[arg(long, value_name = "BYTES", visible_alias = "journal-quota-bytes")]
        journal_quota: Option<u64>,
        /// Transactional queues: move a message whose receive was aborted N times to
        /// NAME;poison (0 = never).
        #[arg(long, value_name = "N")]
        max_aborts: Option<u32>,
        /// The resulting queue as `mq queue info --json` shows it.
        #[arg(long)]
        json: bool,
    },
    /// Remove every waiting message.
    Purge {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
    },
    /// List every queue.
    List {
        /// A JSON array of objects instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Grant rights on a queue (needs admin on it). WHO is a user, group:NAME, everyone
    /// (every authenticated caller) or anonymous; RIGHTS are send, receive, peek, admin, all.
    Grant {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
        /// A user, group:NAME, everyone (every authenticated caller) or anonymous.
        who: String,
        /// Comma-separated: send, receive, peek, admin, or all.
        #[arg(value_name = "RIGHT[,RIGHT..]")]
        rights: String,
    },
    /// Revoke rights on a queue (needs admin on it).
    Revoke {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
        /// A user, group:NAME, everyone (every authenticated caller) or anonymous.
        who: String,
        /// Comma-separated: send, receive, peek, admin, or all.
        #[arg(value_name = "RIGHT[,RIGHT..]")]
        rights: String,
    },
    /// Show who may do what with a queue (needs admin on it).
    Acl {
        /// The queue: a path name (.\private$\orders) or a format name.
        name: String,
        /// One JSON object instead of the text lines: each principal and its list of rights.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct SendArgs {
    /// Destination: a path name, a format name, or a multiple-element format name.
    destination: String,
    // Not a doc comment: clap turns `{n}` in help text into a line break (see `placeholder_help`).
    #[arg(help = placeholder_help(
        "The body. With --count, {n} in it becomes the message's number, 1..N. Absent (and no --file): read from stdin"
    ))]
    body: Option<String>,
    /// Read the body from this file.
    #[arg(long, conflicts_with = "body")]
    file: Option<std::path::PathBuf>,
    /// The message's label (at most 250 characters). Default: none.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "TEXT"
    )]
    label: String,
    /// Priority, 0 (lowest) to 7 (highest); non-transactional queues deliver higher first.
    #[arg(long, default_value_t = 3, value_name = "0-7")]
    priority: u8,
    /// Correlation id (at most 255 characters), e.g. the id of the request this answers.
    /// Default: none.
    #[arg(long, default_value = "", hide_default_value = true, value_name = "ID")]
    correlation_id: String,
    /// An application-defined number carried with the message (MSMQ's AppSpecific).
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    app_specific: i64,
    /// The queue the receiver should answer to (a path or format name). Default: none.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "QUEUE"
    )]
    response_queue: String,
    /// Recoverable delivery: acknowledged once on disk, survives a broker crash.
    #[arg(long)]
    recoverable: bool,
    /// Send N messages, pipelined (see BODY for numbering them).
    #[arg(long, default_value_t = 1, value_name = "N")]
    count: u64,
    /// Send in one transaction (all --count messages commit together, or none do); required for
    /// transactional queues.
    #[arg(long, conflicts_with = "recoverable")]
    tx: bool,
    /// With --tx: the transaction's id (default: a new one). Repeating a send whose outcome was
    /// unknown with the id it printed commits at most once ("already committed").
    #[arg(long, requires = "tx", value_name = "ID")]
    tx_id: Option<String>,
    /// Send each message as its own transaction (MSMQ's single-message transaction), pipelined:
    /// for transactional queues. If the connection breaks, the error names the transaction ids
    /// whose outcome is unknown (`mq tx status ID` tells; `--tx --tx-id ID` repeats one at most
    /// once).
    #[arg(long, conflicts_with_all = ["recoverable", "tx"])]
    tx_each: bool,
    /// Time-to-reach-queue (e.g. 500ms, 5s, 1m): the message must reach its destination queue
    /// within this time of the send, else it goes to the dead-letter queue with class
    /// ReachQueueTimeout (it matters for queues on other brokers, reached by store-and-forward).
    /// Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = time_limit)]
    ttrq: Option<Duration>,
    /// Time-to-be-received (e.g. 500ms, 5s, 1m): the message must be received within this time
    /// of the send, else it goes to the dead-letter queue with class ReceiveTimeout.
    /// Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = time_limit)]
    ttbr: Option<Duration>,
    /// The administration queue (path or format name, possibly on another broker) where the
    /// broker posts acknowledgements of this message (with --ack).
    #[arg(long, value_name = "QUEUE", requires = "ack")]
    admin_queue: Option<String>,
    /// Which acknowledgements to post to --admin-queue (MSMQ's acknowledgement types):
    /// full-reach-queue, full-receive, nack-reach-queue, nack-receive, or the single kinds
    /// pos-arrival, pos-receive, neg-arrival, neg-receive, joined with `+`. Each ack is a
    /// message whose class says what happened (`mq receive AQ --json` shows it) and whose
    /// correlation id is the original message's id.
    #[arg(long, value_name = "TYPE", value_parser = mq_client::ack::parse_type, requires = "admin_queue")]
    ack: Option<u8>,
    /// Source journaling: once each message reaches its next hop (stored here, or accepted by
    /// the broker it is forwarded to), this broker keeps a copy in SYSTEM$;JOURNAL.
    #[arg(long)]
    journal: bool,
}

/// Help text with a literal `{n}`: clap turns a plain `{n}` into a line break, so its `n` is
/// set in bold, which keeps the braces apart in the raw text and reads `{n}` with or without
/// colours.
fn placeholder_help(text: &str) -> clap::builder::StyledStr {
    let bold = clap::builder::styling::Style::new().bold();
    text.replace("{n}", &format!("{{{bold}n{bold:#}}}")).into()
}

/// `on` or `off` (also yes/no, true/false).
fn on_off(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "yes" | "true" => Ok(true),
        "off" | "no" | "false" => Ok(false),
        _ => Err(format!("expected on or off, not \"{}\"", s.escape_debug())),
    }
}

/// A --ttrq / --ttbr value: a humantime duration above zero (leave the flag out for no limit).
fn time_limit(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be more than 0 (leave the flag out for no limit)".into());
    }
    Ok(d)
}

#[derive(Debug, Args)]
struct ReceiveArgs {
    /// The queue.
    queue: String,
    /// How many messages (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), value_name = "N")]
    count: u64,
    /// How long to wait for them, in all (e.g. 500ms, 5s, 2m).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    timeout: Duration,
    /// One JSON object per message instead of the bare body (with "dead_letter": {"class",
    /// "reason", "destination", "broker", "time_ms"} for dead-lettered messages, else null).
    #[arg(long)]
    json: bool,
    /// Write the body's bytes exactly as they are, with nothing added: no newline, no
    /// dead-letter or acknowledgement lines (`mq receive q --raw > body.bin` for a binary
    /// body). One message only; for several, --json (a binary body is in "body_base64").
    #[arg(long, conflicts_with = "json")]
    raw: bool,
    /// mq receive: receive each message in its own transaction (transactional queues).
    /// mq peek refuses it (a peek removes nothing).
    #[arg(long)]
    tx: bool,
    /// Only the message with this id (MSMQ ReceiveById / PeekById); waits up to --timeout
    /// for it to arrive; with --timeout 0s, fails at once if it is not there.
    #[arg(long, value_name = "ID", conflicts_with_all = ["correlation_id", "count"])]
    id: Option<uuid::Uuid>,
    /// Only the first message with this correlation id (ReceiveByCorrelationId), as --id.
    #[arg(long, value_name = "ID", conflicts_with = "count")]
    correlation_id: Option<String>,
}

#[derive(Debug, Args)]
struct BrowseArgs {
    /// The queue.
    queue: String,
    /// Start at the message with this id (it must be waiting).
    #[arg(long, value_name = "ID")]
    from: Option<uuid::Uuid>,
    /// Stop after this many messages (default: all).
    #[arg(long)]
    count: Option<u64>,
    /// One JSON object per message (as `mq receive --json`).
    #[arg(long)]
    json: bool,
}

/// An error with its exit code.
struct Failure {
    code: u8,
    message: String,
}

/// The exit code of a command whose output pipe was closed (`mq receive … | head`): what a
/// shell shows for a process ended by SIGPIPE (128 + 13). Nothing is printed for it.
const BROKEN_PIPE_EXIT: u8 = 141;

impl<E: std::fmt::Display + 'static> From<E> for Failure {
    fn from(e: E) -> Self {
        let broken_pipe = (&e as &dyn std::any::Any)
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
        Failure {
            code: if broken_pipe { BROKEN_PIPE_EXIT } else { 1 },
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mq: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): stop quietly, as cat and grep do.
        Err(f) if f.code == BROKEN_PIPE_EXIT => ExitCode::from(f.code),
        Err(f) => {
            let kind = if f.code == 3 { "timeout" } else { "error" };
            eprintln!("mq: {kind}: {}", f.message.replace('\n', " "));
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    // Check names before connecting, so a typo is reported as such even with no broker.
    match &cli.command {
        Command::Send(a) => check_name(&a.destination)?,
        Command::Receive(a) => check_name(&a.queue)?,
        Command::Peek(a) => {
            if a.tx {
                return Err(Failure {
                    code: 2,
                    message:
                        "mq peek does not take --tx (a peek removes nothing); use mq receive --tx"
                            .into(),
                });
            }
            check_name(&a.queue)?
        }
        Command::Browse(a) => check_name(&a.queue)?,
        Command::Queue(
            QueueCommand::Create { name, .. }
            | QueueCommand::Set { name, .. }
            | QueueCommand::Delete { name }
            | QueueCommand::Info { name, .. }
            | QueueCommand::Purge { name }
            | QueueCommand::Grant { name, .. }
            | QueueCommand::Revoke { name, .. }
            | QueueCommand::Acl { name, .. },
        ) => check_name(name)?,
        Command::Queue(QueueCommand::List { .. }) => {}
        Command::Outgoing(
            OutgoingCommand::Pause { destination, .. }
            | OutgoingCommand::Resume { destination, .. }
            | OutgoingCommand::Delete { destination }
            | OutgoingCommand::Purge { destination },
        ) => {
            if destination.contains(['\\', '/', '=']) {
                check_name(destination)?;
            }
        }
        Command::Outgoing(OutgoingCommand::List { .. }) | Command::Stats(_) => {}
        Command::Tx(TxCommand::Status { id, .. }) => {
            // A usage error, as a bad --tx-id or message id (helper-73: this one exited 1).
            id.parse::<TxId>().map_err(|e| Failure {
                code: 2,
                message: e.to_string(),
            })?;
        }
        Command::Move(a) => {
            check_name(&a.queue)?;
            parse_message_id(&a.id)?;
            if a.destination.contains(['\\', '/', '=']) {
                check_name(&a.destination)?;
            }
        }
        Command::Info { .. } => {}
    }
    let options = ClientOptions {
        connect_timeout: cli.connect_timeout,
        call_timeout: cli.call_timeout,
        ..ClientOptions::default()
    };
    // `receive --timeout` bounds the whole command, connecting included: a broker that does
    // not answer fails it RECEIVE_ANSWER_GRACE after the timeout (the receive itself asks the
    // broker to wait only what is left of the timeout, and gives the confirmation of its
    // acknowledgements what is left of the grace).
    if let Command::Receive(a) | Command::Peek(a) = &cli.command {
        let limit = a.timeout.saturating_add(RECEIVE_ANSWER_GRACE);
        let (broker, timeout, call_timeout) = (cli.broker.clone(), a.timeout, cli.call_timeout);
        let written = Arc::new(AtomicU64::new(0));
        let run = connect_and_run(cli, options, written.clone());
        tokio::pin!(run);
        return match tokio::time::timeout(limit, &mut run).await {
            Ok(r) => r,
            // Messages are written: the confirmation of their acknowledgement gets the call
            // deadline (a slow link is not a silent broker).
            Err(_) if written.load(Ordering::Acquire) > 0 => {
                match tokio::time::timeout(call_timeout, &mut run).await {
                    Ok(r) => r,
                    Err(_) => Err(Failure {
                        code: 1,
                        message: format!(
                            "{} messages written; the broker did not confirm their acknowledgement within {} (--call-timeout): they may be delivered again",
                            written.load(Ordering::Acquire),
                            humantime::format_duration(call_timeout)
                        ),
                    }),
                }
            }
            Err(_) => Err(Failure {
                code: 1,
                message: format!(
                    "no answer from the broker at {broker} within {} (--timeout {} plus {} for the broker to answer); is it stopped or overloaded?",
                    humantime::format_duration(limit),
                    humantime::format_duration(timeout),
                    humantime::format_duration(RECEIVE_ANSWER_GRACE)
                ),
            }),
        };
    }
    connect_and_run(cli, options, Arc::default()).await
}

/// Runs the command; `written` counts the messages a receive or peek has written (see the
/// receive's deadline above).
async fn connect_and_run(
    cli: Cli,
    options: ClientOptions,
    written: Arc<AtomicU64>,
) -> Result<(), Failure> {
    let started = Instant::now();
    let client = match connect(&cli, options).await {
        Ok(c) => c,
        // Every failed send ends with how much of it was acknowledged: here, nothing.
        Err(f) => {
            return Err(match &cli.command {
                Command::Send(a) => Failure {
                    code: 1,
                    message: format!("{}; acknowledged 0 of {}", f.message, a.count),
                },
                _ => f,
            })
        }
    };
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Queue(q) => queue_command(&client, q, &mut out).await,
        Command::Send(a) => send(&client, a).await,
        Command::Receive(a) => receive(&client, a, false, &mut out, (started, &written)).await,
        Command::Peek(a) => receive(&client, a, true, &mut out, (started, &written)).await,
        Command::Browse(a) => browse(&client, a, &mut out).await,
        Command::Outgoing(o) => outgoing_command(&client, o, &mut out).await,
        Command::Tx(t) => tx_command(&client, t, &mut out).await,
        Command::Move(a) => move_command(&client, a, &mut out).await,
        Command::Info { json } => info_command(&client, json, &mut out).await,
        Command::Stats(a) => stats(&client, a, &mut out).await,
    }
}

/// A message id as `mq receive --json` prints it (a UUID).
fn parse_message_id(id: &str) -> Result<uuid::Uuid, Failure> {
    id.parse::<uuid::Uuid>().map_err(|e| Failure {
        code: 2,
        message: format!(
            "\"{}\" is not a message id (a UUID as mq receive --json shows it): {e}",
            id.chars().take(64).collect::<String>()
        ),
    })
}

async fn move_command(client: &Client, a: MoveArgs, out: &mut impl Write) -> Result<(), Failure> {
    let id = parse_message_id(&a.id)?;
    let m = client.move_message(&a.queue, id, &a.destination).await?;
    if a.json {
        // Without a body, as the help says: the broker's answer carries none ("body": "" read as
        // an empty body, helper-73).
        let mut v = message_json(&m);
        if let Some(o) = v.as_object_mut() {
            o.remove("body");
            o.remove("body_base64");
        }
        writeln!(out, "{v}")?;
    } else {
        writeln!(
            out,
            "moved {} to {} (move count {})",
            m.id, m.destination, m.move_count
        )?;
    }
    Ok(())
}

/// Connects with the TLS and credential options.
async fn connect(cli: &Cli, options: ClientOptions) -> Result<Client, Failure> {
    let mut b = Client::builder(&cli.broker).options(options);
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| Failure::from(format!("cannot read {}: {e}", p.display())))
    };
    if let Some(ca) = &cli.ca {
        b = b.ca_pem(read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        b = b.client_cert_pem(read(cert)?, read(key)?);
    }
    if let Some(user) = &cli.user {
        let password = match std::env::var("MQ_PASSWORD") {
            Ok(p) => p,
            Err(_) => rpassword::prompt_password(format!("password for {user}: "))
                .map_err(|e| format!("cannot read the password (set MQ_PASSWORD): {e}"))?,
        };
        b = b.user(user, &password);
    } else if let Some(token) = &cli.token {
        b = b.token(token);
    }
    Ok(b.connect().await?)
}

async fn tx_command(client: &Client, cmd: TxCommand, out: &mut impl Write) -> Result<(), Failure> {
    match cmd {
        TxCommand::Status { id, json } => {
            let id: TxId = id.parse()?;
            let s = client.transaction_outcome(id).await?;
            if json {
                let v = serde_json::json!({
                    "id": id.to_string(),
                    "outcome": s.outcome,
                    "time_ms": s.time_ms,
                    "detail": s.detail,
                    "retention_ms": s.retention_ms,
                });
                writeln!(out, "{v}")?;
            } else {
                let word = match s.outcome {
                    mq_client::TxOutcome::Committed => "committed",
                    mq_client::TxOutcome::Aborted => "aborted",
                    mq_client::TxOutcome::InProgress => "in-progress",
                    mq_client::TxOutcome::Unknown => "unknown",
                };
                writeln!(out, "{word}: {}", s.detail)?;
            }
        }
    }
    Ok(())
}

async fn info_command(client: &Client, json: bool, out: &mut impl Write) -> Result<(), Failure> {
    let i = client.broker_info().await?;
    let limits: std::collections::BTreeMap<_, _> = i.limits.iter().collect();
    // A broker with a users file tells an anonymous caller only its name, versions and
    // readiness (`started_ms` 0): the rest is left out, not shown as zeros (helper-73).
    if i.started_ms == 0 {
        if json {
            let v = serde_json::json!({
                "name": i.name,
                "version": i.version,
                "protocol_version": i.protocol_version,
                "ready": i.ready,
                "details": false,
            });
            writeln!(out, "{v}")?;
            return Ok(());
        }
        name_and_version(&i, out)?;
        writeln!(out, "ready       {}", if i.ready { "yes" } else { "no" })?;
        writeln!(
            out,
            "(the broker tells the rest to an identity: --user, --token or a client certificate)"
        )?;
        return Ok(());
    }
    if json {
        let v = serde_json::json!({
            "name": i.name,
            "version": i.version,
            "protocol_version": i.protocol_version,
            "started_ms": i.started_ms,
            "uptime_ms": i.uptime_ms,
            "ready": i.ready,
            "listen": i.listen,
            "http_listen": i.http_listen,
            "data_dir": i.data_dir,
            "journal_disk_bytes": i.journal_disk_bytes,
            "journal_live_bytes": i.journal_live_bytes,
            "journal_segments": i.journal_segments,
            "journal_poisoned": i.journal_poisoned,
            "stored_bytes": i.stored_bytes,
            "storage_quota_bytes": i.storage_quota_bytes,
            "queues": i.queues,
            "messages": i.messages,
            "limits": limits,
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    let uptime = std::time::Duration::from_secs(i.uptime_ms / 1000);
    name_and_version(&i, out)?;
    writeln!(out, "uptime      {}", humantime::format_duration(uptime))?;
    writeln!(out, "ready       {}", if i.ready { "yes" } else { "no" })?;
    writeln!(out, "listen      {}", i.listen.join(", "))?;
    if !i.http_listen.is_empty() {
        writeln!(out, "http        {}", i.http_listen)?;
    }
    writeln!(out, "data dir    {}", i.data_dir)?;
    writeln!(
        out,
        "journal     {} segments, {} bytes on disk, {} live{}",
        i.journal_segments,
        i.journal_disk_bytes,
        i.journal_live_bytes,
        if i.journal_poisoned {
            ", POISONED (restart mqd)"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "storage     {} of {} bytes (storage quota)",
        i.stored_bytes, i.storage_quota_bytes
    )?;
    writeln!(out, "queues      {} ({} messages)", i.queues, i.messages)?;
    writeln!(out, "limits")?;
    for (k, v) in limits {
        writeln!(out, "  {k:<30} {v}")?;
    }
    Ok(())
}

/// `mq info`'s first two lines: the broker's name and versions.
fn name_and_version(i: &mq_client::BrokerInfo, out: &mut impl Write) -> Result<(), Failure> {
    writeln!(out, "name        {}", i.name)?;
    writeln!(
        out,
        "version     {} (protocol {}; this mq speaks {})",
        i.version,
        i.protocol_version,
        mq_client::PROTOCOL_VERSION
    )?;
    Ok(())
}

fn check_name(name: &str) -> Result<(), Failure> {
    mq_client::format_name::FormatName::parse(name)?;
    Ok(())
}

async fn queue_command(
    client: &Client,
    cmd: QueueCommand,
    out: &mut impl Write,
) -> Result<(), Failure> {
    match cmd {
        QueueCommand::Create {
            name,
            transactional,
            quota_bytes,
            label,
            max_aborts,
            journal,
            journal_quota,
        } => {
            let info = client
                .create_queue(
                    &name,
                    QueueOptions {
                        transactional,
                        quota_bytes,
                        label,
                        max_aborts,
                        journal,
                        journal_quota_bytes: journal_quota,
                    },
                )
                .await?;
            writeln!(out, "created {}", info.name)?;
        }
        QueueCommand::Delete { name } => {
            client.delete_queue(&name).await?;
            writeln!(out, "deleted {name}")?;
        }
        QueueCommand::Set {
            name,
            label,
            quota_bytes,
            no_quota,
            journal,
            journal_quota,
            max_aborts,
            json,
        } => {
            let mut props = mq_client::QueueProperties::default();
            props.label = label;
            props.journal = journal;
            props.journal_quota_bytes = journal_quota;
            props.max_aborts = max_aborts;
            props.quota_bytes = if no_quota {
                Some(None)
            } else {
                quota_bytes.map(Some)
            };
            let q = client.set_queue_properties(&name, props).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&q)?)?;
            } else {
                writeln!(out, "changed {}", q.name)?;
            }
        }
        QueueCommand::Purge { name } => {
            let n = client.purge(&name).await?;
            writeln!(out, "purged {n} messages from {name}")?;
        }
        QueueCommand::Info { name, json } => {
            let q = client.queue_info(&name).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&q)?)?;
            } else {
                writeln!(out, "name:           {}", q.name)?;
                writeln!(out, "format name:    {}", q.format_name)?;
                writeln!(
                    out,
                    "transactional:  {}",
                    if q.transactional { "yes" } else { "no" }
                )?;
                writeln!(out, "messages:       {}", q.messages)?;
                writeln!(out, "bytes:          {}", q.bytes)?;
                writeln!(out, "in flight:      {}", q.in_flight)?;
                let quota = q.quota_bytes.map_or("none".to_string(), |b| b.to_string());
                writeln!(out, "quota (bytes):  {quota}")?;
                writeln!(out, "label:          {}", q.label)?;
                writeln!(out, "sent:           {}", q.sent)?;
                writeln!(out, "received:       {}", q.received)?;
                writeln!(out, "purged:         {}", q.purged)?;
                writeln!(out, "dead-lettered:  {}", q.dead_lettered)?;
                writeln!(out, "receive aborts: {}", q.receive_aborts)?;
                if q.max_aborts > 0 {
                    writeln!(out, "max aborts:     {}", q.max_aborts)?;
                    writeln!(out, "poisoned:       {}", q.poisoned)?;
                }
                writeln!(
                    out,
                    "journal:        {} (quota {} bytes, {} copies not kept)",
                    if q.journal { "on" } else { "off" },
                    q.journal_quota_bytes,
                    q.journal_not_kept
                )?;
            }
        }
        QueueCommand::Grant { name, who, rights } => {
            let list: Vec<&str> = rights.split(',').map(str::trim).collect();
            let acl = client.grant(&name, &who, &list).await?;
            writeln!(out, "granted {rights} on {} to {who}", acl.queue)?;
        }
        QueueCommand::Revoke { name, who, rights } => {
            let list: Vec<&str> = rights.split(',').map(str::trim).collect();
            let acl = client.revoke(&name, &who, &list).await?;
            writeln!(out, "revoked {rights} on {} from {who}", acl.queue)?;
        }
        QueueCommand::Acl { name, json } => {
            let acl = client.acl(&name).await?;
            if json {
                let v: serde_json::Map<String, serde_json::Value> = acl
                    .entries
                    .iter()
                    .map(|(p, r)| (p.clone(), serde_json::json!(r)))
                    .collect();
                writeln!(out, "{}", serde_json::json!({"queue": acl.queue, "acl": v}))?;
            } else if acl.entries.is_empty() {
                writeln!(
                    out,
                    "{}: no entries (only identities with broker-wide rights)",
                    acl.queue
                )?;
            } else {
                for (p, r) in &acl.entries {
                    writeln!(out, "{p}\t{}", r.join(","))?;
                }
            }
        }
        QueueCommand::List { json } => {
            let qs = client.list_queues().await?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&qs)?)?;
            } else if qs.is_empty() {
                writeln!(out, "no queues")?;
            } else {
                let w = qs.iter().map(|q| q.name.len()).max().unwrap_or(4).max(4);
                writeln!(
                    out,
                    "{:<w$}  {:>10}  {:>14}  TRANSACTIONAL",
                    "NAME", "MESSAGES", "BYTES"
                )?;
                for q in qs {
                    let tx = if q.transactional { "yes" } else { "no" };
                    writeln!(
                        out,
                        "{:<w$}  {:>10}  {:>14}  {tx}",
                        q.name, q.messages, q.bytes
                    )?;
                }
            }
        }
    }
    Ok(())
}

async fn outgoing_command(
    client: &Client,
    cmd: OutgoingCommand,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let (q, json) = match cmd {
        OutgoingCommand::List { json } => {
            let qs = client.outgoing().await?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&qs)?)?;
            } else {
                out.write_all(outgoing_table(&qs, SystemTime::now()).as_bytes())?;
            }
            return Ok(());
        }
        OutgoingCommand::Pause { destination, json } => {
            (client.pause_outgoing(&destination).await?, json)
        }
        OutgoingCommand::Resume { destination, json } => {
            (client.resume_outgoing(&destination).await?, json)
        }
        OutgoingCommand::Delete { destination } => {
            client.delete_outgoing(&destination).await?;
            writeln!(out, "deleted the outgoing queue for {}", destination.trim())?;
            return Ok(());
        }
        OutgoingCommand::Purge { destination } => {
            let n = client.purge_outgoing(&destination).await?;
            writeln!(
                out,
                "purged {n} messages from the outgoing queue for {}",
                destination.trim()
            )?;
            return Ok(());
        }
    };
    if json {
        writeln!(out, "{}", serde_json::to_string(&q)?)?;
    } else {
        writeln!(out, "{}", outgoing_line(&q, SystemTime::now()))?;
    }
    Ok(())
}

/// `mq outgoing list`: a table, one outgoing queue a row (or `no outgoing queues`).
fn outgoing_table(qs: &[OutgoingQueue], now: SystemTime) -> String {
    use std::fmt::Write as _;
    if qs.is_empty() {
        return "no outgoing queues\n".to_string();
    }
    let w = qs
        .iter()
        .map(|q| q.destination.len())
        .max()
        .unwrap_or(0)
        .max("DESTINATION".len());
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<w$}  {:<10}  {:>10}  {:>14}  {:>9}  {:>10}  {:>13}  {:<10}  LAST-ERROR",
        "DESTINATION",
        "STATE",
        "MESSAGES",
        "BYTES",
        "IN-FLIGHT",
        "FORWARDED",
        "DEAD-LETTERED",
        "NEXT-RETRY"
    );
    for q in qs {
        let _ = writeln!(
            t,
            "{:<w$}  {:<10}  {:>10}  {:>14}  {:>9}  {:>10}  {:>13}  {:<10}  {}",
            q.destination,
            q.state.to_string(),
            q.messages,
            q.bytes,
            q.in_flight,
            q.forwarded,
            q.dead_lettered,
            relative_time(q.next_retry, now),
            one_line(q.last_error.as_deref().unwrap_or("-")),
        );
    }
    t
}

/// `mq outgoing pause|resume`: the resulting state, one line.
fn outgoing_line(q: &OutgoingQueue, now: SystemTime) -> String {
    let mut line = format!(
        "{}: {}, {} messages ({} bytes), {} in flight",
        q.destination, q.state, q.messages, q.bytes, q.in_flight
    );
    if q.next_retry.is_some() {
        line.push_str(&format!(
            ", next retry {}",
            relative_time(q.next_retry, now)
        ));
    }
    if let Some(e) = &q.last_error {
        line.push_str(&format!(", last error: {}", one_line(e)));
    }
    line
}

/// A time relative to `now`: `in 1.2s`, `in 42s`, `in 2m 5s`; `now` once due; `-` for none.
fn relative_time(t: Option<SystemTime>, now: SystemTime) -> String {
    let Some(t) = t else {
        return "-".to_string();
    };
    match t.duration_since(now) {
        Ok(d) if d >= Duration::from_millis(50) => {
            if d < Duration::from_secs(10) {
                format!("in {:.1}s", d.as_secs_f64())
            } else {
                let secs = Duration::from_secs(d.as_secs_f64().round() as u64);
                format!("in {}", humantime::format_duration(secs))
            }
        }
        _ => "now".to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

async fn send(client: &Client, a: SendArgs) -> Result<(), Failure> {
    let body: Vec<u8> = match (&a.body, &a.file) {
        (Some(b), _) => b.clone().into_bytes(),
        (None, Some(f)) => {
            std::fs::read(f).map_err(|e| format!("cannot read --file {}: {e}", f.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("cannot read the body from stdin: {e}"))?;
            buf
        }
    };
    if a.count == 0 {
        return Err(Failure {
            code: 2,
            message: "--count must be at least 1".into(),
        });
    }
    let template = String::from_utf8(body.clone())
        .ok()
        .filter(|s| a.count > 1 && s.contains("{n}"));
    let make = |n: u64| {
        let b = match &template {
            Some(t) => t.replace("{n}", &n.to_string()).into_bytes(),
            None => body.clone(),
        };
        let m = Message::new(b)
            .label(a.label.clone())
            .priority(a.priority)
            .correlation_id(a.correlation_id.clone())
            .app_specific(a.app_specific)
            .response_queue(a.response_queue.clone())
            .admin_queue(a.admin_queue.clone().unwrap_or_default())
            .acknowledge(a.ack.unwrap_or(0))
            .delivery(if a.recoverable {
                Delivery::Recoverable
            } else {
                Delivery::Express
            });
        let m = match a.ttrq {
            Some(d) => m.time_to_reach_queue(d),
            None => m,
        };
        let m = m.journal(a.journal);
        match a.ttbr {
            Some(d) => m.time_to_be_received(d),
            None => m,
        }
    };
    if a.tx {
        return send_tx(client, &a, make).await;
    }
    let none_acked = |e: mq_client::Error| Failure {
        code: 1,
        message: format!("{e}; acknowledged 0 of {}", a.count),
    };
    let options = SenderOptions {
        transactional: a.tx_each,
        ..SenderOptions::default()
    };
    let mut sender = client
        .sender(&a.destination, options)
        .await
        .map_err(none_acked)?;
    // A broker that stops answering fails the command after --call-timeout, whatever it had
    // acknowledged: the rest may or may not be stored.
    let call_timeout = client.options().call_timeout;
    sender.set_ack_timeout(Some(call_timeout));
    let silent = |what: &str| {
        mq_client::Error::Timeout(format!(
            "the broker did not {what} within {} (--call-timeout); what it did not acknowledge may or may not be stored",
            humantime::format_duration(call_timeout)
        ))
    };
    if a.count == 1 {
        let receipt = sender
            .send_with_receipt(make(1))
            .await
            .map_err(none_acked)?;
        let id = match tokio::time::timeout(call_timeout, receipt).await {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => {
                let _ = sender.flush().await;
                return Err(send_failure(&e, 0, sender.in_doubt(), 1, &[]));
            }
            Err(_) => {
                // Given up: the message is in doubt (for --tx-each, its transaction id named).
                sender.set_ack_timeout(Some(Duration::ZERO));
                let _ = sender.flush().await;
                let (in_doubt, ids) = (sender.in_doubt(), sender.in_doubt_ids());
                return Err(send_failure(
                    &silent("acknowledge it"),
                    0,
                    in_doubt,
                    1,
                    &ids,
                ));
            }
        };
        // Stored: said before the stream is closed (closing waits for the broker's end of it).
        // A closed stdout (`| head`) does not make that a failure.
        let _ = writeln!(std::io::stdout(), "{id}");
        let _ = std::io::stdout().flush();
        sender.close().await?;
        return Ok(());
    }
    let bar = progress_bar(a.count);
    let started = Instant::now();
    let mut result = Ok(());
    let mut silenced = false;
    for n in 1..=a.count {
        // `send` waits while the window is full: for acknowledgements that may never come.
        match tokio::time::timeout(call_timeout, sender.send(make(n))).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                result = Err(e);
                break;
            }
            Err(_) => {
                result = Err(silent("acknowledge what was sent"));
                silenced = true;
                break;
            }
        }
        if n % 1024 == 0 {
            if let Some(b) = &bar {
                b.set_position(sender.acknowledged());
            }
        }
    }
    // A broker that went silent is not waited for again; the flush gives the stream up, so
    // what it carried unanswered is counted in doubt (and named, for --tx-each).
    if silenced {
        sender.set_ack_timeout(Some(Duration::ZERO));
    }
    let flushed = match sender.flush().await {
        Err(mq_client::Error::Timeout(_)) => {
            silenced = true;
            Err(silent("answer everything sent"))
        }
        r => r.map(|_| ()),
    };
    if silenced {
        sender.set_ack_timeout(Some(Duration::ZERO));
    }
    let (acknowledged, in_doubt) = (sender.acknowledged(), sender.in_doubt());
    let in_doubt_ids = sender.in_doubt_ids();
    let closed = sender.close().await;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let err = result.err().or(flushed.err()).or(closed.err());
    if let Some(e) = err {
        return Err(send_failure(
            &e,
            acknowledged,
            in_doubt,
            a.count,
            &in_doubt_ids,
        ));
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "sent {} messages to {} in {:.3} s ({:.0} msg/s); acknowledged {} of {}",
        a.count,
        a.destination,
        secs,
        a.count as f64 / secs.max(1e-9),
        acknowledged,
        a.count
    );
    Ok(())
}

/// The last line of a failed `mq send`: the error, then how many of the `count` messages were
/// acknowledged, and how many have an unknown outcome (sent, no answer before the stream ended);
/// with `--tx-each`, their transaction ids (`ids`, consecutive).
fn send_failure(
    e: &mq_client::Error,
    acknowledged: u64,
    in_doubt: u64,
    count: u64,
    ids: &[TxId],
) -> Failure {
    // The line always ends with "acknowledged K of N" (scripts parse it).
    let which = match (ids.first(), ids.last()) {
        (Some(a), Some(b)) if a == b => format!(
            "transaction {a} may or may not have committed (ask with `mq tx status ID`; `mq send --tx --tx-id ID` repeats it at most once); "
        ),
        (Some(a), Some(b)) => format!(
            "transactions {a} to {b} ({} ids in a row) may or may not have committed (ask with `mq tx status ID`; `mq send --tx --tx-id ID` repeats one at most once); ",
            ids.len()
        ),
        _ => String::new(),
    };
    let unknown = if in_doubt > 0 {
        format!("outcome unknown for {in_doubt}; ")
    } else {
        String::new()
    };
    Failure {
        code: 1,
        message: format!("{e}; {which}{unknown}acknowledged {acknowledged} of {count}"),
    }
}

/// `mq send --tx`: every message in one transaction.
async fn send_tx(
    client: &Client,
    a: &SendArgs,
    make: impl Fn(u64) -> Message,
) -> Result<(), Failure> {
    let started = Instant::now();
    let not_committed = |e: &dyn std::fmt::Display| Failure {
        code: 1,
        message: format!(
            "{e}; the transaction was not committed: acknowledged 0 of {}",
            a.count
        ),
    };
    let id = match &a.tx_id {
        Some(s) => s.parse::<TxId>().map_err(|e| Failure {
            code: 2,
            message: e.to_string(),
        })?,
        None => TxId::new(),
    };
    let mut tx = client
        .begin_with_id(id)
        .await
        .map_err(|e| not_committed(&e))?;
    for n in 1..=a.count {
        tx.send(&a.destination, make(n))
            .map_err(|e| not_committed(&e))?;
    }
    let ids = match tx.commit().await {
        Ok(ids) => ids,
        Err(mq_client::Error::InDoubt { id, reason }) => {
            return Err(Failure {
                code: 1,
                message: format!(
                    "the connection to the broker was lost during the commit ({reason}): transaction {id} outcome unknown; it may or may not have committed: ask with `mq tx status {id}`, or repeat this send with --tx-id {id} (commits at most once); outcome unknown for {}; acknowledged 0 of {}",
                    a.count, a.count
                ),
            });
        }
        Err(e @ mq_client::Error::AlreadyCommitted { .. }) => {
            // The retry of an in-doubt send: done before, not done again. Success.
            eprintln!("{e} (by an earlier attempt; nothing was sent again)");
            return Ok(());
        }
        Err(e) => return Err(not_committed(&e)),
    };
    if a.count == 1 {
        if let Some(id) = ids.first() {
            let _ = writeln!(std::io::stdout(), "{id}");
        }
        return Ok(());
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "committed {} messages to {} in one transaction in {:.3} s; acknowledged {} of {}",
        a.count,
        a.destination,
        secs,
        ids.len(),
        a.count
    );
    Ok(())
}

fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if total < 10_000 || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} acknowledged ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(b)
}

/// `mq receive` and `mq peek`. A message is removed only once it is written: through the
/// receive stream, acknowledged after the write (a failed write, a closed pipe or the command's
/// time running out gives it back), or in a transaction committed after the write (`--tx`).
/// By id or correlation id without `--tx` the broker removes it as it answers (one call).
async fn receive(
    client: &Client,
    a: ReceiveArgs,
    peek: bool,
    out: &mut impl Write,
    (started, written): (Instant, &AtomicU64),
) -> Result<(), Failure> {
    if a.raw && a.count > 1 {
        return Err(Failure {
            code: 2,
            message: "--raw writes one message's body as it is; for several messages use --json \
                      (a binary body is in \"body_base64\")"
                .into(),
        });
    }
    let how = PrintAs::of(a.json, a.raw);
    let queue = client.queue(&a.queue)?;
    // From the command's start (connecting included), as the outer bound counts.
    let deadline = started + a.timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut got = 0u64;
    if a.id.is_some() || a.correlation_id.is_some() {
        let (id, corr) = (a.id, a.correlation_id.as_deref().unwrap_or(""));
        let m = if a.tx && !peek {
            let mut tx = client.begin().await?;
            let m = match id {
                Some(id) => tx.receive_by_id(&a.queue, id, left()).await?,
                None => tx.receive_by_correlation_id(&a.queue, corr, left()).await?,
            };
            match &m {
                Some(m) => {
                    print_message(out, m, how)?;
                    out.flush()?;
                    tx.commit().await?;
                }
                None => tx.abort().await?,
            }
            return found_or_timeout(m.is_some(), id, corr, a.timeout);
        } else {
            match (id, peek) {
                (Some(id), false) => queue.receive_by_id(id, left()).await?,
                (Some(id), true) => queue.peek_by_id(id, left()).await?,
                (None, false) => queue.receive_by_correlation_id(corr, left()).await?,
                (None, true) => queue.peek_by_correlation_id(corr, left()).await?,
            }
        };
        if let Some(m) = &m {
            let wrote = print_message(out, m, how).and_then(|()| out.flush());
            if let (Err(e), false) = (wrote, peek) {
                return Err(Failure {
                    code: 1,
                    message: format!(
                        "message {} was received (removed from {}) but not written: {e}; with --tx a message is removed only once written",
                        m.id, a.queue
                    ),
                });
            }
        }
        out.flush()?;
        return found_or_timeout(m.is_some(), id, corr, a.timeout);
    }
    if a.tx && !peek {
        // Each receive its own transaction: receive, print, commit.
        while got < a.count {
            let mut tx = client.begin().await?;
            match tx.receive(&a.queue, left()).await? {
                Some(m) => {
                    print_message(out, &m, how)?;
                    out.flush()?;
                    written.fetch_add(1, Ordering::Release);
                    tx.commit().await?;
                    got += 1;
                }
                None => {
                    tx.abort().await?;
                    break;
                }
            }
        }
    } else if peek {
        // Page by page (the broker pages large peeks), printing as they come.
        let mut after = None;
        let mut wait = a.timeout;
        while got < a.count {
            let max = (a.count - got).min(u32::MAX as u64) as u32;
            let page = queue.peek_page(max, after.as_ref(), wait).await?;
            for m in &page.messages {
                print_message(out, m, how)?;
                got += 1;
            }
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
            wait = Duration::ZERO;
        }
    } else {
        // One message or many: acknowledged only once written and flushed.
        let mut consumer = queue
            .consumer(ConsumerOptions {
                prefetch: a.count.min(1024) as u32,
                limit: Some(a.count),
            })
            .await?;
        while got < a.count {
            match consumer.next(left()).await? {
                Some(m) => {
                    print_message(out, &m, how)?;
                    written.fetch_add(1, Ordering::Release);
                    got += 1;
                }
                None => break,
            }
        }
        out.flush()?;
        // The confirmation of the acknowledgements: within the call deadline (the command's
        // own bound allows it once something is written).
        consumer.set_close_timeout(client.options().call_timeout);
        if let Err(e) = consumer.close().await {
            return Err(Failure {
                code: 1,
                message: format!("{got} messages written; {e}"),
            });
        }
    }
    out.flush()?;
    if got < a.count {
        return Err(Failure {
            code: 3,
            message: format!(
                "{got} of {} messages arrived within {}",
                a.count,
                humantime::format_duration(a.timeout)
            ),
        });
    }
    Ok(())
}

/// Exit 3 when the message asked for by id or correlation id did not arrive in time.
fn found_or_timeout(
    found: bool,
    id: Option<uuid::Uuid>,
    corr: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    if found {
        return Ok(());
    }
    let what = match id {
        Some(id) => format!("with id {id}"),
        None => format!("with correlation id \"{}\"", one_line(corr)),
    };
    Err(Failure {
        code: 3,
        message: format!(
            "no message {what} arrived within {} (MQ_ERROR_IO_TIMEOUT)",
            humantime::format_duration(timeout)
        ),
    })
}

/// `mq browse`: peek pages from the head (or a message) to the end, printed as they come.
async fn browse(client: &Client, a: BrowseArgs, out: &mut impl Write) -> Result<(), Failure> {
    let how = PrintAs::of(a.json, false);
    let queue = client.queue(&a.queue)?;
    let limit = a.count.unwrap_or(u64::MAX);
    let mut got = 0u64;
    let page_max = |got: u64| (limit - got).min(BROWSE_PAGE) as u32;
    let mut page = match a.from {
        Some(id) => queue.peek_page_from(page_max(0), id).await?,
        None => queue.peek_page(page_max(0), None, Duration::ZERO).await?,
    };
    loop {
        for m in &page.messages {
            print_message(out, m, how)?;
            got += 1;
        }
        match page.next {
            Some(c) if got < limit => {
                page = queue
                    .peek_page(page_max(got), Some(&c), Duration::ZERO)
                    .await?;
            }
            _ => break,
        }
    }
    out.flush()?;
    Ok(())
}

/// Messages asked for per browse page (the broker's page limit).
const BROWSE_PAGE: u64 = 1000;

/// How a received or peeked message is printed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PrintAs {
    /// The body on its own line, after any dead-letter or acknowledgement lines.
    Text,
    /// One JSON object per line.
    Json,
    /// The body's bytes and nothing else.
    Raw,
}

impl PrintAs {
    fn of(json: bool, raw: bool) -> PrintAs {
        match (json, raw) {
            (true, _) => PrintAs::Json,
            (false, true) => PrintAs::Raw,
            (false, false) => PrintAs::Text,
        }
    }
}

fn print_message(out: &mut impl Write, m: &ReceivedMessage, how: PrintAs) -> std::io::Result<()> {
    if how == PrintAs::Raw {
        return out.write_all(&m.body);
    }
    if how == PrintAs::Json {
        serde_json::to_writer(&mut *out, &message_json(m))?;
        return out.write_all(b"\n");
    }
    if let Some(d) = &m.dead_letter {
        out.write_all(dead_letter_lines(d).as_bytes())?;
    }
    if m.class != 0 {
        writeln!(
            out,
            "acknowledgement: {} ({:#06x}) of message {}",
            mq_client::ack::class_name(m.class as u32).unwrap_or("unknown"),
            m.class,
            m.correlation_id
        )?;
    }
    out.write_all(&m.body)?;
    out.write_all(b"\n")
}

/// The lines printed before the body of a dead-lettered message:
/// ```text
/// dead-letter: ReachQueueTimeout: not delivered within 1s
/// original destination: DIRECT=TCP:10.0.0.5:1802\private$\orders
/// dead-lettered by: alpha at 2023-11-14T22:13:21.001Z
/// ```
fn dead_letter_lines(d: &DeadLetterInfo) -> String {
    let mut s = format!("dead-letter: {}", d.class);
    if !d.reason.is_empty() {
        s.push_str(": ");
        s.push_str(&one_line(&d.reason));
    }
    s.push('\n');
    if !d.destination.is_empty() {
        s.push_str(&format!("original destination: {}\n", d.destination));
    }
    let time = time_text(d.time);
    if d.broker.is_empty() {
        s.push_str(&format!("dead-lettered at: {time}\n"));
    } else {
        s.push_str(&format!("dead-lettered by: {} at {time}\n", d.broker));
    }
    s
}

/// A message's time as RFC 3339 (UTC, ms), or `unix ms N` past the year 9999, which RFC 3339
/// cannot write (a sender sets `sent_time` to anything; formatting it must not fail).
fn time_text(t: SystemTime) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if write!(s, "{}", humantime::format_rfc3339_millis(t)).is_err() {
        s = format!("unix ms {}", unix_ms(t));
    }
    s
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `--json` output for one message.
fn message_json(m: &ReceivedMessage) -> serde_json::Value {
    let mut o = serde_json::Map::new();
    o.insert("id".into(), m.id.to_string().into());
    o.insert("label".into(), m.label.clone().into());
    o.insert("priority".into(), m.priority.into());
    o.insert("correlation_id".into(), m.correlation_id.clone().into());
    o.insert("app_specific".into(), m.app_specific.into());
    match std::str::from_utf8(&m.body) {
        Ok(s) => o.insert("body".into(), s.into()),
        Err(_) => o.insert(
            "body_base64".into(),
            base64::engine::general_purpose::STANDARD
                .encode(&m.body)
                .into(),
        ),
    };
    o.insert("body_type".into(), m.body_type.into());
    let delivery = match m.delivery {
        Delivery::Express => "express",
        Delivery::Recoverable => "recoverable",
    };
    o.insert("delivery".into(), delivery.into());
    o.insert("sent_time".into(), time_text(m.sent_time).into());
    o.insert("arrived_time".into(), time_text(m.arrived_time).into());
    o.insert("response_queue".into(), m.response_queue.clone().into());
    o.insert("destination".into(), m.destination.clone().into());
    o.insert("abort_count".into(), m.abort_count.into());
    o.insert("move_count".into(), m.move_count.into());
    o.insert("transactional".into(), m.transactional.into());
    o.insert(
        "reach_queue_by_ms".into(),
        m.reach_queue_by.map(unix_ms).into(),
    );
    o.insert("receive_by_ms".into(), m.receive_by.map(unix_ms).into());
    let dead_letter = m.dead_letter.as_ref().map(|d| {
        serde_json::json!({
            "class": d.class.to_string(),
            "reason": d.reason,
            "destination": d.destination,
            "broker": d.broker,
            "time_ms": unix_ms(d.time),
        })
    });
    o.insert("dead_letter".into(), dead_letter.into());
    o.insert("sender".into(), m.sender.clone().into());
    o.insert(
        "class".into(),
        serde_json::json!({
            "code": m.class,
            "name": mq_client::ack::class_name(m.class as u32).unwrap_or("unknown"),
        }),
    );
    o.insert("admin_queue".into(), m.admin_queue.clone().into());
    o.insert("acknowledge".into(), m.acknowledge.into());
    serde_json::Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mq_client::{DeadLetterClass, OutgoingState};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn message() -> ReceivedMessage {
        ReceivedMessage {
            id: uuid::Uuid::nil(),
            body: Bytes::from_static(b"hello"),
            label: "l".into(),
            priority: 3,
            correlation_id: String::new(),
            app_specific: 0,
            body_type: 0,
            delivery: Delivery::Recoverable,
            sent_time: at(1_700_000_000_000),
            arrived_time: at(1_700_000_000_010),
            response_queue: String::new(),
            destination: r"DIRECT=OS:alpha\SYSTEM$;DEADLETTER".into(),
            sender: "alice".into(),
            abort_count: 0,
            transactional: false,
            reach_queue_by: None,
            receive_by: None,
            dead_letter: None,
            move_count: 0,
            class: 0,
            admin_queue: String::new(),
            acknowledge: 0,
        }
    }

    fn dead_letter() -> DeadLetterInfo {
        DeadLetterInfo {
            class: DeadLetterClass::ReachQueueTimeout,
            reason: "not delivered to 10.0.0.5:1802 within 1s".into(),
            destination: r"DIRECT=TCP:10.0.0.5:1802\private$\orders".into(),
            broker: "alpha".into(),
            time: at(1_700_000_001_001),
        }
    }

    fn printed(m: &ReceivedMessage, json: bool) -> String {
        let mut out = Vec::new();
        print_message(&mut out, m, PrintAs::of(json, false)).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// A sender sets `sent_time` to anything: past the year 9999 (which RFC 3339 cannot
    /// write) the JSON and the dead-letter lines show the Unix ms instead of panicking.
    #[test]
    fn times_past_the_year_9999_are_printed_not_a_panic() {
        let far = at(253_402_300_800_000);
        assert_eq!(time_text(far), "unix ms 253402300800000");
        assert_eq!(time_text(at(1_700_000_000_000)), "2023-11-14T22:13:20.000Z");
        let mut m = message();
        m.sent_time = far;
        m.arrived_time = at(u64::MAX);
        let mut d = dead_letter();
        d.time = far;
        m.dead_letter = Some(d);
        let json = printed(&m, true);
        assert!(
            json.contains(r#""sent_time":"unix ms 253402300800000""#),
            "{json}"
        );
        assert!(printed(&m, false).contains("at unix ms 253402300800000"));
    }

    #[test]
    fn human_output_is_the_bare_body_without_dead_letter() {
        assert_eq!(printed(&message(), false), "hello\n");
    }

    #[test]
    fn human_output_explains_a_dead_letter() {
        let mut m = message();
        m.dead_letter = Some(dead_letter());
        assert_eq!(
            printed(&m, false),
            "dead-letter: ReachQueueTimeout: not delivered to 10.0.0.5:1802 within 1s\n\
             original destination: DIRECT=TCP:10.0.0.5:1802\\private$\\orders\n\
             dead-lettered by: alpha at 2023-11-14T22:13:21.001Z\n\
             hello\n"
        );
    }

    #[test]
    fn raw_output_is_the_body_alone() {
        let mut m = message();
        m.body = vec![0xff, 0x00, b'\n'].into();
        m.dead_letter = Some(dead_letter());
        m.class = 0x0100;
        let mut out = Vec::new();
        print_message(&mut out, &m, PrintAs::Raw).unwrap();
        assert_eq!(out, [0xff, 0x00, b'\n']);
    }

    #[test]
    fn dead_letter_lines_skip_empty_parts() {
        let d = DeadLetterInfo {
            class: DeadLetterClass::Unknown(9),
            reason: "two\nlines".into(),
            destination: String::new(),
            broker: String::new(),
            time: UNIX_EPOCH,
        };
        assert_eq!(
            dead_letter_lines(&d),
            "dead-letter: Unknown(9): two lines\ndead-lettered at: 1970-01-01T00:00:00.000Z\n"
        );
    }

    #[test]
    fn json_without_dead_letter_has_nulls() {
        let v: serde_json::Value = serde_json::from_str(&printed(&message(), true)).unwrap();
        assert_eq!(v["body"], "hello");
        assert_eq!(v["transactional"], false);
        assert!(v["reach_queue_by_ms"].is_null());
        assert!(v["receive_by_ms"].is_null());
        assert!(v["dead_letter"].is_null());
        assert!(v.as_object().unwrap().contains_key("dead_letter"));
    }

    #[test]
    fn json_with_dead_letter_and_deadlines() {
        let mut m = message();
        m.transactional = true;
        m.reach_queue_by = Some(at(1_700_000_001_000));
        m.receive_by = Some(at(1_700_000_060_000));
        m.dead_letter = Some(dead_letter());
        let v = message_json(&m);
        assert_eq!(v["transactional"], true);
        assert_eq!(v["reach_queue_by_ms"], 1_700_000_001_000u64);
        assert_eq!(v["receive_by_ms"], 1_700_000_060_000u64);
        assert_eq!(
            v["dead_letter"],
            serde_json::json!({
                "class": "ReachQueueTimeout",
                "reason": "not delivered to 10.0.0.5:1802 within 1s",
                "destination": r"DIRECT=TCP:10.0.0.5:1802\private$\orders",
                "broker": "alpha",
                "time_ms": 1_700_000_001_001u64,
            })
        );
    }

    #[test]
    fn relative_times() {
        let now = at(1_700_000_000_000);
        assert_eq!(relative_time(None, now), "-");
        assert_eq!(relative_time(Some(at(1_700_000_001_200)), now), "in 1.2s");
        assert_eq!(relative_time(Some(at(1_700_000_042_400)), now), "in 42s");
        assert_eq!(relative_time(Some(at(1_700_000_125_000)), now), "in 2m 5s");
        assert_eq!(relative_time(Some(at(1_700_000_000_010)), now), "now");
        assert_eq!(relative_time(Some(at(1_699_999_999_000)), now), "now");
    }

    fn outgoing() -> Vec<OutgoingQueue> {
        vec![
            OutgoingQueue {
                destination: "10.0.0.5:1802".into(),
                state: OutgoingState::Waiting,
                messages: 12,
                bytes: 340,
                in_flight: 0,
                last_error: Some("connection refused".into()),
                next_retry: Some(at(1_700_000_001_200)),
                forwarded: 100,
                dead_lettered: 1,
            },
            OutgoingQueue {
                destination: "beta.example.com:1801".into(),
                state: OutgoingState::OnHold,
                messages: 3,
                bytes: 30,
                in_flight: 0,
                last_error: None,
                next_retry: None,
                forwarded: 0,
                dead_lettered: 0,
            },
        ]
    }

    #[test]
    fn outgoing_table_layout() {
        let t = outgoing_table(&outgoing(), at(1_700_000_000_000));
        let expected = "\
DESTINATION            STATE         MESSAGES           BYTES  IN-FLIGHT   FORWARDED  DEAD-LETTERED  NEXT-RETRY  LAST-ERROR
10.0.0.5:1802          WAITING             12             340          0         100              1  in 1.2s     connection refused
beta.example.com:1801  ONHOLD               3              30          0           0              0  -           -
";
        assert_eq!(t, expected);
        assert_eq!(
            outgoing_table(&[], at(0)),
            "no outgoing queues\n".to_string()
        );
    }

    #[test]
    fn outgoing_state_lines() {
        let qs = outgoing();
        let now = at(1_700_000_000_000);
        assert_eq!(
            outgoing_line(&qs[0], now),
            "10.0.0.5:1802: WAITING, 12 messages (340 bytes), 0 in flight, next retry in 1.2s, \
             last error: connection refused"
        );
        assert_eq!(
            outgoing_line(&qs[1], now),
            "beta.example.com:1801: ONHOLD, 3 messages (30 bytes), 0 in flight"
        );
    }

    #[test]
    fn outgoing_json_is_an_array_like_queue_list() {
        let v = serde_json::to_value(outgoing()).unwrap();
        assert_eq!(v[0]["state"], "WAITING");
        assert_eq!(v[0]["next_retry_ms"], 1_700_000_001_200u64);
        assert_eq!(v[1]["state"], "ONHOLD");
        assert!(v[1]["last_error"].is_null());
    }

    #[test]
    fn a_failed_send_ends_with_acknowledged_k_of_n_and_says_what_is_unknown() {
        let e = mq_client::Error::Unavailable("the connection to the broker was lost".into());
        let f = send_failure(&e, 7, 0, 10, &[]);
        assert!(
            f.message.ends_with("; acknowledged 7 of 10"),
            "{}",
            f.message
        );
        assert!(!f.message.contains("unknown"), "{}", f.message);
        let f = send_failure(&e, 7, 3, 10, &[]);
        assert!(
            f.message
                .ends_with("; outcome unknown for 3; acknowledged 7 of 10"),
            "{}",
            f.message
        );
        let ids = [TxId::new(), TxId::new()];
        let f = send_failure(&e, 7, 2, 10, &ids);
        assert!(
            f.message.contains(&format!(
                "transactions {} to {} (2 ids in a row)",
                ids[0], ids[1]
            )) && f
                .message
                .ends_with("; outcome unknown for 2; acknowledged 7 of 10"),
            "{}",
            f.message
        );
        assert_eq!(f.code, 1);
    }

    #[test]
    fn time_limits_parse() {
        assert_eq!(time_limit("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(time_limit("1m"), Ok(Duration::from_secs(60)));
        assert!(time_limit("0s").is_err());
        assert!(time_limit("soon").is_err());
    }

    #[test]
    fn cli_parses_new_flags_and_commands() {
        let cli = Cli::try_parse_from([
            "mq",
            "send",
            r".\private$\q",
            "x",
            "--ttrq",
            "5s",
            "--ttbr",
            "1m",
        ])
        .unwrap();
        match cli.command {
            Command::Send(a) => {
                assert_eq!(a.ttrq, Some(Duration::from_secs(5)));
                assert_eq!(a.ttbr, Some(Duration::from_secs(60)));
            }
            other => panic!("parsed as {other:?}"),
        }
        let cli = Cli::try_parse_from(["mq", "outgoing", "pause", "10.0.0.5:1802"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Outgoing(OutgoingCommand::Pause { ref destination, json: false })
                if destination == "10.0.0.5:1802"
        ));
        let cli = Cli::try_parse_from(["mq", "outgoing", "list", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Outgoing(OutgoingCommand::List { json: true })
        ));
        let e = Cli::try_parse_from(["mq", "send", "q", "x", "--ttrq", "0"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn cli_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
