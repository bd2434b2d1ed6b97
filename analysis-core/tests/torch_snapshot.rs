//! PyTorch memory snapshots (pickle and JSON) convert to traces whose numbers equal what the
//! snapshot's own segments and blocks say. Fixtures: tests/assets/torch (see its README).

use analysis_core::format::FreeKind;
use analysis_core::torch_snapshot::{
    BEFORE_HISTORY, ImportError, SnapshotLoader, convert, looks_like_snapshot,
};
use analysis_core::{load, summarize};

fn asset(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/assets/torch/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture exists")
}

fn expected(name: &str) -> serde_json::Value {
    serde_json::from_slice(&asset(&format!("{name}.expected.json"))).expect("expected json")
}

fn check(file: &str, expect: &serde_json::Value) -> analysis_core::torch_snapshot::ImportSummary {
    let bytes = asset(file);
    assert!(looks_like_snapshot(&bytes));
    let (trace, summary) = convert(&bytes).expect("converts");
    let t = load(&trace).expect("the converted trace loads");
    assert!(t.warnings.is_empty(), "{file}: {:?}", t.warnings);
    let m = &t.model;
    assert_eq!(
        m.live_at_end_bytes(),
        expect["live_at_end_bytes"].as_u64().expect("n"),
        "{file} live at end"
    );
    assert_eq!(
        m.peak_bytes,
        expect["peak_bytes"].as_u64().expect("n"),
        "{file} peak"
    );
    assert_eq!(
        m.failed.len() as u64,
        expect["failed_allocations"].as_u64().expect("n"),
        "{file}"
    );
    assert_eq!(
        summary.trace_entries,
        expect["trace_entries"].as_u64().expect("n")
    );
    // Reserved vs allocated at the end, per device, from the last pool sample.
    for (d, reserved) in expect["reserved_per_device"]
        .as_array()
        .expect("list")
        .iter()
        .enumerate()
    {
        let last = m
            .pool_samples
            .iter()
            .rev()
            .find(|s| s.device.0 as usize == d)
            .expect("a pool sample per device");
        assert_eq!(
            last.reserved_bytes,
            reserved.as_u64().expect("n"),
            "{file} reserved d{d}"
        );
        assert_eq!(
            last.used_bytes,
            expect["live_at_end_per_device"][d].as_u64().expect("n"),
            "{file} allocated d{d}"
        );
    }
    summary
}

#[test]
fn a_full_history_snapshot_matches_its_segments_as_pickle_and_as_json() {
    let expect = expected("two-devices");
    let s = check("two-devices.pickle", &expect);
    assert_eq!(s.devices, 2);
    assert_eq!(s.reconstructed_blocks, 0);
    assert_eq!(s.ghost_frees, 0);
    assert!(s.ranges > 10);
    let j = check("two-devices.json", &expect);
    assert_eq!(s, j, "pickle and JSON give the same conversion");
    // The same trace, byte for byte (the allocator settings in the order the file has them).
    let (from_pickle, _) = convert(&asset("two-devices.pickle")).expect("converts");
    let (from_json, _) = convert(&asset("two-devices.json")).expect("converts");
    assert!(
        from_pickle == from_json,
        "pickle and JSON give the same trace bytes"
    );
    // The leak is found at its Python call site.
    let (trace, _) = convert(&asset("two-devices.pickle")).expect("converts");
    let report = summarize(&load(&trace).expect("loads"));
    let json = serde_json::to_string(&report).expect("serializes");
    assert!(
        json.contains("record_loss"),
        "the leaking call site is named"
    );
}

#[test]
fn ring_buffer_gaps_are_reconstructed_not_dropped_or_double_counted() {
    let expect = expected("ring-buffer");
    let s = check("ring-buffer.pickle", &expect);
    assert!(s.reconstructed_blocks > 0, "{s:?}");
    assert!(s.ghost_frees > 0, "{s:?}");
    // Reconstructed blocks are attributed to a stack that says so.
    let (trace, _) = convert(&asset("ring-buffer.pickle")).expect("converts");
    let m = load(&trace).expect("loads").model;
    let flagged = m
        .allocs
        .iter()
        .filter(|a| m.stack_label(a.stack).contains(BEFORE_HISTORY))
        .count() as u64;
    assert_eq!(flagged, s.reconstructed_blocks + s.ghost_frees);
}

