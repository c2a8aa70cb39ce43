//! The HTTP admin API under `/api/v1/` on the HTTP port (JSON): the gRPC port's identities, rights and one-line errors.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use mq_proto::limits::quote;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::{Auth, Identity, Presented, Right};
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::message::StoredMessage;
use crate::queue::{Entry, PeekCursor, Queue, QueueRole, Select};
use crate::ready::Readiness;

/// Messages on one page of a queue, when the caller does not say.
pub(crate) const DEFAULT_PAGE: usize = 50;
/// Messages on one page of a queue, at most (`?limit=`).
pub(crate) const MAX_PAGE: usize = 500;
/// Queues on one page of `GET /api/v1/queues` and `/api/v1/rates`, when the caller does not say.
pub(crate) const DEFAULT_QUEUE_PAGE: usize = 1000;
/// Queues on one page, at most (`?limit=`; the gRPC `ListQueues` has the same bound).
pub(crate) use crate::config::MAX_QUEUE_PAGE;
/// A request body (JSON or form), at most.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// A queue name, destination or other path segment, at most (bytes).
pub(crate) const MAX_NAME_BYTES: usize = mq_proto::limits::MAX_FORMAT_NAME_ELEMENT_BYTES;
/// Body bytes shown in a message's text, JSON or XML preview, at most.
pub(crate) const PREVIEW_BYTES: usize = 64 * 1024;
/// Body bytes shown in a hex preview, at most.
pub(crate) const HEX_PREVIEW_BYTES: usize = 4 * 1024;
/// Queues whose send/receive rates are kept for the charts, at most.
const MAX_RATE_QUEUES: usize = 1000;
/// Rate samples kept per queue (one a second at most: two minutes and more).
const RATE_SAMPLES: usize = 120;

/// What the API and the console share: the broker's readiness (and through it the broker and
/// the users) and the rate samples.
#[derive(Debug)]
pub(crate) struct Api {
    pub ready: Arc<Readiness>,
    rates: Mutex<Rates>,
    /// `GET /metrics` renders, shared and bounded.
    pub scrapes: crate::http::Scrapes,
    /// Signs the console's notices (`?msg=…&sig=…`); random for each process.
    notice_key: [u8; 32],
}

impl Api {
    pub(crate) fn new(ready: Arc<Readiness>) -> Arc<Api> {
        Arc::new(Api {
            ready,
            rates: Mutex::new(Rates::default()),
            scrapes: crate::http::Scrapes::default(),
            notice_key: {
                let mut k = [0u8; 32];
                k[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                k[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                k
            },
        })
    }

    fn notice_mac(&self, msg: &str) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.notice_key)
            .expect("HMAC takes a key of any length");
        mac.update(msg.as_bytes());
        mac
    }

    /// The signature of a console notice: HMAC-SHA-256 under this process's key, its first 16
    /// bytes in hex.
    pub(crate) fn notice_sig(&self, msg: &str) -> String {
        use hmac::Mac;
        self.notice_mac(msg).finalize().into_bytes()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `sig` (hex) is the signature of `msg`, compared in constant time.
    pub(crate) fn notice_signed(&self, msg: &str, sig: &str) -> bool {
        use hmac::Mac;
        let bytes: Option<Vec<u8>> = (sig.len() == 32)
            .then(|| {
                (0..16)
                    .map(|i| u8::from_str_radix(sig.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect()
            })
            .flatten();
        bytes.is_some_and(|b| self.notice_mac(msg).verify_truncated_left(&b).is_ok())
    }

    /// The broker, once recovered.
    pub(crate) fn broker(&self) -> Result<&Arc<Broker>, ApiError> {
        self.ready.check().map_err(|why| ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: format!("the broker is not ready: {why}"),
        })?;
        self.ready.broker().ok_or_else(|| ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: "the broker is not ready: recovering the journal".into(),
        })
    }

    pub(crate) fn auth(&self) -> Result<&Arc<Auth>, ApiError> {
        self.ready.auth().ok_or_else(|| ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: "the broker is not ready: recovering the journal".into(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An answer other than success: an HTTP status and `{"error": "<one line>", "code": "<gRPC
/// code name>"}`, the line the CLI prints for the same refusal.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub(crate) fn bad(message: String) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_argument",
            message,
        }
    }
}

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> ApiError {
        use tonic::Code;
        let (status, code) = match s.code() {
            Code::InvalidArgument | Code::OutOfRange => {
                (StatusCode::BAD_REQUEST, "invalid_argument")
            }
            Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Code::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
            Code::FailedPrecondition => (StatusCode::CONFLICT, "failed_precondition"),
            Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError {
            status,
            code,
            message: s.message().to_string(),
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> ApiError {
        tonic::Status::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"error": self.message, "code": self.code})),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"mq\", charset=\"UTF-8\""),
            );
        }
        r
    }
}

type ApiResult<T> = Result<T, ApiError>;

// ---------------------------------------------------------------------------------------------
// Who is asking

