//! The NVTX range instances of a replayed trace, stored by column like the allocation history
//! (`alloc_store`): each field in its own [`PackedColumn`], blocks of [`BLOCK`] packed once
//! [`KEEP`] newer instances follow them. A range's end, live bytes after, peak and counts are
//! written after it begins, so recent instances stay plain; an instance still open when its
//! block is packed keeps those fields in a table of late ones, which its end and peaks update.
//! That table holds only the ranges that outlive [`KEEP`] newer ones (an epoch around the
//! iterations, a range never ended). An instance of a training trace takes about 21 bytes,
//! against 96 as a struct.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::format::{ProcessIdx, RangeId, StringId, ThreadIdx};
use crate::packed::{BLOCK, PackedColumn, Spill};

/// One NVTX range instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RangeInstance {
    pub range: RangeId,
    pub name: StringId,
    pub domain: StringId,
    pub thread: ThreadIdx,
    pub process: ProcessIdx,
    pub begin_ts_nanos: u64,
    /// `None` when the range never ended.
    pub end_ts_nanos: Option<u64>,
    /// Device live bytes of the process at begin and at end.
    pub live_before_bytes: u64,
    pub live_after_bytes: u64,
    /// Highest device live bytes of the process while the range was open.
    pub peak_bytes: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    /// Parent instance slot (index + 1), 0 for a top-level range.
    pub parent_slot: u32,
}

impl RangeInstance {
    pub const fn growth_bytes(&self) -> i64 {
        // Saturates for hostile values instead of overflowing.
        let d = self.live_after_bytes as i128 - self.live_before_bytes as i128;
        if d > i64::MAX as i128 {
            i64::MAX
        } else if d < i64::MIN as i128 {
            i64::MIN
        } else {
            d as i64
        }
    }
}

/// Instances kept plain behind the newest before a block is packed: a range still open after
/// this many newer ones began goes to the late table.
pub const KEEP: usize = 1024;
const _: () = assert!(KEEP.is_multiple_of(BLOCK));

/// The fields set after a range begins, as the late table holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Later {
    end_ts_nanos: Option<u64>,
    live_after_bytes: u64,
    peak_bytes: u64,
    alloc_count: u64,
    alloc_bytes: u64,
}

impl Later {
    const fn of(r: &RangeInstance) -> Self {
        Self {
            end_ts_nanos: r.end_ts_nanos,
            live_after_bytes: r.live_after_bytes,
            peak_bytes: r.peak_bytes,
            alloc_count: r.alloc_count,
            alloc_bytes: r.alloc_bytes,
        }
    }

    fn write(self, r: &mut RangeInstance) {
        r.end_ts_nanos = self.end_ts_nanos;
        r.live_after_bytes = self.live_after_bytes;
        r.peak_bytes = self.peak_bytes;
        r.alloc_count = self.alloc_count;
        r.alloc_bytes = self.alloc_bytes;
    }
}

/// Columns, in order. Values are chosen so that a block of alike instances packs small: the
/// end as its distance from the begin, the live bytes after and the peak as signed distances
/// from the live bytes before, the parent as its distance back from the instance.
const RANGE: usize = 0;
const NAME: usize = 1;
const DOMAIN: usize = 2;
const THREAD: usize = 3;
const PROCESS: usize = 4;
const BEGIN: usize = 5;
/// 0: never ended; 1 + (end - begin, wrapping): ended.
const END: usize = 6;
const BEFORE: usize = 7;
const AFTER: usize = 8;
const PEAK: usize = 9;
const COUNT: usize = 10;
const BYTES: usize = 11;
const PARENT: usize = 12;
const COLUMNS: usize = 13;

