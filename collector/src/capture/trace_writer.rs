//! Turns ring events into trace records: interns processes, threads, strings, modules, frames
//! and stacks; pairs frees with allocations by address; models VMM handles (physical memory
//! lives until released AND unmapped) and context teardown; symbolizes each new frame once.
//! Encoded bytes go to the output after every batch, so a killed collector leaves a readable
//! prefix.

use std::collections::BTreeMap;
use std::io::Write;

use analysis_core::Encoder;
use analysis_core::encode::Interner;
use analysis_core::format::*;
use anyhow::{Context, Result};
use gpucollect_ring::event::{Event, alloc_kind, kind, python_frame};
// FxHash, not SipHash: std's SipHash was a tenth of the drain time. Keys come from the traced
// program, which is trusted not to attack the collector's hash tables.
use rustc_hash::FxHashMap as HashMap;

use super::symbolize::Symbolizer;
use super::torch_blocks::BlockLayout;

/// Modules whose frames are never the interesting call site (the CUDA stack and ourselves).
const HIDDEN_MODULES: &[&str] = &[
    "libcuda.so",
    "libcupti.so",
    "libcudart.so",
    "libgpucollect_inject",
];
/// Modules between a Python call and the C function it calls (the interpreter, ctypes,
/// libffi): hidden at the top of stacks that have Python frames, so a Python program's call
/// site is its Python line. In a stack without Python frames (an interpreter whose frames
/// cannot be read) they stay, as the only hint of where the call came from.
const PYTHON_MACHINERY_MODULES: &[&str] = &["libpython3", "_ctypes.", "libffi.so"];

/// Whether a frame is left out when it leads a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hide {
    Never,
    Always,
    /// Only in stacks that have Python frames.
    UnderPython,
}
/// Function-name prefixes of CUDA runtime entry points (statically linked cudart).
const HIDDEN_FUNCTION_PREFIXES: &[&str] = &[
    "cudart::",
    // The statically linked runtime's internal symbols (seen on a real H100 with CUDA 13).
    "libcudart_static_",
    "__cudart",
    "cudaMalloc",
    "cudaFree",
    "cudaHostAlloc",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaArray",
    "cudaMemPool",
    "cudaDeviceReset",
    "cudaMalloc3D",
    "cudaMallocPitch",
    "cudaMallocManaged",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaIpc",
];

#[derive(Clone, Debug)]
struct ModuleEntry {
    id: ModuleId,
    path: String,
    bias: u64,
    end: u64,
}

#[derive(Clone, Copy, Debug)]
struct VmmHandle {
    alloc: AllocId,
    device: DeviceIdx,
    maps: u32,
    released: bool,
}

/// Options that change what is recorded.
#[derive(Clone, Debug, Default)]
pub struct WriterOptions {
    /// Function-name substrings of allocator wrappers: leading frames matching one are skipped,
    /// so allocations are attributed to the wrapper's caller.
    pub hide_frames: Vec<String>,
}

pub struct TraceWriter<W: Write> {
    enc: Encoder,
    out: W,
    start_mono_nanos: u64,
    opts: WriterOptions,
    pids: HashMap<u32, ProcessIdx>,
    process_info: HashMap<ProcessIdx, ProcessInfo>,
    /// Exit status a process reported from its exit handler: (time, status).
    exit_status: HashMap<ProcessIdx, (u64, i32)>,
    maps_read: HashMap<ProcessIdx, std::time::Instant>,
    next_process: u32,
    threads: HashMap<(ProcessIdx, u64), ThreadIdx>,
    next_thread: u32,
    interner: Interner,
    modules: HashMap<ProcessIdx, Vec<ModuleEntry>>,
    module_ids: HashMap<(String, u64), ModuleId>,
    next_module: u32,
    frames: HashMap<(ModuleId, u64), (FrameId, Hide)>,
    /// Python code objects a process described (PY_CODE): (process, code slot) -> function,
    /// file, and whether `--hide-frame` hides the function.
    py_codes: HashMap<(ProcessIdx, u32), (StringId, StringId, bool)>,
    /// Python frames: (function, file, line) -> frame id and whether it is hidden.
    py_frames: HashMap<(StringId, StringId, u32), (FrameId, Hide)>,
    next_frame: u32,
    symbolizer: Symbolizer,
    /// Live driver allocations: (process, address) -> (id, device, size).
    allocs: HashMap<(ProcessIdx, u64), (AllocId, DeviceIdx, u64)>,
    /// Live framework blocks (kind 7): addresses of their own, apart from driver allocations
    /// (a segment's first block has the segment's address).
    framework_blocks: HashMap<(ProcessIdx, DeviceIdx, u64), AllocId>,
    /// Segments and PyTorch blocks, for the whole size of a block left unsplit.
    torch_layout: BlockLayout,
    vmm: HashMap<(ProcessIdx, u64), VmmHandle>,
    vmm_maps: BTreeMap<(ProcessIdx, u64), (u64, u64)>,
    range_stacks: HashMap<(ProcessIdx, u64), Vec<RangeId>>,
    started_ranges: HashMap<(ProcessIdx, u64), RangeId>,
    next_range: u64,
    /// Last (process, tid) -> thread, the common case of one busy thread.
    last_thread: Option<(ProcessIdx, u64, ThreadIdx)>,
    /// Raw return addresses of a process -> interned stack (skips per-frame lookups).
    stack_cache: HashMap<(ProcessIdx, Box<[u64]>), StackId>,
    last_ts_nanos: u64,
    write_error: Option<std::io::Error>,
    pub events: u64,
}

