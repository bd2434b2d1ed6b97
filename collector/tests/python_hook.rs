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
            .filter(|l| l.starts_with("gpucollect: torch:"))
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

// ---- PyTorch through the Python fallback, on the fake torch and the fake CUDA stack ----

use std::sync::OnceLock;

use analysis_core::format::AllocKind;
use analysis_core::{LoadedTrace, load};

/// The fake CUDA libraries (tests/fake-cuda), built with gcc once for this test binary:
/// libcuda.so.1 (whose cuInit loads the injection library), libcupti.so and an NVTX library.
fn fake_cuda() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = frameworks_dir().parent().expect("tests").join("fake-cuda");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-hook-cuda");
        std::fs::create_dir_all(&out).expect("create the fake CUDA dir");
        let o = |name: &str| out.join(name).display().to_string();
        let lib_dir = format!("-L{}", out.display());
        let rpath = format!("-Wl,-rpath,{}", out.display());
        for args in [
            vec![
                "-Wl,-soname,libcuda.so.1",
                "-o",
                &o("libcuda.so.1"),
                "libcuda.c",
                "-ldl",
                "-lpthread",
            ],
            vec![
                "-o",
                &o("libcupti.so"),
                "libcupti.c",
                &lib_dir,
                "-l:libcuda.so.1",
                &rpath,
            ],
            vec!["-o", &o("libnvtx.so"), "fake_nvtx.c", "-ldl", "-lpthread"],
        ] {
            let st = Command::new("gcc")
                .args(["-shared", "-fPIC", "-g", "-O1"])
                .args(&args)
                .current_dir(&src)
                .status()
                .expect("gcc is needed to build the fake CUDA libraries");
            assert!(st.success(), "gcc {args:?} failed");
        }
        out
    })
}

/// Line of the source line containing `marker` in torch_train.py (1-based).
fn train_line(marker: &str) -> u32 {
    line_in("torch_train.py", marker)
}

/// Line of the source line containing `marker` in `script` (1-based).
fn line_in(script: &str, marker: &str) -> u32 {
    let src = std::fs::read_to_string(frameworks_dir().join(script)).expect("read");
    src.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} in {script}")) as u32
        + 1
}

struct TorchRun {
    trace: LoadedTrace,
    stderr: String,
}

fn run_torch(scenario: &str, opts: &[&str], env: &[(&str, &str)]) -> TorchRun {
    run_script("torch_train.py", scenario, opts, env)
}

/// Runs `script SCENARIO` of tests/fake-frameworks under gpucollect on the fake CUDA stack.
fn run_script(script: &str, scenario: &str, opts: &[&str], env: &[(&str, &str)]) -> TorchRun {
    run_in(&frameworks_dir(), script, scenario, opts, env)
}

