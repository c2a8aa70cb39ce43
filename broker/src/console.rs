//! The web console at `/` on the HTTP port: server-side pages over the `http_api` operations, a little vendored JavaScript.

use std::sync::Arc;

use askama::Template;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use mq_proto::limits::quote;
use serde::Deserialize;

use crate::auth::{Identity, Right};
use crate::http_api::{self as api, Api, ApiError, Args, Caller, PageQuery, Params};
use crate::queue::{Entry, Queue, QueueRole};

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

pub(crate) fn router(api: Arc<Api>) -> axum::Router {
    axum::Router::new()
        .route("/", get(overview))
        .route("/queues", get(queues).post(create))
        .route("/queues/{name}", get(queue_page))
        .route("/queues/{name}/purge", post(purge))
        .route("/queues/{name}/delete", post(delete))
        .route("/queues/{name}/messages/{id}", get(message_page))
        .route(
            "/queues/{name}/messages/{id}/{action}",
            post(message_action),
        )
        .route("/deadletter", get(deadletter))
        .route("/outgoing", get(outgoing))
        .route("/outgoing/{destination}/{action}", post(outgoing_action))
        .route("/static/console.css", get(css))
        .route("/static/console.js", get(js))
        .layer(axum::extract::DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .with_state(api)
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        JS,
    )
}

// ---------------------------------------------------------------------------------------------
// Errors and helpers

/// An error shown as a page (the same line and status as the API's).
#[derive(Debug)]
struct PageError(ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    nav: Nav,
    status: u16,
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let e = self.0;
        let page = ErrorPage {
            nav: Nav::new("", None),
            status: e.status.as_u16(),
            code: e.code,
            message: &e.message,
        };
        let mut r = (e.status, Html(page.render().unwrap_or_default())).into_response();
        if e.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"mq\", charset=\"UTF-8\""),
            );
        }
        r
    }
}

type PageResult = Result<Response, PageError>;

fn html(t: impl Template) -> PageResult {
    let body = t.render().map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal",
        message: format!("cannot render the page: {e}"),
    })?;
    Ok(([(header::CACHE_CONTROL, "no-store")], Html(body)).into_response())
}

/// With a users file, a browser that gave no credentials is asked for them (401) instead of
/// being shown a console full of refusals.
fn login(api: &Api, who: &Identity) -> Result<(), ApiError> {
    if who.anonymous && api.auth()?.has_users() {
        return Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthenticated",
            message: "log in with a user of this broker's users file".into(),
        });
    }
    Ok(())
}

fn can(api: &Api, who: &Identity, right: Right, q: Option<&Queue>) -> bool {
    api.auth().is_ok_and(|a| a.allowed(who, right, q))
}

/// A path segment, percent-encoded (queue names hold `\`, `$`, `;`; destinations `:`).
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn queue_href(name: &str) -> String {
    format!("/queues/{}", enc(name))
}

