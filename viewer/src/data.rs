//! The viewer's data model: a loaded trace, its `Report`, and the derived tables and series the
//! views draw (call sites, leak candidates, the report's growth scopes and detected spikes,
//! timeline markers, largest allocations, pool and NVML series, OOM moments). Plain Rust on top
//! of `analysis-core`'s public API, tested natively.
//!
//! Everything here is computed once per trace, or per request in time proportional to the
//! answer; drawing code only downsamples (`Timeline::downsample`), so a zoom step costs
//! O(pixels) whatever the trace size.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use analysis_core::Report;
use analysis_core::analysis::scopes::{ScopeGrowth, ScopeKind};
use analysis_core::analysis::{Config, FindingKind, Severity, analyze_view};
use analysis_core::analysis::{GROUP_FIELDS, group_by_stack};
use analysis_core::format::{DeviceIdx, ProcessIdx, StackId, ThreadIdx};
use analysis_core::model::{AllocRecord, Fields, LoadedTrace, Series, TraceModel};
use analysis_core::report::SiteBytes;
use analysis_core::timeline::Timeline;
use analysis_core::units::fmt_bytes;

use crate::chart_index::RangeRows;
use crate::filter::Filter;
use crate::markers::{Marker, MarkerKind};
use crate::site_series::SiteSeries;

/// Filters whose per-site series are kept (the most recent ones).
const SITE_SERIES_KEPT: usize = 4;

/// One row of the call-site table (from `TraceModel::stack_stats`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteRow {
    pub stack: StackId,
    /// Innermost frame, one line.
    pub label: String,
    /// Full stack, innermost first.
    pub frames: Vec<String>,
    pub alloc_bytes: u64,
    pub alloc_count: u64,
    /// Bytes of this site live at the global peak.
    pub peak_bytes: u64,
    pub live_bytes: u64,
    pub live_count: u64,
    pub max_size_bytes: u64,
}

impl SiteRow {
    /// The call-site table's CSV columns.
    pub const SITES_CSV: [&'static str; 7] = [
        "site",
        "allocated_bytes",
        "allocations",
        "at_peak_bytes",
        "live_at_end_bytes",
        "max_size_bytes",
        "stack",
    ];
    /// The live-at-end (leaks) table's CSV columns.
    pub const LIVE_CSV: [&'static str; 6] = [
        "site",
        "live_at_end_bytes",
        "per_call_bytes",
        "calls",
        "still_live",
        "stack",
    ];

    /// Bytes of one live allocation of this site, on average.
    pub fn live_per_call(&self) -> u64 {
        self.live_bytes / self.live_count.max(1)
    }

    /// This row as the call-site table's CSV cells ([`SiteRow::SITES_CSV`]).
    pub fn sites_csv(&self) -> Vec<String> {
        vec![
            self.label.clone(),
            self.alloc_bytes.to_string(),
            self.alloc_count.to_string(),
            self.peak_bytes.to_string(),
            self.live_bytes.to_string(),
            self.max_size_bytes.to_string(),
            self.frames.join(" <- "),
        ]
    }

    /// This row as the live-at-end table's CSV cells ([`SiteRow::LIVE_CSV`]).
    pub fn live_csv(&self) -> Vec<String> {
        vec![
            self.label.clone(),
            self.live_bytes.to_string(),
            self.live_per_call().to_string(),
            self.alloc_count.to_string(),
            self.live_count.to_string(),
            self.frames.join(" <- "),
        ]
    }
}

/// A memory pool's reserved and used bytes over time, for one (process, device).
#[derive(Clone, Debug, Default)]
pub struct PoolSeries {
    pub reserved: Timeline,
    pub used: Timeline,
}

/// A failed allocation with what the trace says about free memory at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomMoment {
    pub ts_nanos: u64,
    pub device: DeviceIdx,
    pub process: ProcessIdx,
    pub requested_bytes: u64,
    pub live_bytes: u64,
    /// Device free memory from the last NVML sample at or before the failure.
    pub device_free_bytes: Option<u64>,
    /// Reserved but unused pool memory (reserved - used) then, when the trace has pool samples.
    pub pool_slack_bytes: Option<u64>,
    /// The largest free block then, by address ([`TraceData::largest_free_at_oom`]).
    pub largest_free_bytes: Option<u64>,
    pub site: String,
}

/// One stretch of a device's address range at a moment: live allocations (overlapping or
/// adjacent ones merged) or the free gap up to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressStretch {
    pub start: u64,
    pub bytes: u64,
    pub live: bool,
}

/// The device allocations of `device` live at `t`, by address, from the lowest live address to
/// the highest live end, with the free gaps between them: the map behind
/// `analysis_core::analysis::fragmentation::address_gaps`, whose widest gap is the largest
/// free block (a unit test holds them equal).
pub fn address_layout(m: &TraceModel, device: DeviceIdx, t: u64) -> Vec<AddressStretch> {
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
    live.sort_unstable();
    let mut out: Vec<AddressStretch> = Vec::new();
    let mut end = match live.first() {
        Some(&(a, _)) => a,
        None => return out,
    };
    for (a, b) in live {
        if a > end {
            out.push(AddressStretch {
                start: end,
                bytes: a - end,
                live: false,
            });
        }
        if b > end {
            match out.last_mut() {
                Some(l) if l.live && l.start + l.bytes >= a.max(end) => l.bytes = b - l.start,
                _ => out.push(AddressStretch {
                    start: a.max(end),
                    bytes: b - a.max(end),
                    live: true,
                }),
            }
            end = b;
        }
    }
    out
}

/// A marker of the timeline (failed allocation, teardown, detected spike) and the series it
/// belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesMarker {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub marker: Marker,
}

/// A scope of the report's growth analysis (`report.analysis.scopes[index]`) with the severity
/// of the finding or note the report made about it, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct ScopeRow<'a> {
    pub index: usize,
    pub scope: &'a ScopeGrowth,
    /// `None`: the report made no finding about this scope (not flagged, or explained by an
    /// enclosed scope).
    pub severity: Option<Severity>,
}

impl ScopeRow<'_> {
    /// "bounded", "unbounded" or "none" (the scope did not grow).
    pub const fn growth_class(&self) -> &'static str {
        if self.scope.total_growth_bytes <= 0 {
            "none"
        } else if self.scope.bounded {
            "bounded"
        } else {
            "unbounded"
        }
    }
}

