//! `gpucollect serve` under hostile or careless clients, against the real binary on loopback:
//! timeouts (idle, slowloris, stalled bodies), connection and upload caps, damaged uploads,
//! the origin check, safe defaults for tokens, tokens kept out of logs, and the smaller
//! faults (413 over --max-bytes, half-closed clients, links with the read token, attachment
//! downloads, servers sharing a folder, concurrent retention, `upload` and redirects).
//!
//! The "attacker" connects from 127.0.0.2 (also loopback on Linux), so that a cap on one
//! client can be told apart from the server being unreachable to others (127.0.0.1).

mod common;

use common::{Killed, store_dir, trace};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SUITE: &str = "limits";

struct Server {
    /// The server process, killed when this is dropped.
    _child: Killed,
    addr: SocketAddr,
    store: PathBuf,
    log: PathBuf,
}

/// Starts a server with its stderr in a file (for the log assertions).
fn start_in(store: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Server {
    let log = store.with_extension(format!(
        "{}.log",
        std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos())
    ));
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--demo-events",
            "300",
            "--store",
        ])
        .arg(store)
        .args(extra)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("server starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let base = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("listening on ").nth(1) {
            let url = rest.split_whitespace().next().expect("url");
            break url.trim_end_matches('/').to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the server did not start: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let addr = base
        .trim_start_matches("http://")
        .parse()
        .expect("an address");
    Server {
        _child: Killed(child),
        addr,
        store: store.to_path_buf(),
        log,
    }
}

fn start(name: &str, extra: &[&str]) -> Server {
    start_in(&store_dir(SUITE, name), extra, &[])
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn stored(&self) -> Vec<String> {
        common::stored(&self.store)
    }
}

/// A connection from `from` (127.0.0.1 or 127.0.0.2).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    common::connect_from(from, to).expect("connect from a loopback address")
}

/// Opens a connection from `from` and sends the head of an upload of `len` bytes.
fn begin_upload(from: Ipv4Addr, to: SocketAddr, len: usize) -> TcpStream {
    let mut tcp = connect_from(from, to);
    write!(
        tcp,
        "POST /api/v1/traces HTTP/1.1\r\nHost: {to}\r\nContent-Length: {len}\r\n\r\n"
    )
    .expect("headers");
    tcp
}

const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PROBE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// Sends a request over a fresh connection and reads the whole answer: (status, head, body).
fn request(s: &Server, from: Ipv4Addr, raw: &[u8]) -> (u16, String, Vec<u8>) {
    let mut tcp = connect_from(from, s.addr);
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let _ = tcp.write_all(raw);
    read_answer(&mut tcp)
}

fn read_answer(tcp: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut all = Vec::new();
    let _ = tcp.read_to_end(&mut all);
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(all.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head, all[split..].to_vec())
}

fn post(s: &Server, from: Ipv4Addr, body: &[u8], extra_headers: &str) -> (u16, String, Vec<u8>) {
    let mut raw = format!(
        "POST /api/v1/traces HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n",
        s.addr,
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    request(s, from, &raw)
}

fn get(s: &Server, path: &str) -> (u16, String, Vec<u8>) {
    let raw = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        s.addr
    );
    request(s, PROBE, raw.as_bytes())
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
}

/// Waits until `f` holds, for at most `secs`.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// How long until the server closes a connection that sends `send` (one byte at a time,
/// every `gap`), or `None` when it is still open after `give_up`.
fn closed_after(s: &Server, send: &[u8], gap: Duration, give_up: Duration) -> Option<Duration> {
    let mut tcp = connect_from(ATTACKER, s.addr);
    let t0 = Instant::now();
    tcp.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut i = 0;
    let mut buf = [0u8; 512];
    while t0.elapsed() < give_up {
        if i < send.len() {
            if tcp.write_all(&send[i..=i]).is_err() {
                return Some(t0.elapsed());
            }
            i += 1;
        }
        match tcp.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(t0.elapsed()),
        }
        std::thread::sleep(gap.saturating_sub(Duration::from_millis(50)));
    }
    None
}