/// Signed distance, reversible for every pair (zigzag of the wrapping difference).
const fn zigzag_from(base: u64, v: u64) -> u64 {
    let d = v.wrapping_sub(base) as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

const fn unzigzag_to(base: u64, z: u64) -> u64 {
    let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
    base.wrapping_add(d as u64)
}

/// The end's code: the flag and the distance in one value, except for the one distance
/// (`u64::MAX`, an end just before the begin) whose code would wrap to 0, written in the
/// late table instead (`fits`).
const fn end_code(r: &RangeInstance) -> Option<u64> {
    match r.end_ts_nanos {
        None => Some(0),
        Some(e) => {
            let d = e.wrapping_sub(r.begin_ts_nanos);
            if d == u64::MAX { None } else { Some(d + 1) }
        }
    }
}

const fn parent_code(slot: u64, parent: u32) -> u64 {
    let parent = parent as u64;
    if parent == 0 {
        0
    } else if parent < slot {
        slot - parent
    } else {
        // Not a parent before it (a hand-made history): apart from every distance back.
        (1 << 32) + parent
    }
}

const fn parent_of(slot: u64, code: u64) -> u32 {
    if code == 0 {
        0
    } else if code < 1 << 32 {
        (slot - code) as u32
    } else {
        (code - (1 << 32)) as u32
    }
}

/// Every NVTX range instance of a trace in the order they began (see the module
/// documentation).
#[derive(Clone, Debug, Default)]
pub struct RangeStore {
    cols: [PackedColumn; COLUMNS],
    /// Per packed block: which of its instances are in `late`.
    late_mask: Vec<u64>,
    /// Packed instances whose later fields changed, or could change, after packing, by index.
    late: Vec<(u32, Later)>,
    /// The instances after the packed blocks (a ring: packing takes from its front).
    plain: VecDeque<RangeInstance>,
}

impl RangeStore {
    pub const fn new() -> Self {
        Self {
            cols: [const { PackedColumn::new() }; COLUMNS],
            late_mask: Vec::new(),
            late: Vec::new(),
            plain: VecDeque::new(),
        }
    }

    /// Full chunks of the packed columns from now on go to `spill` (where it takes them).
    pub fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        for c in &mut self.cols {
            c.set_spill(spill.clone());
        }
    }

    /// Instances in packed blocks.
    #[inline]
    fn packed(&self) -> usize {
        self.cols[RANGE].len()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.packed() + self.plain.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends an instance; its index is `len()` before the call.
    pub fn push(&mut self, r: RangeInstance) {
        self.plain.push_back(r);
        if self.plain.len() >= KEEP + BLOCK {
            self.pack_front();
        }
    }

    /// Packs every whole block of plain instances, the open ones to the late table: for a
    /// history that will not grow (the end of a replay).
    pub fn pack_all(&mut self) {
        while self.plain.len() >= BLOCK {
            self.pack_front();
        }
    }

    /// Packs the oldest [`BLOCK`] plain instances.
    fn pack_front(&mut self) {
        let first = self.packed();
        let block: [RangeInstance; BLOCK] = core::array::from_fn(|k| self.plain[k]);
        let block = &block;
        let mut mask = 0u64;
        for (k, r) in block.iter().enumerate() {
            // Still open (its end and peaks may change), or an end no code holds.
            if r.end_ts_nanos.is_none() || end_code(r).is_none() {
                mask |= 1 << k;
                self.late.push(((first + k) as u32, Later::of(r)));
            }
        }
        let slot = |k: usize| (first + k + 1) as u64;
        let c = &mut self.cols;
        c[RANGE].append_unshifted(|k| block[k].range.0);
        c[NAME].append_unshifted(|k| u64::from(block[k].name.0));
        c[DOMAIN].append_unshifted(|k| u64::from(block[k].domain.0));
        c[THREAD].append_unshifted(|k| u64::from(block[k].thread.0));
        c[PROCESS].append_unshifted(|k| u64::from(block[k].process.0));
        c[BEGIN].append_unshifted(|k| block[k].begin_ts_nanos);
        // Late instances read their later fields from the table: zeros here pack smaller.
        let late = |k: usize| mask & (1 << k) != 0;
        let later = |k: usize, v: u64| if late(k) { 0 } else { v };
        c[END].append_unshifted(|k| later(k, end_code(&block[k]).unwrap_or(0)));
        c[BEFORE].append(|k| block[k].live_before_bytes);
        c[AFTER].append(|k| {
            let r = &block[k];
            later(k, zigzag_from(r.live_before_bytes, r.live_after_bytes))
        });
        c[PEAK].append(|k| {
            let r = &block[k];
            later(k, zigzag_from(r.live_before_bytes, r.peak_bytes))
        });
        c[COUNT].append_unshifted(|k| later(k, block[k].alloc_count));
        c[BYTES].append(|k| later(k, block[k].alloc_bytes));
        c[PARENT].append_unshifted(|k| parent_code(slot(k), block[k].parent_slot));
        self.late_mask.push(mask);
        self.plain.drain(..BLOCK);
    }

    /// The late table's entry of packed instance `i`, if it has one.
    #[inline]
    fn late_index(&self, i: usize) -> Option<usize> {
        if self.late_mask[i / BLOCK] & (1 << (i % BLOCK)) == 0 {
            return None;
        }
        self.late.binary_search_by_key(&(i as u32), |e| e.0).ok()
    }

    /// The instance at `i` (index = slot - 1).
    pub fn get(&self, i: usize) -> Option<RangeInstance> {
        if i >= self.len() {
            return None;
        }
        if i >= self.packed() {
            return Some(self.plain[i - self.packed()]);
        }
        let v = |c: usize| self.cols[c].get(i);
        let mut r = self.assemble(i, v);
        if let Some(e) = self.late_index(i) {
            self.late[e].1.write(&mut r);
        }
        Some(r)
    }

    /// The instance `i` of packed values `v(column)` (its later fields as packed).
    #[inline]
    fn assemble(&self, i: usize, v: impl Fn(usize) -> u64) -> RangeInstance {
        let begin = v(BEGIN);
        let before = v(BEFORE);
        let end = v(END);
        RangeInstance {
            range: RangeId(v(RANGE)),
            name: StringId(v(NAME) as u32),
            domain: StringId(v(DOMAIN) as u32),
            thread: ThreadIdx(v(THREAD) as u32),
            process: ProcessIdx(v(PROCESS) as u32),
            begin_ts_nanos: begin,
            end_ts_nanos: (end != 0).then(|| begin.wrapping_add(end - 1)),
            live_before_bytes: before,
            live_after_bytes: unzigzag_to(before, v(AFTER)),
            peak_bytes: unzigzag_to(before, v(PEAK)),
            alloc_count: v(COUNT),
            alloc_bytes: v(BYTES),
            parent_slot: parent_of(i as u64 + 1, v(PARENT)),
        }
    }

    /// The name of instance `i`, reading only its column.
    pub fn name(&self, i: usize) -> Option<StringId> {
        if i >= self.packed() {
            return self.plain.get(i - self.packed()).map(|r| r.name);
        }
        Some(StringId(self.cols[NAME].get(i) as u32))
    }

    /// The name and domain of instance `i`, reading only their columns: what names its scope.
    pub fn name_and_domain(&self, i: usize) -> Option<(StringId, StringId)> {
        if i >= self.packed() {
            return self
                .plain
                .get(i - self.packed())
                .map(|r| (r.name, r.domain));
        }
        Some((
            StringId(self.cols[NAME].get(i) as u32),
            StringId(self.cols[DOMAIN].get(i) as u32),
        ))
    }

    /// A reader of instances' names that decodes a block of names at a time and keeps the
    /// last two: for lookups that mostly stay near the instances looked up last (an
    /// allocation's instance, then the ones it runs inside).
    pub fn names(&self) -> NameCursor<'_> {
        NameCursor {
            store: self,
            blocks: [usize::MAX; 2],
            names: [[0; BLOCK]; 2],
        }
    }

    /// The end and parent slot of instance `i`, reading only theirs: what a walk up the
    /// instance tree reads at each step.
    pub fn end_and_parent(&self, i: usize) -> Option<(Option<u64>, u32)> {
        if i >= self.packed() {
            return self
                .plain
                .get(i - self.packed())
                .map(|r| (r.end_ts_nanos, r.parent_slot));
        }
        let parent = parent_of(i as u64 + 1, self.cols[PARENT].get(i));
        let end = match self.late_index(i) {
            Some(e) => self.late[e].1.end_ts_nanos,
            None => {
                let code = self.cols[END].get(i);
                (code != 0).then(|| self.cols[BEGIN].get(i).wrapping_add(code - 1))
            }
        };
        Some((end, parent))
    }

    /// Changes instance `i` through `f`, which may change only the fields set after a range
    /// begins (its end, live bytes after, peak and counts). False when there is no `i`.
    pub fn update(&mut self, i: usize, f: impl FnOnce(&mut RangeInstance)) -> bool {
        let packed = self.packed();
        if i >= packed {
            return match self.plain.get_mut(i - packed) {
                Some(r) => {
                    f(r);
                    true
                }
                None => false,
            };
        }
        let Some(mut r) = self.get(i) else {
            return false;
        };
        let begun = r;
        f(&mut r);
        debug_assert!(
            r.range == begun.range
                && r.begin_ts_nanos == begun.begin_ts_nanos
                && r.parent_slot == begun.parent_slot,
            "a packed range's begin fields changed"
        );
        let later = Later::of(&r);
        match self.late_index(i) {
            Some(e) => self.late[e].1 = later,
            None if later == Later::of(&begun) => {}
            None => {
                // A packed instance that ended: only the model's own replay changes those,
                // and only while a range is open, so this is a caller's change of a closed
                // range. Kept exact through the table.
                let at = self.late.partition_point(|e| e.0 < i as u32);
                self.late.insert(at, (i as u32, later));
                self.late_mask[i / BLOCK] |= 1 << (i % BLOCK);
            }
        }
        true
    }

    /// The instances in order, a block decoded at a time.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            store: self,
            next: 0,
            block: [[0; BLOCK]; COLUMNS],
            late: 0,
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.cols
            .iter()
            .map(PackedColumn::heap_bytes)
            .sum::<usize>()
            + self.late_mask.capacity() * 8
            + self.late.capacity() * core::mem::size_of::<(u32, Later)>()
            + self.plain.capacity() * core::mem::size_of::<RangeInstance>()
    }
}

