//! Server mode: a trace too big for the page is not downloaded; `gpucollect serve` analyses it
//! and the page shows what it answers (API.md, "Summaries"): the verdict, the report's call-site
//! table and growth per scope, the timeline at the zoomed window's resolution and the live
//! memory by call site at a moment. This module holds
//! the page's side of that API, apart from the DOM: the decision by size, the answers' shapes
//! and the timelines rebuilt from the server's buckets for the chart.

use analysis_core::summary_api::SeriesInfo;
pub use analysis_core::summary_api::{LiveAt, LiveSite, Window};
use analysis_core::timeline::{Bucket, Timeline};
use analysis_core::units::fmt_bytes;
use serde::Deserialize;

use crate::flame::Flame;

/// The largest trace a page downloads and opens itself, unless the page's address says
/// otherwise (`?max_download=`): the viewer's WebAssembly memory reaches about 2.5 bytes per
/// trace byte (docs/benchmarks.md, "Browser viewer"), so 192 MiB (about 17 M events) takes
/// some 480 MiB of a page's 4 GiB, and its first chart about 3 s of reading, where server
/// mode's comes in a fraction of a second. `gpucollect serve` summarises traces up to 1 GiB
/// by default (`--summary-memory 4GiB`).
pub const DEFAULT_MAX_DOWNLOAD: u64 = 192 << 20;

/// How a trace at a URL is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Downloaded and analysed in the page.
    Local,
    /// Summaries asked of the server that stores it.
    Server,
}

/// What `?mode=` asks for: `server`, `local`, or (absent or `auto`) a choice by size.
pub fn mode_param(value: Option<&str>) -> Result<Option<Mode>, String> {
    match value.map(str::trim) {
        None | Some("" | "auto") => Ok(None),
        Some("server") => Ok(Some(Mode::Server)),
        Some("local") => Ok(Some(Mode::Local)),
        Some(other) => Err(format!(
            "the address asks for mode “{other}”: use mode=server (the server analyses the \
             trace), mode=local (the page downloads it) or leave it out (chosen by size)"
        )),
    }
}

/// The URL of a summaries endpoint (`summary`, `timeline`, `live`) of a trace URL that a
/// `gpucollect serve` hands out (`…/api/v1/traces/<id>`, its query kept: it may hold the read
/// token), with `params` added; `None` for any other URL (another server's file cannot be
/// summarised).
pub fn endpoint(trace_url: &str, name: &str, params: &str) -> Option<String> {
    let url = trace_url.split('#').next()?;
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let (before, id) = path.rsplit_once('/')?;
    let ok_id = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok_id || !before.ends_with("api/v1/traces") {
        return None;
    }
    let query: Vec<&str> = [query, params]
        .into_iter()
        .filter(|q| !q.is_empty())
        .collect();
    Some(if query.is_empty() {
        format!("{path}/{name}")
    } else {
        format!("{path}/{name}?{}", query.join("&"))
    })
}

/// The mode for a trace of `bytes` (when the server said) at a URL that can (`summarised`) or
/// cannot be summarised, given what the address asks for.
pub fn choose(
    asked: Option<Mode>,
    summarised: bool,
    bytes: Option<u64>,
    max_download: u64,
) -> Mode {
    match asked {
        Some(Mode::Server) if summarised => Mode::Server,
        Some(_) => Mode::Local,
        None if summarised && bytes.is_some_and(|b| b > max_download) => Mode::Server,
        None => Mode::Local,
    }
}

/// A byte count from the address (`?max_download=`): plain bytes or with a unit (`50MiB`,
/// `2GB`, `512k`).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let unit = s[digits..].trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `GET …/summary`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Summary {
    pub api_version: u32,
    pub t0: u64,
    pub t1: u64,
    pub series: Vec<SeriesInfo>,
    pub report: ReportDigest,
}

/// The parts of the JSON report the page shows.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ReportDigest {
    #[serde(default)]
    pub findings: Vec<FindingDigest>,
    #[serde(default)]
    pub peak_bytes: u64,
    #[serde(default)]
    pub peak_ts_nanos: u64,
    #[serde(default)]
    pub live_at_end_bytes: u64,
    /// What was live at the peak, by call site, largest first (the report's sites have the
    /// fields of the live set's, and more).
    #[serde(default)]
    pub peak_sites: Vec<LiveSite>,
    /// What was live at the end, by call site, largest first.
    #[serde(default)]
    pub live_at_end_sites: Vec<LiveSite>,
    /// The report's call-site table and growth per scope.
    #[serde(default)]
    pub analysis: AnalysisDigest,
}

