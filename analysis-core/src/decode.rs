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
}

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
            Self::NegativeTime { offset } => write!(
                f,
                "a timestamp before the trace start at byte {offset} was clamped to 0"
            ),
        }
    }
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
    warnings: Vec<Warning>,
    unknown_first_tag: u64,
    unknown_count: u64,
    records: u64,
    finished: bool,
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

    /// Warnings so far (more may come from `finish`).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The error that stopped decoding, if any.
    pub fn fatal(&self) -> Option<&DecodeError> {
        self.fatal.as_ref()
    }

    fn try_header(&mut self) -> Result<bool, DecodeError> {
        let mut r = Reader::new(&self.buf[self.pos..]);
        match parse_header(&mut r) {
            Ok(h) => {
                self.pos += r.pos;
                self.header = Some(h);
                Ok(true)
            }
            Err(HeaderErr::Read(ReadErr::Incomplete)) => Ok(false),
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
                Err(ReadErr::Incomplete) => return Ok(None),
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
                        Err(ReadErr::Incomplete) => return Ok(None),
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
            _ => Ok(self.warnings.clone()),
        }
    }
}