/// The caller's identity, established as on the gRPC port (HTTP Basic or a bearer token in
/// `Authorization`; none is anonymous). A POST, PUT or DELETE from another origin (a page of
/// another site the browser runs) is refused before anything else.
#[derive(Debug, Clone)]
pub(crate) struct Who(pub Identity);

impl FromRequestParts<Arc<Api>> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> ApiResult<Who> {
        same_origin(&parts.method, &parts.headers)?;
        Ok(Who(identify(api.auth()?, parts).await?))
    }
}

/// The identity a request's `Authorization` header establishes (anonymous without one).
pub(crate) async fn identify(auth: &Auth, parts: &Parts) -> ApiResult<Identity> {
    let peer = parts
        .extensions
        .get::<ConnectInfo<crate::http_tls::Peer>>()
        .map(|c| c.0 .0);
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().map(str::to_string).map_err(|_| ()));
    Ok(auth
        .authenticate(Presented {
            authorization,
            peer,
            cert_name: None,
            // The HTTP server has no Unix socket.
            local_uid: None,
        })
        .await?)
}

/// Refuses a state-changing request that a browser sent from a page of another origin
/// (cross-site request forgery with the browser's remembered Basic credentials).
fn same_origin(method: &Method, headers: &HeaderMap) -> ApiResult<()> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let forbidden = |why: String| ApiError {
        status: StatusCode::FORBIDDEN,
        code: "permission_denied",
        message: why,
    };
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return Err(forbidden(format!(
                "refusing a {method} from another site (Sec-Fetch-Site: {}); use the console's own pages or a script",
                quote(site)
            )));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or(origin);
        if origin_host != host {
            return Err(forbidden(format!(
                "refusing a {method} from origin \"{}\": only pages of this console ({}) may change things",
                quote(origin),
                quote(host)
            )));
        }
    }
    Ok(())
}

/// The local queue `name` names, if `who` holds `right` on it (as the gRPC service checks).
pub(crate) fn queue_for(
    api: &Api,
    who: &Identity,
    right: Right,
    name: &str,
) -> ApiResult<(Arc<Broker>, Arc<Queue>)> {
    check_name("queue name", name)?;
    let broker = api.broker()?.clone();
    let auth = api.auth()?;
    let allow = |q: &Arc<Queue>| auth.authorize(who, right, Some(q)).map_err(ApiError::from);
    // A peek is a GET (the console's and the API's message pages): it creates no subqueue
    // (helper-64: those GETs still opened 64 subqueues of a queue by image links).
    let q = if right == Right::Peek {
        broker.queue_seen(name, allow, |_| false)?
    } else {
        broker.queue_allowed(name, allow)?
    };
    Ok((broker, q))
}

/// Refuses an empty or over-long name before the broker sees it.
pub(crate) fn check_name(what: &str, s: &str) -> ApiResult<()> {
    if s.len() > MAX_NAME_BYTES {
        return Err(ApiError::bad(format!(
            "the {what} \"{}\" is {} bytes; the limit is {MAX_NAME_BYTES}",
            quote(s),
            s.len()
        )));
    }
    if s.trim().is_empty() {
        return Err(ApiError::bad(format!("the {what} is empty")));
    }
    Ok(())
}

/// A handler's caller: the API's state and who is asking ([`Who`], checked first).
pub(crate) struct Caller {
    pub api: Arc<Api>,
    pub who: Identity,
}

impl FromRequestParts<Arc<Api>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> ApiResult<Caller> {
        let Who(who) = Who::from_request_parts(parts, api).await?;
        Ok(Caller {
            api: api.clone(),
            who,
        })
    }
}

/// The path's parameters (`{name}`, `{id}`, …); malformed ones are refused as
/// `invalid_argument` with axum's line, quoted.
pub(crate) struct Args<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Args<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> ApiResult<Args<T>> {
        Path::<T>::from_request_parts(parts, s)
            .await
            .map(|Path(t)| Args(t))
            .map_err(|e| ApiError::bad(quote(&e.body_text())))
    }
}

/// The query string's parameters (`?after=…`), refused as [`Args`] are.
pub(crate) struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> ApiResult<Params<T>> {
        Query::<T>::from_request_parts(parts, s)
            .await
            .map(|Query(t)| Params(t))
            .map_err(|e| ApiError::bad(quote(&e.body_text())))
    }
}

/// Reads a JSON body of at most [`MAX_BODY_BYTES`].
async fn json_body<T: DeserializeOwned>(body: axum::body::Body) -> ApiResult<T> {
    let bytes = read_body(body).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad(format!(
            "the request body is not the JSON expected: {}",
            quote(&e.to_string())
        ))
    })
}

