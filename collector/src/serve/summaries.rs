//! Summaries of a stored trace for a page that should not download it whole: the report, the
//! timeline at a window's resolution, the live allocations by call site at a moment, and the
//! call-site table (API.md, "Summaries"). The server decodes and analyses the trace once and
//! keeps the result in a cache bounded by an estimate of its memory, least recently used first
//! out; one trace is loaded at a time, so a burst of requests for big traces cannot stack up
//! several models.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use analysis_core::analysis::{GROUP_FIELDS, group_by_stack};
use analysis_core::model::Fields;
use analysis_core::model::LoadedTrace;
use analysis_core::report::Report;
use analysis_core::summary_api::{API_VERSION, LiveAt, LiveSite, SeriesInfo, Window};
use futures_util::StreamExt;
use serde::Serialize;

use super::ids::TraceId;
use super::store::Store;

/// Memory a summary takes while it is made, per byte of the trace file: the model and the
/// analysis' tables at their high-water mark (the trace is decoded as it streams from the
/// store, never held whole). Measured from 1.7 to 3.0 (docs/benchmarks.md, "Summaries"): 1.7
/// for a 300 M-event training trace, 3.0 for a trace with framework capture, rounded up with
/// a margin. A
/// trace that needs more than this estimate says is stopped while it is decoded, once its
/// model passes what the budget has room for (`SummaryError::ModelOverBudget`). A kept
/// summary takes less: what its model holds, counted once made.
pub const PEAK_BYTES_PER_TRACE_BYTE: u64 = 4;

/// Memory a summary whose history lies on disk (`spill`) takes while it is made, per byte of
/// the trace, besides the chunks it keeps in memory and the readers' caches: the timelines'
/// pyramids, the tables by call site and range, the analysis' own. Measured 0.18 in all on the
/// 300 M-event training trace (docs/benchmarks.md, "Summaries"), rounded up with a margin. A
/// trace too big for [`PEAK_BYTES_PER_TRACE_BYTE`] in the budget is summarised this way when
/// this fits.
pub const SPILLED_PEAK_BYTES_PER_TRACE_BYTE: u64 = 1;

/// Most columns one timeline request may ask for.
pub const MAX_COLUMNS: usize = 8192;

