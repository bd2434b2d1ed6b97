//! The replay model: observes decoded records in order and builds what every view and detector
//! needs — live bytes over time per (process, device), the peak and what was live then, the live
//! set at any time, per-stack and per-NVTX-range aggregates, samples and failures.
//!
//! Accounting rules (also in `FORMAT.md`): device live bytes count every allocation kind except
//! pinned host memory (its own per-process series), IPC imports (the exporting process counts
//! them) and unknown kinds (counted in no series); a free releases the whole allocation; a
//! context reset releases every live allocation of that process on that device.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use hashbrown::HashMap;
use serde::Serialize;

pub use crate::alloc_store::{AllocRecord, AllocStore, Fields, LIVE, Owner};
pub use crate::attribution::FrameView;
pub use crate::decode::MAX_OPEN_RANGES;
use crate::decode::{DecodeError, Decoder, Hot, Warning, WarningLog};
use crate::encode::RecordSink;
use crate::format::*;
use crate::join::{Join, Sequential};
use crate::marks::Marks;
use crate::packed::{BLOCK, Spill};
pub use crate::range_store::{RangeInstance, RangeStore};
pub use crate::samples::{DeviceSamples, PoolSamples};
use crate::timeline::{Timeline, TimelineBuilder};

/// Maximum stack depth followed when resolving a stack (guards against cycles in bad traces).
pub const MAX_STACK_DEPTH: usize = 512;
/// Key of a live-bytes series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeriesKey {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    /// Pinned host memory is its own series and is not in the device totals.
    pub host: bool,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub key: SeriesKey,
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub peak_ts_nanos: u64,
    pub timeline: Timeline,
}

impl Series {
    fn empty(key: SeriesKey) -> Self {
        Self {
            key,
            live_bytes: 0,
            live_count: 0,
            peak_bytes: 0,
            peak_ts_nanos: 0,
            timeline: Timeline::new(),
        }
    }

    /// Applies an allocation (`add`) or a release of `bytes` at `t` to the live bytes, count and
    /// peak (not to the timeline, which its owner pushes).
    fn change(&mut self, t: u64, add: bool, bytes: u64) {
        if add {
            self.live_bytes = self.live_bytes.saturating_add(bytes);
            self.live_count += 1;
        } else {
            self.live_bytes = self.live_bytes.saturating_sub(bytes);
            self.live_count = self.live_count.saturating_sub(1);
        }
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            self.peak_ts_nanos = t;
        }
    }
}

/// The allocation and free events of the allocations `keep` selects (by index and record), in
/// time order: `(time, is a free, index)`, an allocation before a free at the same nanosecond,
/// then by index. In a history in order (allocation times never step back, no free before its
/// allocation) they are merged as they go, the allocations in id order with a queue of the
/// frees to come, so the events take what is live at once. Where allocation times step back
/// (the processes of a multi-process run, or threads whose records reached the ring out of
/// order) but no free comes before its allocation, they are reordered as they go
/// ([`AllocEvents::Reordered`]): what is held is what is live plus the allocations read ahead of
/// the earliest time still to come. Only a damaged history, with a free before its allocation,
/// has them all sorted first (16 bytes per event).
pub(crate) fn alloc_events<'a, K: Fn(usize, &AllocRecord) -> bool>(
    allocs: &'a AllocStore,
    keep: K,
) -> AllocEvents<'a, K> {
    alloc_events_in(allocs, keep, crate::reorder::CHUNK)
}

/// [`alloc_events`], reordering `chunk` allocations at a time.
fn alloc_events_in<'a, K: Fn(usize, &AllocRecord) -> bool>(
    allocs: &'a AllocStore,
    keep: K,
    chunk: usize,
) -> AllocEvents<'a, K> {
    let (mut last, mut in_order, mut frees_follow) = (0u64, true, true);
    let times = allocs.iter_fields(Fields::TS | Fields::FREE).map(|a| {
        let follows = a.is_live() || a.free_ts_nanos >= a.ts_nanos;
        in_order &= a.ts_nanos >= last && follows;
        frees_follow &= follows;
        last = a.ts_nanos;
        a.ts_nanos
    });
    let chunk = chunk.max(1);
    let least = crate::reorder::chunk_least(times, chunk);
    if in_order {
        return AllocEvents::Merged {
            allocs: allocs.iter().enumerate(),
            keep,
            next: None,
            frees: alloc::collections::BinaryHeap::new(),
        };
    }
    if frees_follow {
        return AllocEvents::Reordered {
            allocs: allocs.iter().enumerate(),
            keep,
            order: crate::reorder::Reorder::new(least, chunk, allocs.len()),
        };
    }
    AllocEvents::Sorted(sorted_events(allocs, keep).into_iter())
}

/// [`alloc_events`] for any history: every event collected, then sorted.
fn sorted_events(
    allocs: &AllocStore,
    keep: impl Fn(usize, &AllocRecord) -> bool,
) -> Vec<(u64, bool, u32)> {
    let mut events = Vec::new();
    for (i, a) in allocs.iter().enumerate() {
        if keep(i, &a) {
            events.push((a.ts_nanos, false, i as u32));
            if !a.is_live() {
                events.push((a.free_ts_nanos, true, i as u32));
            }
        }
    }
    events.sort_unstable();
    events
}

/// The events of [`alloc_events`].
pub(crate) enum AllocEvents<'a, K> {
    Merged {
        allocs: core::iter::Enumerate<crate::alloc_store::Iter<'a>>,
        keep: K,
        /// The next kept allocation: (time, free time, index).
        next: Option<(u64, u64, u32)>,
        /// (free time, index) of the kept allocations freed later.
        frees: alloc::collections::BinaryHeap<core::cmp::Reverse<(u64, u32)>>,
    },
    /// A history whose allocation times step back, each free at or after its allocation,
    /// reordered as it is read (`reorder`): an allocation still unread, and its free, come
    /// at or after the earliest time of the chunks unread, with a higher index.
    Reordered {
        allocs: core::iter::Enumerate<crate::alloc_store::Iter<'a>>,
        keep: K,
        order: crate::reorder::Reorder<(u64, bool, u32), ()>,
    },
    Sorted(alloc::vec::IntoIter<(u64, bool, u32)>),
}

impl<K: Fn(usize, &AllocRecord) -> bool> Iterator for AllocEvents<'_, K> {
    type Item = (u64, bool, u32);

    fn next(&mut self) -> Option<(u64, bool, u32)> {
        let (allocs, keep, next, frees) = match self {
            Self::Sorted(events) => return events.next(),
            Self::Reordered {
                allocs,
                keep,
                order,
            } => {
                let read = |queue: &mut dyn FnMut((u64, bool, u32), ())| {
                    let Some((i, a)) = allocs.next() else {
                        return false;
                    };
                    if keep(i, &a) {
                        queue((a.ts_nanos, false, i as u32), ());
                        if !a.is_live() {
                            queue((a.free_ts_nanos, true, i as u32), ());
                        }
                    }
                    true
                };
                return order.next(|t, i| (t, false, i), read).map(|e| e.0);
            }
            Self::Merged {
                allocs,
                keep,
                next,
                frees,
            } => (allocs, keep, next, frees),
        };
        if next.is_none() {
            *next = allocs
                .find(|(i, a)| keep(*i, a))
                .map(|(i, a)| (a.ts_nanos, a.free_ts_nanos, i as u32));
        }
        let free_first = match (*next, frees.peek()) {
            (None, None) => return None,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            // An allocation comes before a free at the same nanosecond.
            (Some((t, _, _)), Some(&core::cmp::Reverse((f, _)))) => f < t,
        };
        if free_first {
            let core::cmp::Reverse((f, i)) = frees.pop()?;
            return Some((f, true, i));
        }
        let (t, free, i) = next.take()?;
        if free != LIVE {
            frees.push(core::cmp::Reverse((free, i)));
        }
        Some((t, false, i))
    }
}

/// Per-stack aggregate.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StackStats {
    pub stack: StackId,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub free_count: u64,
    pub freed_bytes: u64,
    pub live_count: u64,
    pub live_bytes: u64,
    pub max_size_bytes: u64,
    /// Bytes of this stack live at the global peak.
    pub peak_bytes: u64,
}

/// A call stack's device allocations live at the global peak.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeakStack {
    pub stack: StackId,
    pub bytes: u64,
    pub count: u64,
    /// The threads that made them, sorted: the first 16 met in id order.
    pub threads: Vec<ThreadIdx>,
}

/// Threads [`PeakStack::threads`] keeps.
pub const PEAK_STACK_THREADS: usize = 16;

/// A failed allocation with the state at that moment.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FailedAllocation {
    pub record: AllocFailed,
    /// Device live bytes (this process, that device) at the failure.
    pub live_bytes: u64,
}

/// A context reset and what it released.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ResetEvent {
    pub record: ContextReset,
    pub freed_count: u64,
    pub freed_bytes: u64,
}

