//! Leaks, one finding per cause. A cause is the user's line in one process, on one device or in
//! its pinned host memory (`causes`).
//!
//! 1. **Growth.** The live bytes of every stack of every cause are sampled at the start of each
//!    iteration and at the end (`sampling`). A stack leaks when it grows persistently across the
//!    steady state (`sampling::judge`: in each third, steadily, enough bytes for the history or
//!    its rate, made of kept allocations); a cause when a stack of it does, or when it does as a
//!    whole. Growth that stops (a cache that fills during the first epochs) is a note. One-time
//!    allocations (parameters, optimizer state made on the first step) are in every sample and
//!    never grow. Leaking causes become findings in `grouping`.
//! 2. **What is live at the end**, for what does not grow, by how each process's history ends
//!    (`history`): after an exit, memory a native call site never freed is a leak at exit and
//!    memory its site frees elsewhere a missed free; a caching allocator's or a library's memory
//!    is cache; in a snapshot or at a kill, live memory is in use, not leaked. At any end, memory
//!    left by a thread that went quiet while its process went on is a leak.
//!
//! Memory released only by a context teardown is listed separately and is a note.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::causes::Causes;
use super::facts::group_by_stack;
use super::grouping::{group_causes, separating_frame};
use super::history::HistoryEnd;
use super::iterations::Iterations;
use super::sampling::{ProcessSampling, judge};
use super::{
    Carried, Config, Finding, FindingKind, Found, Severity, device_capacity, device_used_at_end,
};
use crate::format::{DeviceIdx, FreeKind, ProcessIdx, StackId, ThreadIdx};
use crate::model::{AllocRecord, Fields, TraceModel};
use crate::report::SiteBytes;
pub use crate::report::{Growth, LeakClass, LeakGroup};
use crate::units::{fmt_bytes, fmt_duration};

/// What `analyze` returns besides findings.
#[derive(Debug, Default)]
pub struct LeakSections {
    pub groups: Vec<LeakGroup>,
    pub growth: Vec<Growth>,
    pub teardown: Vec<SiteBytes>,
    /// Growth of the whole series left unexplained by leaking causes, per (process, device):
    /// (process, device, steady growth, explained growth).
    pub series_growth: Vec<(ProcessIdx, DeviceIdx, i64, i64)>,
}

/// How many growth rows the report keeps (leaking ones always).
const MAX_GROWTH_ROWS: usize = 50;
/// Allocations made in the steady state and kept to its end that growth needs.
const MIN_KEPT: u32 = 3;

/// Runs growth and end-of-history classification; pushes findings and notes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn analyze(
    m: &TraceModel,
    c: &Config,
    it: &Iterations,
    end: HistoryEnd,
    causes: &Causes,
    sampling: &ProcessSampling,
    carried: &mut impl Carried,
    found: &mut Found,
) -> LeakSections {
    let stacks = StackSeries::new(m, causes, sampling, carried);
    carried.end_pass();
    let mut v = judge_causes(m, c, causes, sampling, &stacks);
    let groups = group_causes(m, c, causes, &v.leaking, &v.weak, &v.leak_stacks);
    for (members, _) in &groups {
        for (ci, weak_stacks) in &v.weak {
            if members.contains(ci) {
                v.leak_stacks.extend(weak_stacks.iter().copied());
            }
        }
    }
    v.leak_stacks.sort_unstable();
    let mut grouped = alloc::vec![false; causes.keys.len()];
    for &ci in groups.iter().flat_map(|(members, _)| members) {
        grouped[ci] = true;
    }
    // One pass for what the verdicts leave to measure: the leaks' bytes, and what is live at
    // the end for what does not grow (they took a pass each).
    let mut kept = KeptScan::new(m, causes, sampling, &v.leak_stacks, &grouped);
    let mut ends = EndScan::new(causes, &v.leak_stacks);
    for (i, a) in m
        .allocs
        .iter_fields(kept.fields() | EndScan::FIELDS | carried.fields())
        .enumerate()
    {
        carried.visit(&a);
        let pair = causes.pair_of(&a);
        let ci = causes.pair(pair).0;
        kept.visit(i, pair, ci, &a);
        ends.visit(pair, ci, &a);
    }
    carried.end_pass();
    let kept = kept.finish();
    v.rows.sort_by(|a, b| {
        b.leaking
            .cmp(&a.leaking)
            .then(b.bytes_per_sec.total_cmp(&a.bytes_per_sec))
            .then(a.site.cmp(&b.site))
    });
    let series_growth = series_growth(m, sampling, &v.rows);
    push_growth_findings(m, c, it, end, causes, &v, &kept, groups, found);
    push_bounded_notes(causes, &v, &stacks.live_end, found);
    v.rows.truncate(MAX_GROWTH_ROWS.max(v.leaking.len()));
    let groups = ends.finish(m, c, it, causes);
    push_end_findings(m, c, end, &groups, found);
    let teardown = teardown_notes(m, found);
    LeakSections {
        groups,
        growth: v.rows,
        teardown,
        series_growth,
    }
}

/// Live bytes at every sample of each stack of each cause (`series[si]` for stack `owner[si]`),
/// made only for stacks with something live at a sample (everything live at the end is).
struct StackSeries {
    owner: Vec<(usize, StackId)>,
    series: Vec<Vec<i64>>,
    /// Allocations of each stack made in the steady state and still there at the last sample:
    /// what growth is made of.
    kept: Vec<u32>,
    /// Bytes and count live at the end, per cause.
    live_end: Vec<(u64, u64)>,
    /// The stacks of each cause.
    stacks_of: Vec<Vec<usize>>,
}

