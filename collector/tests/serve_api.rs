//! `gpucollect serve` API tests against the real binary on loopback: uploads, downloads, share
//! links, limits, tokens, traversal attempts, non-traces, truncated bodies, security headers,
//! retention, and durability across kill -9.

mod common;

use common::{Killed, agent, store_dir, trace};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SUITE: &str = "serve";

struct Server {
    /// The server process, killed when this is dropped.
    _child: Killed,
    base: String,
    store: PathBuf,
}

impl Server {
    fn start(store: &Path, extra: &[&str]) -> Self {
        let store_arg = store.display().to_string();
        let mut args = vec!["--demo-events", "500", "--store", &store_arg];
        args.extend_from_slice(extra);
        let (child, base) = common::spawn_serve(&args, &[]);
        Self {
            _child: Killed(child),
            base,
            store: store.to_path_buf(),
        }
    }

    fn kill9(self) {
        drop(self);
    }

    fn stored(&self) -> Vec<String> {
        common::stored(&self.store)
    }

    /// Staged uploads (`tmp/<server instance>/<id>.part`).
    fn temp_files(&self) -> usize {
        common::staged_uploads(&self.store)
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut r = r.expect("request completes");
    let headers = r
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let status = r.status().as_u16();
    let mut body = Vec::new();
    let _ = r.body_mut().as_reader().read_to_end(&mut body);
    Answer {
        status,
        headers,
        body,
    }
}

fn upload(s: &Server, bytes: &[u8], token: Option<&str>) -> Answer {
    let mut req = agent().post(format!("{}/api/v1/traces", s.base));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.send(bytes))
}

