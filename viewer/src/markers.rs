//! Vertical markers on the time charts: failed allocations, teardowns and spikes. The data
//! module makes them from the report and the model; the chart module draws them.

/// A vertical marker (failed allocation, teardown, spike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub ts_nanos: u64,
    pub label: String,
    pub kind: MarkerKind,
    /// Markers this one stands for (more than 1 where a dense window was grouped).
    pub count: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerKind {
    FailedAlloc,
    Teardown,
    Spike,
}

impl MarkerKind {
    /// Which kind a group of markers is drawn as: failures first, then teardowns.
    pub(crate) const fn rank(self) -> u8 {
        match self {
            Self::FailedAlloc => 2,
            Self::Teardown => 1,
            Self::Spike => 0,
        }
    }

    /// The name used in `data-kind` attributes.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::FailedAlloc => "failed-alloc",
            Self::Teardown => "teardown",
            Self::Spike => "spike",
        }
    }
}