impl StackSeries {
    /// By difference arrays: one pass over the allocations, which carries `carried`'s.
    fn new(
        m: &TraceModel,
        causes: &Causes,
        sampling: &ProcessSampling,
        carried: &mut impl Carried,
    ) -> Self {
        let k = causes.keys.len();
        // Each (cause, stack) pair's series, once it has one.
        let mut index: Vec<u32> = alloc::vec![u32::MAX; causes.pair_count()];
        let mut owner: Vec<(usize, StackId)> = Vec::new();
        let mut diff: Vec<Vec<i64>> = Vec::new();
        let mut kept: Vec<u32> = Vec::new();
        let mut live_end: Vec<(u64, u64)> = alloc::vec![(0, 0); k];
        // The last allocation's process, time and first sample after it: allocations come in
        // time order, so the next one's samples are searched from there.
        let mut last: Option<(ProcessIdx, u64, usize)> = None;
        let mut samples = None;
        let fields = Causes::FIELDS | Fields::SIZE | Fields::TS | Fields::FREE | carried.fields();
        for a in m.allocs.iter_fields(fields) {
            carried.visit(&a);
            let sm = match samples {
                Some((p, sm)) if p == a.process => sm,
                _ => samples.insert((a.process, sampling.of(a.process))).1,
            };
            let n = sm.len();
            if a.size_bytes == 0 || !a.kind.is_tracked() || n == 0 {
                continue;
            }
            let i0 = match last {
                Some((p, t, k)) if p == a.process && t <= a.ts_nanos => {
                    sm.count_before_from(k, a.ts_nanos)
                }
                _ => sm.partition_point(|t| t < a.ts_nanos),
            };
            last = Some((a.process, a.ts_nanos, i0));
            let i1 = if a.free_ts_nanos >= a.ts_nanos {
                sm.count_before_from(i0, a.free_ts_nanos)
            } else {
                sm.partition_point(|t| t < a.free_ts_nanos)
            };
            if i0 >= i1 {
                continue;
            }
            let pair = causes.pair_of(&a);
            let ci = causes.pair(pair).0;
            let slot = &mut index[pair];
            if *slot == u32::MAX {
                owner.push((ci, a.stack));
                diff.push(alloc::vec![0i64; n + 1]);
                kept.push(0);
                *slot = owner.len() as u32 - 1;
            }
            let si = *slot as usize;
            if i0 > sm.steady() && i1 == n {
                kept[si] += 1;
            }
            let s = i64::try_from(a.size_bytes).unwrap_or(i64::MAX);
            let d = &mut diff[si];
            d[i0] = d[i0].saturating_add(s);
            d[i1] = d[i1].saturating_sub(s);
            if a.is_live() {
                let e = &mut live_end[ci];
                e.0 = e.0.saturating_add(a.size_bytes);
                e.1 += 1;
            }
        }
        let series = diff
            .iter()
            .map(|d| {
                let mut acc = 0i64;
                d[..d.len() - 1]
                    .iter()
                    .map(|x| {
                        acc = acc.saturating_add(*x);
                        acc
                    })
                    .collect()
            })
            .collect();
        let mut stacks_of: Vec<Vec<usize>> = alloc::vec![Vec::new(); k];
        for (si, &(ci, _)) in owner.iter().enumerate() {
            stacks_of[ci].push(si);
        }
        Self {
            owner,
            series,
            kept,
            live_end,
            stacks_of,
        }
    }

    /// The sum of the series of `list`.
    fn sum(&self, list: &[usize]) -> Vec<i64> {
        let mut v = alloc::vec![0i64; list.first().map_or(0, |&si| self.series[si].len())];
        for &si in list {
            for (x, y) in v.iter_mut().zip(&self.series[si]) {
                *x = x.saturating_add(*y);
            }
        }
        v
    }

    /// Whether stack `si` ends above where the steady state began.
    fn grew(&self, si: usize, steady: usize) -> bool {
        let v = &self.series[si];
        let n = v.len();
        n > 0 && v[n - 1] > v[steady.min(n - 1)]
    }
}

/// The verdict on every cause's growth.
struct Verdicts {
    rows: Vec<Growth>,
    leaking: Vec<usize>,
    bounded: Vec<usize>,
    /// The stacks that leak, by (cause, stack), sorted once grouping added the weak ones.
    leak_stacks: Vec<(usize, StackId)>,
    /// Causes that grew steadily but too little to be a leak on their own: part of a leak when
    /// the leaking code runs under them (the loss a training step keeps, holding its graph).
    weak: Vec<(usize, Vec<(usize, StackId)>)>,
}

