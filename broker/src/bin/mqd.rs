//! `mqd`: the mq broker daemon. Parses flags, sets up logging, binds, and runs the broker until
//! SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser};
use mq_broker::{config_file, BrokerConfig};

// mimalloc instead of glibc's malloc (feature `mimalloc`; docs/benchmarks.md, "Another
// allocator"). The broker's memory trimmer finds out which one it runs on by itself. Fresh
// blocks of 64 KiB-16 MiB (received bodies) are mapped in one call (mq_broker::Prefaulting).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mq_broker::Prefaulting<mimalloc::MiMalloc> =
    mq_broker::Prefaulting(mimalloc::MiMalloc);

/// The mq message-queue broker.
///
/// Prints `listening on <addr>` as its first line on stdout once it accepts connections; logs go
/// to stderr (set the level with RUST_LOG, e.g. RUST_LOG=mq_broker=debug; the default is
/// info,h2=error,hyper=error). SIGTERM or Ctrl-C stops accepting, finishes what is in flight,
/// and exits 0. SIGHUP rereads the --users file.
///
/// Every option below can also be given as a key of the --config file (the flag without its
/// dashes) or as an MQD_* variable (shown with each); the command line wins over the variable,
/// the variable over the file. Exit codes: 0 stopped cleanly, 1 failed (one line on stderr),
/// 2 usage or configuration error (a flag, the --config file, the users or TLS files, an address
/// protected mode refuses).
#[derive(Debug, Parser)]
#[command(name = "mqd", version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Read options from this TOML file: each key is a long flag without its dashes
    /// (`max-body-bytes = 1048576`; see docs/examples/mqd.toml). The command line and MQD_*
    /// variables override it. An unknown key or a bad value stops mqd (exit 2).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration (command line > MQD_* variables > --config file >
    /// defaults) as TOML, which --config reads back, and exit.
    #[arg(long)]
    print_config: bool,
    /// Log lines on stderr: `text` for people, `json` for log collectors (one JSON object per
    /// line, with the queue, peer and identity as fields where an event has them).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Address to listen on; port 0 picks a free port (printed on the first line).
    #[arg(
        long,
        default_value = "127.0.0.1:1801",
        env = "MQD_LISTEN",
        value_name = "ADDR"
    )]
    listen: SocketAddr,
    /// Directory for durable state (created if missing; one mqd per directory).
    #[arg(
        long,
        default_value = "./mq-data",
        env = "MQD_DATA_DIR",
        value_name = "DIR"
    )]
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
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_BODY_BYTES, value_name = "BYTES")]
    max_body_bytes: usize,
    /// Broker-wide quota for express messages held in memory, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_EXPRESS_QUOTA_BYTES, value_name = "BYTES")]
    express_quota_bytes: u64,
    /// Broker-wide quota for recoverable message bytes stored on disk, in bytes.
    #[arg(long, default_value_t = mq_broker::DEFAULT_STORAGE_QUOTA_BYTES, value_name = "BYTES")]
    storage_quota_bytes: u64,
    /// Size of each preallocated journal segment file, in bytes (4 KiB to 4 GiB).
    #[arg(long, default_value_t = mq_broker::DEFAULT_JOURNAL_SEGMENT_BYTES, value_name = "BYTES",
          value_parser = clap::value_parser!(u64).range(4096..=4 << 30))]
    journal_segment_bytes: u64,
    /// Bytes of recently written recoverable message bodies under 64 KiB kept in memory (each
    /// charged its length plus 128 bytes), so that a receiver keeping up with its senders is
    /// served without reading the disk; beyond it the oldest are dropped from memory and read
    /// back from the journal when delivered. 0 (the default) keeps none: measured, the copies
    /// cost the send rate more than the saved reads gave back (docs/benchmarks.md).
    #[arg(long, default_value_t = mq_broker::journal::DEFAULT_BODY_CACHE_BYTES, value_name = "BYTES")]
    journal_body_cache_bytes: u64,
    /// How long the journal's writer keeps looking for the next record after writing a lone
    /// small one, before it sleeps (at most 1ms; 0s: at once): a client that awaits each
    /// transaction before the next one then finds it awake, with no wake-up on the way. It
    /// gives the CPU away between looks; after 8 looks in a row that found nothing it looks
    /// only after one lone record in 65, so a trickle of unrelated records costs little CPU.
    /// Off by default (it costs CPU; docs/benchmarks.md has the trade-off measured); 200us
    /// suits clients that await each transaction. While it is set, transactions' commits go to
    /// the writer (--journal-inline-commits does not apply): on a 2-vCPU VM the spinning writer
    /// did more such transactions a second than inline commits, for ~40% more CPU.
    #[arg(long, default_value = "0s", value_parser = idle_spin, value_name = "DURATION")]
    journal_idle_spin: std::time::Duration,
    /// Whether a transaction's commit is written and synced by the thread that commits it
    /// when the journal's writer has nothing else to do, instead of being handed to the
    /// writer's thread and back: two thread wake-ups fewer per synchronous transaction (a
    /// client that awaits each commit before the next). Under load the writer is busy and
    /// every commit goes through it, as with false. Does not apply while --journal-idle-spin
    /// is set (the spinning writer takes those commits).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    journal_inline_commits: bool,
    /// Messages each priority level of a queue keeps with their headers in memory; the
    /// recoverable messages waiting after them keep only their position (about 8 bytes each
    /// in the queue), and their headers are read back from the journal when they come to the
    /// head, or when looked up. 0 keeps every header in memory.
    #[arg(long, default_value_t = mq_broker::DEFAULT_QUEUE_HEADER_WINDOW, value_name = "MESSAGES")]
    queue_header_window: usize,
    /// Most headers all queues' windows keep in memory together (about 330 bytes each): each
    /// priority level of each queue keeps this / (8 × queues), at most --queue-header-window,
    /// at least one. The default keeps the full window for up to 32 queues.
    #[arg(
        long,
        default_value_t = mq_broker::BrokerConfig::new("").max_window_headers,
        value_name = "HEADERS",
        value_parser = at_least_one()
    )]
    max_window_headers: usize,
    /// Start even if the journal's last segment is damaged before records that were written
    /// after the damage: drop everything from the damage to the end of that segment, and log
    /// what is dropped. Without it mqd refuses to start and names the file and offset.
    #[arg(long)]
    truncate_damaged_journal: bool,
    /// A transaction open longer than this many seconds is aborted.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..), value_name = "SECONDS")]
    tx_timeout_secs: u64,
    /// How long the ids of committed transactions are remembered, so a client whose commit
    /// answer was lost can ask (`mq tx status ID`), e.g. 24h, 30m.
    #[arg(long, default_value = "24h", value_parser = nonzero_duration, value_name = "DURATION")]
    tx_outcome_retention: std::time::Duration,
    /// Most committed transaction ids remembered (the oldest are forgotten first).
    #[arg(long, default_value_t = mq_broker::DEFAULT_TX_OUTCOME_MAX, value_parser = at_least_one())]
    tx_outcome_max: usize,
    /// Store-and-forward: first wait before retrying a destination broker that could not be
    /// reached (doubles after each failure), e.g. 100ms, 2s.
    #[arg(long, default_value = "100ms", value_parser = nonzero_duration, value_name = "DURATION")]
    forward_retry_min: std::time::Duration,
    /// Store-and-forward: longest wait between attempts to reach a destination broker.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    forward_retry_max: std::time::Duration,
    /// Store-and-forward: longest a destination broker may take to answer a forwarding stream
    /// or to acknowledge its oldest batch in flight (from its sending or the last
    /// acknowledgement, whichever is later); past it the connection is given up, the batches go
    /// back to the outgoing queue and are sent again on the next connection, in batches a
    /// quarter of the size (4 MiB at first, at least 64 KiB). A link slower than one message
    /// per timeout needs a longer one.
    #[arg(long, default_value = "60s", value_parser = nonzero_duration, value_name = "DURATION")]
    forward_ack_timeout: std::time::Duration,
    /// Most open client connections. Past it, a new connection closes the oldest one that has
    /// made no request yet (a handshake that never ends, a socket that sends nothing), or is
    /// closed at once if every one has. With --users only a call by someone counts (not an
    /// anonymous one, nor one refused for bad credentials); health checks never count. A
    /// connection whose request is still being read (a login being checked, a stream open) is
    /// never closed to make room.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_connections, value_parser = at_least_one())]
    max_connections: usize,
    /// Most open client connections from one IP address (the Unix socket's do not count);
    /// more are closed at once. No limit of its own unless set: clients behind one proxy or
    /// NAT address, and mqperf's --clients, come from one address.
    #[arg(long, value_parser = at_least_one(), value_name = "N")]
    max_connections_per_address: Option<usize>,
    /// Most concurrent calls (HTTP/2 streams) per connection; more wait for one to end.
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_streams_per_connection,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_streams_per_connection: u32,
    /// Most delivered, unacknowledged messages per receive stream, whatever credit it grants.
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_unacked_per_stream,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    max_unacked_per_stream: u64,
    /// Most delivered, unacknowledged messages per connection (all its receive streams).
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_unacked_per_connection,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    max_unacked_per_connection: u64,
    /// Most bytes of deliveries (bodies, texts and 256 B a message) the receive streams of one
    /// connection hold that the client has not read yet (built, not yet written); past it
    /// they deliver no more until it reads (a stream that ends, e.g. by the ack timeout, drops
    /// what is still queued). Its send streams' answers the client has not taken count here
    /// too (past it they decode no further batch). At most 4 GiB; raised to at least one
    /// stream's budget (16 MiB, or 2 × (--max-body-bytes + 256) if more).
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_unsent_bytes_per_connection,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(1..=u32::MAX as u64)
    )]
    max_unsent_bytes_per_connection: u64,
    /// The same for all connections together (deliveries and send streams' answers): beyond
    /// it a connection holds one batch at a time (its own share, whatever the others hold), so clients that do not read cannot grow
    /// the broker by the per-connection budget times --max-connections. Raised to at least one
    /// connection's budget.
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_unsent_bytes,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(1..=1 << 40)
    )]
    max_unsent_bytes: u64,
    /// A receiver holding a delivered message this long without acknowledging it loses its
    /// stream, and its unacknowledged messages go back to the queue, e.g. 30m, 90s.
    #[arg(long, default_value = "30m", value_parser = nonzero_duration, value_name = "DURATION")]
    ack_timeout: std::time::Duration,
    /// Most bytes one transaction may stage (its sends are held in memory until commit).
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_bytes, value_name = "BYTES")]
    max_tx_bytes: u64,
    /// Most bytes all open transactions together may stage.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_total_bytes, value_name = "BYTES")]
    max_tx_total_bytes: u64,
    /// Most messages (sends and receives) in one transaction (1 to 1,000,000: a commit's
    /// answer names each of its sends).
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_tx_messages,
        value_parser = clap::value_parser!(u64).range(1..=mq_broker::MAX_MAX_TX_MESSAGES)
    )]
    max_tx_messages: u64,
    /// Most open transactions per connection.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_tx_per_connection, value_parser = at_least_one())]
    max_tx_per_connection: usize,
    /// Most open cursors (`mq browse`-style browse streams) per connection.
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_cursors_per_connection, value_parser = at_least_one())]
    max_cursors_per_connection: usize,
    /// A cursor with no request for this many seconds is closed.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = mq_broker::FlowLimits::default().cursor_idle.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    cursor_idle_secs: u64,
    /// A transaction stream with no transaction open (before its first, or between two on a
    /// reused stream) for this long is ended by the broker (cleanly: clients open a new one),
    /// e.g. 60s, 5m.
    #[arg(long, default_value = "60s", value_parser = nonzero_duration, value_name = "DURATION")]
    tx_stream_idle: std::time::Duration,
    /// Most messages in one send batch, transactional send or forwarded batch (at least 512);
    /// a bigger batch ends its stream with one refusal.
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().max_batch_messages,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(mq_broker::MIN_MAX_BATCH_MESSAGES as u64..)
    )]
    max_batch_messages: usize,
    /// Most bytes of request messages received in part (their prefix and some of their bytes
    /// came, not yet all) on one connection; the stream whose bytes go over it is ended with
    /// RESOURCE_EXHAUSTED. Raised to at least one gRPC message (--max-body-bytes + 8 MiB).
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_partial_bytes_per_connection, value_name = "BYTES")]
    max_partial_bytes_per_connection: u64,
    /// The same, for all connections together (raised to at least the per-connection limit).
    #[arg(long, default_value_t = mq_broker::FlowLimits::default().max_partial_bytes, value_name = "BYTES")]
    max_partial_bytes: u64,
    /// A request message must be whole this long after its first byte came, or its stream is
    /// ended with DEADLINE_EXCEEDED (a client that declares a message and stalls holds its
    /// bytes no longer); a Receive, Browse or Forward stream must send its first request (the
    /// one naming the queue) within as long of its opening. E.g. 120s, 10m.
    #[arg(long, default_value = "120s", value_parser = nonzero_duration, value_name = "DURATION")]
    message_arrival_timeout: std::time::Duration,
    /// HTTP/2 flow-control window of one request stream: bytes a client may send on a stream
    /// before the broker reads them (held in memory meanwhile, e.g. behind a send stream whose
    /// answers its client does not read). 65,535 to 2^31 − 1; at most the connection window
    /// (lowered to it).
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().http2_stream_window,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(mq_broker::MIN_HTTP2_WINDOW as i64..=mq_broker::MAX_HTTP2_WINDOW as i64)
    )]
    http2_stream_window: u32,
    /// The same for all streams of one connection together: the broker holds at most
    /// --max-connections × this of request data it has not read (16 GiB with the defaults;
    /// lower it where many untrusted clients connect, at some cost to large sends: see
    /// README's limits table). 65,535 to 2^31 − 1.
    #[arg(
        long,
        default_value_t = mq_broker::FlowLimits::default().http2_connection_window,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(mq_broker::MIN_HTTP2_WINDOW as i64..=mq_broker::MAX_HTTP2_WINDOW as i64)
    )]
    http2_connection_window: u32,
    /// Most elements in a multiple-element format name (FORMATNAME:a,b,...) one send may use.
    #[arg(
        long,
        default_value_t = mq_proto::limits::DEFAULT_MAX_FORMAT_NAME_ELEMENTS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(1..=mq_proto::format_name::MAX_FORMAT_NAME_ELEMENTS_CEILING as u64)
    )]
    max_format_name_elements: usize,
    /// An empty, unpaused outgoing queue unused this long is deleted (e.g. 1h, 10m).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    outgoing_idle_expiry: std::time::Duration,
    /// Most outgoing queues (destination brokers) at once; a send that needs one more is
    /// refused.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_OUTGOING_QUEUES)]
    max_outgoing_queues: usize,
    /// Most queues (subqueues included); a create beyond it is refused.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_QUEUES, value_parser = at_least_one())]
    max_queues: usize,
    /// Most bytes the ACLs of all queues together may hold (each entry counted as its principal
    /// and 64 bytes; every queue keeps its ACL in memory twice); a grant past it is refused
    /// (RESOURCE_EXHAUSTED). Grant to groups rather than to many users one by one.
    #[arg(long, default_value_t = mq_broker::BrokerConfig::new("").max_acl_bytes, value_name = "BYTES")]
    max_acl_bytes: u64,
    /// Most incoming forwarding streams kept per sending address; beyond it the least recently
    /// used idle one is forgotten, and a new stream is refused if all are busy.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_FORWARD_STREAMS_PER_PEER, value_parser = at_least_one())]
    max_forward_streams_per_peer: usize,
    /// Most incoming forwarding streams kept in all; beyond it only the sending peer's own
    /// least recently used idle stream is forgotten, else a new stream is refused.
    #[arg(long, default_value_t = mq_broker::DEFAULT_MAX_FORWARD_STREAMS, value_parser = at_least_one())]
    max_forward_streams: usize,
    /// An incoming forwarding stream unused this long is forgotten with its duplicate mark
    /// (e.g. 24h).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    forward_stream_idle: std::time::Duration,
    /// Users file (TOML, argon2id hashes; see `mqd user add`). Without one, mqd serves only
    /// loopback addresses and every caller has every right. Reread on SIGHUP.
    #[arg(long, env = "MQD_USERS", value_name = "FILE")]
    users: Option<PathBuf>,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "MQD_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "MQD_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mTLS; the identity of a caller is
    /// its certificate's subject common name.
    #[arg(long, env = "MQD_TLS_CLIENT_CA", value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve a non-loopback address without TLS and a users file (refused otherwise).
    #[arg(long)]
    insecure: bool,
    /// Store-and-forward: how to reach and authenticate to each destination broker, a TOML
    /// table per host:port with user+password or token, ca, cert+key, domain.
    #[arg(long, env = "MQD_FORWARD_CREDENTIALS", value_name = "FILE")]
    forward_credentials: Option<PathBuf>,
    /// Serve HTTP on this address: the web console (/), its JSON API (/api/v1/), GET /metrics
    /// (Prometheus), /healthz (live), /readyz (recovered, journal healthy). HTTPS with
    /// --tls-cert; a non-loopback address needs TLS and --users, or --http-insecure;
    /// --http-listen is the same option.
    #[arg(
        long,
        visible_alias = "http-listen",
        value_name = "ADDR",
        env = "MQD_HTTP_LISTEN"
    )]
    metrics_listen: Option<SocketAddr>,
    /// Serve --metrics-listen on a non-loopback address without TLS and a users file.
    #[arg(long)]
    http_insecure: bool,
    /// Most open connections on the HTTP port (console, API, metrics); more are closed as they
    /// are accepted.
    #[arg(long, default_value_t = 256, value_parser = at_least_one(), value_name = "N")]
    http_max_connections: usize,
    /// An HTTP connection that moves no byte either way for this long is closed (a client that
    /// sends half a request, or nothing, holds it no longer), e.g. 60s, 5m.
    #[arg(long, default_value = "60s", value_parser = nonzero_duration, value_name = "DURATION")]
    http_idle_timeout: std::time::Duration,
    /// A request on the HTTP port must have come whole (its headers and body) this long after
    /// its first byte, or its connection is closed when a later byte of it comes: a client
    /// that trickles a byte now and then holds a connection no longer (the idle timeout alone
    /// restarted at every byte), e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = nonzero_duration, value_name = "DURATION")]
    http_request_timeout: std::time::Duration,
    /// Also serve gRPC on this Unix socket, for clients on this machine (`--broker
    /// unix:PATH`): the same services and users as --listen, without TLS, and a hop costs a
    /// fraction of loopback TCP's. The file is made owner and group read-write (0660); a stale
    /// one left by a killed mqd is replaced, and it is removed at a clean stop.
    #[arg(long, value_name = "PATH", env = "MQD_UNIX_SOCKET")]
    unix_socket: Option<PathBuf>,
    /// A caller on --unix-socket that presents no credentials is the user named as its
    /// operating system account (the kernel's SO_PEERCRED), as MSMQ knows a local application
    /// by its Windows account and PostgreSQL's "peer" authentication does: that user's groups
    /// and rights from --users apply (an account not in the file has the rights of `everyone`).
    /// Credentials, when given, still decide; an account without a name (no passwd entry) is
    /// anonymous. Off by default; TCP callers are not affected.
    #[arg(long, requires = "unix_socket", env = "MQD_UNIX_SOCKET_OS_USERS")]
    unix_socket_os_users: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
        /// Broker-wide rights, comma-separated: create-queue, outgoing, forward, dead-letter,
        /// monitor (see every queue and outgoing queue and their counters, read nothing)
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
    // A right that does not exist is a usage error, found before the password is asked for.
    for r in rights
        .iter()
        .flat_map(|r| r.split(','))
        .filter(|r| !r.trim().is_empty())
    {
        if let Err(e) = mq_broker::Right::parse(r) {
            usage_exit(&e);
        }
    }
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

