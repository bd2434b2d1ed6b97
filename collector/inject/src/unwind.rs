//! Native stack capture inside a callback: `_Unwind_Backtrace` (DWARF CFI, works without frame
//! pointers) into a caller-provided buffer. No allocation; with glibc >= 2.35 and libgcc >= 12
//! the FDE lookup goes through `_dl_find_object`, which takes no lock.

use core::ffi::{c_int, c_void};

#[repr(C)]
struct UnwindContext {
    _private: [u8; 0],
}

type TraceFn = extern "C" fn(*mut UnwindContext, *mut c_void) -> c_int;

unsafe extern "C" {
    fn _Unwind_Backtrace(trace: TraceFn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
}

const URC_NO_REASON: c_int = 0;
const URC_END_OF_STACK: c_int = 5;

struct Collect<'a> {
    out: &'a mut [u64],
    n: usize,
    skip_lo: usize,
    skip_hi: usize,
    skipping: bool,
}

extern "C" fn trace(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: arg is the &mut Collect passed to _Unwind_Backtrace below, alive for the call;
    // ctx is the unwinder's context for this frame.
    let (c, ip) = unsafe { (&mut *arg.cast::<Collect<'_>>(), _Unwind_GetIP(ctx)) };
    if ip == 0 {
        return URC_END_OF_STACK;
    }
    if c.skipping && ip >= c.skip_lo && ip < c.skip_hi {
        return URC_NO_REASON;
    }
    c.skipping = false;
    if c.n >= c.out.len() {
        return URC_END_OF_STACK;
    }
    c.out[c.n] = ip as u64;
    c.n += 1;
    URC_NO_REASON
}

/// Writes return addresses, innermost first, into `out`, skipping the leading frames inside
/// `[skip_lo, skip_hi)` (this library). Returns the number written.
#[inline(never)]
pub fn capture(out: &mut [u64], skip_lo: usize, skip_hi: usize) -> usize {
    if out.is_empty() {
        return 0;
    }
    let mut c = Collect {
        out,
        n: 0,
        skip_lo,
        skip_hi,
        skipping: true,
    };
    // SAFETY: trace only touches `c` through the pointer, which outlives the call.
    unsafe { _Unwind_Backtrace(trace, (&raw mut c).cast()) };
    c.n
}