/// The report's tables the page shows as the report has them (`analysis.sites`,
/// `analysis.scopes`): the page in server mode has no history to build its own from.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct AnalysisDigest {
    /// The call sites with the most bytes at the peak, then live at the end, then allocated.
    #[serde(default)]
    pub sites: Vec<SiteDigest>,
    /// Growth per NVTX range or call site, largest first.
    #[serde(default)]
    pub scopes: Vec<ScopeDigest>,
}

/// One row of the report's call-site table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SiteDigest {
    pub site: String,
    #[serde(default)]
    pub frames: Vec<String>,
    #[serde(default)]
    pub alloc_count: u64,
    #[serde(default)]
    pub alloc_bytes: u64,
    #[serde(default)]
    pub max_size_bytes: u64,
    /// Bytes of this site live at the peak.
    #[serde(default)]
    pub peak_bytes: u64,
    #[serde(default)]
    pub live_at_end_bytes: u64,
}

/// One scope's growth across its calls (an NVTX range's instances, or a call site's
/// allocations in a trace without ranges).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ScopeDigest {
    pub scope: String,
    /// `nvtx_range` or `call_site`.
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub calls: u64,
    #[serde(default)]
    pub total_growth_bytes: i64,
    #[serde(default)]
    pub avg_growth_bytes: f64,
    /// The reference rule holds for its growth.
    #[serde(default)]
    pub reference_leak: bool,
    /// Growth that stopped: a cache or a warm-up, not a leak.
    #[serde(default)]
    pub bounded: bool,
    /// An enclosed scope that accounts for this one's growth.
    #[serde(default)]
    pub explained_by: Option<String>,
    /// The call site that kept the most bytes beyond the calls.
    #[serde(default)]
    pub top_site: Option<String>,
    #[serde(default)]
    pub top_site_bytes: u64,
}

impl ScopeDigest {
    /// The report's judgement of this scope, in words.
    pub fn verdict(&self) -> String {
        match (self.reference_leak, self.bounded, &self.explained_by) {
            (true, _, Some(inner)) => format!("flagged; explained by `{inner}`"),
            (true, false, None) => "flagged: grows across its calls".to_string(),
            (_, true, _) => "bounded: growth that stopped".to_string(),
            _ => "not flagged".to_string(),
        }
    }
}

/// One finding of the report.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct FindingDigest {
    pub kind: String,
    pub severity: String,
    pub headline: String,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub fix: String,
    #[serde(default)]
    pub ts_nanos: Option<u64>,
}

/// The icicle of a live set the server answered: its call sites' stacks merged, and what the
/// answer left out (past its limit of sites) as one cell of its own, so the widths are shares
/// of everything live then.
pub fn flame_of(at: &LiveAt) -> Flame {
    let listed: u64 = at.sites.iter().map(|x| x.bytes).sum();
    let listed_count: u64 = at.sites.iter().map(|x| x.count).sum();
    let rest = at.bytes.saturating_sub(listed);
    let other = (rest > 0).then(|| {
        vec![format!(
            "{} other call sites' allocations ({} of them)",
            fmt_bytes(rest),
            at.count.saturating_sub(listed_count)
        )]
    });
    Flame::from_stacks(
        at.sites
            .iter()
            .map(|x| (x.frames.as_slice(), x.bytes))
            .chain(other.iter().map(|f| (f.as_slice(), rest))),
    )
}

/// Parses an answer of the summaries API, in words when it is not one.
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, body: &str) -> Result<T, String> {
    serde_json::from_str(body).map_err(|e| {
        format!(
            "the server's {what} is not what this page understands ({e}); the server and the \
             page may be of different versions: reload the page"
        )
    })
}

