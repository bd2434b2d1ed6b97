//! Findings and notes: one cause each, with its evidence, severity and fix; and the
//! recommendations drawn from them.

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use crate::format::StackId;

/// How bad a finding is. Ordered: `Info < Warning < Critical`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    #[default]
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

/// Impact of an insight (trend, hidden memory), as the reference scores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Impact {
    #[default]
    Low,
    Medium,
    High,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Live at the end of a program that exited, and never freed by its call site.
    LeakAtExit,
    /// Live at the end although the call site frees its other allocations: a path (often the
    /// error path) skips the free.
    MissedFree,
    /// Live at the end, allocated by a thread that went idle or ended long before.
    ThreadExitLeak,
    /// Memory of one call site that keeps growing across steady-state iterations.
    LeakGrowth,
    /// A scope (NVTX range or call site) that grows per call without bound.
    ScopeGrowth,
    /// Live bytes rise steadily over time, and no single call site explains it.
    Trend,
    /// Allocations far above the usual sizes of their scope.
    ScopeSpikes,
    /// Iterations whose peak stands far above the steady-state working set.
    TimelineSpike,
    /// Reserved memory that could not serve the requests actually made.
    Fragmentation,
    /// A failed allocation.
    OutOfMemory,
    /// Device memory the trace does not account for rises suddenly.
    HiddenSpike,
    /// Device memory our processes hold outside the traced allocations keeps growing.
    HiddenDrift,
    /// Note: growth that plateaus (warm-up, caches, pools).
    BoundedGrowth,
    /// Note: memory released only by a context teardown.
    TeardownRelease,
    /// Note: many allocations of small size from one call site.
    RepeatedAllocations,
    /// Note: allocations freed shortly after they were made.
    ShortLived,
    /// Note: memory live when the history ended (a snapshot of a running program, a program
    /// that was killed, or one-time allocations a garbage-collected program still held).
    LiveAtEnd,
    /// Note: memory an allocator keeps reserved but unallocated, ready for reuse.
    Cache,
    /// Note: device memory held by other processes.
    OtherProcesses,
}

impl FindingKind {
    pub const fn name(self) -> &'static str {
        match self {
            Self::LeakAtExit => "leak_at_exit",
            Self::MissedFree => "missed_free",
            Self::ThreadExitLeak => "thread_exit_leak",
            Self::LeakGrowth => "leak_growth",
            Self::ScopeGrowth => "scope_growth",
            Self::Trend => "trend",
            Self::ScopeSpikes => "scope_spikes",
            Self::TimelineSpike => "timeline_spike",
            Self::Fragmentation => "fragmentation",
            Self::OutOfMemory => "out_of_memory",
            Self::HiddenSpike => "hidden_spike",
            Self::HiddenDrift => "hidden_drift",
            Self::BoundedGrowth => "bounded_growth",
            Self::TeardownRelease => "teardown_release",
            Self::RepeatedAllocations => "repeated_allocations",
            Self::ShortLived => "short_lived",
            Self::LiveAtEnd => "live_at_end",
            Self::Cache => "cache",
            Self::OtherProcesses => "other_processes",
        }
    }

    /// Insights are about the whole history rather than one place.
    pub const fn is_insight(self) -> bool {
        matches!(self, Self::Trend | Self::HiddenSpike | Self::HiddenDrift)
    }

    /// Whether the finding is a leak (counted by `gpucollect check --max-leaked`).
    pub const fn is_leak(self) -> bool {
        matches!(
            self,
            Self::LeakAtExit | Self::MissedFree | Self::ThreadExitLeak | Self::LeakGrowth
        )
    }
}

/// One finding or note: one cause, with all its evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// The call site: the user's frame (`function (file:line)`, see `crate::attribution`), or
    /// the scope, pool or device name when the finding is about no single call site.
    pub site: String,
    /// `file:line` of the user's frame, when there is one.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub location: String,
    pub stack: Option<StackId>,
    /// The device the finding is about, when it is about one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub device: Option<crate::format::DeviceIdx>,
    /// The scope (NVTX range name or call site) the finding is about, if any.
    pub scope: Option<String>,
    /// Bytes involved (leaked or live at the end, spiking, wasted, requested...).
    pub bytes: u64,
    /// Allocations, calls or samples involved.
    pub count: u64,
    pub ts_nanos: Option<u64>,
    /// For insights: the impact.
    pub impact: Option<Impact>,
    /// Growth per steady-state iteration, for growth findings.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bytes_per_iteration: Option<f64>,
    /// Growth per hour of run time, for growth findings.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bytes_per_hour: Option<f64>,
    /// Seconds until the device would be full at this rate.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub seconds_to_full: Option<f64>,
    /// The ranking key: bytes this problem costs or puts at risk over the next hour of the
    /// program (capped at the device's capacity), see `score`.
    pub harm_bytes: u64,
    /// One short sentence for a headline ("leaks 4.0 MiB per step at metrics.py:33 — device
    /// full in 3 h").
    pub headline: String,
    /// What was found, one sentence.
    pub message: String,
    /// Every piece of evidence for this cause, one sentence each.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub evidence: Vec<String>,
    /// What to do about it, one sentence naming the place.
    pub fix: String,
}

impl Finding {
    /// A finding with everything optional left empty.
    pub fn new(kind: FindingKind, severity: Severity, site: String) -> Self {
        Self {
            kind,
            severity,
            site,
            location: String::new(),
            stack: None,
            device: None,
            scope: None,
            bytes: 0,
            count: 0,
            ts_nanos: None,
            impact: None,
            bytes_per_iteration: None,
            bytes_per_hour: None,
            seconds_to_full: None,
            harm_bytes: 0,
            headline: String::new(),
            message: String::new(),
            evidence: Vec::new(),
            fix: String::new(),
        }
    }
}

/// One prioritized recommendation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    /// 1 = most urgent.
    pub priority: u32,
    pub severity: Severity,
    pub kind: FindingKind,
    pub site: String,
    pub stack: Option<StackId>,
    pub scope: Option<String>,
    pub bytes: u64,
    /// What was found.
    pub problem: String,
    /// The concrete fix.
    pub fix: String,
}
