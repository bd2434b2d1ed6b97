//! The host's memory latency (a benchmark aid, not a test): nanoseconds per dependent 8-byte
//! load at random places of a 32 MiB and a 1 GiB buffer, one JSON line. The zoom's draw and a
//! long trace's reads are bound by these loads, so a figure measured while they are slow (a
//! shared VM's busy hour) is told apart from a slower build. Built and run by
//! scripts/host-latency.sh.

use std::time::Instant;

/// One random cycle through `bytes / 8` slots (Sattolo's shuffle), then `loads` dependent loads
/// along it; returns nanoseconds per load.
fn chase(bytes: usize, loads: usize) -> f64 {
    let n = bytes / 8;
    let mut next: Vec<usize> = (0..n).collect();
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let j = (s % i as u64) as usize;
        next.swap(i, j);
    }
    let mut p = 0usize;
    let t0 = Instant::now();
    for _ in 0..loads {
        p = next[p];
    }
    let ns = t0.elapsed().as_nanos() as f64 / loads as f64;
    std::hint::black_box(p);
    ns
}

fn main() {
    let small = chase(32 << 20, 10_000_000);
    let large = chase(1 << 30, 10_000_000);
    println!("{{\"load_ns_32mib\":{small:.1},\"load_ns_1gib\":{large:.1}}}");
}
