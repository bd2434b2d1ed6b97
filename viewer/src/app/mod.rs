//! The Leptos app (wasm32 only): page chrome, loading (drop, picker, `?trace=`, demos), the
//! progress bar and error panel, view tabs, filters, keyboard shortcuts and the URL state.
//!
//! Every interactive element has a `data-testid`; numbers carry their raw value in
//! `data-value` so browser tests compare them with `gpucollect report --format json`.

mod canvas;
mod compare;
mod dom;
mod flame;
mod load;
mod read_worker;
mod served;
mod timeline;
mod views;

use std::sync::Arc;

use analysis_core::synth::{Scenario, generate};
use analysis_core::units::{fmt_bytes, fmt_duration};
use leptos::ev;
use leptos::prelude::*;

use crate::chart;
use crate::data::TraceData;
use crate::state::{View, ViewState, pan_range, zoom_range};
use load::{LoadState, Source};

/// Events per bundled demo trace (generated in the page).
const DEMO_EVENTS: u64 = 200_000;
/// How long the view state must stay unchanged before the URL fragment is rewritten.
const FRAGMENT_DELAY_MS: u64 = 150;
/// Smallest zoom window, in nanoseconds.
pub const MIN_SPAN_NANOS: u64 = 1_000;

/// App-wide handles, given to every view.
#[derive(Clone, Copy)]
pub struct Ctx {
    pub vs: RwSignal<ViewState>,
    pub analysis: RwSignal<Option<Arc<TraceData>>>,
    /// The bytes of the open trace when they came from this computer (a file, a demo, an
    /// embedded trace), for the Share button; `None` for a trace opened from a URL.
    pub local_trace: StoredValue<Option<web_sys::Blob>, LocalStorage>,
    /// Counts finished runs of the detectors: the views that show their results (the report,
    /// the markers) follow it.
    pub detections: RwSignal<u64>,
    /// The trace open in server mode, if one is.
    pub served: RwSignal<Option<Arc<served::Served>>>,
}

impl Ctx {
    /// The open trace's whole window, in the page or on the server.
    fn extent(&self) -> Option<(u64, u64)> {
        match self.analysis.get_untracked() {
            Some(a) => Some(a.time_extent()),
            None => self
                .served
                .with_untracked(|s| s.as_ref().map(|s| s.extent())),
        }
    }

    /// Zooms by `factor` (< 1 zooms in) around `center` (default: the window's middle).
    pub fn zoom(&self, factor: f64, center: Option<u64>) {
        let Some(full) = self.extent() else {
            return;
        };
        self.vs.update(|v| {
            let cur = v.range_nanos.unwrap_or(full);
            let c = center.unwrap_or(cur.0 + (cur.1 - cur.0) / 2);
            let r = zoom_range(cur, c, factor, full, MIN_SPAN_NANOS);
            v.range_nanos = (r != full).then_some(r);
        });
    }

    /// Moves the window by `fraction` of its width.
    pub fn pan(&self, fraction: f64) {
        let Some(full) = self.extent() else {
            return;
        };
        self.vs.update(|v| {
            let cur = v.range_nanos.unwrap_or(full);
            let r = pan_range(cur, fraction, full);
            v.range_nanos = (r != full).then_some(r);
        });
    }

    pub fn reset_zoom(&self) {
        self.vs.update(|v| v.range_nanos = None);
    }

    /// A wheel over a chart drawn as `m`: zooms around the time under the mouse (the window's
    /// middle outside the plot), or pans with shift or a sideways wheel.
    pub fn wheel(&self, e: &ev::WheelEvent, m: &chart::Mapper) {
        e.prevent_default();
        let x = f64::from(e.offset_x());
        if e.shift_key() || e.delta_x().abs() > e.delta_y().abs() {
            let d = if e.shift_key() {
                e.delta_y()
            } else {
                e.delta_x()
            };
            self.pan(d.signum() * 0.1);
        } else if e.delta_y() != 0.0 {
            let factor = if e.delta_y() < 0.0 { 0.8 } else { 1.25 };
            self.zoom(factor, m.contains_x(x).then(|| m.time_at(x)));
        }
    }
}

