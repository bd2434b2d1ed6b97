//! Shared by the server tests: starting `gpucollect serve` on a free port.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts `gpucollect serve --addr 127.0.0.1:0 ARGS...` with `envs`; returns the child and
/// its base URL (read from the "listening on" line). Stderr keeps being drained.
#[allow(dead_code)]
pub fn spawn_serve(args: &[&str], envs: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .args(args)
        .envs(envs.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("server starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("server printed its address")
            .expect("readable stderr");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .expect("url")
                .trim_end_matches('/')
                .to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

/// Staged uploads in a local store: `.part` files under `tmp/` (each server stages in its own
/// `tmp/<instance>/` folder).
#[allow(dead_code)]
pub fn staged_uploads(store: &std::path::Path) -> usize {
    fn walk(d: &std::path::Path) -> usize {
        std::fs::read_dir(d).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        walk(&p)
                    } else {
                        usize::from(p.extension().is_some_and(|x| x == "part"))
                    }
                })
                .sum()
        })
    }
    walk(&store.join("tmp"))
}
