//! The allocation history of a replayed trace, stored by column: each field of [`AllocRecord`]
//! in its own [`PackedColumn`] (blocks of 64 packed in whole bytes). The free time and kind
//! change after the allocation is recorded: they stay plain while recent and are packed once
//! they are old (`free_times.rs`). An allocation costs well under half of its 56 bytes
//! as a struct (a constant thread or device costs nothing), is read back by index in O(1), and
//! a pass over the history decodes a block of 64 at a time.

use alloc::sync::Arc;
use alloc::vec::Vec;
use serde::Serialize;

use crate::format::{AllocKind, DeviceIdx, FreeKind, ProcessIdx, StackId, ThreadIdx};
use crate::free_times::{FreeTimes, LiveIn};
use crate::packed::{BLOCK, PackedColumn, Spill};

/// Sentinel for "not freed".
pub use crate::free_times::LIVE;

/// One allocation as replayed.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AllocRecord {
    pub ts_nanos: u64,
    /// `LIVE` while not freed.
    pub free_ts_nanos: u64,
    pub size_bytes: u64,
    pub address: u64,
    pub stack: StackId,
    pub thread: ThreadIdx,
    pub device: DeviceIdx,
    pub process: ProcessIdx,
    /// Innermost NVTX range instance open on the allocating thread (index + 1), 0 if none.
    pub range_slot: u32,
    pub kind: AllocKind,
    pub free_kind: FreeKind,
}

/// What a release reads of the allocation it frees: five of its fields, so replay's free path
/// reads five columns of a packed block (and the free times) rather than every column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub size_bytes: u64,
    pub stack: StackId,
    pub device: DeviceIdx,
    pub process: ProcessIdx,
    pub kind: AllocKind,
}

impl Owner {
    #[inline]
    pub const fn of(a: &AllocRecord) -> Self {
        Self {
            size_bytes: a.size_bytes,
            stack: a.stack,
            device: a.device,
            process: a.process,
            kind: a.kind,
        }
    }
}

impl AllocRecord {
    pub const fn is_live(&self) -> bool {
        self.free_ts_nanos == LIVE
    }
    /// Live at time `t` (allocated at or before `t`, not freed by `t`).
    pub const fn live_at(&self, t: u64) -> bool {
        self.ts_nanos <= t && (self.free_ts_nanos == LIVE || self.free_ts_nanos > t)
    }
}

/// The fields a pass over the history reads ([`AllocStore::iter_fields`]): only their columns
/// are decoded, so a pass that reads the time, size and kind of each allocation does not pay
/// for its address, thread or NVTX range. In debug builds the fields not asked for read as
/// nonsense (poisoned), so a pass that reads one it did not ask for fails its tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields(u16);

impl Fields {
    pub const TS: Self = Self(1);
    pub const SIZE: Self = Self(1 << 1);
    pub const ADDRESS: Self = Self(1 << 2);
    pub const STACK: Self = Self(1 << 3);
    pub const THREAD: Self = Self(1 << 4);
    pub const DEVICE: Self = Self(1 << 5);
    pub const PROCESS: Self = Self(1 << 6);
    pub const RANGE_SLOT: Self = Self(1 << 7);
    pub const KIND: Self = Self(1 << 8);
    /// The free time and free kind.
    pub const FREE: Self = Self(1 << 9);
    pub const ALL: Self = Self((1 << 10) - 1);
    /// No field: what a pass that reads nothing adds to another's.
    pub const NONE: Self = Self(0);

