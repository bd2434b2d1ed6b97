//! `gpucollect serve`: hosts the viewer, accepts trace uploads and serves shared traces, so a
//! team passes around links instead of files. The HTTP API is versioned and documented in
//! `API.md`. Everything from the network is untrusted: ids are validated, uploads are decoded
//! as they stream in and refused unless they are traces, and every response carries security
//! headers (CSP with explicit `frame-ancestors` and `connect-src` allow-lists, `nosniff`, no
//! referrer).
//!
//! Every byte costs a bounded amount: connections are served by hyper's HTTP/1.1 connection
//! builder from our own accept loop (`serve`), which caps connections per client and in total
//! and times out request headers; uploads are capped per client and in total, time out when
//! idle or too long, and are decoded on the blocking pool (see `limits.rs` and `store.rs`).

pub mod ids;
pub mod limits;
pub mod store;
pub mod summaries;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use analysis_core::synth::{Scenario, generate};
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::assets::Assets;
use ids::TraceId;
use limits::{ClientKey, Limits, Refused, Slots};
use store::{Store, UploadError};

/// Everything the server needs, resolved from the command line before it starts.
#[derive(Debug)]
pub struct ServerConfig {
    pub store: Store,
    pub assets: Assets,
    pub max_upload_bytes: u64,
    pub upload_token: Option<String>,
    pub read_token: Option<String>,
    /// Origins allowed to embed pages in iframes (besides this server).
    pub frame_ancestors: Vec<String>,
    /// Origins the viewer may download a `?trace=` URL from (besides this server): the CSP's
    /// `connect-src`.
    pub trace_origins: Vec<String>,
    pub max_age: Option<Duration>,
    pub max_store_bytes: Option<u64>,
    /// Approximate events per bundled demo trace.
    pub demo_events: u64,
    pub limits: Limits,
    /// Memory the cache of trace summaries may take (each kept summary its model's heap and
    /// report; one being made its trace's size times
    /// [`summaries::PEAK_BYTES_PER_TRACE_BYTE`]).
    pub summary_memory_bytes: u64,
}

struct AppState {
    cfg: ServerConfig,
    csp: HeaderValue,
    demos: Vec<(Scenario, bytes::Bytes)>,
    uploads: Arc<Slots>,
    /// Held while a retention pass runs: one pass at a time.
    retention: Arc<tokio::sync::Mutex<()>>,
    /// A pass was asked for while one ran: run another when it ends.
    retention_again: AtomicBool,
    summaries: summaries::Summaries,
}

/// The client's address, put on every request by the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub IpAddr);

type Shared = Arc<AppState>;

/// A JSON error response: `{"error": "..."}`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() });
    (status, axum::Json(body)).into_response()
}

