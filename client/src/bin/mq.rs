//! `mq`: the mq command line. Queue administration, send, receive and peek against one broker.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use base64::Engine;
use clap::{Args, Parser, Subcommand};
use mq_client::{
    Client, ConsumerOptions, Delivery, Message, QueueOptions, ReceivedMessage, SenderOptions,
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

/// The mq command line: administer queues, send, receive and peek messages.
#[derive(Debug, Parser)]
#[command(name = "mq", version, after_help = AFTER_HELP)]
struct Cli {
    /// Broker URL.
    #[arg(long, global = true, env = "MQ_BROKER", default_value = mq_client::DEFAULT_BROKER_URL)]
    broker: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, delete, inspect, list and purge queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Send a message (or --count N of them, pipelined) to a queue or a multiple-element format name.
    #[command(after_help = AFTER_HELP)]
    Send(SendArgs),
    /// Receive (remove) messages, printing each body on its own line.
    #[command(after_help = AFTER_HELP)]
    Receive(ReceiveArgs),
    /// Show up to --count messages at the head of a queue without removing them (waits up to
    /// --timeout for the first; exit 3 if fewer than --count are there).
    #[command(after_help = AFTER_HELP)]
    Peek(ReceiveArgs),
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Create a queue.
    Create {
        name: String,
        /// Transactional queue (fixed at creation): accepts only transactional sends.
        #[arg(long)]
        transactional: bool,
        /// Most bytes the queue may hold.
        #[arg(long)]
        quota_bytes: Option<u64>,
        /// A free-text label.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Delete a queue and every message in it.
    Delete { name: String },
    /// Show a queue's properties and counters.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove every waiting message.
    Purge { name: String },
    /// List every queue.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct SendArgs {
    /// Destination: a path name, a format name, or a multiple-element format name.
    destination: String,
    /// The body. With --count, `{n}` becomes 1..N. Absent (and no --file): read from stdin.
    body: Option<String>,
    /// Read the body from this file.
    #[arg(long, conflicts_with = "body")]
    file: Option<std::path::PathBuf>,
    /// Label (at most 250 characters).
    #[arg(long, default_value = "")]
    label: String,
    /// Priority 0 (lowest) to 7 (highest).
    #[arg(long, default_value_t = 3)]
    priority: u8,
    /// Correlation id.
    #[arg(long, default_value = "")]
    correlation_id: String,
    /// Application-specific integer.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    app_specific: i64,
    /// Queue to answer to.
    #[arg(long, default_value = "")]
    response_queue: String,
    /// Recoverable delivery: acknowledged once on disk, survives a broker crash.
    #[arg(long)]
    recoverable: bool,
    /// Send N messages, pipelined.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Send in one transaction (all --count messages commit together, or none do); required for
    /// transactional queues.
    #[arg(long, conflicts_with = "recoverable")]
    tx: bool,
}

#[derive(Debug, Args)]
struct ReceiveArgs {
    /// The queue.
    queue: String,
    /// How many messages (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// How long to wait for them, in all (e.g. 500ms, 5s, 2m).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// One JSON object per message instead of the bare body.
    #[arg(long)]
    json: bool,
    /// Receive each message in its own transaction (transactional queues).
    #[arg(long)]
    tx: bool,
}

/// An error with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            code: 1,
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
        Command::Receive(a) | Command::Peek(a) => check_name(&a.queue)?,
        Command::Queue(
            QueueCommand::Create { name, .. }
            | QueueCommand::Delete { name }
            | QueueCommand::Info { name, .. }
            | QueueCommand::Purge { name },
        ) => check_name(name)?,
        Command::Queue(QueueCommand::List { .. }) => {}
    }
    let client = Client::connect(&cli.broker).await?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Queue(q) => queue_command(&client, q, &mut out).await,
        Command::Send(a) => send(&client, a).await,
        Command::Receive(a) => receive(&client, a, false, &mut out).await,
        Command::Peek(a) => receive(&client, a, true, &mut out).await,
    }
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
        } => {
            let info = client
                .create_queue(
                    &name,
                    QueueOptions {
                        transactional,
                        quota_bytes,
                        label,
                    },
                )
                .await?;
            writeln!(out, "created {}", info.name)?;
        }
        QueueCommand::Delete { name } => {
            client.delete_queue(&name).await?;
            writeln!(out, "deleted {name}")?;
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
        Message::new(b)
            .label(a.label.clone())
            .priority(a.priority)
            .correlation_id(a.correlation_id.clone())
            .app_specific(a.app_specific)
            .response_queue(a.response_queue.clone())
            .delivery(if a.recoverable {
                Delivery::Recoverable
            } else {
                Delivery::Express
            })
    };
    if a.tx {
        return send_tx(client, &a, make).await;
    }
    let sender = client
        .sender(&a.destination, SenderOptions::default())
        .await?;
    if a.count == 1 {
        let receipt = sender.send_with_receipt(make(1)).await?;
        let id = receipt.await?;
        sender.close().await?;
        println!("{id}");
        return Ok(());
    }
    let bar = progress_bar(a.count);
    let started = Instant::now();
    let mut result = Ok(());
    for n in 1..=a.count {
        if let Err(e) = sender.send(make(n)).await {
            result = Err(e);
            break;
        }
        if n % 1024 == 0 {
            if let Some(b) = &bar {
                b.set_position(sender.acknowledged());
            }
        }
    }
    let acked_before_close = sender.acknowledged();
    let closed = sender.close().await;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let acknowledged = match &closed {
        Ok(s) => s.acknowledged,
        Err(_) => acked_before_close,
    };
    let err = result.err().or(closed.err());
    if let Some(e) = err {
        let acknowledged = acknowledged.max(acked_before_close);
        return Err(Failure {
            code: 1,
            message: format!("{e}; acknowledged {acknowledged} of {}", a.count),
        });
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

/// `mq send --tx`: every message in one transaction.
async fn send_tx(
    client: &Client,
    a: &SendArgs,
    make: impl Fn(u64) -> Message,
) -> Result<(), Failure> {
    let started = Instant::now();
    let mut tx = client.begin().await?;
    for n in 1..=a.count {
        tx.send(&a.destination, make(n))?;
    }
    let ids = tx.commit().await.map_err(|e| Failure {
        code: 1,
        message: format!(
            "{e}; the transaction was not committed: acknowledged 0 of {}",
            a.count
        ),
    })?;
    if a.count == 1 {
        if let Some(id) = ids.first() {
            println!("{id}");
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

async fn receive(
    client: &Client,
    a: ReceiveArgs,
    peek: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let queue = client.queue(&a.queue)?;
    let deadline = Instant::now() + a.timeout;
    let mut got = 0u64;
    if a.tx && !peek {
        // Each receive its own transaction: receive, print, commit.
        while got < a.count {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut tx = client.begin().await?;
            match tx.receive(&a.queue, left).await? {
                Some(m) => {
                    print_message(out, &m, a.json)?;
                    out.flush()?;
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
        let max = a.count.min(u32::MAX as u64) as u32;
        for m in queue.peek_many(max, a.timeout).await? {
            print_message(out, &m, a.json)?;
            got += 1;
        }
    } else if a.count == 1 {
        if let Some(m) = queue.receive(a.timeout).await? {
            print_message(out, &m, a.json)?;
            got = 1;
        }
    } else {
        let mut consumer = queue
            .consumer(ConsumerOptions {
                prefetch: a.count.min(1024) as u32,
                limit: Some(a.count),
            })
            .await?;
        while got < a.count {
            let left = deadline.saturating_duration_since(Instant::now());
            match consumer.next(left).await? {
                Some(m) => {
                    print_message(out, &m, a.json)?;
                    got += 1;
                }
                None => break,
            }
        }
        out.flush()?;
        consumer.close().await?;
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

fn print_message(out: &mut impl Write, m: &ReceivedMessage, json: bool) -> std::io::Result<()> {
    if !json {
        out.write_all(&m.body)?;
        return out.write_all(b"\n");
    }
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
    o.insert(
        "sent_time".into(),
        humantime::format_rfc3339_millis(m.sent_time)
            .to_string()
            .into(),
    );
    o.insert(
        "arrived_time".into(),
        humantime::format_rfc3339_millis(m.arrived_time)
            .to_string()
            .into(),
    );
    o.insert("response_queue".into(), m.response_queue.clone().into());
    o.insert("destination".into(), m.destination.clone().into());
    o.insert("abort_count".into(), m.abort_count.into());
    serde_json::to_writer(&mut *out, &serde_json::Value::Object(o))?;
    out.write_all(b"\n")
}
