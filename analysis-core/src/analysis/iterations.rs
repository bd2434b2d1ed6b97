//! The program's repeated unit: training steps, requests, solver calls. Growth is judged
//! between the starts of steady-state iterations (after the warm-up ones), so one-time
//! allocations (parameters, optimizer state created on the first step, caches filled once) are
//! never growth, and memory that rises and falls inside every iteration is never growth either.
//!
//! Sources, first found wins:
//! 1. NVTX ranges (and imported snapshot annotations): the range name, digits stripped
//!    (`ProfilerStep#12` → `ProfilerStep#`), with the most instances among those at least
//!    `MIN_ITERATIONS` times; a name with "step" or "iter" in it is preferred.
//! 2. Marks with such a name.
//! 3. A recurring call site: a stack allocated at regular intervals (most gaps within a factor
//!    of two of the median) over most of the history, or, where none does, up to the
//!    program's last allocation (a short script: its loop a small part of a run spent mostly
//!    importing, starting CUDA and in a slow first step). Stacks through an optimizer's `step`
//!    are preferred; otherwise the outermost regular unit that still repeats often enough. A
//!    site recurring more than `MAX_RECURRING_ITERATIONS` times gives runs of its consecutive
//!    calls as iterations.
//! 4. Otherwise equal time windows.

use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::format::{ProcessIdx, StackId, StringId};
use crate::model::{Fields, TraceModel};
pub use crate::report::{IterationSource, Iterations, Starts};

mod recurring;

use super::median::upper_median_over;
use recurring::Site;

/// At least this many repetitions make an iteration.
pub const MIN_ITERATIONS: usize = 6;
/// Windows used when the history shows no repeated unit.
pub const TIME_WINDOWS: usize = 32;

impl Iterations {
    /// Iteration `i` spans `[start(i), start(i + 1))`; the last one ends at `end`.
    pub fn span(&self, i: usize, end: u64) -> (u64, u64) {
        let a = self.starts_nanos.get(i).unwrap_or(end);
        let b = self.starts_nanos.get(i + 1).unwrap_or(end).max(a);
        (a, b)
    }

    /// The word for one iteration in sentences.
    pub fn unit(&self) -> &'static str {
        match self.source {
            IterationSource::TimeWindows => "window",
            IterationSource::NvtxRange | IterationSource::Mark => {
                let l = self.label.to_ascii_lowercase();
                if l.contains("step") {
                    "step"
                } else if l.contains("epoch") {
                    "epoch"
                } else {
                    "iteration"
                }
            }
            IterationSource::RecurringSite => "iteration",
        }
    }
}

fn strip_digits(s: &str) -> String {
    s.trim_end_matches(|c: char| c.is_ascii_digit() || c == ' ' || c == '_' || c == '-')
        .into()
}

fn prefers(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.contains("step") || l.contains("iter") || l.contains("batch")
}

/// Warm-up iterations: one, or one in twenty of many, at most five.
fn warmup_of(count: usize) -> u64 {
    (count / 20).clamp(1, 5) as u64
}

/// The median gap between consecutive starts (the upper median of the gaps, 0 for none), over
/// passes through the starts: no vector of every gap.
fn median_gap(starts: &Starts) -> u64 {
    upper_median_over(|| {
        let mut prev = None;
        starts
            .iter()
            .filter_map(move |t| prev.replace(t).map(|p| t.saturating_sub(p)))
    })
}

/// The iterations of the distinct `starts`, collected in a column that goes to the model's
/// spill with its history.
fn make(
    m: &TraceModel,
    source: IterationSource,
    label: String,
    starts: impl IntoIterator<Item = u64>,
) -> Iterations {
    let starts = Starts::collect(starts, m.spill());
    Iterations {
        source,
        label,
        count: starts.len() as u64,
        warmup: warmup_of(starts.len()),
        median_period_nanos: median_gap(&starts),
        starts_nanos: starts,
    }
}

