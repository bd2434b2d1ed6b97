//! Step-function timelines (live bytes over time) with a min/max pyramid, so a chart of any
//! zoom range costs O(pixels · log n) regardless of how many events the trace has.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use serde::Serialize;

use crate::packed::{BLOCK, Column, Spill};
use crate::points::{Lane, LaneRef, PointColumns};

/// Pyramid fan-out: each level summarises blocks of `FANOUT` entries of the level below.
const FANOUT: usize = 16;

/// A step function: `values[i]` holds from `times[i]` until `times[i + 1]`.
///
/// Cloning is cheap: clones share their points until one of them is pushed to (copy on write),
/// so a model whose only series equals its total keeps the points once.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    data: Arc<PointsData>,
}

/// The points, their times and values packed side by side ([`PointColumns`]).
#[derive(Clone, Debug, Default)]
struct PointsData {
    points: PointColumns,
    /// The pyramid: `levels[k]` holds (min, max) per block of `FANOUT^(k+1)` points. None for
    /// `FANOUT` points or fewer; above level 0, a level is there while the one below has more
    /// than `FANOUT` entries.
    levels: Vec<Level>,
}

/// A level of the pyramid, a sixteenth as many entries as the level below. A timeline whose
/// points may spill (a long trace's, natively) packs its levels by column with the same spill,
/// so that they go to disk with them rather than staying in memory (level 0 alone would be
/// 300 MB at 300M events, level 1 another 19 MB); otherwise (the page, short traces) each is
/// a plain vector, the fastest to read.
#[derive(Clone, Debug)]
enum Level {
    Here(Vec<(u64, u64)>),
    Packed(Box<MinMax>),
}

/// A level packed: its minima and maxima, each a column.
#[derive(Clone, Debug)]
struct MinMax {
    min: Column,
    max: Column,
}

impl Level {
    /// An empty level for points that spill to `spill` (`capacity` entries reserved for a
    /// vector).
    fn new(spill: Option<Arc<dyn Spill>>, capacity: usize) -> Self {
        match spill {
            None => Self::Here(Vec::with_capacity(capacity)),
            Some(s) => {
                let (mut min, mut max) = (Column::new(), Column::new());
                min.set_spill(Some(Arc::clone(&s)));
                max.set_spill(Some(s));
                Self::Packed(Box::new(MinMax { min, max }))
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Here(v) => v.len(),
            Self::Packed(p) => p.min.len(),
        }
    }

    fn push(&mut self, (lo, hi): (u64, u64)) {
        match self {
            Self::Here(v) => v.push((lo, hi)),
            Self::Packed(p) => {
                p.min.push(lo);
                p.max.push(hi);
            }
        }
    }

    /// The first entry in `[from, to)` whose highest value is at least `target`.
    fn first_at_least(&self, from: usize, to: usize, target: u64) -> Option<usize> {
        match self {
            Self::Here(v) => v
                .get(from..to.min(v.len()))?
                .iter()
                .position(|e| e.1 >= target)
                .map(|k| from + k),
            Self::Packed(p) => {
                let mut found = None;
                scan(&p.max, from, to, |i, v| {
                    if v >= target {
                        found = Some(i);
                    }
                    found.is_none()
                });
                found
            }
        }
    }

    /// The lowest and highest of entries `[from, to)` (`(u64::MAX, 0)` when empty).
    fn min_max(&self, from: usize, to: usize) -> (u64, u64) {
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        match self {
            Self::Here(v) => {
                for &(a, b) in &v[from.min(to)..to] {
                    lo = lo.min(a);
                    hi = hi.max(b);
                }
            }
            Self::Packed(p) => {
                each(&p.min, from, to, |v| lo = lo.min(v));
                each(&p.max, from, to, |v| hi = hi.max(v));
            }
        }
        (lo, hi)
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Self::Here(v) => v.capacity() * 16,
            Self::Packed(p) => {
                p.min.heap_bytes() + p.max.heap_bytes() + core::mem::size_of::<MinMax>()
            }
        }
    }

    /// Full chunks from now on go to `spill`; a vector becomes columns when there is one.
    fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        match (&mut *self, spill) {
            (Self::Packed(p), spill) => {
                p.min.set_spill(spill.clone());
                p.max.set_spill(spill);
            }
            (Self::Here(v), Some(s)) => {
                let mut packed = Self::new(Some(s), 0);
                for &e in v.iter() {
                    packed.push(e);
                }
                *self = packed;
            }
            (Self::Here(_), None) => {}
        }
    }
}

