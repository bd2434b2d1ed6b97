//! On a trace without NVTX ranges the detectors find the iterations from a recurring call site
//! and keep the scope table per call site. Both passes held 16 to 40 bytes per allocation above
//! the model; now the first holds 8 and the second what is live at once. The whole analysis
//! runs under a counting allocator capped at half the model above it. An allocation past the
//! cap fails (the test then aborts with "memory allocation ... failed").
//!
//! Its own test binary: the allocator's cap is process-wide, so no unrelated test shares it.

use std::alloc::System;

use analysis_core::synth::{Scenario, generate};
use cap::Cap;

mod common;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

#[test]
fn a_trace_without_nvtx_ranges_is_analysed_within_half_its_model_above_it() {
    let (bytes, _) = generate(Scenario::ShortLived, 600_000, 1);
    let trace = analysis_core::load(&bytes).expect("the trace loads");
    drop(bytes);
    assert!(
        trace.model.ranges.is_empty(),
        "the scenario has no NVTX ranges"
    );
    let report = common::under_cap(
        &HEAP,
        |model| model / 2,
        || analysis_core::summarize(&trace),
    );
    assert!(report.analysis.iterations.count > 0);
}
