//! Shareable view state: which view, the zoom window, the pinned moment, filters, search and
//! sort, written to and read from the URL fragment so a copied link reopens the same view.
//!
//! Plain Rust (no browser types), tested natively. Unknown or malformed keys are ignored: an old
//! or hand-edited link still opens, with defaults for what it does not say.

use std::fmt::Write as _;

/// The views of the app, in tab order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum View {
    #[default]
    Overview,
    Timeline,
    Leaks,
    Spikes,
    Fragmentation,
    Sites,
    Stacks,
    Compare,
}

impl View {
    /// Every view, in tab order (keys 1 to 8 select them).
    pub const ALL: [View; 8] = [
        Self::Overview,
        Self::Timeline,
        Self::Leaks,
        Self::Spikes,
        Self::Fragmentation,
        Self::Sites,
        Self::Stacks,
        Self::Compare,
    ];

    /// The name used in URLs and `data-testid`s.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::Overview => "overview",
            Self::Timeline => "timeline",
            Self::Leaks => "leaks",
            Self::Spikes => "spikes",
            Self::Fragmentation => "fragmentation",
            Self::Sites => "sites",
            Self::Stacks => "stacks",
            Self::Compare => "compare",
        }
    }

    /// The tab label.
    pub const fn title(self) -> &'static str {
        match self {
            Self::Overview => "Overview",
            Self::Timeline => "Timeline",
            Self::Leaks => "Leaks",
            Self::Spikes => "Spikes",
            Self::Fragmentation => "Fragmentation",
            Self::Sites => "Call sites",
            Self::Stacks => "Memory by stack",
            Self::Compare => "Compare",
        }
    }

    pub fn from_slug(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.slug() == s)
    }
}

/// Columns the call-site table can be sorted by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SortKey {
    #[default]
    Bytes,
    Count,
    Peak,
    Live,
    MaxSize,
    Site,
}

impl SortKey {
    pub const ALL: [SortKey; 6] = [
        Self::Site,
        Self::Bytes,
        Self::Count,
        Self::Peak,
        Self::Live,
        Self::MaxSize,
    ];

    pub const fn slug(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Count => "count",
            Self::Peak => "peak",
            Self::Live => "live",
            Self::MaxSize => "max",
            Self::Site => "site",
        }
    }

    pub fn from_slug(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.slug() == s)
    }
}

/// Columns the scope-growth table (Leaks view) can be sorted by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScopeSortKey {
    Scope,
    Severity,
    /// Total growth (the report's order).
    #[default]
    Growth,
    PerCall,
    Calls,
}

impl ScopeSortKey {
    pub const ALL: [ScopeSortKey; 5] = [
        Self::Scope,
        Self::Severity,
        Self::Growth,
        Self::PerCall,
        Self::Calls,
    ];

    pub const fn slug(self) -> &'static str {
        match self {
            Self::Scope => "scope",
            Self::Severity => "severity",
            Self::Growth => "growth",
            Self::PerCall => "per-call",
            Self::Calls => "calls",
        }
    }

    pub fn from_slug(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.slug() == s)
    }
}

/// Everything a link restores.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewState {
    pub view: View,
    /// Zoom window `[t0, t1)` in trace nanoseconds; `None` shows the whole trace.
    pub range_nanos: Option<(u64, u64)>,
    /// Pinned moment (trace nanoseconds): the live allocations then are listed.
    pub pin_nanos: Option<u64>,
    pub process: Option<u32>,
    pub device: Option<u32>,
    pub thread: Option<u32>,
    /// Call-site search text.
    pub search: String,
    pub sort: SortKey,
    pub sort_ascending: bool,
    /// Expanded row (a stack id) in the leaks or call-site table.
    pub open_stack: Option<u32>,
    /// Sort of the scope-growth table.
    pub scope_sort: ScopeSortKey,
    pub scope_sort_ascending: bool,
    /// Expanded row of the scope-growth table (an index into `report.analysis.scopes`).
    pub open_scope: Option<u32>,
    /// Minimal chrome for iframes.
    pub embed: bool,
}

impl ViewState {
    /// Serializes to `key=value&...` (no leading `#`). Defaults are left out.
    pub fn to_fragment(&self) -> String {
        let mut out = String::new();
        let mut put = |k: &str, v: &str| {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(k);
            out.push('=');
            out.push_str(&percent_encode(v));
        };
        put("view", self.view.slug());
        if let Some((a, b)) = self.range_nanos {
            put("t0", &a.to_string());
            put("t1", &b.to_string());
        }
        if let Some(p) = self.pin_nanos {
            put("pin", &p.to_string());
        }
        if let Some(p) = self.process {
            put("process", &p.to_string());
        }
        if let Some(d) = self.device {
            put("device", &d.to_string());
        }
        if let Some(t) = self.thread {
            put("thread", &t.to_string());
        }
        if !self.search.is_empty() {
            put("q", &self.search);
        }
        if self.sort != SortKey::default() || self.sort_ascending {
            let dir = if self.sort_ascending { "asc" } else { "desc" };
            put("sort", &format!("{}-{dir}", self.sort.slug()));
        }
        if let Some(s) = self.open_stack {
            put("open", &s.to_string());
        }
        if self.scope_sort != ScopeSortKey::default() || self.scope_sort_ascending {
            let dir = if self.scope_sort_ascending {
                "asc"
            } else {
                "desc"
            };
            put("ssort", &format!("{}-{dir}", self.scope_sort.slug()));
        }
        if let Some(s) = self.open_scope {
            put("scope", &s.to_string());
        }
        if self.embed {
            put("embed", "1");
        }
        out
    }

    /// Parses a fragment or query string (with or without the leading `#`/`?`).
    /// Whether fragment `s` names a view.
    pub fn fragment_has_view(s: &str) -> bool {
        parse_pairs(s).iter().any(|(k, _)| k == "view")
    }

