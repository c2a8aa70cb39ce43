//! `mqd`: the mq broker daemon. Parses flags, sets up logging, binds, and runs the broker until
//! SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use mq_broker::BrokerConfig;

/// The mq message-queue broker.
///
/// Prints `listening on <addr>` as its first line on stdout once it accepts connections; logs go
/// to stderr (set the level with RUST_LOG, e.g. RUST_LOG=mq_broker=debug). SIGTERM or Ctrl-C stops
/// accepting, finishes what is in flight, and exits 0.
#[derive(Debug, Parser)]
#[command(name = "mqd", version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on; port 0 picks a free port (printed on the first line).
    #[arg(long, default_value = "127.0.0.1:1801", env = "MQD_LISTEN")]
    listen: SocketAddr,
    /// Directory for durable state (created if missing; one mqd per directory).
    #[arg(long, default_value = "./mq-data", env = "MQD_DATA_DIR")]
    data_dir: PathBuf,
    /// This broker's name: format names with this host are local. Default: the host name.
    #[arg(long, env = "MQD_NAME")]
    name: Option<String>,
    /// Another name or IP address of this broker (a DNS alias, a NAT address); format names
    /// with it are local. Repeat for several (MQD_ALIAS: comma-separated). With --listen 0.0.0.0
    /// or [::], the machine's interface addresses are local without this.
    #[arg(
        long = "alias",
        value_name = "NAME",
        env = "MQD_ALIAS",
        value_delimiter = ','
    )]
    aliases: Vec<String>,
    /// Largest message body accepted, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Broker-wide quota for express messages held in memory, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_EXPRESS_QUOTA_BYTES)]
    express_quota_bytes: u64,
    /// Broker-wide quota for recoverable message bytes stored on disk, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_STORAGE_QUOTA_BYTES)]
    storage_quota_bytes: u64,
    /// Size of each preallocated journal segment file, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_JOURNAL_SEGMENT_BYTES)]
    journal_segment_bytes: u64,
    /// Start even if the journal's last segment is damaged before records that were written
    /// after the damage: drop everything from the damage to the end of that segment, and log
    /// what is dropped. Without it mqd refuses to start and names the file and offset.
    #[arg(long)]
    truncate_damaged_journal: bool,
    /// A transaction open longer than this many seconds is aborted.
    #[arg(long, default_value_t = 60)]
    tx_timeout_secs: u64,
    /// How long the ids of committed transactions are remembered, so a client whose commit
    /// answer was lost can ask (`mq tx status ID`), e.g. 24h, 30m.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    tx_outcome_retention: std::time::Duration,
    /// Most committed transaction ids remembered (the oldest are forgotten first).
    #[arg(long, default_value_t = mq_broker::DEFAULT_TX_OUTCOME_MAX)]
    tx_outcome_max: usize,
    /// Store-and-forward: first wait before retrying a destination broker that could not be
    /// reached (doubles after each failure), e.g. 100ms, 2s.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    forward_retry_min: std::time::Duration,
    /// Store-and-forward: longest wait between attempts to reach a destination broker.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    forward_retry_max: std::time::Duration,
    /// Most open client connections; connections past it are closed at once.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_connections)]
    max_connections: usize,
    /// Most concurrent calls (HTTP/2 streams) per connection; more wait for one to end.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_streams_per_connection)]
    max_streams_per_connection: u32,
    /// Most delivered, unacknowledged messages per receive stream, whatever credit it grants.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_unacked_per_stream)]
    max_unacked_per_stream: u64,
    /// Most delivered, unacknowledged messages per connection (all its receive streams).
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_unacked_per_connection)]
    max_unacked_per_connection: u64,
    /// A receiver holding a delivered message this long without acknowledging it loses its
    /// stream, and its unacknowledged messages go back to the queue, e.g. 30m, 90s.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    ack_timeout: std::time::Duration,
    /// Most bytes one transaction may stage (its sends are held in memory until commit).
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_bytes)]
    max_tx_bytes: u64,
    /// Most bytes all open transactions together may stage.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_total_bytes)]
    max_tx_total_bytes: u64,
    /// Most messages (sends and receives) in one transaction.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_messages)]
    max_tx_messages: u64,
    /// Most open transactions per connection.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_per_connection)]
    max_tx_per_connection: usize,
    /// Most messages in one send batch, transactional send or forwarded batch (at least 512);
    /// a bigger batch ends its stream with one refusal.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_batch_messages)]
    max_batch_messages: usize,
    /// Most elements in a multiple-element format name (FORMATNAME:a,b,...) one send may use.
    #[arg(long, default_value_t = mq_proto::limits::DEFAULT_MAX_FORMAT_NAME_ELEMENTS)]
    max_format_name_elements: usize,
    /// An empty, unpaused outgoing queue unused this long is deleted (e.g. 1h, 10m).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    outgoing_idle_expiry: std::time::Duration,
    /// Most outgoing queues (destination brokers) at once; a send that needs one more is
    /// refused.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_OUTGOING_QUEUES)]
    max_outgoing_queues: usize,
    /// Most incoming forwarding streams kept per sending address; beyond it the least recently
    /// used idle one is forgotten, and a new stream is refused if all are busy.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_FORWARD_STREAMS_PER_PEER)]
    max_forward_streams_per_peer: usize,
    /// Most incoming forwarding streams kept in all; beyond it only the sending peer's own
    /// least recently used idle stream is forgotten, else a new stream is refused.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_FORWARD_STREAMS)]
    max_forward_streams: usize,
    /// An incoming forwarding stream unused this long is forgotten with its duplicate mark
    /// (e.g. 24h).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    forward_stream_idle: std::time::Duration,
    /// Users file (TOML, argon2id hashes; see `mqd user add`). Without one, mqd serves only
    /// loopback addresses and every caller has every right. Reread on SIGHUP.
    #[arg(long, env = "MQD_USERS")]
    users: Option<PathBuf>,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "MQD_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "MQD_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mTLS; the identity of a caller is
    /// its certificate's subject common name.
    #[arg(long, env = "MQD_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
    /// Serve a non-loopback address without TLS and a users file (refused otherwise).
    #[arg(long)]
    insecure: bool,
    /// Store-and-forward: how to reach and authenticate to each destination broker, a TOML
    /// table per host:port with user+password or token, ca, cert+key, domain.
    #[arg(long, env = "MQD_FORWARD_CREDENTIALS")]
    forward_credentials: Option<PathBuf>,
    /// Serve HTTP on this address: GET /metrics (Prometheus), /healthz (live), /readyz (recovered,
    /// journal healthy). Loopback only unless --http-insecure; --http-listen is the same option.
    #[arg(
        long,
        visible_alias = "http-listen",
        value_name = "ADDR",
        env = "MQD_HTTP_LISTEN"
    )]
    metrics_listen: Option<SocketAddr>,
    /// Serve --metrics-listen on a non-loopback address (the HTTP port has no authentication).
    #[arg(long)]
    http_insecure: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Users of the users file.
    #[command(subcommand)]
    User(UserCommand),
}

