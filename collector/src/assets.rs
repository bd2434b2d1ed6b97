//! The viewer's static files: embedded at build time (see `collector/build.rs`) or read from a
//! folder given with `--assets`. Also derives the Content-Security-Policy hashes of the inline
//! scripts Trunk writes into `index.html`, so the policy can forbid every other inline script.

use std::collections::HashMap;
use std::path::Path;

#[cfg(feature = "serve")]
use base64::Engine as _;
#[cfg(feature = "serve")]
use sha2::{Digest, Sha256};

include!(concat!(env!("OUT_DIR"), "/viewer_assets.rs"));

/// The page served when no viewer is available.
const NO_VIEWER_PAGE: &str = "<!doctype html><meta charset=utf-8><title>gpucollect</title>\
<h1>gpucollect server</h1><p>This gpucollect was built without the viewer. Build it with \
<code>trunk build --release</code> at the repository root and rebuild gpucollect, or start the \
server with <code>--assets DIR</code> pointing at the viewer's files.</p>\
<p>The API works: see <code>API.md</code>.</p>";

#[derive(Clone, Debug, Default)]
pub struct Assets {
    files: HashMap<String, Vec<u8>>,
    /// `'sha256-…'` sources for the inline scripts of index.html (the server's CSP).
    #[cfg(feature = "serve")]
    pub inline_script_hashes: Vec<String>,
}

impl Assets {
    /// The embedded viewer, if this binary has one.
    pub fn embedded() -> Self {
        Self::from_files(
            VIEWER_ASSETS
                .iter()
                .map(|(p, b)| ((*p).to_owned(), b.to_vec()))
                .collect(),
        )
    }

    /// Every file below `dir`.
    pub fn from_dir(dir: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let mut files = HashMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let rd = std::fs::read_dir(&d)
                .with_context(|| format!("cannot read the viewer folder {}", d.display()))?;
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(dir) {
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    files.insert(rel, std::fs::read(&p)?);
                }
            }
        }
        if !files.contains_key("index.html") {
            anyhow::bail!(
                "{} has no index.html: build the viewer with `trunk build --release` and point --assets at its dist folder",
                dir.display()
            );
        }
        Ok(Self::from_files(files))
    }

    #[cfg(not(feature = "serve"))]
    fn from_files(files: HashMap<String, Vec<u8>>) -> Self {
        Self { files }
    }

    #[cfg(feature = "serve")]
    fn from_files(files: HashMap<String, Vec<u8>>) -> Self {
        let inline_script_hashes = files
            .get("index.html")
            .map(|html| inline_scripts(&String::from_utf8_lossy(html)))
            .unwrap_or_default()
            .iter()
            .map(|s| {
                let digest = Sha256::digest(s.as_bytes());
                format!(
                    "'sha256-{}'",
                    base64::engine::general_purpose::STANDARD.encode(digest)
                )
            })
            .collect();
        Self {
            files,
            inline_script_hashes,
        }
    }

    pub fn has_viewer(&self) -> bool {
        self.files.contains_key("index.html")
    }

    /// The file at `path` (no leading slash) and its content type.
    #[cfg(feature = "serve")]
    pub fn get(&self, path: &str) -> Option<(&'static str, &[u8])> {
        if path.split('/').any(|seg| seg == ".." || seg.is_empty()) {
            return None;
        }
        self.files
            .get(path)
            .map(|b| (content_type(path), b.as_slice()))
    }

    /// Every file as (path, bytes).
    pub fn files(&self) -> Vec<(&str, &[u8])> {
        self.files
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect()
    }

    /// The viewer's entry page, or an explanation when there is no viewer.
    pub fn index(&self) -> &[u8] {
        self.files
            .get("index.html")
            .map_or(NO_VIEWER_PAGE.as_bytes(), Vec::as_slice)
    }
}

#[cfg(feature = "serve")]
fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        "msgpack" => "application/octet-stream",
        _ => "application/octet-stream",
    }
}

/// The contents of `<script>` elements without a `src` attribute.
#[cfg(feature = "serve")]
fn inline_scripts(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find("<script") {
        let after = &rest[start..];
        let Some(tag_end) = after.find('>') else {
            break;
        };
        let tag = &after[..tag_end];
        let body_start = tag_end + 1;
        let Some(close) = after[body_start..].find("</script>") else {
            break;
        };
        if !tag.contains("src=") {
            out.push(after[body_start..body_start + close].to_owned());
        }
        rest = &after[body_start + close..];
    }
    out
}

#[cfg(all(test, feature = "serve"))]
mod tests {
    use super::*;

    #[test]
    fn inline_scripts_are_found_and_external_ones_skipped() {
        let html = "<html><script src=\"/a.js\"></script><script type=\"module\">init()</script>\
                    <script>x=1</script></html>";
        assert_eq!(
            inline_scripts(html),
            vec!["init()".to_owned(), "x=1".to_owned()]
        );
    }

    #[test]
    fn traversal_is_refused() {
        let mut files = HashMap::new();
        files.insert("index.html".to_owned(), b"<p>hi".to_vec());
        let a = Assets::from_files(files);
        assert!(a.get("index.html").is_some());
        assert!(a.get("../index.html").is_none());
        assert!(a.get("/index.html").is_none());
    }
}
