//! What the search for a recurring call site reads of each stack's allocations: how many, the
//! first and last times, the median gap between consecutive ones, how many gaps are within a
//! factor of two of it and how many allocations are freed within two of it.
//!
//! In a history whose allocation times never step back, each stack's gaps are met in order, so
//! they are taken as they come, over passes through the history, and the memory held is
//! bounded by the call sites, not the allocations: a stack keeps its first [`FEW`] gaps, then
//! counts the gaps in [`WINDOW`] buckets over their range (a loop's gaps keep to it); each
//! further pass collects the gaps of the bucket that holds the median and selects it exactly,
//! where they are few enough ([`cap`]), or counts them in [`BUCKETS`] narrower buckets
//! ([`GapMedian`]).
//! A damaged history (a time stepping back) has its times sorted per stack instead, which
//! holds 8 bytes per allocation for the length of the search.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::format::{ProcessIdx, StackId};
use crate::model::{AllocRecord, Fields, TraceModel};

/// Gaps a stack keeps as they are before it counts them in a window around them.
const FEW: usize = 64;
/// Counters of that window.
const WINDOW: u32 = 512;
/// Counters of a further pass that narrows down on a median.
const BUCKETS: u32 = 1024;
/// Gaps around a median few enough to collect and select from, at least.
const CAP: u64 = 4096;
/// Gaps the open medians collect at most, all together, where that allows more than [`CAP`]
/// each (8 MiB): fewer passes when few stacks recur thousands of times.
const COLLECT: u64 = 1 << 20;

/// Gaps each of `open` medians may collect.
fn cap(open: usize) -> u64 {
    (COLLECT / open.max(1) as u64).clamp(CAP, COLLECT)
}

/// One stack's allocations, as the choice of a recurring site reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Site {
    /// Allocations.
    pub count: usize,
    pub first: u64,
    pub last: u64,
    /// The median gap between consecutive allocation times (the upper one of an even count;
    /// 0 without gaps).
    pub med: u64,
    /// Gaps within a factor of two of `med`.
    pub steady: usize,
    /// Allocations freed within two median gaps.
    pub transient: usize,
}

impl Site {
    /// Gaps between consecutive allocations.
    pub fn gaps(&self) -> usize {
        self.count.saturating_sub(1)
    }

    fn is_steady(&self, gap: u64) -> bool {
        gap >= self.med / 2 && gap <= self.med.saturating_mul(2)
    }

    fn is_transient(&self, a: &AllocRecord) -> bool {
        a.free_ts_nanos.saturating_sub(a.ts_nanos) <= self.med.saturating_mul(2)
    }
}

/// The fields the search reads: those of its filter, the time, and the free time once the
/// median is known.
pub(super) const FIELDS: Fields = Fields::PROCESS
    .and(Fields::SIZE)
    .and(Fields::KIND)
    .and(Fields::STACK)
    .and(Fields::TS);

/// Whether an allocation counts for the search: of the process (when one is selected), of
/// some bytes, tracked, and with a stack.
pub(super) fn kept(sel: Option<ProcessIdx>, a: &AllocRecord) -> bool {
    sel.is_none_or(|p| a.process == p) && a.size_bytes > 0 && a.kind.is_tracked() && a.stack.0 != 0
}

/// Every stack's [`Site`] among the allocations of `sel` (or of the whole trace).
pub(super) fn sites(m: &TraceModel, sel: Option<ProcessIdx>) -> HashMap<StackId, Site> {
    streamed(m, sel).unwrap_or_else(|| sorted(m, sel))
}

/// A stack's state in [`streamed`].
struct Stream {
    site: Site,
    /// Its previous allocation's time.
    prev: Option<u64>,
    median: GapMedian,
}

/// Open medians looked up by a scan below this many, by a map from this many.
const SCAN: usize = 4;

