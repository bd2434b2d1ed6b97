//! Golden tests of the detectors on synthetic traces with planted ground truth: every planted
//! leak is found at its call site with the right severity, once (one cause, one finding), the
//! plateauing cache and the context teardown are not leaks, planted spikes are one finding with
//! their count, fragmentation ratios are exact, and the clean workload has no findings.

use analysis_core::analysis::hidden::OomCause;
use analysis_core::analysis::leaks::LeakClass;
use analysis_core::analysis::scopes::ScopeKind;
use analysis_core::analysis::{Finding, FindingKind, Severity};
use analysis_core::synth::{GroundTruth, Scenario, generate};
use analysis_core::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn run(s: Scenario, events: u64) -> (Report, GroundTruth) {
    let (bytes, truth) = generate(s, events, 7);
    let t = load(&bytes).expect("synthetic trace loads");
    (summarize(&t), truth)
}

fn function_of(site: &str) -> &str {
    site.split(" (").next().unwrap_or(site)
}

fn leak_findings(r: &Report) -> Vec<&Finding> {
    r.findings.iter().filter(|f| f.kind.is_leak()).collect()
}

#[test]
fn every_planted_leak_is_found_at_its_call_site_with_its_severity() {
    for s in Scenario::ALL {
        for events in [5_000, 20_000] {
            let (r, truth) = run(s, events);
            for leak in &truth.leaks {
                let f = leak_findings(&r)
                    .into_iter()
                    .find(|f| function_of(&f.site) == leak.function)
                    .unwrap_or_else(|| panic!("{s:?}/{events}: leak {} not found", leak.function));
                assert_eq!(f.bytes, leak.bytes, "{s:?}/{events} {}", leak.function);
                assert_eq!(f.count, leak.count, "{s:?}/{events} {}", leak.function);
                // Critical when the device would be full within a day, or over 1 GiB.
                let soon = f.seconds_to_full.is_some_and(|t| t <= 86_400.0);
                let want = if leak.bytes > GIB || soon || s == Scenario::Oom {
                    Severity::Critical
                } else {
                    Severity::Warning
                };
                assert_eq!(f.severity, want, "{s:?}/{events} {}", leak.function);
                let leaked_by = r
                    .analysis
                    .leaks_at_exit
                    .iter()
                    .find(|g| g.site.stack == f.stack.expect("leaks name a stack"))
                    .map_or_else(Vec::new, |g| g.site.threads.clone());
                if f.kind != FindingKind::LeakGrowth && f.kind != FindingKind::MissedFree {
                    assert!(leaked_by.contains(&leak.thread), "{s:?}/{events}");
                }
            }
            // Nothing else is reported as a leak.
            assert_eq!(
                leak_findings(&r).len(),
                truth.leaks.len(),
                "{s:?}/{events}: {:#?}",
                leak_findings(&r)
            );
        }
    }
}

#[test]
fn training_leak_is_one_finding_with_its_rate_per_step() {
    for events in [5_000, 20_000] {
        let (r, truth) = run(Scenario::TrainingLeak, events);
        // One cause, one finding: no separate scope growth or trend for the same line.
        assert_eq!(r.findings.len(), 1, "{events}: {:#?}", r.findings);
        let f = &r.findings[0];
        assert_eq!(f.kind, FindingKind::LeakGrowth);
        assert_eq!(function_of(&f.site), "record_loss");
        assert_eq!(f.location, "train.py:42");
        assert_eq!(f.bytes, truth.leaks[0].bytes);
        let per_step = f.bytes_per_iteration.expect("rate per step");
        assert!(
            (per_step - 4.0 * MIB as f64).abs() < 0.01 * MIB as f64,
            "{events}: {per_step}"
        );
        assert!(f.bytes_per_hour.expect("rate per hour") > 0.0);
        assert!(
            f.headline.contains("4.00 MiB per step at train.py:42"),
            "{}",
            f.headline
        );
        let it = &r.analysis.iterations;
        assert_eq!(it.label, "train_step");
        assert_eq!(it.count, truth.steps);
        let scope = &r.analysis.scopes[0];
        assert_eq!(scope.calls, truth.steps);
        assert!(scope.reference_leak && !scope.bounded);
        assert!(r.analysis.trends[0].fit.r > 0.5 && r.analysis.trends[0].seconds_to_full.is_some());
    }
}

