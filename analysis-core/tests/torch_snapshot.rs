//! PyTorch memory snapshots (pickle and JSON) convert to traces whose numbers equal what the
//! snapshot's own segments and blocks say. Fixtures: tests/assets/torch (see its README).

mod common;
use common::model_digest;

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
    // The history ends at a snapshot of the running program, and is complete to it.
    assert_eq!(m.header.ends_at, analysis_core::TraceEnd::Snapshot);
    assert!(m.clean_end);
    assert_eq!(
        m.live_at_end_bytes(),
        expect["memory_allocated"].as_u64().expect("n")
    );
    assert_eq!(
        m.peak_bytes,
        expect["max_memory_allocated"].as_u64().expect("n")
    );
    let last = m.pool_samples.iter().last().expect("pool samples");
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

/// The caching allocator's block size for a request of `requested` bytes taken from a free
/// block of `free` bytes (None: no known segment holds it), with `max_split` bytes as
/// `max_split_size`, no power-of-two divisions and no expandable segments: the request rounded
/// up to 512 bytes, or the whole free block where the large pool (over 1 MiB) does not split
/// (a remainder of at most 1 MiB, or a request of at least `max_split`).
fn reference_block(requested: u64, free: Option<u64>, max_split: u64) -> u64 {
    let rounded = if requested == 0 {
        0
    } else {
        requested.div_ceil(512) * 512
    };
    match free {
        Some(free) if rounded > 1 << 20 && free >= rounded => {
            let split = rounded < max_split && free - rounded > 1 << 20;
            if split { rounded } else { free }
        }
        _ => rounded,
    }
}

/// The replay's rules, written plainly with maps by address (the converter resolves them in
/// one pass before the replay, so the replay needs no map): each allocation's time, size, and
/// free (time, kind), in id order. Blocks alive at time 0 come first: ghosts (freed before the
/// history allocates them, in replay order), then the final segments' active blocks the history
/// does not leave allocated; any of them ends where the replay first closes a block at its
/// address. An allocation at an address still allocated closes the old block ("other"); a free
/// request frees the block (as `memory_allocated()` counts), stream-ordered unless its
/// completion comes at the same time; a completed free without a request frees it then. Sizes: an allocation
/// still live at the end that the final segments list takes that block's size; any other
/// takes [`reference_block`] of the free space from its address to the next large block of its
/// segment or that segment's end. Its segment: the one starting last at or before its address,
/// if it holds the address (segments as the final table and the history's segment entries
/// say). A large block takes its place in its segment until it is freed, or, freed by a
/// stream-ordered request, until the free completes.
fn reference_replay(snapshot: &serde_json::Value) -> Vec<Replayed> {
    // Which allocations stay live decides nothing about sizes, so a first replay finds them
    // and the second one sizes them.
    let (first, keys) = reference_replay_sized(snapshot, &Default::default());
    let mut final_sizes = std::collections::HashMap::new();
    for (d, seg) in snapshot["segments"]
        .as_array()
        .expect("list")
        .iter()
        .enumerate()
    {
        for b in seg["blocks"].as_array().expect("list") {
            if b["state"].as_str().unwrap_or("").starts_with("active") {
                let k = (d, b["address"].as_i64().expect("address"));
                final_sizes.insert(k, b["size"].as_u64().expect("size"));
            }
        }
    }
    let overrides = first
        .iter()
        .zip(&keys)
        .enumerate()
        .filter(|(_, (r, k))| r.2.is_none() && k.1)
        .filter_map(|(i, (_, k))| final_sizes.get(&k.0).map(|&s| (i, s)))
        .collect();
    reference_replay_sized(snapshot, &overrides).0
}