/// [`sites`] over passes through a history whose allocation times never step back within a
/// stack; `None` when they do.
fn streamed(m: &TraceModel, sel: Option<ProcessIdx>) -> Option<HashMap<StackId, Site>> {
    let mut stacks: HashMap<StackId, Stream> = HashMap::new();
    for a in m.allocs.iter_fields(FIELDS).filter(|a| kept(sel, a)) {
        let s = stacks.entry(a.stack).or_insert_with(|| Stream {
            site: Site {
                first: a.ts_nanos,
                ..Site::default()
            },
            prev: None,
            median: GapMedian::new(),
        });
        if let Some(p) = s.prev {
            s.median.see(a.ts_nanos.checked_sub(p)?);
        }
        s.prev = Some(a.ts_nanos);
        s.site.count += 1;
        s.site.last = a.ts_nanos;
    }
    // (stack, median, previous time in the pass) of each median still open.
    let mut open: Vec<(StackId, GapMedian, Option<u64>)> = Vec::new();
    let counting = stacks
        .values()
        .filter(|s| matches!(s.median, GapMedian::Window { .. }))
        .count();
    for (&stack, s) in &mut stacks {
        s.median.end_pass(cap(counting));
        s.prev = None;
        match s.median.found() {
            Some(med) => s.site.med = med,
            None => open.push((
                stack,
                core::mem::replace(&mut s.median, GapMedian::Found(0)),
                None,
            )),
        }
    }
    // Further passes through the same gaps in the same order, following the open stacks alone.
    while !open.is_empty() {
        let index: HashMap<StackId, usize> = if open.len() < SCAN {
            HashMap::new()
        } else {
            open.iter().enumerate().map(|(i, o)| (o.0, i)).collect()
        };
        for a in m.allocs.iter_fields(FIELDS).filter(|a| kept(sel, a)) {
            let i = if open.len() < SCAN {
                open.iter().position(|o| o.0 == a.stack)
            } else {
                index.get(&a.stack).copied()
            };
            if let Some((_, median, prev)) = i.and_then(|i| open.get_mut(i)) {
                if let Some(p) = *prev {
                    median.see(a.ts_nanos.saturating_sub(p));
                }
                *prev = Some(a.ts_nanos);
            }
        }
        let cap = cap(open.len());
        open.retain_mut(|(stack, median, prev)| {
            median.end_pass(cap);
            *prev = None;
            let found = median.found();
            if let (Some(med), Some(s)) = (found, stacks.get_mut(stack)) {
                s.site.med = med;
            }
            found.is_none()
        });
    }
    // The steady gaps and the transient allocations, once each median is known.
    for a in m
        .allocs
        .iter_fields(FIELDS | Fields::FREE)
        .filter(|a| kept(sel, a))
    {
        if let Some(s) = stacks.get_mut(&a.stack) {
            if let Some(p) = s.prev.replace(a.ts_nanos)
                && s.site.is_steady(a.ts_nanos.saturating_sub(p))
            {
                s.site.steady += 1;
            }
            if s.site.is_transient(&a) {
                s.site.transient += 1;
            }
        }
    }
    Some(stacks.into_iter().map(|(k, s)| (k, s.site)).collect())
}

