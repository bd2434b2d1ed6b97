//! Time charts drawn with plotters on any backend: the browser canvas in the app, SVG for
//! export and for the native tests. A chart is described by a [`ChartSpec`] (what to draw) and
//! drawn by [`draw`], which returns a [`Mapper`] turning mouse positions into trace times.
//!
//! Drawing cost is O(pixels): every series is downsampled to one min/max bucket per pixel
//! column with `Timeline::downsample`, and the call sites' stacked areas are sampled once per
//! column ([`crate::site_series::stack_columns`]), so a zoom step costs the same at 10 k or
//! 10 M events. Axis ticks fall on round numbers of one unit ([`crate::ticks`]); markers
//! closer than a few pixels are drawn as one, with their count.

use std::sync::Arc;

use analysis_core::format::StackId;
use analysis_core::timeline::{Spans, Timeline};
use analysis_core::units::fmt_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::TraceData;
use crate::filter::Filter;
use crate::markers::{Marker, MarkerKind};
use crate::site_series::{SiteSeries, StackColumns, stack_columns_with};
use crate::state::ViewState;
use crate::ticks::{byte_ticks, time_ticks};

/// Colors of a light or dark page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    pub background: RGBColor,
    pub foreground: RGBColor,
    pub grid: RGBColor,
}

impl Theme {
    pub const LIGHT: Theme = Theme {
        background: RGBColor(255, 255, 255),
        foreground: RGBColor(32, 33, 36),
        grid: RGBColor(226, 228, 232),
    };
    pub const DARK: Theme = Theme {
        background: RGBColor(24, 26, 31),
        foreground: RGBColor(222, 224, 228),
        grid: RGBColor(52, 56, 64),
    };
}

/// Series colors, in order.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(66, 133, 244),
    RGBColor(15, 157, 88),
    RGBColor(171, 71, 188),
    RGBColor(0, 172, 193),
    RGBColor(255, 112, 67),
    RGBColor(158, 157, 36),
    RGBColor(92, 107, 192),
    RGBColor(240, 98, 146),
];
const RESERVED: RGBColor = RGBColor(245, 166, 35);
const DEVICE_USED: RGBColor = RGBColor(121, 85, 72);
const OOM: RGBColor = RGBColor(219, 68, 55);
const TEARDOWN: RGBColor = RGBColor(142, 36, 170);
/// The pinned moment: a colour no series, band or marker uses.
pub const PIN: RGBColor = RGBColor(0, 176, 255);
const SPIKE: RGBColor = RGBColor(230, 81, 0);
const CAPACITY: RGBColor = RGBColor(198, 40, 40);
/// Call-site bands of the stacked timeline, bottom first (no orange, red or cyan: markers and
/// the pin use those).
pub const SITE_PALETTE: [RGBColor; 8] = [
    RGBColor(78, 121, 167),
    RGBColor(89, 161, 79),
    RGBColor(176, 122, 161),
    RGBColor(237, 201, 72),
    RGBColor(156, 117, 95),
    RGBColor(255, 157, 167),
    RGBColor(118, 183, 178),
    RGBColor(121, 85, 190),
];
/// The "other call sites" band.
pub const OTHER_SITES: RGBColor = RGBColor(176, 176, 176);
/// Call sites stacked at most on the timeline (the rest is "other").
pub const STACKED_SITES: usize = 8;
/// Markers closer than this many pixels are drawn as one, with their count.
pub const MARKER_BUCKET_PX: i32 = 8;

/// How a layer is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerStyle {
    /// The min..max band of each column plus a line along the maxima (allocation series).
    Band,
    /// A line along the maxima (samples: pool reserved, NVML used).
    Line,
}

/// One series on a chart.
#[derive(Clone, Debug)]
pub struct Layer<'a> {
    pub label: String,
    pub timeline: &'a Timeline,
    pub color: RGBColor,
    pub style: LayerStyle,
}

/// What the y axis measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YUnit {
    Bytes,
    /// Values are ten-thousandths (1 % = 100).
    Permyriad,
}

/// An NVTX range drawn as a band.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeBand<'a> {
    pub begin_nanos: u64,
    pub end_nanos: u64,
    /// Nesting depth (0 = top level).
    pub depth: u32,
    pub name: &'a str,
}

/// One call site's band of a stacked chart.
#[derive(Clone, Debug)]
pub struct StackBand<'a> {
    pub stack: StackId,
    pub label: String,
    pub timeline: &'a Timeline,
    pub color: RGBColor,
}

/// Call sites drawn as stacked areas, bottom first, under the whole they are part of: each
/// column shows the sites' bytes at the moment the whole was highest in it, and "other" is the
/// rest of the whole then.
#[derive(Clone, Debug)]
pub struct StackSpec<'a> {
    pub whole: &'a Timeline,
    pub bands: Vec<StackBand<'a>>,
    /// The band drawn solid while the others fade (the selected leak row).
    pub highlight: Option<StackId>,
}

/// A horizontal limit (device capacity): drawn where it falls inside the y axis, which it
/// does not stretch; the legend gives its value either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub label: String,
    pub bytes: u64,
}

/// Everything one chart shows.
#[derive(Clone, Debug)]
pub struct ChartSpec<'a> {
    /// Visible window `[t0, t1)` in trace nanoseconds.
    pub t0: u64,
    pub t1: u64,
    /// Time shown as 0 on the axis (the trace start).
    pub origin_nanos: u64,
    pub layers: Vec<Layer<'a>>,
    /// Fill between two layers (indexes into `layers`): the hidden gap between device used and
    /// the allocator's view.
    pub gap: Option<(usize, usize)>,
    pub ranges: Vec<RangeBand<'a>>,
    pub markers: Vec<Marker>,
    pub pin_nanos: Option<u64>,
    pub y_unit: YUnit,
    pub theme: Theme,
    /// Call sites as stacked areas (the main timeline, once their series are built).
    pub stack: Option<StackSpec<'a>>,
    pub limits: Vec<Limit>,
}