crate::samples::sequence_traits!(RangeStore, RangeInstance);

/// [`RangeStore::names`]: the names of instances by index, through the two blocks of the
/// name column decoded last.
pub struct NameCursor<'a> {
    store: &'a RangeStore,
    /// The blocks held, the one used last first.
    blocks: [usize; 2],
    names: [[u64; BLOCK]; 2],
}

impl NameCursor<'_> {
    /// The name of instance `i`, as [`RangeStore::name`] reads it.
    #[inline]
    pub fn name(&mut self, i: usize) -> Option<StringId> {
        let packed = self.store.packed();
        if i >= packed {
            return self.store.plain.get(i - packed).map(|r| r.name);
        }
        let b = i / BLOCK;
        if self.blocks[0] != b {
            if self.blocks[1] == b {
                self.blocks.swap(0, 1);
                self.names.swap(0, 1);
            } else {
                self.blocks[1] = self.blocks[0];
                self.names[1] = self.names[0];
                self.store.cols[NAME].decode(b, &mut self.names[0]);
                self.blocks[0] = b;
            }
        }
        Some(StringId(self.names[0][i % BLOCK] as u32))
    }
}

/// [`RangeStore::iter`].
pub struct Iter<'a> {
    store: &'a RangeStore,
    next: usize,
    /// The current packed block's values, by column.
    block: [[u64; BLOCK]; COLUMNS],
    /// The first late-table entry not yet passed.
    late: usize,
}

