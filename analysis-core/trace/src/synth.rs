//! Synthetic traces with known ground truth, used by tests, benchmarks and the viewer's demo.
//!
//! Each scenario writes a real format-v1 trace through [`Encoder`] while keeping its own,
//! independent account of live bytes, so the model can be checked against it. Everything is
//! deterministic for a given seed.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use serde::Serialize;

use crate::encode::Encoder;
use crate::format::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The synthetic workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// A training loop that leaks a fixed size every step (a loss kept alive).
    TrainingLeak,
    /// A training loop with a cache that grows, then plateaus (not a leak).
    CachePlateau,
    /// A steady loop with a few large transient allocations.
    Spikes,
    /// Many short-lived small allocations.
    ShortLived,
    /// Four threads on two devices; one thread exits without freeing.
    MultiDevice,
    /// Stream-ordered allocations and frees through a memory pool.
    StreamOrdered,
    /// Allocations left live, then released by a context reset (not a leak).
    ContextReset,
    /// Growth until an allocation fails with out-of-memory.
    Oom,
    /// A training loop that frees everything: no findings expected.
    Clean,
    /// A training loop whose batch buffer is not freed when a step raises (exception path).
    ExceptionLeak,
    /// A pool with planted reserved vs allocated samples and an allocation that fails because
    /// no free block is large enough (fragmentation).
    Fragmented,
    /// Flat traced memory while untraced device memory (library workspaces) keeps growing.
    HiddenGrowth,
    /// Nested NVTX ranges: each `epoch` runs clean `train_step`s, then a `validate` that keeps
    /// its predictions (8 MiB per call).
    NvtxLeak,
    /// A CUDA C++ service that allocates per request, in sizes of no round number, and frees
    /// every request's buffers when it completes: no findings expected.
    Requests,
}

impl Scenario {
    pub const ALL: [Scenario; 14] = [
        Self::TrainingLeak,
        Self::CachePlateau,
        Self::Spikes,
        Self::ShortLived,
        Self::MultiDevice,
        Self::StreamOrdered,
        Self::ContextReset,
        Self::Oom,
        Self::Clean,
        Self::ExceptionLeak,
        Self::Fragmented,
        Self::HiddenGrowth,
        Self::NvtxLeak,
        Self::Requests,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::TrainingLeak => "training-leak",
            Self::CachePlateau => "cache-plateau",
            Self::Spikes => "spikes",
            Self::ShortLived => "short-lived",
            Self::MultiDevice => "multi-device",
            Self::StreamOrdered => "stream-ordered",
            Self::ContextReset => "context-reset",
            Self::Oom => "oom",
            Self::Clean => "clean",
            Self::ExceptionLeak => "exception-leak",
            Self::Fragmented => "fragmented",
            Self::HiddenGrowth => "hidden-growth",
            Self::NvtxLeak => "nvtx-leak",
            Self::Requests => "requests",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }

    pub const fn description(self) -> &'static str {
        match self {
            Self::TrainingLeak => "training loop leaking 4 MiB per step (losses kept in a list)",
            Self::CachePlateau => "training loop whose cache grows to 512 MiB, then plateaus",
            Self::Spikes => "steady loop with 2 GiB transient spikes every 25 steps",
            Self::ShortLived => "many short-lived small allocations",
            Self::MultiDevice => "4 threads on 2 devices; one thread exits without freeing",
            Self::StreamOrdered => "stream-ordered allocations and frees through a pool",
            Self::ContextReset => "allocations released by a context reset",
            Self::Oom => "growth until cuMemAlloc fails with out-of-memory",
            Self::Clean => "training loop that frees everything",
            Self::ExceptionLeak => {
                "training loop leaking its 8 MiB batch on every 7th step (exception path)"
            }
            Self::Fragmented => {
                "pool 50-75 % unallocated; a 128 MiB request fails with 192 MiB free in 64 MiB holes"
            }
            Self::HiddenGrowth => {
                "flat traced memory; untraced device memory grows by 256 MiB per sample"
            }
            Self::NvtxLeak => "nested NVTX ranges; `validate` keeps 8 MiB of predictions per call",
            Self::Requests => {
                "service allocating per request in sizes of no round number; frees everything"
            }
        }
    }
}

/// A leak the generator planted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlantedLeak {
    /// Function name of the innermost frame of the leaking call site.
    pub function: String,
    pub bytes: u64,
    pub count: u64,
    pub thread: ThreadIdx,
}

/// A spike the generator planted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlantedSpike {
    pub ts_nanos: u64,
    pub bytes: u64,
    pub function: String,
}