/// Reads a request body of at most [`MAX_BODY_BYTES`] (413 beyond).
pub(crate) async fn read_body(body: axum::body::Body) -> ApiResult<bytes::Bytes> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            // Over the limit, or the body did not come (the connection broke or timed out:
            // helper-64 saw a trickled body past --http-request-timeout told it was too big).
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "invalid_argument",
                    message: format!("the request body is over {MAX_BODY_BYTES} bytes (the limit)"),
                }
            } else {
                ApiError {
                    status: StatusCode::BAD_REQUEST,
                    code: "invalid_argument",
                    message: format!("the request body did not come whole: {e}"),
                }
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Operations, shared by the API and the console

/// A queue's kind as the API and console name it, `None` for queues they do not show
/// (outgoing: see `/api/v1/outgoing`; internal ones).
pub(crate) fn kind(q: &Queue) -> Option<&'static str> {
    match q.def().role {
        QueueRole::Normal if q.def().transactional => Some("transactional"),
        QueueRole::Normal => Some("queue"),
        QueueRole::DeadLetter | QueueRole::DeadXact => Some("dead-letter"),
        QueueRole::Subqueue => Some("subqueue"),
        _ => None,
    }
}

/// Paging the queue list: `?after=NEXT&limit=N`, where NEXT is the `next` of the page before.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueListQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// One page of the queues `who` may see (applications' queues, their subqueues and the
/// dead-letter queues), by name after `q.after` (a page's `next`, the canonical
/// lowercase name of its last queue): (queues, the next page's `after` if there are more).
pub(crate) fn visible_queue_page(
    api: &Api,
    who: &Identity,
    q: &QueueListQuery,
) -> ApiResult<(Vec<Arc<Queue>>, Option<String>)> {
    let limit = q.limit.unwrap_or(DEFAULT_QUEUE_PAGE);
    if limit == 0 || limit > MAX_QUEUE_PAGE {
        return Err(ApiError::bad(format!(
            "limit {limit} is out of range: a page has 1 to {MAX_QUEUE_PAGE} queues"
        )));
    }
    let after = q.after.as_deref().unwrap_or("");
    if !after.is_empty() {
        check_name("after", after)?;
    }
    let auth = api.auth()?;
    Ok(api
        .broker()?
        .page_of_queues(after, limit, |q| kind(q).is_some() && auth.sees(who, q)))
}

