//! Times each phase of opening a PyTorch memory snapshot: pickle parse alone, conversion to
//! trace bytes (parse included) and their decode + replay (what `gpucollect import` + `report`
//! do), conversion straight into the model (parse included; what the viewer and `report` on a
//! snapshot do), the same pushed in 4 MiB pieces through `SnapshotLoader` (what the viewer does
//! while it reads the file), and the report. Natively or as wasm32-wasip1 under Node.
//! Usage: bench_snapshot FILE [ROUNDS] [direct|pieces]   (`direct`: only the direct load, for
//! profiling; `pieces`: only `SnapshotLoader` fed 1 MiB pieces as the viewer does, printing the
//! parse (pushes) and the conversion (`finish`) of every round, the first one cold; as wasm,
//! also the linear memory after each (it only grows: memory first touched costs a page fault
//! per 4 KiB, a large part of a cold load)

use std::time::Instant;

use analysis_core::summarize;
use analysis_core::{load, torch_snapshot};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: bench_snapshot FILE [ROUNDS]");
        std::process::exit(2);
    };
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let mode = args.next();
    let only_direct = mode.as_deref() == Some("direct");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            std::process::exit(2);
        }
    };
    if mode.as_deref() == Some("pieces") {
        let start = memory_mib();
        for round in 0..rounds {
            let (trace, parsed, all, parse_mem) = load_in_pieces(&bytes, 1 << 20, &path);
            std::hint::black_box(&trace);
            println!(
                "{{\"round\":{round},\"parse_secs\":{parsed:.4},\"convert_secs\":{:.4},\"total_secs\":{all:.4},\"memory_mib\":{{\"start\":{start},\"parsed\":{parse_mem},\"converted\":{}}}}}",
                all - parsed,
                memory_mib(),
            );
        }
        return;
    }
    let mut best = [f64::MAX; 6];
    for _ in 0..rounds {
        if only_direct {
            let t = Instant::now();
            let direct = torch_snapshot::load(&bytes);
            best[4] = best[4].min(t.elapsed().as_secs_f64());
            std::hint::black_box(&direct);
            continue;
        }
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
        drop(direct);
        let (pieces, _, all, _) = load_in_pieces(&bytes, 4 << 20, &path);
        best[5] = best[5].min(all);
        std::hint::black_box(&pieces);
        let phases = [t1 - t0, t2 - t1, t3 - t2];
        for (b, p) in best.iter_mut().zip(phases) {
            *b = b.min(p.as_secs_f64());
        }
    }
    // Phases not run (`direct` mode) print as null.
    let secs = |s: f64| {
        if s == f64::MAX {
            String::from("null")
        } else {
            format!("{s:.4}")
        }
    };
    println!(
        "{{\"file\":\"{path}\",\"bytes\":{},\"parse_secs\":{},\"convert_secs\":{},\"load_secs\":{},\"report_secs\":{},\"direct_load_secs\":{},\"pieces_load_secs\":{}}}",
        bytes.len(),
        secs(best[3]),
        secs(best[0]),
        secs(best[1]),
        secs(best[2]),
        secs(best[4]),
        secs(best[5])
    );
}

/// Pushes `bytes` into a `SnapshotLoader` in pieces of `piece` bytes and finishes it: the trace,
/// the seconds the pushes (the parse) took, the seconds in all, and the memory after the parse
/// ([`memory_mib`]). Exits on an error.
fn load_in_pieces(
    bytes: &[u8],
    piece: usize,
    path: &str,
) -> (analysis_core::LoadedTrace, f64, f64, String) {
    let t = Instant::now();
    let mut loader = torch_snapshot::SnapshotLoader::new(Some(bytes.len()));
    for p in bytes.chunks(piece) {
        if let Err(e) = loader.push(p) {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    }
    let parsed = t.elapsed().as_secs_f64();
    let parse_mem = memory_mib();
    let Ok((trace, _)) = loader.finish() else {
        eprintln!("the snapshot does not load in pieces");
        std::process::exit(1);
    };
    (trace, parsed, t.elapsed().as_secs_f64(), parse_mem)
}

/// The WebAssembly linear memory in MiB, as JSON (`null` natively).
fn memory_mib() -> String {
    #[cfg(target_arch = "wasm32")]
    {
        format!("{}", core::arch::wasm32::memory_size(0) / 16)
    }
    // Natively, the memory touched (resident), which is what costs time: reserved but
    // untouched capacity does not count.
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
                let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                Some((kib / 1024).to_string())
            })
            .unwrap_or_else(|| String::from("null"))
    }
}