/// Runs `script SCENARIO` of the fake frameworks in `dir` (tests/fake-frameworks or a copy)
/// under gpucollect on the fake CUDA stack, with a cache directory of its own
/// (XDG_CACHE_HOME: `dir`/cache unless `env` says otherwise).
fn run_in(
    dir: &Path,
    script: &str,
    scenario: &str,
    opts: &[&str],
    env: &[(&str, &str)],
) -> TorchRun {
    let cuda = fake_cuda();
    let tag = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let trace_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "python-hook-{tag}-{script}-{scenario}{}.msgpack",
        opts.join("")
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_gpucollect"))
        .arg("--no-nvml")
        .arg("-o")
        .arg(&trace_path)
        .args(opts)
        .arg("python3")
        .arg(dir.join(script))
        .arg(scenario)
        .env("GPUCOLLECT_CUPTI_PATH", cuda.join("libcupti.so"))
        .env("FAKE_LIBCUDA", cuda.join("libcuda.so.1"))
        .env("FAKE_NVTX", cuda.join("libnvtx.so"))
        .env("PYTHONPATH", dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env_remove("CXX")
        .envs(env.iter().copied())
        .output()
        .expect("run gpucollect");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let trace = load(&std::fs::read(&trace_path).expect("trace written")).expect("decodes");
    TorchRun { trace, stderr }
}

/// The tensors `torch_train.py leaks` makes each step, by the marker of their line, with their
/// block sizes (a batch of 64 KiB and 4 bytes takes a block of 64.5 KiB).
const LEAKS_TENSORS: [(&str, u64); 4] = [
    ("BATCH_LINE", (64 << 10) + 512),
    ("GRAPH_LINE", 32 << 10),
    ("LIST_LINE", 16 << 10),
    ("CACHE_LINE", 8 << 10),
];

fn blocks(t: &LoadedTrace) -> Vec<analysis_core::model::AllocRecord> {
    t.model
        .allocs
        .iter()
        .filter(|a| a.kind == AllocKind::FrameworkBlock)
        .collect()
}

#[test]
fn torch_tensors_are_framework_blocks_matching_memory_allocated_at_every_sync_point() {
    let r = run_torch("leaks", &[], &[]);
    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    // 6 steps of 4 tensors: batch, activation, list entry, cache entry.
    assert_eq!(blocks.len(), 24, "{}", r.stderr);
    assert_eq!(
        assert_blocks_equal_allocated_at_syncs(&r),
        7,
        "{}",
        r.stderr
    );
    // Each tensor's innermost frame is the user's line that made it, and blocks are not device
    // memory: the driver's segments (2 MiB) hold them.
    for (marker, size) in LEAKS_TENSORS {
        let line = train_line(marker);
        let of_size: Vec<_> = blocks.iter().filter(|a| a.size_bytes == size).collect();
        assert_eq!(of_size.len(), 6, "{marker}");
        for a in of_size {
            let frames = m.stack_frames(a.stack);
            let top = frames.first().expect("a stack");
            assert!(
                top.python && top.file.ends_with("torch_train.py") && top.line == line,
                "{marker}: {frames:#?}"
            );
        }
        // The three leaks keep growing; the batches are freed every step.
        let live = blocks
            .iter()
            .filter(|a| a.size_bytes == size && a.is_live())
            .count();
        assert_eq!(live, if marker == "BATCH_LINE" { 0 } else { 6 }, "{marker}");
    }
    let segments: Vec<_> = m
        .allocs
        .iter()
        .filter(|a| a.kind == AllocKind::Device)
        .collect();
    assert!(!segments.is_empty() && segments.iter().all(|s| s.size_bytes == 2 << 20));
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpucollect: torch:"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("Python fallback"), "{}", r.stderr);
    assert!(m.notices.is_empty(), "{:?}", m.notices);
}

#[test]
fn no_framework_records_no_tensors() {
    let r = run_torch("leaks", &["--no-framework"], &[]);
    assert!(blocks(&r.trace).is_empty());
    assert!(
        !r.trace.model.allocs.is_empty(),
        "the segments are still traced"
    );
    assert!(!r.stderr.contains("gpucollect: torch"), "{}", r.stderr);
}

#[test]
fn entries_lost_to_a_wrapped_history_are_reported() {
    let r = run_torch("burst", &[], &[("GPUCOLLECT_TORCH_MAX_ENTRIES", "16")]);
    let m = &r.trace.model;
    let lost: Vec<_> = m
        .notices
        .iter()
        .filter(|n| n.code == gpucollect_ring::event::notice_code::FRAMEWORK_EVENTS_LOST)
        .collect();
    assert!(!lost.is_empty(), "{}", r.stderr);
    assert!(m.string(lost[0].message).contains("wrapped"));
    // What was read is consistent: no free without its tensor became a bad free.
    assert!(m.free_unknown.is_empty());
    assert!(blocks(&r.trace).len() < 400);
}

#[test]
fn cupy_pool_blocks_of_every_thread_are_framework_blocks_at_their_lines() {
    let r = run_script("cupy_train.py", "-", &[], &[]);
    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    let (at, used): (u64, u64) = m
        .marks
        .iter()
        .find_map(|mk| {
            Some((
                mk.ts_nanos,
                m.string(mk.name).strip_prefix("used ")?.parse().ok()?,
            ))
        })
        .unwrap_or_else(|| panic!("no `used` mark: {}", r.stderr));
    let live: u64 = blocks
        .iter()
        .filter(|a| a.live_at(at))
        .map(|a| a.size_bytes)
        .sum();
    assert_eq!(live, used, "{}", r.stderr);
    let main_thread = blocks[0].thread;
    for (marker, size, count, live_count) in [
        ("CUPY_MAIN_LINE", 24 << 10, 3, 3),
        ("CUPY_TMP_LINE", 40 << 10, 3, 0),
        ("CUPY_THREAD_LINE", 12 << 10, 1, 1),
    ] {
        let line = line_in("cupy_train.py", marker);
        let of: Vec<_> = blocks.iter().filter(|a| a.size_bytes == size).collect();
        assert_eq!(of.len(), count, "{marker}: {}", r.stderr);
        assert_eq!(
            of.iter().filter(|a| a.live_at(at)).count(),
            live_count,
            "{marker}"
        );
        for a in of {
            let frames = m.stack_frames(a.stack);
            let top = frames.first().expect("a stack");
            assert!(
                top.python && top.file.ends_with("cupy_train.py") && top.line == line,
                "{marker}: {frames:#?}"
            );
            // The allocating thread is the block's thread.
            assert_eq!(
                a.thread == main_thread,
                marker != "CUPY_THREAD_LINE",
                "{marker}"
            );
        }
    }
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpucollect: cupy:"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
}

#[test]
fn a_torch_without_allocation_history_says_why_once_and_records_no_tensors() {
    let r = run_torch("leaks", &[], &[("FAKE_TORCH_NO_HISTORY", "1")]);
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpucollect: torch:"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].contains("no tensor-level capture") && lines[0].contains("_record_memory_history"),
        "{}",
        r.stderr
    );
    assert!(blocks(&r.trace).is_empty());
    assert!(
        !r.trace.model.allocs.is_empty(),
        "the segments are still traced"
    );
}

