//! Overview, call sites, leaks, spikes and fragmentation. Each renders from the `Report` and
//! the model as they are today; when the detectors land in `Report` (findings with severity,
//! bounded/unbounded, spikes, fragmentation scores), the tables below read those fields instead
//! of the raw aggregates they use now.

use std::sync::Arc;

use analysis_core::analysis::scopes::ScopeKind;
use analysis_core::analysis::{Finding, Severity};
use analysis_core::report::Report;
use analysis_core::timeline::Timeline;
use analysis_core::units::{fmt_bytes, fmt_bytes_signed, fmt_duration};
use leptos::html;
use leptos::prelude::*;

use super::{Bytes, Ctx, Duration, dom};
use crate::chart::{
    self, ChartSpec, Layer, LayerStyle, PALETTE, Theme, YUnit, filter_of, timeline_spec,
};
use crate::data::{
    AddressStretch, ScopeRow, SiteRow, TraceData, address_layout, fmt_percent, scope_matches,
    shared_labels, site_matches, sort_scope_rows, sort_sites, to_csv,
};
use crate::markers::{Marker, MarkerKind};
use crate::state::{ScopeSortKey, SortKey, View, ViewState};
use crate::ticks::{time_column, time_in_unit_of};

/// Rows shown at most in a table (the CSV export has them all).
const MAX_ROWS: usize = 500;
const SMALL_CHART_PX: u32 = 240;

