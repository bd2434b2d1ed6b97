//! Shared helpers for analysis-core's integration tests.
#![allow(dead_code)]

use analysis_core::*;

/// Decodes a whole buffer, returning the records, the byte offset after each one, the warnings
/// and the stopping error.
pub fn decode_all(bytes: &[u8]) -> (Vec<Record>, Vec<u64>, Vec<Warning>, Option<DecodeError>) {
    let mut d = Decoder::new();
    d.push(bytes);
    let mut recs = Vec::new();
    let mut ends = Vec::new();
    let mut fatal = None;
    loop {
        match d.next_record() {
            Ok(Some(r)) => {
                recs.push(r);
                ends.push(d.bytes_consumed());
            }
            Ok(None) => break,
            Err(e) => {
                fatal = Some(e);
                break;
            }
        }
    }
    let warnings = match d.finish() {
        Ok(w) => w,
        Err(e) => {
            fatal.get_or_insert(e);
            Vec::new()
        }
    };
    (recs, ends, warnings, fatal)
}

/// A small trace that uses every record kind of the current format (1.2: the 1.1 records, and
/// the header's `ends_at`, here `snapshot`).
pub fn every_record_kind() -> Vec<u8> {
    every_record_kind_with(&[])
}

/// Format 1.3's golden trace: every record kind, plus the framework layer (a tensor inside the
/// 1 MiB driver allocation, made and freed, and one left live).
pub fn every_record_kind_v1_3() -> Vec<u8> {
    let block = |ts_nanos: u64, offset: u64, size_bytes: u64| {
        Record::Alloc(Alloc {
            ts_nanos,
            size_bytes,
            address: 0x7f00_0000_0000 + offset,
            stack: StackId(2),
            kind: AllocKind::FrameworkBlock,
            ..Alloc::default()
        })
    };
    every_record_kind_with(&[
        // Allocations 0-3 are the 1.2 trace's; these are 4 and 5.
        block(3_870, 0, 512 << 10),
        block(3_871, 512 << 10, 256 << 10),
        Record::Free(Free {
            ts_nanos: 3_875,
            alloc: AllocId(4),
            ..Free::default()
        }),
    ])
}

