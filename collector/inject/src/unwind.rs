//! Native stack capture inside a callback, into a caller-provided buffer (no allocation).
//!
//! - DWARF (default): `_Unwind_Backtrace` (CFI; works without frame pointers). With glibc >= 2.35
//!   and libgcc >= 12 the FDE lookup goes through `_dl_find_object`, which takes no lock.
//! - Frame pointers (`GPUCOLLECT_UNWIND=fp`): DWARF only through the CUDA stack (this library,
//!   libcupti, libcuda), then a frame-pointer walk through the program, much faster. Every
//!   frame-pointer read is bounded to this thread's stack (`[CFA, top)`, top = the thread's TCB,
//!   or `__libc_stack_end` on the main thread) and must move strictly upwards; a program without
//!   frame pointers gets short stacks, not crashes, as long as its stack is a normal thread stack.

use core::ffi::{c_int, c_void};

#[repr(C)]
struct UnwindContext {
    _private: [u8; 0],
}

type TraceFn = extern "C" fn(*mut UnwindContext, *mut c_void) -> c_int;

unsafe extern "C" {
    fn _Unwind_Backtrace(trace: TraceFn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
    fn _Unwind_GetGR(ctx: *mut UnwindContext, index: c_int) -> usize;
    fn _Unwind_GetCFA(ctx: *mut UnwindContext) -> usize;
    static __libc_stack_end: *mut c_void;
}

const URC_NO_REASON: c_int = 0;
const URC_END_OF_STACK: c_int = 5;
/// DWARF register number of rbp on x86-64.
const DWARF_RBP: c_int = 6;

/// Code ranges skipped at the top of a stack (this library and the CUDA libraries).
pub type Ranges = [(usize, usize); 8];

struct Collect<'a> {
    out: &'a mut [u64],
    n: usize,
    skip: &'a Ranges,
    skipping: bool,
    frame_pointers: bool,
    /// (rbp, cfa) of the first recorded frame, for the frame-pointer walk.
    handoff: Option<(usize, usize)>,
}

#[inline]
fn in_ranges(r: &Ranges, ip: usize) -> bool {
    r.iter().any(|&(lo, hi)| ip >= lo && ip < hi)
}

extern "C" fn trace(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: arg is the &mut Collect passed to _Unwind_Backtrace below, alive for the call;
    // ctx is the unwinder's context for this frame.
    let (c, ip) = unsafe { (&mut *arg.cast::<Collect<'_>>(), _Unwind_GetIP(ctx)) };
    if ip == 0 {
        return URC_END_OF_STACK;
    }
    if c.skipping && in_ranges(c.skip, ip) {
        return URC_NO_REASON;
    }
    c.skipping = false;
    if c.n >= c.out.len() {
        return URC_END_OF_STACK;
    }
    c.out[c.n] = ip as u64;
    c.n += 1;
    if c.frame_pointers {
        // SAFETY: reading registers of the current unwind context.
        c.handoff = unsafe { Some((_Unwind_GetGR(ctx, DWARF_RBP), _Unwind_GetCFA(ctx))) };
        return URC_END_OF_STACK;
    }
    URC_NO_REASON
}

/// The highest address of this thread's stack that may be read (called once per thread).
pub fn stack_top() -> usize {
    // SAFETY: getpid/gettid/pthread_self have no preconditions; __libc_stack_end is a glibc
    // variable set before main.
    unsafe {
        if libc::gettid() == libc::getpid() {
            __libc_stack_end as usize
        } else {
            libc::pthread_self() as usize
        }
    }
}

/// Writes return addresses, innermost first, into `out`, skipping the leading frames inside
/// `skip`. Returns the number written.
#[inline(never)]
pub fn capture(out: &mut [u64], skip: &Ranges, frame_pointers: bool, top: usize) -> usize {
    if out.is_empty() {
        return 0;
    }
    let mut c = Collect {
        out,
        n: 0,
        skip,
        skipping: true,
        frame_pointers,
        handoff: None,
    };
    // SAFETY: trace only touches `c` through the pointer, which outlives the call.
    unsafe { _Unwind_Backtrace(trace, (&raw mut c).cast()) };
    let Some((mut rbp, cfa)) = c.handoff else {
        return c.n;
    };
    let lower = cfa.saturating_sub(16);
    while c.n < c.out.len() {
        if rbp % 8 != 0 || rbp < lower || rbp.saturating_add(16) > top {
            break;
        }
        // SAFETY: rbp is 8-aligned and [rbp, rbp+16) lies within this thread's stack
        // ([cfa - 16, top)), which is mapped.
        let (next, ret) = unsafe { (*(rbp as *const usize), *((rbp + 8) as *const usize)) };
        if ret < 4096 {
            break;
        }
        c.out[c.n] = ret as u64;
        c.n += 1;
        if next <= rbp {
            break;
        }
        rbp = next;
    }
    c.n
}