/// The most repeated name among `names` (range or mark names of one process or of all, each
/// with its time), digits stripped, with at least [`MIN_ITERATIONS`] occurrences, step-like
/// names first (`only_preferred`: only those count), and its times. The occurrences of each
/// name are counted first, and only the chosen name's times collected: every occurrence's time
/// by name, and a string per occurrence, had taken 8 bytes each (36 MB at 4.5 M range
/// instances).
fn most_repeated<I: Iterator<Item = (StringId, u64)>>(
    m: &TraceModel,
    names: impl Fn() -> I,
    only_preferred: bool,
    source: IterationSource,
) -> Option<Iterations> {
    // The stripped name of each name (by id), and the occurrences of each.
    let mut key_of: HashMap<StringId, Option<usize>> = HashMap::new();
    let mut keys: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut counts: Vec<usize> = Vec::new();
    let mut last: Option<(StringId, Option<usize>)> = None;
    for (name, _) in names() {
        let k = match last {
            Some((n, k)) if n == name => k,
            _ => {
                let k = *key_of.entry(name).or_insert_with(|| {
                    let key = strip_digits(m.string(name));
                    (!only_preferred || prefers(&key)).then(|| {
                        *index.entry(key).or_insert_with_key(|key| {
                            keys.push(key.clone());
                            counts.push(0);
                            keys.len() - 1
                        })
                    })
                });
                last = Some((name, k));
                k
            }
        };
        if let Some(k) = k {
            counts[k] += 1;
        }
    }
    let best = keys
        .iter()
        .zip(&counts)
        .enumerate()
        .filter(|(_, (_, n))| **n >= MIN_ITERATIONS)
        .max_by(|(_, a), (_, b)| {
            (prefers(a.0), a.1, core::cmp::Reverse(a.0)).cmp(&(
                prefers(b.0),
                b.1,
                core::cmp::Reverse(b.0),
            ))
        })?
        .0;
    let starts = names()
        .filter(|(name, _)| key_of.get(name) == Some(&Some(best)))
        .map(|(_, t)| t);
    Some(make(m, source, keys.swap_remove(best), starts))
}

fn from_ranges(m: &TraceModel, sel: Option<ProcessIdx>) -> Option<Iterations> {
    let names = || {
        m.ranges
            .iter()
            .filter(move |r| sel.is_none_or(|p| r.process == p))
            .map(|r| (r.name, r.begin_ts_nanos))
    };
    most_repeated(m, names, false, IterationSource::NvtxRange)
}

/// Marks with a step-like name ([`most_repeated`]).
fn from_marks(m: &TraceModel, sel: Option<ProcessIdx>) -> Option<Iterations> {
    let names = || {
        m.marks
            .iter()
            .filter(move |k| sel.is_none_or(|p| k.process == p))
            .map(|k| (k.name, k.ts_nanos))
    };
    most_repeated(m, names, true, IterationSource::Mark)
}

/// Whether the stack passes through an optimizer's step (PyTorch, JAX/optax, Keras).
fn optimizer_step(m: &TraceModel, stack: StackId) -> bool {
    m.stack_frames(stack).iter().any(|f| {
        (f.function == "step" || f.function.ends_with("_step") || f.function == "update")
            && (f.file.contains("optim") || f.file.contains("optax"))
    })
}

/// The last allocation of `sel` (or of the whole trace): after it a finished program only frees
/// while it shuts down.
fn last_allocation(m: &TraceModel, sel: Option<ProcessIdx>) -> u64 {
    m.allocs
        .iter_fields(Fields::PROCESS | Fields::TS)
        .filter(|a| sel.is_none_or(|p| a.process == p))
        .map(|a| a.ts_nanos)
        .max()
        .unwrap_or(m.last_ts_nanos)
}

/// Whether a stack's allocations recur regularly (most gaps between their times within a
/// factor of two of the median gap) and are mostly transient (freed within two periods).
fn recurs(s: &Site) -> bool {
    if s.med == 0 {
        return false;
    }
    if s.steady * 10 < s.gaps() * 7 {
        return false;
    }
    // A heartbeat is transient work of each iteration: most of its allocations are freed
    // within two periods. A site whose allocations are kept is what may leak, not a clock.
    s.transient * 2 >= s.count
}

/// Iterations a recurring call site gives at most. A site that recurs more often (a loop or a
/// server allocating on every call, hundreds of millions of times in a long run) makes each
/// iteration a run of consecutive calls, so that what is kept per iteration stays bounded:
/// 8 MiB of starts, and 8 MiB of the spikes' peaks.
const MAX_RECURRING_ITERATIONS: usize = 1 << 20;

fn from_recurring_site(m: &TraceModel, sel: Option<ProcessIdx>) -> Option<Iterations> {
    from_recurring_site_at_most(m, sel, MAX_RECURRING_ITERATIONS)
}