#[test]
fn the_plateauing_cache_is_bounded_not_a_leak() {
    for events in [5_000, 20_000] {
        let (r, truth) = run(Scenario::CachePlateau, events);
        assert!(r.findings.is_empty(), "{events}: {:#?}", r.findings);
        for name in &truth.bounded {
            assert!(
                r.notes
                    .iter()
                    .any(|n| n.kind == FindingKind::BoundedGrowth && function_of(&n.site) == name),
                "{events}: {name} not noted as bounded"
            );
            let g = r
                .analysis
                .growth
                .iter()
                .find(|g| function_of(&g.site) == name)
                .expect("the cache grew");
            assert!(g.bounded && !g.leaking, "{events}: {g:?}");
            // Live at the exit of a Python program: held, not leaked.
            let live = r
                .analysis
                .leaks_at_exit
                .iter()
                .find(|g| function_of(&g.site.site) == name)
                .expect("cache is live at the end");
            assert_eq!(live.class, LeakClass::LiveAtEnd);
        }
    }
    // At 5,000 events the reference rule alone would call the cache a leak (25 % of the steps
    // grow, 512 MiB in total); the table says so, and that it is bounded.
    let (r, _) = run(Scenario::CachePlateau, 5_000);
    let s = &r.analysis.scopes[0];
    assert!(s.reference_leak && s.bounded);
}

#[test]
fn the_exception_path_leak_is_a_missed_free_with_an_error_path_fix() {
    let (r, truth) = run(Scenario::ExceptionLeak, 20_000);
    let f = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::MissedFree)
        .expect("missed free");
    assert_eq!(function_of(&f.site), "load_batch");
    assert_eq!(f.bytes, truth.leaks[0].bytes);
    assert!(
        f.fix.contains("error path") && f.fix.contains("data.py:40"),
        "{}",
        f.fix
    );
    assert!(r.recommendations.iter().any(|x| x.fix == f.fix));
}

#[test]
fn thread_exit_leak_names_the_thread() {
    let (r, _) = run(Scenario::MultiDevice, 20_000);
    let f = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::ThreadExitLeak)
        .expect("thread exit leak");
    assert_eq!(function_of(&f.site), "stage_batch");
    assert_eq!(f.bytes, 96 * MIB);
    let g = &r.analysis.leaks_at_exit[0];
    assert_eq!(g.class, LeakClass::ThreadExited);
    assert!(g.thread_last_ts_nanos.is_some());
}

#[test]
fn context_teardown_is_reported_separately_and_is_not_a_leak() {
    let (r, truth) = run(Scenario::ContextReset, 20_000);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert!(r.analysis.leaks_at_exit.is_empty());
    let released: u64 = r.analysis.teardown_released.iter().map(|s| s.bytes).sum();
    assert_eq!(released, truth.teardown_freed_bytes);
    assert!(
        r.notes
            .iter()
            .any(|n| n.kind == FindingKind::TeardownRelease
                && function_of(&n.site) == "setup_buffers")
    );
}