    /// Both sets.
    #[must_use]
    pub const fn and(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every field of `other` is in `self`.
    #[inline]
    pub const fn has(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Fields {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        self.and(other)
    }
}

/// Every allocation of a trace in id order (see the module documentation): blocks of
/// [`BLOCK`] packed by column, and the last, partly filled block as records. The columns that
/// never change once packed are shared by clones (copy on write), so a copy of the history
/// with other kinds ([`Self::map_kinds`], the framework layer's view) costs its kind and free
/// columns, not the whole history.
#[derive(Clone, Debug, Default)]
pub struct AllocStore {
    ts: Arc<PackedColumn>,
    size: Arc<PackedColumn>,
    address: Arc<PackedColumn>,
    stack: Arc<PackedColumn>,
    thread: Arc<PackedColumn>,
    device: Arc<PackedColumn>,
    process: Arc<PackedColumn>,
    range_slot: Arc<PackedColumn>,
    kind: PackedColumn,
    free: FreeTimes,
    /// The allocations after the packed blocks (fewer than [`BLOCK`]).
    tail: Vec<AllocRecord>,
    /// What a release reads of the newest [`RECENT`] packed allocations, by id modulo
    /// [`RECENT`]: most frees come soon after their allocation (a step's activations, a
    /// request's buffers), and reading five packed columns back was most of a free's cost.
    recent: Vec<Owner>,
    /// Packed allocations below this id are not in `recent` (their kinds were remapped).
    recent_from: usize,
    /// Whether the packed allocations' times never step back (every intact history's), and
    /// the last of them.
    packed_unsorted: bool,
    packed_last_ts: u64,
    /// The earliest and latest times of each chunk of [`crate::reorder::CHUNK`] packed
    /// allocations (16 bytes a chunk): where times step back, what bounds the allocations made
    /// by a time ([`Self::made_by`]) and the first made from a time ([`Self::made_in`]).
    chunk_bounds: Vec<(u64, u64)>,
}

/// Packed allocations whose [`Owner`] is kept plain as well (96 KiB).
const RECENT: usize = 4096;
const _: () = assert!(RECENT.is_power_of_two() && RECENT.is_multiple_of(BLOCK));

impl AllocStore {
    pub fn new() -> Self {
        Self {
            ts: Arc::default(),
            size: Arc::default(),
            address: Arc::default(),
            stack: Arc::default(),
            thread: Arc::default(),
            device: Arc::default(),
            process: Arc::default(),
            range_slot: Arc::default(),
            kind: PackedColumn::new(),
            free: FreeTimes::new(crate::free_times::SEAL),
            tail: Vec::new(),
            recent: Vec::new(),
            recent_from: 0,
            packed_unsorted: false,
            packed_last_ts: 0,
            chunk_bounds: Vec::new(),
        }
    }

    /// A store that seals free times after `seal` allocations rather than
    /// [`crate::free_times::SEAL`] (a multiple of [`BLOCK`]), for tests of the sealed history.
    #[cfg(test)]
    pub(crate) fn with_seal(seal: usize) -> Self {
        Self {
            free: FreeTimes::new(seal),
            ..Self::new()
        }
    }

    /// Full chunks of every column's packed bytes from now on go to `spill` where it takes
    /// them (`packed::Spill`).
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        for c in [
            &mut self.ts,
            &mut self.size,
            &mut self.address,
            &mut self.stack,
            &mut self.thread,
            &mut self.device,
            &mut self.process,
            &mut self.range_slot,
        ] {
            Arc::make_mut(c).set_spill(spill.clone());
        }
        self.kind.set_spill(spill.clone());
        self.free.set_spill(spill);
    }

    /// Allocations in packed blocks.
    #[inline]
    fn packed(&self) -> usize {
        self.ts.len()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.packed() + self.tail.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn push(&mut self, a: AllocRecord) {
        self.tail.push(a);
        if self.tail.len() == BLOCK {
            self.pack_tail();
        }
    }

    fn pack_tail(&mut self) {
        if self.recent.is_empty() {
            self.recent = alloc::vec![Owner::of(&self.tail[0]); RECENT];
        }
        let id = self.packed();
        let first = id % RECENT;
        let mut last = self.packed_last_ts;
        let (mut least, mut greatest) = (u64::MAX, 0);
        for (o, a) in self.recent[first..first + BLOCK].iter_mut().zip(&self.tail) {
            *o = Owner::of(a);
            self.packed_unsorted |= a.ts_nanos < last;
            last = a.ts_nanos;
            least = least.min(a.ts_nanos);
            greatest = greatest.max(a.ts_nanos);
        }
        // Blocks never straddle chunks.
        match self.chunk_bounds.get_mut(id / crate::reorder::CHUNK) {
            Some((l, g)) => (*l, *g) = ((*l).min(least), (*g).max(greatest)),
            None => self.chunk_bounds.push((least, greatest)),
        }
        self.packed_last_ts = last;
        let t = &self.tail;
        // Sizes and addresses in whole pages keep only their high bits (`PackedColumn::append`
        // finds the low zero bits a block shares); times and identifiers are stored whole.
        Arc::make_mut(&mut self.ts).append_unshifted(|k| t[k].ts_nanos);
        Arc::make_mut(&mut self.size).append_repeating(|k| t[k].size_bytes);
        Arc::make_mut(&mut self.address).append(|k| t[k].address);
        Arc::make_mut(&mut self.stack).append_unshifted(|k| u64::from(t[k].stack.0));
        Arc::make_mut(&mut self.thread).append_unshifted(|k| u64::from(t[k].thread.0));
        Arc::make_mut(&mut self.device).append_unshifted(|k| u64::from(t[k].device.0));
        Arc::make_mut(&mut self.process).append_unshifted(|k| u64::from(t[k].process.0));
        Arc::make_mut(&mut self.range_slot).append_unshifted(|k| u64::from(t[k].range_slot));
        self.kind.append_unshifted(|k| t[k].kind.code());
        let mut free_ts = [0u64; BLOCK];
        let mut free_kind = [0u8; BLOCK];
        for (k, a) in t.iter().enumerate() {
            free_ts[k] = a.free_ts_nanos;
            free_kind[k] = a.free_kind.code() as u8;
        }
        self.free.push_block(&free_ts, &free_kind, &self.ts);
        self.tail.clear();
    }

    /// Replaces each allocation's kind by `f(id, kind)`. Only the kind column is rebuilt; the
    /// others stay shared with the store this was cloned from.
    pub fn map_kinds(&mut self, f: impl Fn(usize, AllocKind) -> AllocKind) {
        let mut kinds = PackedColumn::new();
        kinds.set_spill(self.kind.spill());
        let mut buf = [0u64; BLOCK];
        for b in 0..self.kind.blocks() {
            self.kind.decode(b, &mut buf);
            let first = b * BLOCK;
            kinds.append_unshifted(|k| f(first + k, AllocKind::from_code(buf[k])).code());
        }
        self.kind = kinds;
        let first = self.packed();
        for (k, a) in self.tail.iter_mut().enumerate() {
            a.kind = f(first + k, a.kind);
        }
        // The recent owners hold the old kinds.
        self.recent_from = first;
    }

    /// The allocation with id `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn at(&self, i: usize) -> AllocRecord {
        self.at_fields(i, Fields::ALL)
    }

    /// [`Self::at`] reading only `fields` (with [`Fields::TS`] and [`Fields::FREE`]); the
    /// others hold no meaningful value (a marker in debug builds, as a pass's do).
    pub fn at_fields(&self, i: usize, fields: Fields) -> AllocRecord {
        if let Some(k) = i.checked_sub(self.packed()) {
            return self.tail[k];
        }
        let (wide, narrow) = if cfg!(debug_assertions) {
            (0xa5a5_a5a5_a5a5_a5a5u64, 0xa5a5_a5a5u64)
        } else {
            (0, 0)
        };
        let read = |on: Fields, col: &PackedColumn, off: u64| {
            if fields.has(on) { col.get(i) } else { off }
        };
        let ts_nanos = self.ts.get(i);
        let (free_ts_nanos, free_kind) = self.free.get(i, |_| ts_nanos);
        AllocRecord {
            ts_nanos,
            free_ts_nanos,
            size_bytes: read(Fields::SIZE, &self.size, wide),
            address: read(Fields::ADDRESS, &self.address, wide),
            stack: StackId(read(Fields::STACK, &self.stack, narrow) as u32),
            thread: ThreadIdx(read(Fields::THREAD, &self.thread, narrow) as u32),
            device: DeviceIdx(read(Fields::DEVICE, &self.device, narrow) as u32),
            process: ProcessIdx(read(Fields::PROCESS, &self.process, narrow) as u32),
            range_slot: read(Fields::RANGE_SLOT, &self.range_slot, narrow) as u32,
            kind: AllocKind::from_code(read(Fields::KIND, &self.kind, 0xa5)),
            free_kind: FreeKind::from_code(u64::from(free_kind)),
        }
    }

    /// What a release of `i` reads of it ([`Owner`]), when `i` is an allocation still live;
    /// `None` when there is no such allocation or it was freed already.
    #[inline]
    pub fn live_owner(&self, i: usize) -> Option<Owner> {
        if let Some(k) = i.checked_sub(self.packed()) {
            return self.tail.get(k).filter(|a| a.is_live()).map(Owner::of);
        }
        if self.free.free_ts(i, |i| self.ts.get(i)) != LIVE {
            return None;
        }
        if i + RECENT >= self.packed() && i >= self.recent_from {
            return self.recent.get(i % RECENT).copied();
        }
        Some(Owner {
            size_bytes: self.size.get(i),
            stack: StackId(self.stack.get(i) as u32),
            device: DeviceIdx(self.device.get(i) as u32),
            process: ProcessIdx(self.process.get(i) as u32),
            kind: AllocKind::from_code(self.kind.get(i)),
        })
    }

    /// The allocation with id `i`, if there is one.
    #[inline]
    pub fn get(&self, i: usize) -> Option<AllocRecord> {
        (i < self.len()).then(|| self.at(i))
    }

    pub fn last(&self) -> Option<AllocRecord> {
        self.len().checked_sub(1).map(|i| self.at(i))
    }

    /// Field `i` of the history: from the tail's record, or read from `column`.
    #[inline]
    fn field(
        &self,
        i: usize,
        column: impl FnOnce(usize) -> u64,
        in_tail: impl FnOnce(&AllocRecord) -> u64,
    ) -> u64 {
        match i.checked_sub(self.packed()) {
            Some(k) => in_tail(&self.tail[k]),
            None => column(i),
        }
    }

    /// The allocation time of `i`.
    #[inline]
    pub fn ts(&self, i: usize) -> u64 {
        self.field(i, |i| self.ts.get(i), |a| a.ts_nanos)
    }

    #[inline]
    pub fn size(&self, i: usize) -> u64 {
        self.field(i, |i| self.size.get(i), |a| a.size_bytes)
    }

    /// The free time of `i` ([`LIVE`] while live).
    #[inline]
    pub fn free_ts(&self, i: usize) -> u64 {
        self.field(
            i,
            |i| self.free.free_ts(i, |i| self.ts.get(i)),
            |a| a.free_ts_nanos,
        )
    }

    #[inline]
    pub fn is_live(&self, i: usize) -> bool {
        self.free_ts(i) == LIVE
    }

    /// Records the release of `i`.
    #[inline]
    pub fn set_free(&mut self, i: usize, ts_nanos: u64, kind: FreeKind) {
        match i.checked_sub(self.packed()) {
            Some(k) => {
                let a = &mut self.tail[k];
                a.free_ts_nanos = ts_nanos;
                a.free_kind = kind;
            }
            None => self.free.set(i, ts_nanos, kind.code() as u8),
        }
    }

    /// Every allocation in id order, every field.
    pub fn iter(&self) -> Iter<'_> {
        self.iter_range(0, self.len())
    }

