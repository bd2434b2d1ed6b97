//! Decode and decode+replay throughput on the synthetic training workload (10M events).
//! `cargo bench -p analysis-core --bench decode`; figures go to docs/benchmarks.md.

use analysis_core::synth::{Scenario, generate};
use analysis_core::{Decoder, load};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn events_from_env() -> u64 {
    std::env::var("GPUCOLLECT_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

fn bench(c: &mut Criterion) {
    let events = events_from_env();
    let (bytes, truth) = generate(Scenario::TrainingLeak, events, 1);
    let n = truth.alloc_count + truth.free_count;
    eprintln!(
        "trace: {} bytes, {} alloc/free events, {} records, {:.2} bytes/event",
        bytes.len(),
        n,
        truth.records,
        bytes.len() as f64 / n as f64
    );
    let mut g = c.benchmark_group("trace");
    g.sample_size(10);
    g.throughput(Throughput::Elements(n));
    g.bench_function("decode", |b| {
        b.iter(|| {
            let mut d = Decoder::new();
            d.push(&bytes);
            let mut k = 0u64;
            while let Ok(Some(_)) = d.next_record() {
                k += 1;
            }
            k
        })
    });
    g.bench_function("decode+replay", |b| {
        b.iter(|| load(&bytes).map(|t| t.model.peak_bytes))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