/// One queue as JSON, with its rates.
pub(crate) fn queue_json(q: &Queue, rates: Option<(f64, f64)>) -> Value {
    let i = q.info();
    let (send, receive) = rates.unwrap_or((0.0, 0.0));
    json!({
        "name": i.name,
        "format_name": i.format_name,
        "kind": kind(q).unwrap_or("queue"),
        "transactional": i.transactional,
        "messages": i.messages,
        "bytes": i.bytes,
        "in_flight": i.in_flight,
        "quota_bytes": i.quota_bytes,
        "quota_used": i.quota_bytes.filter(|&b| b > 0).map(|b| i.bytes as f64 / b as f64),
        "label": i.label,
        "created_ms": i.created_ms,
        "sent": i.sent,
        "received": i.received,
        "purged": i.purged,
        "dead_lettered": i.dead_lettered,
        "receive_aborts": i.receive_aborts,
        "poisoned": i.poisoned,
        "send_per_sec": round2(send),
        "receive_per_sec": round2(receive),
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The broker overview (`GET /api/v1/broker`).
pub(crate) fn overview(api: &Api) -> ApiResult<Value> {
    let b = api.broker()?;
    let info = crate::info::broker_info(b, Some(&api.ready));
    let j = b.journal().stats();
    let (p50, p99) = (
        quantile(&j.sync_seconds, 0.50),
        quantile(&j.sync_seconds, 0.99),
    );
    let (send, receive) = api.total_rates(b);
    Ok(json!({
        "name": info.name,
        "version": info.version,
        "protocol_version": info.protocol_version,
        "started_ms": info.started_ms,
        "uptime_ms": info.uptime_ms,
        "ready": info.ready,
        "listen": info.listen,
        "http_listen": info.http_listen,
        "data_dir": info.data_dir,
        "queues": info.queues,
        "messages": info.messages,
        "stored_bytes": info.stored_bytes,
        "storage_quota_bytes": info.storage_quota_bytes,
        "outgoing_queues": b.outgoing_list().len(),
        "journal": {
            "segments": info.journal_segments,
            "disk_bytes": info.journal_disk_bytes,
            "live_bytes": info.journal_live_bytes,
            "poisoned": info.journal_poisoned,
            "fsyncs": j.syncs,
            "fsync_p50_ms": p50.map(|s| round2(s * 1e3)),
            "fsync_p99_ms": p99.map(|s| round2(s * 1e3)),
        },
        "send_per_sec": round2(send),
        "receive_per_sec": round2(receive),
    }))
}

/// The `q` quantile of a histogram: the upper bound of the bucket it falls in (`None` before
/// the first observation; the largest finite bound for the overflow bucket).
fn quantile(h: &crate::histogram::HistogramSnapshot, q: f64) -> Option<f64> {
    if h.count == 0 {
        return None;
    }
    let want = (q * h.count as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    let mut last_finite = 0.0;
    for &(bound, n) in &h.buckets {
        if bound < f64::MAX {
            last_finite = bound;
        }
        seen += n;
        if seen >= want {
            return Some(if bound < f64::MAX { bound } else { last_finite });
        }
    }
    Some(last_finite)
}

/// A page cursor as the API shows it: `LANE-SEQ` (the `next` of the previous page).
pub(crate) fn cursor_text(c: PeekCursor) -> String {
    format!("{}-{}", c.lane, c.seq)
}

pub(crate) fn parse_cursor(s: &str) -> ApiResult<PeekCursor> {
    let bad = || {
        ApiError::bad(format!(
            "the cursor \"{}\" is not a page cursor (LANE-SEQ, the \"next\" of a previous page)",
            quote(s)
        ))
    };
    if s.len() > 24 {
        return Err(bad());
    }
    let (l, q) = s.split_once('-').ok_or_else(bad)?;
    let lane: u8 = l.parse().map_err(|_| bad())?;
    let seq: u64 = q.parse().map_err(|_| bad())?;
    if lane > 7 {
        return Err(bad());
    }
    Ok(PeekCursor { lane, seq })
}

pub(crate) fn parse_id(s: &str) -> ApiResult<uuid::Uuid> {
    uuid::Uuid::parse_str(s).map_err(|_| {
        ApiError::bad(format!(
            "\"{}\" is not a message id (a UUID such as 0190a5c4-...)",
            quote(s)
        ))
    })
}

/// Paging: `?after=LANE-SEQ&limit=N`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// One page of a queue's messages, without removing them: (entries, next cursor).
pub(crate) fn page(
    api: &Api,
    who: &Identity,
    name: &str,
    pq: &PageQuery,
) -> ApiResult<(Arc<Queue>, Vec<Entry>, Option<PeekCursor>)> {
    let limit = pq.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad(format!(
            "limit {limit} is out of range: a page has 1 to {MAX_PAGE} messages"
        )));
    }
    let after = match pq.after.as_deref() {
        None | Some("") => None,
        Some(s) => Some(parse_cursor(s)?),
    };
    let (_, q) = queue_for(api, who, Right::Peek, name)?;
    let (entries, next) = q.peek_page(after, limit, crate::config::PEEK_PAGE_BYTES)?;
    Ok((q, entries, next))
}

/// A message's summary (a row of a page; no body).
pub(crate) fn summary_json(q: &Queue, e: &Entry) -> Value {
    let m = &e.msg;
    json!({
        "id": m.id.to_string(),
        "at": cursor_text(q.position(e)),
        "label": m.label,
        "priority": m.priority,
        "body_bytes": m.body_len,
        "correlation_id": m.correlation_id,
        "sender": m.sender.as_deref().unwrap_or(""),
        "sent_time_ms": m.sent_time_ms,
        "arrived_time_ms": m.arrived_time_ms,
        "recoverable": m.delivery == crate::message::Delivery::Recoverable,
        "transactional": m.transactional,
        "abort_count": e.aborts,
        "dead_letter": dead_letter_json(m),
    })
}

fn dead_letter_json(m: &StoredMessage) -> Value {
    match &m.dead_letter {
        Some(d) => json!({
            "class": crate::deadletter::class_name(d.class),
            "reason": d.reason,
            "destination": d.destination,
            "time_ms": d.time_ms,
            "broker": d.broker,
        }),
        None => Value::Null,
    }
}

/// How to find a message: by its position (`at`, from a page; checked to hold that id) or by
/// id (the queue's index).
fn select(q: &Queue, id: uuid::Uuid, at: Option<&str>) -> ApiResult<Select> {
    if let Some(at) = at.filter(|s| !s.is_empty()) {
        let c = parse_cursor(at)?;
        if q.peek_by(&Select::At(c))?.is_some_and(|e| e.msg.id == id) {
            return Ok(Select::At(c));
        }
    }
    Ok(Select::Id(id))
}

/// One message with its properties and a body preview (`GET …/messages/{id}`).
pub(crate) fn message(
    api: &Api,
    who: &Identity,
    name: &str,
    id: &str,
    at: Option<&str>,
) -> ApiResult<(Arc<Queue>, Entry, crate::preview::Preview)> {
    let id = parse_id(id)?;
    let (broker, q) = queue_for(api, who, Right::Peek, name)?;
    let sel = select(&q, id, at)?;
    let e = q
        .peek_by(&sel)?
        .ok_or_else(|| crate::cursor::not_found(&q, &Select::Id(id)))?;
    let body = broker
        .peeked_body(&q, &e)?
        .ok_or_else(|| crate::cursor::not_found(&q, &Select::Id(id)))?;
    Ok((q, e, crate::preview::preview(&body)))
}

pub(crate) fn message_json(q: &Queue, e: &Entry, p: &crate::preview::Preview) -> Value {
    let m = &e.msg;
    let mut v = summary_json(q, e);
    let o = v.as_object_mut().expect("an object");
    o.insert("app_specific".into(), m.app_specific.into());
    o.insert("body_type".into(), m.body_type.into());
    o.insert("response_queue".into(), m.response_queue.clone().into());
    o.insert("receive_by_ms".into(), m.receive_by_ms.into());
    o.insert("reach_queue_by_ms".into(), m.reach_queue_by_ms.into());
    o.insert("move_count".into(), m.move_count.into());
    o.insert("queue".into(), q.def().name.clone().into());
    o.insert(
        "preview".into(),
        json!({
            "formatter": p.formatter,
            "text": p.text,
            "truncated": p.truncated,
        }),
    );
    v
}

/// Receives (removes) one message by id, as `mq receive --id` does.
pub(crate) async fn receive(
    api: &Api,
    who: &Identity,
    name: &str,
    id: &str,
    at: Option<&str>,
) -> ApiResult<mq_proto::v1::Message> {
    let id = parse_id(id)?;
    let (broker, q) = queue_for(api, who, Right::Receive, name)?;
    let sel = select(&q, id, at)?;
    let found = crate::service::wait_for(&broker, &q, 0, |q| {
        Ok(q.take_by(&sel)?.into_iter().collect())
    })
    .await?;
    if found.is_empty() {
        return Err(crate::cursor::not_found(&q, &Select::Id(id)).into());
    }
    let (message, taken) =
        crate::service::hand_out(crate::taken::Taken::new(&broker, &q, found)).await?;
    // The answer is built from here on without waiting: received.
    if let Some(taken) = taken {
        taken.keep();
    }
    message.ok_or_else(|| crate::cursor::not_found(&q, &Select::Id(id)).into())
}

/// Moves one message to `destination` (a subqueue, or out of a dead-letter queue: its original
/// destination for `""`), as `mq move` does.
pub(crate) async fn move_to(
    api: &Api,
    who: &Identity,
    name: &str,
    id: &str,
    destination: &str,
) -> ApiResult<mq_proto::v1::Message> {
    let id = parse_id(id)?;
    if destination.len() > MAX_NAME_BYTES {
        check_name("destination", destination)?;
    }
    let (broker, q) = queue_for(api, who, Right::Receive, name)?;
    let auth = api.auth()?.clone();
    let who2 = who.clone();
    let may_send = move |q: Option<&Arc<Queue>>| {
        auth.authorize(&who2, Right::Send, q.map(|q| &**q))
            .map_err(|s| BrokerError::PermissionDenied(s.message().to_string()))
    };
    Ok(broker.move_message(&q, id, destination, &may_send).await?)
}

/// Creation parameters (`POST /api/v1/queues`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateQueue {
    pub name: String,
    #[serde(default)]
    pub transactional: bool,
    pub quota_bytes: Option<u64>,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub max_aborts: u32,
}

pub(crate) async fn create(api: &Api, who: &Identity, c: CreateQueue) -> ApiResult<Arc<Queue>> {
    check_name("queue name", &c.name)?;
    let broker = api.broker()?;
    api.auth()?.authorize(who, Right::CreateQueue, None)?;
    Ok(broker
        .create_queue_with_acl(
            mq_proto::v1::CreateQueueRequest {
                name: c.name,
                transactional: c.transactional,
                quota_bytes: c.quota_bytes,
                label: c.label,
                max_aborts: c.max_aborts,
                ..Default::default()
            },
            crate::auth::Acl::for_creator(who),
        )
        .await?)
}

pub(crate) async fn purge(api: &Api, who: &Identity, name: &str) -> ApiResult<u64> {
    let (broker, q) = queue_for(api, who, Right::Admin, name)?;
    Ok(broker.purge(&q.def().name).await?)
}

pub(crate) async fn delete(api: &Api, who: &Identity, name: &str) -> ApiResult<()> {
    let (broker, _) = queue_for(api, who, Right::Admin, name)?;
    Ok(broker.delete_queue(name).await?)
}

/// The outgoing queues with their state, backlog and last error (`mq outgoing list`).
pub(crate) fn outgoing(api: &Api, who: &Identity) -> ApiResult<Vec<Value>> {
    let b = api.broker()?;
    api.auth()?.authorize_outgoing_list(who)?;
    let now = crate::message::now_ms();
    Ok(b.outgoing_details()
        .into_iter()
        .map(|(i, last_error_ms)| {
            let state = mq_proto::v1::OutgoingState::try_from(i.state)
                .unwrap_or(mq_proto::v1::OutgoingState::Unspecified);
            json!({
                "destination": i.destination,
                "state": outgoing_state_name(state),
                "messages": i.messages,
                "bytes": i.bytes,
                "in_flight": i.in_flight,
                "last_error": i.last_error,
                "last_error_ms": (last_error_ms > 0).then_some(last_error_ms),
                "last_error_age_ms": (last_error_ms > 0 && !i.last_error.is_empty()).then(|| now.saturating_sub(last_error_ms)),
                "next_retry_ms": (i.next_retry_ms > 0).then_some(i.next_retry_ms),
                "forwarded": i.forwarded,
                "dead_lettered": i.dead_lettered,
            })
        })
        .collect())
}

/// The state's name as `mq outgoing list` prints it.
pub(crate) fn outgoing_state_name(s: mq_proto::v1::OutgoingState) -> &'static str {
    use mq_proto::v1::OutgoingState as S;
    match s {
        S::Unspecified => "UNSPECIFIED",
        S::Inactive => "INACTIVE",
        S::Connecting => "CONNECTING",
        S::Connected => "CONNECTED",
        S::Waiting => "WAITING",
        S::Onhold => "ONHOLD",
    }
}

