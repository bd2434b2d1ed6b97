//! The detectors. Each module is an aggregator over the replayed [`TraceModel`]: it reads the
//! model once (a pass over `allocs`, the timelines, the samples or `stack_stats`) and returns its
//! section of the [`Analysis`] plus its findings. [`analyze`] runs them all and fills the one
//! serializable [`Report`].
//!
//! Findings (warning or critical) are problems; notes (info) are facts worth knowing that are
//! not problems: bounded growth, memory released only by a context teardown, churn.

pub mod causes;
pub mod churn;
pub mod diff;
pub mod facts;
pub mod fragmentation;
pub mod grouping;
pub mod hidden;
pub mod history;
pub mod iterations;
pub mod leaks;
pub(crate) mod median;
pub mod sampling;
pub mod scopes;
pub mod score;
pub mod spikes;
pub mod trend;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::format::StackId;
use crate::model::{Fields, LoadedTrace, TraceModel};
use crate::report::Report;

pub use crate::config::{self, Config};
pub use crate::report::{Analysis, Finding, FindingKind, Impact, Severity, SiteSummary};
pub use facts::{GROUP_FIELDS, group_by_stack, summarize, summary_facts};

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

/// Runs two independent parts of the analysis and returns both results ([`crate::join`]): the
/// front ends that may pass one that runs them on two threads; the report is the same either
/// way, each part filling its own findings, merged in a fixed order.
pub use gpucollect_trace::join::{Join, Sequential};

/// Runs every detector with `config` and returns the full report.
///
/// The summary's figures are the driver's (what the device held). The detectors read the
/// program's own memory: where the trace has a framework's blocks (its tensors), they read
/// [`crate::layers::tensor_view`], in which the blocks are the allocations and the segments
/// holding them the framework's reserve (FORMAT.md, "Two layers").
pub fn analyze(trace: &LoadedTrace, config: &Config) -> Report {
    analyze_with(trace, config, &Sequential)
}

/// [`analyze`], its independent detectors run through `join`.
pub fn analyze_with(trace: &LoadedTrace, config: &Config, join: &impl Join) -> Report {
    let view = crate::layers::tensor_view(&trace.model);
    analyze_view_with(trace, view.as_ref(), config, join)
}

/// [`analyze`] with the trace's [`crate::layers::tensor_view`] made by the caller (`None` when the
/// trace has no framework blocks), for a front end that keeps the view for its own tables.
pub fn analyze_view(trace: &LoadedTrace, view: Option<&TraceModel>, config: &Config) -> Report {
    analyze_view_with(trace, view, config, &Sequential)
}