/// A spike the report detected: a sudden rise and fall of live bytes (timeline rule), an
/// allocation far above its scope's usual sizes (scope rule), or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectedSpike {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    /// Device live bytes (all devices) right after it was allocated.
    pub live_bytes: u64,
    /// How long the rise lasted (timeline rule only).
    pub duration_nanos: Option<u64>,
    pub stack: StackId,
    pub site: String,
    pub timeline_rule: bool,
    /// Scopes whose outlier rule flagged it.
    pub scopes: Vec<String>,
}

/// What the detectors found: the report, and the timeline markers that depend on it.
#[derive(Debug)]
struct Detected {
    report: Report,
    /// Failed allocations, teardowns and detected spikes, in time order.
    markers: Vec<SeriesMarker>,
}

/// A loaded trace and everything derived from it. The detectors' results (the report and the
/// markers) can come later than the rest ([`TraceData::without_report`], then
/// [`TraceData::detect`]), so the viewer draws the timeline first.
#[derive(Debug)]
pub struct TraceData {
    /// The file name or URL it came from.
    pub source: String,
    /// The trace as loaded: the report's figures (what the device held) come from it.
    pub trace: LoadedTrace,
    /// Where the trace has a framework's blocks (its tensors), the model the analysis reads
    /// (`layers::tensor_view`: the tensors are the allocations, the segments holding them
    /// the pool's reserve); every view's series and tables read it too ([`TraceData::model`]).
    view: Option<TraceModel>,
    detected: std::sync::OnceLock<Detected>,
    /// Every call site, unsorted ([`TraceData::sites`]: built on first use, so a load's first
    /// view does not wait for every stack's frames to be formatted).
    sites: std::sync::OnceLock<Vec<SiteRow>>,
    /// Pool samples as step series per (process, device).
    pub pools: BTreeMap<(ProcessIdx, DeviceIdx), PoolSeries>,
    /// NVML device used bytes per device.
    pub device_used: BTreeMap<DeviceIdx, Timeline>,
    /// `model().series[i].timeline` with a time index, for drawing.
    pub plots: Vec<Timeline>,
    /// `model().total` with a time index.
    pub total: Timeline,
    /// NVTX range instances by nesting row, for the range bands.
    pub range_rows: RangeRows,
    /// Live bytes per call site over time for the stacked timeline, per filter, most recent
    /// last ([`TraceData::site_series`]: built on first use, not while loading).
    site_series: std::sync::Mutex<Vec<(Filter, std::sync::Arc<SiteSeries>)>>,
    /// The last [`TraceData::stacks_matching`] answer.
    matching: std::sync::Mutex<Option<(String, std::sync::Arc<Vec<StackId>>)>>,
}

impl TraceData {
    /// Summarizes a loaded trace and builds the derived tables.
    pub fn new(trace: LoadedTrace, source: impl Into<String>) -> Self {
        let a = Self::without_report(trace, source);
        a.detect();
        a
    }

    /// Builds the derived tables, not yet the report ([`TraceData::detect`] adds it).
    pub fn without_report(trace: LoadedTrace, source: impl Into<String>) -> Self {
        let view = analysis_core::layers::tensor_view(&trace.model);
        let m = view.as_ref().unwrap_or(&trace.model);
        // Pool samples: each (process, device, pool) reports its current value; the series is the
        // sum over pools of the latest value of each.
        let mut pool_steps: BTreeMap<(ProcessIdx, DeviceIdx), (Timeline, Timeline)> =
            BTreeMap::new();
        let mut latest: BTreeMap<(ProcessIdx, DeviceIdx, u64), (u64, u64)> = BTreeMap::new();
        let mut samples: Vec<_> = m.pool_samples.iter().collect();
        samples.sort_by_key(|s| s.ts_nanos);
        for s in samples {
            latest.insert(
                (s.process, s.device, s.pool),
                (s.reserved_bytes, s.used_bytes),
            );
            let (r, u) = latest
                .range((s.process, s.device, 0)..=(s.process, s.device, u64::MAX))
                .fold((0u64, 0u64), |(r, u), (_, v)| {
                    (r.saturating_add(v.0), u.saturating_add(v.1))
                });
            let e = pool_steps.entry((s.process, s.device)).or_default();
            e.0.push(s.ts_nanos, r);
            e.1.push(s.ts_nanos, u);
        }
        let pools = pool_steps
            .into_iter()
            .map(|(k, (mut reserved, mut used))| {
                reserved.build_index();
                used.build_index();
                (k, PoolSeries { reserved, used })
            })
            .collect();
        let mut device_used: BTreeMap<DeviceIdx, Timeline> = BTreeMap::new();
        let mut dsamples: Vec<_> = m.device_samples.iter_fixed().collect();
        dsamples.sort_by_key(|s| s.ts_nanos);
        for s in dsamples {
            device_used
                .entry(s.device)
                .or_default()
                .push(s.ts_nanos, s.used_bytes);
        }
        let device_used = device_used
            .into_iter()
            .map(|(d, mut t)| {
                t.build_index();
                (d, t)
            })
            .collect();
        let plots = m.series.iter().map(|s| s.timeline.clone()).collect();
        let total = m.total.clone();
        let range_rows = RangeRows::new(&m.ranges);
        Self {
            source: source.into(),
            trace,
            view,
            detected: std::sync::OnceLock::new(),
            sites: std::sync::OnceLock::new(),
            pools,
            device_used,
            plots,
            total,
            range_rows,
            site_series: std::sync::Mutex::new(Vec::new()),
            matching: std::sync::Mutex::new(None),
        }
    }

    /// The model the views show: the tensor view where the trace has framework blocks, else
    /// the trace's own.
    pub fn model(&self) -> &TraceModel {
        self.view.as_ref().unwrap_or(&self.trace.model)
    }

    /// Whether the trace has a framework's tensors (the views then show them, not the
    /// segments holding them).
    pub fn has_tensor_layer(&self) -> bool {
        self.view.is_some()
    }

    /// Runs the detectors (the report) and places their markers, once; builds the call-site
    /// table too, so the views that list call sites open at once.
    pub fn detect(&self) {
        self.detected.get_or_init(|| {
            let report = analyze_view(&self.trace, self.view.as_ref(), &Config::default());
            let markers = markers(self.model(), &report);
            Detected { report, markers }
        });
        self.sites();
    }

    /// Every call site, unsorted (built on the first call).
    pub fn sites(&self) -> &[SiteRow] {
        self.sites.get_or_init(|| {
            let m = self.model();
            m.stack_stats
                .values()
                .map(|s| SiteRow {
                    stack: s.stack,
                    label: m.stack_label(s.stack),
                    frames: m
                        .stack_frames(s.stack)
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    alloc_bytes: s.alloc_bytes,
                    alloc_count: s.alloc_count,
                    peak_bytes: s.peak_bytes,
                    live_bytes: s.live_bytes,
                    live_count: s.live_count,
                    max_size_bytes: s.max_size_bytes,
                })
                .collect()
        })
    }