    /// Every allocation in id order, with only `fields` read ([`Fields`]): for passes over a
    /// long history.
    pub fn iter_fields(&self, fields: Fields) -> Iter<'_> {
        let mut it = self.iter();
        it.fields = fields;
        it
    }

    /// Every allocation with only `fields` read, and its id, in time order (ties by id): as
    /// they are stored where the times ascend ([`Self::times_ascend`]), else reordered as they
    /// are read (`reorder`, from the chunks' earliest times the store kept as it packed: what
    /// is held is what was read ahead of the earliest time still to come, not the history).
    pub fn iter_by_time(&self, fields: Fields) -> ByTime<'_> {
        self.iter_by_time_in(fields, crate::reorder::CHUNK)
    }

    /// [`Self::iter_by_time`], reading `chunk` allocations at a time where they reorder.
    fn iter_by_time_in(&self, fields: Fields, chunk: usize) -> ByTime<'_> {
        let inner = if self.times_ascend() {
            ByTimeInner::Ascending(self.iter_fields(fields).enumerate())
        } else {
            let chunk = chunk.max(1);
            let least = if chunk == crate::reorder::CHUNK {
                self.least_by_chunk()
            } else {
                let times = self.iter_fields(Fields::TS).map(|a| a.ts_nanos);
                crate::reorder::chunk_least(times, chunk)
            };
            ByTimeInner::Reordered(
                self.iter_fields(fields | Fields::TS).enumerate(),
                crate::reorder::SortedChunks::new(least, chunk, self.len()),
            )
        };
        ByTime { inner }
    }

    /// The allocations with ids `from..`.
    pub fn iter_from(&self, from: usize) -> Iter<'_> {
        self.iter_range(from, self.len())
    }

    /// The allocations with ids `from..to`.
    pub fn iter_range(&self, from: usize, to: usize) -> Iter<'_> {
        let to = to.min(self.len());
        Iter {
            store: self,
            next: from.min(to),
            end: to,
            block: usize::MAX,
            fields: Fields::ALL,
            buf: alloc::boxed::Box::new(Block::EMPTY),
        }
    }

    /// The allocations with ids below `to` that are live at `t` ([`AllocRecord::live_at`]), in
    /// id order. Each block's bound on the free times of its allocations outside the late
    /// table (or, for the newest, its plain free times) is read first: a block freed by `t`
    /// is skipped, one whose allocations outside the late table were all freed by `t` gives
    /// only its late entries still live (each read by id), and only the others are decoded. A
    /// moment late in a long history, even a leaking one, costs a read per earlier block and
    /// one per allocation live then, not a decode of each allocation.
    /// With `to` the allocations made by `t` (`partition_point(|a| a.ts_nanos <= t)`), none
    /// after it is read.
    pub fn live_at(&self, t: u64, to: usize) -> LiveAt<'_> {
        self.live_at_fields(t, to, Fields::ALL)
    }

    /// [`Self::live_at`], reading `fields` of each allocation (and the times it needs).
    pub fn live_at_fields(&self, t: u64, to: usize, fields: Fields) -> LiveAt<'_> {
        self.live_at_range_fields(t, 0, to, fields)
    }

    /// [`Self::live_at_fields`] of the allocations with ids `from..to`.
    pub fn live_at_range_fields(
        &self,
        t: u64,
        from: usize,
        to: usize,
        fields: Fields,
    ) -> LiveAt<'_> {
        let mut all = self.iter_range(from, to);
        all.fields = fields | Fields::TS | Fields::FREE;
        let decode_late_from = if self.ts.spill().is_some() {
            DECODE_LATE_FROM_SPILLED
        } else {
            DECODE_LATE_FROM_IN_MEMORY
        };
        LiveAt {
            all,
            t,
            decode_late_from,
        }
    }

    /// Whether the allocation times never step back from one id to the next (every intact
    /// history's; a damaged or merged one may).
    pub fn times_ascend(&self) -> bool {
        let mut last = self.packed_last_ts;
        !self.packed_unsorted
            && self.tail.iter().all(|a| {
                let up = a.ts_nanos >= last;
                last = a.ts_nanos;
                up
            })
    }

    /// The earliest allocation time of each chunk of [`crate::reorder::CHUNK`], the tail's
    /// included, without a pass: what the store kept as it packed.
    fn least_by_chunk(&self) -> Vec<u64> {
        let mut least: Vec<u64> = self.chunk_bounds.iter().map(|b| b.0).collect();
        if let Some(t) = self.tail.iter().map(|a| a.ts_nanos).min() {
            match least.get_mut(self.packed() / crate::reorder::CHUNK) {
                Some(l) => *l = (*l).min(t),
                None => least.push(t),
            }
        }
        least
    }

    /// How many allocations from the first were needed to hold every allocation made by `t`:
    /// one past the last id whose time is `t` or earlier (0 for none). Where the times ascend,
    /// a search of the times ([`Self::partition_ts`]); where they step back, the last chunk
    /// whose earliest time is `t` or earlier, searched within. The bound that
    /// [`Self::live_at`] takes.
    pub fn made_by(&self, t: u64) -> usize {
        if self.times_ascend() {
            return self.partition_ts(|x| x <= t);
        }
        let packed = self.packed();
        if let Some(k) = self.tail.iter().rposition(|a| a.ts_nanos <= t) {
            return packed + k + 1;
        }
        let Some(c) = self.chunk_bounds.iter().rposition(|b| b.0 <= t) else {
            return 0;
        };
        let from = c * crate::reorder::CHUNK;
        let to = (from + crate::reorder::CHUNK).min(packed);
        let mut it = self.iter_range(from, to);
        it.fields = Fields::TS;
        it.enumerate()
            .rfind(|(_, a)| a.ts_nanos <= t)
            .map_or(from, |(k, _)| from + k + 1)
    }

    /// The ids that hold every allocation made from `from` to `to`, both included. Where the
    /// times ascend, exactly those (two searches of the times); where they step back, from the
    /// first id made at `from` or later (the first chunk whose latest time is, searched within)
    /// to [`Self::made_by`]`(to)`, so allocations outside the times lie among them and a caller
    /// filters by time.
    pub fn made_in(&self, from: u64, to: u64) -> core::ops::Range<usize> {
        if self.times_ascend() {
            let lo = self.partition_ts(|x| x < from);
            return lo..self.partition_ts(|x| x <= to).max(lo);
        }
        let hi = self.made_by(to);
        let packed = self.packed();
        let lo = match self.chunk_bounds.iter().position(|b| b.1 >= from) {
            Some(c) => {
                let start = c * crate::reorder::CHUNK;
                let end = (start + crate::reorder::CHUNK).min(packed);
                let mut it = self.iter_range(start, end);
                it.fields = Fields::TS;
                it.position(|a| a.ts_nanos >= from)
                    .map_or(end, |k| start + k)
            }
            None => {
                packed
                    + self
                        .tail
                        .iter()
                        .position(|a| a.ts_nanos >= from)
                        .unwrap_or(self.tail.len())
            }
        };
        lo..hi.max(lo)
    }

    /// The first id whose allocation time does not satisfy `pred`, where `pred` holds for a
    /// prefix of the history and not after it (as `slice::partition_point` over the times),
    /// e.g. `|t| t < at`. Reads the times' column only, narrowed by its blocks' minimums
    /// (`PackedColumn::search_sorted`), so a search reads a chunk or two wherever they lie.
    pub fn partition_ts(&self, mut pred: impl FnMut(u64) -> bool) -> usize {
        let packed = self.packed();
        let r = self.ts.search_sorted(0, packed, &mut pred, false);
        if r < packed {
            return r;
        }
        packed + self.tail.partition_point(|a| pred(a.ts_nanos))
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        [
            &self.ts,
            &self.size,
            &self.address,
            &self.stack,
            &self.thread,
            &self.device,
            &self.process,
            &self.range_slot,
            &self.kind,
        ]
        .iter()
        .map(|c| c.heap_bytes())
        .sum::<usize>()
            + self.free.heap_bytes()
            + self.tail.capacity() * core::mem::size_of::<AllocRecord>()
            + self.recent.capacity() * core::mem::size_of::<Owner>()
            + self.chunk_bounds.capacity() * 16
    }

    /// Fills `buf` with `fields` of block `b` (ids `b * BLOCK ..`); returns how many it holds.
    fn decode_block(&self, b: usize, buf: &mut Block, fields: Fields) -> usize {
        if b >= self.ts.blocks() {
            let n = if b == self.ts.blocks() {
                self.tail.len()
            } else {
                0
            };
            for (k, a) in self.tail[..n].iter().enumerate() {
                buf.set(k, a);
            }
            buf.poison(fields);
            return n;
        }
        // Packed free times are stored from the allocation times.
        if fields.has(Fields::TS) || fields.has(Fields::FREE) {
            self.ts.decode(b, &mut buf.ts);
        }
        if fields.has(Fields::SIZE) {
            self.size.decode(b, &mut buf.size);
        }
        if fields.has(Fields::ADDRESS) {
            self.address.decode(b, &mut buf.address);
        }
        let narrow = |on: Fields, col: &PackedColumn, out: &mut [u32; BLOCK]| {
            if fields.has(on) {
                col.decode_with(b, |k, v| out[k] = v as u32);
            }
        };
        narrow(Fields::STACK, &self.stack, &mut buf.stack);
        narrow(Fields::THREAD, &self.thread, &mut buf.thread);
        narrow(Fields::DEVICE, &self.device, &mut buf.device);
        narrow(Fields::PROCESS, &self.process, &mut buf.process);
        narrow(Fields::RANGE_SLOT, &self.range_slot, &mut buf.range_slot);
        if fields.has(Fields::KIND) {
            self.kind.decode_with(b, |k, v| buf.kind[k] = v as u8);
        }
        if fields.has(Fields::FREE) {
            self.free
                .decode(b, &buf.ts, &mut buf.free_ts, &mut buf.free_kind);
        }
        buf.poison(fields);
        BLOCK
    }
}

