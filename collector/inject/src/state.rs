//! Process-wide state of the injection: the ring mapping, this process's slot, settings read
//! from the environment once at initialisation, and the per-thread bits a callback needs.
//!
//! Shared by every callback path, so it depends on none of them: only on the ring protocol,
//! `host`, and the types of `cupti` and `unwind`. What the callers add (the stack capture with
//! its module and Python frames: `stack`; their own state after a fork) they do themselves.

use core::cell::Cell;
use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use crate::cupti::GetDeviceIdFn;
use crate::event::{Event, MAX_FRAMES, kind};
use crate::ring::Ring;
use crate::{env, host, unwind};

pub struct State {
    pub ring: Ring,
    pub stack_depth: usize,
    pub max_wait_nanos: u64,
    /// Pool poller interval (0: no polling).
    pub pool_interval: std::time::Duration,
    pub collector_pid: u32,
    pub get_device_id: AtomicPtr<c_void>,
    /// Code ranges skipped at the top of every stack: this library, libcupti, libcuda.
    skip: [AtomicUsize; 16],
    /// How stacks are walked (GPUCOLLECT_UNWIND).
    pub unwind: unwind::Method,
    /// The collector has exited: nothing will drain the ring again, stop producing.
    collector_gone: AtomicBool,
    /// A producer gave up waiting on a full ring: drop without waiting until a push succeeds.
    stalled: AtomicBool,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(core::ptr::null_mut());
const NO_SLOT: usize = usize::MAX;
const FAILED_SLOT: usize = usize::MAX - 1;
static SLOT: AtomicUsize = AtomicUsize::new(NO_SLOT);
static CLAIMING: AtomicBool = AtomicBool::new(false);
/// Bumped in a forked child: per-thread caches from before the fork are stale.
static GENERATION: AtomicU32 = AtomicU32::new(1);
/// Bumped when a context is destroyed: cached context -> device answers are stale.
pub static CTX_GENERATION: AtomicU32 = AtomicU32::new(1);

/// Per-thread state, in one thread-local so a callback pays for one TLS lookup.
struct ThreadState {
    tid: Cell<u64>,
    generation: Cell<u32>,
    in_callback: Cell<bool>,
    stack_top: Cell<usize>,
    ctx_cache: Cell<(usize, u32, u32)>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            tid: Cell::new(0),
            generation: Cell::new(0),
            in_callback: Cell::new(false),
            stack_top: Cell::new(0),
            ctx_cache: Cell::new((0, 0, 0)),
        }
    };
}

pub fn get() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    // SAFETY: STATE is set once to a leaked Box and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// This process's generation: bumped in every forked child, so per-process caches that were
/// filled before the fork (in the parent) can tell they are stale.
#[inline]
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Acquire)
}

