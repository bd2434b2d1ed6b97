//! The CUDA driver's `extern "C"` entry points: `InitializeInjection` and the CUPTI callback
//! (NVTX's, `InitializeInjectionNvtx2`, is in [`crate::nvtx`]). Each is wrapped in
//! `catch_unwind`.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::cupti::{self, CallbackData, cbid};
use crate::event::{Event, alloc_kind, free_kind, kind};
use crate::pools;
use crate::state::{self, CTX_GENERATION, Init, State};

static INJECTED: AtomicBool = AtomicBool::new(false);

/// Called by the CUDA driver at the first `cuInit` when `CUDA_INJECTION64_PATH` names this
/// library. Subscribes to the driver-API memory callbacks. Always returns 1: a tracing problem
/// is reported on stderr and never stops the program.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = catch_unwind(|| {
        if INJECTED.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(msg) = inject() {
            eprintln!(
                "gpucollect: {msg}; process {} runs untraced",
                std::process::id()
            );
        }
    });
    1
}

fn inject() -> Result<(), String> {
    let st = match state::init(skipped_code_ranges) {
        Init::Ready(s) => s,
        Init::NotUnderCollector => {
            return Err(format!(
                "the injection library was loaded without {} (run the program under \
                 `gpucollect`)",
                crate::env::RING
            ));
        }
        Init::Failed(e) => return Err(e),
    };
    send_identity(st);
    let modules = send_modules(st);
    if st.stack_depth > 0 {
        use crate::python::Detected;
        if let Detected::Unsupported(why) = crate::python::init(&modules) {
            eprintln!("gpucollect: {why}; stacks of this process have native frames only");
        }
    }
    // SAFETY: on_exit (glibc) registers a handler with this exact signature; it runs at exit(),
    // after which nothing else of ours runs, and it is inherited by forked children.
    if unsafe { on_exit(on_process_exit, core::ptr::null_mut()) } != 0 {
        eprintln!(
            "gpucollect: cannot register an exit handler; exit codes of child processes will be missing"
        );
    }
    // Whatever stops the capture from here on is also written into the trace, so a trace of an
    // untraced process says so instead of looking like a process that allocated nothing.
    subscribe(st).map_err(|(code, msg)| {
        st.emit(|e| {
            e.kind = kind::NOTICE;
            e.code = code;
            e.set_text(msg.as_bytes());
        });
        msg
    })?;
    pools::start(st, st.pool_interval);
    Ok(())
}

