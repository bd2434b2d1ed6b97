//! PyTorch-shaped programs on the caching-allocator model ([`super::caching`]): a training loop
//! (parameters, Adam state made on the first optimizer step, per-step activations, gradients and
//! workspaces, two prefetched batches in flight, eval phases, gradient accumulation,
//! checkpoints), its three classic leaks and a cache that must not be called one, an inference
//! server whose cache fragments until a large request fails, and torchrun-like workers.
//!
//! A program writes an event log ([`Ev`]) from its own accounting; the log is then rendered as a
//! gpucollect trace (tensor blocks as allocations with Python stacks, segments as `pool_sample`
//! records of pool 0, NVML samples) or as the PyTorch memory snapshot a user would dump mid-run.
//! Nothing here looks at the detectors.

use std::collections::{BTreeMap, HashMap, HashSet};

use analysis_core::format::{Alloc, AllocKind, DeviceIdx, FreeKind, ProcessIdx, ThreadIdx};
use serde_json::{Value, json};

use super::caching::{CachingAllocator, GIB, KIB, MIB, round_request};
use super::writer::{Fr, Rng, StackRef, Stacks, TraceWriter, native, py};
use crate::scenario::{Call, DeviceSample};

const TV: &str = "/opt/venv/lib/python3.12/site-packages/torch";
/// CUDA context, cuBLAS handles and kernels: device memory NVML counts for a PyTorch process
/// outside the caching allocator.
const CONTEXT_BYTES: u64 = 534 * MIB;
/// `time_us` of trace time 0 in snapshots.
const T0_US: u64 = 1_795_428_600_000_000;

fn tv(rel: &str) -> String {
    format!("{TV}/{rel}")
}

fn tpy(func: &str, rel: &str, line: u32) -> Fr {
    py(func, &tv(rel), line)
}

fn call_module() -> Vec<Fr> {
    vec![
        tpy("_call_impl", "nn/modules/module.py", 1762),
        tpy("_wrapped_call_impl", "nn/modules/module.py", 1751),
    ]
}

fn cat(parts: &[&[Fr]]) -> Vec<Fr> {
    parts.iter().flat_map(|p| p.iter().cloned()).collect()
}

// Native modules of a PyTorch process (ids in the trace).
const M_C10: u32 = 2;
const M_TORCH_CUDA: u32 = 3;
const M_TORCH_CPU: u32 = 4;
const M_LIBC: u32 = 5;
const M_CUDA: u32 = 6;

/// The allocator's own frames, innermost, as C++ stacks show them.
fn allocator_frames() -> Vec<Fr> {
    vec![
        native(
            M_C10,
            0x4_1b20,
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
            "",
            0,
        ),
        native(
            M_TORCH_CUDA,
            0x9a_3310,
            "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
            "",
            0,
        ),
    ]
}

/// A backward-pass allocation: made on the autograd engine's thread, which has no Python frames.
fn backward_frames(node: &str, offset: u64) -> Vec<Fr> {
    cat(&[
        &allocator_frames(),
        &[
            native(
                M_TORCH_CPU,
                offset,
                &format!(
                    "torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"
                ),
                "",
                0,
            ),
            native(
                M_TORCH_CPU,
                0x51_88a0,
                "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
                "",
                0,
            ),
            native(
                M_TORCH_CPU,
                0x51_2c10,
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                "",
                0,
            ),
            native(M_LIBC, 0x9_4ac3, "start_thread", "", 0),
        ],
    ])
}

/// The call stacks of the training program, by role.
#[derive(Clone, Debug)]
pub struct Sites {
    pub table: Stacks,
    params: StackRef,
    prefetch: StackRef,
    /// Forward of block i: fc1, gelu, fc2 (from train_step).
    fwd: Vec<[StackRef; 3]>,
    /// The same from the held-out forward kept alive (graph leak).
    val_fwd: Vec<[StackRef; 3]>,
    eval_fwd: Vec<[StackRef; 3]>,
    head: StackRef,
    val_head: StackRef,
    eval_head: StackRef,
    workspace: StackRef,
    loss: StackRef,
    val_loss: StackRef,
    bwd_temp: StackRef,
    bwd_gelu: StackRef,
    bwd_grad: StackRef,
    adam_init: StackRef,
    adam_temp: StackRef,
    metrics: StackRef,
    cache: StackRef,
    eval_batch: StackRef,
    eval_cat: StackRef,
    ckpt: StackRef,
    pub nccl: StackRef,
    /// Pinned host memory for batches, from the DataLoader's pin-memory thread.
    pinned: StackRef,
    // Inference server (fragmentation).
    srv_weights: StackRef,
    srv_prefill: StackRef,
    srv_kv: StackRef,
    srv_long: StackRef,
}

