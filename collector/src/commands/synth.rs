//! `gpucollect synth SCENARIO`: writes a synthetic trace with known ground truth.

use std::path::PathBuf;

use analysis_core::synth::{Scenario, generate};
use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Scenario: training-leak, cache-plateau, spikes, short-lived, multi-device,
    /// stream-ordered, context-reset, oom, clean, exception-leak, fragmented, hidden-growth,
    /// nvtx-leak, requests (or `list`).
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
    /// Record one allocation in N 30 µs early, as threads' or processes' records reach the
    /// collector's ring out of order (allocation times that step back).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub out_of_order: Option<u64>,
    /// Write it as framework capture records it: every device allocation a framework block
    /// inside one driver allocation (FORMAT.md, "Two layers").
    #[arg(long)]
    pub framework_capture: bool,
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
    let (mut bytes, truth) = generate(scenario, a.events, a.seed);
    if a.framework_capture {
        bytes = analysis_core::synth::as_framework_capture(&bytes);
    }
    if let Some(every) = a.out_of_order {
        let every = usize::try_from(every).unwrap_or(usize::MAX);
        bytes = analysis_core::synth::with_allocations_out_of_order(&bytes, every, 30_000);
    }
    crate::output::write_trace(a.output.as_deref(), &bytes)?;
    if a.truth {
        eprintln!("{}", serde_json::to_string_pretty(&truth)?);
    }
    Ok(0)
}
