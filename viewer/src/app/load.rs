//! Loading a trace in the browser: from a dropped or picked file, a URL, or a bundled demo.
//! Bytes go to `analysis_core::Loader::push` as they arrive (a PyTorch snapshot to
//! `torch_snapshot::SnapshotLoader::push`, which parses it as it comes and converts it straight
//! into the model at the end). A file is streamed by a worker while the page decodes it (where
//! no worker runs, its next slice is already being read while the current one is decoded).
//! Between pieces the loop yields to the event loop (at most every ~30 ms of work)
//! so the page repaints the progress bar and stays responsive. Nothing leaves the browser.

use std::sync::Arc;

use analysis_core::torch_snapshot::{self, SnapshotLoader};
use analysis_core::{LoadedTrace, Loader};
use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use super::{dom, read_worker};
use crate::data::TraceData;

/// Bytes handed to the decoder between checks of the time budget.
const PIECE_BYTES: usize = 64 * 1024;
/// Bytes of a snapshot handed to its parser between checks of the time budget.
const SNAPSHOT_PIECE_BYTES: usize = 1024 * 1024;
/// Bytes read from a file at a time on the page's thread: the first read is small, so decoding
/// starts early, and each next one doubles up to the largest (browsers hand large slices over
/// with less overhead).
const FIRST_READ_BYTES: f64 = 1024.0 * 1024.0;
const MAX_READ_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// Work between yields to the event loop.
const BUDGET_MS: f64 = 30.0;
/// A snapshot with this many trace entries takes 20 ms or more to convert (about 90 ns each at
/// native speed, which the conversion runs at in the browser): the page says so first.
const SHOW_CONVERSION_ENTRIES: u64 = 200_000;
/// A trace with this many records takes about 10 ms or more to analyse for the first view
/// (4-5 ms at 1M snapshot entries): the page says so first. A shorter analysis is over before
/// the words could be read, and the repaint would take the frame that `dom::frame_soon` asked
/// for before the first view is ready.
const SHOW_ANALYSIS_RECORDS: u64 = 2_000_000;
/// Waiting this long for the next piece of input means the browser ran its event loop (it
/// paints and handles input then): the time budget starts again.
const WAITED_MS: f64 = 1.0;

/// The progress panel appears once a load has run this long: a shorter load is over before a
/// progress bar could be read, and rendering one (a frame's style, layout and paint, then its
/// removal) cost the start of every load 2-3 ms, while the worker's first bytes were on their
/// way. Where the panel replaces what is on screen (an open trace, an error), the caller shows
/// it at once (`App`'s `start`), and it is kept up to date from the start.
const SHOW_PROGRESS_AFTER_MS: f64 = 100.0;

/// Where the loading stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum LoadState {
    #[default]
    Idle,
    Loading(Progress),
    /// Decoded; `TraceData::trace.fatal` says whether decoding stopped early.
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

impl Progress {
    /// A load of `source` that has read nothing yet.
    pub fn starting(source: String, total_bytes: Option<u64>) -> Self {
        Self {
            source,
            total_bytes,
            phase: "reading",
            ..Self::default()
        }
    }
}

/// Where bytes come from.
pub enum Source {
    /// A file: streamed by a worker while the page decodes, or read in slices on the page's
    /// thread, the next one already requested while the current one is decoded.
    Blob(BlobReader),
    Stream(web_sys::ReadableStreamDefaultReader),
    Bytes(Option<Vec<u8>>),
}

/// Reads a file (a `Blob`): streamed by the worker where one runs (`read_worker`), else (or from
/// where the worker failed) in slices on this thread, `AHEAD` slices ahead.
pub struct BlobReader {
    blob: web_sys::Blob,
    /// The worker's stream, while it reads the file.
    stream: Option<read_worker::Stream>,
    /// Buffers of the worker's last batch not handed out yet, and whether the worker wants
    /// them back.
    batch: std::collections::VecDeque<js_sys::Uint8Array>,
    reuse: bool,
    /// The piece handed out last, when the worker wants its buffer back: the caller is done
    /// with it once it asks for the next one.
    lent: Option<js_sys::Uint8Array>,
    /// Where the next slice to request starts (the bytes the worker delivered, while it reads),
    /// and its size.
    offset: f64,
    read_bytes: f64,
    /// Slices requested on this thread and not yet taken, in file order.
    ahead: std::collections::VecDeque<Slice>,
}

