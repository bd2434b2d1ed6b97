//! gpucollect's Python hook (`collector/src/capture/python/`): loaded into an unmodified
//! Python program and its children through PYTHONPATH, activated only by `torch`/`cupy`, and
//! off with `--no-framework`. Runs `tests/fake-frameworks/hook_probe.py` under the real
//! `gpucollect` binary (no CUDA needed: the program never initialises it).

use std::path::{Path, PathBuf};
use std::process::Command;

fn frameworks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("collector has a parent")
        .join("tests/fake-frameworks")
}

/// One `probe` line of hook_probe.py.
#[derive(Debug)]
struct Probe {
    kind: String,
    finder: bool,
    active: bool,
    user_site: bool,
    hook_dir: String,
}

struct Outcome {
    probes: Vec<Probe>,
    stderr: String,
}

impl Outcome {
    fn hook_messages(&self) -> usize {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("gpucollect: torch imported"))
            .count()
    }
}

fn run_probe(opts: &[&str], args: &[&str], pythonpath: Option<&str>) -> Outcome {
    let dir = frameworks_dir();
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "python-hook-{}.msgpack",
        args.join("-") + &opts.join("-")
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpucollect"));
    cmd.arg("--no-nvml")
        .arg("-o")
        .arg(&trace)
        .args(opts)
        .arg("python3")
        .arg(dir.join("hook_probe.py"))
        .args(args)
        .env("GPUCOLLECT_CUPTI_PATH", "/nonexistent/libcupti.so");
    match pythonpath {
        Some(p) => cmd.env("PYTHONPATH", p),
        None => cmd.env_remove("PYTHONPATH"),
    };
    let out = cmd.output().expect("run gpucollect");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let probes = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("probe "))
        .map(|l| {
            let field = |name: &str| {
                l.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("{name} in {l}"))
                    .to_string()
            };
            Probe {
                kind: field("kind"),
                finder: field("finder") == "1",
                active: field("active") == "1",
                user_site: field("user_site") == "1",
                hook_dir: field("hook_dir"),
            }
        })
        .collect();
    Outcome { probes, stderr }
}

fn fake_pythonpath() -> String {
    let dir = frameworks_dir();
    format!("{}:{}", dir.join("user-site").display(), dir.display())
}

#[test]
fn torch_import_activates_capture_in_the_program_and_every_child() {
    let o = run_probe(&[], &["torch", "children"], Some(&fake_pythonpath()));
    let kinds: Vec<&str> = o.probes.iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["main", "spawn", "forkserver", "subprocess"],
        "{}",
        o.stderr
    );
    for p in &o.probes {
        assert!(p.finder && p.active, "{p:?}");
        assert!(p.user_site, "the user's sitecustomize did not run: {p:?}");
        assert_ne!(p.hook_dir, "-", "{p:?}");
    }
    // One line per process, not per import.
    assert_eq!(o.hook_messages(), 4, "{}", o.stderr);
    // The private directory is gone once the run is over.
    let hook_dir = Path::new(&o.probes[0].hook_dir);
    assert!(
        hook_dir.starts_with(std::env::temp_dir()),
        "{}",
        hook_dir.display()
    );
    assert!(!hook_dir.exists(), "{} was left behind", hook_dir.display());
}

#[test]
fn a_program_without_torch_loads_nothing_and_says_nothing() {
    // `none`: torch is importable but not imported; `broken`: `import torch` fails.
    for mode in ["none", "broken"] {
        let o = run_probe(&[], &[mode], Some(&fake_pythonpath()));
        let [p] = o.probes.as_slice() else {
            panic!("{mode}: {:?} {}", o.probes.len(), o.stderr)
        };
        // The finder is installed but inert: the capture module is never imported.
        assert!(p.finder && !p.active, "{mode}: {p:?}");
        assert_eq!(o.hook_messages(), 0, "{mode}: {}", o.stderr);
        assert!(
            !o.stderr.contains("framework capture"),
            "{mode}: {}",
            o.stderr
        );
    }
}

#[test]
fn a_user_sitecustomize_runs_with_and_without_the_hook() {
    for opts in [&[][..], &["--no-framework"][..]] {
        let o = run_probe(opts, &["none"], Some(&fake_pythonpath()));
        assert!(o.probes[0].user_site, "{opts:?}: {:?}", o.probes);
    }
}

#[test]
fn no_framework_leaves_the_program_alone() {
    let o = run_probe(
        &["--no-framework"],
        &["torch", "children"],
        Some(&fake_pythonpath()),
    );
    assert_eq!(o.probes.len(), 4, "{}", o.stderr);
    for p in &o.probes {
        assert!(!p.finder && !p.active && p.hook_dir == "-", "{p:?}");
    }
    assert_eq!(o.hook_messages(), 0, "{}", o.stderr);
}

/// The variables a program sees, run under gpucollect with `opts`.
fn program_env(opts: &[&str]) -> (String, String) {
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-hook-env.msgpack");
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("--no-nvml")
        .arg("-o")
        .arg(&trace)
        .args(opts)
        .arg("env")
        .env("GPUCOLLECT_CUPTI_PATH", "/nonexistent/libcupti.so")
        .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
        .env("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc")
        .env_remove("XLA_PYTHON_CLIENT_PREALLOCATE")
        .output()
        .expect("run gpucollect");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn framework_exact_turns_the_caching_allocators_off_and_says_so() {
    let (env, stderr) = program_env(&["--framework-exact"]);
    for line in [
        "PYTORCH_NO_CUDA_MEMORY_CACHING=1",
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
        "XLA_PYTHON_CLIENT_PREALLOCATE=false",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} not in {env}");
    }
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("gpucollect: --framework-exact:"))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(
        notices[0].contains("(was bfc)") && notices[0].contains("slower"),
        "{stderr}"
    );

    // Never without the option.
    let (env, stderr) = program_env(&[]);
    assert!(!env.contains("PYTORCH_NO_CUDA_MEMORY_CACHING"), "{env}");
    assert!(
        env.lines().any(|l| l == "XLA_PYTHON_CLIENT_ALLOCATOR=bfc"),
        "{env}"
    );
    assert!(!stderr.contains("framework-exact"), "{stderr}");
}