#[test]
fn planted_spikes_are_found_with_time_size_and_site() {
    for events in [5_000, 20_000] {
        let (r, truth) = run(Scenario::Spikes, events);
        assert!(!truth.spikes.is_empty());
        let scope = r
            .analysis
            .scope_spikes
            .iter()
            .find(|s| s.scope == "train_step")
            .expect("train_step spikes");
        assert_eq!(scope.spike_count, truth.spikes.len() as u64);
        for p in &truth.spikes {
            assert!(
                scope.events.iter().any(|e| e.ts_nanos == p.ts_nanos
                    && e.size_bytes == p.bytes
                    && function_of(&e.site) == p.function),
                "{events}: scope spike at {} missing",
                p.ts_nanos
            );
            assert!(
                r.analysis
                    .timeline_spikes
                    .iter()
                    .any(|e| e.ts_nanos == p.ts_nanos
                        && e.size_bytes == p.bytes
                        && function_of(&e.site) == p.function),
                "{events}: timeline spike at {} missing",
                p.ts_nanos
            );
        }
        assert_eq!(r.analysis.timeline_spikes.len(), truth.spikes.len());
        // Recurring spikes are one finding with their count, a warning (the device is far from
        // full and nothing failed).
        assert_eq!(r.findings.len(), 1, "{events}: {:#?}", r.findings);
        let f = &r.findings[0];
        assert_eq!(f.kind, FindingKind::TimelineSpike);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.count, truth.spikes.len() as u64);
        assert_eq!(f.bytes, truth.spikes[0].bytes);
        assert_eq!(function_of(&f.site), "attention_scores");
        assert!(f.headline.contains("every 25 steps"), "{}", f.headline);
    }
}

#[test]
fn fragmentation_ratios_are_exact() {
    let (r, truth) = run(Scenario::Fragmented, 1_000);
    let planted = truth.fragmentation.expect("planted fragmentation");
    let pool = &r.analysis.fragmentation[0];
    let ratios: Vec<f64> = planted
        .pool_samples
        .iter()
        .map(|&(reserved, used)| (reserved - used) as f64 / reserved as f64)
        .collect();
    assert_eq!(ratios, [0.5, 0.625, 0.75]);
    let got: Vec<f64> = pool.series.iter().map(|p| p.ratio).collect();
    assert_eq!(got, ratios);
    assert_eq!(pool.mean_ratio, 0.625);
    assert_eq!(pool.max_ratio, 0.75);
    assert_eq!(pool.max_wasted_bytes, 768 * MIB);
    let gaps = pool.gaps_at_max.expect("address gaps at the worst sample");
    assert_eq!(gaps.free_bytes, planted.free_inside_span_bytes);
    assert_eq!(gaps.largest_free_bytes, planted.largest_free_bytes);
    assert_eq!(gaps.external_fragmentation, 1.0 - 64.0 / 192.0);
    // The failed allocation is the evidence (critical, first); the free reserve is not called cache
    // on a device where an allocation failed, nor fragmentation a second time.
    assert_eq!(r.findings.len(), 1, "{:#?}", r.findings);
    // Fragmentation that made an allocation fail: one critical fragmentation finding.
    assert_eq!(r.findings[0].kind, FindingKind::Fragmentation);
    assert_eq!(r.findings[0].severity, Severity::Critical);
    assert!(
        r.findings[0].headline.contains("fragmentation"),
        "{}",
        r.findings[0].headline
    );
    assert!(!r.notes.iter().any(|n| n.kind == FindingKind::Cache));
    assert!(pool.flagged && pool.forced_growth_count == 0);
    let oom = &r.analysis.oom[0];
    assert_eq!(oom.requested_bytes, planted.failed_request_bytes);
    assert_eq!(oom.cause, OomCause::Fragmentation);
    assert_eq!(oom.gaps.expect("gaps").largest_free_bytes, 64 * MIB);
}

