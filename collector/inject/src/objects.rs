//! glibc's `_dl_find_object` (lock-free, glibc >= 2.35, found with dlsym so older glibc just
//! goes without): the loaded object containing a code address. The CFI stack walk
//! ([`crate::cfi`]) gets each object's `.eh_frame_hdr` from it, and [`crate::modules`] the objects
//! it tells the collector about. Depends on no other module of the crate.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

/// glibc's `struct dl_find_object` (dlfcn.h, glibc >= 2.35; x86-64 and aarch64 have no
/// `dlfo_eh_dbase`).
#[repr(C)]
pub(crate) struct DlFindObject {
    pub(crate) flags: u64,
    pub(crate) map_start: *mut c_void,
    pub(crate) map_end: *mut c_void,
    pub(crate) link_map: *const LinkMap,
    pub(crate) eh_frame: *mut c_void,
    pub(crate) reserved: [u64; 7],
}
c_layout!(DlFindObject, size 96, flags @ 0, map_start @ 8, map_end @ 16, link_map @ 24,
    eh_frame @ 32, reserved @ 40);

/// The public head of glibc's `struct link_map` (link.h: `l_addr`, `l_name`, then `l_ld`,
/// `l_next`, `l_prev`, never read here).
#[repr(C)]
pub(crate) struct LinkMap {
    pub(crate) addr: usize,
    pub(crate) name: *const c_char,
}
c_layout!(LinkMap, size 16, addr @ 0, name @ 8);

type FindObjectFn = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

static FIND_OBJECT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
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

pub(crate) fn find_object_fn() -> Option<FindObjectFn> {
    let p = FIND_OBJECT.load(Ordering::Acquire);
    // SAFETY: p is null or `_dl_find_object` from glibc, with this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, FindObjectFn>(p) })
}

/// What `_dl_find_object` says about the object containing a code address.
#[cfg(target_arch = "x86_64")]
pub struct FoundObject {
    /// Address of the object's `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`); 0 if it has none.
    pub eh_frame_hdr: usize,
    /// The object's mapped address range (its lowest to its highest segment).
    pub map: core::ops::Range<usize>,
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
        map: r.map_start as usize..r.map_end as usize,
    })
}

pub(crate) fn empty_result() -> DlFindObject {
    DlFindObject {
        flags: 0,
        map_start: core::ptr::null_mut(),
        map_end: core::ptr::null_mut(),
        link_map: core::ptr::null(),
        eh_frame: core::ptr::null_mut(),
        reserved: [0; 7],
    }
}
