//! Native stack capture inside a callback, into a caller-provided buffer (no allocation, no lock).
//!
//! - CFI (default, x86-64 with glibc >= 2.35): our own walk over `.eh_frame` rules
//!   ([`crate::cfi`]): per frame one lookup in a preallocated lock-free rule cache and one or two
//!   reads of the stack; a cache miss finds the FDE through `_dl_find_object` (lock-free) and
//!   `.eh_frame_hdr`. Works without frame pointers and for objects loaded at any time. A frame
//!   whose rule the cache cannot express (CFA expressions, signal frames, code outside any object)
//!   hands the rest of the walk to libgcc, which resumes at that frame.
//! - libgcc (`GPUCOLLECT_UNWIND=libgcc`, hidden; also the fallback where the CFI walk cannot run):
//!   `_Unwind_Backtrace` for the whole stack.
//! - Frame pointers (`GPUCOLLECT_UNWIND=fp`): CFI only through the CUDA stack (this library,
//!   libcupti, libcuda), then a frame-pointer walk through the program.
//!
//! Every read of the stack is bounded to this thread's stack (`[sp, top)`, top = the thread's TCB,
//! or `__libc_stack_end` on the main thread) and the stack pointer must move strictly upwards, so
//! a garbage rule or a program without frame pointers gives a short stack, not a crash, as long as
//! the stack is a normal thread stack.

use core::ffi::{c_int, c_void};

#[cfg(target_arch = "x86_64")]
use crate::cfi::{self, Rule};

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
/// Frames a CFI walk visits at most (skipped ones included).
#[cfg(target_arch = "x86_64")]
const MAX_WALK: usize = 256;

/// Code ranges skipped at the top of a stack (this library and the CUDA libraries).
pub type Ranges = [(usize, usize); 8];

/// How [`capture`] walks the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Our CFI walk with the rule cache (libgcc where it cannot run).
    Cfi,
    /// CFI through the skipped frames, then frame pointers.
    FramePointers,
    /// libgcc's `_Unwind_Backtrace` for everything.
    Libgcc,
}

#[inline]
fn in_ranges(r: &Ranges, ip: usize) -> bool {
    r.iter().any(|&(lo, hi)| ip >= lo && ip < hi)
}

/// The highest address of this thread's stack that may be read, or 0 when the current stack is
/// not recognised (then nothing beyond the first frame is read). glibc puts a thread's TCB
/// (`pthread_self()`) right above its stack; the main thread's stack ends at `__libc_stack_end`.
/// Callback-safe; call it once per thread.
#[inline(never)]
pub fn stack_top() -> usize {
    let marker = 0u8;
    let here = core::hint::black_box(&raw const marker) as usize;
    // SAFETY: pthread_self has no preconditions; __libc_stack_end is a glibc variable set
    // before main.
    let (tcb, main_end) = unsafe { (libc::pthread_self() as usize, __libc_stack_end as usize) };
    if here < tcb && tcb - here < 1 << 32 {
        tcb
    } else if here < main_end {
        main_end
    } else {
        0
    }
}

/// Writes return addresses, innermost first, into `out`, skipping the leading frames inside
/// `skip`. `top` is [`stack_top`] of this thread. Returns the number written.
#[inline(never)]
pub fn capture(out: &mut [u64], skip: &Ranges, method: Method, top: usize) -> usize {
    if out.is_empty() {
        return 0;
    }
    let frame_pointers = method == Method::FramePointers;
    // Without a known stack top, nothing could be read: libgcc does the whole walk.
    #[cfg(target_arch = "x86_64")]
    if method != Method::Libgcc && top != 0 && crate::objects::can_find_objects() {
        let regs = here();
        return match walk(regs, out, skip, frame_pointers, top) {
            End::Done(n) => n,
            End::Handoff { n, bp, sp } => frame_pointer_walk(out, n, bp, sp, top),
            End::Resume { n, skipping, after } => {
                libgcc(out, n, skip, skipping, frame_pointers, after, top)
            }
        };
    }
    libgcc(out, 0, skip, true, frame_pointers, None, top)
}

/// The registers a walk needs of one frame.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
struct Regs {
    ip: usize,
    sp: usize,
    bp: usize,
}

