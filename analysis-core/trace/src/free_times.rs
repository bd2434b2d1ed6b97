//! The free times and free kinds of the allocation history (`alloc_store`). They are
//! set after the allocation is recorded, so they stay plain (8 bytes and 1) while recent. Once
//! [`SEAL`] newer allocations follow them, a run of [`SEAL`] is sealed: each time packed as the
//! allocation's lifetime in a [`PackedColumn`] (a few bytes where lifetimes are alike), each kind
//! packed too, and the allocations not freed yet (or freed before they were made, in a
//! damaged trace) set aside in a table of late ones, whose later frees update it: 11 bytes
//! each (its offset in its run, free time and kind). That table holds only the allocations
//! that outlive 65,536 or more newer ones (long-lived buffers, caches, leaks): on a healthy run
//! a small part of the history, and at worst (nothing ever freed) 2 bytes more per allocation
//! than plain columns.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::packed::{BLOCK, Column, PackedColumn, Spill};

/// Free time of an allocation not freed (re-exported as `alloc_store::LIVE`).
pub const LIVE: u64 = u64::MAX;

/// Allocations sealed at a time, once as many newer ones follow them (a multiple of
/// [`BLOCK`], at most 65,536: offsets in a run are `u16`): an allocation freed within 65,536
/// allocations of its own is packed; one that lives longer costs an entry in the late table.
pub const SEAL: usize = 1 << 16;
const _: () = assert!(SEAL <= 1 << 16 && SEAL.is_multiple_of(BLOCK));

/// Lifetime code of an allocation in the late table.
const IN_LATE: u64 = 0;

/// Which allocations of a block may be live after a moment ([`FreeTimes::live_in`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LiveIn {
    /// None: all were freed by then.
    None,
    /// Only some in the late table: the first of them this id, and how many there are. The
    /// others were freed by then.
    Late(usize, usize),
    /// Any of them.
    Any,
}

#[derive(Clone, Debug)]
pub(crate) struct FreeTimes {
    /// Allocations sealed: ids below this (a multiple of `seal`).
    sealed: usize,
    /// Allocations per sealing (and the plain ones kept before sealing): [`SEAL`], smaller in
    /// tests.
    seal: usize,
    /// Per sealed allocation: [`IN_LATE`], or its free time minus its allocation time, plus 1.
    life: PackedColumn,
    /// Per sealed allocation: its free kind's code.
    kinds: PackedColumn,
    /// Per sealed block: a free time none of its allocations outside the late table exceeds
    /// (0 when all are late). Those were freed before their run was sealed, so on a long
    /// history a moment well after a block is past its bound, and only the block's late
    /// entries can be live then ([`Self::live_in`]); a block without late entries (its
    /// lifetimes' minimum is not [`IN_LATE`]) is then skipped at one read. Packed, and spilled
    /// with the lifetimes, so that a long history's bounds (8 bytes per 64 allocations) do not
    /// stay in memory.
    packed_max: Column,
    /// Sealed allocations with [`IN_LATE`], by run: offsets in their run (ascending), free
    /// times and kinds; run `r`'s are entries `late_start[r]..late_start[r + 1]`.
    late_start: Vec<usize>,
    late_ids: Vec<u16>,
    late_free: Vec<u64>,
    late_kind: Vec<u8>,
    /// Free times and kinds of allocations `sealed..`, plain.
    open_free: Vec<u64>,
    open_kind: Vec<u8>,
}

impl Default for FreeTimes {
    fn default() -> Self {
        Self::new(SEAL)
    }
}

impl FreeTimes {
    pub(crate) const fn new(seal: usize) -> Self {
        Self {
            sealed: 0,
            seal,
            life: PackedColumn::new(),
            kinds: PackedColumn::new(),
            packed_max: Column::new(),
            late_start: Vec::new(),
            late_ids: Vec::new(),
            late_free: Vec::new(),
            late_kind: Vec::new(),
            open_free: Vec::new(),
            open_kind: Vec::new(),
        }
    }