pub(crate) async fn set_paused(
    api: &Api,
    who: &Identity,
    destination: &str,
    paused: bool,
) -> ApiResult<()> {
    check_name("destination", destination)?;
    let b = api.broker()?;
    api.auth()?.authorize(who, Right::Outgoing, None)?;
    b.set_outgoing_paused(destination, paused).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Rates

#[derive(Debug, Default)]
struct Rates {
    last_ms: u64,
    /// Per queue key: (Unix ms, sent, received) samples, oldest first.
    series: HashMap<String, VecDeque<(u64, u64, u64)>>,
}

/// Samples closer together than this are not taken.
const SAMPLE_EVERY_MS: u64 = 900;
/// Rates are averaged over about this long.
const RATE_WINDOW_MS: u64 = 5_000;

impl Api {
    /// Takes a sample of every queue's counters, at most one a second (while someone looks:
    /// the console polls; no background task).
    pub(crate) fn sample(&self, broker: &Broker) {
        let now = crate::message::now_ms();
        let mut r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_sub(r.last_ms) < SAMPLE_EVERY_MS {
            return;
        }
        r.last_ms = now;
        let queues: Vec<_> = broker
            .all_queues()
            .into_iter()
            .filter(|q| kind(q).is_some())
            .collect();
        let keys: std::collections::HashSet<&str> =
            queues.iter().map(|q| q.def().key.as_str()).collect();
        r.series.retain(|k, _| keys.contains(k.as_str()));
        for q in &queues {
            let key = &q.def().key;
            if !r.series.contains_key(key) && r.series.len() >= MAX_RATE_QUEUES {
                continue;
            }
            let i = q.info();
            let s = r.series.entry(key.clone()).or_default();
            if s.len() >= RATE_SAMPLES {
                s.pop_front();
            }
            s.push_back((now, i.sent, i.received));
        }
    }

    /// (sent/s, received/s) of a queue over the last few seconds.
    pub(crate) fn rates_of(&self, q: &Queue) -> Option<(f64, f64)> {
        let r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        r.series.get(&q.def().key).and_then(window_rate)
    }

    fn total_rates(&self, b: &Broker) -> (f64, f64) {
        self.sample(b);
        let r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        r.series
            .values()
            .filter_map(window_rate)
            .fold((0.0, 0.0), |a, x| (a.0 + x.0, a.1 + x.1))
    }

    /// Per queue the rates between consecutive samples: `[[unix ms, sent/s, received/s], …]`.
    fn history(&self, keys: &[(String, String)]) -> Value {
        let r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = serde_json::Map::new();
        for (key, name) in keys {
            let Some(s) = r.series.get(key) else { continue };
            let pts: Vec<Value> = s
                .iter()
                .zip(s.iter().skip(1))
                .map(|(a, b)| {
                    let dt = (b.0.saturating_sub(a.0)).max(1) as f64 / 1e3;
                    json!([
                        b.0,
                        round2(b.1.saturating_sub(a.1) as f64 / dt),
                        round2(b.2.saturating_sub(a.2) as f64 / dt)
                    ])
                })
                .collect();
            out.insert(name.clone(), pts.into());
        }
        out.into()
    }
}

fn window_rate(s: &VecDeque<(u64, u64, u64)>) -> Option<(f64, f64)> {
    let last = s.back()?;
    let first = s
        .iter()
        .find(|x| last.0.saturating_sub(x.0) <= RATE_WINDOW_MS)
        .filter(|x| x.0 < last.0)?;
    let dt = (last.0 - first.0) as f64 / 1e3;
    Some((
        last.1.saturating_sub(first.1) as f64 / dt,
        last.2.saturating_sub(first.2) as f64 / dt,
    ))
}

// ---------------------------------------------------------------------------------------------
// Routes

/// The API's routes, to be merged into the HTTP port's router.
pub(crate) fn router(api: Arc<Api>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/broker", get(get_broker))
        .route("/api/v1/queues", get(get_queues).post(post_queue))
        .route("/api/v1/rates", get(get_rates))
        .route("/api/v1/queues/{name}", get(get_queue).delete(delete_queue))
        .route("/api/v1/queues/{name}/purge", post(post_purge))
        .route("/api/v1/queues/{name}/messages", get(get_messages))
        .route(
            "/api/v1/queues/{name}/messages/{id}",
            get(get_message).delete(delete_message),
        )
        .route(
            "/api/v1/queues/{name}/messages/{id}/receive",
            post(post_receive),
        )
        .route("/api/v1/queues/{name}/messages/{id}/move", post(post_move))
        .route(
            "/api/v1/queues/{name}/messages/{id}/replay",
            post(post_replay),
        )
        .route("/api/v1/deadletter", get(get_deadletter))
        .route("/api/v1/outgoing", get(get_outgoing))
        .route("/api/v1/outgoing/{destination}/pause", post(post_pause))
        .route("/api/v1/outgoing/{destination}/resume", post(post_resume))
        .route("/api/v1/{*rest}", axum::routing::any(no_such_endpoint))
        .method_not_allowed_fallback(wrong_method)
        .with_state(api)
}

/// 405 for a method an endpoint does not take, as JSON like every refusal (axum adds `Allow`).
async fn wrong_method(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: "unimplemented",
        message: format!(
            "the API endpoint {} takes no {method} (the Allow header names the methods it takes; see the README's \"HTTP API\" table)",
            quote(uri.path())
        ),
    }
}