/// Fragmentation the generator planted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlantedFragmentation {
    /// (reserved, allocated) bytes of each pool sample, in order.
    pub pool_samples: Vec<(u64, u64)>,
    /// At the failed allocation: free bytes between live blocks, and the largest free block.
    pub free_inside_span_bytes: u64,
    pub largest_free_bytes: u64,
    pub failed_request_bytes: u64,
}

/// What the generator knows to be true about the trace it wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroundTruth {
    pub scenario: String,
    pub peak_bytes: u64,
    pub live_at_end_bytes: u64,
    pub alloc_count: u64,
    pub free_count: u64,
    pub failed_count: u64,
    pub teardown_freed_bytes: u64,
    pub leaks: Vec<PlantedLeak>,
    pub spikes: Vec<PlantedSpike>,
    /// Function names of call sites that grow but plateau (must not be reported as leaks).
    pub bounded: Vec<String>,
    pub fragmentation: Option<PlantedFragmentation>,
    /// Untraced device memory grows steadily (device samples).
    pub hidden_drift: bool,
    /// NVTX range names whose calls leak (enclosing ranges grow only because of them).
    pub leaky_scopes: Vec<String>,
    /// Steps (NVTX `train_step` instances) written.
    pub steps: u64,
    /// Records written (header excluded).
    pub records: u64,
}

/// xorshift64*: small, fast, deterministic.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

#[derive(Clone, Copy, Debug)]
struct Live {
    id: AllocId,
    size: u64,
    kind: AllocKind,
}

/// Writes records and keeps the independent ground-truth account.
struct Writer {
    enc: Encoder,
    rng: Rng,
    now: u64,
    next_string: u32,
    next_frame: u32,
    next_stack: u32,
    next_range: u64,
    next_addr: [u64; 4],
    live_total: u64,
    truth: GroundTruth,
    /// Live allocations by id (for frees and resets).
    live: Vec<Option<Live>>,
}

impl Writer {
    fn new(scenario: Scenario, seed: u64) -> Self {
        let mut h = Encoder::header_v1();
        h.collector = "gpucollect-synth 1".into();
        h.host = "synthetic".into();
        h.argv = vec!["python".into(), "train.py".into(), scenario.name().into()];
        h.start_mono_nanos = 1_000_000_000;
        h.wall_offset_nanos = 1_767_225_600_000_000_000;
        let mut w = Self {
            enc: Encoder::new(&h),
            rng: Rng(seed | 1),
            now: 0,
            next_string: 1,
            next_frame: 1,
            next_stack: 1,
            next_range: 1,
            next_addr: [
                0x7f00_0000_0000,
                0x7e00_0000_0000,
                0x7d00_0000_0000,
                0x7c00_0000_0000,
            ],
            live_total: 0,
            truth: GroundTruth {
                scenario: scenario.name().into(),
                ..GroundTruth::default()
            },
            live: Vec::new(),
        };
        w.rec(Record::Process(ProcessInfo {
            process: ProcessIdx(0),
            pid: 4242,
            parent: None,
            exe: "/usr/bin/python3".into(),
            argv: vec!["python".into(), "train.py".into()],
        }));
        w.rec(Record::Device(DeviceInfo {
            device: DeviceIdx(0),
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            name: "Synthetic GPU 80GB".into(),
            total_bytes: 80 * GIB,
        }));
        let main = w.string("MainThread");
        w.rec(Record::Thread(ThreadInfo {
            thread: ThreadIdx(0),
            process: ProcessIdx(0),
            os_tid: 4242,
            name: main,
        }));
        w
    }

    fn rec(&mut self, r: Record) {
        self.truth.records += 1;
        self.enc.record(&r);
    }

    fn string(&mut self, s: &str) -> StringId {
        let id = StringId(self.next_string);
        self.next_string += 1;
        self.rec(Record::String {
            id,
            value: s.into(),
        });
        id
    }

    /// Defines a Python stack (outermost first) and returns the innermost stack id.
    fn stack(&mut self, frames: &[(&str, &str, u32)]) -> StackId {
        let mut parent = StackId(0);
        for &(func, file, line) in frames {
            let f = self.string(func);
            let fl = self.string(file);
            let frame = FrameId(self.next_frame);
            self.next_frame += 1;
            self.rec(Record::Frame(FrameDef::Python {
                id: frame,
                function: f,
                file: fl,
                line,
            }));
            let id = StackId(self.next_stack);
            self.next_stack += 1;
            self.rec(Record::Stack(StackDef {
                stack: id,
                parent,
                frame,
            }));
            parent = id;
        }
        parent
    }

    fn tick(&mut self, min: u64, max: u64) {
        self.now += min + self.rng.below(max - min + 1);
    }

