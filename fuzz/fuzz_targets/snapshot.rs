//! Snapshot importer fuzz target: arbitrary bytes given as a PyTorch memory snapshot (pickle or
//! JSON) must never panic; whatever converts must decode as a trace and summarize.
#![no_main]

use analysis_core::report::summarize;
use analysis_core::{load, torch_snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((trace, _)) = torch_snapshot::convert(data) {
        let loaded = load(&trace).expect("a converted snapshot is a valid trace");
        let _ = summarize(&loaded);
    }
});
