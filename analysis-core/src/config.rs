//! Every threshold the detectors use, with the reference rules (anchors.md, gpumemprof's
//! MemoryAnalyzer) as defaults. The `Config` is serialized into the `Report` so a reader knows
//! which thresholds produced it.

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Detector thresholds. `Config::default()` reproduces the reference rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    // --- leaks at exit ---
    /// Live-at-end groups smaller than this are not reported.
    pub leak_min_bytes: u64,
    /// A leak above this many bytes is critical.
    pub leak_critical_bytes: u64,
    /// A thread counts as gone when it was idle for at least this fraction of the trace
    /// before the end.
    pub thread_idle_fraction: f64,

    // --- attribution ---
    /// Extra frames to skip when naming the user's line: substrings of a function, file or
    /// module (`gpucollect report --hide-frame`), on top of the built-in library rules.
    pub hide_frames: alloc::vec::Vec<alloc::string::String>,

    // --- growth across iterations ---
    /// A cause leaks when it grows at least this much over the steady-state iterations, or at
    /// least `growth_min_bytes_per_hour` at its rate (a short history of a fast loop)...
    pub growth_min_bytes: u64,
    pub growth_min_bytes_per_hour: u64,
    /// ...in every third of them, with a linear fit r of at least this.
    pub growth_min_r: f64,
    /// An iteration is a spike when its peak exceeds the steady-state working set (the median
    /// iteration peak) by this factor...
    pub spike_peak_ratio: f64,
    /// ...and by at least this many bytes.
    pub spike_min_excess_bytes: u64,

    // --- growth per scope (reference `memory_leak`) ---
    /// Minimum calls of a scope before it is judged (reference: 3).
    pub min_calls_for_analysis: u64,
    /// More than this fraction of calls must grow (reference `memory_leak_ratio`: 0.1).
    pub memory_leak_ratio: f64,
    /// Total growth must exceed this (reference: 100 MiB).
    pub leak_total_growth_bytes: u64,
    /// Growth above this is critical (reference: 1 GiB).
    pub leak_critical_growth_bytes: u64,
    /// Tell bounded growth (warm-up, caches that plateau) from unbounded growth.
    pub detect_bounded_growth: bool,
    /// Growth is bounded when the last third of the calls (or of the time) adds at most this
    /// fraction of the total growth.
    pub bounded_tail_fraction: f64,

    // --- temporal trend ---
    pub trend_min_points: u64,
    /// Flagged when r exceeds this (reference: 0.5).
    pub trend_min_r: f64,
    /// Flagged when the p-value is below this (reference: 0.05).
    pub trend_max_p: f64,
    /// High impact above this slope (reference: 1e6 bytes/s).
    pub trend_high_impact_bytes_per_sec: f64,
    /// A flagged trend is bounded when the slope of its last third is at most this fraction of
    /// the whole slope.
    pub trend_tail_slope_ratio: f64,

    // --- spikes ---
    /// IQR multiplier of the per-scope outlier rule (reference: 1.5).
    pub spike_iqr_factor: f64,
    /// A scope with at least this many spikes is critical (reference: 5).
    pub spike_critical_count: u64,
    /// Timeline spike: the allocation alone is at least this fraction of the mean live bytes.
    pub timeline_spike_rise_fraction: f64,
    /// Timeline spike: live bytes reach at least this multiple of the mean live bytes.
    pub timeline_spike_level_ratio: f64,
    /// Timeline spike: released within this fraction of the trace duration.
    pub timeline_spike_max_lifetime_fraction: f64,
    pub timeline_spike_min_bytes: u64,

    // --- fragmentation ---
    /// Flagged when the mean (reserved - allocated) / reserved exceeds this (reference: 0.3).
    pub fragmentation_ratio: f64,
    /// Critical above this mean ratio (reference: 0.5).
    pub fragmentation_critical_ratio: f64,

    // --- repeated and short-lived allocations ---
    /// Reference `repeated_allocations`: at least this many calls...
    pub repeated_min_calls: u64,
    /// ...with a mean size below this (reference: 50 MiB).
    pub repeated_max_mean_bytes: u64,
    /// How many call sites are listed (reference: 5).
    pub repeated_top: usize,
    /// An allocation freed within this many nanoseconds is short-lived.
    pub short_lived_max_nanos: u64,
    /// A site is short-lived when at least this fraction of its allocations are.
    pub short_lived_min_fraction: f64,

    // --- hidden memory ---
    pub hidden_min_samples: u64,
    /// Skipped when max |gap / device total| is below this (reference: 0.05).
    pub hidden_min_gap_fraction: f64,
    /// Transient spike when z exceeds this (reference: 2), critical above the second.
    pub hidden_spike_z: f64,
    pub hidden_spike_critical_z: f64,
    /// Drift when R² reaches this (reference: 0.6), critical above the second (0.85).
    pub hidden_drift_r_squared: f64,
    pub hidden_drift_critical_r_squared: f64,
    pub hidden_drift_min_samples: u64,

    // --- report ---
    /// At most this many recommendations (reference: 10).
    pub max_recommendations: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            leak_min_bytes: 1,
            hide_frames: alloc::vec::Vec::new(),
            growth_min_bytes: MIB,
            growth_min_bytes_per_hour: 64 * MIB,
            growth_min_r: 0.6,
            spike_peak_ratio: 1.5,
            spike_min_excess_bytes: 64 * MIB,
            leak_critical_bytes: GIB,
            thread_idle_fraction: 0.25,
            min_calls_for_analysis: 3,
            memory_leak_ratio: 0.1,
            leak_total_growth_bytes: 100 * MIB,
            leak_critical_growth_bytes: GIB,
            detect_bounded_growth: true,
            bounded_tail_fraction: 0.05,
            trend_min_points: 5,
            trend_min_r: 0.5,
            trend_max_p: 0.05,
            trend_high_impact_bytes_per_sec: 1e6,
            trend_tail_slope_ratio: 0.25,
            spike_iqr_factor: 1.5,
            spike_critical_count: 5,
            timeline_spike_rise_fraction: 1.0,
            timeline_spike_level_ratio: 1.5,
            timeline_spike_max_lifetime_fraction: 0.01,
            timeline_spike_min_bytes: MIB,
            fragmentation_ratio: 0.3,
            fragmentation_critical_ratio: 0.5,
            repeated_min_calls: 10,
            repeated_max_mean_bytes: 50 * MIB,
            repeated_top: 5,
            short_lived_max_nanos: 1_000_000,
            short_lived_min_fraction: 0.5,
            hidden_min_samples: 3,
            hidden_min_gap_fraction: 0.05,
            hidden_spike_z: 2.0,
            hidden_spike_critical_z: 4.0,
            hidden_drift_r_squared: 0.6,
            hidden_drift_critical_r_squared: 0.85,
            hidden_drift_min_samples: 5,
            max_recommendations: 10,
        }
    }
}
