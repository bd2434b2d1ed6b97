//! `gpucollect report TRACE`: the full analysis (summary, findings, score, recommendations and
//! every detector's section) for people, or the `Report` as JSON for scripts.

use std::path::{Path, PathBuf};

use analysis_core::Config;
use anyhow::{Context, Result};
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
    /// Detector thresholds as JSON (any subset of the `config` keys of the JSON report).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Reads detector thresholds from a JSON file; the defaults (the reference rules) otherwise.
pub fn load_config(path: Option<&Path>) -> Result<Config> {
    let Some(path) = path else {
        return Ok(Config::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "the config is not valid: give a JSON object with keys from the report's `analysis.config` in {}",
            path.display()
        )
    })
}

pub fn run(a: ReportArgs) -> Result<u8> {
    let config = load_config(a.config.as_deref())?;
    let trace = input::load_trace(&a.trace)?;
    let report = analysis_core::analyze(&trace, &config);
    match a.format {
        OutputFormat::Json => output::print(&(serde_json::to_string_pretty(&report)? + "\n"))?,
        OutputFormat::Text => output::print(&render_text::render(&report))?,
    }
    // A trace cut short by a decode error still reports; the exit code says it was damaged.
    Ok(if report.fatal.is_some() { 1 } else { 0 })
}