/// The stacked areas as drawn, for hit tests: which band is under the mouse.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackHit {
    /// Per band, bottom first: the site, or `None` for "other".
    pub stacks: Vec<Option<StackId>>,
    pub columns: StackColumns,
}

/// A band under the mouse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandHit {
    /// The site, or `None` for "other call sites".
    pub stack: Option<StackId>,
    pub bytes: u64,
    /// The moment the column shows.
    pub sample_nanos: u64,
}

/// Maps pixels to trace time and back, for one drawn chart.
#[derive(Clone, Debug, Default)]
pub struct Mapper {
    pub left_px: i32,
    pub right_px: i32,
    pub top_px: i32,
    pub bottom_px: i32,
    pub t0: u64,
    pub t1: u64,
    pub y_max: u64,
    pub stack: Option<Arc<StackHit>>,
    /// Markers drawn (the sum of every group's count) and the groups they were drawn as.
    pub markers_drawn: u64,
    pub marker_groups: u32,
    /// The y axis's labels, bottom first.
    pub y_labels: Vec<String>,
}

impl Mapper {
    /// Trace time at pixel `x`, clamped to the plot.
    pub fn time_at(&self, x: f64) -> u64 {
        let w = f64::from((self.right_px - self.left_px).max(1));
        let frac = ((x - f64::from(self.left_px)) / w).clamp(0.0, 1.0);
        self.t0 + ((self.t1 - self.t0) as f64 * frac).round() as u64
    }

    /// Pixel x of time `t` (may fall outside the plot).
    pub fn x_of(&self, t: u64) -> f64 {
        let w = f64::from(self.right_px - self.left_px);
        let span = (self.t1 - self.t0).max(1) as f64;
        f64::from(self.left_px) + (t as f64 - self.t0 as f64) * w / span
    }

    /// Whether pixel `x` is inside the plot.
    pub fn contains_x(&self, x: f64) -> bool {
        x >= f64::from(self.left_px) && x <= f64::from(self.right_px)
    }

    /// The value at pixel `y` (0 at the bottom of the plot).
    pub fn value_at_y(&self, y: f64) -> u64 {
        let h = f64::from((self.bottom_px - self.top_px).max(1));
        let frac = ((f64::from(self.bottom_px) - y) / h).clamp(0.0, 1.0);
        (self.y_max as f64 * frac) as u64
    }

    /// The stacked band at pixel `(x, y)`, if any.
    pub fn band_at(&self, x: f64, y: f64) -> Option<BandHit> {
        let hit = self.stack.as_ref()?;
        if !self.contains_x(x) || y < f64::from(self.top_px) || y > f64::from(self.bottom_px) {
            return None;
        }
        let n = hit.columns.columns();
        let w = f64::from((self.right_px - self.left_px).max(1));
        let c = (((x - f64::from(self.left_px)) / w * n as f64) as usize).min(n.checked_sub(1)?);
        let (band, bytes) = hit.columns.band_at(c, self.value_at_y(y))?;
        Some(BandHit {
            stack: *hit.stacks.get(band)?,
            bytes,
            sample_nanos: hit.columns.sample_nanos[c],
        })
    }
}

/// Markers passed at most to one chart: a denser window is grouped into this many equal
/// time slices first (each drawn with its count).
pub const MAX_MARKERS: usize = 2000;

/// Builds the main timeline for the current view state: one band per (process, device), the
/// total, pool reserved/used, NVML device used with the hidden gap, the devices' capacity,
/// NVTX ranges, failed allocations and teardowns; with `sites` (the per-site series of the
/// view's filter), the call sites with the highest peaks in the window as stacked areas
/// under lines for the series.
pub fn timeline_spec<'a>(
    a: &'a TraceData,
    vs: &ViewState,
    theme: Theme,
    sites: Option<&'a SiteSeries>,
) -> ChartSpec<'a> {
    let (lo, hi) = a.time_extent();
    let (t0, t1) = vs.range_nanos.unwrap_or((lo, hi + 1));
    let f = filter_of(vs);
    let m = a.model();
    let mut layers = Vec::new();
    let series = a.series_plots(&f);
    if series.len() > 1 && f.is_all() {
        layers.push(Layer {
            label: "all devices".into(),
            timeline: &a.total,
            color: a_gray(theme),
            style: LayerStyle::Line,
        });
    }
    let stack = sites.and_then(|sites| {
        let whole = sites.whole.as_ref().or_else(|| a.whole_of(&f))?;
        let highlight = vs.open_stack.map(StackId);
        // The call-site search (or a frame clicked in the icicle) keeps the sites it matches.
        let allowed = (!vs.search.is_empty()).then(|| a.stacks_matching(&vs.search));
        let bands = sites
            .top_in_window(
                t0,
                t1,
                STACKED_SITES,
                highlight,
                allowed.as_deref().map(Vec::as_slice),
            )
            .into_iter()
            .enumerate()
            .map(|(i, s)| StackBand {
                stack: s.stack,
                label: m.stack_label(s.stack),
                timeline: &s.timeline,
                color: SITE_PALETTE[i % SITE_PALETTE.len()],
            })
            .collect();
        Some(StackSpec {
            whole,
            bands,
            highlight,
        })
    });
    // Under stacked areas the series are lines.
    let series_style = if stack.is_some() {
        LayerStyle::Line
    } else {
        LayerStyle::Band
    };
    for (i, (s, plot)) in series.iter().enumerate() {
        layers.push(Layer {
            label: format!("process {} · GPU {}", s.key.process.0, s.key.device.0),
            timeline: plot,
            color: PALETTE[i % PALETTE.len()],
            style: series_style,
        });
    }
    let mut gap = None;
    for ((p, d), pool) in &a.pools {
        if f.admits_series(*p, *d) {
            layers.push(Layer {
                label: format!("reserved (pool) · GPU {}", d.0),
                timeline: &pool.reserved,
                color: RESERVED,
                style: LayerStyle::Line,
            });
        }
    }
    let reserved_layer = layers.iter().rposition(|l| l.color == RESERVED);
    for (d, used) in &a.device_used {
        if f.device.is_none_or(|x| x == *d) {
            layers.push(Layer {
                label: format!("device used (NVML) · GPU {}", d.0),
                timeline: used,
                color: DEVICE_USED,
                style: LayerStyle::Line,
            });
            if gap.is_none() {
                let below = reserved_layer.or(if series.is_empty() {
                    None
                } else {
                    Some(usize::from(series.len() > 1 && f.is_all()))
                });
                gap = below.map(|b| (layers.len() - 1, b));
            }
        }
    }
    // The capacity of the devices shown (summed when several are).
    let shown: Vec<_> = a
        .devices()
        .into_iter()
        .filter(|d| f.device.is_none_or(|x| x == *d))
        .collect();
    let capacity: u64 = m
        .devices
        .iter()
        .filter(|d| shown.contains(&d.device))
        .map(|d| d.total_bytes)
        .sum();
    let limits = if capacity > 0 {
        vec![Limit {
            label: if shown.len() > 1 {
                "capacity of the GPUs".into()
            } else {
                "device capacity".into()
            },
            bytes: capacity,
        }]
    } else {
        Vec::new()
    };
    ChartSpec {
        t0,
        t1,
        origin_nanos: lo,
        layers,
        gap,
        ranges: a
            .range_rows
            .bands(f.process, t0, t1)
            .into_iter()
            .map(|b| RangeBand {
                begin_nanos: b.begin_nanos,
                end_nanos: b.end_nanos,
                depth: b.depth,
                name: m.string(b.name),
            })
            .collect(),
        markers: window_markers(a, &f, t0, t1),
        pin_nanos: vs.pin_nanos,
        y_unit: YUnit::Bytes,
        theme,
        stack,
        limits,
    }
}