/// A cause leaks when one of its stacks does, or when the cause as a whole does (then its
/// stacks that grew are the leak). Its leak is those stacks only: a one-time buffer made at
/// the same line is not part of it. Growth is several allocations kept across the steady
/// state, not one buffer that grew.
fn judge_causes(
    m: &TraceModel,
    c: &Config,
    causes: &Causes,
    sampling: &ProcessSampling,
    st: &StackSeries,
) -> Verdicts {
    let stack_leaking: Vec<bool> = st
        .series
        .iter()
        .zip(&st.kept)
        .zip(&st.owner)
        .map(|((v, &kept), &(ci, _))| {
            let sm = sampling.of(causes.keys[ci].0);
            kept >= MIN_KEPT
                && judge(c, v, &sm.iters(), &sm.secs(), sm.steady()).is_some_and(|j| j.leaking)
        })
        .collect();
    let mut out = Verdicts {
        rows: Vec::new(),
        leaking: Vec::new(),
        bounded: Vec::new(),
        leak_stacks: Vec::new(),
        weak: Vec::new(),
    };
    for (ci, list) in st.stacks_of.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let sm = sampling.of(causes.keys[ci].0);
        let (iters, secs, steady, n) = (&sm.iters(), &sm.secs(), sm.steady(), sm.len());
        let whole = st.sum(list);
        let Some(mut jw) = judge(c, &whole, iters, secs, steady) else {
            continue;
        };
        if list.iter().map(|&si| st.kept[si]).sum::<u32>() < MIN_KEPT {
            jw.leaking = false;
            jw.persistent = false;
        }
        let mut leak: Vec<usize> = list
            .iter()
            .copied()
            .filter(|&si| stack_leaking[si])
            .collect();
        if leak.is_empty() && jw.leaking {
            leak = list
                .iter()
                .copied()
                .filter(|&si| st.grew(si, steady))
                .collect();
        }
        let (v, mut j) = if leak.is_empty() {
            (whole, jw)
        } else {
            let v = st.sum(&leak);
            match judge(c, &v, iters, secs, steady) {
                Some(mut j) => {
                    j.leaking = true;
                    (v, j)
                }
                None => (whole, jw),
            }
        };
        if !(j.leaking || j.bounded || j.growth > 0) {
            continue;
        }
        let (process, device, host, label) = &causes.keys[ci];
        let seconds_to_full = if *host || j.per_sec <= 0.0 {
            None
        } else {
            device_capacity(m, *device)
                .map(|cap| cap.saturating_sub(device_used_at_end(m, *device)) as f64 / j.per_sec)
        };
        // A caching allocator's reserve that grows while its pool samples say it is mostly
        // unused is cache filling up, not a leak.
        if causes.allocator[ci] && super::idle_pool(m, *process, *device) {
            j.leaking = false;
        }
        if j.leaking {
            out.leaking.push(ci);
            out.leak_stacks.extend(leak.iter().map(|&si| st.owner[si]));
        } else if j.bounded {
            out.bounded.push(ci);
        } else if jw.persistent {
            let grew = list.iter().copied().filter(|&si| st.grew(si, steady));
            out.weak.push((ci, grew.map(|si| st.owner[si]).collect()));
        }
        out.rows.push(Growth {
            site: label.clone(),
            location: causes.locations[ci].clone(),
            stack: leak
                .first()
                .map_or(causes.top_stack[ci].0, |&si| st.owner[si].1),
            process: *process,
            device: *device,
            pinned_host: *host,
            samples: (n - steady) as u64,
            steady_start_bytes: v[steady.min(n - 1)].max(0) as u64,
            end_bytes: v[n - 1].max(0) as u64,
            bytes_per_iteration: j.per_iteration,
            bytes_per_sec: j.per_sec,
            r: j.r,
            leaking: j.leaking,
            bounded: j.bounded,
            seconds_to_full,
        });
    }
    out
}

/// What the leaking stacks made, and what of it is live at the last sample: the leak's bytes
/// (after an exit, before the shutdown frees). Where a site frees what it allocates (a free
/// that a path skips), an allocation of the last moments that is freed soon after, as the
/// site's allocations usually are, is in flight, not leaked.
struct LeakBytes {
    /// Bytes and count of each cause's leak live at the end.
    end: Vec<(u64, u64)>,
    /// Allocations each cause's leaking stacks made.
    allocated: Vec<u64>,
    /// Causes with a leaking stack.
    lines: Vec<usize>,
    /// Of the causes in a growth finding's group, the bytes of their allocations live at the
    /// end (never freed) per cause and NVTX range name, for the finding's scope.
    live_by_range: HashMap<(usize, crate::format::StringId), u64>,
    /// Of those causes, the index and time of each one's first allocation live at the end.
    first_live: Vec<Option<(usize, u64)>>,
}

/// The pass that measures [`LeakBytes`], one allocation at a time: the lifetimes of the first
/// freed allocations of each cause (their median tells an allocation in flight at the last
/// sample from a kept one), and what each allocation live at the last sample adds. One freed
/// after it waits for the median. The same pass finds what the grouped causes leave live, for
/// their findings (it took a pass per finding).
struct KeptScan<'a> {
    m: &'a TraceModel,
    sampling: &'a ProcessSampling,
    grouped: &'a [bool],
    /// Some cause is grouped, or some line leaks: else no allocation is a leak's, and the pass
    /// has nothing to find.
    active: bool,
    any_grouped: bool,
    ranges: bool,
    /// Per (cause, stack) pair: a leaking stack's, or blocks from before a snapshot's history
    /// at a leaking line.
    leaking: Vec<bool>,
    lifetimes: Vec<Vec<u64>>,
    freed_later: Vec<(usize, u64, u64)>,
    bytes: LeakBytes,
}