/// Everything a trace replays into.
#[derive(Clone, Debug, Default)]
pub struct TraceModel {
    pub header: Header,
    pub processes: Vec<ProcessInfo>,
    pub devices: Vec<DeviceInfo>,
    pub modules: HashMap<ModuleId, ModuleInfo>,
    pub strings: HashMap<StringId, String>,
    pub frames: HashMap<FrameId, FrameDef>,
    pub symbols: HashMap<FrameId, FrameSymbol>,
    pub stacks: HashMap<StackId, StackDef>,
    pub threads: Vec<ThreadInfo>,
    /// Every allocation in id order, stored by column (`alloc_store`).
    pub allocs: AllocStore,
    pub failed: Vec<FailedAllocation>,
    pub free_unknown: Vec<FreeUnknown>,
    pub resets: Vec<ResetEvent>,
    /// Every NVTX range instance in the order they began, stored by column (`range_store`).
    pub ranges: RangeStore,
    pub marks: Marks,
    /// NVML's device samples and the pools' samples, stored by column (`samples`).
    pub device_samples: DeviceSamples,
    pub pool_samples: PoolSamples,
    pub process_exits: Vec<ProcessExit>,
    pub dropped_events: u64,
    /// The collector's notices about the capture itself (untraced processes).
    pub notices: Vec<Notice>,
    pub series: Vec<Series>,
    /// The framework layer (FORMAT.md, "Two layers"): per process and device, the live bytes of
    /// framework blocks (allocation kind 7, a caching allocator's tensors), as
    /// `torch.cuda.memory_allocated()` counts them. Empty when the trace has no framework block.
    /// `host` is always false.
    pub allocated: Vec<Series>,
    /// Device live bytes summed over every process and device.
    pub total: Timeline,
    pub total_live_bytes: u64,
    pub peak_bytes: u64,
    pub peak_ts_nanos: u64,
    pub stack_stats: HashMap<StackId, StackStats>,
    /// The stacks with device allocations live at the peak, most bytes first (then by stack);
    /// made by `finish`, in the pass that sets [`StackStats::peak_bytes`].
    pub peak_stacks: Vec<PeakStack>,
    /// Last thread activity (any record naming the thread), for "thread went idle" analysis.
    pub thread_last_ts: HashMap<(ProcessIdx, ThreadIdx), u64>,
    pub first_ts_nanos: u64,
    pub last_ts_nanos: u64,
    pub clean_end: bool,
    pub records: u64,
    // replay state
    open_ranges: HashMap<RangeId, u32>,
    /// The most ranges open at once: the map's size, which removals do not shrink, is counted
    /// in `table_bytes` as it grows.
    open_ranges_most: usize,
    /// Per (process, thread): its open ranges and its allocations while any range was open.
    thread_ranges: Vec<ThreadRanges>,
    /// The index in `thread_ranges` looked up last.
    last_range_thread: usize,
    any_open_range: bool,
    last_series: usize,
    /// The points of `total` and of each series while they are replayed, made timelines by
    /// `finish`.
    total_points: TimelineBuilder,
    series_points: Vec<CountedPoints>,
    /// Where full chunks of the history and the timelines' points go (`set_spill`).
    spill: Option<Arc<dyn Spill>>,
    /// While the trace has exactly one device series, its index: its points equal the total's,
    /// so they are kept once (pushed to `total`, shared with the series by `finish`).
    solo_series: Option<usize>,
    device_series_count: usize,
    /// Per-stack aggregates for small (dense) stack ids, merged into `stack_stats` by `finish`.
    stack_dense: Vec<StackStats>,
    /// Last activity per (process, thread), merged into `thread_last_ts` by `finish`.
    thread_activity: Vec<((ProcessIdx, ThreadIdx), u64)>,
    thread_slots: HashMap<(ProcessIdx, ThreadIdx), usize>,
    last_thread: usize,
    /// Device live bytes per process, and the open ranges whose peak they feed.
    procs: Vec<ProcLive>,
    proc_slots: HashMap<ProcessIdx, usize>,
    last_proc: usize,
    bad_free_count: u64,
    bad_free_first_offset: u64,
    finished: bool,
    /// Index of `series` by key.
    series_slots: HashMap<SeriesKey, usize>,
    /// Index of `allocated` by key.
    allocated_slots: HashMap<SeriesKey, usize>,
    /// The points of each `allocated` series as they come (its timeline, made by `finish`).
    allocated_points: Vec<CountedPoints>,
    /// Index of `thread_ranges` by thread.
    thread_range_slots: HashMap<(ProcessIdx, ThreadIdx), usize>,
    /// Indexes of `processes`, `devices` and `threads`.
    process_info_slots: HashMap<ProcessIdx, usize>,
    device_info_slots: HashMap<DeviceIdx, usize>,
    thread_info_slots: HashMap<(ThreadIdx, ProcessIdx), usize>,
    /// Per (process, device): the allocations that may still be live, for context resets.
    reset_lists: Vec<ResetList>,
    /// Whether `reset_lists` are kept: from the first context reset on (`start_reset_lists`).
    reset_lists_on: bool,
    reset_slots: HashMap<(ProcessIdx, DeviceIdx), usize>,
    last_reset_list: usize,
    /// Ranges begun while their process had [`MAX_OPEN_RANGES`] open.
    untracked_ranges: u64,
    /// Allocations live now (every kind), for [`Self::heap_estimate`].
    live_allocs: u64,
    /// Heap bytes the tables other than `allocs` and `total` may hold (each growth counted
    /// twice, as a vector may double), for [`Self::heap_estimate`].
    table_bytes: u64,
}

/// A series' points while they are replayed, and what [`TraceModel::heap_estimate`] counts for
/// them: [`Timeline::POINT_HEAP_BYTES`] per point (an upper bound) until a block of points is
/// packed, then the heap they hold. Packed points take a few bytes each, a spilled chunk counts
/// whole (as the history's do), so the model's resident estimate follows its memory: at 24
/// bytes per point it had grown with the history, on disk or not, and stopped the server's
/// summaries of long traces with several devices or framework capture.
#[derive(Clone, Debug, Default)]
struct CountedPoints {
    points: TimelineBuilder,
    /// The bytes of `points` in the model's `table_bytes`.
    counted: u64,
}

impl CountedPoints {
    fn new(spill: Option<Arc<dyn Spill>>) -> Self {
        Self {
            points: TimelineBuilder::spilling(spill),
            counted: 0,
        }
    }

    /// [`TimelineBuilder::push`], keeping `table_bytes`'s count of the points.
    #[inline(always)]
    fn push(&mut self, t: u64, v: u64, table_bytes: &mut u64) {
        self.points.push(t, v);
        if self.points.len().is_multiple_of(BLOCK) {
            let held = self.points.heap_bytes() as u64;
            *table_bytes = table_bytes
                .saturating_sub(self.counted)
                .saturating_add(held);
            self.counted = held;
        } else {
            let point = Timeline::POINT_HEAP_BYTES as u64;
            *table_bytes = table_bytes.saturating_add(point);
            self.counted += point;
        }
    }
}

/// The allocations of one (process, device) that may still be live: every allocation is
/// pushed, and the list is compacted to the live ones once it holds four times as many (plus
/// 256), so it stays proportional to what is live and a context reset reads only this list.
/// The lists are made at the first context reset, from the allocations live then, and kept
/// from there on: a trace without one never pays for them.
#[derive(Clone, Debug, Default)]
struct ResetList {
    key: (ProcessIdx, DeviceIdx),
    ids: Vec<u32>,
    live: usize,
    /// Allocations past id 2^32 are not listed.
    overflow: bool,
}

impl ResetList {
    /// Lists allocation `id`, live.
    fn add(&mut self, id: usize) {
        match u32::try_from(id) {
            Ok(id) => self.ids.push(id),
            // Past 2^32 allocations a reset reads the whole history instead.
            Err(_) => self.overflow = true,
        }
        self.live += 1;
    }
}

/// The index of `key` in `items`, found through `slots`; for a key not seen before, `make()` is
/// pushed. Returns the index and whether it is new.
fn slot_for<K: Eq + core::hash::Hash, T>(
    slots: &mut HashMap<K, usize>,
    items: &mut Vec<T>,
    key: K,
    make: impl FnOnce() -> T,
) -> (usize, bool) {
    let next = items.len();
    let i = *slots.entry(key).or_insert(next);
    if i == next {
        items.push(make());
    }
    (i, i == next)
}

/// The heap a vector holds.
fn vec_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * core::mem::size_of::<T>()) as u64
}

/// What a hash map entry of `K` to `V` may hold (its slot at the map's lowest load, and its
/// control byte).
const fn map_cost<K, V>() -> u64 {
    (3 * (core::mem::size_of::<K>() + core::mem::size_of::<V>()) + 8) as u64
}

/// One thread's open ranges, innermost last, and its allocations counted while any range was
/// open. A range's allocations are the difference between the counts at its end and at its
/// begin, so an allocation costs two additions however deep the nesting.
#[derive(Clone, Debug, Default)]
struct ThreadRanges {
    key: (ProcessIdx, ThreadIdx),
    open: Vec<OpenRange>,
    alloc_count: u64,
    /// Wide enough never to overflow: a range's bytes saturate only when written to it.
    alloc_bytes: u128,
}

/// An open range of a thread, with the thread's counts when it began.
#[derive(Clone, Copy, Debug)]
struct OpenRange {
    slot: u32,
    alloc_count: u64,
    alloc_bytes: u128,
}

impl ThreadRanges {
    /// Opens range `slot` at the thread's counts now.
    fn begin(&mut self, slot: u32) {
        self.open.push(OpenRange {
            slot,
            alloc_count: self.alloc_count,
            alloc_bytes: self.alloc_bytes,
        });
    }

    /// Closes range `slot`, if open: its counts at its begin, to [`Self::settle`].
    fn end(&mut self, slot: u32) -> Option<OpenRange> {
        let pos = self.open.iter().rposition(|o| o.slot == slot)?;
        Some(self.open.remove(pos))
    }

    /// Writes into `r` the allocations of the thread since `o` began.
    fn settle(&self, o: OpenRange, r: &mut RangeInstance) {
        r.alloc_count = self.alloc_count - o.alloc_count;
        r.alloc_bytes = u64::try_from(self.alloc_bytes - o.alloc_bytes).unwrap_or(u64::MAX);
    }
}

/// Replay state of one process: its device live bytes and the highest value reached since the
/// last range event, folded into the peaks of its open ranges at the next range event (so an
/// allocation costs O(1) however many ranges are open).
#[derive(Clone, Debug, Default)]
struct ProcLive {
    process: ProcessIdx,
    live_bytes: u64,
    max_since_fold: u64,
    open_slots: Vec<u32>,
}

impl TraceModel {
    /// Devices allocated on (a device series) without a device record, in order of their
    /// first series.
    pub fn undeclared_devices(&self) -> Vec<DeviceIdx> {
        let mut out: Vec<DeviceIdx> = Vec::new();
        // Declared devices count as seen.
        let mut seen: hashbrown::HashSet<DeviceIdx> =
            self.devices.iter().map(|x| x.device).collect();
        for s in self.series.iter().filter(|s| !s.key.host) {
            let d = s.key.device;
            if seen.insert(d) {
                out.push(d);
            }
        }
        out
    }

