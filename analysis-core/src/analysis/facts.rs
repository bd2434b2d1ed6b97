//! The trace-level facts of a [`Report`]: devices, duration, peak and its call sites, live at
//! end, processes, pinned host memory, failed allocations and warnings, before any detector
//! runs.

use alloc::string::ToString;
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::format::*;
use crate::model::{AllocRecord, Fields, LoadedTrace, PEAK_STACK_THREADS, Series, TraceModel};
use crate::report::{
    AllocatedSummary, DeviceSummary, FailedSummary, PinnedHostSummary, ProcessSummary, Report,
    SiteBytes,
};

use super::{Carried, Config};

/// The highest sum of `series` over time and when it was first reached: their points merged
/// in time order (ties in the series' order), one point of each series held at a time.
fn merged_peak(series: &[&Series]) -> (u64, u64) {
    use alloc::collections::BinaryHeap;
    use core::cmp::Reverse;
    if let [s] = series {
        // One series: its highest point, first reached (the pyramid finds both).
        let t = &s.timeline;
        return match t.range_min_max(0, t.len()) {
            Some((_, hi)) if hi > 0 => (hi, t.time(t.first_at_least(0, t.len(), hi).unwrap_or(0))),
            _ => (0, 0),
        };
    }
    let mut points: Vec<_> = series.iter().map(|s| s.timeline.points()).collect();
    let mut last = alloc::vec![0u64; series.len()];
    let mut next: BinaryHeap<Reverse<(u64, usize, u64)>> = BinaryHeap::new();
    for (i, p) in points.iter_mut().enumerate() {
        if let Some((t, v)) = p.next() {
            next.push(Reverse((t, i, v)));
        }
    }
    let (mut cur, mut peak, mut at): (i128, u64, u64) = (0, 0, 0);
    while let Some(Reverse((t, i, v))) = next.pop() {
        cur += i128::from(v) - i128::from(last[i]);
        last[i] = v;
        if cur > i128::from(peak) {
            peak = u64::try_from(cur).unwrap_or(u64::MAX);
            at = t;
        }
        if let Some((t, v)) = points[i].next() {
            next.push(Reverse((t, i, v)));
        }
    }
    (peak, at)
}

/// How many call sites the summary lists per section.
pub const TOP_SITES: usize = 10;

/// The fields of each allocation [`group_by_stack`] reads.
pub const GROUP_FIELDS: Fields = Fields::STACK.and(Fields::SIZE).and(Fields::THREAD);

/// Groups allocations by stack: (bytes, count, threads: the first [`PEAK_STACK_THREADS`]
/// met), largest first, at most `limit`.
pub fn group_by_stack(
    model: &TraceModel,
    allocs: impl Iterator<Item = AllocRecord>,
    limit: usize,
) -> Vec<SiteBytes> {
    /// (bytes, count, allocating threads) per stack.
    type Group = (u64, u64, Vec<ThreadIdx>);
    let mut by: HashMap<StackId, Group> = HashMap::new();
    for a in allocs {
        let e = by.entry(a.stack).or_default();
        e.0 = e.0.saturating_add(a.size_bytes);
        e.1 += 1;
        if !e.2.contains(&a.thread) && e.2.len() < PEAK_STACK_THREADS {
            e.2.push(a.thread);
        }
    }
    let mut v: Vec<(StackId, Group)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    v.truncate(limit);
    v.into_iter()
        .map(|(stack, (bytes, count, mut threads))| {
            threads.sort();
            site_bytes(model, stack, bytes, count, threads)
        })
        .collect()
}

/// A call site's row of a summary table.
fn site_bytes(
    model: &TraceModel,
    stack: StackId,
    bytes: u64,
    count: u64,
    threads: Vec<ThreadIdx>,
) -> SiteBytes {
    SiteBytes {
        stack,
        site: model.stack_label(stack),
        frames: model
            .stack_frames(stack)
            .iter()
            .map(ToString::to_string)
            .collect(),
        bytes,
        count,
        threads,
    }
}

/// The full report with the default thresholds.
pub fn summarize(trace: &LoadedTrace) -> Report {
    crate::analysis::analyze(trace, &Config::default())
}

