//! MSMQ-style queue path names and format names (DESIGN.md §3).
//!
//! Accepted forms (keywords are case-insensitive; `\` and `/` are interchangeable):
//!
//! ```text
//! .\private$\orders                          local private queue (path name)
//! .\orders                                   local public queue (path name)
//! host\private$\orders                       path name on another broker
//! host:1802\private$\orders                  extension: explicit broker port (default 1801)
//! DIRECT=OS:host\private$\orders             format name, host by name (or `.`)
//! DIRECT=TCP:10.0.0.5\private$\orders        format name, host by IPv4 address
//! DIRECT=TCP:127.0.0.1:1802\private$\orders  extension: explicit broker port
//! DIRECT=TCP:[::1]:1802\private$\orders      IPv6 in brackets (a bare IPv6 without port also works)
//! …\private$\orders;JOURNAL                  the queue's journal (read-only)
//! …\private$\orders;poison                   a subqueue (MSMQ 4.0): moved to, never sent to
//! …\private$\orders\journal$                 the same, in System.Messaging's path-name style
//! host\SYSTEM$;DEADLETTER  host\SYSTEM$;DEADXACT   the broker's dead-letter queues (read-only)
//! host\Deadletter$         host\XactDeadletter$    the same, in System.Messaging's path-name style
//! FORMATNAME:DIRECT=…\q1,DIRECT=…\q2         multiple-element name: send-only fan-out
//! ```
//!
//! `FORMATNAME:` is optional, also on a single name; the elements of a multiple-element name
//! may be path names or `DIRECT=` format names, and none may be read-only. An IP address after
//! `DIRECT=OS:` or in a path name is accepted (and shown as `DIRECT=TCP:`). Queue names are
//! 1–124 characters without `\ / , ;`, control characters, leading or trailing whitespace,
//! and are not one of the reserved words `private$`, `SYSTEM$`, `journal$`, `Deadletter$`,
//! `XactDeadletter$`. `Display` always writes the canonical
//! `DIRECT=OS:`/`DIRECT=TCP:` form, and `parse(display(x)) == x` for every parsed value.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The broker port assumed when a name carries none.
pub const DEFAULT_PORT: u16 = 1801;
/// The longest queue name, in characters (not bytes).
pub const MAX_QUEUE_NAME_LEN: usize = 124;
/// The longest subqueue name (`;name`), in characters, as MSMQ.
pub const MAX_SUBQUEUE_NAME_LEN: usize = 32;
/// The most elements [`FormatName::parse`] accepts in a multiple-element name; brokers apply
/// their own configured limit (default [`crate::limits::DEFAULT_MAX_FORMAT_NAME_ELEMENTS`]).
pub const MAX_FORMAT_NAME_ELEMENTS_CEILING: usize = 100_000;

const MAX_HOST_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

const PRIVATE: &str = "private$";
const SYSTEM: &str = "SYSTEM$";
const JOURNAL_SEGMENT: &str = "journal$";
const DEADLETTER_ALIAS: &str = "deadletter$";
const DEADXACT_ALIAS: &str = "xactdeadletter$";
/// What the broker's outgoing queues are kept under (`outgoing$;host:port`): a queue of this
/// name had subqueues whose keys were outgoing queues' (helper-61: a user could tell which
/// destinations have an outgoing queue by opening `.\outgoing$;host:port`).
const OUTGOING: &str = "outgoing$";
/// Words that have a meaning in a path and so cannot be queue names (compared ignoring case).
const RESERVED: [&str; 6] = [
    PRIVATE,
    SYSTEM,
    JOURNAL_SEGMENT,
    DEADLETTER_ALIAS,
    DEADXACT_ALIAS,
    OUTGOING,
];

const PATH_EXAMPLE: &str = r#"a path name looks like ".\private$\orders" or "host\orders""#;

/// The broker a queue lives on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// `.`: the broker that reads the name.
    Local,
    /// A host name, lowercased (`localhost` stays a name; see [`QueueAddress::is_local_to`]).
    Name(String),
    /// An IPv4 or IPv6 address.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    /// `.`, the name, an IPv4 address, or an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Local => f.write_str("."),
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Which queue of a name: the queue itself, its journal, or a broker dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// The queue itself.
    Normal,
    /// `;JOURNAL`: copies of messages removed from the queue (read-only).
    Journal,
    /// `SYSTEM$;DEADLETTER`: the broker's non-transactional dead-letter queue (read-only).
    DeadLetter,
    /// `SYSTEM$;DEADXACT`: the broker's transactional dead-letter queue (read-only).
    DeadXact,
    /// `SYSTEM$;JOURNAL`: the broker's journal (source journaling copies; read-only).
    SystemJournal,
    /// `;name`: a subqueue of the queue, named in [`QueueAddress::subqueue`] (messages are
    /// moved into it, never sent).
    Subqueue,
}

/// One queue: where it is and which queue it is.
///
/// For [`QueueKind::DeadLetter`], [`QueueKind::DeadXact`] and [`QueueKind::SystemJournal`]
/// the parser sets `private` to
/// `false` and `name` to `"SYSTEM$"`; `key`, `path_name` and `Display` ignore both for those
/// kinds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueAddress {
    pub host: Host,
    /// An explicit broker port (extension); `None` means [`DEFAULT_PORT`].
    pub port: Option<u16>,
    /// `private$\name` rather than `name`.
    pub private: bool,
    /// The queue name as written (queue names compare case-insensitively: see [`Self::key`]).
    pub name: String,
    pub kind: QueueKind,
    /// The subqueue's name as written, for [`QueueKind::Subqueue`]; empty otherwise.
    pub subqueue: String,
}

impl QueueAddress {
    /// The main queue of a subqueue or journal (`self` for a queue).
    pub fn main_queue(&self) -> QueueAddress {
        match self.kind {
            QueueKind::Subqueue | QueueKind::Journal => QueueAddress {
                kind: QueueKind::Normal,
                subqueue: String::new(),
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// The subqueue `name` of this address's main queue (`name` empty: the main queue).
    /// `name` is checked like a parsed one.
    pub fn with_subqueue(&self, name: &str) -> Result<QueueAddress, String> {
        if !matches!(
            self.kind,
            QueueKind::Normal | QueueKind::Subqueue | QueueKind::Journal
        ) {
            return Err("system queues have no subqueues".into());
        }
        let mut a = self.main_queue();
        if !name.is_empty() {
            check_subqueue_name(name)?;
            a.kind = QueueKind::Subqueue;
            a.subqueue = name.to_owned();
        }
        Ok(a)
    }

    /// The queue's identity on its broker, lowercase and without the host:
    /// `private$\orders`, `orders`, `private$\orders;journal`, `system$;deadletter`,
    /// `system$;deadxact`.
    pub fn key(&self) -> String {
        self.tail().to_lowercase()
    }

    /// The path name, host first, queue name as written: `.\private$\orders`,
    /// `host:1802\orders;JOURNAL`, `10.0.0.5\SYSTEM$;DEADLETTER`. It parses back to `self`.
    pub fn path_name(&self) -> String {
        format!("{}{}", self.host_and_port(), self.tail())
    }

    /// Whether this address names a queue on the broker that has these host `names` and
    /// listens on `addrs`.
    ///
    /// - `.` and `localhost` without a port are always local; with a port they are local when
    ///   the broker listens on that port.
    /// - A host name is local when it is one of `names` (ignoring case) and the broker listens
    ///   on its port (`None` means [`DEFAULT_PORT`]).
    /// - An IP address is local when a listener has that port (`None` means
    ///   [`DEFAULT_PORT`]) and that IP; a loopback IP (127.0.0.0/8, `::1`) also matches a
    ///   listener bound to a loopback or unspecified (`0.0.0.0`, `::`) address. A broker bound
    ///   to an unspecified address that wants its interface addresses recognised passes them
    ///   in `addrs` too.
    ///
    /// With `addrs` empty the broker is taken to listen on [`DEFAULT_PORT`] only (so names and
    /// `.`/`localhost` can still be decided; no IP address is local).
    pub fn is_local_to(&self, names: &[String], addrs: &[SocketAddr]) -> bool {
        let listens_on = |port: u16| {
            if addrs.is_empty() {
                port == DEFAULT_PORT
            } else {
                addrs.iter().any(|a| a.port() == port)
            }
        };
        let port = self.port.unwrap_or(DEFAULT_PORT);
        match &self.host {
            Host::Local => self.port.is_none_or(listens_on),
            Host::Name(name) if name.eq_ignore_ascii_case("localhost") => {
                self.port.is_none_or(listens_on)
            }
            Host::Name(name) => {
                names.iter().any(|n| n.eq_ignore_ascii_case(name)) && listens_on(port)
            }
            Host::Ip(ip) => {
                let ip = ip.to_canonical();
                // An IP address given as one of the broker's names (an alias, e.g. a NAT
                // address) is local on the broker's port.
                let named = names.iter().any(|n| {
                    n.parse::<std::net::IpAddr>()
                        .is_ok_and(|n| n.to_canonical() == ip)
                });
                (named && listens_on(port))
                    || addrs.iter().any(|a| {
                        let bound = a.ip().to_canonical();
                        a.port() == port
                            && (bound == ip
                                || (ip.is_loopback()
                                    && (bound.is_loopback() || bound.is_unspecified())))
                    })
            }
        }
    }

    /// Journal and dead-letter queues can be read, peeked and purged, never sent to.
    pub fn is_read_only(&self) -> bool {
        self.kind != QueueKind::Normal
    }

    /// `host` or `host:port` (with `\`), as written at the front of a path name.
    fn host_and_port(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}\\", self.host),
            None => format!("{}\\", self.host),
        }
    }

    /// Everything after the host: `private$\name;JOURNAL`, `SYSTEM$;DEADLETTER`, ….
    fn tail(&self) -> String {
        let queue = || {
            if self.private {
                format!("{PRIVATE}\\{}", self.name)
            } else {
                self.name.clone()
            }
        };
        match self.kind {
            QueueKind::Normal => queue(),
            QueueKind::Journal => format!("{};JOURNAL", queue()),
            QueueKind::Subqueue => format!("{};{}", queue(), self.subqueue),
            QueueKind::DeadLetter => format!("{SYSTEM};DEADLETTER"),
            QueueKind::DeadXact => format!("{SYSTEM};DEADXACT"),
            QueueKind::SystemJournal => format!("{SYSTEM};JOURNAL"),
        }
    }
}

impl fmt::Display for QueueAddress {
    /// `DIRECT=OS:host\private$\name` for `.` and host names, `DIRECT=TCP:ip[:port]\…` for
    /// addresses (IPv6 in brackets), with `;JOURNAL`, `SYSTEM$;DEADLETTER` or
    /// `SYSTEM$;DEADXACT` as needed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = match self.host {
            Host::Ip(_) => "TCP",
            Host::Local | Host::Name(_) => "OS",
        };
        write!(
            f,
            "DIRECT={protocol}:{}{}",
            self.host_and_port(),
            self.tail()
        )
    }
}

