//! The corpus: every scenario, built deterministically from its seed.

use crate::programs::caching::{GIB, MIB};
use crate::programs::torch::{
    self, BoundedCache, Ending, Foreign, Leak, ProcDesc, Sites, Torch, TrainCfg,
};
use crate::programs::writer::TraceWriter;
use crate::scenario::{Class, History, Scenario, Truth};

/// Every scenario of the corpus, in table order.
pub fn all() -> Vec<Scenario> {
    let mut v = Vec::new();
    v.extend(torch_scenarios());
    v.push(real_torch());
    v.extend(gpu_traces());
    v.extend(crate::corpus_cpp::scenarios());
    v.push(torchrun(201, false));
    v.push(torchrun(202, true));
    v.push(fragmented_server(203));
    v
}

/// torchrun with two workers (one GPU each) in one trace: the launcher, then the workers with
/// their NCCL buffers and training loops. With `rank1_leak`, rank 1 runs the metrics.py:33
/// list leak.
fn torchrun(seed: u64, rank1_leak: bool) -> Scenario {
    let sites = Sites::new(4);
    let launcher = ProcDesc {
        idx: 0,
        pid: 70_100,
        parent: None,
        argv: vec![
            "python",
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "train.py",
        ],
        device: 0,
        main_thread: 0,
        autograd_thread: 0,
        pin_thread: None,
    };
    let mut workers = Vec::new();
    for rank in 0..2u32 {
        let p = ProcDesc {
            idx: rank + 1,
            pid: 70_101 + rank,
            parent: Some(0),
            argv: vec!["python", "-u", "train.py", "--config", "configs/base.yaml"],
            device: rank,
            main_thread: 1 + 3 * rank,
            autograd_thread: 2 + 3 * rank,
            pin_thread: Some(3 + 3 * rank),
        };
        let mut tr = Torch::new(p, seed * 10 + u64::from(rank), 80 * GIB);
        let cfg = TrainCfg {
            leak: (rank1_leak && rank == 1).then_some(Leak::List),
            steps: 60,
            nvtx: true,
            ..TrainCfg::new(seed * 10 + u64::from(rank))
        };
        // init_process_group: NCCL's buffers, straight from the driver.
        let nccl = 2 * 64 * MIB + 18 * MIB;
        let buffers = tr.raw(nccl, sites.nccl);
        torch::train(&mut tr, &sites, &cfg);
        workers.push((tr, buffers, nccl));
    }
    let bytes = workers[1].0.cause_live_bytes();
    for (tr, buffers, nccl) in &mut workers {
        tr.free_everything();
        // destroy_process_group()
        tr.raw_free(*buffers, *nccl);
        tr.exit(Some(0), None);
    }
    let mut launcher_t = Torch::new(launcher.clone(), seed, 80 * GIB);
    launcher_t.t = workers.iter().map(|w| w.0.t).max().unwrap_or(0);
    launcher_t.exit(Some(0), None);
    let mut w = TraceWriter::new(&launcher.argv);
    let descs: Vec<ProcDesc> = std::iter::once(launcher)
        .chain(workers.iter().map(|x| x.0.p.clone()))
        .collect();
    torch::describe(
        &mut w,
        &descs,
        &[
            (0, "NVIDIA H100 80GB HBM3", 80 * GIB),
            (1, "NVIDIA H100 80GB HBM3", 80 * GIB),
        ],
    );
    let all: Vec<&Torch> = std::iter::once(&launcher_t)
        .chain(workers.iter().map(|x| &x.0))
        .collect();
    let bytes_trace = torch::render_trace(w, &sites, &all, true);
    let mut calls = Vec::new();
    let mut samples = Vec::new();
    for (tr, _, _) in &mut workers {
        calls.append(&mut tr.calls);
        samples.append(&mut tr.samples);
    }
    calls.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    samples.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    let (name, description, truth) = if rank1_leak {
        (
            "torchrun-rank1-leak",
            "torchrun with two workers on two GPUs; rank 1 keeps 4 MiB per step at metrics.py:33 (rank 0 is clean)",
            Truth::leak(&["metrics.py:33"], bytes),
        )
    } else {
        (
            "torchrun-healthy",
            "torchrun with two workers on two GPUs, NCCL buffers from the driver, healthy training on both",
            Truth::Healthy,
        )
    };
    Scenario {
        name: name.into(),
        description: description.into(),
        truth,
        history: History::Trace(bytes_trace),
        calls,
        device_samples: samples,
    }
}

