//! The trace encoder: turns `Header` and `Record`s into format-v1 bytes (see `FORMAT.md`).
//!
//! It keeps the delta state (previous time, previous allocation address, next allocation id),
//! so one `Encoder` must see every record of a trace, in order. Trailing fields that equal their
//! default are omitted, which is what keeps the common alloc/free records small.
//!
//! Writers that produce records (the snapshot converter) write them into a [`RecordSink`]: the
//! encoder, for trace bytes, or a `TraceModel`, which replays them directly (the viewer opens a
//! PyTorch snapshot that way, without encoding and decoding a trace in between).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::format::{self, AllocId, FrameId, Header, Record, StackDef, StackId, StringId, tag};
use crate::msgpack::{
    write_array_len, write_bin, write_int, write_map_len, write_nil, write_str, write_uint,
};

/// Streaming encoder. Bytes accumulate in an internal buffer; the owner drains them with
/// [`Encoder::take_bytes`] (e.g. after every batch) so a crash loses at most one batch.
#[derive(Debug)]
pub struct Encoder {
    out: Vec<u8>,
    last_ts_nanos: u64,
    last_address: u64,
    next_alloc: u64,
}

#[inline]
fn write_i128(out: &mut Vec<u8>, v: i128) {
    if v >= 0 {
        write_uint(out, v as u64);
    } else {
        write_int(out, v as i64);
    }
}

/// Writes `[tag, fields...]` with trailing zero fields dropped.
#[inline]
fn write_ints(out: &mut Vec<u8>, tag: u64, fields: &[i128]) {
    let mut n = fields.len();
    while n > 0 && fields[n - 1] == 0 {
        n -= 1;
    }
    write_array_len(out, n as u32 + 1);
    write_uint(out, tag);
    for &f in &fields[..n] {
        write_i128(out, f);
    }
}

impl Encoder {
    /// Starts a trace: writes the header.
    pub fn new(header: &Header) -> Self {
        let mut out = Vec::with_capacity(64 * 1024);
        write_array_len(&mut out, 4);
        write_str(&mut out, format::MAGIC);
        write_uint(&mut out, u64::from(header.format_major));
        write_uint(&mut out, u64::from(header.format_minor));
        let ends_at = header.ends_at != format::TraceEnd::Exit;
        write_map_len(&mut out, 5 + u32::from(ends_at));
        write_str(&mut out, "collector");
        write_str(&mut out, &header.collector);
        write_str(&mut out, "host");
        write_str(&mut out, &header.host);
        write_str(&mut out, "argv");
        write_array_len(&mut out, header.argv.len() as u32);
        for a in &header.argv {
            write_str(&mut out, a);
        }
        write_str(&mut out, "start_mono_nanos");
        write_uint(&mut out, header.start_mono_nanos);
        write_str(&mut out, "wall_offset_nanos");
        write_int(&mut out, header.wall_offset_nanos);
        if ends_at {
            write_str(&mut out, "ends_at");
            write_str(&mut out, header.ends_at.name());
        }
        Self {
            out,
            last_ts_nanos: 0,
            last_address: 0,
            next_alloc: 0,
        }
    }

    /// A header for the current format version.
    pub fn header_v1() -> Header {
        Header {
            format_major: format::FORMAT_MAJOR,
            format_minor: format::FORMAT_MINOR,
            ..Header::default()
        }
    }

    /// The id the next `Alloc` record will get.
    pub const fn next_alloc_id(&self) -> AllocId {
        AllocId(self.next_alloc)
    }

    /// Bytes encoded so far and not yet taken.
    pub fn bytes(&self) -> &[u8] {
        &self.out
    }

