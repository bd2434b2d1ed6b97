//! The fixed-size event a callback writes into the ring, and its kinds.
//!
//! Plain `repr(C)` data: the same layout is read by the collector from shared memory.

/// `AllocKind` codes (the trace format's values).
pub mod alloc_kind {
    pub const DEVICE: u32 = 0;
    pub const MANAGED: u32 = 1;
    pub const PINNED_HOST: u32 = 2;
    pub const STREAM_ORDERED_POOL: u32 = 3;
    pub const VMM_PHYSICAL: u32 = 4;
    pub const ARRAY: u32 = 5;
    pub const IPC_IMPORT: u32 = 6;
    /// A block a framework's caching allocator handed out (a tensor), inside its reserve.
    pub const FRAMEWORK_BLOCK: u32 = 7;
    /// A block of PyTorch's caching allocator (written as [`FRAMEWORK_BLOCK`]): its size is the
    /// request rounded up to 512 bytes, which the collector completes to the whole block where
    /// the allocator left a large block unsplit (at most 1 MiB would have remained), from the
    /// segment and the blocks around it. Never in a trace.
    pub const TORCH_BLOCK: u32 = 0x107;
}

/// `notice` codes (the trace format's values, `analysis_core::format::notice_code`).
pub mod notice_code {
    pub const CUPTI_BUSY: u32 = 1;
    pub const CUPTI_MISSING: u32 = 2;
    pub const CAPTURE_FAILED: u32 = 3;
    /// A framework's allocation history lost entries before gpucollect read them (the process
    /// was traced; some of its tensor events are missing).
    pub const FRAMEWORK_EVENTS_LOST: u32 = 4;
}

/// `FreeKind` codes (the trace format's values).
pub mod free_kind {
    pub const IMMEDIATE: u32 = 0;
    pub const STREAM_ORDERED: u32 = 1;
}

/// Most native frames one event carries.
pub const MAX_FRAMES: usize = 64;
/// Bytes of inline text an event carries (names, paths) in its `data` area.
pub const MAX_TEXT_BYTES: usize = MAX_FRAMES * 8;

/// Python frames in an event's frame list. A native frame is a user-space return address
/// (below 2^47 on x86-64), so bit 63 tells the two apart: a Python frame is
/// `TAG | code slot << 32 | line`, where the code slot names a code object described once by a
/// [`kind::PY_CODE`] event of the same process.
pub mod python_frame {
    pub const TAG: u64 = 1 << 63;
    /// Code slot of a Python frame whose code object could not be given a slot (table full).
    pub const UNKNOWN_CODE: u32 = 0x7FFF_FFFF;

    /// The frame value of line `line` (0 = unknown) of the code object in `code_slot`.
    pub const fn encode(code_slot: u32, line: u32) -> u64 {
        TAG | (((code_slot & UNKNOWN_CODE) as u64) << 32) | line as u64
    }

    /// (code slot, line) of a Python frame value; `None` for a native return address.
    pub const fn decode(frame: u64) -> Option<(u32, u32)> {
        if frame & TAG == 0 {
            return None;
        }
        Some((((frame >> 32) as u32) & UNKNOWN_CODE, frame as u32))
    }
}