    /// The per-site series of the allocations `f` admits, if [`TraceData::site_series`] built
    /// them already.
    pub fn site_series_built(&self, f: &Filter) -> Option<std::sync::Arc<SiteSeries>> {
        let cache = self.site_series.lock().ok()?;
        cache.iter().find(|(g, _)| g == f).map(|(_, s)| s.clone())
    }

    /// The per-site series of the allocations `f` admits, built on the first call for `f`
    /// (O(allocations · log) then; the last few filters are kept).
    pub fn site_series(&self, f: &Filter) -> std::sync::Arc<SiteSeries> {
        if let Some(s) = self.site_series_built(f) {
            return s;
        }
        let built = std::sync::Arc::new(SiteSeries::build(
            self.model(),
            f,
            self.whole_of(f).is_none(),
        ));
        if let Ok(mut cache) = self.site_series.lock() {
            if cache.len() >= SITE_SERIES_KEPT {
                cache.remove(0);
            }
            cache.push((*f, built.clone()));
        }
        built
    }

    /// Device live bytes of what `f` admits as one timeline the model already has: the total
    /// for no filter, the one series a process or device filter leaves; `None` otherwise
    /// (several series, or a thread filter: `SiteSeries` then builds it).
    pub fn whole_of(&self, f: &Filter) -> Option<&Timeline> {
        if f.is_all() {
            return Some(&self.total);
        }
        if f.thread.is_some() {
            return None;
        }
        match self.series_plots(f).as_slice() {
            [(_, plot)] => Some(plot),
            _ => None,
        }
    }

    /// The stacks with a frame that contains `needle` (case-insensitive, as the call-site
    /// search matches), sorted; the last answer is kept, so a draw per zoom step reuses it.
    pub fn stacks_matching(&self, needle: &str) -> std::sync::Arc<Vec<StackId>> {
        let needle = needle.to_lowercase();
        if let Ok(cache) = self.matching.lock()
            && let Some((n, s)) = cache.as_ref()
            && *n == needle
        {
            return s.clone();
        }
        let mut stacks: Vec<StackId> = self
            .sites()
            .iter()
            .filter(|r| site_matches(r, &needle))
            .map(|r| r.stack)
            .collect();
        stacks.sort();
        let stacks = std::sync::Arc::new(stacks);
        if let Ok(mut cache) = self.matching.lock() {
            *cache = Some((needle, stacks.clone()));
        }
        stacks
    }

    /// The report, once [`TraceData::detect`] ran.
    pub fn report(&self) -> Option<&Report> {
        self.detected.get().map(|d| &d.report)
    }

    /// The trace's time extent `[first, last]`, at least 1 ns wide.
    pub fn time_extent(&self) -> (u64, u64) {
        let m = self.model();
        let a = m.first_ts_nanos;
        (a, m.last_ts_nanos.max(a + 1))
    }

    /// Device-memory series that pass the filter.
    pub fn series(&self, f: &Filter) -> Vec<&Series> {
        self.trace
            .model
            .series
            .iter()
            .filter(|s| !s.key.host && f.admits_series(s.key.process, s.key.device))
            .collect()
    }

    /// Device-memory series that pass the filter, with their indexed timelines.
    pub fn series_plots(&self, f: &Filter) -> Vec<(&Series, &Timeline)> {
        self.trace
            .model
            .series
            .iter()
            .zip(&self.plots)
            .filter(|(s, _)| !s.key.host && f.admits_series(s.key.process, s.key.device))
            .collect()
    }

    /// Devices that appear in the trace (declared or allocated on), as the report lists them.
    pub fn devices(&self) -> Vec<DeviceIdx> {
        let m = self.model();
        let mut v: Vec<DeviceIdx> = m.devices.iter().map(|d| d.device).collect();
        v.extend(m.undeclared_devices());
        v.sort();
        v.dedup();
        v
    }

    /// Processes that appear in the trace.
    pub fn processes(&self) -> Vec<ProcessIdx> {
        let mut v: Vec<ProcessIdx> = self
            .trace
            .model
            .processes
            .iter()
            .map(|p| p.process)
            .collect();
        for s in &self.model().series {
            v.push(s.key.process);
        }
        v.sort();
        v.dedup();
        v
    }

    /// Threads that appear in the trace, with their names.
    pub fn threads(&self) -> Vec<(ThreadIdx, String)> {
        let m = self.model();
        let mut v: Vec<(ThreadIdx, String)> = m
            .threads
            .iter()
            .map(|t| (t.thread, m.string(t.name).to_string()))
            .collect();
        v.sort();
        v.dedup_by_key(|t| t.0);
        v
    }

    /// Device live bytes at `t` over the series that pass the filter.
    pub fn live_bytes_at(&self, t: u64, f: &Filter) -> u64 {
        self.series(f).iter().map(|s| s.timeline.value_at(t)).sum()
    }

    /// Device allocations live at `t`, grouped by stack, largest first.
    pub fn live_sites_at(&self, t: u64, f: &Filter, limit: usize) -> Vec<SiteBytes> {
        let m = self.model();
        // Only the allocations made by `t` can be live at `t` (`made_by`: in time order or not).
        let made = m.allocs.made_by(t);
        group_by_stack(
            m,
            m.allocs
                .live_at_fields(t, made, GROUP_FIELDS | Fields::KIND | Filter::FIELDS)
                .filter(|a| a.kind.is_device_memory() && f.admits(a)),
            limit,
        )
    }

    /// Live bytes of one call site over time (a step series), built from its allocations.
    pub fn site_growth(&self, stack: StackId) -> Timeline {
        let mut deltas: Vec<(u64, i128)> = Vec::new();
        let fields = Fields::STACK | Fields::KIND | Fields::TS | Fields::SIZE | Fields::FREE;
        for a in self
            .model()
            .allocs
            .iter_fields(fields)
            .filter(|a| a.stack == stack)
        {
            if !a.kind.is_device_memory() {
                continue;
            }
            deltas.push((a.ts_nanos, i128::from(a.size_bytes)));
            if !a.is_live() {
                deltas.push((a.free_ts_nanos, -i128::from(a.size_bytes)));
            }
        }
        deltas.sort_by_key(|d| d.0);
        let mut t = Timeline::new();
        let mut cur: i128 = 0;
        for (ts, d) in deltas {
            cur += d;
            t.push(ts, cur.max(0) as u64);
        }
        t.build_index();
        t
    }

