"""CuPy's memory pool on a real GPU, for scripts/gpu-check.sh: arrays kept by the main thread and
by a thread started after `import cupy`, one freed; at a sync point the pool's used bytes and
the monotonic clock go to the JSON file named by argv[1]. gpu_trace_check.py (scenario cupy)
compares them with the trace's live framework blocks, and finds the line marked below.
"""
import json
import sys
import threading
import time

import cupy

kept = []


def work(n):
    for _ in range(n):
        kept.append(cupy.empty(3 << 20, dtype=cupy.uint8))  # PY_CUPY_LINE
    tmp = cupy.empty(5 << 20, dtype=cupy.uint8)
    del tmp


work(4)
t = threading.Thread(target=work, args=(2,))
t.start()
t.join()
cupy.cuda.Device().synchronize()
pool = cupy.get_default_memory_pool()
point = {"mono_ns": time.monotonic_ns(), "used": pool.used_bytes(), "total": pool.total_bytes()}
json.dump(point, open(sys.argv[1], "w"))