#[test]
fn bad_input_is_a_clear_error() {
    let two = asset("two-devices.pickle");
    for cut in [1, 10, two.len() / 2, two.len() - 1] {
        let e = convert(&two[..cut]).expect_err("truncated");
        assert!(e.to_string().contains("truncated"), "{cut}: {e}");
    }
    // A pickle that is data but not a snapshot, and JSON that is not one.
    let not_snapshot = b"\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.";
    assert_eq!(convert(not_snapshot).err(), Some(ImportError::NotASnapshot));
    assert_eq!(
        convert(b"{\"x\": 1}").err(),
        Some(ImportError::NotASnapshot)
    );
    assert!(matches!(convert(b"{\"x\": "), Err(ImportError::Json(_))));
    // Code is refused, never run: `pickle.dumps(os.system, protocol=4)`.
    let code =
        b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
    let e = convert(code).expect_err("refused");
    assert!(e.to_string().contains("never executes"), "{e}");
}

/// A real snapshot from PyTorch 2.11 on an H100 (scripts/torch-snapshot.py; see the fixtures'
/// README): live at end, peak and reserved equal what PyTorch itself reported.
#[test]
fn a_real_pytorch_snapshot_matches_torch_cuda_memory_counters() {
    let expect = expected("real-torch");
    let (trace, summary) = convert(&asset("real-torch.pickle")).expect("converts");
    assert_eq!(summary.skipped, Vec::new());
    let m = load(&trace).expect("loads").model;
    assert_eq!(
        m.live_at_end_bytes(),
        expect["memory_allocated"].as_u64().expect("n")
    );
    assert_eq!(
        m.peak_bytes,
        expect["max_memory_allocated"].as_u64().expect("n")
    );
    let last = m.pool_samples.last().expect("pool samples");
    assert_eq!(
        last.reserved_bytes,
        expect["memory_reserved"].as_u64().expect("n")
    );
    assert_eq!(
        last.used_bytes,
        expect["memory_allocated"].as_u64().expect("n")
    );
    assert!(
        summary.ranges >= 30,
        "record_function scopes: {}",
        summary.ranges
    );
}

