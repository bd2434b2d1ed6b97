//! The push decoder: feed bytes as they arrive (`push`), pull complete records (`next_record`),
//! then call `finish` at end of input. Works on partial downloads, stdin and HTTP bodies alike.
//!
//! Guarantees on untrusted input: no panics, no recursion, and memory bounded by the bytes pushed
//! (length prefixes are checked against the bytes present before anything is allocated).
//! A malformed record that is still valid MessagePack is skipped with a warning; bytes that are
//! not MessagePack at a record boundary stop decoding with an error, keeping everything before.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::format::*;
use crate::msgpack::{Kind, ReadErr, ReadResult, Reader};

/// The records that make most of a trace, as [`Decoder::hot_records`] gives them: allocs and
/// frees, and the NVTX ranges that mark a training loop's steps and phases.
#[derive(Clone, Copy, Debug)]
pub enum Hot {
    Alloc(Alloc),
    Free(Free),
    RangeBegin(RangeBegin),
    RangeEnd(RangeEnd),
}

impl From<Hot> for Record {
    fn from(h: Hot) -> Self {
        match h {
            Hot::Alloc(a) => Record::Alloc(a),
            Hot::Free(f) => Record::Free(f),
            Hot::RangeBegin(b) => Record::RangeBegin(b),
            Hot::RangeEnd(e) => Record::RangeEnd(e),
        }
    }
}

/// A problem that stops decoding. Everything decoded before it is kept by the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "this is not a gpucollect trace: {what}; record one with `gpucollect ./app > run.msgpack`"
    )]
    NotATrace { what: String },
    #[error(
        "this trace uses format version {found_major}.{found_minor}, but this gpucollect reads \
         version {supported_major}.x: upgrade gpucollect to open it"
    )]
    NewerVersion {
        found_major: u32,
        found_minor: u32,
        supported_major: u32,
    },
    #[error(
        "the trace is corrupt at byte {offset}: expected {what}; everything before it was kept"
    )]
    Corrupt { offset: u64, what: &'static str },
    #[error("the input ended before the trace header was complete ({bytes} bytes)")]
    TruncatedHeader { bytes: u64 },
    #[error("the input is empty: no trace header")]
    Empty,
    #[error(
        "the trace is corrupt at byte {offset}: a single record is larger than {limit_bytes} \
         bytes, the most this gpucollect reads; everything before it was kept"
    )]
    RecordTooLarge { offset: u64, limit_bytes: u64 },
    #[error(
        "the trace stopped at byte {offset}: its records would take {model_bytes} bytes of \
         memory, more than {limit_bytes}, the most this gpucollect gives a trace of that size \
         (16 times its bytes plus 32 MiB); collectors write records that take a few times their \
         size, so this one is damaged or made to exhaust memory; everything before it was kept"
    )]
    TooDense {
        offset: u64,
        model_bytes: u64,
        limit_bytes: u64,
    },
}

/// The largest record (or header) the decoder reads, in bytes: a bigger one stops decoding with
/// [`DecodeError::RecordTooLarge`]. Real records are tens of bytes (a stack of a thousand frames
/// is a few KiB); the limit bounds what one record holds in the decoder's buffer.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

/// A problem that did not stop decoding.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "warning", rename_all = "snake_case")]
pub enum Warning {
    /// The last record was cut off (the trace ended mid-write).
    Truncated { offset: u64, bytes: u64 },
    /// A record had the wrong shape and was skipped.
    MalformedRecord {
        offset: u64,
        tag: u64,
        what: &'static str,
    },
    /// Records of a kind this reader does not know (written by a newer minor version).
    UnknownRecords { first_tag: u64, count: u64 },
    /// No `end` record: the traced process crashed or was killed, or the trace was cut.
    NoEndRecord,
    /// A free referred to an allocation that does not exist or was already freed.
    BadFree { offset: u64, count: u64 },
    /// The collector dropped events (should not happen: back-pressure is the default).
    DroppedEvents { count: u64 },
    /// Timestamps went backwards past time zero.
    NegativeTime { offset: u64 },
    /// NVTX ranges opened while a process already had [`MAX_OPEN_RANGES`]
    /// open: their begin and end are kept, their peak and the allocations made inside them are
    /// not followed.
    UntrackedRanges { count: u64 },
    /// A process was not traced, or not completely (a `notice` record from the collector).
    CaptureIncomplete {
        pid: u32,
        code: u32,
        message: String,
    },
    /// More warnings of one kind than [`MAX_WARNINGS_PER_KIND`]: the first ones are kept, the
    /// rest only counted here.
    MoreWarnings { kind: &'static str, count: u64 },
}

/// The most warnings of one kind a decode keeps (the rest are counted in one
/// [`Warning::MoreWarnings`]), so a hostile input of millions of malformed records costs a few
/// KiB of warnings, not hundreds of bytes per input byte.
pub const MAX_WARNINGS_PER_KIND: usize = 100;

/// NVTX ranges a process may have open at once and still have their peaks and allocations
/// followed (real programs nest a few dozen); ranges opened past it keep their begin and end
/// only ([`Warning::UntrackedRanges`]). Every range event folds the process's open ranges, so
/// this bounds its cost.
pub const MAX_OPEN_RANGES: usize = 256;

impl Warning {
    /// The kind's name, as serialized in the `warning` field.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::MalformedRecord { .. } => "malformed_record",
            Self::UnknownRecords { .. } => "unknown_records",
            Self::NoEndRecord => "no_end_record",
            Self::BadFree { .. } => "bad_free",
            Self::DroppedEvents { .. } => "dropped_events",
            Self::NegativeTime { .. } => "negative_time",
            Self::UntrackedRanges { .. } => "untracked_ranges",
            Self::CaptureIncomplete { .. } => "capture_incomplete",
            Self::MoreWarnings { .. } => "more_warnings",
        }
    }
}

