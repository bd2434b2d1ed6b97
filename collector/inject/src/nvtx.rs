//! NVTX injection: `InitializeInjectionNvtx2` installs hooks for ranges and marks into the
//! NVTX function tables. The hooks run on the application's threads: no allocation, no locks.
//!
//! Domains (`nvtxDomainCreateA`) and registered strings (`nvtxDomainRegisterStringA`) are kept
//! in fixed static tables (64 domains, 1024 strings, 63 bytes each): the handles NVTX hands
//! back to the program point into them. Unicode messages are recorded as `<unicode>`.

use core::cell::Cell;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::entry::c_bytes;
use crate::event::kind;
use crate::state::{self, Init};

type FnPtr = *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(c_int, *mut *mut *mut FnPtr, *mut c_uint) -> c_int;

/// `NvtxExportTableCallbacks` (nvtxDetail/nvtxInitDecls.h, NVTX v3).
#[repr(C)]
struct CallbacksExport {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}
c_layout!(CallbacksExport, size 16, struct_size @ 0, get_module_function_table @ 8);

const ETID_CALLBACKS: u32 = 1;
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;

static NEXT_RANGE: AtomicU64 = AtomicU64::new(1);

/// A fixed-size name slot; its address is the handle given to the program.
#[repr(C, align(64))]
struct NameSlot {
    len: AtomicU8,
    bytes: [AtomicU8; 63],
}

impl NameSlot {
    const fn new() -> Self {
        Self {
            len: AtomicU8::new(0),
            bytes: [const { AtomicU8::new(0) }; 63],
        }
    }
    fn set(&self, name: &[u8]) {
        let n = name.len().min(63);
        for (slot, b) in self.bytes.iter().zip(&name[..n]) {
            slot.store(*b, Ordering::Relaxed);
        }
        self.len.store(n as u8, Ordering::Release);
    }
    /// Copies the name into `out`, returning its length.
    fn get(&self, out: &mut [u8; 63]) -> usize {
        let n = usize::from(self.len.load(Ordering::Acquire)).min(63);
        for (o, b) in out.iter_mut().zip(&self.bytes[..n]) {
            *o = b.load(Ordering::Relaxed);
        }
        n
    }
}

static DOMAINS: [NameSlot; 64] = [const { NameSlot::new() }; 64];
static DOMAIN_COUNT: AtomicUsize = AtomicUsize::new(0);
static STRINGS: [NameSlot; 1024] = [const { NameSlot::new() }; 1024];
static STRING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The slot a handle points to, if it is one of ours.
fn slot_of(table: &[NameSlot], handle: *const c_void) -> Option<&NameSlot> {
    let base = table.as_ptr() as usize;
    let h = handle as usize;
    let size = core::mem::size_of::<NameSlot>();
    if h < base || h >= base + core::mem::size_of_val(table) || !(h - base).is_multiple_of(size) {
        return None;
    }
    table.get((h - base) / size)
}

fn new_slot(table: &[NameSlot], count: &AtomicUsize, name: &[u8]) -> *const c_void {
    let i = count.fetch_add(1, Ordering::AcqRel);
    match table.get(i) {
        Some(slot) => {
            slot.set(name);
            (slot as *const NameSlot).cast()
        }
        None => core::ptr::null(),
    }
}

extern "C" fn domain_create_a(name: *const c_char) -> *const c_void {
    new_slot(&DOMAINS, &DOMAIN_COUNT, c_bytes(name))
}

extern "C" fn domain_register_string_a(_domain: *const c_void, s: *const c_char) -> *const c_void {
    new_slot(&STRINGS, &STRING_COUNT, c_bytes(s))
}

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
    if !matches!(
        state::init(crate::entry::skipped_code_ranges),
        Init::Ready(_)
    ) {
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
    let core2: [(usize, FnPtr); 7] = [
        (1, domain_mark_ex as FnPtr),
        (2, domain_range_start_ex as FnPtr),
        (3, domain_range_end as FnPtr),
        (4, domain_range_push_ex as FnPtr),
        (5, domain_range_pop as FnPtr),
        (10, domain_register_string_a as FnPtr),
        (12, domain_create_a as FnPtr),
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

/// Message of an nvtxEventAttributes_t v2: messageType (i32 at 32), message (at 40). A
/// registered string is copied into `buf`.
fn attr_message(attr: *const u8, buf: &mut [u8; 63]) -> &[u8] {
    if attr.is_null() {
        return b"";
    }
    // SAFETY: NVTX passes a valid attributes struct of at least 48 bytes for the call.
    unsafe {
        match *attr.add(32).cast::<i32>() {
            1 => c_bytes(*attr.add(40).cast::<*const c_char>()),
            2 => b"<unicode>",
            3 => match slot_of(&STRINGS, *attr.add(40).cast::<*const c_void>()) {
                Some(slot) => {
                    let n = slot.get(buf);
                    &buf[..n]
                }
                None => b"<registered>",
            },
            _ => b"",
        }
    }
}

fn emit_named(k: u32, name: &[u8], domain: u64, range_id: u64) {
    let Some(st) = state::get() else {
        return;
    };
    let mut domain_name = [0u8; 63];
    let domain_len = slot_of(&DOMAINS, domain as *const c_void)
        .map(|s| s.get(&mut domain_name))
        .unwrap_or(0);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        st.emit(|e| {
            e.kind = k;
            e.set_text(name);
            e.stream = domain;
            e.addr = range_id;
            e.set_domain_name(&domain_name[..domain_len]);
        });
    }));
}

extern "C" fn mark_a(msg: *const c_char) {
    emit_named(kind::MARK, c_bytes(msg), 0, 0);
}
extern "C" fn mark_ex(attr: *const u8) {
    let mut buf = [0u8; 63];
    emit_named(kind::MARK, attr_message(attr, &mut buf), 0, 0);
}
extern "C" fn domain_mark_ex(domain: *const c_void, attr: *const u8) {
    let mut buf = [0u8; 63];
    emit_named(kind::MARK, attr_message(attr, &mut buf), domain as u64, 0);
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
    let mut buf = [0u8; 63];
    start(attr_message(attr, &mut buf), 0)
}
extern "C" fn domain_range_start_ex(domain: *const c_void, attr: *const u8) -> u64 {
    let mut buf = [0u8; 63];
    start(attr_message(attr, &mut buf), domain as u64)
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
    let mut buf = [0u8; 63];
    push(attr_message(attr, &mut buf), 0)
}
extern "C" fn domain_range_push_ex(domain: *const c_void, attr: *const u8) -> c_int {
    let mut buf = [0u8; 63];
    push(attr_message(attr, &mut buf), domain as u64)
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
