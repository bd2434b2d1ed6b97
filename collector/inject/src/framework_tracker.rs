//! The entry a framework allocator's own trace hook calls in the allocating thread: PyTorch's
//! caching allocator through gpucollect's C++ shim (`gpucollect_torch_tracker.cpp`, built
//! against the installed torch's headers and attached with `attachAllocatorTraceTracker`).
//!
//! # Design constraints
//! - It runs inside the allocator, under its per-device lock, in whichever thread allocated,
//!   often with the GIL held by that thread or by another one waiting on the lock: the same
//!   rules as a CUPTI callback. No allocation, no locks, no logging, no CUDA calls, no GIL; the
//!   stack (native frames, and the Python frames of this thread read without the GIL) is
//!   captured by [`crate::stack::capture`], exactly as for a driver allocation.
//! - It never panics across `extern "C"`, and writes nothing until the process has been
//!   injected (its first `cuInit`), returning 0 then.
//! - The shim, not this entry, knows the framework's types: what crosses is plain integers,
//!   so a new torch release changes the shim's build, never this ABI.

use core::ffi::c_int;
use std::panic::catch_unwind;

use gpucollect_ring::event::{MAX_FRAMES, alloc_kind};

use crate::{framework, state};

/// The framework handed out a block (a tensor's memory): recorded with the caller's stack.
pub const ACTION_ALLOC: u32 = 1;
/// A block was freed (PyTorch's `free_requested`: where `memory_allocated()` drops, before a
/// block other streams used is back in the cache).
pub const ACTION_FREE: u32 = 2;

/// Records one allocator action of `action` ([`ACTION_ALLOC`] or [`ACTION_FREE`]) on
/// `device`: the block at `addr` of `size` bytes (ignored for a free) on `stream`, in pool
/// `pool` (0 for the framework's default pool). An allocation carries the calling thread's
/// stack. Returns 1 when recorded, 0 when the process is not traced (or the collector is gone,
/// or the ring dropped it), -1 for an unknown action.
#[unsafe(no_mangle)]
pub extern "C" fn gpucollect_framework_trace(
    action: u32,
    device: u32,
    addr: u64,
    size: u64,
    stream: u64,
    pool: u64,
) -> c_int {
    if action != ACTION_ALLOC && action != ACTION_FREE {
        return -1;
    }
    catch_unwind(|| {
        let Some(st) = state::get() else {
            return 0;
        };
        if !st.active() {
            return 0;
        }
        let ok = if action == ACTION_ALLOC {
            let mut frames = [0u64; MAX_FRAMES];
            let n = crate::stack::capture(st, &mut frames);
            let block = framework::Block {
                code: alloc_kind::TORCH_BLOCK,
                device,
                addr,
                size,
                stream,
                pool,
            };
            framework::emit_block(st, &block, &frames[..n])
        } else {
            framework::emit_free(st, device, addr, stream, pool)
        };
        c_int::from(ok)
    })
    .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untraced_process_records_nothing_and_allocates_nothing() {
        // No ring in a unit test: the entry returns 0 for both actions and never allocates
        // (it may run under the allocator's lock); an unknown action is refused.
        let before = crate::test_alloc::count();
        assert_eq!(
            gpucollect_framework_trace(ACTION_ALLOC, 0, 0x1000, 512, 0, 0),
            0
        );
        assert_eq!(
            gpucollect_framework_trace(ACTION_FREE, 0, 0x1000, 0, 0, 0),
            0
        );
        assert_eq!(crate::test_alloc::count(), before);
        assert_eq!(gpucollect_framework_trace(7, 0, 0x1000, 512, 0, 0), -1);
    }
}
