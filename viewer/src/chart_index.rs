//! Indexes that keep a zoom step cheap on big traces: built once per trace, queried per frame.
//!
//! - [`IndexedTimeline`]: a timeline plus, per block of 64 points, the first time and the value
//!   range. A chart column's
//!   boundary is found by galloping through that small array and searching one 64-point block,
//!   instead of a binary search over the whole trace (23 cache misses per column at 10 M points).
//!   Value ranges come from the same blocks and from superblocks of 64 blocks, read in order.
//!   [`IndexedTimeline::downsample`] returns exactly what `Timeline::downsample` returns.
//! - [`RangeRows`]: NVTX range instances per nesting row (depth 0..3), as flat begin/end arrays
//!   with a max pyramid over the ends, so the bands of a window cost O(pixels · log n), not
//!   O(instances).

use std::ops::Deref;

use analysis_core::format::{ProcessIdx, StringId};
use analysis_core::model::RangeInstance;
use analysis_core::timeline::{Bucket, Timeline};

/// Points per block of the index, and blocks per superblock.
const BLOCK: usize = 64;
const SUPER: usize = 64;

/// One block of `BLOCK` points: its first time and its value range.
#[derive(Clone, Copy, Debug, Default)]
struct Block {
    first_ts: u64,
    min: u64,
    max: u64,
}

/// A timeline with a block index of its times and values, for fast downsampling.
#[derive(Clone, Debug, Default)]
pub struct IndexedTimeline {
    timeline: Timeline,
    blocks: Vec<Block>,
    /// Value range per `SUPER` blocks.
    supers: Vec<(u64, u64)>,
}

fn min_max(it: impl Iterator<Item = (u64, u64)>) -> (u64, u64) {
    it.fold((u64::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)))
}

impl From<Timeline> for IndexedTimeline {
    fn from(timeline: Timeline) -> Self {
        let blocks: Vec<Block> = timeline
            .times()
            .chunks(BLOCK)
            .zip(timeline.values().chunks(BLOCK))
            .map(|(t, v)| {
                let (min, max) = min_max(v.iter().map(|&x| (x, x)));
                Block {
                    first_ts: t[0],
                    min,
                    max,
                }
            })
            .collect();
        let supers = blocks
            .chunks(SUPER)
            .map(|c| min_max(c.iter().map(|b| (b.min, b.max))))
            .collect();
        Self {
            timeline,
            blocks,
            supers,
        }
    }
}

impl Deref for IndexedTimeline {
    type Target = Timeline;
    fn deref(&self) -> &Timeline {
        &self.timeline
    }
}

impl IndexedTimeline {
    /// The first index `i >= from` with `times[i] >= t` (the length if none):
    /// `from + times[from..].partition_point(|&x| x < t)`, touching O(log distance) index
    /// entries and one block of points.
    pub fn lower_bound_from(&self, from: usize, t: u64) -> usize {
        let times = self.timeline.times();
        let n = times.len();
        if from >= n {
            return n;
        }
        let blocks = &self.blocks;
        // Gallop over the blocks after `from`'s block for the first block starting at >= t.
        let start_block = from / BLOCK + 1;
        let (mut lo, mut hi, mut step) = (start_block.min(blocks.len()), start_block, 1);
        while hi < blocks.len() && blocks[hi].first_ts < t {
            lo = hi + 1;
            hi += step;
            step *= 2;
        }
        let hi = hi.min(blocks.len());
        let k = lo + blocks[lo..hi].partition_point(|b| b.first_ts < t);
        // The answer lies in block k - 1 (or at the start of block k).
        let a = from.max((k - 1) * BLOCK);
        let b = (k * BLOCK).min(n);
        a + times[a..b].partition_point(|&x| x < t)
    }

    /// `lower_bound_from(from, t)`, searched outwards from `guess`: a few reads near the guess
    /// when it is close, O(log distance) when it is not.
    pub fn lower_bound_near(&self, from: usize, t: u64, guess: usize) -> usize {
        let times = self.timeline.times();
        let n = times.len();
        let g = guess.clamp(from, n);
        if g == n || times[g] >= t {
            // The answer is at or before g: gallop back to a time below t.
            let (mut hi, mut step) = (g, 1);
            loop {
                if hi == from {
                    return from;
                }
                let lo = hi.saturating_sub(step).max(from);
                if times[lo] < t {
                    return lo + 1 + times[lo + 1..hi].partition_point(|&x| x < t);
                }
                hi = lo;
                step *= 2;
            }
        }
        // times[g] < t: gallop forward to a time at or above t.
        let (mut lo, mut step) = (g, 1);
        loop {
            let hi = (lo + step).min(n);
            if hi == n || times[hi] >= t {
                return lo + 1 + times[lo + 1..hi].partition_point(|&x| x < t);
            }
            lo = hi;
            step *= 2;
        }
    }