/// Slices being read at once on this thread.
const AHEAD: usize = 2;

/// A slice being read on this thread.
struct Slice {
    bytes: JsFuture,
    start: f64,
    end: f64,
}

impl BlobReader {
    /// Starts reading the file right away (while the page redraws for the new load).
    pub fn new(blob: web_sys::Blob) -> Self {
        let stream = read_worker::stream(&blob);
        let mut r = Self {
            blob,
            stream,
            batch: std::collections::VecDeque::new(),
            reuse: false,
            lent: None,
            offset: 0.0,
            read_bytes: FIRST_READ_BYTES,
            ahead: std::collections::VecDeque::new(),
        };
        if r.stream.is_none() {
            r.fill();
        }
        r
    }

    pub fn blob(&self) -> &web_sys::Blob {
        &self.blob
    }

    /// Requests slices until `AHEAD` are being read (a failed request is retried, and
    /// reported, by `next`).
    fn fill(&mut self) {
        while self.ahead.len() < AHEAD {
            match self.request() {
                Ok(Some(s)) => self.ahead.push_back(s),
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Hands out `piece` of the worker's batch, remembered to be given back if the worker
    /// wants its buffer.
    fn lend(&mut self, piece: js_sys::Uint8Array) -> js_sys::Uint8Array {
        if self.reuse {
            self.lent = Some(piece.clone());
        }
        piece
    }

    /// Asks for the next slice (none at the end of the file).
    fn request(&mut self) -> Result<Option<Slice>, String> {
        let size = self.blob.size();
        if self.offset >= size {
            return Ok(None);
        }
        let (start, end) = (self.offset, (self.offset + self.read_bytes).min(size));
        self.offset = end;
        self.read_bytes = (self.read_bytes * 2.0).min(MAX_READ_BYTES);
        let part = self
            .blob
            .slice_with_f64_and_f64(start, end)
            .map_err(|e| format!("cannot read the file: {}", dom::js_error(&e)))?;
        Ok(Some(Slice {
            bytes: JsFuture::from(part.array_buffer()),
            start,
            end,
        }))
    }

    /// The next piece of the file, in order. The previous piece must not be used after this
    /// is called (its buffer may go back to the worker).
    async fn next(&mut self) -> Result<Option<js_sys::Uint8Array>, String> {
        if let (Some(piece), Some(stream)) = (self.lent.take(), &self.stream) {
            stream.give_back(&piece);
        }
        if let Some(piece) = self.batch.pop_front() {
            return Ok(Some(self.lend(piece)));
        }
        if let Some(stream) = &self.stream {
            match stream.next().await {
                Ok(Some(batch)) => {
                    // Which thread read it (the browser tests check the worker is used).
                    dom::mark("gpucollect:slice-read-by-worker");
                    for piece in batch.pieces {
                        self.offset += f64::from(piece.length());
                        self.batch.push_back(piece);
                    }
                    self.reuse = batch.reuse;
                    return Ok(self.batch.pop_front().map(|p| self.lend(p)));
                }
                Ok(None) => {
                    self.stream = None;
                    return Ok(None);
                }
                // The worker could not read it: read the rest here.
                Err(_) => {
                    read_worker::give_up();
                    self.stream = None;
                    self.fill();
                }
            }
        }
        if self.ahead.is_empty()
            && let Some(s) = self.request()?
        {
            self.ahead.push_back(s);
        }
        let Some(current) = self.ahead.pop_front() else {
            return Ok(None);
        };
        let buf = current.bytes.await.map_err(|e| {
            format!(
                "cannot read the file (bytes {} to {}): {}",
                current.start,
                current.end,
                dom::js_error(&e)
            )
        })?;
        dom::mark("gpucollect:slice-read-by-page");
        self.fill();
        Ok(Some(js_sys::Uint8Array::new(&buf)))
    }
}

/// A chunk of input: in the browser's memory (a file's slice, a download's piece) or in ours.
enum Chunk {
    Js(js_sys::Uint8Array),
    Ours(Vec<u8>),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Self::Js(a) => a.length() as usize,
            Self::Ours(v) => v.len(),
        }
    }

    /// Its first bytes (to tell a snapshot from a trace).
    fn head(&self, n: usize) -> Vec<u8> {
        match self {
            Self::Js(a) => a.subarray(0, n.min(a.length() as usize) as u32).to_vec(),
            Self::Ours(v) => v[..n.min(v.len())].to_vec(),
        }
    }

    /// Copies `[start, end)` into `to` (one copy, straight from the browser's buffer).
    fn copy_range(&self, start: usize, end: usize, to: &mut [u8]) {
        match self {
            Self::Js(a) => a.subarray(start as u32, end as u32).copy_to(to),
            Self::Ours(v) => to.copy_from_slice(&v[start..end]),
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Js(a) => a.to_vec(),
            Self::Ours(v) => v,
        }
    }
}

impl Source {
    /// The next chunk, or None at the end.
    async fn next(&mut self) -> Result<Option<Chunk>, String> {
        let chunk = match self {
            Self::Bytes(b) => return Ok(b.take().map(Chunk::Ours)),
            Self::Blob(reader) => match reader.next().await? {
                Some(chunk) => chunk,
                None => return Ok(None),
            },
            Self::Stream(reader) => {
                let res = JsFuture::from(reader.read())
                    .await
                    .map_err(|e| format!("the download broke off: {}", dom::js_error(&e)))?;
                let done = js_sys::Reflect::get(&res, &"done".into())
                    .ok()
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true);
                if done {
                    return Ok(None);
                }
                let value = js_sys::Reflect::get(&res, &"value".into())
                    .map_err(|e| format!("the download broke off: {}", dom::js_error(&e)))?;
                js_sys::Uint8Array::new(&value)
            }
        };
        Ok(Some(Chunk::Js(chunk)))
    }
}

