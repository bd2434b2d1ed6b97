//! Server mode's page: a trace the page does not download, shown from what `gpucollect serve`
//! answers about it (`crate::served`): the verdict, the timeline at the zoomed window's
//! resolution (asked again at each zoom step), the live memory by call site at a pinned
//! moment and by stack (an icicle) at the peak, the pinned moment or the end, and the report's
//! call-site table and growth per scope. Wheel, the toolbar and the keys zoom and pan as on the local timeline; a click pins.

use std::sync::Arc;

use analysis_core::timeline::Timeline;
use analysis_core::units::{fmt_bytes, fmt_bytes_signed, fmt_duration};
use leptos::ev;
use leptos::html;
use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use super::{Ctx, ZoomButtons, dom};
use crate::chart::{self, ChartSpec, Layer, LayerStyle, Mapper, PALETTE, YUnit};
use crate::data::fmt_percent;
use crate::served::{self, LiveAt, LiveSite, ScopeDigest, SiteDigest, Summary, Window};

/// Canvas height, CSS pixels.
const HEIGHT_PX: u32 = 380;
/// Call sites asked for at a pinned moment.
const LIVE_SITES: usize = 50;
/// Series drawn besides the total.
const MAX_SERIES: usize = 8;
/// Call sites asked for to draw the memory by stack (the API's most).
const STACK_SITES: usize = 10_000;

/// Which moment the memory by stack shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StackMoment {
    Peak,
    Pinned,
    End,
}

impl StackMoment {
    const fn slug(self) -> &'static str {
        match self {
            Self::Peak => "peak",
            Self::Pinned => "pinned",
            Self::End => "end",
        }
    }
}

/// A trace opened in server mode.
pub struct Served {
    /// The trace's URL, as the address gave it.
    pub url: String,
    /// Its size, when the server said.
    pub bytes: Option<u64>,
    /// The largest trace this page downloads itself.
    pub max_download: u64,
    /// Whether the address asked for server mode (else the size chose it).
    pub asked: bool,
    pub summary: Summary,
}

impl Served {
    /// The whole trace's window.
    pub fn extent(&self) -> (u64, u64) {
        (self.summary.t0, self.summary.t1.saturating_add(1))
    }

    fn endpoint(&self, name: &str, params: &str) -> String {
        served::endpoint(&self.url, name, params).unwrap_or_default()
    }
}

