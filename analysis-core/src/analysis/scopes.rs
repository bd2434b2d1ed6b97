//! Growth per scope: the reference `memory_leak` rule, per NVTX range name (each instance is one
//! call) or, in a trace without NVTX ranges, per call site (each allocation is one call, and its
//! growth is its size minus what the site freed before its next call). Then bounded growth
//! (the last third of the calls adds almost nothing) is told from unbounded growth. A table
//! for the report; the findings come from `leaks`.

use alloc::collections::BinaryHeap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Reverse;
use hashbrown::HashMap;

use super::{Config, SiteIndex, site_label};
use crate::format::{StackId, StringId};
use crate::model::{Fields, LIVE, TraceModel};
pub use crate::report::{ScopeGrowth, ScopeKind};
use gpucollect_trace::range_store::NameCursor;

/// How many call-site scopes are kept in the report (NVTX scopes are all kept).
const MAX_CALL_SITE_SCOPES: usize = 50;

/// The growth of every scope, for the report's scope table. Findings come from the
/// per-iteration growth of causes (`leaks`), which this table only details: one cause, one
/// finding.
pub fn analyze(m: &TraceModel, c: &Config, sites: &SiteIndex) -> Vec<ScopeGrowth> {
    let mut pass = ScopePass::new(m, sites);
    if pass.active {
        super::run_alone(m, &mut pass);
    }
    analyze_after(m, c, sites, pass)
}

/// [`analyze`], its pass over the allocations made already (`pass`, carried by another).
pub(crate) fn analyze_after(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    pass: ScopePass<'_>,
) -> Vec<ScopeGrowth> {
    let mut out = if m.ranges.is_empty() {
        call_site_scopes(m, c, sites, pass.calls)
    } else {
        let (scopes, kept) = pass.finish();
        nvtx_scopes(m, c, scopes, &kept)
    };
    out.sort_by(|a, b| {
        b.total_growth_bytes
            .cmp(&a.total_growth_bytes)
            .then(a.scope.cmp(&b.scope))
    });
    out
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// One scope's growth per call, summed call by call: all the reference rule and the
/// bounded-growth test read, so the calls' growth need not be kept.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Growth {
    calls: u64,
    total: i64,
    positive: u64,
    /// The growth of the last third of the calls.
    tail: i64,
}

impl Growth {
    /// Adds the next call's growth `d`, of a scope with `n` calls in all.
    fn add(&mut self, n: u64, d: i64) {
        self.total = self.total.saturating_add(d);
        self.positive += u64::from(d > 0);
        if self.calls >= n - n / 3 {
            self.tail = self.tail.saturating_add(d);
        }
        self.calls += 1;
    }

    /// The growth of calls `diffs`, in order.
    fn of(diffs: &[i64]) -> Self {
        let mut g = Self::default();
        for &d in diffs {
            g.add(diffs.len() as u64, d);
        }
        g
    }
}

/// The reference rule plus the bounded-growth test over one scope's per-call growth.
fn judge(c: &Config, g: &Growth) -> (i64, f64, f64, i64, bool, bool) {
    let n = g.calls;
    let total = g.total;
    let avg = if n > 0 { total as f64 / n as f64 } else { 0.0 };
    let ratio = if n > 0 {
        g.positive as f64 / n as f64
    } else {
        0.0
    };
    let tail = g.tail;
    let reference = n >= c.min_calls_for_analysis
        && avg > 0.0
        && ratio > c.memory_leak_ratio
        && total > c.leak_total_growth_bytes as i64;
    let bounded = c.detect_bounded_growth
        && total > 0
        && (tail as f64) <= c.bounded_tail_fraction * total as f64;
    (total, avg, ratio, tail, reference, bounded)
}

/// NVTX scopes: a scope per (name, domain) of the range instances, numbered in the order they
/// first begin, with each scope's ended instances (its calls) and highest peak. A scope is
/// found from an instance's name and domain when it is needed, not kept per instance: memory
/// by scope, not by history (4 bytes an instance had been 36 MB at 9.6 M instances).
pub(crate) struct NvtxScopes {
    index: HashMap<(StringId, StringId), u32>,
    /// The scope of each name that has one domain, by the name's id (below
    /// [`BY_NAME_IDS`]): an instance's scope is then one read of its name.
    by_name: Vec<u32>,
    pub names: Vec<String>,
    /// Ended instances per scope.
    calls: Vec<u64>,
    /// The highest peak of an ended instance per scope.
    peaks: Vec<u64>,
}

