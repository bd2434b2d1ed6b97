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

use alloc::format;
use alloc::vec::Vec;

use super::iterations::Iterations;
use super::{Config, Finding, FindingKind, Found, Severity};
use crate::format::{DeviceIdx, ProcessIdx, pool};
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
            let lo = m.allocs.partition_ts(|t| t <= p.ts_nanos);
            let request = m
                .allocs
                .iter_from(lo)
                .take_while(|a| a.ts_nanos <= q.ts_nanos)
                .filter(|a| a.process == process && a.device == device && a.kind.is_device_memory())
                .map(|a| a.size_bytes)
                .max()
                .unwrap_or(0);
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
        let name = format!("{} on device {}", pool::label(pool), device.0);
        let significant = c.spike_min_excess_bytes.min(max_reserved / 10).max(1);
        // Still forcing growth through the middle and the last third: it goes on.
        if forced_count >= 3 && forced_middle && forced_late && forced_bytes >= significant {
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
            if let Some(g) = gaps.filter(|g| g.free_bytes > 0) {
                x.evidence.push(format!(
                    "at the worst sample the largest free block is {} of {} free ({:.0} % external fragmentation)",
                    fmt_bytes(g.largest_free_bytes),
                    fmt_bytes(g.free_bytes),
                    g.external_fragmentation * 100.0
                ));
            }
            x.evidence.push(format!(
                "on average {:.0} % of the reserve was unallocated (worst {:.0} %)",
                mean * 100.0,
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
                x.record.is_out_of_memory()
                    && x.record.process == process
                    && x.record.device == device
            })
        {
            let mut x = Finding::new(FindingKind::Cache, Severity::Info, name.clone());
            x.bytes = f.free_at_end_bytes;
            x.count = f.samples;
            x.headline = format!("{} cached by {name}", fmt_bytes(f.free_at_end_bytes));
            x.message = format!(
                "{name} keeps {} reserved but unallocated at the end ({:.0} % of its {}), ready for reuse: cache, not fragmentation",
                fmt_bytes(f.free_at_end_bytes),
                f.free_at_end_bytes as f64 * 100.0 / last.reserved_bytes.max(1) as f64,
                fmt_bytes(last.reserved_bytes)
            );
            x.fix = if pool == pool::GRAPH_MEMORY {
                "nothing required; cudaDeviceGraphMemTrim releases it".into()
            } else {
                "nothing required; torch.cuda.empty_cache(), cudaMemPoolTrimTo or a lower release threshold return it to the driver if other processes need it".into()
            };
            found.push(x);
        }
        out.push(f);
    }
    out
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