/// The trace-level facts only (no detectors).
pub fn summary_facts(trace: &LoadedTrace) -> Report {
    summary_facts_carrying(trace, &mut super::Nothing)
}

/// [`summary_facts`], its pass over the trace's model carrying `carried`'s.
pub(crate) fn summary_facts_carrying(trace: &LoadedTrace, carried: &mut impl Carried) -> Report {
    let m = &trace.model;
    let h = &m.header;
    // Grouped by the model's pass over what is live at the peak (`TraceModel::finish`).
    let peak_sites = m
        .peak_stacks
        .iter()
        .take(TOP_SITES)
        .map(|p| site_bytes(m, p.stack, p.bytes, p.count, p.threads.clone()))
        .collect();
    // One pass: the freed allocations counted, the device memory live at the end grouped.
    let (mut free_count, mut live_at_end_count) = (0u64, 0u64);
    let fields = GROUP_FIELDS | Fields::FREE | Fields::KIND | carried.fields();
    let live_end = m.allocs.iter_fields(fields).filter(|a| {
        carried.visit(a);
        if !a.is_live() {
            free_count += 1;
            false
        } else if a.kind.is_device_memory() {
            live_at_end_count += 1;
            true
        } else {
            false
        }
    });
    let live_at_end_sites = group_by_stack(m, live_end, TOP_SITES);

    let mut devices: Vec<DeviceSummary> = m
        .devices
        .iter()
        .map(|d| DeviceSummary {
            device: d.device,
            name: d.name.clone(),
            total_bytes: d.total_bytes,
            ..DeviceSummary::default()
        })
        .collect();
    devices.extend(
        m.undeclared_devices()
            .into_iter()
            .map(|device| DeviceSummary {
                device,
                ..DeviceSummary::default()
            }),
    );
    for d in &mut devices {
        let series: Vec<&Series> = m
            .series
            .iter()
            .filter(|s| !s.key.host && s.key.device == d.device)
            .collect();
        for s in &series {
            d.live_at_end_bytes = d.live_at_end_bytes.saturating_add(s.live_bytes);
        }
        (d.peak_bytes, d.peak_ts_nanos) = merged_peak(&series);
    }
    devices.sort_by_key(|d| d.device);

    let processes = m
        .processes
        .iter()
        .map(|p| {
            let exit = m
                .process_exits
                .iter()
                .rev()
                .find(|e| e.process == p.process);
            let series = m
                .series
                .iter()
                .filter(|s| !s.key.host && s.key.process == p.process);
            let (peak, live) = series.fold((0u64, 0u64), |(pk, lv), s| {
                (pk.max(s.peak_bytes), lv.saturating_add(s.live_bytes))
            });
            ProcessSummary {
                process: p.process,
                pid: p.pid,
                exe: p.exe.clone(),
                exit_code: exit.and_then(|e| e.code),
                exit_signal: exit.and_then(|e| e.signal),
                exit_status_unknown: exit.is_some_and(|e| e.code.is_none() && e.signal.is_none()),
                peak_bytes: peak,
                live_at_end_bytes: live,
            }
        })
        .collect();

    let failed_allocations = m
        .failed
        .iter()
        .map(|f| FailedSummary {
            ts_nanos: f.record.ts_nanos,
            size_bytes: f.record.size_bytes,
            error_code: f.record.error_code,
            device: f.record.device,
            process: f.record.process,
            thread: f.record.thread,
            live_bytes: f.live_bytes,
            site: m.stack_label(f.record.stack),
            frames: m
                .stack_frames(f.record.stack)
                .iter()
                .map(ToString::to_string)
                .collect(),
        })
        .collect();

    let mut pinned_host: Vec<PinnedHostSummary> = Vec::new();
    for s in m.series.iter().filter(|s| s.key.host) {
        match pinned_host.iter_mut().find(|p| p.process == s.key.process) {
            // Series of one process on several devices: their sum at the end; the highest peak
            // (a lower bound of the process's peak).
            Some(p) => {
                p.peak_bytes = p.peak_bytes.max(s.peak_bytes);
                p.live_at_end_bytes = p.live_at_end_bytes.saturating_add(s.live_bytes);
            }
            None => pinned_host.push(PinnedHostSummary {
                process: s.key.process,
                peak_bytes: s.peak_bytes,
                live_at_end_bytes: s.live_bytes,
            }),
        }
    }
    pinned_host.sort_by_key(|p| p.process);
    let mut allocated: Vec<AllocatedSummary> = m
        .allocated
        .iter()
        .map(|s| AllocatedSummary {
            process: s.key.process,
            device: s.key.device,
            peak_bytes: s.peak_bytes,
            peak_ts_nanos: s.peak_ts_nanos,
            live_at_end_bytes: s.live_bytes,
            live_at_end_count: s.live_count,
            block_count: 0,
        })
        .collect();
    // Framework blocks count only where the model has the framework's series.
    if !allocated.is_empty() {
        for a in m
            .allocs
            .iter()
            .filter(|a| a.kind == AllocKind::FrameworkBlock)
        {
            if let Some(s) = allocated
                .iter_mut()
                .find(|s| s.process == a.process && s.device == a.device)
            {
                s.block_count += 1;
            }
        }
    }
    allocated.sort_by_key(|s| (s.process, s.device));
    Report {
        format_version: alloc::format!("{}.{}", h.format_major, h.format_minor),
        collector: h.collector.clone(),
        host: h.host.clone(),
        argv: h.argv.clone(),
        duration_nanos: m.duration_nanos(),
        first_ts_nanos: m.first_ts_nanos,
        last_ts_nanos: m.last_ts_nanos,
        records: m.records,
        alloc_count: m.allocs.len() as u64,
        free_count,
        devices,
        processes,
        peak_bytes: m.peak_bytes,
        peak_ts_nanos: m.peak_ts_nanos,
        peak_sites,
        live_at_end_bytes: m.live_at_end_bytes(),
        live_at_end_count,
        live_at_end_sites,
        pinned_host,
        allocated,
        failed_allocations,
        clean_end: m.clean_end,
        dropped_events: m.dropped_events,
        warnings: trace.warnings.iter().map(ToString::to_string).collect(),
        capture_incomplete: trace
            .warnings
            .iter()
            // Lost framework history leaves a traced process: its memory is there.
            .filter(|w| {
                matches!(w, crate::decode::Warning::CaptureIncomplete { code, .. }
                    if *code != crate::format::notice_code::FRAMEWORK_HISTORY_LOST)
            })
            .map(ToString::to_string)
            .collect(),
        fatal: trace.fatal.as_ref().map(ToString::to_string),
        ..Report::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SeriesKey;
    use crate::timeline::Timeline;

    fn series(points: &[(u64, u64)]) -> Series {
        let mut timeline = Timeline::new();
        for &(t, v) in points {
            timeline.push(t, v);
        }
        Series {
            key: SeriesKey {
                process: ProcessIdx(0),
                device: DeviceIdx(0),
                host: false,
            },
            live_bytes: 0,
            live_count: 0,
            peak_bytes: 0,
            peak_ts_nanos: 0,
            timeline,
        }
    }

    /// The merge equals summing every series' deltas sorted by time (ties in series order),
    /// as the peak was computed before it merged instead of sorting.
    #[test]
    fn the_merged_peak_is_the_sorted_sums() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let all: Vec<Series> = (0..1 + rand(5))
                .map(|_| {
                    let mut t = rand(10);
                    let pts: Vec<(u64, u64)> = (0..rand(300))
                        .map(|_| {
                            t += rand(3); // equal times within and across series
                            (t, rand(1000))
                        })
                        .collect();
                    series(&pts)
                })
                .collect();
            let refs: Vec<&Series> = all.iter().collect();
            let mut deltas: Vec<(u64, i128)> = Vec::new();
            for s in &all {
                let mut prev = 0u64;
                for (t, v) in s.timeline.points() {
                    deltas.push((t, i128::from(v) - i128::from(prev)));
                    prev = v;
                }
            }
            deltas.sort_by_key(|p| p.0);
            let (mut cur, mut want) = (0i128, (0u64, 0u64));
            for (t, d) in deltas {
                cur += d;
                if cur > i128::from(want.0) {
                    want = (cur as u64, t);
                }
            }
            assert_eq!(merged_peak(&refs), want, "round {round}");
        }
    }
}
