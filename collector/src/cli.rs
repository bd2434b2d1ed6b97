//! Argument parsing. `gpucollect SUBCOMMAND ...` runs a tool command; anything else is a program
//! to trace (`gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).

use anyhow::Result;
use std::ffi::OsString;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::{cmd_report, cmd_run, cmd_synth};

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
    /// Summarize a trace: devices, peak with its call sites, live at end, failures, warnings.
    Report(cmd_report::ReportArgs),
    /// Trace a program (the same as `gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).
    Run(cmd_run::RunArgs),
    /// Write a synthetic trace with known ground truth (for tests, benchmarks and demos).
    Synth(cmd_synth::SynthArgs),
}

/// Subcommand names; any other first argument is a program to trace.
const SUBCOMMANDS: &[&str] = &[
    "report",
    "run",
    "synth",
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
            Command::Report(a) => cmd_report::run(a),
            Command::Run(a) => cmd_run::run(a),
            Command::Synth(a) => cmd_synth::run(a),
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
