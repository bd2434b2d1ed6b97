//! When a history is sampled for growth: at the start of every iteration (`iterations`) of a
//! process and at its end; and whether a series sampled so grows persistently (`judge`).

use alloc::vec::Vec;

use super::Config;
use super::history::HistoryEnd;
use super::iterations::Iterations;
use crate::format::ProcessIdx;
use crate::model::{Fields, TraceModel};
use crate::stats::linear_fit;
use hashbrown::HashMap;

/// Samples at most per cause series.
const MAX_SAMPLES: usize = 256;

/// Growth below this is never a leak, whatever its rate.
pub(crate) const MIN_GROWTH_BYTES: i64 = 4096;

/// How a process's history is sampled: every `stride`-th start of its iterations (the trace's
/// or its own), the first `k` of them, then its end (`tail`: the time and its iteration number,
/// fractional) unless the last start is the end. A few words per process: the sampled starts
/// are in a table shared by every process sampled with the same iterations and stride, so a
/// trace naming many processes does not hold a copy of them for each.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Which iterations: 0 the trace's, `k + 1` the `k`-th of the processes sampled on their
    /// own.
    source: usize,
    /// The table of sampled starts it reads ([`ProcessSampling`]).
    table: usize,
    stride: usize,
    k: usize,
    tail: Option<(u64, f64)>,
    steady: usize,
}

/// Plans the samples of a process: the starts of iterations from 0, and the end; and the index
/// of the first steady-state sample. `last_activity` is the process's last allocation or
/// attempt (a failed allocation is activity too), `None` when it made none.
fn plan(
    m: &TraceModel,
    it: &Iterations,
    source: usize,
    end: HistoryEnd,
    last_activity: Option<u64>,
) -> Plan {
    // The last sample: after an exit, the last allocation (from then on the program only frees
    // while it shuts down: a cache emptied, tensors collected at exit, which says nothing about
    // whether it leaked while it ran; memory live at the very end is judged by `end_groups`);
    // otherwise the end of the history (a snapshot or a kill freezes what was live).
    let last = if end.program_finished() {
        last_activity.unwrap_or(m.last_ts_nanos)
    } else {
        m.last_ts_nanos
    };
    let starts = &it.starts_nanos;
    let n = starts.partition_point(|t| t <= last);
    let stride = n.div_ceil(MAX_SAMPLES).max(1);
    // Starts 0, stride, 2 stride… below n.
    let k = n.div_ceil(stride);
    let tail = (k == 0 || starts.get((k - 1) * stride).is_some_and(|t| t < last)).then(|| {
        let last_start = n
            .checked_sub(1)
            .and_then(|i| starts.get(i))
            .unwrap_or(m.first_ts_nanos);
        let period = it.median_period_nanos.max(1) as f64;
        let iter = n.saturating_sub(1) as f64 + last.saturating_sub(last_start) as f64 / period;
        (last, iter)
    });
    // The first sample at or after the warm-up: the first start at or past it, else the end.
    let warm = usize::try_from(it.warmup.div_ceil(stride as u64)).unwrap_or(usize::MAX);
    Plan {
        source,
        table: 0,
        stride,
        k,
        tail,
        steady: warm.min(k),
    }
}

/// The samples of one process: their times, iteration numbers and seconds since the first
/// record, and the first steady-state sample.
#[derive(Clone, Copy)]
pub(crate) struct Samples<'a> {
    /// The sampled starts (every `stride`-th), at least `plan.k` of them.
    starts: &'a [u64],
    plan: &'a Plan,
    first_ts_nanos: u64,
}

impl<'a> Samples<'a> {
    pub fn len(&self) -> usize {
        self.plan.k + usize::from(self.plan.tail.is_some())
    }

    /// The first steady-state sample.
    pub fn steady(&self) -> usize {
        self.plan.steady
    }

    /// The time of sample `i` (`i < len()`).
    pub fn time(&self, i: usize) -> u64 {
        match self.plan.tail {
            Some((t, _)) if i == self.plan.k => t,
            _ => self.starts[i],
        }
    }

