//! `gpucollect synth` then `gpucollect report --format json` gives the planted ground truth, and
//! bad input gets one-line errors with a nonzero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn gpucollect(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args(args)
        .output()
        .expect("gpucollect runs")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpucollect-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes));
    })
}

fn report_json(path: &Path) -> (serde_json::Value, i32) {
    let out = gpucollect(&[
        "report",
        path.to_str().expect("utf-8 path"),
        "--format",
        "json",
    ]);
    (json(&out.stdout), out.status.code().unwrap_or(-1))
}

#[test]
fn report_json_gives_the_ground_truth_of_every_scenario() {
    let list = gpucollect(&["synth", "list"]);
    assert!(list.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    for name in names {
        let path = tmp(&format!("{name}.msgpack"));
        let synth = gpucollect(&[
            "synth",
            &name,
            "--events",
            "30000",
            "--seed",
            "5",
            "--truth",
            "-o",
            path.to_str().expect("utf-8 path"),
        ]);
        assert!(synth.status.success(), "{name}: {:?}", synth);
        let truth = json(&synth.stderr);
        let (report, code) = report_json(&path);
        assert_eq!(code, 0, "{name}");
        for key in ["peak_bytes", "live_at_end_bytes"] {
            assert_eq!(report[key], truth[key], "{name}: {key}");
            assert!(truth[key].as_u64().is_some(), "{name}: {key} is a number");
        }
        assert_eq!(
            report["failed_allocations"].as_array().map(Vec::len),
            truth["failed_count"].as_u64().map(|n| n as usize),
            "{name}"
        );
        assert_eq!(report["clean_end"], true, "{name}");
    }
}

/// Records out of order (`synth --out-of-order`: one allocation in 16 made 30 µs early), as
/// a multi-threaded or multi-process run's reach the ring: the healthy service stays healthy,
/// and the training loop's leak, captured as framework blocks, is found at its line.
#[test]
fn records_out_of_order_keep_the_verdict() {
    let cases: [(&str, &[&str], Option<&str>); 2] = [
        ("requests", &["--out-of-order", "16"], None),
        (
            "training-leak",
            &["--out-of-order", "16", "--framework-capture"],
            Some("record_loss"),
        ),
    ];
    for (scenario, extra, leak) in cases {
        let path = tmp(&format!("{scenario}-out-of-order.msgpack"));
        let mut args = vec!["synth", scenario, "--events", "40000", "--truth", "-o"];
        args.push(path.to_str().expect("utf-8 path"));
        args.extend_from_slice(extra);
        let synth = gpucollect(&args);
        assert!(synth.status.success(), "{scenario}: {synth:?}");
        let (report, code) = report_json(&path);
        assert_eq!(code, 0, "{scenario}");
        let findings = report["findings"].as_array().expect("findings");
        match leak {
            None => {
                assert!(findings.is_empty(), "{scenario}: {findings:?}");
                assert_eq!(report["peak_bytes"], json(&synth.stderr)["peak_bytes"]);
            }
            Some(function) => {
                let first = findings.first().expect("a finding");
                assert!(
                    first["site"].as_str().is_some_and(|s| s.contains(function)),
                    "{scenario}: {first}"
                );
            }
        }
    }
    let zero = gpucollect(&["synth", "requests", "--out-of-order", "0"]);
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");
}

#[test]
fn a_truncated_trace_reports_what_it_kept_and_warns() {
    let path = tmp("cut.msgpack");
    let out = gpucollect(&[
        "synth",
        "training-leak",
        "--events",
        "5000",
        "-o",
        path.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success());
    let bytes = std::fs::read(&path).expect("trace");
    std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).expect("write cut trace");
    let (report, code) = report_json(&path);
    assert_eq!(code, 0);
    assert_eq!(report["clean_end"], false);
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("truncated"), "{warnings}");
    assert!(report["peak_bytes"].as_u64().unwrap_or(0) > 0);
}

#[test]
fn bad_input_gets_a_one_line_error_and_exit_code_2() {
    let not_trace = tmp("not-a-trace.txt");
    std::fs::write(&not_trace, "hello, this is text\n").expect("write");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["report".into(), "/nonexistent/run.msgpack".into()],
            "cannot open the trace",
        ),
        (
            vec!["report".into(), not_trace.display().to_string()],
            "not a gpucollect trace",
        ),
        (
            vec![
                "synth".into(),
                "no-such-scenario".into(),
                "-o".into(),
                tmp("x").display().to_string(),
            ],
            "unknown scenario",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = gpucollect(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.starts_with("gpucollect: error:"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn pytorch_snapshots_import_and_report_directly() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../analysis-core/tests/assets/torch"
    );
    let expect: serde_json::Value = serde_json::from_slice(
        &std::fs::read(format!("{dir}/two-devices.expected.json")).expect("expected"),
    )
    .expect("json");
    let out_path = tmp("imported.msgpack");
    let snapshot = format!("{dir}/two-devices.pickle");
    let imp = gpucollect(&["import", &snapshot, "-o", out_path.to_str().expect("utf-8")]);
    assert!(imp.status.success(), "{imp:?}");
    let entries = expect["trace_entries"].as_u64().expect("entries");
    assert!(
        String::from_utf8_lossy(&imp.stderr).contains(&format!("imported {entries} trace entries")),
        "{}",
        String::from_utf8_lossy(&imp.stderr)
    );
    for input in [
        out_path.clone(),
        PathBuf::from(&snapshot),
        PathBuf::from(format!("{dir}/two-devices.json")),
    ] {
        let (report, code) = report_json(&input);
        assert_eq!(code, 0, "{input:?}");
        assert_eq!(
            report["live_at_end_bytes"], expect["live_at_end_bytes"],
            "{input:?}"
        );
        assert_eq!(report["peak_bytes"], expect["peak_bytes"], "{input:?}");
    }
    let text = tmp("text.txt");
    std::fs::write(&text, "plain text").expect("write");
    let bad = gpucollect(&["import", text.to_str().expect("utf-8"), "-o", "/dev/null"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("neither a pickle nor JSON"));

    // The file is read in pieces and parsed as it comes: the trace equals converting it whole,
    // and the JSON form gives the pickle's bytes.
    let whole = std::fs::read(&snapshot).expect("snapshot");
    let (converted, _) = analysis_core::torch_snapshot::convert(&whole).expect("converts");
    assert!(std::fs::read(&out_path).expect("imported") == converted);
    let json_out = tmp("imported-json.msgpack");
    let json = format!("{dir}/two-devices.json");
    let imp = gpucollect(&["import", &json, "-o", json_out.to_str().expect("utf-8")]);
    assert!(imp.status.success(), "{imp:?}");
    assert!(std::fs::read(&json_out).expect("imported") == converted);
    // Cut short, as pickle and as JSON: an error naming the file and what is wrong, for import
    // and report alike.
    for (name, bytes, says) in [
        ("cut.pickle", &whole[..whole.len() / 2], "truncated"),
        (
            "cut.json",
            &std::fs::read(&json).expect("json")[..1000],
            "truncated",
        ),
    ] {
        let cut = tmp(name);
        std::fs::write(&cut, bytes).expect("write");
        for args in [
            vec!["import", cut.to_str().expect("utf-8"), "-o", "/dev/null"],
            vec!["report", cut.to_str().expect("utf-8")],
        ] {
            let out = gpucollect(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(name) && err.contains(says), "{args:?}: {err}");
        }
    }
}