/// A trace decoded, replayed and analysed.
pub struct Summary {
    pub trace: LoadedTrace,
    pub report: Report,
    /// The memory this cache counts for it: its model's heap and its report.
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
    #[error(
        "the trace's model passed {budget} bytes, what this server has room for in its summaries \
         (--summary-memory), after {at} of the trace's {size} bytes: the trace holds more per \
         byte than traces do, so it was stopped there; download it instead"
    )]
    ModelOverBudget { at: u64, size: u64, budget: u64 },
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
        // The newest stays even over the budget.
        Self::evict(&mut c, self.budget_bytes, 1);
    }

    /// Drops the least recently used summaries until those left take at most `keep` bytes or
    /// only `min_left` are left.
    fn evict(c: &mut VecDeque<(TraceId, Arc<Summary>)>, keep: u64, min_left: usize) {
        let mut total: u64 = c.iter().map(|(_, s)| s.bytes).sum();
        while total > keep && c.len() > min_left {
            if let Some((_, old)) = c.pop_front() {
                total -= old.bytes;
            }
        }
    }

    /// Makes room for a summary being made that will need `need` bytes at its peak: the
    /// least recently used go first, all of them if need be.
    /// Returns what the budget leaves once they are gone: what the new summary's model may
    /// take at most.
    fn make_room(&self, need: u64) -> u64 {
        let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        Self::evict(&mut c, self.budget_bytes.saturating_sub(need), 0);
        let kept: u64 = c.iter().map(|(_, s)| s.bytes).sum();
        self.budget_bytes.saturating_sub(kept)
    }

    /// What making the summary of a trace of `size` bytes needs at its peak, and how much of
    /// its history it keeps in memory before the rest goes to disk (`None`: what the budget
    /// has room for). A trace that fits the budget at [`PEAK_BYTES_PER_TRACE_BYTE`] is kept in
    /// memory, as its summary is served fastest from there; a larger one keeps an eighth of the
    /// budget (at most the spill's default) and the rest on disk, when that fits at
    /// [`SPILLED_PEAK_BYTES_PER_TRACE_BYTE`] with two threads' read caches and the writer's
    /// queue; `gpucollect view`
    /// (no budget) keeps the spill's default, whatever the file's size.
    fn plan(&self, size: u64) -> Result<(u64, Option<u64>), SummaryError> {
        let in_memory = size.saturating_mul(PEAK_BYTES_PER_TRACE_BYTE);
        if self.budget_bytes == u64::MAX {
            return Ok((in_memory, Some(crate::spill::RESIDENT_BYTES)));
        }
        if in_memory <= self.budget_bytes {
            return Ok((in_memory, None));
        }
        let resident = (self.budget_bytes / 8).min(crate::spill::RESIDENT_BYTES);
        let need = size
            .saturating_mul(SPILLED_PEAK_BYTES_PER_TRACE_BYTE)
            .saturating_add(resident)
            .saturating_add(2 * crate::spill::CACHE_BYTES_PER_THREAD)
            .saturating_add(crate::spill::QUEUE_BYTES);
        if need > self.budget_bytes {
            return Err(SummaryError::TooBig {
                size,
                need,
                budget: self.budget_bytes,
            });
        }
        Ok((need, Some(resident)))
    }

    /// The `summary` answer for trace `id` as JSON: from the summary in memory, else from the
    /// one kept in the store by a build that analyses the same way (no decoding: a restarted
    /// server answers at once), else from a summary made now (and kept).
    pub async fn overview_json(
        &self,
        store: &Store,
        id: &TraceId,
    ) -> Result<Vec<u8>, SummaryError> {
        if let Some(s) = self.lookup(id) {
            return Ok(s.overview_json());
        }
        match store.exists(id).await {
            Ok(true) => {}
            Ok(false) => return Err(SummaryError::NotFound(id.to_string())),
            Err(e) => return Err(SummaryError::Storage(e.to_string())),
        }
        match store.get_summary(id).await {
            Ok(Some(kept)) => match kept_overview(&kept) {
                Some(o) => return Ok(o),
                None => tracing::info!(%id, "the kept summary is another build's: made again"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(%id, error = %e, "cannot read the kept summary: made again"),
        }
        Ok(self.get(store, id).await?.overview_json())
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
        let (need, resident) = self.plan(size)?;
        let room = self.make_room(need);
        let resident = resident.unwrap_or(room);
        // The trace is decoded as it streams from the store, on a blocking thread: the server
        // never holds its bytes whole.
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(STREAM_CHUNKS_AHEAD);
        let making = tokio::task::spawn_blocking(move || {
            let trace = decode_stream(rx, size, room, resident)?;
            // What lies in memory: a long history's chunks past the spill's budget are on disk.
            // Counted before the analysis, whose own tables go to the same spill and are gone
            // once it ends: counted after, the spill's bytes passed the model's, and a summary
            // of a long trace counted as nothing.
            let model_bytes = trace.model.resident_heap_estimate();
            let report = crate::threads::analyze(&trace, &Default::default());
            let report_bytes = serde_json::to_vec(&report).map_or(0, |v| v.len() as u64);
            let bytes = model_bytes.saturating_add(report_bytes);
            Ok::<_, SummaryError>(Summary {
                trace,
                report,
                bytes,
            })
        });
        let mut read_error = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => {
                    if tx.send(c).await.is_err() {
                        // The decoder stopped (the trace is damaged there): the rest is moot.
                        break;
                    }
                }
                Err(e) => {
                    read_error = Some(SummaryError::Storage(e.to_string()));
                    break;
                }
            }
        }
        drop(tx);
        let made = making
            .await
            .map_err(|e| SummaryError::Storage(format!("the analysis stopped: {e}")))?;
        if let Some(e) = read_error {
            return Err(e);
        }
        let s = Arc::new(made?);
        tracing::info!(%id, trace_bytes = size, summary_bytes = s.bytes, "summarised a trace");
        if let Err(e) = store.put_summary(id, kept_bytes(&s.overview_json())).await {
            tracing::warn!(%id, error = %e, "cannot keep the summary in the store");
        }
        self.insert(id.clone(), s.clone());
        Ok(s)
    }
}