impl Sites {
    pub fn new(layers: usize) -> Self {
        let mut t = Stacks::default();
        let top = [py("main", "train.py", 188), py("<module>", "train.py", 212)];
        let epoch = cat(&[&[py("train_one_epoch", "train.py", 97)], &top]);
        let step = |line: u32| cat(&[&[py("train_step", "train.py", line)], &epoch]);
        let linear = cat(&[
            &[tpy("forward", "nn/modules/linear.py", 125)],
            &call_module(),
        ]);
        let cm = call_module();
        let fwd_from = |t: &mut Stacks, caller: &[Fr]| -> Vec<[StackRef; 3]> {
            let net = cat(&[&cm, &[py("forward", "model.py", 47)], &cm, caller]);
            (0..layers)
                .map(|_| {
                    [
                        t.add(cat(&[&linear, &[py("forward", "model.py", 31)], &net])),
                        t.add(cat(&[&[py("forward", "model.py", 32)], &net])),
                        t.add(cat(&[&linear, &[py("forward", "model.py", 33)], &net])),
                    ]
                })
                .collect()
        };
        let fwd = fwd_from(&mut t, &step(104));
        let val_fwd = fwd_from(&mut t, &step(118));
        let eval_caller = [
            py("evaluate", "eval.py", 61),
            py("main", "train.py", 192),
            py("<module>", "train.py", 212),
        ];
        let eval_fwd = fwd_from(&mut t, &eval_caller);
        let head_from = |t: &mut Stacks, caller: &[Fr]| {
            t.add(cat(&[
                &linear,
                &[py("forward", "model.py", 49)],
                &cm,
                caller,
            ]))
        };
        let head = head_from(&mut t, &step(104));
        let val_head = head_from(&mut t, &step(118));
        let eval_head = head_from(&mut t, &eval_caller);
        let workspace = t.add(cat(&[
            &[py("forward", "model.py", 35)],
            &cm,
            &[py("forward", "model.py", 47)],
            &cm,
            &step(104),
        ]));
        let loss_from = |t: &mut Stacks, line: u32| {
            t.add(cat(&[
                &[
                    tpy("cross_entropy", "nn/functional.py", 3462),
                    tpy("forward", "nn/modules/loss.py", 1295),
                ],
                &cm,
                &step(line),
            ]))
        };
        let loss = loss_from(&mut t, 105);
        let val_loss = loss_from(&mut t, 119);
        let bwd_temp = t.add(backward_frames("AddmmBackward0", 0x2a1_40e0));
        let bwd_gelu = t.add(backward_frames("GeluBackward0", 0x2b0_9f30));
        let mut grad = allocator_frames();
        grad.extend([
            native(
                M_TORCH_CPU,
                0x4f_1d80,
                "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                "",
                0,
            ),
            native(
                M_TORCH_CPU,
                0x51_2c10,
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                "",
                0,
            ),
            native(M_LIBC, 0x9_4ac3, "start_thread", "", 0),
        ]);
        let bwd_grad = t.add(grad);
        let opt = [
            tpy("_use_grad", "optim/optimizer.py", 79),
            tpy("wrapper", "optim/optimizer.py", 485),
        ];
        let adam_init = t.add(cat(&[
            &[
                tpy("_init_group", "optim/adam.py", 166),
                tpy("step", "optim/adam.py", 235),
            ],
            &opt,
            &step(110),
        ]));
        let adam_temp = t.add(cat(&[
            &[
                tpy("_multi_tensor_adam", "optim/adam.py", 612),
                tpy("maybe_fallback", "optim/optimizer.py", 154),
                tpy("adam", "optim/adam.py", 893),
                tpy("step", "optim/adam.py", 246),
            ],
            &opt,
            &step(110),
        ]));
        let params = t.add(vec![
            tpy("<lambda>", "nn/modules/module.py", 1097),
            tpy("_apply", "nn/modules/module.py", 965),
            tpy("_apply", "nn/modules/module.py", 934),
            tpy("cuda", "nn/modules/module.py", 1097),
            py("main", "train.py", 180),
            py("<module>", "train.py", 212),
        ]);
        let prefetch = t.add(cat(&[
            &[
                py("_preload", "train.py", 71),
                py("__next__", "train.py", 80),
                py("train_one_epoch", "train.py", 96),
            ],
            &top,
        ]));
        let metrics = t.add(cat(&[
            &[
                tpy("softmax", "nn/functional.py", 2140),
                py("update", "metrics.py", 33),
            ],
            &step(112),
        ]));
        let cache = t.add(cat(&[
            &linear,
            &[py("encode", "cache.py", 51), py("get", "cache.py", 58)],
            &step(100),
        ]));
        let eval_batch = t.add(vec![
            py("evaluate", "eval.py", 58),
            py("main", "train.py", 192),
            py("<module>", "train.py", 212),
        ]);
        let eval_cat = t.add(vec![
            py("evaluate", "eval.py", 88),
            py("main", "train.py", 192),
            py("<module>", "train.py", 212),
        ]);
        let ckpt = t.add(vec![
            py("save_checkpoint", "train.py", 140),
            py("main", "train.py", 194),
            py("<module>", "train.py", 212),
        ]);
        let nccl = t.add(vec![
            tpy(
                "init_process_group",
                "distributed/distributed_c10d.py",
                1710,
            ),
            tpy("wrapper", "distributed/c10d_logger.py", 81),
            py("main", "train.py", 176),
            py("<module>", "train.py", 212),
        ]);
        let pin_py = "utils/data/_utils/pin_memory.py";
        let pinned = t.add(vec![
            native(M_CUDA, 0x23_9f40, "cuMemHostAlloc", "", 0),
            native(
                M_TORCH_CUDA,
                0x7c_1a00,
                "at::cuda::(anonymous namespace)::CUDACachingHostAllocatorImpl::allocate_host_memory(unsigned long, void**)",
                "",
                0,
            ),
            native(
                M_TORCH_CUDA,
                0x7d_2210,
                "at::native::_pin_memory(at::Tensor const&, std::optional<c10::Device>)",
                "",
                0,
            ),
            tpy("pin_memory", pin_py, 79),
            tpy("pin_memory", pin_py, 96),
            tpy("do_one_step", pin_py, 37),
            tpy("_pin_memory_loop", pin_py, 56),
            py("run", "/usr/lib/python3.12/threading.py", 1012),
            py("_bootstrap_inner", "/usr/lib/python3.12/threading.py", 1075),
            py("_bootstrap", "/usr/lib/python3.12/threading.py", 1032),
        ]);
        let serve = [
            py("serve_forever", "server.py", 140),
            py("<module>", "server.py", 171),
        ];
        let srv_weights = t.add(vec![
            tpy("<lambda>", "nn/modules/module.py", 1097),
            tpy("_apply", "nn/modules/module.py", 965),
            tpy("cuda", "nn/modules/module.py", 1097),
            py("load_model", "server.py", 38),
            py("<module>", "server.py", 165),
        ]);
        let srv_prefill = t.add(cat(&[
            &linear,
            &[
                py("prefill", "engine.py", 74),
                py("handle", "server.py", 102),
            ],
            &serve,
        ]));
        let srv_kv = t.add(cat(&[
            &[
                py("allocate", "kv_cache.py", 29),
                py("handle", "server.py", 98),
            ],
            &serve,
        ]));
        let srv_long = t.add(cat(&[
            &linear,
            &[
                py("prefill", "engine.py", 74),
                py("handle", "server.py", 102),
            ],
            &serve,
        ]));
        Self {
            table: t,
            params,
            prefetch,
            fwd,
            val_fwd,
            eval_fwd,
            head,
            val_head,
            eval_head,
            workspace,
            loss,
            val_loss,
            bwd_temp,
            bwd_gelu,
            bwd_grad,
            adam_init,
            adam_temp,
            metrics,
            cache,
            eval_batch,
            eval_cat,
            ckpt,
            nccl,
            pinned,
            srv_weights,
            srv_prefill,
            srv_kv,
            srv_long,
        }
    }
}

/// One event of a PyTorch process, in its own time (ns since the trace's origin).
#[derive(Clone, Debug)]
pub enum Ev {
    Alloc {
        t: u64,
        p: u32,
        tensor: u64,
        addr: u64,
        block: u64,
        request: u64,
        stack: StackRef,
        thread: u32,
    },
    Free {
        t: u64,
        p: u32,
        tensor: u64,
        addr: u64,
        thread: u32,
    },
    /// A driver allocation outside the caching allocator (NCCL buffers).
    Raw {
        t: u64,
        p: u32,
        tensor: u64,
        size: u64,
        stack: StackRef,
        free: bool,
        /// Pinned host memory (`cuMemHostAlloc`) rather than device memory.
        pinned: bool,
        thread: u32,
    },
    Segment {
        t: u64,
        p: u32,
        addr: u64,
        size: u64,
        release: bool,
    },
    Pool {
        t: u64,
        p: u32,
        reserved: u64,
        allocated: u64,
    },
    Range {
        t: u64,
        p: u32,
        id: u64,
        name: &'static str,
        begin: bool,
    },
    Oom {
        t: u64,
        p: u32,
        request: u64,
        stack: StackRef,
        device_free: u64,
    },
    Device {
        t: u64,
        device: u32,
        total: u64,
        procs: Vec<(u32, u64)>,
    },
    Exit {
        t: u64,
        p: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
}

impl Ev {
    const fn t(&self) -> u64 {
        match self {
            Self::Alloc { t, .. }
            | Self::Free { t, .. }
            | Self::Raw { t, .. }
            | Self::Segment { t, .. }
            | Self::Pool { t, .. }
            | Self::Range { t, .. }
            | Self::Oom { t, .. }
            | Self::Device { t, .. }
            | Self::Exit { t, .. } => *t,
        }
    }
}

/// How a process is described in the trace.
#[derive(Clone, Debug)]
pub struct ProcDesc {
    pub idx: u32,
    pub pid: u32,
    pub parent: Option<u32>,
    pub argv: Vec<&'static str>,
    pub device: u32,
    pub main_thread: u32,
    pub autograd_thread: u32,
    /// The DataLoader's pin-memory thread, when it pins batches.
    pub pin_thread: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
struct Tensor {
    addr: u64,
    block: u64,
    request: u64,
    stack: StackRef,
}

/// Another process on the same device (NVML sees it; the trace does not).
#[derive(Clone, Copy, Debug)]
pub struct Foreign {
    pub pid: u32,
    pub start_bytes: u64,
    /// Growth per second of program time.
    pub growth_per_s: u64,
}

/// One PyTorch process: its allocator, its live tensors and its log.
#[derive(Debug)]
pub struct Torch {
    pub p: ProcDesc,
    pub device_total: u64,
    pub alloc: CachingAllocator,
    pub rng: Rng,
    pub t: u64,
    pub log: Vec<Ev>,
    live: HashMap<u64, Tensor>,
    next_tensor: u64,
    next_range: u64,
    /// Tensors of the planted cause.
    pub cause: HashSet<u64>,
    pub calls: Vec<Call>,
    pub samples: Vec<DeviceSample>,
    call_open: Option<(String, String, u32, u64, u64, u64)>,
    call_peak: u64,
    last_sample_t: u64,
    pub foreign: Option<Foreign>,
    pub raw_live: u64,
    /// Block of the planted spike, once made.
    pub spike_bytes: u64,
    /// Batches the pin-memory thread has pinned new host blocks for.
    pinned_batches: u32,
}

impl Torch {
    pub fn new(p: ProcDesc, seed: u64, device_total: u64) -> Self {
        let base = 0x7f2a_0000_0000 + (u64::from(p.idx) << 36);
        Self {
            next_tensor: u64::from(p.idx) << 40,
            p,
            device_total,
            alloc: CachingAllocator::new(base, device_total - CONTEXT_BYTES - 256 * MIB),
            rng: Rng::new(seed),
            t: 1_200_000_000 + seed % 1000 * 1000,
            log: Vec::new(),
            live: HashMap::new(),
            next_range: 1,
            cause: HashSet::new(),
            calls: Vec::new(),
            samples: Vec::new(),
            call_open: None,
            call_peak: 0,
            last_sample_t: 0,
            foreign: None,
            raw_live: 0,
            spike_bytes: 0,
            pinned_batches: 0,
        }
    }