/// Compares secrets in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Why a browser request to upload comes from another site, if it does. Browsers send
/// `Sec-Fetch-Site` and `Origin` with every POST, `fetch(no-cors)` and form posts included,
/// and a page cannot forge either; the CLI and scripts send neither. Behind a proxy that
/// rewrites `Host`, `X-Forwarded-Host` (which a cross-site page cannot set without a CORS
/// preflight, which this server never grants) names the public host.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.as_bytes(), b"same-origin" | b"none")
    {
        return Some(format!(
            "Sec-Fetch-Site is {}",
            String::from_utf8_lossy(site.as_bytes())
                .chars()
                .take(40)
                .collect::<String>()
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("");
    let host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let ours = |name| {
        headers
            .get(name)
            .and_then(|h: &HeaderValue| h.to_str().ok())
            .is_some_and(|h| Some(h) == host)
    };
    if ours(header::HOST) || ours(HeaderName::from_static("x-forwarded-host")) {
        None
    } else {
        Some(format!(
            "the page's origin {} is not this server",
            origin.chars().take(100).collect::<String>()
        ))
    }
}

#[derive(Debug, Default, Deserialize)]
struct TokenQuery {
    token: Option<String>,
    view: Option<String>,
}

/// The refusal when the server has a read token and the request lacks it (header or `?token=`).
fn read_denied(state: &AppState, headers: &HeaderMap, q: &TokenQuery) -> Option<Response> {
    let want = state.cfg.read_token.as_ref()?;
    let given = bearer(headers).or(q.token.as_deref());
    match given {
        Some(t) if same_secret(t, want) => None,
        _ => Some(error(
            StatusCode::UNAUTHORIZED,
            "this server needs a read token: add ?token=… to the link or send Authorization: Bearer …",
        )),
    }
}

fn app(cfg: ServerConfig) -> (Router, Shared) {
    let mut script_src = vec!["'self'".to_owned(), "'wasm-unsafe-eval'".to_owned()];
    script_src.extend(cfg.assets.inline_script_hashes.iter().cloned());
    let mut ancestors = vec!["'self'".to_owned()];
    ancestors.extend(cfg.frame_ancestors.iter().cloned());
    let mut connect = vec!["'self'".to_owned()];
    connect.extend(cfg.trace_origins.iter().cloned());
    let csp = format!(
        "default-src 'self'; script-src {}; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data: blob:; connect-src {}; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors {}",
        script_src.join(" "),
        connect.join(" "),
        ancestors.join(" ")
    );
    let demos = Scenario::ALL
        .iter()
        .map(|&s| (s, bytes::Bytes::from(generate(s, cfg.demo_events, 1).0)))
        .collect();
    let state: Shared = Arc::new(AppState {
        csp: HeaderValue::from_str(&csp).unwrap_or(HeaderValue::from_static("default-src 'self'")),
        uploads: Slots::new(cfg.limits.max_uploads, cfg.limits.max_uploads_per_client),
        retention: Arc::new(tokio::sync::Mutex::new(())),
        retention_again: AtomicBool::new(false),
        summaries: summaries::Summaries::new(cfg.summary_memory_bytes),
        cfg,
        demos,
    });
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/api/v1", get(api_info))
        .route("/api/v1/traces", axum::routing::post(upload))
        .route("/api/v1/traces/{id}", get(download))
        .route("/api/v1/traces/{id}/summary", get(summary_overview))
        .route("/api/v1/traces/{id}/timeline", get(summary_timeline))
        .route("/api/v1/traces/{id}/live", get(summary_live))
        .route("/api/v1/demos", get(demo_list))
        .route("/api/v1/demos/{name}", get(demo_trace))
        .route("/t/{id}", get(share_link))
        .route("/embed/{id}", get(embed_link))
        .route("/", get(index))
        .route("/{*path}", get(asset))
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            security_headers,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state.clone());
    (router, state)
}

/// The log span of a request: method, path and query with every `token` value redacted, so
/// that no log level ever shows a token (headers are never logged).
fn request_span<B>(req: &axum::http::Request<B>) -> tracing::Span {
    let uri = req.uri();
    let query = uri.query().map(redact_query).unwrap_or_default();
    tracing::debug_span!(
        "request",
        method = %req.method(),
        path = %uri.path(),
        query = %query,
    )
}

/// A query string with every value redacted (`token=…` may be spelled `tok%65n=…`, so no
/// value is trusted to be harmless); the names stay, for debugging.
fn redact_query(q: &str) -> String {
    q.split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) => format!("{}=REDACTED", k.chars().take(40).collect::<String>()),
            None => kv.chars().take(40).collect(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

async fn security_headers(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, state.csp.clone());
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

async fn api_info(State(state): State<Shared>) -> Response {
    axum::Json(serde_json::json!({
        "api_version": 1,
        "server": concat!("gpucollect ", env!("CARGO_PKG_VERSION")),
        "max_upload_bytes": state.cfg.max_upload_bytes,
        "upload_requires_token": state.cfg.upload_token.is_some(),
        "read_requires_token": state.cfg.read_token.is_some(),
    }))
    .into_response()
}

async fn upload(
    State(state): State<Shared>,
    client: Option<axum::Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    if let Some(why) = cross_site(&headers) {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "uploads from another site's page are refused ({why}): upload with \
                 `gpucollect upload` or from this server's own pages"
            ),
        );
    }
    if let Some(want) = &state.cfg.upload_token {
        match bearer(&headers) {
            Some(t) if same_secret(t, want) => {}
            _ => {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "uploading to this server needs a token: pass --token or set GPUCOLLECT_UPLOAD_TOKEN",
                );
            }
        }
    }
    // An upload larger than the whole store would be deleted by retention at once.
    let limit = state
        .cfg
        .max_upload_bytes
        .min(state.cfg.max_store_bytes.unwrap_or(u64::MAX));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the trace is larger than this server's limit of {limit} bytes"),
        );
    }
    let key = ClientKey::of(client.map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.0));
    let _slot = match state.uploads.try_take(key) {
        Ok(slot) => slot,
        Err(why) => {
            let (status, msg) = match why {
                Refused::ClientFull => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "this client has as many uploads running as the server allows: wait for one to finish",
                ),
                Refused::Full => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server has as many uploads running as it allows: try again shortly",
                ),
            };
            let mut r = error(status, msg);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        }
    };
    let id = match TraceId::random() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let l = &state.cfg.limits;
    let stream = guarded_body(body, l.body_idle_timeout, started, l.request_timeout);
    match state.cfg.store.put(&id, stream, limit).await {
        Ok(summary) => {
            tracing::info!(%id, bytes = summary.bytes, records = summary.records, "stored trace");
            spawn_retention(state.clone());
            let link = match &state.cfg.read_token {
                Some(t) => format!("/t/{id}?token={}", encode_query(t)),
                None => format!("/t/{id}"),
            };
            (
                StatusCode::CREATED,
                [(header::LOCATION, link.clone())],
                axum::Json(serde_json::json!({
                    "id": id.to_string(),
                    "link": link,
                    "trace_url": format!("/api/v1/traces/{id}"),
                    "bytes": summary.bytes,
                    "records": summary.records,
                    "warnings": summary.warnings,
                    "warnings_total": summary.warnings_total,
                })),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "upload refused");
            let status = match e {
                UploadError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                UploadError::NotATrace(_) | UploadError::Interrupted(_) => StatusCode::BAD_REQUEST,
                UploadError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
                UploadError::Damaged(_) => StatusCode::UNPROCESSABLE_ENTITY,
                UploadError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let mut r = error(status, e.to_string());
            if status == StatusCode::REQUEST_TIMEOUT {
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
    }
}

/// An upload body as a stream that fails with `TimedOut` when the client pauses longer than
/// `idle` or the request runs past `deadline`, and with `Interrupted` when the client goes.
fn guarded_body(
    body: Body,
    idle: Duration,
    started: Instant,
    total: Duration,
) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, UploadError>> + Send>> {
    use futures_util::StreamExt;
    let stream = body.into_data_stream();
    let deadline = started + total;
    Box::pin(futures_util::stream::unfold(
        Some(stream),
        move |stream| async move {
            let mut stream = stream?;
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            let wait = idle.min(left);
            match tokio::time::timeout(wait, stream.next()).await {
                Ok(Some(Ok(b))) => Some((Ok(b), Some(stream))),
                Ok(Some(Err(e))) => Some((Err(UploadError::Interrupted(e.to_string())), None)),
                Ok(None) => None,
                Err(_) if wait < idle => Some((
                    Err(UploadError::TimedOut(format!(
                        "an upload may take at most {} s (--request-timeout)",
                        total.as_secs()
                    ))),
                    None,
                )),
                Err(_) => Some((
                    Err(UploadError::TimedOut(format!(
                        "no data for {} s (--body-timeout)",
                        idle.as_secs()
                    ))),
                    None,
                )),
            }
        },
    ))
}

/// Query of the summary endpoints: the read token, and what each asks for.
#[derive(Debug, Deserialize)]
struct SummaryQuery {
    token: Option<String>,
    t0: Option<u64>,
    t1: Option<u64>,
    columns: Option<usize>,
    t: Option<u64>,
    limit: Option<usize>,
}

/// The trace a summaries request names, or the answer that refuses it (no read token, a bad
/// id).
fn summary_request(
    state: &AppState,
    id: &str,
    q: &SummaryQuery,
    headers: &HeaderMap,
) -> Result<TraceId, Box<Response>> {
    let tq = TokenQuery {
        token: q.token.clone(),
        view: None,
    };
    if let Some(r) = read_denied(state, headers, &tq) {
        return Err(Box::new(r));
    }
    TraceId::parse(id).map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, e.to_string())))
}