/// The pyramid made as its level 0's entries come, every level at once: the entries of each
/// level are folded into the level above as they arrive, so making it reads nothing back (a
/// long trace's points, and the lower levels, lie on disk by then).
#[derive(Clone, Debug, Default)]
struct PyramidBuilder {
    levels: Vec<Level>,
    /// `open[k]`: the entry of level `k + 1` that folds the entries of level `k` since its
    /// last group of `FANOUT` began (not yet pushed, so one per level that has entries).
    open: Vec<(u64, u64)>,
    spill: Option<Arc<dyn Spill>>,
    /// Points expected, for the vectors' capacities (0: unknown).
    points: usize,
}

impl PyramidBuilder {
    fn new(spill: Option<Arc<dyn Spill>>, points: usize) -> Self {
        Self {
            spill,
            points,
            ..Self::default()
        }
    }

    fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        for level in &mut self.levels {
            level.set_spill(spill.clone());
        }
        self.spill = spill;
    }

    fn heap_bytes(&self) -> usize {
        levels_heap_bytes(&self.levels) + self.open.capacity() * 16
    }

    /// Adds the pyramid's entries of `values` (a whole block of points, or the last ones) to
    /// level 0: an entry per [`FANOUT`] values, the last one of fewer where they end.
    fn add_groups(&mut self, values: &[u64]) {
        for c in values.chunks(FANOUT) {
            let e = crate::packed::min_max(c);
            self.push(0, e);
        }
    }

    /// Appends entry `e` to level `k`, and the group it closes, if any, to the level above.
    fn push(&mut self, mut k: usize, mut e: (u64, u64)) {
        loop {
            let Some(level) = self.levels.get_mut(k) else {
                // The level's first entry (`k` is the number of levels: each is made by the
                // one below, which has entries).
                let capacity = self.points / FANOUT.pow(k as u32 + 1) + 1;
                let mut level = Level::new(self.spill.clone(), capacity);
                level.push(e);
                self.levels.push(level);
                self.open.push(e);
                return;
            };
            let n = level.len();
            level.push(e);
            if n.is_multiple_of(FANOUT) {
                // `e` begins a group: the one before it is whole, an entry of level `k + 1`.
                e = core::mem::replace(&mut self.open[k], e);
                k += 1;
            } else {
                self.open[k] = fold(self.open[k], e);
                return;
            }
        }
    }

    /// The levels, each one's last entry folding the partial group of the level below, up to
    /// the first level of [`FANOUT`] entries or fewer.
    fn finish(mut self) -> Vec<Level> {
        let mut k = 0;
        while self.levels.get(k).is_some_and(|l| l.len() > FANOUT) {
            let e = self.open[k];
            self.push(k + 1, e);
            k += 1;
        }
        self.levels.truncate(k + 1);
        self.levels
    }
}

/// A column read a block's range at a time: a packed pyramid level's [`Column`], or the
/// points' times or values.
trait Ranged {
    fn len(&self) -> usize;
    /// [`Column::decode_range_with`].
    fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64));
}

impl Ranged for Column {
    #[inline(always)]
    fn len(&self) -> usize {
        Column::len(self)
    }

    #[inline(always)]
    fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64)) {
        Column::decode_range_with(self, b, from, to, f);
    }
}

impl Ranged for LaneRef<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        LaneRef::len(self)
    }

    #[inline(always)]
    fn decode_range_with(&self, b: usize, from: usize, to: usize, f: impl FnMut(usize, u64)) {
        LaneRef::decode_range_with(self, b, from, to, f);
    }
}

/// Calls `f(i, value)` for the values `i` of `col` in `[from, to)` (`to` capped at its
/// length), in order, until it returns false. Only the values asked for are decoded: the
/// pyramid's searches read a few points at each end of a range.
fn scan(col: &impl Ranged, from: usize, to: usize, mut f: impl FnMut(usize, u64) -> bool) {
    let to = to.min(col.len());
    let mut i = from;
    while i < to {
        let b = i / BLOCK;
        let stop = to.min((b + 1) * BLOCK);
        let mut go = true;
        col.decode_range_with(b, i, stop, |j, v| go = go && f(j, v));
        if !go {
            return;
        }
        i = stop;
    }
}

/// Calls `f(value)` for every value of `col` in `[from, to)` (`to` capped at its length),
/// decoding only those: [`scan`] without a way to stop, for folds.
fn each(col: &impl Ranged, from: usize, to: usize, mut f: impl FnMut(u64)) {
    let to = to.min(col.len());
    let mut i = from;
    while i < to {
        let b = i / BLOCK;
        let stop = to.min((b + 1) * BLOCK);
        col.decode_range_with(b, i, stop, |_, v| f(v));
        i = stop;
    }
}

impl PointsData {
    #[inline]
    fn len(&self) -> usize {
        self.points.len()
    }