    /// Advances the clock by `lo..=hi` microseconds.
    pub fn tick_us(&mut self, lo: u64, hi: u64) {
        self.t += self.rng.range(lo, hi) * 1000;
    }

    pub fn malloc(&mut self, request: u64, stack: StackRef, thread: u32) -> Option<u64> {
        self.tick_us(5, 60);
        match self.alloc.malloc(request) {
            Ok(m) => {
                for (addr, size) in self.alloc.take_released() {
                    self.log.push(Ev::Segment {
                        t: self.t,
                        p: self.p.idx,
                        addr,
                        size,
                        release: true,
                    });
                }
                if let Some((addr, size)) = m.new_segment {
                    self.log.push(Ev::Segment {
                        t: self.t,
                        p: self.p.idx,
                        addr,
                        size,
                        release: false,
                    });
                    self.pool_sample();
                }
                let tensor = self.next_tensor;
                self.next_tensor += 1;
                self.live.insert(
                    tensor,
                    Tensor {
                        addr: m.addr,
                        block: m.block_bytes,
                        request,
                        stack,
                    },
                );
                self.log.push(Ev::Alloc {
                    t: self.t,
                    p: self.p.idx,
                    tensor,
                    addr: m.addr,
                    block: m.block_bytes,
                    request,
                    stack,
                    thread,
                });
                self.call_peak = self.call_peak.max(self.alloc.allocated());
                Some(tensor)
            }
            Err(oom) => {
                for (addr, size) in self.alloc.take_released() {
                    self.log.push(Ev::Segment {
                        t: self.t,
                        p: self.p.idx,
                        addr,
                        size,
                        release: true,
                    });
                }
                let used = CONTEXT_BYTES + oom.reserved + self.raw_live + self.foreign_bytes();
                self.log.push(Ev::Oom {
                    t: self.t,
                    p: self.p.idx,
                    request,
                    stack,
                    device_free: self.device_total.saturating_sub(used),
                });
                None
            }
        }
    }

    /// `malloc` for a tensor of the planted cause.
    pub fn malloc_cause(&mut self, request: u64, stack: StackRef, thread: u32) -> Option<u64> {
        let t = self.malloc(request, stack, thread)?;
        self.cause.insert(t);
        Some(t)
    }

    pub fn free(&mut self, tensor: u64, thread: u32) {
        self.tick_us(2, 30);
        if let Some(x) = self.live.remove(&tensor) {
            self.alloc.free(x.addr);
            self.log.push(Ev::Free {
                t: self.t,
                p: self.p.idx,
                tensor,
                addr: x.addr,
                thread,
            });
        }
    }

    pub fn free_all(&mut self, tensors: &mut Vec<u64>, thread: u32) {
        for t in std::mem::take(tensors) {
            self.free(t, thread);
        }
    }

    /// A driver allocation outside the caching allocator (NCCL's buffers); returns its id for
    /// [`Torch::raw_free`].
    pub fn raw(&mut self, size: u64, stack: StackRef) -> u64 {
        self.tick_us(50, 200);
        let tensor = self.next_tensor;
        self.next_tensor += 1;
        self.raw_live += size;
        self.log.push(Ev::Raw {
            t: self.t,
            p: self.p.idx,
            tensor,
            size,
            stack,
            free: false,
            pinned: false,
            thread: self.p.main_thread,
        });
        tensor
    }

    /// A pinned host block of PyTorch's host caching allocator, made by the pin-memory thread:
    /// rounded up to a power of two, cached for reuse and never freed (not even at exit).
    pub fn pinned(&mut self, size: u64, stack: StackRef) {
        self.tick_us(100, 400);
        let tensor = self.next_tensor;
        self.next_tensor += 1;
        self.log.push(Ev::Raw {
            t: self.t,
            p: self.p.idx,
            tensor,
            size: size.next_power_of_two(),
            stack,
            free: false,
            pinned: true,
            thread: self.p.pin_thread.unwrap_or(self.p.main_thread),
        });
    }

    /// Frees the driver allocation `tensor` of `size` bytes made by [`Torch::raw`].
    pub fn raw_free(&mut self, tensor: u64, size: u64) {
        self.tick_us(50, 200);
        self.raw_live -= size;
        self.log.push(Ev::Raw {
            t: self.t,
            p: self.p.idx,
            tensor,
            size,
            stack: StackRef(0),
            free: true,
            pinned: false,
            thread: self.p.main_thread,
        });
    }

    pub fn pool_sample(&mut self) {
        self.log.push(Ev::Pool {
            t: self.t,
            p: self.p.idx,
            reserved: self.alloc.reserved(),
            allocated: self.alloc.allocated(),
        });
    }

    fn foreign_bytes(&self) -> u64 {
        self.foreign.map_or(0, |f| {
            f.start_bytes + f.growth_per_s * (self.t / 1_000_000) / 1000
        })
    }

    /// An NVML sample every 500 ms of program time.
    pub fn maybe_device_sample(&mut self) {
        if self.t < self.last_sample_t + 500_000_000 {
            return;
        }
        self.last_sample_t = self.t;
        let ours = CONTEXT_BYTES + self.alloc.reserved() + self.raw_live;
        let mut procs = vec![(self.p.pid, ours)];
        if let Some(f) = self.foreign {
            procs.push((f.pid, self.foreign_bytes()));
        }
        let used = procs.iter().map(|p| p.1).sum();
        self.samples.push(DeviceSample {
            t_s: self.t as f64 / 1e9,
            used,
            total: self.device_total,
            reserved: self.alloc.reserved(),
            allocated: self.alloc.allocated(),
            device: self.p.device,
        });
        self.log.push(Ev::Device {
            t: self.t,
            device: self.p.device,
            total: self.device_total,
            procs,
        });
    }

