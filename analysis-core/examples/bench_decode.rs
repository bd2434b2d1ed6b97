//! Decode+replay throughput as a plain program, so the same code can be timed natively and as
//! WebAssembly (wasm32-wasip1 under Node): see scripts/bench-wasm.sh.
//! Usage: bench_decode [EVENTS] [ROUNDS]

use std::time::Instant;

use analysis_core::load;
use analysis_core::synth::{Scenario, generate};

fn main() {
    let mut args = std::env::args().skip(1);
    let events: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let (bytes, truth) = generate(Scenario::TrainingLeak, events, 1);
    let n = truth.alloc_count + truth.free_count;
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t0 = Instant::now();
        let t = load(&bytes).expect("synthetic trace loads");
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!(t.model.peak_bytes, truth.peak_bytes);
        best = best.min(secs);
    }
    println!(
        "{{\"target\":\"{}\",\"events\":{n},\"bytes\":{},\"bytes_per_event\":{:.2},\"best_secs\":{best:.4},\"events_per_sec\":{:.0}}}",
        std::env::consts::ARCH,
        bytes.len(),
        bytes.len() as f64 / n as f64,
        n as f64 / best
    );
}
