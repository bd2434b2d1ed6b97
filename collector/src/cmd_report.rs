//! `gpucollect report TRACE`: the trace summary for people, or JSON for scripts.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::{input, output, render_text};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Trace file, or `-` for stdin.
    pub trace: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

pub fn run(a: ReportArgs) -> Result<u8> {
    let trace = input::load_trace(&a.trace)?;
    let report = analysis_core::summarize(&trace);
    match a.format {
        OutputFormat::Json => output::print(&(serde_json::to_string_pretty(&report)? + "\n"))?,
        OutputFormat::Text => output::print(&render_text::render(&report))?,
    }
    // A trace cut short by a decode error still reports; the exit code says it was damaged.
    Ok(if report.fatal.is_some() { 1 } else { 0 })
}
