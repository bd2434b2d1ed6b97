//! Python caller frames in captured stacks: the file, function and line of every Python frame
//! of the allocating thread, read inside the CUPTI callback without the GIL.
//!
//! # Design constraints
//! - Never take the GIL and never call anything that could (no `PyGILState_Ensure`): PyTorch
//!   calls the driver with the GIL released, often while another thread holds it and waits on
//!   a lock the allocating thread holds. A callback only *reads* memory, plus three tiny
//!   CPython functions that neither lock nor allocate (checked in the 3.11–3.13 binaries):
//!   `PyGILState_GetThisThreadState` (a `pthread_getspecific` of the thread's own state),
//!   `Py_IsInitialized` and `_Py_IsFinalizing`/`Py_IsFinalizing` (one load each).
//! - The frames read are the calling thread's own: it is blocked inside the CUDA call, so its
//!   frame chain cannot change under us, and each frame holds a strong reference to its code
//!   object, which holds its names and line table.
//! - Layouts are per CPython minor version: 3.11 and 3.12 from tables checked against their
//!   headers (`tests` compiles `python_offsets.c` against every installed CPython), 3.13 from
//!   the `_Py_DebugOffsets` CPython puts at the start of `_PyRuntime` for out-of-process tools.
//!   Any other version (older, newer, free-threaded, debug builds with a different object
//!   header) leaves stacks native-only. [`init`] also checks the layout against the type
//!   objects it can read safely (`tp_basicsize` of code, bytes and str, `ob_type` of a type).
//! - Every pointer is checked before it is followed (non-null, aligned, in the user half of
//!   the address space), objects by their type (`ob_type == &PyCode_Type`, `&PyBytes_Type`,
//!   `&PyUnicode_Type`), lengths and the instruction offset by bounds, and walks by a depth
//!   limit: a frame that does not check out is skipped. What this cannot catch is a pointer
//!   that looks valid but is not mapped; with the right layout the thread's own chain has none.
//!
//! # What reaches the collector
//! A Python frame is one `u64` among the native return addresses ([`python_frame`]): a code
//! slot and the line of the current instruction (decoded from `co_linetable` here, without
//! allocating). A code slot is an index into a fixed lock-free table (a static, 64 Ki
//! entries) keyed by a hash of the code object's address, its name, file and line table
//! pointers and first line, so a code object freed and another allocated at the same address
//! get different slots. The first time this process (or this fork child) meets a code slot, it
//! writes a [`kind::PY_CODE`] event with the qualified name and the file name; the collector
//! turns the pair into trace `frame` records. A full table gives frames of an unknown function.
//!
//! # Merging with the native stack
//! Each C-level call of `_PyEval_EvalFrameDefault` runs a run of Python frames, ended by an
//! entry frame (3.11: `is_entry`; 3.12+: a frame owned by the C stack). Native frames inside
//! `_PyEval_EvalFrameDefault` (its size from the ELF symbol) are replaced, innermost first,
//! by the run they were running, as memray's native mode does; the interpreter's other frames
//! (its call machinery between runs, its `main`) are left out, while frames of other modules
//! (an extension calling back into Python) stay in place. Runs left over (the native walk
//! stopped early) follow the native frames. If no evaluation-loop frame is recognised,
//! the Python frames take the place of the first frame inside the interpreter's own module and
//! everything after it.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::event::{MAX_FRAMES, MAX_TEXT_BYTES, kind, python_frame};
use crate::state::{self, State};

/// Python frames kept per stack.
const MAX_PY_FRAMES: usize = 64;
/// Frames walked per stack at most (a bound on any loop through a damaged chain).
const MAX_WALK: usize = 256;
/// Largest code object (in code units) and line table (bytes) believed.
const MAX_CODE_UNITS: isize = 1 << 24;
const MAX_LINETABLE_BYTES: isize = 1 << 24;
/// Longest function name copied into a PY_CODE event; the file name gets the rest.
const MAX_FUNCTION_BYTES: usize = 160;

/// Offsets (bytes) of everything the walk reads, for one CPython minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub minor: u32,
    /// `PyThreadState.cframe` (3.11, 3.12); `None` when the thread state holds the frame.
    pub tstate_cframe: Option<usize>,
    /// `_PyCFrame.current_frame` (3.11, 3.12) or `PyThreadState.current_frame` (3.13).
    pub current_frame: usize,
    /// `_PyInterpreterFrame.f_code` / `f_executable`.
    pub frame_code: usize,
    pub frame_previous: usize,
    /// `prev_instr` (3.11, 3.12) / `instr_ptr` (3.13): the instruction being executed.
    pub frame_instr: usize,
    pub frame_owner: usize,
    /// `_PyInterpreterFrame.is_entry` (3.11 only).
    pub frame_is_entry: Option<usize>,
    /// `FRAME_OWNED_BY_CSTACK` (3.12+): an entry frame of the C stack, not Python code.
    pub owner_cstack: Option<u8>,
    /// `ob_size` of a code object: its number of code units.
    pub code_units: usize,
    pub code_filename: usize,
    pub code_qualname: usize,
    pub code_linetable: usize,
    pub code_firstlineno: usize,
    /// `_co_firsttraceable` (3.11, 3.12): instructions before it belong to an incomplete frame.
    pub code_firsttraceable: Option<usize>,
    /// `co_code_adaptive`: the bytecode, right after the fixed part (the `tp_basicsize` of
    /// `PyCode_Type`).
    pub code_adaptive: usize,
    pub bytes_size: usize,
    pub bytes_sval: usize,
    pub str_length: usize,
    pub str_state: usize,
    pub str_ascii_size: usize,
    pub str_compact_size: usize,
    /// `sizeof(PyUnicodeObject)` (the `tp_basicsize` of `PyUnicode_Type`).
    pub str_basicsize: usize,
    pub ob_type: usize,
}

/// CPython 3.11 (checked against 3.11.2 and 3.11.7 headers).
pub(crate) const LAYOUT_311: Layout = Layout {
    minor: 11,
    tstate_cframe: Some(56),
    current_frame: 8,
    frame_code: 32,
    frame_previous: 48,
    frame_instr: 56,
    frame_owner: 69,
    frame_is_entry: Some(68),
    owner_cstack: None,
    code_units: 16,
    code_filename: 112,
    code_qualname: 128,
    code_linetable: 136,
    code_firstlineno: 72,
    code_firsttraceable: Some(168),
    code_adaptive: 184,
    bytes_size: 16,
    bytes_sval: 32,
    str_length: 16,
    str_state: 32,
    str_ascii_size: 48,
    str_compact_size: 72,
    str_basicsize: 80,
    ob_type: 8,
};

