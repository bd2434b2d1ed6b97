//! Loading a trace in the browser: from a dropped or picked file, a URL, or a bundled demo.
//! Bytes go to `analysis_core::Loader::push` as they arrive (a PyTorch snapshot is read whole and
//! converted straight into the model by `torch_snapshot::load`); between pieces the loop yields to
//! the event loop (at most every ~30 ms of work) so the page repaints the progress bar and stays
//! responsive. Nothing leaves the browser.

use std::sync::Arc;

use analysis_core::{LoadedTrace, Loader};
use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use super::dom;
use crate::data::Analysis;

/// Bytes handed to the decoder between checks of the time budget.
const PIECE_BYTES: usize = 64 * 1024;
/// Bytes read from a file at a time.
const READ_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// Bytes read from a snapshot file at a time: the whole file is needed before converting, and
/// browsers hand large slices over faster (66 MiB: 130 ms at once, 220 ms in 8 MiB slices).
const SNAPSHOT_READ_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// Work between yields to the event loop.
const BUDGET_MS: f64 = 30.0;

/// Where the loading stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum LoadState {
    #[default]
    Idle,
    Loading(Progress),
    /// Decoded; `Analysis::trace.fatal` says whether decoding stopped early.
    Done {
        elapsed_ms: f64,
    },
    /// Nothing could be shown (not even a header): the message says why.
    Failed(String),
}

/// Loading progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub source: String,
    pub bytes_read: u64,
    pub total_bytes: Option<u64>,
    pub records: u64,
    /// "reading", "analysing".
    pub phase: &'static str,
}

/// Where bytes come from.
pub enum Source {
    Blob { blob: web_sys::Blob, offset: f64 },
    Stream(web_sys::ReadableStreamDefaultReader),
    Bytes(Option<Vec<u8>>),
}

impl Source {
    /// The next chunk, or None at the end.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, String> {
        if let Self::Bytes(b) = self {
            return Ok(b.take());
        }
        let mut out = Vec::new();
        Ok(self.append_next(&mut out, READ_BYTES).await?.then_some(out))
    }

    /// Appends the next chunk to `out` (one copy, straight from the browser's buffer); false at
    /// the end.
    async fn append_next(&mut self, out: &mut Vec<u8>, read_bytes: f64) -> Result<bool, String> {
        let chunk = match self {
            Self::Blob { blob, offset } => {
                let size = blob.size();
                if *offset >= size {
                    return Ok(false);
                }
                let end = (*offset + read_bytes).min(size);
                let part = blob
                    .slice_with_f64_and_f64(*offset, end)
                    .map_err(|e| format!("cannot read the file: {e:?}"))?;
                let buf = JsFuture::from(part.array_buffer())
                    .await
                    .map_err(|e| format!("cannot read the file: {e:?}"))?;
                *offset = end;
                js_sys::Uint8Array::new(&buf)
            }
            Self::Stream(reader) => {
                let res = JsFuture::from(reader.read())
                    .await
                    .map_err(|e| format!("the download failed: {e:?}"))?;
                let done = js_sys::Reflect::get(&res, &"done".into())
                    .ok()
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true);
                if done {
                    return Ok(false);
                }
                let value = js_sys::Reflect::get(&res, &"value".into())
                    .map_err(|e| format!("the download failed: {e:?}"))?;
                js_sys::Uint8Array::new(&value)
            }
            Self::Bytes(b) => {
                return Ok(b.take().map(|b| out.extend_from_slice(&b)).is_some());
            }
        };
        let start = out.len();
        out.resize(start + chunk.length() as usize, 0);
        chunk.copy_to(&mut out[start..]);
        Ok(true)
    }
}

/// Opens a URL as a byte stream; returns it with its length when the server says it.
pub async fn open_url(url: &str) -> Result<(Source, Option<u64>), String> {
    let resp = JsFuture::from(window().fetch_with_str(url))
        .await
        .map_err(|e| format!("cannot download the trace ({e:?}): {url}"))?;
    let resp: web_sys::Response = resp.unchecked_into();
    if !resp.ok() {
        return Err(format!(
            "the server answered {} {}: {url}",
            resp.status(),
            resp.status_text()
        ));
    }
    let total = resp
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok());
    let body = resp
        .body()
        .ok_or_else(|| format!("the response has no body: {url}"))?;
    let reader: web_sys::ReadableStreamDefaultReader = body.get_reader().unchecked_into();
    Ok((Source::Stream(reader), total))
}