/// [`analyze_view`], its independent detectors run through `join`.
pub fn analyze_view_with(
    trace: &LoadedTrace,
    view: Option<&TraceModel>,
    config: &Config,
    join: &impl Join,
) -> Report {
    let m = view.unwrap_or(&trace.model);
    let mut found = Found::default();
    let sites = SiteIndex::new(m);
    let end = history::classify(m);
    // The iterations beside the causes, which need neither, and each process's activity (for
    // its samples) on the side with less to do: the iterations' where NVTX ranges give them,
    // the causes' where a search for a recurring call site does.
    let with_iterations = !m.ranges.is_empty();
    let ((its, a), (causes, b)) = join.join(
        || {
            let its = iterations::detect(m);
            (its, with_iterations.then(|| sampling::activity(m)))
        },
        || {
            let causes = causes::Causes::new(m, config);
            (causes, (!with_iterations).then(|| sampling::activity(m)))
        },
    );
    let activity = a.or(b).unwrap_or_else(|| sampling::activity(m));
    let mut a = Analysis {
        config: config.clone(),
        history: end,
        ..Analysis::default()
    };
    // Two independent halves, of about equal work. Their findings are merged in one order
    // whichever half a detector runs in: growth's, then the spikes', fragmentation's, churn's
    // and hidden memory's. Hidden memory runs with shape and fragmentation with growth to even
    // out the halves (on the 300M-event training trace 5.6 and 5.2 s; with fragmentation on the
    // shape side they took 4.8 and 6.0).
    let growth = || {
        let mut found = Found::default();
        // Each process's samples (its own iterations for the busiest), for growth and trends.
        let sampling = sampling::sampling_by_process(m, &its, activity);
        // The scopes' passes over the history ride on the leaks detector's two.
        let mut scope_pass = scopes::ScopePass::new(m, &sites);
        let sections = leaks::analyze(
            m,
            config,
            &its,
            end,
            &causes,
            &sampling,
            &mut scope_pass,
            &mut found,
        );
        let scopes = scopes::analyze_after(m, config, &sites, scope_pass);
        let trends = trend::analyze(
            m,
            config,
            &sections.series_growth,
            &its,
            &sampling,
            &mut found,
        );
        let mut frag_found = Found::default();
        let fragmentation = fragmentation::analyze(m, config, &its, &mut frag_found);
        (sections, scopes, trends, found, (fragmentation, frag_found))
    };
    let shape = || {
        let mut found = Found::default();
        // The short-lived allocations' pass rides on the facts' where both read one model.
        let mut short = churn::ShortLived::new(config, &sites);
        let report = if view.is_none() {
            facts::summary_facts_carrying(trace, &mut short)
        } else {
            run_alone(m, &mut short);
            facts::summary_facts(trace)
        };
        let spikes = spikes::analyze(m, config, &sites, &its, &causes, &mut found);
        let mut churn_found = Found::default();
        let churn = churn::analyze_after(m, config, &sites, short, &mut churn_found);
        let mut hidden_found = Found::default();
        let hidden = hidden::analyze(m, config, &mut hidden_found);
        (
            report,
            (spikes, churn),
            (found, churn_found),
            (hidden, hidden_found),
        )
    };
    let ((sections, scopes, trends, growth_found, (frag, frag_found)), shape) =
        join.join(growth, shape);
    let (mut report, (spikes, churn), (spikes_found, churn_found), (hidden, hidden_found)) = shape;
    for part in [
        growth_found,
        spikes_found,
        frag_found,
        churn_found,
        hidden_found,
    ] {
        found.findings.extend(part.findings);
        found.notes.extend(part.notes);
    }
    a.leaks_at_exit = sections.groups;
    a.growth = sections.growth;
    a.teardown_released = sections.teardown;
    a.scopes = scopes;
    a.trends = trends;
    (a.scope_spikes, a.timeline_spikes) = spikes;
    a.fragmentation = frag;
    a.churn = churn;
    let (hidden, oom) = hidden;
    fold_out_of_memory(&mut found, &oom);
    fold_fragmentation(&mut found);
    a.hidden = hidden;
    a.oom = oom;
    a.sites = site_summaries(m, config);
    a.iterations = its;
    rank(m, &mut found.findings);
    found
        .notes
        .sort_by(|x, y| y.bytes.cmp(&x.bytes).then(x.site.cmp(&y.site)));
    let (score, grade) = score::score(&found.findings, &found.notes);
    report.recommendations = score::recommendations(&found.findings, &found.notes, config);
    report.findings = found.findings;
    report.notes = found.notes;
    report.score = score;
    report.grade = grade.into();
    report.analysis = a;
    report
}

/// One cause, one finding: an out-of-memory whose cause is our own allocations, where a leak on
/// that device holds at least a tenth of them, becomes evidence of that leak (which turns
/// critical): the leak is what filled the device.
fn fold_out_of_memory(found: &mut Found, ooms: &[hidden::OomForensics]) {
    for o in ooms {
        // Our own allocations filled the device, and a leak holds a tenth of them; or the
        // allocator's free memory was too fragmented, but a leak holds half of what is live.
        let share = match o.cause {
            hidden::OomCause::OwnAllocations => 10,
            hidden::OomCause::Fragmentation => 2,
            _ => continue,
        };
        let leak = found
            .findings
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind.is_leak() && f.ts_nanos.is_none_or(|t| t <= o.ts_nanos))
            .filter(|(_, f)| {
                (share == 10 && o.live_sites.iter().any(|s| s.site == f.site))
                    || f.bytes.saturating_mul(share) >= o.live_bytes
            })
            .max_by_key(|(_, f)| f.bytes)
            .map(|(i, _)| i);
        let Some(leak) = leak else {
            continue;
        };
        let Some(i) = found.findings.iter().position(|f| {
            matches!(
                f.kind,
                FindingKind::OutOfMemory | FindingKind::Fragmentation
            ) && f.ts_nanos == Some(o.ts_nanos)
        }) else {
            continue;
        };
        let oom = found.findings.remove(i);
        let leak = if leak > i { leak - 1 } else { leak };
        let l = &mut found.findings[leak];
        l.severity = Severity::Critical;
        l.harm_bytes = l.harm_bytes.max(oom.harm_bytes);
        l.headline = alloc::format!("{}; it caused an out-of-memory", l.headline);
        l.evidence.push(oom.message);
    }
}

/// One cause, one finding: forced reserve growth on a device where a leak grows is the leak's
/// doing (leaked blocks pin partly used segments, so the free memory splits into holes): it
/// becomes evidence of that leak. A failed allocation stays its own finding.
fn fold_fragmentation(found: &mut Found) {
    let mut i = 0;
    while i < found.findings.len() {
        let f = &found.findings[i];
        let forced = f.kind == FindingKind::Fragmentation && f.severity == Severity::Warning;
        let leak = forced
            .then(|| {
                found
                    .findings
                    .iter()
                    .position(|l| l.kind.is_leak() && l.device.is_some() && l.device == f.device)
            })
            .flatten();
        match leak {
            Some(j) => {
                let frag = found.findings.remove(i);
                let j = if j > i { j - 1 } else { j };
                found.findings[j].evidence.push(alloc::format!(
                    "it also fragments the allocator: {}",
                    frag.message
                ));
            }
            None => i += 1,
        }
    }
}