    /// Min and max of the values at indices `[i, j)`: the partial blocks at both ends point by
    /// point, whole blocks and superblocks from the index (memory read in order, few cache
    /// misses).
    pub fn range_min_max(&self, i: usize, j: usize) -> Option<(u64, u64)> {
        let values = self.timeline.values();
        let j = j.min(values.len());
        if i >= j {
            return None;
        }
        let point = |v: &[u64]| min_max(v.iter().map(|&x| (x, x)));
        let (bi, bj) = (i.div_ceil(BLOCK), j / BLOCK);
        if bi >= bj {
            return Some(point(&values[i..j]));
        }
        let (a, b) = (point(&values[i..bi * BLOCK]), point(&values[bj * BLOCK..j]));
        let blocks =
            |r: std::ops::Range<usize>| min_max(self.blocks[r].iter().map(|b| (b.min, b.max)));
        let (si, sj) = (bi.div_ceil(SUPER), bj / SUPER);
        let middle = if si >= sj {
            blocks(bi..bj)
        } else {
            let (c, d) = (blocks(bi..si * SUPER), blocks(sj * SUPER..bj));
            let e = min_max(self.supers[si..sj].iter().copied());
            min_max([c, d, e].into_iter())
        };
        Some(min_max([a, b, middle].into_iter()))
    }

    /// Downsamples `[t0, t1)` into `columns` buckets of equal time width; the same result as
    /// `Timeline::downsample`.
    pub fn downsample(&self, t0: u64, t1: u64, columns: usize) -> Vec<Bucket> {
        let mut out = Vec::with_capacity(columns);
        if columns == 0 || t1 <= t0 {
            return out;
        }
        let values = self.timeline.values();
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
        let mut idx = self.lower_bound_from(0, t0);
        let mut prev = idx;
        for c in 0..columns {
            let (a, b) = (edge(c), edge(c + 1));
            let carried = if idx == 0 { 0 } else { values[idx - 1] };
            // Columns are equally wide: the next one probably holds as many points as this one.
            let end = self.lower_bound_near(idx, b, idx + (idx - prev));
            prev = idx;
            let (mut lo, mut hi) = (carried, carried);
            if let Some((l, h)) = self.range_min_max(idx, end) {
                lo = lo.min(l);
                hi = hi.max(h);
            }
            let last = if end == 0 { 0 } else { values[end - 1] };
            out.push(Bucket {
                t_start: a,
                t_end: b,
                min: lo,
                max: hi,
                last,
            });
            idx = end;
        }
        out
    }
}

/// An NVTX range drawn as a band.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeBand {
    pub begin_nanos: u64,
    pub end_nanos: u64,
    /// Nesting depth (0 = top level).
    pub depth: u32,
    pub name: StringId,
}

/// Rows of range bands above the chart.
pub const RANGE_ROWS: usize = 3;

/// The instances of one nesting depth, sorted by begin time.
#[derive(Clone, Debug, Default)]
struct RangeRow {
    begin: Vec<u64>,
    /// `u64::MAX` for a range that never ended.
    end: Vec<u64>,
    name: Vec<StringId>,
    /// Max pyramid over `end` (level k: the largest end per `BLOCK^(k+1)` instances), to find
    /// the next instance that reaches the cursor in O(log n).
    max_end: Vec<Vec<u64>>,
    /// The longest instance, to start the scan at the first instance that can reach `t0`.
    max_len: u64,
}

impl RangeRow {
    fn push(&mut self, begin: u64, end: u64, name: StringId) {
        self.begin.push(begin);
        self.end.push(end);
        self.name.push(name);
    }

    fn finish(&mut self) {
        let mut order: Vec<usize> = (0..self.begin.len()).collect();
        if !self.begin.is_sorted() {
            order.sort_by_key(|&i| self.begin[i]);
            self.begin = order.iter().map(|&i| self.begin[i]).collect();
            self.end = order.iter().map(|&i| self.end[i]).collect();
            self.name = order.iter().map(|&i| self.name[i]).collect();
        }
        self.max_end.clear();
        let mut level: &[u64] = &self.end;
        while level.len() > BLOCK {
            let next: Vec<u64> = level
                .chunks(BLOCK)
                .map(|c| c.iter().copied().max().unwrap_or(0))
                .collect();
            self.max_end.push(next);
            level = self.max_end.last().map_or(&[], Vec::as_slice);
        }
        self.max_len = self
            .begin
            .iter()
            .zip(&self.end)
            .map(|(b, e)| e.saturating_sub(*b))
            .max()
            .unwrap_or(0);
    }