/// Warnings with a cap per kind: the first [`MAX_WARNINGS_PER_KIND`] of each kind are kept, the
/// rest counted; [`WarningLog::into_vec`] ends with one [`Warning::MoreWarnings`] per kind that
/// went over.
#[derive(Clone, Debug, Default)]
pub struct WarningLog {
    kept: Vec<Warning>,
    /// (kind, warnings seen) for each kind seen, in order of first appearance.
    seen: Vec<(&'static str, u64)>,
}

impl WarningLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `w` if fewer than [`MAX_WARNINGS_PER_KIND`] of its kind were kept, else counts it.
    pub fn push(&mut self, w: Warning) {
        let kind = w.kind();
        let n = match self.seen.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => n,
            None => {
                self.seen.push((kind, 0));
                match self.seen.last_mut() {
                    Some((_, n)) => n,
                    None => return,
                }
            }
        };
        *n += 1;
        if *n <= MAX_WARNINGS_PER_KIND as u64 {
            self.kept.push(w);
        }
    }

    /// The warnings kept so far (without the summaries).
    pub fn kept(&self) -> &[Warning] {
        &self.kept
    }

    /// Warnings pushed so far, kept or only counted.
    pub fn total(&self) -> u64 {
        self.seen.iter().map(|(_, n)| n).sum()
    }

    /// The kept warnings, then one summary per kind that went over the cap.
    pub fn into_vec(self) -> Vec<Warning> {
        let mut v = self.kept;
        for (kind, n) in self.seen {
            if n > MAX_WARNINGS_PER_KIND as u64 {
                v.push(Warning::MoreWarnings {
                    kind,
                    count: n - MAX_WARNINGS_PER_KIND as u64,
                });
            }
        }
        v
    }
}

impl Extend<Warning> for WarningLog {
    fn extend<I: IntoIterator<Item = Warning>>(&mut self, iter: I) {
        for w in iter {
            self.push(w);
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { offset, bytes } => write!(
                f,
                "the trace is truncated: the last record at byte {offset} is incomplete \
                 ({bytes} bytes dropped); everything before it was kept"
            ),
            Self::MalformedRecord { offset, tag, what } => write!(
                f,
                "skipped a malformed record (tag {tag}) at byte {offset}: expected {what}"
            ),
            Self::UnknownRecords { first_tag, count } => write!(
                f,
                "skipped {count} record(s) of unknown kind (first tag {first_tag}), written by a \
                 newer gpucollect; upgrade to see them"
            ),
            Self::NoEndRecord => write!(
                f,
                "the trace has no end record: the traced process crashed or was killed, or the \
                 trace was cut short"
            ),
            Self::BadFree { offset, count } => write!(
                f,
                "{count} free(s) referred to unknown or already-freed allocations (first at byte \
                 {offset}); they were ignored"
            ),
            Self::DroppedEvents { count } => write!(
                f,
                "the collector dropped {count} event(s); totals may be understated"
            ),
            Self::CaptureIncomplete {
                pid,
                code: crate::format::notice_code::FRAMEWORK_HISTORY_LOST,
                message,
            } => write!(
                f,
                "process {pid} was traced, but its framework's allocation history lost entries \
                 before they were read: {message}; some framework blocks (tensors) and their \
                 frees are missing from this trace, its driver-level memory is complete"
            ),
            Self::CaptureIncomplete { pid, message, .. } => write!(
                f,
                "process {pid} was not traced: {message}; its memory is missing from this trace"
            ),
            Self::NegativeTime { offset } => write!(
                f,
                "a timestamp before the trace start at byte {offset} was clamped to 0"
            ),
            Self::UntrackedRanges { count } => write!(
                f,
                "{count} NVTX range(s) began while their process already had {} open; their \
                 begin and end are shown, but not their peak or the allocations made inside them",
                MAX_OPEN_RANGES
            ),
            Self::MoreWarnings { kind, count } => write!(
                f,
                "… and {count} more {} warning(s), not listed (the first \
                 {MAX_WARNINGS_PER_KIND} are)",
                kind.replace('_', " ")
            ),
        }
    }
}

/// A value cut off by the end of the input so far: where scanning for its end stopped, so the
/// next push goes on from there instead of parsing it again from its start (offsets are
/// absolute, as the buffer is compacted between pushes).
#[derive(Clone, Copy, Debug)]
struct Cut {
    start: u64,
    at: u64,
    pending: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct DeltaState {
    last_ts: u64,
    last_address: u64,
    next_alloc: u64,
}

/// Push decoder for format v1.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    pos: usize,
    /// Absolute stream offset of `buf[0]`.
    base: u64,
    header: Option<Header>,
    state: DeltaState,
    fatal: Option<DecodeError>,
    warnings: WarningLog,
    unknown_first_tag: u64,
    unknown_count: u64,
    records: u64,
    finished: bool,
    cut: Option<Cut>,
    examined: u64,
}

/// Reads record fields positionally; a missing trailing field reads as its default.
struct Fields<'r, 'a> {
    r: &'r mut Reader<'a>,
    left: u32,
}