    /// Full chunks of the packed lifetimes, kinds and block bounds from now on go to `spill`.
    pub(crate) fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.life.set_spill(spill.clone());
        self.kinds.set_spill(spill.clone());
        self.packed_max.set_spill(spill);
    }

    /// Appends a block's free times and kinds; `ts` is the allocation times' column, which
    /// already holds this block (sealing reads it).
    pub(crate) fn push_block(
        &mut self,
        free: &[u64; BLOCK],
        kind: &[u8; BLOCK],
        ts: &PackedColumn,
    ) {
        self.open_free.extend_from_slice(free);
        self.open_kind.extend_from_slice(kind);
        if self.open_free.len() >= 2 * self.seal {
            self.seal_oldest(ts);
        }
    }

    /// Seals the oldest `seal` plain allocations.
    fn seal_oldest(&mut self, ts: &PackedColumn) {
        if self.late_start.is_empty() {
            self.late_start.push(0);
        }
        let mut at = [0u64; BLOCK];
        for k in (0..self.seal).step_by(BLOCK) {
            let first = self.sealed + k;
            ts.decode(first / BLOCK, &mut at);
            let free = &self.open_free[k..k + BLOCK];
            let mut code = [0u64; BLOCK];
            let mut packed_max = 0u64;
            for j in 0..BLOCK {
                let f = free[j];
                if f == LIVE || f < at[j] {
                    self.late_ids.push((k + j) as u16);
                    self.late_free.push(f);
                    self.late_kind.push(self.open_kind[k + j]);
                    code[j] = IN_LATE;
                } else {
                    code[j] = f - at[j] + 1;
                    packed_max = packed_max.max(f);
                }
            }
            self.life.append_array(&code);
            let mut kinds = [0u64; BLOCK];
            for (w, &c) in kinds.iter_mut().zip(&self.open_kind[k..k + BLOCK]) {
                *w = u64::from(c);
            }
            self.kinds.append_array(&kinds);
            self.packed_max.push(packed_max);
        }
        self.open_free.drain(..self.seal);
        self.open_kind.drain(..self.seal);
        self.sealed += self.seal;
        self.late_start.push(self.late_ids.len());
    }

    /// The late entries of sealed allocation `i`'s run, from the first at offset `from_id`
    /// (an id of that run) or past it: (index of that entry, end of the run's entries).
    #[inline]
    fn late_from(&self, from_id: usize) -> (usize, usize) {
        let r = from_id / self.seal;
        let (a, b) = (self.late_start[r], self.late_start[r + 1]);
        let off = (from_id % self.seal) as u16;
        (a + self.late_ids[a..b].partition_point(|&x| x < off), b)
    }

    /// The late entry of sealed allocation `i`.
    #[inline]
    fn late(&self, i: usize) -> Option<usize> {
        let (l, end) = self.late_from(i);
        (l < end && usize::from(self.late_ids[l]) == i % self.seal).then_some(l)
    }

    /// Free time and kind code of allocation `i`, made at `ts(i)`. Panics when
    /// `i >= len()`, as indexing a slice does.
    #[inline]
    pub(crate) fn get(&self, i: usize, ts: impl FnOnce(usize) -> u64) -> (u64, u8) {
        match i.checked_sub(self.sealed) {
            Some(k) => (self.open_free[k], self.open_kind[k]),
            None => {
                let code = self.life.get(i);
                let kind = self.kinds.get(i) as u8;
                if code != IN_LATE {
                    return (ts(i) + code - 1, kind);
                }
                match self.late(i) {
                    Some(l) => (self.late_free[l], self.late_kind[l]),
                    None => (LIVE, kind),
                }
            }
        }
    }

    /// The free time of allocation `i` (quicker than [`Self::get`] where the kind is not
    /// needed).
    #[inline]
    pub(crate) fn free_ts(&self, i: usize, ts: impl FnOnce(usize) -> u64) -> u64 {
        match i.checked_sub(self.sealed) {
            Some(k) => self.open_free[k],
            None => match self.life.get(i) {
                IN_LATE => self.late(i).map_or(LIVE, |l| self.late_free[l]),
                code => ts(i) + code - 1,
            },
        }
    }

    /// Records the release of allocation `i`. The model releases an allocation once, while
    /// it is live: a sealed allocation it releases is in the late table. (Another, already
    /// freed when sealed, keeps its first free time.)
    pub(crate) fn set(&mut self, i: usize, free: u64, kind: u8) {
        if let Some(k) = i.checked_sub(self.sealed) {
            self.open_free[k] = free;
            self.open_kind[k] = kind;
            return;
        }
        let Some(l) = self.late(i) else {
            return;
        };
        self.late_free[l] = free;
        self.late_kind[l] = kind;
    }

    /// Fills `free` and `kind` with block `b`'s, whose allocation times are `at`. Panics
    /// when the block is not whole in `len()`.
    pub(crate) fn decode(
        &self,
        b: usize,
        at: &[u64; BLOCK],
        free: &mut [u64; BLOCK],
        kind: &mut [u8; BLOCK],
    ) {
        let first = b * BLOCK;
        if let Some(k) = first.checked_sub(self.sealed) {
            free.copy_from_slice(&self.open_free[k..k + BLOCK]);
            kind.copy_from_slice(&self.open_kind[k..k + BLOCK]);
            return;
        }
        self.kinds.decode_with(b, |j, v| kind[j] = v as u8);
        if self.life.block_min(b) != IN_LATE {
            // No late entry: each free time is the allocation time plus the lifetime.
            self.life
                .decode_with(b, |j, code| free[j] = at[j] + code - 1);
            return;
        }
        self.life.decode(b, free);
        // The block's late entries are consecutive in the table, in id order.
        let mut late = self.late_from(first).0;
        for j in 0..BLOCK {
            if free[j] == IN_LATE {
                // A late entry's kind is the one kept with it.
                kind[j] = self.late_kind.get(late).copied().unwrap_or(kind[j]);
                free[j] = self.late_free.get(late).copied().unwrap_or(LIVE);
                late += 1;
            } else {
                free[j] = at[j] + free[j] - 1;
            }
        }
    }

    /// Which of allocations `from..to` of block `b` (offsets in it) may be live at a moment
    /// after `t`.
    pub(crate) fn live_in(&self, b: usize, from: usize, to: usize, t: u64) -> LiveIn {
        let first = b * BLOCK;
        let outlives = |f: u64| f == LIVE || f > t;
        match first.checked_sub(self.sealed) {
            Some(k) => {
                if self.open_free[k + from..k + to]
                    .iter()
                    .any(|&f| outlives(f))
                {
                    LiveIn::Any
                } else {
                    LiveIn::None
                }
            }
            None if self.packed_max.get(b) > t => LiveIn::Any,
            // Every allocation of the block was freed by `t`, and none is late.
            None if self.life.block_min(b) != IN_LATE => LiveIn::None,
            None => match self.next_late_outliving(first + from, first + to, t) {
                Some((id, n)) => LiveIn::Late(id, n),
                None => LiveIn::None,
            },
        }
    }

    /// The first sealed allocation of ids `from..to` (within one run) in the late table that
    /// is not freed by `t`, and how many of them there are.
    fn next_late_outliving(&self, from: usize, to: usize, t: u64) -> Option<(usize, usize)> {
        let (mut l, end) = self.late_from(from);
        let run_start = from - from % self.seal;
        let mut found: Option<(usize, usize)> = None;
        while l < end {
            let id = run_start + usize::from(self.late_ids[l]);
            if id >= to {
                break;
            }
            let f = self.late_free[l];
            if f == LIVE || f > t {
                found = Some(found.map_or((id, 1), |(first, n)| (first, n + 1)));
            }
            l += 1;
        }
        found
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.life.heap_bytes()
            + self.kinds.heap_bytes()
            + self.packed_max.heap_bytes()
            + self.late_start.capacity() * 8
            + self.late_ids.capacity() * 2
            + self.late_free.capacity() * 8
            + self.late_kind.capacity()
            + self.open_free.capacity() * 8
            + self.open_kind.capacity()
    }
}
