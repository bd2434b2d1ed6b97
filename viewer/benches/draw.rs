//! A zoom step's draw on big traces, without a browser: the timeline's spec and its drawing
//! (downsampled layers, stacked call sites, NVTX bands, markers) onto a backend that draws
//! nothing, so what is measured is the reads of the model, the same code the page runs per
//! frame. `cargo bench -p viewer --bench draw` (1M events by default;
//! `GPUCOLLECT_BENCH_EVENTS` overrides). The whole window is also drawn without the stacked
//! call sites (`…/whole/no-sites`) and after the caches are emptied (`…/whole/cold`). The
//! page's own figures: scripts/bench-browser.sh.

use analysis_core::synth::{Scenario, generate};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, IntoDrawingArea};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};
use viewer::chart::{self, Theme, timeline_spec};
use viewer::data::TraceData;
use viewer::filter::Filter;
use viewer::state::{ViewState, zoom_range};

mod common;

/// A backend that takes every shape and draws nothing.
struct Discard(u32, u32);

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

type Drawn = Result<(), DrawingErrorKind<Never>>;

impl DrawingBackend for Discard {
    type ErrorType = Never;
    fn get_size(&self) -> (u32, u32) {
        (self.0, self.1)
    }
    fn ensure_prepared(&mut self) -> Drawn {
        Ok(())
    }
    fn present(&mut self) -> Drawn {
        Ok(())
    }
    fn draw_pixel(&mut self, p: BackendCoord, _: BackendColor) -> Drawn {
        std::hint::black_box(p);
        Ok(())
    }
    fn draw_line<S: BackendStyle>(&mut self, a: BackendCoord, b: BackendCoord, _: &S) -> Drawn {
        std::hint::black_box((a, b));
        Ok(())
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        _: &S,
    ) -> Drawn {
        consume(path)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vertices: I,
        _: &S,
    ) -> Drawn {
        consume(vertices)
    }
    fn draw_text<T: BackendTextStyle>(&mut self, text: &str, _: &T, _: BackendCoord) -> Drawn {
        std::hint::black_box(text);
        Ok(())
    }
    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        _: &T,
    ) -> Result<(u32, u32), DrawingErrorKind<Never>> {
        Ok((text.len() as u32 * 7, 12))
    }
}

/// Reads every point of a path or polygon, as a backend that draws it would.
fn consume(points: impl IntoIterator<Item = BackendCoord>) -> Drawn {
    points.into_iter().for_each(|p| {
        std::hint::black_box(p);
    });
    Ok(())
}

/// Bytes written before each cold draw: four times this VM's last-level cache (32 MiB).
const EVICT_BYTES: usize = 128 << 20;

/// Writes a word of every 64 bytes of `junk`, so that the caches hold it rather than what the
/// last draw read.
fn evict(junk: &mut [u64]) -> u64 {
    let mut sum = 0u64;
    for x in junk.iter_mut().step_by(8) {
        *x = x.wrapping_add(1);
        sum = sum.wrapping_add(*x);
    }
    std::hint::black_box(sum)
}

fn bench(c: &mut Criterion) {
    let events = common::events_from_env();
    let mut g = c.benchmark_group("draw");
    g.sample_size(20);
    let scenario = Scenario::TrainingLeak;
    let (bytes, _) = generate(scenario, events, 1);
    let a = TraceData::without_report(
        analysis_core::load(&bytes).expect("synthetic trace loads"),
        scenario.name(),
    );
    drop(bytes);
    let sites = a.site_series(&Filter::default());
    let full = a.time_extent();
    // The whole trace, then the windows of three zoom steps in (the page's '+' key).
    let mut windows = vec![("whole", None)];
    let mut cur = full;
    for name in ["1/2", "1/4", "1/8"] {
        cur = zoom_range(cur, cur.0 + (cur.1 - cur.0) / 2, 0.5, full, 1_000);
        windows.push((name, Some(cur)));
    }
    for (name, range_nanos) in windows {
        let vs = ViewState {
            range_nanos,
            ..ViewState::default()
        };
        let draw = |sites| {
            let spec = timeline_spec(&a, &vs, Theme::LIGHT, sites);
            // The benchmark page's canvas: 1280 by 360 CSS pixels.
            let root: DrawingArea<Discard, Shift> = Discard(1280, 360).into_drawing_area();
            chart::draw(&root, &spec).map(|m| m.right_px).ok()
        };
        g.bench_function(format!("{}/{name}", scenario.name()), |b| {
            b.iter(|| draw(Some(&sites)))
        });
        if range_nanos.is_none() {
            // What the whole window's draw spends where: without the stacked call sites, and
            // after the caches are emptied (untimed), as a step to a window not drawn before.
            g.bench_function(format!("{}/{name}/no-sites", scenario.name()), |b| {
                b.iter(|| draw(None))
            });
            let mut junk = vec![0u64; EVICT_BYTES / 8];
            g.bench_function(format!("{}/{name}/cold", scenario.name()), |b| {
                b.iter_batched(
                    || evict(&mut junk),
                    |_| draw(Some(&sites)),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
