//! Converts a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, a pickle, or the same
//! data as JSON) into a gpucollect trace, so every front end (report, check, diff, viewer)
//! reads it like a captured trace.
//!
//! Mapping:
//! - `device_traces` entries, in `time_us` order across devices: `alloc` → allocation;
//!   `free_requested` → free, where `memory_allocated()` drops (stream-ordered unless its
//!   `free_completed` comes at the same time; the block keeps its place in its segment until
//!   then); a `free_completed` without a request (the older `free`) → free;
//!   `segment_alloc`/`segment_map` and `segment_free`/`segment_unmap` change
//!   the reserved bytes, written as pool samples next to the allocated bytes, so fragmentation
//!   gets exact numbers; `oom` → failed allocation, after a device sample whose `free_bytes`
//!   is the entry's `addr` (PyTorch writes the device's free memory there);
//!   `snapshot`/`annotate` → marks.
//! - Sizes are the caching allocator's blocks, as `memory_allocated()` counts them, not the
//!   requests the entries carry: an allocation still live at the snapshot takes its block's size
//!   from the segment table; any other takes the allocator's split rule (`BlockRule`, as
//!   `allocator_settings` configure it) applied to the free block it came from, which runs from
//!   its address to the next allocated large block or the end of its segment (segments as the
//!   table and the history's segment entries say). Where no known segment holds it (history lost
//!   to the ring buffer, a JSON without segments) a large allocation is sized as its rounded
//!   request, as are ghosts (see below), which may be up to 1 MiB low; the summary counts them.
//! - The trace's header says `ends_at: snapshot` (format 1.2): the program was still running,
//!   so what is live at the end is live at the snapshot, not leaked; the `end` record is at the
//!   last entry's time (the history is complete up to the snapshot).
//! - `frames` (innermost first) → interned Python frames and stacks.
//! - `external_annotations` (record_function START/END) → NVTX-like ranges, i.e. scopes.
//! - `allocator_settings` → a mark at time 0.
//! - The history is a ring buffer: blocks alive before it started are reconstructed from the
//!   final `segments` state, and frees of never-seen blocks ("ghost blocks") get an allocation at
//!   the start of the history. Both are allocated from a stack whose innermost frame says so, and
//!   counted in the [`ImportSummary`], never dropped or counted twice.
//!
//! Work and memory stay proportional to the input: device traces, trace entries, segments and
//! blocks that memo references name again are read again only within a budget per input byte
//! ([`ImportError::Shared`]), and a snapshot has at most one trace entry, annotation or block
//! per 32 bytes plus a constant ([`ImportError::TooManyEvents`]); FORMAT.md, "Robustness".
//!
//! [`load`] and [`convert`] take the whole snapshot; [`SnapshotLoader`] takes it in pieces and
//! parses while the rest is still being read (same result). Trace entries are read into compact
//! entries while the pickle is parsed; everything the conversion writes is counted before it
//! starts, so the sink's buffers are reserved once (WebAssembly copies on every realloc).

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use hashbrown::HashMap;

use crate::int_hash::{IntMap, IntSet};
use crate::pickle::{JsonParser, Kind, Parser, Pickle, PickleError, Value};
use gpucollect_trace::encode::{Encoder, Interner, RecordSink};
use gpucollect_trace::format::*;
use gpucollect_trace::model::{LoadedTrace, TraceModel};

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
    #[error(
        "the snapshot names the same lists or dicts over and over through pickle memo \
         references: converting its {input_bytes} bytes would read {limit} or more shared \
         values again (at most one per 16 bytes of input), so it is refused. \
         torch.cuda.memory._dump_snapshot never writes such a snapshot; if a script made this \
         one, give every segment its own `blocks` list and every trace entry its own dict"
    )]
    Shared { input_bytes: u64, limit: u64 },
    #[error(
        "the snapshot has more trace entries, annotations and blocks than its {input_bytes} \
         bytes can hold ({limit} or more: over one per 32 bytes, where a PyTorch snapshot \
         takes 50 bytes or more for each); refused, so that converting it takes memory \
         proportional to its size"
    )]
    TooManyEvents { input_bytes: u64, limit: u64 },
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
    /// Allocations of the history still live at the snapshot, sized by the segment table's
    /// block (exact).
    pub sized_from_segments: u64,
    /// Allocations whose block is larger than their rounded request: the caching allocator did
    /// not split the free block they came from (the segment table's size, or the allocator's
    /// split rule replayed against the free space of their segment).
    pub unsplit_blocks: u64,
    /// Large-pool allocations (over 1 MiB) freed before the snapshot that lie in no segment
    /// the snapshot knows (a JSON without `segments`, or history lost to the ring buffer): sized
    /// as their rounded request, which is low where the allocator did not split their block.
    pub unplaced_blocks: u64,
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
    Load::over(bytes).finish_bytes(bytes.len() as u64)
}

/// Converts a snapshot (pickle or JSON) straight into a replayed model: the same model that
/// loading the bytes of [`convert`] gives, without encoding and decoding them. `bytes` of the
/// result is the snapshot's size. The same as pushing `bytes` into a [`SnapshotLoader`] and
/// finishing it, without copying them.
pub fn load(bytes: &[u8]) -> Result<(LoadedTrace, ImportSummary), ImportError> {
    Load::over(bytes).finish_model(bytes.len() as u64)
}

/// Reads a snapshot from pieces of its bytes as they arrive (a file read in slices, a network
/// stream), parsing while the rest is still coming, and converts it into a replayed model at
/// [`SnapshotLoader::finish`]: the result equals [`load`] of the whole, wherever the pieces
/// are cut.
///
/// A pickle is parsed as far as its bytes go at every [`SnapshotLoader::push`] (an opcode cut
/// by the end of a piece waits for the next one), and JSON as far as its tokens are complete
/// (a token cut by the end of a piece waits for the next one). The first byte tells them
/// apart, as in [`load`]: `0x80` (the pickle PROTO opcode) or anything else (JSON). Memory stays a small multiple of the bytes pushed, and nothing is executed.
///
/// ```
/// # use gpucollect_torch_import::torch_snapshot::SnapshotLoader;
/// # let file: &[u8] = b"{\"segments\": [], \"device_traces\": []}";
/// let mut loader = SnapshotLoader::new(Some(file.len()));
/// for piece in file.chunks(4 << 20) {
///     loader.push(piece)?; // yield to the event loop between pieces
/// }
/// let (trace, summary) = loader.finish()?;
/// # Ok::<(), gpucollect_torch_import::torch_snapshot::ImportError>(())
/// ```
#[derive(Debug)]
pub struct SnapshotLoader {
    load: Load<'static>,
    bytes_read: u64,
}

impl SnapshotLoader {
    /// A loader for a snapshot of about `size_hint_bytes` (the file's size, a
    /// Content-Length), if known: the input buffer and the parser's tables are reserved for
    /// it up front instead of being copied as they grow. The hint sizes buffers, and the heap
    /// a pickle's parser may take ([`crate::pickle::PARSE_HEAP_PER_INPUT_BYTE`] per byte of
    /// the hint or of the bytes pushed, whichever is larger: give the input's size, so that
    /// the limit is [`load`]'s).
    pub fn new(size_hint_bytes: Option<usize>) -> Self {
        Self {
            load: Load::Start {
                size_hint_bytes: size_hint_bytes.unwrap_or(0),
            },
            bytes_read: 0,
        }
    }

    /// Appends the next piece of the snapshot and parses every complete pickle opcode in it.
    /// An error here (the input is not a pickle this reads, or uses code) is final: `finish`
    /// and later pushes return it again. A pickle that ends early is an error only at
    /// `finish`, since more may come.
    pub fn push(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        self.push_with(piece.len(), |to| to.copy_from_slice(piece))
    }

    /// Pushes `len` bytes that `fill` writes straight into the loader's buffer (from a
    /// browser's buffer, say, without a copy in between); otherwise as [`SnapshotLoader::push`].
    pub fn push_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), ImportError> {
        self.bytes_read += len as u64;
        let result = self.load.push_with(len, fill);
        if let Err(e) = &result {
            self.load = Load::Failed(e.clone());
        }
        result
    }

    /// Bytes pushed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// How long [`SnapshotLoader::finish`] will take, roughly: the trace entries of a pickle
    /// parsed so far (the conversion's work grows with them), or `None` for JSON, whose trace
    /// entries are only read then.
    pub fn pending_entries(&self) -> Option<u64> {
        match &self.load {
            Load::Pickle(pl) => Some(pl.entries.len() as u64),
            Load::Start { .. } | Load::Failed(_) => Some(0),
            Load::Json(_) => None,
        }
    }

    /// Ends the input: completes the parse and converts the snapshot exactly as [`load`]
    /// does. A pickle cut short is an error ([`PickleError::Truncated`]).
    pub fn finish(self) -> Result<(LoadedTrace, ImportSummary), ImportError> {
        self.load.finish_model(self.bytes_read)
    }

    /// Ends the input like [`SnapshotLoader::finish`], but converts into trace bytes, exactly
    /// as [`convert`] does.
    pub fn finish_trace_bytes(self) -> Result<(Vec<u8>, ImportSummary), ImportError> {
        self.load.finish_bytes(self.bytes_read)
    }
}

/// A snapshot being read: the one state machine behind [`load`], [`convert`] and
/// [`SnapshotLoader`].
#[derive(Debug)]
enum Load<'a> {
    /// Nothing read yet.
    Start {
        size_hint_bytes: usize,
    },
    Pickle(Box<PickleLoad<'a>>),
    /// JSON, parsed as it arrives.
    Json(Box<JsonLoad>),
    Failed(ImportError),
}

