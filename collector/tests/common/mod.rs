//! Shared by the server tests: starting `gpucollect serve` on a free port, an HTTP client that
//! shows every answer, store folders, traces to upload, connections from a chosen loopback
//! address. Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process, killed and reaped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An HTTP client that returns every status as an answer (no error for 4xx/5xx) and follows no
/// redirect.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into()
}

/// An empty folder for one test's store: `<temp>/gpucollect-<suite>-<pid>-<name>`.
pub fn store_dir(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpucollect-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("store dir");
    d
}

/// A synthetic leaking training trace of about `events` events.
pub fn trace(events: u64) -> Vec<u8> {
    analysis_core::synth::generate(analysis_core::synth::Scenario::TrainingLeak, events, 3).0
}

/// The trace files a local store holds, sorted.
pub fn stored(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join("traces"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A TCP connection from `from` (127.0.0.1, or 127.0.0.2 for an attacker a per-client cap can
/// tell apart).
pub fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    sock.bind(&SocketAddr::from((from, 0)).into())?;
    sock.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(sock.into())
}

/// Starts `gpucollect serve --addr 127.0.0.1:0 ARGS...` with `envs`; returns the child and
/// its base URL (read from the "listening on" line). Stderr keeps being drained.
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
