//! Identities and rights: the users file, credentials, per-queue ACLs, and [`Auth::authorize`].
//!
//! An [`Identity`] is established once per connection/stream (per RPC call) by
//! [`Auth::authenticate`], in the layer in front of the service ([`crate::auth_layer`]): an
//! `authorization: Basic` user and password (checked against the argon2id hash in the users
//! file on a blocking thread, a core at a time; verified credentials are cached, so a hash is
//! computed once per credentials, not per call; failures are not cached but limited per peer
//! address; an unknown user costs the same hash), an `authorization: Bearer` token (its SHA-256
//! is in the users file), a client certificate's subject common name (mTLS; it must be a valid
//! user name), or `anonymous`. The service calls [`Auth::authorize`] before it touches the
//! broker.
//!
//! Without a users file the broker is in protected mode: it serves loopback only (checked at
//! start) and every caller has every right.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use crate::queue::{Queue, QueueRole};

/// One right. Queue rights are granted per queue (or broker-wide in the users file);
/// broker rights only in the users file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Right {
    /// Send to a queue.
    Send,
    /// Receive (remove) from a queue.
    Receive,
    /// Peek at a queue.
    Peek,
    /// Delete, purge, change the rights of a queue.
    Admin,
    /// Create queues.
    CreateQueue,
    /// List, pause and resume outgoing queues.
    Outgoing,
    /// Open `Forward` streams (brokers).
    Forward,
    /// Read and purge the dead-letter queues.
    DeadLetter,
    /// See every queue and outgoing queue with its counters (lists, queue info, `/metrics`),
    /// without reading, sending or changing anything (RabbitMQ's `monitoring` tag).
    Monitor,
}

impl Right {
    pub const ALL: [Right; 9] = [
        Right::Send,
        Right::Receive,
        Right::Peek,
        Right::Admin,
        Right::CreateQueue,
        Right::Outgoing,
        Right::Forward,
        Right::DeadLetter,
        Right::Monitor,
    ];
    /// The rights a queue's ACL can hold.
    pub const QUEUE: [Right; 4] = [Right::Send, Right::Receive, Right::Peek, Right::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Right::Send => "send",
            Right::Receive => "receive",
            Right::Peek => "peek",
            Right::Admin => "admin",
            Right::CreateQueue => "create-queue",
            Right::Outgoing => "outgoing",
            Right::Forward => "forward",
            Right::DeadLetter => "dead-letter",
            Right::Monitor => "monitor",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u8)
    }

    pub fn is_queue_right(self) -> bool {
        Right::QUEUE.contains(&self)
    }

    /// Parses one right name.
    pub fn parse(s: &str) -> Result<Right, String> {
        let s = s.trim().to_ascii_lowercase();
        Right::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                format!(
                    "\"{}\" is not a right; rights are {}",
                    crate::auth::quote(&s),
                    Right::ALL.map(|r| r.name()).join(", ")
                )
            })
    }
}

/// A set of rights (bits). Journaled (in a queue's ACL) as one byte: an ACL holds queue rights
/// only (bits 0 to 3), and the byte keeps journals written before `monitor` (bit 8) readable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "u8", into = "u8")]
pub struct Rights(u16);

impl From<u8> for Rights {
    fn from(b: u8) -> Rights {
        Rights(u16::from(b))
    }
}

impl From<Rights> for u8 {
    fn from(r: Rights) -> u8 {
        debug_assert!(r.0 <= 0xff, "broker-wide rights in a journaled ACL: {r:?}");
        r.0 as u8
    }
}

impl Rights {
    pub const ALL: Rights = Rights(0x1ff);
    pub fn contains(self, r: Right) -> bool {
        self.0 & r.bit() != 0
    }
    pub fn insert(&mut self, r: Right) {
        self.0 |= r.bit();
    }
    pub fn remove(&mut self, r: Right) {
        self.0 &= !r.bit();
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn names(self) -> Vec<&'static str> {
        Right::ALL
            .into_iter()
            .filter(|r| self.contains(*r))
            .map(Right::name)
            .collect()
    }
    /// Parses `send,receive` (or `all` for every queue right).
    pub fn parse_list(s: &str, queue_only: bool) -> Result<Rights, String> {
        let mut out = Rights::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            if part.trim().eq_ignore_ascii_case("all") {
                for r in Right::QUEUE {
                    out.insert(r);
                }
                continue;
            }
            let r = Right::parse(part).map_err(|e| {
                if queue_only {
                    format!(
                        "\"{}\" is not a queue right; queue rights are send, receive, peek, admin (or all)",
                        crate::auth::quote(part.trim())
                    )
                } else {
                    e
                }
            })?;
            if queue_only && !r.is_queue_right() {
                return Err(format!(
                    "\"{}\" is a broker-wide right (given in the users file: mqd user add --rights); queue rights are send, receive, peek, admin",
                    r.name()
                ));
            }
            out.insert(r);
        }
        if out.is_empty() {
            return Err("no rights given".into());
        }
        Ok(out)
    }
}

/// Who may do what with one queue: principal -> rights. Principals are user or certificate
/// names, `group:NAME`, `everyone` (every authenticated caller) and `anonymous`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Acl(pub BTreeMap<String, Rights>);

/// The principal every authenticated identity matches.
pub const EVERYONE: &str = "everyone";
/// The principal of callers without credentials.
pub const ANONYMOUS: &str = "anonymous";
/// Most entries in one queue's ACL.
pub const MAX_ACL_ENTRIES: usize = 256;
/// Longest principal name in an ACL, in characters.
pub const MAX_PRINCIPAL_CHARS: usize = 128;
/// Default `--max-acl-bytes`: most bytes the ACLs of all queues together may hold, each entry
/// counted as its principal and [`ACL_ENTRY_BYTES`]; a grant past it is refused
/// (`RESOURCE_EXHAUSTED`). Every queue keeps its ACL in memory twice (its definition and the
/// live copy): 256 entries of 128 four-byte characters cost ~563 KiB a queue, and at 200,000
/// queues nothing else bounded it.
pub const MAX_ACL_BYTES: u64 = 64 << 20;
/// What an ACL entry is counted beside its principal's bytes.
pub const ACL_ENTRY_BYTES: u64 = 64;

impl Acl {
    /// What this ACL counts against [`MAX_ACL_BYTES`].
    pub fn counted_bytes(&self) -> u64 {
        self.0
            .keys()
            .map(|p| p.len() as u64 + ACL_ENTRY_BYTES)
            .sum()
    }

    /// The ACL of a new queue: its creator gets every right (none recorded for anonymous).
    pub fn for_creator(who: &Identity) -> Acl {
        let mut acl = Acl::default();
        if !who.anonymous {
            let mut all = Rights::default();
            for r in Right::QUEUE {
                all.insert(r);
            }
            acl.0.insert(who.name.to_string(), all);
        }
        acl
    }

    /// Rights `who` holds through this ACL.
    fn rights_of(&self, who: &Identity) -> Rights {
        let mut r = 0u16;
        let mut add = |p: &str| {
            if let Some(x) = self.0.get(p) {
                r |= x.0;
            }
        };
        if who.anonymous {
            add(ANONYMOUS);
        } else {
            add(&who.name);
            add(EVERYONE);
            for g in who.groups.iter() {
                add(&format!("group:{g}"));
            }
        }
        Rights(r)
    }