/// The registers at this point of the calling function.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn here() -> Regs {
    let (ip, sp, bp): (usize, usize, usize);
    // SAFETY: copies rip, rsp and rbp into registers; touches no memory and no stack.
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { ip, sp, bp }
}

/// How a CFI walk ended.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// `out` holds `n` frames: full, the outermost frame, or a frame that failed the checks.
    Done(usize),
    /// Frame-pointer mode: the first recorded frame's rbp and rsp, to walk on from.
    Handoff { n: usize, bp: usize, sp: usize },
    /// A frame has no cacheable rule: libgcc goes on after the frame at `after` = (ip, sp), or
    /// from the start when it is the first frame (whose ip libgcc never reports).
    Resume {
        n: usize,
        skipping: bool,
        after: Option<(usize, usize)>,
    },
}

/// Reads one word of this thread's stack.
///
/// # Safety
/// `[addr, addr + 8)` must lie within `[sp, top)` of the current thread's stack.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn read_stack(addr: usize) -> usize {
    // SAFETY: the caller checked the bounds; the stack is mapped and unaligned reads are fine.
    unsafe { (addr as *const usize).read_unaligned() }
}

/// Walks from `regs` (a frame of the caller, whose own frames stay untouched during the walk)
/// with the cached CFI rules.
#[cfg(target_arch = "x86_64")]
fn walk(mut regs: Regs, out: &mut [u64], skip: &Ranges, frame_pointers: bool, top: usize) -> End {
    let mut n = 0;
    let mut skipping = true;
    for i in 0..MAX_WALK {
        if !(skipping && in_ranges(skip, regs.ip)) {
            skipping = false;
            let Some(slot) = out.get_mut(n) else {
                return End::Done(n);
            };
            *slot = regs.ip as u64;
            n += 1;
            if frame_pointers {
                return End::Handoff {
                    n,
                    bp: regs.bp,
                    sp: regs.sp,
                };
            }
            if n == out.len() {
                return End::Done(n);
            }
        }
        // A return address is just past the call; the call itself is what the rule is for.
        match cfi::rule_for(regs.ip.wrapping_sub(1)) {
            Rule::Outermost => return End::Done(n),
            Rule::Unknown => {
                return End::Resume {
                    n,
                    skipping,
                    after: (i > 0).then_some((regs.ip, regs.sp)),
                };
            }
            Rule::Frame {
                cfa_rbp,
                cfa_off,
                rbp_off,
            } => {
                let base = if cfa_rbp { regs.bp } else { regs.sp };
                let cfa = base.wrapping_add_signed(cfa_off as isize);
                if cfa < regs.sp.saturating_add(8) || cfa > top {
                    return End::Done(n);
                }
                // SAFETY: sp <= cfa - 8 and cfa <= top: the word is in this thread's stack.
                let ip = unsafe { read_stack(cfa - 8) };
                let bp = match rbp_off {
                    None => regs.bp,
                    Some(off) => {
                        let at = cfa.wrapping_add_signed(off as isize);
                        if at < regs.sp || at > top.saturating_sub(8) {
                            return End::Done(n);
                        }
                        // SAFETY: sp <= at and at + 8 <= top: in this thread's stack.
                        unsafe { read_stack(at) }
                    }
                };
                if ip == 0 {
                    return End::Done(n);
                }
                regs = Regs { ip, sp: cfa, bp };
            }
        }
    }
    End::Done(n)
}

/// Follows the rbp chain from a frame whose rbp and rsp are known, appending return addresses
/// after the `n` already in `out`.
fn frame_pointer_walk(
    out: &mut [u64],
    mut n: usize,
    mut rbp: usize,
    sp: usize,
    top: usize,
) -> usize {
    let lower = sp.saturating_sub(16);
    while n < out.len() {
        if !rbp.is_multiple_of(8) || rbp < lower || rbp.saturating_add(16) > top {
            break;
        }
        // SAFETY: rbp is 8-aligned and [rbp, rbp+16) lies within this thread's stack
        // ([sp - 16, top)), which is mapped.
        let (next, ret) = unsafe { (*(rbp as *const usize), *((rbp + 8) as *const usize)) };
        if ret < 4096 {
            break;
        }
        out[n] = ret as u64;
        n += 1;
        if next <= rbp {
            break;
        }
        rbp = next;
    }
    n
}

