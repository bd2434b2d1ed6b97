//! Compact columns for the replay model's history: values in blocks of [`BLOCK`], each block
//! stored as its minimum and the offsets from it in the fewest whole bytes that hold them
//! (frame-of-reference packing). A value is read back in O(1) from its index, a block of
//! identical values (a constant thread, a zero stack) costs no bytes at all, and a column never
//! holds more than one partly filled chunk of slack, so memory follows the values' spread
//! rather than their 8 bytes each.
//!
//! Why not a crate: the integer-packing crates (`bitpacking` and the like) pack `u32` blocks of
//! 128 or 256 with SIMD for search indexes; this needs `u64` values (addresses, nanoseconds),
//! O(1) reads of a single value, `no_std` and WebAssembly, in about two hundred lines.

use alloc::sync::Arc;
use alloc::vec::Vec;

/// Values per packed block.
pub const BLOCK: usize = 64;
/// Bytes per storage chunk once a column is large: chunks are allocated at this size, so
/// growth never copies a column or leaves more than one chunk unused, and a full chunk is what
/// a [`Spill`] takes.
pub const CHUNK_BYTES: usize = 1 << 15;
/// The most bytes one read of a block takes: a dictionary block of 8-byte entries and its
/// padding.
const MAX_RUN: usize = BLOCK + BLOCK * 8 + PAD;

/// Where full chunks of packed bytes can go instead of memory. The front ends with a disk
/// (`gpucollect report`, the server) keep them in a temporary file past a resident budget, so
/// a long trace's history costs disk rather than memory; the page keeps everything in memory
/// (no spill). This crate does no I/O itself: it hands chunks over and asks for bytes back.
pub trait Spill: Send + Sync + core::fmt::Debug {
    /// Takes a full chunk ([`CHUNK_BYTES`] bytes, never changed afterwards): the handle to
    /// read it back by, or `None` to keep it in memory (under the budget, or where it cannot
    /// be stored).
    fn put(&self, chunk: &[u8]) -> Option<u64>;
    /// Calls `f` once with the `len` bytes from `at` of the chunk stored as `handle`
    /// (`at + len <= CHUNK_BYTES`).
    fn read(&self, handle: u64, at: usize, len: usize, f: &mut dyn FnMut(&[u8]));
    /// Bytes of chunks it holds (not in the model's heap).
    fn held_bytes(&self) -> u64;
}

/// A chunk of bytes: in memory, or handed to the [`Spill`] once full.
#[derive(Clone, Debug)]
enum Chunk {
    Here(Vec<u8>),
    Away(u64),
}

/// Bytes in chunks that never move once full; full chunks may go to a [`Spill`].
#[derive(Clone, Debug, Default)]
pub struct Chunked {
    chunks: Vec<Chunk>,
    len: usize,
    spill: Option<Arc<dyn Spill>>,
}

impl Chunked {
    const CHUNK: usize = CHUNK_BYTES;

    pub const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            spill: None,
        }
    }

    /// Full chunks from now on go to `spill` where it takes them.
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.spill = spill;
    }

    /// The spill full chunks go to.
    pub(crate) fn spill(&self) -> Option<Arc<dyn Spill>> {
        self.spill.clone()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends every byte of `vs`, which [`Self::start_run`] made room for in the last chunk.
    #[inline]
    pub(crate) fn extend_from_slice(&mut self, vs: &[u8]) {
        if let Some(Chunk::Here(c)) = self.chunks.last_mut() {
            debug_assert!(c.len() + vs.len() <= Self::CHUNK);
            c.extend_from_slice(vs);
            self.len += vs.len();
        }
    }

    /// The index the next `n` bytes appended will start at, with all `n` in one chunk: when
    /// fewer than `n` remain in the last chunk, it is padded to its end (bytes never read),
    /// offered to the spill, and a new chunk begun.
    pub(crate) fn start_run(&mut self, n: usize) -> usize {
        let room = match self.chunks.last() {
            Some(Chunk::Here(c)) => c.len() + n <= Self::CHUNK,
            _ => false,
        };
        if !room {
            if let Some(Chunk::Here(c)) = self.chunks.last_mut() {
                self.len += Self::CHUNK - c.len();
                c.resize(Self::CHUNK, 0);
                if let Some(h) = self.spill.as_ref().and_then(|s| s.put(c))
                    && let Some(last) = self.chunks.last_mut()
                {
                    *last = Chunk::Away(h);
                }
            }
            // The first chunk grows as a vector does (small columns stay small); later ones
            // are made whole.
            let c = if self.chunks.is_empty() {
                Vec::new()
            } else {
                Vec::with_capacity(Self::CHUNK)
            };
            self.chunks.push(Chunk::Here(c));
        }
        self.len
    }

    /// Calls `f` with the `n` bytes from `from`, which [`Self::start_run`] placed in one
    /// chunk (`n` at most [`MAX_RUN`]).
    #[inline]
    pub(crate) fn with_run<R: Default>(
        &self,
        from: usize,
        n: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let (c, o) = (from / Self::CHUNK, from % Self::CHUNK);
        match &self.chunks[c] {
            Chunk::Here(bytes) => f(&bytes[o..o + n]),
            &Chunk::Away(h) => self.with_spilled_run(h, o, n, f),
        }
    }

    /// The `n` bytes from `from`, which [`Self::start_run`] placed in one chunk, when that
    /// chunk is in memory (`None` when it spilled).
    #[inline]
    pub(crate) fn run_here(&self, from: usize, n: usize) -> Option<&[u8]> {
        let (c, o) = (from / Self::CHUNK, from % Self::CHUNK);
        match self.chunks.get(c)? {
            Chunk::Here(bytes) => bytes.get(o..o + n),
            Chunk::Away(_) => None,
        }
    }

    /// [`Self::with_run`] of a spilled chunk, out of line: the in-memory read stays small.
    #[inline(never)]
    fn with_spilled_run<R: Default>(
        &self,
        h: u64,
        o: usize,
        n: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let (mut f, mut r) = (Some(f), R::default());
        if let Some(s) = &self.spill {
            s.read(h, o, n.min(MAX_RUN), &mut |b| {
                if let Some(f) = f.take() {
                    r = f(b);
                }
            });
        }
        r
    }

    /// The byte at `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn get(&self, i: usize) -> u8 {
        self.with_run(i, 1, |b| b[0])
    }

    /// Bytes held, in memory or spilled (a spilled chunk counts whole): what the model's
    /// history takes, wherever it lies.
    pub fn heap_bytes(&self) -> usize {
        // Every chunk but the last was made at, or grew by doubling to, exactly `CHUNK`.
        let last = match self.chunks.last() {
            Some(Chunk::Here(c)) => c.capacity(),
            Some(Chunk::Away(_)) => Self::CHUNK,
            None => 0,
        };
        let full = self.chunks.len().saturating_sub(1) * Self::CHUNK;
        self.chunks.capacity() * core::mem::size_of::<Chunk>() + full + last
    }
}

/// Where a block's bytes start (low 48 bits), the length of its dictionary (the next 8 bits:
/// 0 for a block of offsets), how many bytes each value or dictionary entry takes (high 8
/// bits, 0 to 8), and the block's minimum.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Head {
    base: u64,
    start_width: u64,
}

/// Bits of [`Head::start`]: a column's bytes up to 16 TiB.
const START_BITS: u32 = 44;

impl Head {
    /// A head of nothing: value 0, no bytes.
    const ZERO: Head = Head {
        base: 0,
        start_width: 0,
    };