/// The markers of `[t0, t1]`: each one, or past [`MAX_MARKERS`] one per equal time slice
/// with the count of the slice (drawn as the most severe kind in it).
fn window_markers(a: &TraceData, f: &Filter, t0: u64, t1: u64) -> Vec<Marker> {
    if a.markers_in(f, t0, t1).nth(MAX_MARKERS).is_none() {
        return a.markers_in(f, t0, t1).cloned().collect();
    }
    let span = u128::from(t1.saturating_sub(t0).max(1));
    let mut out: Vec<(u128, Marker)> = Vec::with_capacity(MAX_MARKERS + 1);
    for m in a.markers_in(f, t0, t1) {
        let slice = u128::from(m.ts_nanos - t0) * MAX_MARKERS as u128 / span;
        match out.last_mut() {
            Some((s, last)) if *s == slice => {
                last.count += m.count;
                if m.kind.rank() > last.kind.rank() {
                    last.kind = m.kind;
                }
            }
            _ => out.push((slice, m.clone())),
        }
    }
    out.into_iter().map(|(_, m)| m).collect()
}

fn a_gray(theme: Theme) -> RGBColor {
    if theme == Theme::DARK {
        RGBColor(200, 200, 200)
    } else {
        RGBColor(90, 90, 90)
    }
}

/// The filter a view state selects.
pub fn filter_of(vs: &ViewState) -> Filter {
    use analysis_core::format::{DeviceIdx, ProcessIdx, ThreadIdx};
    Filter {
        process: vs.process.map(ProcessIdx),
        device: vs.device.map(DeviceIdx),
        thread: vs.thread.map(ThreadIdx),
    }
}

const RANGE_ROW_PX: i32 = 12;

/// What a drawing operation returns on `DB`.
type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The plot's pixel rectangle and how trace time, columns and values map onto it.
struct Plot {
    xr: std::ops::Range<i32>,
    yr: std::ops::Range<i32>,
    t0: u64,
    t1: u64,
    y_max: u64,
    columns: usize,
}

impl Plot {
    /// Pixel y of value `v` (clamped to the axis).
    fn y_of(&self, v: u64) -> i32 {
        let plot_h = f64::from((self.yr.end - self.yr.start).max(1));
        // `round_ties_even` is one wasm instruction; `round` is a library call.
        self.yr.end
            - ((v.min(self.y_max) as f64 / self.y_max as f64) * plot_h).round_ties_even() as i32
    }

    /// Pixel x of the left edge of column `c`.
    fn x_of(&self, c: usize) -> i32 {
        self.xr.start + (c as i32 * (self.xr.end - self.xr.start)) / self.columns as i32
    }

    /// Pixel x of time `t` (clamped to the window).
    fn px(&self, t: u64) -> i32 {
        let t = t.clamp(self.t0, self.t1);
        let span = (self.t1 - self.t0) as f64;
        self.xr.start
            + (((t - self.t0) as f64 / span) * f64::from(self.xr.end - self.xr.start))
                .round_ties_even() as i32
    }
}

/// Width of the y axis's labels, pixels.
const Y_LABEL_PX: i32 = 72;

/// Columns of the plot on a chart `width` pixels wide: one per pixel between the y axis's
/// labels and the right margin.
pub fn plot_columns(width: u32) -> usize {
    (i32::try_from(width).unwrap_or(i32::MAX) - Y_LABEL_PX - 16).max(1) as usize
}