fn main() {
    mq_broker::tune_allocator();
    let ran = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // After a memory trim each worker collects its own allocator heap (memtrim).
        .on_thread_park(mq_broker::on_worker_park)
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run()));
    if let Err(e) = ran {
        // One line with its causes, as the broker's own failures (`--listen` taken, a users
        // file `mqd user` cannot write): anyhow's report was several lines, with a backtrace
        // under RUST_BACKTRACE.
        eprintln!("mqd: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    // One source of truth for every option: the flags below, each also a key of the --config
    // file and an MQD_* variable (see mq_broker::config_file).
    let cmd = config_file::with_env(Args::command(), "MQD_");
    let matches = match config_file::parse(&cmd, std::env::args_os()) {
        Ok(m) => m,
        Err(config_file::LayerError::Clap(e)) => e.exit(),
        Err(config_file::LayerError::File(msg)) => usage_exit(&msg),
    };
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if args.print_config {
        print!("{}", config_file::print(&cmd, &matches));
        return Ok(());
    }
    if let Some(Command::User(cmd)) = args.command {
        return user_command(cmd);
    }
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            // The HTTP/2 libraries' own warnings are about what peers did (a client resetting
            // streams wrote a line per connection: 1,800 lines a second from four clients,
            // helper-67); mqd says what matters to it, at most once a second.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        );
    match args.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One object per line: time, level, target, message and the event's fields at the top
        // level (`queue`, `peer`, `identity`, ...), the spans it is in as a list.
        LogFormat::Json => logs.json().flatten_event(true).with_ansi(false).init(),
    }
    let mut config = BrokerConfig::new(args.data_dir);
    if let Some(name) = args.name {
        config.name = name;
    }
    config.aliases = args.aliases;
    config.max_body_bytes = args.max_body_bytes;
    config.express_quota_bytes = args.express_quota_bytes;
    config.storage_quota_bytes = args.storage_quota_bytes;
    config.journal_segment_bytes = args.journal_segment_bytes;
    config.journal_body_cache_bytes = args.journal_body_cache_bytes;
    config.journal_idle_spin = args.journal_idle_spin;
    config.journal_inline_commits = args.journal_inline_commits;
    config.queue_header_window = args.queue_header_window;
    config.max_window_headers = args.max_window_headers;
    config.truncate_damaged_journal = args.truncate_damaged_journal;
    config.tx_timeout = std::time::Duration::from_secs(args.tx_timeout_secs);
    config.tx_outcome_retention = args.tx_outcome_retention;
    config.tx_outcome_max = args.tx_outcome_max;
    if args.forward_retry_max < args.forward_retry_min {
        usage_exit(&format!(
            "--forward-retry-min must be at most --forward-retry-max (got {:?} and {:?})",
            args.forward_retry_min, args.forward_retry_max
        ));
    }
    config.forward_retry_min = args.forward_retry_min;
    config.forward_retry_max = args.forward_retry_max;
    config.forward_ack_timeout = args.forward_ack_timeout;
    config.security.users_file = args.users;
    config.security.tls_cert = args.tls_cert;
    config.security.tls_key = args.tls_key;
    config.security.tls_client_ca = args.tls_client_ca;
    config.security.insecure = args.insecure;
    if let Some(f) = &args.forward_credentials {
        config.security.forward = std::sync::Arc::new(
            mq_broker::SecurityConfig::load_forward_credentials(f)
                .unwrap_or_else(|e| usage_exit(&e)),
        );
    }
    config.flow = mq_broker::FlowLimits {
        max_connections: args.max_connections,
        max_connections_per_address: args.max_connections_per_address,
        max_streams_per_connection: args.max_streams_per_connection,
        max_unacked_per_stream: args.max_unacked_per_stream,
        max_unacked_per_connection: args.max_unacked_per_connection,
        ack_timeout: args.ack_timeout,
        max_tx_bytes: args.max_tx_bytes,
        max_tx_total_bytes: args.max_tx_total_bytes,
        max_tx_messages: args.max_tx_messages,
        max_tx_per_connection: args.max_tx_per_connection,
        max_cursors_per_connection: args.max_cursors_per_connection,
        cursor_idle: std::time::Duration::from_secs(args.cursor_idle_secs),
        tx_stream_idle: args.tx_stream_idle,
        max_batch_messages: args.max_batch_messages,
        max_unsent_bytes_per_connection: args.max_unsent_bytes_per_connection,
        max_unsent_bytes: args.max_unsent_bytes,
        max_partial_bytes_per_connection: args.max_partial_bytes_per_connection,
        max_partial_bytes: args.max_partial_bytes,
        message_arrival_timeout: args.message_arrival_timeout,
        http2_stream_window: args.http2_stream_window,
        http2_connection_window: args.http2_connection_window,
    };
    config.max_format_name_elements = args.max_format_name_elements;
    config.outgoing_idle_expiry = args.outgoing_idle_expiry;
    config.max_outgoing_queues = args.max_outgoing_queues;
    config.max_queues = args.max_queues;
    config.max_acl_bytes = args.max_acl_bytes;
    config.max_forward_streams_per_peer = args.max_forward_streams_per_peer;
    config.max_forward_streams = args.max_forward_streams;
    config.forward_stream_idle = args.forward_stream_idle;
    config.http_listen = args.metrics_listen;
    config.http_insecure = args.http_insecure;
    config.http_max_connections = args.http_max_connections;
    config.http_idle_timeout = args.http_idle_timeout;
    config.http_request_timeout = args.http_request_timeout;
    config.unix_socket = args.unix_socket;
    config.unix_socket_os_users = args.unix_socket_os_users;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Install the signal handlers before announcing the address, so a SIGTERM sent right after
    // the announcement is a graceful stop, not the default kill.
    let signal = shutdown_signal()?;
    // SIGHUP rereads the users file (the broker's own handler, installed before recovery);
    // without one it must not stop mqd either, as its default action would (the systemd unit's
    // `ExecReload` sends it: helper-67 saw `systemctl reload` end a broker without `--users`).
    ignore_sighup(config.security.users_file.is_some())?;
    // systemd (Type=notify): READY=1 at the broker's readiness hook (recovery done, requests
    // served), STOPPING=1 when the signal starts the graceful stop (where readiness ends).
    let shutdown = async move {
        signal.await;
        notify_systemd(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::Status("stopping"),
        ]);
    };
    // The handshake with scripts and tests: the first line on stdout, printed once the journal
    // is recovered and requests are served.
    let run = mq_broker::run_with_ready(listener, config, shutdown, || {
        println!("listening on {addr}");
        let status = format!("serving on {addr}");
        notify_systemd(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&status),
        ]);
    });
    if let Err(e) = run.await {
        // One line an operator can act on (a damaged journal names file and offset), no
        // backtrace, exit status 1.
        // With its causes: tonic's "transport error" alone named nothing (helper-67).
        let mut line = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            // Most of mqd's errors end with their cause already.
            let text = c.to_string();
            if !line.ends_with(&text) {
                line.push_str(&format!(": {text}"));
            }
            cause = c.source();
        }
        eprintln!("mqd: {line}");
        // A configuration mistake (users file, TLS files, protected mode) is exit status 2,
        // as a bad flag: the systemd unit does not restart mqd on it (helper-73).
        std::process::exit(if e.is_configuration() { 2 } else { 1 });
    }
    Ok(())
}

/// Tells the service manager (`$NOTIFY_SOCKET`; nothing without it) how mqd is doing.
fn notify_systemd(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// A configuration mistake: one line on stderr, exit status 2 (a usage error).
fn usage_exit(msg: &str) -> ! {
    eprintln!("mqd: {msg}");
    std::process::exit(2)
}

/// A count option's parser: 1 or more.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// A duration option's parser (humantime: 100ms, 30s, 24h), above zero.
fn nonzero_duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be above zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// `--journal-idle-spin`: a duration of at most `MAX_IDLE_SPIN` (1 ms).
fn idle_spin(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    let max = mq_broker::journal::MAX_IDLE_SPIN;
    if d > max {
        return Err(format!(
            "must be at most {}",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// The log filter without RUST_LOG.
const DEFAULT_LOG_FILTER: &str = "info,h2=error,hyper=error";

/// Takes SIGHUP from its default action (end the process) for good; without a users file,
/// says at each one that there is nothing to reread.
fn ignore_sighup(users_file_given: bool) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if !users_file_given {
                tracing::info!("SIGHUP: no users file to reread (mqd --users); nothing changed");
            }
        }
    });
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