fn bytes_text(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The last millisecond of year 9999: humantime (RFC 3339) cannot print a later time, and a
/// client may set `sent_time_ms` or a deadline anywhere in u64.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

fn time_text(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    if ms > LAST_RFC3339_MS {
        return format!("{ms} ms after 1970 (after the year 9999)");
    }
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_string()
}

fn age_text(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

fn rate_text(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The navigation bar: which page, who is logged in.
#[derive(Debug)]
struct Nav {
    active: &'static str,
    user: Option<String>,
    notice: Option<String>,
}

impl Nav {
    fn new(active: &'static str, who: Option<&Identity>) -> Nav {
        Nav {
            active,
            user: who.filter(|w| !w.anonymous).map(|w| w.name.to_string()),
            notice: None,
        }
    }

    fn with_notice(mut self, n: Option<String>) -> Nav {
        self.notice = n.filter(|s| !s.is_empty()).map(|s| quote(&s));
        self
    }

    fn class(&self, item: &str) -> &'static str {
        if self.active == item {
            "active"
        } else {
            ""
        }
    }
}

/// `?msg=…&sig=…` after an action (shown once, escaped, bounded). Only a notice this console
/// wrote is shown: `sig` is its HMAC under a key of this process, so a link from elsewhere
/// cannot put words in the console's mouth ("session expired, log in at …").
#[derive(Debug, Default, Deserialize)]
struct Notice {
    msg: Option<String>,
    sig: Option<String>,
}

impl Notice {
    fn verified(self, api: &Api) -> Option<String> {
        let (msg, sig) = (self.msg?, self.sig?);
        api.notice_signed(&msg, &sig).then_some(msg)
    }
}

/// Who looks at a page: the caller ([`Caller`]), logged in (see [`login`]), and the notice
/// of the action that led here (`?msg=`).
struct View {
    api: Arc<Api>,
    who: Identity,
    notice: Option<String>,
}

impl FromRequestParts<Arc<Api>> for View {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> Result<View, Response> {
        let Actor { api, who } = Actor::from_request_parts(parts, api).await?;
        let notice = Query::<Notice>::from_request_parts(parts, &api)
            .await
            .ok()
            .and_then(|Query(n)| n.verified(&api));
        Ok(View { api, who, notice })
    }
}

/// Who acts through a form: the caller ([`Caller`]), logged in (see [`login`]): with a users
/// file an anonymous form post is asked for credentials (401, which the browser answers by
/// asking for a login and sending the form again), not refused for lack of a right.
struct Actor {
    api: Arc<Api>,
    who: Identity,
}

impl FromRequestParts<Arc<Api>> for Actor {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> Result<Actor, Response> {
        let Caller { api, who } = Caller::from_request_parts(parts, api)
            .await
            .map_err(IntoResponse::into_response)?;
        login(&api, &who).map_err(|e| PageError(e).into_response())?;
        Ok(Actor { api, who })
    }
}

/// An extractor of the API ([`Args`], [`Params`]) whose refusal is shown as a page.
struct AsPage<X>(X);

impl<X: FromRequestParts<S, Rejection = ApiError>, S: Send + Sync> FromRequestParts<S>
    for AsPage<X>
{
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> Result<AsPage<X>, PageError> {
        Ok(AsPage(X::from_request_parts(parts, s).await?))
    }
}

fn redirect(api: &Api, to: &str, msg: &str) -> PageResult {
    let sep = if to.contains('?') { '&' } else { '?' };
    let msg = quote(msg);
    let target = format!("{to}{sep}msg={}&sig={}", enc(&msg), api.notice_sig(&msg));
    Ok(Redirect::to(&target).into_response())
}

/// Where to go back to after an action: a path of this console only.
fn back(ret: Option<&str>, default: &str) -> String {
    match ret {
        Some(r)
            if r.starts_with('/')
                && !r.starts_with("//")
                && r.len() <= 4096
                && !r.contains('\\')
                && !r.chars().any(|c| c.is_control() || c.is_whitespace()) =>
        {
            // The notice of the page before, not a `msg=` or `sig=` inside a queue's name.
            let cut = ["?msg=", "&msg=", "?sig=", "&sig="]
                .iter()
                .filter_map(|p| r.find(p))
                .min()
                .unwrap_or(r.len());
            r[..cut].trim_end_matches(['?', '&']).to_string()
        }
        _ => default.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Overview

#[derive(Debug)]
struct RateRow {
    name: String,
    href: String,
    kind: &'static str,
    messages: u64,
    send: String,
    receive: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    nav: Nav,
    /// More queues than the rows: the rest are on the Queues page.
    more: bool,
    /// The rows' page of the API's queue list.
    limit: usize,
    name: String,
    version: String,
    uptime: String,
    ready: bool,
    queues: u64,
    messages: u64,
    stored: String,
    quota: String,
    outgoing: u64,
    segments: u64,
    disk: String,
    live: String,
    fsync_p50: String,
    fsync_p99: String,
    fsyncs: u64,
    poisoned: bool,
    send: String,
    receive: String,
    rows: Vec<RateRow>,
}

async fn overview(View { api, who, notice }: View) -> PageResult {
    let b = api.broker()?;
    api.sample(b);
    let o = api::overview(&api)?;
    let j = &o["journal"];
    let ms = |v: &serde_json::Value| {
        v.as_f64()
            .map_or_else(|| "-".to_string(), |x| format!("{x} ms"))
    };
    let (page, next) = api::visible_queue_page(
        &api,
        &who,
        &api::QueueListQuery {
            after: None,
            limit: Some(OVERVIEW_ROWS),
        },
    )?;
    let rows = page
        .iter()
        .map(|q| {
            let (s, r) = api.rates_of(q).unwrap_or((0.0, 0.0));
            let i = q.info();
            RateRow {
                href: queue_href(&i.name),
                name: i.name,
                kind: api::kind(q).unwrap_or("queue"),
                messages: i.messages,
                send: rate_text(s),
                receive: rate_text(r),
            }
        })
        .collect();
    html(OverviewPage {
        more: next.is_some(),
        limit: OVERVIEW_ROWS,
        nav: Nav::new("overview", Some(&who)).with_notice(notice),
        name: o["name"].as_str().unwrap_or("").into(),
        version: o["version"].as_str().unwrap_or("").into(),
        uptime: age_text(o["uptime_ms"].as_u64().unwrap_or(0)),
        ready: o["ready"].as_bool().unwrap_or(false),
        queues: o["queues"].as_u64().unwrap_or(0),
        messages: o["messages"].as_u64().unwrap_or(0),
        stored: bytes_text(o["stored_bytes"].as_u64().unwrap_or(0)),
        quota: bytes_text(o["storage_quota_bytes"].as_u64().unwrap_or(0)),
        outgoing: o["outgoing_queues"].as_u64().unwrap_or(0),
        segments: j["segments"].as_u64().unwrap_or(0),
        disk: bytes_text(j["disk_bytes"].as_u64().unwrap_or(0)),
        live: bytes_text(j["live_bytes"].as_u64().unwrap_or(0)),
        fsync_p50: ms(&j["fsync_p50_ms"]),
        fsync_p99: ms(&j["fsync_p99_ms"]),
        fsyncs: j["fsyncs"].as_u64().unwrap_or(0),
        poisoned: j["poisoned"].as_bool().unwrap_or(false),
        send: rate_text(o["send_per_sec"].as_f64().unwrap_or(0.0)),
        receive: rate_text(o["receive_per_sec"].as_f64().unwrap_or(0.0)),
        rows,
    })
}

// ---------------------------------------------------------------------------------------------
// Queues

#[derive(Debug)]
struct QueueRow {
    name: String,
    href: String,
    kind: &'static str,
    messages: u64,
    bytes: u64,
    bytes_text: String,
    in_flight: u64,
    send: String,
    receive: String,
    quota: String,
    quota_pct: f64,
    can_purge: bool,
    can_delete: bool,
}

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    nav: Nav,
    rows: Vec<QueueRow>,
    can_create: bool,
    /// This page's `after` and `limit` (what its live updates ask the API for).
    query: String,
    /// The next page, if there are more queues; the first, if this is not it.
    next_href: Option<String>,
    first_href: Option<String>,
}

/// Queues on the overview (the first ones by name; the Queues page has them all, in pages).
const OVERVIEW_ROWS: usize = 100;
/// Queues on one page of the Queues page.
const QUEUES_PAGE_ROWS: usize = 500;

async fn queues(
    View { api, who, notice }: View,
    AsPage(Params(qq)): AsPage<Params<QueuePageQuery>>,
) -> PageResult {
    let b = api.broker()?;
    api.sample(b);
    let lq = api::QueueListQuery {
        after: qq.after.filter(|a| !a.is_empty()),
        // At most a page of the size the page is made for: ?limit=10000 built 8.9 MB of HTML
        // per request (helper-63).
        limit: Some(qq.limit.unwrap_or(QUEUES_PAGE_ROWS).min(QUEUES_PAGE_ROWS)),
    };
    let (page, next) = api::visible_queue_page(&api, &who, &lq)?;
    let limit = lq.limit.unwrap_or(QUEUES_PAGE_ROWS);
    let query = match &lq.after {
        Some(a) => format!("after={}&limit={limit}", enc(a)),
        None => format!("limit={limit}"),
    };
    let next_href = next.map(|n| format!("/queues?after={}&limit={limit}", enc(&n)));
    let first_href = lq.after.is_some().then(|| format!("/queues?limit={limit}"));
    let rows = page
        .iter()
        .map(|q| {
            let i = q.info();
            let (s, r) = api.rates_of(q).unwrap_or((0.0, 0.0));
            let admin = can(&api, &who, Right::Admin, Some(q));
            let quota_pct = i
                .quota_bytes
                .filter(|&b| b > 0)
                .map_or(0.0, |b| 100.0 * i.bytes as f64 / b as f64);
            QueueRow {
                href: queue_href(&i.name),
                kind: api::kind(q).unwrap_or("queue"),
                messages: i.messages,
                bytes: i.bytes,
                bytes_text: bytes_text(i.bytes),
                in_flight: i.in_flight,
                send: rate_text(s),
                receive: rate_text(r),
                quota: match i.quota_bytes {
                    Some(b) if b > 0 => format!("{quota_pct:.1}% of {}", bytes_text(b)),
                    _ => "-".into(),
                },
                quota_pct,
                can_purge: admin,
                can_delete: admin && q.def().role == QueueRole::Normal,
                name: i.name,
            }
        })
        .collect();
    html(QueuesPage {
        nav: Nav::new("queues", Some(&who)).with_notice(notice),
        rows,
        can_create: can(&api, &who, Right::CreateQueue, None),
        query,
        next_href,
        first_href,
    })
}

#[derive(Debug, Deserialize)]
struct CreateForm {
    name: String,
    #[serde(default)]
    transactional: Option<String>,
    #[serde(default)]
    quota_mib: String,
    #[serde(default)]
    label: String,
}

async fn create(
    Actor { api, who }: Actor,
    f: Result<Form<CreateForm>, FormRejection>,
) -> PageResult {
    let Form(f) = f.map_err(form_refused)?;
    let quota_bytes = match f.quota_mib.trim() {
        "" => None,
        s => Some(
            s.parse::<u64>()
                .ok()
                .and_then(|m| m.checked_mul(1024 * 1024))
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "the quota \"{}\" is not a whole number of MiB",
                        quote(s)
                    ))
                })?,
        ),
    };
    let q = api::create(
        &api,
        &who,
        api::CreateQueue {
            name: f.name.trim().to_string(),
            transactional: f.transactional.is_some(),
            quota_bytes,
            label: f.label,
            max_aborts: 0,
        },
    )
    .await?;
    redirect(&api, "/queues", &format!("created {}", q.def().name))
}

