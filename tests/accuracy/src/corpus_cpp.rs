//! The CUDA C++ scenarios of the corpus.

use analysis_core::format::{AllocKind, FreeKind};

use crate::programs::caching::{GIB, MIB};
use crate::programs::cuda::{Api, Cpp, H100, L4, app, workspace_size};
use crate::scenario::{Class, History, Scenario, Truth};

fn scenario(
    name: &str,
    description: &str,
    truth: Truth,
    out: (Vec<u8>, Vec<crate::Call>, Vec<crate::DeviceSample>),
) -> Scenario {
    Scenario {
        name: name.into(),
        description: description.into(),
        truth,
        history: History::Trace(out.0),
        calls: out.1,
        device_samples: out.2,
    }
}

/// A solver: long-lived matrices, a per-iteration workspace (cudaMalloc/cudaFree per call).
/// `teardown`: the matrices are left to `cudaDeviceReset`. `foreign`: another process on the
/// GPU grows. `oversized`: at the end a misparsed size asks for n*n*8 bytes with n = 110,000.
fn solver(
    seed: u64,
    name: &str,
    description: &str,
    teardown: bool,
    foreign: bool,
    oversized: bool,
) -> Scenario {
    let mut c = Cpp::new(seed, &["./solver", "--grid", "4096"], &[H100], &["main"]);
    if foreign {
        c.foreign = Some((27_001, 3 * GIB, 2 * GIB));
    }
    let ctor = [
        app("Solver::Solver(Config const&)", "solver.cpp", 40),
        app("main", "main.cpp", 27),
    ];
    let a_st = c.stack(Api::Malloc, &ctor, false);
    let ctor2 = [
        app("Solver::Solver(Config const&)", "solver.cpp", 41),
        app("main", "main.cpp", 27),
    ];
    let b_st = c.stack(Api::Malloc, &ctor2, false);
    let ws_st = c.stack(
        Api::Malloc,
        &[
            app("Workspace::ensure(unsigned long)", "workspace.cpp", 42),
            app("Solver::step(int)", "solver.cpp", 118),
            app("main", "main.cpp", 33),
        ],
        false,
    );
    let resize_st = c.stack(
        Api::Malloc,
        &[
            app("Solver::resize(long)", "solver.cpp", 112),
            app("main", "main.cpp", 45),
        ],
        false,
    );
    let a = c.alloc(2 * GIB, a_st, 0);
    let b = c.alloc(GIB, b_st, 0);
    for i in 0..1200 {
        if i % 40 == 0 {
            c.device_samples();
        }
        c.call_begin("Solver::step", "solver.cpp", 115);
        let size = workspace_size(&mut c.rng);
        let ws = c.alloc(size, ws_st, 0);
        c.tick_us(2_000, 9_000);
        c.free(ws, 0);
        c.call_end();
    }
    c.device_samples();
    if oversized {
        let n: u64 = 110_000;
        c.fail(n * n * 8, resize_st, 0);
        // The error is reported and main returns 1; destructors free the matrices.
        c.free(b, 0);
        c.free(a, 0);
        let out = c.exit(1);
        return scenario(
            name,
            description,
            Truth::faulty(Class::Oom, &["solver.cpp:112"], Some(n * n * 8)),
            out,
        );
    }
    if teardown {
        c.tick_us(100, 200);
        c.w.context_reset(0, 0, 0);
    } else {
        c.free(b, 0);
        c.free(a, 0);
    }
    let out = c.exit(0);
    scenario(name, description, Truth::Healthy, out)
}

/// Batches through a stream-ordered pool whose release threshold keeps the reserve.
fn async_pool(seed: u64, name: &str, description: &str, pool: u64) -> Scenario {
    let mut c = Cpp::new(seed, &["./infer", "--batch", "64"], &[H100], &["main"]);
    let st = c.stack(
        Api::MallocAsync,
        &[
            app("Batch::Batch(Pool&, int, cudaStream_t)", "batch.cpp", 57),
            app("Engine::run(Request const&)", "engine.cpp", 140),
            app("main", "main.cpp", 52),
        ],
        false,
    );
    let stream = 0x5601_3a40;
    let threshold = 6 * GIB;
    for i in 0..400 {
        if i % 20 == 0 {
            c.device_samples();
        }
        c.call_begin("Engine::run", "engine.cpp", 131);
        let n = c.rng.range(2, 6);
        let mut held = Vec::new();
        for _ in 0..n {
            let size = (64 + c.rng.range(0, 448)) * MIB;
            let id = c.alloc_on(size, st, 0, 0, AllocKind::StreamOrderedPool, stream, pool);
            c.pool_used[0] += size;
            c.pool_reserved[0] = c.pool_reserved[0].max(c.pool_used[0]);
            held.push((id, size));
        }
        c.tick_us(3_000, 12_000);
        for (id, size) in held {
            c.free_with(id, 0, FreeKind::StreamOrdered, stream);
            c.pool_used[0] -= size;
        }
        // cudaStreamSynchronize: the pool trims only down to its release threshold.
        c.pool_reserved[0] = c.pool_reserved[0].min(threshold.max(c.pool_used[0]));
        let (r, u) = (c.pool_reserved[0], c.pool_used[0]);
        c.w.pool_sample(0, 0, pool, r, u);
        c.call_end();
    }
    let out = c.exit(0);
    scenario(name, description, Truth::Healthy, out)
}