    /// Grants (or revokes) `rights` to `who`.
    pub fn change(&mut self, who: &str, rights: Rights, grant: bool) -> Result<(), String> {
        let who = who.trim();
        if who.is_empty() || who.chars().count() > MAX_PRINCIPAL_CHARS {
            return Err(format!(
                "a principal must be 1 to {MAX_PRINCIPAL_CHARS} characters (a user, group:NAME, everyone or anonymous)"
            ));
        }
        if who.chars().any(char::is_control) {
            return Err(format!(
                "principal \"{}\" contains control characters",
                quote(who)
            ));
        }
        let who = if who.eq_ignore_ascii_case(EVERYONE) || who.eq_ignore_ascii_case(ANONYMOUS) {
            who.to_ascii_lowercase()
        } else if let Some(group) = who
            .get(..6)
            .filter(|p| p.eq_ignore_ascii_case("group:"))
            .map(|_| &who[6..])
        {
            // `Group:x` would never match: the prefix is always spelled `group:`.
            if group.is_empty() || group.contains(':') {
                return Err(format!("principal \"{}\" is not group:NAME", quote(who)));
            }
            format!("group:{group}")
        } else if who.contains(':') {
            return Err(format!(
                "principal \"{}\" is not a user, group:NAME, everyone or anonymous",
                quote(who)
            ));
        } else {
            who.to_string()
        };
        if grant {
            if !self.0.contains_key(&who) && self.0.len() >= MAX_ACL_ENTRIES {
                return Err(format!(
                    "a queue's ACL holds at most {MAX_ACL_ENTRIES} entries; grant to a group instead"
                ));
            }
            let e = self.0.entry(who).or_default();
            e.0 |= rights.0;
        } else if let Some(e) = self.0.get_mut(&who) {
            e.0 &= !rights.0;
            if e.is_empty() {
                self.0.remove(&who);
            }
        }
        Ok(())
    }
}

/// How an identity was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKind {
    Anonymous,
    Password,
    Token,
    Certificate,
    /// A caller on the Unix socket known by its operating system account
    /// (`mqd --unix-socket-os-users`).
    OsUser,
}

/// Who is calling, established once per connection/stream.
#[derive(Debug, Clone)]
pub struct Identity {
    pub name: Arc<str>,
    pub kind: IdentityKind,
    pub anonymous: bool,
    groups: Arc<[String]>,
    /// Broker-wide rights from the users file.
    rights: Rights,
    pub peer: Option<SocketAddr>,
    /// The users file it was established against (its reading's number) and a fingerprint
    /// of its entry there (`None`: not established against a users file). See [`Standing`].
    entry: Option<(u64, u64)>,
}

impl Identity {
    pub fn anonymous(peer: Option<SocketAddr>) -> Identity {
        Identity {
            name: Arc::from(ANONYMOUS),
            kind: IdentityKind::Anonymous,
            anonymous: true,
            groups: Arc::from(Vec::new()),
            rights: Rights::default(),
            peer,
            entry: None,
        }
    }

    /// The identity of a request (set by [`Auth::authenticate`]); anonymous if none.
    pub fn of<T>(req: &Request<T>) -> Identity {
        req.extensions()
            .get::<Identity>()
            .cloned()
            .unwrap_or_else(|| Identity::anonymous(req.remote_addr()))
    }
}

/// The users file (TOML): `[users.NAME]` with `password` (argon2id PHC string), `tokens`
/// (`sha256:HEX` of bearer tokens), `groups`, `rights` (broker-wide).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsersFile {
    #[serde(default)]
    pub users: BTreeMap<String, UserEntry>,
}

#[derive(Debug, Clone, Default, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rights: Vec<String>,
}

/// The users file, checked and indexed.
#[derive(Debug, Default)]
struct Users {
    file: UsersFile,
    rights: HashMap<String, Rights>,
    by_token: HashMap<String, String>,
    /// SHA-256 of `user \0 password` -> the verified user (successes only), checked against
    /// this file: a reread starts a new one, so a login verified against the file before (and
    /// finishing after the reread) cannot outlive it.
    cache: Mutex<HashMap<[u8; 32], String>>,
    /// Which reading of the file this is (0 the first, one more at each SIGHUP).
    generation: u64,
}

/// A fingerprint of a user's entry in the users file (`None`: not in it).
fn entry_fingerprint(entry: Option<&UserEntry>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    entry.hash(&mut h);
    h.finish()
}

/// The largest users file read (about 300,000 users with passwords): a bigger one (a wrong
/// path, `/dev/zero`) is refused rather than read into memory whole.
pub(crate) const MAX_USERS_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The users file's text, at most [`MAX_USERS_FILE_BYTES`].
fn read_users_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read the users file {}: {e}", path.display());
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(cannot)?
        .take(MAX_USERS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > MAX_USERS_FILE_BYTES {
        return Err(format!(
            "the users file {} is larger than {} MiB",
            path.display(),
            MAX_USERS_FILE_BYTES >> 20
        ));
    }
    Ok(text)
}

impl Users {
    fn load(path: &Path) -> Result<Users, String> {
        let text = read_users_file(path)?;
        let file: UsersFile = toml::from_str(&text)
            .map_err(|e| format!("the users file {} is not valid: {e}", path.display()))?;
        let mut rights = HashMap::new();
        let mut by_token = HashMap::new();
        for (name, u) in &file.users {
            check_user_name(name).map_err(|e| format!("the users file {}: {e}", path.display()))?;
            let mut r = Rights::default();
            for s in &u.rights {
                r.insert(Right::parse(s).map_err(|e| {
                    format!("the users file {}: user \"{name}\": {e}", path.display())
                })?);
            }
            rights.insert(name.clone(), r);
            if let Some(p) = &u.password {
                check_hash(p).map_err(|e| {
                    format!(
                        "the users file {}: user \"{name}\": the password is not an argon2 hash ({e}); set it with mqd user add",
                        path.display()
                    )
                })?;
            }
            for t in &u.tokens {
                by_token.insert(t.to_ascii_lowercase(), name.clone());
            }
        }
        Ok(Users {
            file,
            rights,
            by_token,
            cache: Mutex::new(HashMap::new()),
            generation: 0,
        })
    }

    fn identity(&self, name: &str, kind: IdentityKind, peer: Option<SocketAddr>) -> Identity {
        let groups = self
            .file
            .users
            .get(name)
            .map(|u| u.groups.clone())
            .unwrap_or_default();
        Identity {
            name: Arc::from(name),
            kind,
            anonymous: false,
            groups: Arc::from(groups),
            rights: self.rights.get(name).copied().unwrap_or_default(),
            peer,
            entry: Some((
                self.generation,
                entry_fingerprint(self.file.users.get(name)),
            )),
        }
    }
}

/// Checks a user name for the users file and ACLs.
pub fn check_user_name(name: &str) -> Result<(), String> {
    let n = name.chars().count();
    if n == 0 || n > MAX_PRINCIPAL_CHARS {
        return Err(format!(
            "user name \"{}\" must be 1 to {MAX_PRINCIPAL_CHARS} characters",
            quote(name)
        ));
    }
    if name.contains(':') || name.chars().any(char::is_control) {
        return Err(format!(
            "user name \"{}\" may not contain ':' or control characters",
            quote(name)
        ));
    }
    if name.trim() != name {
        return Err(format!(
            "user name \"{}\" may not begin or end with white space (it would look like another)",
            quote(name)
        ));
    }
    if name.eq_ignore_ascii_case(EVERYONE) || name.eq_ignore_ascii_case(ANONYMOUS) {
        return Err(format!("\"{name}\" is reserved"));
    }
    Ok(())
}

/// Most verified credentials remembered (only successes; when full, more are verified again
/// each time; cleared on reload).
const CREDENTIAL_CACHE: usize = 10_000;
/// Refusals from one peer address are logged at most once per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Peers tracked by the refusal log limiter.
const REFUSAL_LOG_PEERS: usize = 4096;
/// Failed password checks allowed per peer address in [`FAILURE_WINDOW`]; beyond them the
/// peer's password checks (not yet verified credentials) are refused without hashing.
pub(crate) const MAX_FAILURES_PER_PEER: u32 = 20;
/// The window [`MAX_FAILURES_PER_PEER`] counts in.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Password checks under way (waiting for a core or hashing) per [`FailKey`] that failed a
/// login in its window, at most.
const MAX_CHECKS_PER_PEER: u32 = 2;
/// The same for a clean [`FailKey`] (a pool opening its connections at once).
const MAX_CLEAN_CHECKS_PER_PEER: u32 = 16;
/// Password checks under way in all at most (a hash takes ~15–30 ms of a core here, so the
/// last of them waits about a second).
const MAX_CHECKS: usize = 64;

/// Password checks under way (see `Auth::start_check`).
#[derive(Debug, Default)]
struct Checks {
    /// Per key that failed a login in its window.
    per_key: HashMap<FailKey, u32>,
    /// Per clean key.
    clean_per_key: HashMap<FailKey, u32>,
    /// Of callers whose key failed, in all.
    failing: usize,
    /// Of callers from clean keys, in all.
    clean: usize,
}