    /// Opens an NVTX range (`torch.cuda.nvtx.range_push`, or `record_function` in snapshots);
    /// returns its id for [`Torch::range_end`].
    pub fn range_begin(&mut self, name: &'static str) -> u64 {
        self.tick_us(1, 5);
        self.next_range += 1;
        let id = (u64::from(self.p.idx) << 32) + self.next_range;
        self.log.push(Ev::Range {
            t: self.t,
            p: self.p.idx,
            id,
            name,
            begin: true,
        });
        id
    }

    pub fn range_end(&mut self, id: u64, name: &'static str) {
        self.tick_us(1, 5);
        self.log.push(Ev::Range {
            t: self.t,
            p: self.p.idx,
            id,
            name,
            begin: false,
        });
    }

    pub fn call_begin(&mut self, function: &str, file: &str, line: u32) {
        self.call_peak = self.alloc.allocated();
        self.call_open = Some((
            function.into(),
            file.into(),
            line,
            self.t,
            self.alloc.allocated(),
            self.alloc.reserved(),
        ));
    }

    pub fn call_end(&mut self) {
        if let Some((function, file, line, start, a0, r0)) = self.call_open.take() {
            self.calls.push(Call {
                function,
                file,
                line,
                start_s: start as f64 / 1e9,
                end_s: self.t as f64 / 1e9,
                allocated_before: a0,
                allocated_after: self.alloc.allocated(),
                reserved_before: r0,
                reserved_after: self.alloc.reserved(),
                peak_allocated: self.call_peak,
                pid: self.p.pid,
            });
        }
    }

    pub fn exit(&mut self, code: Option<i32>, signal: Option<i32>) {
        self.tick_us(1000, 5000);
        self.log.push(Ev::Exit {
            t: self.t,
            p: self.p.idx,
            code,
            signal,
        });
    }

    /// Bytes (true block sizes) the planted cause keeps live now.
    pub fn cause_live_bytes(&self) -> u64 {
        self.cause
            .iter()
            .filter_map(|t| self.live.get(t))
            .map(|x| x.block)
            .sum()
    }

    pub fn block_of(&self, tensor: u64) -> u64 {
        self.live.get(&tensor).map_or(0, |x| x.block)
    }

    /// Interpreter shutdown after `main()` returned: every tensor still referenced is freed.
    pub fn free_everything(&mut self) {
        let mut all: Vec<u64> = self.live.keys().copied().collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        for t in all {
            self.free(t, self.p.main_thread);
        }
        self.pool_sample();
    }

    /// Live tensors by address, for the snapshot's segments.
    fn live_by_addr(&self) -> HashMap<u64, Tensor> {
        self.live.values().map(|x| (x.addr, *x)).collect()
    }
}

/// How the run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// `sys.exit(0)`: the collector writes the exit status and `end`.
    Exit,
    /// Killed by a signal (the scheduler's SIGKILL, the OOM killer): no `end`.
    Killed(i32),
    /// Killed so hard the collector wrote nothing more: no exit status, no `end`.
    Vanished,
    /// `torch.cuda.memory._dump_snapshot` in the middle of a step.
    Snapshot,
}

/// The three training-loop leaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leak {
    /// A held-out forward without `torch.no_grad()` whose loss is appended to a list: each
    /// step's activations stay alive with the graph.
    Graph,
    /// `metrics.py:33` appends each step's probabilities to a list.
    List,
    /// `cache.py` memoizes an encoding per new key, and every step brings a new key.
    Cache,
    /// The eval phase keeps its last batch's logits in a history list (eval.py:77) on the GPU:
    /// a slow leak, one tensor per eval phase.
    EvalOutputs,
}

/// A memo cache that is not a leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundedCache {
    /// Keys repeat every epoch: the cache fills during the first epoch, then only hits.
    Keys(u32),
    /// An LRU of at most `capacity` entries over `keys` keys: evicts as it inserts.
    Lru { capacity: u32, keys: u32 },
}

/// A training program.
#[derive(Clone, Debug)]
pub struct TrainCfg {
    pub seed: u64,
    pub steps: u32,
    pub layers: usize,
    pub hidden: u64,
    pub vocab: u64,
    /// Tokens per batch, before the per-step sequence-length bucket.
    pub tokens: u64,
    pub nvtx: bool,
    pub accum: u32,
    pub eval_every: u32,
    pub ckpt_every: u32,
    pub leak: Option<Leak>,
    /// Bytes per step of the list leak.
    pub list_leak_bytes: u64,
    pub cache: Option<BoundedCache>,
    /// The eval phase keeps every batch's logits and concatenates them (a planned spike).
    pub eval_concat: bool,
    pub ending: Ending,
    pub device_total: u64,
    pub foreign: Option<Foreign>,
    /// Snapshot ending: keep only the last that many trace entries.
    pub ring: Option<usize>,
    /// Steps of sequence-length warm-up (batches grow from a quarter of their length).
    pub warmup_steps: u32,
}

impl TrainCfg {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            steps: 80,
            layers: 4,
            hidden: 1024,
            vocab: 8192,
            tokens: 2048,
            nvtx: false,
            accum: 1,
            eval_every: 0,
            ckpt_every: 0,
            leak: None,
            list_leak_bytes: 4 * MIB,
            cache: None,
            eval_concat: false,
            ending: Ending::Exit,
            device_total: 80 * GIB,
            foreign: None,
            ring: None,
            warmup_steps: 0,
        }
    }
}

/// The training loop's persistent state.
struct Model {
    params: Vec<u64>,
    param_sizes: Vec<u64>,
    adam: Vec<u64>,
    grads: Vec<u64>,
    prefetched: Vec<Vec<u64>>,
    val_kept: Vec<u64>,
    metrics_kept: Vec<u64>,
    cache: BTreeMap<u64, u64>,
    cache_order: Vec<u64>,
    /// cuBLAS and cuBLASLt workspaces, made through the caching allocator by the first matmul
    /// and kept for the handle's lifetime (as in the real H100 snapshot: 32 MiB + 1 MiB).
    cublas: Vec<u64>,
}