/// An inference server on a 16 GiB GPU: chat sessions' KV blocks pin partly used 20 MiB
/// segments until a long prompt's 1 GiB prefill fails although more than 1 GiB is free in all
/// (cached holes plus memory never reserved): fragmentation. Labelled an OOM instead when the
/// free bytes would not have sufficed anyway.
fn fragmented_server(seed: u64) -> Scenario {
    let sites = Sites::new(4);
    let p = ProcDesc {
        argv: vec!["python", "server.py", "--port", "8000"],
        ..main_proc(seed)
    };
    let mut tr = Torch::new(p, seed, 16 * GIB);
    let failed = torch::serve(&mut tr, &sites, 5000);
    tr.exit(Some(1), None);
    let mut w = TraceWriter::new(&["python", "server.py", "--port", "8000"]);
    torch::describe(
        &mut w,
        std::slice::from_ref(&tr.p),
        &[(0, "Tesla T4", 16 * GIB)],
    );
    let cached_free = tr.alloc.reserved() - tr.alloc.allocated();
    let unreserved = tr.alloc.capacity() - tr.alloc.reserved();
    let truth = match failed {
        Some(request)
            if cached_free + unreserved >= request && tr.alloc.largest_free() < request =>
        {
            Truth::faulty(Class::Fragmentation, &[], None)
        }
        Some(request) => Truth::faulty(Class::Oom, &["engine.py:74"], Some(request)),
        None => Truth::Healthy,
    };
    Scenario {
        name: "torch-fragmentation-oom".into(),
        description: "an inference server on a 16 GiB GPU: KV-cache blocks of open sessions pin partly used segments; a long prompt's 1 GiB prefill fails with more than 1 GiB free in all (cached holes plus memory never reserved) but no block that large".into(),
        truth,
        history: History::Trace(torch::render_trace(w, &sites, &[&tr], true)),
        calls: std::mem::take(&mut tr.calls),
        device_samples: std::mem::take(&mut tr.samples),
    }
}

/// The real snapshot checked in with the importer's tests (`analysis-core/tests/assets/torch`,
/// H100, PyTorch 2.11): a 30-step loop that appends every loss to a list
/// (`scripts/torch-snapshot.py:28`); each loss is a 4-byte tensor made at line 24, kept in a
/// 512-byte block.
fn real_torch() -> Scenario {
    Scenario {
        name: "real-torch-snapshot".into(),
        description: "a real PyTorch 2.11 snapshot from an H100: 30 steps that keep every loss (4 B each, 512 B blocks) in a list".into(),
        truth: Truth::leak(&["torch-snapshot.py:24", "torch-snapshot.py:28"], 30 * 512),
        history: History::Snapshot(
            include_bytes!("../../../analysis-core/tests/assets/torch/real-torch.pickle").to_vec(),
        ),
        calls: Vec::new(),
        device_samples: Vec::new(),
    }
}

/// Traces recorded by `scripts/gpu-check.sh` on an H200 (`tests/accuracy/assets/gpu`, whose
/// README says what each program does).
fn gpu_traces() -> Vec<Scenario> {
    let trace = |name: &str, description: &str, truth: Truth, bytes: &[u8]| Scenario {
        name: name.into(),
        description: description.into(),
        truth,
        history: History::Trace(bytes.to_vec()),
        calls: Vec::new(),
        device_samples: Vec::new(),
    };
    vec![
        trace(
            "gpu-torch-leaks",
            "a real 30-step PyTorch loop on an H200 with three leaks (a list of 2 MiB tensors, an unbounded cache, a graph kept alive) and a bounded cache, freed by the interpreter at exit; the list leaks fastest",
            Truth::leak(&["torch_leaks.py:19"], 30 * 2 * MIB).also(
                Class::Leak,
                &[
                    "torch_leaks.py:20",
                    "torch_leaks.py:15",
                    "torch_leaks.py:16",
                    "torch_leaks.py:17",
                    "torch_leaks.py:18",
                ],
            ),
            include_bytes!("../assets/gpu/torch-leaks-h200.msgpack"),
        ),
        trace(
            "gpu-torch-loop-expandable",
            "a real healthy PyTorch loop on an H200 with expandable segments, whose cuMemCreate probe fails once with error 800",
            Truth::Healthy,
            include_bytes!("../assets/gpu/torch-loop-expandable-h200.msgpack"),
        ),
        trace(
            "gpu-torchrun-ddp",
            "a real torchrun job with two workers on one H200, each keeping its tensors until it exits",
            Truth::Healthy,
            include_bytes!("../assets/gpu/torchrun-ddp-h200.msgpack"),
        ),
        trace(
            "gpu-cupy-pool",
            "a real CuPy program on an H200 whose arrays, kept by two threads, live until it exits",
            Truth::Healthy,
            include_bytes!("../assets/gpu/cupy-pool-h200.msgpack"),
        ),
    ]
}

