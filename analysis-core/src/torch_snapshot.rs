//! Converts a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, a pickle, or the same
//! data as JSON) into a gpucollect trace, so every front end (report, check, diff, viewer)
//! reads it like a captured trace.
//!
//! Mapping:
//! - `device_traces` entries, in `time_us` order across devices: `alloc` → allocation;
//!   `free_completed` (or the older `free`) → free (stream-ordered when it completed after its
//!   `free_requested`); `segment_alloc`/`segment_map` and `segment_free`/`segment_unmap` change
//!   the reserved bytes, written as pool samples next to the allocated bytes, so fragmentation
//!   gets exact numbers; `oom` → failed allocation; `snapshot`/`annotate` → marks.
//! - `frames` (innermost first) → interned Python frames and stacks.
//! - `external_annotations` (record_function START/END) → NVTX-like ranges, i.e. scopes.
//! - `allocator_settings` → a mark at time 0.
//! - The history is a ring buffer: blocks alive before it started are reconstructed from the
//!   final `segments` state, and frees of never-seen blocks ("ghost blocks") get an allocation at
//!   the start of the history. Both are allocated from a stack whose innermost frame says so, and
//!   counted in the [`ImportSummary`], never dropped or counted twice.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::encode::{Encoder, Interner, RecordSink};
use crate::format::*;
use crate::model::{LoadedTrace, TraceModel};
use crate::pickle::{Pickle, PickleError, Value};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Pickle(#[from] PickleError),
    #[error("the JSON is invalid: {0}")]
    Json(String),
    #[error(
        "this is not a PyTorch memory snapshot: it has no `segments` or `device_traces` \
         (make one with torch.cuda.memory._dump_snapshot)"
    )]
    NotASnapshot,
}

/// What the conversion found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImportSummary {
    pub devices: u32,
    pub trace_entries: u64,
    pub allocations: u64,
    /// Blocks alive in the final state that the history never saw allocated.
    pub reconstructed_blocks: u64,
    /// Frees of blocks the history never saw allocated.
    pub ghost_frees: u64,
    pub failed_allocations: u64,
    pub ranges: u64,
    /// Entries that could not be used (missing fields, unknown actions), by kind.
    pub skipped: Vec<(String, u64)>,
}

/// PyTorch's smallest block and rounding unit (kMinBlockSize).
pub const MIN_BLOCK_BYTES: u64 = 512;

/// Label of the stack given to reconstructed and ghost blocks.
pub const BEFORE_HISTORY: &str = "<allocated before the snapshot's history began>";

/// Whether the bytes look like a snapshot this module reads (a pickle or a JSON object).
pub fn looks_like_snapshot(bytes: &[u8]) -> bool {
    match bytes.first() {
        Some(0x80) => true,
        Some(_) => bytes
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{'),
        None => false,
    }
}

/// Converts a snapshot (pickle or JSON) to trace bytes.
pub fn convert(bytes: &[u8]) -> Result<(Vec<u8>, ImportSummary), ImportError> {
    let (enc, summary) = convert_into(bytes, |entries| {
        let mut enc = Encoder::new(&header());
        // About 12 bytes per allocation or free record (FORMAT.md), most entries being one of
        // them.
        enc.reserve(entries.saturating_mul(12));
        enc
    })?;
    Ok((enc.into_bytes(), summary))
}

/// Converts a snapshot (pickle or JSON) straight into a replayed model: the same model that
/// loading the bytes of [`convert`] gives, without encoding and decoding them. `bytes` of the
/// result is the snapshot's size.
pub fn load(bytes: &[u8]) -> Result<(LoadedTrace, ImportSummary), ImportError> {
    let (mut model, summary) = convert_into(bytes, |entries| {
        let mut m = TraceModel::new(header());
        // About a third of the entries are allocations, two thirds change live bytes.
        m.allocs.reserve(entries / 3 + 1);
        m.total.reserve(entries * 2 / 3 + 1);
        m
    })?;
    let warnings = model.finish();
    Ok((
        LoadedTrace {
            model,
            warnings,
            fatal: None,
            bytes: bytes.len() as u64,
        },
        summary,
    ))
}

/// The header of a converted snapshot.
fn header() -> Header {
    let mut header = Encoder::header_v1();
    header.collector = String::from("torch.cuda.memory._dump_snapshot, imported by gpucollect");
    header
}

/// Converts a snapshot into the sink `make_sink` returns when given the number of trace entries
/// read while parsing (0 for JSON), for sizing its buffers.
fn convert_into<S: RecordSink>(
    bytes: &[u8],
    make_sink: impl FnOnce(usize) -> S,
) -> Result<(S, ImportSummary), ImportError> {
    let mut reader = EntryReader::default();
    // A trace entry takes at least ~60 bytes of pickle (synthetic snapshots with shared frames;
    // real ones with their own frames lists take more): reserve for that, not to copy as it grows.
    let mut entries: Vec<Entry> = Vec::with_capacity(bytes.len() / 64);
    let p = if bytes.first() == Some(&0x80) {
        // Trace entries (dicts with an `action`) are read as they are parsed, into compact
        // entries, instead of being kept as dicts: most of a snapshot is trace entries.
        Pickle::parse_with(bytes, |p, kv| {
            let (entry, has_action) = reader.read(p, kv.chunks_exact(2).map(|x| (x[0], x[1])));
            has_action.then(|| {
                entries.push(entry);
                (entries.len() - 1) as u32
            })
        })?
    } else {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| ImportError::Json(e.to_string()))?;
        Pickle::from_json(&v)
    };
    let sink = make_sink(entries.len());
    Converter::new(&p, sink, reader, entries).run()
}

