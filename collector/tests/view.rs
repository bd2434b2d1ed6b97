//! `gpucollect view FILE`: a server of its own on a free loopback port, the file served where it
//! lies behind a read token, no uploads, and its private store removed when it stops.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{Killed, agent, store_dir, trace};

/// Starts `gpucollect view FILE --no-open ARGS`; returns the child and the link it printed.
fn spawn_view(file: &std::path::Path, args: &[&str]) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("view")
        .arg(file)
        .arg("--no-open")
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("view starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let link = loop {
        let line = lines
            .next()
            .expect("view printed its link")
            .expect("readable stderr");
        if let Some(rest) = line
            .split(" at ")
            .nth(1)
            .filter(|_| line.starts_with("gpucollect view:"))
        {
            break rest.split_whitespace().next().expect("link").to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Killed(child), link)
}

#[test]
fn view_serves_the_file_behind_a_token_and_cleans_up() {
    let dir = store_dir("view", "serves");
    let path = dir.join("run.msgpack");
    let bytes = trace(5_000);
    std::fs::write(&path, &bytes).expect("write trace");
    let (mut child, link) = spawn_view(&path, &[]);
    // http://127.0.0.1:PORT/t/<id>?token=<token>
    let (base, rest) = link.split_once("/t/").expect("a share link");
    let (id, token) = rest
        .split_once("?token=")
        .expect("the link carries the read token");
    assert!(base.starts_with("http://127.0.0.1:"), "{link}");

    // The link sends the browser to the viewer, which loads the trace with the token.
    let redirect = agent().get(&link).call().expect("link");
    assert_eq!(redirect.status(), 303);
    let to = redirect
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("a location")
        .to_owned();
    assert!(to.contains(id) && to.contains(token), "{to}");
    let mut page = agent()
        .get(format!("{base}{}", to.split('#').next().unwrap_or(&to)))
        .call()
        .expect("page");
    assert_eq!(page.status(), 200);
    // The page says this server takes no uploads, so the viewer offers no Share button.
    let html = page.body_mut().read_to_string().expect("page text");
    assert!(
        html.contains(r#"<meta name="gpucollect-uploads" content="off">"#),
        "{}",
        &html[..html.len().min(400)]
    );
    let download = format!("{base}/api/v1/traces/{id}?token={token}");
    let mut got = agent().get(&download).call().expect("download");
    assert_eq!(got.status(), 200);
    let body = got.body_mut().read_to_vec().expect("body");
    assert_eq!(body, bytes, "the file is served as it is");

    // Without the token: refused. Uploads: refused.
    let denied = agent()
        .get(format!("{base}/api/v1/traces/{id}"))
        .call()
        .expect("answer");
    assert!(
        matches!(denied.status().as_u16(), 401 | 403),
        "{}",
        denied.status()
    );
    let upload = agent()
        .post(format!("{base}/api/v1/traces"))
        .send(&bytes[..])
        .expect("answer");
    assert_eq!(upload.status(), 401);

    // SIGTERM stops it, and its private store goes with it; the file stays.
    let pid = child.0.id().to_string();
    let stores_before = view_stores(id);
    assert_eq!(stores_before.len(), 1, "one private store while it runs");
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = child.0.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert!(view_stores(id).is_empty(), "its store is removed");
    assert_eq!(std::fs::read(&path).expect("file stays"), bytes);
}

/// The private stores under the temp folder that hold trace `id`.
fn view_stores(id: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gpucollect-view-"))
                && p.join("traces").join(format!("{id}.msgpack")).exists()
        })
        .collect()
}

#[test]
fn view_refuses_what_it_cannot_serve() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .args(["view", "/no/such/file.msgpack", "--no-open"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot open /no/such/file.msgpack"), "{err}");

    let dir = store_dir("view", "refuses");
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("view")
        .arg(&dir)
        .arg("--no-open")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a file"), "{err}");

    let file = dir.join("t.msgpack");
    std::fs::write(&file, trace(1_000)).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("view")
        .arg(&file)
        .args(["--no-open", "--addr", "0.0.0.0:0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address"), "{err}");
}