impl Fields<'_, '_> {
    #[inline]
    fn uint(&mut self) -> ReadResult<u64> {
        if self.left == 0 {
            return Ok(0);
        }
        self.left -= 1;
        self.r.uint()
    }
    #[inline]
    fn u32(&mut self) -> ReadResult<u32> {
        if self.left == 0 {
            return Ok(0);
        }
        self.left -= 1;
        self.r.u32()
    }
    #[inline]
    fn int(&mut self) -> ReadResult<i128> {
        if self.left == 0 {
            return Ok(0);
        }
        self.left -= 1;
        self.r.int()
    }
    fn opt_u32(&mut self) -> ReadResult<Option<u32>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        if self.r.peek_kind()? == Kind::Nil {
            self.r.skip_values(1)?;
            return Ok(None);
        }
        self.r.u32().map(Some)
    }
    fn opt_i32(&mut self) -> ReadResult<Option<i32>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.r.opt_i32()
    }
    fn string(&mut self) -> ReadResult<String> {
        if self.left == 0 {
            return Ok(String::new());
        }
        self.left -= 1;
        self.r.string()
    }
    fn bin(&mut self) -> ReadResult<Vec<u8>> {
        if self.left == 0 {
            return Ok(Vec::new());
        }
        self.left -= 1;
        Ok(self.r.bin()?.to_vec())
    }
    fn strings(&mut self) -> ReadResult<Vec<String>> {
        if self.left == 0 {
            return Ok(Vec::new());
        }
        self.left -= 1;
        let n = self.r.array_len()?;
        // Each element takes at least one byte: never reserve more than what is present.
        let mut v = Vec::with_capacity((n as usize).min(self.r.remaining()));
        for _ in 0..n {
            v.push(self.r.string()?);
        }
        Ok(v)
    }
    fn usages(&mut self) -> ReadResult<Vec<ProcessUsage>> {
        if self.left == 0 {
            return Ok(Vec::new());
        }
        self.left -= 1;
        let n = self.r.array_len()?;
        let mut v = Vec::with_capacity((n as usize).min(self.r.remaining() / 3));
        for _ in 0..n {
            let m = self.r.array_len()?;
            let mut f = Fields { r: self.r, left: m };
            let pid = f.u32()?;
            let used_bytes = f.uint()?;
            f.finish()?;
            v.push(ProcessUsage { pid, used_bytes });
        }
        Ok(v)
    }
    /// Skips fields added by newer minor versions.
    fn finish(self) -> ReadResult<()> {
        self.r.skip_values(u64::from(self.left))
    }
}

fn apply_dt(last: u64, dt: i128) -> (u64, bool) {
    let t = i128::from(last) + dt;
    if t < 0 {
        (0, true)
    } else {
        (u64::try_from(t).unwrap_or(u64::MAX), false)
    }
}

