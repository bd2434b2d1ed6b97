//! `gpucollect upload TRACE [--server URL]`: streams a trace to a `gpucollect serve` and prints
//! the share link.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::render_text::one_line;

#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The trace file to share.
    pub trace: PathBuf,
    /// The server's base URL.
    #[arg(
        long,
        env = "GPUCOLLECT_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// Upload token, if the server needs one.
    #[arg(long, env = "GPUCOLLECT_UPLOAD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(a: UploadArgs) -> Result<u8> {
    let file = std::fs::File::open(&a.trace)
        .with_context(|| format!("cannot open the trace {}", a.trace.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let base = a.server.trim_end_matches('/');
    let url = format!("{base}/api/v1/traces");
    // A redirect is an error: following it would re-send the trace somewhere else (or, for
    // 301-303, turn the POST into a GET whose success stores nothing).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let mut req = agent
        .post(&url)
        .header("Content-Type", "application/octet-stream")
        .header("Content-Length", &len.to_string());
    if let Some(t) = &a.token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut res = req
        .send(ureq::SendBody::from_reader(&mut std::io::BufReader::new(
            file,
        )))
        .with_context(|| {
            format!("cannot reach the server at {url}: is `gpucollect serve` running there?")
        })?;
    let status = res.status().as_u16();
    if (300..400).contains(&status) {
        let to = res
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("nowhere");
        bail!(
            "the server at {url} redirected the upload ({status}) to {}: nothing was stored; \
             pass the server's final address with --server",
            one_line(to)
        );
    }
    let text = res
        .body_mut()
        .read_to_string()
        .with_context(|| format!("cannot read the answer of {url}"))?;
    let body: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!("the server at {url} did not answer with JSON (status {status})")
    })?;
    if status != 201 {
        let msg = body["error"].as_str().unwrap_or("no reason given");
        bail!(
            "the server refused the upload ({status}): {}",
            one_line(msg)
        );
    }
    let Some(link) = body["link"].as_str().filter(|l| l.starts_with('/')) else {
        bail!("the server at {url} accepted the upload but sent no link (status {status})");
    };
    println!("{base}{}", one_line(link));
    for w in body["warnings"].as_array().into_iter().flatten() {
        eprintln!(
            "gpucollect: warning: {}",
            one_line(w.as_str().unwrap_or_default())
        );
    }
    let total = body["warnings_total"].as_u64().unwrap_or(0);
    let shown = body["warnings"].as_array().map_or(0, Vec::len) as u64;
    if total > shown {
        eprintln!("gpucollect: … and {} more warning(s)", total - shown);
    }
    Ok(0)
}