/// One event to replay: a trace entry or an annotation.
struct Event {
    time_us: i64,
    device: u32,
    annotation: bool,
    /// An annotation's `stage` is `START` (else it ends a range).
    start: bool,
    /// An annotation's `name`.
    value: Value,
    /// The trace entry, an index into the converter's entries.
    entry: u32,
}

/// State of the replay between events.
struct Replay {
    /// Open ranges by (device, interned name).
    open: HashMap<(u32, StringId), Vec<RangeId>>,
    next_range: u64,
    since_sample: HashMap<u32, u32>,
}

impl Default for Replay {
    fn default() -> Self {
        Self {
            open: HashMap::new(),
            next_range: 1,
            since_sample: HashMap::new(),
        }
    }
}

/// The fields of a trace entry the conversion reads, read once.
#[derive(Clone, Copy, Debug)]
struct Entry {
    time_us: i64,
    /// The `action` as written (for messages about unknown ones) and what it is.
    action: Value,
    kind: Action,
    addr: i64,
    /// The `size` field as written (requested bytes for blocks).
    size: Option<u64>,
    stream: u64,
    frames: Option<Value>,
}

/// The actions the conversion knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// No `action`, or not a string, or an empty one.
    Missing,
    Alloc,
    FreeRequested,
    /// `free_completed`, or `free` in older snapshots.
    FreeCompleted,
    /// `segment_alloc` or `segment_map`.
    SegmentAdd,
    /// `segment_free` or `segment_unmap`.
    SegmentRemove,
    /// Another action starting with `segment` (its `size` is not a block size).
    SegmentOther,
    Oom,
    Snapshot,
    Annotate,
    Unknown,
}

impl Action {
    fn of(name: &str) -> Self {
        match name {
            "" => Self::Missing,
            "alloc" => Self::Alloc,
            "free_requested" => Self::FreeRequested,
            "free_completed" | "free" => Self::FreeCompleted,
            "segment_alloc" | "segment_map" => Self::SegmentAdd,
            "segment_free" | "segment_unmap" => Self::SegmentRemove,
            "oom" => Self::Oom,
            "snapshot" => Self::Snapshot,
            "annotate" => Self::Annotate,
            s if s.starts_with("segment") => Self::SegmentOther,
            _ => Self::Unknown,
        }
    }

    /// Whether the entry's `size` is in bytes as written (segments, OOM requests), not a
    /// requested block size.
    const fn raw_size(self) -> bool {
        matches!(
            self,
            Self::SegmentAdd | Self::SegmentRemove | Self::SegmentOther | Self::Oom
        )
    }
}

