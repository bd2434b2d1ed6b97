//! What the viewer's benchmarks share.

/// Events in the benchmarks' synthetic traces: `GPUCOLLECT_BENCH_EVENTS`, or 1M.
pub fn events_from_env() -> u64 {
    std::env::var("GPUCOLLECT_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}
