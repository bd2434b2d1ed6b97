//! Spikes. Per scope (NVTX range name, or call site without NVTX): allocation sizes above
//! Q3 + 1.5·IQR (numpy linear-interpolation quantiles, n ≥ 3), the reference rule applied to
//! allocations instead of decorated calls. On the timeline: sudden rises and falls of live
//! bytes (a short-lived allocation that alone at least doubles the usual level), with the time,
//! the size and the call site responsible.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;
use serde::Serialize;

use super::scopes::{ScopeKind, nvtx_scope_index};
use super::{Config, Finding, FindingKind, Found, Severity, SiteIndex, site_location};
use crate::format::StackId;
use crate::model::TraceModel;
use crate::stats::quantile_select;
use crate::units::{fmt_bytes, fmt_duration};

/// One allocation that stands out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpikeEvent {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    pub stack: StackId,
    pub site: String,
}

/// The outlier rule over one scope's allocation sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScopeSpikes {
    pub scope: String,
    pub kind: ScopeKind,
    pub allocations: u64,
    pub q1_bytes: f64,
    pub q3_bytes: f64,
    pub threshold_bytes: f64,
    pub spike_count: u64,
    pub max_spike_bytes: u64,
    /// The first spikes, at most `MAX_EVENTS`.
    pub events: Vec<SpikeEvent>,
}

/// A sudden rise and fall of live bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimelineSpikeEvent {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    /// Live bytes (all devices) right after the rise.
    pub live_bytes: u64,
    /// How long until it fell again.
    pub duration_nanos: u64,
    pub stack: StackId,
    pub site: String,
}

/// Events kept per scope, and timeline spikes kept in total.
pub const MAX_EVENTS: usize = 100;

pub fn analyze(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    found: &mut Found,
) -> (Vec<ScopeSpikes>, Vec<TimelineSpikeEvent>) {
    (
        scope_spikes(m, c, sites, found),
        timeline_spikes(m, c, found),
    )
}

