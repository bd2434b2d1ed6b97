//! Summaries of a stored trace for a page that should not download it whole: the report, the
//! timeline at a window's resolution, the live allocations by call site at a moment, and the
//! call-site table (API.md, "Summaries"). The server decodes and analyses the trace once and
//! keeps the result in a cache bounded by an estimate of its memory, least recently used first
//! out; one trace is loaded at a time, so a burst of requests for big traces cannot stack up
//! several models.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use analysis_core::analysis::group_by_stack;
use analysis_core::model::LoadedTrace;
use analysis_core::report::Report;
use analysis_core::timeline::Bucket;
use futures_util::StreamExt;
use serde::Serialize;

use super::ids::TraceId;
use super::store::Store;

/// Memory of a decoded and analysed trace per byte of the trace file: measured at 14.5–16.6 in
/// the viewer (docs/benchmarks.md, "Browser viewer"), rounded up.
pub const MODEL_BYTES_PER_TRACE_BYTE: u64 = 20;

/// Most columns one timeline request may ask for.
pub const MAX_COLUMNS: usize = 8192;

/// A trace decoded, replayed and analysed.
pub struct Summary {
    pub trace: LoadedTrace,
    pub report: Report,
    /// The estimate of its memory this cache counts.
    pub bytes: u64,
}

/// Why a summary could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("no trace {0} on this server")]
    NotFound(String),
    #[error(
        "the trace is {size} bytes: its summary would need about {need} bytes, more than this \
         server keeps for summaries ({budget} bytes, --summary-memory); download it instead"
    )]
    TooBig { size: u64, need: u64, budget: u64 },
    #[error("the stored trace cannot be decoded: {0}")]
    Undecodable(String),
    #[error("cannot read the stored trace: {0}")]
    Storage(String),
}

/// The cache: most recently used last.
pub struct Summaries {
    budget_bytes: u64,
    cached: Mutex<VecDeque<(TraceId, Arc<Summary>)>>,
    /// Held while a trace is loaded: one at a time.
    loading: tokio::sync::Mutex<()>,
}

impl Summaries {
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            budget_bytes,
            cached: Mutex::new(VecDeque::new()),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    fn lookup(&self, id: &TraceId) -> Option<Arc<Summary>> {
        let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let at = c.iter().position(|(k, _)| k == id)?;
        let entry = c.remove(at)?;
        let s = entry.1.clone();
        c.push_back(entry);
        Some(s)
    }

    fn insert(&self, id: TraceId, s: Arc<Summary>) {
        let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        c.retain(|(k, _)| *k != id);
        c.push_back((id, s));
        let mut total: u64 = c.iter().map(|(_, s)| s.bytes).sum();
        while total > self.budget_bytes && c.len() > 1 {
            if let Some((_, old)) = c.pop_front() {
                total -= old.bytes;
            }
        }
    }

    /// The summary of trace `id`, from the cache or made now.
    pub async fn get(&self, store: &Store, id: &TraceId) -> Result<Arc<Summary>, SummaryError> {
        if let Some(s) = self.lookup(id) {
            return Ok(s);
        }
        let _one = self.loading.lock().await;
        // Another request may have made it while this one waited.
        if let Some(s) = self.lookup(id) {
            return Ok(s);
        }
        let (size, mut stream) = match store.get(id).await {
            Ok(Some(found)) => found,
            Ok(None) => return Err(SummaryError::NotFound(id.to_string())),
            Err(e) => return Err(SummaryError::Storage(e.to_string())),
        };
        let need = size.saturating_mul(MODEL_BYTES_PER_TRACE_BYTE);
        if need > self.budget_bytes {
            return Err(SummaryError::TooBig {
                size,
                need,
                budget: self.budget_bytes,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| SummaryError::Storage(e.to_string()))?;
            bytes.extend_from_slice(&chunk);
        }
        let made = tokio::task::spawn_blocking(move || {
            let trace = analysis_core::load(&bytes)
                .map_err(|e| SummaryError::Undecodable(e.to_string()))?;
            let report = analysis_core::analyze(&trace, &Default::default());
            Ok::<_, SummaryError>(Summary {
                trace,
                report,
                bytes: need,
            })
        })
        .await
        .map_err(|e| SummaryError::Storage(format!("the analysis stopped: {e}")))??;
        let s = Arc::new(made);
        self.insert(id.clone(), s.clone());
        Ok(s)
    }
}

/// One live-bytes series of the trace.
#[derive(Debug, Serialize)]
pub struct SeriesInfo {
    pub index: usize,
    pub process: u32,
    pub device: u32,
    /// Pinned host memory rather than device memory.
    pub host: bool,
    pub peak_bytes: u64,
    pub live_bytes: u64,
}

/// `GET …/summary`: the report and what the timeline can show.
#[derive(Debug, Serialize)]
pub struct Overview<'a> {
    pub api_version: u32,
    /// First and last record times (nanoseconds).
    pub t0: u64,
    pub t1: u64,
    pub series: Vec<SeriesInfo>,
    pub report: &'a Report,
}