/// Draws `spec` on `root` (which it clears) and returns the pixel/time mapping: the axes, then
/// the hidden gap, the stacked call sites, the layers, the limits, the NVTX ranges, the
/// markers, the pin and the legend, each drawn by its own function below.
pub fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
) -> Result<Mapper, DrawingAreaErrorKind<DB::ErrorType>> {
    let th = spec.theme;
    root.fill(&th.background)?;
    let (t0, t1) = (spec.t0, spec.t1.max(spec.t0 + 1));
    let (w, _) = root.dim_in_pixel();
    // First pass: the plot width decides the number of columns; the y range needs the data.
    let y_label_px = Y_LABEL_PX;
    let columns = plot_columns(w);
    let (buckets, spans): (Vec<Vec<analysis_core::timeline::Bucket>>, Vec<Spans>) = spec
        .layers
        .iter()
        .map(|l| l.timeline.downsample_spans(t0, t1, columns))
        .unzip();
    let stacked = spec.stack.as_ref().map(|st| {
        let sites: Vec<&Timeline> = st.bands.iter().map(|b| b.timeline).collect();
        // The stack's whole is usually a layer too (the total, or the only series): its
        // columns are not searched twice.
        let known = spec
            .layers
            .iter()
            .position(|l| l.timeline.shares_points(st.whole))
            .map(|i| (buckets[i].as_slice(), &spans[i]));
        stack_columns_with(st.whole, known, &sites, t0, t1, columns)
    });
    // The y axis fits the window's data (limits above it are named in the legend instead).
    let data_max = buckets
        .iter()
        .flat_map(|b| b.iter().map(|x| x.max))
        .chain(stacked.iter().flat_map(|s| s.whole_bytes.iter().copied()))
        .max()
        .unwrap_or(0);
    let y_max = match spec.y_unit {
        YUnit::Bytes => (data_max + data_max / 10).max(1024),
        YUnit::Permyriad => 10_000,
    };
    let rows = spec.ranges.iter().map(|r| r.depth + 1).max().unwrap_or(0) as i32;
    let origin = spec.origin_nanos;
    let chart = ChartBuilder::on(root)
        .margin_top(6 + rows * RANGE_ROW_PX)
        .margin_right(16)
        .margin_left(4)
        .margin_bottom(4)
        .x_label_area_size(24)
        .y_label_area_size(y_label_px)
        .build_cartesian_2d(
            t0.saturating_sub(origin)..t1.saturating_sub(origin),
            0u64..y_max,
        )?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let plot = Plot {
        xr,
        yr,
        t0,
        t1,
        y_max,
        columns,
    };
    let y_labels = draw_axes(root, spec, &plot)?;
    let mut map = Mapper {
        left_px: plot.xr.start,
        right_px: plot.xr.end,
        top_px: plot.yr.start,
        bottom_px: plot.yr.end,
        t0,
        t1,
        y_max,
        y_labels,
        ..Mapper::default()
    };
    draw_gap(root, spec, &plot, &buckets)?;
    if let (Some(st), Some(cols)) = (&spec.stack, stacked) {
        draw_stack(root, st, &cols, &plot)?;
        map.stack = Some(Arc::new(StackHit {
            stacks: st
                .bands
                .iter()
                .map(|b| Some(b.stack))
                .chain(std::iter::once(None))
                .collect(),
            columns: cols,
        }));
    }
    draw_layers(root, spec, &plot, &buckets)?;
    draw_limits(root, spec, &plot)?;
    draw_ranges(root, spec, &plot)?;
    (map.markers_drawn, map.marker_groups) = draw_markers(root, spec, &plot)?;
    draw_pin(root, spec, &plot)?;
    draw_legend(root, spec, &plot)?;
    root.present()?;
    Ok(map)
}

/// Grid lines and labels at round numbers of one unit (time since the trace start), and the
/// axis lines. Returns the y axis's labels, bottom first.
fn draw_axes<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Result<Vec<String>, DrawingAreaErrorKind<DB::ErrorType>> {
    let th = spec.theme;
    let (xr, yr) = (&plot.xr, &plot.yr);
    let origin = spec.origin_nanos;
    let font = ("sans-serif", 12).into_font().color(&th.foreground);
    let y_ticks = match spec.y_unit {
        YUnit::Bytes => byte_ticks(plot.y_max, 6),
        YUnit::Permyriad => (0..=5)
            .map(|k| crate::ticks::Tick {
                value: k * 2_000,
                label: format!("{} %", k * 20),
            })
            .collect(),
    };
    let x_ticks = time_ticks(
        plot.t0.saturating_sub(origin),
        plot.t1.saturating_sub(origin),
        7,
    );
    let right_label = font.clone().pos(Pos::new(HPos::Right, VPos::Center));
    let below_label = font.pos(Pos::new(HPos::Center, VPos::Top));
    for t in &y_ticks {
        let y = plot.y_of(t.value);
        root.draw(&PathElement::new(vec![(xr.start, y), (xr.end, y)], th.grid))?;
        root.draw(&Text::new(
            t.label.clone(),
            (xr.start - 6, y),
            right_label.clone(),
        ))?;
    }
    for t in &x_ticks {
        let x = plot.px(t.value + origin);
        root.draw(&PathElement::new(vec![(x, yr.start), (x, yr.end)], th.grid))?;
        root.draw(&Text::new(
            t.label.clone(),
            (x, yr.end + 5),
            below_label.clone(),
        ))?;
    }
    root.draw(&PathElement::new(
        vec![(xr.start, yr.start), (xr.start, yr.end), (xr.end, yr.end)],
        th.foreground,
    ))?;
    Ok(y_ticks.into_iter().map(|t| t.label).collect())
}

