//! Live bytes per call site over time, for the timeline's stacked areas.
//!
//! [`SiteSeries::build`] turns the allocations a filter admits into one step series per stack,
//! in one sweep through time (the allocations in their order, merged with a queue of the frees
//! still to come), so besides the series it takes memory only for what is live at once. It is
//! built on first use per filter, after the first chart is on screen, never while a trace loads. [`SiteSeries::top_in_window`] ranks the sites by their
//! peak inside the visible window (O(sites · log n), stopping at the first site whose peak over
//! the whole trace cannot beat the ones chosen) and [`stack_columns`] samples the chosen sites
//! once per pixel column, at the moment the column's total was highest, so the stack's top
//! follows the total's maxima and a zoom step stays O(pixels · sites shown · log n).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use analysis_core::format::StackId;
use analysis_core::model::{AllocRecord, Fields, LIVE, TraceModel};
use analysis_core::timeline::{Bucket, Spans, Timeline};

use crate::filter::Filter;

/// One call site's live bytes over time.
#[derive(Clone, Debug)]
pub struct Site {
    pub stack: StackId,
    /// Highest live bytes of this site over the whole trace.
    pub peak_bytes: u64,
    /// Live bytes (allocations of this stack that the filter admits) as a step series.
    pub timeline: Timeline,
}

/// Every call site's live bytes over time, for one filter.
#[derive(Clone, Debug, Default)]
pub struct SiteSeries {
    /// Sorted by `peak_bytes`, largest first (ties: stack id).
    pub sites: Vec<Site>,
    /// The sum of every site, when the model has no series equal to it (see
    /// `TraceData::whole_of`): built here only then.
    pub whole: Option<Timeline>,
}

/// Whether an allocation counts in the sites' series: device memory the filter admits.
fn counts(a: &AllocRecord, f: &Filter) -> bool {
    a.kind.is_device_memory() && a.size_bytes > 0 && f.admits(a)
}

/// A step series being built in one sweep through time: a point per distinct time at which
/// its value changes or an allocation of its own starts or ends, holding the value after every
/// change at that time (the value `Timeline::value_at` gives for that time).
#[derive(Default)]
struct Sweep {
    timeline: Timeline,
    /// The value now, and the time of the changes not yet pushed as a point.
    cur: u64,
    at: Option<u64>,
    peak: u64,
}

impl Sweep {
    /// Applies a change at `t` (times never decrease): the point of an earlier time is pushed
    /// first.
    #[inline]
    fn change(&mut self, t: u64, add: u64, sub: u64) {
        if let Some(at) = self.at
            && at != t
        {
            self.timeline.push(at, self.cur);
        }
        self.at = Some(t);
        self.cur = self.cur.saturating_add(add).saturating_sub(sub);
        self.peak = self.peak.max(self.cur);
    }

    fn finish(mut self) -> (Timeline, u64) {
        if let Some(at) = self.at {
            self.timeline.push(at, self.cur);
        }
        self.timeline.build_index();
        (self.timeline, self.peak)
    }
}

/// Applies the queued frees due at or before `until`, in time order.
fn apply_frees(
    until: u64,
    frees: &mut BinaryHeap<Reverse<(u64, u32, u64)>>,
    sweeps: &mut [Sweep],
    whole: &mut Option<Sweep>,
) {
    while let Some(&Reverse((t, slot, size))) = frees.peek()
        && t <= until
    {
        frees.pop();
        sweeps[slot as usize].change(t, 0, size);
        if let Some(w) = whole {
            w.change(t, 0, size);
        }
    }
}

