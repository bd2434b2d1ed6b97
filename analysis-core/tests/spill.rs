//! A model whose history and timelines go to a spill gives the same report as one that keeps
//! them in memory, on every synthetic scenario, and holds less in memory for it.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use analysis_core::packed::{CHUNK_BYTES, Spill};
use analysis_core::synth::{Scenario, generate};
use analysis_core::*;

/// Takes every chunk (or every `every`-th, declining the others) and counts reads.
#[derive(Debug, Default)]
struct VecSpill {
    chunks: Mutex<Vec<Vec<u8>>>,
    offered: AtomicUsize,
    every: usize,
    reads: AtomicUsize,
}

impl Spill for VecSpill {
    fn put(&self, chunk: &[u8]) -> Option<u64> {
        assert_eq!(chunk.len(), CHUNK_BYTES);
        let n = self.offered.fetch_add(1, Ordering::Relaxed);
        if self.every > 1 && !n.is_multiple_of(self.every) {
            return None;
        }
        let mut c = self.chunks.lock().expect("lock");
        c.push(chunk.to_vec());
        Some(c.len() as u64 - 1)
    }
    fn read(&self, handle: u64, at: usize, len: usize, f: &mut dyn FnMut(&[u8])) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let c = self.chunks.lock().expect("lock");
        f(&c[handle as usize][at..at + len]);
    }
    fn held_bytes(&self) -> u64 {
        (self.chunks.lock().expect("lock").len() * CHUNK_BYTES) as u64
    }
}

fn load_with(bytes: &[u8], spill: Option<Arc<VecSpill>>) -> LoadedTrace {
    let mut l = match spill {
        Some(s) => Loader::with_spill(s),
        None => Loader::new(),
    };
    for piece in bytes.chunks(1 << 16) {
        l.push(piece).expect("synthetic trace decodes");
    }
    l.finish().expect("synthetic trace loads")
}

#[test]
fn a_spilled_model_reports_the_same_on_every_scenario() {
    let mut spilled = 0;
    for s in Scenario::ALL {
        let (bytes, _) = generate(s, 60_000, 11);
        let plain = load_with(&bytes, None);
        let want = serde_json::to_string(&summarize(&plain)).expect("report serializes");
        for every in [1, 3] {
            let spill = Arc::new(VecSpill {
                every,
                ..VecSpill::default()
            });
            let t = load_with(&bytes, Some(spill.clone()));
            let got = serde_json::to_string(&summarize(&t)).expect("report serializes");
            assert_eq!(got, want, "{s:?}, every {every}");
            let held = spill.held_bytes();
            if plain.model.allocs.heap_bytes() > 4 * CHUNK_BYTES {
                spilled += 1;
                assert!(held > 0, "{s:?}: nothing spilled");
                assert!(
                    spill.reads.load(Ordering::Relaxed) > 0,
                    "{s:?}: nothing read back"
                );
            }
            // The history counts whole wherever it lies; what lies in memory is less by what the
            // spill holds. Only the timelines differ: a spilling timeline packs its points, to
            // spill them, where one in memory keeps them as they are (the total's, and the
            // series' counted at what they hold).
            let without_total = |m: &analysis_core::model::TraceModel| {
                m.heap_estimate() - m.total.heap_bytes() as u64
            };
            let points = |m: &analysis_core::model::TraceModel| {
                m.series
                    .iter()
                    .chain(&m.allocated)
                    .map(|s| s.timeline.heap_bytes() as u64)
                    .sum::<u64>()
            };
            let (spilled, in_memory) = (without_total(&t.model), without_total(&plain.model));
            assert!(
                spilled <= in_memory && in_memory - spilled <= points(&plain.model),
                "{s:?}: {spilled} bytes spilled, {in_memory} in memory"
            );
            if t.model.series.len() <= 1 && t.model.allocated.len() <= 1 {
                assert_eq!(spilled, in_memory, "{s:?}");
            }
            assert_eq!(
                t.model.resident_heap_estimate(),
                t.model.heap_estimate() - held,
                "{s:?}"
            );
            // The history and the total's points read back the same, one by one.
            assert_eq!(t.model.allocs.len(), plain.model.allocs.len());
            for (a, b) in t.model.allocs.iter().zip(plain.model.allocs.iter()) {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{s:?}");
            }
            let (x, y) = (&t.model.total, &plain.model.total);
            assert_eq!(x.len(), y.len());
            for i in (0..x.len()).step_by(7) {
                assert_eq!(
                    (x.time(i), x.value(i)),
                    (y.time(i), y.value(i)),
                    "{s:?} point {i}"
                );
            }
        }
    }
    // Most scenarios are long enough to spill.
    assert!(spilled >= Scenario::ALL.len(), "{spilled} spilled");
}

