//! Every detector's section of the report ([`Analysis`]): what each found, as data for the
//! viewer, the JSON output and diffs.

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use crate::config::Config;
use crate::format::*;
use crate::stats::LinearFit;

use super::SiteBytes;

// --- mod ---

/// Per-call-site facts for diffs and for the viewer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteSummary {
    pub stack: StackId,
    pub site: String,
    pub frames: Vec<String>,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub max_size_bytes: u64,
    /// Bytes of this site live at the global peak.
    pub peak_bytes: u64,
    pub live_at_end_bytes: u64,
}

/// Every detector's section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Analysis {
    pub config: Config,
    /// How the history ends (exit, kill, cut, snapshot).
    pub history: HistoryEnd,
    /// The program's repeated unit.
    pub iterations: Iterations,
    /// Causes whose memory grew across steady-state iterations (leaking first).
    pub growth: Vec<Growth>,
    /// What is live at the end, by cause and class.
    pub leaks_at_exit: Vec<LeakGroup>,
    /// Memory released only by a context teardown (cudaDeviceReset, cuCtxDestroy), by site.
    pub teardown_released: Vec<SiteBytes>,
    pub scopes: Vec<ScopeGrowth>,
    pub trends: Vec<Trend>,
    pub scope_spikes: Vec<ScopeSpikes>,
    pub timeline_spikes: Vec<TimelineSpikeEvent>,
    pub fragmentation: Vec<PoolFragmentation>,
    pub churn: Vec<ChurnSite>,
    pub hidden: Vec<HiddenMemory>,
    pub oom: Vec<OomForensics>,
    /// Call sites by peak, live at end and allocated bytes (at most `MAX_SITES`).
    pub sites: Vec<SiteSummary>,
}

// --- history ---

/// How the history ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryEnd {
    /// The traced program exited (an `end` record, and no process killed by a signal).
    #[default]
    Exited,
    /// A traced process was killed by a signal.
    Killed,
    /// No `end` record: the collector or the program died, or the trace was cut short.
    Cut,
    /// A snapshot of a running program (a PyTorch memory snapshot).
    Snapshot,
}

// --- iterations ---

/// Where the iterations come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IterationSource {
    NvtxRange,
    Mark,
    RecurringSite,
    #[default]
    TimeWindows,
}

/// The program's iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Iterations {
    pub source: IterationSource,
    /// The range or mark name, the call site, or "time windows".
    pub label: String,
    pub count: u64,
    /// How many of the first iterations are warm-up (excluded from growth and baselines).
    pub warmup: u64,
    pub median_period_nanos: u64,
    /// Start of every iteration, in time order.
    #[serde(skip)]
    pub starts_nanos: super::Starts,
}

// --- leaks ---

/// Why a cause's live-at-end memory is (or is not) a leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakClass {
    /// Keeps growing across steady-state iterations.
    Growing,
    /// A program that exited never freed it, and its call site never frees.
    NeverFreed,
    /// A program that exited never freed it, while its call site frees its other allocations.
    MissedFree,
    /// Every allocating thread went idle (or ended) long before the end.
    ThreadExited,
    /// Grew early, then stopped: a cache, pool or warm-up buffer (not a leak).
    Bounded,
    /// Held by a caching allocator or memory pool as reserve (not a leak).
    Cache,
    /// In use when the history ended: a snapshot, a kill, or what a garbage-collected program
    /// still held at exit (not a leak).
    LiveAtEnd,
}

/// One cause's live allocations at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeakGroup {
    pub class: LeakClass,
    #[serde(flatten)]
    pub site: SiteBytes,
    /// `file:line` of the user's frame.
    pub location: String,
    pub pinned_host: bool,
    pub first_ts_nanos: u64,
    pub last_ts_nanos: u64,
    /// All allocations and frees of the cause over the trace.
    pub site_alloc_count: u64,
    pub site_free_count: u64,
    /// Last activity of the allocating thread(s), when they went idle.
    pub thread_last_ts_nanos: Option<u64>,
}

/// One cause's live bytes over the steady-state iterations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Growth {
    pub site: String,
    pub location: String,
    pub stack: StackId,
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub pinned_host: bool,
    /// Samples judged (steady-state iteration starts and the end).
    pub samples: u64,
    /// Live bytes at the first steady-state sample and at the end.
    pub steady_start_bytes: u64,
    pub end_bytes: u64,
    pub bytes_per_iteration: f64,
    pub bytes_per_sec: f64,
    pub r: f64,
    /// Persistent growth: a leak.
    pub leaking: bool,
    /// Grew, then stopped (a cache that filled).
    pub bounded: bool,
    pub seconds_to_full: Option<f64>,
}

// --- scopes ---

/// What a scope is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    NvtxRange,
    CallSite,
}

