//! Repeated and short-lived allocations. Repeated: the reference rule, call sites with at least
//! 10 calls and a mean size under 50 MiB, top 5 by bytes (from `stack_stats`, no pass over the
//! events). Short-lived: call sites whose allocations are mostly freed within a short lifetime
//! (one pass over the allocations). Both are notes with the bytes churned and a pooling or
//! pre-allocation recommendation.

use alloc::format;
use alloc::vec::Vec;

use super::{Config, Finding, FindingKind, Found, Severity, SiteIndex, site_location};
use crate::model::{Fields, TraceModel};
pub use crate::report::{ChurnKind, ChurnSite};
use crate::units::{fmt_bytes, fmt_duration};

pub fn analyze(m: &TraceModel, c: &Config, sites: &SiteIndex, found: &mut Found) -> Vec<ChurnSite> {
    let mut out = Vec::new();
    // Repeated allocations (reference rule).
    let mut rep: Vec<&crate::model::StackStats> = m
        .stack_stats
        .values()
        .filter(|s| {
            s.alloc_count >= c.repeated_min_calls
                && s.alloc_bytes / s.alloc_count.max(1) < c.repeated_max_mean_bytes
        })
        .collect();
    rep.sort_by(|a, b| {
        b.alloc_bytes
            .cmp(&a.alloc_bytes)
            .then(a.stack.cmp(&b.stack))
    });
    rep.truncate(c.repeated_top);
    for s in rep {
        out.push(ChurnSite {
            kind: ChurnKind::Repeated,
            stack: s.stack,
            site: m.stack_label(s.stack),
            alloc_count: s.alloc_count,
            churned_bytes: s.alloc_bytes,
            mean_size_bytes: s.alloc_bytes / s.alloc_count.max(1),
            short_lived_count: 0,
        });
    }
    // Short-lived allocations: one pass, dense per-site counters.
    let mut short = alloc::vec![(0u64, 0u64); sites.len()];
    for a in m
        .allocs
        .iter_fields(Fields::FREE | Fields::TS | Fields::STACK | Fields::SIZE)
    {
        if a.is_live() {
            continue;
        }
        if a.free_ts_nanos.saturating_sub(a.ts_nanos) <= c.short_lived_max_nanos
            && let Some(i) = sites.get(a.stack)
        {
            short[i].0 += 1;
            short[i].1 = short[i].1.saturating_add(a.size_bytes);
        }
    }
    let mut sl: Vec<(usize, u64, u64)> = short
        .iter()
        .enumerate()
        .filter_map(|(i, &(n, b))| {
            let total = m
                .stack_stats
                .get(&sites.stacks[i])
                .map_or(0, |s| s.alloc_count);
            (n >= c.repeated_min_calls && n as f64 >= c.short_lived_min_fraction * total as f64)
                .then_some((i, n, b))
        })
        .collect();
    sl.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    sl.truncate(c.repeated_top);
    for (i, n, b) in sl {
        let stack = sites.stacks[i];
        let st = m.stack_stats.get(&stack).copied().unwrap_or_default();
        out.push(ChurnSite {
            kind: ChurnKind::ShortLived,
            stack,
            site: m.stack_label(stack),
            alloc_count: st.alloc_count,
            churned_bytes: b,
            mean_size_bytes: b / n.max(1),
            short_lived_count: n,
        });
    }
    for s in &out {
        let loc = site_location(m, s.stack);
        let (kind, message, fix) = match s.kind {
            ChurnKind::Repeated => (
                FindingKind::RepeatedAllocations,
                format!(
                    "{} allocates {} times (mean {}), {} in total",
                    s.site,
                    s.alloc_count,
                    fmt_bytes(s.mean_size_bytes),
                    fmt_bytes(s.churned_bytes)
                ),
                format!(
                    "pre-allocate once and reuse the buffer at {loc}, or allocate from a pool (cudaMallocAsync / a caching allocator)"
                ),
            ),
            ChurnKind::ShortLived => (
                FindingKind::ShortLived,
                format!(
                    "{} of {} allocations from {} are freed within {} ({} churned)",
                    s.short_lived_count,
                    s.alloc_count,
                    s.site,
                    fmt_duration(c.short_lived_max_nanos),
                    fmt_bytes(s.churned_bytes)
                ),
                format!(
                    "keep a reusable scratch buffer for the allocation at {loc} instead of allocating and freeing it each time"
                ),
            ),
        };
        let mut f = Finding::new(kind, Severity::Info, s.site.clone());
        f.stack = Some(s.stack);
        f.bytes = s.churned_bytes;
        f.count = s.alloc_count;
        f.headline = format!(
            "{} allocations at {loc} could reuse a buffer",
            s.alloc_count
        );
        f.message = message;
        f.fix = fix;
        found.push(f);
    }
    out
}