/// Opens a URL as a byte stream; returns it with its length when the server says it.
pub async fn open_url(url: &str) -> Result<(Source, Option<u64>), String> {
    let resp = JsFuture::from(window().fetch_with_str(url))
        .await
        .map_err(|e| download_refused(url, &dom::js_error(&e)))?;
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

/// The size of the file at `url` as the server gives it to a `HEAD` request (`gpucollect serve`
/// does), without downloading it; `None` where it does not say or does not answer (the
/// download that follows then says what went wrong).
pub async fn size_of_url(url: &str) -> Option<u64> {
    let init = web_sys::RequestInit::new();
    init.set_method("HEAD");
    let resp = JsFuture::from(window().fetch_with_str_and_init(url, &init))
        .await
        .ok()?;
    let resp: web_sys::Response = resp.unchecked_into();
    if !resp.ok() {
        return None;
    }
    resp.headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok())
}

/// Why a download of `url` got no answer at all, in words. The browser gives one reason for
/// every such failure ("Failed to fetch"): for another site's URL the likely ones are this
/// page's Content-Security-Policy (`gpucollect serve` lets it download from its own origin and
/// each `--allow-trace-origin`) and that site's CORS headers; for this site's own, the network.
fn download_refused(url: &str, reason: &str) -> String {
    let page = dom::page_origin();
    match dom::origin_of(url) {
        Some(origin) if origin != page && origin != "null" => format!(
            "the browser did not download the trace ({reason}). It is on another site, {origin}, \
             and a page may read it only when both allow it: the server of this page must let \
             the page connect there (gpucollect serve --allow-trace-origin {origin}), and \
             {origin} must allow reads from {page} (CORS: Access-Control-Allow-Origin). \
             Otherwise download the file and drop it here: {url}"
        ),
        _ => format!(
            "the browser could not download the trace ({reason}): the server did not answer or \
             the connection broke; check that it runs and reload: {url}"
        ),
    }
}

/// Paces a load: publishes its progress every `BUDGET_MS` from `SHOW_PROGRESS_AFTER_MS` after
/// its start (from the start where the progress is shown already), and lets the browser run
/// every `BUDGET_MS` of work.
struct Pacer {
    last_yield: f64,
    /// When the progress was last published, or when it may first be.
    next_show: f64,
}