/// Names with ids below this find their scope by id (4 MiB at most).
const BY_NAME_IDS: u32 = 1 << 20;
/// In `by_name`: a name no instance has.
const NO_SCOPE: u32 = u32::MAX;
/// In `by_name`: a name of several domains, whose scope the domain decides.
const SEVERAL: u32 = u32::MAX - 1;

impl NvtxScopes {
    fn empty() -> Self {
        Self {
            index: HashMap::new(),
            by_name: Vec::new(),
            names: Vec::new(),
            calls: Vec::new(),
            peaks: Vec::new(),
        }
    }

    /// The scope of an instance's (name, domain).
    #[inline]
    fn of(&self, name: StringId, domain: StringId) -> u32 {
        match self.by_name.get(name.0 as usize) {
            Some(&k) if k < SEVERAL => k,
            // Every (name, domain) of the instances has one (`nvtx_scope_index`).
            _ => self.index.get(&(name, domain)).copied().unwrap_or(0),
        }
    }

    /// The scope of instance `slot` (index + 1), if there is such an instance, its name read
    /// through `names`.
    #[inline]
    pub(crate) fn of_slot(
        &self,
        m: &TraceModel,
        names: &mut NameCursor<'_>,
        slot: u32,
    ) -> Option<u32> {
        let i = (slot as usize).checked_sub(1)?;
        let name = names.name(i)?;
        match self.by_name.get(name.0 as usize) {
            Some(&k) if k < SEVERAL => Some(k),
            _ => {
                let (name, domain) = m.ranges.name_and_domain(i)?;
                self.index.get(&(name, domain)).copied()
            }
        }
    }
}

/// The scope of each allocation's instance, looked up once per run of allocations from one
/// instance (they come in runs), its name read through a [`NameCursor`].
pub(crate) struct ScopeOfSlot<'a> {
    scopes: &'a NvtxScopes,
    names: NameCursor<'a>,
    last: (u32, Option<u32>),
}

impl<'a> ScopeOfSlot<'a> {
    pub(crate) fn new(m: &'a TraceModel, scopes: &'a NvtxScopes) -> Self {
        Self {
            scopes,
            names: m.ranges.names(),
            last: (0, None),
        }
    }

    /// The scope of instance `slot`; none for slot 0 (no instance).
    #[inline]
    pub(crate) fn get(&mut self, m: &TraceModel, slot: u32) -> Option<u32> {
        if slot != self.last.0 {
            self.last = (slot, self.scopes.of_slot(m, &mut self.names, slot));
        }
        self.last.1
    }
}

pub(crate) fn nvtx_scope_index(m: &TraceModel) -> NvtxScopes {
    let mut scopes = NvtxScopes::empty();
    for r in &m.ranges {
        let next = scopes.index.len() as u32;
        let k = *scopes.index.entry((r.name, r.domain)).or_insert(next);
        if k as usize == scopes.names.len() {
            scopes.names.push(if m.string(r.domain).is_empty() {
                String::from(m.string(r.name))
            } else {
                format!("{}::{}", m.string(r.domain), m.string(r.name))
            });
            scopes.calls.push(0);
            scopes.peaks.push(0);
            if r.name.0 < BY_NAME_IDS {
                let n = r.name.0 as usize;
                if scopes.by_name.len() <= n {
                    scopes.by_name.resize(n + 1, NO_SCOPE);
                }
                let b = &mut scopes.by_name[n];
                *b = if *b == NO_SCOPE { k } else { SEVERAL };
            }
        }
        if r.end_ts_nanos.is_some() {
            scopes.calls[k as usize] += 1;
            scopes.peaks[k as usize] = scopes.peaks[k as usize].max(r.peak_bytes);
        }
    }
    scopes
}

/// Bytes each call site kept beyond the end of an instance of each scope it was allocated in
/// (the instance itself or one it runs inside), by (scope, stack).
#[cfg(test)]
fn kept_beyond_instances(m: &TraceModel) -> HashMap<(u32, StackId), u64> {
    let sites = SiteIndex::new(m);
    let mut pass = ScopePass::new(m, &sites);
    super::run_alone(m, &mut pass);
    pass.finish().1
}

