//! gpucollect-trace: the trace itself. Its records and format (`format`, written by `encode`
//! over `msgpack`), the push decoder that reads them from any stream of bytes (`decode`), the
//! replay model every reader builds from them (`model`, with its live-bytes `timeline` and the
//! user-frame rule of `attribution`), and synthetic traces with planted truth (`synth`).
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

pub mod alloc_store;
pub mod attribution;
pub mod decode;
pub mod encode;
pub mod format;
mod free_times;
pub mod join;
pub mod layers;
pub mod marks;
pub mod model;
pub mod msgpack;
pub mod packed;
mod points;
pub mod range_store;
mod reorder;
pub mod samples;
pub mod split_load;
pub mod synth;
pub mod timeline;

pub use decode::{
    DecodeError, Decoder, MAX_RECORD_BYTES, MAX_WARNINGS_PER_KIND, Warning, WarningLog,
};
pub use encode::Encoder;
pub use format::*;
pub use model::{LoadedTrace, Loader, TraceModel, load};
