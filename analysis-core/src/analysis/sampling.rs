//! When a history is sampled for growth: at the start of every iteration (`iterations`) of a
//! process and at its end; and whether a series sampled so grows persistently (`judge`).

use alloc::vec::Vec;

use super::Config;
use super::history::HistoryEnd;
use super::iterations::Iterations;
use crate::format::ProcessIdx;
use crate::model::TraceModel;
use crate::stats::linear_fit;
use hashbrown::HashMap;

/// Samples at most per cause series.
const MAX_SAMPLES: usize = 256;

/// Growth below this is never a leak, whatever its rate.
pub(crate) const MIN_GROWTH_BYTES: i64 = 4096;

/// Sample times: the starts of iterations from 0, and the end; and the index of the first
/// steady-state sample.
/// `last_activity` is the process's last allocation or attempt (a failed allocation is
/// activity too), `None` when it made none.
pub(crate) fn sample_times(
    m: &TraceModel,
    it: &Iterations,
    end: HistoryEnd,
    last_activity: Option<u64>,
) -> Sampling {
    // The last sample: after an exit, the last allocation (from then on the program only frees
    // while it shuts down: a cache emptied, tensors collected at exit, which says nothing about
    // whether it leaked while it ran; memory live at the very end is judged by `end_groups`);
    // otherwise the end of the history (a snapshot or a kill freezes what was live).
    let last = if end.program_finished() {
        last_activity.unwrap_or(m.last_ts_nanos)
    } else {
        m.last_ts_nanos
    };
    let n = it.starts_nanos.partition_point(|&t| t <= last);
    let stride = n.div_ceil(MAX_SAMPLES).max(1);
    let mut times = Vec::new();
    let mut iters = Vec::new();
    let mut steady = usize::MAX;
    for i in (0..n).step_by(stride) {
        if steady == usize::MAX && i as u64 >= it.warmup {
            steady = times.len();
        }
        times.push(it.starts_nanos[i]);
        iters.push(i as f64);
    }
    if times.last().is_none_or(|&t| t < last) {
        if steady == usize::MAX {
            steady = times.len();
        }
        times.push(last);
        let last_start = n
            .checked_sub(1)
            .map_or(m.first_ts_nanos, |i| it.starts_nanos[i]);
        let period = it.median_period_nanos.max(1) as f64;
        iters.push(n.saturating_sub(1) as f64 + last.saturating_sub(last_start) as f64 / period);
    }
    let steady = steady.min(times.len());
    let secs = times
        .iter()
        .map(|&t| t.saturating_sub(m.first_ts_nanos) as f64 / 1e9)
        .collect();
    Sampling {
        times,
        iters,
        secs,
        steady,
    }
}

/// When a history is sampled: at the start of each iteration and at its end.
pub(crate) struct Sampling {
    pub times: Vec<u64>,
    /// The iteration number of each sample.
    pub iters: Vec<f64>,
    /// Seconds since the first record.
    pub secs: Vec<f64>,
    /// The first steady-state sample.
    pub steady: usize,
}

/// The sampling of each process: each worker of a multi-process run has its own steps and its
/// own end.
pub(crate) struct ProcessSampling {
    /// By process, sorted.
    list: Vec<(ProcessIdx, Sampling)>,
}

impl ProcessSampling {
    /// The sampling of process `p` (the first process's for one the trace never named).
    pub fn of(&self, p: ProcessIdx) -> &Sampling {
        let i = self.list.binary_search_by_key(&p, |e| e.0).unwrap_or(0);
        &self.list[i].1
    }
}

/// Processes that get iterations of their own (those with the most allocations); the others
/// share the trace's. Each costs a few passes over the history, so this bounds the work a
/// trace naming thousands of processes makes.
pub(crate) const MAX_PROCESSES_SAMPLED: usize = 64;

pub(crate) fn sampling_by_process(m: &TraceModel, it: &Iterations) -> ProcessSampling {
    // Allocations and last activity per process, for every process named, in one pass.
    let mut counts: HashMap<ProcessIdx, u64> = m.processes.iter().map(|p| (p.process, 0)).collect();
    let mut last: HashMap<ProcessIdx, u64> = HashMap::new();
    for a in &m.allocs {
        *counts.entry(a.process).or_default() += 1;
        let l = last.entry(a.process).or_insert(a.ts_nanos);
        *l = (*l).max(a.ts_nanos);
    }
    for f in &m.failed {
        let l = last.entry(f.record.process).or_insert(f.record.ts_nanos);
        *l = (*l).max(f.record.ts_nanos);
    }
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
    let list = procs
        .iter()
        .map(|&p| {
            let own;
            let its = if single || !own_sampled.iter().any(|&(_, q)| q == p) {
                it
            } else {
                own = super::iterations::detect_in(m, Some(p));
                &own
            };
            (p, sample_times(m, its, ends(p), last.get(&p).copied()))
        })
        .collect();
    ProcessSampling { list }
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
    use super::exact_per_iteration;
    use alloc::vec::Vec;

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
