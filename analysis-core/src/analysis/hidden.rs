//! Hidden memory: device memory in use (NVML samples) that the trace does not account for.
//! Other processes' memory, from the samples' per-process list, is named with their pid and
//! never counted as ours (a note). What remains, used minus our traced live bytes minus other
//! processes, is held by our processes outside the traced allocations: driver and context
//! overhead, library workspaces, allocator caches. Reference rules on that gap: skipped with
//! fewer than 3 samples or when it never reaches 5 % of the device; drift (a warning) when
//! n ≥ 5, slope > 0 and R² ≥ 0.6; transient spikes at z > 2 are a note. Also the forensic
//! summary of every failed allocation: free memory, our live bytes by call site, other
//! processes, largest free block.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::facts::group_by_stack;
use super::fragmentation::address_gaps;
use super::{Config, Finding, FindingKind, Found, Impact, Severity, saturating_sum, site_location};
use crate::format::{DeviceIdx, DeviceSample, ProcessUsage};
use crate::model::{Fields, TraceModel};
use crate::packed::Column;
pub use crate::report::{GapPoint, HiddenMemory, OomCause, OomForensics};
use crate::stats::{LinearFit, linear_fit, mean_of, std_population_of};
use crate::timeline::Timeline;
use crate::units::fmt_bytes;

/// Failed allocations examined in detail.
pub const MAX_OOM: usize = 32;