/// Builds a chart spec and hands it to the callback (the spec borrows from the captures).
pub type SpecFn = Arc<dyn Fn(Theme, &mut dyn FnMut(&ChartSpec<'_>)) + Send + Sync>;

/// A non-interactive chart with PNG and SVG export.
#[component]
pub fn ChartBox(
    spec: SpecFn,
    name: &'static str,
    #[prop(default = SMALL_CHART_PX)] height: u32,
) -> impl IntoView {
    let canvas = NodeRef::<html::Canvas>::new();
    let s1 = spec.clone();
    Effect::new(move |_| {
        let Some(el) = canvas.get() else {
            return;
        };
        let w = dom::available_width(&el);
        s1(dom::theme(), &mut |spec| {
            let _ = dom::draw_canvas(&el, spec, w, height);
        });
    });
    let export_svg = move |_| {
        let w = canvas
            .get_untracked()
            .map_or(900, |c| dom::available_width(&c));
        spec(Theme::LIGHT, &mut |s| {
            if let Ok(svg) = chart::to_svg(s, w, height) {
                let _ =
                    dom::download_text(&format!("gpucollect-{name}.svg"), "image/svg+xml", &svg);
            }
        });
    };
    let export_png = move |_| {
        if let Some(c) = canvas.get_untracked() {
            let _ = dom::export_png(&c, &format!("gpucollect-{name}.png"));
        }
    };
    view! {
        <div class="chart-box">
            <div class="chart-wrap"><canvas node_ref=canvas data-testid=format!("chart-{name}")></canvas></div>
            <div class="toolbar small">
                <button data-testid="export-png" on:click=export_png>"PNG"</button>
                <button data-testid="export-svg" on:click=export_svg>"SVG"</button>
            </div>
        </div>
    }
}

/// A "CSV" button exporting a table.
#[component]
fn CsvButton(
    name: &'static str,
    headers: &'static [&'static str],
    rows: Vec<Vec<String>>,
) -> impl IntoView {
    let export = move |_| {
        let _ = dom::download_text(
            &format!("gpucollect-{name}.csv"),
            "text/csv",
            &to_csv(headers, &rows),
        );
    };
    view! { <button data-testid="export-csv" on:click=export>"CSV"</button> }
}

/// A stack, innermost frame first.
#[component]
fn Stack(frames: Vec<String>) -> impl IntoView {
    view! { <ol class="stack" data-testid="stack">{frames.into_iter().map(|f| view! { <li>{f}</li> }).collect_view()}</ol> }
}

/// Shown in place of a view that needs the detectors' results while they run.
#[component]
pub fn Detecting() -> impl IntoView {
    view! {
        <section class="detecting" data-testid="detecting" aria-busy="true">
            <p class="muted">"Detecting leaks, spikes and fragmentation…"</p>
        </section>
    }
}

/// The view that shows a finding's evidence, and its name for the link.
fn evidence_of(f: &Finding) -> (View, &'static str) {
    use analysis_core::analysis::FindingKind as K;
    match f.kind {
        K::LeakAtExit
        | K::MissedFree
        | K::ThreadExitLeak
        | K::LeakGrowth
        | K::ScopeGrowth
        | K::BoundedGrowth
        | K::TeardownRelease
        | K::LiveAtEnd => (View::Leaks, "leaks"),
        K::ScopeSpikes | K::TimelineSpike | K::HiddenSpike => (View::Spikes, "spikes"),
        K::Fragmentation | K::OutOfMemory | K::Cache => (View::Fragmentation, "fragmentation"),
        _ => (View::Timeline, "timeline"),
    }
}

/// The verdict the overview opens with: one sentence per problem the report found, most
/// harmful first (the report's order), each linked to its evidence; or that the trace is
/// healthy. The same sentences as the "Verdict" of `gpucollect report`.
fn verdict(r: &Report, vs: RwSignal<ViewState>) -> AnyView {
    if r.findings.is_empty() {
        let history = r.analysis.history.describe();
        return view! {
            <section class="verdict healthy" data-testid="verdict" data-healthy="true" aria-label="Verdict">
                <p><strong>"Healthy"</strong>
                    {format!(": no leak, spike, fragmentation or out-of-memory found ({history}).")}</p>
            </section>
        }
        .into_any();
    }
    let items = r
        .findings
        .iter()
        .map(|f| {
            let sev = f.severity.name();
            let (view, view_name) = evidence_of(f);
            let stack = f.stack.map(|s| s.0);
            let scope = (f.kind == analysis_core::analysis::FindingKind::ScopeGrowth)
                .then_some(f.scope.as_ref())
                .flatten()
                .and_then(|name| r.analysis.scopes.iter().position(|s| &s.scope == name))
                .and_then(|i| u32::try_from(i).ok());
            let ts = f.ts_nanos;
            let go = move |_| {
                vs.update(|v| {
                    v.view = view;
                    match view {
                        View::Leaks => {
                            v.open_stack = stack;
                            v.open_scope = scope;
                        }
                        View::Timeline => v.pin_nanos = ts.or(v.pin_nanos),
                        _ => {}
                    }
                });
            };
            let num = |x: Option<f64>| x.map(|v| v.to_string());
            view! {
                <li data-testid="verdict-item" data-kind=f.kind.name() data-severity=sev
                    data-location=f.location.clone() data-stack=stack.map(|s| s.to_string())
                    data-bytes-per-iteration=num(f.bytes_per_iteration)
                    data-bytes-per-hour=num(f.bytes_per_hour)
                    data-seconds-to-full=num(f.seconds_to_full)>
                    <span class=format!("sev sev-{sev}")>{sev}</span>" "
                    <span data-testid="verdict-headline">{f.headline.clone()}</span>" "
                    <a href="#" data-testid="verdict-evidence" data-view=view.slug()
                        on:click=move |e| { e.prevent_default(); go(e) }>{format!("evidence in {view_name} →")}</a>
                </li>
            }
        })
        .collect_view();
    let critical = r.findings.iter().any(|f| f.severity == Severity::Critical);
    verdict_list(critical, items.into_any())
}

/// The verdict's section around its items (one `li` per problem), critical when one is: the
/// overview's and server mode's.
pub fn verdict_list(critical: bool, items: AnyView) -> AnyView {
    view! {
        <section class="verdict" class:critical=critical data-testid="verdict" data-healthy="false" aria-label="Verdict">
            <h2>"Verdict"</h2>
            <ol>{items}</ol>
        </section>
    }
    .into_any()
}

/// The verdict, then trace facts and the top call sites, each linked to its details.
#[component]
pub fn Overview(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let Some(r) = a.report() else {
        return view! { <Detecting /> }.into_any();
    };
    let origin = r.first_ts_nanos;
    let peak_rel = r.peak_ts_nanos.saturating_sub(origin);
    let peak_ts = r.peak_ts_nanos;
    let go_peak = move |_| {
        vs.update(|v| {
            v.view = View::Timeline;
            v.pin_nanos = Some(peak_ts);
        });
    };
    let devices = r
        .devices
        .iter()
        .map(|d| {
            view! {
                <li data-testid="device">
                    {format!("GPU {} {} ", d.device.0, d.name)}
                    {(d.total_bytes > 0).then(|| format!("({}) ", fmt_bytes(d.total_bytes)))}
                    "· peak " <Bytes bytes=d.peak_bytes testid="device-peak" />
                    " · live at end " <Bytes bytes=d.live_at_end_bytes />
                </li>
            }
        })
        .collect_view();
    let processes = r
        .processes
        .iter()
        .map(|p| {
            let exit = match (p.exit_code, p.exit_signal) {
                (Some(c), _) => format!(" · exit {c}"),
                (_, Some(s)) => format!(" · killed by signal {s}"),
                _ if p.exit_status_unknown => " · exited (status unknown)".to_string(),
                _ => String::new(),
            };
            view! { <li>{format!("{} (pid {}) · peak {} · live at end {}{exit}", p.exe, p.pid, fmt_bytes(p.peak_bytes), fmt_bytes(p.live_at_end_bytes))}</li> }
        })
        .collect_view();
    let site_link = |s: &analysis_core::report::SiteBytes, view: View| {
        let label = s.site.clone();
        let stack = s.stack.0;
        let go = move |_| {
            let label = label.clone();
            vs.update(move |v| {
                v.view = view;
                v.open_stack = Some(stack);
                if view == View::Sites {
                    v.search = label;
                }
            });
        };
        view! {
            <li>
                <a href="#" on:click=move |e| { e.prevent_default(); go(e) } data-testid="site-link">{s.site.clone()}</a>
                " · " <Bytes bytes=s.bytes /> {format!(" · {} allocation(s)", s.count)}
            </li>
        }
    };
    let peak_sites = r
        .peak_sites
        .iter()
        .take(5)
        .map(|s| site_link(s, View::Sites))
        .collect_view();
    let end_sites = r
        .live_at_end_sites
        .iter()
        .take(5)
        .map(|s| site_link(s, View::Leaks))
        .collect_view();
    let failed = r.failed_allocations.len();
    // The first failure's largest free block, the number the fragmentation view shows too.
    let first_oom = a.oom_moments().into_iter().next();
    let warnings = r.warnings.clone();
    let score = r.score;
    let grade = r.grade.clone();
    let findings = r
        .findings
        .iter()
        .map(|f| {
            let sev = f.severity.name();
            view! {
                <tr data-testid="finding" data-severity=sev data-kind=f.kind.name() data-value=f.bytes.to_string()>
                    <td><span class=format!("sev sev-{sev}")>{sev}</span></td>
                    <td>{f.kind.name().replace('_', " ")}</td>
                    <td class="site">{f.site.clone()}</td>
                    <td class="num">{fmt_bytes(f.bytes)}</td>
                    <td>{f.message.clone()}<div class="muted">{f.fix.clone()}</div></td>
                </tr>
            }
        })
        .collect_view();
    let has_findings = !r.findings.is_empty();
    view! {
        <section class="overview" data-testid="overview">
            {verdict(r, vs)}
            <div class="cards">
                <div class="card"><h3>"Score"</h3><span class="num" data-testid="ov-score" data-value=score.to_string()>{format!("{score} ({grade})")}</span></div>
                <div class="card"><h3>"Duration"</h3><Duration nanos=r.duration_nanos testid="ov-duration" /></div>
                <div class="card"><h3>"Peak"</h3><Bytes bytes=r.peak_bytes testid="ov-peak" />
                    <div class="muted">"at " <a href="#" data-testid="ov-peak-link" on:click=move |e| { e.prevent_default(); go_peak(e) }>
                        <Duration nanos=peak_rel testid="ov-peak-time" /></a></div></div>
                <div class="card"><h3>"Live at end"</h3><Bytes bytes=r.live_at_end_bytes testid="ov-live-end" />
                    <div class="muted"><span data-testid="ov-live-end-count" data-value=r.live_at_end_count.to_string()>{r.live_at_end_count}</span>" allocation(s)"</div></div>
                <div class="card"><h3>"Allocations"</h3><span class="num" data-testid="ov-allocs" data-value=r.alloc_count.to_string()>{r.alloc_count}</span>
                    <div class="muted"><span data-testid="ov-records" data-value=r.records.to_string()>{r.records}</span>" records"</div></div>
                <div class="card"><h3>"Failed allocations"</h3>
                    <a href="#" on:click=move |e| { e.prevent_default(); vs.update(|v| v.view = View::Fragmentation) }>
                        <span class="num" data-testid="ov-failed" data-value=failed.to_string()>{failed}</span></a>
                    {first_oom.and_then(|o| o.largest_free_bytes.map(|l| view! {
                        <div class="muted">"largest free block at the first: "{largest_free(o.requested_bytes, Some(l), "ov-largest-free")}</div>
                    }))}</div>
            </div>
            {has_findings.then(|| view! {
                <table class="findings" data-testid="ov-findings">
                    <caption>"Findings, most severe first, with the fix for each"</caption>
                    <thead><tr><th scope="col">"Severity"</th><th scope="col">"Kind"</th><th scope="col">"Call site or scope"</th>
                        <th scope="col" class="num">"Bytes"</th><th scope="col">"What and how to fix it"</th></tr></thead>
                    <tbody>{findings}</tbody>
                </table>
            })}
            <h3>"Devices"</h3><ul data-testid="ov-devices">{devices}</ul>
            <h3>"Processes"</h3><ul data-testid="ov-processes">{processes}</ul>
            <h3>"Live at the peak, by call site"</h3><ul data-testid="ov-peak-sites">{peak_sites}</ul>
            <h3>"Still live at the end, by call site"</h3><ul data-testid="ov-end-sites">{end_sites}</ul>
            {(!warnings.is_empty()).then(|| view! {
                <h3>"Warnings"</h3>
                <ul class="warnings" data-testid="ov-warnings">{warnings.into_iter().map(|w| view! { <li>{w}</li> }).collect_view()}</ul>
            })}
        </section>
    }
    .into_any()
}

/// The stretches of an address layout as cells as wide as their bytes (under 0.05 % of the
/// span left out, except the marked gap `widest`).
fn address_cells(layout: &[AddressStretch], widest: Option<usize>) -> AnyView {
    let span: u64 = layout.iter().map(|s| s.bytes).sum();
    let first = layout.first().map_or(0, |s| s.start);
    layout
        .iter()
        .enumerate()
        .filter(|&(i, s)| Some(i) == widest || s.bytes as f64 >= span as f64 * 0.0005)
        .map(|(i, s)| {
            let style = format!(
                "left:{:.4}%;width:{:.4}%",
                (s.start - first) as f64 * 100.0 / span as f64,
                s.bytes as f64 * 100.0 / span as f64
            );
            let title = format!("{} {} at +{}", fmt_bytes(s.bytes), if s.live { "live" } else { "free" }, fmt_bytes(s.start - first));
            view! {
                <span class="addr-stretch" class:live=s.live class:largest=Some(i) == widest
                    data-testid=if Some(i) == widest { "addr-largest" } else { "addr-stretch" }
                    data-live=s.live.to_string() data-bytes=s.bytes.to_string() style=style title=title></span>
            }
        })
        .collect_view()
        .into_any()
}

/// The address map of each device at the pinned moment (the peak when nothing is pinned),
/// where its live allocations lie in one region no larger than the device (as the report's OOM
/// forensics require before they trust address gaps).
#[component]
fn PinnedAddressMaps(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let (origin, end) = a.time_extent();
    let peak = a.model().peak_ts_nanos;
    move || {
        let pin = vs.with(|v| v.pin_nanos);
        let t = pin.unwrap_or(peak);
        let m = a.model();
        let maps = a
            .devices()
            .into_iter()
            .filter_map(|d| {
                let layout = address_layout(m, d, t);
                let span: u64 = layout.iter().map(|s| s.bytes).sum();
                let total = m.devices.iter().find(|x| x.device == d).map(|x| x.total_bytes)?;
                if layout.is_empty() || span > total {
                    return None;
                }
                let free: u64 = layout.iter().filter(|s| !s.live).map(|s| s.bytes).sum();
                let largest = layout.iter().filter(|s| !s.live).map(|s| s.bytes).max().unwrap_or(0);
                let widest = layout.iter().position(|s| !s.live && s.bytes == largest);
                let n_free = layout.iter().filter(|s| !s.live).count();
                Some(view! {
                    <figure class="addr-map-box" data-testid="pinned-addr-map" data-device=d.0.to_string()
                        data-ts=t.to_string() data-free=free.to_string() data-largest=largest.to_string()>
                        <figcaption>{format!("GPU {}: {} from the lowest live address to the highest live end, {} free in {n_free} gap(s), the largest {} (marked)",
                            d.0, fmt_bytes(span), fmt_bytes(free), fmt_bytes(largest))}</figcaption>
                        <div class="addr-map" role="img" aria-label="live allocations and free gaps by address">{address_cells(&layout, widest)}</div>
                    </figure>
                })
            })
            .collect::<Vec<_>>();
        // In the unit of the trace's end, as the timeline writes moments.
        let when = time_in_unit_of(t.saturating_sub(origin), end - origin);
        (!maps.is_empty()).then(|| view! {
            <h3>{if pin.is_some() { format!("Addresses at the pinned moment ({when})") } else { format!("Addresses at the peak ({when}); pin a moment on the timeline to see another") }}</h3>
            {maps}
        })
    }
}

/// The largest free block at a failed allocation against the request ("64 MiB, request
/// 128 MiB larger"), with the raw number for scripts; "not recorded" when unknown.
fn largest_free(requested: u64, largest: Option<u64>, testid: &'static str) -> AnyView {
    match largest {
        Some(l) => view! {
            <span data-testid=testid data-value=l.to_string() data-requested=requested.to_string()>{fmt_bytes(l)}</span>
            <span class="muted">{if requested > l { format!(" (request {} does not fit)", fmt_bytes(requested)) } else { format!(" (request {} fits)", fmt_bytes(requested)) }}</span>
        }
        .into_any(),
        None => "not recorded".into_any(),
    }
}

/// Sortable, searchable table of every call site.
#[component]
pub fn Sites(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let peak = a.model().peak_bytes;
    let header = move |key: SortKey, label: &'static str| {
        let sort = move || vs.with(|v| (v.sort == key).then_some(v.sort_ascending));
        view! {
            <th scope="col" class:num=key != SortKey::Site
                aria-sort=move || match sort() { Some(true) => "ascending", Some(false) => "descending", None => "none" }>
                <button class="sort" data-testid=format!("sort-{}", key.slug()) on:click=move |_| vs.update(|v| {
                    if v.sort == key { v.sort_ascending = !v.sort_ascending } else { v.sort = key; v.sort_ascending = key == SortKey::Site }
                })>{label}{move || match sort() { Some(true) => " ▲", Some(false) => " ▼", None => "" }}</button>
            </th>
        }
    };
    let table = move || {
        let st = vs.get();
        let needle = st.search.to_lowercase();
        let all = a.site_rows(&filter_of(&st));
        let mut rows: Vec<&SiteRow> = all.iter().filter(|s| site_matches(s, &needle)).collect();
        sort_sites(&mut rows, st.sort, st.sort_ascending);
        // Labels several stacks share (counted over every call site the filters admit, so a
        // search does not hide that a label is ambiguous).
        let shared = shared_labels(all.iter());
        let shown = rows.len().min(MAX_ROWS);
        let csv: Vec<Vec<String>> = rows.iter().map(|s| s.sites_csv()).collect();
        let total = rows.len();
        let body = rows
            .into_iter()
            .take(MAX_ROWS)
            .map(|s| {
                let open = st.open_stack == Some(s.stack.0);
                let sharing = shared.get(s.label.as_str()).map(|group| {
                    let n = group.len();
                    let stacks = group
                        .iter()
                        .map(|r| view! {
                            <li data-testid="shared-stack" data-stack=r.stack.0.to_string()>{r.frames.join(" ← ")}</li>
                        })
                        .collect_view();
                    view! {
                        <details class="shared-label" data-testid="shared-label" data-count=n.to_string()>
                            <summary>{format!("{n} stacks share this label")}</summary>
                            <ul>{stacks}</ul>
                        </details>
                    }
                });
                view! {
                    <tr data-testid="site-row" data-stack=s.stack.0.to_string()>
                        <td><details open=open><summary>{s.label.clone()}</summary><Stack frames=s.frames.clone() /></details>{sharing}</td>
                        <td class="num"><Bytes bytes=s.alloc_bytes /></td>
                        <td class="num">{s.alloc_count}</td>
                        <td class="num"><Bytes bytes=s.peak_bytes />" "<span class="muted">{fmt_percent(s.peak_bytes, peak)}</span></td>
                        <td class="num"><Bytes bytes=s.live_bytes /></td>
                        <td class="num"><Bytes bytes=s.max_size_bytes /></td>
                    </tr>
                }
            })
            .collect_view();
        view! {
            <p class="muted" data-testid="sites-count" data-value=total.to_string()>{format!("{shown} of {total} call sites shown")}</p>
            <CsvButton name="call-sites" headers=&SiteRow::SITES_CSV rows=csv />
            <table data-testid="sites-table">
                <caption>"Call sites: bytes allocated, count, contribution to the peak and live at end"</caption>
                <thead><tr>
                    {header(SortKey::Site, "Call site")}
                    {header(SortKey::Bytes, "Allocated")}
                    {header(SortKey::Count, "Count")}
                    {header(SortKey::Peak, "At peak")}
                    {header(SortKey::Live, "Live at end")}
                    {header(SortKey::MaxSize, "Largest")}
                </tr></thead>
                <tbody>{body}</tbody>
            </table>
        }
    };
    view! {
        <section class="sites" data-testid="sites-view">
            {table}
        </section>
    }
}