impl<W: Write> std::fmt::Debug for TraceWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("events", &self.events)
            .finish()
    }
}

fn module_hidden(path: &str) -> Hide {
    let name = path.rsplit('/').next().unwrap_or(path);
    if HIDDEN_MODULES.iter().any(|m| name.starts_with(m)) {
        Hide::Always
    } else if PYTHON_MACHINERY_MODULES.iter().any(|m| name.starts_with(m))
        || is_python_executable(name)
    {
        Hide::UnderPython
    } else {
        Hide::Never
    }
}

/// `python`, `python3`, `python3.12`, `python3.13d`: an interpreter linked statically.
fn is_python_executable(name: &str) -> bool {
    name.strip_prefix("python").is_some_and(|v| {
        v.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == 'd' || c == 't')
    })
}

impl<W: Write> TraceWriter<W> {
    pub fn new(header: &Header, out: W, opts: WriterOptions) -> Self {
        Self {
            enc: Encoder::new(header),
            out,
            start_mono_nanos: header.start_mono_nanos,
            opts,
            pids: HashMap::default(),
            process_info: HashMap::default(),
            exit_status: HashMap::default(),
            maps_read: HashMap::default(),
            next_process: 0,
            threads: HashMap::default(),
            next_thread: 0,
            interner: Interner::default(),
            modules: HashMap::default(),
            module_ids: HashMap::default(),
            next_module: 1,
            frames: HashMap::default(),
            py_codes: HashMap::default(),
            py_frames: HashMap::default(),
            next_frame: 1,
            symbolizer: Symbolizer::default(),
            allocs: HashMap::default(),
            framework_blocks: HashMap::default(),
            torch_layout: BlockLayout::default(),
            vmm: HashMap::default(),
            vmm_maps: BTreeMap::new(),
            range_stacks: HashMap::default(),
            started_ranges: HashMap::default(),
            next_range: 1,
            last_thread: None,
            stack_cache: HashMap::default(),
            last_ts_nanos: 0,
            write_error: None,
            events: 0,
        }
    }

    fn ts(&mut self, mono_nanos: u64) -> u64 {
        let t = mono_nanos.saturating_sub(self.start_mono_nanos);
        self.last_ts_nanos = self.last_ts_nanos.max(t);
        t
    }

    /// Time now, relative to the trace origin.
    pub fn now_nanos(&mut self) -> u64 {
        let now = gpucollect_inject::host::monotonic_nanos();
        self.ts(now)
    }

    fn string(&mut self, s: &str) -> StringId {
        if s.is_empty() {
            return StringId(0);
        }
        self.interner.string(&mut self.enc, s)
    }

    /// Forgets a dead process's pid, so a new process that reuses it gets its own index.
    pub fn forget_pid(&mut self, pid: u32) {
        self.pids.remove(&pid);
    }

    /// Records that a traced process other than the program itself is gone: with the status
    /// its exit handler reported, or with an unknown status (`_exit`, a signal) at `now`.
    pub fn process_gone(&mut self, process: ProcessIdx, now_nanos: u64) {
        let (ts_nanos, code) = match self.exit_status.remove(&process) {
            Some((ts, status)) => (ts, Some(status)),
            None => (now_nanos, None),
        };
        self.enc.record(&Record::ProcessExit(ProcessExit {
            ts_nanos,
            process,
            code,
            signal: None,
        }));
    }