impl SiteSeries {
    /// Builds every site's series for the allocations `f` admits, and their sum when
    /// `with_whole` (the caller has no timeline equal to it).
    ///
    /// One sweep through the allocations in time order: the frees still to come wait in a
    /// queue ordered by time, so the memory besides the series is bounded by what is live at
    /// once, not by the number of allocations. An allocation is live from its time until its
    /// free (`AllocRecord::live_at`); one freed at or before its own time never is.
    pub fn build(m: &TraceModel, f: &Filter, with_whole: bool) -> Self {
        let mut slot_of: HashMap<StackId, u32> = HashMap::new();
        let mut stacks: Vec<StackId> = Vec::new();
        let mut sweeps: Vec<Sweep> = Vec::new();
        let mut whole = with_whole.then(Sweep::default);
        // (free time, slot, size) of the live allocations whose free is recorded.
        let mut frees: BinaryHeap<Reverse<(u64, u32, u64)>> = BinaryHeap::new();
        let fields = Filter::FIELDS | Fields::KIND | Fields::SIZE | Fields::STACK;
        for a in m.allocs.iter_fields(fields | Fields::TS | Fields::FREE) {
            if !counts(&a, f) {
                continue;
            }
            let t = a.ts_nanos;
            apply_frees(t, &mut frees, &mut sweeps, &mut whole);
            let slot = *slot_of.entry(a.stack).or_insert_with(|| {
                stacks.push(a.stack);
                sweeps.push(Sweep::default());
                (stacks.len() - 1) as u32
            });
            let live = a.free_ts_nanos > t;
            let size = if live { a.size_bytes } else { 0 };
            sweeps[slot as usize].change(t, size, 0);
            if let Some(w) = &mut whole {
                w.change(t, size, 0);
            }
            if live && a.free_ts_nanos != LIVE {
                frees.push(Reverse((a.free_ts_nanos, slot, size)));
            }
        }
        apply_frees(u64::MAX, &mut frees, &mut sweeps, &mut whole);
        drop(frees);
        let mut sites: Vec<Site> = stacks
            .into_iter()
            .zip(sweeps)
            .map(|(stack, sweep)| {
                let (timeline, peak_bytes) = sweep.finish();
                Site {
                    stack,
                    peak_bytes,
                    timeline,
                }
            })
            .collect();
        sites.sort_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then(a.stack.cmp(&b.stack)));
        let whole = whole.map(|w| w.finish().0);
        Self { sites, whole }
    }

    /// The site of `stack`, if it has admitted allocations.
    pub fn site(&self, stack: StackId) -> Option<&Site> {
        self.sites.iter().find(|s| s.stack == stack)
    }

    /// Up to `k` sites with the highest live bytes inside `[t0, t1)`, highest first (sites
    /// with nothing live there are left out), among `allowed` (sorted) when given; `include`,
    /// when it has bytes live there, is added if it is not among them.
    pub fn top_in_window(
        &self,
        t0: u64,
        t1: u64,
        k: usize,
        include: Option<StackId>,
        allowed: Option<&[StackId]>,
    ) -> Vec<&Site> {
        let mut best: Vec<(u64, &Site)> = Vec::with_capacity(k + 1);
        for s in &self.sites {
            if allowed.is_some_and(|a| a.binary_search(&s.stack).is_err()) {
                continue;
            }
            // Sites are sorted by their peak over the whole trace: none after this one can
            // reach the k-th best.
            if best.len() == k && best.last().is_some_and(|(p, _)| s.peak_bytes <= *p) {
                break;
            }
            let p = window_peak(&s.timeline, t0, t1);
            if p == 0 {
                continue;
            }
            let at = best.partition_point(|(q, _)| *q >= p);
            if at < k {
                best.insert(at, (p, s));
                best.truncate(k);
            }
        }
        let mut out: Vec<&Site> = best.into_iter().map(|(_, s)| s).collect();
        if let Some(stack) = include
            && !out.iter().any(|s| s.stack == stack)
            && let Some(s) = self.site(stack)
            && window_peak(&s.timeline, t0, t1) > 0
        {
            out.push(s);
        }
        out
    }
}

/// The highest value `t` holds during `[t0, t1)`.
pub fn window_peak(t: &Timeline, t0: u64, t1: u64) -> u64 {
    let at_start = t.value_at(t0);
    let i = t.partition_point(|x| x <= t0);
    let j = t.partition_point(|x| x < t1);
    t.range_min_max(i, j)
        .map_or(at_start, |(_, hi)| hi.max(at_start))
}