async fn no_such_endpoint(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: format!(
            "there is no API endpoint {method} {} (see the README's \"HTTP API\" table)",
            quote(uri.path())
        ),
    }
}

/// A handler's JSON answer.
type Answer = ApiResult<Json<Value>>;

/// `{"<key>": v}`, the shape of most answers.
fn answer(key: &str, v: impl Into<Value>) -> Answer {
    let mut o = serde_json::Map::new();
    o.insert(key.into(), v.into());
    Ok(Json(o.into()))
}

async fn get_broker(c: Caller) -> Answer {
    if c.who.anonymous && c.api.auth()?.has_users() {
        // As GetBrokerInfo answers an anonymous caller: what a client checks, nothing more.
        let i = crate::info::public_broker_info(c.api.broker()?, Some(&c.api.ready));
        return Ok(Json(json!({
            "name": i.name,
            "version": i.version,
            "protocol_version": i.protocol_version,
            "ready": i.ready,
        })));
    }
    Ok(Json(overview(&c.api)?))
}

async fn get_queues(Caller { api, who }: Caller, Params(lq): Params<QueueListQuery>) -> Answer {
    api.sample(api.broker()?);
    let (page, next) = visible_queue_page(&api, &who, &lq)?;
    let queues: Vec<Value> = page
        .iter()
        .map(|q| queue_json(q, api.rates_of(q)))
        .collect();
    Ok(Json(json!({"queues": queues, "next": next})))
}