/// The golden records, with `extra` before the last process exit.
fn every_record_kind_with(extra: &[Record]) -> Vec<u8> {
    let mut h = Encoder::header_v1();
    h.ends_at = TraceEnd::Snapshot;
    h.collector = "gpucollect 0.1.0".into();
    h.host = "golden-host".into();
    h.argv = vec!["./app".into(), "--steps".into(), "3".into()];
    h.start_mono_nanos = 5_000_000_000;
    h.wall_offset_nanos = 1_767_225_600_000_000_000;
    let mut e = Encoder::new(&h);
    let recs = vec![
        Record::Process(ProcessInfo {
            process: ProcessIdx(0),
            pid: 100,
            parent: None,
            exe: "/opt/app".into(),
            argv: vec!["./app".into(), "--steps".into(), "3".into()],
        }),
        Record::Process(ProcessInfo {
            process: ProcessIdx(1),
            pid: 101,
            parent: Some(ProcessIdx(0)),
            exe: "/opt/worker".into(),
            argv: vec![],
        }),
        Record::Device(DeviceInfo {
            device: DeviceIdx(0),
            uuid: "GPU-abc".into(),
            name: "Golden GPU".into(),
            total_bytes: 16 << 30,
        }),
        Record::Module(ModuleInfo {
            module: ModuleId(1),
            process: ProcessIdx(0),
            path: "/opt/app".into(),
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
            load_address: 0x5555_0000_0000,
            size_bytes: 0x20_0000,
        }),
        Record::String {
            id: StringId(1),
            value: "main".into(),
        },
        Record::String {
            id: StringId(2),
            value: "app.cu".into(),
        },
        Record::String {
            id: StringId(3),
            value: "step".into(),
        },
        Record::String {
            id: StringId(4),
            value: "train.py".into(),
        },
        Record::String {
            id: StringId(5),
            value: "worker-ü".into(),
        },
        Record::Frame(FrameDef::Native {
            id: FrameId(1),
            module: ModuleId(1),
            offset: 0x1234,
        }),
        Record::Frame(FrameDef::Python {
            id: FrameId(2),
            function: StringId(3),
            file: StringId(4),
            line: 42,
        }),
        Record::Stack(StackDef {
            stack: StackId(1),
            parent: StackId(0),
            frame: FrameId(2),
        }),
        Record::Stack(StackDef {
            stack: StackId(2),
            parent: StackId(1),
            frame: FrameId(1),
        }),
        Record::Thread(ThreadInfo {
            thread: ThreadIdx(1),
            process: ProcessIdx(0),
            os_tid: 102,
            name: StringId(5),
        }),
        Record::RangeBegin(RangeBegin {
            ts_nanos: 1_000,
            range: RangeId(7),
            name: StringId(3),
            domain: StringId(0),
            thread: ThreadIdx(0),
            process: ProcessIdx(0),
        }),
        Record::Alloc(Alloc {
            ts_nanos: 2_000,
            size_bytes: 1 << 20,
            address: 0x7f00_0000_0000,
            stack: StackId(2),
            ..Alloc::default()
        }),
        Record::Alloc(Alloc {
            ts_nanos: 2_500,
            size_bytes: 3 << 20,
            address: 0x7f00_0010_0000,
            stack: StackId(1),
            thread: ThreadIdx(1),
            kind: AllocKind::StreamOrderedPool,
            stream: 7,
            pool: 0x1000,
            ..Alloc::default()
        }),
        Record::Alloc(Alloc {
            ts_nanos: 2_600,
            size_bytes: 4096,
            address: 0x1000,
            kind: AllocKind::PinnedHost,
            ..Alloc::default()
        }),
        Record::Free(Free {
            ts_nanos: 3_000,
            alloc: AllocId(1),
            thread: ThreadIdx(1),
            kind: FreeKind::StreamOrdered,
            stream: 7,
        }),
        Record::Mark(Mark {
            ts_nanos: 3_100,
            name: StringId(1),
            domain: StringId(0),
            thread: ThreadIdx(0),
            process: ProcessIdx(0),
        }),
        Record::RangeEnd(RangeEnd {
            ts_nanos: 3_200,
            range: RangeId(7),
        }),
        Record::AllocFailed(AllocFailed {
            ts_nanos: 3_300,
            size_bytes: 32 << 30,
            error_code: 2,
            stack: StackId(2),
            ..AllocFailed::default()
        }),
        Record::FreeUnknown(FreeUnknown {
            ts_nanos: 3_350,
            address: 0xdead_0000,
            size_bytes: 0,
            ..FreeUnknown::default()
        }),
        Record::DeviceSample(DeviceSample {
            ts_nanos: 3_400,
            device: DeviceIdx(0),
            total_bytes: 16 << 30,
            free_bytes: 15 << 30,
            used_bytes: 1 << 30,
            processes: vec![ProcessUsage {
                pid: 100,
                used_bytes: 600 << 20,
            }],
        }),
        Record::PoolSample(PoolSample {
            ts_nanos: 3_500,
            device: DeviceIdx(0),
            pool: 0x1000,
            reserved_bytes: 8 << 20,
            used_bytes: 1 << 20,
            process: ProcessIdx(0),
        }),
        Record::Alloc(Alloc {
            ts_nanos: 3_600,
            size_bytes: 2 << 20,
            address: 0x7f00_0020_0000,
            process: ProcessIdx(1),
            ..Alloc::default()
        }),
        Record::ContextReset(ContextReset {
            ts_nanos: 3_700,
            process: ProcessIdx(1),
            device: DeviceIdx(0),
            thread: ThreadIdx(0),
        }),
        Record::ProcessExit(ProcessExit {
            ts_nanos: 3_800,
            process: ProcessIdx(1),
            code: None,
            signal: Some(9),
        }),
        Record::Dropped(Dropped {
            ts_nanos: 3_850,
            process: ProcessIdx(1),
            count: 0,
        }),
        // Since format 1.1.
        Record::String {
            id: StringId(50),
            value: "libcupti was not found in a worker".into(),
        },
        Record::Notice(Notice {
            ts_nanos: 3_860,
            process: ProcessIdx(1),
            code: notice_code::CUPTI_MISSING,
            message: StringId(50),
        }),
        Record::FrameSymbol(FrameSymbol {
            frame: FrameId(1),
            function: StringId(1),
            file: StringId(2),
            line: 17,
        }),
        Record::ProcessExit(ProcessExit {
            ts_nanos: 3_900,
            process: ProcessIdx(0),
            code: Some(0),
            signal: None,
        }),
        Record::End { ts_nanos: 4_000 },
    ];
    let (head, tail) = recs.split_at(recs.len() - 2);
    for r in head.iter().chain(extra).chain(tail) {
        e.record(r);
    }
    e.into_bytes()
}