/// Everything a replayed model holds, in a form that compares (maps sorted by key).
fn model_digest(t: &analysis_core::LoadedTrace) -> serde_json::Value {
    use std::collections::BTreeMap;
    let m = &t.model;
    let sorted = |v: Vec<(String, serde_json::Value)>| -> BTreeMap<String, serde_json::Value> {
        v.into_iter().collect()
    };
    let points =
        |tl: &analysis_core::timeline::Timeline| serde_json::json!([tl.times(), tl.values()]);
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

/// The model built directly from a snapshot equals the one decoded from the converted trace
/// bytes, and so does the report: the viewer (direct) and `gpucollect import` + `report`
/// (bytes) show the same numbers.
fn assert_direct_equals_decoded(name: &str, bytes: &[u8]) {
    let (trace, s1) = convert(bytes).expect("converts");
    let decoded = load(&trace).expect("loads");
    let (direct, s2) = analysis_core::torch_snapshot::load(bytes).expect("loads directly");
    assert_eq!(s1, s2, "{name}: import summaries");
    assert_eq!(
        model_digest(&direct),
        model_digest(&decoded),
        "{name}: models"
    );
    assert_eq!(summarize(&direct), summarize(&decoded), "{name}: reports");
}

#[test]
fn direct_models_equal_decoded_ones_for_the_fixtures() {
    for name in [
        "two-devices.pickle",
        "two-devices.json",
        "ring-buffer.pickle",
        "real-torch.pickle",
    ] {
        assert_direct_equals_decoded(name, &asset(name));
    }
}

/// A small deterministic generator (no dependencies).
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// A JSON snapshot with random entries, including what real ones rarely have: out-of-order
/// times, frees of unseen blocks, double allocations, unknown actions, entries without an action
/// or a size, unbalanced annotations, blocks that only the final segments know.
fn random_snapshot(seed: u64) -> Vec<u8> {
    use serde_json::json;
    let mut st = seed;
    let devices = 1 + (lcg(&mut st) % 3) as usize;
    let stacks = [
        json!([{"filename": "a.py", "line": 1, "name": "f"}, {"filename": "b.py", "line": 2, "name": "g"}]),
        json!([{"filename": "c.py", "line": 3, "name": "h"}]),
        json!([]),
    ];
    let actions = [
        "alloc",
        "alloc",
        "alloc",
        "free_requested",
        "free_completed",
        "free_completed",
        "free",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
        "annotate",
        "weird",
    ];
    let mut traces = Vec::new();
    let mut t: i64 = 1_000_000;
    for _ in 0..devices {
        let mut list = Vec::new();
        for _ in 0..(200 + lcg(&mut st) % 300) {
            t += (lcg(&mut st) % 50) as i64 - 5;
            let addr = 0x1000 * (lcg(&mut st) % 40) as i64;
            let mut e = json!({
                "addr": addr,
                "stream": lcg(&mut st) % 2,
                "time_us": t,
                "frames": stacks[(lcg(&mut st) % 3) as usize],
            });
            match lcg(&mut st) % 20 {
                0 => {}
                1 => e["action"] = json!(actions[(lcg(&mut st) % 15) as usize]),
                _ => {
                    e["action"] = json!(actions[(lcg(&mut st) % 15) as usize]);
                    e["size"] = json!(1 + lcg(&mut st) % 5_000_000);
                }
            }
            list.push(e);
        }
        traces.push(list);
    }
    let mut annotations = Vec::new();
    for _ in 0..(lcg(&mut st) % 30) {
        annotations.push(json!({
            "device": lcg(&mut st) % devices as u64,
            "stage": if lcg(&mut st).is_multiple_of(2) { "START" } else { "END" },
            "name": if lcg(&mut st).is_multiple_of(2) { "step" } else { "fwd" },
            "time_us": 1_000_000 + (lcg(&mut st) % 20_000) as i64,
        }));
    }
    let segments: Vec<_> = (0..devices)
        .map(|d| {
            let blocks: Vec<_> = (0..lcg(&mut st) % 6)
                .map(|_| {
                    json!({
                        "address": 0x1000 * (lcg(&mut st) % 60) as i64,
                        "size": 512 * (1 + lcg(&mut st) % 100),
                        "state": if lcg(&mut st).is_multiple_of(4) { "inactive" } else { "active_allocated" },
                        "frames": stacks[(lcg(&mut st) % 3) as usize],
                    })
                })
                .collect();
            json!({"device": d, "address": 0, "total_size": 20 << 20, "blocks": blocks})
        })
        .collect();
    serde_json::to_vec(&json!({
        "segments": segments,
        "device_traces": traces,
        "external_annotations": annotations,
        "allocator_settings": {"expandable_segments": false, "max_split_size": 7},
    }))
    .expect("serializes")
}

#[test]
fn direct_models_equal_decoded_ones_for_random_snapshots() {
    for seed in 0..40 {
        assert_direct_equals_decoded(&format!("seed {seed}"), &random_snapshot(seed));
    }
}

/// An allocation as replayed: its time, size, and free (time, kind).
type Replayed = (u64, u64, Option<(u64, FreeKind)>);

/// The replay's rules, written plainly with maps by address (the converter resolves them in
/// one pass before the replay, so the replay needs no map): each allocation's time, size, and
/// free (time, kind), in id order. Blocks alive at time 0 come first: ghosts (freed before the
/// history allocates them, in replay order), then the final segments' active blocks the history
/// does not leave allocated; any of them ends where the replay first closes a block at its
/// address. An allocation at an address still allocated closes the old block ("other"); a
/// completed free is stream-ordered when its free was requested earlier.
fn reference_replay(snapshot: &serde_json::Value) -> Vec<Replayed> {
    use std::collections::HashMap;
    let block = |n: u64| n.div_ceil(512) * 512;
    let mut entries = Vec::new();
    for (d, list) in snapshot["device_traces"]
        .as_array()
        .expect("list")
        .iter()
        .enumerate()
    {
        for e in list.as_array().expect("list") {
            entries.push((e["time_us"].as_i64().unwrap_or(0), entries.len(), d, e));
        }
    }
    entries.sort_by_key(|&(t, pos, ..)| (t, pos));
    let t0 = entries.first().map_or(0, |e| e.0);
    let ns = |t: i64| (t - t0).max(0) as u64 * 1000;
    fn action(e: &serde_json::Value) -> &str {
        match e["action"].as_str().unwrap_or("") {
            "free" => "free_completed",
            a => a,
        }
    }
    let key = |d: usize, e: &serde_json::Value| (d, e["addr"].as_i64().unwrap_or(0));
    // Ghosts, and which addresses the history leaves allocated.
    let mut seen: HashMap<(usize, i64), bool> = HashMap::new();
    let mut start: Vec<((usize, i64), u64)> = Vec::new();
    for &(_, _, d, e) in &entries {
        let k = key(d, e);
        match action(e) {
            "alloc" => {
                seen.insert(k, true);
            }
            a @ ("free_requested" | "free_completed") => {
                if let std::collections::hash_map::Entry::Vacant(v) = seen.entry(k) {
                    start.push((k, block(e["size"].as_u64().unwrap_or(0))));
                    v.insert(false);
                } else if a == "free_completed" {
                    seen.remove(&k);
                }
            }
            _ => {}
        }
    }
    let mut started: std::collections::HashSet<_> = start.iter().map(|s| s.0).collect();
    for (d, seg) in snapshot["segments"]
        .as_array()
        .expect("list")
        .iter()
        .enumerate()
    {
        assert_eq!(
            seg["device"].as_u64(),
            Some(d as u64),
            "one segment per device here"
        );
        for b in seg["blocks"].as_array().expect("list") {
            let k = (d, b["address"].as_i64().expect("address"));
            if b["state"].as_str().unwrap_or("").starts_with("active")
                && seen.get(&k) != Some(&true)
                && started.insert(k)
            {
                start.push((k, b["size"].as_u64().expect("size")));
            }
        }
    }
    let mut out: Vec<Replayed> = Vec::new();
    let mut live: HashMap<(usize, i64), usize> = HashMap::new();
    for &(k, size) in &start {
        live.insert(k, out.len());
        out.push((0, size, None));
    }
    let mut requested: HashMap<(usize, i64), u64> = HashMap::new();
    for &(t, _, d, e) in &entries {
        let (k, ts) = (key(d, e), ns(t));
        match action(e) {
            "alloc" => {
                let Some(size) = e["size"].as_u64() else {
                    continue;
                };
                if let Some(old) = live.remove(&k) {
                    out[old].2 = Some((ts, FreeKind::Other));
                }
                live.insert(k, out.len());
                out.push((ts, block(size), None));
            }
            "free_requested" => {
                requested.insert(k, ts);
            }
            "free_completed" => {
                let kind = match requested.remove(&k) {
                    Some(r) if r < ts => FreeKind::StreamOrdered,
                    _ => FreeKind::Immediate,
                };
                if let Some(id) = live.remove(&k) {
                    out[id].2 = Some((ts, kind));
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_replay_follows_its_rules_for_random_snapshots() {
    for seed in 0..60 {
        let bytes = random_snapshot(seed);
        let snapshot: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        let (t, _) = analysis_core::torch_snapshot::load(&bytes).expect("loads");
        let got: Vec<_> = t
            .model
            .allocs
            .iter()
            .map(|a| {
                let free = (!a.is_live()).then_some((a.free_ts_nanos, a.free_kind));
                (a.ts_nanos, a.size_bytes, free)
            })
            .collect();
        assert_eq!(got, reference_replay(&snapshot), "seed {seed}");
    }
}

/// Pushes `pieces` into a [`SnapshotLoader`] (the first error from a push is kept and the rest
/// skipped) and finishes it.
fn load_in_pieces(
    size_hint: Option<usize>,
    pieces: &[&[u8]],
) -> Result<
    (
        analysis_core::LoadedTrace,
        analysis_core::torch_snapshot::ImportSummary,
    ),
    ImportError,
> {
    let mut loader = SnapshotLoader::new(size_hint);
    for piece in pieces {
        if loader.push(piece).is_err() {
            break;
        }
    }
    loader.finish()
}

/// What a load gives, in a form that compares.
fn outcome(
    r: Result<
        (
            analysis_core::LoadedTrace,
            analysis_core::torch_snapshot::ImportSummary,
        ),
        ImportError,
    >,
) -> Result<
    (
        serde_json::Value,
        u64,
        analysis_core::torch_snapshot::ImportSummary,
    ),
    ImportError,
> {
    r.map(|(t, s)| (model_digest(&t), t.bytes, s))
}

/// Random piece sizes from 1 to `max` bytes.
fn random_pieces(bytes: &[u8], seed: u64, max: u64) -> Vec<&[u8]> {
    let mut st = seed;
    let mut pieces = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = (1 + lcg(&mut st) % max).min(rest.len() as u64) as usize;
        let (a, b) = rest.split_at(n);
        pieces.push(a);
        rest = b;
    }
    pieces
}

/// Loading a snapshot pushed in pieces gives exactly what loading it whole gives, wherever
/// the pieces are cut: byte by byte (a cut at every point), in two pieces at many points, and
/// in random pieces; with and without a size hint.
#[test]
fn a_snapshot_pushed_in_pieces_loads_like_the_whole() {
    for name in [
        "ring-buffer.pickle",
        "two-devices.pickle",
        "real-torch.pickle",
        "two-devices.json",
    ] {
        let bytes = asset(name);
        let whole = outcome(analysis_core::torch_snapshot::load(&bytes));
        assert!(whole.is_ok(), "{name}");
        if name == "ring-buffer.pickle" {
            let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(outcome(load_in_pieces(None, &one_by_one)), whole, "{name}");
        }
        let cuts = (0..24).chain((24..bytes.len()).step_by(bytes.len() / 7 + 1));
        for cut in cuts.chain([bytes.len() - 1, bytes.len()]) {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(
                outcome(load_in_pieces(Some(bytes.len()), &[a, b])),
                whole,
                "{name} cut at {cut}"
            );
        }
        for seed in 0..3 {
            let pieces = random_pieces(&bytes, seed, 1 << (4 + 4 * seed));
            assert_eq!(
                outcome(load_in_pieces(None, &pieces)),
                whole,
                "{name} seed {seed}"
            );
        }
    }
}

/// A truncated pickle pushed in pieces is accepted piece by piece (more could come) and fails
/// at `finish` with the error loading it whole gives; an error that does not depend on what
/// comes next (code) fails the push that brings it, and stays.
#[test]
fn a_truncated_or_refused_snapshot_pushed_in_pieces_fails_like_the_whole() {
    let two = asset("two-devices.pickle");
    for cut in [1, 2, 10, 11, two.len() / 3, two.len() / 2, two.len() - 1] {
        let b = &two[..cut];
        let whole = analysis_core::torch_snapshot::load(b).expect_err("truncated");
        let mut loader = SnapshotLoader::new(Some(two.len()));
        for piece in b.chunks(4093) {
            loader.push(piece).expect("more may come");
        }
        assert_eq!(loader.bytes_read(), cut as u64);
        let e = loader.finish().expect_err("truncated");
        assert_eq!(e, whole, "cut at {cut}");
        assert!(e.to_string().contains("truncated"), "{cut}: {e}");
    }
    let code =
        b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
    let whole = analysis_core::torch_snapshot::load(code).expect_err("refused");
    let mut loader = SnapshotLoader::new(None);
    let (a, b) = code.split_at(10);
    loader.push(a).expect("data so far");
    assert_eq!(loader.push(b).expect_err("refused"), whole);
    assert_eq!(loader.push(b"more").expect_err("stays refused"), whole);
    assert_eq!(loader.finish().expect_err("refused"), whole);
    // Nothing at all, and JSON that is not a snapshot: as `load`.
    assert_eq!(
        SnapshotLoader::new(None).finish().err(),
        analysis_core::torch_snapshot::load(b"").err()
    );
    let mut loader = SnapshotLoader::new(None);
    loader.push(b"").expect("nothing");
    loader.push(b"{\"x\"").expect("json");
    loader.push(b": 1}").expect("json");
    assert_eq!(loader.finish().err(), Some(ImportError::NotASnapshot));
}

/// What a loader says is left to convert: the trace entries of a pickle parsed so far (all of
/// them once the input is in), nothing before any input, unknown for JSON (parsed at the end).
#[test]
fn pending_entries_count_the_trace_entries_parsed_so_far() {
    let two = asset("two-devices.pickle");
    let mut loader = SnapshotLoader::new(None);
    assert_eq!(loader.pending_entries(), Some(0));
    let (a, b) = two.split_at(two.len() / 2);
    loader.push(a).expect("pickle");
    let half = loader.pending_entries().expect("a pickle");
    loader.push(b).expect("pickle");
    let all = loader.pending_entries().expect("a pickle");
    assert!(0 < half && half < all, "{half} of {all}");
    let (_, summary) = loader.finish().expect("converts");
    assert_eq!(all, summary.trace_entries);

    let mut json = SnapshotLoader::new(None);
    json.push(&asset("two-devices.json")).expect("json");
    assert_eq!(json.pending_entries(), None);
}