    #[allow(clippy::too_many_arguments)]
    fn alloc_full(
        &mut self,
        size: u64,
        stack: StackId,
        thread: ThreadIdx,
        device: DeviceIdx,
        kind: AllocKind,
        stream: u64,
        process: ProcessIdx,
    ) -> AllocId {
        self.tick(2_000, 40_000);
        let d = (device.0 as usize).min(3);
        let address = self.next_addr[d];
        // A bump allocator with 512-byte granularity that wraps within 64 GiB.
        self.next_addr[d] = address + size.div_ceil(512) * 512;
        if self.next_addr[d] > 0x7000_0000_0000 + (u64::from(device.0) << 40) + 64 * GIB {
            self.next_addr[d] = 0x7000_0000_0000 + (u64::from(device.0) << 40);
        }
        let id = self.enc.alloc(&Alloc {
            ts_nanos: self.now,
            size_bytes: size,
            address,
            stack,
            thread,
            device,
            kind,
            stream,
            process,
            ..Alloc::default()
        });
        self.truth.records += 1;
        self.truth.alloc_count += 1;
        if kind.is_device_memory() {
            self.live_total += size;
            self.truth.peak_bytes = self.truth.peak_bytes.max(self.live_total);
        }
        if self.live.len() <= id.0 as usize {
            self.live.resize(id.0 as usize + 1, None);
        }
        self.live[id.0 as usize] = Some(Live { id, size, kind });
        id
    }

    fn alloc(&mut self, size: u64, stack: StackId) -> AllocId {
        self.alloc_full(
            size,
            stack,
            ThreadIdx(0),
            DeviceIdx(0),
            AllocKind::Device,
            0,
            ProcessIdx(0),
        )
    }

    fn free_full(&mut self, id: AllocId, thread: ThreadIdx, kind: FreeKind, stream: u64) {
        self.tick(1_000, 20_000);
        let Some(Some(l)) = self.live.get(id.0 as usize).copied() else {
            return;
        };
        self.live[id.0 as usize] = None;
        if l.kind.is_device_memory() {
            self.live_total -= l.size;
        }
        self.truth.free_count += 1;
        self.rec(Record::Free(Free {
            ts_nanos: self.now,
            alloc: l.id,
            thread,
            kind,
            stream,
        }));
    }

    fn free(&mut self, id: AllocId) {
        self.free_full(id, ThreadIdx(0), FreeKind::Immediate, 0);
    }

    fn range_begin(&mut self, name: StringId) -> RangeId {
        self.tick(500, 2_000);
        let range = RangeId(self.next_range);
        self.next_range += 1;
        self.rec(Record::RangeBegin(RangeBegin {
            ts_nanos: self.now,
            range,
            name,
            domain: StringId(0),
            thread: ThreadIdx(0),
            process: ProcessIdx(0),
        }));
        range
    }

    fn range_end(&mut self, range: RangeId) {
        self.tick(500, 2_000);
        self.rec(Record::RangeEnd(RangeEnd {
            ts_nanos: self.now,
            range,
        }));
    }

    fn samples(&mut self, device: DeviceIdx, reserved: u64) {
        self.device_sample(device);
        self.rec(Record::PoolSample(PoolSample {
            ts_nanos: self.now,
            device,
            pool: 0,
            reserved_bytes: reserved.max(self.live_total),
            used_bytes: self.live_total,
            process: ProcessIdx(0),
        }));
    }

    /// What NVML would say of the device: our live bytes and the context's 512 MiB in use.
    fn device_sample(&mut self, device: DeviceIdx) {
        self.tick(100, 1_000);
        let used = self.live_total + 512 * MIB;
        self.rec(Record::DeviceSample(DeviceSample {
            ts_nanos: self.now,
            device,
            total_bytes: 80 * GIB,
            free_bytes: (80 * GIB).saturating_sub(used),
            used_bytes: used,
            processes: vec![ProcessUsage {
                pid: 4242,
                used_bytes: used,
            }],
        }));
    }

    fn finish(mut self) -> (Vec<u8>, GroundTruth) {
        self.tick(1_000, 1_000);
        self.rec(Record::ProcessExit(ProcessExit {
            ts_nanos: self.now,
            process: ProcessIdx(0),
            code: Some(0),
            signal: None,
        }));
        self.rec(Record::End { ts_nanos: self.now });
        self.truth.live_at_end_bytes = self.live_total;
        (self.enc.into_bytes(), self.truth)
    }

    /// Alloc + free count written so far.
    fn events(&self) -> u64 {
        self.truth.alloc_count + self.truth.free_count
    }
}