#[test]
fn a_spawned_child_s_tensors_are_its_own_framework_blocks() {
    let r = run_torch("child", &[], &[]);
    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    assert_eq!(blocks.len(), 1, "{}", r.stderr);
    let b = blocks[0];
    assert_eq!(b.size_bytes, 48 << 10);
    assert_ne!(
        b.process, m.processes[0].process,
        "the child's, not the parent's"
    );
    let frames = m.stack_frames(b.stack);
    assert_eq!(
        frames.first().map(|f| f.line),
        Some(train_line("CHILD_LINE"))
    );
}

/// The acceptance of tensor-level capture: on an unmodified program, the report names the
/// leaking Python line of each of the three training-loop leak patterns (the graph kept alive
/// through the loss, a list of tensors, an unbounded cache) with the bytes each keeps, first,
/// and nothing at the driver's segments; a bounded cache is no alarm.
#[test]
fn the_report_names_each_leaking_line_at_tensor_granularity_and_not_a_bounded_cache() {
    assert_the_three_leaks_are_named(&run_torch("leaks", &[], &[]));

    let r = run_torch("bounded", &[], &[]);
    let report = analysis_core::summarize(&r.trace);
    assert!(
        report
            .findings
            .iter()
            .all(|f| f.severity == analysis_core::analysis::Severity::Info),
        "{:#?}",
        report.findings
    );
    // Its tensors were seen: 12 batches and 12 cache entries, at most four entries live at
    // once (all freed when the function returns).
    let blocks = blocks(&r.trace);
    assert_eq!(blocks.len(), 24, "{}", r.stderr);
    let allocated = &r.trace.model.allocated[0];
    // The fourth entry is appended before the oldest is dropped.
    assert_eq!(allocated.peak_bytes, (64 << 10) + 512 + 4 * (16 << 10));
    assert_eq!(allocated.live_bytes, 0);
}