#[test]
fn oom_forensics_names_the_call_site_holding_memory_and_other_processes() {
    let (r, truth) = run(Scenario::Oom, 20_000);
    let o = &r.analysis.oom[0];
    assert_eq!(o.cause, OomCause::OwnAllocations);
    assert_eq!(function_of(&o.live_sites[0].site), "grow_buffers");
    assert_eq!(o.live_sites[0].bytes, truth.leaks[0].bytes);
    assert_eq!(o.other_processes.len(), 1);
    assert_eq!(o.other_processes[0].pid, 9999);
    assert_eq!(o.other_processes[0].used_bytes, 20 * GIB);
    // One cause, one finding: the leak that filled the device carries the out-of-memory.
    assert_eq!(r.findings.len(), 1, "{:#?}", r.findings);
    let f = &r.findings[0];
    assert_eq!(f.kind, FindingKind::LeakGrowth);
    assert_eq!(function_of(&f.site), "grow_buffers");
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        f.headline.ends_with("it caused an out-of-memory"),
        "{}",
        f.headline
    );
    assert!(
        f.evidence.iter().any(|e| e.contains("allocating 8.00 GiB")),
        "{:#?}",
        f.evidence
    );
    assert_eq!(function_of(&o.site), "allocate_output");
    assert_eq!(o.requested_bytes, 8 * GIB);
    // Other processes' memory is named, never ours.
    assert!(
        r.notes
            .iter()
            .any(|n| n.kind == FindingKind::OtherProcesses && n.message.contains("pid 9999"))
    );
    // Without NVTX ranges, the scopes are call sites: each allocation is one call.
    let s = &r.analysis.scopes[0];
    assert_eq!(s.kind, ScopeKind::CallSite);
    assert_eq!(function_of(&s.scope), "grow_buffers");
    assert_eq!(s.total_growth_bytes, truth.leaks[0].bytes as i64);
    assert!(s.reference_leak && !s.bounded);
}

#[test]
fn call_site_scopes_net_out_frees_and_teardowns() {
    // Every allocation of the loop is freed before the next one: no call grows.
    let (r, _) = run(Scenario::ContextReset, 20_000);
    assert!(
        r.analysis
            .scopes
            .iter()
            .all(|s| s.kind == ScopeKind::CallSite)
    );
    assert!(!r.analysis.scopes.iter().any(|s| s.reference_leak));
    // The thread-exit leak grows 96 MiB, under the 100 MiB reference limit.
    let (r, _) = run(Scenario::MultiDevice, 20_000);
    let s = r
        .analysis
        .scopes
        .iter()
        .find(|s| function_of(&s.scope) == "stage_batch")
        .expect("stage_batch scope");
    assert_eq!(s.total_growth_bytes, 96 * MIB as i64);
    assert!(!s.reference_leak);
}

#[test]
fn hidden_memory_drift_is_found() {
    let (r, truth) = run(Scenario::HiddenGrowth, 5_000);
    assert!(truth.hidden_drift);
    let h = &r.analysis.hidden[0];
    assert_eq!(h.skipped, None);
    assert!(h.drift.expect("drift fit").r_squared > 0.85);
    let f = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::HiddenDrift)
        .expect("drift finding");
    assert_eq!(f.severity, Severity::Warning);
    assert!(!r.findings.iter().any(|f| f.kind.is_leak()));
}

#[test]
fn the_clean_workload_has_no_findings() {
    for events in [5_000, 20_000, 100_000] {
        let (r, _) = run(Scenario::Clean, events);
        assert!(r.findings.is_empty(), "{events}: {:#?}", r.findings);
        assert_eq!(r.grade, "A");
        assert!(r.score >= 90);
        assert!(r.analysis.leaks_at_exit.is_empty());
    }
}

/// A service that allocates per request in sizes of no round number, nearly every one distinct,
/// and frees every request's buffers: healthy. Its scratch sizes stop being counted past a few
/// thousand (`Counts`), and their quartiles come from passes over the history.
#[test]
fn a_service_allocating_arbitrary_sizes_per_request_has_no_findings() {
    for events in [5_000, 20_000, 100_000] {
        let (r, truth) = run(Scenario::Requests, events);
        assert!(r.findings.is_empty(), "{events}: {:#?}", r.findings);
        assert_eq!(r.grade, "A");
        assert!(r.analysis.leaks_at_exit.is_empty());
        assert_eq!(r.peak_bytes, truth.peak_bytes);
        assert!(r.analysis.growth.iter().all(|g| !g.leaking));
    }
}