/// Leaks: the report's growth per scope (NVTX range or call site) with severity, then the call
/// sites with memory still live at the end. Rows expand to a growth chart and the full stack.
#[component]
pub fn Leaks(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    // The live-at-end table is built again when the frame search changes.
    let search = Memo::new(move |_| ctx.vs.with(|v| v.search.clone()));
    let a2 = a.clone();
    let live = move || {
        search.track();
        view! { <LiveAtEndTable a=a2.clone() ctx=ctx /> }
    };
    view! {
        <section class="leaks" data-testid="leaks-view">
            <ScopeGrowthTable a=a.clone() ctx=ctx />
            {live}
        </section>
    }
}

/// The report's scopes (`report.analysis.scopes`): growth, per call, calls, bounded or not,
/// the reference rule and the severity of the finding; sortable, CSV export.
#[component]
fn ScopeGrowthTable(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let filtered = !filter_of(&vs.get_untracked()).is_all();
    let count = a.report().map_or(0, |r| r.analysis.scopes.len());
    let csv: Vec<Vec<String>> = a
        .scope_rows()
        .iter()
        .map(|r| {
            let s = r.scope;
            vec![
                s.scope.clone(),
                scope_kind_name(s.kind).to_string(),
                r.severity.map_or("none", Severity::name).to_string(),
                s.total_growth_bytes.to_string(),
                s.avg_growth_bytes.to_string(),
                s.calls.to_string(),
                s.positive_ratio.to_string(),
                s.tail_growth_bytes.to_string(),
                r.growth_class().to_string(),
                s.reference_leak.to_string(),
                s.explained_by.clone().unwrap_or_default(),
                s.top_site.clone().unwrap_or_default(),
                s.top_site_bytes.to_string(),
                s.top_stack
                    .map(|st| frames_of(&a, st).join(" <- "))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let header = move |key: ScopeSortKey, label: &'static str| {
        let sort = move || vs.with(|v| (v.scope_sort == key).then_some(v.scope_sort_ascending));
        view! {
            <th scope="col" class:num=matches!(key, ScopeSortKey::Growth | ScopeSortKey::PerCall | ScopeSortKey::Calls)
                aria-sort=move || match sort() { Some(true) => "ascending", Some(false) => "descending", None => "none" }>
                <button class="sort" data-testid=format!("scope-sort-{}", key.slug()) on:click=move |_| vs.update(|v| {
                    if v.scope_sort == key {
                        v.scope_sort_ascending = !v.scope_sort_ascending;
                    } else {
                        v.scope_sort = key;
                        v.scope_sort_ascending = key == ScopeSortKey::Scope;
                    }
                })>{label}{move || match sort() { Some(true) => " ▲", Some(false) => " ▼", None => "" }}</button>
            </th>
        }
    };
    let sort = Memo::new(move |_| vs.with(|v| (v.scope_sort, v.scope_sort_ascending)));
    let a2 = a.clone();
    let body = move || {
        let (key, ascending) = sort.get();
        let mut rows = a2.scope_rows();
        // The search keeps the scopes it names or whose top stack has a matching frame.
        let needle = vs.with(|v| v.search.to_lowercase());
        if !needle.is_empty() {
            let matching = a2.stacks_matching(&needle);
            rows.retain(|r| scope_matches(r, &needle, &matching));
        }
        sort_scope_rows(&mut rows, key, ascending);
        rows.into_iter()
            .map(|r| scope_row(&a2, vs, &r))
            .collect_view()
    };
    view! {
        <section data-testid="scopes-section">
            <h3>"Growth per scope"</h3>
            <p class="muted">"From the report: per NVTX range (each instance is one call) or, in a trace without NVTX ranges, "
                "per call site (each allocation is one call). Growth that stopped (warm-up, caches, pools) is bounded, not a leak. "
                "Click a row for its growth over time and the stack that kept the most bytes."</p>
            {filtered.then(|| view! { <p class="muted" data-testid="scopes-unfiltered">"The report covers the whole trace: the process, device and thread filters do not apply to this table."</p> })}
            <CsvButton name="scope-growth" headers=&["scope", "kind", "severity", "total_growth_bytes", "avg_growth_bytes", "calls",
                "positive_ratio", "tail_growth_bytes", "growth", "reference_leak", "explained_by", "top_site", "top_site_bytes", "stack"] rows=csv />
            <table data-testid="scopes-table" class:hidden=count == 0>
                <caption>{format!("{count} scope(s) analysed by the report, largest growth first unless sorted")}</caption>
                <thead><tr>
                    {header(ScopeSortKey::Scope, "Scope or call site")}
                    <th scope="col">"Kind"</th>
                    {header(ScopeSortKey::Severity, "Severity")}
                    {header(ScopeSortKey::Growth, "Total growth")}
                    {header(ScopeSortKey::PerCall, "Per call")}
                    {header(ScopeSortKey::Calls, "Calls")}
                    <th scope="col">"Growth"</th>
                    <th scope="col">"Reference rule"</th>
                </tr></thead>
                <tbody>{body}</tbody>
            </table>
            {(count == 0).then(|| view! { <p class="muted" data-testid="no-scopes">"The report found no scope with enough calls to judge its growth."</p> })}
        </section>
    }
}

fn scope_kind_name(kind: ScopeKind) -> &'static str {
    match kind {
        ScopeKind::NvtxRange => "NVTX range",
        ScopeKind::CallSite => "call site",
    }
}

fn frames_of(a: &TraceData, stack: analysis_core::format::StackId) -> Vec<String> {
    a.trace
        .model
        .stack_frames(stack)
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// One row of the scope table and, when open, its growth chart and stack.
fn scope_row(
    a: &Arc<TraceData>,
    vs: RwSignal<ViewState>,
    r: &ScopeRow<'_>,
) -> impl IntoView + use<> {
    let i = r.index as u32;
    let is_open = move || vs.with(|v| v.open_scope == Some(i));
    let toggle = move |_| {
        vs.update(|v| {
            v.open_scope = if v.open_scope == Some(i) {
                None
            } else {
                Some(i)
            }
        })
    };
    let s = r.scope.clone();
    let sev = r.severity.map_or("none", Severity::name);
    let reference = match (s.reference_leak, &s.explained_by) {
        (true, Some(inner)) => format!("flagged; explained by `{inner}`"),
        (true, None) => "flagged".to_string(),
        (false, _) => "not flagged".to_string(),
    };
    let per_call = s.avg_growth_bytes.round() as i64;
    let a = a.clone();
    let detail = move || {
        is_open().then(|| {
            let (lo, hi) = a.time_extent();
            let scope_series = a.scope_growth(&s).map(Arc::new);
            let site_series = s
                .top_stack
                .map(|st| Arc::new(a.site_growth(st)));
            let scope_label = format!("growth of `{}` calls (running sum)", s.scope);
            let site_label = format!(
                "live bytes of {}",
                s.top_site.clone().unwrap_or_default()
            );
            let spec: SpecFn = Arc::new(move |theme, f| {
                let mut layers = Vec::new();
                if let Some(t) = &scope_series {
                    layers.push(Layer { label: scope_label.clone(), timeline: t, color: PALETTE[2], style: LayerStyle::Band });
                }
                if let Some(t) = &site_series {
                    let style = if layers.is_empty() { LayerStyle::Band } else { LayerStyle::Line };
                    layers.push(Layer { label: site_label.clone(), timeline: t, color: PALETTE[4], style });
                }
                f(&ChartSpec {
                    t0: lo, t1: hi + 1, origin_nanos: lo, layers,
                    gap: None, ranges: Vec::new(), markers: Vec::new(), pin_nanos: None, y_unit: YUnit::Bytes, theme, stack: None, limits: Vec::new(),
                })
            });
            let kept = match (&s.top_site, s.top_stack) {
                (Some(site), Some(stack)) => view! {
                    <p>"Kept the most bytes beyond the calls: " <b>{site.clone()}</b> " · "
                        <Bytes bytes=s.top_site_bytes testid="scope-top-bytes" /></p>
                    <Stack frames=frames_of(&a, stack) />
                }.into_any(),
                _ => view! { <p class="muted">"No call site kept bytes beyond the calls of this scope."</p> }.into_any(),
            };
            view! {
                <tr class="detail" data-testid="scope-detail"><td colspan="8">
                    <ChartBox spec=spec name="scope-growth" />
                    {kept}
                </td></tr>
            }
        })
    };
    view! {
        <tr data-testid="scope-row" data-index=i.to_string() data-scope=r.scope.scope.clone()
            data-kind=scope_kind_name(r.scope.kind) data-severity=sev
            data-total=r.scope.total_growth_bytes.to_string() data-avg=r.scope.avg_growth_bytes.to_string()
            data-calls=r.scope.calls.to_string() data-growth=r.growth_class()
            data-reference=r.scope.reference_leak.to_string()
            class="clickable" on:click=toggle>
            <td><button class="row-toggle" aria-expanded=move || is_open().to_string()>{r.scope.scope.clone()}</button></td>
            <td>{scope_kind_name(r.scope.kind)}</td>
            <td><span class=format!("sev sev-{sev}")>{sev}</span></td>
            <td class="num">{fmt_bytes_signed(r.scope.total_growth_bytes)}</td>
            <td class="num">{fmt_bytes_signed(per_call)}</td>
            <td class="num">{r.scope.calls}</td>
            <td>{r.growth_class()}</td>
            <td>{reference}</td>
        </tr>
        {detail}
    }
}

/// Call sites with memory still live at the end: the leak candidates, with growth charts.
#[component]
fn LiveAtEndTable(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    // The call-site search (or a frame clicked in the icicle) keeps the sites it matches.
    let needle = vs.with_untracked(|v| v.search.to_lowercase());
    let rows: Vec<SiteRow> = a
        .leak_candidates(&filter_of(&vs.get_untracked()))
        .into_iter()
        .filter(|r| site_matches(r, &needle))
        .collect();
    let total_live = a.model().live_at_end_bytes();
    let tensors = a.has_tensor_layer();
    let csv = rows.iter().map(SiteRow::live_csv).collect();
    let count = rows.len();
    let body = rows
        .into_iter()
        .take(MAX_ROWS)
        .map(|s| {
            let stack = s.stack.0;
            let is_open = move || vs.with(|v| v.open_stack == Some(stack));
            let a = a.clone();
            let toggle = move |_| vs.update(|v| v.open_stack = if v.open_stack == Some(stack) { None } else { Some(stack) });
            let frames = s.frames.clone();
            view! {
                <tr data-testid="leak-row" data-stack=stack.to_string() class="clickable" on:click=toggle>
                    <td><button class="row-toggle" aria-expanded=move || is_open().to_string()>
                        {if s.label.is_empty() { "<no stack>".to_string() } else { s.label.clone() }}</button></td>
                    <td class="num"><Bytes bytes=s.live_bytes testid="leak-live" /></td>
                    <td class="num">{fmt_percent(s.live_bytes, total_live)}</td>
                    <td class="num">{fmt_bytes(s.live_per_call())}</td>
                    <td class="num">{s.alloc_count}</td>
                    <td class="num">{format!("{} of {}", s.live_count, s.alloc_count)}</td>
                </tr>
                {move || is_open().then(|| {
                    let growth = Arc::new(a.site_growth(s.stack));
                    let (lo, hi) = a.time_extent();
                    let g = growth.clone();
                    let spec: SpecFn = Arc::new(move |theme, f| {
                        f(&ChartSpec {
                            t0: lo, t1: hi + 1, origin_nanos: lo,
                            layers: vec![Layer { label: "live bytes of this call site".into(), timeline: &g, color: PALETTE[4], style: LayerStyle::Band }],
                            gap: None, ranges: Vec::new(), markers: Vec::new(), pin_nanos: None, y_unit: YUnit::Bytes, theme, stack: None, limits: Vec::new(),
                        })
                    });
                    let frames = frames.clone();
                    view! {
                        <tr class="detail" data-testid="leak-detail"><td colspan="6">
                            <ChartBox spec=spec name="leak-growth" />
                            <Stack frames=frames />
                        </td></tr>
                    }
                })}
            }
        })
        .collect_view();
    view! {
        <section data-testid="live-at-end-section">
            <h3>"Still live at the end, by call site"</h3>
            <p class="muted">"Call sites whose allocations are still live when the trace ends, largest first. "
                "Click a row for its live bytes over time and its full stack."
                {tensors.then_some(" This trace has the framework's tensors: these are tensors (as memory_allocated() counts them); the segments holding them are the reserve.")}</p>
            <CsvButton name="leaks" headers=&SiteRow::LIVE_CSV rows=csv />
            <table data-testid="leaks-table">
                <caption>{format!("{count} call site(s) with memory live at the end")}</caption>
                <thead><tr>
                    <th scope="col">"Call site"</th><th scope="col" class="num">"Live at end"</th><th scope="col" class="num">"Share"</th>
                    <th scope="col" class="num">"Per call"</th><th scope="col" class="num">"Calls"</th><th scope="col" class="num">"Still live"</th>
                </tr></thead>
                <tbody>{body}</tbody>
            </table>
        </section>
    }
}

/// The spikes the report detected and the largest transient allocations, marked on the
/// timeline.
#[component]
pub fn Spikes(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let f = filter_of(&vs.get_untracked());
    let origin = a.time_extent().0;
    let top: Vec<(u64, u64, u64, String)> = a
        .largest_transients(20, &f)
        .into_iter()
        .map(|x| {
            (
                x.ts_nanos,
                x.free_ts_nanos,
                x.size_bytes,
                a.model().stack_label(x.stack),
            )
        })
        .collect();
    // The report's spikes are on the timeline already; the largest transients join them.
    let (lo, hi) = a.time_extent();
    let marked: Vec<u64> = a.markers_in(&f, lo, hi).map(|m| m.ts_nanos).collect();
    let markers: Vec<Marker> = top
        .iter()
        .filter(|(t, ..)| !marked.contains(t))
        .take(10)
        .map(|(t, _, b, _)| Marker {
            ts_nanos: *t,
            label: fmt_bytes(*b),
            kind: MarkerKind::Spike,
            count: 1,
        })
        .collect();
    let a2 = a.clone();
    let spec: SpecFn = Arc::new(move |theme, cb| {
        let st = ViewState {
            range_nanos: None,
            pin_nanos: None,
            ..vs.get_untracked()
        };
        let mut s = timeline_spec(&a2, &st, theme, None);
        s.markers.extend(markers.iter().cloned());
        s.markers.sort_by_key(|m| m.ts_nanos);
        cb(&s);
    });
    let zoom_to = move |t: u64, e: u64| {
        let pad = e.saturating_sub(t).max(1_000_000);
        vs.update(|v| {
            v.view = View::Timeline;
            v.range_nanos = Some((t.saturating_sub(pad), e + pad));
            v.pin_nanos = Some(t);
        });
    };
    let detected = a.detected_spikes();
    let n_detected = detected.len();
    let detected_csv = detected
        .iter()
        .map(|d| {
            vec![
                d.ts_nanos.saturating_sub(origin).to_string(),
                d.size_bytes.to_string(),
                d.live_bytes.to_string(),
                d.duration_nanos.map(|x| x.to_string()).unwrap_or_default(),
                d.timeline_rule.to_string(),
                d.scopes.join(" "),
                d.site.clone(),
            ]
        })
        .collect();
    // Each column of times in one unit (`ticks::time_column`).
    let detected_at = time_column(
        &detected
            .iter()
            .map(|d| d.ts_nanos.saturating_sub(origin))
            .collect::<Vec<_>>(),
    );
    let detected_rows = detected
        .into_iter()
        .zip(detected_at)
        .map(|(d, at)| {
            let (t, e) = (d.ts_nanos, d.ts_nanos + d.duration_nanos.unwrap_or(0));
            let rule = match (d.timeline_rule, d.scopes.is_empty()) {
                (true, true) => "rise and fall of live bytes".to_string(),
                (false, _) => format!("outlier size in {}", d.scopes.join(", ")),
                (true, false) => format!("rise and fall; outlier size in {}", d.scopes.join(", ")),
            };
            view! {
                <tr data-testid="detected-spike-row" class="clickable" on:click=move |_| zoom_to(t, e)
                    data-ts=t.to_string() data-size=d.size_bytes.to_string() data-live=d.live_bytes.to_string()
                    data-timeline=d.timeline_rule.to_string()>
                    <td class="num"><At nanos=t.saturating_sub(origin) label=at /></td>
                    <td class="num"><Bytes bytes=d.size_bytes /></td>
                    <td class="num"><Bytes bytes=d.live_bytes /></td>
                    <td class="num">{d.duration_nanos.map_or_else(|| "–".to_string(), fmt_duration)}</td>
                    <td>{rule}</td>
                    <td>{d.site}</td>
                </tr>
            }
        })
        .collect_view();
    let csv = top
        .iter()
        .map(|(t, e, b, s)| {
            vec![
                t.saturating_sub(origin).to_string(),
                e.saturating_sub(*t).to_string(),
                b.to_string(),
                s.clone(),
            ]
        })
        .collect();
    let top_at = time_column(
        &top.iter()
            .map(|(t, ..)| t.saturating_sub(origin))
            .collect::<Vec<_>>(),
    );
    let body = top
        .into_iter()
        .zip(top_at)
        .map(|((t, e, b, s), at)| {
            view! {
                <tr data-testid="spike-row" class="clickable" on:click=move |_| zoom_to(t, e)>
                    <td class="num"><At nanos=t.saturating_sub(origin) label=at /></td>
                    <td class="num"><Bytes bytes=b /></td>
                    <td class="num">{fmt_duration(e.saturating_sub(t))}</td>
                    <td>{s}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="spikes" data-testid="spikes-view">
            <p class="muted">"Spikes the report detected, and the largest allocations that were freed again: transient memory that sets the peak. Click a row to zoom the timeline on it."</p>
            <ChartBox spec=spec name="spikes" height=300 />
            <section data-testid="detected-spikes-section">
                <h3>"Detected spikes"</h3>
                <CsvButton name="detected-spikes" headers=&["time_nanos", "bytes", "live_bytes", "lasted_nanos", "timeline_rule", "scopes", "site"] rows=detected_csv />
                <table data-testid="detected-spikes-table" class:hidden=n_detected == 0>
                    <caption>{format!("{n_detected} spike(s) detected by the report: sudden rises and falls of live bytes, and allocations far above their scope's usual sizes")}</caption>
                    <thead><tr><th scope="col" class="num">"At"</th><th scope="col" class="num">"Size"</th><th scope="col" class="num">"Live then"</th>
                        <th scope="col" class="num">"Lasted"</th><th scope="col">"Rule"</th><th scope="col">"Call site"</th></tr></thead>
                    <tbody>{detected_rows}</tbody>
                </table>
                {(n_detected == 0).then(|| view! { <p class="muted" data-testid="no-detected-spikes">"The report detected no spike in this trace."</p> })}
            </section>
            <section data-testid="transients-section">
                <h3>"Largest transient allocations"</h3>
                <CsvButton name="spikes" headers=&["time_nanos", "lifetime_nanos", "bytes", "site"] rows=csv />
                <table data-testid="spikes-table">
                    <caption>"Largest transient allocations"</caption>
                    <thead><tr><th scope="col" class="num">"At"</th><th scope="col" class="num">"Size"</th><th scope="col" class="num">"Lived"</th><th scope="col">"Call site"</th></tr></thead>
                    <tbody>{body}</tbody>
                </table>
            </section>
        </section>
    }
}

/// Reserved vs allocated over time, the unused share, and each out-of-memory moment.
#[component]
pub fn Fragmentation(a: Arc<TraceData>, ctx: Ctx) -> impl IntoView {
    let origin = a.time_extent().0;
    let (lo, hi) = a.time_extent();
    let has_pools = !a.pools.is_empty();
    // Unused share of the reserved pool memory, per pool series, in ten-thousandths.
    let ratios: Vec<(String, Arc<Timeline>)> = a
        .pools
        .iter()
        .map(|((p, d), s)| {
            let mut t = Timeline::new();
            for (ts, r) in s.reserved.points() {
                let used = s.used.value_at(ts);
                let ratio = if r == 0 {
                    0
                } else {
                    (r.saturating_sub(used) as u128 * 10_000 / u128::from(r)) as u64
                };
                t.push(ts, ratio);
            }
            t.build_index();
            (
                format!("unused share · process {} · GPU {}", p.0, d.0),
                Arc::new(t),
            )
        })
        .collect();
    let a2 = a.clone();
    let pools_spec: SpecFn = Arc::new(move |theme, cb| {
        let mut layers = Vec::new();
        for (i, ((p, d), s)) in a2.pools.iter().enumerate() {
            layers.push(Layer {
                label: format!("reserved · process {} · GPU {}", p.0, d.0),
                timeline: &s.reserved,
                color: PALETTE[(2 * i + 4) % 8],
                style: LayerStyle::Line,
            });
            layers.push(Layer {
                label: format!("allocated · process {} · GPU {}", p.0, d.0),
                timeline: &s.used,
                color: PALETTE[(2 * i) % 8],
                style: LayerStyle::Band,
            });
        }
        cb(&ChartSpec {
            t0: lo,
            t1: hi + 1,
            origin_nanos: lo,
            layers,
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
    let ratio_spec: SpecFn = Arc::new(move |theme, cb| {
        let layers = ratios
            .iter()
            .enumerate()
            .map(|(i, (l, t))| Layer {
                label: l.clone(),
                timeline: t,
                color: PALETTE[(i + 2) % 8],
                style: LayerStyle::Line,
            })
            .collect();
        cb(&ChartSpec {
            t0: lo,
            t1: hi + 1,
            origin_nanos: lo,
            layers,
            gap: None,
            ranges: Vec::new(),
            markers: Vec::new(),
            pin_nanos: None,
            y_unit: YUnit::Permyriad,
            theme,
            stack: None,
            limits: Vec::new(),
        });
    });
    let ooms = a.oom_moments();
    let csv = ooms
        .iter()
        .map(|o| {
            vec![
                o.ts_nanos.saturating_sub(origin).to_string(),
                o.device.0.to_string(),
                o.requested_bytes.to_string(),
                o.live_bytes.to_string(),
                o.device_free_bytes
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                o.pool_slack_bytes
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                o.largest_free_bytes
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                o.site.clone(),
            ]
        })
        .collect();
    let opt = |v: Option<u64>| v.map_or_else(|| "not recorded".to_string(), fmt_bytes);
    let oom_at = time_column(
        &ooms
            .iter()
            .map(|o| o.ts_nanos.saturating_sub(origin))
            .collect::<Vec<_>>(),
    );
    let oom_rows = ooms
        .iter()
        .zip(oom_at.iter().cloned())
        .map(|(o, at)| {
            view! {
                <tr data-testid="oom-row">
                    <td class="num"><At nanos=o.ts_nanos.saturating_sub(origin) label=at /></td>
                    <td class="num">{o.device.0}</td>
                    <td class="num"><Bytes bytes=o.requested_bytes testid="oom-requested" /></td>
                    <td class="num">{fmt_bytes(o.live_bytes)}</td>
                    <td class="num">{opt(o.device_free_bytes)}</td>
                    <td class="num">{opt(o.pool_slack_bytes)}</td>
                    <td class="num">{largest_free(o.requested_bytes, o.largest_free_bytes, "oom-largest-free")}</td>
                    <td>{o.site.clone()}</td>
                </tr>
            }
        })
        .collect_view();
    // Where the report knows the largest free block, the device's address range then: live
    // allocations and the free gaps between them, the largest gap marked.
    let maps = ooms
        .iter()
        .zip(oom_at)
        .filter_map(|(o, at)| {
            let largest = o.largest_free_bytes?;
            let layout = address_layout(a.model(), o.device, o.ts_nanos);
            let span: u64 = layout.iter().map(|s| s.bytes).sum();
            layout.first()?;
            let free: u64 = layout.iter().filter(|s| !s.live).map(|s| s.bytes).sum();
            let n_free = layout.iter().filter(|s| !s.live).count();
            let widest = layout.iter().position(|s| !s.live && s.bytes == largest);
            let cells = address_cells(&layout, widest);
            Some(view! {
                <figure class="addr-map-box" data-testid="addr-map" data-free=free.to_string() data-live=(span - free).to_string()>
                    <figcaption>{format!("GPU {} at {at}: {} from the lowest live address to the highest live end, {} free in {n_free} gap(s); the largest ({}, marked) against the {} request",
                        o.device.0, fmt_bytes(span), fmt_bytes(free), fmt_bytes(largest), fmt_bytes(o.requested_bytes))}</figcaption>
                    <div class="addr-map" role="img" aria-label="live allocations and free gaps by address">{cells}</div>
                </figure>
            })
        })
        .collect_view();
    let n_ooms = ooms.len();
    view! {
        <section class="fragmentation" data-testid="fragmentation-view">
            {if has_pools {
                view! {
                    <h3>"Pool memory: reserved vs allocated"</h3>
                    <ChartBox spec=pools_spec name="pools" />
                    <h3>"Reserved but unused (share of reserved)"</h3>
                    <ChartBox spec=ratio_spec name="unused-share" height=180 />
                }.into_any()
            } else {
                view! { <p class="muted" data-testid="no-pools">"This trace has no pool samples: reserved vs allocated is not known."</p> }.into_any()
            }}
            <h3>"Out-of-memory moments"</h3>
            <p class="muted">"The largest free block is the widest gap between the device allocations live at the failure, by address: a request larger than it fails however much is free in all. Where the addresses do not tell, the device free memory (NVML) and the pool's reserved-but-unused bytes bound it."</p>
            <CsvButton name="oom" headers=&["time_nanos", "device", "requested_bytes", "live_bytes", "device_free_bytes", "pool_unused_bytes", "largest_free_block_bytes", "site"] rows=csv />
            <table data-testid="oom-table">
                <caption>{format!("{n_ooms} failed allocation(s)")}</caption>
                <thead><tr><th scope="col" class="num">"At"</th><th scope="col" class="num">"GPU"</th><th scope="col" class="num">"Requested"</th>
                    <th scope="col" class="num">"Live then"</th><th scope="col" class="num">"Device free"</th><th scope="col" class="num">"Pool unused"</th><th scope="col" class="num">"Largest free block"</th><th scope="col">"Call site"</th></tr></thead>
                <tbody>{oom_rows}</tbody>
            </table>
            {maps}
            <PinnedAddressMaps a=a.clone() ctx=ctx />
        </section>
    }
}

/// A time since the trace start, written as its column writes them (`ticks::time_column`),
/// with the raw nanoseconds for scripts.
#[component]
fn At(nanos: u64, label: String) -> impl IntoView {
    view! { <span class="num" data-value=nanos.to_string()>{label}</span> }
}
