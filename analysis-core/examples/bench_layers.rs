//! Memory of the framework layer's view (`layers::tensor_view`, what the detectors read for a
//! trace with framework capture), on a construction: the synthetic training-leak trace
//! rewritten so that every device allocation is a framework block inside one driver allocation
//! made first (the synthetic scenarios have no framework-capture variant). Prints the model's
//! heap, the view's high-water mark above it and what the view keeps, counted by a global
//! allocator (the trace is read in 1 MiB pieces, so that loading it peaks below the view).
//! Usage: bench_layers write EVENTS OUT    (the construction, for `gpucollect report` or the
//!                                          browser benchmark's `FILES=`)
//!        bench_layers measure TRACE

use analysis_core::synth::{Scenario, as_framework_capture, generate};
use cap::Cap;
use std::alloc::System;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["write", events, out] => {
            let events: u64 = events.parse().expect("EVENTS is a number");
            let (bytes, _) = generate(Scenario::TrainingLeak, events, 1);
            std::fs::write(out, as_framework_capture(&bytes)).expect("writes the trace");
        }
        ["measure", path] => measure(path),
        _ => eprintln!("usage: bench_layers write EVENTS OUT | bench_layers measure TRACE"),
    }
}

fn measure(path: &str) {
    use std::io::Read;
    let mut file = std::fs::File::open(path).expect("opens the trace");
    let mut loader = analysis_core::model::Loader::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).expect("reads the trace");
        if n == 0 {
            break;
        }
        loader.push(&buf[..n]).expect("the trace decodes");
    }
    drop(buf);
    let trace = loader.finish().expect("the trace loads");
    let model = HEAP.allocated();
    let peak_before = HEAP.max_allocated();
    let view = analysis_core::layers::tensor_view(&trace.model).expect("a framework layer");
    let kept = HEAP.allocated() - model;
    // The allocator's high-water mark is since the start: the view's own peak shows only once
    // it passes the load's.
    let peak = HEAP.max_allocated();
    let view_peak = if peak > peak_before {
        format!("{}", (peak - model) >> 20)
    } else {
        format!("at most {}", (peak_before - model) >> 20)
    };
    println!(
        "{{\"model_mib\":{},\"view_peak_above_mib\":\"{view_peak}\",\"view_kept_mib\":{}}}",
        model >> 20,
        kept >> 20
    );
    std::hint::black_box(&view);
}
