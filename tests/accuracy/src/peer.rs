//! The export for the peer comparison (stormlog / gpumemprof, Python side in `peer/`): one JSON
//! file per scenario with its truth, the calls a decorator-based profiler would have wrapped
//! (with the framework's allocated/reserved counters around each), and the device samples.
//! The schema is in `tests/accuracy/README.md`.

use std::path::Path;

use serde_json::json;

use crate::scenario::Scenario;

/// The JSON document for one scenario.
pub fn document(s: &Scenario) -> serde_json::Value {
    json!({
        "scenario": s.name,
        "truth": s.truth,
        "calls": s.calls,
        "device_samples": s.device_samples,
    })
}

/// Writes `DIR/<scenario>.json` for every scenario; returns how many it wrote.
pub fn export(dir: &Path, scenarios: &[Scenario]) -> anyhow::Result<usize> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the export folder {}", dir.display()))?;
    for s in scenarios {
        let path = dir.join(format!("{}.json", s.name));
        let bytes = serde_json::to_vec_pretty(&document(s))?;
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(scenarios.len())
}