/// The answer to a summary that could not be made.
fn summary_refused(e: &summaries::SummaryError, id: &TraceId) -> Response {
    use summaries::SummaryError as E;
    let status = match e {
        E::NotFound(_) => StatusCode::NOT_FOUND,
        E::TooBig { .. } | E::ModelOverBudget { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        E::Undecodable(_) => StatusCode::UNPROCESSABLE_ENTITY,
        E::Storage(_) => {
            tracing::error!(error = %e, %id, "cannot summarise a stored trace");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    error(status, e.to_string())
}

/// The summary of trace `id` for a request, or the answer that refuses it.
async fn summary_of(
    state: &AppState,
    id: &str,
    q: &SummaryQuery,
    headers: &HeaderMap,
) -> Result<Arc<summaries::Summary>, Response> {
    let id = summary_request(state, id, q, headers).map_err(|r| *r)?;
    state
        .summaries
        .get(&state.cfg.store, &id)
        .await
        .map_err(|e| summary_refused(&e, &id))
}

/// `GET /api/v1/traces/<id>/summary`: the report, the time extent and the series; from the
/// summary kept in the store when the trace is not in memory.
async fn summary_overview(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SummaryQuery>,
    headers: HeaderMap,
) -> Response {
    let id = match summary_request(&state, &id, &q, &headers) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match state.summaries.overview_json(&state.cfg.store, &id).await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => summary_refused(&e, &id),
    }
}

/// `GET /api/v1/traces/<id>/timeline?t0=&t1=&columns=`: the total and every series in buckets.
async fn summary_timeline(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SummaryQuery>,
    headers: HeaderMap,
) -> Response {
    let columns = q.columns.unwrap_or(1000);
    if columns == 0 || columns > summaries::MAX_COLUMNS {
        return error(
            StatusCode::BAD_REQUEST,
            format!("columns must be 1 to {}", summaries::MAX_COLUMNS),
        );
    }
    let s = match summary_of(&state, &id, &q, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let m = &s.trace.model;
    let t0 = q.t0.unwrap_or(m.first_ts_nanos);
    let t1 = q.t1.unwrap_or(m.last_ts_nanos.saturating_add(1));
    if t1 <= t0 {
        return error(StatusCode::BAD_REQUEST, "t1 must be after t0 (nanoseconds)");
    }
    axum::Json(s.timeline(t0, t1, columns)).into_response()
}

/// `GET /api/v1/traces/<id>/live?t=&limit=`: device memory live at `t`, by call site.
async fn summary_live(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SummaryQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(t) = q.t else {
        return error(StatusCode::BAD_REQUEST, "give the moment as ?t=NANOSECONDS");
    };
    let limit = q.limit.unwrap_or(100).min(10_000);
    match summary_of(&state, &id, &q, &headers).await {
        Ok(s) => axum::Json(s.live_at(t, limit)).into_response(),
        Err(r) => r,
    }
}

async fn download(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = read_denied(&state, &headers, &q) {
        return r;
    }
    let id = match TraceId::parse(&id) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match state.cfg.store.get(&id).await {
        Ok(Some((len, stream))) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                ),
                (header::CONTENT_LENGTH, HeaderValue::from(len)),
                (
                    header::CONTENT_DISPOSITION,
                    HeaderValue::from_str(&format!("attachment; filename=\"{id}.msgpack\""))
                        .unwrap_or(HeaderValue::from_static("attachment")),
                ),
                (
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("private, max-age=31536000, immutable"),
                ),
            ],
            Body::from_stream(stream),
        )
            .into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            format!("no trace {id} on this server"),
        ),
        Err(e) => {
            tracing::error!(error = %e, %id, "cannot read a stored trace");
            error(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the trace")
        }
    }
}