    /// The last sample's time.
    pub fn last_time(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.time(i))
    }

    /// The number of samples whose time satisfies `pred` (true for a prefix of them, as
    /// `slice::partition_point`).
    pub fn partition_point(&self, mut pred: impl FnMut(u64) -> bool) -> usize {
        let lo = self.starts[..self.plan.k].partition_point(|&t| pred(t));
        match self.plan.tail {
            Some((t, _)) if lo == self.plan.k && pred(t) => lo + 1,
            _ => lo,
        }
    }

    /// The number of samples earlier than `x`, as `partition_point(|t| t < x)`, searched from
    /// `from`, which must be at most the answer (the answer for an earlier `x`): galloping
    /// forward, so a pass over allocations in time order costs a step or two each instead of a
    /// binary search over every sample.
    #[inline]
    pub fn count_before_from(&self, from: usize, x: u64) -> usize {
        let n = self.len();
        if from >= n || self.time(from) >= x {
            // Most often: no sample between an allocation and the next, or its free.
            return from.min(n);
        }
        self.gallop(from, x)
    }

    /// [`Self::count_before_from`] where sample `lo` is earlier than `x`.
    #[inline(never)]
    fn gallop(&self, mut lo: usize, x: u64) -> usize {
        let n = self.len();
        // Sample `lo` is earlier than `x`; find a later one that is not, doubling the step.
        let mut step = 1;
        let hi = loop {
            let hi = lo + step;
            if hi >= n {
                break n;
            }
            if self.time(hi) >= x {
                break hi;
            }
            lo = hi;
            step *= 2;
        };
        // The answer is in lo + 1..=hi: bisect it (samples are strided starts and a tail, not
        // one slice).
        let (mut a, mut b) = (lo + 1, hi);
        while a < b {
            let mid = a + (b - a) / 2;
            if self.time(mid) < x {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        a
    }

    /// The sample times in order.
    pub fn times(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(|i| self.time(i))
    }

    /// The iteration number of each sample.
    pub fn iters(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| match self.plan.tail {
                Some((_, x)) if i == self.plan.k => x,
                _ => (i * self.plan.stride) as f64,
            })
            .collect()
    }

    /// Seconds since the first record of each sample.
    pub fn secs(&self) -> Vec<f64> {
        self.times()
            .map(|t| t.saturating_sub(self.first_ts_nanos) as f64 / 1e9)
            .collect()
    }
}

/// The sampling of each process: each worker of a multi-process run has its own steps and its
/// own end.
pub(crate) struct ProcessSampling {
    /// Every `stride`-th start of some iterations, for the plans that name them.
    tables: Vec<Vec<u64>>,
    /// By process, sorted.
    list: Vec<(ProcessIdx, Plan)>,
    first_ts_nanos: u64,
}

impl ProcessSampling {
    /// The samples of process `p` (the first process's for one the trace never named).
    pub fn of(&self, p: ProcessIdx) -> Samples<'_> {
        let i = self.list.binary_search_by_key(&p, |e| e.0).unwrap_or(0);
        let plan = &self.list[i].1;
        Samples {
            starts: &self.tables[plan.table],
            plan,
            first_ts_nanos: self.first_ts_nanos,
        }
    }
}

/// Processes that get iterations of their own (those with the most allocations); the others
/// share the trace's. Each costs a few passes over the history, so this bounds the work a
/// trace naming thousands of processes makes.
pub(crate) const MAX_PROCESSES_SAMPLED: usize = 64;

/// Each process's allocations and last activity (its last allocation or failed attempt): one
/// pass over the history that needs no iterations, so it runs beside the first stage's other
/// work rather than in the half that samples by them.
pub(crate) struct Activity {
    counts: HashMap<ProcessIdx, u64>,
    last: HashMap<ProcessIdx, u64>,
}

pub(crate) fn activity(m: &TraceModel) -> Activity {
    // Allocations and last activity per process, for every process named, in one pass.
    let mut counts: HashMap<ProcessIdx, u64> = m.processes.iter().map(|p| (p.process, 0)).collect();
    let mut last: HashMap<ProcessIdx, u64> = HashMap::new();
    // A run of one process's allocations is added to the maps once.
    let mut run: Option<(ProcessIdx, u64, u64)> = None;
    let mut add = |(p, n, t): (ProcessIdx, u64, u64)| {
        *counts.entry(p).or_default() += n;
        let l = last.entry(p).or_insert(t);
        *l = (*l).max(t);
    };
    for a in m.allocs.iter_fields(Fields::PROCESS | Fields::TS) {
        match &mut run {
            Some((p, n, t)) if *p == a.process => {
                *n += 1;
                *t = (*t).max(a.ts_nanos);
            }
            _ => {
                if let Some(r) = run.replace((a.process, 1, a.ts_nanos)) {
                    add(r);
                }
            }
        }
    }
    if let Some(r) = run {
        add(r);
    }
    for f in &m.failed {
        let l = last.entry(f.record.process).or_insert(f.record.ts_nanos);
        *l = (*l).max(f.record.ts_nanos);
    }
    Activity { counts, last }
}