pub fn analyze(
    m: &TraceModel,
    c: &Config,
    found: &mut Found,
) -> (Vec<HiddenMemory>, Vec<OomForensics>) {
    let pids: Vec<u32> = m.processes.iter().map(|p| p.pid).collect();
    // The devices sampled, without a vector of every sample's.
    let mut devices: Vec<DeviceIdx> = Vec::new();
    for s in m.device_samples.iter_fixed() {
        if let Err(at) = devices.binary_search(&s.device) {
            devices.insert(at, s.device);
        }
    }
    let mut hidden = Vec::new();
    for d in devices {
        hidden.push(device_gap(m, c, d, &pids, found));
    }
    let mut oom = Vec::new();
    for f in m
        .failed
        .iter()
        .filter(|f| f.record.is_out_of_memory())
        .take(MAX_OOM)
    {
        let r = &f.record;
        let sample = m
            .device_samples
            .last_where(|s| s.device == r.device && s.ts_nanos <= r.ts_nanos);
        let sample = sample.as_ref();
        let mut others: Vec<ProcessUsage> = sample
            .map(|s| {
                s.processes
                    .iter()
                    .filter(|p| !pids.contains(&p.pid))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        others.sort_by_key(|p| core::cmp::Reverse(p.used_bytes));
        let others_bytes = saturating_sum(others.iter().map(|p| p.used_bytes));
        let live_bytes = traced_live(m, r.device, r.ts_nanos);
        let untraced = sample.map_or(0, |s| {
            s.used_bytes
                .saturating_sub(live_bytes)
                .saturating_sub(others_bytes)
        });
        // Address gaps mean something only when the live blocks share one region.
        let device_total = sample.map(|s| s.total_bytes).or_else(|| {
            m.devices
                .iter()
                .find(|d| d.device == r.device)
                .map(|d| d.total_bytes)
        });
        let gaps = address_gaps(m, r.device, r.ts_nanos)
            .filter(|g| device_total.is_some_and(|t| g.span_bytes <= t));
        // A caching allocator or pool that held at least the request reserved but unallocated
        // just before (PyTorch's "reserved but unallocated"): no free block was large enough.
        let pool_free = m
            .pool_samples
            .iter()
            .rev()
            .find(|p| p.process == r.process && p.device == r.device && p.ts_nanos <= r.ts_nanos)
            .map(|p| p.reserved_bytes.saturating_sub(p.used_bytes));
        let cause = match gaps {
            Some(g) if g.free_bytes >= r.size_bytes && g.largest_free_bytes < r.size_bytes => {
                OomCause::Fragmentation
            }
            _ if pool_free.is_some_and(|f| f >= r.size_bytes) => OomCause::Fragmentation,
            // The device itself had the bytes free (the last sample's free memory, less what we
            // allocated since): no block of them was usable.
            _ if sample.is_some_and(|s| {
                let since = live_bytes.saturating_sub(traced_live(m, r.device, s.ts_nanos));
                s.free_bytes.saturating_sub(since) >= r.size_bytes
            }) =>
            {
                OomCause::Fragmentation
            }
            _ if others_bytes >= r.size_bytes && others_bytes > live_bytes => {
                OomCause::OtherProcesses
            }
            _ if untraced > live_bytes => OomCause::UntracedMemory,
            _ => OomCause::OwnAllocations,
        };
        let live_fields =
            super::facts::GROUP_FIELDS | Fields::DEVICE | Fields::KIND | Fields::TS | Fields::FREE;
        let live_sites = group_by_stack(
            m,
            m.allocs.iter_fields(live_fields).filter(|a| {
                a.device == r.device && a.kind.is_device_memory() && a.live_at(r.ts_nanos)
            }),
            5,
        );
        let o = OomForensics {
            ts_nanos: r.ts_nanos,
            device: r.device,
            requested_bytes: r.size_bytes,
            site: m.stack_label(r.stack),
            free_bytes: sample.map(|s| s.free_bytes),
            total_bytes: sample.map(|s| s.total_bytes),
            live_bytes,
            live_sites,
            other_processes: others,
            untraced_bytes: untraced,
            gaps,
            cause,
        };
        found.push(oom_finding(m, &o, r.stack));
        oom.push(o);
    }
    (hidden, oom)
}

/// Bytes reserved by the pools of `device` over time (every process, every pool: the sum of
/// their last samples), as (time, bytes) steps in sample order: by column where the samples'
/// times ascend (every capture's), else in a vector.
struct ReservedSteps {
    ts: Column,
    total: Column,
    /// The steps at or before the last moment asked, and that moment.
    at: usize,
    last: u64,
    /// Every step, where a time steps back (the columns are then empty).
    unsorted: Option<Vec<(u64, u64)>>,
}

/// The pools' reserve `total` after sample `p`, each (process, pool)'s last reserve in `last`.
fn with_sample(
    last: &mut Vec<(crate::format::ProcessIdx, u64, u64)>,
    total: u64,
    p: &crate::format::PoolSample,
) -> u64 {
    match last.iter_mut().find(|x| x.0 == p.process && x.1 == p.pool) {
        Some(x) => {
            let total = total.saturating_sub(x.2).saturating_add(p.reserved_bytes);
            x.2 = p.reserved_bytes;
            total
        }
        None => {
            last.push((p.process, p.pool, p.reserved_bytes));
            total.saturating_add(p.reserved_bytes)
        }
    }
}

/// An empty column whose full chunks go to `m`'s spill, as its history's do: a sample column
/// per device in memory grew with the trace (4.6 MB at 17M records of device samples).
fn spilling(m: &TraceModel) -> Column {
    let mut c = Column::new();
    c.set_spill(m.spill());
    c
}

impl ReservedSteps {
    fn of(m: &TraceModel, device: DeviceIdx) -> Self {
        let mut last: Vec<(crate::format::ProcessIdx, u64, u64)> = Vec::new();
        let mut total = 0u64;
        // Both columns grow with the samples: they go to the model's spill with its history.
        let mut steps = Self {
            ts: spilling(m),
            total: spilling(m),
            at: 0,
            last: 0,
            unsorted: None,
        };
        for p in m.pool_samples.iter().filter(|p| p.device == device) {
            total = with_sample(&mut last, total, &p);
            match &mut steps.unsorted {
                Some(v) => v.push((p.ts_nanos, total)),
                None if steps.ts.last().is_some_and(|t| p.ts_nanos < t) => {
                    // A time stepping back: the steps as they are, in a vector.
                    let mut v: Vec<(u64, u64)> = steps
                        .ts
                        .iter_from(0)
                        .zip(steps.total.iter_from(0))
                        .collect();
                    v.push((p.ts_nanos, total));
                    (steps.ts, steps.total) = (spilling(m), spilling(m));
                    steps.unsorted = Some(v);
                }
                None => {
                    steps.ts.push_ascending(p.ts_nanos);
                    steps.total.push(total);
                }
            }
        }
        steps
    }

    /// The value of the steps at `t`: that of the last step at or before it (by the steps'
    /// order), 0 before the first. Moments in time order are searched onwards.
    fn at(&mut self, t: u64) -> u64 {
        if let Some(steps) = &self.unsorted {
            return match steps.partition_point(|s| s.0 <= t) {
                0 => 0,
                i => steps[i - 1].1,
            };
        }
        let n = self.ts.len();
        self.at = if t < self.last {
            self.ts.partition_sorted(0, n, |x| x <= t)
        } else {
            self.ts.gallop_sorted(self.at, n, |x| x <= t)
        };
        self.last = t;
        match self.at {
            0 => 0,
            i => self.total.get(i - 1),
        }
    }
}

/// Traced device live bytes on `device` (all processes) at `t`.
fn traced_live(m: &TraceModel, device: DeviceIdx, t: u64) -> u64 {
    m.series
        .iter()
        .filter(|s| !s.key.host && s.key.device == device)
        .map(|s| s.timeline.value_at(t))
        .fold(0u64, u64::saturating_add)
}

/// [`traced_live`] at moments that mostly come in time order (a device's samples): each
/// series is searched onwards from where the last moment left it, so a walk through the
/// samples costs the log of each step rather than of the whole series (a search over a
/// 300M-point timeline per sample took most of this detector's time).
struct TracedLive<'m> {
    series: Vec<&'m Timeline>,
    /// Per series, the number of points at or before `last`.
    at: Vec<usize>,
    last: u64,
}

impl<'m> TracedLive<'m> {
    fn new(m: &'m TraceModel, device: DeviceIdx) -> Self {
        let series: Vec<&Timeline> = m
            .series
            .iter()
            .filter(|s| !s.key.host && s.key.device == device)
            .map(|s| &s.timeline)
            .collect();
        Self {
            at: alloc::vec![0; series.len()],
            series,
            last: 0,
        }
    }

    fn at(&mut self, t: u64) -> u64 {
        if t < self.last {
            // Out of order: searched again from the start.
            self.at.fill(0);
        }
        self.last = t;
        let mut live = 0u64;
        for (tl, i) in self.series.iter().zip(&mut self.at) {
            *i = tl.partition_point_from(*i, |x| x <= t);
            let v = i.checked_sub(1).map_or(0, |k| tl.value(k));
            live = live.saturating_add(v);
        }
        live
    }
}

/// A device's samples against the trace: per sample, the memory the traced processes use that
/// the trace does not account for, by column (a day of samples every 50 ms is 1.7 M; as
/// vectors, with the rules' copies, they took about 40 bytes each).
struct GapSeries {
    ts: Column,
    /// Each gap, zigzag-coded.
    gaps: Column,
    /// The device's total bytes (the largest any sample gives).
    total: u64,
    /// Other processes' bytes at most, summed per sample.
    others_max: u64,
    /// Per other pid: (pid, first seen bytes, max bytes, last bytes).
    other_pids: Vec<(u32, u64, u64, u64)>,
}

const fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

const fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

impl GapSeries {
    /// Read from `samples` one at a time (each holds a vector of its processes: all of a
    /// long trace's at once took 70 bytes a sample).
    fn of(
        m: &TraceModel,
        d: DeviceIdx,
        pids: &[u32],
        samples: impl Iterator<Item = DeviceSample>,
    ) -> Self {
        let mut reserve = ReservedSteps::of(m, d);
        let mut traced = TracedLive::new(m, d);
        let mut g = Self {
            ts: spilling(m),
            gaps: spilling(m),
            total: 0,
            others_max: 0,
            other_pids: Vec::new(),
        };
        for s in samples {
            // What a framework's caching allocator or a pool reserves holds our tensors and its
            // cache: traced memory too, where the trace has it.
            let reserved = reserve.at(s.ts_nanos);
            let live = traced.at(s.ts_nanos).max(reserved);
            g.ts.push(s.ts_nanos);
            g.total = g.total.max(s.total_bytes);
            let mut others = 0u64;
            for p in s.processes.iter().filter(|p| !pids.contains(&p.pid)) {
                others = others.saturating_add(p.used_bytes);
                match g.other_pids.iter_mut().find(|o| o.0 == p.pid) {
                    Some(o) => {
                        o.2 = o.2.max(p.used_bytes);
                        o.3 = p.used_bytes;
                    }
                    None => g
                        .other_pids
                        .push((p.pid, p.used_bytes, p.used_bytes, p.used_bytes)),
                }
            }
            g.others_max = g.others_max.max(others);
            g.gaps.push(zigzag(super::signed_diff(
                s.used_bytes.saturating_sub(others),
                live,
            )));
        }
        g
    }

    /// (time, gap) of each sample in order.
    fn points(&self) -> impl Iterator<Item = (u64, i64)> + Clone + '_ {
        self.ts
            .iter_from(0)
            .zip(self.gaps.iter_from(0).map(unzigzag))
    }
}

