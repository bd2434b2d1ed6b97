//! Renders a `Report` (and a report diff) for a terminal.
//!
//! Every string in a report may come from an untrusted trace (call sites, frames, argv, device
//! and process names). A terminal obeys control sequences in what it prints (ESC ] 52 writes
//! the clipboard, ESC [ 2 J clears the screen, ESC ] 8 makes fake links, ESC ] 0 sets the
//! window title), so the rendered text escapes every C0 and C1 control character and DEL
//! (`\x1b`, `\u{9b}`) except the line breaks the renderer writes itself, and a trace string
//! that holds a line break is shown on one line (`\n`).

use std::borrow::Cow;
use std::fmt::Write;

use analysis_core::analysis::Finding;
use analysis_core::analysis::diff::{Change, ReportDiff};
use analysis_core::report::{Report, SiteBytes};
use analysis_core::units::{fmt_bytes, fmt_bytes_signed, fmt_duration};

fn is_control(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// One trace-derived string, safe for a terminal and kept on one line: every control
/// character (line breaks included) is written as an escape.
pub fn one_line(s: &str) -> Cow<'_, str> {
    if !s.contains(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Text for a terminal: every control character except `\n` is written as an escape.
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    if !s.contains(|c| c != '\n' && is_control(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c != '\n' && is_control(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

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
            one_line(&s.site)
        );
        for f in s.frames.iter().skip(1).take(4) {
            let _ = writeln!(out, "                         from {}", one_line(f));
        }
    }
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "gpucollect report");
    if !r.argv.is_empty() {
        let _ = writeln!(o, "  command     {}", one_line(&r.argv.join(" ")));
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
            if d.name.is_empty() {
                "?".into()
            } else {
                one_line(&d.name)
            },
            fmt_bytes(d.total_bytes),
            fmt_bytes(d.peak_bytes),
            fmt_bytes(d.live_at_end_bytes)
        );
    }
    for p in &r.processes {
        let exit = match (p.exit_code, p.exit_signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ if p.exit_status_unknown => "exited, status unknown (_exit or a signal)".into(),
            _ => "no exit recorded".into(),
        };
        let _ = writeln!(
            o,
            "  process {}   pid {} {} ({exit})",
            p.process.0,
            p.pid,
            one_line(&p.exe)
        );
    }
    let _ = writeln!(o);
    verdict(&mut o, r);
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
    for p in &r.pinned_host {
        let _ = writeln!(
            o,
            "Pinned host memory of process {}: peak {}, live at end {}",
            p.process.0,
            fmt_bytes(p.peak_bytes),
            fmt_bytes(p.live_at_end_bytes)
        );
    }
    for a in &r.allocated {
        let _ = writeln!(
            o,
            "Tensors of process {} on GPU {} (framework blocks inside the reserve): peak {}, \
             live at end {} in {} of {} block(s)",
            a.process.0,
            a.device.0,
            fmt_bytes(a.peak_bytes),
            fmt_bytes(a.live_at_end_bytes),
            a.live_at_end_count,
            a.block_count
        );
    }
    if !r.failed_allocations.is_empty() {
        let _ = writeln!(o, "Failed allocations: {}", r.failed_allocations.len());
        for f in &r.failed_allocations {
            let _ = writeln!(
                o,
                "    {} requested at {} on device {} (error {}{}, {} live) at {}",
                fmt_bytes(f.size_bytes),
                fmt_duration(f.ts_nanos.saturating_sub(r.first_ts_nanos)),
                f.device.0,
                f.error_code,
                analysis_core::format::cuda_error_name(f.error_code)
                    .map(|n| format!(" {n}"))
                    .unwrap_or_default(),
                fmt_bytes(f.live_bytes),
                one_line(&f.site)
            );
        }
    }
    analysis(&mut o, r);
    if let Some(e) = &r.fatal {
        let _ = writeln!(o, "\nerror: {e}");
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\nWarnings:");
        for w in &r.warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
    terminal_safe(&o).into_owned()
}

fn finding(o: &mut String, f: &Finding) {
    let _ = writeln!(
        o,
        "  {:<8} {:<20} {:>10}  {}",
        f.severity.name().to_uppercase(),
        f.kind.name(),
        fmt_bytes(f.bytes),
        one_line(&f.site)
    );
    let _ = writeln!(o, "           {}", one_line(&f.message));
    for e in &f.evidence {
        let _ = writeln!(o, "           - {}", one_line(e));
    }
    let _ = writeln!(o, "           fix: {}", one_line(&f.fix));
}

/// The verdict: one sentence per problem, most harmful first, or that the program is healthy;
/// and the repeated unit the verdict was judged on.
fn verdict(o: &mut String, r: &Report) {
    let a = &r.analysis;
    if r.findings.is_empty() {
        let _ = writeln!(
            o,
            "Verdict: healthy, no leak, spike, fragmentation or out-of-memory found ({})",
            a.history.describe()
        );
    } else {
        let _ = writeln!(o, "Verdict:");
        for f in &r.findings {
            let _ = writeln!(
                o,
                "  {:<8} {}",
                f.severity.name().to_uppercase(),
                one_line(&f.headline)
            );
        }
    }
    let _ = writeln!(
        o,
        "Iterations: {} {}{} from {} ({} warm-up)",
        a.iterations.count,
        a.iterations.unit(),
        if a.iterations.count == 1 { "" } else { "s" },
        one_line(&a.iterations.label),
        a.iterations.warmup
    );
}

fn analysis(o: &mut String, r: &Report) {
    let a = &r.analysis;
    let _ = writeln!(o);
    let _ = writeln!(o, "Score: {}/100 (grade {})", r.score, r.grade);
    if r.findings.is_empty() {
        let _ = writeln!(o, "Findings: none");
    } else {
        let _ = writeln!(o, "Findings: {}", r.findings.len());
        for f in &r.findings {
            finding(o, f);
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(o, "Notes (not problems):");
        for n in &r.notes {
            let _ = writeln!(o, "  {:<20} {}", n.kind.name(), one_line(&n.message));
        }
    }
    if !r.recommendations.is_empty() {
        let _ = writeln!(o, "Recommendations:");
        for x in &r.recommendations {
            let _ = writeln!(
                o,
                "  {:>2}. [{}] {} ({}): {}",
                x.priority,
                x.severity.name(),
                one_line(&x.site),
                fmt_bytes(x.bytes),
                one_line(&x.fix)
            );
        }
    }
    if !a.scopes.is_empty() {
        let _ = writeln!(o, "Growth per scope:");
        for s in a.scopes.iter().take(10) {
            let verdict = match (s.reference_leak, s.bounded) {
                (true, true) => "bounded",
                (true, false) => "LEAK",
                (false, _) => "ok",
            };
            let _ = writeln!(
                o,
                "  {:<32} {:>7} calls  {:>11} total  {:>4.0} % grow  {}",
                one_line(&s.scope),
                s.calls,
                fmt_bytes_signed(s.total_growth_bytes),
                s.positive_ratio * 100.0,
                verdict
            );
        }
    }
    for t in &a.trends {
        let full = t
            .seconds_to_full
            .map(|s| format!(", full in {}", fmt_duration((s * 1e9) as u64)))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "Trend (process {}, device {}): {}/s, r = {:.3}, p = {:.3e}{full}{}",
            t.process.0,
            t.device.0,
            fmt_bytes_signed(t.growth_bytes_per_sec as i64),
            t.fit.r,
            t.fit.p_value,
            if t.bounded {
                " (plateaued)"
            } else if t.flagged {
                " (growing)"
            } else {
                ""
            }
        );
    }
    for s in &a.scope_spikes {
        let _ = writeln!(
            o,
            "Spikes in `{}`: {} above {} (Q1 {}, Q3 {})",
            one_line(&s.scope),
            s.spike_count,
            fmt_bytes(s.threshold_bytes as u64),
            fmt_bytes(s.q1_bytes as u64),
            fmt_bytes(s.q3_bytes as u64)
        );
    }
    for e in a.timeline_spikes.iter().take(10) {
        let _ = writeln!(
            o,
            "  rise of {} at {} to {} for {} from {}",
            fmt_bytes(e.size_bytes),
            fmt_duration(e.ts_nanos.saturating_sub(r.first_ts_nanos)),
            fmt_bytes(e.live_bytes),
            fmt_duration(e.duration_nanos),
            one_line(&e.site)
        );
    }
    for p in &a.fragmentation {
        let _ = writeln!(
            o,
            "Fragmentation, {} on device {}: mean {:.1} %, worst {:.1} % ({} wasted) over {} samples",
            analysis_core::format::pool::label(p.pool),
            p.device.0,
            p.mean_ratio * 100.0,
            p.max_ratio * 100.0,
            fmt_bytes(p.max_wasted_bytes),
            p.samples
        );
        if let Some(g) = p.gaps_at_max {
            let _ = writeln!(
                o,
                "  at the worst: largest free block {} of {} free between live blocks ({:.1} % external)",
                fmt_bytes(g.largest_free_bytes),
                fmt_bytes(g.free_bytes),
                g.external_fragmentation * 100.0
            );
        }
    }
    for h in &a.hidden {
        let _ = writeln!(
            o,
            "Untraced device memory, device {}: mean {}, max {}, other processes up to {}{}",
            h.device.0,
            fmt_bytes_signed(h.mean_gap_bytes as i64),
            fmt_bytes_signed(h.max_gap_bytes),
            fmt_bytes(h.other_processes_max_bytes),
            h.skipped
                .as_ref()
                .map(|s| format!(" (rules skipped: {s})"))
                .unwrap_or_default()
        );
    }
    for x in &a.oom {
        let _ = writeln!(
            o,
            "Out of memory at {}: {} requested at {} ({:?})",
            fmt_duration(x.ts_nanos.saturating_sub(r.first_ts_nanos)),
            fmt_bytes(x.requested_bytes),
            one_line(&x.site),
            x.cause
        );
        if let (Some(free), Some(total)) = (x.free_bytes, x.total_bytes) {
            let _ = writeln!(
                o,
                "  device: {} free of {}",
                fmt_bytes(free),
                fmt_bytes(total)
            );
        }
        let _ = writeln!(o, "  ours: {} live", fmt_bytes(x.live_bytes));
        for s in &x.live_sites {
            let _ = writeln!(o, "    {:>10}  {}", fmt_bytes(s.bytes), one_line(&s.site));
        }
        for p in &x.other_processes {
            let _ = writeln!(
                o,
                "  other process pid {}: {}",
                p.pid,
                fmt_bytes(p.used_bytes)
            );
        }
        if x.untraced_bytes > 0 {
            let _ = writeln!(
                o,
                "  untraced (driver, context, libraries): {}",
                fmt_bytes(x.untraced_bytes)
            );
        }
    }
}

fn change(c: &Change) -> String {
    format!(
        "{} -> {} ({})",
        fmt_bytes(c.before),
        fmt_bytes(c.after),
        fmt_bytes_signed(c.delta)
    )
}

/// Renders a report diff.
pub fn render_diff(d: &ReportDiff, before: &str, after: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "gpucollect diff {before} -> {after}");
    let _ = writeln!(o, "  peak          {}", change(&d.peak_bytes));
    let _ = writeln!(o, "  live at end   {}", change(&d.live_at_end_bytes));
    let _ = writeln!(
        o,
        "  allocations   {} -> {}",
        d.alloc_count.before, d.alloc_count.after
    );
    let _ = writeln!(
        o,
        "  score         {} ({}) -> {} ({})",
        d.score.before, d.grade_before, d.score.after, d.grade_after
    );
    if !d.sites.is_empty() {
        let _ = writeln!(o, "\nBy call site (peak / live at end / allocated):");
        for s in &d.sites {
            let _ = writeln!(
                o,
                "  {:>11} {:>11} {:>11}  {}",
                fmt_bytes_signed(s.peak_bytes.delta),
                fmt_bytes_signed(s.live_at_end_bytes.delta),
                fmt_bytes_signed(s.alloc_bytes.delta),
                one_line(&s.site)
            );
        }
    }
    if !d.scopes.is_empty() {
        let _ = writeln!(o, "\nBy scope (growth before -> after):");
        for s in &d.scopes {
            let _ = writeln!(
                o,
                "  {:<32} {} -> {} ({}), calls {} -> {}",
                one_line(&s.scope),
                fmt_bytes_signed(s.growth_bytes.before),
                fmt_bytes_signed(s.growth_bytes.after),
                fmt_bytes_signed(s.growth_bytes.delta),
                s.calls.before,
                s.calls.after
            );
        }
    }
    if !d.new_findings.is_empty() {
        let _ = writeln!(o, "\nNew findings:");
        for f in &d.new_findings {
            finding(&mut o, f);
        }
    }
    if !d.resolved_findings.is_empty() {
        let _ = writeln!(o, "\nResolved findings:");
        for f in &d.resolved_findings {
            finding(&mut o, f);
        }
    }
    terminal_safe(&o).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    /// OSC 52 (write the clipboard), a screen clear, a window title, a fake hyperlink, a C1
    /// CSI and DEL: none may reach the terminal as raw bytes.
    const HOSTILE: &str = "train.py:1\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[H\x1b]0;pwned\x07\
                           \x1b]8;;https://evil.example/\x1b\\\\click\x1b]8;;\x1b\\\\\u{9b}31m\x7f\nFAKE LINE";

    fn assert_clean(text: &str) {
        for c in text.chars() {
            assert!(
                c == '\n' || !is_control(c),
                "control character {:?} reached the output:\n{text}",
                c
            );
        }
        assert!(!text.contains("\nFAKE LINE"), "{text}");
    }

    #[test]
    fn trace_strings_cannot_drive_the_terminal() {
        let trace = analysis_core::load(&generate(Scenario::TrainingLeak, 2000, 1).0)
            .expect("synthetic trace loads");
        let mut r = analysis_core::analyze(&trace, &Default::default());
        assert!(!r.peak_sites.is_empty() && !r.findings.is_empty());
        r.argv = vec![HOSTILE.to_owned()];
        r.peak_sites[0].site = HOSTILE.to_owned();
        r.peak_sites[0].frames = vec![HOSTILE.to_owned(), HOSTILE.to_owned()];
        r.findings[0].site = HOSTILE.to_owned();
        r.findings[0].message = HOSTILE.to_owned();
        let text = render(&r);
        assert_clean(&text);
        assert!(text.contains("\\x1b]52;c;cm0gLXJmIH4=\\x07"), "{text}");
        assert!(text.contains("\\u{9b}31m\\x7f\\nFAKE LINE"), "{text}");
    }

    #[test]
    fn iterations_are_counted_in_the_plural() {
        let trace = analysis_core::load(&generate(Scenario::TrainingLeak, 2000, 1).0)
            .expect("synthetic trace loads");
        let r = analysis_core::analyze(&trace, &Default::default());
        assert!(r.analysis.iterations.count > 1);
        let text = render(&r);
        let line = text
            .lines()
            .find(|l| l.starts_with("Iterations: "))
            .expect("an iterations line");
        let unit = r.analysis.iterations.unit();
        assert!(line.contains(&format!(" {unit}s from ")), "{line}");
    }

    #[test]
    fn escapes_keep_ordinary_text_and_line_breaks() {
        assert_eq!(one_line("f (a.py:1) → ünïcode"), "f (a.py:1) → ünïcode");
        assert_eq!(terminal_safe("a\nb\x1bc"), "a\nb\\x1bc");
        assert_eq!(one_line("a\nb\tc\r"), "a\\nb\\tc\\r");
    }
}
