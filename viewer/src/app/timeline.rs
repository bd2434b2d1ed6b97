//! The interactive timeline: live bytes over real time per (process, device) over the top call
//! sites of the window as stacked areas (hover names a band; the selected leak row's band is
//! drawn solid), pool reserved vs allocated, NVML device used with the hidden gap, the device
//! capacity, NVTX ranges, failed allocations and teardowns (grouped where dense, all of them
//! listed under the chart). Wheel zooms around the cursor, drag brushes a window, shift-drag
//! pans, click pins a moment (its live allocations are listed by stack), double-click resets
//! the zoom and leaves the pin as it was. From the keyboard, on the focused chart: Enter or
//! Space pins (the hovered moment, else the window's middle), shift+arrows move the pin.
//!
//! The per-site series are built after the first draw (two animation frames later), once per
//! filter, so opening a trace does not wait for them.

use std::sync::Arc;

use analysis_core::units::{fmt_bytes, fmt_duration};
use leptos::ev;
use leptos::html;
use leptos::prelude::*;

use super::{Ctx, ZoomButtons, dom};
use crate::chart::{self, Mapper, filter_of, timeline_spec};
use crate::data::{TraceData, to_csv};
use crate::site_series::SiteSeries;
use crate::state::ViewState;
use crate::ticks::time_in_unit_of;

/// Canvas height of the main timeline, CSS pixels (in an embed, at most: there it fills what
/// the frame has left below its top, down to `EMBED_MIN_HEIGHT_PX`).
pub const HEIGHT_PX: u32 = 380;
/// Smallest canvas height in an embed (a frame too low for it scrolls).
const EMBED_MIN_HEIGHT_PX: u32 = 160;
/// A press that moves less than this is a click (pin), not a brush.
const CLICK_SLOP_PX: f64 = 4.0;
/// Markers listed under the chart at first, and added by each "Show more".
const MARKER_PAGE: usize = 50;
/// Delay before the call sites under the cursor are computed.
const HOVER_SITES_DELAY_MS: u64 = 120;

#[derive(Clone, Debug, PartialEq)]
struct Hover {
    x_px: f64,
    ts_nanos: u64,
    bytes: u64,
    sites: Vec<(String, u64)>,
    /// The stacked band under the mouse: its stack (`None`: other call sites), its name and
    /// its bytes at the moment its column shows.
    band: Option<(Option<u32>, String, u64)>,
}

/// One entry of the stacked call sites' legend.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LegendItem {
    /// `None`: "other call sites".
    stack: Option<u32>,
    label: String,
    /// CSS colour of its band.
    color: String,
    highlighted: bool,
}

fn css_rgb(c: plotters::style::RGBColor) -> String {
    format!("rgb({},{},{})", c.0, c.1, c.2)
}

