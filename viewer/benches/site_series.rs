//! The stacked timeline's cost on big traces: building every call site's series (once per
//! filter, after the first draw) and sampling the top sites once per pixel column (every draw).
//! `cargo bench -p viewer --bench site_series` (1M events by default;
//! `GPUCOLLECT_BENCH_EVENTS` overrides).

use analysis_core::synth::{Scenario, generate};
use criterion::{Criterion, criterion_group, criterion_main};
use viewer::data::TraceData;
use viewer::filter::Filter;
use viewer::site_series::{SiteSeries, stack_columns};

mod common;

fn bench(c: &mut Criterion) {
    let events = common::events_from_env();
    let mut g = c.benchmark_group("site_series");
    g.sample_size(10);
    for scenario in [Scenario::TrainingLeak, Scenario::Spikes] {
        let (bytes, _) = generate(scenario, events, 1);
        let a = TraceData::without_report(
            analysis_core::load(&bytes).expect("synthetic trace loads"),
            scenario.name(),
        );
        let m = &a.trace.model;
        let f = Filter::default();
        g.bench_function(format!("{}/build", scenario.name()), |b| {
            b.iter(|| SiteSeries::build(m, &f, false).sites.len())
        });
        let sites = SiteSeries::build(m, &f, false);
        let points: usize = sites.sites.iter().map(|s| s.timeline.len()).sum();
        eprintln!(
            "{}: {} allocations, {} sites, {} points",
            scenario.name(),
            m.allocs.len(),
            sites.sites.len(),
            points
        );
        let (lo, hi) = a.time_extent();
        for (name, t0, t1) in [
            ("whole", lo, hi + 1),
            (
                "1/64",
                lo + (hi - lo) / 2,
                lo + (hi - lo) / 2 + (hi - lo) / 64,
            ),
        ] {
            g.bench_function(format!("{}/top+columns {name}", scenario.name()), |b| {
                b.iter(|| {
                    let top = sites.top_in_window(t0, t1, 8, None, None);
                    let tl: Vec<_> = top.iter().map(|s| &s.timeline).collect();
                    stack_columns(&a.total, &tl, t0, t1, 1150).columns()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