/// Serialized as the sequence of its records.
impl serde::Serialize for AllocStore {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl FromIterator<AllocRecord> for AllocStore {
    fn from_iter<I: IntoIterator<Item = AllocRecord>>(iter: I) -> Self {
        let mut s = Self::new();
        for a in iter {
            s.push(a);
        }
        s
    }
}

impl<'a> IntoIterator for &'a AllocStore {
    type Item = AllocRecord;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// One block of allocations, decoded by column.
#[derive(Clone)]
struct Block {
    ts: [u64; BLOCK],
    size: [u64; BLOCK],
    address: [u64; BLOCK],
    free_ts: [u64; BLOCK],
    stack: [u32; BLOCK],
    thread: [u32; BLOCK],
    device: [u32; BLOCK],
    process: [u32; BLOCK],
    range_slot: [u32; BLOCK],
    kind: [u8; BLOCK],
    free_kind: [u8; BLOCK],
}

impl Block {
    const EMPTY: Self = Self {
        ts: [0; BLOCK],
        size: [0; BLOCK],
        address: [0; BLOCK],
        free_ts: [0; BLOCK],
        stack: [0; BLOCK],
        thread: [0; BLOCK],
        device: [0; BLOCK],
        process: [0; BLOCK],
        range_slot: [0; BLOCK],
        kind: [0; BLOCK],
        free_kind: [0; BLOCK],
    };