fn device_gap(
    m: &TraceModel,
    c: &Config,
    d: DeviceIdx,
    pids: &[u32],
    found: &mut Found,
) -> HiddenMemory {
    // A sample without the device's total (an imported snapshot's OOM, which knows only the
    // free bytes) says nothing about what is used.
    let samples = m
        .device_samples
        .iter()
        .filter(|s| s.device == d && s.total_bytes > 0);
    let mut g = GapSeries::of(m, d, pids, samples);
    let other_pids = core::mem::take(&mut g.other_pids);
    if let Some(f) = other_processes_finding(d, other_pids, g.others_max) {
        found.push(f);
    }
    let points = || g.points().map(|(t, x)| (t, x as f64));
    let mut h = HiddenMemory {
        device: d,
        samples: g.ts.len() as u64,
        mean_gap_bytes: mean_of(points().map(|p| p.1)).unwrap_or(0.0),
        max_gap_bytes: g.points().map(|p| p.1).max().unwrap_or(0),
        other_processes_max_bytes: g.others_max,
        skipped: None,
        spikes: Vec::new(),
        drift: None,
    };
    let (spikes, drift, skipped) = gap_rules(c, points, g.total, m.first_ts_nanos);
    h.spikes = spikes;
    h.drift = drift;
    h.skipped = skipped;
    if h.skipped.is_some() {
        return h;
    }
    if let Some(f) = hidden_spike_finding(c, &h) {
        found.push(f);
    }
    if let Some(f) = hidden_drift_finding(c, &h) {
        found.push(f);
    }
    h
}

