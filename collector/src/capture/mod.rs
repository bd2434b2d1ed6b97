//! `gpucollect [OPTIONS] [--] PROGRAM [ARGS...]`: runs PROGRAM with the injection library,
//! drains the shared-memory ring while it runs and streams the trace to stdout or `-o FILE`.
//!
//! The program's stdout never mixes with the trace: when the trace goes to stdout, the
//! program's stdout is sent to our stderr. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to the
//! program; gpucollect exits with its exit code (128 + signal when killed).

mod nvml_sampler;
mod proc_maps;
mod python_hook;
mod symbolize;
mod torch_blocks;
mod trace_writer;
mod wait_log;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use analysis_core::Encoder;
use analysis_core::format::*;
use anyhow::{Context, Result, bail};
use clap::Args;
use gpucollect_inject::host;
use gpucollect_ring::event::Event;
use gpucollect_ring::ring::{RingOwner, SLOTS};

use self::trace_writer::{TraceWriter, WriterOptions};

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Write the trace to FILE instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Record no call stacks (lowest overhead).
    #[arg(long)]
    pub no_stacks: bool,
    /// Record no Python frames: stacks of Python programs (CPython 3.11 to 3.13) have native
    /// frames only.
    #[arg(long)]
    pub no_python_frames: bool,
    /// Native frames recorded per allocation (1..=64).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub stack_depth: u32,
    /// How to walk native stacks: `dwarf` (the objects' unwind tables with cached rules; works
    /// without frame pointers) or `fp` (DWARF through the CUDA libraries, then frame pointers:
    /// reaches code without unwind tables; needs a program built with frame pointers, otherwise
    /// stacks are short).
    #[arg(long, value_enum, default_value_t = Unwind::Dwarf)]
    pub unwind: Unwind,
    /// Skip leading frames whose function contains NAME (allocator wrappers), so allocations
    /// are attributed to the wrapper's caller. Repeatable.
    #[arg(long, value_name = "NAME")]
    pub hide_frame: Vec<String>,
    /// libcupti to use (default: a copy already loaded, the library path, CUDA_HOME, /usr/local/cuda).
    #[arg(long, value_name = "PATH", env = "GPUCOLLECT_CUPTI_PATH")]
    pub cupti: Option<PathBuf>,
    /// The injection library (default: libgpucollect_inject.so next to gpucollect).
    #[arg(long, value_name = "PATH", env = "GPUCOLLECT_INJECT_PATH")]
    pub inject: Option<PathBuf>,
    /// libnvidia-ml to sample device memory with (default: libnvidia-ml.so.1 on the library path).
    #[arg(long, value_name = "PATH", env = "GPUCOLLECT_NVML_PATH")]
    pub nvml: Option<PathBuf>,
    /// Do not sample device memory through NVML.
    #[arg(long)]
    pub no_nvml: bool,
    /// Do not load gpucollect's framework capture into Python programs (by default a
    /// `sitecustomize` of gpucollect's, first on PYTHONPATH, activates it once `torch` or `cupy`
    /// is imported; programs without them are unaffected).
    #[arg(long)]
    pub no_framework: bool,
    /// Turn frameworks' caching allocators off so that every tensor or buffer is its own driver
    /// allocation (PYTORCH_NO_CUDA_MEMORY_CACHING=1, XLA_PYTHON_CLIENT_ALLOCATOR=platform,
    /// XLA_PYTHON_CLIENT_PREALLOCATE=false): exact at the CUDA level, but the program runs
    /// slower and fragments memory differently than it does normally.
    #[arg(long)]
    pub framework_exact: bool,
    /// Sampling interval in milliseconds: NVML device memory, and the reserved/used bytes of
    /// stream-ordered memory pools and graph memory (polled inside the program).
    #[arg(long, default_value_t = 50, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_interval_ms: u64,
    /// The program to trace and its arguments.
    #[arg(
        required = true,
        value_name = "PROGRAM [ARGS]...",
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    Dwarf,
    Fp,
    /// libgcc's `_Unwind_Backtrace` for every frame (slow; the reference the default DWARF walk
    /// is tested against).
    #[value(hide = true)]
    Libgcc,
}

