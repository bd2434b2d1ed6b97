//! CUDA C++ programs: native stacks (the program's frames with file and line, the CUDA
//! libraries' without), written straight into a trace with the program's own accounting of what
//! it holds: per-call workspaces, stream-ordered pools with a release threshold, a custom
//! sub-allocator, peer exchange between two devices, worker threads, and the faults such
//! programs have (a leak on an error path, on thread exit, a pinned buffer never freed, an OOM
//! from our own leak, an oversized request, memory the trace cannot see).

use std::collections::{HashMap, HashSet};

use analysis_core::format::{
    Alloc, AllocId, AllocKind, DeviceIdx, FreeKind, ProcessIdx, ThreadIdx,
};

use super::caching::{GIB, MIB};
use super::writer::{Fr, Rng, StackRef, Stacks, TraceWriter, native};
use crate::scenario::{Call, DeviceSample};

const M_APP: u32 = 1;
const M_CUDART: u32 = 2;
const M_CUDA: u32 = 3;
const M_LIBC: u32 = 4;
const M_STDCXX: u32 = 5;
/// CUDA context and module images, per device.
const CONTEXT_BYTES: u64 = 418 * MIB;

fn off(s: &str) -> u64 {
    s.bytes().fold(0x1_0000_u64, |h, b| {
        h.wrapping_mul(131).wrapping_add(u64::from(b))
    }) % 0x40_0000
}

/// A frame of the program (symbolized with file and line).
pub fn app(func: &str, file: &str, line: u32) -> Fr {
    native(
        M_APP,
        off(func) + u64::from(line) * 4,
        func,
        &format!("/src/solver/{file}"),
        line,
    )
}

fn lib(module: u32, func: &str) -> Fr {
    native(module, off(func), func, "", 0)
}

/// How the memory is obtained: driver frames innermost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Malloc,
    MallocAsync,
    HostAlloc,
}

fn api_frames(api: Api) -> Vec<Fr> {
    match api {
        Api::Malloc => vec![lib(M_CUDA, "cuMemAlloc_v2"), lib(M_CUDART, "cudaMalloc")],
        Api::MallocAsync => vec![
            lib(M_CUDA, "cuMemAllocFromPoolAsync"),
            lib(M_CUDART, "cudaMallocFromPoolAsync"),
        ],
        Api::HostAlloc => vec![
            lib(M_CUDA, "cuMemHostAlloc"),
            lib(M_CUDART, "cudaHostAlloc"),
        ],
    }
}

#[derive(Clone, Copy, Debug)]
struct Live {
    size: u64,
    kind: AllocKind,
    device: u32,
}

/// One CUDA C++ process writing its trace.
#[derive(Debug)]
pub struct Cpp {
    pub w: TraceWriter,
    pub rng: Rng,
    pub stacks: Stacks,
    pub pid: u32,
    live: HashMap<AllocId, Live>,
    next_addr: [u64; 2],
    pub device_live: [u64; 2],
    /// Stream-ordered pool: (handle, reserved) per device.
    pub pool_reserved: [u64; 2],
    pub pool_used: [u64; 2],
    pub cause: HashSet<AllocId>,
    pub calls: Vec<Call>,
    pub samples: Vec<DeviceSample>,
    call_open: Option<(String, String, u32, u64, u64, u64)>,
    call_peak: u64,
    pub totals: [u64; 2],
    /// Device memory of ours the trace does not see (grows in the hidden scenario).
    pub untraced: u64,
    pub foreign: Option<(u32, u64, u64)>,
}