/// The fields of a trace entry the conversion reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Unknown = 0,
    Action,
    Addr,
    Size,
    Stream,
    TimeUs,
    Frames,
    Other,
}

/// Reads trace entries in one pass over their keys.
#[derive(Default)]
struct EntryReader {
    /// Which field each key string is, by string index (keys are shared through the memo).
    key_fields: Vec<Field>,
    /// Which action each string is, by string index (`None`: not looked at yet).
    actions: Vec<Option<Action>>,
}

impl EntryReader {
    /// The entry, and whether the dict has an `action` (is a trace entry at all).
    fn read(&mut self, p: &Pickle<'_>, kv: impl Iterator<Item = (Value, Value)>) -> (Entry, bool) {
        let mut e = Entry {
            time_us: 0,
            action: Value::None,
            kind: Action::Missing,
            addr: 0,
            size: None,
            stream: 0,
            frames: None,
        };
        let mut has_action = false;
        for (k, v) in kv {
            let Value::Str(i) = k else { continue };
            let i = i as usize;
            if i >= self.key_fields.len() {
                self.key_fields.resize(i + 1, Field::Unknown);
            }
            if self.key_fields[i] == Field::Unknown {
                self.key_fields[i] = match p.str(k).unwrap_or("") {
                    "action" => Field::Action,
                    "addr" => Field::Addr,
                    "size" => Field::Size,
                    "stream" => Field::Stream,
                    "time_us" => Field::TimeUs,
                    "frames" => Field::Frames,
                    _ => Field::Other,
                };
            }
            // Later keys win, as in Python.
            match self.key_fields[i] {
                Field::Action => {
                    e.action = v;
                    e.kind = self.action(p, v);
                    has_action = true;
                }
                Field::Addr => e.addr = p.int(Some(v)).unwrap_or(0),
                Field::Size => e.size = p.int(Some(v)).and_then(|n| u64::try_from(n).ok()),
                Field::Stream => {
                    e.stream = p
                        .int(Some(v))
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(0);
                }
                Field::TimeUs => e.time_us = p.int(Some(v)).unwrap_or(0),
                Field::Frames => e.frames = Some(v),
                Field::Unknown | Field::Other => {}
            }
        }
        (e, has_action)
    }

    /// What an `action` value is, looked up once per string (actions are shared through the
    /// memo).
    fn action(&mut self, p: &Pickle<'_>, v: Value) -> Action {
        let Value::Str(i) = v else {
            return Action::Missing;
        };
        let i = i as usize;
        if let Some(Some(a)) = self.actions.get(i) {
            return *a;
        }
        let a = Action::of(p.str(v).unwrap_or(""));
        if i >= self.actions.len() {
            self.actions.resize(i + 1, None);
        }
        self.actions[i] = Some(a);
        a
    }
}

struct Converter<'p, S> {
    p: &'p Pickle<'p>,
    root: Value,
    enc: S,
    summary: ImportSummary,
    interner: Interner,
    frames: HashMap<(StringId, StringId, u32), FrameId>,
    /// Frame dicts and `frames` lists already converted, by arena index (PyTorch shares them
    /// between entries through the pickle's memo, so most entries hit these).
    frame_dicts: HashMap<u32, FrameId>,
    frame_lists: HashMap<(u32, bool), StackId>,
    reader: EntryReader,
    entries: Vec<Entry>,
    /// Live blocks: (device, address) → (id, size).
    live: HashMap<(u32, i64), (AllocId, u64)>,
    requested: HashMap<(u32, i64), u64>,
    reserved: HashMap<u32, u64>,
    allocated: HashMap<u32, u64>,
    skipped: HashMap<String, u64>,
    t0_us: i64,
    last_ns: u64,
}

impl<'p, S: RecordSink> Converter<'p, S> {
    fn new(p: &'p Pickle<'p>, enc: S, reader: EntryReader, entries: Vec<Entry>) -> Self {
        Self {
            p,
            root: p.root.unwrap_or(Value::None),
            enc,
            summary: ImportSummary::default(),
            interner: Interner::default(),
            frames: HashMap::new(),
            frame_dicts: HashMap::new(),
            frame_lists: HashMap::new(),
            reader,
            entries,
            live: HashMap::new(),
            requested: HashMap::new(),
            reserved: HashMap::new(),
            allocated: HashMap::new(),
            skipped: HashMap::new(),
            t0_us: 0,
            last_ns: 0,
        }
    }