/// Runs the training program on `tr` (already described) and returns whether it finished
/// (false: out of memory or stopped for the snapshot).
pub fn train(tr: &mut Torch, s: &Sites, cfg: &TrainCfg) -> bool {
    let main = tr.p.main_thread;
    let d = cfg.hidden;
    let mut m = Model {
        params: Vec::new(),
        param_sizes: Vec::new(),
        adam: Vec::new(),
        grads: Vec::new(),
        prefetched: Vec::new(),
        val_kept: Vec::new(),
        metrics_kept: Vec::new(),
        cache: BTreeMap::new(),
        cache_order: Vec::new(),
        cublas: Vec::new(),
    };
    // Parameters: per block fc1 (d x 4d + 4d) and fc2 (4d x d + d), then the head.
    let mut sizes = Vec::new();
    for _ in 0..cfg.layers {
        sizes.extend([d * 4 * d * 4, 4 * d * 4, 4 * d * d * 4, d * 4]);
    }
    sizes.extend([d * cfg.vocab * 4, cfg.vocab * 4]);
    for &sz in &sizes {
        let Some(p) = tr.malloc(sz, s.params, main) else {
            return false;
        };
        m.params.push(p);
        m.param_sizes.push(sz);
    }
    tr.pool_sample();
    // Two batches in flight before the first step.
    for _ in 0..2 {
        let b = prefetch(tr, s, cfg, main);
        m.prefetched.push(b);
    }
    for step in 0..cfg.steps {
        tr.maybe_device_sample();
        let last = step + 1 == cfg.steps;
        tr.call_begin("train_step", "train.py", 102);
        let range = cfg.nvtx.then(|| tr.range_begin("train_step"));
        // The sequence-length bucket of this step: most batches are short, a few long ones need
        // a much larger attention workspace.
        let long = tr.rng.chance(1, 12);
        let mut tokens = if long {
            cfg.tokens * 2
        } else {
            cfg.tokens / 2 * tr.rng.range(2, 3) / 2 * 2
        };
        if step < cfg.warmup_steps {
            // Sequence-length warm-up: batches grow from a quarter of their length.
            let quarters = 1 + 3 * u64::from(step) / u64::from(cfg.warmup_steps);
            tokens = tokens * quarters / 4 / 64 * 64;
        }
        if !micro_steps(tr, s, cfg, &mut m, step, tokens, long, last) {
            return false;
        }
        if last && cfg.ending == Ending::Snapshot {
            // Dumped between backward and the optimizer step: gradients, Adam state, the
            // prefetched batches and the parameters are live, as in a real mid-run snapshot.
            tr.call_end();
            return false;
        }
        // optimizer.step(): Adam state on the first step, foreach temporaries every step.
        if m.adam.is_empty() {
            for &sz in &m.param_sizes.clone() {
                for _ in 0..2 {
                    let Some(a) = tr.malloc(sz, s.adam_init, main) else {
                        return false;
                    };
                    m.adam.push(a);
                }
            }
        }
        let mut temps = Vec::new();
        for chunk in m.param_sizes.clone().chunks(4) {
            let bytes: u64 = chunk.iter().sum();
            let Some(x) = tr.malloc(bytes, s.adam_temp, main) else {
                return false;
            };
            temps.push(x);
        }
        tr.tick_us(4_000, 9_000);
        tr.free_all(&mut temps, main);
        // zero_grad(set_to_none=True)
        let mut grads = std::mem::take(&mut m.grads);
        tr.free_all(&mut grads, main);
        // metrics.update: per-sample probabilities (4 MiB by default).
        let Some(probs) = (if cfg.leak == Some(Leak::List) {
            tr.malloc_cause(cfg.list_leak_bytes, s.metrics, main)
        } else {
            tr.malloc(cfg.list_leak_bytes, s.metrics, main)
        }) else {
            return false;
        };
        if cfg.leak == Some(Leak::List) {
            m.metrics_kept.push(probs);
        } else {
            tr.tick_us(200, 600);
            tr.free(probs, main);
        }
        // The batch of this step is done; the next one is already in flight.
        if !m.prefetched.is_empty() {
            let mut b = m.prefetched.remove(0);
            tr.free_all(&mut b, main);
        }
        if step + 2 < cfg.steps {
            let b = prefetch(tr, s, cfg, main);
            m.prefetched.push(b);
        }
        if let Some(r) = range {
            tr.range_end(r, "train_step");
        }
        tr.pool_sample();
        tr.call_end();
        if cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && !evaluate(tr, s, cfg) {
            return false;
        }
        if cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0 {
            checkpoint(tr, s, &m.param_sizes);
        }
    }
    for mut b in std::mem::take(&mut m.prefetched) {
        tr.free_all(&mut b, main);
    }
    tr.maybe_device_sample();
    true
}

fn prefetch(tr: &mut Torch, s: &Sites, cfg: &TrainCfg, thread: u32) -> Vec<u64> {
    // The pin-memory thread pins each batch in host memory first; the host caching allocator
    // makes blocks for the first four batches in flight and reuses them after.
    if tr.p.pin_thread.is_some() && tr.pinned_batches < 4 {
        tr.pinned_batches += 1;
        tr.pinned(cfg.tokens * cfg.hidden * 2, s.pinned);
        tr.pinned(cfg.tokens * 8, s.pinned);
    }
    let x = tr.malloc(cfg.tokens * cfg.hidden * 2, s.prefetch, thread);
    let y = tr.malloc(cfg.tokens * 8, s.prefetch, thread);
    x.into_iter().chain(y).collect()
}