    /// Declares a traced process (idempotent per pid). A child starts with its parent's module
    /// table (it is a copy after fork; exec replaces it with its own).
    pub fn add_process(
        &mut self,
        pid: u32,
        ppid: u32,
        mut exe: String,
        mut argv: Vec<String>,
    ) -> ProcessIdx {
        if let Some(p) = self.pids.get(&pid) {
            return *p;
        }
        let process = ProcessIdx(self.next_process);
        self.next_process += 1;
        self.pids.insert(pid, process);
        let parent = self.pids.get(&ppid).copied();
        if let Some(pp) = parent
            && let Some(m) = self.modules.get(&pp).cloned()
        {
            self.modules.insert(process, m);
        }
        if exe.is_empty()
            && let Some(info) = parent.and_then(|pp| self.process_info.get(&pp))
        {
            // Gone before we could look: a forked child runs its parent's program.
            exe.clone_from(&info.exe);
            argv.clone_from(&info.argv);
        }
        let info = ProcessInfo {
            process,
            pid,
            parent,
            exe,
            argv,
        };
        self.enc.record(&Record::Process(info.clone()));
        self.process_info.insert(process, info);
        process
    }

    fn thread(&mut self, process: ProcessIdx, tid: u64, name: Option<&str>) -> ThreadIdx {
        if name.is_none() {
            if let Some((p, t, idx)) = self.last_thread
                && p == process
                && t == tid
            {
                return idx;
            }
            if let Some(t) = self.threads.get(&(process, tid)) {
                self.last_thread = Some((process, tid, *t));
                return *t;
            }
        }
        let thread = match self.threads.get(&(process, tid)) {
            Some(t) => *t,
            None => {
                let t = ThreadIdx(self.next_thread);
                self.next_thread += 1;
                self.threads.insert((process, tid), t);
                t
            }
        };
        let name = self.string(name.unwrap_or(""));
        self.enc.record(&Record::Thread(ThreadInfo {
            thread,
            process,
            os_tid: tid,
            name,
        }));
        thread
    }

    fn module(&mut self, process: ProcessIdx, e: &Event) {
        let path = e.text();
        let bias = e.stream;
        let end = e.pool;
        let key = (path.clone(), bias);
        let id = match self.module_ids.get(&key) {
            Some(id) => *id,
            None => {
                let id = ModuleId(self.next_module);
                self.next_module += 1;
                self.module_ids.insert(key, id);
                self.enc.record(&Record::Module(ModuleInfo {
                    module: id,
                    process,
                    path: path.clone(),
                    build_id: e.build_id(),
                    load_address: bias,
                    size_bytes: end,
                }));
                id
            }
        };
        self.stack_cache.retain(|(p, _), _| *p != process);
        let table = self.modules.entry(process).or_default();
        // A process re-sending its table (after exec) replaces stale entries at the same bias.
        table.retain(|m| m.bias != bias);
        table.push(ModuleEntry {
            id,
            path,
            bias,
            end,
        });
        table.sort_by_key(|m| m.bias);
    }

    /// Adds the modules a process loaded after it sent its table (dlopen), from
    /// `/proc/<pid>/maps` and the files' ELF headers (load layout, build id), at most every
    /// 100 ms per process.
    fn refresh_modules(&mut self, process: ProcessIdx) {
        let now = std::time::Instant::now();
        if let Some(t) = self.maps_read.get(&process)
            && now.duration_since(*t) < std::time::Duration::from_millis(100)
        {
            return;
        }
        self.maps_read.insert(process, now);
        let Some(pid) = self.process_info.get(&process).map(|p| p.pid) else {
            return;
        };
        let known: Vec<String> = self
            .modules
            .get(&process)
            .map(|t| t.iter().map(|m| m.path.clone()).collect())
            .unwrap_or_default();
        for (path, start) in super::proc_maps::file_mappings(pid) {
            if known.contains(&path) {
                continue;
            }
            let Some(l) = super::proc_maps::load_layout(&path, start) else {
                continue;
            };
            let mut e = Event::zeroed();
            e.kind = kind::MODULE;
            e.set_text(path.as_bytes());
            e.stream = l.bias;
            e.pool = l.end;
            let n = l.build_id.len().min(32);
            e.put_bytes(
                gpucollect_ring::event::MAX_TEXT_BYTES - 32,
                &l.build_id[..n],
            );
            e.addr = n as u64;
            self.module(process, &e);
        }
    }

    fn find_module(&self, process: ProcessIdx, ip: u64) -> Option<ModuleEntry> {
        let table = self.modules.get(&process)?;
        table
            .iter()
            .rev()
            .find(|m| m.bias <= ip && ip < m.bias.saturating_add(m.end))
            .cloned()
    }