pub(crate) fn sampling_by_process(
    m: &TraceModel,
    it: &Iterations,
    activity: Activity,
) -> ProcessSampling {
    let Activity { counts, last } = activity;
    let ends = super::history::ends_by_process(m);
    let mut procs: Vec<ProcessIdx> = counts.keys().copied().collect();
    procs.sort_unstable();
    if procs.is_empty() {
        procs.push(ProcessIdx(0));
    }
    let single = procs.len() <= 1;
    // The processes sampled on their own: the most allocations first, then by index.
    let mut own_sampled: Vec<(u64, ProcessIdx)> = counts.iter().map(|(&p, &n)| (n, p)).collect();
    own_sampled.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    own_sampled.truncate(MAX_PROCESSES_SAMPLED);
    let mut own = Vec::new();
    let mut list: Vec<(ProcessIdx, Plan)> = procs
        .iter()
        .map(|&p| {
            let plan = if single || !own_sampled.iter().any(|&(_, q)| q == p) {
                plan(m, it, 0, ends(p), last.get(&p).copied())
            } else {
                let its = super::iterations::detect_in(m, Some(p));
                let pl = plan(m, &its, own.len() + 1, ends(p), last.get(&p).copied());
                own.push(its);
                pl
            };
            (p, plan)
        })
        .collect();
    // One table per (iterations, stride), as long as its longest plan: the starts a plan's
    // samples read, so that reading one is an index (a pass over the allocations reads a
    // sample or two for each).
    let mut table_of: HashMap<(usize, usize), usize> = HashMap::new();
    let mut lengths: Vec<(usize, usize, usize)> = Vec::new();
    for (_, plan) in &mut list {
        let t = *table_of
            .entry((plan.source, plan.stride))
            .or_insert_with(|| {
                lengths.push((plan.source, plan.stride, 0));
                lengths.len() - 1
            });
        lengths[t].2 = lengths[t].2.max(plan.k);
        plan.table = t;
    }
    let tables = lengths
        .into_iter()
        .map(|(source, stride, k)| {
            let its = match source {
                0 => it,
                k => &own[k - 1],
            };
            (0..k)
                .filter_map(|j| its.starts_nanos.get(j * stride))
                .collect()
        })
        .collect();
    ProcessSampling {
        tables,
        list,
        first_ts_nanos: m.first_ts_nanos,
    }
}

/// Whether a steady-state series grows persistently, and its fits.
#[derive(Clone, Copy)]
pub(crate) struct Judged {
    pub growth: i64,
    pub per_iteration: f64,
    pub per_sec: f64,
    pub r: f64,
    pub leaking: bool,
    pub bounded: bool,
    /// Grew in every third of the steady state, steadily, however little.
    pub persistent: bool,
}

pub(crate) fn judge(
    c: &Config,
    v: &[i64],
    iters: &[f64],
    secs: &[f64],
    steady: usize,
) -> Option<Judged> {
    let u = &v[steady..];
    let n = u.len();
    if n < 4 {
        return None;
    }
    let (a, b) = (n / 3, 2 * n / 3);
    let g = [
        u[a].saturating_sub(u[0]),
        u[b].saturating_sub(u[a]),
        u[n - 1].saturating_sub(u[b]),
    ];
    let growth = u[n - 1].saturating_sub(u[0]);
    let fit_i = linear_fit(iters[steady..].iter().zip(u).map(|(&x, &y)| (x, y as f64)));
    let fit_t = linear_fit(secs[steady..].iter().zip(u).map(|(&x, &y)| (x, y as f64)));
    let r = fit_i.map_or(0.0, |f| f.r);
    let per_sec = fit_t.map_or(0.0, |f| f.slope);
    // Enough to matter: over the history, or at its rate over an hour of run time.
    let enough = growth >= MIN_GROWTH_BYTES
        && (growth >= c.growth_min_bytes as i64
            || per_sec * 3600.0 >= c.growth_min_bytes_per_hour as f64);
    let persistent = g.iter().all(|&x| x > 0) && r >= c.growth_min_r;
    let leaking = enough && persistent;
    // Grew over several samples (not one allocation), then stopped.
    let rises = v.windows(2).filter(|w| w[1] > w[0]).count();
    let early = v[..=b.saturating_add(steady).min(v.len() - 1)]
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]).max(0))
        .fold(0i64, i64::saturating_add);
    let bounded = !leaking
        && rises >= 3
        && early >= c.growth_min_bytes as i64
        && g[2] <= 0
        && v[v.len() - 1] >= c.growth_min_bytes as i64;
    Some(Judged {
        growth,
        per_iteration: exact_per_iteration(u, &iters[steady..])
            .unwrap_or_else(|| fit_i.map_or(0.0, |f| f.slope)),
        per_sec,
        r,
        leaking,
        bounded,
        persistent,
    })
}

