//! The one serializable `Report` that the CLI, the viewer and the server all render: types
//! only. `analysis` fills it (trace-level facts in `analysis::facts`, then every detector's
//! findings, notes, score and section); this module depends on nothing of `analysis`.

mod finding;
mod sections;
mod starts;

pub use finding::{Finding, FindingKind, Impact, Recommendation, Severity};
pub use sections::*;
pub use starts::Starts;

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use crate::format::*;

/// Bytes and count attributed to one call site.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteBytes {
    pub stack: StackId,
    /// Innermost frame, one line.
    pub site: String,
    /// Full stack, innermost first.
    pub frames: Vec<String>,
    pub bytes: u64,
    pub count: u64,
    /// Threads that made these allocations.
    pub threads: Vec<ThreadIdx>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceSummary {
    pub device: DeviceIdx,
    pub name: String,
    pub total_bytes: u64,
    pub peak_bytes: u64,
    pub peak_ts_nanos: u64,
    pub live_at_end_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessSummary {
    pub process: ProcessIdx,
    pub pid: u32,
    pub exe: String,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// The process ended but its status is unknown (a child that left through `_exit` or was
    /// killed: only its parent could wait for it).
    #[serde(skip_serializing_if = "core::ops::Not::not")]
    pub exit_status_unknown: bool,
    pub peak_bytes: u64,
    pub live_at_end_bytes: u64,
}

/// Pinned host memory of one process: its own totals, never in the device's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PinnedHostSummary {
    pub process: ProcessIdx,
    pub peak_bytes: u64,
    pub live_at_end_bytes: u64,
}

/// The framework layer of one process on one device (FORMAT.md, "Two layers"): its tensors, as
/// `torch.cuda.memory_allocated()` counts them, inside the reserve the device totals show.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocatedSummary {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub peak_bytes: u64,
    pub peak_ts_nanos: u64,
    pub live_at_end_bytes: u64,
    /// Framework blocks made, and still live at the end.
    pub block_count: u64,
    pub live_at_end_count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FailedSummary {
    pub ts_nanos: u64,
    pub size_bytes: u64,
    pub error_code: u32,
    pub device: DeviceIdx,
    pub process: ProcessIdx,
    pub thread: ThreadIdx,
    /// Device live bytes of the process on that device when it failed.
    pub live_bytes: u64,
    pub site: String,
    pub frames: Vec<String>,
}

/// The analysis result.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub format_version: String,
    pub collector: String,
    pub host: String,
    pub argv: Vec<String>,
    pub duration_nanos: u64,
    pub first_ts_nanos: u64,
    pub last_ts_nanos: u64,
    pub records: u64,
    pub alloc_count: u64,
    pub free_count: u64,
    pub devices: Vec<DeviceSummary>,
    pub processes: Vec<ProcessSummary>,
    /// Peak of device live bytes over all processes and devices.
    pub peak_bytes: u64,
    pub peak_ts_nanos: u64,
    /// What was live at the peak, by call site, largest first.
    pub peak_sites: Vec<SiteBytes>,
    pub live_at_end_bytes: u64,
    pub live_at_end_count: u64,
    pub live_at_end_sites: Vec<SiteBytes>,
    /// Pinned host memory (cudaHostAlloc / cuMemHostAlloc), per process.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub pinned_host: Vec<PinnedHostSummary>,
    /// The framework layer (tensors inside the reserve), per process and device; empty when
    /// the trace has no framework block (since format 1.3).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub allocated: Vec<AllocatedSummary>,
    pub failed_allocations: Vec<FailedSummary>,
    /// Whether the trace ended with an `end` record.
    pub clean_end: bool,
    pub dropped_events: u64,
    /// Decoder and model warnings, as sentences.
    pub warnings: Vec<String>,
    /// Processes the collector could not trace (another CUPTI client, no CUPTI), as sentences:
    /// their memory is missing, so a check must not pass on this trace. (A framework history
    /// that lost entries is a warning only: the process was traced.)
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub capture_incomplete: Vec<String>,
    /// The error that stopped decoding early, if any.
    pub fatal: Option<String>,
    /// Problems (warning or critical), most severe first.
    pub findings: Vec<Finding>,
    /// Facts worth knowing that are not problems (bounded growth, teardown releases, churn).
    pub notes: Vec<Finding>,
    /// 0-100, reference weights.
    pub score: u32,
    /// A-F.
    pub grade: String,
    /// At most 10, most urgent first.
    pub recommendations: Vec<Recommendation>,
    /// Every detector's section.
    pub analysis: Analysis,
}