/// Growth statistics of one scope.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScopeGrowth {
    pub scope: String,
    pub kind: ScopeKind,
    pub calls: u64,
    pub total_growth_bytes: i64,
    pub avg_growth_bytes: f64,
    /// Fraction of calls that grew.
    pub positive_ratio: f64,
    /// Growth of the last third of the calls.
    pub tail_growth_bytes: i64,
    /// The reference rule holds.
    pub reference_leak: bool,
    /// Growth that plateaued (not a leak).
    pub bounded: bool,
    pub max_peak_bytes: u64,
    /// An enclosed scope that accounts for (almost) all of this scope's growth: the finding is
    /// reported there, not here.
    pub explained_by: Option<String>,
    /// The call site that kept the most bytes beyond the calls, when known.
    pub top_stack: Option<StackId>,
    pub top_site: Option<String>,
    pub top_site_bytes: u64,
}

// --- trend ---

/// The trend of one series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trend {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub fit: LinearFit,
    /// The same fit over the last third of the time span.
    pub tail_fit: Option<LinearFit>,
    pub growth_bytes_per_sec: f64,
    /// The reference rule holds.
    pub flagged: bool,
    /// Flagged, but the last third is flat: a plateau.
    pub bounded: bool,
    /// Seconds until the device is full at this rate, when growing.
    pub seconds_to_full: Option<f64>,
}

// --- spikes ---

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

/// One spiking iteration: the allocation that lifted it and the peak it reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimelineSpikeEvent {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    /// Live bytes (all devices) at the iteration's peak.
    pub live_bytes: u64,
    /// How long the allocation lived (to the end, if never freed).
    pub duration_nanos: u64,
    pub stack: StackId,
    pub site: String,
}

// --- fragmentation ---

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
    /// The reference rule (mean ratio above `fragmentation_ratio`); a fact for the table, not a
    /// finding: a reserve that is free is cache unless requests could not use it.
    pub flagged: bool,
    /// Times the reserve grew although the request that made it grow would have fit in the
    /// free reserve, and the bytes those growths added.
    pub forced_growth_count: u64,
    pub forced_growth_bytes: u64,
    /// Reserved but unallocated at the last sample.
    pub free_at_end_bytes: u64,
    /// Address gaps at the worst sample, when the live allocations fit in the reserved bytes.
    pub gaps_at_max: Option<AddressGaps>,
    /// The ratio over time, at most `MAX_POINTS` points (evenly strided).
    pub series: Vec<RatioPoint>,
}

// --- churn ---

/// One churning call site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChurnSite {
    pub kind: ChurnKind,
    pub stack: StackId,
    pub site: String,
    pub alloc_count: u64,
    /// Bytes allocated (and released) over the trace.
    pub churned_bytes: u64,
    pub mean_size_bytes: u64,
    /// Allocations freed within `short_lived_max_nanos`.
    pub short_lived_count: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChurnKind {
    Repeated,
    ShortLived,
}

// --- hidden ---

/// One sample of the untraced gap.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GapPoint {
    pub ts_nanos: u64,
    pub gap_bytes: i64,
    pub z: f64,
}

/// Untraced device memory on one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HiddenMemory {
    pub device: DeviceIdx,
    pub samples: u64,
    pub mean_gap_bytes: f64,
    pub max_gap_bytes: i64,
    /// Highest memory held by processes other than the traced ones, over the samples.
    pub other_processes_max_bytes: u64,
    /// Why the reference rules were not applied, if they were not.
    pub skipped: Option<String>,
    /// Samples with z above the spike threshold.
    pub spikes: Vec<GapPoint>,
    /// Fit of the gap over seconds (drift), when there are enough samples.
    pub drift: Option<LinearFit>,
}

/// Why an allocation failed, as far as the trace can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// Enough bytes were free in the pool, but no block was large enough.
    Fragmentation,
    /// Other processes hold more than we do.
    OtherProcesses,
    /// Driver/context overhead or memory the trace did not see holds more than we do.
    UntracedMemory,
    /// Our own live allocations fill the device.
    OwnAllocations,
}

/// The forensic summary of one failed allocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomForensics {
    pub ts_nanos: u64,
    pub device: DeviceIdx,
    pub requested_bytes: u64,
    pub site: String,
    /// Device free and total memory from the last sample before the failure.
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Our live bytes on that device.
    pub live_bytes: u64,
    /// Our live bytes by call site (top 5).
    pub live_sites: Vec<SiteBytes>,
    /// Other processes on the device (from the sample), largest first.
    pub other_processes: Vec<ProcessUsage>,
    /// Used memory neither traced by us nor attributed to another process.
    pub untraced_bytes: u64,
    pub gaps: Option<AddressGaps>,
    pub cause: OomCause,
}
