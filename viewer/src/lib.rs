//! gpucollect viewer: drag a trace into the page and see its GPU memory. Nothing is uploaded:
//! the trace is decoded and analysed in WebAssembly by the same `analysis-core` the CLI uses.
//!
//! # Layout
//! - [`state`]: the view state that the URL fragment carries (shareable links).
//! - [`data`]: the loaded trace, its `Report`, and the tables and series the views show.
//! - [`filter`]: the process, device or thread the views are narrowed to.
//! - [`chart`]: time charts drawn with plotters (canvas in the app, SVG for export and tests).
//! - [`chart_index`]: per-trace indexes that keep a zoom step O(pixels) at 10 M events.
//! - [`site_series`]: live bytes per call site over time, for the stacked timeline.
//! - [`markers`]: failed allocations, teardowns and spikes as chart markers.
//! - [`flame`]: a moment's live memory as a tree of frames (the icicle graph).
//! - [`ticks`]: axis ticks at round numbers of one unit.
//! - `app` (wasm32 only): the Leptos components, loading, and browser glue.
//!
//! # Design constraints
//! - Everything but `app` is plain Rust and tested natively (`cargo test -p viewer`).
//! - Drawing is O(pixels): charts downsample with `Timeline::downsample`.
//! - Decoding yields to the event loop between chunks so the page stays responsive.

pub mod chart;
pub mod chart_index;
pub mod data;
pub mod filter;
pub mod flame;
pub mod markers;
pub mod served;
pub mod site_series;
pub mod state;
pub mod ticks;

#[cfg(target_arch = "wasm32")]
pub mod app;
