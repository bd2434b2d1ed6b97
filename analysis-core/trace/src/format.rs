//! Trace format v1: the record types shared by the encoder, the decoder and the model.
//!
//! `FORMAT.md` at the repository root is the specification; this module is its Rust mirror.
//! Times in records are absolute nanoseconds since the trace's clock origin
//! (`Header::start_mono_nanos`); on the wire they are signed deltas from the previous timed record.
//! Allocation ids are implicit: the n-th `Alloc` record of a trace has id n (from 0).

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

/// First element of the header array.
pub const MAGIC: &str = "gpucollect-trace";
/// Major format version: a reader refuses a newer major version.
pub const FORMAT_MAJOR: u32 = 1;
/// Minor format version: newer minors only add record tags, trailing fields and header keys.
pub const FORMAT_MINOR: u32 = 3;

/// Record tags (first element of every record array).
pub mod tag {
    pub const PROCESS: u64 = 1;
    pub const DEVICE: u64 = 2;
    pub const MODULE: u64 = 3;
    pub const STRING: u64 = 4;
    pub const FRAME: u64 = 5;
    pub const STACK: u64 = 6;
    pub const THREAD: u64 = 7;
    pub const FRAME_SYMBOL: u64 = 8;
    pub const ALLOC: u64 = 16;
    pub const FREE: u64 = 17;
    pub const ALLOC_FAILED: u64 = 18;
    pub const RANGE_BEGIN: u64 = 19;
    pub const RANGE_END: u64 = 20;
    pub const MARK: u64 = 21;
    pub const DEVICE_SAMPLE: u64 = 22;
    pub const POOL_SAMPLE: u64 = 23;
    pub const PROCESS_EXIT: u64 = 24;
    pub const DROPPED: u64 = 25;
    pub const END: u64 = 26;
    pub const CONTEXT_RESET: u64 = 27;
    pub const FREE_UNKNOWN: u64 = 28;
    /// Since 1.1.
    pub const NOTICE: u64 = 29;
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);
    };
}

typed_id!(
    /// Trace-local process index (0 = the traced program).
    ProcessIdx,
    u32
);
typed_id!(
    /// Trace-local thread index (not an OS thread id; see `ThreadInfo`).
    ThreadIdx,
    u32
);
typed_id!(
    /// CUDA device ordinal as seen by the traced process.
    DeviceIdx,
    u32
);
typed_id!(
    /// Interned string id; 0 means "no string".
    StringId,
    u32
);
typed_id!(
    /// Interned frame id.
    FrameId,
    u32
);
typed_id!(
    /// Interned stack id; 0 is the empty (unknown) stack.
    StackId,
    u32
);
typed_id!(
    /// Loaded-module id.
    ModuleId,
    u32
);
typed_id!(
    /// Implicit allocation id: the n-th `Alloc` record of the trace.
    AllocId,
    u64
);
typed_id!(
    /// NVTX range instance id, chosen by the writer.
    RangeId,
    u64
);

/// The trace header, the first value of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Header {
    pub format_major: u32,
    pub format_minor: u32,
    /// Name and version of the program that wrote the trace.
    pub collector: String,
    pub host: String,
    /// Command line of the traced program.
    pub argv: Vec<String>,
    /// Monotonic clock reading (ns) that record time 0 corresponds to.
    pub start_mono_nanos: u64,
    /// Wall clock (ns since the Unix epoch) = monotonic + this offset.
    pub wall_offset_nanos: i64,
    /// What the end of the trace is (header key `ends_at`, since 1.2; absent: [`TraceEnd::Exit`]).
    pub ends_at: TraceEnd,
}

/// What the end of a trace's history is (the header's `ends_at`, since format 1.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEnd {
    /// The traced programs ran until they exited (or until the trace was cut short, which a
    /// missing `end` record says): memory live at the end was never freed.
    #[default]
    Exit,
    /// The history ends at a snapshot of a program that was still running (an imported
    /// PyTorch memory snapshot): memory live at the end is live at that moment, not leaked.
    Snapshot,
}

impl TraceEnd {
    /// The header value (`ends_at`) that stands for it; `Exit` is written as no key at all.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Exit => "exit",
            Self::Snapshot => "snapshot",
        }
    }

    /// The end a header value names: `"snapshot"`, else (`"exit"`, or a value a newer
    /// version defines) `Exit`.
    pub fn from_name(name: &str) -> Self {
        match name {
            "snapshot" => Self::Snapshot,
            _ => Self::Exit,
        }
    }
}

