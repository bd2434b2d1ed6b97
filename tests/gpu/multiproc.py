"""Multi-process PyTorch programs for scripts/gpu-check.sh: each worker process allocates its
own CUDA memory and records what PyTorch says it reserved; gpu_trace_check.py then checks that
every worker is a traced process of its own whose caching-allocator live bytes equal that.

    multiproc.py spawn SIDE_DIR     # torch.multiprocessing.spawn, 2 workers (fork + exec)
    multiproc.py fork SIDE_DIR      # multiprocessing fork workers (no CUDA in the parent)
    multiproc.py ddp SIDE_DIR       # one rank under torchrun (torch.distributed.run)

Each worker writes SIDE_DIR/worker-PID.json: pid, rank, memory_reserved, max_memory_reserved.
"""
import json
import multiprocessing
import os
import sys

import torch


def worker(rank, side_dir):
    keep = [torch.empty((rank + 1) * (32 << 20), dtype=torch.uint8, device="cuda")]
    scratch = torch.ones(8 << 20, device="cuda")
    keep.append(scratch * 2)
    del scratch
    torch.cuda.synchronize()
    rec = {"pid": os.getpid(), "rank": rank, "reserved": torch.cuda.memory_reserved(),
           "max_reserved": torch.cuda.max_memory_reserved()}
    with open(os.path.join(side_dir, f"worker-{os.getpid()}.json"), "w") as f:
        json.dump(rec, f)


def main():
    mode, side_dir = sys.argv[1], sys.argv[2]
    os.makedirs(side_dir, exist_ok=True)
    if mode == "spawn":
        # The parent uses CUDA too, before starting the workers.
        parent = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
        torch.multiprocessing.spawn(worker, args=(side_dir,), nprocs=2, join=True)
        del parent
    elif mode == "fork":
        # CUDA cannot be used in a forked child once the parent initialised it: the parent
        # stays off the GPU and each forked worker initialises CUDA itself.
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=worker, args=(r, side_dir)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            assert p.exitcode == 0, p.exitcode
    elif mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        worker(dist.get_rank(), side_dir)
        dist.barrier()
        dist.destroy_process_group()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
