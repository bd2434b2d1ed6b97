//! `gpucollect`: the command-line entry point. It only parses arguments and dispatches; each
//! command lives in its own `cmd_*.rs` module.

mod assets;
mod cli;
mod cmd_check;
mod cmd_demo;
mod cmd_diff;
mod cmd_html;
mod cmd_import;
mod cmd_report;
mod cmd_run;
#[cfg(feature = "serve")]
mod cmd_serve;
mod cmd_synth;
mod cmd_upload;
mod export_html;
mod input;
mod nvml_sampler;
mod output;
mod proc_maps;
mod render_text;
#[cfg(feature = "serve")]
mod serve;
mod symbolize;
mod trace_writer;

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