/// What `--framework-exact` sets for the program.
const FRAMEWORK_EXACT_ENV: [(&str, &str); 3] = [
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
];

/// The line `--framework-exact` prints: what it set, what that costs, and the values it replaced
/// (`current` reads gpucollect's own environment).
fn framework_exact_notice(current: impl Fn(&str) -> Option<OsString>) -> String {
    let set: Vec<String> = FRAMEWORK_EXACT_ENV
        .iter()
        .map(|(var, value)| match current(var) {
            Some(old) if old != *value => {
                format!("{var}={value} (was {})", old.to_string_lossy())
            }
            _ => format!("{var}={value}"),
        })
        .collect();
    format!(
        "--framework-exact: {}; the caching allocators are off, so every tensor is a driver \
         allocation: the program runs slower and fragments memory differently than without \
         gpucollect",
        set.join(", ")
    )
}

/// Finds the injection library: explicit path, then next to this executable (and in `deps/`,
/// where cargo puts it when it is built as a dependency).
fn find_inject(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
        }
        bail!("the injection library does not exist: {}", p.display());
    }
    let exe = std::env::current_exe().context("cannot find the gpucollect executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libgpucollect_inject.so"),
        dir.join("../lib/libgpucollect_inject.so"),
        dir.join("deps/libgpucollect_inject.so"),
        dir.join("../deps/libgpucollect_inject.so"),
    ];
    // In a development tree several copies may exist (cargo uplifts one, dependents use the
    // one in deps/): take the newest.
    let newest = candidates
        .iter()
        .filter_map(|c| Some((std::fs::metadata(c).ok()?.modified().ok()?, c)))
        .max_by_key(|(t, _)| *t);
    if let Some((_, c)) = newest {
        return Ok(std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()));
    }
    bail!(
        "cannot find libgpucollect_inject.so: build it (`cargo build -p gpucollect-inject`) or \
         pass --inject PATH; looked in {}",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn read_cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn read_exe(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Where the dynamic loader would find the CUDA driver: LD_LIBRARY_PATH, then the ldconfig
/// cache. Returns the path, or the places looked in.
fn find_driver() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        for dir in std::env::split_paths(&p) {
            let c = dir.join("libcuda.so.1");
            if c.is_file() {
                return Ok(c);
            }
            looked.push(dir.display().to_string());
        }
    }
    looked.push("the ldconfig cache".into());
    if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(path) = text
            .lines()
            .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
            .find_map(|l| l.rsplit("=> ").next())
        {
            return Ok(PathBuf::from(path.trim()));
        }
    }
    Err(looked.join(", "))
}

/// Per-slot drain bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
struct SlotState {
    process: Option<ProcessIdx>,
    pid: u32,
    dropped_reported: u64,
}

struct Drainer<W: Write> {
    ring: RingOwner,
    writer: TraceWriter<W>,
    slots: Vec<SlotState>,
    event: Box<Event>,
    unslotted_reported: u64,
    /// Whether any process ever claimed a slot.
    any_traced: bool,
    /// Pushes that found the ring full, of processes whose slots were recycled.
    waited_recycled: u64,
    /// In which seconds of the run the pushes waited.
    waits: wait_log::WaitLog,
}

