//! Reserved and used bytes of stream-ordered memory pools and of graph memory, polled from a
//! thread of our own, never inside a callback.
//!
//! Callbacks only note what exists, in fixed-size static tables with atomics (no allocation, no
//! lock): the devices whose default pool served a `cuMemAllocAsync`, the pools created with
//! `cuMemPoolCreate` or used through `cuMemAllocFromPoolAsync`, and the devices with graph memory
//! nodes. A `cuMemPoolTrimTo` or a first sighting wakes the poller (a futex) so the change is
//! sampled at once. The poller thread then asks the driver (`cuMemPoolGetAttribute`,
//! `cuDeviceGetMemPool`, `cuDeviceGetGraphMemAttribute`: none of them has a callback enabled)
//! every interval and writes a `POOL_SAMPLE` event per pool. The poller's thread is in relaxed
//! stream-capture mode, so its queries never break a graph the program captures meanwhile. A pool being destroyed is taken out
//! of the table at `cuMemPoolDestroy` ENTER, and that callback waits (bounded) while the poller
//! is inside a query of that very pool, so the poller never queries a destroyed handle.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::event::kind;
use crate::state::State;

/// Pool handle written for a device's default pool (the trace format's `pool` 0).
pub const DEFAULT_POOL: u64 = 0;
/// Pool handle written for a device's graph memory (`cuDeviceGetGraphMemAttribute`).
pub const GRAPH_MEMORY: u64 = u64::MAX;

const MAX_POOLS: usize = 64;
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const LIVE: u32 = 2;

struct Slot {
    handle: AtomicU64,
    device: AtomicU32,
    state: AtomicU32,
}

static SLOTS: [Slot; MAX_POOLS] = [const {
    Slot {
        handle: AtomicU64::new(0),
        device: AtomicU32::new(0),
        state: AtomicU32::new(FREE),
    }
}; MAX_POOLS];
/// Devices (bit = ordinal, below 64) whose default pool has served an allocation.
static DEFAULT_DEVICES: AtomicU64 = AtomicU64::new(0);
/// Devices with graph memory (graph memory nodes or stream-ordered allocations).
static GRAPH_DEVICES: AtomicU64 = AtomicU64::new(0);
/// Bumped on every change the poller should see at once; the poller's futex word.
static CHANGES: AtomicU32 = AtomicU32::new(0);
/// The pool handle the poller is querying right now (0: none).
static QUERYING: AtomicU64 = AtomicU64::new(0);
static STOP: AtomicBool = AtomicBool::new(false);
static RUNNING: AtomicBool = AtomicBool::new(false);

fn wake() {
    CHANGES.fetch_add(1, Ordering::SeqCst);
    if RUNNING.load(Ordering::Relaxed) {
        // SAFETY: FUTEX_WAKE on a valid, aligned u32 of ours; no memory is written.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                CHANGES.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
    }
}

/// Callback-safe: a stream-ordered allocation came from `device`'s default pool.
#[inline]
pub fn note_default_pool(device: u32) {
    if device >= 64 {
        return;
    }
    let bit = 1u64 << device;
    if DEFAULT_DEVICES.load(Ordering::Relaxed) & bit == 0 {
        DEFAULT_DEVICES.fetch_or(bit, Ordering::SeqCst);
        GRAPH_DEVICES.fetch_or(bit, Ordering::SeqCst);
        wake();
    }
}

/// Callback-safe: `device` has graph memory.
pub fn note_graph_memory(device: u32) {
    if device < 64 && GRAPH_DEVICES.fetch_or(1u64 << device, Ordering::SeqCst) & (1 << device) == 0
    {
        wake();
    }
}

/// Callback-safe: the device of a known pool.
#[inline]
pub fn device_of(handle: u64) -> Option<u32> {
    SLOTS
        .iter()
        .find(|s| {
            s.state.load(Ordering::Acquire) == LIVE && s.handle.load(Ordering::Relaxed) == handle
        })
        .map(|s| s.device.load(Ordering::Relaxed))
}

/// Callback-safe: a pool exists on `device` (created, or first used). Pools beyond the table's
/// size are not polled.
pub fn note_pool(handle: u64, device: u32) {
    if handle == 0 || device_of(handle).is_some() {
        return;
    }
    for s in &SLOTS {
        if s.state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.handle.store(handle, Ordering::Relaxed);
            s.device.store(device, Ordering::Relaxed);
            s.state.store(LIVE, Ordering::Release);
            wake();
            return;
        }
    }
}

