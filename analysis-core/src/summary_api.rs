//! The answers of `gpucollect serve`'s summaries API (API.md, "Summaries"), one definition for
//! the server that writes them and the viewer that reads them in server mode. The summary's
//! report is the JSON report (`crate::report::Report`).

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::timeline::Bucket;

/// The version in every summary (`api_version`).
pub const API_VERSION: u32 = 1;

/// One live-bytes series of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesInfo {
    pub index: usize,
    pub process: u32,
    pub device: u32,
    /// Pinned host memory rather than device memory.
    pub host: bool,
    pub peak_bytes: u64,
    pub live_bytes: u64,
}

impl SeriesInfo {
    /// "process 3 device 0", "process 3 pinned host".
    pub fn label(&self) -> String {
        if self.host {
            alloc::format!("process {} pinned host", self.process)
        } else {
            alloc::format!("process {} device {}", self.process, self.device)
        }
    }
}

/// `GET …/timeline`: the total and every series over `[t0, t1)` in `columns` buckets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub t0: u64,
    pub t1: u64,
    pub columns: usize,
    pub total: Vec<Bucket>,
    /// One list of buckets per series, in the summary's series order.
    pub series: Vec<Vec<Bucket>>,
}

/// A call site's memory live at a moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSite {
    pub site: String,
    pub frames: Vec<String>,
    pub bytes: u64,
    pub count: u64,
}

/// `GET …/live`: device memory live at `t`, by call site, largest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAt {
    pub t: u64,
    pub bytes: u64,
    pub count: u64,
    pub sites: Vec<LiveSite>,
}