/// CPython 3.12 (checked against 3.12.1 headers).
pub(crate) const LAYOUT_312: Layout = Layout {
    minor: 12,
    tstate_cframe: Some(56),
    current_frame: 0,
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    frame_owner: 70,
    frame_is_entry: None,
    owner_cstack: Some(3),
    code_units: 16,
    code_filename: 112,
    code_qualname: 128,
    code_linetable: 136,
    code_firstlineno: 68,
    code_firsttraceable: Some(176),
    code_adaptive: 192,
    bytes_size: 16,
    bytes_sval: 32,
    str_length: 16,
    str_state: 32,
    str_ascii_size: 40,
    str_compact_size: 56,
    str_basicsize: 64,
    ob_type: 8,
};

/// `PyASCIIObject.state` bits (3.11–3.13): kind (1, 2 or 4 bytes per character), compact
/// (characters follow the header), ascii (and so 1 byte each, after the shorter header).
const STATE_KIND_SHIFT: u32 = 2;
const STATE_COMPACT: u32 = 1 << 5;
const STATE_ASCII: u32 = 1 << 6;

/// The 3.13 layout from `_PyRuntime.debug_offsets` (the `_Py_DebugOffsets` of 3.13: a cookie,
/// the version, then `u64` offsets in a fixed order), or why not.
fn layout_313(debug: &[u64; DEBUG_OFFSETS_WORDS]) -> Result<Layout, String> {
    if debug[0].to_ne_bytes() != *b"xdebugpy" {
        return Err("its _PyRuntime has no debug offsets".into());
    }
    if debug[1] >> 16 != 0x030D {
        return Err(format!("its debug offsets are for version {:#x}", debug[1]));
    }
    if debug[2] != 0 {
        return Err("it is a free-threaded build".into());
    }
    let at = |i: usize| debug[i] as usize;
    let l = Layout {
        minor: 13,
        tstate_cframe: None,
        current_frame: at(23),
        frame_code: at(30),
        frame_previous: at(29),
        frame_instr: at(31),
        frame_owner: at(33),
        frame_is_entry: None,
        owner_cstack: Some(3),
        // A code object is a PyVarObject, like a tuple.
        code_units: at(52),
        code_filename: at(35),
        code_qualname: at(37),
        code_linetable: at(38),
        code_firstlineno: at(39),
        code_firsttraceable: None,
        code_adaptive: at(43),
        bytes_size: at(65),
        bytes_sval: at(66),
        str_length: at(69),
        str_state: at(68),
        str_ascii_size: at(70),
        str_compact_size: at(70) + 16,
        str_basicsize: at(67),
        ob_type: at(45),
    };
    let inside = |off: usize, size: u64| (off as u64) < size && off < 4096;
    let ok = inside(l.current_frame, debug[19])
        && [l.frame_code, l.frame_previous, l.frame_instr, l.frame_owner]
            .iter()
            .all(|&o| inside(o, debug[28]))
        && [
            l.code_filename,
            l.code_qualname,
            l.code_linetable,
            l.code_firstlineno,
            l.code_adaptive,
        ]
        .iter()
        .all(|&o| inside(o, debug[34]))
        && inside(l.bytes_sval, debug[64])
        && inside(l.str_state, debug[67])
        && inside(l.str_length, debug[67]);
    if !ok {
        return Err("its debug offsets are out of range".into());
    }
    Ok(l)
}

/// Words of the 3.13 `_Py_DebugOffsets` read (cookie .. unicode_object.asciiobject_size).
const DEBUG_OFFSETS_WORDS: usize = 71;

type VoidFn = unsafe extern "C" fn() -> *mut c_void;
type IntFn = unsafe extern "C" fn() -> c_int;

/// The interpreter found at initialisation.
struct Python {
    layout: Layout,
    this_thread_state: VoidFn,
    is_initialized: IntFn,
    is_finalizing: IntFn,
    code_type: usize,
    bytes_type: usize,
    unicode_type: usize,
    /// `[start, end)` of `_PyEval_EvalFrameDefault`'s code (end = start when unknown).
    eval: (usize, usize),
    /// `[start, end)` of the module holding the interpreter (libpython or the executable).
    interpreter: (usize, usize),
}

static PYTHON: AtomicPtr<Python> = AtomicPtr::new(core::ptr::null_mut());

/// What [`init`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Detected {
    /// No CPython in the process (or it is not visible from the global symbol scope).
    NotPython,
    /// Python frames are switched off (`GPUCOLLECT_PYTHON_FRAMES=0`).
    Disabled,
    /// A CPython whose frames cannot be read; the reason.
    Unsupported(String),
    /// Python frames will be captured (the interpreter's `PY_VERSION_HEX`).
    Ready(u64),
}