    #[inline]
    pub(crate) fn start(self) -> usize {
        (self.start_width & ((1 << START_BITS) - 1)) as usize
    }
    /// Distinct values of a dictionary block; 0 for a block of offsets.
    #[inline]
    fn dict(self) -> usize {
        ((self.start_width >> START_BITS) & 0x7f) as usize
    }
    #[inline]
    pub(crate) fn width(self) -> usize {
        ((self.start_width >> (START_BITS + 7)) & 0xf) as usize
    }
    /// The low bits every offset of the block has as zeros, not stored.
    #[inline]
    fn shift(self) -> u32 {
        ((self.start_width >> (START_BITS + 11)) & 0x3f) as u32
    }
    /// The value an offset stored as `x` (its bytes masked) stands for.
    #[inline(always)]
    fn value(self, x: u64) -> u64 {
        self.base.wrapping_add(x << self.shift())
    }
    /// The head as stored: its two words, little-endian.
    #[inline]
    pub(crate) fn to_bytes(self) -> [u8; HEAD_BYTES] {
        let mut out = [0u8; HEAD_BYTES];
        out[..8].copy_from_slice(&self.base.to_le_bytes());
        out[8..].copy_from_slice(&self.start_width.to_le_bytes());
        out
    }

    /// [`Self::to_bytes`] read back (`s` holds at least [`HEAD_BYTES`]).
    #[inline]
    pub(crate) fn from_bytes(s: &[u8]) -> Self {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[..8]);
        let base = u64::from_le_bytes(w);
        w.copy_from_slice(&s[8..16]);
        Self {
            base,
            start_width: u64::from_le_bytes(w),
        }
    }

    pub(crate) fn new(base: u64, start: usize, dict: usize, f: Frame) -> Self {
        debug_assert!((start as u64) < 1 << START_BITS && dict <= BLOCK && f.width <= 8);
        debug_assert!(f.shift < 64);
        Self {
            base,
            start_width: start as u64
                | ((dict as u64) << START_BITS)
                | ((f.width as u64) << (START_BITS + 7))
                | (u64::from(f.shift) << (START_BITS + 11)),
        }
    }
}

/// How a block's values are stored: as offsets from `lo`, shifted right by `shift` (the low
/// bits all of them have as zeros: sizes and addresses in whole pages, live bytes that change
/// by them), in `width` bytes each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    pub(crate) lo: u64,
    pub(crate) width: usize,
    shift: u32,
}

impl Frame {
    /// The frame of offsets up to `span` whose low `shift` bits are zeros.
    pub(crate) fn of(lo: u64, span: u64, shift: u32) -> Self {
        let width = (64 - (span >> shift).leading_zeros()).div_ceil(8) as usize;
        Self { lo, width, shift }
    }

    /// The frame a scan found: the least and greatest values, and the bits in which any
    /// value differs from the first (0 without looking for shared low zero bits).
    fn scanned(lo: u64, hi: u64, differ: u64) -> Self {
        let shift = if differ == 0 {
            0
        } else {
            differ.trailing_zeros()
        };
        Self::of(lo, hi - lo, shift)
    }

    /// The offset of `v` as stored.
    #[inline(always)]
    fn offset(self, v: u64) -> u64 {
        (v - self.lo) >> self.shift
    }
}

/// Bytes of a [`Head`] as stored: its two words, little-endian.
pub(crate) const HEAD_BYTES: usize = 16;
/// Blocks per entry of a column's in-memory index of block minimums.
pub(crate) const GROUP: usize = 16;

/// A column of `u64` values packed in blocks of [`BLOCK`]: each block its minimum and the
/// offsets from it in the fewest whole bytes that hold them (0 when all are equal), less the
/// low zero bits they all share (values in whole pages keep only their high bits). Whole
/// bytes rather than bits: a block decodes with one fixed-size load per value, which a pass
/// over the history does for every allocation in every detector, for about half a byte more
/// per value. Its owner keeps the values of a block being filled as they are and appends the
/// block once full.
#[derive(Clone, Debug, Default)]
pub struct PackedColumn {
    /// Each block's [`Head`] past the uniform ones, 16 bytes, in chunks as the values' bytes
    /// are (they may spill).
    heads: Chunked,
    blocks: usize,
    /// The first blocks, up to the first that differs, while they all hold one value
    /// (`uniform`): their heads are not stored. A column that never changes (the device of a
    /// program on one GPU, the process of a trace of one) costs nothing per block.
    uniform_blocks: usize,
    uniform: u64,
    /// The minimum of every [`GROUP`]-th block, kept in memory (8 bytes per 1,024 values) so a
    /// search of a sorted column reads one chunk of heads, not one per halving.
    coarse: Vec<u64>,
    bytes: Chunked,
}

/// The first index in `[lo, hi)` where `holds` is false, or `hi` (`holds` true for a prefix
/// of the range): `partition_point` over indices whose values are computed.
#[inline]
fn first_failing(mut lo: usize, mut hi: usize, mut holds: impl FnMut(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// A block of offsets in memory, to search: its bytes and its head.
struct Run<'a> {
    bytes: &'a [u8],
    head: Head,
}

impl Run<'_> {
    /// No block: a target whose search is over.
    const NONE: Run<'static> = Run {
        bytes: &[],
        head: Head::ZERO,
    };
}

/// [`first_failing`] for many ranges at once: `holds(k, i)` true for a prefix of range `k`,
/// `[lo[k], hi[k])`, which ends as `[answer, answer)`. Each pass halves every range still open,
/// and a pass's probes do not depend on one another, so their reads overlap.
fn halve_side_by_side(lo: &mut [usize], hi: &mut [usize], holds: impl Fn(usize, usize) -> bool) {
    while lo.iter().zip(hi.iter()).any(|(l, h)| l < h) {
        for (k, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
            if *l < *h {
                let mid = *l + (*h - *l) / 2;
                let below = holds(k, mid);
                *l = core::hint::select_unpredictable(below, mid + 1, *l);
                *h = core::hint::select_unpredictable(below, *h, mid);
            }
        }
    }
}

/// [`first_failing`] searched onwards from `lo`: steps of 1, 2, 4, … until `holds` fails,
/// then by halves within the last step, so an answer `d` past `lo` costs about 2·log2(d).
#[inline]
fn gallop_first_failing(lo: usize, hi: usize, mut holds: impl FnMut(usize) -> bool) -> usize {
    let (mut from, mut step) = (lo, 1usize);
    // Every index before `from` holds; the answer is in `[from, to]`.
    let to = loop {
        let probe = from.saturating_add(step - 1);
        if probe >= hi {
            break hi;
        }
        if !holds(probe) {
            break probe;
        }
        from = probe + 1;
        step = step.saturating_mul(2);
    };
    first_failing(from, to, holds)
}

/// Bytes after each block's values (zeros), so every value can be read with one 8-byte load.
pub(crate) const PAD: usize = 7;

/// Writes a block's values as offsets in `f`'s frame into `out`: the bytes to store, with
/// their padding, how many (none when all the values are equal).
#[inline]
pub(crate) fn pack_offsets(
    f: Frame,
    value: impl Fn(usize) -> u64,
    out: &mut [u8; BLOCK * 8 + PAD],
) -> usize {
    let width = f.width;
    if width == 0 {
        return 0;
    }
    for k in 0..BLOCK {
        // All 8 bytes: those past `width` are zeros, which the next value overwrites (and the
        // last one writes into the padding).
        let x = f.offset(value(k)).to_le_bytes();
        out[k * width..k * width + 8].copy_from_slice(&x);
    }
    BLOCK * width + PAD
}

/// Calls `f(k, base + value k)` for values `k` in `[from, to)` (`to` at most [`BLOCK`]) of the
/// `W`-byte little-endian values of `src` (`W` in 1..=8; `src` holds [`PAD`] bytes more).
#[inline(always)]
fn unpack<const W: usize>(
    src: &[u8],
    base: u64,
    shift: u32,
    from: usize,
    to: usize,
    mut f: impl FnMut(usize, u64),
) {
    let src = &src[..BLOCK * W + PAD];
    let mask = if W == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * W)) - 1
    };
    let at = |k: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&src[k * W..k * W + 8]);
        u64::from_le_bytes(w) & mask
    };
    // Most blocks shift nothing (times, ids): their loop has no shift in it.
    if shift == 0 {
        for k in from..to.min(BLOCK) {
            f(k, base.wrapping_add(at(k)));
        }
    } else {
        for k in from..to.min(BLOCK) {
            f(k, base.wrapping_add(at(k) << shift));
        }
    }
}