/// A program that dies right after an out-of-memory error (no exit handler runs, no periodic
/// read is due) still has every tensor it held: the history is read at the OOM, through
/// PyTorch's out-of-memory observer.
#[test]
fn the_history_is_read_at_an_out_of_memory_error() {
    let r = run_torch(
        "oom",
        &["--sample-interval-ms", "60000"],
        &[("FAKE_CUDA_MEM_BYTES", "8388608")],
    );
    assert!(r.stderr.contains("pulled every 60000 ms"), "{}", r.stderr);
    let m = &r.trace.model;
    // Four 2 MiB segments of four 512 KiB tensors each; the fifth segment fails.
    assert_eq!(m.failed.len(), 1, "{}", r.stderr);
    let blocks = blocks(&r.trace);
    assert_eq!(blocks.len(), 16, "{}", r.stderr);
    let line = train_line("OOM_LINE");
    for a in &blocks {
        assert!(a.is_live());
        let top = m.stack_frames(a.stack);
        assert_eq!(top.first().map(|f| f.line), Some(line), "{top:#?}");
    }
    assert_eq!(m.allocated[0].live_bytes, 8 << 20);
}

/// At each `sync <bytes>` mark, the live framework blocks add up to the fake's
/// memory_allocated(); returns how many marks there were.
fn assert_blocks_equal_allocated_at_syncs(r: &TorchRun) -> usize {
    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    let mut n = 0;
    for mk in m.marks.iter() {
        let Some(allocated) = m
            .string(mk.name)
            .strip_prefix("sync ")
            .and_then(|b| b.parse::<u64>().ok())
        else {
            continue;
        };
        let live: u64 = blocks
            .iter()
            .filter(|a| a.live_at(mk.ts_nanos))
            .map(|a| a.size_bytes)
            .sum();
        assert_eq!(live, allocated, "at {} ns: {}", mk.ts_nanos, r.stderr);
        n += 1;
    }
    n
}

/// A tensor a side stream used leaves memory_allocated() when it dies (free_requested), before
/// its block is back in the cache (free_completed): the trace frees it at the request, in both
/// capture modes.
#[test]
fn a_block_a_side_stream_used_is_freed_when_memory_allocated_drops() {
    let r = run_torch("streams", &[], &[]);
    assert!(r.stderr.contains("Python fallback"), "{}", r.stderr);
    assert_eq!(assert_blocks_equal_allocated_at_syncs(&r), 2);
    let dir = tracker_frameworks("streams", false);
    let r = run_in(&dir, "torch_train.py", "streams", &[], &[]);
    assert!(r.stderr.contains("trace tracker"), "{}", r.stderr);
    assert_eq!(assert_blocks_equal_allocated_at_syncs(&r), 2);
}

/// A large block the caching allocator does not split (at most 1 MiB would remain) counts whole
/// in memory_allocated(): the trace has its whole size, from the segment's layout, in both
/// capture modes; a block cut from a larger free one keeps its rounded request.
#[test]
fn a_large_block_left_unsplit_counts_whole() {
    let check = |r: &TorchRun| {
        assert_eq!(assert_blocks_equal_allocated_at_syncs(r), 2, "{}", r.stderr);
        let sizes: Vec<u64> = blocks(&r.trace).iter().map(|a| a.size_bytes).collect();
        assert_eq!(sizes, [4 << 20, 1536 << 10], "{}", r.stderr);
    };
    let r = run_torch("unsplit", &[], &[]);
    assert!(r.stderr.contains("Python fallback"), "{}", r.stderr);
    check(&r);
    let dir = tracker_frameworks("unsplit", false);
    let r = run_in(&dir, "torch_train.py", "unsplit", &[], &[]);
    assert!(r.stderr.contains("trace tracker"), "{}", r.stderr);
    check(&r);
}