/// The scopes' pass over the allocations, one at a time, so that another pass can carry it
/// ([`super::Carried`]: the leaks detector's first, one decoding of the history for both): in
/// a trace with NVTX ranges, the bytes each call site kept beyond the end of an instance of
/// each scope it was allocated in (the instance itself or one it runs inside), by (scope,
/// stack). A trace without ranges has its scopes per call site: their two rounds ride on two
/// passes of the carrier ([`CallSites`]), or are made apart.
pub(crate) struct ScopePass<'a> {
    m: &'a TraceModel,
    /// Whether the trace has NVTX ranges: the first round only.
    active: bool,
    calls: CallSites<'a>,
    scopes: NvtxScopes,
    kept: HashMap<(u32, StackId), u64>,
    /// The instances an allocation's instance runs in (itself first, at most 64), as (end,
    /// scope): kept for the last instance, since allocations come in runs from one instance.
    chain_of: u32,
    chain: Vec<(Option<u64>, u32)>,
    /// The instances' names, for their scopes.
    names: NameCursor<'a>,
}

impl<'a> ScopePass<'a> {
    pub(crate) fn new(m: &'a TraceModel, sites: &'a SiteIndex) -> Self {
        let active = !m.ranges.is_empty();
        Self {
            m,
            active,
            calls: if active {
                CallSites::Off
            } else {
                CallSites::Counting {
                    sites,
                    per_site: alloc::vec![0; sites.len()],
                    in_order: true,
                    frees_follow: true,
                    last: 0,
                }
            },
            scopes: if active {
                nvtx_scope_index(m)
            } else {
                NvtxScopes::empty()
            },
            kept: HashMap::new(),
            chain_of: 0,
            chain: Vec::new(),
            names: m.ranges.names(),
        }
    }

    /// The scopes and, by (scope, stack), the bytes kept beyond their instances.
    fn finish(self) -> (NvtxScopes, HashMap<(u32, StackId), u64>) {
        (self.scopes, self.kept)
    }
}

impl super::Carried for ScopePass<'_> {
    fn fields(&self) -> Fields {
        if self.active {
            Fields::RANGE_SLOT | Fields::KIND | Fields::FREE | Fields::STACK | Fields::SIZE
        } else {
            self.calls.fields()
        }
    }

    #[inline(always)]
    fn visit(&mut self, a: &crate::model::AllocRecord) {
        if !self.active {
            if !matches!(self.calls, CallSites::Off | CallSites::Counted { .. }) {
                self.calls.visit(a);
            }
            return;
        }
        if a.range_slot == 0 || !a.kind.is_device_memory() {
            return;
        }
        if a.range_slot != self.chain_of {
            self.chain.clear();
            self.chain_of = a.range_slot;
            let mut slot = a.range_slot;
            while slot != 0 && self.chain.len() < 64 {
                let Some((end, parent)) = self.m.ranges.end_and_parent(slot as usize - 1) else {
                    break;
                };
                let scope = self
                    .scopes
                    .of_slot(self.m, &mut self.names, slot)
                    .unwrap_or(0);
                self.chain.push((end, scope));
                slot = parent;
            }
        }
        for &(end, scope) in &self.chain {
            match end {
                Some(end) if a.free_ts_nanos == LIVE || a.free_ts_nanos > end => {
                    let e = self.kept.entry((scope, a.stack)).or_default();
                    *e = e.saturating_add(a.size_bytes);
                }
                _ => {}
            }
        }
    }

    fn end_pass(&mut self) {
        // The NVTX scopes take one round.
        self.active = false;
        self.calls.end_pass();
    }
}

/// The call-site scopes' rounds when another pass carries them: the calls counted per site
/// (and whether the history is in order) on the carrier's first pass, then swept on its second
/// ([`Sweep`]); those left undone are made apart ([`call_site_scopes`]).
enum CallSites<'a> {
    /// None carried: a trace with NVTX ranges.
    Off,
    Counting {
        sites: &'a SiteIndex,
        per_site: Vec<u64>,
        in_order: bool,
        /// No call freed before it was made.
        frees_follow: bool,
        last: u64,
    },
    Sweeping {
        sites: &'a SiteIndex,
        sweep: Sweep,
    },
    /// The calls per site, and their growth where the sweep could make it (a history in order
    /// whose queue of frees stayed short); `by_time` where a sweep of the calls in time order
    /// could (their times step back, but no free comes before its call).
    Counted {
        per_site: Vec<u64>,
        growth: Option<Vec<Growth>>,
        by_time: bool,
    },
}

