//! Warm-up while the page waits for a file: the browser compiles WebAssembly lazily (a function's
//! first call compiles it with the baseline compiler, on the main thread) and optimizes hot
//! functions later, in the background. Opening a first trace would pay for both while the user
//! waits: at 100k snapshot entries that was about a third of the load. So once the page is idle,
//! the app opens small traces nobody sees (a synthetic gpucollect trace and two small PyTorch
//! snapshots, one synthetic and one real) through the same code as a real file
//! (`load::decode`, in pieces as a file arrives, the analysis), several times, so every function
//! a load runs is compiled and the hot ones are optimized before a real file arrives. It shows
//! each view of the first ones in an element of the page that nobody sees (`visibility: hidden`,
//! `aria-hidden`, removed afterwards): the browser then lays those views out too, and the first
//! real view's layout finds the text of its buttons and labels already shaped (in an element
//! outside the document, that layout was left to the first load: 1-2 ms more to its first draw).
//!
//! Last, it writes to a block of memory once and frees it (`pre_touch`). The first write to a
//! page of memory makes the kernel hand out a fresh zeroed page, 1.5–2.5 µs per 4 KiB on the
//! benchmark's machine: a load that needed fresh memory for its tables spent about a fifth of
//! its time there. WebAssembly memory never shrinks and the allocator keeps the freed block for
//! the next allocations, so the load that follows finds its memory already handed out.
//!
//! The warm-up yields to the browser between steps (a few milliseconds each) and stops as soon
//! as a real load starts. It is skipped when the page opens a trace at start (`?trace=`,
//! `?demo=`, an embedded trace): that load warms the code itself. When it is done the root
//! element gets `data-warm="done"` (the benchmark waits for it, like a user who takes more than
//! a second to choose a file).

use analysis_core::synth::{Scenario, generate};
use leptos::prelude::*;
use wasm_bindgen::JsCast;

use super::load::{self, LoadState, Source};
use super::{Ctx, dom, main_part};
use crate::state::{View, ViewState};

/// A small snapshot in PyTorch's shape (the ring-buffer fixture of the tests: ~1,200 trace
/// entries, 77 KiB).
const SNAPSHOT: &[u8] =
    include_bytes!("../../../analysis-core/tests/assets/torch/ring-buffer.pickle");
/// A real snapshot (1,667 trace entries, every one with a frames list of memo references).
const REAL_SNAPSHOT: &[u8] =
    include_bytes!("../../../analysis-core/tests/assets/torch/real-torch.pickle");
/// Events of the synthetic trace.
const TRACE_EVENTS: u64 = 20_000;
/// Times each input is opened: enough work for the browser to optimize the hot functions.
const ROUNDS: usize = 8;
/// Each input is handed over in pieces of this size, in the browser's memory, as a file's bytes
/// arrive: the code that takes the pieces after the first one differs from the code that takes
/// the first (whole inputs left the former to be compiled during the first real load).
const PIECE_BYTES: usize = 16 * 1024;

/// Starts the warm-up; `idle` says whether the page is still waiting for a file.
pub fn start(idle: impl Fn() -> bool + Copy + 'static) {
    leptos::task::spawn_local(async move {
        // Let the page paint first.
        dom::yield_now().await;
        // The worker that will read the file (`read_worker`) starts now, not when it is chosen.
        super::read_worker::prepare();
        let (trace, _) = generate(Scenario::TrainingLeak, TRACE_EVENTS, 1);
        let state = RwSignal::new(LoadState::Idle);
        for round in 0..ROUNDS {
            for bytes in [SNAPSHOT, REAL_SNAPSHOT, trace.as_slice()] {
                if !idle() {
                    return;
                }
                let total = Some(bytes.len() as u64);
                let src = Source::Pieces(
                    bytes
                        .chunks(PIECE_BYTES)
                        .map(js_sys::Uint8Array::from)
                        .collect(),
                );
                let Ok(Some(a)) = load::decode(src, "warm-up".into(), total, state, &idle).await
                else {
                    return;
                };
                if round == 0 {
                    show_every_view(a, &idle).await;
                } else {
                    // The detectors run after the first draw in a real load.
                    a.detect();
                }
                dom::yield_now().await;
            }
        }
        pre_touch(pre_touch_bytes(), &idle).await;
        if let Some(root) = document().document_element() {
            let _ = root.set_attribute("data-warm", "done");
        }
    });
}

/// Renders the page's main part for `a` as a real load does (the welcome screen replaced by the
/// timeline, as a link to it opens), then each view in turn, in a hidden element of the page.
async fn show_every_view(a: std::sync::Arc<crate::data::Analysis>, idle: &impl Fn() -> bool) {
    let Some(parent) = document()
        .create_element("div")
        .ok()
        .and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
    else {
        return;
    };
    let _ = parent.set_attribute("aria-hidden", "true");
    let _ = parent.set_attribute(
        "style",
        "position:absolute;left:0;top:0;width:100%;visibility:hidden;pointer-events:none",
    );
    if let Some(app) = document().query_selector(".app").ok().flatten() {
        let _ = app.append_child(&parent);
    }
    let ctx = Ctx {
        vs: RwSignal::new(ViewState {
            view: View::Timeline,
            ..ViewState::default()
        }),
        analysis: RwSignal::new(None),
        local_trace: StoredValue::new_local(None),
        detections: RwSignal::new(0),
    };
    let mounted = leptos::mount::mount_to(parent.clone(), move || {
        main_part(ctx, std::sync::Arc::new(|| ().into_any()))
    });
    // As a real load: the analysis arrives, the timeline draws, then the detectors run.
    ctx.analysis.set(Some(a.clone()));
    dom::next_frame().await;
    a.detect();
    ctx.detections.update(|n| *n += 1);
    for v in View::ALL {
        if !idle() {
            break;
        }
        ctx.vs.update(|s| s.view = v);
        // Effects run and the timeline draws (in the next animation frame) before the next view.
        dom::next_frame().await;
    }
    drop(mounted);
    parent.remove();
}

/// Memory touched in advance where the browser says the device has at least 8 GiB
/// (`navigator.deviceMemory`, a rounded figure): most of what a 1M-entry snapshot's load needs.
const PRE_TOUCH_LARGE: usize = 256 << 20;
/// Elsewhere, or where the browser does not say (outside secure contexts): enough for a
/// 100k-entry snapshot.
const PRE_TOUCH_SMALL: usize = 64 << 20;
/// Touched per step, between yields to the browser (2–3 ms of work).
const PRE_TOUCH_STEP: usize = 4 << 20;

/// How much memory to touch in advance, from the device's memory as the browser reports it.
fn pre_touch_bytes() -> usize {
    let device_gib = js_sys::Reflect::get(&window().navigator(), &"deviceMemory".into())
        .ok()
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0);
    if device_gib >= 8.0 {
        PRE_TOUCH_LARGE
    } else {
        PRE_TOUCH_SMALL
    }
}

/// Writes `bytes` of new memory, in steps that yield to the browser, and frees it: the allocator
/// keeps it, already handed out by the kernel, for the next load. Stops when a load starts (the
/// part written so far is kept just the same).
async fn pre_touch(bytes: usize, idle: &impl Fn() -> bool) {
    let mut block: Vec<u8> = Vec::new();
    if block.try_reserve_exact(bytes).is_err() {
        return;
    }
    while block.len() < bytes {
        if !idle() {
            return;
        }
        let step = PRE_TOUCH_STEP.min(bytes - block.len());
        block.resize(block.len() + step, 0);
        dom::yield_now().await;
    }
}
