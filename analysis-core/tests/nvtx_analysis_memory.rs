//! On a trace with NVTX ranges around every step, the detectors had held a vector of every
//! step's start and peak, and the scopes a scope index and a growth per range instance: the
//! analysis of 600k events of `nvtx-leak` took 16 to 20 % of the model above it. Now the starts
//! and peaks are packed columns, and a scope is found from its instance's name. The whole
//! analysis runs under a counting allocator capped at an eighth of the model above it (it takes
//! about 8 %). An allocation past the cap fails (the test then aborts with "memory allocation
//! ... failed").
//!
//! Its own test binary: the allocator's cap is process-wide, so no unrelated test shares it.

use std::alloc::System;

use analysis_core::report::IterationSource;
use analysis_core::synth::{Scenario, generate};
use cap::Cap;

mod common;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

#[test]
fn a_trace_with_ranges_around_every_step_is_analysed_within_an_eighth_of_its_model_above_it() {
    let (bytes, _) = generate(Scenario::NvtxLeak, 600_000, 1);
    let trace = analysis_core::load(&bytes).expect("the trace loads");
    drop(bytes);
    assert!(
        trace.model.ranges.len() > 50_000,
        "ranges around every step"
    );
    let report = common::under_cap(
        &HEAP,
        |model| model / 8,
        || analysis_core::summarize(&trace),
    );
    assert_eq!(
        report.analysis.iterations.source,
        IterationSource::NvtxRange
    );
    assert!(report.analysis.iterations.count > 50_000);
}