/// Callback-safe, at `cuMemPoolDestroy` ENTER: stop polling `handle`. Waits (at most about a
/// millisecond) while the poller is inside a query of it.
pub fn pool_destroyed(handle: u64) {
    for s in &SLOTS {
        if s.handle.load(Ordering::Relaxed) == handle
            && s.state
                .compare_exchange(LIVE, CLAIMED, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        {
            let mut spins = 0u32;
            while QUERYING.load(Ordering::SeqCst) == handle && spins < 100_000 {
                core::hint::spin_loop();
                spins += 1;
            }
            s.handle.store(0, Ordering::Relaxed);
            s.state.store(FREE, Ordering::Release);
        }
    }
}

/// Callback-safe: memory went back to the device (`cuMemPoolTrimTo`): sample now.
pub fn trimmed() {
    wake();
}

type GetAttrFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
type GetMemPoolFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type GraphAttrFn = unsafe extern "C" fn(c_int, c_int, *mut c_void) -> c_int;
type CaptureModeFn = unsafe extern "C" fn(*mut c_int) -> c_int;

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: this thread's calls neither fail nor invalidate another
/// thread's stream capture.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// The driver functions the poller calls, from the libcuda the process already loaded.
struct Driver {
    pool_attr: GetAttrFn,
    device_pool: Option<GetMemPoolFn>,
    graph_attr: Option<GraphAttrFn>,
    capture_mode: Option<CaptureModeFn>,
}

impl Driver {
    fn load() -> Option<Self> {
        // SAFETY: RTLD_NOLOAD only returns a handle to a library already in the process (the
        // driver that called InitializeInjection); it never loads or initialises one.
        let h = unsafe {
            libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            )
        };
        let sym = |name: &core::ffi::CStr| {
            let p = if h.is_null() {
                // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
                unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
            } else {
                // SAFETY: h is a live handle; name is NUL-terminated.
                unsafe { libc::dlsym(h, name.as_ptr()) }
            };
            (!p.is_null()).then_some(p)
        };
        let pool_attr = sym(c"cuMemPoolGetAttribute")?;
        // SAFETY: the driver's symbols have these C signatures (cuda.h):
        // cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*),
        // cuDeviceGetMemPool(CUmemoryPool*, CUdevice),
        // cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void*),
        // cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*).
        unsafe {
            Some(Self {
                pool_attr: core::mem::transmute::<*mut c_void, GetAttrFn>(pool_attr),
                device_pool: sym(c"cuDeviceGetMemPool")
                    .map(|p| core::mem::transmute::<*mut c_void, GetMemPoolFn>(p)),
                graph_attr: sym(c"cuDeviceGetGraphMemAttribute")
                    .map(|p| core::mem::transmute::<*mut c_void, GraphAttrFn>(p)),
                capture_mode: sym(c"cuThreadExchangeStreamCaptureMode")
                    .map(|p| core::mem::transmute::<*mut c_void, CaptureModeFn>(p)),
            })
        }
    }

    /// Puts the calling thread in relaxed stream-capture mode. While the program captures a
    /// graph in global mode (PyTorch's CUDA graphs do), a query from a thread in the default
    /// mode is a "potentially unsafe" call: it fails and invalidates the program's capture.
    fn relax_capture_mode(&self) {
        if let Some(f) = self.capture_mode {
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: a valid out-pointer to a CUstreamCaptureMode (a C enum, int-sized); the
            // call only changes this thread's mode.
            unsafe { f(&mut mode) };
        }
    }

    /// (reserved, used) of a pool.
    fn pool(&self, handle: u64) -> Option<(u64, u64)> {
        let (mut reserved, mut used) = (0u64, 0u64);
        // SAFETY: handle came from the driver (a pool the program created or a device's
        // default pool) and is not destroyed (see pool_destroyed); the out-pointers are u64s
        // (the attribute type of RESERVED_MEM_CURRENT 5 and USED_MEM_CURRENT 7 is cuuint64_t).
        let ok = unsafe {
            (self.pool_attr)(handle as *mut c_void, 5, (&raw mut reserved).cast()) == 0
                && (self.pool_attr)(handle as *mut c_void, 7, (&raw mut used).cast()) == 0
        };
        ok.then_some((reserved, used))
    }

    fn default_pool(&self, device: u32) -> Option<u64> {
        let f = self.device_pool?;
        let mut pool: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; the device ordinal came from the driver.
        (unsafe { f(&mut pool, device as c_int) } == 0 && !pool.is_null()).then_some(pool as u64)
    }

    /// (reserved, used) of a device's graph memory.
    fn graph(&self, device: u32) -> Option<(u64, u64)> {
        let f = self.graph_attr?;
        let (mut reserved, mut used) = (0u64, 0u64);
        // SAFETY: u64 out-pointers (RESERVED_MEM_CURRENT 2, USED_MEM_CURRENT 0 are cuuint64_t).
        let ok = unsafe {
            f(device as c_int, 2, (&raw mut reserved).cast()) == 0
                && f(device as c_int, 0, (&raw mut used).cast()) == 0
        };
        ok.then_some((reserved, used))
    }
}