/// A password check under way (see `Auth::start_check`).
struct Checking<'a> {
    auth: &'a Auth,
    key: Option<FailKey>,
    /// Counted with the clean keys' checks.
    clean: bool,
}

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        let mut c = self.auth.checking.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut *c;
        let per_key = if self.clean {
            c.clean -= 1;
            &mut c.clean_per_key
        } else {
            c.failing -= 1;
            &mut c.per_key
        };
        if let Some(k) = self.key {
            if let Some(n) = per_key.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    per_key.remove(&k);
                }
            }
        }
    }
}

/// Peer addresses tracked by the failure limiter (when full, those whose window passed are
/// dropped; a new peer beyond it is not tracked, the hashing semaphore still bounds the cost).
const FAILURE_PEERS: usize = 4096;

/// Whom the failed-login limiter counts: an IPv4 address; an IPv6 address's /64 (what one
/// host or site is given: counting each address would give it 2^64 times the guesses); a
/// caller on the Unix socket by its account (not as the loopback address, whose TCP callers it
/// would otherwise lock out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum FailKey {
    Ip(IpAddr),
    Local(Option<u32>),
}

impl FailKey {
    pub(crate) fn of(peer: Option<SocketAddr>, local_uid: Option<u32>) -> Option<FailKey> {
        let peer = peer?;
        if peer == crate::flow::LocalConnectInfo::ADDR {
            return Some(FailKey::Local(local_uid));
        }
        Some(FailKey::Ip(match peer.ip() {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let mut o = v6.octets();
                    o[8..].fill(0);
                    IpAddr::V6(o.into())
                }
            },
            v4 => v4,
        }))
    }
}

impl std::fmt::Display for FailKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailKey::Ip(IpAddr::V6(v6)) => write!(f, "{v6}/64"),
            FailKey::Ip(ip) => write!(f, "{ip}"),
            FailKey::Local(Some(uid)) => write!(f, "the Unix socket's uid {uid}"),
            FailKey::Local(None) => write!(f, "the Unix socket"),
        }
    }
}

/// What a caller presented: the `authorization` header, its address, its client
/// certificate's name (mTLS).
#[derive(Default)]
pub(crate) struct Presented {
    pub authorization: Option<Result<String, ()>>,
    pub peer: Option<SocketAddr>,
    /// The client certificate's subject common name, or why it has none that can be used.
    pub cert_name: Option<Result<String, String>>,
    /// The user id of a caller on the Unix socket (`SO_PEERCRED`).
    pub local_uid: Option<u32>,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("peer", &self.peer)
            .field("cert_name", &self.cert_name)
            .field("local_uid", &self.local_uid)
            .finish()
    }
}

/// Ends a long-lived stream (receive, send, transaction, cursor) once its identity no longer
/// stands: its user was removed from the users file, or its entry changed (password, tokens,
/// groups, rights), when the file is reread (SIGHUP). Before, such a stream went on with the
/// rights it was opened with for as long as it lived (helper-61): removing a user revoked
/// nothing already open. Checked before each message or request a stream takes, and only
/// after a reread (one atomic load otherwise).
pub(crate) struct Standing {
    auth: Arc<Auth>,
    who: Identity,
    seen: u64,
}

impl Standing {
    pub(crate) fn new(auth: &Arc<Auth>, who: &Identity) -> Standing {
        Standing {
            auth: auth.clone(),
            who: who.clone(),
            seen: who.entry.map_or(0, |(g, _)| g),
        }
    }

    /// The status that ends the stream, once its identity no longer stands.
    pub(crate) fn lost(&mut self) -> Option<Status> {
        self.who.entry?;
        let now = self.auth.generation.load(Ordering::Acquire);
        if now == self.seen {
            return None;
        }
        self.seen = now;
        (!self.auth.still_stands(&self.who)).then(|| {
            Status::unauthenticated(format!(
                "identity \"{}\" was removed from the users file or its entry changed (the file was reread): this stream ends; connect again with valid credentials",
                quote(&self.who.name)
            ))
        })
    }
}

/// Identities and rights of one broker.
#[derive(Debug)]
pub struct Auth {
    path: Option<PathBuf>,
    users: RwLock<Option<Arc<Users>>>,
    /// The generation of the users file in force (see [`Users`]), read by [`Standing`].
    generation: AtomicU64,
    refusals: Mutex<HashMap<IpAddr, (Instant, u64)>>,
    /// Per [`FailKey`]: start of its failure window, failures in it.
    failures: Mutex<HashMap<FailKey, (Instant, u32)>>,
    /// Password hashes computed at once (off the async workers), at most one per core.
    hashing: tokio::sync::Semaphore,
    /// One more, only for callers whose address has no failure in its window: while others'
    /// guesses keep every core busy, a caller from a clean address waits behind no queue.
    clean_hashing: tokio::sync::Semaphore,
    /// Password checks under way (waiting or hashing): per [`FailKey`] with failures, in all
    /// for such keys, and in all for clean ones (see `Auth::start_check`).
    checking: Mutex<Checks>,
    /// `mqd --unix-socket-os-users`: a Unix socket caller without credentials is its account.
    os_users: bool,
    /// User id -> account name (`None`: no passwd entry), at most [`OS_USER_CACHE`] ids;
    /// forgotten when the users file is reread (SIGHUP).
    os_names: Mutex<HashMap<u32, Option<String>>>,
}

/// The identity `name` established as `kind` without a password (a certificate, an OS
/// account): with its groups and rights from the users file, or none of them without one.
fn named(
    users: Option<&Users>,
    name: &str,
    kind: IdentityKind,
    peer: Option<SocketAddr>,
) -> Identity {
    match users {
        Some(u) => u.identity(name, kind, peer),
        None => Identity {
            name: Arc::from(name),
            kind,
            anonymous: false,
            groups: Arc::from(Vec::new()),
            rights: Rights::default(),
            peer,
            entry: None,
        },
    }
}

/// Account names remembered by user id (a machine has few; when full, the cache starts over).
const OS_USER_CACHE: usize = 1024;

/// The name of the operating system account `uid` (`getpwuid_r`), if it has a passwd entry.
/// May block on the name service (NSS): called off the async workers.
#[allow(unsafe_code)]
pub fn os_user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `pwd` and `result` are out-parameters getpwuid_r fills; `buf` is the scratch
        // space it may use, of the length passed; the strings `pwd` points to live in `buf`,
        // and are copied out before it goes.
        unsafe {
            let mut pwd: libc::passwd = std::mem::zeroed();
            let mut result: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwuid_r(
                uid,
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            );
            if rc == libc::ERANGE && buf.len() < (1 << 20) {
                buf.resize(buf.len() * 4, 0);
                continue;
            }
            if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
                return None;
            }
            return std::ffi::CStr::from_ptr(pwd.pw_name)
                .to_str()
                .ok()
                .map(str::to_string);
        }
    }
}

/// An argon2id hash of nothing anyone knows, verified for an unknown user so that the answer
/// takes as long as for a known one (no user enumeration by timing).
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        hash_password(&uuid::Uuid::new_v4().to_string()).unwrap_or_else(|_| {
            "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into()
        })
    })
}

impl Auth {
    fn with(path: Option<PathBuf>, users: Option<Users>) -> Auth {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Auth {
            path,
            users: RwLock::new(users.map(Arc::new)),
            generation: AtomicU64::new(0),
            refusals: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            hashing: tokio::sync::Semaphore::new(cores),
            clean_hashing: tokio::sync::Semaphore::new(1),
            checking: Mutex::new(Checks::default()),
            os_users: false,
            os_names: Mutex::new(HashMap::new()),
        }
    }

    /// `on`: a caller on the Unix socket that presents no credentials is the user named as its
    /// operating system account (`mqd --unix-socket-os-users`).
    pub fn with_os_users(mut self, on: bool) -> Auth {
        self.os_users = on;
        self
    }