/// The whole page.
#[component]
pub fn App() -> impl IntoView {
    let fragment = dom::fragment();
    let mut initial = ViewState::from_fragment(&fragment);
    // `?embed=1&view=…`, as `gpucollect serve` redirects `/embed/<id>?view=…` (API.md); the
    // fragment's view, where it has one, comes first.
    initial.embed |= dom::query_param("embed").is_some_and(|v| v == "1" || v == "true");
    if !ViewState::fragment_has_view(&fragment)
        && let Some(view) = dom::query_param("view").and_then(|v| View::from_slug(&v))
    {
        initial.view = view;
    }
    let vs = RwSignal::new(initial);
    let analysis: RwSignal<Option<Arc<TraceData>>> = RwSignal::new(None);
    let load_state = RwSignal::new(LoadState::Idle);
    let generation = StoredValue::new(0u64);
    let local_trace = StoredValue::new_local(None);
    let detections = RwSignal::new(0u64);
    let served = RwSignal::new(None);
    let ctx = Ctx {
        vs,
        analysis,
        local_trace,
        detections,
        served,
    };

    // The URL fragment follows the view state, written once the state has been still for a
    // moment (`history.replaceState` costs milliseconds: not once per zoom step).
    let fragment_timer = StoredValue::new(None::<TimeoutHandle>);
    Effect::new(move |_| {
        vs.track();
        if let Some(t) = fragment_timer.get_value() {
            t.clear();
        }
        let write = move || dom::replace_fragment(&vs.with_untracked(ViewState::to_fragment));
        let t = set_timeout_with_handle(write, std::time::Duration::from_millis(FRAGMENT_DELAY_MS));
        fragment_timer.set_value(t.ok());
    });

    let start = move |src: Source, name: String, total: Option<u64>, keep_view: bool| {
        generation.update_value(|g| *g += 1);
        let my = generation.get_value();
        if !keep_view {
            vs.update(|v| {
                v.range_nanos = None;
                v.pin_nanos = None;
                v.open_stack = None;
                v.process = None;
                v.device = None;
                v.thread = None;
            });
        }
        // The progress panel shows at once where it replaces something on screen (an open
        // trace's views, an error, an earlier load's progress); over the welcome screen only
        // once the load takes long enough to be worth one (`load::SHOW_PROGRESS_AFTER_MS`).
        let replaces = analysis.with_untracked(Option::is_some)
            || !matches!(
                load_state.get_untracked(),
                LoadState::Idle | LoadState::Done { .. }
            );
        analysis.set(None);
        served.set(None);
        if replaces {
            load_state.set(LoadState::Loading(load::Progress::starting(
                name.clone(),
                total,
            )));
        }
        local_trace.set_value(match &src {
            Source::Blob(reader) => Some(reader.blob().clone()),
            Source::Bytes(Some(b)) => dom::blob_of(b),
            _ => None,
        });
        leptos::task::spawn_local(async move {
            let current = move || generation.get_value() == my;
            match load::decode(src, name, total, load_state, &current).await {
                Ok(Some(a)) => {
                    analysis.set(Some(a.clone()));
                    // The detectors run once the first view is on screen (the timeline draws in
                    // an animation frame, once the view is rendered).
                    for _ in 0..4 {
                        dom::next_frame().await;
                        if vs.with_untracked(|v| v.view) != View::Timeline || dom::timeline_drawn()
                        {
                            break;
                        }
                    }
                    if current() {
                        a.detect();
                        dom::mark("gpucollect:analysed");
                        detections.update(|n| *n += 1);
                    }
                }
                Ok(None) => {}
                Err(msg) => load_state.set(LoadState::Failed(msg)),
            }
        });
    };
    let open_file = move |file: web_sys::File| {
        let name = file.name();
        let total = file.size() as u64;
        // Reading starts first: the worker reads while this thread updates the page.
        let src = Source::Blob(load::BlobReader::new(file.into()));
        dom::replace_query("", &vs.with_untracked(ViewState::to_fragment));
        start(src, name, Some(total), false);
    };
    let open_demo = move |scenario: Scenario, keep_view: bool| {
        let (bytes, _) = generate(scenario, DEMO_EVENTS, 1);
        let total = bytes.len() as u64;
        if !keep_view {
            dom::replace_query(
                &format!("demo={}", scenario.name()),
                &vs.with_untracked(ViewState::to_fragment),
            );
        }
        start(
            Source::Bytes(Some(bytes)),
            format!("demo: {}", scenario.name()),
            Some(total),
            keep_view,
        );
    };

    // Startup: a trace embedded by `gpucollect html`, `?trace=URL` or `?demo=NAME`, opened with
    // the view state of the fragment.
    let embedded = dom::embedded_trace();
    // The single-file report (`gpucollect html`) is opened from disk: there is no server to
    // upload to; a server that takes no uploads (`gpucollect view`) says so in the page.
    let can_upload =
        embedded.is_none() && dom::meta_content("gpucollect-uploads").as_deref() != Some("off");
    if let Some(bytes) = embedded {
        let total = bytes.len() as u64;
        start(
            Source::Bytes(Some(bytes)),
            "embedded trace".into(),
            Some(total),
            true,
        );
    } else if let Some(url) = dom::query_param("trace") {
        // A trace of a gpucollect server too big for the page (or with `mode=server`) stays
        // there: the page asks for its summaries instead (`crate::served`).
        let open_served = move |url: String, total: Option<u64>, max: u64, asked: bool| {
            let mut p = load::Progress::starting(url.clone(), total);
            p.phase = "the server is analysing it";
            load_state.set(LoadState::Loading(p));
            leptos::task::spawn_local(async move {
                let started = dom::now_ms();
                match served::open(url, total, max, asked).await {
                    Ok(s) => {
                        served.set(Some(Arc::new(s)));
                        load_state.set(LoadState::Done {
                            elapsed_ms: dom::now_ms() - started,
                        });
                        dom::mark("gpucollect:served-summary");
                    }
                    Err(msg) => load_state.set(LoadState::Failed(msg)),
                }
            });
        };
        leptos::task::spawn_local(async move {
            let (asked, max) = match mode_of_address() {
                Ok(m) => m,
                Err(msg) => {
                    load_state.set(LoadState::Failed(msg));
                    return;
                }
            };
            use crate::served::Mode;
            let summarised = crate::served::endpoint(&url, "summary", "").is_some();
            if asked == Some(Mode::Server) {
                open_served(url, None, max, true);
                return;
            }
            // The size decides before anything is downloaded (a HEAD request).
            if summarised && asked.is_none() {
                let size = load::size_of_url(&url).await;
                if crate::served::choose(asked, summarised, size, max) == Mode::Server {
                    open_served(url, size, max, false);
                    return;
                }
            }
            match load::open_url(&url).await {
                Ok((src, total)) => start(src, url, total, true),
                Err(msg) => load_state.set(LoadState::Failed(msg)),
            }
        });
    } else if let Some(s) = dom::query_param("demo").and_then(|d| Scenario::from_name(&d)) {
        open_demo(s, true);
    } else {
        // Nothing to open yet: the worker that will read the chosen file starts while the user
        // picks it (it reads a file only once one is chosen, and holds no buffers before).
        read_worker::prepare();
    }

    // Drag and drop anywhere on the page.
    let dragging = RwSignal::new(false);
    let _ = window_event_listener(ev::dragover, move |e| {
        e.prevent_default();
        dragging.set(true);
    });
    let _ = window_event_listener(ev::dragleave, move |_| dragging.set(false));
    let _ = window_event_listener(ev::drop, move |e| {
        e.prevent_default();
        dragging.set(false);
        if let Some(f) = e
            .data_transfer()
            .and_then(|d| d.files())
            .and_then(|l| l.get(0))
        {
            open_file(f);
        }
    });

    // Keyboard: 1-8 views, +/- zoom, arrows pan, 0 reset, Escape unpins.
    let _ = window_event_listener(ev::keydown, move |e| {
        let typing = e
            .target()
            .and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlInputElement>(t).ok())
            .is_some();
        if typing || e.ctrl_key() || e.meta_key() || e.alt_key() {
            return;
        }
        match e.key().as_str() {
            "+" | "=" => ctx.zoom(0.5, None),
            "-" | "_" => ctx.zoom(2.0, None),
            "ArrowLeft" => ctx.pan(-0.25),
            "ArrowRight" => ctx.pan(0.25),
            "0" => ctx.reset_zoom(),
            "Escape" => vs.update(|v| v.pin_nanos = None),
            k => {
                if let Some(view) = k
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| View::ALL.get(n.wrapping_sub(1)))
                {
                    vs.update(|v| v.view = *view);
                }
            }
        }
    });

    let picker = move |e: ev::Event| {
        let input: web_sys::HtmlInputElement = event_target(&e);
        if let Some(f) = input.files().and_then(|l| l.get(0)) {
            open_file(f);
        }
        input.set_value("");
    };

    let embed = move || vs.with(|v| v.embed);
    view! {
        <div class="app" class:embed=embed class:dragging=move || dragging.get()>
            <Show when=move || !embed()>
                <header class="top">
                    <h1>"gpucollect"</h1>
                    <span class="tagline">"GPU memory, in your browser. Nothing is uploaded unless you press Share."</span>
                    <label class="button" data-testid="file-picker-label">
                        "Open trace…"
                        <input type="file" data-testid="file-picker" on:change=picker />
                    </label>
                    <ShareButton ctx=ctx can_upload=can_upload />
                </header>
            </Show>
            <LoadPanel state=load_state />
            {main_part(ctx, Arc::new(move || {
                let busy = matches!(load_state.get(), LoadState::Loading(_));
                view! { <Welcome busy=busy on_demo=move |s| open_demo(s, false) /> }.into_any()
            }))}
            <div class="drop-hint" aria-hidden="true">"Drop the trace to open it"</div>
        </div>
    }
}

