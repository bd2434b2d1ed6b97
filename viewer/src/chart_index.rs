//! The index that keeps NVTX range bands cheap on big traces, built once per trace and queried
//! per frame: [`RangeRows`] holds the range instances per nesting row (depth 0..3) as flat
//! begin/end arrays with a max pyramid over the ends, so the bands of a window cost
//! O(pixels · log n), not O(instances). (Timelines need no index of their own here:
//! `Timeline::downsample` already costs O(columns · log n).)

use analysis_core::format::{ProcessIdx, StringId};
use analysis_core::model::RangeStore;

/// Fan-out of the max pyramid over range ends.
const BLOCK: usize = 64;

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
    pub fn new(ranges: &RangeStore) -> Self {
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
                parent = ranges
                    .end_and_parent(parent as usize - 1)
                    .map_or(0, |(_, p)| p);
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
    use analysis_core::model::RangeInstance;

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
        let rows = RangeRows::new(&RangeStore::from(ranges));
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
        let rows = RangeRows::new(&RangeStore::from(ranges));
        assert_eq!(rows.bands(None, 0, 1_000).len(), 3);
        assert_eq!(rows.bands(Some(ProcessIdx(0)), 0, 1_000).len(), 1);
        let p1 = rows.bands(Some(ProcessIdx(1)), 0, 1_000);
        assert_eq!(p1.iter().map(|b| b.depth).collect::<Vec<_>>(), vec![0, 1]);
        assert!(rows.bands(Some(ProcessIdx(2)), 0, 1_000).is_empty());
    }
}