/// A custom sub-allocator: one arena from cudaMalloc at start, results carved out of it (not
/// visible to the driver), a small output buffer per batch.
fn suballocator(seed: u64) -> Scenario {
    let mut c = Cpp::new(
        seed,
        &["./render", "--scene", "city.usd"],
        &[H100],
        &["main"],
    );
    let arena_st = c.stack(
        Api::Malloc,
        &[
            app("Arena::Arena(unsigned long)", "arena.cpp", 23),
            app("main", "main.cpp", 19),
        ],
        false,
    );
    let out_st = c.stack(
        Api::Malloc,
        &[
            app("Frame::Frame(Arena&, int, int)", "frame.cpp", 64),
            app("main", "main.cpp", 37),
        ],
        false,
    );
    let arena = c.alloc(24 * GIB, arena_st, 0);
    for i in 0..1000 {
        if i % 40 == 0 {
            c.device_samples();
        }
        c.call_begin("render_frame", "main.cpp", 35);
        let f = c.alloc(3840 * 2160 * 16, out_st, 0);
        c.tick_us(8_000, 16_000);
        c.free(f, 0);
        c.call_end();
    }
    c.free(arena, 0);
    let out = c.exit(0);
    scenario(
        "cpp-suballocator",
        "a renderer with one 24 GiB arena for its own sub-allocator and a 126 MiB frame buffer per frame",
        Truth::Healthy,
        out,
    )
}

/// Two devices exchanging halos with peer access: one thread per device.
fn peer(seed: u64) -> Scenario {
    let mut c = Cpp::new(
        seed,
        &["./stencil", "--gpus", "2"],
        &[H100, H100],
        &["main", "gpu0", "gpu1"],
    );
    let mut grid = Vec::new();
    let mut halo_st = Vec::new();
    for d in 0..2u32 {
        let g = c.stack(
            Api::Malloc,
            &[
                app("Domain::Domain(int, Dims)", "domain.cpp", 48),
                app("main", "main.cpp", 30),
            ],
            false,
        );
        grid.push(c.alloc_on(8 * GIB, g, 0, d, AllocKind::Device, 0, 0));
        halo_st.push(c.stack(
            Api::Malloc,
            &[
                app("Exchange::post(Domain&, Domain&)", "exchange.cpp", 31),
                app("worker(int)", "main.cpp", 71),
            ],
            true,
        ));
    }
    for i in 0..800 {
        if i % 40 == 0 {
            c.device_samples();
        }
        c.call_begin("step", "main.cpp", 66);
        let mut held = Vec::new();
        for d in 0..2u32 {
            let st = halo_st[d as usize];
            held.push(c.alloc_on(96 * MIB, st, d + 1, d, AllocKind::Device, 0, 0));
        }
        c.tick_us(4_000, 6_000);
        for (d, id) in held.into_iter().enumerate() {
            c.free(id, d as u32 + 1);
        }
        c.call_end();
    }
    for id in grid {
        c.free(id, 0);
    }
    let out = c.exit(0);
    scenario(
        "cpp-peer-exchange",
        "a stencil code on two H100s with peer access: 8 GiB domains, 96 MiB halo buffers per step on each device from its own thread",
        Truth::Healthy,
        out,
    )
}