/// A block's minimum, the low bits all its offsets from it have as zeros (with `SHIFT`; none
/// without, for values that rarely share any: identifiers, nanosecond times), and the bytes the
/// offsets take without them. Those bits are the ones every value shares with the first:
/// `v - lo` and `v ^ first` have their lowest set bit in the same place.
#[inline]
pub(crate) fn frame<const SHIFT: bool>(value: &impl Fn(usize) -> u64) -> Frame {
    let (mut lo, mut hi, mut differ) = (u64::MAX, 0u64, 0u64);
    let first = value(0);
    for k in 0..BLOCK {
        let v = value(k);
        lo = lo.min(v);
        hi = hi.max(v);
        if SHIFT {
            differ |= v ^ first;
        }
    }
    Frame::scanned(lo, hi, differ)
}

/// [`frame`] of a block held in one array (a timeline's values, the free times' codes). Two
/// values at a time, ordered, then the smaller compared with the least and the larger with the
/// greatest: three comparisons for two values rather than four, in a loop the compiler keeps
/// scalar. The plain loop over an array is vectorised, and without SSE4.2 (the x86-64
/// baseline) a vector of u64 has no comparison: emulated, each value's minimum and maximum
/// take about 20 instructions, against about 11 here. Over fields of a record (`frame`'s
/// callers) the plain loop stays scalar and is the cheaper.
#[inline]
pub(crate) fn frame_of<const SHIFT: bool>(v: &[u64; BLOCK]) -> Frame {
    let (lo, hi) = min_max(v);
    let differ = if SHIFT {
        v.iter().fold(0, |d, &x| d | (x ^ v[0]))
    } else {
        0
    };
    Frame::scanned(lo, hi, differ)
}

/// The least and greatest of `values` (`(u64::MAX, 0)` when empty), two at a time as
/// [`frame_of`] says, and for its reason.
#[inline]
pub(crate) fn min_max(values: &[u64]) -> (u64, u64) {
    let mut pairs = values.chunks_exact(2);
    let (mut lo, mut hi) = pairs.by_ref().fold((u64::MAX, 0), |(lo, hi), p| {
        let (small, large) = if p[0] < p[1] {
            (p[0], p[1])
        } else {
            (p[1], p[0])
        };
        (lo.min(small), hi.max(large))
    });
    if let &[v] = pairs.remainder() {
        (lo, hi) = (lo.min(v), hi.max(v));
    }
    (lo, hi)
}

/// A block's distinct values in order of first appearance and, per value, its entry; `None`
/// once there are more than `most`. A table of twice the block's size, probed linearly.
#[allow(clippy::type_complexity)]
fn distinct(
    value: &impl Fn(usize) -> u64,
    most: usize,
) -> Option<([u64; BLOCK], usize, [u8; BLOCK])> {
    const SLOTS: usize = 2 * BLOCK;
    // Entry + 1 per slot, 0 when empty.
    let mut slots = [0u8; SLOTS];
    let mut dict = [0u64; BLOCK];
    let mut index = [0u8; BLOCK];
    let mut d = 0usize;
    for (k, x) in index.iter_mut().enumerate() {
        let v = value(k);
        let mut s = (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as usize % SLOTS;
        loop {
            match slots[s] {
                0 => {
                    if d == most {
                        return None;
                    }
                    dict[d] = v;
                    slots[s] = d as u8 + 1;
                    *x = d as u8;
                    d += 1;
                    break;
                }
                e if dict[usize::from(e) - 1] == v => {
                    *x = e - 1;
                    break;
                }
                _ => s = (s + 1) % SLOTS,
            }
        }
    }
    Some((dict, d, index))
}

impl PackedColumn {
    pub const fn new() -> Self {
        Self {
            heads: Chunked::new(),
            blocks: 0,
            uniform_blocks: 0,
            uniform: 0,
            coarse: Vec::new(),
            bytes: Chunked::new(),
        }
    }

    /// Number of blocks.
    #[inline]
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Values held (a multiple of [`BLOCK`]).
    #[inline]
    pub fn len(&self) -> usize {
        self.blocks * BLOCK
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    #[inline]
    fn push_head(&mut self, h: Head) {
        if self.blocks.is_multiple_of(GROUP) {
            self.coarse.push(h.base);
        }
        let same = h.width() == 0 && (self.blocks == 0 || h.base == self.uniform);
        if self.uniform_blocks == self.blocks && same {
            self.uniform = h.base;
            self.uniform_blocks += 1;
            self.blocks += 1;
            return;
        }
        self.heads.start_run(HEAD_BYTES);
        self.heads.extend_from_slice(&h.to_bytes());
        self.blocks += 1;
    }

    /// Packs a full block of values, `value(k)` for `k` in `0..BLOCK`.
    #[inline]
    pub fn append(&mut self, value: impl Fn(usize) -> u64) {
        let f = frame::<true>(&value);
        self.append_offsets(f, value);
    }

    /// [`Self::append`] of values whose offsets rarely share low zero bits (identifiers,
    /// nanosecond times): they are stored whole, without looking for them.
    #[inline]
    pub fn append_unshifted(&mut self, value: impl Fn(usize) -> u64) {
        let f = frame::<false>(&value);
        self.append_offsets(f, value);
    }

    /// [`Self::append_unshifted`] of a block held in one array, its frame found two values at
    /// a time (`frame_of`).
    #[inline]
    pub fn append_array(&mut self, values: &[u64; BLOCK]) {
        let f = frame_of::<false>(values);
        self.append_offsets(f, |k| values[k]);
    }

    /// [`Self::append`] of values that never decrease: the block's frame is its first and
    /// last values, without a scan.
    #[inline(never)]
    pub fn append_ascending(&mut self, value: impl Fn(usize) -> u64) {
        debug_assert!((1..BLOCK).all(|k| value(k - 1) <= value(k)));
        let lo = value(0);
        self.append_offsets(Frame::of(lo, value(BLOCK - 1) - lo, 0), value);
    }

    /// Packs a full block as [`Self::append`] does, or, where it repeats a few values (the
    /// sizes a loop allocates again and again), as a dictionary when that is smaller: each
    /// distinct value once, as an offset from the minimum, and a byte per value saying which.
    /// A block of 4-byte sizes with 8 distinct values takes 96 bytes rather than 256. Reads
    /// cost one byte more per value.
    pub fn append_repeating(&mut self, value: impl Fn(usize) -> u64) {
        let f = frame::<true>(&value);
        let width = f.width;
        // A dictionary of `d` entries is smaller while `BLOCK + d * width < BLOCK * width`.
        if width >= 2 {
            let most = (BLOCK * (width - 1) - 1) / width;
            if let Some((dict, d, index)) = distinct(&value, most) {
                let dict = &dict[..d];
                let n = BLOCK + d * width;
                let start = self.bytes.start_run(n + PAD);
                let mut out = [0u8; BLOCK + BLOCK * 8 + PAD];
                out[..BLOCK].copy_from_slice(&index);
                for (j, &v) in dict.iter().enumerate() {
                    let at = BLOCK + j * width;
                    out[at..at + 8].copy_from_slice(&f.offset(v).to_le_bytes());
                }
                self.bytes.extend_from_slice(&out[..n + PAD]);
                self.push_head(Head::new(f.lo, start, d, f));
                return;
            }
        }
        self.append_offsets(f, value);
    }

    /// Packs a block as offsets from `lo` in `width` bytes each.
    #[inline]
    fn append_offsets(&mut self, f: Frame, value: impl Fn(usize) -> u64) {
        let start = self.bytes.start_run(BLOCK * f.width + PAD);
        let mut out = [0u8; BLOCK * 8 + PAD];
        let n = pack_offsets(f, value, &mut out);
        self.bytes.extend_from_slice(&out[..n]);
        self.push_head(Head::new(f.lo, start, 0, f));
    }

    /// The value at `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        Blocks::get(self, i)
    }

    /// Decodes block `b` into `out`. Panics when `b >= blocks()`.
    pub fn decode(&self, b: usize, out: &mut [u64; BLOCK]) {
        self.decode_with(b, |k, v| out[k] = v);
    }

    /// Calls `f(k, value)` for each value `k` of block `b`, in order. Panics when
    /// `b >= blocks()`.
    #[inline(always)]
    pub fn decode_with(&self, b: usize, f: impl FnMut(usize, u64)) {
        Blocks::decode_with(self, b, f);
    }

    /// Calls `f(k, value)` for values `k` in `[from, to)` of block `b` (`to` at most
    /// [`BLOCK`]), in order, decoding only those. Panics when `b >= blocks()`.
    #[inline(always)]
    pub fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64)) {
        Blocks::decode_range_with(self, b, from, to, f);
    }

    /// The smallest value of block `b` (its first, in a column whose values never decrease).
    #[inline]
    pub(crate) fn block_min(&self, b: usize) -> u64 {
        Blocks::block_min(self, b)
    }

    /// [`Blocks::search_sorted`].
    pub(crate) fn search_sorted(
        &self,
        lo: usize,
        hi: usize,
        pred: impl FnMut(u64) -> bool,
        gallop: bool,
    ) -> usize {
        Blocks::search_sorted(self, lo, hi, pred, gallop)
    }

    /// Full chunks of this column's bytes from now on go to `spill` where it takes them.
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.heads.set_spill(spill.clone());
        self.bytes.set_spill(spill);
    }

    /// The spill this column's full chunks go to.
    pub fn spill(&self) -> Option<Arc<dyn Spill>> {
        self.bytes.spill.clone()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.heads.heap_bytes() + self.bytes.heap_bytes() + self.coarse.capacity() * 8
    }
}