impl CallSites<'_> {
    fn fields(&self) -> Fields {
        match self {
            Self::Counting { .. } => Fields::KIND | Fields::STACK | Fields::TS | Fields::FREE,
            Self::Sweeping { .. } => CALL_FIELDS,
            Self::Off | Self::Counted { .. } => Fields::NONE,
        }
    }

    #[inline]
    fn visit(&mut self, a: &crate::model::AllocRecord) {
        match self {
            Self::Counting {
                sites,
                per_site,
                in_order,
                frees_follow,
                last,
            } => {
                if let Some(c) = call(sites, a) {
                    per_site[c.site] += 1;
                    let follows = c.free == LIVE || c.free >= c.ts;
                    *in_order &= c.ts >= *last && follows;
                    *frees_follow &= follows;
                    *last = c.ts;
                }
            }
            Self::Sweeping { sites, sweep, .. } => {
                if let Some(c) = call(sites, a) {
                    sweep.visit(c);
                }
            }
            Self::Off | Self::Counted { .. } => {}
        }
    }

    fn end_pass(&mut self) {
        *self = match core::mem::replace(self, Self::Off) {
            Self::Counting {
                sites,
                per_site,
                in_order,
                frees_follow,
                ..
            } => {
                if in_order {
                    Self::Sweeping {
                        sites,
                        sweep: Sweep::new(per_site),
                    }
                } else {
                    Self::Counted {
                        per_site,
                        growth: None,
                        by_time: frees_follow,
                    }
                }
            }
            Self::Sweeping { sweep, .. } => {
                let (per_site, growth) = sweep.finish();
                Self::Counted {
                    per_site,
                    growth,
                    by_time: false,
                }
            }
            done => done,
        };
    }
}

fn nvtx_scopes(
    m: &TraceModel,
    c: &Config,
    scopes: NvtxScopes,
    kept: &HashMap<(u32, StackId), u64>,
) -> Vec<ScopeGrowth> {
    // Each scope's growth per call, summed in order (a scope's calls are its ended
    // instances, counted by `nvtx_scope_index`), and which scopes run inside which (parent
    // scope, child scope), from the instance tree: one pass over the instances.
    let mut growth: Vec<Growth> = alloc::vec![Growth::default(); scopes.names.len()];
    let mut nesting: Vec<(u32, u32)> = Vec::new();
    let mut parents = m.ranges.names();
    for r in &m.ranges {
        let k = scopes.of(r.name, r.domain);
        if r.end_ts_nanos.is_some() {
            let d = super::signed_diff(r.live_after_bytes, r.live_before_bytes);
            growth[k as usize].add(scopes.calls[k as usize], d);
        }
        if r.parent_slot != 0
            && let Some(p) = scopes.of_slot(m, &mut parents, r.parent_slot)
            && p != k
            && !nesting.contains(&(p, k))
        {
            nesting.push((p, k));
        }
    }
    let mut top: Vec<Option<(StackId, u64)>> = alloc::vec![None; scopes.names.len()];
    for (&(k, stack), &bytes) in kept {
        let t = &mut top[k as usize];
        if t.is_none_or(|(s, b)| bytes > b || (bytes == b && stack < s)) {
            *t = Some((stack, bytes));
        }
    }
    let NvtxScopes { names, peaks, .. } = scopes;
    let mut out = Vec::new();
    for (k, g) in growth.iter().enumerate() {
        if g.calls == 0 {
            continue;
        }
        let (total, avg, ratio, tail, reference, bounded) = judge(c, g);
        out.push(ScopeGrowth {
            explained_by: None,
            scope: names[k].clone(),
            kind: ScopeKind::NvtxRange,
            calls: g.calls,
            total_growth_bytes: total,
            avg_growth_bytes: avg,
            positive_ratio: ratio,
            tail_growth_bytes: tail,
            reference_leak: reference,
            bounded,
            max_peak_bytes: peaks[k],
            top_stack: top[k].map(|t| t.0),
            top_site: top[k].map(|t| m.stack_label(t.0)),
            top_site_bytes: top[k].map_or(0, |t| t.1),
        });
    }
    // A growing scope whose growth an enclosed growing scope explains is not a second leak.
    let leaking: Vec<bool> = out.iter().map(|s| s.reference_leak && !s.bounded).collect();
    let index_of = |name: &str| out.iter().position(|s| s.scope == name);
    let mut explained: Vec<(usize, String)> = Vec::new();
    for (i, s) in out.iter().enumerate() {
        if !leaking[i] || s.total_growth_bytes <= 0 {
            continue;
        }
        let Some(k) = names.iter().position(|n| *n == s.scope) else {
            continue;
        };
        for &(p, ch) in &nesting {
            if p as usize != k {
                continue;
            }
            let child = &names[ch as usize];
            if let Some(j) = index_of(child)
                && leaking[j]
                && out[j].total_growth_bytes as f64 >= 0.9 * s.total_growth_bytes as f64
            {
                explained.push((i, child.clone()));
                break;
            }
        }
    }
    for (i, child) in explained {
        out[i].explained_by = Some(child);
    }
    out
}