    /// A PY_CODE event: the names of a process's code slot.
    fn py_code(&mut self, process: ProcessIdx, e: &Event) {
        let (name, file) = e.py_code();
        let hidden = self
            .opts
            .hide_frames
            .iter()
            .any(|h| name.contains(h.as_str()));
        let function = self.string(&name);
        let file = self.string(&file);
        self.py_codes
            .insert((process, e.addr as u32), (function, file, hidden));
    }

    /// Interns a Python frame (code slot and line of `process`).
    fn python_frame(&mut self, process: ProcessIdx, slot: u32, line: u32) -> (FrameId, Hide) {
        let (function, file, hidden) = match self.py_codes.get(&(process, slot)) {
            Some(code) => *code,
            None => (self.string("<unknown Python function>"), StringId(0), false),
        };
        if let Some(f) = self.py_frames.get(&(function, file, line)) {
            return *f;
        }
        let id = FrameId(self.next_frame);
        self.next_frame += 1;
        self.enc.record(&Record::Frame(FrameDef::Python {
            id,
            function,
            file,
            line,
        }));
        let hide = if hidden { Hide::Always } else { Hide::Never };
        self.py_frames.insert((function, file, line), (id, hide));
        (id, hide)
    }

    /// Interns a frame; returns its id and whether it is hidden at the top of a stack.
    fn frame(&mut self, process: ProcessIdx, ip: u64) -> (FrameId, Hide) {
        if let Some((slot, line)) = python_frame::decode(ip) {
            return self.python_frame(process, slot, line);
        }
        let mut found = self.find_module(process, ip);
        if found.is_none() {
            self.refresh_modules(process);
            found = self.find_module(process, ip);
        }
        let (module, offset, path) = match found {
            Some(m) => (m.id, ip - m.bias, m.path),
            None => (ModuleId(0), ip, String::new()),
        };
        if let Some(f) = self.frames.get(&(module, offset)) {
            return *f;
        }
        let id = FrameId(self.next_frame);
        self.next_frame += 1;
        self.enc
            .record(&Record::Frame(FrameDef::Native { id, module, offset }));
        let mut hide = module_hidden(&path);
        if !path.is_empty() {
            // Return addresses point after the call: look up the call instruction.
            let sym = self.symbolizer.resolve(&path, offset.saturating_sub(1));
            if !sym.function.is_empty() {
                let hidden = HIDDEN_FUNCTION_PREFIXES
                    .iter()
                    .any(|p| sym.function.starts_with(p))
                    || self
                        .opts
                        .hide_frames
                        .iter()
                        .any(|h| sym.function.contains(h.as_str()));
                if hidden {
                    hide = Hide::Always;
                }
                let function = self.string(&sym.function);
                let file = self.string(&sym.file);
                self.enc.record(&Record::FrameSymbol(FrameSymbol {
                    frame: id,
                    function,
                    file,
                    line: sym.line,
                }));
            }
        }
        self.frames.insert((module, offset), (id, hide));
        (id, hide)
    }

    fn stack(&mut self, process: ProcessIdx, ips: &[u64]) -> StackId {
        if ips.is_empty() {
            return StackId(0);
        }
        // Lookup by borrowed key: build the key without allocating when it is already known.
        let key = (process, Box::<[u64]>::from(ips));
        if let Some(s) = self.stack_cache.get(&key) {
            return *s;
        }
        let s = self.intern_stack(process, ips);
        self.stack_cache.insert(key, s);
        s
    }

    fn intern_stack(&mut self, process: ProcessIdx, ips: &[u64]) -> StackId {
        let mut frames: Vec<FrameId> = Vec::with_capacity(ips.len());
        let python = ips.iter().any(|&ip| python_frame::decode(ip).is_some());
        let mut leading = true;
        for &ip in ips {
            let (f, hide) = self.frame(process, ip);
            let hidden = match hide {
                Hide::Never => false,
                Hide::Always => true,
                Hide::UnderPython => python,
            };
            if leading && hidden {
                continue;
            }
            leading = false;
            frames.push(f);
        }
        let mut parent = StackId(0);
        for &frame in frames.iter().rev() {
            parent = self.interner.stack(&mut self.enc, parent, frame);
        }
        parent
    }

