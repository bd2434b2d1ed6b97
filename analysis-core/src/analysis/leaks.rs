//! Leaks at exit: device allocations still live at the end of the trace, grouped by call site,
//! each group classified (never freed, a free missed on some path, left by a thread that went
//! idle, or bounded growth such as a cache). Memory released only by a context teardown is
//! listed separately and is not a leak.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;
use serde::Serialize;

use super::{Config, Finding, FindingKind, Found, Severity, site_label, site_location};
use crate::format::{FreeKind, StackId, ThreadIdx};
use crate::model::TraceModel;
use crate::report::{SiteBytes, group_by_stack};
use crate::units::{fmt_bytes, fmt_duration};

/// Why a live-at-end group is (or is not) a leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakClass {
    /// The call site never frees what it allocates.
    NeverFreed,
    /// The call site frees most of its allocations, not these: a path skips the free.
    MissedFree,
    /// Every allocating thread went idle (or ended) long before the end.
    ThreadExited,
    /// Grew early, then stopped: a cache, pool or warm-up buffer (not a leak).
    Bounded,
}

/// One call site's live allocations at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeakGroup {
    pub class: LeakClass,
    #[serde(flatten)]
    pub site: SiteBytes,
    pub first_ts_nanos: u64,
    pub last_ts_nanos: u64,
    /// All allocations and frees of the site over the trace.
    pub site_alloc_count: u64,
    pub site_free_count: u64,
    /// Last activity of the allocating thread(s), when they went idle.
    pub thread_last_ts_nanos: Option<u64>,
}

#[derive(Default)]
struct Acc {
    bytes: u64,
    count: u64,
    first_ts: u64,
    last_ts: u64,
    threads: Vec<ThreadIdx>,
    process: crate::format::ProcessIdx,
    idx: Vec<u32>,
}

