//! The summary endpoints of `gpucollect serve` (API.md, "Summaries"): the report, the timeline
//! at a window's resolution and the live set at a moment, equal to what the analysis core
//! computes from the whole trace, behind the read token, with clear refusals.

mod common;

use common::{Killed, agent, spawn_serve, store_dir, trace};

const ID: &str = "0123456789abcdef0123456789abcdef";

fn json(url: &str) -> (u16, serde_json::Value) {
    let mut r = agent().get(url).call().expect("answer");
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_vec().expect("body");
    (status, serde_json::from_slice(&body).expect("JSON"))
}

/// A store of this suite named `name` holding `traces`, each `(id, bytes)` as a stored trace.
fn store_with(name: &str, traces: &[(&str, &[u8])]) -> std::path::PathBuf {
    let store = store_dir("summaries", name);
    std::fs::create_dir_all(store.join("traces")).expect("traces dir");
    for (id, bytes) in traces {
        std::fs::write(store.join("traces").join(format!("{id}.msgpack")), bytes).expect("write");
    }
    store
}

/// `gpucollect serve` on `store`, with `args` besides: the server (stopped when dropped) and
/// its base URL.
fn serve(store: &std::path::Path, args: &[&str]) -> (Killed, String) {
    let mut all = vec!["--store", store.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    let (child, base) = spawn_serve(&all, &[]);
    (Killed(child), base)
}

#[test]
fn summaries_equal_the_analysis_of_the_whole_trace() {
    let bytes = trace(20_000);
    let store = store_with("equal", &[(ID, &bytes)]);
    let loaded = analysis_core::load(&bytes).expect("loads");
    let report = analysis_core::analyze(&loaded, &Default::default());
    let (_server, base) = serve(&store, &["--read-token", "secret"]);

    let (status, _) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 401, "the read token is needed");

    let (status, s) = json(&format!("{base}/api/v1/traces/{ID}/summary?token=secret"));
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["api_version"], 1);
    assert_eq!(s["report"]["peak_bytes"], report.peak_bytes);
    assert_eq!(s["report"]["score"], report.score);
    assert_eq!(
        s["report"]["findings"].as_array().map(Vec::len),
        Some(report.findings.len())
    );
    let (t0, t1) = (s["t0"].as_u64().expect("t0"), s["t1"].as_u64().expect("t1"));
    assert_eq!(
        s["series"].as_array().map(Vec::len),
        Some(loaded.model.series.len())
    );

    let (status, tl) = json(&format!(
        "{base}/api/v1/traces/{ID}/timeline?token=secret&t0={t0}&t1={}&columns=500",
        t1 + 1
    ));
    assert_eq!(status, 200, "{tl}");
    let total = tl["total"].as_array().expect("buckets");
    assert_eq!(total.len(), 500);
    let top = total.iter().filter_map(|b| b["max"].as_u64()).max();
    assert_eq!(top, Some(report.peak_bytes), "the columns reach the peak");
    // A zoomed window: the same buckets the core computes.
    let (z0, z1) = (t0 + (t1 - t0) / 3, t0 + (t1 - t0) / 3 + (t1 - t0) / 50);
    let (_, zoom) = json(&format!(
        "{base}/api/v1/traces/{ID}/timeline?token=secret&t0={z0}&t1={z1}&columns=64"
    ));
    let want = loaded.model.total.downsample(z0, z1, 64);
    let got: Vec<(u64, u64, u64)> = zoom["total"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| {
            let v = |k: &str| b[k].as_u64().expect("number");
            (v("min"), v("max"), v("last"))
        })
        .collect();
    let want: Vec<(u64, u64, u64)> = want.iter().map(|b| (b.min, b.max, b.last)).collect();
    assert_eq!(got, want);

    let (status, live) = json(&format!(
        "{base}/api/v1/traces/{ID}/live?token=secret&t={}",
        report.peak_ts_nanos
    ));
    assert_eq!(status, 200, "{live}");
    assert_eq!(live["bytes"], report.peak_bytes);
    assert_eq!(live["sites"][0]["site"], report.peak_sites[0].site.as_str());
    assert_eq!(live["sites"][0]["bytes"], report.peak_sites[0].bytes);
}

