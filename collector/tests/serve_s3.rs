//! `gpucollect serve --store s3://…` against a real S3-compatible server (moto, from PyPI:
//! `pip install 'moto[server]'`, installed by `.ci/run`). Two server replicas share the store.
//! Set GPUCOLLECT_SKIP_S3=1 to skip on a machine without moto; CI never sets it.

mod common;

use common::{Killed, agent};

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn body(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Vec<u8>) {
    let mut r = r.expect("request completes");
    let mut b = Vec::new();
    let _ = r.body_mut().as_reader().read_to_end(&mut b);
    (r.status().as_u16(), b)
}

fn start_server(endpoint: &str) -> (Killed, String) {
    let (child, base) = common::spawn_serve(
        &[
            "--demo-events",
            "300",
            "--store",
            "s3://gpucollect-test/shared/traces",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true"),
        ],
    );
    (Killed(child), base)
}

#[test]
fn two_replicas_share_an_s3_store() {
    if std::env::var_os("GPUCOLLECT_SKIP_S3").is_some() {
        eprintln!("skipped: GPUCOLLECT_SKIP_S3 is set");
        return;
    }
    let port = free_port();
    let _moto = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .unwrap_or_else(|e| {
            panic!("cannot start moto_server ({e}): install it with `pip install 'moto[server]'` (.ci/run does), or set GPUCOLLECT_SKIP_S3=1")
        });
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, _)) = std::panic::catch_unwind(|| body(agent().get(&endpoint).call())) {
            break;
        }
        assert!(Instant::now() < deadline, "moto did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, _) = body(
        agent()
            .put(format!("{endpoint}/gpucollect-test"))
            .send_empty(),
    );
    assert_eq!(status, 200, "bucket created");

    let (_a, base_a) = start_server(&endpoint);
    let (_b, base_b) = start_server(&endpoint);
    let t = analysis_core::synth::generate(analysis_core::synth::Scenario::Oom, 3000, 2).0;
    let (status, up) = body(agent().post(format!("{base_a}/api/v1/traces")).send(&t[..]));
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&up));
    let j: serde_json::Value = serde_json::from_slice(&up).expect("json");
    let id = j["id"].as_str().expect("id");
    // The other replica serves it.
    let (status, down) = body(agent().get(format!("{base_b}/api/v1/traces/{id}")).call());
    assert_eq!(status, 200);
    assert_eq!(down, t);
    let (status, _) = body(agent().get(format!("{base_b}/t/{id}")).call());
    assert_eq!(status, 303);
    // A non-trace is refused and nothing is stored for it.
    let (status, _) = body(
        agent()
            .post(format!("{base_b}/api/v1/traces"))
            .send(&b"not a trace"[..]),
    );
    assert_eq!(status, 400);
    let (_, listing) = body(
        agent()
            .get(format!(
                "{endpoint}/gpucollect-test?list-type=2&prefix=shared/"
            ))
            .call(),
    );
    let listing = String::from_utf8_lossy(&listing);
    assert_eq!(listing.matches("<Key>").count(), 1, "{listing}");
    assert!(
        listing.contains(&format!("shared/traces/{id}.msgpack")),
        "{listing}"
    );
    let (status, _) = body(
        agent()
            .get(format!("{base_a}/api/v1/traces/{}", "0".repeat(32)))
            .call(),
    );
    assert_eq!(status, 404);
}