/// What kind of memory an allocation is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocKind {
    #[default]
    Device,
    Managed,
    PinnedHost,
    /// cuMemAllocAsync / cuMemAllocFromPoolAsync.
    StreamOrderedPool,
    /// cuMemCreate physical memory (VMM).
    VmmPhysical,
    Array,
    /// Memory mapped in from another process (IPC handle).
    IpcImport,
    /// A block a framework's caching allocator handed out (a PyTorch tensor's storage, a CuPy
    /// pool block), inside memory the framework reserved from the driver, which the trace
    /// records as that reserve's own driver allocations. Not device memory of its own: counting
    /// it too would count the reserve twice (since format 1.3).
    FrameworkBlock,
    /// Unrecognised value written by a newer collector.
    Other,
}

impl AllocKind {
    pub const fn code(self) -> u64 {
        match self {
            Self::Device => 0,
            Self::Managed => 1,
            Self::PinnedHost => 2,
            Self::StreamOrderedPool => 3,
            Self::VmmPhysical => 4,
            Self::Array => 5,
            Self::IpcImport => 6,
            Self::FrameworkBlock => 7,
            Self::Other => 255,
        }
    }
    pub const fn from_code(code: u64) -> Self {
        match code {
            0 => Self::Device,
            1 => Self::Managed,
            2 => Self::PinnedHost,
            3 => Self::StreamOrderedPool,
            4 => Self::VmmPhysical,
            5 => Self::Array,
            6 => Self::IpcImport,
            7 => Self::FrameworkBlock,
            _ => Self::Other,
        }
    }
    /// Whether the memory counts toward device live bytes (FORMAT.md, "Accounting rules"):
    /// kinds 0, 1, 3, 4 and 5 only. Pinned host memory has totals of its own; an IPC import is
    /// the exporting process's allocation, which counts it; kind 255 and codes this version does
    /// not know ([`AllocKind::Other`]) are not device memory.
    pub const fn is_device_memory(self) -> bool {
        matches!(
            self,
            Self::Device
                | Self::Managed
                | Self::StreamOrderedPool
                | Self::VmmPhysical
                | Self::Array
        )
    }
    /// Whether the allocation counts in a live-bytes series: device memory, or pinned host
    /// memory in its own per-process series. IPC imports and unknown kinds count in neither.
    pub const fn is_tracked(self) -> bool {
        self.is_device_memory() || matches!(self, Self::PinnedHost)
    }
    pub const fn name(self) -> &'static str {
        match self {
            Self::Device => "device",
            Self::Managed => "managed",
            Self::PinnedHost => "pinned_host",
            Self::StreamOrderedPool => "stream_ordered_pool",
            Self::VmmPhysical => "vmm_physical",
            Self::Array => "array",
            Self::IpcImport => "ipc_import",
            Self::FrameworkBlock => "framework_block",
            Self::Other => "other",
        }
    }
}

/// How an allocation was released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FreeKind {
    /// cuMemFree and friends.
    #[default]
    Immediate,
    /// cuMemFreeAsync: released when the stream reaches the free.
    StreamOrdered,
    /// Released implicitly by cuCtxDestroy / cuDevicePrimaryCtxReset / cudaDeviceReset.
    ContextTeardown,
    Other,
}