    fn skip(&mut self, what: &str) {
        *self.skipped.entry(what.to_string()).or_default() += 1;
    }

    fn string(&mut self, s: &str) -> StringId {
        self.interner.string(&mut self.enc, s)
    }

    fn frame(&mut self, file: &str, name: &str, line: u32) -> FrameId {
        let (f, n) = (self.string(file), self.string(name));
        if let Some(&id) = self.frames.get(&(f, n, line)) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32 + 1);
        self.frames.insert((f, n, line), id);
        self.enc.emit(Record::Frame(FrameDef::Python {
            id,
            function: n,
            file: f,
            line,
        }));
        id
    }

    fn push_frame(&mut self, parent: StackId, frame: FrameId) -> StackId {
        self.interner.stack(&mut self.enc, parent, frame)
    }

    /// The stack of a `frames` list (innermost first), optionally under a marker frame.
    fn stack(&mut self, frames: Option<Value>, marker: Option<&str>) -> StackId {
        let list_key = match frames {
            Some(Value::List(i) | Value::Tuple(i)) => Some((i, marker.is_some())),
            _ => None,
        };
        if let Some(&s) = list_key.and_then(|k| self.frame_lists.get(&k)) {
            return s;
        }
        let p = self.p;
        let mut s = StackId(0);
        let list = frames.map_or(&[][..], |f| p.items(f));
        for &fr in list.iter().rev().take(crate::model::MAX_STACK_DEPTH) {
            let f = match fr {
                Value::Dict(i) => match self.frame_dicts.get(&i) {
                    Some(&f) => f,
                    None => {
                        let f = self.frame_of(fr);
                        self.frame_dicts.insert(i, f);
                        f
                    }
                },
                _ => self.frame_of(fr),
            };
            s = self.push_frame(s, f);
        }
        if let Some(m) = marker {
            let f = self.frame("", m, 0);
            s = self.push_frame(s, f);
        }
        if let Some(k) = list_key {
            self.frame_lists.insert(k, s);
        }
        s
    }

    fn frame_of(&mut self, fr: Value) -> FrameId {
        let p = self.p;
        let file = p.get(fr, "filename").and_then(|v| p.str(v)).unwrap_or("??");
        let name = p.get(fr, "name").and_then(|v| p.str(v)).unwrap_or("??");
        let line = p
            .int(p.get(fr, "line"))
            .unwrap_or(0)
            .clamp(0, i64::from(u32::MAX)) as u32;
        self.frame(file, name, line)
    }

    fn ts(&mut self, time_us: i64) -> u64 {
        let ns = u64::try_from(time_us.saturating_sub(self.t0_us))
            .unwrap_or(0)
            .saturating_mul(1000);
        self.last_ns = self.last_ns.max(ns);
        ns
    }

    /// The block size the caching allocator reserves for a request: trace entries carry the
    /// requested size, while `memory_allocated()` and the segments count blocks, which are at
    /// least 512 bytes and multiples of 512 (`round_size` in CUDACachingAllocator.cpp).
    fn block_size(requested: Option<u64>) -> Option<u64> {
        requested.map(|n| {
            if n == 0 {
                0
            } else {
                n.div_ceil(MIN_BLOCK_BYTES).saturating_mul(MIN_BLOCK_BYTES)
            }
        })
    }

    fn size(&self, e: Value, key: &str) -> Option<u64> {
        self.p
            .int(self.p.get(e, key))
            .and_then(|v| u64::try_from(v).ok())
    }

    fn pool_sample(&mut self, ts_nanos: u64, device: u32) {
        let reserved_bytes = self.reserved.get(&device).copied().unwrap_or(0);
        let used_bytes = self.allocated.get(&device).copied().unwrap_or(0);
        self.enc.emit(Record::PoolSample(PoolSample {
            ts_nanos,
            device: DeviceIdx(device),
            pool: 0,
            reserved_bytes,
            used_bytes,
            process: ProcessIdx(0),
        }));
    }

    fn alloc(
        &mut self,
        ts_nanos: u64,
        device: u32,
        addr: i64,
        size: u64,
        stack: StackId,
        stream: u64,
    ) {
        let id = self.enc.emit_alloc(&Alloc {
            ts_nanos,
            size_bytes: size,
            address: addr as u64,
            stack,
            device: DeviceIdx(device),
            kind: AllocKind::Device,
            stream,
            ..Alloc::default()
        });
        self.live.insert((device, addr), (id, size));
        let a = self.allocated.entry(device).or_default();
        *a = a.saturating_add(size);
        self.summary.allocations += 1;
    }

    fn free(&mut self, ts_nanos: u64, device: u32, addr: i64, kind: FreeKind, stream: u64) {
        if let Some((id, size)) = self.live.remove(&(device, addr)) {
            self.enc.emit(Record::Free(Free {
                ts_nanos,
                alloc: id,
                kind,
                stream,
                ..Free::default()
            }));
            let a = self.allocated.entry(device).or_default();
            *a = a.saturating_sub(size);
        }
    }

    /// Replays one event (a method of its own so that WebAssembly engines that tier up hot
    /// functions run it optimized after the first few thousand events).
    #[inline(never)]
    fn replay(&mut self, e: &Event, r: &mut Replay) {
        let p = self.p;
        let Replay {
            open,
            next_range,
            since_sample,
        } = r;
        let ts = self.ts(e.time_us);
        if e.annotation {
            let name = p.str(e.value).unwrap_or("?");
            if e.start {
                let range = RangeId(*next_range);
                *next_range += 1;
                let (n, domain) = (self.string(name), self.string("record_function"));
                self.enc.emit(Record::RangeBegin(RangeBegin {
                    ts_nanos: ts,
                    range,
                    name: n,
                    domain,
                    ..RangeBegin::default()
                }));
                open.entry((e.device, n)).or_default().push(range);
                self.summary.ranges += 1;
            } else if let Some(range) = self
                .interner
                .lookup(name)
                .and_then(|n| open.get_mut(&(e.device, n)))
                .and_then(Vec::pop)
            {
                self.enc.emit(Record::RangeEnd(RangeEnd {
                    ts_nanos: ts,
                    range,
                }));
            } else {
                self.skip("annotation end without start");
            }
            return;
        }
        let Some(en) = self.entries.get(e.entry as usize).copied() else {
            return;
        };
        let (addr, stream) = (en.addr, en.stream);
        let size = if en.kind.raw_size() {
            en.size
        } else {
            Self::block_size(en.size)
        };
        let d = e.device;
        match (en.kind, size) {
            (Action::Alloc, Some(size)) => {
                // A block allocated twice without a free: close the old one first.
                self.free(ts, d, addr, FreeKind::Other, stream);
                let stack = self.stack(en.frames, None);
                self.alloc(ts, d, addr, size, stack, stream);
            }
            (Action::FreeRequested, _) => {
                self.requested.insert((d, addr), ts);
            }
            (Action::FreeCompleted, _) => {
                let kind = match self.requested.remove(&(d, addr)) {
                    Some(req) if req < ts => FreeKind::StreamOrdered,
                    _ => FreeKind::Immediate,
                };
                self.free(ts, d, addr, kind, stream);
            }
            (Action::SegmentAdd, Some(size)) => {
                let r = self.reserved.entry(d).or_default();
                *r = r.saturating_add(size);
                self.pool_sample(ts, d);
                return;
            }
            (Action::SegmentRemove, Some(size)) => {
                let r = self.reserved.entry(d).or_default();
                *r = r.saturating_sub(size);
                self.pool_sample(ts, d);
                return;
            }
            (Action::Oom, _) => {
                let stack = self.stack(en.frames, None);
                self.enc.emit(Record::AllocFailed(AllocFailed {
                    ts_nanos: ts,
                    size_bytes: size.unwrap_or(0),
                    error_code: 2,
                    stack,
                    device: DeviceIdx(d),
                    kind: AllocKind::Device,
                    ..AllocFailed::default()
                }));
                self.summary.failed_allocations += 1;
                return;
            }
            (Action::Snapshot | Action::Annotate, _) => {
                let name = self.string(if en.kind == Action::Snapshot {
                    "snapshot"
                } else {
                    "annotate"
                });
                self.enc.emit(Record::Mark(Mark {
                    ts_nanos: ts,
                    name,
                    ..Mark::default()
                }));
                return;
            }
            (kind, _) => {
                let other = p.str(en.action).unwrap_or("");
                let what = if kind == Action::Missing {
                    String::from("entry without an action")
                } else {
                    format!("action `{other}` without a size or unknown")
                };
                self.skip(&what);
                return;
            }
        }
        // Allocated bytes changed: sample now and then so the ratio has a time course.
        let n = since_sample.entry(d).or_default();
        *n += 1;
        if *n >= 64 {
            *n = 0;
            self.pool_sample(ts, d);
        }
    }

    fn run(mut self) -> Result<(S, ImportSummary), ImportError> {
        let p = self.p;
        let segments = p.get(self.root, "segments");
        let traces = p.get(self.root, "device_traces");
        if segments.is_none() && traces.is_none() {
            return Err(ImportError::NotASnapshot);
        }
        // Every event, merged across devices in time order (stable for equal times).
        let mut events: Vec<Event> = Vec::new();
        // Where each source (a device's entries, then the annotations) starts and ends.
        let mut bounds = alloc::vec![0usize];
        for (device, list) in traces.map_or(&[][..], |t| p.items(t)).iter().enumerate() {
            events.reserve(p.items(*list).len());
            for &v in p.items(*list) {
                let entry = match p.taken(v) {
                    Some(tag) => tag,
                    None => {
                        // Not taken while parsing (JSON, or a dict without an action).
                        let (e, _) = self.reader.read(p, p.entries(v).iter().copied());
                        self.entries.push(e);
                        (self.entries.len() - 1) as u32
                    }
                };
                events.push(Event {
                    time_us: self.entries.get(entry as usize).map_or(0, |e| e.time_us),
                    device: device as u32,
                    annotation: false,
                    start: false,
                    value: v,
                    entry,
                });
            }
            bounds.push(events.len());
        }
        self.summary.trace_entries = events.len() as u64;
        if let Some(ann) = p.get(self.root, "external_annotations") {
            for &a in p.items(ann) {
                // One pass over the keys (later keys win, as in Python).
                let (mut time_us, mut device, mut name, mut start) = (0, 0, Value::None, false);
                for &(k, v) in p.entries(a) {
                    match p.str(k) {
                        Some("time_us") => time_us = p.int(Some(v)).unwrap_or(0),
                        Some("device") => device = p.int(Some(v)).unwrap_or(0),
                        Some("name") => name = v,
                        Some("stage") => {
                            start = p.str(v).is_some_and(|s| s.eq_ignore_ascii_case("START"));
                        }
                        _ => {}
                    }
                }
                events.push(Event {
                    time_us,
                    device: device.clamp(0, 1 << 16) as u32,
                    annotation: true,
                    start,
                    value: name,
                    entry: 0,
                });
            }
        }
        bounds.push(events.len());
        let order = replay_order(&events, &bounds);
        self.t0_us = order.first().map_or(0, |o| o.0);

        // Devices: from the traces and the segments.
        let mut devices = traces.map_or(0, |t| p.items(t).len() as u32);
        for &s in segments.map_or(&[][..], |s| p.items(s)) {
            let d = p.int(p.get(s, "device")).unwrap_or(0).clamp(0, 1 << 16) as u32;
            devices = devices.max(d + 1);
        }
        self.summary.devices = devices;
        self.enc.emit(Record::Process(ProcessInfo {
            process: ProcessIdx(0),
            pid: 0,
            parent: None,
            exe: String::from("python"),
            argv: Vec::new(),
        }));
        for d in 0..devices {
            self.enc.emit(Record::Device(DeviceInfo {
                device: DeviceIdx(d),
                uuid: String::new(),
                name: format!("cuda:{d}"),
                total_bytes: 0,
            }));
        }
        if let Some(settings) = p.get(self.root, "allocator_settings") {
            let text: Vec<String> = p
                .entries(settings)
                .iter()
                .filter_map(|(k, v)| {
                    let k = p.str(*k)?;
                    let v = match *v {
                        Value::Str(_) => String::from(p.str(*v).unwrap_or("")),
                        Value::Int(i) => format!("{i}"),
                        Value::Float(f) => format!("{f}"),
                        Value::Bool(b) => format!("{b}"),
                        Value::None => String::from("None"),
                        _ => String::from("…"),
                    };
                    Some(format!("{k}={v}"))
                })
                .collect();
            let name = self.string(&format!("allocator_settings: {}", text.join(", ")));
            self.enc.emit(Record::Mark(Mark {
                ts_nanos: 0,
                name,
                ..Mark::default()
            }));
        }

        // Pass 1: which blocks are freed before the history allocates them (ghosts), and how
        // much reserved memory changes during the history.
        let mut seen: HashMap<(u32, i64), bool> = HashMap::new();
        let mut ghosts: Vec<(u32, i64, u64, Option<Value>)> = Vec::new();
        let mut reserved_delta: HashMap<u32, i128> = HashMap::new();
        for e in order
            .iter()
            .map(|o| &events[o.1 as usize])
            .filter(|e| !e.annotation)
        {
            let en = self.entries.get(e.entry as usize).copied();
            let Some(en) = en else { continue };
            let addr = en.addr;
            let size = if matches!(
                en.kind,
                Action::SegmentAdd | Action::SegmentRemove | Action::SegmentOther
            ) {
                en.size.unwrap_or(0)
            } else {
                Self::block_size(en.size).unwrap_or(0)
            };
            match en.kind {
                Action::Alloc => {
                    seen.insert((e.device, addr), true);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    if !seen.contains_key(&(e.device, addr)) {
                        ghosts.push((e.device, addr, size, en.frames));
                        seen.insert((e.device, addr), false);
                    } else if en.kind != Action::FreeRequested {
                        seen.remove(&(e.device, addr));
                    }
                }
                Action::SegmentAdd => {
                    *reserved_delta.entry(e.device).or_default() += i128::from(size);
                }
                Action::SegmentRemove => {
                    *reserved_delta.entry(e.device).or_default() -= i128::from(size);
                }
                _ => {}
            }
        }
        // The final state, from the segments.
        let mut final_reserved: HashMap<u32, u64> = HashMap::new();
        let mut final_blocks: Vec<(u32, i64, u64, Option<Value>)> = Vec::new();
        for &s in segments.map_or(&[][..], |s| p.items(s)) {
            let d = p.int(p.get(s, "device")).unwrap_or(0).clamp(0, 1 << 16) as u32;
            let r = final_reserved.entry(d).or_default();
            *r = r.saturating_add(self.size(s, "total_size").unwrap_or(0));
            for &b in p.items(p.get(s, "blocks").unwrap_or(Value::None)) {
                let state = p.get(b, "state").and_then(|v| p.str(v)).unwrap_or("");
                if state.starts_with("active") {
                    let addr = p.int(p.get(b, "address")).unwrap_or(0);
                    let size = self.size(b, "size").unwrap_or(0);
                    final_blocks.push((d, addr, size, p.get(b, "frames")));
                }
            }
        }
        // Blocks alive at the end of the replayed history (allocated, not freed), to tell which
        // final blocks predate the history.
        let alive_in_history: hashbrown::HashSet<(u32, i64)> = seen
            .iter()
            .filter(|(_, allocated)| **allocated)
            .map(|(k, _)| *k)
            .collect();

        // Time 0: reserved memory and blocks from before the history.
        for d in 0..devices {
            let delta = reserved_delta.get(&d).copied().unwrap_or(0);
            let end = i128::from(final_reserved.get(&d).copied().unwrap_or(0));
            let start = if segments.is_some() {
                (end - delta).max(0)
            } else {
                (-delta).max(0)
            };
            self.reserved
                .insert(d, u64::try_from(start).unwrap_or(u64::MAX));
        }
        for (d, addr, size, frames) in ghosts {
            let stack = self.stack(frames, Some(BEFORE_HISTORY));
            self.alloc(0, d, addr, size, stack, 0);
            self.summary.ghost_frees += 1;
        }
        for (d, addr, size, frames) in final_blocks {
            if alive_in_history.contains(&(d, addr)) || self.live.contains_key(&(d, addr)) {
                continue;
            }
            let stack = self.stack(frames, Some(BEFORE_HISTORY));
            self.alloc(0, d, addr, size, stack, 0);
            self.summary.reconstructed_blocks += 1;
        }
        for d in 0..devices {
            self.pool_sample(0, d);
        }

        // Pass 2: replay.
        let mut replay = Replay::default();
        for o in &order {
            self.replay(&events[o.1 as usize], &mut replay);
        }
        // Ranges still open end with the trace; a final sample for every device.
        let end = self.last_ns;
        let mut still_open: Vec<RangeId> = replay.open.into_values().flatten().collect();
        still_open.sort_unstable();
        for range in still_open {
            self.enc.emit(Record::RangeEnd(RangeEnd {
                ts_nanos: end,
                range,
            }));
        }
        for d in 0..devices {
            self.pool_sample(end, d);
        }
        self.enc.emit(Record::End { ts_nanos: end });
        let mut skipped: Vec<(String, u64)> = self.skipped.into_iter().collect();
        skipped.sort();
        self.summary.skipped = skipped;
        Ok((self.enc, self.summary))
    }
}