    /// The account name of `uid`, remembered; looked up on a blocking thread.
    async fn os_name(&self, uid: u32) -> Option<String> {
        if let Some(hit) = self
            .os_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&uid)
        {
            return hit.clone();
        }
        let name = tokio::task::spawn_blocking(move || os_user_name(uid))
            .await
            .ok()
            .flatten();
        let mut names = self.os_names.lock().unwrap_or_else(|p| p.into_inner());
        if names.len() >= OS_USER_CACHE {
            names.clear();
        }
        names.insert(uid, name.clone());
        name
    }

    /// Protected mode: no users file, every caller has every right.
    pub fn open() -> Auth {
        Auth::with(None, None)
    }

    /// Reads the users file at `path`.
    pub fn from_file(path: &Path) -> Result<Auth, String> {
        let users = Users::load(path)?;
        Ok(Auth::with(Some(path.to_path_buf()), Some(users)))
    }

    /// Whether a users file is in force (else every caller has every right).
    pub fn has_users(&self) -> bool {
        self.path.is_some()
    }

    /// Rereads the users file (SIGHUP). On error the old one stays in force.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let mut users = Users::load(path)?;
        let n = users.file.users.len();
        // The remembered logins go with the old file (see `Users::cache`).
        {
            let mut slot = self.users.write().unwrap_or_else(|p| p.into_inner());
            users.generation = self.generation.load(Ordering::Acquire) + 1;
            *slot = Some(Arc::new(users));
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        // Account names are looked up again too (an account renamed since).
        self.os_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        Ok(n)
    }

    /// Whether `who` still stands as it was established: established without a users file,
    /// or its entry in the file in force is the same (not removed, its password, tokens,
    /// groups and rights unchanged).
    pub(crate) fn still_stands(&self, who: &Identity) -> bool {
        let Some((_, fingerprint)) = who.entry else {
            return true;
        };
        self.users()
            .is_some_and(|u| entry_fingerprint(u.file.users.get(&*who.name)) == fingerprint)
    }

    fn users(&self) -> Option<Arc<Users>> {
        self.users.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a call by `who` keeps its connection's place at `--max-connections`
    /// ([`crate::flow::Proof`]): any call without a users file; with one, a call by someone
    /// the broker knows (a password, token, certificate or account), not an anonymous one, so
    /// that connections of callers nobody vouched for give way to new connections at the limit.
    pub(crate) fn proves(&self, who: &Identity) -> bool {
        !who.anonymous || self.users().is_none()
    }

    /// Establishes the caller's identity (see [`crate::auth_layer`], in front of the service),
    /// or refuses: UNAUTHENTICATED for bad credentials, RESOURCE_EXHAUSTED for a peer over the
    /// failed-login limit. A password is hashed off the async workers, a core at a time.
    pub(crate) async fn authenticate(&self, p: Presented) -> Result<Identity, Status> {
        let peer = p.peer;
        match self.identify(p).await {
            Ok(who) => Ok(who),
            Err(status) => {
                self.log_refusal(peer, "?", None, status.message());
                Err(status)
            }
        }
    }

    async fn identify(&self, p: Presented) -> Result<Identity, Status> {
        let peer = p.peer;
        let users = self.users();
        let refuse = |why: String| Status::unauthenticated(why);
        if let (Some(h), Some(users)) = (p.authorization, &users) {
            let h = h.map_err(|()| refuse("the authorization header is not text".into()))?;
            // The scheme is case-insensitive, and may be followed by more than one space
            // (RFC 9110 §11.1, §11.4): some clients send `basic`.
            let (scheme, rest) = h.split_once(' ').unwrap_or((&h, ""));
            let rest = rest.trim_start_matches(' ');
            if scheme.eq_ignore_ascii_case("Basic") {
                let b = rest;
                let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b)
                    .map_err(|_| refuse("the Basic credentials are not base64".into()))?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| refuse("the Basic credentials are not UTF-8".into()))?;
                let (user, password) = raw
                    .split_once(':')
                    .ok_or_else(|| refuse("the Basic credentials must be user:password".into()))?;
                let fails = FailKey::of(peer, p.local_uid);
                let name = self.verify_password(users, user, password, fails).await?;
                return Ok(users.identity(&name, IdentityKind::Password, peer));
            }
            if scheme.eq_ignore_ascii_case("Bearer") {
                let t = rest;
                let key = format!("sha256:{}", hex(&Sha256::digest(t.trim().as_bytes())));
                let name = users.by_token.get(&key).ok_or_else(|| {
                    refuse(
                        "the bearer token is not known to this broker (mqd user add --token)"
                            .into(),
                    )
                })?;
                return Ok(users.identity(name, IdentityKind::Token, peer));
            }
            return Err(refuse(
                "the authorization header must be Basic or Bearer".into(),
            ));
        }
        if let Some(name) = p.cert_name {
            // A certificate's name is a user name: no `group:`, `everyone` or `anonymous`.
            let name = name.map_err(|e| refuse(format!("the client certificate: {e}")))?;
            check_user_name(&name).map_err(|e| {
                refuse(format!(
                    "the client certificate's subject common name is not a valid identity: {e}"
                ))
            })?;
            // With a users file, a certificate is someone only if the file names it: removing
            // the entry (and SIGHUP) revokes every certificate of that name, which mq has no
            // revocation list for (as RabbitMQ's EXTERNAL mechanism wants the user to exist).
            if let Some(u) = &users {
                if !u.file.users.contains_key(&name) {
                    return Err(refuse(format!(
                        "the client certificate's common name \"{}\" is not a user in the users file (mqd user add --no-password NAME)",
                        quote(&name)
                    )));
                }
            }
            return Ok(named(
                users.as_deref(),
                &name,
                IdentityKind::Certificate,
                peer,
            ));
        }
        if let (true, Some(uid)) = (self.os_users, p.local_uid) {
            // An account whose name cannot be a user name (one with ':' in it) stays anonymous.
            if let Some(name) = self
                .os_name(uid)
                .await
                .filter(|n| check_user_name(n).is_ok())
            {
                return Ok(named(users.as_deref(), &name, IdentityKind::OsUser, peer));
            }
        }
        Ok(Identity::anonymous(peer))
    }

    /// Checks `user`'s password: remembered successes at once; else, unless `peer` is over the
    /// failed-login limit, an argon2 verification on a blocking thread (a dummy one for an
    /// unknown user).
    async fn verify_password(
        &self,
        users: &Users,
        user: &str,
        password: &str,
        fails: Option<FailKey>,
    ) -> Result<String, Status> {
        let mut h = Sha256::new();
        h.update(user.as_bytes());
        h.update([0u8]);
        h.update(password.as_bytes());
        let key: [u8; 32] = h.finalize().into();
        if let Some(hit) = users
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(hit.clone());
        }
        if let Some(k) = fails {
            self.check_failures(k)?;
        }
        let hash = users.file.users.get(user).and_then(|u| u.password.clone());
        let known = hash.is_some();
        let hash = hash.unwrap_or_else(|| dummy_hash().to_string());
        let password = password.to_string();
        let clean = fails.is_none_or(|k| self.is_clean(k));
        let _checking = self.start_check(fails, clean)?;
        let shut = |_| Status::unavailable("the broker is shutting down");
        let ok = {
            let _permit = if clean {
                tokio::select! {
                    p = self.hashing.acquire() => p.map_err(shut)?,
                    p = self.clean_hashing.acquire() => p.map_err(shut)?,
                }
            } else {
                self.hashing.acquire().await.map_err(shut)?
            };
            // Again now: calls that waited for a permit count the failures of those before.
            if let Some(k) = fails {
                self.check_failures(k)?;
            }
            tokio::task::spawn_blocking(move || verify_hash(&hash, &password))
                .await
                .unwrap_or(false)
        } && known;
        if ok {
            let mut cache = users.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() < CREDENTIAL_CACHE {
                cache.insert(key, user.to_string());
            }
            Ok(user.to_string())
        } else {
            if let Some(k) = fails {
                self.count_failure(k);
            }
            Err(Status::unauthenticated(format!(
                "user \"{}\" or its password is wrong",
                quote(user)
            )))
        }
    }

    /// Counts a password check under way, or refuses it. A caller whose address failed a
    /// login in its window has at most [`MAX_CHECKS_PER_PEER`] under way, and such callers
    /// [`MAX_CHECKS`] in all; a caller from a clean address (a pool opening its connections at
    /// once) [`MAX_CLEAN_CHECKS_PER_PEER`], and such callers [`MAX_CHECKS`] of their own. Without these
    /// bounds, failed logins from 800 addresses (each under its failure limit) queued for the
    /// hashing cores without end: a new user's login waited 90 s and failed (helper-67).
    #[allow(clippy::result_large_err)]
    fn start_check(&self, key: Option<FailKey>, clean: bool) -> Result<Checking<'_>, Status> {
        let mut c = self.checking.lock().unwrap_or_else(|p| p.into_inner());
        let busy = || {
            Status::unavailable(format!(
                "{MAX_CHECKS} password checks are under way; try again shortly (a login that \
                 succeeded is remembered and costs no check)"
            ))
        };
        let (total, per_key, most) = if clean {
            (c.clean, &c.clean_per_key, MAX_CLEAN_CHECKS_PER_PEER)
        } else {
            (c.failing, &c.per_key, MAX_CHECKS_PER_PEER)
        };
        if total >= MAX_CHECKS {
            return Err(busy());
        }
        if let Some(k) = key {
            if per_key.get(&k).is_some_and(|&n| n >= most) {
                let why = if clean {
                    String::new()
                } else {
                    format!(
                        " failed to log in within the last {}s and",
                        FAILURE_WINDOW.as_secs()
                    )
                };
                return Err(Status::resource_exhausted(format!(
                    "{k}{why} has {most} password checks under way; wait for their answers"
                )));
            }
            let m = if clean {
                &mut c.clean_per_key
            } else {
                &mut c.per_key
            };
            *m.entry(k).or_insert(0) += 1;
        }
        if clean {
            c.clean += 1;
        } else {
            c.failing += 1;
        }
        Ok(Checking {
            auth: self,
            key,
            clean,
        })
    }

    /// Whether `k` has no failed login in its current window.
    fn is_clean(&self, k: FailKey) -> bool {
        let m = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&k)
            .is_none_or(|(start, n)| *n == 0 || start.elapsed() >= FAILURE_WINDOW)
    }

    /// Refuses a peer that failed [`MAX_FAILURES_PER_PEER`] times in the current window.
    #[allow(clippy::result_large_err)]
    fn check_failures(&self, ip: FailKey) -> Result<(), Status> {
        let now = Instant::now();
        let m = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(&ip) {
            Some((start, n))
                if *n >= MAX_FAILURES_PER_PEER && now.duration_since(*start) < FAILURE_WINDOW =>
            {
                let left = FAILURE_WINDOW.saturating_sub(now.duration_since(*start));
                Err(Status::resource_exhausted(format!(
                    "{ip} failed to log in {n} times within {}s (the limit is {MAX_FAILURES_PER_PEER}); password logins from it are refused for {}s",
                    FAILURE_WINDOW.as_secs(),
                    left.as_secs().max(1)
                )))
            }
            _ => Ok(()),
        }
    }

    fn count_failure(&self, ip: FailKey) {
        let now = Instant::now();
        let mut m = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= FAILURE_PEERS && !m.contains_key(&ip) {
            m.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            if m.len() >= FAILURE_PEERS {
                return;
            }
        }
        let e = m.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= FAILURE_WINDOW {
            *e = (now, 0);
        }
        e.1 += 1;
    }

    /// The one check: may `who` use `right` (on `queue`, for queue rights)? PERMISSION_DENIED
    /// names the identity, the right and the queue.
    #[allow(clippy::result_large_err)]
    /// Whether `who` may read `queue` (peek or receive) or administer it: who may open its
    /// subqueues and journal for a look (`Broker::queue_seen`).
    pub fn may_read(&self, who: &Identity, queue: &Queue) -> bool {
        [Right::Peek, Right::Receive, Right::Admin]
            .into_iter()
            .any(|r| self.allowed(who, r, Some(queue)))
    }

    pub fn authorize(
        &self,
        who: &Identity,
        right: Right,
        queue: Option<&Queue>,
    ) -> Result<(), Status> {
        if self.allowed(who, right, queue) {
            return Ok(());
        }
        let what = match queue {
            Some(q) if matches!(q.def().role, QueueRole::DeadLetter | QueueRole::DeadXact) => {
                format!(
                    "the right \"dead-letter\" (broker-wide, mqd user add --rights dead-letter) to {} queue \"{}\"",
                    right.name(),
                    q.def().name
                )
            }
            Some(q) => format!(
                "the right \"{}\" on queue \"{}\"",
                right.name(),
                q.def().name
            ),
            None if right == Right::Send => {
                "the right \"send\" to another broker's queue (anonymous callers may not)"
                    .to_string()
            }
            None => format!("the broker-wide right \"{}\"", right.name()),
        };
        let msg = format!("identity \"{}\" lacks {what}", quote(&who.name));
        self.log_refusal(
            who.peer,
            &who.name,
            queue.map(|q| q.def().name.as_str()),
            &msg,
        );
        Err(Status::permission_denied(msg))
    }

    /// [`Auth::authorize`] without the refusal.
    pub fn allowed(&self, who: &Identity, right: Right, queue: Option<&Queue>) -> bool {
        if !self.has_users() || who.rights.contains(right) {
            return true;
        }
        match queue {
            Some(q) if matches!(q.def().role, QueueRole::DeadLetter | QueueRole::DeadXact) => {
                who.rights.contains(Right::DeadLetter)
            }
            Some(q) if right.is_queue_right() => q.acl().rights_of(who).contains(right),
            // A send to another broker's queue: any authenticated caller here. The
            // destination broker checks `send` on its queue for the identity this broker
            // forwards with (inbound::Forwarder); a refusal comes back as an AccessDenied
            // dead letter.
            None if right == Right::Send => !who.anonymous,
            _ => false,
        }
    }

    /// Whether `who` may see `queue` listed and its counters: the broker-wide `monitor` or any
    /// right on it.
    pub fn sees(&self, who: &Identity, queue: &Queue) -> bool {
        self.allowed(who, Right::Monitor, None)
            || Right::QUEUE
                .into_iter()
                .any(|r| self.allowed(who, r, Some(queue)))
    }

    /// May `who` list the outgoing queues: the broker-wide `outgoing` (which also pauses,
    /// resumes and deletes them) or `monitor`. The refusal names `outgoing`.
    #[allow(clippy::result_large_err)]
    pub fn authorize_outgoing_list(&self, who: &Identity) -> Result<(), Status> {
        if self.lists_outgoing(who) {
            return Ok(());
        }
        self.authorize(who, Right::Outgoing, None)
    }

    /// [`Auth::authorize_outgoing_list`] without the refusal.
    pub fn lists_outgoing(&self, who: &Identity) -> bool {
        self.allowed(who, Right::Outgoing, None) || self.allowed(who, Right::Monitor, None)
    }

    /// Logs a refusal with identity, peer and queue as fields; at most one line per peer address
    /// per interval.
    fn log_refusal(&self, peer: Option<SocketAddr>, who: &str, queue: Option<&str>, why: &str) {
        let ip = peer.map(|p| p.ip()).unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut m = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= REFUSAL_LOG_PEERS && !m.contains_key(&ip) {
            m.retain(|_, (t, _)| now.duration_since(*t) < REFUSAL_LOG_INTERVAL);
            if m.len() >= REFUSAL_LOG_PEERS {
                // Still full: this peer's refusal is not logged (the table stays bounded).
                return;
            }
        }
        let e = m.entry(ip).or_insert((now - REFUSAL_LOG_INTERVAL * 2, 0));
        if now.duration_since(e.0) >= REFUSAL_LOG_INTERVAL {
            let suppressed = e.1;
            *e = (now, 0);
            drop(m);
            let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            tracing::warn!(identity = %quote(who), %peer, queue = queue.map(quote).as_deref(), reason = %quote(why), suppressed, "refused: {}", quote(why));
        } else {
            e.1 += 1;
        }
    }
}

