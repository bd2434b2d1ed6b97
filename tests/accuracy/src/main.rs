//! `gpucollect-accuracy`: runs the corpus and prints the accuracy table, or exports it for the
//! peer comparison.
//!
//!     cargo run -p gpucollect-accuracy --release -- table [--write-baseline]
//!     cargo run -p gpucollect-accuracy --release -- list
//!     cargo run -p gpucollect-accuracy --release -- export-peer DIR

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use gpucollect_accuracy::{corpus, peer, run};

#[derive(Parser)]
#[command(about = "Accuracy of gpucollect's findings on a realistic corpus with labelled truth")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the markdown table (one row per scenario) and the totals.
    Table {
        /// Also write tests/accuracy/baseline.json with today's verdicts.
        #[arg(long)]
        write_baseline: bool,
    },
    /// List the scenarios: name, history, truth and what the program does.
    List,
    /// Write DIR/<scenario>.json for the stormlog comparison.
    ExportPeer { dir: PathBuf },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let scenarios = corpus::all();
    match cli.command {
        Command::Table { write_baseline } => {
            let mut outcomes = Vec::new();
            for s in &scenarios {
                outcomes.push(run::evaluate(s).with_context(|| format!("scenario {}", s.name))?);
            }
            print!("{}", run::table(&outcomes));
            if write_baseline {
                let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("baseline.json");
                let mut text = serde_json::to_string_pretty(&run::baseline(&outcomes))?;
                text.push('\n');
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Command::List => {
            println!("| Scenario | History | Truth | What the program does |\n|---|---|---|---|");
            for s in &scenarios {
                println!(
                    "| {} | {} ({} KiB) | {} | {} |",
                    s.name,
                    s.history.kind(),
                    s.history.len() / 1024,
                    s.truth.label(),
                    s.description
                );
            }
        }
        Command::ExportPeer { dir } => {
            let n = peer::export(&dir, &scenarios)?;
            eprintln!("wrote {n} scenarios to {}", dir.display());
        }
    }
    Ok(())
}
