//! Fragmentation is free memory that is unusable for the requests actually made. Free reserve
//! that could serve the requests is cache, not fragmentation.
//!
//! From pool samples (reserved vs allocated, per pool): the ratio (reserved - allocated) /
//! reserved over time, for the table; the evidence is **forced growth**: the pool took more
//! memory from the driver although, just before, at least the size of the request that made it
//! grow was free in its reserve, so no free block was large enough. Repeated forced growth is a
//! warning; an allocation that failed while enough bytes were free is the out-of-memory finding
//! (`hidden`), critical. Free reserve at the end is a cache note with its size and how to
//! release it. From allocation addresses: the largest free block against all free bytes between
//! the live allocations of a device (at the worst sample and at every failed allocation).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::vec::Vec;

use super::iterations::Iterations;
use super::{Config, Finding, FindingKind, Found, Severity};
use crate::format::{DeviceIdx, PoolSample, ProcessIdx, pool};
use crate::model::{Fields, TraceModel};
pub use crate::report::{AddressGaps, PoolFragmentation, RatioPoint};
use crate::units::fmt_bytes;

pub const MAX_POINTS: usize = 256;

pub fn analyze(
    m: &TraceModel,
    c: &Config,
    it: &Iterations,
    found: &mut Found,
) -> Vec<PoolFragmentation> {
    // Forced growth counts once the program is past its warm-up, and is a problem only while it
    // goes on: growth that stops is the reserve settling (a cache note).
    let steady_from = it
        .starts_nanos
        .get(it.warmup as usize)
        .unwrap_or(m.first_ts_nanos);
    let third = m.last_ts_nanos.saturating_sub(m.first_ts_nanos) / 3;
    let middle_third = m.first_ts_nanos + third;
    let last_third = m.last_ts_nanos.saturating_sub(third);
    // Each pool's figures over its samples with reserve, in two passes over the samples
    // (pools in key order), holding a few words per pool rather than every sample: a day of
    // samples every 50 ms is 1.7 M per pool.
    let ratio = |s: &PoolSample| {
        s.reserved_bytes.saturating_sub(s.used_bytes) as f64 / s.reserved_bytes as f64
    };
    let mut index: BTreeMap<(ProcessIdx, DeviceIdx, u64), usize> = BTreeMap::new();
    let mut pools: Vec<PoolPass> = Vec::new();
    let mut last_key: Option<((ProcessIdx, DeviceIdx, u64), usize)> = None;
    for s in m.pool_samples.iter().filter(|s| s.reserved_bytes > 0) {
        let key = (s.process, s.device, s.pool);
        let k = match last_key {
            Some((lk, k)) if lk == key => k,
            _ => {
                let k = *index.entry(key).or_insert_with(|| {
                    pools.push(PoolPass::new(s));
                    pools.len() - 1
                });
                last_key = Some((key, k));
                k
            }
        };
        let p = &mut pools[k];
        p.count += 1;
        let r = ratio(&s);
        p.sum += r;
        if r > ratio(&p.worst) {
            p.worst = s;
        }
        p.max_reserved = p.max_reserved.max(s.reserved_bytes);
        if s.ts_nanos >= steady_from {
            p.steady.get_or_insert((s, s)).1 = s;
        }
        // Forced growth: the reserve grew past its high-water mark although the demand was no
        // higher than before and the largest request since the last sample would have fit in
        // its free part (a caching allocator grows only when no free block is large enough).
        let prev = core::mem::replace(&mut p.last, s);
        if p.count == 1 || s.reserved_bytes <= p.high {
            continue;
        }
        let q = s;
        let free_before = prev.reserved_bytes.saturating_sub(prev.used_bytes);
        let request = largest_request(m, q.process, q.device, prev.ts_nanos, q.ts_nanos);
        // The demand is no higher than it has been: the reserve that served it before could
        // not serve it now. (Growth that follows new demand, a leak's or a warm-up's, is not
        // fragmentation.)
        if request > 0
            && free_before >= request
            && q.used_bytes <= p.used_high
            && q.ts_nanos >= steady_from
        {
            p.forced_count += 1;
            p.forced_late |= q.ts_nanos >= last_third;
            p.forced_middle |= q.ts_nanos >= middle_third && q.ts_nanos < last_third;
            p.forced_bytes = p.forced_bytes.saturating_add(q.reserved_bytes - p.high);
        }
        p.high = q.reserved_bytes;
        p.used_high = p.used_high.max(q.used_bytes);
    }
    // The second pass: each pool's series (every `stride`-th sample) and its peak demand up to
    // the first and the last steady-state samples.
    let mut seconds: Vec<PoolSeries> = pools
        .iter()
        .map(|p| PoolSeries {
            stride: (p.count as usize).div_ceil(MAX_POINTS).max(1) as u64,
            seen: 0,
            series: Vec::new(),
            used_to_first: 0,
            used_to_last: 0,
        })
        .collect();
    if !pools.is_empty() {
        let mut last_key: Option<((ProcessIdx, DeviceIdx, u64), usize)> = None;
        for s in m.pool_samples.iter().filter(|s| s.reserved_bytes > 0) {
            let key = (s.process, s.device, s.pool);
            let k = match last_key {
                Some((lk, k)) if lk == key => k,
                _ => {
                    let Some(&k) = index.get(&key) else { continue };
                    last_key = Some((key, k));
                    k
                }
            };
            let (p, x) = (&pools[k], &mut seconds[k]);
            if x.seen % x.stride == 0 {
                x.series.push(RatioPoint {
                    ts_nanos: s.ts_nanos,
                    ratio: ratio(&s),
                });
            }
            x.seen += 1;
            if let Some((a, b)) = p.steady {
                if s.ts_nanos <= a.ts_nanos {
                    x.used_to_first = x.used_to_first.max(s.used_bytes);
                }
                if s.ts_nanos <= b.ts_nanos {
                    x.used_to_last = x.used_to_last.max(s.used_bytes);
                }
            }
        }
    }
    let mut out = Vec::new();
    for (&(process, device, pool), &k) in &index {
        let p = &pools[k];
        let series = core::mem::take(&mut seconds[k].series);
        let (worst, last) = (p.worst, p.last);
        let mean = p.sum / p.count as f64;
        let gaps = address_gaps(m, device, worst.ts_nanos)
            .filter(|g| g.span_bytes <= worst.reserved_bytes);
        let (forced_count, forced_late, forced_middle) =
            (p.forced_count, p.forced_late, p.forced_middle);
        let max_reserved = p.max_reserved;
        // Over the steady state, the reserve may grow as much as the peak demand does (a leak
        // grows both); only growth beyond it is forced. Samples land at any phase of an
        // iteration, so one sample's demand can be lower than the last while a leak still grows.
        let excess = match p.steady {
            Some((a, b)) => {
                let reserve = b.reserved_bytes.saturating_sub(a.reserved_bytes);
                let x = &seconds[k];
                let demand = x.used_to_last.saturating_sub(x.used_to_first);
                reserve.saturating_sub(demand)
            }
            None => 0,
        };
        let forced_bytes = p.forced_bytes.min(excess);
        let f = PoolFragmentation {
            process,
            device,
            pool,
            samples: p.count,
            mean_ratio: mean,
            max_ratio: ratio(&worst),
            max_ts_nanos: worst.ts_nanos,
            max_wasted_bytes: worst.reserved_bytes.saturating_sub(worst.used_bytes),
            flagged: mean > c.fragmentation_ratio,
            forced_growth_count: forced_count,
            forced_growth_bytes: forced_bytes,
            free_at_end_bytes: last.reserved_bytes.saturating_sub(last.used_bytes),
            gaps_at_max: gaps,
            series,
        };
        push_findings(
            m,
            c,
            &f,
            last.reserved_bytes,
            max_reserved,
            forced_middle && forced_late,
            found,
        );
        out.push(f);
    }
    out
}