/// A chart toolbar's zoom and pan buttons (the keys + − ← → 0 do the same).
#[component]
fn ZoomButtons(ctx: Ctx) -> impl IntoView {
    view! {
        <button data-testid="zoom-in" title="Zoom in (+)" on:click=move |_| ctx.zoom(0.5, None)>"+"</button>
        <button data-testid="zoom-out" title="Zoom out (−)" on:click=move |_| ctx.zoom(2.0, None)>"−"</button>
        <button data-testid="pan-left" title="Pan left (←)" on:click=move |_| ctx.pan(-0.25)>"←"</button>
        <button data-testid="pan-right" title="Pan right (→)" on:click=move |_| ctx.pan(0.25)>"→"</button>
        <button data-testid="zoom-reset" title="Whole trace (0)" on:click=move |_| ctx.reset_zoom()>"Reset"</button>
    }
}

/// What the address asks of a `?trace=` load: the mode (`?mode=`) and the largest trace the
/// page downloads itself (`?max_download=`).
fn mode_of_address() -> Result<(Option<crate::served::Mode>, u64), String> {
    let mode = crate::served::mode_param(dom::query_param("mode").as_deref())?;
    let max = match dom::query_param("max_download") {
        None => crate::served::DEFAULT_MAX_DOWNLOAD,
        Some(v) => crate::served::parse_bytes(&v).ok_or_else(|| {
            format!(
                "the address gives max_download={v}, which is not a size: give bytes, e.g. \
                 max_download=500MiB"
            )
        })?,
    };
    Ok((mode, max))
}