    /// Call-site rows for the allocations that pass the filter: the precomputed table for the
    /// whole trace, or one built from the allocations (O(allocations)) for a process, device or
    /// thread.
    pub fn site_rows(&self, f: &Filter) -> Cow<'_, [SiteRow]> {
        if f.is_all() {
            return Cow::Borrowed(self.sites());
        }
        let m = self.model();
        let peak_t = m.peak_ts_nanos;
        let mut by: BTreeMap<StackId, SiteRow> = BTreeMap::new();
        let fields = Filter::FIELDS | Fields::SIZE | Fields::STACK | Fields::KIND;
        for a in m
            .allocs
            .iter_fields(fields | Fields::TS | Fields::FREE)
            .filter(|a| f.admits(a) && a.size_bytes > 0)
        {
            let row = by.entry(a.stack).or_insert_with(|| SiteRow {
                stack: a.stack,
                label: String::new(),
                frames: Vec::new(),
                alloc_bytes: 0,
                alloc_count: 0,
                peak_bytes: 0,
                live_bytes: 0,
                live_count: 0,
                max_size_bytes: 0,
            });
            row.alloc_bytes += a.size_bytes;
            row.alloc_count += 1;
            row.max_size_bytes = row.max_size_bytes.max(a.size_bytes);
            if a.is_live() {
                row.live_bytes += a.size_bytes;
                row.live_count += 1;
            }
            if m.peak_bytes > 0 && a.kind.is_device_memory() && a.live_at(peak_t) {
                row.peak_bytes += a.size_bytes;
            }
        }
        let labels: BTreeMap<StackId, (&str, &[String])> = self
            .sites()
            .iter()
            .map(|s| (s.stack, (s.label.as_str(), s.frames.as_slice())))
            .collect();
        Cow::Owned(
            by.into_values()
                .map(|mut r| {
                    if let Some((label, frames)) = labels.get(&r.stack) {
                        r.label = (*label).to_string();
                        r.frames = frames.to_vec();
                    }
                    r
                })
                .collect(),
        )
    }

    /// The report's growth scopes with the severity of their findings, in report order
    /// (largest growth first); none before [`TraceData::detect`].
    pub fn scope_rows(&self) -> Vec<ScopeRow<'_>> {
        let Some(r) = self.report() else {
            return Vec::new();
        };
        r.analysis
            .scopes
            .iter()
            .enumerate()
            .map(|(index, scope)| {
                let severity = r
                    .findings
                    .iter()
                    .chain(&r.notes)
                    .filter(|f| {
                        (f.kind.is_leak()
                            || matches!(
                                f.kind,
                                FindingKind::ScopeGrowth | FindingKind::BoundedGrowth
                            ))
                            && f.scope.as_deref() == Some(scope.scope.as_str())
                    })
                    .map(|f| f.severity)
                    .max();
                ScopeRow {
                    index,
                    scope,
                    severity,
                }
            })
            .collect()
    }

    /// Growth of an NVTX scope over time: the running sum of its calls' growth (live bytes after
    /// minus before), stepped at the end of each call; ends at `total_growth_bytes`. `None` for
    /// a call-site scope (its growth is `site_growth` of its stack). Negative sums show as 0.
    pub fn scope_growth(&self, scope: &ScopeGrowth) -> Option<Timeline> {
        if scope.kind != ScopeKind::NvtxRange {
            return None;
        }
        let m = self.model();
        let mut is_scope: BTreeMap<(u32, u32), bool> = BTreeMap::new();
        let mut ends: Vec<(u64, i64)> = m
            .ranges
            .iter()
            .filter(|r| {
                *is_scope.entry((r.name.0, r.domain.0)).or_insert_with(|| {
                    nvtx_scope_name(m.string(r.domain), m.string(r.name)) == scope.scope
                })
            })
            .filter_map(|r| r.end_ts_nanos.map(|e| (e, r.growth_bytes())))
            .collect();
        ends.sort_by_key(|e| e.0);
        let mut t = Timeline::new();
        let mut sum: i128 = 0;
        for (ts, g) in ends {
            sum += i128::from(g);
            t.push(ts, sum.clamp(0, i128::from(u64::MAX)) as u64);
        }
        t.build_index();
        Some(t)
    }

    /// The spikes the report detected (timeline and scope rules), in time order; one row per
    /// allocation; none before [`TraceData::detect`].
    pub fn detected_spikes(&self) -> Vec<DetectedSpike> {
        let Some(r) = self.report() else {
            return Vec::new();
        };
        let a = &r.analysis;
        let mut by: BTreeMap<(u64, StackId), DetectedSpike> = BTreeMap::new();
        for s in &a.timeline_spikes {
            let e = by
                .entry((s.ts_nanos, s.stack))
                .or_insert_with(|| DetectedSpike {
                    ts_nanos: s.ts_nanos,
                    size_bytes: s.size_bytes,
                    live_bytes: s.live_bytes,
                    duration_nanos: None,
                    stack: s.stack,
                    site: s.site.clone(),
                    timeline_rule: false,
                    scopes: Vec::new(),
                });
            e.timeline_rule = true;
            e.live_bytes = s.live_bytes;
            e.duration_nanos = Some(s.duration_nanos);
        }
        for sc in &a.scope_spikes {
            for s in &sc.events {
                let e = by
                    .entry((s.ts_nanos, s.stack))
                    .or_insert_with(|| DetectedSpike {
                        ts_nanos: s.ts_nanos,
                        size_bytes: s.size_bytes,
                        live_bytes: self.total.value_at(s.ts_nanos),
                        duration_nanos: None,
                        stack: s.stack,
                        site: s.site.clone(),
                        timeline_rule: false,
                        scopes: Vec::new(),
                    });
                if !e.scopes.contains(&sc.scope) {
                    e.scopes.push(sc.scope.clone());
                }
            }
        }
        by.into_values().collect()
    }

    /// Markers of the series that pass the filter, inside `[t0, t1]`; none before
    /// [`TraceData::detect`].
    pub fn markers_in(&self, f: &Filter, t0: u64, t1: u64) -> impl Iterator<Item = &Marker> {
        let markers = self.detected.get().map_or(&[][..], |d| &d.markers);
        let from = markers.partition_point(|m| m.marker.ts_nanos < t0);
        markers[from..]
            .iter()
            .take_while(move |m| m.marker.ts_nanos <= t1)
            .filter(move |m| f.admits_series(m.process, m.device))
            .map(|m| &m.marker)
    }

    /// Call sites with bytes still live at the end of the trace: the leak candidates, largest
    /// first. (The detectors will classify them as growing or bounded.)
    pub fn leak_candidates(&self, f: &Filter) -> Vec<SiteRow> {
        let mut v: Vec<SiteRow> = self
            .site_rows(f)
            .iter()
            .filter(|s| s.live_bytes > 0)
            .cloned()
            .collect();
        v.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.stack.cmp(&b.stack)));
        v
    }

    /// The `n` largest device allocations that were freed during the trace (transient memory),
    /// largest first.
    pub fn largest_transients(&self, n: usize, f: &Filter) -> Vec<AllocRecord> {
        let mut v: Vec<AllocRecord> = self
            .trace
            .model
            .allocs
            .iter()
            .filter(|a| {
                a.kind.is_device_memory() && !a.is_live() && a.size_bytes > 0 && f.admits(a)
            })
            .collect();
        let n = n.min(v.len());
        if n == 0 {
            return Vec::new();
        }
        v.select_nth_unstable_by(n - 1, |a, b| b.size_bytes.cmp(&a.size_bytes));
        v.truncate(n);
        v.sort_by(|a, b| {
            b.size_bytes
                .cmp(&a.size_bytes)
                .then(a.ts_nanos.cmp(&b.ts_nanos))
        });
        v
    }

    /// Each failed allocation with the free memory the trace recorded around it.
    /// The largest free block on `device` at the failed allocation at `ts_nanos`: the widest
    /// gap between the device allocations live then, by address, from the report's OOM
    /// forensics (`analysis_core::analysis::fragmentation::address_gaps`). The overview and
    /// the fragmentation view both show this number. `None` before the detectors ran, or when
    /// the addresses do not tell (no live allocation, or live blocks in regions too far apart
    /// to be one pool).
    pub fn largest_free_at_oom(&self, ts_nanos: u64, device: DeviceIdx) -> Option<u64> {
        self.report()?
            .analysis
            .oom
            .iter()
            .find(|o| o.ts_nanos == ts_nanos && o.device == device)?
            .gaps
            .map(|g| g.largest_free_bytes)
    }

    pub fn oom_moments(&self) -> Vec<OomMoment> {
        let m = self.model();
        m.failed
            .iter()
            .filter(|f| f.record.is_out_of_memory())
            .map(|f| {
                let r = &f.record;
                let device_free_bytes = m
                    .device_samples
                    .iter_fixed()
                    .filter(|s| s.device == r.device && s.ts_nanos <= r.ts_nanos)
                    .max_by_key(|s| s.ts_nanos)
                    .map(|s| s.free_bytes);
                let pool_slack_bytes = self.pools.get(&(r.process, r.device)).map(|p| {
                    p.reserved
                        .value_at(r.ts_nanos)
                        .saturating_sub(p.used.value_at(r.ts_nanos))
                });
                OomMoment {
                    ts_nanos: r.ts_nanos,
                    device: r.device,
                    process: r.process,
                    requested_bytes: r.size_bytes,
                    live_bytes: f.live_bytes,
                    device_free_bytes,
                    pool_slack_bytes,
                    largest_free_bytes: self.largest_free_at_oom(r.ts_nanos, r.device),
                    site: m.stack_label(r.stack),
                }
            })
            .collect()
    }
}