impl crate::broker::Broker {
    /// Grants or revokes `rights` on `q` to `who`; the new ACL is journaled with the queue
    /// definition before this returns.
    pub(crate) async fn change_acl(
        &self,
        q: &Arc<Queue>,
        who: &str,
        rights: Rights,
        grant: bool,
    ) -> Result<Acl, crate::error::BrokerError> {
        use crate::error::BrokerError;
        // Queues whose ACL is not their own: a change would be journaled and answered, and
        // count for nothing.
        if let Some(owner) = q.rights_owner() {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" has the rights of queue \"{}\"; change that queue's ACL",
                q.def().name,
                owner.def().name
            )));
        }
        if matches!(q.def().role, QueueRole::DeadLetter | QueueRole::DeadXact) {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" is a dead-letter queue: who may read it is the broker-wide right \"dead-letter\" (mqd user add --rights dead-letter), not an ACL",
                q.def().name
            )));
        }
        // In force only once journaled: a refused change leaves the ACL as it was.
        let _one = self.redefinitions.lock().await;
        let mut acl = (**q.acl_lock()).clone();
        let before = acl.counted_bytes();
        acl.change(who, rights, grant)
            .map_err(BrokerError::InvalidArgument)?;
        let after = acl.counted_bytes();
        if after > before {
            // Every queue's own ACL (a subqueue's or a queue journal's is its main queue's),
            // whatever its role (`SYSTEM$;JOURNAL` has one too); this one's as it will be.
            let all: u64 = self
                .queues_where(|other| other.rights_owner().is_none() && !std::ptr::eq(other, &**q))
                .iter()
                .map(|q| q.acl().counted_bytes())
                .sum();
            let total = all + after;
            let limit = self.config().max_acl_bytes;
            if total > limit {
                return Err(BrokerError::QuotaExceeded(format!(
                    "the ACLs of this broker's queues would hold {total} bytes (each entry its principal and {ACL_ENTRY_BYTES} bytes); the limit is {limit} (mqd --max-acl-bytes): grant to a group, or revoke entries elsewhere"
                )));
            }
        }
        let def = crate::queue::QueueDef {
            acl: acl.clone(),
            ..q.current_def()
        };
        self.redefine_queue(q, &def)?
            .await
            .map_err(crate::broker::journal_failed)?;
        *q.acl_lock() = Arc::new(acl.clone());
        Ok(acl)
    }
}