    pub fn from_fragment(s: &str) -> Self {
        let mut st = Self::default();
        let mut t0 = None;
        let mut t1 = None;
        for (k, v) in parse_pairs(s) {
            match k.as_str() {
                "view" => st.view = View::from_slug(&v).unwrap_or_default(),
                "t0" => t0 = v.parse().ok(),
                "t1" => t1 = v.parse().ok(),
                "pin" => st.pin_nanos = v.parse().ok(),
                "process" => st.process = v.parse().ok(),
                "device" => st.device = v.parse().ok(),
                "thread" => st.thread = v.parse().ok(),
                "q" => st.search = v,
                "sort" => {
                    let (key, dir) = v.split_once('-').unwrap_or((v.as_str(), "desc"));
                    st.sort = SortKey::from_slug(key).unwrap_or_default();
                    st.sort_ascending = dir == "asc";
                }
                "open" => st.open_stack = v.parse().ok(),
                "ssort" => {
                    let (key, dir) = v.rsplit_once('-').unwrap_or((v.as_str(), "desc"));
                    st.scope_sort = ScopeSortKey::from_slug(key).unwrap_or_default();
                    st.scope_sort_ascending = dir == "asc";
                }
                "scope" => st.open_scope = v.parse().ok(),
                "embed" => st.embed = v == "1" || v == "true",
                _ => {}
            }
        }
        if let (Some(a), Some(b)) = (t0, t1)
            && a < b
        {
            st.range_nanos = Some((a, b));
        }
        st
    }
}

/// `key=value` pairs of a query or fragment string, percent-decoded (`+` is a space).
pub fn parse_pairs(s: &str) -> Vec<(String, String)> {
    let s = s.trim_start_matches(['#', '?']);
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Decodes `%XX` escapes and `+`; invalid escapes are kept as written.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A zoom window after zooming by `factor` (< 1 zooms in) around `center`, kept inside
/// `[lo, hi]` and at least `min_span` wide.
pub fn zoom_range(
    (t0, t1): (u64, u64),
    center: u64,
    factor: f64,
    (lo, hi): (u64, u64),
    min_span: u64,
) -> (u64, u64) {
    let span = (t1 - t0) as f64;
    let full = hi.saturating_sub(lo).max(1);
    let new_span = (span * factor).clamp(min_span.min(full) as f64, full as f64);
    let center = center.clamp(t0, t1);
    let frac = if t1 > t0 {
        (center - t0) as f64 / span
    } else {
        0.5
    };
    let a = center as f64 - new_span * frac;
    clamp_window(a, new_span, (lo, hi))
}

/// A zoom window moved by `fraction` of its width (negative moves left), kept inside `[lo, hi]`.
pub fn pan_range((t0, t1): (u64, u64), fraction: f64, (lo, hi): (u64, u64)) -> (u64, u64) {
    let span = (t1 - t0) as f64;
    clamp_window(t0 as f64 + span * fraction, span, (lo, hi))
}

fn clamp_window(start: f64, span: f64, (lo, hi): (u64, u64)) -> (u64, u64) {
    let span = span.min(hi.saturating_sub(lo) as f64).max(1.0);
    let start = start.clamp(lo as f64, (hi as f64 - span).max(lo as f64));
    let a = start.round() as u64;
    let b = ((start + span).round() as u64).min(hi).max(a + 1);
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_names_a_view_or_not() {
        assert!(ViewState::fragment_has_view("#view=leaks&t0=1&t1=2"));
        assert!(ViewState::fragment_has_view("t0=1&view=timeline"));
        assert!(!ViewState::fragment_has_view("#t0=1&t1=2"));
        assert!(!ViewState::fragment_has_view(""));
    }

    #[test]
    fn fragment_round_trips() {
        let st = ViewState {
            view: View::Timeline,
            range_nanos: Some((1_000, 9_000_000)),
            pin_nanos: Some(5_000),
            process: Some(1),
            device: Some(0),
            thread: None,
            search: "attention scores & más".into(),
            sort: SortKey::Peak,
            sort_ascending: true,
            open_stack: Some(42),
            scope_sort: ScopeSortKey::PerCall,
            scope_sort_ascending: true,
            open_scope: Some(3),
            embed: true,
        };
        let f = st.to_fragment();
        assert!(!f.contains(' '), "{f}");
        assert_eq!(ViewState::from_fragment(&format!("#{f}")), st);
    }

    #[test]
    fn default_state_is_short_and_bad_values_are_ignored() {
        assert_eq!(ViewState::default().to_fragment(), "view=overview");
        let st =
            ViewState::from_fragment("#view=nope&t0=9&t1=3&pin=x&sort=zzz&ssort=zzz&scope=-1&junk");
        assert_eq!(st, ViewState::default());
    }

    #[test]
    fn percent_decoding_survives_bad_escapes() {
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%41+b"), "%zzA b");
        assert_eq!(percent_decode("%"), "%");
    }

    #[test]
    fn zoom_and_pan_stay_inside_the_trace() {
        let full = (0, 1000);
        let z = zoom_range(full, 500, 0.5, full, 10);
        assert_eq!(z, (250, 750));
        let z = zoom_range(z, 250, 0.5, full, 10);
        assert_eq!(z, (250, 500));
        assert_eq!(zoom_range((0, 20), 10, 0.01, full, 10), (5, 15));
        assert_eq!(zoom_range((250, 500), 300, 100.0, full, 10), full);
        assert_eq!(pan_range((900, 1000), 0.5, full), (900, 1000));
        assert_eq!(pan_range((100, 200), -0.5, full), (50, 150));
        assert_eq!(pan_range((10, 110), -1.0, full), (0, 100));
    }
}
