//! One self-contained HTML report: the viewer (its JavaScript glue and WebAssembly, base64) and
//! the trace inlined into Trunk's `index.html`, so the file opens from disk or a wiki attachment
//! with no network access. The viewer picks the trace up from the
//! `#gpucollect-embedded-trace` element at start.

use anyhow::{Result, bail};
use base64::Engine as _;

/// The viewer files a report needs.
pub struct ViewerFiles<'a> {
    pub index_html: &'a str,
    /// (file name, bytes) of every asset next to index.html.
    pub files: Vec<(&'a str, &'a [u8])>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Removes every `<tag ...>` whose text contains all of `needles` (for void tags like `<link>`).
fn drop_tags(html: &str, tag: &str, needles: &[&str]) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    let open = format!("<{tag}");
    while let Some(i) = rest.find(&open) {
        let Some(end) = rest[i..].find('>') else {
            break;
        };
        let t = &rest[i..i + end + 1];
        out.push_str(&rest[..i]);
        if !needles.iter().all(|n| t.contains(n)) {
            out.push_str(t);
        }
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Builds the report. `title` goes into the page title.
pub fn build(viewer: &ViewerFiles<'_>, trace: &[u8], title: &str) -> Result<String> {
    let find = |suffix: &str| {
        viewer
            .files
            .iter()
            .find(|(n, _)| n.ends_with(suffix) && !n.contains('/'))
            .copied()
    };
    // The glue is the script named like the WebAssembly file (`viewer-<hash>.js` next to
    // `viewer-<hash>_bg.wasm`), not another script of the build (the file-reading worker).
    let wasm_file = find("_bg.wasm");
    let glue = wasm_file.and_then(|(name, _)| {
        let stem = name.strip_suffix("_bg.wasm")?;
        find(&format!("{stem}.js")).filter(|(n, _)| *n == format!("{stem}.js"))
    });
    let (Some((_, js)), Some((_, wasm))) = (glue, wasm_file) else {
        bail!(
            "the viewer build has no JavaScript glue or WebAssembly file: rebuild it with `trunk build --release`"
        );
    };
    let mut html = viewer.index_html.to_owned();
    // Trunk's loader script imports files by URL: replace it with one that uses inlined bytes.
    if let Some(start) = html.find("<script type=\"module\">")
        && let Some(len) = html[start..].find("</script>")
    {
        html.replace_range(start..start + len + "</script>".len(), "");
    } else {
        bail!(
            "the viewer's index.html has no module loader script: rebuild it with `trunk build --release`"
        );
    }
    html = drop_tags(&html, "link", &["rel=\"modulepreload\""]);
    html = drop_tags(&html, "link", &["rel=\"preload\""]);
    // Stylesheets inline.
    for (name, css) in viewer.files.iter().filter(|(n, _)| n.ends_with(".css")) {
        let with = drop_tags(&html, "link", &["rel=\"stylesheet\"", name]);
        if with.len() != html.len() {
            html = with.replacen(
                "</head>",
                &format!("<style>{}</style></head>", String::from_utf8_lossy(css)),
                1,
            );
        }
    }
    let escaped_title: String = title
        .chars()
        .map(|c| match c {
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '&' => "&amp;".to_owned(),
            '"' => "&quot;".to_owned(),
            c => c.to_string(),
        })
        .collect();
    if let (Some(a), Some(b)) = (html.find("<title>"), html.find("</title>")) {
        html.replace_range(
            a..b + "</title>".len(),
            &format!("<title>{escaped_title} · gpucollect</title>"),
        );
    }
    let loader = format!(
        "<script id=\"gpucollect-viewer-js\" type=\"application/octet-stream\">{}</script>\n\
         <script id=\"gpucollect-viewer-wasm\" type=\"application/octet-stream\">{}</script>\n\
         <script id=\"gpucollect-embedded-trace\" type=\"application/octet-stream\">{}</script>\n\
         <script type=\"module\">\n\
         const bytes = (id) => Uint8Array.from(atob(document.getElementById(id).textContent), (c) => c.charCodeAt(0));\n\
         const glue = URL.createObjectURL(new Blob([bytes('gpucollect-viewer-js')], {{ type: 'text/javascript' }}));\n\
         const bindings = await import(glue);\n\
         const wasm = await bindings.default({{ module_or_path: bytes('gpucollect-viewer-wasm') }});\n\
         window.wasmBindings = bindings;\n\
         dispatchEvent(new CustomEvent('TrunkApplicationStarted', {{ detail: {{ wasm }} }}));\n\
         </script>\n",
        b64(js),
        b64(wasm),
        b64(trace)
    );
    let Some(head_end) = html.find("</head>") else {
        bail!("the viewer's index.html has no </head>");
    };
    html.insert_str(head_end, &loader);
    Ok(html)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = "<!doctype html><html><head><title>gpucollect viewer</title>\n\
<script type=\"module\">\nimport init, * as bindings from './viewer-1.js';\nconst wasm = await init({ module_or_path: './viewer-1_bg.wasm' });\n</script>\n\
<link rel=\"stylesheet\" href=\"./style-1.css\" integrity=\"x\"/>\
<link rel=\"modulepreload\" href=\"./viewer-1.js\"><link rel=\"preload\" href=\"./viewer-1_bg.wasm\" as=\"fetch\"></head><body></body></html>";

    #[test]
    fn the_report_references_no_file_and_inlines_everything() {
        let v = ViewerFiles {
            index_html: INDEX,
            files: vec![
                // Another script of the build comes first: the glue is the one named like the
                // WebAssembly file.
                ("read-worker.js", b"onmessage = () => {};"),
                ("viewer-1.js", b"export default async function init() {}"),
                ("viewer-1_bg.wasm", b"\0asm"),
                ("style-1.css", b"body { color: red }"),
            ],
        };
        let html = build(&v, b"TRACE", "run <1>").expect("builds");
        let inlined = |s: &[u8]| {
            html.contains(&b64(s)) || html.contains(core::str::from_utf8(s).unwrap_or("-"))
        };
        assert!(
            inlined(b"export default async function init() {}"),
            "{html}"
        );
        assert!(!inlined(b"onmessage = () => {};"), "{html}");
        assert!(!html.contains("./viewer-1"), "{html}");
        assert!(!html.contains("style-1.css"), "{html}");
        assert!(html.contains("<style>body { color: red }</style>"));
        assert!(html.contains(&b64(b"TRACE")));
        assert!(html.contains(&b64(b"\0asm")));
        assert!(html.contains("<title>run &lt;1&gt; · gpucollect</title>"));
        assert!(html.contains("id=\"gpucollect-embedded-trace\""));
    }

    #[test]
    fn a_viewer_without_wasm_is_an_error() {
        let v = ViewerFiles {
            index_html: INDEX,
            files: vec![],
        };
        assert!(build(&v, b"", "x").is_err());
    }
}
