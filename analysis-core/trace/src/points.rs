//! A timeline's points packed side by side: block `b` of its times and block `b` of its
//! values share one run of heads and one run of bytes, so reading a point (a chart column's
//! search for a moment, then the value there) touches one page of heads and usually one page
//! of bytes rather than two of each. A zoom step at 60M events reads tens of thousands of
//! points scattered over a gigabyte, and each page it touches costs an address translation
//! that the caches do not hold; the packing is [`crate::packed`]'s, block for block.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::packed::{
    BLOCK, Blocks, Chunked, Frame, GROUP, HEAD_BYTES, Head, PAD, Spill, Tailed, frame_of,
    pack_offsets,
};

/// Which of a timeline's columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The times, which never decrease.
    Times = 0,
    Values = 1,
}

/// Bytes of one block's heads: the times' then the values'.
const PAIR_HEAD_BYTES: usize = 2 * HEAD_BYTES;

/// A timeline's times and values, each packed in blocks of [`BLOCK`] as
/// [`crate::packed::PackedColumn`] packs them, the two columns' blocks stored together, plus
/// the block being filled of each.
#[derive(Clone, Debug, Default)]
pub(crate) struct PointColumns {
    /// Per packed block, the times' head then the values' ([`PAIR_HEAD_BYTES`]).
    heads: Chunked,
    /// Per packed block, the times' bytes then the values', in one run.
    bytes: Chunked,
    blocks: usize,
    /// The first time of every [`GROUP`]-th block, kept in memory for searches.
    coarse: Vec<u64>,
    times: Vec<u64>,
    values: Vec<u64>,
}

/// One of a [`PointColumns`]' columns, to read.
#[derive(Clone, Copy)]
pub(crate) struct LaneRef<'a> {
    points: &'a PointColumns,
    lane: Lane,
}

impl PointColumns {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.blocks * BLOCK + self.times.len()
    }

    /// The last time pushed.
    #[inline(always)]
    pub(crate) fn last_time(&self) -> Option<u64> {
        match self.times.last() {
            Some(&t) => Some(t),
            None => self.last_packed_time(),
        }
    }

    /// The last time packed, read back once per block (the replay's pushes need the one
    /// before theirs).
    #[inline(never)]
    fn last_packed_time(&self) -> Option<u64> {
        self.len()
            .checked_sub(1)
            .map(|i| self.lane(Lane::Times).get(i))
    }

    /// Appends a point whose time is not below the last one's, calling `full` with a block of
    /// values once it is full, before it is packed.
    #[inline(always)]
    pub(crate) fn push_then(&mut self, t: u64, v: u64, full: impl FnOnce(&[u64])) {
        debug_assert!(self.last_time().is_none_or(|last| last <= t));
        self.times.push(t);
        self.values.push(v);
        if self.times.len() == BLOCK {
            full(&self.values);
            self.pack();
            self.times.clear();
            self.values.clear();
        }
    }

    /// Packs the full blocks being filled: the times' frame is their first and last values
    /// (they never decrease), the values' is scanned for, with the low zero bits they share.
    #[inline(never)]
    fn pack(&mut self) {
        let (t, v) = (&self.times, &self.values);
        let ft = Frame::of(t[0], t[BLOCK - 1] - t[0], 0);
        let fv = frame_of::<true>(v.as_slice().try_into().expect("a full block"));
        let mut out = [0u8; 2 * (BLOCK * 8 + PAD)];
        let (ot, ov) = out.split_at_mut(BLOCK * 8 + PAD);
        let nt = pack_offsets(ft, |k| t[k], ot.try_into().expect("a block's room"));
        let nv = pack_offsets(fv, |k| v[k], ov.try_into().expect("a block's room"));
        let start = self.bytes.start_run(nt + nv);
        self.bytes.extend_from_slice(&out[..nt]);
        self.bytes
            .extend_from_slice(&out[BLOCK * 8 + PAD..BLOCK * 8 + PAD + nv]);
        if self.blocks.is_multiple_of(GROUP) {
            self.coarse.push(ft.lo);
        }
        let mut heads = [0u8; PAIR_HEAD_BYTES];
        heads[..HEAD_BYTES].copy_from_slice(&Head::new(ft.lo, start, 0, ft).to_bytes());
        heads[HEAD_BYTES..].copy_from_slice(&Head::new(fv.lo, start + nt, 0, fv).to_bytes());
        self.heads.start_run(PAIR_HEAD_BYTES);
        self.heads.extend_from_slice(&heads);
        self.blocks += 1;
    }

    /// The values of the block being filled (fewer than [`BLOCK`]).
    pub(crate) fn pending_values(&self) -> &[u64] {
        &self.values
    }

    #[inline(always)]
    pub(crate) fn lane(&self, lane: Lane) -> LaneRef<'_> {
        LaneRef { points: self, lane }
    }

    /// Full chunks from now on go to `spill` where it takes them.
    pub(crate) fn set_spill(&mut self, spill: Option<Arc<dyn Spill>>) {
        self.heads.set_spill(spill.clone());
        self.bytes.set_spill(spill);
    }

    /// The spill full chunks go to.
    pub(crate) fn spill(&self) -> Option<Arc<dyn Spill>> {
        self.bytes.spill()
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.heads.heap_bytes()
            + self.bytes.heap_bytes()
            + self.coarse.capacity() * 8
            + (self.times.capacity() + self.values.capacity()) * 8
    }
}

