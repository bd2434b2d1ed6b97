//! Full analysis time against decode+replay time on the synthetic training workload
//! (10M events by default; `GPUCOLLECT_BENCH_EVENTS` overrides).
//! `cargo bench -p analysis-core --bench analysis`. The budget: analysis ≤ 2× decode+replay.

use analysis_core::synth::{Scenario, generate};
use analysis_core::{Config, analyze, load};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn events_from_env() -> u64 {
    std::env::var("GPUCOLLECT_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

fn bench(c: &mut Criterion) {
    let events = events_from_env();
    let config = Config::default();
    let mut g = c.benchmark_group("analysis");
    g.sample_size(10);
    for scenario in [Scenario::TrainingLeak, Scenario::MultiDevice] {
        let (bytes, truth) = generate(scenario, events, 1);
        let n = truth.alloc_count + truth.free_count;
        eprintln!(
            "{}: {} bytes, {} alloc/free events, {} records",
            scenario.name(),
            bytes.len(),
            n,
            truth.records
        );
        g.throughput(Throughput::Elements(n));
        g.bench_function(format!("{}/decode+replay", scenario.name()), |b| {
            b.iter(|| load(&bytes).map(|t| t.model.peak_bytes))
        });
        let trace = load(&bytes).expect("synthetic trace loads");
        g.bench_function(format!("{}/analyze", scenario.name()), |b| {
            b.iter(|| analyze(&trace, &config).score)
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