/// A call of a call-site scope: one device allocation of site `site`.
#[derive(Clone, Copy, Debug)]
struct Call {
    site: usize,
    ts: u64,
    size: u64,
    /// `LIVE` while not freed.
    free: u64,
}

/// Each site's growth per call, by one sweep through time: a call's growth is its size less
/// the frees of the site from its time until the site's next call (the free belongs to the
/// site's last call at or before it), so a call's growth is final once the site's next call
/// starts. The sweep keeps each site's open call and a queue of the frees still to come:
/// memory bounded by what is live at once, not by the calls. `calls` must be in time order,
/// each freed at or after its time ([`growth_by_vectors`] takes any history). None when more
/// than `max_queued` frees wait at once (a queue entry takes 24 bytes, a call 16 in the
/// vectors: a history whose calls mostly live long is summed there instead).
#[cfg(test)]
fn growth_by_sweep(
    per_site: &[u64],
    calls: impl Iterator<Item = Call>,
    max_queued: usize,
) -> Option<Vec<Growth>> {
    let mut sweep = Sweep::new(per_site.to_vec());
    sweep.max_queued = max_queued;
    for c in calls {
        sweep.visit(c);
    }
    sweep.finish().1
}

/// The state of [`growth_by_sweep`]'s sweep, fed one call at a time.
struct Sweep {
    /// Calls per site.
    per_site: Vec<u64>,
    growth: Vec<Growth>,
    /// Each site's open call's growth so far.
    open: Vec<Option<i64>>,
    /// (free time, site, size) of the calls freed later.
    frees: BinaryHeap<Reverse<(u64, usize, u64)>>,
    max_queued: usize,
    /// The queue grew past `max_queued`: the sweep stopped.
    over: bool,
}

impl Sweep {
    /// A sweep of the calls counted in `per_site`, whose queue may hold two thirds of them
    /// (the queue never takes more than the vectors would).
    fn new(per_site: Vec<u64>) -> Self {
        let max_queued = per_site.iter().sum::<u64>().saturating_mul(2) / 3;
        Self {
            growth: alloc::vec![Growth::default(); per_site.len()],
            open: alloc::vec![None; per_site.len()],
            per_site,
            frees: BinaryHeap::new(),
            max_queued: usize::try_from(max_queued).unwrap_or(usize::MAX),
            over: false,
        }
    }

    /// The site's open call, its growth less `size`.
    fn free(open: &mut [Option<i64>], site: usize, size: u64) {
        if let Some(d) = &mut open[site] {
            *d = d.saturating_sub(signed(size));
        }
    }

    /// The next call in time order. Out of line: inlined into both loops of the pass that
    /// carries it (the leaks detector's), it made them slower, with NVTX ranges too.
    #[inline(never)]
    fn visit(&mut self, c: Call) {
        if self.over {
            return;
        }
        while let Some(&Reverse((t, site, size))) = self.frees.peek()
            && t < c.ts
        {
            self.frees.pop();
            Self::free(&mut self.open, site, size);
        }
        if let Some(d) = self.open[c.site].replace(signed(c.size)) {
            self.growth[c.site].add(self.per_site[c.site], d);
        }
        if c.free != LIVE {
            if self.frees.len() >= self.max_queued {
                self.over = true;
                return;
            }
            self.frees.push(Reverse((c.free, c.site, c.size)));
        }
    }

    /// The calls per site and, unless the queue grew too long, every site's growth per call.
    fn finish(mut self) -> (Vec<u64>, Option<Vec<Growth>>) {
        if self.over {
            return (self.per_site, None);
        }
        while let Some(Reverse((_, site, size))) = self.frees.pop() {
            Self::free(&mut self.open, site, size);
        }
        for (site, d) in self.open.into_iter().enumerate() {
            if let Some(d) = d {
                self.growth[site].add(self.per_site[site], d);
            }
        }
        (self.per_site, Some(self.growth))
    }
}