impl Pacer {
    fn new(state: RwSignal<LoadState>) -> Self {
        let now = dom::now_ms();
        let shown = state.with_untracked(|s| matches!(s, LoadState::Loading(_)));
        Self {
            last_yield: now,
            next_show: if shown {
                now
            } else {
                now + SHOW_PROGRESS_AFTER_MS
            },
        }
    }

    /// After waiting `waited_ms` for input: the browser ran meanwhile, so the work budget
    /// starts again.
    fn waited(&mut self, waited_ms: f64) {
        if waited_ms >= WAITED_MS {
            self.last_yield = dom::now_ms();
        }
    }

    /// Publishes the progress and yields when due. False once a newer load has started.
    async fn pace(
        &mut self,
        records: impl Fn() -> u64,
        progress: &mut Progress,
        state: RwSignal<LoadState>,
        current: &dyn Fn() -> bool,
    ) -> bool {
        let now = dom::now_ms();
        if now >= self.next_show {
            progress.records = records();
            state.set(LoadState::Loading(progress.clone()));
            self.next_show = now + BUDGET_MS;
        }
        if now - self.last_yield <= BUDGET_MS {
            return true;
        }
        dom::yield_now().await;
        self.last_yield = dom::now_ms();
        current()
    }
}

/// The trace format's bytes of `blob` (what the server's uploads take): the blob itself when it
/// is a trace, else a PyTorch snapshot converted, as `gpucollect import` does.
pub async fn as_trace(blob: web_sys::Blob) -> Result<web_sys::Blob, String> {
    let read = |b: web_sys::Blob| async move {
        JsFuture::from(b.array_buffer())
            .await
            .map(|buf| js_sys::Uint8Array::new(&buf).to_vec())
            .map_err(|e| format!("cannot read the file: {}", dom::js_error(&e)))
    };
    let head = blob
        .slice_with_f64_and_f64(0.0, 4096.0)
        .map_err(|e| format!("cannot read the file: {}", dom::js_error(&e)))?;
    if !torch_snapshot::looks_like_snapshot(&read(head).await?) {
        return Ok(blob);
    }
    let (trace, _) = torch_snapshot::convert(&read(blob).await?)
        .map_err(|e| format!("the snapshot could not be converted to a trace: {e}"))?;
    dom::blob_of(&trace)
        .ok_or_else(|| String::from("the browser could not hold the converted trace"))
}

/// Bytes of a file's start that [`other_format`] looks at.
const OTHER_FORMAT_HEAD: usize = 8;

/// What a file is, from its first bytes, when it is a format people open by mistake instead of
/// a trace or a snapshot (a compressed trace, an image, an archive), with what to do about it.
/// `None` for anything else: the decoder then says what it found.
fn other_format(head: &[u8]) -> Option<String> {
    const OPEN: &str =
        "open a gpucollect trace (.msgpack) or a PyTorch memory snapshot (.pickle or .json)";
    let decompress = |what: &str, how: &str| {
        format!("{what}, not a trace: decompress it first ({how}) and open the result")
    };
    Some(if head.starts_with(&[0x1f, 0x8b]) {
        decompress("a gzip file", "gunzip FILE, or zcat FILE > trace.msgpack")
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        decompress("a zstd file", "zstd -d FILE")
    } else if head.starts_with(b"PK\x03\x04") {
        "a zip archive, not a trace: extract the trace from it and open that".to_string()
    } else if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        format!("a PNG image, not a trace: {OPEN}")
    } else if head.starts_with(b"\xff\xd8\xff") {
        format!("a JPEG image, not a trace: {OPEN}")
    } else if head.starts_with(b"%PDF-") {
        format!("a PDF document, not a trace: {OPEN}")
    } else {
        return None;
    })
}