#[test]
fn recommendations_are_at_most_ten_critical_first_and_name_a_place() {
    for s in Scenario::ALL {
        let (r, _) = run(s, 20_000);
        assert!(r.recommendations.len() <= 10);
        for w in r.recommendations.windows(2) {
            assert!(w[0].priority < w[1].priority);
        }
        if let Some(first_warning) = r
            .recommendations
            .iter()
            .position(|x| x.severity != Severity::Critical)
        {
            assert!(
                r.recommendations[first_warning..]
                    .iter()
                    .all(|x| x.severity != Severity::Critical || x.kind.is_insight()),
                "{s:?}"
            );
        }
        for x in &r.recommendations {
            assert!(!x.site.is_empty() && !x.fix.is_empty(), "{s:?}: {x:?}");
        }
    }
}

#[test]
fn diff_of_before_and_after_shows_the_leak_going_away() {
    let (before, _) = run(Scenario::TrainingLeak, 20_000);
    let (after, _) = run(Scenario::Clean, 20_000);
    let d = analysis_core::analysis::diff::diff(&before, &after);
    assert!(d.live_at_end_bytes.delta < 0);
    let leak = d
        .sites
        .iter()
        .find(|s| function_of(&s.site) == "record_loss")
        .expect("record_loss changed");
    assert_eq!(leak.live_at_end_bytes.after, 0);
    assert_eq!(leak.live_at_end_bytes.before, 2 * GIB);
    let scope = d
        .scopes
        .iter()
        .find(|s| s.scope == "train_step")
        .expect("scope");
    assert_eq!(scope.growth_bytes.after, 0);
    assert_eq!(scope.growth_bytes.before, 2 * GIB as i64);
    assert!(
        d.resolved_findings
            .iter()
            .any(|f| f.kind == FindingKind::LeakGrowth)
    );
    assert!(d.new_findings.is_empty());
    assert!(d.score.after > d.score.before);
    // A report diffed with itself has no changes.
    let same = analysis_core::analysis::diff::diff(&before, &before);
    assert!(
        same.sites.is_empty() && same.new_findings.is_empty() && same.resolved_findings.is_empty()
    );
}

#[test]
fn nvtx_scoped_leak_is_reported_on_the_inner_range_with_its_call_site() {
    for events in [5_000, 20_000] {
        let (r, truth) = run(Scenario::NvtxLeak, events);
        let growth: Vec<&Finding> = r.findings.iter().collect();
        // `epoch` grows too, but only because `validate` does: one finding, on `validate`.
        assert_eq!(growth.len(), 1, "{events}: {growth:#?}");
        assert_eq!(
            growth[0].scope.as_deref(),
            Some(truth.leaky_scopes[0].as_str())
        );
        assert_eq!(function_of(&growth[0].site), "keep_predictions");
        assert_eq!(growth[0].bytes, truth.leaks[0].bytes);
        assert!(growth[0].fix.contains("eval.py:37"), "{}", growth[0].fix);
        let epoch = r
            .analysis
            .scopes
            .iter()
            .find(|s| s.scope == "epoch")
            .expect("epoch scope");
        assert!(epoch.reference_leak);
        assert_eq!(epoch.explained_by.as_deref(), Some("validate"));
        let train = r
            .analysis
            .scopes
            .iter()
            .find(|s| s.scope == "train_step")
            .expect("train_step scope");
        assert_eq!(train.total_growth_bytes, 0);
        assert_eq!(train.calls, truth.steps);
    }
}

/// A small trace written record by record: a process, a device, named native frames.
struct Builder {
    enc: Encoder,
    next_string: u32,
    t: u64,
    addr: u64,
}

impl Builder {
    fn new() -> Self {
        let mut enc = Encoder::new(&Encoder::header_v1());
        enc.record(&Record::Process(ProcessInfo {
            process: ProcessIdx(0),
            pid: 7,
            ..ProcessInfo::default()
        }));
        enc.record(&Record::Device(DeviceInfo {
            device: DeviceIdx(0),
            total_bytes: 16 << 30,
            ..DeviceInfo::default()
        }));
        Self {
            enc,
            next_string: 1,
            t: 1_000,
            addr: 1 << 40,
        }
    }

    fn string(&mut self, v: &str) -> StringId {
        let id = StringId(self.next_string);
        self.next_string += 1;
        self.enc.record(&Record::String {
            id,
            value: v.into(),
        });
        id
    }

