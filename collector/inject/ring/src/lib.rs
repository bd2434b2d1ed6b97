//! gpucollect-ring: the protocol gpucollect (the collector) and gpucollect-inject (the library
//! inside the traced program) speak. [`event::Event`] is the fixed-size record a CUPTI or NVTX
//! callback writes; [`ring`] is the shared-memory ring of per-process slots that carries events
//! from the program to the collector; [`env`](mod@env) names the environment variables through which the
//! collector configures the library. Both sides compile this one crate, so they always agree on
//! the layout.
//!
//! `unsafe` is allowed here as in gpucollect-inject, for the shared mapping only (mmap, and
//! atomics on the mapped memory); every block says why it is sound.
#![allow(unsafe_code)]

pub mod event;
pub mod ring;

/// Environment variables shared by the collector and the injection library (read in one place:
/// `state` in the injection library, `capture` in the collector).
pub mod env {
    /// Path of the ring to open (`/proc/<collector pid>/fd/<memfd>`).
    pub const RING: &str = "GPUCOLLECT_RING";
    /// Native frames recorded per allocation; 0 disables stacks. Default 32, max 64.
    pub const STACK_DEPTH: &str = "GPUCOLLECT_STACK_DEPTH";
    /// Explicit libcupti path, tried before the usual locations.
    pub const CUPTI_PATH: &str = "GPUCOLLECT_CUPTI_PATH";
    /// `fp`: frame-pointer walk after the CUDA stack (fast; needs frame pointers); `libgcc`:
    /// `_Unwind_Backtrace` for the whole stack (hidden, for comparisons); default: our cached
    /// CFI walk.
    pub const UNWIND: &str = "GPUCOLLECT_UNWIND";
    /// How long a producer waits on a full ring before dropping (default 10000 ms).
    pub const MAX_WAIT_MS: &str = "GPUCOLLECT_MAX_WAIT_MS";
    /// Interval of the pool poller in milliseconds (default 50; 0 disables it).
    pub const POOL_INTERVAL_MS: &str = "GPUCOLLECT_POOL_INTERVAL_MS";
    /// `0`: no Python frames in stacks, even in a Python program (default: on).
    pub const PYTHON_FRAMES: &str = "GPUCOLLECT_PYTHON_FRAMES";
}