pub fn analyze(m: &TraceModel, c: &Config, found: &mut Found) -> (Vec<LeakGroup>, Vec<SiteBytes>) {
    let end = m.last_ts_nanos;
    let duration = m.duration_nanos();
    let mut by: HashMap<StackId, Acc> = HashMap::new();
    for (i, a) in m.allocs.iter().enumerate() {
        if !(a.is_live() && a.kind.is_device_memory()) {
            continue;
        }
        let e = by.entry(a.stack).or_insert_with(|| Acc {
            first_ts: a.ts_nanos,
            process: a.process,
            ..Acc::default()
        });
        e.bytes = e.bytes.saturating_add(a.size_bytes);
        e.count += 1;
        e.first_ts = e.first_ts.min(a.ts_nanos);
        e.last_ts = e.last_ts.max(a.ts_nanos);
        if !e.threads.contains(&a.thread) && e.threads.len() < 16 {
            e.threads.push(a.thread);
        }
        e.idx.push(i as u32);
    }
    let mut groups = Vec::with_capacity(by.len());
    for (stack, mut acc) in by {
        acc.threads.sort();
        let st = m.stack_stats.get(&stack).copied().unwrap_or_default();
        let idle_nanos = (duration as f64 * c.thread_idle_fraction) as u64;
        let thread_last = acc
            .threads
            .iter()
            .map(|t| {
                m.thread_last_ts
                    .get(&(acc.process, *t))
                    .copied()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let thread_gone = duration > 0 && end.saturating_sub(thread_last) >= idle_nanos.max(1);
        // Bounded: the bytes allocated in the last third of [first allocation, end] are a
        // negligible part of the group.
        let window = end.saturating_sub(acc.first_ts);
        let tail_start = acc.first_ts + window - window / 3;
        let tail_bytes: u64 = acc
            .idx
            .iter()
            .map(|&i| &m.allocs[i as usize])
            .filter(|a| a.ts_nanos >= tail_start)
            .map(|a| a.size_bytes)
            .fold(0u64, u64::saturating_add);
        let bounded = c.detect_bounded_growth
            && acc.count >= c.min_calls_for_analysis
            && window > 0
            && (tail_bytes as f64) <= c.bounded_tail_fraction * acc.bytes as f64;
        // Frees other than by a teardown show the site normally frees.
        let freed_normally = st.free_count > 0;
        let class = if thread_gone {
            LeakClass::ThreadExited
        } else if bounded {
            LeakClass::Bounded
        } else if freed_normally {
            LeakClass::MissedFree
        } else {
            LeakClass::NeverFreed
        };
        let (site, frames) = site_label(m, stack);
        groups.push(LeakGroup {
            class,
            site: SiteBytes {
                stack,
                site,
                frames,
                bytes: acc.bytes,
                count: acc.count,
                threads: acc.threads,
            },
            first_ts_nanos: acc.first_ts,
            last_ts_nanos: acc.last_ts,
            site_alloc_count: st.alloc_count,
            site_free_count: st.free_count,
            thread_last_ts_nanos: thread_gone.then_some(thread_last),
        });
    }
    groups.sort_by(|a, b| {
        b.site
            .bytes
            .cmp(&a.site.bytes)
            .then(a.site.stack.cmp(&b.site.stack))
    });
    for g in &groups {
        if g.site.bytes < c.leak_min_bytes {
            continue;
        }
        found.push(finding(m, c, g));
    }

    let teardown = group_by_stack(
        m,
        m.allocs
            .iter()
            .filter(|a| a.free_kind == FreeKind::ContextTeardown && !a.is_live()),
        super::MAX_SITES,
    );
    for t in &teardown {
        found.push(Finding {
            kind: FindingKind::TeardownRelease,
            severity: Severity::Info,
            site: t.site.clone(),
            stack: Some(t.stack),
            scope: None,
            bytes: t.bytes,
            count: t.count,
            ts_nanos: None,
            impact: None,
            message: format!(
                "{} in {} allocation(s) from {} were released only by a context teardown (not a leak)",
                fmt_bytes(t.bytes),
                t.count,
                t.site
            ),
            fix: format!(
                "nothing required; free them explicitly at {} if the context outlives their use",
                site_location(m, t.stack)
            ),
        });
    }
    (groups, teardown)
}

fn finding(m: &TraceModel, c: &Config, g: &LeakGroup) -> Finding {
    let s = &g.site;
    let loc = site_location(m, s.stack);
    let severity = if g.class == LeakClass::Bounded {
        Severity::Info
    } else if s.bytes > c.leak_critical_bytes {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let threads: String = s
        .threads
        .iter()
        .map(|t| format!("{}", t.0))
        .collect::<Vec<_>>()
        .join(", ");
    let (kind, message, fix) = match g.class {
        LeakClass::NeverFreed => (
            FindingKind::LeakAtExit,
            format!(
                "{} in {} allocation(s) from {} (thread {threads}) are still live at the end; this call site never frees",
                fmt_bytes(s.bytes),
                s.count,
                s.site
            ),
            format!(
                "free these buffers when they are no longer needed, or bound the container that keeps them (allocated at {loc}; e.g. detach or .item() values before storing them)"
            ),
        ),
        LeakClass::MissedFree => (
            FindingKind::MissedFree,
            format!(
                "{} in {} allocation(s) from {} are still live at the end, while {} of its {} allocations were freed",
                fmt_bytes(s.bytes),
                s.count,
                s.site,
                g.site_free_count,
                g.site_alloc_count
            ),
            format!(
                "free on the error path (exception or early return) after the allocation at {loc}: use try/finally or a guard"
            ),
        ),
        LeakClass::ThreadExited => (
            FindingKind::ThreadExitLeak,
            format!(
                "{} in {} allocation(s) from {} were left by thread {threads}, idle for the last {} of the trace",
                fmt_bytes(s.bytes),
                s.count,
                s.site,
                fmt_duration(
                    m.last_ts_nanos
                        .saturating_sub(g.thread_last_ts_nanos.unwrap_or(0))
                )
            ),
            format!(
                "free the buffers allocated at {loc} before the thread exits (or hand them to a thread that frees them)"
            ),
        ),
        LeakClass::Bounded => (
            FindingKind::BoundedGrowth,
            format!(
                "{} in {} allocation(s) from {} are live at the end but stopped growing early (a cache or pool, not a leak)",
                fmt_bytes(s.bytes),
                s.count,
                s.site
            ),
            format!("nothing required; cap the cache at {loc} if its size matters"),
        ),
    };
    Finding {
        kind,
        severity,
        site: s.site.clone(),
        stack: Some(s.stack),
        scope: None,
        bytes: s.bytes,
        count: s.count,
        ts_nanos: Some(g.first_ts_nanos),
        impact: None,
        message,
        fix,
    }
}