/// JSON being parsed, and a buffer for the next piece.
struct JsonLoad {
    parser: JsonParser,
    piece: Vec<u8>,
}

impl core::fmt::Debug for JsonLoad {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("JsonLoad")
    }
}

impl JsonLoad {
    fn new() -> Self {
        Self {
            parser: JsonParser::new(),
            piece: Vec::new(),
        }
    }

    fn push(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        self.parser
            .push(piece)
            .map_err(|e| ImportError::Json(e.to_string()))
    }
}

/// A pickle being parsed, with the trace entries read from it so far.
#[derive(Debug)]
struct PickleLoad<'a> {
    parser: Parser<'a>,
    reader: EntryReader,
    entries: Vec<Entry>,
    /// The size hint and the bytes pushed: past [`Repeats::events_limit`] of the larger, trace
    /// entries are left in the arena as dicts (which the parser's heap limit then counts), so
    /// that `entries` stays proportional to the input; the conversion reads them all the same
    /// (and refuses the snapshot if it has too many).
    hint: usize,
    pushed: usize,
}

impl<'a> PickleLoad<'a> {
    fn new(parser: Parser<'a>, size_hint_bytes: usize) -> Self {
        Self {
            parser,
            reader: EntryReader::default(),
            // A trace entry takes at least ~60 bytes of pickle (synthetic snapshots with
            // shared frames; real ones with their own frames lists take more): reserved for
            // that, not to be copied as it grows.
            entries: Vec::with_capacity(size_hint_bytes / 64),
            hint: size_hint_bytes,
            pushed: 0,
        }
    }

    /// Parses as far as the input goes. Trace entries (dicts with an `action`) are read as
    /// they are parsed, into compact entries, instead of being kept as dicts: most of a
    /// snapshot is trace entries.
    fn advance(&mut self, at_end: bool) -> Result<bool, PickleError> {
        let PickleLoad {
            parser,
            reader,
            entries,
            hint,
            pushed,
        } = self;
        let most = Repeats::events_limit((*hint).max(*pushed) as u64);
        parser.advance(
            &mut |p, kv| {
                if entries.len() as u64 >= most {
                    return None;
                }
                let (entry, has_action) = reader.read(p, kv.chunks_exact(2).map(|x| (x[0], x[1])));
                has_action.then(|| {
                    entries.push(entry);
                    (entries.len() - 1) as u32
                })
            },
            at_end,
        )
    }
}

impl<'a> Load<'a> {
    /// A whole input, borrowed.
    fn over(bytes: &'a [u8]) -> Self {
        if bytes.first() == Some(&0x80) {
            match Parser::new(bytes) {
                Ok(parser) => Load::Pickle(Box::new(PickleLoad::new(parser, bytes.len()))),
                Err(e) => Load::Failed(e.into()),
            }
        } else {
            let mut json = JsonLoad::new();
            match json.push(bytes) {
                Ok(()) => Load::Json(Box::new(json)),
                Err(e) => Load::Failed(e),
            }
        }
    }

    fn push(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        self.push_with(piece.len(), |to| to.copy_from_slice(piece))
    }

    /// Takes `len` more bytes, written in place by `fill`.
    fn push_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), ImportError> {
        match self {
            Load::Start { size_hint_bytes } => {
                if len == 0 {
                    return Ok(());
                }
                // The first byte says what this is: the first piece goes through a buffer.
                let mut first = alloc::vec![0; len];
                fill(&mut first);
                let hint = *size_hint_bytes;
                if first[0] == 0x80 {
                    *self = Load::Pickle(Box::new(PickleLoad::new(
                        Parser::incremental(hint.max(len)),
                        hint,
                    )));
                } else {
                    *self = Load::Json(Box::new(JsonLoad::new()));
                }
                self.push(&first)
            }
            Load::Pickle(pl) => {
                pl.parser.push_with(len, fill)?;
                pl.pushed += len;
                pl.advance(false)?;
                Ok(())
            }
            Load::Json(json) => {
                let mut piece = core::mem::take(&mut json.piece);
                piece.clear();
                piece.resize(len, 0);
                fill(&mut piece);
                let result = json.push(&piece);
                json.piece = piece;
                result
            }
            Load::Failed(e) => Err(e.clone()),
        }
    }

    /// Ends the input (`input_bytes` in all) and converts into the sink `make_sink` returns
    /// when given what the conversion will write, for sizing its buffers.
    fn finish_into<S: RecordSink>(
        self,
        input_bytes: u64,
        make_sink: impl FnOnce(&SinkHint) -> S,
    ) -> Result<(S, ImportSummary), ImportError> {
        match self {
            Load::Start { .. } => {
                Load::Json(Box::new(JsonLoad::new())).finish_into(input_bytes, make_sink)
            }
            Load::Pickle(mut pl) => {
                pl.advance(true)?;
                let PickleLoad {
                    parser,
                    reader,
                    entries,
                    ..
                } = *pl;
                let p = parser.into_pickle();
                Converter::convert(&p, input_bytes, reader, entries, make_sink)
            }
            Load::Json(json) => {
                let JsonLoad { parser, piece } = *json;
                drop(piece);
                let p = parser
                    .finish()
                    .map_err(|e| ImportError::Json(e.to_string()))?;
                Converter::convert(
                    &p,
                    input_bytes,
                    EntryReader::default(),
                    Vec::new(),
                    make_sink,
                )
            }
            Load::Failed(e) => Err(e),
        }
    }

    /// Ends the input (`input_bytes` in all) and converts into trace bytes.
    fn finish_bytes(self, input_bytes: u64) -> Result<(Vec<u8>, ImportSummary), ImportError> {
        let (enc, summary) = self.finish_into(input_bytes, |hint| {
            let mut enc = Encoder::new(&header());
            enc.reserve(hint.trace_bytes());
            enc
        })?;
        Ok((enc.into_bytes(), summary))
    }

    /// Ends the input and converts into a replayed model; `bytes` is the snapshot's size.
    fn finish_model(self, bytes: u64) -> Result<(LoadedTrace, ImportSummary), ImportError> {
        let (mut model, summary) = self.finish_into(bytes, |hint| {
            let mut m = TraceModel::new(header());
            m.failed.reserve(hint.failed);
            m
        })?;
        let warnings = model.finish();
        Ok((
            LoadedTrace {
                model,
                warnings,
                fatal: None,
                bytes,
            },
            summary,
        ))
    }
}

/// What a conversion will write, counted before it starts (upper bounds or close estimates),
/// for sizing the sink's buffers.
#[derive(Clone, Copy, Debug, Default)]
struct SinkHint {
    allocs: usize,
    /// Changes of the live bytes (allocations and frees).
    changes: usize,
    pool_samples: usize,
    marks: usize,
    failed: usize,
}

impl SinkHint {
    /// Bytes of the encoded trace: about 12 per allocation or free (FORMAT.md), more for
    /// samples.
    fn trace_bytes(&self) -> usize {
        self.changes
            .saturating_mul(12)
            .saturating_add(self.pool_samples.saturating_mul(16))
            .saturating_add(4096)
    }
}

/// The header of a converted snapshot.
fn header() -> Header {
    let mut header = Encoder::header_v1();
    header.collector = String::from("torch.cuda.memory._dump_snapshot, imported by gpucollect");
    // A snapshot is taken from a running program: what is live at its end is not leaked.
    header.ends_at = TraceEnd::Snapshot;
    header
}

/// Where an event of the replay is: its time and position (a device's trace entries in order,
/// devices in order, then the annotations), which order the replay, and the trace entry's
/// index in the converter's entries (unused for annotations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    time_us: i64,
    pos: u32,
    entry: u32,
}

/// The block a trace entry's replay frees (an allocation frees a block still at its address
/// first): an allocation of the history by ordinal (in replay order, from 0), a block alive at
/// time 0 (numbered down from [`Link::FIRST_START`]), or none. Resolved in pass 1, so the
/// replay finds blocks by index instead of by address. Either kind is fewer than the trace
/// entries plus the final blocks, which the input's 4 GiB bounds below 2^31, so they never meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Link(u32);

impl Link {
    const NONE: u32 = u32::MAX;
    const FIRST_START: u32 = u32::MAX - 1;
    const LAST_HISTORY: u32 = u32::MAX / 2;
}

/// A segment of the replay: its end and the start addresses of the large-pool blocks allocated
/// in it (sorted; few: a segment holds a few large blocks).
#[derive(Clone, Debug, Default)]
struct Segment {
    end: i64,
    blocks: Vec<i64>,
}

/// The segment index of a block in none.
const NO_SEGMENT: u32 = u32::MAX;

/// A block alive at time 0.
#[derive(Clone, Copy, Debug)]
struct StartBlock {
    device: u32,
    addr: i64,
    size: u64,
    frames: Option<Value>,
    /// A ghost (else a final block the history does not allocate).
    ghost: bool,
}

/// What pass 1 knows of an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Not allocated in the history so far, or freed since.
    Not,
    /// Allocated (and not freed since).
    Allocated,
    /// A ghost block: freed before the history allocated it.
    Ghost,
}