/// The stacked areas of one chart: per pixel column, the moment sampled and the bytes of each
/// band then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackColumns {
    /// Bands per column: the sites, then "other" (the rest of the whole).
    pub bands: usize,
    /// Per column, the moment sampled: when the whole was highest in the column.
    pub sample_nanos: Vec<u64>,
    /// Per column, the whole's value then.
    pub whole_bytes: Vec<u64>,
    /// Per column, `bands` values: each site's live bytes at the sample, then "other".
    pub bytes: Vec<u64>,
}

impl StackColumns {
    pub fn columns(&self) -> usize {
        self.sample_nanos.len()
    }

    /// The bytes of each band in column `c`, sites first, "other" last.
    pub fn column(&self, c: usize) -> &[u64] {
        &self.bytes[c * self.bands..(c + 1) * self.bands]
    }

    /// The band whose stacked extent holds `bytes` in column `c`, and that band's bytes:
    /// `Some(i)` for a site or "other" (`bands - 1`); `None` above the stack or outside.
    pub fn band_at(&self, c: usize, bytes: u64) -> Option<(usize, u64)> {
        if c >= self.columns() {
            return None;
        }
        let mut top = 0u64;
        for (i, &b) in self.column(c).iter().enumerate() {
            let below = top;
            top = top.saturating_add(b);
            if b > 0 && bytes >= below && bytes < top {
                return Some((i, b));
            }
        }
        None
    }
}

/// The number of `times` at or before `t`, knowing it is at least `from` (the answer for an
/// earlier `t`): a search that gallops from `from`, so a forward walk costs the log of each step.
fn points_until(tl: &Timeline, from: usize, t: u64) -> usize {
    tl.partition_point_from(from, |x| x <= t)
}

/// Samples `sites` (bottom band first) and `whole` over `[t0, t1)` in `columns` columns of
/// equal time width, each at the moment its `whole` was highest; "other" is the whole minus
/// the sites then.
pub fn stack_columns(
    whole: &Timeline,
    sites: &[&Timeline],
    t0: u64,
    t1: u64,
    columns: usize,
) -> StackColumns {
    stack_columns_with(whole, None, sites, t0, t1, columns)
}