#[allow(clippy::too_many_arguments)]
fn micro_steps(
    tr: &mut Torch,
    s: &Sites,
    cfg: &TrainCfg,
    m: &mut Model,
    step: u32,
    tokens: u64,
    long: bool,
    last: bool,
) -> bool {
    let main = tr.p.main_thread;
    let bwd = tr.p.autograd_thread;
    let d = cfg.hidden;
    for micro in 0..cfg.accum.max(1) {
        // Unbounded or bounded memo cache, consulted before the forward.
        if let Some(kind) = cache_kind(cfg) {
            let key = match kind {
                CacheUse::Unbounded => u64::from(step) * 16 + u64::from(micro),
                CacheUse::Keys(k) => u64::from((step * cfg.accum.max(1) + micro) % k),
                CacheUse::Lru(_, k) => u64::from((step * cfg.accum.max(1) + micro) * 7 % k),
            };
            if let std::collections::btree_map::Entry::Vacant(slot) = m.cache.entry(key) {
                // The encoding's size follows the prompt's length.
                let len = 96 + (key * 37 % 29) * 13;
                let bytes = len * d * 4 + (key % 5) * 300;
                let e = if kind == CacheUse::Unbounded {
                    tr.malloc_cause(bytes, s.cache, main)
                } else {
                    tr.malloc(bytes, s.cache, main)
                };
                let Some(e) = e else { return false };
                slot.insert(e);
                m.cache_order.push(key);
                if let CacheUse::Lru(cap, _) = kind
                    && m.cache.len() > cap as usize
                {
                    let old = m.cache_order.remove(0);
                    if let Some(t) = m.cache.remove(&old) {
                        tr.free(t, main);
                    }
                }
            }
        }
        // Forward: each block's fc1, gelu and fc2 outputs are saved for backward.
        let mut saved = Vec::new();
        for (i, [fc1, gelu, fc2]) in s.fwd.iter().enumerate() {
            for (st, bytes) in [
                (*fc1, tokens * 4 * d * 4),
                (*gelu, tokens * 4 * d * 4),
                (*fc2, tokens * d * 4),
            ] {
                let Some(x) = tr.malloc(bytes, st, main) else {
                    return false;
                };
                saved.push(x);
                if m.cublas.is_empty() {
                    for ws in [32 * MIB, MIB] {
                        let Some(w) = tr.malloc(ws, st, main) else {
                            return false;
                        };
                        m.cublas.push(w);
                    }
                }
            }
            if i == 0 {
                // Attention workspace: its size follows the sequence-length bucket.
                let ws = if long {
                    192 * MIB
                } else {
                    24 * MIB + tokens * 512
                };
                let Some(w) = tr.malloc(ws, s.workspace, main) else {
                    return false;
                };
                tr.tick_us(300, 900);
                tr.free(w, main);
            }
        }
        let Some(logits) = tr.malloc(tokens * cfg.vocab * 4, s.head, main) else {
            return false;
        };
        saved.push(logits);
        let Some(loss) = tr.malloc(4, s.loss, main) else {
            return false;
        };
        tr.tick_us(20_000, 35_000);
        // The graph leak: a held-out forward outside torch.no_grad(), its loss kept in a list.
        if cfg.leak == Some(Leak::Graph) && micro == 0 {
            let vt = 256;
            for [fc1, gelu, fc2] in &s.val_fwd {
                for (st, bytes) in [
                    (*fc1, vt * 4 * d * 4),
                    (*gelu, vt * 4 * d * 4),
                    (*fc2, vt * d * 4),
                ] {
                    let Some(x) = tr.malloc_cause(bytes, st, main) else {
                        return false;
                    };
                    m.val_kept.push(x);
                }
            }
            let Some(x) = tr.malloc_cause(vt * cfg.vocab * 4, s.val_head, main) else {
                return false;
            };
            m.val_kept.push(x);
            let Some(x) = tr.malloc_cause(4, s.val_loss, main) else {
                return false;
            };
            m.val_kept.push(x);
        }
        // Backward on the autograd thread: temporaries, the gradients (made on the first
        // micro-batch, accumulated in place after), the saved activations released.
        let first = m.grads.is_empty();
        let mut pi = m.param_sizes.len();
        if first {
            for sz in [cfg.vocab * 4, d * cfg.vocab * 4] {
                let Some(g) = tr.malloc(sz, s.bwd_grad, bwd) else {
                    return false;
                };
                m.grads.push(g);
            }
        }
        pi -= 2;
        if let Some(l) = saved.pop() {
            let Some(g) = tr.malloc(tokens * d * 4, s.bwd_temp, bwd) else {
                return false;
            };
            tr.free(l, bwd);
            tr.free(g, bwd);
        }
        while let Some(fc2) = saved.pop() {
            let gelu = saved.pop();
            let fc1 = saved.pop();
            let Some(g1) = tr.malloc(tokens * 4 * d * 4, s.bwd_gelu, bwd) else {
                return false;
            };
            if first {
                for k in (pi.saturating_sub(4)..pi).rev() {
                    let Some(g) = tr.malloc(m.param_sizes[k], s.bwd_grad, bwd) else {
                        return false;
                    };
                    m.grads.push(g);
                }
            }
            pi = pi.saturating_sub(4);
            tr.free(fc2, bwd);
            if let Some(x) = gelu {
                tr.free(x, bwd);
            }
            let Some(g2) = tr.malloc(tokens * d * 4, s.bwd_temp, bwd) else {
                return false;
            };
            tr.free(g1, bwd);
            if let Some(x) = fc1 {
                tr.free(x, bwd);
            }
            tr.free(g2, bwd);
        }
        tr.tick_us(30_000, 50_000);
        tr.free(loss, main);
        if last && cfg.ending == Ending::Snapshot {
            return true;
        }
    }
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheUse {
    Unbounded,
    Keys(u32),
    Lru(u32, u32),
}

fn cache_kind(cfg: &TrainCfg) -> Option<CacheUse> {
    if cfg.leak == Some(Leak::Cache) {
        return Some(CacheUse::Unbounded);
    }
    match cfg.cache {
        Some(BoundedCache::Keys(k)) => Some(CacheUse::Keys(k)),
        Some(BoundedCache::Lru { capacity, keys }) => Some(CacheUse::Lru(capacity, keys)),
        None => None,
    }
}

/// The eval phase: four batches under `torch.no_grad()`, each layer's output freed as the next
/// is made; with `eval_concat`, every batch's logits kept and concatenated at eval.py:88.
fn evaluate(tr: &mut Torch, s: &Sites, cfg: &TrainCfg) -> bool {
    let main = tr.p.main_thread;
    let d = cfg.hidden;
    tr.call_begin("evaluate", "eval.py", 55);
    let range = cfg.nvtx.then(|| tr.range_begin("evaluate"));
    let batches = if cfg.eval_concat { 16 } else { 4 };
    let tokens = cfg.tokens;
    let mut outs = Vec::new();
    for batch in 0..batches {
        let Some(b) = tr.malloc(tokens * d * 2, s.eval_batch, main) else {
            return false;
        };
        let mut prev: Option<u64> = None;
        for [fc1, gelu, fc2] in &s.eval_fwd {
            for (st, bytes) in [
                (*fc1, tokens * 4 * d * 4),
                (*gelu, tokens * 4 * d * 4),
                (*fc2, tokens * d * 4),
            ] {
                let Some(x) = tr.malloc(bytes, st, main) else {
                    return false;
                };
                if let Some(p) = prev.replace(x) {
                    tr.free(p, main);
                }
            }
        }
        let Some(logits) = tr.malloc(tokens * cfg.vocab * 4, s.eval_head, main) else {
            return false;
        };
        if let Some(p) = prev.take() {
            tr.free(p, main);
        }
        tr.tick_us(8_000, 12_000);
        if cfg.eval_concat {
            outs.push(logits);
        } else if cfg.leak == Some(Leak::EvalOutputs) && batch + 1 == batches {
            // `self.history.append(logits)` at eval.py:77: kept on the GPU for a report.
            tr.cause.insert(logits);
        } else {
            tr.free(logits, main);
        }
        tr.free(b, main);
    }
    if cfg.eval_concat {
        let total = tokens * cfg.vocab * 4 * batches;
        let Some(all) = tr.malloc_cause(total, s.eval_cat, main) else {
            return false;
        };
        tr.tick_us(30_000, 40_000);
        tr.spike_bytes = tr.block_of(all);
        tr.free_all(&mut outs, main);
        tr.free(all, main);
    }
    if let Some(r) = range {
        tr.range_end(r, "evaluate");
    }
    tr.pool_sample();
    tr.call_end();
    true
}

/// `save_checkpoint`: a device copy of every parameter, written out, then dropped.
fn checkpoint(tr: &mut Torch, s: &Sites, sizes: &[u64]) {
    let main = tr.p.main_thread;
    tr.call_begin("save_checkpoint", "train.py", 136);
    let mut copies = Vec::new();
    for &sz in sizes {
        if let Some(c) = tr.malloc(sz, s.ckpt, main) {
            copies.push(c);
        }
    }
    tr.tick_us(150_000, 250_000);
    tr.free_all(&mut copies, main);
    tr.pool_sample();
    tr.call_end();
}

/// An inference server: weights, then chat sessions whose prompt prefill needs two large
/// temporaries and whose KV cache block stays for the session; sessions end at random. The
/// cache ends up in many partly used segments, until a long prompt's 1 GiB prefill fails:
/// cached holes in partly used segments plus memory never reserved add up to more than it
/// needs, but no block (and no room for a segment) is large enough. Returns the failed request.
pub fn serve(tr: &mut Torch, s: &Sites, sessions: u32) -> Option<u64> {
    let main = tr.p.main_thread;
    for _ in 0..6 {
        tr.malloc(1536 * MIB, s.srv_weights, main)?;
    }
    tr.pool_sample();
    let mut open: Vec<u64> = Vec::new();
    for i in 0..sessions {
        // The server admits sessions while the cache has room to grow.
        if tr.alloc.reserved() + 900 * MIB > tr.alloc.capacity() {
            break;
        }
        tr.maybe_device_sample();
        tr.call_begin("handle", "server.py", 95);
        // Contexts get longer as the day goes on: later sessions need larger KV blocks than
        // the holes earlier ones leave.
        let kv =
            (2 * MIB + u64::from(i / 4) * 64 * KIB + tr.rng.range(0, 4) * 64 * KIB).min(9 * MIB);
        let a = tr.malloc(7 * MIB, s.srv_prefill, main)?;
        let b = tr.malloc(6 * MIB + 512 * KIB, s.srv_prefill, main)?;
        let k = tr.malloc(kv, s.srv_kv, main)?;
        tr.tick_us(2_000, 6_000);
        tr.free(a, main);
        tr.free(b, main);
        open.push(k);
        if open.len() > 16 && tr.rng.chance(2, 3) {
            let idx = tr.rng.range(0, open.len() as u64 - 1) as usize;
            let t = open.swap_remove(idx);
            tr.free(t, main);
        }
        if i % 32 == 0 {
            tr.pool_sample();
        }
        tr.call_end();
    }
    tr.pool_sample();
    tr.call_begin("handle", "server.py", 95);
    let long = 1024 * MIB;
    let got = tr.malloc(long, s.srv_long, main);
    tr.call_end();
    match got {
        Some(_) => None,
        None => Some(long),
    }
}

/// Describes the processes, devices, threads and modules of PyTorch processes in a trace.
pub fn describe(w: &mut TraceWriter, procs: &[ProcDesc], devices: &[(u32, &str, u64)]) {
    for p in procs {
        w.process(p.idx, p.pid, p.parent, "/opt/venv/bin/python3.12", &p.argv);
    }
    for &(i, name, total) in devices {
        w.device(i, name, total);
    }
    for p in procs {
        w.thread(p.main_thread, p.idx, u64::from(p.pid), "MainThread");
        if let Some(t) = p.pin_thread {
            w.thread(
                t,
                p.idx,
                u64::from(p.pid) + 23,
                "Thread-2 (_pin_memory_loop)",
            );
        }
        if p.autograd_thread != p.main_thread {
            w.thread(
                p.autograd_thread,
                p.idx,
                u64::from(p.pid) + 17,
                "pt_autograd_0",
            );
        }
    }
    if let Some(p) = procs.iter().find(|p| p.autograd_thread != p.main_thread) {
        let lib = format!("{TV}/lib");
        w.module(
            1,
            p.idx,
            "/opt/venv/bin/python3.12",
            0x5555_5555_0000,
            0x40_0000,
        );
        w.module(
            M_C10,
            p.idx,
            &format!("{lib}/libc10_cuda.so"),
            0x7f1c_2000_0000,
            0x10_0000,
        );
        w.module(
            M_TORCH_CUDA,
            p.idx,
            &format!("{lib}/libtorch_cuda.so"),
            0x7f1b_0000_0000,
            0x4000_0000,
        );
        w.module(
            M_TORCH_CPU,
            p.idx,
            &format!("{lib}/libtorch_cpu.so"),
            0x7f18_0000_0000,
            0x2000_0000,
        );
        w.module(
            M_LIBC,
            p.idx,
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x7f17_0000_0000,
            0x20_0000,
        );
        w.module(
            M_CUDA,
            p.idx,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            0x7f16_0000_0000,
            0x400_0000,
        );
    }
}

/// Writes the merged logs of `torches` into `w` (already described), ends the trace and returns
/// its bytes. `clean_end`: the collector finished normally (writes `end`).
pub fn render_trace(w: TraceWriter, s: &Sites, torches: &[&Torch], clean_end: bool) -> Vec<u8> {
    render(w, s, torches, clean_end, View::Tensors)
}

/// Writes the run as gpucollect's framework capture records it (FORMAT.md, "Two layers"): the
/// caching allocator's segments as driver allocations (with the stack of the tensor allocation
/// that made the allocator grow) and, inside them, every tensor as a framework block (kind 7)
/// at its own stack; no pool samples (the reader makes the reserve from the segments).
pub fn render_layered_trace(
    w: TraceWriter,
    s: &Sites,
    torches: &[&Torch],
    clean_end: bool,
) -> Vec<u8> {
    render(w, s, torches, clean_end, View::Layers)
}

/// Writes the same run as a collector without the allocator hook sees it: only the caching
/// allocator's segments, as `cudaMalloc`/`cudaFree` with the stack of the tensor allocation
/// that made the allocator grow; no tensors, no pool samples.
pub fn render_driver_trace(
    w: TraceWriter,
    s: &Sites,
    torches: &[&Torch],
    clean_end: bool,
) -> Vec<u8> {
    render(w, s, torches, clean_end, View::Driver)
}

/// What a trace of a PyTorch process shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// Tensor blocks (a collector hooked into the caching allocator).
    Tensors,
    /// Segments only (the CUDA driver's view).
    Driver,
    /// Segments as driver allocations and tensors as framework blocks inside them.
    Layers,
}