/// The page's main part: the open trace's views (in the page, or the server's answers in
/// server mode), or what `otherwise` shows while none is open.
fn main_part(ctx: Ctx, otherwise: Arc<dyn Fn() -> AnyView + Send + Sync>) -> AnyView {
    (move || match (ctx.analysis.get(), ctx.served.get()) {
        (Some(a), _) => view! { <Loaded a=a ctx=ctx /> }.into_any(),
        (None, Some(s)) => view! { <served::ServedView s=s ctx=ctx /> }.into_any(),
        (None, None) => otherwise(),
    })
    .into_any()
}

/// Progress bar while loading, the error panel when loading failed or stopped early.
#[component]
fn LoadPanel(state: RwSignal<LoadState>) -> impl IntoView {
    move || match state.get() {
        LoadState::Idle | LoadState::Done { .. } => ().into_any(),
        LoadState::Loading(p) => {
            let max = p.total_bytes.unwrap_or(0).max(p.bytes_read).max(1);
            let total = p
                .total_bytes
                .map(|t| format!(" of {}", fmt_bytes(t)))
                .unwrap_or_default();
            view! {
                <section class="progress" data-testid="progress" aria-live="polite">
                    <div>{format!("Opening {} — {}", p.source, p.phase)}</div>
                    <progress max=max.to_string() value=p.bytes_read.to_string()></progress>
                    <div class="muted" data-testid="progress-text" data-bytes=p.bytes_read.to_string() data-records=p.records.to_string()>
                        {format!("{}{total} read · {} records decoded", fmt_bytes(p.bytes_read), p.records)}
                    </div>
                </section>
            }
            .into_any()
        }
        LoadState::Failed(msg) => view! {
            <section class="error-panel" role="alert" data-testid="error-panel">
                <h2>"This trace could not be opened"</h2>
                <p data-testid="error-message">{msg}</p>
            </section>
        }
        .into_any(),
    }
}