/// Other processes on the device: a note naming the largest five by pid.
fn other_processes_finding(
    d: DeviceIdx,
    mut other_pids: Vec<(u32, u64, u64, u64)>,
    others_max: u64,
) -> Option<Finding> {
    if other_pids.is_empty() {
        return None;
    }
    other_pids.sort_by_key(|o| core::cmp::Reverse(o.2));
    let list: Vec<String> = other_pids
        .iter()
        .take(5)
        .map(|o| {
            if o.3 > o.1 {
                format!(
                    "pid {} up to {} (grew {} → {})",
                    o.0,
                    fmt_bytes(o.2),
                    fmt_bytes(o.1),
                    fmt_bytes(o.3)
                )
            } else {
                format!("pid {} up to {}", o.0, fmt_bytes(o.2))
            }
        })
        .collect();
    let mut f = Finding::new(
        FindingKind::OtherProcesses,
        Severity::Info,
        format!("device {}", d.0),
    );
    f.bytes = others_max;
    f.count = other_pids.len() as u64;
    f.headline = format!(
        "other processes hold up to {} of device {}",
        fmt_bytes(others_max),
        d.0
    );
    f.message = format!(
        "other processes used device {} too (not counted as ours): {}",
        d.0,
        list.join(", ")
    );
    f.fix = "nothing required for this program; stop or move them if it needs the memory".into();
    Some(f)
}