/// [`from_recurring_site`] with at most `most` iterations.
fn from_recurring_site_at_most(
    m: &TraceModel,
    sel: Option<ProcessIdx>,
    most: usize,
) -> Option<Iterations> {
    let span = m.last_ts_nanos.saturating_sub(m.first_ts_nanos);
    if span == 0 {
        return None;
    }
    let sites = recurring::sites(m, sel);
    // (prefer, count, stack) of every regular candidate: a site that recurs over at least half
    // the history.
    let candidates = |covers: &dyn Fn(&Site) -> bool| -> Vec<(bool, usize, StackId)> {
        sites
            .iter()
            .filter(|(_, s)| s.count >= MIN_ITERATIONS && covers(s) && recurs(s))
            .map(|(stack, s)| (optimizer_step(m, *stack), s.count, *stack))
            .collect()
    };
    let mut regular = candidates(&|s| s.last.saturating_sub(s.first) >= span / 2);
    if regular.is_empty() {
        // A short script: seconds of import and CUDA start-up before the loop, a first step
        // slowed by library start-up (cuBLAS handles, kernel loading) that takes most of the
        // loop's time, then an exit. The loop is a unit recurring until the program's last
        // allocation, each recurrence within a period or two of the next.
        let end = last_allocation(m, sel);
        regular = candidates(&|s| end.saturating_sub(s.last) <= s.med.saturating_mul(2));
    }
    if regular.is_empty() {
        return None;
    }
    // Optimizer steps first; then a site that recurs with the period of live bytes (the
    // step: inner loops recur faster, evaluations slower); then the outermost unit that still
    // repeats at least 16 times (or, if none does, the outermost at all).
    let period = live_bytes_period(m, sel);
    let with_period = period.and_then(|p| {
        regular
            .iter()
            .filter(|r| {
                let med = sites[&r.2].med;
                med >= p - p / 5 && med <= p + p / 4
            })
            .max_by_key(|r| (r.1, core::cmp::Reverse(r.2)))
            .copied()
    });
    let pick = if let Some(best) = regular.iter().filter(|r| r.0).min_by_key(|r| (r.1, r.2)) {
        *best
    } else if let Some(best) = with_period {
        best
    } else {
        let often: Vec<&(bool, usize, StackId)> = regular.iter().filter(|r| r.1 >= 16).collect();
        let pool: Vec<&(bool, usize, StackId)> = if often.is_empty() {
            regular.iter().collect()
        } else {
            often
        };
        **pool.iter().min_by_key(|r| (r.1, r.2))?
    };
    drop(sites);
    // Calls per iteration: one, or a run of them where the site recurs more than `most` times.
    let per = pick.1.div_ceil(most.max(1)).max(1);
    let starts = m
        .allocs
        .iter_fields(recurring::FIELDS)
        .filter(|a| a.stack == pick.2 && recurring::kept(sel, a))
        .map(|a| a.ts_nanos)
        .step_by(per);
    let label = m.stack_label(pick.2);
    let label = if per > 1 {
        alloc::format!("{label}, 1 in {per} calls")
    } else {
        label
    };
    Some(make(m, IterationSource::RecurringSite, label, starts))
}

/// Moments at which the total live bytes are sampled to find their period.
const PERIOD_SAMPLES: usize = 4096;

/// The period of the total live bytes: the series sampled at `PERIOD_SAMPLES` even moments,
/// detrended (a leak is a trend), and the first lag whose autocorrelation is a local maximum of
/// at least 0.8 times the highest (multiples of the period correlate as well). None without a
/// clear period (no lag above 0.3) or when the period is too short to resolve.
fn live_bytes_period(m: &TraceModel, sel: Option<ProcessIdx>) -> Option<u64> {
    let t0 = m.first_ts_nanos;
    let span = m.last_ts_nanos.saturating_sub(t0);
    // The process's largest device series, or the total.
    let series = match sel {
        None => &m.total,
        Some(p) => {
            &m.series
                .iter()
                .filter(|s| s.key.process == p && !s.key.host)
                .max_by_key(|s| s.peak_bytes)?
                .timeline
        }
    };
    if span == 0 || series.len() < 16 {
        return None;
    }
    let n = PERIOD_SAMPLES;
    let at = |i: usize| t0 + (span as u128 * i as u128 / n as u128) as u64;
    let ys: Vec<f64> = (0..n).map(|i| series.value_at(at(i)) as f64).collect();
    let fit = crate::stats::linear_fit(ys.iter().enumerate().map(|(i, &y)| (i as f64, y)))?;
    let xs: Vec<f64> = ys
        .iter()
        .enumerate()
        .map(|(i, &y)| y - (fit.intercept + fit.slope * i as f64))
        .collect();
    let var: f64 = xs.iter().map(|x| x * x).sum();
    if var <= 0.0 {
        return None;
    }
    let max_lag = n / 3;
    let r: Vec<f64> = (0..=max_lag)
        .map(|lag| xs.iter().zip(&xs[lag..]).map(|(a, b)| a * b).sum::<f64>() / var)
        .collect();
    let best = r[2..].iter().copied().fold(f64::MIN, f64::max);
    if best < 0.3 {
        return None;
    }
    (2..max_lag)
        .find(|&l| r[l] >= 0.8 * best && r[l] >= r[l - 1] && r[l] >= r[l + 1])
        .map(|l| (span as u128 * l as u128 / n as u128) as u64)
}

