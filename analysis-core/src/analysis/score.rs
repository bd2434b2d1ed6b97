//! Score, grade and recommendations. The score follows harm, so every healthy program scores
//! above every program with a problem:
//!
//! score = 100 − 30 per critical finding − 15 per warning, floor 0; notes (bounded growth,
//! cache, memory live at a snapshot, teardown releases, churn) cost nothing. Grade A ≥ 90,
//! B ≥ 80, C ≥ 70, D ≥ 60, else F. A program without warnings or critical findings scores 100
//! (A); one warning gives 85 (B), one critical 70 (C).
//!
//! Findings arrive ranked by harm (`analysis::rank`: severity, then the bytes the problem costs
//! or puts at risk over the next hour, capped at the device). Recommendations follow that
//! order, then notes that call for a change (repeated and short-lived allocations), one per
//! call site; at most `Config::max_recommendations`.

use alloc::vec::Vec;

use super::{Config, Finding, FindingKind, Severity};
pub use crate::report::Recommendation;

/// Points a finding costs.
pub const fn penalty(severity: Severity) -> i32 {
    match severity {
        Severity::Critical => 30,
        Severity::Warning => 15,
        Severity::Info => 0,
    }
}

/// Score 0-100 and grade A-F (notes cost nothing).
pub fn score(findings: &[Finding], _notes: &[Finding]) -> (u32, &'static str) {
    let mut s: i32 = 100;
    for f in findings {
        s -= penalty(f.severity);
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

/// At most `config.max_recommendations`: the findings in their ranked order, then notes that
/// call for a change.
pub fn recommendations(findings: &[Finding], notes: &[Finding], c: &Config) -> Vec<Recommendation> {
    let mut actionable: Vec<&Finding> = notes
        .iter()
        .filter(|n| {
            matches!(
                n.kind,
                FindingKind::RepeatedAllocations | FindingKind::ShortLived
            )
        })
        .collect();
    actionable.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    let all: Vec<&Finding> = findings.iter().chain(actionable).collect();
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

    fn f(kind: FindingKind, severity: Severity, site: &str) -> Finding {
        Finding::new(kind, severity, site.into())
    }

    #[test]
    fn the_score_follows_harm_and_recommendations_keep_the_ranking() {
        assert_eq!(score(&[], &[]), (100, "A"));
        // Notes cost nothing: a healthy program with caches and churn is still 100.
        let notes = [
            f(
                FindingKind::RepeatedAllocations,
                Severity::Info,
                "a (a.py:1)",
            ),
            f(FindingKind::ShortLived, Severity::Info, "a (a.py:1)"),
            f(FindingKind::Cache, Severity::Info, "pool"),
        ];
        assert_eq!(score(&[], &notes), (100, "A"));
        let one_warning = [f(FindingKind::LeakGrowth, Severity::Warning, "x")];
        assert_eq!(score(&one_warning, &notes), (85, "B"));
        let findings = [
            f(FindingKind::LeakGrowth, Severity::Critical, "x"),
            f(FindingKind::TimelineSpike, Severity::Warning, "y"),
        ];
        assert_eq!(score(&findings, &[]), (55, "F"));
        let many: Vec<Finding> = (0..8)
            .map(|_| f(FindingKind::LeakAtExit, Severity::Critical, "z"))
            .collect();
        assert_eq!(score(&many, &[]).0, 0);
        assert_eq!(grade(90), "A");
        assert_eq!(grade(89), "B");
        assert_eq!(grade(70), "C");
        assert_eq!(grade(60), "D");
        assert_eq!(grade(59), "F");
        let recs = recommendations(&findings, &notes, &Config::default());
        let kinds: Vec<FindingKind> = recs.iter().map(|r| r.kind).collect();
        // Findings in their order, then one note per call site.
        assert_eq!(
            kinds,
            [
                FindingKind::LeakGrowth,
                FindingKind::TimelineSpike,
                FindingKind::RepeatedAllocations,
            ]
        );
        assert_eq!(recs[0].priority, 1);
    }
}