/// Decodes everything `src` yields, reporting progress, and analyses the result: the
/// analysis, `None` if a newer load started (`current` returns false once one has: this one
/// then stops quietly), or what went wrong.
pub async fn decode(
    mut src: Source,
    source: String,
    total_bytes: Option<u64>,
    state: RwSignal<LoadState>,
    current: &dyn Fn() -> bool,
) -> Result<Option<Arc<TraceData>>, String> {
    let started = dom::now_ms();
    let mut loader = Loader::new();
    // A PyTorch memory snapshot (pickle or JSON) is parsed as it is read, then converted into
    // the model.
    let mut snapshot: Option<SnapshotLoader> = None;
    let mut progress = Progress::starting(source.clone(), total_bytes);
    // No progress yet: the caller shows it where it replaces something on screen, else the
    // pacer does once the load takes long enough.
    let mut pacer = Pacer::new(state);
    'read: loop {
        let asked = dom::now_ms();
        let Some(chunk) = src.next().await? else {
            break;
        };
        pacer.waited(dom::now_ms() - asked);
        if progress.bytes_read == 0
            && let Some(what) = other_format(&chunk.head(OTHER_FORMAT_HEAD))
        {
            return Err(format!("{source} is {what}"));
        }
        if progress.bytes_read == 0 && torch_snapshot::looks_like_snapshot(&chunk.head(4096)) {
            progress.phase = "reading snapshot";
            snapshot = Some(SnapshotLoader::new(
                total_bytes.and_then(|t| usize::try_from(t).ok()),
            ));
        }
        if let Some(s) = snapshot.as_mut() {
            let len = chunk.len();
            for start in (0..len).step_by(SNAPSHOT_PIECE_BYTES) {
                let end = (start + SNAPSHOT_PIECE_BYTES).min(len);
                s.push_with(end - start, |to| chunk.copy_range(start, end, to))
                    .map_err(|e| format!("{e}: {source}"))?;
                progress.bytes_read += (end - start) as u64;
                if !pacer.pace(|| 0, &mut progress, state, current).await {
                    return Ok(None);
                }
            }
            continue;
        }
        let chunk = chunk.into_vec();
        for piece in chunk.chunks(PIECE_BYTES) {
            let stopped = loader.push(piece).is_err();
            progress.bytes_read += piece.len() as u64;
            if stopped {
                break 'read;
            }
            let records = || loader.records_decoded();
            if !pacer.pace(records, &mut progress, state, current).await {
                return Ok(None);
            }
        }
    }
    dom::mark("gpucollect:read");
    if let Some(s) = snapshot {
        // The page repaints to say so before a conversion that takes more than a frame or
        // two; a shorter one is over before the words could be read, and the repaint costs a
        // frame's work (1-2 ms).
        if s.pending_entries()
            .is_none_or(|n| n >= SHOW_CONVERSION_ENTRIES)
        {
            progress.phase = "converting snapshot";
            state.set(LoadState::Loading(progress.clone()));
            dom::yield_now().await;
            if !current() {
                return Ok(None);
            }
        }
        // From here to the first view, without a yield unless the work is long (the frame
        // then shows the first view as soon as it is ready).
        dom::frame_soon();
        // Converted straight into the model (no trace bytes in between).
        let (trace, _) = s.finish().map_err(|e| format!("{e}: {source}"))?;
        dom::mark("gpucollect:decoded");
        progress.records = trace.model.records;
        return Ok(analyse(trace, source, progress, started, state, current).await);
    }
    progress.records = loader.records_decoded();
    dom::frame_soon();
    let trace = loader.finish().map_err(|e| e.to_string())?;
    dom::mark("gpucollect:decoded");
    Ok(analyse(trace, source, progress, started, state, current).await)
}

/// Analyses a loaded trace (after a repaint that says so, for a large one).
async fn analyse(
    trace: LoadedTrace,
    source: String,
    mut progress: Progress,
    started: f64,
    state: RwSignal<LoadState>,
    current: &dyn Fn() -> bool,
) -> Option<Arc<TraceData>> {
    if progress.records >= SHOW_ANALYSIS_RECORDS {
        progress.phase = "analysing";
        state.set(LoadState::Loading(progress));
        dom::yield_now().await;
        if !current() {
            return None;
        }
        dom::frame_soon();
    }
    // The detectors run later (`TraceData::detect`), once the first view is drawn.
    let analysis = TraceData::without_report(trace, source);
    dom::mark("gpucollect:tables");
    state.set(LoadState::Done {
        elapsed_ms: dom::now_ms() - started,
    });
    Some(Arc::new(analysis))
}
