//! Growth per scope: the reference `memory_leak` rule, per NVTX range name (each instance is one
//! call) or, in a trace without NVTX ranges, per call site (each allocation is one call, and its
//! growth is its size minus what the site freed before its next call). Then bounded growth
//! (the last third of the calls adds almost nothing) is told from unbounded growth. A table
//! for the report; the findings come from `leaks`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::{Config, SiteIndex, site_label};
use crate::format::{StackId, StringId};
use crate::model::{Fields, LIVE, TraceModel};
pub use crate::report::{ScopeGrowth, ScopeKind};

/// How many call-site scopes are kept in the report (NVTX scopes are all kept).
const MAX_CALL_SITE_SCOPES: usize = 50;

/// The growth of every scope, for the report's scope table. Findings come from the
/// per-iteration growth of causes (`leaks`), which this table only details: one cause, one
/// finding.
pub fn analyze(m: &TraceModel, c: &Config, sites: &SiteIndex) -> Vec<ScopeGrowth> {
    let mut out = if m.ranges.is_empty() {
        call_site_scopes(m, c, sites)
    } else {
        nvtx_scopes(m, c)
    };
    out.sort_by(|a, b| {
        b.total_growth_bytes
            .cmp(&a.total_growth_bytes)
            .then(a.scope.cmp(&b.scope))
    });
    out
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The reference rule plus the bounded-growth test over one scope's per-call growth.
fn judge(c: &Config, diffs: &[i64]) -> (i64, f64, f64, i64, bool, bool) {
    let n = diffs.len() as u64;
    let total = diffs.iter().fold(0i64, |a, &d| a.saturating_add(d));
    let avg = if n > 0 { total as f64 / n as f64 } else { 0.0 };
    let pos = diffs.iter().filter(|&&d| d > 0).count();
    let ratio = if n > 0 { pos as f64 / n as f64 } else { 0.0 };
    let tail = diffs[diffs.len() - diffs.len() / 3..]
        .iter()
        .fold(0i64, |a, &d| a.saturating_add(d));
    let reference = n >= c.min_calls_for_analysis
        && avg > 0.0
        && ratio > c.memory_leak_ratio
        && total > c.leak_total_growth_bytes as i64;
    let bounded = c.detect_bounded_growth
        && total > 0
        && (tail as f64) <= c.bounded_tail_fraction * total as f64;
    (total, avg, ratio, tail, reference, bounded)
}

/// NVTX scopes: the scope index of every range instance, and the scope names.
pub(crate) struct NvtxScopes {
    pub scope_of: Vec<u32>,
    pub names: Vec<String>,
}

pub(crate) fn nvtx_scope_index(m: &TraceModel) -> NvtxScopes {
    let mut index: HashMap<(StringId, StringId), u32> = HashMap::new();
    let mut scope_of = Vec::with_capacity(m.ranges.len());
    let mut names = Vec::new();
    for r in &m.ranges {
        let next = index.len() as u32;
        let k = *index.entry((r.name, r.domain)).or_insert(next);
        if k as usize == names.len() {
            names.push(if m.string(r.domain).is_empty() {
                String::from(m.string(r.name))
            } else {
                format!("{}::{}", m.string(r.domain), m.string(r.name))
            });
        }
        scope_of.push(k);
    }
    NvtxScopes { scope_of, names }
}

fn nvtx_scopes(m: &TraceModel, c: &Config) -> Vec<ScopeGrowth> {
    let NvtxScopes { scope_of, names } = nvtx_scope_index(m);
    let mut diffs: Vec<Vec<i64>> = alloc::vec![Vec::new(); names.len()];
    let mut peaks: Vec<u64> = alloc::vec![0; names.len()];
    for (r, &k) in m.ranges.iter().zip(&scope_of) {
        if r.end_ts_nanos.is_some() {
            diffs[k as usize].push(super::signed_diff(r.live_after_bytes, r.live_before_bytes));
            peaks[k as usize] = peaks[k as usize].max(r.peak_bytes);
        }
    }
    // Which call sites kept bytes beyond the end of an instance of each scope.
    let mut kept: HashMap<(u32, StackId), u64> = HashMap::new();
    let fields = Fields::RANGE_SLOT | Fields::KIND | Fields::FREE | Fields::STACK | Fields::SIZE;
    for a in m.allocs.iter_fields(fields) {
        if a.range_slot == 0 || !a.kind.is_device_memory() {
            continue;
        }
        let mut slot = a.range_slot;
        let mut depth = 0;
        while slot != 0 && depth < 64 {
            let Some(r) = m.ranges.get(slot as usize - 1) else {
                break;
            };
            match r.end_ts_nanos {
                Some(end) if a.free_ts_nanos == LIVE || a.free_ts_nanos > end => {
                    let e = kept
                        .entry((scope_of[slot as usize - 1], a.stack))
                        .or_default();
                    *e = e.saturating_add(a.size_bytes);
                }
                _ => {}
            }
            slot = r.parent_slot;
            depth += 1;
        }
    }
    let mut top: Vec<Option<(StackId, u64)>> = alloc::vec![None; diffs.len()];
    for ((k, stack), bytes) in kept {
        let t = &mut top[k as usize];
        if t.is_none_or(|(s, b)| bytes > b || (bytes == b && stack < s)) {
            *t = Some((stack, bytes));
        }
    }
    // Which scopes run inside which (parent scope, child scope), from the instance tree.
    let mut nesting: Vec<(u32, u32)> = Vec::new();
    for (r, &k) in m.ranges.iter().zip(&scope_of) {
        if r.parent_slot != 0
            && let Some(&p) = scope_of.get(r.parent_slot as usize - 1)
            && p != k
            && !nesting.contains(&(p, k))
        {
            nesting.push((p, k));
        }
    }
    let mut out = Vec::new();
    for (k, d) in diffs.iter().enumerate() {
        if d.is_empty() {
            continue;
        }
        let (total, avg, ratio, tail, reference, bounded) = judge(c, d);
        out.push(ScopeGrowth {
            explained_by: None,
            scope: names[k].clone(),
            kind: ScopeKind::NvtxRange,
            calls: d.len() as u64,
            total_growth_bytes: total,
            avg_growth_bytes: avg,
            positive_ratio: ratio,
            tail_growth_bytes: tail,
            reference_leak: reference,
            bounded,
            max_peak_bytes: peaks[k],
            top_stack: top[k].map(|t| t.0),
            top_site: top[k].map(|t| m.stack_label(t.0)),
            top_site_bytes: top[k].map_or(0, |t| t.1),
        });
    }
    // A growing scope whose growth an enclosed growing scope explains is not a second leak.
    let leaking: Vec<bool> = out.iter().map(|s| s.reference_leak && !s.bounded).collect();
    let index_of = |name: &str| out.iter().position(|s| s.scope == name);
    let mut explained: Vec<(usize, String)> = Vec::new();
    for (i, s) in out.iter().enumerate() {
        if !leaking[i] || s.total_growth_bytes <= 0 {
            continue;
        }
        let Some(k) = names.iter().position(|n| *n == s.scope) else {
            continue;
        };
        for &(p, ch) in &nesting {
            if p as usize != k {
                continue;
            }
            let child = &names[ch as usize];
            if let Some(j) = index_of(child)
                && leaking[j]
                && out[j].total_growth_bytes as f64 >= 0.9 * s.total_growth_bytes as f64
            {
                explained.push((i, child.clone()));
                break;
            }
        }
    }
    for (i, child) in explained {
        out[i].explained_by = Some(child);
    }
    out
}

fn call_site_scopes(m: &TraceModel, c: &Config, sites: &SiteIndex) -> Vec<ScopeGrowth> {
    let n = sites.len();
    // Per site: allocation times (time-ordered, as allocation ids are) and per-call growth.
    let mut times: Vec<Vec<u64>> = alloc::vec![Vec::new(); n];
    let mut diffs: Vec<Vec<i64>> = alloc::vec![Vec::new(); n];
    for a in m
        .allocs
        .iter_fields(Fields::KIND | Fields::STACK | Fields::TS | Fields::SIZE)
    {
        if !a.kind.is_device_memory() {
            continue;
        }
        if let Some(i) = sites.get(a.stack) {
            times[i].push(a.ts_nanos);
            diffs[i].push(signed(a.size_bytes));
        }
    }
    for a in m
        .allocs
        .iter_fields(Fields::FREE | Fields::KIND | Fields::STACK | Fields::SIZE)
    {
        if a.is_live() || !a.kind.is_device_memory() {
            continue;
        }
        if let Some(i) = sites.get(a.stack) {
            // The call this free belongs to: the site's last allocation at or before it.
            let j = times[i].partition_point(|&t| t <= a.free_ts_nanos);
            if j > 0 {
                diffs[i][j - 1] = diffs[i][j - 1].saturating_sub(signed(a.size_bytes));
            }
        }
    }
    let mut out = Vec::new();
    for (i, d) in diffs.iter().enumerate() {
        if (d.len() as u64) < c.min_calls_for_analysis {
            continue;
        }
        let (total, avg, ratio, tail, reference, bounded) = judge(c, d);
        if total <= 0 && !reference {
            continue;
        }
        let stack = sites.stacks[i];
        let (label, _) = site_label(m, stack);
        out.push(ScopeGrowth {
            scope: label.clone(),
            kind: ScopeKind::CallSite,
            calls: d.len() as u64,
            total_growth_bytes: total,
            avg_growth_bytes: avg,
            positive_ratio: ratio,
            tail_growth_bytes: tail,
            reference_leak: reference,
            bounded,
            max_peak_bytes: m.stack_stats.get(&stack).map_or(0, |s| s.peak_bytes),
            explained_by: None,
            top_stack: Some(stack),
            top_site: Some(label),
            top_site_bytes: total.max(0).unsigned_abs(),
        });
    }
    out.sort_by_key(|s| core::cmp::Reverse(s.total_growth_bytes));
    out.truncate(MAX_CALL_SITE_SCOPES);
    out
}