/// The common name of a client certificate's subject (mTLS, DER): exactly one, as text; else
/// why not (a subject without one, or with several, names nobody in particular).
pub(crate) fn cert_name(der: &[u8]) -> Option<Result<String, String>> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Some(Err("it cannot be read".into()));
    };
    let subject = cert.subject();
    let cns: Vec<_> = subject.iter_common_name().collect();
    Some(match cns.as_slice() {
        [cn] => cn
            .as_str()
            .map(str::to_string)
            .map_err(|_| "its subject common name is not text".into()),
        [] => Err(format!(
            "its subject \"{}\" has no common name (the identity)",
            quote(&subject.to_string())
        )),
        _ => Err(format!(
            "its subject \"{}\" has {} common names; one names the identity",
            quote(&subject.to_string()),
            cns.len()
        )),
    })
}

/// Whether `hash` is a PHC string of argon2 (id, i or d) with parameters argon2 accepts: the
/// PHC syntax alone let `$argon9$…` in, and that user then never logged in (helper-67).
fn check_hash(hash: &str) -> Result<(), String> {
    let h = argon2::PasswordHash::new(hash).map_err(|e| e.to_string())?;
    argon2::Algorithm::try_from(h.algorithm).map_err(|e| e.to_string())?;
    argon2::Params::try_from(&h).map_err(|e| e.to_string())?;
    if h.hash.is_none() {
        return Err("no hash output".into());
    }
    Ok(())
}

fn verify_hash(hash: &str, password: &str) -> bool {
    use argon2::PasswordVerifier;
    match argon2::PasswordHash::new(hash) {
        Ok(h) => argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok(),
        Err(_) => false,
    }
}