/// Brief rises of untraced memory (z-scores of the gap over the rule's threshold).
fn hidden_spike_finding(c: &Config, h: &HiddenMemory) -> Option<Finding> {
    let d = h.device;
    let others_max = h.other_processes_max_bytes;
    let max_z = h.spikes.iter().map(|p| p.z).reduce(f64::max)?;
    let critical = max_z > c.hidden_spike_critical_z;
    let worst = h.spikes.iter().max_by(|a, b| a.z.total_cmp(&b.z)).copied();
    let mut f = Finding::new(
        FindingKind::HiddenSpike,
        Severity::Info,
        format!("device {}", d.0),
    );
    f.bytes = worst.map_or(0, |w| w.gap_bytes.max(0) as u64);
    f.count = h.spikes.len() as u64;
    f.ts_nanos = worst.map(|w| w.ts_nanos);
    f.impact = Some(if critical {
        Impact::High
    } else {
        Impact::Medium
    });
    f.headline = format!("untraced memory on device {} rose briefly", d.0);
    f.message = format!(
        "device {} used {} more than the trace accounts for at its worst (z = {max_z:.1}; mean gap {}; other processes up to {})",
        d.0,
        fmt_bytes(h.max_gap_bytes.max(0) as u64),
        fmt_bytes(h.mean_gap_bytes.max(0.0) as u64),
        fmt_bytes(others_max)
    );
    f.fix = "check libraries that allocate outside the traced API (cuBLAS/cuDNN workspaces, NCCL buffers) at those times".into();
    Some(f)
}

/// Untraced memory of the traced processes that grows steadily (a fit of the gap over time).
fn hidden_drift_finding(c: &Config, h: &HiddenMemory) -> Option<Finding> {
    let d = h.device;
    let fit = h
        .drift
        .filter(|fit| fit.slope > 0.0 && fit.r_squared >= c.hidden_drift_r_squared)?;
    let strong = fit.r_squared > c.hidden_drift_critical_r_squared;
    let mut f = Finding::new(
        FindingKind::HiddenDrift,
        Severity::Warning,
        format!("device {}", d.0),
    );
    f.bytes = h.max_gap_bytes.max(0) as u64;
    f.count = h.samples;
    f.impact = Some(if strong { Impact::High } else { Impact::Medium });
    f.harm_bytes = (fit.slope.max(0.0) * 3600.0) as u64;
    f.bytes_per_hour = Some(fit.slope * 3600.0);
    f.headline = format!(
        "memory our process holds outside the traced allocations grows {}/s on device {}",
        fmt_bytes(fit.slope.max(0.0) as u64),
        d.0
    );
    f.message = format!(
        "device memory of the traced processes that the trace does not account for grows {}/s on device {} (R² = {:.2}; other processes excluded)",
        fmt_bytes(fit.slope.max(0.0) as u64),
        d.0,
        fit.r_squared
    );
    f.fix = "memory grows outside the traced allocations: look for growing library workspaces or a driver-side leak (e.g. contexts, streams or graphs created per iteration)".into();
    Some(f)
}

/// The reference rules on a gap series, `points` giving its (time, gap) in order on each call:
/// (spikes, drift fit, why skipped). The z-scores are those of [`crate::stats::z_scores`] over
/// the gaps, taken over passes rather than from a vector of them.
pub fn gap_rules<I: Iterator<Item = (u64, f64)> + Clone>(
    c: &Config,
    points: impl Fn() -> I,
    device_total_bytes: u64,
    t0: u64,
) -> (Vec<GapPoint>, Option<LinearFit>, Option<String>) {
    let n = points().count();
    if (n as u64) < c.hidden_min_samples {
        return (
            Vec::new(),
            None,
            Some(format!("fewer than {} samples", c.hidden_min_samples)),
        );
    }
    let max_frac = if device_total_bytes > 0 {
        points()
            .map(|(_, g)| (g / device_total_bytes as f64).abs())
            .fold(0.0, f64::max)
    } else {
        0.0
    };
    if max_frac < c.hidden_min_gap_fraction {
        return (
            Vec::new(),
            None,
            Some(format!(
                "the gap never reaches {:.0} % of the device",
                c.hidden_min_gap_fraction * 100.0
            )),
        );
    }
    // The z-scores: the mean, the population spread about it, then each gap's distance.
    let mut spikes = Vec::new();
    let gaps = || points().map(|p| p.1);
    if let (Some(m), Some(sd)) = (mean_of(gaps()), std_population_of(gaps)) {
        for (t, x) in points() {
            let z = if sd <= 0.0 { 0.0 } else { (x - m) / sd };
            if z > c.hidden_spike_z {
                spikes.push(GapPoint {
                    ts_nanos: t,
                    gap_bytes: x as i64,
                    z,
                });
            }
        }
    }
    let drift = if n as u64 >= c.hidden_drift_min_samples {
        linear_fit(points().map(move |(t, g)| (t.saturating_sub(t0) as f64 / 1e9, g)))
    } else {
        None
    };
    (spikes, drift, None)
}

