//! The scorer: reads a report as JSON (so findings the detectors add later need no change here)
//! and judges it against a scenario's truth.
//!
//! Problems are the report's findings of severity warning or critical, in report order. A
//! faulty scenario passes when its first problem is the planted cause: the same class (by the
//! finding kind's name, [`class_of`]), naming one of the accepted `file:line` locations in its
//! `location` (or `site`) field, with exactly the planted bytes when the truth has bytes. A
//! healthy scenario passes when there is no problem. Per scenario: a true positive when some
//! problem is the planted cause, a false negative when none is, and one false positive per
//! problem that is not.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::scenario::{Cause, Class, Truth};

/// The class a finding kind belongs to, by its name. The one place that maps kinds.
pub fn class_of(kind: &str) -> Option<Class> {
    let k = kind.to_ascii_lowercase();
    if k.contains("out_of_memory") || k == "oom" {
        Some(Class::Oom)
    } else if k.contains("hidden") {
        Some(Class::Hidden)
    } else if k.contains("fragmentation") {
        Some(Class::Fragmentation)
    } else if k.contains("spike") {
        Some(Class::Spike)
    } else if k.contains("leak")
        || k.contains("growth")
        || k.contains("missed_free")
        || k.contains("trend")
    {
        Some(Class::Leak)
    } else {
        None
    }
}

/// A warning or critical finding, as the scorer reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub kind: String,
    pub severity: String,
    /// The finding's `location` when it has one, else its `site`.
    pub site: String,
    pub bytes: Option<u64>,
}

impl Problem {
    pub fn class(&self) -> Option<Class> {
        class_of(&self.kind)
    }

    /// One line for tables.
    pub fn label(&self) -> String {
        let mut s = format!("{} {} @ {}", self.severity, self.kind, self.site);
        if let Some(b) = self.bytes {
            s.push_str(&format!(", {b} B"));
        }
        s
    }
}

/// The problems of a report (its `findings` of severity warning or critical), in order.
pub fn problems(report: &Value) -> Vec<Problem> {
    let Some(findings) = report.get("findings").and_then(Value::as_array) else {
        return Vec::new();
    };
    findings
        .iter()
        .filter_map(|f| {
            let severity = f.get("severity")?.as_str()?.to_string();
            if severity != "warning" && severity != "critical" {
                return None;
            }
            let text = |k: &str| f.get(k).and_then(Value::as_str).map(str::to_string);
            Some(Problem {
                kind: text("kind").unwrap_or_default(),
                severity,
                site: text("location")
                    .or_else(|| text("site"))
                    .unwrap_or_default(),
                bytes: f.get("bytes").and_then(Value::as_u64),
            })
        })
        .collect()
}