/// [`growth_by_sweep`] for any history (a damaged trace's times may step back, or a free come
/// before its allocation): every site's call times and growth kept, each free put on the
/// site's last call at or before it by a binary search. 16 bytes per call.
fn growth_by_vectors<I: Iterator<Item = Call>>(
    per_site: &[u64],
    calls: impl Fn() -> I,
) -> Vec<Growth> {
    let room = |&k: &u64| usize::try_from(k).unwrap_or(0);
    let mut times: Vec<Vec<u64>> = per_site
        .iter()
        .map(|k| Vec::with_capacity(room(k)))
        .collect();
    let mut diffs: Vec<Vec<i64>> = per_site
        .iter()
        .map(|k| Vec::with_capacity(room(k)))
        .collect();
    for c in calls() {
        times[c.site].push(c.ts);
        diffs[c.site].push(signed(c.size));
    }
    for c in calls() {
        if c.free == LIVE {
            continue;
        }
        let j = times[c.site].partition_point(|&t| t <= c.free);
        if j > 0 {
            diffs[c.site][j - 1] = diffs[c.site][j - 1].saturating_sub(signed(c.size));
        }
    }
    diffs.iter().map(|d| Growth::of(d)).collect()
}

/// The fields a call-site scope's call reads.
const CALL_FIELDS: Fields = Fields::KIND
    .and(Fields::STACK)
    .and(Fields::TS)
    .and(Fields::SIZE)
    .and(Fields::FREE);

/// Allocation `a` as a call of its site's scope, when it is device memory.
#[inline]
fn call(sites: &SiteIndex, a: &crate::model::AllocRecord) -> Option<Call> {
    let site = sites.get(a.stack).filter(|_| a.kind.is_device_memory())?;
    Some(Call {
        site,
        ts: a.ts_nanos,
        size: a.size_bytes,
        free: a.free_ts_nanos,
    })
}

