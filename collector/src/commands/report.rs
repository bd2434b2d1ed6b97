//! `gpucollect report TRACE`: the full analysis (summary, findings, score, recommendations and
//! every detector's section) for people, or the `Report` as JSON for scripts.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{OutputFormat, load_config};
use crate::{input, output, render_text};

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
    /// Skip frames whose function, file or module contains TEXT when naming the user's line
    /// (repeatable; on top of the built-in rules for the Python standard library, installed
    /// packages, torch and the CUDA libraries). The full stack stays in the report.
    #[arg(long = "hide-frame", value_name = "TEXT")]
    pub hide_frame: Vec<String>,
}

/// How the score is made, for `gpucollect report --help`.
pub const SCORE_HELP: &str = "\
Findings are problems (warning or critical), one per cause, ranked by harm: severity, then the
bytes the problem costs or puts at risk over the next hour of the program (growth per hour plus
what it holds, capped at the device's memory; a failed allocation first). Notes (caches, memory
live at a snapshot, bounded growth, churn) are facts, not problems.

Score = 100 - 30 per critical finding - 15 per warning, at least 0; notes cost nothing.
Grade: A >= 90, B >= 80, C >= 70, D >= 60, else F. A program with no problem scores 100 (A),
one warning 85 (B), one critical finding 70 (C).

A leak is memory of one call site that grows in every third of the steady-state iterations
(after the warm-up ones), or that a finished program never freed. Its line is the first frame
of your own code: frames of the Python standard library, installed packages, torch and the CUDA
libraries are skipped (--hide-frame skips more).";

pub fn run(a: ReportArgs) -> Result<u8> {
    let config = load_config(a.config.as_deref(), &a.hide_frame)?;
    let trace = input::load_trace(&a.trace)?;
    let report = crate::threads::analyze(&trace, &config);
    match a.format {
        OutputFormat::Json => output::print(&(serde_json::to_string_pretty(&report)? + "\n"))?,
        OutputFormat::Text => output::print(&render_text::render(&report))?,
    }
    // A trace cut short by a decode error still reports; the exit code says it was damaged.
    Ok(if report.fatal.is_some() { 1 } else { 0 })
}