    /// Takes the encoded bytes, leaving the delta state intact.
    pub fn take_bytes(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.out)
    }

    /// Reserves room for `additional` more bytes of output.
    pub fn reserve(&mut self, additional: usize) {
        self.out.reserve(additional);
    }

    /// Consumes the encoder, returning the remaining bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    #[inline]
    fn dt(&mut self, ts: u64) -> i128 {
        let d = i128::from(ts) - i128::from(self.last_ts_nanos);
        self.last_ts_nanos = ts;
        d
    }

    /// Encodes one record. For `Alloc`, returns the id it was given (its `id` field is ignored).
    pub fn record(&mut self, rec: &Record) -> Option<AllocId> {
        let out = &mut self.out;
        match rec {
            Record::Process(p) => {
                write_array_len(out, 6);
                write_uint(out, tag::PROCESS);
                write_uint(out, u64::from(p.process.0));
                write_uint(out, u64::from(p.pid));
                match p.parent {
                    Some(x) => write_uint(out, u64::from(x.0)),
                    None => write_nil(out),
                }
                write_str(out, &p.exe);
                write_array_len(out, p.argv.len() as u32);
                for a in &p.argv {
                    write_str(out, a);
                }
            }
            Record::Device(d) => {
                write_array_len(out, 5);
                write_uint(out, tag::DEVICE);
                write_uint(out, u64::from(d.device.0));
                write_str(out, &d.uuid);
                write_str(out, &d.name);
                write_uint(out, d.total_bytes);
            }
            Record::Module(m) => {
                write_array_len(out, 7);
                write_uint(out, tag::MODULE);
                write_uint(out, u64::from(m.module.0));
                write_uint(out, u64::from(m.process.0));
                write_str(out, &m.path);
                write_bin(out, &m.build_id);
                write_uint(out, m.load_address);
                write_uint(out, m.size_bytes);
            }
            Record::String { id, value } => {
                write_array_len(out, 3);
                write_uint(out, tag::STRING);
                write_uint(out, u64::from(id.0));
                write_str(out, value);
            }
            Record::Frame(format::FrameDef::Native { id, module, offset }) => {
                write_array_len(out, 5);
                write_uint(out, tag::FRAME);
                write_uint(out, u64::from(id.0));
                write_uint(out, 0);
                write_uint(out, u64::from(module.0));
                write_uint(out, *offset);
            }
            Record::Frame(format::FrameDef::Python {
                id,
                function,
                file,
                line,
            }) => {
                write_array_len(out, 6);
                write_uint(out, tag::FRAME);
                write_uint(out, u64::from(id.0));
                write_uint(out, 1);
                write_uint(out, u64::from(function.0));
                write_uint(out, u64::from(file.0));
                write_uint(out, u64::from(*line));
            }
            Record::FrameSymbol(s) => write_ints(
                out,
                tag::FRAME_SYMBOL,
                &[
                    s.frame.0.into(),
                    s.function.0.into(),
                    s.file.0.into(),
                    s.line.into(),
                ],
            ),
            Record::Stack(s) => {
                write_array_len(out, 4);
                write_uint(out, tag::STACK);
                write_uint(out, u64::from(s.stack.0));
                write_uint(out, u64::from(s.parent.0));
                write_uint(out, u64::from(s.frame.0));
            }
            Record::Thread(t) => write_ints(
                out,
                tag::THREAD,
                &[
                    t.thread.0.into(),
                    t.process.0.into(),
                    t.os_tid.into(),
                    t.name.0.into(),
                ],
            ),
            Record::Alloc(a) => {
                let dt = self.dt(a.ts_nanos);
                // Deltas below i64::MIN are written modulo 2^64; the reader wraps them back.
                let mut addr_delta = i128::from(a.address) - i128::from(self.last_address);
                if addr_delta < i128::from(i64::MIN) {
                    addr_delta += 1i128 << 64;
                }
                self.last_address = a.address;
                let id = AllocId(self.next_alloc);
                self.next_alloc += 1;
                write_ints(
                    &mut self.out,
                    tag::ALLOC,
                    &[
                        dt,
                        a.size_bytes.into(),
                        addr_delta,
                        a.stack.0.into(),
                        a.thread.0.into(),
                        a.device.0.into(),
                        a.kind.code().into(),
                        a.stream.into(),
                        a.pool.into(),
                        a.process.0.into(),
                    ],
                );
                return Some(id);
            }
            Record::Free(f) => {
                let dt = self.dt(f.ts_nanos);
                // Back-reference: 1 = the most recent allocation. Always >= 1 for valid ids;
                // a reference to a not-yet-allocated id encodes as <= 0 and decodes as a warning.
                let back = i128::from(self.next_alloc) - i128::from(f.alloc.0);
                write_ints(
                    &mut self.out,
                    tag::FREE,
                    &[
                        dt,
                        back,
                        f.thread.0.into(),
                        f.kind.code().into(),
                        f.stream.into(),
                    ],
                );
            }
            Record::FreeUnknown(f) => {
                let dt = self.dt(f.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::FREE_UNKNOWN,
                    &[
                        dt,
                        f.address.into(),
                        f.size_bytes.into(),
                        f.thread.0.into(),
                        f.device.0.into(),
                        f.kind.code().into(),
                        f.process.0.into(),
                    ],
                );
            }
            Record::AllocFailed(f) => {
                let dt = self.dt(f.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::ALLOC_FAILED,
                    &[
                        dt,
                        f.size_bytes.into(),
                        f.error_code.into(),
                        f.stack.0.into(),
                        f.thread.0.into(),
                        f.device.0.into(),
                        f.kind.code().into(),
                        f.process.0.into(),
                    ],
                );
            }
            Record::RangeBegin(b) => {
                let dt = self.dt(b.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::RANGE_BEGIN,
                    &[
                        dt,
                        b.range.0.into(),
                        b.name.0.into(),
                        b.domain.0.into(),
                        b.thread.0.into(),
                        b.process.0.into(),
                    ],
                );
            }
            Record::RangeEnd(e) => {
                let dt = self.dt(e.ts_nanos);
                write_ints(&mut self.out, tag::RANGE_END, &[dt, e.range.0.into()]);
            }
            Record::Mark(m) => {
                let dt = self.dt(m.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::MARK,
                    &[
                        dt,
                        m.name.0.into(),
                        m.domain.0.into(),
                        m.thread.0.into(),
                        m.process.0.into(),
                    ],
                );
            }
            Record::DeviceSample(s) => {
                let dt = self.dt(s.ts_nanos);
                let out = &mut self.out;
                write_array_len(out, 7);
                write_uint(out, tag::DEVICE_SAMPLE);
                write_i128(out, dt);
                write_uint(out, u64::from(s.device.0));
                write_uint(out, s.total_bytes);
                write_uint(out, s.free_bytes);
                write_uint(out, s.used_bytes);
                write_array_len(out, s.processes.len() as u32);
                for p in &s.processes {
                    write_array_len(out, 2);
                    write_uint(out, u64::from(p.pid));
                    write_uint(out, p.used_bytes);
                }
            }
            Record::PoolSample(s) => {
                let dt = self.dt(s.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::POOL_SAMPLE,
                    &[
                        dt,
                        s.device.0.into(),
                        s.pool.into(),
                        s.reserved_bytes.into(),
                        s.used_bytes.into(),
                        s.process.0.into(),
                    ],
                );
            }
            Record::ProcessExit(e) => {
                let dt = self.dt(e.ts_nanos);
                let out = &mut self.out;
                write_array_len(out, 5);
                write_uint(out, tag::PROCESS_EXIT);
                write_i128(out, dt);
                write_uint(out, u64::from(e.process.0));
                match e.code {
                    Some(c) => write_int(out, i64::from(c)),
                    None => write_nil(out),
                }
                match e.signal {
                    Some(s) => write_int(out, i64::from(s)),
                    None => write_nil(out),
                }
            }
            Record::Notice(n) => {
                let dt = self.dt(n.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::NOTICE,
                    &[dt, n.process.0.into(), n.code.into(), n.message.0.into()],
                );
            }
            Record::Dropped(d) => {
                let dt = self.dt(d.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::DROPPED,
                    &[dt, d.process.0.into(), d.count.into()],
                );
            }
            Record::ContextReset(c) => {
                let dt = self.dt(c.ts_nanos);
                write_ints(
                    &mut self.out,
                    tag::CONTEXT_RESET,
                    &[dt, c.process.0.into(), c.device.0.into(), c.thread.0.into()],
                );
            }
            Record::End { ts_nanos } => {
                let dt = self.dt(*ts_nanos);
                let out = &mut self.out;
                write_array_len(out, 2);
                write_uint(out, tag::END);
                write_i128(out, dt);
            }
        }
        None
    }

    /// Convenience: encodes an allocation and returns its id.
    pub fn alloc(&mut self, a: &format::Alloc) -> AllocId {
        self.record(&Record::Alloc(*a))
            .unwrap_or(AllocId(self.next_alloc.wrapping_sub(1)))
    }
}