impl Cpp {
    pub fn new(seed: u64, argv: &[&str], devices: &[(&str, u64)], threads: &[&str]) -> Self {
        let pid = 61_000 + (seed % 1000) as u32;
        let mut w = TraceWriter::new(argv);
        w.process(0, pid, None, "/opt/app/bin/solver", argv);
        let mut totals = [0; 2];
        for (i, (name, total)) in devices.iter().enumerate() {
            w.device(i as u32, name, *total);
            totals[i.min(1)] = *total;
        }
        for (i, name) in threads.iter().enumerate() {
            w.thread(i as u32, 0, u64::from(pid) + i as u64, name);
        }
        w.module(M_APP, 0, "/opt/app/bin/solver", 0x5600_0000_0000, 0x80_0000);
        w.module(
            M_CUDART,
            0,
            "/usr/local/cuda-12.8/lib64/libcudart.so.12",
            0x7f40_0000_0000,
            0x10_0000,
        );
        w.module(
            M_CUDA,
            0,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            0x7f30_0000_0000,
            0x400_0000,
        );
        w.module(
            M_LIBC,
            0,
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x7f20_0000_0000,
            0x20_0000,
        );
        w.module(
            M_STDCXX,
            0,
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            0x7f21_0000_0000,
            0x30_0000,
        );
        w.now = 80_000_000;
        Self {
            w,
            rng: Rng::new(seed),
            stacks: Stacks::default(),
            pid,
            live: HashMap::new(),
            next_addr: [0x7f8a_0000_0000, 0x7f9a_0000_0000],
            device_live: [0; 2],
            pool_reserved: [0; 2],
            pool_used: [0; 2],
            cause: HashSet::new(),
            calls: Vec::new(),
            samples: Vec::new(),
            call_open: None,
            call_peak: 0,
            totals,
            untraced: 0,
            foreign: None,
        }
    }

    /// A stack: the API's frames, then `frames` (innermost first), then `main` and libc's start
    /// (or a thread's start routine when `thread_entry`).
    pub fn stack(&mut self, api: Api, frames: &[Fr], thread_entry: bool) -> StackRef {
        let mut v = api_frames(api);
        v.extend(frames.iter().cloned());
        if thread_entry {
            v.push(lib(
                M_STDCXX,
                "std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (*)(WorkQueue*), WorkQueue*> > >::_M_run()",
            ));
            v.push(lib(M_LIBC, "start_thread"));
        } else {
            v.push(lib(M_LIBC, "__libc_start_call_main"));
        }
        self.stacks.add(v)
    }

    pub fn tick_us(&mut self, lo: u64, hi: u64) {
        self.w.now += self.rng.range(lo, hi) * 1000;
    }

    #[allow(clippy::too_many_arguments)]
    pub fn alloc_on(
        &mut self,
        size: u64,
        stack: StackRef,
        thread: u32,
        device: u32,
        kind: AllocKind,
        stream: u64,
        pool: u64,
    ) -> AllocId {
        self.tick_us(5, 80);
        let st = self.w.stack(&self.stacks, stack);
        let d = device.min(1) as usize;
        let address = self.next_addr[d];
        self.next_addr[d] += size.div_ceil(2 * MIB).max(1) * 2 * MIB;
        let id = self.w.alloc(Alloc {
            size_bytes: size,
            address,
            stack: st,
            thread: ThreadIdx(thread),
            device: DeviceIdx(device),
            kind,
            stream,
            pool,
            process: ProcessIdx(0),
            ..Alloc::default()
        });
        self.live.insert(id, Live { size, kind, device });
        if kind.is_device_memory() {
            self.device_live[d] += size;
            self.call_peak = self
                .call_peak
                .max(self.device_live[0] + self.device_live[1]);
        }
        id
    }

    pub fn alloc(&mut self, size: u64, stack: StackRef, thread: u32) -> AllocId {
        self.alloc_on(size, stack, thread, 0, AllocKind::Device, 0, 0)
    }

    pub fn free_with(&mut self, id: AllocId, thread: u32, kind: FreeKind, stream: u64) {
        self.tick_us(3, 40);
        if let Some(l) = self.live.remove(&id) {
            if l.kind.is_device_memory() {
                self.device_live[l.device.min(1) as usize] -= l.size;
            }
            self.w.free(id, thread, kind, stream);
        }
    }

    pub fn free(&mut self, id: AllocId, thread: u32) {
        self.free_with(id, thread, FreeKind::Immediate, 0);
    }

    /// A failed `cudaMalloc` (out of memory).
    pub fn fail(&mut self, size: u64, stack: StackRef, thread: u32) {
        self.tick_us(5, 50);
        let st = self.w.stack(&self.stacks, stack);
        self.w
            .alloc_failed(size, st, thread, 0, AllocKind::Device, 0);
    }