/// First screen: how to open a trace, and the demos.
#[component]
fn Welcome(busy: bool, on_demo: impl Fn(Scenario) + Copy + 'static) -> impl IntoView {
    view! {
        <section class="welcome" data-testid="welcome" class:hidden=busy>
            <h2>"Drop a gpucollect trace anywhere on this page"</h2>
            <p>"…or use “Open trace…”, or add "<code>"?trace=URL"</code>" to the address. "
               "The trace is decoded and analysed here, in WebAssembly; it leaves your computer only if you press Share."</p>
            <h3>"No trace at hand? Open a demo"</h3>
            <ul class="demos" data-testid="demos">
                {Scenario::ALL
                    .into_iter()
                    .map(|s| view! {
                        <li>
                            <button data-testid=format!("demo-{}", s.name()) on:click=move |_| on_demo(s)>
                                {s.name()}
                            </button>
                            <span class="muted">{s.description()}</span>
                        </li>
                    })
                    .collect_view()}
            </ul>
        </section>
    }
}

/// "Copy link": puts the URL that reopens this exact view on the clipboard and shows it; for a
/// trace from this computer it says the link does not carry the file. "Share" (where the page
/// can upload: not in the single-file report of `gpucollect html`): asks first, then uploads the
/// trace (a PyTorch snapshot converted to the trace format first) to the `gpucollect serve` that
/// served the page, and copies the link it answers.
#[component]
fn ShareButton(ctx: Ctx, can_upload: bool) -> impl IntoView {
    let link = RwSignal::new(String::new());
    let note = RwSignal::new(None::<&'static str>);
    // The upload waiting for a yes: what it is and its size.
    let asking = RwSignal::new(None::<(String, u64)>);
    let copy = move |_: ()| {
        let url = dom::share_url(&ctx.vs.with_untracked(ViewState::to_fragment));
        link.set(url.clone());
        asking.set(None);
        let local = ctx.local_trace.with_value(Option::is_some);
        note.set(local.then_some(if can_upload {
            "This link reopens the view, not the trace: the file is on this computer only. \
             Send the file with the link, or use Share to upload it."
        } else {
            "This link reopens the view, not the trace: the file is on this computer only. \
             Send this report file with the link."
        }));
        leptos::task::spawn_local(async move {
            // Without clipboard permission the link stays visible to copy by hand.
            let _ = dom::copy_text(&url).await;
        });
    };
    let share = move |_| {
        let Some(blob) = ctx.local_trace.get_value() else {
            // Opened from a URL: the page's own link already reopens it.
            copy(());
            return;
        };
        let name = ctx
            .analysis
            .with_untracked(|a| a.as_ref().map(|a| a.source.clone()))
            .unwrap_or_else(|| String::from("the trace"));
        note.set(None);
        link.set(String::new());
        asking.set(Some((name, blob.size() as u64)));
    };
    let upload = move |_| {
        asking.set(None);
        let Some(blob) = ctx.local_trace.get_value() else {
            return;
        };
        link.set(String::from("uploading…"));
        let fragment = ctx.vs.with_untracked(ViewState::to_fragment);
        leptos::task::spawn_local(async move {
            let shared = match load::as_trace(blob).await {
                Ok(trace) => dom::upload_trace(&trace, &fragment).await,
                Err(e) => Err(e),
            };
            match shared {
                Ok(url) => {
                    link.set(url.clone());
                    let _ = dom::copy_text(&url).await;
                }
                Err(e) => link.set(format!("Not shared: {e}")),
            }
        });
    };
    let origin = dom::page_origin();
    view! {
        <button data-testid="copy-link" on:click=move |_| copy(()) title="Copy a link to this view">"Copy link"</button>
        {can_upload.then(|| view! {
            <button data-testid="share" on:click=share
                title="Upload this trace to the gpucollect server and copy a link to this view">"Share"</button>
        })}
        {move || asking.get().map(|(name, bytes)| view! {
            <div class="share-ask" role="dialog" aria-label="Share this trace" data-testid="share-ask">
                <span>{format!("Upload {name} ({}) to {origin}? Anyone with the link can open it.", fmt_bytes(bytes))}</span>
                <button data-testid="share-confirm" on:click=upload>"Upload and copy link"</button>
                <button data-testid="share-cancel" on:click=move |_| asking.set(None)>"Cancel"</button>
            </div>
        })}
        <Show when=move || !link.get().is_empty()>
            <input class="share-link" readonly data-testid="share-link" prop:value=move || link.get()
                aria-label="Link to this view" />
        </Show>
        {move || note.get().map(|n| view! { <p class="share-note muted" data-testid="share-note">{n}</p> })}
    }
}

/// Everything shown once a trace is loaded.
#[component]
fn Loaded(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let fatal = a.trace.fatal.as_ref().map(ToString::to_string);
    let warnings: Vec<String> = a.trace.warnings.iter().map(ToString::to_string).collect();
    let records = a.model().records;
    let tabs = View::ALL
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            view! {
                <button role="tab" data-testid=format!("tab-{}", v.slug())
                    class:active=move || vs.with(|s| s.view == v)
                    aria-selected=move || vs.with(|s| s.view == v).to_string()
                    title=format!("{} (key {})", v.title(), i + 1)
                    on:click=move |_| vs.update(|s| s.view = v)>
                    {v.title()}
                </button>
            }
        })
        .collect_view();
    let a2 = a.clone();
    // Only a change of view or filter re-renders the view (zooming must not rebuild it).
    // Views built on the detectors' results wait for them (a note says so meanwhile).
    let a3 = a.clone();
    let waiting = Memo::new(move |_| {
        ctx.detections.track();
        a3.report().is_none()
    });
    let shown = Memo::new(move |_| {
        let (view, process, device, thread) = vs.with(|s| (s.view, s.process, s.device, s.thread));
        // Fragmentation too: its largest free block and address map at each OOM come from
        // the report (opened first by a link, it showed neither).
        let needs_report = matches!(
            view,
            View::Overview | View::Leaks | View::Spikes | View::Fragmentation
        );
        (view, process, device, thread, needs_report && waiting.get())
    });
    let current = Memo::new(move |_| shown.get().0);
    view! {
        {(fatal.is_some() || !warnings.is_empty()).then(|| view! {
            <section class="error-panel" role="alert" data-testid="error-panel">
                <h2>{if fatal.is_some() { "The trace is damaged" } else { "The trace is incomplete" }}</h2>
                {fatal.map(|msg| view! { <p data-testid="error-message">{msg}</p> })}
                <ul data-testid="error-warnings">{warnings.into_iter().map(|w| view! { <li>{w}</li> }).collect_view()}</ul>
                <p>{format!("Everything that decoded was kept: {records} records are shown below.")}</p>
            </section>
        })}
        <nav class="tabs" role="tablist" data-testid="tabs">
            {tabs}
            <span class="source muted" data-testid="source">{a.source.clone()}</span>
            <span class="mode muted" data-testid="mode" data-mode="local"
                title="The trace was read into this page and analysed here (a trace too big for the page opens in server mode)">
                "· analysed in this page"</span>
        </nav>
        <Filters a=a.clone() ctx=ctx />
        <main data-testid="view" data-view=move || current.get().slug()>
            {move || {
                let a = a2.clone();
                let (view, .., wait) = shown.get();
                if wait {
                    return view! { <views::Detecting /> }.into_any();
                }
                match view {
                    View::Overview => view! { <views::Overview a=a ctx=ctx /> }.into_any(),
                    View::Timeline => view! { <timeline::TimelineView a=a ctx=ctx /> }.into_any(),
                    View::Leaks => view! { <views::Leaks a=a ctx=ctx /> }.into_any(),
                    View::Spikes => view! { <views::Spikes a=a ctx=ctx /> }.into_any(),
                    View::Fragmentation => view! { <views::Fragmentation a=a ctx=ctx /> }.into_any(),
                    View::Sites => view! { <views::Sites a=a ctx=ctx /> }.into_any(),
                    View::Stacks => view! { <flame::Stacks a=a ctx=ctx /> }.into_any(),
                    View::Compare => view! { <compare::Compare a=a ctx=ctx /> }.into_any(),
                }
            }}
        </main>
    }
}

