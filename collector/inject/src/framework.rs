//! The handover from gpucollect's Python framework capture (`gpucollect_frameworks.py`, called
//! through ctypes) to the ring: a framework's blocks (tensors) and frees, with the Python stack
//! the framework recorded for them, and notices of events the framework's history lost.
//!
//! The functions run on the capture's own Python thread (not in a CUDA callback): they may
//! block on a full ring like any event. They never panic across `extern "C"`, and they write
//! nothing until the process has been injected (its first `cuInit`), returning 0 then.
//!
//! PyTorch's trace tracker, when gpucollect could build it, does not come here: it calls
//! [`crate::framework_tracker`]'s entry from the allocating thread, which captures the stack
//! itself.

use std::ffi::{CStr, c_char, c_int};
use std::panic::catch_unwind;

use gpucollect_ring::event::{MAX_FRAMES, alloc_kind, kind, notice_code};

use crate::python;
use crate::state::{self, State};

/// Records a framework block: `device`, `addr`, `size`, `stream`, `pool` (the framework's pool
/// id, 0 for its default), and `nframes` Python frames, innermost first, as three arrays of
/// that length (function name and file name, NUL-terminated UTF-8, and line). `torch` is
/// nonzero for a block of PyTorch's caching allocator, whose `size` is the request rounded up to
/// 512 bytes ([`alloc_kind::TORCH_BLOCK`]: the collector completes a large block left unsplit);
/// 0 where `size` is the block's (CuPy's pool). Returns 1 when recorded, 0 when the process is
/// not traced (or the collector is gone), -1 for bad arguments.
///
/// # Safety
/// When `nframes` > 0, `functions`, `files` and `lines` must each point to `nframes` readable
/// elements, and every string pointer must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpucollect_framework_alloc(
    device: u32,
    addr: u64,
    size: u64,
    stream: u64,
    pool: u64,
    nframes: u32,
    functions: *const *const c_char,
    files: *const *const c_char,
    lines: *const u32,
    torch: u32,
) -> c_int {
    let n = (nframes as usize).min(MAX_FRAMES);
    if n > 0 && (functions.is_null() || files.is_null() || lines.is_null()) {
        return -1;
    }
    // Copied out of the caller's memory before entering the unwind guard.
    let mut text: Vec<(&[u8], &[u8], u32)> = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller guarantees `nframes` readable elements in each array; i < n ≤ nframes.
        let (f, p, l) = unsafe { (*functions.add(i), *files.add(i), *lines.add(i)) };
        // SAFETY: each string pointer is null or NUL-terminated (the caller's contract).
        let (f, p) = unsafe { (c_bytes(f), c_bytes(p)) };
        text.push((f, p, l));
    }
    catch_unwind(|| {
        let Some(st) = state::get() else {
            return 0;
        };
        let mut frames = [0u64; MAX_FRAMES];
        for (slot, (f, p, l)) in frames.iter_mut().zip(&text) {
            *slot = python::text_frame(st, f, p, *l);
        }
        let code = if torch != 0 {
            alloc_kind::TORCH_BLOCK
        } else {
            alloc_kind::FRAMEWORK_BLOCK
        };
        let block = Block {
            code,
            device,
            addr,
            size,
            stream,
            pool,
        };
        c_int::from(emit_block(st, &block, &frames[..n]))
    })
    .unwrap_or(-1)
}

/// The bytes of a NUL-terminated string, empty for null.
///
/// # Safety
/// `s` must be null or point to a NUL-terminated string that outlives the result.
unsafe fn c_bytes<'a>(s: *const c_char) -> &'a [u8] {
    if s.is_null() {
        return b"";
    }
    // SAFETY: non-null and NUL-terminated (this function's contract).
    unsafe { CStr::from_ptr(s) }.to_bytes()
}

/// Records that the framework block at `addr` on `device` went back to the framework's cache.
/// Returns as [`gpucollect_framework_alloc`] does.
#[unsafe(no_mangle)]
pub extern "C" fn gpucollect_framework_free(
    device: u32,
    addr: u64,
    stream: u64,
    pool: u64,
) -> c_int {
    catch_unwind(|| {
        let Some(st) = state::get() else {
            return 0;
        };
        c_int::from(emit_free(st, device, addr, stream, pool))
    })
    .unwrap_or(-1)
}

/// A framework block as the ring carries it: `code` is [`alloc_kind::FRAMEWORK_BLOCK`], or
/// [`alloc_kind::TORCH_BLOCK`] for PyTorch's (its size the rounded request).
pub(crate) struct Block {
    pub code: u32,
    pub device: u32,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: u64,
}

/// Writes a framework block (an `ALLOC` of its code) with `frames` (at most `MAX_FRAMES`): the
/// event both the Python handover and the allocator's trace hook record.
pub(crate) fn emit_block(st: &State, b: &Block, frames: &[u64]) -> bool {
    let n = frames.len().min(MAX_FRAMES);
    st.emit(|e| {
        e.kind = kind::ALLOC;
        e.code = b.code;
        e.device = b.device;
        e.addr = b.addr;
        e.size = b.size;
        e.stream = b.stream;
        e.pool = b.pool;
        e.nframes = n as u32;
        e.data[..n].copy_from_slice(&frames[..n]);
    })
}

/// Writes a framework block's return to the framework's cache (`FRAMEWORK_FREE`).
pub(crate) fn emit_free(st: &State, device: u32, addr: u64, stream: u64, pool: u64) -> bool {
    st.emit(|e| {
        e.kind = kind::FRAMEWORK_FREE;
        e.device = device;
        e.addr = addr;
        e.stream = stream;
        e.pool = pool;
    })
}

/// Writes a notice (code [`notice_code::FRAMEWORK_EVENTS_LOST`]) with `message` (NUL-terminated
/// UTF-8): the framework's history lost events before they were read. Returns as
/// [`gpucollect_framework_alloc`] does.
///
/// # Safety
/// `message` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpucollect_framework_lost(message: *const c_char) -> c_int {
    if message.is_null() {
        return -1;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let text = unsafe { CStr::from_ptr(message) }.to_bytes();
    catch_unwind(|| {
        let Some(st) = state::get() else {
            return 0;
        };
        c_int::from(st.emit(|e| {
            e.kind = kind::NOTICE;
            e.code = notice_code::FRAMEWORK_EVENTS_LOST;
            e.set_text(text);
        }))
    })
    .unwrap_or(-1)
}