/// `trace` (a synthetic trace, well formed) with one allocation in `every` (the
/// `every / 3`-th, counted from 1, and every `every`-th after it) made `by` nanoseconds earlier, as the records of threads or processes reach the collector's
/// ring out of order: allocation times that step back. The scenarios are written in order;
/// this gives any of them out of order, for tests and benchmarks of the passes that read the
/// history in time order.
pub fn with_allocations_out_of_order(trace: &[u8], every: usize, by: u64) -> Vec<u8> {
    let every = every.max(1);
    let mut d = crate::decode::Decoder::new();
    d.push(trace);
    let mut e: Option<Encoder> = None;
    let mut n = 0usize;
    while let Ok(Some(mut r)) = d.next_record() {
        let Some(header) = d.header() else {
            return Vec::new();
        };
        let e = e.get_or_insert_with(|| Encoder::new(header));
        if let Record::Alloc(a) = &mut r {
            n += 1;
            if n % every == every / 3 {
                a.ts_nanos = a.ts_nanos.saturating_sub(by);
            }
        }
        e.record(&r);
    }
    e.map(Encoder::into_bytes).unwrap_or_default()
}

/// `trace` (a synthetic trace, well formed) as framework capture records it (FORMAT.md, "Two
/// layers"): every device allocation a framework block, all inside one driver allocation made
/// first (the ids after it shift by one). The scenarios have no framework-capture variant; this
/// gives one of any of them, for benchmarks and tests of the framework layer's view.
pub fn as_framework_capture(trace: &[u8]) -> Vec<u8> {
    let mut d = crate::decode::Decoder::new();
    d.push(trace);
    let mut records = Vec::new();
    while let Ok(Some(r)) = d.next_record() {
        records.push(r);
    }
    let Some(header) = d.header().cloned() else {
        return Vec::new();
    };
    let mut e = Encoder::new(&header);
    let mut segment = false;
    for r in records {
        match r {
            Record::Alloc(mut a) => {
                if !segment {
                    segment = true;
                    e.record(&Record::Alloc(Alloc {
                        ts_nanos: a.ts_nanos,
                        size_bytes: 1 << 60,
                        kind: AllocKind::Device,
                        ..Alloc::default()
                    }));
                }
                if a.kind == AllocKind::Device {
                    a.kind = AllocKind::FrameworkBlock;
                }
                e.record(&Record::Alloc(a));
            }
            Record::Free(mut f) => {
                f.alloc = AllocId(f.alloc.0 + 1);
                e.record(&Record::Free(f));
            }
            other => {
                e.record(&other);
            }
        }
    }
    e.into_bytes()
}

/// Generates `scenario` with about `events` allocation/free records.
pub fn generate(scenario: Scenario, events: u64, seed: u64) -> (Vec<u8>, GroundTruth) {
    let mut w = Writer::new(scenario, seed);
    let events = events.max(100);
    match scenario {
        Scenario::TrainingLeak
        | Scenario::CachePlateau
        | Scenario::Clean
        | Scenario::Spikes
        | Scenario::ExceptionLeak => training(&mut w, scenario, events),
        Scenario::Fragmented => fragmented(&mut w),
        Scenario::HiddenGrowth => hidden_growth(&mut w, events),
        Scenario::NvtxLeak => nvtx_leak(&mut w, events),
        Scenario::ShortLived => short_lived(&mut w, events),
        Scenario::MultiDevice => multi_device(&mut w, events),
        Scenario::StreamOrdered => stream_ordered(&mut w, events),
        Scenario::ContextReset => context_reset(&mut w, events),
        Scenario::Oom => oom(&mut w, events),
        Scenario::Requests => requests(&mut w, events),
    }
    w.finish()
}

const TRAIN: &str = "train.py";
const MODEL: &str = "model.py";