/// Every `BUDGET_MS` of work: publishes the progress and lets the browser run. False once a newer
/// load has started.
async fn pace(
    last_yield: &mut f64,
    loader: &Loader,
    progress: &mut Progress,
    state: RwSignal<LoadState>,
    current: &impl Fn() -> bool,
) -> bool {
    if dom::now_ms() - *last_yield <= BUDGET_MS {
        return true;
    }
    progress.records = loader.records_decoded();
    state.set(LoadState::Loading(progress.clone()));
    dom::yield_now().await;
    *last_yield = dom::now_ms();
    current()
}

/// Decodes everything `src` yields, reporting progress, and analyses the result. `current`
/// returns false once a newer load has started (this one then stops quietly).
pub async fn decode(
    mut src: Source,
    source: String,
    total_bytes: Option<u64>,
    state: RwSignal<LoadState>,
    current: impl Fn() -> bool,
) -> Result<Option<Arc<Analysis>>, String> {
    let started = dom::now_ms();
    let mut loader = total_bytes.map_or_else(Loader::new, Loader::with_size_hint);
    // A PyTorch memory snapshot (pickle or JSON) is collected whole, then converted into the
    // model.
    let mut snapshot: Option<Vec<u8>> = None;
    let mut progress = Progress {
        source: source.clone(),
        total_bytes,
        phase: "reading",
        ..Progress::default()
    };
    state.set(LoadState::Loading(progress.clone()));
    let mut last_yield = dom::now_ms();
    'read: while let Some(chunk) = src.next().await? {
        if progress.bytes_read == 0 && analysis_core::torch_snapshot::looks_like_snapshot(&chunk) {
            // Read the rest straight into one buffer of the file's size.
            let mut all = Vec::with_capacity(
                total_bytes.map_or(chunk.len(), |t| usize::try_from(t).unwrap_or(usize::MAX)),
            );
            all.extend_from_slice(&chunk);
            progress.phase = "reading snapshot";
            loop {
                progress.bytes_read = all.len() as u64;
                state.set(LoadState::Loading(progress.clone()));
                dom::yield_now().await;
                if !current() {
                    return Ok(None);
                }
                if !src.append_next(&mut all, SNAPSHOT_READ_BYTES).await? {
                    break;
                }
            }
            snapshot = Some(all);
            break 'read;
        }
        for piece in chunk.chunks(PIECE_BYTES) {
            let stopped = loader.push(piece).is_err();
            progress.bytes_read += piece.len() as u64;
            if stopped {
                break 'read;
            }
            if !pace(&mut last_yield, &loader, &mut progress, state, &current).await {
                return Ok(None);
            }
        }
    }
    dom::mark("gpucollect:read");
    if let Some(all) = snapshot {
        progress.phase = "converting snapshot";
        state.set(LoadState::Loading(progress.clone()));
        dom::yield_now().await;
        // Converted straight into the model (no trace bytes in between).
        let (trace, _) =
            analysis_core::torch_snapshot::load(&all).map_err(|e| format!("{e}: {source}"))?;
        drop(all);
        dom::mark("gpucollect:decoded");
        progress.records = trace.model.records;
        return Ok(analyse(trace, source, progress, started, state, &current).await);
    }
    progress.records = loader.records_decoded();
    let trace = loader.finish().map_err(|e| e.to_string())?;
    dom::mark("gpucollect:decoded");
    Ok(analyse(trace, source, progress, started, state, &current).await)
}

/// Analyses a loaded trace (after a repaint that says so).
async fn analyse(
    trace: LoadedTrace,
    source: String,
    mut progress: Progress,
    started: f64,
    state: RwSignal<LoadState>,
    current: &impl Fn() -> bool,
) -> Option<Arc<Analysis>> {
    progress.phase = "analysing";
    state.set(LoadState::Loading(progress));
    dom::yield_now().await;
    if !current() {
        return None;
    }
    // The detectors run later (`Analysis::detect`), once the first view is drawn.
    let analysis = Analysis::without_report(trace, source);
    dom::mark("gpucollect:tables");
    state.set(LoadState::Done {
        elapsed_ms: dom::now_ms() - started,
    });
    Some(Arc::new(analysis))
}