    pub fn new(header: Header) -> Self {
        Self {
            header,
            first_ts_nanos: LIVE,
            ..Self::default()
        }
    }

    /// Sends the full chunks of the allocation history, the NVTX range instances and marks,
    /// the device and pool samples and the timelines' points to `spill` from now on (where it takes them), so that their bytes lie
    /// outside memory: the model reads them back through it. Results are the same either way.
    pub fn set_spill(&mut self, spill: Arc<dyn Spill>) {
        let spill = Some(spill);
        self.allocs.set_spill(spill.clone());
        self.ranges.set_spill(spill.clone());
        self.total_points.set_spill(spill.clone());
        for p in self
            .series_points
            .iter_mut()
            .chain(&mut self.allocated_points)
        {
            p.points.set_spill(spill.clone());
        }
        self.marks.set_spill(spill.clone());
        self.device_samples.set_spill(spill.clone());
        self.pool_samples.set_spill(spill.clone());
        self.spill = spill;
    }

    /// The spill given to [`Self::set_spill`], for tables an analysis makes that grow with the
    /// history as the model's do.
    pub fn spill(&self) -> Option<Arc<dyn Spill>> {
        self.spill.clone()
    }

    /// [`Self::heap_estimate`] less the bytes the spill holds: what lies in memory.
    pub fn resident_heap_estimate(&self) -> u64 {
        let away = self.spill.as_ref().map_or(0, |s| s.held_bytes());
        self.heap_estimate().saturating_sub(away)
    }

    pub fn string(&self, id: StringId) -> &str {
        self.strings.get(&id).map(String::as_str).unwrap_or("")
    }

    /// Duration from the first to the last timed record.
    pub fn duration_nanos(&self) -> u64 {
        if self.first_ts_nanos == LIVE {
            0
        } else {
            self.last_ts_nanos.saturating_sub(self.first_ts_nanos)
        }
    }

    /// An estimate of the heap the model holds: the allocation history, the total's timeline
    /// and the vectors of records as they are, and the hash maps, strings, other timelines and
    /// lists by what was added to them. The loader stops a trace whose model passes its budget
    /// ([`DecodeError::TooDense`]).
    pub fn heap_estimate(&self) -> u64 {
        let vectors = vec_bytes(&self.failed)
            + vec_bytes(&self.free_unknown)
            + vec_bytes(&self.resets)
            + self.marks.heap_bytes() as u64
            + vec_bytes(&self.process_exits)
            + vec_bytes(&self.notices)
            + vec_bytes(&self.processes)
            + vec_bytes(&self.devices)
            + vec_bytes(&self.threads)
            + vec_bytes(&self.series)
            + vec_bytes(&self.allocated)
            + vec_bytes(&self.procs)
            + vec_bytes(&self.thread_ranges)
            + vec_bytes(&self.thread_activity)
            + vec_bytes(&self.stack_dense)
            + vec_bytes(&self.reset_lists);
        // Reset lists: at most four entries per live allocation plus 256 each, and their
        // vectors' doubling.
        let lists = self.reset_lists.len() as u64 * 256 * 4 * 2 + self.live_allocs * 32;
        self.table_bytes
            + vectors
            + lists
            + (self.allocs.heap_bytes()
                + self.ranges.heap_bytes()
                + self.device_samples.heap_bytes()
                + self.pool_samples.heap_bytes()
                + self.total.heap_bytes()
                + self.total_points.heap_bytes()) as u64
    }

    /// The index in `series` of `key`: the last one's at the cost of a comparison (the common
    /// case, inlined), else looked up or made.
    #[inline(always)]
    fn series_index(&mut self, key: SeriesKey) -> usize {
        if let Some(s) = self.series.get(self.last_series)
            && s.key == key
        {
            return self.last_series;
        }
        self.series_lookup(key)
    }

    #[inline(never)]
    fn series_lookup(&mut self, key: SeriesKey) -> usize {
        let i = match self.series_slots.get(&key) {
            Some(&i) => i,
            None => {
                self.series.push(Series::empty(key));
                self.series_points
                    .push(CountedPoints::new(self.spill.clone()));
                let i = self.series.len() - 1;
                self.series_slots.insert(key, i);
                self.table_bytes +=
                    map_cost::<SeriesKey, usize>() + Timeline::EMPTY_HEAP_BYTES as u64;
                if !key.host {
                    self.device_series_count += 1;
                    if self.device_series_count == 1 {
                        self.solo_series = Some(i);
                    } else if let Some(solo) = self.solo_series.take() {
                        // A second device series: the first one's points so far are the total's.
                        self.series_points[solo].points = self.total_points.clone();
                    }
                }
                i
            }
        };
        self.last_series = i;
        i
    }

    /// The index in `procs` of `process`: the last one's at the cost of a comparison (the
    /// common case, inlined), else looked up.
    #[inline(always)]
    fn proc_index(&mut self, process: ProcessIdx) -> usize {
        if let Some(p) = self.procs.get(self.last_proc)
            && p.process == process
        {
            return self.last_proc;
        }
        self.proc_lookup(process)
    }

    #[inline(never)]
    fn proc_lookup(&mut self, process: ProcessIdx) -> usize {
        let (i, new) = slot_for(&mut self.proc_slots, &mut self.procs, process, || {
            ProcLive {
                process,
                ..ProcLive::default()
            }
        });
        if new {
            self.table_bytes += map_cost::<ProcessIdx, usize>();
        }
        self.last_proc = i;
        i
    }

    /// Credits the highest live bytes since the last fold to every open range of the process.
    fn fold_range_peaks(&mut self, pi: usize) {
        let p = &mut self.procs[pi];
        let peak = p.max_since_fold;
        for &slot in &p.open_slots {
            self.ranges
                .update(slot as usize - 1, |r| r.peak_bytes = r.peak_bytes.max(peak));
        }
        p.max_since_fold = p.live_bytes;
    }

    /// The index in `thread_ranges` of a thread, its entry made empty on first use.
    fn thread_ranges_slot(&mut self, key: (ProcessIdx, ThreadIdx)) -> usize {
        match self.thread_range_index(key) {
            Some(i) => i,
            None => {
                let (i, _) = slot_for(
                    &mut self.thread_range_slots,
                    &mut self.thread_ranges,
                    key,
                    || ThreadRanges {
                        key,
                        ..ThreadRanges::default()
                    },
                );
                self.table_bytes += map_cost::<(ProcessIdx, ThreadIdx), usize>();
                self.last_range_thread = i;
                i
            }
        }
    }

    /// The index in `thread_ranges` of a thread that ever opened a range.
    #[inline]
    fn thread_range_index(&mut self, key: (ProcessIdx, ThreadIdx)) -> Option<usize> {
        if let Some(t) = self.thread_ranges.get(self.last_range_thread)
            && t.key == key
        {
            return Some(self.last_range_thread);
        }
        let i = *self.thread_range_slots.get(&key)?;
        self.last_range_thread = i;
        Some(i)
    }

    /// Makes the reset lists from the allocations live now, and keeps them from now on.
    fn start_reset_lists(&mut self) {
        self.reset_lists_on = true;
        let allocs = core::mem::take(&mut self.allocs);
        let fields = Fields::PROCESS | Fields::DEVICE | Fields::FREE;
        for (i, a) in allocs.iter_fields(fields).enumerate() {
            if a.is_live() {
                self.reset_list((a.process, a.device)).add(i);
            }
        }
        self.allocs = allocs;
    }

    /// The reset list of (process, device).
    #[inline]
    fn reset_list(&mut self, key: (ProcessIdx, DeviceIdx)) -> &mut ResetList {
        let i = self.reset_list_index(key);
        &mut self.reset_lists[i]
    }

    /// The index in `reset_lists` of (process, device): the last one's at the cost of a
    /// comparison (inlined), else looked up.
    #[inline(always)]
    fn reset_list_index(&mut self, key: (ProcessIdx, DeviceIdx)) -> usize {
        if self
            .reset_lists
            .get(self.last_reset_list)
            .is_none_or(|l| l.key != key)
        {
            self.reset_list_lookup(key);
        }
        self.last_reset_list
    }

    #[inline(never)]
    fn reset_list_lookup(&mut self, key: (ProcessIdx, DeviceIdx)) {
        let (i, new) = slot_for(&mut self.reset_slots, &mut self.reset_lists, key, || {
            ResetList {
                key,
                ..ResetList::default()
            }
        });
        if new {
            self.table_bytes += map_cost::<(ProcessIdx, DeviceIdx), usize>();
        }
        self.last_reset_list = i;
    }

    #[inline]
    fn touch_time(&mut self, t: u64) {
        if self.first_ts_nanos == LIVE {
            self.first_ts_nanos = t;
        }
        if t > self.last_ts_nanos {
            self.last_ts_nanos = t;
        }
    }

    /// Records activity of a thread at `t` (cheap for the common case of one busy thread:
    /// inlined, the rest looked up).
    #[inline(always)]
    fn touch_thread(&mut self, key: (ProcessIdx, ThreadIdx), t: u64) {
        if let Some(e) = self.thread_activity.get_mut(self.last_thread)
            && e.0 == key
        {
            e.1 = t;
            return;
        }
        self.touch_thread_lookup(key, t);
    }

    #[inline(never)]
    fn touch_thread_lookup(&mut self, key: (ProcessIdx, ThreadIdx), t: u64) {
        let (i, new) = slot_for(
            &mut self.thread_slots,
            &mut self.thread_activity,
            key,
            || (key, t),
        );
        if new {
            self.table_bytes += 2 * map_cost::<(ProcessIdx, ThreadIdx), u64>();
        } else {
            self.thread_activity[i].1 = t;
        }
        self.last_thread = i;
    }