fn scope_spikes(
    m: &TraceModel,
    c: &Config,
    sites: &SiteIndex,
    found: &mut Found,
) -> Vec<ScopeSpikes> {
    let nvtx = !m.ranges.is_empty();
    let index = nvtx.then(|| nvtx_scope_index(m));
    let n_scopes = match &index {
        Some(ix) => ix.names.len(),
        None => sites.len(),
    };
    let scope_of = |a: &crate::model::AllocRecord| -> Option<usize> {
        match &index {
            Some(ix) => {
                if a.range_slot == 0 {
                    None
                } else {
                    ix.scope_of
                        .get(a.range_slot as usize - 1)
                        .map(|&k| k as usize)
                }
            }
            None => sites.get(a.stack),
        }
    };
    let mut values: Vec<Vec<f64>> = alloc::vec![Vec::new(); n_scopes];
    for a in &m.allocs {
        if a.size_bytes == 0 || !a.kind.is_device_memory() {
            continue;
        }
        if let Some(k) = scope_of(a) {
            values[k].push(a.size_bytes as f64);
        }
    }
    let mut thresholds: Vec<Option<(f64, f64, f64)>> = alloc::vec![None; n_scopes];
    for (k, v) in values.iter_mut().enumerate() {
        if (v.len() as u64) < c.min_calls_for_analysis.max(3) {
            continue;
        }
        let (Some(q1), Some(q3)) = (quantile_select(v, 0.25), quantile_select(v, 0.75)) else {
            continue;
        };
        let thr = q3 + c.spike_iqr_factor * (q3 - q1);
        if v.iter().any(|&x| x > thr) {
            thresholds[k] = Some((q1, q3, thr));
        }
    }
    let mut out: Vec<ScopeSpikes> = Vec::new();
    let mut slot: Vec<usize> = alloc::vec![usize::MAX; n_scopes];
    for a in &m.allocs {
        if a.size_bytes == 0 || !a.kind.is_device_memory() {
            continue;
        }
        let Some(k) = scope_of(a) else { continue };
        let Some((q1, q3, thr)) = thresholds[k] else {
            continue;
        };
        if a.size_bytes as f64 <= thr {
            continue;
        }
        if slot[k] == usize::MAX {
            slot[k] = out.len();
            out.push(ScopeSpikes {
                scope: match &index {
                    Some(ix) => ix.names[k].clone(),
                    None => m.stack_label(sites.stacks[k]),
                },
                kind: if nvtx {
                    ScopeKind::NvtxRange
                } else {
                    ScopeKind::CallSite
                },
                allocations: values[k].len() as u64,
                q1_bytes: q1,
                q3_bytes: q3,
                threshold_bytes: thr,
                spike_count: 0,
                max_spike_bytes: 0,
                events: Vec::new(),
            });
        }
        let s = &mut out[slot[k]];
        s.spike_count += 1;
        s.max_spike_bytes = s.max_spike_bytes.max(a.size_bytes);
        if s.events.len() < MAX_EVENTS {
            s.events.push(SpikeEvent {
                ts_nanos: a.ts_nanos,
                size_bytes: a.size_bytes,
                stack: a.stack,
                site: String::new(),
            });
        }
    }
    let mut labels: HashMap<StackId, String> = HashMap::new();
    for s in &mut out {
        for e in &mut s.events {
            e.site = labels
                .entry(e.stack)
                .or_insert_with(|| m.stack_label(e.stack))
                .clone();
        }
        let top = s.events.iter().max_by(|a, b| {
            a.size_bytes
                .cmp(&b.size_bytes)
                .then(b.ts_nanos.cmp(&a.ts_nanos))
        });
        let (site, stack) = match top {
            Some(e) => (e.site.clone(), Some(e.stack)),
            None => (s.scope.clone(), None),
        };
        let severity = if s.spike_count >= c.spike_critical_count {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let loc = stack.map_or_else(|| s.scope.clone(), |st| site_location(m, st));
        found.push(Finding {
            kind: FindingKind::ScopeSpikes,
            severity,
            site,
            stack,
            scope: Some(s.scope.clone()),
            bytes: s.max_spike_bytes,
            count: s.spike_count,
            ts_nanos: s.events.first().map(|e| e.ts_nanos),
            impact: None,
            message: format!(
                "{} allocation(s) in `{}` exceed Q3 + {}·IQR = {} (up to {})",
                s.spike_count,
                s.scope,
                c.spike_iqr_factor,
                fmt_bytes(s.threshold_bytes as u64),
                fmt_bytes(s.max_spike_bytes)
            ),
            fix: format!(
                "split or stream the large allocation at {loc} (chunk the batch, or compute it in pieces) so the peak stays near the usual {}",
                fmt_bytes(s.q3_bytes as u64)
            ),
        });
    }
    out
}

fn timeline_spikes(m: &TraceModel, c: &Config, found: &mut Found) -> Vec<TimelineSpikeEvent> {
    let duration = m.duration_nanos();
    let times = m.total.times();
    let values = m.total.values();
    if duration == 0 || times.len() < 2 {
        return Vec::new();
    }
    // Time-weighted mean of live bytes.
    let mut area = 0.0f64;
    for i in 0..times.len() - 1 {
        area += values[i] as f64 * (times[i + 1] - times[i]) as f64;
    }
    let span = (times[times.len() - 1] - times[0]).max(1) as f64;
    let mean_live = area / span;
    let max_life = (duration as f64 * c.timeline_spike_max_lifetime_fraction) as u64;
    let min_size =
        (mean_live * c.timeline_spike_rise_fraction).max(c.timeline_spike_min_bytes as f64);
    let mut events = Vec::new();
    for a in &m.allocs {
        if a.is_live() || !a.kind.is_device_memory() || (a.size_bytes as f64) < min_size {
            continue;
        }
        let life = a.free_ts_nanos.saturating_sub(a.ts_nanos);
        if life > max_life {
            continue;
        }
        let live = m.total.value_at(a.ts_nanos);
        if (live as f64) < c.timeline_spike_level_ratio * mean_live {
            continue;
        }
        events.push(TimelineSpikeEvent {
            ts_nanos: a.ts_nanos,
            size_bytes: a.size_bytes,
            live_bytes: live,
            duration_nanos: life,
            stack: a.stack,
            site: String::new(),
        });
    }
    // One finding per call site.
    let mut by: Vec<(StackId, u64, u64, u64)> = Vec::new(); // stack, count, max size, first ts
    for e in &events {
        if let Some(x) = by.iter_mut().find(|x| x.0 == e.stack) {
            x.1 += 1;
            x.2 = x.2.max(e.size_bytes);
        } else if by.len() < 64 {
            by.push((e.stack, 1, e.size_bytes, e.ts_nanos));
        }
    }
    let mut labels: HashMap<StackId, String> = HashMap::new();
    for (stack, count, max, first) in by {
        let site = labels
            .entry(stack)
            .or_insert_with(|| m.stack_label(stack))
            .clone();
        found.push(Finding {
            kind: FindingKind::TimelineSpike,
            severity: Severity::Warning,
            site: site.clone(),
            stack: Some(stack),
            scope: None,
            bytes: max,
            count,
            ts_nanos: Some(first),
            impact: None,
            message: format!(
                "{count} sudden rise(s) of live bytes by up to {} from {site}, each released within {} (usual level {})",
                fmt_bytes(max),
                fmt_duration(max_life),
                fmt_bytes(mean_live as u64)
            ),
            fix: format!(
                "pre-allocate and reuse this buffer, or split the work at {} to flatten the peak",
                site_location(m, stack)
            ),
        });
    }
    events.truncate(MAX_EVENTS);
    for e in &mut events {
        e.site = labels
            .entry(e.stack)
            .or_insert_with(|| m.stack_label(e.stack))
            .clone();
    }
    events
}