/// An address in pass 1: what the replay will have there. Kept for every address the history
/// uses (far fewer than its entries: the caching allocator reuses blocks).
#[derive(Clone, Copy, Debug)]
struct BlockState {
    seen: Seen,
    /// The block of the history the replay has there ([`Link::NONE`] when a block alive at time
    /// 0 may be, until the first close).
    live: Link,
    /// The position of the first entry that closes a block there (an allocation with a size,
    /// a free request, a completed free not requested), `u32::MAX` before it: a block alive at
    /// time 0 there ends then.
    first_close: u32,
    /// The `free_requested` entry of the block there whose completion has not come yet (its
    /// index in the replay order), `u32::MAX` if none: the request freed the block, and its
    /// completion frees nothing but says whether the free was stream-ordered. An index rather
    /// than a time keeps the state at 16 bytes.
    requested: u32,
}

impl BlockState {
    const EMPTY: BlockState = BlockState {
        seen: Seen::Not,
        live: Link(Link::NONE),
        first_close: u32::MAX,
        requested: u32::MAX,
    };

    /// The entry at `pos` closes the block there: what it frees.
    #[inline]
    fn close(&mut self, pos: usize) -> Link {
        if self.first_close == u32::MAX {
            self.first_close = pos as u32;
        }
        core::mem::replace(&mut self.live, Link(Link::NONE))
    }
}

/// A `record_function` annotation (its time is in its [`Slot`]).
#[derive(Clone, Copy, Debug)]
struct Annotation {
    device: u32,
    /// The `stage` is `START` (else it ends a range).
    start: bool,
    name: Value,
}

/// Reads a few named fields of dicts in one pass over their keys, each key string looked at
/// once (keys are shared through the pickle's memo): what [`Pickle::get`] gives for each name.
#[derive(Debug)]
struct Keys<const N: usize> {
    names: [&'static str; N],
    /// By string index: 0 not looked at yet, 1 none of the names, `2 + i` the name `i`.
    of: Vec<u8>,
}

impl<const N: usize> Keys<N> {
    fn new(names: [&'static str; N]) -> Self {
        Self {
            names,
            of: Vec::new(),
        }
    }

    /// Which of the names the key `k` is (its position in `names`). Inlined: it runs for
    /// every key of every trace entry, and the key was almost always looked at before.
    #[inline(always)]
    fn field(&mut self, p: &Pickle, k: Value) -> Option<usize> {
        let i = k.as_str()? as usize;
        let of = match self.of.get(i) {
            Some(&of) if of != 0 => of,
            _ => self.look_up(p, k, i),
        };
        usize::from(of).checked_sub(2)
    }

    /// Looks at key string `i` the first time it comes.
    #[cold]
    #[inline(never)]
    fn look_up(&mut self, p: &Pickle, k: Value, i: usize) -> u8 {
        if i >= self.of.len() {
            self.of.resize(i + 1, 0);
        }
        let s = p.str(k);
        self.of[i] = self
            .names
            .iter()
            .position(|&n| s == Some(n))
            .map_or(1, |f| f as u8 + 2);
        self.of[i]
    }

    /// The value of each name in `dict` (the last of a repeated key, as in Python).
    fn get(&mut self, p: &Pickle, dict: Value) -> [Option<Value>; N] {
        let mut out = [None; N];
        for &(k, v) in p.entries(dict) {
            if let Some(slot) = self.field(p, k).and_then(|f| out.get_mut(f)) {
                *slot = Some(v);
            }
        }
        out
    }
}

/// State of the replay between events.
struct Replay {
    /// Open ranges by (device, interned name).
    open: HashMap<(u32, StringId), Vec<RangeId>>,
    next_range: u64,
    /// Changes of the allocated bytes since the last pool sample, by device.
    since_sample: Vec<u32>,
    /// The interned `record_function` domain, once used.
    domain: Option<StringId>,
    /// Interned annotation names by pickle string index (names are shared through the memo).
    names: IntMap<u32, StringId>,
}

impl Default for Replay {
    fn default() -> Self {
        Self {
            open: HashMap::new(),
            next_range: 1,
            since_sample: Vec::new(),
            domain: None,
            names: IntMap::default(),
        }
    }
}

/// `Entry::size` of an entry without a (non-negative integer) size.
const NO_SIZE: u64 = u64::MAX;
/// `Entry::frames` and `Entry::action` of an entry without a list, or a string.
const NONE_INDEX: u32 = u32::MAX;

/// The fields of a trace entry the conversion reads, read once (40 bytes: there is one per
/// trace entry, a million or more).
#[derive(Clone, Copy, Debug)]
struct Entry {
    time_us: i64,
    addr: i64,
    /// The `size` field as written (requested bytes for blocks), [`NO_SIZE`] if none: sizes
    /// come from `i64`s, so they never reach it.
    size: u64,
    /// An index into [`EntryReader::streams`] (streams are pointers, but few).
    stream: u32,
    /// The `frames` list or tuple, as an index of the pickle's sequences, or [`NONE_INDEX`]
    /// (anything else has no frames either).
    frames: u32,
    /// The `action` as written (for messages about unknown ones), as an index of the
    /// pickle's strings, or [`NONE_INDEX`] when it is not a string.
    action: u32,
    kind: Action,
}

impl Entry {
    const EMPTY: Entry = Entry {
        time_us: 0,
        addr: 0,
        size: NO_SIZE,
        stream: 0,
        frames: NONE_INDEX,
        action: NONE_INDEX,
        kind: Action::Missing,
    };

    fn size(&self) -> Option<u64> {
        (self.size != NO_SIZE).then_some(self.size)
    }

    fn frames(&self) -> Option<Value> {
        (self.frames != NONE_INDEX).then_some(Value::List(self.frames))
    }
}

/// The actions the conversion knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
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
}

/// The fields of a trace entry the conversion reads, in the order of [`ENTRY_KEYS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Action,
    Addr,
    Size,
    Stream,
    TimeUs,
    Frames,
}

const ENTRY_KEYS: [&str; 6] = ["action", "addr", "size", "stream", "time_us", "frames"];
const ENTRY_FIELDS: [Field; 6] = [
    Field::Action,
    Field::Addr,
    Field::Size,
    Field::Stream,
    Field::TimeUs,
    Field::Frames,
];

/// Reads trace entries in one pass over their keys.
#[derive(Debug)]
struct EntryReader {
    /// Which field each key string is (keys are shared through the memo).
    keys: Keys<6>,
    /// Which action each string is, by string index (`None`: not looked at yet).
    actions: Vec<Option<Action>>,
    /// The distinct `stream` values, in order of appearance (`Entry::stream` indexes them),
    /// with their indexes.
    streams: Vec<u64>,
    stream_index: IntMap<u64, u32>,
}

impl Default for EntryReader {
    fn default() -> Self {
        Self {
            keys: Keys::new(ENTRY_KEYS),
            actions: Vec::new(),
            // Stream 0 (the default stream, and entries without one) is index 0.
            streams: alloc::vec![0],
            stream_index: IntMap::from_iter([(0, 0)]),
        }
    }
}

impl EntryReader {
    /// The entry, and whether the dict has an `action` (is a trace entry at all).
    fn read(&mut self, p: &Pickle, kv: impl Iterator<Item = (Value, Value)>) -> (Entry, bool) {
        let mut e = Entry::EMPTY;
        let mut has_action = false;
        for (k, v) in kv {
            let Some(field) = self.keys.field(p, k).and_then(|f| ENTRY_FIELDS.get(f)) else {
                continue;
            };
            // Later keys win, as in Python.
            match field {
                Field::Action => {
                    e.action = v.as_str().unwrap_or(NONE_INDEX);
                    e.kind = self.action(p, v);
                    has_action = true;
                }
                Field::Addr => e.addr = p.int(Some(v)).unwrap_or(0),
                Field::Size => {
                    e.size = p
                        .int(Some(v))
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(NO_SIZE);
                }
                Field::Stream => {
                    let s = p
                        .int(Some(v))
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(0);
                    e.stream = self.stream(s);
                }
                Field::TimeUs => e.time_us = p.int(Some(v)).unwrap_or(0),
                Field::Frames => {
                    e.frames = v.as_seq().unwrap_or(NONE_INDEX);
                }
            }
        }
        (e, has_action)
    }

    /// The index of a stream value.
    #[inline]
    fn stream(&mut self, s: u64) -> u32 {
        if s == 0 {
            return 0;
        }
        let next = self.streams.len() as u32;
        let i = *self.stream_index.entry(s).or_insert(next);
        if i == next {
            self.streams.push(s);
        }
        i
    }