    /// The aggregate of one stack. Stack ids are interned densely by writers, so small ids live
    /// in a vector; a hostile sparse id falls back to the map (memory stays bounded by input).
    #[inline(always)]
    fn stack_entry(&mut self, stack: StackId) -> &mut StackStats {
        let i = stack.0 as usize;
        if i < self.stack_dense.len() {
            return &mut self.stack_dense[i];
        }
        self.stack_lookup(stack)
    }

    /// [`Self::stack_entry`] of a stack past the dense ones.
    #[inline(never)]
    fn stack_lookup(&mut self, stack: StackId) -> &mut StackStats {
        let i = stack.0 as usize;
        if i >= self.stack_dense.len() && i < 1024 + self.allocs.len() {
            let from = self.stack_dense.len();
            self.stack_dense.extend((from..=i).map(|k| StackStats {
                stack: StackId(k as u32),
                ..StackStats::default()
            }));
            // Merged into `stack_stats` by `finish`: counted in both.
            self.table_bytes += (i + 1 - from) as u64 * map_cost::<StackId, StackStats>();
        }
        match self.stack_dense.get_mut(i) {
            Some(e) => e,
            None => {
                if !self.stack_stats.contains_key(&stack) {
                    self.table_bytes += map_cost::<StackId, StackStats>();
                }
                self.stack_stats.entry(stack).or_insert(StackStats {
                    stack,
                    ..StackStats::default()
                })
            }
        }
    }

    /// Applies a change of `delta` live bytes to one series and the totals.
    #[inline(always)]
    fn apply(&mut self, key: SeriesKey, t: u64, add: bool, bytes: u64) {
        let si = self.series_index(key);
        let s = &mut self.series[si];
        s.change(t, add, bytes);
        if self.solo_series != Some(si) {
            self.series_points[si].push(t, s.live_bytes, &mut self.table_bytes);
        }
        if !key.host {
            if add {
                self.total_live_bytes = self.total_live_bytes.saturating_add(bytes);
            } else {
                self.total_live_bytes = self.total_live_bytes.saturating_sub(bytes);
            }
            self.total_points.push(t, self.total_live_bytes);
            if self.total_live_bytes > self.peak_bytes {
                self.peak_bytes = self.total_live_bytes;
                self.peak_ts_nanos = t;
            }
            let pi = self.proc_index(key.process);
            let p = &mut self.procs[pi];
            if add {
                p.live_bytes = p.live_bytes.saturating_add(bytes);
            } else {
                p.live_bytes = p.live_bytes.saturating_sub(bytes);
            }
            p.max_since_fold = p.max_since_fold.max(p.live_bytes);
        }
    }

    /// Releases allocation `idx`, whose fields are `a`, at `t`.
    fn release(&mut self, idx: usize, a: Owner, t: u64, kind: FreeKind) {
        self.allocs.set_free(idx, t, kind);
        if self.reset_lists_on {
            let l = self.reset_list((a.process, a.device));
            l.live = l.live.saturating_sub(1);
        }
        self.live_allocs = self.live_allocs.saturating_sub(1);
        let st = self.stack_entry(a.stack);
        st.free_count += 1;
        st.freed_bytes = st.freed_bytes.saturating_add(a.size_bytes);
        st.live_count = st.live_count.saturating_sub(1);
        st.live_bytes = st.live_bytes.saturating_sub(a.size_bytes);
        let key = SeriesKey {
            process: a.process,
            device: a.device,
            host: !a.kind.is_device_memory(),
        };
        if a.kind.is_tracked() {
            self.apply(key, t, false, a.size_bytes);
        } else if a.kind == AllocKind::FrameworkBlock {
            self.apply_allocated(a.process, a.device, t, false, a.size_bytes);
        }
    }

    /// Applies a framework block's allocation or release to the framework layer's series.
    fn apply_allocated(
        &mut self,
        process: ProcessIdx,
        device: DeviceIdx,
        t: u64,
        add: bool,
        bytes: u64,
    ) {
        let key = SeriesKey {
            process,
            device,
            host: false,
        };
        let i = match self.allocated_slots.get(&key) {
            Some(&i) => i,
            None => {
                self.allocated.push(Series::empty(key));
                self.allocated_points
                    .push(CountedPoints::new(self.spill.clone()));
                let i = self.allocated.len() - 1;
                self.allocated_slots.insert(key, i);
                self.table_bytes +=
                    map_cost::<SeriesKey, usize>() + Timeline::EMPTY_HEAP_BYTES as u64;
                i
            }
        };
        let s = &mut self.allocated[i];
        s.change(t, add, bytes);
        self.allocated_points[i].push(t, s.live_bytes, &mut self.table_bytes);
    }

    /// [`Self::observe`] of an alloc, free or range record, as [`Decoder::hot_records`] gives
    /// them. Inlined where each kind is decoded, so that only its arm is left there.
    #[inline(always)]
    pub fn observe_hot(&mut self, rec: &Hot, offset: u64) {
        self.records += 1;
        match rec {
            Hot::Alloc(a) => {
                self.touch_time(a.ts_nanos);
                self.alloc(a);
            }
            Hot::Free(f) => {
                self.touch_time(f.ts_nanos);
                self.free(f, offset);
            }
            Hot::RangeBegin(b) => {
                self.touch_time(b.ts_nanos);
                self.range_begin(*b);
            }
            Hot::RangeEnd(e) => {
                self.touch_time(e.ts_nanos);
                self.range_end(*e);
            }
        }
    }

    #[inline(always)]
    fn alloc(&mut self, a: &Alloc) {
        let key = SeriesKey {
            process: a.process,
            device: a.device,
            host: !a.kind.is_device_memory(),
        };
        let tkey = (a.process, a.thread);
        let range_slot = if self.any_open_range {
            // Counted for every open range of the thread (nested calls include inner ones): each
            // takes the difference of the thread's counts at its end (`ThreadRanges::settle`).
            match self.thread_range_index(tkey) {
                Some(i) => {
                    let t = &mut self.thread_ranges[i];
                    t.alloc_count += 1;
                    t.alloc_bytes += u128::from(a.size_bytes);
                    t.open.last().map_or(0, |o| o.slot)
                }
                None => 0,
            }
        } else {
            0
        };
        self.touch_thread(tkey, a.ts_nanos);
        // Ids are dense and sequential; pad if a malformed record consumed one.
        while (self.allocs.len() as u64) < a.id.0 {
            self.allocs.push(AllocRecord {
                ts_nanos: a.ts_nanos,
                free_ts_nanos: a.ts_nanos,
                size_bytes: 0,
                address: 0,
                stack: StackId(0),
                thread: a.thread,
                device: a.device,
                process: a.process,
                range_slot: 0,
                kind: AllocKind::Other,
                free_kind: FreeKind::Other,
            });
        }
        if self.reset_lists_on {
            let li = self.reset_list_index((a.process, a.device));
            let list = &mut self.reset_lists[li];
            if list.ids.len() >= 4 * list.live + 256 {
                let allocs = &self.allocs;
                list.ids.retain(|&i| allocs.is_live(i as usize));
            }
            list.add(self.allocs.len());
        }
        self.live_allocs += 1;
        self.allocs.push(AllocRecord {
            ts_nanos: a.ts_nanos,
            free_ts_nanos: LIVE,
            size_bytes: a.size_bytes,
            address: a.address,
            stack: a.stack,
            thread: a.thread,
            device: a.device,
            process: a.process,
            range_slot,
            kind: a.kind,
            free_kind: FreeKind::Immediate,
        });
        let st = self.stack_entry(a.stack);
        st.alloc_count += 1;
        st.alloc_bytes = st.alloc_bytes.saturating_add(a.size_bytes);
        st.live_count += 1;
        st.live_bytes = st.live_bytes.saturating_add(a.size_bytes);
        st.max_size_bytes = st.max_size_bytes.max(a.size_bytes);
        if a.kind.is_tracked() {
            self.apply(key, a.ts_nanos, true, a.size_bytes);
        } else if a.kind == AllocKind::FrameworkBlock {
            self.apply_allocated(a.process, a.device, a.ts_nanos, true, a.size_bytes);
        }
    }

    #[inline(always)]
    fn free(&mut self, f: &Free, offset: u64) {
        let idx = f.alloc.0;
        match usize::try_from(idx)
            .ok()
            .and_then(|i| self.allocs.live_owner(i))
        {
            Some(a) => {
                self.touch_thread((a.process, f.thread), f.ts_nanos);
                self.release(idx as usize, a, f.ts_nanos, f.kind);
            }
            None => {
                if self.bad_free_count == 0 {
                    self.bad_free_first_offset = offset;
                }
                self.bad_free_count += 1;
            }
        }
    }

    fn range_begin(&mut self, b: RangeBegin) {
        let pi = self.proc_index(b.process);
        let tracked = self.procs[pi].open_slots.len() < MAX_OPEN_RANGES;
        if tracked {
            self.fold_range_peaks(pi);
        } else {
            self.untracked_ranges += 1;
        }
        let live = self.procs[pi].live_bytes;
        let tkey = (b.process, b.thread);
        let ti = self.thread_ranges_slot(tkey);
        let parent_slot = self.thread_ranges[ti].open.last().map_or(0, |o| o.slot);
        self.ranges.push(RangeInstance {
            range: b.range,
            name: b.name,
            domain: b.domain,
            thread: b.thread,
            process: b.process,
            begin_ts_nanos: b.ts_nanos,
            end_ts_nanos: None,
            live_before_bytes: live,
            live_after_bytes: live,
            peak_bytes: live,
            alloc_count: 0,
            alloc_bytes: 0,
            parent_slot,
        });
        let slot = self.ranges.len() as u32;
        self.open_ranges.insert(b.range, slot);
        if self.open_ranges.len() > self.open_ranges_most {
            self.open_ranges_most = self.open_ranges.len();
            self.table_bytes += map_cost::<RangeId, u32>();
        }
        if tracked {
            self.procs[pi].open_slots.push(slot);
            self.thread_ranges[ti].begin(slot);
        }
        self.any_open_range = true;
        self.touch_thread(tkey, b.ts_nanos);
    }