fn time_windows(m: &TraceModel) -> Iterations {
    let span = m.last_ts_nanos.saturating_sub(m.first_ts_nanos);
    let step = (span / TIME_WINDOWS as u64).max(1);
    let starts: Vec<u64> = (0..TIME_WINDOWS as u64)
        .map(|i| m.first_ts_nanos + i * step)
        .filter(|&t| t < m.last_ts_nanos.max(m.first_ts_nanos + 1))
        .collect();
    let mut it = make(
        m,
        IterationSource::TimeWindows,
        "time windows".into(),
        starts,
    );
    // A tenth of the history is start-up.
    it.warmup = (it.count / 10).max(1);
    it
}

/// When the allocation history begins: the first allocation after time 0, or the first free
/// (a snapshot whose ring buffer wrapped puts the blocks that predate its history at time 0,
/// while its annotations may reach back further: iterations before then show nothing).
fn history_start(m: &TraceModel, sel: Option<ProcessIdx>) -> u64 {
    let of = |a: &crate::model::AllocRecord| {
        if a.ts_nanos > 0 {
            a.ts_nanos
        } else if a.is_live() {
            u64::MAX
        } else {
            a.free_ts_nanos
        }
    };
    let allocs = m
        .allocs
        .iter_fields(Fields::PROCESS | Fields::TS | Fields::FREE)
        .filter(|a| sel.is_none_or(|p| a.process == p));
    if !m.allocs.times_ascend() {
        return allocs.map(|a| of(&a)).min().unwrap_or(0);
    }
    // Times in order: every allocation after the first one past time 0 starts later, so the
    // search ends there rather than after a pass over the whole history.
    let mut first: Option<u64> = None;
    for a in allocs {
        let v = of(&a);
        first = Some(first.map_or(v, |f| f.min(v)));
        if a.ts_nanos > 0 {
            break;
        }
    }
    first.unwrap_or(0)
}

/// Finds the program's iterations (always some: equal time windows at worst).
pub fn detect(m: &TraceModel) -> Iterations {
    detect_in(m, None)
}