impl<W: Write> Drainer<W> {
    /// Drains every slot once. Returns the number of events read.
    fn drain(&mut self, budget_per_slot: usize) -> u64 {
        let mut n = 0;
        for slot in 0..SLOTS {
            if self.slots[slot].process.is_none() {
                let Some(info) = self.ring.slot_info(slot) else {
                    continue;
                };
                let exe = read_exe(info.pid);
                let argv = read_cmdline(info.pid);
                let p = self.writer.add_process(info.pid, info.ppid, exe, argv);
                self.any_traced = true;
                self.slots[slot] = SlotState {
                    process: Some(p),
                    pid: info.pid,
                    dropped_reported: 0,
                };
            }
            let Some(process) = self.slots[slot].process else {
                continue;
            };
            let mut k = 0;
            while k < budget_per_slot && self.ring.pop(slot, &mut self.event) {
                self.writer.event(process, &self.event);
                k += 1;
            }
            n += k as u64;
            let dropped = self.ring.dropped(slot);
            if dropped > self.slots[slot].dropped_reported {
                let count = dropped - self.slots[slot].dropped_reported;
                self.slots[slot].dropped_reported = dropped;
                let ts = self.writer.now_nanos();
                self.writer.record(&Record::Dropped(Dropped {
                    ts_nanos: ts,
                    process,
                    count,
                }));
            }
        }
        let unslotted = self.ring.unslotted_dropped();
        if unslotted > self.unslotted_reported {
            let ts = self.writer.now_nanos();
            self.writer.record(&Record::Dropped(Dropped {
                ts_nanos: ts,
                process: ProcessIdx(0),
                count: unslotted - self.unslotted_reported,
            }));
            self.unslotted_reported = unslotted;
        }
        n
    }

    /// Pushes of every process so far that found the ring full and waited for the collector.
    fn waited(&self) -> u64 {
        (0..SLOTS)
            .filter(|&slot| self.slots[slot].process.is_some())
            .map(|slot| self.ring.waited(slot))
            .sum::<u64>()
            + self.waited_recycled
    }

    /// Slots whose process is gone: skip cells it claimed but never published, counting them.
    fn reap_dead(&mut self) -> bool {
        let mut any_alive = false;
        for slot in 0..SLOTS {
            let st = self.slots[slot];
            let Some(process) = st.process else {
                continue;
            };
            if host::process_alive(st.pid) {
                any_alive = true;
                continue;
            }
            let mut lost = 0;
            loop {
                while self.ring.pop(slot, &mut self.event) {
                    self.writer.event(process, &self.event);
                }
                let skipped = self.ring.skip_unpublished(slot);
                if skipped == 0 {
                    break;
                }
                lost += skipped;
            }
            let dropped = self.ring.dropped(slot);
            let lost = lost + dropped.saturating_sub(st.dropped_reported);
            if lost > 0 {
                let ts = self.writer.now_nanos();
                self.writer.record(&Record::Dropped(Dropped {
                    ts_nanos: ts,
                    process,
                    count: lost,
                }));
            }
            // The program's own exit comes from waitpid at the end; other processes' from here.
            if process != ProcessIdx(0) {
                let now = self.writer.now_nanos();
                self.writer.process_gone(process, now);
            }
            // Fully drained and its producer is gone: the slot can serve another process.
            self.waited_recycled += self.ring.waited(slot);
            self.ring.recycle(slot);
            self.writer.forget_pid(st.pid);
            self.slots[slot] = SlotState::default();
        }
        any_alive
    }
}

