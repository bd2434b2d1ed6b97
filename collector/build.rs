//! Embeds the built viewer (Trunk's `dist/`) into the gpucollect binary, so `gpucollect serve`
//! needs no files beside it. Build the viewer first with `trunk build --release` at the
//! repository root. Without it the binary still builds (for lint and test jobs) and the server
//! explains how to add the viewer. `GPUCOLLECT_VIEWER_DIST` points at another folder.

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
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("viewer_assets.rs");
    if let Err(e) = std::fs::write(&out, code) {
        println!("cargo:warning=cannot write {}: {e}", out.display());
    }
}