/// One replay of [`reference_replay`], with the sizes of `overrides` (by output index); also
/// returns each allocation's (device, address) and whether the history allocated it.
#[allow(clippy::type_complexity)]
fn reference_replay_sized(
    snapshot: &serde_json::Value,
    overrides: &std::collections::HashMap<usize, u64>,
) -> (Vec<Replayed>, Vec<((usize, i64), bool)>) {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    let block = |n: u64| n.div_ceil(512) * 512;
    let max_split = snapshot["allocator_settings"]["max_split_size"]
        .as_u64()
        .filter(|&n| n > 0)
        .unwrap_or(u64::MAX);
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
            "segment_map" => "segment_alloc",
            "segment_unmap" => "segment_free",
            a => a,
        }
    }
    let key = |d: usize, e: &serde_json::Value| (d, e["addr"].as_i64().unwrap_or(0));
    // Ghosts, and which addresses the history leaves allocated; segments at the start.
    let mut seen: HashMap<(usize, i64), bool> = HashMap::new();
    let mut start: Vec<((usize, i64), u64)> = Vec::new();
    let mut first_segment: HashMap<(usize, i64), (bool, u64)> = HashMap::new();
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
            a @ ("segment_alloc" | "segment_free") => {
                if let Some(size) = e["size"].as_u64() {
                    first_segment
                        .entry(k)
                        .or_insert((a == "segment_alloc", size));
                }
            }
            _ => {}
        }
    }
    let mut segments: HashMap<usize, BTreeMap<i64, u64>> = HashMap::new();
    for (&k, &(added, size)) in &first_segment {
        if !added {
            segments.entry(k.0).or_default().insert(k.1, size);
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
        let at = seg["address"].as_i64().expect("address");
        if !first_segment.contains_key(&(d, at)) {
            segments
                .entry(d)
                .or_default()
                .insert(at, seg["total_size"].as_u64().expect("size"));
        }
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
    // Which free requests complete at their own time (immediate), by entry: a request is
    // answered by the next completion at its address, unless an allocation or another request
    // there comes first; one never completed is stream-ordered.
    let mut immediate: HashMap<usize, bool> = HashMap::new();
    let mut open: HashMap<(usize, i64), (usize, i64)> = HashMap::new();
    for &(t, pos, d, e) in &entries {
        let k = key(d, e);
        match action(e) {
            "alloc" if e["size"].as_u64().is_some() => {
                open.remove(&k);
            }
            "free_requested" => {
                open.insert(k, (pos, t));
            }
            "free_completed" => {
                if let Some((req, rt)) = open.remove(&k) {
                    immediate.insert(req, ns(rt) >= ns(t));
                }
            }
            _ => {}
        }
    }
    // Segments: (end, start addresses of their large blocks), by id; live ones by device and
    // start address.
    let mut segs: Vec<(i64, BTreeSet<i64>)> = Vec::new();
    let mut seg_at: HashMap<usize, BTreeMap<i64, usize>> = HashMap::new();
    let add_segment = |segs: &mut Vec<(i64, BTreeSet<i64>)>,
                       seg_at: &mut HashMap<usize, BTreeMap<i64, usize>>,
                       d: usize,
                       start: i64,
                       size: u64| {
        seg_at.entry(d).or_default().insert(start, segs.len());
        segs.push((start + size as i64, BTreeSet::new()));
    };
    for (&d, starts) in &segments {
        for (&start, &size) in starts {
            add_segment(&mut segs, &mut seg_at, d, start, size);
        }
    }
    let segment_of = |segs: &Vec<(i64, BTreeSet<i64>)>,
                      seg_at: &HashMap<usize, BTreeMap<i64, usize>>,
                      k: (usize, i64)| {
        seg_at
            .get(&k.0)
            .and_then(|m| m.range(..=k.1).next_back())
            .map(|(_, &id)| id)
            .filter(|&id| k.1 < segs[id].0)
    };
    let mut out: Vec<Replayed> = Vec::new();
    let mut keys = Vec::new();
    // Each allocation's segment, where it is a large block that takes its place in one.
    let mut place: Vec<Option<usize>> = Vec::new();
    let mut live: HashMap<(usize, i64), usize> = HashMap::new();
    for &(k, size) in &start {
        live.insert(k, out.len());
        let seg = segment_of(&segs, &seg_at, k).filter(|_| size > 1 << 20);
        if let Some(id) = seg {
            segs[id].1.insert(k.1);
        }
        place.push(seg);
        out.push((0, size, None));
        keys.push((k, false));
    }
    let leave = |segs: &mut Vec<(i64, BTreeSet<i64>)>,
                 place: &[Option<usize>],
                 id: usize,
                 k: (usize, i64)| {
        if let Some(s) = place[id] {
            segs[s].1.remove(&k.1);
        }
    };
    // Requests not completed yet: the block they freed, if any.
    let mut requested: HashMap<(usize, i64), Option<usize>> = HashMap::new();
    for &(t, pos, d, e) in &entries {
        let (k, ts) = (key(d, e), ns(t));
        match action(e) {
            "alloc" => {
                let Some(size) = e["size"].as_u64() else {
                    continue;
                };
                if let Some(old) = live.remove(&k) {
                    out[old].2 = Some((ts, FreeKind::Other));
                    leave(&mut segs, &place, old, k);
                }
                requested.remove(&k);
                let seg = segment_of(&segs, &seg_at, k);
                let free = seg.map(|id| {
                    let (end, blocks) = &segs[id];
                    let next = blocks.range(k.1 + 1..).next().copied().unwrap_or(*end);
                    (next - k.1) as u64
                });
                let size = overrides
                    .get(&out.len())
                    .copied()
                    .unwrap_or_else(|| reference_block(size, free, max_split));
                let seg = seg.filter(|_| size > 1 << 20);
                if let Some(id) = seg {
                    segs[id].1.insert(k.1);
                }
                live.insert(k, out.len());
                place.push(seg);
                out.push((ts, size, None));
                keys.push((k, true));
            }
            // A request frees the block; an immediate one ends its place in its segment now, a
            // stream-ordered one when it completes.
            "free_requested" => {
                let now = immediate.get(&pos).copied().unwrap_or(false);
                let id = live.remove(&k);
                if let Some(id) = id {
                    let kind = if now {
                        FreeKind::Immediate
                    } else {
                        FreeKind::StreamOrdered
                    };
                    out[id].2 = Some((ts, kind));
                    if now {
                        leave(&mut segs, &place, id, k);
                    }
                }
                requested.insert(k, id.filter(|_| !now));
            }
            "free_completed" => match requested.remove(&k) {
                Some(Some(id)) => leave(&mut segs, &place, id, k),
                Some(None) => {}
                None => {
                    if let Some(id) = live.remove(&k) {
                        out[id].2 = Some((ts, FreeKind::Immediate));
                        leave(&mut segs, &place, id, k);
                    }
                }
            },
            "segment_alloc" => {
                if let Some(size) = e["size"].as_u64() {
                    add_segment(&mut segs, &mut seg_at, d, k.1, size);
                }
            }
            "segment_free" if e["size"].as_u64().is_some() => {
                seg_at.entry(d).or_default().remove(&k.1);
            }
            _ => {}
        }
    }
    (out, keys)
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

const MIB: u64 = 1 << 20;

/// A snapshot (JSON) whose caching allocator left large blocks unsplit, as PyTorch 2.x does:
/// an 11.5 MiB request in a fresh 12 MiB segment gets all of it (0.5 MiB left is not split off
/// in the large pool), a 17.5 MiB request in the 18 MiB left of a 20 MiB segment gets the 18
/// MiB, and a 9 MiB request at or above `max_split_size` (8 MiB here, `max_split` bytes) takes a
/// whole free 28 MiB block. A 100-byte request gets 512 bytes. The segment table at the end
/// says what PyTorch's counters would: `allocated_size` per segment.
fn unsplit_snapshot(max_split: i64, oom_free_bytes: i64) -> serde_json::Value {
    use serde_json::json;
    let base: i64 = 0x7f00_0000_0000;
    let (a, b, c, d) = (
        base,
        base + 0x100_0000,
        base + 0x300_0000,
        base + 0x500_0000,
    );
    let mib = MIB as i64;
    let e = |t: i64, action: &str, addr: i64, size: i64| {
        json!({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
               "frames": [{"filename": "train.py", "line": t, "name": "step"}]})
    };
    let trace = vec![
        e(1, "segment_alloc", a, 12 * mib),
        e(2, "alloc", a, 23 * mib / 2),
        e(3, "segment_alloc", b, 20 * mib),
        e(4, "alloc", b, 2 * mib),
        e(5, "alloc", b + 2 * mib, 35 * mib / 2),
        e(6, "free_requested", b + 2 * mib, 35 * mib / 2),
        e(6, "free_completed", b + 2 * mib, 35 * mib / 2),
        e(7, "segment_alloc", c, 28 * mib),
        e(8, "alloc", c, 28 * mib),
        // Stream-ordered: completes a microsecond after the request.
        e(9, "free_requested", c, 28 * mib),
        e(10, "free_completed", c, 28 * mib),
        e(10, "alloc", c, 9 * mib),
        e(11, "free_requested", c, 9 * mib),
        e(11, "free_completed", c, 9 * mib),
        e(12, "segment_alloc", d, 2 * mib),
        e(13, "alloc", d, 100),
        e(14, "oom", oom_free_bytes, 40 * mib),
    ];
    let block =
        |addr: i64, size: i64, state: &str| json!({"address": addr, "size": size, "state": state});
    let segment = |addr: i64, total: i64, allocated: i64, blocks: Vec<serde_json::Value>| {
        json!({"device": 0, "address": addr, "total_size": total, "allocated_size": allocated,
               "segment_type": if total == 2 * mib { "small" } else { "large" }, "blocks": blocks})
    };
    json!({
        "segments": [
            segment(a, 12 * mib, 12 * mib, vec![block(a, 12 * mib, "active_allocated")]),
            segment(b, 20 * mib, 2 * mib, vec![
                block(b, 2 * mib, "active_allocated"),
                block(b + 2 * mib, 18 * mib, "inactive"),
            ]),
            segment(c, 28 * mib, 0, vec![block(c, 28 * mib, "inactive")]),
            segment(d, 2 * mib, 512, vec![
                block(d, 512, "active_allocated"),
                block(d + 512, 2 * mib - 512, "inactive"),
            ]),
        ],
        "device_traces": [trace],
        "allocator_settings": {"max_split_size": max_split, "expandable_segments": false},
    })
}

/// Allocation sizes are the caching allocator's blocks, not the requests rounded to 512 bytes:
/// live bytes equal the segment table's active blocks and `allocated_size`, and the peak is
/// what `max_memory_allocated()` counts. `max_split_size` decides whether the 9 MiB request is
/// split off its 28 MiB block.
#[test]
fn unsplit_large_blocks_count_whole_as_pytorch_counts_them() {
    for (max_split, nine_mib_block, unsplit) in [(8 * MIB as i64, 28 * MIB, 3), (-1, 9 * MIB, 2)] {
        let snapshot = unsplit_snapshot(max_split, 5_000_000_000);
        let bytes = serde_json::to_vec(&snapshot).expect("json");
        let (trace, summary) = convert(&bytes).expect("converts");
        let m = load(&trace).expect("loads").model;
        let sizes: Vec<u64> = m.allocs.iter().map(|a| a.size_bytes).collect();
        assert_eq!(
            sizes,
            [12 * MIB, 2 * MIB, 18 * MIB, 28 * MIB, nine_mib_block, 512],
            "max_split_size {max_split}"
        );
        let segments = snapshot["segments"].as_array().expect("list");
        let allocated: u64 = segments
            .iter()
            .map(|s| s["allocated_size"].as_u64().expect("n"))
            .sum();
        let active: u64 = segments
            .iter()
            .flat_map(|s| s["blocks"].as_array().expect("list"))
            .filter(|b| b["state"] == "active_allocated")
            .map(|b| b["size"].as_u64().expect("n"))
            .sum();
        assert_eq!(m.live_at_end_bytes(), active);
        assert_eq!(m.live_at_end_bytes(), allocated);
        assert_eq!(m.live_at_end_bytes(), 14 * MIB + 512);
        // 12 + 2 + 28 MiB while the 28 MiB block is allocated; 12 + 2 + 18 before.
        assert_eq!(m.peak_bytes, 42 * MIB);
        let at_five = m.total.value_at(5_000 - 1_000);
        assert_eq!(at_five, 32 * MIB, "12 + 2 + the unsplit 18 MiB");
        assert_eq!(
            summary.unsplit_blocks, unsplit,
            "max_split_size {max_split}"
        );
        // memory_allocated() drops at the free request, not when the stream reaches it.
        let whole = &m.allocs.at(3);
        assert_eq!(
            (whole.free_ts_nanos, whole.free_kind),
            (8_000, FreeKind::StreamOrdered)
        );
        assert_eq!(m.total.value_at(8_000), 14 * MIB);
        assert_eq!(m.allocs.at(2).free_kind, FreeKind::Immediate);
        assert_eq!(summary.sized_from_segments, 3);
        assert_eq!(summary.unplaced_blocks, 0);
        // The OOM entry's address is the device's free memory: kept as a device sample.
        let oom = m.failed.first().expect("the oom");
        assert_eq!(oom.record.size_bytes, 40 * MIB);
        let sample = m
            .device_samples
            .iter()
            .find(|s| s.ts_nanos == oom.record.ts_nanos)
            .expect("a device sample at the oom");
        assert_eq!(sample.free_bytes, 5_000_000_000);
        assert_eq!((sample.total_bytes, sample.used_bytes), (0, 0), "unknown");
    }
}
