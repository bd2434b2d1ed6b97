//! `gpucollect serve`: the shared-trace server (see `serve/`). Arguments become a
//! `ServerConfig` before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use analysis_core::units::parse_bytes;
use anyhow::{Context, Result, bail};
use clap::Args;

use crate::assets::Assets;
use crate::serve::{self, ServerConfig, limits::Limits, store::Store};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Where traces are stored: a folder, or s3://bucket/prefix (credentials and endpoint from
    /// the AWS_* environment variables).
    #[arg(long, default_value = "gpucollect-store")]
    pub store: String,
    /// Serve the viewer from this folder instead of the one built into the binary.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// Largest accepted upload (units allowed: 512MiB, 2GB).
    #[arg(long, default_value = "4GiB")]
    pub max_upload: String,
    /// Token required to upload (sent as `Authorization: Bearer TOKEN`). Required when
    /// listening on a non-loopback address, unless --allow-anonymous-uploads is given.
    #[arg(long, env = "GPUCOLLECT_UPLOAD_TOKEN", hide_env_values = true)]
    pub upload_token: Option<String>,
    /// Accept uploads without a token on a non-loopback address (anyone who can reach the
    /// server can store traces on it).
    #[arg(long)]
    pub allow_anonymous_uploads: bool,
    /// Token required to read traces (a private server); links then carry `?token=`.
    #[arg(long, env = "GPUCOLLECT_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    /// Origins allowed to embed this server's pages in iframes, e.g. `https://wiki.example.com`
    /// (repeat the option for several).
    #[arg(long = "frame-ancestor")]
    pub frame_ancestors: Vec<String>,
    /// Origins the viewer may open `?trace=URL` links from, e.g. `https://files.example.org`
    /// (repeat the option for several). The page's Content-Security-Policy lets it download from
    /// this server only; that origin must also allow the download (CORS).
    #[arg(long = "allow-trace-origin")]
    pub trace_origins: Vec<String>,
    /// Delete traces older than this (e.g. 30d, 12h, 90m, 3600s).
    #[arg(long)]
    pub max_age: Option<String>,
    /// Keep the store below this size, deleting the oldest traces first (e.g. 100GiB).
    #[arg(long)]
    pub max_bytes: Option<String>,
    /// Memory the server may keep for trace summaries (the report, timeline, live set and
    /// call sites it serves from a decoded trace), least recently used first out. A trace whose
    /// summary would need more is refused (413): download it instead.
    #[arg(long, default_value = "4GiB")]
    pub summary_memory: String,
    /// Events per bundled demo trace.
    #[arg(long, default_value_t = 200_000)]
    pub demo_events: u64,
    /// Longest time to receive a request's headers (also how long an idle connection stays
    /// open), e.g. 10s.
    #[arg(long, default_value = "10s")]
    pub header_timeout: String,
    /// Longest pause in an upload's body before the upload is dropped (408), and longest
    /// time a client may read none of an answer (a download) before its connection is closed.
    #[arg(long, default_value = "30s")]
    pub body_timeout: String,
    /// Longest time one upload may take from start to end (408).
    #[arg(long, default_value = "30m")]
    pub request_timeout: String,
    /// Most connections open at once; more get 503 at once. Each takes a file descriptor.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Most connections open at once from one client (an IPv4 address or IPv6 /64).
    #[arg(long, default_value_t = 64)]
    pub max_connections_per_client: usize,
    /// Most uploads running at once; more get 503.
    #[arg(long, default_value_t = 4)]
    pub max_uploads: usize,
    /// Most uploads running at once from one client; more get 429.
    #[arg(long, default_value_t = 2)]
    pub max_uploads_per_client: usize,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Parses `30d`, `12h`, `90m`, `3600s` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .with_context(|| format!("`{s}` is not a duration: use e.g. 30d, 12h, 90m or 3600s"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => bail!("`{s}` is not a duration: use e.g. 30d, 12h, 90m or 3600s"),
    };
    Ok(Duration::from_secs(secs))
}

fn duration_arg(name: &str, v: &str) -> Result<Duration> {
    let d = parse_duration(v).with_context(|| format!("--{name}"))?;
    if d.is_zero() {
        bail!("--{name} is 0: give a positive duration, e.g. 10s");
    }
    Ok(d)
}

fn bytes_arg(name: &str, v: &str) -> Result<u64> {
    parse_bytes(v).with_context(|| format!("--{name} `{v}` is not a size: use e.g. 512MiB or 2GB"))
}