impl<'a> KeptScan<'a> {
    fn new(
        m: &'a TraceModel,
        causes: &Causes,
        sampling: &'a ProcessSampling,
        leak_stacks: &[(usize, StackId)],
        grouped: &'a [bool],
    ) -> Self {
        let k = causes.keys.len();
        // Blocks that predate a snapshot's history, of a leaking line, are what it kept before.
        let mut lines: Vec<usize> = leak_stacks.iter().map(|x| x.0).collect();
        lines.dedup();
        let any_grouped = grouped.contains(&true);
        let active = !lines.is_empty() || any_grouped;
        let leaking: Vec<bool> = if active {
            (0..causes.pair_count())
                .map(|p| {
                    let (ci, stack) = causes.pair(p);
                    leak_stacks.binary_search(&(ci, stack)).is_ok()
                        || (causes.prehistory.binary_search(&stack).is_ok() && lines.contains(&ci))
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            m,
            sampling,
            grouped,
            active,
            any_grouped,
            ranges: !m.ranges.is_empty(),
            leaking,
            lifetimes: if active {
                alloc::vec![Vec::new(); k]
            } else {
                Vec::new()
            },
            freed_later: Vec::new(),
            bytes: LeakBytes {
                end: alloc::vec![(0, 0); k],
                allocated: alloc::vec![0; k],
                lines,
                live_by_range: HashMap::new(),
                first_live: alloc::vec![None; k],
            },
        }
    }

    /// The fields [`Self::visit`] reads.
    fn fields(&self) -> Fields {
        let fields = Causes::FIELDS | Fields::SIZE | Fields::TS | Fields::FREE;
        if self.active && self.any_grouped && self.ranges {
            fields | Fields::RANGE_SLOT
        } else {
            fields
        }
    }

    /// Allocation `i`, `a`, of (cause, stack) pair `pair`, of cause `ci`.
    #[inline]
    fn visit(&mut self, i: usize, pair: usize, ci: usize, a: &AllocRecord) {
        if !self.active {
            return;
        }
        let out = &mut self.bytes;
        if self.any_grouped && a.is_live() && self.grouped[ci] {
            out.first_live[ci].get_or_insert((i, a.ts_nanos));
            if self.ranges
                && a.range_slot != 0
                && let Some(name) = self.m.ranges.name(a.range_slot as usize - 1)
            {
                let e = out.live_by_range.entry((ci, name)).or_default();
                // Hostile sizes saturate instead of overflowing.
                *e = u64::saturating_add(*e, a.size_bytes);
            }
        }
        if a.size_bytes == 0 || !a.kind.is_tracked() || !self.leaking[pair] {
            return;
        }
        out.allocated[ci] += 1;
        let at = self
            .sampling
            .of(a.process)
            .last_time()
            .unwrap_or(self.m.last_ts_nanos);
        let lifetime = a.free_ts_nanos.saturating_sub(a.ts_nanos);
        if !a.is_live() && a.free_ts_nanos <= at && self.lifetimes[ci].len() < 4096 {
            self.lifetimes[ci].push(lifetime);
        }
        if !a.live_at(at) {
            return;
        }
        if a.is_live() {
            let e = &mut out.end[ci];
            e.0 = e.0.saturating_add(a.size_bytes);
            e.1 += 1;
        } else {
            self.freed_later.push((ci, lifetime, a.size_bytes));
        }
    }

    fn finish(self) -> LeakBytes {
        let mut out = self.bytes;
        let typical: Vec<Option<u64>> = self
            .lifetimes
            .into_iter()
            .map(|mut l| {
                l.sort_unstable();
                l.get(l.len() / 2).copied()
            })
            .collect();
        for (ci, lifetime, size) in self.freed_later {
            let in_flight = typical[ci].is_some_and(|t| lifetime <= t.saturating_mul(10).max(1));
            if !in_flight {
                let e = &mut out.end[ci];
                e.0 = e.0.saturating_add(size);
                e.1 += 1;
            }
        }
        out
    }
}

/// Growth of every (process, device) series over the steady state, and how much of it the
/// leaking causes explain, for the trend insight.
fn series_growth(
    m: &TraceModel,
    sampling: &ProcessSampling,
    rows: &[Growth],
) -> Vec<(ProcessIdx, DeviceIdx, i64, i64)> {
    // What the leaking rows explain, per (process, device), in one pass over the rows.
    let mut explained_by: HashMap<(ProcessIdx, DeviceIdx), i64> = HashMap::new();
    for r in rows.iter().filter(|r| r.leaking && !r.pinned_host) {
        let e = explained_by.entry((r.process, r.device)).or_default();
        *e = e.saturating_add(super::signed_diff(r.end_bytes, r.steady_start_bytes));
    }
    let mut out = Vec::new();
    for s in m.series.iter().filter(|s| !s.key.host) {
        let sm = sampling.of(s.key.process);
        let (steady, n) = (sm.steady(), sm.len());
        if n > steady + 3 {
            let g = i128::from(s.timeline.value_at(sm.time(n - 1)))
                - i128::from(s.timeline.value_at(sm.time(steady)));
            let explained = explained_by
                .get(&(s.key.process, s.key.device))
                .copied()
                .unwrap_or(0);
            out.push((
                s.key.process,
                s.key.device,
                g.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                explained,
            ));
        }
    }
    out
}

/// One finding per group of leaking causes, named by the frame they share (or, for one line
/// with leaking and freeing paths, the frame that tells them apart).
#[allow(clippy::too_many_arguments)]
fn push_growth_findings(
    m: &TraceModel,
    c: &Config,
    it: &Iterations,
    end: HistoryEnd,
    causes: &Causes,
    v: &Verdicts,
    kept: &LeakBytes,
    groups: Vec<(Vec<usize>, Option<crate::model::FrameView>)>,
    found: &mut Found,
) {
    // Every stack each leaking line allocated from (to tell its leaking paths from the others).
    let mut stacks_by_line: HashMap<usize, Vec<StackId>> = HashMap::new();
    let mut is_line = alloc::vec![false; causes.keys.len()];
    for &ci in &kept.lines {
        is_line[ci] = true;
    }
    // A cause's (cause, stack) pairs are its stacks in the order the history first used them.
    for p in 0..causes.pair_count() {
        let (ci, stack) = causes.pair(p);
        if is_line[ci] {
            let s = stacks_by_line.entry(ci).or_default();
            if s.len() < 64 {
                s.push(stack);
            }
        }
    }
    for (mut members, mut common) in groups {
        members.sort_by_key(|&ci| core::cmp::Reverse(kept.end[ci].0));
        if common.is_none() {
            common = separating_frame(m, c, members[0], &v.leak_stacks, &stacks_by_line);
        }
        let allocs: u64 = members.iter().map(|&ci| kept.allocated[ci]).sum();
        let mut f = growth_finding(m, c, it, causes, &members, &v.rows, kept, allocs, end);
        if let Some(common) = common {
            let loc = format!("{}:{}", common.file, common.line);
            f.evidence.insert(
                0,
                if members.len() > 1 {
                    format!(
                        "the growing allocations are made at {} lines, all under {common}",
                        members.len()
                    )
                } else {
                    format!(
                        "what {} allocates under {common} stays; what it allocates on its other paths is freed",
                        f.site
                    )
                },
            );
            f.headline = f.headline.replacen(&f.location, &loc, 1);
            f.fix = f.fix.replace(&f.location, &loc);
            f.message = f.message.replacen(
                &format!("allocated at {}", f.site),
                &format!("allocated under {common}"),
                1,
            );
            f.site = format!("{common}");
            f.location = loc;
        }
        found.push(f);
    }
}

/// A note for each cause that grew early and then stopped: a cache or pool that filled.
fn push_bounded_notes(causes: &Causes, v: &Verdicts, live_end: &[(u64, u64)], found: &mut Found) {
    for &ci in &v.bounded {
        let Some(g) = v.rows.iter().find(|g| {
            g.site == causes.label(ci)
                && g.process == causes.keys[ci].0
                && g.device == causes.keys[ci].1
                && g.pinned_host == causes.keys[ci].2
        }) else {
            continue;
        };
        let mut f = Finding::new(FindingKind::BoundedGrowth, Severity::Info, g.site.clone());
        f.location = g.location.clone();
        f.stack = Some(g.stack);
        f.bytes = live_end[ci].0;
        f.count = live_end[ci].1;
        f.headline = format!("{} stopped growing at {}", g.site, fmt_bytes(g.end_bytes));
        f.message = format!(
            "{} grew to {} early and then stopped growing: a cache or pool that filled, not a leak",
            g.site,
            fmt_bytes(g.end_bytes)
        );
        f.fix = format!(
            "nothing required; cap the cache at {} if its size matters",
            if g.location.is_empty() {
                &g.site
            } else {
                &g.location
            }
        );
        found.push(f);
    }
}

/// Findings for what is live at the end of causes that do not grow (one note per class for
/// caches, memory live at the end and bounded growth).
fn push_end_findings(
    m: &TraceModel,
    c: &Config,
    end: HistoryEnd,
    groups: &[LeakGroup],
    found: &mut Found,
) {
    let mut aggregated: Vec<(LeakClass, u64, u64, Vec<&LeakGroup>)> = Vec::new();
    for g in groups {
        match g.class {
            LeakClass::Cache | LeakClass::LiveAtEnd | LeakClass::Bounded => {
                if let Some(e) = aggregated.iter_mut().find(|e| e.0 == g.class) {
                    e.1 = e.1.saturating_add(g.site.bytes);
                    e.2 += g.site.count;
                    e.3.push(g);
                } else {
                    aggregated.push((g.class, g.site.bytes, g.site.count, alloc::vec![g]));
                }
            }
            _ => {
                if g.site.bytes >= c.leak_min_bytes {
                    found.push(end_finding(m, c, g));
                }
            }
        }
    }
    for (class, bytes, count, list) in aggregated {
        if class == LeakClass::Bounded {
            continue;
        }
        found.push(aggregate_note(class, bytes, count, &list, end));
    }
}

/// Notes for memory released only by a context teardown, by site.
fn teardown_notes(m: &TraceModel, found: &mut Found) -> Vec<SiteBytes> {
    // Only a context reset releases allocations so; none did in most traces, and the history
    // need not be read for them.
    if m.resets.iter().all(|r| r.freed_count == 0) {
        return Vec::new();
    }
    let teardown = group_by_stack(
        m,
        m.allocs
            .iter_fields(super::facts::GROUP_FIELDS | Fields::FREE)
            .filter(|a| a.free_kind == FreeKind::ContextTeardown && !a.is_live()),
        super::MAX_SITES,
    );
    for t in &teardown {
        let mut f = Finding::new(FindingKind::TeardownRelease, Severity::Info, t.site.clone());
        f.stack = Some(t.stack);
        f.bytes = t.bytes;
        f.count = t.count;
        f.headline = format!("{} released only by a context teardown", fmt_bytes(t.bytes));
        f.message = format!(
            "{} in {} allocation(s) from {} were released only by a context teardown (not a leak)",
            fmt_bytes(t.bytes),
            t.count,
            t.site
        );
        f.fix = format!(
            "nothing required; free them explicitly at {} if the context outlives their use",
            super::site_location(m, t.stack)
        );
        found.push(f);
    }
    teardown
}

#[allow(clippy::too_many_arguments)]
fn growth_finding(
    m: &TraceModel,
    c: &Config,
    it: &Iterations,
    causes: &Causes,
    members: &[usize],
    rows: &[Growth],
    kept: &LeakBytes,
    allocated: u64,
    end: HistoryEnd,
) -> Finding {
    let live_end = &kept.end;
    let row = |ci: usize| {
        let (p, d, h, label) = &causes.keys[ci];
        rows.iter()
            .find(|g| g.site == *label && g.process == *p && g.device == *d && g.pinned_host == *h)
    };
    let main = members[0];
    let (_, device, host, label) = &causes.keys[main];
    let bytes = members
        .iter()
        .map(|&ci| live_end[ci].0)
        .fold(0u64, u64::saturating_add);
    let count: u64 = members.iter().map(|&ci| live_end[ci].1).sum();
    let per_iter: f64 = members
        .iter()
        .filter_map(|&ci| row(ci))
        .map(|g| g.bytes_per_iteration)
        .sum();
    let per_sec: f64 = members
        .iter()
        .filter_map(|&ci| row(ci))
        .map(|g| g.bytes_per_sec)
        .sum();
    let per_hour = per_sec * 3600.0;
    let to_full = if *host || per_sec <= 0.0 {
        None
    } else {
        device_capacity(m, *device)
            .map(|cap| cap.saturating_sub(device_used_at_end(m, *device)) as f64 / per_sec)
    };
    let cap = device_capacity(m, *device).unwrap_or(u64::MAX);
    let harm = (bytes as f64 + per_hour.max(0.0)).min(cap as f64) as u64;
    let severity = if to_full.is_some_and(|s| s <= 86_400.0) || bytes > c.leak_critical_bytes {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let loc = if causes.locations[main].is_empty() {
        label.clone()
    } else {
        causes.locations[main].clone()
    };
    let unit = it.unit();
    let memory = if *host {
        "pinned host memory"
    } else {
        "device memory"
    };
    // A site that frees most of what it allocates, but not all: a path skips the free.
    let missed = allocated >= 2 * count.max(1);
    let kind = if missed {
        FindingKind::MissedFree
    } else {
        FindingKind::LeakGrowth
    };
    let mut f = Finding::new(kind, severity, label.clone());
    f.device = (!*host).then_some(*device);
    f.scope = range_of(m, kept, members);
    f.location = causes.locations[main].clone();
    f.stack = Some(causes.top_stack[main].0);
    f.bytes = bytes;
    f.count = count;
    f.bytes_per_iteration = Some(per_iter);
    f.bytes_per_hour = Some(per_hour);
    f.seconds_to_full = to_full;
    f.harm_bytes = harm;
    // When the first allocation the finding counts was made.
    f.ts_nanos = members
        .iter()
        .filter_map(|&ci| kept.first_live[ci])
        .min_by_key(|&(i, _)| i)
        .map(|(_, ts)| ts);
    let full = to_full.map(super::full_in).unwrap_or_default();
    f.headline = format!(
        "leaks {} per {unit} at {loc}{full}",
        fmt_bytes(per_iter.max(0.0) as u64)
    );
    let ended = match end {
        HistoryEnd::Snapshot => "live at the snapshot",
        HistoryEnd::Exited => "live when the program stopped allocating",
        _ => "live when the history ended",
    };
    let mut places: Vec<(u32, u32)> = members
        .iter()
        .map(|&ci| (causes.keys[ci].0.0, causes.keys[ci].1.0))
        .collect();
    places.sort_unstable();
    places.dedup();
    let places: Vec<String> = places
        .iter()
        .map(|(p, d)| format!("process {p}, device {d}"))
        .collect();
    f.message = format!(
        "{memory} allocated at {label} ({}) grows {} per {unit} ({}/h) across the steady-state {unit}s; {} in {count} allocation(s) {ended}",
        places.join("; "),
        fmt_bytes(per_iter.max(0.0) as u64),
        fmt_bytes(per_hour.max(0.0) as u64),
        fmt_bytes(bytes)
    );
    for &ci in members {
        if let Some(g) = row(ci) {
            f.evidence.push(format!(
                "{}: {} at the first steady-state {unit}, {} at the end, {} per {unit} (r = {:.2}, {} samples)",
                g.site,
                fmt_bytes(g.steady_start_bytes),
                fmt_bytes(g.end_bytes),
                fmt_bytes(g.bytes_per_iteration.max(0.0) as u64),
                g.r,
                g.samples
            ));
        }
    }
    f.evidence.push(format!(
        "{}s from {} ({} of them, {} warm-up, median period {})",
        unit,
        it.label,
        it.count,
        it.warmup,
        fmt_duration(it.median_period_nanos)
    ));
    if let Some(s) = to_full {
        f.evidence.push(format!(
            "at {}/s the device's free memory lasts {}",
            fmt_bytes(per_sec.max(0.0) as u64),
            fmt_duration((s * 1e9) as u64)
        ));
    }
    let python = causes.python[main];
    if missed {
        f.evidence.push(format!(
            "{} of the {allocated} allocations made at {loc} were freed; {count} were not",
            allocated - count
        ));
    }
    f.fix = if missed {
        format!(
            "free on the error path (exception or early return) after the allocation at {loc}: use try/finally or a guard"
        )
    } else if python {
        format!(
            "something keeps what {loc} allocates every {unit}: store plain numbers (.item()) or detached tensors instead of tensors that hold their graph, and bound or clear the list or cache that keeps them"
        )
    } else {
        format!(
            "free what {loc} allocates every {unit} once it is used, or bound the container that keeps it"
        )
    };
    f
}

/// The NVTX range most of the members' allocations live at the end were made in.
fn range_of(m: &TraceModel, kept: &LeakBytes, members: &[usize]) -> Option<String> {
    let mut by: HashMap<crate::format::StringId, u64> = HashMap::new();
    for (&(ci, name), &bytes) in &kept.live_by_range {
        if members.contains(&ci) {
            let e = by.entry(name).or_default();
            *e = e.saturating_add(bytes);
        }
    }
    by.into_iter()
        .max_by_key(|&(name, bytes)| (bytes, core::cmp::Reverse(name)))
        .map(|(name, _)| m.string(name).into())
}

/// What is live at the end for causes that do not grow, one allocation at a time: per cause,
/// what its stacks that do not leak hold live, and its allocations, frees and freed lifetimes
/// (for "old" live allocations).
struct EndScan {
    by: Vec<Option<EndAcc>>,
    counts: Vec<(u64, u64, Vec<u64>)>,
    /// Per (cause, stack) pair: a leaking stack's (a growth finding has its memory).
    leaking: Vec<bool>,
}

struct EndAcc {
    bytes: u64,
    count: u64,
    first_ts: u64,
    last_ts: u64,
    threads: Vec<ThreadIdx>,
}

impl EndScan {
    /// The fields [`Self::visit`] reads.
    const FIELDS: Fields = Causes::FIELDS
        .and(Fields::SIZE)
        .and(Fields::FREE)
        .and(Fields::TS)
        .and(Fields::THREAD);

    fn new(causes: &Causes, leak_stacks: &[(usize, StackId)]) -> Self {
        let k = causes.keys.len();
        Self {
            by: (0..k).map(|_| None).collect(),
            counts: alloc::vec![(0, 0, Vec::new()); k],
            leaking: (0..causes.pair_count())
                .map(|p| leak_stacks.binary_search(&causes.pair(p)).is_ok())
                .collect(),
        }
    }

    /// Allocation `a`, of (cause, stack) pair `pair`, of cause `ci`.
    #[inline]
    fn visit(&mut self, pair: usize, ci: usize, a: &AllocRecord) {
        if a.size_bytes == 0 || !a.kind.is_tracked() {
            return;
        }
        let e = &mut self.counts[ci];
        e.0 += 1;
        if !a.is_live() {
            e.1 += 1;
            if e.2.len() < 4096 {
                e.2.push(a.free_ts_nanos.saturating_sub(a.ts_nanos));
            }
            return;
        }
        if self.leaking[pair] {
            return;
        }
        let g = self.by[ci].get_or_insert(EndAcc {
            bytes: 0,
            count: 0,
            first_ts: a.ts_nanos,
            last_ts: a.ts_nanos,
            threads: Vec::new(),
        });
        g.bytes = g.bytes.saturating_add(a.size_bytes);
        g.count += 1;
        g.first_ts = g.first_ts.min(a.ts_nanos);
        g.last_ts = g.last_ts.max(a.ts_nanos);
        if !g.threads.contains(&a.thread) && g.threads.len() < 16 {
            g.threads.push(a.thread);
        }
    }

    /// Classifies each cause's live memory.
    fn finish(
        self,
        m: &TraceModel,
        c: &Config,
        it: &Iterations,
        causes: &Causes,
    ) -> Vec<LeakGroup> {
        let (by, mut counts) = (self.by, self.counts);
        let last = m.last_ts_nanos;
        let duration = m.duration_nanos();
        let idle = ((duration as f64 * c.thread_idle_fraction) as u64).max(1);
        let mut out = Vec::new();
        // The last activity of each process (any of its threads), and how each history ends.
        let mut process_last_ts: HashMap<ProcessIdx, u64> = HashMap::new();
        for (&(p, _), &t) in &m.thread_last_ts {
            let e = process_last_ts.entry(p).or_default();
            *e = (*e).max(t);
        }
        let end_of = super::history::ends_by_process(m);
        // In cause order, so that groups the sort below ranks equal (the same bytes at the same
        // line, in several processes) keep one order from run to run.
        let groups = by
            .into_iter()
            .enumerate()
            .filter_map(|(ci, g)| Some((ci, g?)));
        for (ci, mut g) in groups {
            g.threads.sort();
            let (process, _, host, label) = &causes.keys[ci];
            let end = end_of(*process);
            let (alloc_count, free_count, mut lifetimes) = core::mem::take(&mut counts[ci]);
            let thread_last = g
                .threads
                .iter()
                .map(|t| m.thread_last_ts.get(&(*process, *t)).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            // The thread went quiet while its process went on: a whole process that stops
            // allocating (a program in its last phase, or killed) has not lost a thread.
            let process_last = process_last_ts.get(process).copied().unwrap_or(0);
            let thread_gone = duration > 0
                && last.saturating_sub(thread_last) >= idle
                && last.saturating_sub(g.last_ts) >= idle
                && process_last.saturating_sub(thread_last) >= idle;
            // Live allocations much older than the site's freed ones usually get.
            lifetimes.sort_unstable();
            let typical = lifetimes.get(lifetimes.len() / 2).copied().unwrap_or(0);
            let old_after = typical
                .saturating_mul(10)
                .max(it.median_period_nanos.saturating_mul(3));
            let old = last.saturating_sub(g.last_ts) > old_after;
            // A caching allocator's reserve, or memory only a library's code allocated (its own
            // caches: pinned staging buffers, workspaces), is held for reuse, whoever allocated it.
            let class = if causes.allocator[ci] || causes.library[ci] {
                LeakClass::Cache
            } else if thread_gone {
                LeakClass::ThreadExited
            } else if end.program_finished() && free_count > 0 && (!causes.python[ci] || old) {
                // A native program frees nothing after it exits; a garbage-collected one may still
                // hold its last iteration's buffers, so only old ones count there.
                LeakClass::MissedFree
            } else if end.program_finished() && !causes.python[ci] {
                LeakClass::NeverFreed
            } else {
                LeakClass::LiveAtEnd
            };
            let stack = causes.top_stack[ci].0;
            out.push(LeakGroup {
                class,
                site: SiteBytes {
                    stack,
                    site: label.clone(),
                    frames: m
                        .stack_frames(stack)
                        .iter()
                        .map(alloc::string::ToString::to_string)
                        .collect(),
                    bytes: g.bytes,
                    count: g.count,
                    threads: g.threads,
                },
                location: causes.locations[ci].clone(),
                pinned_host: *host,
                first_ts_nanos: g.first_ts,
                last_ts_nanos: g.last_ts,
                site_alloc_count: alloc_count,
                site_free_count: free_count,
                thread_last_ts_nanos: thread_gone.then_some(thread_last),
            });
        }
        out.sort_by(|a, b| {
            b.site
                .bytes
                .cmp(&a.site.bytes)
                .then(a.site.site.cmp(&b.site.site))
        });
        out
    }
}

fn end_finding(m: &TraceModel, c: &Config, g: &LeakGroup) -> Finding {
    let s = &g.site;
    let loc = if g.location.is_empty() {
        s.site.clone()
    } else {
        g.location.clone()
    };
    let severity = if s.bytes > c.leak_critical_bytes {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let memory = if g.pinned_host {
        "pinned host memory"
    } else {
        "device memory"
    };
    let threads: Vec<String> = s.threads.iter().map(|t| format!("{}", t.0)).collect();
    let threads = threads.join(", ");
    let (kind, headline, message, fix) = match g.class {
        LeakClass::MissedFree => (
            FindingKind::MissedFree,
            format!(
                "{} never freed at {loc} (a path skips the free)",
                fmt_bytes(s.bytes)
            ),
            format!(
                "{} of {memory} in {} allocation(s) from {} are still live at exit, while {} of its {} allocations were freed",
                fmt_bytes(s.bytes),
                s.count,
                s.site,
                g.site_free_count,
                g.site_alloc_count
            ),
            format!(
                "free on the error path (exception or early return) after the allocation at {loc}: use try/finally or a guard"
            ),
        ),
        LeakClass::ThreadExited => (
            FindingKind::ThreadExitLeak,
            format!(
                "{} left at {loc} by a thread that ended",
                fmt_bytes(s.bytes)
            ),
            format!(
                "{} of {memory} in {} allocation(s) from {} were left by thread {threads}, idle for the last {} of the trace",
                fmt_bytes(s.bytes),
                s.count,
                s.site,
                fmt_duration(
                    m.last_ts_nanos
                        .saturating_sub(g.thread_last_ts_nanos.unwrap_or(0))
                )
            ),
            format!(
                "free the buffers allocated at {loc} before the thread exits (or hand them to a thread that frees them)"
            ),
        ),
        _ => (
            FindingKind::LeakAtExit,
            format!("{} never freed at {loc}", fmt_bytes(s.bytes)),
            format!(
                "{} of {memory} in {} allocation(s) from {} (thread {threads}) are still live at exit; this call site never frees",
                fmt_bytes(s.bytes),
                s.count,
                s.site
            ),
            format!("free these buffers when they are no longer needed (allocated at {loc})"),
        ),
    };
    let mut f = Finding::new(kind, severity, s.site.clone());
    f.location = g.location.clone();
    f.stack = Some(s.stack);
    f.bytes = s.bytes;
    f.count = s.count;
    f.ts_nanos = Some(g.first_ts_nanos);
    f.harm_bytes = s.bytes;
    f.headline = headline;
    f.message = message;
    f.fix = fix;
    f
}

fn aggregate_note(
    class: LeakClass,
    bytes: u64,
    count: u64,
    list: &[&LeakGroup],
    end: HistoryEnd,
) -> Finding {
    let top: Vec<String> = list
        .iter()
        .take(3)
        .map(|g| format!("{} from {}", fmt_bytes(g.site.bytes), g.site.site))
        .collect();
    let (kind, headline, message, fix) = match class {
        LeakClass::Cache => (
            FindingKind::Cache,
            format!("{} held as allocator cache at the end", fmt_bytes(bytes)),
            format!(
                "{} in {count} allocation(s) are a caching allocator's or pool's reserve at the end (largest: {}): ready for reuse, not a leak",
                fmt_bytes(bytes),
                top.join(", ")
            ),
            String::from(
                "nothing required; release it with torch.cuda.empty_cache(), cudaMemPoolTrimTo or a lower release threshold if other processes need the memory",
            ),
        ),
        _ => (
            FindingKind::LiveAtEnd,
            format!("{} in use when the history ended", fmt_bytes(bytes)),
            format!(
                "{} in {count} allocation(s) were live at the end ({}), in use rather than leaked (largest: {})",
                fmt_bytes(bytes),
                end.describe(),
                top.join(", ")
            ),
            String::from("nothing required"),
        ),
    };
    let mut f = Finding::new(
        kind,
        Severity::Info,
        list.first()
            .map_or_else(String::new, |g| g.site.site.clone()),
    );
    f.bytes = bytes;
    f.count = count;
    f.stack = list.first().map(|g| g.site.stack);
    f.headline = headline;
    f.message = message;
    f.fix = fix;
    f
}