#[test]
fn idle_and_slowloris_connections_are_closed_after_the_header_timeout() {
    let s = start("slowloris", &["--header-timeout", "1s"]);
    let idle = closed_after(&s, b"", Duration::from_millis(100), Duration::from_secs(8));
    assert!(
        idle.is_some_and(|d| d < Duration::from_secs(4)),
        "idle: {idle:?}"
    );
    let slow = format!(
        "GET /healthz HTTP/1.1\r\nHost: {}\r\nX-a: {}\r\n",
        s.addr,
        "b".repeat(200)
    );
    let loris = closed_after(
        &s,
        slow.as_bytes(),
        Duration::from_millis(100),
        Duration::from_secs(8),
    );
    assert!(
        loris.is_some_and(|d| d < Duration::from_secs(4)),
        "slowloris: {loris:?}"
    );
}

#[test]
fn a_stalled_upload_times_out_with_408_and_leaves_nothing() {
    let s = start("stalled", &["--body-timeout", "1s"]);
    let t = trace(2000);
    let mut tcp = begin_upload(ATTACKER, s.addr, t.len());
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    tcp.write_all(&t[..t.len() / 2]).expect("half");
    let t0 = Instant::now();
    let (status, _, body) = read_answer(&mut tcp);
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(eventually(3, || common::staged_uploads(&s.store) == 0));
    assert!(s.stored().is_empty());
}

