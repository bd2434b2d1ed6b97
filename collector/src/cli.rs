//! Argument parsing. `gpucollect SUBCOMMAND ...` runs a tool command; anything else is a program
//! to trace (`gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::capture;
use crate::commands::{check, demo, diff, html, import, report, synth, upload};
#[cfg(feature = "serve")]
use crate::commands::{serve, view};

#[derive(Debug, Parser)]
#[command(
    name = "gpucollect",
    version,
    about = "GPU memory profiler: trace every CUDA allocation, find leaks, spikes and fragmentation",
    override_usage = "gpucollect [OPTIONS] [--] PROGRAM [ARGS...] > run.msgpack\n       gpucollect <COMMAND>",
    // A first word that is no command's name starts the program to trace (after `--`, any word
    // does); the options before it are `run`'s and do not combine with a command.
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`: the same as `gpucollect run ...`.
    #[command(flatten)]
    pub run: capture::RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// First run: write the bundled demo traces and print the report of one.
    Demo(demo::DemoArgs),
    /// Analyze a trace: peak and live at end by call site, leaks, growth, trend, spikes,
    /// fragmentation, hidden memory, OOM forensics, score and recommendations.
    #[command(after_long_help = report::SCORE_HELP)]
    Report(report::ReportArgs),
    /// Check a trace against limits for CI: exit 1 with a one-line reason when one is exceeded.
    Check(check::CheckArgs),
    /// Compare two traces: peak, live at end and growth per call site and scope.
    Diff(diff::DiffArgs),
    /// Write a single self-contained HTML report (viewer and trace inlined, works offline).
    Html(html::HtmlArgs),
    /// Convert a PyTorch memory snapshot (pickle or JSON) into a trace.
    Import(import::ImportArgs),
    /// Host the viewer and shared traces: uploads, share links, wiki embeds.
    #[cfg(feature = "serve")]
    Serve(Box<serve::ServeArgs>),
    /// Share a trace: upload it to a `gpucollect serve` and print the link.
    Upload(upload::UploadArgs),
    /// Open a trace or PyTorch snapshot in the viewer, served from this machine (a local
    /// server on a free port; the browser opens on the trace).
    #[cfg(feature = "serve")]
    View(view::ViewArgs),
    /// Trace a program (the same as `gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`).
    Run(capture::RunArgs),
    /// Write a synthetic trace with known ground truth (for tests, benchmarks and demos).
    Synth(synth::SynthArgs),
}

pub fn dispatch() -> Result<u8> {
    dispatch_parsed(Cli::parse())
}

fn dispatch_parsed(cli: Cli) -> Result<u8> {
    match cli.command {
        None => {
            #[cfg(not(feature = "serve"))]
            if let Some(c) = cli
                .run
                .command
                .first()
                .and_then(|p| p.to_str())
                .filter(|p| *p == "serve" || *p == "view")
            {
                anyhow::bail!(
                    "this gpucollect was built without the server (cargo feature `serve`): build \
                     it with default features for `gpucollect {c}`, or run a program named {c} \
                     as `gpucollect -- ./{c}`"
                );
            }
            capture::run(cli.run)
        }
        Some(Command::Demo(a)) => demo::run(a),
        Some(Command::Report(a)) => report::run(a),
        Some(Command::Html(a)) => html::run(a),
        Some(Command::Import(a)) => import::run(a),
        #[cfg(feature = "serve")]
        Some(Command::Serve(a)) => serve::run(*a),
        #[cfg(feature = "serve")]
        Some(Command::View(a)) => view::run(a),
        Some(Command::Check(a)) => check::run(a),
        Some(Command::Diff(a)) => diff::run(a),
        Some(Command::Run(a)) => capture::run(a),
        Some(Command::Synth(a)) => synth::run(a),
        Some(Command::Upload(a)) => upload::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpucollect").chain(args.iter().copied()))
    }

    fn program(cli: &Cli) -> Vec<&str> {
        cli.run.command.iter().filter_map(|a| a.to_str()).collect()
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_command_name_runs_the_command() {
        let cli = parse(&["report", "t.msgpack"]).expect("parses");
        assert!(matches!(cli.command, Some(Command::Report(_))));
        let cli = parse(&["run", "-o", "t.msgpack", "./app"]).expect("parses");
        let Some(Command::Run(run)) = cli.command else {
            panic!("run expected");
        };
        assert_eq!(run.command, ["./app"]);
    }

    #[test]
    fn any_other_word_is_a_program_with_its_own_arguments() {
        let cli = parse(&["--no-stacks", "./app", "-o", "x", "report"]).expect("parses");
        assert!(cli.command.is_none());
        assert!(cli.run.no_stacks);
        assert_eq!(
            cli.run.output, None,
            "-o after the program is the program's"
        );
        assert_eq!(program(&cli), ["./app", "-o", "x", "report"]);
    }

    #[test]
    fn a_program_named_like_a_command_follows_options_or_a_double_dash() {
        let cli = parse(&["--", "report", "x"]).expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(program(&cli), ["report", "x"]);
        let cli = parse(&["-o", "t.msgpack", "report"]).expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(program(&cli), ["report"]);
    }

    #[cfg(not(feature = "serve"))]
    #[test]
    fn serve_without_the_server_feature_says_so() {
        let cli = parse(&["serve", "--addr", "127.0.0.1:0"]).expect("parses");
        let e = dispatch_parsed(cli).expect_err("no server in this build");
        assert!(e.to_string().contains("cargo feature `serve`"), "{e}");
        let cli = parse(&["view", "run.msgpack"]).expect("parses");
        let e = dispatch_parsed(cli).expect_err("no server in this build");
        assert!(e.to_string().contains("gpucollect view"), "{e}");
    }

    #[test]
    fn bad_options_and_no_arguments_are_errors() {
        let e = parse(&["--stack-depth", "0", "true"]).expect_err("0 is out of range");
        assert!(e.to_string().contains("--stack-depth"), "{e}");
        let e = parse(&[]).expect_err("nothing to do");
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        let e = parse(&["report"]).expect_err("report needs a trace");
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }
}