    /// A FREE event: pairs it with the live allocation at that address.
    fn free_alloc(&mut self, process: ProcessIdx, thread: ThreadIdx, ts: u64, e: &Event) {
        let (addr, kind, stream, device) = (
            e.addr,
            FreeKind::from_code(u64::from(e.code)),
            e.stream,
            DeviceIdx(e.device),
        );
        match self.allocs.remove(&(process, addr)) {
            Some((alloc, ..)) => {
                if self.torch_layout.tracks(process) {
                    self.torch_layout.segment_freed(process, addr);
                }
                self.enc.record(&Record::Free(Free {
                    ts_nanos: ts,
                    alloc,
                    thread,
                    kind,
                    stream,
                }));
            }
            None => {
                self.enc.record(&Record::FreeUnknown(FreeUnknown {
                    ts_nanos: ts,
                    address: addr,
                    size_bytes: 0,
                    thread,
                    device,
                    kind,
                    process,
                }));
            }
        }
    }

    /// The NVTX domain of a range or mark event: its name, or its handle when unnamed.
    fn domain(&mut self, e: &Event) -> StringId {
        let name = e.domain_name();
        if !name.is_empty() {
            self.string(&name)
        } else if e.stream != 0 {
            self.string(&format!("domain {:#x}", e.stream))
        } else {
            StringId(0)
        }
    }

