//! Time charts drawn with plotters on any backend: the browser canvas in the app, SVG for
//! export and for the native tests. A chart is described by a [`ChartSpec`] (what to draw) and
//! drawn by [`draw`], which returns a [`Mapper`] turning mouse positions into trace times.
//!
//! Drawing cost is O(pixels): every series is downsampled to one min/max bucket per pixel
//! column with `Timeline::downsample`, so a zoom step costs the same at 10 k or 10 M
//! events.

use analysis_core::timeline::Timeline;
use analysis_core::units::{fmt_bytes, fmt_duration};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::data::{Analysis, Filter};
use crate::state::ViewState;

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
const PIN: RGBColor = RGBColor(255, 145, 0);
const SPIKE: RGBColor = RGBColor(230, 81, 0);

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

/// A vertical marker (failed allocation, teardown, spike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub ts_nanos: u64,
    pub label: String,
    pub kind: MarkerKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerKind {
    FailedAlloc,
    Teardown,
    Spike,
}

impl MarkerKind {
    /// The name used in `data-kind` attributes.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::FailedAlloc => "failed-alloc",
            Self::Teardown => "teardown",
            Self::Spike => "spike",
        }
    }
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
}

/// Maps pixels to trace time and back, for one drawn chart.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mapper {
    pub left_px: i32,
    pub right_px: i32,
    pub top_px: i32,
    pub bottom_px: i32,
    pub t0: u64,
    pub t1: u64,
    pub y_max: u64,
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
}

/// Markers drawn at most on one chart.
pub const MAX_MARKERS: usize = 400;