/// [`sites`] of a history whose times may step back: each stack's times kept (8 bytes per
/// allocation), sorted, and turned into gaps.
fn sorted(m: &TraceModel, sel: Option<ProcessIdx>) -> HashMap<StackId, Site> {
    // The allocations of each stack counted first, so its times take a vector of exactly that
    // size, turned into gaps in place (their order does not matter).
    let mut counts: HashMap<StackId, usize> = HashMap::new();
    for a in m.allocs.iter_fields(FIELDS).filter(|a| kept(sel, a)) {
        *counts.entry(a.stack).or_default() += 1;
    }
    let mut times: HashMap<StackId, Vec<u64>> = counts
        .into_iter()
        .map(|(stack, count)| (stack, Vec::with_capacity(count)))
        .collect();
    for a in m.allocs.iter_fields(FIELDS).filter(|a| kept(sel, a)) {
        if let Some(t) = times.get_mut(&a.stack) {
            t.push(a.ts_nanos);
        }
    }
    let mut sites: HashMap<StackId, Site> = times
        .into_iter()
        .map(|(stack, mut t)| {
            t.sort_unstable();
            let mut s = Site {
                count: t.len(),
                first: t.first().copied().unwrap_or(0),
                last: t.last().copied().unwrap_or(0),
                ..Site::default()
            };
            for k in 1..t.len() {
                t[k - 1] = t[k] - t[k - 1];
            }
            t.pop();
            s.med = upper_median(&mut t);
            s.steady = t.iter().filter(|&&g| s.is_steady(g)).count();
            (stack, s)
        })
        .collect();
    for a in m
        .allocs
        .iter_fields(FIELDS | Fields::FREE)
        .filter(|a| kept(sel, a))
    {
        if let Some(s) = sites.get_mut(&a.stack)
            && s.is_transient(&a)
        {
            s.transient += 1;
        }
    }
    sites
}

/// The value at index `len / 2` once sorted (reordering `values`), 0 for none.
pub(super) fn upper_median(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mid = values.len() / 2;
    *values.select_nth_unstable(mid).1
}

/// Bits of `v` up to its highest set one (0 for 0).
fn bit_length(v: u64) -> u32 {
    u64::BITS - v.leading_zeros()
}

/// The exact [`upper_median`] of a sequence of values seen again, in the same order, on each
/// pass ([`Self::see`] each, then [`Self::end_pass`]), holding at most [`FEW`] values,
/// [`WINDOW`] or [`BUCKETS`] counters, or the values a pass's end allows it to collect.
#[derive(Debug)]
enum GapMedian {
    /// Every value so far, while at most [`FEW`].
    Few(Vec<u64>),
    /// Counts per bucket of `1 << shift` values from `lo` up to `hi`, a window over the range
    /// of the first values, and of the values below and above it.
    Window {
        lo: u64,
        hi: u64,
        shift: u32,
        below: u64,
        above: u64,
        counts: Box<[u64]>,
    },
    /// The median lies in `[lo, hi]`, the `rank`-th (from 0) of the values there: counts per
    /// bucket of `1 << shift` values from `lo`.
    Buckets {
        lo: u64,
        hi: u64,
        shift: u32,
        rank: u64,
        counts: Vec<u64>,
    },
    /// The values in `[lo, hi]`, among which the median is the `rank`-th.
    Collect {
        lo: u64,
        hi: u64,
        rank: u64,
        values: Vec<u64>,
    },
    Found(u64),
}

impl GapMedian {
    fn new() -> Self {
        Self::Few(Vec::new())
    }

    fn found(&self) -> Option<u64> {
        match self {
            Self::Found(v) => Some(*v),
            _ => None,
        }
    }

    #[inline(always)]
    fn see(&mut self, v: u64) {
        match self {
            Self::Few(vs) => {
                vs.push(v);
                if vs.len() > FEW {
                    *self = Self::window(vs);
                }
            }
            Self::Window {
                lo,
                hi,
                shift,
                below,
                above,
                counts,
            } => {
                if v < *lo {
                    *below += 1;
                } else if v > *hi {
                    *above += 1;
                } else {
                    counts[((v - *lo) >> *shift) as usize] += 1;
                }
            }
            Self::Buckets {
                lo,
                hi,
                shift,
                counts,
                ..
            } => {
                if (*lo..=*hi).contains(&v) {
                    counts[((v - *lo) >> *shift) as usize] += 1;
                }
            }
            Self::Collect { lo, hi, values, .. } => {
                if (*lo..=*hi).contains(&v) {
                    values.push(v);
                }
            }
            Self::Found(_) => {}
        }
    }

