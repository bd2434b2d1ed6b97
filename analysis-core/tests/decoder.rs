//! Decoder guarantees: round trips, the checked-in v1 golden trace, truncation at every byte,
//! versioning and forward compatibility.

mod common;

use analysis_core::msgpack::{write_array_len, write_str, write_uint};
use analysis_core::synth::{Scenario, generate};
use analysis_core::*;
use common::{decode_all, every_record_kind_v1_3};
use proptest::prelude::*;

const GOLDEN_V1: &[u8] = include_bytes!("assets/v1.0/every-record-kind.msgpack");
const GOLDEN_V1_RECORDS: &str = include_str!("assets/v1.0/every-record-kind.records.json");
const GOLDEN_V1_REPORT: &str = include_str!("assets/v1.0/every-record-kind.report.json");
const GOLDEN_V1_1: &[u8] = include_bytes!("assets/v1.1/every-record-kind.msgpack");
const GOLDEN_V1_1_RECORDS: &str = include_str!("assets/v1.1/every-record-kind.records.json");
const GOLDEN_V1_1_REPORT: &str = include_str!("assets/v1.1/every-record-kind.report.json");
const GOLDEN_V1_2: &[u8] = include_bytes!("assets/v1.2/every-record-kind.msgpack");
const GOLDEN_V1_2_RECORDS: &str = include_str!("assets/v1.2/every-record-kind.records.json");
const GOLDEN_V1_2_REPORT: &str = include_str!("assets/v1.2/every-record-kind.report.json");
const GOLDEN_V1_3: &[u8] = include_bytes!("assets/v1.3/every-record-kind.msgpack");
const GOLDEN_V1_3_RECORDS: &str = include_str!("assets/v1.3/every-record-kind.records.json");
const GOLDEN_V1_3_REPORT: &str = include_str!("assets/v1.3/every-record-kind.report.json");

fn records_json(recs: &[Record]) -> String {
    serde_json::to_string_pretty(recs).expect("records serialize") + "\n"
}

fn report_json(bytes: &[u8]) -> String {
    let t = load(bytes).expect("loads");
    serde_json::to_string_pretty(&summarize(&t)).expect("report serializes") + "\n"
}

/// Set GPUCOLLECT_BLESS=1 to rewrite the golden files of the current version (1.3), and the
/// reports (analysis output, not format) of older versions; their traces and records never change.
fn bless() -> bool {
    std::env::var_os("GPUCOLLECT_BLESS").is_some()
}

#[test]
fn golden_v1_trace_decodes_to_its_recorded_records_forever() {
    let (recs, _, warnings, fatal) = decode_all(GOLDEN_V1);
    assert!(fatal.is_none(), "{fatal:?}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records_json(&recs), GOLDEN_V1_RECORDS);
    if bless() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/assets/v1.0/every-record-kind.report.json"
        );
        std::fs::write(path, report_json(GOLDEN_V1)).expect("write");
        return;
    }
    assert_eq!(report_json(GOLDEN_V1), GOLDEN_V1_REPORT);
}

#[test]
fn golden_v1_1_trace_decodes_to_its_recorded_records_forever() {
    let (recs, _, warnings, fatal) = decode_all(GOLDEN_V1_1);
    assert!(fatal.is_none(), "{fatal:?}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records_json(&recs), GOLDEN_V1_1_RECORDS);
    if bless() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/assets/v1.1/every-record-kind.report.json"
        );
        std::fs::write(path, report_json(GOLDEN_V1_1)).expect("write");
        return;
    }
    assert_eq!(report_json(GOLDEN_V1_1), GOLDEN_V1_1_REPORT);
    // The 1.1 notice: the worker ran untraced, and the report says so.
    let t = load(GOLDEN_V1_1).expect("loads");
    assert_eq!(t.model.notices.len(), 1);
    assert_eq!(
        t.model.header.ends_at,
        TraceEnd::Exit,
        "no ends_at before 1.2"
    );
    let r = summarize(&t);
    assert_eq!(r.capture_incomplete.len(), 1);
    assert!(r.capture_incomplete[0].contains("libcupti was not found in a worker"));
}