/// Parses one record body (after the tag). Returns the record and the new delta state; the
/// caller commits the state only when the whole record parsed.
#[inline]
fn parse_body(
    tag: u64,
    f: &mut Fields<'_, '_>,
    st: &mut DeltaState,
    negative_time: &mut bool,
) -> ReadResult<Option<Record>> {
    let mut ts = |f: &mut Fields<'_, '_>| -> ReadResult<u64> {
        let dt = f.int()?;
        let (t, neg) = apply_dt(st.last_ts, dt);
        *negative_time |= neg;
        st.last_ts = t;
        Ok(t)
    };
    Ok(Some(match tag {
        tag::ALLOC => {
            let ts_nanos = ts(f)?;
            let size_bytes = f.uint()?;
            let delta = f.int()?;
            // Addresses wrap modulo 2^64 (see the encoder).
            let address = (i128::from(st.last_address) + delta) as u64;
            let a = Alloc {
                ts_nanos,
                id: AllocId(st.next_alloc),
                size_bytes,
                address,
                stack: StackId(f.u32()?),
                thread: ThreadIdx(f.u32()?),
                device: DeviceIdx(f.u32()?),
                kind: AllocKind::from_code(f.uint()?),
                stream: f.uint()?,
                pool: f.uint()?,
                process: ProcessIdx(f.u32()?),
            };
            st.last_address = address;
            st.next_alloc += 1;
            Record::Alloc(a)
        }
        tag::FREE => {
            let ts_nanos = ts(f)?;
            let back = f.int()?;
            let id = i128::from(st.next_alloc) - back;
            // Out-of-range references map to an id that can never exist; the model warns.
            let alloc = if back >= 1 && id >= 0 {
                AllocId(id as u64)
            } else {
                AllocId(u64::MAX)
            };
            Record::Free(Free {
                ts_nanos,
                alloc,
                thread: ThreadIdx(f.u32()?),
                kind: FreeKind::from_code(f.uint()?),
                stream: f.uint()?,
            })
        }
        tag::FREE_UNKNOWN => Record::FreeUnknown(FreeUnknown {
            ts_nanos: ts(f)?,
            address: f.uint()?,
            size_bytes: f.uint()?,
            thread: ThreadIdx(f.u32()?),
            device: DeviceIdx(f.u32()?),
            kind: FreeKind::from_code(f.uint()?),
            process: ProcessIdx(f.u32()?),
        }),
        tag::ALLOC_FAILED => Record::AllocFailed(AllocFailed {
            ts_nanos: ts(f)?,
            size_bytes: f.uint()?,
            error_code: f.u32()?,
            stack: StackId(f.u32()?),
            thread: ThreadIdx(f.u32()?),
            device: DeviceIdx(f.u32()?),
            kind: AllocKind::from_code(f.uint()?),
            process: ProcessIdx(f.u32()?),
        }),
        tag::RANGE_BEGIN => Record::RangeBegin(RangeBegin {
            ts_nanos: ts(f)?,
            range: RangeId(f.uint()?),
            name: StringId(f.u32()?),
            domain: StringId(f.u32()?),
            thread: ThreadIdx(f.u32()?),
            process: ProcessIdx(f.u32()?),
        }),
        tag::RANGE_END => Record::RangeEnd(RangeEnd {
            ts_nanos: ts(f)?,
            range: RangeId(f.uint()?),
        }),
        tag::MARK => Record::Mark(Mark {
            ts_nanos: ts(f)?,
            name: StringId(f.u32()?),
            domain: StringId(f.u32()?),
            thread: ThreadIdx(f.u32()?),
            process: ProcessIdx(f.u32()?),
        }),
        tag::DEVICE_SAMPLE => Record::DeviceSample(DeviceSample {
            ts_nanos: ts(f)?,
            device: DeviceIdx(f.u32()?),
            total_bytes: f.uint()?,
            free_bytes: f.uint()?,
            used_bytes: f.uint()?,
            processes: f.usages()?,
        }),
        tag::POOL_SAMPLE => Record::PoolSample(PoolSample {
            ts_nanos: ts(f)?,
            device: DeviceIdx(f.u32()?),
            pool: f.uint()?,
            reserved_bytes: f.uint()?,
            used_bytes: f.uint()?,
            process: ProcessIdx(f.u32()?),
        }),
        tag::PROCESS_EXIT => Record::ProcessExit(ProcessExit {
            ts_nanos: ts(f)?,
            process: ProcessIdx(f.u32()?),
            code: f.opt_i32()?,
            signal: f.opt_i32()?,
        }),
        tag::NOTICE => Record::Notice(Notice {
            ts_nanos: ts(f)?,
            process: ProcessIdx(f.u32()?),
            code: f.u32()?,
            message: StringId(f.u32()?),
        }),
        tag::DROPPED => Record::Dropped(Dropped {
            ts_nanos: ts(f)?,
            process: ProcessIdx(f.u32()?),
            count: f.uint()?,
        }),
        tag::CONTEXT_RESET => Record::ContextReset(ContextReset {
            ts_nanos: ts(f)?,
            process: ProcessIdx(f.u32()?),
            device: DeviceIdx(f.u32()?),
            thread: ThreadIdx(f.u32()?),
        }),
        tag::END => Record::End { ts_nanos: ts(f)? },
        tag::PROCESS => Record::Process(ProcessInfo {
            process: ProcessIdx(f.u32()?),
            pid: f.u32()?,
            parent: f.opt_u32()?.map(ProcessIdx),
            exe: f.string()?,
            argv: f.strings()?,
        }),
        tag::DEVICE => Record::Device(DeviceInfo {
            device: DeviceIdx(f.u32()?),
            uuid: f.string()?,
            name: f.string()?,
            total_bytes: f.uint()?,
        }),
        tag::MODULE => Record::Module(ModuleInfo {
            module: ModuleId(f.u32()?),
            process: ProcessIdx(f.u32()?),
            path: f.string()?,
            build_id: f.bin()?,
            load_address: f.uint()?,
            size_bytes: f.uint()?,
        }),
        tag::STRING => Record::String {
            id: StringId(f.u32()?),
            value: f.string()?,
        },
        tag::FRAME => {
            let id = FrameId(f.u32()?);
            match f.uint()? {
                0 => Record::Frame(FrameDef::Native {
                    id,
                    module: ModuleId(f.u32()?),
                    offset: f.uint()?,
                }),
                1 => Record::Frame(FrameDef::Python {
                    id,
                    function: StringId(f.u32()?),
                    file: StringId(f.u32()?),
                    line: f.u32()?,
                }),
                _ => return Ok(None),
            }
        }
        tag::FRAME_SYMBOL => Record::FrameSymbol(FrameSymbol {
            frame: FrameId(f.u32()?),
            function: StringId(f.u32()?),
            file: StringId(f.u32()?),
            line: f.u32()?,
        }),
        tag::STACK => Record::Stack(StackDef {
            stack: StackId(f.u32()?),
            parent: StackId(f.u32()?),
            frame: FrameId(f.u32()?),
        }),
        tag::THREAD => Record::Thread(ThreadInfo {
            thread: ThreadIdx(f.u32()?),
            process: ProcessIdx(f.u32()?),
            os_tid: f.uint()?,
            name: StringId(f.u32()?),
        }),
        _ => return Ok(None),
    }))
}