/// The hidden gap: one polygon between the upper (device used) and lower layer.
fn draw_gap<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
    buckets: &[Vec<analysis_core::timeline::Bucket>],
) -> Drawn<DB> {
    let Some((up, down)) = spec.gap else {
        return Ok(());
    };
    let (Some(u), Some(d)) = (buckets.get(up), buckets.get(down)) else {
        return Ok(());
    };
    let start = first_time(spec.layers[up].timeline);
    let cols: Vec<(usize, u64, u64)> = u
        .iter()
        .zip(d.iter())
        .enumerate()
        .filter(|(_, (bu, _))| bu.t_end > start)
        .map(|(c, (bu, bd))| (c, bu.last, bd.last.min(bu.last)))
        .collect();
    if cols.is_empty() {
        return Ok(());
    }
    let mut poly: Vec<(i32, i32)> = Vec::with_capacity(cols.len() * 4);
    for &(c, hi, _) in &cols {
        push_point(&mut poly, (plot.x_of(c), plot.y_of(hi)));
        push_point(&mut poly, (plot.x_of(c + 1), plot.y_of(hi)));
    }
    for &(c, _, lo) in cols.iter().rev() {
        push_point(&mut poly, (plot.x_of(c + 1), plot.y_of(lo)));
        push_point(&mut poly, (plot.x_of(c), plot.y_of(lo)));
    }
    root.draw(&Polygon::new(poly, DEVICE_USED.mix(0.18).filled()))
}

/// Call sites, stacked bottom first, then "other": each a polygon between its top and the top
/// of the bands under it, a step per column.
fn draw_stack<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    st: &StackSpec<'_>,
    cols: &StackColumns,
    plot: &Plot,
) -> Drawn<DB> {
    let n = cols.columns();
    let mut below = vec![0u64; n];
    for band in 0..cols.bands {
        let top: Vec<u64> = (0..n)
            .map(|c| below[c].saturating_add(cols.column(c)[band]))
            .collect();
        if top != below {
            let mut poly: Vec<(i32, i32)> = Vec::with_capacity(4 * n);
            for (c, &v) in top.iter().enumerate() {
                push_point(&mut poly, (plot.x_of(c), plot.y_of(v)));
                push_point(&mut poly, (plot.x_of(c + 1), plot.y_of(v)));
            }
            for (c, &v) in below.iter().enumerate().rev() {
                push_point(&mut poly, (plot.x_of(c + 1), plot.y_of(v)));
                push_point(&mut poly, (plot.x_of(c), plot.y_of(v)));
            }
            let site = st.bands.get(band);
            let color = site.map_or(OTHER_SITES, |b| b.color);
            let alpha = match (st.highlight, site) {
                (None, _) => 0.7,
                (Some(h), Some(b)) if b.stack == h => 0.95,
                _ => 0.25,
            };
            root.draw(&Polygon::new(poly, color.mix(alpha).filled()))?;
        }
        below = top;
    }
    Ok(())
}

/// Each layer as one path of its columns' min..max extents, and a filled area under a band.
fn draw_layers<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
    buckets: &[Vec<analysis_core::timeline::Bucket>],
) -> Drawn<DB> {
    let (x_of, y_of) = (|c| plot.x_of(c), |v| plot.y_of(v));
    for (layer, b) in spec.layers.iter().zip(buckets) {
        let start = first_time(layer.timeline);
        let cols: Vec<(usize, &analysis_core::timeline::Bucket)> = b
            .iter()
            .enumerate()
            .filter(|(_, x)| x.t_end > start)
            .collect();
        if cols.is_empty() {
            continue;
        }
        if layer.style == LayerStyle::Band {
            let mut poly: Vec<(i32, i32)> = Vec::with_capacity(cols.len() + 2);
            for (c, x) in &cols {
                push_point(&mut poly, (x_of(*c), y_of(x.max)));
            }
            if let (Some((first, _)), Some((last, _))) = (cols.first(), cols.last()) {
                push_point(&mut poly, (x_of(*last), y_of(0)));
                push_point(&mut poly, (x_of(*first), y_of(0)));
            }
            root.draw(&Polygon::new(poly, layer.color.mix(0.18).filled()))?;
        }
        // One path per layer: each column's min..max extent, then on to the next column at the
        // value the column ended with (a step function that keeps every spike visible).
        let mut line = Vec::with_capacity(cols.len() * 3);
        for (c, x) in &cols {
            push_point(&mut line, (x_of(*c), y_of(x.max)));
            if layer.style == LayerStyle::Band && x.min < x.max {
                push_point(&mut line, (x_of(*c), y_of(x.min)));
            }
            push_point(&mut line, (x_of(*c + 1), y_of(x.last)));
        }
        // One pixel wide: a software canvas (no GPU) strokes a hairline several times faster
        // than a 2 px line, and this path has thousands of vertices.
        root.draw(&PathElement::new(line, layer.color.stroke_width(1)))?;
    }
    Ok(())
}

/// Limits inside the axis (device capacity): a dashed line.
fn draw_limits<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Drawn<DB> {
    let (xr, y_max) = (&plot.xr, plot.y_max);
    for l in &spec.limits {
        if l.bytes <= y_max {
            let y = plot.y_of(l.bytes);
            let mut x = xr.start;
            while x < xr.end {
                root.draw(&PathElement::new(
                    vec![(x, y), ((x + 6).min(xr.end), y)],
                    CAPACITY.stroke_width(1),
                ))?;
                x += 10;
            }
        }
    }
    Ok(())
}