fn sym(name: &CStr) -> usize {
    // SAFETY: dlsym on the global scope with a NUL-terminated name (not in a callback).
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// Looks for CPython in the process and, when it is a supported version, turns Python frames
/// on. Called once at injection time, outside callbacks (it looks symbols up and may allocate).
/// `modules` are the loaded objects as (start, end) address ranges.
pub fn init(modules: &[(u64, u64)]) -> Detected {
    if std::env::var(crate::env::PYTHON_FRAMES).is_ok_and(|v| v == "0") {
        return Detected::Disabled;
    }
    let version_sym = sym(c"Py_Version");
    if version_sym == 0 {
        let get_version = sym(c"Py_GetVersion");
        if get_version == 0 {
            return Detected::NotPython;
        }
        // SAFETY: Py_GetVersion (every CPython) returns a static NUL-terminated string.
        let v = unsafe {
            let f =
                core::mem::transmute::<usize, unsafe extern "C" fn() -> *const c_char>(get_version);
            CStr::from_ptr(f())
        };
        let v = v.to_string_lossy();
        let v = v.split_whitespace().next().unwrap_or("?").to_string();
        return Detected::Unsupported(format!(
            "Python {v}: Python frames need CPython 3.11, 3.12 or 3.13"
        ));
    }
    // SAFETY: Py_Version is CPython's `const unsigned long` PY_VERSION_HEX (3.11+).
    let version = unsafe { *(version_sym as *const u64) };
    match detect(version, modules) {
        Ok(py) => {
            PYTHON.store(Box::into_raw(Box::new(py)), Ordering::Release);
            Detected::Ready(version)
        }
        Err(why) => Detected::Unsupported(format!(
            "Python {}.{}: {why}",
            version >> 24,
            (version >> 16) & 0xff
        )),
    }
}

fn detect(version: u64, modules: &[(u64, u64)]) -> Result<Python, String> {
    let layout = match version >> 16 {
        0x030B => LAYOUT_311,
        0x030C => LAYOUT_312,
        0x030D => {
            let runtime = sym(c"_PyRuntime");
            if runtime == 0 {
                return Err("_PyRuntime is not exported".into());
            }
            let mut debug = [0u64; DEBUG_OFFSETS_WORDS];
            for (i, w) in debug.iter_mut().enumerate() {
                // SAFETY: _PyRuntime starts with the _Py_DebugOffsets struct (3.13), at least
                // DEBUG_OFFSETS_WORDS u64 long, in the interpreter's static data.
                *w = unsafe { *((runtime + i * 8) as *const u64) };
            }
            layout_313(&debug)?
        }
        _ => return Err("Python frames need CPython 3.11, 3.12 or 3.13".into()),
    };
    let (finalizing_name, other) = if layout.minor >= 13 {
        (c"Py_IsFinalizing", c"_Py_IsFinalizing")
    } else {
        (c"_Py_IsFinalizing", c"Py_IsFinalizing")
    };
    let mut is_finalizing = sym(finalizing_name);
    if is_finalizing == 0 {
        is_finalizing = sym(other);
    }
    let need = [
        (
            "PyGILState_GetThisThreadState",
            sym(c"PyGILState_GetThisThreadState"),
        ),
        ("Py_IsInitialized", sym(c"Py_IsInitialized")),
        ("Py_IsFinalizing", is_finalizing),
        ("PyCode_Type", sym(c"PyCode_Type")),
        ("PyBytes_Type", sym(c"PyBytes_Type")),
        ("PyUnicode_Type", sym(c"PyUnicode_Type")),
        ("PyType_Type", sym(c"PyType_Type")),
        ("_PyEval_EvalFrameDefault", sym(c"_PyEval_EvalFrameDefault")),
    ];
    if let Some((name, _)) = need.iter().find(|(_, a)| *a == 0) {
        return Err(format!("{name} is not exported"));
    }
    let [
        tstate,
        initialized,
        finalizing,
        code_type,
        bytes_type,
        unicode_type,
        type_type,
        eval,
    ] = need.map(|(_, a)| a);
    check_types(&layout, code_type, bytes_type, unicode_type, type_type)?;
    // SAFETY: the three are CPython functions taking no argument (the symbols were found above).
    let (this_thread_state, is_initialized, is_finalizing) = unsafe {
        (
            core::mem::transmute::<usize, VoidFn>(tstate),
            core::mem::transmute::<usize, IntFn>(initialized),
            core::mem::transmute::<usize, IntFn>(finalizing),
        )
    };
    // Bind their PLT entries now rather than in the first callback.
    // SAFETY: all three may be called without the GIL and have no preconditions.
    unsafe {
        this_thread_state();
        is_initialized();
        is_finalizing();
    }
    let eval_end = eval + symbol_size(eval);
    let interpreter = modules
        .iter()
        .find(|&&(lo, hi)| lo as usize <= eval && eval < hi as usize)
        .map_or((0, 0), |&(lo, hi)| (lo as usize, hi as usize));
    Ok(Python {
        layout,
        this_thread_state,
        is_initialized,
        is_finalizing,
        code_type,
        bytes_type,
        unicode_type,
        eval: (eval, eval_end),
        interpreter,
    })
}

/// Checks the layout against what can be read safely: the static type objects.
fn check_types(
    l: &Layout,
    code_type: usize,
    bytes_type: usize,
    unicode_type: usize,
    type_type: usize,
) -> Result<(), String> {
    // PyTypeObject: PyVarObject header (24 bytes), tp_name, tp_basicsize.
    const TP_BASICSIZE: usize = 32;
    // SAFETY: the four are CPython's static type objects, larger than TP_BASICSIZE + 8 bytes.
    let (code_meta, code_size, bytes_size, str_size) = unsafe {
        (
            *((code_type + l.ob_type) as *const usize),
            *((code_type + TP_BASICSIZE) as *const usize),
            *((bytes_type + TP_BASICSIZE) as *const usize),
            *((unicode_type + TP_BASICSIZE) as *const usize),
        )
    };
    if code_meta != type_type {
        return Err(
            "its objects have an unexpected header (a debug or free-threaded build?)".into(),
        );
    }
    if code_size != l.code_adaptive || bytes_size != l.bytes_sval + 1 || str_size != l.str_basicsize
    {
        return Err(format!(
            "its code, bytes or str objects have unexpected sizes ({code_size}, {bytes_size}, \
             {str_size})"
        ));
    }
    Ok(())
}

/// Size of the function starting at `addr`, from its ELF symbol (0 when unknown).
fn symbol_size(addr: usize) -> usize {
    const RTLD_DL_SYMENT: c_int = 1;
    let mut info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    let mut sym: *mut c_void = core::ptr::null_mut();
    // SAFETY: dladdr1 with valid out pointers; RTLD_DL_SYMENT makes `sym` an ElfW(Sym)*.
    let ok = unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if ok == 0 || sym.is_null() || info.dli_saddr as usize != addr {
        return 0;
    }
    // SAFETY: glibc returned a pointer to the symbol's entry in the object's symbol table.
    unsafe { (*sym.cast::<libc::Elf64_Sym>()).st_size as usize }
}

/// Line of the instruction at `lasti` (in code units) according to a CPython 3.11+ location
/// table (`co_linetable`, format in CPython's `Objects/locations.md`), whose first entry is
/// relative to `first_line`. `None` when that instruction has no line or lies past the table.
/// Allocation-free; reads only `table`.
pub fn line_of_instruction(table: &[u8], first_line: i32, lasti: u32) -> Option<u32> {
    let lasti = u64::from(lasti);
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    let mut i = 0;
    while i < table.len() {
        let first = table[i];
        i += 1;
        if first & 0x80 == 0 {
            // Not the start of an entry: skip to the next one.
            continue;
        }
        let code = (first >> 3) & 15;
        let units = u64::from(first & 7) + 1;
        let delta = match code {
            0..=9 => Some(0),
            10..=12 => Some(i64::from(code) - 10),
            13 | 14 => {
                let (d, used) = read_svarint(&table[i..]);
                i += used;
                Some(d)
            }
            _ => None,
        };
        if let Some(d) = delta {
            line = line.saturating_add(d);
        }
        let end = addr + units;
        if lasti < end {
            return delta.and_then(|_| u32::try_from(line).ok());
        }
        addr = end;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// An unsigned varint of the location table: 6-bit chunks, least significant first, bit 6
/// set on every chunk but the last. Returns the value and the bytes used.
fn read_varint(b: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    let mut shift = 0;
    let mut i = 0;
    while i < b.len() && shift < 64 {
        let x = b[i];
        i += 1;
        v |= u64::from(x & 63) << shift;
        if x & 64 == 0 {
            break;
        }
        shift += 6;
    }
    (v, i)
}

fn read_svarint(b: &[u8]) -> (i64, usize) {
    let (u, n) = read_varint(b);
    let magnitude = (u >> 1) as i64;
    (if u & 1 != 0 { -magnitude } else { magnitude }, n)
}

/// Python frames of one capture, innermost first, cut into runs: run `i` is what the `i`-th
/// (innermost first) C-level call of the evaluation loop was running.
struct PyStack {
    frames: [u64; MAX_PY_FRAMES],
    n: usize,
    runs: [u8; MAX_PY_FRAMES],
    nruns: usize,
    /// Frames in the run being read (not yet closed).
    open: usize,
}

impl PyStack {
    const fn new() -> Self {
        Self {
            frames: [0; MAX_PY_FRAMES],
            n: 0,
            runs: [0; MAX_PY_FRAMES],
            nruns: 0,
            open: 0,
        }
    }

    fn push(&mut self, frame: u64) -> bool {
        if self.n >= MAX_PY_FRAMES {
            return false;
        }
        self.frames[self.n] = frame;
        self.n += 1;
        self.open += 1;
        true
    }

    /// Ends the current run (even an empty one: it still stands for one evaluation-loop call).
    fn close_run(&mut self) {
        if self.nruns < MAX_PY_FRAMES {
            self.runs[self.nruns] = self.open as u8;
            self.nruns += 1;
            self.open = 0;
        }
    }

    fn frames(&self) -> &[u64] {
        &self.frames[..self.n]
    }
}

/// Writes the merged stack into `out`: each native frame for which `is_eval` holds is replaced
/// by the next run of Python frames, other frames of the interpreter (`in_interpreter`) are
/// left out, and runs left over follow the native frames. When no native frame is an
/// evaluation-loop frame, the Python frames replace the first frame of the interpreter and
/// every frame after it. Returns the number of frames written.
fn merge(
    native: &[u64],
    py: &PyStack,
    is_eval: impl Fn(u64) -> bool,
    in_interpreter: impl Fn(u64) -> bool,
    out: &mut [u64],
) -> usize {
    let mut n = 0;
    let mut put = |f: u64| {
        if n < out.len() {
            out[n] = f;
            n += 1;
        }
    };
    let frames = py.frames();
    let mut used = 0;
    if native.iter().any(|&ip| is_eval(ip)) {
        let mut run = 0;
        for &ip in native {
            if !is_eval(ip) {
                // The interpreter's own calls between runs (vectorcall, call helpers, its
                // main) say nothing the Python frames do not; extension modules stay.
                if !in_interpreter(ip) {
                    put(ip);
                }
                continue;
            }
            if run < py.nruns {
                let end = (used + py.runs[run] as usize).min(frames.len());
                for &f in &frames[used..end] {
                    put(f);
                }
                used = end;
                run += 1;
            }
        }
    } else {
        for &ip in native {
            if in_interpreter(ip) {
                break;
            }
            put(ip);
        }
    }
    for &f in &frames[used..] {
        put(f);
    }
    n
}

/// Adds the Python frames of the calling thread to the `n` native frames in `out` (callback
/// path: no allocation, no lock). A process without a supported Python pays one atomic load.
#[inline]
pub fn add_frames(st: &State, out: &mut [u64; MAX_FRAMES], n: usize) -> usize {
    let p = PYTHON.load(Ordering::Acquire);
    if p.is_null() {
        return n;
    }
    // SAFETY: PYTHON is set once to a leaked Box and never freed.
    let py = unsafe { &*p };
    let mut stack = PyStack::new();
    // SAFETY: walk only follows pointers it has checked, on this thread's own frame chain.
    unsafe { walk(py, st, &mut stack) };
    if stack.n == 0 {
        return n;
    }
    let native = *out;
    let (eval_lo, eval_hi) = py.eval;
    let (interp_lo, interp_hi) = py.interpreter;
    // A return address points after the call instruction, which is inside the caller.
    let is_eval = |ip: u64| {
        let call = ip.wrapping_sub(1) as usize;
        call >= eval_lo && call < eval_hi
    };
    let in_interpreter = |ip: u64| {
        let call = ip.wrapping_sub(1) as usize;
        call >= interp_lo && call < interp_hi
    };
    merge(&native[..n], &stack, is_eval, in_interpreter, out)
}

/// Whether `p` can be an object or frame pointer: non-null, 8-aligned, in the user half.
#[inline]
fn plausible(p: usize) -> bool {
    (0x1000..0x0000_8000_0000_0000).contains(&p) && p.is_multiple_of(8)
}

/// Reads a `T` at `addr`.
///
/// # Safety
/// `addr` must be readable for `size_of::<T>()` bytes and aligned for `T`.
#[inline]
unsafe fn rd<T: Copy>(addr: usize) -> T {
    // SAFETY: guaranteed by the caller.
    unsafe { (addr as *const T).read() }
}

/// Reads this thread's Python frames into `out`.
///
/// # Safety
/// `py` must describe the interpreter in this process (as [`detect`] checked).
unsafe fn walk(py: &Python, st: &State, out: &mut PyStack) {
    let l = &py.layout;
    // SAFETY: both are lock-free reads of the runtime state, callable without the GIL.
    if unsafe { (py.is_initialized)() == 0 || (py.is_finalizing)() != 0 } {
        return;
    }
    // SAFETY: a pthread_getspecific of this thread's own state; no lock, no allocation.
    let tstate = unsafe { (py.this_thread_state)() } as usize;
    if !plausible(tstate) {
        return;
    }
    // SAFETY: tstate is this thread's live PyThreadState, whose layout `l` describes; it
    // points to the C frame of the innermost running evaluation loop (or its root one).
    let mut frame: usize = unsafe {
        match l.tstate_cframe {
            Some(off) => {
                let cframe: usize = rd(tstate + off);
                if !plausible(cframe) {
                    return;
                }
                rd(cframe + l.current_frame)
            }
            None => rd(tstate + l.current_frame),
        }
    };
    for _ in 0..MAX_WALK {
        if !plausible(frame) {
            break;
        }
        // SAFETY: frame is a frame of this thread's chain (blocked in the CUDA call, so the
        // chain is stable); the offsets are inside _PyInterpreterFrame.
        let (owner, previous): (u8, usize) =
            unsafe { (rd(frame + l.frame_owner), rd(frame + l.frame_previous)) };
        if l.owner_cstack == Some(owner) {
            out.close_run();
        } else {
            // SAFETY: as above.
            if let Some(v) = unsafe { frame_value(py, st, frame) }
                && !out.push(v)
            {
                break;
            }
            if let Some(off) = l.frame_is_entry {
                // SAFETY: as above; is_entry is a bool in the frame.
                let entry: u8 = unsafe { rd(frame + off) };
                if entry != 0 {
                    out.close_run();
                }
            }
        }
        frame = previous;
    }
    if out.open > 0 {
        out.close_run();
    }
}

/// The frame value of a Python frame, or `None` for a frame that is not running Python code
/// (not a code object, an incomplete frame, an instruction outside the code).
///
/// # Safety
/// `frame` must point to a live `_PyInterpreterFrame` of this thread.
unsafe fn frame_value(py: &Python, st: &State, frame: usize) -> Option<u64> {
    let l = &py.layout;
    // SAFETY: f_code/f_executable and the instruction pointer are fields of the frame.
    let (code, instr): (usize, usize) =
        unsafe { (rd(frame + l.frame_code), rd(frame + l.frame_instr)) };
    // SAFETY: a plausible pointer held by the frame as a strong reference: a live object,
    // whose header can be read.
    if !plausible(code) || unsafe { rd::<usize>(code + l.ob_type) } != py.code_type {
        return None;
    }
    // SAFETY: code is a live code object; the offsets are inside PyCodeObject.
    let units: isize = unsafe { rd(code + l.code_units) };
    if !(1..MAX_CODE_UNITS).contains(&units) {
        return None;
    }
    let start = code + l.code_adaptive;
    if instr < start {
        return None;
    }
    let lasti = (instr - start) / 2;
    if lasti >= units as usize {
        return None;
    }
    if let Some(off) = l.code_firsttraceable {
        // SAFETY: an int field of the code object.
        let first: i32 = unsafe { rd(code + off) };
        if (lasti as i64) < i64::from(first) {
            return None;
        }
    }
    // SAFETY: fields of the live code object (immutable after creation).
    let (filename, qualname, linetable, first_line): (usize, usize, usize, i32) = unsafe {
        (
            rd(code + l.code_filename),
            rd(code + l.code_qualname),
            rd(code + l.code_linetable),
            rd(code + l.code_firstlineno),
        )
    };
    let slot = code_slot(py, st, code, filename, qualname, linetable, first_line);
    let lasti = lasti as u32;
    let line = match cached_line(slot, lasti) {
        Some(line) => line,
        None => {
            // SAFETY: linetable is the code object's (checked to be bytes inside).
            let line = unsafe { line_at(py, linetable, first_line, lasti) }.unwrap_or(0);
            cache_line(slot, lasti, line);
            line
        }
    };
    Some(python_frame::encode(slot, line))
}

const LINE_CACHE_SLOTS: usize = 1 << 14;
/// (code slot, instruction) -> line, direct-mapped: `VALID | slot << 47 | lasti << 23 | line`.
/// A code slot names one code object for the process's life (fork children included), so an
/// entry never goes stale; a line table is decoded once per instruction that allocates, not
/// once per allocation.
static LINE_CACHE: [AtomicU64; LINE_CACHE_SLOTS] = [const { AtomicU64::new(0) }; LINE_CACHE_SLOTS];
const LINE_VALID: u64 = 1 << 63;
const LINE_BITS: u32 = 23;
const LASTI_BITS: u32 = 24;

fn line_cache_index(slot: u32, lasti: u32) -> usize {
    let h = (u64::from(slot) << 32 | u64::from(lasti)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 40) as usize & (LINE_CACHE_SLOTS - 1)
}

/// The entry for (slot, lasti), if it can be cached at all.
fn line_cache_entry(slot: u32, lasti: u32, line: u32) -> Option<u64> {
    (slot < CODE_SLOTS as u32 && lasti < 1 << LASTI_BITS && line < 1 << LINE_BITS).then(|| {
        LINE_VALID
            | u64::from(slot) << (LASTI_BITS + LINE_BITS)
            | u64::from(lasti) << LINE_BITS
            | u64::from(line)
    })
}

fn cached_line(slot: u32, lasti: u32) -> Option<u32> {
    let key = line_cache_entry(slot, lasti, 0)?;
    let e = LINE_CACHE[line_cache_index(slot, lasti)].load(Ordering::Relaxed);
    (e & !((1 << LINE_BITS) - 1) == key).then_some((e & ((1 << LINE_BITS) - 1)) as u32)
}

fn cache_line(slot: u32, lasti: u32, line: u32) {
    if let Some(e) = line_cache_entry(slot, lasti, line) {
        LINE_CACHE[line_cache_index(slot, lasti)].store(e, Ordering::Relaxed);
    }
}

/// Line of instruction `lasti` from the bytes object `linetable`.
///
/// # Safety
/// `linetable` must be a field of a live code object.
unsafe fn line_at(py: &Python, linetable: usize, first_line: i32, lasti: u32) -> Option<u32> {
    let l = &py.layout;
    // SAFETY: a plausible pointer held by the code object: a live object with a header.
    if !plausible(linetable) || unsafe { rd::<usize>(linetable + l.ob_type) } != py.bytes_type {
        return None;
    }
    // SAFETY: a bytes object: ob_size, then ob_size bytes from ob_sval.
    let len: isize = unsafe { rd(linetable + l.bytes_size) };
    if !(0..MAX_LINETABLE_BYTES).contains(&len) {
        return None;
    }
    // SAFETY: the bytes object holds `len` bytes at ob_sval, immutable while it lives.
    let table = unsafe {
        core::slice::from_raw_parts((linetable + l.bytes_sval) as *const u8, len as usize)
    };
    line_of_instruction(table, first_line, lasti)
}

const CODE_SLOTS: usize = 1 << 16;
/// Probes before a code object is given up on (its frames become unknown functions).
const CODE_PROBES: usize = 64;
/// Code-object keys (0 = free). A slot, once taken, keeps its key for the process's life.
static CODE_KEYS: [AtomicU64; CODE_SLOTS] = [const { AtomicU64::new(0) }; CODE_SLOTS];
/// Process generation ([`state::generation`]) in which the slot's PY_CODE event was written.
static CODE_SENT: [AtomicU32; CODE_SLOTS] = [const { AtomicU32::new(0) }; CODE_SLOTS];

/// A 64-bit key for a code object: its address plus what tells a reused address apart.
fn code_key(code: usize, filename: usize, qualname: usize, linetable: usize, line: i32) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64;
    for v in [
        code as u64,
        filename as u64,
        qualname as u64,
        linetable as u64,
        line as u32 as u64,
    ] {
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    }
    h.max(1)
}

/// The slot of a code object, writing its PY_CODE event the first time this process meets it.
fn code_slot(
    py: &Python,
    st: &State,
    code: usize,
    filename: usize,
    qualname: usize,
    linetable: usize,
    first_line: i32,
) -> u32 {
    let key = code_key(code, filename, qualname, linetable, first_line);
    let mut i = (key >> 16) as usize & (CODE_SLOTS - 1);
    for _ in 0..CODE_PROBES {
        let k = CODE_KEYS[i].load(Ordering::Acquire);
        let mine = k == key
            || (k == 0
                && match CODE_KEYS[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => true,
                    Err(other) => other == key,
                });
        if mine {
            let generation = state::generation();
            // Two threads meeting a new code object at once may both send it: harmless, the
            // definitions are the same. One the ring dropped is sent again next time.
            if CODE_SENT[i].load(Ordering::Acquire) != generation
                && send_code(py, st, i as u32, filename, qualname, first_line)
            {
                CODE_SENT[i].store(generation, Ordering::Release);
            }
            return i as u32;
        }
        i = (i + 1) & (CODE_SLOTS - 1);
    }
    python_frame::UNKNOWN_CODE
}

/// The frame value of `line` in the function named by text (`function`, `file`), as a
/// framework's own record of a stack gives it (not a live code object): its code slot is keyed
/// by the text, and its PY_CODE event is written the first time this process meets it.
pub fn text_frame(st: &State, function: &[u8], file: &[u8], line: u32) -> u64 {
    let mut h = 0x1319_8A2E_0370_7344u64;
    for &b in function.iter().chain([0xFFu8].iter()).chain(file) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h ^= h >> 31;
    let key = h.max(1);
    let mut i = (key >> 16) as usize & (CODE_SLOTS - 1);
    for _ in 0..CODE_PROBES {
        let k = CODE_KEYS[i].load(Ordering::Acquire);
        let mine = k == key
            || (k == 0
                && match CODE_KEYS[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => true,
                    Err(other) => other == key,
                });
        if mine {
            let generation = state::generation();
            if CODE_SENT[i].load(Ordering::Acquire) != generation {
                let function = &function[..function.len().min(MAX_FUNCTION_BYTES)];
                let mut buf = [0u8; MAX_TEXT_BYTES];
                let n = file.len().min(MAX_TEXT_BYTES);
                // Keep the end of a long path (the part that names the file).
                buf[..n].copy_from_slice(&file[file.len() - n..]);
                let room = MAX_TEXT_BYTES - function.len();
                let file = fit_tail(&mut buf, n, room);
                let sent = st.emit(|e| {
                    e.kind = kind::PY_CODE;
                    e.addr = i as u64;
                    e.stream = 0;
                    e.set_py_code(function, file);
                });
                if sent {
                    CODE_SENT[i].store(generation, Ordering::Release);
                }
            }
            return python_frame::encode(i as u32, line);
        }
        i = (i + 1) & (CODE_SLOTS - 1);
    }
    python_frame::encode(python_frame::UNKNOWN_CODE, line)
}

/// Writes the PY_CODE event of a code slot; whether it reached the ring.
fn send_code(
    py: &Python,
    st: &State,
    slot: u32,
    filename: usize,
    qualname: usize,
    line: i32,
) -> bool {
    let mut function = [0u8; MAX_FUNCTION_BYTES];
    // SAFETY: the names are fields of a live code object.
    let fl = unsafe { read_str(py, qualname, &mut function) };
    let mut file = [0u8; MAX_TEXT_BYTES];
    // SAFETY: as above.
    let nl = unsafe { read_str(py, filename, &mut file) };
    let room = MAX_TEXT_BYTES - fl;
    let file = fit_tail(&mut file, nl, room);
    st.emit(|e| {
        e.kind = kind::PY_CODE;
        e.addr = u64::from(slot);
        e.stream = line.max(0) as u64;
        e.set_py_code(&function[..fl], file);
    })
}

/// The last bytes of `buf[..len]` that fit in `room`, after "..." when cut (on a character
/// boundary): the end of a long path is the part that names the file.
fn fit_tail(buf: &mut [u8], len: usize, room: usize) -> &[u8] {
    if len <= room {
        return &buf[..len];
    }
    if room < 4 {
        return &buf[..0];
    }
    let mut start = len - (room - 3);
    while start < len && buf[start] & 0xC0 == 0x80 {
        start += 1;
    }
    buf[start - 3..start].copy_from_slice(b"...");
    &buf[start - 3..len]
}

/// Copies the text of a `str` object as UTF-8 into `out` (whole characters, truncated to
/// fit). Returns the bytes written; 0 for anything but a compact `str`.
///
/// # Safety
/// `obj` must be null or point to a live object.
unsafe fn read_str(py: &Python, obj: usize, out: &mut [u8]) -> usize {
    let l = &py.layout;
    // SAFETY: a live object's header.
    if !plausible(obj) || unsafe { rd::<usize>(obj + l.ob_type) } != py.unicode_type {
        return 0;
    }
    // SAFETY: a str: its length and state are fields of PyASCIIObject.
    let (len, state): (isize, u32) = unsafe { (rd(obj + l.str_length), rd(obj + l.str_state)) };
    if state & STATE_COMPACT == 0 || !(0..1 << 20).contains(&len) {
        return 0;
    }
    let ascii = state & STATE_ASCII != 0;
    let width = (state >> STATE_KIND_SHIFT) & 7;
    if !matches!(width, 1 | 2 | 4) {
        return 0;
    }
    let data = obj
        + if ascii {
            l.str_ascii_size
        } else {
            l.str_compact_size
        };
    let mut n = 0;
    for i in 0..len as usize {
        // SAFETY: a compact str holds `len` characters of `width` bytes right after its header.
        let c: u32 = unsafe {
            match width {
                1 => u32::from(rd::<u8>(data + i)),
                2 => u32::from(rd::<u16>(data + 2 * i)),
                _ => rd::<u32>(data + 4 * i),
            }
        };
        let c = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
        if n + c.len_utf8() > out.len() {
            break;
        }
        n += c.encode_utf8(&mut out[n..]).len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The location-table entry for `units` code units on a line `delta` from the previous.
    fn entry(units: u8, delta: i64) -> Vec<u8> {
        let mut v = vec![0x80 | (13 << 3) | (units - 1)];
        let mut u = if delta < 0 {
            ((-delta as u64) << 1) | 1
        } else {
            (delta as u64) << 1
        };
        loop {
            let chunk = (u & 63) as u8;
            u >>= 6;
            if u == 0 {
                v.push(chunk);
                break;
            }
            v.push(chunk | 64);
        }
        v
    }

    #[test]
    fn line_table_forms_are_decoded() {
        let mut t = Vec::new();
        t.extend(entry(2, 1)); // units 0-1: line 11
        t.extend([0x80 | (3 << 3), 0x12]); // short form, unit 2: line 11
        t.extend([0x80 | (12 << 3) | 1, 4, 9]); // one-line form +2, units 3-4: line 13
        t.push(0x80 | (15 << 3)); // no location, unit 5
        t.extend(entry(1, -3)); // unit 6: line 10
        t.extend([0x80 | (14 << 3), 200 & 63 | 64, 200 >> 6, 1, 2, 3]); // long form +100, unit 7: line 110
        t.extend(entry(8, 1000)); // units 8-15: line 1110
        let lines: Vec<Option<u32>> = (0..17).map(|i| line_of_instruction(&t, 10, i)).collect();
        let want = [
            Some(11),
            Some(11),
            Some(11),
            Some(13),
            Some(13),
            None,
            Some(10),
            Some(110),
            Some(1110),
            Some(1110),
            Some(1110),
            Some(1110),
            Some(1110),
            Some(1110),
            Some(1110),
            Some(1110),
            None,
        ];
        assert_eq!(lines, want);
    }

    #[test]
    fn damaged_line_tables_end_without_panicking() {
        for t in [
            &[][..],
            &[0x7f, 0x00],
            &[0x80 | (13 << 3)],
            &[0x80 | (14 << 3), 0x7f, 0x7f, 0x7f],
            &[0xff; 64],
        ] {
            for i in 0..80 {
                let _ = line_of_instruction(t, i32::MAX, i);
            }
        }
    }

    /// Real tables: every function of a module compiled by the system python3 (3.11+), against
    /// what `co_lines()` says.
    #[test]
    fn line_tables_of_the_system_python_are_decoded_like_co_lines() {
        let script = r#"
import sys, types
if sys.version_info < (3, 11):
    print("skip"); sys.exit(0)
src = open(sys.argv[1]).read()
todo = [compile(src, sys.argv[1], "exec")]
while todo:
    c = todo.pop()
    todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    print("code", c.co_firstlineno, c.co_linetable.hex())
    for start, end, line in c.co_lines():
        print("range", start // 2, end // 2, -1 if line is None else line)
"#;
        let sample = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/gpu_trace_check.py"
        );
        let out = std::process::Command::new("python3")
            .args(["-c", script, sample])
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8");
        if text.trim() == "skip" {
            return;
        }
        let (mut table, mut first, mut checked) = (Vec::new(), 0, 0);
        for l in text.lines() {
            let w: Vec<&str> = l.split(' ').collect();
            match w[0] {
                "code" => {
                    first = w[1].parse().expect("first line");
                    table = (0..w.get(2).map_or(0, |h| h.len()) / 2)
                        .map(|i| u8::from_str_radix(&w[2][2 * i..2 * i + 2], 16).expect("hex"))
                        .collect();
                }
                _ => {
                    let (a, b, line): (u32, u32, i64) = (
                        w[1].parse().expect("start"),
                        w[2].parse().expect("end"),
                        w[3].parse().expect("line"),
                    );
                    let want = u32::try_from(line).ok();
                    for i in a..b {
                        assert_eq!(line_of_instruction(&table, first, i), want, "{l}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000, "only {checked} instructions checked");
    }

    /// The interpreters to check layouts against: `python3` and `GPUCOLLECT_TEST_PYTHONS`.
    fn pythons() -> Vec<String> {
        let mut all = vec!["python3".to_string()];
        if let Ok(extra) = std::env::var("GPUCOLLECT_TEST_PYTHONS") {
            all.extend(extra.split(':').filter(|s| !s.is_empty()).map(String::from));
        }
        all
    }

    fn python_says(python: &str, code: &str) -> String {
        let out = std::process::Command::new(python)
            .args(["-c", code])
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string()
    }

    fn fields(l: &Layout) -> Vec<(&'static str, Option<usize>)> {
        vec![
            ("tstate_cframe", l.tstate_cframe),
            ("current_frame", Some(l.current_frame)),
            ("frame_code", Some(l.frame_code)),
            ("frame_previous", Some(l.frame_previous)),
            ("frame_instr", Some(l.frame_instr)),
            ("frame_owner", Some(l.frame_owner)),
            ("frame_is_entry", l.frame_is_entry),
            ("owner_cstack", l.owner_cstack.map(usize::from)),
            ("code_units", Some(l.code_units)),
            ("code_filename", Some(l.code_filename)),
            ("code_qualname", Some(l.code_qualname)),
            ("code_linetable", Some(l.code_linetable)),
            ("code_firstlineno", Some(l.code_firstlineno)),
            ("code_firsttraceable", l.code_firsttraceable),
            ("code_adaptive", Some(l.code_adaptive)),
            ("bytes_size", Some(l.bytes_size)),
            ("bytes_sval", Some(l.bytes_sval)),
            ("str_length", Some(l.str_length)),
            ("str_state", Some(l.str_state)),
            ("str_ascii_size", Some(l.str_ascii_size)),
            ("str_compact_size", Some(l.str_compact_size)),
            ("str_basicsize", Some(l.str_basicsize)),
            ("ob_type", Some(l.ob_type)),
            ("state_kind_mask", Some((7 << STATE_KIND_SHIFT) as usize)),
            ("state_compact", Some(STATE_COMPACT as usize)),
            ("state_ascii", Some(STATE_ASCII as usize)),
        ]
    }

    /// Every layout equals the offsets `tests/python_offsets.c` prints when compiled against the
    /// interpreter's own headers; for 3.13, the layout read from the running interpreter's
    /// `_Py_DebugOffsets`. Interpreters without internal headers are skipped (and say so).
    #[test]
    fn layouts_match_the_installed_headers() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_offsets.c");
        for python in pythons() {
            let include = python_says(
                &python,
                "import sysconfig; print(sysconfig.get_paths()['include'])",
            );
            let minor: u32 = python_says(&python, "import sys; print(sys.version_info[1])")
                .parse()
                .expect("minor version");
            let internal = std::path::Path::new(&include).join("internal/pycore_frame.h");
            if !internal.exists() || !(11..=13).contains(&minor) {
                eprintln!("{python}: 3.{minor}, no internal headers or unsupported: skipped");
                continue;
            }
            let exe = std::env::temp_dir().join(format!(
                "gpucollect-python-offsets-{}-3{minor}",
                std::process::id()
            ));
            let st = std::process::Command::new("gcc")
                .args(["-I", &include, "-I", &format!("{include}/internal"), "-o"])
                .arg(&exe)
                .arg(src)
                .status()
                .expect("gcc runs");
            assert!(st.success(), "compiling {src} for {python}");
            let out = std::process::Command::new(&exe)
                .output()
                .expect("offsets run");
            let _ = std::fs::remove_file(&exe);
            let text = String::from_utf8(out.stdout).expect("utf-8");
            let header: Vec<(&str, usize)> = text
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once(' ').expect("name value");
                    (k, v.parse().expect("number"))
                })
                .collect();
            let layout = match minor {
                11 => LAYOUT_311,
                12 => LAYOUT_312,
                _ => {
                    let words = python_says(
                        &python,
                        "import ctypes; print(*(ctypes.c_uint64 * 71).in_dll(ctypes.pythonapi, '_PyRuntime'))",
                    );
                    let mut debug = [0u64; DEBUG_OFFSETS_WORDS];
                    for (d, w) in debug.iter_mut().zip(words.split(' ')) {
                        *d = w.parse().expect("offset");
                    }
                    layout_313(&debug).expect("3.13 debug offsets")
                }
            };
            assert_eq!(layout.minor, minor);
            for (name, value) in fields(&layout) {
                let from_header = header.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
                assert_eq!(value, from_header, "{python} (3.{minor}): {name}");
            }
        }
    }

    fn stack(frames: &[u64], runs: &[u8]) -> PyStack {
        let mut s = PyStack::new();
        s.frames[..frames.len()].copy_from_slice(frames);
        s.n = frames.len();
        s.runs[..runs.len()].copy_from_slice(runs);
        s.nruns = runs.len();
        s
    }

    const EVAL: u64 = 0xE0;
    const INTERP: u64 = 0xA0;

    fn merged(native: &[u64], py: &PyStack) -> Vec<u64> {
        let mut out = [0u64; MAX_FRAMES];
        let n = merge(
            native,
            py,
            |ip| ip == EVAL,
            |ip| ip == EVAL || ip == INTERP,
            &mut out,
        );
        out[..n].to_vec()
    }

    #[test]
    fn each_evaluation_loop_frame_becomes_the_python_frames_it_ran() {
        let py = stack(&[101, 102, 201, 301], &[2, 1, 1]);
        // cuMemAlloc <- ctypes <- [interpreter] eval(101, 102) <- [interpreter] eval(201)
        // <- an extension calling back <- eval(301) <- [interpreter main] <- libc start
        let native = [1, 2, INTERP, EVAL, INTERP, EVAL, 3, EVAL, INTERP, 4];
        assert_eq!(merged(&native, &py), [1, 2, 101, 102, 201, 3, 301, 4]);
    }

    #[test]
    fn runs_beyond_the_native_walk_follow_it() {
        let py = stack(&[101, 201, 202], &[1, 2]);
        assert_eq!(merged(&[1, EVAL, 2], &py), [1, 101, 2, 201, 202]);
        // The native walk stopped before the interpreter.
        assert_eq!(merged(&[1, 2], &py), [1, 2, 101, 201, 202]);
    }

    #[test]
    fn without_evaluation_loop_frames_python_replaces_the_interpreter() {
        let py = stack(&[101, 102], &[2]);
        assert_eq!(merged(&[1, 2, INTERP, 3, 4], &py), [1, 2, 101, 102]);
    }

    #[test]
    fn empty_runs_keep_later_runs_in_place() {
        let py = stack(&[201], &[0, 1]);
        assert_eq!(merged(&[1, EVAL, 2, EVAL, 3], &py), [1, 2, 201, 3]);
    }

    #[test]
    fn merged_stacks_are_cut_at_the_event_capacity() {
        let py = stack(&[7; MAX_PY_FRAMES], &[MAX_PY_FRAMES as u8]);
        let native = [1u64; MAX_FRAMES];
        assert_eq!(merged(&native, &py).len(), MAX_FRAMES);
    }

    #[test]
    fn long_file_names_keep_their_end() {
        let mut buf = *b"/a/very/long/path/to/model.py";
        assert_eq!(
            fit_tail(&mut buf.clone(), 29, 40),
            b"/a/very/long/path/to/model.py"
        );
        assert_eq!(fit_tail(&mut buf, 29, 14), b"...to/model.py");
    }

    #[test]
    fn cached_lines_come_back_only_for_their_instruction() {
        assert_eq!(cached_line(7, 100), None);
        cache_line(7, 100, 42);
        assert_eq!(cached_line(7, 100), Some(42));
        assert_eq!(cached_line(7, 101), None);
        assert_eq!(cached_line(8, 100), None);
        cache_line(7, 100, 0);
        assert_eq!(cached_line(7, 100), Some(0), "no line is an answer too");
        cache_line(7, 1 << 24, 5);
        assert_eq!(cached_line(7, 1 << 24), None, "too large to cache");
        cache_line(python_frame::UNKNOWN_CODE, 1, 5);
        assert_eq!(cached_line(python_frame::UNKNOWN_CODE, 1), None);
    }

    #[test]
    fn code_keys_tell_a_reused_address_apart() {
        let a = code_key(0x1000, 1, 2, 3, 10);
        assert_ne!(a, code_key(0x1000, 1, 2, 4, 10));
        assert_ne!(a, code_key(0x1000, 1, 2, 3, 11));
        assert_eq!(a, code_key(0x1000, 1, 2, 3, 10));
        assert_ne!(code_key(0, 0, 0, 0, 0), 0);
    }
}