/// The three leaks of `torch_train.py leaks` are the report's problems, in order, each at its
/// line with the bytes it keeps.
fn assert_the_three_leaks_are_named(r: &TorchRun) {
    let report = analysis_core::summarize(&r.trace);
    let problems: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.severity != analysis_core::analysis::Severity::Info)
        .collect();
    let expect = [
        ("GRAPH_LINE", 6 * (32 << 10)),
        ("LIST_LINE", 6 * (16 << 10)),
        ("CACHE_LINE", 6 * (8 << 10)),
    ];
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
    for (f, (marker, bytes)) in problems.iter().zip(expect) {
        let at = format!("torch_train.py:{}", train_line(marker));
        assert!(f.kind.is_leak(), "{marker}: {f:#?}");
        assert!(f.site.ends_with(&format!("{at})")), "{marker}: {}", f.site);
        assert_eq!(f.bytes, bytes, "{marker}: {f:#?}");
    }
}

// ---- PyTorch through the C++ trace tracker, on a copy of the fake torch with its own
// libc10_cuda.so (tests/fake-frameworks/fake_c10_cuda.cpp) ----

/// A fresh copy of tests/fake-frameworks in `name` under the test's temporary directory, with
/// the fake libc10_cuda.so built into torch/lib (g++), an empty cache directory (`cache/`),
/// and, with `broken_header`, a fake CUDACachingAllocator.h that no longer compiles.
fn tracker_frameworks(name: &str, broken_header: bool) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create the copy");
        for e in std::fs::read_dir(from).expect("read the fake frameworks") {
            let e = e.expect("an entry");
            let (src, name) = (e.path(), e.file_name());
            if name == "__pycache__" {
                continue;
            }
            if src.is_dir() {
                copy(&src, &to.join(&name));
            } else {
                std::fs::copy(&src, to.join(&name)).expect("copy a file");
            }
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tracker-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    copy(&frameworks_dir(), &dir);
    std::fs::create_dir_all(dir.join("torch/lib")).expect("create torch/lib");
    std::fs::create_dir_all(dir.join("cache")).expect("create the cache dir");
    let st = Command::new("g++")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-std=c++17",
            "-Wl,-soname,libc10_cuda.so",
        ])
        .arg("-I")
        .arg(dir.join("torch/include"))
        .arg("-o")
        .arg(dir.join("torch/lib/libc10_cuda.so"))
        .arg(dir.join("fake_c10_cuda.cpp"))
        .status()
        .expect("g++ is needed to build the fake libc10_cuda.so");
    assert!(st.success(), "g++ fake_c10_cuda.cpp failed");
    if broken_header {
        let header = dir.join("torch/include/c10/cuda/CUDACachingAllocator.h");
        let text = std::fs::read_to_string(&header).expect("read the header");
        // What a header of another release could do: the tracker type is gone.
        let text = text.replace(
            "using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;",
            "",
        );
        std::fs::write(&header, text).expect("break the header");
    }
    dir
}

/// The shims in a cache directory.
fn cached_shims(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir.join("cache/gpucollect")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".so"))
        .inspect(|n| assert!(n.starts_with("libgpucollect_torch_tracker-"), "{n}"))
        .collect()
}

fn torch_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("gpucollect: torch:"))
        .collect()
}