struct Collect<'a> {
    out: &'a mut [u64],
    n: usize,
    skip: &'a Ranges,
    skipping: bool,
    frame_pointers: bool,
    /// (rbp, cfa) of the first recorded frame, for the frame-pointer walk.
    handoff: Option<(usize, usize)>,
    /// Frames are ignored up to and including the one with this (ip, sp): the CFI walk already
    /// handled them.
    resume: Option<(usize, usize)>,
}

extern "C" fn trace(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: arg is the &mut Collect passed to _Unwind_Backtrace below, alive for the call;
    // ctx is the unwinder's context for this frame.
    let (c, ip) = unsafe { (&mut *arg.cast::<Collect<'_>>(), _Unwind_GetIP(ctx)) };
    if ip == 0 {
        return URC_END_OF_STACK;
    }
    if let Some((resume_ip, resume_sp)) = c.resume {
        // libgcc's CFA of the context is the frame's stack pointer (the callee's CFA).
        // SAFETY: reading the CFA of the current unwind context.
        if ip == resume_ip && unsafe { _Unwind_GetCFA(ctx) } == resume_sp {
            c.resume = None;
        }
        return URC_NO_REASON;
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

/// `_Unwind_Backtrace` from here, appending after the `n` frames in `out`; with `resume`, only
/// the frames above that (ip, sp) are recorded.
#[inline(never)]
fn libgcc(
    out: &mut [u64],
    n: usize,
    skip: &Ranges,
    skipping: bool,
    frame_pointers: bool,
    resume: Option<(usize, usize)>,
    top: usize,
) -> usize {
    let mut c = Collect {
        out,
        n,
        skip,
        skipping,
        frame_pointers,
        handoff: None,
        resume,
    };
    // SAFETY: trace only touches `c` through the pointer, which outlives the call.
    unsafe { _Unwind_Backtrace(trace, (&raw mut c).cast()) };
    let Some((rbp, cfa)) = c.handoff else {
        return c.n;
    };
    frame_pointer_walk(c.out, c.n, rbp, cfa, top)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    const NO_SKIP: Ranges = [(0, 0); 8];

    // Three functions with hand-written CFI that call `f(arg)`:
    // - no_fp: no frame pointer, and rbp holds garbage while it calls (a frame-pointer walk
    //   through it goes wrong);
    // - rbp_frame: CFA from rbp after realigning rsp to 64 bytes, and the call after a
    //   remember_state/restore_state pair (an early return);
    // - cfa_expression: the CFA as a DWARF expression (DW_OP_breg7 rsp + 16), which the rule
    //   cache cannot express: the walk hands over to libgcc there.
    core::arch::global_asm!(
        ".text",
        ".p2align 4",
        ".globl gpucollect_test_no_fp",
        ".hidden gpucollect_test_no_fp",
        ".type gpucollect_test_no_fp,@function",
        "gpucollect_test_no_fp:",
        ".cfi_startproc",
        "push %rbp",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset %rbp, -16",
        "push %rbx",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset %rbx, -24",
        "sub $40, %rsp",
        ".cfi_adjust_cfa_offset 40",
        "movabs $0x5a5a5a5a5a5a5a5a, %rbp",
        "mov %rdi, %rax",
        "mov %rsi, %rdi",
        "call *%rax",
        "add $40, %rsp",
        ".cfi_adjust_cfa_offset -40",
        "pop %rbx",
        ".cfi_adjust_cfa_offset -8",
        "pop %rbp",
        ".cfi_adjust_cfa_offset -8",
        "ret",
        ".cfi_endproc",
        ".size gpucollect_test_no_fp, .-gpucollect_test_no_fp",
        "",
        ".p2align 4",
        ".globl gpucollect_test_rbp_frame",
        ".hidden gpucollect_test_rbp_frame",
        ".type gpucollect_test_rbp_frame,@function",
        "gpucollect_test_rbp_frame:",
        ".cfi_startproc",
        "push %rbp",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset %rbp, -16",
        "mov %rsp, %rbp",
        ".cfi_def_cfa_register %rbp",
        "and $-64, %rsp",
        "sub $64, %rsp",
        "test %rdi, %rdi",
        "jne 2f",
        ".cfi_remember_state",
        "leave",
        ".cfi_def_cfa %rsp, 8",
        "ret",
        "2:",
        ".cfi_restore_state",
        "mov %rdi, %rax",
        "mov %rsi, %rdi",
        "call *%rax",
        "leave",
        ".cfi_def_cfa %rsp, 8",
        "ret",
        ".cfi_endproc",
        ".size gpucollect_test_rbp_frame, .-gpucollect_test_rbp_frame",
        "",
        ".p2align 4",
        ".globl gpucollect_test_cfa_expression",
        ".hidden gpucollect_test_cfa_expression",
        ".type gpucollect_test_cfa_expression,@function",
        "gpucollect_test_cfa_expression:",
        ".cfi_startproc",
        "sub $8, %rsp",
        ".cfi_escape 0x0f, 0x02, 0x77, 0x10",
        "mov %rdi, %rax",
        "mov %rsi, %rdi",
        "call *%rax",
        "add $8, %rsp",
        ".cfi_def_cfa_offset 8",
        "ret",
        ".cfi_endproc",
        ".size gpucollect_test_cfa_expression, .-gpucollect_test_cfa_expression",
        options(att_syntax),
    );

    type Callback = extern "C" fn(*mut c_void);
    type AsmFn = unsafe extern "C" fn(Callback, *mut c_void);

    unsafe extern "C" {
        fn gpucollect_test_no_fp(f: Callback, arg: *mut c_void);
        fn gpucollect_test_rbp_frame(f: Callback, arg: *mut c_void);
        fn gpucollect_test_cfa_expression(f: Callback, arg: *mut c_void);
    }

    /// Which asm functions to go through, outermost first, then what to do at the bottom.
    struct Chain<'a> {
        through: &'a [AsmFn],
        bottom: &'a mut dyn FnMut(),
    }

    extern "C" fn step(arg: *mut c_void) {
        // SAFETY: arg is the &mut Chain passed by `run_chain` (or by the previous step).
        let chain = unsafe { &mut *arg.cast::<Chain<'_>>() };
        nested(chain, 2);
    }

    #[inline(never)]
    fn nested(chain: &mut Chain<'_>, depth: u32) {
        if depth > 0 {
            nested(chain, depth - 1);
            core::hint::black_box(depth);
            return;
        }
        match chain.through.split_first() {
            None => (chain.bottom)(),
            Some((f, rest)) => {
                let mut next = Chain {
                    through: rest,
                    bottom: &mut *chain.bottom,
                };
                // SAFETY: the asm functions call `step` with the pointer, which lives on this
                // frame for the call.
                unsafe { f(step, (&raw mut next).cast()) };
            }
        }
        core::hint::black_box(depth);
    }

    fn run_chain(through: &[AsmFn], mut bottom: impl FnMut()) {
        let mut chain = Chain {
            through,
            bottom: &mut bottom,
        };
        nested(&mut chain, 1);
    }

    fn init() {
        crate::objects::resolve_find_object();
        assert!(
            crate::objects::can_find_objects(),
            "the CFI walk needs _dl_find_object (glibc >= 2.35)"
        );
    }

    #[inline(never)]
    fn capture_with(method: Method, skip: &Ranges, depth: usize) -> Vec<u64> {
        let mut out = [0u64; 200];
        let n = capture(&mut out[..depth], skip, method, stack_top());
        out[..n].to_vec()
    }

    /// Captures with our walk and with libgcc from the same call site: the frames must be the
    /// same except the top two (inside `capture`, and libgcc's own helper).
    fn same_as_libgcc() -> Vec<u64> {
        let mut got = Vec::new();
        for m in [Method::Cfi, Method::Libgcc] {
            got.push(capture_with(m, &NO_SKIP, 200));
        }
        let (ours, theirs) = (&got[0], &got[1]);
        assert!(theirs.len() > 10, "{theirs:x?}");
        assert_eq!(ours[1..], theirs[2..], "ours {ours:x?}\nlibgcc {theirs:x?}");
        ours.clone()
    }

    /// Through the chain `fns`: the walk equals libgcc's and passes through every function, and
    /// our own walk alone ends as `expect` says.
    fn check_chain(fns: &[AsmFn], expect: impl Fn(&End) -> bool) {
        let mut frames = Vec::new();
        run_chain(fns, || frames = same_as_libgcc());
        for &f in fns {
            assert!(inside(&frames, f), "{frames:x?}");
        }
        run_chain(fns, || {
            let mut out = [0u64; 200];
            let end = walk(here(), &mut out, &NO_SKIP, false, stack_top());
            assert!(expect(&end), "{end:?}");
        });
    }

    fn inside(frames: &[u64], f: AsmFn) -> bool {
        let start = f as usize as u64;
        frames.iter().any(|&ip| ip > start && ip - start < 64)
    }

    #[test]
    fn the_walk_matches_libgcc_through_functions_without_frame_pointers() {
        init();
        // rbp_frame outside no_fp: its CFA needs the rbp that no_fp saved and clobbered.
        let fns: [AsmFn; 3] = [
            gpucollect_test_rbp_frame,
            gpucollect_test_no_fp,
            gpucollect_test_rbp_frame,
        ];
        // And the walk itself never needed libgcc.
        check_chain(&fns, |end| matches!(end, End::Done(n) if *n > 10));
    }

    #[test]
    fn a_frame_the_cache_cannot_express_is_continued_by_libgcc() {
        init();
        let fns: [AsmFn; 3] = [
            gpucollect_test_no_fp,
            gpucollect_test_cfa_expression,
            gpucollect_test_rbp_frame,
        ];
        check_chain(&fns, |end| matches!(end, End::Resume { .. }));
    }

    #[test]
    fn threads_and_depth_limits() {
        init();
        std::thread::spawn(|| {
            run_chain(&[gpucollect_test_no_fp], || {
                let frames = same_as_libgcc();
                // A short buffer takes the innermost frames.
                let short = capture_with(Method::Cfi, &NO_SKIP, 3);
                assert_eq!(short.len(), 3);
                assert_eq!(short[..2], frames[..2]);
            });
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn skipped_ranges_and_the_frame_pointer_handoff() {
        init();
        run_chain(&[gpucollect_test_rbp_frame], || {
            let mut skip = NO_SKIP;
            let mut got = Vec::new();
            for method in [Method::Cfi, Method::Cfi, Method::FramePointers] {
                got.push(capture_with(method, &skip, 200));
                if got.len() > 1 {
                    continue;
                }
                // Skip each frame above the return address inside rbp_frame (one-byte ranges).
                let all = &got[0];
                let i = all
                    .iter()
                    .position(|&ip| inside(&[ip], gpucollect_test_rbp_frame))
                    .expect("rbp_frame on the stack");
                assert!(i <= 8, "{all:x?}");
                for (r, &ip) in skip.iter_mut().zip(&all[..i]) {
                    *r = (ip as usize, ip as usize + 1);
                }
            }
            let all = &got[0];
            let i = all.len() - got[1].len();
            assert!(
                inside(&got[1][..1], gpucollect_test_rbp_frame),
                "{:x?}",
                got[1]
            );
            assert_eq!(got[1], all[i..]);
            // rbp_frame keeps a frame pointer, so a frame-pointer walk from it goes on.
            let fp = &got[2];
            assert!(fp.len() >= 2 && fp[..2] == all[i..i + 2], "{fp:x?}");
        });
    }

    #[test]
    fn garbage_stacks_give_short_stacks_not_crashes() {
        init();
        // A fake stack of words that look like code addresses, stack addresses and noise.
        let code = [
            gpucollect_test_no_fp as *const () as usize,
            gpucollect_test_rbp_frame as *const () as usize,
            capture_with as *const () as usize,
            walk as *const () as usize,
        ];
        let mut fake = [0usize; 512];
        let base = fake.as_ptr() as usize;
        let mut x = 0x9e37_79b9_7f4a_7c15usize;
        for _round in 0..200 {
            for w in fake.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *w = match x % 4 {
                    0 => code[(x >> 8) % code.len()] + (x >> 20) % 200,
                    1 => base + (x >> 8) % (512 * 8),
                    2 => x,
                    _ => 0,
                };
            }
            let top = base + fake.len() * 8;
            for &ip in &code {
                let regs = Regs {
                    ip: ip + x % 100,
                    sp: base + (x >> 32) % 64 * 8,
                    bp: fake[(x >> 16) % fake.len()],
                };
                let mut out = [0u64; 64];
                let end = walk(regs, &mut out, &NO_SKIP, false, top);
                let n = match end {
                    End::Done(n) | End::Resume { n, .. } | End::Handoff { n, .. } => n,
                };
                assert!(n <= out.len());
            }
            core::hint::black_box(&mut fake);
        }
    }
}
