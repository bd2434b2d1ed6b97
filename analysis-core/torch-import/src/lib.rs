//! gpucollect-torch-import: PyTorch memory snapshots (`torch.cuda.memory._snapshot()`, as
//! written by `_dump_snapshot` in pickle or as JSON) converted into gpucollect trace records as
//! the bytes arrive (`torch_snapshot::SnapshotLoader`). `pickle` reads the data-only subset of
//! pickle PyTorch writes (never executing anything) into a compact value arena; its child
//! `pickle::json` reads the same data as JSON into the same arena.
//!
//! Same constraints as gpucollect-trace: `#![no_std]` + `alloc`, no I/O, threads, clocks or
//! logging, and every input byte costs a bounded amount of memory and time.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

mod int_hash;
pub mod pickle;
pub mod torch_snapshot;
