//! analysis-core: the gpucollect trace format, push decoder, replay model, synthetic workloads
//! and detectors (`analysis`, built on `stats`).
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
pub mod attribution;
pub mod config;
pub mod decode;
pub mod encode;
pub mod format;
mod int_hash;
pub mod model;
pub mod msgpack;
pub mod pickle;
pub mod report;
pub mod stats;
pub mod synth;
pub mod timeline;
pub mod torch_snapshot;
pub mod units;

pub use analysis::summarize;
pub use analysis::{Config, analyze};
pub use decode::{
    DecodeError, Decoder, MAX_RECORD_BYTES, MAX_WARNINGS_PER_KIND, Warning, WarningLog,
};
pub use encode::Encoder;
pub use format::*;
pub use model::{LoadedTrace, Loader, TraceModel, load};
pub use report::Report;