async fn get_rates(Caller { api, who }: Caller, Params(lq): Params<QueueListQuery>) -> Answer {
    api.sample(api.broker()?);
    let (page, next) = visible_queue_page(&api, &who, &lq)?;
    let keys: Vec<(String, String)> = page
        .iter()
        .map(|q| (q.def().key.clone(), q.def().name.clone()))
        .collect();
    Ok(Json(json!({"queues": api.history(&keys), "next": next})))
}

async fn post_queue(c: Caller, body: axum::body::Body) -> ApiResult<(StatusCode, Json<Value>)> {
    let q = create(&c.api, &c.who, json_body(body).await?).await?;
    Ok((StatusCode::CREATED, Json(queue_json(&q, None))))
}

async fn get_queue(Caller { api, who }: Caller, Args(name): Args<String>) -> Answer {
    check_name("queue name", &name)?;
    let auth = api.auth()?;
    let q = api.broker()?.queue_seen(
        &name,
        |q| {
            if auth.sees(&who, q) {
                return Ok(());
            }
            auth.authorize(&who, Right::Peek, Some(q))
                .map_err(ApiError::from)
        },
        // A GET creates nothing: with no users file (everyone a reader) another site's page
        // could make a browser open 64 subqueues of a queue by image links (a GET is not
        // checked for its origin; helper-63).
        |_| false,
    )?;
    Ok(Json(queue_json(&q, api.rates_of(&q))))
}

async fn delete_queue(c: Caller, Args(name): Args<String>) -> Answer {
    delete(&c.api, &c.who, &name).await?;
    answer("deleted", name)
}

async fn post_purge(c: Caller, Args(name): Args<String>) -> Answer {
    answer("purged", purge(&c.api, &c.who, &name).await?)
}

async fn get_messages(
    c: Caller,
    Args(name): Args<String>,
    Params(pq): Params<PageQuery>,
) -> Answer {
    let (q, entries, next) = page(&c.api, &c.who, &name, &pq)?;
    let messages: Vec<Value> = entries.iter().map(|e| summary_json(&q, e)).collect();
    Ok(Json(json!({
        "queue": q.def().name,
        "messages": messages,
        "next": next.map(cursor_text),
    })))
}

/// `?at=LANE-SEQ`: where the message was on its page (optional; faster than by id).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AtQuery {
    pub at: Option<String>,
}

async fn get_message(
    c: Caller,
    Args((name, id)): Args<(String, String)>,
    Params(at): Params<AtQuery>,
) -> Answer {
    let (q, e, p) = message(&c.api, &c.who, &name, &id, at.at.as_deref())?;
    Ok(Json(message_json(&q, &e, &p)))
}

fn moved_json(m: &mq_proto::v1::Message) -> Value {
    json!({
        "id": uuid::Uuid::from_slice(&m.id).map(|u| u.to_string()).unwrap_or_default(),
        "label": m.label,
        "destination": m.destination,
        "body_bytes": m.body.len(),
    })
}

