//! Argument parsing. `gpucollect SUBCOMMAND ...` runs a tool command; anything else is a program
//! to trace (`gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).

use anyhow::Result;
use std::ffi::OsString;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::{
    cmd_check, cmd_demo, cmd_diff, cmd_html, cmd_import, cmd_report, cmd_run, cmd_serve, cmd_synth,
    cmd_upload,
};

#[derive(Debug, Parser)]
#[command(
    name = "gpucollect",
    version,
    about = "GPU memory profiler: trace every CUDA allocation, find leaks, spikes and fragmentation",
    after_help = "To trace a program: gpucollect [OPTIONS] [--] PROGRAM [ARGS...] > run.msgpack"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// First run: write the bundled demo traces and print the report of one.
    Demo(cmd_demo::DemoArgs),
    /// Analyze a trace: peak and live at end by call site, leaks, growth, trend, spikes,
    /// fragmentation, hidden memory, OOM forensics, score and recommendations.
    #[command(after_long_help = cmd_report::SCORE_HELP)]
    Report(cmd_report::ReportArgs),
    /// Check a trace against limits for CI: exit 1 with a one-line reason when one is exceeded.
    Check(cmd_check::CheckArgs),
    /// Compare two traces: peak, live at end and growth per call site and scope.
    Diff(cmd_diff::DiffArgs),
    /// Write a single self-contained HTML report (viewer and trace inlined, works offline).
    Html(cmd_html::HtmlArgs),
    /// Convert a PyTorch memory snapshot (pickle or JSON) into a trace.
    Import(cmd_import::ImportArgs),
    /// Host the viewer and shared traces: uploads, share links, wiki embeds.
    Serve(cmd_serve::ServeArgs),
    /// Share a trace: upload it to a `gpucollect serve` and print the link.
    Upload(cmd_upload::UploadArgs),
    /// Trace a program (the same as `gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).
    Run(cmd_run::RunArgs),
    /// Write a synthetic trace with known ground truth (for tests, benchmarks and demos).
    Synth(cmd_synth::SynthArgs),
}

/// Subcommand names; any other first argument is a program to trace.
const SUBCOMMANDS: &[&str] = &[
    "demo",
    "report",
    "check",
    "diff",
    "html",
    "import",
    "run",
    "serve",
    "synth",
    "upload",
    "help",
    "-h",
    "--help",
    "-V",
    "--version",
];

pub fn dispatch() -> Result<u8> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    if args.len() < 2 || SUBCOMMANDS.contains(&first) {
        let cli = Cli::parse_from(&args);
        return match cli.command {
            Command::Demo(a) => cmd_demo::run(a),
            Command::Report(a) => cmd_report::run(a),
            Command::Html(a) => cmd_html::run(a),
            Command::Import(a) => cmd_import::run(a),
            Command::Serve(a) => cmd_serve::run(a),
            Command::Check(a) => cmd_check::run(a),
            Command::Diff(a) => cmd_diff::run(a),
            Command::Run(a) => cmd_run::run(a),
            Command::Synth(a) => cmd_synth::run(a),
            Command::Upload(a) => cmd_upload::run(a),
        };
    }
    // Anything else is a program to trace: parse it as `gpucollect run ...`.
    let run_args =
        std::iter::once(OsString::from("gpucollect run")).chain(args.into_iter().skip(1));
    let cmd = cmd_run::RunArgs::augment_args(clap::Command::new("gpucollect"))
        .override_usage("gpucollect [OPTIONS] [--] PROGRAM [ARGS...]");
    let matches = cmd
        .try_get_matches_from(run_args)
        .unwrap_or_else(|e| e.exit());
    let a = cmd_run::RunArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cmd_run::run(a)
}
