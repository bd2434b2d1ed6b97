//! `gpucollect check TRACE`: a CI gate. Analyzes the trace and exits 1 with a one-line reason
//! when a limit is exceeded (leaked bytes, peak bytes, findings of a given severity); exit 2
//! stays for usage and input errors.

use std::path::PathBuf;

use analysis_core::Report;
use analysis_core::analysis::Severity;
use analysis_core::units::{fmt_bytes, parse_bytes};
use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::input;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Warning,
    Critical,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Trace file, or `-` for stdin.
    pub trace: PathBuf,
    /// Fail when more than this is leaked (live at the end and not freed), e.g. 512MiB or 2GB.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_arg)]
    pub max_leaked: Option<u64>,
    /// Fail when device live bytes peak above this, e.g. 40GiB.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_arg)]
    pub max_peak: Option<u64>,
    /// Fail when there is any finding of this severity or worse.
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    /// Detector thresholds as JSON (any subset of the `config` keys of the JSON report).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Skip frames whose function, file or module contains TEXT when naming the user's line
    /// (repeatable; on top of the built-in rules for the Python standard library, installed
    /// packages, torch and the CUDA libraries). The full stack stays in the report.
    #[arg(long = "hide-frame", value_name = "TEXT")]
    pub hide_frame: Vec<String>,
}

fn parse_bytes_arg(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

/// The limits of a check, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_leaked_bytes: Option<u64>,
    pub max_peak_bytes: Option<u64>,
    pub fail_on: Option<Severity>,
}

/// Every limit the report exceeds, as sentences, most important first.
pub fn violations(r: &Report, l: &Limits) -> Vec<String> {
    let mut out = Vec::new();
    // A process that ran untraced could have leaked anything: never vouch for it.
    if let Some(first) = r.capture_incomplete.first() {
        out.push(format!("the capture is incomplete: {first}"));
    }
    let leaks: Vec<_> = r.findings.iter().filter(|f| f.kind.is_leak()).collect();
    let leaked: u64 = leaks.iter().map(|f| f.bytes).sum();
    if let Some(max) = l.max_leaked_bytes
        && leaked > max
    {
        let top = leaks
            .iter()
            .max_by_key(|f| f.bytes)
            .map(|f| format!(", mostly {} from {}", fmt_bytes(f.bytes), f.site))
            .unwrap_or_default();
        out.push(format!(
            "leaked {} exceeds --max-leaked {}{top}",
            fmt_bytes(leaked),
            fmt_bytes(max)
        ));
    }
    if let Some(max) = l.max_peak_bytes
        && r.peak_bytes > max
    {
        let top = r
            .peak_sites
            .first()
            .map(|s| format!(", largest {} from {}", fmt_bytes(s.bytes), s.site))
            .unwrap_or_default();
        out.push(format!(
            "peak {} exceeds --max-peak {}{top}",
            fmt_bytes(r.peak_bytes),
            fmt_bytes(max)
        ));
    }
    if let Some(level) = l.fail_on
        && let Some(f) = r.findings.iter().find(|f| f.severity >= level)
    {
        let n = r.findings.iter().filter(|f| f.severity >= level).count();
        out.push(format!(
            "{n} finding(s) at {} or worse; first: {} {} at {}",
            level.name(),
            f.severity.name(),
            f.kind.name(),
            f.site
        ));
    }
    out
}

pub fn run(a: CheckArgs) -> Result<u8> {
    let config = super::load_config(a.config.as_deref(), &a.hide_frame)?;
    let trace = input::load_trace(&a.trace)?;
    let report = crate::threads::analyze(&trace, &config);
    if let Some(e) = &report.fatal {
        eprintln!(
            "gpucollect check: warning: the trace is damaged, checking what was decoded: {e}"
        );
    }
    let limits = Limits {
        max_leaked_bytes: a.max_leaked,
        max_peak_bytes: a.max_peak,
        fail_on: a.fail_on.map(|f| match f {
            FailOn::Warning => Severity::Warning,
            FailOn::Critical => Severity::Critical,
        }),
    };
    let v = violations(&report, &limits);
    match v.split_first() {
        Some((first, rest)) => {
            let more = if rest.is_empty() {
                String::new()
            } else {
                format!(" (and {} more)", rest.len())
            };
            eprintln!("gpucollect check: FAIL: {first}{more}");
            Ok(1)
        }
        None => {
            let leaked: u64 = report
                .findings
                .iter()
                .filter(|f| f.kind.is_leak())
                .map(|f| f.bytes)
                .sum();
            crate::output::print(&format!(
                "gpucollect check: ok: peak {}, leaked {}, {} finding(s), score {} ({})\n",
                fmt_bytes(report.peak_bytes),
                fmt_bytes(leaked),
                report.findings.len(),
                report.score,
                report.grade
            ))?;
            Ok(0)
        }
    }
}
