//! "Memory by stack": the live allocations of one moment (the peak, the pinned moment or the
//! end) as an icicle graph, outermost frames at the top, each cell as wide as its share of the
//! bytes live then. A click on a cell filters the timeline's stacked call sites and the
//! call-site and leak tables to the stacks with that frame (the call-site search, so the
//! search box shows it and clears it).

use std::sync::Arc;

use analysis_core::units::fmt_bytes;
use leptos::prelude::*;

use super::Ctx;
use crate::chart::filter_of;
use crate::data::TraceData;
use crate::flame::Flame;
use crate::ticks::time_in_unit_of;

/// Height of a row of cells, CSS pixels.
const ROW_PX: u32 = 20;
/// Cells narrower than this share of the moment's bytes are left out (with what is under them).
const MIN_WIDTH: f64 = 0.002;

/// Which moment the graph shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moment {
    Peak,
    Pinned,
    End,
}

impl Moment {
    const fn slug(self) -> &'static str {
        match self {
            Self::Peak => "peak",
            Self::Pinned => "pinned",
            Self::End => "end",
        }
    }
}

/// The icicle graph of the live memory at the peak, the pinned moment or the end.
#[component]
pub fn Stacks(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let moment = RwSignal::new(if vs.with_untracked(|v| v.pin_nanos.is_some()) {
        Moment::Pinned
    } else {
        Moment::Peak
    });
    let (lo, hi) = a.time_extent();
    let peak = a.model().peak_ts_nanos;
    let choice = move |m: Moment, label: &'static str| {
        let disabled = move || m == Moment::Pinned && vs.with(|v| v.pin_nanos.is_none());
        view! {
            <button data-testid=format!("moment-{}", m.slug()) class:active=move || moment.get() == m
                aria-pressed=move || (moment.get() == m).to_string()
                disabled=disabled on:click=move |_| moment.set(m)>{label}</button>
        }
    };
    let graph = move || {
        let (m, pin, search, f) = (
            moment.get(),
            vs.with(|v| v.pin_nanos),
            vs.with(|v| v.search.clone()),
            vs.with(filter_of),
        );
        let t = match m {
            Moment::Peak => peak,
            Moment::Pinned => pin.unwrap_or(peak),
            Moment::End => hi,
        };
        let needle = search.to_lowercase();
        let mut sites = a.live_sites_at(t, &f, usize::MAX);
        // The search keeps the stacks with a frame that holds it, as in the other views.
        if !needle.is_empty() {
            let matching = a.stacks_matching(&needle);
            sites.retain(|s| matching.binary_search(&s.stack).is_ok());
        }
        let flame = Flame::from_stacks(sites.iter().map(|s| (s.frames.as_slice(), s.bytes)));
        let total = flame.total_bytes();
        let pick = move |label: String| {
            vs.update(|v| {
                v.search = if v.search == label {
                    String::new()
                } else {
                    label
                }
            });
        };
        view! {
            <p data-testid="flame-total" data-value=total.to_string() data-ts=t.to_string() data-moment=m.slug()>
                {format!("{} live at {}", fmt_bytes(total), time_in_unit_of(t.saturating_sub(lo), hi - lo))}
            </p>
            {icicle(&flame, &needle, Some(pick))}
        }
    };
    view! {
        <section class="stacks" data-testid="stacks-view">
            <div class="toolbar">
                {choice(Moment::Peak, "At the peak")}
                {choice(Moment::Pinned, "At the pinned moment")}
                {choice(Moment::End, "At the end")}
                <span class="spacer"></span>
                {move || {
                    let q = vs.with(|v| v.search.clone());
                    (!q.is_empty()).then(|| view! {
                        <span data-testid="frame-filter">{format!("Filtered to “{q}” ")}
                            <button on:click=move |_| vs.update(|v| v.search.clear())>"Clear"</button></span>
                    })
                }}
            </div>
            <p class="hint muted">"Outermost frames at the top; a cell's width is its share of the bytes live then. "
                "Click a frame to keep the call sites under it in the timeline and the tables."</p>
            {graph}
        </section>
    }
}

/// The icicle's cells of `flame` (those narrower than [`MIN_WIDTH`] of its bytes left out),
/// outermost frames at the top. With `pick`, each cell is a button that calls it with its frame,
/// and the cells whose frame is `selected` (lower case) are marked.
pub(super) fn icicle(
    flame: &Flame,
    selected: &str,
    pick: Option<impl Fn(String) + Clone + Send + Sync + 'static>,
) -> AnyView {
    let cells = flame.cells(MIN_WIDTH);
    let depth = cells.iter().map(|c| c.depth + 1).max().unwrap_or(0);
    let cells = cells
        .into_iter()
        .map(|c| {
            let style = format!(
                "left:{:.4}%;width:{:.4}%;top:{}px;height:{}px",
                c.start * 100.0,
                c.width * 100.0,
                c.depth * ROW_PX,
                ROW_PX - 1
            );
            let title = format!("{} · {} ({:.1} %)", c.label, fmt_bytes(c.bytes), c.width * 100.0);
            let data_label = c.label.clone();
            match pick.clone() {
                Some(pick) => {
                    let label = c.label.clone();
                    let is_selected = !selected.is_empty() && c.label.to_lowercase() == selected;
                    view! {
                        <button class="flame-cell" class:selected=is_selected data-testid="flame-cell"
                            data-depth=c.depth.to_string() data-bytes=c.bytes.to_string() data-label=data_label
                            style=style title=title.clone() aria-label=title on:click=move |_| pick(label.clone())>
                            {c.label}
                        </button>
                    }
                    .into_any()
                }
                None => view! {
                    <div class="flame-cell" data-testid="flame-cell" data-depth=c.depth.to_string()
                        data-bytes=c.bytes.to_string() data-label=data_label style=style title=title>
                        {c.label}
                    </div>
                }
                .into_any(),
            }
        })
        .collect_view();
    view! {
        <div class="flame" data-testid="flame" role="group" aria-label="Live memory by stack"
            style=format!("height:{}px", depth * ROW_PX)>
            {cells}
        </div>
    }
    .into_any()
}