fn render(
    mut w: TraceWriter,
    s: &Sites,
    torches: &[&Torch],
    clean_end: bool,
    view: View,
) -> Vec<u8> {
    let mut evs: Vec<&Ev> = torches.iter().flat_map(|t| t.log.iter()).collect();
    evs.sort_by_key(|e| e.t());
    // Driver view: each new segment is attributed to the tensor allocation that needed it (the
    // next allocation of that process in its log).
    let mut trigger: HashMap<usize, (StackRef, u32)> = HashMap::new();
    if view != View::Tensors {
        for (i, e) in evs.iter().enumerate() {
            if let Ev::Segment {
                p, release: false, ..
            } = e
            {
                let next = evs[i..].iter().find_map(|x| match x {
                    Ev::Alloc {
                        p: q,
                        stack,
                        thread,
                        ..
                    } if q == p => Some((*stack, *thread)),
                    _ => None,
                });
                if let Some(n) = next {
                    trigger.insert(i, n);
                }
            }
        }
    }
    let mut segments: HashMap<u64, analysis_core::format::AllocId> = HashMap::new();
    let mut ids = HashMap::new();
    let dev_of: HashMap<u32, (u32, u32)> = torches
        .iter()
        .map(|t| (t.p.idx, (t.p.device, t.p.main_thread)))
        .collect();
    for (i, e) in evs.into_iter().enumerate() {
        w.now = e.t();
        if view != View::Tensors {
            match e {
                Ev::Pool { .. } => continue,
                Ev::Alloc { .. } | Ev::Free { .. } if view == View::Driver => continue,
                Ev::Segment {
                    p,
                    addr,
                    size,
                    release,
                    ..
                } => {
                    if *release {
                        if let Some(id) = segments.remove(addr) {
                            let thread = dev_of.get(p).map_or(0, |x| x.1);
                            w.free(id, thread, FreeKind::Immediate, 0);
                        }
                    } else if let Some(&(stack, thread)) = trigger.get(&i) {
                        let st = w.stack(&s.table, stack);
                        let dev = dev_of.get(p).map_or(0, |x| x.0);
                        let id = w.alloc(Alloc {
                            size_bytes: *size,
                            address: *addr,
                            stack: st,
                            thread: ThreadIdx(thread),
                            device: DeviceIdx(dev),
                            kind: AllocKind::Device,
                            process: ProcessIdx(*p),
                            ..Alloc::default()
                        });
                        segments.insert(*addr, id);
                    }
                    continue;
                }
                _ => {}
            }
        }
        match e {
            Ev::Alloc {
                p,
                tensor,
                addr,
                block,
                stack,
                thread,
                ..
            } => {
                let st = w.stack(&s.table, *stack);
                let dev = dev_of.get(p).map_or(0, |x| x.0);
                let id = w.alloc(Alloc {
                    size_bytes: *block,
                    address: *addr,
                    stack: st,
                    thread: ThreadIdx(*thread),
                    device: DeviceIdx(dev),
                    kind: if view == View::Layers {
                        AllocKind::FrameworkBlock
                    } else {
                        AllocKind::Device
                    },
                    stream: 7,
                    pool: 0,
                    process: ProcessIdx(*p),
                    ..Alloc::default()
                });
                ids.insert(*tensor, id);
            }
            Ev::Free { tensor, thread, .. } => {
                if let Some(id) = ids.remove(tensor) {
                    w.free(id, *thread, FreeKind::Immediate, 7);
                }
            }
            Ev::Raw {
                p,
                tensor,
                size,
                stack,
                free,
                pinned,
                thread,
                ..
            } => {
                let dev = dev_of.get(p).map_or(0, |x| x.0);
                let thread = *thread;
                if *free {
                    if let Some(id) = ids.remove(tensor) {
                        w.free(id, thread, FreeKind::Immediate, 0);
                    }
                } else {
                    let st = w.stack(&s.table, *stack);
                    let id = w.alloc(Alloc {
                        size_bytes: *size,
                        address: 0x7f3e_0000_0000
                            + (u64::from(*p) << 32)
                            + (tensor & 0xffff) * 0x100_0000,
                        stack: st,
                        thread: ThreadIdx(thread),
                        device: DeviceIdx(dev),
                        kind: if *pinned {
                            AllocKind::PinnedHost
                        } else {
                            AllocKind::Device
                        },
                        process: ProcessIdx(*p),
                        ..Alloc::default()
                    });
                    ids.insert(*tensor, id);
                }
            }
            Ev::Segment { .. } => {}
            Ev::Pool {
                p,
                reserved,
                allocated,
                ..
            } => {
                let dev = dev_of.get(p).map_or(0, |x| x.0);
                w.pool_sample(*p, dev, 0, *reserved, *allocated);
            }
            Ev::Range {
                p, id, name, begin, ..
            } => {
                if *begin {
                    let thread = dev_of.get(p).map_or(0, |x| x.1);
                    w.range_begin(*id, name, thread, *p);
                } else {
                    w.range_end(*id);
                }
            }
            Ev::Oom {
                p, request, stack, ..
            } => {
                let (dev, thread) = dev_of.get(p).copied().unwrap_or((0, 0));
                let st = w.stack(&s.table, *stack);
                w.alloc_failed(
                    round_request(*request),
                    st,
                    thread,
                    dev,
                    AllocKind::Device,
                    *p,
                );
            }
            Ev::Device {
                device,
                total,
                procs,
                ..
            } => w.device_sample(*device, *total, procs),
            Ev::Exit {
                p, code, signal, ..
            } => w.process_exit(*p, *code, *signal),
        }
    }
    w.finish(clean_end)
}