/// Worker threads; with `leak`, each thread's lazily made scratch is never freed, and the pool
/// is recreated every epoch.
fn workers(seed: u64, leak: bool) -> Scenario {
    let names = ["main", "worker-0", "worker-1", "worker-2", "worker-3"];
    let mut c = Cpp::new(seed, &["./pipeline", "--threads", "4"], &[H100], &names);
    let task_st = c.stack(
        Api::Malloc,
        &[
            app("process(Task const&)", "worker.cpp", 77),
            app("WorkQueue::run()", "worker.cpp", 30),
        ],
        true,
    );
    let scratch_st = c.stack(
        Api::Malloc,
        &[
            app("thread_scratch()", "worker.cpp", 52),
            app("process(Task const&)", "worker.cpp", 74),
            app("WorkQueue::run()", "worker.cpp", 30),
        ],
        true,
    );
    for _epoch in 0..6 {
        c.device_samples();
        c.call_begin("run_epoch", "main.cpp", 40);
        // A thread pool per epoch: threads start, work, and exit.
        let mut scratch = Vec::new();
        for th in 1..=4u32 {
            if leak {
                let id = c.alloc(64 * MIB, scratch_st, th);
                c.cause.insert(id);
            } else {
                scratch.push((th, c.alloc(64 * MIB, scratch_st, th)));
            }
        }
        for _ in 0..250 {
            let th = c.rng.range(1, 4) as u32;
            let size = (4 + c.rng.range(0, 28)) * MIB;
            let id = c.alloc(size, task_st, th);
            c.tick_us(1_000, 3_000);
            c.free(id, th);
        }
        for (th, id) in scratch {
            c.free(id, th);
        }
        c.call_end();
        c.tick_us(20_000, 40_000);
    }
    c.device_samples();
    let bytes = c.cause_live_bytes();
    let out = c.exit(0);
    if leak {
        scenario(
            "cpp-thread-exit-leak",
            "a thread pool recreated every epoch; each worker's thread_local scratch (64 MiB, worker.cpp:52) is never freed when the thread exits",
            Truth::leak(&["worker.cpp:52"], bytes),
            out,
        )
    } else {
        scenario(
            "cpp-worker-threads",
            "a pool of 4 worker threads per epoch, per-task buffers and a per-thread scratch freed before the threads exit",
            Truth::Healthy,
            out,
        )
    }
}

/// A request handler whose validation error path returns without freeing its input buffer.
fn error_path(seed: u64, killed: bool) -> Scenario {
    let mut c = Cpp::new(seed, &["./server", "--port", "9000"], &[L4], &["main"]);
    let st = c.stack(
        Api::Malloc,
        &[
            app("Handler::handle(Request const&)", "handler.cpp", 88),
            app("Server::serve()", "server.cpp", 203),
            app("main", "main.cpp", 58),
        ],
        false,
    );
    let ws = c.stack(
        Api::Malloc,
        &[
            app("Model::infer(Tensor const&)", "model.cpp", 131),
            app("Handler::handle(Request const&)", "handler.cpp", 97),
            app("Server::serve()", "server.cpp", 203),
            app("main", "main.cpp", 58),
        ],
        false,
    );
    for i in 0..1500 {
        if i % 60 == 0 {
            c.device_samples();
        }
        c.call_begin("Handler::handle", "handler.cpp", 84);
        let input = c.alloc(8 * MIB, st, 0);
        if c.rng.chance(1, 7) {
            // validate() failed: `return Status::Invalid` without cudaFree(input).
            c.cause.insert(input);
        } else {
            let size = (24 + c.rng.range(0, 8)) * MIB;
            let w = c.alloc(size, ws, 0);
            c.tick_us(2_000, 5_000);
            c.free(w, 0);
            c.free(input, 0);
        }
        c.call_end();
    }
    let bytes = c.cause_live_bytes();
    let truth = Truth::leak(&["handler.cpp:88"], bytes);
    if killed {
        let out = c.killed(15);
        scenario(
            "cpp-error-path-leak-killed",
            "the error-path leak in a server stopped by SIGTERM",
            truth,
            out,
        )
    } else {
        let out = c.exit(0);
        scenario(
            "cpp-error-path-leak",
            "a request handler that returns on a validation error (1 request in 7) without freeing its 8 MiB input buffer (handler.cpp:88)",
            truth,
            out,
        )
    }
}

/// A results store that keeps 256 MiB per batch until a workspace allocation fails.
fn oom_leak(seed: u64) -> Scenario {
    let mut c = Cpp::new(
        seed,
        &["./batch", "--input", "shards/*.bin"],
        &[L4],
        &["main"],
    );
    let store = c.stack(
        Api::Malloc,
        &[
            app("ResultStore::add(Batch const&)", "store.cpp", 31),
            app("main", "main.cpp", 49),
        ],
        false,
    );
    let ws = c.stack(
        Api::Malloc,
        &[
            app("Kernel::prepare(Batch const&)", "kernel.cpp", 66),
            app("main", "main.cpp", 46),
        ],
        false,
    );
    for i in 0..1000 {
        if i % 5 == 0 {
            c.device_samples();
        }
        let size = 512 * MIB + c.rng.range(0, 4) * 64 * MIB;
        if !c.fits(size) {
            c.fail(size, ws, 0);
            break;
        }
        c.call_begin("process_batch", "main.cpp", 44);
        let w = c.alloc(size, ws, 0);
        c.tick_us(5_000, 9_000);
        c.free(w, 0);
        let r = c.alloc(256 * MIB, store, 0);
        c.cause.insert(r);
        c.call_end();
    }
    let bytes = c.cause_live_bytes();
    let out = c.exit(1);
    scenario(
        "cpp-oom-from-leak",
        "a batch job whose results store keeps 256 MiB per batch on the GPU (store.cpp:31) until a kernel's workspace no longer fits; exits 1",
        Truth::leak(&["store.cpp:31"], bytes),
        out,
    )
}