/// The scopes per call site, from what the carried rounds made (`done`), and passes of their
/// own for what they did not.
fn call_site_scopes(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    done: CallSites<'_>,
) -> Vec<ScopeGrowth> {
    let calls = || {
        m.allocs
            .iter_fields(CALL_FIELDS)
            .filter_map(|a| call(sites, &a))
    };
    // The rounds no carrier made (`scopes::analyze` on its own), made here.
    let mut rounds = done;
    while matches!(
        rounds,
        CallSites::Counting { .. } | CallSites::Sweeping { .. }
    ) {
        for a in m.allocs.iter_fields(rounds.fields()) {
            rounds.visit(&a);
        }
        rounds.end_pass();
    }
    let growth = match rounds {
        CallSites::Counted {
            growth: Some(growth),
            ..
        } => growth,
        // Times that step back: the sweep over the calls in time order.
        CallSites::Counted {
            per_site,
            by_time: true,
            ..
        } => {
            let mut sweep = Sweep::new(per_site);
            for (_, a) in m.allocs.iter_by_time(CALL_FIELDS) {
                if let Some(c) = call(sites, &a) {
                    sweep.visit(c);
                }
            }
            match sweep.finish() {
                (_, Some(growth)) => growth,
                (per_site, None) => growth_by_vectors(&per_site, calls),
            }
        }
        CallSites::Counted { per_site, .. } => growth_by_vectors(&per_site, calls),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for (i, g) in growth.iter().enumerate() {
        if g.calls < c.min_calls_for_analysis {
            continue;
        }
        let (total, avg, ratio, tail, reference, bounded) = judge(c, g);
        if total <= 0 && !reference {
            continue;
        }
        let stack = sites.stacks[i];
        let (label, _) = site_label(m, stack);
        out.push(ScopeGrowth {
            scope: label.clone(),
            kind: ScopeKind::CallSite,
            calls: g.calls,
            total_growth_bytes: total,
            avg_growth_bytes: avg,
            positive_ratio: ratio,
            tail_growth_bytes: tail,
            reference_leak: reference,
            bounded,
            max_peak_bytes: m.stack_stats.get(&stack).map_or(0, |s| s.peak_bytes),
            explained_by: None,
            top_stack: Some(stack),
            top_site: Some(label),
            top_site_bytes: total.max(0).unsigned_abs(),
        });
    }
    out.sort_by_key(|s| core::cmp::Reverse(s.total_growth_bytes));
    out.truncate(MAX_CALL_SITE_SCOPES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The call-site scopes carried through two passes of another (each ended with
    /// `end_pass`) are those made by passes of their own, on every scenario without NVTX
    /// ranges, with the queue of frees kept short or let grow too long for the sweep.
    #[test]
    fn carried_call_site_scopes_equal_those_made_apart() {
        use super::super::Carried;
        use crate::synth::{Scenario, generate};
        let c = Config::default();
        let mut without_ranges = 0;
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 30_000, 5);
            let t = crate::model::load(&bytes).expect("loads");
            let m = &t.model;
            if !m.ranges.is_empty() {
                continue;
            }
            without_ranges += 1;
            let sites = SiteIndex::new(m);
            let apart = format!("{:?}", analyze(m, &c, &sites));
            for short_queue in [false, true] {
                let mut pass = ScopePass::new(m, &sites);
                super::super::run_alone(m, &mut pass);
                pass.end_pass();
                if let (true, CallSites::Sweeping { sweep, .. }) = (short_queue, &mut pass.calls) {
                    sweep.max_queued = 0;
                }
                super::super::run_alone(m, &mut pass);
                pass.end_pass();
                assert!(matches!(pass.calls, CallSites::Counted { .. }), "{s:?}");
                let carried = format!("{:?}", analyze_after(m, &c, &sites, pass));
                assert_eq!(carried, apart, "{s:?}");
            }
        }
        assert!(without_ranges >= 5);
    }

    /// Where allocation times step back, the call-site scopes come from a sweep of the calls
    /// in time order: the growth the vectors make of the calls sorted by time, on every
    /// scenario without NVTX ranges, one allocation in 16 recorded 30 µs early.
    #[test]
    fn out_of_order_calls_are_swept_in_time_order() {
        use super::super::Carried;
        use crate::synth::{Scenario, generate, with_allocations_out_of_order};
        let mut swept = 0;
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 30_000, 5);
            let bytes = with_allocations_out_of_order(&bytes, 16, 30_000);
            let t = crate::model::load(&bytes).expect("loads");
            let m = &t.model;
            if !m.ranges.is_empty() || m.allocs.times_ascend() {
                continue;
            }
            let sites = SiteIndex::new(m);
            let mut pass = ScopePass::new(m, &sites);
            super::super::run_alone(m, &mut pass);
            pass.end_pass();
            let CallSites::Counted {
                per_site,
                growth: None,
                by_time: true,
            } = &pass.calls
            else {
                panic!("{s:?}: not left to a sweep in time order");
            };
            let mut sweep = Sweep::new(per_site.clone());
            for (_, a) in m.allocs.iter_by_time(CALL_FIELDS) {
                if let Some(c) = call(&sites, &a) {
                    sweep.visit(c);
                }
            }
            let Some(got) = sweep.finish().1 else {
                continue;
            };
            let mut calls: Vec<(u64, usize, Call)> = m
                .allocs
                .iter()
                .enumerate()
                .filter_map(|(i, a)| call(&sites, &a).map(|c| (a.ts_nanos, i, c)))
                .collect();
            calls.sort_by_key(|&(t, i, _)| (t, i));
            let want = growth_by_vectors(per_site, || calls.iter().map(|x| x.2));
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{s:?}");
            swept += 1;
        }
        assert!(swept >= 4, "{swept}");
    }

    /// A history in time order: calls of `sites` sites at times that often tie, freed at or
    /// after their time (often at another call's time, or the same), or never.
    fn history(sites: usize, steps: &[(u8, u8, u16, u8)]) -> Vec<Call> {
        let mut ts = 0u64;
        steps
            .iter()
            .map(|&(site, gap, size, life)| {
                ts += u64::from(gap % 4);
                Call {
                    site: usize::from(site) % sites,
                    ts,
                    size: u64::from(size),
                    free: match life {
                        0..=30 => LIVE,
                        l => ts + u64::from(l % 12),
                    },
                }
            })
            .collect()
    }

    fn counts(sites: usize, calls: &[Call]) -> Vec<u64> {
        let mut n = alloc::vec![0u64; sites];
        for c in calls {
            n[c.site] += 1;
        }
        n
    }

    #[test]
    fn a_free_belongs_to_the_sites_last_call_at_or_before_it() {
        let call = |site, ts, size, free| Call {
            site,
            ts,
            size,
            free,
        };
        // Site 0: calls at 10 and 20. The first is freed at 20 (the second call's time: the
        // second call's growth), the second at 25; site 1's call at 15 is freed at 19.
        let calls = [
            call(0, 10, 100, 20),
            call(1, 15, 7, 19),
            call(0, 20, 50, 25),
        ];
        let n = counts(2, &calls);
        let g = growth_by_sweep(&n, calls.iter().copied(), usize::MAX).expect("in order");
        assert_eq!(g, growth_by_vectors(&n, || calls.iter().copied()));
        // Two frees wait at once at most: a queue of one gives up.
        assert!(growth_by_sweep(&n, calls.iter().copied(), 2).is_some());
        assert!(growth_by_sweep(&n, calls.iter().copied(), 1).is_none());
        assert_eq!(g[0], Growth::of(&[100, 50 - 100 - 50]));
        assert_eq!(g[1], Growth::of(&[0]));
    }

    /// What `kept_beyond_instances` gives, allocation by allocation: the walk up its
    /// instances.
    fn kept_walked(m: &TraceModel, scopes: &NvtxScopes) -> HashMap<(u32, StackId), u64> {
        let mut kept: HashMap<(u32, StackId), u64> = HashMap::new();
        let mut names = m.ranges.names();
        for a in m.allocs.iter() {
            if a.range_slot == 0 || !a.kind.is_device_memory() {
                continue;
            }
            let (mut slot, mut depth) = (a.range_slot, 0);
            while slot != 0 && depth < 64 {
                let Some((end, parent)) = m.ranges.end_and_parent(slot as usize - 1) else {
                    break;
                };
                if let Some(end) = end
                    && (a.free_ts_nanos == LIVE || a.free_ts_nanos > end)
                {
                    *kept
                        .entry((
                            scopes.of_slot(m, &mut names, slot).expect("an instance"),
                            a.stack,
                        ))
                        .or_default() += a.size_bytes;
                }
                (slot, depth) = (parent, depth + 1);
            }
        }
        kept
    }

    proptest! {
        /// Nested instances of a few scopes, allocations in runs from one instance and freed
        /// before or after its end (or never): each keeps the bytes the walk up its instances
        /// gives.
        #[test]
        fn kept_bytes_are_those_of_each_allocations_walk(
            ops in proptest::collection::vec((0u8..6, 0u8..4, 1u8..200), 0..300),
        ) {
            use crate::encode::Encoder;
            use crate::format::{Alloc, Free, RangeBegin, RangeEnd, RangeId, Record, StringId};
            let mut enc = Encoder::new(&Encoder::header_v1());
            let (mut t, mut next_range) = (0u64, 1u64);
            let (mut open, mut live) = (Vec::new(), Vec::new());
            for &(op, k, size) in &ops {
                t += 10;
                match op {
                    0 => {
                        let range = RangeId(next_range);
                        next_range += 1;
                        open.push(range);
                        enc.record(&Record::RangeBegin(RangeBegin {
                            ts_nanos: t,
                            range,
                            name: StringId(u32::from(k)),
                            ..RangeBegin::default()
                        }));
                    }
                    1 => {
                        if let Some(range) = open.pop() {
                            enc.record(&Record::RangeEnd(RangeEnd { ts_nanos: t, range }));
                        }
                    }
                    2 if !live.is_empty() => {
                        let id = live.swap_remove(usize::from(size) % live.len());
                        enc.record(&Record::Free(Free { ts_nanos: t, alloc: id, ..Free::default() }));
                    }
                    _ => {
                        let id = enc.alloc(&Alloc {
                            ts_nanos: t,
                            size_bytes: u64::from(size),
                            address: t << 8,
                            stack: StackId(u32::from(k)),
                            ..Alloc::default()
                        });
                        live.push(id);
                    }
                }
            }
            let trace = crate::load(&enc.into_bytes()).expect("the trace loads");
            let m = &trace.model;
            let scopes = nvtx_scope_index(m);
            prop_assert_eq!(kept_beyond_instances(m), kept_walked(m, &scopes));
        }
    }

    proptest! {
        /// The sweep gives every site the growth the kept vectors give.
        #[test]
        fn the_sweep_equals_the_vectors(
            sites in 1usize..6,
            steps in proptest::collection::vec(any::<(u8, u8, u16, u8)>(), 0..300),
        ) {
            let calls = history(sites, &steps);
            let n = counts(sites, &calls);
            prop_assert_eq!(
                growth_by_sweep(&n, calls.iter().copied(), usize::MAX),
                Some(growth_by_vectors(&n, || calls.iter().copied()))
            );
        }
    }
}