/// Percent-encodes a query value.
fn encode_query(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The viewer URL that opens a stored trace.
fn viewer_url(id: &TraceId, q: &TokenQuery, embed: bool) -> String {
    let mut trace = format!("/api/v1/traces/{id}");
    if let Some(t) = &q.token {
        trace.push_str("?token=");
        trace.push_str(&encode_query(t));
    }
    let mut url = format!("/?trace={}", encode_query(&trace));
    if embed {
        url.push_str("&embed=1");
    }
    if let Some(v) = &q.view {
        url.push_str("&view=");
        url.push_str(&encode_query(v));
    }
    url
}

/// `/t/<id>`: a share link. Redirects to the viewer; the browser keeps the `#view` fragment.
async fn share_link(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    link(&state, &id, &q, &headers, false).await
}

/// `/embed/<id>?view=…`: the same with the viewer's minimal chrome, for iframes.
async fn embed_link(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    link(&state, &id, &q, &headers, true).await
}

async fn link(
    state: &AppState,
    id: &str,
    q: &TokenQuery,
    headers: &HeaderMap,
    embed: bool,
) -> Response {
    if let Some(r) = read_denied(state, headers, q) {
        return r;
    }
    let id = match TraceId::parse(id) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match state.cfg.store.exists(&id).await {
        Ok(true) => (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, viewer_url(&id, q, embed))],
        )
            .into_response(),
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            format!("no trace {id} on this server"),
        ),
        Err(e) => {
            tracing::error!(error = %e, %id, "cannot read a stored trace");
            error(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the trace")
        }
    }
}