fn training(w: &mut Writer, scenario: Scenario, events: u64) {
    let step_name = w.string("train_step");
    let weights = w.stack(&[("<module>", TRAIN, 120), ("build_model", MODEL, 14)]);
    let act = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 58),
        ("forward", MODEL, 33),
    ]);
    let grad = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 61),
        ("backward", MODEL, 77),
    ]);
    let ws = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 59),
        ("matmul_workspace", MODEL, 51),
    ]);
    let leak = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 64),
        ("record_loss", TRAIN, 42),
    ]);
    let cache = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 57),
        ("lookup_embedding_cache", MODEL, 90),
    ]);
    let spike = w.stack(&[
        ("<module>", TRAIN, 131),
        ("train_step", TRAIN, 60),
        ("attention_scores", MODEL, 102),
    ]);
    // Only the exception scenario defines its batch stack, so the other traces stay as they were.
    let batch = (scenario == Scenario::ExceptionLeak).then(|| {
        w.stack(&[
            ("<module>", TRAIN, 131),
            ("train_step", TRAIN, 56),
            ("load_batch", "data.py", 40),
        ])
    });
    let mut batch_leaked = 0u64;
    let mut reserve = 0u64;
    // Weights: live for the whole run, freed at the end.
    let mut weight_ids = Vec::new();
    for i in 0..8 {
        weight_ids.push(w.alloc((64 + i * 16) * MIB, weights));
    }
    let per_step = 2 * (12 + 6 + 1) + 1;
    let steps = (events / per_step).max(10);
    let leak_size = 4 * MIB;
    let cache_entry = 16 * MIB;
    let cache_cap = 32; // entries: 512 MiB
    let mut cache_len = 0u64;
    let mut leaked = 0u64;
    for step in 0..steps {
        let r = w.range_begin(step_name);
        let batch_id = batch.map(|b| w.alloc(8 * MIB, b));
        let mut acts = Vec::with_capacity(12);
        for i in 0..12 {
            acts.push(w.alloc((8 + (i % 4) * 8) * MIB, act));
        }
        let work_size = 32 * MIB + w.rng.below(8) * MIB;
        let work = w.alloc(work_size, ws);
        if scenario == Scenario::Spikes && step % 25 == 24 {
            let id = w.alloc(2 * GIB, spike);
            let ts = w.now;
            w.truth.spikes.push(PlantedSpike {
                ts_nanos: ts,
                bytes: 2 * GIB,
                function: "attention_scores".into(),
            });
            w.free(id);
        }
        w.free(work);
        let mut grads = Vec::with_capacity(6);
        for i in 0..6 {
            grads.push(w.alloc((16 + i * 4) * MIB, grad));
        }
        for id in acts.into_iter().rev() {
            w.free(id);
        }
        for id in grads {
            w.free(id);
        }
        if let Some(id) = batch_id {
            if step % 7 == 3 {
                // The step raises before `del batch`: the buffer stays referenced.
                batch_leaked += 1;
            } else {
                w.free(id);
            }
        }
        match scenario {
            Scenario::TrainingLeak => {
                w.alloc(leak_size, leak);
                leaked += 1;
            }
            Scenario::CachePlateau if cache_len < cache_cap => {
                w.alloc(cache_entry, cache);
                cache_len += 1;
            }
            _ => {}
        }
        w.range_end(r);
        if step % 4 == 0 {
            // A caching allocator's reserve: it grows in whole segments when the demand
            // outgrows it and is never given back (no empty_cache).
            reserve = reserve.max(w.live_total.div_ceil(256 * MIB) * 256 * MIB);
            w.samples(DeviceIdx(0), reserve);
        }
        w.truth.steps += 1;
        if w.events() >= events {
            break;
        }
    }
    for id in weight_ids {
        w.free(id);
    }
    if leaked > 0 {
        w.truth.leaks.push(PlantedLeak {
            function: "record_loss".into(),
            bytes: leaked * leak_size,
            count: leaked,
            thread: ThreadIdx(0),
        });
    }
    if cache_len > 0 {
        w.truth.bounded.push("lookup_embedding_cache".into());
    }
    if batch_leaked > 0 {
        w.truth.leaks.push(PlantedLeak {
            function: "load_batch".into(),
            bytes: batch_leaked * 8 * MIB,
            count: batch_leaked,
            thread: ThreadIdx(0),
        });
    }
}

/// Requests of 1 to 4,096 tokens, up to 8 in flight, each completing at random: its prompt
/// (4,000 bytes a token), its key-value cache grown in steps of 5,120 bytes a token, and
/// kernels' scratch of any size up to 48 MiB, allocated and freed as it runs. Nearly every
/// scratch size is distinct, and sizes share few low zero bits.
fn requests(w: &mut Writer, events: u64) {
    const SRC: &str = "server.cu";
    let weights = w.stack(&[("main", SRC, 30), ("load_model", SRC, 112)]);
    let prompt = w.stack(&[
        ("main", SRC, 44),
        ("handle_request", SRC, 210),
        ("copy_prompt", SRC, 233),
    ]);
    let kv = w.stack(&[
        ("main", SRC, 44),
        ("handle_request", SRC, 215),
        ("grow_kv_cache", SRC, 260),
    ]);
    let scratch = w.stack(&[
        ("main", SRC, 44),
        ("handle_request", SRC, 218),
        ("run_kernels", SRC, 288),
    ]);
    let model = w.alloc(6 * GIB + 123_456_789, weights);
    let mut in_flight: Vec<(Vec<AllocId>, u64)> = Vec::new();
    let mut served = 0u64;
    while w.events() + 40 < events {
        if in_flight.len() < 8 {
            let tokens = 1 + w.rng.below(4096);
            let p = w.alloc(tokens * 4_000, prompt);
            in_flight.push((alloc::vec![p], tokens));
        }
        let k = w.rng.below(in_flight.len() as u64) as usize;
        // A step of the request: its scratch, and a longer cache.
        let tokens = in_flight[k].1;
        let size = 1 + w.rng.below(48 * MIB);
        let s = w.alloc(size, scratch);
        let size = tokens * 5_120 + w.rng.below(64) * 5_120;
        let c = w.alloc(size, kv);
        w.free(s);
        in_flight[k].0.push(c);
        if in_flight[k].0.len() > 4 || w.rng.below(4) == 0 {
            let (ids, _) = in_flight.swap_remove(k);
            for id in ids {
                w.free(id);
            }
            served += 1;
            if served.is_multiple_of(64) {
                w.device_sample(DeviceIdx(0));
            }
        }
    }
    for (ids, _) in in_flight {
        for id in ids {
            w.free(id);
        }
    }
    w.free(model);
}

