//! What the search for a recurring call site reads of each stack's allocations: how many, the
//! first and last times, the median gap between consecutive ones, how many gaps are within a
//! factor of two of it and how many allocations are freed within two of it.
//!
//! In a history whose allocation times never step back, each stack's gaps are met in order, so
//! they are taken as they come, over passes through the history, and the memory held is
//! bounded by the call sites, not the allocations: a stack keeps its first 64 gaps, then
//! counts the gaps in 512 buckets over their range (a loop's gaps keep to it); each further
//! pass collects the gaps of the bucket that holds the median and selects it exactly, where
//! they are few enough ([`cap`]), or counts them in 1,024 narrower buckets
//! ([`MedianOverPasses`]).
//! Where allocation times step back (a multi-process run's processes, threads whose records
//! reached the ring out of order, a damaged history), the allocations are read in time order
//! (`AllocStore::iter_by_time`), reordered as they are read with memory bounded by how far
//! the times step back. They had been sorted per stack, 8 bytes per allocation.

use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::analysis::median::{MedianOverPasses, cap};
use crate::format::{ProcessIdx, StackId};
use crate::model::{AllocRecord, Fields, TraceModel};

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
    streamed(m, sel)
}

/// The allocations of `sel` the search keeps, with `fields`, in time order.
fn in_time_order(
    m: &TraceModel,
    sel: Option<ProcessIdx>,
    fields: Fields,
) -> impl Iterator<Item = AllocRecord> + '_ {
    m.allocs
        .iter_by_time(fields)
        .map(|(_, a)| a)
        .filter(move |a| kept(sel, a))
}

/// A stack's state in [`streamed`].
struct Stream {
    site: Site,
    /// Its previous allocation's time.
    prev: Option<u64>,
    median: MedianOverPasses,
}

/// Open medians looked up by a scan below this many, by a map from this many.
const SCAN: usize = 4;

/// [`sites`] over passes through the allocations in time order, so that each stack's gaps
/// come in order.
fn streamed(m: &TraceModel, sel: Option<ProcessIdx>) -> HashMap<StackId, Site> {
    let mut stacks: HashMap<StackId, Stream> = HashMap::new();
    for a in in_time_order(m, sel, FIELDS) {
        let s = stacks.entry(a.stack).or_insert_with(|| Stream {
            site: Site {
                first: a.ts_nanos,
                ..Site::default()
            },
            prev: None,
            median: MedianOverPasses::new(),
        });
        if let Some(p) = s.prev {
            s.median.see(a.ts_nanos.saturating_sub(p));
        }
        s.prev = Some(a.ts_nanos);
        s.site.count += 1;
        s.site.last = a.ts_nanos;
    }
    // (stack, median, previous time in the pass) of each median still open.
    let mut open: Vec<(StackId, MedianOverPasses, Option<u64>)> = Vec::new();
    let counting = stacks
        .values()
        .filter(|s| matches!(s.median, MedianOverPasses::Window { .. }))
        .count();
    for (&stack, s) in &mut stacks {
        s.median.end_pass(cap(counting));
        s.prev = None;
        match s.median.found() {
            Some(med) => s.site.med = med,
            None => open.push((
                stack,
                core::mem::replace(&mut s.median, MedianOverPasses::Found(0)),
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
        for a in in_time_order(m, sel, FIELDS) {
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
    for a in in_time_order(m, sel, FIELDS | Fields::FREE) {
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
    stacks.into_iter().map(|(k, s)| (k, s.site)).collect()
}

/// [`sites`] from each stack's times kept (8 bytes per allocation), sorted, and turned into
/// gaps: the reference the tests hold the passes to.
#[cfg(test)]
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
            s.med = crate::analysis::median::upper_median(&mut t);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::median::CAP;
    use crate::synth::{Scenario, generate};

    /// The sites taken as they come are those of the times sorted, on every scenario, for
    /// the whole trace and for each process.
    #[test]
    fn streamed_sites_equal_sorted_ones() {
        let mut many = 0;
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 40_000, 3);
            // As written, and with one allocation in 16 recorded 30 µs early (records that
            // reached the ring out of order).
            for bytes in [bytes.clone(), stepping_back(&bytes)] {
                let t = crate::model::load(&bytes).expect("loads");
                let m = &t.model;
                let processes = m.processes.iter().map(|p| Some(p.process));
                for sel in core::iter::once(None).chain(processes) {
                    let got = streamed(m, sel);
                    assert_eq!(got, sorted(m, sel), "{s:?} {sel:?}");
                    many += got.values().filter(|s| s.gaps() as u64 > CAP).count();
                }
            }
        }
        // Medians narrowed down over passes, not only collected.
        assert!(many > 0);
    }

    /// `trace` with one allocation in 16 made 30 µs earlier.
    fn stepping_back(trace: &[u8]) -> Vec<u8> {
        let out = crate::synth::with_allocations_out_of_order(trace, 16, 30_000);
        let t = crate::model::load(&out).expect("loads");
        assert!(t.model.allocs.len() < 16 || !t.model.allocs.times_ascend());
        out
    }

    /// A history whose times step back has the sites of its times sorted.
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
        assert!(!m.allocs.times_ascend());
        let s = &sites(&m, None)[&StackId(1)];
        assert_eq!(sites(&m, None), sorted(&m, None));
        // Times 20, 40, 100, 250, 260, 270, 300: gaps 20, 60, 150, 10, 10, 30.
        assert_eq!((s.count, s.first, s.last, s.med), (7, 20, 300, 30));
    }
}