/// A long run of NVTX ranges (one per step, with a few allocations in each) spills its range
/// instances with the history, and reads them back as the model without a spill holds them.
#[test]
fn range_instances_go_to_the_spill_and_read_back_the_same() {
    use analysis_core::encode::Encoder;
    use analysis_core::format::{
        Alloc, Free, RangeBegin, RangeEnd, RangeId, Record, StringId, ThreadIdx,
    };
    let mut enc = Encoder::new(&Encoder::header_v1());
    let mut t = 0u64;
    for step in 0..200_000u64 {
        t += 1_000;
        enc.record(&Record::RangeBegin(RangeBegin {
            ts_nanos: t,
            range: RangeId(step + 1),
            name: StringId(0),
            thread: ThreadIdx((step % 3) as u32),
            ..RangeBegin::default()
        }));
        if step % 4 == 0 {
            let id = enc.alloc(&Alloc {
                ts_nanos: t + 10,
                size_bytes: 4096 + step % 7,
                address: (step + 1) << 16,
                ..Alloc::default()
            });
            enc.record(&Record::Free(Free {
                ts_nanos: t + 20 + step % 900,
                alloc: id,
                ..Free::default()
            }));
        }
        enc.record(&Record::RangeEnd(RangeEnd {
            ts_nanos: t + 500 + step % 400,
            range: RangeId(step + 1),
        }));
    }
    let bytes = enc.into_bytes();
    let plain = load_with(&bytes, None);
    let spill = Arc::new(VecSpill::default());
    let t = load_with(&bytes, Some(spill.clone()));
    let (x, y) = (&t.model.ranges, &plain.model.ranges);
    assert_eq!(x.len(), 200_000);
    assert_eq!(x.len(), y.len());
    assert!(x.iter().eq(y.iter()), "range instances differ");
    // The allocation history alone is too small to fill a chunk of every column; the ranges
    // fill many.
    let alloc_bytes = plain.model.allocs.heap_bytes() as u64;
    assert!(
        spill.held_bytes() > alloc_bytes + 8 * CHUNK_BYTES as u64,
        "{} held, the allocations take {alloc_bytes}",
        spill.held_bytes()
    );
    assert!(t.model.resident_heap_estimate() < plain.model.heap_estimate() / 2);
    let report = |l: &LoadedTrace| serde_json::to_string(&summarize(l)).expect("serializes");
    assert_eq!(report(&t), report(&plain));
}

/// A long run of device samples, pool samples and marks (a day of 50 ms samples is 1.7 M of
/// each) spills their columns with the history, and reads them back as the model without a
/// spill holds them.
#[test]
fn samples_and_marks_go_to_the_spill_and_read_back_the_same() {
    use analysis_core::encode::Encoder;
    use analysis_core::format::{
        Alloc, DeviceIdx, DeviceSample, Mark, PoolSample, ProcessUsage, Record, StringId,
    };
    let mut enc = Encoder::new(&Encoder::header_v1());
    enc.alloc(&Alloc {
        ts_nanos: 1,
        size_bytes: 1 << 20,
        address: 1 << 16,
        ..Alloc::default()
    });
    let mut t = 0u64;
    for k in 0..60_000u64 {
        t += 50_000_000 + k % 13;
        enc.record(&Record::DeviceSample(DeviceSample {
            ts_nanos: t,
            device: DeviceIdx((k % 2) as u32),
            total_bytes: 80 << 30,
            free_bytes: (70 << 30) - (k % 1_000) * 4096,
            used_bytes: (10 << 30) + (k % 1_000) * 4096,
            processes: (0..k % 3)
                .map(|p| ProcessUsage {
                    pid: 100 + p as u32,
                    used_bytes: (1 << 30) + k * 512,
                })
                .collect(),
        }));
        enc.record(&Record::PoolSample(PoolSample {
            ts_nanos: t + 1,
            pool: k % 2,
            reserved_bytes: (2 << 30) + (k % 97) * (2 << 20),
            used_bytes: (1 << 30) + (k % 89) * (1 << 20),
            ..PoolSample::default()
        }));
        enc.record(&Record::Mark(Mark {
            ts_nanos: t + 2,
            name: StringId((k % 5) as u32),
            ..Mark::default()
        }));
    }
    let bytes = enc.into_bytes();
    let plain = load_with(&bytes, None);
    let spill = Arc::new(VecSpill::default());
    let t = load_with(&bytes, Some(spill.clone()));
    let (x, y) = (&t.model, &plain.model);
    assert_eq!(x.device_samples.len(), 60_000);
    assert!(
        x.device_samples == y.device_samples,
        "device samples differ"
    );
    assert!(x.pool_samples == y.pool_samples, "pool samples differ");
    assert!(x.marks == y.marks, "marks differ");
    // The samples and marks fill many chunks; the one allocation fills none.
    let samples =
        (y.device_samples.heap_bytes() + y.pool_samples.heap_bytes() + y.marks.heap_bytes()) as u64;
    assert!(
        spill.held_bytes() > samples / 2,
        "{} held of {samples} in samples and marks",
        spill.held_bytes()
    );
    let report = |l: &LoadedTrace| serde_json::to_string(&summarize(l)).expect("serializes");
    assert_eq!(report(&t), report(&plain));
}
