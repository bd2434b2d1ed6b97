//! Temporal trend of live bytes, per (process, device) series. Live bytes are a step function,
//! so the fit is time-weighted: the series is sampled at `SAMPLES` evenly spaced moments over
//! the whole history, flat periods included (least squares, Pearson r, the two-sided p-value
//! of Student's t), never extrapolated from the moments it changed. The reference rule
//! (slope > 0, r > 0.5, p < 0.05) flags a trend for the table; a trend whose last third is flat
//! is bounded.
//!
//! A finding comes only from growth that persists across the steady-state iterations and that
//! no leaking call site explains (growth spread over many sites): a cause that is a finding
//! already is not reported again as a trend.

use alloc::format;
use alloc::vec::Vec;

use super::iterations::Iterations;
use super::sampling::{ProcessSampling, judge};
use super::{
    Config, Finding, FindingKind, Found, Impact, Severity, device_capacity, device_used_at_end,
};
use crate::format::{DeviceIdx, ProcessIdx};
use crate::model::TraceModel;
pub use crate::report::Trend;
use crate::stats::linear_fit;
use crate::units::fmt_bytes;

/// Moments sampled per series for the time-weighted fit.
pub const SAMPLES: usize = 256;

pub(crate) fn analyze(
    m: &TraceModel,
    c: &Config,
    series_growth: &[(ProcessIdx, DeviceIdx, i64, i64)],
    it: &Iterations,
    sampling: &ProcessSampling,
    found: &mut Found,
) -> Vec<Trend> {
    let mut out = Vec::new();
    let t0 = m.first_ts_nanos;
    let span = m.last_ts_nanos.saturating_sub(t0);
    for s in m.series.iter().filter(|s| !s.key.host) {
        if (s.timeline.len() as u64) < c.trend_min_points.max(2) || span == 0 {
            continue;
        }
        let at = |i: usize| t0 + (span as u128 * i as u128 / (SAMPLES as u128 - 1)) as u64;
        let pts = (0..SAMPLES).map(|i| {
            let t = at(i);
            ((t - t0) as f64 / 1e9, s.timeline.value_at(t) as f64)
        });
        let Some(fit) = linear_fit(pts.clone()) else {
            continue;
        };
        let tail_fit = linear_fit(pts.skip(SAMPLES - SAMPLES / 3));
        let flagged = fit.slope > 0.0 && fit.r > c.trend_min_r && fit.p_value < c.trend_max_p;
        let bounded = flagged
            && c.detect_bounded_growth
            && tail_fit.is_some_and(|t| t.slope <= c.trend_tail_slope_ratio * fit.slope);
        let seconds_to_full = device_capacity(m, s.key.device)
            .filter(|_| fit.slope > 0.0)
            .map(|cap| cap.saturating_sub(device_used_at_end(m, s.key.device)) as f64 / fit.slope);
        out.push(Trend {
            process: s.key.process,
            device: s.key.device,
            fit,
            tail_fit,
            growth_bytes_per_sec: fit.slope,
            flagged,
            bounded,
            seconds_to_full,
        });

        // The finding: persistent steady-state growth that leaking causes do not explain.
        let explained = series_growth
            .iter()
            .find(|g| g.0 == s.key.process && g.1 == s.key.device)
            .map_or(0, |g| g.3);
        let sm = sampling.of(s.key.process);
        let v: Vec<i64> = sm
            .times()
            .map(|t| i64::try_from(s.timeline.value_at(t)).unwrap_or(i64::MAX))
            .collect();
        let Some(j) = judge(c, &v, &sm.iters(), &sm.secs(), sm.steady()) else {
            continue;
        };
        // Where a call site leaks, the leak is the finding; what remains is in-flight work.
        if !j.leaking || explained != 0 || super::idle_pool(m, s.key.process, s.key.device) {
            continue;
        }
        let to_full = device_capacity(m, s.key.device)
            .filter(|_| j.per_sec > 0.0)
            .map(|cap| cap.saturating_sub(device_used_at_end(m, s.key.device)) as f64 / j.per_sec);
        let critical = to_full.is_some_and(|t| t <= 86_400.0);
        let unit = it.unit();
        let mut f = Finding::new(
            FindingKind::Trend,
            if critical {
                Severity::Critical
            } else {
                Severity::Warning
            },
            format!("process {} device {}", s.key.process.0, s.key.device.0),
        );
        f.impact = Some(if critical {
            Impact::High
        } else {
            Impact::Medium
        });
        f.bytes = j.growth.max(0) as u64;
        f.count = (sm.len() - sm.steady()) as u64;
        f.bytes_per_iteration = Some(j.per_iteration);
        f.bytes_per_hour = Some(j.per_sec * 3600.0);
        f.seconds_to_full = to_full;
        f.harm_bytes = (j.growth.max(0) as f64 + j.per_sec.max(0.0) * 3600.0)
            .min(device_capacity(m, s.key.device).unwrap_or(u64::MAX) as f64)
            as u64;
        let full = to_full.map(super::full_in).unwrap_or_default();
        f.headline = format!(
            "live memory grows {} per {unit} on device {}, spread over many call sites{full}",
            fmt_bytes(j.per_iteration.max(0.0) as u64),
            s.key.device.0
        );
        f.message = format!(
            "live bytes of process {} on device {} grow {} per {unit} ({}/h, r = {:.2}) across the steady-state {unit}s, and no single call site explains most of it",
            s.key.process.0,
            s.key.device.0,
            fmt_bytes(j.per_iteration.max(0.0) as u64),
            fmt_bytes((j.per_sec.max(0.0) * 3600.0) as u64),
            j.r
        );
        f.fix =
            "see the growth table for the call sites that grow; release what each iteration keeps"
                .into();
        found.push(f);
    }
    out
}
