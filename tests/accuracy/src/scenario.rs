//! What one corpus item is: its history (trace bytes or a PyTorch snapshot), its labelled truth,
//! and what a decorator-based profiler would have recorded during the same run (for the peer
//! comparison).

use serde::{Deserialize, Serialize};

use analysis_core::LoadedTrace;

/// The class of a planted cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Leak,
    Spike,
    Fragmentation,
    Oom,
    Hidden,
}

impl Class {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::Spike => "spike",
            Self::Fragmentation => "fragmentation",
            Self::Oom => "oom",
            Self::Hidden => "hidden",
        }
    }
}

/// The planted cause of a faulty scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub class: Class,
    /// Accepted `file:line` strings: the user's line(s) the first finding must name. Empty when
    /// the cause has no line (fragmentation, hidden memory).
    pub locations: Vec<String>,
    /// Exact bytes the first finding must carry: leak, what the cause keeps live at the end of
    /// the history (true block sizes); spike, the spiking allocation's block; oom, the requested
    /// size. `None` for fragmentation and hidden memory.
    pub bytes: Option<u64>,
    /// Other real causes in the same history (a recorded program with several leaks): reporting
    /// them after the planted one is right, not a false alarm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Cause>,
}

/// Labelled truth of a scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Truth {
    /// Nothing is wrong: no warning or critical finding is right.
    Healthy,
    /// One planted cause: it must be the first finding.
    Faulty(Cause),
}

impl Truth {
    pub fn leak(locations: &[&str], bytes: u64) -> Self {
        Self::faulty(Class::Leak, locations, Some(bytes))
    }

    pub fn faulty(class: Class, locations: &[&str], bytes: Option<u64>) -> Self {
        Self::Faulty(Cause {
            class,
            locations: locations.iter().map(|s| (*s).to_string()).collect(),
            bytes,
            also: Vec::new(),
        })
    }

    /// The same truth with other real causes of `class` at `locations` (each one line, any
    /// bytes) that may be reported after the planted one.
    pub fn also(mut self, class: Class, locations: &[&str]) -> Self {
        if let Self::Faulty(c) = &mut self {
            c.also.extend(locations.iter().map(|l| Cause {
                class,
                locations: vec![(*l).to_string()],
                bytes: None,
                also: Vec::new(),
            }));
        }
        self
    }

    /// One line for tables: `healthy` or `leak @ metrics.py:33, 480.0 MiB`.
    pub fn label(&self) -> String {
        match self {
            Self::Healthy => "healthy".into(),
            Self::Faulty(c) => {
                let mut s = c.class.name().to_string();
                if let Some(l) = c.locations.first() {
                    s.push_str(" @ ");
                    s.push_str(l);
                }
                if let Some(b) = c.bytes {
                    s.push_str(&format!(", {b} B"));
                }
                s
            }
        }
    }
}

/// The history as the analysis receives it.
#[derive(Clone, Debug)]
pub enum History {
    /// gpucollect trace bytes (FORMAT.md).
    Trace(Vec<u8>),
    /// A PyTorch memory snapshot (JSON with the keys of `torch.cuda.memory._snapshot()`, or a
    /// pickle), read through `analysis_core::torch_snapshot`.
    Snapshot(Vec<u8>),
}

/// Why a history could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the generated trace does not decode: {0}")]
    Trace(analysis_core::DecodeError),
    #[error("the generated snapshot does not import: {0}")]
    Snapshot(analysis_core::torch_snapshot::ImportError),
}

impl History {
    pub fn load(&self) -> Result<LoadedTrace, LoadError> {
        match self {
            Self::Trace(b) => analysis_core::load(b).map_err(LoadError::Trace),
            Self::Snapshot(b) => analysis_core::torch_snapshot::load(b)
                .map(|(t, _)| t)
                .map_err(LoadError::Snapshot),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Trace(b) | Self::Snapshot(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Trace(_) => "trace",
            Self::Snapshot(_) => "snapshot",
        }
    }
}

/// One call a stormlog/gpumemprof user would decorate (a training or eval step, a C++ work
/// call), with the framework's own counters around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub start_s: f64,
    pub end_s: f64,
    pub allocated_before: u64,
    pub allocated_after: u64,
    pub reserved_before: u64,
    pub reserved_after: u64,
    pub peak_allocated: u64,
    /// The process that made the call (several in multi-process runs).
    pub pid: u32,
}

/// A device-level sample (NVML used and total) with the framework's counters at that time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    pub t_s: f64,
    pub used: u64,
    pub total: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub device: u32,
}

/// One corpus item.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// What the program does and why it is realistic, one sentence.
    pub description: String,
    pub truth: Truth,
    pub history: History,
    pub calls: Vec<Call>,
    pub device_samples: Vec<DeviceSample>,
}
