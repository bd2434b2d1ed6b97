//! Score, grade and recommendations, with the reference weights: start at 100; each pattern
//! -20 critical / -10 warning / -5 other; each insight -15 high / -8 medium / -3 other; floor 0.
//! Grade A ≥ 90, B ≥ 80, C ≥ 70, D ≥ 60, else F. Recommendations: critical patterns, then
//! high-impact insights, then warnings, then notes that call for a change; at most 10.
//!
//! Notes that are not problems (bounded growth, teardown releases) cost nothing. The reference
//! reports repeated allocations as one pattern, so they cost 5 points once, however many call
//! sites are listed.

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use super::{Config, Finding, FindingKind, Impact, Severity};
use crate::format::StackId;

/// One prioritized recommendation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    /// 1 = most urgent.
    pub priority: u32,
    pub severity: Severity,
    pub kind: FindingKind,
    pub site: String,
    pub stack: Option<StackId>,
    pub scope: Option<String>,
    pub bytes: u64,
    /// What was found.
    pub problem: String,
    /// The concrete fix.
    pub fix: String,
}

fn penalty(f: &Finding) -> i32 {
    if f.kind.is_insight() {
        if f.severity == Severity::Info {
            return 0;
        }
        return match f.impact {
            Some(Impact::High) => 15,
            Some(Impact::Medium) => 8,
            _ => 3,
        };
    }
    match f.severity {
        Severity::Critical => 20,
        Severity::Warning => 10,
        Severity::Info => 0,
    }
}

/// Score 0-100 and grade A-F.
pub fn score(findings: &[Finding], notes: &[Finding]) -> (u32, &'static str) {
    let mut s: i32 = 100;
    for f in findings {
        s -= penalty(f);
    }
    if notes
        .iter()
        .any(|n| n.kind == FindingKind::RepeatedAllocations)
    {
        s -= 5;
    }
    let s = s.max(0) as u32;
    (s, grade(s))
}

pub const fn grade(score: u32) -> &'static str {
    match score {
        90.. => "A",
        80..=89 => "B",
        70..=79 => "C",
        60..=69 => "D",
        _ => "F",
    }
}

fn rank(f: &Finding) -> u8 {
    match (f.severity, f.kind.is_insight(), f.impact) {
        (Severity::Critical, false, _) => 0,
        (_, true, Some(Impact::High)) if f.severity != Severity::Info => 1,
        (Severity::Critical, true, _) => 1,
        (Severity::Warning, _, _) => 2,
        (Severity::Info, _, _) => 3,
    }
}

/// At most `config.max_recommendations`, most urgent first, then by bytes.
pub fn recommendations(findings: &[Finding], notes: &[Finding], c: &Config) -> Vec<Recommendation> {
    let mut all: Vec<&Finding> = findings
        .iter()
        .chain(notes.iter().filter(|n| {
            matches!(
                n.kind,
                FindingKind::RepeatedAllocations | FindingKind::ShortLived
            )
        }))
        .collect();
    all.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(b.bytes.cmp(&a.bytes))
            .then(a.site.cmp(&b.site))
    });
    // One recommendation per call site among the notes (repeated and short-lived overlap).
    let mut kept: Vec<&Finding> = Vec::with_capacity(all.len());
    for f in all {
        if f.severity == Severity::Info && kept.iter().any(|k| k.site == f.site) {
            continue;
        }
        kept.push(f);
    }
    kept.truncate(c.max_recommendations);
    kept.into_iter()
        .enumerate()
        .map(|(i, f)| Recommendation {
            priority: i as u32 + 1,
            severity: f.severity,
            kind: f.kind,
            site: f.site.clone(),
            stack: f.stack,
            scope: f.scope.clone(),
            bytes: f.bytes,
            problem: f.message.clone(),
            fix: f.fix.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(kind: FindingKind, severity: Severity, impact: Option<Impact>) -> Finding {
        Finding {
            kind,
            severity,
            site: String::new(),
            stack: None,
            scope: None,
            bytes: 0,
            count: 0,
            ts_nanos: None,
            impact,
            message: String::new(),
            fix: String::new(),
        }
    }

    #[test]
    fn reference_weights_and_grades() {
        let findings = [
            f(FindingKind::LeakAtExit, Severity::Critical, None),
            f(FindingKind::ScopeSpikes, Severity::Warning, None),
            f(FindingKind::Trend, Severity::Critical, Some(Impact::High)),
            f(
                FindingKind::HiddenDrift,
                Severity::Warning,
                Some(Impact::Medium),
            ),
        ];
        let at = |mut x: Finding, site: &str| {
            x.site = site.into();
            x
        };
        let notes = [
            at(
                f(FindingKind::RepeatedAllocations, Severity::Info, None),
                "a (a.py:1)",
            ),
            at(
                f(FindingKind::RepeatedAllocations, Severity::Info, None),
                "b (b.py:2)",
            ),
            // The same site as a listed note: not recommended twice.
            at(
                f(FindingKind::ShortLived, Severity::Info, None),
                "a (a.py:1)",
            ),
            f(FindingKind::BoundedGrowth, Severity::Info, None),
        ];
        // 100 - 20 - 10 - 15 - 8 - 5 = 42.
        assert_eq!(score(&findings, &notes), (42, "F"));
        assert_eq!(score(&[], &[]), (100, "A"));
        assert_eq!(grade(90), "A");
        assert_eq!(grade(89), "B");
        assert_eq!(grade(70), "C");
        assert_eq!(grade(60), "D");
        assert_eq!(grade(59), "F");
        let many: Vec<Finding> = (0..8)
            .map(|_| f(FindingKind::LeakAtExit, Severity::Critical, None))
            .collect();
        assert_eq!(score(&many, &[]).0, 0);
        let recs = recommendations(&findings, &notes, &Config::default());
        let kinds: Vec<FindingKind> = recs.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                FindingKind::LeakAtExit,
                FindingKind::Trend,
                // Warnings keep their order (same bytes, same site).
                FindingKind::ScopeSpikes,
                FindingKind::HiddenDrift,
                FindingKind::RepeatedAllocations,
                FindingKind::RepeatedAllocations,
            ]
        );
        assert_eq!(recs[0].priority, 1);
    }
}
