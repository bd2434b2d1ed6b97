//! `gpucollect diff A B`: what changed between two traces (before/after, rank 0 vs rank 3):
//! peak, live at end, score, per call site and per scope, and the findings that appeared or
//! went away.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{OutputFormat, load_config};
use crate::{input, output, render_text};

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The "before" trace.
    pub before: PathBuf,
    /// The "after" trace.
    pub after: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// Detector thresholds as JSON (any subset of the `config` keys of the JSON report).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Skip frames whose function, file or module contains TEXT when naming the user's line
    /// (repeatable; on top of the built-in rules for the Python standard library, installed
    /// packages, torch and the CUDA libraries). The full stack stays in the report.
    #[arg(long = "hide-frame", value_name = "TEXT")]
    pub hide_frame: Vec<String>,
}

pub fn run(a: DiffArgs) -> Result<u8> {
    let config = load_config(a.config.as_deref(), &a.hide_frame)?;
    let before = crate::threads::analyze(&input::load_trace(&a.before)?, &config);
    let after = crate::threads::analyze(&input::load_trace(&a.after)?, &config);
    let d = analysis_core::analysis::diff::diff(&before, &after);
    match a.format {
        OutputFormat::Json => output::print(&(serde_json::to_string_pretty(&d)? + "\n"))?,
        OutputFormat::Text => output::print(&render_text::render_diff(
            &d,
            &a.before.display().to_string(),
            &a.after.display().to_string(),
        ))?,
    }
    Ok(0)
}
