//! Keeps the collector's module table complete for libraries loaded after initialisation
//! (dlopen): before an event with frames is written, each frame's page is looked up in a small
//! lock-free cache; on a miss, glibc's `_dl_find_object` (lock-free, glibc >= 2.35, found with
//! dlsym so older glibc just skips this) names the object, and a MODULE event is written for
//! an object not seen before. No allocation, no locks. The lookup itself is
//! [`crate::objects`]'s.

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::event::kind;
use crate::objects::{LinkMap, empty_result, find_object_fn, resolve_find_object};
use crate::state::State;

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
            send_module(st, lm, bias, r.map_start as u64, r.map_end as u64);
        }
        PAGES[slot].store(page, Ordering::Relaxed);
    }
}

/// Copies the `NT_GNU_BUILD_ID` descriptor of a PT_NOTE segment into `out` (at most 32 bytes);
/// returns its length, 0 if there is none. No allocation.
pub fn build_id_into(mut notes: &[u8], out: &mut [u8; 32]) -> usize {
    while notes.len() >= 12 {
        let word =
            |i: usize| u32::from_ne_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]);
        let (namesz, descsz, ty) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12 + namesz.next_multiple_of(4);
        let desc_end = name_end + descsz.next_multiple_of(4);
        if desc_end > notes.len() {
            break;
        }
        if ty == 3 && namesz == 4 && &notes[12..16] == b"GNU\0" {
            let n = descsz.min(32);
            out[..n].copy_from_slice(&notes[name_end..name_end + n]);
            return n;
        }
        notes = &notes[desc_end..];
    }
    0
}

/// The build id of a loaded object, read from its mapped ELF header, program headers and note
/// segment. Every read is checked to lie in a readable PT_LOAD segment of the object (the
/// header and program headers in its first page). No allocation.
fn mapped_build_id(map_start: u64, map_end: u64, bias: u64, out: &mut [u8; 32]) -> usize {
    if map_end <= map_start || map_end - map_start < 4096 || !map_start.is_multiple_of(4096) {
        return 0;
    }
    // SAFETY: the first page of a loaded object is its ELF header, mapped readable by the
    // loader (which read it from there); map_start is page-aligned and the span is >= a page.
    let page = unsafe { core::slice::from_raw_parts(map_start as *const u8, 4096) };
    if &page[..4] != b"\x7fELF" || page[4] != 2 {
        return 0;
    }
    let u16_at = |o: usize| u16::from_ne_bytes([page[o], page[o + 1]]) as usize;
    let phoff = u64::from_ne_bytes(page[0x20..0x28].try_into().unwrap_or([0xff; 8])) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    if phentsize < 56 || phoff.saturating_add(phentsize.saturating_mul(phnum)) > page.len() {
        return 0;
    }
    let ph = |i: usize| {
        let p = &page[phoff + i * phentsize..];
        let w32 = |o: usize| u32::from_ne_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        let w64 = |o: usize| u64::from_ne_bytes(p[o..o + 8].try_into().unwrap_or([0; 8]));
        // (type, flags, vaddr, filesz)
        (w32(0), w32(4), w64(16), w64(32))
    };
    let readable = |lo: u64, len: u64| {
        (0..phnum).any(|i| {
            let (ty, flags, vaddr, filesz) = ph(i);
            ty == libc::PT_LOAD
                && flags & libc::PF_R != 0
                && lo >= bias.wrapping_add(vaddr)
                && lo.saturating_add(len) <= bias.wrapping_add(vaddr).saturating_add(filesz)
        })
    };
    for i in 0..phnum {
        let (ty, _, vaddr, filesz) = ph(i);
        let start = bias.wrapping_add(vaddr);
        if ty == libc::PT_NOTE && filesz <= 65536 && readable(start, filesz) {
            // SAFETY: the range lies in a readable PT_LOAD segment of a loaded object.
            let notes = unsafe { core::slice::from_raw_parts(start as *const u8, filesz as usize) };
            let n = build_id_into(notes, out);
            if n > 0 {
                return n;
            }
        }
    }
    0
}

fn send_module(st: &State, lm: &LinkMap, bias: u64, map_start: u64, map_end: u64) {
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
    let mut id = [0u8; 32];
    let id_len = mapped_build_id(map_start, map_end, bias, &mut id);
    st.emit(|e| {
        e.kind = kind::MODULE;
        e.set_text(path);
        e.stream = bias;
        e.pool = map_end.saturating_sub(bias);
        e.put_bytes(crate::event::MAX_TEXT_BYTES - 32, &id[..id_len]);
        e.addr = id_len as u64;
    });
}