/// NVTX ranges: rows above the plot; narrow instances collapse into one pixel each. Bands that
/// touch or overlap on a row are drawn as one rectangle (one canvas operation for a run of
/// steps); a name is written where a rectangle is one range, or one name, and wide.
fn draw_ranges<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Drawn<DB> {
    let (th, xr, t0, t1) = (spec.theme, &plot.xr, plot.t0, plot.t1);
    let px = |t| plot.px(t);
    struct Run<'n> {
        a: i32,
        b: i32,
        end_nanos: u64,
        name: Option<&'n str>,
    }
    // Bands less than a pixel apart in time touch.
    let px_nanos = (t1 - t0) / u64::from((xr.end - xr.start).max(1) as u32);
    let mut runs: [Option<Run<'_>>; 3] = [None, None, None];
    let flush = |row: usize, run: Run<'_>| -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let top = 4 + row as i32 * RANGE_ROW_PX;
        let color = PALETTE[(row + 3) % PALETTE.len()];
        root.draw(&Rectangle::new(
            [(run.a, top), (run.b, top + RANGE_ROW_PX - 2)],
            color.mix(0.35).filled(),
        ))?;
        let chars = ((run.b - run.a) / 7) as usize;
        if let Some(name) = run.name
            && chars >= 3
        {
            let name: String = name.chars().take(chars).collect();
            root.draw(&Text::new(
                name,
                (run.a + 2, top),
                ("sans-serif", 10).into_font().color(&th.foreground),
            ))?;
        }
        Ok(())
    };
    for r in &spec.ranges {
        let row = (r.depth as usize).min(2);
        let (a, b) = (
            px(r.begin_nanos),
            px(r.end_nanos).max(px(r.begin_nanos) + 1),
        );
        match runs[row].as_mut() {
            Some(run) if a <= run.b || r.begin_nanos <= run.end_nanos.saturating_add(px_nanos) => {
                run.end_nanos = run.end_nanos.max(r.end_nanos);
                if b > run.b {
                    run.b = b;
                }
                if run.name != Some(r.name) {
                    run.name = None;
                }
            }
            _ => {
                let next = Run {
                    a,
                    b,
                    end_nanos: r.end_nanos,
                    name: Some(r.name),
                };
                if let Some(done) = runs[row].replace(next) {
                    flush(row, done)?;
                }
            }
        }
    }
    for (row, run) in runs.into_iter().enumerate() {
        if let Some(run) = run {
            flush(row, run)?;
        }
    }
    Ok(())
}

/// Markers: those within MARKER_BUCKET_PX of each other are one group, drawn as its most severe
/// kind with a line and a triangle; a label (the marker's, or the group's count) where it does
/// not overlap the one before. Returns the markers drawn (the sum of the groups' counts) and
/// the groups.
fn draw_markers<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Result<(u64, u32), DrawingAreaErrorKind<DB::ErrorType>> {
    let (xr, yr, t0, t1) = (&plot.xr, &plot.yr, plot.t0, plot.t1);
    let px = |t| plot.px(t);
    let (mut drawn, mut groups) = (0u64, 0u32);
    let mut label_end_px = i32::MIN;
    let mut i = 0;
    let markers: Vec<&Marker> = spec
        .markers
        .iter()
        .filter(|m| m.ts_nanos >= t0 && m.ts_nanos <= t1)
        .collect();
    while i < markers.len() {
        let first = markers[i];
        let x = px(first.ts_nanos);
        let group = (x - xr.start).div_euclid(MARKER_BUCKET_PX);
        let mut j = i;
        let (mut count, mut kind) = (0u64, first.kind);
        while j < markers.len()
            && (px(markers[j].ts_nanos) - xr.start).div_euclid(MARKER_BUCKET_PX) == group
        {
            count += u64::from(markers[j].count);
            if markers[j].kind.rank() > kind.rank() {
                kind = markers[j].kind;
            }
            j += 1;
        }
        let color = match kind {
            MarkerKind::FailedAlloc => OOM,
            MarkerKind::Teardown => TEARDOWN,
            MarkerKind::Spike => SPIKE,
        };
        root.draw(&PathElement::new(
            vec![(x, yr.start), (x, yr.end)],
            color.stroke_width(1),
        ))?;
        root.draw(&Polygon::new(
            vec![(x - 5, yr.start), (x + 5, yr.start), (x, yr.start + 8)],
            color.filled(),
        ))?;
        if x + 6 > label_end_px {
            let label = if count == 1 {
                first.label.clone()
            } else {
                format!("{count} markers")
            };
            label_end_px = x + 6 + 7 * label.chars().count() as i32;
            root.draw(&Text::new(
                label,
                (x + 6, yr.start + 2),
                ("sans-serif", 11).into_font().color(&color),
            ))?;
        }
        drawn += count;
        groups += 1;
        i = j;
    }
    Ok((drawn, groups))
}

/// The pinned moment: a line and a triangle in its own colour.
fn draw_pin<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Drawn<DB> {
    let yr = &plot.yr;
    let Some(p) = spec.pin_nanos.filter(|&p| p >= plot.t0 && p <= plot.t1) else {
        return Ok(());
    };
    let x = plot.px(p);
    root.draw(&PathElement::new(
        vec![(x, yr.start), (x, yr.end)],
        PIN.stroke_width(2),
    ))?;
    root.draw(&Polygon::new(
        vec![(x - 5, yr.end), (x + 5, yr.end), (x, yr.end - 8)],
        PIN.filled(),
    ))
}

/// Legend, top left inside the plot, on a veil of the background so markers and their labels
/// behind it do not make it unreadable. (The stacked call sites have their own legend next to
/// the chart.)
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
    plot: &Plot,
) -> Drawn<DB> {
    let (th, xr, yr, y_max) = (spec.theme, &plot.xr, &plot.yr, plot.y_max);
    let font = ("sans-serif", 12).into_font().color(&th.foreground);
    let mut entries: Vec<(String, RGBColor)> = spec
        .layers
        .iter()
        .take(8)
        .map(|l| (l.label.clone(), l.color))
        .collect();
    entries.extend(spec.limits.iter().map(|l| {
        let above = if l.bytes > y_max { " (above)" } else { "" };
        (
            format!("{} {}{above}", l.label, fmt_bytes(l.bytes)),
            CAPACITY,
        )
    }));
    if !entries.is_empty() {
        let chars = entries
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0) as i32;
        root.draw(&Rectangle::new(
            [
                (xr.start + 4, yr.start + 2),
                (
                    xr.start + 26 + 7 * chars,
                    yr.start + 6 + 14 * entries.len() as i32,
                ),
            ],
            th.background.mix(0.8).filled(),
        ))?;
    }
    let mut y = yr.start + 4;
    for (label, color) in entries {
        root.draw(&Rectangle::new(
            [(xr.start + 8, y + 2), (xr.start + 18, y + 10)],
            color.filled(),
        ))?;
        root.draw(&Text::new(label, (xr.start + 22, y), font.clone()))?;
        y += 14;
    }
    Ok(())
}

