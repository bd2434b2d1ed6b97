//! Which part of a trace the views show: one process, device or thread, or all of it.

use analysis_core::format::{DeviceIdx, ProcessIdx, ThreadIdx};
use analysis_core::model::{AllocRecord, Fields};

/// Which part of the trace the views show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub process: Option<ProcessIdx>,
    pub device: Option<DeviceIdx>,
    pub thread: Option<ThreadIdx>,
}

impl Filter {
    /// Whether an allocation passes the filter.
    /// The fields of an allocation [`Self::admits`] reads.
    pub const FIELDS: Fields = Fields::PROCESS.and(Fields::DEVICE).and(Fields::THREAD);

    pub fn admits(&self, a: &AllocRecord) -> bool {
        self.process.is_none_or(|p| p == a.process)
            && self.device.is_none_or(|d| d == a.device)
            && self.thread.is_none_or(|t| t == a.thread)
    }

    /// Whether a (process, device) series passes the filter (threads are not split out).
    pub fn admits_series(&self, process: ProcessIdx, device: DeviceIdx) -> bool {
        self.process.is_none_or(|p| p == process) && self.device.is_none_or(|d| d == device)
    }

    pub const fn is_all(&self) -> bool {
        self.process.is_none() && self.device.is_none() && self.thread.is_none()
    }
}
