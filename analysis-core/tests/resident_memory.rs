//! A model whose history and timelines spill to a file, and the analysis of it, take memory
//! that follows what is live, not how long the history is: on scenarios whose live set stays
//! the same size, the peak heap of loading a trace of 2M records and reporting on it, and the
//! model's resident estimate (what the server budgets its summaries by), are within
//! [`GROWTH_PER_RECORD`] bytes per record of those at 1M.
//!
//! What it catches: a table that keeps that much or more per record in memory, such as a
//! vector of 8 bytes per allocation, iteration or sample, or points counted at their unpacked size
//! (series points counted at 24 bytes each had made a multi-device trace's estimate grow by
//! 19 bytes an event). What it does not: the index of the packed columns (8 bytes per 1,024
//! values of each), which grows by design, and smaller tables (the device samples' columns of
//! the hidden-memory detector, 0.3 bytes a sample before they spilled) stay below its noise,
//! about 0.2 bytes per record at these sizes (vectors' doubling, and the exact median
//! collecting up to 8 MiB of values once it has narrowed down).
//!
//! The peak is counted by a global allocator (`cap`) in a child process per trace, which reads
//! the trace from a file in pieces, so that neither the trace's bytes nor its making count.
//! Its own test binary: the allocator is process-wide.

use std::alloc::System;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use analysis_core::packed::{CHUNK_BYTES, Spill};
use analysis_core::synth::{Scenario, generate};
use analysis_core::*;
use cap::Cap;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

/// Set in the child: the trace to load and report on.
const CHILD_TRACE: &str = "GPUCOLLECT_RESIDENT_MEMORY_TRACE";

/// Chunks written to a file as they come, read back through a cache of a few chunks: the
/// memory it holds does not grow with the history.
#[derive(Debug)]
struct FileSpill {
    file: File,
    state: Mutex<SpillState>,
}

#[derive(Debug, Default)]
struct SpillState {
    chunks: u64,
    cache: HashMap<u64, Vec<u8>>,
}

/// Chunks the spill's cache holds at most: few, so that it is full at either size.
const CACHED_CHUNKS: usize = 4;

impl Spill for FileSpill {
    fn put(&self, chunk: &[u8]) -> Option<u64> {
        let mut s = self.state.lock().ok()?;
        let handle = s.chunks;
        self.file
            .write_all_at(chunk, handle * CHUNK_BYTES as u64)
            .ok()?;
        s.chunks += 1;
        Some(handle)
    }

    fn read(&self, handle: u64, at: usize, len: usize, f: &mut dyn FnMut(&[u8])) {
        let mut s = self.state.lock().expect("the spill's lock");
        if !s.cache.contains_key(&handle) {
            if s.cache.len() >= CACHED_CHUNKS {
                let any = *s.cache.keys().next().expect("a cached chunk");
                s.cache.remove(&any);
            }
            let mut chunk = vec![0u8; CHUNK_BYTES];
            self.file
                .read_exact_at(&mut chunk, handle * CHUNK_BYTES as u64)
                .expect("a spilled chunk reads back");
            s.cache.insert(handle, chunk);
        }
        f(&s.cache[&handle][at..at + len]);
    }

    fn held_bytes(&self) -> u64 {
        self.state
            .lock()
            .map_or(0, |s| s.chunks * CHUNK_BYTES as u64)
    }
}

/// In the child: loads `trace` in pieces with a spill to a file beside it, reports on it, and
/// prints the heap's peak above what was held before.
fn measure(trace: &Path) {
    let spill_path = trace.with_extension("spill");
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&spill_path)
        .expect("the spill file opens");
    let mut input = File::open(trace).expect("the trace opens");
    let mut piece = vec![0u8; 1 << 16];
    let before = HEAP.allocated();
    let spill = Arc::new(FileSpill {
        file,
        state: Mutex::default(),
    });
    let mut loader = Loader::with_spill(spill.clone());
    loop {
        let n = input.read(&mut piece).expect("the trace reads");
        if n == 0 {
            break;
        }
        loader.push(&piece[..n]).expect("the trace decodes");
    }
    let trace = loader.finish().expect("the trace loads");
    let estimate = trace.model.resident_heap_estimate();
    let report = summarize(&trace);
    assert!(report.peak_bytes > 0);
    assert!(spill.held_bytes() > 0, "nothing spilled");
    println!(
        "peak {} records {} estimate {}",
        HEAP.max_allocated() - before,
        trace.model.records,
        estimate
    );
    drop((trace, report));
    std::fs::remove_file(&spill_path).ok();
}

/// What the child measured of one trace.
#[derive(Clone, Copy, Debug)]
struct Measure {
    /// The heap's peak while loading and reporting.
    peak: u64,
    records: u64,
    /// [`TraceModel::resident_heap_estimate`] once loaded, before the analysis: what the server
    /// budgets a summary by.
    estimate: u64,
}

/// [`Measure`] of `scenario` at `events`, in a child process.
fn measure_of(dir: &Path, scenario: Scenario, events: u64) -> Measure {
    let (bytes, _) = generate(scenario, events, 5);
    let path = dir.join(format!("{scenario:?}-{events}.msgpack"));
    std::fs::write(&path, &bytes).expect("the trace is written");
    drop(bytes);
    let out = std::process::Command::new(std::env::current_exe().expect("this test's binary"))
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_TRACE, &path)
        .output()
        .expect("the child runs");
    std::fs::remove_file(&path).ok();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{scenario:?} at {events}: {text}");
    let line = text
        .lines()
        .find_map(|l| l.split_once("peak ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no measure in {text}"));
    let words: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    match words[..] {
        [peak, records, estimate] => Measure {
            peak,
            records,
            estimate,
        },
        _ => panic!("a measure is three numbers: {line}"),
    }
}

/// The child's side: runs only under [`CHILD_TRACE`].
#[test]
fn child() {
    if let Some(trace) = std::env::var_os(CHILD_TRACE) {
        measure(&PathBuf::from(trace));
    }
}

/// The events of the two traces of each scenario compared.
const SMALL: u64 = 1_000_000;
const LARGE: u64 = 2_000_000;

/// Bytes per record the peak, or the estimate, may grow by from the smaller trace to the larger.
const GROWTH_PER_RECORD: f64 = 0.4;

#[test]
fn a_spilled_models_memory_follows_what_is_live_not_the_history() {
    let dir = std::env::temp_dir().join(format!("gpucollect-resident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let mut rows = Vec::new();
    let mut grew = false;
    for scenario in [
        Scenario::Clean,
        Scenario::Requests,
        Scenario::MultiDevice,
        Scenario::CachePlateau,
        Scenario::StreamOrdered,
    ] {
        let small = measure_of(&dir, scenario, SMALL);
        let large = measure_of(&dir, scenario, LARGE);
        let records = large.records as f64 - small.records as f64;
        let peak = (large.peak as f64 - small.peak as f64) / records;
        let estimate = (large.estimate as f64 - small.estimate as f64) / records;
        rows.push(format!(
            "{scenario:?}: peak {} bytes at {} records, {} at {} ({peak:.3} bytes per record); \
             estimate {} and {} ({estimate:.3} bytes per record)",
            small.peak, small.records, large.peak, large.records, small.estimate, large.estimate
        ));
        println!("{}", rows.last().expect("a row"));
        grew |= peak >= GROWTH_PER_RECORD || estimate >= GROWTH_PER_RECORD;
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(!grew, "memory grew with the history:\n{}", rows.join("\n"));
}
