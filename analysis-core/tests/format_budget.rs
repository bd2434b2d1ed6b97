//! The format's size budget: at most 16 bytes per alloc/free record on average, on each of the
//! synthetic workloads (a leaking and a clean training loop, short-lived churn). Prints the
//! measured figures.

use analysis_core::synth::{Scenario, generate};

#[test]
fn training_workload_stays_within_16_bytes_per_event() {
    for scenario in [
        Scenario::TrainingLeak,
        Scenario::Clean,
        Scenario::ShortLived,
    ] {
        let (bytes, truth) = generate(scenario, 200_000, 1);
        let events = truth.alloc_count + truth.free_count;
        let per_event = bytes.len() as f64 / events as f64;
        println!(
            "{}: {} bytes for {} alloc/free events (+{} other records) = {:.2} bytes/event",
            scenario.name(),
            bytes.len(),
            events,
            truth.records - events,
            per_event
        );
        assert!(
            per_event <= 16.0,
            "{}: {per_event:.2} bytes/event exceeds the 16-byte budget",
            scenario.name()
        );
    }
}