#[test]
fn the_trace_tracker_records_each_tensor_in_its_thread_at_the_users_line() {
    let dir = tracker_frameworks("leaks", false);
    let r = run_in(&dir, "torch_train.py", "leaks", &[], &[]);
    let lines = torch_lines(&r.stderr);
    // The first build says so, then the mode.
    assert_eq!(lines.len(), 2, "{}", r.stderr);
    assert!(
        lines[0].contains("building the trace tracker"),
        "{}",
        r.stderr
    );
    assert!(lines[1].contains("trace tracker"), "{}", r.stderr);
    assert!(!r.stderr.contains("Python fallback"), "{}", r.stderr);
    assert_eq!(cached_shims(&dir).len(), 1);

    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    assert_eq!(blocks.len(), 24, "{}", r.stderr);
    // Live tensor bytes equal memory_allocated() at every sync point, with no delay to wait
    // for: the tracker records each tensor before the allocation returns.
    assert_eq!(
        assert_blocks_equal_allocated_at_syncs(&r),
        7,
        "{}",
        r.stderr
    );
    let last_sync = m
        .marks
        .iter()
        .filter(|mk| m.string(mk.name).starts_with("sync "))
        .map(|mk| mk.ts_nanos)
        .max()
        .expect("sync points");
    // The allocating thread (the one that took the segments from the driver), not a reader.
    let segment_thread = m
        .allocs
        .iter()
        .find(|a| a.kind == AllocKind::Device)
        .expect("a segment")
        .thread;
    for (marker, size) in LEAKS_TENSORS {
        let line = train_line(marker);
        let of_size: Vec<_> = blocks.iter().filter(|a| a.size_bytes == size).collect();
        assert_eq!(of_size.len(), 6, "{marker}");
        for a in of_size {
            assert_eq!(a.thread, segment_thread, "{marker}");
            let frames = m.stack_frames(a.stack);
            let user = analysis_core::attribution::user_frame_index(&frames, &[])
                .map(|i| &frames[i])
                .unwrap_or_else(|| panic!("{marker}: no user frame in {frames:#?}"));
            assert!(
                user.python && user.file.ends_with("torch_train.py") && user.line == line,
                "{marker}: {frames:#?}"
            );
            // Native frames too: the stack is captured in the allocating thread, through the
            // allocator (the fake libc10_cuda.so) and the Python frames that called it.
            assert!(
                frames.iter().any(|f| f.module.ends_with("libc10_cuda.so")),
                "{marker}: {frames:#?}"
            );
        }
        // At the last sync point (the tracker also sees what the interpreter frees at exit).
        let live = blocks
            .iter()
            .filter(|a| a.size_bytes == size && a.live_at(last_sync))
            .count();
        assert_eq!(live, if marker == "BATCH_LINE" { 0 } else { 6 }, "{marker}");
    }
    assert!(m.notices.is_empty(), "{:?}", m.notices);
}

#[test]
fn the_trace_tracker_is_built_once_and_then_loaded_from_the_cache() {
    let dir = tracker_frameworks("cache", false);
    let first = run_in(&dir, "torch_train.py", "child", &[], &[]);
    assert!(
        first.stderr.contains("building the trace tracker"),
        "{}",
        first.stderr
    );
    let built = cached_shims(&dir);
    assert_eq!(built.len(), 1, "{built:?}");
    let modified = |name: &str| {
        std::fs::metadata(dir.join("cache/gpucollect").join(name))
            .and_then(|m| m.modified())
            .expect("the shim's mtime")
    };
    let before = modified(&built[0]);
    // The spawned child of this scenario found it in the cache too: one build in all.
    assert_eq!(
        first.stderr.matches("building the trace tracker").count(),
        1,
        "{}",
        first.stderr
    );
    let second = run_in(&dir, "torch_train.py", "child", &[], &[]);
    assert!(!second.stderr.contains("building"), "{}", second.stderr);
    assert_eq!(cached_shims(&dir), built);
    assert_eq!(modified(&built[0]), before, "the shim was rebuilt");
    for r in [&first, &second] {
        let lines = torch_lines(&r.stderr);
        assert!(
            lines
                .iter()
                .filter(|l| l.contains("trace tracker (C++"))
                .count()
                == 2,
            "one mode line per process: {}",
            r.stderr
        );
        let blocks = blocks(&r.trace);
        assert_eq!(blocks.len(), 1, "{}", r.stderr);
        assert_eq!(blocks[0].size_bytes, 48 << 10);
    }
}

