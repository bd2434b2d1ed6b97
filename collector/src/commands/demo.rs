//! `gpucollect demo`: the embedded default for a first run. It writes the bundled synthetic
//! scenarios (known ground truth) to a folder and prints the report of one of them.

use std::path::PathBuf;

use analysis_core::synth::{Scenario, generate};
use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{input, output, render_text};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Scenario whose report is printed (`gpucollect synth list` shows them all).
    #[arg(default_value = "training-leak")]
    pub scenario: String,
    /// Folder the demo traces are written to.
    #[arg(long, default_value = "target/demo-traces")]
    pub dir: PathBuf,
    /// Approximate number of allocation and free events per trace.
    #[arg(long, default_value_t = 200_000)]
    pub events: u64,
}

pub fn run(a: DemoArgs) -> Result<u8> {
    let Some(shown) = Scenario::from_name(&a.scenario) else {
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        bail!(
            "unknown scenario `{}`: choose one of {}",
            a.scenario,
            names.join(", ")
        );
    };
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create the demo folder {}", a.dir.display()))?;
    let mut shown_path = None;
    for s in Scenario::ALL {
        let (bytes, _) = generate(s, a.events, 1);
        let path = a.dir.join(format!("{}.msgpack", s.name()));
        std::fs::write(&path, &bytes)
            .with_context(|| format!("cannot write the demo trace {}", path.display()))?;
        if s == shown {
            shown_path = Some(path);
        }
    }
    let path = shown_path.context("the chosen scenario was not generated")?;
    let trace = input::load_trace(&path)?;
    let report = analysis_core::summarize(&trace);
    output::print(&render_text::render(&report))?;
    eprintln!(
        "\nDemo traces ({} scenarios) are in {}; open one with `gpucollect report FILE`.",
        Scenario::ALL.len(),
        a.dir.display()
    );
    Ok(0)
}