/// Decodes a stored trace, or a PyTorch snapshot (`gpucollect view` serves those too), as its
/// chunks arrive; stops taking chunks (and drops `rx`) where the decoder stops. A trace is
/// decoded on a thread of its own and replayed on this one (`decode_ahead`); its model is
/// stopped once it takes more than `room` bytes.
fn decode_stream(
    mut rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    size: u64,
    room: u64,
    resident: u64,
) -> Result<LoadedTrace, SummaryError> {
    use analysis_core::torch_snapshot::{SnapshotLoader, looks_like_snapshot};
    let undecodable = |e: &dyn std::fmt::Display| SummaryError::Undecodable(e.to_string());
    let Some(first) = rx.blocking_recv() else {
        return analysis_core::load(&[]).map_err(|e| undecodable(&e));
    };
    if looks_like_snapshot(&first) {
        let mut snapshot = SnapshotLoader::new(usize::try_from(size).ok());
        snapshot.push(&first).map_err(|e| undecodable(&e))?;
        while let Some(chunk) = rx.blocking_recv() {
            snapshot.push(&chunk).map_err(|e| undecodable(&e))?;
        }
        return snapshot
            .finish()
            .map(|(trace, _)| trace)
            .map_err(|e| undecodable(&e));
    }
    // The history past `resident` bytes goes to disk (`spill`).
    let spill = crate::spill::FileSpill::new(resident, crate::spill::spill_dir());
    let replay = analysis_core::split_load::LoadReplay::with_spill(std::sync::Arc::new(spill));
    let mut over = None;
    let source = Received {
        rx,
        current: bytes::Bytes::new(),
    };
    // A stopping error is kept and reported with everything before it (as `load` does).
    let loaded = crate::decode_ahead::load(first.into(), source, replay, |r| {
        if r.model_heap_bytes() > room {
            over = Some(SummaryError::ModelOverBudget {
                at: r.bytes_replayed(),
                size,
                budget: room,
            });
        }
        over.is_none()
    })
    .map_err(|e| SummaryError::Storage(format!("{e:#}")))?;
    match over {
        Some(e) => Err(e),
        None => loaded.map_err(|e| undecodable(&e)),
    }
}

/// The store's chunks as the decoding thread takes them.
struct Received {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl crate::decode_ahead::Source for Received {
    fn next_chunk(&mut self) -> std::io::Result<Option<&[u8]>> {
        Ok(self.rx.blocking_recv().map(|c| {
            self.current = c;
            &self.current[..]
        }))
    }
}

/// Chunks of the stored trace read ahead of the decoder.
const STREAM_CHUNKS_AHEAD: usize = 8;

/// What a kept summary was made by: this build's version and the fingerprint of the
/// analysis' sources (`build.rs`). A summary kept by a build with another key is made again,
/// so a store shared across upgrades never serves an older analysis.
pub const ANALYSIS_KEY: &str = concat!(
    "gpucollect ",
    env!("CARGO_PKG_VERSION"),
    " analysis ",
    env!("GPUCOLLECT_ANALYSIS_FINGERPRINT")
);

/// A summary as the store keeps it: a line with the [`ANALYSIS_KEY`] that made it, then the
/// summary answer's JSON as it was served.
fn kept_bytes(overview_json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ANALYSIS_KEY.len() + 1 + overview_json.len());
    out.extend_from_slice(ANALYSIS_KEY.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(overview_json);
    out
}

/// The summary answer of a kept summary made with this build's [`ANALYSIS_KEY`]; `None` for
/// another build's, or bytes that are not one.
fn kept_overview(bytes: &[u8]) -> Option<Vec<u8>> {
    let (key, json) = bytes.split_at(bytes.iter().position(|&b| b == b'\n')?);
    let json = &json[1..];
    let whole = serde_json::from_slice::<serde::de::IgnoredAny>(json).is_ok();
    (key == ANALYSIS_KEY.as_bytes() && json.first() == Some(&b'{') && whole).then(|| json.to_vec())
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
    /// [`Self::overview`] as JSON.
    pub fn overview_json(&self) -> Vec<u8> {
        // Serialising plain data into a vector cannot fail.
        serde_json::to_vec(&self.overview()).unwrap_or_default()
    }

    pub fn overview(&self) -> Overview<'_> {
        let m = &self.trace.model;
        Overview {
            api_version: API_VERSION,
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
    pub fn timeline(&self, t0: u64, t1: u64, columns: usize) -> Window {
        let m = &self.trace.model;
        Window {
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
        // Only the allocations made by `t` can be live at `t` (`made_by`: in time order or not).
        let made = m.allocs.made_by(t);
        let live = || {
            m.allocs
                .live_at_fields(t, made, GROUP_FIELDS | Fields::KIND)
                .filter(|a| a.kind.is_device_memory())
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

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    fn summary(s: Scenario) -> Summary {
        let (bytes, _) = generate(s, 5_000, 3);
        let trace = analysis_core::load(&bytes).expect("loads");
        let report = crate::threads::analyze(&trace, &Default::default());
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
