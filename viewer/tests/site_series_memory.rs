//! Building the call sites' series for the stacked timeline takes the memory of the series it
//! keeps, plus a queue bounded by the allocations live at once: no copy of the allocations,
//! which made the page's high-water mark on small traces. A counting allocator fails any
//! allocation past the budget (the test then aborts with "memory allocation ... failed").
//!
//! Its own test binary: the allocator's cap is process-wide, so no unrelated test shares it.

use std::alloc::System;

use analysis_core::model::LIVE;
use analysis_core::synth::{Scenario, generate};
use cap::Cap;
use viewer::filter::Filter;
use viewer::site_series::SiteSeries;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

/// The most device allocations live at once (what the queue of frees can hold).
fn most_live_at_once(m: &analysis_core::model::TraceModel) -> usize {
    let mut ev: Vec<(u64, i64)> = Vec::new();
    for a in m.allocs.iter() {
        if a.kind.is_device_memory() && a.size_bytes > 0 && a.free_ts_nanos > a.ts_nanos {
            ev.push((a.ts_nanos, 1));
            if a.free_ts_nanos != LIVE {
                ev.push((a.free_ts_nanos, -1));
            }
        }
    }
    // Frees before allocations at the same time: the queue pops those first.
    ev.sort_unstable();
    let (mut cur, mut most) = (0i64, 0i64);
    for (_, d) in ev {
        cur += d;
        most = most.max(cur);
    }
    most as usize
}

#[test]
fn building_the_site_series_takes_what_they_keep_and_a_queue_of_what_is_live() {
    for (scenario, events) in [
        (Scenario::TrainingLeak, 400_000),
        (Scenario::Spikes, 300_000),
        (Scenario::CachePlateau, 200_000),
    ] {
        let (bytes, _) = generate(scenario, events, 3);
        let t = analysis_core::load(&bytes).expect("synthetic trace loads");
        drop(bytes);
        let m = &t.model;
        let live = most_live_at_once(m);
        for with_whole in [false, true] {
            // What the series keep, from a first build.
            let before = HEAP.allocated();
            let kept = SiteSeries::build(m, &Filter::default(), with_whole);
            let held = HEAP.allocated() - before;
            drop(kept);
            // The same build again, within what they keep, the queue (24-byte entries in a
            // vector that may double) and 64 KiB for the per-site state.
            let budget = held + live * 48 + (64 << 10);
            HEAP.set_limit(HEAP.allocated() + budget)
                .expect("limit above current use");
            let again = SiteSeries::build(m, &Filter::default(), with_whole);
            HEAP.set_limit(usize::MAX).expect("unlimited");
            assert!(
                !again.sites.is_empty(),
                "{}: the series were built",
                scenario.name()
            );
            eprintln!(
                "{} ({events} events, {} allocations, at most {live} live at once, whole: \
                 {with_whole}): the series keep {held} bytes",
                scenario.name(),
                m.allocs.len(),
            );
        }
    }
}