/// Reading one column's packed blocks, wherever their heads and bytes lie: a
/// [`PackedColumn`]'s own, or a lane of a timeline's points ([`crate::points`]), whose times'
/// and values' blocks share their heads' and bytes' chunks.
pub(crate) trait Blocks {
    /// Block `b`'s head. Panics when `b >= blocks()`.
    fn head(&self, b: usize) -> Head;
    /// The bytes the heads' starts index.
    fn bytes(&self) -> &Chunked;
    /// The minimum of every [`GROUP`]-th block, for searches of a sorted column.
    fn coarse(&self) -> &[u64];

    /// Bytes from one block's head to the next's in [`Self::heads_here`].
    const HEAD_STRIDE: usize = HEAD_BYTES;

    /// The heads of blocks `from..to` (`from < to <= blocks()`) as they lie in memory, each
    /// [`Self::HEAD_STRIDE`] bytes after the one before, the first at the start: `None` where
    /// they are not in one run in memory (they spilled, or cross chunks), and for a column
    /// that does not say.
    fn heads_here(&self, _from: usize, _to: usize) -> Option<&[u8]> {
        None
    }

    /// The value at `i`. Panics when `i >= blocks() * BLOCK`.
    #[inline]
    fn get(&self, i: usize) -> u64 {
        let h = self.head(i / BLOCK);
        let width = h.width();
        if width == 0 {
            return h.base;
        }
        let at = match h.dict() {
            0 => h.start() + (i % BLOCK) * width,
            _ => h.start() + BLOCK + usize::from(self.bytes().get(h.start() + i % BLOCK)) * width,
        };
        let w = self.bytes().with_run(at, 8, |b| {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            u64::from_le_bytes(w)
        });
        h.value(w & (u64::MAX >> (64 - 8 * width)))
    }