/// Loads CUPTI and subscribes to the callbacks; on failure, a `notice_code` and the reason.
fn subscribe(st: &State) -> Result<(), (u32, String)> {
    use crate::event::notice_code;
    let lib = load_cupti().map_err(|e| (notice_code::CUPTI_MISSING, e))?;
    let failed = |e: String| (notice_code::CAPTURE_FAILED, e);
    st.set_skip(&skipped_code_ranges());
    let sym = |name: &CStr| {
        // SAFETY: lib is a live handle from dlopen; name is NUL-terminated.
        let p = unsafe { libc::dlsym(lib.0, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let missing = |n: &str| format!("{} has no {n}; is it a CUPTI library?", lib.1);
    let subscribe = sym(c"cuptiSubscribe").ok_or_else(|| failed(missing("cuptiSubscribe")))?;
    let enable =
        sym(c"cuptiEnableCallback").ok_or_else(|| failed(missing("cuptiEnableCallback")))?;
    if let Some(p) = sym(c"cuptiGetDeviceId") {
        st.get_device_id.store(p, Ordering::Release);
    }
    // SAFETY: the symbols come from libcupti and have these C signatures (cupti_callbacks.h).
    let (subscribe, enable) = unsafe {
        (
            core::mem::transmute::<*mut c_void, cupti::SubscribeFn>(subscribe),
            core::mem::transmute::<*mut c_void, cupti::EnableCallbackFn>(enable),
        )
    };
    let mut handle: *mut c_void = core::ptr::null_mut();
    // SAFETY: valid out-pointer and a callback with the CUpti_CallbackFunc signature.
    let rc = unsafe { subscribe(&mut handle, callback, core::ptr::null_mut()) };
    if rc == cupti::ERROR_MULTIPLE_SUBSCRIBERS {
        return Err((
            notice_code::CUPTI_BUSY,
            format!(
                "another CUPTI client already holds the CUPTI subscription \
             (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: Nsight Systems, torch.profiler/Kineto \
             or another profiler); stop it or run without it to trace (CUPTI {})",
                lib.1
            ),
        ));
    }
    if rc != 0 {
        return Err(failed(format!(
            "cuptiSubscribe failed with CUPTI error {rc} ({})",
            lib.1
        )));
    }
    for &id in cbid::ALL {
        // SAFETY: handle is the subscriber cuptiSubscribe returned.
        let rc = unsafe { enable(1, handle, cupti::DOMAIN_DRIVER_API, id) };
        if rc != 0 {
            eprintln!("gpucollect: cannot enable CUPTI callback {id} (CUPTI error {rc})");
        }
    }
    Ok(())
}

/// Finds libcupti: `GPUCOLLECT_CUPTI_PATH`, a copy already loaded in the process, the library
/// search path, then the CUDA toolkit locations.
fn load_cupti() -> Result<(*mut c_void, String), String> {
    let mut tried = Vec::new();
    let open = |path: &str, flags: c_int| -> Option<*mut c_void> {
        let c = CString::new(path).ok()?;
        // SAFETY: c is a valid NUL-terminated path.
        let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
        (!h.is_null()).then_some(h)
    };
    if let Ok(p) = std::env::var(crate::env::CUPTI_PATH) {
        if let Some(h) = open(&p, libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            return Ok((h, p));
        }
        tried.push(format!("{p} ({})", dlerror()));
    }
    let names = [
        "libcupti.so.13",
        "libcupti.so.12",
        "libcupti.so.11.8",
        "libcupti.so",
    ];
    for n in names {
        if let Some(h) = open(n, libc::RTLD_NOW | libc::RTLD_NOLOAD) {
            return Ok((h, n.to_string()));
        }
    }
    for n in names {
        if let Some(h) = open(n, libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            return Ok((h, n.to_string()));
        }
        tried.push(format!("{n} on the library path"));
    }
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(d) = std::env::var(var) {
            dirs.push(format!("{d}/extras/CUPTI/lib64"));
            dirs.push(format!("{d}/lib64"));
        }
    }
    dirs.push("/usr/local/cuda/extras/CUPTI/lib64".into());
    dirs.push("/usr/local/cuda/lib64".into());
    for d in dirs {
        let p = format!("{d}/libcupti.so");
        if let Some(h) = open(&p, libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            return Ok((h, p));
        }
        tried.push(p);
    }
    Err(format!(
        "CUPTI (libcupti) was not found; set {} or pass --cupti PATH (tried: {})",
        crate::env::CUPTI_PATH,
        tried.join(", ")
    ))
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: p is a valid C string until the next dl* call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Code ranges skipped at the top of captured stacks: this library, and the CUDA driver and
/// CUPTI libraries if they are loaded.
pub fn skipped_code_ranges() -> crate::unwind::Ranges {
    let mut info: libc::Dl_info = unsafe_zeroed_dl_info();
    let probe = skipped_code_ranges as *const () as *const c_void;
    // SAFETY: dladdr with a code address of this library and a valid out struct.
    let own_base = if unsafe { libc::dladdr(probe, &mut info) } != 0 {
        info.dli_fbase as u64
    } else {
        u64::MAX
    };
    let mut out = [(0usize, 0usize); 8];
    let mut n = 0;
    for m in modules() {
        let name = m.path.rsplit(|c| *c == b'/').next().unwrap_or(&m.path);
        let cuda = name.starts_with(b"libcuda.so") || name.starts_with(b"libcupti");
        let own = m.bias == own_base || (m.bias < own_base && own_base < m.bias + m.end);
        if (cuda || own) && n < out.len() {
            out[n] = (m.bias as usize, (m.bias + m.end) as usize);
            n += 1;
        }
    }
    out
}

fn unsafe_zeroed_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    }
}

pub struct ModuleEntry {
    pub path: Vec<u8>,
    pub bias: u64,
    /// End of the highest PT_LOAD segment, relative to the bias.
    pub end: u64,
    pub build_id: Vec<u8>,
}

/// Every loaded ELF object (dl_iterate_phdr). Not for callbacks: it allocates and locks.
pub fn modules() -> Vec<ModuleEntry> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info; data is our Vec.
        let (info, out) = unsafe { (&*info, &mut *data.cast::<Vec<ModuleEntry>>()) };
        let mut end = 0u64;
        let mut build_id = Vec::new();
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr has dlpi_phnum entries.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                end = end.max(ph.p_vaddr + ph.p_memsz);
            } else if ph.p_type == libc::PT_NOTE && build_id.is_empty() {
                let start = info.dlpi_addr + ph.p_vaddr;
                // SAFETY: a PT_NOTE segment of a loaded object is mapped and p_memsz long.
                let notes =
                    unsafe { core::slice::from_raw_parts(start as *const u8, ph.p_memsz as usize) };
                build_id = parse_build_id(notes);
            }
        }
        let path = if info.dlpi_name.is_null() {
            Vec::new()
        } else {
            // SAFETY: dlpi_name is a valid C string.
            unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_bytes()
                .to_vec()
        };
        out.push(ModuleEntry {
            path,
            bias: info.dlpi_addr,
            end,
            build_id,
        });
        0
    }
    let mut out: Vec<ModuleEntry> = Vec::new();
    // SAFETY: the callback matches dl_iterate_phdr's contract and only uses `out`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut out).cast()) };
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default();
    for m in &mut out {
        if m.path.is_empty() {
            m.path.clone_from(&exe);
        }
    }
    out
}