/// What an [`Event`] means. Field use per kind is documented on each constant.
pub mod kind {
    /// A thread's first event: `size` = name length, name bytes in `data`.
    pub const THREAD: u32 = 1;
    /// A loaded module: path bytes in `data` (length `size`), `stream` = load bias,
    /// `pool` = end of the highest segment relative to the bias, `addr` = build-id length,
    /// build id in the last 32 bytes of `data`.
    pub const MODULE: u32 = 2;
    /// Allocation returned to the program: `code` = AllocKind code, `device`, `addr`, `size`,
    /// `stream`, `pool`, frames.
    pub const ALLOC: u32 = 3;
    /// Release, recorded at API entry: `code` = FreeKind code, `addr`, `stream`, `device`.
    pub const FREE: u32 = 4;
    /// Failed allocation: `code` = CUresult, `pool` = AllocKind code, `size`, `device`, frames.
    pub const ALLOC_FAILED: u32 = 5;
    /// Context teardown (cuCtxDestroy, cuDevicePrimaryCtxReset): `device`.
    pub const CONTEXT_RESET: u32 = 6;
    /// cuMemCreate: `addr` = handle, `size`, `device`, `code` = AllocKind code, frames.
    pub const VMM_CREATE: u32 = 7;
    /// cuMemRelease: `addr` = handle.
    pub const VMM_RELEASE: u32 = 8;
    /// cuMemMap: `addr` = virtual address, `size`, `pool` = handle.
    pub const VMM_MAP: u32 = 9;
    /// cuMemUnmap: `addr` = virtual address, `size`.
    pub const VMM_UNMAP: u32 = 10;
    /// NVTX push: name in `data` (length `size`), `stream` = domain handle (0 = default),
    /// domain name in the last 32 bytes of `data` (length `code`).
    pub const RANGE_PUSH: u32 = 11;
    /// NVTX pop: `stream` = domain handle.
    pub const RANGE_POP: u32 = 12;
    /// NVTX start/end range: `addr` = range id, name in `data` (length `size`).
    pub const RANGE_START: u32 = 13;
    /// NVTX end: `addr` = range id.
    pub const RANGE_END: u32 = 14;
    /// NVTX mark: name in `data` (length `size`).
    pub const MARK: u32 = 15;
    /// The process's command line, NUL-separated, in `data` (length `size`, truncated).
    pub const CMDLINE: u32 = 16;
    /// The process's executable path in `data` (length `size`).
    pub const EXE: u32 = 17;
    /// The capture could not start: `code` = a `notice_code`, the reason in `data` (length `size`).
    pub const NOTICE: u32 = 18;
    /// The process is exiting through `exit()` (not `_exit`, not a signal): `code` = the status.
    pub const EXIT: u32 = 19;
    /// A Python code object met for the first time in this process (or since it forked):
    /// `addr` = its code slot (the one [`super::python_frame`] values name), `stream` = its
    /// first line, `size` = length of the function name, `pool` = length of the file name; the
    /// function name then the file name in `data` ([`super::Event::set_py_code`]).
    pub const PY_CODE: u32 = 20;
    /// A pool's memory, polled outside the callbacks: `device`, `addr` = pool handle (0: the
    /// device's default pool, `u64::MAX`: its graph memory), `size` = reserved bytes, `stream` =
    /// used bytes. Written without a thread (`tid` 0).
    pub const POOL_SAMPLE: u32 = 21;
    /// A framework block (an ALLOC of code [`super::alloc_kind::FRAMEWORK_BLOCK`]) went back to
    /// the framework's cache: `device`, `addr`, `stream`, `pool`. Framework blocks have
    /// addresses of their own, apart from driver allocations (the first block of a segment has
    /// the segment's address).
    pub const FRAMEWORK_FREE: u32 = 22;

    /// Kinds whose `data` holds text (copied out whole).
    pub const TEXT: &[u32] = &[
        THREAD,
        MODULE,
        RANGE_PUSH,
        RANGE_START,
        MARK,
        CMDLINE,
        EXE,
        NOTICE,
        PY_CODE,
    ];

    pub const fn carries_text(k: u32) -> bool {
        let mut i = 0;
        while i < TEXT.len() {
            if TEXT[i] == k {
                return true;
            }
            i += 1;
        }
        false
    }
}

/// One event. 64 bytes of header plus `data`; only the used part of `data` is copied out.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub kind: u32,
    /// Number of frames in `data` (events with frames only).
    pub nframes: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_nanos: u64,
    /// OS thread id.
    pub tid: u64,
    pub device: u32,
    pub code: u32,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: u64,
    /// Return addresses, innermost first, or inline text.
    pub data: [u64; MAX_FRAMES],
}
// The layout both sides read and write: a 64-byte header, then `data`.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Event>() == 64 + 8 * MAX_FRAMES);
    assert!(offset_of!(Event, kind) == 0 && offset_of!(Event, nframes) == 4);
    assert!(offset_of!(Event, ts_nanos) == 8 && offset_of!(Event, tid) == 16);
    assert!(offset_of!(Event, device) == 24 && offset_of!(Event, code) == 28);
    assert!(offset_of!(Event, addr) == 32 && offset_of!(Event, size) == 40);
    assert!(offset_of!(Event, stream) == 48 && offset_of!(Event, pool) == 56);
    assert!(offset_of!(Event, data) == 64);
};