#[derive(Debug, Default, Deserialize)]
struct ReturnForm {
    #[serde(rename = "return")]
    ret: Option<String>,
    #[serde(default)]
    destination: String,
}

/// A form that could not be read: 413 for one over the body limit (as the API answers), else
/// 400 with axum's line.
fn form_refused(e: FormRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "invalid_argument",
            message: format!("the form is over {} bytes (the limit)", api::MAX_BODY_BYTES),
        };
    }
    ApiError::bad(quote(&e.body_text()))
}

fn form(f: Result<Form<ReturnForm>, FormRejection>) -> Result<ReturnForm, ApiError> {
    f.map(|Form(f)| f).map_err(form_refused)
}

async fn purge(
    Actor { api, who }: Actor,
    AsPage(Args(name)): AsPage<Args<String>>,
    f: Result<Form<ReturnForm>, FormRejection>,
) -> PageResult {
    let f = form(f)?;
    let n = api::purge(&api, &who, &name).await?;
    redirect(
        &api,
        &back(f.ret.as_deref(), "/queues"),
        &format!("purged {n} messages from {name}"),
    )
}

async fn delete(Actor { api, who }: Actor, AsPage(Args(name)): AsPage<Args<String>>) -> PageResult {
    api::delete(&api, &who, &name).await?;
    redirect(&api, "/queues", &format!("deleted {name}"))
}

