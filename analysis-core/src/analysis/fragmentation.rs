//! Fragmentation. From pool samples (reserved vs allocated): the ratio
//! (reserved - allocated) / reserved over time per pool, flagged when its mean exceeds 0.3,
//! critical above 0.5 (reference rule). From allocation addresses: an external-fragmentation
//! measure, the largest free block against all free bytes between the live allocations of a
//! device (used at the worst sample and at every failed allocation).

use alloc::format;
use alloc::vec::Vec;
use serde::Serialize;

use super::{Config, Finding, FindingKind, Found, Severity};
use crate::format::{DeviceIdx, ProcessIdx, pool};
use crate::model::TraceModel;
use crate::units::fmt_bytes;

/// Free space between the live allocations of a device at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AddressGaps {
    /// From the lowest live address to the highest live end.
    pub span_bytes: u64,
    pub live_bytes: u64,
    /// Free bytes inside the span.
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    /// 1 - largest free block / all free bytes (0 when nothing is free).
    pub external_fragmentation: f64,
}

/// One point of a pool's ratio over time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RatioPoint {
    pub ts_nanos: u64,
    pub ratio: f64,
}

/// One pool's fragmentation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolFragmentation {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub pool: u64,
    pub samples: u64,
    pub mean_ratio: f64,
    pub max_ratio: f64,
    pub max_ts_nanos: u64,
    /// Reserved minus allocated at the worst sample.
    pub max_wasted_bytes: u64,
    pub flagged: bool,
    /// Address gaps at the worst sample, when the live allocations fit in the reserved bytes.
    pub gaps_at_max: Option<AddressGaps>,
    /// The ratio over time, at most `MAX_POINTS` points (evenly strided).
    pub series: Vec<RatioPoint>,
}

pub const MAX_POINTS: usize = 256;

pub fn analyze(m: &TraceModel, c: &Config, found: &mut Found) -> Vec<PoolFragmentation> {
    let mut keys: Vec<(ProcessIdx, DeviceIdx, u64)> = Vec::new();
    for s in &m.pool_samples {
        let k = (s.process, s.device, s.pool);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.sort();
    let mut out = Vec::new();
    for (process, device, pool) in keys {
        let samples: Vec<_> = m
            .pool_samples
            .iter()
            .filter(|s| s.process == process && s.device == device && s.pool == pool)
            .filter(|s| s.reserved_bytes > 0)
            .collect();
        if samples.is_empty() {
            continue;
        }
        let ratio = |s: &crate::format::PoolSample| {
            s.reserved_bytes.saturating_sub(s.used_bytes) as f64 / s.reserved_bytes as f64
        };
        let mut sum = 0.0;
        let mut worst = samples[0];
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
            gaps_at_max: gaps,
            series,
        };
        if f.flagged {
            let severity = if mean > c.fragmentation_critical_ratio {
                Severity::Critical
            } else {
                Severity::Warning
            };
            let ext = gaps
                .filter(|g| g.free_bytes > 0)
                .map(|g| {
                    format!(
                        "; largest free block {} of {} free ({:.0} % external fragmentation)",
                        fmt_bytes(g.largest_free_bytes),
                        fmt_bytes(g.free_bytes),
                        g.external_fragmentation * 100.0
                    )
                })
                .unwrap_or_default();
            found.push(Finding {
                kind: FindingKind::Fragmentation,
                severity,
                site: format!("{} on device {}", pool::label(pool), device.0),
                stack: None,
                scope: None,
                bytes: f.max_wasted_bytes,
                count: f.samples,
                ts_nanos: Some(f.max_ts_nanos),
                impact: None,
                message: format!(
                    "{} on device {} keeps {:.0} % of its reserved memory unallocated on average (worst {:.0} %, {} wasted){ext}",
                    pool::label(pool),
                    device.0,
                    mean * 100.0,
                    f.max_ratio * 100.0,
                    fmt_bytes(f.max_wasted_bytes)
                ),
                fix: if pool == pool::GRAPH_MEMORY {
                    "free graph allocations inside the graph (a free node) or destroy the graphs that hold them, then release the memory with cudaDeviceGraphMemTrim".into()
                } else {
                    "allocate long-lived buffers first and in few sizes, round sizes up to common buckets, or release the cache (torch.cuda.empty_cache / cudaMemPoolTrimTo) after peaks; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()
                },
            });
        }
        out.push(f);
    }
    out
}

/// Free gaps between the device allocations of `device` live at `t`, by address.
pub fn address_gaps(m: &TraceModel, device: DeviceIdx, t: u64) -> Option<AddressGaps> {
    let mut live: Vec<(u64, u64)> = m
        .allocs
        .iter()
        .filter(|a| a.device == device && a.kind.is_device_memory() && a.live_at(t))
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