impl LaneRef<'_> {
    /// The lane's packed blocks and its block being filled, to read.
    #[inline(always)]
    fn tailed(&self) -> Tailed<'_, Self> {
        let tail = match self.lane {
            Lane::Times => &self.points.times,
            Lane::Values => &self.points.values,
        };
        Tailed {
            packed: self,
            blocks: self.points.blocks,
            tail,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.points.len()
    }

    /// The value at `i`. Panics when `i >= len()`, as indexing a slice does.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.tailed().get(i)
    }

    /// [`Tailed::decode_block`].
    pub(crate) fn decode_block(&self, b: usize, out: &mut [u64; BLOCK]) -> usize {
        self.tailed().decode_block(b, out)
    }

    /// [`Tailed::decode_range_with`].
    #[inline]
    pub(crate) fn decode_range_with(
        &self,
        b: usize,
        from: usize,
        to: usize,
        f: impl FnMut(usize, u64),
    ) {
        self.tailed().decode_range_with(b, from, to, f);
    }

    /// For the times: [`Tailed::search_sorted`].
    #[inline]
    pub(crate) fn search_sorted(
        &self,
        lo: usize,
        hi: usize,
        pred: impl FnMut(u64) -> bool,
        gallop: bool,
    ) -> usize {
        debug_assert_eq!(self.lane, Lane::Times);
        self.tailed().search_sorted(lo, hi, pred, gallop)
    }

    /// For the times: [`Tailed::count_at_most_each`].
    pub(crate) fn count_at_most_each(&self, targets: &[u64], out: &mut [usize]) {
        debug_assert_eq!(self.lane, Lane::Times);
        self.tailed().count_at_most_each(targets, out);
    }
}