    /// What an `action` value is, looked up once per string (actions are shared through the
    /// memo).
    fn action(&mut self, p: &Pickle, v: Value) -> Action {
        let Some(i) = v.as_str() else {
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
    p: &'p Pickle,
    root: Value,
    enc: S,
    summary: ImportSummary,
    interner: Interner,
    frames: HashMap<(StringId, StringId, u32), FrameId>,
    /// Frame dicts already converted, by arena index (PyTorch shares them between entries
    /// through the pickle's memo), and `frames` lists, by where their items are
    /// ([`Pickle::items_key`]: lists with the same frames share them). Most entries hit these.
    frame_dicts: IntMap<u32, FrameId>,
    frame_lists: IntMap<(u32, u32, bool), StackId>,
    entries: Vec<Entry>,
    /// `stream` values, indexed by `Entry::stream`.
    streams: Vec<u64>,
    /// The id and size of each block alive at time 0 (as numbered in `Plan::at_start`) and of
    /// each allocation of the history (by [`Link`] ordinal), once allocated: frees find their
    /// block here.
    start_ids: Vec<(AllocId, u64, u32)>,
    history_ids: Vec<(AllocId, u64, u32)>,
    /// Reserved and allocated bytes, by device.
    reserved: Vec<u64>,
    allocated: Vec<u64>,
    /// How the allocator sizes blocks; sizes of history allocations live at the snapshot, by
    /// history ordinal (see `Plan::final_sizes`).
    rule: BlockRule,
    final_sizes: IntMap<u32, u64>,
    /// The segments there are, by device: start address to index in `segments`, which holds
    /// each segment's end and the start addresses of the large-pool blocks allocated (not yet
    /// freed) in it. The free block an allocation comes from runs from its address to the next
    /// of these or its segment's end. Each block keeps its segment's index (with its id), so a
    /// free finds it without a search.
    segment_starts: Vec<BTreeMap<i64, u32>>,
    segments: Vec<Segment>,
    skipped: HashMap<String, u64>,
    t0_us: i64,
    last_ns: u64,
}

/// What the conversion knows before it writes anything: the replay order, the blocks from
/// before the history, and counts for sizing the sink.
struct Plan {
    order: Vec<Slot>,
    /// Where each device's trace entries end, in positions (they start where the previous
    /// device's end, the first at 0); annotations come after the last.
    device_ends: Vec<u32>,
    annotations: Vec<Annotation>,
    devices: u32,
    /// Blocks alive at time 0: ghosts (freed before the history allocates them), then final
    /// blocks the history does not allocate. A [`Link`] from the top numbers them.
    at_start: Vec<StartBlock>,
    /// What each trace entry's replay frees, by position ([`Link`]); stream-ordered frees, by
    /// position (a bit each). A stream-ordered free's completion (its bit set) holds the
    /// position of its request instead: it frees nothing, its block leaves its segment.
    links: Vec<Link>,
    stream_ordered: Vec<u64>,
    /// Reserved bytes at the start of the history, by device.
    reserved_start: Vec<u64>,
    /// Segments at the start of the history (start address, size), by device.
    segments_start: Vec<Vec<(i64, u64)>>,
    /// The size of each history allocation still live at the snapshot (by history ordinal):
    /// its block in the segment table.
    final_sizes: IntMap<u32, u64>,
    rule: BlockRule,
    hint: SinkHint,
}

/// The slot of a device's list (`v`, growing as needed: devices are bounded by the input).
fn per_device<T: Default + Clone>(v: &mut Vec<T>, device: u32) -> &mut T {
    let i = device as usize;
    if i >= v.len() {
        v.resize(i + 1, T::default());
    }
    &mut v[i]
}

impl<'p, S: RecordSink> Converter<'p, S> {
    /// Converts a parsed snapshot into the sink `make_sink` returns, given what the conversion
    /// will write. `entries` are the trace entries taken while parsing; `input_bytes` is the
    /// snapshot's size (its memo references may read containers again within a budget
    /// proportional to it, [`Repeats`]).
    fn convert(
        p: &'p Pickle,
        input_bytes: u64,
        mut reader: EntryReader,
        mut entries: Vec<Entry>,
        make_sink: impl FnOnce(&SinkHint) -> S,
    ) -> Result<(S, ImportSummary), ImportError> {
        let root = p.root.unwrap_or(Value::None);
        if p.get(root, "segments").is_none() && p.get(root, "device_traces").is_none() {
            return Err(ImportError::NotASnapshot);
        }
        let plan = Plan::new(
            p,
            root,
            &mut reader,
            &mut entries,
            Repeats::new(input_bytes),
        )?;
        let enc = make_sink(&plan.hint);
        let converter = Self {
            p,
            root,
            enc,
            summary: ImportSummary::default(),
            interner: Interner::default(),
            frames: HashMap::new(),
            frame_dicts: IntMap::default(),
            frame_lists: IntMap::default(),
            entries,
            streams: reader.streams,
            start_ids: Vec::new(),
            history_ids: Vec::new(),
            reserved: Vec::new(),
            allocated: Vec::new(),
            rule: BlockRule::default(),
            final_sizes: IntMap::default(),
            segment_starts: Vec::new(),
            segments: Vec::new(),
            skipped: HashMap::new(),
            t0_us: 0,
            last_ns: 0,
        };
        converter.run(plan)
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
        let list_key = frames
            .and_then(|f| self.p.items_key(f))
            .map(|(at, len)| (at, len, marker.is_some()));
        if let Some(&s) = list_key.and_then(|k| self.frame_lists.get(&k)) {
            return s;
        }
        let p = self.p;
        let mut s = StackId(0);
        let list = frames.map_or(&[][..], |f| p.items(f));
        for &fr in list
            .iter()
            .rev()
            .take(gpucollect_trace::model::MAX_STACK_DEPTH)
        {
            let f = match fr.as_dict() {
                Some(i) => match self.frame_dicts.get(&i) {
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
        let ns = ns_since(time_us, self.t0_us);
        self.last_ns = self.last_ns.max(ns);
        ns
    }

    fn pool_sample(&mut self, ts_nanos: u64, device: u32) {
        let reserved_bytes = self.reserved.get(device as usize).copied().unwrap_or(0);
        let used_bytes = self.allocated.get(device as usize).copied().unwrap_or(0);
        self.enc.emit(Record::PoolSample(PoolSample {
            ts_nanos,
            device: DeviceIdx(device),
            pool: 0,
            reserved_bytes,
            used_bytes,
            process: ProcessIdx(0),
        }));
    }

    /// Allocates a block of `(size, segment)` (its segment: where a large block takes its
    /// place, [`NO_SEGMENT`] for others); returns its id, size and segment.
    fn alloc(
        &mut self,
        ts_nanos: u64,
        device: u32,
        addr: i64,
        (size, segment): (u64, u32),
        stack: StackId,
        stream: u64,
    ) -> (AllocId, u64, u32) {
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
        let a = per_device(&mut self.allocated, device);
        *a = a.saturating_add(size);
        if let Some(s) = self.segments.get_mut(segment as usize) {
            let i = s.blocks.partition_point(|&b| b < addr);
            if s.blocks.get(i) != Some(&addr) {
                s.blocks.insert(i, addr);
            }
        }
        self.summary.allocations += 1;
        (id, size, segment)
    }

    /// The index of the segment of `device` that holds `addr` (the one starting last at or
    /// before it), [`NO_SEGMENT`] if none.
    fn segment_of(&self, device: u32, addr: i64) -> u32 {
        self.segment_starts
            .get(device as usize)
            .and_then(|m| m.range(..=addr).next_back())
            .map(|(_, &i)| i)
            .filter(|&i| self.segments.get(i as usize).is_some_and(|s| addr < s.end))
            .unwrap_or(NO_SEGMENT)
    }

    /// A large block at `addr` no longer takes its place in `segment`.
    fn leave(&mut self, segment: u32, addr: i64) {
        if let Some(s) = self.segments.get_mut(segment as usize)
            && let Ok(i) = s.blocks.binary_search(&addr)
        {
            s.blocks.remove(i);
        }
    }

    /// Adds a segment of `device`.
    fn add_segment(&mut self, device: u32, start: i64, size: u64) {
        let end = start.saturating_add(i64::try_from(size).unwrap_or(i64::MAX));
        let i = self.segments.len() as u32;
        self.segments.push(Segment {
            end,
            blocks: Vec::new(),
        });
        per_device(&mut self.segment_starts, device).insert(start, i);
    }

    /// The block `link` names, if any.
    fn block(&self, link: Link) -> Option<&(AllocId, u64, u32)> {
        match link.0 {
            Link::NONE => None,
            l if l > Link::LAST_HISTORY => self.start_ids.get((Link::FIRST_START - l) as usize),
            l => self.history_ids.get(l as usize),
        }
    }

    /// Frees the block `link` names, if any; returns its size and segment.
    fn free(
        &mut self,
        ts_nanos: u64,
        device: u32,
        link: Link,
        kind: FreeKind,
        stream: u64,
    ) -> Option<(u64, u32)> {
        if let Some(&(id, size, segment)) = self.block(link) {
            self.enc.emit(Record::Free(Free {
                ts_nanos,
                alloc: id,
                kind,
                stream,
                ..Free::default()
            }));
            let a = per_device(&mut self.allocated, device);
            *a = a.saturating_sub(size);
            return Some((size, segment));
        }
        None
    }

    /// The size of the block the next allocation of the history gets for `requested` bytes at
    /// `addr`: its block in the segment table when it is live at the snapshot, else the split
    /// rule applied to the free block it comes from (from `addr` to the next allocated block
    /// or the end of its segment), else the rounded request. Also the segment where a large
    /// block takes its place ([`NO_SEGMENT`] for others).
    fn block_size(&mut self, device: u32, addr: i64, requested: u64) -> (u64, u32) {
        let rounded = self.rule.round(requested);
        let ordinal = self.history_ids.len() as u32;
        let known = self.final_sizes.get(&ordinal).copied();
        // Only large blocks take a place in a segment (small ones never share one with them).
        let segment = if !self.rule.expandable
            && (BlockRule::large(rounded) || known.is_some_and(BlockRule::large))
        {
            self.segment_of(device, addr)
        } else {
            NO_SEGMENT
        };
        let size = if let Some(size) = known {
            self.summary.sized_from_segments += 1;
            size
        } else if BlockRule::large(rounded) && !self.rule.expandable {
            match self.free_extent(segment, addr) {
                Some(free) => self.rule.block(rounded, free),
                None => {
                    self.summary.unplaced_blocks += 1;
                    rounded
                }
            }
        } else {
            rounded
        };
        if size > rounded {
            self.summary.unsplit_blocks += 1;
        }
        let segment = if BlockRule::large(size) {
            segment
        } else {
            NO_SEGMENT
        };
        (size, segment)
    }

    /// The free bytes from `addr` to the next allocated large-pool block of `segment` or its
    /// end, if there is such a segment.
    fn free_extent(&self, segment: u32, addr: i64) -> Option<u64> {
        let s = self.segments.get(segment as usize)?;
        let next = s.blocks[s.blocks.partition_point(|&b| b <= addr)..]
            .first()
            .copied()
            .unwrap_or(s.end);
        u64::try_from(next - addr).ok()
    }

    /// Replays an annotation: a `record_function` range begins or ends.
    fn replay_annotation(&mut self, ts: u64, a: &Annotation, r: &mut Replay) {
        let p = self.p;
        let name = p.str(a.name).unwrap_or("?");
        let cached = a.name.as_str().and_then(|i| r.names.get(&i).copied());
        if a.start {
            let range = RangeId(r.next_range);
            r.next_range += 1;
            let n = match cached {
                Some(n) => n,
                None => {
                    let n = self.string(name);
                    if let Some(i) = a.name.as_str() {
                        r.names.insert(i, n);
                    }
                    n
                }
            };
            let domain = match r.domain {
                Some(d) => d,
                None => *r.domain.insert(self.string("record_function")),
            };
            self.enc.emit(Record::RangeBegin(RangeBegin {
                ts_nanos: ts,
                range,
                name: n,
                domain,
                ..RangeBegin::default()
            }));
            r.open.entry((a.device, n)).or_default().push(range);
            self.summary.ranges += 1;
        } else if let Some(range) = cached
            .or_else(|| self.interner.lookup(name))
            .and_then(|n| r.open.get_mut(&(a.device, n)))
            .and_then(Vec::pop)
        {
            self.enc.emit(Record::RangeEnd(RangeEnd {
                ts_nanos: ts,
                range,
            }));
        } else {
            self.skip("annotation end without start");
        }
    }

    /// Replays one trace entry (a method of its own so that WebAssembly engines that tier up
    /// hot functions run it optimized after the first few thousand entries).
    #[inline(never)]
    fn replay_entry(
        &mut self,
        ts: u64,
        d: u32,
        en: &Entry,
        link: Link,
        stream_ordered: bool,
        since_sample: &mut Vec<u32>,
    ) {
        let addr = en.addr;
        let stream = self.streams.get(en.stream as usize).copied().unwrap_or(0);
        let size = en.size();
        match (en.kind, size) {
            (Action::Alloc, Some(requested)) => {
                // A block allocated twice without a free: the old one is closed first.
                if let Some((_, segment)) = self.free(ts, d, link, FreeKind::Other, stream) {
                    self.leave(segment, addr);
                }
                let (size, segment) = self.block_size(d, addr, requested);
                let stack = self.stack(en.frames(), None);
                let block = self.alloc(ts, d, addr, (size, segment), stack, stream);
                self.history_ids.push(block);
            }
            // The request frees the block (`memory_allocated()` drops then); a stream-ordered
            // one stays in its segment, not reusable, until the free completes.
            (Action::FreeRequested, _) => {
                let kind = if stream_ordered {
                    FreeKind::StreamOrdered
                } else {
                    FreeKind::Immediate
                };
                if let Some((_, segment)) = self.free(ts, d, link, kind, stream)
                    && !stream_ordered
                {
                    self.leave(segment, addr);
                }
            }
            // The completion of a stream-ordered free: its block (`link`, resolved from the
            // request by `run`) leaves its segment.
            (Action::FreeCompleted, _) if stream_ordered => {
                if let Some(&(_, _, segment)) = self.block(link) {
                    self.leave(segment, addr);
                }
            }
            (Action::FreeCompleted, _) => {
                if let Some((_, segment)) = self.free(ts, d, link, FreeKind::Immediate, stream) {
                    self.leave(segment, addr);
                }
            }
            (Action::SegmentAdd, Some(size)) => {
                self.add_segment(d, addr, size);
                let r = per_device(&mut self.reserved, d);
                *r = r.saturating_add(size);
                self.pool_sample(ts, d);
                return;
            }
            (Action::SegmentRemove, Some(size)) => {
                per_device(&mut self.segment_starts, d).remove(&addr);
                let r = per_device(&mut self.reserved, d);
                *r = r.saturating_sub(size);
                self.pool_sample(ts, d);
                return;
            }
            (Action::Oom, _) => {
                // The entry's `addr` is the device's free bytes (cudaMemGetInfo) at the failure.
                self.enc.emit(Record::DeviceSample(DeviceSample {
                    ts_nanos: ts,
                    device: DeviceIdx(d),
                    free_bytes: u64::try_from(addr).unwrap_or(0),
                    ..DeviceSample::default()
                }));
                let stack = self.stack(en.frames(), None);
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
                let other = if en.action == NONE_INDEX {
                    ""
                } else {
                    self.p.str(Value::Str(en.action)).unwrap_or("")
                };
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
        let n = per_device(since_sample, d);
        *n += 1;
        if *n >= 64 {
            *n = 0;
            self.pool_sample(ts, d);
        }
    }

    fn run(mut self, plan: Plan) -> Result<(S, ImportSummary), ImportError> {
        let p = self.p;
        let Plan {
            order,
            device_ends,
            annotations,
            devices,
            at_start,
            links,
            stream_ordered,
            reserved_start,
            segments_start,
            final_sizes,
            rule,
            hint,
        } = plan;
        self.rule = rule;
        self.final_sizes = final_sizes;
        for (d, segments) in segments_start.into_iter().enumerate() {
            for (start, size) in segments {
                self.add_segment(d as u32, start, size);
            }
        }
        self.start_ids.reserve(at_start.len());
        self.history_ids.reserve(hint.allocs);
        self.summary.trace_entries = u64::from(device_ends.last().copied().unwrap_or(0));
        self.t0_us = order.first().map_or(0, |o| o.time_us);
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
                    let v = match p.kind(*v) {
                        Kind::Str(_) => String::from(p.str(*v).unwrap_or("")),
                        Kind::Int(i) => format!("{i}"),
                        Kind::Float(f) => format!("{f}"),
                        Kind::Bool(b) => format!("{b}"),
                        Kind::None => String::from("None"),
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

        // Time 0: reserved memory and blocks from before the history.
        self.reserved = reserved_start;
        self.allocated = alloc::vec![0; devices as usize];
        for b in at_start {
            let stack = self.stack(b.frames, Some(BEFORE_HISTORY));
            let segment = if BlockRule::large(b.size) && !self.rule.expandable {
                self.segment_of(b.device, b.addr)
            } else {
                NO_SEGMENT
            };
            let block = self.alloc(0, b.device, b.addr, (b.size, segment), stack, 0);
            self.start_ids.push(block);
            if b.ghost {
                self.summary.ghost_frees += 1;
            } else {
                self.summary.reconstructed_blocks += 1;
            }
        }
        for d in 0..devices {
            self.pool_sample(0, d);
        }

        // Pass 2: replay.
        let mut replay = Replay {
            since_sample: alloc::vec![0; devices as usize],
            ..Replay::default()
        };
        let traced = device_ends.last().copied().unwrap_or(0);
        for o in &order {
            let ts = self.ts(o.time_us);
            if o.pos < traced {
                let d = device_ends.partition_point(|&end| end <= o.pos) as u32;
                if let Some(en) = self.entries.get(o.entry as usize).copied() {
                    let i = o.pos as usize;
                    let mut link = links.get(i).copied().unwrap_or(Link(Link::NONE));
                    let so = stream_ordered
                        .get(i / 64)
                        .is_some_and(|w| w >> (i % 64) & 1 != 0);
                    if so && en.kind == Action::FreeCompleted {
                        // The position of its request, whose block it is.
                        link = links
                            .get(link.0 as usize)
                            .copied()
                            .unwrap_or(Link(Link::NONE));
                    }
                    self.replay_entry(ts, d, &en, link, so, &mut replay.since_sample);
                }
            } else if let Some(a) = annotations.get((o.pos - traced) as usize) {
                self.replay_annotation(ts, a, &mut replay);
            }
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

impl Plan {
    /// Orders the events, and runs pass 1: which blocks are freed before the history allocates
    /// them (ghosts), how much reserved memory changes during the history, how much each kind
    /// of record the conversion will write. Trace entries not taken while parsing (JSON, or
    /// dicts without an action) are read here, into `entries`. Device traces, trace entries,
    /// segments and blocks read again through memo references spend `repeats`; past it, the
    /// snapshot is refused ([`ImportError::Shared`]) before anything grows with them.
    fn new(
        p: &Pickle,
        root: Value,
        reader: &mut EntryReader,
        entries: &mut Vec<Entry>,
        mut repeats: Repeats,
    ) -> Result<Self, ImportError> {
        let traces = p.get(root, "device_traces");
        let segments = p.get(root, "segments");
        let has_segments = segments.is_some();
        let lists: Vec<&[Value]> = traces
            .map_or(&[][..], |t| p.items(t))
            .iter()
            .map(|&l| repeats.items(p, l))
            .collect::<Result<_, _>>()?;
        let traced: usize = lists.iter().map(|l| l.len()).sum();
        let annotated = p
            .get(root, "external_annotations")
            .map_or(&[][..], |a| p.items(a));
        repeats.events(traced)?;
        repeats.events(annotated.len())?;
        // Every event, in position order: each device's entries, then the annotations.
        let mut slots: Vec<Slot> = Vec::with_capacity(traced + annotated.len());
        let mut device_ends = Vec::with_capacity(lists.len());
        for list in &lists {
            for &v in *list {
                repeats.dict(p, v)?;
                let entry = match p.taken(v) {
                    Some(tag) => tag,
                    None => {
                        // Not taken while parsing (JSON, or a dict without an action).
                        if entries.capacity() == entries.len() {
                            entries.reserve(traced.saturating_sub(slots.len()));
                        }
                        let (e, _) = reader.read(p, p.entries(v).iter().copied());
                        entries.push(e);
                        (entries.len() - 1) as u32
                    }
                };
                slots.push(Slot {
                    time_us: entries.get(entry as usize).map_or(0, |e| e.time_us),
                    pos: slots.len() as u32,
                    entry,
                });
            }
            device_ends.push(slots.len() as u32);
        }
        let mut annotations = Vec::with_capacity(annotated.len());
        let mut keys = Keys::new(["time_us", "device", "name", "stage"]);
        // Whether each stage string is START, by string index (1 no, 2 yes).
        let mut starts: Vec<u8> = Vec::new();
        for &a in annotated {
            repeats.dict(p, a)?;
            let [time_us, device, name, stage] = keys.get(p, a);
            let time_us = p.int(time_us).unwrap_or(0);
            let device = p.int(device).unwrap_or(0);
            let name = name.unwrap_or(Value::None);
            let start = match stage.and_then(Value::as_str) {
                Some(i) => {
                    let i = i as usize;
                    if i >= starts.len() {
                        starts.resize(i + 1, 0);
                    }
                    if starts[i] == 0 {
                        let start = p
                            .str(Value::Str(i as u32))
                            .is_some_and(|s| s.eq_ignore_ascii_case("START"));
                        starts[i] = 1 + u8::from(start);
                    }
                    starts[i] == 2
                }
                _ => false,
            };
            slots.push(Slot {
                time_us,
                pos: slots.len() as u32,
                entry: 0,
            });
            annotations.push(Annotation {
                device: device.clamp(0, 1 << 16) as u32,
                start,
                name,
            });
        }
        let mut bounds = alloc::vec![0];
        bounds.extend(device_ends.iter().map(|&e| e as usize));
        bounds.push(slots.len());
        let order = replay_order(slots, &bounds);

        let rule = BlockRule::of(p, p.get(root, "allocator_settings"));
        // Devices: from the traces and the segments.
        let mut segment_keys = Keys::new(["device", "total_size", "blocks", "address"]);
        let segments: Vec<[Option<Value>; 4]> = segments
            .map_or(&[][..], |s| p.items(s))
            .iter()
            .map(|&s| repeats.dict(p, s).map(|()| segment_keys.get(p, s)))
            .collect::<Result<_, _>>()?;
        let device_of = |s: &[Option<Value>; 4]| p.int(s[0]).unwrap_or(0).clamp(0, 1 << 16) as u32;
        let mut devices = lists.len() as u32;
        for s in &segments {
            devices = devices.max(device_of(s) + 1);
        }

        // The final state, from the segments.
        let mut final_reserved: Vec<u64> = alloc::vec![0; devices as usize];
        let mut final_blocks: Vec<(u32, i64, u64, Option<Value>)> = Vec::new();
        let size = |v: Option<Value>| p.int(v).and_then(|v| u64::try_from(v).ok());
        let mut block_keys = Keys::new(["state", "address", "size", "frames"]);
        let mut final_segments: Vec<(u32, i64, u64)> = Vec::with_capacity(segments.len());
        for s in &segments {
            let d = device_of(s);
            let r = per_device(&mut final_reserved, d);
            *r = r.saturating_add(size(s[1]).unwrap_or(0));
            if let Some(addr) = p.int(s[3]) {
                final_segments.push((d, addr, size(s[1]).unwrap_or(0)));
            }
            let blocks = repeats.items(p, s[2].unwrap_or(Value::None))?;
            repeats.events(blocks.len())?;
            for &b in blocks {
                repeats.dict(p, b)?;
                let [state, addr, size_bytes, frames] = block_keys.get(p, b);
                let state = state.and_then(|v| p.str(v)).unwrap_or("");
                if state.starts_with("active") {
                    let addr = p.int(addr).unwrap_or(0);
                    let size = size(size_bytes).unwrap_or(0);
                    final_blocks.push((d, addr, size, frames));
                }
            }
        }
        // Pass 1: the replay's blocks, by device and address, so that the replay itself needs
        // no map. One map per device, keyed by the address alone: one word to hash and 24-byte
        // buckets. Each is sized for the addresses its device's entries are likely to use (the
        // caching allocator reuses blocks, so about one per 16 entries), so that it does not
        // rehash as it grows.
        let mut blocks: Vec<IntMap<i64, BlockState>> = device_ends
            .iter()
            .scan(0, |start, &end| {
                let len = end - core::mem::replace(start, end);
                Some(IntMap::with_capacity_and_hasher(
                    len as usize / 16,
                    Default::default(),
                ))
            })
            .collect();
        let mut links = alloc::vec![Link(Link::NONE); traced];
        let mut stream_ordered = alloc::vec![0u64; traced.div_ceil(64)];
        let mut history_allocs: u32 = 0;
        let t0_us = order.first().map_or(0, |o| o.time_us);
        // Blocks alive at time 0: the ghosts, found here, then final blocks (below).
        let mut at_start: Vec<StartBlock> = Vec::new();
        let mut reserved_delta: Vec<i128> = alloc::vec![0; devices as usize];
        let mut hint = SinkHint {
            marks: 1,
            ..SinkHint::default()
        };
        let (mut frees, mut segment_changes) = (0, 0);
        // The first segment entry of the history at each (device, address), and whether it adds
        // the segment (then the segment is not there at the start) and its size.
        let mut first_segment_event: IntMap<(u32, i64), (bool, u64)> = IntMap::default();
        let traced = traced as u32;
        for (oi, o) in order.iter().enumerate().filter(|(_, o)| o.pos < traced) {
            let Some(en) = entries.get(o.entry as usize) else {
                continue;
            };
            let d = device_ends.partition_point(|&end| end <= o.pos) as u32;
            let addr = en.addr;
            let size = if matches!(
                en.kind,
                Action::SegmentAdd | Action::SegmentRemove | Action::SegmentOther
            ) {
                en.size().unwrap_or(0)
            } else {
                // Ghosts' sizes: the rounded request (the block they had is not known).
                rule.round(en.size().unwrap_or(0))
            };
            let pos = o.pos as usize;
            match en.kind {
                Action::Alloc => {
                    let b = per_device(&mut blocks, d)
                        .entry(addr)
                        .or_insert(BlockState::EMPTY);
                    b.seen = Seen::Allocated;
                    if en.size().is_some() {
                        hint.allocs += 1;
                        // The replay allocates it (and frees a block still there first); a
                        // free requested there before is superseded.
                        b.requested = u32::MAX;
                        links[pos] = b.close(pos);
                        b.live = Link(history_allocs);
                        history_allocs += 1;
                    }
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    let completed = en.kind == Action::FreeCompleted;
                    frees += 1;
                    let b = per_device(&mut blocks, d)
                        .entry(addr)
                        .or_insert(BlockState::EMPTY);
                    if b.seen == Seen::Not {
                        // Freed before the history allocates it: a ghost, alive from time 0
                        // until the replay first closes a block at its address, which may have
                        // been earlier (a later ghost there replaces an earlier one).
                        let ghost = Link(Link::FIRST_START - at_start.len() as u32);
                        match b.first_close {
                            u32::MAX => b.live = ghost,
                            q => links[q as usize] = ghost,
                        }
                        b.seen = Seen::Ghost;
                        at_start.push(StartBlock {
                            device: d,
                            addr,
                            size,
                            frames: en.frames(),
                            ghost: true,
                        });
                    } else if completed {
                        b.seen = Seen::Not;
                    }
                    if !completed {
                        // `memory_allocated()` drops at the request: the replay frees the
                        // block here, stream-ordered until its completion says otherwise.
                        b.requested = oi as u32;
                        stream_ordered[pos / 64] |= 1 << (pos % 64);
                        links[pos] = b.close(pos);
                        continue;
                    }
                    let requested = core::mem::replace(&mut b.requested, u32::MAX);
                    match order.get(requested as usize) {
                        // Completed when requested: an immediate free.
                        Some(r) if ns_since(r.time_us, t0_us) >= ns_since(en.time_us, t0_us) => {
                            let at = r.pos as usize;
                            stream_ordered[at / 64] &= !(1 << (at % 64));
                        }
                        // Stream-ordered: the completion ends the block's place in its segment;
                        // its link holds the request's position (marked by its bit).
                        Some(r) => {
                            links[pos] = Link(r.pos);
                            stream_ordered[pos / 64] |= 1 << (pos % 64);
                        }
                        // A free completed without a request (older snapshots' `free`).
                        None => links[pos] = b.close(pos),
                    }
                }
                Action::SegmentAdd => {
                    segment_changes += 1;
                    *per_device(&mut reserved_delta, d) += i128::from(size);
                    if en.size().is_some() {
                        first_segment_event.entry((d, addr)).or_insert((true, size));
                    }
                }
                Action::SegmentRemove => {
                    segment_changes += 1;
                    *per_device(&mut reserved_delta, d) -= i128::from(size);
                    if en.size().is_some() {
                        first_segment_event
                            .entry((d, addr))
                            .or_insert((false, size));
                    }
                }
                Action::Oom => hint.failed += 1,
                Action::Snapshot | Action::Annotate => hint.marks += 1,
                _ => {}
            }
        }
        // Blocks alive at time 0: the ghosts, then the final blocks the history does not
        // leave allocated (each once): the replay frees them where it first closes a block at
        // their address while it has none there.
        let mut started: IntSet<(u32, i64)> = at_start.iter().map(|b| (b.device, b.addr)).collect();
        let mut final_sizes: IntMap<u32, u64> = IntMap::default();
        for (device, addr, size, frames) in final_blocks {
            let key = (device, addr);
            let b = blocks
                .get(device as usize)
                .and_then(|m| m.get(&addr))
                .copied()
                .unwrap_or(BlockState::EMPTY);
            if b.seen == Seen::Allocated {
                // The history's last allocation there is this block: the table has its size.
                if b.live.0 <= Link::LAST_HISTORY {
                    final_sizes.insert(b.live.0, size);
                }
                continue;
            }
            if !started.insert(key) {
                continue;
            }
            if let Some(link) = links.get_mut(b.first_close as usize) {
                *link = Link(Link::FIRST_START - at_start.len() as u32);
            }
            at_start.push(StartBlock {
                device,
                addr,
                size,
                frames,
                ghost: false,
            });
        }
        let reserved_start = (0..devices as usize)
            .map(|d| {
                let delta = reserved_delta.get(d).copied().unwrap_or(0);
                let end = i128::from(final_reserved.get(d).copied().unwrap_or(0));
                let start = if has_segments {
                    (end - delta).max(0)
                } else {
                    (-delta).max(0)
                };
                u64::try_from(start).unwrap_or(u64::MAX)
            })
            .collect();
        // Segments at the start: those of the final table the history does not add or remove,
        // and those whose first entry removes them.
        let mut segments_start: Vec<Vec<(i64, u64)>> = alloc::vec![Vec::new(); devices as usize];
        for (d, addr, size) in final_segments {
            if !first_segment_event.contains_key(&(d, addr)) {
                per_device(&mut segments_start, d).push((addr, size));
            }
        }
        for (&(d, addr), &(added, size)) in &first_segment_event {
            if !added {
                per_device(&mut segments_start, d).push((addr, size));
            }
        }
        hint.allocs += at_start.len();
        hint.changes = hint.allocs + frees;
        hint.pool_samples = segment_changes + hint.changes / 64 + 3 * devices as usize + 16;
        Ok(Plan {
            order,
            device_ends,
            annotations,
            devices,
            at_start,
            links,
            stream_ordered,
            reserved_start,
            segments_start,
            final_sizes,
            rule,
            hint,
        })
    }
}

/// What reading a snapshot's lists and dicts again costs. A snapshot names each device trace,
/// trace entry, segment and block once: `pickle.dumps` writes each object once and names it
/// again with a memo reference (2 or 5 bytes) only when the very same object comes again,
/// which PyTorch's snapshots do for frames (whose conversion is cached, so they cost nothing
/// again) and never for these. Reading one again spends its length (at least 1) from a budget
/// of one per [`Repeats::BYTES_PER_REPEAT`] bytes of input plus [`Repeats::FREE`]; past it the
/// snapshot is refused. So what the conversion reads, and the memory it takes, stay
/// proportional to the input: 2,000 segments naming one memoized list of 2,000 blocks would
/// be 4 million blocks from 100 KB.
#[derive(Debug)]
struct Repeats {
    /// Lists and dicts read so far, a bit each by arena index.
    seqs: Vec<u64>,
    dicts: Vec<u64>,
    left: u64,
    input_bytes: u64,
    limit: u64,
    /// What [`Repeats::events`] may still count, of `events_limit`.
    events_left: u64,
    events_limit: u64,
}

impl Repeats {
    /// Input bytes per value read again: a read costs at most one event or block (a few
    /// dozen bytes of memory).
    const BYTES_PER_REPEAT: u64 = 16;
    /// Values any snapshot may read again (a few shared lists in a hand-made snapshot).
    const FREE: u64 = 1 << 16;
    /// Input bytes per trace entry, annotation or block (each takes about 200 bytes of
    /// memory in the conversion and the model): a PyTorch snapshot takes 50 or more for each
    /// (keys through the memo, an address, a size, a time, frames).
    const BYTES_PER_EVENT: u64 = 32;
    /// Trace entries, annotations and blocks any snapshot may have.
    const FREE_EVENTS: u64 = 1 << 16;

    fn new(input_bytes: u64) -> Self {
        let limit = input_bytes / Self::BYTES_PER_REPEAT + Self::FREE;
        let events_limit = Self::events_limit(input_bytes);
        Self {
            seqs: Vec::new(),
            dicts: Vec::new(),
            left: limit,
            input_bytes,
            limit,
            events_left: events_limit,
            events_limit,
        }
    }

    /// The trace entries, annotations and blocks a snapshot of `input_bytes` may have.
    const fn events_limit(input_bytes: u64) -> u64 {
        input_bytes / Self::BYTES_PER_EVENT + Self::FREE_EVENTS
    }

    /// Counts `n` trace entries, annotations or blocks.
    fn events(&mut self, n: usize) -> Result<(), ImportError> {
        match self.events_left.checked_sub(n as u64) {
            Some(left) => {
                self.events_left = left;
                Ok(())
            }
            None => Err(ImportError::TooManyEvents {
                input_bytes: self.input_bytes,
                limit: self.events_limit,
            }),
        }
    }

    /// Marks `i` read; whether it was before.
    fn seen(bits: &mut Vec<u64>, i: u32) -> bool {
        let (word, bit) = (i as usize / 64, i % 64);
        if word >= bits.len() {
            bits.resize(word + 1, 0);
        }
        let seen = bits[word] >> bit & 1 != 0;
        bits[word] |= 1 << bit;
        seen
    }

    fn spend(&mut self, n: usize) -> Result<(), ImportError> {
        match self.left.checked_sub(n as u64) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(ImportError::Shared {
                input_bytes: self.input_bytes,
                limit: self.limit,
            }),
        }
    }

    /// The items of a list or tuple (none for anything else), spending their number if it
    /// was read before.
    fn items<'p>(&mut self, p: &'p Pickle, v: Value) -> Result<&'p [Value], ImportError> {
        let items = p.items(v);
        if let Some(i) = v.as_seq()
            && Self::seen(&mut self.seqs, i)
        {
            self.spend(items.len())?;
        }
        Ok(items)
    }

    /// Spends a dict's entries (at least 1: a trace entry taken while parsing keeps none) if
    /// it was read before.
    fn dict(&mut self, p: &Pickle, v: Value) -> Result<(), ImportError> {
        if let Some(i) = v.as_dict()
            && Self::seen(&mut self.dicts, i)
        {
            self.spend(p.entries(v).len().max(1))?;
        }
        Ok(())
    }
}

/// Nanoseconds from `t0_us` to `time_us` (0 before it), as the replay writes times.
fn ns_since(time_us: i64, t0_us: i64) -> u64 {
    u64::try_from(time_us.saturating_sub(t0_us))
        .unwrap_or(0)
        .saturating_mul(1000)
}

/// The largest request of the caching allocator's small pool (`kSmallSize`): larger requests
/// are served from the large pool, whose free blocks are split only when more than this is
/// left over.
pub const SMALL_REQUEST_MAX_BYTES: u64 = 1 << 20;

/// The caching allocator's rules for the size of the block it hands out for a request, as
/// `allocator_settings` configure them (CUDACachingAllocator.cpp: `round_size`,
/// `should_split`). Trace entries carry the requested size, while `memory_allocated()` and the
/// segments count whole blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BlockRule {
    /// `max_split_size`: large-pool blocks are split only for requests below it (`u64::MAX`:
    /// no limit, written as -1 in `allocator_settings`).
    max_split_bytes: u64,
    /// `expandable_segments`: every pool splits off any remainder of 512 bytes or more.
    expandable: bool,
    /// `roundup_power2_divisions`, by power-of-two interval from 1 MiB (index 0: below 2 MiB,
    /// the last one: everything above); 0 or 1 round to 512 bytes.
    divisions: [u64; 16],
}

impl Default for BlockRule {
    fn default() -> Self {
        Self {
            max_split_bytes: u64::MAX,
            expandable: false,
            divisions: [0; 16],
        }
    }
}

impl BlockRule {
    /// The rule `allocator_settings` describe (the defaults where a setting is missing).
    fn of(p: &Pickle, settings: Option<Value>) -> Self {
        let mut rule = Self::default();
        let Some(settings) = settings else {
            return rule;
        };
        let [max_split, expandable, divisions] = Keys::new([
            "max_split_size",
            "expandable_segments",
            "roundup_power2_divisions",
        ])
        .get(p, settings);
        if let Some(n) = p.int(max_split).and_then(|n| u64::try_from(n).ok())
            && n > 0
        {
            rule.max_split_bytes = n;
        }
        rule.expandable = match expandable.map(|v| p.kind(v)) {
            Some(Kind::Bool(b)) => b,
            Some(Kind::Int(i)) => i != 0,
            _ => false,
        };
        // A dict of interval (MiB, as a string) to divisions; older versions wrote a list.
        if let Some(d) = divisions {
            match p.kind(d) {
                Kind::Dict(_) => {
                    for &(k, v) in p.entries(d) {
                        let mib = p.str(k).and_then(|s| s.parse::<u64>().ok());
                        let n = p.int(Some(v)).and_then(|n| u64::try_from(n).ok());
                        if let (Some(mib), Some(n)) = (mib, n)
                            && mib.is_power_of_two()
                            && let Some(slot) =
                                rule.divisions.get_mut(mib.trailing_zeros() as usize)
                        {
                            *slot = n;
                        }
                    }
                }
                Kind::List(_) | Kind::Tuple(_) => {
                    for (slot, &v) in rule.divisions.iter_mut().zip(p.items(d)) {
                        *slot = p
                            .int(Some(v))
                            .and_then(|n| u64::try_from(n).ok())
                            .unwrap_or(0);
                    }
                }
                _ => {}
            }
        }
        rule
    }

    /// The size a request is rounded to (`round_size`): at least 512 bytes, a multiple of 512,
    /// or the next of `divisions` equal steps between two powers of two where configured.
    fn round(&self, requested: u64) -> u64 {
        if requested == 0 {
            return 0;
        }
        if requested < MIN_BLOCK_BYTES {
            return MIN_BLOCK_BYTES;
        }
        let interval =
            (requested.ilog2().saturating_sub(20) as usize).min(self.divisions.len() - 1);
        let divisions = self.divisions[interval];
        if divisions > 1 && requested > MIN_BLOCK_BYTES.saturating_mul(divisions) {
            if requested.is_power_of_two() {
                return requested;
            }
            let floor = 1u64 << requested.ilog2();
            let step = floor >> divisions.ilog2();
            if step == 0 {
                return floor.saturating_mul(2);
            }
            let down = requested & !(step - 1);
            return if down == requested {
                requested
            } else {
                down.saturating_add(step)
            };
        }
        requested
            .div_ceil(MIN_BLOCK_BYTES)
            .saturating_mul(MIN_BLOCK_BYTES)
    }

    /// Whether a request of `rounded` bytes comes from the large pool.
    const fn large(rounded: u64) -> bool {
        rounded > SMALL_REQUEST_MAX_BYTES
    }

    /// The block a request of `rounded` bytes gets from a free block of `free` bytes
    /// (`should_split`): `rounded` where the remainder is split off, else the whole free block.
    /// The small pool (and expandable segments) split any remainder of 512 bytes or more; the
    /// large pool only one above 1 MiB, and only for requests below `max_split_size`.
    fn block(&self, rounded: u64, free: u64) -> u64 {
        let remainder = free.saturating_sub(rounded);
        let split = if !Self::large(rounded) || self.expandable {
            remainder >= MIN_BLOCK_BYTES
        } else {
            rounded < self.max_split_bytes && remainder > SMALL_REQUEST_MAX_BYTES
        };
        if split || free < rounded {
            rounded
        } else {
            free
        }
    }
}

/// Every event in replay order: by time, then by position (devices in order, annotations
/// last). Each source (`bounds` has where each starts and ends: a device's entries, the
/// annotations) is nearly in time order already, so each is ordered by insertion with a bounded
/// reach (a full sort when an entry is far out of place), then the sources are merged.
/// Positions are unique, so this is exactly the order a full sort gives, in about linear time.
fn replay_order(mut slots: Vec<Slot>, bounds: &[usize]) -> Vec<Slot> {
    let mut runs: Vec<(usize, usize)> = bounds
        .windows(2)
        .map(|w| (w[0], w[1]))
        .filter(|&(start, end)| start < end && end <= slots.len())
        .collect();
    for &(start, end) in &runs {
        sort_nearly_sorted(&mut slots[start..end]);
    }
    if runs.len() <= MERGE_IN_PLACE_RUNS {
        // Each run merged into the ones before it, in place, from the back: only the run is
        // copied (the annotations are few; devices are few), not every event.
        let mut run = Vec::new();
        for &(start, end) in runs.iter().skip(1) {
            run.clear();
            run.extend_from_slice(&slots[start..end]);
            merge_back(&mut slots[..end], &run);
        }
        return slots;
    }
    // Many runs: merged in pairs, between two buffers (linear per round, whatever the runs).
    let mut out: Vec<Slot> = Vec::new();
    while runs.len() > 1 {
        out.clear();
        out.reserve(slots.len());
        let mut merged = Vec::with_capacity(runs.len().div_ceil(2));
        for pair in runs.chunks(2) {
            let start = out.len();
            match *pair {
                [(a0, a1), (b0, b1)] => merge_into(&slots[a0..a1], &slots[b0..b1], &mut out),
                _ => {
                    for &(s0, s1) in pair {
                        out.extend_from_slice(&slots[s0..s1]);
                    }
                }
            }
            merged.push((start, out.len()));
        }
        core::mem::swap(&mut slots, &mut out);
        runs = merged;
    }
    slots
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

/// Up to this many runs are merged in place by [`merge_back`] (each pass may move every event
/// before the run, so many runs are merged in pairs instead).
const MERGE_IN_PLACE_RUNS: usize = 8;

/// Merges `run` (sorted) into `v`, whose sorted events come first and whose last `run.len()`
/// places hold a copy of `run`: from the back, so only the events after `run`'s first move.
fn merge_back<T: Ord + Copy>(v: &mut [T], run: &[T]) {
    let (mut i, mut j, mut w) = (v.len() - run.len(), run.len(), v.len());
    while j > 0 {
        w -= 1;
        if i > 0 && v[i - 1] > run[j - 1] {
            v[w] = v[i - 1];
            i -= 1;
        } else {
            v[w] = run[j - 1];
            j -= 1;
        }
    }
}

/// Appends the merge of two sorted slices to `out`.
fn merge_into<T: Ord + Copy>(a: &[T], b: &[T], out: &mut Vec<T>) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_round_as_the_caching_allocator_rounds_them() {
        let plain = BlockRule::default();
        assert_eq!(plain.round(0), 0);
        assert_eq!(plain.round(4), 512);
        assert_eq!(plain.round(513), 1024);
        assert_eq!(plain.round(1200 * MIB + 1), 1200 * MIB + 512);
        // roundup_power2_divisions: 4 steps between 1 and 2 GiB, 4 between 1 and 2 MiB (and
        // below, where the request is over 4 × 512 bytes).
        let mut divided = BlockRule::default();
        divided.divisions[10] = 4;
        divided.divisions[0] = 4;
        assert_eq!(divided.round(1200 * MIB), 1280 * MIB);
        assert_eq!(
            divided.round(1024 * MIB),
            1024 * MIB,
            "a power of two stays"
        );
        assert_eq!(divided.round(1280 * MIB), 1280 * MIB, "a step stays");
        assert_eq!(divided.round(1200 * 1024), 1280 * 1024);
        assert_eq!(divided.round(3000), 3072);
        assert_eq!(
            divided.round(1200),
            1536,
            "not over 4 × 512: 512-byte rounding"
        );
    }

    #[test]
    fn free_blocks_split_as_the_caching_allocator_splits_them() {
        let plain = BlockRule::default();
        // Large pool: a remainder over 1 MiB is split off, one of at most 1 MiB is not.
        assert_eq!(plain.block(10 * MIB, 12 * MIB), 10 * MIB);
        assert_eq!(plain.block(11 * MIB + 512, 12 * MIB), 12 * MIB);
        assert_eq!(
            plain.block(11 * MIB, 12 * MIB),
            12 * MIB,
            "exactly 1 MiB left"
        );
        // Small pool: any remainder of 512 bytes or more is split off.
        assert_eq!(plain.block(512, 2 * MIB), 512);
        // A free block smaller than the request: the history is not what the rule expects.
        assert_eq!(plain.block(4 * MIB, 2 * MIB), 4 * MIB);
        // Requests at or above max_split_size are never split off their block.
        let capped = BlockRule {
            max_split_bytes: 8 * MIB,
            ..BlockRule::default()
        };
        assert_eq!(capped.block(9 * MIB, 28 * MIB), 28 * MIB);
        assert_eq!(capped.block(4 * MIB, 28 * MIB), 4 * MIB);
        // Expandable segments split any remainder of 512 bytes or more, in either pool.
        let expandable = BlockRule {
            expandable: true,
            ..BlockRule::default()
        };
        assert_eq!(expandable.block(11 * MIB + 512, 12 * MIB), 11 * MIB + 512);
    }

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
        let mut merged = Vec::new();
        merge_into(&a, &b, &mut merged);
        assert_eq!(merged, want);
        let mut v: Vec<u32> = a.iter().chain(&b).copied().collect();
        merge_back(&mut v, &b);
        assert_eq!(v, want);
    }

    #[test]
    fn the_replay_order_is_a_full_sort_for_few_and_many_runs() {
        let mut st = 11u64;
        for runs in [
            1usize,
            2,
            3,
            MERGE_IN_PLACE_RUNS,
            MERGE_IN_PLACE_RUNS + 1,
            40,
        ] {
            let mut slots = Vec::new();
            let mut bounds = alloc::vec![0];
            for _ in 0..runs {
                let n = lcg(&mut st) % 300;
                let mut t = (lcg(&mut st) % 1000) as i64;
                for _ in 0..n {
                    t += (lcg(&mut st) % 20) as i64 - 3;
                    let pos = slots.len() as u32;
                    slots.push(Slot {
                        time_us: t,
                        pos,
                        entry: pos,
                    });
                }
                bounds.push(slots.len());
            }
            let mut want = slots.clone();
            want.sort_unstable();
            assert_eq!(replay_order(slots, &bounds), want, "{runs} runs");
        }
    }
}