/// [`stack_columns`], given `whole` already downsampled over the same columns
/// ([`Timeline::downsample_spans`], as a chart layer draws it): each column's points and
/// highest value are then taken from there rather than searched again.
pub fn stack_columns_with(
    whole: &Timeline,
    downsampled: Option<(&[Bucket], &Spans)>,
    sites: &[&Timeline],
    t0: u64,
    t1: u64,
    columns: usize,
) -> StackColumns {
    let bands = sites.len() + 1;
    let mut out = StackColumns {
        bands,
        sample_nanos: Vec::with_capacity(columns),
        whole_bytes: Vec::with_capacity(columns),
        bytes: Vec::with_capacity(columns * bands),
    };
    if t1 <= t0 || columns == 0 {
        return out;
    }
    let downsampled = downsampled.filter(|(b, s)| b.len() == columns && s.ends.len() == columns);
    let span = t1 - t0;
    let edge = |c: usize| t0 + ((u128::from(span) * c as u128) / columns as u128) as u64;
    let mut ia = whole.partition_point(|x| x < t0);
    for c in 0..columns {
        let (a, b) = (edge(c), edge(c + 1));
        let carried = if ia == 0 { 0 } else { whole.value(ia - 1) };
        // The column's points `[ia, ib)` and their highest value where it beats the value
        // carried in.
        let (ib, top) = match downsampled {
            Some((buckets, spans)) => {
                let (_, ib) = spans.of(c);
                // The bucket's max counts the value carried in: above it, a point reached it.
                (ib, (buckets[c].max > carried).then_some(buckets[c].max))
            }
            None => {
                // The first point at or after `b` (those before are at or before b - 1).
                let ib = b
                    .checked_sub(1)
                    .map_or(ia, |last| points_until(whole, ia, last));
                let top = whole
                    .range_min_max(ia, ib)
                    .map(|(_, hi)| hi)
                    .filter(|&hi| hi > carried);
                (ib, top)
            }
        };
        // The sample, and a point index at or before the last point at or before it.
        let sample = match top {
            Some(hi) => whole.time(whole.first_at_least(ia, ib, hi).unwrap_or(ia)),
            // The value carried into the column is its highest: sample just before it starts.
            None if ia > 0 => a - 1,
            None => a,
        };
        out.sample_nanos.push(sample);
        ia = ib;
    }
    // The whole, then each site in turn, at every sample: its positions first (samples only
    // move forward), each found with reads that do not wait on the one before, then its
    // values, likewise.
    let mut until = vec![0usize; columns];
    whole.points_until_each(&out.sample_nanos, &mut until);
    out.whole_bytes.extend(
        until
            .iter()
            .map(|&u| u.checked_sub(1).map_or(0, |i| whole.value(i))),
    );
    out.bytes.resize(columns * bands, 0);
    for (k, s) in sites.iter().enumerate() {
        s.points_until_each(&out.sample_nanos, &mut until);
        for (c, &u) in until.iter().enumerate() {
            out.bytes[c * bands + k] = if u == 0 { 0 } else { s.value(u - 1) };
        }
    }
    for c in 0..columns {
        let sum = out.bytes[c * bands..c * bands + bands - 1]
            .iter()
            .fold(0u64, |a, &v| a.saturating_add(v));
        out.bytes[c * bands + bands - 1] = out.whole_bytes[c].saturating_sub(sum);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    fn model(s: Scenario, events: u64) -> analysis_core::model::LoadedTrace {
        let (bytes, _) = generate(s, events, 11);
        analysis_core::load(&bytes).expect("synthetic trace loads")
    }

    /// Every site's series equals its allocations' live bytes at any moment, and together
    /// they equal the model's total.
    #[test]
    fn sites_add_up_to_the_total_at_every_moment() {
        for s in Scenario::ALL {
            let t = model(s, 4_000);
            let m = &t.model;
            let series = SiteSeries::build(m, &Filter::default(), true);
            let whole = series.whole.as_ref().expect("asked for");
            let (lo, hi) = (m.first_ts_nanos, m.last_ts_nanos);
            for k in 0..=50u64 {
                let at = lo + (hi - lo) * k / 50;
                let sum: u64 = series.sites.iter().map(|s| s.timeline.value_at(at)).sum();
                assert_eq!(sum, whole.value_at(at), "{} at {at}", s.name());
                assert_eq!(sum, m.total.value_at(at), "{}: the model's total", s.name());
                let site = &series.sites[(k as usize) % series.sites.len()];
                let live: u64 = m
                    .allocs
                    .iter()
                    .filter(|a| a.stack == site.stack && a.kind.is_device_memory())
                    .filter(|a| a.live_at(at))
                    .map(|a| a.size_bytes)
                    .sum();
                assert_eq!(site.timeline.value_at(at), live, "{}", s.name());
            }
            assert!(
                series
                    .sites
                    .windows(2)
                    .all(|w| w[0].peak_bytes >= w[1].peak_bytes)
            );
        }
    }

    /// Each site's points are exactly one per time at which one of its allocations starts or
    /// ends, holding the live bytes then: the series sorted out per site, as a plain reference.
    #[test]
    fn each_site_has_a_point_per_time_of_its_own_events() {
        for s in Scenario::ALL {
            let t = model(s, 3_000);
            let m = &t.model;
            let f = Filter::default();
            let series = SiteSeries::build(m, &f, true);
            let mut by_stack: HashMap<StackId, Vec<(u64, i128)>> = HashMap::new();
            let mut all: Vec<(u64, i128)> = Vec::new();
            for a in m.allocs.iter().filter(|a| counts(a, &f)) {
                let e = by_stack.entry(a.stack).or_default();
                let live = a.free_ts_nanos > a.ts_nanos;
                let size = if live { i128::from(a.size_bytes) } else { 0 };
                e.push((a.ts_nanos, size));
                all.push((a.ts_nanos, size));
                if live && a.free_ts_nanos != LIVE {
                    e.push((a.free_ts_nanos, -size));
                    all.push((a.free_ts_nanos, -size));
                }
            }
            let reference = |mut ev: Vec<(u64, i128)>| {
                ev.sort_by_key(|e| e.0);
                let mut out: Vec<(u64, u64)> = Vec::new();
                let mut cur = 0i128;
                for (t, d) in ev {
                    cur += d;
                    match out.last_mut() {
                        Some(p) if p.0 == t => p.1 = cur as u64,
                        _ => out.push((t, cur as u64)),
                    }
                }
                out
            };
            assert_eq!(series.sites.len(), by_stack.len(), "{}", s.name());
            for site in &series.sites {
                let want = reference(by_stack.remove(&site.stack).expect("a site of its own"));
                let got: Vec<(u64, u64)> = site.timeline.points().collect();
                assert_eq!(got, want, "{}: stack {:?}", s.name(), site.stack);
                let peak = want.iter().map(|p| p.1).max().unwrap_or(0);
                assert_eq!(site.peak_bytes, peak);
            }
            let whole = series.whole.expect("asked for");
            assert_eq!(whole.points().collect::<Vec<_>>(), reference(all));
        }
    }

    #[test]
    fn a_filter_keeps_only_its_allocations() {
        let t = model(Scenario::MultiDevice, 4_000);
        let m = &t.model;
        let dev = m.series[0].key.device;
        let f = Filter {
            device: Some(dev),
            ..Filter::default()
        };
        let series = SiteSeries::build(m, &f, true);
        let whole = series.whole.expect("asked for");
        let end = m.last_ts_nanos;
        let want: u64 = m
            .series
            .iter()
            .filter(|s| !s.key.host && s.key.device == dev)
            .map(|s| s.timeline.value_at(end))
            .sum();
        assert_eq!(whole.value_at(end), want);
    }

    #[test]
    fn the_top_of_a_window_is_ranked_by_the_windows_peak() {
        let t = model(Scenario::Spikes, 6_000);
        let m = &t.model;
        let series = SiteSeries::build(m, &Filter::default(), false);
        let (lo, hi) = (m.first_ts_nanos, m.last_ts_nanos);
        for (t0, t1) in [(lo, hi + 1), (lo + (hi - lo) / 3, lo + (hi - lo) / 2)] {
            let top = series.top_in_window(t0, t1, 4, None, None);
            // The same ranking by brute force over every site.
            let mut all: Vec<(u64, StackId)> = series
                .sites
                .iter()
                .map(|s| (window_peak(&s.timeline, t0, t1), s.stack))
                .filter(|(p, _)| *p > 0)
                .collect();
            all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let peaks: Vec<u64> = top
                .iter()
                .map(|s| window_peak(&s.timeline, t0, t1))
                .collect();
            let want: Vec<u64> = all.iter().take(4).map(|x| x.0).collect();
            assert_eq!(peaks, want);
        }
        // A site asked for joins the top when it is not in it.
        let last = series.sites.last().expect("sites").stack;
        let top = series.top_in_window(lo, hi + 1, 2, Some(last), None);
        assert_eq!(top.len(), 3);
        assert_eq!(top[2].stack, last);
        // Only the sites allowed.
        let only = [series.sites[1].stack];
        let top = series.top_in_window(lo, hi + 1, 4, None, Some(&only));
        assert_eq!(top.iter().map(|s| s.stack).collect::<Vec<_>>(), only);
    }

    #[test]
    fn window_peak_counts_the_value_carried_in() {
        let mut t = Timeline::new();
        t.push(10, 5);
        t.push(20, 9);
        t.push(30, 1);
        t.build_index();
        assert_eq!(window_peak(&t, 0, 10), 0);
        assert_eq!(window_peak(&t, 12, 18), 5);
        assert_eq!(window_peak(&t, 12, 21), 9);
        assert_eq!(window_peak(&t, 20, 21), 9);
        assert_eq!(window_peak(&t, 31, 40), 1);
    }

    #[test]
    fn columns_sample_each_columns_highest_moment() {
        // Two sites that take turns: a stack of their maxima would be twice the total.
        let mut a = Timeline::new();
        let mut b = Timeline::new();
        let mut whole = Timeline::new();
        for k in 0..100u64 {
            let t = k * 10;
            let (va, vb) = if k % 2 == 0 { (100, 0) } else { (0, 60) };
            a.push(t, va);
            b.push(t, vb);
            whole.push(t, va + vb + 7);
        }
        for x in [&mut a, &mut b, &mut whole] {
            x.build_index();
        }
        let cols = stack_columns(&whole, &[&a, &b], 0, 1000, 10);
        assert_eq!(cols.columns(), 10);
        for c in 0..10 {
            // Each column holds both phases; its highest moment is site a's.
            assert_eq!(cols.column(c), &[100, 0, 7], "column {c}");
            assert_eq!(cols.whole_bytes[c], 107);
            assert_eq!(cols.sample_nanos[c] % 20, 0);
        }
        assert_eq!(cols.band_at(3, 50), Some((0, 100)));
        assert_eq!(cols.band_at(3, 103), Some((2, 7)));
        assert_eq!(cols.band_at(3, 107), None, "above the stack");
        assert_eq!(cols.band_at(10, 1), None, "outside");
        // A column with no point of its own carries the value before it.
        let fine = stack_columns(&whole, &[&a, &b], 0, 1000, 1000);
        assert_eq!(fine.column(15), &[0, 60, 7]);
        assert_eq!(fine.column(21), &[100, 0, 7]);
    }

    #[test]
    fn columns_equal_a_plain_search_at_any_width() {
        // Points from time 0, windows narrower than their columns (empty columns) and wider.
        let mut a = Timeline::new();
        let mut whole = Timeline::new();
        for k in 0..2_000u64 {
            let t = k / 2;
            a.push(t, (k * 37) % 50);
            whole.push(t, (k * 37) % 50 + (k * 11) % 30);
        }
        a.build_index();
        whole.build_index();
        for (t0, t1, columns) in [(0, 5, 20), (0, 1_000, 7), (3, 900, 1_150), (0, 2, 1_150)] {
            let cols = stack_columns(&whole, &[&a], t0, t1, columns);
            // Given the whole downsampled over the same columns, the same samples.
            let (buckets, spans) = whole.downsample_spans(t0, t1, columns);
            let with = stack_columns_with(&whole, Some((&buckets, &spans)), &[&a], t0, t1, columns);
            assert_eq!(
                with.sample_nanos, cols.sample_nanos,
                "[{t0}, {t1}) / {columns}"
            );
            assert_eq!(with.bytes, cols.bytes, "[{t0}, {t1}) / {columns}");
            let (times, values): (Vec<u64>, Vec<u64>) = whole.points().unzip();
            for c in 0..columns {
                let edge = |c: usize| t0 + (t1 - t0) * c as u64 / columns as u64;
                let (lo, hi) = (edge(c), edge(c + 1));
                let ia = times.partition_point(|&x| x < lo);
                let ib = times.partition_point(|&x| x < hi);
                let carried = if ia == 0 { 0 } else { values[ia - 1] };
                let max = values[ia..ib].iter().copied().max();
                let sample = match max {
                    Some(m) if m > carried => {
                        times[ia + values[ia..ib].iter().position(|&v| v == m).unwrap_or(0)]
                    }
                    _ if ia > 0 => lo - 1,
                    _ => lo,
                };
                assert_eq!(
                    cols.sample_nanos[c], sample,
                    "[{t0}, {t1}) / {columns}, column {c}"
                );
                assert_eq!(cols.column(c)[0], a.value_at(sample));
            }
        }
    }

    #[test]
    fn a_forward_search_finds_what_a_binary_search_finds() {
        // Times with repeats, searched for increasing moments from each earlier answer.
        let times: Vec<u64> = (0..5_000u64).map(|k| k / 3 * 7).collect();
        let timeline = |times: &[u64]| {
            let mut tl = Timeline::new();
            for &t in times {
                tl.push(t, 1);
            }
            tl
        };
        let tl = timeline(&times);
        let mut from = 0;
        for t in (0..12_000u64).step_by(13).chain([11_662, 11_663, 20_000]) {
            let want = times.partition_point(|&x| x <= t);
            from = points_until(&tl, from, t);
            assert_eq!(from, want, "t = {t}");
        }
        assert_eq!(points_until(&timeline(&[]), 0, 5), 0);
        assert_eq!(points_until(&timeline(&[1, 2, 3]), 3, 9), 3);
    }
}