impl Summary {
    pub fn overview(&self) -> Overview<'_> {
        let m = &self.trace.model;
        Overview {
            api_version: 1,
            t0: m.first_ts_nanos,
            t1: m.last_ts_nanos,
            series: m
                .series
                .iter()
                .enumerate()
                .map(|(index, s)| SeriesInfo {
                    index,
                    process: s.key.process.0,
                    device: s.key.device.0,
                    host: s.key.host,
                    peak_bytes: s.peak_bytes,
                    live_bytes: s.live_bytes,
                })
                .collect(),
            report: &self.report,
        }
    }

    /// `GET …/timeline`: the total and every series over `[t0, t1)` in `columns` buckets.
    pub fn timeline(&self, t0: u64, t1: u64, columns: usize) -> Timeline {
        let m = &self.trace.model;
        Timeline {
            t0,
            t1,
            columns,
            total: m.total.downsample(t0, t1, columns),
            series: m
                .series
                .iter()
                .map(|s| s.timeline.downsample(t0, t1, columns))
                .collect(),
        }
    }

    /// `GET …/live`: device memory live at `t`, by call site, largest first.
    pub fn live_at(&self, t: u64, limit: usize) -> LiveAt {
        let m = &self.trace.model;
        // Allocations are in time order: only those made by `t` can be live at `t`.
        let made = m.allocs.partition_point(|a| a.ts_nanos <= t);
        let live = || {
            m.allocs
                .iter_range(0, made)
                .filter(move |a| a.kind.is_device_memory() && a.live_at(t))
        };
        let (bytes, count) = live().fold((0u64, 0u64), |(b, n), a| {
            (b.saturating_add(a.size_bytes), n + 1)
        });
        LiveAt {
            t,
            bytes,
            count,
            sites: group_by_stack(m, live(), limit)
                .into_iter()
                .map(|s| LiveSite {
                    site: s.site,
                    frames: s.frames,
                    bytes: s.bytes,
                    count: s.count,
                })
                .collect(),
        }
    }
}

/// The buckets of one timeline request.
#[derive(Debug, Serialize)]
pub struct Timeline {
    pub t0: u64,
    pub t1: u64,
    pub columns: usize,
    pub total: Vec<Bucket>,
    /// One list of buckets per series, in the summary's series order.
    pub series: Vec<Vec<Bucket>>,
}

#[derive(Debug, Serialize)]
pub struct LiveSite {
    pub site: String,
    pub frames: Vec<String>,
    pub bytes: u64,
    pub count: u64,
}

/// The live set at one moment.
#[derive(Debug, Serialize)]
pub struct LiveAt {
    pub t: u64,
    pub bytes: u64,
    pub count: u64,
    pub sites: Vec<LiveSite>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    fn summary(s: Scenario) -> Summary {
        let (bytes, _) = generate(s, 5_000, 3);
        let trace = analysis_core::load(&bytes).expect("loads");
        let report = analysis_core::analyze(&trace, &Default::default());
        Summary {
            trace,
            report,
            bytes: 1,
        }
    }

    #[test]
    fn the_live_set_at_the_peak_is_the_reports() {
        let s = summary(Scenario::Spikes);
        let at = s.live_at(s.report.peak_ts_nanos, 10);
        assert_eq!(at.bytes, s.report.peak_bytes);
        let sites: Vec<(String, u64)> =
            at.sites.iter().map(|x| (x.site.clone(), x.bytes)).collect();
        let want: Vec<(String, u64)> = s
            .report
            .peak_sites
            .iter()
            .map(|x| (x.site.clone(), x.bytes))
            .collect();
        assert_eq!(sites, want);
    }

    #[test]
    fn timeline_columns_reach_the_peak() {
        let s = summary(Scenario::TrainingLeak);
        let o = s.overview();
        let tl = s.timeline(o.t0, o.t1 + 1, 300);
        assert_eq!(tl.total.len(), 300);
        assert_eq!(tl.series.len(), o.series.len());
        let top = tl.total.iter().map(|b| b.max).max();
        assert_eq!(top, Some(s.report.peak_bytes));
    }

    #[test]
    fn the_cache_keeps_its_budget_and_the_newest_entry() {
        let c = Summaries::new(10);
        let ids: Vec<TraceId> = (0..3).map(|_| TraceId::random().expect("id")).collect();
        for id in &ids {
            let mut s = summary(Scenario::Clean);
            s.bytes = 6;
            c.insert(id.clone(), Arc::new(s));
        }
        assert!(c.lookup(&ids[0]).is_none(), "the oldest went first");
        assert!(c.lookup(&ids[1]).is_none());
        assert!(
            c.lookup(&ids[2]).is_some(),
            "one entry stays even over budget"
        );
    }
}
