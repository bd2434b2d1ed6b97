//! gpucollect-inject: everything that runs inside the traced program. The events it writes and
//! the shared-memory ring that carries them to the collector are gpucollect-ring's.
//!
//! # Design constraints
//! - Loaded by the CUDA driver (`CUDA_INJECTION64_PATH`, [`InitializeInjection`]) and by NVTX
//!   (`NVTX_INJECTION64_PATH`, [`InitializeInjectionNvtx2`]). Nothing links against NVIDIA
//!   libraries: libcupti and the driver are found with `dlopen`/`dlsym` at run time.
//! - Inside CUPTI and NVTX callbacks: no allocation, no locks, no logging, no CUDA calls, no
//!   panics across `extern "C"` (every entry point is wrapped in `catch_unwind`). A callback
//!   copies a fixed-size [`event::Event`] into the process's slot of the shared ring and returns.
//! - The ring ([`ring`]) lives in a memfd created by the collector; an event is in shared memory
//!   before the API call returns to the program, so a SIGKILL right after loses nothing.
//! - Full ring: the producer waits (back-pressure); it drops, and counts the drop, only when the
//!   collector is gone or has not drained for `GPUCOLLECT_MAX_WAIT_MS`.
//!
//! This crate and gpucollect-ring (its `ring/` folder) are the only ones of the workspace allowed
//! to use `unsafe`: FFI with the driver, CUPTI, NVTX and libc, and the shared-memory mapping,
//! cannot be written without it. Every unsafe block says why it is sound.
#![allow(unsafe_code)]

/// Compile-time check that a `#[repr(C)]` mirror of a C struct has the C layout (LP64: x86-64 and
/// aarch64 Linux): its size and each field's offset, as the C header gives them. A mismatch is a
/// build error, not a wrong read at run time.
macro_rules! c_layout {
    ($t:ty, size $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        $(const _: () = assert!(core::mem::offset_of!($t, $field) == $off);)*
    };
}

pub mod host;

#[cfg(target_arch = "x86_64")]
mod cfi;
mod cupti;
mod entry;
mod framework;
mod framework_tracker;
mod modules;
mod nvtx;
mod objects;
mod pools;
mod python;
mod stack;
mod state;
mod unwind;

pub use entry::InitializeInjection;
use gpucollect_ring::{env, event, ring};
pub use nvtx::InitializeInjectionNvtx2;

/// A global allocator for the unit tests that counts each thread's allocations, so a test can
/// show that a callback path allocates nothing.
#[cfg(test)]
pub(crate) mod test_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    /// Allocations made by this thread so far.
    pub(crate) fn count() -> u64 {
        ALLOCATIONS.with(Cell::get)
    }

    struct Counting;

    // SAFETY: every call is passed to the system allocator unchanged; the count is a
    // thread-local Cell with a const initializer and no destructor, so touching it never
    // allocates or re-enters the allocator.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCATIONS.with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's layout is passed on as GlobalAlloc::alloc requires.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: ptr was allocated by System with this layout (alloc above).
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            ALLOCATIONS.with(|c| c.set(c.get() + 1));
            // SAFETY: ptr and layout come from this allocator, as GlobalAlloc::realloc requires.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;
}