/// Builds the main timeline for the current view state: one band per (process, device), the
/// total, pool reserved/used, NVML device used with the hidden gap, NVTX ranges, failed
/// allocations and teardowns.
pub fn timeline_spec<'a>(a: &'a Analysis, vs: &ViewState, theme: Theme) -> ChartSpec<'a> {
    let (lo, hi) = a.time_extent();
    let (t0, t1) = vs.range_nanos.unwrap_or((lo, hi + 1));
    let f = filter_of(vs);
    let m = &a.trace.model;
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
    for (i, (s, plot)) in series.iter().enumerate() {
        layers.push(Layer {
            label: format!("process {} · GPU {}", s.key.process.0, s.key.device.0),
            timeline: plot,
            color: PALETTE[i % PALETTE.len()],
            style: LayerStyle::Band,
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
    // Markers of the window only; past a few hundred they would overlap into a solid bar.
    let markers: Vec<Marker> = a
        .markers_in(&f, t0, t1)
        .take(MAX_MARKERS)
        .cloned()
        .collect();
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
        markers,
        pin_nanos: vs.pin_nanos,
        y_unit: YUnit::Bytes,
        theme,
    }
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

/// Draws `spec` on `root` (which it clears) and returns the pixel/time mapping.
pub fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec<'_>,
) -> Result<Mapper, DrawingAreaErrorKind<DB::ErrorType>> {
    let th = spec.theme;
    root.fill(&th.background)?;
    let (t0, t1) = (spec.t0, spec.t1.max(spec.t0 + 1));
    let (w, _) = root.dim_in_pixel();
    // First pass: the plot width decides the number of columns; the y range needs the data.
    let y_label_px = 72;
    let columns = (w as i32 - y_label_px - 16).max(1) as usize;
    let buckets: Vec<Vec<analysis_core::timeline::Bucket>> = spec
        .layers
        .iter()
        .map(|l| l.timeline.downsample(t0, t1, columns))
        .collect();
    let data_max = buckets
        .iter()
        .flat_map(|b| b.iter().map(|x| x.max))
        .max()
        .unwrap_or(0);
    let y_max = match spec.y_unit {
        YUnit::Bytes => (data_max + data_max / 10).max(1024),
        YUnit::Permyriad => 10_000,
    };
    let rows = spec.ranges.iter().map(|r| r.depth + 1).max().unwrap_or(0) as i32;
    let font = ("sans-serif", 12).into_font().color(&th.foreground);
    let origin = spec.origin_nanos;
    // Axis in time since the trace start, so its ticks fall on round durations.
    let x_fmt = |t: &u64| fmt_duration(*t);
    let y_fmt = |v: &u64| match spec.y_unit {
        YUnit::Bytes => fmt_bytes(*v),
        YUnit::Permyriad => format!("{} %", v / 100),
    };
    let mut chart = ChartBuilder::on(root)
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
    chart
        .configure_mesh()
        .x_labels(7)
        .y_labels(6)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(font.clone())
        .axis_style(th.foreground)
        .bold_line_style(th.grid)
        .light_line_style(TRANSPARENT)
        .draw()?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let map = Mapper {
        left_px: xr.start,
        right_px: xr.end,
        top_px: yr.start,
        bottom_px: yr.end,
        t0,
        t1,
        y_max,
    };
    let plot_h = f64::from((yr.end - yr.start).max(1));
    // `round_ties_even` is one wasm instruction; `round` is a library call.
    let y_of =
        |v: u64| yr.end - ((v.min(y_max) as f64 / y_max as f64) * plot_h).round_ties_even() as i32;
    let x_of = |c: usize| xr.start + (c as i32 * (xr.end - xr.start)) / columns as i32;

    // The hidden gap: one polygon between the upper (device used) and lower layer.
    if let Some((up, down)) = spec.gap
        && let (Some(u), Some(d)) = (buckets.get(up), buckets.get(down))
    {
        let start = first_time(spec.layers[up].timeline);
        let cols: Vec<(usize, u64, u64)> = u
            .iter()
            .zip(d.iter())
            .enumerate()
            .filter(|(_, (bu, _))| bu.t_end > start)
            .map(|(c, (bu, bd))| (c, bu.last, bd.last.min(bu.last)))
            .collect();
        if !cols.is_empty() {
            let mut poly: Vec<(i32, i32)> = Vec::with_capacity(cols.len() * 4);
            for &(c, hi, _) in &cols {
                push_point(&mut poly, (x_of(c), y_of(hi)));
                push_point(&mut poly, (x_of(c + 1), y_of(hi)));
            }
            for &(c, _, lo) in cols.iter().rev() {
                push_point(&mut poly, (x_of(c + 1), y_of(lo)));
                push_point(&mut poly, (x_of(c), y_of(lo)));
            }
            root.draw(&Polygon::new(poly, DEVICE_USED.mix(0.18).filled()))?;
        }
    }
    for (layer, b) in spec.layers.iter().zip(&buckets) {
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

    // NVTX ranges: rows above the plot; narrow instances collapse into one pixel each.
    let span = (t1 - t0) as f64;
    let px = |t: u64| -> i32 {
        let t = t.clamp(t0, t1);
        xr.start
            + (((t - t0) as f64 / span) * f64::from(xr.end - xr.start)).round_ties_even() as i32
    };
    // Bands that touch or overlap on a row are drawn as one rectangle (one canvas operation for
    // a run of steps); a name is written where a rectangle is one range, or one name, and wide.
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

    // Markers: a line and a triangle each; a label where it does not overlap the one before.
    let mut label_end_px = i32::MIN;
    for m in &spec.markers {
        if m.ts_nanos < t0 || m.ts_nanos > t1 {
            continue;
        }
        let x = px(m.ts_nanos);
        let color = match m.kind {
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
            label_end_px = x + 6 + 7 * m.label.chars().count() as i32;
            root.draw(&Text::new(
                m.label.clone(),
                (x + 6, yr.start + 2),
                ("sans-serif", 11).into_font().color(&color),
            ))?;
        }
    }
    if let Some(p) = spec.pin_nanos
        && p >= t0
        && p <= t1
    {
        let x = px(p);
        root.draw(&PathElement::new(
            vec![(x, yr.start), (x, yr.end)],
            PIN.stroke_width(2),
        ))?;
    }

    // Legend, top left inside the plot, on a veil of the background so markers and their
    // labels behind it do not make it unreadable.
    let shown = spec.layers.len().min(8);
    if shown > 0 {
        let chars = spec.layers[..shown]
            .iter()
            .map(|l| l.label.chars().count())
            .max()
            .unwrap_or(0) as i32;
        root.draw(&Rectangle::new(
            [
                (xr.start + 4, yr.start + 2),
                (xr.start + 26 + 7 * chars, yr.start + 6 + 14 * shown as i32),
            ],
            th.background.mix(0.8).filled(),
        ))?;
    }
    let mut y = yr.start + 4;
    for l in spec.layers.iter().take(8) {
        root.draw(&Rectangle::new(
            [(xr.start + 8, y + 2), (xr.start + 18, y + 10)],
            l.color.filled(),
        ))?;
        root.draw(&Text::new(
            l.label.clone(),
            (xr.start + 22, y),
            font.clone(),
        ))?;
        y += 14;
    }
    root.present()?;
    Ok(map)
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
    t.times().first().copied().unwrap_or(u64::MAX)
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

    fn analysis(s: Scenario, events: u64) -> Analysis {
        let (bytes, _) = generate(s, events, 3);
        Analysis::new(analysis_core::load(&bytes).expect("loads"), s.name())
    }

    #[test]
    fn svg_shows_series_markers_and_ranges() {
        let a = analysis(Scenario::Oom, 3_000);
        let vs = ViewState {
            view: View::Timeline,
            ..ViewState::default()
        };
        let spec = timeline_spec(&a, &vs, Theme::LIGHT);
        assert!(!spec.markers.is_empty(), "the OOM scenario has failures");
        let svg = to_svg(&spec, 900, 320).expect("draws");
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.contains("OOM "), "failed allocations are marked");
        assert!(svg.contains("process 0"), "legend names the series");
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
        let spec = timeline_spec(&a, &vs, Theme::DARK);
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
        let all = timeline_spec(&a, &vs, Theme::LIGHT).ranges;
        assert!(!all.is_empty());
        assert!(all.iter().any(|r| r.name == "train_step"));
        assert!(all.len() <= 3 * 2000, "merged to O(pixels): {}", all.len());
        let narrow = ViewState {
            range_nanos: Some((lo, lo + (hi - lo) / 10)),
            ..ViewState::default()
        };
        let few = timeline_spec(&a, &narrow, Theme::LIGHT).ranges;
        assert!(few.len() < all.len());
    }
}