/// The exact growth per iteration where most steady iterations grow by the same bytes (a list
/// that keeps one tensor per step): the most common change between consecutive samples a whole
/// number of iterations apart, per iteration, when at least half the changes are it, it is
/// growth, and it is the mean change too (within 2 %: one slow step's freed temporary does not
/// matter, a minority of larger steps does). The last sample, part of an iteration after the
/// last start, is not one of them. None otherwise (the slope of the fit is the rate then).
fn exact_per_iteration(u: &[i64], iters: &[f64]) -> Option<f64> {
    // The change per iteration of each pair of whole-iteration samples (a change that does not
    // divide evenly matches no other: i64::MIN), and the total change over those iterations.
    let (mut total, mut span) = (0i64, 0i64);
    let mut steps: Vec<i64> = u
        .windows(2)
        .zip(iters.windows(2))
        .filter_map(|(w, x)| {
            let d = x[1] - x[0];
            (d >= 1.0 && d == (d as u64) as f64).then(|| {
                let (change, d) = (w[1].saturating_sub(w[0]), d as i64);
                total = total.saturating_add(change);
                span = span.saturating_add(d);
                if change % d == 0 {
                    change / d
                } else {
                    i64::MIN
                }
            })
        })
        .collect();
    if steps.len() < 3 {
        return None;
    }
    steps.sort_unstable();
    let (mut best, mut best_count, mut i) = (0i64, 0usize, 0usize);
    while i < steps.len() {
        let run = steps[i..].partition_point(|&s| s == steps[i]);
        if steps[i] != i64::MIN && run > best_count {
            (best, best_count) = (steps[i], run);
        }
        i += run;
    }
    let mean = total as f64 / span.max(1) as f64;
    let agrees = (mean - best as f64).abs() <= 0.02 * best as f64;
    (best > 0 && best_count * 2 >= steps.len() && agrees).then_some(best as f64)
}

#[cfg(test)]
mod tests {
    use super::{Plan, Samples, exact_per_iteration};
    use alloc::vec::Vec;

    /// A search over the samples finds what a search over their listed times finds, with and
    /// without a tail, whatever the stride.
    #[test]
    fn sample_search_matches_the_listed_times() {
        // Starts with repeats, as iterations at one timestamp give.
        let starts: Vec<u64> = (0..50u64).map(|i| i / 2 * 10).collect();
        for stride in 1..6 {
            for k in 0..=starts.len().div_ceil(stride) {
                for tail in [None, Some((1_000, 99.5))] {
                    let plan = Plan {
                        source: 0,
                        table: 0,
                        stride,
                        k,
                        tail,
                        steady: 0,
                    };
                    // The table a plan reads: every `stride`-th start.
                    let table: Vec<u64> = starts.iter().step_by(stride).copied().collect();
                    let s = Samples {
                        starts: &table,
                        plan: &plan,
                        first_ts_nanos: 0,
                    };
                    let times: Vec<u64> = s.times().collect();
                    for x in [0, 5, 10, 11, 100, 245, 250, 999, 1_000, 1_001] {
                        let want = times.partition_point(|&t| t < x);
                        assert_eq!(s.partition_point(|t| t < x), want, "{stride} {k} {x}");
                        // Galloping from any start at most the answer finds the same.
                        for from in 0..=want {
                            assert_eq!(s.count_before_from(from, x), want, "{stride} {k} {x}");
                        }
                        let want = times.partition_point(|&t| t <= x);
                        assert_eq!(s.partition_point(|t| t <= x), want, "{stride} {k} {x}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_constant_step_is_the_exact_rate_and_noise_is_not() {
        let iters: Vec<f64> = (0..8).map(f64::from).collect();
        // 2 MiB a step, one step freeing a temporary early: the rate is 2 MiB exactly.
        let mib = 1i64 << 20;
        let u: Vec<i64> = [0, 2, 4, 6, 7, 10, 12, 14]
            .iter()
            .map(|x| x * mib)
            .collect();
        assert_eq!(exact_per_iteration(&u, &iters), Some((2 * mib) as f64));
        // Every step different: no exact rate.
        let v = [0, 3, 4, 9, 10, 17, 20, 30];
        assert_eq!(exact_per_iteration(&v, &iters), None);
        // Flat: no growth, no rate.
        assert_eq!(exact_per_iteration(&[5; 8], &iters), None);
        // Most steps 1 MiB, a few 10 MiB: the mean is far from the common step, no exact rate.
        let mixed: Vec<i64> = [0, 1, 2, 12, 13, 14, 24, 25]
            .iter()
            .map(|x| x * mib)
            .collect();
        assert_eq!(exact_per_iteration(&mixed, &iters), None);
        // Samples every second iteration (a long history's stride): per iteration.
        let every2: Vec<f64> = (0..6).map(|i| f64::from(i) * 2.0).collect();
        let w: Vec<i64> = (0..6).map(|i| i * 4 * mib).collect();
        assert_eq!(exact_per_iteration(&w, &every2), Some((2 * mib) as f64));
    }
}