    /// Calls `f(k, value)` for each value `k` of block `b`, in order. Panics when
    /// `b >= blocks()`.
    #[inline(always)]
    fn decode_with(&self, b: usize, mut f: impl FnMut(usize, u64)) {
        let h = self.head(b);
        let (width, d) = (h.width(), h.dict());
        if width == 0 || d == 0 {
            self.unpack_head(h, 0, BLOCK, f);
            return;
        }
        // A whole dictionary block: each entry decoded once, then looked up per value.
        self.bytes()
            .with_run(h.start(), BLOCK + d * width + PAD, |src| {
                let (index, entries) = src.split_at(BLOCK);
                let mask = u64::MAX >> (64 - 8 * width);
                let mut dict = [0u64; BLOCK];
                for (j, e) in dict.iter_mut().enumerate().take(d) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&entries[j * width..j * width + 8]);
                    *e = h.value(u64::from_le_bytes(w) & mask);
                }
                for (k, &x) in index.iter().enumerate() {
                    f(k, dict[usize::from(x) % BLOCK]);
                }
            });
    }

    /// Calls `f(k, value)` for values `k` in `[from, to)` of block `b` (`to` at most
    /// [`BLOCK`]), in order, decoding only those. Panics when `b >= blocks()`.
    #[inline(always)]
    fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64)) {
        self.decode_head_range(self.head(b), from, to.min(BLOCK), f);
    }

    /// Values `[from, to)` (`to` at most [`BLOCK`]) of the block whose head is `h`, each
    /// decoded on its own: a dictionary block's entries are read per value.
    #[inline(always)]
    fn decode_head_range(&self, h: Head, from: usize, to: usize, mut f: impl FnMut(usize, u64)) {
        let width = h.width();
        if width > 0 && h.dict() > 0 {
            self.bytes()
                .with_run(h.start(), BLOCK + h.dict() * width + PAD, |src| {
                    let (index, entries) = src.split_at(BLOCK);
                    let mask = u64::MAX >> (64 - 8 * width);
                    for (k, &x) in index.iter().enumerate().take(to).skip(from) {
                        let at = usize::from(x) * width;
                        let mut w = [0u8; 8];
                        w.copy_from_slice(&entries[at..at + 8]);
                        f(k, h.value(u64::from_le_bytes(w) & mask));
                    }
                });
            return;
        }
        self.unpack_head(h, from, to, f);
    }

    /// Values `[from, to)` of a block of offsets (no dictionary) whose head is `h`.
    #[inline(always)]
    fn unpack_head(&self, h: Head, from: usize, to: usize, mut f: impl FnMut(usize, u64)) {
        let width = h.width();
        if width == 0 {
            for k in from..to {
                f(k, h.base);
            }
            return;
        }
        self.bytes()
            .with_run(h.start(), BLOCK * width + PAD, |src| match width {
                1 => unpack::<1>(src, h.base, h.shift(), from, to, f),
                2 => unpack::<2>(src, h.base, h.shift(), from, to, f),
                3 => unpack::<3>(src, h.base, h.shift(), from, to, f),
                4 => unpack::<4>(src, h.base, h.shift(), from, to, f),
                5 => unpack::<5>(src, h.base, h.shift(), from, to, f),
                6 => unpack::<6>(src, h.base, h.shift(), from, to, f),
                7 => unpack::<7>(src, h.base, h.shift(), from, to, f),
                _ => unpack::<8>(src, h.base, h.shift(), from, to, f),
            });
    }

    /// The smallest value of block `b` (its first, in a column whose values never decrease).
    #[inline]
    fn block_min(&self, b: usize) -> u64 {
        self.head(b).base
    }

    /// In block `b`, whose values never decrease: the first index in `[from, to)` (indices in
    /// the column, within the block) whose value does not satisfy `pred`, or `to`.
    fn partition_in_block(
        &self,
        b: usize,
        from: usize,
        to: usize,
        mut pred: impl FnMut(u64) -> bool,
    ) -> usize {
        let h = self.head(b);
        let width = h.width();
        if width == 0 {
            return if from < to && pred(h.base) { to } else { from };
        }
        if h.dict() > 0 {
            return first_failing(from, to, |i| pred(self.get(i)));
        }
        self.bytes()
            .with_run(h.start(), BLOCK * width + PAD, |src| {
                let mask = u64::MAX >> (64 - 8 * width);
                let at = |i: usize| {
                    let k = (i % BLOCK) * width;
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&src[k..k + 8]);
                    h.value(u64::from_le_bytes(w) & mask)
                };
                first_failing(from, to, |i| pred(at(i)))
            })
    }

    /// For a column whose values never decrease: the first index in `[lo, hi)` (`hi` at most
    /// the blocks' values) whose value does not satisfy `pred`, or `hi`; `gallop` searches onwards
    /// from `lo` ([`Column::gallop_sorted`]). Narrows by the in-memory index of every
    /// [`GROUP`]-th block's minimum, then by the blocks' minimums within one group, then
    /// within one block, so a search reads one chunk of heads and one of values.
    fn search_sorted(
        &self,
        lo: usize,
        hi: usize,
        mut pred: impl FnMut(u64) -> bool,
        gallop: bool,
    ) -> usize {
        if lo >= hi {
            return lo.min(hi);
        }
        // Generic over `holds` (a `dyn` closure would cost an indirect call per probe).
        #[inline(always)]
        fn search(gallop: bool, from: usize, to: usize, holds: impl FnMut(usize) -> bool) -> usize {
            if gallop {
                gallop_first_failing(from, to, holds)
            } else {
                first_failing(from, to, holds)
            }
        }
        // Blocks that start inside (lo, hi): the first whose first value fails `pred`, `a`.
        let (from, to) = (lo / BLOCK + 1, (hi - 1) / BLOCK + 1);
        // Groups whose first block is in [from, to): the first whose minimum fails bounds `a`.
        let (gfrom, gto) = (from.div_ceil(GROUP), to.div_ceil(GROUP));
        // A gallop pays off while the answer is near `lo`: within the group the coarse index
        // found past `lo`'s own, the blocks are halved instead (4 probes, not up to 8).
        let (from, to, near) = if gfrom < gto {
            let g = search(gallop, gfrom, gto, |g| pred(self.coarse()[g]));
            let f = if g > gfrom { (g - 1) * GROUP + 1 } else { from };
            let t = if g < gto { g * GROUP + 1 } else { to };
            (f.max(from), t.min(to), g <= gfrom)
        } else {
            (from, to, true)
        };
        let a = search(gallop && near, from, to, |b| pred(self.block_min(b)));
        // The answer lies in block a - 1, or is block a's first index.
        let b = a - 1;
        self.partition_in_block(b, lo.max(b * BLOCK), hi.min(a * BLOCK), pred)
    }

    /// For a column whose values never decrease, and `targets` that never decrease: for each
    /// target `t`, the number of the `blocks` packed blocks' values at or below `t`, into the
    /// same place of `out`.
    ///
    /// The searches run side by side, one halving of every target's range per pass: the
    /// in-memory index of every [`GROUP`]-th block's minimum first (onwards from one target to
    /// the next), then the group's heads, then the block's values. A pass's reads depend on
    /// nothing else read in that pass, so the processor overlaps them rather than waiting on
    /// each in turn: a zoom step reads thousands of points scattered over the model, and one
    /// search at a time costs each of them a miss of the caches and of the address
    /// translations in turn.
    fn count_at_most_each(&self, blocks: usize, targets: &[u64], out: &mut [usize]) {
        let coarse = self.coarse();
        // Per target, the range `[lo, hi)` still searched, of blocks then of indices: every
        // block (index) before `lo` starts at (is) or below the target, and none from `hi` on.
        let mut lo = Vec::with_capacity(targets.len());
        let mut hi = Vec::with_capacity(targets.len());
        let mut g = 0usize;
        for &t in targets {
            // Groups whose first value is at or below `t`.
            g = gallop_first_failing(g, coarse.len(), |k| coarse[k] <= t);
            let (l, h) = match g.checked_sub(1) {
                None => (0, 0),
                // Block `last * GROUP` starts at or below `t`: the last that does lies within.
                Some(last) => (last * GROUP + 1, (last * GROUP + GROUP).min(blocks)),
            };
            lo.push(l);
            hi.push(h);
        }
        let first_of = lo.clone();
        // Each target's group of heads as they lie in memory, where they do (`None` for a
        // target whose search is over, or heads that spilled: read one by one).
        let groups: Vec<Option<&[u8]>> = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| (l < h).then(|| self.heads_here(l, h)).flatten())
            .collect();
        halve_side_by_side(&mut lo, &mut hi, |k, b| {
            let first = match groups[k] {
                Some(heads) => {
                    // Block `b`'s head is the `b - l`-th of the run from the target's first
                    // block `l` (the range's start before any halving).
                    let at = (b - first_of[k]) * Self::HEAD_STRIDE;
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&heads[at..at + 8]);
                    u64::from_le_bytes(w)
                }
                None => self.block_min(b),
            };
            first <= targets[k]
        });
        // The last block starting at or below the target is `lo - 1` (none when `lo` is 0):
        // its values after the first are searched, by halves side by side where the block is
        // offsets in memory (read from its bytes as they lie), else one target at a time.
        let mut runs: Vec<Run<'_>> = Vec::with_capacity(targets.len());
        for (k, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
            let Some(b) = l.checked_sub(1) else {
                runs.push(Run::NONE);
                *h = 0;
                continue;
            };
            let head = self.head(b);
            let width = head.width();
            let run = (width > 0 && head.dict() == 0)
                .then(|| self.bytes().run_here(head.start(), BLOCK * width + PAD))
                .flatten();
            (*l, *h) = (b * BLOCK + 1, b * BLOCK + BLOCK);
            match run {
                Some(bytes) => runs.push(Run { bytes, head }),
                None => {
                    *l = self.partition_in_block(b, *l, *h, |x| x <= targets[k]);
                    *h = *l;
                    runs.push(Run::NONE);
                }
            }
        }
        halve_side_by_side(&mut lo, &mut hi, |k, i| {
            let r = &runs[k];
            let width = r.head.width();
            let at = (i % BLOCK) * width;
            let mut w = [0u8; 8];
            w.copy_from_slice(&r.bytes[at..at + 8]);
            r.head
                .value(u64::from_le_bytes(w) & (u64::MAX >> (64 - 8 * width)))
                <= targets[k]
        });
        out[..targets.len()].copy_from_slice(&lo);
    }
}

impl Blocks for PackedColumn {
    #[inline]
    fn head(&self, b: usize) -> Head {
        assert!(b < self.blocks, "block {b} of {}", self.blocks);
        let Some(b) = b.checked_sub(self.uniform_blocks) else {
            return Head::new(self.uniform, 0, 0, Frame::of(self.uniform, 0, 0));
        };
        self.heads
            .with_run(b * HEAD_BYTES, HEAD_BYTES, Head::from_bytes)
    }

    #[inline]
    fn bytes(&self) -> &Chunked {
        &self.bytes
    }

    #[inline]
    fn coarse(&self) -> &[u64] {
        &self.coarse
    }
}

/// A column of `u64` values with a block being filled: [`PackedColumn`] plus its tail, for
/// owners that keep columns apart (a timeline's times and values).
#[derive(Clone, Debug, Default)]
pub struct Column {
    packed: PackedColumn,
    tail: Vec<u64>,
}

impl Column {
    pub const fn new() -> Self {
        Self {
            packed: PackedColumn::new(),
            tail: Vec::new(),
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.packed.len() + self.tail.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.packed.is_empty() && self.tail.is_empty()
    }

    #[inline]
    pub fn push(&mut self, v: u64) {
        self.push_then(v, |_| {});
    }

    /// [`Self::push`], calling `full` with the block's values once it is full, before they
    /// are packed: for an owner that makes a summary of each block as it comes.
    #[inline(always)]
    pub fn push_then(&mut self, v: u64, full: impl FnOnce(&[u64])) {
        self.tail.push(v);
        if self.tail.len() == BLOCK {
            full(&self.tail);
            let t = &self.tail;
            self.packed.append(|k| t[k]);
            self.tail.clear();
        }
    }

    /// The values of the block being filled (fewer than [`BLOCK`]).
    pub fn pending(&self) -> &[u64] {
        &self.tail
    }

    /// [`Self::push`] of a value not below the last one pushed (a column of times): its
    /// blocks are packed without scanning for their range.
    #[inline(always)]
    pub fn push_ascending(&mut self, v: u64) {
        self.tail.push(v);
        if self.tail.len() == BLOCK {
            let t = &self.tail;
            self.packed.append_ascending(|k| t[k]);
            self.tail.clear();
        }
    }

    /// Full chunks of packed bytes from now on go to `spill` where it takes them.
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.packed.set_spill(spill);
    }