/// (time, position) of every event in replay order: by time, then by position (devices in
/// order, annotations last). Each source (a device's entries, the annotations) is nearly in time
/// order already, so each is ordered by insertion with a bounded reach (a full sort when an
/// entry is far out of place), then the sources are merged. Positions are unique, so this is
/// exactly the order a full sort of the pairs gives, in about linear time.
fn replay_order(events: &[Event], bounds: &[usize]) -> Vec<(i64, u32)> {
    let mut runs: Vec<Vec<(i64, u32)>> = bounds
        .windows(2)
        .filter_map(|w| Some((w[0], events.get(w[0]..w[1])?)))
        .map(|(start, run)| {
            let mut r: Vec<(i64, u32)> = (start..)
                .zip(run)
                .map(|(i, e)| (e.time_us, i as u32))
                .collect();
            sort_nearly_sorted(&mut r);
            r
        })
        .collect();
    while runs.len() > 1 {
        let mut merged = Vec::with_capacity(runs.len().div_ceil(2));
        let mut it = runs.into_iter();
        while let Some(a) = it.next() {
            merged.push(match it.next() {
                Some(b) => merge_sorted(&a, &b),
                None => a,
            });
        }
        runs = merged;
    }
    runs.pop().unwrap_or_default()
}

/// Insertion sort that gives up (and sorts fully) once an item would move more than 64 places.
fn sort_nearly_sorted<T: Ord + Copy>(v: &mut [T]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1] > x {
            if i - j >= 64 {
                v[j] = x;
                v.sort_unstable();
                return;
            }
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

fn merge_sorted<T: Ord + Copy>(a: &[T], b: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no std, no dependencies).
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn nearly_sorted_and_merged_runs_equal_a_full_sort() {
        let mut st = 7u64;
        for reach in [0u64, 3, 50, 200, 5000] {
            let mut v: Vec<(i64, u32)> = (0..3000u32)
                .map(|i| (i as i64 * 10 + (lcg(&mut st) % (reach * 10 + 1)) as i64, i))
                .collect();
            let mut want = v.clone();
            want.sort_unstable();
            sort_nearly_sorted(&mut v);
            assert_eq!(v, want, "reach {reach}");
        }
        let a: Vec<u32> = (0..100).map(|i| i * 2).collect();
        let b: Vec<u32> = (0..50).map(|i| i * 3 + 1).collect();
        let mut want: Vec<u32> = a.iter().chain(&b).copied().collect();
        want.sort_unstable();
        assert_eq!(merge_sorted(&a, &b), want);
    }
}