#[derive(Debug, clap::Subcommand)]
enum UserCommand {
    /// Adds or updates a user: the password is read from MQD_PASSWORD or a prompt and stored as
    /// an argon2id hash. Groups and rights given replace the old ones. Send SIGHUP to a
    /// running mqd to make it reread the file.
    Add {
        /// The users file (created if missing).
        #[arg(long)]
        users: PathBuf,
        /// The user (or a client certificate's common name).
        name: String,
        /// A group the user belongs to (repeat for more); queue rights can be granted to
        /// group:NAME.
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Broker-wide rights, comma-separated: create-queue, outgoing, forward, dead-letter
        /// (and send, receive, peek, admin on every queue).
        #[arg(long, value_delimiter = ',')]
        rights: Vec<String>,
        /// Do not set a password (a certificate or token user).
        #[arg(long)]
        no_password: bool,
        /// Also create a bearer token for the user; it is printed once (only its SHA-256 is
        /// kept).
        #[arg(long)]
        token: bool,
    },
}

fn user_command(cmd: UserCommand) -> anyhow::Result<()> {
    let UserCommand::Add {
        users,
        name,
        groups,
        rights,
        no_password,
        token,
    } = cmd;
    let password = if no_password {
        None
    } else {
        Some(match std::env::var("MQD_PASSWORD") {
            Ok(p) => p,
            Err(_) => {
                let p = rpassword::prompt_password(format!("password for {name}: "))
                    .context("cannot read the password (set MQD_PASSWORD)")?;
                let again = rpassword::prompt_password("again: ")?;
                anyhow::ensure!(p == again, "the passwords differ");
                p
            }
        })
    };
    if let Some(p) = &password {
        anyhow::ensure!(!p.is_empty(), "the password is empty");
    }
    let token = mq_broker::add_user(&users, &name, password.as_deref(), &groups, &rights, token)
        .map_err(anyhow::Error::msg)?;
    if let Some(t) = token {
        println!("{t}");
    }
    eprintln!("user {name} saved in {}", users.display());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::User(cmd)) = args.command {
        return user_command(cmd);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut config = BrokerConfig::new(args.data_dir);
    if let Some(name) = args.name {
        config.name = name;
    }
    config.aliases = args.aliases;
    config.max_body_bytes = args.max_body_bytes;
    config.express_quota_bytes = args.express_quota_bytes;
    config.storage_quota_bytes = args.storage_quota_bytes;
    config.journal_segment_bytes = args.journal_segment_bytes;
    config.truncate_damaged_journal = args.truncate_damaged_journal;
    config.tx_timeout = std::time::Duration::from_secs(args.tx_timeout_secs.max(1));
    if args.tx_outcome_max == 0 || args.tx_outcome_retention.is_zero() {
        anyhow::bail!("--tx-outcome-retention and --tx-outcome-max must be above zero");
    }
    config.tx_outcome_retention = args.tx_outcome_retention;
    config.tx_outcome_max = args.tx_outcome_max;
    if args.forward_retry_min.is_zero() || args.forward_retry_max < args.forward_retry_min {
        anyhow::bail!(
            "--forward-retry-min must be above zero and at most --forward-retry-max (got {:?} and {:?})",
            args.forward_retry_min,
            args.forward_retry_max
        );
    }
    config.forward_retry_min = args.forward_retry_min;
    config.forward_retry_max = args.forward_retry_max;
    config.security.users_file = args.users;
    config.security.tls_cert = args.tls_cert;
    config.security.tls_key = args.tls_key;
    config.security.tls_client_ca = args.tls_client_ca;
    config.security.insecure = args.insecure;
    if let Some(f) = &args.forward_credentials {
        config.security.forward = std::sync::Arc::new(
            mq_broker::SecurityConfig::load_forward_credentials(f).map_err(anyhow::Error::msg)?,
        );
    }
    if args.max_connections == 0
        || args.max_streams_per_connection == 0
        || args.max_unacked_per_stream == 0
        || args.max_unacked_per_connection == 0
        || args.ack_timeout.is_zero()
        || args.max_tx_per_connection == 0
        || args.max_tx_messages == 0
    {
        anyhow::bail!(
            "--max-connections, --max-streams-per-connection, --max-unacked-per-stream, --max-unacked-per-connection, --ack-timeout, --max-tx-messages and --max-tx-per-connection must be above zero"
        );
    }
    if args.max_batch_messages < mq_broker::MIN_MAX_BATCH_MESSAGES {
        anyhow::bail!(
            "--max-batch-messages must be at least {} (a forwarding broker sends batches that big); got {}",
            mq_broker::MIN_MAX_BATCH_MESSAGES,
            args.max_batch_messages
        );
    }
    config.flow = mq_broker::FlowLimits {
        max_connections: args.max_connections,
        max_streams_per_connection: args.max_streams_per_connection,
        max_unacked_per_stream: args.max_unacked_per_stream,
        max_unacked_per_connection: args.max_unacked_per_connection,
        ack_timeout: args.ack_timeout,
        max_tx_bytes: args.max_tx_bytes,
        max_tx_total_bytes: args.max_tx_total_bytes,
        max_tx_messages: args.max_tx_messages,
        max_tx_per_connection: args.max_tx_per_connection,
        max_batch_messages: args.max_batch_messages,
    };
    if args.max_format_name_elements == 0
        || args.max_format_name_elements > mq_proto::format_name::MAX_FORMAT_NAME_ELEMENTS_CEILING
    {
        anyhow::bail!(
            "--max-format-name-elements must be 1 to {} (got {})",
            mq_proto::format_name::MAX_FORMAT_NAME_ELEMENTS_CEILING,
            args.max_format_name_elements
        );
    }
    if args.max_forward_streams_per_peer == 0 || args.max_forward_streams == 0 {
        anyhow::bail!(
            "--max-forward-streams-per-peer and --max-forward-streams must be at least 1"
        );
    }
    config.max_format_name_elements = args.max_format_name_elements;
    config.outgoing_idle_expiry = args.outgoing_idle_expiry;
    config.max_outgoing_queues = args.max_outgoing_queues;
    config.max_forward_streams_per_peer = args.max_forward_streams_per_peer;
    config.max_forward_streams = args.max_forward_streams;
    config.forward_stream_idle = args.forward_stream_idle;
    config.http_listen = args.metrics_listen;
    config.http_insecure = args.http_insecure;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Install the signal handlers before announcing the address, so a SIGTERM sent right after
    // the announcement is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
    // The handshake with scripts and tests: the first line on stdout, printed once the journal
    // is recovered and requests are served.
    let run = mq_broker::run_with_ready(listener, config, shutdown, || {
        println!("listening on {addr}")
    });
    if let Err(e) = run.await {
        // One line an operator can act on (a damaged journal names file and offset), no
        // backtrace, exit status 1.
        eprintln!("mqd: {e}");
        std::process::exit(1);
    }
    Ok(())
}

fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("Ctrl-C received"),
        }
    })
}