/// Everything a replayed model holds, in a form that compares (maps sorted by key).
pub fn model_digest(t: &analysis_core::LoadedTrace) -> serde_json::Value {
    use std::collections::BTreeMap;
    let m = &t.model;
    let sorted = |v: Vec<(String, serde_json::Value)>| -> BTreeMap<String, serde_json::Value> {
        v.into_iter().collect()
    };
    let points = |tl: &analysis_core::timeline::Timeline| {
        let (times, values): (Vec<u64>, Vec<u64>) = tl.points().unzip();
        serde_json::json!([times, values])
    };
    serde_json::json!({
        "header": m.header,
        "processes": m.processes,
        "devices": m.devices,
        "strings": sorted(m.strings.iter().map(|(k, v)| (format!("{:08}", k.0), v.as_str().into())).collect()),
        "frames": sorted(m.frames.iter().map(|(k, v)| (format!("{:08}", k.0), serde_json::json!(v))).collect()),
        "stacks": sorted(m.stacks.iter().map(|(k, v)| (format!("{:08}", k.0), serde_json::json!(v))).collect()),
        "stack_stats": sorted(m.stack_stats.iter().map(|(k, v)| (format!("{:08}", k.0), serde_json::json!(v))).collect()),
        "threads": m.threads,
        "thread_last_ts": sorted(m.thread_last_ts.iter().map(|(k, v)| (format!("{:?}", k), serde_json::json!(v))).collect()),
        "allocs": m.allocs,
        "failed": m.failed,
        "free_unknown": m.free_unknown,
        "resets": m.resets,
        "ranges": m.ranges,
        "marks": m.marks,
        "device_samples": m.device_samples,
        "pool_samples": m.pool_samples,
        "process_exits": m.process_exits,
        "notices": m.notices,
        "series": m.series.iter().map(|s| serde_json::json!({
            "key": s.key, "live": s.live_bytes, "count": s.live_count, "peak": s.peak_bytes,
            "peak_ts": s.peak_ts_nanos, "points": points(&s.timeline),
        })).collect::<Vec<_>>(),
        "total": points(&m.total),
        "total_live": m.total_live_bytes,
        "peak": [m.peak_bytes, m.peak_ts_nanos],
        "extent": [m.first_ts_nanos, m.last_ts_nanos],
        "clean_end": m.clean_end,
        "records": m.records,
        "dropped": m.dropped_events,
        "warnings": format!("{:?}", t.warnings),
        "fatal": format!("{:?}", t.fatal),
    })
}

/// Runs `work` with the heap capped at what `heap` holds now plus `above` of it, then lifts
/// the cap: an allocation past it fails, and the test aborts ("memory allocation … failed").
/// The test binary's `#[global_allocator]` is `heap`.
pub fn under_cap<T>(
    heap: &cap::Cap<std::alloc::System>,
    above: impl FnOnce(usize) -> usize,
    work: impl FnOnce() -> T,
) -> T {
    let held = heap.allocated();
    heap.set_limit(held + above(held))
        .expect("a cap above what is held");
    let out = work();
    heap.set_limit(usize::MAX).expect("uncapped");
    out
}