impl FreeKind {
    pub const fn code(self) -> u64 {
        match self {
            Self::Immediate => 0,
            Self::StreamOrdered => 1,
            Self::ContextTeardown => 2,
            Self::Other => 255,
        }
    }
    pub const fn from_code(code: u64) -> Self {
        match code {
            0 => Self::Immediate,
            1 => Self::StreamOrdered,
            2 => Self::ContextTeardown,
            _ => Self::Other,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub process: ProcessIdx,
    pub pid: u32,
    /// Trace-local index of the parent, if it is traced too.
    pub parent: Option<ProcessIdx>,
    pub exe: String,
    pub argv: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    pub device: DeviceIdx,
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModuleInfo {
    pub module: ModuleId,
    pub process: ProcessIdx,
    pub path: String,
    pub build_id: Vec<u8>,
    pub load_address: u64,
    pub size_bytes: u64,
}

/// A frame before symbolization: native (module + offset) or Python (already symbolic).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FrameDef {
    Native {
        id: FrameId,
        module: ModuleId,
        offset: u64,
    },
    Python {
        id: FrameId,
        function: StringId,
        file: StringId,
        line: u32,
    },
}

impl FrameDef {
    pub const fn id(&self) -> FrameId {
        match self {
            Self::Native { id, .. } | Self::Python { id, .. } => *id,
        }
    }
}

/// Symbol information for a native frame, written after the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrameSymbol {
    pub frame: FrameId,
    pub function: StringId,
    pub file: StringId,
    pub line: u32,
}

/// One node of the stack trie: `stack` = `frame` called from `parent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StackDef {
    pub stack: StackId,
    pub parent: StackId,
    pub frame: FrameId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadInfo {
    pub thread: ThreadIdx,
    pub process: ProcessIdx,
    pub os_tid: u64,
    pub name: StringId,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Alloc {
    pub ts_nanos: u64,
    /// Assigned by position; ignored by the encoder.
    pub id: AllocId,
    pub size_bytes: u64,
    pub address: u64,
    pub stack: StackId,
    pub thread: ThreadIdx,
    pub device: DeviceIdx,
    pub kind: AllocKind,
    pub stream: u64,
    pub pool: u64,
    pub process: ProcessIdx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Free {
    pub ts_nanos: u64,
    pub alloc: AllocId,
    pub thread: ThreadIdx,
    pub kind: FreeKind,
    pub stream: u64,
}

/// A free of memory the trace never saw allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FreeUnknown {
    pub ts_nanos: u64,
    pub address: u64,
    /// 0 when unknown.
    pub size_bytes: u64,
    pub thread: ThreadIdx,
    pub device: DeviceIdx,
    pub kind: FreeKind,
    pub process: ProcessIdx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocFailed {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    /// CUresult (2 = CUDA_ERROR_OUT_OF_MEMORY).
    pub error_code: u32,
    pub stack: StackId,
    pub thread: ThreadIdx,
    pub device: DeviceIdx,
    pub kind: AllocKind,
    pub process: ProcessIdx,
}

impl AllocFailed {
    /// Whether the device had no memory for it (CUresult and cudaError_t both use 2). Other
    /// failures are not an out-of-memory: PyTorch's expandable segments, for one, probe
    /// `cuMemCreate` with a shareable handle type and fall back on CUDA_ERROR_NOT_PERMITTED (800).
    pub const fn is_out_of_memory(&self) -> bool {
        self.error_code == 2
    }
}

/// The name of an allocation's error code (CUresult; the runtime's cudaError_t shares the
/// common ones), e.g. `CUDA_ERROR_NOT_PERMITTED` for 800; None for codes an allocation does not
/// return.
pub const fn cuda_error_name(code: u32) -> Option<&'static str> {
    Some(match code {
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        709 => "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RangeBegin {
    pub ts_nanos: u64,
    pub range: RangeId,
    pub name: StringId,
    pub domain: StringId,
    pub thread: ThreadIdx,
    pub process: ProcessIdx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RangeEnd {
    pub ts_nanos: u64,
    pub range: RangeId,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Mark {
    pub ts_nanos: u64,
    pub name: StringId,
    pub domain: StringId,
    pub thread: ThreadIdx,
    pub process: ProcessIdx,
}

/// Per-process device memory as NVML reports it (host PIDs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessUsage {
    pub pid: u32,
    pub used_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceSample {
    pub ts_nanos: u64,
    pub device: DeviceIdx,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub processes: Vec<ProcessUsage>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolSample {
    pub ts_nanos: u64,
    pub device: DeviceIdx,
    /// Pool handle: [`pool::DEFAULT`] (the device's default pool, or a framework's caching
    /// allocator), [`pool::GRAPH_MEMORY`] (the device's CUDA graph memory), or the driver's
    /// handle of a pool the program created.
    pub pool: u64,
    pub reserved_bytes: u64,
    pub used_bytes: u64,
    pub process: ProcessIdx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessExit {
    pub ts_nanos: u64,
    pub process: ProcessIdx,
    /// Exit code, when the process exited.
    pub code: Option<i32>,
    /// Signal number, when the process was killed.
    pub signal: Option<i32>,
}

/// Something the collector must tell the reader about the capture itself (since format 1.1):
/// for example that a process ran untraced because another CUPTI client held the subscription.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Notice {
    pub ts_nanos: u64,
    pub process: ProcessIdx,
    /// A [`notice_code`].
    pub code: u32,
    pub message: StringId,
}

/// Special values of [`PoolSample::pool`].
pub mod pool {
    use alloc::format;
    use alloc::string::String;

    /// The device's default stream-ordered pool (or a framework's caching allocator).
    pub const DEFAULT: u64 = 0;
    /// The device's CUDA graph memory (graph memory nodes), since 1.1.
    pub const GRAPH_MEMORY: u64 = u64::MAX;

    /// How a pool is named to users: "default pool", "graph memory" or "pool 0x…".
    pub fn label(pool: u64) -> String {
        match pool {
            DEFAULT => "default pool".into(),
            GRAPH_MEMORY => "graph memory".into(),
            p => format!("pool {p:#x}"),
        }
    }
}

/// Codes of [`Notice`] records.
pub mod notice_code {
    /// Another CUPTI client (Nsight Systems, torch.profiler) holds the subscription: the
    /// process ran untraced.
    pub const CUPTI_BUSY: u32 = 1;
    /// libcupti was not found: the process ran untraced.
    pub const CUPTI_MISSING: u32 = 2;
    /// The capture could not start for another reason (the message says which).
    pub const CAPTURE_FAILED: u32 = 3;
    /// A framework's allocation history (PyTorch's, read by gpucollect's Python fallback) lost
    /// entries before they were read: the process was traced, but some of its framework blocks
    /// and their frees are missing (since format 1.3).
    pub const FRAMEWORK_HISTORY_LOST: u32 = 4;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Dropped {
    pub ts_nanos: u64,
    pub process: ProcessIdx,
    pub count: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ContextReset {
    pub ts_nanos: u64,
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub thread: ThreadIdx,
}

/// One decoded record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    Process(ProcessInfo),
    Device(DeviceInfo),
    Module(ModuleInfo),
    String { id: StringId, value: String },
    Frame(FrameDef),
    FrameSymbol(FrameSymbol),
    Stack(StackDef),
    Thread(ThreadInfo),
    Alloc(Alloc),
    Free(Free),
    FreeUnknown(FreeUnknown),
    AllocFailed(AllocFailed),
    RangeBegin(RangeBegin),
    RangeEnd(RangeEnd),
    Mark(Mark),
    DeviceSample(DeviceSample),
    PoolSample(PoolSample),
    ProcessExit(ProcessExit),
    Dropped(Dropped),
    ContextReset(ContextReset),
    Notice(Notice),
    End { ts_nanos: u64 },
}

impl Record {
    /// The record's time, for timed records.
    pub const fn ts_nanos(&self) -> Option<u64> {
        match self {
            Self::Alloc(r) => Some(r.ts_nanos),
            Self::Free(r) => Some(r.ts_nanos),
            Self::FreeUnknown(r) => Some(r.ts_nanos),
            Self::AllocFailed(r) => Some(r.ts_nanos),
            Self::RangeBegin(r) => Some(r.ts_nanos),
            Self::RangeEnd(r) => Some(r.ts_nanos),
            Self::Mark(r) => Some(r.ts_nanos),
            Self::DeviceSample(r) => Some(r.ts_nanos),
            Self::PoolSample(r) => Some(r.ts_nanos),
            Self::ProcessExit(r) => Some(r.ts_nanos),
            Self::Dropped(r) => Some(r.ts_nanos),
            Self::Notice(r) => Some(r.ts_nanos),
            Self::ContextReset(r) => Some(r.ts_nanos),
            Self::End { ts_nanos } => Some(*ts_nanos),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kinds_0_1_3_4_5_are_device_memory() {
        let device: Vec<u64> = (0..=255)
            .map(AllocKind::from_code)
            .filter(|k| k.is_device_memory())
            .map(AllocKind::code)
            .collect();
        assert_eq!(device, [0, 1, 3, 4, 5]);
        // Unknown codes read as "other" and are written back as 255.
        assert_eq!(AllocKind::from_code(8), AllocKind::Other);
        assert_eq!(AllocKind::from_code(8).code(), 255);
        // A framework's block (since 1.3) keeps its code and is not device memory.
        assert_eq!(AllocKind::from_code(7), AllocKind::FrameworkBlock);
        assert_eq!(AllocKind::FrameworkBlock.code(), 7);
        assert_eq!(FreeKind::from_code(9), FreeKind::Other);
    }
}
