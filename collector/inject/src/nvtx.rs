//! NVTX injection: `InitializeInjectionNvtx2` installs hooks for ranges and marks into the
//! NVTX function tables. The hooks run on the application's threads: no allocation, no locks.
//!
//! Registered strings and Unicode messages are recorded as `<registered>` / `<unicode>`;
//! domains are recorded by handle only (domain names are not captured yet).

use core::cell::Cell;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicU64, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::entry::c_bytes;
use crate::event::kind;
use crate::state::{self, Init};

type FnPtr = *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(c_int, *mut *mut *mut FnPtr, *mut c_uint) -> c_int;

#[repr(C)]
struct CallbacksExport {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

const ETID_CALLBACKS: u32 = 1;
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;

static NEXT_RANGE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static DEPTH: Cell<c_int> = const { Cell::new(0) };
}

/// Called by NVTX when `NVTX_INJECTION64_PATH` names this library (once per library that embeds
/// NVTX). Returns 1 when the hooks are installed, 0 to leave NVTX a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<unsafe extern "C" fn(u32) -> *const c_void>,
) -> c_int {
    catch_unwind(|| install(get_export_table)).unwrap_or(0)
}

fn install(get_export_table: Option<unsafe extern "C" fn(u32) -> *const c_void>) -> c_int {
    if !matches!(state::init(), Init::Ready(_)) {
        return 0;
    }
    let Some(get) = get_export_table else {
        return 0;
    };
    // SAFETY: NVTX's export-table getter; id 1 returns the callbacks table or null.
    let table = unsafe { get(ETID_CALLBACKS) }.cast::<CallbacksExport>();
    if table.is_null() {
        return 0;
    }
    // SAFETY: non-null export table of the documented layout.
    let Some(get_module) = (unsafe { &*table }).get_module_function_table else {
        return 0;
    };
    let core: [(usize, FnPtr); 8] = [
        (1, mark_ex as FnPtr),
        (2, mark_a as FnPtr),
        (4, range_start_ex as FnPtr),
        (5, range_start_a as FnPtr),
        (7, range_end as FnPtr),
        (8, range_push_ex as FnPtr),
        (9, range_push_a as FnPtr),
        (11, range_pop as FnPtr),
    ];
    let core2: [(usize, FnPtr); 5] = [
        (1, domain_mark_ex as FnPtr),
        (2, domain_range_start_ex as FnPtr),
        (3, domain_range_end as FnPtr),
        (4, domain_range_push_ex as FnPtr),
        (5, domain_range_pop as FnPtr),
    ];
    let mut any = false;
    for (module, hooks) in [(MODULE_CORE, &core[..]), (MODULE_CORE2, &core2[..])] {
        let mut slots: *mut *mut FnPtr = core::ptr::null_mut();
        let mut size: c_uint = 0;
        // SAFETY: documented out-parameters.
        if unsafe { get_module(module, &mut slots, &mut size) } == 0 || slots.is_null() {
            continue;
        }
        for &(i, f) in hooks {
            if i < size as usize {
                // SAFETY: slots has `size` entries, each a pointer to NVTX's function pointer.
                unsafe {
                    let slot = *slots.add(i);
                    if !slot.is_null() {
                        *slot = f;
                        any = true;
                    }
                }
            }
        }
    }
    c_int::from(any)
}

/// Message of an nvtxEventAttributes_t v2: messageType (i32 at 32), message (at 40).
fn attr_message<'a>(attr: *const u8) -> &'a [u8] {
    if attr.is_null() {
        return b"";
    }
    // SAFETY: NVTX passes a valid attributes struct of at least 48 bytes for the call.
    unsafe {
        match *attr.add(32).cast::<i32>() {
            1 => c_bytes(*attr.add(40).cast::<*const c_char>()),
            2 => b"<unicode>",
            3 => b"<registered>",
            _ => b"",
        }
    }
}

fn emit_named(k: u32, name: &[u8], domain: u64, range_id: u64) {
    let Some(st) = state::get() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        st.emit(|e| {
            e.kind = k;
            e.set_text(name);
            e.stream = domain;
            e.addr = range_id;
        });
    }));
}

extern "C" fn mark_a(msg: *const c_char) {
    emit_named(kind::MARK, c_bytes(msg), 0, 0);
}
extern "C" fn mark_ex(attr: *const u8) {
    emit_named(kind::MARK, attr_message(attr), 0, 0);
}
extern "C" fn domain_mark_ex(domain: *const c_void, attr: *const u8) {
    emit_named(kind::MARK, attr_message(attr), domain as u64, 0);
}
fn start(name: &[u8], domain: u64) -> u64 {
    let id = NEXT_RANGE.fetch_add(1, Ordering::Relaxed);
    emit_named(kind::RANGE_START, name, domain, id);
    id
}
extern "C" fn range_start_a(msg: *const c_char) -> u64 {
    start(c_bytes(msg), 0)
}
extern "C" fn range_start_ex(attr: *const u8) -> u64 {
    start(attr_message(attr), 0)
}
extern "C" fn domain_range_start_ex(domain: *const c_void, attr: *const u8) -> u64 {
    start(attr_message(attr), domain as u64)
}
extern "C" fn range_end(id: u64) {
    emit_named(kind::RANGE_END, b"", 0, id);
}
extern "C" fn domain_range_end(_domain: *const c_void, id: u64) {
    emit_named(kind::RANGE_END, b"", 0, id);
}
fn push(name: &[u8], domain: u64) -> c_int {
    emit_named(kind::RANGE_PUSH, name, domain, 0);
    let d = DEPTH.get();
    DEPTH.set(d + 1);
    d
}
extern "C" fn range_push_a(msg: *const c_char) -> c_int {
    push(c_bytes(msg), 0)
}
extern "C" fn range_push_ex(attr: *const u8) -> c_int {
    push(attr_message(attr), 0)
}
extern "C" fn domain_range_push_ex(domain: *const c_void, attr: *const u8) -> c_int {
    push(attr_message(attr), domain as u64)
}
fn pop(domain: u64) -> c_int {
    emit_named(kind::RANGE_POP, b"", domain, 0);
    let d = DEPTH.get();
    if d == 0 {
        return -1;
    }
    DEPTH.set(d - 1);
    d - 1
}
extern "C" fn range_pop() -> c_int {
    pop(0)
}
extern "C" fn domain_range_pop(domain: *const c_void) -> c_int {
    pop(domain as u64)
}