async fn demo_list(State(state): State<Shared>) -> Response {
    let list: Vec<_> = state
        .demos
        .iter()
        .map(|(s, b)| {
            serde_json::json!({
                "name": s.name(),
                "description": s.description(),
                "bytes": b.len(),
                "trace_url": format!("/api/v1/demos/{}", s.name()),
            })
        })
        .collect();
    axum::Json(list).into_response()
}

async fn demo_trace(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    match state.demos.iter().find(|(s, _)| s.name() == name) {
        Some((_, b)) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            b.clone(),
        )
            .into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "no such demo trace: see /api/v1/demos",
        ),
    }
}

/// The page tells the viewer when this server takes no uploads (`gpucollect view`, or
/// `--max-upload 0`), so it offers no Share button that could only be refused.
const NO_UPLOADS_META: &str = r#"<meta name="gpucollect-uploads" content="off">"#;

async fn index(State(state): State<Shared>) -> Response {
    let page = state.cfg.assets.index();
    let body = if state.cfg.max_upload_bytes == 0 {
        with_head_tag(page, NO_UPLOADS_META)
    } else {
        page.to_vec()
    };
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `page` with `tag` right after its `<head>` (or first, if it has none).
fn with_head_tag(page: &[u8], tag: &str) -> Vec<u8> {
    let at = page
        .windows(6)
        .position(|w| w.eq_ignore_ascii_case(b"<head>"))
        .map_or(0, |i| i + 6);
    let mut out = Vec::with_capacity(page.len() + tag.len());
    out.extend_from_slice(&page[..at]);
    out.extend_from_slice(tag.as_bytes());
    out.extend_from_slice(&page[at..]);
    out
}

async fn asset(State(state): State<Shared>, Path(path): Path<String>) -> Response {
    match state.cfg.assets.get(&path) {
        Some((ct, bytes)) => ([(header::CONTENT_TYPE, ct)], bytes.to_vec()).into_response(),
        None => error(StatusCode::NOT_FOUND, "not found"),
    }
}

/// Applies `--max-age` and `--max-bytes`: drops expired traces, then the oldest until the
/// store fits. Returns how many traces were deleted.
pub async fn enforce_retention(
    store: &Store,
    max_age: Option<Duration>,
    max_bytes: Option<u64>,
) -> anyhow::Result<usize> {
    if max_age.is_none() && max_bytes.is_none() {
        return Ok(0);
    }
    let mut traces = store.list().await?;
    traces.sort_by_key(|t| t.modified);
    let now = SystemTime::now();
    let mut total: u64 = traces.iter().map(|t| t.size_bytes).sum();
    let mut deleted = 0;
    for t in &traces {
        let expired = max_age.is_some_and(|age| {
            now.duration_since(t.modified)
                .is_ok_and(|elapsed| elapsed > age)
        });
        let over = max_bytes.is_some_and(|m| total > m);
        if !(expired || over) {
            continue;
        }
        store.delete(&t.id).await?;
        total = total.saturating_sub(t.size_bytes);
        deleted += 1;
        tracing::info!(id = %t.id, expired, "retention deleted a trace");
    }
    Ok(deleted)
}

/// Runs retention in the background, one pass at a time: asked for while a pass runs, it
/// makes that task run one more pass when it ends, rather than starting a second one.
fn spawn_retention(state: Shared) {
    if state.cfg.max_age.is_none() && state.cfg.max_store_bytes.is_none() {
        return;
    }
    state.retention_again.store(true, Ordering::SeqCst);
    let Ok(guard) = state.retention.clone().try_lock_owned() else {
        return;
    };
    tokio::spawn(async move {
        let mut guard = Some(guard);
        loop {
            while state.retention_again.swap(false, Ordering::SeqCst) {
                retention_pass(&state).await;
            }
            drop(guard.take());
            // A request that came between the last check and the unlock found the lock taken.
            if !state.retention_again.load(Ordering::SeqCst) {
                break;
            }
            match state.retention.clone().try_lock_owned() {
                Ok(g) => guard = Some(g),
                Err(_) => break,
            }
        }
    });
}

async fn retention_pass(state: &AppState) {
    if let Err(e) = enforce_retention(
        &state.cfg.store,
        state.cfg.max_age,
        state.cfg.max_store_bytes,
    )
    .await
    {
        tracing::warn!(error = %e, "retention failed");
    }
}

/// Serves until SIGINT or SIGTERM, then finishes in-flight requests (for at most 30 s).
///
/// The accept loop is ours, around hyper's HTTP/1.1 connection builder, because
/// `axum::serve` offers neither a header timeout nor a connection cap. Every accepted
/// connection takes a slot (per client and in total); a connection beyond either cap gets a
/// one-line 503 and is closed at once, so one client's sockets cannot starve the others and
/// nothing waits in the kernel's accept queue. HTTP/2 is not offered.
pub async fn serve(cfg: ServerConfig, addr: SocketAddr) -> anyhow::Result<()> {
    serve_on(cfg, listen(addr)?).await
}

/// Listens on `addr` (port 0: a free port, which `local_addr` then tells).
pub fn listen(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    // A deep accept queue (the kernel caps it at net.core.somaxconn): a burst of connections
    // waits there for the accept loop instead of having its SYNs dropped and retried 1 s later.
    (|| {
        let sock = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }?;
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        sock.listen(4096)
    })()
    .with_context(|| {
        format!("cannot listen on {addr}: is another server using it? pick one with --addr")
    })
}

