//! `gpucollect view FILE`: opens a trace or PyTorch snapshot in the viewer from a server of its
//! own on this machine (loopback, a free port), the way `trace_processor --httpd` serves
//! Perfetto's UI. The file is served where it lies (linked into a private store that is removed
//! when the command ends), so a large file is not copied, and a damaged one opens as far as it
//! decodes, as a dropped file would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::assets::Assets;
use crate::serve::{self, ServerConfig, ids::TraceId, limits::Limits, store::Store};

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// The trace (`.msgpack`) or PyTorch memory snapshot (pickle or JSON) to open.
    pub file: PathBuf,
    /// Address to listen on (port 0: a free port). Keep it on loopback: the page and the file
    /// are for this machine.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// Print the link instead of opening a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Serve the viewer from this folder instead of the one built into the binary.
    #[arg(long)]
    pub assets: Option<PathBuf>,
}

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(a: ViewArgs) -> Result<u8> {
    let file = std::fs::canonicalize(&a.file)
        .with_context(|| format!("cannot open {}: check the path", a.file.display()))?;
    let meta =
        std::fs::metadata(&file).with_context(|| format!("cannot read {}", file.display()))?;
    if !meta.is_file() {
        bail!(
            "{} is not a file: give a trace (.msgpack) or a PyTorch snapshot",
            file.display()
        );
    }
    std::fs::File::open(&file).with_context(|| format!("cannot read {}", file.display()))?;
    if !a.addr.ip().is_loopback() {
        bail!(
            "--addr {} is not a loopback address: `view` serves a file of this machine to this \
             machine; use `gpucollect serve` and `gpucollect upload` to share traces",
            a.addr
        );
    }
    let id = TraceId::random()?;
    let dir =
        TempDir(std::env::temp_dir().join(format!("gpucollect-view-{}", &id.to_string()[..12])));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let store = Store::local(&dir.0).await?;
        link_into_store(&file, &dir.0, &id)?;
        let assets = match &a.assets {
            Some(dir) => Assets::from_dir(dir)?,
            None => Assets::embedded(),
        };
        // Nobody may upload to this server, and reading needs the token in the link: other
        // users of this machine can reach loopback too.
        let read_token = TraceId::random()?.to_string();
        let cfg = ServerConfig {
            store,
            assets,
            max_upload_bytes: 0,
            upload_token: Some(TraceId::random()?.to_string()),
            read_token: Some(read_token.clone()),
            frame_ancestors: Vec::new(),
            trace_origins: Vec::new(),
            max_age: None,
            max_store_bytes: None,
            demo_events: 20_000,
            limits: Limits::default(),
            // The page opens a file too big for it through this server's summaries: this
            // machine analyses it whatever its size, within the model's own bound, as
            // `gpucollect report` would.
            summary_memory_bytes: u64::MAX,
        };
        let listener = serve::listen(a.addr)?;
        let url = format!(
            "http://{}/t/{id}?token={read_token}",
            listener.local_addr()?
        );
        eprintln!(
            "gpucollect view: {} at {url} (Ctrl-C stops the server)",
            file.display()
        );
        if !a.no_open {
            open_browser(&url);
        }
        let served = serve::serve_on(cfg, listener).await;
        drop(dir);
        served
    })?;
    Ok(0)
}

/// Puts `file` into the local store at `root` as trace `id`, by a link to where it lies.
fn link_into_store(file: &Path, root: &Path, id: &TraceId) -> Result<()> {
    let dest = root.join("traces").join(format!("{id}.msgpack"));
    std::os::unix::fs::symlink(file, &dest)
        .with_context(|| format!("cannot link {} into {}", file.display(), root.display()))
}

/// Opens `url` in the user's browser: `$BROWSER`, else `xdg-open`, else `open`. Where none
/// starts, the link printed before is the way in.
fn open_browser(url: &str) {
    let from_env = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty());
    let candidates = from_env
        .into_iter()
        .chain(["xdg-open".to_owned(), "open".to_owned()]);
    for program in candidates {
        let started = std::process::Command::new(&program)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if started.is_ok() {
            return;
        }
    }
    eprintln!("gpucollect view: no browser could be started; open the link above");
}