/// Sorts call-site rows by a column.
pub fn sort_sites(rows: &mut [&SiteRow], key: crate::state::SortKey, ascending: bool) {
    use crate::state::SortKey as K;
    rows.sort_by(|a, b| {
        let o = match key {
            K::Bytes => a.alloc_bytes.cmp(&b.alloc_bytes),
            K::Count => a.alloc_count.cmp(&b.alloc_count),
            K::Peak => a.peak_bytes.cmp(&b.peak_bytes),
            K::Live => a.live_bytes.cmp(&b.live_bytes),
            K::MaxSize => a.max_size_bytes.cmp(&b.max_size_bytes),
            K::Site => b.label.cmp(&a.label),
        };
        let o = o.then(b.stack.cmp(&a.stack));
        if ascending { o } else { o.reverse() }
    });
}

/// Sorts scope rows by a column; ties keep the report's order.
pub fn sort_scope_rows(
    rows: &mut [ScopeRow<'_>],
    key: crate::state::ScopeSortKey,
    ascending: bool,
) {
    use crate::state::ScopeSortKey as K;
    rows.sort_by(|a, b| {
        let (x, y) = (a.scope, b.scope);
        let o = match key {
            K::Scope => x.scope.cmp(&y.scope),
            K::Severity => a.severity.cmp(&b.severity),
            K::Growth => x.total_growth_bytes.cmp(&y.total_growth_bytes),
            K::PerCall => x.avg_growth_bytes.total_cmp(&y.avg_growth_bytes),
            K::Calls => x.calls.cmp(&y.calls),
        };
        let o = if ascending { o } else { o.reverse() };
        o.then(a.index.cmp(&b.index))
    });
}

/// Whether a call site matches a search text (case-insensitive, any frame).
pub fn site_matches(row: &SiteRow, needle_lower: &str) -> bool {
    needle_lower.is_empty()
        || row.label.to_lowercase().contains(needle_lower)
        || row
            .frames
            .iter()
            .any(|f| f.to_lowercase().contains(needle_lower))
}

/// The rows of each innermost label that more than one row carries. Rows are distinct stacks,
/// so such a label names one function reached from different callers (or through different
/// library frames): the table marks those rows and lists the stacks that share the label.
/// Rows without a stack (empty label) are not grouped.
pub fn shared_labels<'a>(
    rows: impl IntoIterator<Item = &'a SiteRow>,
) -> BTreeMap<&'a str, Vec<&'a SiteRow>> {
    let mut by: BTreeMap<&str, Vec<&SiteRow>> = BTreeMap::new();
    for r in rows {
        if !r.label.is_empty() {
            by.entry(r.label.as_str()).or_default().push(r);
        }
    }
    by.retain(|_, v| v.len() > 1);
    by
}

/// Whether the search keeps a scope row: its name or top call site holds `needle_lower`, or
/// the stack that kept the most bytes is one of `matching` (sorted, from
/// [`TraceData::stacks_matching`], so any frame of that stack counts).
pub fn scope_matches(row: &ScopeRow<'_>, needle_lower: &str, matching: &[StackId]) -> bool {
    let s = row.scope;
    needle_lower.is_empty()
        || s.scope.to_lowercase().contains(needle_lower)
        || s.top_site
            .as_ref()
            .is_some_and(|t| t.to_lowercase().contains(needle_lower))
        || s.top_stack
            .is_some_and(|st| matching.binary_search(&st).is_ok())
}