    /// Records one event of `process`.
    pub fn event(&mut self, process: ProcessIdx, e: &Event) {
        self.events += 1;
        let ts = self.ts(e.ts_nanos);
        if e.kind == kind::THREAD {
            let name = e.text();
            self.thread(process, e.tid, Some(&name));
            return;
        }
        if e.kind == kind::MODULE {
            self.module(process, e);
            return;
        }
        if e.kind == kind::POOL_SAMPLE {
            self.enc.record(&Record::PoolSample(PoolSample {
                ts_nanos: ts,
                device: DeviceIdx(e.device),
                pool: e.addr,
                reserved_bytes: e.size,
                used_bytes: e.stream,
                process,
            }));
            return;
        }
        if e.kind == kind::PY_CODE {
            self.py_code(process, e);
            return;
        }
        if e.kind == kind::CMDLINE || e.kind == kind::EXE {
            let text = e.text();
            if let Some(info) = self.process_info.get_mut(&process) {
                if e.kind == kind::EXE {
                    info.exe = text;
                } else {
                    info.argv = text
                        .split('\0')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                }
                let info = info.clone();
                self.enc.record(&Record::Process(info));
            }
            return;
        }
        let thread = self.thread(process, e.tid, None);
        let device = DeviceIdx(e.device);
        match e.kind {
            kind::ALLOC | kind::VMM_CREATE => {
                let stack = self.stack(process, e.frames());
                let (alloc_kind, size) = if e.code == alloc_kind::TORCH_BLOCK {
                    if !self.torch_layout.tracks(process) {
                        // The first PyTorch block of this process: its layout starts from the
                        // driver allocations live now (other processes pay nothing).
                        let live = self.allocs.iter().filter(|(k, _)| k.0 == process);
                        self.torch_layout.start(
                            process,
                            live.map(|(&(_, addr), &(_, d, size))| (d, addr, size)),
                        );
                    }
                    let size = self.torch_layout.block(process, device, e.addr, e.size);
                    (AllocKind::FrameworkBlock, size)
                } else {
                    (AllocKind::from_code(u64::from(e.code)), e.size)
                };
                if e.kind == kind::ALLOC
                    && alloc_kind == AllocKind::Device
                    && self.torch_layout.tracks(process)
                {
                    self.torch_layout.segment(process, device, e.addr, e.size);
                }
                let id = self.enc.alloc(&Alloc {
                    ts_nanos: ts,
                    size_bytes: size,
                    address: e.addr,
                    stack,
                    thread,
                    device,
                    kind: alloc_kind,
                    stream: e.stream,
                    pool: e.pool,
                    process,
                    ..Alloc::default()
                });
                if alloc_kind == AllocKind::FrameworkBlock {
                    self.framework_blocks.insert((process, device, e.addr), id);
                } else if e.kind == kind::VMM_CREATE {
                    self.vmm.insert(
                        (process, e.addr),
                        VmmHandle {
                            alloc: id,
                            device,
                            maps: 0,
                            released: false,
                        },
                    );
                } else {
                    self.allocs.insert((process, e.addr), (id, device, e.size));
                }
            }
            kind::FREE => {
                self.free_alloc(process, thread, ts, e);
            }
            kind::FRAMEWORK_FREE => {
                // A free whose block is unknown was lost with its allocation, which the
                // framework's notice reports; it is no bad free of the program's.
                self.torch_layout.block_freed(process, device, e.addr);
                if let Some(alloc) = self.framework_blocks.remove(&(process, device, e.addr)) {
                    self.enc.record(&Record::Free(Free {
                        ts_nanos: ts,
                        alloc,
                        thread,
                        kind: FreeKind::Immediate,
                        stream: e.stream,
                    }));
                }
            }
            kind::ALLOC_FAILED => {
                let stack = self.stack(process, e.frames());
                self.enc.record(&Record::AllocFailed(AllocFailed {
                    ts_nanos: ts,
                    size_bytes: e.size,
                    error_code: e.code,
                    stack,
                    thread,
                    device,
                    kind: AllocKind::from_code(e.pool),
                    process,
                }));
            }
            kind::CONTEXT_RESET => {
                self.enc.record(&Record::ContextReset(ContextReset {
                    ts_nanos: ts,
                    process,
                    device,
                    thread,
                }));
                self.allocs
                    .retain(|(p, _), (_, d, _)| !(*p == process && *d == device));
                self.framework_blocks
                    .retain(|(p, d, _), _| !(*p == process && *d == device));
                self.torch_layout.reset(process, device);
                self.vmm
                    .retain(|(p, _), h| !(*p == process && h.device == device));
            }
            kind::VMM_RELEASE => {
                if let Some(h) = self.vmm.get_mut(&(process, e.addr)) {
                    h.released = true;
                    if h.maps == 0 {
                        let alloc = h.alloc;
                        self.vmm.remove(&(process, e.addr));
                        self.enc.record(&Record::Free(Free {
                            ts_nanos: ts,
                            alloc,
                            thread,
                            kind: FreeKind::Immediate,
                            stream: 0,
                        }));
                    }
                }
            }
            kind::VMM_MAP => {
                if let Some(h) = self.vmm.get_mut(&(process, e.pool)) {
                    h.maps += 1;
                }
                self.vmm_maps.insert((process, e.addr), (e.pool, e.size));
            }
            kind::VMM_UNMAP => {
                let end = e.addr.saturating_add(e.size.max(1));
                let hit: Vec<(ProcessIdx, u64)> = self
                    .vmm_maps
                    .range((process, e.addr)..(process, end))
                    .map(|(k, _)| *k)
                    .collect();
                for k in hit {
                    let Some((handle, _)) = self.vmm_maps.remove(&k) else {
                        continue;
                    };
                    if let Some(h) = self.vmm.get_mut(&(process, handle)) {
                        h.maps = h.maps.saturating_sub(1);
                        if h.maps == 0 && h.released {
                            let alloc = h.alloc;
                            self.vmm.remove(&(process, handle));
                            self.enc.record(&Record::Free(Free {
                                ts_nanos: ts,
                                alloc,
                                thread,
                                kind: FreeKind::Immediate,
                                stream: 0,
                            }));
                        }
                    }
                }
            }
            kind::RANGE_PUSH | kind::RANGE_START => {
                let range = RangeId(self.next_range);
                self.next_range += 1;
                let name = self.string(&e.text());
                let domain = self.domain(e);
                if e.kind == kind::RANGE_PUSH {
                    self.range_stacks
                        .entry((process, e.tid))
                        .or_default()
                        .push(range);
                } else {
                    self.started_ranges.insert((process, e.addr), range);
                }
                self.enc.record(&Record::RangeBegin(RangeBegin {
                    ts_nanos: ts,
                    range,
                    name,
                    domain,
                    thread,
                    process,
                }));
            }
            kind::RANGE_POP | kind::RANGE_END => {
                let range = if e.kind == kind::RANGE_POP {
                    self.range_stacks
                        .get_mut(&(process, e.tid))
                        .and_then(Vec::pop)
                } else {
                    self.started_ranges.remove(&(process, e.addr))
                };
                if let Some(range) = range {
                    self.enc.record(&Record::RangeEnd(RangeEnd {
                        ts_nanos: ts,
                        range,
                    }));
                }
            }
            kind::EXIT => {
                self.exit_status.insert(process, (ts, e.code as i32));
            }
            kind::NOTICE => {
                let message = self.string(&e.text());
                self.enc.record(&Record::Notice(Notice {
                    ts_nanos: ts,
                    process,
                    code: e.code,
                    message,
                }));
            }
            kind::MARK => {
                let name = self.string(&e.text());
                let domain = self.domain(e);
                self.enc.record(&Record::Mark(Mark {
                    ts_nanos: ts,
                    name,
                    domain,
                    thread,
                    process,
                }));
            }
            _ => {}
        }
    }