fn oom_finding(m: &TraceModel, o: &OomForensics, stack: crate::format::StackId) -> Finding {
    let others = saturating_sum(o.other_processes.iter().map(|p| p.used_bytes));
    let why = match o.cause {
        OomCause::Fragmentation => match o.gaps {
            Some(g) if g.free_bytes >= o.requested_bytes => format!(
                "fragmentation: {} free between live blocks but the largest free block is {}",
                fmt_bytes(g.free_bytes),
                fmt_bytes(g.largest_free_bytes)
            ),
            _ => match o.free_bytes {
                Some(free) if free >= o.requested_bytes => format!(
                    "fragmentation: the device had {} free, more than requested, but no block of it was usable",
                    fmt_bytes(free)
                ),
                _ => "fragmentation: the allocator held at least the request reserved but unallocated, in blocks too small for it".into(),
            },
        },
        OomCause::OtherProcesses => {
            let list: Vec<String> = o
                .other_processes
                .iter()
                .map(|p| format!("pid {} ({})", p.pid, fmt_bytes(p.used_bytes)))
                .collect();
            format!(
                "other processes hold {}: {}",
                fmt_bytes(others),
                list.join(", ")
            )
        }
        OomCause::UntracedMemory => format!(
            "{} of used memory is neither ours nor another process's (driver, context, libraries)",
            fmt_bytes(o.untraced_bytes)
        ),
        OomCause::OwnAllocations => {
            let top = o
                .live_sites
                .first()
                .map(|s| format!(", mostly {} from {}", fmt_bytes(s.bytes), s.site))
                .unwrap_or_default();
            format!(
                "our own live allocations fill the device ({} live{top})",
                fmt_bytes(o.live_bytes)
            )
        }
    };
    let free = o
        .free_bytes
        .map(|f| format!(", {} free", fmt_bytes(f)))
        .unwrap_or_default();
    let fix = match o.cause {
        OomCause::Fragmentation => "allocate the large buffer early, or enable expandable segments / trim the pool before it".into(),
        OomCause::OtherProcesses => "stop or move the other processes, or limit their memory (CUDA_VISIBLE_DEVICES, MPS limits)".into(),
        OomCause::UntracedMemory => "reduce library workspaces or contexts, or reserve headroom for them".into(),
        OomCause::OwnAllocations => match o.live_sites.first() {
            Some(s) => format!(
                "free or shrink the {} held by {} (allocated at {}) before the failing allocation at {}; check the leak findings",
                fmt_bytes(s.bytes),
                s.site,
                site_location(m, s.stack),
                site_location(m, stack)
            ),
            None => "reduce the batch or model size".into(),
        },
    };
    // Fragmentation that made an allocation fail is a fragmentation finding, critical, with the
    // failure as its evidence (one cause, one finding).
    let kind = if o.cause == OomCause::Fragmentation {
        FindingKind::Fragmentation
    } else {
        FindingKind::OutOfMemory
    };
    let mut f = Finding::new(kind, Severity::Critical, o.site.clone());
    f.device = Some(o.device);
    f.location = match m.user_frame(stack, &[]) {
        Some(u) if !u.file.is_empty() => alloc::format!("{}:{}", u.file, u.line),
        _ => String::new(),
    };
    f.stack = Some(stack);
    f.bytes = o.requested_bytes;
    f.count = 1;
    f.ts_nanos = Some(o.ts_nanos);
    // The program failed: the worst harm there is.
    f.harm_bytes = u64::MAX;
    let cause = match o.cause {
        OomCause::Fragmentation => "fragmentation",
        OomCause::OtherProcesses => "other processes",
        OomCause::UntracedMemory => "memory outside the trace",
        OomCause::OwnAllocations => "its own allocations",
    };
    f.headline = format!(
        "out of memory allocating {} at {}, caused by {cause}",
        fmt_bytes(o.requested_bytes),
        if f.location.is_empty() {
            &o.site
        } else {
            &f.location
        }
    );
    f.message = format!(
        "allocating {} on device {} failed{free}; cause: {why}",
        fmt_bytes(o.requested_bytes),
        o.device.0
    );
    f.fix = fix;
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Scenario, generate};
    use proptest::prelude::*;

    proptest! {
        /// The pools' reserve at each moment, searched onwards in the columns of samples in
        /// time order or in the vector of samples that step back, is the last step's at or
        /// before it as a binary search of every step finds it.
        #[test]
        fn reserved_steps_read_as_the_vector_of_them(
            samples in proptest::collection::vec((0u64..3, 0u64..40, any::<bool>(), 0u64..2, 0u64..2), 0..200),
            sorted in any::<bool>(),
            moments in proptest::collection::vec((0u64..2_000, any::<bool>()), 1..60),
        ) {
            use crate::encode::Encoder;
            use crate::format::{PoolSample, ProcessIdx, Record};
            let mut enc = Encoder::new(&Encoder::header_v1());
            let mut t = 0u64;
            for &(dt, reserved, back, process, pool) in &samples {
                t = if back && !sorted { t.saturating_sub(dt * 3) } else { t + dt * 5 };
                enc.record(&Record::PoolSample(PoolSample {
                    ts_nanos: t,
                    device: DeviceIdx(0),
                    pool,
                    reserved_bytes: reserved << 20,
                    used_bytes: 0,
                    process: ProcessIdx(process as u32),
                }));
            }
            let trace = crate::load(&enc.into_bytes()).expect("the trace loads");
            let m = &trace.model;
            // Every step, in a vector.
            let mut last: Vec<(ProcessIdx, u64, u64)> = Vec::new();
            let mut total = 0u64;
            let mut steps = Vec::new();
            for p in m.pool_samples.iter().filter(|p| p.device == DeviceIdx(0)) {
                total = with_sample(&mut last, total, &p);
                steps.push((p.ts_nanos, total));
            }
            let mut reserve = ReservedSteps::of(m, DeviceIdx(0));
            if steps.windows(2).all(|w| w[0].0 <= w[1].0) {
                prop_assert!(reserve.unsorted.is_none(), "times in order are kept by column");
            }
            let mut at = 0u64;
            for &(dt, back) in &moments {
                at = if back { at.saturating_sub(dt) } else { at + dt / 4 };
                let want = match steps.partition_point(|s| s.0 <= at) {
                    0 => 0,
                    i => steps[i - 1].1,
                };
                prop_assert_eq!(reserve.at(at), want, "at {}", at);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Searched onwards from the last moment, the traced live bytes are those searched
        /// from the start, at moments in time order or not, on each device.
        #[test]
        fn live_bytes_walked_through_are_those_searched_whole(
            scenario in prop::sample::select(Scenario::ALL.to_vec()),
            seed in 0u64..1000,
            moments in proptest::collection::vec((0u64..=1000, any::<bool>()), 1..60),
        ) {
            let (bytes, _) = generate(scenario, 3_000, seed);
            let t = crate::load(&bytes).expect("synthetic trace loads");
            let m = &t.model;
            let (lo, hi) = (m.first_ts_nanos, m.last_ts_nanos + 1);
            let mut devices: Vec<DeviceIdx> = m.series.iter().map(|s| s.key.device).collect();
            devices.dedup();
            for d in devices {
                let mut walk = TracedLive::new(m, d);
                let mut at = lo;
                for &(k, back) in &moments {
                    // Mostly forward, in steps of up to a thousandth of the span; sometimes
                    // anywhere (back in time too).
                    at = if back {
                        lo + (hi - lo) * k / 1000
                    } else {
                        at.saturating_add((hi - lo) * k / 1_000_000).min(hi)
                    };
                    prop_assert_eq!(walk.at(at), traced_live(m, d, at), "{:?} device {:?} at {}", scenario, d, at);
                }
            }
        }
    }
}
