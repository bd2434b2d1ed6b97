//! Writes format-v1 traces the way the collector does: interned strings, frames and stack-trie
//! nodes on first use, native frames resolved by `frame_symbol` records written after the run,
//! and every timed record at the writer's clock (`now`, nanoseconds).

use std::collections::HashMap;

use analysis_core::Encoder;
use analysis_core::encode::{Interner, RecordSink};
use analysis_core::format::*;

/// One frame of a call stack as the generator describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Fr {
    /// A Python frame: what the collector reads from the interpreter.
    Py {
        func: String,
        file: String,
        line: u32,
    },
    /// A native frame in a loaded module, with the symbol the collector resolves after the run
    /// (`file` empty for libraries shipped without line tables).
    Native {
        module: u32,
        offset: u64,
        func: String,
        file: String,
        line: u32,
    },
}

/// A Python frame.
pub fn py(func: &str, file: &str, line: u32) -> Fr {
    Fr::Py {
        func: func.into(),
        file: file.into(),
        line,
    }
}

/// A native frame.
pub fn native(module: u32, offset: u64, func: &str, file: &str, line: u32) -> Fr {
    Fr::Native {
        module,
        offset,
        func: func.into(),
        file: file.into(),
        line,
    }
}

/// Index of a stack in a [`Stacks`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackRef(pub usize);

/// The call stacks a program allocates from, innermost frame first.
#[derive(Clone, Debug, Default)]
pub struct Stacks(pub Vec<Vec<Fr>>);

impl Stacks {
    pub fn add(&mut self, frames: Vec<Fr>) -> StackRef {
        self.0.push(frames);
        StackRef(self.0.len() - 1)
    }

    pub fn frames(&self, r: StackRef) -> &[Fr] {
        self.0.get(r.0).map_or(&[], Vec::as_slice)
    }
}

#[derive(Debug)]
pub struct TraceWriter {
    enc: Encoder,
    int: Interner,
    frames: HashMap<Fr, FrameId>,
    stack_ids: HashMap<usize, StackId>,
    symbols: Vec<FrameSymbol>,
    /// Clock of the next timed record, nanoseconds since the trace's origin.
    pub now: u64,
}

impl TraceWriter {
    pub fn new(argv: &[&str]) -> Self {
        let mut h = Encoder::header_v1();
        h.collector = "gpucollect 0.1.0".into();
        h.host = "gpu-node-07".into();
        h.argv = argv.iter().map(|s| (*s).to_string()).collect();
        h.start_mono_nanos = 8_815_000_000_000;
        h.wall_offset_nanos = 1_795_428_600_000_000_000 - 8_815_000_000_000;
        Self {
            enc: Encoder::new(&h),
            int: Interner::default(),
            frames: HashMap::new(),
            stack_ids: HashMap::new(),
            symbols: Vec::new(),
            now: 0,
        }
    }

    pub fn record(&mut self, r: Record) -> Option<AllocId> {
        self.enc.emit(r)
    }

    pub fn string(&mut self, s: &str) -> StringId {
        self.int.string(&mut self.enc, s)
    }

    pub fn process(&mut self, idx: u32, pid: u32, parent: Option<u32>, exe: &str, argv: &[&str]) {
        self.record(Record::Process(ProcessInfo {
            process: ProcessIdx(idx),
            pid,
            parent: parent.map(ProcessIdx),
            exe: exe.into(),
            argv: argv.iter().map(|s| (*s).to_string()).collect(),
        }));
    }

    pub fn device(&mut self, idx: u32, name: &str, total_bytes: u64) {
        self.record(Record::Device(DeviceInfo {
            device: DeviceIdx(idx),
            uuid: format!("GPU-5f1c{idx:04x}-8d2e-4c1a-9b7e-0000000000{idx:02}"),
            name: name.into(),
            total_bytes,
        }));
    }

    pub fn thread(&mut self, idx: u32, process: u32, tid: u64, name: &str) {
        let name = self.string(name);
        self.record(Record::Thread(ThreadInfo {
            thread: ThreadIdx(idx),
            process: ProcessIdx(process),
            os_tid: tid,
            name,
        }));
    }

    pub fn module(&mut self, id: u32, process: u32, path: &str, load_address: u64, size: u64) {
        self.record(Record::Module(ModuleInfo {
            module: ModuleId(id),
            process: ProcessIdx(process),
            path: path.into(),
            build_id: path.bytes().take(20).collect(),
            load_address,
            size_bytes: size,
        }));
    }

