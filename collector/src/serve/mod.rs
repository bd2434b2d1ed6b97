//! `gpucollect serve`: hosts the viewer, accepts trace uploads and serves shared traces, so a
//! team passes around links instead of files. The HTTP API is versioned and documented in
//! `API.md`. Everything from the network is untrusted: ids are validated, uploads are decoded
//! as they stream in and refused unless they are traces, and every response carries security
//! headers (CSP with an explicit `frame-ancestors` allow-list, `nosniff`, no referrer).

pub mod assets;
pub mod ids;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use analysis_core::synth::{Scenario, generate};
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use assets::Assets;
use ids::TraceId;
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
    pub max_age: Option<Duration>,
    pub max_store_bytes: Option<u64>,
    /// Approximate events per bundled demo trace.
    pub demo_events: u64,
}

struct AppState {
    cfg: ServerConfig,
    csp: HeaderValue,
    demos: Vec<(Scenario, bytes::Bytes)>,
}

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

pub fn router(cfg: ServerConfig) -> Router {
    let mut script_src = vec!["'self'".to_owned(), "'wasm-unsafe-eval'".to_owned()];
    script_src.extend(cfg.assets.inline_script_hashes.iter().cloned());
    let mut ancestors = vec!["'self'".to_owned()];
    ancestors.extend(cfg.frame_ancestors.iter().cloned());
    let csp = format!(
        "default-src 'self'; script-src {}; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors {}",
        script_src.join(" "),
        ancestors.join(" ")
    );
    let demos = Scenario::ALL
        .iter()
        .map(|&s| (s, bytes::Bytes::from(generate(s, cfg.demo_events, 1).0)))
        .collect();
    let state: Shared = Arc::new(AppState {
        csp: HeaderValue::from_str(&csp).unwrap_or(HeaderValue::from_static("default-src 'self'")),
        cfg,
        demos,
    });
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/api/v1", get(api_info))
        .route("/api/v1/traces", axum::routing::post(upload))
        .route("/api/v1/traces/{id}", get(download))
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
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
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

async fn upload(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
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
    let limit = state.cfg.max_upload_bytes;
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
    let id = match TraceId::random() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let stream = body.into_data_stream();
    match state.cfg.store.put(&id, stream, limit).await {
        Ok(summary) => {
            tracing::info!(%id, bytes = summary.bytes, records = summary.records, "stored trace");
            spawn_retention(state.clone());
            let link = format!("/t/{id}");
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
                })),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "upload refused");
            let status = match e {
                UploadError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                UploadError::NotATrace(_) | UploadError::Interrupted(_) => StatusCode::BAD_REQUEST,
                UploadError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, e.to_string())
        }
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

async fn index(State(state): State<Shared>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        state.cfg.assets.index().to_vec(),
    )
        .into_response()
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

fn spawn_retention(state: Shared) {
    if state.cfg.max_age.is_none() && state.cfg.max_store_bytes.is_none() {
        return;
    }
    tokio::spawn(async move {
        if let Err(e) = enforce_retention(
            &state.cfg.store,
            state.cfg.max_age,
            state.cfg.max_store_bytes,
        )
        .await
        {
            tracing::warn!(error = %e, "retention failed");
        }
    });
}

/// Serves until SIGINT or SIGTERM, then finishes in-flight requests.
pub async fn serve(cfg: ServerConfig, addr: SocketAddr) -> anyhow::Result<()> {
    use anyhow::Context;
    let (store, max_age, max_bytes) = (cfg.store.clone(), cfg.max_age, cfg.max_store_bytes);
    let described = cfg.store.describe();
    let viewer = cfg.assets.has_viewer();
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr}: is another server using it? pick one with --addr")
    })?;
    let local = listener.local_addr()?;
    eprintln!(
        "gpucollect serve: listening on http://{local}/ (store: {described}{})",
        if viewer { "" } else { "; no viewer built in" }
    );
    if max_age.is_some() || max_bytes.is_some() {
        tokio::spawn(async move {
            loop {
                if let Err(e) = enforce_retention(&store, max_age, max_bytes).await {
                    tracing::warn!(error = %e, "retention failed");
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        });
    }
    axum::serve(listener, router(cfg))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("the server stopped with an error")?;
    eprintln!("gpucollect serve: stopped");
    Ok(())
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