/// Most severe first, then by harm (bytes at risk over the next hour, capped at the device);
/// among leaks that fill the device within the hour alike, the one that fills it first.
fn rank(m: &TraceModel, findings: &mut [Finding]) {
    let _ = m;
    let full = |f: &Finding| f.seconds_to_full.unwrap_or(f64::INFINITY);
    findings.sort_by(|x, y| {
        y.severity
            .cmp(&x.severity)
            .then(y.harm_bytes.max(y.bytes).cmp(&x.harm_bytes.max(x.bytes)))
            .then(full(x).total_cmp(&full(y)))
            .then(x.site.cmp(&y.site))
    });
}

/// Whether the pools of a process on a device end mostly unused (their last samples: at most a
/// tenth of what they reserve handed out): what they hold is cache.
pub(crate) fn idle_pool(
    m: &TraceModel,
    process: crate::format::ProcessIdx,
    device: crate::format::DeviceIdx,
) -> bool {
    m.pool_samples
        .iter()
        .rev()
        .find(|p| p.process == process && p.device == device)
        .is_some_and(|p| p.used_bytes.saturating_mul(10) <= p.reserved_bytes)
}

/// " — device full in 3 h" for a headline, or " — the device is full" when nothing is left.
pub(crate) fn full_in(seconds: f64) -> String {
    if seconds < 1e-3 {
        String::from(" — the device is full")
    } else {
        alloc::format!(
            " — device full in {}",
            crate::units::fmt_duration((seconds * 1e9) as u64)
        )
    }
}

/// The device's memory: its `device` record, else the last device sample.
pub(crate) fn device_capacity(m: &TraceModel, device: crate::format::DeviceIdx) -> Option<u64> {
    m.devices
        .iter()
        .find(|d| d.device == device)
        .map(|d| d.total_bytes)
        .filter(|&b| b > 0)
        .or_else(|| {
            m.device_samples
                .iter_fixed()
                .rev()
                .find(|d| d.device == device)
                .map(|d| d.total_bytes)
                .filter(|&b| b > 0)
        })
}

/// Device memory in use at the end: the last device sample's used bytes, or at least our live
/// bytes on it.
pub(crate) fn device_used_at_end(m: &TraceModel, device: crate::format::DeviceIdx) -> u64 {
    let ours = m
        .series
        .iter()
        .filter(|s| !s.key.host && s.key.device == device)
        .map(|s| s.live_bytes)
        .fold(0u64, u64::saturating_add);
    m.device_samples
        .iter_fixed()
        .rev()
        .find(|d| d.device == device)
        .map_or(ours, |d| d.used_bytes.max(ours))
}

/// A pass over the allocations that another pass carries: the carrier decodes each block of
/// the history once with both passes' fields and hands every allocation to `visit` too. A pass
/// over a long history costs mostly its decoding, which this shares.
pub(crate) trait Carried {
    /// The fields `visit` reads.
    fn fields(&self) -> Fields;
    /// The next allocation, in id order.
    fn visit(&mut self, a: &crate::model::AllocRecord);
    /// The carrier's pass ended. A carrier that makes two passes carries a pass of two rounds
    /// (the call-site scopes: counted, then swept) through both, calling this after each; its
    /// second pass reads [`Self::fields`] again.
    fn end_pass(&mut self) {}
}

/// Runs `pass` on its own: one pass over `m`'s allocations, with its fields only.
pub(crate) fn run_alone(m: &TraceModel, pass: &mut impl Carried) {
    for a in m.allocs.iter_fields(pass.fields()) {
        pass.visit(&a);
    }
}

/// A pass that reads nothing, for a carrier that carries none.
pub(crate) struct Nothing;

impl Carried for Nothing {
    fn fields(&self) -> Fields {
        Fields::NONE
    }

    #[inline]
    fn visit(&mut self, _: &crate::model::AllocRecord) {}
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

/// `file:line` of the user's frame, for fix texts; else the label.
pub(crate) fn site_location(m: &TraceModel, stack: StackId) -> String {
    match m.user_frame(stack, &[]) {
        Some(f) if !f.file.is_empty() && f.file != "??" => {
            alloc::format!("{}:{}", f.file, f.line)
        }
        _ => m.stack_label(stack),
    }
}

fn site_summaries(m: &TraceModel, c: &Config) -> Vec<SiteSummary> {
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
            let site = m.stack_label_with(s.stack, &c.hide_frames);
            let frames = m
                .stack_frames(s.stack)
                .iter()
                .map(ToString::to_string)
                .collect();
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