// ---------------------------------------------------------------------------------------------
// A queue's messages

#[derive(Debug)]
struct MessageRow {
    id: String,
    href: String,
    action_base: String,
    at: String,
    label: String,
    priority: u8,
    size: String,
    sent: String,
    arrived: String,
    correlation_id: String,
    sender: String,
    class: String,
    reason: String,
    original: String,
}

fn message_row(q: &Queue, e: &Entry) -> MessageRow {
    let m = &e.msg;
    let at = api::cursor_text(q.position(e));
    let (class, reason, original) = match &m.dead_letter {
        Some(d) => (
            crate::deadletter::class_name(d.class).to_string(),
            d.reason.clone(),
            d.destination.clone(),
        ),
        None => Default::default(),
    };
    MessageRow {
        id: m.id.to_string(),
        href: format!("{}/messages/{}?at={at}", queue_href(&q.def().name), m.id),
        action_base: format!("{}/messages/{}", queue_href(&q.def().name), m.id),
        at,
        label: m.label.clone(),
        priority: m.priority,
        size: bytes_text(u64::from(m.body_len)),
        sent: time_text(m.sent_time_ms),
        arrived: time_text(m.arrived_time_ms),
        correlation_id: m.correlation_id.clone(),
        sender: m.sender.as_deref().unwrap_or("").to_string(),
        class,
        reason,
        original,
    }
}