/// Whether `site` names `loc` (`file:line`): as a whole path component and line, so
/// `train.py:10` does not match `train.py:104` and `metrics.py:33` does not match
/// `mymetrics.py:33`.
pub fn names_location(site: &str, loc: &str) -> bool {
    let mut from = 0;
    while let Some(i) = site[from..].find(loc) {
        let start = from + i;
        let end = start + loc.len();
        let before_ok = start == 0
            || site[..start]
                .chars()
                .next_back()
                .is_some_and(|c| matches!(c, '/' | '\\' | ' ' | '(' | '"' | '\''));
        let after_ok = !site[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit());
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

/// Whether problem `p` is the planted cause `c`.
pub fn is_cause(p: &Problem, c: &Cause) -> bool {
    p.class() == Some(c.class)
        && (c.locations.is_empty() || c.locations.iter().any(|l| names_location(&p.site, l)))
        && c.bytes.is_none_or(|b| p.bytes == Some(b))
}

/// The verdict on one scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    pub pass: bool,
    pub tp: u32,
    pub fp: u32,
    #[serde(rename = "fn")]
    pub fn_: u32,
    pub first: Option<Problem>,
    pub problems: usize,
    /// Why it failed, one sentence (empty when it passed).
    pub reason: String,
}

pub fn judge(truth: &Truth, report: &Value) -> Judgement {
    let ps = problems(report);
    let first = ps.first().cloned();
    match truth {
        Truth::Healthy => {
            let fp = ps.len() as u32;
            Judgement {
                pass: ps.is_empty(),
                tp: 0,
                fp,
                fn_: 0,
                reason: first
                    .as_ref()
                    .map(|p| format!("healthy, but {} problem(s); first: {}", ps.len(), p.label()))
                    .unwrap_or_default(),
                first,
                problems: ps.len(),
            }
        }
        Truth::Faulty(c) => {
            let hits = ps.iter().filter(|p| is_cause(p, c)).count() as u32;
            let others = ps
                .iter()
                .filter(|p| !is_cause(p, c) && c.also.iter().any(|o| is_cause(p, o)))
                .count() as u32;
            let first_hit = first.as_ref().is_some_and(|p| is_cause(p, c));
            let reason = if first_hit {
                String::new()
            } else {
                match &first {
                    None => "no problem reported".into(),
                    Some(p) if p.class() != Some(c.class) => {
                        format!("first problem is {}, not {}", p.kind, c.class.name())
                    }
                    Some(p)
                        if !c.locations.is_empty()
                            && !c.locations.iter().any(|l| names_location(&p.site, l)) =>
                    {
                        format!(
                            "first problem names {}, not {}",
                            p.site,
                            c.locations.join(" or ")
                        )
                    }
                    Some(p) => format!(
                        "first problem has {} bytes, not {}",
                        p.bytes.map_or("no".into(), |b| b.to_string()),
                        c.bytes.unwrap_or(0)
                    ),
                }
            };
            Judgement {
                pass: first_hit,
                tp: u32::from(hits > 0),
                fp: ps.len() as u32 - hits - others,
                fn_: u32::from(hits == 0),
                first,
                problems: ps.len(),
                reason,
            }
        }
    }
}

/// Totals over a corpus.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub scenarios: u32,
    pub healthy: u32,
    pub faulty: u32,
    pub passed: u32,
    pub tp: u32,
    pub fp: u32,
    #[serde(rename = "fn")]
    pub fn_: u32,
    /// tp / (tp + fp); 1 when nothing was reported.
    pub precision: f64,
    /// tp / (tp + fn); 1 when nothing was planted.
    pub recall: f64,
    /// Faulty scenarios whose first problem is the planted cause, over faulty scenarios.
    pub first_right: f64,
    /// Healthy scenarios with no warning or critical finding, over healthy scenarios.
    pub healthy_quiet: f64,
}

fn ratio(n: u32, d: u32) -> f64 {
    if d == 0 {
        1.0
    } else {
        f64::from(n) / f64::from(d)
    }
}

pub fn totals<'a>(items: impl IntoIterator<Item = (&'a Truth, &'a Judgement)>) -> Totals {
    let mut t = Totals::default();
    let (mut first_right, mut quiet) = (0, 0);
    for (truth, j) in items {
        t.scenarios += 1;
        t.passed += u32::from(j.pass);
        t.tp += j.tp;
        t.fp += j.fp;
        t.fn_ += j.fn_;
        match truth {
            Truth::Healthy => {
                t.healthy += 1;
                quiet += u32::from(j.pass);
            }
            Truth::Faulty(_) => {
                t.faulty += 1;
                first_right += u32::from(j.pass);
            }
        }
    }
    t.precision = ratio(t.tp, t.tp + t.fp);
    t.recall = ratio(t.tp, t.tp + t.fn_);
    t.first_right = ratio(first_right, t.faulty);
    t.healthy_quiet = ratio(quiet, t.healthy);
    t
}

/// One scenario's verdict as the baseline keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub pass: bool,
    pub tp: u32,
    pub fp: u32,
    #[serde(rename = "fn")]
    pub fn_: u32,
}

impl From<&Judgement> for Verdict {
    fn from(j: &Judgement) -> Self {
        Self {
            pass: j.pass,
            tp: j.tp,
            fp: j.fp,
            fn_: j.fn_,
        }
    }
}

/// What `baseline.json` holds: each scenario's verdict and the totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub scenarios: BTreeMap<String, Verdict>,
    pub totals: Totals,
}