    /// Whether `size` more bytes fit on device 0 now.
    pub fn fits(&self, size: u64) -> bool {
        CONTEXT_BYTES + self.device_live[0] + self.pool_reserved[0]
            - self.pool_used[0].min(self.pool_reserved[0])
            + self.untraced
            + size
            <= self.totals[0]
    }

    pub fn live_bytes(&self) -> u64 {
        self.device_live[0] + self.device_live[1]
    }

    pub fn cause_live_bytes(&self) -> u64 {
        self.cause
            .iter()
            .filter_map(|id| self.live.get(id))
            .map(|l| l.size)
            .sum()
    }

    /// Every live allocation, for a destructor that frees all (in reverse order).
    pub fn live_ids(&self) -> Vec<AllocId> {
        let mut v: Vec<AllocId> = self.live.keys().copied().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }

    /// An NVML sample of every device.
    pub fn device_samples(&mut self) {
        let n = if self.totals[1] > 0 { 2 } else { 1 };
        for d in 0..n {
            let ours = CONTEXT_BYTES
                + self.device_live[d]
                + self.pool_reserved[d].saturating_sub(self.pool_used[d])
                + if d == 0 { self.untraced } else { 0 };
            let mut procs = vec![(self.pid, ours)];
            if d == 0
                && let Some((pid, start, per_s)) = self.foreign
            {
                procs.push((pid, start + per_s * (self.w.now / 1_000_000) / 1000));
            }
            let used: u64 = procs.iter().map(|p| p.1).sum();
            self.samples.push(DeviceSample {
                t_s: self.w.now as f64 / 1e9,
                used,
                total: self.totals[d],
                reserved: self.device_live[d]
                    + self.pool_reserved[d].saturating_sub(self.pool_used[d]),
                allocated: self.device_live[d],
                device: d as u32,
            });
            let total = self.totals[d];
            self.w.device_sample(d as u32, total, &procs);
        }
    }

    pub fn call_begin(&mut self, function: &str, file: &str, line: u32) {
        let live = self.live_bytes();
        let reserved = live + self.pool_reserved[0].saturating_sub(self.pool_used[0]);
        self.call_peak = live;
        self.call_open = Some((
            function.into(),
            file.into(),
            line,
            self.w.now,
            live,
            reserved,
        ));
    }

    pub fn call_end(&mut self) {
        if let Some((function, file, line, start, a0, r0)) = self.call_open.take() {
            let live = self.live_bytes();
            self.calls.push(Call {
                function,
                file,
                line,
                start_s: start as f64 / 1e9,
                end_s: self.w.now as f64 / 1e9,
                allocated_before: a0,
                allocated_after: live,
                reserved_before: r0,
                reserved_after: live + self.pool_reserved[0].saturating_sub(self.pool_used[0]),
                peak_allocated: self.call_peak,
                pid: self.pid,
            });
        }
    }

    /// Exit with `code` (writes the status and `end`) and returns the trace.
    pub fn exit(mut self, code: i32) -> (Vec<u8>, Vec<Call>, Vec<DeviceSample>) {
        self.tick_us(500, 2000);
        self.w.process_exit(0, Some(code), None);
        (self.w.finish(true), self.calls, self.samples)
    }

    /// Killed by `signal`: the status, no `end`.
    pub fn killed(mut self, signal: i32) -> (Vec<u8>, Vec<Call>, Vec<DeviceSample>) {
        self.tick_us(500, 2000);
        self.w.process_exit(0, None, Some(signal));
        (self.w.finish(false), self.calls, self.samples)
    }
}

/// The per-iteration workspace sizes of a solver: most iterations need a few MiB, some problem
/// sizes eight times more.
pub fn workspace_size(rng: &mut Rng) -> u64 {
    if rng.chance(1, 10) {
        256 * MIB
    } else {
        16 * MIB + rng.range(0, 15) * MIB
    }
}

pub const H100: (&str, u64) = ("NVIDIA H100 80GB HBM3", 80 * GIB);
pub const L4: (&str, u64) = ("NVIDIA L4", 24 * GIB);
