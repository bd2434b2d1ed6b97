//! `gpucollect synth SCENARIO`: writes a synthetic trace with known ground truth.

use std::path::PathBuf;

use analysis_core::synth::{Scenario, generate};
use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Scenario: training-leak, cache-plateau, spikes, short-lived, multi-device,
    /// stream-ordered, context-reset, oom, clean, exception-leak, fragmented, hidden-growth,
    /// nvtx-leak (or `list`).
    pub scenario: String,
    /// Approximate number of allocation and free events.
    #[arg(long, default_value_t = 20_000)]
    pub events: u64,
    /// Random seed (the same seed gives the same trace).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also print the ground truth as JSON on stderr.
    #[arg(long)]
    pub truth: bool,
}

pub fn run(a: SynthArgs) -> Result<u8> {
    if a.scenario == "list" {
        let list: String = Scenario::ALL
            .iter()
            .map(|s| format!("{:16} {}\n", s.name(), s.description()))
            .collect();
        crate::output::print(&list)?;
        return Ok(0);
    }
    let Some(scenario) = Scenario::from_name(&a.scenario) else {
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        bail!(
            "unknown scenario `{}`: choose one of {}",
            a.scenario,
            names.join(", ")
        );
    };
    let (bytes, truth) = generate(scenario, a.events, a.seed);
    crate::output::write_trace(a.output.as_deref(), &bytes)?;
    if a.truth {
        eprintln!("{}", serde_json::to_string_pretty(&truth)?);
    }
    Ok(0)
}