    /// A stack of (function, file, line) frames, innermost first, as Python frame records.
    fn stack(&mut self, id: u32, frames: &[(&str, &str, u32)]) -> StackId {
        let mut parent = StackId(0);
        for (k, &(function, file, line)) in frames.iter().rev().enumerate() {
            let frame = FrameId(id * 100 + k as u32);
            let (function, file) = (self.string(function), self.string(file));
            self.enc.record(&Record::Frame(FrameDef::Python {
                id: frame,
                function,
                file,
                line,
            }));
            let stack = StackId(id * 100 + k as u32);
            self.enc.record(&Record::Stack(StackDef {
                stack,
                parent,
                frame,
            }));
            parent = stack;
        }
        parent
    }

    fn alloc(&mut self, size_bytes: u64, stack: StackId, kind: AllocKind) -> AllocId {
        self.t += 1_000_000;
        self.addr += size_bytes;
        self.enc.alloc(&Alloc {
            ts_nanos: self.t,
            size_bytes,
            address: self.addr,
            stack,
            kind,
            ..Alloc::default()
        })
    }

    /// An allocation at `address` (framework blocks sit inside their segment).
    fn alloc_at(
        &mut self,
        address: u64,
        size_bytes: u64,
        stack: StackId,
        kind: AllocKind,
    ) -> AllocId {
        self.t += 1_000_000;
        self.enc.alloc(&Alloc {
            ts_nanos: self.t,
            size_bytes,
            address,
            stack,
            kind,
            ..Alloc::default()
        })
    }

    fn free(&mut self, alloc: AllocId) {
        self.t += 1_000_000;
        self.enc.record(&Record::Free(Free {
            ts_nanos: self.t,
            alloc,
            ..Free::default()
        }));
    }

    fn pool_sample(&mut self, reserved_bytes: u64, used_bytes: u64) {
        self.t += 1_000;
        self.enc.record(&Record::PoolSample(PoolSample {
            ts_nanos: self.t,
            reserved_bytes,
            used_bytes,
            ..PoolSample::default()
        }));
    }

    fn exit(self) -> Report {
        self.exit_report_and_trace().0
    }

    fn exit_report_and_trace(mut self) -> (Report, LoadedTrace) {
        self.t += 1_000;
        self.enc.record(&Record::ProcessExit(ProcessExit {
            ts_nanos: self.t,
            process: ProcessIdx(0),
            code: Some(0),
            signal: None,
        }));
        self.enc.record(&Record::End { ts_nanos: self.t });
        let t = load(&self.enc.into_bytes()).expect("loads");
        (summarize(&t), t)
    }
}

#[test]
fn every_segment_of_a_caching_allocator_gets_the_same_cache_verdict() {
    // Eight segments of one caching allocator, made at different times from different user
    // lines as its use grew, all live at exit once the program freed its tensors (the pool
    // samples say nothing is in use): cache, every one.
    let mut b = Builder::new();
    let early = b.stack(
        1,
        &[
            (
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                "",
                0,
            ),
            ("forward", "model.py", 31),
            ("main", "train.py", 10),
        ],
    );
    let late = b.stack(
        2,
        &[
            (
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                "",
                0,
            ),
            ("update", "metrics.py", 33),
            ("main", "train.py", 12),
        ],
    );
    for k in 0..8 {
        b.alloc(
            20 << 20,
            if k < 2 { early } else { late },
            AllocKind::Device,
        );
        b.pool_sample((k + 1) * (20 << 20), (k + 1) * (20 << 20) - (1 << 20));
    }
    b.pool_sample(8 * (20 << 20), 0);
    let r = b.exit();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert!(
        r.analysis
            .leaks_at_exit
            .iter()
            .all(|g| g.class == LeakClass::Cache),
        "{:#?}",
        r.analysis.leaks_at_exit
    );
    let cached: u64 = r
        .notes
        .iter()
        .filter(|n| n.kind == FindingKind::Cache)
        .map(|n| n.bytes)
        .max()
        .unwrap_or(0);
    assert_eq!(cached, 8 * (20 << 20));
}

