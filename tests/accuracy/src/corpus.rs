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
    v
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

fn main_proc(seed: u64) -> ProcDesc {
    ProcDesc {
        idx: 0,
        pid: 48_000 + (seed % 1000) as u32,
        parent: None,
        argv: vec!["python", "train.py", "--config", "configs/base.yaml"],
        device: 0,
        main_thread: 0,
        autograd_thread: 1,
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
        History::Snapshot(torch::render_snapshot(&tr, &sites))
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
        History::Trace(torch::render_trace(w, &sites, &[&tr], clean))
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
    // Leaks.
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