/// [`moved_json`] of a move's answer, which carries no body: no `body_bytes` (it said 0 for
/// every message, helper-73).
fn moved_json_without_body(m: &mq_proto::v1::Message) -> Value {
    let mut v = moved_json(m);
    v.as_object_mut().expect("object").remove("body_bytes");
    v
}

async fn post_receive(
    c: Caller,
    Args((name, id)): Args<(String, String)>,
    Params(at): Params<AtQuery>,
) -> Answer {
    let m = receive(&c.api, &c.who, &name, &id, at.at.as_deref()).await?;
    let p = crate::preview::preview(&m.body);
    let mut v = moved_json(&m);
    v.as_object_mut().expect("object").insert(
        "preview".into(),
        json!({"formatter": p.formatter, "text": p.text, "truncated": p.truncated}),
    );
    answer("received", v)
}

async fn delete_message(
    c: Caller,
    Args((name, id)): Args<(String, String)>,
    Params(at): Params<AtQuery>,
) -> Answer {
    let m = receive(&c.api, &c.who, &name, &id, at.at.as_deref()).await?;
    answer("deleted", moved_json(&m))
}

/// `{"destination": "..."}` for a move.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveBody {
    pub destination: String,
}

async fn post_move(
    c: Caller,
    Args((name, id)): Args<(String, String)>,
    body: axum::body::Body,
) -> Answer {
    let b: MoveBody = json_body(body).await?;
    if b.destination.trim().is_empty() {
        return Err(ApiError::bad(
            "the destination is empty; to send a dead letter back where it was going use …/replay"
                .into(),
        ));
    }
    let m = move_to(&c.api, &c.who, &name, &id, &b.destination).await?;
    answer("moved", moved_json_without_body(&m))
}

async fn post_replay(c: Caller, Args((name, id)): Args<(String, String)>) -> Answer {
    let m = move_to(&c.api, &c.who, &name, &id, "").await?;
    answer("replayed", moved_json_without_body(&m))
}

/// Both dead-letter queues: their counts and a first page of messages each with class,
/// reason and original destination (more with `GET /api/v1/queues/{name}/messages`).
async fn get_deadletter(Caller { api, who }: Caller, Params(pq): Params<PageQuery>) -> Answer {
    let b = api.broker()?;
    let mut out = Vec::new();
    for transactional in [false, true] {
        let dlq = b.dead_letter_queue(transactional).clone();
        let (q, entries, next) = page(&api, &who, &dlq.def().name, &pq)?;
        let mut v = queue_json(&q, api.rates_of(&q));
        let o = v.as_object_mut().expect("object");
        o.insert(
            "messages_page".into(),
            entries.iter().map(|e| summary_json(&q, e)).collect(),
        );
        o.insert("next".into(), next.map(cursor_text).into());
        out.push(v);
    }
    answer("queues", out)
}

async fn get_outgoing(c: Caller) -> Answer {
    answer("outgoing", outgoing(&c.api, &c.who)?)
}

async fn post_pause(c: Caller, Args(d): Args<String>) -> Answer {
    set_paused(&c.api, &c.who, &d, true).await?;
    answer("paused", d)
}

async fn post_resume(c: Caller, Args(d): Args<String>) -> Answer {
    set_paused(&c.api, &c.who, &d, false).await?;
    answer("resumed", d)
}

impl Broker {
    /// Every outgoing queue with the Unix ms of its last error (0: none), by destination.
    pub(crate) fn outgoing_details(&self) -> Vec<(mq_proto::v1::OutgoingQueueInfo, u64)> {
        let mut v: Vec<_> = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|o| (o.info(), o.metrics().1))
            .collect();
        v.sort_by(|a, b| a.0.destination.cmp(&b.0.destination));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let c = PeekCursor { lane: 3, seq: 42 };
        assert_eq!(parse_cursor(&cursor_text(c)).unwrap(), c);
        for bad in ["", "3", "8-1", "a-1", "3-x", "3-99999999999999999999999"] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantiles_pick_the_bucket_bound() {
        let h = crate::histogram::HistogramSnapshot {
            sum: 0.0,
            count: 100,
            buckets: vec![(0.001, 90), (0.01, 9), (f64::MAX, 1)],
        };
        assert_eq!(quantile(&h, 0.5), Some(0.001));
        assert_eq!(quantile(&h, 0.99), Some(0.01));
        assert_eq!(quantile(&h, 1.0), Some(0.01));
        let empty = crate::histogram::HistogramSnapshot {
            sum: 0.0,
            count: 0,
            buckets: vec![],
        };
        assert_eq!(quantile(&empty, 0.5), None);
    }

    #[test]
    fn another_origin_may_not_post() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8180".parse().unwrap());
        h.insert(header::ORIGIN, "http://127.0.0.1:8180".parse().unwrap());
        assert!(same_origin(&Method::POST, &h).is_ok());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(same_origin(&Method::POST, &h).is_err());
        assert!(same_origin(&Method::GET, &h).is_ok());
        let mut h = HeaderMap::new();
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(same_origin(&Method::DELETE, &h).is_err());
    }
}