fn is_dead_letter(q: &Queue) -> bool {
    matches!(q.def().role, QueueRole::DeadLetter | QueueRole::DeadXact)
}

/// The navigation item a queue's pages belong to.
fn section(q: &Queue) -> &'static str {
    if is_dead_letter(q) {
        "deadletter"
    } else {
        "queues"
    }
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    nav: Nav,
    name: String,
    href: String,
    kind: &'static str,
    messages: u64,
    bytes: String,
    in_flight: u64,
    totals: TotalsView,
    rows: Vec<MessageRow>,
    next: Option<String>,
    first_page: bool,
    limit: usize,
    dead_letter: bool,
    can_receive: bool,
    can_purge: bool,
    this_page: String,
}

/// A queue's totals on its page (kept across restarts, as `mq queue info` shows them).
#[derive(Debug)]
struct TotalsView {
    sent: u64,
    received: u64,
    purged: u64,
    dead_lettered: u64,
    receive_aborts: u64,
    poisoned: u64,
}

/// A page's query, on the Queues page and a queue's page: `?after=…&limit=…` (a notice's
/// `msg` and `sig` are read by [`View`]).
#[derive(Debug, Default, Deserialize)]
struct QueuePageQuery {
    after: Option<String>,
    limit: Option<usize>,
}