#[test]
fn unknown_kinds_are_not_device_memory_and_pinned_memory_has_its_own_totals_and_leaks() {
    let mut b = Builder::new();
    let staging = b.stack(1, &[("stage", "staging.cpp", 19), ("main", "app.cpp", 5)]);
    let other = b.stack(2, &[("mystery", "app.cpp", 40), ("main", "app.cpp", 6)]);
    b.alloc(64 << 20, staging, AllocKind::PinnedHost);
    b.alloc(1 << 30, other, AllocKind::Other);
    let r = b.exit();
    // Neither counts as device memory.
    assert_eq!(r.peak_bytes, 0);
    assert_eq!(r.live_at_end_bytes, 0);
    assert_eq!(r.pinned_host.len(), 1);
    assert_eq!(r.pinned_host[0].peak_bytes, 64 << 20);
    assert_eq!(r.pinned_host[0].live_at_end_bytes, 64 << 20);
    // The pinned buffer a native program never freed is a leak, said to be pinned memory.
    assert_eq!(r.findings.len(), 1, "{:#?}", r.findings);
    let f = &r.findings[0];
    assert_eq!(f.kind, FindingKind::LeakAtExit);
    assert_eq!(f.location, "staging.cpp:19");
    assert_eq!(f.bytes, 64 << 20);
    assert!(f.message.contains("pinned host memory"), "{}", f.message);
}

/// A PyTorch program as gpucollect's framework capture records it: the caching allocator's
/// 20 MiB segments (driver allocations under c10's allocator) and, inside them, the tensors
/// (framework blocks) at the user's Python lines. 40 steps: a batch and an activation freed
/// every step, parameters made once, and `leak` bytes a step kept at metrics.py:33.
fn two_layer_training(leak: u64) -> (Report, LoadedTrace) {
    let mut b = Builder::new();
    let segment = b.stack(
        1,
        &[
            (
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                "",
                0,
            ),
            ("forward", "model.py", 20),
            ("step", "train.py", 40),
            ("<module>", "train.py", 90),
        ],
    );
    let params = b.stack(
        2,
        &[("__init__", "model.py", 8), ("<module>", "train.py", 80)],
    );
    let batch = b.stack(
        3,
        &[
            ("load", "data.py", 12),
            ("step", "train.py", 38),
            ("<module>", "train.py", 90),
        ],
    );
    let act = b.stack(
        4,
        &[
            ("forward", "model.py", 20),
            ("step", "train.py", 40),
            ("<module>", "train.py", 90),
        ],
    );
    let kept = b.stack(
        5,
        &[
            ("update", "metrics.py", 33),
            ("step", "train.py", 44),
            ("<module>", "train.py", 90),
        ],
    );
    const SEG: u64 = 20 * MIB;
    let base = 1u64 << 40;
    b.alloc_at(base, SEG, segment, AllocKind::Device);
    b.alloc_at(base, 8 * MIB, params, AllocKind::FrameworkBlock);
    // Kept blocks fill segments of their own, one after the other.
    let mut kept_bytes = 0;
    let mut segments = 1;
    for _ in 0..40 {
        let x = b.alloc_at(base + 8 * MIB, 4 * MIB, batch, AllocKind::FrameworkBlock);
        let y = b.alloc_at(base + 12 * MIB, 6 * MIB, act, AllocKind::FrameworkBlock);
        if leak > 0 {
            if kept_bytes + leak > (segments - 1) * SEG {
                b.alloc_at(base + segments * SEG, SEG, segment, AllocKind::Device);
                segments += 1;
            }
            b.alloc_at(
                base + SEG + kept_bytes,
                leak,
                kept,
                AllocKind::FrameworkBlock,
            );
            kept_bytes += leak;
        }
        b.free(y);
        b.free(x);
    }
    b.exit_report_and_trace()
}