impl FromStr for QueueAddress {
    type Err = FormatNameError;

    /// Parses a single path name or format name; a multiple-element name is an error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match FormatName::parse(s)? {
            FormatName::Single(address) => Ok(address),
            FormatName::Multi(addresses) => Err(FormatNameError::new(
                s,
                format!(
                    "this is a multiple-element format name ({} queues), which can only be sent \
                     to; a single queue is needed here",
                    addresses.len()
                ),
            )),
        }
    }
}

/// A parsed path name or format name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatName {
    /// One queue.
    Single(QueueAddress),
    /// A multiple-element name (send-only fan-out). The parser produces this only for two
    /// or more elements, none of them read-only.
    Multi(Vec<QueueAddress>),
}

impl FormatName {
    /// Parses a path name, a format name, or a multiple-element format name of at most
    /// [`MAX_FORMAT_NAME_ELEMENTS_CEILING`] elements (a broker applies its own, lower, limit
    /// with [`FormatName::parse_with_max_elements`]).
    pub fn parse(s: &str) -> Result<FormatName, FormatNameError> {
        FormatName::parse_with_max_elements(s, MAX_FORMAT_NAME_ELEMENTS_CEILING)
    }

    /// Parses like [`FormatName::parse`], refusing more than `max_elements` elements before
    /// looking at any of them (one pass counting commas), and any element longer than
    /// [`crate::limits::MAX_FORMAT_NAME_ELEMENT_BYTES`].
    pub fn parse_with_max_elements(
        s: &str,
        max_elements: usize,
    ) -> Result<FormatName, FormatNameError> {
        let elements = s.bytes().filter(|&b| b == b',').count() + 1;
        if elements > max_elements.max(1) {
            return Err(FormatNameError::new(
                s,
                format!(
                    "a multiple-element format name has {elements} elements; the limit is {} \
                     (mqd --max-format-name-elements)",
                    max_elements.max(1)
                ),
            ));
        }
        parse_format_name(s).map_err(|reason| FormatNameError::new(s, reason))
    }

    /// The queues named: one for [`FormatName::Single`].
    pub fn addresses(&self) -> &[QueueAddress] {
        match self {
            FormatName::Single(address) => std::slice::from_ref(address),
            FormatName::Multi(addresses) => addresses,
        }
    }

    /// The queue, when exactly one is named by a single-element name.
    pub fn single(&self) -> Option<&QueueAddress> {
        match self {
            FormatName::Single(address) => Some(address),
            FormatName::Multi(_) => None,
        }
    }
}

impl FromStr for FormatName {
    type Err = FormatNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FormatName::parse(s)
    }
}

impl fmt::Display for FormatName {
    /// A single name as [`QueueAddress`] shows it; a multiple-element one as
    /// `FORMATNAME:a,b,…`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatName::Single(address) => address.fmt(f),
            FormatName::Multi(addresses) => {
                f.write_str("FORMATNAME:")?;
                for (i, address) in addresses.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    address.fmt(f)?;
                }
                Ok(())
            }
        }
    }
}

/// A name that does not parse: quotes the name and says which rule it broke.
///
/// Control characters in the message are escaped so that it prints safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid queue name \"{}\": {}", crate::limits::quote(.input), escape_controls(.reason))]
pub struct FormatNameError {
    input: String,
    reason: String,
}

impl FormatNameError {
    fn new(input: &str, reason: impl Into<String>) -> Self {
        FormatNameError {
            // Kept for `input()`, cut so that a huge name is not copied around with its error.
            input: crate::limits::truncate(input, 4 * crate::limits::MAX_FORMAT_NAME_ELEMENT_BYTES),
            reason: reason.into(),
        }
    }

    /// What is wrong, without the quoted name.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The name as given (cut after 4 KiB, marked with `…`).
    pub fn input(&self) -> &str {
        &self.input
    }
}

fn escape_controls(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Parsing. Internal functions return the reason only; `FormatName::parse` adds the input.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A path name: `host\…`.
    Path,
    /// `DIRECT=OS:host\…`.
    Os,
    /// `DIRECT=TCP:ip\…`.
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suffix {
    Journal,
    DeadLetter,
    DeadXact,
}

impl Suffix {
    fn text(self) -> &'static str {
        match self {
            Suffix::Journal => ";JOURNAL",
            Suffix::DeadLetter => ";DEADLETTER",
            Suffix::DeadXact => ";DEADXACT",
        }
    }
}

fn is_separator(c: char) -> bool {
    c == '\\' || c == '/'
}

/// `s` without the ASCII-case-insensitive `prefix`.
fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn is_reserved(name: &str) -> bool {
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name))
}

fn parse_format_name(s: &str) -> Result<FormatName, String> {
    if s.is_empty() {
        return Err("the name is empty".into());
    }
    let body = strip_prefix_ci(s, "FORMATNAME:").unwrap_or(s);
    if body.is_empty() {
        return Err("nothing follows FORMATNAME:".into());
    }
    if !body.contains(',') {
        return parse_element(body).map(FormatName::Single);
    }
    let elements: Vec<&str> = body.split(',').collect();
    let n = elements.len();
    let mut addresses = Vec::with_capacity(n);
    for (i, element) in elements.into_iter().enumerate() {
        let i = i + 1;
        if element.is_empty() {
            return Err(format!(
                "empty element in a multiple-element format name (element {i} of {n})"
            ));
        }
        let address = parse_element(element).map_err(|r| {
            format!(
                "element {i} of {n} \"{}\": {r}",
                crate::limits::quote(element)
            )
        })?;
        if address.is_read_only() {
            return Err(format!(
                "element {i} of {n} \"{}\": a multiple-element format name is only for \
                 sending, and journal and dead-letter queues are read-only",
                crate::limits::quote(element)
            ));
        }
        addresses.push(address);
    }
    Ok(FormatName::Multi(addresses))
}

