//! Properties of the analysis over random traces: a trace that frees every allocation has no
//! leak at exit; shifting every timestamp by a constant changes no finding, score or statistic;
//! the analysis never panics on whatever the generator produces.

use analysis_core::analysis::FindingKind;
use analysis_core::*;
use proptest::prelude::*;

/// One random operation: allocate `size` from one of 4 call sites, or free a live allocation.
#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size_kib: u64,
        site: u32,
        range: bool,
    },
    Free {
        pick: usize,
    },
    Sample {
        extra_mib: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..200_000, 1u32..5, any::<bool>()).prop_map(|(size_kib, site, range)| Op::Alloc {
            size_kib,
            site,
            range
        }),
        any::<usize>().prop_map(|pick| Op::Free { pick }),
        (0u64..4096).prop_map(|extra_mib| Op::Sample { extra_mib }),
    ]
}

/// Writes a trace from `ops`, every timestamp shifted by `offset_nanos`. With `free_all`, every
/// allocation still live is freed before the end.
fn trace(ops: &[Op], gaps: &[u64], offset_nanos: u64, free_all: bool) -> Vec<u8> {
    let mut enc = Encoder::new(&Encoder::header_v1());
    let s = |id| StringId(id);
    enc.record(&Record::Process(ProcessInfo {
        process: ProcessIdx(0),
        pid: 1,
        ..ProcessInfo::default()
    }));
    enc.record(&Record::Device(DeviceInfo {
        device: DeviceIdx(0),
        total_bytes: 16 << 30,
        ..DeviceInfo::default()
    }));
    for i in 1..=8u32 {
        enc.record(&Record::String {
            id: s(i),
            value: format!("name{i}"),
        });
    }
    for site in 1..=4u32 {
        enc.record(&Record::Frame(FrameDef::Python {
            id: FrameId(site),
            function: s(site),
            file: s(5),
            line: site * 10,
        }));
        enc.record(&Record::Stack(StackDef {
            stack: StackId(site),
            parent: StackId(0),
            frame: FrameId(site),
        }));
    }
    let mut t = offset_nanos;
    let mut live: Vec<(AllocId, u64)> = Vec::new();
    let mut next_range = 1u64;
    let mut addr = 1u64 << 40;
    let mut live_bytes = 0u64;
    for (i, o) in ops.iter().enumerate() {
        t += gaps.get(i % gaps.len().max(1)).copied().unwrap_or(1000);
        match *o {
            Op::Alloc {
                size_kib,
                site,
                range,
            } => {
                let size = size_kib * 1024;
                let r = RangeId(next_range);
                if range {
                    next_range += 1;
                    enc.record(&Record::RangeBegin(RangeBegin {
                        ts_nanos: t,
                        range: r,
                        name: s(6),
                        ..RangeBegin::default()
                    }));
                }
                let id = enc.alloc(&Alloc {
                    ts_nanos: t,
                    size_bytes: size,
                    address: addr,
                    stack: StackId(site),
                    ..Alloc::default()
                });
                addr += size;
                live.push((id, size));
                live_bytes += size;
                if range {
                    enc.record(&Record::RangeEnd(RangeEnd {
                        ts_nanos: t + 1,
                        range: r,
                    }));
                }
            }
            Op::Free { pick } => {
                if !live.is_empty() {
                    let (id, size) = live.swap_remove(pick % live.len());
                    live_bytes -= size;
                    enc.record(&Record::Free(Free {
                        ts_nanos: t,
                        alloc: id,
                        ..Free::default()
                    }));
                }
            }
            Op::Sample { extra_mib } => {
                let used = live_bytes + (extra_mib << 20);
                enc.record(&Record::DeviceSample(DeviceSample {
                    ts_nanos: t,
                    device: DeviceIdx(0),
                    total_bytes: 16 << 30,
                    free_bytes: (16u64 << 30).saturating_sub(used),
                    used_bytes: used,
                    processes: vec![ProcessUsage {
                        pid: 1,
                        used_bytes: used,
                    }],
                }));
                enc.record(&Record::PoolSample(PoolSample {
                    ts_nanos: t,
                    reserved_bytes: live_bytes + (extra_mib << 20),
                    used_bytes: live_bytes,
                    ..PoolSample::default()
                }));
            }
        }
    }
    if free_all {
        for (id, _) in live.drain(..) {
            t += 10;
            enc.record(&Record::Free(Free {
                ts_nanos: t,
                alloc: id,
                ..Free::default()
            }));
        }
    }
    enc.record(&Record::End { ts_nanos: t + 1 });
    enc.into_bytes()
}

/// The report with every absolute time removed (durations stay).
fn normalized(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("report serializes");
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|k, _| !k.ends_with("ts_nanos") && k != "intercept");
                for x in m.values_mut() {
                    strip(x);
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_trace_that_frees_everything_has_no_leak_at_exit(
        ops in proptest::collection::vec(op(), 1..300),
        gaps in proptest::collection::vec(1u64..100_000, 1..16),
    ) {
        let bytes = trace(&ops, &gaps, 0, true);
        let r = summarize(&load(&bytes).expect("loads"));
        prop_assert!(r.analysis.leaks_at_exit.is_empty());
        prop_assert_eq!(r.live_at_end_bytes, 0);
        // Nothing is left at exit. (Memory kept while the program ran and freed only at its
        // end, a list emptied at shutdown, can still be growth: a leak while it runs.)
        prop_assert!(!r.findings.iter().any(|f| matches!(
            f.kind,
            FindingKind::LeakAtExit | FindingKind::ThreadExitLeak
        ) || (f.kind == FindingKind::MissedFree && f.bytes == 0 && f.bytes_per_iteration.is_none())));
        prop_assert!(!r.notes.iter().any(|f| f.kind == FindingKind::TeardownRelease));
        prop_assert!(r.score <= 100);
    }

    #[test]
    fn shifting_every_timestamp_changes_nothing(
        ops in proptest::collection::vec(op(), 1..300),
        gaps in proptest::collection::vec(1u64..100_000, 1..16),
        shift in 1u64..(1u64 << 50),
        free_all in any::<bool>(),
    ) {
        let a = summarize(&load(&trace(&ops, &gaps, 0, free_all)).expect("loads"));
        let b = summarize(&load(&trace(&ops, &gaps, shift, free_all)).expect("loads"));
        prop_assert_eq!(a.first_ts_nanos + shift, b.first_ts_nanos);
        prop_assert_eq!(normalized(&a), normalized(&b));
    }
}

