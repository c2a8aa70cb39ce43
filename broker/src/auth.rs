//! Identities and rights: the users file, credentials, per-queue ACLs, and [`Auth::authorize`].
//!
//! An [`Identity`] is established once per connection/stream (per RPC call) by
//! [`Auth::authenticate`], the interceptor in front of the service: an `authorization: Basic`
//! user and password (checked against the argon2id hash in the users file; verified credentials
//! are cached, so a hash is computed once per credentials, not per call), an
//! `authorization: Bearer` token (its SHA-256 is in the users file), a client certificate's
//! subject common name (mTLS), or `anonymous`. The service calls [`Auth::authorize`] before it
//! touches the broker.
//!
//! Without a users file the broker is in protected mode: it serves loopback only (checked at
//! start) and every caller has every right.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
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
}

impl Right {
    pub const ALL: [Right; 8] = [
        Right::Send,
        Right::Receive,
        Right::Peek,
        Right::Admin,
        Right::CreateQueue,
        Right::Outgoing,
        Right::Forward,
        Right::DeadLetter,
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
        }
    }

    fn bit(self) -> u8 {
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

/// A set of rights (bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rights(u8);

impl Rights {
    pub const ALL: Rights = Rights(0xff);
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
            let r = Right::parse(part)?;
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

impl Acl {
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
        let mut r = 0u8;
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
        let who = if who.eq_ignore_ascii_case(EVERYONE) || who.eq_ignore_ascii_case(ANONYMOUS) {
            who.to_ascii_lowercase()
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

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
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
}

impl Users {
    fn load(path: &Path) -> Result<Users, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the users file {}: {e}", path.display()))?;
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
                argon2::PasswordHash::new(p).map_err(|e| {
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
    if name.eq_ignore_ascii_case(EVERYONE) || name.eq_ignore_ascii_case(ANONYMOUS) {
        return Err(format!("\"{name}\" is reserved"));
    }
    Ok(())
}

/// Most verified credentials remembered (cleared when full and on reload).
const CREDENTIAL_CACHE: usize = 10_000;
/// Refusals from one peer address are logged at most once per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Peers tracked by the refusal log limiter.
const REFUSAL_LOG_PEERS: usize = 4096;

/// Identities and rights of one broker.
#[derive(Debug)]
pub struct Auth {
    path: Option<PathBuf>,
    users: RwLock<Option<Arc<Users>>>,
    /// SHA-256 of `user \0 password` -> verified (Some(name)) or refused (None).
    cache: Mutex<HashMap<[u8; 32], Option<String>>>,
    refusals: Mutex<HashMap<IpAddr, (Instant, u64)>>,
}

impl Auth {
    /// Protected mode: no users file, every caller has every right.
    pub fn open() -> Auth {
        Auth {
            path: None,
            users: RwLock::new(None),
            cache: Mutex::new(HashMap::new()),
            refusals: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the users file at `path`.
    pub fn from_file(path: &Path) -> Result<Auth, String> {
        let users = Users::load(path)?;
        Ok(Auth {
            path: Some(path.to_path_buf()),
            users: RwLock::new(Some(Arc::new(users))),
            cache: Mutex::new(HashMap::new()),
            refusals: Mutex::new(HashMap::new()),
        })
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
        let users = Users::load(path)?;
        let n = users.file.users.len();
        *self.users.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(users));
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(n)
    }

    fn users(&self) -> Option<Arc<Users>> {
        self.users.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The interceptor: establishes the caller's identity and puts it in the request's
    /// extensions, or refuses with UNAUTHENTICATED.
    #[allow(clippy::result_large_err)]
    pub fn authenticate(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let peer = req.remote_addr();
        let who = match self.identify(&req, peer) {
            Ok(who) => who,
            Err(why) => {
                self.log_refusal(peer, "?", &why);
                return Err(Status::unauthenticated(why));
            }
        };
        req.extensions_mut().insert(who);
        Ok(req)
    }

    fn identify(&self, req: &Request<()>, peer: Option<SocketAddr>) -> Result<Identity, String> {
        let users = self.users();
        let header = req.metadata().get("authorization");
        if let (Some(h), Some(users)) = (header, &users) {
            let h = h
                .to_str()
                .map_err(|_| "the authorization header is not text".to_string())?;
            if let Some(b) = h.strip_prefix("Basic ") {
                let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b)
                    .map_err(|_| "the Basic credentials are not base64".to_string())?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| "the Basic credentials are not UTF-8".to_string())?;
                let (user, password) = raw
                    .split_once(':')
                    .ok_or_else(|| "the Basic credentials must be user:password".to_string())?;
                let name = self.verify_password(users, user, password)?;
                return Ok(users.identity(&name, IdentityKind::Password, peer));
            }
            if let Some(t) = h.strip_prefix("Bearer ") {
                let key = format!("sha256:{}", hex(&Sha256::digest(t.trim().as_bytes())));
                let name = users.by_token.get(&key).ok_or_else(|| {
                    "the bearer token is not known to this broker (mqd user add --token)"
                        .to_string()
                })?;
                return Ok(users.identity(name, IdentityKind::Token, peer));
            }
            return Err("the authorization header must be Basic or Bearer".to_string());
        }
        if let Some(name) = cert_name(req) {
            return Ok(match &users {
                Some(u) => u.identity(&name, IdentityKind::Certificate, peer),
                None => Identity {
                    name: Arc::from(name.as_str()),
                    kind: IdentityKind::Certificate,
                    anonymous: false,
                    groups: Arc::from(Vec::new()),
                    rights: Rights::default(),
                    peer,
                },
            });
        }
        Ok(Identity::anonymous(peer))
    }

    fn verify_password(&self, users: &Users, user: &str, password: &str) -> Result<String, String> {
        let refused = || format!("user \"{}\" or its password is wrong", quote(user));
        let mut h = Sha256::new();
        h.update(user.as_bytes());
        h.update([0u8]);
        h.update(password.as_bytes());
        let key: [u8; 32] = h.finalize().into();
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return hit.clone().ok_or_else(refused);
        }
        let ok = users
            .file
            .users
            .get(user)
            .and_then(|u| u.password.as_deref())
            .is_some_and(|hash| verify_hash(hash, password));
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CREDENTIAL_CACHE {
            cache.clear();
        }
        cache.insert(key, ok.then(|| user.to_string()));
        if ok {
            Ok(user.to_string())
        } else {
            Err(refused())
        }
    }

    /// The one check: may `who` use `right` (on `queue`, for queue rights)? PERMISSION_DENIED
    /// names the identity, the right and the queue.
    #[allow(clippy::result_large_err)]
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
        self.log_refusal(who.peer, &who.name, &msg);
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
            // A send to another broker's queue: any authenticated caller; the destination
            // broker's ACL decides.
            None if right == Right::Send => !who.anonymous,
            _ => false,
        }
    }

    /// Whether `who` holds any right on `queue` (to see it listed or its counters).
    pub fn sees(&self, who: &Identity, queue: &Queue) -> bool {
        Right::QUEUE
            .into_iter()
            .any(|r| self.allowed(who, r, Some(queue)))
    }

    /// Logs a refusal with identity and peer; at most one line per peer address per interval.
    fn log_refusal(&self, peer: Option<SocketAddr>, who: &str, why: &str) {
        let ip = peer.map(|p| p.ip()).unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut m = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= REFUSAL_LOG_PEERS && !m.contains_key(&ip) {
            m.retain(|_, (t, _)| now.duration_since(*t) < REFUSAL_LOG_INTERVAL);
        }
        let e = m.entry(ip).or_insert((now - REFUSAL_LOG_INTERVAL * 2, 0));
        if now.duration_since(e.0) >= REFUSAL_LOG_INTERVAL {
            let suppressed = e.1;
            *e = (now, 0);
            drop(m);
            tracing::warn!(identity = %quote(who), peer = ?peer, suppressed, "refused: {}", quote(why));
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
        let (acl, commit) = {
            let mut cur = q.acl_lock();
            let mut acl = (**cur).clone();
            acl.change(who, rights, grant)
                .map_err(BrokerError::InvalidArgument)?;
            let def = crate::queue::QueueDef {
                acl: acl.clone(),
                ..q.current_def()
            };
            let commit = self.redefine_queue(q, &def)?;
            *cur = Arc::new(acl.clone());
            (acl, commit)
        };
        commit.await.map_err(crate::broker::journal_failed)?;
        Ok(acl)
    }
}

/// The common name of the client certificate's subject (mTLS), else the whole subject.
fn cert_name<T>(req: &Request<T>) -> Option<String> {
    let certs = req.peer_certs()?;
    let first = certs.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(first.as_ref()).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_string);
    Some(cn.unwrap_or_else(|| subject.to_string()))
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
    let mut file: UsersFile = match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| format!("the users file {} is not valid: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => UsersFile::default(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
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

/// A client-supplied value for messages and logs: at most 128 characters.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 128;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX).collect();
        t.push('…');
        t
    }
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
        }
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
        assert!(Rights::parse_list("fly", false).is_err());
    }

    #[test]
    fn the_example_users_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/users.toml");
        let auth = Auth::from_file(&path).unwrap();
        let users = auth.users().unwrap();
        assert!(auth
            .verify_password(&users, "alice", "example-only-change-me")
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
        assert_eq!(
            auth.verify_password(&users, "alice", "pw").unwrap(),
            "alice"
        );
        assert!(auth.verify_password(&users, "alice", "bad").is_err());
        // Cached answers stay right.
        assert!(auth.verify_password(&users, "alice", "bad").is_err());
        assert!(auth.verify_password(&users, "alice", "pw").is_ok());
        let mut req = Request::new(());
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let id = auth.identify(&req, None).unwrap();
        assert_eq!(&*id.name, "ci");
        let alice = users.identity("alice", IdentityKind::Password, None);
        assert!(auth.allowed(&alice, Right::CreateQueue, None));
        assert!(!auth.allowed(&alice, Right::Forward, None));
        assert!(check_user_name("everyone").is_err());
    }
}