    fn set(&mut self, k: usize, a: &AllocRecord) {
        self.ts[k] = a.ts_nanos;
        self.size[k] = a.size_bytes;
        self.address[k] = a.address;
        self.free_ts[k] = a.free_ts_nanos;
        self.stack[k] = a.stack.0;
        self.thread[k] = a.thread.0;
        self.device[k] = a.device.0;
        self.process[k] = a.process.0;
        self.range_slot[k] = a.range_slot;
        self.kind[k] = a.kind.code() as u8;
        self.free_kind[k] = a.free_kind.code() as u8;
    }

    /// In debug builds, overwrites the fields not in `fields` with values no trace has, so a
    /// pass reading a field it did not ask for gets results its tests catch.
    #[inline]
    fn poison(&mut self, fields: Fields) {
        if !cfg!(debug_assertions) || fields == Fields::ALL {
            return;
        }
        // Not a kind code: reads as `Other`.
        const KIND: u8 = 0xa5;
        fn fill<T: Copy>(off: bool, col: &mut [T; BLOCK], v: T) {
            if off {
                col.fill(v);
            }
        }
        let off = |f: Fields| !fields.has(f);
        let (wide, narrow) = (0xa5a5_a5a5_a5a5_a5a5u64, 0xa5a5_a5a5u32);
        fill(off(Fields::TS), &mut self.ts, wide);
        fill(off(Fields::SIZE), &mut self.size, wide);
        fill(off(Fields::ADDRESS), &mut self.address, wide);
        fill(off(Fields::FREE), &mut self.free_ts, wide);
        fill(off(Fields::STACK), &mut self.stack, narrow);
        fill(off(Fields::THREAD), &mut self.thread, narrow);
        fill(off(Fields::DEVICE), &mut self.device, narrow);
        fill(off(Fields::PROCESS), &mut self.process, narrow);
        fill(off(Fields::RANGE_SLOT), &mut self.range_slot, narrow);
        fill(off(Fields::KIND), &mut self.kind, KIND);
        fill(off(Fields::FREE), &mut self.free_kind, KIND);
    }

    #[inline]
    fn get(&self, k: usize) -> AllocRecord {
        AllocRecord {
            ts_nanos: self.ts[k],
            free_ts_nanos: self.free_ts[k],
            size_bytes: self.size[k],
            address: self.address[k],
            stack: StackId(self.stack[k]),
            thread: ThreadIdx(self.thread[k]),
            device: DeviceIdx(self.device[k]),
            process: ProcessIdx(self.process[k]),
            range_slot: self.range_slot[k],
            kind: AllocKind::from_code(u64::from(self.kind[k])),
            free_kind: FreeKind::from_code(u64::from(self.free_kind[k])),
        }
    }
}

/// Late entries live at a moment, in a block whose other allocations were freed by then, from
/// which [`LiveAt`] decodes the block rather than read each by id: where the history may lie in
/// a spill, each read by id goes through its cache, so a few make a decode worth it; in memory
/// a read by id costs a few loads per field, and decoding six columns of 64 values pays from
/// about eight (the decode benchmark's peak pass, three live per block: 12 instructions per
/// event fewer by id).
const DECODE_LATE_FROM_SPILLED: usize = 3;
const DECODE_LATE_FROM_IN_MEMORY: usize = 8;

/// Allocations live at a moment ([`AllocStore::live_at`]).
#[derive(Clone)]
pub struct LiveAt<'a> {
    all: Iter<'a>,
    t: u64,
    /// [`DECODE_LATE_FROM_SPILLED`] or [`DECODE_LATE_FROM_IN_MEMORY`].
    decode_late_from: usize,
}

impl Iterator for LiveAt<'_> {
    type Item = AllocRecord;

    fn next(&mut self) -> Option<AllocRecord> {
        let it = &mut self.all;
        let (store, t) = (it.store, self.t);
        while it.next < it.end {
            let b = it.next / BLOCK;
            if b != it.block && b < store.ts.blocks() {
                // A packed block not decoded: skip it whole when every allocation in it was
                // made after `t` (its least time is past it: after the peak, a moment early in
                // a long history) or freed by `t`, and read only its late entries when the
                // others were.
                if store.ts.block_min(b) > t {
                    it.next = ((b + 1) * BLOCK).min(it.end);
                    continue;
                }
                let (from, to) = (it.next % BLOCK, (it.end - b * BLOCK).min(BLOCK));
                match store.free.live_in(b, from, to, t) {
                    LiveIn::None => {
                        it.next = ((b + 1) * BLOCK).min(it.end);
                        continue;
                    }
                    // Several to read: the block decoded costs less than each read by id.
                    LiveIn::Late(_, n) if n >= self.decode_late_from => {}
                    LiveIn::Late(id, _) => {
                        it.next = id + 1;
                        let a = store.at_fields(id, it.fields);
                        if a.live_at(t) {
                            return Some(a);
                        }
                        continue;
                    }
                    LiveIn::Any => {}
                }
            }
            let a = it.next()?;
            if a.live_at(t) {
                return Some(a);
            }
        }
        None
    }
}