/// Starts the poller (outside callbacks; once per process). `interval` zero disables it.
pub fn start(st: &'static State, interval: Duration) {
    if interval.is_zero() || RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    static FORK_HANDLER: AtomicBool = AtomicBool::new(false);
    if !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain extern "C" handler that only stores atomics.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork)) };
    }
    let Some(driver) = Driver::load() else {
        RUNNING.store(false, Ordering::Release);
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("gpucollect-pool".into())
        .spawn(move || poll_loop(st, &driver, interval));
    if spawned.is_err() {
        RUNNING.store(false, Ordering::Release);
    }
}

/// Stops the poller and takes a last sample (at `exit()`, outside callbacks).
pub fn stop(st: &State) {
    if !RUNNING.load(Ordering::Acquire) || STOP.swap(true, Ordering::AcqRel) {
        return;
    }
    wake();
    // Give the poller up to 100 ms to leave a query in progress.
    for _ in 0..100 {
        if !RUNNING.load(Ordering::Acquire) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if !RUNNING.load(Ordering::Acquire)
        && let Some(d) = Driver::load()
    {
        sample(st, &d, &mut Vec::new());
    }
}

/// In a forked child: the poller thread does not exist there (and CUDA cannot be used in a
/// child forked after cuInit), so nothing polls.
extern "C" fn after_fork() {
    RUNNING.store(false, Ordering::Release);
    STOP.store(true, Ordering::Release);
}

fn poll_loop(st: &State, driver: &Driver, interval: Duration) {
    driver.relax_capture_mode();
    let mut last = Vec::new();
    let timeout = libc::timespec {
        tv_sec: interval.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(interval.subsec_nanos() as i32),
    };
    while !STOP.load(Ordering::Acquire) {
        let seen = CHANGES.load(Ordering::SeqCst);
        let anything = DEFAULT_DEVICES.load(Ordering::Relaxed) != 0
            || GRAPH_DEVICES.load(Ordering::Relaxed) != 0
            || SLOTS
                .iter()
                .any(|s| s.state.load(Ordering::Relaxed) == LIVE);
        let wait: *const libc::timespec = if anything {
            &timeout
        } else {
            core::ptr::null()
        };
        // SAFETY: FUTEX_WAIT on our own aligned u32 with a valid (or null: forever) timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                CHANGES.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                wait,
            )
        };
        if STOP.load(Ordering::Acquire) {
            break;
        }
        sample(st, driver, &mut last);
    }
    RUNNING.store(false, Ordering::Release);
}

/// The last (reserved, used) written per (device, pool).
type LastSamples = Vec<((u32, u64), (u64, u64))>;

/// One round: a `POOL_SAMPLE` for every pool holding memory or whose numbers changed.
fn sample(st: &State, driver: &Driver, last: &mut LastSamples) {
    let mut defaults = Vec::new();
    let mut emit = |device: u32, pool: u64, (reserved, used): (u64, u64)| {
        let key = (device, pool);
        let prev = last.iter_mut().find(|(k, _)| *k == key);
        let changed = prev.as_ref().is_none_or(|(_, v)| *v != (reserved, used));
        // Nothing to say: a pool that holds nothing and never did, or still holds nothing.
        if reserved == 0 && (!changed || (used == 0 && prev.is_none())) {
            return;
        }
        match prev {
            Some((_, v)) => *v = (reserved, used),
            None => last.push((key, (reserved, used))),
        }
        st.emit_unthreaded(|e| {
            e.kind = kind::POOL_SAMPLE;
            e.device = device;
            e.addr = pool;
            e.size = reserved;
            e.stream = used;
        });
    };
    let mask = DEFAULT_DEVICES.load(Ordering::Acquire);
    for device in (0..64).filter(|d| mask & (1 << d) != 0) {
        if let Some(h) = driver.default_pool(device) {
            defaults.push(h);
            if let Some(v) = driver.pool(h) {
                emit(device, DEFAULT_POOL, v);
            }
        }
    }
    for s in &SLOTS {
        if s.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let handle = s.handle.load(Ordering::Relaxed);
        if defaults.contains(&handle) {
            continue; // a default pool used by handle: sampled above
        }
        QUERYING.store(handle, Ordering::SeqCst);
        // Re-check after announcing the query: pool_destroyed either sees QUERYING and waits,
        // or has already taken the slot out and we skip it.
        if s.state.load(Ordering::SeqCst) == LIVE && s.handle.load(Ordering::Relaxed) == handle {
            let v = driver.pool(handle);
            QUERYING.store(0, Ordering::SeqCst);
            if let Some(v) = v {
                emit(s.device.load(Ordering::Relaxed), handle, v);
            }
        } else {
            QUERYING.store(0, Ordering::SeqCst);
        }
    }
    let mask = GRAPH_DEVICES.load(Ordering::Acquire);
    for device in (0..64).filter(|d| mask & (1 << d) != 0) {
        if let Some(v) = driver.graph(device) {
            emit(device, GRAPH_MEMORY, v);
        }
    }
}