/// The largest device allocation `process` made on `device` from `from` to `to` (times
/// included): the request a pool's growth between two samples served.
fn largest_request(
    m: &TraceModel,
    process: ProcessIdx,
    device: DeviceIdx,
    from: u64,
    to: u64,
) -> u64 {
    let Some(first) = from.checked_add(1).filter(|&f| f <= to) else {
        return 0;
    };
    // Where records step back, allocations made outside the span lie among its ids.
    let span = m.allocs.made_in(first, to);
    m.allocs
        .iter_range(span.start, span.end)
        .filter(|a| (first..=to).contains(&a.ts_nanos))
        .filter(|a| a.process == process && a.device == device && a.kind.is_device_memory())
        .map(|a| a.size_bytes)
        .max()
        .unwrap_or(0)
}

/// A pool's finding, if it has one: forced growth that `goes_on` (through the middle and the
/// last third) is fragmentation, a warning; otherwise free reserve at the end (`last_reserved`
/// in all) is a cache note, unless an allocation failed out of memory there.
fn push_findings(
    m: &TraceModel,
    c: &Config,
    f: &PoolFragmentation,
    last_reserved: u64,
    max_reserved: u64,
    goes_on: bool,
    found: &mut Found,
) {
    let (process, device, pool) = (f.process, f.device, f.pool);
    let (forced_count, forced_bytes) = (f.forced_growth_count, f.forced_growth_bytes);
    let name = format!("{} on device {}", pool::label(pool), device.0);
    let significant = c.spike_min_excess_bytes.min(max_reserved / 10).max(1);
    if forced_count >= 3 && goes_on && forced_bytes >= significant {
        let mut x = Finding::new(FindingKind::Fragmentation, Severity::Warning, name.clone());
        x.device = Some(device);
        x.bytes = forced_bytes;
        x.count = forced_count;
        x.harm_bytes = forced_bytes;
        x.ts_nanos = Some(f.max_ts_nanos);
        x.headline = format!(
            "fragmentation made {name} grow {} although the requests fit in its free memory",
            fmt_bytes(forced_bytes)
        );
        x.message = format!(
            "{name} took {} more from the driver in {forced_count} step(s) although, each time, the request would have fit in its free reserve: the free memory is split into blocks too small for the requests",
            fmt_bytes(forced_bytes)
        );
        if let Some(g) = f.gaps_at_max.filter(|g| g.free_bytes > 0) {
            x.evidence.push(format!(
                "at the worst sample the largest free block is {} of {} free ({:.0} % external fragmentation)",
                fmt_bytes(g.largest_free_bytes),
                fmt_bytes(g.free_bytes),
                g.external_fragmentation * 100.0
            ));
        }
        x.evidence.push(format!(
            "on average {:.0} % of the reserve was unallocated (worst {:.0} %)",
            f.mean_ratio * 100.0,
            f.max_ratio * 100.0
        ));
        x.fix = if pool == pool::GRAPH_MEMORY {
            "free graph allocations inside the graph (a free node) or destroy the graphs that hold them, then release the memory with cudaDeviceGraphMemTrim".into()
        } else {
            "allocate long-lived buffers first and in few sizes, round sizes up to common buckets, or use PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()
        };
        found.push(x);
    } else if f.free_at_end_bytes > 0
        && !m.failed.iter().any(|x| {
            x.record.is_out_of_memory() && x.record.process == process && x.record.device == device
        })
    {
        let mut x = Finding::new(FindingKind::Cache, Severity::Info, name.clone());
        x.bytes = f.free_at_end_bytes;
        x.count = f.samples;
        x.headline = format!("{} cached by {name}", fmt_bytes(f.free_at_end_bytes));
        x.message = format!(
            "{name} keeps {} reserved but unallocated at the end ({:.0} % of its {}), ready for reuse: cache, not fragmentation",
            fmt_bytes(f.free_at_end_bytes),
            f.free_at_end_bytes as f64 * 100.0 / last_reserved.max(1) as f64,
            fmt_bytes(last_reserved)
        );
        x.fix = if pool == pool::GRAPH_MEMORY {
            "nothing required; cudaDeviceGraphMemTrim releases it".into()
        } else {
            "nothing required; torch.cuda.empty_cache(), cudaMemPoolTrimTo or a lower release threshold return it to the driver if other processes need it".into()
        };
        found.push(x);
    }
}