/// Serves on a listener from [`listen`] until SIGINT or SIGTERM.
pub async fn serve_on(cfg: ServerConfig, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let described = cfg.store.describe();
    let viewer = cfg.assets.has_viewer();
    let limits = cfg.limits.clone();
    let retention = cfg.max_age.is_some() || cfg.max_store_bytes.is_some();
    let local = listener.local_addr()?;
    let (router, state) = app(cfg);
    eprintln!(
        "gpucollect serve: listening on http://{local}/ (store: {described}{})",
        if viewer { "" } else { "; no viewer built in" }
    );
    if retention {
        let state = state.clone();
        tokio::spawn(async move {
            loop {
                spawn_retention(state.clone());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        });
    }
    let conns = Slots::new(limits.max_connections, limits.max_connections_per_client);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(256 * 1024)
        .half_close(true);
    let http = Arc::new(http);
    // Each connection holds a receiver; the sender's `closed()` says when all are gone.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors or memory: let connections finish, then go on.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match conns.try_take(ClientKey::of(peer.ip())) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(client = %peer.ip(), ?why, "connection refused");
                refuse_connection(&tcp, why);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let http = http.clone();
        let body_timeout = limits.body_idle_timeout;
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service =
                hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ClientAddr(peer.ip()));
                    tower::ServiceExt::oneshot(router.clone(), req)
                });
            let io = limits::WriteStall::new(tcp, body_timeout);
            let conn = http.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(client = %peer.ip(), error = %e, "connection ended");
                    }
                }
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    if tokio::time::timeout(Duration::from_secs(30), stop_tx.closed())
        .await
        .is_err()
    {
        eprintln!("gpucollect serve: requests still running after 30 s were cut off");
    }
    eprintln!("gpucollect serve: stopped");
    Ok(())
}

/// Answers a connection beyond a cap with a 503 it can read, without waiting for its request,
/// then closes it (a single non-blocking write: a client that does not read loses it).
fn refuse_connection(tcp: &tokio::net::TcpStream, why: Refused) {
    let body: &[u8] = match why {
        Refused::ClientFull => {
            b"{\"error\":\"this client has too many connections open to this server: close some\"}"
        }
        Refused::Full => {
            b"{\"error\":\"the server has as many connections as it allows: try again shortly\"}"
        }
    };
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut msg = head.into_bytes();
    msg.extend_from_slice(body);
    let _ = tcp.try_write(&msg);
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