fn main_proc(seed: u64) -> ProcDesc {
    ProcDesc {
        idx: 0,
        pid: 48_000 + (seed % 1000) as u32,
        parent: None,
        argv: vec!["python", "train.py", "--config", "configs/base.yaml"],
        device: 0,
        main_thread: 0,
        autograd_thread: 1,
        pin_thread: Some(2),
    }
}

fn device_name(total: u64) -> &'static str {
    if total >= 80 * GIB {
        "NVIDIA H100 80GB HBM3"
    } else if total >= 24 * GIB {
        "NVIDIA L4"
    } else {
        "Tesla T4"
    }
}

/// A single-process training run, rendered by its ending.
fn train_run(name: &str, description: &str, cfg: TrainCfg) -> Scenario {
    train_run_as(name, description, cfg, Capture::Tensors)
}

/// The run as a CUDA-level collector sees it (segments only). A leak's exact bytes are not in
/// such a history (the reserve grows by segments, attributed to whichever allocation needed a
/// new one), so its truth names the line only.
fn driver_run(name: &str, description: &str, cfg: TrainCfg) -> Scenario {
    train_run_as(name, description, cfg, Capture::Driver)
}

/// A run traced with framework capture: segments and the tensors inside them.
fn layers_run(name: &str, description: &str, cfg: TrainCfg) -> Scenario {
    train_run_as(name, description, cfg, Capture::Layers)
}

/// What a collector records of a PyTorch run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// Tensors as allocations, the reserve as pool samples (an allocator hook, a snapshot).
    Tensors,
    /// The caching allocator's segments only (CUDA level).
    Driver,
    /// Segments and the tensors inside them (FORMAT.md, "Two layers").
    Layers,
}

fn train_run_as(name: &str, description: &str, cfg: TrainCfg, capture: Capture) -> Scenario {
    let driver = capture == Capture::Driver;
    let sites = Sites::new(cfg.layers);
    let mut tr = Torch::new(main_proc(cfg.seed), cfg.seed, cfg.device_total);
    tr.foreign = cfg.foreign;
    let finished = torch::train(&mut tr, &sites, &cfg);
    let out_of_memory = tr.log.iter().any(|e| matches!(e, torch::Ev::Oom { .. }));
    // What the planted cause holds when the work stops (before any shutdown frees).
    let cause_bytes = tr.cause_live_bytes();
    let truth = match (cfg.leak, cfg.eval_concat) {
        (Some(Leak::List), _) => Truth::leak(&["metrics.py:33"], cause_bytes),
        (Some(Leak::Cache), _) => Truth::leak(&["cache.py:51", "cache.py:58"], cause_bytes),
        (Some(Leak::EvalOutputs), _) => Truth::leak(&["eval.py:61", "eval.py:77"], cause_bytes),
        (Some(Leak::Graph), _) => Truth::leak(
            &[
                "train.py:118",
                "train.py:119",
                "model.py:31",
                "model.py:32",
                "model.py:33",
                "model.py:49",
            ],
            cause_bytes,
        ),
        (None, true) => Truth::faulty(Class::Spike, &["eval.py:88"], Some(tr.spike_bytes)),
        (None, false) => Truth::Healthy,
    };
    let history = if cfg.ending == Ending::Snapshot {
        History::Snapshot(torch::render_snapshot(&tr, &sites, cfg.ring))
    } else {
        let clean = match cfg.ending {
            Ending::Exit => {
                // main() returned (or raised): the interpreter frees every tensor.
                tr.free_everything();
                tr.exit(Some(if finished && !out_of_memory { 0 } else { 1 }), None);
                true
            }
            Ending::Killed(sig) => {
                tr.exit(None, Some(sig));
                false
            }
            Ending::Vanished | Ending::Snapshot => false,
        };
        let mut w = TraceWriter::new(&["python", "train.py", "--config", "configs/base.yaml"]);
        torch::describe(
            &mut w,
            std::slice::from_ref(&tr.p),
            &[(0, device_name(cfg.device_total), cfg.device_total)],
        );
        History::Trace(match capture {
            Capture::Driver => torch::render_driver_trace(w, &sites, &[&tr], clean),
            Capture::Layers => torch::render_layered_trace(w, &sites, &[&tr], clean),
            Capture::Tensors => torch::render_trace(w, &sites, &[&tr], clean),
        })
    };
    let truth = match truth {
        Truth::Faulty(mut c) if driver => {
            c.bytes = None;
            Truth::Faulty(c)
        }
        t => t,
    };
    Scenario {
        name: name.into(),
        description: description.into(),
        truth,
        history,
        calls: std::mem::take(&mut tr.calls),
        device_samples: std::mem::take(&mut tr.samples),
    }
}

