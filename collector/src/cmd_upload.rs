//! `gpucollect upload TRACE [--server URL]`: streams a trace to a `gpucollect serve` and prints
//! the share link.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

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
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
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
    let text = res
        .body_mut()
        .read_to_string()
        .with_context(|| format!("cannot read the answer of {url}"))?;
    let body: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!("the server at {url} did not answer with JSON (status {status})")
    })?;
    if status != 201 {
        let msg = body["error"].as_str().unwrap_or("no reason given");
        bail!("the server refused the upload ({status}): {msg}");
    }
    let link = body["link"].as_str().unwrap_or_default();
    println!("{base}{link}");
    for w in body["warnings"].as_array().into_iter().flatten() {
        eprintln!("gpucollect: warning: {}", w.as_str().unwrap_or_default());
    }
    Ok(0)
}