/// Appends a vertex, dropping what adds nothing at pixel precision: a repeat of the last
/// vertex, or a last vertex that lies between its neighbours on one row or column.
fn push_point(v: &mut Vec<(i32, i32)>, p: (i32, i32)) {
    let between = |a: i32, b: i32, c: i32| a.min(c) <= b && b <= a.max(c);
    match v.as_slice() {
        [.., last] if *last == p => {}
        [.., a, b]
            if (a.0 == b.0 && b.0 == p.0 && between(a.1, b.1, p.1))
                || (a.1 == b.1 && b.1 == p.1 && between(a.0, b.0, p.0)) =>
        {
            let n = v.len();
            v[n - 1] = p;
        }
        _ => v.push(p),
    }
}

fn first_time(t: &Timeline) -> u64 {
    t.first_time().unwrap_or(u64::MAX)
}

/// Renders a spec to an SVG document of `width` x `height` pixels.
pub fn to_svg(spec: &ChartSpec<'_>, width: u32, height: u32) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        draw(&root, spec).map_err(|e| format!("cannot draw the chart: {e}"))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::View;
    use analysis_core::synth::{Scenario, generate};

    fn analysis(s: Scenario, events: u64) -> TraceData {
        let (bytes, _) = generate(s, events, 3);
        TraceData::new(analysis_core::load(&bytes).expect("loads"), s.name())
    }

    #[test]
    fn svg_shows_series_markers_and_ranges() {
        let a = analysis(Scenario::Oom, 3_000);
        let vs = ViewState {
            view: View::Timeline,
            ..ViewState::default()
        };
        let spec = timeline_spec(&a, &vs, Theme::LIGHT, None);
        assert!(!spec.markers.is_empty(), "the OOM scenario has failures");
        let svg = to_svg(&spec, 900, 320).expect("draws");
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.contains("OOM "), "failed allocations are marked");
        assert!(svg.contains("process 0"), "legend names the series");
    }

    #[test]
    fn a_trace_with_tensors_draws_the_tensors_inside_the_reserve() {
        let bytes =
            include_bytes!("../../analysis-core/tests/assets/v1.3/every-record-kind.msgpack");
        let a = TraceData::new(analysis_core::load(bytes).expect("loads"), "v1.3");
        let spec = timeline_spec(&a, &ViewState::default(), Theme::LIGHT, None);
        let labels: Vec<&str> = spec.layers.iter().map(|l| l.label.as_str()).collect();
        // The series are the tensors (the framework layer); the driver allocation holding them
        // is the pool's reserve line.
        assert!(labels.contains(&"process 0 · GPU 0"), "{labels:?}");
        assert!(labels.contains(&"reserved (pool) · GPU 0"), "{labels:?}");
        let tensors = &a.model().series[0];
        assert_eq!(
            tensors.live_bytes,
            256 << 10,
            "the live tensor, not the 1 MiB segment"
        );
        assert_eq!(
            a.trace.model.live_at_end_bytes(),
            1 << 20,
            "the trace itself is unchanged"
        );
    }

    #[test]
    fn zoom_window_changes_the_axis_and_mapper() {
        let a = analysis(Scenario::Spikes, 3_000);
        let (lo, hi) = a.time_extent();
        let mid = lo + (hi - lo) / 2;
        let vs = ViewState {
            range_nanos: Some((mid, mid + (hi - lo) / 10)),
            ..ViewState::default()
        };
        let spec = timeline_spec(&a, &vs, Theme::DARK, None);
        let mut out = String::new();
        let map = {
            let root = SVGBackend::with_string(&mut out, (800, 300)).into_drawing_area();
            draw(&root, &spec).expect("draws")
        };
        assert_eq!((map.t0, map.t1), (mid, mid + (hi - lo) / 10));
        assert_eq!(map.time_at(f64::from(map.left_px)), mid);
        assert_eq!(map.time_at(f64::from(map.right_px)), map.t1);
        let t = mid + (hi - lo) / 20;
        assert!((map.x_of(t) - f64::from(map.left_px + map.right_px) / 2.0).abs() < 1.0);
    }

    #[test]
    fn paths_drop_only_vertices_that_add_nothing() {
        let mut v = Vec::new();
        for p in [
            (0, 5),
            (0, 5),
            (1, 5),
            (2, 5),
            (2, 9),
            (2, 1),
            (3, 1),
            (3, 4),
            (3, 6),
        ] {
            push_point(&mut v, p);
        }
        // The repeat and the flat middle go; the spike from 9 down to 1 stays; 4 lies on the way
        // from 1 to 6.
        assert_eq!(v, vec![(0, 5), (2, 5), (2, 9), (2, 1), (3, 1), (3, 6)]);
    }

    #[test]
    fn ranges_get_depths_and_are_clipped_to_the_window() {
        let a = analysis(Scenario::TrainingLeak, 3_000);
        let (lo, hi) = a.time_extent();
        let vs = ViewState::default();
        let all = timeline_spec(&a, &vs, Theme::LIGHT, None).ranges;
        assert!(!all.is_empty());
        assert!(all.iter().any(|r| r.name == "train_step"));
        assert!(all.len() <= 3 * 2000, "merged to O(pixels): {}", all.len());
        let narrow = ViewState {
            range_nanos: Some((lo, lo + (hi - lo) / 10)),
            ..ViewState::default()
        };
        let few = timeline_spec(&a, &narrow, Theme::LIGHT, None).ranges;
        assert!(few.len() < all.len());
    }

    /// Draws `spec` to SVG at 900 x 320 and returns the mapper and the document.
    fn drawn(spec: &ChartSpec<'_>) -> (Mapper, String) {
        let mut out = String::new();
        let map = {
            let root = SVGBackend::with_string(&mut out, (900, 320)).into_drawing_area();
            draw(&root, spec).expect("draws")
        };
        (map, out)
    }

    #[test]
    fn call_sites_stack_under_the_total_and_name_themselves() {
        let a = analysis(Scenario::TrainingLeak, 6_000);
        let f = Filter::default();
        let sites = a.site_series(&f);
        let vs = ViewState::default();
        let spec = timeline_spec(&a, &vs, Theme::LIGHT, Some(&*sites));
        let st = spec.stack.as_ref().expect("stacked with site series");
        assert!(!st.bands.is_empty() && st.bands.len() <= STACKED_SITES);
        assert!(
            spec.layers.iter().all(|l| l.style == LayerStyle::Line),
            "series are lines over the stack"
        );
        let (map, svg) = drawn(&spec);
        let hit = map.stack.clone().expect("stack drawn");
        // The stack's top is the total at every column's sample.
        for c in 0..hit.columns.columns() {
            let sum: u64 = hit.columns.column(c).iter().sum();
            assert_eq!(sum, a.total.value_at(hit.columns.sample_nanos[c]));
        }
        // Just above the bottom of the plot, in the middle, is the lowest band with bytes.
        let x = f64::from(map.left_px + map.right_px) / 2.0;
        let y = f64::from(map.bottom_px) - 1.0;
        let band = map.band_at(x, y).expect("a band at the bottom");
        assert!(band.bytes > 0);
        assert!(
            band.stack.is_none() || st.bands.iter().any(|b| Some(b.stack) == band.stack),
            "names one of the bands"
        );
        assert_eq!(
            map.band_at(x, f64::from(map.top_px) + 1.0),
            None,
            "above the stack"
        );
        assert!(svg.contains("device capacity") || a.model().devices.is_empty());
        // A selected site that is not among the top joins them, drawn solid.
        let small = sites.sites.last().expect("sites").stack;
        let vs = ViewState {
            open_stack: Some(small.0),
            ..ViewState::default()
        };
        let spec = timeline_spec(&a, &vs, Theme::LIGHT, Some(&*sites));
        let st = spec.stack.as_ref().expect("stacked");
        assert_eq!(st.highlight, Some(small));
        assert!(st.bands.iter().any(|b| b.stack == small));
    }

    #[test]
    fn axis_labels_are_round_in_one_unit() {
        let a = analysis(Scenario::Spikes, 3_000);
        let spec = timeline_spec(&a, &ViewState::default(), Theme::LIGHT, None);
        let (map, svg) = drawn(&spec);
        let unit = map.y_labels[0]
            .rsplit(' ')
            .next()
            .expect("a unit")
            .to_string();
        assert!(map.y_labels.len() >= 3, "{:?}", map.y_labels);
        for l in &map.y_labels {
            let (num, u) = l.split_once(' ').expect("number and unit");
            assert_eq!(u, unit, "one unit: {:?}", map.y_labels);
            let v: f64 = num.parse().expect("a number");
            let step: f64 = map.y_labels[1]
                .split(' ')
                .next()
                .unwrap_or("1")
                .parse()
                .expect("a number");
            assert!(
                ((v / step) - (v / step).round()).abs() < 1e-9,
                "{l} is a multiple of {step}"
            );
            assert!(svg.contains(l.as_str()), "{l} is drawn");
        }
    }

    #[test]
    fn the_y_axis_fits_the_window() {
        let a = analysis(Scenario::Spikes, 3_000);
        let whole = drawn(&timeline_spec(
            &a,
            &ViewState::default(),
            Theme::LIGHT,
            None,
        ))
        .0;
        // The first tenth of the trace is below its peak.
        let (lo, hi) = a.time_extent();
        let vs = ViewState {
            range_nanos: Some((lo, lo + (hi - lo) / 10)),
            ..ViewState::default()
        };
        let part = drawn(&timeline_spec(&a, &vs, Theme::LIGHT, None)).0;
        let window_max = a
            .total
            .downsample(lo, lo + (hi - lo) / 10, 1)
            .first()
            .map_or(0, |b| b.max);
        assert!(part.y_max < whole.y_max);
        assert!(part.y_max >= window_max && part.y_max <= window_max + window_max / 5 + 1024);
    }

    #[test]
    fn every_marker_of_the_window_is_drawn_grouped_by_pixel() {
        let a = analysis(Scenario::Spikes, 40_000);
        let f = Filter::default();
        let (lo, hi) = a.time_extent();
        let n = a.markers_in(&f, lo, hi + 1).count() as u64;
        assert!(n > 10, "{n} markers");
        let spec = timeline_spec(&a, &ViewState::default(), Theme::LIGHT, None);
        let (map, _) = drawn(&spec);
        assert_eq!(map.markers_drawn, n);
        assert!(u64::from(map.marker_groups) <= n);
        // Past MAX_MARKERS a window's markers arrive grouped, and still all counted.
        let many: Vec<Marker> = (0..5_000u64)
            .map(|k| Marker {
                ts_nanos: lo + (hi - lo) * k / 5_000,
                label: "m".into(),
                kind: if k == 77 {
                    MarkerKind::FailedAlloc
                } else {
                    MarkerKind::Spike
                },
                count: 1,
            })
            .collect();
        let spec = ChartSpec {
            markers: many,
            ..timeline_spec(&a, &ViewState::default(), Theme::LIGHT, None)
        };
        let (map, svg) = drawn(&spec);
        assert_eq!(map.markers_drawn, 5_000);
        assert!(map.marker_groups <= 900 / MARKER_BUCKET_PX as u32 + 1);
        assert!(svg.contains(" markers"), "groups show their count");
    }
}
