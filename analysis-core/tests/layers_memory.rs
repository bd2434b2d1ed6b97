//! The framework layer's view (`layers::tensor_view`) shares the history's columns with the
//! model and merges its events as it goes: made under a counting allocator capped at 1.4 times
//! the model above it, it fits, where copying the history and sorting every event took about
//! twice the model. An allocation past the cap fails (the test then aborts with "memory
//! allocation ... failed").
//!
//! Its own test binary: the allocator's cap is process-wide, so no unrelated test shares it.

use std::alloc::System;

use analysis_core::synth::{Scenario, as_framework_capture, generate};
use cap::Cap;

mod common;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

#[test]
fn the_framework_view_does_not_copy_the_history() {
    let (plain, _) = generate(Scenario::TrainingLeak, 400_000, 1);
    let bytes = as_framework_capture(&plain);
    drop(plain);
    let trace = analysis_core::load(&bytes).expect("the construction loads");
    drop(bytes);
    let view = common::under_cap(
        &HEAP,
        |model| model * 14 / 10,
        || analysis_core::layers::tensor_view(&trace.model),
    );
    let view = view.expect("a framework layer");
    // The view is the tensors' layer: the blocks are device memory.
    assert!(view.peak_bytes > 0);
    assert_eq!(view.allocs.len(), trace.model.allocs.len());
}