/// What the first pass takes of one pool's samples with reserve.
struct PoolPass {
    count: u64,
    /// The sum of the free share of the reserve, for the mean.
    sum: f64,
    /// The sample with the highest free share (the first of them).
    worst: PoolSample,
    /// The last sample so far.
    last: PoolSample,
    max_reserved: u64,
    /// The first and the last steady-state samples.
    steady: Option<(PoolSample, PoolSample)>,
    /// The reserve's high-water mark, and the demand's, where the reserve last grew past it.
    high: u64,
    used_high: u64,
    forced_count: u64,
    forced_bytes: u64,
    forced_late: bool,
    forced_middle: bool,
}

impl PoolPass {
    fn new(first: PoolSample) -> Self {
        Self {
            count: 0,
            sum: 0.0,
            worst: first,
            last: first,
            max_reserved: 0,
            steady: None,
            high: first.reserved_bytes,
            used_high: first.used_bytes,
            forced_count: 0,
            forced_bytes: 0,
            forced_late: false,
            forced_middle: false,
        }
    }
}

/// What the second pass takes of one pool's samples.
struct PoolSeries {
    /// Every `stride`-th sample is a point of the series.
    stride: u64,
    seen: u64,
    series: Vec<RatioPoint>,
    /// The peak demand up to the first steady-state sample, and up to the last.
    used_to_first: u64,
    used_to_last: u64,
}