async fn queue_page(
    View { api, who, notice }: View,
    AsPage(Args(name)): AsPage<Args<String>>,
    AsPage(Params(qq)): AsPage<Params<QueuePageQuery>>,
) -> PageResult {
    let pq = PageQuery {
        after: qq.after.clone(),
        limit: qq.limit,
    };
    let (q, entries, next) = api::page(&api, &who, &name, &pq)?;
    let i = q.info();
    let href = queue_href(&i.name);
    let limit = pq.limit.unwrap_or(api::DEFAULT_PAGE);
    let mut this_page = href.clone();
    if let Some(a) = qq.after.as_deref().filter(|a| !a.is_empty()) {
        this_page = format!("{href}?after={}&limit={limit}", enc(a));
    }
    html(QueuePage {
        nav: Nav::new(section(&q), Some(&who)).with_notice(notice),
        kind: api::kind(&q).unwrap_or("queue"),
        messages: i.messages,
        bytes: bytes_text(i.bytes),
        in_flight: i.in_flight,
        totals: TotalsView {
            sent: i.sent,
            received: i.received,
            purged: i.purged,
            dead_lettered: i.dead_lettered,
            receive_aborts: i.receive_aborts,
            poisoned: i.poisoned,
        },
        rows: entries.iter().map(|e| message_row(&q, e)).collect(),
        next: next.map(|c| format!("{href}?after={}&limit={limit}", api::cursor_text(c))),
        first_page: qq.after.as_deref().unwrap_or("").is_empty(),
        limit,
        dead_letter: is_dead_letter(&q),
        can_receive: can(&api, &who, Right::Receive, Some(&q)),
        can_purge: can(&api, &who, Right::Admin, Some(&q)),
        this_page,
        href,
        name: i.name,
    })
}

#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage {
    nav: Nav,
    queue: String,
    queue_href: String,
    action_base: String,
    at: String,
    props: Vec<(&'static str, String)>,
    formatter: &'static str,
    preview: String,
    truncated: bool,
    body_bytes: u32,
    dead_letter: bool,
    can_receive: bool,
    can_move: bool,
}

async fn message_page(
    View { api, who, .. }: View,
    AsPage(Args((name, id))): AsPage<Args<(String, String)>>,
    AsPage(Params(at)): AsPage<Params<api::AtQuery>>,
) -> PageResult {
    let (q, e, p) = api::message(&api, &who, &name, &id, at.at.as_deref())?;
    let m = &e.msg;
    let mut props: Vec<(&'static str, String)> = vec![
        ("Id", m.id.to_string()),
        ("Label", m.label.clone()),
        ("Priority", m.priority.to_string()),
        ("Body size", bytes_text(u64::from(m.body_len))),
        ("Body type", m.body_type.to_string()),
        (
            "Delivery",
            if m.delivery == crate::message::Delivery::Recoverable {
                "recoverable".into()
            } else {
                "express".into()
            },
        ),
        ("Transactional", m.transactional.to_string()),
        ("Correlation id", m.correlation_id.clone()),
        ("App specific", m.app_specific.to_string()),
        ("Sender", m.sender.as_deref().unwrap_or("").to_string()),
        ("Response queue", m.response_queue.clone()),
        ("Sent", time_text(m.sent_time_ms)),
        ("Arrived", time_text(m.arrived_time_ms)),
        ("Receive by", time_text(m.receive_by_ms)),
        ("Abort count", e.aborts.to_string()),
        ("Move count", m.move_count.to_string()),
    ];
    if let Some(d) = &m.dead_letter {
        props.push((
            "Dead-letter class",
            crate::deadletter::class_name(d.class).to_string(),
        ));
        props.push(("Reason", d.reason.clone()));
        props.push(("Original destination", d.destination.clone()));
        props.push(("Dead-lettered", time_text(d.time_ms)));
        props.push(("By broker", d.broker.clone()));
    }
    let qhref = queue_href(&q.def().name);
    html(MessagePage {
        nav: Nav::new(section(&q), Some(&who)),
        queue: q.def().name.clone(),
        action_base: format!("{qhref}/messages/{}", m.id),
        queue_href: qhref,
        at: api::cursor_text(q.position(&e)),
        props,
        formatter: p.formatter,
        preview: p.text,
        truncated: p.truncated,
        body_bytes: m.body_len,
        dead_letter: is_dead_letter(&q),
        can_receive: can(&api, &who, Right::Receive, Some(&q)),
        can_move: can(&api, &who, Right::Receive, Some(&q)) && q.def().role != QueueRole::Subqueue
            || is_dead_letter(&q),
    })
}

