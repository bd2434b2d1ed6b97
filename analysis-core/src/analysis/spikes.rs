//! Spikes: iterations whose peak stands far above the steady-state working set. The working
//! set is the median peak of the steady-state iterations (`iterations`), never a zero baseline:
//! memory that rises and falls in every iteration is the workload. An iteration is a spike when
//! its peak exceeds the working set by `Config::spike_peak_ratio` and by at least
//! `Config::spike_min_excess_bytes` (or 1 % of the device). Each spike is attributed to the
//! largest allocation made in that iteration and live at its peak; recurring spikes of one
//! cause are one finding with their count, period and size.
//!
//! The per-scope Tukey table (allocation sizes above Q3 + 1.5·IQR per NVTX range or call site,
//! the reference rule applied to allocations) stays as a table: a size that recurs every
//! iteration is not a problem by itself, so it makes no finding.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::causes::Causes;
use super::iterations::Iterations;
use super::median::{MedianOverPasses, QuantileOverPasses, over_passes, upper_median_over};
use super::scopes::{ScopeKind, ScopeOfSlot, nvtx_scope_index};
use super::{Config, Finding, FindingKind, Found, Severity, SiteIndex};
use crate::format::StackId;
use crate::model::{Fields, TraceModel};
use crate::packed::Column;
pub use crate::report::{ScopeSpikes, SpikeEvent, TimelineSpikeEvent};
use crate::stats::{Counts, lerp, quantile_select_u64};
use crate::timeline::Timeline;
use crate::units::fmt_bytes;

/// Events kept per scope, and timeline spikes kept in total.
pub const MAX_EVENTS: usize = 100;
/// Iterations on either side that make an iteration's working set.
const NEIGHBOURS: usize = 16;

pub fn analyze(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    it: &Iterations,
    causes: &Causes,
    found: &mut Found,
) -> (Vec<ScopeSpikes>, Vec<TimelineSpikeEvent>) {
    (
        scope_spikes(m, c, sites),
        timeline_spikes(m, c, it, causes, found),
    )
}

/// The scope of an allocation: its NVTX scope in a trace with ranges, else its call site.
struct ScopeOf<'a> {
    m: &'a TraceModel,
    nvtx: Option<ScopeOfSlot<'a>>,
    sites: &'a SiteIndex,
}

impl ScopeOf<'_> {
    #[inline(always)]
    fn get(&mut self, a: &crate::model::AllocRecord) -> Option<usize> {
        match &mut self.nvtx {
            Some(ix) => ix.get(self.m, a.range_slot).map(|k| k as usize),
            None => self.sites.get(a.stack),
        }
    }
}