/// A step function whose columns over the answer's window are the answer's buckets: each
/// column's range (`min`, `max`) and end value (`last`) as points at its start, so the chart,
/// drawing the same window in the same number of columns, draws exactly what the server
/// computed (and, at another width, the nearest columns). Empty columns before the series'
/// first point stay empty; a window that starts with memory live starts from its first
/// column's minimum (the value carried into it is within its range).
pub fn timeline_of(buckets: &[Bucket]) -> Timeline {
    let mut t = Timeline::new();
    for (i, b) in buckets.iter().enumerate() {
        if t.is_empty() {
            if b.max == 0 {
                continue;
            }
            if i == 0 && b.min > 0 {
                t.push(b.t_start.saturating_sub(1), b.min);
            }
        }
        t.push(b.t_start, b.max);
        t.push(b.t_start, b.min);
        t.push(b.t_start, b.last);
    }
    t.build_index();
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    #[test]
    fn only_a_servers_trace_urls_are_summarised() {
        assert_eq!(
            endpoint("/api/v1/traces/abc-DEF_1#view=timeline", "summary", "").as_deref(),
            Some("/api/v1/traces/abc-DEF_1/summary")
        );
        assert_eq!(
            endpoint(
                "https://h.example/api/v1/traces/abc?token=s%20t",
                "live",
                "t=5"
            )
            .as_deref(),
            Some("https://h.example/api/v1/traces/abc/live?token=s%20t&t=5")
        );
        assert_eq!(endpoint("/api/v1/demos/training-leak", "summary", ""), None);
        assert_eq!(endpoint("/api/v1/traces/", "summary", ""), None);
        assert_eq!(endpoint("/api/v1/traces/a.b", "summary", ""), None);
        assert_eq!(
            endpoint("https://files.example/run.msgpack", "summary", ""),
            None
        );
    }

    #[test]
    fn the_mode_follows_the_size_unless_asked() {
        let max = 100;
        assert_eq!(choose(None, true, Some(101), max), Mode::Server);
        assert_eq!(choose(None, true, Some(100), max), Mode::Local);
        assert_eq!(choose(None, true, None, max), Mode::Local);
        assert_eq!(choose(None, false, Some(1 << 40), max), Mode::Local);
        assert_eq!(choose(Some(Mode::Server), true, Some(1), max), Mode::Server);
        assert_eq!(choose(Some(Mode::Server), false, Some(1), max), Mode::Local);
        assert_eq!(
            choose(Some(Mode::Local), true, Some(1 << 40), max),
            Mode::Local
        );
        assert_eq!(mode_param(Some("server")), Ok(Some(Mode::Server)));
        assert_eq!(mode_param(Some("auto")), Ok(None));
        assert!(mode_param(Some("remote")).is_err());
    }

    #[test]
    fn byte_counts_take_units() {
        assert_eq!(parse_bytes("1000"), Some(1000));
        assert_eq!(parse_bytes("50MiB"), Some(50 << 20));
        assert_eq!(parse_bytes("2 GB"), Some(2 << 30));
        assert_eq!(parse_bytes("512k"), Some(512 << 10));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999999999G"), None);
    }

    /// The chart draws a window from the rebuilt timeline in the same columns the server
    /// computed over the model's own timeline.
    #[test]
    fn rebuilt_timelines_downsample_to_the_servers_buckets() {
        let (bytes, _) = generate(Scenario::TrainingLeak, 20_000, 5);
        let m = analysis_core::load(&bytes).expect("loads").model;
        let (lo, hi) = (m.first_ts_nanos, m.last_ts_nanos + 1);
        for (t0, t1, columns) in [
            (lo, hi, 700),
            (lo, hi, 37),
            (lo + (hi - lo) / 3, lo + (hi - lo) / 2, 500),
        ] {
            let as_sent = |t: &Timeline| t.downsample(t0, t1, columns);
            let served = as_sent(&m.total);
            let again = as_sent(&timeline_of(&served));
            assert_eq!(again, served, "{t0}..{t1} in {columns}");
        }
    }

    #[test]
    fn a_summary_answer_parses() {
        let body = r#"{"api_version":1,"t0":5,"t1":9,"series":[{"index":0,"process":7,
            "device":0,"host":false,"peak_bytes":10,"live_bytes":4}],"report":{"findings":[
            {"kind":"leak_growth","severity":"critical","headline":"leaks 1 KiB per step",
             "site":"f (a.py:3)","location":"a.py:3","bytes":1,"count":1,"ts_nanos":null,
             "message":"m","fix":"x","harm_bytes":1}],"peak_bytes":10,"extra":[1,2]}}"#;
        let s: Summary = parse("summary", body).expect("parses");
        assert_eq!(s.series[0].label(), "process 7 device 0");
        assert_eq!(s.report.findings[0].location, "a.py:3");
        assert_eq!(s.report.peak_bytes, 10);
        let err = parse::<Summary>("summary", "<html>").expect_err("not JSON");
        assert!(err.contains("reload the page"), "{err}");
    }

    /// The icicle of an answer merges its sites' stacks, outermost frame first, and keeps what
    /// the answer's limit left out as a cell of its own, so the root is everything live then.
    #[test]
    fn the_icicle_of_an_answer_holds_everything_live() {
        let site = |frames: &[&str], bytes: u64, count: u64| LiveSite {
            site: frames[0].to_string(),
            frames: frames.iter().map(ToString::to_string).collect(),
            bytes,
            count,
        };
        let mut at = LiveAt {
            t: 7,
            bytes: 100,
            count: 10,
            sites: vec![
                site(&["leaf_a", "mid", "main"], 50, 4),
                site(&["leaf_b", "mid", "main"], 30, 3),
            ],
        };
        let f = flame_of(&at);
        assert_eq!(f.total_bytes(), 100);
        let cells = f.cells(0.0);
        let at_depth = |d: u32| -> Vec<(String, u64)> {
            cells
                .iter()
                .filter(|c| c.depth == d)
                .map(|c| (c.label.clone(), c.bytes))
                .collect()
        };
        assert_eq!(at_depth(0)[0], ("main".to_string(), 80));
        assert_eq!(at_depth(0)[1].1, 20);
        assert!(
            at_depth(0)[1].0.contains("(3 of them)"),
            "{:?}",
            at_depth(0)
        );
        assert_eq!(
            at_depth(2),
            vec![("leaf_a".into(), 50), ("leaf_b".into(), 30)]
        );
        // Every site listed: no cell for the rest.
        at.bytes = 80;
        at.count = 7;
        assert_eq!(flame_of(&at).cells(0.0).len(), 4);
    }

    /// The report's call-site table and growth per scope come through a summary answer
    /// whole, row for row, as `gpucollect report --format json` writes them.
    #[test]
    fn a_reports_tables_come_through_the_summary() {
        for s in [Scenario::TrainingLeak, Scenario::ShortLived] {
            let (bytes, _) = generate(s, 20_000, 5);
            let trace = analysis_core::load(&bytes).expect("synthetic trace loads");
            let report = analysis_core::summarize(&trace);
            let body = format!(
                r#"{{"api_version":1,"t0":0,"t1":1,"series":[],"report":{}}}"#,
                serde_json::to_string(&report).expect("report serializes")
            );
            let got: Summary = parse("summary", &body).expect("parses");
            let want = serde_json::to_value(&report.analysis).expect("report serializes");
            let (sites, scopes) = (&got.report.analysis.sites, &got.report.analysis.scopes);
            assert!(!sites.is_empty(), "{}", s.name());
            assert_eq!(Some(sites.len()), want["sites"].as_array().map(Vec::len));
            for (d, w) in sites
                .iter()
                .zip(want["sites"].as_array().into_iter().flatten())
            {
                assert_eq!(w["site"], d.site.as_str());
                assert_eq!(w["frames"], serde_json::json!(d.frames));
                assert_eq!(w["alloc_count"], d.alloc_count);
                assert_eq!(w["alloc_bytes"], d.alloc_bytes);
                assert_eq!(w["max_size_bytes"], d.max_size_bytes);
                assert_eq!(w["peak_bytes"], d.peak_bytes);
                assert_eq!(w["live_at_end_bytes"], d.live_at_end_bytes);
            }
            assert_eq!(Some(scopes.len()), want["scopes"].as_array().map(Vec::len));
            for (d, w) in scopes
                .iter()
                .zip(want["scopes"].as_array().into_iter().flatten())
            {
                assert_eq!(w["scope"], d.scope.as_str());
                assert_eq!(w["calls"], d.calls);
                assert_eq!(w["total_growth_bytes"], d.total_growth_bytes);
                assert_eq!(w["reference_leak"], d.reference_leak);
                assert_eq!(w["bounded"], d.bounded);
            }
            assert!(s != Scenario::TrainingLeak || !scopes.is_empty());
        }
        let leak = ScopeDigest {
            scope: "train_step".into(),
            kind: "nvtx_range".into(),
            calls: 10,
            total_growth_bytes: 40,
            avg_growth_bytes: 4.0,
            reference_leak: true,
            bounded: false,
            explained_by: None,
            top_site: None,
            top_site_bytes: 0,
        };
        assert_eq!(leak.verdict(), "flagged: grows across its calls");
        let cache = ScopeDigest {
            reference_leak: false,
            bounded: true,
            ..leak.clone()
        };
        assert_eq!(cache.verdict(), "bounded: growth that stopped");
    }
}