fn short_lived(w: &mut Writer, events: u64) {
    let small = w.stack(&[("main", "app.cu", 20), ("tokenize_batch", "app.cu", 88)]);
    let big = w.stack(&[("main", "app.cu", 18), ("load_weights", "app.cu", 40)]);
    let weights = w.alloc(256 * MIB, big);
    while w.events() + 2 < events {
        let n = 1 + w.rng.below(4);
        let mut ids = Vec::new();
        for _ in 0..n {
            let sz = 256 + w.rng.below(64) * 1024;
            ids.push(w.alloc(sz, small));
        }
        for id in ids {
            w.free(id);
        }
    }
    w.free(weights);
}

fn multi_device(w: &mut Writer, events: u64) {
    w.rec(Record::Device(DeviceInfo {
        device: DeviceIdx(1),
        uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
        name: "Synthetic GPU 80GB".into(),
        total_bytes: 80 * GIB,
    }));
    let mut stacks = Vec::new();
    for t in 1..=4u32 {
        let name = alloc::format!("worker-{t}");
        let n = w.string(&name);
        w.rec(Record::Thread(ThreadInfo {
            thread: ThreadIdx(t),
            process: ProcessIdx(0),
            os_tid: 5000 + u64::from(t),
            name: n,
        }));
        stacks.push(w.stack(&[
            ("worker_main", "workers.py", 10),
            ("prefetch_to_device", "workers.py", 30 + t),
        ]));
    }
    let leak_stack = w.stack(&[
        ("worker_main", "workers.py", 10),
        ("stage_batch", "workers.py", 71),
    ]);
    // Thread 3 allocates a staging buffer on device 1 and exits early without freeing it.
    let mut leaked = 0u64;
    for _ in 0..4 {
        w.alloc_full(
            24 * MIB,
            leak_stack,
            ThreadIdx(3),
            DeviceIdx(1),
            AllocKind::Device,
            0,
            ProcessIdx(0),
        );
        leaked += 24 * MIB;
    }
    w.truth.leaks.push(PlantedLeak {
        function: "stage_batch".into(),
        bytes: leaked,
        count: 4,
        thread: ThreadIdx(3),
    });
    let mut live: Vec<(AllocId, ThreadIdx)> = Vec::new();
    while w.events() + 8 < events {
        let t = [1u32, 2, 4][w.rng.below(3) as usize];
        let dev = DeviceIdx(t % 2);
        let size = (1 + w.rng.below(32)) * MIB;
        let id = w.alloc_full(
            size,
            stacks[t as usize - 1],
            ThreadIdx(t),
            dev,
            AllocKind::Device,
            0,
            ProcessIdx(0),
        );
        live.push((id, ThreadIdx(t)));
        if live.len() > 16 {
            let k = w.rng.below(live.len() as u64) as usize;
            let (id, th) = live.swap_remove(k);
            w.free_full(id, th, FreeKind::Immediate, 0);
        }
    }
    for (id, th) in live {
        w.free_full(id, th, FreeKind::Immediate, 0);
    }
}

fn stream_ordered(w: &mut Writer, events: u64) {
    let st = w.stack(&[
        ("main", "pipeline.cu", 12),
        ("launch_stage", "pipeline.cu", 55),
    ]);
    let mut pending: Vec<(AllocId, u64)> = Vec::new();
    let mut i = 0u64;
    while w.events() + 4 < events {
        let stream = 1 + (i % 4);
        let size = (4 + w.rng.below(12)) * MIB;
        let id = w.alloc_full(
            size,
            st,
            ThreadIdx(0),
            DeviceIdx(0),
            AllocKind::StreamOrderedPool,
            stream,
            ProcessIdx(0),
        );
        pending.push((id, stream));
        // The free follows the asynchronous kernel launch on the same stream: not a leak.
        if pending.len() > 3 {
            let (id, s) = pending.remove(0);
            w.free_full(id, ThreadIdx(0), FreeKind::StreamOrdered, s);
        }
        if i.is_multiple_of(16) {
            let reserved = w.live_total.div_ceil(64 * MIB) * 64 * MIB + 64 * MIB;
            w.samples(DeviceIdx(0), reserved);
        }
        i += 1;
    }
    for (id, s) in pending {
        w.free_full(id, ThreadIdx(0), FreeKind::StreamOrdered, s);
    }
}

