//! The detectors. Each module is an aggregator over the replayed [`TraceModel`]: it reads the
//! model once (a pass over `allocs`, the timelines, the samples or `stack_stats`) and returns its
//! section of the [`Analysis`] plus its findings. [`analyze`] runs them all and fills the one
//! serializable [`Report`].
//!
//! Findings (warning or critical) are problems; notes (info) are facts worth knowing that are
//! not problems: bounded growth, memory released only by a context teardown, churn.

pub mod churn;
pub mod config;
pub mod diff;
pub mod fragmentation;
pub mod hidden;
pub mod leaks;
pub mod scopes;
pub mod score;
pub mod spikes;
pub mod trend;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use hashbrown::HashMap;
use serde::Serialize;

use crate::format::StackId;
use crate::model::{LoadedTrace, TraceModel};
use crate::report::Report;

pub use config::Config;

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
    /// Live at the end and never freed by its call site.
    LeakAtExit,
    /// Live at the end although the call site frees its other allocations: a path (often the
    /// error path) skips the free.
    MissedFree,
    /// Live at the end, allocated by a thread that went idle or ended long before.
    ThreadExitLeak,
    /// A scope (NVTX range or call site) that grows per call without bound.
    ScopeGrowth,
    /// Live bytes rise steadily over time.
    Trend,
    /// Allocations far above the usual sizes of their scope.
    ScopeSpikes,
    /// Sudden rise and fall of live bytes.
    TimelineSpike,
    /// Reserved but unallocated pool memory.
    Fragmentation,
    /// A failed allocation.
    OutOfMemory,
    /// Device memory the trace does not account for rises suddenly.
    HiddenSpike,
    /// Device memory the trace does not account for keeps growing.
    HiddenDrift,
    /// Note: growth that plateaus (warm-up, caches, pools).
    BoundedGrowth,
    /// Note: memory released only by a context teardown.
    TeardownRelease,
    /// Note: many allocations of small size from one call site.
    RepeatedAllocations,
    /// Note: allocations freed shortly after they were made.
    ShortLived,
}

impl FindingKind {
    pub const fn name(self) -> &'static str {
        match self {
            Self::LeakAtExit => "leak_at_exit",
            Self::MissedFree => "missed_free",
            Self::ThreadExitLeak => "thread_exit_leak",
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
        }
    }

    /// Insights are scored by impact; everything else is a pattern scored by severity.
    pub const fn is_insight(self) -> bool {
        matches!(self, Self::Trend | Self::HiddenSpike | Self::HiddenDrift)
    }

    /// Whether the finding is a leak (counted by `gpucollect check --max-leaked`).
    pub const fn is_leak(self) -> bool {
        matches!(
            self,
            Self::LeakAtExit | Self::MissedFree | Self::ThreadExitLeak
        )
    }
}

/// One finding or note.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// The call site (innermost frame, `function (file:line)`), or the scope name when the
    /// finding is about a scope with no single call site.
    pub site: String,
    pub stack: Option<StackId>,
    /// The scope (NVTX range name or call site) the finding is about, if any.
    pub scope: Option<String>,
    /// Bytes involved (leaked, grown, spiking, wasted, requested...).
    pub bytes: u64,
    /// Allocations, calls or samples involved.
    pub count: u64,
    pub ts_nanos: Option<u64>,
    /// For insights: the impact the score uses.
    pub impact: Option<Impact>,
    /// What was found, one sentence.
    pub message: String,
    /// What to do about it, one sentence naming the place.
    pub fix: String,
}

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
    pub leaks_at_exit: Vec<leaks::LeakGroup>,
    /// Memory released only by a context teardown (cudaDeviceReset, cuCtxDestroy), by site.
    pub teardown_released: Vec<crate::report::SiteBytes>,
    pub scopes: Vec<scopes::ScopeGrowth>,
    pub trends: Vec<trend::Trend>,
    pub scope_spikes: Vec<spikes::ScopeSpikes>,
    pub timeline_spikes: Vec<spikes::TimelineSpikeEvent>,
    pub fragmentation: Vec<fragmentation::PoolFragmentation>,
    pub churn: Vec<churn::ChurnSite>,
    pub hidden: Vec<hidden::HiddenMemory>,
    pub oom: Vec<hidden::OomForensics>,
    /// Call sites by peak, live at end and allocated bytes (at most `MAX_SITES`).
    pub sites: Vec<SiteSummary>,
}

/// How many call sites `Analysis::sites` keeps.
pub const MAX_SITES: usize = 200;

/// What each detector returns: its section plus findings and notes.
#[derive(Debug, Default)]
pub struct Found {
    pub findings: Vec<Finding>,
    pub notes: Vec<Finding>,
}

impl Found {
    pub fn push(&mut self, f: Finding) {
        if f.severity == Severity::Info {
            self.notes.push(f);
        } else {
            self.findings.push(f);
        }
    }
}

