//! `gpucollect`: the command-line entry point. It only parses arguments and dispatches.
//!
//! - `capture/`: tracing a program (`gpucollect ./app`, `gpucollect run`): spawning it with the
//!   injection library, draining the ring into the trace, symbolizing, NVML sampling.
//! - `commands/`: the analysis and sharing commands, one module each.
//! - `serve/`: the server behind `gpucollect serve` (cargo feature `serve`, on by default).
//! - Shared by commands: `input` (reading traces and snapshots), `output` (stdout and trace
//!   files), `render_text` (the terminal report), `export_html` and `assets` (the viewer's files,
//!   for `html` and `serve`).

mod assets;
mod capture;
mod cli;
mod commands;
mod decode_ahead;
mod export_html;
mod input;
mod output;
mod read_ahead;
mod render_text;
#[cfg(feature = "serve")]
mod serve;
mod spill;
mod threads;

use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::dispatch() {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("gpucollect: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
