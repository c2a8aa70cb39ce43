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
    /// A transaction open longer than this many seconds is aborted.
    #[arg(long, default_value_t = 60)]
    tx_timeout_secs: u64,
    /// Store-and-forward: first wait before retrying a destination broker that could not be
    /// reached (doubles after each failure), e.g. 100ms, 2s.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    forward_retry_min: std::time::Duration,
    /// Store-and-forward: longest wait between attempts to reach a destination broker.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    forward_retry_max: std::time::Duration,
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
    config.max_body_bytes = args.max_body_bytes;
    config.express_quota_bytes = args.express_quota_bytes;
    config.storage_quota_bytes = args.storage_quota_bytes;
    config.journal_segment_bytes = args.journal_segment_bytes;
    config.tx_timeout = std::time::Duration::from_secs(args.tx_timeout_secs.max(1));
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Install the signal handlers before announcing the address, so a SIGTERM sent right after
    // the announcement is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
    // The handshake with scripts and tests: the first line on stdout, printed once the journal
    // is recovered and requests are served.
    mq_broker::run_with_ready(listener, config, shutdown, || {
        println!("listening on {addr}")
    })
    .await?;
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