/// An argon2id hash (PHC string) of `password` with a random salt.
pub fn hash_password(password: &str) -> Result<String, String> {
    use argon2::PasswordHasher;
    let salt = argon2::password_hash::SaltString::encode_b64(uuid::Uuid::new_v4().as_bytes())
        .map_err(|e| e.to_string())?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// Adds or updates user `name` in the users file at `path` (created if missing). With
/// `password`, sets it; with `new_token`, adds a new bearer token and returns it (shown once;
/// only its SHA-256 is kept). Groups and rights given replace the old ones.
pub fn add_user(
    path: &Path,
    name: &str,
    password: Option<&str>,
    groups: &[String],
    rights: &[String],
    new_token: bool,
) -> Result<Option<String>, String> {
    check_user_name(name)?;
    // Read as mqd reads it (at most 64 MiB): `mqd user add` grew a file mqd then refused.
    let mut file: UsersFile = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => UsersFile::default(),
        _ => toml::from_str(&read_users_file(path)?)
            .map_err(|e| format!("the users file {} is not valid: {e}", path.display()))?,
    };
    let mut rights_checked = BTreeSet::new();
    for r in rights
        .iter()
        .flat_map(|r| r.split(','))
        .filter(|r| !r.trim().is_empty())
    {
        rights_checked.insert(Right::parse(r)?.name().to_string());
    }
    let entry = file.users.entry(name.to_string()).or_default();
    if let Some(p) = password {
        entry.password = Some(hash_password(p)?);
    }
    if !groups.is_empty() {
        entry.groups = groups.to_vec();
    }
    if !rights.is_empty() {
        entry.rights = rights_checked.into_iter().collect();
    }
    let token = new_token.then(|| {
        format!(
            "mqt_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )
    });
    if let Some(t) = &token {
        entry
            .tokens
            .push(format!("sha256:{}", hex(&Sha256::digest(t.as_bytes()))));
    }
    let text = toml::to_string_pretty(&file).map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_USERS_FILE_BYTES {
        return Err(format!(
            "the users file {} would be larger than {} MiB, which mqd does not read; remove users first",
            path.display(),
            MAX_USERS_FILE_BYTES >> 20
        ));
    }
    let tmp = path.with_extension("tmp");
    write_private(&tmp, text.as_bytes())
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(token)
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A client-supplied value for messages and logs: cut short, control characters escaped
/// ([`mq_proto::limits::quote`]).
pub(crate) fn quote(s: &str) -> String {
    mq_proto::limits::quote(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(name: &str, groups: &[&str]) -> Identity {
        Identity {
            name: Arc::from(name),
            kind: IdentityKind::Password,
            anonymous: false,
            groups: Arc::from(groups.iter().map(|g| g.to_string()).collect::<Vec<_>>()),
            rights: Rights::default(),
            peer: None,
            entry: None,
        }
    }

    /// Password checks under way: an address that failed a login has two at most, such
    /// addresses 64 in all; a clean address has 16 (a pool logging in at once, helper-68), and
    /// clean ones 64 of their own, untouched by the failing ones'. Each slot comes back when
    /// its check ends.
    #[test]
    fn password_checks_under_way_are_bounded_per_address_and_in_all() {
        let auth = Auth::open();
        let ip = |n: u32| FailKey::Ip(IpAddr::V4(std::net::Ipv4Addr::from(0x7f00_0000 + n)));
        let a1 = auth.start_check(Some(ip(1)), false).unwrap();
        let _a2 = auth.start_check(Some(ip(1)), false).unwrap();
        let e = auth.start_check(Some(ip(1)), false).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("password checks under way"), "{e:?}");
        drop(a1);
        let a3 = auth.start_check(Some(ip(1)), false).unwrap();
        let mut held = vec![a3];
        for n in 2..=63 {
            held.push(auth.start_check(Some(ip(n)), false).unwrap());
        }
        // 64 failing ones under way (two from the first address, one from each of 62 others).
        let e = auth.start_check(Some(ip(100)), false).err().unwrap();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        // Clean callers have their own: sixteen from one address at once, up to 64 in all.
        let mut clean: Vec<_> = (0..16)
            .map(|_| auth.start_check(Some(ip(200)), true).unwrap())
            .collect();
        let e = auth.start_check(Some(ip(200)), true).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        for _ in 16..64 {
            clean.push(auth.start_check(None, true).unwrap());
        }
        let e = auth.start_check(Some(ip(201)), true).err().unwrap();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        held.pop();
        let _last = auth.start_check(Some(ip(100)), false).unwrap();
        drop(held);
        drop(clean);
        let c = auth.checking.lock().unwrap();
        assert_eq!(c.per_key.len(), 2, "ip 1 and ip 100");
        assert_eq!((c.failing, c.clean), (2, 0));
    }

    /// A users file's password must be an argon2 hash with parameters argon2 takes; the PHC
    /// syntax alone let `$argon9$…` in (helper-67).
    #[test]
    fn only_argon2_hashes_are_passwords() {
        let good = hash_password("pw").unwrap();
        assert!(check_hash(&good).is_ok(), "{good}");
        let salt_and_hash = good.splitn(5, '$').nth(4).unwrap();
        for bad in [
            format!("$argon9$v=19$m=19456,t=2,p=1${salt_and_hash}"),
            format!("$pbkdf2$v=19$m=19456,t=2,p=1${salt_and_hash}"),
            format!("$argon2id$v=19$m=1,t=2,p=1${salt_and_hash}"),
            "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA".to_string(),
            "plain".to_string(),
        ] {
            assert!(check_hash(&bad).is_err(), "{bad} was taken");
        }
    }

    /// A users file larger than 64 MiB (a wrong path, `/dev/zero`) is refused, not read into
    /// memory whole; one at the limit is read.
    #[test]
    fn a_users_file_past_64_mib_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        let mut text = String::from("[users]\n");
        text.push_str(&"#".repeat(MAX_USERS_FILE_BYTES as usize - text.len()));
        std::fs::write(&path, &text).unwrap();
        Users::load(&path).unwrap();
        text.push('#');
        std::fs::write(&path, &text).unwrap();
        let e = Users::load(&path).err().unwrap();
        assert!(e.contains("is larger than 64 MiB"), "{e}");
        let e = Users::load(Path::new("/dev/zero")).err().unwrap();
        assert!(e.contains("is larger than 64 MiB"), "{e}");
        // `mqd user add` reads it the same way.
        let e = add_user(&path, "alice", Some("pw"), &[], &[], false)
            .err()
            .unwrap();
        assert!(e.contains("is larger than 64 MiB"), "{e}");
    }

    /// An ACL is journaled as it was before `monitor` widened the set past 8 bits: one byte
    /// of rights per principal, so journals written by earlier versions read the same.
    #[test]
    fn acls_keep_their_journaled_bytes() {
        let mut acl = Acl::default();
        acl.change("alice", Rights::parse_list("all", true).unwrap(), true)
            .unwrap();
        let bytes = postcard::to_allocvec(&acl).unwrap();
        // One entry: the name's length and bytes, then the rights byte (send..admin = 0x0f).
        assert_eq!(bytes, [1, 5, b'a', b'l', b'i', b'c', b'e', 0x0f]);
        let back: Acl = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, acl);
        assert!(
            Rights::parse_list("monitor", true).is_err(),
            "monitor is broker-wide"
        );
    }

    /// `monitor` sees every queue and lists outgoing queues, and may not read, send or act.
    #[test]
    fn monitor_sees_everything_and_may_do_nothing() {
        let auth = Auth::open();
        let mut m = who("prometheus", &[]);
        m.rights = Rights::parse_list("monitor", false).unwrap();
        // Without a users file everyone may do everything, so only the rights are checked here.
        assert!(m.rights.contains(Right::Monitor));
        for r in Right::ALL {
            assert_eq!(m.rights.contains(r), r == Right::Monitor, "{r:?}");
        }
        assert!(auth.authorize_outgoing_list(&m).is_ok());
        assert_eq!(Right::parse("MONITOR"), Ok(Right::Monitor));
        assert_eq!(Rights::ALL.names().len(), Right::ALL.len());
    }

    #[test]
    fn acl_matches_users_groups_everyone_and_anonymous() {
        let mut acl = Acl::default();
        acl.change("alice", Rights::parse_list("send", true).unwrap(), true)
            .unwrap();
        acl.change(
            "group:ops",
            Rights::parse_list("peek,admin", true).unwrap(),
            true,
        )
        .unwrap();
        acl.change(
            "Everyone",
            Rights::parse_list("receive", true).unwrap(),
            true,
        )
        .unwrap();
        let alice = acl.rights_of(&who("alice", &[]));
        assert_eq!(alice.names(), ["send", "receive"]);
        let bob = acl.rights_of(&who("bob", &["ops"]));
        assert_eq!(bob.names(), ["receive", "peek", "admin"]);
        assert!(acl.rights_of(&Identity::anonymous(None)).is_empty());
        acl.change("anonymous", Rights::parse_list("peek", true).unwrap(), true)
            .unwrap();
        assert_eq!(acl.rights_of(&Identity::anonymous(None)).names(), ["peek"]);
        acl.change("alice", Rights::parse_list("send", true).unwrap(), false)
            .unwrap();
        assert!(!acl.0.contains_key("alice"));
        assert!(Rights::parse_list("forward", true).is_err());
        // Review m2: no control characters; `Group:` is `group:`; no other `x:` principals.
        let send = Rights::parse_list("send", true).unwrap();
        assert!(acl.change("ev\nil", send, true).is_err());
        assert!(acl.change("role:x", send, true).is_err());
        acl.change("Group:Ops2", send, true).unwrap();
        assert!(acl.0.contains_key("group:Ops2"));
        assert_eq!(quote("a\nb"), "a\\nb");
        assert!(Rights::parse_list("fly", false).is_err());
    }

    #[test]
    fn the_example_users_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/users.toml");
        let auth = Auth::from_file(&path).unwrap();
        let users = auth.users().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt
            .block_on(auth.verify_password(&users, "alice", "example-only-change-me", None))
            .is_ok());
        let creds = crate::tls::SecurityConfig::load_forward_credentials(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/examples/forward-credentials.toml"),
        )
        .unwrap();
        assert!(creds.contains_key("broker-b.example.net:1801"));
    }

    #[test]
    fn users_file_round_trip_and_password_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        add_user(
            &path,
            "alice",
            Some("pw"),
            &["ops".into()],
            &["create-queue".into()],
            false,
        )
        .unwrap();
        let token = add_user(&path, "ci", None, &[], &[], true)
            .unwrap()
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("$argon2id$") && !text.contains("\"pw\""));
        assert!(!text.contains(&token));
        let auth = Auth::from_file(&path).unwrap();
        let users = auth.users().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let check = |u: &str, p: &str| rt.block_on(auth.verify_password(&users, u, p, None));
        assert_eq!(check("alice", "pw").unwrap(), "alice");
        assert!(check("alice", "bad").is_err());
        // Cached answers stay right.
        assert!(check("alice", "bad").is_err());
        assert!(check("alice", "pw").is_ok());
        assert!(check("nobody", "pw").is_err());
        let id = rt
            .block_on(auth.identify(Presented {
                authorization: Some(Ok(format!("Bearer {token}"))),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(&*id.name, "ci");
        // The scheme is case-insensitive and may be followed by several spaces (helper-60:
        // `basic` was refused as "must be Basic or Bearer").
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:pw");
        for h in [
            format!("basic {b64}"),
            format!("BASIC  {b64}"),
            format!("Basic {b64}"),
        ] {
            let id = rt
                .block_on(auth.identify(Presented {
                    authorization: Some(Ok(h.clone())),
                    ..Default::default()
                }))
                .unwrap_or_else(|e| panic!("{h}: {e:?}"));
            assert_eq!(&*id.name, "alice");
        }
        let id = rt
            .block_on(auth.identify(Presented {
                authorization: Some(Ok(format!("bearer {token}"))),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(&*id.name, "ci");
        let alice = users.identity("alice", IdentityKind::Password, None);
        assert!(auth.allowed(&alice, Right::CreateQueue, None));
        assert!(!auth.allowed(&alice, Right::Forward, None));
        assert!(check_user_name("everyone").is_err());
    }

    /// Review M2: failures are limited per peer address and not cached; a remembered success
    /// still works for that peer, which is over the limit.
    #[test]
    fn failed_logins_are_limited_per_peer_and_successes_stay_cached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        add_user(&path, "alice", Some("pw"), &[], &[], false).unwrap();
        let auth = Auth::from_file(&path).unwrap();
        let users = auth.users().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let peer: Option<SocketAddr> = Some("10.1.2.3:5000".parse().unwrap());
        let other: Option<SocketAddr> = Some("10.1.2.4:5000".parse().unwrap());
        let check = |u: &str, p: &str, from: Option<SocketAddr>| {
            rt.block_on(auth.verify_password(&users, u, p, FailKey::of(from, None)))
        };
        assert!(check("alice", "pw", peer).is_ok());
        for i in 0..MAX_FAILURES_PER_PEER {
            let e = check("alice", &format!("wrong-{i}"), peer).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        }
        let e = check("alice", "wrong-again", peer).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("10.1.2.3"), "{e:?}");
        // Not yet verified credentials are refused too, verified ones still work.
        assert_eq!(
            check("bob", "x", peer).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        assert!(check("alice", "pw", peer).is_ok());
        // Another address is not affected; failures are not remembered as answers.
        assert_eq!(
            check("alice", "wrong-0", other).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(auth.users().unwrap().cache.lock().unwrap().len() == 1);
    }

    /// The limiter counts an IPv6 /64 as one (2^64 addresses are not 2^64 times the guesses),
    /// and a Unix socket caller by its account, apart from loopback TCP callers.
    #[test]
    fn failures_count_per_ipv4_address_ipv6_network_and_local_account() {
        let k = |a: &str, uid| FailKey::of(Some(a.parse().unwrap()), uid);
        assert_eq!(k("[2001:db8::1]:1", None), k("[2001:db8::ffff:2]:2", None));
        assert_ne!(k("[2001:db8::1]:1", None), k("[2001:db8:0:1::1]:1", None));
        assert_eq!(k("[::ffff:10.1.2.3]:1", None), k("10.1.2.3:9", None));
        assert_ne!(k("10.1.2.3:1", None), k("10.1.2.4:1", None));
        let local = crate::flow::LocalConnectInfo::ADDR;
        assert_ne!(
            FailKey::of(Some(local), Some(1000)),
            k("127.0.0.1:5000", None)
        );
        assert_ne!(
            FailKey::of(Some(local), Some(1000)),
            FailKey::of(Some(local), Some(1001))
        );
        assert_eq!(
            k("[2001:db8::1]:1", None).unwrap().to_string(),
            "2001:db8::/64"
        );
    }

    /// A login verified against the users file as it was before a reread is not remembered
    /// past it: the new file starts with nothing remembered (a changed password or a removed
    /// user no longer logs in once a verification in flight during the SIGHUP ends).
    #[test]
    fn a_reread_forgets_logins_verified_against_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        add_user(&path, "alice", Some("old"), &[], &[], false).unwrap();
        let auth = Auth::from_file(&path).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let before = auth.users().unwrap();
        add_user(&path, "alice", Some("new"), &[], &[], false).unwrap();
        auth.reload().unwrap();
        // A verification that took the old file before the reread ends after it.
        assert!(rt
            .block_on(auth.verify_password(&before, "alice", "old", None))
            .is_ok());
        let now = auth.users().unwrap();
        assert!(now.cache.lock().unwrap().is_empty());
        assert!(rt
            .block_on(auth.verify_password(&now, "alice", "old", None))
            .is_err());
        assert!(rt
            .block_on(auth.verify_password(&now, "alice", "new", None))
            .is_ok());
    }

    /// A certificate names its identity by exactly one subject common name; without one (the
    /// whole subject was taken before) it names nobody.
    #[test]
    fn a_certificate_without_a_common_name_names_nobody() {
        let key = rcgen::KeyPair::generate().unwrap();
        let der = |dn: rcgen::DistinguishedName| {
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name = dn;
            p.self_signed(&key).unwrap().der().to_vec()
        };
        let mut one = rcgen::DistinguishedName::new();
        one.push(rcgen::DnType::OrganizationName, "acme");
        one.push(rcgen::DnType::CommonName, "app-1");
        assert_eq!(cert_name(&der(one)), Some(Ok("app-1".into())));
        let mut none = rcgen::DistinguishedName::new();
        none.push(rcgen::DnType::OrganizationName, "acme");
        let r = cert_name(&der(none));
        assert!(
            matches!(&r, Some(Err(e)) if e.contains("no common name")),
            "{r:?}"
        );
        assert!(matches!(cert_name(b"not a certificate"), Some(Err(_))));
    }

    /// Review M7: a certificate's common name is an identity only if it is a valid user name.
    #[test]
    fn certificate_names_are_checked_like_user_names() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let auth = Auth::open();
        for bad in [
            "group:admins",
            "anonymous",
            "Everyone",
            "a\u{7}b",
            "alice ",
            " alice",
        ] {
            let r = rt.block_on(auth.identify(Presented {
                cert_name: Some(Ok(bad.into())),
                ..Default::default()
            }));
            assert_eq!(
                r.unwrap_err().code(),
                tonic::Code::Unauthenticated,
                "{bad:?}"
            );
        }
        let ok = rt
            .block_on(auth.identify(Presented {
                cert_name: Some(Ok("app-1".into())),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(&*ok.name, "app-1");
        let r = rt.block_on(auth.identify(Presented {
            cert_name: Some(Err("its subject has no common name".into())),
            ..Default::default()
        }));
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    /// The account this test runs as, by `id`.
    fn current_account() -> (u32, String) {
        let id = |flag: &str| {
            let out = std::process::Command::new("id").arg(flag).output().unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        (id("-u").parse().unwrap(), id("-un"))
    }

    #[test]
    fn os_user_names_come_from_the_passwd_database() {
        let (uid, name) = current_account();
        assert_eq!(os_user_name(uid).as_deref(), Some(name.as_str()));
        assert_eq!(os_user_name(0).as_deref(), Some("root"));
        // An id without a passwd entry has no name.
        assert_eq!(os_user_name(3_999_999_999), None);
    }

    #[test]
    fn a_unix_socket_caller_is_its_account_only_when_asked_and_without_credentials() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (uid, name) = current_account();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        add_user(
            &path,
            &name,
            Some("pw"),
            &["ops".into()],
            &["create-queue".into()],
            false,
        )
        .unwrap();
        let local = |authorization: Option<&str>| Presented {
            authorization: authorization.map(|a| Ok(a.to_string())),
            local_uid: Some(uid),
            ..Default::default()
        };
        // Off (the default): anonymous.
        let off = Auth::from_file(&path).unwrap();
        let who = rt.block_on(off.identify(local(None))).unwrap();
        assert!(who.anonymous);
        // On: the account, with its groups and rights from the users file.
        let on = Auth::from_file(&path).unwrap().with_os_users(true);
        let who = rt.block_on(on.identify(local(None))).unwrap();
        assert_eq!(
            (&*who.name, who.kind, who.anonymous),
            (name.as_str(), IdentityKind::OsUser, false)
        );
        assert_eq!(&*who.groups, ["ops".to_string()]);
        assert!(who.rights.contains(Right::CreateQueue), "{:?}", who.rights);
        // Credentials still decide: a wrong password is refused, not replaced by the account.
        let basic = |pw: &str| {
            format!(
                "Basic {}",
                base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    format!("{name}:{pw}")
                )
            )
        };
        let r = rt.block_on(on.identify(local(Some(&basic("wrong")))));
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unauthenticated);
        let who = rt.block_on(on.identify(local(Some(&basic("pw"))))).unwrap();
        assert_eq!(who.kind, IdentityKind::Password);
        // No uid (a TCP caller): anonymous; an id without a passwd entry: anonymous.
        let who = rt.block_on(on.identify(Presented::default())).unwrap();
        assert!(who.anonymous);
        let who = rt
            .block_on(on.identify(Presented {
                local_uid: Some(3_999_999_999),
                ..Default::default()
            }))
            .unwrap();
        assert!(who.anonymous);
        // Without a users file (every caller has every right) the account still names the
        // caller (a message's sender).
        let open = Auth::open().with_os_users(true);
        let who = rt.block_on(open.identify(local(None))).unwrap();
        assert_eq!(&*who.name, name.as_str());
    }
}
