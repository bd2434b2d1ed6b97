//! `gpucollect serve`: the shared-trace server (see `serve/`). Arguments become a
//! `ServerConfig` before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use analysis_core::units::parse_bytes;
use anyhow::{Context, Result, bail};
use clap::Args;

use crate::serve::{self, ServerConfig, assets::Assets, store::Store};

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
    /// Token required to upload (sent as `Authorization: Bearer TOKEN`).
    #[arg(long, env = "GPUCOLLECT_UPLOAD_TOKEN", hide_env_values = true)]
    pub upload_token: Option<String>,
    /// Token required to read traces (a private server); links then carry `?token=`.
    #[arg(long, env = "GPUCOLLECT_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    /// Origins allowed to embed this server's pages in iframes, e.g. https://wiki.example.com
    /// (repeat the option for several).
    #[arg(long = "frame-ancestor")]
    pub frame_ancestors: Vec<String>,
    /// Delete traces older than this (e.g. 30d, 12h, 90m, 3600s).
    #[arg(long)]
    pub max_age: Option<String>,
    /// Keep the store below this size, deleting the oldest traces first (e.g. 100GiB).
    #[arg(long)]
    pub max_bytes: Option<String>,
    /// Events per bundled demo trace.
    #[arg(long, default_value_t = 200_000)]
    pub demo_events: u64,
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

fn bytes_arg(name: &str, v: &str) -> Result<u64> {
    parse_bytes(v).with_context(|| format!("--{name} `{v}` is not a size: use e.g. 512MiB or 2GB"))
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
    for origin in &a.frame_ancestors {
        let ok = (origin.starts_with("https://") || origin.starts_with("http://"))
            && !origin.contains([' ', ';', '\'', '"', ',']);
        if !ok {
            bail!(
                "--frame-ancestor `{origin}` is not an origin: use e.g. https://wiki.example.com"
            );
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
            upload_token: a.upload_token.filter(|t| !t.is_empty()),
            read_token: a.read_token.filter(|t| !t.is_empty()),
            frame_ancestors: a.frame_ancestors,
            max_age: a.max_age.as_deref().map(parse_duration).transpose()?,
            max_store_bytes: a
                .max_bytes
                .as_deref()
                .map(|v| bytes_arg("max-bytes", v))
                .transpose()?,
            demo_events: a.demo_events,
        };
        serve::serve(cfg, a.addr).await
    })?;
    Ok(0)
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
}
