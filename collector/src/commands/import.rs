//! `gpucollect import SNAPSHOT -o run.msgpack`: converts a PyTorch memory snapshot
//! (`torch.cuda.memory._dump_snapshot` pickle, or the same data as JSON) into a trace.
//! `report`, `check` and `diff` also accept snapshots directly.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The snapshot (.pickle or .json).
    pub snapshot: PathBuf,
    /// Output trace file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(a: ImportArgs) -> Result<u8> {
    // Its first bytes say what it is; the rest is read in pieces and parsed as it comes.
    let (mut file, size, first) = crate::input::open_with_head(&a.snapshot, "snapshot")?;
    if !analysis_core::torch_snapshot::looks_like_snapshot(&first) {
        bail!(
            "{} is neither a pickle nor JSON: give a file written by torch.cuda.memory._dump_snapshot",
            a.snapshot.display()
        );
    }
    let (trace, summary) =
        crate::input::convert_snapshot_file(&first, &mut file, size, &a.snapshot)?;
    crate::output::write_trace(a.output.as_deref(), &trace)?;
    eprintln!(
        "imported {} trace entries on {} device(s): {} allocations, {} blocks from before the \
         history, {} frees of never-seen blocks, {} failed allocations, {} annotated ranges",
        summary.trace_entries,
        summary.devices,
        summary.allocations,
        summary.reconstructed_blocks,
        summary.ghost_frees,
        summary.failed_allocations,
        summary.ranges
    );
    for (what, n) in &summary.skipped {
        eprintln!("gpucollect: warning: skipped {n} entries: {what}");
    }
    Ok(0)
}
