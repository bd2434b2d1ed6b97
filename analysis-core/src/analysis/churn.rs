//! Repeated and short-lived allocations. Repeated: the reference rule, call sites with at least
//! 10 calls and a mean size under 50 MiB, top 5 by bytes (from `stack_stats`, no pass over the
//! events). Short-lived: call sites whose allocations are mostly freed within a short lifetime
//! (one pass over the allocations). Both are notes with the bytes churned and a pooling or
//! pre-allocation recommendation.

use alloc::format;
use alloc::vec::Vec;

use super::{Carried, Config, Finding, FindingKind, Found, Severity, SiteIndex, site_location};
use crate::model::{AllocRecord, Fields, TraceModel};
pub use crate::report::{ChurnKind, ChurnSite};
use crate::units::{fmt_bytes, fmt_duration};

pub fn analyze(m: &TraceModel, c: &Config, sites: &SiteIndex, found: &mut Found) -> Vec<ChurnSite> {
    let mut pass = ShortLived::new(c, sites);
    super::run_alone(m, &mut pass);
    analyze_after(m, c, sites, pass, found)
}

/// The short-lived allocations' pass, one allocation at a time, so that another pass over the
/// same model can carry it ([`Carried`]: the summary's facts'): dense per-site counters of the
/// allocations freed within the short lifetime, and their bytes.
pub(crate) struct ShortLived<'a> {
    sites: &'a SiteIndex,
    max_nanos: u64,
    short: Vec<(u64, u64)>,
}

impl<'a> ShortLived<'a> {
    pub(crate) fn new(c: &Config, sites: &'a SiteIndex) -> Self {
        Self {
            sites,
            max_nanos: c.short_lived_max_nanos,
            short: alloc::vec![(0, 0); sites.len()],
        }
    }
}

impl Carried for ShortLived<'_> {
    fn fields(&self) -> Fields {
        Fields::FREE | Fields::TS | Fields::STACK | Fields::SIZE
    }

    #[inline]
    fn visit(&mut self, a: &AllocRecord) {
        if a.is_live() {
            return;
        }
        if a.free_ts_nanos.saturating_sub(a.ts_nanos) <= self.max_nanos
            && let Some(i) = self.sites.get(a.stack)
        {
            let s = &mut self.short[i];
            s.0 += 1;
            s.1 = s.1.saturating_add(a.size_bytes);
        }
    }
}

/// [`analyze`], the short-lived allocations counted already (`pass`, carried by another).
pub(crate) fn analyze_after(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    pass: ShortLived<'_>,
    found: &mut Found,
) -> Vec<ChurnSite> {
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
    // Short-lived allocations, counted by the pass.
    let short = pass.short;
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