    #[inline(always)]
    fn times(&self) -> LaneRef<'_> {
        self.points.lane(Lane::Times)
    }

    #[inline(always)]
    fn values(&self) -> LaneRef<'_> {
        self.points.lane(Lane::Values)
    }

    /// [`Timeline::push`].
    #[inline(always)]
    fn push(&mut self, t: u64, v: u64) {
        self.push_then(t, v, |_| {});
    }

    /// [`Self::push`], calling `full` with a block of values once it is full, before it is
    /// packed.
    #[inline(always)]
    fn push_then(&mut self, t: u64, v: u64, full: impl FnOnce(&[u64])) {
        let t = match self.points.last_time() {
            Some(last) if t < last => last,
            _ => t,
        };
        self.points.push_then(t, v, full);
    }

    fn heap_bytes(&self) -> usize {
        self.points.heap_bytes() + levels_heap_bytes(&self.levels)
    }

    /// Levels of the pyramid.
    fn levels(&self) -> usize {
        self.levels.len()
    }

    #[inline]
    fn time(&self, i: usize) -> u64 {
        self.times().get(i)
    }

    #[inline]
    fn value(&self, i: usize) -> u64 {
        self.values().get(i)
    }

    /// The first index whose time does not satisfy `pred` (true for a prefix of the times,
    /// which never decrease).
    fn partition_time(&self, pred: impl FnMut(u64) -> bool) -> usize {
        self.times().search_sorted(0, self.len(), pred, false)
    }
}

/// Heap bytes of a pyramid's levels.
fn levels_heap_bytes(levels: &Vec<Level>) -> usize {
    levels.capacity() * core::mem::size_of::<Level>()
        + levels.iter().map(Level::heap_bytes).sum::<usize>()
}

/// A timeline being filled by one owner, point by point: [`Timeline::push`] without checking,
/// at every point, that the points are not shared (an atomic operation the replay of every
/// allocation and free would otherwise pay). [`Self::build`] makes the timeline.
///
/// The pyramid is made as the points come (an entry of level 0 per `FANOUT` (16) points, and
/// each level's groups folded into the one above), so [`Self::build`] reads no point back: a
/// long trace's points lie on disk by then (the model's spill), and reading them again for the
/// pyramid had been a pass over a gigabyte at 300M events.
#[derive(Clone, Debug, Default)]
pub struct TimelineBuilder {
    data: PointsData,
    /// The pyramid of the full groups of points so far.
    pyramid: PyramidBuilder,
}

impl TimelineBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder whose points' full chunks go to `spill` where it takes them
    /// (`packed::Spill`).
    pub fn spilling(spill: Option<Arc<dyn Spill>>) -> Self {
        let mut b = Self::new();
        b.set_spill(spill);
        b
    }

    /// Full chunks of the points (and of the pyramid's levels) from now on go to `spill`
    /// where it takes them. The levels pack by column from then on, as
    /// [`Timeline::build_index`] makes them for points that spill.
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.data.points.set_spill(spill.clone());
        self.pyramid.set_spill(spill);
    }

    /// [`Timeline::push`].
    #[inline]
    pub fn push(&mut self, t: u64, v: u64) {
        let pyramid = &mut self.pyramid;
        self.data.push_then(t, v, |block| pyramid.add_groups(block));
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }

    /// [`Timeline::heap_bytes`] of the points so far.
    pub fn heap_bytes(&self) -> usize {
        self.data.heap_bytes() + self.pyramid.heap_bytes()
    }

    /// The timeline of the points pushed, its pyramid built from the levels made as they
    /// came: the same pyramid as [`Timeline::build_index`] makes from the points.
    pub fn build(mut self) -> Timeline {
        let mut data = self.data;
        if data.len() > FANOUT {
            self.pyramid.add_groups(data.points.pending_values());
            data.levels = self.pyramid.finish();
        }
        Timeline {
            data: Arc::new(data),
        }
    }
}

/// The (min, max) of two (min, max) pairs.
#[inline]
fn fold((lo, hi): (u64, u64), (a, b): (u64, u64)) -> (u64, u64) {
    (lo.min(a), hi.max(b))
}

/// One chart column: the value range reached during `[t_start, t_end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Bucket {
    pub t_start: u64,
    pub t_end: u64,
    pub min: u64,
    pub max: u64,
    /// The value at the end of the column.
    pub last: u64,
}

impl Timeline {
    /// An upper bound of the heap one point takes (times and values packed at most 8 bytes
    /// each, and its share of the pyramid), for memory budgets.
    pub const POINT_HEAP_BYTES: usize = 24;
    /// An upper bound of the heap an empty timeline takes once it has a point or two.
    pub const EMPTY_HEAP_BYTES: usize = core::mem::size_of::<PointsData>() + 16 + 64;

    pub fn new() -> Self {
        Self::default()
    }

    /// Heap bytes held by the points and the pyramid.
    pub fn heap_bytes(&self) -> usize {
        self.data.heap_bytes()
    }