#[test]
fn lost_framework_history_is_a_warning_not_an_untraced_process() {
    let mut e = Encoder::new(&Encoder::header_v1());
    for rec in [
        Record::Process(ProcessInfo {
            process: ProcessIdx(0),
            pid: 7,
            parent: None,
            exe: "/usr/bin/python3".into(),
            argv: vec!["train.py".into()],
        }),
        Record::String {
            id: StringId(1),
            value: "2 wraps of the history; raise GPUCOLLECT_TORCH_MAX_ENTRIES".into(),
        },
        Record::Notice(Notice {
            ts_nanos: 10,
            process: ProcessIdx(0),
            code: notice_code::FRAMEWORK_HISTORY_LOST,
            message: StringId(1),
        }),
        Record::End { ts_nanos: 20 },
    ] {
        e.record(&rec);
    }
    let r = summarize(&load(&e.into_bytes()).expect("loads"));
    assert!(
        r.capture_incomplete.is_empty(),
        "{:?}",
        r.capture_incomplete
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("process 7 was traced, but") && w.contains("2 wraps")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn golden_v1_2_trace_decodes_to_its_recorded_records_forever() {
    let (recs, _, warnings, fatal) = decode_all(GOLDEN_V1_2);
    assert!(fatal.is_none(), "{fatal:?}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records_json(&recs), GOLDEN_V1_2_RECORDS);
    if bless() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/assets/v1.2/every-record-kind.report.json"
        );
        std::fs::write(path, report_json(GOLDEN_V1_2)).expect("write");
        return;
    }
    assert_eq!(report_json(GOLDEN_V1_2), GOLDEN_V1_2_REPORT);
    // 1.2: the header says the history ends at a snapshot of a running program.
    let t = load(GOLDEN_V1_2).expect("loads");
    assert_eq!(
        (t.model.header.format_major, t.model.header.format_minor),
        (1, 2)
    );
    assert_eq!(t.model.header.ends_at, TraceEnd::Snapshot);
    // The records are 1.1's: only the header grew.
    assert_eq!(records_json(&recs), GOLDEN_V1_1_RECORDS);
}

#[test]
fn golden_v1_3_trace_decodes_to_its_recorded_records_forever() {
    if bless() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/assets/v1.3/");
        std::fs::create_dir_all(dir).expect("mkdir");
        let bytes = every_record_kind_v1_3();
        std::fs::write(format!("{dir}every-record-kind.msgpack"), &bytes).expect("write");
        let (recs, ..) = decode_all(&bytes);
        std::fs::write(
            format!("{dir}every-record-kind.records.json"),
            records_json(&recs),
        )
        .expect("write");
        std::fs::write(
            format!("{dir}every-record-kind.report.json"),
            report_json(&bytes),
        )
        .expect("write");
        return;
    }
    let (recs, _, warnings, fatal) = decode_all(GOLDEN_V1_3);
    assert!(fatal.is_none(), "{fatal:?}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records_json(&recs), GOLDEN_V1_3_RECORDS);
    assert_eq!(report_json(GOLDEN_V1_3), GOLDEN_V1_3_REPORT);
    // 1.3: framework blocks (kind 7) inside the driver's allocation count in no device total;
    // the framework layer has them.
    let t = load(GOLDEN_V1_3).expect("loads");
    let m = &t.model;
    assert_eq!((m.header.format_major, m.header.format_minor), (1, 3));
    assert_eq!(m.allocs.at(4).kind, AllocKind::FrameworkBlock);
    assert_eq!(
        m.live_at_end_bytes(),
        1 << 20,
        "the driver's 1 MiB, not the blocks"
    );
    assert_eq!(m.allocated.len(), 1);
    assert_eq!(m.allocated[0].peak_bytes, 768 << 10);
    assert_eq!(m.allocated[0].live_bytes, 256 << 10);
    // The analysis reads the tensor in place of the driver allocation holding it.
    let v = layers::tensor_view(m).expect("a framework layer");
    assert_eq!(v.allocs.at(0).kind, AllocKind::Other, "the segment");
    assert_eq!(v.allocs.at(5).kind, AllocKind::Device, "the live tensor");
    assert_eq!(v.live_at_end_bytes(), 256 << 10);
    // A reader of 1.2 reads kind 7 as 255 "other", which counts nowhere either: the device
    // totals are the same for every reader.
    assert_eq!(
        AllocKind::from_code(7).is_device_memory(),
        AllocKind::Other.is_device_memory()
    );
}

#[test]
fn golden_v1_model_facts() {
    let t = load(GOLDEN_V1).expect("loads");
    let m = &t.model;
    assert_eq!(m.header.argv, ["./app", "--steps", "3"]);
    assert_eq!(m.allocs.len(), 4);
    // 1 MiB (alloc 0) stays live; 3 MiB freed stream-ordered; pinned host is not device memory;
    // process 1's 2 MiB is released by the context reset.
    assert_eq!(m.live_at_end_bytes(), 1 << 20);
    assert_eq!(m.peak_bytes, 4 << 20);
    assert_eq!(m.allocs.at(1).free_kind, FreeKind::StreamOrdered);
    assert_eq!(m.allocs.at(3).free_kind, FreeKind::ContextTeardown);
    assert_eq!(m.resets[0].freed_bytes, 2 << 20);
    // Thread 0 allocated 1 MiB of device memory and 4 KiB of pinned host memory in the range.
    assert_eq!(
        m.ranges.get(0).expect("the first range").alloc_bytes,
        (1 << 20) + 4096
    );
    assert_eq!(
        m.ranges.get(0).expect("the first range").end_ts_nanos,
        Some(3_200)
    );
    let frames = m.stack_frames(StackId(2));
    assert_eq!(frames[0].to_string(), "main (app.cu:17)");
    assert_eq!(frames[1].to_string(), "step (train.py:42)");
    assert!(m.clean_end);
    assert_eq!(m.header.ends_at, TraceEnd::Exit);
}

#[test]
fn the_current_encoder_still_writes_the_golden_bytes() {
    // While 1.3 is the current version, the encoder must produce the checked-in bytes exactly.
    // When the format grows (1.4), keep the old files and their tests above; drop only this check.
    assert_eq!(every_record_kind_v1_3(), GOLDEN_V1_3);
}

#[test]
fn a_cut_at_every_byte_keeps_every_complete_record_and_warns() {
    let (full, _) = generate(Scenario::MultiDevice, 300, 5);
    let (all, ends, _, fatal) = decode_all(&full);
    assert!(fatal.is_none());
    for cut in 0..full.len() {
        let (recs, _, warnings, fatal) = decode_all(&full[..cut]);
        let complete = ends.iter().filter(|&&e| e as usize <= cut).count();
        if let Some(e) = &fatal {
            // Only a cut inside the header fails outright.
            assert!(
                matches!(e, DecodeError::TruncatedHeader { .. } | DecodeError::Empty),
                "cut {cut}: {e}"
            );
            assert!(recs.is_empty());
            continue;
        }
        assert_eq!(recs.len(), complete, "cut {cut}");
        assert_eq!(recs[..], all[..complete], "cut {cut}");
        let at_boundary = cut as u64 == *ends.get(complete.wrapping_sub(1)).unwrap_or(&0)
            || complete == 0 && recs.is_empty();
        let truncated = warnings
            .iter()
            .any(|w| matches!(w, Warning::Truncated { .. }));
        if complete > 0 && at_boundary {
            assert!(!truncated, "cut {cut} is on a boundary");
        }
        if complete > 0 && !at_boundary {
            match warnings
                .iter()
                .find(|w| matches!(w, Warning::Truncated { .. }))
            {
                Some(Warning::Truncated { offset, bytes }) => {
                    assert_eq!(*offset, ends[complete - 1], "cut {cut}");
                    assert_eq!(*offset + *bytes, cut as u64, "cut {cut}");
                }
                _ => panic!("cut {cut}: no truncation warning in {warnings:?}"),
            }
        }
    }
}

#[test]
fn chunked_push_decodes_the_same_as_one_push() {
    let (full, _) = generate(Scenario::TrainingLeak, 3_000, 2);
    let (all, ..) = decode_all(&full);
    for chunk in [1usize, 2, 3, 7, 64, 4096] {
        let mut d = Decoder::new();
        let mut got = Vec::new();
        for c in full.chunks(chunk) {
            d.push(c);
            while let Some(r) = d.next_record().expect("decodes") {
                got.push(r);
            }
        }
        assert!(d.finish().expect("finishes").is_empty());
        assert_eq!(got, all, "chunk size {chunk}");
    }
}

fn header_with_version(major: u64, minor: u64) -> Vec<u8> {
    let mut out = Vec::new();
    write_array_len(&mut out, 4);
    write_str(&mut out, MAGIC);
    write_uint(&mut out, major);
    write_uint(&mut out, minor);
    out.push(0x80); // empty map
    out
}

#[test]
fn a_newer_major_version_is_refused_naming_both_versions() {
    let (_, _, _, fatal) = decode_all(&header_with_version(2, 3));
    let e = fatal.expect("refused");
    let msg = e.to_string();
    assert!(msg.contains("2.3"), "{msg}");
    assert!(msg.contains("1.x"), "{msg}");
}

/// A header with `ends_at` (since 1.2) and other keys, as map entries after the known ones.
fn header_with_keys(keys: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    write_array_len(&mut out, 4);
    write_str(&mut out, MAGIC);
    write_uint(&mut out, 1);
    write_uint(&mut out, 2);
    analysis_core::msgpack::write_map_len(&mut out, keys.len() as u32);
    for (k, v) in keys {
        write_str(&mut out, k);
        write_str(&mut out, v);
    }
    out
}

#[test]
fn ends_at_reads_snapshot_and_anything_else_as_exit() {
    let read = |keys: &[(&str, &str)]| {
        let mut d = Decoder::new();
        d.push(&header_with_keys(keys));
        assert_eq!(d.next_record(), Ok(None));
        d.header().expect("header").ends_at
    };
    assert_eq!(read(&[]), TraceEnd::Exit);
    assert_eq!(read(&[("ends_at", "snapshot")]), TraceEnd::Snapshot);
    assert_eq!(read(&[("ends_at", "exit")]), TraceEnd::Exit);
    // A value a newer version defines, and keys this version does not know.
    assert_eq!(
        read(&[("future", "x"), ("ends_at", "paused"), ("other", "y")]),
        TraceEnd::Exit
    );
    // The encoder writes the key only for a snapshot: 1.1 headers keep their bytes.
    let mut h = Encoder::header_v1();
    let exit = Encoder::new(&h).into_bytes();
    h.ends_at = TraceEnd::Snapshot;
    let snapshot = Encoder::new(&h).into_bytes();
    assert!(!exit.windows(7).any(|w| w == b"ends_at"));
    assert!(snapshot.windows(7).any(|w| w == b"ends_at"));
}

/// A time that would go below 0 is clamped to 0, with a warning, and the next record's delta
/// adds to the clamped time.
#[test]
fn a_clamped_time_is_the_clock_for_the_next_delta() {
    let mut bytes = header_with_version(1, 2);
    // mark at 10, mark at 10 - 25 (clamped to 0), mark 7 after that.
    for dt in [10i64, -25, 7] {
        write_array_len(&mut bytes, 2);
        write_uint(&mut bytes, 21);
        analysis_core::msgpack::write_int(&mut bytes, dt);
    }
    let (recs, _, warnings, fatal) = decode_all(&bytes);
    assert!(fatal.is_none());
    let times: Vec<_> = recs.iter().filter_map(Record::ts_nanos).collect();
    assert_eq!(times, [10, 0, 7]);
    assert!(
        matches!(warnings[..], [Warning::NegativeTime { .. }]),
        "{warnings:?}"
    );
}

/// Nullable fields are never omitted for being zero: an exit code 0 stays 0, and a missing or
/// nil one reads as "none" (unknown status), never as 0.
#[test]
fn a_zero_exit_code_is_written_and_a_missing_one_reads_as_none() {
    let exit = |code, signal| {
        Record::ProcessExit(ProcessExit {
            ts_nanos: 5,
            process: ProcessIdx(0),
            code,
            signal,
        })
    };
    let mut e = Encoder::new(&Encoder::header_v1());
    for r in [exit(Some(0), None), exit(None, Some(9)), exit(None, None)] {
        e.record(&r);
    }
    let mut bytes = e.into_bytes();
    // Hand-written: a record cut before its nullable fields, and one with a 0 exit code.
    for rec in [vec![24u64, 0, 0], vec![24, 0, 0, 0]] {
        write_array_len(&mut bytes, rec.len() as u32);
        for v in rec {
            write_uint(&mut bytes, v);
        }
    }
    let (recs, _, warnings, fatal) = decode_all(&bytes);
    assert!(fatal.is_none() && warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        recs,
        [
            exit(Some(0), None),
            exit(None, Some(9)),
            exit(None, None),
            exit(None, None),
            exit(Some(0), None),
        ]
    );
}

#[test]
fn unknown_tags_and_extra_fields_of_a_newer_minor_are_skipped() {
    let mut bytes = header_with_version(1, 9);
    // An unknown record kind with nested content.
    write_array_len(&mut bytes, 3);
    write_uint(&mut bytes, 99);
    write_str(&mut bytes, "future");
    write_array_len(&mut bytes, 2);
    write_uint(&mut bytes, 1);
    write_uint(&mut bytes, 2);
    // A known record (End) with two extra trailing fields.
    write_array_len(&mut bytes, 4);
    write_uint(&mut bytes, 26);
    write_uint(&mut bytes, 5);
    write_str(&mut bytes, "extra");
    write_uint(&mut bytes, 7);
    let (recs, _, warnings, fatal) = decode_all(&bytes);
    assert!(fatal.is_none());
    assert_eq!(recs, vec![Record::End { ts_nanos: 5 }]);
    assert_eq!(
        warnings,
        vec![Warning::UnknownRecords {
            first_tag: 99,
            count: 1
        }]
    );
}

#[test]
fn a_malformed_record_is_skipped_and_later_frees_stay_aligned() {
    let mut bytes = header_with_version(1, 0);
    // alloc #0 (valid), alloc #1 malformed (size is a string), alloc #2 valid, free of #2.
    for rec in [vec![16u64, 10, 100, 4096]] {
        write_array_len(&mut bytes, rec.len() as u32);
        for v in rec {
            write_uint(&mut bytes, v);
        }
    }
    write_array_len(&mut bytes, 3);
    write_uint(&mut bytes, 16);
    write_uint(&mut bytes, 10);
    write_str(&mut bytes, "big");
    write_array_len(&mut bytes, 4);
    for v in [16u64, 10, 300, 4096] {
        write_uint(&mut bytes, v);
    }
    write_array_len(&mut bytes, 3);
    for v in [17u64, 10, 1] {
        write_uint(&mut bytes, v);
    }
    let t = load(&bytes).expect("loads");
    assert!(
        t.warnings
            .iter()
            .any(|w| matches!(w, Warning::MalformedRecord { tag: 16, .. }))
    );
    assert_eq!(t.model.allocs.len(), 3);
    assert_eq!(
        t.model.live_at_end_bytes(),
        100,
        "the free hit alloc #2, not #1"
    );
}

#[test]
fn not_a_trace_and_empty_input_get_clear_errors() {
    for (input, needle) in [
        (&b"PK\x03\x04zipfile"[..], "not a gpucollect trace"),
        (&b"\x94\xa3abc\x01\x00\x80"[..], "magic"),
        (&b"\xc1"[..], "not a gpucollect trace"),
    ] {
        let (_, _, _, fatal) = decode_all(input);
        let msg = fatal.expect("error").to_string();
        assert!(msg.contains(needle), "{msg}");
    }
    assert_eq!(decode_all(b"").3, Some(DecodeError::Empty));
}

#[test]
fn bytes_that_are_not_msgpack_stop_decoding_but_keep_what_came_before() {
    let (mut full, _) = generate(Scenario::Clean, 200, 1);
    let (all, ends, ..) = decode_all(&full);
    let at = ends[20] as usize;
    full[at] = 0xc1;
    let (recs, _, _, fatal) = decode_all(&full);
    assert_eq!(recs[..], all[..21]);
    assert!(matches!(fatal, Some(DecodeError::Corrupt { offset, .. }) if offset == at as u64));
}

fn arb_alloc_kind() -> impl Strategy<Value = AllocKind> {
    (0u64..7).prop_map(AllocKind::from_code)
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        dt: u64,
        size: u64,
        address: u64,
        stack: u32,
        thread: u32,
        device: u32,
        kind: AllocKind,
        stream: u64,
    },
    Free {
        dt: u64,
        pick: usize,
        kind: u64,
    },
    Range {
        dt: u64,
        name: u32,
    },
    Sample {
        dt: u64,
        used: u64,
        procs: Vec<(u32, u64)>,
    },
    Str {
        id: u32,
        value: String,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u64..1 << 40,
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            0u32..300,
            0u32..8,
            arb_alloc_kind(),
            any::<u64>()
        )
            .prop_map(|(dt, size, address, stack, thread, device, kind, stream)| {
                Op::Alloc {
                    dt,
                    size,
                    address,
                    stack,
                    thread,
                    device,
                    kind,
                    stream,
                }
            }),
        (0u64..1 << 40, any::<usize>(), 0u64..3).prop_map(|(dt, pick, kind)| Op::Free {
            dt,
            pick,
            kind
        }),
        (0u64..1000, any::<u32>()).prop_map(|(dt, name)| Op::Range { dt, name }),
        (
            0u64..1000,
            any::<u64>(),
            proptest::collection::vec((any::<u32>(), any::<u64>()), 0..4)
        )
            .prop_map(|(dt, used, procs)| Op::Sample { dt, used, procs }),
        (any::<u32>(), ".{0,40}").prop_map(|(id, value)| Op::Str { id, value }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn records_round_trip(ops in proptest::collection::vec(arb_op(), 0..200)) {
        let mut e = Encoder::new(&Encoder::header_v1());
        let mut expected = Vec::new();
        let mut now = 0u64;
        let mut next_id = 0u64;
        for op in ops {
            let rec = match op {
                Op::Alloc { dt, size, address, stack, thread, device, kind, stream } => {
                    now += dt;
                    let r = Record::Alloc(Alloc { ts_nanos: now, id: AllocId(next_id), size_bytes: size, address, stack: StackId(stack), thread: ThreadIdx(thread), device: DeviceIdx(device), kind, stream, pool: 0, process: ProcessIdx(0) });
                    next_id += 1;
                    r
                }
                Op::Free { dt, pick, kind } => {
                    if next_id == 0 { continue; }
                    now += dt;
                    Record::Free(Free { ts_nanos: now, alloc: AllocId(pick as u64 % next_id), thread: ThreadIdx(1), kind: FreeKind::from_code(kind), stream: 3 })
                }
                Op::Range { dt, name } => { now += dt; Record::RangeBegin(RangeBegin { ts_nanos: now, range: RangeId(u64::from(name) * 3), name: StringId(name), domain: StringId(0), thread: ThreadIdx(0), process: ProcessIdx(0) }) }
                Op::Sample { dt, used, procs } => { now += dt; Record::DeviceSample(DeviceSample { ts_nanos: now, device: DeviceIdx(0), total_bytes: u64::MAX, free_bytes: 0, used_bytes: used, processes: procs.into_iter().map(|(pid, used_bytes)| ProcessUsage { pid, used_bytes }).collect() }) }
                Op::Str { id, value } => Record::String { id: StringId(id), value },
            };
            e.record(&rec);
            expected.push(rec);
        }
        let bytes = e.into_bytes();
        let (recs, _, warnings, fatal) = decode_all(&bytes);
        prop_assert!(fatal.is_none());
        prop_assert!(warnings.is_empty());
        prop_assert_eq!(recs, expected);
    }
}

/// Decodes `bytes` pushed in pieces of the given sizes (cycled).
fn decode_in_pieces(
    bytes: &[u8],
    sizes: &[usize],
) -> (Vec<Record>, Vec<Warning>, Option<DecodeError>) {
    let mut d = Decoder::new();
    let mut recs = Vec::new();
    let mut fatal = None;
    let mut rest = bytes;
    let mut i = 0;
    'push: while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        i += 1;
        d.push(&rest[..n]);
        rest = &rest[n..];
        loop {
            match d.next_record() {
                Ok(Some(r)) => recs.push(r),
                Ok(None) => break,
                Err(e) => {
                    fatal = Some(e);
                    break 'push;
                }
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
    (recs, warnings, fatal)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// A record cut by a push is scanned on from where the push ended (not parsed again): on
    /// any bytes after a valid header, damaged or not, pieces give what one push gives.
    #[test]
    fn pieces_decode_the_same_as_one_push(
        body in proptest::collection::vec(
            prop_oneof![Just(0x92u8), Just(0x93), Just(0xdc), Just(0xc0), Just(0xa3), Just(0x10), Just(0x63), Just(0x01), any::<u8>()],
            0..400,
        ),
        sizes in proptest::collection::vec(1usize..40, 1..8),
    ) {
        let mut bytes = header_with_version(1, 1);
        bytes.extend_from_slice(&body);
        let (recs, _, warnings, fatal) = decode_all(&bytes);
        let (p_recs, p_warnings, p_fatal) = decode_in_pieces(&bytes, &sizes);
        prop_assert_eq!(p_recs, recs);
        prop_assert_eq!(p_warnings, warnings);
        prop_assert_eq!(p_fatal, fatal);
    }
}