    /// The spill this column's full chunks go to.
    pub fn spill(&self) -> Option<Arc<dyn Spill>> {
        self.packed.spill()
    }

    /// The value at `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        self.tailed().get(i)
    }

    /// The last value pushed.
    #[inline]
    pub fn last(&self) -> Option<u64> {
        match self.tail.last() {
            Some(&v) => Some(v),
            None => self.len().checked_sub(1).map(|i| self.packed.get(i)),
        }
    }

    /// Number of blocks, the last one possibly partial.
    pub fn blocks(&self) -> usize {
        self.packed.blocks() + usize::from(!self.tail.is_empty())
    }

    /// For a column whose values never decrease: `lo + self[lo..hi].partition_point(pred)`,
    /// the first index in `[lo, hi)` whose value does not satisfy `pred` (which must hold for
    /// a prefix of them), or `hi`. Searches the blocks' first values (kept unpacked) and then
    /// one block, so a search reads one block's bytes rather than a value from each of
    /// log2(n) blocks.
    pub fn partition_sorted(&self, lo: usize, hi: usize, pred: impl FnMut(u64) -> bool) -> usize {
        self.search_sorted(lo, hi, pred, false)
    }

    /// [`Self::partition_sorted`] searched onwards from `lo` (exponentially, then by halves):
    /// it reads about log2 of the distance to the answer rather than log2 of `hi - lo`, so a
    /// walk forward through the column costs the log of each step.
    pub fn gallop_sorted(&self, lo: usize, hi: usize, pred: impl FnMut(u64) -> bool) -> usize {
        self.search_sorted(lo, hi, pred, true)
    }

    /// The search of [`Self::partition_sorted`] ([`Tailed::search_sorted`]).
    #[inline]
    fn search_sorted(
        &self,
        lo: usize,
        hi: usize,
        pred: impl FnMut(u64) -> bool,
        gallop: bool,
    ) -> usize {
        self.tailed().search_sorted(lo, hi, pred, gallop)
    }

    /// Decodes block `b` into `out`; returns how many values it holds (fewer than [`BLOCK`]
    /// only for the last block; 0 past the end).
    pub fn decode_block(&self, b: usize, out: &mut [u64; BLOCK]) -> usize {
        self.tailed().decode_block(b, out)
    }

    /// Calls `f(i, value)` for the values `i` in `[from, to)` of block `b` (indices in the
    /// column; `to` at most the column's length), decoding only those.
    #[inline]
    pub fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64)) {
        self.tailed().decode_range_with(b, from, to, f);
    }

    /// The packed blocks and the tail, to read.
    #[inline(always)]
    fn tailed(&self) -> Tailed<'_, PackedColumn> {
        Tailed {
            packed: &self.packed,
            blocks: self.packed.blocks(),
            tail: &self.tail,
        }
    }

    /// The values from index `from` in order, a block decoded at a time.
    pub fn iter_from(&self, from: usize) -> ColumnIter<'_> {
        ColumnIter {
            column: self,
            next: from,
            block: [0; BLOCK],
            decoded: usize::MAX,
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.packed.heap_bytes() + self.tail.capacity() * 8
    }
}

/// Packed blocks and the block being filled after them, read as one column: a [`Column`], or a
/// lane of a timeline's points (`points.rs`).
pub(crate) struct Tailed<'a, B: Blocks> {
    pub(crate) packed: &'a B,
    /// The packed blocks (the tail's first index is `blocks * BLOCK`).
    pub(crate) blocks: usize,
    pub(crate) tail: &'a [u64],
}

impl<B: Blocks> Tailed<'_, B> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.blocks * BLOCK + self.tail.len()
    }

    /// The value at `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u64 {
        match i.checked_sub(self.blocks * BLOCK) {
            Some(k) => self.tail[k],
            None => self.packed.get(i),
        }
    }

    /// Decodes block `b` into `out`; returns how many values it holds (fewer than [`BLOCK`]
    /// only for the last block; 0 past the end).
    pub(crate) fn decode_block(&self, b: usize, out: &mut [u64; BLOCK]) -> usize {
        if b < self.blocks {
            self.packed.decode_with(b, |k, v| out[k] = v);
            BLOCK
        } else if b == self.blocks {
            out[..self.tail.len()].copy_from_slice(self.tail);
            self.tail.len()
        } else {
            0
        }
    }

    /// Calls `f(i, value)` for the values `i` in `[from, to)` of block `b` (indices in the
    /// column; `to` at most its length), decoding only those.
    #[inline]
    pub(crate) fn decode_range_with(
        &self,
        b: usize,
        from: usize,
        to: usize,
        mut f: impl FnMut(usize, u64),
    ) {
        let start = b * BLOCK;
        if b < self.blocks {
            self.packed
                .decode_range_with(b, from - start, to - start, |k, v| f(start + k, v));
        } else if b == self.blocks {
            for (k, &v) in self.tail[from - start..to - start].iter().enumerate() {
                f(from + k, v);
            }
        }
    }

    /// For values that never decrease: the first index in `[lo, hi)` (`hi` capped at the
    /// length) whose value does not satisfy `pred`, or `hi`; in the packed blocks
    /// ([`Blocks::search_sorted`]), then in the tail where they all hold. `gallop` searches
    /// onwards from `lo` ([`Column::gallop_sorted`]).
    #[inline]
    pub(crate) fn search_sorted(
        &self,
        lo: usize,
        hi: usize,
        mut pred: impl FnMut(u64) -> bool,
        gallop: bool,
    ) -> usize {
        let hi = hi.min(self.len());
        if lo >= hi {
            return lo.min(hi);
        }
        let packed = self.blocks * BLOCK;
        if lo < packed {
            let end = hi.min(packed);
            let r = self.packed.search_sorted(lo, end, &mut pred, gallop);
            if r < end || hi <= packed {
                return r;
            }
        }
        let from = lo.max(packed);
        from + self.tail[from - packed..hi - packed].partition_point(|&v| pred(v))
    }

    /// For values that never decrease, and `targets` that never decrease: for each target
    /// `t`, the number of values at or below `t`, into the same place of `out` (as many as
    /// `targets`). [`Blocks::count_at_most_each`], then the tail.
    pub(crate) fn count_at_most_each(&self, targets: &[u64], out: &mut [usize]) {
        let out = &mut out[..targets.len()];
        let packed = self.blocks * BLOCK;
        if self.blocks > 0 {
            self.packed.count_at_most_each(self.blocks, targets, out);
        } else {
            out.fill(0);
        }
        for (&t, o) in targets.iter().zip(out.iter_mut()) {
            if *o == packed {
                *o += self.tail.partition_point(|&v| v <= t);
            }
        }
    }
}

/// [`Column::iter_from`].
#[derive(Clone)]
pub struct ColumnIter<'a> {
    column: &'a Column,
    next: usize,
    block: [u64; BLOCK],
    /// The block in `block`.
    decoded: usize,
}

impl Iterator for ColumnIter<'_> {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        if self.next >= self.column.len() {
            return None;
        }
        let b = self.next / BLOCK;
        if b != self.decoded {
            self.column.decode_block(b, &mut self.block);
            self.decoded = b;
        }
        let v = self.block[self.next % BLOCK];
        self.next += 1;
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.column.len().saturating_sub(self.next);
        (n, Some(n))
    }
}