    /// The first instance at or after `j` that ends at or after `t` (`len` if none).
    fn next_reaching(&self, j: usize, t: u64) -> usize {
        let level_of = |k: usize| -> &[u64] {
            if k == 0 {
                &self.end
            } else {
                &self.max_end[k - 1]
            }
        };
        // Up: scan the rest of the current group at each level until an entry reaches t.
        let (mut k, mut i) = (0, j);
        loop {
            let lvl = level_of(k);
            let group_end = ((i / BLOCK + 1) * BLOCK).min(lvl.len());
            while i < group_end && lvl[i] < t {
                i += 1;
            }
            if i < group_end {
                break;
            }
            if i >= lvl.len() || k == self.max_end.len() {
                // Nothing further reaches t at this level (the top level is scanned whole).
                let top = level_of(k);
                while i < top.len() && top[i] < t {
                    i += 1;
                }
                if i >= top.len() {
                    return self.end.len();
                }
                break;
            }
            k += 1;
            i /= BLOCK;
        }
        // Down: the first child that reaches t, level by level.
        while k > 0 {
            k -= 1;
            i *= BLOCK;
            let lvl = level_of(k);
            while lvl[i] < t {
                i += 1;
            }
        }
        i
    }

    /// Bands of this row in `[t0, t1)`: instances closer than `merge_nanos` to the band before
    /// merge into it while it stays under 4 · `merge_nanos`; instances that end within
    /// `merge_nanos` of a band's last instance's start are skipped (they are under a pixel).
    fn bands(&self, depth: u32, t0: u64, t1: u64, merge_nanos: u64, out: &mut Vec<RangeBand>) {
        let n = self.begin.len();
        let mut j = self
            .begin
            .partition_point(|&b| b.saturating_add(self.max_len) < t0);
        let mut cursor = t0;
        let mut last: Option<usize> = None;
        loop {
            // The next instance that reaches the cursor.
            j = self.next_reaching(j, cursor);
            if j >= n || self.begin[j] >= t1 {
                break;
            }
            let (b, e) = (self.begin[j], self.end[j]);
            match last {
                Some(i)
                    if b <= out[i].end_nanos.saturating_add(merge_nanos)
                        && e.saturating_sub(out[i].begin_nanos) <= merge_nanos * 4 =>
                {
                    out[i].end_nanos = out[i].end_nanos.max(e);
                }
                _ => {
                    last = Some(out.len());
                    out.push(RangeBand {
                        begin_nanos: b,
                        end_nanos: e,
                        depth,
                        name: self.name[j],
                    });
                }
            }
            cursor = cursor.max(b.saturating_add(merge_nanos));
            j += 1;
        }
    }
}

/// NVTX range instances by nesting row, for the whole trace and per process.
#[derive(Clone, Debug, Default)]
pub struct RangeRows {
    all: [RangeRow; RANGE_ROWS],
    /// Per process, when the trace has ranges from several.
    by_process: Vec<(ProcessIdx, [RangeRow; RANGE_ROWS])>,
    /// The process, when exactly one has ranges (`all` is then its rows).
    single: Option<ProcessIdx>,
}

impl RangeRows {
    pub fn new(ranges: &[RangeInstance]) -> Self {
        let mut rows = Self::default();
        let mut processes: Vec<ProcessIdx> = ranges.iter().map(|r| r.process).collect();
        processes.sort();
        processes.dedup();
        if processes.len() == 1 {
            rows.single = Some(processes[0]);
        } else {
            rows.by_process = processes
                .into_iter()
                .map(|p| (p, Default::default()))
                .collect();
        }
        for r in ranges {
            let mut depth = 0usize;
            let mut parent = r.parent_slot;
            while parent != 0 && depth < 8 {
                depth += 1;
                parent = ranges.get(parent as usize - 1).map_or(0, |p| p.parent_slot);
            }
            if depth >= RANGE_ROWS {
                continue;
            }
            let end = r.end_ts_nanos.unwrap_or(u64::MAX);
            rows.all[depth].push(r.begin_ts_nanos, end, r.name);
            if let Some((_, p)) = rows.by_process.iter_mut().find(|(p, _)| *p == r.process) {
                p[depth].push(r.begin_ts_nanos, end, r.name);
            }
        }
        for row in rows
            .all
            .iter_mut()
            .chain(rows.by_process.iter_mut().flat_map(|(_, r)| r.iter_mut()))
        {
            row.finish();
        }
        rows
    }