impl Blocks for LaneRef<'_> {
    #[inline]
    fn head(&self, b: usize) -> Head {
        assert!(
            b < self.points.blocks,
            "block {b} of {}",
            self.points.blocks
        );
        let at = b * PAIR_HEAD_BYTES + self.lane as usize * HEAD_BYTES;
        self.points.heads.with_run(at, HEAD_BYTES, Head::from_bytes)
    }

    #[inline]
    fn bytes(&self) -> &Chunked {
        &self.points.bytes
    }

    #[inline]
    fn coarse(&self) -> &[u64] {
        &self.points.coarse
    }

    /// A lane's heads alternate with the other lane's.
    const HEAD_STRIDE: usize = PAIR_HEAD_BYTES;

    fn heads_here(&self, from: usize, to: usize) -> Option<&[u8]> {
        let at = from * PAIR_HEAD_BYTES + self.lane as usize * HEAD_BYTES;
        self.points
            .heads
            .run_here(at, (to - from - 1) * PAIR_HEAD_BYTES + HEAD_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::VecSpill;
    use alloc::vec;
    use proptest::prelude::*;

    /// Points whose times never decrease (equal ones included) and values of any spread.
    fn points(steps: &[(u64, u64)], spread: u32) -> Vec<(u64, u64)> {
        let mut t = 0u64;
        steps
            .iter()
            .map(|&(dt, v)| {
                t += dt.saturating_sub(20);
                (t, v >> spread)
            })
            .collect()
    }

    fn filled(points: &[(u64, u64)], spill: Option<Arc<dyn Spill>>) -> PointColumns {
        let mut p = PointColumns::default();
        p.set_spill(spill);
        let mut full = Vec::new();
        for &(t, v) in points {
            p.push_then(t, v, |block| full.extend_from_slice(block));
        }
        // Each full block of values was handed over once, in order, before it was packed.
        assert_eq!(full.len(), points.len() / BLOCK * BLOCK);
        assert!(full.iter().zip(points).all(|(&v, &(_, w))| v == w));
        p
    }

    /// A block's times and values lie in one run of bytes, and their heads in one run: the
    /// values' bytes start where the times' end.
    #[test]
    fn a_blocks_times_and_values_share_a_run() {
        let pts: Vec<(u64, u64)> = (0..10 * BLOCK as u64)
            .map(|i| (i * 1_000, (i * 7_919) % 100_000))
            .collect();
        let p = filled(&pts, None);
        for b in 0..10 {
            let (ht, hv) = (p.lane(Lane::Times).head(b), p.lane(Lane::Values).head(b));
            assert_eq!(
                hv.start(),
                ht.start() + BLOCK * ht.width() + PAD,
                "block {b}"
            );
        }
    }

    /// Points over many chunks of bytes and of heads, spilled, read back as they were written.
    #[test]
    fn spilled_points_read_back() {
        let pts: Vec<(u64, u64)> = (0..200_000u64)
            .map(|i| (i * 1_000_003 + (i % 7), (i * 2_654_435_761) % (1 << 40)))
            .collect();
        let spill = Arc::new(VecSpill::default());
        let p = filled(&pts, Some(spill.clone()));
        // The bytes (about 1.8 MB) and the heads (100 KB) went to the spill but for their
        // last chunks.
        assert!(spill.held_bytes() >= 1_800_000, "{}", spill.held_bytes());
        let (times, values) = (p.lane(Lane::Times), p.lane(Lane::Values));
        for i in (0..pts.len()).step_by(97).chain([pts.len() - 1]) {
            assert_eq!((times.get(i), values.get(i)), pts[i], "point {i}");
            let t = pts[i].0;
            assert_eq!(times.search_sorted(0, pts.len(), |x| x <= t, false), i + 1);
        }
        // Side by side: every 13th time, one before it, and past the last.
        let targets: Vec<u64> = (0..pts.len())
            .step_by(13)
            .flat_map(|i| [pts[i].0.saturating_sub(1), pts[i].0])
            .chain([u64::MAX])
            .collect();
        let mut out = vec![usize::MAX; targets.len()];
        times.count_at_most_each(&targets, &mut out);
        for (&t, &got) in targets.iter().zip(&out) {
            assert_eq!(got, pts.partition_point(|&(x, _)| x <= t), "time {t}");
        }
    }

    proptest! {
        /// Every point reads back by index and by block, in memory and spilled (then with the
        /// same heap bytes counted), and a search of the times finds what a slice's
        /// `partition_point` finds, from any start, by halves or onwards, and for many times
        /// side by side.
        #[test]
        fn points_read_back_and_search_as_a_slice(
            steps in proptest::collection::vec((0u64..60, any::<u64>()), 0..3000),
            spread in 0u32..64,
            probes in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u64>()), 1..30),
        ) {
            let pts = points(&steps, spread);
            let n = pts.len();
            let spill: Arc<dyn Spill> = Arc::new(VecSpill::default());
            let here = filled(&pts, None);
            let away = filled(&pts, Some(spill));
            prop_assert_eq!(here.heap_bytes(), away.heap_bytes());
            for p in [&here, &away] {
                prop_assert_eq!(p.len(), n);
                prop_assert_eq!(p.last_time(), pts.last().map(|x| x.0));
                let (times, values) = (p.lane(Lane::Times), p.lane(Lane::Values));
                for (i, &(t, v)) in pts.iter().enumerate() {
                    prop_assert_eq!((times.get(i), values.get(i)), (t, v), "point {}", i);
                }
                let mut out = [0u64; BLOCK];
                for b in 0..n.div_ceil(BLOCK) + 1 {
                    let got = values.decode_block(b, &mut out);
                    let want: Vec<u64> = pts.iter().skip(b * BLOCK).take(BLOCK).map(|x| x.1).collect();
                    prop_assert_eq!(&out[..got], &want[..], "block {}", b);
                    let (from, to) = (b * BLOCK + 3, ((b + 1) * BLOCK - 5).min(n));
                    let mut seen = Vec::new();
                    if from < to {
                        times.decode_range_with(b, from, to, |i, t| seen.push((i, t)));
                    }
                    let want: Vec<(usize, u64)> =
                        (from..to).map(|i| (i, pts[i].0)).collect();
                    prop_assert_eq!(seen, want);
                }
                for &(a, b, x) in &probes {
                    let (lo, hi) = (a % (n + 2), b % (n + 2));
                    let x = if n > 0 && x % 3 != 0 { pts[(x as usize) % n].0 } else { x % 100_000 };
                    let want = if lo >= hi.min(n) {
                        lo.min(hi.min(n))
                    } else {
                        lo + pts[lo..hi.min(n)].partition_point(|&(t, _)| t <= x)
                    };
                    for gallop in [false, true] {
                        prop_assert_eq!(
                            times.search_sorted(lo, hi, |t| t <= x, gallop), want,
                            "lo {} hi {} x {} gallop {}", lo, hi, x, gallop
                        );
                    }
                }
                // Side by side: the probes' times and every point's, sorted, duplicates kept.
                let mut targets: Vec<u64> = probes.iter().map(|&(_, _, x)| x % 100_000).collect();
                targets.extend(pts.iter().map(|&(t, _)| t));
                targets.sort_unstable();
                let mut out = vec![usize::MAX; targets.len() + 1];
                times.count_at_most_each(&targets, &mut out);
                for (&t, &got) in targets.iter().zip(&out) {
                    prop_assert_eq!(got, pts.partition_point(|&(x, _)| x <= t), "time {}", t);
                }
                prop_assert_eq!(out[targets.len()], usize::MAX, "past the targets, untouched");
            }
        }
    }
}
