//! Time to list the allocations live at a moment (`AllocStore::live_at`: the server's `/live`,
//! the report's peak sites, the viewer's pinned moment) at 10, 50, 90 and 100 % of a trace's
//! span, best of 3.
//! Usage: bench_live_at TRACE

use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).expect("usage: bench_live_at TRACE");
    let bytes = std::fs::read(&path).expect("reads the trace");
    let trace = analysis_core::load(&bytes).expect("the trace loads");
    drop(bytes);
    let m = &trace.model;
    let (lo, hi) = (m.first_ts_nanos, m.last_ts_nanos);
    for pct in [10u64, 50, 90, 100] {
        let t = lo + (hi - lo) * pct / 100;
        let made = m.allocs.made_by(t);
        let (mut best, mut live) = (f64::MAX, 0);
        for _ in 0..3 {
            let start = Instant::now();
            live = m.allocs.live_at(t, made).count();
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
        }
        println!("{pct}%: {live} live, {best:.1} ms");
    }
}
