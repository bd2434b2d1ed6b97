//! Renders a `Report` for a terminal.

use std::fmt::Write;

use analysis_core::report::{Report, SiteBytes};
use analysis_core::units::{fmt_bytes, fmt_duration};

fn sites(out: &mut String, title: &str, sites: &[SiteBytes]) {
    if sites.is_empty() {
        return;
    }
    let _ = writeln!(out, "  {title}");
    for s in sites {
        let _ = writeln!(
            out,
            "    {:>10}  {:>6}x  {}",
            fmt_bytes(s.bytes),
            s.count,
            s.site
        );
        for f in s.frames.iter().skip(1).take(4) {
            let _ = writeln!(out, "                         from {f}");
        }
    }
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "gpucollect report");
    if !r.argv.is_empty() {
        let _ = writeln!(o, "  command     {}", r.argv.join(" "));
    }
    let _ = writeln!(
        o,
        "  duration    {}   ({} allocations, {} frees, {} records)",
        fmt_duration(r.duration_nanos),
        r.alloc_count,
        r.free_count,
        r.records
    );
    for d in &r.devices {
        let _ = writeln!(
            o,
            "  device {}    {} ({} total): peak {}, live at end {}",
            d.device.0,
            if d.name.is_empty() { "?" } else { &d.name },
            fmt_bytes(d.total_bytes),
            fmt_bytes(d.peak_bytes),
            fmt_bytes(d.live_at_end_bytes)
        );
    }
    for p in &r.processes {
        let exit = match (p.exit_code, p.exit_signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "no exit recorded".into(),
        };
        let _ = writeln!(
            o,
            "  process {}   pid {} {} ({exit})",
            p.process.0, p.pid, p.exe
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Peak: {} at {}",
        fmt_bytes(r.peak_bytes),
        fmt_duration(r.peak_ts_nanos.saturating_sub(r.first_ts_nanos))
    );
    sites(&mut o, "live at the peak, by call site:", &r.peak_sites);
    let _ = writeln!(
        o,
        "Live at end: {} in {} allocation(s)",
        fmt_bytes(r.live_at_end_bytes),
        r.live_at_end_count
    );
    sites(&mut o, "by call site:", &r.live_at_end_sites);
    if !r.failed_allocations.is_empty() {
        let _ = writeln!(o, "Failed allocations: {}", r.failed_allocations.len());
        for f in &r.failed_allocations {
            let _ = writeln!(
                o,
                "    {} requested at {} on device {} (error {}, {} live) at {}",
                fmt_bytes(f.size_bytes),
                fmt_duration(f.ts_nanos.saturating_sub(r.first_ts_nanos)),
                f.device.0,
                f.error_code,
                fmt_bytes(f.live_bytes),
                f.site
            );
        }
    }
    if let Some(e) = &r.fatal {
        let _ = writeln!(o, "\nerror: {e}");
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\nWarnings:");
        for w in &r.warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
    o
}
