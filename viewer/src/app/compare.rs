//! Compare: a second trace beside the open one, as `gpucollect diff` compares them. The second
//! file is chosen (or dropped onto the view) and read through the same loader as the first; its
//! report is diffed against the open one's (`analysis_core::analysis::diff`): peak, live at end
//! and score, both device-memory timelines on one axis (each from its own start), the call sites
//! whose bytes changed, and the findings that appeared or went away.

use std::sync::Arc;

use analysis_core::analysis::diff::{Change, ReportDiff, diff};
use analysis_core::analysis::{Finding, Severity};
use analysis_core::timeline::Timeline;
use analysis_core::units::{fmt_bytes, fmt_bytes_signed};
use leptos::prelude::*;

use super::Ctx;
use super::load::{self, LoadState, Source};
use super::views::{ChartBox, SpecFn};
use crate::chart::{ChartSpec, Layer, LayerStyle, PALETTE, YUnit};
use crate::data::TraceData;

/// Call-site changes shown at most (the diff keeps the largest).
const MAX_SITE_ROWS: usize = 50;

/// The Compare view of the open trace `a`.
#[component]
pub fn Compare(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let other: RwSignal<Option<Arc<TraceData>>> = RwSignal::new(None);
    let state = RwSignal::new(LoadState::Idle);
    let other_detected = RwSignal::new(0u64);
    let generation = StoredValue::new(0u64);
    let open = move |file: web_sys::File| {
        generation.update_value(|g| *g += 1);
        let my = generation.get_value();
        let name = file.name();
        let total = file.size() as u64;
        other.set(None);
        state.set(LoadState::Loading(load::Progress::starting(
            name.clone(),
            Some(total),
        )));
        let src = Source::Blob(load::BlobReader::new(file.into()));
        leptos::task::spawn_local(async move {
            let current = move || generation.get_value() == my;
            match load::decode(src, name, Some(total), state, &current).await {
                Ok(Some(b)) => {
                    if current() {
                        b.detect();
                        other.set(Some(b));
                        other_detected.update(|n| *n += 1);
                    }
                }
                Ok(None) => {}
                Err(msg) => state.set(LoadState::Failed(msg)),
            }
        });
    };
    let on_change = move |e: leptos::ev::Event| {
        let file = event_target::<web_sys::HtmlInputElement>(&e)
            .files()
            .and_then(|l| l.get(0));
        if let Some(f) = file {
            open(f);
        }
    };
    // A file dropped here is the one to compare with, not a new trace to open.
    let on_drop = move |e: leptos::ev::DragEvent| {
        e.prevent_default();
        e.stop_propagation();
        if let Some(f) = e
            .data_transfer()
            .and_then(|d| d.files())
            .and_then(|l| l.get(0))
        {
            open(f);
        }
    };
    let on_dragover = move |e: leptos::ev::DragEvent| {
        e.prevent_default();
        e.stop_propagation();
    };
    let a2 = a.clone();
    let body = move || {
        ctx.detections.track();
        other_detected.track();
        let b = other.get()?;
        let (Some(before), Some(after)) = (a2.report(), b.report()) else {
            return Some(
                view! { <p class="muted" data-testid="compare-waiting">"Detecting…"</p> }
                    .into_any(),
            );
        };
        let d = diff(before, after);
        Some(result(&a2, &b, &d).into_any())
    };
    let status = move || {
        match state.get() {
        LoadState::Loading(p) => Some(
            view! { <p class="muted" data-testid="compare-loading">{format!("Reading {}…", p.source)}</p> }
                .into_any(),
        ),
        LoadState::Failed(msg) => Some(
            view! { <p class="error-panel" role="alert" data-testid="compare-error">{format!("The second trace could not be read: {msg}")}</p> }
                .into_any(),
        ),
        _ => None,
    }
    };
    let name = a.source.clone();
    view! {
        <section class="compare" data-testid="compare-view" on:drop=on_drop on:dragover=on_dragover>
            <p class="muted">
                {format!("Compare {name} (before) with a second trace or PyTorch snapshot (after): choose it or drop it here. Nothing is uploaded.")}
            </p>
            <label class="button">
                "Choose a trace to compare with…"
                <input type="file" data-testid="compare-input" accept=".msgpack,.pickle,.json,application/octet-stream" on:change=on_change />
            </label>
            {status}
            {body}
        </section>
    }
}