impl ExactSizeIterator for ColumnIter<'_> {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A spill that keeps chunks in a vector and counts its reads.
    #[derive(Debug, Default)]
    pub(crate) struct VecSpill {
        chunks: std::sync::Mutex<Vec<Vec<u8>>>,
        pub(crate) reads: core::sync::atomic::AtomicUsize,
    }

    impl Spill for VecSpill {
        fn put(&self, chunk: &[u8]) -> Option<u64> {
            assert_eq!(chunk.len(), CHUNK_BYTES);
            let mut c = self.chunks.lock().expect("lock");
            c.push(chunk.to_vec());
            Some(c.len() as u64 - 1)
        }
        fn read(&self, handle: u64, at: usize, len: usize, f: &mut dyn FnMut(&[u8])) {
            self.reads
                .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            let c = self.chunks.lock().expect("lock");
            f(&c[handle as usize][at..at + len]);
        }
        fn held_bytes(&self) -> u64 {
            (self.chunks.lock().expect("lock").len() * CHUNK_BYTES) as u64
        }
    }

    fn check(values: &[u64]) {
        check_with(values, None);
        let spill = Arc::new(VecSpill::default());
        let bytes = check_with(values, Some(spill.clone()));
        // Every full chunk went to the spill, and reads came back from it.
        assert_eq!(
            spill.held_bytes() as usize,
            bytes / CHUNK_BYTES * CHUNK_BYTES
        );
        if bytes > CHUNK_BYTES {
            assert!(spill.reads.load(core::sync::atomic::Ordering::Relaxed) > 0);
        }
    }

    /// [`check`] on a column spilling to `spill`; the packed bytes it held.
    fn check_with(values: &[u64], spill: Option<Arc<dyn Spill>>) -> usize {
        let mut c = Column::new();
        c.set_spill(spill);
        for &v in values {
            c.push(v);
        }
        assert_eq!(c.len(), values.len());
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(c.get(i), v, "at {i}");
        }
        let mut buf = [0u64; BLOCK];
        let mut all = Vec::new();
        for b in 0..c.blocks() {
            let n = c.decode_block(b, &mut buf);
            all.extend_from_slice(&buf[..n]);
        }
        assert_eq!(all, values);
        // Any part of a block decodes as the same values, with their indices.
        for b in 0..c.blocks() {
            let end = values.len().min((b + 1) * BLOCK);
            for (from, to) in [(b * BLOCK, end), (b * BLOCK + 3, end - 1), (end - 1, end)] {
                let mut got = Vec::new();
                if from < to {
                    c.decode_range_with(b, from, to, |i, v| got.push((i, v)));
                }
                let want: Vec<(usize, u64)> = (from..to).map(|i| (i, values[i])).collect();
                assert_eq!(got, want, "block {b}, [{from}, {to})");
            }
        }
        assert_eq!(c.last(), values.last().copied());
        if values.is_sorted() {
            for &probe in values.iter().step_by(97) {
                let got = c.partition_sorted(0, values.len(), |v| v < probe);
                assert_eq!(got, values.partition_point(|&v| v < probe));
            }
        }
        c.packed.bytes.len()
    }

    /// Dictionary and offset blocks over many chunks, spilled, read back by index, by block
    /// and by search as they were written; a spill that declines keeps chunks in memory.
    #[test]
    fn spilled_chunks_read_back() {
        let sizes = [4096u64, 1 << 20, 3 << 20, 512, 64 << 20, 8192, 96, 1 << 24];
        let blocks: Vec<Vec<u64>> = (0..2000u64)
            .map(|b| {
                (0..BLOCK as u64)
                    .map(|k| match b % 3 {
                        0 => sizes[((k * 7 + b) % 8) as usize],
                        1 => (b << 40) + k * 1_000_003,
                        _ => (b << 40) + ((k * 2_654_435_761) % (1 << 30)),
                    })
                    .collect()
            })
            .collect();
        let spill = Arc::new(VecSpill::default());
        let mut c = PackedColumn::new();
        c.set_spill(Some(spill.clone()));
        for vals in &blocks {
            c.append_repeating(|k| vals[k]);
        }
        assert!(spill.held_bytes() >= 4 * CHUNK_BYTES as u64);
        let mut out = [0u64; BLOCK];
        for (b, vals) in blocks.iter().enumerate() {
            c.decode(b, &mut out);
            assert_eq!(&out[..], &vals[..], "block {b}");
            for k in [0, 1, 31, 63] {
                assert_eq!(c.get(b * BLOCK + k), vals[k]);
            }
            if b % 3 == 1 {
                let probe = vals[40];
                let got = c.partition_in_block(b, b * BLOCK, (b + 1) * BLOCK, |v| v < probe);
                assert_eq!(got, b * BLOCK + 40);
            }
        }
        // Bytes count wherever they lie.
        let mut here = PackedColumn::new();
        for vals in &blocks {
            here.append_repeating(|k| vals[k]);
        }
        assert_eq!(here.heap_bytes(), c.heap_bytes());
    }

    #[test]
    fn extremes_round_trip() {
        let mut v: Vec<u64> = (0..1000u64).map(|i| i * 3).collect();
        v.extend([0, u64::MAX, 1, u64::MAX - 1].iter().cycle().take(200));
        v.extend(core::iter::repeat_n(42, 300));
        v.extend((0..130).map(|i| 1u64 << (i % 64)));
        check(&v);
    }

    proptest! {
        /// A block's frame found two values at a time over an array is the one the plain scan
        /// finds: its minimum, width and shared low zero bits, with and without looking for
        /// them, for blocks of any values, of few, and of values that share low bits.
        #[test]
        fn frame_of_an_array_is_the_scans(
            values in prop::collection::vec(
                prop_oneof![any::<u64>(), 0u64..4, (0u64..1 << 20).prop_map(|v| v << 12)],
                BLOCK,
            ),
            same in any::<bool>(),
            one in prop::option::of((0..BLOCK, 0u32..64)),
        ) {
            let mut v = [0u64; BLOCK];
            v.copy_from_slice(&values);
            if same {
                v = [values[0]; BLOCK];
            }
            // One value apart from the others by one bit, at an even or an odd place.
            if let Some((at, bit)) = one {
                v = [values[0] & !1 << 12; BLOCK];
                v[at] ^= 1 << bit;
            }
            let key = |f: Frame| (f.lo, f.width, f.shift);
            prop_assert_eq!(key(frame_of::<true>(&v)), key(frame::<true>(&|k| v[k])));
            prop_assert_eq!(key(frame_of::<false>(&v)), key(frame::<false>(&|k| v[k])));
        }
    }

    proptest! {
        /// Blocks packed by `append_repeating`, as a dictionary (few distinct values) or as
        /// offsets (many), read back the same by index, by block and by search.
        #[test]
        fn repeating_blocks_read_back(
            blocks in prop::collection::vec(
                (
                    prop::collection::vec(
                        prop_oneof![any::<u64>(), (1u64 << 30)..(1 << 30) + (1 << 20)],
                        1..70,
                    ),
                    prop::collection::vec(any::<prop::sample::Index>(), BLOCK),
                    any::<bool>(),
                ),
                1..6,
            ),
        ) {
            let mut c = PackedColumn::new();
            let mut want = Vec::new();
            for (palette, picks, sorted) in &blocks {
                let mut vals: Vec<u64> = picks.iter().map(|ix| palette[ix.index(palette.len())]).collect();
                if *sorted {
                    vals.sort_unstable();
                }
                c.append_repeating(|k| vals[k]);
                want.push(vals);
            }
            for (b, vals) in want.iter().enumerate() {
                let mut out = [0u64; BLOCK];
                c.decode(b, &mut out);
                prop_assert_eq!(&out[..], &vals[..]);
                for (k, &v) in vals.iter().enumerate() {
                    prop_assert_eq!(c.get(b * BLOCK + k), v);
                }
                for (from, to) in [(0, BLOCK), (5, 9), (BLOCK - 1, BLOCK), (7, 7)] {
                    let mut got = Vec::new();
                    c.decode_range_with(b, from, to, |k, v| got.push((k, v)));
                    let want: Vec<(usize, u64)> = (from..to).map(|k| (k, vals[k])).collect();
                    prop_assert_eq!(got, want);
                }
                if blocks[b].2 {
                    for &probe in vals.iter().step_by(7) {
                        let got = c.partition_in_block(b, b * BLOCK, (b + 1) * BLOCK, |v| v < probe);
                        prop_assert_eq!(got, b * BLOCK + vals.partition_point(|&v| v < probe));
                    }
                }
            }
        }
    }

    /// Sizes a loop allocates again and again: a dictionary of 8 takes 88 bytes, not 256 (its
    /// entries 3 bytes each, without the 5 low zero bits all the sizes share).
    #[test]
    fn a_block_of_few_sizes_packs_as_a_dictionary() {
        let sizes = [4096u64, 1 << 20, 3 << 20, 512, 64 << 20, 8192, 96, 1 << 24];
        let mut c = PackedColumn::new();
        c.append_repeating(|k| sizes[k % 8]);
        c.append(|k| sizes[k % 8]);
        assert_eq!(c.head(0).dict(), 8);
        assert_eq!((c.head(0).shift(), c.head(0).width()), (5, 3));
        assert_eq!(c.head(1).start() - c.head(0).start(), BLOCK + 8 * 3 + PAD);
        assert_eq!(c.get(13), sizes[5]);
    }

    #[test]
    fn constant_blocks_take_no_words() {
        let mut c = Column::new();
        for _ in 0..BLOCK * 100 {
            c.push(7);
        }
        assert_eq!(c.packed.bytes.len(), 0);
        assert_eq!(c.get(BLOCK * 50 + 3), 7);
    }

    #[test]
    fn blocks_never_straddle_chunks() {
        // Blocks of 3-byte values take 192 bytes, which do not divide a chunk.
        let values: Vec<u64> = (0..(CHUNK_BYTES / 192 + 3) * BLOCK)
            .map(|i| if i % 2 == 0 { 0 } else { (1 << 23) + i as u64 })
            .collect();
        check(&values);
        let values: Vec<u64> = (0..(CHUNK_BYTES / 63 + 3) * BLOCK)
            .map(|i| if i % 2 == 0 { 0 } else { (1 << 62) + i as u64 })
            .collect();
        check(&values);
    }

    proptest! {
        /// Blocks of one value (a uniform start, then others, the first value again, varied
        /// blocks, partial ones) read back by index, block, range and search, spilled or not.
        #[test]
        fn runs_of_constant_blocks_round_trip(
            runs in proptest::collection::vec((0u64..4, 1usize..40, 0usize..3), 1..12),
        ) {
            let mut values = Vec::new();
            for (v, blocks, varied) in runs {
                for _ in 0..blocks * BLOCK {
                    values.push(v);
                }
                values.extend((0..varied * 37).map(|k| v + k as u64 % 3));
            }
            check(&values);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            check(&sorted);
        }
    }

    /// Offsets that share low zero bits are stored without them: live bytes that change by
    /// whole MiB take a byte or two per value where they took four.
    #[test]
    fn shared_low_zero_bits_are_not_stored() {
        let mib = 1u64 << 20;
        let mut c = Column::new();
        for k in 0..100 * BLOCK as u64 {
            c.push(((k * 7919) % 300) * mib);
        }
        assert_eq!(c.packed.head(0).shift(), 20);
        assert_eq!(c.packed.head(0).width(), 2);
        assert!(
            c.packed.bytes.len() <= 100 * (2 * BLOCK + PAD),
            "{}",
            c.packed.bytes.len()
        );
        assert_eq!(
            c.get(5 * BLOCK + 3),
            ((5 * BLOCK as u64 + 3) * 7919 % 300) * mib
        );
    }

    /// A column whose blocks all hold one value keeps no head for them.
    #[test]
    fn a_uniform_column_keeps_no_heads() {
        let mut c = Column::new();
        for _ in 0..1000 * BLOCK {
            c.push(7);
        }
        assert_eq!(c.packed.heads.len(), 0);
        // Its tail and the in-memory index of every 16th block: 16 KB had been heads.
        assert!(c.heap_bytes() < 2048, "{}", c.heap_bytes());
        c.push(8);
        for _ in 1..BLOCK {
            c.push(7);
        }
        assert_eq!(c.packed.heads.len(), HEAD_BYTES);
        assert_eq!(
            (c.get(0), c.get(1000 * BLOCK), c.get(1000 * BLOCK + 1)),
            (7, 8, 7)
        );
    }

    proptest! {
        #[test]
        fn any_values_round_trip(values in proptest::collection::vec(any::<u64>(), 0..700), spread in 0u32..64) {
            let values: Vec<u64> = values.iter().map(|v| v >> spread).collect();
            check(&values);
        }

        /// Values whose offsets share low zero bits (sizes and addresses in whole pages, live
        /// bytes that step by them) round trip by index, block, range and search, packed as
        /// offsets and as dictionaries, however many bits they share.
        #[test]
        fn values_with_low_zero_bits_round_trip(
            values in proptest::collection::vec(any::<u64>(), 0..700),
            spread in 0u32..64,
            zeros in 0u32..63,
            base in any::<u64>(),
            few in 1u64..12,
        ) {
            let values: Vec<u64> = values
                .iter()
                .map(|v| base.wrapping_add((v >> spread) << zeros))
                .collect();
            check(&values);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            check(&sorted);
            // A few distinct values per block, as a loop's sizes: dictionary blocks.
            let mut c = PackedColumn::new();
            let repeating: Vec<u64> = values.iter().map(|v| base.wrapping_add((v % few) << zeros) >> 1).collect();
            let blocks = repeating.len() / BLOCK;
            for b in 0..blocks {
                c.append_repeating(|k| repeating[b * BLOCK + k]);
            }
            let mut out = [0u64; BLOCK];
            for b in 0..blocks {
                c.decode(b, &mut out);
                prop_assert_eq!(&out[..], &repeating[b * BLOCK..(b + 1) * BLOCK]);
                let mut got = Vec::new();
                c.decode_range_with(b, 5, 40, |_, v| got.push(v));
                prop_assert_eq!(&got[..], &repeating[b * BLOCK + 5..b * BLOCK + 40]);
            }
            for (i, &v) in repeating[..blocks * BLOCK].iter().enumerate() {
                prop_assert_eq!(c.get(i), v);
            }
        }

        /// The column read in order from anywhere, a block decoded at a time, is the vector.
        #[test]
        fn a_column_iterates_as_its_values(
            values in proptest::collection::vec(any::<u64>(), 0..700),
            from in 0usize..800,
        ) {
            let mut c = Column::new();
            for &v in &values {
                c.push(v);
            }
            let want: Vec<u64> = values.iter().skip(from).copied().collect();
            prop_assert_eq!(c.iter_from(from).len(), want.len());
            prop_assert_eq!(c.iter_from(from).collect::<Vec<_>>(), want);
        }

        #[test]
        fn sorted_search_matches_the_slice(
            steps in proptest::collection::vec(0u64..1000, 0..5000),
            shift in 0u32..40,
            probes in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u64>()), 1..40),
        ) {
            // Non-decreasing values, runs of equal ones included (a step of 0).
            let mut values = Vec::with_capacity(steps.len());
            let mut t = 0u64;
            for s in steps {
                t += s.saturating_sub(300) << shift;
                values.push(t);
            }
            let mut c = Column::new();
            for &v in &values {
                c.push(v);
            }
            let n = values.len();
            for (a, b, x) in probes {
                let (lo, hi) = (a % (n + 2), b % (n + 2));
                let x = if n > 0 && x % 3 != 0 { values[(x as usize) % n] } else { x >> 20 };
                let want = if lo >= hi.min(n) {
                    lo.min(hi.min(n))
                } else {
                    lo + values[lo..hi.min(n)].partition_point(|&v| v < x)
                };
                prop_assert_eq!(c.partition_sorted(lo, hi, |v| v < x), want, "lo {} hi {} x {}", lo, hi, x);
                prop_assert_eq!(c.gallop_sorted(lo, hi, |v| v < x), want, "gallop: lo {} hi {} x {}", lo, hi, x);
                let want = if lo >= hi.min(n) {
                    lo.min(hi.min(n))
                } else {
                    lo + values[lo..hi.min(n)].partition_point(|&v| v <= x)
                };
                prop_assert_eq!(c.partition_sorted(lo, hi, |v| v <= x), want);
                prop_assert_eq!(c.gallop_sorted(lo, hi, |v| v <= x), want);
            }
        }
    }
}
