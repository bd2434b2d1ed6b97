//! `gpucollect html TRACE -o report.html`: a single self-contained HTML report (viewer and
//! trace inlined, no network access) for wikis that only take attachments.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::assets::Assets;
use crate::export_html::{ViewerFiles, build};

#[derive(Debug, Args)]
pub struct HtmlArgs {
    /// The trace (or PyTorch snapshot) to embed.
    pub trace: PathBuf,
    /// Output HTML file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Use the viewer in this folder instead of the one built into the binary.
    #[arg(long)]
    pub assets: Option<PathBuf>,
}

pub fn run(a: HtmlArgs) -> Result<u8> {
    let assets = match &a.assets {
        Some(d) => Assets::from_dir(d)?,
        None => Assets::embedded(),
    };
    if !assets.has_viewer() {
        bail!(
            "this gpucollect was built without the viewer: run `trunk build --release` at the repository root and rebuild, or pass --assets DIR"
        );
    }
    let (mut file, size, first) = crate::input::open_with_head(&a.trace, "trace")?;
    // Anything that is not a trace is refused before a page is built around it.
    let trace = if analysis_core::torch_snapshot::looks_like_snapshot(&first) {
        // A snapshot is converted as it is read, never held whole.
        let trace = crate::input::convert_snapshot_file(&first, &mut file, size, &a.trace)?.0;
        analysis_core::load(&trace)
            .with_context(|| format!("{} is not a trace", a.trace.display()))?;
        trace
    } else {
        // Decoded as it is read: reading stops where the bytes stop being a trace.
        crate::input::read_trace_bytes(first, &mut file, &a.trace)?
    };
    let index = String::from_utf8_lossy(assets.index()).into_owned();
    let files = assets.files();
    let viewer = ViewerFiles {
        index_html: &index,
        files,
    };
    let title = a
        .trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let html = build(&viewer, &trace, &title)?;
    std::fs::write(&a.output, html)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    eprintln!("wrote {}", a.output.display());
    Ok(0)
}