    fn range_end(&mut self, e: RangeEnd) {
        if let Some(slot) = self.open_ranges.remove(&e.range) {
            let Some(r) = self.ranges.get(slot as usize - 1) else {
                return;
            };
            let pi = self.proc_index(r.process);
            self.fold_range_peaks(pi);
            let open = &mut self.procs[pi].open_slots;
            if let Some(pos) = open.iter().rposition(|&s| s == slot) {
                open.remove(pos);
            }
            let live = self.procs[pi].live_bytes;
            let tkey = (r.process, r.thread);
            let i = self.thread_ranges_slot(tkey);
            let t = &mut self.thread_ranges[i];
            let opened = t.end(slot);
            self.ranges.update(slot as usize - 1, |ri| {
                ri.end_ts_nanos = Some(e.ts_nanos);
                ri.live_after_bytes = live;
                // A range past the open limit was not folded: its peak is at least its end.
                ri.peak_bytes = ri.peak_bytes.max(live);
                if let Some(o) = opened {
                    t.settle(o, ri);
                }
            });
            self.touch_thread(tkey, e.ts_nanos);
            self.any_open_range = !self.open_ranges.is_empty();
        }
    }

    /// Replays one record. `offset` is its byte offset, for warnings.
    pub fn observe(&mut self, rec: Record, offset: u64) {
        self.records += 1;
        if let Some(t) = rec.ts_nanos() {
            self.touch_time(t);
        }
        match rec {
            Record::Alloc(a) => self.alloc(&a),
            Record::Free(f) => self.free(&f, offset),
            Record::ContextReset(c) => {
                let mut freed_count = 0;
                let mut freed_bytes: u64 = 0;
                let any = [false, true].iter().any(|&host| {
                    let key = SeriesKey {
                        process: c.process,
                        device: c.device,
                        host,
                    };
                    self.series_slots
                        .get(&key)
                        .is_some_and(|&i| self.series[i].live_count > 0)
                });
                if !self.reset_lists_on {
                    self.start_reset_lists();
                }
                let li = self.reset_list_index((c.process, c.device));
                let list = &mut self.reset_lists[li];
                let ids = core::mem::take(&mut list.ids);
                let overflow = core::mem::take(&mut list.overflow);
                if any {
                    let mine = |a: &AllocRecord| {
                        a.is_live() && a.process == c.process && a.device == c.device
                    };
                    let mut held: Vec<(usize, AllocRecord)> = ids
                        .iter()
                        .filter_map(|&i| self.allocs.get(i as usize).map(|a| (i as usize, a)))
                        .filter(|(_, a)| mine(a))
                        .collect();
                    if overflow {
                        held = self
                            .allocs
                            .iter()
                            .enumerate()
                            .filter(|(_, a)| mine(a))
                            .collect();
                    }
                    for (i, a) in held {
                        freed_count += 1;
                        freed_bytes = freed_bytes.saturating_add(a.size_bytes);
                        self.release(i, Owner::of(&a), c.ts_nanos, FreeKind::ContextTeardown);
                    }
                }
                self.resets.push(ResetEvent {
                    record: c,
                    freed_count,
                    freed_bytes,
                });
            }
            Record::FreeUnknown(f) => {
                self.free_unknown.push(f);
            }
            Record::AllocFailed(f) => {
                let key = SeriesKey {
                    process: f.process,
                    device: f.device,
                    host: false,
                };
                let live_bytes = self
                    .series_slots
                    .get(&key)
                    .map_or(0, |&i| self.series[i].live_bytes);
                self.touch_thread((f.process, f.thread), f.ts_nanos);
                self.failed.push(FailedAllocation {
                    record: f,
                    live_bytes,
                });
            }
            Record::RangeBegin(b) => self.range_begin(b),
            Record::RangeEnd(e) => self.range_end(e),
            Record::Mark(m) => {
                self.marks.push(m);
            }
            Record::DeviceSample(s) => {
                self.device_samples.push(s);
            }
            Record::PoolSample(s) => {
                self.pool_samples.push(s);
            }
            Record::ProcessExit(e) => {
                self.process_exits.push(e);
            }
            Record::Dropped(d) => self.dropped_events += d.count,
            Record::Notice(n) => {
                self.notices.push(n);
            }
            Record::End { .. } => self.clean_end = true,
            Record::Process(p) => {
                self.table_bytes += map_cost::<ProcessIdx, usize>()
                    + 2 * p.exe.len() as u64
                    + p.argv.iter().map(|a| 2 * a.len() as u64 + 48).sum::<u64>();
                match self.process_info_slots.get(&p.process) {
                    Some(&i) => self.processes[i] = p,
                    None => {
                        self.process_info_slots
                            .insert(p.process, self.processes.len());
                        self.processes.push(p);
                    }
                }
            }
            Record::Device(d) => {
                self.table_bytes +=
                    map_cost::<DeviceIdx, usize>() + 2 * (d.uuid.len() + d.name.len()) as u64;
                match self.device_info_slots.get(&d.device) {
                    Some(&i) => self.devices[i] = d,
                    None => {
                        self.device_info_slots.insert(d.device, self.devices.len());
                        self.devices.push(d);
                    }
                }
            }
            Record::Module(m) => {
                self.table_bytes += map_cost::<ModuleId, ModuleInfo>()
                    + 2 * (m.path.len() + m.build_id.len()) as u64;
                self.modules.insert(m.module, m);
            }
            Record::String { id, value } => {
                self.table_bytes += map_cost::<StringId, String>() + 2 * value.len() as u64;
                self.strings.insert(id, value);
            }
            Record::Frame(f) => {
                self.table_bytes += map_cost::<FrameId, FrameDef>();
                self.frames.insert(f.id(), f);
            }
            Record::FrameSymbol(s) => {
                self.table_bytes += map_cost::<FrameId, FrameSymbol>();
                self.symbols.insert(s.frame, s);
            }
            Record::Stack(s) => {
                self.table_bytes += map_cost::<StackId, StackDef>();
                self.stacks.insert(s.stack, s);
            }
            Record::Thread(t) => {
                self.table_bytes += map_cost::<(ThreadIdx, ProcessIdx), usize>();
                match self.thread_info_slots.get(&(t.thread, t.process)) {
                    Some(&i) => self.threads[i] = t,
                    None => {
                        self.thread_info_slots
                            .insert((t.thread, t.process), self.threads.len());
                        self.threads.push(t);
                    }
                }
            }
        }
    }

    /// Ends the replay: builds indexes and the peak attribution. Returns model-level warnings.
    pub fn finish(&mut self) -> Vec<Warning> {
        self.finish_with(&Sequential)
    }