fn parse_build_id(notes: &[u8]) -> Vec<u8> {
    let mut id = [0u8; 32];
    let n = crate::modules::build_id_into(notes, &mut id);
    id[..n].to_vec()
}

/// Sends the command line and executable, so a short-lived process is still named in the trace.
fn send_identity(st: &State) {
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    st.emit(|e| {
        e.kind = kind::CMDLINE;
        e.set_text(&cmdline);
    });
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default();
    st.emit(|e| {
        e.kind = kind::EXE;
        e.set_text(&exe);
    });
}

/// Sends the module table; returns each module's address range.
fn send_modules(st: &State) -> Vec<(u64, u64)> {
    let all = modules();
    let biases: Vec<u64> = all.iter().map(|m| m.bias).collect();
    crate::modules::init(&biases);
    let ranges = all.iter().map(|m| (m.bias, m.bias + m.end)).collect();
    for m in all {
        st.emit(|e| {
            e.kind = kind::MODULE;
            e.set_text(&m.path);
            e.stream = m.bias;
            e.pool = m.end;
            let n = m.build_id.len().min(32);
            e.put_bytes(crate::event::MAX_TEXT_BYTES - 32, &m.build_id[..n]);
            e.addr = n as u64;
        });
    }
    ranges
}

unsafe extern "C" {
    /// glibc: like atexit, but the handler receives the exit status.
    fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

/// Runs at `exit()`: records the exit status, so child processes (whose status only their parent
/// can wait for) get an exit code in the trace.
extern "C" fn on_process_exit(status: c_int, _arg: *mut c_void) {
    let _ = catch_unwind(|| {
        if let Some(st) = state::get() {
            pools::stop(st);
            st.emit(|e| {
                e.kind = kind::EXIT;
                e.code = status as u32;
            });
        }
    });
}

/// The CUPTI callback.
unsafe extern "C" fn callback(_userdata: *mut c_void, domain: u32, id: u32, data: *const c_void) {
    if domain != cupti::DOMAIN_DRIVER_API || data.is_null() {
        return;
    }
    let Some(st) = state::get() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        state::guarded(|| {
            // SAFETY: for the driver domain, cbdata is a CUpti_CallbackData valid during the call.
            let d = unsafe { &*data.cast::<CallbackData>() };
            // SAFETY: params and return value are the documented structs for this callback id.
            unsafe { on_driver(st, id, d) };
        });
    }));
}

/// The parameters of callback `id` as `T`; `None` when `T` is not the layout of `id`'s
/// parameters (`cupti::Params::CBIDS`). That is a mistake in the match below, never input: the
/// event is then not written, which the fake-driver tests see.
#[inline]
unsafe fn params<T: cupti::Params>(d: &CallbackData, id: u32) -> Option<&T> {
    if !T::CBIDS.contains(&id) {
        return None;
    }
    // SAFETY: T is the parameter struct CUPTI documents for `id` (checked above); the caller
    // checked that the pointer is not null, and the params outlive the callback.
    Some(unsafe { &*d.function_params.cast::<T>() })
}