#[test]
fn a_slow_upload_is_cut_at_the_request_timeout() {
    let s = start(
        "slow-upload",
        &["--body-timeout", "5s", "--request-timeout", "2s"],
    );
    let t = trace(2000);
    let mut tcp = begin_upload(ATTACKER, s.addr, t.len());
    tcp.set_read_timeout(Some(Duration::from_millis(400)))
        .expect("timeout");
    // A trickle that never pauses long enough for the idle timeout.
    let t0 = Instant::now();
    let mut answer = Vec::new();
    for c in t.chunks(64) {
        if tcp.write_all(c).is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
        if t0.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let head = String::from_utf8_lossy(&answer);
    assert!(head.starts_with("HTTP/1.1 408"), "{head:?}");
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
}

#[test]
fn connections_beyond_a_clients_cap_get_503_and_others_still_get_through() {
    let s = start(
        "conn-cap",
        &[
            "--max-connections-per-client",
            "8",
            "--max-connections",
            "12",
        ],
    );
    let held: Vec<TcpStream> = (0..8).map(|_| connect_from(ATTACKER, s.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, body) = request(
        &s,
        ATTACKER,
        format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr).as_bytes(),
    );
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap_or("")
            .contains("too many connections")
    );
    // Another client is served.
    assert_eq!(get(&s, "/healthz").0, 200);
    // The total cap: 8 + 4 from the probe's address fill it (once the server has let go of
    // the probe's connection just closed).
    std::thread::sleep(Duration::from_millis(300));
    let more: Vec<TcpStream> = (0..4).map(|_| connect_from(PROBE, s.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(get(&s, "/healthz").0, 503);
    drop(more);
    drop(held);
    assert!(eventually(3, || get(&s, "/healthz").0 == 200));
}

#[test]
fn uploads_beyond_a_clients_cap_get_429() {
    let s = start(
        "upload-cap",
        &["--max-uploads-per-client", "1", "--max-uploads", "2"],
    );
    let t = trace(1000);
    let mut first = begin_upload(ATTACKER, s.addr, t.len());
    first.write_all(&t[..100]).expect("a start");
    std::thread::sleep(Duration::from_millis(300));
    let (status, head, body) = post(&s, ATTACKER, &t, "");
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    // Another client may upload.
    assert_eq!(post(&s, PROBE, &t, "").0, 201);
    // The first upload, finished, is stored.
    first.write_all(&t[100..]).expect("the rest");
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = String::new();
    let _ = BufReader::new(first).read_line(&mut line);
    assert!(line.starts_with("HTTP/1.1 201"), "{line}");
}

#[test]
fn mostly_damaged_uploads_are_refused_with_a_short_answer() {
    let s = start("damage", &[]);
    // A valid trace followed by 4 MiB of nil bytes: one malformed record per byte.
    let mut bomb = trace(10);
    bomb.extend(std::iter::repeat_n(0xc0u8, 4 << 20));
    let t0 = Instant::now();
    let (status, _, body) = post(&s, ATTACKER, &bomb, "");
    assert_eq!(status, 422, "{}", String::from_utf8_lossy(&body));
    assert!(body.len() < 2048, "{} bytes", body.len());
    let error = json(&body)["error"].as_str().unwrap_or("").to_owned();
    assert!(error.contains("mostly damage"), "{error}");
    // Judged by all its warnings, not the first few the decoder keeps of each kind.
    let counted: u64 = error
        .split_once(" warnings against")
        .and_then(|(head, _)| head.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        counted > analysis_core::MAX_WARNINGS_PER_KIND as u64,
        "{error}"
    );
    assert!(s.stored().is_empty());
    assert!(t0.elapsed() < Duration::from_secs(20));
    // A trace with some damage is stored; its answer lists the first warnings and counts all
    // (more than the decoder keeps of one kind).
    let mut scratched = trace(3000);
    scratched.extend(std::iter::repeat_n(0xc0u8, 150));
    let (status, _, body) = post(&s, ATTACKER, &scratched, "");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let j = json(&body);
    assert_eq!(j["warnings"].as_array().map(Vec::len), Some(20));
    assert_eq!(j["warnings_total"].as_u64(), Some(150), "{j}");
    assert!(body.len() < 8192, "{} bytes", body.len());
}

#[test]
fn cross_site_browser_uploads_are_refused() {
    let s = start("origin", &[]);
    let t = trace(500);
    for headers in [
        "Origin: https://evil.example\r\nSec-Fetch-Site: cross-site\r\n".to_owned(),
        "Origin: https://evil.example\r\n".to_owned(),
        "Origin: null\r\n".to_owned(),
        "Sec-Fetch-Site: same-site\r\n".to_owned(),
        format!("Origin: http://{}.evil.example\r\n", s.addr),
    ] {
        let (status, _, body) = post(&s, ATTACKER, &t, &headers);
        assert_eq!(status, 403, "{headers}: {}", String::from_utf8_lossy(&body));
    }
    assert!(s.stored().is_empty());
    // The server's own pages, and clients that send no Origin, may upload.
    let own = format!(
        "Origin: http://{}\r\nSec-Fetch-Site: same-origin\r\n",
        s.addr
    );
    assert_eq!(post(&s, ATTACKER, &t, &own).0, 201);
    assert_eq!(post(&s, ATTACKER, &t, "").0, 201);
}

fn serve_fails(args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("serve")
        .args(args)
        .env_remove("GPUCOLLECT_UPLOAD_TOKEN")
        .env_remove("GPUCOLLECT_READ_TOKEN")
        .envs(envs.iter().copied())
        .output()
        .expect("runs");
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unsafe_configurations_refuse_to_start() {
    let dir = store_dir(SUITE, "defaults");
    let store = dir.display().to_string();
    // Reachable from other machines without an upload token. (It fails before listening.)
    let e = serve_fails(&["--addr", "0.0.0.0:0", "--store", &store], &[]);
    assert!(e.contains("--allow-anonymous-uploads"), "{e}");
    // Empty tokens, by flag or environment.
    let e = serve_fails(&["--store", &store, "--upload-token", ""], &[]);
    assert!(e.contains("empty"), "{e}");
    let e = serve_fails(&["--store", &store, "--read-token", " "], &[]);
    assert!(e.contains("empty"), "{e}");
    let e = serve_fails(&["--store", &store], &[("GPUCOLLECT_UPLOAD_TOKEN", "")]);
    assert!(e.contains("GPUCOLLECT_UPLOAD_TOKEN"), "{e}");
    let e = serve_fails(&["--store", &store], &[("GPUCOLLECT_READ_TOKEN", "")]);
    assert!(e.contains("GPUCOLLECT_READ_TOKEN"), "{e}");
}

#[test]
fn tokens_never_reach_the_logs() {
    let s = start_in(
        &store_dir(SUITE, "logs"),
        &[
            "--upload-token",
            "UPLOADSECRET42",
            "--read-token",
            "READSECRET42",
        ],
        &[("RUST_LOG", "trace")],
    );
    let t = trace(300);
    let (status, _, body) = post(&s, PROBE, &t, "Authorization: Bearer UPLOADSECRET42\r\n");
    assert_eq!(status, 201);
    let id = json(&body)["id"].as_str().expect("id").to_owned();
    for path in [
        format!("/t/{id}?token=READSECRET42"),
        format!("/api/v1/traces/{id}?token=READSECRET42"),
        format!("/api/v1/traces/{id}?tok%65n=READSECRET42"),
        format!("/api/v1/traces/{id}?token=wrongREADSECRET42"),
    ] {
        let _ = get(&s, &path);
    }
    std::thread::sleep(Duration::from_millis(300));
    let log = s.log();
    assert!(log.contains("/api/v1/traces"), "trace logging is on: {log}");
    assert!(!log.contains("SECRET42"), "{log}");
}

#[test]
fn smaller_faults_are_fixed() {
    let t = trace(2000);
    // An upload larger than the whole store (--max-bytes) is refused, not stored and deleted.
    let s = start("max-bytes", &["--max-bytes", &(t.len() / 2).to_string()]);
    let (status, _, body) = post(&s, PROBE, &t, "");
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    drop(s);
    // A client that half-closes after its request still gets the answer.
    let s = start("half-close", &["--read-token", "r/t+k"]);
    let mut tcp = connect_from(PROBE, s.addr);
    write!(tcp, "GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr).expect("request");
    tcp.shutdown(std::net::Shutdown::Write).expect("half-close");
    tcp.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let (status, _, _) = read_answer(&mut tcp);
    assert_eq!(status, 200);
    // The upload answer's link carries the read token; downloads are attachments.
    let (status, head, body) = post(&s, PROBE, &t, "");
    assert_eq!(status, 201);
    let j = json(&body);
    let id = j["id"].as_str().expect("id");
    assert_eq!(
        j["link"].as_str(),
        Some(format!("/t/{id}?token=r/t%2Bk").as_str())
    );
    assert!(head.contains(&format!("/t/{id}?token=r/t%2Bk")), "{head}");
    let (status, _, _) = get(&s, j["link"].as_str().expect("link"));
    assert_eq!(status, 303);
    let (status, head, _) = get(&s, &format!("/api/v1/traces/{id}?token=r%2Ft%2Bk"));
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains(&format!(
            "content-disposition: attachment; filename=\"{id}.msgpack\""
        )),
        "{head}"
    );
}

#[test]
fn servers_sharing_a_folder_leave_each_others_uploads_alone() {
    let dir = store_dir(SUITE, "shared");
    let a = start_in(&dir, &[], &[]);
    let t = trace(3000);
    let mut tcp = begin_upload(PROBE, a.addr, t.len());
    tcp.write_all(&t[..t.len() / 2]).expect("half");
    assert!(eventually(5, || common::staged_uploads(&dir) == 1));
    // A second server starts on the same folder while the upload is in flight.
    let b = start_in(&dir, &[], &[]);
    assert_eq!(get(&b, "/healthz").0, 200);
    tcp.write_all(&t[t.len() / 2..]).expect("the rest");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = String::new();
    let _ = BufReader::new(tcp).read_line(&mut line);
    assert!(line.starts_with("HTTP/1.1 201"), "{line}");
    assert_eq!(a.stored().len(), 1);
    // A server killed mid-upload leaves a staging folder the next start removes.
    let mut tcp = begin_upload(PROBE, b.addr, t.len());
    tcp.write_all(&t[..t.len() / 2]).expect("half");
    assert!(eventually(5, || common::staged_uploads(&dir) == 1));
    drop(b);
    drop(tcp);
    let _c = start_in(&dir, &[], &[]);
    assert_eq!(common::staged_uploads(&dir), 0);
    drop(a);
}

#[test]
fn concurrent_uploads_run_retention_one_pass_at_a_time() {
    let t = trace(1000);
    let s = start("retention", &["--max-bytes", &(t.len() * 3).to_string()]);
    let addr = s.addr;
    let host = s.addr.to_string();
    for _ in 0..3 {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let t = t.clone();
                let host = host.clone();
                std::thread::spawn(move || {
                    let mut tcp = connect_from(PROBE, addr);
                    let mut raw = format!(
                        "POST /api/v1/traces HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        t.len()
                    )
                    .into_bytes();
                    raw.extend_from_slice(&t);
                    let _ = tcp.write_all(&raw);
                    read_answer(&mut tcp).0
                })
            })
            .collect();
        for w in workers {
            let status = w.join().expect("worker");
            assert!(matches!(status, 201 | 429 | 503), "{status}");
        }
    }
    assert!(eventually(5, || s.stored().len() <= 3), "{:?}", s.stored());
    std::thread::sleep(Duration::from_millis(300));
    let log = s.log();
    assert!(!log.contains("retention failed"), "{log}");
}

#[test]
fn upload_treats_a_redirect_as_an_error() {
    // A server that redirects every request, and answers the redirected one with success.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut c) = conn else { continue };
            let mut head = Vec::new();
            let mut buf = [0u8; 65536];
            c.set_read_timeout(Some(Duration::from_millis(500))).ok();
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
                if head.windows(4).any(|w| w == b"\r\n\r\n") && !head.starts_with(b"POST") {
                    break;
                }
            }
            let answer = if head.starts_with(b"POST /api/v1/traces ") {
                "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
            } else {
                let body = r#"{"id":"x","link":"/t/x","warnings":[]}"#;
                format!(
                    "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            };
            let _ = c.write_all(answer.as_bytes());
        }
    });
    // Removed when the test ends, whatever way it ends.
    let file = tempfile::Builder::new()
        .prefix("gpucollect-redirect-")
        .suffix(".msgpack")
        .tempfile()
        .expect("temporary file");
    std::fs::write(file.path(), trace(200)).expect("trace");
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args(["upload", "--server", &format!("http://{addr}")])
        .arg(file.path())
        .env_remove("GPUCOLLECT_UPLOAD_TOKEN")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("redirected") && err.contains("/elsewhere"),
        "{err}"
    );
}

#[test]
fn a_client_that_stops_reading_a_download_is_cut_off() {
    let s = start("slow-read", &["--body-timeout", "1s"]);
    let t = trace(800_000);
    assert!(t.len() > 8 << 20, "{} bytes", t.len());
    let (status, _, body) = post(&s, PROBE, &t, "");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = json(&body)["id"].as_str().expect("id").to_owned();
    // Ask for the trace, read nothing for 4 s (the socket buffers hold far less than the
    // trace), then read what comes.
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.set_recv_buffer_size(32 * 1024).expect("small buffer");
    sock.bind(&SocketAddr::from((ATTACKER, 0)).into())
        .expect("bind");
    sock.connect(&s.addr.into()).expect("connect");
    let mut tcp: TcpStream = sock.into();
    write!(
        tcp,
        "GET /api/v1/traces/{id} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        s.addr
    )
    .expect("request");
    std::thread::sleep(Duration::from_secs(4));
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got);
    assert!(
        got.len() < t.len(),
        "the whole trace ({} bytes) came after the stall",
        got.len()
    );
}