/// A table as CSV (RFC 4180 quoting). A cell that a spreadsheet would run as a formula (it
/// starts with `=`, `+`, `-`, `@`, a tab or a carriage return, and is not a plain number) gets
/// a leading `'`, so a call site named `=HYPERLINK(…)` in a trace stays text.
pub fn to_csv(headers: &[&str], rows: &[Vec<String>]) -> String {
    fn cell(out: &mut String, s: &str) {
        let formula = s.starts_with(['=', '+', '-', '@', '\t', '\r']) && s.parse::<f64>().is_err();
        let s: std::borrow::Cow<'_, str> = if formula {
            format!("'{s}").into()
        } else {
            s.into()
        };
        if s.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&s.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(&s);
        }
    }
    let mut out = String::new();
    for (i, h) in headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        cell(&mut out, h);
    }
    out.push_str("\r\n");
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            cell(&mut out, c);
        }
        out.push_str("\r\n");
    }
    out
}

/// A percentage with one decimal: `12.5 %`.
pub fn fmt_percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "–".into();
    }
    let mut s = String::new();
    let _ = write!(s, "{:.1} %", part as f64 * 100.0 / whole as f64);
    s
}

/// The name the report gives an NVTX scope: `domain::name`, or `name` without a domain.
pub fn nvtx_scope_name(domain: &str, name: &str) -> String {
    if domain.is_empty() {
        name.to_string()
    } else {
        format!("{domain}::{name}")
    }
}