/// One path name or `DIRECT=` format name.
fn parse_element(element: &str) -> Result<QueueAddress, String> {
    let max = crate::limits::MAX_FORMAT_NAME_ELEMENT_BYTES;
    if element.len() > max {
        return Err(format!(
            "the name is {} bytes; the limit is {max} bytes per queue name",
            element.len()
        ));
    }
    let (mode, rest) = if let Some(after) = strip_prefix_ci(element, "DIRECT=") {
        if let Some(rest) = strip_prefix_ci(after, "OS:") {
            (Mode::Os, rest)
        } else if let Some(rest) = strip_prefix_ci(after, "TCP:") {
            (Mode::Tcp, rest)
        } else {
            let kind = after.split([':', '\\', '/', ';']).next().unwrap_or("");
            return Err(format!(
                "unknown DIRECT= address type \"{kind}\"; expected DIRECT=OS: or DIRECT=TCP:"
            ));
        }
    } else {
        let head = element.split(['\\', '/', ';']).next().unwrap_or("");
        if let Some((kind, _)) = head.split_once('=') {
            return Err(format!(
                "unknown format name type \"{kind}\"; expected DIRECT=OS: or DIRECT=TCP:"
            ));
        }
        (Mode::Path, element)
    };

    let (body, suffix, subqueue) = match rest.split_once(';') {
        Some((body, suffix)) => match parse_suffix(suffix)? {
            Some(s) => (body, Some(s), None),
            None => (body, None, Some(suffix)),
        },
        None => (rest, None, None),
    };
    let Some((head, path)) = body.split_once(is_separator) else {
        return Err(match mode {
            Mode::Path => format!("no '\\' after the host; {PATH_EXAMPLE}"),
            Mode::Os => r"no queue after the host; expected DIRECT=OS:host\private$\name".into(),
            Mode::Tcp => r"no queue after the address; expected DIRECT=TCP:ip\private$\name".into(),
        });
    };
    if head.is_empty() {
        return Err(match mode {
            Mode::Path => format!("the host is missing; {PATH_EXAMPLE}"),
            Mode::Os => "the host is missing after DIRECT=OS:".into(),
            Mode::Tcp => "the address is missing after DIRECT=TCP:".into(),
        });
    }
    let (host, port) = parse_host(head, mode)?;
    let (private, name, kind) = parse_queue_path(path, suffix, subqueue)?;
    Ok(QueueAddress {
        host,
        port,
        private,
        name,
        kind,
        subqueue: subqueue.unwrap_or_default().to_owned(),
    })
}

/// `;JOURNAL`, `;DEADLETTER`, `;DEADXACT`, or `None`: a subqueue's name (checked later).
fn parse_suffix(suffix: &str) -> Result<Option<Suffix>, String> {
    const EXPECTED: &str = "expected ;JOURNAL, ;DEADLETTER, ;DEADXACT or a subqueue name";
    if suffix.is_empty() {
        return Err(format!("nothing follows ';'; {EXPECTED}"));
    }
    Ok([Suffix::Journal, Suffix::DeadLetter, Suffix::DeadXact]
        .into_iter()
        .find(|s| s.text()[1..].eq_ignore_ascii_case(suffix)))
}