impl Iterator for Iter<'_> {
    type Item = RangeInstance;

    fn next(&mut self) -> Option<RangeInstance> {
        let s = self.store;
        let i = self.next;
        if i >= s.len() {
            return None;
        }
        self.next += 1;
        if i >= s.packed() {
            return Some(s.plain[i - s.packed()]);
        }
        let (b, k) = (i / BLOCK, i % BLOCK);
        if k == 0 {
            for (c, out) in self.block.iter_mut().enumerate() {
                s.cols[c].decode(b, out);
            }
        }
        let block = &self.block;
        let mut r = s.assemble(i, |c| block[c][k]);
        if s.late_mask[b] & (1 << k) != 0 {
            while s.late[self.late].0 < i as u32 {
                self.late += 1;
            }
            s.late[self.late].1.write(&mut r);
        }
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.store.len() - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a RangeStore {
    type Item = RangeInstance;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn instance() -> impl Strategy<Value = RangeInstance> {
        // Alike values (as a trace's are) and any values (as a hostile one's may be).
        let t = prop_oneof![0u64..1 << 20, any::<u64>()];
        (
            (any::<u64>(), 0u32..4, 0u32..3, 0u32..3, 0u32..2),
            (t.clone(), prop::option::of(t.clone()), t.clone(), t.clone()),
            (t.clone(), 0u64..100, t, 0u32..1 << 12),
        )
            .prop_map(
                |(
                    (range, name, domain, thread, process),
                    (b, e, before, after),
                    (peak, n, bytes, parent),
                )| {
                    RangeInstance {
                        range: RangeId(range),
                        name: StringId(name),
                        domain: StringId(domain),
                        thread: ThreadIdx(thread),
                        process: ProcessIdx(process),
                        begin_ts_nanos: b,
                        end_ts_nanos: e,
                        live_before_bytes: before,
                        live_after_bytes: after,
                        peak_bytes: peak,
                        alloc_count: n,
                        alloc_bytes: bytes,
                        parent_slot: parent,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever is pushed and then changed reads back the same, packed or plain, by index,
        /// by field and in order.
        #[test]
        fn reads_back_what_was_pushed_and_changed(
            rs in prop::collection::vec(instance(), 0..2200),
            changes in prop::collection::vec((any::<prop::sample::Index>(), instance()), 0..200),
            pack in any::<bool>(),
        ) {
            let mut store = RangeStore::new();
            let mut want = Vec::new();
            for (n, r) in rs.iter().enumerate() {
                store.push(*r);
                want.push(*r);
                // Changes of the later fields while the history grows.
                if let Some((ix, c)) = changes.get(n % 97).filter(|_| n % 7 == 0) {
                    let i = ix.index(want.len());
                    let w = &mut want[i];
                    let later = Later::of(c);
                    later.write(w);
                    prop_assert!(store.update(i, |x| later.write(x)));
                }
            }
            if pack {
                store.pack_all();
            }
            prop_assert_eq!(store.len(), want.len());
            prop_assert_eq!(store.iter().collect::<Vec<_>>(), want.clone());
            for (i, w) in want.iter().enumerate() {
                prop_assert_eq!(store.get(i), Some(*w));
                prop_assert_eq!(store.name(i), Some(w.name));
                prop_assert_eq!(store.name_and_domain(i), Some((w.name, w.domain)));
                prop_assert_eq!(store.end_and_parent(i), Some((w.end_ts_nanos, w.parent_slot)));
            }
            // The cursor reads the names in order, and back and forth across blocks.
            let mut names = store.names();
            let n = want.len();
            for i in (0..n).chain((0..n).map(|i| (i * 7919) % n)).chain((0..n).rev()) {
                prop_assert_eq!(names.name(i), Some(want[i].name));
            }
            prop_assert_eq!(names.name(n), None);
            prop_assert_eq!(store.get(want.len()), None);
            let past = store.update(want.len(), |_| {});
            prop_assert!(!past);
        }
    }

    /// An epoch open around many short ranges: the short ones pack small, the epoch stays
    /// exact through the late table, and its end after packing is kept.
    #[test]
    fn a_range_open_across_packing_keeps_its_later_fields() {
        let mut s = RangeStore::new();
        let r = |i: u64, parent: u32| RangeInstance {
            range: RangeId(i),
            name: StringId(1 + u32::from(i > 0)),
            domain: StringId(0),
            thread: ThreadIdx(0),
            process: ProcessIdx(0),
            begin_ts_nanos: 1_000 * i,
            end_ts_nanos: (i > 0).then_some(1_000 * i + 500),
            live_before_bytes: 1 << 30,
            live_after_bytes: 1 << 30,
            peak_bytes: (1 << 30) + 4096,
            alloc_count: 3,
            alloc_bytes: 12_288,
            parent_slot: parent,
        };
        s.push(r(0, 0));
        for i in 1..20_000 {
            s.push(r(i, 1));
        }
        // Open when its block was packed: in the late table from then on, the only one there.
        assert_eq!(s.late.iter().map(|e| e.0).collect::<Vec<_>>(), [0]);
        assert!(s.update(0, |e| e.peak_bytes = 1 << 31));
        assert!(s.update(0, |e| e.end_ts_nanos = Some(99)));
        s.pack_all();
        let epoch = s.get(0).expect("the epoch");
        assert_eq!((epoch.end_ts_nanos, epoch.peak_bytes), (Some(99), 1 << 31));
        assert_eq!(s.get(12_345), Some(r(12_345, 1)));
        // Far less than the 96 bytes of a plain instance.
        assert!(s.heap_bytes() < 20_000 * 24, "{}", s.heap_bytes());
    }
}