    fn frame(&mut self, f: &Fr) -> FrameId {
        if let Some(&id) = self.frames.get(f) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32 + 1);
        match f {
            Fr::Py { func, file, line } => {
                let function = self.string(func);
                let file = self.string(file);
                self.record(Record::Frame(FrameDef::Python {
                    id,
                    function,
                    file,
                    line: *line,
                }));
            }
            Fr::Native {
                module,
                offset,
                func,
                file,
                line,
            } => {
                self.record(Record::Frame(FrameDef::Native {
                    id,
                    module: ModuleId(*module),
                    offset: *offset,
                }));
                let function = self.string(func);
                let file = if file.is_empty() {
                    StringId(0)
                } else {
                    self.string(file)
                };
                self.symbols.push(FrameSymbol {
                    frame: id,
                    function,
                    file,
                    line: *line,
                });
            }
        }
        self.frames.insert(f.clone(), id);
        id
    }

    /// The trace's stack id of `r`, writing its frames and trie nodes the first time.
    pub fn stack(&mut self, table: &Stacks, r: StackRef) -> StackId {
        if let Some(&s) = self.stack_ids.get(&r.0) {
            return s;
        }
        let mut parent = StackId(0);
        for f in table.frames(r).iter().rev() {
            let frame = self.frame(f);
            parent = self.int.stack(&mut self.enc, parent, frame);
        }
        self.stack_ids.insert(r.0, parent);
        parent
    }

    pub fn alloc(&mut self, a: Alloc) -> AllocId {
        self.enc.alloc(&Alloc {
            ts_nanos: self.now,
            ..a
        })
    }

    pub fn free(&mut self, alloc: AllocId, thread: u32, kind: FreeKind, stream: u64) {
        self.record(Record::Free(Free {
            ts_nanos: self.now,
            alloc,
            thread: ThreadIdx(thread),
            kind,
            stream,
        }));
    }

    pub fn pool_sample(&mut self, process: u32, device: u32, pool: u64, reserved: u64, used: u64) {
        self.record(Record::PoolSample(PoolSample {
            ts_nanos: self.now,
            device: DeviceIdx(device),
            pool,
            reserved_bytes: reserved,
            used_bytes: used,
            process: ProcessIdx(process),
        }));
    }

    pub fn device_sample(&mut self, device: u32, total: u64, processes: &[(u32, u64)]) {
        let used: u64 = processes.iter().map(|p| p.1).sum();
        self.record(Record::DeviceSample(DeviceSample {
            ts_nanos: self.now,
            device: DeviceIdx(device),
            total_bytes: total,
            free_bytes: total.saturating_sub(used),
            used_bytes: used,
            processes: processes
                .iter()
                .map(|&(pid, used_bytes)| ProcessUsage { pid, used_bytes })
                .collect(),
        }));
    }

    pub fn range_begin(&mut self, range: u64, name: &str, thread: u32, process: u32) {
        let name = self.string(name);
        self.record(Record::RangeBegin(RangeBegin {
            ts_nanos: self.now,
            range: RangeId(range),
            name,
            domain: StringId(0),
            thread: ThreadIdx(thread),
            process: ProcessIdx(process),
        }));
    }

    pub fn range_end(&mut self, range: u64) {
        self.record(Record::RangeEnd(RangeEnd {
            ts_nanos: self.now,
            range: RangeId(range),
        }));
    }

    #[allow(clippy::too_many_arguments)]
    pub fn alloc_failed(
        &mut self,
        size: u64,
        stack: StackId,
        thread: u32,
        device: u32,
        kind: AllocKind,
        process: u32,
    ) {
        self.record(Record::AllocFailed(AllocFailed {
            ts_nanos: self.now,
            size_bytes: size,
            error_code: 2,
            stack,
            thread: ThreadIdx(thread),
            device: DeviceIdx(device),
            kind,
            process: ProcessIdx(process),
        }));
    }

    pub fn process_exit(&mut self, process: u32, code: Option<i32>, signal: Option<i32>) {
        self.record(Record::ProcessExit(ProcessExit {
            ts_nanos: self.now,
            process: ProcessIdx(process),
            code,
            signal,
        }));
    }

    pub fn context_reset(&mut self, process: u32, device: u32, thread: u32) {
        self.record(Record::ContextReset(ContextReset {
            ts_nanos: self.now,
            process: ProcessIdx(process),
            device: DeviceIdx(device),
            thread: ThreadIdx(thread),
        }));
    }

    /// Writes the symbols of the native frames (the collector resolves them after the run),
    /// then `end` when the program finished cleanly, and returns the trace bytes.
    pub fn finish(mut self, clean_end: bool) -> Vec<u8> {
        for s in std::mem::take(&mut self.symbols) {
            self.record(Record::FrameSymbol(s));
        }
        if clean_end {
            self.record(Record::End { ts_nanos: self.now });
        }
        self.enc.into_bytes()
    }
}

/// xorshift64*: small, deterministic.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next_u64() % (hi - lo + 1)
        }
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den.max(1) < num
    }
}