#[test]
fn with_tensors_the_analysis_reads_the_tensors_and_the_reserve_is_cache() {
    let (healthy, t) = two_layer_training(0);
    assert!(healthy.findings.is_empty(), "{:#?}", healthy.findings);
    // The figures stay the driver's: the reserve is what the device held.
    assert_eq!(t.model.peak_bytes % (20 * MIB), 0);
    assert!(t.model.live_at_end_bytes() >= 20 * MIB);
    let allocated = &t.model.allocated[0];
    assert_eq!(allocated.live_bytes, 8 * MIB);
    assert_eq!(allocated.peak_bytes, 18 * MIB);
    // The segments held at exit are the framework's cache, with its size.
    assert!(
        healthy.notes.iter().any(|n| n.kind == FindingKind::Cache),
        "{:#?}",
        healthy.notes
    );

    let (leaking, t) = two_layer_training(MIB);
    let first = leaking.findings.first().expect("a finding");
    assert!(first.kind.is_leak(), "{first:#?}");
    assert_eq!(function_of(&first.site), "update", "{first:#?}");
    assert!(first.site.contains("metrics.py:33"), "{}", first.site);
    assert_eq!(first.bytes, 40 * MIB, "{first:#?}");
    assert!(
        leaking
            .findings
            .iter()
            .all(|f| !f.site.contains("CachingAllocator")),
        "{:#?}",
        leaking.findings
    );
    assert_eq!(t.model.allocated[0].live_bytes, 48 * MIB);
}

/// Ranks of one job leaking the same bytes at the same line are groups the report ranks
/// equal: they come out in one order every time (they followed a hash map's order, which
/// changes from one run to the next).
#[test]
fn equal_leaks_of_several_processes_keep_one_order() {
    let report = || {
        let mut b = Builder::new();
        let leak = b.stack(1, &[("keep", "train.py", 42)]);
        for p in 1..40u32 {
            b.enc.record(&Record::Process(ProcessInfo {
                process: ProcessIdx(p),
                pid: 7 + p,
                ..ProcessInfo::default()
            }));
        }
        for p in 0..40u32 {
            b.t += 1_000_000;
            b.addr += 1 << 20;
            b.enc.alloc(&Alloc {
                ts_nanos: b.t,
                size_bytes: 1 << 20,
                address: b.addr,
                stack: leak,
                process: ProcessIdx(p),
                ..Alloc::default()
            });
        }
        let r = b.exit();
        let groups: Vec<(u64, u64)> = r
            .analysis
            .leaks_at_exit
            .iter()
            .map(|g| (g.first_ts_nanos, g.site.bytes))
            .collect();
        assert_eq!(groups.len(), 40, "one group per process");
        groups
    };
    let first = report();
    for _ in 0..10 {
        assert_eq!(report(), first);
    }
}

/// A growth finding's time is when the first allocation it counts was made: it is the time of
/// an allocation left live at the end, and no allocation of the finding's stack on its device
/// that is left live is older.
#[test]
fn a_growth_finding_starts_at_its_oldest_live_allocation() {
    let mut checked = 0;
    for s in Scenario::ALL {
        let (bytes, _) = generate(s, 20_000, 7);
        let t = load(&bytes).expect("synthetic trace loads");
        let r = summarize(&t);
        let m = &t.model;
        for f in r
            .findings
            .iter()
            .filter(|f| matches!(f.kind, FindingKind::LeakGrowth | FindingKind::MissedFree))
        {
            let ts = f.ts_nanos.expect("a growth finding has a time");
            let stack = f.stack.expect("a growth finding names a stack");
            assert!(
                m.allocs.iter().any(|a| a.is_live() && a.ts_nanos == ts),
                "{s:?}: {ts} is no live allocation's time"
            );
            let oldest = m
                .allocs
                .iter()
                .filter(|a| a.is_live() && a.stack == stack)
                .filter(|a| f.device.is_none_or(|d| a.device == d))
                .map(|a| a.ts_nanos)
                .min()
                .expect("the finding's stack has live allocations");
            assert!(ts <= oldest, "{s:?}: {ts} after {oldest}");
            checked += 1;
        }
    }
    assert!(checked >= 3, "{checked} growth findings");
}
