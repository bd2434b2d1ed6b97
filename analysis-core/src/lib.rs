//! analysis-core: what every gpucollect front end (CLI, server, viewer) reads traces with. It
//! holds the detectors (`analysis`, built on `stats`, with their thresholds in `config`) and the
//! `report` they fill, and re-exports the two crates under it, so that a front end depends on
//! this crate only:
//! - gpucollect-trace (`analysis-core/trace/`): `format`, `msgpack`, `encode`, `decode`,
//!   `model`, `timeline`, `attribution`, `synth`;
//! - gpucollect-torch-import (`analysis-core/torch-import/`): `pickle`, `torch_snapshot`.
//!
//! # Design constraints
//! - `#![no_std]` + `alloc`: it runs natively (CLI, server) and in WebAssembly (viewer).
//! - No I/O, threads, clocks or logging. Callers push bytes in and read results out
//!   ([`Loader`]), so the same code serves files, stdin, HTTP bodies and browser streams.
//! - Untrusted input never panics and never makes it allocate more than a small multiple of the
//!   bytes it was given.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

pub mod analysis;
pub mod config;
pub mod report;
pub mod stats;
pub mod summary_api;
pub mod units;

pub use gpucollect_torch_import::{pickle, torch_snapshot};
pub use gpucollect_trace::{
    attribution, decode, encode, format, join, layers, marks, model, msgpack, packed, split_load,
    synth, timeline,
};

pub use analysis::summarize;
pub use analysis::{Config, Join, Sequential, analyze, analyze_with};
pub use gpucollect_trace::format::*;
pub use gpucollect_trace::{
    DecodeError, Decoder, Encoder, LoadedTrace, Loader, MAX_RECORD_BYTES, MAX_WARNINGS_PER_KIND,
    TraceModel, Warning, WarningLog, load,
};
pub use report::Report;