/// The legend of a spec's stacked call sites (empty when it has none).
fn legend_of(spec: &chart::ChartSpec<'_>) -> Vec<LegendItem> {
    let Some(st) = &spec.stack else {
        return Vec::new();
    };
    st.bands
        .iter()
        .map(|b| LegendItem {
            stack: Some(b.stack.0),
            label: b.label.clone(),
            color: css_rgb(b.color),
            highlighted: st.highlight == Some(b.stack),
        })
        .chain(std::iter::once(LegendItem {
            stack: None,
            label: "other call sites".into(),
            color: css_rgb(chart::OTHER_SITES),
            highlighted: false,
        }))
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Drag {
    x0_px: f64,
    pan: bool,
    range0: (u64, u64),
    x_px: f64,
}

/// The timeline view: toolbar, chart, hover tooltip and the pinned moment's allocations.
#[component]
pub fn TimelineView(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let canvas = NodeRef::<html::Canvas>::new();
    let mapper = StoredValue::new(Mapper::default());
    // The canvas height drawn last (the brush and crosshair span it).
    let height_px = RwSignal::new(HEIGHT_PX);
    let resize = RwSignal::new(0u32);
    let handle = window_event_listener(ev::resize, move |_| resize.update(|n| *n += 1));
    on_cleanup(move || handle.remove());

    // The call sites' series of the view's filter: built two frames after the view is first
    // drawn (or taken from the cache), then the chart is drawn again with them.
    let filter = Memo::new(move |_| vs.with(filter_of));
    let sites: RwSignal<Option<Arc<SiteSeries>>> = RwSignal::new(None);
    let a_sites = a.clone();
    Effect::new(move |_| {
        let f = filter.get();
        if let Some(s) = a_sites.site_series_built(&f) {
            sites.set(Some(s));
            return;
        }
        sites.set(None);
        let a = a_sites.clone();
        leptos::task::spawn_local(async move {
            dom::next_frame().await;
            dom::next_frame().await;
            if filter.try_get_untracked() != Some(f) {
                return;
            }
            let started = dom::now_ms();
            let built = a.site_series(&f);
            let ms = dom::now_ms() - started;
            if let Some(Some(el)) = canvas.try_get_untracked() {
                let _ = el.set_attribute("data-site-series-ms", &format!("{ms:.1}"));
            }
            if filter.try_get_untracked() == Some(f) {
                sites.set(Some(built));
            }
        });
    });
    let legend = RwSignal::new(Vec::<LegendItem>::new());

    // A change of state asks for one draw in the next animation frame, with the state as it is
    // then: zoom steps that come faster than frames (wheel, drag-pan) cost one draw per frame.
    let a_draw = a.clone();
    let frame_requested = StoredValue::new(false);
    let draw = move || {
        let _ = frame_requested.try_set_value(false);
        let (Some(Some(el)), Some(state), Some(site_series)) = (
            canvas.try_get_untracked(),
            vs.try_get_untracked(),
            sites.try_get_untracked(),
        ) else {
            return;
        };
        let started = dom::now_ms();
        let spec = timeline_spec(&a_draw, &state, dom::theme(), site_series.as_deref());
        let width = dom::available_width(&el);
        let height = if state.embed {
            dom::height_below(&el).clamp(EMBED_MIN_HEIGHT_PX, HEIGHT_PX)
        } else {
            HEIGHT_PX
        };
        if height_px.try_get_untracked() != Some(height) {
            height_px.set(height);
        }
        if let Some(m) = dom::draw_canvas(&el, &spec, width, height) {
            // What the canvas shows, for scripts and tests.
            let _ = el.set_attribute("data-markers-drawn", &m.markers_drawn.to_string());
            let _ = el.set_attribute("data-marker-groups", &m.marker_groups.to_string());
            let _ = el.set_attribute("data-y-labels", &m.y_labels.join("|"));
            let _ = el.set_attribute("data-stacked", &m.stack.is_some().to_string());
            let _ = mapper.try_set_value(m);
        }
        let items = legend_of(&spec);
        if legend.try_with_untracked(|l| *l != items) == Some(true) {
            legend.set(items);
        }
        // For the benchmark: how long the draw took and when it ended.
        let done = dom::now_ms();
        let _ = el.set_attribute("data-draw-ms", &format!("{:.3}", done - started));
        let _ = el.set_attribute("data-drawn-at", &format!("{done:.3}"));
    };
    Effect::new(move |_| {
        vs.track();
        resize.track();
        sites.track();
        // The detectors' markers arrive after the first draw.
        ctx.detections.track();
        if canvas.get().is_none() || frame_requested.get_value() {
            return;
        }
        frame_requested.set_value(true);
        let draw = draw.clone();
        request_animation_frame(draw);
    });

    let hover = RwSignal::new(None::<Hover>);
    let hover_gen = StoredValue::new(0u64);
    let drag = StoredValue::new(None::<Drag>);
    let brush = RwSignal::new(None::<(f64, f64)>);

    let full = a.time_extent();
    let a_hover = a.clone();
    let on_move = move |e: ev::MouseEvent| {
        let x = f64::from(e.offset_x());
        let y = f64::from(e.offset_y());
        let m = mapper.get_value();
        if let Some(mut d) = drag.get_value() {
            d.x_px = x;
            drag.set_value(Some(d));
            if d.pan {
                let span = (d.range0.1 - d.range0.0) as f64;
                let w = f64::from((m.right_px - m.left_px).max(1));
                let frac = -(x - d.x0_px) / w;
                let r = crate::state::pan_range(d.range0, frac, full);
                vs.update(|v| v.range_nanos = (r != full).then_some(r));
                let _ = span;
            } else if (x - d.x0_px).abs() > CLICK_SLOP_PX {
                brush.set(Some((d.x0_px.min(x), d.x0_px.max(x))));
            }
            return;
        }
        if !m.contains_x(x) {
            hover.set(None);
            return;
        }
        let t = m.time_at(x);
        let f = filter_of(&vs.get_untracked());
        let bytes = a_hover.live_bytes_at(t, &f);
        let band = m.band_at(x, y).map(|b| {
            let name = b.stack.map_or_else(
                || "other call sites".to_string(),
                |s| a_hover.model().stack_label(s),
            );
            (b.stack.map(|s| s.0), name, b.bytes)
        });
        hover.set(Some(Hover {
            x_px: x,
            ts_nanos: t,
            bytes,
            sites: Vec::new(),
            band,
        }));
        hover_gen.update_value(|g| *g += 1);
        let my = hover_gen.get_value();
        let a = a_hover.clone();
        set_timeout(
            move || {
                // The view may be gone (another tab opened within the delay): its stored
                // values are disposed then, and reading them would panic.
                if hover_gen.try_get_value() != Some(my) {
                    return;
                }
                let sites = a
                    .live_sites_at(t, &f, 3)
                    .into_iter()
                    .map(|s| (s.site, s.bytes))
                    .collect();
                hover.try_update(|h| {
                    if let Some(h) = h.as_mut().filter(|h| h.ts_nanos == t) {
                        h.sites = sites;
                    }
                });
            },
            std::time::Duration::from_millis(HOVER_SITES_DELAY_MS),
        );
    };
    let on_down = move |e: ev::MouseEvent| {
        if e.button() != 0 {
            return;
        }
        e.prevent_default();
        let x = f64::from(e.offset_x());
        let range0 = vs.with_untracked(|v| v.range_nanos).unwrap_or(full);
        drag.set_value(Some(Drag {
            x0_px: x,
            pan: e.shift_key(),
            range0,
            x_px: x,
        }));
    };
    // The pin before the first click of a double-click, which gives it back.
    let pin_before_click = StoredValue::new(None::<u64>);
    let on_up = move |e: ev::MouseEvent| {
        let Some(d) = drag.get_value() else {
            return;
        };
        drag.set_value(None);
        brush.set(None);
        let x = f64::from(e.offset_x());
        let m = mapper.get_value();
        if d.pan {
            return;
        }
        if (x - d.x0_px).abs() <= CLICK_SLOP_PX {
            // The second click of a double-click does not pin (the double-click resets).
            if m.contains_x(x) && e.detail() < 2 {
                let t = m.time_at(x);
                pin_before_click.set_value(vs.with_untracked(|v| v.pin_nanos));
                vs.update(|v| v.pin_nanos = Some(t));
            }
        } else {
            let (t0, t1) = (m.time_at(d.x0_px.min(x)), m.time_at(d.x0_px.max(x)));
            if t1 > t0 {
                let r = (t0, t1.max(t0 + super::MIN_SPAN_NANOS));
                vs.update(|v| v.range_nanos = Some(r));
            }
        }
    };
    let on_leave = move |_| {
        drag.set_value(None);
        brush.set(None);
        hover.set(None);
    };
    let on_wheel = move |e: ev::WheelEvent| mapper.with_value(|m| ctx.wheel(&e, m));

    // The keyboard, on the focused chart: Enter or Space pins the moment under the mouse (the
    // window's middle when the mouse is elsewhere); shift+arrows move the pin by 1 % of the window.
    let on_key = move |e: ev::KeyboardEvent| {
        if e.ctrl_key() || e.meta_key() || e.alt_key() {
            return;
        }
        let (t0, t1) = vs.with_untracked(|v| v.range_nanos).unwrap_or(full);
        let middle = t0 + (t1 - t0) / 2;
        match e.key().as_str() {
            "Enter" | " " => {
                e.prevent_default();
                let t = hover.with_untracked(|h| h.as_ref().map(|h| h.ts_nanos));
                vs.update(|v| v.pin_nanos = Some(t.unwrap_or(middle)));
            }
            "ArrowLeft" | "ArrowRight" if e.shift_key() => {
                e.prevent_default();
                e.stop_propagation();
                let step = ((t1 - t0) / 100).max(1);
                vs.update(|v| {
                    let p = v.pin_nanos.unwrap_or(middle);
                    let moved = if e.key() == "ArrowLeft" {
                        p.saturating_sub(step)
                    } else {
                        p.saturating_add(step)
                    };
                    v.pin_nanos = Some(moved.clamp(full.0, full.1));
                });
            }
            _ => {}
        }
    };

    let origin = full.0;
    // Moments on the chart are written in the unit of the window's ends.
    let window_end = move || vs.with_untracked(|v| v.range_nanos).unwrap_or(full).1;
    let range_text = move || {
        let (t0, t1) = vs.with(|v| v.range_nanos).unwrap_or(full);
        // Both ends in one unit.
        let (a, b) = crate::ticks::time_pair(t0 - origin, t1 - origin);
        format!("{a} – {b} (window {})", fmt_duration(t1 - t0))
    };
    let a_svg = a.clone();
    let export_svg = move |_| {
        let state = vs.get_untracked();
        let site_series = sites.get_untracked();
        let spec = timeline_spec(&a_svg, &state, chart::Theme::LIGHT, site_series.as_deref());
        let width = canvas
            .get_untracked()
            .map_or(1000, |c| dom::available_width(&c));
        if let Ok(svg) = chart::to_svg(&spec, width, height_px.get_untracked()) {
            let _ = dom::download_text("gpucollect-timeline.svg", "image/svg+xml", &svg);
        }
    };
    let export_png = move |_| {
        if let Some(c) = canvas.get_untracked() {
            let _ = dom::export_png(&c, "gpucollect-timeline.png");
        }
    };

    view! {
        <section class="timeline" data-testid="timeline-view">
            <div class="toolbar">
                <ZoomButtons ctx=ctx />
                <span class="range muted" data-testid="visible-range"
                    data-t0=move || vs.with(|v| v.range_nanos).unwrap_or(full).0.to_string()
                    data-t1=move || vs.with(|v| v.range_nanos).unwrap_or(full).1.to_string()>
                    {range_text}
                </span>
                <span class="spacer"></span>
                <button data-testid="export-png" on:click=export_png>"PNG"</button>
                <button data-testid="export-svg" on:click=export_svg>"SVG"</button>
            </div>
            <p class="hint muted">"Wheel: zoom · drag: select a window · shift-drag: pan · click: pin a moment · double-click or 0: reset · keys + − ← → · on the focused chart, Enter pins a moment, shift+← → moves it, Escape unpins"</p>
            <div class="chart-wrap">
                <canvas node_ref=canvas data-testid="timeline-canvas" tabindex="0"
                    aria-label="Live device memory over time"
                    on:mousemove=on_move on:mousedown=on_down on:mouseup=on_up
                    on:mouseleave=on_leave on:wheel=on_wheel on:keydown=on_key
                    on:dblclick=move |_| vs.update(|v| {
                        v.range_nanos = None;
                        v.pin_nanos = pin_before_click.get_value();
                    })></canvas>
                {move || brush.get().map(|(x0, x1)| view! {
                    <div class="brush" data-testid="brush"
                        style=format!("left:{x0}px;width:{}px;height:{}px", x1 - x0, height_px.get())></div>
                })}
                {move || hover.get().map(|h| view! {
                    <div class="crosshair" style=format!("left:{}px;height:{}px", h.x_px, height_px.get())></div>
                    <div class="tooltip" data-testid="hover-tip" data-ts=h.ts_nanos.to_string()
                        style=format!("left:{}px", h.x_px + 12.0)>
                        <div><b data-testid="hover-time">{time_in_unit_of(h.ts_nanos - origin, window_end() - origin)}</b></div>
                        <div data-testid="hover-bytes" data-value=h.bytes.to_string()>{format!("{} live", fmt_bytes(h.bytes))}</div>
                        {h.band.map(|(stack, name, bytes)| view! {
                            <div class="band" data-testid="hover-band"
                                data-stack=stack.map_or_else(|| "other".to_string(), |s| s.to_string())
                                data-value=bytes.to_string()>
                                <b>{name}</b>{format!(" · {}", fmt_bytes(bytes))}
                            </div>
                        })}
                        <ul>
                            {h.sites.into_iter().map(|(s, b)| view! { <li>{format!("{} · {s}", fmt_bytes(b))}</li> }).collect_view()}
                        </ul>
                    </div>
                })}
            </div>
            <StackLegend legend=legend vs=vs />
            <MarkerList a=a.clone() ctx=ctx origin=origin />
            <Pinned a=a.clone() vs=vs origin=origin />
        </section>
    }
}

/// The stacked call sites: a swatch and a name each; a click selects the site (its band is
/// drawn solid, as when its leak row is selected) or clears the selection.
#[component]
fn StackLegend(legend: RwSignal<Vec<LegendItem>>, vs: RwSignal<ViewState>) -> impl IntoView {
    move || {
        let items = legend.get();
        (!items.is_empty()).then(|| {
            let rows = items
                .into_iter()
                .map(|it| {
                    let select = move |_| {
                        if let Some(s) = it.stack {
                            vs.update(|v| {
                                v.open_stack = if v.open_stack == Some(s) { None } else { Some(s) };
                            });
                        }
                    };
                    view! {
                        <li data-testid="stack-band"
                            data-stack=it.stack.map_or_else(|| "other".to_string(), |s| s.to_string())
                            data-highlight=it.highlighted.to_string() class:highlight=it.highlighted>
                            <button class="link" on:click=select disabled=it.stack.is_none()>
                                <span class="swatch" style=format!("background:{}", it.color)></span>
                                {it.label}
                            </button>
                        </li>
                    }
                })
                .collect_view();
            view! {
                <ul class="stack-legend" data-testid="stack-legend"
                    aria-label="Call sites with the highest peaks in the window, bottom band first">{rows}</ul>
            }
        })
    }
}

/// The chart's markers as a list (screen readers cannot read the canvas): failed allocations,
/// teardowns and detected spikes of the filtered series, a page at a time ("N of M", then
/// "Show more"), so every one is reachable; each zooms the timeline on itself.
#[component]
fn MarkerList(a: Arc<TraceData>, ctx: Ctx, origin: u64) -> impl IntoView {
    let vs = ctx.vs;
    // Recomputed when the filters change, not on zoom.
    let filter = Memo::new(move |_| vs.with(filter_of));
    let listed = RwSignal::new(MARKER_PAGE);
    move || {
        let f = filter.get();
        ctx.detections.track();
        let (lo, hi) = a.time_extent();
        let total = a.markers_in(&f, lo, hi).count();
        if total == 0 {
            return None;
        }
        let shown = listed.get().min(total);
        let items = a
            .markers_in(&f, lo, hi)
            .take(shown)
            .map(|m| {
                let t = m.ts_nanos;
                let go = move |_| {
                    // 1 % of the trace on each side.
                    let pad = ((hi - lo) / 100).max(super::MIN_SPAN_NANOS);
                    vs.update(|v| {
                        v.range_nanos = Some((t.saturating_sub(pad).max(lo), (t + pad).min(hi)));
                        v.pin_nanos = Some(t);
                    });
                };
                view! {
                    <li data-testid="marker" data-kind=m.kind.slug() data-ts=t.to_string()>
                        <button class="link" on:click=go>{format!("{} at {}", m.label, time_in_unit_of(t.saturating_sub(origin), hi - origin))}</button>
                    </li>
                }
            })
            .collect_view();
        let count = |kind: crate::markers::MarkerKind, what: &str| {
            let n = a.markers_in(&f, lo, hi).filter(|m| m.kind == kind).count();
            (n > 0).then(|| format!("{n} {what}"))
        };
        let summary = [
            count(
                crate::markers::MarkerKind::FailedAlloc,
                "failed allocation(s)",
            ),
            count(crate::markers::MarkerKind::Teardown, "teardown(s)"),
            count(crate::markers::MarkerKind::Spike, "spike(s)"),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ");
        // Open once the reader has asked for more (the list is drawn anew then).
        let expanded = shown > MARKER_PAGE;
        let more = (shown < total).then(|| {
            view! {
                <button data-testid="markers-more" on:click=move |_| listed.update(|n| *n += MARKER_PAGE)>
                    {format!("Show {} more", MARKER_PAGE.min(total - shown))}
                </button>
                <button data-testid="markers-all" on:click=move |_| listed.set(total)>"Show all"</button>
            }
        });
        Some(view! {
            <details class="markers" data-testid="marker-list" data-count=total.to_string()
                data-listed=shown.to_string() open=expanded>
                <summary data-testid="marker-summary">{format!("Markers: {shown} of {total} listed · {summary}")}</summary>
                <ul>{items}</ul>
                {more}
            </details>
        })
    }
}

/// The pinned moment: live allocations then, grouped by stack.
#[component]
fn Pinned(a: Arc<TraceData>, vs: RwSignal<ViewState>, origin: u64) -> impl IntoView {
    // The pinned moment is written in the unit of the trace's end, as the markers are.
    let end = a.time_extent().1;
    // Recomputed when the pin or the filters change, not on zoom.
    let key = Memo::new(move |_| {
        vs.with(|s| {
            (
                s.pin_nanos,
                ViewState {
                    process: s.process,
                    device: s.device,
                    thread: s.thread,
                    ..ViewState::default()
                },
            )
        })
    });
    move || {
        let (pin, st) = key.get();
        let t = pin?;
        let f = filter_of(&st);
        let sites = a.live_sites_at(t, &f, 50);
        let total = a.live_bytes_at(t, &f);
        let csv_rows: Vec<Vec<String>> = sites
            .iter()
            .map(|s| {
                vec![
                    s.site.clone(),
                    s.bytes.to_string(),
                    s.count.to_string(),
                    s.frames.join(" <- "),
                ]
            })
            .collect();
        let export = move |_| {
            let csv = to_csv(&["site", "bytes", "count", "stack"], &csv_rows);
            let _ = dom::download_text("gpucollect-pinned.csv", "text/csv", &csv);
        };
        Some(view! {
            <section class="pinned" data-testid="pinned" data-ts=t.to_string()>
                <h3>
                    {format!("Live at {}: ", time_in_unit_of(t.saturating_sub(origin), end - origin))}
                    <span data-testid="pinned-bytes" data-value=total.to_string()>{fmt_bytes(total)}</span>
                    <button on:click=move |_| vs.update(|v| v.pin_nanos = None)>"Unpin"</button>
                    <button data-testid="export-csv" on:click=export>"CSV"</button>
                </h3>
                <table>
                    <caption>"Allocations live at the pinned moment, grouped by call stack"</caption>
                    <thead><tr><th scope="col">"Call site"</th><th scope="col" class="num">"Bytes"</th><th scope="col" class="num">"Count"</th></tr></thead>
                    <tbody>
                        {sites.into_iter().map(|s| view! {
                            <tr>
                                <td><details><summary>{s.site}</summary><ol class="stack">{s.frames.into_iter().map(|f| view! { <li>{f}</li> }).collect_view()}</ol></details></td>
                                <td class="num">{fmt_bytes(s.bytes)}</td>
                                <td class="num">{s.count}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </section>
        })
    }
}