/// Runs every detector with `config` and returns the full report.
pub fn analyze(trace: &LoadedTrace, config: &Config) -> Report {
    let mut report = crate::report::summary_facts(trace);
    let m = &trace.model;
    let mut found = Found::default();
    let sites = SiteIndex::new(m);
    let mut a = Analysis {
        config: config.clone(),
        ..Analysis::default()
    };
    let (groups, teardown) = leaks::analyze(m, config, &mut found);
    a.leaks_at_exit = groups;
    a.teardown_released = teardown;
    a.scopes = scopes::analyze(m, config, &sites, &mut found);
    a.trends = trend::analyze(m, config, &mut found);
    let (scope_spikes, timeline_spikes) = spikes::analyze(m, config, &sites, &mut found);
    a.scope_spikes = scope_spikes;
    a.timeline_spikes = timeline_spikes;
    a.fragmentation = fragmentation::analyze(m, config, &mut found);
    a.churn = churn::analyze(m, config, &sites, &mut found);
    let (hidden, oom) = hidden::analyze(m, config, &mut found);
    a.hidden = hidden;
    a.oom = oom;
    a.sites = site_summaries(m);
    let (score, grade) = score::score(&found.findings, &found.notes);
    report.recommendations = score::recommendations(&found.findings, &found.notes, config);
    found
        .findings
        .sort_by(|x, y| y.severity.cmp(&x.severity).then(y.bytes.cmp(&x.bytes)));
    report.findings = found.findings;
    report.notes = found.notes;
    report.score = score;
    report.grade = grade.into();
    report.analysis = a;
    report
}

/// Dense index of call sites: `StackId -> 0..n` without hashing per event when stack ids are
/// dense (they are: writers number them from 1).
#[derive(Debug)]
pub struct SiteIndex {
    /// `slot[stack.0]` = dense index + 1 (0 = unknown stack), when ids are small.
    slot: Vec<u32>,
    map: HashMap<StackId, u32>,
    pub stacks: Vec<StackId>,
}

impl SiteIndex {
    pub fn new(m: &TraceModel) -> Self {
        let mut stacks: Vec<StackId> = m.stack_stats.keys().copied().collect();
        stacks.sort_unstable();
        let max = stacks.last().map_or(0, |s| s.0 as usize);
        let mut slot = Vec::new();
        let mut map = HashMap::new();
        if max <= stacks.len().saturating_mul(8).max(1 << 16) {
            slot = alloc::vec![0u32; max + 1];
            for (i, s) in stacks.iter().enumerate() {
                slot[s.0 as usize] = i as u32 + 1;
            }
        } else {
            for (i, s) in stacks.iter().enumerate() {
                map.insert(*s, i as u32);
            }
        }
        Self { slot, map, stacks }
    }

    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Dense index of `stack`; every stack that allocated has one.
    #[inline]
    pub fn get(&self, stack: StackId) -> Option<usize> {
        if self.slot.is_empty() {
            self.map.get(&stack).map(|&i| i as usize)
        } else {
            match self.slot.get(stack.0 as usize) {
                Some(&i) if i > 0 => Some(i as usize - 1),
                _ => None,
            }
        }
    }
}

/// `a - b` as a signed byte count, clamped to `i64`.
pub(crate) fn signed_diff(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Sum that stops at `u64::MAX` instead of overflowing on hostile input.
pub(crate) fn saturating_sum(it: impl Iterator<Item = u64>) -> u64 {
    it.fold(0, u64::saturating_add)
}

/// The call-site label and its frames, for findings and sections.
pub(crate) fn site_label(m: &TraceModel, stack: StackId) -> (String, Vec<String>) {
    let frames = m.stack_frames(stack);
    let label = m.stack_label(stack);
    (label, frames.iter().map(ToString::to_string).collect())
}

/// `file:line` of the innermost frame that has one, for fix texts; else the label.
pub(crate) fn site_location(m: &TraceModel, stack: StackId) -> String {
    for f in m.stack_frames(stack) {
        if !f.file.is_empty() {
            return alloc::format!("{}:{}", f.file, f.line);
        }
    }
    m.stack_label(stack)
}

fn site_summaries(m: &TraceModel) -> Vec<SiteSummary> {
    let mut v: Vec<&crate::model::StackStats> = m.stack_stats.values().collect();
    v.sort_by(|a, b| {
        b.peak_bytes
            .cmp(&a.peak_bytes)
            .then(b.live_bytes.cmp(&a.live_bytes))
            .then(b.alloc_bytes.cmp(&a.alloc_bytes))
            .then(a.stack.cmp(&b.stack))
    });
    v.truncate(MAX_SITES);
    v.into_iter()
        .map(|s| {
            let (site, frames) = site_label(m, s.stack);
            SiteSummary {
                stack: s.stack,
                site,
                frames,
                alloc_count: s.alloc_count,
                alloc_bytes: s.alloc_bytes,
                max_size_bytes: s.max_size_bytes,
                peak_bytes: s.peak_bytes,
                live_at_end_bytes: s.live_bytes,
            }
        })
        .collect()
}
