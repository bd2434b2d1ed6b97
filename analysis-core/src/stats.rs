//! Statistics the detectors need, written for `no_std` with `libm`: means, population standard
//! deviation, z-scores, numpy-compatible linear-interpolation quantiles (by selection, O(n)),
//! ordinary least squares with Pearson r and R², and the two-sided p-value of Student's t via the
//! regularized incomplete beta function.
//!
//! Every function is total: empty or degenerate input gives `None` or a neutral value, never a
//! panic or a NaN that leaks into a `Report`.

use alloc::vec::Vec;
use hashbrown::HashMap;

/// Arithmetic mean; `None` for an empty slice.
pub fn mean(xs: &[f64]) -> Option<f64> {
    mean_of(xs.iter().copied())
}

/// [`mean`] of values met in order, rather than held: their sum in that order over their count.
pub fn mean_of(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut n = 0usize;
    let sum: f64 = xs.inspect(|_| n += 1).sum();
    (n > 0).then(|| sum / n as f64)
}

/// Population standard deviation (numpy's default, `ddof = 0`); `None` for an empty slice.
pub fn std_population(xs: &[f64]) -> Option<f64> {
    std_population_of(|| xs.iter().copied())
}

/// [`std_population`] of the values `xs()` gives, the same ones in the same order on each call
/// (two passes: the mean, then the spread about it).
pub fn std_population_of<I: Iterator<Item = f64>>(xs: impl Fn() -> I) -> Option<f64> {
    let m = mean_of(xs())?;
    let mut n = 0usize;
    let var = xs()
        .inspect(|_| n += 1)
        .map(|x| (x - m) * (x - m))
        .sum::<f64>()
        / n as f64;
    Some(libm::sqrt(var))
}

/// z-scores `(x - mean) / std` (population std). All zeros when the spread is zero.
pub fn z_scores(xs: &[f64]) -> Vec<f64> {
    let (Some(m), Some(s)) = (mean(xs), std_population(xs)) else {
        return Vec::new();
    };
    if s <= 0.0 {
        return alloc::vec![0.0; xs.len()];
    }
    xs.iter().map(|x| (x - m) / s).collect()
}

/// The `q`-quantile (0..=1) with numpy's default linear interpolation, by selection: the slice
/// is reordered, not sorted. `None` for an empty slice.
pub fn quantile_select(xs: &mut [f64], q: f64) -> Option<f64> {
    select_quantile(xs, q, f64::total_cmp, |x| x)
}

/// [`quantile_select`] of integers as `f64`s (byte counts): compared as integers, which is
/// cheaper and orders them as their `f64` values do, so the result is the same.
pub fn quantile_select_u64(xs: &mut [u64], q: f64) -> Option<f64> {
    select_quantile(xs, q, u64::cmp, |x| x as f64)
}

fn select_quantile<T: Copy>(
    xs: &mut [T],
    q: f64,
    mut cmp: impl FnMut(&T, &T) -> core::cmp::Ordering,
    value: impl Fn(T) -> f64,
) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    let pos = q * (xs.len() - 1) as f64;
    let lo = libm::floor(pos) as usize;
    let frac = pos - lo as f64;
    let (_, &mut a, right) = xs.select_nth_unstable_by(lo, &mut cmp);
    let a = value(a);
    if frac == 0.0 || right.is_empty() {
        return Some(a);
    }
    let b = right
        .iter()
        .map(|&x| value(x))
        .fold(f64::INFINITY, f64::min);
    Some(lerp(a, b, frac))
}

/// A multiset of integers (byte sizes) with exact quantiles, as [`quantile_select_u64`] gives
/// over all of them, held as a count per distinct value: the sizes one call site or range
/// allocates mostly repeat, so it keeps a few counts instead of every allocation's size.
/// Values that do not repeat (more than a quarter as many distinct values as values, past a
/// few thousand), or more than [`Counts::MAX_DISTINCT`] distinct values, stop the counting: it
/// then keeps only the count, least and greatest ([`Counts::counted`] is false), so that its
/// memory stays bounded however long the sequence, and a caller finds the quantiles over
/// passes through the values again (`analysis::median`).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    counts: HashMap<u64, u64>,
    /// `counts` sorted by value, made when a quantile is asked.
    sorted: Vec<(u64, u64)>,
    /// The counting stopped.
    uncounted: bool,
    len: u64,
    min: Option<u64>,
    max: Option<u64>,
}