pub fn run(a: RunArgs) -> Result<u8> {
    let (program, args) = a
        .command
        .split_first()
        .context("no program given: gpucollect [OPTIONS] [--] PROGRAM [ARGS...]")?;
    let to_stdout = a.output.is_none();
    if to_stdout && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a binary trace to the terminal: redirect it \
             (`gpucollect {} > run.msgpack`) or use -o FILE",
            program.to_string_lossy()
        );
    }
    let inject = find_inject(a.inject.as_deref())?;
    let ring = RingOwner::create().context("cannot set up the event transport")?;
    // `-o FILE` is opened (to report an unwritable path before anything runs) but truncated
    // only once the program has started: a typo in the program name keeps an existing trace.
    let opened = match &a.output {
        Some(p) => {
            let existed = p.exists();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .with_context(|| format!("cannot create the trace file {}", p.display()))?;
            Some((f, p.clone(), existed))
        }
        None => None,
    };

    let start_mono_nanos = host::monotonic_nanos();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let argv: Vec<String> = a
        .command
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let header = Header {
        collector: format!("gpucollect {}", env!("CARGO_PKG_VERSION")),
        host: hostname(),
        argv: argv.clone(),
        start_mono_nanos,
        wall_offset_nanos: wall - start_mono_nanos as i64,
        ..Encoder::header_v1()
    };
    let opts = WriterOptions {
        hide_frames: a.hide_frame.clone(),
    };

    for var in ["CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH"] {
        if let Some(v) = std::env::var_os(var)
            && Path::new(&v) != inject
        {
            eprintln!(
                "gpucollect: {var} was set to {}; it is replaced by gpucollect's injection library \
                 for this run",
                v.to_string_lossy()
            );
        }
    }
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("CUDA_INJECTION64_PATH", &inject)
        .env("NVTX_INJECTION64_PATH", &inject)
        .env(gpucollect_ring::env::RING, ring.path())
        .env(
            gpucollect_ring::env::STACK_DEPTH,
            if a.no_stacks { 0 } else { a.stack_depth }.to_string(),
        );
    cmd.env(
        gpucollect_ring::env::POOL_INTERVAL_MS,
        a.sample_interval_ms.to_string(),
    );
    match a.unwind {
        Unwind::Dwarf => {}
        Unwind::Fp => {
            cmd.env(gpucollect_ring::env::UNWIND, "fp");
        }
        Unwind::Libgcc => {
            cmd.env(gpucollect_ring::env::UNWIND, "libgcc");
        }
    }
    if a.no_python_frames {
        cmd.env(gpucollect_ring::env::PYTHON_FRAMES, "0");
    }
    if let Some(c) = &a.cupti {
        cmd.env(gpucollect_ring::env::CUPTI_PATH, c);
    }
    if a.framework_exact {
        for (var, value) in FRAMEWORK_EXACT_ENV {
            cmd.env(var, value);
        }
        eprintln!(
            "gpucollect: {}",
            framework_exact_notice(|v| std::env::var_os(v))
        );
    }
    // Lives until this function returns, after the program and the children it waited for.
    let python_hook = if a.no_framework {
        None
    } else {
        let dir = python_hook::PythonHookDir::create(&std::env::temp_dir())?;
        cmd.env("PYTHONPATH", dir.pythonpath(std::env::var_os("PYTHONPATH")));
        Some(dir)
    };
    if to_stdout {
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .context("cannot duplicate stderr for the program's stdout")?;
        cmd.stdout(Stdio::from(err));
    }
    let spawned = cmd.spawn();
    if spawned.is_err()
        && let Some((_, path, false)) = &opened
    {
        // We created the file for this run; the run did not happen.
        let _ = std::fs::remove_file(path);
    }
    let mut child = spawned.map_err(|e| {
        let p = program.to_string_lossy();
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!("cannot run `{p}`: no such program (not a file, and not found on PATH)")
        } else if e.kind() == std::io::ErrorKind::PermissionDenied {
            anyhow::anyhow!("cannot run `{p}`: permission denied (is it executable?)")
        } else {
            anyhow::anyhow!("cannot run `{p}`: {e}")
        }
    })?;
    let out: Box<dyn Write> = match opened {
        Some((f, path, _)) => {
            // Only a regular file has a length to cut (`-o /dev/null` is fine as it is).
            if f.metadata().is_ok_and(|m| m.is_file()) {
                f.set_len(0).with_context(|| {
                    format!("cannot truncate the trace file {}", path.display())
                })?;
            }
            Box::new(f)
        }
        None => Box::new(std::io::stdout()),
    };
    let mut writer = TraceWriter::new(&header, out, opts);
    writer.flush()?;
    let child_pid = child.id();
    host::forward_signals_to(child_pid).context("cannot install signal forwarding")?;
    writer.add_process(
        child_pid,
        std::process::id(),
        program.to_string_lossy().into_owned(),
        argv,
    );
    writer.flush()?;

    // NVML sampling on its own thread; records come back through a channel.
    let (tx, rx) = std::sync::mpsc::channel::<Record>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = (!a.no_nvml).then(|| {
        let stop = stop.clone();
        let path = a.nvml.clone();
        let interval = Duration::from_millis(a.sample_interval_ms);
        std::thread::Builder::new()
            .name("gpucollect-nvml".into())
            .spawn(
                move || match nvml_sampler::open(path.as_deref().map(|p| p.as_os_str())) {
                    Ok(nvml) => nvml_sampler::run(nvml, interval, stop, tx, move || {
                        host::monotonic_nanos().saturating_sub(start_mono_nanos)
                    }),
                    Err(msg) => eprintln!("gpucollect: {msg}"),
                },
            )
    });

    let mut d = Drainer {
        ring,
        writer,
        slots: vec![SlotState::default(); SLOTS],
        event: Box::new(Event::zeroed()),
        unslotted_reported: 0,
        any_traced: false,
        waited_recycled: 0,
        waits: wait_log::WaitLog::default(),
    };
    let started = Instant::now();
    let mut last_reap = Instant::now();
    let status = loop {
        let n = d.drain(4096);
        if last_reap.elapsed() > Duration::from_millis(50) {
            d.reap_dead();
            let total = d.waited();
            d.waits.note(started.elapsed().as_secs(), total);
            last_reap = Instant::now();
        }
        while let Ok(r) = rx.try_recv() {
            d.writer.record(&r);
        }
        d.writer.flush()?;
        if let Some(status) = child.try_wait().context("cannot wait for the program")? {
            break status;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // The program is gone; its children may still be finishing. Drain until every traced
    // process is gone, or for at most two seconds.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = d.drain(usize::MAX);
        let any_alive = d.reap_dead();
        d.writer.flush()?;
        if n == 0 && !any_alive {
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "gpucollect: traced processes are still running after the program exited; \
                 the trace ends without their later events"
            );
            break;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    d.drain(usize::MAX);
    let waited = d.waited();
    d.waits.note(started.elapsed().as_secs(), waited);
    if waited > 0 {
        eprintln!(
            "gpucollect: the program waited for the collector {waited} time(s){}: the ring was \
             full (events came faster than they could be written), so tracing slowed it there",
            d.waits.summary()
        );
    }
    if !d.any_traced {
        let driver = match find_driver() {
            Ok(p) => format!("the CUDA driver is at {}", p.display()),
            Err(looked) => format!(
                "the CUDA driver (libcuda.so.1) was not found (looked in {looked}); point \
                 LD_LIBRARY_PATH at it"
            ),
        };
        eprintln!(
            "gpucollect: no CUDA activity was traced: the program never initialised CUDA (cuInit) \
             or did not load the injection library; {driver}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    if let Some(Ok(t)) = sampler {
        let _ = t.join();
    }
    while let Ok(r) = rx.try_recv() {
        d.writer.record(&r);
    }
    let ts = d.writer.now_nanos();
    d.writer.record(&Record::ProcessExit(ProcessExit {
        ts_nanos: ts,
        process: ProcessIdx(0),
        code: status.code(),
        signal: status.signal(),
    }));
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    };
    d.writer
        .finish()
        .with_context(|| format!("the program exited with code {code}"))?;
    drop(python_hook);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framework_exact_notice_names_each_variable_its_cost_and_what_it_replaced() {
        let n = framework_exact_notice(|v| {
            (v == "XLA_PYTHON_CLIENT_ALLOCATOR").then(|| OsString::from("bfc"))
        });
        assert!(n.contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1,"), "{n}");
        assert!(
            n.contains("XLA_PYTHON_CLIENT_ALLOCATOR=platform (was bfc)"),
            "{n}"
        );
        assert!(n.contains("XLA_PYTHON_CLIENT_PREALLOCATE=false;"), "{n}");
        assert!(n.contains("slower") && n.contains("fragments"), "{n}");
        // A value that is already the one set is not "replaced".
        let same = framework_exact_notice(|v| {
            (v == "PYTORCH_NO_CUDA_MEMORY_CACHING").then(|| OsString::from("1"))
        });
        assert!(!same.contains("was"), "{same}");
    }
}