    /// Appends a point. Times must not decrease; a point at the same time as the previous one
    /// still counts for min/max (the intermediate value existed, if only for an instant).
    #[inline]
    pub fn push(&mut self, t: u64, v: u64) {
        Arc::make_mut(&mut self.data).push(t, v);
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }

    /// The time of point `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn time(&self, i: usize) -> u64 {
        self.data.time(i)
    }

    /// The value of point `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub fn value(&self, i: usize) -> u64 {
        self.data.value(i)
    }

    /// The first point's time.
    pub fn first_time(&self) -> Option<u64> {
        (!self.is_empty()).then(|| self.time(0))
    }

    /// The last point's value.
    pub fn last_value(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.value(i))
    }

    /// The first point index whose time does not satisfy `pred`, which must hold for a prefix
    /// of the points (as `slice::partition_point` over the times), e.g. `|t| t < t0`.
    pub fn partition_point(&self, pred: impl FnMut(u64) -> bool) -> usize {
        self.data.partition_time(pred)
    }

    /// [`Self::partition_point`] within point indices `[lo, hi)`: the first index there whose
    /// time does not satisfy `pred`, or `hi` (capped at `len()`).
    pub fn partition_point_in(&self, lo: usize, hi: usize, pred: impl FnMut(u64) -> bool) -> usize {
        self.data.times().search_sorted(lo, hi, pred, false)
    }

    /// [`Self::partition_point_in`] over `[lo, len())`, searched onwards from `lo`: it costs
    /// about the log of the distance to the answer, so a forward walk through the points in
    /// steps costs the log of each step.
    pub fn partition_point_from(&self, lo: usize, pred: impl FnMut(u64) -> bool) -> usize {
        self.data.times().search_sorted(lo, self.len(), pred, true)
    }

    /// For each of `times`, which must never decrease, the number of points at or before it
    /// (`partition_point(|x| x <= t)`), into the same place of `out`, which must be at least
    /// as long. One search per time, as [`Self::partition_point_from`] walks onwards, except
    /// that each time's reads of the points do not wait on the answer for the one before: a
    /// chart's columns are searched with their reads of the model overlapping.
    pub fn points_until_each(&self, times: &[u64], out: &mut [usize]) {
        debug_assert!(times.is_sorted());
        self.data.times().count_at_most_each(times, out);
    }

    /// The points `(time, value)` in order.
    pub fn points(&self) -> Points<'_> {
        self.points_from(0)
    }

    /// The points from index `from` on.
    pub fn points_from(&self, from: usize) -> Points<'_> {
        Points {
            data: &self.data,
            next: from,
            end: self.len(),
            block: usize::MAX,
            times: [0; BLOCK],
            values: [0; BLOCK],
        }
    }

    /// The value at time `t` (0 before the first point).
    pub fn value_at(&self, t: u64) -> u64 {
        let i = self.data.partition_time(|x| x <= t);
        if i == 0 { 0 } else { self.data.value(i - 1) }
    }

    /// Builds the min/max pyramid. Call once all points are pushed.
    pub fn build_index(&mut self) {
        let d = Arc::make_mut(&mut self.data);
        d.levels.clear();
        if d.len() <= FANOUT {
            return;
        }
        // Every level made as level 0's entries come; none is read back.
        let mut pyramid = PyramidBuilder::new(d.points.spill(), d.len());
        let mut buf = [0u64; BLOCK];
        for b in 0.. {
            let n = d.values().decode_block(b, &mut buf);
            if n == 0 {
                break;
            }
            pyramid.add_groups(&buf[..n]);
        }
        d.levels = pyramid.finish();
    }

    /// Min and max over point indices `[i, j)`.
    pub fn range_min_max(&self, mut i: usize, j: usize) -> Option<(u64, u64)> {
        let j = j.min(self.data.len());
        if i >= j {
            return None;
        }
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        // Walk up: consume unaligned heads and tails at each level.
        let mut level: usize = 0;
        let mut block = 1usize;
        let mut end = j;
        loop {
            let next_block = block * FANOUT;
            let has_next = level < self.data.levels();
            // `i` and `end` are multiples of `block` here.
            let mut take = |from: usize, to: usize| {
                let (a, b) = self.entries_min_max(level, from / block, to / block);
                lo = lo.min(a);
                hi = hi.max(b);
            };
            if !has_next || end - i < 2 * next_block {
                // Finish at this level.
                take(i, end);
                return Some((lo, hi));
            }
            let (i2, end2) = (i.next_multiple_of(next_block), end - end % next_block);
            take(i, i2);
            take(end2, end);
            (i, end) = (i2, end2);
            level += 1;
            block = next_block;
        }
    }

    /// The first point index in `[i, j)` whose value is at least `target` (with `target` the
    /// range's maximum: where that maximum is first reached). Walks the pyramid: up from `i`,
    /// a level's entries at a time until the next level's are aligned; along the highest level
    /// whose entries fit; down again through the range's end. The first entry found that
    /// reaches `target` is searched down one level at a time. Each step scans a run of one
    /// level's entries, so a call reads O(FANOUT · levels) entries, not the range's points.
    pub fn first_at_least(&self, i: usize, j: usize, target: u64) -> Option<usize> {
        let j = j.min(self.data.len());
        let levels = self.data.levels();
        let (mut k, mut level, mut block) = (i, 0usize, 1usize);
        // Up, while an entry of the next level fits in `[k, j)` once `k` is aligned to it.
        while k < j && level < levels {
            let next = block * FANOUT;
            let aligned = k.next_multiple_of(next);
            if aligned.saturating_add(next) > j {
                break;
            }
            if let Some(e) = self.first_entry(level, k / block, aligned / block, target) {
                return Some(self.down(level, e, target));
            }
            (k, level, block) = (aligned, level + 1, next);
        }
        // Along and down: the whole entries of each level in `[k, j)`, then the rest below.
        while k < j {
            let end = k + (j - k) / block * block;
            if let Some(e) = self.first_entry(level, k / block, end / block, target) {
                return Some(self.down(level, e, target));
            }
            if level == 0 {
                break;
            }
            (k, level, block) = (end, level - 1, block / FANOUT);
        }
        None
    }

    /// The first entry in `[from, to)` of `level` (0: the points) whose highest value is at
    /// least `target`.
    fn first_entry(&self, level: usize, from: usize, to: usize, target: u64) -> Option<usize> {
        if from >= to {
            return None;
        }
        match level {
            0 => {
                let mut found = None;
                self.scan_values(from, to, |i, v| {
                    if v >= target {
                        found = Some(i);
                    }
                    found.is_none()
                });
                found
            }
            _ => self.data.levels[level - 1].first_at_least(from, to, target),
        }
    }

    /// The first point under entry `e` of `level` whose value is at least `target`, which
    /// the entry's highest value reaches.
    fn down(&self, mut level: usize, mut e: usize, target: u64) -> usize {
        while level > 0 {
            level -= 1;
            let (from, to) = (e * FANOUT, (e + 1) * FANOUT);
            // The entry's maximum is one of its children's: the fallback is never taken.
            e = self.first_entry(level, from, to, target).unwrap_or(from);
        }
        e
    }

    /// The lowest and highest of entries `[from, to)` of `level` (`(u64::MAX, 0)` when
    /// empty); level 0's points are decoded a block at a time rather than read one by one.
    fn entries_min_max(&self, level: usize, from: usize, to: usize) -> (u64, u64) {
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        if level == 0 {
            each(&self.data.values(), from, to, |v| {
                lo = lo.min(v);
                hi = hi.max(v);
            });
        } else {
            (lo, hi) = self.data.levels[level - 1].min_max(from, to);
        }
        (lo, hi)
    }

    /// Calls `f(i, value)` for the points `i` in `[from, to)` in order (`to` at most the
    /// length) until it returns false.
    fn scan_values(&self, from: usize, to: usize, f: impl FnMut(usize, u64) -> bool) {
        scan(&self.data.values(), from, to, f);
    }

    /// Downsamples `[t0, t1)` into `columns` buckets of equal time width. The columns' ends are
    /// searched side by side ([`Self::points_until_each`]: the log of the points, over an
    /// in-memory index, the blocks' first times and then one block), and each column's value
    /// range comes from the pyramid, so a call costs about O(columns · log) however many
    /// points the window holds.
    pub fn downsample(&self, t0: u64, t1: u64, columns: usize) -> Vec<Bucket> {
        self.downsample_spans(t0, t1, columns).0
    }

    /// [`Self::downsample`], with where each column's points are: for a caller that samples
    /// the same timeline over the same columns again (the stacked call sites' whole).
    pub fn downsample_spans(&self, t0: u64, t1: u64, columns: usize) -> (Vec<Bucket>, Spans) {
        let mut out = Vec::with_capacity(columns);
        let mut idx = self.data.partition_time(|x| x < t0);
        let mut spans = Spans {
            start: idx,
            ends: Vec::with_capacity(columns),
        };
        if columns == 0 || t1 <= t0 {
            return (out, spans);
        }
        let span = t1 - t0;
        // Column c starts at t0 + span * c / columns; in u64 when that cannot overflow (spans
        // under 185 days), as u128 arithmetic is a library call in wasm.
        let wide = span.checked_mul(columns as u64).is_none();
        let edge = |c: usize| -> u64 {
            if wide {
                t0 + ((u128::from(span) * c as u128) / columns as u128) as u64
            } else {
                t0 + span * c as u64 / columns as u64
            }
        };
        // Where each column's points end, all searched side by side: the points before the
        // next column's start are those at or before the time before it (none before 0).
        let lasts: Vec<u64> = (1..=columns).map(|c| edge(c).saturating_sub(1)).collect();
        spans.ends.resize(columns, 0);
        self.points_until_each(&lasts, &mut spans.ends);
        for (end, c) in spans.ends.iter_mut().zip(1..) {
            if edge(c) == 0 {
                *end = 0;
            }
        }
        // The value carried into the column: the last one before it.
        let mut carried = idx.checked_sub(1).map_or(0, |i| self.data.value(i));
        for c in 0..columns {
            let (a, b) = (edge(c), edge(c + 1));
            let end = spans.ends[c];
            let (mut lo, mut hi) = (carried, carried);
            let mut last = carried;
            if let Some((l, h)) = self.range_min_max(idx, end) {
                lo = lo.min(l);
                hi = hi.max(h);
                last = self.data.value(end - 1);
            }
            out.push(Bucket {
                t_start: a,
                t_end: b,
                min: lo,
                max: hi,
                last,
            });
            carried = last;
            idx = end;
        }
        (out, spans)
    }

    /// Whether `self` and `other` are one timeline (clones that share their points).
    pub fn shares_points(&self, other: &Timeline) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }
}

