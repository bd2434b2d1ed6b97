//! The exact median of a long sequence with memory bounded by a constant: the sequence is
//! seen again, in the same order, on each of a few passes, and each pass narrows down on the
//! range that holds the median ([`MedianOverPasses`]). What the search for a recurring call
//! site takes of each stack's gaps, and the median gap of the iterations and the median peak of
//! the spikes detector take of theirs, where a vector of every value would grow with the
//! history.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

/// Values a median keeps as they are before it counts them in a window around them.
pub(crate) const FEW: usize = 64;
/// Counters of that window.
pub(crate) const WINDOW: u32 = 512;
/// Counters of a further pass that narrows down on a median.
pub(crate) const BUCKETS: u32 = 1024;
/// Values around a median few enough to collect and select from, at least.
pub(crate) const CAP: u64 = 4096;
/// Values the open medians collect at most, all together, where that allows more than [`CAP`]
/// each (8 MiB): fewer passes when few sequences hold thousands of values.
const COLLECT: u64 = 1 << 20;

/// Values each of `open` medians may collect.
pub(crate) fn cap(open: usize) -> u64 {
    (COLLECT / open.max(1) as u64).clamp(CAP, COLLECT)
}

/// Runs `medians` over the values `values()` gives, the same ones in the same order on each
/// call, pass after pass until every median is found.
pub(crate) fn over_passes<I: Iterator<Item = u64>>(
    values: impl Fn() -> I,
    medians: &mut [MedianOverPasses],
) {
    loop {
        let open = medians.iter().filter(|m| m.found().is_none()).count();
        if open == 0 {
            return;
        }
        for v in values() {
            for m in medians.iter_mut() {
                m.see(v);
            }
        }
        for m in medians.iter_mut() {
            m.end_pass(cap(open));
        }
    }
}

/// The [`upper_median`] of the values `values()` gives on each call, over passes.
pub(crate) fn upper_median_over<I: Iterator<Item = u64>>(values: impl Fn() -> I) -> u64 {
    let mut m = [MedianOverPasses::new()];
    over_passes(values, &mut m);
    m[0].found().unwrap_or(0)
}

/// The value at index `len / 2` once sorted (reordering `values`), 0 for none.
pub(crate) fn upper_median(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mid = values.len() / 2;
    *values.select_nth_unstable(mid).1
}

/// The value at index `(len - 1) / 2` once sorted (reordering `values`), 0 for none.
pub(crate) fn lower_median(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mid = (values.len() - 1) / 2;
    *values.select_nth_unstable(mid).1
}

/// Bits of `v` up to its highest set one (0 for 0).
fn bit_length(v: u64) -> u32 {
    u64::BITS - v.leading_zeros()
}