/// The iterations of one process (`Some`), or of the whole trace: each worker of a multi-process
/// run has its own steps, on its own clock.
pub fn detect_in(m: &TraceModel, sel: Option<ProcessIdx>) -> Iterations {
    let found = from_ranges(m, sel)
        .or_else(|| from_marks(m, sel))
        .or_else(|| from_recurring_site(m, sel));
    let start = history_start(m, sel);
    match found {
        Some(mut it) => {
            let keep = it
                .starts_nanos
                .partition_point(|t| t < start)
                .saturating_sub(1);
            if keep > 0 {
                it.starts_nanos.drop_front(keep);
                it.count = it.starts_nanos.len() as u64;
                it.warmup = warmup_of(it.starts_nanos.len());
            }
            if it.starts_nanos.len() >= MIN_ITERATIONS {
                return it;
            }
            time_windows(m)
        }
        None => time_windows(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Scenario, generate};

    /// The history's start found where the times ascend, without a whole pass, is the one of
    /// every allocation: every scenario, the whole trace and each process, and a history
    /// whose first blocks predate it (time 0) and one whose times step back.
    #[test]
    fn the_history_start_is_the_earliest_allocation() {
        use crate::format::{Alloc, AllocId, AllocKind, Free, Header, Record};
        let everything = |m: &TraceModel, sel: Option<ProcessIdx>| {
            m.allocs
                .iter()
                .filter(|a| sel.is_none_or(|p| a.process == p))
                .map(|a| match (a.ts_nanos, a.is_live()) {
                    (0, true) => u64::MAX,
                    (0, false) => a.free_ts_nanos,
                    (t, _) => t,
                })
                .min()
                .unwrap_or(0)
        };
        let mut models = Vec::new();
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 20_000, 3);
            models.push(crate::model::load(&bytes).expect("loads").model);
        }
        for times in [[0u64, 0, 0, 50, 70, 90], [40, 30, 0, 80, 20, 90]] {
            let mut m = TraceModel::new(Header::default());
            for (i, ts) in times.into_iter().enumerate() {
                let id = AllocId(i as u64);
                let rec = Alloc {
                    ts_nanos: ts,
                    id,
                    size_bytes: 64,
                    stack: StackId(1),
                    kind: AllocKind::Device,
                    ..Alloc::default()
                };
                m.observe(Record::Alloc(rec), 0);
                if i % 2 == 1 {
                    m.observe(
                        Record::Free(Free {
                            ts_nanos: 60 - 5 * i as u64,
                            alloc: id,
                            ..Free::default()
                        }),
                        0,
                    );
                }
            }
            models.push(m);
        }
        for m in &models {
            let processes = m.processes.iter().map(|p| Some(p.process));
            for sel in core::iter::once(None).chain(processes) {
                assert_eq!(history_start(m, sel), everything(m, sel), "{sel:?}");
            }
        }
    }

    /// Marks give the iterations of a trace without ranges: the step-like name with the most
    /// marks, digits stripped, its times sorted and each once; a name that is not step-like
    /// never does, however often it is marked; a process's own marks give its iterations.
    #[test]
    fn step_marks_are_the_iterations() {
        use crate::format::{Header, Mark, Record};
        let mut m = TraceModel::new(Header::default());
        let names = ["step 1", "step 22", "checkpoint 3", "train_step"];
        for (i, name) in names.iter().enumerate() {
            m.observe(
                Record::String {
                    id: StringId(i as u32 + 1),
                    value: (*name).into(),
                },
                0,
            );
        }
        let mut mark = |ts: u64, name: u32, process: u32| {
            let k = Mark {
                ts_nanos: ts,
                name: StringId(name),
                process: ProcessIdx(process),
                ..Mark::default()
            };
            m.observe(Record::Mark(k), 0);
        };
        // "step" 9 times (one time twice, out of order), "checkpoint" 30 times, "train_step"
        // 7 times in process 1.
        for t in [10, 20, 30, 50, 40, 60, 70, 80, 80] {
            mark(t, 1 + (t as u32 / 10) % 2, 0);
        }
        for t in 0..30 {
            mark(100 + t, 3, 0);
        }
        for t in 0..7 {
            mark(200 + 10 * t, 4, 1);
        }
        let it = from_marks(&m, Some(ProcessIdx(0))).expect("step marks");
        assert_eq!(it.source, IterationSource::Mark);
        assert_eq!(it.label, "step");
        assert_eq!(it.starts_nanos.to_vec(), [10, 20, 30, 40, 50, 60, 70, 80]);
        assert_eq!(it.count, 8);
        assert_eq!(it.median_period_nanos, 10);
        let own = from_marks(&m, Some(ProcessIdx(1))).expect("its own step marks");
        assert_eq!(own.label, "train_step");
        assert_eq!(own.count, 7);
        // Over both processes, the name with the most step-like marks.
        assert_eq!(from_marks(&m, None).map(|i| i.label), Some("step".into()));
    }

    /// A site recurring more often than iterations are kept makes each iteration a run of its
    /// consecutive calls, and says so in the label.
    #[test]
    fn a_site_recurring_too_often_groups_its_calls() {
        let (bytes, _) = generate(Scenario::ContextReset, 40_000, 1);
        let t = crate::model::load(&bytes).expect("loads");
        let m = &t.model;
        let all = from_recurring_site(m, None).expect("the solver's loop recurs");
        assert!(all.starts_nanos.len() > 10_000);
        let grouped = from_recurring_site_at_most(m, None, 1000).expect("it recurs");
        let per = all.starts_nanos.len().div_ceil(1000);
        assert!(grouped.starts_nanos.len() <= 1000);
        let every: Vec<u64> = all.starts_nanos.iter().step_by(per).collect();
        assert_eq!(grouped.starts_nanos.to_vec(), every);
        assert_eq!(
            grouped.label,
            alloc::format!("{}, 1 in {per} calls", all.label)
        );
        assert_eq!(grouped.count, every.len() as u64);
    }
}
