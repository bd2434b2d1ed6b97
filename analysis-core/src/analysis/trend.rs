//! Temporal trend of live bytes, per (process, device) series: ordinary least squares of live
//! bytes against seconds since the first record, Pearson r and the two-sided p-value of
//! Student's t. Flagged (reference rule) when slope > 0, r > 0.5 and p < 0.05; then a trend
//! whose last third is flat is bounded (a plateau), not a leak. Gives the growth rate and the
//! projected time until the device is full.

use alloc::format;
use alloc::vec::Vec;
use serde::Serialize;

use super::{Config, Finding, FindingKind, Found, Impact, Severity};
use crate::format::{DeviceIdx, ProcessIdx};
use crate::model::TraceModel;
use crate::stats::{LinearFit, linear_fit};
use crate::units::{fmt_bytes, fmt_duration};

/// The trend of one series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trend {
    pub process: ProcessIdx,
    pub device: DeviceIdx,
    pub fit: LinearFit,
    /// The same fit over the last third of the time span.
    pub tail_fit: Option<LinearFit>,
    pub growth_bytes_per_sec: f64,
    /// The reference rule holds.
    pub flagged: bool,
    /// Flagged, but the last third is flat: a plateau.
    pub bounded: bool,
    /// Seconds until live bytes reach the device's memory at this rate, when growing.
    pub seconds_to_full: Option<f64>,
}

pub fn analyze(m: &TraceModel, c: &Config, found: &mut Found) -> Vec<Trend> {
    let mut out = Vec::new();
    let t0 = m.first_ts_nanos;
    for s in m.series.iter().filter(|s| !s.key.host) {
        let times = s.timeline.times();
        let values = s.timeline.values();
        if (times.len() as u64) < c.trend_min_points.max(2) {
            continue;
        }
        let pts = times
            .iter()
            .zip(values)
            .map(move |(&t, &v)| (t.saturating_sub(t0) as f64 / 1e9, v as f64));
        let Some(fit) = linear_fit(pts.clone()) else {
            continue;
        };
        let first = times[0];
        let last = times[times.len() - 1];
        let tail_start = last - (last - first) / 3;
        let k = times.partition_point(|&t| t < tail_start);
        let tail_fit = linear_fit(pts.clone().skip(k));
        let flagged = fit.slope > 0.0 && fit.r > c.trend_min_r && fit.p_value < c.trend_max_p;
        let bounded = flagged
            && c.detect_bounded_growth
            && tail_fit.is_some_and(|t| t.slope <= c.trend_tail_slope_ratio * fit.slope);
        let total_bytes = m
            .devices
            .iter()
            .find(|d| d.device == s.key.device)
            .map(|d| d.total_bytes)
            .filter(|&b| b > 0)
            .or_else(|| {
                m.device_samples
                    .iter()
                    .rev()
                    .find(|d| d.device == s.key.device)
                    .map(|d| d.total_bytes)
            });
        let used_now = m
            .device_samples
            .iter()
            .rev()
            .find(|d| d.device == s.key.device)
            .map_or(s.live_bytes, |d| d.used_bytes.max(s.live_bytes));
        let seconds_to_full = match total_bytes {
            Some(total) if fit.slope > 0.0 => {
                Some(total.saturating_sub(used_now) as f64 / fit.slope)
            }
            _ => None,
        };
        let t = Trend {
            process: s.key.process,
            device: s.key.device,
            fit,
            tail_fit,
            growth_bytes_per_sec: fit.slope,
            flagged,
            bounded,
            seconds_to_full,
        };
        if flagged {
            found.push(finding(m, c, &t));
        }
        out.push(t);
    }
    out
}

fn finding(m: &TraceModel, c: &Config, t: &Trend) -> Finding {
    let high = t.fit.slope > c.trend_high_impact_bytes_per_sec;
    let (severity, impact) = if t.bounded {
        (Severity::Info, Impact::Low)
    } else if high {
        (Severity::Critical, Impact::High)
    } else {
        (Severity::Warning, Impact::Medium)
    };
    let rate = fmt_bytes(t.fit.slope.max(0.0) as u64);
    let full = t
        .seconds_to_full
        .map(|s| {
            format!(
                "; the device would be full in {}",
                fmt_duration((s * 1e9) as u64)
            )
        })
        .unwrap_or_default();
    let grown = (t.fit.slope * m.duration_nanos() as f64 / 1e9).max(0.0) as u64;
    let (kind, message, fix) = if t.bounded {
        (
            FindingKind::BoundedGrowth,
            format!(
                "live bytes of process {} on device {} rose {rate}/s early, then plateaued (r = {:.2}): bounded",
                t.process.0, t.device.0, t.fit.r
            ),
            "nothing required".into(),
        )
    } else {
        (
            FindingKind::Trend,
            format!(
                "live bytes of process {} on device {} grow {rate}/s (r = {:.2}, p = {:.2e}){full}",
                t.process.0, t.device.0, t.fit.r, t.fit.p_value
            ),
            "find what keeps growing in the leak and scope findings and release it each iteration"
                .into(),
        )
    };
    Finding {
        kind,
        severity,
        site: format!("process {} device {}", t.process.0, t.device.0),
        stack: None,
        scope: None,
        bytes: grown,
        count: t.fit.n,
        ts_nanos: None,
        impact: Some(impact),
        message,
        fix,
    }
}