/// Free gaps between the device allocations of `device` live at `t`, by address.
pub fn address_gaps(m: &TraceModel, device: DeviceIdx, t: u64) -> Option<AddressGaps> {
    let mut live: Vec<(u64, u64)> = m
        .allocs
        .live_at_fields(
            t,
            m.allocs.len(),
            Fields::DEVICE | Fields::KIND | Fields::ADDRESS | Fields::SIZE,
        )
        .filter(|a| a.device == device && a.kind.is_device_memory())
        .map(|a| (a.address, a.address.saturating_add(a.size_bytes)))
        .collect();
    if live.is_empty() {
        return None;
    }
    live.sort_unstable();
    let mut g = AddressGaps::default();
    let mut end = live[0].0;
    for &(a, b) in &live {
        if a > end {
            let gap = a - end;
            g.free_bytes = g.free_bytes.saturating_add(gap);
            g.largest_free_bytes = g.largest_free_bytes.max(gap);
        }
        g.live_bytes = g.live_bytes.saturating_add(b - a);
        end = end.max(b);
    }
    g.span_bytes = end - live[0].0;
    if g.free_bytes > 0 {
        g.external_fragmentation = 1.0 - g.largest_free_bytes as f64 / g.free_bytes as f64;
    }
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::Encoder;
    use crate::format::{Alloc, AllocKind, Free, Record, StackId};
    use proptest::prelude::*;

    /// The analysis' figures as they were made from each pool's samples collected in vectors:
    /// what the passes over the samples must give (the request between two samples and the
    /// findings from the figures are the detector's own).
    fn analyze_collected(
        m: &TraceModel,
        c: &Config,
        it: &Iterations,
        found: &mut Found,
    ) -> Vec<PoolFragmentation> {
        // Forced growth counts once the program is past its warm-up, and is a problem only while it
        // goes on: growth that stops is the reserve settling (a cache note).
        let steady_from = it
            .starts_nanos
            .get(it.warmup as usize)
            .unwrap_or(m.first_ts_nanos);
        let third = m.last_ts_nanos.saturating_sub(m.first_ts_nanos) / 3;
        let middle_third = m.first_ts_nanos + third;
        let last_third = m.last_ts_nanos.saturating_sub(third);
        // Each pool's samples with reserve, in one pass (pools in key order).
        let mut pools: alloc::collections::BTreeMap<
            (ProcessIdx, DeviceIdx, u64),
            Vec<crate::format::PoolSample>,
        > = alloc::collections::BTreeMap::new();
        for s in m.pool_samples.iter() {
            let e = pools.entry((s.process, s.device, s.pool)).or_default();
            if s.reserved_bytes > 0 {
                e.push(s);
            }
        }
        let mut out = Vec::new();
        for ((process, device, pool), samples) in pools {
            if samples.is_empty() {
                continue;
            }
            let ratio = |s: &crate::format::PoolSample| {
                s.reserved_bytes.saturating_sub(s.used_bytes) as f64 / s.reserved_bytes as f64
            };
            let mut sum = 0.0;
            let mut worst = &samples[0];
            for s in &samples {
                let r = ratio(s);
                sum += r;
                if r > ratio(worst) {
                    worst = s;
                }
            }
            let mean = sum / samples.len() as f64;
            let stride = samples.len().div_ceil(MAX_POINTS);
            let series = samples
                .iter()
                .step_by(stride.max(1))
                .map(|s| RatioPoint {
                    ts_nanos: s.ts_nanos,
                    ratio: ratio(s),
                })
                .collect();
            let gaps = address_gaps(m, device, worst.ts_nanos)
                .filter(|g| g.span_bytes <= worst.reserved_bytes);
            // Forced growth: the reserve grew past its high-water mark although the demand was no
            // higher than before and the largest request since the last sample would have fit in
            // its free part (a caching allocator grows only when no free block is large enough).
            let mut forced_count = 0u64;
            let mut forced_bytes = 0u64;
            let mut forced_late = false;
            let mut forced_middle = false;
            let mut high = samples[0].reserved_bytes;
            let mut used_high = samples[0].used_bytes;
            for w in samples.windows(2) {
                let (p, q) = (w[0], w[1]);
                if q.reserved_bytes <= high {
                    continue;
                }
                let free_before = p.reserved_bytes.saturating_sub(p.used_bytes);
                let request = largest_request(m, process, device, p.ts_nanos, q.ts_nanos);
                // The demand is no higher than it has been: the reserve that served it before could
                // not serve it now. (Growth that follows new demand, a leak's or a warm-up's, is
                // not fragmentation.)
                if request > 0
                    && free_before >= request
                    && q.used_bytes <= used_high
                    && q.ts_nanos >= steady_from
                {
                    forced_count += 1;
                    forced_late |= q.ts_nanos >= last_third;
                    forced_middle |= q.ts_nanos >= middle_third && q.ts_nanos < last_third;
                    forced_bytes = forced_bytes.saturating_add(q.reserved_bytes - high);
                }
                high = q.reserved_bytes;
                used_high = used_high.max(q.used_bytes);
            }
            let last = samples[samples.len() - 1];
            let max_reserved = samples.iter().map(|s| s.reserved_bytes).max().unwrap_or(0);
            // Over the steady state, the reserve may grow as much as the peak demand does (a leak
            // grows both); only growth beyond it is forced. Samples land at any phase of an
            // iteration, so one sample's demand can be lower than the last while a leak still grows.
            let steady: Vec<&crate::format::PoolSample> = samples
                .iter()
                .filter(|s| s.ts_nanos >= steady_from)
                .collect();
            let excess = match (steady.first(), steady.last()) {
                (Some(a), Some(b)) => {
                    let peak_used = |upto: u64| {
                        samples
                            .iter()
                            .filter(|s| s.ts_nanos <= upto)
                            .map(|s| s.used_bytes)
                            .max()
                            .unwrap_or(0)
                    };
                    let reserve = b.reserved_bytes.saturating_sub(a.reserved_bytes);
                    let demand = peak_used(b.ts_nanos).saturating_sub(peak_used(a.ts_nanos));
                    reserve.saturating_sub(demand)
                }
                _ => 0,
            };
            let forced_bytes = forced_bytes.min(excess);
            let f = PoolFragmentation {
                process,
                device,
                pool,
                samples: samples.len() as u64,
                mean_ratio: mean,
                max_ratio: ratio(worst),
                max_ts_nanos: worst.ts_nanos,
                max_wasted_bytes: worst.reserved_bytes.saturating_sub(worst.used_bytes),
                flagged: mean > c.fragmentation_ratio,
                forced_growth_count: forced_count,
                forced_growth_bytes: forced_bytes,
                free_at_end_bytes: last.reserved_bytes.saturating_sub(last.used_bytes),
                gaps_at_max: gaps,
                series,
            };
            push_findings(
                m,
                c,
                &f,
                last.reserved_bytes,
                max_reserved,
                forced_middle && forced_late,
                found,
            );
            out.push(f);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// The passes over the samples give the pools and findings the vectors gave: pools
        /// interleaved, samples without reserve, times stepping back, reserves that grow and
        /// shrink, requests before each sample.
        #[test]
        fn the_passes_equal_the_vectors(
            samples in proptest::collection::vec(
                (0u8..3, 0u64..4, 0u64..64, 0u64..64, any::<bool>()),
                0..120,
            ),
            sizes in proptest::collection::vec(1u64..32, 0..60),
            warmup in 0u64..8,
        ) {
            let mut enc = Encoder::new(&Encoder::header_v1());
            let mut t = 0u64;
            let mut live = Vec::new();
            for (i, &(pool, dt, reserved, used, back)) in samples.iter().enumerate() {
                t = if back { t.saturating_sub(dt) } else { t + dt * 10 };
                if let Some(&size) = sizes.get(i) {
                    let id = enc.alloc(&Alloc {
                        ts_nanos: t,
                        size_bytes: size << 20,
                        address: (i as u64) << 30,
                        stack: StackId(1),
                        kind: AllocKind::Device,
                        ..Alloc::default()
                    });
                    live.push(id);
                    if i % 3 == 0 {
                        let id = live.swap_remove(0);
                        enc.record(&Record::Free(Free { ts_nanos: t, alloc: id, ..Free::default() }));
                    }
                }
                enc.record(&Record::PoolSample(PoolSample {
                    ts_nanos: t,
                    pool: u64::from(pool),
                    reserved_bytes: reserved << 20,
                    used_bytes: used.min(reserved + 2) << 20,
                    ..PoolSample::default()
                }));
            }
            let trace = crate::load(&enc.into_bytes()).expect("the trace loads");
            let m = &trace.model;
            let c = Config {
                spike_min_excess_bytes: 1 << 20,
                ..Config::default()
            };
            let mut it = super::super::iterations::detect(m);
            it.warmup = warmup.min(it.count);
            let (mut a, mut b) = (Found::default(), Found::default());
            prop_assert_eq!(analyze(m, &c, &it, &mut a), analyze_collected(m, &c, &it, &mut b));
            prop_assert_eq!((a.findings, a.notes), (b.findings, b.notes));
        }
    }
}