#[test]
fn a_broken_header_no_compiler_or_no_cache_falls_back_to_history_with_one_line_saying_why() {
    let broken = tracker_frameworks("broken-header", true);
    let no_cxx = tracker_frameworks("no-compiler", false);
    let no_cache = tracker_frameworks("no-cache", false);
    for (dir, env, why) in [
        (&broken, &[][..], "build failed"),
        (
            &no_cxx,
            &[("CXX", "/nonexistent/c++")][..],
            "no C++ compiler",
        ),
        (
            &no_cache,
            &[("XDG_CACHE_HOME", "/proc/gpucollect-test")][..],
            "cannot create the cache directory /proc/gpucollect-test/gpucollect",
        ),
    ] {
        let r = run_in(dir, "torch_train.py", "leaks", &[], env);
        let fallback: Vec<&str> = torch_lines(&r.stderr)
            .into_iter()
            .filter(|l| !l.contains("building the trace tracker"))
            .collect();
        assert_eq!(fallback.len(), 1, "{why}: {}", r.stderr);
        assert!(
            fallback[0].contains("Python fallback") && fallback[0].contains(why),
            "{why}: {}",
            r.stderr
        );
        assert!(cached_shims(dir).is_empty(), "{why}");
        // The fallback still records every tensor.
        assert_eq!(blocks(&r.trace).len(), 24, "{why}: {}", r.stderr);
    }
    // A failed build is not retried by the processes the program starts (spawned workers).
    let r = run_in(&broken, "torch_train.py", "child", &[], &[]);
    assert_eq!(
        r.stderr.matches("building the trace tracker").count(),
        1,
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.matches("build failed").count(), 2, "{}", r.stderr);
    assert_eq!(blocks(&r.trace).len(), 1, "{}", r.stderr);
}

#[test]
fn no_framework_builds_no_tracker() {
    let dir = tracker_frameworks("no-framework", false);
    let r = run_in(&dir, "torch_train.py", "child", &["--no-framework"], &[]);
    assert!(blocks(&r.trace).is_empty());
    assert!(!r.stderr.contains("gpucollect: torch"), "{}", r.stderr);
    assert!(cached_shims(&dir).is_empty());
}

#[test]
fn a_tracker_the_allocator_refuses_falls_back_to_history_and_says_why() {
    let dir = tracker_frameworks("refused", false);
    let r = run_in(
        &dir,
        "torch_train.py",
        "leaks",
        &[],
        &[("FAKE_C10_CUDA_REFUSE_TRACKERS", "1")],
    );
    let fallback: Vec<&str> = torch_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("Python fallback"))
        .collect();
    assert_eq!(fallback.len(), 1, "{}", r.stderr);
    assert!(
        fallback[0].contains("not attached") && fallback[0].contains("takes no trace trackers"),
        "{}",
        r.stderr
    );
    assert_eq!(blocks(&r.trace).len(), 24, "{}", r.stderr);
}

#[test]
fn without_stacks_the_trace_tracker_still_records_every_tensor_in_its_thread() {
    let dir = tracker_frameworks("no-stacks", false);
    let r = run_in(&dir, "torch_train.py", "leaks", &["--no-stacks"], &[]);
    assert!(
        torch_lines(&r.stderr)
            .iter()
            .any(|l| l.contains("trace tracker (C++")),
        "{}",
        r.stderr
    );
    let m = &r.trace.model;
    let blocks = blocks(&r.trace);
    assert_eq!(blocks.len(), 24, "{}", r.stderr);
    for a in &blocks {
        assert!(
            m.stack_frames(a.stack).is_empty(),
            "{:#?}",
            m.stack_frames(a.stack)
        );
    }
    let segment_thread = m
        .allocs
        .iter()
        .find(|a| a.kind == AllocKind::Device)
        .expect("a segment")
        .thread;
    assert!(blocks.iter().all(|a| a.thread == segment_thread));
}

#[test]
fn through_the_trace_tracker_the_report_names_each_leaking_line_too() {
    // The tracker also sees the frees at interpreter shutdown: the leaks are growth across the
    // steps, not memory left at exit.
    let dir = tracker_frameworks("report", false);
    let r = run_in(&dir, "torch_train.py", "leaks", &[], &[]);
    assert!(r.stderr.contains("trace tracker"), "{}", r.stderr);
    assert_the_three_leaks_are_named(&r);
}