    /// The [`Self::Window`] of `values`: their range, widened by half of it, a quarter on each
    /// side, so that values drifting a little stay inside.
    #[cold]
    fn window(values: &[u64]) -> Self {
        let (min, max) = values
            .iter()
            .fold((u64::MAX, 0), |(a, b), &v| (a.min(v), b.max(v)));
        let margin = max.saturating_sub(min) / 4;
        let (lo, hi) = (min.saturating_sub(margin), max.saturating_add(margin));
        let shift = bit_length(hi - lo).saturating_sub(WINDOW.trailing_zeros());
        let mut w = Self::Window {
            lo,
            hi,
            shift,
            below: 0,
            above: 0,
            counts: vec![0; ((hi - lo) >> shift) as usize + 1].into_boxed_slice(),
        };
        for &v in values {
            w.see(v);
        }
        w
    }

    /// Ends a pass: the median found, or the range a next pass narrows down on.
    fn end_pass(&mut self, cap: u64) {
        let next = match self {
            Self::Few(vs) => Self::Found(upper_median(vs)),
            Self::Window {
                lo,
                hi,
                shift,
                below,
                above,
                counts,
            } => {
                let inside: u64 = counts.iter().sum();
                let rank = (*below + inside + *above) / 2;
                if rank < *below {
                    Self::narrow(cap, 0, *lo - 1, rank, *below)
                } else if rank - *below < inside {
                    let (b, rank, n) = bucket_of(counts.iter().copied(), rank - *below);
                    let from = *lo + ((b as u64) << *shift);
                    let to = from.saturating_add((1u64 << *shift) - 1).min(*hi);
                    Self::narrow(cap, from, to, rank, n)
                } else {
                    Self::narrow(cap, *hi + 1, u64::MAX, rank - *below - inside, *above)
                }
            }
            Self::Buckets {
                lo,
                hi,
                shift,
                rank,
                counts,
            } => {
                let (b, rank, n) = bucket_of(counts.iter().copied(), *rank);
                let from = *lo + ((b as u64) << *shift);
                let to = from.saturating_add((1u64 << *shift) - 1).min(*hi);
                Self::narrow(cap, from, to, rank, n)
            }
            Self::Collect { rank, values, .. } => match values.get(*rank as usize) {
                Some(_) => Self::Found(*values.select_nth_unstable(*rank as usize).1),
                // Fewer values than the passes before counted: not the same sequence.
                None => Self::Found(0),
            },
            Self::Found(v) => Self::Found(*v),
        };
        *self = next;
    }

    /// The state for a median known to be the `rank`-th of the `n` values in `[lo, hi]`: those
    /// values collected where at most `cap`, else counted in narrower buckets.
    fn narrow(cap: u64, lo: u64, hi: u64, rank: u64, n: u64) -> Self {
        if lo >= hi {
            return Self::Found(lo);
        }
        if n <= cap {
            return Self::Collect {
                lo,
                hi,
                rank,
                values: Vec::with_capacity(n as usize),
            };
        }
        let shift = bit_length(hi - lo).saturating_sub(BUCKETS.trailing_zeros());
        Self::Buckets {
            lo,
            hi,
            shift,
            rank,
            counts: vec![0; ((hi - lo) >> shift) as usize + 1],
        }
    }
}