/// The exact [`upper_median`] (or [`lower_median`]) of a sequence of values seen again, in the
/// same order, on each pass ([`Self::see`] each, then [`Self::end_pass`]), holding at most
/// [`FEW`] values, [`WINDOW`] or [`BUCKETS`] counters, or the values a pass's end allows it to
/// collect.
#[derive(Debug)]
pub(crate) enum MedianOverPasses {
    /// Every value so far, while at most [`FEW`]; whether the median sought is the lower one.
    Few(Vec<u64>, bool),
    /// Counts per bucket of `1 << shift` values from `lo` up to `hi`, a window over the range
    /// of the first values, and of the values below and above it.
    Window {
        lower: bool,
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

impl MedianOverPasses {
    /// The median at index `n / 2` of the `n` values once sorted ([`upper_median`]).
    pub(crate) fn new() -> Self {
        Self::Few(Vec::new(), false)
    }

    /// The median at index `(n - 1) / 2` ([`lower_median`]): with the upper one, the two
    /// middle values of an even count.
    pub(crate) fn lower() -> Self {
        Self::Few(Vec::new(), true)
    }

    pub(crate) fn found(&self) -> Option<u64> {
        match self {
            Self::Found(v) => Some(*v),
            _ => None,
        }
    }

    #[inline(always)]
    pub(crate) fn see(&mut self, v: u64) {
        match self {
            Self::Few(vs, lower) => {
                vs.push(v);
                if vs.len() > FEW {
                    *self = Self::window(vs, *lower);
                }
            }
            Self::Window {
                lo,
                hi,
                shift,
                below,
                above,
                counts,
                ..
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
    fn window(values: &[u64], lower: bool) -> Self {
        let (min, max) = values
            .iter()
            .fold((u64::MAX, 0), |(a, b), &v| (a.min(v), b.max(v)));
        let margin = max.saturating_sub(min) / 4;
        let (lo, hi) = (min.saturating_sub(margin), max.saturating_add(margin));
        let shift = bit_length(hi - lo).saturating_sub(WINDOW.trailing_zeros());
        let mut w = Self::Window {
            lower,
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
    pub(crate) fn end_pass(&mut self, cap: u64) {
        let next = match self {
            Self::Few(vs, false) => Self::Found(upper_median(vs)),
            Self::Few(vs, true) => Self::Found(lower_median(vs)),
            Self::Window {
                lower,
                lo,
                hi,
                shift,
                below,
                above,
                counts,
            } => {
                let inside: u64 = counts.iter().sum();
                let n = *below + inside + *above;
                let rank = if *lower {
                    n.saturating_sub(1) / 2
                } else {
                    n / 2
                };
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

/// The exact `q`-quantile ([`crate::stats::quantile_select_u64`]) of a sequence seen again, in
/// the same order, on each pass, whose count, least and greatest values a first pass found:
/// the values at the rank below it and at the next, each sought as a median is
/// ([`MedianOverPasses`]), with the same bounded memory.
#[derive(Debug)]
pub(crate) struct QuantileOverPasses {
    at: MedianOverPasses,
    /// The next rank's value, where the quantile lies between the two.
    next: Option<MedianOverPasses>,
    frac: f64,
}

impl QuantileOverPasses {
    /// The `q`-quantile of `len` values from `min` to `max`, each search collecting at most
    /// `cap` values on its first pass.
    pub(crate) fn new(len: u64, min: u64, max: u64, q: f64, cap: u64) -> Self {
        let (rank, frac) = crate::stats::quantile_position(len, q);
        let search = |rank| MedianOverPasses::narrow(cap, min, max, rank, len);
        Self {
            at: search(rank),
            next: (frac != 0.0 && rank + 1 < len).then(|| search(rank + 1)),
            frac,
        }
    }

    /// Searches still open: 0, 1 or 2.
    pub(crate) fn open(&self) -> usize {
        usize::from(self.at.found().is_none())
            + usize::from(self.next.as_ref().is_some_and(|n| n.found().is_none()))
    }

    #[inline]
    pub(crate) fn see(&mut self, v: u64) {
        self.at.see(v);
        if let Some(n) = &mut self.next {
            n.see(v);
        }
    }

    pub(crate) fn end_pass(&mut self, cap: u64) {
        self.at.end_pass(cap);
        if let Some(n) = &mut self.next {
            n.end_pass(cap);
        }
    }

    /// The quantile, once both values are found.
    pub(crate) fn found(&self) -> Option<f64> {
        let at = self.at.found()? as f64;
        let next = match &self.next {
            Some(n) => Some(n.found()? as f64),
            None => None,
        };
        Some(crate::stats::quantile_between(at, next, self.frac))
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
    use proptest::prelude::*;

    /// Runs the passes of a [`MedianOverPasses`] over `values` to the end, checking what it holds.
    fn passes(values: &[u64], cap: u64) -> (u64, usize) {
        passes_of(MedianOverPasses::new(), values, cap)
    }

    /// [`passes`] of `m`, the upper or the lower median.
    fn passes_of(mut m: MedianOverPasses, values: &[u64], cap: u64) -> (u64, usize) {
        let mut n = 0;
        loop {
            for &v in values {
                m.see(v);
                match &m {
                    MedianOverPasses::Few(v, _) => assert!(v.len() <= FEW),
                    MedianOverPasses::Buckets { counts, .. } => {
                        assert!(counts.len() <= BUCKETS as usize)
                    }
                    MedianOverPasses::Collect { values, .. } => {
                        assert!(values.len() <= cap as usize)
                    }
                    MedianOverPasses::Window { counts, .. } => {
                        assert!(counts.len() <= WINDOW as usize)
                    }
                    MedianOverPasses::Found(_) => {}
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
            let (got, _) = passes_of(MedianOverPasses::lower(), &values, CAP);
            prop_assert_eq!(got, lower_median(&mut all));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// A quantile found over passes is the one selected from all the values.
        #[test]
        fn a_quantile_over_passes_is_the_selected_one(
            values in gaps().prop_filter("values", |v| !v.is_empty()),
            q in 0.0f64..=1.0,
            cap in prop_oneof![Just(CAP), Just(1u64 << 20)],
        ) {
            let min = values.iter().copied().min().expect("values");
            let max = values.iter().copied().max().expect("values");
            let mut x = QuantileOverPasses::new(values.len() as u64, min, max, q, cap);
            let mut passes = 0;
            while x.found().is_none() {
                prop_assert!(x.open() > 0);
                for &v in &values {
                    x.see(v);
                }
                x.end_pass(cap);
                passes += 1;
                prop_assert!(passes < 16, "no quantile after {} passes", passes);
            }
            prop_assert_eq!(x.open(), 0);
            let mut all = values.clone();
            prop_assert_eq!(x.found(), crate::stats::quantile_select_u64(&mut all, q));
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
}