/// Handles one driver callback. Allocations are recorded at EXIT (their result exists only
/// then); releases at ENTER (before another thread can be given the same address).
unsafe fn on_driver(st: &State, id: u32, d: &CallbackData) {
    let exit = d.callback_site == cupti::SITE_EXIT;
    let enter = d.callback_site == cupti::SITE_ENTER;
    if d.function_params.is_null() {
        return;
    }
    let result = if exit && !d.function_return_value.is_null() {
        // SAFETY: for the driver domain functionReturnValue points to the CUresult.
        unsafe { *d.function_return_value.cast::<c_int>() }
    } else {
        0
    };
    let ok = result == 0;
    // SAFETY: `params` checks that its type is the struct documented for `id`, and the
    // out-pointers it holds are valid at EXIT when the call succeeded.
    unsafe {
        match id {
            cbid::MEM_ALLOC_V2 | cbid::MEM_ALLOC_MANAGED if exit => {
                let Some(p) = params::<cupti::MemAllocParams>(d, id) else {
                    return;
                };
                let k = if id == cbid::MEM_ALLOC_V2 {
                    alloc_kind::DEVICE
                } else {
                    alloc_kind::MANAGED
                };
                let addr = if ok { *p.dptr } else { 0 };
                alloc_in_context(st, d, result, k, addr, p.bytesize as u64);
            }
            cbid::MEM_ALLOC_PITCH_V2 if exit => {
                let Some(p) = params::<cupti::MemAllocPitchParams>(d, id) else {
                    return;
                };
                let (addr, size) = if ok {
                    (*p.dptr, (*p.pitch * p.height) as u64)
                } else {
                    (0, (p.width_bytes * p.height) as u64)
                };
                alloc_in_context(st, d, result, alloc_kind::DEVICE, addr, size);
            }
            cbid::MEM_ALLOC_ASYNC | cbid::MEM_ALLOC_ASYNC_PTSZ if exit => {
                let Some(p) = params::<cupti::MemAllocAsyncParams>(d, id) else {
                    return;
                };
                let addr = if ok { *p.dptr } else { 0 };
                let k = alloc_kind::STREAM_ORDERED_POOL;
                let device = st.device_of(d.context);
                pools::note_default_pool(device);
                alloc(st, device, result, k, addr, p.bytesize as u64, p.stream, 0);
            }
            cbid::MEM_ALLOC_FROM_POOL_ASYNC | cbid::MEM_ALLOC_FROM_POOL_ASYNC_PTSZ if exit => {
                let Some(p) = params::<cupti::MemAllocFromPoolAsyncParams>(d, id) else {
                    return;
                };
                let addr = if ok { *p.dptr } else { 0 };
                let k = alloc_kind::STREAM_ORDERED_POOL;
                // The memory is on the pool's device, which need not be the context's.
                let device = pools::device_of(p.pool).unwrap_or_else(|| {
                    let dev = st.device_of(d.context);
                    pools::note_pool(p.pool, dev);
                    dev
                });
                alloc(
                    st,
                    device,
                    result,
                    k,
                    addr,
                    p.bytesize as u64,
                    p.stream,
                    p.pool,
                );
            }
            cbid::MEM_POOL_CREATE if exit && ok => {
                let Some(p) = params::<cupti::MemPoolCreateParams>(d, id) else {
                    return;
                };
                // CUmemPoolProps.location: {type u32 at 8, id i32 at 12}; 1 = device.
                if !p.pool.is_null() && !p.props.is_null() && *p.props.add(2) == 1 {
                    pools::note_pool(*p.pool, *p.props.add(3));
                }
            }
            cbid::MEM_POOL_DESTROY if enter => {
                if let Some(p) = params::<cupti::PtrFreeParams>(d, id) {
                    pools::pool_destroyed(p.dptr);
                }
            }
            cbid::MEM_POOL_TRIM_TO if exit => pools::trimmed(),
            cbid::GRAPH_ADD_MEM_ALLOC_NODE if exit && ok => {
                let Some(p) = params::<cupti::GraphAddMemAllocNodeParams>(d, id) else {
                    return;
                };
                // CUDA_MEM_ALLOC_NODE_PARAMS starts with CUmemPoolProps: location id at 12.
                if !p.node_params.is_null() && *p.node_params.add(2) == 1 {
                    pools::note_graph_memory(*p.node_params.add(3));
                }
            }
            cbid::MEM_ALLOC_HOST_V2 | cbid::MEM_HOST_ALLOC if exit => {
                let Some(p) = params::<cupti::HostAllocParams>(d, id) else {
                    return;
                };
                let addr = if ok { *p.pp as u64 } else { 0 };
                let k = alloc_kind::PINNED_HOST;
                alloc_in_context(st, d, result, k, addr, p.bytesize as u64);
            }
            cbid::MEM_HOST_REGISTER_V2 if exit => {
                let Some(p) = params::<cupti::MemHostRegisterParams>(d, id) else {
                    return;
                };
                let k = alloc_kind::PINNED_HOST;
                alloc_in_context(st, d, result, k, p.p as u64, p.bytesize as u64);
            }
            cbid::ARRAY_CREATE_V2 | cbid::ARRAY_3D_CREATE_V2 if exit => {
                let Some(p) = params::<cupti::ArrayCreateParams>(d, id) else {
                    return;
                };
                let size = if p.desc.is_null() {
                    0
                } else if id == cbid::ARRAY_CREATE_V2 {
                    let (w, h) = (*p.desc, *p.desc.add(1));
                    let fmt = *p.desc.add(2).cast::<u32>();
                    let ch = *p.desc.add(2).cast::<u32>().add(1);
                    (w * h.max(1)) as u64 * u64::from(ch) * cupti::array_format_bytes(fmt)
                } else {
                    let (w, h, dd) = (*p.desc, *p.desc.add(1), *p.desc.add(2));
                    let fmt = *p.desc.add(3).cast::<u32>();
                    let ch = *p.desc.add(3).cast::<u32>().add(1);
                    (w * h.max(1) * dd.max(1)) as u64
                        * u64::from(ch)
                        * cupti::array_format_bytes(fmt)
                };
                let addr = if ok { *p.handle } else { 0 };
                alloc_in_context(st, d, result, alloc_kind::ARRAY, addr, size);
            }
            cbid::IPC_OPEN_MEM_HANDLE_V2 if exit && ok => {
                let Some(p) = params::<cupti::IpcOpenParams>(d, id) else {
                    return;
                };
                alloc_in_context(st, d, result, alloc_kind::IPC_IMPORT, *p.pdptr, 0);
            }
            cbid::MEM_FREE_V2
            | cbid::MEM_FREE_HOST
            | cbid::MEM_HOST_UNREGISTER
            | cbid::IPC_CLOSE_MEM_HANDLE
            | cbid::ARRAY_DESTROY
                if enter =>
            {
                let Some(p) = params::<cupti::PtrFreeParams>(d, id) else {
                    return;
                };
                free(st, d, p.dptr, free_kind::IMMEDIATE, 0);
            }
            cbid::MEM_FREE_ASYNC | cbid::MEM_FREE_ASYNC_PTSZ if enter => {
                let Some(p) = params::<cupti::MemFreeAsyncParams>(d, id) else {
                    return;
                };
                free(st, d, p.dptr, free_kind::STREAM_ORDERED, p.stream);
            }
            cbid::MEM_CREATE if exit => {
                let Some(p) = params::<cupti::MemCreateParams>(d, id) else {
                    return;
                };
                // CUmemAllocationProp.location: {type u32 at 8, id i32 at 12}; 1 = device.
                let (loc_type, loc_id) = if p.prop.is_null() {
                    (1, 0)
                } else {
                    (*p.prop.add(2), *p.prop.add(3))
                };
                let k = if loc_type == 1 {
                    alloc_kind::VMM_PHYSICAL
                } else {
                    alloc_kind::PINNED_HOST
                };
                let handle = if ok { *p.handle } else { 0 };
                if !st.active() {
                    return;
                }
                let mut frames = [0u64; crate::event::MAX_FRAMES];
                let n = crate::stack::capture(st, &mut frames);
                st.emit(|e| {
                    e.kind = if ok {
                        kind::VMM_CREATE
                    } else {
                        kind::ALLOC_FAILED
                    };
                    e.device = if loc_type == 1 { loc_id } else { 0 };
                    e.size = p.size as u64;
                    if ok {
                        e.addr = handle;
                        e.code = k;
                    } else {
                        e.code = result as u32;
                        e.pool = u64::from(k);
                    }
                    e.data[..n].copy_from_slice(&frames[..n]);
                    e.nframes = n as u32;
                });
            }
            cbid::MEM_RELEASE if enter => {
                let Some(p) = params::<cupti::PtrFreeParams>(d, id) else {
                    return;
                };
                st.emit(|e| {
                    e.kind = kind::VMM_RELEASE;
                    e.addr = p.dptr;
                });
            }
            cbid::MEM_MAP if exit && ok => {
                let Some(p) = params::<cupti::MemMapParams>(d, id) else {
                    return;
                };
                st.emit(|e| {
                    e.kind = kind::VMM_MAP;
                    e.addr = p.ptr;
                    e.size = p.size as u64;
                    e.pool = p.handle;
                });
            }
            cbid::MEM_UNMAP if enter => {
                let Some(p) = params::<cupti::MemUnmapParams>(d, id) else {
                    return;
                };
                st.emit(|e| {
                    e.kind = kind::VMM_UNMAP;
                    e.addr = p.ptr;
                    e.size = p.size as u64;
                });
            }
            cbid::CTX_DESTROY_V2 | cbid::CTX_DESTROY if enter => {
                let Some(p) = params::<cupti::CtxDestroyParams>(d, id) else {
                    return;
                };
                let dev = st.device_of(p.ctx);
                CTX_GENERATION.fetch_add(1, Ordering::AcqRel);
                st.emit(|e| {
                    e.kind = kind::CONTEXT_RESET;
                    e.device = dev;
                });
            }
            cbid::DEVICE_PRIMARY_CTX_RESET_V2 | cbid::DEVICE_PRIMARY_CTX_RESET if enter => {
                let Some(p) = params::<cupti::PrimaryCtxResetParams>(d, id) else {
                    return;
                };
                CTX_GENERATION.fetch_add(1, Ordering::AcqRel);
                st.emit(|e| {
                    e.kind = kind::CONTEXT_RESET;
                    e.device = p.dev.max(0) as u32;
                });
            }
            _ => {}
        }
    }
}