fn scope_spikes(m: &TraceModel, c: &Config, sites: &SiteIndex) -> Vec<ScopeSpikes> {
    let nvtx = !m.ranges.is_empty();
    let index = nvtx.then(|| nvtx_scope_index(m));
    let n_scopes = match &index {
        Some(ix) => ix.names.len(),
        None => sites.len(),
    };
    let mut scope_of = ScopeOf {
        m,
        nvtx: index.as_ref().map(|ix| ScopeOfSlot::new(m, ix)),
        sites,
    };
    // Each scope's sizes, counted (a scope's sizes mostly repeat).
    let mut values: Vec<Counts> = alloc::vec![Counts::default(); n_scopes];
    let scope_fields = if nvtx {
        Fields::RANGE_SLOT
    } else {
        Fields::STACK
    };
    // Each device allocation's scope and size, in id order.
    let mut sizes = |see: &mut dyn FnMut(usize, u64)| {
        for a in m
            .allocs
            .iter_fields(Fields::SIZE | Fields::KIND | scope_fields)
        {
            if a.size_bytes == 0 || !a.kind.is_device_memory() {
                continue;
            }
            if let Some(k) = scope_of.get(&a) {
                see(k, a.size_bytes);
            }
        }
    };
    sizes(&mut |k, size| values[k].push(size));
    let enough = |v: &Counts| v.len() >= c.min_calls_for_analysis.max(3);
    let quartiles = uncounted_quartiles(&values, enough, sizes);
    let mut thresholds: Vec<Option<(f64, f64, f64)>> = alloc::vec![None; n_scopes];
    for (k, v) in values.iter_mut().enumerate() {
        if !enough(v) {
            continue;
        }
        let (q1, q3) = match quartiles.get(&k) {
            Some(&q) => (Some(q.0), Some(q.1)),
            None => (v.quantile(0.25), v.quantile(0.75)),
        };
        let (Some(q1), Some(q3)) = (q1, q3) else {
            continue;
        };
        let thr = q3 + c.spike_iqr_factor * (q3 - q1);
        if v.max().is_some_and(|x| x as f64 > thr) {
            thresholds[k] = Some((q1, q3, thr));
        }
    }
    let mut out: Vec<ScopeSpikes> = Vec::new();
    if thresholds.iter().all(Option::is_none) {
        // No scope has an allocation above its threshold.
        return out;
    }
    let mut slot: Vec<usize> = alloc::vec![usize::MAX; n_scopes];
    let fields = Fields::SIZE | Fields::KIND | Fields::TS | Fields::STACK | scope_fields;
    for a in m.allocs.iter_fields(fields) {
        if a.size_bytes == 0 || !a.kind.is_device_memory() {
            continue;
        }
        let Some(k) = scope_of.get(&a) else { continue };
        let Some((q1, q3, thr)) = thresholds[k] else {
            continue;
        };
        if a.size_bytes as f64 <= thr {
            continue;
        }
        if slot[k] == usize::MAX {
            slot[k] = out.len();
            out.push(ScopeSpikes {
                scope: match &index {
                    Some(ix) => ix.names[k].clone(),
                    None => m.stack_label(sites.stacks[k]),
                },
                kind: if nvtx {
                    ScopeKind::NvtxRange
                } else {
                    ScopeKind::CallSite
                },
                allocations: values[k].len(),
                q1_bytes: q1,
                q3_bytes: q3,
                threshold_bytes: thr,
                spike_count: 0,
                max_spike_bytes: 0,
                events: Vec::new(),
            });
        }
        let s = &mut out[slot[k]];
        s.spike_count += 1;
        s.max_spike_bytes = s.max_spike_bytes.max(a.size_bytes);
        if s.events.len() < MAX_EVENTS {
            s.events.push(SpikeEvent {
                ts_nanos: a.ts_nanos,
                size_bytes: a.size_bytes,
                stack: a.stack,
                site: String::new(),
            });
        }
    }
    let mut labels: HashMap<StackId, String> = HashMap::new();
    for s in &mut out {
        for e in &mut s.events {
            e.site = labels
                .entry(e.stack)
                .or_insert_with(|| m.stack_label(e.stack))
                .clone();
        }
    }
    out
}

/// The first and third quartiles of each scope whose sizes did not repeat enough to count
/// ([`Counts::counted`]) and that has `enough` of them, found over passes through the sizes
/// again (`pass` calls `see` with each one's scope and size, in the same order on each call),
/// with memory bounded by the scopes, not by their allocations.
fn uncounted_quartiles(
    values: &[Counts],
    enough: impl Fn(&Counts) -> bool,
    mut pass: impl FnMut(&mut dyn FnMut(usize, u64)),
) -> HashMap<usize, (f64, f64)> {
    let mut slot: Vec<u32> = alloc::vec![u32::MAX; values.len()];
    let mut searches: Vec<(usize, [QuantileOverPasses; 2])> = Vec::new();
    let wanted = values.iter().filter(|v| !v.counted() && enough(v)).count();
    for (k, v) in values.iter().enumerate() {
        let (false, true, Some(min), Some(max)) = (v.counted(), enough(v), v.min(), v.max()) else {
            continue;
        };
        let cap = super::median::cap(4 * wanted);
        let q = |q| QuantileOverPasses::new(v.len(), min, max, q, cap);
        slot[k] = searches.len() as u32;
        searches.push((k, [q(0.25), q(0.75)]));
    }
    loop {
        let open: usize = searches
            .iter()
            .flat_map(|(_, q)| q.iter())
            .map(QuantileOverPasses::open)
            .sum();
        if open == 0 {
            break;
        }
        pass(&mut |k, size| {
            let Some(&j) = slot.get(k) else {
                return;
            };
            if let Some((_, q)) = searches.get_mut(j as usize) {
                q[0].see(size);
                q[1].see(size);
            }
        });
        for q in searches.iter_mut().flat_map(|(_, q)| q.iter_mut()) {
            q.end_pass(super::median::cap(open));
        }
    }
    searches
        .into_iter()
        .filter_map(|(k, [q1, q3])| Some((k, (q1.found()?, q3.found()?))))
        .collect()
}

