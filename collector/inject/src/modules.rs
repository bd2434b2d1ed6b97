//! Keeps the collector's module table complete for libraries loaded after initialisation
//! (dlopen): before an event with frames is written, each frame's page is looked up in a small
//! lock-free cache; on a miss, glibc's `_dl_find_object` (lock-free, glibc >= 2.35, found with
//! dlsym so older glibc just skips this) names the object, and a MODULE event is written for
//! an object not seen before. No allocation, no locks. [`find_object`] also gives the CFI stack
//! walk ([`crate::cfi`]) each object's `.eh_frame_hdr`.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::event::kind;
use crate::state::State;

#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *const LinkMap,
    eh_frame: *mut c_void,
    reserved: [u64; 7],
}

/// The public head of glibc's `struct link_map`.
#[repr(C)]
struct LinkMap {
    addr: usize,
    name: *const c_char,
}

type FindObjectFn = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

static FIND_OBJECT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
const PAGE_CACHE: usize = 4096;
static PAGES: [AtomicU64; PAGE_CACHE] = [const { AtomicU64::new(0) }; PAGE_CACHE];
const KNOWN_MAX: usize = 1024;
/// Load biases (+1, so 0 means empty) of modules already sent.
static KNOWN: [AtomicU64; KNOWN_MAX] = [const { AtomicU64::new(0) }; KNOWN_MAX];
static KNOWN_LEN: AtomicUsize = AtomicUsize::new(0);

/// Resolves `_dl_find_object` and records the modules sent at initialisation.
pub fn init(initial_biases: &[u64]) {
    resolve_find_object();
    for &b in initial_biases {
        remember(b);
    }
}

/// Resolves `_dl_find_object` (not for callbacks: dlsym takes the loader lock).
pub fn resolve_find_object() {
    // SAFETY: dlsym on the global scope with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
    FIND_OBJECT.store(p, Ordering::Release);
}

/// Whether [`find_object`] can answer (glibc >= 2.35, after [`resolve_find_object`]).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn can_find_objects() -> bool {
    !FIND_OBJECT.load(Ordering::Relaxed).is_null()
}

fn find_object_fn() -> Option<FindObjectFn> {
    let p = FIND_OBJECT.load(Ordering::Acquire);
    // SAFETY: p is null or `_dl_find_object` from glibc, with this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, FindObjectFn>(p) })
}

/// What `_dl_find_object` says about the object containing a code address.
#[cfg(target_arch = "x86_64")]
pub struct FoundObject {
    /// Address of the object's `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`); 0 if it has none.
    pub eh_frame_hdr: usize,
}

/// The loaded object containing `pc` (lock-free, callback-safe); `None` when no object contains
/// it or `_dl_find_object` is missing.
#[cfg(target_arch = "x86_64")]
pub fn find_object(pc: usize) -> Option<FoundObject> {
    let find = find_object_fn()?;
    let mut r = empty_result();
    // SAFETY: any address and a valid out struct; _dl_find_object takes no lock.
    if unsafe { find(pc as *mut c_void, &mut r) } != 0 {
        return None;
    }
    Some(FoundObject {
        eh_frame_hdr: r.eh_frame as usize,
    })
}

fn empty_result() -> DlFindObject {
    DlFindObject {
        flags: 0,
        map_start: core::ptr::null_mut(),
        map_end: core::ptr::null_mut(),
        link_map: core::ptr::null(),
        eh_frame: core::ptr::null_mut(),
        reserved: [0; 7],
    }
}

fn remember(bias: u64) -> bool {
    let n = KNOWN_LEN.load(Ordering::Acquire).min(KNOWN_MAX);
    if KNOWN[..n]
        .iter()
        .any(|k| k.load(Ordering::Relaxed) == bias + 1)
    {
        return false;
    }
    let i = KNOWN_LEN.fetch_add(1, Ordering::AcqRel);
    if i < KNOWN_MAX {
        KNOWN[i].store(bias + 1, Ordering::Release);
    }
    true
}

/// Sends a MODULE event for every frame in an object not sent yet.
#[inline]
pub fn note_frames(st: &State, frames: &[u64]) {
    let Some(find) = find_object_fn() else {
        return;
    };
    for &ip in frames {
        let page = ip >> 12;
        let slot = (page.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % PAGE_CACHE;
        if PAGES[slot].load(Ordering::Relaxed) == page {
            continue;
        }
        let mut r = empty_result();
        // SAFETY: a code address and a valid out struct; _dl_find_object takes no lock.
        if unsafe { find(ip as *mut c_void, &mut r) } != 0 || r.link_map.is_null() {
            continue;
        }
        // SAFETY: glibc returned a live link_map for a loaded object.
        let lm = unsafe { &*r.link_map };
        let bias = lm.addr as u64;
        if remember(bias) {
            send_module(st, lm, bias, r.map_end as u64);
        }
        PAGES[slot].store(page, Ordering::Relaxed);
    }
}

fn send_module(st: &State, lm: &LinkMap, bias: u64, map_end: u64) {
    let mut exe = [0u8; 512];
    let name: &[u8] = if lm.name.is_null() {
        b""
    } else {
        // SAFETY: l_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(lm.name) }.to_bytes()
    };
    let path: &[u8] = if name.is_empty() {
        // The main program: its link_map has no name.
        // SAFETY: readlink into a stack buffer of the given size.
        let n = unsafe {
            libc::readlink(
                c"/proc/self/exe".as_ptr(),
                exe.as_mut_ptr().cast(),
                exe.len(),
            )
        };
        if n <= 0 { b"" } else { &exe[..n as usize] }
    } else {
        name
    };
    st.emit(|e| {
        e.kind = kind::MODULE;
        e.set_text(path);
        e.stream = bias;
        e.pool = map_end.saturating_sub(bias);
    });
}
