//! Times each phase of opening a PyTorch memory snapshot: pickle parse alone, conversion to
//! trace bytes (parse included) and their decode + replay (what `gpucollect import` + `report`
//! do), conversion straight into the model (parse included; what the viewer and `report` on a
//! snapshot do), and the report. Natively or as wasm32-wasip1 under Node.
//! Usage: bench_snapshot FILE [ROUNDS]

use std::time::Instant;

use analysis_core::report::summarize;
use analysis_core::{load, torch_snapshot};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: bench_snapshot FILE [ROUNDS]");
        std::process::exit(2);
    };
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            std::process::exit(2);
        }
    };
    let mut best = [f64::MAX; 5];
    for _ in 0..rounds {
        let t = Instant::now();
        if bytes.first() == Some(&0x80) {
            let parsed = analysis_core::pickle::Pickle::parse(&bytes);
            std::hint::black_box(&parsed);
        }
        best[3] = best[3].min(t.elapsed().as_secs_f64());
        let t0 = Instant::now();
        let (trace, _) = match torch_snapshot::convert(&bytes) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{path}: {e}");
                std::process::exit(1);
            }
        };
        let t1 = Instant::now();
        let Ok(loaded) = load(&trace) else {
            eprintln!("the converted trace does not load");
            std::process::exit(1);
        };
        let t2 = Instant::now();
        let report = summarize(&loaded);
        let t3 = Instant::now();
        std::hint::black_box(&report);
        drop(loaded);
        let t4 = Instant::now();
        let Ok((direct, _)) = torch_snapshot::load(&bytes) else {
            eprintln!("the snapshot does not load");
            std::process::exit(1);
        };
        best[4] = best[4].min(t4.elapsed().as_secs_f64());
        std::hint::black_box(&direct);
        let phases = [t1 - t0, t2 - t1, t3 - t2];
        for (b, p) in best.iter_mut().zip(phases) {
            *b = b.min(p.as_secs_f64());
        }
    }
    println!(
        "{{\"file\":\"{path}\",\"bytes\":{},\"parse_secs\":{:.4},\"convert_secs\":{:.4},\"load_secs\":{:.4},\"report_secs\":{:.4},\"direct_load_secs\":{:.4}}}",
        bytes.len(),
        best[3],
        best[0],
        best[1],
        best[2],
        best[4]
    );
}
