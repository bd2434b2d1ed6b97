//! The difference between two reports (before/after, rank 0 vs rank 3): peak, live at end and
//! score, then per call site (matched by full stack text, as stack ids differ between traces)
//! and per scope the change in peak, live at end and growth, and which findings appeared or
//! went away. Works on `Report`s alone, so the viewer can diff without the traces.

use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;
use serde::Serialize;

use super::{Finding, SiteSummary};
use crate::report::Report;

/// A before/after pair of byte counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Change {
    pub before: u64,
    pub after: u64,
    pub delta: i64,
}

impl Change {
    pub fn new(before: u64, after: u64) -> Self {
        Self {
            before,
            after,
            delta: super::signed_diff(after, before),
        }
    }
}

/// A before/after pair of signed values (growth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SignedChange {
    pub before: i64,
    pub after: i64,
    pub delta: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteChange {
    pub site: String,
    pub frames: Vec<String>,
    pub peak_bytes: Change,
    pub live_at_end_bytes: Change,
    pub alloc_bytes: Change,
    pub alloc_count: Change,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScopeChange {
    pub scope: String,
    pub calls: Change,
    pub growth_bytes: SignedChange,
    pub max_peak_bytes: Change,
}

/// Everything that changed from `before` to `after`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReportDiff {
    pub peak_bytes: Change,
    pub live_at_end_bytes: Change,
    pub alloc_count: Change,
    pub score: Change,
    pub grade_before: String,
    pub grade_after: String,
    /// Changed call sites, largest change first (at most `MAX_CHANGES`).
    pub sites: Vec<SiteChange>,
    pub scopes: Vec<ScopeChange>,
    /// Findings in `after` with no finding of the same kind at the same site in `before`.
    pub new_findings: Vec<Finding>,
    /// Findings in `before` that `after` no longer has.
    pub resolved_findings: Vec<Finding>,
}

pub const MAX_CHANGES: usize = 50;

fn key(s: &SiteSummary) -> String {
    if s.frames.is_empty() {
        s.site.clone()
    } else {
        s.frames.join("\n")
    }
}

pub fn diff(before: &Report, after: &Report) -> ReportDiff {
    let a = &before.analysis;
    let b = &after.analysis;
    let mut sites: HashMap<String, (Option<&SiteSummary>, Option<&SiteSummary>)> = HashMap::new();
    for s in &a.sites {
        sites.entry(key(s)).or_default().0 = Some(s);
    }
    for s in &b.sites {
        sites.entry(key(s)).or_default().1 = Some(s);
    }
    let mut site_changes: Vec<SiteChange> = sites
        .into_values()
        .map(|(x, y)| {
            let any = x.or(y).cloned().unwrap_or_default();
            let g = |f: fn(&SiteSummary) -> u64, s: Option<&SiteSummary>| s.map_or(0, f);
            SiteChange {
                site: any.site,
                frames: any.frames,
                peak_bytes: Change::new(g(|s| s.peak_bytes, x), g(|s| s.peak_bytes, y)),
                live_at_end_bytes: Change::new(
                    g(|s| s.live_at_end_bytes, x),
                    g(|s| s.live_at_end_bytes, y),
                ),
                alloc_bytes: Change::new(g(|s| s.alloc_bytes, x), g(|s| s.alloc_bytes, y)),
                alloc_count: Change::new(g(|s| s.alloc_count, x), g(|s| s.alloc_count, y)),
            }
        })
        .filter(|c| {
            c.peak_bytes.delta != 0 || c.live_at_end_bytes.delta != 0 || c.alloc_bytes.delta != 0
        })
        .collect();
    let weight = |c: &SiteChange| {
        c.peak_bytes
            .delta
            .unsigned_abs()
            .saturating_add(c.live_at_end_bytes.delta.unsigned_abs())
    };
    site_changes.sort_by(|x, y| {
        weight(y)
            .cmp(&weight(x))
            .then(
                y.alloc_bytes
                    .delta
                    .unsigned_abs()
                    .cmp(&x.alloc_bytes.delta.unsigned_abs()),
            )
            .then(x.site.cmp(&y.site))
    });
    site_changes.truncate(MAX_CHANGES);

    let mut scopes: Vec<ScopeChange> = Vec::new();
    for s in a.scopes.iter().chain(&b.scopes) {
        if scopes.iter().any(|c| c.scope == s.scope) {
            continue;
        }
        let x = a.scopes.iter().find(|t| t.scope == s.scope);
        let y = b.scopes.iter().find(|t| t.scope == s.scope);
        let gb = x.map_or(0, |t| t.total_growth_bytes);
        let ga = y.map_or(0, |t| t.total_growth_bytes);
        scopes.push(ScopeChange {
            scope: s.scope.clone(),
            calls: Change::new(x.map_or(0, |t| t.calls), y.map_or(0, |t| t.calls)),
            growth_bytes: SignedChange {
                before: gb,
                after: ga,
                delta: ga.saturating_sub(gb),
            },
            max_peak_bytes: Change::new(
                x.map_or(0, |t| t.max_peak_bytes),
                y.map_or(0, |t| t.max_peak_bytes),
            ),
        });
    }
    scopes.sort_by(|x, y| {
        y.growth_bytes
            .delta
            .unsigned_abs()
            .cmp(&x.growth_bytes.delta.unsigned_abs())
            .then(x.scope.cmp(&y.scope))
    });
    scopes.truncate(MAX_CHANGES);

    let same = |f: &Finding, g: &Finding| f.kind == g.kind && f.site == g.site;
    let has = |list: &[Finding], f: &Finding| list.iter().any(|g| same(f, g));
    let new_findings = after
        .findings
        .iter()
        .filter(|f| !has(&before.findings, f))
        .cloned()
        .collect();
    let resolved_findings = before
        .findings
        .iter()
        .filter(|f| !has(&after.findings, f))
        .cloned()
        .collect();
    ReportDiff {
        peak_bytes: Change::new(before.peak_bytes, after.peak_bytes),
        live_at_end_bytes: Change::new(before.live_at_end_bytes, after.live_at_end_bytes),
        alloc_count: Change::new(before.alloc_count, after.alloc_count),
        score: Change::new(u64::from(before.score), u64::from(after.score)),
        grade_before: before.grade.clone(),
        grade_after: after.grade.clone(),
        sites: site_changes,
        scopes,
        new_findings,
        resolved_findings,
    }
}