fn parse_header(r: &mut Reader<'_>) -> Result<Header, HeaderErr> {
    let first = r.peek_kind().map_err(HeaderErr::Read)?;
    if first != Kind::Array {
        return Err(HeaderErr::NotATrace(
            "it does not start with a MessagePack array",
        ));
    }
    let n = r.array_len().map_err(HeaderErr::Read)?;
    if n < 4 {
        return Err(HeaderErr::NotATrace(
            "its first value is not a trace header",
        ));
    }
    match r.peek_kind().map_err(HeaderErr::Read)? {
        Kind::Str => {}
        _ => return Err(HeaderErr::NotATrace("the header has no magic string")),
    }
    let magic = r.str_bytes().map_err(HeaderErr::Read)?;
    if magic != MAGIC.as_bytes() {
        return Err(HeaderErr::NotATrace("the magic string is wrong"));
    }
    let major = r.u32().map_err(HeaderErr::Read)?;
    let minor = r.u32().map_err(HeaderErr::Read)?;
    if major > FORMAT_MAJOR {
        return Err(HeaderErr::Newer(major, minor));
    }
    if major == 0 {
        return Err(HeaderErr::NotATrace("format version 0 was never released"));
    }
    let mut h = Header {
        format_major: major,
        format_minor: minor,
        ..Header::default()
    };
    let fields = r.map_len().map_err(HeaderErr::Read)?;
    for _ in 0..fields {
        let key = r.str_bytes().map_err(HeaderErr::Read)?;
        let res = match key {
            b"collector" => r.string().map(|s| h.collector = s),
            b"host" => r.string().map(|s| h.host = s),
            b"argv" => {
                let mut f = Fields { r, left: 1 };
                f.strings().map(|v| h.argv = v)
            }
            b"start_mono_nanos" => r.uint().map(|v| h.start_mono_nanos = v),
            b"wall_offset_nanos" => r.i64().map(|v| h.wall_offset_nanos = v),
            b"ends_at" => r.string().map(|s| h.ends_at = TraceEnd::from_name(&s)),
            _ => r.skip_values(1),
        };
        res.map_err(HeaderErr::Read)?;
    }
    r.skip_values(u64::from(n - 4)).map_err(HeaderErr::Read)?;
    Ok(h)
}