extern "C" fn atfork_child() {
    SLOT.store(NO_SLOT, Ordering::Release);
    CLAIMING.store(false, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Result of [`init`].
pub enum Init {
    Ready(&'static State),
    NotUnderCollector,
    Failed(String),
}

/// Opens the ring named in the environment (idempotent). Not for callbacks: it allocates.
/// `skipped` gives the code ranges skipped at the top of stacks, on first initialisation.
pub fn init(skipped: fn() -> unwind::Ranges) -> Init {
    static INIT_LOCK: AtomicBool = AtomicBool::new(false);
    if let Some(s) = get() {
        return Init::Ready(s);
    }
    while INIT_LOCK
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let r = init_locked(skipped);
    INIT_LOCK.store(false, Ordering::Release);
    r
}

fn init_locked(skipped: fn() -> unwind::Ranges) -> Init {
    if let Some(s) = get() {
        return Init::Ready(s);
    }
    let Ok(path) = std::env::var(env::RING) else {
        return Init::NotUnderCollector;
    };
    let ring = match Ring::open(&path) {
        Ok(r) => r,
        Err(e) => return Init::Failed(e.to_string()),
    };
    let stack_depth = std::env::var(env::STACK_DEPTH)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(32)
        .min(MAX_FRAMES);
    let max_wait_ms = std::env::var(env::MAX_WAIT_MS)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(10_000);
    let pool_interval_ms = std::env::var(env::POOL_INTERVAL_MS)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(50);
    let skip = skipped();
    let unwind = match std::env::var(env::UNWIND).as_deref() {
        Ok("fp") => unwind::Method::FramePointers,
        Ok("libgcc") => unwind::Method::Libgcc,
        _ => unwind::Method::Cfi,
    };
    let state = Box::new(State {
        collector_pid: ring.collector_pid(),
        ring,
        stack_depth,
        max_wait_nanos: max_wait_ms * 1_000_000,
        pool_interval: std::time::Duration::from_millis(pool_interval_ms),
        get_device_id: AtomicPtr::new(core::ptr::null_mut()),
        skip: Default::default(),
        unwind,
        collector_gone: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
    });
    state.set_skip(&skip);
    // SAFETY: registering a plain extern "C" handler that only touches atomics.
    unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    let s: &'static State = Box::leak(state);
    STATE.store((s as *const State).cast_mut(), Ordering::Release);
    Init::Ready(s)
}

impl State {
    /// Replaces the code ranges skipped at the top of stacks (after libcupti is loaded).
    pub fn set_skip(&self, ranges: &unwind::Ranges) {
        for (i, &(lo, hi)) in ranges.iter().enumerate() {
            self.skip[2 * i].store(lo, Ordering::Relaxed);
            self.skip[2 * i + 1].store(hi, Ordering::Relaxed);
        }
    }

    /// The code ranges skipped at the top of stacks.
    pub fn skip_ranges(&self) -> unwind::Ranges {
        let mut r = [(0, 0); 8];
        for (i, x) in r.iter_mut().enumerate() {
            *x = (
                self.skip[2 * i].load(Ordering::Relaxed),
                self.skip[2 * i + 1].load(Ordering::Relaxed),
            );
        }
        r
    }

    pub fn get_device_id(&self) -> Option<GetDeviceIdFn> {
        let p = self.get_device_id.load(Ordering::Acquire);
        // SAFETY: only ever set from a dlsym result of the matching signature.
        (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, GetDeviceIdFn>(p) })
    }

    /// Device ordinal of a context (cached per thread). 0 when unknown.
    pub fn device_of(&self, ctx: *mut c_void) -> u32 {
        if ctx.is_null() {
            return 0;
        }
        let gen_now = CTX_GENERATION.load(Ordering::Acquire);
        let (c, g, d) = THREAD.with(|t| t.ctx_cache.get());
        if c == ctx as usize && g == gen_now {
            return d;
        }
        let mut dev = 0u32;
        if let Some(f) = self.get_device_id() {
            // SAFETY: cuptiGetDeviceId(ctx, &dev) with a context the driver handed us.
            if unsafe { f(ctx, &mut dev) } != 0 {
                dev = 0;
            }
        }
        THREAD.with(|t| t.ctx_cache.set((ctx as usize, gen_now, dev)));
        dev
    }

    fn slot(&self) -> Option<usize> {
        loop {
            match SLOT.load(Ordering::Acquire) {
                FAILED_SLOT => return None,
                NO_SLOT => {}
                s => return Some(s),
            }
            if CLAIMING
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: getpid/getppid are always safe to call.
                let (pid, ppid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
                let s = self.ring.claim(pid, ppid).unwrap_or(FAILED_SLOT);
                SLOT.store(s, Ordering::Release);
                return (s != FAILED_SLOT).then_some(s);
            }
            core::hint::spin_loop();
        }
    }

    fn wait_ok(&self, spins: u32, started: &Cell<u64>) -> bool {
        if spins < 64 {
            return true;
        }
        if self.stalled.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
        if spins.is_multiple_of(256) {
            let now = host::monotonic_nanos();
            if started.get() == 0 {
                started.set(now);
            }
            if now - started.get() > self.max_wait_nanos {
                self.stalled.store(true, Ordering::Relaxed);
                return false;
            }
            // SAFETY: kill(pid, 0) only checks that the collector still exists.
            if unsafe { libc::kill(self.collector_pid as i32, 0) } != 0 {
                self.collector_gone.store(true, Ordering::Relaxed);
                return false;
            }
        }
        true
    }

    /// This process's ring slot, or `None` when events cannot be written (collector gone, no
    /// slot: counted).
    #[inline]
    fn writable_slot(&self) -> Option<usize> {
        if self.collector_gone.load(Ordering::Relaxed) {
            return None;
        }
        let slot = self.slot();
        if slot.is_none() {
            self.ring.count_unslotted();
        }
        slot
    }

    /// Pushes one event of thread `tid` into `slot`, waiting (bounded) on a full ring.
    #[inline]
    fn push_event(&self, slot: usize, tid: u64, fill: impl FnOnce(&mut Event)) -> bool {
        let started = Cell::new(0);
        let pushed = self.ring.push(
            slot,
            |n| self.wait_ok(n, &started),
            host::monotonic_nanos,
            |e| {
                e.reset_header(0, tid);
                fill(e);
            },
        );
        if pushed && self.stalled.load(Ordering::Relaxed) {
            self.stalled.store(false, Ordering::Relaxed);
        }
        pushed
    }

    /// Writes one event (callback-safe). `fill` sets the kind-specific fields; time and thread
    /// id are filled here. The first event of a thread is preceded by its name.
    #[inline]
    pub fn emit(&self, fill: impl FnOnce(&mut Event)) -> bool {
        let Some(slot) = self.writable_slot() else {
            return false;
        };
        let generation = GENERATION.load(Ordering::Acquire);
        let (mut tid, thread_gen) = THREAD.with(|t| (t.tid.get(), t.generation.get()));
        if tid == 0 || thread_gen != generation {
            // SAFETY: gettid has no preconditions.
            tid = unsafe { libc::gettid() } as u64;
            THREAD.with(|t| {
                t.tid.set(tid);
                t.generation.set(generation);
            });
            let mut name = [0u8; 17];
            // SAFETY: PR_GET_NAME writes at most 16 bytes into the 17-byte buffer.
            unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
            let name = CStr::from_bytes_until_nul(&name)
                .map(CStr::to_bytes)
                .unwrap_or(b"");
            self.push_event(slot, tid, |e| {
                e.kind = kind::THREAD;
                e.set_text(name);
            });
        }
        self.push_event(slot, tid, fill)
    }

    /// Writes one event that belongs to no thread of the program (`tid` 0): the pool poller's
    /// samples. Not for callbacks' use (they use [`State::emit`]).
    pub fn emit_unthreaded(&self, fill: impl FnOnce(&mut Event)) -> bool {
        self.writable_slot()
            .is_some_and(|slot| self.push_event(slot, 0, fill))
    }

    /// Whether events can still reach a collector (false once it has exited).
    #[inline]
    pub fn active(&self) -> bool {
        !self.collector_gone.load(Ordering::Relaxed)
    }
}

/// The top of this thread's stack (found once per thread: a thread's stack does not move, and a
/// forked child keeps the forking thread's stack).
#[inline]
pub fn stack_top() -> usize {
    THREAD.with(|t| {
        if t.stack_top.get() == 0 {
            t.stack_top.set(unwind::stack_top());
        }
        t.stack_top.get()
    })
}

/// Runs `f` unless this thread is already inside a callback (re-entry through the driver).
#[inline]
pub fn guarded(f: impl FnOnce()) {
    /// Clears the flag even if `f` unwinds (the panic is caught further out).
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            THREAD.with(|t| t.in_callback.set(false));
        }
    }
    let entered = THREAD.with(|t| !t.in_callback.replace(true));
    if !entered {
        return;
    }
    let _leave = Leave;
    f();
}