fn context_reset(w: &mut Writer, events: u64) {
    let st = w.stack(&[
        ("main", "solver.cu", 30),
        ("setup_buffers", "solver.cu", 64),
    ]);
    let loop_st = w.stack(&[("main", "solver.cu", 41), ("iterate", "solver.cu", 90)]);
    for _ in 0..6 {
        w.alloc(48 * MIB, st);
    }
    while w.events() + 2 < events {
        let size = (1 + w.rng.below(8)) * MIB;
        let id = w.alloc(size, loop_st);
        w.free(id);
    }
    w.tick(1_000, 1_000);
    let mut freed = 0;
    for l in w.live.iter_mut() {
        if let Some(x) = l.take() {
            freed += x.size;
        }
    }
    w.live_total -= freed;
    w.truth.teardown_freed_bytes = freed;
    let now = w.now;
    w.rec(Record::ContextReset(ContextReset {
        ts_nanos: now,
        process: ProcessIdx(0),
        device: DeviceIdx(0),
        thread: ThreadIdx(0),
    }));
}

fn oom(w: &mut Writer, events: u64) {
    let st = w.stack(&[("main", "grow.cu", 10), ("grow_buffers", "grow.cu", 27)]);
    let fail_st = w.stack(&[("main", "grow.cu", 12), ("allocate_output", "grow.cu", 45)]);
    let total = 80 * GIB;
    let other_process = 20 * GIB;
    let per = ((total - other_process) / (events / 2).max(1)).max(MIB);
    let mut kept = 0u64;
    let mut count = 0u64;
    while w.events() + 2 < events / 2 && w.live_total + per < total - other_process - 4 * GIB {
        w.alloc(per, st);
        kept += per;
        count += 1;
    }
    let used = w.live_total + other_process + 512 * MIB;
    w.tick(1000, 1000);
    let now = w.now;
    w.rec(Record::DeviceSample(DeviceSample {
        ts_nanos: now,
        device: DeviceIdx(0),
        total_bytes: total,
        free_bytes: total.saturating_sub(used),
        used_bytes: used,
        processes: vec![
            ProcessUsage {
                pid: 4242,
                used_bytes: w.live_total + 512 * MIB,
            },
            ProcessUsage {
                pid: 9999,
                used_bytes: other_process,
            },
        ],
    }));
    w.tick(1000, 1000);
    let now = w.now;
    w.rec(Record::AllocFailed(AllocFailed {
        ts_nanos: now,
        size_bytes: 8 * GIB,
        error_code: 2,
        stack: fail_st,
        thread: ThreadIdx(0),
        device: DeviceIdx(0),
        kind: AllocKind::Device,
        process: ProcessIdx(0),
    }));
    w.truth.failed_count = 1;
    // The error path returns without freeing: those buffers are leaked.
    w.truth.leaks.push(PlantedLeak {
        function: "grow_buffers".into(),
        bytes: kept,
        count,
        thread: ThreadIdx(0),
    });
}

fn fragmented(w: &mut Writer) {
    let block = w.stack(&[("main", "pool.py", 10), ("allocate_block", "pool.py", 20)]);
    let big = w.stack(&[("main", "pool.py", 12), ("allocate_batch", "pool.py", 51)]);
    // Eight contiguous 64 MiB blocks in a 1 GiB reservation (placed explicitly: the bump
    // allocator's first address is outside its wrap range).
    w.next_addr[0] = 0x7000_0000_0000 + GIB;
    let ids: Vec<AllocId> = (0..8).map(|_| w.alloc(64 * MIB, block)).collect();
    let mut planted = PlantedFragmentation::default();
    w.samples(DeviceIdx(0), GIB);
    planted.pool_samples.push((GIB, w.live_total));
    // Free every other block: holes of 64 MiB.
    for k in [1, 3] {
        w.free(ids[k]);
    }
    w.samples(DeviceIdx(0), GIB);
    planted.pool_samples.push((GIB, w.live_total));
    for k in [5, 7] {
        w.free(ids[k]);
    }
    w.samples(DeviceIdx(0), GIB);
    planted.pool_samples.push((GIB, w.live_total));
    // 128 MiB does not fit in any hole, though 192 MiB is free between the live blocks
    // (block 7's hole is past the last live block).
    w.tick(1000, 1000);
    let now = w.now;
    w.rec(Record::AllocFailed(AllocFailed {
        ts_nanos: now,
        size_bytes: 128 * MIB,
        error_code: 2,
        stack: big,
        thread: ThreadIdx(0),
        device: DeviceIdx(0),
        kind: AllocKind::Device,
        process: ProcessIdx(0),
    }));
    w.truth.failed_count = 1;
    planted.free_inside_span_bytes = 3 * 64 * MIB;
    planted.largest_free_bytes = 64 * MIB;
    planted.failed_request_bytes = 128 * MIB;
    for k in [0, 2, 4, 6] {
        w.free(ids[k]);
    }
    w.truth.fragmentation = Some(planted);
}