/// A token from its flag or environment variable: an empty one is an error, not "no token"
/// (which would silently start an open server).
fn token(flag: &str, env: &str, v: Option<String>) -> Result<Option<String>> {
    let from_env = std::env::var_os(env).is_some_and(|v| v.is_empty());
    match v {
        Some(t) if t.trim().is_empty() => bail!(
            "--{flag} is empty: give a token (e.g. `openssl rand -hex 16`), or leave the option \
             and {env} unset"
        ),
        None if from_env => {
            bail!("{env} is set but empty: give a token (e.g. `openssl rand -hex 16`), or unset it")
        }
        t => Ok(t),
    }
}

pub fn run(a: ServeArgs) -> Result<u8> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match a.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let upload_token = token("upload-token", "GPUCOLLECT_UPLOAD_TOKEN", a.upload_token)?;
    let read_token = token("read-token", "GPUCOLLECT_READ_TOKEN", a.read_token)?;
    if upload_token.is_none() && !a.addr.ip().is_loopback() && !a.allow_anonymous_uploads {
        bail!(
            "refusing to accept anonymous uploads on {}, which other machines can reach: set \
             --upload-token (or GPUCOLLECT_UPLOAD_TOKEN), or pass --allow-anonymous-uploads",
            a.addr
        );
    }
    let limits = Limits {
        header_timeout: duration_arg("header-timeout", &a.header_timeout)?,
        body_idle_timeout: duration_arg("body-timeout", &a.body_timeout)?,
        request_timeout: duration_arg("request-timeout", &a.request_timeout)?,
        max_connections: a.max_connections,
        max_connections_per_client: a.max_connections_per_client,
        max_uploads: a.max_uploads,
        max_uploads_per_client: a.max_uploads_per_client,
    };
    for (name, v) in [
        ("max-connections", limits.max_connections),
        (
            "max-connections-per-client",
            limits.max_connections_per_client,
        ),
        ("max-uploads", limits.max_uploads),
        ("max-uploads-per-client", limits.max_uploads_per_client),
    ] {
        if v == 0 {
            bail!("--{name} is 0: the server could serve nothing; give at least 1");
        }
    }
    for (flag, origins, example) in [
        (
            "frame-ancestor",
            &a.frame_ancestors,
            "https://wiki.example.com",
        ),
        (
            "allow-trace-origin",
            &a.trace_origins,
            "https://files.example.org",
        ),
    ] {
        if let Some(origin) = origins.iter().find(|o| !is_origin(o)) {
            bail!("--{flag} `{origin}` is not an origin: use e.g. {example}");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let store = if a.store.starts_with("s3://") {
            Store::s3(&a.store)?
        } else {
            Store::local(std::path::Path::new(&a.store)).await?
        };
        let assets = match &a.assets {
            Some(dir) => Assets::from_dir(dir)?,
            None => Assets::embedded(),
        };
        let cfg = ServerConfig {
            store,
            assets,
            max_upload_bytes: bytes_arg("max-upload", &a.max_upload)?,
            upload_token,
            read_token,
            frame_ancestors: a.frame_ancestors,
            trace_origins: a.trace_origins,
            max_age: a.max_age.as_deref().map(parse_duration).transpose()?,
            max_store_bytes: a
                .max_bytes
                .as_deref()
                .map(|v| bytes_arg("max-bytes", v))
                .transpose()?,
            demo_events: a.demo_events,
            limits,
            summary_memory_bytes: bytes_arg("summary-memory", &a.summary_memory)?,
        };
        serve::serve(cfg, a.addr).await
    })?;
    Ok(0)
}

/// Whether `s` can stand in a CSP source list as an origin: `http(s)://` and a host, with
/// nothing that would end the source or the directive.
fn is_origin(s: &str) -> bool {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"));
    rest.is_some_and(|r| {
        !r.is_empty() && !r.contains(|c: char| c.is_whitespace() || ";'\",".contains(c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30d").expect("ok").as_secs(), 30 * 86_400);
        assert_eq!(parse_duration("90m").expect("ok").as_secs(), 5400);
        assert_eq!(parse_duration("15").expect("ok").as_secs(), 15);
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn origins_are_checked_before_they_go_into_the_csp() {
        assert!(is_origin("https://files.example.org"));
        assert!(is_origin("http://127.0.0.1:8000"));
        for bad in [
            "files.example.org",
            "https://",
            "https://a.org; script-src *",
            "https://a.org 'unsafe-inline'",
            "https://a.org,https://b.org",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }
}