/// Where records go, in trace order: an [`Encoder`] (trace bytes) or a
/// [`TraceModel`](crate::model::TraceModel) (replayed as if decoded from those bytes).
pub trait RecordSink {
    /// Takes one record. For `Alloc`, returns the id it was given (its `id` field is ignored):
    /// ids are sequential from 0, as the encoder numbers them.
    fn emit(&mut self, rec: Record) -> Option<AllocId>;

    /// Convenience: takes an allocation and returns its id.
    fn emit_alloc(&mut self, a: &format::Alloc) -> AllocId {
        self.emit(Record::Alloc(*a)).unwrap_or_default()
    }
}

impl RecordSink for Encoder {
    fn emit(&mut self, rec: Record) -> Option<AllocId> {
        self.record(&rec)
    }

    fn emit_alloc(&mut self, a: &format::Alloc) -> AllocId {
        self.alloc(a)
    }
}

/// Interned strings and stack-trie nodes of a trace being written: each is written once, the
/// first time it is used, with the next id (from 1).
#[derive(Debug, Default)]
pub struct Interner {
    strings: HashMap<String, StringId>,
    stacks: HashMap<(StackId, FrameId), StackId>,
}

impl Interner {
    /// The id of `s`, writing its `string` record the first time.
    pub fn string(&mut self, enc: &mut impl RecordSink, s: &str) -> StringId {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = StringId(self.strings.len() as u32 + 1);
        self.strings.insert(s.to_string(), id);
        enc.emit(Record::String {
            id,
            value: s.to_string(),
        });
        id
    }

    /// The id of `s` if it was interned.
    pub fn lookup(&self, s: &str) -> Option<StringId> {
        self.strings.get(s).copied()
    }

    /// The stack `frame` called from `parent`, writing its `stack` record the first time.
    pub fn stack(&mut self, enc: &mut impl RecordSink, parent: StackId, frame: FrameId) -> StackId {
        if let Some(&s) = self.stacks.get(&(parent, frame)) {
            return s;
        }
        let stack = StackId(self.stacks.len() as u32 + 1);
        self.stacks.insert((parent, frame), stack);
        enc.emit(Record::Stack(StackDef {
            stack,
            parent,
            frame,
        }));
        stack
    }
}