/// The bucket that holds the `rank`-th value (from 0) of `counts`, the rank within it and
/// its count; the last bucket when there are fewer values.
fn bucket_of(counts: impl Iterator<Item = u64>, rank: u64) -> (usize, u64, u64) {
    let mut before = 0u64;
    let mut last = (0, 0, 0);
    for (i, n) in counts.enumerate() {
        if n == 0 {
            continue;
        }
        if rank < before + n {
            return (i, rank - before, n);
        }
        last = (i, n - 1, n);
        before += n;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Scenario, generate};
    use proptest::prelude::*;

    /// Runs the passes of a [`GapMedian`] over `values` to the end, checking what it holds.
    fn passes(values: &[u64], cap: u64) -> (u64, usize) {
        let mut m = GapMedian::new();
        let mut n = 0;
        loop {
            for &v in values {
                m.see(v);
                match &m {
                    GapMedian::Few(v) => assert!(v.len() <= FEW),
                    GapMedian::Buckets { counts, .. } => assert!(counts.len() <= BUCKETS as usize),
                    GapMedian::Collect { values, .. } => assert!(values.len() <= cap as usize),
                    GapMedian::Window { counts, .. } => assert!(counts.len() <= WINDOW as usize),
                    GapMedian::Found(_) => {}
                }
            }
            m.end_pass(cap);
            n += 1;
            if let Some(v) = m.found() {
                return (v, n);
            }
            assert!(n < 16, "no median after {n} passes");
        }
    }

    fn gaps() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            // Few, or many of anything.
            proptest::collection::vec(any::<u64>(), 0..200),
            proptest::collection::vec(any::<u64>(), 5_000..12_000),
            // A period with jitter, as a loop's gaps in nanoseconds.
            (1u64..1 << 40, 0u64..1 << 20, 4_000usize..20_000)
                .prop_flat_map(|(p, j, n)| { proptest::collection::vec(p..p + j + 1, n) }),
            // A few values repeated, the extremes among them.
            proptest::collection::vec(
                prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(1 << 63), 0u64..4],
                5_000..9_000
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The median found over passes is the one of all the values sorted.
        #[test]
        fn the_median_over_passes_is_the_sorted_median(values in gaps()) {
            let (got, _) = passes(&values, CAP);
            let mut all = values.clone();
            prop_assert_eq!(got, upper_median(&mut all));
        }
    }

    #[test]
    fn a_jittered_period_takes_few_passes() {
        // 200,000 gaps of 100 ms give or take 3 ms, in nanoseconds.
        let mut x = 7u64;
        let values: Vec<u64> = (0..200_000)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                100_000_000 - 3_000_000 + (x >> 33) % 6_000_000
            })
            .collect();
        let (got, n) = passes(&values, cap(1));
        let mut all = values.clone();
        assert_eq!(got, upper_median(&mut all));
        assert!(n <= 2, "{n} passes");
    }

    /// The sites taken as they come are those of the times sorted, on every scenario, for
    /// the whole trace and for each process.
    #[test]
    fn streamed_sites_equal_sorted_ones() {
        let mut many = 0;
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 40_000, 3);
            let t = crate::model::load(&bytes).expect("loads");
            let m = &t.model;
            let processes = m.processes.iter().map(|p| Some(p.process));
            for sel in core::iter::once(None).chain(processes) {
                let got = streamed(m, sel).expect("synthetic times never step back");
                assert_eq!(got, sorted(m, sel), "{s:?} {sel:?}");
                many += got.values().filter(|s| s.gaps() as u64 > CAP).count();
            }
        }
        // Medians narrowed down over passes, not only collected.
        assert!(many > 0);
    }

    /// A history whose times step back has its sites from the times sorted.
    #[test]
    fn a_time_stepping_back_sorts_the_times() {
        use crate::format::{Alloc, AllocId, AllocKind, Header, Record};
        let mut m = TraceModel::new(Header::default());
        for (i, ts) in [100u64, 40, 250, 260, 270, 300, 20].into_iter().enumerate() {
            m.observe(
                Record::Alloc(Alloc {
                    ts_nanos: ts,
                    id: AllocId(i as u64),
                    size_bytes: 64,
                    stack: StackId(1),
                    kind: AllocKind::Device,
                    ..Alloc::default()
                }),
                0,
            );
        }
        assert!(streamed(&m, None).is_none());
        let s = &sites(&m, None)[&StackId(1)];
        // Times 20, 40, 100, 250, 260, 270, 300: gaps 20, 60, 150, 10, 10, 30.
        assert_eq!((s.count, s.first, s.last, s.med), (7, 20, 300, 30));
    }
}