/// Posts `body` over a raw connection, as Content-Length or chunked, ignoring write errors (a
/// server may answer and close before the body is sent); returns the status code.
fn raw_post(addr: &str, body: &[u8], chunked: bool) -> u16 {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = if chunked {
        format!(
            "POST /api/v1/traces HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
    } else {
        format!(
            "POST /api/v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
    };
    let _ = tcp.write_all(head.as_bytes());
    for c in body.chunks(8192) {
        let ok = if chunked {
            write!(tcp, "{:x}\r\n", c.len())
                .and_then(|()| tcp.write_all(c))
                .and_then(|()| tcp.write_all(b"\r\n"))
        } else {
            tcp.write_all(c)
        };
        if ok.is_err() {
            break;
        }
    }
    if chunked {
        let _ = tcp.write_all(b"0\r\n\r\n");
    }
    let mut status = String::new();
    let _ = BufReader::new(tcp).read_line(&mut status);
    status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn get(s: &Server, path: &str) -> Answer {
    answer(agent().get(format!("{}{path}", s.base)).call())
}

#[test]
fn upload_download_and_share_link_round_trip() {
    let s = Server::start(&store_dir(SUITE, "roundtrip"), &[]);
    assert_eq!(get(&s, "/healthz").status, 200);
    let t = trace(3000);
    let up = upload(&s, &t, None);
    assert_eq!(up.status, 201, "{}", String::from_utf8_lossy(&up.body));
    let j = up.json();
    let id = j["id"].as_str().expect("id").to_owned();
    assert_eq!(id.len(), 32);
    assert_eq!(j["bytes"].as_u64(), Some(t.len() as u64));
    assert!(j["records"].as_u64().unwrap_or(0) > 3000);
    let down = get(&s, &format!("/api/v1/traces/{id}"));
    assert_eq!(down.status, 200);
    assert_eq!(down.body, t, "the stored trace is byte-identical");
    let link = get(&s, &format!("/t/{id}"));
    assert_eq!(link.status, 303);
    assert_eq!(
        link.header("location"),
        Some(format!("/?trace=/api/v1/traces/{id}").as_str())
    );
    let embed = get(&s, &format!("/embed/{id}?view=timeline"));
    assert_eq!(embed.status, 303);
    let loc = embed.header("location").unwrap_or_default();
    assert!(
        loc.contains("embed=1") && loc.contains("view=timeline"),
        "{loc}"
    );
    assert_eq!(get(&s, "/t/00000000000000000000000000000000").status, 404);
    let demos = get(&s, "/api/v1/demos").json();
    let first = demos[0]["trace_url"].as_str().expect("a demo");
    let demo = get(&s, first);
    assert_eq!(demo.status, 200);
    assert!(
        analysis_core::load(&demo.body)
            .expect("demo decodes")
            .model
            .clean_end
    );
}

#[test]
fn non_traces_oversized_and_truncated_uploads_leave_nothing_behind() {
    let s = Server::start(&store_dir(SUITE, "hostile"), &["--max-upload", "64KiB"]);
    // Not a trace at all, and a trace whose header is right but whose body turns to garbage.
    let mut corrupt = trace(200);
    let n = corrupt.len();
    corrupt[n / 2..].fill(0xc1);
    for (bytes, what) in [
        (b"hello world".to_vec(), "text"),
        (vec![0xff; 1000], "bytes"),
        (corrupt, "corrupt trace"),
        (Vec::new(), "empty body"),
    ] {
        let a = upload(&s, &bytes, None);
        assert_eq!(
            a.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert!(
            a.json()["error"].as_str().unwrap_or("").contains("refused"),
            "{what}"
        );
    }
    // Over the limit, announced by Content-Length: refused before the body is read.
    let big = trace(20_000);
    assert!(big.len() > 64 * 1024);
    let addr = s.base.trim_start_matches("http://").to_owned();
    assert_eq!(raw_post(&addr, &big, false), 413);
    // Over the limit without Content-Length (chunked): refused while streaming.
    assert_eq!(raw_post(&addr, &big, true), 413);
    // A body cut short: the client announces more than it sends, then hangs up.
    let mut tcp = TcpStream::connect(&addr).expect("connect");
    let small = trace(300);
    write!(
        tcp,
        "POST /api/v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        small.len() + 10_000
    )
    .expect("write headers");
    tcp.write_all(&small).expect("write part of the body");
    drop(tcp);
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.stored().is_empty(), "{:?}", s.stored());
    assert_eq!(s.temp_files(), 0);
}

#[test]
fn traversal_attempts_are_refused() {
    let s = Server::start(&store_dir(SUITE, "traversal"), &[]);
    for path in [
        "/api/v1/traces/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/v1/traces/%2e%2e",
        "/api/v1/traces/0123456789abcdef0123456789ABCDEF",
        "/t/..%2Fsecret",
        "/embed/%00",
    ] {
        let a = get(&s, path);
        assert_eq!(a.status, 400, "{path}");
        assert!(!a.body.windows(5).any(|w| w == b"root:"), "{path}");
    }
    for path in [
        "/..%2F..%2Fetc%2Fpasswd",
        "/%2e%2e/Cargo.toml",
        "/nonexistent.js",
    ] {
        assert_eq!(get(&s, path).status, 404, "{path}");
    }
}

#[test]
fn tokens_guard_uploads_and_reads() {
    let s = Server::start(
        &store_dir(SUITE, "tokens"),
        &["--upload-token", "up-secret", "--read-token", "read-secret"],
    );
    let t = trace(500);
    assert_eq!(upload(&s, &t, None).status, 401);
    assert_eq!(upload(&s, &t, Some("wrong")).status, 401);
    let up = upload(&s, &t, Some("up-secret"));
    assert_eq!(up.status, 201);
    let id = up.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(get(&s, &format!("/api/v1/traces/{id}")).status, 401);
    assert_eq!(get(&s, &format!("/t/{id}")).status, 401);
    let ok = get(&s, &format!("/api/v1/traces/{id}?token=read-secret"));
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, t);
    let link = get(&s, &format!("/t/{id}?token=read-secret"));
    assert_eq!(link.status, 303);
    assert!(
        link.header("location")
            .unwrap_or("")
            .contains("token%3Dread-secret"),
        "{:?}",
        link.header("location")
    );
}

#[test]
fn security_headers_are_on_every_response() {
    let s = Server::start(
        &store_dir(SUITE, "headers"),
        &[
            "--frame-ancestor",
            "https://wiki.example.com",
            "--allow-trace-origin",
            "https://files.example.org",
        ],
    );
    for path in ["/", "/healthz", "/api/v1", "/api/v1/traces/zz"] {
        let a = get(&s, path);
        let csp = a.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'self' https://wiki.example.com"),
            "{path}: {csp}"
        );
        // `?trace=` links may download from the allowed origin.
        assert!(
            csp.contains("connect-src 'self' https://files.example.org;"),
            "{path}: {csp}"
        );
        assert!(csp.contains("default-src 'self'"), "{path}: {csp}");
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
    }
}

#[test]
fn retention_keeps_the_store_under_its_size_limit_oldest_first() {
    let t = trace(2000);
    let limit = t.len() * 2 + t.len() / 2;
    let s = Server::start(
        &store_dir(SUITE, "retention"),
        &["--max-bytes", &limit.to_string()],
    );
    let mut ids = Vec::new();
    for _ in 0..4 {
        let up = upload(&s, &t, None);
        assert_eq!(up.status, 201);
        ids.push(up.json()["id"].as_str().expect("id").to_owned());
        std::thread::sleep(Duration::from_millis(1100));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.stored().len() > 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let kept = s.stored();
    assert_eq!(kept.len(), 2, "{kept:?}");
    for id in &ids[2..] {
        assert!(
            kept.contains(&format!("{id}.msgpack")),
            "newest kept: {kept:?}"
        );
    }
}

#[test]
fn acknowledged_uploads_survive_kill_9_and_interrupted_ones_vanish() {
    let dir = store_dir(SUITE, "durability");
    let s = Server::start(&dir, &[]);
    let t = trace(4000);
    let up = upload(&s, &t, None);
    assert_eq!(up.status, 201);
    let id = up.json()["id"].as_str().expect("id").to_owned();
    // Start another upload, send half of it, and kill the server mid-stream.
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut tcp = TcpStream::connect(&addr).expect("connect");
    write!(
        tcp,
        "POST /api/v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        t.len()
    )
    .expect("headers");
    tcp.write_all(&t[..t.len() / 2]).expect("half the body");
    tcp.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(300));
    s.kill9();
    drop(tcp);
    let s = Server::start(&dir, &[]);
    assert_eq!(s.stored(), vec![format!("{id}.msgpack")]);
    assert_eq!(s.temp_files(), 0, "a restart removes half-written uploads");
    let down = get(&s, &format!("/api/v1/traces/{id}"));
    assert_eq!(down.status, 200);
    assert_eq!(down.body, t);
}