#[derive(Debug, Default, Deserialize)]
struct ActionQuery {
    at: Option<String>,
}

async fn message_action(
    Actor { api, who }: Actor,
    AsPage(Args((name, id, action))): AsPage<Args<(String, String, String)>>,
    q: Result<Query<ActionQuery>, QueryRejection>,
    f: Result<Form<ReturnForm>, FormRejection>,
) -> PageResult {
    let at = q.ok().and_then(|Query(a)| a.at);
    let f = form(f)?;
    let ret = back(f.ret.as_deref(), &queue_href(&name));
    let what = match action.as_str() {
        "receive" | "delete" => {
            let m = api::receive(&api, &who, &name, &id, at.as_deref()).await?;
            format!(
                "{} message {id} ({} bytes) from {name}",
                if action == "receive" {
                    "received"
                } else {
                    "deleted"
                },
                m.body.len()
            )
        }
        "replay" => {
            let m = api::move_to(&api, &who, &name, &id, "").await?;
            format!("replayed message {id} to {}", m.destination)
        }
        "move" => {
            if f.destination.trim().is_empty() {
                return Err(
                    ApiError::bad("give the destination to move the message to".into()).into(),
                );
            }
            let m = api::move_to(&api, &who, &name, &id, f.destination.trim()).await?;
            format!("moved message {id} to {}", m.destination)
        }
        other => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                message: format!(
                    "there is no message action \"{}\" (receive, delete, replay, move)",
                    quote(other)
                ),
            }
            .into())
        }
    };
    redirect(&api, &ret, &what)
}

// ---------------------------------------------------------------------------------------------
// Dead letters

#[derive(Debug)]
struct DeadLetterSection {
    name: String,
    href: String,
    messages: u64,
    rows: Vec<MessageRow>,
    more: bool,
    can_act: bool,
}

#[derive(Template)]
#[template(path = "deadletter.html")]
struct DeadLetterPage {
    nav: Nav,
    sections: Vec<DeadLetterSection>,
}

async fn deadletter(View { api, who, notice }: View) -> PageResult {
    let b = api.broker()?.clone();
    let mut sections = Vec::new();
    for transactional in [false, true] {
        let dlq = b.dead_letter_queue(transactional).clone();
        let (q, entries, next) = api::page(&api, &who, &dlq.def().name, &PageQuery::default())?;
        sections.push(DeadLetterSection {
            name: q.def().name.clone(),
            href: queue_href(&q.def().name),
            messages: q.info().messages,
            rows: entries.iter().map(|e| message_row(&q, e)).collect(),
            more: next.is_some(),
            can_act: can(&api, &who, Right::Receive, Some(&q)),
        });
    }
    html(DeadLetterPage {
        nav: Nav::new("deadletter", Some(&who)).with_notice(notice),
        sections,
    })
}

// ---------------------------------------------------------------------------------------------
// Outgoing queues

#[derive(Debug)]
struct OutgoingRow {
    destination: String,
    action_base: String,
    state: String,
    paused: bool,
    messages: u64,
    bytes: String,
    in_flight: u64,
    last_error: String,
    error_age: String,
    next_retry: String,
    forwarded: u64,
    dead_lettered: u64,
}

#[derive(Template)]
#[template(path = "outgoing.html")]
struct OutgoingPage {
    nav: Nav,
    rows: Vec<OutgoingRow>,
    /// Pause and resume need `outgoing`; `monitor` only looks.
    can_act: bool,
}