fn hidden_growth(w: &mut Writer, events: u64) {
    let st = w.stack(&[("main", "serve.py", 8), ("handle_request", "serve.py", 30)]);
    let resident = w.stack(&[("main", "serve.py", 5), ("load_model", "serve.py", 12)]);
    let model = w.alloc(4 * GIB, resident);
    let mut k = 0u64;
    let mut i = 0u64;
    while w.events() + 2 < events {
        let size = (2 + w.rng.below(6)) * MIB;
        let id = w.alloc(size, st);
        w.free(id);
        i += 1;
        if i.is_multiple_of(32) {
            // Untraced memory (library workspaces) grows by 256 MiB per sample.
            let untraced = GIB + k * 256 * MIB;
            let used = w.live_total + untraced;
            w.tick(100, 1_000);
            let now = w.now;
            w.rec(Record::DeviceSample(DeviceSample {
                ts_nanos: now,
                device: DeviceIdx(0),
                total_bytes: 80 * GIB,
                free_bytes: (80 * GIB).saturating_sub(used),
                used_bytes: used,
                processes: vec![ProcessUsage {
                    pid: 4242,
                    used_bytes: used,
                }],
            }));
            k += 1;
        }
    }
    w.free(model);
    w.truth.hidden_drift = k >= 5;
}

fn nvtx_leak(w: &mut Writer, events: u64) {
    let epoch = w.string("epoch");
    let train = w.string("train_step");
    let validate = w.string("validate");
    let fwd = w.stack(&[
        ("<module>", TRAIN, 140),
        ("train_step", TRAIN, 58),
        ("forward", MODEL, 33),
    ]);
    let val_fwd = w.stack(&[
        ("<module>", TRAIN, 150),
        ("validate", "eval.py", 19),
        ("forward", MODEL, 33),
    ]);
    let keep = w.stack(&[
        ("<module>", TRAIN, 150),
        ("validate", "eval.py", 21),
        ("keep_predictions", "eval.py", 37),
    ]);
    let mut leaked = 0u64;
    while w.events() + 72 < events || leaked < 3 {
        let e = w.range_begin(epoch);
        for _ in 0..8 {
            let r = w.range_begin(train);
            let ids: Vec<AllocId> = (0..4).map(|i| w.alloc((8 + i * 8) * MIB, fwd)).collect();
            for id in ids {
                w.free(id);
            }
            w.range_end(r);
            w.truth.steps += 1;
        }
        let v = w.range_begin(validate);
        let act = w.alloc(32 * MIB, val_fwd);
        // The predictions are appended to a list that lives for the whole run.
        w.alloc(8 * MIB, keep);
        w.free(act);
        w.range_end(v);
        w.range_end(e);
        leaked += 1;
    }
    w.truth.leaks.push(PlantedLeak {
        function: "keep_predictions".into(),
        bytes: leaked * 8 * MIB,
        count: leaked,
        thread: ThreadIdx(0),
    });
    w.truth.leaky_scopes.push("validate".into());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::load;

    #[test]
    fn every_scenario_replays_to_its_ground_truth() {
        for s in Scenario::ALL {
            let (bytes, truth) = generate(s, 5_000, 7);
            let t = load(&bytes).expect("synthetic trace loads");
            assert!(t.fatal.is_none(), "{s:?}: {:?}", t.fatal);
            assert!(t.warnings.is_empty(), "{s:?}: {:?}", t.warnings);
            assert_eq!(t.model.peak_bytes, truth.peak_bytes, "{s:?} peak");
            assert_eq!(
                t.model.live_at_end_bytes(),
                truth.live_at_end_bytes,
                "{s:?} live at end"
            );
            assert_eq!(
                t.model.allocs.len() as u64,
                truth.alloc_count,
                "{s:?} allocs"
            );
            assert_eq!(
                t.model.failed.len() as u64,
                truth.failed_count,
                "{s:?} failed"
            );
            assert!(t.model.clean_end);
        }
    }
}