/// A trace of allocations with arbitrary sizes, times and addresses (hostile values included).
fn wild_trace(allocs: &[(u64, u64, u64, bool)]) -> Vec<u8> {
    let mut enc = Encoder::new(&Encoder::header_v1());
    let mut t = 0u64;
    let mut ids = Vec::new();
    for &(dt, size, address, free) in allocs {
        t = t.wrapping_add(dt);
        let id = enc.alloc(&Alloc {
            ts_nanos: t,
            size_bytes: size,
            address,
            stack: StackId((size % 3) as u32),
            ..Alloc::default()
        });
        ids.push((id, free));
        if size % 5 == 0 {
            enc.record(&Record::PoolSample(PoolSample {
                ts_nanos: t,
                reserved_bytes: address,
                used_bytes: size,
                ..PoolSample::default()
            }));
            enc.record(&Record::DeviceSample(DeviceSample {
                ts_nanos: t,
                total_bytes: dt,
                used_bytes: size,
                ..DeviceSample::default()
            }));
        }
    }
    for (id, free) in ids {
        if free {
            t = t.wrapping_add(7);
            enc.record(&Record::Free(Free {
                ts_nanos: t,
                alloc: id,
                ..Free::default()
            }));
        }
    }
    enc.record(&Record::AllocFailed(AllocFailed {
        ts_nanos: t,
        size_bytes: u64::MAX,
        ..AllocFailed::default()
    }));
    enc.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn analysis_never_panics_on_mutated_traces(
        which in 0usize..synth::Scenario::ALL.len(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
    ) {
        let (mut bytes, _) = synth::generate(synth::Scenario::ALL[which], 400, 3);
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        if let Ok(t) = load(&bytes) {
            let r = summarize(&t);
            prop_assert!(r.score <= 100);
        }
    }

    #[test]
    fn analysis_never_panics_on_extreme_values(
        allocs in proptest::collection::vec(
            (prop_oneof![Just(0u64), Just(u64::MAX / 2), 0u64..1_000_000],
             // Sizes stay below 2^56 so that 40 of them do not overflow the model's own
             // per-stack sums (model.rs adds without saturating; reported separately).
             prop_oneof![Just(0u64), Just(1u64 << 56), Just((1u64 << 56) - 1), 1u64..1 << 40],
             any::<u64>(),
             any::<bool>()),
            1..40),
    ) {
        let bytes = wild_trace(&allocs);
        let t = load(&bytes).expect("loads");
        let r = summarize(&t);
        prop_assert!(r.score <= 100);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// What the model keeps per stack at the peak (`TraceModel::peak_stacks`, which the
    /// summary's sites at the peak read) is what grouping the allocations live at the peak
    /// gives: bytes, count and up to 16 threads, in the same order.
    #[test]
    fn the_peak_stacks_are_the_live_set_at_the_peak_grouped(
        ops in proptest::collection::vec(
            (0u64..64, 1u32..=4, 0u32..24, any::<bool>(), any::<usize>()),
            1..300,
        ),
    ) {
        let mut enc = Encoder::new(&Encoder::header_v1());
        let mut live: Vec<AllocId> = Vec::new();
        let mut t = 0u64;
        for (size_kib, stack, thread, free, pick) in ops {
            t += 1000;
            if free && !live.is_empty() {
                let id = live.swap_remove(pick % live.len());
                enc.record(&Record::Free(Free { ts_nanos: t, alloc: id, ..Free::default() }));
            } else {
                live.push(enc.alloc(&Alloc {
                    ts_nanos: t,
                    size_bytes: size_kib * 1024,
                    address: t << 20,
                    stack: StackId(stack),
                    thread: ThreadIdx(thread),
                    kind: if size_kib % 7 == 0 { AllocKind::PinnedHost } else { AllocKind::Device },
                    ..Alloc::default()
                }));
            }
        }
        let loaded = load(&enc.into_bytes()).expect("loads");
        let m = &loaded.model;
        let fields = analysis::GROUP_FIELDS | model::Fields::KIND;
        let want = analysis::group_by_stack(
            m,
            m.allocs
                .live_at_fields(m.peak_ts_nanos, m.allocs.len(), fields)
                .filter(|a| a.kind.is_device_memory()),
            usize::MAX,
        );
        let want: Vec<_> = if m.peak_bytes > 0 {
            want.into_iter().map(|s| (s.stack, s.bytes, s.count, s.threads)).collect()
        } else {
            Vec::new()
        };
        let got: Vec<_> = m
            .peak_stacks
            .iter()
            .map(|p| (p.stack, p.bytes, p.count, p.threads.clone()))
            .collect();
        prop_assert_eq!(got, want);
    }
}