impl Counts {
    /// Distinct values counted at most (a few hundred KiB of counts).
    pub const MAX_DISTINCT: usize = 1 << 14;

    pub fn push(&mut self, v: u64) {
        self.len += 1;
        self.max = self.max.max(Some(v));
        self.min = Some(self.min.map_or(v, |m| m.min(v)));
        if self.uncounted {
            return;
        }
        self.sorted.clear();
        let n = self.counts.len();
        *self.counts.entry(v).or_insert(0) += 1;
        // A new distinct value, and few repeats so far, or too many distinct values.
        if self.counts.len() > n
            && ((n >= 4096 && n as u64 >= self.len / 4) || n >= Self::MAX_DISTINCT)
        {
            self.uncounted = true;
            self.counts = HashMap::new();
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it still counts its values, so that [`Self::quantile`] answers.
    pub fn counted(&self) -> bool {
        !self.uncounted
    }

    /// The `q`-quantile, numpy's linear interpolation (as [`quantile_select_u64`]); `None`
    /// when there are no values or the counting stopped ([`Self::counted`]).
    pub fn quantile(&mut self, q: f64) -> Option<f64> {
        if self.len == 0 || self.uncounted {
            return None;
        }
        if self.sorted.is_empty() {
            self.sorted = self.counts.iter().map(|(&v, &c)| (v, c)).collect();
            self.sorted.sort_unstable();
        }
        let (lo, frac) = quantile_position(self.len, q);
        // The values at ranks `lo` and `lo + 1`.
        let at = |rank: u64| {
            let mut seen = 0u64;
            self.sorted.iter().find_map(|&(v, n)| {
                seen += n;
                (rank < seen).then_some(v as f64)
            })
        };
        let a = at(lo)?;
        Some(quantile_between(a, at(lo + 1), frac))
    }

    /// The least value.
    pub fn min(&self) -> Option<u64> {
        self.min
    }

    /// The largest value.
    pub fn max(&self) -> Option<u64> {
        self.max
    }
}

/// Where the `q`-quantile of `len` values lies once sorted (numpy's linear interpolation): the
/// rank (from 0) of the value below it and the fraction of the way to the next one.
pub fn quantile_position(len: u64, q: f64) -> (u64, f64) {
    let q = q.clamp(0.0, 1.0);
    let pos = q * len.saturating_sub(1) as f64;
    let lo = libm::floor(pos) as u64;
    (lo, pos - lo as f64)
}

/// The quantile from the value at its rank, the next value (`None` past the last) and the
/// fraction between them ([`quantile_position`]).
pub fn quantile_between(at: f64, next: Option<f64>, frac: f64) -> f64 {
    match next {
        Some(b) if frac != 0.0 => lerp(at, b, frac),
        _ => at,
    }
}

/// The `q`-quantile of an already sorted slice, numpy linear interpolation.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    let pos = q * (sorted.len() - 1) as f64;
    let lo = libm::floor(pos) as usize;
    let frac = pos - lo as f64;
    match sorted.get(lo + 1) {
        Some(&b) if frac > 0.0 => Some(lerp(sorted[lo], b, frac)),
        _ => Some(sorted[lo]),
    }
}

/// numpy's `_lerp`: exact at both ends.
pub(crate) fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let d = b - a;
    if t >= 0.5 {
        b - d * (1.0 - t)
    } else {
        a + d * t
    }
}

/// Result of an ordinary least-squares fit `y = intercept + slope * x`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LinearFit {
    pub n: u64,
    pub slope: f64,
    pub intercept: f64,
    /// Pearson correlation coefficient (0 when either variable has no spread).
    pub r: f64,
    pub r_squared: f64,
    /// Two-sided p-value of the t test of `slope = 0` with `n - 2` degrees of freedom
    /// (1 when undefined).
    pub p_value: f64,
}