/// GETs `url` as text; a refusal in the server's words (its `{"error": …}`), a failure to
/// connect in ours.
pub async fn get_text(url: &str) -> Result<String, String> {
    let resp = JsFuture::from(window().fetch_with_str(url))
        .await
        .map_err(|e| {
            format!(
                "the server did not answer ({}); check that it still runs and reload: {url}",
                dom::js_error(&e)
            )
        })?;
    let resp: web_sys::Response = resp.unchecked_into();
    let text = match resp.text() {
        Ok(p) => JsFuture::from(p)
            .await
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    if resp.ok() {
        return Ok(text);
    }
    let said = served::parse::<ServerError>("error", &text)
        .map(|e| e.error)
        .unwrap_or_else(|_| resp.status_text());
    Err(format!("the server answered {}: {said}", resp.status()))
}

#[derive(serde::Deserialize)]
struct ServerError {
    error: String,
}

/// Asks the server for the summary of the trace at `url`.
pub async fn open(
    url: String,
    bytes: Option<u64>,
    max_download: u64,
    asked: bool,
) -> Result<Served, String> {
    let Some(at) = served::endpoint(&url, "summary", "") else {
        return Err(format!(
            "the address asks for server mode, but {url} is not a trace of a gpucollect server \
             (…/api/v1/traces/<id>); open it without mode=server"
        ));
    };
    let summary: Summary = served::parse("summary", &get_text(&at).await?)?;
    Ok(Served {
        url,
        bytes,
        max_download,
        asked,
        summary,
    })
}

/// Why the page is in server mode, in one sentence.
fn mode_sentence(s: &Served) -> String {
    let size = s
        .bytes
        .map(|b| format!(" ({})", fmt_bytes(b)))
        .unwrap_or_default();
    if s.asked {
        format!(
            "Server mode: as the address asks (mode=server), this trace{size} stays on the \
             server, which analysed it; the page shows its answers."
        )
    } else {
        format!(
            "Server mode: this trace{size} is larger than a page opens itself ({}), so it stays \
             on the server, which analysed it; the page shows its answers.",
            fmt_bytes(s.max_download)
        )
    }
}

/// The verdict: the report's findings, most harmful first, or that the trace is healthy.
fn verdict(s: &Served) -> AnyView {
    let f = &s.summary.report.findings;
    if f.is_empty() {
        return view! {
            <section class="verdict healthy" data-testid="verdict" data-healthy="true" aria-label="Verdict">
                <p><strong>"Healthy"</strong>": no leak, spike, fragmentation or out-of-memory found."</p>
            </section>
        }
        .into_any();
    }
    let critical = f.iter().any(|x| x.severity == "critical");
    let items = f
        .iter()
        .map(|x| {
            view! {
                <li data-testid="verdict-item" data-kind=x.kind.clone() data-severity=x.severity.clone()
                    data-location=x.location.clone()>
                    <span class=format!("sev sev-{}", x.severity)>{x.severity.clone()}</span>" "
                    <span data-testid="verdict-headline">{x.headline.clone()}</span>
                    {(!x.fix.is_empty()).then(|| view! { <span class="muted">" "{x.fix.clone()}</span> })}
                </li>
            }
        })
        .collect_view();
    super::views::verdict_list(critical, items.into_any())
}

/// A table of call sites, largest first, each row marked `row_testid` and titled with its
/// stack.
fn sites_table(sites: &[LiveSite], row_testid: &'static str) -> AnyView {
    let rows = sites
        .iter()
        .map(|x| {
            view! {
                <tr data-testid=row_testid data-bytes=x.bytes.to_string()>
                    <td title=x.frames.join("\n")>{x.site.clone()}</td>
                    <td class="num">{fmt_bytes(x.bytes)}</td>
                    <td class="num">{x.count}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table><thead><tr><th>"Call site"</th><th>"Bytes"</th><th>"Allocations"</th></tr></thead>
        <tbody>{rows}</tbody></table>
    }
    .into_any()
}

/// The report's call sites at one moment (the peak, the end), under `title`.
fn report_sites(title: String, testid: &'static str, sites: &[LiveSite]) -> AnyView {
    if sites.is_empty() {
        return ().into_any();
    }
    view! {
        <section data-testid=testid>
            <h3>{title}</h3>
            {sites_table(sites, "served-site-row")}
        </section>
    }
    .into_any()
}

/// The report's call-site table: allocated, count, at the peak, live at the end, largest.
fn call_sites(sites: &[SiteDigest], peak: u64) -> AnyView {
    if sites.is_empty() {
        return ().into_any();
    }
    let rows = sites
        .iter()
        .map(|x| {
            view! {
                <tr data-testid="served-callsite-row" data-peak=x.peak_bytes.to_string()
                    data-allocated=x.alloc_bytes.to_string()>
                    <td title=x.frames.join("\n")>{x.site.clone()}</td>
                    <td class="num">{fmt_bytes(x.alloc_bytes)}</td>
                    <td class="num">{x.alloc_count}</td>
                    <td class="num">{fmt_bytes(x.peak_bytes)}" "<span class="muted">{fmt_percent(x.peak_bytes, peak)}</span></td>
                    <td class="num">{fmt_bytes(x.live_at_end_bytes)}</td>
                    <td class="num">{fmt_bytes(x.max_size_bytes)}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section data-testid="served-callsites">
            <h3>"Call sites"</h3>
            <table>
                <caption>{format!("The report's {} call sites with the most bytes at the peak (then live at the end, then allocated)", sites.len())}</caption>
                <thead><tr><th scope="col">"Call site"</th><th scope="col" class="num">"Allocated"</th>
                    <th scope="col" class="num">"Count"</th><th scope="col" class="num">"At peak"</th>
                    <th scope="col" class="num">"Live at end"</th><th scope="col" class="num">"Largest"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
    .into_any()
}

/// The report's growth per scope (NVTX range, or call site in a trace without ranges).
fn scopes(scopes: &[ScopeDigest]) -> AnyView {
    if scopes.is_empty() {
        return ().into_any();
    }
    let rows = scopes
        .iter()
        .map(|x| {
            let kind = if x.kind == "nvtx_range" {
                "NVTX range"
            } else {
                "call site"
            };
            let kept = x.top_site.as_ref().map_or_else(String::new, |site| {
                format!("{site} ({})", fmt_bytes(x.top_site_bytes))
            });
            view! {
                <tr data-testid="served-scope-row" data-total=x.total_growth_bytes.to_string()>
                    <td>{x.scope.clone()}</td>
                    <td>{kind}</td>
                    <td class="num">{fmt_bytes_signed(x.total_growth_bytes)}</td>
                    <td class="num">{fmt_bytes_signed(x.avg_growth_bytes.round() as i64)}</td>
                    <td class="num">{x.calls}</td>
                    <td>{x.verdict()}</td>
                    <td>{kept}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section data-testid="served-scopes">
            <h3>"Growth per scope"</h3>
            <table>
                <caption>"Per NVTX range (each instance is one call) or, in a trace without NVTX ranges, per call site (each allocation is one call), largest growth first"</caption>
                <thead><tr><th scope="col">"Scope or call site"</th><th scope="col">"Kind"</th>
                    <th scope="col" class="num">"Total growth"</th><th scope="col" class="num">"Per call"</th>
                    <th scope="col" class="num">"Calls"</th><th scope="col">"Reference rule"</th>
                    <th scope="col">"Kept the most beyond the calls"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
    .into_any()
}

/// The timelines of one answer: the total, and each series when there are several.
struct Drawn {
    total: Timeline,
    series: Vec<(String, Timeline)>,
}

fn timelines_of(s: &Summary, w: &Window) -> Drawn {
    let series = if s.series.len() > 1 {
        s.series
            .iter()
            .zip(&w.series)
            .take(MAX_SERIES)
            .map(|(info, b)| (info.label(), served::timeline_of(b)))
            .collect()
    } else {
        Vec::new()
    };
    Drawn {
        total: served::timeline_of(&w.total),
        series,
    }
}

fn spec<'a>(d: &'a Drawn, t0: u64, t1: u64, origin: u64, pin: Option<u64>) -> ChartSpec<'a> {
    let theme = dom::theme();
    let mut layers = vec![Layer {
        label: if d.series.is_empty() {
            "live device memory".into()
        } else {
            "all series".into()
        },
        timeline: &d.total,
        color: PALETTE[0],
        style: if d.series.is_empty() {
            LayerStyle::Band
        } else {
            LayerStyle::Line
        },
    }];
    layers.extend(d.series.iter().enumerate().map(|(i, (label, t))| Layer {
        label: label.clone(),
        timeline: t,
        color: PALETTE[(i + 1) % PALETTE.len()],
        style: LayerStyle::Band,
    }));
    ChartSpec {
        t0,
        t1,
        origin_nanos: origin,
        layers,
        gap: None,
        ranges: Vec::new(),
        markers: Vec::new(),
        pin_nanos: pin,
        y_unit: YUnit::Bytes,
        theme,
        stack: None,
        limits: Vec::new(),
    }
}

/// How long the first window may take before the page says the server is reading the trace.
const WAITING_NOTE_MS: u64 = 400;

/// `GET …/live` at `t`, its `limit` largest call sites.
async fn live_at(s: &Served, t: u64, limit: usize) -> Result<LiveAt, String> {
    let url = s.endpoint("live", &format!("t={t}&limit={limit}"));
    served::parse::<LiveAt>("live set", &get_text(&url).await?)
}

/// Everything shown for a trace in server mode.
#[component]
pub fn ServedView(s: Arc<Served>, ctx: Ctx) -> impl IntoView {
    let vs = ctx.vs;
    let full = s.extent();
    let origin = s.summary.t0;
    let canvas = NodeRef::<html::Canvas>::new();
    let mapper = StoredValue::new(Mapper::default());
    let resize = RwSignal::new(0u32);
    let handle = window_event_listener(ev::resize, move |_| resize.update(|n| *n += 1));
    on_cleanup(move || handle.remove());
    // The last window asked for: an answer to an older one is dropped.
    let asked = StoredValue::new(0u64);
    let failed = RwSignal::new(None::<String>);
    // Until the first window is drawn: after a server restart the summary comes from the store
    // at once, but the timeline needs the trace decoded, which takes a while for a large one.
    let no_window = RwSignal::new(true);
    let slow = RwSignal::new(false);
    set_timeout(
        // The view may be gone by then: its signal disposed, which `try_set` allows.
        move || {
            let _ = slow.try_set(true);
        },
        std::time::Duration::from_millis(WAITING_NOTE_MS),
    );
    let drawn: StoredValue<Option<(Arc<Drawn>, u64, u64)>, LocalStorage> =
        StoredValue::new_local(None);

    let redraw = move |pin: Option<u64>| {
        let Some(el) = canvas.get_untracked() else {
            return;
        };
        drawn.with_value(|d| {
            if let Some((d, t0, t1)) = d {
                let w = dom::available_width(&el);
                if let Some(m) =
                    dom::draw_canvas(&el, &spec(d, *t0, *t1, origin, pin), w, HEIGHT_PX)
                {
                    mapper.set_value(m);
                }
            }
        });
    };

    // Each window (zoom, pan, resize) is asked of the server at the chart's resolution.
    let range = Memo::new(move |_| vs.with(|v| v.range_nanos));
    let pinned = Memo::new(move |_| vs.with(|v| v.pin_nanos));
    let s_tl = s.clone();
    Effect::new(move |_| {
        resize.track();
        let (t0, t1) = range.get().unwrap_or(full);
        let Some(el) = canvas.get() else {
            return;
        };
        let columns = chart::plot_columns(dom::available_width(&el));
        asked.update_value(|n| *n += 1);
        let mine = asked.get_value();
        let s = s_tl.clone();
        leptos::task::spawn_local(async move {
            let started = dom::now_ms();
            let url = s.endpoint("timeline", &format!("t0={t0}&t1={t1}&columns={columns}"));
            let answer = match get_text(&url).await {
                Ok(body) => served::parse::<Window>("timeline", &body),
                Err(e) => Err(e),
            };
            if asked.try_get_value() != Some(mine) {
                return;
            }
            match answer {
                Ok(w) => {
                    failed.set(None);
                    no_window.set(false);
                    drawn.set_value(Some((Arc::new(timelines_of(&s.summary, &w)), t0, t1)));
                    redraw(vs.with_untracked(|v| v.pin_nanos));
                    if let Some(el) = canvas.get_untracked() {
                        let _ = el.set_attribute("data-t0", &t0.to_string());
                        let _ = el.set_attribute("data-t1", &t1.to_string());
                        let _ = el.set_attribute("data-columns", &w.columns.to_string());
                        let _ = el.set_attribute(
                            "data-step-ms",
                            &format!("{:.1}", dom::now_ms() - started),
                        );
                    }
                    dom::mark("gpucollect:served-window");
                }
                Err(e) => {
                    no_window.set(false);
                    failed.set(Some(e));
                }
            }
        });
    });

    // The pinned moment: redrawn at once, its live set asked of the server.
    let live = RwSignal::new(None::<Result<LiveAt, String>>);
    let s_live = s.clone();
    Effect::new(move |_| {
        let pin = pinned.get();
        redraw(pin);
        let Some(t) = pin else {
            live.set(None);
            return;
        };
        let s = s_live.clone();
        leptos::task::spawn_local(async move {
            let answer = live_at(&s, t, LIVE_SITES).await;
            if vs.with_untracked(|v| v.pin_nanos) == Some(t) {
                live.set(Some(answer));
            }
        });
    });

    // The memory by stack, asked of the server when a moment is chosen (and again when the
    // pinned moment moves while it is shown).
    let stack_moment = RwSignal::new(None::<StackMoment>);
    let stacks = RwSignal::new(None::<(StackMoment, u64, Result<LiveAt, String>)>);
    let s_stacks = s.clone();
    let peak_ts = s.summary.report.peak_ts_nanos;
    let end_ts = s.summary.t1;
    Effect::new(move |_| {
        let Some(m) = stack_moment.get() else {
            return;
        };
        let t = match m {
            StackMoment::Peak => peak_ts,
            StackMoment::Pinned => match pinned.get() {
                Some(t) => t,
                None => return,
            },
            StackMoment::End => end_ts,
        };
        let s = s_stacks.clone();
        leptos::task::spawn_local(async move {
            let answer = live_at(&s, t, STACK_SITES).await;
            // An answer for a moment no longer chosen is dropped.
            let still = stack_moment.try_get_untracked() == Some(Some(m))
                && (m != StackMoment::Pinned || vs.with_untracked(|v| v.pin_nanos) == Some(t));
            if still {
                stacks.set(Some((m, t, answer)));
            }
        });
    });
    let stack_choice = move |m: StackMoment, label: &'static str| {
        let disabled = move || m == StackMoment::Pinned && pinned.get().is_none();
        view! {
            <button data-testid=format!("served-moment-{}", m.slug())
                class:active=move || stack_moment.get() == Some(m)
                aria-pressed=move || (stack_moment.get() == Some(m)).to_string()
                disabled=disabled on:click=move |_| stack_moment.set(Some(m))>{label}</button>
        }
    };

    let on_wheel = move |e: ev::WheelEvent| mapper.with_value(|m| ctx.wheel(&e, m));
    let on_click = move |e: ev::MouseEvent| {
        let m = mapper.get_value();
        let x = f64::from(e.offset_x());
        if m.contains_x(x) {
            let t = m.time_at(x);
            vs.update(|v| v.pin_nanos = Some(t));
        }
    };

    let r = &s.summary.report;
    let facts = format!(
        "{} over {} · peak {} at {} · {} live at the end",
        s.bytes.map(fmt_bytes).unwrap_or_else(|| "trace".into()),
        fmt_duration(s.summary.t1.saturating_sub(s.summary.t0)),
        fmt_bytes(r.peak_bytes),
        fmt_duration(r.peak_ts_nanos.saturating_sub(origin)),
        fmt_bytes(r.live_at_end_bytes),
    );
    let range_text = move || {
        let (t0, t1) = range.get().unwrap_or(full);
        format!(
            "{} – {}",
            fmt_duration(t0.saturating_sub(origin)),
            fmt_duration(t1.saturating_sub(origin))
        )
    };
    let download = s.url.clone();
    view! {
        <section class="mode-banner" data-testid="mode" data-mode="server">
            <p>{mode_sentence(&s)}" "<a href=download data-testid="download-trace" download="">"Download the trace"</a>
               " to open it with gpucollect report."</p>
        </section>
        {verdict(&s)}
        <p class="muted" data-testid="served-facts" data-peak=r.peak_bytes.to_string()>{facts}</p>
        <section class="timeline" aria-label="Timeline">
            <div class="toolbar">
                <ZoomButtons ctx=ctx />
                <span class="range muted" data-testid="visible-range">{range_text}</span>
            </div>
            <p class="hint muted">"Wheel: zoom · shift-wheel: pan · click: pin a moment and list what was live · keys + − ← → 0"</p>
            <div class="chart-wrap">
                <canvas node_ref=canvas data-testid="timeline-canvas" tabindex="0"
                    aria-label="Live device memory over time, as the server summarised it"
                    on:wheel=on_wheel on:click=on_click></canvas>
            </div>
            {move || (no_window.get() && slow.get()).then(|| view! {
                <p class="muted" role="status" data-testid="served-waiting">"The server is reading the trace to draw its timeline: it decodes a trace once, which takes tens of seconds for a trace of a few GB. The verdict and tables above are complete already."</p>
            })}
            {move || failed.get().map(|e| view! {
                <p class="error" role="alert" data-testid="served-error">{format!("The timeline could not be updated: {e}")}</p>
            })}
        </section>
        {move || live.get().map(|answer| match answer {
            Ok(at) => view! {
                <section data-testid="served-live" data-t=at.t.to_string() data-bytes=at.bytes.to_string()>
                    <h3>{format!("Live at {}: {} in {} allocations", fmt_duration(at.t.saturating_sub(origin)), fmt_bytes(at.bytes), at.count)}</h3>
                    {sites_table(&at.sites, "served-live-row")}
                </section>
            }.into_any(),
            Err(e) => view! {
                <p class="error" role="alert" data-testid="served-error">{format!("The live set could not be read: {e}")}</p>
            }.into_any(),
        })}
        <section class="stacks" data-testid="served-stacks">
            <h3>"Memory by stack"</h3>
            <div class="toolbar">
                {stack_choice(StackMoment::Peak, "At the peak")}
                {stack_choice(StackMoment::Pinned, "At the pinned moment")}
                {stack_choice(StackMoment::End, "At the end")}
            </div>
            <p class="hint muted">"The allocations live then, asked of the server and merged by stack: outermost frames at the top, a cell's width its share of the bytes live then."</p>
            {move || stacks.get().map(|(m, t, answer)| match answer {
                Ok(at) => {
                    let flame = served::flame_of(&at);
                    view! {
                        <p data-testid="served-flame-total" data-value=flame.total_bytes().to_string()
                            data-ts=t.to_string() data-moment=m.slug()>
                            {format!("{} live at {} in {} allocations", fmt_bytes(at.bytes), fmt_duration(t.saturating_sub(origin)), at.count)}
                        </p>
                        {super::flame::icicle(&flame, "", None::<fn(String)>)}
                    }
                    .into_any()
                }
                Err(e) => view! {
                    <p class="error" role="alert" data-testid="served-error">{format!("The memory by stack could not be read: {e}")}</p>
                }
                .into_any(),
            })}
        </section>
        {report_sites(
            format!("Live at the peak ({}), by call site", fmt_bytes(r.peak_bytes)),
            "served-peak-sites",
            &r.peak_sites,
        )}
        {report_sites(
            format!("Live at the end ({}), by call site", fmt_bytes(r.live_at_end_bytes)),
            "served-end-sites",
            &r.live_at_end_sites,
        )}
        {call_sites(&r.analysis.sites, r.peak_bytes)}
        {scopes(&r.analysis.scopes)}
    }
}