    /// [`Self::finish`], its pass over what is live at the peak run through `join`, a half of
    /// the history on each side (on a long history the pass takes a second or two).
    pub fn finish_with(&mut self, join: &impl Join) -> Vec<Warning> {
        let mut w = Vec::new();
        if self.finished {
            return w;
        }
        self.finished = true;
        if self.first_ts_nanos == LIVE {
            self.first_ts_nanos = 0;
        }
        for pi in 0..self.procs.len() {
            self.fold_range_peaks(pi);
        }
        // Ranges still open at the end hold the allocations up to it.
        for t in &self.thread_ranges {
            for &o in &t.open {
                self.ranges.update(o.slot as usize - 1, |r| t.settle(o, r));
            }
        }
        self.ranges.pack_all();
        // The total's pyramid was made as its points came; what is live at the peak is found
        // in two halves of the history at once, merged as one pass in id order would have
        // found it.
        self.total = core::mem::take(&mut self.total_points).build();
        let (allocs, t) = (&self.allocs, self.peak_ts_nanos);
        let mut peak_stacks = if self.peak_bytes > 0 {
            let mid = (allocs.len() / 2).next_multiple_of(BLOCK).min(allocs.len());
            let (mut first, second) = join.join(
                move || peak_stacks_at(allocs, t, 0, mid),
                move || peak_stacks_at(allocs, t, mid, allocs.len()),
            );
            merge_peak_stacks(&mut first, second);
            first
        } else {
            Vec::new()
        };
        let points = core::mem::take(&mut self.allocated_points);
        for (s, p) in self.allocated.iter_mut().zip(points) {
            s.timeline = p.points.build();
        }
        let points = core::mem::take(&mut self.series_points);
        for ((i, s), p) in self.series.iter_mut().enumerate().zip(points) {
            s.timeline = if self.solo_series == Some(i) {
                self.total.clone()
            } else {
                p.points.build()
            };
        }
        for st in core::mem::take(&mut self.stack_dense) {
            if st.alloc_count > 0 || st.free_count > 0 {
                self.stack_stats.insert(st.stack, st);
            }
        }
        self.thread_slots = HashMap::new();
        for (key, t) in core::mem::take(&mut self.thread_activity) {
            self.thread_last_ts.insert(key, t);
        }
        // Bytes, count and threads per stack live at the global peak.
        for p in &mut peak_stacks {
            p.threads.sort();
            let e = self.stack_stats.entry(p.stack).or_default();
            e.peak_bytes = e.peak_bytes.saturating_add(p.bytes);
        }
        peak_stacks.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.cmp(&b.stack)));
        self.peak_stacks = peak_stacks;
        if self.bad_free_count > 0 {
            w.push(Warning::BadFree {
                offset: self.bad_free_first_offset,
                count: self.bad_free_count,
            });
        }
        if self.dropped_events > 0 {
            w.push(Warning::DroppedEvents {
                count: self.dropped_events,
            });
        }
        if self.untracked_ranges > 0 {
            w.push(Warning::UntrackedRanges {
                count: self.untracked_ranges,
            });
        }
        for n in &self.notices {
            let pid = self
                .processes
                .iter()
                .find(|p| p.process == n.process)
                .map_or(0, |p| p.pid);
            w.push(Warning::CaptureIncomplete {
                pid,
                code: n.code,
                message: String::from(self.string(n.message)),
            });
        }
        if !self.clean_end {
            w.push(Warning::NoEndRecord);
        }
        w
    }

    /// Replays the live-bytes series, totals and peaks from `allocs` as they stand, then the
    /// figures of ranges and failed allocations that depend on them (for
    /// the tensor view of `layers`).
    pub(crate) fn replay_series(&mut self) {
        // The history is read while the series are rebuilt: out of `self` meanwhile.
        let allocs = core::mem::take(&mut self.allocs);
        let events = alloc_events(&allocs, |_, a| a.kind.is_tracked());
        self.series.clear();
        self.allocated.clear();
        for p in self
            .series_points
            .drain(..)
            .chain(self.allocated_points.drain(..))
        {
            self.table_bytes = self.table_bytes.saturating_sub(p.counted);
        }
        self.series_slots.clear();
        self.allocated_slots.clear();
        self.total = Timeline::new();
        self.total_points = TimelineBuilder::spilling(self.spill.clone());
        self.total_live_bytes = 0;
        self.peak_bytes = 0;
        self.peak_ts_nanos = 0;
        self.solo_series = None;
        self.device_series_count = 0;
        self.last_series = 0;
        self.procs.clear();
        self.proc_slots.clear();
        self.last_proc = 0;
        // Device live bytes per process over time, for the ranges.
        let mut per_process: Vec<(ProcessIdx, TimelineBuilder)> = Vec::new();
        for (t, is_free, i) in events {
            let a = allocs.at(i as usize);
            let key = SeriesKey {
                process: a.process,
                device: a.device,
                host: !a.kind.is_device_memory(),
            };
            self.apply(key, t, !is_free, a.size_bytes);
            // Only ranges read them.
            if !key.host && !self.ranges.is_empty() {
                let pi = self.proc_index(a.process);
                let live = self.procs[pi].live_bytes;
                match per_process.iter_mut().find(|p| p.0 == a.process) {
                    Some(p) => p.1.push(t, live),
                    None => {
                        let mut tl = TimelineBuilder::spilling(self.spill.clone());
                        tl.push(t, live);
                        per_process.push((a.process, tl));
                    }
                }
            }
        }
        self.allocs = allocs;
        let per_process: Vec<(ProcessIdx, Timeline)> = per_process
            .into_iter()
            .map(|(p, tl)| (p, tl.build()))
            .collect();
        for st in self.stack_stats.values_mut() {
            st.peak_bytes = 0;
        }
        self.finished = false;
        let _ = self.finish();
        let ranges = core::mem::take(&mut self.ranges);
        self.ranges = ranges
            .iter()
            .map(|mut r| {
                replay_range(&per_process, &mut r);
                r
            })
            .collect();
        self.ranges.pack_all();
        for f in &mut self.failed {
            let r = f.record;
            f.live_bytes = self
                .series
                .iter()
                .filter(|s| s.key.process == r.process && s.key.device == r.device && !s.key.host)
                .map(|s| s.timeline.value_at(r.ts_nanos))
                .sum();
        }
    }

    /// Device live bytes at the end of the trace.
    pub fn live_at_end_bytes(&self) -> u64 {
        self.total_live_bytes
    }

    /// Live allocations at time `t` (device and host), by index into `allocs`.
    pub fn live_at(&self, t: u64) -> impl Iterator<Item = AllocRecord> + '_ {
        self.allocs.live_at(t, self.allocs.len())
    }

    /// Frames of a stack, innermost first.
    pub fn stack_frames(&self, stack: StackId) -> Vec<FrameView> {
        let mut out = Vec::new();
        let mut cur = stack;
        while cur.0 != 0 && out.len() < MAX_STACK_DEPTH {
            let Some(node) = self.stacks.get(&cur) else {
                break;
            };
            out.push(self.frame_view(node.frame));
            if node.parent == cur {
                break;
            }
            cur = node.parent;
        }
        out
    }

    pub fn frame_view(&self, id: FrameId) -> FrameView {
        match self.frames.get(&id) {
            Some(FrameDef::Python {
                function,
                file,
                line,
                ..
            }) => FrameView {
                function: self.string(*function).into(),
                file: self.string(*file).into(),
                line: *line,
                python: true,
                ..FrameView::default()
            },
            Some(FrameDef::Native { module, offset, .. }) => {
                let mut v = FrameView {
                    module: self
                        .modules
                        .get(module)
                        .map(|m| m.path.clone())
                        .unwrap_or_default(),
                    offset: *offset,
                    ..FrameView::default()
                };
                if let Some(s) = self.symbols.get(&id) {
                    v.function = self.string(s.function).into();
                    v.file = self.string(s.file).into();
                    v.line = s.line;
                }
                v
            }
            None => FrameView::default(),
        }
    }

    /// A one-line label for a call site: the user's frame (the first frame outside libraries,
    /// see [`crate::attribution`]), or `"<no stack>"`.
    pub fn stack_label(&self, stack: StackId) -> String {
        self.stack_label_with(stack, &[])
    }

    /// [`Self::stack_label`] with extra frame patterns to skip (`Config::hide_frames`).
    pub fn stack_label_with(&self, stack: StackId, hide: &[String]) -> String {
        match self.user_frame(stack, hide) {
            Some(f) => alloc::format!("{f}"),
            None => String::from("<no stack>"),
        }
    }

    /// The frame that names the call site (see [`Self::stack_label`]).
    pub fn user_frame(&self, stack: StackId, hide: &[String]) -> Option<FrameView> {
        let mut frames = self.stack_frames(stack);
        let i = crate::attribution::user_frame_index(&frames, hide)?;
        Some(frames.swap_remove(i))
    }
}

/// Records written straight into the model replay as if they had been encoded and decoded:
/// allocations get the ids the encoder would give them (sequential from 0), and warnings carry
/// offset 0 (there are no bytes).
impl RecordSink for TraceModel {
    fn emit(&mut self, mut rec: Record) -> Option<AllocId> {
        let id = match &mut rec {
            Record::Alloc(a) => {
                a.id = AllocId(self.allocs.len() as u64);
                Some(a.id)
            }
            _ => None,
        };
        self.observe(rec, 0);
        id
    }
}

/// The outcome of loading a trace.
#[derive(Debug)]
pub struct LoadedTrace {
    pub model: TraceModel,
    pub warnings: Vec<Warning>,
    /// The error that stopped decoding early, if any; the model holds everything before it.
    pub fatal: Option<DecodeError>,
    /// Bytes read: of the trace, or of the PyTorch snapshot it was converted from.
    pub bytes: u64,
}

/// Decoder + model: push bytes, get a replayed trace.
#[derive(Debug, Default)]
pub struct Loader {
    decoder: Decoder,
    model: Option<TraceModel>,
    /// Set when the model went over its budget ([`DecodeError::TooDense`]).
    fatal: Option<DecodeError>,
    /// Given to the model when it is made ([`TraceModel::set_spill`]).
    spill: Option<Arc<dyn Spill>>,
}

/// Heap the model may take for a trace of `bytes` (FORMAT.md, "Robustness"): 16 times its
/// bytes plus 32 MiB. Collectors' traces take about 2.5 times (a few bytes per allocation, a
/// range or a sample tens of bytes for records of 10 to 20); only records built to be smaller
/// than anything a collector writes reach it.
pub const fn model_budget(bytes: u64) -> u64 {
    bytes.saturating_mul(16).saturating_add(32 << 20)
}

/// [`DecodeError::TooDense`] when `model`, after `consumed` bytes, holds more than its budget:
/// checked every [`BUDGET_CHECK_RECORDS`] records.
#[inline]
pub(crate) fn over_budget(model: &TraceModel, consumed: u64) -> Option<DecodeError> {
    if !model.records.is_multiple_of(BUDGET_CHECK_RECORDS) {
        return None;
    }
    let used = model.heap_estimate();
    (used > model_budget(consumed)).then(|| DecodeError::TooDense {
        offset: consumed,
        model_bytes: used,
        limit_bytes: model_budget(consumed),
    })
}

/// Records between two checks of the model's heap against its budget.
const BUDGET_CHECK_RECORDS: u64 = 1024;

impl Loader {
    pub fn new() -> Self {
        Self::default()
    }

    /// A loader whose model sends its history's full chunks to `spill`
    /// ([`TraceModel::set_spill`]).
    pub fn with_spill(spill: Arc<dyn Spill>) -> Self {
        Self {
            spill: Some(spill),
            ..Self::default()
        }
    }

    fn new_model(&self, h: Header) -> TraceModel {
        Self::model_for(h, self.spill.as_ref())
    }

    /// The model for a trace with header `h`, sending its full chunks to `spill`.
    pub(crate) fn model_for(h: Header, spill: Option<&Arc<dyn Spill>>) -> TraceModel {
        let mut m = TraceModel::new(h);
        if let Some(s) = spill {
            m.set_spill(s.clone());
        }
        m
    }