/// A subqueue name: 1–32 characters, none of `\ / , ;` or control characters, no leading
/// or trailing whitespace, not a reserved word.
pub fn check_subqueue_name(name: &str) -> Result<(), String> {
    let len = name.chars().count();
    if len == 0 {
        return Err("the subqueue name is empty".into());
    }
    if len > MAX_SUBQUEUE_NAME_LEN {
        return Err(format!(
            "subqueue name is {len} characters; the limit is {MAX_SUBQUEUE_NAME_LEN}"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c.is_control() || matches!(c, '\\' | '/' | ',' | ';'))
    {
        return Err(format!(
            "subqueue name \"{}\" contains {}; a subqueue name cannot contain '\\', '/', ',', ';' or control characters (subqueues have no subqueues)",
            escape_controls(name),
            c.escape_default()
        ));
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Err(format!(
            "subqueue name \"{name}\" starts or ends with whitespace"
        ));
    }
    if is_reserved(name)
        || [Suffix::Journal, Suffix::DeadLetter, Suffix::DeadXact]
            .iter()
            .any(|s| s.text()[1..].eq_ignore_ascii_case(name))
    {
        return Err(format!(
            "\"{name}\" is a reserved word and cannot be a subqueue name"
        ));
    }
    Ok(())
}

/// `.`, `name`, `ipv4`, `[ipv6]` or a bare IPv6 address, each but the last with an optional
/// `:port`.
fn parse_host(head: &str, mode: Mode) -> Result<(Host, Option<u16>), String> {
    let (host, port) = if let Some(inner) = head.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return Err(format!("\"{head}\" has no ']' to close the IPv6 address"));
        };
        let ip: Ipv6Addr = addr
            .parse()
            .map_err(|_| format!("\"{addr}\" in brackets is not an IPv6 address"))?;
        let port = if after.is_empty() {
            None
        } else if let Some(port) = after.strip_prefix(':') {
            Some(parse_port(port)?)
        } else {
            return Err(format!(
                "\"{after}\" follows \"[{addr}]\"; only :port can follow an IPv6 address"
            ));
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else if let Ok(ip) = head.parse::<Ipv6Addr>() {
        (Host::Ip(IpAddr::V6(ip)), None)
    } else {
        let (name, port) = match head.rsplit_once(':') {
            Some((name, _)) if name.contains(':') => {
                return Err(format!(
                    "\"{head}\" is not an IPv6 address; with a port, an IPv6 address goes in \
                     brackets, e.g. [::1]:1802"
                ));
            }
            Some((name, port)) => match parse_port(port) {
                Ok(port) => (name, Some(port)),
                Err(_)
                    if mode == Mode::Path
                        && (name.eq_ignore_ascii_case("OS")
                            || name.eq_ignore_ascii_case("TCP")) =>
                {
                    let upper = name.to_ascii_uppercase();
                    return Err(format!(
                        "\"{name}:\" must follow DIRECT=, e.g. DIRECT={upper}:{port}\\…"
                    ));
                }
                Err(e) => return Err(e),
            },
            None => (head, None),
        };
        let host = if name == "." {
            Host::Local
        } else if let Ok(ip) = name.parse::<Ipv4Addr>() {
            Host::Ip(IpAddr::V4(ip))
        } else {
            Host::Name(parse_host_name(name)?)
        };
        (host, port)
    };
    if mode == Mode::Tcp && !matches!(host, Host::Ip(_)) {
        return Err(format!(
            "DIRECT=TCP: needs an IP address, not \"{head}\"; use DIRECT=OS: for a host name"
        ));
    }
    Ok((host, port))
}

fn parse_port(port: &str) -> Result<u16, String> {
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    match port.parse::<u16>() {
        Ok(n @ 1..) if digits => Ok(n),
        _ => Err(format!("port \"{port}\" is not a number from 1 to 65535")),
    }
}

/// A DNS-style name: dot-separated labels of letters, digits, `-` and `_`, lowercased.
fn parse_host_name(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("the host is missing before the ':port'".into());
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
    {
        return Err(format!(
            "host \"{name}\" contains {c:?}; a host name has only letters, digits, '-', '_' \
             and '.'"
        ));
    }
    if name.len() > MAX_HOST_LEN {
        return Err(format!(
            "host name is {} characters; the limit is {MAX_HOST_LEN}",
            name.len()
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!(
                "host \"{name}\" has an empty part (a leading, trailing or doubled '.')"
            ));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(format!(
                "host \"{name}\" has a part of {} characters; the limit is {MAX_LABEL_LEN}",
                label.len()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "host \"{name}\": a part of a host name cannot start or end with '-'"
            ));
        }
    }
    Ok(name.to_ascii_lowercase())
}

/// The part after the host: `name`, `private$\name`, `SYSTEM$`, System.Messaging's
/// `…\journal$`, `Deadletter$` and `XactDeadletter$`; then the `;suffix` decides the kind.
fn parse_queue_path(
    path: &str,
    suffix: Option<Suffix>,
    subqueue: Option<&str>,
) -> Result<(bool, String, QueueKind), String> {
    let mut segments: Vec<&str> = path.split(is_separator).collect();
    let journal_segment = segments.len() >= 2
        && segments
            .last()
            .is_some_and(|s| s.eq_ignore_ascii_case(JOURNAL_SEGMENT));
    if journal_segment {
        segments.pop();
    }
    if segments == [""] {
        return Err("the queue name is missing after the host".into());
    }
    if segments.len() == 2 && segments[0].eq_ignore_ascii_case(PRIVATE) && segments[1].is_empty() {
        return Err("the queue name is missing after private$".into());
    }
    if segments.iter().any(|s| s.is_empty()) {
        return Err(format!(
            "empty path segment in \"{path}\" (two separators in a row, or one at the end)"
        ));
    }

    enum Target<'a> {
        Queue { private: bool, name: &'a str },
        System { alias: Option<(&'a str, QueueKind)> },
    }
    let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let target = match segments.as_slice() {
        [s] if eq(s, SYSTEM) => Target::System { alias: None },
        [s] if eq(s, DEADLETTER_ALIAS) => Target::System {
            alias: Some((s, QueueKind::DeadLetter)),
        },
        [s] if eq(s, DEADXACT_ALIAS) => Target::System {
            alias: Some((s, QueueKind::DeadXact)),
        },
        [s] if eq(s, PRIVATE) => {
            return Err(r"private$ needs a queue name after it, e.g. .\private$\orders".into());
        }
        [name] => Target::Queue {
            private: false,
            name,
        },
        [p, name] if eq(p, PRIVATE) => Target::Queue {
            private: true,
            name,
        },
        [s, _] if eq(s, SYSTEM) => {
            return Err(
                r"SYSTEM$ has no queues under it; use host\SYSTEM$;DEADLETTER or host\SYSTEM$;DEADXACT"
                    .into(),
            );
        }
        [folder, _] => {
            return Err(format!(
                "\"{folder}\" cannot come between the host and the queue name; only private$ can \
                 (a queue name cannot contain '\\' or '/')"
            ));
        }
        _ => {
            return Err(format!(
                "too many path segments in \"{path}\"; expected private$\\name or name (a queue \
                 name cannot contain '\\' or '/')"
            ));
        }
    };

    match target {
        Target::Queue { private, name } => {
            check_queue_name(name)?;
            if let Some(sub) = subqueue {
                if journal_segment {
                    return Err(format!(
                        "a path ending in \\journal$ cannot also carry ;{sub} (a journal has no subqueues)"
                    ));
                }
                check_subqueue_name(sub)?;
                return Ok((private, name.to_owned(), QueueKind::Subqueue));
            }
            let kind = match (journal_segment, suffix) {
                (false, None) => QueueKind::Normal,
                (true, None) | (false, Some(Suffix::Journal)) => QueueKind::Journal,
                (true, Some(s)) => {
                    return Err(format!(
                        "a path ending in \\journal$ cannot also carry {}",
                        s.text()
                    ));
                }
                (false, Some(s)) => {
                    return Err(format!(
                        "{0} is only valid on SYSTEM$, e.g. DIRECT=OS:host\\SYSTEM${0}",
                        s.text()
                    ));
                }
            };
            Ok((private, name.to_owned(), kind))
        }
        Target::System { alias } => {
            if let Some(sub) = subqueue {
                return Err(format!(
                    "unknown suffix \";{sub}\"; SYSTEM$ takes ;DEADLETTER, ;DEADXACT or ;JOURNAL (system queues have no subqueues)"
                ));
            }
            if journal_segment {
                return Err(
                    "journal$ is only valid after a queue; SYSTEM$ takes ;DEADLETTER, ;DEADXACT or ;JOURNAL"
                        .into(),
                );
            }
            let kind = match (alias, suffix) {
                (Some((_, kind)), None) => kind,
                (Some((word, _)), Some(s)) => {
                    return Err(format!("\"{word}\" cannot also carry {}", s.text()));
                }
                (None, None) => {
                    return Err("SYSTEM$ needs ;DEADLETTER, ;DEADXACT or ;JOURNAL".into())
                }
                (None, Some(Suffix::Journal)) => QueueKind::SystemJournal,
                (None, Some(Suffix::DeadLetter)) => QueueKind::DeadLetter,
                (None, Some(Suffix::DeadXact)) => QueueKind::DeadXact,
            };
            Ok((false, SYSTEM.to_owned(), kind))
        }
    }
}

/// 1–124 characters, no control characters, no leading or trailing whitespace, not a
/// reserved word. (`\ / , ;` cannot reach here: they split the name first.)
fn check_queue_name(name: &str) -> Result<(), String> {
    let len = name.chars().count();
    if len > MAX_QUEUE_NAME_LEN {
        return Err(format!(
            "queue name is {len} characters; the limit is {MAX_QUEUE_NAME_LEN}"
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!(
            "queue name contains the control character {}",
            c.escape_unicode()
        ));
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Err(format!(
            "queue name \"{name}\" starts or ends with whitespace"
        ));
    }
    if is_reserved(name) {
        return Err(format!(
            "\"{name}\" is a reserved word and cannot be a queue name"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn parse(s: &str) -> FormatName {
        FormatName::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn single(s: &str) -> QueueAddress {
        s.parse::<QueueAddress>()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn addr(
        host: Host,
        port: Option<u16>,
        private: bool,
        name: &str,
        kind: QueueKind,
    ) -> QueueAddress {
        QueueAddress {
            host,
            port,
            private,
            name: name.into(),
            kind,
            subqueue: String::new(),
        }
    }

    fn name(n: &str) -> Host {
        Host::Name(n.into())
    }

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    /// Parses `input`, expects an error, and checks that the message quotes the input and
    /// contains `rule`.
    fn err(input: &str, rule: &str) -> FormatNameError {
        let e = FormatName::parse(input).expect_err(input);
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "invalid queue name \"{}\": ",
                escape_controls(input)
            )),
            "{msg:?} does not quote {input:?}"
        );
        assert!(msg.contains(rule), "{msg:?} does not say {rule:?}");
        assert_eq!(e.input(), input);
        assert!(msg.ends_with(&escape_controls(e.reason())));
        e
    }

    /// Checks display → parse → equal, path_name → parse → equal.
    fn round_trips(a: &QueueAddress) {
        assert_eq!(single(&a.to_string()), *a, "display {a}");
        assert_eq!(single(&a.path_name()), *a, "path name {}", a.path_name());
    }

    // ---- every row of the grammar ----------------------------------------------------

    #[test]
    fn local_private_path_name() {
        let a = single(r".\private$\orders");
        assert_eq!(
            a,
            addr(Host::Local, None, true, "orders", QueueKind::Normal)
        );
        assert_eq!(a.key(), r"private$\orders");
        assert_eq!(a.path_name(), r".\private$\orders");
        assert_eq!(a.to_string(), r"DIRECT=OS:.\private$\orders");
        assert!(!a.is_read_only());
        round_trips(&a);
    }

    #[test]
    fn local_public_path_name() {
        let a = single(r".\Orders");
        assert_eq!(
            a,
            addr(Host::Local, None, false, "Orders", QueueKind::Normal)
        );
        assert_eq!(a.key(), "orders");
        assert_eq!(a.path_name(), r".\Orders");
        round_trips(&a);
    }

    #[test]
    fn remote_path_name() {
        let a = single(r"Host-1.Example.com\private$\orders");
        assert_eq!(
            a,
            addr(
                name("host-1.example.com"),
                None,
                true,
                "orders",
                QueueKind::Normal
            )
        );
        assert_eq!(a.path_name(), r"host-1.example.com\private$\orders");
        assert_eq!(
            a.to_string(),
            r"DIRECT=OS:host-1.example.com\private$\orders"
        );
        round_trips(&a);
        // An address in a path name is fine too.
        assert_eq!(single(r"10.0.0.5\q").host, ip("10.0.0.5"));
        // And a port.
        let a = single(r"host:1802\q");
        assert_eq!((a.host.clone(), a.port), (name("host"), Some(1802)));
        round_trips(&a);
    }

    #[test]
    fn direct_os() {
        let a = single(r"DIRECT=OS:host\private$\orders");
        assert_eq!(
            a,
            addr(name("host"), None, true, "orders", QueueKind::Normal)
        );
        assert_eq!(a.to_string(), r"DIRECT=OS:host\private$\orders");
        assert_eq!(single(r"DIRECT=OS:.\private$\q").host, Host::Local);
        assert_eq!(
            single(r"DIRECT=OS:localhost\private$\q").host,
            name("localhost")
        );
        assert_eq!(single(r"DIRECT=OS:LocalHost\q").host, name("localhost"));
        assert!(!single(r"DIRECT=OS:host\orders").private);
        // An address after OS: is accepted and shown as TCP.
        let a = single(r"DIRECT=OS:10.0.0.5\q");
        assert_eq!(a.host, ip("10.0.0.5"));
        assert_eq!(a.to_string(), r"DIRECT=TCP:10.0.0.5\q");
    }

    #[test]
    fn direct_tcp_ipv4() {
        let a = single(r"DIRECT=TCP:10.0.0.5\private$\orders");
        assert_eq!(
            a,
            addr(ip("10.0.0.5"), None, true, "orders", QueueKind::Normal)
        );
        assert_eq!(a.to_string(), r"DIRECT=TCP:10.0.0.5\private$\orders");
        assert_eq!(a.path_name(), r"10.0.0.5\private$\orders");
        round_trips(&a);
    }

    #[test]
    fn direct_tcp_with_port() {
        let a = single(r"DIRECT=TCP:127.0.0.1:1802\private$\orders");
        assert_eq!(
            a,
            addr(
                ip("127.0.0.1"),
                Some(1802),
                true,
                "orders",
                QueueKind::Normal
            )
        );
        assert_eq!(a.to_string(), r"DIRECT=TCP:127.0.0.1:1802\private$\orders");
        round_trips(&a);
        // An explicit default port is kept as written.
        assert_eq!(
            single(r"DIRECT=TCP:127.0.0.1:1801\q").port,
            Some(DEFAULT_PORT)
        );
        assert_eq!(single(r"DIRECT=OS:host:65535\q").port, Some(65535));
        assert_eq!(single(r"DIRECT=OS:.:1\q").port, Some(1));
    }

    #[test]
    fn direct_tcp_ipv6() {
        let a = single(r"DIRECT=TCP:[::1]:1802\private$\orders");
        assert_eq!(
            a,
            addr(ip("::1"), Some(1802), true, "orders", QueueKind::Normal)
        );
        assert_eq!(a.to_string(), r"DIRECT=TCP:[::1]:1802\private$\orders");
        assert_eq!(a.path_name(), r"[::1]:1802\private$\orders");
        round_trips(&a);
        assert_eq!(single(r"DIRECT=TCP:[fe80::1]\q").port, None);
        // A bare IPv6 address without a port is unambiguous.
        let a = single(r"DIRECT=TCP:2001:db8::7\q");
        assert_eq!(a.host, ip("2001:db8::7"));
        assert_eq!(a.to_string(), r"DIRECT=TCP:[2001:db8::7]\q");
    }

    #[test]
    fn journal() {
        let a = single(r"DIRECT=OS:host\private$\orders;JOURNAL");
        assert_eq!(
            a,
            addr(name("host"), None, true, "orders", QueueKind::Journal)
        );
        assert!(a.is_read_only());
        assert_eq!(a.key(), r"private$\orders;journal");
        assert_eq!(a.to_string(), r"DIRECT=OS:host\private$\orders;JOURNAL");
        assert_eq!(a.path_name(), r"host\private$\orders;JOURNAL");
        round_trips(&a);
        assert_eq!(single(r".\orders;journal").key(), "orders;journal");
        // System.Messaging's path-name form.
        assert_eq!(single(r"host\private$\orders\Journal$"), a);
        assert_eq!(single(r".\orders\journal$").kind, QueueKind::Journal);
    }

    #[test]
    fn dead_letter_queues() {
        let a = single(r"DIRECT=OS:host\SYSTEM$;DEADLETTER");
        assert_eq!(
            a,
            addr(name("host"), None, false, "SYSTEM$", QueueKind::DeadLetter)
        );
        assert!(a.is_read_only());
        assert_eq!(a.key(), "system$;deadletter");
        assert_eq!(a.to_string(), r"DIRECT=OS:host\SYSTEM$;DEADLETTER");
        assert_eq!(a.path_name(), r"host\SYSTEM$;DEADLETTER");
        round_trips(&a);

        let x = single(r"DIRECT=TCP:10.1.2.3\system$;deadxact");
        assert_eq!(
            x,
            addr(ip("10.1.2.3"), None, false, "SYSTEM$", QueueKind::DeadXact)
        );
        assert_eq!(x.key(), "system$;deadxact");
        assert_eq!(x.to_string(), r"DIRECT=TCP:10.1.2.3\SYSTEM$;DEADXACT");
        round_trips(&x);

        // System.Messaging's path-name forms.
        assert_eq!(single(r"host\Deadletter$"), a);
        assert_eq!(single(r"10.1.2.3\XactDeadletter$"), x);
    }

    #[test]
    fn multiple_elements() {
        let f =
            parse(r"FORMATNAME:DIRECT=OS:a\private$\q1,DIRECT=TCP:10.0.0.5:1802\q2,.\private$\q3");
        let expected = vec![
            addr(name("a"), None, true, "q1", QueueKind::Normal),
            addr(ip("10.0.0.5"), Some(1802), false, "q2", QueueKind::Normal),
            addr(Host::Local, None, true, "q3", QueueKind::Normal),
        ];
        assert_eq!(f, FormatName::Multi(expected.clone()));
        assert_eq!(f.addresses(), expected.as_slice());
        assert_eq!(f.single(), None);
        assert_eq!(
            f.to_string(),
            r"FORMATNAME:DIRECT=OS:a\private$\q1,DIRECT=TCP:10.0.0.5:1802\q2,DIRECT=OS:.\private$\q3"
        );
        assert_eq!(parse(&f.to_string()), f);
        // Without the prefix too.
        assert_eq!(parse(r"DIRECT=OS:a\q1,DIRECT=OS:b\q2").addresses().len(), 2);
    }

    #[test]
    fn formatname_prefix_on_a_single_name() {
        let f = parse(r"FORMATNAME:DIRECT=OS:host\private$\orders");
        assert_eq!(f, parse(r"DIRECT=OS:host\private$\orders"));
        assert_eq!(f.single(), Some(&f.addresses()[0]));
        assert_eq!(f.addresses().len(), 1);
        assert_eq!(parse(r"formatname:direct=os:HOST\PRIVATE$\orders"), f);
        assert_eq!(
            parse(r"FormatName:.\private$\orders")
                .single()
                .unwrap()
                .host,
            Host::Local
        );
    }

    #[test]
    fn slash_and_backslash_are_equivalent() {
        let a = single(r"DIRECT=TCP:[::1]:1802\private$\orders;JOURNAL");
        assert_eq!(single("DIRECT=TCP:[::1]:1802/private$/orders;JOURNAL"), a);
        assert_eq!(single(r"DIRECT=TCP:[::1]:1802/private$\orders;JOURNAL"), a);
        assert_eq!(single("./private$/q"), single(r".\private$\q"));
        assert_eq!(single("host/q/journal$"), single(r"host\q;JOURNAL"));
    }

    #[test]
    fn keywords_are_case_insensitive_and_names_keep_their_case() {
        let a = single(r"direct=tcp:10.0.0.5\PRIVATE$\Orders;Journal");
        assert_eq!(
            a,
            addr(ip("10.0.0.5"), None, true, "Orders", QueueKind::Journal)
        );
        assert_eq!(a.key(), r"private$\orders;journal");
        assert_eq!(
            single(r"Direct=Os:HOST\System$;DeadXact").kind,
            QueueKind::DeadXact
        );
    }

    #[test]
    fn queue_name_limits() {
        let max = "q".repeat(MAX_QUEUE_NAME_LEN);
        assert_eq!(single(&format!(r".\private$\{max}")).name, max);
        // Characters, not bytes.
        let wide = "é".repeat(MAX_QUEUE_NAME_LEN);
        assert_eq!(single(&format!(r".\{wide}")).name, wide);
        // Inner spaces, dots, dollars and unicode are fine.
        assert_eq!(
            single(r".\private$\my queue.v2$ — 東京").name,
            "my queue.v2$ — 東京"
        );
        assert_eq!(single(r".\a").name, "a");
    }

    #[test]
    fn from_str_and_display_for_format_name() {
        let f: FormatName = r"DIRECT=OS:host\q".parse().unwrap();
        assert_eq!(f.to_string(), r"DIRECT=OS:host\q");
    }

    // ---- is_local_to -------------------------------------------------------------------

    #[test]
    fn locality() {
        let names = vec!["MyBox".to_string(), "mybox.corp.example".to_string()];
        let v4: SocketAddr = "10.0.0.5:1801".parse().unwrap();
        let any4: SocketAddr = "0.0.0.0:1802".parse().unwrap();
        let local = |s: &str, addrs: &[SocketAddr]| single(s).is_local_to(&names, addrs);

        // `.` and localhost: always local without a port; with one, when we listen there.
        assert!(local(r".\q", &[v4]));
        assert!(local(r"localhost\q", &[any4]));
        assert!(local(r"DIRECT=OS:LOCALHOST\q", &[]));
        assert!(local(r".:1802\q", &[any4]));
        assert!(!local(r".:1803\q", &[any4]));
        assert!(local(r"localhost:1801\q", &[]));
        assert!(!local(r"localhost:1802\q", &[]));

        // Our names, case-insensitively, at our port.
        assert!(local(r"mybox\q", &[v4]));
        assert!(local(r"MYBOX.corp.example\q", &[v4]));
        assert!(local(r"mybox:1802\q", &[any4]));
        assert!(
            !local(r"mybox\q", &[any4]),
            "None means 1801, we listen on 1802"
        );
        assert!(local(r"mybox\q", &[]), "no addrs: assume the default port");
        assert!(!local(r"otherbox\q", &[v4]));

        // IPs: same IP and port.
        assert!(local(r"DIRECT=TCP:10.0.0.5\q", &[v4]));
        assert!(local(r"DIRECT=TCP:10.0.0.5:1801\q", &[v4]));
        assert!(!local(r"DIRECT=TCP:10.0.0.5:1802\q", &[v4]));
        assert!(!local(r"DIRECT=TCP:10.0.0.6\q", &[v4]));
        assert!(!local(r"DIRECT=TCP:10.0.0.5\q", &[]));
        // Loopback matches loopback- and unspecified-bound listeners.
        assert!(local(r"DIRECT=TCP:127.0.0.1:1802\q", &[any4]));
        assert!(local(
            r"DIRECT=TCP:[::1]:1802\q",
            &["[::]:1802".parse().unwrap()]
        ));
        assert!(local(
            r"DIRECT=TCP:127.0.0.1\q",
            &["127.0.0.1:1801".parse().unwrap()]
        ));
        assert!(local(
            r"DIRECT=TCP:[::1]\q",
            &["127.0.0.1:1801".parse().unwrap()]
        ));
        assert!(!local(r"DIRECT=TCP:127.0.0.1\q", &[any4]), "wrong port");
        // A non-loopback IP does not match an unspecified listener by itself.
        assert!(!local(r"DIRECT=TCP:10.0.0.5:1802\q", &[any4]));
        // IPv4-mapped IPv6 equals its IPv4 address.
        assert!(local(r"DIRECT=TCP:[::ffff:10.0.0.5]\q", &[v4]));
        assert!(local(
            r"DIRECT=TCP:10.0.0.5\q",
            &["[::ffff:10.0.0.5]:1801".parse().unwrap()]
        ));
    }

    // ---- every error -------------------------------------------------------------------

    #[test]
    fn error_display_and_accessors() {
        let e = err(r"DIRECT=OS:host\private$\", "queue name is missing");
        assert_eq!(
            e.to_string(),
            r#"invalid queue name "DIRECT=OS:host\private$\": the queue name is missing after private$"#
        );
        assert_eq!(e.reason(), "the queue name is missing after private$");
    }

    #[test]
    fn error_empty() {
        err("", "the name is empty");
        err("FORMATNAME:", "nothing follows FORMATNAME:");
        err("formatname:", "nothing follows FORMATNAME:");
    }

    #[test]
    fn error_queue_name_too_long() {
        let input = format!(r".\private$\{}", "q".repeat(130));
        err(&input, "queue name is 130 characters; the limit is 124");
        let input = format!(r"DIRECT=OS:host\{}", "é".repeat(125));
        err(&input, "queue name is 125 characters; the limit is 124");
    }

    #[test]
    fn error_queue_name_characters() {
        err(
            ".\\private$\\a\u{7}b",
            r"queue name contains the control character \u{7}",
        );
        err(".\\a\nb", r"control character \u{a}");
        err(".\\q\u{0}", r"control character \u{0}");
        // The message itself escapes control characters.
        let e = FormatName::parse(".\\a\nb").unwrap_err();
        assert!(!e.to_string().contains('\n'));
        err(r".\private$\ orders", "starts or ends with whitespace");
        err(r".\orders ", "starts or ends with whitespace");
        err(".\\orders\u{3000}", "starts or ends with whitespace");
        err(r".\private$\a\b", "too many path segments");
        err(
            r".\private$\a/b\c",
            "a queue name cannot contain '\\' or '/'",
        );
        // `;` starts a suffix or a subqueue name: `.\a;b` is subqueue b of queue a.
        assert_eq!(single(r".\a;b").kind, QueueKind::Subqueue);
        err(r".\a,b", r#"element 2 of 2 "b""#);
    }

    #[test]
    fn error_reserved_names() {
        err(r".\private$", "private$ needs a queue name after it");
        err(r".\private$\private$", "reserved word");
        err(r".\journal$", r#""journal$" is a reserved word"#);
        err(r".\private$\Deadletter$", "reserved word");
        err(r".\private$\system$", "reserved word");
        err(r".\outgoing$", "reserved word");
        err(r".\private$\OUTGOING$", "reserved word");
        err(
            r".\private$\journal$",
            "private$ needs a queue name after it",
        );
    }

    #[test]
    fn error_missing_parts() {
        err(
            "orders",
            r#"no '\' after the host; a path name looks like ".\private$\orders""#,
        );
        err(
            "DIRECT=OS:host",
            r"no queue after the host; expected DIRECT=OS:host\private$\name",
        );
        err("DIRECT=TCP:10.0.0.5", "no queue after the address");
        err("DIRECT=OS:", "no queue after the host");
        err(r"\private$\orders", "the host is missing");
        err(r"DIRECT=OS:\q", "the host is missing after DIRECT=OS:");
        err(r"DIRECT=TCP:\q", "the address is missing after DIRECT=TCP:");
        err(r"host\", "the queue name is missing after the host");
        err(r"host\\q", "empty path segment");
        err(r"host\private$\q\", "empty path segment");
        err(r"host\\", "empty path segment");
    }

    #[test]
    fn error_unknown_types() {
        err(
            r"PUBLIC=1234-5678",
            r#"unknown format name type "PUBLIC"; expected DIRECT=OS: or DIRECT=TCP:"#,
        );
        err(r"PRIVATE=1234\5", r#"unknown format name type "PRIVATE""#);
        err(
            r"FORMATNAME:MULTICAST=234.1.1.1:8001",
            r#"unknown format name type "MULTICAST""#,
        );
        err(
            r"DIRECT=HTTP://host/msmq/q",
            r#"unknown DIRECT= address type "HTTP"; expected DIRECT=OS: or DIRECT=TCP:"#,
        );
        err(r"DIRECT=q", r#"unknown DIRECT= address type "q""#);
        err(
            r"OS:host\q",
            r#""OS:" must follow DIRECT=, e.g. DIRECT=OS:host\…"#,
        );
        err(
            r"tcp:10.0.0.5\q",
            r#""tcp:" must follow DIRECT=, e.g. DIRECT=TCP:10.0.0.5\…"#,
        );
    }

    #[test]
    fn error_suffixes() {
        err(
            r"DIRECT=OS:host\SYSTEM$",
            "SYSTEM$ needs ;DEADLETTER, ;DEADXACT or ;JOURNAL",
        );
        err(
            r".\system$",
            "SYSTEM$ needs ;DEADLETTER, ;DEADXACT or ;JOURNAL",
        );
        assert_eq!(single(r".\SYSTEM$;Journal").kind, QueueKind::SystemJournal);
        assert!(single(r"DIRECT=OS:host\SYSTEM$;JOURNAL").is_read_only());
        round_trips(&single(r"DIRECT=TCP:10.0.0.5:1802\SYSTEM$;JOURNAL"));
        err(
            r".\private$\q;DEADLETTER",
            r";DEADLETTER is only valid on SYSTEM$",
        );
        err(r".\q;deadxact", r";DEADXACT is only valid on SYSTEM$");
        err(r".\private$\q;", "nothing follows ';'");
        err(
            r".\private$\q;JOURNAL;JOURNAL",
            r#"subqueue name "JOURNAL;JOURNAL" contains ;"#,
        );
        err(
            r".\SYSTEM$;QUEUE",
            r#"unknown suffix ";QUEUE"; SYSTEM$ takes"#,
        );
        err(r".\q\journal$;poison", "a journal has no subqueues");
        err(r".\SYSTEM$\q", "SYSTEM$ has no queues under it");
        err(
            r".\SYSTEM$\journal$",
            "journal$ is only valid after a queue",
        );
        err(
            r".\q\journal$;JOURNAL",
            r"a path ending in \journal$ cannot also carry ;JOURNAL",
        );
        err(
            r".\Deadletter$;DEADLETTER",
            r#""Deadletter$" cannot also carry ;DEADLETTER"#,
        );
        err(
            r".\orders\q",
            r#""orders" cannot come between the host and the queue name"#,
        );
    }

    #[test]
    fn error_hosts() {
        err(
            r"DIRECT=TCP:host\q",
            r#"DIRECT=TCP: needs an IP address, not "host"; use DIRECT=OS:"#,
        );
        err(r"DIRECT=TCP:.\q", "DIRECT=TCP: needs an IP address");
        err(r"DIRECT=TCP:localhost:1802\q", r#"not "localhost:1802""#);
        err(r"DIRECT=OS:ho st\q", r#"host "ho st" contains ' '"#);
        err(r"DIRECT=OS:hóst\q", r#"host "hóst" contains 'ó'"#);
        err(r"a..b\q", r#"host "a..b" has an empty part"#);
        err(r"host.\q", "has an empty part");
        err(r"-host\q", "cannot start or end with '-'");
        err(
            &format!(r"{}\q", "a".repeat(64)),
            "has a part of 64 characters; the limit is 63",
        );
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(63),
        ]
        .join(".");
        err(
            &format!(r"{long}\q"),
            "host name is 255 characters; the limit is 253",
        );
        err(r":1802\q", "the host is missing before the ':port'");
        err(
            r"DIRECT=TCP:[::1\q",
            r#""[::1" has no ']' to close the IPv6 address"#,
        );
        err(
            r"DIRECT=TCP:[10.0.0.5]\q",
            r#""10.0.0.5" in brackets is not an IPv6 address"#,
        );
        err(
            r"DIRECT=TCP:[::1]x\q",
            r#""x" follows "[::1]"; only :port can follow"#,
        );
        err(
            r"DIRECT=TCP:fe80::1::2:1802\q",
            "an IPv6 address goes in brackets",
        );
        err(
            r"DIRECT=TCP:10.0.0.256\q",
            "DIRECT=TCP: needs an IP address",
        );
    }

    #[test]
    fn error_ports() {
        err(
            r"DIRECT=TCP:127.0.0.1:99999\q",
            r#"port "99999" is not a number from 1 to 65535"#,
        );
        err(
            r"DIRECT=TCP:127.0.0.1:0\q",
            r#"port "0" is not a number from 1 to 65535"#,
        );
        err(r"DIRECT=TCP:127.0.0.1:65536\q", r#"port "65536""#);
        err(r"DIRECT=TCP:[::1]:\q", r#"port """#);
        err(r"host:+80\q", r#"port "+80""#);
        err(r"host:0001802\q", r#"port "0001802""#);
        err(r"DIRECT=OS:host:http\q", r#"port "http""#);
    }

    #[test]
    fn error_multiple_elements() {
        err(
            r"FORMATNAME:DIRECT=OS:a\q1,,DIRECT=OS:b\q2",
            "empty element in a multiple-element format name (element 2 of 3)",
        );
        err(
            r"DIRECT=OS:a\q1,",
            "empty element in a multiple-element format name (element 2 of 2)",
        );
        err(
            r",DIRECT=OS:a\q1",
            "empty element in a multiple-element format name (element 1 of 2)",
        );
        err(
            r"DIRECT=OS:a\q1,PUBLIC=x",
            r#"element 2 of 2 "PUBLIC=x": unknown format name type "PUBLIC""#,
        );
        err(
            r"DIRECT=OS:a\q1,DIRECT=OS:a\q1;JOURNAL",
            "a multiple-element format name is only for sending, and journal and dead-letter \
             queues are read-only",
        );
        err(
            r"FORMATNAME:DIRECT=OS:a\SYSTEM$;DEADLETTER,.\q",
            "element 1 of 2",
        );
    }

    #[test]
    fn queue_address_rejects_multiple_elements() {
        let input = r"FORMATNAME:DIRECT=OS:a\q1,DIRECT=OS:b\q2";
        let e = input.parse::<QueueAddress>().unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("invalid queue name \"{input}\": ")),
            "{msg}"
        );
        assert!(
            msg.contains("multiple-element format name (2 queues)")
                && msg.contains("a single queue is needed"),
            "{msg}"
        );
        // But a FORMATNAME: prefix on a single name is fine.
        assert!(r"FORMATNAME:DIRECT=OS:a\q1".parse::<QueueAddress>().is_ok());
    }

    // ---- proptests -----------------------------------------------------------------------

    fn arb_host() -> impl Strategy<Value = Host> {
        prop_oneof![
            Just(Host::Local),
            Just(Host::Name("localhost".into())),
            "[a-z_]([a-z0-9_-]{0,10}[a-z0-9_])?(\\.[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?){0,3}"
                .prop_map(Host::Name),
            any::<Ipv4Addr>().prop_map(|ip| Host::Ip(ip.into())),
            any::<Ipv6Addr>().prop_map(|ip| Host::Ip(ip.into())),
        ]
    }

    fn valid_queue_name(n: &str) -> bool {
        !n.starts_with(char::is_whitespace) && !n.ends_with(char::is_whitespace) && !is_reserved(n)
    }

    fn arb_queue_name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9_.$ -]{1,124}",
            "[^\\\\/,;\\p{Cc}]{1,124}",
            Just("q".repeat(MAX_QUEUE_NAME_LEN)),
        ]
        .prop_filter("leading/trailing whitespace or reserved", |n| {
            valid_queue_name(n)
        })
    }

    fn arb_address_of(kinds: &'static [QueueKind]) -> impl Strategy<Value = QueueAddress> {
        (
            arb_host(),
            proptest::option::of(1u16..),
            any::<bool>(),
            arb_queue_name(),
            proptest::sample::select(kinds),
            arb_subqueue_name(),
        )
            .prop_map(|(host, port, private, name, kind, sub)| {
                let system = matches!(
                    kind,
                    QueueKind::DeadLetter | QueueKind::DeadXact | QueueKind::SystemJournal
                );
                QueueAddress {
                    host,
                    port,
                    private: private && !system,
                    name: if system { SYSTEM.into() } else { name },
                    kind,
                    subqueue: if kind == QueueKind::Subqueue {
                        sub
                    } else {
                        String::new()
                    },
                }
            })
    }

    fn valid_subqueue_name(n: &str) -> bool {
        valid_queue_name(n)
            && !["journal", "deadletter", "deadxact"]
                .iter()
                .any(|r| r.eq_ignore_ascii_case(n))
    }

    fn arb_subqueue_name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9_.$ -]{1,32}",
            "[^\\\\/,;\\p{Cc}]{1,32}",
            Just("s".repeat(MAX_SUBQUEUE_NAME_LEN)),
        ]
        .prop_filter("leading/trailing whitespace or reserved", |n| {
            valid_subqueue_name(n)
        })
    }

    fn arb_address() -> impl Strategy<Value = QueueAddress> {
        arb_address_of(&[
            QueueKind::Normal,
            QueueKind::Journal,
            QueueKind::DeadLetter,
            QueueKind::DeadXact,
            QueueKind::SystemJournal,
            QueueKind::Subqueue,
        ])
    }

    #[test]
    fn subqueues() {
        let a = single(r"DIRECT=OS:host\private$\orders;Poison");
        assert_eq!(a.kind, QueueKind::Subqueue);
        assert_eq!(a.subqueue, "Poison");
        assert!(a.is_read_only());
        assert_eq!(a.key(), r"private$\orders;poison");
        assert_eq!(a.to_string(), r"DIRECT=OS:host\private$\orders;Poison");
        assert_eq!(a.path_name(), r"host\private$\orders;Poison");
        round_trips(&a);
        assert_eq!(a.main_queue(), single(r"DIRECT=OS:host\private$\orders"));
        assert_eq!(a.main_queue().with_subqueue("Poison").unwrap(), a);
        assert_eq!(a.with_subqueue("").unwrap(), a.main_queue());
        assert_eq!(single(r".\q;journal").kind, QueueKind::Journal);
        err(r".\q;a;b", "subqueue name \"a;b\" contains ;");
        err(&format!(r".\q;{}", "s".repeat(33)), "the limit is 32");
        err(r".\q; x", "starts or ends with whitespace");
        err(r".\q;private$", "reserved word");
        err(r".\q;sub\x", "contains");
        // A subqueue is not a send destination, so not part of a multiple-element name.
        err(r".\q;s,.\r", "journal and dead-letter queues are read-only");
        assert!(a.with_subqueue("deadxact").is_err());
        assert!(single(r".\SYSTEM$;DEADLETTER").with_subqueue("x").is_err());
    }

    fn arb_multi() -> impl Strategy<Value = FormatName> {
        proptest::collection::vec(arb_address_of(&[QueueKind::Normal]), 2..6)
            .prop_map(FormatName::Multi)
    }

    /// Fragments of the grammar, to reach deep into the parser with random input.
    fn arb_soup() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            Just("DIRECT="),
            Just("direct="),
            Just("OS:"),
            Just("TCP:"),
            Just("FORMATNAME:"),
            Just("PUBLIC="),
            Just("\\"),
            Just("/"),
            Just("."),
            Just(","),
            Just(";"),
            Just(":"),
            Just("["),
            Just("]"),
            Just("::1"),
            Just("10.0.0.5"),
            Just("1802"),
            Just("99999"),
            Just("0"),
            Just("private$"),
            Just("SYSTEM$"),
            Just("journal$"),
            Just("Deadletter$"),
            Just("JOURNAL"),
            Just("DEADLETTER"),
            Just("deadxact"),
            Just("host"),
            Just("localhost"),
            Just("q"),
            Just(" "),
            Just("-"),
            Just("é"),
            Just("東"),
            Just("\u{0}"),
            Just("\u{1F600}"),
        ];
        let free = proptest::collection::vec(token, 0..16).prop_map(|t| t.concat());
        // Mostly-valid shapes, so that many inputs parse and the round trip is exercised:
        // each part is usually one of the good options and sometimes one of the bad.
        fn part(
            good: &'static [&'static str],
            bad: &'static [&'static str],
        ) -> impl Strategy<Value = &'static str> {
            prop_oneof![6 => proptest::sample::select(good), 1 => proptest::sample::select(bad)]
        }
        let shaped = (
            part(&["", "FORMATNAME:", "formatname:"], &["FORMATNAME"]),
            part(
                &["", "DIRECT=OS:", "direct=os:"],
                &["DIRECT=FOO:", "DIRECT=TCP:"],
            ),
            part(
                &[
                    ".",
                    "Host",
                    "10.0.0.5",
                    "[::1]",
                    "::1",
                    "localhost",
                    "a-b.c",
                ],
                &["", "é", "a..b", "[::1"],
            ),
            part(&["", ":1802"], &[":0", ":99999", ":"]),
            part(&["\\", "/"], &["", "\\\\"]),
            part(
                &[
                    "private$\\orders",
                    "PRIVATE$/Q é 東;journal",
                    "orders\\journal$",
                    "orders;JOURNAL",
                    "SYSTEM$;deadletter",
                    "system$;DEADXACT",
                    "XactDeadletter$",
                ],
                &[
                    "x\\q",
                    "private$\\",
                    "SYSTEM$",
                    "q;deadletter",
                    " q",
                    "q\u{1}",
                    "journal$",
                    "q;",
                    "q;x",
                ],
            ),
            part(
                &["", ",.\\q", ",DIRECT=OS:h\\q"],
                &[",", ",DIRECT=OS:h\\q;JOURNAL"],
            ),
        )
            .prop_map(|(a, b, c, d, e, f, g)| [a, b, c, d, e, f, g].concat());
        prop_oneof![1 => free, 3 => shaped]
    }

    /// Flips the ASCII case of the characters selected by `mask` (cycled).
    fn flip_case(s: &str, mask: &[bool]) -> String {
        s.chars()
            .zip(mask.iter().cycle())
            .map(|(c, &flip)| {
                if !flip {
                    c
                } else if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    }

    /// Guards `parsed_soup_round_trips` against testing nothing: a fair share of the soup
    /// must parse.
    #[test]
    fn soup_often_parses() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = arb_soup();
        let total = 2000;
        let ok = (0..total)
            .filter(|_| {
                let s = strategy.new_tree(&mut runner).unwrap().current();
                FormatName::parse(&s).is_ok()
            })
            .count();
        assert!(ok * 20 > total, "only {ok} of {total} parsed");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn display_parse_round_trip(a in arb_address()) {
            let shown = a.to_string();
            prop_assert_eq!(FormatName::parse(&shown), Ok(FormatName::Single(a.clone())));
            prop_assert_eq!(shown.parse::<QueueAddress>(), Ok(a.clone()));
            prop_assert_eq!(a.path_name().parse::<QueueAddress>(), Ok(a.clone()));
            prop_assert_eq!(
                format!("FORMATNAME:{shown}").parse::<QueueAddress>(),
                Ok(a.clone())
            );
        }

        #[test]
        fn multi_round_trip(f in arb_multi()) {
            let shown = f.to_string();
            prop_assert!(shown.starts_with("FORMATNAME:"));
            prop_assert_eq!(FormatName::parse(&shown), Ok(f.clone()));
            // The prefix is optional.
            prop_assert_eq!(FormatName::parse(&shown["FORMATNAME:".len()..]), Ok(f.clone()));
        }

        #[test]
        fn subqueue_names_follow_the_rules(
            q in arb_queue_name(),
            sub in "\\PC{0,40}",
        ) {
            let name = format!(r".\private$\{q};{sub}");
            let chars = sub.chars().count();
            let ok = (1..=MAX_SUBQUEUE_NAME_LEN).contains(&chars)
                && !sub.chars().any(|c| c.is_control() || "\\/,;".contains(c))
                && valid_subqueue_name(&sub);
            match FormatName::parse(&name) {
                Ok(FormatName::Single(a)) => {
                    // Either a subqueue that keeps its name, or one of the three suffixes.
                    if a.kind == QueueKind::Subqueue {
                        prop_assert!(ok, "{name:?} parsed but breaks a rule");
                        prop_assert_eq!(&a.subqueue, &sub);
                        prop_assert_eq!(a.key(), format!(r"private$\{q};{sub}").to_lowercase());
                        prop_assert!(a.is_read_only());
                    } else {
                        prop_assert!(["journal"].iter().any(|r| r.eq_ignore_ascii_case(&sub)));
                    }
                }
                Ok(FormatName::Multi(_)) => prop_assert!(sub.contains(',')),
                Err(e) => prop_assert!(!ok, "{name:?} refused: {e}"),
            }
        }

        #[test]
        fn parse_never_panics(s in any::<String>()) {
            let _ = FormatName::parse(&s);
            let _ = s.parse::<QueueAddress>();
        }

        #[test]
        fn parse_never_panics_on_printable_unicode(s in "\\PC{0,200}") {
            let _ = FormatName::parse(&s);
        }

        #[test]
        fn parsed_soup_round_trips(s in arb_soup()) {
            match FormatName::parse(&s) {
                Ok(f) => prop_assert_eq!(FormatName::parse(&f.to_string()), Ok(f)),
                Err(e) => {
                    let quoted = format!("invalid queue name \"{}\": ", escape_controls(&s));
                    prop_assert!(e.to_string().starts_with(&quoted));
                    prop_assert!(!e.reason().is_empty());
                }
            }
        }

        #[test]
        fn slash_and_backslash_are_equivalent_prop(
            f in prop_oneof![arb_address().prop_map(FormatName::Single), arb_multi()],
            mask in proptest::collection::vec(any::<bool>(), 1..32),
        ) {
            let mut flips = mask.iter().cycle();
            let mixed: String = f
                .to_string()
                .chars()
                .map(|c| if c == '\\' && *flips.next().unwrap() { '/' } else { c })
                .collect();
            prop_assert_eq!(FormatName::parse(&mixed), Ok(f.clone()));
            prop_assert_eq!(FormatName::parse(&f.to_string().replace('\\', "/")), Ok(f));
        }

        #[test]
        fn keywords_are_case_insensitive_prop(
            f in prop_oneof![arb_address().prop_map(FormatName::Single), arb_multi()],
            mask in proptest::collection::vec(any::<bool>(), 1..32),
        ) {
            // Flip the case of anything, the queue names included; then everything but the
            // names must come back exactly, and the names up to case.
            let flipped = flip_case(&f.to_string(), &mask);
            let parsed = FormatName::parse(&flipped);
            prop_assert!(parsed.is_ok(), "{:?}: {:?}", flipped, parsed);
            let parsed = parsed.unwrap();
            prop_assert_eq!(parsed.addresses().len(), f.addresses().len());
            for (got, want) in parsed.addresses().iter().zip(f.addresses()) {
                prop_assert_eq!(got.key(), want.key());
                prop_assert_eq!(got.name.to_lowercase(), want.name.to_lowercase());
                let mut got = got.clone();
                got.name = want.name.clone();
                prop_assert_eq!(got.subqueue.to_lowercase(), want.subqueue.to_lowercase());
                got.subqueue = want.subqueue.clone();
                prop_assert_eq!(&got, want);
            }
        }
    }
}