/// A staging buffer in pinned host memory allocated per batch and never freed.
fn pinned_leak(seed: u64) -> Scenario {
    let mut c = Cpp::new(
        seed,
        &["./ingest", "--source", "kafka://frames"],
        &[H100],
        &["main"],
    );
    let pin = c.stack(
        Api::HostAlloc,
        &[
            app("Staging::acquire(unsigned long)", "staging.cpp", 19),
            app("Ingest::next()", "ingest.cpp", 88),
            app("main", "main.cpp", 40),
        ],
        false,
    );
    let dev = c.stack(
        Api::Malloc,
        &[
            app("Ingest::upload(Staging&)", "ingest.cpp", 102),
            app("main", "main.cpp", 41),
        ],
        false,
    );
    for i in 0..240 {
        if i % 10 == 0 {
            c.device_samples();
        }
        c.call_begin("Ingest::next", "ingest.cpp", 80);
        let p = c.alloc_on(32 * MIB, pin, 0, 0, AllocKind::PinnedHost, 0, 0);
        c.cause.insert(p);
        let d = c.alloc(32 * MIB, dev, 0);
        c.tick_us(3_000, 6_000);
        c.free(d, 0);
        c.call_end();
    }
    let bytes = c.cause_live_bytes();
    let out = c.exit(0);
    scenario(
        "cpp-pinned-leak",
        "an ingest loop that takes a 32 MiB pinned staging buffer per batch (staging.cpp:19) and never returns it",
        Truth::leak(&["staging.cpp:19"], bytes),
        out,
    )
}

/// Flat traced memory while our own device memory, outside the trace, keeps growing.
fn hidden(seed: u64) -> Scenario {
    let mut c = Cpp::new(seed, &["./fft-serve"], &[H100], &["main"]);
    let st = c.stack(
        Api::Malloc,
        &[
            app("Plan::execute(Signal const&)", "plan.cpp", 77),
            app("main", "main.cpp", 31),
        ],
        false,
    );
    for i in 0..800 {
        if i % 20 == 0 {
            c.device_samples();
        }
        c.call_begin("Plan::execute", "plan.cpp", 70);
        let b = c.alloc(48 * MIB, st, 0);
        // A library's plan cache grows through a path the collector does not see.
        c.untraced += 16 * MIB;
        c.tick_us(4_000, 6_000);
        c.free(b, 0);
        c.call_end();
    }
    c.device_samples();
    let out = c.exit(0);
    scenario(
        "cpp-hidden-growth",
        "traced memory flat while the process's own device memory (a library's plan cache, allocated where the collector cannot see) grows 16 MiB per call (12.5 GiB over the run)",
        Truth::faulty(Class::Hidden, &[], None),
        out,
    )
}

pub fn scenarios() -> Vec<Scenario> {
    vec![
        solver(
            101,
            "cpp-workspaces",
            "a solver with 3 GiB of matrices and a cudaMalloc/cudaFree workspace per step (16-31 MiB, 256 MiB for one problem size in ten); frees everything",
            false,
            false,
            false,
        ),
        solver(
            102,
            "cpp-workspaces-teardown",
            "the same solver leaving its matrices to cudaDeviceReset at exit",
            true,
            false,
            false,
        ),
        solver(
            103,
            "cpp-foreign-growth",
            "the solver sharing its GPU with another process that grows 2 GiB/s (NVML sees it, the trace does not)",
            false,
            true,
            false,
        ),
        solver(
            104,
            "cpp-oom-oversized",
            "the solver asks for n*n*8 bytes with n = 110,000 (a misparsed size, 90 GiB) on an 80 GiB GPU at solver.cpp:112; exits 1",
            false,
            false,
            true,
        ),
        async_pool(
            105,
            "cpp-async-default-pool",
            "batches through cudaMallocAsync on the default pool with a 6 GiB release threshold: the reserve stays above what is used",
            0,
        ),
        async_pool(
            106,
            "cpp-async-own-pool",
            "the same through a pool of its own (cudaMemPoolCreate, release threshold 6 GiB)",
            0x5637_a2c0_1e00,
        ),
        suballocator(107),
        peer(108),
        workers(109, false),
        workers(110, true),
        error_path(111, false),
        error_path(112, true),
        oom_leak(113),
        pinned_leak(114),
        hidden(115),
    ]
}
