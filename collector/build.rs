//! Embeds the built viewer (Trunk's `dist/`) into the gpucollect binary, so `gpucollect serve`
//! needs no files beside it. Build the viewer first with `trunk build --release` at the
//! repository root. Without it the binary still builds (for lint and test jobs) and the server
//! explains how to add the viewer. `GPUCOLLECT_VIEWER_DIST` points at another folder.
//!
//! Also fingerprints the analysis' sources (`GPUCOLLECT_ANALYSIS_FINGERPRINT`): the server keeps
//! the summaries it makes next to the traces, and serves one again only to a build that
//! analyses the same way.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPUCOLLECT_VIEWER_DIST");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dist = std::env::var("GPUCOLLECT_VIEWER_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("..").join("dist"));
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        collect(&dist, &mut files);
        for f in &files {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }
    let mut code = String::from("/// Viewer files embedded at build time: (path, bytes).\n");
    code.push_str("pub static VIEWER_ASSETS: &[(&str, &[u8])] = &[\n");
    for f in &files {
        let rel = f
            .strip_prefix(&dist)
            .map(|r| r.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        let abs = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
        let _ = writeln!(
            code,
            "    ({rel:?}, include_bytes!({:?})),",
            abs.display().to_string()
        );
    }
    code.push_str("];\n");
    fingerprint_analysis(&manifest.join(".."));
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("viewer_assets.rs");
    if let Err(e) = std::fs::write(&out, code) {
        println!("cargo:warning=cannot write {}: {e}", out.display());
    }
}

/// FNV-1a over the paths and bytes of every source file of the analysis crates and of the
/// server's code that makes a summary (in path order), as `GPUCOLLECT_ANALYSIS_FINGERPRINT`;
/// the build reruns when one changes. `root` is the workspace.
fn fingerprint_analysis(root: &Path) {
    let mut files = Vec::new();
    for sub in [
        "analysis-core/src",
        "analysis-core/trace/src",
        "analysis-core/torch-import/src",
    ] {
        collect(&root.join(sub), &mut files);
    }
    for file in [
        "analysis-core/Cargo.toml",
        "analysis-core/trace/Cargo.toml",
        "analysis-core/torch-import/Cargo.toml",
        "collector/src/serve/summaries.rs",
        "collector/src/threads.rs",
    ] {
        files.push(root.join(file));
    }
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(root)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('\\', "/");
        eat(rel.as_bytes());
        eat(&std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=GPUCOLLECT_ANALYSIS_FINGERPRINT={h:016x}");
}