/// Ordinary least squares over paired samples given by an iterator that can be walked twice.
/// `None` with fewer than 2 points.
pub fn linear_fit<I>(points: I) -> Option<LinearFit>
where
    I: Iterator<Item = (f64, f64)> + Clone,
{
    let (mut n, mut sx, mut sy) = (0u64, 0.0f64, 0.0f64);
    for (x, y) in points.clone() {
        n += 1;
        sx += x;
        sy += y;
    }
    if n < 2 {
        return None;
    }
    let (mx, my) = (sx / n as f64, sy / n as f64);
    let (mut sxx, mut syy, mut sxy) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in points {
        let (dx, dy) = (x - mx, y - my);
        sxx += dx * dx;
        syy += dy * dy;
        sxy += dx * dy;
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let r = if sxx > 0.0 && syy > 0.0 {
        (sxy / libm::sqrt(sxx * syy)).clamp(-1.0, 1.0)
    } else {
        0.0
    };
    Some(LinearFit {
        n,
        slope,
        intercept: my - slope * mx,
        r,
        r_squared: r * r,
        p_value: pearson_p_value(r, n),
    })
}

/// Two-sided p-value for Pearson's r with `n` samples (t test, `n - 2` degrees of freedom),
/// as scipy's `linregress` computes it.
pub fn pearson_p_value(r: f64, n: u64) -> f64 {
    if n < 3 {
        return 1.0;
    }
    let df = (n - 2) as f64;
    if r.abs() >= 1.0 {
        return 0.0;
    }
    let t = r * libm::sqrt(df / ((1.0 - r) * (1.0 + r)));
    student_t_two_sided_p(t, df)
}

/// Two-sided p-value `P(|T| >= |t|)` of Student's t with `df` degrees of freedom.
pub fn student_t_two_sided_p(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return if t.is_nan() { 1.0 } else { 0.0 };
    }
    if df <= 0.0 {
        return 1.0;
    }
    if df > 1e7 {
        // The t distribution is the normal one to well below 1e-6 here, and the continued
        // fraction would need thousands of terms.
        return libm::erfc(t.abs() / core::f64::consts::SQRT_2).clamp(0.0, 1.0);
    }
    let x = df / (df + t * t);
    regularized_incomplete_beta(df / 2.0, 0.5, x).clamp(0.0, 1.0)
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction (modified
/// Lentz), using the symmetry `I_x(a, b) = 1 - I_{1-x}(b, a)` for fast convergence.
pub fn regularized_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = libm::lgamma(a + b) - libm::lgamma(a) - libm::lgamma(b)
        + a * libm::log(x)
        + b * libm::log1p(-x);
    let front = libm::exp(ln_front);
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_continued_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_continued_fraction(b, a, 1.0 - x) / b
    }
}