/// An allocation on the device of the callback's context, on no stream and in no pool.
#[inline]
fn alloc_in_context(
    st: &State,
    d: &CallbackData,
    result: c_int,
    alloc_kind: u32,
    addr: u64,
    size: u64,
) {
    alloc(
        st,
        st.device_of(d.context),
        result,
        alloc_kind,
        addr,
        size,
        0,
        0,
    );
}

/// Records an allocation (or a failed one) on `device`, with the caller's stack.
#[allow(clippy::too_many_arguments)]
#[inline]
fn alloc(
    st: &State,
    device: u32,
    result: c_int,
    alloc_kind: u32,
    addr: u64,
    size: u64,
    stream: u64,
    pool: u64,
) {
    if !st.active() {
        return;
    }
    let mut frames = [0u64; crate::event::MAX_FRAMES];
    let n = crate::stack::capture(st, &mut frames);
    st.emit(|e: &mut Event| {
        if result == 0 {
            e.kind = kind::ALLOC;
            e.code = alloc_kind;
            e.addr = addr;
            e.stream = stream;
            e.pool = pool;
        } else {
            e.kind = kind::ALLOC_FAILED;
            e.code = result as u32;
            e.pool = u64::from(alloc_kind);
        }
        e.device = device;
        e.size = size;
        e.data[..n].copy_from_slice(&frames[..n]);
        e.nframes = n as u32;
    });
}

#[inline]
fn free(st: &State, d: &CallbackData, addr: u64, free_kind: u32, stream: u64) {
    if addr == 0 {
        return;
    }
    let device = st.device_of(d.context);
    st.emit(|e| {
        e.kind = kind::FREE;
        e.code = free_kind;
        e.addr = addr;
        e.stream = stream;
        e.device = device;
    });
}

/// For the NVTX hooks: a C string argument as bytes (empty when null).
pub(crate) fn c_bytes<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return b"";
    }
    // SAFETY: NVTX passes NUL-terminated strings valid for the call.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}
