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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Call, DeviceSample, History, Truth};

    /// The document has exactly the fields the Python side reads (README's schema).
    #[test]
    fn document_has_the_documented_schema() {
        let s = Scenario {
            name: "x".into(),
            description: String::new(),
            truth: Truth::leak(&["metrics.py:33"], 4096),
            history: History::Trace(Vec::new()),
            calls: vec![Call {
                function: "train_step".into(),
                file: "train.py".into(),
                line: 102,
                start_s: 1.0,
                end_s: 1.5,
                allocated_before: 1,
                allocated_after: 2,
                reserved_before: 3,
                reserved_after: 4,
                peak_allocated: 5,
                pid: 7,
            }],
            device_samples: vec![DeviceSample {
                t_s: 1.2,
                used: 10,
                total: 20,
                reserved: 3,
                allocated: 1,
                device: 0,
            }],
        };
        let d = document(&s);
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            k.sort();
            k
        };
        assert_eq!(keys(&d), ["calls", "device_samples", "scenario", "truth"]);
        assert_eq!(
            keys(&d["truth"]),
            ["bytes", "class", "locations", "verdict"]
        );
        assert_eq!(d["truth"]["class"], "leak");
        assert_eq!(
            keys(&d["calls"][0]),
            [
                "allocated_after",
                "allocated_before",
                "end_s",
                "file",
                "function",
                "line",
                "peak_allocated",
                "pid",
                "reserved_after",
                "reserved_before",
                "start_s"
            ]
        );
        assert_eq!(
            keys(&d["device_samples"][0]),
            ["allocated", "device", "reserved", "t_s", "total", "used"]
        );
        assert_eq!(
            document(&Scenario {
                truth: Truth::Healthy,
                ..s
            })["truth"],
            serde_json::json!({"verdict": "healthy"})
        );
    }
}