/// [`AllocStore::iter_by_time`].
pub struct ByTime<'a> {
    inner: ByTimeInner<'a>,
}

enum ByTimeInner<'a> {
    Ascending(core::iter::Enumerate<Iter<'a>>),
    Reordered(
        core::iter::Enumerate<Iter<'a>>,
        crate::reorder::SortedChunks<(u64, u32), AllocRecord>,
    ),
}

impl Iterator for ByTime<'_> {
    type Item = (usize, AllocRecord);

    #[inline]
    fn next(&mut self) -> Option<(usize, AllocRecord)> {
        match &mut self.inner {
            ByTimeInner::Ascending(it) => it.next(),
            ByTimeInner::Reordered(it, order) => order
                .next(
                    |t, i| (t, i),
                    || it.next().map(|(i, a)| ((a.ts_nanos, i as u32), a)),
                )
                .map(|((_, i), a)| (i as usize, a)),
        }
    }
}

/// Allocations in id order, decoded a block at a time.
#[derive(Clone)]
pub struct Iter<'a> {
    store: &'a AllocStore,
    next: usize,
    end: usize,
    /// The block `buf` holds (`usize::MAX`: none yet).
    block: usize,
    /// The fields decoded.
    fields: Fields,
    buf: alloc::boxed::Box<Block>,
}