/// Where the columns of a [`Timeline::downsample_spans`] call have their points: column `c`
/// holds point indices `[start, ends[0])` for `c = 0`, else `[ends[c - 1], ends[c])`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    pub start: usize,
    pub ends: Vec<usize>,
}

impl Spans {
    /// The point indices of column `c`.
    pub fn of(&self, c: usize) -> (usize, usize) {
        let from = c.checked_sub(1).map_or(self.start, |p| self.ends[p]);
        (from, self.ends[c])
    }
}

/// A timeline's points `(time, value)` in order, decoded a block at a time.
pub struct Points<'a> {
    data: &'a PointsData,
    next: usize,
    end: usize,
    block: usize,
    times: [u64; BLOCK],
    values: [u64; BLOCK],
}

impl Iterator for Points<'_> {
    type Item = (u64, u64);

    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.next >= self.end {
            return None;
        }
        let b = self.next / BLOCK;
        if b != self.block {
            self.data.times().decode_block(b, &mut self.times);
            self.data.values().decode_block(b, &mut self.values);
            self.block = b;
        }
        let k = self.next % BLOCK;
        self.next += 1;
        Some((self.times[k], self.values[k]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Points<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_at_least_finds_the_first_maximum_of_any_range() {
        // Values with many repeats of the maximum, and ranges of every alignment.
        let mut t = Timeline::new();
        let n = 5_000u64;
        for k in 0..n {
            t.push(k, (k * 7919 + k / 97) % 1000);
        }
        t.build_index();
        let values: Vec<u64> = t.points().map(|p| p.1).collect();
        let mut seed = 12_345u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % m
        };
        let mut ranges = alloc::vec![
            (0, 5_000),
            (17, 18),
            (0, 1),
            (4_999, 5_000),
            (8, 72),
            (64, 576)
        ];
        for _ in 0..2_000 {
            let a = next(n) as usize;
            ranges.push((a, a + 1 + next(n - a as u64) as usize));
        }
        for (i, j) in ranges {
            let max = t.range_min_max(i, j).expect("non-empty").1;
            let want = (i..j).find(|&k| values[k] == max);
            assert_eq!(t.first_at_least(i, j, max), want, "[{i}, {j})");
            assert_eq!(t.first_at_least(i, j, max + 1), None, "[{i}, {j})");
            // Below the maximum: the first value that reaches it, wherever it lies.
            for target in [0, max / 3, max / 2, max.saturating_sub(1)] {
                let want = (i..j).find(|&k| values[k] >= target);
                assert_eq!(
                    t.first_at_least(i, j, target),
                    want,
                    "[{i}, {j}) at least {target}"
                );
            }
        }
        assert_eq!(t.first_at_least(10, 10, 0), None);
    }
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pyramid_min_max_equals_brute_force(vals in proptest::collection::vec(0u64..1000, 1..600), a in 0usize..600, b in 0usize..600) {
            let mut t = Timeline::new();
            for (i, v) in vals.iter().enumerate() { t.push(i as u64, *v); }
            t.build_index();
            let (i, j) = (a.min(b).min(vals.len()), a.max(b).min(vals.len()));
            let brute = vals[i..j].iter().fold(None, |acc: Option<(u64,u64)>, &v| Some(match acc { None => (v, v), Some((l, h)) => (l.min(v), h.max(v)) }));
            prop_assert_eq!(t.range_min_max(i, j), brute);
        }
    }

    proptest! {
        /// Downsampling equals a point-by-point reference for any window and column count.
        #[test]
        fn downsample_equals_a_linear_reference(
            steps in proptest::collection::vec((0u64..40, 0u64..1000), 0..400),
            a in 0u64..9000, w in 1u64..9000, cols in 1usize..300, first in 0u64..200,
        ) {
            // Points from `first` on: at 0 too, where a column's start has no time before it.
            let mut t = Timeline::new();
            let mut ts = first;
            for (dt, v) in &steps { ts += dt; t.push(ts, *v); }
            t.build_index();
            let (times, values): (Vec<u64>, Vec<u64>) = t.points().unzip();
            let (got, spans) = t.downsample_spans(a, a + w, cols);
            prop_assert_eq!(&got, &t.downsample(a, a + w, cols));
            prop_assert_eq!(got.len(), cols);
            for (c, b) in got.iter().enumerate() {
                let i = times.partition_point(|&x| x < b.t_start);
                let j = times.partition_point(|&x| x < b.t_end);
                prop_assert_eq!(spans.of(c), (i, j));
                let carried = if i == 0 { 0 } else { values[i - 1] };
                let lo = values[i..j].iter().copied().fold(carried, u64::min);
                let hi = values[i..j].iter().copied().fold(carried, u64::max);
                let last = if j == 0 { 0 } else { values[j - 1] };
                prop_assert_eq!((b.min, b.max, b.last), (lo, hi, last));
            }
        }
    }

    /// The same points with and without a spill: the spilling one packs the pyramid's level 0
    /// with its points.
    fn both(values: &[u64], spill: Arc<dyn Spill>) -> (Timeline, Timeline) {
        let (mut here, mut away) = (
            TimelineBuilder::new(),
            TimelineBuilder::spilling(Some(spill)),
        );
        for (k, &v) in values.iter().enumerate() {
            here.push(k as u64 * 3, v);
            away.push(k as u64 * 3, v);
        }
        (here.build(), away.build())
    }

    /// Ranges, maxima and downsampling agree between the two, over `ranges` and windows.
    fn agree(here: &Timeline, away: &Timeline, ranges: &[(usize, usize)]) {
        let n = here.len();
        for &(a, b) in ranges {
            let (i, j) = (a.min(b).min(n), a.max(b).min(n));
            let mm = here.range_min_max(i, j);
            assert_eq!(mm, away.range_min_max(i, j), "[{i}, {j})");
            if let Some((_, hi)) = mm {
                for target in [hi, hi / 2, hi + 1] {
                    assert_eq!(
                        here.first_at_least(i, j, target),
                        away.first_at_least(i, j, target),
                        "[{i}, {j}) at least {target}"
                    );
                }
            }
            let (t0, t1) = (i as u64 * 3, j as u64 * 3 + 1);
            assert_eq!(here.downsample(t0, t1, 97), away.downsample(t0, t1, 97));
        }
    }

    proptest! {
        #[test]
        fn a_spilling_pyramid_answers_as_one_in_memory(
            values in proptest::collection::vec(0u64..1000, 0..3000),
            ranges in proptest::collection::vec((0usize..3000, 0usize..3000), 1..40),
        ) {
            let spill = Arc::new(crate::packed::tests::VecSpill::default());
            let (here, away) = both(&values, spill);
            if values.len() > FANOUT {
                let packed = away.data.levels.iter().all(|l| matches!(l, Level::Packed(_)));
                prop_assert!(packed, "a spilling timeline packs its levels");
                let plain = here.data.levels.iter().all(|l| matches!(l, Level::Here(_)));
                prop_assert!(plain, "one without a spill keeps vectors");
            }
            agree(&here, &away, &ranges);
        }
    }

    /// A level 0 long enough to fill chunks of the spill is read back from it.
    #[test]
    fn a_spilled_pyramid_is_read_back_from_the_spill() {
        let mut seed = 7u64;
        let values: Vec<u64> = (0..400_000)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                seed >> 8
            })
            .collect();
        // The points alone, spilled.
        let spill = Arc::new(crate::packed::tests::VecSpill::default());
        let (mut times, mut vals) = (Column::new(), Column::new());
        times.set_spill(Some(spill.clone()));
        vals.set_spill(Some(spill.clone()));
        for (k, &v) in values.iter().enumerate() {
            times.push_ascending(k as u64 * 3);
            vals.push(v);
        }
        let points = spill.held_bytes();
        drop((times, vals));
        let (here, away) = both(&values, spill.clone());
        // `both` spills the points again, and level 0 with them.
        assert!(
            spill.held_bytes() > 2 * points,
            "{} of {points}",
            spill.held_bytes()
        );
        let ranges: Vec<(usize, usize)> = (0..300)
            .map(|k| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let a = (seed >> 20) as usize % values.len();
                (a, a + [17, 300, 5_000, 120_000][k % 4])
            })
            .chain([(0, values.len())])
            .collect();
        let before = spill.reads.load(core::sync::atomic::Ordering::Relaxed);
        agree(&here, &away, &ranges);
        assert!(
            away.data.levels.len() >= 3,
            "{} levels",
            away.data.levels.len()
        );
        for level in &away.data.levels {
            let Level::Packed(p) = level else {
                panic!("a spilling timeline packs its levels");
            };
            assert!(p.min.spill().is_some() && p.max.spill().is_some());
        }
        assert!(spill.reads.load(core::sync::atomic::Ordering::Relaxed) > before);
    }

    /// Every level of a timeline's pyramid, read entry by entry.
    fn levels_of(t: &Timeline) -> Vec<Vec<(u64, u64)>> {
        let levels = &t.data.levels;
        levels
            .iter()
            .map(|l| (0..l.len()).map(|i| l.min_max(i, i + 1)).collect())
            .collect()
    }

    /// The pyramid by its definition: level 0 folds groups of `FANOUT` points, each level
    /// above groups of `FANOUT` entries of the one below, while that one has more than
    /// `FANOUT`; none at all for `FANOUT` points or fewer.
    fn reference_levels(values: &[u64]) -> Vec<Vec<(u64, u64)>> {
        let fold_all = |c: &[(u64, u64)]| c.iter().fold((u64::MAX, 0), |a, &e| fold(a, e));
        let mut levels: Vec<Vec<(u64, u64)>> = Vec::new();
        if values.len() <= FANOUT {
            return levels;
        }
        let pairs: Vec<(u64, u64)> = values.iter().map(|&v| (v, v)).collect();
        levels.push(pairs.chunks(FANOUT).map(fold_all).collect());
        while let Some(top) = levels.last()
            && top.len() > FANOUT
        {
            let next = top.chunks(FANOUT).map(fold_all).collect();
            levels.push(next);
        }
        levels
    }

    proptest! {
        /// The pyramid a builder makes as the points come is the one `build_index` makes from
        /// them afterwards, level by level, with its level 0 packed where the points spill
        /// (also when the spill comes after some points).
        #[test]
        fn a_builders_pyramid_is_the_one_built_from_its_points(
            steps in proptest::collection::vec((0u64..40, any::<u64>()), 0..9000),
            spill_after in proptest::option::of(0usize..9000),
            small in any::<bool>(),
        ) {
            let mut b = TimelineBuilder::new();
            let mut t = Timeline::new();
            let spill: Arc<dyn Spill> = Arc::new(crate::packed::tests::VecSpill::default());
            let mut ts = 0u64;
            for (k, &(dt, v)) in steps.iter().enumerate() {
                if spill_after == Some(k) {
                    b.set_spill(Some(Arc::clone(&spill)));
                    Arc::make_mut(&mut t.data).points.set_spill(Some(Arc::clone(&spill)));
                }
                ts += dt;
                let v = if small { v % 1000 } else { v };
                b.push(ts, v);
                t.push(ts, v);
            }
            let built = b.build();
            t.build_index();
            prop_assert_eq!(built.len(), t.len());
            prop_assert_eq!(built.data.levels(), t.data.levels());
            prop_assert_eq!(levels_of(&built), levels_of(&t));
            let values: Vec<u64> = t.points().map(|p| p.1).collect();
            prop_assert_eq!(levels_of(&t), reference_levels(&values));
            let packed = |x: &Timeline| -> Vec<bool> {
                x.data.levels.iter().map(|l| matches!(l, Level::Packed(_))).collect()
            };
            prop_assert_eq!(packed(&built), packed(&t));
            let n = t.len();
            agree(&t, &built, &[(0, n), (n / 3, n / 2), (17, 18), (5, 4000)]);
        }
    }

    /// Columns narrower than a nanosecond from time 0: those ending at 0 hold no point, even
    /// when points lie at 0.
    #[test]
    fn columns_ending_at_zero_hold_no_point() {
        let mut t = Timeline::new();
        for (ts, v) in [(0, 5), (0, 7), (2, 1), (4, 9)] {
            t.push(ts, v);
        }
        t.build_index();
        let (buckets, spans) = t.downsample_spans(0, 5, 20);
        // Columns 0..4 start at 0 and end at 0 but for column 3 (5 * 4 / 20 = 1).
        assert_eq!(spans.ends[..4], [0, 0, 0, 2]);
        assert_eq!((buckets[0].max, buckets[3].max, buckets[3].last), (0, 7, 7));
    }

    #[test]
    fn downsample_covers_carried_value_and_spikes() {
        let mut t = Timeline::new();
        t.push(0, 10);
        t.push(50, 100);
        t.push(51, 10);
        t.build_index();
        let b = t.downsample(0, 100, 2);
        assert_eq!(b[0].max, 10);
        assert_eq!(b[1].max, 100);
        assert_eq!(b[1].min, 10);
        assert_eq!(b[1].last, 10);
        assert_eq!(t.value_at(50), 100);
        assert_eq!(t.value_at(49), 10);
    }
}
