//! PyTorch memory snapshots (pickle and JSON) convert to traces whose numbers equal what the
//! snapshot's own segments and blocks say. Fixtures: tests/assets/torch (see its README).

use analysis_core::torch_snapshot::{BEFORE_HISTORY, ImportError, convert, looks_like_snapshot};
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