/// Process, device and thread selectors, shown when the trace has several.
#[component]
fn Filters(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let select = |label: &'static str,
                  testid: &'static str,
                  options: Vec<(u32, String)>,
                  get: fn(&ViewState) -> Option<u32>,
                  set: fn(&mut ViewState, Option<u32>)| {
        (options.len() > 1).then(|| {
            let opts = options
                .into_iter()
                .map(|(v, name)| {
                    view! { <option value=v.to_string() selected=move || vs.with(|s| get(s) == Some(v))>{name}</option> }
                })
                .collect_view();
            view! {
                <label>
                    {label}
                    <select data-testid=testid on:change=move |e| {
                        let v = event_target_value(&e).parse().ok();
                        vs.update(|s| set(s, v));
                    }>
                        <option value="all" selected=move || vs.with(|s| get(s).is_none())>"all"</option>
                        {opts}
                    </select>
                </label>
            }
        })
    };
    let m = a.model();
    let processes = a
        .processes()
        .into_iter()
        .map(|p| {
            let name = m.processes.iter().find(|x| x.process == p).map_or_else(
                || format!("process {}", p.0),
                |x| format!("{} (pid {})", x.exe, x.pid),
            );
            (p.0, name)
        })
        .collect();
    let devices = a
        .devices()
        .into_iter()
        .map(|d| {
            let name = m.devices.iter().find(|x| x.device == d).map_or_else(
                || format!("GPU {}", d.0),
                |x| format!("GPU {} · {}", d.0, x.name),
            );
            (d.0, name)
        })
        .collect();
    let threads = a
        .threads()
        .into_iter()
        .map(|(t, name)| {
            (
                t.0,
                if name.is_empty() {
                    format!("thread {}", t.0)
                } else {
                    name
                },
            )
        })
        .collect();
    view! {
        <div class="filters" data-testid="filters">
            {select("Process ", "filter-process", processes, |s| s.process, |s, v| s.process = v)}
            {select("Device ", "filter-device", devices, |s| s.device, |s, v| s.device = v)}
            {select("Thread ", "filter-thread", threads, |s| s.thread, |s, v| s.thread = v)}
            // One search for every view: the timeline's stacked sites and the call-site, leak,
            // scope and Memory-by-stack tables keep the stacks with a frame that holds it.
            <label>"Search frames "
                <input type="search" data-testid="site-search" placeholder="function, file or module"
                    prop:value=move || vs.with(|v| v.search.clone())
                    on:input=move |e| { let q = event_target_value(&e); vs.update(|v| v.search = q) } />
            </label>
        </div>
    }
}

/// A byte count for people, with the raw number for scripts.
#[component]
pub fn Bytes(bytes: u64, #[prop(optional)] testid: &'static str) -> impl IntoView {
    view! { <span class="num" data-testid=testid data-value=bytes.to_string()>{fmt_bytes(bytes)}</span> }
}

/// A duration for people, with the raw nanoseconds for scripts.
#[component]
pub fn Duration(nanos: u64, #[prop(optional)] testid: &'static str) -> impl IntoView {
    view! { <span class="num" data-testid=testid data-value=nanos.to_string()>{fmt_duration(nanos)}</span> }
}
