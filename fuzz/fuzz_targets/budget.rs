//! The memory budget every reader keeps (FORMAT.md, "Robustness"): at most 8 times its input
//! plus 64 MiB of heap, enforced by a counting global allocator that fails any allocation past
//! it (the process then aborts, which the fuzzer reports as a crash with the input).

use std::alloc::System;

use cap::Cap;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

/// Runs `f`, a reader given `input_len` bytes, with a heap budget of `8 × input_len + 64 MiB`
/// above what is in use now.
pub fn bounded<T>(input_len: usize, f: impl FnOnce() -> T) -> T {
    let budget = input_len.saturating_mul(8).saturating_add(64 << 20);
    let limit = HEAP.allocated().saturating_add(budget);
    let _ = HEAP.set_limit(limit);
    let r = f();
    let _ = HEAP.set_limit(usize::MAX);
    r
}
