//! End-to-end tests of the built binary: `synth` -> `report --format json` findings,
//! `check` exit codes and messages, and `diff` in text and JSON.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpucollect"))
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpucollect-cli-analysis-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn synth(scenario: &str, events: u64) -> PathBuf {
    // Tests run in parallel: every trace gets its own file.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir().join(format!("{scenario}-{events}-{n}.msgpack"));
    let out = bin()
        .args(["synth", scenario, "--events", &events.to_string(), "-o"])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn run(args: &[&str], trace: &Path) -> Output {
    bin().args(args).arg(trace).output().expect("runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

#[test]
fn report_json_has_the_findings_of_a_planted_leak() {
    let t = synth("training-leak", 20_000);
    let r = json(&run(&["report", "--format", "json"], &t));
    assert_eq!(r["live_at_end_bytes"], 2u64 << 30);
    assert!(r["peak_bytes"].as_u64().expect("peak") > 2u64 << 30);
    let findings = r["findings"].as_array().expect("findings");
    let leak = findings
        .iter()
        .find(|f| f["kind"] == "leak_growth")
        .expect("leak finding");
    assert_eq!(leak["severity"], "critical");
    assert_eq!(leak["site"], "record_loss (train.py:42)");
    assert_eq!(leak["bytes"], 2u64 << 30);
    // One cause, one finding: one critical finding costs 30 points.
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(r["score"], 70);
    assert_eq!(r["grade"], "C");
    // The text report shows the same, for people.
    let text = run(&["report"], &t);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("leak_growth") && text.contains("Recommendations:"),
        "{text}"
    );
}

#[test]
fn report_json_of_a_clean_workload_has_no_findings() {
    let t = synth("clean", 20_000);
    let r = json(&run(&["report", "--format", "json"], &t));
    assert_eq!(r["findings"].as_array().expect("findings").len(), 0);
    assert_eq!(r["grade"], "A");
}

#[test]
fn check_exit_codes_for_ci() {
    let leak = synth("training-leak", 20_000);
    let clean = synth("clean", 20_000);
    // Within limits: 0 and an "ok" line.
    let out = run(
        &["check", "--max-leaked", "1MiB", "--fail-on", "warning"],
        &clean,
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("gpucollect check: ok"));
    // Leaked too much: 1 and a one-line reason naming the call site.
    let out = run(&["check", "--max-leaked", "1GiB"], &leak);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--max-leaked") && err.contains("record_loss"),
        "{err}"
    );
    // Peak above a decimal limit.
    let out = run(&["check", "--max-peak", "2GB"], &leak);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-peak"));
    // Limits that hold.
    let out = run(
        &["check", "--max-leaked", "3GiB", "--max-peak", "80GiB"],
        &leak,
    );
    assert_eq!(out.status.code(), Some(0));
    // Findings by severity.
    let out = run(&["check", "--fail-on", "critical"], &leak);
    assert_eq!(out.status.code(), Some(1));
    let small = synth("multi-device", 5_000); // warnings only
    let out = run(&["check", "--fail-on", "critical"], &small);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["check", "--fail-on", "warning"], &small);
    assert_eq!(out.status.code(), Some(1));
    // Usage and input errors: 2.
    let out = run(&["check", "--max-peak", "lots"], &leak);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["check"], &dir().join("missing.msgpack"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn config_file_changes_thresholds() {
    let t = synth("exception-leak", 5_000);
    let cfg = dir().join("strict.json");
    // A leak above 100 MiB is critical under this config.
    std::fs::write(&cfg, r#"{"leak_critical_bytes": 104857600}"#).expect("write");
    let out = bin()
        .args(["check", "--fail-on", "critical", "--config"])
        .arg(&cfg)
        .arg(&t)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    std::fs::write(&cfg, "not json").expect("write");
    let out = bin()
        .args(["report", "--config"])
        .arg(&cfg)
        .arg(&t)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn diff_shows_the_change_per_call_site_and_scope() {
    let before = synth("training-leak", 20_000);
    let after = synth("clean", 20_000);
    let out = bin()
        .args(["diff", "--format", "json"])
        .arg(&before)
        .arg(&after)
        .output()
        .expect("runs");
    let d = json(&out);
    assert_eq!(d["live_at_end_bytes"]["delta"], -(2i64 << 30));
    let site = d["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .find(|s| s["site"] == "record_loss (train.py:42)")
        .expect("record_loss changed");
    assert_eq!(site["live_at_end_bytes"]["before"], 2u64 << 30);
    assert_eq!(site["live_at_end_bytes"]["after"], 0);
    let scope = &d["scopes"][0];
    assert_eq!(scope["scope"], "train_step");
    assert_eq!(scope["growth_bytes"]["delta"], -(2i64 << 30));
    let out = bin()
        .arg("diff")
        .arg(&before)
        .arg(&after)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Resolved findings:") && text.contains("record_loss"),
        "{text}"
    );
}

#[test]
fn hide_frame_moves_the_named_line_and_the_help_gives_the_score_formula() {
    let t = synth("training-leak", 5_000);
    let r = json(&run(&["report", "--format", "json"], &t));
    assert_eq!(r["findings"][0]["site"], "record_loss (train.py:42)");
    // Skipping the function names its caller; the full stack is unchanged.
    let r = json(&run(
        &["report", "--format", "json", "--hide-frame", "record_loss"],
        &t,
    ));
    assert_eq!(r["findings"][0]["site"], "train_step (train.py:64)");
    assert_eq!(r["findings"][0]["location"], "train.py:64");
    let help = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args(["report", "--help"])
        .output()
        .expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Score = 100 - 30 per critical finding - 15 per warning"),
        "{help}"
    );
}