    /// Pushes bytes and replays every complete record. Returns the error that stopped decoding,
    /// if it stopped (the same error is reported by `finish`).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        self.decoder.push(bytes);
        loop {
            // Allocs, frees and ranges first, without moving a whole `Record` each.
            if let Some(model) = self.model.as_mut() {
                let mut over = None;
                self.decoder.hot_records(
                    #[inline(always)]
                    |rec, offset, end| {
                        model.observe_hot(&rec, offset);
                        over = over_budget(model, end);
                        over.is_none()
                    },
                );
                if let Some(e) = over {
                    self.fatal = Some(e.clone());
                    return Err(e);
                }
            }
            let offset = self.decoder.bytes_consumed();
            match self.decoder.next_record() {
                Ok(Some(rec)) => {
                    if self.model.is_none() {
                        let h = self.decoder.header().cloned().unwrap_or_default();
                        self.model = Some(self.new_model(h));
                    }
                    if let Some(model) = self.model.as_mut() {
                        model.observe(rec, offset);
                        self.check_budget()?;
                    }
                }
                Ok(None) => {
                    if self.model.is_none()
                        && let Some(h) = self.decoder.header()
                    {
                        self.model = Some(self.new_model(h.clone()));
                    }
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every [`BUDGET_CHECK_RECORDS`] records, stops with [`DecodeError::TooDense`] when the
    /// model holds more than its budget for the bytes read.
    #[inline]
    fn check_budget(&mut self) -> Result<(), DecodeError> {
        let Some(model) = self.model.as_ref() else {
            return Ok(());
        };
        match over_budget(model, self.decoder.bytes_consumed()) {
            Some(e) => {
                self.fatal = Some(e.clone());
                Err(e)
            }
            None => Ok(()),
        }
    }

    pub fn bytes_consumed(&self) -> u64 {
        self.decoder.bytes_consumed()
    }

    /// The decoder's measure of work ([`Decoder::bytes_examined`]).
    pub fn bytes_examined(&self) -> u64 {
        self.decoder.bytes_examined()
    }

    pub fn records_decoded(&self) -> u64 {
        self.decoder.records_decoded()
    }

    /// The model's heap so far, less what its spill holds
    /// ([`TraceModel::resident_heap_estimate`]; 0 before the header): what a caller that holds
    /// models within a memory budget of its own checks between pushes.
    pub fn model_heap_bytes(&self) -> u64 {
        self.model
            .as_ref()
            .map_or(0, TraceModel::resident_heap_estimate)
    }

    pub fn header(&self) -> Option<&Header> {
        self.decoder.header()
    }

    /// Ends the input. Fails only when not even the header could be read.
    pub fn finish(mut self) -> Result<LoadedTrace, DecodeError> {
        let warnings = self.decoder.finish()?;
        let bytes = self.decoder.bytes_consumed();
        let fatal = self.fatal.or_else(|| self.decoder.fatal().cloned());
        Ok(finish_load(
            self.model,
            &self.decoder,
            warnings,
            fatal,
            bytes,
            &Sequential,
        ))
    }
}

/// Bytes, count and threads (the first [`PEAK_STACK_THREADS`] met, unsorted) per stack of the
/// device allocations with ids `from..to` live at `t`, in the order their stacks are first met.
fn peak_stacks_at(allocs: &AllocStore, t: u64, from: usize, to: usize) -> Vec<PeakStack> {
    let mut out: Vec<PeakStack> = Vec::new();
    let fields = Fields::KIND | Fields::STACK | Fields::SIZE | Fields::THREAD;
    let mut slots: HashMap<StackId, usize> = HashMap::new();
    for a in allocs.live_at_range_fields(t, from, to, fields) {
        if a.kind.is_device_memory() {
            let i = *slots.entry(a.stack).or_insert_with(|| {
                out.push(PeakStack {
                    stack: a.stack,
                    ..PeakStack::default()
                });
                out.len() - 1
            });
            let p = &mut out[i];
            p.bytes = p.bytes.saturating_add(a.size_bytes);
            p.count += 1;
            if p.threads.len() < PEAK_STACK_THREADS && !p.threads.contains(&a.thread) {
                p.threads.push(a.thread);
            }
        }
    }
    out
}

/// Adds `later` ([`peak_stacks_at`] of the ids after those of `first`) to `first`: what one
/// call over both ranges gives. Stacks new in `later` follow in their order; a stack's threads
/// are its first ones in `first`, then those of `later` not among them, up to
/// [`PEAK_STACK_THREADS`] (`later` holds the first it met, enough to fill what `first` left).
fn merge_peak_stacks(first: &mut Vec<PeakStack>, later: Vec<PeakStack>) {
    let mut slots: HashMap<StackId, usize> = first
        .iter()
        .enumerate()
        .map(|(i, p)| (p.stack, i))
        .collect();
    for q in later {
        let Some(&i) = slots.get(&q.stack) else {
            slots.insert(q.stack, first.len());
            first.push(q);
            continue;
        };
        let p = &mut first[i];
        p.bytes = p.bytes.saturating_add(q.bytes);
        p.count += q.count;
        for th in q.threads {
            if p.threads.len() < PEAK_STACK_THREADS && !p.threads.contains(&th) {
                p.threads.push(th);
            }
        }
    }
}

/// The end of a load, fused ([`Loader::finish`]) or split
/// ([`crate::split_load::LoadReplay::finish_with`]): finishes the model (one with the decoder's
/// header, or the default, when no record made one) and gathers the warnings.
pub(crate) fn finish_load(
    model: Option<TraceModel>,
    decoder: &Decoder,
    mut warnings: Vec<Warning>,
    fatal: Option<DecodeError>,
    bytes: u64,
    join: &impl Join,
) -> LoadedTrace {
    let mut model =
        model.unwrap_or_else(|| TraceModel::new(decoder.header().cloned().unwrap_or_default()));
    // Model warnings are one per kind except notices, which are one per record: capped too.
    let mut model_warnings = WarningLog::new();
    model_warnings.extend(model.finish_with(join));
    warnings.extend(model_warnings.into_vec());
    LoadedTrace {
        model,
        warnings,
        fatal,
        bytes,
    }
}

/// A range's live bytes before, after and at its peak, from its process's device live bytes
/// over time (`replay_series`); zeros for a process with none.
fn replay_range(per_process: &[(ProcessIdx, Timeline)], r: &mut RangeInstance) {
    let Some((_, tl)) = per_process.iter().find(|p| p.0 == r.process) else {
        r.live_before_bytes = 0;
        r.live_after_bytes = 0;
        r.peak_bytes = 0;
        return;
    };
    let end = r.end_ts_nanos.unwrap_or(u64::MAX);
    r.live_before_bytes = tl.value_at(r.begin_ts_nanos);
    r.live_after_bytes = tl.value_at(end);
    let from = tl.partition_point(|x| x <= r.begin_ts_nanos);
    let to = tl.partition_point(|x| x <= end);
    r.peak_bytes = tl
        .points_from(from)
        .take(to.saturating_sub(from))
        .map(|p| p.1)
        .fold(r.live_before_bytes, u64::max);
}

/// Chunk size `load` feeds the decoder with.
const LOAD_CHUNK_BYTES: usize = 256 * 1024;

/// Loads a whole in-memory trace.
pub fn load(bytes: &[u8]) -> Result<LoadedTrace, DecodeError> {
    let mut l = Loader::new();
    // Push in chunks so the decoder's buffer stays small. A stopping error is kept in the
    // decoder and reported through `LoadedTrace::fatal`.
    for chunk in bytes.chunks(LOAD_CHUNK_BYTES) {
        if l.push(chunk).is_err() {
            break;
        }
    }
    l.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Scenario, generate};
    use alloc::format;
    use alloc::string::String;
    use proptest::prelude::*;

    proptest! {
        /// What is live at a moment, grouped by stack from two ranges of ids and merged, is what
        /// one pass over all of them gives: stacks in the order first met, bytes (saturating),
        /// counts, and each stack's first threads, with more threads than a stack keeps.
        #[test]
        fn peak_stacks_merged_from_two_halves_are_one_pass(
            allocs in proptest::collection::vec(
                (0u32..6, 0u32..40, 0u64..4, any::<bool>(), any::<bool>()),
                0..900,
            ),
            huge in any::<bool>(),
            split in any::<proptest::sample::Index>(),
        ) {
            let store: AllocStore = allocs
                .iter()
                .enumerate()
                .map(|(i, &(stack, thread, size, freed, host))| AllocRecord {
                    ts_nanos: i as u64,
                    free_ts_nanos: if freed { i as u64 + 2 } else { LIVE },
                    size_bytes: if huge { u64::MAX / 3 + size } else { size << 20 },
                    address: i as u64 * 4096,
                    stack: StackId(stack),
                    thread: ThreadIdx(thread),
                    device: DeviceIdx(0),
                    process: ProcessIdx(0),
                    range_slot: 0,
                    kind: if host { AllocKind::PinnedHost } else { AllocKind::Device },
                    free_kind: FreeKind::Immediate,
                })
                .collect();
            let (n, t) = (store.len(), allocs.len() as u64 / 2);
            let whole = peak_stacks_at(&store, t, 0, n);
            let mid = split.index(n + 1);
            let mut first = peak_stacks_at(&store, t, 0, mid);
            merge_peak_stacks(&mut first, peak_stacks_at(&store, t, mid, n));
            prop_assert_eq!(format!("{first:?}"), format!("{whole:?}"));
        }
    }

    proptest! {
        /// The events merged or reordered as they go are the events sorted: in a history in
        /// order (times that tie often, frees at their allocation's time or later, or never),
        /// in one whose times step back (by up to `lag`, as two processes' records interleave),
        /// read in chunks of any size, and in a damaged one (a free before its allocation).
        #[test]
        fn merged_events_are_the_sorted_events(
            steps in proptest::collection::vec(
                (0u64..3, 0u64..6, any::<bool>(), any::<bool>(), 0u64..4), 0..300),
            damage in any::<bool>(),
            lag in prop_oneof![Just(0u64), 1u64..40],
            chunk in prop_oneof![Just(crate::reorder::CHUNK), 1usize..20],
        ) {
            let mut ts = 0u64;
            let store: AllocStore = steps
                .iter()
                .enumerate()
                .map(|(i, &(gap, life, freed, kind, back))| {
                    ts += gap;
                    // A quarter of the allocations are behind by up to `lag`.
                    let at = if back == 0 { ts.saturating_sub(lag * (i as u64 % 7) / 6) } else { ts };
                    let at = if damage && i == steps.len() / 2 { at.saturating_sub(5) } else { at };
                    AllocRecord {
                        ts_nanos: at,
                        free_ts_nanos: match (freed, damage && i == steps.len() / 2) {
                            (false, _) => LIVE,
                            (true, false) => at + life,
                            // Freed before it was allocated.
                            (true, true) => at.saturating_sub(1 + life),
                        },
                        size_bytes: 1,
                        address: 0,
                        stack: StackId(0),
                        thread: ThreadIdx(0),
                        device: DeviceIdx(0),
                        process: ProcessIdx(0),
                        range_slot: 0,
                        kind: if kind { AllocKind::Device } else { AllocKind::PinnedHost },
                        free_kind: FreeKind::Immediate,
                    }
                })
                .collect();
            let keep = |i: usize, a: &AllocRecord| i % 5 != 3 && a.kind == AllocKind::Device;
            let want = sorted_events(&store, keep);
            let events = alloc_events_in(&store, keep, chunk);
            let reordered = matches!(events, AllocEvents::Reordered { .. });
            let got: Vec<(u64, bool, u32)> = events.collect();
            prop_assert_eq!(got, want);
            // Reordered exactly where times step back and no free precedes its allocation.
            let back = (1..store.len()).any(|i| store.ts(i) < store.ts(i - 1));
            let early = (0..store.len()).any(|i| !store.is_live(i) && store.free_ts(i) < store.ts(i));
            prop_assert_eq!(reordered, back && !early);
        }
    }

    proptest! {
        /// Each range's allocations (counted per thread, settled by difference at its end)
        /// equal those counted into every open range of the thread at each allocation, and
        /// each allocation's range is the thread's innermost open one: with nesting, ranges
        /// that interleave, an id begun twice (the first instance stays open to the end), an
        /// end without a begin, and sizes that saturate.
        #[test]
        fn range_allocations_match_a_direct_count(
            steps in proptest::collection::vec((0u8..4, 0u32..3, 0u64..4), 0..200),
        ) {
            let mut m = TraceModel::new(Header::default());
            // The reference: every open range of the thread counts each allocation.
            let mut open: HashMap<u64, u32> = HashMap::new();
            let mut stacks: HashMap<u32, Vec<u32>> = HashMap::new();
            let mut counts: Vec<(u64, u64)> = Vec::new();
            let mut slots: Vec<u32> = Vec::new();
            for (i, &(op, thread, x)) in steps.iter().enumerate() {
                let ts_nanos = i as u64;
                match op {
                    0 => {
                        m.observe(Record::RangeBegin(RangeBegin {
                            ts_nanos,
                            range: RangeId(x),
                            name: StringId(0),
                            domain: StringId(0),
                            thread: ThreadIdx(thread),
                            process: ProcessIdx(0),
                        }), 0);
                        counts.push((0, 0));
                        let slot = counts.len() as u32;
                        open.insert(x, slot);
                        stacks.entry(thread).or_default().push(slot);
                    }
                    1 => {
                        m.observe(Record::RangeEnd(RangeEnd { ts_nanos, range: RangeId(x) }), 0);
                        if let Some(slot) = open.remove(&x) {
                            for st in stacks.values_mut() {
                                st.retain(|&s| s != slot);
                            }
                        }
                    }
                    _ => {
                        let size_bytes = if x == 3 { u64::MAX / 2 } else { x * 100 };
                        m.observe(Record::Alloc(Alloc {
                            ts_nanos,
                            id: AllocId(slots.len() as u64),
                            size_bytes,
                            address: 4096 * (i as u64 + 1),
                            thread: ThreadIdx(thread),
                            ..Alloc::default()
                        }), 0);
                        let mut top = 0;
                        if !open.is_empty() {
                            for &s in stacks.get(&thread).map_or(&[][..], |v| &v[..]) {
                                let c = &mut counts[s as usize - 1];
                                c.0 += 1;
                                c.1 = c.1.saturating_add(size_bytes);
                                top = s;
                            }
                        }
                        slots.push(top);
                    }
                }
            }
            m.finish();
            let got: Vec<(u64, u64)> = m.ranges.iter().map(|r| (r.alloc_count, r.alloc_bytes)).collect();
            prop_assert_eq!(got, counts);
            let got_slots: Vec<u32> = m.allocs.iter().map(|a| a.range_slot).collect();
            prop_assert_eq!(got_slots, slots);
        }
    }

    proptest! {
        /// A context reset releases exactly the allocations of its process and device live at
        /// that moment, whether it is the first (the lists are made then from the history) or
        /// a later one (the lists kept since), with allocations freed before, between and
        /// after, and enough of them that the lists are compacted.
        #[test]
        fn context_resets_release_what_is_live_on_their_device(
            steps in proptest::collection::vec((0u16..400, 0u32..1, 0u32..2, 0u64..1000), 0..3000),
        ) {
            let mut m = TraceModel::new(Header::default());
            // The reference: what is live, by id.
            let mut live: Vec<Option<(u32, u32, u64)>> = Vec::new();
            let mut want: Vec<(u64, u64)> = Vec::new();
            for (i, &(op, process, device, x)) in steps.iter().enumerate() {
                let ts_nanos = i as u64;
                match op {
                    0 => {
                        m.observe(Record::ContextReset(ContextReset {
                            ts_nanos,
                            process: ProcessIdx(process),
                            device: DeviceIdx(device),
                            thread: ThreadIdx(0),
                        }), 0);
                        let (mut count, mut bytes) = (0, 0);
                        for l in live.iter_mut() {
                            if let Some((p, d, size)) = *l
                                && p == process
                                && d == device
                            {
                                count += 1;
                                bytes += size;
                                *l = None;
                            }
                        }
                        // A reset with nothing live on its device releases nothing.
                        want.push((count, bytes));
                    }
                    1..=220 if live.iter().any(|l| l.is_some_and(|l| l.2 % 8 != 1)) => {
                        // A live one: most of what is listed is freed, so lists are compacted;
                        // one in eight lives until a reset.
                        let ids: Vec<usize> = (0..live.len())
                            .filter(|&k| live[k].is_some_and(|l| l.2 % 8 != 1))
                            .collect();
                        let id = ids[x as usize % ids.len()];
                        m.observe(Record::Free(Free {
                            ts_nanos,
                            alloc: AllocId(id as u64),
                            ..Free::default()
                        }), 0);
                        live[id] = None;
                    }
                    _ => {
                        m.observe(Record::Alloc(Alloc {
                            ts_nanos,
                            id: AllocId(live.len() as u64),
                            size_bytes: x + 1,
                            address: 4096 * (i as u64 + 1),
                            process: ProcessIdx(process),
                            device: DeviceIdx(device),
                            ..Alloc::default()
                        }), 0);
                        live.push(Some((process, device, x + 1)));
                    }
                }
            }
            m.finish();
            let got: Vec<(u64, u64)> = m.resets.iter().map(|r| (r.freed_count, r.freed_bytes)).collect();
            prop_assert_eq!(got, want);
            let live_now: Vec<bool> = m.allocs.iter().map(|a| a.is_live()).collect();
            let want_live: Vec<bool> = live.iter().map(Option::is_some).collect();
            prop_assert_eq!(live_now, want_live);
        }
    }

    /// What a load gives, for comparing loads: the history, the total's points, the ranges,
    /// the warnings and the bytes read.
    fn fingerprint(t: &LoadedTrace) -> String {
        let m = &t.model;
        let allocs: Vec<String> = m.allocs.iter().map(|a| format!("{a:?}")).collect();
        let points: Vec<(u64, u64)> = m.total.points().collect();
        format!(
            "{allocs:?} {points:?} {:?} {:?} {:?} {} {} {}",
            m.ranges, t.warnings, t.fatal, t.bytes, m.records, m.bad_free_count
        )
    }

    /// Pushing the bytes in pieces of any size gives the model one push gives: records cut
    /// off between pushes, pieces shorter than a record, and a trace damaged in the middle.
    #[test]
    fn pushes_of_any_size_load_the_same() {
        let (mut bytes, _) = generate(Scenario::NvtxLeak, 20_000, 4);
        let whole = |bytes: &[u8]| {
            let mut l = Loader::new();
            let _ = l.push(bytes);
            fingerprint(&l.finish().expect("loads"))
        };
        let pieces = |bytes: &[u8], size: usize| {
            let mut l = Loader::new();
            for c in bytes.chunks(size) {
                if l.push(c).is_err() {
                    break;
                }
            }
            fingerprint(&l.finish().expect("loads"))
        };
        let want = whole(&bytes);
        for size in [1, 2, 3, 7, 100, 255, 256, 257, 300, 513, 4096, 65_536] {
            assert_eq!(pieces(&bytes, size), want, "pieces of {size}");
        }
        let at = bytes.len() / 2;
        bytes[at..at + 40].fill(0xc1);
        let damaged = whole(&bytes);
        assert_ne!(damaged, want);
        for size in [3, 257, 4096] {
            assert_eq!(pieces(&bytes, size), damaged, "damaged, pieces of {size}");
        }
    }

    /// Every series' timeline and the total agree with a brute-force recount from the
    /// allocations, whether the trace has one device series (points shared with the total) or
    /// several; range peaks are at least the live bytes at begin and end.
    #[test]
    fn timelines_match_a_recount_from_the_allocations() {
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 3_000, 11);
            let m = load(&bytes).expect("loads").model;
            let live_at = |t: u64, key: Option<SeriesKey>| -> u64 {
                m.allocs
                    .iter()
                    .filter(|a| a.size_bytes > 0 && a.kind.is_tracked() && a.live_at(t))
                    .filter(|a| {
                        let k = SeriesKey {
                            process: a.process,
                            device: a.device,
                            host: !a.kind.is_device_memory(),
                        };
                        match key {
                            Some(key) => k == key,
                            None => !k.host,
                        }
                    })
                    .map(|a| a.size_bytes)
                    .sum()
            };
            // The value at every allocation and free instant (the end-of-instant state).
            let instants: Vec<u64> = m
                .allocs
                .iter()
                .flat_map(|a| [a.ts_nanos, a.free_ts_nanos])
                .filter(|&t| t != LIVE)
                .step_by(3)
                .collect();
            let check = |tl: &Timeline, key: Option<SeriesKey>| {
                for &t in &instants {
                    assert_eq!(tl.value_at(t), live_at(t, key), "{s:?} {key:?} at {t}");
                }
            };
            check(&m.total, None);
            for series in &m.series {
                assert!(!series.timeline.is_empty() || series.live_count == 0);
                check(&series.timeline, Some(series.key));
                assert_eq!(series.timeline.last_value().unwrap_or(0), series.live_bytes);
            }
            for r in &m.ranges {
                assert!(
                    r.peak_bytes >= r.live_before_bytes.max(r.live_after_bytes),
                    "{s:?}"
                );
            }
        }
    }
}
