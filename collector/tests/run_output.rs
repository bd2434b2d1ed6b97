//! `gpucollect -o FILE PROGRAM`: the output file is truncated only once the program has
//! started, so a typo in the program's name keeps an existing trace.

use std::process::Command;

#[test]
fn a_program_that_does_not_start_leaves_the_output_file_alone() {
    let dir = std::env::temp_dir().join(format!("gpucollect-run-output-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let existing = dir.join("existing.msgpack");
    let before = b"an earlier trace, not to be lost".to_vec();
    std::fs::write(&existing, &before).expect("write");
    // Any file will do as the injection library: the program never starts.
    let inject = dir.join("libinject.so");
    std::fs::write(&inject, b"").expect("write");
    for out in [&existing, &dir.join("new.msgpack")] {
        let o = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
            .arg("--inject")
            .arg(&inject)
            .arg("-o")
            .arg(out)
            .arg("./no-such-program-typo")
            .output()
            .expect("runs");
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no such program"), "{err}");
    }
    assert_eq!(std::fs::read(&existing).expect("still there"), before);
    assert!(
        !dir.join("new.msgpack").exists(),
        "a file created for a run that did not happen is removed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