/// (precision, recall) over the scenarios of `b` named in `names`.
fn rates<'a>(b: &Baseline, names: impl Iterator<Item = &'a String>) -> (f64, f64) {
    let (mut tp, mut fp, mut fn_) = (0, 0, 0);
    for n in names {
        if let Some(v) = b.scenarios.get(n) {
            tp += v.tp;
            fp += v.fp;
            fn_ += v.fn_;
        }
    }
    (ratio(tp, tp + fp), ratio(tp, tp + fn_))
}

/// Regressions (a scenario that passed and now fails, a lower precision or recall over the
/// scenarios both know, a scenario gone) and improvements (the reverse, new scenarios) of `now`
/// over `base`.
pub fn compare(base: &Baseline, now: &Baseline) -> (Vec<String>, Vec<String>) {
    let mut worse = Vec::new();
    let mut better = Vec::new();
    for (name, v) in &now.scenarios {
        match base.scenarios.get(name) {
            Some(b) if b.pass && !v.pass => {
                worse.push(format!("{name}: passed in the baseline, fails now"))
            }
            Some(b) if !b.pass && v.pass => {
                better.push(format!("{name}: failed in the baseline, passes now"))
            }
            None => better.push(format!("{name}: new scenario (not in the baseline)")),
            _ => {}
        }
    }
    for name in base.scenarios.keys() {
        if !now.scenarios.contains_key(name) {
            worse.push(format!("{name}: in the baseline, missing from the corpus"));
        }
    }
    let common: Vec<&String> = now
        .scenarios
        .keys()
        .filter(|n| base.scenarios.contains_key(*n))
        .collect();
    let (bp, br) = rates(base, common.iter().copied());
    let (np, nr) = rates(now, common.iter().copied());
    const EPS: f64 = 1e-9;
    for (what, b, n) in [("precision", bp, np), ("recall", br, nr)] {
        if n + EPS < b {
            worse.push(format!("{what} fell from {b:.4} to {n:.4}"));
        } else if n > b + EPS {
            better.push(format!("{what} rose from {b:.4} to {n:.4}"));
        }
    }
    (worse, better)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(findings: Value) -> Value {
        json!({ "findings": findings, "notes": [{"kind": "bounded_growth", "severity": "info", "site": "x", "bytes": 1}] })
    }

    #[test]
    fn maps_kinds_by_name() {
        for (k, c) in [
            ("leak_at_exit", Some(Class::Leak)),
            ("missed_free", Some(Class::Leak)),
            ("thread_exit_leak", Some(Class::Leak)),
            ("scope_growth", Some(Class::Leak)),
            ("trend", Some(Class::Leak)),
            ("scope_spikes", Some(Class::Spike)),
            ("timeline_spike", Some(Class::Spike)),
            ("fragmentation", Some(Class::Fragmentation)),
            ("out_of_memory", Some(Class::Oom)),
            ("hidden_drift", Some(Class::Hidden)),
            ("hidden_spike", Some(Class::Hidden)),
            ("repeated_allocations", None),
        ] {
            assert_eq!(class_of(k), c, "{k}");
        }
    }

    #[test]
    fn locations_match_whole_names_and_lines() {
        assert!(names_location("update (metrics.py:33)", "metrics.py:33"));
        assert!(names_location(
            "update (/home/u/proj/metrics.py:33)",
            "metrics.py:33"
        ));
        assert!(names_location("metrics.py:33", "metrics.py:33"));
        assert!(!names_location("update (metrics.py:331)", "metrics.py:33"));
        assert!(!names_location("update (mymetrics.py:33)", "metrics.py:33"));
        assert!(!names_location("train_step (train.py:104)", "train.py:10"));
    }

    #[test]
    fn faulty_passes_only_with_the_cause_first() {
        let truth = Truth::leak(&["metrics.py:33"], 320 * 1024 * 1024);
        let good = report(json!([
            {"kind": "leak_at_exit", "severity": "critical", "site": "update (metrics.py:33)", "bytes": 335544320u64, "new_field": [1, 2]},
            {"kind": "timeline_spike", "severity": "warning", "site": "forward (model.py:35)", "bytes": 7}
        ]));
        let j = judge(&truth, &good);
        assert!(j.pass, "{j:?}");
        assert_eq!((j.tp, j.fp, j.fn_), (1, 1, 0));

        // A `location` field, when present, is read instead of `site`.
        let loc = report(json!([
            {"kind": "scope_growth", "severity": "warning", "site": "softmax (torch/nn/functional.py:2140)", "location": "metrics.py:33", "bytes": 335544320u64}
        ]));
        assert!(judge(&truth, &loc).pass);

        for (bad, why) in [
            (
                json!([{"kind": "leak_at_exit", "severity": "critical", "site": "_init_group (torch/optim/adam.py:166)", "bytes": 335544320u64},
                    {"kind": "leak_at_exit", "severity": "critical", "site": "update (metrics.py:33)", "bytes": 335544320u64}]),
                "names",
            ),
            (
                json!([{"kind": "leak_at_exit", "severity": "critical", "site": "update (metrics.py:33)", "bytes": 335544321u64}]),
                "bytes",
            ),
            (
                json!([{"kind": "fragmentation", "severity": "warning", "site": "update (metrics.py:33)", "bytes": 335544320u64}]),
                "not leak",
            ),
            (
                json!([{"kind": "leak_at_exit", "severity": "info", "site": "update (metrics.py:33)", "bytes": 335544320u64}]),
                "no problem",
            ),
        ] {
            let j = judge(&truth, &report(bad));
            assert!(!j.pass, "{j:?}");
            assert!(j.reason.contains(why), "{} does not say {why}", j.reason);
        }
        // The cause second: a true positive, but not first.
        let second = report(json!([
            {"kind": "leak_at_exit", "severity": "critical", "site": "_init_group (torch/optim/adam.py:166)", "bytes": 5},
            {"kind": "leak_at_exit", "severity": "critical", "site": "update (metrics.py:33)", "bytes": 335544320u64}
        ]));
        let j = judge(&truth, &second);
        assert_eq!((j.pass, j.tp, j.fp, j.fn_), (false, 1, 1, 0));
    }

    #[test]
    fn healthy_passes_only_without_problems() {
        let quiet = report(json!([]));
        assert!(judge(&Truth::Healthy, &quiet).pass);
        let noisy = report(
            json!([{"kind": "scope_spikes", "severity": "critical", "site": "forward (model.py:35)", "bytes": 1}]),
        );
        let j = judge(&Truth::Healthy, &noisy);
        assert_eq!((j.pass, j.fp), (false, 1));
        let t = totals([
            (&Truth::Healthy, &j),
            (&Truth::Healthy, &judge(&Truth::Healthy, &quiet)),
        ]);
        assert_eq!((t.precision, t.recall, t.healthy_quiet), (0.0, 1.0, 0.5));
    }

    #[test]
    fn regressions_and_improvements() {
        let v = |pass, tp, fp, fn_| Verdict { pass, tp, fp, fn_ };
        let mut base = Baseline::default();
        base.scenarios.insert("a".into(), v(true, 1, 0, 0));
        base.scenarios.insert("b".into(), v(false, 0, 1, 1));
        // a fails now; its cause is missed (recall falls).
        let mut now = base.clone();
        now.scenarios.insert("a".into(), v(false, 0, 1, 1));
        let (worse, _) = compare(&base, &now);
        assert_eq!(worse.len(), 3, "{worse:?}");
        // b passes now: precision and recall rise.
        let mut now = base.clone();
        now.scenarios.insert("b".into(), v(true, 1, 0, 0));
        let (worse, better) = compare(&base, &now);
        assert!(worse.is_empty(), "{worse:?}");
        assert_eq!(better.len(), 3, "{better:?}");
        // A new failing scenario is not a regression of the others.
        let mut now = base.clone();
        now.scenarios.insert("c".into(), v(false, 0, 5, 1));
        let (worse, better) = compare(&base, &now);
        assert!(worse.is_empty(), "{worse:?}");
        assert_eq!(better.len(), 1);
        // A scenario gone is.
        let mut now = base.clone();
        now.scenarios.remove("b");
        assert_eq!(compare(&base, &now).0.len(), 1);
    }
}