fn frames_json(frames: &[Fr]) -> Value {
    Value::Array(
        frames
            .iter()
            .map(|f| match f {
                Fr::Py { func, file, line } => {
                    json!({"name": func, "filename": file, "line": line})
                }
                Fr::Native {
                    func, file, line, ..
                } => json!({
                    "name": func,
                    "filename": if file.is_empty() { "??" } else { file.as_str() },
                    "line": line,
                }),
            })
            .collect(),
    )
}

/// The snapshot `torch.cuda.memory._dump_snapshot` writes for process `tr` at its current
/// time: the history as `device_traces` (requested sizes, as PyTorch records them), the final
/// `segments` with their blocks (true block sizes), `external_annotations` for the ranges.
///
/// `ring`: keep only the last that many trace entries (`_record_memory_history(max_entries=N)`),
/// so the history starts mid-run and blocks made before it appear only in the segments.
pub fn render_snapshot(tr: &Torch, s: &Sites, ring: Option<usize>) -> Vec<u8> {
    let mut trace = Vec::new();
    let mut ann = Vec::new();
    let us = |t: u64| T0_US + t / 1000;
    let mut requests: HashMap<u64, (u64, StackRef)> = HashMap::new();
    for e in &tr.log {
        match e {
            Ev::Alloc {
                t,
                tensor,
                addr,
                request,
                stack,
                ..
            } => {
                requests.insert(*tensor, (*request, *stack));
                trace.push(
                    json!({"action": "alloc", "addr": addr, "size": request, "stream": 0,
                    "time_us": us(*t), "frames": frames_json(s.table.frames(*stack))}),
                );
            }
            Ev::Free {
                t, tensor, addr, ..
            } => {
                let (size, stack) = requests.get(tensor).copied().unwrap_or((0, StackRef(0)));
                let fr = frames_json(s.table.frames(stack));
                trace.push(
                    json!({"action": "free_requested", "addr": addr, "size": size,
                    "stream": 0, "time_us": us(*t), "frames": fr.clone()}),
                );
                trace.push(
                    json!({"action": "free_completed", "addr": addr, "size": size,
                    "stream": 0, "time_us": us(*t), "frames": fr}),
                );
            }
            Ev::Segment {
                t,
                addr,
                size,
                release,
                ..
            } => {
                let action = if *release {
                    "segment_free"
                } else {
                    "segment_alloc"
                };
                trace.push(
                    json!({"action": action, "addr": addr, "size": size, "stream": 0,
                    "time_us": us(*t), "frames": []}),
                );
            }
            Ev::Oom {
                t,
                request,
                stack,
                device_free,
                ..
            } => {
                trace.push(
                    json!({"action": "oom", "addr": device_free, "size": request,
                    "stream": 0, "time_us": us(*t), "frames": frames_json(s.table.frames(*stack))}),
                );
            }
            Ev::Range { t, name, begin, .. } => {
                ann.push(
                    json!({"device": tr.p.device, "stage": if *begin { "START" } else { "END" },
                    "name": name, "time_us": us(*t)}),
                );
            }
            Ev::Raw { .. } | Ev::Pool { .. } | Ev::Device { .. } | Ev::Exit { .. } => {}
        }
    }
    let live = tr.live_by_addr();
    let segments: Vec<Value> = tr
        .alloc
        .segments()
        .iter()
        .map(|seg| {
            let mut allocated = 0;
            let mut requested = 0;
            let blocks: Vec<Value> = seg
                .blocks()
                .map(|(addr, size, used)| match live.get(&addr).filter(|_| used) {
                    Some(x) => {
                        allocated += size;
                        requested += x.request;
                        json!({"address": addr, "size": size, "requested_size": x.request,
                            "state": "active_allocated", "frames": frames_json(s.table.frames(x.stack))})
                    }
                    None => json!({"address": addr, "size": size, "requested_size": 0,
                        "state": "inactive", "frames": []}),
                })
                .collect();
            json!({"device": tr.p.device, "address": seg.addr, "total_size": seg.size,
                "allocated_size": allocated, "active_size": allocated,
                "requested_size": requested, "stream": 0,
                "segment_type": if seg.small { "small" } else { "large" },
                "segment_pool_id": [0, 0], "is_expandable": false, "frames": [],
                "blocks": blocks})
        })
        .collect();
    if let Some(n) = ring
        && trace.len() > n
    {
        trace.drain(..trace.len() - n);
        let first_us = trace
            .first()
            .and_then(|e| e.get("time_us"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        ann.retain(|a| a.get("time_us").and_then(Value::as_u64).unwrap_or(0) >= first_us);
    }
    let mut traces = vec![Value::Array(Vec::new()); tr.p.device as usize + 1];
    traces[tr.p.device as usize] = Value::Array(trace);
    let snap = json!({
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": false},
        "external_annotations": ann,
    });
    serde_json::to_vec(&snap).unwrap_or_default()
}