/// A trace too big for the budget at 4 bytes per byte, but not with its history on disk, is
/// summarised that way, to the same answers as the whole trace analysed in memory.
#[test]
fn a_trace_too_big_to_hold_is_summarised_with_its_history_on_disk() {
    let bytes = trace(850_000);
    let size = bytes.len() as u64;
    // 4 bytes per byte would pass 32 MiB; 1 per byte, 4 MiB in memory, two 8 MiB read caches
    // and the spill writer's queue (1 MiB) do not.
    assert!(
        size * 4 > 32 << 20 && size + (4 << 20) + (16 << 20) + (1 << 20) < 32 << 20,
        "{size}"
    );
    let store = store_with("spilled", &[(ID, &bytes)]);
    let loaded = analysis_core::load(&bytes).expect("loads");
    let report = analysis_core::analyze(&loaded, &Default::default());
    let (_server, base) = serve(&store, &["--summary-memory", "32MiB"]);
    let (status, s) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 200, "{s}");
    // Both parsed from text, as floats read back from JSON may differ in their last digit from
    // the values written.
    let want: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&report).expect("report as JSON"))
            .expect("JSON");
    assert_eq!(s["report"], want);
    let (t0, t1) = (s["t0"].as_u64().expect("t0"), s["t1"].as_u64().expect("t1"));
    let (z0, z1) = (t0 + (t1 - t0) / 3, t0 + (t1 - t0) / 2);
    let (_, zoom) = json(&format!(
        "{base}/api/v1/traces/{ID}/timeline?t0={z0}&t1={z1}&columns=64"
    ));
    let got: Vec<u64> = zoom["total"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["max"].as_u64().expect("number"))
        .collect();
    let want: Vec<u64> = loaded
        .model
        .total
        .downsample(z0, z1, 64)
        .iter()
        .map(|b| b.max)
        .collect();
    assert_eq!(got, want);
    let (status, live) = json(&format!("{base}/api/v1/traces/{ID}/live?t={t1}"));
    assert_eq!(status, 200, "{live}");
    assert_eq!(live["bytes"], loaded.model.live_at_end_bytes());
}

#[test]
fn summaries_refuse_in_words() {
    let not_a_trace = "fedcba9876543210fedcba9876543210";
    let store = store_with(
        "refuse",
        &[(ID, &trace(20_000)), (not_a_trace, b"this is not a trace")],
    );
    let (_server, base) = serve(&store, &["--summary-memory", "512KiB"]);
    let missing = "00000000000000000000000000000000";
    let (status, e) = json(&format!("{base}/api/v1/traces/{missing}/summary"));
    assert_eq!(status, 404, "{e}");
    let (status, e) = json(&format!("{base}/api/v1/traces/nonsense/summary"));
    assert_eq!(status, 400, "{e}");
    let (status, e) = json(&format!("{base}/api/v1/traces/{not_a_trace}/summary"));
    assert_eq!(status, 422, "{e}");
    assert!(
        e["error"]
            .as_str()
            .is_some_and(|m| m.contains("cannot be decoded")),
        "{e}"
    );
    // 20,000 events are about 240 KB: making their summary needs more than 512 KiB.
    let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 413, "{e}");
    assert!(
        e["error"]
            .as_str()
            .is_some_and(|m| m.contains("--summary-memory")),
        "{e}"
    );
    let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/timeline?columns=0"));
    assert_eq!(status, 400, "{e}");
    let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/live"));
    assert_eq!(status, 400, "{e}");
}