impl Iterator for Iter<'_> {
    type Item = AllocRecord;

    #[inline]
    fn next(&mut self) -> Option<AllocRecord> {
        if self.next >= self.end {
            return None;
        }
        let b = self.next / BLOCK;
        if b != self.block {
            self.store.decode_block(b, &mut self.buf, self.fields);
            self.block = b;
        }
        let a = self.buf.get(self.next % BLOCK);
        self.next += 1;
        Some(a)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<AllocRecord> {
        self.next = self.next.saturating_add(n).min(self.end);
        self.next()
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<AllocRecord> {
        if self.next >= self.end {
            return None;
        }
        self.end -= 1;
        Some(self.store.at(self.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LIVE;
    use alloc::format;
    use proptest::prelude::*;

    fn record(i: u64, seed: u64) -> AllocRecord {
        let h = (i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        AllocRecord {
            ts_nanos: i * 1000 + (h & 0xff),
            free_ts_nanos: if h.is_multiple_of(3) {
                LIVE
            } else {
                i * 1000 + h % 1_000_000
            },
            size_bytes: (h >> 8) % (1 << (h % 40)),
            address: 0x7f00_0000_0000 + (h >> 20),
            stack: StackId((h % 7) as u32),
            thread: ThreadIdx((i / 100) as u32),
            device: DeviceIdx(0),
            process: ProcessIdx((h % 2) as u32),
            range_slot: (i / 10) as u32,
            kind: AllocKind::from_code(h % 9),
            free_kind: FreeKind::from_code(h % 4),
        }
    }

    fn same(a: &AllocRecord, b: &AllocRecord) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    /// `n` of [`record`], a fifth of them made `lag` earlier.
    fn stepping_back(n: usize, seed: u64, lag: u64) -> Vec<AllocRecord> {
        (0..n as u64)
            .map(|i| {
                let mut a = record(i, seed);
                if (i ^ seed).is_multiple_of(5) {
                    a.ts_nanos = a.ts_nanos.saturating_sub(lag);
                }
                a
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// What bounds the allocations made by a time is one past the last id made by then, in
        /// a history in order and in ones whose times step back by a little or a lot, with
        /// the last ones unpacked; and what is live then, read up to it, is what is live.
        #[test]
        fn made_by_bounds_the_allocations_made_by_then(
            n in 0usize..10_000,
            seed in any::<u64>(),
            lag in prop_oneof![Just(0u64), Just(3_000), Just(300_000), Just(1u64 << 40)],
            at in 0.0f64..1.2,
        ) {
            let records = stepping_back(n, seed, lag);
            let store: AllocStore = records.iter().copied().collect();
            let t = (n as f64 * 1000.0 * at) as u64;
            let want = records.iter().rposition(|a| a.ts_nanos <= t).map_or(0, |i| i + 1);
            prop_assert_eq!(store.made_by(t), want);
            let live: Vec<alloc::string::String> = records
                .iter()
                .filter(|a| a.live_at(t))
                .map(|a| format!("{a:?}"))
                .collect();
            let got: Vec<alloc::string::String> = store
                .live_at(t, store.made_by(t))
                .map(|a| format!("{a:?}"))
                .collect();
            prop_assert_eq!(got, live);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The ids made in a span hold every allocation made in it, in a history in order
        /// (exactly those) and in ones whose times step back, with the last ones unpacked; and
        /// they start at the first id made at its start or later.
        #[test]
        fn made_in_holds_the_allocations_made_in_a_span(
            n in 0usize..10_000,
            seed in any::<u64>(),
            lag in prop_oneof![Just(0u64), Just(3_000), Just(300_000), Just(1u64 << 40)],
            at in 0.0f64..1.2,
            width in prop_oneof![Just(0u64), 0u64..50_000],
        ) {
            let records = stepping_back(n, seed, lag);
            let store: AllocStore = records.iter().copied().collect();
            let from = (n as f64 * 1000.0 * at) as u64;
            let to = from + width;
            let span = store.made_in(from, to);
            let inside = |a: &AllocRecord| (from..=to).contains(&a.ts_nanos);
            let want: Vec<usize> = (0..n).filter(|&i| inside(&records[i])).collect();
            let got: Vec<usize> = span.clone().filter(|&i| inside(&records[i])).collect();
            prop_assert_eq!(&got, &want);
            let first = records.iter().position(|a| a.ts_nanos >= from).unwrap_or(n);
            prop_assert_eq!(span.start, first);
            if lag == 0 {
                prop_assert_eq!(span.len(), want.len());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The allocations by time are those sorted by time, then id, with every field: in a
        /// history in order, and in ones where a fifth step back by a few allocations, by
        /// many, or by nearly the whole history, read in chunks of any size.
        #[test]
        fn allocations_by_time_are_the_sorted_ones(
            n in 0usize..10_000,
            seed in any::<u64>(),
            lag in prop_oneof![Just(0u64), Just(3_000), Just(300_000), Just(1u64 << 40)],
            chunk in prop_oneof![Just(crate::reorder::CHUNK), 1usize..100],
        ) {
            let records = stepping_back(n, seed, lag);
            let store: AllocStore = records.iter().copied().collect();
            let mut want: Vec<(usize, AllocRecord)> = records.iter().copied().enumerate().collect();
            want.sort_by_key(|(i, a)| (a.ts_nanos, *i));
            let got: Vec<(usize, AllocRecord)> =
                store.iter_by_time_in(Fields::ALL, chunk).collect();
            prop_assert_eq!(got.len(), want.len());
            for ((gi, ga), (wi, wa)) in got.iter().zip(&want) {
                prop_assert_eq!(gi, wi);
                prop_assert!(same(ga, wa), "{:?} {:?}", ga, wa);
            }
        }
    }

    /// What a release reads of each live allocation is its fields, whether it is among the
    /// recent owners, older, or in the tail, and after its kinds are remapped; none for a
    /// freed one.
    #[test]
    fn live_owners_are_the_records_fields() {
        let n = RECENT * 3 + 100;
        let want: Vec<AllocRecord> = (0..n as u64).map(|i| record(i, 11)).collect();
        let mut s: AllocStore = want.iter().copied().collect();
        let check = |s: &AllocStore, kind: &dyn Fn(usize, AllocKind) -> AllocKind| {
            for (i, a) in want.iter().enumerate() {
                let mut b = *a;
                b.kind = kind(i, b.kind);
                let owner = s.live_owner(i);
                if a.is_live() {
                    assert_eq!(owner, Some(Owner::of(&b)), "at {i}");
                } else {
                    assert_eq!(owner, None, "at {i}");
                }
            }
        };
        check(&s, &|_, k| k);
        let kind = |i: usize, k: AllocKind| {
            if i.is_multiple_of(3) {
                AllocKind::Other
            } else {
                k
            }
        };
        s.map_kinds(kind);
        check(&s, &kind);
    }

    proptest! {
        /// Whether the times ascend is known without a pass: a step back anywhere, packed or
        /// in the tail, is seen.
        #[test]
        fn times_ascend_unless_one_steps_back(
            gaps in proptest::collection::vec(0u64..5, 0..300),
            back in proptest::option::of(any::<proptest::sample::Index>()),
        ) {
            let mut times: Vec<u64> = gaps.iter().scan(0, |t, g| { *t += g; Some(*t) }).collect();
            if let (Some(b), false) = (back, times.is_empty()) {
                let i = b.index(times.len());
                times[i] = times[i].saturating_sub(3);
            }
            let s: AllocStore = times
                .iter()
                .enumerate()
                .map(|(i, &t)| AllocRecord { ts_nanos: t, ..record(i as u64, 5) })
                .collect();
            prop_assert_eq!(s.times_ascend(), times.is_sorted());
        }

        #[test]
        fn records_round_trip(n in 0usize..400, seed in any::<u64>(), from in 0usize..450) {
            let want: Vec<AllocRecord> = (0..n as u64).map(|i| record(i, seed)).collect();
            let mut s: AllocStore = want.iter().copied().collect();
            prop_assert_eq!(s.len(), n);
            for (i, a) in want.iter().enumerate() {
                prop_assert!(same(&s.at(i), a));
            }
            prop_assert!(s.iter().zip(&want).all(|(a, b)| same(&a, b)));
            prop_assert_eq!(s.iter().count(), n);
            prop_assert_eq!(s.iter_from(from).count(), n.saturating_sub(from));
            prop_assert!(s.iter_from(from).zip(want.iter().skip(from)).all(|(a, b)| same(&a, b)));
            prop_assert!(s.iter().rev().zip(want.iter().rev()).all(|(a, b)| same(&a, b)));
            if n > 0 {
                s.set_free(n / 2, 5, FreeKind::ContextTeardown);
                prop_assert_eq!(s.at(n / 2).free_ts_nanos, 5);
                prop_assert_eq!(s.iter().nth(n / 2).map(|a| a.free_kind), Some(FreeKind::ContextTeardown));
            }
            let t = 1000 * (n as u64 / 2);
            prop_assert_eq!(s.partition_ts(|x| x < t), want.partition_point(|a| a.ts_nanos < t));
            // A clone with other kinds: the clone changes, the original does not.
            let kind = |i: usize, k: AllocKind| if i.is_multiple_of(3) { AllocKind::Other } else { k };
            let before: Vec<AllocRecord> = s.iter().collect();
            let mut other = s.clone();
            other.map_kinds(kind);
            prop_assert_eq!(other.len(), n);
            for (i, a) in other.iter().enumerate() {
                let mut b = before[i];
                b.kind = kind(i, b.kind);
                prop_assert!(same(&a, &b), "at {}", i);
                prop_assert!(same(&other.at(i), &b), "at {}", i);
            }
            prop_assert!(s.iter().zip(&before).all(|(a, b)| same(&a, b)));
        }

        /// With free times sealed every 128 allocations (packed as lifetimes, the live ones in
        /// the late table), every way of reading the history gives what a plain list of records
        /// holds, through releases made before and after sealing, a free time before the
        /// allocation's (a damaged trace), and a history made of freed records.
        #[test]
        fn sealed_free_times_read_as_plain_records(
            n in 0usize..1500, seed in any::<u64>(), t in 0u64..2_000_000, to in 0usize..1600,
            releases in proptest::collection::vec((any::<usize>(), any::<usize>(), 0u64..3_000), 0..600),
        ) {
            let mut s = AllocStore::with_seal(128);
            let mut want: Vec<AllocRecord> = Vec::new();
            let mut r = releases.into_iter();
            for i in 0..n as u64 {
                let a = record(i, seed);
                s.push(a);
                want.push(a);
                // Now and then, release an allocation made earlier, if it is still live.
                if i % 3 == 0
                    && let Some((pick, kind, late)) = r.next()
                {
                    let k = pick % want.len();
                    if want[k].is_live() {
                        // Sometimes before it was made (a damaged trace).
                        let at = (want[k].ts_nanos + late * 500).saturating_sub(1_000_000 * u64::from(late % 7 == 0));
                        let kind = FreeKind::from_code(kind as u64 % 4);
                        s.set_free(k, at, kind);
                        want[k].free_ts_nanos = at;
                        want[k].free_kind = kind;
                    }
                }
            }
            prop_assert_eq!(s.len(), n);
            for (i, a) in want.iter().enumerate() {
                prop_assert!(same(&s.at(i), a), "at {}", i);
                prop_assert_eq!(s.free_ts(i), a.free_ts_nanos);
                prop_assert_eq!(s.is_live(i), a.is_live());
            }
            prop_assert!(s.iter().zip(&want).all(|(a, b)| same(&a, b)));
            let to = to.min(n);
            for t in [t, 0, u64::MAX] {
                let plain: Vec<&AllocRecord> = want[..to].iter().filter(|a| a.live_at(t)).collect();
                let got: Vec<AllocRecord> = s.live_at(t, to).collect();
                prop_assert_eq!(got.len(), plain.len(), "t {}", t);
                let key = |a: &AllocRecord| (a.ts_nanos, a.free_ts_nanos, a.size_bytes, a.stack);
                let some: Vec<_> = s.live_at_fields(t, to, Fields::SIZE.and(Fields::STACK)).map(|a| key(&a)).collect();
                prop_assert_eq!(some, plain.iter().map(|a| key(a)).collect::<Vec<_>>(), "t {}", t);
                prop_assert!(got.iter().zip(plain).all(|(a, b)| same(a, b)), "t {}", t);
            }
        }

        /// The live set at a moment skips whole blocks freed by then and still finds exactly
        /// the allocations a plain filter finds, in order, whatever bound it is given.
        #[test]
        fn the_live_set_is_a_plain_filter(
            n in 0usize..700, seed in any::<u64>(), t in 0u64..800_000, to in 0usize..750,
            early in 0usize..700,
            frees in proptest::collection::vec((any::<usize>(), 0u64..800_000), 0..300),
        ) {
            let mut s: AllocStore = (0..n as u64).map(|i| record(i, seed)).collect();
            // The first allocations are freed right after they are made, so whole blocks hold
            // none live at a later `t`; then scattered frees.
            for i in 0..early.min(n) {
                let at = s.at(i).ts_nanos + 1;
                s.set_free(i, at, FreeKind::Immediate);
            }
            for (i, at) in frees {
                if n > 0 {
                    s.set_free(i % n, at, FreeKind::Immediate);
                    s.set_free((i % n) / 2, at / 4, FreeKind::Immediate);
                }
            }
            for t in [t, 0, u64::MAX] {
                let want: Vec<AllocRecord> = s.iter_range(0, to).filter(|a| a.live_at(t)).collect();
                let got: Vec<AllocRecord> = s.live_at(t, to).collect();
                prop_assert_eq!(got.len(), want.len(), "t {}", t);
                prop_assert!(got.iter().zip(&want).all(|(a, b)| same(a, b)), "t {}", t);
                let sizes: Vec<u64> = s.live_at_fields(t, to, Fields::SIZE).map(|a| a.size_bytes).collect();
                prop_assert_eq!(sizes, want.iter().map(|a| a.size_bytes).collect::<Vec<_>>());
                let key = |a: &AllocRecord| (a.ts_nanos, a.free_ts_nanos, a.stack, a.process);
                let some: Vec<_> = s.live_at_fields(t, to, Fields::STACK.and(Fields::PROCESS)).map(|a| key(&a)).collect();
                prop_assert_eq!(some, want.iter().map(key).collect::<Vec<_>>());
                // From any id on: the same filter over those ids.
                for from in [0, 1, BLOCK - 1, BLOCK, to / 2, to.saturating_sub(3), to] {
                    let want: Vec<AllocRecord> = s.iter_range(from, to).filter(|a| a.live_at(t)).collect();
                    let got: Vec<AllocRecord> = s.live_at_range_fields(t, from, to, Fields::ALL).collect();
                    prop_assert_eq!(got.len(), want.len(), "t {} from {}", t, from);
                    prop_assert!(got.iter().zip(&want).all(|(a, b)| same(a, b)), "t {} from {}", t, from);
                }
            }
        }

        /// A pass that asks for some fields reads them as a full pass does, in packed blocks
        /// and the tail, sealed free times included; in debug builds the others read as
        /// values no trace has.
        #[test]
        fn a_pass_reads_the_fields_it_asks_for(
            n in 0usize..700, seed in any::<u64>(), pick in 1u16..(1 << 10),
            frees in proptest::collection::vec((any::<usize>(), 0u64..800_000), 0..300),
        ) {
            let mut s = AllocStore::with_seal(128);
            for i in 0..n as u64 {
                s.push(record(i, seed));
            }
            for (i, at) in frees {
                if n > 0 {
                    s.set_free(i % n, at, FreeKind::StreamOrdered);
                }
            }
            let fields = Fields(pick);
            let read = |a: &AllocRecord| {
                let mut v: Vec<u64> = Vec::new();
                let mut put = |f: Fields, x: u64| if fields.has(f) { v.push(x) };
                put(Fields::TS, a.ts_nanos);
                put(Fields::SIZE, a.size_bytes);
                put(Fields::ADDRESS, a.address);
                put(Fields::STACK, u64::from(a.stack.0));
                put(Fields::THREAD, u64::from(a.thread.0));
                put(Fields::DEVICE, u64::from(a.device.0));
                put(Fields::PROCESS, u64::from(a.process.0));
                put(Fields::RANGE_SLOT, u64::from(a.range_slot));
                put(Fields::KIND, a.kind.code());
                put(Fields::FREE, a.free_ts_nanos);
                put(Fields::FREE, a.free_kind.code());
                v
            };
            let want: Vec<Vec<u64>> = s.iter().map(|a| read(&a)).collect();
            let got: Vec<Vec<u64>> = s.iter_fields(fields).map(|a| read(&a)).collect();
            prop_assert_eq!(got, want);
            if cfg!(debug_assertions) && !fields.has(Fields::SIZE) {
                prop_assert!(s.iter_fields(fields).all(|a| a.size_bytes == 0xa5a5_a5a5_a5a5_a5a5));
            }
        }
    }
}