    /// Bands overlapping `[t0, t1)` for one process or all, with nesting depth (at most
    /// [`RANGE_ROWS`] rows). Instances closer than 1/2000 of the window merge, so the result
    /// stays O(pixels) however many steps the trace has, and so does the work.
    pub fn bands(&self, process: Option<ProcessIdx>, t0: u64, t1: u64) -> Vec<RangeBand> {
        let rows = match process {
            None => &self.all,
            Some(p) if self.single == Some(p) => &self.all,
            Some(p) => match self.by_process.iter().find(|(q, _)| *q == p) {
                Some((_, r)) => r,
                None => return Vec::new(),
            },
        };
        let merge_nanos = (t1.saturating_sub(t0) / 2000).max(1);
        let mut out = Vec::new();
        for (depth, row) in rows.iter().enumerate() {
            row.bands(depth as u32, t0, t1, merge_nanos, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency needed).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
    }

    #[test]
    fn downsample_equals_the_timelines_own() {
        let mut rng = Lcg(7);
        for n in [0usize, 1, 5, 63, 64, 65, 200, 5_000, 300_000] {
            let mut t = Timeline::new();
            let mut ts = 100u64;
            for _ in 0..n {
                // Repeated times too: several points at one instant.
                ts += rng.next() % 4 * (rng.next() % 50);
                t.push(ts, rng.next() % 1_000);
            }
            t.build_index();
            let ix = IndexedTimeline::from(t.clone());
            for _ in 0..40 {
                let a = rng.next() % (ts + 200);
                let b = a + 1 + rng.next() % (ts + 200);
                let cols = 1 + (rng.next() % 700) as usize;
                assert_eq!(
                    ix.downsample(a, b, cols),
                    t.downsample(a, b, cols),
                    "n={n} [{a},{b}) {cols}"
                );
            }
            for _ in 0..200 {
                let i = (rng.next() as usize) % (n + 1);
                let j = (rng.next() as usize) % (n + 1);
                assert_eq!(
                    ix.range_min_max(i, j),
                    t.range_min_max(i, j),
                    "n={n} [{i},{j})"
                );
            }
            for from in [0, n / 3, n] {
                for probe in [0, 100, ts / 2, ts, ts + 1] {
                    let want = from + t.times()[from..].partition_point(|&x| x < probe);
                    assert_eq!(ix.lower_bound_from(from, probe), want);
                    for guess in [0, from, n / 2, n, n + 5] {
                        assert_eq!(
                            ix.lower_bound_near(from, probe, guess),
                            want,
                            "guess {guess}"
                        );
                    }
                }
            }
        }
    }

    fn instance(process: u32, begin: u64, end: Option<u64>, parent_slot: u32) -> RangeInstance {
        RangeInstance {
            range: analysis_core::format::RangeId(0),
            name: StringId(1),
            domain: StringId(0),
            thread: analysis_core::format::ThreadIdx(0),
            process: ProcessIdx(process),
            begin_ts_nanos: begin,
            end_ts_nanos: end,
            live_before_bytes: 0,
            live_after_bytes: 0,
            peak_bytes: 0,
            alloc_count: 0,
            alloc_bytes: 0,
            parent_slot,
        }
    }

    #[test]
    fn bands_cover_every_instance_of_the_window_and_stay_few() {
        // An epoch (0..1e9) with 100 000 steps of 5 µs every 10 µs inside it, and one long step.
        let mut ranges = vec![instance(0, 0, Some(1_000_000_000), 0)];
        for k in 0..100_000u64 {
            let b = 1_000 + k * 10_000;
            let len = if k == 50_000 { 20_000_000 } else { 5_000 };
            ranges.push(instance(0, b, Some(b + len), 1));
        }
        ranges.push(instance(0, 5, None, 0));
        let rows = RangeRows::new(&ranges);
        let all = rows.bands(None, 0, 1_000_000_000);
        assert!(all.len() <= 3 * 2000, "{} bands", all.len());
        // The epoch, and the range that never ended (too long to merge with it).
        assert_eq!(all.iter().filter(|b| b.depth == 0).count(), 2);
        // Every covered instant of the window is covered by a band (to within a merge step).
        let merge = 1_000_000_000 / 2000;
        let steps: Vec<&RangeBand> = all.iter().filter(|b| b.depth == 1).collect();
        for k in (0..100_000u64).step_by(997) {
            let b = 1_000 + k * 10_000;
            assert!(
                steps
                    .iter()
                    .any(|s| s.begin_nanos <= b + merge && s.end_nanos + merge >= b),
                "step {k} at {b} is shown"
            );
        }
        let long = 1_000 + 50_000 * 10_000 + 10_000_000;
        assert!(
            steps
                .iter()
                .any(|s| s.begin_nanos <= long && s.end_nanos >= long),
            "the long step is shown whole"
        );
        // A narrow window lists exactly its instances.
        let few = rows.bands(None, 1_000, 41_000);
        assert_eq!(few.iter().filter(|b| b.depth == 1).count(), 4);
        assert!(rows.bands(Some(ProcessIdx(3)), 0, 10).is_empty());
        assert_eq!(rows.bands(Some(ProcessIdx(0)), 0, 10).len(), 2);
    }

    #[test]
    fn next_reaching_equals_a_linear_scan() {
        let mut rng = Lcg(3);
        for n in [0usize, 1, 63, 64, 65, 4_095, 4_097, 70_000] {
            let mut row = RangeRow::default();
            for k in 0..n as u64 {
                let len = if rng.next().is_multiple_of(500) {
                    1_000_000
                } else {
                    rng.next() % 100
                };
                row.push(k * 10, k * 10 + len, StringId(1));
            }
            row.finish();
            for _ in 0..300 {
                let j = (rng.next() as usize) % (n + 1);
                let t = rng.next() % (n as u64 * 10 + 2_000_000);
                let want = (j..n).find(|&i| row.end[i] >= t).unwrap_or(n);
                assert_eq!(row.next_reaching(j, t), want, "n={n} j={j} t={t}");
            }
        }
    }

    #[test]
    fn bands_split_by_process() {
        let ranges = vec![
            instance(0, 0, Some(100), 0),
            instance(1, 200, Some(300), 0),
            instance(1, 250, Some(260), 2),
        ];
        let rows = RangeRows::new(&ranges);
        assert_eq!(rows.bands(None, 0, 1_000).len(), 3);
        assert_eq!(rows.bands(Some(ProcessIdx(0)), 0, 1_000).len(), 1);
        let p1 = rows.bands(Some(ProcessIdx(1)), 0, 1_000);
        assert_eq!(p1.iter().map(|b| b.depth).collect::<Vec<_>>(), vec![0, 1]);
        assert!(rows.bands(Some(ProcessIdx(2)), 0, 1_000).is_empty());
    }
}

#[cfg(test)]
mod bench {
    use super::*;