fn beta_continued_fraction(a: f64, b: f64, x: f64) -> f64 {
    const MAX_ITERATIONS: u32 = 100_000;
    const EPS: f64 = 1e-15;
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=MAX_ITERATIONS {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn selection_quantile_equals_sorted_quantile(
            mut xs in proptest::collection::vec(-1e9f64..1e9, 1..200),
            q in 0.0f64..=1.0,
        ) {
            let mut sorted = xs.clone();
            sorted.sort_by(f64::total_cmp);
            let a = quantile_select(&mut xs, q);
            let b = quantile_sorted(&sorted, q);
            prop_assert_eq!(a, b);
        }

        #[test]
        fn integer_quantile_equals_the_float_one(
            mut xs in proptest::collection::vec(
                prop_oneof![0u64..4096, any::<u64>(), (1u64 << 53)..(1u64 << 54)],
                1..200,
            ),
            q in 0.0f64..=1.0,
        ) {
            let mut fs: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
            prop_assert_eq!(quantile_select_u64(&mut xs, q), quantile_select(&mut fs, q));
        }

        #[test]
        fn counted_quantiles_equal_selected_ones(
            xs in prop_oneof![
                proptest::collection::vec(0u64..8, 1..3000),
                proptest::collection::vec(any::<u64>(), 1..3000),
                proptest::collection::vec(0u64..20_000, 4000..12_000),
                // Runs of repeats, as a scope's sizes come.
                proptest::collection::vec((0u64..16, 1usize..40), 1..300).prop_map(|runs| {
                    runs.into_iter().flat_map(|(v, n)| core::iter::repeat_n(v, n)).collect()
                }),
            ],
            q in 0.0f64..=1.0,
            asked_at in 0.0f64..1.0,
        ) {
            let mut c = Counts::default();
            // A quantile asked part way through counts what came before it, and the pushes
            // after it go on from there (its sorted counts made again).
            let mid = (xs.len() as f64 * asked_at) as usize;
            for &x in &xs[..mid] {
                c.push(x);
            }
            let mut head = xs[..mid].to_vec();
            if c.counted() {
                prop_assert_eq!(c.quantile(0.5), quantile_select_u64(&mut head, 0.5));
            }
            for &x in &xs[mid..] {
                c.push(x);
            }
            let mut plain = xs.clone();
            prop_assert_eq!(c.len(), xs.len() as u64);
            prop_assert_eq!(c.max(), xs.iter().copied().max());
            prop_assert_eq!(c.min(), xs.iter().copied().min());
            // Values that repeat are counted; a few thousand that do not, not.
            let mut distinct = xs.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() <= 4096 {
                prop_assert!(c.counted());
            }
            if c.counted() {
                prop_assert_eq!(c.quantile(q), quantile_select_u64(&mut plain, q));
                prop_assert_eq!(c.quantile(0.25), quantile_select_u64(&mut plain, 0.25));
            } else {
                prop_assert!(distinct.len() > 4096);
                prop_assert_eq!(c.quantile(q), None);
            }
        }

        #[test]
        fn counting_stops_past_its_distinct_values(repeats in 5u64..9) {
            // Values that repeat, but too many distinct ones to count: the counts would
            // grow with the sequence.
            let n = Counts::MAX_DISTINCT as u64 + 100;
            let mut c = Counts::default();
            for v in 0..n {
                for _ in 0..repeats {
                    c.push(v * 3 + 1);
                }
                prop_assert_eq!(c.counted(), v < Counts::MAX_DISTINCT as u64);
            }
            prop_assert_eq!(c.len(), n * repeats);
            prop_assert_eq!((c.min(), c.max()), (Some(1), Some((n - 1) * 3 + 1)));
            prop_assert!(c.counts.is_empty());
        }

        #[test]
        fn fit_is_invariant_under_shifting_x(
            ys in proptest::collection::vec(0.0f64..1e6, 3..60),
            shift in 0.0f64..1e4,
        ) {
            let a = linear_fit(ys.iter().enumerate().map(|(i, &y)| (i as f64, y)));
            let b = linear_fit(ys.iter().enumerate().map(|(i, &y)| (i as f64 + shift, y)));
            let (a, b) = (a.expect("fit"), b.expect("fit"));
            prop_assert!((a.slope - b.slope).abs() <= 1e-6 * (1.0 + a.slope.abs()));
            prop_assert!((a.r - b.r).abs() <= 1e-9);
        }
    }

    #[test]
    fn degenerate_inputs_are_neutral() {
        assert_eq!(mean(&[]), None);
        assert_eq!(quantile_select(&mut [], 0.5), None);
        assert!(linear_fit(core::iter::once((1.0, 1.0))).is_none());
        let flat = linear_fit([(0.0, 5.0), (1.0, 5.0), (2.0, 5.0)].into_iter()).expect("fit");
        assert_eq!(flat.r, 0.0);
        assert_eq!(flat.p_value, 1.0);
        assert_eq!(z_scores(&[3.0, 3.0]), [0.0, 0.0]);
        assert_eq!(student_t_two_sided_p(0.0, 10.0), 1.0);
    }
}