impl Event {
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            nframes: 0,
            ts_nanos: 0,
            tid: 0,
            device: 0,
            code: 0,
            addr: 0,
            size: 0,
            stream: 0,
            pool: 0,
            data: [0; MAX_FRAMES],
        }
    }

    /// Clears every header field (not `data`) and sets time and thread.
    #[inline]
    pub fn reset_header(&mut self, ts_nanos: u64, tid: u64) {
        self.kind = 0;
        self.nframes = 0;
        self.ts_nanos = ts_nanos;
        self.tid = tid;
        self.device = 0;
        self.code = 0;
        self.addr = 0;
        self.size = 0;
        self.stream = 0;
        self.pool = 0;
    }

    /// The frames this event carries.
    pub fn frames(&self) -> &[u64] {
        &self.data[..(self.nframes as usize).min(MAX_FRAMES)]
    }

    /// The inline text (`size` bytes of `data`), lossily decoded.
    pub fn text(&self) -> String {
        let n = (self.size as usize).min(MAX_TEXT_BYTES);
        String::from_utf8_lossy(&self.text_bytes()[..n]).into_owned()
    }

    fn text_bytes(&self) -> [u8; MAX_TEXT_BYTES] {
        let mut out = [0u8; MAX_TEXT_BYTES];
        for (i, w) in self.data.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_ne_bytes());
        }
        out
    }

    /// Sets the NVTX domain name of a range/mark event (in the last 32 bytes of `data`,
    /// length in `code`).
    pub fn set_domain_name(&mut self, name: &[u8]) {
        let n = name.len().min(32);
        self.code = self.put_bytes(MAX_TEXT_BYTES - 32, &name[..n]) as u32;
    }

    /// The NVTX domain name of a range/mark event ("" for the default domain).
    pub fn domain_name(&self) -> String {
        let n = (self.code as usize).min(32);
        String::from_utf8_lossy(&self.text_bytes()[MAX_TEXT_BYTES - 32..MAX_TEXT_BYTES - 32 + n])
            .into_owned()
    }

    /// Build id of a MODULE event.
    pub fn build_id(&self) -> Vec<u8> {
        let n = (self.addr as usize).min(32);
        self.text_bytes()[MAX_TEXT_BYTES - 32..MAX_TEXT_BYTES - 32 + n].to_vec()
    }

    /// Copies `bytes` into `data` at byte offset `at` (truncating), without allocating.
    pub fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> usize {
        let mut n = 0;
        for (i, b) in bytes.iter().enumerate() {
            let pos = at + i;
            if pos >= MAX_TEXT_BYTES {
                break;
            }
            let word = &mut self.data[pos / 8];
            let mut w = word.to_ne_bytes();
            w[pos % 8] = *b;
            *word = u64::from_ne_bytes(w);
            n += 1;
        }
        n
    }

    /// Sets the inline text (truncated to what fits before the build-id area).
    pub fn set_text(&mut self, bytes: &[u8]) {
        let limit = bytes.len().min(MAX_TEXT_BYTES - 32);
        self.size = self.put_bytes(0, &bytes[..limit]) as u64;
    }

    /// Sets the text of a [`kind::PY_CODE`] event: the function name, then the file name
    /// (each truncated to what fits).
    pub fn set_py_code(&mut self, function: &[u8], file: &[u8]) {
        let f = self.put_bytes(0, function);
        self.size = f as u64;
        self.pool = self.put_bytes(f, file) as u64;
    }

    /// (function, file) of a [`kind::PY_CODE`] event, lossily decoded.
    pub fn py_code(&self) -> (String, String) {
        let bytes = self.text_bytes();
        let f = (self.size as usize).min(MAX_TEXT_BYTES);
        let n = (self.pool as usize).min(MAX_TEXT_BYTES - f);
        (
            String::from_utf8_lossy(&bytes[..f]).into_owned(),
            String::from_utf8_lossy(&bytes[f..f + n]).into_owned(),
        )
    }

    /// Bytes of this event worth copying out of the ring.
    pub const fn used_bytes(&self) -> usize {
        let header = core::mem::size_of::<Self>() - MAX_FRAMES * 8;
        match self.kind {
            kind::ALLOC | kind::ALLOC_FAILED | kind::VMM_CREATE => {
                let n = if (self.nframes as usize) < MAX_FRAMES {
                    self.nframes as usize
                } else {
                    MAX_FRAMES
                };
                header + n * 8
            }
            k if kind::carries_text(k) => core::mem::size_of::<Self>(),
            _ => header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_bytes() {
        assert_eq!(core::mem::size_of::<Event>(), 64 + MAX_FRAMES * 8);
    }

    #[test]
    fn text_kinds_are_copied_whole() {
        let mut e = Event::zeroed();
        for &k in kind::TEXT {
            e.kind = k;
            assert_eq!(e.used_bytes(), core::mem::size_of::<Event>(), "kind {k}");
        }
        e.kind = kind::FREE;
        assert_eq!(e.used_bytes(), 64);
    }

    #[test]
    fn python_frames_are_told_apart_from_return_addresses() {
        let v = python_frame::encode(12, 345);
        assert_eq!(python_frame::decode(v), Some((12, 345)));
        assert_eq!(python_frame::decode(0x7fff_1234_5678), None);
        let unknown = python_frame::encode(python_frame::UNKNOWN_CODE, 0);
        assert_eq!(
            python_frame::decode(unknown),
            Some((python_frame::UNKNOWN_CODE, 0))
        );
    }

    #[test]
    fn py_code_text_round_trips() {
        let mut e = Event::zeroed();
        e.kind = kind::PY_CODE;
        e.set_py_code(b"Trainer.step", b"/srv/train.py");
        assert_eq!(e.py_code(), ("Trainer.step".into(), "/srv/train.py".into()));
        assert_eq!(e.used_bytes(), core::mem::size_of::<Event>());
        let long = [b'x'; 600];
        e.set_py_code(b"f", &long);
        assert_eq!(e.py_code().1.len(), MAX_TEXT_BYTES - 1);
    }

    #[test]
    fn text_round_trips_and_truncates() {
        let mut e = Event::zeroed();
        e.kind = kind::MARK;
        e.set_text(b"epoch 3");
        assert_eq!(e.text(), "epoch 3");
        let long = [b'x'; 1000];
        e.set_text(&long);
        assert_eq!(e.text().len(), MAX_TEXT_BYTES - 32);
    }
}