    #[test]
    #[ignore = "timing, run with --release --ignored --nocapture"]
    fn downsample_timing() {
        let mut t = Timeline::new();
        let mut ts = 0u64;
        let mut v = 1u64 << 30;
        for i in 0..10_000_000u64 {
            ts += 40 + (i * 7919) % 200;
            v = v.wrapping_add((i % 13) << 20).wrapping_sub((i % 11) << 20);
            t.push(ts, v);
        }
        t.build_index();
        let ix = IndexedTimeline::from(t.clone());
        for div in [1u64, 4, 16, 64] {
            let span = ts / div;
            let a = ts / 2 - span / 2;
            let mut junk = vec![1u64; 16 << 20];
            let mut flush = || {
                junk.iter_mut().for_each(|x| *x = x.wrapping_mul(3));
                std::hint::black_box(&junk);
            };
            flush();
            let s = std::time::Instant::now();
            let r1 = t.downsample(a, a + span, 1150);
            let d1 = s.elapsed();
            flush();
            let s = std::time::Instant::now();
            let r2 = ix.downsample(a, a + span, 1150);
            let d2 = s.elapsed();
            assert_eq!(r1, r2);
            let s = std::time::Instant::now();
            let mut idx = ix.lower_bound_from(0, a);
            let mut ends = Vec::new();
            for c in 0..1150u64 {
                let b = a + span * (c + 1) / 1150;
                idx = ix.lower_bound_from(idx, b);
                ends.push(idx);
            }
            let d3 = s.elapsed();
            let s = std::time::Instant::now();
            let mut prev = ix.lower_bound_from(0, a);
            let mut acc = 0u64;
            for e in &ends {
                acc ^= ix.range_min_max(prev, *e).map_or(0, |x| x.1);
                prev = *e;
            }
            let d4 = s.elapsed();
            println!("1/{div}: timeline {d1:?} indexed {d2:?} bounds {d3:?} minmax {d4:?} {acc}");
        }
    }
}