/// The highest working set a peak `p` can be a spike over (`p >= local * ratio` and
/// `p - local >= min_excess`), rounded up so that a working set above it is surely not one.
fn spike_bound(p: f64, ratio: f64, min_excess: f64) -> f64 {
    let bound = if ratio > 0.0 {
        (p - min_excess).min(p / ratio)
    } else {
        p - min_excess
    };
    bound + bound.abs() * 1e-6 + 1.0
}

/// Whether the median of `xs` ([`quantile_select_u64`] at 0.5) can be `bound` or less: it is at
/// least the lower of the middle values, so not when fewer than half the values are.
fn median_may_be_at_most(xs: &[u64], bound: f64) -> bool {
    let Some(last) = xs.len().checked_sub(1) else {
        return false;
    };
    let lower_middle = last / 2;
    xs.iter().filter(|&&x| x as f64 <= bound).count() > lower_middle
}

/// Calls `peak` with the peak of each iteration in order, as (bytes, when first reached): the
/// highest point of `t` in its span ([`Iterations::span`], the run ending at `end`), or the
/// value at its start where no point in it is higher. One pass over the points, as the starts
/// are in time order. Not inlined: inlined into its caller, a report on 3M events took 19 M
/// more instructions.
#[inline(never)]
fn iteration_peaks(t: &Timeline, it: &Iterations, end: u64, mut peak: impl FnMut((u64, u64))) {
    let mut starts = it.starts_nanos.iter().peekable();
    let mut points = t.points().peekable();
    // Points read (all before the next start), and the value of the last.
    let (mut read, mut last) = (0usize, 0u64);
    while let Some(a) = starts.next() {
        // The span of `Iterations::span`.
        let b = starts.peek().copied().unwrap_or(end).max(a);
        while let Some(&(time, value)) = points.peek()
            && time < a
        {
            (read, last) = (read + 1, value);
            points.next();
        }
        if b == a {
            // An empty span (a start repeated): its points at `a` are the next span's too.
            peak(peak_between(t, a, b, read));
            continue;
        }
        // The value at `a` (its last point at or before it) unless a higher one follows.
        let mut best = (last, a);
        let mut high: Option<(u64, u64)> = None;
        while let Some(&(time, value)) = points.peek()
            && time < b
        {
            if time == a {
                best.0 = value;
            }
            if high.is_none_or(|(h, _)| value > h) {
                high = Some((value, time));
            }
            (read, last) = (read + 1, value);
            points.next();
        }
        if let Some(h) = high
            && h.0 > best.0
        {
            best = h;
        }
        peak(best);
    }
}

/// The peak of `t` in `[a, b)` as [`iteration_peaks`] gives it, by searching from point `from`
/// (at most the first at `a` or after).
fn peak_between(t: &Timeline, a: u64, b: u64, from: usize) -> (u64, u64) {
    let i0 = t.partition_point_from(from, |x| x < a);
    let after_a = t.partition_point_from(i0, |x| x <= a);
    let mut best = (after_a.checked_sub(1).map_or(0, |k| t.value(k)), a);
    let i1 = t.partition_point_from(i0, |x| x < b);
    if let Some((_, hi)) = t.range_min_max(i0, i1)
        && hi > best.0
    {
        let k = t.first_at_least(i0, i1, hi).unwrap_or(i0);
        best = (hi, t.time(k));
    }
    best
}

/// The median of the values of `column` from `from` on (at least one), as
/// [`quantile_select_u64`] at 0.5 gives it (the mean of the two middle values of an even
/// count), over passes through them ([`MedianOverPasses`]): no copy of them to select in.
fn median_over_passes(column: &Column, from: usize) -> f64 {
    let n = column.len().saturating_sub(from);
    if n.is_multiple_of(2) {
        let mut m = [MedianOverPasses::lower(), MedianOverPasses::new()];
        over_passes(|| column.iter_from(from), &mut m);
        let (l, u) = (m[0].found().unwrap_or(0), m[1].found().unwrap_or(0));
        lerp(l as f64, u as f64, 0.5)
    } else {
        upper_median_over(|| column.iter_from(from)) as f64
    }
}