/// The comparison of `a` (before) with `b` (after).
fn result(a: &Arc<TraceData>, b: &Arc<TraceData>, d: &ReportDiff) -> impl IntoView + use<> {
    let row = |what: &'static str, c: Change, testid: &'static str| {
        view! {
            <tr data-testid=testid data-before=c.before.to_string() data-after=c.after.to_string() data-delta=c.delta.to_string()>
                <th scope="row">{what}</th>
                <td class="num">{fmt_bytes(c.before)}</td>
                <td class="num">{fmt_bytes(c.after)}</td>
                <td class="num">{fmt_bytes_signed(c.delta)}</td>
            </tr>
        }
    };
    let score = d.score;
    let totals = view! {
        <table data-testid="compare-totals">
            <thead><tr><th scope="col">""</th><th scope="col" class="num">"Before"</th><th scope="col" class="num">"After"</th><th scope="col" class="num">"Change"</th></tr></thead>
            <tbody>
                {row("Peak", d.peak_bytes, "compare-peak")}
                {row("Live at end", d.live_at_end_bytes, "compare-live-end")}
                <tr data-testid="compare-score">
                    <th scope="row">"Score"</th>
                    <td class="num">{format!("{} ({})", score.before, d.grade_before)}</td>
                    <td class="num">{format!("{} ({})", score.after, d.grade_after)}</td>
                    <td class="num">{format!("{:+}", score.delta)}</td>
                </tr>
            </tbody>
        </table>
    };
    // Both device-memory totals from their own starts, on one axis.
    let shifted = |t: &TraceData| -> Arc<Timeline> {
        let m = &t.trace.model;
        let start = m.first_ts_nanos;
        let mut s = Timeline::new();
        for (ts, v) in m.total.points() {
            s.push(ts.saturating_sub(start), v);
        }
        s.build_index();
        Arc::new(s)
    };
    let (ta, tb) = (shifted(a), shifted(b));
    let span = |t: &TraceData| t.trace.model.duration_nanos();
    let end = span(a).max(span(b)).max(1);
    let names = (
        format!("before: {}", a.source),
        format!("after: {}", b.source),
    );
    let spec: SpecFn = Arc::new(move |theme, cb| {
        cb(&ChartSpec {
            t0: 0,
            t1: end + 1,
            origin_nanos: 0,
            layers: vec![
                Layer {
                    label: names.0.clone(),
                    timeline: &ta,
                    color: PALETTE[0],
                    style: LayerStyle::Line,
                },
                Layer {
                    label: names.1.clone(),
                    timeline: &tb,
                    color: PALETTE[1],
                    style: LayerStyle::Line,
                },
            ],
            gap: None,
            ranges: Vec::new(),
            markers: Vec::new(),
            pin_nanos: None,
            y_unit: YUnit::Bytes,
            theme,
            stack: None,
            limits: Vec::new(),
        });
    });
    let sites = d
        .sites
        .iter()
        .take(MAX_SITE_ROWS)
        .map(|s| {
            view! {
                <tr data-testid="compare-site" data-peak-delta=s.peak_bytes.delta.to_string()>
                    <td title=s.frames.join("\n")>{s.site.clone()}</td>
                    <td class="num">{fmt_bytes(s.peak_bytes.before)}</td>
                    <td class="num">{fmt_bytes(s.peak_bytes.after)}</td>
                    <td class="num">{fmt_bytes_signed(s.peak_bytes.delta)}</td>
                    <td class="num">{fmt_bytes_signed(s.live_at_end_bytes.delta)}</td>
                    <td class="num">{fmt_bytes_signed(s.alloc_bytes.delta)}</td>
                </tr>
            }
        })
        .collect_view();
    let n_sites = d.sites.len();
    let findings = |list: &[Finding], testid: &'static str| {
        list.iter()
            .filter(|f| f.severity != Severity::Info)
            .map(|f| {
                view! {
                    <li data-testid=testid>{format!("{} {} at {}: {}", f.severity.name(), f.kind.name(), f.site, fmt_bytes(f.bytes))}</li>
                }
            })
            .collect_view()
    };
    let new = findings(&d.new_findings, "compare-new-finding");
    let gone = findings(&d.resolved_findings, "compare-resolved-finding");
    let none = |list: &[Finding]| !list.iter().any(|f| f.severity != Severity::Info);
    let (no_new, no_gone) = (none(&d.new_findings), none(&d.resolved_findings));
    view! {
        <div data-testid="compare-result">
            {totals}
            <h3>"Device memory, each from its own start"</h3>
            <ChartBox spec=spec name="compare" />
            <h3>"Problems"</h3>
            <p>"New in the second trace:"</p>
            {if no_new { view! { <p class="muted" data-testid="compare-no-new">"none"</p> }.into_any() } else { view! { <ul>{new}</ul> }.into_any() }}
            <p>"Gone from it:"</p>
            {if no_gone { view! { <p class="muted" data-testid="compare-no-resolved">"none"</p> }.into_any() } else { view! { <ul>{gone}</ul> }.into_any() }}
            <div class="table-scroll">
                <table data-testid="compare-sites">
                    <caption>{format!("{n_sites} call site(s) changed (largest first, matched by their whole stack)")}</caption>
                    <thead><tr><th scope="col">"Call site"</th><th scope="col" class="num">"Peak before"</th><th scope="col" class="num">"Peak after"</th>
                        <th scope="col" class="num">"Peak change"</th><th scope="col" class="num">"Live at end change"</th><th scope="col" class="num">"Allocated change"</th></tr></thead>
                    <tbody>{sites}</tbody>
                </table>
            </div>
        </div>
    }
}