    /// Writes any record (devices, samples, exits, drops) as-is.
    pub fn record(&mut self, r: &Record) {
        self.enc.record(r);
    }

    /// Writes the bytes encoded so far to the output.
    /// Writes the bytes encoded so far. After a write error the trace is discarded from then
    /// on (the traced program keeps running and its events keep being drained, so it never
    /// stalls); the error is kept and reported by [`TraceWriter::finish`].
    pub fn flush(&mut self) -> Result<()> {
        let bytes = self.enc.take_bytes();
        if bytes.is_empty() || self.write_error.is_some() {
            return Ok(());
        }
        let r = self.out.write_all(&bytes).and_then(|()| self.out.flush());
        if let Err(e) = r {
            eprintln!(
                "gpucollect: cannot write the trace ({e}); the program keeps running untraced"
            );
            self.write_error = Some(e);
        }
        Ok(())
    }

    /// Ends the trace with an `End` record and flushes. Fails if the output failed at any point.
    pub fn finish(mut self) -> Result<W> {
        let ts = self.now_nanos();
        self.enc.record(&Record::End { ts_nanos: ts });
        self.flush()?;
        match self.write_error.take() {
            Some(e) => Err(e).context("the trace is incomplete: writing it failed"),
            None => Ok(self.out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::load;

    fn writer() -> TraceWriter<Vec<u8>> {
        let header = Header {
            start_mono_nanos: 1_000,
            ..Encoder::header_v1()
        };
        TraceWriter::new(&header, Vec::new(), WriterOptions::default())
    }

    fn ev(kind: u32, addr: u64, size: u64) -> Event {
        let mut e = Event::zeroed();
        e.kind = kind;
        e.addr = addr;
        e.size = size;
        e.tid = 7;
        e.ts_nanos = 2_000;
        e
    }

    fn finish(w: TraceWriter<Vec<u8>>) -> analysis_core::LoadedTrace {
        let bytes = w.finish().expect("finish");
        load(&bytes).expect("decodes")
    }

    #[test]
    fn one_unmap_covering_two_mappings_frees_both_released_handles() {
        let mut w = writer();
        let p = w.add_process(10, 1, "app".into(), vec![]);
        for h in [0xa, 0xb] {
            let mut e = ev(kind::VMM_CREATE, h, 1 << 21);
            e.code = AllocKind::VmmPhysical.code() as u32;
            w.event(p, &e);
        }
        for (va, h) in [(0x1000_0000, 0xa), (0x1020_0000, 0xb)] {
            let mut e = ev(kind::VMM_MAP, va, 1 << 21);
            e.pool = h;
            w.event(p, &e);
        }
        w.event(p, &ev(kind::VMM_RELEASE, 0xa, 0));
        w.event(p, &ev(kind::VMM_RELEASE, 0xb, 0));
        let mid = finish_clone(&mut w);
        assert_eq!(mid, 2, "released but mapped: both live");
        w.event(p, &ev(kind::VMM_UNMAP, 0x1000_0000, 4 << 20));
        let t = finish(w);
        assert!(t.model.allocs.iter().all(|a| !a.is_live()));
    }

    /// Live allocation count of what has been written so far.
    fn finish_clone(w: &mut TraceWriter<Vec<u8>>) -> usize {
        w.flush().expect("flush");
        let t = load(&w.out).expect("prefix decodes");
        t.model.allocs.iter().filter(|a| a.is_live()).count()
    }

    #[test]
    fn python_frames_become_python_frame_records_and_hide_the_interpreter_above_them() {
        use gpucollect_ring::event::python_frame;
        let header = Header {
            start_mono_nanos: 1_000,
            ..Encoder::header_v1()
        };
        let opts = WriterOptions {
            hide_frames: vec!["Pool.".into()],
        };
        let mut w = TraceWriter::new(&header, Vec::new(), opts);
        let p = w.add_process(10, 1, "python3".into(), vec![]);
        let mut m = ev(kind::MODULE, 0, 0);
        m.set_text(b"/usr/lib/libpython3.12.so.1.0");
        m.stream = 0x10_0000;
        m.pool = 0x1000;
        w.event(p, &m);
        for (slot, function) in [(3, "Pool.alloc"), (4, "train")] {
            let mut e = ev(kind::PY_CODE, slot, 0);
            e.stream = 1;
            e.set_py_code(function.as_bytes(), b"/srv/train.py");
            w.event(p, &e);
        }
        let interpreter = 0x10_0100;
        let stacks: [&[u64]; 3] = [
            // libpython, the wrapper `Pool.alloc` (--hide-frame), then its caller.
            &[
                interpreter,
                python_frame::encode(3, 10),
                python_frame::encode(4, 20),
            ],
            // A code slot never described.
            &[python_frame::encode(9, 5)],
            // No Python frame: the interpreter's frame is all there is, so it stays.
            &[interpreter],
        ];
        for (i, frames) in stacks.iter().enumerate() {
            let mut e = ev(kind::ALLOC, 0x100 * (i as u64 + 1), 64);
            e.data[..frames.len()].copy_from_slice(frames);
            e.nframes = frames.len() as u32;
            w.event(p, &e);
        }
        let t = finish(w);
        let m = &t.model;
        let view = |i: usize| m.stack_frames(m.allocs.at(i).stack);
        let first = view(0);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].python);
        assert_eq!(
            (
                first[0].function.as_str(),
                first[0].file.as_str(),
                first[0].line
            ),
            ("train", "/srv/train.py", 20)
        );
        assert_eq!(view(1)[0].function, "<unknown Python function>");
        let native = view(2);
        assert_eq!(native.len(), 1);
        assert!(!native[0].python);
        assert!(native[0].module.ends_with("libpython3.12.so.1.0"));
    }

    #[test]
    fn free_of_an_unknown_address_is_recorded_as_such() {
        let mut w = writer();
        let p = w.add_process(10, 1, "app".into(), vec![]);
        w.event(p, &ev(kind::FREE, 0xdead, 0));
        let t = finish(w);
        assert_eq!(t.model.free_unknown.len(), 1);
        assert_eq!(t.model.free_unknown[0].address, 0xdead);
    }

    #[test]
    fn context_reset_forgets_addresses_so_a_reused_address_is_a_new_allocation() {
        let mut w = writer();
        let p = w.add_process(10, 1, "app".into(), vec![]);
        w.event(p, &ev(kind::ALLOC, 0x100, 64));
        w.event(p, &ev(kind::CONTEXT_RESET, 0, 0));
        w.event(p, &ev(kind::ALLOC, 0x100, 32));
        w.event(p, &ev(kind::FREE, 0x100, 0));
        let t = finish(w);
        let a: Vec<_> = t.model.allocs.iter().collect();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].free_kind, FreeKind::ContextTeardown);
        assert_eq!(a[1].free_kind, FreeKind::Immediate);
        assert!(t.model.free_unknown.is_empty());
    }

    #[test]
    fn framework_blocks_have_addresses_apart_from_the_segments_holding_them() {
        use gpucollect_ring::event::alloc_kind;
        let mut w = writer();
        let p = w.add_process(10, 1, "app".into(), vec![]);
        w.event(p, &ev(kind::ALLOC, 0x100, 1 << 20)); // the framework's segment
        let mut block = ev(kind::ALLOC, 0x100, 512); // its first tensor, same address
        block.code = alloc_kind::FRAMEWORK_BLOCK;
        w.event(p, &block);
        w.event(p, &ev(kind::FRAMEWORK_FREE, 0x100, 0));
        // A block lost with the history's wrap: no bad free.
        w.event(p, &ev(kind::FRAMEWORK_FREE, 0x900, 0));
        let t = finish(w);
        let a: Vec<_> = t.model.allocs.iter().collect();
        assert_eq!(a.len(), 2);
        assert!(a[0].is_live(), "the segment outlives its tensor");
        assert_eq!(a[1].kind, AllocKind::FrameworkBlock);
        assert!(!a[1].is_live());
        assert!(t.model.free_unknown.is_empty());
    }

    #[test]
    fn processes_keep_separate_address_spaces_and_threads() {
        let mut w = writer();
        let p0 = w.add_process(10, 1, "app".into(), vec![]);
        let p1 = w.add_process(11, 10, String::new(), vec![]);
        w.event(p0, &ev(kind::ALLOC, 0x100, 1));
        w.event(p1, &ev(kind::ALLOC, 0x100, 2));
        w.event(p1, &ev(kind::FREE, 0x100, 0));
        let t = finish(w);
        let m = &t.model;
        assert_eq!(m.processes[1].parent, Some(p0));
        assert_eq!(
            m.processes[1].exe, "app",
            "a forked child inherits its parent's name"
        );
        assert!(m.allocs.at(0).is_live() && !m.allocs.at(1).is_live());
        assert_ne!(
            m.allocs.at(0).thread,
            m.allocs.at(1).thread,
            "same tid, different processes"
        );
    }
}