enum HeaderErr {
    Read(ReadErr),
    NotATrace(&'static str),
    Newer(u32, u32),
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends input bytes. Cheap: consumed bytes are compacted away lazily.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 && (self.pos >= self.buf.len() / 2 || self.pos == self.buf.len()) {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The header, once decoded.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Bytes fully decoded so far.
    pub fn bytes_consumed(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Records returned so far.
    pub fn records_decoded(&self) -> u64 {
        self.records
    }

    /// A measure of the work done so far, in bytes: those read by each parse of a record that
    /// is not a plain alloc or free (complete or not), and those scanned while waiting for the
    /// rest of a cut-off record. At most a small multiple of the input, however it is cut into
    /// pushes.
    pub fn bytes_examined(&self) -> u64 {
        self.examined
    }

    /// Warnings so far (more may come from `finish`).
    /// At most [`MAX_WARNINGS_PER_KIND`] of each kind; the rest are summarised by `finish`.
    pub fn warnings(&self) -> &[Warning] {
        self.warnings.kept()
    }

    /// How many warnings there were so far, kept or only counted (after `finish`, all of
    /// them): what judging an input's damage must count, not [`Decoder::warnings`]`.len()`.
    pub fn warning_count(&self) -> u64 {
        self.warnings.total()
    }

    /// The error that stopped decoding, if any.
    pub fn fatal(&self) -> Option<&DecodeError> {
        self.fatal.as_ref()
    }

    /// Whether the value at `buf[start]` is all in the buffer (or is not valid MessagePack, for
    /// the parser to report), found in one pass over its bytes however many pushes it takes;
    /// an error once it is over [`MAX_RECORD_BYTES`].
    fn value_complete(&mut self, start: usize) -> Result<bool, DecodeError> {
        let start_abs = self.base + start as u64;
        let mut cut = match self.cut {
            Some(c) if c.start == start_abs => c,
            _ => Cut {
                start: start_abs,
                at: start_abs,
                pending: 1,
            },
        };
        let mut r = Reader::new(&self.buf);
        r.pos = usize::try_from(cut.at - self.base).unwrap_or(usize::MAX);
        let scanned = r.skip_pending(&mut cut.pending);
        self.examined += self.base + r.pos as u64 - cut.at;
        cut.at = self.base + r.pos as u64;
        let size = match scanned {
            Ok(()) => r.pos - start,
            Err(ReadErr::Invalid { .. }) => {
                self.cut = None;
                return Ok(true);
            }
            Err(ReadErr::Incomplete) => self.buf.len() - start,
        };
        if size > MAX_RECORD_BYTES {
            let e = DecodeError::RecordTooLarge {
                offset: start_abs,
                limit_bytes: MAX_RECORD_BYTES as u64,
            };
            self.fatal = Some(e.clone());
            return Err(e);
        }
        let complete = scanned.is_ok();
        self.cut = if complete { None } else { Some(cut) };
        Ok(complete)
    }

    /// Whether the value at `buf[start]` was found cut off and has not been completed since.
    fn still_cut(&mut self, start: usize) -> Result<bool, DecodeError> {
        match self.cut {
            Some(c) if c.start == self.base + start as u64 => Ok(!self.value_complete(start)?),
            _ => Ok(false),
        }
    }

    fn try_header(&mut self) -> Result<bool, DecodeError> {
        if self.still_cut(self.pos)? {
            return Ok(false);
        }
        let mut r = Reader::new(&self.buf[self.pos..]);
        match parse_header(&mut r) {
            Ok(h) => {
                self.pos += r.pos;
                self.header = Some(h);
                Ok(true)
            }
            Err(HeaderErr::Read(ReadErr::Incomplete)) => {
                self.value_complete(self.pos)?;
                Ok(false)
            }
            Err(HeaderErr::Read(ReadErr::Invalid { what, .. })) => Err(DecodeError::NotATrace {
                what: alloc::format!("its header is malformed (expected {what})"),
            }),
            Err(HeaderErr::NotATrace(what)) => Err(DecodeError::NotATrace { what: what.into() }),
            Err(HeaderErr::Newer(found_major, found_minor)) => Err(DecodeError::NewerVersion {
                found_major,
                found_minor,
                supported_major: FORMAT_MAJOR,
            }),
        }
    }

    /// The well-formed allocs, frees, range begins and range ends next in the input (the
    /// straight-line path of [`Self::next_record`], which cannot warn): calls `f(record, offset,
    /// end)` for each, with its byte offset and the offset after it, until `f` returns false or
    /// the next record is not one of those (then call `next_record`). Saves a consumer that
    /// handles those first from moving a whole [`Record`] per event; the checks that do not
    /// change from one record to the next are made once.
    #[inline]
    pub fn hot_records(&mut self, mut f: impl FnMut(Hot, u64, u64) -> bool) {
        if self.fatal.is_some() || self.header.is_none() {
            return;
        }
        let base = self.base;
        let mut pos = self.pos;
        // `f` is called where each kind of record is decoded, with that kind, so the record
        // goes straight to it rather than through one `Hot` value made for all four kinds.
        while let Some((go, used)) = self.buf.get(pos..).and_then(|b| {
            let offset = base + pos as u64;
            fast::hot_record(
                b,
                &mut self.state,
                #[inline(always)]
                |rec, used| f(rec, offset, offset + used as u64),
            )
        }) {
            pos += used;
            self.records += 1;
            if !go {
                break;
            }
        }
        self.pos = pos;
    }

    /// Returns the next complete record, `Ok(None)` when more input is needed, or the error
    /// that stopped decoding (returned again on every later call).
    pub fn next_record(&mut self) -> Result<Option<Record>, DecodeError> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        if self.header.is_none() {
            match self.try_header() {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) => {
                    self.fatal = Some(e.clone());
                    return Err(e);
                }
            }
        }
        loop {
            if self.pos >= self.buf.len() {
                return Ok(None);
            }
            let start = self.pos;
            // The common, well-formed allocs, frees and ranges take a straight-line path; anything
            // unusual (negative deltas, nil fields, short input, errors) falls through to the
            // general parser, which produces the same records and the warnings.
            if let Some((rec, used)) =
                fast::hot_record(&self.buf[start..], &mut self.state, |rec, _| rec)
            {
                self.pos += used;
                self.records += 1;
                return Ok(Some(rec.into()));
            }
            // A record cut off earlier is parsed again only once all of it is here.
            if self.still_cut(start)? {
                return Ok(None);
            }
            let mut r = Reader::new(&self.buf[start..]);
            let mut st = self.state;
            let mut neg = false;
            let mut tag_seen = u64::MAX;
            let parsed = (|| -> ReadResult<Option<Record>> {
                let n = r.array_len()?;
                if n == 0 {
                    return Err(ReadErr::Invalid {
                        offset: 0,
                        what: "a record tag",
                    });
                }
                let t = r.uint()?;
                tag_seen = t;
                let mut f = Fields {
                    r: &mut r,
                    left: n - 1,
                };
                let rec = parse_body(t, &mut f, &mut st, &mut neg)?;
                if rec.is_some() {
                    f.finish()?;
                } else {
                    f.r.skip_values(u64::from(f.left))?;
                }
                Ok(rec)
            })();
            self.examined += r.pos as u64;
            match parsed {
                Ok(rec) => {
                    self.pos += r.pos;
                    self.state = st;
                    if neg {
                        self.warnings.push(Warning::NegativeTime {
                            offset: self.base + start as u64,
                        });
                    }
                    match rec {
                        Some(rec) => {
                            self.records += 1;
                            return Ok(Some(rec));
                        }
                        None => {
                            if self.unknown_count == 0 {
                                self.unknown_first_tag = tag_seen;
                            }
                            self.unknown_count += 1;
                        }
                    }
                }
                Err(ReadErr::Incomplete) => {
                    self.value_complete(start)?;
                    return Ok(None);
                }
                Err(ReadErr::Invalid { offset, what }) => {
                    // Can the record be skipped as a whole MessagePack value?
                    let mut skip = Reader::new(&self.buf[start..]);
                    match skip.skip_values(1) {
                        Ok(()) => {
                            self.pos += skip.pos;
                            if tag_seen == tag::ALLOC {
                                // Keep implicit allocation ids aligned with the writer's.
                                self.state.next_alloc += 1;
                            }
                            self.warnings.push(Warning::MalformedRecord {
                                offset: self.base + (start + offset) as u64,
                                tag: tag_seen,
                                what,
                            });
                        }
                        Err(ReadErr::Incomplete) => {
                            self.value_complete(start)?;
                            return Ok(None);
                        }
                        Err(ReadErr::Invalid { offset, what }) => {
                            let e = DecodeError::Corrupt {
                                offset: self.base + (start + offset) as u64,
                                what,
                            };
                            self.fatal = Some(e.clone());
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// Marks the end of input. Returns the warnings, including a truncation warning when bytes
    /// remain that do not form a complete record, or the error when the header never completed.
    pub fn finish(&mut self) -> Result<Vec<Warning>, DecodeError> {
        if !self.finished {
            self.finished = true;
            if self.unknown_count > 0 {
                self.warnings.push(Warning::UnknownRecords {
                    first_tag: self.unknown_first_tag,
                    count: self.unknown_count,
                });
            }
            if self.fatal.is_none() {
                if self.header.is_none() {
                    let bytes = self.base + self.buf.len() as u64;
                    self.fatal = Some(if bytes == 0 {
                        DecodeError::Empty
                    } else {
                        DecodeError::TruncatedHeader { bytes }
                    });
                } else if self.pos < self.buf.len() {
                    self.warnings.push(Warning::Truncated {
                        offset: self.bytes_consumed(),
                        bytes: (self.buf.len() - self.pos) as u64,
                    });
                }
            }
            self.base += self.pos as u64;
            self.buf = Vec::new();
            self.pos = 0;
        }
        match &self.fatal {
            Some(e) if self.header.is_none() => Err(e.clone()),
            _ => Ok(self.warnings.clone().into_vec()),
        }
    }
}

/// Straight-line decoding of well-formed alloc and free records, the bulk of every trace.
mod fast {
    use super::{DeltaState, Hot};
    use crate::format::*;

    /// The `n` bytes (1, 2, 4 or 8) from `at` as the high bytes of a big-endian word: one
    /// 8-byte load where the buffer holds 8 bytes there, else a copy of the `n`. `None` when
    /// fewer than `n` remain.
    #[inline(always)]
    fn high_bytes(b: &[u8], at: usize, n: usize) -> Option<u64> {
        match b.get(at..at + 8) {
            Some(s) => {
                let mut w = [0u8; 8];
                w.copy_from_slice(s);
                Some(u64::from_be_bytes(w))
            }
            None => high_bytes_at_end(b, at, n),
        }
    }

    /// [`high_bytes`] within 8 bytes of the buffer's end.
    #[cold]
    #[inline(never)]
    fn high_bytes_at_end(b: &[u8], at: usize, n: usize) -> Option<u64> {
        let s = b.get(at..at + n)?;
        Some(
            s.iter()
                .enumerate()
                .fold(0u64, |w, (i, &c)| w | u64::from(c) << (56 - 8 * i)),
        )
    }

    /// Per format byte from 0xcc (uint 8/16/32/64, then int 8/16/32/64): the bytes after it,
    /// and the shift that leaves them as the low bytes of a word read as its high bytes.
    const SIZED: [(u8, u8); 8] = [
        (1, 56),
        (2, 48),
        (4, 32),
        (8, 0),
        (1, 56),
        (2, 48),
        (4, 32),
        (8, 0),
    ];

    /// The size of the integer whose format byte is `x`, when it is uint 8/16/32/64 or int
    /// 8/16/32/64: (bytes after the format byte, the shift of [`SIZED`], whether signed). A
    /// table rather than arithmetic: most fields of most records take this path.
    #[inline(always)]
    fn sized(x: u8) -> Option<(usize, u32, bool)> {
        let k = x.wrapping_sub(0xcc);
        let &(n, shift) = SIZED.get(usize::from(k))?;
        Some((usize::from(n), u32::from(shift), k >= 4))
    }

    /// Reads a non-negative integer (positive fixint, uint 8/16/32/64, or a non-negative signed
    /// form) at `*p`. `None` for anything else, including the end of the buffer.
    #[inline(always)]
    fn uint(b: &[u8], p: &mut usize) -> Option<u64> {
        let x = *b.get(*p)?;
        if x < 0x80 {
            *p += 1;
            return Some(u64::from(x));
        }
        let (n, shift, signed) = sized(x)?;
        let w = high_bytes(b, *p + 1, n)?;
        if signed && w >> 63 != 0 {
            return None;
        }
        *p += 1 + n;
        Some(w >> shift)
    }

    /// Reads any integer as its 64-bit two's-complement bit pattern (for wrapping deltas).
    #[inline(always)]
    fn wrapping(b: &[u8], p: &mut usize) -> Option<u64> {
        let x = *b.get(*p)?;
        if !(0x80..0xe0).contains(&x) {
            *p += 1;
            return Some(i64::from(x as i8) as u64);
        }
        let (n, shift, signed) = sized(x)?;
        let w = high_bytes(b, *p + 1, n)?;
        *p += 1 + n;
        Some(if signed {
            ((w as i64) >> shift) as u64
        } else {
            w >> shift
        })
    }

    #[inline(always)]
    fn u32_field(b: &[u8], p: &mut usize) -> Option<u32> {
        u32::try_from(uint(b, p)?).ok()
    }

    /// Decodes one alloc, free, range begin or range end record at the start of `b`, updating
    /// `st` only on success. Returns what `then` gives for the record and the bytes it used (which
    /// `then` is given too).
    #[inline]
    pub(super) fn hot_record<R>(
        b: &[u8],
        st: &mut DeltaState,
        then: impl FnOnce(Hot, usize) -> R,
    ) -> Option<(R, usize)> {
        let head = *b.first()?;
        if head & 0xf0 != 0x90 {
            return None;
        }
        let n = usize::from(head & 0x0f);
        let t = *b.get(1)?;
        let mut p = 2;
        // Fields beyond the known ones (a newer minor version) take the general path.
        match u64::from(t) {
            tag::ALLOC if (2..=11).contains(&n) => {
                let mut f = [0u64; 10];
                f[0] = uint(b, &mut p)?;
                if n > 2 {
                    f[1] = uint(b, &mut p)?;
                }
                if n > 3 {
                    f[2] = wrapping(b, &mut p)?;
                }
                for slot in f.iter_mut().take(n - 1).skip(3) {
                    *slot = uint(b, &mut p)?;
                }
                let ts_nanos = st.last_ts.checked_add(f[0])?;
                let narrow = |v: u64| u32::try_from(v).ok();
                let a = Alloc {
                    ts_nanos,
                    id: AllocId(st.next_alloc),
                    size_bytes: f[1],
                    address: st.last_address.wrapping_add(f[2]),
                    stack: StackId(narrow(f[3])?),
                    thread: ThreadIdx(narrow(f[4])?),
                    device: DeviceIdx(narrow(f[5])?),
                    kind: AllocKind::from_code(f[6]),
                    stream: f[7],
                    pool: f[8],
                    process: ProcessIdx(narrow(f[9])?),
                };
                st.last_ts = ts_nanos;
                st.last_address = a.address;
                st.next_alloc += 1;
                Some((then(Hot::Alloc(a), p), p))
            }
            tag::FREE if (2..=6).contains(&n) => {
                let dt = uint(b, &mut p)?;
                let back = if n > 2 { uint(b, &mut p)? } else { 0 };
                let thread = if n > 3 { u32_field(b, &mut p)? } else { 0 };
                let kind = if n > 4 { uint(b, &mut p)? } else { 0 };
                let stream = if n > 5 { uint(b, &mut p)? } else { 0 };
                let ts_nanos = st.last_ts.checked_add(dt)?;
                // Out-of-range references map to an id that can never exist; the model warns.
                let alloc = if back >= 1 && back <= st.next_alloc {
                    AllocId(st.next_alloc - back)
                } else {
                    AllocId(u64::MAX)
                };
                st.last_ts = ts_nanos;
                let free = Hot::Free(Free {
                    ts_nanos,
                    alloc,
                    thread: ThreadIdx(thread),
                    kind: FreeKind::from_code(kind),
                    stream,
                });
                Some((then(free, p), p))
            }
            tag::RANGE_BEGIN if (2..=7).contains(&n) => {
                let mut f = [0u64; 6];
                f[0] = uint(b, &mut p)?;
                for slot in f.iter_mut().take(n - 1).skip(1) {
                    *slot = uint(b, &mut p)?;
                }
                let ts_nanos = st.last_ts.checked_add(f[0])?;
                let narrow = |v: u64| u32::try_from(v).ok();
                let r = RangeBegin {
                    ts_nanos,
                    range: RangeId(f[1]),
                    name: StringId(narrow(f[2])?),
                    domain: StringId(narrow(f[3])?),
                    thread: ThreadIdx(narrow(f[4])?),
                    process: ProcessIdx(narrow(f[5])?),
                };
                st.last_ts = ts_nanos;
                Some((then(Hot::RangeBegin(r), p), p))
            }
            tag::RANGE_END if (2..=3).contains(&n) => {
                let dt = uint(b, &mut p)?;
                let range = if n > 2 { uint(b, &mut p)? } else { 0 };
                let ts_nanos = st.last_ts.checked_add(dt)?;
                st.last_ts = ts_nanos;
                let end = Hot::RangeEnd(RangeEnd {
                    ts_nanos,
                    range: RangeId(range),
                });
                Some((then(end, p), p))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod fast_path_tests {
    use super::*;
    use crate::msgpack::{write_array_len, write_int, write_uint};
    use alloc::format;
    use proptest::prelude::*;

    fn write_i128(out: &mut Vec<u8>, v: i128) {
        if v >= 0 {
            write_uint(out, v as u64);
        } else {
            write_int(out, v as i64);
        }
    }

    /// The general parser, for comparison.
    fn general(b: &[u8], st: &mut DeltaState) -> Option<(Record, usize)> {
        let mut r = Reader::new(b);
        let n = r.array_len().ok()?;
        let t = r.uint().ok()?;
        let mut f = Fields {
            r: &mut r,
            left: n.checked_sub(1)?,
        };
        let mut neg = false;
        let rec = parse_body(t, &mut f, st, &mut neg).ok()??;
        f.finish().ok()?;
        if neg {
            return None;
        }
        Some((rec, r.pos))
    }

    fn record(tag: u64, fields: &[i128]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_len(&mut out, fields.len() as u32 + 1);
        write_uint(&mut out, tag);
        for &f in fields {
            write_i128(&mut out, f);
        }
        out
    }

    fn field() -> impl Strategy<Value = i128> {
        prop_oneof![
            0i128..200,
            -40i128..0,
            any::<u32>().prop_map(i128::from),
            any::<i64>().prop_map(i128::from),
            any::<u64>().prop_map(i128::from),
        ]
    }

    proptest! {
        /// Whenever the fast path accepts a record, it decodes exactly what the general parser
        /// does and leaves the same delta state.
        #[test]
        fn fast_path_agrees_with_general_parser(
            which in 0usize..4,
            fields in proptest::collection::vec(field(), 0..12),
            last_ts in prop_oneof![Just(0u64), any::<u64>()],
            last_address in any::<u64>(),
            next_alloc in 0u64..1000,
        ) {
            let tag = [tag::ALLOC, tag::FREE, tag::RANGE_BEGIN, tag::RANGE_END][which];
            let bytes = record(tag, &fields);
            let st0 = DeltaState { last_ts, last_address, next_alloc };
            // A record cut short anywhere (inside a field's bytes too) is never taken.
            for cut in 0..bytes.len() {
                let mut c = st0;
                prop_assert!(fast::hot_record(&bytes[..cut], &mut c, |r, _| r).is_none());
            }
            let (mut a, mut b) = (st0, st0);
            if let Some((rec, used)) = fast::hot_record(&bytes, &mut a, |r, _| r) {
                let rec = Record::from(rec);
                let (want, want_used) = general(&bytes, &mut b).expect("general parser accepts it");
                prop_assert_eq!(format!("{rec:?}"), format!("{want:?}"));
                prop_assert_eq!(used, want_used);
                prop_assert_eq!((a.last_ts, a.last_address, a.next_alloc), (b.last_ts, b.last_address, b.next_alloc));
            } else {
                prop_assert_eq!((a.last_ts, a.last_address, a.next_alloc), (st0.last_ts, st0.last_address, st0.next_alloc));
            }
        }
    }
}