async fn outgoing(View { api, who, notice }: View) -> PageResult {
    let rows = api::outgoing(&api, &who)?
        .into_iter()
        .map(|o| {
            let dest = o["destination"].as_str().unwrap_or("").to_string();
            let state = o["state"].as_str().unwrap_or("").to_string();
            let now = crate::message::now_ms();
            OutgoingRow {
                action_base: format!("/outgoing/{}", enc(&dest)),
                destination: dest,
                paused: state == "ONHOLD",
                state,
                messages: o["messages"].as_u64().unwrap_or(0),
                bytes: bytes_text(o["bytes"].as_u64().unwrap_or(0)),
                in_flight: o["in_flight"].as_u64().unwrap_or(0),
                last_error: o["last_error"].as_str().unwrap_or("").to_string(),
                error_age: o["last_error_age_ms"]
                    .as_u64()
                    .map_or_else(String::new, |a| format!("{} ago", age_text(a))),
                next_retry: o["next_retry_ms"].as_u64().map_or_else(
                    || "-".to_string(),
                    |t| format!("in {}", age_text(t.saturating_sub(now))),
                ),
                forwarded: o["forwarded"].as_u64().unwrap_or(0),
                dead_lettered: o["dead_lettered"].as_u64().unwrap_or(0),
            }
        })
        .collect();
    html(OutgoingPage {
        can_act: can(&api, &who, Right::Outgoing, None),
        nav: Nav::new("outgoing", Some(&who)).with_notice(notice),
        rows,
    })
}

async fn outgoing_action(
    Actor { api, who }: Actor,
    AsPage(Args((dest, action))): AsPage<Args<(String, String)>>,
) -> PageResult {
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        other => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                message: format!(
                    "there is no outgoing action \"{}\" (pause, resume)",
                    quote(other)
                ),
            }
            .into())
        }
    };
    api::set_paused(&api, &who, &dest, paused).await?;
    redirect(
        &api,
        "/outgoing",
        &format!(
            "{} the outgoing queue to {dest}",
            if paused { "paused" } else { "resumed" }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_for_paths() {
        assert_eq!(enc(r".\private$\orders"), ".%5Cprivate%24%5Corders");
        assert_eq!(enc("h:1801"), "h%3A1801");
    }

    #[test]
    fn back_goes_to_console_paths_only() {
        assert_eq!(back(Some("/queues/x?msg=hi"), "/d"), "/queues/x");
        assert_eq!(back(Some("/queues/x?msg=hi&sig=ab"), "/d"), "/queues/x");
        assert_eq!(
            back(Some("/queues/x?after=1&sig=ab&msg=hi"), "/d"),
            "/queues/x?after=1"
        );
        assert_eq!(
            back(Some("/queues/msg=sig=?msg=hi"), "/d"),
            "/queues/msg=sig="
        );
        assert_eq!(back(Some("//evil.example/"), "/d"), "/d");
        assert_eq!(back(Some("https://evil.example/"), "/d"), "/d");
        assert_eq!(back(None, "/d"), "/d");
        // Browsers drop a tab or a line break inside a URL: "/\t/evil" would go to //evil.
        assert_eq!(back(Some("/\t/evil.example/"), "/d"), "/d");
        assert_eq!(back(Some("/ /evil.example/"), "/d"), "/d");
    }

    /// A client may set a time anywhere in u64; the page shows it rather than failing (humantime
    /// cannot print a year after 9999, and `to_string` panicked on its error).
    #[test]
    fn times_after_the_year_9999_are_shown_as_numbers() {
        assert_eq!(time_text(0), "-");
        assert_eq!(time_text(LAST_RFC3339_MS), "9999-12-31 23:59:59");
        assert!(time_text(u64::MAX).contains("after the year 9999"));
        assert!(time_text(LAST_RFC3339_MS + 1).contains("after the year 9999"));
    }

    #[test]
    fn sizes_and_ages_read_well() {
        assert_eq!(bytes_text(10), "10 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(age_text(61_000), "1m 1s");
    }
}