/// A trace whose model takes far more per byte than traces do (failed allocations of 3 bytes,
/// 56 in the model) passes the estimate made from its size, and is stopped while it is decoded,
/// once its model passes the summaries' budget: a refusal that says so, not a server holding 16
/// times the trace. A real trace of the same size in the same budget is summarised.
#[test]
fn a_trace_denser_than_its_size_says_is_stopped_at_the_budget() {
    // The header of a version 1.0 trace, then 400,000 failed allocations `[18, 0]`: 1.2 MB.
    let dense = {
        let mut b = Vec::new();
        b.push(0x94);
        b.push(0xa0 | analysis_core::format::MAGIC.len() as u8);
        b.extend_from_slice(analysis_core::format::MAGIC.as_bytes());
        b.extend_from_slice(&[0x01, 0x00, 0x80]);
        for _ in 0..400_000 {
            b.extend_from_slice(&[0x92, 18, 0x00]);
        }
        b
    };
    let real = trace(100_000);
    let real_id = "fedcba9876543210fedcba9876543210";
    let store = store_with("dense", &[(ID, &dense), (real_id, &real)]);
    assert!(dense.len() as u64 * 4 <= 8 << 20 && real.len() as u64 * 4 <= 8 << 20);
    let (_server, base) = serve(&store, &["--summary-memory", "8MiB"]);
    let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 413, "{e}");
    assert!(
        e["error"].as_str().is_some_and(
            |m| m.contains("more per byte than traces do") && m.contains("--summary-memory")
        ),
        "{e}"
    );
    let (status, e) = json(&format!("{base}/api/v1/traces/{real_id}/summary"));
    assert_eq!(status, 200, "{e}");
}

/// A PyTorch snapshot stored as it is (`gpucollect view` serves the file it is given) is
/// summarised as its conversion: the report `gpucollect report` gives the snapshot.
#[test]
fn a_stored_snapshot_is_summarised_as_its_conversion() {
    let pickle = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../analysis-core/tests/assets/torch/two-devices.pickle"),
    )
    .expect("fixture");
    let store = store_with("snapshot", &[(ID, &pickle)]);
    let (trace, _) = analysis_core::torch_snapshot::load(&pickle).expect("converts");
    let report = analysis_core::analyze(&trace, &Default::default());
    let (_server, base) = serve(&store, &[]);
    let (status, s) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["report"]["peak_bytes"], report.peak_bytes);
    assert_eq!(
        s["series"].as_array().map(Vec::len),
        Some(trace.model.series.len())
    );
    assert!(report.peak_bytes > 0);
}

/// A summary once made is kept in the store next to its trace, and a server started later on
/// that store answers `summary` from it without decoding the trace: here the trace's bytes are
/// replaced by damage once the first server has gone, and the summary is still the same
/// (while the timeline, which needs the trace, is refused). One kept by another build, or
/// damaged, is made again from the trace.
#[test]
fn a_kept_summary_is_served_after_a_restart_without_decoding() {
    let store = store_dir("summaries", "kept");
    std::fs::create_dir_all(store.join("traces")).expect("traces dir");
    let trace_path = store.join("traces").join(format!("{ID}.msgpack"));
    let kept = store.join("summaries").join(format!("{ID}.summary"));
    std::fs::write(&trace_path, trace(20_000)).expect("write");
    let args = ["--store", store.to_str().expect("utf-8")];
    let first = {
        let (child, base) = spawn_serve(&args, &[]);
        let _child = Killed(child);
        let (status, s) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
        assert_eq!(status, 200, "{s}");
        s
    };
    let on_disk = std::fs::read(&kept).expect("the summary is kept next to the trace");
    assert!(
        on_disk.starts_with(b"gpucollect "),
        "its first line says what made it"
    );

    std::fs::write(&trace_path, [0xc1u8; 4096]).expect("damage the trace");
    let (child, base) = spawn_serve(&args, &[]);
    let child = Killed(child);
    let (status, again) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, first, "the kept summary, not a new one");
    let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/timeline"));
    assert_eq!(status, 422, "the timeline needs the trace: {e}");
    drop(child);

    // Another build's summary, or a damaged one, is not served: the trace is decoded again.
    let other = [
        b"gpucollect 0.0.0 analysis 0\n".as_slice(),
        &on_disk[on_disk
            .iter()
            .position(|&b| b == b'\n')
            .expect("a key line")
            + 1..],
    ]
    .concat();
    for bad in [other, on_disk[..on_disk.len() / 2].to_vec()] {
        std::fs::write(&kept, &bad).expect("write");
        let (child, base) = spawn_serve(&args, &[]);
        let _child = Killed(child);
        let (status, e) = json(&format!("{base}/api/v1/traces/{ID}/summary"));
        assert_eq!(status, 422, "made again from the damaged trace: {e}");
    }
}