/// Failed allocations, teardowns and the report's detected spikes as timeline markers, in time
/// order.
fn markers(m: &TraceModel, report: &Report) -> Vec<SeriesMarker> {
    let mut out: Vec<SeriesMarker> = m
        .failed
        .iter()
        .map(|x| SeriesMarker {
            process: x.record.process,
            device: x.record.device,
            marker: Marker {
                ts_nanos: x.record.ts_nanos,
                label: if x.record.is_out_of_memory() {
                    format!("OOM {}", fmt_bytes(x.record.size_bytes))
                } else {
                    format!(
                        "failed {} (error {})",
                        fmt_bytes(x.record.size_bytes),
                        x.record.error_code
                    )
                },
                kind: MarkerKind::FailedAlloc,
                count: 1,
            },
        })
        .collect();
    out.extend(m.resets.iter().map(|r| SeriesMarker {
        process: r.record.process,
        device: r.record.device,
        marker: Marker {
            ts_nanos: r.record.ts_nanos,
            label: format!("teardown −{}", fmt_bytes(r.freed_bytes)),
            kind: MarkerKind::Teardown,
            count: 1,
        },
    }));
    let mut spikes: Vec<(u64, u64, StackId)> = report
        .analysis
        .timeline_spikes
        .iter()
        .map(|s| (s.ts_nanos, s.size_bytes, s.stack))
        .chain(report.analysis.scope_spikes.iter().flat_map(|sc| {
            sc.events
                .iter()
                .map(|s| (s.ts_nanos, s.size_bytes, s.stack))
        }))
        .collect();
    spikes.sort_unstable();
    spikes.dedup();
    for (ts, size, stack) in spikes {
        // The allocation itself says which process and device the spike is on.
        // Where records step back, allocations made at other times lie among the ids.
        let span = m.allocs.made_in(ts, ts);
        let Some(a) = m
            .allocs
            .iter_range(span.start, span.end)
            .find(|a| a.ts_nanos == ts && a.stack == stack && a.size_bytes == size)
        else {
            continue;
        };
        out.push(SeriesMarker {
            process: a.process,
            device: a.device,
            marker: Marker {
                ts_nanos: ts,
                label: format!("spike {}", fmt_bytes(size)),
                kind: MarkerKind::Spike,
                count: 1,
            },
        });
    }
    out.sort_by_key(|m| m.marker.ts_nanos);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    /// The report of an analysis made by `TraceData::new` (which runs the detectors).
    fn rep(a: &TraceData) -> &Report {
        a.report().expect("TraceData::new runs the detectors")
    }

    fn analysis(s: Scenario) -> (TraceData, analysis_core::synth::GroundTruth) {
        let (bytes, truth) = generate(s, 5_000, 7);
        let trace = analysis_core::load(&bytes).expect("synthetic trace loads");
        (TraceData::new(trace, s.name()), truth)
    }

    #[test]
    fn sites_add_up_to_the_report() {
        let (a, truth) = analysis(Scenario::TrainingLeak);
        let live: u64 = a.sites().iter().map(|s| s.live_bytes).sum();
        assert_eq!(live, rep(&a).live_at_end_bytes);
        assert_eq!(rep(&a).live_at_end_bytes, truth.live_at_end_bytes);
        let at_peak: u64 = a.sites().iter().map(|s| s.peak_bytes).sum();
        assert_eq!(at_peak, rep(&a).peak_bytes);
        let top = a.leak_candidates(&Filter::default());
        assert!(
            top.iter().any(|s| s.label.contains("record_loss")),
            "{:?}",
            top.iter().map(|s| &s.label).collect::<Vec<_>>()
        );
    }

    fn row(stack: u32, frames: &[&str]) -> SiteRow {
        SiteRow {
            stack: StackId(stack),
            label: frames.first().map_or(String::new(), |f| (*f).to_string()),
            frames: frames.iter().map(|f| (*f).to_string()).collect(),
            alloc_bytes: 0,
            alloc_count: 0,
            peak_bytes: 0,
            live_bytes: 0,
            live_count: 0,
            max_size_bytes: 0,
        }
    }

    #[test]
    fn shared_labels_group_the_stacks_of_one_innermost_frame() {
        let rows = [
            row(1, &["empty (torch/_tensor.py:1)", "forward (model.py:33)"]),
            row(2, &["matmul (model.py:51)", "forward (model.py:33)"]),
            row(3, &["empty (torch/_tensor.py:1)", "backward (model.py:77)"]),
            row(
                4,
                &["empty (torch/_tensor.py:1)", "record_loss (train.py:42)"],
            ),
            row(5, &[]),
            row(6, &[]),
        ];
        let shared = shared_labels(&rows);
        // One label is shared (by three stacks); a label of one stack and rows without a
        // stack are not.
        assert_eq!(shared.len(), 1, "{:?}", shared.keys().collect::<Vec<_>>());
        let stacks: Vec<u32> = shared["empty (torch/_tensor.py:1)"]
            .iter()
            .map(|r| r.stack.0)
            .collect();
        assert_eq!(stacks, [1, 3, 4]);
    }

    #[test]
    fn the_search_matches_any_frame_of_a_stack_and_keeps_scopes_by_their_stack() {
        let (a, _) = analysis(Scenario::TrainingLeak);
        // `train_step` is never the innermost frame, but every step's stack holds it.
        let matching = a.stacks_matching("TRAIN_STEP");
        assert!(!matching.is_empty());
        for st in matching.iter() {
            let r = a.sites().iter().find(|r| r.stack == *st).expect("a row");
            assert!(!r.label.contains("train_step"), "{}", r.label);
            assert!(r.frames.iter().any(|f| f.contains("train_step")));
        }
        assert!(
            matching.len() < a.sites().len(),
            "build_model's stack has no train_step"
        );
        let scopes = a.scope_rows();
        let with_stack = scopes
            .iter()
            .find(|r| r.scope.top_stack.is_some())
            .expect("a scope with a top stack");
        let top = with_stack.scope.top_stack.expect("checked");
        let outer = frames_of_stack(&a, top);
        let outer = outer.last().expect("frames").to_lowercase();
        let by_frame = a.stacks_matching(&outer);
        assert!(scope_matches(with_stack, &outer, &by_frame));
        assert!(scope_matches(with_stack, "", &[]));
        let none = a.stacks_matching("no_such_frame_anywhere");
        assert!(!scope_matches(with_stack, "no_such_frame_anywhere", &none));
    }

    fn frames_of_stack(a: &TraceData, st: StackId) -> Vec<String> {
        a.sites()
            .iter()
            .find(|r| r.stack == st)
            .map(|r| r.frames.clone())
            .unwrap_or_default()
    }

    #[test]
    fn csv_rows_have_a_cell_per_column_in_its_order() {
        let (a, _) = analysis(Scenario::TrainingLeak);
        let row = &a.leak_candidates(&Filter::default())[0];
        let sites = row.sites_csv();
        assert_eq!(sites.len(), SiteRow::SITES_CSV.len());
        assert_eq!(sites[1], row.alloc_bytes.to_string());
        assert_eq!(sites[4], row.live_bytes.to_string());
        let live = row.live_csv();
        assert_eq!(live.len(), SiteRow::LIVE_CSV.len());
        assert_eq!(live[2], (row.live_bytes / row.live_count).to_string());
        assert_eq!(live[5], row.frames.join(" <- "));
    }

    #[test]
    fn the_largest_free_block_at_an_oom_is_the_widest_address_gap() {
        let (a, _) = analysis(Scenario::Fragmented);
        let ooms = a.oom_moments();
        assert_eq!(ooms.len(), 1);
        let o = &ooms[0];
        let gaps =
            analysis_core::analysis::fragmentation::address_gaps(a.model(), o.device, o.ts_nanos)
                .expect("live blocks at the failure");
        assert_eq!(o.largest_free_bytes, Some(gaps.largest_free_bytes));
        // The scenario's point: enough free bytes in all, no hole big enough.
        assert!(gaps.free_bytes >= o.requested_bytes, "{gaps:?}");
        assert!(gaps.largest_free_bytes < o.requested_bytes, "{gaps:?}");
        // A trace whose failure's addresses tell nothing has no number.
        let (b, _) = analysis(Scenario::Oom);
        assert!(
            b.oom_moments()
                .iter()
                .all(|o| o.largest_free_bytes.is_none())
        );
    }

    #[test]
    fn the_address_layout_holds_the_gaps_of_address_gaps() {
        for sc in [Scenario::Fragmented, Scenario::TrainingLeak, Scenario::Oom] {
            let (a, _) = analysis(sc);
            let m = a.model();
            for t in [
                m.first_ts_nanos,
                (m.first_ts_nanos + m.last_ts_nanos) / 2,
                m.last_ts_nanos,
            ] {
                for d in a.devices() {
                    let layout = address_layout(m, d, t);
                    let gaps = analysis_core::analysis::fragmentation::address_gaps(m, d, t);
                    let Some(g) = gaps else {
                        assert!(layout.is_empty());
                        continue;
                    };
                    let free: Vec<u64> =
                        layout.iter().filter(|s| !s.live).map(|s| s.bytes).collect();
                    assert_eq!(free.iter().sum::<u64>(), g.free_bytes, "{sc:?} at {t}");
                    assert_eq!(
                        free.iter().copied().max().unwrap_or(0),
                        g.largest_free_bytes
                    );
                    let live: u64 = layout.iter().filter(|s| s.live).map(|s| s.bytes).sum();
                    assert_eq!(live + g.free_bytes, g.span_bytes);
                    // Stretches tile the span, alternating live and free.
                    for w in layout.windows(2) {
                        assert_eq!(w[0].start + w[0].bytes, w[1].start);
                        assert_ne!(w[0].live, w[1].live);
                    }
                }
            }
        }
    }

    #[test]
    fn live_sites_at_the_peak_match_the_report() {
        let (a, _) = analysis(Scenario::Spikes);
        let sites = a.live_sites_at(rep(&a).peak_ts_nanos, &Filter::default(), 10);
        assert_eq!(sites, rep(&a).peak_sites);
        assert_eq!(
            a.live_bytes_at(rep(&a).peak_ts_nanos, &Filter::default()),
            rep(&a).peak_bytes
        );
    }

    #[test]
    fn site_growth_ends_at_live_bytes() {
        let (a, _) = analysis(Scenario::TrainingLeak);
        let top = a.leak_candidates(&Filter::default())[0].clone();
        let g = a.site_growth(top.stack);
        assert_eq!(g.last_value(), Some(top.live_bytes));
    }

    #[test]
    fn filtered_site_rows_partition_the_whole_table() {
        let (a, _) = analysis(Scenario::MultiDevice);
        let whole: u64 = a.sites().iter().map(|s| s.alloc_bytes).sum();
        let by_device: u64 = a
            .devices()
            .into_iter()
            .map(|d| {
                let f = Filter {
                    device: Some(d),
                    ..Filter::default()
                };
                a.site_rows(&f).iter().map(|s| s.alloc_bytes).sum::<u64>()
            })
            .sum();
        assert_eq!(by_device, whole);
        let live: u64 = a
            .devices()
            .into_iter()
            .map(|d| {
                let f = Filter {
                    device: Some(d),
                    ..Filter::default()
                };
                a.leak_candidates(&f)
                    .iter()
                    .map(|s| s.live_bytes)
                    .sum::<u64>()
            })
            .sum();
        assert_eq!(live, rep(&a).live_at_end_bytes);
        assert!(
            a.site_rows(&Filter {
                device: Some(a.devices()[0]),
                ..Filter::default()
            })
            .iter()
            .all(|s| !s.label.is_empty())
        );
    }

    #[test]
    fn filters_split_multi_device_traces() {
        let (a, _) = analysis(Scenario::MultiDevice);
        assert!(a.devices().len() >= 2);
        let all = a.series(&Filter::default()).len();
        let one = a
            .series(&Filter {
                device: Some(a.devices()[0]),
                ..Filter::default()
            })
            .len();
        assert!(one < all, "{one} < {all}");
    }

    #[test]
    fn oom_trace_lists_failures_and_transients_are_sorted() {
        let (a, truth) = analysis(Scenario::Oom);
        let ooms = a.oom_moments();
        assert_eq!(ooms.len() as u64, truth.failed_count);
        assert!(ooms.iter().all(|o| o.requested_bytes > 0));
        let (s, _) = analysis(Scenario::Spikes);
        let t = s.largest_transients(5, &Filter::default());
        assert!(t.windows(2).all(|w| w[0].size_bytes >= w[1].size_bytes));
    }

    #[test]
    fn scope_rows_carry_the_reports_severity_and_growth() {
        let (a, _) = analysis(Scenario::NvtxLeak);
        let rows = a.scope_rows();
        assert_eq!(rows.len(), rep(&a).analysis.scopes.len());
        let by = |name: &str| rows.iter().find(|r| r.scope.scope == name).expect(name);
        let validate = by("validate");
        let finding = rep(&a)
            .findings
            .iter()
            .find(|f| f.kind.is_leak() && f.scope.as_deref() == Some("validate"))
            .expect("the report flags validate");
        assert_eq!(validate.severity, Some(finding.severity));
        assert!(finding.severity >= Severity::Warning);
        assert_eq!(validate.growth_class(), "unbounded");
        let epoch = by("epoch");
        assert_eq!(epoch.scope.explained_by.as_deref(), Some("validate"));
        assert_eq!(
            epoch.severity, None,
            "explained by an enclosed scope: no finding of its own"
        );
        // The growth chart of an NVTX scope ends at the report's total growth.
        let g = a.scope_growth(validate.scope).expect("an NVTX scope");
        assert_eq!(
            g.last_value(),
            Some(validate.scope.total_growth_bytes as u64)
        );
        let mut sorted = a.scope_rows();
        sort_scope_rows(&mut sorted, crate::state::ScopeSortKey::Severity, false);
        assert_eq!(sorted[0].scope.scope, "validate");
        sort_scope_rows(&mut sorted, crate::state::ScopeSortKey::Calls, true);
        assert!(
            sorted
                .windows(2)
                .all(|w| w[0].scope.calls <= w[1].scope.calls)
        );
        // A call-site scope's chart is its stack's growth.
        let (m, _) = analysis(Scenario::MultiDevice);
        let site = &rep(&m).analysis.scopes[0];
        assert!(m.scope_growth(site).is_none());
    }

    #[test]
    fn detected_spikes_and_markers_come_from_the_report() {
        let (a, truth) = analysis(Scenario::Spikes);
        let spikes = a.detected_spikes();
        let r = &rep(&a).analysis;
        assert!(!r.timeline_spikes.is_empty());
        assert_eq!(
            spikes.iter().filter(|s| s.timeline_rule).count(),
            r.timeline_spikes.len()
        );
        for t in &r.timeline_spikes {
            let s = spikes
                .iter()
                .find(|s| s.ts_nanos == t.ts_nanos)
                .expect("listed");
            assert_eq!((s.size_bytes, s.live_bytes), (t.size_bytes, t.live_bytes));
        }
        assert!(spikes.windows(2).all(|w| w[0].ts_nanos <= w[1].ts_nanos));
        let marked: Vec<u64> = a
            .detected
            .get()
            .expect("TraceData::new runs the detectors")
            .markers
            .iter()
            .filter(|m| m.marker.kind == MarkerKind::Spike)
            .map(|m| m.marker.ts_nanos)
            .collect();
        assert_eq!(
            marked,
            spikes.iter().map(|s| s.ts_nanos).collect::<Vec<_>>()
        );
        assert!(truth.spikes.iter().all(|p| marked.contains(&p.ts_nanos)));
        // A filter to another device hides them.
        let other = Filter {
            device: Some(DeviceIdx(9)),
            ..Filter::default()
        };
        let (lo, hi) = a.time_extent();
        assert_eq!(a.markers_in(&other, lo, hi).count(), 0);
        assert_eq!(
            a.markers_in(&Filter::default(), lo, hi).count(),
            marked.len()
        );
    }

    #[test]
    fn the_report_can_come_after_the_tables() {
        for s in [Scenario::Spikes, Scenario::MultiDevice, Scenario::Oom] {
            let (bytes, _) = generate(s, 20_000, 3);
            let later = TraceData::without_report(analysis_core::load(&bytes).expect("loads"), "t");
            let (lo, hi) = later.time_extent();
            assert!(later.report().is_none());
            assert_eq!(later.markers_in(&Filter::default(), lo, hi).count(), 0);
            assert!(later.scope_rows().is_empty() && later.detected_spikes().is_empty());
            let now = TraceData::new(analysis_core::load(&bytes).expect("loads"), "t");
            // The device list does not wait for the report, and is the report's.
            let mut listed: Vec<DeviceIdx> = rep(&now).devices.iter().map(|d| d.device).collect();
            listed.sort();
            assert_eq!(later.devices(), listed);
            later.detect();
            later.detect();
            assert_eq!(later.report(), now.report());
            assert_eq!(
                later
                    .markers_in(&Filter::default(), lo, hi)
                    .collect::<Vec<_>>(),
                now.markers_in(&Filter::default(), lo, hi)
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn csv_quotes_what_needs_quoting() {
        let csv = to_csv(
            &["site", "bytes"],
            &[vec!["f (a.py:1), \"x\"".into(), "12".into()]],
        );
        assert_eq!(csv, "site,bytes\r\n\"f (a.py:1), \"\"x\"\"\",12\r\n");
    }

    #[test]
    fn csv_cells_that_start_a_formula_stay_text() {
        let csv = to_csv(
            &["site", "bytes"],
            &[
                vec![
                    "=HYPERLINK(\"https://evil.example\",\"x\")".into(),
                    "-12".into(),
                ],
                vec!["+cmd|' /C calc'!A0".into(), "+3.5".into()],
                vec!["-2+3".into(), "@SUM(A1)".into()],
                vec!["\t=1".into(), "\r=1".into()],
            ],
        );
        assert_eq!(
            csv,
            "site,bytes\r\n\
             \"'=HYPERLINK(\"\"https://evil.example\"\",\"\"x\"\")\",-12\r\n\
             '+cmd|' /C calc'!A0,+3.5\r\n\
             '-2+3,'@SUM(A1)\r\n\
             '\t=1,\"'\r=1\"\r\n"
        );
    }
}