fn torch_scenarios() -> Vec<Scenario> {
    let mut v = Vec::new();
    let c = TrainCfg::new;
    // Healthy training.
    v.push(train_run(
        "torch-train-nvtx-exit",
        "AdamW training loop with NVTX train_step ranges, variable sequence lengths (attention workspace 8x larger on long batches), two prefetched batches; exits 0",
        TrainCfg { nvtx: true, ..c(11) },
    ));
    v.push(train_run(
        "torch-train-plain-exit",
        "the same loop without NVTX: steps are visible only through optimizer.step in the stacks; exits 0",
        TrainCfg { steps: 90, ..c(12) },
    ));
    v.push(train_run(
        "torch-train-nvtx-killed",
        "healthy loop killed by the scheduler (SIGKILL) mid-epoch: parameters, Adam state and batches are live at the end",
        TrainCfg { nvtx: true, ending: Ending::Killed(9), ..c(13) },
    ));
    v.push(train_run(
        "torch-train-plain-vanished",
        "healthy loop whose node died: no exit status, no end record",
        TrainCfg {
            ending: Ending::Vanished,
            steps: 70,
            ..c(14)
        },
    ));
    v.push(train_run(
        "torch-train-eval",
        "healthy loop with an eval phase (4 batches under no_grad) every 10 steps",
        TrainCfg {
            eval_every: 10,
            nvtx: true,
            ..c(15)
        },
    ));
    v.push(train_run(
        "torch-train-accum4",
        "healthy loop with gradient accumulation over 4 micro-batches",
        TrainCfg {
            accum: 4,
            steps: 40,
            ..c(16)
        },
    ));
    v.push(train_run(
        "torch-train-checkpoint",
        "healthy loop that saves a checkpoint every 20 steps (a transient device copy of every parameter)",
        TrainCfg { ckpt_every: 20, eval_every: 25, ..c(17) },
    ));
    v.push(train_run(
        "torch-bounded-cache-exit",
        "prompt-encoding memo cache over 24 keys: fills during the first epoch, then only hits",
        TrainCfg {
            cache: Some(BoundedCache::Keys(24)),
            ..c(18)
        },
    ));
    v.push(train_run(
        "torch-bounded-cache-killed",
        "the same bounded cache, killed by SIGTERM",
        TrainCfg {
            cache: Some(BoundedCache::Keys(30)),
            ending: Ending::Killed(15),
            nvtx: true,
            ..c(19)
        },
    ));
    v.push(train_run(
        "torch-lru-cache",
        "LRU cache of 16 entries over 40 keys: evicts as it inserts",
        TrainCfg {
            cache: Some(BoundedCache::Lru {
                capacity: 16,
                keys: 40,
            }),
            ..c(20)
        },
    ));
    v.push(train_run(
        "torch-foreign-growth",
        "healthy loop sharing its GPU with another process whose memory grows by 1 GiB/s (NVML sees it, the trace does not)",
        TrainCfg {
            foreign: Some(Foreign { pid: 31_337, start_bytes: 2 * GIB, growth_per_s: GIB }),
            ..c(21)
        },
    ));
    v.push(train_run(
        "torch-seqlen-warmup",
        "healthy loop with a sequence-length warm-up over the first 40 steps: per-step memory rises for a third of the run, then holds",
        TrainCfg { warmup_steps: 40, steps: 120, nvtx: true, ..c(22) },
    ));
    // Leaks.
    v.push(train_run(
        "torch-leak-eval-outputs",
        "each eval phase keeps its last batch's 64 MiB of logits in a history list (eval.py:77, made at eval.py:61): one tensor per eval, a slow leak; killed by SIGKILL",
        TrainCfg { leak: Some(Leak::EvalOutputs), eval_every: 8, steps: 96, ending: Ending::Killed(9), ..c(40) },
    ));
    v.push(train_run(
        "torch-leak-list-nvtx-exit",
        "metrics.py:33 appends each step's 4 MiB of probabilities to a list; exits 0 (the list is freed at shutdown)",
        TrainCfg { leak: Some(Leak::List), nvtx: true, ..c(31) },
    ));
    v.push(train_run(
        "torch-leak-list-plain-killed",
        "the list leak without NVTX, killed by SIGKILL",
        TrainCfg {
            leak: Some(Leak::List),
            ending: Ending::Killed(9),
            ..c(32)
        },
    ));
    v.push(train_run(
        "torch-leak-list-accum",
        "the list leak under gradient accumulation (4 micro-batches), eval every 10 steps",
        TrainCfg {
            leak: Some(Leak::List),
            accum: 4,
            steps: 40,
            eval_every: 10,
            ..c(33)
        },
    ));
    v.push(train_run(
        "torch-leak-graph-nvtx-exit",
        "a held-out forward outside no_grad whose loss is appended to a list (train.py:118-119): each step's activations stay alive with the graph",
        TrainCfg { leak: Some(Leak::Graph), nvtx: true, steps: 60, ..c(34) },
    ));
    v.push(train_run(
        "torch-leak-graph-plain-vanished",
        "the graph leak without NVTX; the node died (no exit status)",
        TrainCfg {
            leak: Some(Leak::Graph),
            ending: Ending::Vanished,
            steps: 60,
            ..c(35)
        },
    ));
    v.push(train_run(
        "torch-leak-cache-exit",
        "cache.py memoizes an encoding per key and every step brings a new key (unbounded); entry sizes follow the prompt length",
        TrainCfg { leak: Some(Leak::Cache), ..c(36) },
    ));
    v.push(train_run(
        "torch-leak-cache-killed",
        "the unbounded cache, killed by SIGKILL",
        TrainCfg {
            leak: Some(Leak::Cache),
            ending: Ending::Killed(9),
            nvtx: true,
            ..c(37)
        },
    ));
    v.push(train_run(
        "torch-leak-list-oom",
        "metrics.py:33 keeps each step's full 64 MiB softmax on a 16 GiB GPU until an allocation fails; exits 1",
        TrainCfg {
            leak: Some(Leak::List),
            list_leak_bytes: 64 * MIB,
            steps: 400,
            device_total: 16 * GIB,
            ..c(38)
        },
    ));
    v.push(train_run(
        "torch-eval-concat-spike",
        "the eval phase keeps 16 batches of logits and concatenates them at eval.py:88: a 1 GiB transient on top of the 1 GiB it holds",
        TrainCfg { eval_every: 30, eval_concat: true, ..c(39) },
    ));
    // The CUDA driver's view of the same kind of runs (no allocator hook).
    v.push(driver_run(
        "torch-driver-healthy",
        "a healthy loop traced at the CUDA level only: the caching allocator's segments as cudaMalloc calls, attributed to the tensor allocation that needed each",
        TrainCfg { nvtx: true, eval_every: 20, ..c(51) },
    ));
    v.push(driver_run(
        "torch-driver-leak-list",
        "the metrics.py:33 list leak traced at the CUDA level only: the reserve grows by 20 MiB segments, each attributed to whichever allocation needed it; killed by SIGKILL",
        TrainCfg { leak: Some(Leak::List), steps: 120, ending: Ending::Killed(9), ..c(52) },
    ));
    v.push(driver_run(
        "torch-driver-leak-cache",
        "the unbounded cache traced at the CUDA level only (entries from both the small and the large pool)",
        TrainCfg { leak: Some(Leak::Cache), steps: 120, nvtx: true, ending: Ending::Killed(15), ..c(53) },
    ));
    // Traced with framework capture: the segments and the tensors inside them.
    v.push(layers_run(
        "torch-layers-healthy",
        "a healthy loop traced with framework capture: the caching allocator's segments as cudaMalloc calls and every tensor as a framework block inside them; exits 0",
        TrainCfg { nvtx: true, eval_every: 20, ..c(61) },
    ));
    v.push(layers_run(
        "torch-layers-leak-list",
        "the metrics.py:33 list leak traced with framework capture (the reserve stops growing after the first steps; the tensors do not); killed by SIGKILL",
        TrainCfg { leak: Some(Leak::List), steps: 120, ending: Ending::Killed(9), ..c(62) },
    ));
    v.push(layers_run(
        "torch-layers-leak-graph",
        "the loss kept with its graph, traced with framework capture; exits 0",
        TrainCfg {
            leak: Some(Leak::Graph),
            steps: 80,
            ..c(63)
        },
    ));
    v.push(layers_run(
        "torch-layers-leak-cache",
        "the unbounded cache traced with framework capture (entries from both pools); killed by SIGTERM",
        TrainCfg { leak: Some(Leak::Cache), steps: 120, nvtx: true, ending: Ending::Killed(15), ..c(64) },
    ));
    // Snapshots taken mid-run.
    v.push(train_run(
        "snapshot-healthy",
        "_dump_snapshot mid-step of a healthy loop: parameters, Adam state, gradients and prefetched batches live by design",
        TrainCfg { ending: Ending::Snapshot, steps: 40, nvtx: true, ..c(41) },
    ));
    v.push(train_run(
        "snapshot-healthy-accum",
        "mid-step snapshot of a healthy loop with gradient accumulation and evals",
        TrainCfg {
            ending: Ending::Snapshot,
            steps: 24,
            accum: 2,
            eval_every: 10,
            ..c(42)
        },
    ));
    v.push(train_run(
        "snapshot-leak-list",
        "mid-step snapshot of the metrics.py:33 list leak",
        TrainCfg {
            ending: Ending::Snapshot,
            leak: Some(Leak::List),
            steps: 40,
            ..c(43)
        },
    ));
    v.push(train_run(
        "snapshot-leak-graph",
        "mid-step snapshot of the graph kept alive by train.py:118-119",
        TrainCfg {
            ending: Ending::Snapshot,
            leak: Some(Leak::Graph),
            steps: 30,
            nvtx: true,
            ..c(44)
        },
    ));
    v.push(train_run(
        "snapshot-leak-cache",
        "mid-step snapshot of the unbounded cache (blocks larger than their requests)",
        TrainCfg {
            ending: Ending::Snapshot,
            leak: Some(Leak::Cache),
            steps: 40,
            ..c(45)
        },
    ));
    v.push(train_run(
        "snapshot-ring-leak-list",
        "mid-step snapshot of the metrics.py:33 list leak recorded with max_entries=4000: the history holds the last ~15 steps, earlier blocks are only in the segments",
        TrainCfg { ending: Ending::Snapshot, leak: Some(Leak::List), steps: 60, ring: Some(4000), ..c(47) },
    ));
    v.push(train_run(
        "snapshot-ring-healthy",
        "mid-step snapshot of a healthy loop with evals recorded with max_entries=4000",
        TrainCfg {
            ending: Ending::Snapshot,
            steps: 60,
            eval_every: 20,
            ring: Some(4000),
            ..c(48)
        },
    ));
    v.push(train_run(
        "snapshot-bounded-cache",
        "mid-step snapshot of the bounded cache after it filled",
        TrainCfg {
            ending: Ending::Snapshot,
            cache: Some(BoundedCache::Keys(12)),
            steps: 40,
            ..c(46)
        },
    ));
    v
}