fn timeline_spikes(
    m: &TraceModel,
    c: &Config,
    it: &Iterations,
    causes: &Causes,
    found: &mut Found,
) -> Vec<TimelineSpikeEvent> {
    let n_it = it.starts_nanos.len();
    let first = it.warmup as usize;
    if m.total.is_empty() || n_it <= first + 2 {
        return Vec::new();
    }
    let end = m.last_ts_nanos;
    // Peak of every iteration: its bytes alone, in a column that goes to the model's spill
    // with its history (8 bytes per iteration in a vector had been 62 MB at 7.7 M steps).
    // When it was reached is searched again for the few that spike.
    let mut peaks = Column::new();
    peaks.set_spill(m.spill());
    iteration_peaks(&m.total, it, end, |(bytes, _)| peaks.push(bytes));
    // The working set around each iteration: the median peak of the steady-state iterations
    // within `NEIGHBOURS` on either side (a program that grows or changes phase has a moving
    // working set), and that of all steady-state iterations for the sentences (over passes
    // through the peaks, below).
    let n = peaks.len();
    if n <= first {
        return Vec::new();
    }
    let capacity = m.devices.iter().map(|d| d.total_bytes).max().unwrap_or(0);
    let min_excess = c.spike_min_excess_bytes.max(capacity / 100) as f64;
    // (iteration, responsible allocation index, its cause, local working set, its peak)
    let mut spikes: Vec<(usize, usize, usize, f64, u64)> = Vec::new();
    let mut window: Vec<u64> = Vec::with_capacity(2 * NEIGHBOURS + 1);
    // The peaks of iterations `near_from..` up to the last one read, read in order.
    let mut read = peaks.iter_from(first);
    let mut near: VecDeque<u64> = VecDeque::with_capacity(2 * NEIGHBOURS + 2);
    let mut near_from = first;
    for i in first..n {
        let lo = i.saturating_sub(NEIGHBOURS).max(first);
        let hi = (i + NEIGHBOURS + 1).min(n);
        while near_from + near.len() < hi {
            near.push_back(read.next().unwrap_or(0));
        }
        while near_from < lo {
            near.pop_front();
            near_from += 1;
        }
        let peak = near[i - near_from];
        window.clear();
        window.extend(
            near.iter()
                .enumerate()
                .filter(|&(j, _)| near_from + j != i)
                .map(|(_, &p)| p),
        );
        let p = peak as f64;
        if !median_may_be_at_most(&window, spike_bound(p, c.spike_peak_ratio, min_excess)) {
            continue;
        }
        let Some(local) = quantile_select_u64(&mut window, 0.5) else {
            continue;
        };
        if p < local * c.spike_peak_ratio || p - local < min_excess {
            continue;
        }
        let (a, b) = it.span(i, end);
        let (_, at) = peak_between(&m.total, a, b, 0);
        // The largest allocation of this iteration live at its peak, freed again (a spike is
        // transient: what stays is growth).
        // The ids made in the iteration (where records step back, some made outside it lie
        // among them).
        let Some(last) = b.checked_sub(1).filter(|&l| l >= a) else {
            continue;
        };
        let span = m.allocs.made_in(a, last);
        let culprit = m
            .allocs
            .iter_range(span.start, span.end)
            .enumerate()
            .filter(|(_, x)| (a..b).contains(&x.ts_nanos))
            .filter(|(_, x)| x.kind.is_device_memory() && x.live_at(at) && !x.is_live())
            .max_by(|x, y| x.1.size_bytes.cmp(&y.1.size_bytes).then(y.0.cmp(&x.0)))
            .map(|(k, x)| (span.start + k, causes.of(&x)));
        if let Some((k, ci)) = culprit {
            spikes.push((i, k, ci, local, peak));
        }
    }
    let baseline = median_over_passes(&peaks, first);
    drop(peaks);
    // One finding per cause.
    let mut by: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    for &(i, k, ci, _, _) in &spikes {
        match by.iter_mut().find(|e| e.0 == ci) {
            Some(e) => e.1.push((i, k)),
            None => by.push((ci, alloc::vec![(i, k)])),
        }
    }
    let unit = it.unit();
    for (ci, list) in &by {
        let max_size = list
            .iter()
            .map(|&(_, k)| m.allocs.size(k))
            .max()
            .unwrap_or(0);
        // Each spiking iteration's (local working set, peak).
        let of = |i: usize| {
            spikes
                .iter()
                .find(|s| s.0 == i)
                .map_or((baseline, 0), |s| (s.3, s.4))
        };
        let max_peak = list.iter().map(|&(i, _)| of(i).1).max().unwrap_or(0);
        let excess = list
            .iter()
            .map(|&(i, _)| {
                let (local, peak) = of(i);
                (peak as f64 - local).max(0.0) as u64
            })
            .max()
            .unwrap_or(0);
        let (_, device, _, label) = &causes.keys[*ci];
        let cap = super::device_capacity(m, *device);
        let failed_in_spike = m.failed.iter().any(|f| {
            f.record.is_out_of_memory()
                && list.iter().any(|&(i, _)| {
                    let (a, b) = it.span(i, end);
                    f.record.ts_nanos >= a && f.record.ts_nanos < b
                })
        });
        let near_full = cap.is_some_and(|cap| max_peak as f64 >= 0.95 * cap as f64);
        let severity = if failed_in_spike || near_full {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let mut gaps: Vec<usize> = list.windows(2).map(|w| w[1].0 - w[0].0).collect();
        gaps.sort_unstable();
        let period = gaps.get(gaps.len() / 2).copied();
        let loc = if causes.locations[*ci].is_empty() {
            label.clone()
        } else {
            causes.locations[*ci].clone()
        };
        let every = match (list.len(), period) {
            (1, _) | (_, None) => format!("once, at {unit} {}", list[0].0),
            (n, Some(p)) => format!("{n} times, every {p} {unit}s"),
        };
        let mut f = Finding::new(FindingKind::TimelineSpike, severity, label.clone());
        f.device = Some(*device);
        f.location = causes.locations[*ci].clone();
        f.stack = Some(m.allocs.at(list[0].1).stack);
        f.bytes = max_size;
        f.count = list.len() as u64;
        f.ts_nanos = Some(m.allocs.ts(list[0].1));
        f.harm_bytes = excess;
        f.headline = format!(
            "spikes {} above the working set at {loc}, {every}",
            fmt_bytes(excess)
        );
        f.message = format!(
            "{every}, an allocation of up to {} at {label} lifts the peak to {}, {} above the steady-state working set of {}",
            fmt_bytes(max_size),
            fmt_bytes(max_peak),
            fmt_bytes(excess),
            fmt_bytes(baseline as u64)
        );
        if let Some(cap) = cap {
            f.evidence.push(format!(
                "the highest spike reaches {:.0} % of the device's {}",
                max_peak as f64 * 100.0 / cap as f64,
                fmt_bytes(cap)
            ));
        }
        if failed_in_spike {
            f.evidence
                .push(format!("an allocation failed during a spiking {unit}"));
        }
        f.fix = format!(
            "split or stream the work that allocates at {loc} (chunk the batch, or compute it in pieces), or free other buffers before it, so the peak stays near the usual {}",
            fmt_bytes(baseline as u64)
        );
        found.push(f);
    }
    let mut labels: HashMap<StackId, String> = HashMap::new();
    spikes
        .iter()
        .take(MAX_EVENTS)
        .map(|&(_, k, _, _, peak)| {
            let x = m.allocs.at(k);
            TimelineSpikeEvent {
                ts_nanos: x.ts_nanos,
                size_bytes: x.size_bytes,
                live_bytes: peak,
                duration_nanos: x.free_ts_nanos.min(end).saturating_sub(x.ts_nanos),
                stack: x.stack,
                site: labels
                    .entry(x.stack)
                    .or_insert_with(|| m.stack_label(x.stack))
                    .clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::TimelineBuilder;
    use proptest::prelude::*;

    proptest! {
        /// The median found over passes through a column is the one selected among its
        /// values, the mean of the middle two for an even count: few and many peaks, a growing
        /// run (a leak's peaks), repeats, and the extremes.
        #[test]
        fn the_median_over_passes_is_the_selected_one(
            values in prop_oneof![
                proptest::collection::vec(any::<u64>(), 1..200),
                proptest::collection::vec(0u64..1 << 34, 1_000..6_000),
                (1u64..1 << 30, 2_000usize..9_000)
                    .prop_map(|(step, n)| (0..n as u64).map(|i| i * step).collect()),
                proptest::collection::vec(
                    prop_oneof![Just(0u64), Just(u64::MAX), Just(1 << 63), 0u64..3],
                    1..5_000
                ),
            ],
            from in 0usize..40,
        ) {
            let mut column = Column::new();
            for &v in &values {
                column.push(v);
            }
            let from = from.min(values.len() - 1);
            let mut rest = values[from..].to_vec();
            let want = quantile_select_u64(&mut rest, 0.5).expect("a value");
            prop_assert_eq!(median_over_passes(&column, from).to_bits(), want.to_bits());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The quartiles of scopes whose sizes stopped being counted, found over passes, are
        /// those selected among each scope's sizes; scopes still counted are left to their
        /// counts. Scopes interleave: sizes that never repeat, sizes that repeat, and a scope
        /// too small to analyse.
        #[test]
        fn uncounted_quartiles_are_the_selected_ones(
            seed in any::<u64>(),
            n in 5_000usize..30_000,
            spread in prop_oneof![Just(1u64 << 26), Just(1u64 << 40), Just(20_000u64)],
        ) {
            let mut x = seed | 1;
            let sizes: Vec<(usize, u64)> = (0..n)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match i % 5 {
                        0..=2 => (0, 1 + x % spread),
                        3 => (1, 512 * (x % 8)),
                        _ => (2 + usize::from(i > 20), x),
                    }
                })
                .collect();
            let mut values = alloc::vec![Counts::default(); 4];
            for &(k, v) in &sizes {
                values[k].push(v);
            }
            let enough = |v: &Counts| v.len() >= 10;
            let mut passes = 0;
            let got = uncounted_quartiles(&values, enough, |see| {
                passes += 1;
                for &(k, v) in &sizes {
                    see(k, v);
                }
            });
            prop_assert!(passes < 16);
            for (k, v) in values.iter().enumerate() {
                let mut all: Vec<u64> =
                    sizes.iter().filter(|s| s.0 == k).map(|s| s.1).collect();
                match got.get(&k) {
                    Some(&(q1, q3)) => {
                        prop_assert!(!v.counted() && enough(v));
                        prop_assert_eq!(Some(q1), quantile_select_u64(&mut all, 0.25));
                        prop_assert_eq!(Some(q3), quantile_select_u64(&mut all, 0.75));
                    }
                    None => prop_assert!(v.counted() || !enough(v)),
                }
            }
        }
    }

    proptest! {
        /// A window the pre-test passes over holds no spike: the working set its median gives
        /// fails the spike test, whatever the ratio (zero and negative ones included).
        #[test]
        fn a_window_passed_over_holds_no_spike(
            window in proptest::collection::vec(0u64..40, 0..9),
            peak in 0u64..90,
            ratio in prop_oneof![Just(1.5), Just(0.5), Just(1.0), Just(0.0), Just(-1.0), 0.25f64..4.0],
            min_excess in 0u64..30,
            scale in prop_oneof![Just(1u64), Just(1u64 << 30)],
        ) {
            let window: Vec<u64> = window.iter().map(|x| x * scale).collect();
            let (p, min_excess) = ((peak * scale) as f64, (min_excess * scale) as f64);
            let spike = quantile_select_u64(&mut window.clone(), 0.5)
                .is_some_and(|local| !(p < local * ratio || p - local < min_excess));
            if !median_may_be_at_most(&window, spike_bound(p, ratio, min_excess)) {
                prop_assert!(!spike);
            }
        }
    }

    proptest! {
        /// The one pass finds every iteration's peak where the searches of each span do: points
        /// that share a time, spans without points, repeated starts, and an end before the
        /// last start.
        #[test]
        fn one_pass_finds_the_peaks_the_searches_do(
            steps in proptest::collection::vec((0u64..4, 0u64..50), 0..400),
            gaps in proptest::collection::vec(0u64..30, 1..60),
            end_cut in 0u64..40,
        ) {
            let mut b = TimelineBuilder::new();
            let mut time = 5;
            for &(dt, v) in &steps {
                time += dt;
                b.push(time, v);
            }
            let t = b.build();
            let starts: Vec<u64> = gaps
                .iter()
                .scan(0, |at, g| {
                    *at += g;
                    Some(*at)
                })
                .collect();
            let end = (time + 3).saturating_sub(end_cut);
            let it = Iterations {
                starts_nanos: crate::report::Starts::with_repeats(&starts),
                ..Iterations::default()
            };
            let mut one_pass = Vec::new();
            iteration_peaks(&t, &it, end, |p| one_pass.push(p));
            let searched: Vec<(u64, u64)> = (0..starts.len())
                .map(|i| {
                    let a = starts[i];
                    let b = starts.get(i + 1).copied().unwrap_or(end).max(a);
                    peak_between(&t, a, b, 0)
                })
                .collect();
            prop_assert_eq!(one_pass, searched);
        }
    }
}
